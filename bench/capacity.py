"""Capacity of the state stores: bytes, round trips and rates per page, up to millions.

What it measures
    Three stores side by side, each filled through its own staging API as a
    crawl fills it (``stage_item`` then ``stage_page`` per page, ``flush``
    every 500 writes, INCREMENTAL_BATCH_SIZE's default):

    - ``sqlite``: ``SQLiteStateStore``, a file in a temporary directory;
    - ``redis-2`` (baseline): the Redis store of layout 2 (one hash of JSON
      records per scope, a sorted set of pages as the revisit index), the
      code of the commit before layout 3, read from git (``--baseline-ref``);
    - ``redis-3`` (ours): this tree's Redis store (packed records in small
      buckets per host, a revisit index of buckets).

    Each Redis store gets a throwaway ``redis-server`` of its own on
    127.0.0.1 (a free port, AOF on with ``appendfsync everysec``, no RDB,
    stopped at the end), never a shared one.

    Pages are what a sitemap crawl stores with revisits on (``--shape
    crawl``: callback, next visit, interval, lastmod, validators of the
    usual forms, a 16-hex fingerprint) on ``--hosts`` (10) hosts, URLs of
    70-90 characters with ``--long-share`` (2%) longer than 100;
    ``--shape filler`` is bench/redis_store.py's page (no callback, short
    URL) for comparison with figures measured with it.

    1. State alone: filled to ``--pages`` (10,000, 100,000 and 1,000,000;
       ``--big`` adds 3,000,000). At each size: bytes per page (Redis: growth
       of ``used_memory`` since the empty store, every key included;
       SQLite: the file plus its -wal after a checkpoint), write rate
       (pages/s of the fill up to there), lookups/s (``get_pages`` of 1,000
       random stored pages, 20 times, and 2,000 single ``get_page``),
       round-trips per page (the store's count), Redis commands per page
       (every command the server ran, those inside scripts included, from
       ``INFO commandstats``), server CPU per page (``INFO cpu`` of the
       redis-server), AOF bytes per page, SQLite statements per page and
       commits per flush, and the median and slowest flush (for Redis, how
       long one flush script blocks the server). At the largest size, what
       a re-seed reads with every page due: the first 10,000 due pages
       (``get_due`` of 1,000, ten times: INCREMENTAL_RESEED_LIMIT's default)
       and a summary of every page (``summarize_pages``: one or two a crawl
       start).
    2. With items and history: ``--items-pages`` (10,000 and 100,000)
       pages, each with an item keyed by its URL (~600 bytes of JSON)
       stored in 3 versions (new, changed, changed) under
       INCREMENTAL_ITEM_HISTORY=10, then the page: the same figures.
    3. A capacity table: the figures above taken to a node's memory, a
       server's CPU, an AOF's disk and a single SQLite writer.
    4. ``--crawl-start`` (alone): what a crawl reads before its first
       request (the first 10,000 due pages, the re-seeder's two summaries)
       at ``--start-pages`` (100,000, 1,000,000 and 10,000,000) with this
       tree's code, and at ``--start-old-pages`` (100,000 and 1,000,000)
       with the base commit's (``--start-ref``, read from git into a
       worktree of its own), each store and version in a process of its
       own (``bench/_crawl_start.py``), with bytes per page, write rate and
       flush times; sizes from ``--start-bulk-from`` (2,000,000) are
       written by a bulk path (see that module). This tree's code also on
       a Redis Cluster of three primaries on loopback (each with its
       append-only file, as the single server has) at
       ``--start-cluster-pages`` (100,000 and 1,000,000): the same figures,
       bytes summed over the primaries, and each primary's CPU per page
       written: each primary runs commands on one thread, so the busiest
       one's CPU per page bounds the cluster's write rate (one server's
       against it: ~3x is three primaries sharing the writes evenly). The
       pages are on ``--hosts`` hosts (10): a host's keys are one hash
       slot, so few hosts use few nodes. With ``--start-cluster-ref`` the
       cluster also runs that commit's code (a worktree of its own), at
       the same sizes, beside this tree's.
       ~45 minutes.

How to read it
    Ratios are ours / baseline (redis-3 / redis-2). The target: Redis bytes
    per page, state alone, at most half the baseline's (and at most 210 B,
    half of the 419 B bench/redis_store.py measured for layout 2). Rates
    vary by 10-30% between runs on a shared machine; bytes, round-trips and
    command counts do not. The capacity table extrapolates linearly from
    the largest size measured: per-page memory is flat past ~100,000 pages
    (the buckets are full), and Redis runs every command on one thread.
    About 7 minutes at the defaults on a 2-core machine (``--pages 10000
    100000 --items-pages 10000`` ~1 minute).

    python bench/capacity.py [--pages 10000 100000 1000000] [--big] [--items-pages ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import random
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import ensure_importable, print_table, ratio, verdict

ensure_importable()

import redis

from incremental_crawler.state.records import Change, ItemRecord, PageKey, PageState
from incremental_crawler.state.stores.redis import RedisStateStore
from incremental_crawler.state.stores.sqlite import SQLiteStateStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from incremental_crawler.state.stores.base import StateStore

REPO = Path(__file__).resolve().parent.parent
SCOPE = "sitemap"
#: Writes per flush: INCREMENTAL_BATCH_SIZE's default (a crawl flushes so).
BATCH = 500
NOW = 1_760_000_000
#: Versions of each item in the items-and-history fill.
VERSIONS = 3
#: The target: at most half the baseline's bytes per page, and at most this.
TARGET_BYTES = 210
GB = 1 << 30


# -- what is stored -------------------------------------------------------------


def page_url(i: int, hosts: int, long_share: float, shape: str) -> str:
    if shape == "filler":
        return f"http://filler.invalid/p/{i}"
    rng = random.Random(i)
    host = f"www.shop-{i % hosts}.example.com"
    slug = "-".join(rng.choice(("blue", "large", "cotton", "shirt", "classic", "modern",
                                "garden", "chair", "steel", "lamp", "oak", "table"))
                    for _ in range(rng.randrange(2, 5)))
    path = f"/catalog/category-{i % 97}/{slug}-{i}.html"
    if rng.random() < long_share:
        path += f"?utm_source=newsletter&utm_medium=email&utm_campaign=spring-{i % 13}"
    return f"https://{host}{path}"


def page_state(i: int, args: argparse.Namespace) -> PageState:
    key = PageKey(SCOPE, page_url(i, args.hosts, args.long_share, args.shape))
    fp = f"{(i * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF:016x}"
    if args.shape == "filler":
        return PageState(key, etag=f'"{fp}"', last_modified="Sun, 06 Nov 1994 08:49:37 GMT",
                         fingerprint=fp, size=30_000, last_status=200, first_seen=NOW,
                         last_checked=NOW, last_fetched=NOW, last_changed=NOW, checks=1)
    # ETags of the usual servers: nginx, Apache, weak, and an opaque one.
    etag = (f'"{fp[:8]}-{fp[8:12]}"', f'"{fp[:2]}-{fp[2:15]}"', f'W/"{fp}"',
            f'"v{i}-{fp[:6].upper()}"')[i % 4]
    checked = NOW - i % 86_400
    return PageState(
        key, etag=etag, last_modified="Sun, 06 Nov 1994 08:49:37 GMT", fingerprint=fp,
        size=20_000 + i % 50_000, last_status=200, first_seen=checked - 30 * 86_400,
        last_checked=checked, last_fetched=checked, last_changed=checked - 3 * 86_400,
        checks=1 + i % 20, changes=i % 3, flags=8, lastmod=checked - 3 * 86_400,
        interval=86_400 * (1 + i % 7), next_visit=checked + 86_400 * (1 + i % 7),
        callback="parse")


def item_record(state: PageState, version: int) -> ItemRecord:
    url = state.key.url
    text = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod "
            "tempor incididunt ut labore et dolore magna aliqua. ") * 4
    data = (f'{{"url":"{url}","title":"Product {version} of {len(url)}",'
            f'"price":"{19 + version}.99","text":"{text}"}}')
    return ItemRecord(SCOPE, url, url, f"{hash((url, version)) & (2**64 - 1):016x}",
                      data=data, stored_at=state.last_checked + version,
                      change=Change.NEW if version == 1 else Change.CHANGED)


# -- stores and servers ---------------------------------------------------------------


class PrivateRedis:
    """A throwaway redis-server on a free loopback port, AOF every second."""

    def __init__(self, workdir: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.dir = workdir
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "yes", "--appendfsync", "everysec",
             "--auto-aof-rewrite-percentage", "0", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        for _ in range(400):  # 20 s at most
            with contextlib.suppress(redis.ConnectionError):
                if self.client.ping():
                    break
            time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError("redis-server did not start")
        self.uri = f"redis://127.0.0.1:{self.port}/0"

    def used_memory(self) -> int:
        memory = self.client.info("memory")
        # The AOF buffer is written out every event loop: not the data's.
        return int(memory["used_memory"]) - int(memory.get("mem_aof_buffer", 0))

    def cpu(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])

    def commands(self) -> int:
        return sum(v["calls"] for v in self.client.info("commandstats").values())

    def aof_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.dir.rglob("*.aof"))

    def encodings(self) -> Counter[str]:
        found: Counter[str] = Counter()
        for key in self.client.scan_iter(count=10_000):
            kind = key.split(b":")[1].decode()
            found[f"{kind}:{self.client.object('encoding', key).decode()}"] += 1
        return found

    def keys(self) -> int:
        return int(self.client.dbsize())

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


def baseline_class(ref: str | None, workdir: Path) -> tuple[type | None, str]:
    """Layout 2's RedisStateStore from git: *ref*, else the parent of the
    commit that brought layout 3. ``(None, why)`` when git cannot say."""
    path = "incremental_crawler/state/stores/redis.py"

    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=REPO, check=True, capture_output=True,
                              text=True, timeout=60).stdout

    try:
        if ref is None:
            found = git("log", "--format=%H", "-S", "LAYOUT_VERSION = 3", "--", path).split()
            if not found:
                return None, "no commit brings layout 3 in this history"
            ref = found[-1] + "^"
        source = git("show", f"{ref}:{path}")
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"git could not read it ({exc})"
    if "LAYOUT_VERSION = 2" not in source:
        return None, f"{ref} does not hold layout 2"
    module_path = workdir / "redis_layout2.py"
    module_path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("redis_layout2", module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RedisStateStore, ref


@dataclass
class Point:
    """The figures of one store at one size."""

    pages: int
    bytes: int
    fill_s: float
    roundtrips: int
    batched_per_s: float
    single_per_s: float
    slowest_flush: float
    median_flush: float
    commands: int = 0
    server_cpu: float = 0.0
    aof: int = 0
    statements: int = 0
    commits: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


async def fill(store: StateStore, sizes: list[int], args: argparse.Namespace, *,
               items: bool, measure: Callable[[], dict[str, Any]],
               label: str) -> list[Point]:
    """Fill *store* to each of *sizes* in turn, measuring at each."""
    points: list[Point] = []
    done = 0
    writes = 0
    fill_s = 0.0
    flushes: list[float] = []
    rng = random.Random(7)
    for size in sizes:
        print(f"... {label}: {done:,} -> {size:,} pages", file=sys.stderr)
        started = time.perf_counter()
        for i in range(done, size):
            state = page_state(i, args)
            if items:
                for version in range(1, VERSIONS + 1):
                    store.stage_item(item_record(state, version))
                writes += VERSIONS
            store.stage_page(state)
            writes += 1
            if writes >= BATCH:
                at = time.perf_counter()
                await store.flush()
                flushes.append(time.perf_counter() - at)
                writes = 0
        at = time.perf_counter()
        await store.flush()
        flushes.append(time.perf_counter() - at)
        writes = 0
        fill_s += time.perf_counter() - started
        done = size
        figures = measure()
        trips = store.roundtrips
        wanted = [page_state(rng.randrange(size), args).key for _ in range(20_000)]
        at = time.perf_counter()
        hits = 0
        for start in range(0, len(wanted), 1_000):
            hits += len(await store.get_pages(wanted[start:start + 1_000]))
        batched = len(wanted) / (time.perf_counter() - at)
        at = time.perf_counter()
        for key in wanted[:2_000]:
            hits += await store.get_page(key) is not None
        single = 2_000 / (time.perf_counter() - at)
        if hits < 20_000 * 0.6 + 2_000:
            raise SystemExit(f"{label}: lookups found only {hits} pages")
        points.append(Point(size, figures.pop("bytes"), fill_s, figures.pop("roundtrips", trips),
                            batched, single, max(flushes), statistics.median(flushes),
                            **figures))
    return points


async def fill_redis(store_cls: type, server: PrivateRedis, sizes: list[int],
                     args: argparse.Namespace, *, items: bool, label: str) -> list[Point]:
    base_memory = server.used_memory()
    server.client.config_resetstat()
    base_cpu, base_aof = server.cpu(), server.aof_bytes()
    store = store_cls(server.uri, prefix="cap", history_limit=10)

    def measure() -> dict[str, Any]:
        time.sleep(1.2)  # the AOF is written out every second
        return {"bytes": server.used_memory() - base_memory, "roundtrips": store.roundtrips,
                "commands": server.commands(), "server_cpu": server.cpu() - base_cpu,
                "aof": server.aof_bytes() - base_aof}

    try:
        points = await fill(store, sizes, args, items=items, measure=measure, label=label)
        last = points[-1]
        last.extra["keys"] = server.keys()
        last.extra["encodings"] = server.encodings()
        if not items:
            cpu = server.cpu()
            await reseed_reads(store, last, label, args.shape)
            last.extra["reseed_cpu"] = server.cpu() - cpu
    finally:
        await store.close()
    return points


async def reseed_reads(store: StateStore, last: Point, label: str, shape: str) -> None:
    """What a re-seed reads of a store of *last*'s size, every page due: the
    first 10,000 due pages (10 pages of 1,000, INCREMENTAL_RESEED_LIMIT's
    default), then a summary of every page (one or two a crawl start)."""
    at = time.perf_counter()
    due = []
    for offset in range(0, 10_000, 1_000):
        due += await store.get_due(SCOPE, float("inf"), 1_000, offset)
    last.extra["get_due_s"] = time.perf_counter() - at
    at = time.perf_counter()
    summary = await store.summarize_pages(SCOPE, after=float("-inf"), upto=float("inf"),
                                          checked_before=float("inf"))
    last.extra["summary_s"] = time.perf_counter() - at
    # A filler page has no callback: never due.
    pages = last.pages if shape == "crawl" else 0
    if len(due) != min(10_000, pages) or summary.pages != pages:
        raise SystemExit(f"{label}: {len(due)} due pages read, {summary.pages} "
                         f"summed, of {last.pages}")


async def fill_sqlite(path: Path, sizes: list[int], args: argparse.Namespace, *,
                      items: bool) -> list[Point]:
    store = SQLiteStateStore(path, history_limit=10)
    counts = Counter[str]()

    def trace(statement: str) -> None:
        counts["commits" if statement.startswith("COMMIT") else "statements"] += 1

    # Its own connection: every statement it runs is counted.
    store._db.set_trace_callback(trace)

    def measure() -> dict[str, Any]:
        db = sqlite3.connect(path)
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()
        wal = Path(f"{path}-wal")
        size = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
        return {"bytes": size, "statements": counts["statements"] - counts["commits"],
                "commits": counts["commits"]}

    try:
        points = await fill(store, sizes, args, items=items, measure=measure, label="sqlite")
        if not items:
            await reseed_reads(store, points[-1], "sqlite", args.shape)
        return points
    finally:
        await store.close()


# -- the run --------------------------------------------------------------------------


def run_variant(args: argparse.Namespace, sizes: list[int], *, items: bool,
                baseline: type | None, work: Path) -> dict[str, list[Point]]:
    results: dict[str, list[Point]] = {}
    tag = "items" if items else "state"
    results["sqlite"] = asyncio.run(fill_sqlite(work / f"{tag}.db", sizes, args, items=items))
    stores: list[tuple[str, type]] = [("redis-3", RedisStateStore)]
    if baseline is not None:
        stores.insert(0, ("redis-2", baseline))
    for name, cls in stores:
        server_dir = work / f"{tag}-{name}"
        server_dir.mkdir()
        server = PrivateRedis(server_dir)
        try:
            results[name] = asyncio.run(
                fill_redis(cls, server, sizes, args, items=items, label=name))
        finally:
            server.stop()
            shutil.rmtree(server_dir, ignore_errors=True)
    return results


def per_page(value: float, pages: int, digits: int = 0) -> str:
    return f"{value / pages:,.{digits}f}"


def print_points(title: str, results: dict[str, list[Point]], *, items: bool) -> None:
    print(title)
    rows = []
    for name, points in results.items():
        for p in points:
            writes = p.pages * (VERSIONS + 1 if items else 1)
            row = [name, f"{p.pages:,}", per_page(p.bytes, p.pages),
                   f"{p.pages / p.fill_s:,.0f}", f"{p.batched_per_s:,.0f}",
                   f"{p.single_per_s:,.0f}", per_page(p.roundtrips, p.pages, 3),
                   f"{p.median_flush * 1000:.0f} / {p.slowest_flush * 1000:.0f}"]
            if name == "sqlite":
                flushes = max(1, -(-writes // BATCH))
                row += [per_page(p.statements, p.pages, 1),
                        f"{p.commits / flushes:.1f}/flush", "", ""]
            else:
                row += [per_page(p.commands, p.pages, 1), "",
                        f"{p.server_cpu / p.pages * 1e6:.0f}", per_page(p.aof, p.pages)]
            rows.append(row)
    if "redis-2" in results:
        for old, new in zip(results["redis-2"], results["redis-3"], strict=True):
            rows.append(["redis-3/redis-2", f"{new.pages:,}", ratio(new.bytes, old.bytes),
                         ratio(new.pages / new.fill_s, old.pages / old.fill_s),
                         ratio(new.batched_per_s, old.batched_per_s),
                         ratio(new.single_per_s, old.single_per_s),
                         ratio(new.roundtrips, old.roundtrips), "",
                         ratio(new.commands, old.commands), "",
                         ratio(new.server_cpu, old.server_cpu), ratio(new.aof, old.aof)])
    print_table(["store", "pages", "B/page", "write pages/s", "get_pages/s", "get_page/s",
                 "round-trips/page", "flush ms (median / max)", "commands|statements/page",
                 "commits", "server µs/page", "AOF B/page"], rows)


def capacity_table(state: dict[str, list[Point]], args: argparse.Namespace) -> None:
    ours, lite = state["redis-3"][-1], state["sqlite"][-1]
    old = state.get("redis-2", [None])[-1]
    n = ours.pages
    print(f"Capacity, extrapolated from {n:,} pages (state alone, shape {args.shape}):")
    rows = []
    for name, point in (("redis-2", old), ("redis-3", ours)):
        if point is None:
            continue
        bpp = point.bytes / point.pages
        cpu = point.server_cpu / point.pages
        aof = point.aof / point.pages
        rows += [
            [name, "memory: pages in 16 GB / 64 GB of used_memory",
             f"{16 * GB / bpp / 1e6:,.0f}M / {64 * GB / bpp / 1e6:,.0f}M",
             ("keep used_memory under ~50-75% of RAM: a fork (BGSAVE, AOF rewrite) "
              "copies pages written meanwhile")],
            [name, "writes: pages/s one server thread takes (server CPU a page write)",
             f"{1 / cpu:,.0f} ({cpu * 1e6:.0f} µs)", "the fill's whole server CPU per page"],
            [name, "AOF: bytes a page write; MB/s at that rate",
             f"{aof:,.0f}; {aof / cpu / 1e6:,.1f}", "appendfsync everysec: one fsync a second"],
            [name, "a flush script of 500 writes (median; slowest)",
             f"{point.median_flush * 1000:.0f} ms; {point.slowest_flush * 1000:.0f} ms",
             ("the server runs nothing else meanwhile (the slowest: client side, a GC or "
              "an fsync included)")],
        ]
        if "keys" in point.extra:
            keys = point.extra["keys"]
            rows.append([name, "keys a page; keys at 100M pages",
                         f"{keys / point.pages:.3f}; {keys / point.pages * 1e8:,.0f}", ""])
        if "summary_s" in point.extra:
            scan = point.extra["summary_s"] / point.pages
            rows.append([name, "re-seed: a summary of every page (wall, a page; at 100M pages)",
                         f"{scan * 1e6:.1f} µs; {scan * 1e8 / 60:,.0f} min",
                         "one or two a crawl start; in chunks (others go between)"])
    bpp = lite.bytes / lite.pages
    scan = lite.extra["summary_s"] / lite.pages
    rows += [
        ["sqlite", "re-seed: a summary of every page (wall, a page; at 100M pages)",
         f"{scan * 1e6:.1f} µs; {scan * 1e8 / 60:,.0f} min", "one or two a crawl start"],
        ["sqlite", "file: bytes a page; GB at 100M pages", f"{bpp:,.0f}; {bpp * 1e8 / GB:,.1f}",
         "the disk, not memory: pages are read on demand"],
        ["sqlite", "writes: pages/s of one writer (the fill)", f"{lite.pages / lite.fill_s:,.0f}",
         "one process writes at a time (the file's lock); a commit per flush"],
        ["sqlite", "lookups/s at the largest size (batched; single)",
         f"{lite.batched_per_s:,.0f}; {lite.single_per_s:,.0f}",
         "B-tree depth grows as log(pages)"],
    ]
    print_table(["store", "limit", "figure", "note"], rows)


# -- crawl start: what is due, not the store's size (--crawl-start) ------------------

#: The commit before the due indexes and sums (schema 16, layout 4).
BASE_REF = "9ea4d4b93721ff17cd2c5abc745eda1c01effe33"
#: The crawl-start targets: at 10 M pages, at most this, and at most this
#: many times the figure at 100,000.
START_TARGET_S = 2.0
START_TARGET_GROWTH = 4.0


def crawl_start_run(args: argparse.Namespace) -> int:
    """The crawl-start cost (bench/_crawl_start.py) of both stores, this
    tree's code at ``--start-pages`` and the base commit's (read from git
    into a worktree of its own) at ``--start-old-pages``, side by side."""
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-crawl-start-") as tmp:
        work = Path(tmp)
        old_tree = work / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(old_tree), args.start_ref],
                       cwd=REPO, check=True, capture_output=True, timeout=120)
        # The base commit does not run on a cluster: the cluster's old code
        # is --start-cluster-ref's, if given.
        cluster_old = work / "cluster-base" if args.start_cluster_ref else None
        if cluster_old is not None:
            subprocess.run(["git", "worktree", "add", "--detach", str(cluster_old),
                            args.start_cluster_ref],
                           cwd=REPO, check=True, capture_output=True, timeout=120)
        refs = {old_tree: args.start_ref, cluster_old: args.start_cluster_ref}
        try:
            for store in ("sqlite", "redis", "cluster"):
                runs = ((("new", REPO, args.start_cluster_pages),
                         *((("old", cluster_old, args.start_cluster_pages),)
                           if cluster_old is not None else ())) if store == "cluster" else
                        (("new", REPO, args.start_pages), ("old", old_tree, args.start_old_pages)))
                for version, code, sizes in runs:
                    if not sizes:
                        continue
                    results[store, version] = crawl_start_child(
                        store, code, sorted(sizes), work / f"{store}-{version}", args,
                        refs.get(code, ""))
        finally:
            for tree in (old_tree, cluster_old):
                if tree is not None:
                    subprocess.run(["git", "worktree", "remove", "--force", str(tree)],
                                   cwd=REPO, check=False, capture_output=True, timeout=120)
    print_crawl_start(results, args)
    return 0


def crawl_start_child(store: str, code: Path, sizes: list[int], work: Path,
                      args: argparse.Namespace, ref: str = "") -> list[dict[str, Any]]:
    work.mkdir()
    server: PrivateRedis | None = PrivateRedis(work) if store == "redis" else None
    cluster = None
    if store == "cluster":
        # Three primaries on loopback, each with its append-only file as the
        # single server has (the tests' cluster, from tests/redis_cluster_util.py).
        from tests.redis_cluster_util import LoopbackCluster

        cluster = LoopbackCluster(aof=True)
        cluster.start()
    command = [sys.executable, str(Path(__file__).parent / "_crawl_start.py"),
               "--code", str(code), "--store", store, "--work", str(work),
               "--bulk-from", str(args.start_bulk_from), "--hosts", str(args.hosts),
               "--sizes", *map(str, sizes)]
    if server is not None:
        command += ["--redis-uri", server.uri]
    if cluster is not None:
        command += ["--redis-uri", cluster.url]
    label = f"{store} ({'this tree' if code == REPO else ref[:10]})"
    print(f"... crawl start, {label}: {', '.join(f'{n:,}' for n in sizes)} pages",
          file=sys.stderr)
    points: list[dict[str, Any]] = []
    try:
        with subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                              cwd=work) as child:
            assert child.stdout is not None
            for line in child.stdout:
                point = json.loads(line)
                if "code" in point:
                    if Path(point["code"]).resolve() != code.resolve():
                        child.kill()
                        raise SystemExit(f"{label}: imported {point['code']}, not {code}")
                    continue
                print(f"    {label} at {point['pages']:,}: start {point['start_s']:.2f} s",
                      file=sys.stderr)
                points.append(point)
            if child.wait() != 0:
                raise SystemExit(f"{label}: the measuring process failed")
    finally:
        if server is not None:
            server.stop()
        if cluster is not None:
            cluster.remove()
        shutil.rmtree(work, ignore_errors=True)
    return points


def print_crawl_start(results: dict[tuple[str, str], list[dict[str, Any]]],
                      args: argparse.Namespace) -> None:
    print(f"Crawl start (a day after the pages' checks: ~1/7 of them due), one scope "
          f"on {args.hosts} hosts, state alone; old = {args.start_ref[:10]} (offset "
          "paging, summaries of every page), new = this tree:")
    rows = [[
        store, version, f"{p['pages']:,}" + (" (bulk)" if p["bulk"] else ""),
        f"{p['due_read_s']:.3f}", f"{p['summaries_s']:.3f}", f"{p['start_s']:.3f}",
        f"{p.get('server_cpu_s', 0):.2f}" if store != "sqlite" else "",
        " / ".join(f"{us:.0f}" for us in p.get("write_cpu_us_per_node", [])),
        f"{p['bytes_per_page']:,.0f}", f"{p['write_pages_per_s']:,.0f}",
        f"{p['flush_ms_median']:.0f} / {p['flush_ms_max']:.0f}",
        f"{p['migrate_s']:.0f}" if "migrate_s" in p else "",
        f"{p['due'][0]:,} / {p['rest'][0]:,}"]
        for (store, version), points in results.items() for p in points]
    print_table(["store", "code", "pages", "10,000 due pages s", "summaries s",
                 "crawl start s", "redis CPU s", "redis CPU us/page write (per node)",
                 "B/page", "write pages/s",
                 "flush ms (median / max)", "migration s", "due / not due"], rows)
    single = {p["pages"]: p for p in results.get(("redis", "new"), [])}
    cluster_points = [(which, p) for which in ("old", "new")
                      for p in results.get(("cluster", which), [])]
    for which, p in cluster_points:
        one = single.get(p["pages"])
        nodes = p.get("write_cpu_us_per_node", [])
        if one is None or not nodes or not one.get("write_cpu_us_per_node"):
            continue
        alone = one["write_cpu_us_per_node"][0]
        # Each primary runs its commands on one thread: the busiest one's
        # CPU per page written bounds the cluster's write rate, as one
        # server's CPU per page bounds its own. Three primaries sharing the
        # writes evenly, each at no more CPU per page it serves than one
        # server, would take 3x the writes.
        scale = alone / max(nodes)
        code = "this tree" if which == "new" else (args.start_cluster_ref or "")[:10]
        print(f"cluster ({code}) at {p['pages']:,} pages: server CPU per page write "
              f"{sum(nodes):.0f} us "
              f"over {len(nodes)} primaries ({' / '.join(f'{us:.0f}' for us in nodes)}), "
              f"one server {alone:.0f} us: the cluster's write rate bound by its busiest "
              f"primary is {scale:.2f}x one server's (target ~{len(nodes)}x): "
              f"{verdict(scale >= 0.9 * len(nodes))}; bytes/page {p['bytes_per_page']:.0f} "
              f"(target <= 210): {verdict(p['bytes_per_page'] <= 210)}")
    for store in ("sqlite", "redis", "cluster"):
        new, old = results.get((store, "new"), []), results.get((store, "old"), [])
        for o in old:
            n = next((p for p in new if p["pages"] == o["pages"]), None)
            if n is None:
                continue
            same = (n["due"], n["rest"]) == (o["due"], o["rest"])
            print(f"{store} at {o['pages']:,} pages, new / old: crawl start "
                  f"{ratio(n['start_s'], o['start_s'])}, 10,000 due pages "
                  f"{ratio(n['due_read_s'], o['due_read_s'])}, summaries "
                  f"{ratio(n['summaries_s'], o['summaries_s'])}, bytes/page "
                  f"{ratio(n['bytes_per_page'], o['bytes_per_page'])}, write pages/s "
                  f"{ratio(n['write_pages_per_s'], o['write_pages_per_s'])}; the same "
                  f"figures (due, not due: pages, bytes, first due): {verdict(same)}")
        if new:
            small, big = new[0], new[-1]
            growth = big["start_s"] / small["start_s"]
            print(f"{store} crawl start at {big['pages']:,} pages: {big['start_s']:.2f} s "
                  f"(target <= {START_TARGET_S} s), {growth:.1f}x its {small['pages']:,}-page "
                  f"figure (target <= {START_TARGET_GROWTH}x): "
                  f"{verdict(big['start_s'] <= START_TARGET_S and growth <= START_TARGET_GROWTH)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, nargs="+", default=[10_000, 100_000, 1_000_000],
                   help="sizes measured, state alone (10000 100000 1000000)")
    p.add_argument("--big", action="store_true", help="add 3,000,000 pages (~10 minutes more)")
    p.add_argument("--items-pages", type=int, nargs="*", default=[10_000, 100_000],
                   help="sizes measured with items and history (10000 100000; none: skip)")
    p.add_argument("--hosts", type=int, default=10, help="hosts the pages are on (10)")
    p.add_argument("--long-share", type=float, default=0.02,
                   help="share of URLs longer than 100 characters (0.02)")
    p.add_argument("--shape", choices=("crawl", "filler"), default="crawl",
                   help="pages as a sitemap crawl stores them, or redis_store.py's filler")
    p.add_argument("--baseline-ref", help="git commit of the layout-2 store (found by default)")
    p.add_argument("--crawl-start", action="store_true",
                   help="measure the crawl-start cost only (old and new code side by side)")
    p.add_argument("--start-pages", type=int, nargs="+",
                   default=[100_000, 1_000_000, 10_000_000],
                   help="sizes of the crawl-start run, this tree (100000 1000000 10000000)")
    p.add_argument("--start-old-pages", type=int, nargs="*", default=[100_000, 1_000_000],
                   help="sizes of the crawl-start run, the base commit (100000 1000000)")
    p.add_argument("--start-cluster-pages", type=int, nargs="*", default=[100_000, 1_000_000],
                   help="sizes of the crawl-start run on a 3-node Redis Cluster, this tree "
                        "(100000 1000000)")
    p.add_argument("--start-ref", default=BASE_REF, help="the base commit (old code)")
    p.add_argument("--start-cluster-ref",
                   help="a commit whose code the cluster runs too, at --start-cluster-pages, "
                        "beside this tree's (none: this tree only)")
    p.add_argument("--start-bulk-from", type=int, default=2_000_000,
                   help="sizes from this one up are written by the bulk path (2000000)")
    args = p.parse_args(argv)
    if args.crawl_start:
        if shutil.which("redis-server") is None:
            raise SystemExit("redis-server is not on PATH")
        return crawl_start_run(args)
    sizes = sorted(set(args.pages + ([3_000_000] if args.big else [])))
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not on PATH")

    with tempfile.TemporaryDirectory(prefix="bench-capacity-") as tmp:
        work = Path(tmp)
        baseline, why = baseline_class(args.baseline_ref, work)
        if baseline is None:
            print(f"baseline (layout 2) unavailable: {why}; measuring ours only")
        else:
            print(f"baseline: layout 2 from git {why}")
        state = run_variant(args, sizes, items=False, baseline=baseline, work=work)
        items = (run_variant(args, sorted(args.items_pages), items=True, baseline=baseline,
                             work=work) if args.items_pages else None)

    print(f"capacity: pages of shape {args.shape!r} on {args.hosts} hosts, flush every "
          f"{BATCH} writes, redis-server 127.0.0.1 (AOF everysec), ratios redis-3/redis-2")
    print_points("State alone:", state, items=False)
    enc = state["redis-3"][-1].extra.get("encodings", {})
    print("redis-3 key encodings at the largest size: "
          + ", ".join(f"{k} {v:,}" for k, v in sorted(enc.items())))
    for name in ("sqlite", "redis-2", "redis-3"):
        point = state.get(name, [None])[-1]
        if point is not None and "summary_s" in point.extra:
            cpu = (f" (redis-server CPU {point.extra['reseed_cpu']:.1f} s)"
                   if "reseed_cpu" in point.extra else "")
            print(f"{name} at {point.pages:,} pages, every page due: the first 10,000 due "
                  f"pages (get_due x10) {point.extra['get_due_s']:.2f} s; summarize_pages "
                  f"{point.extra['summary_s']:.1f} s{cpu}")
    print()
    if items is not None:
        print_points(f"With items and history ({VERSIONS} versions of an item a page, "
                     "INCREMENTAL_ITEM_HISTORY=10):", items, items=True)
        print()
    capacity_table(state, args)
    print()
    ours = state["redis-3"][-1]
    bpp = ours.bytes / ours.pages
    if "redis-2" in state:
        old = state["redis-2"][-1]
        share = ours.bytes / old.bytes
        print(f"Redis bytes per page, state alone, at {ours.pages:,} pages: {bpp:.0f} B vs "
              f"{old.bytes / old.pages:.0f} B = {share:.3f}x (target <= 0.5x and <= "
              f"{TARGET_BYTES} B: {verdict(share <= 0.5 and bpp <= TARGET_BYTES)})")
    else:
        print(f"Redis bytes per page, state alone, at {ours.pages:,} pages: {bpp:.0f} B "
              f"(target <= {TARGET_BYTES} B: {verdict(bpp <= TARGET_BYTES)}; no baseline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
