"""Lying validators over successive crawls: plain Scrapy vs HttpCache vs ours.

What it measures
    A loopback site of N pages (default 200 x 20,000 bytes) of kind
    ``stuck``: every page answers with ``ETag: "stuck"`` and a constant
    ``Last-Modified`` although its content changes - validators that lie, so
    a conditional request gets a 304 for a changed page. Per variant, with a
    freshly started site and its own fresh state/cache directory:

        crawl 1 (cold), then K - 1 times: change 5% of the pages
        (seed = crawl number, the same for every variant) -> crawl

    Per crawl it counts, against the site's real page versions (each page's
    ``<title>`` ends in ``v<version>``): changes *found* (an item carrying
    the page's current version, for a page whose last emitted version was
    older), changes still *hidden* after the crawl, and unchanged pages
    re-emitted; and from the server's log, page requests, 304s and body
    bytes.

    Variants: ``plain`` = INCREMENTAL_ENABLED=False; ``httpcache`` = plain +
    HTTPCACHE_ENABLED with RFC2616Policy; ``httpcache-dummy`` = plain +
    HTTPCACHE_ENABLED with DummyPolicy (caches everything, never
    revalidates); ``ours-N<n>`` = the project's defaults with
    INCREMENTAL_RECHECK_EVERY=n, ``-a use_lastmod=false`` and the revisit
    schedule off: every page gets a conditional request each crawl, so the
    validators (and the sampled re-check) are all that can find a change;
    politeness pacing off (politeness.py measures it), as for the baselines.
    (With the sitemap's lastmods, which are truthful on this site, ours finds
    every change at once: see second_crawl.py.)

How to read it
    * The bound (incremental_crawler/trust.py): with RECHECK_EVERY = n every
      page is fetched in full on one visit in n, so a hidden change is found
      within n crawls (one visit per crawl); once any change is found the
      host is distrusted and every hidden change is found on the next visit
      of its page. "max crawls to find" must be <= n, and no change may stay
      hidden for more than n crawls ("overdue" = 0).
    * HttpCache never finds a change: RFC2616Policy serves the pages from the
      cache without asking (heuristically fresh: a tenth of the time since
      Last-Modified), and a revalidation would get 304 anyway; DummyPolicy
      never asks.
    * Plain finds every change and re-emits every unchanged page.

    python bench/lying_validators.py [--pages 200] [--crawls 8] [--recheck 200,20,4]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    Site,
    httpcache_settings,
    ours_settings,
    plain_settings,
    print_table,
    ratio,
    run_crawl,
    verdict,
)

_VERSION = re.compile(r" v(\d+)$")


def item_version(item: dict) -> int:
    match = _VERSION.search(item.get("title") or "")
    if match is None:
        raise ValueError(f"no version in the title of {item.get('url')}: {item.get('title')!r}")
    return int(match.group(1))


def run_variant(name: str, settings: dict[str, str], args: argparse.Namespace, work: Path,
                spider_args: dict[str, str] | None) -> list[dict]:
    """K crawls of one variant; one row of figures per crawl."""
    rows = []
    with Site(args.pages, args.page_size, "stuck") as site:
        version: dict[str, int] = {}
        known: dict[str, int] = {}  # the version this variant last emitted
        changed_at: dict[str, int] = {}  # path -> crawl before which its oldest hidden change came
        for crawl in range(1, args.crawls + 1):
            changes = []
            if crawl > 1:
                changes = site.change(args.fraction, crawl)
                for path in changes:
                    version[path] = version.get(path, 0) + 1
                    changed_at.setdefault(path, crawl)
            site.reset()
            result = run_crawl(site.base_url, settings, work, f"{name}-{crawl}",
                               timeout=args.timeout, spider_args=spider_args)
            log = [r for r in site.log() if r["path"].startswith("/p/")]
            found = extra = 0
            delays = []
            for item in result.item_list:
                path = urlsplit(item["url"]).path
                v = item_version(item)
                if crawl > 1 and v == version.get(path, 0) and known.get(path, 0) < v:
                    # Every change made since the version last emitted.
                    found += v - known.get(path, 0)
                    delays.append(crawl - changed_at.pop(path) + 1)
                elif crawl > 1:
                    extra += 1
                known[path] = max(known.get(path, 0), v)
            hidden = [p for p, v in version.items() if known.get(p, 0) < v]
            rows.append({
                "crawl": crawl, "changed": len(changes), "found": found,
                "hidden": sum(version[p] - known.get(p, 0) for p in hidden), "extra": extra,
                "max_delay": max(delays, default=0),
                # Hidden changes older than the crawls since they were made.
                "oldest_hidden": max((crawl - changed_at[p] + 1 for p in hidden), default=0),
                "requests": len(log),
                "not_modified": sum(1 for r in log if r["status"] == 304),
                "bytes": sum(r["body_bytes"] for r in log),
                "items": result.items,
            })
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=200, help="pages on the site (default 200)")
    p.add_argument("--page-size", type=int, default=20_000, help="HTML bytes per page (20000)")
    p.add_argument("--crawls", type=int, default=8, help="crawls per variant (8)")
    p.add_argument("--fraction", type=float, default=0.05, help="pages changed per crawl (0.05)")
    p.add_argument("--recheck", default="200,20,4",
                   help="INCREMENTAL_RECHECK_EVERY values of the ours variants (200,20,4)")
    p.add_argument("--timeout", type=float, default=300, help="max seconds per crawl (300)")
    args = p.parse_args(argv)
    rechecks = [int(n) for n in args.recheck.split(",") if n.strip()]

    with tempfile.TemporaryDirectory(prefix="bench-lying-") as tmp:
        work = Path(tmp)
        dummy = {**httpcache_settings(work / "dummy"),
                 "HTTPCACHE_POLICY": "scrapy.extensions.httpcache.DummyPolicy"}
        variants: list[tuple[str, dict[str, str], dict[str, str] | None]] = [
            ("plain", plain_settings(), None),
            ("httpcache", httpcache_settings(work / "httpcache"), None),
            ("httpcache-dummy", dummy, None),
        ]
        variants.extend((f"ours-N{n}", {
            **ours_settings(work / f"ours-{n}" / "state.db"),
            "INCREMENTAL_REVISIT_ENABLED": "False",
            "INCREMENTAL_RECHECK_EVERY": str(n),
            # Pacing is politeness.py's subject; here only what is fetched.
            "INCREMENTAL_THROTTLE_ENABLED": "False",
        }, {"use_lastmod": "false"}) for n in rechecks)
        res = {}
        for name, settings, spider_args in variants:
            print(f"... {name}: {args.crawls} crawls", file=sys.stderr)
            res[name] = run_variant(name, settings, args, work, spider_args)

    names = [v[0] for v in variants]
    print(f"lying_validators: {args.pages} pages x {args.page_size} B, kind stuck "
          f"(ETag and Last-Modified never change), {args.fraction:.0%} of the pages changed "
          f"before each of crawls 2..{args.crawls}")
    print("Changes found per crawl (hidden after the crawl in brackets):")
    table = []
    for i in range(1, args.crawls):
        row = [i + 1, res[names[0]][i]["changed"]]
        row += [f"{res[n][i]['found']} ({res[n][i]['hidden']})" for n in names]
        table.append(row)
    print_table(["crawl", "changed", *names], table)

    print()
    print(f"Crawls 2..{args.crawls} in total (pages only; server figures):")
    totals = {}
    rows = []
    for n in names:
        later = res[n][1:]
        t = {k: sum(r[k] for r in later) for k in
             ("changed", "found", "extra", "requests", "not_modified", "bytes", "items")}
        t["hidden"] = later[-1]["hidden"]
        t["max_delay"] = max(r["max_delay"] for r in later)
        t["oldest_hidden"] = later[-1]["oldest_hidden"]
        totals[n] = t
        rows.append([n, t["changed"], t["found"], t["hidden"], t["extra"], t["max_delay"] or "-",
                     t["requests"], t["not_modified"], t["bytes"], t["items"]])
    print_table(["variant", "changes", "found", "hidden at end", "items unchanged or stale",
                 "max crawls to find", "requests", "304s", "body bytes", "items"], rows)

    print()
    rows = []
    for n in names:
        if not n.startswith("ours"):
            continue
        for base in ("plain", "httpcache"):
            o, b = totals[n], totals[base]
            rows.append([f"{n}/{base}", ratio(o["requests"], b["requests"]),
                         ratio(o["bytes"], b["bytes"]), ratio(o["items"], b["items"])])
    print_table(["ratio", "requests", "body bytes", "items"], rows)

    print()
    for n, every in zip(names[3:], rechecks, strict=True):
        t = totals[n]
        # A change still hidden after `every` visits of its page breaks the bound.
        overdue = sum(1 for r in res[n] if r["oldest_hidden"] >= every)
        ok = t["max_delay"] <= every and overdue == 0 and t["extra"] == 0
        print(f"{n}: every change found within {every} crawls (max {t['max_delay'] or '-'}), "
              f"{t['hidden']} still hidden at the end (oldest {t['oldest_hidden']} crawls), "
              f"no unchanged page emitted ({t['extra']}): {verdict(ok)}")
    for n in ("httpcache", "httpcache-dummy"):
        t = totals[n]
        print(f"{n}: {t['found']} of {t['changed']} changes found "
              f"(never: {verdict(t['found'] == 0)})")
    t = totals["plain"]
    print(f"plain: {t['found']} of {t['changed']} changes found, {t['extra']} unchanged pages "
          "re-emitted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
