"""The Redis state store on a real Redis Cluster (three loopback primaries,
``tests/redis_cluster_util.py``), beyond the store contract that
``tests/test_store_contract.py`` runs on it: what its phased flush leaves
when a phase fails on one node, a reply lost after its scripts ran, and
where its keys live (every key tagged, a host's keys in one slot).

Each test has a key prefix of its own, deleted from every node afterwards.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import shlex
import signal
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from scrapy.crawler import CrawlerRunner
from scrapy.settings import Settings
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from incremental_crawler.hosts import host_of
from incremental_crawler.state.records import HostTrust, PageKey
from incremental_crawler.state.stores.base import RepairStopped, StateStoreError, due_after
from incremental_crawler.state.stores.redis import RedisStateStore
from incremental_crawler.state.stores.redis import core as redis_core
from incremental_crawler.state.stores.redis import due as due_reads
from incremental_crawler.state.stores.redis.cluster import _Effects
from incremental_crawler.state.stores.redis.core import (
    SCOPE_SHARDS,
    host_group,
    host_tag,
    item_group,
    scope_shard,
    shard_part,
)
from incremental_crawler.state.stores.redis.layout import (
    CLUSTER_LAYOUT_VERSION,
    LAYOUT,
    LAYOUT_VERSION,
)
from incremental_crawler.state.stores.redis.ledger_entry import EXPIRED_EMPTY
from incremental_crawler.state.stores.redis.pages import bucket_of, host_part
from incremental_crawler.state.stores.redis.scripts import (
    _APPLIED_KEPT,
    _LEDGER_HONOURED,
    _TOKEN_TTL,
    CLUSTER_FORGET_LUA,
    CLUSTER_HOST_LUA,
    CLUSTER_ITEMS_LUA,
    CLUSTER_SCOPE_LUA,
    CLUSTER_SUMMARY_LUA,
)
from tests.clock_util import later
from tests.conftest import crawl_settings
from tests.redis_util import new_prefix
from tests.scrapy_cli import run
from tests.site import PLAIN_KINDS
from tests.spiders import ListSpider
from tests.test_fatal import crawl_args, one_error_line
from tests.test_store_contract import SCOPE, brute_summary, call, full_state, item

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from incremental_crawler.state.records import PageState
    from tests.redis_cluster_util import LoopbackCluster


@pytest.fixture
def prefix(redis_cluster: LoopbackCluster) -> Iterator[str]:
    name = new_prefix()
    yield name
    redis_cluster.delete(f"{name}:*")


def shard_of(host: str) -> str:
    """The inside of the tag of the scope shard *host* is in (``<s>^<x>``)."""
    return shard_part(SCOPE, scope_shard(host))


#: The scope shard of a.example, the host most tests write.
A_SHARD = shard_of("a.example")


def host_key(prefix: str, kind: str, host: str, scope: str = SCOPE) -> str:
    """A host's key of *kind* (its group's tag, then the host)."""
    return f"{prefix}:{kind}:{host_tag(scope, host)}"


def ledger_key(prefix: str, host: str, scope: str = SCOPE) -> str:
    """The ledger of *host*'s group."""
    return f"{prefix}:fx:{{{scope}|{host_group(host)}}}"
LONELY_SHARD = shard_of("lonely.example")

#: What a crawl or a command needs to open the state store on a cluster.
ON_CLUSTER = Settings({"INCREMENTAL_STATE_ON_REDIS_CLUSTER": True})


def open_store(cluster: LoopbackCluster, prefix: str) -> RedisStateStore:
    return RedisStateStore(cluster.url, prefix=prefix)


def hosts_on_two_nodes(cluster: LoopbackCluster, prefix: str) -> tuple[str, str]:
    """Two hosts whose keys are on different nodes of the cluster."""
    def port(host: str) -> int:
        return cluster.port_of(host_key(prefix, "hd", host))

    first = "a.example"
    for n in range(100):
        other = f"b{n}.example"
        if port(other) != port(first):
            return first, other
    raise AssertionError("no two hosts on two nodes in 100 tries")


async def assert_sums_are_the_pages(store: RedisStateStore) -> None:
    """Every summary the sums give is what the pages one by one say, and
    no coarse sum is negative (effects applied twice in one window and
    taken out twice in another would net out in a wide summary)."""
    for key in store._shard_keys("nvs", SCOPE):
        for field, value in store._sync.hgetall(key).items():
            pages, size = (int(v) for v in value.split())
            assert pages >= 0 and size >= 0, (key, field, value)
    states = list(store.iter_pages(SCOPE))
    for after, upto in ((-math.inf, math.inf), (0, 5_000), (5_000, math.inf)):
        got = await call(store.summarize_pages(SCOPE, after=after, upto=upto,
                                               checked_before=math.inf))
        assert tuple(got) == brute_summary(states, after, upto, math.inf, ())


async def assert_whole_summary(store: RedisStateStore, pages: int) -> None:
    """A summary of the whole scope counts *pages* (applying what the
    ledgers hold), and every summary the sums give is the pages'."""
    summary = await call(store.summarize_pages(SCOPE, after=-math.inf, upto=math.inf,
                                               checked_before=math.inf))
    assert summary[0] == pages
    await assert_sums_are_the_pages(store)


@pytest.mark.parametrize("named_by", ["node", "seeds"])
def test_a_store_on_a_cluster_is_of_the_cluster_layout(
        redis_cluster: LoopbackCluster, prefix: str, named_by: str) -> None:
    url = redis_cluster.url if named_by == "node" else redis_cluster.seeds_url
    uri = f"{url}?prefix={prefix}"
    assert RedisStateStore.exists(uri) is False
    # Refused, before anything is written there, when a project says so.
    with pytest.raises(StateStoreError, match="INCREMENTAL_STATE_ON_REDIS_CLUSTER is False"):
        RedisStateStore.from_uri(uri, settings=Settings(
            {"INCREMENTAL_STATE_ON_REDIS_CLUSTER": False}))
    assert RedisStateStore.exists(uri) is False
    # Opened by default: no setting needed.
    store = RedisStateStore.from_uri(uri, settings=Settings())
    store._sync.close()
    assert RedisStateStore.exists(uri) is True
    with redis_cluster.client() as client:
        assert client.hgetall(f"{prefix}:meta") == {
            b"layout": LAYOUT.encode(), b"version": str(CLUSTER_LAYOUT_VERSION).encode()}
        # A prefix of layout 4 on a cluster was not written by this store
        # (it refused clusters): refused, not taken for its own.
        client.hset(f"{prefix}:meta", "version", LAYOUT_VERSION)
    with pytest.raises(StateStoreError, match="where only the cluster layout"):
        RedisStateStore.from_uri(uri, settings=ON_CLUSTER)
    # One of the first cluster layout (5: a scope's keys in one slot) is
    # refused, not read as if sharded, nor migrated.
    with redis_cluster.client() as client:
        client.hset(f"{prefix}:meta", "version", 5)
    with pytest.raises(StateStoreError, match=r"cluster layout version 5.*does not migrate"):
        RedisStateStore.from_uri(uri, settings=ON_CLUSTER)


def test_a_worker_opening_a_new_store_while_another_creates_it_agrees(
        redis_cluster: LoopbackCluster, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first worker writes the new store's layout and version in one
    MULTI: a second worker opening in between (here: right after the first
    sent, or queued, its first HSETNX) never reads a layout without its
    version (it refused the prefix as not a store's)."""
    opened: list[RedisStateStore] = []
    hsetnx = RedisCluster.hsetnx
    calls: list[int] = []

    def open_another(self: Any, *args: Any) -> Any:
        calls.append(1)
        reply = hsetnx(self, *args)
        if len(calls) == 1:  # (the second store's own HSETNX go through)
            opened.append(open_store(redis_cluster, prefix))
        return reply

    monkeypatch.setattr(RedisCluster, "hsetnx", open_another)
    first = open_store(redis_cluster, prefix)
    for store in (first, *opened):
        store._sync.close()
    assert len(opened) == 1
    with redis_cluster.client() as client:
        assert client.hgetall(f"{prefix}:meta") == {
            b"layout": LAYOUT.encode(), b"version": str(CLUSTER_LAYOUT_VERSION).encode()}


@pytest_twisted.ensureDeferred
async def test_every_key_is_tagged_and_a_hosts_keys_share_a_slot(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    store = open_store(redis_cluster, prefix)
    try:
        for n in range(120):  # enough for a host's buckets to split
            key = PageKey(SCOPE, f"https://a.example/p{n}")
            store.stage_item(item(f"i{n}", page=key.url))
            store.stage_links(key, '["x"]')
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        assert await call(store.flush()) == 360
    finally:
        await call(store.close())
    keys = [k.decode() for k in redis_cluster.keys(f"{prefix}:*")]
    # The flush's tokens went with the store's close (its replies came).
    assert [k for k in keys if k.startswith(f"{prefix}:flush:")] == []
    untagged = [k for k in keys if "{" not in k and k not in (f"{prefix}:meta",
                                                               f"{prefix}:scopes")]
    assert untagged == []
    host_keys = [k for k in keys if k.endswith(host_tag("books", "a.example"))
                 or host_tag("books", "a.example") + ":" in k]
    # (Records of every field are longer than a listpack entry: pgl.)
    assert {k.split(":")[1] for k in host_keys} >= {"hd", "ln", "pgl"}
    assert len({key_slot(k.encode()) for k in host_keys}) == 1
    # The buckets split (120 pages, 40 a bucket): more than one.
    assert sum(1 for k in host_keys if k.split(":")[1] in ("pg", "pgl")) > 1
    # The items are spread over their groups, on every node.
    groups = [k for k in keys if k.startswith(f"{prefix}:items:")]
    assert len(groups) > 50
    assert len({redis_cluster.port_of(k) for k in groups}) == 3


@pytest_twisted.ensureDeferred
async def test_a_flush_failing_in_phase_2_on_one_node_leaves_no_page_ahead_of_its_items(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    a_host, b_host = hosts_on_two_nodes(redis_cluster, prefix)
    a, b = PageKey(SCOPE, f"https://{a_host}/p"), PageKey(SCOPE, f"https://{b_host}/p")
    store = open_store(redis_cluster, prefix)
    reader = open_store(redis_cluster, prefix)
    try:
        for key in (a, b):
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
        await call(store.flush())

        # The second crawl of both pages: their items, then their states.
        store.stage_item(item("ia", 2, page=a.url))
        store.stage_item(item("ib", 2, page=b.url))
        store.stage_page(full_state(a, 2, callback="parse", next_visit=2_000))
        store.stage_page(full_state(b, 2, callback="parse", next_visit=3_000))
        # A damaged key of host a: its links hash is not a hash, so its
        # script of phase 2 applies nothing (host b's, on another node, runs).
        links = host_key(prefix, "ln", a_host)
        with redis_cluster.client() as client:
            assert client.set(links, "damaged")
            with pytest.raises(StateStoreError, match="WRONGTYPE"):
                await call(store.flush())
            # Phase 1 ran whole: every item is stored...
            assert await call(reader.get_item_fingerprint(SCOPE, "ia")) == "fp-ia-2"
            assert await call(reader.get_item_fingerprint(SCOPE, "ib")) == "fp-ib-2"
            # ...host a's page is as it was (data ahead of state, never the
            # other way), host b's is written.
            assert await call(reader.get_page(a)) == full_state(
                a, 1, callback="parse", next_visit=1_000)
            assert await call(reader.get_page(b)) == full_state(
                b, 2, callback="parse", next_visit=3_000)
            # What is left: host a's page write (the items and b's page are
            # not sent again).
            assert store.pending == 1
            client.delete(links)

        # The retried flush completes: a's page, and phase 3 with the
        # effects of both pages' writes (b's kept from the failed flush).
        assert await call(store.flush()) == 1
        assert store.pending == 0
        assert await call(reader.get_page(a)) == full_state(a, 2, callback="parse",
                                                            next_visit=2_000)
        assert await call(reader.get_page_items(SCOPE, a.url)) == ["ia"]
        assert [s.key for s in await call(reader.get_due(SCOPE, 2_500, 10))] == [a]
        await assert_sums_are_the_pages(reader)
    finally:
        await call(store.close())
        await call(reader.close())


@pytest_twisted.ensureDeferred
async def test_an_items_page_index_member_lost_with_phase_2_is_written_by_the_refetch(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A worker gone after phase 1 (its items stored, their
    page index members due with phase 2): the page was not written, so it
    is fetched again, and its unchanged item's write lists it again."""
    key = PageKey(SCOPE, "https://a.example/p0")
    gone = open_store(redis_cluster, prefix)
    gone.stage_item(item("x", 1, page=key.url))
    gone.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
    cut_before(gone, CLUSTER_HOST_LUA)
    with pytest.raises(StateStoreError):
        await call(gone.flush())
    await call(die(gone))
    store = open_store(redis_cluster, prefix)
    try:
        assert await call(store.get_page(key)) is None  # fetched again
        store.stage_item(item("x", 1, page=key.url))
        store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
        await call(store.flush())
        assert await call(store.get_page_items(SCOPE, key.url)) == ["x"]
    finally:
        await call(store.close())


def lose_reply_of(store: RedisStateStore, script: str) -> list[int]:
    """Make the first pipeline that runs *script* lose its reply after it
    ran (as a connection cut after the scripts were sent); returns the
    list the times it did so are counted in."""
    lost: list[int] = []
    original = store._eval_many

    async def eval_many(calls: list[tuple[str, list[str], list[Any]]],
                        plain: Any = ()) -> list[Any]:
        replies = await original(calls, plain)
        if not lost and any(sent == script for sent, _, _ in calls):
            lost.append(1)
            raise redis.exceptions.ConnectionError("the reply was lost")
        return replies

    store._eval_many = eval_many  # type: ignore[method-assign]
    return lost


@pytest.mark.parametrize("phase", [CLUSTER_ITEMS_LUA, CLUSTER_HOST_LUA, CLUSTER_SCOPE_LUA],
                         ids=["items", "pages", "scope"])
@pytest_twisted.ensureDeferred
async def test_a_phase_whose_reply_was_lost_is_not_applied_twice(
    redis_cluster: LoopbackCluster, prefix: str, phase: str,
) -> None:
    """A phase's scripts that ran but whose reply never came are sent again
    under their tokens by the next flush: item versions, checks and the
    sums are counted once."""
    key = PageKey(SCOPE, "https://a.example/p")
    store = open_store(redis_cluster, prefix)
    reader = open_store(redis_cluster, prefix)
    try:
        store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
        await call(store.flush())
        store.stage_item(item("a", 1, page=key.url))
        store.stage_check(key, 304, 3_000_000, schedule=(3_600, 4_000))
        lost = lose_reply_of(store, phase)
        with pytest.raises(StateStoreError):
            await call(store.flush())
        assert lost == [1]
        # Sent again, with a write staged since.
        store.stage_item(item("b", 1))
        await call(store.flush())
        assert store.pending == 0
        assert reader.item_history(SCOPE, "a") == [(1, "fp-a-1")]
        assert reader.item_history(SCOPE, "b") == [(1, "fp-b-1")]
        page = await call(reader.get_page(key))
        assert page is not None and page.checks == 2 and page.next_visit == 4_000
        assert await call(reader.get_page_items(SCOPE, key.url)) == ["a"]
        assert [s.key for s in await call(reader.get_due(SCOPE, 5_000, 10))] == [key]
        await assert_sums_are_the_pages(reader)
    finally:
        await call(store.close())
        await call(reader.close())


@pytest_twisted.ensureDeferred
async def test_a_flush_after_every_node_forgot_its_scripts_applies_once(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """Every primary restarted between two flushes (SCRIPT FLUSH): NOSCRIPT
    for each phase's scripts, loaded and sent again once."""
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(3)]
    store = open_store(redis_cluster, prefix)
    try:
        store.stage_page(full_state(keys[0], 1, callback="parse", next_visit=1_000))
        await call(store.flush())
        with redis_cluster.client() as client:
            client.script_flush()
        for n, key in enumerate(keys):
            store.stage_item(item(f"i{n}", page=key.url))
            store.stage_page(full_state(key, 2, callback="parse", next_visit=1_000 + n))
        await call(store.flush())
        assert [s.key for s in await call(store.get_due(SCOPE, 2_000, 10))] == keys
        for n, key in enumerate(keys):
            assert await call(store.get_page_items(SCOPE, key.url)) == [f"i{n}"]
        await assert_whole_summary(store, 3)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_writes_and_reads_planned_from_a_stale_bucket_count_are_planned_again(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """The flush and the reads choose a page's bucket from its host's bucket
    count read before their scripts run; a count another worker changed
    meanwhile (its writes split the host's buckets) makes the script write
    or read nothing and say so, and the page is planned again."""
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(200)]
    store = open_store(redis_cluster, prefix)
    try:
        for key in keys[:150]:
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
        await call(store.flush())
        hd = host_key(prefix, "hd", "a.example")
        with redis_cluster.client() as client:
            assert int(client.hget(hd, "n")) > 1  # split
        # As if read before another worker's splits: one bucket, no pages.
        stale: list[int] = []
        part_counts = store._part_counts
        host_counts = store._host_counts

        async def stale_parts(parts: Any, *before: Any) -> Any:
            counts, said = await part_counts(parts, *before)
            if not stale:
                stale.append(1)
                return dict.fromkeys(counts, (1, 0)), said
            return counts, said

        async def stale_hosts(hosts: Any) -> Any:
            return dict.fromkeys(await host_counts(hosts), (1, 0))

        store._part_counts = stale_parts  # type: ignore[method-assign]
        store._host_counts = stale_hosts  # type: ignore[method-assign]
        for key in keys[100:]:
            store.stage_page(full_state(key, 2, callback="parse", next_visit=2_000))
        assert await call(store.flush()) == 100
        assert stale == [1]
        found = await call(store.get_pages(keys))
        assert {k: s.checks for k, s in found.items()} == {
            k: 1 if n < 100 else 2 for n, k in enumerate(keys)}
        assert store.count_pages(SCOPE) == 200
        await assert_sums_are_the_pages(store)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_split_whose_bucket_key_is_taken_is_not_made(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    # A key where the host's next bucket would go (written by something
    # else): the host does not split (as on one server), its pages are
    # written to the buckets it has, and the key is left alone.
    foreign = host_key(prefix, "pg", "a.example") + ":1"
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(60)]
    store = open_store(redis_cluster, prefix)
    try:
        with redis_cluster.client() as client:
            client.hset(foreign, "not", "ours")
            for key in keys:
                store.stage_page(full_state(key, 1))
            assert await call(store.flush()) == 60
            assert client.hget(host_key(prefix, "hd", "a.example"), "n") == b"1"
            assert client.hgetall(foreign) == {b"not": b"ours"}
        assert len(await call(store.get_pages(keys))) == 60
    finally:
        await call(store.close())


@pytest.mark.parametrize("reply", ["came", "lost"])
@pytest_twisted.ensureDeferred
async def test_a_split_made_by_a_host_script_that_applied_no_write_keeps_its_bounds(
    redis_cluster: LoopbackCluster, prefix: str, reply: str,
) -> None:
    """A host script makes its planned splits before its writes: when its
    first write then fails (a damaged record read by a check) it has
    applied no write, but the split stays (the host's count raised, pages
    moved to the new bucket). Its effects (the new bucket's bound, the
    splits, the host listed) are kept all the same, in its ledger and by
    the caller (from its reply, or from its replay when the reply was
    lost): the moved pages are due."""
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(40)]
    store = open_store(redis_cluster, prefix)
    hd = host_key(prefix, "hd", "a.example")
    buckets = [key for b in (0, 1) for key in store._bucket_keys(SCOPE, "a.example", b)]
    try:
        for key in keys[:40]:
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
        await call(store.flush())
        # The damaged page and the new one stay in bucket 0 after the split
        # (a write into bucket 1 would list its bound).
        def stays(key: PageKey) -> bool:
            return bucket_of(store._page_args(key)[2], 2) == 0

        damaged_key = next(key for key in keys[:40] if stays(key))
        new_key = next(key for key in (PageKey(SCOPE, f"https://a.example/q{n}")
                                       for n in range(100)) if stays(key))
        damaged = store._page_args(damaged_key)[2].encode()
        with redis_cluster.client() as client:
            assert client.hget(hd, "n") in (None, b"1")
            where = next(b for b in buckets if client.hexists(b, damaged))
            good = client.hget(where, damaged)
            client.hset(where, damaged, good[:-5])  # cut short
        # A check of the damaged page first, then a new page: a split is planned.
        store.stage_check(damaged_key, 200, 1_000_100, schedule=(3_600, 1_500))
        store.stage_page(full_state(new_key, 1, callback="parse", next_visit=1_000))
        lost = lose_reply_of(store, CLUSTER_HOST_LUA) if reply == "lost" else [1]
        with pytest.raises(StateStoreError):
            await call(store.flush())
        assert lost == [1]
        with redis_cluster.client() as client:
            assert client.hget(hd, "n") == b"2"  # split made
            # The damaged record set right (an operator's fix), wherever it went.
            for bucket in buckets:
                if client.hexists(bucket, damaged):
                    client.hset(bucket, damaged, good)
        await call(store.flush())  # the writes sent again: applied now
        assert store.pending == 0
        due = {s.key for s in await call(store.get_due(SCOPE, 2_000, 100))}
        assert due == {*keys[:40], new_key}
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_damaged_scope_key_fails_phase_3_whole_and_its_effects_count_once(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """The scope's script applies phase 2's effects (sums, index, hosts,
    splits) whole or not at all: one refused for a damaged value is sent
    again once it is repaired, and counted once."""
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(100)]
    store = open_store(redis_cluster, prefix)
    splits = f"{prefix}:splits:{{{A_SHARD}}}"
    try:
        with redis_cluster.client() as client:
            # The count of splits is not a number; the flush splits buckets.
            client.set(splits, "damaged")
            for n, key in enumerate(keys):
                store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
            with pytest.raises(StateStoreError, match="is not a number"):
                await call(store.flush())
            # The pages are written (phase 2); nothing of the scope is.
            assert client.hgetall(f"{prefix}:nvs:{{{A_SHARD}}}") == {}
            assert client.smembers(f"{prefix}:hs:{{{A_SHARD}}}") == set()
            client.delete(splits)
        await call(store.flush())
        assert store.pending == 0
        with redis_cluster.client() as client:
            assert int(client.get(splits)) >= 1
        assert len(list(store.iter_pages(SCOPE))) == 100
        await assert_sums_are_the_pages(store)
        due = await call(store.get_due(SCOPE, 1_000 + 99, 200))
        assert [s.key for s in due] == keys
    finally:
        await call(store.close())


def cut_before(store: RedisStateStore, script: str) -> None:
    """Make every pipeline that would run *script* fail before it is sent
    (its node unreachable)."""
    original = store._eval_many

    async def eval_many(calls: list[tuple[str, list[str], list[Any]]],
                        plain: Any = ()) -> list[Any]:
        if any(sent == script for sent, _, _ in calls):
            raise redis.exceptions.ConnectionError("the scope's node is unreachable")
        return await original(calls, plain)

    store._eval_many = eval_many  # type: ignore[method-assign]


async def die(store: RedisStateStore) -> None:
    """The worker is gone: its connections closed, nothing flushed."""
    store._sync.close()
    await store._async.aclose()


@pytest.mark.parametrize("cut", ["before-phase-2", "before-phase-3"])
@pytest_twisted.ensureDeferred
async def test_a_worker_gone_between_phases_1_and_3_leaves_its_versions_waiting(
    redis_cluster: LoopbackCluster, prefix: str, cut: str,
) -> None:
    """At-least-once delivery: a version is committed waiting on its crawl
    in the same commit as the version (docs/design.md). On a cluster the
    version is written in phase 1, by its item group's script, and so is
    its mark: a worker gone after phase 1 (the next phase's node
    unreachable, then killed or stopped) leaves the version stored and
    waiting, and the next crawl emits it again. (Review finding: the mark
    was written in phase 3, in the scope's own slot, in no ledger.)"""
    key = PageKey(SCOPE, "https://a.example/p0")
    gone = open_store(redis_cluster, prefix)
    record = item("x", 1, page=key.url)
    record.delivery = "c1"
    gone.stage_item(record)
    gone.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
    cut_before(gone, CLUSTER_HOST_LUA if cut == "before-phase-2" else CLUSTER_SCOPE_LUA)
    with pytest.raises(StateStoreError):
        await call(gone.flush())
    await call(die(gone))
    store = open_store(redis_cluster, prefix)
    try:
        assert store.item_history(SCOPE, "x") == [(1, "fp-x-1")]  # stored
        assert await call(store.undelivered_crawls(SCOPE)) == ["c1"]  # and waiting
        [waiting] = await call(store.undelivered(SCOPE, "c1"))
        assert (waiting.version.key, waiting.version.version) == ("x", 1)
    finally:
        await call(store.close())


def waiting_on(record: Any, crawl: str) -> Any:
    record.delivery = crawl
    return record


async def all_waiting(store: RedisStateStore, crawl: str, limit: int) -> list[tuple[str, int]]:
    """(key, version) of what waits on *crawl*, read *limit* at a time."""
    found: list[tuple[str, int]] = []
    after = None
    while chunk := await call(store.undelivered(SCOPE, crawl, after=after, limit=limit)):
        found += [(p.version.key, p.version.version) for p in chunk]
        after = chunk[-1]
    return found


@pytest_twisted.ensureDeferred
async def test_a_settled_crawl_leaves_no_mark_in_any_group(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A crawl's marks are kept in its items' groups: settling it (its
    delivery confirmed) deletes them in every group, and forgets the crawl
    in each; another crawl's settle keeps what still waits on it."""
    store = open_store(redis_cluster, prefix)
    try:
        for n in range(40):
            store.stage_item(waiting_on(item(f"i{n}", stored_at=2_000_000 + n), "c1"))
        await call(store.flush())
        marks = [k.decode() for k in redis_cluster.keys(f"{prefix}:undel*")]
        assert len({_tag(k) for k in marks}) > 10  # spread over the groups
        assert all("#" in _tag(k) for k in marks)
        first, second = await call(store.undelivered(SCOPE, "c1", limit=2))
        store.stage_redelivered(first, "c2")
        store.stage_redelivered(second, "c2")
        await call(store.flush())
        assert await call(store.undelivered_crawls(SCOPE)) == ["c1", "c2"]
        store.stage_delivered(SCOPE, "c2")
        store.stage_settled(SCOPE, "c1")  # 38 still wait on c1
        await call(store.flush())
        assert await call(store.undelivered_crawls(SCOPE)) == ["c1"]
        assert len(await all_waiting(store, "c1", 500)) == 38
        store.stage_delivered(SCOPE, "c1")
        await call(store.flush())
        assert redis_cluster.keys(f"{prefix}:undel*") == []
        assert await call(store.undelivered_crawls(SCOPE)) == []
        assert await all_waiting(store, "c1", 500) == []
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_the_groups_marks_are_read_merged_in_the_order_they_were_stored(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """Each group is read a few marks at a time: one item's many versions
    (one group) between other items' (other groups) come out in order,
    whatever the chunk size."""
    store = open_store(redis_cluster, prefix)
    try:
        expected = []
        for n in range(30):
            store.stage_item(waiting_on(item(f"o{n}", stored_at=2_000_000 + 2 * n), "c1"))
            expected.append((2 * n, f"o{n}", 1))
            if n < 10:
                store.stage_item(waiting_on(item("a", n + 1, stored_at=2_000_001 + 2 * n),
                                            "c1"))
                expected.append((2 * n + 1, "a", n + 1))
        await call(store.flush())
        stored = [(key, version) for _, key, version in sorted(expected)]
        for limit in (1, 3, 7, 500):
            assert await all_waiting(store, "c1", limit) == stored, limit
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_mark_staged_after_its_crawl_settled_in_one_flush_stays(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A settle runs after the flush's phases: a mark staged after it goes
    in a second round of the phases, so that it is not deleted with those
    staged before (staging order, as on one server)."""
    store = open_store(redis_cluster, prefix)
    try:
        store.stage_item(waiting_on(item("x"), "c1"))
        store.stage_delivered(SCOPE, "c1")
        store.stage_item(waiting_on(item("y"), "c1"))
        await call(store.flush())
        assert await all_waiting(store, "c1", 500) == [("y", 1)]
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_marks_left_in_the_scopes_slot_by_older_code_are_moved_to_their_groups(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """Code before kept a crawl's marks in the scope's own slot
    (P:undel:{<s>}:<crawl>, written in phase 3): listing the crawls moves
    them to their items' groups, and they are read and settled there."""
    store = open_store(redis_cluster, prefix)
    try:
        store.stage_item(item("a", stored_at=2_000_005))
        store.stage_item(item("b", stored_at=2_000_006))
        await call(store.flush())
        with redis_cluster.client() as client:
            client.zadd(f"{prefix}:undel:{{{SCOPE}}}:old",
                        {f"{2_000_005:015d}\0a\0{1:010d}": 0,
                         f"{2_000_006:015d}\0b\0{1:010d}": 0})
            client.sadd(f"{prefix}:undelc:{{{SCOPE}}}", "old")
        assert await call(store.undelivered_crawls(SCOPE)) == ["old"]
        assert redis_cluster.keys(f"{prefix}:undel*:{{{SCOPE}}}*") == []
        assert await all_waiting(store, "old", 1) == [("a", 1), ("b", 1)]
        store.stage_delivered(SCOPE, "old")
        await call(store.flush())
        assert redis_cluster.keys(f"{prefix}:undel*") == []
        assert await call(store.undelivered_crawls(SCOPE)) == []
    finally:
        await call(store.close())


@pytest.mark.parametrize("phase_3_ran", [False, True], ids=["never-sent", "reply-lost"])
@pytest_twisted.ensureDeferred
async def test_a_worker_gone_between_phases_2_and_3_leaves_its_effects_to_the_next(
    redis_cluster: LoopbackCluster, prefix: str, phase_3_ran: bool,
) -> None:
    """What a worker's phase 2 changed in its scope's keys (a new host, the
    revisit index, the sums) stays in the host's ledger until its phase 3
    applied it: a worker gone before that (its scope's node unreachable,
    then killed) leaves it to the next flush that writes the host, and
    effects sent by both are applied once."""
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(60)]
    gone = open_store(redis_cluster, prefix)
    for n, key in enumerate(keys[:50]):
        gone.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
    if phase_3_ran:
        lose_reply_of(gone, CLUSTER_SCOPE_LUA)
    else:
        cut_before(gone, CLUSTER_SCOPE_LUA)
    with pytest.raises(StateStoreError):
        await call(gone.flush())
    await call(die(gone))

    store = open_store(redis_cluster, prefix)
    store.adopt_after = 0  # (a test cannot wait ten minutes)
    try:
        for n, key in enumerate(keys[50:], start=50):
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        await call(store.flush())
        assert [s.key for s in await call(store.get_due(SCOPE, 2_000, 100))] == keys
        assert len(list(store.iter_pages(SCOPE))) == 60
        await assert_sums_are_the_pages(store)
        # Applied: the ledger is emptied (its entries deleted with the
        # store's close).
        await call(store.close())
        assert redis_cluster.keys(f"{prefix}:fx:*") == []
        # The intents went too: the live worker's at its close, the gone
        # one's with the due read that found its ledger applied.
        assert redis_cluster.keys(f"{prefix}:fxhosts:*") == []
    finally:
        await call(store.close())


async def gone_between_phases_2_and_3(cluster: LoopbackCluster, prefix: str,
                                      keys: list[PageKey]) -> None:
    """A worker writes *keys* (one host's pages), its scope's node
    unreachable for its phase 3, then dies: nobody writes that host again."""
    gone = open_store(cluster, prefix)
    for n, key in enumerate(keys):
        gone.stage_item(item(f"i{n}", page=key.url))
        gone.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
    cut_before(gone, CLUSTER_SCOPE_LUA)
    with pytest.raises(StateStoreError):
        await call(gone.flush())
    await call(die(gone))


@pytest_twisted.ensureDeferred
async def test_a_flush_left_to_another_workers_adoption_moved_the_token_with_its_pages(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """The write generation moves where the pages are written, in their
    host's script (phase 2): a worker gone before its phase 3 has moved it
    already; the adoption that applies its effects for it writes no page
    and leaves it; a repair by another worker moves it again. Each host
    counts its own writes (a host not written reads 0)."""
    keys = [PageKey(SCOPE, f"https://lonely.example/p{n}") for n in range(5)]
    hosts = ["lonely.example", "quiet.example"]
    reader = open_store(redis_cluster, prefix)
    reader.adopt_after = 0  # (a test cannot wait ten minutes)
    try:
        before = await call(reader.write_generation(SCOPE, hosts))
        assert before == "lonely.example=0,quiet.example=0"
        await gone_between_phases_2_and_3(redis_cluster, prefix, keys)
        assert redis_cluster.keys(f"{prefix}:fx:*") != []  # left to an adoption
        written = await call(reader.write_generation(SCOPE, hosts))
        # One raise for the host's script, not one a page.
        assert written == "lonely.example=1,quiet.example=0"
        # Hosts as the store keys them (lowercase), each once.
        assert await call(reader.write_generation(
            SCOPE, ["quiet.example", "Lonely.Example", "lonely.example"])) == written
        await call(reader.adopt_ledgers(SCOPE))
        assert redis_cluster.keys(f"{prefix}:fx:*") == []
        assert await call(reader.write_generation(SCOPE, hosts)) == written
        reader.forget_page(SCOPE, keys[0].url)
        forgotten = await call(reader.write_generation(SCOPE, hosts))
        assert forgotten not in (before, written)
        assert forgotten.endswith(",quiet.example=0")
    finally:
        await call(reader.close())


@pytest_twisted.ensureDeferred
async def test_a_host_script_sent_again_raises_the_write_generation_once(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A host script whose reply was lost is sent again under its token:
    the replay writes nothing, and raises nothing again."""
    key = PageKey(SCOPE, "https://a.example/p")
    store = open_store(redis_cluster, prefix)
    try:
        store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
        await call(store.flush())
        assert await call(store.write_generation(SCOPE, ["a.example"])) == "a.example=1"
        store.stage_check(key, 304, 3_000_000, schedule=(3_600, 4_000))
        lost = lose_reply_of(store, CLUSTER_HOST_LUA)
        with pytest.raises(StateStoreError):
            await call(store.flush())
        assert lost == [1]
        assert await call(store.write_generation(SCOPE, ["a.example"])) == "a.example=2"
        await call(store.flush())
        assert store.pending == 0
        assert await call(store.write_generation(SCOPE, ["a.example"])) == "a.example=2"
        page = await call(store.get_page(key))
        assert page is not None and page.checks == 2
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_damaged_write_generation_fails_its_hosts_writes_before_any(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """The host script raises the counter after its writes: one INCR would
    refuse (not an integer) fails the host's writes whole, before any."""
    key = PageKey(SCOPE, "https://a.example/p")
    counter = host_key(prefix, "wg", "a.example")
    store = open_store(redis_cluster, prefix)
    try:
        with redis_cluster.client() as client:
            client.set(counter, "1.5")
            store.stage_page(full_state(key, 1))
            with pytest.raises(StateStoreError, match="not a counter"):
                await call(store.flush())
            assert client.exists(host_key(prefix, "hd", "a.example")) == 0
            client.set(counter, 7)
        await call(store.flush())
        assert await call(store.write_generation(SCOPE, ["a.example"])) == "a.example=8"
        assert await call(store.get_page(key)) == full_state(key, 1)
    finally:
        await call(store.close())


@pytest.mark.parametrize("reader", ["take_scope", "get_due", "summary", "count_scope",
                                    "reset_scope", "iter_pages"])
@pytest_twisted.ensureDeferred
async def test_a_dead_workers_effects_on_a_host_never_written_again_are_applied(
    redis_cluster: LoopbackCluster, prefix: str, reader: str,
) -> None:
    """The host's ledger alone would keep them until a flush writes that
    host again: the scope's write-ahead intents (P:fxhosts) name the host,
    and a crawl's start and every read of the scope's pages apply its
    ledger first."""
    keys = [PageKey(SCOPE, f"https://lonely.example/p{n}") for n in range(5)]
    await gone_between_phases_2_and_3(redis_cluster, prefix, keys)
    store = open_store(redis_cluster, prefix)
    store.adopt_after = 0  # (a test cannot wait ten minutes)
    hosts, index = f"{prefix}:hs:{{{LONELY_SHARD}}}", f"{prefix}:dueb:{{{LONELY_SHARD}}}"
    try:
        if reader == "take_scope":
            assert store.take_scope(SCOPE, "crawl-2", 60, 10_000) is None
            with redis_cluster.client() as client:
                assert client.scard(hosts) == 1
                assert client.zcard(index) == 1
        elif reader == "get_due":
            assert [s.key for s in await call(store.get_due(SCOPE, 2_000, 10))] == keys
        elif reader == "summary":
            await assert_whole_summary(store, 5)
        elif reader == "count_scope":
            assert store.count_scope(SCOPE).pages == 5
        elif reader == "reset_scope":
            assert store.reset_scope(SCOPE).pages == 5
            # Its state is gone with the rest: a later crawl sends no
            # stale validators.
            assert await call(store.get_pages(keys)) == {}
            # (The dead worker's flush tokens expire on their own; the
            # hosts' write generations stay, raised: see memo.py.)
            assert [k for k in redis_cluster.keys(f"{prefix}:*")
                    if b"{books" in k and b":flush:" not in k and b":wg:" not in k
                    and b":holdepoch:" not in k] == []
        else:
            assert sorted(s.key.url for s in store.iter_pages(SCOPE)) == sorted(k.url for k in keys)
        with redis_cluster.client() as client:
            # Applied: the gone worker's intent dropped (older than
            # adopt_after), its ledger emptied.
            assert client.zcard(f"{prefix}:fxhosts:{{{LONELY_SHARD}}}") == 0
            assert redis_cluster.keys(f"{prefix}:fx:*") == []
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_reset_leaves_no_key_of_the_scope_on_any_node(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    store = open_store(redis_cluster, prefix)
    try:
        for n in range(60):
            key = PageKey(SCOPE, f"https://h{n % 3}.example/p{n}")
            store.stage_item(waiting_on(item(f"i{n}", page=key.url), "c1"))
            store.stage_links(key, '["x"]')
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        store.stage_page(full_state(PageKey("other", "https://h0.example/p"), 1))
        await call(store.flush())
        await call(store.close())
        store = open_store(redis_cluster, prefix)
        hosts = [f"h{n}.example" for n in range(3)]
        generation = await call(store.write_generation(SCOPE, hosts))
        store.reset_scope(SCOPE)
        left = [k.decode() for k in redis_cluster.keys(f"{prefix}:*")]
        # But each host's write generation: raised, never deleted (a
        # counter started again would give a token read before again).
        assert sorted(k for k in left if "{books" in k) == sorted(
            host_key(prefix, "wg", host, "books") for host in hosts)
        assert await call(store.write_generation(SCOPE, hosts)) != generation
        assert any("{other" in k for k in left)
    finally:
        await call(store.close())


async def stale_bound(store: RedisStateStore, keys: list[PageKey]) -> None:
    """Pages due at 100 (their bucket's bound), then checked and scheduled
    at 5,000: the bound stays 100 (a write only lowers it)."""
    for key in keys:
        store.stage_page(full_state(key, 1, callback="parse", next_visit=100,
                                    last_checked=1_000))
    await call(store.flush())
    for key in keys:
        store.stage_check(key, 304, 2_000, schedule=(3_000, 5_000))
    await call(store.flush())


def bound(cluster: LoopbackCluster, prefix: str) -> float | None:
    with cluster.client() as client:
        return client.zscore(f"{prefix}:dueb:{{{A_SHARD}}}", "a.example|0")


@pytest_twisted.ensureDeferred
async def test_a_summary_reading_every_page_sets_a_stale_bound_right(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(5)]
    store = open_store(redis_cluster, prefix)
    try:
        await stale_bound(store, keys)
        assert bound(redis_cluster, prefix) == 100
        # No crawl took the scope (no mark of its checks): every page is read.
        summary = await call(store.summarize_pages(SCOPE, after=-math.inf, upto=math.inf,
                                                   checked_before=1_500))
        assert tuple(summary) == (0, 0, None)
        assert bound(redis_cluster, prefix) == 5_000
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_page_written_while_a_summary_reads_its_bucket_keeps_the_bound_low(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(5)]
    store = open_store(redis_cluster, prefix)
    writer = open_store(redis_cluster, prefix)
    try:
        await stale_bound(store, keys)
        late = PageKey(SCOPE, "https://a.example/late")
        original = store._eval_many

        async def eval_many(calls: Any, plain: Any = ()) -> list[Any]:
            replies = await original(calls, plain)
            if any(script == CLUSTER_SUMMARY_LUA for script, _, _ in calls):
                # Another worker writes a page due at 50 into the bucket
                # just read (before the summary sets its bound).
                writer.stage_page(full_state(late, 1, callback="parse", next_visit=50))
                await writer.flush()
            return replies

        store._eval_many = eval_many  # type: ignore[method-assign]
        await call(store.summarize_pages(SCOPE, after=-math.inf, upto=math.inf,
                                         checked_before=1_500))
        assert bound(redis_cluster, prefix) == 50
        assert [s.key for s in await call(store.get_due(SCOPE, 60, 10))] == [late]
    finally:
        await call(store.close())
        await call(writer.close())


@pytest_twisted.ensureDeferred
async def test_an_item_moved_to_another_page_is_not_listed_under_the_old_one(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A moved item's old member in the page index is removed in phase 3:
    a worker gone before it leaves that member, and the item (alive on its
    new page) is not listed under the old one (a crawl of that page would
    send a tombstone for it)."""
    old, new = "https://a.example/old", "https://a.example/new"
    store = open_store(redis_cluster, prefix)
    store.stage_item(item("x", page=old))
    await call(store.flush())
    await call(store.close())
    gone = open_store(redis_cluster, prefix)
    gone.stage_item(item("x", 2, page=new))
    gone.stage_page(full_state(PageKey(SCOPE, new), 1, callback="parse", next_visit=1_000))
    cut_before(gone, CLUSTER_SCOPE_LUA)
    with pytest.raises(StateStoreError):
        await call(gone.flush())
    await call(die(gone))
    store = open_store(redis_cluster, prefix)
    try:
        with redis_cluster.client() as client:
            # The stale member is there (what the read has to see past).
            bypage = f"{prefix}:bypage:{{{SCOPE}#{item_group(old)}}}"
            assert client.zrangebylex(bypage, "-", "+") == [f"{old}\0x".encode()]
        assert await call(store.get_page_items(SCOPE, old)) == []
        assert await call(store.get_page_items(SCOPE, new)) == ["x"]
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_late_index_removal_leaves_a_member_written_since(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """Worker A moves item x from p1 to p2, its phase 3 (which removes
    (p1, x) from the page index) cut off; worker B writes x back on p1;
    A's retried phase 3 removes nothing B wrote: x stays listed under p1."""
    p1, p2 = "https://a.example/p1", "https://a.example/p2"
    first = open_store(redis_cluster, prefix)
    a = open_store(redis_cluster, prefix)
    b = open_store(redis_cluster, prefix)
    try:
        first.stage_item(item("x", 1, page=p1))
        await call(first.flush())
        a.stage_item(item("x", 2, page=p2))
        a.stage_page(full_state(PageKey(SCOPE, p2), 1, callback="parse", next_visit=1_000))
        cut_before(a, CLUSTER_SCOPE_LUA)
        with pytest.raises(StateStoreError):
            await call(a.flush())
        b.stage_item(item("x", 3, page=p1))
        await call(b.flush())
        assert await call(b.get_page_items(SCOPE, p1)) == ["x"]
        del a._eval_many  # its scope's node reachable again
        await call(a.flush())
        assert a.pending == 0
        assert await call(b.get_page_items(SCOPE, p1)) == ["x"]
        assert await call(b.get_page_items(SCOPE, p2)) == []
    finally:
        for store in (first, a, b):
            await call(store.close())


def age_ledgers(cluster: LoopbackCluster, prefix: str, seconds: int) -> int:
    """Restamp every ledger entry as written *seconds* ago on its node's
    clock (what that long a wait would leave); returns how many."""
    n = 0
    with cluster.client() as client:
        for ledger in cluster.keys(f"{prefix}:fx:*"):
            now = int(client.eval("return redis.call('TIME')[1]", 1, ledger))
            for token, raw in client.hgetall(ledger).items():
                _, effects = json.loads(raw)
                client.hset(ledger, token, json.dumps([now - seconds, effects]))
                n += 1
    return n


@pytest_twisted.ensureDeferred
async def test_a_ledger_entry_older_than_the_tokens_lifetime_is_not_applied_again(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A worker dies after a full flush (before its close deletes its
    ledger entries): P:fxdone remembers their effects applied only for a
    while, so a reader days later must drop those entries, as the host
    script does, not apply them again (the sums would count each page
    twice)."""
    keys = [PageKey(SCOPE, f"https://lonely.example/p{n}") for n in range(5)]
    gone = open_store(redis_cluster, prefix)
    for n, key in enumerate(keys):
        gone.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
    await call(gone.flush())
    await call(die(gone))
    assert age_ledgers(redis_cluster, prefix, _APPLIED_KEPT + 3_600) == 1
    with redis_cluster.client() as client:
        # What P:fxdone's own trimming does after _APPLIED_KEPT.
        client.delete(*redis_cluster.keys(f"{prefix}:fxdone:{{{LONELY_SHARD}}}:*"))
    store = open_store(redis_cluster, prefix)
    try:
        await assert_whole_summary(store, 5)
        assert redis_cluster.keys(f"{prefix}:fx:*") == []
    finally:
        await call(store.close())


#: Damaged effects of a ledger entry (by hand, or a bug), and what the
#: error says of them.
NOT_AN_OBJECT = (json.dumps(["sums", 1]), "its effects are not a JSON object: ")
MEMBER_DAMAGED = (json.dumps({"sums": 5}), "its effects' sums are not an object of ")
#: (json reads 1e400 as inf, which int() refuses with an OverflowError.)
AN_INFINITE_TIME = ('{"latest": 1e400}', "its effects' latest are not a time: ")
A_HOST_NOT_A_NAME = (json.dumps({"hosts": ["lonely.example", 1]}),
                     "its effects' hosts are not a list of host names: ")
DAMAGES = [NOT_AN_OBJECT, MEMBER_DAMAGED, AN_INFINITE_TIME, A_HOST_NOT_A_NAME]
DAMAGE_IDS = ["not-an-object", "a-member-damaged", "an-infinite-time", "a-host-not-a-name"]


async def entry_left(cluster: LoopbackCluster, prefix: str, keys: list[PageKey]) -> None:
    """A worker writes *keys* (one host's pages) and dies before its phase
    3: its effects are left in its host group's ledger, its intent lists
    the group."""
    gone = open_store(cluster, prefix)
    for n, key in enumerate(keys):
        gone.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
    cut_before(gone, CLUSTER_SCOPE_LUA)
    with pytest.raises(StateStoreError):
        await call(gone.flush())
    await call(die(gone))


async def damaged_entry_left(cluster: LoopbackCluster, prefix: str, keys: list[PageKey],
                             effects: str = NOT_AN_OBJECT[0]) -> tuple[str, str, bytes]:
    """:func:`entry_left`, the entry's effects then replaced by *effects*.
    Returns the ledger, the entry's token and the damaged value."""
    await entry_left(cluster, prefix, keys)
    [ledger] = cluster.keys(f"{prefix}:fx:*")
    with cluster.client() as client:
        [(token, raw)] = client.hgetall(ledger).items()
        stamped, _ = json.loads(raw)
        damaged = json.dumps([stamped, effects]).encode()
        client.hset(ledger, token, damaged)
    return ledger.decode(), token.decode(), damaged


def assert_names_the_damaged_entry(message: str, ledger: str, token: str,
                                   why: str = NOT_AN_OBJECT[1]) -> None:
    """The error of a flush or a reading that met the damaged entry: one
    line naming its ledger and token, what is wrong and what to do."""
    assert "\n" not in message
    assert f"the ledger {ledger} holds a damaged entry (token {token}): {why}" in message, (
        message)
    assert advised_rewrite(message) == ["HSET", ledger, token, EXPIRED_EMPTY], message
    assert "scrapy state reset" in message, message


def advised_rewrite(message: str) -> list[str]:
    """The Redis command the error advises (redis-cli's arguments as a
    shell splits them)."""
    command = message.partition(": redis-cli -c ")[2].partition(";")[0]
    return shlex.split(command)


def another_groups_host() -> str:
    """A host whose group is not lonely.example's (its own ledger), in
    another scope shard (its own phase 3 script)."""
    return next(host for host in (f"h{n}.example" for n in range(100))
                if host_group(host) != host_group("lonely.example")
                and shard_of(host) != LONELY_SHARD)


@pytest.mark.parametrize("damage", DAMAGES, ids=DAMAGE_IDS)
@pytest_twisted.ensureDeferred
async def test_a_flush_of_a_group_whose_ledger_holds_a_damaged_entry_names_it(
    redis_cluster: LoopbackCluster, prefix: str, damage: tuple[str, str],
) -> None:
    """A flush of a host whose group's ledger holds a damaged entry (old
    enough to be taken) stops with the store's error naming the entry and
    what to do, once it ran to its end: the entry stays as it was, and
    everything of the flush is stored (nothing only in the worker's
    memory): the group's page, another group's page, a host's trust, and
    the flush's own effects on the scope (its host listed, its bucket in
    the revisit index), though no reading of the scope can run."""
    keys = [PageKey(SCOPE, f"https://lonely.example/p{n}") for n in range(6)]
    other = another_groups_host()
    elsewhere = PageKey(SCOPE, f"https://{other}/x")
    ledger, token, damaged = await damaged_entry_left(redis_cluster, prefix, keys[:5],
                                                      damage[0])
    store = open_store(redis_cluster, prefix)
    store.adopt_after = 0  # (a test cannot wait ten minutes)
    try:
        store.stage_page(full_state(keys[5], 1, callback="parse", next_visit=1_005))
        store.stage_page(full_state(elsewhere, 1, callback="parse", next_visit=1_010))
        store.stage_host(HostTrust(SCOPE, other, checks=3))
        with pytest.raises(StateStoreError) as failed:
            await call(store.flush())
        message = str(failed.value)
        assert message.startswith(f"State store {store.location}: "), message
        assert_names_the_damaged_entry(message, ledger, token, damage[1])
        assert store.pending == 0  # applied, none staged again
        with redis_cluster.client() as client:
            assert client.hget(ledger, token) == damaged  # left as it was
            # The flush's own effects were applied by its phase 3 (the
            # damaged entry's, which list the same host, were not).
            assert client.scard(f"{prefix}:hs:{{{LONELY_SHARD}}}") == 1
            assert client.zcard(f"{prefix}:dueb:{{{LONELY_SHARD}}}") == 1
        # What another worker reads: all of it stored (no ledger read).
        other_worker = open_store(redis_cluster, prefix)
        try:
            assert await call(other_worker.get_pages([keys[5], elsewhere])) == {
                keys[5]: full_state(keys[5], 1, callback="parse", next_visit=1_005),
                elsewhere: full_state(elsewhere, 1, callback="parse", next_visit=1_010)}
            assert (await call(other_worker.get_host(SCOPE, other))).checks == 3
        finally:
            await call(other_worker.close())
        # The way out the error gives: the entry rewritten as expired and
        # empty, taken by the next reading (deleted, the sums marked lost:
        # the summary reads every page, all six of the group's counted).
        with redis_cluster.client() as client:
            assert client.execute_command(*advised_rewrite(message)) == 0  # (replaced)
        assert [s.key for s in await call(store.get_due(SCOPE, 2_000, 10))] == [
            *keys, elsewhere]
        await assert_whole_summary(store, len(keys) + 1)
        await call(store.close())
        assert redis_cluster.keys(f"{prefix}:fx:*") == []
    finally:
        await call(store.close())


@pytest.mark.parametrize(("reader", "damage"), [
    *((reader, NOT_AN_OBJECT) for reader in ("take_scope", "get_due", "summary", "reset_scope")),
    *(("count_scope", damage) for damage in DAMAGES),
], ids=[*(f"{reader}-not-an-object" for reader in ("take_scope", "get_due", "summary",
                                                    "reset_scope")),
        *(f"count_scope-{name}" for name in DAMAGE_IDS)])
@pytest_twisted.ensureDeferred
async def test_a_reading_of_a_scope_whose_ledger_holds_a_damaged_entry_names_it(
    redis_cluster: LoopbackCluster, prefix: str, reader: str, damage: tuple[str, str],
) -> None:
    """A reading that applies the scope's ledgers first stops on a damaged
    entry with the store's error naming it, before anything is applied,
    of any ledger of the scope (all are read before any is applied): the
    entry, a healthy one of another group and shard, and the intents that
    list them stay for the reading after. A reset too (it lists the
    scope's hosts first): nothing is deleted."""
    keys = [PageKey(SCOPE, f"https://lonely.example/p{n}") for n in range(3)]
    ledger, token, damaged = await damaged_entry_left(redis_cluster, prefix, keys, damage[0])
    other = another_groups_host()
    await entry_left(redis_cluster, prefix, [PageKey(SCOPE, f"https://{other}/x")])
    with redis_cluster.client() as client:
        healthy = client.hgetall(ledger_key(prefix, other))
    assert len(healthy) == 1
    store = open_store(redis_cluster, prefix)
    store.adopt_after = 0  # (a test cannot wait ten minutes)
    try:
        with pytest.raises(StateStoreError) as failed:
            if reader == "take_scope":
                store.take_scope(SCOPE, "crawl-2", 60, 10_000)
            elif reader == "get_due":
                await call(store.get_due(SCOPE, 2_000, 10))
            elif reader == "summary":
                await call(store.summarize_pages(SCOPE, after=-math.inf, upto=math.inf,
                                                 checked_before=math.inf))
            elif reader == "count_scope":
                store.count_scope(SCOPE)
            else:
                store.reset_scope(SCOPE)
        assert_names_the_damaged_entry(str(failed.value), ledger, token, damage[1])
        assert len(await call(store.get_pages(keys))) == len(keys)
        with redis_cluster.client() as client:
            assert client.hget(ledger, token) == damaged
            assert client.zcard(f"{prefix}:fxhosts:{{{LONELY_SHARD}}}") == 1
            # Nothing applied, the healthy entry's effects neither.
            assert client.scard(f"{prefix}:hs:{{{LONELY_SHARD}}}") == 0
            assert client.hgetall(ledger_key(prefix, other)) == healthy
            assert client.zcard(f"{prefix}:fxhosts:{{{shard_of(other)}}}") == 1
            assert client.scard(f"{prefix}:hs:{{{shard_of(other)}}}") == 0
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_crawl_of_a_scope_whose_ledger_holds_a_damaged_entry_stops_with_one_line(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A crawl's start applies the scope's ledgers: a damaged entry stops
    it with one ERROR line naming the entry and what to do (exit 1),
    nothing fetched, the entry left as it was."""
    keys = [PageKey("sitemap", f"https://lonely.example/p{n}") for n in range(3)]
    ledger, token, damaged = await damaged_entry_left(redis_cluster, prefix, keys)
    uri = f"{redis_cluster.url}?prefix={prefix}"
    result = await deferToThread(run, crawl_args(f"INCREMENTAL_STATE_URI={uri}",
                                                 "INCREMENTAL_STATE_ON_REDIS_CLUSTER=True"))
    assert result.returncode == 1, result.stderr
    line = one_error_line(result)
    assert line.startswith(f"State store {uri}: "), line
    assert_names_the_damaged_entry(line, ledger, token)
    with redis_cluster.client() as client:
        assert client.hget(ledger, token) == damaged


@pytest_twisted.ensureDeferred
async def test_a_crawl_whose_flush_meets_a_damaged_entry_says_it_in_one_line(
    redis_cluster: LoopbackCluster, prefix: str, site: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    """A damaged entry no intent lists (the crawl's start does not read
    it), old enough to be taken, in the ledger of the crawled host's
    group: the crawl's first flush of that host takes it and says so in
    one ERROR line naming it, once all else it held is stored; the entry
    is left as it was. Mid-crawl that flush stops the crawl; the crawl's
    last flush (a loopback crawl of six pages often ends within the
    flush interval) leaves its finish reason as it is: either way every
    page the flush held is stored, none lost with the error."""
    paths = site.add_pages(6, kinds=PLAIN_KINDS)
    urls = [site.url(path) for path in paths]
    ledger = ledger_key(prefix, host_part(host_of(urls[0])), scope="list")
    token, damaged = uuid.uuid4().hex, json.dumps([1, NOT_AN_OBJECT[0]]).encode()
    with redis_cluster.client() as client:
        client.hset(ledger, token, damaged)
    uri = f"{redis_cluster.url}?prefix={prefix}"
    runner = CrawlerRunner(crawl_settings(uri, INCREMENTAL_STATE_ON_REDIS_CLUSTER=True))
    crawler = runner.create_crawler(ListSpider)
    with caplog.at_level(logging.ERROR):
        await runner.crawl(crawler, urls=urls)
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith(f"State store {uri}: "), line
    said, stopping, _ = line.partition("; stopping the crawl (")
    said, stored_all, _ = said.partition(" (the crawl's writes were all stored)")
    assert_names_the_damaged_entry(said, ledger, token)
    assert crawler.stats.get_value("incremental/store_errors") == 1
    reader = open_store(redis_cluster, prefix)
    try:
        stored = await call(reader.get_pages([PageKey("list", url) for url in urls]))
    finally:
        await call(reader.close())
    committed = crawler.stats.get_value("incremental/state_committed")
    if crawler.stats.get_value("finish_reason") == "finished":
        # The crawl's last flush (before its close, which has nothing left
        # to write: the line is said all the same).
        assert stored_all and not stopping, line
        assert len(stored) == committed == len(urls)
    else:
        assert crawler.stats.get_value("finish_reason") == "incremental_store_error"
        assert stopping and not stored_all, line
        assert 1 <= len(stored) == committed
    with redis_cluster.client() as client:
        assert client.hget(ledger, token) == damaged


@pytest_twisted.ensureDeferred
async def test_a_stalled_workers_late_phase_2_is_still_listed_by_an_intent(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A worker stalls between its write-ahead intent and its phase 2
    (a paused VM) past the age at which a reader drops intents: a reader
    drops it meanwhile, the phase 2 then lands and the worker dies before
    its phase 3. Its host's pages must still reach the scope's hosts and
    revisit index: the late phase 2 writes nothing until its intent is
    written again."""
    keys = [PageKey(SCOPE, f"https://lonely.example/p{n}") for n in range(5)]
    intents = f"{prefix}:fxhosts:{{{LONELY_SHARD}}}"
    hosts, index = f"{prefix}:hs:{{{LONELY_SHARD}}}", f"{prefix}:dueb:{{{LONELY_SHARD}}}"
    stalled = open_store(redis_cluster, prefix)
    stalled.adopt_after = 4  # (a test cannot wait ten minutes)
    original = stalled._eval_many
    stalls: list[int] = []

    async def eval_many(calls: list[tuple[str, list[str], list[Any]]],
                        plain: Any = ()) -> list[Any]:
        if not stalls and any(sent == CLUSTER_HOST_LUA for sent, _, _ in calls):
            stalls.append(1)
            with redis_cluster.client() as client:
                [(_, said)] = client.zrange(intents, 0, -1, withscores=True)
                # The stall: until the intent is adopt_after old on its
                # node's clock (polled, no timing asserted).
                for _ in range(100):
                    now = int(client.eval("return redis.call('TIME')[1]", 1, intents))
                    if now - said >= stalled.adopt_after:
                        break
                    time.sleep(0.1)
            reader = open_store(redis_cluster, prefix)
            reader.adopt_after = stalled.adopt_after
            try:
                assert reader.count_scope(SCOPE).pages == 0
            finally:
                await die(reader)  # (it wrote nothing to flush)
            with redis_cluster.client() as client:
                assert client.zcard(intents) == 0  # dropped as old
        return await original(calls, plain)

    stalled._eval_many = eval_many  # type: ignore[method-assign]
    cut_before(stalled, CLUSTER_SCOPE_LUA)
    for n, key in enumerate(keys):
        stalled.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
    with pytest.raises(StateStoreError):
        await call(stalled.flush())
    await call(die(stalled))
    assert stalls == [1]

    store = open_store(redis_cluster, prefix)
    try:
        assert store.count_scope(SCOPE).pages == 5
        with redis_cluster.client() as client:
            assert client.scard(hosts) == 1
            assert client.zcard(index) == 1
        assert [s.key for s in await call(store.get_due(SCOPE, 2_000, 10))] == keys
    finally:
        await call(store.close())


async def read_when_full(store: RedisStateStore, reader: str) -> None:
    """One read (or reset_scope) of a full cluster: see the test below."""
    if reader == "get_due":
        await call(store.get_due(SCOPE, 2_000, 10))
    elif reader == "summary":
        await call(store.summarize_pages(
            SCOPE, after=-math.inf, upto=math.inf, checked_before=math.inf))
    elif reader == "iter_pages":
        list(store.iter_pages(SCOPE))
    elif reader == "count_pages":
        store.count_pages(SCOPE)
    elif reader == "count_scope":
        assert store.count_scope(SCOPE).pages == 5
    else:
        # (The gone worker's host is not yet in the scope's hosts.)
        store.reset_scope(SCOPE)


@pytest.mark.parametrize("reader", ["get_due", "summary", "iter_pages", "count_pages",
                                    "count_scope", "reset_scope"])
@pytest_twisted.ensureDeferred
async def test_a_full_cluster_still_reads_and_resets_with_intents_pending(
    redis_cluster: LoopbackCluster, prefix: str, reader: str,
) -> None:
    """Reads apply a dead worker's effects first (write scripts): above
    maxmemory Redis refuses those, and the read must go on without them
    (a full store still opens and reads). The effects stay in the ledger
    for a later read; reset_scope (how memory is freed) runs too, and
    count_scope (only reads: each slot's MULTI, which Redis refuses when
    full, sent as a plain pipeline then) counts the gone worker's pages
    (its host named by the intents)."""
    keys = [PageKey(SCOPE, f"https://lonely.example/p{n}") for n in range(5)]
    await gone_between_phases_2_and_3(redis_cluster, prefix, keys)
    store = open_store(redis_cluster, prefix)
    nodes = [redis_cluster.node(port) for port in redis_cluster.ports]
    kept = [(node.config_get("maxmemory")["maxmemory"],
             node.config_get("maxmemory-policy")["maxmemory-policy"]) for node in nodes]
    try:
        for node in nodes:
            node.config_set("maxmemory-policy", "noeviction")
            node.config_set("maxmemory", "1")  # above it: writes refused
        with redis_cluster.client() as client, pytest.raises(
                redis.exceptions.OutOfMemoryError):
            client.eval("#!lua\nreturn redis.call('SET', KEYS[1], 1)", 1, f"{prefix}:probe")
        await read_when_full(store, reader)
    finally:
        for node, (memory, policy) in zip(nodes, kept, strict=True):
            node.config_set("maxmemory", memory)
            node.config_set("maxmemory-policy", policy)
    try:
        if reader == "reset_scope":
            # Every key of the scope went (found on every node, the gone
            # worker's host's too; its flush tokens expire on their own),
            # but the hosts' write generations (raised when full too).
            assert [k for k in redis_cluster.keys(f"{prefix}:*")
                    if b"{books" in k and b":flush:" not in k and b":wg:" not in k
                    and b":holdepoch:" not in k] == []
            with redis_cluster.client() as client:
                assert client.get(host_key(prefix, "wg", "lonely.example")) == b"2"
        else:
            # Not lost: applied by the first read with room to write.
            assert store.count_scope(SCOPE).pages == 5
            with redis_cluster.client() as client:
                assert client.scard(f"{prefix}:hs:{{{LONELY_SHARD}}}") == 1
    finally:
        for node in nodes:
            node.close()
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_ledger_cleanup_whose_pipeline_failed_is_sent_again(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """The applied ledger entries' HDEL and the intents' ZREM go with the
    next flush's first pipeline: when that pipeline fails they must be
    sent again later (here with the close), not forgotten."""
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(5)]
    store = open_store(redis_cluster, prefix)
    try:
        for n, key in enumerate(keys):
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        await call(store.flush())
        assert redis_cluster.keys(f"{prefix}:fx:*") != []  # until the next pipeline
        original = store._eval_many
        cut_before(store, CLUSTER_ITEMS_LUA)
        store.stage_item(item("i0", page=keys[0].url))
        with pytest.raises(StateStoreError):
            await call(store.flush())
        store._eval_many = original  # type: ignore[method-assign]
    finally:
        await call(store.close())
    assert redis_cluster.keys(f"{prefix}:fx:*") == []
    assert redis_cluster.keys(f"{prefix}:fxhosts:*") == []


def test_a_crawl_start_whose_adoption_fails_takes_no_hold(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """take_scope applies a dead worker's effects first; when that fails
    (here a damaged intents key), the scope is not left held for the
    hold's ttl, and the error says what failed."""
    with redis_cluster.client() as client:
        client.set(f"{prefix}:fxhosts:{{{A_SHARD}}}", "not a zset")
    store = open_store(redis_cluster, prefix)
    try:
        with pytest.raises(StateStoreError, match="ledgers could not be applied"):
            store.take_scope(SCOPE, "crawl-1", 60, 10_000)
        assert store.scope_holders(SCOPE, 10_000) == {}
    finally:
        store._sync.close()



@pytest_twisted.ensureDeferred
async def test_a_due_reading_leaves_a_live_workers_in_flight_effects_to_it(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A due reading starts over after nearly every flush: it adopts only
    intents adopt_after old (dead workers'), not another live worker's
    in-flight ones (read and applied each time otherwise); that worker's
    own phase 3 applies them."""
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(5)]
    live = open_store(redis_cluster, prefix)
    reader = open_store(redis_cluster, prefix)
    original = live._eval_many
    try:
        cut_before(live, CLUSTER_SCOPE_LUA)
        for n, key in enumerate(keys):
            live.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        with pytest.raises(StateStoreError):
            await call(live.flush())
        assert await call(reader.get_due(SCOPE, 2_000, 10)) == []
        assert redis_cluster.keys(f"{prefix}:fxdone:*") == []
        live._eval_many = original  # type: ignore[method-assign]
        await call(live.flush())  # its phase 3, at last
        reader._flushes += 1  # (as after a flush of its own: it starts over)
        assert [s.key for s in await call(reader.get_due(SCOPE, 2_000, 10))] == keys
    finally:
        live._eval_many = original  # type: ignore[method-assign]
        await call(live.close())
        await call(reader.close())


#: Hosts enough that every scope shard has some.
MANY_HOSTS = [f"h{n}.example" for n in range(40)]


def many_hosts_pages() -> list[Any]:
    """Three pages on each of MANY_HOSTS, their next visits interleaved
    across hosts (so across scope shards): the due order is none of the
    hosts' nor of the shards'."""
    states = []
    for n in range(3 * len(MANY_HOSTS)):
        key = PageKey(SCOPE, f"https://{MANY_HOSTS[n % len(MANY_HOSTS)]}/p{n}")
        states.append(full_state(key, 1, callback="parse", next_visit=1_000 + (n * 37) % 211))
    return states


def test_scope_shards_fall_one_in_each_eighth_of_the_slots(
    redis_cluster: LoopbackCluster,
) -> None:
    """Whatever a scope is called, its shards' tags hash one into each
    eighth of the 16,384 slots (their suffixes chosen so, CRC16 being
    linear): on three primaries of equal ranges each holds 2 or 3."""
    node = redis_cluster.node(redis_cluster.ports[0])
    for scope in (SCOPE, "books", "example.com", "news", "shop", "sitemap",
                  "www.example.org", "a-rather-long-spider-name_2026"):
        tags = [f"{{{shard_part(scope, k)}}}" for k in range(len(SCOPE_SHARDS))]
        slots = [int(node.execute_command("CLUSTER", "KEYSLOT", f"P:dueb:{tag}"))
                 for tag in tags]
        assert slots == [key_slot(f"P:dueb:{tag}".encode()) for tag in tags]
        assert sorted(slot >> 11 for slot in slots) == list(range(8))
        ports = [redis_cluster.port_of(f"P:dueb:{tag}") for tag in tags]
        assert sorted(ports.count(port) for port in redis_cluster.ports) == [2, 3, 3]


@pytest_twisted.ensureDeferred
async def test_a_scopes_phase_3_keys_spread_over_every_primary_and_due_pages_merge(
    redis_cluster: LoopbackCluster, prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flush of many hosts' pages writes the scope's revisit index,
    sums and hosts per scope shard, on every primary; a due read merges the
    shards' indexes by bound: the due pages in order (next visit, URL),
    whole or paged through, and the sums are every shard's added up."""
    # Small chunks: the index parts are read and merged over many rounds.
    monkeypatch.setattr(due_reads, "_DUE_BUCKETS", 2)
    monkeypatch.setattr(due_reads, "_DUE_INDEX_CHUNK", 16)
    states = many_hosts_pages()
    store = open_store(redis_cluster, prefix)
    try:
        for state in states:
            store.stage_page(state)
        await call(store.flush())
        with redis_cluster.client() as client:
            ports = set()
            for k in range(len(SCOPE_SHARDS)):
                index = f"{prefix}:dueb:{{{shard_part(SCOPE, k)}}}"
                hosts = {m.decode() for m in client.smembers(
                    f"{prefix}:hs:{{{shard_part(SCOPE, k)}}}")}
                # Each shard lists its hosts, and only those.
                assert hosts == {h for h in MANY_HOSTS if scope_shard(h) == k}
                assert hosts, "a shard with no host: more hosts needed"
                assert client.zcard(index) == len(hosts)
                assert client.hlen(f"{prefix}:nvs:{{{shard_part(SCOPE, k)}}}") > 0
                ports.add(redis_cluster.port_of(index))
            # Nothing of the revisit index or sums in the scope's own slot.
            assert client.exists(f"{prefix}:dueb:{{{SCOPE}}}",
                                 f"{prefix}:nvs:{{{SCOPE}}}", f"{prefix}:hs:{{{SCOPE}}}") == 0
        assert ports == set(redis_cluster.ports)
        want = sorted(states, key=lambda s: (s.next_visit, s.key.url))
        due = await call(store.get_due(SCOPE, 2_000, 1_000))
        assert [s.key for s in due] == [s.key for s in want]
        paged: list[Any] = []
        for _ in range(100):
            more = await call(store.get_due(SCOPE, 2_000, 7,
                                            after=due_after(paged[-1]) if paged else None))
            if not more:
                break
            paged += more
        assert [s.key for s in paged] == [s.key for s in want]
        # Up to a time: only those due by then, in order.
        due = await call(store.get_due(SCOPE, 1_100, 1_000))
        assert [s.key for s in due] == [s.key for s in want if s.next_visit <= 1_100]
        await assert_sums_are_the_pages(store)
        assert sorted(store._scope_hosts(SCOPE)) == sorted(MANY_HOSTS)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_bucket_lowered_behind_a_due_readings_cursor_is_read_by_the_next_reading(
    redis_cluster: LoopbackCluster, prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A due reading walks each shard's revisit index by bound; another
    worker's flush that lowers a bucket's bound behind where the reading
    got to makes that reading miss the bucket (its pages written before
    too). Only that reading: the bound stays lowered (a lower bound of its
    pages), so the next reading, the next crawl's re-seed, reads it."""
    monkeypatch.setattr(due_reads, "_DUE_BUCKETS", 1)
    monkeypatch.setattr(due_reads, "_DUE_INDEX_CHUNK", 2)  # two buckets a read
    early = "a.example"
    late = next(f"b{n}.example" for n in range(100)
                if scope_shard(f"b{n}.example") == scope_shard(early))
    firsts = [full_state(PageKey(SCOPE, f"https://{early}/p{n}"), 1, callback="parse",
                         next_visit=1_000 + n) for n in range(200)]
    lasts = [full_state(PageKey(SCOPE, f"https://{late}/p{n}"), 1, callback="parse",
                        next_visit=1_500 + n) for n in range(5)]
    writer = open_store(redis_cluster, prefix)
    reader = open_store(redis_cluster, prefix)
    try:
        for state in firsts + lasts:
            writer.stage_page(state)
        await call(writer.flush())
        with redis_cluster.client() as client:
            index = f"{prefix}:dueb:{{{shard_of(early)}}}"
            assert client.zcard(index) > 3  # the early host's buckets, and the late one's
        paged = list(await call(reader.get_due(SCOPE, 2_000, 3)))
        # Written meanwhile: due before where the reading got to.
        lowered = full_state(PageKey(SCOPE, f"https://{late}/new"), 1, callback="parse",
                             next_visit=900)
        writer.stage_page(lowered)
        await call(writer.flush())
        for _ in range(300):
            more = await call(reader.get_due(SCOPE, 2_000, 50, after=due_after(paged[-1])))
            if not more:
                break
            paged += more
        # This reading: the early host's pages, none of the late one's (the
        # limit docs/capacity.md states: the case is the one meant).
        assert [s.key for s in paged] == [s.key for s in firsts]
        # The next reading (a new crawl's): every due page, in order.
        due = await call(reader.get_due(SCOPE, 2_000, 1_000))
        assert [s.key for s in due] == [s.key for s in [lowered, *firsts, *lasts]]
    finally:
        await call(writer.close())
        await call(reader.close())


def assert_shards_left_behind(client: Any, prefix: str, behind: Callable[[int], bool]) -> None:
    """After a phase 3 that failed on the shards *behind* says: those list
    no host and keep their intents; the others are applied (their hosts
    listed, their intents dropped)."""
    for k in range(len(SCOPE_SHARDS)):
        shard = shard_part(SCOPE, k)
        hosts = {m.decode() for m in client.smembers(f"{prefix}:hs:{{{shard}}}")}
        if behind(k):
            assert hosts == set()
            assert client.zcard(f"{prefix}:fxhosts:{{{shard}}}") > 0
        else:
            assert hosts == {h for h in MANY_HOSTS if scope_shard(h) == k}


async def applied_once_by_retry_or_adoption(then: str, store: Any, other: Any,
                                            states: list[PageState]) -> None:
    """The effects a failed phase 3 left behind applied once: by the flush
    retried (*then* ``"retried"``), or, its worker gone, by another
    worker's read; a read again changes nothing."""
    if then == "retried":
        await call(store.flush())
        assert store.pending == 0
        reader = store
    else:
        await call(die(store))
        await call(other.summarize_pages(SCOPE, after=-math.inf, upto=math.inf,
                                         checked_before=math.inf))
        reader = other
    await assert_sums_are_the_pages(reader)
    assert sorted(reader._scope_hosts(SCOPE)) == sorted(MANY_HOSTS)
    want = sorted(states, key=lambda s: (s.next_visit, s.key.url))
    due = await call(reader.get_due(SCOPE, 2_000, 1_000))
    assert [s.key for s in due] == [s.key for s in want]
    await call(other.summarize_pages(SCOPE, after=-math.inf, upto=math.inf,
                                     checked_before=math.inf))
    await assert_sums_are_the_pages(reader)


@pytest.mark.parametrize("then", ["retried", "adopted"])
@pytest_twisted.ensureDeferred
async def test_a_phase_3_failure_on_one_shard_leaves_the_others_applied_and_it_once(
    redis_cluster: LoopbackCluster, prefix: str, then: str,
) -> None:
    """Phase 3 is a script per scope shard: one refused (a damaged key of
    its shard) leaves the other shards' effects applied; its own stay in
    its hosts' ledgers, listed by its intents, and are applied once when
    the flush is retried, or, its worker gone, by another worker's read."""
    states = many_hosts_pages()
    damaged_shard = scope_shard(MANY_HOSTS[0])
    damaged = f"{prefix}:nvs:{{{shard_part(SCOPE, damaged_shard)}}}"
    store = open_store(redis_cluster, prefix)
    other = open_store(redis_cluster, prefix)
    other.adopt_after = 0  # (a test cannot wait ten minutes)
    try:
        with redis_cluster.client() as client:
            client.set(damaged, "not a hash")
            for state in states:
                store.stage_page(state)
            with pytest.raises(StateStoreError, match="WRONGTYPE"):
                await call(store.flush())
            assert_shards_left_behind(client, prefix, lambda k: k == damaged_shard)
            client.delete(damaged)
        await applied_once_by_retry_or_adoption(then, store, other, states)
        with redis_cluster.client() as client:
            assert redis_cluster.keys(f"{prefix}:fx:*") == []
    finally:
        if then == "retried":
            await call(store.close())
        await call(other.close())


def test_a_shards_applied_tokens_are_kept_in_small_hashes_trimmed_hourly(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """P:fxdone is 4,096 small hashes a shard (by a token's first three hex
    digits): a token applied is noted there (its next 16 hex digits), a
    token sent again is answered 'done'; adding to a hash whose trim time
    passed drops its tokens older than 2 x TOKEN_TTL, and the hash has no
    TTL (Redis could evict it under a volatile-*
    policy: see test_the_applied_tokens_survive_a_node_evicting_expiring_keys)."""
    store = open_store(redis_cluster, prefix)
    tag = f"{{{A_SHARD}}}"
    applied = "abc" + "0123456789abcdef" + "0" * 13
    bucket = f"{prefix}:fxdone:{tag}:{int('abc', 16)}"
    try:
        with redis_cluster.client() as client, redis_cluster.node(
                redis_cluster.port_of(bucket)) as node:
            now = int(node.time()[0])
            node.hset(bucket, mapping={"trim": now - 1, "1" * 16: now - 2 * _TOKEN_TTL - 60,
                                       "2" * 16: now - 60})

            def apply(token: str) -> Any:
                script, keys, args = store._scope_call(tag, uuid.uuid4().hex,
                                                       {token: _Effects()}, [])
                return client.eval(script, len(keys), *keys, *args)

            assert apply(applied)[3] == 1
            held = node.hgetall(bucket)
            assert b"1" * 16 not in held  # past two days: trimmed
            assert b"2" * 16 in held
            assert int(held[b"0123456789abcdef"]) >= now
            assert int(held[b"trim"]) >= now + 3_000
            assert node.ttl(bucket) == -1
            # Sent again (another worker adopted it): applied once.
            assert apply(applied) == [b"done", applied.encode()]
    finally:
        store._sync.close()


@pytest.mark.parametrize("then", ["retried", "adopted"])
@pytest_twisted.ensureDeferred
async def test_phase_3_cut_off_on_one_node_is_applied_once_there_and_kept_elsewhere(
    redis_cluster: LoopbackCluster, prefix: str, then: str,
) -> None:
    """Phase 3's pipeline reaches the shards of two nodes and not the
    third's (its reply lost as well): the shards that ran keep their
    effects (a retry replays them under their tokens, applying nothing
    again); the cut-off node's shards' effects stay in their hosts' ledgers,
    listed by their intents, and are applied once, by the retried flush or,
    the worker gone, by another worker's read."""
    states = many_hosts_pages()
    store = open_store(redis_cluster, prefix)
    other = open_store(redis_cluster, prefix)
    other.adopt_after = 0  # (a test cannot wait ten minutes)
    cut_port = redis_cluster.port_of(f"{prefix}:dueb:{{{A_SHARD}}}")
    original = store._eval_many
    cut: list[int] = []

    async def eval_many(calls: list[tuple[str, list[str], list[Any]]],
                        plain: Any = ()) -> list[Any]:
        if cut or not any(sent == CLUSTER_SCOPE_LUA for sent, _, _ in calls):
            return await original(calls, plain)
        cut.append(1)
        # The other nodes' scripts run; then the connection drops.
        await original([call for call in calls
                        if redis_cluster.port_of(call[1][0]) != cut_port], plain)
        raise redis.exceptions.ConnectionError("a node dropped the connection")

    store._eval_many = eval_many  # type: ignore[method-assign]
    try:
        for state in states:
            store.stage_page(state)
        with pytest.raises(StateStoreError):
            await call(store.flush())
        assert cut
        with redis_cluster.client() as client:
            assert_shards_left_behind(client, prefix, lambda k: redis_cluster.port_of(
                f"{prefix}:hs:{{{shard_part(SCOPE, k)}}}") == cut_port)
        await applied_once_by_retry_or_adoption(then, store, other, states)
    finally:
        if then == "retried":
            await call(store.close())
        await call(other.close())


def test_a_cluster_node_that_evicts_expiring_keys_is_refused(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """Under a volatile-* policy a node at maxmemory evicts the keys with a
    TTL: the flushes' tokens (P:flush), and with them what makes a script
    sent again apply once. The store refuses such a node, naming the
    setting to change."""
    port = redis_cluster.ports[-1]
    with redis_cluster.node(port) as node:
        kept = (node.config_get("maxmemory")["maxmemory"],
                node.config_get("maxmemory-policy")["maxmemory-policy"])
        node.config_set("maxmemory-policy", "volatile-lru")
        node.config_set("maxmemory", str(1 << 30))
        try:
            with pytest.raises(StateStoreError,
                               match=r"volatile-lru.*maxmemory-policy noeviction"):
                open_store(redis_cluster, prefix)
        finally:
            node.config_set("maxmemory", kept[0])
            node.config_set("maxmemory-policy", kept[1])


@pytest_twisted.ensureDeferred
async def test_a_cluster_node_with_an_evicting_policy_but_no_maxmemory_is_accepted_with_a_warning(
    redis_cluster: LoopbackCluster, prefix: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """maxmemory 0: the node never evicts, whatever its policy; the store
    opens and warns that a maxmemory set later would evict its keys."""
    port = redis_cluster.ports[-1]
    with redis_cluster.node(port) as node:
        kept = (node.config_get("maxmemory")["maxmemory"],
                node.config_get("maxmemory-policy")["maxmemory-policy"])
        node.config_set("maxmemory-policy", "volatile-lru")
        node.config_set("maxmemory", "0")
        try:
            with caplog.at_level(logging.WARNING):
                store = open_store(redis_cluster, prefix)
            await call(store.close())
        finally:
            node.config_set("maxmemory", kept[0])
            node.config_set("maxmemory-policy", kept[1])
    assert any(r.levelno == logging.WARNING and "volatile-lru" in r.getMessage()
               and "once a maxmemory is set" in r.getMessage() for r in caplog.records)


def evict_expiring_keys_on(cluster: LoopbackCluster, key: str) -> list[bytes]:
    """Put the node of *key* at maxmemory under volatile-lru (the store
    refuses it when it opens; a policy changed since is not seen) and let
    Redis evict what it may, the keys with a TTL; returns those evicted."""
    node = cluster.node(cluster.port_of(key))
    kept = (node.config_get("maxmemory")["maxmemory"],
            node.config_get("maxmemory-policy")["maxmemory-policy"])
    expiring = [k for k in node.scan_iter(count=1000) if node.ttl(k) > 0]
    tag = _tag(key)
    try:
        node.config_set("maxmemory-policy", "volatile-lru")
        used = int(node.info("memory")["used_memory"])
        node.config_set("maxmemory", str(used + 200_000))
        # A big value with no TTL on the same node: Redis evicts to fit it.
        for name, size in (("ballast", 1_000_000), ("probe", 1)):
            with contextlib.suppress(redis.exceptions.OutOfMemoryError):
                node.set(f"evict-{name}:{tag}", b"x" * size)
    finally:
        node.delete(f"evict-ballast:{tag}", f"evict-probe:{tag}")
        node.config_set("maxmemory", kept[0])
        node.config_set("maxmemory-policy", kept[1])
    gone = [k for k in expiring if not node.exists(k)]
    node.close()
    return gone


def _tag(key: str) -> str:
    return key[key.index("{"):key.index("}") + 1]


@pytest_twisted.ensureDeferred
async def test_the_applied_tokens_survive_a_node_evicting_expiring_keys(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """P:fxdone (the tokens whose effects were applied) has no TTL: a node
    that evicts the keys with one (its policy changed after the store
    opened) keeps it, and a reader that adopts a ledger entry whose
    effects were applied already (the worker's own cleanup not yet sent)
    does not apply them twice."""
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(5)]
    writer = open_store(redis_cluster, prefix)
    reader = open_store(redis_cluster, prefix)
    try:
        for n, key in enumerate(keys):
            writer.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        await call(writer.flush())
        # Phase 3 applied; the ledger entry and the intent stay until the
        # writer's next pipeline.
        assert redis_cluster.keys(f"{prefix}:fxdone:*")
        assert redis_cluster.keys(f"{prefix}:fx:*")
        gone = evict_expiring_keys_on(redis_cluster, f"{prefix}:dueb:{{{A_SHARD}}}")
        assert gone  # (the flush tokens: they expire)
        assert not [k for k in gone if b":fxdone:" in k]
        await assert_whole_summary(reader, 5)
    finally:
        await call(writer.close())
        await call(reader.close())


def age_intents(cluster: LoopbackCluster, prefix: str, seconds: int) -> None:
    """Restamp every write-ahead intent as written *seconds* ago on its
    node's clock."""
    with cluster.client() as client:
        for intents in cluster.keys(f"{prefix}:fxhosts:*"):
            now = int(client.eval("return redis.call('TIME')[1]", 1, intents))
            for member in client.zrange(intents, 0, -1):
                client.zadd(intents, {member: now - seconds})


@pytest_twisted.ensureDeferred
async def test_a_dead_workers_effects_read_after_the_tokens_lifetime_still_list_its_host(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A worker dies between its phases 2 and 3 and nothing reads the
    scope for over a day (a weekly crawl): its ledger entry is too old to
    apply whole (P:fxdone may have forgotten it), but what may be applied
    twice is: the host is listed in its shard, its buckets' bounds lowered.
    The sums, dropped, are marked lost: summaries read every page."""
    keys = [PageKey(SCOPE, f"https://lonely.example/p{n}") for n in range(5)]
    await gone_between_phases_2_and_3(redis_cluster, prefix, keys)
    assert age_ledgers(redis_cluster, prefix, _LEDGER_HONOURED + 60) == 1
    age_intents(redis_cluster, prefix, _LEDGER_HONOURED + 60)
    store = open_store(redis_cluster, prefix)
    try:
        assert store.take_scope(SCOPE, "crawl-2", 60, 10_000) is None
        with redis_cluster.client() as client:
            assert client.smembers(f"{prefix}:hs:{{{LONELY_SHARD}}}") == {b"lonely.example"}
            assert client.hget(f"{prefix}:nvm:{{{LONELY_SHARD}}}", "lost") is not None
        # Applied: the entry and the intent gone.
        assert redis_cluster.keys(f"{prefix}:fx:*") == []
        assert redis_cluster.keys(f"{prefix}:fxhosts:*") == []
        assert [s.key for s in await call(store.get_due(SCOPE, 2_000, 10))] == keys
        assert sorted(s.key.url for s in store.iter_pages(SCOPE)) == [k.url for k in keys]
        assert store.count_scope(SCOPE).pages == 5
        await assert_whole_summary(store, 5)
        await call(store.release_scope(SCOPE, "crawl-2"))
        assert store.reset_scope(SCOPE).pages == 5
        assert [k for k in redis_cluster.keys(f"{prefix}:*")
                if b"{books" in k and b":flush:" not in k and b":wg:" not in k
                    and b":holdepoch:" not in k] == []
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_flush_taking_an_entry_past_the_tokens_lifetime_applies_its_bounds_and_host(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """The same entry taken by the next flush that writes its host (no
    read before): the host listed, the dead worker's pages due by their
    own bounds (the new page is due later), the sums marked lost."""
    keys = [PageKey(SCOPE, f"https://lonely.example/p{n}") for n in range(5)]
    await gone_between_phases_2_and_3(redis_cluster, prefix, keys)
    assert age_ledgers(redis_cluster, prefix, _LEDGER_HONOURED + 60) == 1
    store = open_store(redis_cluster, prefix)
    try:
        store.stage_page(full_state(PageKey(SCOPE, "https://lonely.example/new"), 1,
                                    callback="parse", next_visit=5_000))
        await call(store.flush())
        with redis_cluster.client() as client:
            assert client.smembers(f"{prefix}:hs:{{{LONELY_SHARD}}}") == {b"lonely.example"}
            assert client.hget(f"{prefix}:nvm:{{{LONELY_SHARD}}}", "lost") is not None
        assert [s.key for s in await call(store.get_due(SCOPE, 2_000, 10))] == keys
        await assert_sums_are_the_pages(store)
        await call(store.close())
        assert redis_cluster.keys(f"{prefix}:fx:*") == []
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_host_missing_from_its_scope_is_listed_again_when_written(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A host whose record exists but that its shard does not list (its
    first flush's effects lost: a dead worker's ledger entry dropped, as
    older code did) is listed by its next write, not only by a write that
    creates its record."""
    keys = [PageKey(SCOPE, f"https://lonely.example/p{n}") for n in range(5)]
    await gone_between_phases_2_and_3(redis_cluster, prefix, keys)
    # Its effects gone unapplied: the ledger and the intent dropped.
    redis_cluster.delete(f"{prefix}:fx:*")
    redis_cluster.delete(f"{prefix}:fxhosts:*")
    store = open_store(redis_cluster, prefix)
    try:
        assert list(store.iter_pages(SCOPE)) == []
        store.stage_page(full_state(PageKey(SCOPE, "https://lonely.example/new"), 1,
                                    callback="parse", next_visit=1_500))
        await call(store.flush())
        with redis_cluster.client() as client:
            assert client.smembers(f"{prefix}:hs:{{{LONELY_SHARD}}}") == {b"lonely.example"}
        assert len(list(store.iter_pages(SCOPE))) == 6
        assert store.count_scope(SCOPE).pages == 6
    finally:
        await call(store.close())


@pytest.mark.parametrize("repair", ["forget_host", "forget_page"])
@pytest_twisted.ensureDeferred
async def test_a_repair_cut_before_taking_its_pages_out_of_the_sums_leaves_that_to_the_next_read(
    redis_cluster: LoopbackCluster, prefix: str, repair: str,
) -> None:
    """A repair deletes pages in their host's slot, then takes them out of
    the sums in their shard's: cut between the two (the shard's node
    unreachable), a retry finds no page to take out. The repair's effects
    wait in the host's ledger, listed by an intent written before anything
    was deleted: the next reading applies them (once)."""
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(5)]
    store = open_store(redis_cluster, prefix)
    try:
        for n, key in enumerate(keys):
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        await call(store.flush())
        await call(store.close())
        store = open_store(redis_cluster, prefix)
        store.adopt_after = 0  # (a test cannot wait ten minutes)
        original = store._sync.eval

        def eval_(script: str, *args: Any) -> Any:
            if script == CLUSTER_SCOPE_LUA:
                raise redis.exceptions.ConnectionError("the shard's node dropped the connection")
            return original(script, *args)

        store._sync.eval = eval_  # type: ignore[method-assign]
        with pytest.raises((StateStoreError, redis.RedisError)) as cut:
            if repair == "forget_host":
                store.forget_host(SCOPE, "a.example")
            else:
                store.forget_page(SCOPE, keys[0].url)
        store._sync.eval = original  # type: ignore[method-assign]
        left = 0 if repair == "forget_host" else 4
        assert len(list(store.iter_pages(SCOPE))) == left
        await assert_whole_summary(store, left)
        assert redis_cluster.keys(f"{prefix}:fx:*") == []
        assert redis_cluster.keys(f"{prefix}:fxhosts:*") == []
        # And the repair said what became of it.
        assert isinstance(cut.value, StateStoreError)
        assert "next reading of the scope" in str(cut.value)
    finally:
        await call(store.close())


def cut_multi_naming(store: RedisStateStore, *kinds: str) -> Callable[[], None]:
    """Fail (as an unreachable node) every ``MULTI`` of *store* whose first
    key is one of *kinds* (``pg``, ``items``, ...); returns the undo."""
    original = store._sync_run
    prefixes = tuple(f"{store.prefix}:{kind}:".encode() for kind in kinds)

    def sync_run(pipe: Any) -> Any:
        from redis.cluster import TransactionStrategy
        strategy = getattr(pipe, "_execution_strategy", None)
        if isinstance(strategy, TransactionStrategy):
            for command in getattr(strategy, "_command_queue", None) or []:
                first = command.args[1] if len(command.args) > 1 else b""
                first = first.encode() if isinstance(first, str) else first
                if isinstance(first, bytes) and first.startswith(prefixes):
                    raise store._fail("read failed", redis.exceptions.ConnectionError(
                        "the node is gone"))
        return original(pipe)

    store._sync_run = sync_run  # type: ignore[method-assign]

    def undo() -> None:
        store._sync_run = original  # type: ignore[method-assign]
    return undo


@pytest.mark.parametrize("cut", ["pages", "items"])
@pytest.mark.parametrize("repair", ["forget_page", "forget_host"])
@pytest_twisted.ensureDeferred
async def test_a_repair_cut_between_slots_leaves_no_page_ahead_of_its_items(
    redis_cluster: LoopbackCluster, prefix: str, repair: str, cut: str,
) -> None:
    """A repair on a cluster runs its host's part first (one script) and
    the items' groups after (a MULTI per slot): cut before the host's
    (nothing deleted) or
    between them (the page gone, its items not yet), a page's validators
    never stay with its items gone (a 304 would never store them again).
    Cut after the host's slot it says to run it again, and run again it
    deletes the items left."""
    key = PageKey(SCOPE, "https://a.example/p0")
    store = open_store(redis_cluster, prefix)
    store.stage_item(item("i0", page=key.url))
    store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
    await call(store.flush())
    await call(store.close())
    store = open_store(redis_cluster, prefix)

    def run() -> Any:
        if repair == "forget_page":
            return store.forget_page(SCOPE, key.url)
        return store.forget_host(SCOPE, "a.example")

    if cut == "pages":
        # The host's part, one script: its node gone.
        original = store._sync.eval

        def refuse(script: str, *args: Any) -> Any:
            if script == CLUSTER_FORGET_LUA:
                raise redis.exceptions.ConnectionError("the host's node is gone")
            return original(script, *args)

        store._sync.eval = refuse  # type: ignore[method-assign]

        def undo() -> None:
            store._sync.eval = original  # type: ignore[method-assign]
    else:
        undo = cut_multi_naming(store, "hist")
    try:
        with pytest.raises(StateStoreError) as raised:
            run()
        undo()
        assert ("run it again" in str(raised.value)) == (cut == "items")
        page = await call(store.get_page(key))
        items = await call(store.get_page_items(SCOPE, key.url))
        # Never a page whose validators say "seen" with its items gone.
        assert page is None or items == ["i0"], (page, items)
        assert (page is None) == (cut == "items")
        removed = run()
        assert removed.items == 1
        assert await call(store.get_page(key)) is None
        assert await call(store.get_page_items(SCOPE, key.url)) == []
        assert store.item_history(SCOPE, "i0") == []
        await assert_whole_summary(store, 0)
    finally:
        await call(store.close())


def plan_before(store: RedisStateStore, counts: dict[str, int]) -> Callable[[], None]:
    """The repair's first read of its host's bucket count gives *counts*
    (read before another worker's flush: the race played in order); later
    reads are live. Returns the undo."""
    live = store._bucket_counts
    stale = [counts]

    def bucket_counts(scope: str, hosts: list[str]) -> dict[str, int]:
        return stale.pop() if stale else live(scope, hosts)

    store._bucket_counts = bucket_counts  # type: ignore[method-assign]

    def undo() -> None:
        del store._bucket_counts
    return undo


@pytest.mark.parametrize("written", ["page", "check", "split"])
@pytest.mark.parametrize("repair", ["forget_page", "forget_host"])
@pytest_twisted.ensureDeferred
async def test_what_a_crawl_writes_after_a_repair_planned_is_deleted_and_out_of_the_sums(
    redis_cluster: LoopbackCluster, prefix: str, repair: str, written: str,
) -> None:
    """A repair reads its host's bucket count (and, before, every page it
    was to delete) before it deletes: a crawl writes the host meanwhile (a
    new page, a check that moves a page's next visit, pages enough to split
    the host's buckets). The host's script deletes the pages as they are
    then and takes exactly those out of the sums, and a split it was not
    planned for makes it plan again: no page of the repair stays, and the
    sums are the pages left."""
    keys = await flush_five(redis_cluster, prefix)
    store = open_store(redis_cluster, prefix)
    other = open_store(redis_cluster, prefix)
    try:
        undo = plan_before(store, store._bucket_counts(SCOPE, ["a.example"]))
        if written == "page":
            other.stage_page(full_state(PageKey(SCOPE, "https://a.example/new"), 1,
                                        callback="parse", next_visit=1_000))
        elif written == "check":
            other.stage_check(keys[0], 200, 1_000_100, schedule=(3_600, 7_200))
        else:
            for n in range(50):
                other.stage_page(full_state(PageKey(SCOPE, f"https://a.example/s{n}"), 1,
                                            callback="parse", next_visit=1_000))
        await call(other.flush())
        if repair == "forget_page":
            store.forget_page(SCOPE, keys[0].url)
            left = {s.key for s in store.iter_pages(SCOPE)}
            assert keys[0] not in left
            assert left >= set(keys[1:])
        else:
            store.forget_host(SCOPE, "a.example")
            assert list(store.iter_pages(SCOPE)) == []
        undo()
        await assert_sums_are_the_pages(store)
    finally:
        await call(other.close())
        await call(store.close())


async def flush_five(cluster: LoopbackCluster, prefix: str, host: str = "a.example",
                     visit: int = 1_000) -> list[PageKey]:
    """Five pages of *host* written by a worker that closed (visits
    *visit* + n)."""
    keys = [PageKey(SCOPE, f"https://{host}/p{n}") for n in range(5)]
    store = open_store(cluster, prefix)
    for n, key in enumerate(keys):
        store.stage_page(full_state(key, 1, callback="parse", next_visit=visit + n))
    await call(store.flush())
    await call(store.close())
    return keys


def cut_scope_scripts(store: RedisStateStore) -> Any:
    """Make the sync client's scope scripts fail (the shard's node dropped
    the connection); returns the original ``eval`` to put back."""
    original = store._sync.eval

    def eval_(script: str, *args: Any) -> Any:
        if script == CLUSTER_SCOPE_LUA:
            raise redis.exceptions.ConnectionError("the shard's node dropped the connection")
        return original(script, *args)

    store._sync.eval = eval_  # type: ignore[method-assign]
    return original


@pytest_twisted.ensureDeferred
async def test_a_host_repair_keeps_the_pending_entries_of_its_hosts_ledger(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """forget_host cut after deleting the pages (its entry in the host's
    ledger) and before its shard's script, then run again: the retry finds
    no page and writes no entry, and its deletions must leave the ledger's
    pending entries alone (here the adoption that a repair runs first is
    left out, as for an entry written after it read the ledgers): the
    first attempt's entry is applied by the next reading."""
    await flush_five(redis_cluster, prefix)
    store = open_store(redis_cluster, prefix)
    store.adopt_after = 0  # (a test cannot wait ten minutes)
    original = cut_scope_scripts(store)
    with pytest.raises((StateStoreError, redis.RedisError)):
        store.forget_host(SCOPE, "a.example")
    store._sync.eval = original  # type: ignore[method-assign]
    assert redis_cluster.keys(f"{prefix}:fx:*") != []
    store._adopt_before_repair = lambda scope: None  # type: ignore[method-assign]
    try:
        store.forget_host(SCOPE, "a.example")  # the retry
        assert redis_cluster.keys(f"{prefix}:fx:*") != []  # still pending
        assert list(store.iter_pages(SCOPE)) == []
        await assert_sums_are_the_pages(store)
        assert redis_cluster.keys(f"{prefix}:fx:*") == []
    finally:
        await call(store.close())


@pytest.mark.parametrize("repair", ["forget_host", "forget_page"])
@pytest_twisted.ensureDeferred
async def test_a_repair_first_applies_a_dead_workers_pending_entry(
    redis_cluster: LoopbackCluster, prefix: str, repair: str,
) -> None:
    """A dead worker moved the host's pages to visits 3000 + n (its phase
    2, the effects in the host's ledger) and died before its phase 3: a
    repair of that host applies the entry before it reads what to take
    out, so the sums neither keep the old visits nor lose the new."""
    keys = await flush_five(redis_cluster, prefix, visit=1_000)
    gone = open_store(redis_cluster, prefix)
    for n, key in enumerate(keys):
        gone.stage_page(full_state(key, 2, callback="parse", next_visit=3_000 + n))
    cut_before(gone, CLUSTER_SCOPE_LUA)
    with pytest.raises(StateStoreError):
        await call(gone.flush())
    await call(die(gone))
    store = open_store(redis_cluster, prefix)
    try:
        if repair == "forget_host":
            store.forget_host(SCOPE, "a.example")
        else:
            store.forget_page(SCOPE, keys[0].url)
        assert redis_cluster.keys(f"{prefix}:fx:*") == []
        assert len(list(store.iter_pages(SCOPE))) == (0 if repair == "forget_host" else 4)
        await assert_sums_are_the_pages(store)
        states = list(store.iter_pages(SCOPE))
        for before in (math.inf, 1_000_001, 1_000_003):
            got = await call(store.summarize_pages(
                SCOPE, after=-math.inf, upto=math.inf, checked_before=before))
            assert tuple(got) == brute_summary(states, -math.inf, math.inf, before, ())
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_repair_whose_adoption_redis_refuses_is_refused(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A repair whose adoption of the pending effects Redis refuses (above
    maxmemory) deletes nothing and says why."""
    await flush_five(redis_cluster, prefix)
    store = open_store(redis_cluster, prefix)

    def refused(scope: str, settled_only: bool = False, refused: Any = None) -> Any:
        raise redis.exceptions.OutOfMemoryError("OOM command not allowed")
        yield  # (a generator)

    store._adoption = refused  # type: ignore[method-assign]
    try:
        with pytest.raises(StateStoreError, match=r"repair refused.*OOM"):
            store.forget_host(SCOPE, "a.example")
        assert len(list(store.iter_pages(SCOPE))) == 5
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_flush_taking_a_repair_entry_keeps_its_own_newer_check(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """forget_page cut before its shard's script (its entry left in the
    host's ledger); a crawl starts (its adoption refused: Redis full), the
    page is found again and written by a flush that takes the repair's
    entry: the repair's check (``''``, taken out) is older than the page's
    new check, which the sums keep."""
    keys = await flush_five(redis_cluster, prefix)  # checked at 1_000_001
    store = open_store(redis_cluster, prefix)
    original = cut_scope_scripts(store)
    with pytest.raises((StateStoreError, redis.RedisError)):
        store.forget_page(SCOPE, keys[0].url)
    store._sync.eval = original  # type: ignore[method-assign]
    try:
        store.adopt_ledgers_sync = lambda scope, strict=False: None  # type: ignore[method-assign]
        assert store.take_scope(SCOPE, "crawl-2", 60, 1_000_005) is None
        assert redis_cluster.keys(f"{prefix}:fx:*") != []
        store.adopt_after = 0  # the entry is now old enough for a flush to take
        store.stage_page(full_state(keys[0], 9, callback="parse", next_visit=1_000))
        await call(store.flush())
        states = list(store.iter_pages(SCOPE))
        for before in (math.inf, 1_000_005, 1_000_010):
            got = await call(store.summarize_pages(SCOPE, after=-math.inf, upto=math.inf,
                                                   checked_before=before))
            assert tuple(got) == brute_summary(states, -math.inf, math.inf, before, ())
    finally:
        await call(store.close())


async def assert_summaries_by_check(store: Any, befores: tuple[int, ...]) -> None:
    """The summaries of the whole scope checked before each of *befores*
    are what its pages say."""
    states = list(store.iter_pages(SCOPE))
    for before in befores:
        got = await call(store.summarize_pages(SCOPE, after=-math.inf, upto=math.inf,
                                               checked_before=before))
        assert tuple(got) == brute_summary(states, -math.inf, math.inf, before, ()), before


@pytest_twisted.ensureDeferred
async def test_a_late_workers_older_check_applied_after_a_newer_one_keeps_the_newer(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """Two workers of one crawl write the same page's check: D at 1_000_010
    (its phase 3 cut, then it dies), W at 1_000_020 (applied at once: D's
    entry is younger than adopt_after, not taken). The next reading adopts
    D's entry after W's: its older time does not lower the page's in P:ck
    (checks only raise it), so a summary with checked_before between the
    two still counts the page as checked since."""
    keys = await flush_five(redis_cluster, prefix)  # checked at 1_000_001
    store = open_store(redis_cluster, prefix)
    assert store.take_scope(SCOPE, "crawl-2", 60, 1_000_005) is None  # the mark
    gone = open_store(redis_cluster, prefix)
    gone.stage_page(full_state(keys[0], 10, callback="parse", next_visit=1_000))
    cut_before(gone, CLUSTER_SCOPE_LUA)
    with pytest.raises(StateStoreError):
        await call(gone.flush())
    await call(die(gone))
    live = open_store(redis_cluster, prefix)
    try:
        live.stage_page(full_state(keys[0], 20, callback="parse", next_visit=1_000))
        await call(live.flush())
        # The summary adopts D's entry first, then reads the sums.
        await assert_summaries_by_check(store, (1_000_015, 1_000_030))
    finally:
        await call(live.close())
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_flush_whose_host_reply_was_lost_still_keeps_its_newer_check_over_a_repair(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """As test_a_flush_taking_a_repair_entry_keeps_its_own_newer_check, but
    the host script's reply is lost: its replay returns its own effects and
    no taken entries ('[]'), so the repair's entry stays in the ledger and
    is applied after the flush's newer check: its '' (the page deleted)
    leaves P:ck as it is, and the summary counts the page as checked since."""
    keys = await flush_five(redis_cluster, prefix)
    store = open_store(redis_cluster, prefix)
    original = cut_scope_scripts(store)
    with pytest.raises((StateStoreError, redis.RedisError)):
        store.forget_page(SCOPE, keys[0].url)
    store._sync.eval = original  # type: ignore[method-assign]
    try:
        store.adopt_ledgers_sync = lambda scope, strict=False: None  # type: ignore[method-assign]
        assert store.take_scope(SCOPE, "crawl-2", 60, 1_000_005) is None
        del store.adopt_ledgers_sync  # adoption back
        store.adopt_after = 0  # the entry is old enough for a flush to take
        store.stage_page(full_state(keys[0], 9, callback="parse", next_visit=1_000))
        lost = lose_reply_of(store, CLUSTER_HOST_LUA)
        with pytest.raises(StateStoreError):
            await call(store.flush())
        assert lost == [1]
        await call(store.flush())  # the replay
        assert store.pending == 0
        await assert_summaries_by_check(store, (1_000_005, 1_000_010))
    finally:
        await call(store.close())


@pytest.mark.parametrize("age", [_TOKEN_TTL + 60, _LEDGER_HONOURED + 60],
                         ids=["a-day-old", "older-than-honoured"])
@pytest_twisted.ensureDeferred
async def test_a_worker_killed_after_a_complete_flush_leaves_no_sums_lost(
    redis_cluster: LoopbackCluster, prefix: str, age: int,
) -> None:
    """A worker killed after its flush applied everything (only its ledger
    clean-up, sent with its next pipeline, never ran): read a day later, or
    later than ledger entries are honoured while P:fxdone still lists the
    token, the entry is known applied: dropped, the shard's sums not
    marked lost (every summary would read every page)."""
    keys = [PageKey(SCOPE, f"https://lonely.example/p{n}") for n in range(5)]
    gone = open_store(redis_cluster, prefix)
    for n, key in enumerate(keys):
        gone.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
    await call(gone.flush())
    await call(die(gone))
    assert age_ledgers(redis_cluster, prefix, age) == 1
    store = open_store(redis_cluster, prefix)
    try:
        await assert_whole_summary(store, 5)
        with redis_cluster.client() as client:
            assert client.hget(f"{prefix}:nvm:{{{LONELY_SHARD}}}", "lost") is None
        assert redis_cluster.keys(f"{prefix}:fx:*") == []
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_worker_killed_after_a_complete_flush_leaves_no_sums_lost_a_week_later(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A weekly crawl after a worker was killed once its flush applied
    everything (its ledger clean-up never sent): P:fxdone has long
    forgotten the token (trimmed after two days), but P:fxheld keeps it
    while its entry is there, so the reader drops the entry as applied,
    the shard's sums not marked lost; then lets the token go."""
    keys = [PageKey(SCOPE, f"https://lonely.example/p{n}") for n in range(5)]
    gone = open_store(redis_cluster, prefix)
    for n, key in enumerate(keys):
        gone.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
    await call(gone.flush())
    await call(die(gone))
    assert age_ledgers(redis_cluster, prefix, 7 * 86_400) == 1
    with redis_cluster.client() as client:
        # What P:fxdone's own trimming does after _APPLIED_KEPT.
        client.delete(*redis_cluster.keys(f"{prefix}:fxdone:{{{LONELY_SHARD}}}:*"))
    store = open_store(redis_cluster, prefix)
    try:
        await assert_whole_summary(store, 5)
        with redis_cluster.client() as client:
            assert client.hget(f"{prefix}:nvm:{{{LONELY_SHARD}}}", "lost") is None
            assert client.exists(f"{prefix}:fxheld:{{{LONELY_SHARD}}}") == 0
        assert redis_cluster.keys(f"{prefix}:fx:*") == []
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_closed_workers_applied_tokens_are_let_go_once_their_entries_are_gone(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """P:fxheld holds a token only while its ledger entry may be there:
    a worker's flushes and its close leave none behind, nor does a repair."""
    store = open_store(redis_cluster, prefix)
    for n in range(3):
        key = PageKey(SCOPE, f"https://lonely.example/p{n}")
        store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        await call(store.flush())
    await call(store.close())
    assert redis_cluster.keys(f"{prefix}:fx:*") == []
    assert redis_cluster.keys(f"{prefix}:fxheld:*") == []
    admin = open_store(redis_cluster, prefix)
    try:
        assert admin.forget_page(SCOPE, "https://lonely.example/p1").pages == 1
    finally:
        await call(admin.close())
    assert redis_cluster.keys(f"{prefix}:fx:*") == []
    assert redis_cluster.keys(f"{prefix}:fxheld:*") == []


def lonely_page(n: int) -> PageState:
    """A page of lonely.example (its effects all go to LONELY_SHARD)."""
    return full_state(PageKey(SCOPE, f"https://lonely.example/p{n}"), 1,
                      callback="parse", next_visit=1_000 + n)


def held_tokens(cluster: LoopbackCluster, prefix: str) -> list[bytes]:
    with cluster.client() as client:
        return client.hkeys(f"{prefix}:fxheld:{{{LONELY_SHARD}}}")


@pytest_twisted.ensureDeferred
async def test_workers_killed_after_their_second_flush_leave_no_token_held(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A worker's flush deletes its previous flush's ledger entries; their
    tokens would be let go by its next pipeline. Killed in between (any
    time after its second flush), it leaves tokens held whose entries are
    gone: the next reading finds them gone and lets them go."""
    for kill in range(3):
        gone = open_store(redis_cluster, prefix)
        for n in range(2):
            gone.stage_page(lonely_page(10 * kill + n))
            await call(gone.flush())
        await call(die(gone))
    # Each killed worker: one token whose entry is gone, one whose entry is there.
    assert len(held_tokens(redis_cluster, prefix)) == 6
    store = open_store(redis_cluster, prefix)
    try:
        await assert_whole_summary(store, 6)
        assert held_tokens(redis_cluster, prefix) == []
        for n in (98, 99):
            store.stage_page(lonely_page(n))
            await call(store.flush())
    finally:
        await call(store.close())
    assert redis_cluster.keys(f"{prefix}:fx:*") == []
    assert held_tokens(redis_cluster, prefix) == []


@pytest_twisted.ensureDeferred
async def test_a_close_whose_flush_fails_still_lets_go_of_the_tokens_held(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A crawl stopped by a store error (here the eviction recheck, which
    refuses the flush at close again): close still deletes the entries its
    earlier flushes applied and lets their tokens go, and raises the
    flush's error."""
    store = open_store(redis_cluster, prefix)
    for n in range(2):
        store.stage_page(lonely_page(n))
        await call(store.flush())

    async def evicting() -> None:
        raise store._fail("a node of the cluster evicts keys when full (simulated)")

    store._recheck_eviction = evicting  # type: ignore[method-assign]
    store.stage_page(lonely_page(2))
    with pytest.raises(StateStoreError, match="evicts keys when full"):
        await call(store.flush())
    with pytest.raises(StateStoreError, match="evicts keys when full"):
        await call(store.close())
    assert redis_cluster.keys(f"{prefix}:fx:*") == []
    assert redis_cluster.keys(f"{prefix}:fxheld:*") == []
    reader = open_store(redis_cluster, prefix)
    try:
        await assert_whole_summary(reader, 2)
    finally:
        await call(reader.close())


@pytest.mark.parametrize("reader_between", [False, True], ids=["alone", "reader-between"])
@pytest_twisted.ensureDeferred
async def test_a_flush_taking_an_applied_entry_a_week_old_marks_no_sums_lost(
    redis_cluster: LoopbackCluster, prefix: str, reader_between: bool,
) -> None:
    """A killed worker's applied entry, a week old: P:fxdone forgot its
    token, P:fxheld holds it. Another worker's host script takes the entry
    as expired; its phase 3 finds it applied, the sums not marked lost;
    also when, between its phases 2 and 3, a reader dropped the entry as
    applied and let its token go (P:fxdone notes it anew then)."""
    gone = open_store(redis_cluster, prefix)
    gone.stage_page(lonely_page(0))
    await call(gone.flush())
    await call(die(gone))
    assert age_ledgers(redis_cluster, prefix, 7 * 86_400) == 1
    with redis_cluster.client() as client:
        # What P:fxdone's own trimming does after _APPLIED_KEPT.
        client.delete(*redis_cluster.keys(f"{prefix}:fxdone:{{{LONELY_SHARD}}}:*"))
    writer = open_store(redis_cluster, prefix)
    reader = open_store(redis_cluster, prefix)
    phase_scopes = writer._phase_scopes

    async def reader_first(*args: Any, **kwargs: Any) -> None:
        await reader.adopt_ledgers(SCOPE)
        assert held_tokens(redis_cluster, prefix) == []
        await phase_scopes(*args, **kwargs)

    if reader_between:
        writer._phase_scopes = reader_first  # type: ignore[method-assign]
    try:
        writer.stage_page(lonely_page(1))
        await call(writer.flush())
        with redis_cluster.client() as client:
            assert client.hget(f"{prefix}:nvm:{{{LONELY_SHARD}}}", "lost") is None
        await assert_whole_summary(writer, 2)
    finally:
        await call(writer.close())
        await call(reader.close())
    assert redis_cluster.keys(f"{prefix}:fx:*") == []
    assert held_tokens(redis_cluster, prefix) == []


@pytest_twisted.ensureDeferred
async def test_a_runs_start_not_marked_where_a_page_was_checked_since_says_why(
    redis_cluster: LoopbackCluster, prefix: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """The mark of a run's start is refused on a shard with a page checked
    at or after it (another worker wrote first): that shard's summaries
    read every page, and the log says so (the others are marked)."""
    store = open_store(redis_cluster, prefix)
    try:
        store.stage_page(lonely_page(0))
        await call(store.flush())
        checked = lonely_page(0).last_checked
        with caplog.at_level(logging.INFO):
            store.mark_run_start(SCOPE, checked)
        with redis_cluster.client() as client:
            marks = {shard: client.hget(f"{prefix}:nvm:{{{shard}}}", "mark")
                     for shard in (shard_part(SCOPE, k) for k in range(len(SCOPE_SHARDS)))}
        assert marks.pop(LONELY_SHARD) is None
        assert set(marks.values()) == {str(checked).encode()}
        said = [r.getMessage() for r in caplog.records if "run's start" in r.getMessage()]
        assert len(said) == 1, said
        assert f"was not set (1 of {len(SCOPE_SHARDS)}): a page there was checked" in said[0]
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_dead_workers_entry_a_day_old_is_applied_whole_not_marked_lost(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A worker dies between its phases 2 and 3 and the scope is read a
    day later: P:fxdone keeps the tokens applied two days, so an entry a
    day old that it does not list was never applied: applied whole (the
    sums right), the shard's sums not marked lost."""
    keys = [PageKey(SCOPE, f"https://lonely.example/p{n}") for n in range(5)]
    await gone_between_phases_2_and_3(redis_cluster, prefix, keys)
    assert age_ledgers(redis_cluster, prefix, _TOKEN_TTL + 60) == 1
    age_intents(redis_cluster, prefix, _TOKEN_TTL + 60)
    store = open_store(redis_cluster, prefix)
    try:
        await assert_whole_summary(store, 5)
        with redis_cluster.client() as client:
            assert client.hget(f"{prefix}:nvm:{{{LONELY_SHARD}}}", "lost") is None
            assert client.smembers(f"{prefix}:hs:{{{LONELY_SHARD}}}") == {b"lonely.example"}
        assert redis_cluster.keys(f"{prefix}:fx:*") == []
    finally:
        await call(store.close())


#: A page of a.example (flush_five's host) whose check ledger entries set.
CHECKED = "a.example|x"


async def adopt_entries(
    cluster: LoopbackCluster, prefix: str,
    entries: Callable[[int, int], list[tuple[str, str | bytes]]],
) -> tuple[list[bytes], int | None]:
    """flush_five's pages, a crawl's mark taken on their scope (checks are
    noted since), then the entries *entries* gives (of the mark and the
    ledger's node's time) put in a.example's group's ledger, listed by a
    dead worker's intent, for a reader to adopt. Returns what the ledger
    holds after (its tokens) and CHECKED's check in its shard's P:ck, in
    seconds after the mark (None: not there)."""
    await flush_five(cluster, prefix)
    store = open_store(cluster, prefix)
    assert store.take_scope(SCOPE, "crawl-2", 60, 1_000_005) is None
    ledger = ledger_key(prefix, "a.example")
    try:
        with cluster.client() as client:
            mark = int(client.hget(f"{prefix}:nvm:{{{A_SHARD}}}", "mark"))
            now = int(client.eval("return redis.call('TIME')[1]", 1, ledger))
            for token, value in entries(mark, now):
                client.hset(ledger, token, value)
            # Short: a listpack, which keeps the order written.
            assert client.object("encoding", ledger) == b"listpack"
            client.zadd(f"{prefix}:fxhosts:{{{A_SHARD}}}",
                        {f"{host_group('a.example')}\0gone-worker": now - 5})
        store.adopt_ledgers_sync(SCOPE)
        with cluster.client() as client:
            checked = client.zscore(f"{prefix}:ck:{{{A_SHARD}}}", CHECKED)
            return sorted(client.hkeys(ledger)), None if checked is None else int(checked) - mark
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_an_adoption_keeps_a_pages_latest_check_whatever_order_its_entries_come_in(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """Three entries of one host's ledger set the same page's check: the
    latest check stays in P:ck whatever order they are applied in (by their
    stamps or the ledger's hash): an entry stamped later with an older
    check (a late worker) does not lower it, one whose page has no
    callback now ('') does not remove it (a summary reads the page)."""
    left, checked = await adopt_entries(redis_cluster, prefix, lambda mark, now: [
        ("c" * 32, json.dumps([now - 5, {"checks": [[CHECKED, ""]]}])),
        ("b" * 32, json.dumps([now - 10, {"checks": [[CHECKED, mark + 30]]}])),
        ("a" * 32, json.dumps([now - 20, {"checks": [[CHECKED, mark + 50]]}]))])
    assert left == []
    assert checked == 50


@pytest_twisted.ensureDeferred
async def test_an_adoption_leaves_a_ledger_value_that_is_no_entry_and_applies_the_others(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A value of a group's ledger that is no entry (not JSON; a time that
    is no number) is left out by a reader's adoption, which applies the
    entry beside it (its effects a string of JSON, as the scripts write
    them) and leaves those values as they are (the group's script drops
    them): the read goes on, nothing of the entry is lost."""
    left, checked = await adopt_entries(redis_cluster, prefix, lambda mark, now: [
        ("a" * 32, json.dumps([now - 20, json.dumps({"checks": [[CHECKED, mark + 50]]})])),
        ("b" * 32, b"not json"),
        ("c" * 32, json.dumps(["yesterday", {"checks": [[CHECKED, mark + 90]]}]))])
    assert left == [b"b" * 32, b"c" * 32]
    assert checked == 50


@pytest_twisted.ensureDeferred
async def test_a_page_a_crawl_writes_while_a_host_is_forgotten_stays_due(
    redis_cluster: LoopbackCluster, prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker writes a page of a host whose repair deleted its pages a
    moment before (the host's script ran, the rest of the repair not yet):
    the page stays in the revisit index (the repair leaves the host's place
    in its shard: an empty bucket's bound is a lower bound still)."""
    await flush_five(redis_cluster, prefix)
    repair = open_store(redis_cluster, prefix)
    worker = open_store(redis_cluster, prefix)
    deleted, go = threading.Event(), threading.Event()
    host_part_of_repair = repair._forget_host_slot

    def then_wait(*args: Any, **kwargs: Any) -> Any:
        done = host_part_of_repair(*args, **kwargs)
        deleted.set()
        go.wait(30)
        return done

    monkeypatch.setattr(repair, "_forget_host_slot", then_wait)
    try:
        forgotten = deferToThread(repair.forget_host, SCOPE, "a.example")
        assert await deferToThread(deleted.wait, 30)
        new = PageKey(SCOPE, "https://a.example/new")
        worker.stage_page(full_state(new, 1, callback="parse", next_visit=1_000))
        await call(worker.flush())
        go.set()
        assert (await forgotten).pages == 5
        assert [s.key for s in await call(worker.get_due(SCOPE, 2_000, 10))] == [new]
        assert [s.key for s in worker.iter_pages(SCOPE)] == [new]
    finally:
        go.set()
        await call(worker.close())
        await call(repair.close())


@pytest.mark.parametrize("bad", ["007", "9223372036854775807"])
@pytest_twisted.ensureDeferred
async def test_a_hosts_write_generation_that_cannot_be_raised_refuses_its_writes(
    redis_cluster: LoopbackCluster, prefix: str, bad: str,
) -> None:
    """As on one server: a host's counter INCR would refuse or overflow
    refuses the host's writes and a repair of its pages before any."""
    key = PageKey(SCOPE, "https://a.example/p")
    counter = host_key(prefix, "wg", "a.example")
    store = open_store(redis_cluster, prefix)
    try:
        store.stage_page(full_state(key, 1))
        await call(store.flush())
        with redis_cluster.client() as client:
            client.set(counter, bad)
            assert await call(store.write_generation(SCOPE, ["a.example"])) is None
            with pytest.raises(StateStoreError, match="nothing was deleted"):
                store.forget_page(SCOPE, key.url)
            store.stage_page(full_state(key, 2))
            with pytest.raises(StateStoreError):
                await call(store.flush())
            assert client.get(counter) == bad.encode()
            client.set(counter, "5")
        reader = open_store(redis_cluster, prefix)
        try:
            assert await call(reader.get_page(key)) == full_state(key, 1)
        finally:
            await call(reader.close())
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_phase_whose_reply_was_lost_a_day_ago_is_not_sent_again(
    redis_cluster: LoopbackCluster, prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past half the life of its token (Redis may have forgotten whether it
    ran), a script whose reply was lost is not sent again: it could apply
    its writes twice. The flush says so; its writes stay staged."""
    key = PageKey(SCOPE, "https://a.example/p")
    store = open_store(redis_cluster, prefix)
    try:
        store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
        await call(store.flush())
        store.stage_check(key, 304, 3_000_000, schedule=(3_600, 4_000))
        lose_reply_of(store, CLUSTER_HOST_LUA)
        with pytest.raises(StateStoreError):
            await call(store.flush())
        later(monkeypatch, 0.51)
        with pytest.raises(StateStoreError, match="reply was lost"):
            await call(store.flush())
        assert store.pending == 1
    finally:
        monkeypatch.undo()
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_repair_stalled_past_its_intents_deadline_says_it_again_and_loses_nothing(
    redis_cluster: LoopbackCluster, prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A repair stalls between its write-ahead intent and its host's script
    for longer than adopt_after: a reader takes the intent for a dead
    writer's and drops it (nothing in the ledger yet). The host's script is
    then late (as a flush's phase 2 past its deadline): the repair writes
    its intent again before it deletes, so its effects are listed; cut
    before its shard's script, the next reading takes its pages out of the
    sums."""
    await flush_five(redis_cluster, prefix)
    repair = open_store(redis_cluster, prefix)
    reader = open_store(redis_cluster, prefix)
    repair.adopt_after = reader.adopt_after = 2  # (a test cannot wait ten minutes)
    intents = repair._intents_key(A_SHARD)
    stalled, go = threading.Event(), threading.Event()
    said: list[tuple[str, str]] = []
    say = repair._repair_intent

    def then_stall(intent: tuple[str, str]) -> Any:
        stamp = say(intent)
        said.append(intent)
        if len(said) == 1:
            stalled.set()
            go.wait(60)
        return stamp

    def cut(*args: Any) -> None:
        raise StateStoreError("repair cut short (the shard's node is gone)")

    monkeypatch.setattr(repair, "_repair_intent", then_stall)
    monkeypatch.setattr(repair, "_repair_effects", cut)
    try:
        forgotten = deferToThread(repair.forget_host, SCOPE, "a.example")
        try:
            assert await deferToThread(stalled.wait, 60)
            with redis_cluster.node(redis_cluster.port_of(intents)) as node:
                # Bounded: until the intent is adopt_after old on its node's clock.
                stamp = node.zscore(*said[0])
                for _ in range(600):
                    if int(node.time()[0]) - stamp >= reader.adopt_after:
                        break
                    await deferLater(reactor, 0.05)
                reader.adopt_ledgers_sync(SCOPE)
                assert node.zcard(intents) == 0  # dropped: a dead writer's, by its age
        finally:
            go.set()
        with pytest.raises(StateStoreError, match="cut short"):
            await forgotten
        assert list(reader.iter_pages(SCOPE)) == []
        # Listed, the effects are applied by the next reading, once.
        await assert_whole_summary(reader, 0)
        assert redis_cluster.keys(f"{prefix}:fx:*") == []
        assert len(said) == 2  # said again before anything was deleted
    finally:
        go.set()
        await call(reader.close())
        await call(repair.close())


@pytest_twisted.ensureDeferred
async def test_a_repair_script_sent_again_after_a_lost_reply_deletes_and_loses_nothing(
    redis_cluster: LoopbackCluster, prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host's repair script ran, its reply was lost, and it was sent
    again (the cluster client retries a command on a connection or timeout
    error): the second run answers as the first did, so the repair takes
    its pages out of the sums and says what it deleted."""
    await flush_five(redis_cluster, prefix)
    repair = open_store(redis_cluster, prefix)
    reader = open_store(redis_cluster, prefix)
    real_eval = repair._sync.eval

    def sent_twice(script: str, *args: Any) -> Any:
        if script == CLUSTER_FORGET_LUA:
            real_eval(script, *args)  # ran; its reply lost
        return real_eval(script, *args)

    monkeypatch.setattr(repair._sync, "eval", sent_twice)
    try:
        removed = await deferToThread(repair.forget_host, SCOPE, "a.example")
        monkeypatch.undo()
        assert removed.pages == 5
        assert list(reader.iter_pages(SCOPE)) == []
        await assert_whole_summary(reader, 0)
        assert redis_cluster.keys(f"{prefix}:fx:*") == []
    finally:
        await call(reader.close())
        await call(repair.close())


@pytest.mark.parametrize("lost", ["before the host's script", "after it"])
@pytest_twisted.ensureDeferred
async def test_a_repair_that_lost_its_hold_deletes_nothing_further(
    redis_cluster: LoopbackCluster, prefix: str, lost: str,
) -> None:
    """The repair's hold is lost before its host's script (nothing deleted)
    or between it and the items' slots: it stops there, saying what it had
    deleted; the items are left (run again, it deletes them)."""
    key = PageKey(SCOPE, "https://a.example/p0")
    store = open_store(redis_cluster, prefix)
    store.stage_item(item("i0", page=key.url))
    store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
    await call(store.flush())
    await call(store.close())
    repair = open_store(redis_cluster, prefix)
    checks: list[str] = []

    def guard() -> None:
        checks.append("checked")
        if len(checks) > (lost == "after it"):
            raise RepairStopped("the hold was taken")

    repair.repair_guard = guard
    try:
        with pytest.raises(RepairStopped, match="the hold was taken") as stopped:
            await deferToThread(repair.forget_host, SCOPE, "a.example")
        repair.repair_guard = None
        pages = 0 if lost == "before the host's script" else 1
        assert stopped.value.removed.pages == pages
        assert (await call(repair.get_page(key)) is None) == bool(pages)
        assert len(list(repair.iter_items(SCOPE))) == 1  # not deleted
        assert repair.forget_host(SCOPE, "a.example").items == 1  # run again
        await assert_whole_summary(repair, 0)
    finally:
        await call(repair.close())


@pytest_twisted.ensureDeferred
async def test_a_repair_walks_the_item_groups_together_in_pipelined_rounds(
    redis_cluster: LoopbackCluster, prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page or host repair (and ``url_record``) finds its items by their
    records, over every item group's hash (1,024): walked together, each
    round of HSCAN steps one pipeline, an empty group costing none. An
    empty scope's walk is one pipeline (the groups' sizes), not one round
    trip a group; a group of many items (more than one step: small steps
    here, and more than a listpack holds) is walked over several rounds,
    and every item is found, none of another page's or host's."""
    monkeypatch.setattr(redis_core, "_SCAN_COUNT", 20)
    monkeypatch.setattr(redis_core, "_SCAN_ROUND_ENTRIES", 50)
    store = open_store(redis_cluster, prefix)
    try:
        trips = store.roundtrips
        assert store.url_record(SCOPE, "https://a.example/p").items == []
        empty_walk = store.roundtrips - trips
        # url_record's own reads (at most 5), and the walk's one pipeline
        # of sizes a primary (3).
        assert empty_walk <= 5 + 3, empty_walk
        page, other_page, other_host = ("https://a.example/p", "https://a.example/q",
                                        "https://b.example/r")
        # 150 items of one group (one hash, beyond hash-max-listpack-entries:
        # several HSCAN steps), and 20 spread over the groups, from page;
        # 20 from another page of the host, 20 from another host.
        crowded = item_group("crowd-0")
        same = list(itertools.islice(
            (k for k in (f"crowd-{n}" for n in range(400_000)) if item_group(k) == crowded),
            150))
        assert len(same) == 150
        mine = same + [f"spread-{n}" for n in range(20)]
        sibling = [f"sibling-{n}" for n in range(20)]
        stranger = [f"stranger-{n}" for n in range(20)]
        for keys, url in ((mine, page), (sibling, other_page), (stranger, other_host)):
            store.stage_page(full_state(PageKey(SCOPE, url), 1, callback="parse"))
            for key in keys:
                store.stage_item(item(key, page=url))
        await call(store.flush())
        group_key = f"{prefix}:items:{{{SCOPE}#{crowded}}}"
        assert redis_cluster.client().hlen(group_key) == 150
        assert redis_cluster.client().object("encoding", group_key) == b"hashtable"
        trips = store.roundtrips
        assert store.url_record(SCOPE, page).items == sorted(mine)
        # Beyond the empty scope's trips (the same own reads and sizes):
        # the rounds, each a pipeline to each primary it reaches (1 to 3).
        # The crowded group takes a step a round, and more than one step
        # (150 entries, a step returning 20 and a bucket's few more): two
        # rounds at least. Every round but the last asks for more than
        # 50 - 20 entries (else the next group would have fitted) and gets
        # them (a small group is returned whole, the crowded one at least
        # 20 a step but its last): 210 entries make 8 rounds at most,
        # where a group a round would take 61 or more.
        rounds_trips = store.roundtrips - trips - empty_walk
        assert 2 <= rounds_trips <= 3 * 8, rounds_trips
        assert store.forget_page(SCOPE, page).items == len(mine)
        assert store.url_record(SCOPE, page).items == []
        assert store.url_record(SCOPE, other_host).items == sorted(stranger)
        assert store.forget_host(SCOPE, "a.example").items == len(sibling)
        assert sorted(i["url"] for i in store.iter_items(SCOPE)) == sorted(
            f"https://example.com/{k}" for k in stranger)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_walk_of_the_item_groups_fails_at_the_first_timeout_of_a_stopped_primary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A primary that stops answering (SIGSTOP: a paused VM or container)
    fails a walk of the item groups (a repair's, ``url_record``'s) at its
    first timeout, as a :class:`StateStoreError` naming it: it was sent its
    share of the walk once, as one pipeline, and nothing after that. The
    cluster client's own pipeline would send it those commands again one
    at a time, each waiting out the timeout (hundreds of them), while a
    repair holds its scope. A cluster of the test's own: its node is
    stopped."""
    from tests.redis_cluster_util import LoopbackCluster

    # Short, so that the test does not wait long; long enough for the
    # primaries that do answer (a round trip each), however busy the machine.
    monkeypatch.setattr(redis_core, "_DEFAULT_TIMEOUTS",
                        {"socket_connect_timeout": 3.0, "socket_timeout": 3.0})
    sent: dict[int, list[int]] = {}

    def pack_commands(self: Any, commands: list[Any]) -> Any:
        sent.setdefault(self.port, []).append(len(commands))
        return original_pack(self, commands)

    def send_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent.setdefault(self.port, []).append(1)
        return original_send(self, *args, **kwargs)

    connection_class: Any = redis.connection.AbstractConnection
    original_pack, original_send = connection_class.pack_commands, connection_class.send_command
    own = LoopbackCluster()
    own.start()
    try:
        store = RedisStateStore(own.url, prefix=new_prefix())
        # A URL whose host's keys are on another primary than the stopped one.
        url = "https://a.example/p"
        groups = store._group_keys("items", SCOPE)
        with own.client() as client:
            ports = [int(client.get_node_from_key(key).port) for key in groups]
        stopped = next(p for p in own.ports
                       if p != own.port_of(store._host_key("hd", SCOPE, "a.example")))
        # Every primary's connection opened (nothing left to say on connecting).
        assert store.url_record(SCOPE, url).items == []
        monkeypatch.setattr(connection_class, "pack_commands", pack_commands)
        monkeypatch.setattr(connection_class, "send_command", send_command)
        pid = int((own.dir / f"redis-{stopped}.pid").read_text())
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(StateStoreError) as failed:
                store.url_record(SCOPE, url)
        finally:
            os.kill(pid, signal.SIGCONT)
        monkeypatch.undo()
        # One pipeline: the sizes of the groups it serves, each asked once.
        assert sent[stopped] == [ports.count(stopped)], sent[stopped]
        assert f"read failed on 127.0.0.1:{stopped}: Timeout" in str(failed.value)
        await call(store.close())
    finally:
        own.remove()


@pytest_twisted.ensureDeferred
async def test_a_walk_of_the_item_groups_that_meets_a_moved_slot_says_to_run_it_again() -> None:
    """A group's slot handed to another primary after the store read the
    slot table (resharding, failover): the old primary answers MOVED. The
    walk, which sends each primary its part itself, does not follow it: a
    :class:`StateStoreError` says to run it again, and that run finds the
    slot where it went. A cluster of the test's own: its slot is moved."""
    from tests.redis_cluster_util import LoopbackCluster

    own = LoopbackCluster()
    own.start()
    try:
        store = RedisStateStore(own.url, prefix=new_prefix())
        url = "https://a.example/p"
        group = store._group_keys("items", SCOPE)[0]
        slot = key_slot(group.encode())
        owner = own.port_of(group)
        target = next(p for p in own.ports if p != owner)
        # url_record's own reads (the URL's host) are elsewhere.
        assert key_slot(store._host_key("hd", SCOPE, "a.example").encode()) != slot
        assert store.url_record(SCOPE, url).items == []  # the slot table read
        with own.node(target) as client:
            target_id = client.execute_command("CLUSTER", "MYID")
        # The group holds nothing: the slot changes hands without a key to move.
        for port in (target, *(p for p in own.ports if p != target)):
            with own.node(port) as client:
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        with pytest.raises(StateStoreError) as failed:
            store.url_record(SCOPE, url)
        assert "a slot moved during the walk" in str(failed.value), failed.value
        # redis-py's MOVED error says the slot and where it went.
        assert str(failed.value).endswith(f" {slot} 127.0.0.1:{target}"), failed.value
        assert store.url_record(SCOPE, url).items == []
        await call(store.close())
    finally:
        own.remove()
