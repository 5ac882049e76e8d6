"""Cold crawl and re-crawl of large documentation pages: ours vs plain Scrapy.

What it measures
    One loopback site (``python -m tests.site`` in its own process) serving
    a documentation corpus: Debian's ``python3-doc`` HTML when it is
    installed (its ``*.html`` files as they are; ``--docs-dir`` names
    another directory), else generated pages of that structure
    (``--layout docs``: navigation bars, sidebar, inline script and style,
    highlighted code, API signatures, tables; ``--page-size`` bytes each,
    96 kB by default as the real manual's average). Validators: strong ETag
    + Last-Modified, weak ETag, Last-Modified (cycled); the sitemaps carry
    no ``<lastmod>``; every page answers ``Cache-Control: max-age=0``.

    Cold crawls (nothing stored, nothing cached), every variant writing the
    same JSON-lines feed of url, title, main text and fingerprint:

    * ``plain``: Scrapy's own ``SitemapSpider`` (``bench/_plain_sitemap_spider.py``,
      run outside the project: no add-on, no project settings) with an
      equally careful main-text extraction written on lxml directly; its
      texts are checked equal to ours;
    * ``plain-paced``: plain with Scrapy's own pacing, ``DOWNLOAD_DELAY``
      ``--paced-delay`` (1/50 s: the rate ours' politeness reaches here),
      no politeness of ours: what pacing alone costs a crawl;
    * ``ours``: ``scrapy crawl sitemap`` as installed (politeness on,
      every default) with a SQLite store;
    * ``ours-nopolite``: the same with ``INCREMENTAL_THROTTLE_ENABLED=False``;
    * ``httpcache``: plain + Scrapy's HttpCache (RFC2616Policy), filling it.

    Then the re-crawl "two days later" (``faketime -f +2d``; without the
    ``faketime`` command, revisits are switched off instead, which makes
    every page due the same way) of ``ours``, ``ours-nopolite`` and
    ``httpcache`` from their own cold crawl's state or cache: nothing
    changed, no lastmod to skip by, every page due, so each page is asked
    conditionally (validators alone); HttpCache revalidates every page
    (max-age=0) and hands the cached body to the callback on a 304.

    Each round runs every variant, in ABBA order (the order reversed every
    other round); medians over ``--rounds`` rounds (>= 3). CPU = user+sys
    of the crawl process alone (os.wait4), peak RSS from the same call,
    wall = its elapsed time. Nothing is subtracted: start-up (imports,
    reactor, robots.txt, sitemaps) is in every figure.

How to read it
    ours/plain CPU is the price of incrementality and politeness on a first
    crawl (fingerprints, page state and items staged and committed, the
    pacing of requests); targets: <= 1.15x as installed, peak RSS <= 1.2x.
    The re-crawl target: ours' CPU <= 0.25x HttpCache's (a 304 costs ours a
    state update; HttpCache reads the cached page and parses it again).
    Pacing requests (ours' politeness, or Scrapy's DOWNLOAD_DELAY: compare
    plain-paced with plain) costs CPU of its own on a shared machine: each
    request is handled alone after a sleep, caches cold (no more
    instructions: callgrind counts the same with and without); the more
    other processes run, the more it costs. ours/plain-paced shows ours'
    price against a crawl paced the same way.

    python bench/cold_overhead.py [--pages 530] [--page-size 96000] [--rounds 3]
        [--docs-dir DIR | --generated] [--timeout 600]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    REPO,
    Site,
    compile_bytecode,
    httpcache_settings,
    median,
    ours_settings,
    print_table,
    ratio,
    run_crawl,
    summarize_log,
    verdict,
)

KINDS = "strong,weak,lastmod"
PLAIN_SPIDER = REPO / "bench" / "_plain_sitemap_spider.py"
#: Where Debian's python3-doc puts the manual's HTML (one directory per version).
DOC_ROOT = Path("/usr/share/doc")
DOC_DIR_PATTERNS = ("python3/html", "python3.*/html", "python3-doc/html")
#: Settings the plain crawl gets besides the harness's own: what the project
#: sets for ours, so both write the same feed the same way.
PLAIN_SETTINGS = {"FEED_EXPORT_ENCODING": "utf-8", "CONCURRENT_REQUESTS_PER_DOMAIN": "8",
                  "USER_AGENT": "incremental_crawler/0.1"}
COLD = ("plain", "plain-paced", "ours", "ours-nopolite", "httpcache")
RECRAWL = ("httpcache", "ours", "ours-nopolite")
CPU_TARGET, RSS_TARGET, RECRAWL_TARGET = 1.15, 1.2, 0.25


def find_python_docs() -> Path | None:
    """The python3-doc HTML directory, if the package is installed."""
    for pattern in DOC_DIR_PATTERNS:
        for path in sorted(DOC_ROOT.glob(pattern)):
            if (path / "index.html").is_file() and sum(1 for _ in path.rglob("*.html")) >= 50:
                return path
    return None


def later(faketime: bool) -> tuple[list[str], dict[str, str]]:
    """Wrapper and extra settings of a crawl two days after the cold one."""
    if faketime:
        return ["faketime", "-f", "+2d"], {}
    return [], {"INCREMENTAL_REVISIT_ENABLED": "False"}


def crawl(site: Site, variant: str, work: Path, name: str, *, timeout: float,
          again: bool = False, faketime: bool = True, paced_delay: float = 0.02):
    """One crawl of *variant*; its state or cache lives in ``work/<variant>``."""
    wrapper: list[str] = []
    extra: dict[str, str] = {}
    if again:
        wrapper, extra = later(faketime)
    home = work / variant
    home.mkdir(exist_ok=True)
    robots = f"sitemap_url={site.base_url}/robots.txt"
    if variant in ("plain", "plain-paced", "httpcache"):
        settings = dict(PLAIN_SETTINGS)
        if variant == "plain-paced":
            settings.update({"DOWNLOAD_DELAY": str(paced_delay),
                             "RANDOMIZE_DOWNLOAD_DELAY": "False"})
        if variant == "httpcache":
            settings.update(httpcache_settings(home / "httpcache"))
            del settings["INCREMENTAL_ENABLED"]  # nothing of ours is loaded anyway
        return run_crawl(site.base_url, settings, work, name, timeout=timeout, cwd=home,
                         wrapper=wrapper,
                         command=["runspider", str(PLAIN_SPIDER), "-a", robots])
    settings = {**ours_settings(home / "state.db"), **extra}
    if variant == "ours-nopolite":
        settings["INCREMENTAL_THROTTLE_ENABLED"] = "False"
    return run_crawl(site.base_url, settings, work, name, timeout=timeout, wrapper=wrapper)


def check_texts(plain_items: list[dict], ours_items: list[dict]) -> int:
    """Pages whose title or text differ between the plain and our crawl."""
    ours = {urlsplit(i["url"]).path: i for i in ours_items}
    return sum(1 for i in plain_items
               if (o := ours.get(urlsplit(i["url"]).path)) is None
               or (o["title"], o["text"]) != (i["title"], i["text"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=530,
                   help="pages on the site (default 530; with python3-doc: at most)")
    p.add_argument("--page-size", type=int, default=96_000,
                   help="bytes per generated page (default 96000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each variant once (>= 3)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--docs-dir", type=Path, help="serve this directory's *.html files")
    source.add_argument("--generated", action="store_true",
                        help="generated pages even when python3-doc is installed")
    p.add_argument("--paced-delay", type=float, default=0.02,
                   help="plain-paced's DOWNLOAD_DELAY (default 0.02 s: 50 requests/s, "
                   "INCREMENTAL_THROTTLE_MAX_RATE's default)")
    p.add_argument("--timeout", type=float, default=600, help="max seconds per crawl (600)")
    args = p.parse_args(argv)
    if args.rounds < 3:
        p.error("--rounds must be >= 3 (medians of alternating rounds)")
    docs = None if args.generated else (args.docs_dir or find_python_docs())
    site_args = ["--sitemap-lastmods", "none", "--cache-control", "max-age=0"]
    if docs is not None:
        site_args += ["--docs-dir", str(docs)]
        corpus = f"HTML files of {docs}"
    else:
        site_args += ["--layout", "docs"]
        corpus = f"generated documentation pages of {args.page_size} B (python3-doc not found)"
    faketime = shutil.which("faketime") is not None
    compile_bytecode()

    cold: dict[str, list] = {v: [] for v in COLD}
    again: dict[str, list] = {v: [] for v in RECRAWL}
    mismatched = None
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as tmp, \
            Site(args.pages, args.page_size, KINDS, extra_args=site_args) as site:
        for r in range(args.rounds):
            order = COLD if r % 2 == 0 else COLD[::-1]
            work = Path(tmp) / f"round-{r}"
            work.mkdir()
            for variant in order:
                print(f"... round {r + 1}/{args.rounds}: {variant}", file=sys.stderr)
                site.reset()
                res = crawl(site, variant, work, f"{variant}-1", timeout=args.timeout,
                            paced_delay=args.paced_delay)
                cold[variant].append((res, summarize_log(site.log()), res.items))
            pages = cold["plain"][-1][1].page_requests
            for variant in COLD:
                if cold[variant][-1][2] != pages:
                    raise SystemExit(f"{variant}, round {r + 1}: "
                                     f"{cold[variant][-1][2]} items, {pages} pages")
            if mismatched is None:
                mismatched = check_texts(cold["plain"][-1][0].item_list,
                                         cold["ours"][-1][0].item_list)
            for variant in (v for v in order if v in RECRAWL):
                print(f"... round {r + 1}/{args.rounds}: {variant} again", file=sys.stderr)
                site.reset()
                res = crawl(site, variant, work, f"{variant}-2", timeout=args.timeout,
                            again=True, faketime=faketime)
                again[variant].append((res, summarize_log(site.log()), res.items))
            for variant in COLD:  # the feeds' items are not needed any more
                cold[variant][-1][0].item_list.clear()
            shutil.rmtree(work)
        body_bytes = cold["plain"][0][1].body_bytes

    n = cold["plain"][0][1].page_requests
    print(f"cold_overhead: {corpus}; {n} pages, {body_bytes / max(n, 1) / 1000:.1f} kB per "
          f"page on average (all bodies {body_bytes / 1e6:.1f} MB); kinds {KINDS}; "
          f"{args.rounds} rounds, ABBA order; CPU = user+sys of the crawl process")
    med = {v: median([r.usage.cpu for r, *_ in cold[v]]) for v in COLD}
    rss = {v: median([r.usage.maxrss_kib for r, *_ in cold[v]]) for v in COLD}
    rows = []
    for v in COLD:
        runs = cold[v]
        rows.append([v, " ".join(f"{r.usage.cpu:.2f}" for r, *_ in runs), f"{med[v]:.2f}",
                     f"{median([r.usage.wall for r, *_ in runs]):.2f}",
                     f"{rss[v] / 1024:.0f}", runs[0][1].requests, runs[0][2],
                     ratio(med[v], med["plain"]), ratio(rss[v], rss["plain"])])
    print("\nCold crawl (empty store, empty cache)")
    print_table(["variant", "CPU s per round", "median CPU s", "median wall s",
                 "peak RSS MiB", "requests", "items", "CPU vs plain", "RSS vs plain"], rows)
    print(f"plain and ours: {mismatched} pages with a different title or text")

    when = "faketime -f +2d" if faketime else "revisits off (no faketime here)"
    print(f"\nRe-crawl two days later ({when}): nothing changed, no lastmod, every page due")
    amed = {v: median([r.usage.cpu for r, *_ in again[v]]) for v in RECRAWL}
    rows = []
    for v in RECRAWL:
        runs = again[v]
        log = runs[0][1]
        rows.append([v, " ".join(f"{r.usage.cpu:.2f}" for r, *_ in runs), f"{amed[v]:.2f}",
                     f"{median([r.usage.wall for r, *_ in runs]):.2f}", log.requests,
                     log.not_modified, log.body_bytes, runs[0][2],
                     ratio(amed[v], amed["httpcache"])])
    print_table(["variant", "CPU s per round", "median CPU s", "median wall s", "requests",
                 "304s", "body bytes", "items", "CPU vs httpcache"], rows)

    cpu_r = med["ours"] / med["plain"]
    rss_r = rss["ours"] / rss["plain"]
    re_r = amed["ours"] / amed["httpcache"]
    print()
    print(f"cold CPU ours/plain = {cpu_r:.3f}x (politeness off: "
          f"{med['ours-nopolite'] / med['plain']:.3f}x)  "
          f"(target <= {CPU_TARGET}x: {verdict(cpu_r <= CPU_TARGET)})")
    print(f"cold CPU ours/plain-paced = {med['ours'] / med['plain-paced']:.3f}x (both paced; "
          f"plain-paced/plain = {med['plain-paced'] / med['plain']:.3f}x)")
    print(f"cold peak RSS ours/plain = {rss_r:.3f}x  "
          f"(target <= {RSS_TARGET}x: {verdict(rss_r <= RSS_TARGET)})")
    print(f"re-crawl CPU ours/httpcache = {re_r:.3f}x  "
          f"(target <= {RECRAWL_TARGET}x: {verdict(re_r <= RECRAWL_TARGET)})")
    print(f"texts: {verdict(mismatched == 0)} (plain and ours emit the same title and text)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
