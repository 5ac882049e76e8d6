"""The SQLite state store at 1,000,000 pages, and crawls against such a store.

What it measures
    1. Fill: ``SQLiteStateStore`` gets ``--pages`` page states (default
       1,000,000; scope ``sitemap``, fake URLs ``http://filler.invalid/p/N``,
       realistic ETag / Last-Modified / fingerprint) through its own staging
       API: ``stage_page`` for each, ``flush_now`` every ``--batch`` (5,000).
       Reports pages/s end to end (building the records + staging +
       committing) and pages/s of the ``flush_now`` commits alone.
    2. Lookups: ``--lookups`` (100,000) random ``get_page_now`` point
       lookups of stored keys; lookups/s.
    3. Memory: this process's VmRSS (/proc/self/status) before the store is
       opened, after the fill, after the lookups, and its ru_maxrss; the DB
       file size after a WAL checkpoint.
    4. Crawls: a loopback site of ``--crawl-pages`` (200) pages, crawl 1,
       change 5% of the pages, crawl 2, against (i) an empty store and
       (ii) a copy of the big store (the same ``sitemap`` scope, so every
       lookup of the crawl searches the big table). ``--repeat`` (5) rounds,
       alternating which store goes first, each with a fresh site and a
       fresh store copy. CPU = user+sys of the crawl process (os.wait4),
       max RSS = its ru_maxrss.

    The filler covers the ``pages`` table only; item fingerprints in the
    ``items`` table are only those of the crawl's own 200 pages.

How to read it
    Median CPU of crawl 1 and of crawl 2, big store / empty store: target
    <= 1.1x (a crawl's cost must not depend on the store's size). CPU
    times of ~2 s crawls vary by tens of percent from run to run on a
    shared 2-core machine; the ratio of the minima (the least disturbed
    runs) is printed as a second, less noisy reading. The crawl
    processes' max RSS should be about equal for both stores (nothing is
    loaded up front). Runs in about 1-2 minutes at the defaults on a
    2-core machine; ``--pages`` shrinks it.

    python bench/store_scale.py [--pages 1000000] [--lookups 100000] [--crawl-pages 200]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    Site,
    copy_sqlite,
    ensure_importable,
    median,
    mib,
    ours_settings,
    print_table,
    ratio,
    run_crawl,
    summarize_log,
    verdict,
    vm_rss_kib,
)

ensure_importable()

from incremental_crawler.state.records import PageKey, PageState
from incremental_crawler.state.stores.sqlite import SQLiteStateStore
from tests.site import BASE_EPOCH, http_date

SCOPE = "sitemap"  # the sitemap spider's scope: the crawl searches the big table
KINDS = "strong,weak,lastmod"


def filler_key(i: int) -> PageKey:
    return PageKey(SCOPE, f"http://filler.invalid/p/{i}", "")


def fill(path: Path, pages: int, batch: int, max_seconds: float) -> dict:
    """Fill a new store; return timings. Bounded by *max_seconds*."""
    store = SQLiteStateStore(path)
    now = time.time()
    lm = http_date(BASE_EPOCH)
    flush_s = 0.0
    started = time.perf_counter()
    done = 0
    while done < pages:
        end = min(done + batch, pages)
        for i in range(done, end):
            fp = f"{(i * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF:016x}"
            store.stage_page(PageState(
                filler_key(i), etag=f'"{fp}"', last_modified=lm, fingerprint=fp,
                size=30_000, last_status=200, first_seen=now, last_checked=now,
                last_fetched=now, last_changed=now, checks=1,
            ))
        t = time.perf_counter()
        store.flush_now()
        flush_s += time.perf_counter() - t
        done = end
        if time.perf_counter() - started > max_seconds:
            raise SystemExit(f"fill exceeded {max_seconds:.0f} s at {done} pages; "
                             "use a smaller --pages")
    total_s = time.perf_counter() - started
    return {"store": store, "total_s": total_s, "flush_s": flush_s}


def lookups(store: SQLiteStateStore, pages: int, n: int, seed: int) -> float:
    rng = random.Random(seed)
    keys = [filler_key(rng.randrange(pages)) for _ in range(n)]
    started = time.perf_counter()
    hits = sum(1 for k in keys if store.get_page_now(k) is not None)
    elapsed = time.perf_counter() - started
    if hits != n:
        raise SystemExit(f"only {hits} of {n} lookups found their page")
    return elapsed


def crawl_pair(store_path: Path, args: argparse.Namespace, work: Path, tag: str) -> dict:
    """crawl 1, change 5%, crawl 2 against a fresh site, with the store at *store_path*."""
    settings = ours_settings(store_path)
    with Site(args.crawl_pages, args.page_size, KINDS) as site:
        c1 = run_crawl(site.base_url, settings, work, f"{tag}-1", timeout=args.timeout)
        site.reset()
        changed = site.change(0.05, 1)
        c2 = run_crawl(site.base_url, settings, work, f"{tag}-2", timeout=args.timeout)
        log2 = summarize_log(site.log())
    if c1.items != args.crawl_pages or c2.item_paths() != set(changed):
        raise SystemExit(f"{tag}: unexpected items ({c1.items} in crawl 1, "
                         f"{c2.items} in crawl 2 for {len(changed)} changed pages)")
    return {"c1": c1, "c2": c2, "log2": log2}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=1_000_000, help="pages in the big store (1e6)")
    p.add_argument("--batch", type=int, default=5_000, help="stage_page calls per flush (5000)")
    p.add_argument("--lookups", type=int, default=100_000, help="random lookups (100000)")
    p.add_argument("--crawl-pages", type=int, default=200, help="pages of the crawled site (200)")
    p.add_argument("--page-size", type=int, default=30_000, help="HTML bytes per page (30000)")
    p.add_argument("--repeat", type=int, default=5, help="crawl rounds per store (5)")
    p.add_argument("--seed", type=int, default=7, help="seed of the lookups (7)")
    p.add_argument("--max-fill-seconds", type=float, default=600, help="fill time limit (600)")
    p.add_argument("--timeout", type=float, default=600, help="max seconds per crawl (600)")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-store-scale-") as tmp:
        work = Path(tmp)
        big = work / "big" / "state.db"

        rss0 = vm_rss_kib()
        print(f"... filling {args.pages} pages", file=sys.stderr)
        f = fill(big, args.pages, args.batch, args.max_fill_seconds)
        store = f["store"]
        rss1 = vm_rss_kib()
        print(f"... {args.lookups} lookups", file=sys.stderr)
        look_s = lookups(store, args.pages, args.lookups, args.seed)
        rss2 = vm_rss_kib()
        count = store.count_pages(SCOPE)
        asyncio.run(store.close())
        pristine = work / "big-pristine.db"
        copy_sqlite(big, pristine)
        db_bytes = pristine.stat().st_size
        maxrss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

        rounds: dict[str, list[dict]] = {"empty": [], "big": []}
        for i in range(args.repeat):
            for which in (("empty", "big") if i % 2 == 0 else ("big", "empty")):
                print(f"... round {i + 1}/{args.repeat}: crawls against the {which} store",
                      file=sys.stderr)
                path = work / f"{which}-{i}" / "state.db"
                path.parent.mkdir(parents=True)
                if which == "big":
                    copy_sqlite(pristine, path)
                rounds[which].append(crawl_pair(path, args, work, f"{which}-{i}"))
                if which == "big":
                    path.unlink()  # keep at most one copy on disk

    n = args.pages
    print(f"store_scale: SQLiteStateStore with {count} pages (scope {SCOPE!r}, "
          f"flush every {args.batch})")
    print_table(["store figure", "value"], [
        ["fill, end to end", f"{n / f['total_s']:,.0f} pages/s ({f['total_s']:.1f} s)"],
        ["fill, flush_now commits only", f"{n / f['flush_s']:,.0f} pages/s ({f['flush_s']:.1f} s)"],
        [f"get_page_now x{args.lookups}", (f"{args.lookups / look_s:,.0f} lookups/s "
                                           f"({1e6 * look_s / args.lookups:.1f} us each)")],
        ["VmRSS before open", f"{rss0 / 1024:.1f} MiB"],
        ["VmRSS after fill", f"{rss1 / 1024:.1f} MiB"],
        ["VmRSS after lookups", f"{rss2 / 1024:.1f} MiB"],
        ["ru_maxrss (this process)", f"{maxrss_self / 1024:.1f} MiB"],
        ["DB file (checkpointed)", f"{db_bytes:,} B ({mib(db_bytes)}, {db_bytes / n:.0f} B/page)"],
    ])
    print()
    print(f"Crawls of a {args.crawl_pages}-page site ({args.page_size} B pages, kinds {KINDS}; "
          f"crawl 2 after 5% changed), {args.repeat} rounds each; "
          "CPU = user+sys of the crawl process")
    rows = []
    med: dict[tuple[str, str], float] = {}
    low: dict[tuple[str, str], float] = {}
    for which in ("empty", "big"):
        for c in ("c1", "c2"):
            rs = [r[c].usage for r in rounds[which]]
            med[which, c] = median([u.cpu for u in rs])
            low[which, c] = min(u.cpu for u in rs)
            rows.append([
                f"{which} store, crawl {c[1]}",
                " ".join(f"{u.cpu:.2f}" for u in rs), f"{med[which, c]:.2f}",
                f"{low[which, c]:.2f}",
                f"{median([u.wall for u in rs]):.2f}",
                f"{max(u.maxrss_kib for u in rs) / 1024:.0f}",
                rounds[which][0][c].items,
            ])
    for c in ("c1", "c2"):
        walls = {w: median([r[c].usage.wall for r in rounds[w]]) for w in ("empty", "big")}
        rows.append([f"big/empty, crawl {c[1]}", "", ratio(med["big", c], med["empty", c]),
                     ratio(low["big", c], low["empty", c]),
                     ratio(walls["big"], walls["empty"]), "", ""])
    print_table(["crawl", "CPU s per round", "median CPU s", "min CPU s", "median wall s",
                 "max RSS MiB", "items"], rows)
    print(f"crawl 2 server side (round 1): big store {rounds['big'][0]['log2'].not_modified} "
          f"304s, empty store {rounds['empty'][0]['log2'].not_modified} 304s")
    for c in ("c1", "c2"):
        r = med["big", c] / med["empty", c]
        print(f"crawl {c[1]}: median CPU big/empty = {r:.3f}x  "
              f"(target <= 1.1x: {verdict(r <= 1.1)}); "
              f"min CPU big/empty = {low['big', c] / low['empty', c]:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
