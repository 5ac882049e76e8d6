"""What only the Redis store does: URIs, its key layout, round-trips, failures.

The backend-neutral behaviour is in ``test_store_contract.py``
(``TestRedisStore``). Tests that stop Redis or count its commands use a
throwaway ``redis-server`` of their own (:class:`OwnRedis`) or cut a proxy
in front of the shared one (:class:`CuttableProxy`), never the shared
server itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
import redis
from scrapy.settings import Settings

from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from incremental_crawler.state.records import Change, ItemRecord, PageFlags, PageKey, PageState
from incremental_crawler.state.stores import StateStoreError, open_store
from incremental_crawler.state.stores.redis import (
    LAYOUT,
    LAYOUT_VERSION,
    RedisStateStore,
    parse_redis_uri,
)
from tests.redis_util import REDIS_URI, CuttableProxy, OwnRedis, prefix_keys
from tests.test_store_contract import SCOPE, URL, call, full_state, item

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    server = OwnRedis()
    server.start()
    yield server
    server.remove()


@pytest.fixture
def shared() -> Iterator[redis.Redis]:
    """A direct client of the tests' db on the shared server."""
    client = redis.Redis.from_url(REDIS_URI)
    yield client
    client.close()


def open_at(prefix: str, uri: str = REDIS_URI) -> RedisStateStore:
    return RedisStateStore(uri, prefix=prefix)


# -- URIs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "clean", "prefix"),
    [
        ("redis://127.0.0.1:6379/9", "redis://127.0.0.1:6379/9", "incremental"),
        ("redis://127.0.0.1/9?prefix=books", "redis://127.0.0.1/9", "books"),
        ("REDIS://h:1/0?prefix=a:b&socket_timeout=2",
         "redis://h:1/0?socket_timeout=2", "a:b"),
        ("rediss://user:pw@h:6380/1?prefix=p", "rediss://user:pw@h:6380/1", "p"),
        ("unix:///run/redis.sock?db=3&prefix=x", "unix:///run/redis.sock?db=3", "x"),
    ],
)
def test_parse_redis_uri(uri: str, clean: str, prefix: str) -> None:
    assert parse_redis_uri(uri) == (clean, prefix)


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("redis://", "no host"),
        ("redis:///9", "no host"),
        ("redis://h/abc", "database 'abc' is not a number"),
        ("unix:///s.sock?db=x", "database 'x' is not a number"),
        ("redis://h:99999/0", "not a valid URI"),
        ("redis://h/0?prefix=", "one non-empty prefix"),
        ("redis://h/0?prefix=a&prefix=b", "one non-empty prefix"),
        ("redis://h/0?colour=blue", "unknown parameter 'colour'"),
        ("unix://", "no socket path"),
        ("http://h/0", "not a Redis one"),
    ],
)
def test_bad_uri_is_a_store_error_naming_it(uri: str, why: str) -> None:
    with pytest.raises(StateStoreError) as info:
        RedisStateStore.from_uri(uri)
    message = str(info.value)
    assert message.startswith(f"State store {uri}")
    assert why in message
    assert "redis://host:port/db?prefix=name" in message


def test_password_never_shows_in_messages() -> None:
    with pytest.raises(StateStoreError) as info:
        RedisStateStore.from_uri("redis://user:s3cret@h:1/x")
    assert "s3cret" not in str(info.value)
    assert "user:***@h:1" in str(info.value)


@pytest_twisted.ensureDeferred
async def test_open_store_picks_redis_by_scheme(redis_prefix: str) -> None:
    uri = f"{REDIS_URI}?prefix={redis_prefix}"
    store = open_store(Settings({"INCREMENTAL_STATE_URI": uri}))
    try:
        assert isinstance(store, RedisStateStore)
        assert store.prefix == redis_prefix
        assert store.location == uri
        assert store.history_limit == 10
    finally:
        await call(store.close())
    store = open_store(Settings({"INCREMENTAL_STATE_URI": uri, "INCREMENTAL_ITEM_HISTORY": "2"}))
    try:
        assert store.history_limit == 2
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_unix_socket_uri(own_redis: OwnRedis) -> None:
    store = RedisStateStore.from_uri(f"{own_redis.uri}&prefix=u")
    try:
        store.stage_page(full_state(PageKey(SCOPE, URL)))
        await call(store.flush())
    finally:
        await call(store.close())
    with own_redis.client() as client:
        assert client.hlen(f"u:pages:{SCOPE}") == 1


def test_unreachable_redis_is_a_store_error_at_open(own_redis: OwnRedis) -> None:
    own_redis.stop()
    with pytest.raises(StateStoreError) as info:
        RedisStateStore.from_uri(f"{own_redis.uri}&prefix=gone")
    message = str(info.value)
    assert own_redis.socket in message and "prefix=gone" in message
    assert "cannot be reached" in message


# -- layout marker ------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_new_store_marks_its_layout(redis_prefix: str, shared: redis.Redis) -> None:
    await call(open_at(redis_prefix).close())
    assert shared.hgetall(f"{redis_prefix}:meta") == {
        b"layout": LAYOUT.encode(), b"version": str(LAYOUT_VERSION).encode(),
        b"gone_due": b"1",  # nothing to add: a new store's gone pages are indexed
    }
    # Reopening an existing store of this layout works.
    await call(open_at(redis_prefix).close())


def test_newer_layout_is_refused_and_left_alone(redis_prefix: str, shared: redis.Redis) -> None:
    meta = f"{redis_prefix}:meta"
    shared.hset(meta, mapping={"layout": LAYOUT, "version": LAYOUT_VERSION + 1})
    shared.hset(f"{redis_prefix}:pages:{SCOPE}", URL, "{}")
    with pytest.raises(StateStoreError) as info:
        open_at(redis_prefix)
    message = str(info.value)
    assert f"prefix={redis_prefix}" in message
    assert f"layout version {LAYOUT_VERSION + 1}" in message
    assert "upgrade incremental_crawler" in message
    assert shared.hget(meta, "version") == str(LAYOUT_VERSION + 1).encode()
    assert shared.hget(f"{redis_prefix}:pages:{SCOPE}", URL) == b"{}"


@pytest.mark.parametrize(
    "foreign",
    [
        {"layout": "somebody.else", "version": "1"},
        {"layout": LAYOUT, "version": "one"},
        {"colour": "blue"},
    ],
)
def test_foreign_meta_is_refused(redis_prefix: str, shared: redis.Redis,
                                 foreign: dict[str, str]) -> None:
    shared.hset(f"{redis_prefix}:meta", mapping=foreign)
    with pytest.raises(StateStoreError) as info:
        open_at(redis_prefix)
    assert "does not describe an incremental_crawler state store" in str(info.value)
    assert f"prefix={redis_prefix}" in str(info.value)
    assert shared.hgetall(f"{redis_prefix}:meta") == {
        k.encode(): v.encode() for k, v in foreign.items()}


def test_meta_of_another_type_is_refused(redis_prefix: str, shared: redis.Redis) -> None:
    shared.set(f"{redis_prefix}:meta", "hello")
    with pytest.raises(StateStoreError) as info:
        open_at(redis_prefix)
    assert "does not describe an incremental_crawler state store" in str(info.value)
    assert shared.get(f"{redis_prefix}:meta") == b"hello"


def test_state_without_meta_is_refused_not_reset(redis_prefix: str, shared: redis.Redis) -> None:
    shared.sadd(f"{redis_prefix}:scopes", SCOPE)
    shared.hset(f"{redis_prefix}:pages:{SCOPE}", URL, "{}")
    with pytest.raises(StateStoreError) as info:
        open_at(redis_prefix)
    assert "holds state keys but no" in str(info.value)
    assert not shared.exists(f"{redis_prefix}:meta")
    assert shared.hget(f"{redis_prefix}:pages:{SCOPE}", URL) == b"{}"


# -- records ------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_records_are_compact_json_and_tolerate_other_fields(
    redis_prefix: str, shared: redis.Redis
) -> None:
    store = open_at(redis_prefix)
    try:
        key = PageKey(SCOPE, URL, "de")
        store.stage_page(PageState(key, etag='"x"', checks=2, last_checked=12.9))
        await call(store.flush())
        [(field, raw)] = shared.hgetall(f"{redis_prefix}:pages:{SCOPE}").items()
        assert field == f"{URL}\0de".encode()
        # Defaults left out; times kept as whole seconds, as SQLite keeps them.
        assert json.loads(raw) == {"etag": '"x"', "checks": 2, "last_checked": 12}

        # A record written by a newer version (an extra field) or an older
        # one (fields missing) reads back with this version's defaults.
        shared.hset(f"{redis_prefix}:pages:{SCOPE}", URL,
                    json.dumps({"fingerprint": "ff", "from_the_future": [1, 2]}))
        assert await call(store.get_page(PageKey(SCOPE, URL))) == PageState(
            PageKey(SCOPE, URL), fingerprint="ff")
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_recipe_is_a_key_of_the_page_record_absent_when_none(
    redis_prefix: str, shared: redis.Redis
) -> None:
    pages = f"{redis_prefix}:pages:{SCOPE}"
    store = open_at(redis_prefix)
    try:
        with_recipe, without = PageKey(SCOPE, f"{URL}/r"), PageKey(SCOPE, URL)
        store.stage_page(PageState(with_recipe, etag='"x"', recipe='{"priority":2}'))
        store.stage_page(PageState(without, etag='"x"'))
        await call(store.flush())
        assert json.loads(shared.hget(pages, f"{URL}/r")) == {
            "etag": '"x"', "recipe": '{"priority":2}'}
        assert json.loads(shared.hget(pages, URL)) == {"etag": '"x"'}

        # A record as the previous layout wrote it (every field but the
        # recipe) reads back whole, with no recipe.
        old = {"etag": '"y"', "last_modified": "Sun", "fingerprint": "ff", "size": 10,
               "last_status": 200, "first_seen": 1, "last_checked": 2, "last_fetched": 3,
               "last_changed": 4, "checks": 5, "changes": 6, "flags": 5, "lastmod": 7,
               "interval": 3600, "next_visit": 8, "callback": "parse", "churns": 1}
        shared.hset(pages, URL, json.dumps(old))
        assert await call(store.get_page(without)) == PageState(without, **old)
        assert (await call(store.get_page(without))).recipe is None
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_links_records_have_a_hash_of_their_own(
    redis_prefix: str, shared: redis.Redis
) -> None:
    key = PageKey(SCOPE, URL, "de")
    store = open_at(redis_prefix)
    try:
        store.stage_links(key, '["https://example.com/b"]')
        store.stage_page(PageState(key, etag='"x"', flags=PageFlags.LINKS_KNOWN))
        store.stage_links(PageKey(SCOPE, f"{URL}/gone"), '["x"]')
        store.stage_links(PageKey(SCOPE, f"{URL}/gone"), None)
        await call(store.flush())
    finally:
        await call(store.close())
    # Under the page's own field, apart from the page records.
    assert shared.hgetall(f"{redis_prefix}:links:{SCOPE}") == {
        f"{URL}\0de".encode(): b'["https://example.com/b"]'}
    assert json.loads(shared.hget(f"{redis_prefix}:pages:{SCOPE}", f"{URL}\0de")) == {
        "etag": '"x"', "flags": 8}
    assert shared.hget(f"{redis_prefix}:meta", "version") == str(LAYOUT_VERSION).encode()


@pytest_twisted.ensureDeferred
async def test_item_data_is_kept_per_version_under_the_item_key(
    redis_prefix: str, shared: redis.Redis
) -> None:
    store = open_at(redis_prefix)
    try:
        store.stage_item(item("k", 1))
        store.stage_item(ItemRecord(SCOPE, "k", "https://example.com/k", "fp-k-2", None, 5))
        store.stage_item(item("k", 3, change=Change.CHANGED))
        await call(store.flush())
    finally:
        await call(store.close())
    hist = shared.hgetall(f"{redis_prefix}:hist:{SCOPE}:k")
    # Version 2 came without data: its number is used, no entry is kept.
    assert sorted(hist) == [b"1", b"3"]
    # The change is left out where it is what an entry without one reads as.
    assert json.loads(hist[b"3"]) == {
        "fingerprint": "fp-k-3", "stored_at": 2_000_003, "data": {"name": "k", "version": 3},
    }


@pytest_twisted.ensureDeferred
async def test_page_index_costs_nothing_for_items_keyed_by_their_page(
    redis_prefix: str, shared: redis.Redis
) -> None:
    items, bypage = f"{redis_prefix}:items:{SCOPE}", f"{redis_prefix}:bypage:{SCOPE}"
    listing = "https://example.com/list"
    store = open_at(redis_prefix)
    try:
        # The usual items: keyed by the URL of the page they come from.
        store.stage_item(item("a"))
        store.stage_item(item("b", page="b"))
        store.stage_item(item("c", change=Change.DELETED, page="c"))
        await call(store.flush())
        assert not [k for k in prefix_keys(redis_prefix) if b":bypage:" in k]
        assert json.loads(shared.hget(items, "b")) == {"fingerprint": "fp-b-1",
                                                       "stored_at": 2_000_001,
                                                       "url": "https://example.com/b",
                                                       "born": 2_000_001}
        assert await call(store.get_page_items(SCOPE, "a")) == ["a"]

        # One from a listing: a member "page NUL key" of the scope's sorted
        # set; a tombstone takes it out.
        store.stage_item(item("https://example.com/x", page=listing))
        await call(store.flush())
        assert shared.zrange(bypage, 0, -1, withscores=True) == [
            (listing.encode() + b"\0https://example.com/x", 0.0)]
        assert json.loads(shared.hget(items, "https://example.com/x"))["page"] == listing
        store.stage_item(item("https://example.com/x", 2, page=listing, change=Change.DELETED))
        await call(store.flush())
        assert not shared.exists(bypage)
        assert await call(store.get_page_items(SCOPE, listing)) == []
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_history_entries_without_a_change_read_as_new_then_changed(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """Entries written before the change feed name no change; one that is
    not what such an entry reads as is named (a tombstone, an item back)."""
    hist = f"{redis_prefix}:hist:{SCOPE}:k"
    store = open_at(redis_prefix)
    try:
        # An item of two versions as the previous code wrote it.
        shared.sadd(f"{redis_prefix}:scopes", SCOPE)
        shared.hset(f"{redis_prefix}:items:{SCOPE}", "k",
                    '{"fingerprint":"fp-k-2","stored_at":2000002}')
        shared.hset(f"{redis_prefix}:itemver:{SCOPE}", "k", 2)
        shared.zadd(f"{redis_prefix}:order:{SCOPE}", {"k": 2_000_001})
        for n in (1, 2):
            shared.hset(hist, n, json.dumps(
                {"fingerprint": f"fp-k-{n}", "stored_at": 2_000_000 + n, "data": {"n": n}}))
        assert [(v.version, v.change) for v in store.iter_versions(SCOPE, every_version=True)
                ] == [(1, "new"), (2, "changed")]
        assert await call(store.get_page_items(SCOPE, "k")) == ["k"]

        store.stage_item(item("k", 3, change=Change.DELETED, data={"gone": True}))
        store.stage_item(item("k", 4, change=Change.NEW))
        await call(store.flush())
        assert json.loads(shared.hget(hist, "3"))["change"] == "deleted"
        assert json.loads(shared.hget(hist, "4"))["change"] == "new"
        assert [(v.version, v.change, v.fingerprint)
                for v in store.iter_versions(SCOPE, every_version=True)] == [
            (1, "new", "fp-k-1"), (2, "changed", "fp-k-2"), (3, "deleted", ""),
            (4, "new", "fp-k-4")]
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_gone_pages_stay_in_the_due_index_at_their_next_visit(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """Not only in the reads: the Lua writes keep a gone page in ``P:due``,
    scored by its next visit (its rare recheck)."""
    due = f"{redis_prefix}:due:{SCOPE}"
    gone, flagged = PageKey(SCOPE, f"{URL}/gone"), PageKey(SCOPE, f"{URL}/flagged")
    store = open_at(redis_prefix)
    try:
        store.stage_page(full_state(gone, 1, callback="parse", next_visit=10,
                                    flags=PageFlags.GONE))
        store.stage_page(full_state(flagged, 1, callback="parse", next_visit=10))
        await call(store.flush())
        assert shared.zrange(due, 0, -1, withscores=True) == [
            (flagged.url.encode(), 10), (gone.url.encode(), 10)]
        store.stage_flags(flagged, PageFlags.GONE)
        await call(store.flush())
        assert shared.zscore(due, flagged.url) == 10
        store.stage_check(gone, 304, 20, schedule=(3600, 30))
        store.stage_failure(flagged, 404, 40, failures=2, next_visit=50, callback="parse")
        await call(store.flush())
        assert shared.zrange(due, 0, -1, withscores=True) == [
            (gone.url.encode(), 30), (flagged.url.encode(), 50)]
        assert (await call(store.get_page(flagged))).next_visit == 50
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_gone_pages_left_out_of_the_due_index_are_added_on_open(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """A prefix written when gone pages were kept out of ``P:due``: opening
    it adds them (once: ``P:meta`` notes it), and no other page."""
    pages, due = f"{redis_prefix}:pages:{SCOPE}", f"{redis_prefix}:due:{SCOPE}"
    meta = f"{redis_prefix}:meta"
    store = open_at(redis_prefix)
    try:
        store.stage_page(full_state(PageKey(SCOPE, f"{URL}/live"), 1, callback="parse",
                                    next_visit=10))
        await call(store.flush())
    finally:
        await call(store.close())
    assert shared.hget(meta, "gone_due") == b"1"
    # As an older store left it: gone pages, none of them indexed.
    shared.hdel(meta, "gone_due")
    gone = {"callback": "parse", "flags": int(PageFlags.GONE | PageFlags.HAS_LINKS),
            "next_visit": 2_000}
    shared.hset(pages, mapping={
        f"{URL}/gone": json.dumps(gone),
        f"{URL}/gone\0fr": json.dumps({**gone, "next_visit": 3_000}),
        f"{URL}/no-callback": json.dumps({"flags": int(PageFlags.GONE)}),
        f"{URL}/damaged": "{not json",
        f"{URL}/unindexed": json.dumps({"callback": "parse", "next_visit": 5}),
    })
    other = f"{redis_prefix}:pages:other"
    shared.hset(other, f"{URL}/gone", json.dumps(gone))

    open_at(redis_prefix)._sync.close()
    assert shared.zrange(due, 0, -1, withscores=True) == [
        (f"{URL}/live".encode(), 10), (f"{URL}/gone".encode(), 2_000),
        (f"{URL}/gone\0fr".encode(), 3_000)]
    assert shared.zrange(f"{redis_prefix}:due:other", 0, -1) == [f"{URL}/gone".encode()]
    assert shared.hget(meta, "gone_due") == b"1"
    # Done once: a gone page left out now stays out.
    shared.zrem(due, f"{URL}/gone")
    store = open_at(redis_prefix)
    try:
        assert [s.key.url for s in await call(store.get_due(SCOPE, 2_500, 10))] == [
            f"{URL}/live"]
        assert [s.key for s in await call(store.get_due(SCOPE, 3_000, 10))] == [
            PageKey(SCOPE, f"{URL}/live"), PageKey(SCOPE, f"{URL}/gone", "fr")]
    finally:
        await call(store.close())


# -- round-trips (counted by a server of our own) ----------------------------


@pytest_twisted.ensureDeferred
async def test_flush_is_one_transaction_and_batched_reads_one_round_trip(
    own_redis: OwnRedis,
) -> None:
    store = RedisStateStore(own_redis.uri, prefix="rt")
    try:
        keys = [PageKey(SCOPE if i % 2 else "other", f"{URL}/{i}") for i in range(2_500)]
        for i, key in enumerate(keys):
            store.stage_item(item(f"i{i}", i + 1))
            store.stage_page(full_state(key, i + 1))
        store.stage_check(keys[0], 304, 3_000_000)
        store.stage_redirect(keys[1], URL, 301, 3_000_000)
        before, trips = own_redis.command_calls(), store.roundtrips
        # Reads of staged pages never leave the process.
        assert len(await call(store.get_pages(keys[:100]))) == 100
        assert store.roundtrips == trips
        assert await call(store.flush()) == 5_002
        assert store.roundtrips == trips + 1
        after = own_redis.command_calls()
        # One atomic script run, the script loaded when the store opened.
        assert after["evalsha"] - before.get("evalsha", 0) == 1
        assert after.get("eval", 0) == 0

        found = await call(store.get_pages([*keys, PageKey(SCOPE, "https://nowhere/")]))
        assert found == {key: (await call(store.get_page(key))) for key in keys}
        assert found[keys[0]].checks == 2 and found[keys[1]].redirect_to == URL
        # One round-trip for 2,500 pages (HMGETs of <= 1,000 fields per scope),
        # plus one per get_page above.
        assert store.roundtrips == trips + 1 + 1 + len(keys)
        assert own_redis.command_calls()["hmget"] - before.get("hmget", 0) == 4
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_close_closes_every_connection(own_redis: OwnRedis) -> None:
    def clients() -> int:
        with own_redis.client() as client:
            return len(client.client_list()) - 1  # less this one

    store = RedisStateStore(own_redis.uri, prefix="c")
    store.stage_page(full_state(PageKey(SCOPE, URL)))
    await call(store.flush())
    assert await call(store.get_page(PageKey(SCOPE, URL))) is not None
    assert store.count_pages() == 1
    assert clients() >= 2  # the async and the sync client
    await call(store.close())
    assert clients() == 0


# -- failures -----------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_rejected_transaction_applies_nothing_and_keeps_staged_writes(
    own_redis: OwnRedis,
) -> None:
    store = RedisStateStore(own_redis.uri, prefix="f")
    try:
        key = PageKey(SCOPE, URL)
        store.stage_page(full_state(key, 1))
        await call(store.flush())
        store.stage_item(item("a"))
        store.stage_check(key, 304, 3_000_000)
        store.stage_page(full_state(PageKey(SCOPE, f"{URL}/2")))
        with own_redis.client() as client:
            # Writes refused (no replicas): EXEC is aborted as a whole.
            client.config_set("min-replicas-to-write", 1)
            with pytest.raises(StateStoreError) as info:
                await call(store.flush())
            assert "NOREPLICAS" in str(info.value) or "EXECABORT" in str(info.value)
            assert store.location in str(info.value)
            assert store.pending == 3
            assert client.hlen(f"f:pages:{SCOPE}") == 1
            assert not client.exists(f"f:items:{SCOPE}")
            # Staged state is still what reads see...
            assert await call(store.get_item_fingerprint(SCOPE, "a")) == "fp-a-1"
            assert await call(store.get_page(PageKey(SCOPE, f"{URL}/2"))) is not None
            client.config_set("min-replicas-to-write", 0)
        # ...and a later flush commits all of it, in order.
        assert await call(store.flush()) == 3
        assert (await call(store.get_page(key))).checks == 2
        assert store.item_history(SCOPE, "a") == [(1, "fp-a-1")]
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_flush_to_a_stopped_redis_keeps_staged_writes(own_redis: OwnRedis) -> None:
    store = RedisStateStore(own_redis.uri, prefix="s")
    try:
        store.stage_item(item("a"))
        store.stage_page(full_state(PageKey(SCOPE, URL)))
        own_redis.stop()
        with pytest.raises(StateStoreError) as info:
            await call(store.flush())
        assert store.location in str(info.value)
        assert store.pending == 2
        with pytest.raises(StateStoreError):
            await call(store.get_item_fingerprint(SCOPE, "b"))
        own_redis.start()  # an empty server again
        assert await call(store.flush()) == 2
        assert await call(store.get_item_fingerprint(SCOPE, "b")) is None
        store.stage_item(item("b"))
    finally:
        await call(store.close())
    with own_redis.client() as client:
        assert client.hlen(f"s:pages:{SCOPE}") == 1
        assert client.hlen(f"s:items:{SCOPE}") == 2


# -- a crawl that loses Redis -------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_crawl_that_loses_redis_stops_loudly_and_records_nothing_unstored(
    site, crawl, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    paths = [f"/p/{i:04d}" for i in range(40)]
    for path in paths:
        site.add_page(path, "strong", size=2000)
    # Slow pages: the cut lands while some are in flight and most are to come.
    site.slow("/p/", 0.05)
    proxy = CuttableProxy()
    db = REDIS_URI.rsplit("/", 1)[1]
    through_proxy = f"redis://127.0.0.1:{proxy.port}/{db}?prefix={redis_prefix}"
    direct = open_at(redis_prefix)
    settings: dict[str, Any] = {
        "INCREMENTAL_STATE_URI": through_proxy,
        "INCREMENTAL_BATCH_SIZE": 4,
        "INCREMENTAL_FLUSH_INTERVAL": 0.02,
        "CONCURRENT_REQUESTS": 4,
    }

    async def cut_after_commits() -> int:
        # Bounded: 2,000 polls of 5 ms.
        for _ in range(2_000):
            committed = direct.count_pages("sitemap")
            if committed >= 4:
                proxy.cut()
                return committed
            await asyncio.sleep(0.005)
        raise AssertionError("the crawl committed nothing")

    try:
        cutter = call(cut_after_commits())
        with caplog.at_level(logging.ERROR):
            first = await crawl(SitemapPagesSpider, settings=settings,
                                sitemap_url=site.url("/robots.txt"))
        committed_at_cut = await cutter
    finally:
        proxy.cut()

    try:
        stats = first.stats
        assert stats.get_value("finish_reason") == "incremental_store_error"
        assert stats.get_value("incremental/store_errors") >= 1
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert any(m.startswith(f"State store {through_proxy}") and "stopping the crawl" in m
                   for m in errors), errors
        served = {r.path for r in site.log if r.path.startswith("/p/") and r.status == 200}
        assert len(served) < len(paths), "the crawl went on after losing its store"

        # Nothing un-stored is recorded as done: every page state in Redis
        # has its item, and the sitemap (handled only when all is) has none.
        stored = await call(direct.get_pages([PageKey("sitemap", site.url(p)) for p in paths]))
        assert committed_at_cut <= len(stored) < len(paths)
        for key, state in stored.items():
            assert state.etag is not None
            assert await call(direct.get_item_fingerprint("sitemap", key.url)) is not None, key
        assert await call(direct.get_page(PageKey("sitemap", site.url("/sitemap.xml")))) is None

        # The next crawl (Redis back) gets 304s for exactly the stored pages
        # and fetches every other page in full: no change is lost.
        site.reset_log()
        settings["INCREMENTAL_STATE_URI"] = f"{REDIS_URI}?prefix={redis_prefix}"
        second = await crawl(SitemapPagesSpider, settings=settings,
                             sitemap_url=site.url("/robots.txt"), use_lastmod="false")
        assert second.stats.get_value("finish_reason") == "finished"
        statuses = {r.path: r.status for r in site.log if r.path.startswith("/p/")}
        assert statuses == {p: 304 if PageKey("sitemap", site.url(p)) in stored else 200
                            for p in paths}
        assert {i["url"] for i in direct.iter_items("sitemap")} == {site.url(p) for p in paths}
    finally:
        await call(direct.close())
    assert prefix_keys(redis_prefix)  # (deleted by the fixture afterwards)


# -- flushes that fail half-way or whose reply is lost --------------------------


@pytest_twisted.ensureDeferred
async def test_flush_whose_reply_was_lost_is_not_applied_twice(redis_prefix: str) -> None:
    """A transaction that ran but whose reply never came (a timeout, a cut
    after EXEC was sent) must not run again on the next flush: item versions
    and checks would be counted twice."""
    proxy = CuttableProxy()
    db = REDIS_URI.rsplit("/", 1)[1]
    uri = f"redis://127.0.0.1:{proxy.port}/{db}?prefix={redis_prefix}&socket_timeout=1"
    store = open_store(Settings({"INCREMENTAL_STATE_URI": uri}))
    direct = open_at(redis_prefix)
    key = PageKey(SCOPE, URL)
    try:
        store.stage_page(full_state(key, 1))
        await call(store.flush())
        store.stage_item(item("a"))
        store.stage_check(key, 304, 3_000_000)
        store.stage_redirect(PageKey(SCOPE, f"{URL}/r"), URL, 301, 3_000_000)
        proxy.mute_replies.set()
        with pytest.raises(StateStoreError):
            await call(store.flush())
        proxy.mute_replies.clear()
        # It ran: the reply was lost, not the transaction.
        assert direct.item_history(SCOPE, "a") == [(1, "fp-a-1")]
        store.stage_item(item("b"))
        assert await call(store.flush()) == 4
        assert direct.item_history(SCOPE, "a") == [(1, "fp-a-1")]
        assert direct.item_history(SCOPE, "b") == [(1, "fp-b-1")]
        assert (await call(direct.get_page(key))).checks == 2
        assert (await call(direct.get_page(PageKey(SCOPE, f"{URL}/r")))).checks == 1
        assert store.pending == 0
    finally:
        await call(store.close())
        await call(direct.close())
        proxy.cut()


@pytest_twisted.ensureDeferred
async def test_a_write_failing_inside_the_transaction_commits_nothing_after_it(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """EXEC goes on after a command fails at run time; a page's validators
    staged after its item must not be committed when the item's write failed
    (state is never ahead of data), and a later flush must not apply the rest twice."""
    store = open_at(redis_prefix)
    try:
        # A damaged key: the item's upsert fails when it runs.
        shared.set(f"{redis_prefix}:itemver:{SCOPE}", "not a hash")
        store.stage_item(item("a"))
        store.stage_page(full_state(PageKey(SCOPE, URL), 1))
        with pytest.raises(StateStoreError):
            await call(store.flush())
        reader = open_at(redis_prefix)
        try:
            assert await call(reader.get_page(PageKey(SCOPE, URL))) is None
            assert await call(reader.get_item_fingerprint(SCOPE, "a")) is None
        finally:
            await call(reader.close())
        assert store.pending == 2
        shared.delete(f"{redis_prefix}:itemver:{SCOPE}")
        assert await call(store.flush()) == 2
        assert store.item_history(SCOPE, "a") == [(1, "fp-a-1")]
        assert await call(store.get_page(PageKey(SCOPE, URL))) == full_state(PageKey(SCOPE, URL), 1)
    finally:
        shared.delete(f"{redis_prefix}:itemver:{SCOPE}")
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_key_of_the_wrong_type_fails_the_flush_before_any_write(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """A script stops at a failing write but keeps the writes before it:
    the key types are checked first, so a damaged key splits nothing (not a
    page record from its revisit index, not a page's links or items from
    its state)."""
    due = f"{redis_prefix}:due:{SCOPE}"
    key = PageKey(SCOPE, URL)
    store = open_at(redis_prefix)
    try:
        shared.set(due, "not a sorted set")
        store.stage_item(item("a"))
        store.stage_links(key, '["x"]')
        store.stage_page(full_state(key, 1))
        with pytest.raises(StateStoreError) as info:
            await call(store.flush())
        assert due in str(info.value)
        assert "nothing of the flush was applied" in str(info.value)
        assert store.pending == 3
        assert not shared.exists(f"{redis_prefix}:items:{SCOPE}")
        assert not shared.exists(f"{redis_prefix}:links:{SCOPE}")
        assert not shared.exists(f"{redis_prefix}:pages:{SCOPE}")
        assert not shared.exists(f"{redis_prefix}:scopes")
        shared.delete(due)
        assert await call(store.flush()) == 3
        assert store.item_history(SCOPE, "a") == [(1, "fp-a-1")]
        assert await call(store.get_links(key)) == '["x"]'
        assert await call(store.get_page(key)) == full_state(key, 1)
    finally:
        shared.delete(due)
        await call(store.close())


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_a_redis_that_evicts_any_key_is_refused(own_redis: OwnRedis, policy: str) -> None:
    """A Redis run as a cache drops keys when full: items or whole pages
    hashes would vanish silently (validators left without their data)."""
    with own_redis.client() as client:
        client.config_set("maxmemory-policy", policy)
    with pytest.raises(StateStoreError, match=policy):
        RedisStateStore(own_redis.uri, prefix="ev")


@pytest_twisted.ensureDeferred
async def test_a_redis_that_evicts_only_expiring_keys_is_accepted(own_redis: OwnRedis) -> None:
    with own_redis.client() as client:
        client.config_set("maxmemory-policy", "volatile-lru")
    store = RedisStateStore(own_redis.uri, prefix="ev")
    await call(store.close())


@pytest_twisted.ensureDeferred
async def test_page_index_is_one_sorted_set_read_by_range(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """Adding to a page with many items costs no rewrite of its list; pages
    whose URL is a prefix of another's are told apart; moving an item moves
    its member."""
    bypage = f"{redis_prefix}:bypage:{SCOPE}"
    feed, feed2 = "https://example.com/feed", "https://example.com/feed2"
    store = open_at(redis_prefix)
    try:
        for n in range(300):
            store.stage_item(item(f"k{n:03d}", page=feed))
        store.stage_item(item("other", page=feed2))
        await call(store.flush())
        assert shared.type(bypage) == b"zset"
        assert shared.zcard(bypage) == 301
        assert await call(store.get_page_items(SCOPE, feed)) == [f"k{n:03d}" for n in range(300)]
        assert await call(store.get_page_items(SCOPE, feed2)) == ["other"]
        store.stage_item(item("k000", 2, page=feed2))
        await call(store.flush())
        assert await call(store.get_page_items(SCOPE, feed2)) == ["k000", "other"]
        assert len(await call(store.get_page_items(SCOPE, feed))) == 299
        assert store.forget_page(SCOPE, feed2).items == 2
        assert await call(store.get_page_items(SCOPE, feed2)) == []
        assert shared.zcard(bypage) == 299
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_layout_1_page_index_is_migrated(redis_prefix: str, shared: redis.Redis) -> None:
    feed = "https://example.com/feed"
    items, bypage = f"{redis_prefix}:items:{SCOPE}", f"{redis_prefix}:bypage:{SCOPE}"
    shared.hset(f"{redis_prefix}:meta", mapping={"layout": LAYOUT, "version": 1})
    shared.sadd(f"{redis_prefix}:scopes", SCOPE)
    for key in ("a", "b"):
        shared.hset(items, key, json.dumps({"fingerprint": f"fp-{key}", "page": feed}))
        shared.hset(f"{redis_prefix}:itemver:{SCOPE}", key, 1)
    shared.hset(bypage, feed, '["a","b"]')
    store = open_at(redis_prefix)
    try:
        assert shared.hget(f"{redis_prefix}:meta", "version") == str(LAYOUT_VERSION).encode()
        assert shared.type(bypage) == b"zset"
        assert await call(store.get_page_items(SCOPE, feed)) == ["a", "b"]
        store.stage_item(item("a", 2, change=Change.DELETED, page=feed))
        await call(store.flush())
        assert await call(store.get_page_items(SCOPE, feed)) == ["b"]
    finally:
        await call(store.close())
    open_at(redis_prefix)._sync.close()  # opened again: nothing left to migrate
    assert shared.zrange(bypage, 0, -1) == [feed.encode() + b"\0b"]


@pytest_twisted.ensureDeferred
async def test_an_item_write_that_fails_applies_nothing_of_it(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """Its reads and checks come before its writes: a damaged version
    number stops the flush with the item's page index, record and history
    as they were."""
    first, second = "https://example.com/p", "https://example.com/q"
    itemver = f"{redis_prefix}:itemver:{SCOPE}"
    store = open_at(redis_prefix)
    try:
        store.stage_item(item("k", page=first))
        await call(store.flush())
        record = shared.hget(f"{redis_prefix}:items:{SCOPE}", "k")
        shared.hset(itemver, "k", "not a number")
        store.stage_item(item("k", 2, page=second))
        with pytest.raises(StateStoreError, match="a write failed"):
            await call(store.flush())
        assert await call(store.get_page_items(SCOPE, first)) == ["k"]
        assert await call(store.get_page_items(SCOPE, second)) == []
        assert shared.hget(f"{redis_prefix}:items:{SCOPE}", "k") == record
        assert store.item_history(SCOPE, "k") == [(1, "fp-k-1")]
        # Repaired, the staged write goes through.
        shared.hset(itemver, "k", 1)
        await call(store.flush())
        assert await call(store.get_page_items(SCOPE, second)) == ["k"]
        assert store.item_history(SCOPE, "k") == [(1, "fp-k-1"), (2, "fp-k-2")]
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_reset_deletes_only_this_stores_keys_of_the_scope(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """A scope named after its host shares the name of the politeness
    budget's bucket (``P:budget:<host>`` with the default prefix): a reset
    of the scope leaves it, and any other key not of this store's kinds."""
    scope = "example.com"
    store = open_at(redis_prefix)
    try:
        store.stage_page(full_state(PageKey(scope, "https://example.com/a"), 1))
        store.stage_item(item("k", scope=scope, page="https://example.com/a"))
        await call(store.flush())
        foreign = [f"{redis_prefix}:anything:{scope}", f"{redis_prefix}:budget:{scope}"]
        for key in foreign:
            shared.set(key, "not the store's")
        assert store.reset_scope(scope).pages == 1
        assert sorted(k.decode() for k in prefix_keys(redis_prefix)
                      if k.decode().endswith(f":{scope}") or ":hist:" in k.decode()) == foreign
        assert store.scopes() == []
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_latest_versions_read_while_a_crawl_writes_are_never_lost(
    redis_prefix: str,
) -> None:
    """The export notes the versions it wants, then reads them: an item
    written in between (its noted version pruned, history limit 1) yields
    the version stored then."""
    crawl = RedisStateStore(REDIS_URI, prefix=redis_prefix, history_limit=1)
    reader = open_at(redis_prefix)
    try:
        for n in range(1500):  # two chunks of reads
            crawl.stage_item(item(f"k{n:04d}", stored_at=100 + n))
        await call(crawl.flush())
        versions = reader.iter_versions(SCOPE, since=100)
        got = [next(versions)]  # noted, and the first chunk read
        crawl.stage_item(item("k1200", 2, stored_at=5000, change=Change.CHANGED))
        await call(crawl.flush())
        got += list(versions)
        assert len(got) == 1500
        latest = {v.key: (v.version, v.change, v.stored_at) for v in got}
        # New to a reader that has what was stored before 100.
        assert latest["k1200"] == (2, "new", 5000)
        assert latest["k0000"] == (1, "new", 100)
    finally:
        await call(crawl.close())
        await call(reader.close())
