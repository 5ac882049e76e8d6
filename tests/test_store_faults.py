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
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
import redis

from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from incremental_crawler.state.records import PageKey
from incremental_crawler.state.stores.redis import RedisStateStore
from tests.redis_util import OwnRedis
from tests.test_fatal import crawl_args, one_error_line, run
from tests.test_store_contract import call

if TYPE_CHECKING:
    from collections.abc import Iterator

PREFIX = "faults"
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


# -- Redis at its memory limit ------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_redis_at_its_memory_limit_stops_the_crawl_naming_oom(
    site, crawl, small_redis: OwnRedis, caplog: pytest.LogCaptureFixture
) -> None:
    # 150 items of ~20 kB each: 3 MB of text, more than the 2 MB Redis holds.
    paths = [f"/p/{i:04d}" for i in range(150)]
    for path in paths:
        site.add_page(path, "strong", size=20_000)
    uri = f"{small_redis.uri}&prefix={PREFIX}"
    settings: dict[str, Any] = {"INCREMENTAL_STATE_URI": uri, "INCREMENTAL_BATCH_SIZE": 10,
                                "INCREMENTAL_FLUSH_INTERVAL": 0.05, "CONCURRENT_REQUESTS": 4}
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
