"""Where a Redis Cluster's server CPU goes per page written, command by command.

    python bench/cluster_commands.py --ref COMMIT [--ref COMMIT ...] [--no-tree]
        [--pages 20000] [--hosts 1000] [--pairs 3]

Fills one scope of ``--pages`` pages (``capacity.page_state``, the crawl
shape, a flush every 500 writes: about one page a host a flush at 1,000
hosts) on a fresh 3-primary loopback cluster (tests/redis_cluster_util.py),
with this tree's code (unless ``--no-tree``) and with each ``--ref``'s (a
git worktree each), alternately, ``--pairs`` times (the machine may be
loaded by others: each round's ratios to the first code are given, and
their median). Per run: each primary's main-thread
CPU per page written (``INFO cpu``, as bench/capacity.py's cluster cell)
and ``INFO commandstats`` summed over the primaries (reset before the fill):
calls a page and microseconds a page (``usec``) per command. The scripts'
own commands are counted under their names (``EVALSHA`` is the script's
whole time, its commands included).
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

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


def child(args: argparse.Namespace) -> int:
    """One fill with the code of ``--code``; prints one JSON object."""
    sys.path[:0] = [args.code]
    sys.path += [str(BENCH), str(REPO)]
    import asyncio

    import capacity as cap
    from _crawl_start import primaries, server_cpu

    from incremental_crawler.state.stores.redis import RedisStateStore

    shape = argparse.Namespace(hosts=args.hosts, long_share=0.02, shape="crawl")
    servers = primaries(args.redis_uri, cluster=True)

    async def fill() -> None:
        store = RedisStateStore(args.redis_uri, prefix="cap", history_limit=10)
        for i in range(args.pages):
            store.stage_page(cap.page_state(i, shape))
            if (i + 1) % cap.BATCH == 0:
                await store.flush()
        await store.flush()
        await store.close()

    for s in servers:
        s.config_resetstat()
    before = [server_cpu(s) for s in servers]
    asyncio.run(fill())
    cpu = [1e6 * (server_cpu(s) - b) / args.pages for s, b in zip(servers, before, strict=True)]
    commands: dict[str, list[float]] = {}
    for s in servers:
        for name, stat in s.info("commandstats").items():
            total = commands.setdefault(name.removeprefix("cmdstat_"), [0, 0])
            total[0] += stat["calls"]
            total[1] += stat["usec"]
    print(json.dumps({"cpu_us_per_node": cpu, "commands": commands}), flush=True)
    return 0


def run_once(code: Path, args: argparse.Namespace) -> dict[str, Any]:
    from tests.redis_cluster_util import LoopbackCluster

    cluster = LoopbackCluster(aof=True)
    cluster.start()
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--code", str(code), "--redis-uri",
             cluster.url, "--pages", str(args.pages), "--hosts", str(args.hosts)],
            check=True, capture_output=True, text=True, timeout=3600)
    finally:
        cluster.remove()
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", action="append", default=[],
                   help="a commit measured beside this tree (repeatable)")
    p.add_argument("--no-tree", action="store_true", help="the --ref commits only")
    p.add_argument("--pages", type=int, default=20_000)
    p.add_argument("--hosts", type=int, default=1_000)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--code", help=argparse.SUPPRESS)
    p.add_argument("--redis-uri", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(prefix="bench-cluster-commands-") as tmp:
        trees = {} if args.no_tree else {"this tree": REPO}
        added = []
        for n, ref in enumerate(args.ref):
            tree = Path(tmp) / f"ref-{n}"
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), ref],
                           cwd=REPO, check=True, capture_output=True, timeout=120)
            added.append(tree)
            trees[ref[:10]] = tree
        try:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
            for n in range(args.pairs):
                # Alternated, the reference first every other pair.
                order = list(trees) if n % 2 else list(reversed(trees))
                for name in order:
                    runs[name].append(run_once(trees[name], args))
                    cpu = runs[name][-1]["cpu_us_per_node"]
                    print(f"pair {n + 1}, {name}: {sum(cpu):.0f} us a page summed "
                          f"({' / '.join(f'{us:.0f}' for us in cpu)})", file=sys.stderr)
        finally:
            for tree in added:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)],
                               cwd=REPO, check=False, capture_output=True, timeout=120)
    report(runs, args)
    return 0


def report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    pages = args.pages
    for name, results in runs.items():
        sums = [sum(r["cpu_us_per_node"]) for r in results]
        busiest = [max(r["cpu_us_per_node"]) for r in results]
        print(f"{name}: server CPU a page written, summed over the primaries: "
              f"{' '.join(f'{s:.0f}' for s in sums)} us (median {statistics.median(sums):.0f}); "
              f"busiest primary median {statistics.median(busiest):.0f} us")
        last = results[-1]["commands"]
        total_calls = sum(c for c, _ in last.values())
        print(f"  last run: {total_calls / pages:.1f} commands a page; per command "
              "(calls a page, usec a page):")
        for command, (calls, usec) in sorted(last.items(), key=lambda kv: -kv[1][1]):
            if calls / pages >= 0.01:
                print(f"    {command:24} {calls / pages:7.2f} {usec / pages:8.1f}")
    (first, base), *others = runs.items()
    for name, results in others:
        ratios = [sum(x["cpu_us_per_node"]) / sum(y["cpu_us_per_node"])
                  for x, y in zip(results, base, strict=True)]
        print(f"{name} / {first}, CPU a page summed, round by round: "
              f"{' '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    raise SystemExit(main())
