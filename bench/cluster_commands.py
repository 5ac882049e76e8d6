"""Where a Redis Cluster's server CPU goes per page written, command by command.

    python bench/cluster_commands.py --ref COMMIT [--ref COMMIT ...] [--no-tree]
        [--pages 20000] [--hosts 1000] [--pairs 3] [--items N] [--single] [--phases]

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

``--items N`` stages N versions of an item (~600 B of JSON, delivery
marked by one crawl) before each page, as capacity.py's items fill (a
flush every 500 writes, items counted): the cluster's phase 1 has work.
``--single`` fills a throwaway ``redis-server`` (AOF everysec, the one
server's layout and flush script) the same way in each round, first: the
baseline every cluster figure is divided by. ``--phases`` adds, in each
round, a cluster fill whose CPU is read at each step of the flush: each
primary's main-thread CPU and ``INFO commandstats`` read before and after
each phase (``_phase_items``, ``_phase_hosts``, ``_phase_scopes``,
``_phase_settle``, the hold checks) and each pipeline inside it, every
pipeline split by what it runs (one script, or one plain command) and sent
one part at a time (the same server work, in more round trips), so that
the CPU of each part is told apart; what runs outside any pipeline is the
servers' own time meanwhile (cron, the cluster bus, the client staging).
Each reading's own cost (measured at idle first) is taken out of each
interval, and in the report ("net") each primary's idle CPU over the
step's wall time and what a reading cost beyond that (an interval a flush
holding one reading alone): the scripts' rows move by a few percent with
it, the small rows (bookkeeping, between pipelines) by a few µs a page,
their uncertainty. ``INFO commandstats``' usec is a command's wall time
(a descheduled server counts), so CPU figures come from ``INFO cpu``.
The unprobed cluster fill of the same round is the check: the probed
run's total should be within noise of it (its split pipelines cost some
more: more round trips).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from _harness import git_trees

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


def child(args: argparse.Namespace) -> int:
    """One fill with the code of ``--code``; prints one JSON object."""
    sys.path[:0] = [args.code]
    sys.path += [str(BENCH), str(REPO)]
    import asyncio
    import dataclasses

    import capacity as cap
    from _crawl_start import idle_cpu, key_families, measured, primaries

    from incremental_crawler.state.stores.redis import RedisStateStore

    shape = argparse.Namespace(hosts=args.hosts, long_share=0.02, shape="crawl")
    servers = primaries(args.redis_uri, cluster=not args.single)
    probe = Probe(servers) if args.phases else None

    async def fill() -> None:
        store = RedisStateStore(args.redis_uri, prefix="cap", history_limit=10)
        if probe is not None:
            probe.attach(store)
        writes = 0
        for i in range(args.pages):
            state = cap.page_state(i, shape)
            for version in range(1, args.items + 1):
                store.stage_item(dataclasses.replace(cap.item_record(state, version),
                                                     delivery="bench-crawl"))
                writes += 1
            store.stage_page(state)
            writes += 1
            if writes >= cap.BATCH:
                await store.flush()
                writes = 0
        await store.flush()
        await store.close()

    for s in servers:
        s.config_resetstat()
    if probe is not None:
        probe.calibrate()
        idle = probe.idle
    else:
        idle = idle_cpu(servers)
    _, out = measured(servers, args.pages, idle, lambda: asyncio.run(fill()))
    if probe is not None:
        out["probe"] = probe.result(args.pages)
    if args.families:
        out["families"] = key_families(servers)
    print(json.dumps(out), flush=True)
    return 0


#: The probe's step that holds one reading and nothing else, each flush.
READING = "reading alone"


class Probe:
    """Each primary's main-thread CPU and command counts, read at every step
    of a flush (``--phases``) and added up by step: an interval's readings
    go to the step that ran during it (the innermost one open)."""

    #: The flush's steps read: method name -> label.
    STEPS: ClassVar[dict[str, str]] = {"flush": "flush other", "_check_flush_hold": "hold check",
                                       "_phase_items": "p1 items",
                                       "_phase_hosts": "p2 hosts",
                                       "_phase_scopes": "p3 scopes", "_phase_settle": "settle"}

    def __init__(self, servers: list[Any]) -> None:
        self.servers = servers
        self.cost = [0.0] * len(servers)
        self.idle = [0.0] * len(servers)
        self.stack = ["outside flushes"]
        self.cpu: dict[str, list[float]] = {}
        self.commands: dict[str, dict[str, list[int]]] = {}
        self.intervals: dict[str, int] = {}
        self.wall: dict[str, float] = {}
        self.last: list[tuple[float, dict[str, Any]]] = []
        self.at = 0.0

    def read(self) -> list[tuple[float, dict[str, Any]]]:
        out = []
        for server in self.servers:
            info = server.info("cpu", "commandstats")
            cpu = (float(info["used_cpu_user_main_thread"])
                   + float(info["used_cpu_sys_main_thread"]))
            out.append((cpu, {k.removeprefix("cmdstat_"): v for k, v in info.items()
                              if k.startswith("cmdstat_")}))
        return out

    def calibrate(self) -> None:
        """A reading's own CPU on each node (taken out of each interval),
        and each node's CPU at idle (cron, cluster bus), per second."""
        import time

        # The median of 15 blocks of 10 readings: one block can take a
        # busy moment of the machine.
        blocks = []
        for _ in range(15):
            first = self.read()
            for _ in range(9):
                self.read()
            again = self.read()
            blocks.append([(b[0] - a[0]) / 10 for a, b in zip(first, again, strict=True)])
        self.cost = [statistics.median(block[node] for block in blocks)
                     for node in range(len(self.servers))]
        at = time.perf_counter()
        time.sleep(2.0)
        idle = self.read()
        seconds = time.perf_counter() - at
        self.idle = [(b[0] - a[0] - c) / seconds
                     for a, b, c in zip(again, idle, self.cost, strict=True)]
        self.last = self.read()
        self.at = time.perf_counter()

    def mark(self) -> None:
        import time

        now = self.read()
        label = self.stack[-1]
        at = time.perf_counter()
        self.wall[label] = self.wall.get(label, 0.0) + at - self.at
        self.at = at
        cpu = self.cpu.setdefault(label, [0.0] * len(now))
        commands = self.commands.setdefault(label, {})
        self.intervals[label] = self.intervals.get(label, 0) + 1
        for node, ((was, said), (cpu_now, says)) in enumerate(zip(self.last, now, strict=True)):
            cpu[node] += cpu_now - was - self.cost[node]
            for name, stat in says.items():
                old = said.get(name, {"calls": 0, "usec": 0})
                total = commands.setdefault(name, [0, 0])
                total[0] += stat["calls"] - old["calls"]
                total[1] += stat["usec"] - old["usec"]
        self.last = now

    def attach(self, store: Any) -> None:
        """Wraps the store's flush steps and pipelines (on the instance)."""
        import functools

        from incremental_crawler.state.stores.redis import scripts

        names = {getattr(scripts, n): n.removesuffix("_LUA").lower() for n in dir(scripts)
                 if n.endswith("_LUA") and isinstance(getattr(scripts, n), str)}
        probe = self

        def step(label: str, method: Any) -> Any:
            @functools.wraps(method)
            async def wrapped(*a: Any, **k: Any) -> Any:
                probe.mark()
                if label == "flush other":
                    # An interval with nothing sent: a reading's own cost
                    # as the fill's readings cost (commandstats as long,
                    # the machine as loaded), taken out in the report.
                    probe.stack.append(READING)
                    probe.mark()
                    probe.stack.pop()
                probe.stack.append(label)
                try:
                    return await method(*a, **k)
                finally:
                    probe.mark()
                    probe.stack.pop()
            return wrapped

        for name, label in self.STEPS.items():
            if hasattr(store, name):
                setattr(store, name, step(label, getattr(store, name)))
        eval_many = store._eval_many

        def kind(command: tuple[Any, ...], script: bool) -> str:
            if script:
                return names.get(command[0], "script?")
            if str(command[0]).upper() == "EVAL":
                return names.get(command[1], "eval?")
            return str(command[0]).upper()

        async def split(calls: list[Any], plain: Any = ()) -> list[Any]:
            # One pipeline per kind (a script, or a plain command), each
            # read apart; replies put back in their order.
            parts: dict[str, tuple[list[int], list[int]]] = {}
            for n, call in enumerate(calls):
                parts.setdefault(kind(call, True), ([], []))[0].append(n)
            for n, command in enumerate(plain):
                parts.setdefault(kind(command, False), ([], []))[1].append(n)
            replies: list[Any] = [None] * (len(calls) + len(plain))
            phase = probe.stack[-1]
            for what, (mine, theirs) in parts.items():
                probe.mark()
                probe.stack.append(f"{phase} | {what}")
                try:
                    got = await eval_many([calls[n] for n in mine], [plain[n] for n in theirs])
                finally:
                    probe.mark()
                    probe.stack.pop()
                for n, reply in zip([*mine, *(len(calls) + n for n in theirs)], got,
                                    strict=True):
                    replies[n] = reply
            return replies

        store._eval_many = split

    def result(self, pages: int) -> dict[str, Any]:
        self.mark()
        return {"cost_us": [1e6 * c for c in self.cost],
                "idle_us_per_s": [1e6 * c for c in self.idle],
                "labels": {label: {"cpu_us": [1e6 * c / pages for c in cpu],
                                   "wall_s": self.wall[label],
                                   "intervals": self.intervals[label],
                                   "commands": self.commands[label]}
                           for label, cpu in self.cpu.items()}}


def run_once(code: Path, args: argparse.Namespace, *, phases: bool = False,
             single: bool = False) -> dict[str, Any]:
    from tests.redis_cluster_util import LoopbackCluster

    command = [sys.executable, __file__, "--child", "--code", str(code), "--pages",
               str(args.pages), "--hosts", str(args.hosts), "--items", str(args.items),
               *(["--families"] if getattr(args, "families", False) else [])]
    if single:
        sys.path.insert(0, str(BENCH))
        from capacity import PrivateRedis

        with tempfile.TemporaryDirectory(prefix="bench-cluster-commands-single-") as tmp:
            server = PrivateRedis(Path(tmp))
            try:
                out = subprocess.run([*command, "--redis-uri", server.uri, "--single"],
                                     check=True, capture_output=True, text=True, timeout=3600)
            finally:
                server.stop()
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    cluster = LoopbackCluster(aof=True)
    cluster.start()
    try:
        out = subprocess.run(
            [*command, "--redis-uri", cluster.url, *(["--phases"] if phases else [])],
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
    p.add_argument("--items", type=int, default=0,
                   help="versions of an item staged before each page (0)")
    p.add_argument("--single", action="store_true",
                   help="one redis-server filled the same way each round (the baseline)")
    p.add_argument("--phases", action="store_true",
                   help="each round, a cluster fill with this tree's code (or the first "
                        "--ref's) read step by step of its flushes")
    p.add_argument("--call-floor", action="store_true",
                   help="only the server CPU a script call costs before its work (nothing "
                        "else run): see call_floor")
    p.add_argument("--json", help="write every run's figures to this file")
    p.add_argument("--report", help="report the runs a --json file holds (nothing run)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--code", help=argparse.SUPPRESS)
    p.add_argument("--redis-uri", help=argparse.SUPPRESS)
    p.add_argument("--families", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    if args.call_floor:
        return call_floor(args)
    if args.report:
        saved = json.loads(Path(args.report).read_text(encoding="utf-8"))
        for name in ("pages", "hosts", "items"):
            setattr(args, name, saved["args"][name])
        return show(saved["runs"], saved["single"], saved["probed"], args)
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(prefix="bench-cluster-commands-") as tmp:
        trees = {} if args.no_tree else {"this tree": REPO}
        with git_trees(args.ref, Path(tmp)) as added:
            trees.update((ref[:10], tree) for ref, tree in zip(args.ref, added, strict=True))
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
            single: list[dict[str, Any]] = []
            probed: list[dict[str, Any]] = []
            for n in range(args.pairs):
                if args.single:
                    single.append(run_once(REPO, args, single=True))
                    print(f"pair {n + 1}, one server: "
                          f"{single[-1]['cpu_us_per_node'][0]:.0f} us a page", file=sys.stderr)
                if args.phases:
                    probed.append(run_once(next(iter(trees.values())), args, phases=True))
                    print(f"pair {n + 1}, probed: "
                          f"{sum(probed[-1]['cpu_us_per_node']):.0f} us a page summed",
                          file=sys.stderr)
                # Alternated, the reference first every other pair.
                order = list(trees) if n % 2 else list(reversed(trees))
                for name in order:
                    runs[name].append(run_once(trees[name], args))
                    cpu = runs[name][-1]["cpu_us_per_node"]
                    print(f"pair {n + 1}, {name}: {sum(cpu):.0f} us a page summed "
                          f"({' / '.join(f'{us:.0f}' for us in cpu)})", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": {"pages": args.pages, "hosts": args.hosts, "items": args.items},
            "runs": runs, "single": single, "probed": probed}), encoding="utf-8")
    return show(runs, single, probed, args)


def show(runs: dict[str, list[dict[str, Any]]], single: list[dict[str, Any]],
         probed: list[dict[str, Any]], args: argparse.Namespace) -> int:
    print(f"{args.pages:,} pages on {args.hosts:,} hosts, {args.items} item versions a page")
    report(runs, args)
    if single:
        report_single(single, runs, args)
    if probed:
        report_phases(probed, single, args)
    return 0


def call_floor(args: argparse.Namespace) -> int:
    """What a script call costs the server before any work of its own, on a
    throwaway redis-server (AOF everysec): ``EVALSHA`` of ``return 1``, of
    each flush script's libraries then ``return 1`` (their definitions run
    at every call), and of each flush script whose token is there (a
    replay: the libraries, a ``GET`` and the kept reply returned: what a
    call costs that writes nothing); and, beside ``SET`` of one key sent
    plain, a script that only sets it, and the least a writing call of the
    cluster's does (libraries, its token read, ``TIME``, its token written
    with a JSON reply: each write script is propagated to the append-only
    file in a ``MULTI``/``EXEC`` of its own). 2,000 calls a pipeline of 500, median
    of ``--pairs`` rounds; main-thread CPU a call."""
    sys.path[:0] = [str(BENCH), str(REPO)]
    from capacity import PrivateRedis

    from incremental_crawler.state.stores.packed import LUA_CODEC
    from incremental_crawler.state.stores.redis import pages, scripts

    host_libs = pages.LUA_WRITES + LUA_CODEC + pages.LUA_BUCKETS
    cases = {
        "SET of one key, a plain command (no script)": ("", ""),
        "return 1": ("return 1", ""),
        "one SET, then return 1": ("redis.call('SET', KEYS[2], '1')\nreturn 1", ""),
        "host libraries, token GET, TIME, token SET EX: the least a writing call does": (
            host_libs + "\nlocal kept = redis.call('GET', KEYS[1])\n"
            "local now = redis.call('TIME')\nredis.call('SET', KEYS[1], "
            "cjson.encode({1, '', '{}'}), 'EX', 86400)\nreturn 1", ""),
        "libraries of the host and flush scripts, return 1": (host_libs + "\nreturn 1", ""),
        "libraries of the scope script, return 1": (
            pages.LUA_WRITES + pages.LUA_SUMS + "\nreturn 1", ""),
        "cluster_items.lua replayed": (scripts.CLUSTER_ITEMS_LUA, "[0,\"\",\"\"]"),
        "cluster_host.lua replayed": (scripts.CLUSTER_HOST_LUA, "[0,\"\",\"\"]"),
        "cluster_scope.lua replayed": (scripts.CLUSTER_SCOPE_LUA, "[0,\"\",\"\"]"),
        "flush.lua (one server) replayed": (scripts._FLUSH_LUA, "0"),
    }
    calls = 2_000
    with tempfile.TemporaryDirectory(prefix="bench-call-floor-") as tmp:
        server = PrivateRedis(Path(tmp))
        try:
            client = server.client
            found: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(args.pairs):
                for name, (text, kept) in cases.items():
                    sha = client.script_load(text) if text else ""
                    client.delete("{t}token")
                    if kept:
                        client.set("{t}token", kept)
                    before = server.cpu()
                    for _ in range(calls // 500):
                        pipe = client.pipeline(transaction=False)
                        for _ in range(500):
                            if sha:
                                pipe.evalsha(sha, 3, "{t}token", "{t}a", "{t}b")
                            else:
                                pipe.set("{t}a", "1")
                        pipe.execute()
                    found[name].append(1e6 * (server.cpu() - before) / calls)
        finally:
            server.stop()
    print(f"server CPU a script call (us, main thread), {calls:,} calls a round, "
          f"{args.pairs} rounds: median (rounds)")
    for name, values in found.items():
        print(f"  {name:80} {statistics.median(values):6.1f} "
              f"({' '.join(f'{v:.1f}' for v in values)})")
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


def report_single(single: list[dict[str, Any]], runs: dict[str, list[dict[str, Any]]],
                  args: argparse.Namespace) -> None:
    pages = args.pages
    alone = [r["cpu_us_per_node"][0] for r in single]
    print(f"one server: server CPU a page written {' '.join(f'{s:.0f}' for s in alone)} us "
          f"(median {statistics.median(alone):.0f})")
    last = single[-1]["commands"]
    print(f"  last run: {sum(c for c, _ in last.values()) / pages:.1f} commands a page; per "
          "command (calls a page, usec a page):")
    for command, (calls, usec) in sorted(last.items(), key=lambda kv: -kv[1][1]):
        if calls / pages >= 0.01 or usec / pages >= 0.1:
            print(f"    {command:24} {calls / pages:7.2f} {usec / pages:8.1f}")
    print(f"  idle CPU over the fill (cron) a page: one server "
          f"{statistics.median(r['idle_us_per_page'][0] for r in single):.1f} us; "
          + "; ".join(f"{name} {statistics.median(sum(r['idle_us_per_page']) for r in rs):.1f}"
                      " us summed" for name, rs in runs.items()))
    for name, results in runs.items():
        summed = [sum(r["cpu_us_per_node"]) / a for r, a in zip(results, alone, strict=True)]
        busiest = [a / max(r["cpu_us_per_node"]) for r, a in zip(results, alone, strict=True)]
        print(f"{name} / one server, round by round: CPU a page summed "
              f"{' '.join(f'{x:.2f}' for x in summed)} (median {statistics.median(summed):.2f}); "
              f"write rate bound by the busiest primary "
              f"{' '.join(f'{x:.2f}' for x in busiest)}x one server's "
              f"(median {statistics.median(busiest):.2f}x)")


def _category(label: str) -> str:
    """The part of the flush a probed step is counted in."""
    for script, name in (("cluster_items", "phase 1: item-group scripts"),
                         ("cluster_host", "phase 2: host-group scripts"),
                         ("cluster_scope", "phase 3: scope scripts (layout 7: a shard each)"),
                         ("cluster_settle", "settle scripts")):
        if label.endswith(f"| {script}"):
            return name
    if "|" in label:
        return "bookkeeping commands (tokens, counts, index, scopes; layout 7: ledgers, intents)"
    if label == READING:
        return READING
    return "between pipelines (client working; cron)"


def report_phases(probed: list[dict[str, Any]], single: list[dict[str, Any]],
                  args: argparse.Namespace) -> None:
    """Each step's server CPU a page (summed over the primaries, and on the
    busiest one for that step), median over the rounds, beside one server's
    whole write when measured; 'net' takes each node's idle CPU (cron, the
    cluster bus) over the step's wall time out."""
    pages = args.pages
    alone = statistics.median(r["cpu_us_per_node"][0] for r in single) if single else None
    alone_net = (statistics.median(r["cpu_us_per_node"][0] - r["idle_us_per_page"][0]
                                   for r in single) if single else None)
    first = probed[0]["probe"]
    totals = [sum(r["cpu_us_per_node"]) for r in probed]
    print(f"probed cluster fills: a reading costs "
          f"{' / '.join(f'{c:.0f}' for c in first['cost_us'])} us on each primary (taken "
          f"out); idle CPU {' / '.join(f'{c:.0f}' for c in first['idle_us_per_s'])} us/s; "
          f"totals {' '.join(f'{total:.0f}' for total in totals)} us a page summed "
          "(readings included)")
    if single:
        print(f"one server: {alone:.1f} us a page, {alone_net:.1f} net of its idle CPU "
              f"({statistics.median(r['idle_us_per_page'][0] for r in single):.1f}), median")

    def per_node(run: dict[str, Any], labels: list[str], net: bool) -> list[float]:
        probe = run["probe"]
        out = [0.0] * len(run["cpu_us_per_node"])
        empty = probe["labels"].get(READING)
        for label in labels:
            x = probe["labels"].get(label)
            if not x:
                continue
            for node, us in enumerate(x["cpu_us"]):
                idle = probe["idle_us_per_s"][node] * x["wall_s"] / pages if net else 0.0
                if net and empty:
                    # What a reading cost beyond its calibration, a reading
                    # (each interval holds one).
                    idle += empty["cpu_us"][node] / empty["intervals"] * x["intervals"]
                out[node] += us - idle
        return out

    def row(name: str, labels_of: Any) -> None:
        cells = []
        for net in (False, True):
            nodes = [per_node(r, labels_of(r), net) for r in probed]
            summed = statistics.median(sum(n) for n in nodes)
            busiest = statistics.median(max(n) for n in nodes)
            cells.append((summed, busiest))
        (raw, raw_busy), (net_sum, net_busy) = cells
        vs = f"{net_sum / alone_net:6.3f}" if alone_net else ""
        print(f"{name:72} {raw:7.1f} {raw_busy:7.1f} {net_sum:7.1f} {net_busy:7.1f} {vs:>6}")

    print(f"{'step (| pipeline part)':72} {'summed':>7} {'busiest':>7} {'net sum':>7} "
          f"{'net bus':>7} {'/1 net':>6}")
    labels: list[str] = []
    for r in probed:
        labels += [label for label in r["probe"]["labels"] if label not in labels]
    for label in sorted(labels):
        row(label, lambda r, label=label: [label])
    print("by part:")
    for category in sorted({_category(label) for label in labels}):
        row(category, lambda r, c=category: [x for x in r["probe"]["labels"]
                                             if _category(x) == c])
    row("all steps", lambda r: [x for x in r["probe"]["labels"] if x != READING])
    print("  (us a page, medians of the rounds; busiest: the primary with the most of that "
          "step; net: less each primary's idle CPU a second times the step's wall time, and a "
          "reading's cost beyond its calibration (the 'reading alone' steps') times the "
          "step's readings; "
          "/1 net: net sum over one server's net CPU a page)")
    print("  scripts, last round (INFO commandstats summed over the primaries): calls a page, "
          "usec a call, usec a page; the commands they ran a call")
    last = probed[-1]["probe"]["labels"]
    for label in sorted(labels):
        x = last.get(label)
        if not x or "|" not in label:
            continue
        commands = x["commands"]
        for kind in ("evalsha", "eval"):
            calls, usec = commands.get(kind, [0, 0])
            if calls:
                inner = sum(c for n, (c, _) in commands.items()
                            if n not in ("info", "evalsha", "eval"))
                print(f"    {label:60} {kind:7} {calls / pages:6.3f} {usec / calls:7.1f} "
                      f"{usec / pages:6.1f}  {inner / calls:6.1f} commands a call")
    for label in sorted(labels):
        x = last.get(label)
        if not x:
            continue
        top = sorted(((n, c, u) for n, (c, u) in x["commands"].items()
                      if n != "info" and c > 0), key=lambda t: -t[2])[:8]
        if top:
            print(f"    {label:60} " + ", ".join(f"{n} {c / pages:.2f}x {u / pages:.1f}"
                                                  for n, c, u in top))

if __name__ == "__main__":
    raise SystemExit(main())
