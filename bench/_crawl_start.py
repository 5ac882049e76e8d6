"""One store, one version of the code: what a crawl start costs (bench/capacity.py --crawl-start).

Run by ``bench/capacity.py`` in a child process per store and version, so
that two versions of ``incremental_crawler`` (this tree's, and the base
commit's in a git worktree) never meet in one interpreter:

    python bench/_crawl_start.py --code ROOT --store sqlite|redis|cluster --sizes N [N ...]
        [--redis-uri URI] --work DIR [--bulk-from N]

``cluster``: ``--redis-uri`` names a node of a Redis Cluster; the store lays
itself out across the cluster's primaries, and bytes and server CPU are
summed over them (and given per node).

``--code`` is the tree ``incremental_crawler`` is imported from. The store
is filled with the pages of ``capacity.page_state`` (the crawl shape, one
scope) up to each size in turn, through the store's own staging API (a
flush every 500 writes), except sizes of ``--bulk-from`` and more: those
are written by a fast bulk path (see :func:`bulk_sqlite`, :func:`bulk_redis`),
then 100,000 more pages through the API, which give the write rate and
flush times at that size. At each size, what a crawl starting a day after
the pages were checked reads (about one page in seven is due then): the
first 10,000 due pages (``get_due`` of 1,000, ten times, each after the
last read: an offset in the old code) and the two summaries of the
re-seeder's accounting (``count_deferred``, ``count_the_rest``), after the
crawl took its scope (``take_scope``: what a crawl does first). Prints one
JSON object a size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import math
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--code", required=True)
    p.add_argument("--store", choices=("sqlite", "redis", "cluster"), required=True)
    p.add_argument("--sizes", type=int, nargs="+", required=True)
    p.add_argument("--redis-uri")
    p.add_argument("--work", required=True)
    p.add_argument("--bulk-from", type=int, default=2_000_000)
    p.add_argument("--hosts", type=int, default=10)
    args = p.parse_args()
    # The code measured first, then the bench's own helpers (page shapes;
    # their repository listed after it, so that they do not put it first).
    sys.path[:0] = [args.code]
    sys.path += [str(BENCH), str(BENCH.parent)]
    import capacity as cap

    import incremental_crawler

    print(json.dumps({"code": str(Path(incremental_crawler.__file__).parent.parent)}),
          flush=True)

    shape = argparse.Namespace(hosts=args.hosts, long_share=0.02, shape="crawl")
    asyncio.run(run(args, cap, shape))
    return 0


async def run(args: argparse.Namespace, cap: Any, shape: argparse.Namespace) -> None:
    from incremental_crawler.state.stores.redis import RedisStateStore
    from incremental_crawler.state.stores.sqlite import SQLiteStateStore

    path = Path(args.work) / "start.db"
    servers = primaries(args.redis_uri, cluster=args.store == "cluster") if args.redis_uri else []
    server = servers[0] if servers else None

    def open_store() -> Any:
        if args.store == "sqlite":
            return SQLiteStateStore(path, history_limit=10)
        return RedisStateStore(args.redis_uri, prefix="cap", history_limit=10)

    def used_bytes() -> int:
        if servers:
            return sum(int(memory["used_memory"]) - int(memory.get("mem_aof_buffer", 0))
                       for memory in (s.info("memory") for s in servers))
        db = sqlite3.connect(path)
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()
        wal = Path(f"{path}-wal")
        return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)

    base_bytes = used_bytes() if server is not None else 0
    store = open_store()
    done = 0
    for size in args.sizes:
        extra: dict[str, Any] = {}
        bulk = size >= args.bulk_from
        if bulk:
            await store.close()
            at = time.perf_counter()
            if args.store == "sqlite":
                extra["migrate_s"] = bulk_sqlite(path, cap, shape, done, size)
                store = open_store()
            else:
                store = open_store()
                await bulk_redis(store, cap, shape, done, size)
            extra["bulk_s"] = time.perf_counter() - at
            done = size
        # The write rate and flushes at this size (bulk: 100,000 pages more).
        upto = size + 100_000 if bulk else size
        before = [server_cpu(s) for s in servers]
        rate, flushes = await fill(store, cap, shape, done, upto)
        # Each server's CPU per page written by this fill (on a cluster each
        # primary takes a share of the pages).
        extra["write_cpu_us_per_node"] = [
            1e6 * (server_cpu(s) - b) / (upto - done) for s, b in zip(servers, before, strict=True)]
        done = upto
        cpu = [server_cpu(s) for s in servers]
        start = await crawl_start(store, cap)
        if servers:
            start["server_cpu_s"] = sum(
                server_cpu(s) - c for s, c in zip(servers, cpu, strict=True))
        # Bytes once the crawl start's own writes (Redis: bounds set right)
        # are flushed, as a crawl's first flush would.
        await store.flush()
        if server is not None:
            time.sleep(1.2)
        used = used_bytes() - base_bytes
        print(json.dumps({
            "pages": done, "bytes_per_page": used / done, "write_pages_per_s": rate,
            "flush_ms_median": 1000 * sorted(flushes)[len(flushes) // 2],
            "flush_ms_max": 1000 * max(flushes), "bulk": bulk, **extra, **start,
        }), flush=True)
    await store.close()


def primaries(uri: str, *, cluster: bool) -> list[Any]:
    """A client of each server holding the store: the one server, or each
    primary of the cluster *uri* names a node of."""
    import redis
    from redis.cluster import RedisCluster

    if not cluster:
        return [redis.Redis.from_url(uri)]
    with RedisCluster.from_url(uri) as client:
        nodes = [(n.host, n.port) for n in client.get_primaries()]
    return [redis.Redis(host=host, port=port) for host, port in sorted(nodes)]


def server_cpu(server: Any) -> float:
    """The server's main thread's CPU seconds so far (commands and scripts)."""
    info = server.info("cpu")
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


def idle_cpu(servers: list[Any], seconds: float = 2.0) -> list[float]:
    """Each server's CPU at idle (cron; a cluster's bus too), per second."""
    at, was = time.perf_counter(), [server_cpu(s) for s in servers]
    time.sleep(seconds)
    return [(server_cpu(s) - w) / (time.perf_counter() - at)
            for s, w in zip(servers, was, strict=True)]


def used_memory(server: Any) -> int:
    """``used_memory`` less the AOF buffer (written out every event loop:
    not the data's), as bench/capacity.py counts a store's bytes."""
    memory = server.info("memory")
    return int(memory["used_memory"]) - int(memory.get("mem_aof_buffer", 0))


def measured(servers: list[Any], pages: int, idle: list[float],
             run: Any) -> tuple[Any, dict[str, Any]]:
    """*run()*'s result, and what the servers spent on it: CPU a page per
    server, its idle share, every command's calls and time summed, wall;
    and what they hold after it: bytes a page per server (``used_memory``
    after less before, as bench/capacity.py) and keys (``DBSIZE``)."""
    memory = [used_memory(s) for s in servers]
    before = [server_cpu(s) for s in servers]
    started = time.perf_counter()
    result = run()
    wall = time.perf_counter() - started
    cpu = [1e6 * (server_cpu(s) - b) / pages for s, b in zip(servers, before, strict=True)]
    # The fill's clients closing, a rehash finishing: a second's cron first,
    # as bench/capacity.py waits before it reads used_memory.
    time.sleep(1.2)
    memory = [(used_memory(s) - m) / pages for s, m in zip(servers, memory, strict=True)]
    keys = [int(s.dbsize()) for s in servers]
    commands: dict[str, list[float]] = {}
    for s in servers:
        for name, stat in s.info("commandstats").items():
            total = commands.setdefault(name.removeprefix("cmdstat_"), [0, 0])
            total[0] += stat["calls"]
            total[1] += stat["usec"]
    return result, {"cpu_us_per_node": cpu, "commands": commands, "wall_s": wall,
                    "idle_us_per_page": [1e6 * i * wall / pages for i in idle],
                    "bytes_per_page_per_node": memory, "keys_per_node": keys}


def key_families(servers: list[Any], batch: int = 1_000) -> dict[str, list[int]]:
    """Keys and their bytes (``MEMORY USAGE ... SAMPLES 0``: every element
    counted) by kind of key (a key's second ``:`` part: ``pg``, ``nvf``,
    ...; the prefix, ``cap`` or ``cap{<tag>}``, has no ``:``), summed over
    *servers*: ``{kind: [keys, bytes]}``."""
    families: dict[str, list[int]] = {}
    for server in servers:
        names = list(server.scan_iter(count=1_000))
        for at in range(0, len(names), batch):
            chunk = names[at:at + batch]
            pipe = server.pipeline(transaction=False)
            for name in chunk:
                pipe.execute_command("MEMORY", "USAGE", name, "SAMPLES", "0")
            for name, size in zip(chunk, pipe.execute(), strict=True):
                parts = name.decode().split(":")
                found = families.setdefault(parts[1] if len(parts) > 1 else parts[0], [0, 0])
                found[0] += 1
                found[1] += int(size or 0)
    return families


async def fill(store: Any, cap: Any, shape: argparse.Namespace, first: int,
               last: int) -> tuple[float, list[float]]:
    """Pages *first* to *last* through the staging API: pages/s, flush times."""
    flushes: list[float] = []
    writes = 0
    at = time.perf_counter()
    for i in range(first, last):
        store.stage_page(cap.page_state(i, shape))
        writes += 1
        if writes >= cap.BATCH:
            began = time.perf_counter()
            await store.flush()
            flushes.append(time.perf_counter() - began)
            writes = 0
    began = time.perf_counter()
    await store.flush()
    flushes.append(time.perf_counter() - began)
    return (last - first) / (time.perf_counter() - at), flushes


def bulk_sqlite(path: Path, cap: Any, shape: argparse.Namespace, first: int,
                last: int) -> float:
    """Pages *first* to *last* written into the file at the schema before
    the due indexes and sums (16), as a store of the previous version holds
    them, by ``executemany`` in transactions of 100,000 rows; then the store
    opened, which migrates it (indexes and sums built once). Returns the
    seconds the migration took. Without schema 16 in this code (the old
    one): rows inserted at the current schema, its own indexes kept."""
    from incremental_crawler.state.stores import sqlite as module

    columns = module._PAGE_COLUMNS
    db = sqlite3.connect(path, isolation_level=None)
    version = db.execute("PRAGMA user_version").fetchone()[0]
    target = 16 if module.SCHEMA_VERSION > 16 else version
    if version > target:
        # Back to schema 16: what the bulk rows are written into (the
        # migration builds the rest from every row, the old ones too).
        db.execute("BEGIN")
        for trigger in ("page_sums_insert", "page_sums_delete", "page_sums_update"):
            db.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        db.execute("DROP INDEX IF EXISTS pages_by_next_visit")
        for table in ("page_sums", "page_checks", "check_marks"):
            db.execute(f"DROP TABLE IF EXISTS {table}")
        db.execute(f"PRAGMA user_version = {target}")
        db.execute("COMMIT")
    sql = (f"INSERT INTO pages (scope, url, variant, {columns}) "
           f"VALUES ({', '.join('?' * (3 + len(columns.split(', '))))})")
    for start in range(first, last, 100_000):
        rows = []
        for i in range(start, min(last, start + 100_000)):
            s = cap.page_state(i, shape)
            rows.append((*s.key, s.etag, s.last_modified, s.fingerprint, s.size,
                         s.last_status, int(s.first_seen), int(s.last_checked),
                         int(s.last_fetched), int(s.last_changed), s.checks, s.changes,
                         s.flags, s.redirect_to, int(s.lastmod), int(s.interval),
                         int(s.next_visit), s.callback, s.churns, s.recipe, s.failures,
                         s.listing)[:3 + len(columns.split(", "))])
        db.execute("BEGIN")
        db.executemany(sql, rows)
        db.execute("COMMIT")
    db.close()
    at = time.perf_counter()
    module.SQLiteStateStore(path).flush_now()  # opening migrates
    return time.perf_counter() - at


async def bulk_redis(store: Any, cap: Any, shape: argparse.Namespace, first: int,
                     last: int) -> None:
    """Pages *first* to *last* through the store's own flush script, in
    batches of 5,000 pages, the next batch made while Redis applies the one
    before (the store stages during a flush in flight): every key, sum and
    bucket as a crawl leaves them, without waiting on each round-trip."""
    task: asyncio.Task[Any] | None = None
    for start in range(first, last, 5_000):
        for i in range(start, min(last, start + 5_000)):
            store.stage_page(cap.page_state(i, shape))
        if task is not None:
            await task
        task = asyncio.ensure_future(store.flush())
        await asyncio.sleep(0)  # sent
    if task is not None:
        await task
    await store.flush()


async def crawl_start(store: Any, cap: Any) -> dict[str, Any]:
    """What a crawl starting a day after the pages' checks reads before its
    first request: the first 10,000 due pages and the two summaries."""
    now = cap.NOW + 86_400
    due_at = float(now)
    scope = cap.SCOPE
    store.take_scope(scope, "bench:crawl-start", 600, now)
    by_offset = "offset" in inspect.signature(store.get_due).parameters
    at = time.perf_counter()
    due: list[Any] = []
    for n in range(10):
        if by_offset:
            chunk = await store.get_due(scope, due_at, 1_000, n * 1_000)
        else:
            from incremental_crawler.state.stores.base import due_after

            chunk = await store.get_due(scope, due_at, 1_000,
                                        due_after(due[-1]) if due else None)
        if not chunk:
            break
        due += chunk
    read_s = time.perf_counter() - at
    at = time.perf_counter()
    deferred = await store.summarize_pages(scope, after=-math.inf, upto=due_at,
                                           checked_before=math.floor(now))
    rest = await store.summarize_pages(scope, after=due_at, upto=math.inf,
                                       checked_before=math.floor(now) + 1)
    summaries_s = time.perf_counter() - at
    with contextlib.suppress(Exception):
        await store.release_scope(scope, "bench:crawl-start")
    return {"due_read": len(due), "due_read_s": read_s, "summaries_s": summaries_s,
            "start_s": read_s + summaries_s, "due": list(deferred), "rest": list(rest),
            "first_due_read": [due[0].next_visit, due[-1].next_visit] if due else None}


if __name__ == "__main__":
    sys.exit(main())
