"""A state store's server that is full, restarted or shared: real crawls.

Each Redis here is a throwaway ``redis-server`` of the test's own
(:class:`OwnRedis`: a memory limit, AOF, a restart), never the shared one.
What the guide promises ("When a crawl cannot go on"): a crawl that cannot
go on stops with one ERROR line naming the cause and exits 1, nothing not
stored is recorded as done; one that can go on (a Redis back within the
bound) goes on as if nothing happened.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
import redis
from scrapy.settings import Settings
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from incremental_crawler import clock
from incremental_crawler.fatal import FATAL_STATUS, exit_status
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from incremental_crawler.state.records import PageKey
from incremental_crawler.state.stores.redis import RedisStateStore
from incremental_crawler.state.stores.redis import layout as redis_layout
from tests.clock_util import later
from tests.redis_util import OwnRedis
from tests.scrapy_cli import run
from tests.test_fatal import crawl_args, one_error_line
from tests.test_kill9 import start_crawl
from tests.test_store_contract import call, full_state

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.redis_cluster_util import LoopbackCluster

PREFIX = "faults"
#: A crawl's (or a store's) setting that opens the store on a Redis Cluster.
ON_CLUSTER = {"INCREMENTAL_STATE_ON_REDIS_CLUSTER": True}
OOM = ("Redis is out of memory (OOM: its used memory is above its maxmemory, and "
       "maxmemory-policy noeviction refuses writes)")


@pytest.fixture
def small_redis() -> Iterator[OwnRedis]:
    """A Redis with a 2 MB limit that refuses writes beyond it."""
    server = OwnRedis("--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
    server.start()
    yield server
    server.remove()


def used_memory(server: OwnRedis) -> tuple[int, int]:
    with server.client() as client:
        memory = client.info("memory")
    return int(memory["used_memory"]), int(memory["maxmemory"])


def store_settings(server: OwnRedis, *, batch: int, flush: float) -> dict[str, Any]:
    """A crawl's settings for a Redis state store on *server*, flushing often."""
    return {"INCREMENTAL_STATE_URI": f"{server.uri}&prefix={PREFIX}",
            "INCREMENTAL_BATCH_SIZE": batch, "INCREMENTAL_FLUSH_INTERVAL": flush,
            "CONCURRENT_REQUESTS": 4}


# -- Redis at its memory limit ------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_redis_at_its_memory_limit_stops_the_crawl_naming_oom(
    site, crawl, small_redis: OwnRedis, caplog: pytest.LogCaptureFixture
) -> None:
    # 150 items of ~20 kB each: 3 MB of text, more than the 2 MB Redis holds.
    paths = site.add_pages(150, size=20_000)
    settings = store_settings(small_redis, batch=10, flush=0.05)
    with caplog.at_level(logging.ERROR):
        crawler = await crawl(SitemapPagesSpider, settings=settings,
                              sitemap_url=site.url("/sitemap.xml"))
    assert crawler.stats.get_value("finish_reason") == "incremental_store_error"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors, "no ERROR line"
    assert errors[0] == (
        f"State store {small_redis.uri}&prefix={PREFIX}: {OOM}; nothing more was written: "
        "free memory in Redis or raise its maxmemory, then re-run; stopping the crawl "
        "(nothing not stored is recorded as done)"), errors
    assert not any("Error processing" in m for m in errors), errors

    # Every flush after the limit was refused whole: no page ahead of its
    # items, and the store still opens and reads.
    store = RedisStateStore(small_redis.uri, prefix=PREFIX)
    try:
        stored = await call(store.get_pages([PageKey("sitemap", site.url(p)) for p in paths]))
        assert 0 < len(stored) < len(paths)
        for key in stored:
            assert await call(store.get_item_fingerprint("sitemap", key.url)) is not None, key
    finally:
        await call(store.close())


def test_a_redis_out_of_memory_at_start_is_one_line_naming_oom(small_redis: OwnRedis) -> None:
    # Filled to its limit by something else, then the limit lowered a little
    # (as an operator may): Redis is above maxmemory and refuses writes.
    with small_redis.client() as client:
        for n in range(1_000):
            try:
                client.set(f"other:{n}", "x" * 10_000)
            except redis.exceptions.OutOfMemoryError:
                break
        client.config_set("maxmemory", str(used_memory(small_redis)[0] - 50_000))
    uri = f"{small_redis.uri}&prefix={PREFIX}"
    result = run(crawl_args(f"INCREMENTAL_STATE_URI={uri}"))
    assert result.returncode == 1, result.stderr
    line = one_error_line(result)
    assert line.startswith(f"State store {small_redis.uri}&prefix={PREFIX}: {OOM}"), line
    assert "cannot be reached" not in line
    with small_redis.client() as client:
        assert not client.keys(f"{PREFIX}:*")  # nothing written


# -- Redis made to evict during the crawl ---------------------------------------------


@pytest.fixture(params=["one-server", "cluster"])
def evictable(request: pytest.FixtureRequest) -> Iterator[tuple[str, redis.Redis, str]]:
    """A store's URI (a prefix of the test's own), a client of the node
    whose eviction policy the test changes, and what the store's errors
    call that node: a throwaway Redis, or one primary of the test cluster
    (its policy restored afterwards, its keys of the prefix deleted)."""
    if request.param == "one-server":
        server = OwnRedis("--maxmemory-policy", "noeviction")
        server.start()
        try:
            with server.client() as client:
                yield f"{server.uri}&prefix={PREFIX}", client, "Redis"
        finally:
            server.remove()
        return
    cluster: LoopbackCluster = request.getfixturevalue("redis_cluster")
    prefix = f"test-evict-{os.getpid()}-{id(request)}"
    with cluster.node(cluster.ports[-1]) as client:
        kept = (client.config_get("maxmemory")["maxmemory"],
                client.config_get("maxmemory-policy")["maxmemory-policy"])
        try:
            yield f"{cluster.url}?prefix={prefix}", client, "a node of the cluster"
        finally:
            client.config_set("maxmemory", kept[0])
            client.config_set("maxmemory-policy", kept[1])
            cluster.delete(f"{prefix}:*")


async def until_stored(uri: str, keys: list[PageKey]) -> None:
    """Until the store at *uri* holds every page of *keys* (bounded: a minute)."""
    store = RedisStateStore.from_uri(uri, settings=Settings(ON_CLUSTER))
    try:
        for _ in range(6_000):
            if len(await call(store.get_pages(keys))) == len(keys):
                return
            await deferLater(reactor, 0.01)
        pytest.fail("the pages were not stored")
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_redis_made_to_evict_during_the_crawl_stops_it_with_nothing_more_written(
    site, crawl, evictable: tuple[str, redis.Redis, str], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An operator (or a failover to a replica configured otherwise) sets
    an evicting policy and a maxmemory on Redis (on one primary of a
    cluster) mid-crawl: the next flush past the check's interval finds it
    and the crawl stops with the error the store gives on opening, the
    pages answered since not written."""
    uri, node, where = evictable
    before = [f"/a/{n:04d}" for n in range(4)]
    after = [f"/p/{n:04d}" for n in range(4)]
    for path in before + after:
        site.add_page(path, "strong", size=1500)
    site.hold("/p/")
    settings = {"INCREMENTAL_STATE_URI": uri, **ON_CLUSTER,
                "INCREMENTAL_BATCH_SIZE": 1, "INCREMENTAL_FLUSH_INTERVAL": 0.02}
    with caplog.at_level(logging.ERROR):
        running = ensureDeferred(crawl(SitemapPagesSpider, settings=settings,
                                       sitemap_url=site.url("/sitemap.xml")))
        try:
            await until_held(site, requests=len(after))
            await until_stored(uri, [PageKey("sitemap", site.url(p)) for p in before])
            node.config_set("maxmemory-policy", "allkeys-lru")
            node.config_set("maxmemory", str(1 << 30))
            # The check's interval over from here (rather than a minute waited).
            monkeypatch.setattr(redis_layout, "EVICTION_RECHECK", 0.0, raising=False)
        finally:
            site.release()
        crawler = await running

    # Stopped with the error, or (the pages' last answers came first) its
    # last flush refused at its close: fatal either way.
    assert crawler.stats.get_value("incremental/store_errors", 0) >= 1
    assert exit_status(crawler) == FATAL_STATUS
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors, "no ERROR line"
    assert errors[0].startswith(
        f"State store {uri}: {where} evicts keys when full (maxmemory-policy allkeys-lru, "
        f"maxmemory {1 << 30}): "), errors
    assert errors[0].endswith("; stopping the crawl (nothing not stored is recorded as done)")
    # Nothing of the pages answered since was written; those before stay.
    node.config_set("maxmemory-policy", "noeviction")
    store = RedisStateStore.from_uri(uri, settings=Settings(ON_CLUSTER))
    try:
        stored = await call(store.get_pages(
            [PageKey("sitemap", site.url(p)) for p in before + after]))
        assert sorted(key.url for key in stored) == [site.url(p) for p in before]
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_redis_refusing_info_during_the_crawl_is_warned_of_and_written_to(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """INFO refused after the store opened (an ACL changed): the eviction
    policy cannot be checked again; said once, the flushes go on."""
    server = OwnRedis()
    server.start()
    try:
        store = RedisStateStore(server.uri, prefix=PREFIX)
        try:
            with server.client() as client:
                client.execute_command("ACL", "SETUSER", "default", "-info")
            monkeypatch.setattr(redis_layout, "EVICTION_RECHECK", 0.0)
            key = PageKey("sitemap", "https://a.example/p")
            with caplog.at_level(logging.WARNING):
                for n in range(2):
                    store.stage_page(full_state(key, n + 1))
                    assert await call(store.flush()) == 1
            said = [r.getMessage() for r in caplog.records if "refused INFO" in r.getMessage()]
            assert len(said) == 1, said
            assert "is not checked during the crawl" in said[0]
            assert (await call(store.get_page(key))).checks == 2
        finally:
            await call(store.close())
    finally:
        server.remove()


def count_info(monkeypatch: pytest.MonkeyPatch, store: RedisStateStore,
               failures: list[Exception] | None = None) -> list[str]:
    """Count the store's INFO commands (the sections asked, one a call);
    the first ones raise *failures*, in order."""
    asked: list[str] = []
    info = store._async.info
    failing = list(failures or [])

    async def counted(*args: Any, **kwargs: Any) -> Any:
        asked.append(args[0] if args else "")
        if failing:
            raise failing.pop(0)
        return await info(*args, **kwargs)

    monkeypatch.setattr(store._async, "info", counted)
    return asked


@pytest_twisted.ensureDeferred
async def test_the_eviction_recheck_asks_info_at_most_once_an_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Flushes within the recheck's interval ask INFO once (the first past
    it); the next flush past it asks again. (The interval is made long and
    the last check moved back past it: nothing waits.)"""
    server = OwnRedis()
    server.start()
    try:
        store = RedisStateStore(server.uri, prefix=PREFIX)
        try:
            asked = count_info(monkeypatch, store)
            monkeypatch.setattr(redis_layout, "EVICTION_RECHECK", 3_600.0)
            store._eviction_checked -= 7_200
            key = PageKey("sitemap", "https://a.example/p")
            for n in range(3):
                store.stage_page(full_state(key, n + 1))
                assert await call(store.flush()) == 1
            assert asked == ["memory"]
            store._eviction_checked -= 7_200
            store.stage_page(full_state(key, 4))
            assert await call(store.flush()) == 1
            assert asked == ["memory", "memory"]
        finally:
            await call(store.close())
    finally:
        server.remove()


@pytest_twisted.ensureDeferred
async def test_the_eviction_recheck_is_not_silenced_by_a_wall_clock_set_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The recheck's interval is told on the monotonic clock: the wall
    clock set back a day after the store opened does not put it off."""
    server = OwnRedis()
    server.start()
    try:
        store = RedisStateStore(server.uri, prefix=PREFIX)
        try:
            asked = count_info(monkeypatch, store)
            monkeypatch.setattr(redis_layout, "EVICTION_RECHECK", 0.0)
            later(monkeypatch, -1)
            store.stage_page(full_state(PageKey("sitemap", "https://a.example/p"), 1))
            assert await call(store.flush()) == 1
            assert asked == ["memory"]
        finally:
            await call(store.close())
    finally:
        server.remove()


@pytest.mark.parametrize("failover", [
    redis.exceptions.MasterDownError(
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is no"),
    redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
    redis.exceptions.TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
], ids=["masterdown", "clusterdown", "tryagain"])
@pytest_twisted.ensureDeferred
async def test_a_failover_met_by_the_eviction_recheck_is_no_refusal_and_checked_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    failover: redis.exceptions.ResponseError,
) -> None:
    """INFO meeting a failover under way (a ResponseError in redis-py, as
    an ACL's refusal is) is not taken for INFO refused: nothing warned,
    the flush goes on, and the next flush checks the policy."""
    server = OwnRedis()
    server.start()
    try:
        store = RedisStateStore(server.uri, prefix=PREFIX)
        try:
            asked = count_info(monkeypatch, store, [failover])
            monkeypatch.setattr(redis_layout, "EVICTION_RECHECK", 3_600.0)
            store._eviction_checked -= 7_200
            key = PageKey("sitemap", "https://a.example/p")
            with caplog.at_level(logging.INFO):
                for n in range(3):
                    store.stage_page(full_state(key, n + 1))
                    assert await call(store.flush()) == 1
            # Failed, asked again by the next flush, then not within the interval.
            assert asked == ["memory", "memory"]
            said = [r.getMessage() for r in caplog.records
                    if "INFO" in r.getMessage() or "eviction policy" in r.getMessage()]
            assert len(said) == 1, said
            assert "could not be checked now" in said[0] and "the next flush checks it" in said[0]
            assert not store._eviction_unread_said
            assert (await call(store.get_page(key))).checks == 3
        finally:
            await call(store.close())
    finally:
        server.remove()


# -- two crawls of one scope at once --------------------------------------------


async def until_held(site, *, requests: int = 1) -> None:
    """Until the site holds *requests* answers (bounded: a minute)."""
    for _ in range(12_000):
        if site.held >= requests:
            return
        await deferLater(reactor, 0.005)
    pytest.fail("the crawl sent no request")


@pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_second_crawl_of_a_held_scope_refuses_to_start_naming_the_holder(
    site, crawl, state_uri: str, state_store
) -> None:
    paths = [f"/p/{i:04d}" for i in range(20)]
    for path in paths:
        site.add_page(path, "strong", size=1500)
    site.hold("/p/")
    first = ensureDeferred(crawl(SitemapPagesSpider, sitemap_url=site.url("/robots.txt")))
    try:
        await until_held(site)
        second = start_crawl(site, state_uri)
        try:
            # Bounded: a second crawl that starts waits on the held pages.
            _, stderr = await deferToThread(second.communicate, timeout=60)
        except subprocess.TimeoutExpired:
            second.kill()
            await deferToThread(second.communicate)
            pytest.fail("the second crawl started")
    finally:
        site.release()
    crawler = await first

    assert second.returncode == 1, stderr.decode()
    result = subprocess.CompletedProcess([], 1, "", stderr.decode())
    line = one_error_line(result)
    holder = f"{socket.gethostname()}:{os.getpid()}"
    assert line.startswith(f"State store {state_store.location}: scope 'sitemap' is held by "
                           f"crawl {holder} (its hold lapses in "), line
    assert "two crawls of one scope at once would fetch every page" in line, line
    # The first crawl went on alone: every page fetched once, stored once.
    assert crawler.stats.get_value("finish_reason") == "finished"
    fetched = [r.path for r in site.log if r.path.startswith("/p/")]
    assert sorted(fetched) == paths
    assert len(crawler.collected) == len(paths)
    versions = list(state_store.iter_versions("sitemap"))
    assert sorted((v.key, v.version, v.change) for v in versions) == [
        (site.url(p), 1, "new") for p in paths]
    assert state_store.scope_holders("sitemap", clock.now()) == {}  # released


@pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_the_hold_of_a_crawl_killed_by_kill_9_is_taken_over_at_once(
    site, crawl, state_uri: str, state_store
) -> None:
    paths = [f"/p/{i:04d}" for i in range(20)]
    for path in paths:
        site.add_page(path, "strong", size=1500)
    site.hold("/p/")
    killed = start_crawl(site, state_uri)
    try:
        await until_held(site)
        os.kill(killed.pid, signal.SIGKILL)
        await deferToThread(killed.communicate)
    finally:
        site.release()
    # Its hold is still there, for most of a minute more.
    assert list(state_store.scope_holders("sitemap", clock.now())) == [
        f"{socket.gethostname()}:{killed.pid}"]

    crawler = await crawl(SitemapPagesSpider, sitemap_url=site.url("/robots.txt"))
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert len(crawler.collected) == len(paths)


# -- Redis restarted, or gone, while a crawl runs -----------------------------------


@pytest.fixture
def aof_redis() -> Iterator[OwnRedis]:
    """A Redis that keeps its data across a restart (AOF on)."""
    server = OwnRedis("--appendonly", "yes")
    server.start()
    yield server
    server.remove()


async def restart(server: OwnRedis, seconds: float) -> None:
    """Shut *server* down gracefully, and start it again *seconds* later."""
    await deferToThread(server.shut_down)
    await deferLater(reactor, seconds)
    await deferToThread(server.start)


@pytest_twisted.ensureDeferred
async def test_a_crawl_goes_on_across_a_restart_of_its_redis(
    site, crawl, aof_redis: OwnRedis, caplog: pytest.LogCaptureFixture
) -> None:
    paths = site.add_pages(40)
    settings = store_settings(aof_redis, batch=4, flush=0.02)
    site.slow("/p/", 0.05)
    site.hold("/p/")
    with caplog.at_level(logging.WARNING):
        running = ensureDeferred(crawl(SitemapPagesSpider, settings=settings,
                                       sitemap_url=site.url("/robots.txt")))
        try:
            await until_held(site, requests=4)
        finally:
            site.release()
        # Down while answers, items and flushes are in flight, and for a second.
        await restart(aof_redis, 1.0)
        crawler = await running

    assert crawler.stats.get_value("finish_reason") == "finished"
    problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert problems == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and r.getMessage().startswith(f"State store {settings['INCREMENTAL_STATE_URI']}")]
    assert any("Redis does not answer" in m for m in warnings), warnings
    assert any("Redis answers again" in m for m in warnings), warnings
    # Every page fetched once; every item stored exactly once, as new.
    assert sorted(r.path for r in site.log if r.path.startswith("/p/")) == paths
    store = RedisStateStore(aof_redis.uri, prefix=PREFIX)
    try:
        versions = list(store.iter_versions("sitemap"))
        assert sorted((v.key, v.version, v.change) for v in versions) == [
            (site.url(p), 1, "new") for p in paths]
        stored = await call(store.get_pages([PageKey("sitemap", site.url(p)) for p in paths]))
        assert len(stored) == len(paths)
        assert all(state.checks == 1 for state in stored.values())
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_redis_that_stays_away_stops_the_crawl_with_one_line(
    site, aof_redis: OwnRedis
) -> None:
    for i in range(20):
        site.add_page(f"/p/{i:04d}", "strong", size=1500)
    uri = f"{aof_redis.uri}&prefix={PREFIX}"
    site.hold("/p/")
    proc = start_crawl(site, uri, "-s", "INCREMENTAL_REDIS_RETRY_TIME=1")
    try:
        await until_held(site)
        await deferToThread(aof_redis.shut_down)  # and not started again
    finally:
        site.release()
    _, stderr = await deferToThread(proc.communicate, timeout=120)
    result = subprocess.CompletedProcess([], proc.returncode, "", stderr.decode())
    assert proc.returncode == 1, result.stderr
    line = one_error_line(result)
    assert line.startswith(f"State store {uri}: Redis has not answered for 1 s "
                           "(INCREMENTAL_REDIS_RETRY_TIME): "), line
    assert line.endswith("; stopping the crawl (nothing not stored is recorded as done)"), line
