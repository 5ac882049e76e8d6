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
import math
import random
from dataclasses import fields
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pytest
import pytest_twisted
import redis
from scrapy.settings import Settings

from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from incremental_crawler.state.records import (
    Change,
    HostTrust,
    ItemRecord,
    PageFlags,
    PageKey,
    PageState,
)
from incremental_crawler.state.stores import StateStoreError, open_store
from incremental_crawler.state.stores.base import due_after
from incremental_crawler.state.stores.packed import LUA_CODEC, pack, unpack
from incremental_crawler.state.stores.packed import due_of as packed_due_of
from incremental_crawler.state.stores.redis import (
    LAYOUT,
    LAYOUT_VERSION,
    RedisStateStore,
    parse_redis_uri,
)
from incremental_crawler.state.stores.redis.pages import BUCKET_LOAD, bucket_of
from tests.clock_util import later
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


#: INCREMENTAL_REDIS_RETRY_TIME of the tests that stop Redis and wait for
#: the store to give up (seconds).
GIVE_UP_SOON = 1.0


def open_at(prefix: str, uri: str = REDIS_URI) -> RedisStateStore:
    return RedisStateStore(uri, prefix=prefix)


def bucket(prefix: str, n: int = 0, host: str = "example.com", scope: str = SCOPE) -> str:
    """The key of a host's bucket *n* of page records."""
    return f"{prefix}:pg:{{{scope}|{host}}}:{n}"


def stored_pages(client: redis.Redis, prefix: str) -> int:
    """Page records under *prefix*, counted in every bucket (both hashes)."""
    return sum(client.hlen(key) for key in client.scan_iter(f"{prefix}:pg*:*", count=1000))


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
        ("redis+cluster://h1:7000,h2:7001/?prefix=p", "redis+cluster://h1:7000,h2:7001/", "p"),
        ("rediss+cluster://:pw@h1:7000/?prefix=p&socket_timeout=2",
         "rediss+cluster://:pw@h1:7000/?socket_timeout=2", "p"),
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
        ("redis+cluster:///?prefix=p", "no seed node"),
        ("redis+cluster://h:7000/3", "only database 0"),
        ("redis+cluster://h:7000/?db=3", "only database 0"),
        ("redis+cluster://h:7000/?colour=blue", "unknown parameter 'colour'"),
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
        assert stored_pages(client, "u") == 1


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
    }
    # Reopening an existing store of this layout works.
    await call(open_at(redis_prefix).close())


def test_newer_layout_is_refused_and_left_alone(redis_prefix: str, shared: redis.Redis) -> None:
    meta = f"{redis_prefix}:meta"
    shared.hset(meta, mapping={"layout": LAYOUT, "version": LAYOUT_VERSION + 1})
    shared.hset(bucket(redis_prefix), "s/a", "{}")
    with pytest.raises(StateStoreError) as info:
        open_at(redis_prefix)
    message = str(info.value)
    assert f"prefix={redis_prefix}" in message
    assert f"layout version {LAYOUT_VERSION + 1}" in message
    assert "upgrade incremental_crawler" in message
    assert shared.hget(meta, "version") == str(LAYOUT_VERSION + 1).encode()
    assert shared.hget(bucket(redis_prefix), "s/a") == b"{}"


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


def realistic_state(key: PageKey) -> PageState:
    """A page as a sitemap crawl stores it (revisits on, lastmod known)."""
    now = 1_760_000_000
    return PageState(
        key, etag='W/"7f89eda0-fb22ac71"', last_modified="Sun, 06 Nov 1994 08:49:37 GMT",
        fingerprint="7f89eda0fb22ac71", size=31_234, last_status=200,
        first_seen=now - 30 * 86_400, last_checked=now, last_fetched=now,
        last_changed=now - 3 * 86_400, checks=12, changes=2, flags=PageFlags.LINKS_KNOWN,
        lastmod=now - 3 * 86_400, interval=2 * 86_400, next_visit=now + 2 * 86_400,
        callback="parse")


def uvarint(value: int) -> bytes:
    """A varint as the packed records write them (7 bits a byte, low first)."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    return bytes([*out, value])


@pytest_twisted.ensureDeferred
async def test_page_records_are_packed_in_small_buckets_per_host(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """Each page is a field of its host's bucket: its URL less
    ``scheme://host`` (a letter for the scheme), NUL and its variant; its
    record is packed, a realistic one in at most 64 bytes, so that Redis
    keeps the bucket a flat listpack."""
    key = PageKey(SCOPE, URL, "de")
    plain_http = PageKey(SCOPE, "http://example.com:8080/x?y=1")
    other = PageKey(SCOPE, "ftp://Example.com/z")
    store = open_at(redis_prefix)
    try:
        store.stage_page(realistic_state(key))
        store.stage_page(PageState(plain_http, etag='"x"', checks=2, last_checked=12.9))
        store.stage_page(PageState(other, recipe='{"priority":2}'))
        await call(store.flush())
        records = shared.hgetall(bucket(redis_prefix))
        assert sorted(records) == [b"h:8080/x?y=1", b"s/a\0de", b"uftp://Example.com/z"]
        assert len(records[b"s/a\0de"]) <= 64
        assert shared.object("encoding", bucket(redis_prefix)) == b"listpack"
        assert unpack(key, records[b"s/a\0de"]) == realistic_state(key)
        # Times kept as whole seconds, as SQLite keeps them.
        assert await call(store.get_page(plain_http)) == PageState(
            plain_http, etag='"x"', checks=2, last_checked=12)
        assert (await call(store.get_page(other))).recipe == '{"priority":2}'
        assert shared.hgetall(f"{redis_prefix}:hd:{{{SCOPE}|example.com}}") == {
            b"n": b"1", b"p": b"3"}
        assert shared.smembers(f"{redis_prefix}:hs:{SCOPE}") == {b"example.com"}

        # A longer field or record (a long URL, a long recipe) goes to the
        # bucket's hash of large entries: the bucket stays a listpack.
        long_url = PageKey(SCOPE, f"{URL}/{'x' * 80}")
        store.stage_page(realistic_state(long_url))
        store.stage_page(realistic_state(plain_http).copy(recipe='{"meta":{"a":' + "1" * 60 + "}}"))
        await call(store.flush())
        large = f"{redis_prefix}:pgl:{{{SCOPE}|example.com}}:0"
        assert sorted(shared.hkeys(large)) == [b"h:8080/x?y=1", f"s/a/{'x' * 80}".encode()]
        assert not shared.hexists(bucket(redis_prefix), "h:8080/x?y=1")
        assert shared.object("encoding", bucket(redis_prefix)) == b"listpack"
        assert await call(store.get_page(long_url)) == realistic_state(long_url)
        # Back to a short record: back to the listpack, counted once.
        store.stage_page(realistic_state(plain_http))
        await call(store.flush())
        assert shared.hkeys(large) == [f"s/a/{'x' * 80}".encode()]
        assert store.count_pages(SCOPE) == 4
        assert len(list(store.iter_pages(SCOPE))) == 4
        assert store.forget_page(SCOPE, long_url.url).pages == 1
        assert not shared.exists(large)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_record_with_fields_this_code_does_not_know_reads_and_keeps_them(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """A field added later takes a higher bit of the mask and its bytes come
    last: this code reads the fields it knows, and its upserts keep the rest."""
    key = PageKey(SCOPE, URL)
    store = open_at(redis_prefix)
    try:
        store.stage_page(realistic_state(key))
        await call(store.flush())
        raw = shared.hget(bucket(redis_prefix), "s/a")
        mask, size = raw[0], 1
        while raw[size - 1] & 0x80:
            size += 1
        known = sum((b & 0x7F) << (7 * n) for n, b in enumerate(raw[:size]))
        assert mask and known < 1 << 30
        newer = uvarint(known | 1 << 40) + raw[size:] + b"\x03abc"
        shared.hset(bucket(redis_prefix), "s/a", newer)
        assert await call(store.get_page(key)) == realistic_state(key)
        store.stage_check(key, 304, 2_000_000_000)
        await call(store.flush())
        # Now over 64 bytes: in its bucket's hash of large records.
        assert not shared.hexists(bucket(redis_prefix), "s/a")
        rewritten = shared.hget(f"{redis_prefix}:pgl:{{{SCOPE}|example.com}}:0", "s/a")
        assert rewritten.startswith(uvarint(known | 1 << 40)) and rewritten.endswith(b"\x03abc")
        assert (await call(store.get_page(key))).checks == 13
    finally:
        await call(store.close())


#: Echoes each record as the flush script rewrites it (unpacked and packed
#: again, as a check does) and the next visit the due reads see in it.
_LUA_ECHO = LUA_CODEC + """
local out = {}
for k = 1, #ARGV do
  out[#out + 1] = pack_page(unpack_page(ARGV[k]))
  local due = due_of(ARGV[k])
  out[#out + 1] = due and string.format('%d', due) or ''
end
return out
"""


def test_lua_codec_agrees_with_python_byte_for_byte(shared: redis.Redis) -> None:
    """The flush script's codec reads and writes back every record exactly
    as Python packs it (so a check never changes a field it does not
    touch), and its due reads see the next visit Python sees."""
    key = PageKey(SCOPE, URL)
    now = 1_760_000_000
    states = [
        realistic_state(key),
        PageState(key),
        PageState(key, callback="parse"),
        # Times before the epoch of the records, negative numbers, big ones.
        PageState(key, last_checked=-5, first_seen=-10**13, next_visit=10**14 - 1,
                  interval=-3, size=10**14 - 1, checks=2**40, callback="other"),
        # None (last_status, lastmod) apart from 0.
        PageState(key, last_status=0, lastmod=0, last_checked=now, callback="parse"),
        # A Last-Modified at the Unix epoch: a time of 0 that is not a default.
        PageState(key, last_modified="Thu, 01 Jan 1970 00:00:00 GMT", last_checked=now,
                  next_visit=now + 60, callback="parse"),
        PageState(key, last_modified="Sun, 06 Nov 1994 08:49:37 GMT", etag='W/"5f3c-1a"'),
        # Strings that are not in a compact form, unicode, empty ones.
        PageState(key, etag='"Ünïcode-é"', fingerprint="ABC", callback="", recipe='{"é":1}',
                  redirect_to="https://例え.jp/ß", last_modified="yesterday"),
        PageState(key, fingerprint="abc", etag='""', last_checked=12.9, next_visit=0.5,
                  callback="parse", churns=3, failures=2),
    ]
    raws = [pack(state) for state in states]
    # A field this code does not know (a higher bit, its bytes last) is kept.
    newer = []
    for raw in raws[:3]:
        size = 1
        while raw[size - 1] & 0x80:
            size += 1
        mask = sum((b & 0x7F) << (7 * n) for n, b in enumerate(raw[:size]))
        newer.extend(uvarint(mask | unknown) + raw[size:] + b"\x02hi"
                     for unknown in (1 << 30, 1 << 40))
    reply = shared.eval(_LUA_ECHO, 0, *raws, *newer)
    for n, raw in enumerate([*raws, *newer]):
        assert reply[2 * n] == raw, n
        due = packed_due_of(raw)
        assert reply[2 * n + 1] == (b"" if due is None else b"%d" % due)
    for state, raw in zip(states, raws, strict=True):
        assert unpack(key, raw).last_modified == state.last_modified


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
    # Under the page's own field, in its host's links hash, apart from the pages.
    assert shared.hgetall(f"{redis_prefix}:ln:{{{SCOPE}|example.com}}") == {
        b"s/a\0de": b'["https://example.com/b"]'}
    assert unpack(key, shared.hget(bucket(redis_prefix), "s/a\0de")) == PageState(
        key, etag='"x"', flags=PageFlags.LINKS_KNOWN)
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
async def test_revisit_index_holds_buckets_by_a_lower_bound_of_their_next_visits(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """Not only in the reads: the Lua writes keep a page's bucket in the
    revisit index (a gone page's too), its score never above the next visit
    of a page with a callback in it; a reading of the due pages that finds
    a bucket's pages all after its bound has the next flush set it to their
    exact minimum (a summary reads sums, not buckets)."""
    due = f"{redis_prefix}:dueb:{SCOPE}"
    gone, flagged = PageKey(SCOPE, f"{URL}/gone"), PageKey(SCOPE, f"{URL}/flagged")
    store = open_at(redis_prefix)
    try:
        store.stage_page(full_state(gone, 1, callback="parse", next_visit=10,
                                    flags=PageFlags.GONE))
        store.stage_page(full_state(flagged, 1, callback="parse", next_visit=10))
        store.stage_page(full_state(PageKey(SCOPE, f"{URL}/no-callback"), 1, next_visit=1))
        await call(store.flush())
        assert shared.zrange(due, 0, -1, withscores=True) == [(b"example.com|0", 10)]
        store.stage_flags(flagged, PageFlags.GONE)
        await call(store.flush())
        store.stage_check(gone, 304, 20, schedule=(3600, 30))
        store.stage_failure(flagged, 404, 40, failures=2, next_visit=50, callback="parse")
        await call(store.flush())
        # Raised next visits leave the bound low: a lower bound still.
        assert shared.zscore(due, "example.com|0") == 10
        assert await call(store.get_due(SCOPE, 25, 10)) == []
        assert [(s.key, s.next_visit) for s in await call(store.get_due(SCOPE, 60, 10))] == [
            (gone, 30), (flagged, 50)]
        summary = await call(store.summarize_pages(
            SCOPE, after=-math.inf, upto=math.inf, checked_before=math.inf))
        assert (summary.pages, summary.first_due) == (2, 30)
        assert shared.zscore(due, "example.com|0") == 10
        await call(store.flush())
        assert shared.zscore(due, "example.com|0") == 30
        # A bucket left with no page with a callback leaves the index.
        assert store.forget_page(SCOPE, gone.url).pages == 1
        store.stage_page(full_state(flagged, 2))
        await call(store.flush())
        assert await call(store.get_due(SCOPE, 60, 10)) == []
        await call(store.flush())
        assert not shared.exists(due)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_host_grows_by_splitting_one_bucket_at_a_time(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """Past BUCKET_LOAD pages a bucket, a host's next bucket splits in two
    (ahead of the writes: no bucket takes a whole flush of new pages); every
    page stays where reads, repairs and the revisit index find it."""
    pages = [PageKey(SCOPE, f"https://big.example/p/{n}", "v" if n % 7 == 0 else "")
             for n in range(700)]
    # Revisits spread out, so that the order of the due pages is a test.
    visits = {key: 1_000 + (n * 7_919) % 999 for n, key in enumerate(pages)}
    store = open_at(redis_prefix)
    try:
        for start, end in ((0, 50), (50, 100), (100, 700)):  # then a flush of 600
            for key in pages[start:end]:
                store.stage_page(realistic_state(key).copy(next_visit=visits[key]))
            await call(store.flush())
        n = int(shared.hget(f"{redis_prefix}:hd:{{{SCOPE}|big.example}}", "n"))
        assert n >= 700 / BUCKET_LOAD
        sizes = [shared.hlen(bucket(redis_prefix, b, "big.example")) for b in range(n)]
        assert sum(sizes) == 700 and max(sizes) <= 128
        assert {shared.object("encoding", bucket(redis_prefix, b, "big.example"))
                for b in range(n)} == {b"listpack"}
        assert not shared.exists(bucket(redis_prefix, n, "big.example"))
        assert store.count_pages(SCOPE) == 700
        assert sorted(s.key for s in store.iter_pages(SCOPE)) == sorted(pages)
        assert await call(store.get_pages(pages)) == {
            key: realistic_state(key).copy(next_visit=visits[key]) for key in pages}

        # The due pages in order (most overdue first, ties by URL), paged.
        expected = sorted(pages, key=lambda k: (visits[k], k.url, k.variant))
        store.stage_check(expected[0], 304, 1_760_000_000, schedule=(3600, 1_999))
        await call(store.flush())  # its bucket's bound is now low
        expected = expected[1:] + expected[:1]
        got: list[PageState] = []
        for _ in range(0, 700, 64):
            got += await call(store.get_due(SCOPE, 1_999, 64,
                                            due_after(got[-1]) if got else None))
        assert [s.key for s in got] == expected
        # A page asked again, or after a flush: read afresh, the same.
        assert await call(store.get_due(SCOPE, 1_999, 64, due_after(got[63]))) == got[64:128]
        store.stage_host(HostTrust(SCOPE, "big.example", checks=1))
        await call(store.flush())
        assert await call(store.get_due(SCOPE, 1_999, 64, due_after(got[127]))) == got[128:192]
        got = [s.key for s in got]
        assert [s.key for s in await call(store.get_due(SCOPE, 1_500, 1_000))] == [
            k for k in expected if visits[k] <= 1_500 and k != expected[-1]]

        # Repairs find a page in its bucket (the same choice in Python).
        stored = await call(store.get_pages(pages[:50]))
        for key in pages[:50]:
            assert store.url_record(SCOPE, key.url).pages == [stored[key]]
        assert store.forget_page(SCOPE, pages[1].url).pages == 1
        assert await call(store.get_page(pages[1])) is None
        assert store.count_pages(SCOPE) == 699
        assert store.forget_host(SCOPE, "big.example").pages == 699
        assert [k for k in prefix_keys(redis_prefix) if b"big.example" in k] == []
        assert not shared.exists(f"{redis_prefix}:dueb:{SCOPE}")
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_host_repair_reads_again_when_a_crawl_splits_the_host_meanwhile(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """forget_host reads the host's bucket count and pages, then deletes in
    one MULTI: a crawl that splits the host's buckets in between (played
    here by hand, as a flush splits: records moved to bucket 1, the count
    raised) makes it read again (WATCH of the host's record), so no page is
    left in a bucket it did not delete, and the sums are the pages left."""
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(30)]
    store = open_at(redis_prefix)
    hd = f"{redis_prefix}:hd:{{{SCOPE}|a.example}}"
    try:
        for key in keys:
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
        await call(store.flush())
        assert shared.hget(hd, "n") in (None, b"1")
        live = store._iter_bucket_pages
        split: list[int] = []

        def split_then_read(*args: Any) -> Any:
            if not split:
                for kind in ("pg", "pgl"):
                    source = f"{redis_prefix}:{kind}:{{{SCOPE}|a.example}}:0"
                    target = f"{redis_prefix}:{kind}:{{{SCOPE}|a.example}}:1"
                    for field, raw in shared.hgetall(source).items():
                        if bucket_of(field.decode(), 2) == 1:
                            shared.hset(target, field, raw)
                            shared.hdel(source, field)
                            split.append(1)
                shared.hset(hd, "n", 2)
            return live(*args)

        store._iter_bucket_pages = split_then_read  # type: ignore[method-assign]
        removed = store.forget_host(SCOPE, "a.example")
        del store._iter_bucket_pages
        assert split  # some pages moved
        assert removed.pages == 30
        assert [k for k in prefix_keys(redis_prefix) if b"a.example" in k] == []
        got = await call(store.summarize_pages(SCOPE, after=-math.inf, upto=math.inf,
                                               checked_before=math.inf))
        assert tuple(got)[:2] == (0, 0)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_paging_through_due_pages_while_another_worker_splits_buckets(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """A reader pages through the due pages while another worker's flush
    splits a host's bucket it has not read yet (moving due pages to new
    buckets): every due page is read once, none missed, none twice."""
    due_pages = [PageKey(SCOPE, f"https://h{h}.example/p/{n}") for h in range(69)
                 for n in range(10)]
    late = [PageKey(SCOPE, f"https://late.example/p/{n}") for n in range(30)]
    visits = {key: 1_000 + n for n, key in enumerate(due_pages)} | {
        key: 2_000 + n for n, key in enumerate(late)}
    reader, writer = open_at(redis_prefix), open_at(redis_prefix)
    try:
        for key, visit in visits.items():
            writer.stage_page(realistic_state(key).copy(next_visit=visit))
        await call(writer.flush())
        read = await call(reader.get_due(SCOPE, 5_000, 10))
        # late.example's one bucket is not read yet; its due pages are
        # split over new buckets by pages another worker adds.
        for n in range(30, 90):
            writer.stage_page(realistic_state(PageKey(SCOPE, f"https://late.example/p/{n}"))
                              .copy(next_visit=10**9))
        await call(writer.flush())
        assert shared.hget(f"{redis_prefix}:hd:{{{SCOPE}|late.example}}", "n") != b"1"
        for _ in range(10, 1_000, 250):
            read += await call(reader.get_due(SCOPE, 5_000, 250, due_after(read[-1])))
        assert [s.key for s in read] == sorted(visits, key=lambda k: (visits[k], k.url))
    finally:
        await call(reader.close())
        await call(writer.close())


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
        # One round-trip for 2,501 pages (read scripts of <= 2,000 pages each,
        # pipelined), plus one per get_page above.
        assert store.roundtrips == trips + 1 + 1 + len(keys)
        assert own_redis.command_calls()["evalsha"] - after["evalsha"] == 2 + len(keys)
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
            assert stored_pages(client, "f") == 1
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
    # Tried again for a moment, not the default 30 s: what is kept after the
    # giving up is the question here (a Redis back within the bound is in
    # tests/test_store_faults.py).
    store.retry_time = GIVE_UP_SOON
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
        assert stored_pages(client, "s") == 1
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
        # No retries: the cut lasts, and the crawl stops at once (a Redis
        # back within the bound is in tests/test_store_faults.py).
        "INCREMENTAL_REDIS_RETRY_TIME": 0,
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
    # The lost reply is sent again within the bound (known by its token),
    # then given up on: two tries of 1 s, not 30 s of them.
    store = open_store(Settings({"INCREMENTAL_STATE_URI": uri,
                                 "INCREMENTAL_REDIS_RETRY_TIME": 2 * GIVE_UP_SOON}))
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
async def test_a_flush_whose_reply_was_lost_a_day_ago_is_not_sent_again(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past half the life of its token (Redis may have forgotten whether it
    ran), a batch whose reply was lost is not sent again: it could apply
    its writes twice. The flush says so; its writes stay staged."""
    proxy = CuttableProxy()
    db = REDIS_URI.rsplit("/", 1)[1]
    uri = f"redis://127.0.0.1:{proxy.port}/{db}?prefix={redis_prefix}&socket_timeout=1"
    store = open_store(Settings({"INCREMENTAL_STATE_URI": uri,
                                 "INCREMENTAL_REDIS_RETRY_TIME": 2 * GIVE_UP_SOON}))
    key = PageKey(SCOPE, URL)
    try:
        store.stage_page(full_state(key, 1))
        await call(store.flush())
        store.stage_check(key, 304, 3_000_000)
        proxy.mute_replies.set()
        with pytest.raises(StateStoreError):
            await call(store.flush())
        proxy.mute_replies.clear()
        later(monkeypatch, 0.51)
        with pytest.raises(StateStoreError, match="reply was lost"):
            await call(store.flush())
        assert store.pending == 1
    finally:
        monkeypatch.undo()
        await call(store.close())
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
    due = f"{redis_prefix}:dueb:{SCOPE}"
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
        # The damaged index, the flush's token and the layout record: no
        # item, links, page, bucket count or scope was written.
        assert {k.split(b":")[1] for k in prefix_keys(redis_prefix)} == {
            b"dueb", b"flush", b"meta"}
        shared.delete(due)
        assert await call(store.flush()) == 3
        assert store.item_history(SCOPE, "a") == [(1, "fp-a-1")]
        assert await call(store.get_links(key)) == '["x"]'
        assert await call(store.get_page(key)) == full_state(key, 1)
    finally:
        shared.delete(due)
        await call(store.close())


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random",
                                    "volatile-lru", "volatile-lfu", "volatile-random",
                                    "volatile-ttl"])
def test_a_redis_that_may_evict_keys_is_refused(own_redis: OwnRedis, policy: str) -> None:
    """A Redis run as a cache drops keys when full: items or whole pages
    hashes would vanish silently (validators left without their data).
    One that evicts only the keys with a TTL would drop the flushes'
    tokens (``P:flush:*``), and a flush sent again after its reply was lost
    would apply its writes twice. The error names the setting to change."""
    with own_redis.client() as client:
        client.config_set("maxmemory-policy", policy)
        client.config_set("maxmemory", str(1 << 30))
    with pytest.raises(StateStoreError, match=f"{policy}.*maxmemory-policy noeviction"):
        RedisStateStore(own_redis.uri, prefix="ev")


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru"])
@pytest_twisted.ensureDeferred
async def test_a_redis_with_an_evicting_policy_but_no_maxmemory_is_accepted_with_a_warning(
    own_redis: OwnRedis, policy: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """With maxmemory 0 Redis never evicts, whatever its policy (a Redis
    shared with applications that set volatile-* for their own keys): the
    store opens, and warns that a maxmemory set later would evict its keys."""
    with own_redis.client() as client:
        client.config_set("maxmemory-policy", policy)
        client.config_set("maxmemory", "0")
    with caplog.at_level(logging.WARNING):
        store = RedisStateStore(own_redis.uri, prefix="ev")
    try:
        assert any(r.levelno == logging.WARNING and policy in r.getMessage()
                   and "once a maxmemory is set" in r.getMessage() for r in caplog.records)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_redis_that_never_evicts_is_accepted(own_redis: OwnRedis) -> None:
    with own_redis.client() as client:
        client.config_set("maxmemory-policy", "noeviction")
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
async def test_a_migration_whose_lock_lapsed_stops_and_leaves_the_new_holder_alone(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """A migrating process that stalled past its lock's time, when another
    took the lock, writes nothing more and leaves that lock as it is (two
    processes never migrate side by side)."""
    store = open_at(redis_prefix)
    lock = f"{redis_prefix}:migrating"
    try:
        shared.set(lock, "the other process", ex=60)
        page = store._page_op(realistic_state(PageKey(SCOPE, URL)))
        with pytest.raises(StateStoreError, match="lapsed"):
            store._apply_now([page], {SCOPE}, lock, "this process")
        assert shared.get(lock) == b"the other process"
        assert await call(store.get_page(PageKey(SCOPE, URL))) is None
        # Held: renewed and applied.
        shared.set(lock, "this process", ex=5)
        store._apply_now([page], {SCOPE}, lock, "this process")
        assert shared.ttl(lock) > 5
        assert await call(store.get_page(PageKey(SCOPE, URL))) == realistic_state(
            PageKey(SCOPE, URL))
    finally:
        shared.delete(lock)
        await call(store.close())


def layout2_record(state: PageState) -> str:
    """A page record as layout 2 wrote it: JSON of the fields not at their
    default, times as whole seconds."""
    record: dict[str, Any] = {}
    for f in fields(PageState):
        value = getattr(state, f.name)
        if f.name != "key" and value != f.default:
            record[f.name] = int(value) if isinstance(value, float) else value
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


def write_layout2(shared: redis.Redis, prefix: str, pages: list[PageState],
                  links: dict[PageKey, str]) -> None:
    """A prefix as layout 2 left it: one pages hash per scope (field: URL,
    NUL and variant), its revisit index of pages with a callback (gone ones
    left out, as before they were re-seeded: no ``gone_due`` mark), links."""
    shared.hset(f"{prefix}:meta", mapping={"layout": LAYOUT, "version": 2})
    for state in pages:
        key = state.key
        part = quote(key.scope, safe="")
        field = f"{key.url}\0{key.variant}" if key.variant else key.url
        shared.sadd(f"{prefix}:scopes", key.scope)
        shared.hset(f"{prefix}:pages:{part}", field, layout2_record(state))
        if state.callback and not state.flags & PageFlags.GONE:
            shared.zadd(f"{prefix}:due:{part}", {field: state.next_visit})
        if key in links:
            shared.hset(f"{prefix}:links:{part}", field, links[key])


@pytest_twisted.ensureDeferred
async def test_layout_2_store_is_migrated(redis_prefix: str, shared: redis.Redis) -> None:
    """Every page, links record and due page of a layout-2 prefix reads the
    same after the move, gone pages with a callback due at their recheck;
    the old keys go. A record that cannot be read stops the migration with
    the layout marked as under way (code of layout 2 refuses the prefix), old
    keys kept; once it is repaired, opening the store again finishes it."""
    pages = [
        realistic_state(PageKey(SCOPE, URL)),
        realistic_state(PageKey(SCOPE, URL, "ae=identity")).copy(
            callback="parse_item", recipe='{"priority":2}', next_visit=1_000),
        full_state(PageKey(SCOPE, "http://127.0.0.1:8080/x?b=2"), 3, callback="parse",
                   next_visit=500, flags=PageFlags.GONE),
        full_state(PageKey(SCOPE, "https://other.example/é"), 2),
        realistic_state(PageKey("a:b c", URL)),
    ]
    links = {pages[0].key: '["https://example.com/b"]', pages[3].key: "[]"}
    write_layout2(shared, redis_prefix, pages, links)
    shared.hset(f"{redis_prefix}:items:{SCOPE}", "k", '{"fingerprint":"fp"}')
    damaged = f"{redis_prefix}:pages:{SCOPE}"
    shared.hset(damaged, "https://example.com/damaged", "{not json")

    with pytest.raises(StateStoreError, match="cannot migrate the page record") as info:
        open_at(redis_prefix)
    assert damaged in str(info.value) and "repair or delete it" in str(info.value)
    assert shared.hgetall(f"{redis_prefix}:meta") == {
        b"layout": LAYOUT.encode(), b"version": str(LAYOUT_VERSION).encode(),
        b"upgrading": b"2"}
    assert shared.hlen(damaged) == 5
    assert not shared.exists(f"{redis_prefix}:migrating")

    shared.hdel(damaged, "https://example.com/damaged")
    store = open_at(redis_prefix)
    try:
        assert shared.hgetall(f"{redis_prefix}:meta") == {
            b"layout": LAYOUT.encode(), b"version": str(LAYOUT_VERSION).encode()}
        assert not [k for k in prefix_keys(redis_prefix)
                    if k.split(b":")[1] in (b"pages", b"due", b"links")]
        for state in pages:
            assert await call(store.get_page(state.key)) == state
        assert sorted(s.key for s in store.iter_pages(SCOPE)) == sorted(
            s.key for s in pages if s.key.scope == SCOPE)
        assert store.count_pages() == len(pages)
        assert [s.key for s in await call(store.get_due(SCOPE, math.inf, 10))] == [
            pages[2].key, pages[1].key, pages[0].key]
        for key, record in links.items():
            assert await call(store.get_links(key)) == record
        assert await call(store.get_item_fingerprint(SCOPE, "k")) == "fp"
    finally:
        await call(store.close())


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
    of the scope leaves it, and any other key not of this store's kinds;
    of the store's own, only the scope's write generation (``P:wg:<s>``,
    raised by the reset, never deleted: no token read before it comes back)."""
    scope = "example.com"
    store = open_at(redis_prefix)
    try:
        store.stage_page(full_state(PageKey(scope, "https://example.com/a"), 1))
        store.stage_item(item("k", scope=scope, page="https://example.com/a"))
        await call(store.flush())
        foreign = [f"{redis_prefix}:anything:{scope}", f"{redis_prefix}:budget:{scope}"]
        for key in foreign:
            shared.set(key, "not the store's")
        generation = await call(store.write_generation(scope, [scope]))
        assert store.reset_scope(scope).pages == 1
        assert sorted(k.decode() for k in prefix_keys(redis_prefix)
                      if k.decode().endswith(f":{scope}") or ":hist:" in k.decode()) == sorted(
            [*foreign, f"{redis_prefix}:wg:{scope}"])
        assert await call(store.write_generation(scope, [scope])) != generation
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


# -- sums of pages by next visit (layout 4) -----------------------------------


def sums_states(n: int = 300) -> list[PageState]:
    rng = random.Random(4)
    return [full_state(PageKey(SCOPE, f"https://h{i % 4}.example/p/{i}"), 1,
                       next_visit=rng.randrange(0, 20_000), last_checked=rng.randrange(0, 900),
                       size=rng.randrange(0, 9_000),
                       callback=rng.choice(("parse", "parse", "parse_list", None)))
            for i in range(n)]


@pytest_twisted.ensureDeferred
async def test_a_summary_reads_sums_not_pages_once_a_crawl_took_the_scope(
    redis_prefix: str, shared: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a crawl took the scope, its summaries (the re-seeder's, of the
    pages not checked this crawl) come from the sums and this crawl's
    checks, never from every page; before, or for a time before its start,
    every page is read (and the answer is the same)."""
    states = sums_states()
    store = open_at(redis_prefix)
    try:
        for state in states:
            store.stage_page(state)
        await call(store.flush())
        scans: list[float] = []
        scan = store._summarize_scan

        async def counted(*args: Any, **kwargs: Any) -> Any:
            scans.append(kwargs["checked_before"])
            return await scan(*args, **kwargs)

        monkeypatch.setattr(store, "_summarize_scan", counted)

        async def summary(checked_before: float) -> tuple[int, int, float | None]:
            return tuple(await call(store.summarize_pages(
                SCOPE, after=5_000, upto=math.inf, checked_before=checked_before,
                exclude_callbacks=("parse_list",))))

        def expected(checked_before: float) -> tuple[int, int, float | None]:
            chosen = [s for s in states if s.callback == "parse" and s.next_visit > 5_000
                      and s.last_checked < checked_before]
            return (len(chosen), sum(s.size for s in chosen),
                    min((s.next_visit for s in chosen), default=None))

        assert await summary(math.inf) == expected(math.inf)  # beyond every check
        assert await summary(500) == expected(500)  # no crawl took the scope: read
        assert scans == [500]
        assert store.take_scope(SCOPE, "crawl", 60, 1_000.5) is None
        checked = states[:40]
        for n, state in enumerate(checked):
            store.stage_check(state.key, 304, 1_000 + n, schedule=(60, 6_000 + n))
        await call(store.flush())
        current = {s.key: s for s in store.iter_pages(SCOPE)}
        states = [current[s.key] for s in states]
        assert await summary(1_001) == expected(1_001)
        assert await summary(1_020) == expected(1_020)
        assert scans == [500]  # from the sums, this crawl's checks taken out
        assert await summary(999) == expected(999)  # before the crawl took it
        assert scans == [500, 999]
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_layout_3_store_gets_its_sums_built_once(
    redis_prefix: str, shared: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A store of layout 3 (no sums) is migrated: its sums are built from
    every page once; nothing else changes, and summaries are right."""
    states = sums_states()
    store = open_at(redis_prefix)
    try:
        for state in states:
            store.stage_page(state)
        await call(store.flush())
    finally:
        await call(store.close())
    before = {k: shared.dump(k) for k in prefix_keys(redis_prefix)
              if k.split(b":")[1] not in (b"nvs", b"nvf", b"nvm", b"ck", b"meta")}
    for key in prefix_keys(redis_prefix):
        if key.split(b":")[1] in (b"nvs", b"nvf", b"nvm", b"ck"):
            shared.delete(key)
    shared.hset(f"{redis_prefix}:meta", "version", 3)
    caplog.set_level(logging.INFO, logger="incremental_crawler.state.stores.redis.store")
    store = open_at(redis_prefix)
    try:
        assert shared.hgetall(f"{redis_prefix}:meta") == {
            b"layout": LAYOUT.encode(), b"version": str(LAYOUT_VERSION).encode()}
        assert {k: shared.dump(k) for k in prefix_keys(redis_prefix)
                if k.split(b":")[1] not in (b"nvs", b"nvf", b"nvm", b"ck", b"meta")} == before
        assert any(f"the sums of the {len(states)} pages of scope" in r.getMessage()
                   for r in caplog.records)
        for after, upto, checked_before in ((-math.inf, math.inf, math.inf),
                                            (3_000, 15_000, 500), (-1, 7_777, math.inf)):
            chosen = [s for s in states if s.callback is not None and after < s.next_visit <= upto
                      and s.last_checked < checked_before]
            assert tuple(await call(store.summarize_pages(
                SCOPE, after=after, upto=upto, checked_before=checked_before))) == (
                len(chosen), sum(s.size for s in chosen),
                min((s.next_visit for s in chosen), default=None))
    finally:
        await call(store.close())


# -- the walk memo's write generation --------------------------------------------


@pytest_twisted.ensureDeferred
async def test_the_write_generation_is_one_counter_a_scope_raised_once_a_flush(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """One server counts a scope's page and links writes in one counter
    (``P:wg:<s>``), raised once by a flush whatever the pages and hosts it
    writes; a flush that writes no page state nor links record leaves it."""
    counter = f"{redis_prefix}:wg:{SCOPE}"
    store = open_at(redis_prefix)
    try:
        assert await call(store.write_generation(SCOPE, ["example.com"])) == "0"
        for n in range(3):
            store.stage_page(full_state(PageKey(SCOPE, f"https://a{n % 2}.example/p{n}"), 1))
        store.stage_links(PageKey(SCOPE, "https://a0.example/p0"), '{"v":3,"n":0}')
        await call(store.flush())
        assert shared.get(counter) == b"1"
        # The scope's, whatever the hosts asked (a host not written too).
        assert await call(store.write_generation(SCOPE, ["b.example"])) == "1"
        # Nothing of a page written: an item, a flag of an unknown page, no
        # links record to delete.
        store.stage_item(item("a"))
        store.stage_flags(PageKey(SCOPE, "https://a0.example/unknown"), 1)
        store.stage_links(PageKey(SCOPE, "https://a1.example/p1"), None)
        await call(store.flush())
        assert shared.get(counter) == b"1"
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_damaged_write_generation_fails_the_flush_before_any_write(
    redis_prefix: str, shared: redis.Redis
) -> None:
    """The flush raises the counter after its writes: a counter INCR would
    refuse (not an integer) fails the flush before anything is written, as
    a key of the wrong type does, rather than leave pages written without
    the token moving."""
    counter = f"{redis_prefix}:wg:{SCOPE}"
    store = open_at(redis_prefix)
    try:
        shared.set(counter, "not a number")
        store.stage_page(full_state(PageKey(SCOPE, URL), 1))
        with pytest.raises(StateStoreError, match="not a counter"):
            await call(store.flush())
        assert shared.exists(f"{redis_prefix}:hd:{{{SCOPE}|example.com}}") == 0
        shared.set(counter, 41)
        assert await call(store.flush()) == 1
        assert shared.get(counter) == b"42"
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_reset_of_a_full_redis_runs_and_raises_the_write_generation(
    own_redis: OwnRedis,
) -> None:
    """A reset is how a full Redis is freed: above maxmemory it still runs
    (DEL is allowed there), and so does its raise of the write generation
    (a script flagged allow-oom, in the same MULTI), so the token read
    before it does not come back."""
    store = RedisStateStore(own_redis.uri, prefix="full")
    client = own_redis.client()
    try:
        store.stage_page(full_state(PageKey(SCOPE, URL), 1))
        await call(store.flush())
        before = await call(store.write_generation(SCOPE, ["example.com"]))
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")  # above it: writes refused
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("full:probe", 1)
        assert store.reset_scope(SCOPE).pages == 1
        client.config_set("maxmemory", "0")
        assert await call(store.get_page(PageKey(SCOPE, URL))) is None
        after = await call(store.write_generation(SCOPE, ["example.com"]))
        assert (before, after) == ("1", "2")
    finally:
        client.close()
        await call(store.close())


@pytest.mark.parametrize("bad", ["007", "-0", "99999999999999999999", "9223372036854775807", "x"])
@pytest_twisted.ensureDeferred
async def test_a_write_generation_that_cannot_be_raised_refuses_writes_and_repairs(
    redis_prefix: str, shared: redis.Redis, bad: str,
) -> None:
    """A counter INCR would refuse or overflow (raised after the writes, in
    scripts and a MULTI that nothing rolls back) refuses a flush's writes
    and a repair before any, and reads as no token (no walk memo)."""
    counter = f"{redis_prefix}:wg:{SCOPE}"
    store = open_at(redis_prefix)
    key = PageKey(SCOPE, URL)
    try:
        store.stage_page(full_state(key, 1))
        await call(store.flush())
        assert await call(store.write_generation(SCOPE, ["example.com"])) == "1"
        shared.set(counter, bad)
        assert await call(store.write_generation(SCOPE, ["example.com"])) is None
        with pytest.raises(StateStoreError, match="nothing was deleted"):
            store.forget_page(SCOPE, URL)
        assert await call(store.get_page(key)) == full_state(key, 1)
        store.stage_page(full_state(key, 2))
        with pytest.raises(StateStoreError):
            await call(store.flush())
        reader = open_at(redis_prefix)
        try:
            assert await call(reader.get_page(key)) == full_state(key, 1)
        finally:
            await call(reader.close())
        assert shared.get(counter) == bad.encode()
    finally:
        shared.set(counter, "5")
        await call(store.close())
