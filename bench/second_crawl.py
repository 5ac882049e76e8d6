"""Second crawl after 5% of the pages changed: plain Scrapy vs HttpCache vs ours.

What it measures
    A loopback site of N pages (default 400 x 30,000 bytes) whose pages all
    send validators (kinds strong = ETag + Last-Modified, weak = weak ETag,
    lastmod = Last-Modified only, in turn). For each variant, with a freshly
    started site and its own fresh state/cache directory:

        crawl 1 (cold) -> change 5% of the pages (same seed) -> crawl 2

    and reports crawl 2 from the server's side (requests, 304s, body bytes
    served, all paths incl. robots.txt and sitemaps) and the crawl process's
    side (items emitted, user+sys CPU seconds via os.wait4, wall seconds).

    Variants: ``plain`` = the same spider with INCREMENTAL_ENABLED=False;
    ``httpcache`` = plain + HTTPCACHE_ENABLED with RFC2616Policy;
    ``ours`` = the project's defaults (SQLite state store, items stored,
    sitemap lastmod decides which pages are requested at all);
    ``ours-conditional`` = ours with ``-a use_lastmod=false`` and the
    revisit schedule off (every page gets a conditional request: the
    validators alone);
    ``ours-state`` = ours with INCREMENTAL_STORE_ITEMS=False (used for the
    state-size comparison).

How to read it
    * ratio columns: ours / plain and ours / httpcache (< 1 = ours is less).
    * "crawl-2 bytes / crawl-1 bytes" for ours: target <= 6%.
    * "changed pages -> items": every changed page must yield an item and no
      unchanged page may (shown for every variant; plain re-emits
      everything; RFC2616Policy serves Last-Modified pages from the cache
      while heuristically fresh, so it may miss changes).
    * state size: our SQLite store (state only, compacted) vs the
      apparent size of the HTTPCACHE dir after the same two crawls;
      target < 1%.

    python bench/second_crawl.py [--pages 400] [--page-size 30000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    Site,
    dir_apparent_bytes,
    httpcache_settings,
    mib,
    ours_settings,
    plain_settings,
    print_table,
    ratio,
    run_crawl,
    sample_bound,
    sqlite_compact_size,
    summarize_log,
    verdict,
)

KINDS = "strong,weak,lastmod"


def run_variant(name: str, settings: dict[str, str], args: argparse.Namespace,
                work: Path, spider_args: dict[str, str] | None = None) -> dict:
    """crawl 1, change, crawl 2 against a freshly started site."""
    with Site(args.pages, args.page_size, args.kinds) as site:
        c1 = run_crawl(site.base_url, settings, work, f"{name}-1", timeout=args.timeout,
                       spider_args=spider_args)
        log1 = summarize_log(site.log())
        site.reset()
        changed = set(site.change(args.fraction, args.seed))
        c2 = run_crawl(site.base_url, settings, work, f"{name}-2", timeout=args.timeout,
                       spider_args=spider_args)
        log2 = summarize_log(site.log())
    before, after = c1.by_path(), c2.by_path()

    def content(item: dict) -> tuple:
        return item.get("title"), item.get("text")

    # A changed page counts as caught only if its crawl-2 item carries the
    # new content (a cached copy of the old page is a miss).
    caught = {p for p in changed
              if p in after and (p not in before or content(after[p]) != content(before[p]))}
    return {
        "name": name, "c1": c1, "c2": c2, "log1": log1, "log2": log2,
        "changed": changed,
        "missed": len(changed - caught),
        "extra": len(set(after) - changed),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=400, help="pages on the site (default 400)")
    p.add_argument("--page-size", type=int, default=30_000, help="HTML bytes per page (30000)")
    p.add_argument("--fraction", type=float, default=0.05, help="pages changed (0.05)")
    p.add_argument("--seed", type=int, default=1, help="seed of the change (1)")
    p.add_argument("--kinds", default=KINDS,
                   help=f"page kinds of the site ({KINDS}); e.g. none (no validators) or "
                        "noisy (no validators, a timestamp on every response)")
    p.add_argument("--timeout", type=float, default=600, help="max seconds per crawl (600)")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-second-crawl-") as tmp:
        work = Path(tmp)
        cache_dir = work / "httpcache"
        ours_db = work / "ours" / "state.db"
        state_db = work / "ours-state" / "state.db"
        cond_db = work / "ours-conditional" / "state.db"
        variants = [
            ("plain", plain_settings(), None),
            ("httpcache", httpcache_settings(cache_dir), None),
            ("ours", ours_settings(ours_db), None),
            # Revisit schedule off too: every page is asked, conditionally.
            ("ours-conditional", {**ours_settings(cond_db), "INCREMENTAL_REVISIT_ENABLED": "False"},
             {"use_lastmod": "false"}),
            ("ours-state", ours_settings(state_db, store_items=False), None),
        ]
        res = {}
        for name, settings, spider_args in variants:
            print(f"... {name}: crawl 1, change {args.fraction:.0%}, crawl 2", file=sys.stderr)
            res[name] = run_variant(name, settings, args, work, spider_args)
        cache_bytes = dir_apparent_bytes(cache_dir)
        state_bytes = sqlite_compact_size(state_db)
        ours_bytes = sqlite_compact_size(ours_db)

    n_changed = len(res["ours"]["changed"])
    print(f"second_crawl: {args.pages} pages x {args.page_size} B, kinds {args.kinds} "
          f"{'(every page sends validators)' if args.kinds == KINDS else ''}, "
          f"{n_changed} pages changed "
          f"({args.fraction:.0%}, seed {args.seed}) between crawl 1 and crawl 2")
    print("Crawl 2 (server figures include robots.txt + sitemaps; CPU = user+sys "
          "of the crawl process):")
    rows = []
    for name in ("plain", "httpcache", "ours", "ours-conditional", "ours-state"):
        r = res[name]
        u = r["c2"].usage
        rows.append([name, r["log2"].requests, r["log2"].not_modified,
                     r["log2"].body_bytes, r["c2"].items, f"{u.cpu:.2f}", f"{u.wall:.2f}",
                     f"{r['missed']}/{r['extra']}"])
    o, pl, hc = res["ours"], res["plain"], res["httpcache"]

    def ratios(base: dict, label: str) -> list:
        return [label,
                ratio(o["log2"].requests, base["log2"].requests),
                ratio(o["log2"].not_modified, base["log2"].not_modified),
                ratio(o["log2"].body_bytes, base["log2"].body_bytes),
                ratio(o["c2"].items, base["c2"].items),
                ratio(o["c2"].usage.cpu, base["c2"].usage.cpu),
                ratio(o["c2"].usage.wall, base["c2"].usage.wall), ""]

    rows.append(ratios(pl, "ours/plain"))
    rows.append(ratios(hc, "ours/httpcache"))
    print_table(["variant", "requests", "304s", "body bytes", "items", "CPU s", "wall s",
                 "missed/extra"], rows)
    print("  missed/extra = changed pages without an item carrying the new content / "
          "unchanged pages with an item")

    print()
    for name in ("ours", "ours-conditional"):
        b1, b2 = res[name]["log1"].body_bytes, res[name]["log2"].body_bytes
        pct = 100.0 * b2 / b1 if b1 else float("nan")
        print(f"{name} crawl-2 body bytes / crawl-1 body bytes: {b2} / {b1} = {pct:.2f}%  "
              f"(target <= 6%: {verdict(pct <= 6.0)})")
    # robots.txt twice (ROBOTSTXT_OBEY and the sitemap source) + index + 2
    # sitemaps, and the rotating sample of pages whose lastmod did not move.
    sample = sample_bound(args.pages)
    bound = n_changed + 5 + sample
    print(f"ours crawl-2 requests: {o['log2'].requests} <= changed pages + robots + "
          f"sitemaps + sample = {n_changed} + 5 + {sample}  "
          f"({verdict(o['log2'].requests <= bound)}); plain SitemapSpider: {pl['log2'].requests}")
    exact = o["missed"] == 0 and o["extra"] == 0 and o["c2"].items == n_changed
    print(f"ours items == changed pages: {o['c2'].items} items, {n_changed} changed, "
          f"{o['missed']} missed, {o['extra']} unchanged emitted  ({verdict(exact)})")
    for name in ("plain", "httpcache"):
        r = res[name]
        print(f"  {name}: {r['c2'].items} items, {r['missed']} changed pages missed or stale, "
              f"{r['extra']} unchanged pages emitted")
    share = 100.0 * state_bytes / cache_bytes if cache_bytes else float("nan")
    print(f"state size: ours (INCREMENTAL_STORE_ITEMS=False, compacted) {state_bytes} B "
          f"({mib(state_bytes)}) vs HTTPCACHE dir {cache_bytes} B ({mib(cache_bytes)}) "
          f"= {share:.2f}%  (target < 1%: {verdict(share < 1.0)})")
    # No validators, no HTTPCACHE entries (RFC2616Policy stores nothing it
    # cannot revalidate): the share is undefined then.
    ours_share = 100.0 * ours_bytes / cache_bytes if cache_bytes else float("nan")
    print(f"  for reference: ours with items stored (default) {ours_bytes} B ({mib(ours_bytes)}) "
          f"= {ours_share:.2f}% of the HTTPCACHE dir")
    print("Crawl 1 (cold) for reference:")
    print_table(["variant", "requests", "body bytes", "items", "CPU s", "wall s"],
                [[n, res[n]["log1"].requests, res[n]["log1"].body_bytes, res[n]["c1"].items,
                  f"{res[n]['c1'].usage.cpu:.2f}", f"{res[n]['c1'].usage.wall:.2f}"]
                 for n in ("plain", "httpcache", "ours", "ours-conditional", "ours-state")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
