"""The Redis state store beside the SQLite one: fill, batched lookups, real crawls.

What it measures
    A throwaway ``redis-server`` of its own on 127.0.0.1 (a free port,
    nothing persisted, stopped at the end) and a SQLite file in a temporary
    directory, side by side, baseline = SQLite, ours = Redis:

    1. Fill: ``--pages`` (100,000) page states (scope ``sitemap``, fake URLs
       ``http://filler.invalid/p/N``, realistic validators and fingerprint)
       through the staging API, ``flush()`` every ``--batch`` (5,000).
       Pages/s end to end; the space they take (SQLite file after a WAL
       checkpoint; Redis ``used_memory`` growth).
    2. Lookups: ``--lookups`` (100,000) random stored keys read with
       ``get_pages`` in batches of ``--lookup-batch`` (1,000, as the sitemap
       spider does), and 5,000 single ``get_page`` calls; lookups/s, and the
       Redis round-trips they took.
    3. Crawls: a loopback site of ``--crawl-pages`` (200) pages; crawl 1,
       change 5%, crawl 2 (``use_lastmod=false``, revisits off: every page
       gets a conditional request), for each store, ``--repeat`` (3) rounds in
       alternating order, each with a fresh site and an empty store (a new
       SQLite file, a new Redis key prefix). CPU = user+sys of the crawl
       process (os.wait4); round-trips = the crawl's
       ``incremental/store_roundtrips`` stat, per page of the site.

How to read it
    Ratios are Redis / SQLite (> 1 = Redis costs more). Redis answers over
    a socket, so single lookups cost a round-trip each where SQLite reads a
    page cache: expect Redis to be slower per point lookup and close for
    batched ones. The crawl CPU ratio is the figure that matters for a crawl
    (target <= 1.25x; the network wait is not CPU); round-trips per page say
    how chatty the store is (reads: one per page for its state, one per item
    for its fingerprint; writes: one per flush of up to
    ``INCREMENTAL_BATCH_SIZE`` writes). Runs in about two minutes at the
    defaults on a 2-core machine.

    python bench/redis_store.py [--pages 100000] [--lookups 100000] [--crawl-pages 200]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    RedisServer,
    Site,
    ensure_importable,
    median,
    mib,
    print_table,
    ratio,
    run_crawl,
    summarize_log,
    verdict,
)

ensure_importable()


from incremental_crawler.state.records import PageKey, PageState
from incremental_crawler.state.stores.redis import RedisStateStore
from incremental_crawler.state.stores.sqlite import SQLiteStateStore
from tests.site import BASE_EPOCH, http_date

if TYPE_CHECKING:
    from incremental_crawler.state.stores.base import StateStore

SCOPE = "sitemap"
KINDS = "strong,weak,lastmod"
_STAT = re.compile(r"'incremental/store_roundtrips': (\d+)")


def filler_key(i: int) -> PageKey:
    return PageKey(SCOPE, f"http://filler.invalid/p/{i}", "")


async def fill(store: StateStore, pages: int, batch: int, max_seconds: float) -> float:
    """Stage and flush *pages* page states; return the seconds it took."""
    now = time.time()
    lm = http_date(BASE_EPOCH)
    started = time.perf_counter()
    for start in range(0, pages, batch):
        for i in range(start, min(start + batch, pages)):
            fp = f"{(i * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF:016x}"
            store.stage_page(PageState(
                filler_key(i), etag=f'"{fp}"', last_modified=lm, fingerprint=fp,
                size=30_000, last_status=200, first_seen=now, last_checked=now,
                last_fetched=now, last_changed=now, checks=1,
            ))
        await store.flush()
        if time.perf_counter() - started > max_seconds:
            raise SystemExit(f"fill exceeded {max_seconds:.0f} s; use a smaller --pages")
    return time.perf_counter() - started


async def lookups(store: StateStore, pages: int, n: int, batch: int, seed: int) -> dict:
    rng = random.Random(seed)
    keys = [filler_key(rng.randrange(pages)) for _ in range(n)]
    trips = store.roundtrips
    started = time.perf_counter()
    hits = 0
    for start in range(0, n, batch):
        hits += len(await store.get_pages(keys[start:start + batch]))
    batched_s = time.perf_counter() - started
    batched_trips = store.roundtrips - trips
    singles = keys[:5_000]
    started = time.perf_counter()
    for key in singles:
        hits += await store.get_page(key) is not None
    single_s = time.perf_counter() - started
    # get_pages de-duplicates nothing: a key drawn twice in a batch is one hit.
    if hits < len(singles) + len(set(keys)) * 0.99:
        raise SystemExit(f"lookups found only {hits} pages")
    return {"batched_s": batched_s, "batched_trips": batched_trips, "single_s": single_s,
            "singles": len(singles), "single_trips": store.roundtrips - trips - batched_trips}


async def store_figures(args: argparse.Namespace, work: Path, server: RedisServer) -> dict:
    out: dict[str, dict] = {}
    db = work / "fill" / "state.db"
    mem0 = server.used_memory()
    for name, store in (("sqlite", SQLiteStateStore(db)),
                        ("redis", RedisStateStore(server.uri, prefix="fill"))):
        print(f"... {name}: filling {args.pages} pages, {args.lookups} lookups", file=sys.stderr)
        try:
            fill_s = await fill(store, args.pages, args.batch, args.max_fill_seconds)
            fill_trips = store.roundtrips
            out[name] = {"fill_s": fill_s, "fill_trips": fill_trips,
                         **await lookups(store, args.pages, args.lookups,
                                         args.lookup_batch, args.seed)}
        finally:
            await store.close()
    con = sqlite3.connect(db)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()
    out["sqlite"]["bytes"] = db.stat().st_size
    out["redis"]["bytes"] = server.used_memory() - mem0
    return out


def roundtrips_of(work: Path, name: str) -> int:
    found = _STAT.findall((work / f"{name}.err").read_text(encoding="utf-8", errors="replace"))
    if not found:
        raise SystemExit(f"crawl {name}: no incremental/store_roundtrips stat in its log")
    return int(found[-1])


def crawl_pair(uri: str, args: argparse.Namespace, work: Path, tag: str) -> dict:
    # INFO: the stats dump (with the round-trips) is logged at INFO. Revisits
    # off: every page of crawl 2 is asked (conditionally), none skipped.
    settings = {"INCREMENTAL_STATE_URI": uri, "LOG_LEVEL": "INFO",
                "INCREMENTAL_REVISIT_ENABLED": "False"}
    with Site(args.crawl_pages, args.page_size, KINDS) as site:
        c1 = run_crawl(site.base_url, settings, work, f"{tag}-1", timeout=args.timeout)
        site.reset()
        changed = site.change(0.05, 1)
        c2 = run_crawl(site.base_url, settings, work, f"{tag}-2", timeout=args.timeout,
                       spider_args={"use_lastmod": "false"})
        log2 = summarize_log(site.log())
    if c1.items != args.crawl_pages or c2.item_paths() != set(changed):
        raise SystemExit(f"{tag}: unexpected items ({c1.items} in crawl 1, "
                         f"{c2.items} in crawl 2 for {len(changed)} changed pages)")
    return {"c1": c1, "c2": c2, "log2": log2,
            "rt1": roundtrips_of(work, f"{tag}-1"), "rt2": roundtrips_of(work, f"{tag}-2")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=100_000, help="pages filled (100000)")
    p.add_argument("--batch", type=int, default=5_000, help="stage_page calls per flush (5000)")
    p.add_argument("--lookups", type=int, default=100_000, help="random batched lookups (100000)")
    p.add_argument("--lookup-batch", type=int, default=1_000, help="keys per get_pages (1000)")
    p.add_argument("--crawl-pages", type=int, default=200, help="pages of the crawled site (200)")
    p.add_argument("--page-size", type=int, default=30_000, help="HTML bytes per page (30000)")
    p.add_argument("--repeat", type=int, default=3, help="crawl rounds per store (3)")
    p.add_argument("--seed", type=int, default=7, help="seed of the lookups (7)")
    p.add_argument("--max-fill-seconds", type=float, default=300, help="fill time limit (300)")
    p.add_argument("--timeout", type=float, default=300, help="max seconds per crawl (300)")
    args = p.parse_args(argv)
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not on PATH")

    with tempfile.TemporaryDirectory(prefix="bench-redis-store-") as tmp:
        work = Path(tmp)
        server = RedisServer(work)
        try:
            figures = asyncio.run(store_figures(args, work, server))
            rounds: dict[str, list[dict]] = {"sqlite": [], "redis": []}
            for i in range(args.repeat):
                for which in (("sqlite", "redis") if i % 2 == 0 else ("redis", "sqlite")):
                    print(f"... round {i + 1}/{args.repeat}: crawls with {which}", file=sys.stderr)
                    if which == "sqlite":
                        uri = "sqlite:///" + str(work / f"crawl-{i}" / "state.db")
                    else:
                        uri = f"{server.uri}?prefix=crawl-{uuid.uuid4().hex[:8]}"
                    rounds[which].append(crawl_pair(uri, args, work, f"{which}-{i}"))
        finally:
            server.stop()

    s, r = figures["sqlite"], figures["redis"]
    n, m = args.pages, args.lookups
    print(f"redis_store: SQLiteStateStore (baseline) vs RedisStateStore (ours), "
          f"{n} pages, loopback redis-server")
    print_table(["store figure", "sqlite", "redis", "redis/sqlite"], [
        ["fill, pages/s", f"{n / s['fill_s']:,.0f}", f"{n / r['fill_s']:,.0f}",
         ratio(s["fill_s"], r["fill_s"]) + " speed"],
        ["fill, round-trips", "-", f"{r['fill_trips']}", ""],
        ["space", f"{mib(s['bytes'])} ({s['bytes'] / n:.0f} B/page)",
         f"{mib(r['bytes'])} ({r['bytes'] / n:.0f} B/page)", ratio(r["bytes"], s["bytes"])],
        [f"get_pages x{m // args.lookup_batch} of {args.lookup_batch}, lookups/s",
         f"{m / s['batched_s']:,.0f}", f"{m / r['batched_s']:,.0f}",
         ratio(s["batched_s"], r["batched_s"]) + " speed"],
        ["  round-trips", "-", f"{r['batched_trips']}", ""],
        [f"get_page x{r['singles']}, lookups/s", f"{s['singles'] / s['single_s']:,.0f}",
         f"{r['singles'] / r['single_s']:,.0f}", ratio(s["single_s"], r["single_s"]) + " speed"],
        ["  round-trips", "-", f"{r['single_trips']}", ""],
    ])
    print()
    pages = args.crawl_pages
    print(f"Crawls of a {pages}-page site ({args.page_size} B pages, kinds {KINDS}; crawl 2 "
          f"after 5% changed, every page conditional), {args.repeat} rounds each; "
          "CPU = user+sys of the crawl process")
    rows = []
    med: dict[tuple[str, str], float] = {}
    for which in ("sqlite", "redis"):
        for c in ("c1", "c2"):
            usages = [x[c].usage for x in rounds[which]]
            med[which, c] = median([u.cpu for u in usages])
            trips = [x["rt" + c[1]] for x in rounds[which]]
            rows.append([
                f"{which}, crawl {c[1]}", " ".join(f"{u.cpu:.2f}" for u in usages),
                f"{med[which, c]:.2f}", f"{median([u.wall for u in usages]):.2f}",
                f"{median(trips) / pages:.2f}", rounds[which][0][c].items,
            ])
    for c in ("c1", "c2"):
        walls = {w: median([x[c].usage.wall for x in rounds[w]]) for w in ("sqlite", "redis")}
        rows.append([f"redis/sqlite, crawl {c[1]}", "", ratio(med["redis", c], med["sqlite", c]),
                     ratio(walls["redis"], walls["sqlite"]), "", ""])
    print_table(["crawl", "CPU s per round", "median CPU s", "median wall s",
                 "round-trips/page", "items"], rows)
    print(f"crawl 2 server side (round 1): sqlite {rounds['sqlite'][0]['log2'].not_modified} 304s, "
          f"redis {rounds['redis'][0]['log2'].not_modified} 304s")
    for c in ("c1", "c2"):
        x = med["redis", c] / med["sqlite", c]
        print(f"crawl {c[1]}: median CPU redis/sqlite = {x:.3f}x (target <= 1.25x: "
              f"{verdict(x <= 1.25)}); Redis round-trips per page "
              f"{median([y['rt' + c[1]] for y in rounds['redis']]) / pages:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
