"""Adoption with the add-on line only: does crawl 2 find a change two links deep?

Four ordinary spiders (``bench/_adoption_spiders.py``: a ``Spider`` following
links with ``response.follow``, a ``CrawlSpider`` with one ``Rule``, Scrapy's
own ``SitemapSpider``, and our ``IncrementalSpider``) crawl the loopback test
site (pages linking to each other through ``<nav>``). For each spider and
variant: crawl 1 from ``/p/0000``; the pages exactly two links away from it
change; crawl 2 "two days later" (under ``faketime -f +2d`` when the
``faketime`` command exists: every page is then due; without it, crawl 2
runs with ``INCREMENTAL_REVISIT_ENABLED=False``, which makes every page due
the same way). Printed per spider and variant: changed pages found (an item
carrying the new revision), unchanged pages emitted, crawl-2 requests, 304s
and body bytes, as the server saw them.

Variants: ``ours`` with the SQLite store and with the Redis store (a
throwaway ``redis-server``), and Scrapy's HttpCache with the RFC 2616 policy
and ``Cache-Control: max-age=0`` on every request (it revalidates every page
and hands the cached body to the callback on a 304, so it finds the change
but emits every page again).

Then the cost of recording links: the size of the links records (bytes per
page, from the SQLite store), and the CPU of a cold crawl of the
``CrawlSpider`` with replay on and off (``INCREMENTAL_REPLAY_ENABLED``),
``--rounds`` each in ABBA order, median ratio.

All traffic goes to 127.0.0.1; every crawl has a timeout; temporary
directories are deleted.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sqlite3
import sys
import tempfile
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    _OPENER,
    RedisServer,
    Site,
    ensure_importable,
    httpcache_revalidate_settings,
    median,
    print_table,
    ratio,
    run_crawl,
    summarize_log,
)

ensure_importable()

KINDS = ("follow", "crawl", "sitemap", "incremental")
SPIDER_MODULES = "bench._adoption_spiders"
_LINK = re.compile(rb'<a href="(/p/[0-9]+)"')


def nav_graph(site: Site, pages: int) -> dict[str, list[str]]:
    """Each page's links, read once from the site (the log is reset after)."""
    graph = {}
    for i in range(pages):
        path = f"/p/{i:04d}"
        with _OPENER.open(site.base_url + path, timeout=30) as resp:
            body = resp.read()
        nav = body.split(b"<nav>", 1)[1].split(b"</nav>", 1)[0]
        graph[path] = [m.decode() for m in _LINK.findall(nav)]
    site.reset()
    return graph


def at_distance(graph: dict[str, list[str]], start: str, distance: int) -> list[str]:
    seen = {start: 0}
    queue = deque([start])
    while queue:
        here = queue.popleft()
        for there in graph[here]:
            if there not in seen:
                seen[there] = seen[here] + 1
                queue.append(there)
    return sorted(p for p, d in seen.items() if d == distance)




def path_of(item: dict) -> str:
    return "/" + item["url"].split("127.0.0.1", 1)[1].split("/", 1)[1]


def revision(item: dict) -> int | None:
    match = re.search(r"v(\d+)$", item.get("title", ""))
    return int(match.group(1)) if match else None


def crawl(site: Site, kind: str, settings: dict[str, str], work: Path, name: str,
          *, later: bool = False):
    wrapper: list[str] = []
    settings = {**settings, "SPIDER_MODULES": SPIDER_MODULES}
    if later:
        if shutil.which("faketime"):
            wrapper = ["faketime", "-f", "+2d"]
        else:
            settings["INCREMENTAL_REVISIT_ENABLED"] = "False"
    return run_crawl(site.base_url, settings, work, name, wrapper=wrapper,
                     command=["crawl", f"adopt_{kind}", "-a",
                              f"start_url={site.base_url}/p/0000"])


def scenario(site: Site, kind: str, settings: dict[str, str], changed: list[str],
             work: Path, label: str) -> list[object]:
    site.reset()
    first = crawl(site, kind, settings, work, f"{label}-1")
    before = {path_of(item): revision(item) for item in first.item_list}
    site.change_paths(changed)
    site.reset()
    second = crawl(site, kind, settings, work, f"{label}-2", later=True)
    log = summarize_log(site.log())
    emitted = {path_of(item): item for item in second.item_list}
    # Found: an item carrying a newer revision than crawl 1 saw.
    found = sum(1 for p in changed if p in emitted
                and (revision(emitted[p]) or 0) > (before.get(p) or 0))
    unchanged = sum(1 for p in emitted if p not in changed)
    return [kind, label.split(":", 1)[1], f"{found}/{len(changed)}", unchanged,
            log.requests, log.not_modified, log.body_bytes]


def links_bytes(db: Path) -> tuple[int, int, int]:
    """(pages stored, pages with a links record, bytes of links records)."""
    con = sqlite3.connect(db)
    try:
        pages = con.execute("SELECT count(*) FROM pages").fetchone()[0]
        with_links, size = con.execute(
            "SELECT count(*), coalesce(sum(length(data)), 0) FROM links").fetchone()
    finally:
        con.close()
    return pages, with_links, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--pages", type=int, default=120)
    parser.add_argument("--page-size", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    work = Path(tempfile.mkdtemp(prefix="bench-adoption-"))
    rows: list[list[object]] = []
    try:
        redis_server = RedisServer(work)
        with Site(args.pages, args.page_size, "strong,weak,lastmod") as site:
            graph = nav_graph(site, args.pages)
            changed = at_distance(graph, "/p/0000", 2)[:5]
            print(f"adoption: {args.pages} pages x {args.page_size} B; changed two links "
                  f"from /p/0000: {', '.join(changed)}; crawl 2 "
                  + ("under faketime +2d" if shutil.which("faketime")
                     else "with revisits off (no faketime here)"))
            for kind in kinds:
                for variant in ("ours:sqlite", "ours:redis", "httpcache:max-age=0"):
                    run = work / f"{kind}-{variant.replace(':', '-')}"
                    run.mkdir()
                    if variant == "ours:sqlite":
                        settings = {"INCREMENTAL_STATE_URI": f"sqlite:///{run / 'state.db'}"}
                    elif variant == "ours:redis":
                        settings = {"INCREMENTAL_STATE_URI":
                                    f"{redis_server.url(0)}?prefix=adopt-{kind}"}
                    else:
                        settings = httpcache_revalidate_settings(run / "cache")
                    rows.append(scenario(site, kind, settings, changed, run,
                                         f"{kind}:{variant}"))
                    if variant == "ours:sqlite":
                        pages, with_links, size = links_bytes(run / "state.db")
                        rows[-1].append(f"{size / max(pages, 1):,.0f} B/page "
                                        f"({with_links}/{pages} pages)")
                    else:
                        rows[-1].append("")
            print_table(["spider", "variant", "changes found", "unchanged emitted",
                         "requests", "304s", "body bytes", "links record"], rows)

            # The cost of recording links on a cold crawl.
            cpu: dict[str, list[float]] = {"on": [], "off": []}
            order = ["on", "off", "off", "on"] * ((args.rounds + 1) // 2)
            for n, mode in enumerate(order[: 2 * args.rounds]):
                run = work / f"cold-{n}"
                run.mkdir()
                settings = {"INCREMENTAL_STATE_URI": f"sqlite:///{run / 'state.db'}",
                            "INCREMENTAL_REPLAY_ENABLED": str(mode == "on"),
                            "SPIDER_MODULES": SPIDER_MODULES}
                site.reset()
                result = run_crawl(site.base_url, settings, run, "cold",
                                   command=["crawl", "adopt_crawl", "-a",
                                            f"start_url={site.base_url}/p/0000"])
                cpu[mode].append(result.usage.cpu)
            on, off = median(cpu["on"]), median(cpu["off"])
            print(f"\ncold crawl of the CrawlSpider, CPU s (median of {args.rounds}): "
                  f"replay on {on:.2f}, off {off:.2f}: on/off = {ratio(on, off)}")
        redis_server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    failed = [r for r in rows if r[1].startswith("ours")
              and r[2] != f"{len(changed)}/{len(changed)}"]
    print("ours: every change found by every spider: " + ("PASS" if not failed else "MISS"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
