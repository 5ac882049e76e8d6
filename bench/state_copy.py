"""What ``scrapy state copy`` costs: a scope moved from one Redis server to a Redis Cluster.

What it measures
    A throwaway ``redis-server`` (bench/capacity.py's: a free loopback port,
    AOF every second) is filled through the store's own staging API with
    ``--pages`` (100,000) pages as a sitemap crawl stores them with revisits
    on (bench/capacity.py's ``crawl`` shape, 10 hosts), each with one item
    (~600 bytes of JSON) in ``--versions`` (1) versions. Then the scope is
    copied (:func:`incremental_crawler.state.scope_copy.copy_scope`, what
    the command runs) onto a Redis Cluster of three primaries on loopback
    (tests/redis_cluster_util.py's, each with its append-only file), and
    timed by phase: host records and crawl records, pages with their links
    records, items with their versions, the verification (every kind
    counted on both sides). Printed: seconds and records per second of each
    phase, and of the whole copy.

    No target: a measurement for docs/capacity.md. Everything is on
    127.0.0.1; the server and the cluster are stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capacity import SCOPE, PrivateRedis, item_record, page_state

from incremental_crawler.state.scope_copy import copy_scope
from incremental_crawler.state.stores.redis import RedisStateStore
from tests.redis_cluster_util import LoopbackCluster

BATCH = 500


async def fill(store: RedisStateStore, args: argparse.Namespace) -> None:
    writes = 0
    for i in range(args.pages):
        state = page_state(i, args)
        for version in range(1, args.versions + 1):
            store.stage_item(item_record(state, version))
        store.stage_page(state)
        writes += 1 + args.versions
        if writes >= BATCH:
            await store.flush()
            writes = 0
    await store.flush()


async def measure(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-state-copy-"))
    server = PrivateRedis(work)
    cluster = LoopbackCluster(aof=True)
    try:
        cluster.start()
        source = RedisStateStore(server.uri, prefix="src", history_limit=10)
        started = time.perf_counter()
        await fill(source, args)
        print(f"source filled: {args.pages:,} pages, {args.versions} item version(s) each, "
              f"in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        destination = RedisStateStore(cluster.url, prefix="dst", history_limit=10)
        marks: list[tuple[str, float]] = []
        started = time.perf_counter()
        copied = await copy_scope(source, destination, SCOPE, f"{cluster.url}?prefix=dst",
                                  say=lambda line: marks.append((line, time.perf_counter())))
        total = time.perf_counter() - started
        await source.close()
        await destination.close()
        print(f"copied: {copied.describe()}")
        at = started
        for line, when in marks:
            print(f"  {when - at:8.2f} s  {line}")
            at = when
        print(f"  {started + total - at:8.2f} s  verified (counts of every kind, both sides)")
        print(f"whole copy: {total:.1f} s, {args.pages / total:,.0f} pages/s "
              f"(with their items)")
    finally:
        cluster.remove()
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pages", type=int, default=100_000)
    parser.add_argument("--versions", type=int, default=1)
    args = parser.parse_args()
    # bench/capacity.py's page shape.
    args.hosts, args.long_share, args.shape = 10, 0.02, "crawl"
    asyncio.run(measure(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
