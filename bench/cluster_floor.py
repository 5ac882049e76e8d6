"""The floor of a cluster page write: one server's per-page work, split as
any layout keyed by host group must split it, measured beside one server
and the cluster layout (7) in the same run.

    python bench/cluster_floor.py [--pages 20000] [--hosts 1000 10] [--rounds 3]
        [--large] [--names] [--groups 64 [N ...]]
        [--only split floor "layout 7" names] [--json FILE]
    python bench/cluster_floor.py --report FILE [FILE ...]

Each round, for each ``--hosts``, four fills of the same ``--pages`` pages
(``capacity.page_state``, the crawl shape, a flush every 500 writes), each
in a process of its own on servers of its own (AOF everysec):

- **one server**: a ``redis-server`` in layout 4, one ``flush.lua`` call a
  flush (``bench/cluster_commands.py``'s ``--single`` fill);
- **floor**: a fresh three-primary loopback cluster written by the one
  server's code path, each flush split into one ``flush.lua`` call a host
  group (:data:`HOST_GROUPS`, a page's group chosen as the cluster layout
  chooses it), every key of a call in its group's slot. One one-server
  store a group, its prefix carrying the group's hash tag
  (``cap{<s>|<g>}``, the tag of the group's keys in layout 7: a key's tag
  is its first ``{...}``, so every key the store names, its hosts' own
  ``{<s>|<h>}`` ones too, falls in that slot); the stores stage and flush
  as on one server, their ``flush.lua`` calls of a flush sent together in
  one cluster pipeline (one batch a primary, as the cluster layout sends a
  phase's scripts). With ``--groups N``, N of the 64 groups (every
  64/N-th of :data:`HOST_GROUPS`, whose tags' slots fall one in each 64th
  of the slot space, so the N spread as evenly as N can over the
  primaries), a page's host in the group of its own group's index modulo
  N: fewer, larger calls and fewer split sums, a coarser spread over the
  primaries. Several N are each a fill of their own in every round
  (``floor/<N>``, ``split/<N>``). The stores are opened on a throwaway one server (a
  node of a cluster would give them the cluster's layout), which sees
  nothing of the fill. After the fill every key on every primary is
  checked to be in its group's slot (``CLUSTER KEYSLOT``), the groups
  each primary holds counted and the pages counted back;
- **split**: the floor's calls, the same way, sent to one ``redis-server``
  (no cluster): what the split costs apart from what a cluster node costs
  more;
- **layout 7**: the same cluster, fresh, written by the store as it is
  (``bench/cluster_commands.py``'s cluster fill);
- with ``--names``, **names**: one server written with the floor's key
  names (every page in the first group's store), one call a flush: what
  the longer names alone cost. ``--no-callback`` gives the pages of these
  (floor, split, names) no callback: no sums by next visit, no revisit
  index (compare split with names then: one server's and layout 7's
  pages keep theirs).

The fills' order turns from round to round. ``--report`` prints saved
runs (``--json``) with their rounds pooled.

Server CPU a page is each server's main-thread CPU (``INFO cpu``) over the
fill less its idle CPU (cron, the cluster bus; measured for 2 s before the
fill) over the fill's wall time; summed over the primaries and the busiest
one's. Ratios are to one server's, round by round, and their median. Also
the floor's ``flush.lua`` calls a page and commands a page (``INFO
commandstats`` summed over the primaries; ``INFO`` and ``CONFIG`` left out).

Bytes a page is what bench/capacity.py counts: ``used_memory`` (less the
AOF buffer) after the fill less before it, summed over the fill's servers,
over pages; keys a page, ``DBSIZE`` summed; both beside one server's, with
the ratio. Then, for the last round, the bytes (``MEMORY USAGE ... SAMPLES
0`` of every key) and keys a page by kind of key (``pg``, ``nvf``, ...):
what the split multiplies. ``used_memory`` also holds what no key does
(the scripts' cache, a fixed part a server), which weighs less at more
pages: ``--large`` is capacity.py's 100,000 pages in one round (memory
does not move between rounds as CPU does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent

#: The floor's calls sent to one ``redis-server`` (no cluster): what the
#: split alone costs, apart from what a cluster node costs more.
SPLIT = "split"
#: One server written with the floor's key names, one call a flush.
NAMES = "names"
#: The fills of a round, in the first round's order.
ORDER = ["one server", SPLIT, "floor", "layout 7"]
#: The floor's split when ``--groups`` does not say: every host group.
ALL_GROUPS = 64
#: Commands the bench itself sends around a fill (not the fill's).
OWN_COMMANDS = ("info", "config|resetstat", "config", "script|load", "script", "ping")


def floor_child(args: argparse.Namespace) -> int:
    """One floor fill on the cluster ``--redis-uri``, stores opened on the
    one server ``--open-uri``; prints one JSON object."""
    sys.path[:0] = [str(BENCH), str(REPO)]
    import asyncio
    import dataclasses

    import capacity as cap
    import redis.asyncio
    from _crawl_start import idle_cpu, key_families, measured, primaries
    from redis.asyncio.cluster import RedisCluster as AsyncCluster

    from incremental_crawler.state.stores.redis import RedisStateStore, scripts
    from incremental_crawler.state.stores.redis.core import (
        _GROUP_INDEX,
        HOST_GROUPS,
        _key_part,
        host_group,
    )
    from incremental_crawler.state.stores.redis.pages import host_part, page_field

    shape = argparse.Namespace(hosts=args.hosts, long_share=0.02, shape="crawl")
    servers = primaries(args.redis_uri, cluster=not args.plain)
    flush_lua = scripts._FLUSH_LUA

    def tag(group: str) -> str:
        return f"{_key_part(cap.SCOPE)}|{group}"

    class Calls:
        """The ``flush.lua`` calls of one flush of every group's store, sent
        to the cluster in one pipeline once each store with writes has made
        its call; each store gets its own reply back."""

        def __init__(self, cluster: Any) -> None:
            self.cluster = cluster
            self.expected = 0
            self.waiting: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
            self.pipelines = 0

        async def call(self, command: tuple[Any, ...]) -> Any:
            done = asyncio.get_running_loop().create_future()
            self.waiting.append((command, done))
            if len(self.waiting) == self.expected:
                await self.send()
            return await done

        async def send(self) -> None:
            waiting, self.waiting = self.waiting, []
            pipe = (self.cluster.pipeline(transaction=False) if args.plain
                    else self.cluster.pipeline())
            for command, _ in waiting:
                pipe.execute_command(*command)
            self.pipelines += 1
            replies = await pipe.execute(raise_on_error=False)
            for (_, done), reply in zip(waiting, replies, strict=True):
                if isinstance(reply, Exception):
                    done.set_exception(reply)
                else:
                    done.set_result(reply)

    class Client:
        """A one-server store's async client whose ``flush.lua`` calls go to
        the cluster (:class:`Calls`); anything else (the flush's eviction
        check) to the one server it was opened on."""

        def __init__(self, calls: Calls, own: Any) -> None:
            self._calls, self._own = calls, own

        async def evalsha(self, *command: Any) -> Any:
            return await self._calls.call(("EVALSHA", *command))

        async def eval(self, *command: Any) -> Any:
            return await self._calls.call(("EVAL", *command))

        def __getattr__(self, name: str) -> Any:
            return getattr(self._own, name)

    async def fill(calls: Calls) -> tuple[int, int]:
        # --whole: every page in the first group's store (one call a flush,
        # the floor's key names): what the names alone cost.
        # --groups N: every (64/N)-th group's tag, a host in the one of
        # its own group's index modulo N (the tags' slots are one in each
        # 64th of the slot space, so these spread as evenly as N can).
        groups = HOST_GROUPS[:1] if args.whole else HOST_GROUPS[::len(HOST_GROUPS) // args.groups]
        stores = {group: RedisStateStore(args.open_uri, prefix=f"cap{{{tag(group)}}}",
                                         history_limit=10) for group in groups}
        for store in stores.values():
            assert not store.tagged, "the floor's stores must keep the one server's layout"
            store._async = Client(calls, store._async)
        applied = flushes = 0

        async def flush_all() -> None:
            nonlocal applied, flushes
            busy = [store for store in stores.values() if store._ops]
            calls.expected = len(busy)
            applied += sum(await asyncio.gather(*(store.flush() for store in busy)))
            flushes += 1

        writes = 0
        for i in range(args.pages):
            state = cap.page_state(i, shape)
            if args.no_callback:
                # Not in the sums by next visit nor the revisit index.
                state = dataclasses.replace(state, callback=None)
            host, _ = page_field(state.key)
            at = 0 if args.whole else _GROUP_INDEX[host_group(host_part(host))] % len(groups)
            stores[groups[at]].stage_page(state)
            writes += 1
            if writes >= cap.BATCH:
                await flush_all()
                writes = 0
        await flush_all()
        for store in stores.values():
            store._async = store._async._own
            await store.close()
        return applied, flushes

    async def run() -> tuple[int, int, int]:
        cluster: Any = (redis.asyncio.Redis.from_url(args.redis_uri) if args.plain
                        else AsyncCluster.from_url(args.redis_uri))
        try:
            calls = Calls(cluster)
            applied, flushes = await fill(calls)
            return applied, flushes, calls.pipelines
        finally:
            await cluster.aclose()

    for s in servers:
        s.script_load(flush_lua)
        s.config_resetstat()
    idle = idle_cpu(servers)
    (applied, flushes, pipelines), out = measured(servers, args.pages, idle,
                                                  lambda: asyncio.run(run()))
    out.update({"applied": applied, "flushes": flushes, "pipelines": pipelines,
                "check": check_slots(servers, {tag(g): g for g in HOST_GROUPS},
                                     cluster=not args.plain),
                "families": key_families(servers)})
    print(json.dumps(out), flush=True)
    return 0


def check_slots(servers: list[Any], tags: dict[str, str], *, cluster: bool) -> dict[str, Any]:
    """Every key on each primary: its slot (``CLUSTER KEYSLOT``; on one
    server, which has no slots, the key's tag alone) against its group
    tag's, and the pages its bucket hashes hold."""
    keys = in_slot = pages = 0
    wrong: list[str] = []
    groups: set[str] = set()
    held: list[int] = []
    for server in servers:
        here: set[str] = set()
        names = list(server.scan_iter(match="cap{*", count=1_000))
        keys += len(names)
        for at in range(0, len(names), 500):
            batch = names[at:at + 500]
            pipe = server.pipeline(transaction=False)
            slots = []
            for name in batch:
                text = name.decode()
                inside = text[text.index("{") + 1:text.index("}")]
                if cluster:
                    pipe.execute_command("CLUSTER", "KEYSLOT", name)
                    pipe.execute_command("CLUSTER", "KEYSLOT", "{" + inside + "}")
                else:
                    slots += [inside, inside]
            if cluster:
                slots = pipe.execute()
            for name, own, group in zip(batch, slots[::2], slots[1::2], strict=True):
                text = name.decode()
                inside = text[text.index("{") + 1:text.index("}")]
                if inside in tags and own == group:
                    in_slot += 1
                    groups.add(inside)
                    here.add(inside)
                elif len(wrong) < 5:
                    wrong.append(text)
            # Pages: the fields of the bucket hashes (P:pg:{<s>|<h>}:<n>, and
            # P:pgl:... of the large entries).
            pipe = server.pipeline(transaction=False)
            counted = [name for name in batch
                       if name.decode().split("}", 1)[1].startswith((":pg:", ":pgl:"))]
            for name in counted:
                pipe.hlen(name)
            pages += sum(pipe.execute())
        held.append(len(here))
    return {"keys": keys, "in_group_slot": in_slot, "groups": len(groups), "wrong": wrong,
            "pages": pages, "groups_per_server": held}


def run_floor(args: argparse.Namespace, hosts: int, *, plain: bool = False,
              whole: bool = False, groups: int = ALL_GROUPS) -> dict[str, Any]:
    """The floor's fill on a fresh cluster, or (*plain*) the same calls on
    one ``redis-server``."""
    sys.path[:0] = [str(BENCH), str(REPO)]
    from capacity import PrivateRedis

    from tests.redis_cluster_util import LoopbackCluster

    with tempfile.TemporaryDirectory(prefix="bench-cluster-floor-") as tmp:
        for name in ("opener", "target"):
            (Path(tmp) / name).mkdir()
        opener = PrivateRedis(Path(tmp) / "opener")
        target: Any = PrivateRedis(Path(tmp) / "target") if plain else LoopbackCluster(aof=True)
        try:
            if not plain:
                target.start()
            out = subprocess.run(
                [sys.executable, __file__, "--floor-child", "--pages", str(args.pages),
                 "--hosts", str(hosts), "--redis-uri", target.uri if plain else target.url,
                 "--open-uri", opener.uri, "--groups", str(groups),
                 *(["--plain"] if plain else []),
                 *(["--no-callback"] if args.no_callback else []),
                 *(["--whole"] if whole else [])],
                check=True, capture_output=True, text=True,
                timeout=900 * max(1, args.pages // 20_000))
        finally:
            if plain:
                target.stop()
            else:
                target.remove()
            opener.stop()
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run_other(args: argparse.Namespace, hosts: int, *, single: bool) -> dict[str, Any]:
    """One server's fill, or layout 7's, by bench/cluster_commands.py."""
    sys.path[:0] = [str(BENCH), str(REPO)]
    import cluster_commands

    shaped = argparse.Namespace(pages=args.pages, hosts=hosts, items=0, families=True)
    return cluster_commands.run_once(REPO, shaped, single=single)


def net(run: dict[str, Any]) -> list[float]:
    """CPU a page on each server less its idle CPU over the fill."""
    return [c - i for c, i in zip(run["cpu_us_per_node"], run["idle_us_per_page"], strict=True)]


def commands_a_page(run: dict[str, Any], pages: int) -> tuple[float, float]:
    """(script calls, commands) a page: INFO commandstats, the bench's own
    commands left out; a script's commands are counted beside its call."""
    stats = {name: calls for name, (calls, _) in run["commands"].items()
             if name not in OWN_COMMANDS}
    scripts = stats.get("evalsha", 0) + stats.get("eval", 0)
    return scripts / pages, sum(stats.values()) / pages


def memory_report(runs: dict[str, list[dict[str, Any]]], pages: int) -> None:
    """Bytes a page (``used_memory`` after the fill less before, summed over
    the fill's servers, over pages: bench/capacity.py's figure) and keys a
    page (``DBSIZE`` summed), beside one server's; then, for the last
    round, the bytes and keys a page of each kind of key (``MEMORY USAGE``
    of every key), which tell what the split multiplies."""
    fills = [name for name in runs if runs[name] and "bytes_per_page_per_node" in runs[name][0]]
    if "one server" not in fills:
        return
    alone = [sum(r["bytes_per_page_per_node"]) for r in runs["one server"]]
    print("  bytes a page (used_memory after less before, summed over the fill's servers; "
          "keys a page: DBSIZE summed), medians of the rounds (the rounds in brackets)")
    for name in fills:
        held = [sum(r["bytes_per_page_per_node"]) for r in runs[name]]
        keys = [sum(r["keys_per_node"]) / pages for r in runs[name]]
        ratio = [h / a for h, a in zip(held, alone, strict=False)]
        per_node = runs[name][-1]["bytes_per_page_per_node"]
        print(f"  {name:10}: {statistics.median(held):6.1f} bytes a page "
              f"({' '.join(f'{x:.1f}' for x in held)}), "
              f"{statistics.median(ratio):.2f}x one server; "
              f"{statistics.median(keys):.3f} keys a page"
              + (f"; per primary (last round) {' / '.join(f'{x:.1f}' for x in per_node)}"
                 if len(per_node) > 1 else ""))
    found = [name for name in fills if "families" in runs[name][-1]]
    if not found:
        return
    kinds = sorted({kind for name in found for kind in runs[name][-1]["families"]},
                   key=lambda kind: -max(runs[name][-1]["families"].get(kind, [0, 0])[1]
                                         for name in found))
    print("  by kind of key, last round (MEMORY USAGE of every key, SAMPLES 0): "
          "bytes a page / keys a page")
    print("    " + f"{'kind':8}" + "".join(f"{name:>20}" for name in found))

    def cell(keys: int, size: int) -> str:
        return f"{size / pages:8.1f} / {keys / pages:7.4f}"

    for kind in kinds:
        print("    " + f"{kind:8}" + "".join(
            f"{cell(*runs[name][-1]['families'].get(kind, [0, 0])):>20}" for name in found))
    totals = {name: [sum(v[i] for v in runs[name][-1]["families"].values()) for i in (0, 1)]
              for name in found}
    print("    " + f"{'all keys':8}" + "".join(f"{cell(*totals[name]):>20}" for name in found))
    # used_memory that no key's MEMORY USAGE holds: the keyspace's bucket
    # arrays (8 bytes a slot, a power of two of the keys; MEMORY STATS
    # counts each key's entry there too, so it is not taken apart here) and
    # what a server holds whatever its keys (the scripts' cache among it).
    rest = {name: sum(runs[name][-1]["bytes_per_page_per_node"]) - totals[name][1] / pages
            for name in found}
    print("    " + f"{'not keys':8}" + "".join(f"{rest[name]:8.1f}{'':12}" for name in found))


def report(results: dict[int, dict[str, list[dict[str, Any]]]], args: argparse.Namespace,
           loads: list[tuple[float, float, float]]) -> None:
    print(f"{args.pages:,} pages, flushes of 500, {args.rounds} rounds; load average "
          f"(1/5/15 min) at each round's start: "
          + "; ".join(f"{a:.2f} {b:.2f} {c:.2f}" for a, b, c in loads))
    print("one server: layout 4, one flush.lua call a flush; split: the floor's calls (one a "
          "host group) on one redis-server; floor: the same on the 3-primary cluster; layout 7: "
          "the store on the cluster as it is; names: one server, the floor's key names, one "
          "call a flush")
    print("server CPU a page written (us, main thread, net of idle), medians of the rounds "
          "(the rounds in brackets); ratios to one server round by round, median")
    for hosts, runs in results.items():
        alone = [net(r)[0] for r in runs["one server"]]
        print(f"\n{hosts:,} hosts")
        print(f"  one server: {statistics.median(alone):6.1f} us a page "
              f"({' '.join(f'{x:.1f}' for x in alone)}); raw (idle in) "
              f"{statistics.median(r['cpu_us_per_node'][0] for r in runs['one server']):.1f}")
        for name in [n for n in runs if n != "one server"]:
            summed = [sum(net(r)) for r in runs[name]]
            busiest = [max(net(r)) for r in runs[name]]
            # Each fill against one server's of its own round.
            base = [r.get("alone", a) for r, a in zip(runs[name], alone, strict=False)]
            ratio_sum = [s / a for s, a in zip(summed, base, strict=True)]
            ratio_busy = [b / a for b, a in zip(busiest, base, strict=True)]
            rate = [a / b for b, a in zip(busiest, base, strict=True)]
            share = [b / s for b, s in zip(busiest, summed, strict=True)]
            line = (f"  {name:10}: summed {statistics.median(summed):6.1f} us "
                    f"({' '.join(f'{x:.1f}' for x in summed)}), "
                    f"{statistics.median(ratio_sum):.2f}x one server "
                    f"({' '.join(f'{x:.2f}' for x in ratio_sum)})")
            if len(runs[name][-1]["cpu_us_per_node"]) > 1:
                line += (f"; busiest primary {statistics.median(busiest):6.1f} us "
                         f"({statistics.median(share):.0%} of the summed), "
                         f"{statistics.median(ratio_busy):.2f}x one server "
                         f"({' '.join(f'{x:.2f}' for x in ratio_busy)}): write rate bound "
                         f"{statistics.median(rate):.2f}x one server's; per primary (last "
                         f"round) {' / '.join(f'{x:.1f}' for x in net(runs[name][-1]))}")
            print(line)
        memory_report(runs, args.pages)
        for name in runs:
            scripts, commands = commands_a_page(runs[name][-1], args.pages)
            print(f"  {name:10} (last round): {scripts:.3f} script calls a page, "
                  f"{commands:.1f} commands a page (scripts' own included)")
        for name in [n for n in runs if kind_of(n)[0] in (SPLIT, NAMES, "floor")]:
            bad = []
            for n, run in enumerate(runs[name]):
                check = run["check"]
                if not (check["wrong"] == [] and check["in_group_slot"] == check["keys"]
                        and check["pages"] == args.pages and run["applied"] == args.pages):
                    bad.append(f"round {n + 1}: {run['applied']} applied, {check}")
            last = runs[name][-1]
            check = last["check"]
            by_tag = "" if kind_of(name)[0] == "floor" else " (by tag: one server has no slots)"
            print(f"  {name} check: {len(runs[name]) - len(bad)} of {len(runs[name])} rounds "
                  f"OK (every write applied, every key in its group's slot{by_tag}, every "
                  f"page stored); last round {last['flushes']} flushes in {last['pipelines']} "
                  f"pipelines, {check['keys']:,} keys in {check['groups']} groups"
                  + (f", groups a primary {' / '.join(map(str, check['groups_per_server']))}"
                     if name.startswith("floor") and "groups_per_server" in check else "")
                  + "".join(f"\n    WRONG {b}" for b in bad))


def report_saved(args: argparse.Namespace) -> int:
    """The report of one or more ``--json`` files, their rounds pooled
    (each ratio is still within its round)."""
    results: dict[int, dict[str, list[dict[str, Any]]]] = {}
    loads: list[tuple[float, float, float]] = []
    for path in args.report:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
        args.pages = saved["args"]["pages"]
        loads += [tuple(load) for load in saved["loads"]]
        for hosts, runs in saved["results"].items():
            pooled = results.setdefault(int(hosts), {})
            alone = [net(r)[0] for r in runs["one server"]]
            for name, found in runs.items():
                for run, own in zip(found, alone, strict=True):
                    run["alone"] = own
                # (Files of the first version named the split at length.)
                pooled.setdefault(name.removesuffix(", one server"), []).extend(found)
    args.rounds = len(loads)
    report(results, args, loads)
    return 0


def kind_of(name: str) -> tuple[str, int]:
    """A fill's kind and its number of host groups: ``floor/8`` is the
    floor in 8 groups, ``floor`` in all 64."""
    kind, _, groups = name.partition("/")
    return kind, int(groups) if groups else ALL_GROUPS


def order_of(args: argparse.Namespace) -> list[str]:
    names = [*ORDER, NAMES] if args.names else list(ORDER)
    if args.only:
        # One server stays: every ratio is to it.
        names = [name for name in names if name == "one server" or name in args.only]
    if args.groups != [ALL_GROUPS]:
        names = [f"{name}/{n}" if name in (SPLIT, "floor") else name
                 for name in names for n in (args.groups if name in (SPLIT, "floor") else [0])]
    return names


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int)
    p.add_argument("--hosts", type=int, nargs="+", default=[1_000, 10])
    p.add_argument("--rounds", type=int)
    p.add_argument("--large", action="store_true",
                   help="100,000 pages, one round (unless --pages / --rounds say otherwise): "
                        "the page count of bench/capacity.py's bytes a page; memory is "
                        "deterministic enough for one round, the CPU figures are not")
    p.add_argument("--no-callback", action="store_true",
                   help="the floor's, split's and names' pages without a callback (no sums "
                        "by next visit, no revisit index; one server's and layout 7's keep "
                        "theirs: compare split with names then)")
    p.add_argument("--only", nargs="+", choices=[*ORDER[1:], NAMES],
                   help="only these fills beside one server's")
    p.add_argument("--groups", type=int, nargs="+", default=[ALL_GROUPS],
                   help="the floor's and split's pages in N host groups (every 64/N-th of "
                        "the 64, N dividing 64); several N: a fill each, every round")
    p.add_argument("--json", help="write every run's figures to this file")
    p.add_argument("--floor-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--redis-uri", help=argparse.SUPPRESS)
    p.add_argument("--open-uri", help=argparse.SUPPRESS)
    p.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--whole", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--names", action="store_true",
                   help="each round also one server written with the floor's key names, "
                        "one call a flush (all pages in one group's store): what the "
                        "longer names cost apart from the split")
    p.add_argument("--report", nargs="+", metavar="JSON",
                   help="print the figures of these --json files, their rounds pooled")
    args = p.parse_args()
    if args.pages is None:
        args.pages = 100_000 if args.large else 20_000
    if args.rounds is None:
        args.rounds = 1 if args.large else 3
    if args.report:
        return report_saved(args)
    if any(n < 1 or ALL_GROUPS % n for n in args.groups):
        p.error(f"--groups: each N must divide {ALL_GROUPS}")
    if args.floor_child:
        args.hosts = args.hosts[0]
        args.groups = args.groups[0]
        return floor_child(args)
    results: dict[int, dict[str, list[dict[str, Any]]]] = {
        hosts: {name: [] for name in order_of(args)} for hosts in args.hosts}
    loads = []
    for n in range(args.rounds):
        loads.append(os.getloadavg())
        for hosts in args.hosts:
            # The order turns each round: a load that grows or falls over a
            # run is not all on one of them.
            names = order_of(args)
            order = names[n % len(names):] + names[:n % len(names)]
            for name in order:
                kind, groups = kind_of(name)
                if kind in ("floor", SPLIT, NAMES):
                    run = run_floor(args, hosts, plain=kind != "floor", whole=kind == NAMES,
                                    groups=groups)
                else:
                    run = run_other(args, hosts, single=name == "one server")
                results[hosts][name].append(run)
                cpu = net(run)
                print(f"round {n + 1}, {hosts:,} hosts, {name}: {sum(cpu):.1f} us a page "
                      f"summed ({' / '.join(f'{x:.1f}' for x in cpu)})", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "loads": loads,
                                               "results": results}), encoding="utf-8")
    report(results, args, loads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
