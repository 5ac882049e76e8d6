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
import logging
import math
import os
import signal
import threading
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from scrapy.settings import Settings
from twisted.internet.threads import deferToThread

from incremental_crawler.state.records import HostTrust, PageKey
from incremental_crawler.state.stores.base import RepairStopped, StateStoreError, due_after
from incremental_crawler.state.stores.redis import RedisStateStore
from incremental_crawler.state.stores.redis import core as redis_core
from incremental_crawler.state.stores.redis import due as due_reads
from incremental_crawler.state.stores.redis.core import (
    SCOPE_SHARDS,
    fine_part,
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
from incremental_crawler.state.stores.redis.pages import bucket_of
from incremental_crawler.state.stores.redis.scripts import (
    CLUSTER_FORGET_LUA,
    CLUSTER_HOST_LUA,
    CLUSTER_ITEMS_LUA,
    CLUSTER_SCOPE_LUA,
    CLUSTER_SUMMARY_LUA,
)
from tests.clock_util import later
from tests.redis_cluster_util import own_prefix  # noqa: F401 (the prefix fixture)
from tests.redis_util import new_prefix
from tests.test_store_contract import SCOPE, brute_summary, call, full_state, item

if TYPE_CHECKING:
    from collections.abc import Callable

    from incremental_crawler.state.records import PageState
    from tests.redis_cluster_util import LoopbackCluster


def shard_of(host: str) -> str:
    """The inside of the tag of the scope shard *host* is in: its host
    group's (``<s>|<g>``)."""
    return shard_part(SCOPE, scope_shard(host))


#: The scope shard of a.example, the host most tests write.
A_SHARD = shard_of("a.example")


def host_key(prefix: str, kind: str, host: str, scope: str = SCOPE) -> str:
    """A host's key of *kind* (its group's tag, then the host)."""
    return f"{prefix}:{kind}:{host_tag(scope, host)}"


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
    """A summary of the whole scope counts *pages*, and every summary the
    sums give is the pages'."""
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

        # The retried flush completes: a's page with its effects (b's were
        # applied with its page, in its group's script, by the failed flush).
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
    sums are counted once (the scope's own script runs for the host's
    trust, a scope write)."""
    key = PageKey(SCOPE, "https://a.example/p")
    store = open_store(redis_cluster, prefix)
    reader = open_store(redis_cluster, prefix)
    try:
        store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
        await call(store.flush())
        store.stage_item(item("a", 1, page=key.url))
        store.stage_check(key, 304, 3_000_000, schedule=(3_600, 4_000))
        store.stage_host(HostTrust(SCOPE, "a.example", checks=3))
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
        trust = await call(reader.get_host(SCOPE, "a.example"))
        assert trust is not None and trust.checks == 3
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
    splits, the host listed) are applied all the same, by its group's
    script (its reply, or its replay when the reply was lost, says so):
    the moved pages are due."""
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
async def test_a_damaged_group_key_fails_its_script_whole_and_leaves_the_other_groups(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A host group's script applies its pages and their effects on the
    scope (sums, index, hosts, splits: the group's own keys) whole or not
    at all: with its splits count damaged, nothing of its own is written
    (no page, no sum, no host listed), while another group's pages and
    effects in the same flush are; repaired, the rest is sent again and
    counted once."""
    other = next(f"o{n}.example" for n in range(100)
                 if host_group(f"o{n}.example") != host_group("a.example"))
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(100)]
    others = [PageKey(SCOPE, f"https://{other}/p{n}") for n in range(3)]
    other_shard = shard_of(other)
    store = open_store(redis_cluster, prefix)
    splits = f"{prefix}:splits:{{{A_SHARD}}}"
    try:
        with redis_cluster.client() as client:
            # The count of splits is not a number; the flush splits buckets.
            client.set(splits, "damaged")
            for n, key in enumerate([*keys, *others]):
                store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
            with pytest.raises(StateStoreError, match="is not a number"):
                await call(store.flush())
            # Nothing of the damaged group: no page, no effect.
            assert client.keys(f"{prefix}:pg*:{{{A_SHARD}}}:*") == []
            for kind in ("nvs", "hs", "dueb"):
                assert not client.exists(f"{prefix}:{kind}:{{{A_SHARD}}}"), kind
            # The other group's pages and effects, all of them.
            assert client.smembers(f"{prefix}:hs:{{{other_shard}}}") == {other.encode()}
            assert client.hlen(f"{prefix}:nvs:{{{other_shard}}}") > 0
            assert client.zcard(f"{prefix}:dueb:{{{other_shard}}}") == 1
            assert {s.key for s in store.iter_pages(SCOPE)} == set(others)
            await assert_sums_are_the_pages(store)
            client.delete(splits)
        await call(store.flush())
        assert store.pending == 0
        with redis_cluster.client() as client:
            assert int(client.get(splits)) >= 1
        assert len(list(store.iter_pages(SCOPE))) == 103
        await assert_sums_are_the_pages(store)
        due = await call(store.get_due(SCOPE, 1_000 + 102, 200))
        assert [s.key for s in due] == [*keys, *others]
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
    gone.stage_host(HostTrust(SCOPE, "a.example", checks=1))  # (phase 3 has a write)
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
    gone.stage_host(HostTrust(SCOPE, "a.example", checks=1))  # (phase 3 has a write)
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
        a.stage_host(HostTrust(SCOPE, "a.example", checks=1))  # (phase 3 has a write)
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


@pytest_twisted.ensureDeferred
async def test_a_scopes_shard_keys_spread_over_every_primary_and_due_pages_merge(
    redis_cluster: LoopbackCluster, prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flush of many hosts' pages writes the scope's revisit index,
    sums and hosts per scope shard (the hosts' groups), on every primary;
    a due read merges the
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
                # Each shard (host group) lists its hosts, and only those.
                assert hosts == {h for h in MANY_HOSTS if scope_shard(h) == k}
                assert client.zcard(index) == len(hosts)
                assert (client.hlen(f"{prefix}:nvs:{{{shard_part(SCOPE, k)}}}") > 0) == bool(
                    hosts)
                if hosts:
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
        before = store.roundtrips
        assert sorted(store._scope_hosts(SCOPE)) == sorted(MANY_HOSTS)
        # The 64 groups' host sets read in one pipeline (a step each).
        assert store.roundtrips - before == 1
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
async def test_a_host_missing_from_its_scope_is_listed_again_when_written(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A host whose record exists but that its shard does not list (taken
    out by hand, or a host's first flush of layout 7 whose effects were
    lost) is listed by its next write, not only by a write that creates
    its record."""
    keys = [PageKey(SCOPE, f"https://lonely.example/p{n}") for n in range(5)]
    writer = open_store(redis_cluster, prefix)
    for n, key in enumerate(keys):
        writer.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
    await call(writer.flush())
    await call(writer.close())
    with redis_cluster.client() as client:
        hosts = f"{prefix}:hs:{{{shard_part(SCOPE, scope_shard('lonely.example'))}}}"
        assert client.srem(hosts, "lonely.example") == 1
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


async def assert_summaries_by_check(store: Any, befores: tuple[int, ...]) -> None:
    """The summaries of the whole scope checked before each of *befores*
    are what its pages say."""
    states = list(store.iter_pages(SCOPE))
    for before in befores:
        got = await call(store.summarize_pages(SCOPE, after=-math.inf, upto=math.inf,
                                               checked_before=before))
        assert tuple(got) == brute_summary(states, -math.inf, math.inf, before, ()), before


def lonely_page(n: int) -> PageState:
    """A page of lonely.example (its effects all go to LONELY_SHARD)."""
    return full_state(PageKey(SCOPE, f"https://lonely.example/p{n}"), 1,
                      callback="parse", next_visit=1_000 + n)


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


async def summaries_are_the_pages(store: RedisStateStore) -> None:
    """Every summary (several windows) is what the pages one by one say
    (the stored sums' values not parsed: one is damaged on purpose)."""
    states = list(store.iter_pages(SCOPE))
    for after, upto in ((-math.inf, math.inf), (0, 1_500), (1_500, math.inf)):
        got = await call(store.summarize_pages(SCOPE, after=after, upto=upto,
                                               checked_before=math.inf))
        assert tuple(got) == brute_summary(states, after, upto, math.inf, ())


@pytest.mark.parametrize("damaged", ["coarse", "fine"])
@pytest_twisted.ensureDeferred
async def test_a_stored_sum_that_cannot_be_added_to_marks_the_groups_sums_lost(
    redis_cluster: LoopbackCluster, prefix: str, damaged: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One field of a host group's sums (its coarse ``P:nvs``, or its fine
    ``P:nvf`` hash of the visit's hour) is not a number: the group's
    script cannot add a page's move out of it, so it marks the group's
    sums lost (``lost`` in its ``P:nvm``) and the flush warns; every
    summary after it reads the pages, exact (without the mark, the write's
    delta would be dropped and every later summary off by it). The same
    for a page forgotten: its script marks them lost again and warns."""
    keys = [PageKey(SCOPE, f"https://a.example/p{n}") for n in range(3)]
    store = open_store(redis_cluster, prefix)
    meta = f"{prefix}:nvm:{{{A_SHARD}}}"
    try:
        for key in keys:
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
        await call(store.flush())
        if damaged == "coarse":
            sums, field = f"{prefix}:nvs:{{{A_SHARD}}}", f"{1_000 // 60}|parse"
        else:
            sums = f"{prefix}:nvf:{{{A_SHARD}}}:{fine_part(1_000)}"
            field = "1000|parse"
        with redis_cluster.client() as client:
            assert client.hget(sums, field) is not None
            client.hset(sums, field, "damaged")
            assert not client.hexists(meta, "lost")
        # A page moved from 1,000 to 2,000: its 1,000 is taken out of the
        # damaged sum.
        store.stage_page(full_state(keys[0], 2, callback="parse", next_visit=2_000))
        with caplog.at_level(logging.WARNING):
            assert await call(store.flush()) == 1
        said = [r.getMessage() for r in caplog.records
                if "could not be added to (damaged)" in r.getMessage()]
        assert len(said) == 1 and A_SHARD in said[0] and "marked lost" in said[0], said
        with redis_cluster.client() as client:
            assert client.hexists(meta, "lost")
            assert client.hget(sums, field) == b"damaged"
        await summaries_are_the_pages(store)
        # A page forgotten from the same damaged sum: marked lost again.
        with redis_cluster.client() as client:
            client.hdel(meta, "lost")
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert store.forget_page(SCOPE, keys[1].url).pages == 1
        said = [r.getMessage() for r in caplog.records
                if "could not be taken from (damaged)" in r.getMessage()]
        assert len(said) == 1 and "marked lost" in said[0], said
        with redis_cluster.client() as client:
            assert client.hexists(meta, "lost")
        assert len(list(store.iter_pages(SCOPE))) == 2
        await summaries_are_the_pages(store)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_full_cluster_refuses_a_flush_whole_and_still_reads_and_resets(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """Every primary above its maxmemory (noeviction) during a flush: the
    flush fails with the out-of-memory line (free memory or raise the
    limit), nothing of it applied (the page as it was, due and summed as
    before); the store still reads the scope (a page, due pages, a
    summary, every page, its counts); once memory is raised the same
    flush is sent again and applied once; full again, a reset (how memory
    is freed) still deletes the scope."""
    keys = [PageKey(SCOPE, f"https://h{n}.example/p") for n in range(6)]
    store = open_store(redis_cluster, prefix)
    reader = open_store(redis_cluster, prefix)
    nodes = [redis_cluster.node(port) for port in redis_cluster.ports]
    kept = [(node.config_get("maxmemory")["maxmemory"],
             node.config_get("maxmemory-policy")["maxmemory-policy"]) for node in nodes]

    def full(on: bool) -> None:
        for node, (memory, policy) in zip(nodes, kept, strict=True):
            node.config_set("maxmemory-policy", "noeviction" if on else policy)
            node.config_set("maxmemory", "1" if on else memory)  # 1: every write refused

    try:
        for n, key in enumerate(keys):
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        await call(store.flush())
        for n, key in enumerate(keys):
            store.stage_page(full_state(key, 2, callback="parse", next_visit=2_000 + n))
        try:
            full(True)
            with pytest.raises(StateStoreError) as said:
                await call(store.flush())
            line = str(said.value)
            assert "out of memory" in line and "maxmemory" in line, line
            assert "\n" not in line
            assert store.pending == len(keys)
            for n, key in enumerate(keys):
                page = await call(reader.get_page(key))
                assert page is not None and (page.checks, page.next_visit) == (1, 1_000 + n)
            due = await call(reader.get_due(SCOPE, 1_500, 100))
            assert sorted(s.key.url for s in due) == sorted(k.url for k in keys)
            await assert_sums_are_the_pages(reader)
            assert reader.count_pages(SCOPE) == len(keys)
            assert reader.count_scope(SCOPE).pages == len(keys)
        finally:
            full(False)
        assert await call(store.flush()) == len(keys)
        assert store.pending == 0
        for n, key in enumerate(keys):
            page = await call(reader.get_page(key))
            assert page is not None and (page.checks, page.next_visit) == (2, 2_000 + n)
        assert [s.key for s in await call(reader.get_due(SCOPE, 1_500, 100))] == []
        await assert_whole_summary(reader, len(keys))
        try:
            full(True)
            reader.reset_scope(SCOPE)
        finally:
            full(False)
        left = [k.decode() for k in redis_cluster.keys(f"{prefix}:*")]
        # But the hosts' write generations (raised, never deleted) and the
        # flushes' tokens (they expire).
        assert [k for k in left if "{books" in k and ":wg:" not in k
                and ":flush:" not in k] == []
        assert list(reader.iter_pages(SCOPE)) == []
    finally:
        full(False)
        for node in nodes:
            node.close()
        await call(store.close())
        await call(reader.close())


def hosts_on_three_nodes(cluster: LoopbackCluster, prefix: str) -> tuple[list[str], list[int]]:
    """Three hosts whose keys are on the three nodes, and those nodes'
    ports (in the hosts' order)."""
    seen: dict[int, str] = {}
    for n in range(300):
        host = f"h{n}.example"
        seen.setdefault(cluster.port_of(host_key(prefix, "hd", host)), host)
        if len(seen) == 3:
            return [seen[port] for port in sorted(seen)], sorted(seen)
    raise AssertionError("no three hosts on three nodes in 300 tries")


@pytest_twisted.ensureDeferred
async def test_a_flush_whose_group_scripts_ran_on_one_node_only_is_replayed_once(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """Phase 2 of a flush runs on one node and its connection to the two
    others fails before their groups' scripts ran: the pages of the first
    are written, the others' not; the next flush sends every group's
    script again under the same tokens: the one that ran applies nothing
    twice (each page checked twice, not three times), the others apply
    theirs, due pages and sums the pages'. (The one case where a flush's
    token is found on some nodes and not on others.)"""
    hosts, ports = hosts_on_three_nodes(redis_cluster, prefix)
    keys = [PageKey(SCOPE, f"https://{host}/p") for host in hosts]
    store = open_store(redis_cluster, prefix)
    reader = open_store(redis_cluster, prefix)
    try:
        for n, key in enumerate(keys):
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        await call(store.flush())
        original = store._eval_many
        cut: list[int] = []

        async def eval_many(calls: list[tuple[str, list[str], list[Any]]],
                            plain: Any = ()) -> list[Any]:
            if not cut and any(script == CLUSTER_HOST_LUA for script, _, _ in calls):
                cut.append(1)
                first = [c for c in calls if c[0] != CLUSTER_HOST_LUA
                         or redis_cluster.port_of(c[1][0]) == ports[0]]
                assert len(first) < len(calls)
                await original(first, plain)
                raise redis.exceptions.ConnectionError("two nodes unreachable")
            return await original(calls, plain)

        store._eval_many = eval_many  # type: ignore[method-assign]
        for n, key in enumerate(keys):
            store.stage_check(key, 304, 3_000_000 + n, schedule=(3_600, 7_000 + n))
        with pytest.raises(StateStoreError):
            await call(store.flush())
        assert cut == [1]
        first = await call(reader.get_page(keys[0]))
        assert first is not None and (first.checks, first.next_visit) == (2, 7_000)
        for n, key in enumerate(keys[1:], start=1):
            page = await call(reader.get_page(key))
            assert page is not None and (page.checks, page.next_visit) == (1, 1_000 + n)
        await call(store.flush())
        assert store.pending == 0
        for n, key in enumerate(keys):
            page = await call(reader.get_page(key))
            assert page is not None and (page.checks, page.next_visit) == (2, 7_000 + n)
        assert [s.key for s in await call(reader.get_due(SCOPE, 8_000, 10))] == keys
        await assert_sums_are_the_pages(reader)
    finally:
        await call(store.close())
        await call(reader.close())
