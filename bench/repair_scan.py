"""What a page or host repair costs on a Redis Cluster, by the scope's items.

    python bench/repair_scan.py --ref COMMIT [--items 0,1000,20000] [--reps 5]

A repair (``forget_page``, ``forget_host``, and ``url_record``, which
``scrapy state`` prints) finds the items of its pages by their records: a
walk over every item group's hash (1,024 on a cluster). Per size in
``--items``, one scope is filled once on a fresh 3-primary loopback cluster
(tests/redis_cluster_util.py): that many items, each keyed by its page's
URL, on pages of 100 hosts, plus one page and item on each of
``2 * --reps * codes`` hosts of their own. Then this tree's code and each
``--ref``'s (a git worktree each) run, alternately, ``--reps`` times each:
``forget_page`` of a page of its own (its item deleted) and
``forget_host`` of a host of its own (one page, one item), each in a child
process with that code. Per call: the round trips the store counts (the
cluster client's pipeline one, whatever nodes it reaches; the item groups'
walk, since it sends each primary its part itself, one a primary) and its
wall time; medians per code, and the ratio of this tree's to the first
``--ref``'s. The scope changes by two items a call, nothing the walk would
notice. A run killed midway leaves its ``--ref`` worktrees registered:
``git worktree prune`` forgets them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _harness import git_trees

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SCOPE = "bench"
PREFIX = "repair"
HOSTS = 100


def own_host(n: int) -> str:
    """The n-th host of one page (and one item) of its own."""
    return f"solo{n}.example"


def fill(uri: str, items: int, own: int) -> None:
    """*items* items on pages of HOSTS hosts, and *own* hosts of one page
    and one item each (this tree's code: the layout every code reads)."""
    import asyncio

    sys.path.insert(0, str(REPO))
    from incremental_crawler.state.records import ItemRecord, PageKey, PageState
    from incremental_crawler.state.stores.redis import RedisStateStore

    def page(url: str) -> PageState:
        return PageState(PageKey(SCOPE, url), etag='"e"', fingerprint="f" * 16, size=1000,
                         last_status=200, first_seen=1_000_000, last_checked=1_000_000,
                         last_fetched=1_000_000, last_changed=1_000_000, checks=1,
                         interval=86_400, next_visit=1_086_400, callback="parse")

    def item(url: str) -> ItemRecord:
        return ItemRecord(SCOPE, url, url, f"{hash(url) & (2**64 - 1):016x}",
                          data=json.dumps({"url": url, "title": "x" * 80}),
                          stored_at=1_000_000)

    urls = [f"https://h{n % HOSTS}.example/p{n}" for n in range(items)]
    urls += [f"https://{own_host(n)}/" for n in range(own)]

    async def run() -> None:
        store = RedisStateStore(uri, prefix=PREFIX)
        for n, url in enumerate(urls, 1):
            store.stage_item(item(url))
            store.stage_page(page(url))
            if n % 250 == 0:
                await store.flush()
        await store.flush()
        await store.close()

    asyncio.run(run())


def child(args: argparse.Namespace) -> int:
    """The repairs of one code (``--code``) on hosts ``--first``..; prints
    one JSON object: per repair, [round trips, seconds] a call."""
    sys.path[:0] = [args.code]
    import time

    from incremental_crawler.state.stores.redis import RedisStateStore

    store = RedisStateStore(args.redis_uri, prefix=PREFIX)
    out: dict[str, list[list[float]]] = {"forget_page": [], "forget_host": [],
                                         "url_record": []}
    for n in range(args.first, args.first + args.reps):
        page, host = f"https://{own_host(2 * n)}/", own_host(2 * n + 1)
        for name, call, arg in (("url_record", store.url_record, page),
                                ("forget_page", store.forget_page, page),
                                ("forget_host", store.forget_host, host)):
            trips, started = store.roundtrips, time.perf_counter()
            result: Any = call(SCOPE, arg)
            out[name].append([store.roundtrips - trips, time.perf_counter() - started])
            if name != "url_record":
                # Each finds the one item of its page (the walk works).
                assert result.items == 1, (name, result)
            else:
                assert len(result.items) == 1, result
    store._sync.close()
    print(json.dumps(out), flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", action="append", default=[],
                   help="a commit measured beside this tree (repeatable)")
    p.add_argument("--items", default="0,1000,20000",
                   help="scope sizes, comma-separated (items)")
    p.add_argument("--reps", type=int, default=5, help="calls of each repair a code, a size")
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--code", help=argparse.SUPPRESS)
    p.add_argument("--redis-uri", help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    sys.path.insert(0, str(REPO))
    from tests.redis_cluster_util import LoopbackCluster

    figures: dict[str, dict[str, dict[str, list[list[float]]]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-repair-scan-") as tmp:
        trees = {"this tree": REPO}
        with git_trees(args.ref, Path(tmp)) as added:
            trees.update((ref[:10], tree) for ref, tree in zip(args.ref, added, strict=True))
            for size in (int(s) for s in args.items.split(",")):
                cluster = LoopbackCluster()
                cluster.start()
                try:
                    fill(cluster.url, size, 2 * args.reps * len(trees))
                    runs: dict[str, dict[str, list[list[float]]]] = {
                        name: {} for name in trees}
                    # One call of each repair a code at a time, alternated
                    # (the machine may be loaded by others).
                    for rep in range(args.reps):
                        order = list(trees) if rep % 2 else list(reversed(trees))
                        for at, name in enumerate(order):
                            slot = rep * len(trees) + at
                            out = subprocess.run(
                                [sys.executable, __file__, "--child", "--code",
                                 str(trees[name]), "--redis-uri", cluster.url,
                                 "--first", str(slot), "--reps", "1"],
                                check=True, capture_output=True, text=True, timeout=3600)
                            got = json.loads(out.stdout.strip().splitlines()[-1])
                            for repair, calls in got.items():
                                runs[name].setdefault(repair, []).extend(calls)
                finally:
                    cluster.remove()
                figures[str(size)] = runs
                show(size, runs)
    if args.json:
        Path(args.json).write_text(json.dumps(figures), encoding="utf-8")
    return 0


def show(size: int, runs: dict[str, dict[str, list[list[float]]]]) -> None:
    names = list(runs)
    print(f"\n{size:,} items: medians of round trips / ms a call")
    for repair in ("url_record", "forget_page", "forget_host"):
        cells: list[str] = []
        medians: list[tuple[float, float]] = []
        for name in names:
            calls = runs[name][repair]
            trips = statistics.median(c[0] for c in calls)
            ms = 1000 * statistics.median(c[1] for c in calls)
            medians.append((trips, ms))
            cells.append(f"{name}: {trips:.0f} / {ms:.1f}")
        ratio: Any = ""
        if len(medians) > 1 and medians[1][1]:
            ratio = (f"  (ratio {medians[0][0] / max(medians[1][0], 1):.3f} trips, "
                     f"{medians[0][1] / medians[1][1]:.3f} time)")
        print(f"  {repair:12} " + "   ".join(cells) + ratio)


if __name__ == "__main__":
    raise SystemExit(main())
