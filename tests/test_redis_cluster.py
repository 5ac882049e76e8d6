"""Cluster mode and the shared budget on a real Redis Cluster.

Three ``redis-server --cluster-enabled yes`` primaries on loopback ports,
started once for the session (:mod:`tests.redis_cluster_util`). The
coordination keys, scrapy-redis's queue and dupefilter and the shared
budget run on the cluster; so does the state store (its cluster layout)
when it follows the cluster's URL. Most crawls here keep their store on the
shared standalone Redis; one keeps it on the cluster (the store's own
tests on the cluster are ``tests/test_redis_cluster_store.py`` and the
store contract).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_twisted
import redis
from redis.crc import key_slot
from scrapy import Request, Spider
from scrapy.extension import ExtensionManager
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.test import get_crawler
from scrapy_redis import defaults as scrapy_redis_defaults
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from incremental_crawler.change.accounting import PageOutcome, ScheduleCounter, Why
from incremental_crawler.cluster.coordinator import ClusterCoordinator, ClusterError
from incremental_crawler.cluster.scheduler import ClusterDupeFilter
from incremental_crawler.config import DEFAULT_SETTINGS
from incremental_crawler.politeness.budget import SharedBudget
from incremental_crawler.politeness.window import WindowPolicy
from incremental_crawler.redis_cluster import AnyRedis, SyncClusterClient, connect
from incremental_crawler.report.extension import summarize
from incremental_crawler.state.records import PageKey
from incremental_crawler.state.stores.redis import RedisStateStore
from incremental_crawler.state.stores.redis.pages import host_part, page_field
from tests.cluster_worker import crawl_in_process
from tests.redis_cluster_util import LoopbackCluster, free_ports
from tests.redis_util import REDIS_URI
from tests.scrapy_cli import scrapy_in_process, start_scrapy
from tests.spiders import ListSpider
from tests.test_cluster import Worker, page_gets, until, until_all_have_work
from tests.test_fatal import one_error_line
from tests.test_shared_budget import (
    BURST,
    RATE,
    START,
    add_worker_pages,
    busiest_second,
    run_workers,
    shared_stats,
)

PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture
def prefix(redis_cluster):
    """A key prefix of the test's own on the cluster; its keys deleted afterwards."""
    name = f"test-rc-{time.monotonic_ns()}"
    yield name
    redis_cluster.delete(f"{name}*")


@pytest.fixture
def store_uri(redis_prefix: str) -> str:
    """The crawls' state store: the standalone Redis, a prefix of the test's own."""
    return f"{REDIS_URI}?prefix={redis_prefix}"


def on_cluster(cluster, *extra: str) -> tuple[str, ...]:
    return ("-s", f"INCREMENTAL_CLUSTER_URL={cluster.url}", *extra)


# -- the client: one server or a cluster -------------------------------------------


def writes_on_three_nodes(client: SyncClusterClient, prefix: str) -> bool:
    """Keys a, b and c under *prefix* (three slots, one on each node of the
    test cluster) written and deleted through *client*."""
    for key in ("a", "b", "c"):
        client.set(f"{prefix}:{key}", 1)
    return client.delete(*(f"{prefix}:{k}" for k in "abc")) == 3


def test_a_node_of_a_cluster_gives_the_cluster_client_and_one_server_its_own(redis_cluster):
    for url in (redis_cluster.url, redis_cluster.seeds_url):
        client = connect(url)
        try:
            assert isinstance(client, SyncClusterClient), url
            # Keys of three slots on three nodes, through one client.
            assert writes_on_three_nodes(client, "test-rc-client")
        finally:
            client.close()
    client = connect(REDIS_URI)
    try:
        assert type(client) is redis.Redis
    finally:
        client.close()
    # A cluster has only db 0: a node named with another is refused, clearly.
    node_db = redis_cluster.url.removesuffix("/0") + "/9"
    with pytest.raises(ValueError, match=r"is a node of a Redis Cluster, which has only "
                                         r"database 0, not 9"):
        connect(node_db)


def test_scrapy_redis_default_params_build_the_cluster_client_without_a_deprecation(
    redis_cluster,
):
    # scrapy-redis passes its default REDIS_PARAMS (retry_on_timeout among
    # them) to the client class the add-on names; redis-py's cluster client
    # hands its kwargs to the client it builds for each node, where
    # retry_on_timeout is deprecated (an error once redis-py drops it).
    assert "retry_on_timeout" in scrapy_redis_defaults.REDIS_PARAMS
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # whatever the test run's own filters
        for url in (redis_cluster.url, redis_cluster.seeds_url):
            client = AnyRedis.from_url(url, **scrapy_redis_defaults.REDIS_PARAMS)
            try:
                assert isinstance(client, SyncClusterClient), url
                # Keys of three slots on three nodes: each node's client used.
                assert writes_on_three_nodes(client, "test-rc-params")
            finally:
                client.close()


# -- the coordinator's scripts on the cluster ---------------------------------------


def coordinator(cluster, prefix: str, **settings) -> ClusterCoordinator:
    crawler = get_crawler(Spider, {
        **DEFAULT_SETTINGS, "INCREMENTAL_CLUSTER_URL": cluster.url,
        "INCREMENTAL_CLUSTER_PREFIX": prefix, **settings})
    crawler.engine = SimpleNamespace(_slot=None)  # nothing in progress
    made = ClusterCoordinator.from_crawler(crawler)
    crawler.extensions = ExtensionManager(made, crawler=crawler)
    return made


def test_the_dupefilter_and_the_run_live_in_one_slot_of_the_cluster(redis_cluster, prefix):
    spider = Spider("dupes")
    worker = coordinator(redis_cluster, prefix)
    spider.crawler, spider.settings = worker.crawler, worker.crawler.settings
    worker.join(spider)
    try:
        dupefilter = ClusterDupeFilter.from_spider(spider)
        assert not dupefilter.request_seen(Request("http://127.0.0.1/a?b=2&a=1"))
        assert dupefilter.request_seen(Request("http://127.0.0.1/a?a=1&b=2"))
        assert worker.push(None, 0, b"request") is True
        keys = redis_cluster.keys(f"{prefix}:*")
        # The run, its members, its queue and its dupefilter: one slot.
        assert {k.decode() for k in keys} >= {
            f"{prefix}:{{dupes}}:run", f"{prefix}:{{dupes}}:workers",
            f"{prefix}:{{dupes}}:queue", worker.seen_key}
        assert len({key_slot(k) for k in keys}) == 1, keys
        popped = worker.pop()
        assert popped is not None and popped[1] == b"request"
        worker.track(popped[0], Request("http://127.0.0.1/a"))
    finally:
        worker.leave("finished")
    # The last worker out ended the run: nothing of it is left on any node.
    assert redis_cluster.keys(f"{prefix}:*") == []


@pytest_twisted.ensureDeferred
async def test_a_worker_that_joins_later_is_seen_and_a_dead_one_reaped_on_the_cluster(
        redis_cluster, prefix):
    # The heartbeat touches every worker's in-flight hash: declared keys. A
    # worker that joined after the first one's last beat is learned (one
    # more round trip), and when it stops beating its requests go back.
    spider = Spider("members")
    first, second = (coordinator(redis_cluster, prefix, INCREMENTAL_CLUSTER_HEARTBEAT=0.2,
                                 INCREMENTAL_CLUSTER_WORKER_TTL=1) for _ in range(2))
    first.join(spider)
    first._task.stop()  # its beats are the test's own until the wait below
    second.join(spider)
    second._task.stop()  # the second never beats again
    try:
        stats = first.crawler.stats
        assert first._others == []
        assert first.push(None, 0, b"one") and first.push(None, 0, b"two")
        assert second.pop() is not None
        # The second worker holds a request: the cluster is busy for the
        # first, which learns of it (a second round trip, with its keys).
        trips = stats.get_value("cluster/redis_roundtrips")
        assert first._beat_once() is False
        assert stats.get_value("cluster/redis_roundtrips") - trips == 2
        assert first._others == [second.worker_id]
        trips = stats.get_value("cluster/redis_roundtrips")
        assert first._beat_once() is False
        assert stats.get_value("cluster/redis_roundtrips") - trips == 1
        # The second does not beat: dead after 1 s (its last beat set back
        # in Redis: the first, beating, is not silent), its request back in
        # the queue.
        seconds, micros = first.redis.time()
        first.redis.hset(first.key("workers"), second.worker_id, seconds + micros / 1e6 - 2)
        first._beat_once()
        assert stats.get_value("cluster/dead_workers") == 1
        assert stats.get_value("cluster/requeued_from_dead") == 1
        assert first.queued() == 2
        assert first._others == []
    finally:
        second.redis.close()
        first.redis.delete(first.queue_key)
        first.leave("finished")
    assert redis_cluster.keys(f"{prefix}:*") == []


def test_the_worker_ending_a_run_settles_a_killed_workers_counts_on_the_cluster(
        redis_cluster, prefix):
    # The run's plain writes (run_note.lua), its accounting and the end of
    # the run that settles a killed worker's counts (leave.lua, then the
    # counted pages read in chunks): every key in the spider's slot.
    spider = Spider("settle")
    first, second = (coordinator(redis_cluster, prefix, INCREMENTAL_CLUSTER_HEARTBEAT=0.2,
                                 INCREMENTAL_CLUSTER_WORKER_TTL=1) for _ in range(2))
    for worker in (first, second):
        worker.join(spider)
        worker._task.stop()  # beats are the test's own
        worker.counter = ScheduleCounter(worker.crawler.stats)
        worker.counter.run = worker
    page = PageKey("s", "http://127.0.0.1/p")
    try:
        second.note_listing("membership")
        second.counter.requested(Why.DUE, "127.0.0.1", page)
        second.counter.outcome(PageOutcome.NEW, page)
        # The second is killed (it never beats again): dead after 1 s, its
        # last beat set back in Redis; the first's beat reaps it.
        seconds, micros = first.redis.time()
        first.redis.hset(first.key("workers"), second.worker_id, seconds + micros / 1e6 - 2)
        first._beat_once()
        assert first.crawler.stats.get_value("cluster/dead_workers") == 1
    finally:
        second.redis.close()
        first.leave("finished")
    s = summarize(first.crawler.stats.get_stats())
    assert (s["requested"], s["requested_of_killed"], s["pages_new"],
            s["pages_no_outcome"]) == (1, 1, 1, 0), s
    assert redis_cluster.keys(f"{prefix}:*") == []


# -- real workers ------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_workers_share_one_crawl_on_a_redis_cluster(
        site, redis_cluster, prefix, store_uri, tmp_path):
    n = 60
    for i in range(n):
        site.add_page(f"/p/{i:04d}", ("strong", "weak", "lastmod")[i % 3], size=1000)
    site.slow("/p/", 0.05)
    workers = [Worker(site, store_uri, prefix, tmp_path, str(i), *on_cluster(redis_cluster))
               for i in range(2)]
    await until_all_have_work(site, 2)
    # Mid-run, on the cluster: the run's keys, all of one slot (each script
    # runs on one node).
    keys = await deferToThread(redis_cluster.keys, f"{prefix}:*")
    names = {k.decode() for k in keys}
    assert {f"{prefix}:{{sitemap}}:run", f"{prefix}:{{sitemap}}:workers"} <= names, names
    assert len({key_slot(k) for k in keys}) == 1, names
    site.release()
    for worker in workers:
        assert await worker.wait() == 0, worker.tail()
    gets = page_gets(site)
    assert len(gets) == n
    assert max(gets.values()) == 1, [p for p, c in gets.items() if c > 1]
    for path in ("/sitemap_index.xml", "/sitemap-1.xml", "/sitemap-2.xml.gz"):
        assert len(site.requests_for(path)) == 1, path
    per_worker = [worker.urls() for worker in workers]
    assert sorted(u for urls in per_worker for u in urls) == sorted(
        site.url(f"/p/{i:04d}") for i in range(n))
    assert all(per_worker), [len(u) for u in per_worker]
    assert all("is a Redis Cluster" not in w.text() for w in workers)
    # The run ended with its last worker: nothing of it is left on any node.
    assert redis_cluster.keys(f"{prefix}:*") == []
    # A next run (a fresh dupefilter, the cluster named by its seed nodes):
    # test_workers_keep_their_state_store_on_the_cluster.


def crawl_command(site, tmp_path: Path, *settings: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "scrapy", "crawl", "sitemap",
            "-a", f"sitemap_url={site.url('/robots.txt')}", "-s", "LOG_LEVEL=INFO",
            "-s", f"INCREMENTAL_REPORT_DIR={tmp_path / 'reports'}"]
    for setting in settings:
        args += ["-s", setting]
    return subprocess.run(args, cwd=PROJECT, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest_twisted.ensureDeferred
async def test_an_unreachable_redis_cluster_is_one_clear_error_line(site, tmp_path):
    site.add_pages(3, size=500)
    ports = free_ports(2)  # nothing listens there
    url = f"redis+cluster://:secret@127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/"
    result = await deferToThread(
        crawl_command, site, tmp_path, f"INCREMENTAL_CLUSTER_URL={url}",
        f"INCREMENTAL_STATE_URI=sqlite:///{tmp_path / 'state.db'}")
    assert result.returncode == 1, result.stderr[-3000:]
    line = one_error_line(result)
    # The URL as given, its password hidden; what redis-py said.
    assert line.startswith(
        f"INCREMENTAL_CLUSTER_URL redis+cluster://:***@127.0.0.1:{ports[0]},127.0.0.1:"
        f"{ports[1]}/: Redis Cluster: Redis Cluster cannot be connected"), line
    assert "secret" not in result.stderr
    assert site.log == []


@pytest.fixture
def cluster_store(redis_cluster):
    """The state store a cluster crawl keeps on the cluster by itself (it
    follows INCREMENTAL_CLUSTER_URL, under the default prefix); its keys
    deleted from every node afterwards."""
    yield f"{redis_cluster.url}?prefix=incremental"
    redis_cluster.delete("incremental:*")


@pytest_twisted.ensureDeferred
async def test_a_worker_told_to_keep_no_state_store_on_the_cluster_stops_before_writing(
        site, redis_cluster, prefix, tmp_path):
    # With INCREMENTAL_STATE_ON_REDIS_CLUSTER = False a crawl whose store
    # would follow the cluster's URL stops in one line, before anything of
    # the store is written there.
    site.add_page("/p/0000", "strong", size=1000)
    worker = Worker(site, None, prefix, tmp_path, "0", *on_cluster(redis_cluster),
                    "-s", "INCREMENTAL_STATE_ON_REDIS_CLUSTER=False")
    assert await worker.wait() == 1, worker.tail()
    assert "INCREMENTAL_STATE_ON_REDIS_CLUSTER is False" in worker.text()
    assert page_gets(site) == {}
    assert await deferToThread(redis_cluster.keys, "incremental:meta") == []


def marks_and_checks(cluster_store: str) -> tuple[set[int | None], dict[str, float]]:
    """Every scope shard's mark of the sitemap scope, and the pages its
    P:ck notes checked since (member -> last check), all shards'."""
    store = RedisStateStore.from_uri(cluster_store, settings=Settings(
        {"INCREMENTAL_STATE_ON_REDIS_CLUSTER": True}))
    try:
        marks = {None if raw is None else int(raw)
                 for raw in (store._sync.hget(key, "mark")
                             for key in store._shard_keys("nvm", "sitemap"))}
        checks = {member.decode(): score for key in store._shard_keys("ck", "sitemap")
                  for member, score in store._sync.zrange(key, 0, -1, withscores=True)}
        return marks, checks
    finally:
        store._sync.close()


def checked_since(cluster_store: str, mark: int) -> set[str]:
    """The pages of the sitemap scope last checked at or after *mark*, as
    P:ck names them (host part | field)."""
    store = RedisStateStore.from_uri(cluster_store, settings=Settings(
        {"INCREMENTAL_STATE_ON_REDIS_CLUSTER": True}))
    try:
        out = set()
        for state in store.iter_pages("sitemap"):
            if state.callback is not None and state.last_checked >= mark:
                host, field = page_field(state.key)
                out.add(f"{host_part(host)}|{field}")
        return out
    finally:
        store._sync.close()


@pytest_twisted.ensureDeferred
async def test_workers_keep_their_state_store_on_the_cluster(
        site, redis_cluster, prefix, cluster_store, tmp_path):
    """Two runs of two workers whose store follows the cluster's URL. The
    store is spread over the nodes, the commands read it, the next run
    (the cluster named by its seed nodes: a fresh dupefilter) asks the
    changed pages only. Cluster workers take no hold on their scope, so no
    crawl start sets the mark of the checks since (P:nvm 'mark', P:ck):
    the worker that starts a run does, at the run's start. Its summaries
    then take its checks out one by one instead of reading every page, and
    P:ck keeps the current run's checks only (a mark never moved keeps a
    member for every page checked since)."""
    n = 40
    for i in range(n):
        site.add_page(f"/p/{i:04d}", ("strong", "weak", "lastmod")[i % 3], size=1000)
    site.slow("/p/", 0.05)
    before = math.floor(time.time())
    # No INCREMENTAL_STATE_URI: the store follows the cluster's URL.
    workers = [Worker(site, None, prefix, tmp_path, str(i), *on_cluster(redis_cluster))
               for i in range(2)]
    await until_all_have_work(site, 2)
    site.release()
    for worker in workers:
        assert await worker.wait() == 0, worker.tail()
    gets = page_gets(site)
    assert len(gets) == n
    assert max(gets.values()) == 1, [p for p, c in gets.items() if c > 1]
    per_worker = [worker.urls() for worker in workers]
    assert sorted(u for urls in per_worker for u in urls) == sorted(
        site.url(f"/p/{i:04d}") for i in range(n))
    assert all(per_worker), [len(u) for u in per_worker]
    # The state is on the cluster, spread over its nodes (hosts, items).
    keys = await deferToThread(redis_cluster.keys, "incremental:*")
    assert {k.split(b":")[1] for k in keys} >= {b"meta", b"hd", b"items", b"nvs"}
    assert len({redis_cluster.port_of(k.decode()) for k in keys}) == 3
    # One mark, every shard's, at the run's start; P:ck notes its checks.
    marks, checks = await deferToThread(marks_and_checks, cluster_store)
    assert len(marks) == 1 and None not in marks, marks
    [first] = marks
    assert first >= before
    assert set(checks) == await deferToThread(checked_since, cluster_store, first)
    assert len([m for m in checks if "|" in m]) >= n
    # What a command reads of it (no add-on: the same rule finds it).
    result = await deferToThread(scrapy_in_process, "items", "-o",
                                 str(tmp_path / "items.jsonl"), "-s",
                                 f"INCREMENTAL_CLUSTER_URL={redis_cluster.url}")
    assert result.returncode == 0, result.stderr[-3000:]
    exported = [json.loads(line)["url"]
                for line in (tmp_path / "items.jsonl").read_text().splitlines()]
    assert sorted(exported) == sorted(site.url(f"/p/{i:04d}") for i in range(n))
    # (The report's files go to the test's directory, not the project's.)
    for command in (["state"], ["report", "sitemap", "-o", str(tmp_path / "history")]):
        result = await deferToThread(scrapy_in_process, *command, "-s",
                                     f"INCREMENTAL_CLUSTER_URL={redis_cluster.url}")
        assert result.returncode == 0, (command, result.stderr[-3000:])
        assert "sitemap" in result.stdout + result.stderr, command

    # Next run (a second later: its start is past every check of the first,
    # in whole seconds), the cluster named by its seed nodes: a fresh
    # dupefilter, so the changed pages are fetched; the store on the
    # cluster keeps the rest away (their lastmods say so). The mark moves,
    # and the first run's checks of pages not checked again go from P:ck.
    await deferLater(reactor, 1.1)
    changed = set(site.change_fraction(0.2, seed=3))
    site.reset_log()
    site.slow("/p/", 0.0)
    workers = [Worker(site, None, prefix, tmp_path, f"2-{i}",
                      "-s", f"INCREMENTAL_CLUSTER_URL={redis_cluster.seeds_url}",
                      "-s", "INCREMENTAL_LASTMOD_RECHECK_SHARE=0") for i in range(2)]
    for worker in workers:
        assert await worker.wait() == 0, worker.tail()
    assert dict(page_gets(site)) == dict.fromkeys(changed, 1)
    assert redis_cluster.keys(f"{prefix}:*") == []
    marks, checks = await deferToThread(marks_and_checks, cluster_store)
    assert len(marks) == 1 and None not in marks, marks
    [second] = marks
    assert second > first
    assert min(checks.values()) >= second
    assert set(checks) == await deferToThread(checked_since, cluster_store, second)
    assert len(checks) < n
    # A summary of the pages not checked since the run's start can tell
    # from the sums and those checks (None: it would read every page).
    store = RedisStateStore.from_uri(cluster_store, settings=Settings(
        {"INCREMENTAL_STATE_ON_REDIS_CLUSTER": True}))
    try:
        taken_out = await deferred_from_coro(store._shard_checks("sitemap", second))
        assert taken_out is not None and len(taken_out) == len(checks)
    finally:
        await deferred_from_coro(store.close())


async def state_on_cluster(cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``scrapy state ARGS`` on the store a cluster crawl keeps on the cluster."""
    return await deferToThread(scrapy_in_process, "state", *args, "-s",
                               f"INCREMENTAL_CLUSTER_URL={cluster.url}")


async def test_a_repair_is_refused_while_cluster_workers_hold_the_scope_naming_them(
        site, redis_cluster, prefix, cluster_store, tmp_path):
    n = 16
    for i in range(n):
        site.add_page(f"/p/{i:04d}", "strong", size=1000)
    workers = [Worker(site, None, prefix, tmp_path, str(i), *on_cluster(redis_cluster))
               for i in range(2)]
    try:
        await until_all_have_work(site, 2)
        refused = await state_on_cluster(redis_cluster, "forget-host", "127.0.0.1",
                                         "--spider", "sitemap")
    finally:
        site.release()
    for worker in workers:
        assert await worker.wait() == 0, worker.tail()
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith("error: scope 'sitemap' is held by cluster worker "), \
        refused.stderr
    for worker in workers:
        # Named as the cluster knows it.
        [joined] = re.findall(r"worker (\S+) joined run", worker.text())
        assert joined.startswith(f"{socket.gethostname()}:{worker.proc.pid}:"), joined
        assert f"cluster worker {joined} (running, or killed: " in refused.stderr, \
            refused.stderr
    assert refused.stderr.count("cluster worker") == 2, refused.stderr
    # Nothing deleted: the workers stored every page, and release their holds.
    assert sorted(u for worker in workers for u in worker.urls()) == sorted(
        site.url(f"/p/{i:04d}") for i in range(n))
    done = await state_on_cluster(redis_cluster, "forget-host", "127.0.0.1",
                                  "--spider", "sitemap")
    assert done.returncode == 0, done.stderr
    assert re.match(r"forgot host 127\.0\.0\.1 in scope 'sitemap': \d+ pages, \d+ links records?, "
                    f"{n} items, {n} item versions", done.stdout), done.stdout


async def test_a_worker_and_a_crawl_refuse_to_start_while_a_repair_holds_the_scope(
        site, redis_cluster, prefix, cluster_store, tmp_path, monkeypatch):
    n = 6
    for i in range(n):
        site.add_page(f"/p/{i:04d}", "strong", size=1000)
    # The pages stored by a run of one worker (in this process: the fill).
    await crawl_in_process(site, cluster_store, prefix,
                           INCREMENTAL_CLUSTER_URL=redis_cluster.url)
    # The repair waits with the host's pages deleted and its items not yet
    # (the moment a page written beside it would keep validators that say
    # "seen" without its items), holding the scope.
    deleted, go = threading.Event(), threading.Event()
    host_script = RedisStateStore._forget_host_slot

    def then_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        done = host_script(self, *args, **kwargs)
        deleted.set()
        go.wait(60)
        return done

    monkeypatch.setattr(RedisStateStore, "_forget_host_slot", then_wait)
    repair = defer.ensureDeferred(
        state_on_cluster(redis_cluster, "forget-host", "127.0.0.1", "--spider", "sitemap"))
    repairer = f"repair {socket.gethostname()}:{os.getpid()}"
    try:
        assert await deferToThread(deleted.wait, 60)
        site.reset_log()
        worker = Worker(site, None, prefix, tmp_path, "1", *on_cluster(redis_cluster))
        crawl = start_scrapy("crawl", "sitemap", "-a", f"sitemap_url={site.url('/robots.txt')}",
                             "-s", f"INCREMENTAL_STATE_URI={cluster_store}")
        assert await worker.wait() == 1, worker.tail()
        _, stderr = await deferToThread(crawl.communicate, timeout=60)
        for log in (worker.text(), stderr.decode()):
            line = one_error_line(subprocess.CompletedProcess([], 1, "", log))
            assert f"scope 'sitemap' is held by {repairer} (its hold lapses in " in line, line
            assert line.endswith("a crawl beside a repair would write what the repair "
                                 "deletes: wait until it ends"), line
        assert crawl.returncode == 1
        # Nothing asked of the site; the worker joined no run.
        assert site.log == []
        assert await deferToThread(redis_cluster.keys, f"{prefix}:*") == []
    finally:
        go.set()
    done = await repair
    assert done.returncode == 0, done.stderr
    assert re.match(rf"forgot host 127\.0\.0\.1 in scope 'sitemap': \d+ pages, \d+ links "
                    rf"records?, {n} items, {n} item versions", done.stdout), done.stdout
    # Nothing of the host left: the next run finds every page new.
    again = await crawl_in_process(site, cluster_store, prefix,
                                   INCREMENTAL_CLUSTER_URL=redis_cluster.url)
    assert sorted(str(item["url"]) for item in again.collected) == sorted(
        site.url(f"/p/{i:04d}") for i in range(n))
    assert sorted(page_gets(site)) == [f"/p/{i:04d}" for i in range(n)]


def test_the_coordinator_names_an_unreachable_cluster():
    ports = free_ports(1)
    crawler = get_crawler(Spider, {
        **DEFAULT_SETTINGS,
        "INCREMENTAL_CLUSTER_URL": f"redis+cluster://127.0.0.1:{ports[0]}/"})
    with pytest.raises(ClusterError, match=rf"INCREMENTAL_CLUSTER_URL redis\+cluster://"
                                           rf"127\.0\.0\.1:{ports[0]}/: Redis Cluster: "):
        ClusterCoordinator.from_crawler(crawler)


# -- the shared budget on the cluster ------------------------------------------------


class _Stats(dict):
    def inc_value(self, key, count=1):
        self[key] = self.get(key, 0) + count


@pytest_twisted.ensureDeferred
async def test_the_budgets_of_many_slots_spread_over_the_nodes(redis_cluster, prefix):
    # One hash per slot, the only key its script touches: each runs on the
    # node that holds it, the script loaded on every primary.
    hosts = [f"host{i}.example" for i in range(12)]

    async def run() -> list[int]:
        budget = SharedBudget(redis_cluster.url, prefix, stats=_Stats(),
                              on_reply=lambda k, g: None, on_failure=lambda exc: None)
        await budget.open()
        try:
            return [await budget.acquire(host, WindowPolicy(start_rate=10.0), 0.0)
                    for host in hosts]
        finally:
            await budget.close()

    seqs = await defer.Deferred.fromFuture(asyncio.ensure_future(run()))
    assert seqs == [1] * len(hosts)
    holders = set()
    for port in redis_cluster.ports:
        with redis_cluster.node(port) as node:
            found = [k for k in node.scan_iter(match=f"{prefix}:*") if node.exists(k)]
            if found:
                holders.add(port)
    assert len(redis_cluster.keys(f"{prefix}:*")) == len(hosts)
    assert len(holders) == 3, holders


@pytest.mark.alone
@pytest_twisted.ensureDeferred
async def test_three_workers_share_one_window_on_a_redis_cluster(
        site, tmp_path, redis_cluster, prefix):
    # tests/test_shared_budget.py's first test, its budget on the cluster:
    # the site's limit is kept by the three workers together (30 pages, as
    # there).
    lists = add_worker_pages(site, 3, 10)
    limiter = site.limit(rate=RATE, burst=BURST)
    logs = await run_workers(site, tmp_path / "shared", 3,
                             f"INCREMENTAL_THROTTLE_SHARED_URL={redis_cluster.url}",
                             f"INCREMENTAL_THROTTLE_SHARED_PREFIX={prefix}", *START)
    fetched = {r.path for r in site.log if r.status == 200}
    assert all(set(paths) <= fetched for paths in lists)
    n429 = sum(1 for r in site.log if r.status == 429)
    figures = shared_stats(logs)
    assert n429 <= 0.1 * len(site.log)
    assert limiter.broken_promises == 0
    assert busiest_second(site) <= RATE + BURST
    used = figures["acquires"] - figures["tokens_dropped"] - figures["tokens_expired"]
    assert used == figures["requests"]
    # The budget was the cluster's: its slot's hash is there.
    assert f"{prefix}:127.0.0.1".encode() in redis_cluster.keys(f"{prefix}:*")


@pytest_twisted.ensureDeferred
async def test_a_cluster_crawl_with_the_shared_budget_on_the_cluster(
        site, redis_cluster, prefix, store_uri):
    # The throttle on: the budget follows INCREMENTAL_CLUSTER_URL onto the
    # cluster, beside the run's keys. (One worker, in this process.)
    site.add_pages(20, size=500)
    budget = f"{prefix}-budget"
    crawler = await crawl_in_process(
        site, store_uri, prefix, INCREMENTAL_CLUSTER_URL=redis_cluster.url,
        INCREMENTAL_THROTTLE_ENABLED=True, INCREMENTAL_THROTTLE_START_RATE=50,
        INCREMENTAL_THROTTLE_SHARED_PREFIX=budget)
    assert len(page_gets(site)) == 20
    assert crawler.stats.get_value("incremental/throttle/shared/acquires"), (
        crawler.stats.get_stats())
    assert f"{budget}:127.0.0.1".encode() in redis_cluster.keys(f"{budget}:*")
    assert redis_cluster.keys(f"{prefix}:*") == []


@pytest_twisted.ensureDeferred
async def test_a_worker_whose_cluster_node_dies_stops_loudly_by_itself(site, tmp_path):
    # A cluster of the test's own: the node serving the run's slot is shut
    # down mid-crawl (no replica takes over). The worker neither hangs nor
    # crashes on the cluster client's errors: it rides the silence out for
    # INCREMENTAL_REDIS_RETRY_TIME, then stops with one ERROR line.
    site.add_pages(60, size=1000)
    site.slow("/p/", 0.05)
    own = LoopbackCluster()
    await deferToThread(own.start)
    try:
        worker = Worker(site, f"sqlite:///{tmp_path / 'state.db'}", "own", tmp_path, "1",
                        *on_cluster(own, "-s", "INCREMENTAL_CLUSTER_WORKER_TTL=2",
                                    "-s", "INCREMENTAL_REDIS_RETRY_TIME=2"))
        await until(lambda: sum(page_gets(site).values()) >= 15, "the crawl to get going")
        port = await deferToThread(own.port_of, "own:{sitemap}:queue")
        await deferToThread(own.shut_down_node, port)
        assert await worker.wait(timeout=60) == 1, worker.tail()
    finally:
        await deferToThread(own.remove)
    log = worker.text()
    assert "'finish_reason': 'cluster_redis_error'" in log, worker.tail()
    assert "Redis does not answer" in log, worker.tail()
    errors = [line.split("ERROR: ", 1)[1] for line in log.splitlines() if "ERROR:" in line]
    assert len(errors) == 1, errors
    assert errors[0].startswith(
        f"Cluster {own.url}: Redis has not answered for 2 s (INCREMENTAL_REDIS_RETRY_TIME): "
    ), errors
    assert "Traceback" not in log, worker.tail()
    assert len(page_gets(site)) < 60


@pytest_twisted.ensureDeferred
async def test_an_unreachable_budget_cluster_closes_the_crawl_before_any_request(
        site, crawl, caplog):
    site.add_page("/a", "strong", size=500)
    port = free_ports(1)[0]  # nothing listens there
    url = f"redis+cluster://127.0.0.1:{port}/"
    crawler = await crawl(ListSpider, settings={
        "INCREMENTAL_THROTTLE_ENABLED": True, "INCREMENTAL_THROTTLE_SHARED_URL": url},
        urls=[site.url("/a")])
    assert crawler.stats.get_value("finish_reason") == "shared_budget_unavailable"
    assert site.log == []
    assert f"The shared budget at {url} cannot be used (Redis Cluster: " in caplog.text
