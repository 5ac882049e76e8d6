"""The cluster layout's host groups (version 7, and 8: each group its
hosts' scope shard): a flush's phase 2 is one script a host group, which
applies its writes' effects itself, the groups spread over the slots, and
stores of layouts 6 (a script a host) and 7 (eight scope shards) migrated
in place, on a real loopback cluster."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys
import tarfile
import textwrap
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
import redis
from redis.crc import key_slot
from scrapy.crawler import CrawlerRunner
from twisted.internet.threads import deferToThread

from incremental_crawler.state.records import PageKey, PageState
from incremental_crawler.state.stores.base import StateStoreError
from incremental_crawler.state.stores.redis import RedisStateStore, layout
from incremental_crawler.state.stores.redis.core import (
    HOST_GROUPS,
    OLD_SCOPE_SHARDS,
    host_group,
    host_tag,
    old_scope_shard,
    old_shard_part,
)
from incremental_crawler.state.stores.redis.layout import (
    _LIVE_INTENT,
    CLUSTER_LAYOUT_VERSION,
    _entry_of_host,
)
from incremental_crawler.state.stores.redis.scripts import CLUSTER_HOST_LUA
from tests.conftest import crawl_settings
from tests.redis_cluster_util import (
    CommandLog,
    own_prefix,  # noqa: F401 (the prefix fixture)
)
from tests.site import PLAIN_KINDS
from tests.spiders import ListSpider
from tests.test_store_contract import SCOPE, brute_summary, call, full_state

if TYPE_CHECKING:

    from tests.redis_cluster_util import LoopbackCluster

REPO = Path(__file__).resolve().parent.parent
#: A commit of the cluster layout 6 (a phase-2 script a host): the store
#: it writes is the one migrated.
LAYOUT_6_COMMIT = "afbf804323a48a0b3eb1b9dd2e9b2e0b24806373"
#: A commit of the cluster layout 7 (eight scope shards, effects applied by
#: a flush's phase 3 from the groups' ledgers).
LAYOUT_7_COMMIT = "39919217a2b450236fb4633e55ac4041b58eb5e6"


def test_a_scopes_host_groups_fall_one_in_each_64th_of_the_slots() -> None:
    """Whatever the scope's name, its 64 groups' tags are one in each
    64th of the slots (CRC16 is linear: the groups' parts differ only in
    the slot's top six bits), so three primaries of equal ranges hold 21
    or 22 of them each."""
    for scope in ("books", "a", "spider-name", "x%7Cy", "a-much-longer-scope-name-42"):
        slots = sorted(key_slot(f"{{{scope}|{group}}}".encode()) // 256
                       for group in HOST_GROUPS)
        assert slots == list(range(64)), scope


@pytest_twisted.ensureDeferred
async def test_a_flush_over_many_hosts_runs_one_page_script_a_group(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """500 pages on 500 hosts: phase 2 is one script per host group the
    hosts fall in (at most 64), not one a host; every page is stored, and
    the sums are the pages'."""
    keys = [PageKey(SCOPE, f"https://h{n}.example/p") for n in range(500)]
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    sent: list[int] = []
    original = store._eval_many

    async def eval_many(calls: list[tuple[str, list[str], list[Any]]],
                        plain: Any = ()) -> list[Any]:
        sent.extend(1 for script, _, _ in calls if script == CLUSTER_HOST_LUA)
        return await original(calls, plain)

    store._eval_many = eval_many  # type: ignore[method-assign]
    try:
        for n, key in enumerate(keys):
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        await call(store.flush())
        groups = {host_group(f"h{n}.example") for n in range(500)}
        assert len(sent) == len(groups) <= len(HOST_GROUPS)
        got = await call(store.get_pages(keys))
        assert {k: s.etag for k, s in got.items()} == dict.fromkeys(keys, 'W/"etag-1"')
        states = list(store.iter_pages(SCOPE))
        assert len(states) == 500
        assert await whole_summary(store, SCOPE) == whole_brute_summary(states)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_every_key_a_group_or_repair_script_touches_is_in_its_keys(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """Pages on 40 hosts written, then written again with next visits in
    other hours (their old records' hours in no argument the client
    sent), a page and a host forgotten, windows summed: every key every
    script ran a command on (each node's MONITOR) was in the KEYS it was
    called with, the fine sums' hashes too (Redis Cluster only vouches for
    scripts that declare their keys); the summaries are the pages'."""
    keys = [PageKey(SCOPE, f"https://h{h}.example/p{n}") for h in range(40) for n in range(3)]
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        with CommandLog(redis_cluster) as log:
            for n, key in enumerate(keys):
                store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + 1_800 * n))
            await call(store.flush())
            for n, key in enumerate(keys):
                store.stage_page(full_state(key, 2, callback="parse",
                                            next_visit=500_000 + 2_700 * n))
            await call(store.flush())
            store.forget_page(SCOPE, keys[0].url)
            store.forget_host(SCOPE, "h1.example")
            states = list(store.iter_pages(SCOPE))
            for after, upto in ((-math.inf, math.inf), (500_000 + 2_700 * 7 + 30, 600_031)):
                got = await call(store.summarize_pages(SCOPE, after=after, upto=upto,
                                                       checked_before=math.inf))
                assert tuple(got) == brute_summary(states, after, upto, math.inf, ())
        assert len(states) == len(keys) - 4
        assert log.scripts() > 64
        assert log.undeclared() == []
        fine = {key for key in log.touched if b":nvf:" in key}
        assert len(fine) > 10
    finally:
        await call(store.close())


#: Run by the code of LAYOUT_6_COMMIT or LAYOUT_7_COMMIT (its version the
#: last argument): a first flush of pages on HOSTS
#: hosts, closed; then a second flush of new versions of half of them whose
#: phase 3 never runs (the worker dies between its phases 2 and 3: its
#: effects stay in the hosts' ledgers, listed by its intents).
_WRITER = textwrap.dedent("""
    import asyncio, json, sys
    from incremental_crawler.state.records import PageKey
    from incremental_crawler.state.stores.redis import RedisStateStore
    from incremental_crawler.state.stores.redis.layout import CLUSTER_LAYOUT_VERSION
    from tests.test_store_contract import full_state
    url, prefix, scope, hosts = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    assert CLUSTER_LAYOUT_VERSION == int(sys.argv[5])

    async def main():
        keys = [PageKey(scope, f"https://h{h}.example/p{n}")
                for h in range(hosts) for n in range(3)]
        store = RedisStateStore(url, prefix=prefix)
        for n, key in enumerate(keys):
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        await store.flush()
        await store.close()
        dying = RedisStateStore(url, prefix=prefix)
        async def cut(*args, **kwargs):
            raise ConnectionError("the shards' nodes are unreachable")
        dying._phase_scopes = cut
        for n, key in enumerate(keys[::2]):
            dying.stage_page(full_state(key, 2, callback="parse", next_visit=5_000 + n))
        try:
            await dying.flush()
        except ConnectionError:
            pass
        else:
            raise AssertionError("phase 3 ran")
        print(json.dumps([key.url for key in keys]))

    asyncio.run(main())
""")


@pytest.fixture(scope="module")
def layout_6(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package and tests of LAYOUT_6_COMMIT, from git: one tree for the
    module's tests (they only run its code)."""
    return layout_6_tree(tmp_path_factory.mktemp("layout6"))


@pytest.fixture(scope="module")
def layout_7(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package and tests of LAYOUT_7_COMMIT, from git."""
    return layout_6_tree(tmp_path_factory.mktemp("layout7"), LAYOUT_7_COMMIT)


async def whole_summary(store: RedisStateStore, scope: str) -> tuple[Any, ...]:
    """The store's summary of every page of *scope* (no cut)."""
    return tuple(await call(store.summarize_pages(scope, after=-math.inf, upto=math.inf,
                                                  checked_before=math.inf)))


def whole_brute_summary(states: list[PageState]) -> tuple[Any, ...]:
    """What that summary must be, counted from the pages read one by one."""
    return brute_summary(states, -math.inf, math.inf, math.inf, ())


def layout_6_tree(into: Path, commit: str = LAYOUT_6_COMMIT) -> Path:
    """The package and tests of *commit* (LAYOUT_6_COMMIT), from git, under
    *into*."""
    archive = subprocess.run(["git", "archive", commit, "incremental_crawler", "tests"],
                             cwd=REPO, check=True, capture_output=True, timeout=120).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def old_keys(redis_cluster: LoopbackCluster, prefix: str) -> list[str]:
    """The host keys of layout 6 under *prefix* (tagged by a host, not a
    group; the scripts' tokens aside, which expire)."""
    found = []
    for raw in redis_cluster.keys(f"{prefix}:*"):
        key = raw.decode()
        if "|" not in key or ":flush:" in key:
            continue
        inside = key[key.index("{") + 1:key.index("}")]
        if not inside.rpartition("|")[2].startswith("="):
            found.append(key)
    return found


def left_of_layout_7(redis_cluster: LoopbackCluster, prefix: str) -> list[str]:
    """The keys of layouts 6 and 7 that layout 8 no longer keeps: a scope
    shard's (``{<s>^<x>}``), a ledger, an intent, a token held."""
    found = []
    for raw in redis_cluster.keys(f"{prefix}:*"):
        key = raw.decode()
        kind = key[len(prefix) + 1:].partition(":")[0]
        if "^" in key or kind in ("fx", "fxhosts", "fxheld", "fxdone"):
            found.append(key)
    return sorted(found)


def worker_gone_for(redis_cluster: LoopbackCluster, prefix: str,
                    seconds: int = _LIVE_INTENT + 60) -> None:
    """The dead worker's write-ahead intents made *seconds* older (as if
    it had died that long ago: the migration refuses younger ones, which
    a worker still running may be writing under; still younger than the
    readers' adopt_after)."""
    with redis_cluster.client() as client:
        for key in redis_cluster.keys(f"{prefix}:fxhosts:*"):
            members = client.zrange(key, 0, -1, withscores=True)
            client.zadd(key, {member: score - seconds for member, score in members})


@pytest_twisted.ensureDeferred
async def test_a_layout_6_store_is_migrated_in_place_its_dead_workers_effects_once(
    redis_cluster: LoopbackCluster, prefix: str, layout_6: Path,
) -> None:
    """A store written by layout 6's code, a worker of which died between
    its phases 2 and 3, opened by this code: its host keys renamed into
    their groups' slots (none left under a host's tag), every page as the
    old code stored it (the validators a re-crawl sends), the dead worker's
    effects counted once (the sums are the pages', recounted by group),
    no ledger, intent or old shard key left; then written and read as any
    store of layout 8."""
    tree = layout_6
    out = subprocess.run(
        [sys.executable, "-c", _WRITER, redis_cluster.url, prefix, SCOPE, "12", "6"],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True,
        capture_output=True, text=True, timeout=300)
    worker_gone_for(redis_cluster, prefix)
    urls = json.loads(out.stdout.strip().splitlines()[-1])
    before = old_keys(redis_cluster, prefix)
    assert any(":fx:" in key for key in before)  # the dead worker's ledger entries
    assert any(":pg" in key for key in before)
    ledgers = sum(1 for key in before if ":fx:" in key)

    # What a batch of the move costs in round trips (the lock renewed once
    # a batch and once mid-batch: a number of round trips a batch, not a
    # ledger, so that a batch of 2,000 ledgers stays far within the lock).
    original = RedisStateStore._move_batch
    costs: list[tuple[int, int]] = []

    def counted(self: RedisStateStore, moves: list[tuple[str, str]],
                ledgers: dict[str, str], lock: str, token: str) -> int:
        start = self.roundtrips
        try:
            return original(self, moves, ledgers, lock, token)
        finally:
            costs.append((len(ledgers), self.roundtrips - start))

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(RedisStateStore, "_move_batch", counted)
        store = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        assert [n for n, _ in costs] == [ledgers] and ledgers >= 12
        assert costs[0][1] <= 8, costs
        with redis_cluster.client() as client:
            meta = client.hgetall(f"{prefix}:meta")
            assert meta[b"version"] == str(CLUSTER_LAYOUT_VERSION).encode()
            assert b"upgrading" not in meta
        assert old_keys(redis_cluster, prefix) == []
        assert left_of_layout_7(redis_cluster, prefix) == []
        keys = [PageKey(SCOPE, url) for url in urls]
        got = await call(store.get_pages(keys))
        assert len(got) == len(keys)
        rewritten = set(keys[::2])
        for key, state in got.items():
            n = 2 if key in rewritten else 1
            assert (state.etag, state.last_modified, state.checks) == (
                f'W/"etag-{n}"', "Sun, 06 Nov 1994 08:49:37 GMT", n), key
        states = list(store.iter_pages(SCOPE))
        assert len(states) == len(keys)
        for after, upto in ((-math.inf, math.inf), (0, 4_000), (4_000, math.inf)):
            summary = await call(store.summarize_pages(SCOPE, after=after, upto=upto,
                                                       checked_before=math.inf))
            assert tuple(summary) == brute_summary(states, after, upto, math.inf, ())
        # Written again by this code: the same pages, their new versions.
        for key in keys[1::2]:
            store.stage_page(full_state(key, 3, callback="parse", next_visit=9_000))
        await call(store.flush())
        got = await call(store.get_pages(keys))
        assert sum(1 for s in got.values() if s.etag == 'W/"etag-3"') == len(keys[1::2])
        states = list(store.iter_pages(SCOPE))
        assert await whole_summary(store, SCOPE) == whole_brute_summary(states)
        assert f"{prefix}:hd:{host_tag(SCOPE, 'h0.example')}".encode() in (
            redis_cluster.keys(f"{prefix}:hd:*"))
    finally:
        await call(store.close())


def lose_host_script_replies(store: RedisStateStore, lost: set[int]) -> list[int]:
    """The replies of the group scripts *store* sends lost (a connection
    error once the scripts ran) for the calls numbered in *lost* (from 1);
    the number of scripts of each call, as they go."""
    original = store._eval_many
    host_scripts: list[int] = []

    async def losing(calls: list[tuple[str, list[str], list[Any]]],
                     plain: Any = ()) -> list[Any]:
        replies = await original(calls, plain)
        if any(script == CLUSTER_HOST_LUA for script, _, _ in calls):
            host_scripts.append(len(calls))
            if len(host_scripts) in lost:
                raise redis.exceptions.ConnectionError("the reply was lost")
        return replies

    store._eval_many = losing  # type: ignore[method-assign]
    return host_scripts


def two_hosts_of_one_group() -> tuple[str, str]:
    first = "a.example"
    for n in range(1_000):
        other = f"b{n}.example"
        if host_group(other) == host_group(first):
            return first, other
    raise AssertionError("no two hosts of one group in 1,000 tries")


@pytest_twisted.ensureDeferred
async def test_a_group_script_whose_reply_was_lost_is_replayed_with_the_writes_it_ran(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A group's script ran but its reply was lost; a page of its first
    host is staged before the flush that sends it again. The replay
    (same token) counts the writes it ran, in staging order: the new page
    is written after it, not taken as applied, and nothing is applied
    twice (the sums are the pages')."""
    a_host, b_host = two_hosts_of_one_group()
    a1, b1, a2 = (PageKey(SCOPE, f"https://{a_host}/1"), PageKey(SCOPE, f"https://{b_host}/1"),
                  PageKey(SCOPE, f"https://{a_host}/2"))
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    host_scripts = lose_host_script_replies(store, {1})
    try:
        store.stage_page(full_state(a1, 1, callback="parse", next_visit=1_000))
        store.stage_page(full_state(b1, 1, callback="parse", next_visit=1_001))
        with pytest.raises(StateStoreError):
            await call(store.flush())
        assert host_scripts == [1]  # the group's one script, its reply lost
        store.stage_page(full_state(a2, 1, callback="parse", next_visit=1_002))
        await call(store.flush())
        assert store.pending == 0
        got = await call(store.get_pages([a1, b1, a2]))
        assert sorted(k.url for k in got) == sorted(k.url for k in (a1, b1, a2))
        states = list(store.iter_pages(SCOPE))
        assert len(states) == 3
        assert await whole_summary(store, SCOPE) == whole_brute_summary(states)
    finally:
        await call(store.close())


#: A crawl by the code of LAYOUT_6_COMMIT (its ListSpider, its add-on) of
#: the URLs given, on the store given.
_OLD_CRAWL = textwrap.dedent("""
    import json, sys
    from scrapy.crawler import CrawlerProcess
    from incremental_crawler.state.stores.redis.layout import CLUSTER_LAYOUT_VERSION
    from tests.spiders import ListSpider
    assert CLUSTER_LAYOUT_VERSION == 6
    uri, urls = sys.argv[1], json.loads(sys.argv[2])
    process = CrawlerProcess({
        "ADDONS": {"incremental_crawler.addon.IncrementalAddon": 0},
        "INCREMENTAL_STATE_URI": uri, "INCREMENTAL_STATE_ON_REDIS_CLUSTER": True,
        "ROBOTSTXT_OBEY": True, "LOG_LEVEL": "INFO", "LOGSTATS_INTERVAL": 0,
        "TELNETCONSOLE_ENABLED": False, "CONCURRENT_REQUESTS": 8,
        "INCREMENTAL_REVISIT_ENABLED": False, "INCREMENTAL_THROTTLE_ENABLED": False})
    process.crawl(ListSpider, urls=urls)
    process.start()
""")


def seen(site: Any) -> list[tuple[str, str | None, str | None, int]]:
    """What the site was asked for its pages: path, conditions, answer."""
    return sorted((r.path, r.if_none_match, r.if_modified_since, r.status)
                  for r in site.log if r.path.startswith("/p/"))


@pytest_twisted.ensureDeferred
async def test_a_layout_6_store_crawled_again_after_its_migration_asks_the_same(
    redis_cluster: LoopbackCluster, prefix: str, layout_6: Path, site: Any,
) -> None:
    """Two real crawls of the loopback site by layout 6's code (a worker of
    its own process), then one by this code after the migration: the site
    is asked the same (the same conditional headers for every page, the
    same answers) by this code's crawl as by the old code's second."""
    tree = layout_6
    uri = f"{redis_cluster.url}?prefix={prefix}"
    paths = site.add_pages(8, kinds=PLAIN_KINDS, size=2000)
    urls = [site.url(path) for path in paths]

    def old_crawl() -> None:
        subprocess.run([sys.executable, "-c", _OLD_CRAWL, uri, json.dumps(urls)],
                       cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True,
                       capture_output=True, text=True, timeout=300)

    await deferToThread(old_crawl)
    site.reset_log()
    await deferToThread(old_crawl)
    asked_by_old = seen(site)
    assert [path for path, *_ in asked_by_old] == sorted(paths)
    assert old_keys(redis_cluster, prefix)

    site.reset_log()
    runner = CrawlerRunner(crawl_settings(uri, INCREMENTAL_STATE_ON_REDIS_CLUSTER=True))
    await runner.crawl(ListSpider, urls=urls)
    asked_by_new = seen(site)
    assert asked_by_new == asked_by_old
    # Conditional where the site gives validators (most unchanged: 304s).
    assert any(status == 304 for *_, status in asked_by_new)
    assert old_keys(redis_cluster, prefix) == []
    with redis_cluster.client() as client:
        assert client.hget(f"{prefix}:meta", "version") == str(CLUSTER_LAYOUT_VERSION).encode()


def beside_a_damaged_host(redis_cluster: LoopbackCluster, prefix: str, store: RedisStateStore,
                          *, damaged_first: bool) -> tuple[list[PageKey], str]:
    """Two hosts of one group, the second's links hash damaged (a string);
    a page of the healthy host staged on either side of the damaged host's
    one (*damaged_first*: the damaged host's first, then both healthy
    ones). The pages in staging order, and the damaged key."""
    a_host, b_host = two_hosts_of_one_group()
    a1, b1, a2 = (PageKey(SCOPE, f"https://{a_host}/1"), PageKey(SCOPE, f"https://{b_host}/1"),
                  PageKey(SCOPE, f"https://{a_host}/2"))
    links = f"{prefix}:ln:{host_tag(SCOPE, b_host)}"
    with redis_cluster.client() as client:
        assert client.set(links, "damaged")
    keys = [b1, a1, a2] if damaged_first else [a1, b1, a2]
    for n, key in enumerate(keys):
        store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
    return keys, links


async def repaired_each_written_once(redis_cluster: LoopbackCluster, links: str,
                                     store: RedisStateStore, reader: RedisStateStore,
                                     keys: list[PageKey]) -> None:
    """The damaged key deleted, the next flush writes what is left: every
    page once (the damaged host's not lost, none applied twice: the sums
    are the pages')."""
    with redis_cluster.client() as client:
        client.delete(links)
    # (A write not applied stays staged: sent again.)
    await call(store.flush())
    assert store.pending == 0
    got = await call(reader.get_pages(keys))
    assert {k.url: s.checks for k, s in got.items()} == {k.url: 1 for k in keys}
    states = list(reader.iter_pages(SCOPE))
    assert len(states) == 3
    assert await whole_summary(reader, SCOPE) == whole_brute_summary(states)


@pytest_twisted.ensureDeferred
async def test_a_damaged_host_costs_the_healthy_hosts_of_its_group_none_of_their_writes(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """The group's script stops at the damaged host's first write, and the
    first host's writes staged after it are sent again without the damaged
    host's (as a script a host did, layout 6): both of the healthy host's
    pages are stored, none of the damaged host's; the flush says the error.
    Repaired, the next flush writes the rest, each once."""
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    reader = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        keys, links = beside_a_damaged_host(redis_cluster, prefix, store, damaged_first=False)
        a1, _, a2 = keys
        with pytest.raises(StateStoreError, match="WRONGTYPE"):
            await call(store.flush())
        got = await call(reader.get_pages(keys))
        assert sorted(k.url for k in got) == sorted(k.url for k in (a1, a2))
        assert store.pending == 1
        await repaired_each_written_once(redis_cluster, links, store, reader, keys)
    finally:
        await call(store.close())
        await call(reader.close())


@pytest.mark.parametrize("damaged", ["pg", "pgl"])
@pytest_twisted.ensureDeferred
async def test_a_damaged_page_bucket_refuses_its_hosts_writes_whole(
    redis_cluster: LoopbackCluster, prefix: str, damaged: str,
) -> None:
    """Two hosts of one group, the second's bucket hash of small pages (pg)
    or of large ones (pgl) not a hash: the group's script reads a page's
    record while it checks its keys, the read saying a damaged key by its
    error; none of the damaged host's writes is applied, all of the
    healthy host's are, counted once (its record's page count); repaired,
    the next flush writes the rest, each once."""
    a_host, b_host = two_hosts_of_one_group()
    a1, b1, a2 = (PageKey(SCOPE, f"https://{a_host}/1"), PageKey(SCOPE, f"https://{b_host}/1"),
                  PageKey(SCOPE, f"https://{a_host}/2"))
    head = host_tag(SCOPE, b_host)
    key = f"{prefix}:{damaged}:{head}:0"
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    reader = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        with redis_cluster.client() as client:
            assert client.set(key, "damaged")
        for n, page in enumerate((a1, b1, a2)):
            store.stage_page(full_state(page, 1, callback="parse", next_visit=1_000 + n))
        with pytest.raises(StateStoreError, match=f"WRONGTYPE {re.escape(key)} is a string"):
            await call(store.flush())
        # (The damaged host's pages cannot be read until repaired.)
        got = await call(reader.get_pages([a1, a2]))
        assert sorted(k.url for k in got) == sorted(k.url for k in (a1, a2))
        assert store.pending == 1
        with redis_cluster.client() as client:
            assert client.get(key) == b"damaged"
            assert client.hget(f"{prefix}:hd:{host_tag(SCOPE, a_host)}", "p") == b"2"
            client.delete(key)
        await call(store.flush())
        assert store.pending == 0
        got = await call(reader.get_pages([a1, b1, a2]))
        assert {k.url: s.checks for k, s in got.items()} == {k.url: 1 for k in (a1, b1, a2)}
        with redis_cluster.client() as client:
            assert client.hget(f"{prefix}:hd:{head}", "p") == b"1"
        states = list(reader.iter_pages(SCOPE))
        assert len(states) == 3
        assert await whole_summary(reader, SCOPE) == whole_brute_summary(states)
    finally:
        await call(store.close())
        await call(reader.close())


@pytest_twisted.ensureDeferred
async def test_a_page_whose_record_shrinks_moves_from_the_large_pages_hash(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """A page stored large (pgl: its record longer than a listpack entry),
    then written short: its first write of a group script reads where it
    is, and the short record goes in pg with the large one deleted (the
    delete skipped only where the read found it in neither): one page,
    counted once."""
    page = PageKey(SCOPE, "https://a.example/1")
    bucket = f"{host_tag(SCOPE, 'a.example')}:0"
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        store.stage_page(full_state(page, 1, callback="parse", next_visit=1_000))
        await call(store.flush())
        with redis_cluster.client() as client:
            assert client.hlen(f"{prefix}:pgl:{bucket}") == 1
            assert not client.exists(f"{prefix}:pg:{bucket}")
        store.stage_page(PageState(page, checks=2))
        await call(store.flush())
        with redis_cluster.client() as client:
            assert client.hlen(f"{prefix}:pg:{bucket}") == 1
            assert not client.exists(f"{prefix}:pgl:{bucket}")
            assert client.hget(f"{prefix}:hd:{host_tag(SCOPE, 'a.example')}", "p") == b"1"
        assert [s.checks for s in store.iter_pages(SCOPE)] == [2]
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_the_healthy_hosts_writes_sent_again_whose_reply_is_lost_apply_once(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """As above (the damaged host's page staged first), but the reply to
    the script that sends the healthy host's writes again (without the
    damaged host's) is lost: the next flush, the key repaired, finds that
    script's writes again among the group's (the damaged host's first in
    staging order, left out): the healthy host's writes are applied once
    (its sums counted once), the damaged host's written then."""
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    reader = RedisStateStore(redis_cluster.url, prefix=prefix)
    original = store._eval_many
    try:
        keys, links = beside_a_damaged_host(redis_cluster, prefix, store, damaged_first=True)
        _, a1, a2 = keys
        host_scripts = lose_host_script_replies(store, {2})
        with pytest.raises(StateStoreError):
            await call(store.flush())
        store._eval_many = original  # type: ignore[method-assign]
        assert host_scripts == [1, 1]
        # The healthy host's writes were applied (the reply lost, not the script).
        got = await call(reader.get_pages(keys))
        assert sorted(k.url for k in got) == sorted(k.url for k in (a1, a2))
        await repaired_each_written_once(redis_cluster, links, store, reader, keys)
    finally:
        await call(store.close())
        await call(reader.close())


@pytest_twisted.ensureDeferred
async def test_the_resent_writes_reply_lost_twice_keeps_the_damaged_host_apart(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """As above, but the reply of that script's replay (the next flush) is
    lost again: the flush after (the key repaired) must still leave the
    damaged host's write out of that token's writes. Otherwise the replay
    counts the damaged host's write as its own (never written, it is no
    longer staged: lost) and the healthy host's last write goes out again
    under a new token."""
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    reader = RedisStateStore(redis_cluster.url, prefix=prefix)
    original = store._eval_many
    try:
        keys, links = beside_a_damaged_host(redis_cluster, prefix, store, damaged_first=True)
        # The resend's reply (flush 1), then its replay's (flush 2).
        host_scripts = lose_host_script_replies(store, {2, 3})
        with pytest.raises(StateStoreError):
            await call(store.flush())
        with pytest.raises(StateStoreError):
            await call(store.flush())
        store._eval_many = original  # type: ignore[method-assign]
        assert host_scripts == [1, 1, 1]
        await repaired_each_written_once(redis_cluster, links, store, reader, keys)
    finally:
        await call(store.close())
        await call(reader.close())


@pytest_twisted.ensureDeferred
async def test_eight_damaged_hosts_of_a_group_cost_a_healthy_host_of_it_nothing(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """Nine hosts of one group, the first eight's links hashes damaged, the
    healthy one's page staged last: each damaged host sets its writes
    apart in a round of its own, so the healthy page is still written in
    this flush (as layout 6, a script a host, wrote it), the damaged
    hosts' pages not written and still staged, written once repaired."""
    group = host_group("a.example")
    hosts = [h for h in (f"h{n}.example" for n in range(20_000))
             if host_group(h) == group][:9]
    assert len(hosts) == 9
    damaged, healthy = hosts[:8], hosts[8]
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    reader = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        with redis_cluster.client() as client:
            for host in damaged:
                assert client.set(f"{prefix}:ln:{host_tag(SCOPE, host)}", "damaged")
        keys = [PageKey(SCOPE, f"https://{host}/1") for host in hosts]
        for n, key in enumerate(keys):
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        with pytest.raises(StateStoreError, match="WRONGTYPE"):
            await call(store.flush())
        got = await call(reader.get_pages(keys))
        assert [k.url for k in got] == [f"https://{healthy}/1"]
        assert store.pending == len(damaged)
        # Repaired, the next flush writes them.
        with redis_cluster.client() as client:
            for host in damaged:
                client.delete(f"{prefix}:ln:{host_tag(SCOPE, host)}")
        await call(store.flush())
        got = await call(reader.get_pages(keys))
        assert {k.url: s.checks for k, s in got.items()} == {k.url: 1 for k in keys}
    finally:
        await call(store.close())
        await call(reader.close())


@pytest_twisted.ensureDeferred
async def test_a_layout_7_migration_cut_short_is_resumed_counting_no_page_twice(
    redis_cluster: LoopbackCluster, prefix: str, layout_7: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store written by layout 7's code (main's), a worker of which died
    between its phases 2 and 3 (its effects in the groups' ledgers), whose
    migration to layout 8 stops midway through recounting the groups (its
    connection lost at the third group, two built): the version raised,
    ``upgrading`` 7; the next process to open the store resumes: every
    group's sums the pages' (none counted twice, the dead worker's pages
    counted once), every page there, no key of the old shards, no ledger
    or intent left; then written and read as any store of layout 8."""
    out = subprocess.run(
        [sys.executable, "-c", _WRITER, redis_cluster.url, prefix, SCOPE, "12", "7"],
        cwd=layout_7, env={**os.environ, "PYTHONPATH": str(layout_7)}, check=True,
        capture_output=True, text=True, timeout=300)
    worker_gone_for(redis_cluster, prefix)
    urls = json.loads(out.stdout.strip().splitlines()[-1])
    with redis_cluster.client() as client:
        assert any(client.hlen(key) for key in redis_cluster.keys(f"{prefix}:fx:*"))
    original = RedisStateStore._write_group_sums
    written: list[str] = []

    def cut_third(self: RedisStateStore, tag: str, *args: Any) -> None:
        if len(written) == 2:
            raise redis.exceptions.ConnectionError("the third group's node is unreachable")
        written.append(tag)
        original(self, tag, *args)

    with monkeypatch.context() as patched:
        patched.setattr(RedisStateStore, "_write_group_sums", cut_third)
        with pytest.raises(StateStoreError, match="migrating the layout failed"):
            RedisStateStore(redis_cluster.url, prefix=prefix)
    with redis_cluster.client() as client:
        meta = client.hgetall(f"{prefix}:meta")
        assert meta[b"version"] == str(CLUSTER_LAYOUT_VERSION).encode()
        assert meta[b"upgrading"] == b"7"
        assert all(client.hexists(f"{prefix}:nvm:{tag}", "regrouped") for tag in written)

    batches = RedisStateStore._regroup_batch
    read: list[str] = []

    def reading(self: RedisStateStore, tag: str, *args: Any) -> Any:
        read.append(tag)
        return batches(self, tag, *args)

    with monkeypatch.context() as patched:
        patched.setattr(RedisStateStore, "_regroup_batch", reading)
        store = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        # The groups built before the cut are not read again.
        assert read and not set(read) & set(written)
        with redis_cluster.client() as client:
            assert b"upgrading" not in client.hgetall(f"{prefix}:meta")
        assert left_of_layout_7(redis_cluster, prefix) == []
        keys = [PageKey(SCOPE, url) for url in urls]
        got = await call(store.get_pages(keys))
        rewritten = set(keys[::2])
        assert {k: s.checks for k, s in got.items()} == {
            k: (2 if k in rewritten else 1) for k in keys}
        states = list(store.iter_pages(SCOPE))
        assert len(states) == len(keys)
        for after, upto in ((-math.inf, math.inf), (0, 4_000), (4_000, math.inf)):
            summary = await call(store.summarize_pages(SCOPE, after=after, upto=upto,
                                                       checked_before=math.inf))
            assert tuple(summary) == brute_summary(states, after, upto, math.inf, ())
        # Due as the pages say (the revisit index recounted by group).
        due = await call(store.get_due(SCOPE, now=4_000, limit=1_000))
        assert sorted(s.key.url for s in due) == sorted(
            s.key.url for s in states if s.next_visit <= 4_000)
        assert sorted(store._scope_hosts(SCOPE)) == sorted(
            {s.key.url.split("/")[2] for s in states})
        for key in keys[1::2]:
            store.stage_page(full_state(key, 3, callback="parse", next_visit=9_000))
        await call(store.flush())
        states = list(store.iter_pages(SCOPE))
        assert await whole_summary(store, SCOPE) == whole_brute_summary(states)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_group_whose_hosts_counts_are_stale_is_planned_again_host_by_host(
    redis_cluster: LoopbackCluster, prefix: str,
) -> None:
    """Two hosts of one group, both split by a first flush; the second
    flush planned from counts read before those splits (one bucket each):
    the group's script writes nothing and says each host's count, both
    are planned again, and every page is written once."""
    hosts = two_hosts_of_one_group()
    keys = {host: [PageKey(SCOPE, f"https://{host}/p{n}") for n in range(150)]
            for host in hosts}
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        for host in hosts:
            for key in keys[host][:100]:
                store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000))
        await call(store.flush())
        with redis_cluster.client() as client:
            for host in hosts:
                assert int(client.hget(f"{prefix}:hd:{host_tag(SCOPE, host)}", "n")) > 1
        stale: list[int] = []
        part_counts = store._part_counts

        async def stale_parts(parts: Any, *before: Any) -> Any:
            counts, said = await part_counts(parts, *before)
            if not stale:
                stale.append(1)
                return dict.fromkeys(counts, (1, 0)), said
            return counts, said

        store._part_counts = stale_parts  # type: ignore[method-assign]
        sent: list[Any] = []
        original = store._eval_many

        async def eval_many(calls: list[tuple[str, list[str], list[Any]]],
                            plain: Any = ()) -> list[Any]:
            replies = await original(calls, plain)
            sent.extend(reply for (script, _, _), reply in zip(calls, replies, strict=False)
                        if script == CLUSTER_HOST_LUA)
            return replies

        store._eval_many = eval_many  # type: ignore[method-assign]
        for host in hosts:
            for key in keys[host][100:]:
                store.stage_page(full_state(key, 2, callback="parse", next_visit=2_000))
        assert await call(store.flush()) == 100
        assert stale == [1]
        # The first answer named both hosts' counts; the second wrote.
        assert sent[0][0] == b"n"
        assert sorted(sent[0][1::2]) == sorted(host.encode() for host in hosts)
        assert int(sent[1][0]) == 100
        every = [key for host in hosts for key in keys[host]]
        found = await call(store.get_pages(every))
        assert {k: s.checks for k, s in found.items()} == {
            k: 1 if k in keys[k.url.split("/")[2]][:100] else 2 for k in every}
        assert store.count_pages(SCOPE) == 300
        states = list(store.iter_pages(SCOPE))
        assert await whole_summary(store, SCOPE) == whole_brute_summary(states)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_layout_7_store_with_a_damaged_scope_shard_is_migrated_not_locked_out(
    redis_cluster: LoopbackCluster, prefix: str, layout_7: Path,
) -> None:
    """A layout-7 store with a dead worker's effects pending and a damaged
    key in every one of its scope's eight shards (the hosts set a string):
    the migration reads none of the shards' keys but their meta's mark of
    the run (type-checked before the version is raised; their hosts, sums
    and index are recounted from the pages), so the store opens at layout 8
    (not left at a version neither code opens), the damaged keys gone
    with the old shards, the scope's hosts and sums the pages'."""
    subprocess.run(
        [sys.executable, "-c", _WRITER, redis_cluster.url, prefix, SCOPE, "6", "7"],
        cwd=layout_7, env={**os.environ, "PYTHONPATH": str(layout_7)}, check=True,
        capture_output=True, text=True, timeout=300)
    worker_gone_for(redis_cluster, prefix)
    with redis_cluster.client() as client:
        assert client.keys(f"{prefix}:fx:*")  # the dead worker's ledgers
        for shard in OLD_SCOPE_SHARDS:
            hosts = f"{prefix}:hs:{{{SCOPE}^{shard}}}"
            client.delete(hosts)
            client.set(hosts, "damaged")
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        with redis_cluster.client() as client:
            meta = client.hgetall(f"{prefix}:meta")
        assert meta[b"version"] == str(CLUSTER_LAYOUT_VERSION).encode()
        assert b"upgrading" not in meta
        assert left_of_layout_7(redis_cluster, prefix) == []
        states = list(store.iter_pages(SCOPE))
        assert sorted(store._scope_hosts(SCOPE)) == [f"h{h}.example" for h in range(6)]
        assert await whole_summary(store, SCOPE) == whole_brute_summary(states)
    finally:
        await call(store.close())


#: What a script run by layout 7's code (in its tree, from git) starts
#: with: its imports, the store's URL, prefix and scope from its arguments,
#: and a check that the code is layout 7's.
_LAYOUT_7_HEAD = textwrap.dedent("""
    import asyncio, json, sys
    from incremental_crawler.state.records import PageKey
    from incremental_crawler.state.stores.redis import RedisStateStore
    from incremental_crawler.state.stores.redis.layout import CLUSTER_LAYOUT_VERSION
    from tests.test_store_contract import full_state
    url, prefix, scope = sys.argv[1], sys.argv[2], sys.argv[3]
    assert CLUSTER_LAYOUT_VERSION == 7
""")


#: Run by layout 7's code: the first flush of a scope nobody wrote before,
#: whose worker dies between its phases 2 and 3 (its pages and ledger
#: entries stored, its intents written; P:scopes is added in phase 3).
_FIRST_FLUSH_DIES = _LAYOUT_7_HEAD + textwrap.dedent("""

    async def main():
        keys = [PageKey(scope, f"https://h{h}.example/p{n}") for h in range(6) for n in range(3)]
        dying = RedisStateStore(url, prefix=prefix)
        async def cut(*args, **kwargs):
            raise ConnectionError("the shards' nodes are unreachable")
        dying._phase_scopes = cut
        for n, key in enumerate(keys):
            dying.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        try:
            await dying.flush()
        except ConnectionError:
            pass
        else:
            raise AssertionError("phase 3 ran")
        print(json.dumps([key.url for key in keys]))

    asyncio.run(main())
""")


@pytest_twisted.ensureDeferred
async def test_a_dead_workers_first_flush_of_a_new_scope_survives_the_migration(
    redis_cluster: LoopbackCluster, prefix: str, layout_7: Path,
) -> None:
    """Layout 7: a worker's first flush of a new scope dies between its
    phases 2 and 3: pages stored, effects in the groups' ledgers listed by
    its intents, the scope not in P:scopes yet (phase 3 adds it). The
    migration recounts every scope whose hosts it finds (not only the
    listed ones): the scope's 18 pages are read after it, its hosts
    listed, and its sums are its pages'."""
    fresh = "fresh"
    tree = layout_7
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_FLUSH_DIES, redis_cluster.url, prefix, fresh],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True,
        capture_output=True, text=True, timeout=300)
    worker_gone_for(redis_cluster, prefix)
    urls = json.loads(out.stdout.strip().splitlines()[-1])
    with redis_cluster.client() as client:
        assert not client.sismember(f"{prefix}:scopes", fresh)
        assert client.keys(f"{prefix}:fx:*")
    store = RedisStateStore(redis_cluster.url, prefix=prefix)  # migrates
    try:
        assert left_of_layout_7(redis_cluster, prefix) == []
        assert sorted(store._scope_hosts(fresh)) == [f"h{h}.example" for h in range(6)]
        states = list(store.iter_pages(fresh))
        assert sorted(s.key.url for s in states) == sorted(urls)
        assert await whole_summary(store, fresh) == whole_brute_summary(states)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_migration_is_refused_while_a_worker_of_layout_7_may_be_running(
    redis_cluster: LoopbackCluster, prefix: str, layout_7: Path,
) -> None:
    """A layout-7 store (main's code) whose worker's flush left an intent
    young enough that its phase 2 may still write, then one with a live
    hold of its scope (a crawl's): each open refuses the migration in one
    line that says why and what to do, the store left as it was (version
    7, no key changed: the old code still opens it). With neither, it is
    migrated."""
    tree = layout_7
    subprocess.run(
        [sys.executable, "-c", _WRITER, redis_cluster.url, prefix, SCOPE, "4", "7"],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True,
        capture_output=True, text=True, timeout=300)
    before = left_of_layout_7(redis_cluster, prefix)
    with pytest.raises(StateStoreError,
                       match=r"migration refused: a flush's intent .*fxhosts") as said:
        RedisStateStore(redis_cluster.url, prefix=prefix)
    wait = re.search(r"wait (\d+) s", str(said.value))
    assert wait is not None and 0 < int(wait.group(1)) <= _LIVE_INTENT, said.value
    worker_gone_for(redis_cluster, prefix)
    holds = f"{prefix}:holds:{{{SCOPE}}}"
    with redis_cluster.client() as client:
        # (A hold of a flush interval over 100 s lapses later than the
        # intents' 300 s: the line gives the hold's lapse.)
        lapses = float(client.time()[0]) + 1_000
        client.zadd(holds, {f"{prefix}:worker-of-layout-7": lapses})
    with pytest.raises(StateStoreError,
                       match=r"migration refused: a live hold .*layout 7 running; stop every"
                       ) as said:
        RedisStateStore(redis_cluster.url, prefix=prefix)
    assert "\n" not in str(said.value)
    wait = re.search(r"wait (\d+) s", str(said.value))
    assert wait is not None and _LIVE_INTENT < int(wait.group(1)) <= 1_000, said.value
    with redis_cluster.client() as client:
        meta = client.hgetall(f"{prefix}:meta")
        assert meta[b"version"] == b"7" and b"upgrading" not in meta
        assert not client.exists(f"{prefix}:migrating")
        assert not client.keys(f"{prefix}:nvm:{{{SCOPE}|=*")  # no group built
        client.delete(holds)
    assert left_of_layout_7(redis_cluster, prefix) == before
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        assert left_of_layout_7(redis_cluster, prefix) == []
        with redis_cluster.client() as client:
            assert client.hget(f"{prefix}:meta", "version") == (
                str(CLUSTER_LAYOUT_VERSION).encode())
    finally:
        await call(store.close())


#: Opens the store with the code of layout 6 (run in its tree): exits 0
#: when that code opens it.
_OLD_OPEN = textwrap.dedent("""
    import sys
    from incremental_crawler.state.stores.redis import RedisStateStore
    store = RedisStateStore(sys.argv[1], prefix=sys.argv[2])
    store._sync.close()
""")


def test_a_damaged_key_the_migration_reads_refuses_it_before_the_version_is_raised(
    redis_cluster: LoopbackCluster, prefix: str, layout_6: Path,
) -> None:
    """A layout-6 store (its dead worker gone long enough) with one key the
    migration reads by its kind set to a string, in turn: a host's ledger
    (``P:fx:{s|h}``), a shard's held tokens (``P:fxheld``), a shard's
    intents (``P:fxhosts``) and a scope's holds (``P:holds``). Each open
    refuses in one line naming that key, the store left at version 6
    (the old code still opens it: not a version raised with ``upgrading``
    left, which neither code opens); the key deleted, the next kind is
    damaged (one store written for the four: writing it is the cost);
    all four deleted, it is migrated."""
    tree = layout_6
    subprocess.run(
        [sys.executable, "-c", _WRITER, redis_cluster.url, prefix, SCOPE, "4", "6"],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True,
        capture_output=True, text=True, timeout=300)
    worker_gone_for(redis_cluster, prefix)
    for key in (f"{prefix}:fx:{{{SCOPE}|h99.example}}",
                f"{prefix}:fxheld:{{{old_shard_part(SCOPE, 0)}}}",
                f"{prefix}:fxhosts:{{{old_shard_part(SCOPE, 0)}}}",
                f"{prefix}:holds:{{{SCOPE}}}"):
        with redis_cluster.client() as client:
            client.delete(key)
            assert client.set(key, "damaged")
        before = sorted(old_keys(redis_cluster, prefix))
        for _ in range(2):
            with pytest.raises(StateStoreError, match="migration refused: ") as said:
                RedisStateStore(redis_cluster.url, prefix=prefix)
            assert f"{key} " in str(said.value) and "is a string, not a " in str(said.value)
            assert "\n" not in str(said.value)
        with redis_cluster.client() as client:
            meta = client.hgetall(f"{prefix}:meta")
            assert meta[b"version"] == b"6" and b"upgrading" not in meta, (key, meta)
        assert sorted(old_keys(redis_cluster, prefix)) == before
        subprocess.run([sys.executable, "-c", _OLD_OPEN, redis_cluster.url, prefix],
                       cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True,
                       capture_output=True, text=True, timeout=120)
        with redis_cluster.client() as client:
            client.delete(key)
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        assert old_keys(redis_cluster, prefix) == []
        with redis_cluster.client() as client:
            meta = client.hgetall(f"{prefix}:meta")
        assert meta[b"version"] == str(CLUSTER_LAYOUT_VERSION).encode()
        assert b"upgrading" not in meta
    finally:
        store._sync.close()


@pytest_twisted.ensureDeferred
async def test_a_migration_cut_inside_a_later_batch_is_resumed_whole(
    redis_cluster: LoopbackCluster, prefix: str, tmp_path: Path, layout_6: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batches of 3 keys (the suite's stores hold fewer than a batch of
    2,000: this runs the walk past its first batch): the second batch is
    cut after its keys were copied (and its ledgers' entries merged) but
    before the old ones were deleted. The next open resumes: no host key
    left under a host's tag, every page read as written, the sums the
    pages'."""
    tree = layout_6
    out = subprocess.run(
        [sys.executable, "-c", _WRITER, redis_cluster.url, prefix, SCOPE, "8", "6"],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True,
        capture_output=True, text=True, timeout=300)
    worker_gone_for(redis_cluster, prefix)
    urls = json.loads(out.stdout.strip().splitlines()[-1])
    original = RedisStateStore._move_batch
    batches: list[int] = []

    def cut_second(self: RedisStateStore, moves: list[tuple[str, str]],
                   ledgers: dict[str, str], lock: str, token: str) -> int:
        batches.append(len(moves) + len(ledgers))
        if len(batches) != 2:
            return original(self, moves, ledgers, lock, token)
        with redis_cluster.client() as client:
            for old, new in moves:
                data = client.dump(old)
                if data is not None:
                    client.restore(new, 0, data, replace=True)
            for old, new in ledgers.items():
                part = old[old.index("{") + 1:old.index("}")].rpartition("|")[2]
                entries = client.hgetall(old)
                if entries:
                    client.hset(new, mapping={k: _entry_of_host(v, part)
                                              for k, v in entries.items()})
        raise redis.exceptions.ConnectionError("cut between the copies and the deletes")

    with monkeypatch.context() as patched:
        patched.setattr(layout, "_MIGRATION_BATCH", 3)
        patched.setattr(RedisStateStore, "_move_batch", cut_second)
        with pytest.raises(StateStoreError):
            RedisStateStore(redis_cluster.url, prefix=prefix)
        assert len(batches) == 2
        patched.setattr(RedisStateStore, "_move_batch", original)
        store = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        assert old_keys(redis_cluster, prefix) == []
        keys = [PageKey(SCOPE, url) for url in urls]
        got = await call(store.get_pages(keys))
        rewritten = set(keys[::2])
        assert {k: s.checks for k, s in got.items()} == {
            k: (2 if k in rewritten else 1) for k in keys}
        states = list(store.iter_pages(SCOPE))
        assert len(states) == len(keys)
        assert await whole_summary(store, SCOPE) == whole_brute_summary(states)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_large_hosts_buckets_are_recounted_over_several_scripts(
    redis_cluster: LoopbackCluster, prefix: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The recount reads at most _REGROUP_BUCKETS buckets a script (2
    here), a large host's over several: a host of 200 pages (5 buckets or
    more) and a small one, their shard keys dropped and the store marked
    as of layout 7 (a host's keys are named the same in 7 and 8), opened:
    the host read over three scripts or more (its group's progress logged
    every 2 scripts, the interval lowered too), its hosts listed, its pages
    due and summed as they are, the checks since the mark kept."""
    big = [PageKey(SCOPE, f"https://big.example/p{n}") for n in range(200)]
    small = [PageKey(SCOPE, "https://small.example/p")]
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    for n, key in enumerate([*big, *small]):
        store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + 7 * n))
    await call(store.flush())
    await call(store.close())
    with redis_cluster.client() as client:
        for kind in ("dueb", "hs", "nvs", "nvm", "ck", "splits", "duer", "nvf"):
            for key in redis_cluster.keys(f"{prefix}:{kind}:*"):
                client.delete(key)
        client.hset(f"{prefix}:meta", "version", 7)
    scripts: list[int] = []
    batches = RedisStateStore._regroup_batch

    def counted(self: RedisStateStore, tag: str, mark: Any, batch: Any, sums: Any) -> Any:
        scripts.append(sum(n for _, _, n in batch))
        return batches(self, tag, mark, batch, sums)

    with monkeypatch.context() as patched, caplog.at_level(logging.INFO):
        patched.setattr(layout, "_REGROUP_BUCKETS", 2)
        patched.setattr(layout, "_REGROUP_PROGRESS", 2)
        patched.setattr(RedisStateStore, "_regroup_batch", counted)
        store = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        assert len(scripts) >= 4 and max(scripts) <= 2
        # The big host's group says its progress every 2 scripts.
        big_tag = host_tag(SCOPE, "big.example").partition(":")[0]
        progress = [r.getMessage() for r in caplog.records
                    if f"host group {big_tag}: " in r.getMessage()]
        assert progress and "pages recounted so far" in progress[0], progress
        assert sorted(store._scope_hosts(SCOPE)) == ["big.example", "small.example"]
        states = list(store.iter_pages(SCOPE))
        assert len(states) == 201
        assert await whole_summary(store, SCOPE) == whole_brute_summary(states)
        due = await call(store.get_due(SCOPE, now=1_700, limit=1_000))
        assert sorted(s.key.url for s in due) == sorted(
            s.key.url for s in states if s.next_visit <= 1_700)
    finally:
        await call(store.close())


@pytest_twisted.ensureDeferred
async def test_a_damaged_key_or_record_the_layout_7_migration_reads_is_named_never_unnamed(
    redis_cluster: LoopbackCluster, prefix: str, layout_7: Path,
) -> None:
    """A layout-7 store (its dead worker gone long enough), the keys the
    recount reads set to a string in turn: a bucket of pages, a host's record,
    the old shard's meta (its mark is read) and a host group's hosts set
    (written by the recount). Each open refuses in one line naming that
    key, the store left at version 7 (the old code still opens it); the
    key put back. The same for a host's bucket count that is not a whole
    number >= 1 and the old shard's mark not a whole number of seconds
    (values no type check sees). Then a page record of garbage bytes,
    which only the recount finds: each open stops naming the key (and
    field) and the remedy,
    the version raised (``upgrading`` 7), and once that field is deleted
    the next open resumes: migrated, its summaries those of the pages
    left."""
    subprocess.run(
        [sys.executable, "-c", _WRITER, redis_cluster.url, prefix, SCOPE, "4", "7"],
        cwd=layout_7, env={**os.environ, "PYTHONPATH": str(layout_7)}, check=True,
        capture_output=True, text=True, timeout=300)
    worker_gone_for(redis_cluster, prefix)
    tag = host_tag(SCOPE, "h1.example")
    # (Its pages' bucket: a page written with its links is in pgl.)
    buckets = sorted(raw.decode() for raw in redis_cluster.keys(f"{prefix}:pg*:{tag}:*"))
    group = host_group("h1.example")
    damaged = (buckets[0], f"{prefix}:hd:{tag}",
               f"{prefix}:nvm:{{{old_shard_part(SCOPE, old_scope_shard(group))}}}",
               f"{prefix}:hs:{{{SCOPE}|{group}}}")
    with redis_cluster.client() as client:
        assert client.type(damaged[0]) == b"hash" and client.type(damaged[1]) == b"hash"
    for key in damaged:
        with redis_cluster.client() as client:
            kept = client.dump(key)
            client.delete(key)
            assert client.set(key, "damaged")
        for _ in range(2):
            with pytest.raises(StateStoreError, match="migration refused: ") as said:
                RedisStateStore(redis_cluster.url, prefix=prefix)
            assert f"{key} " in str(said.value) and "is a string, not a " in str(said.value)
            assert "\n" not in str(said.value)
        with redis_cluster.client() as client:
            meta = client.hgetall(f"{prefix}:meta")
            assert meta[b"version"] == b"7" and b"upgrading" not in meta, (key, meta)
            assert not client.keys(f"{prefix}:nvm:{{{SCOPE}|=*")  # no group built
        subprocess.run([sys.executable, "-c", _OLD_OPEN, redis_cluster.url, prefix],
                       cwd=layout_7, env={**os.environ, "PYTHONPATH": str(layout_7)},
                       check=True, capture_output=True, text=True, timeout=120)
        with redis_cluster.client() as client:
            client.delete(key)
            if kept is not None:
                client.restore(key, 0, kept)
    # Values the recount relies on and no type check sees: a host's bucket
    # count not a whole number >= 1 (read as 1, only its first bucket
    # would be recounted, its other pages never due or summed again) and
    # an old shard's mark of the run not a whole number of seconds (no
    # summary could read it after): refused before the version is raised,
    # named, the old code still opening the store; put back.
    for key, field, value, said_value in (
            (damaged[1], "n", "x", "not a whole number >= 1"),
            (damaged[1], "n", "0", "not a whole number >= 1"),
            (damaged[2], "mark", "soon", "not a whole number of seconds"),
            (damaged[2], "mark", "1000005.5", "not a whole number of seconds")):
        with redis_cluster.client() as client:
            kept = client.hget(key, field)
            client.hset(key, field, value)
        with pytest.raises(StateStoreError, match="migration refused: ") as said:
            RedisStateStore(redis_cluster.url, prefix=prefix)
        line = str(said.value)
        assert key in line and said_value in line and repr(value.encode()) in line, line
        assert "\n" not in line
        with redis_cluster.client() as client:
            meta = client.hgetall(f"{prefix}:meta")
            assert meta[b"version"] == b"7" and b"upgrading" not in meta, (key, meta)
            if kept is None:
                client.hdel(key, field)
            else:
                client.hset(key, field, kept)
    subprocess.run([sys.executable, "-c", _OLD_OPEN, redis_cluster.url, prefix],
                   cwd=layout_7, env={**os.environ, "PYTHONPATH": str(layout_7)},
                   check=True, capture_output=True, text=True, timeout=120)
    # A record no type check sees: garbage bytes in a bucket.
    with redis_cluster.client() as client:
        bucket = next(key for key in buckets if client.hlen(key))
        field = sorted(client.hkeys(bucket))[0]
        client.hset(bucket, field, b"\xff\xfegarbage")
    for _ in range(2):
        with pytest.raises(StateStoreError, match="migrating the layout stopped: ") as said:
            RedisStateStore(redis_cluster.url, prefix=prefix)
        line = str(said.value)
        assert bucket in line and repr(field.decode()) in line, line
        assert f"HDEL {bucket} {field.decode()}" in line and "resumes" in line, line
        assert "\n" not in line
    with redis_cluster.client() as client:
        meta = client.hgetall(f"{prefix}:meta")
        assert meta[b"version"] == str(CLUSTER_LAYOUT_VERSION).encode()
        assert meta[b"upgrading"] == b"7"
        client.hdel(bucket, field)
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        with redis_cluster.client() as client:
            assert b"upgrading" not in client.hgetall(f"{prefix}:meta")
        assert left_of_layout_7(redis_cluster, prefix) == []
        states = list(store.iter_pages(SCOPE))
        assert len(states) == 4 * 3 - 1
        assert await whole_summary(store, SCOPE) == whole_brute_summary(states)
        due = await call(store.get_due(SCOPE, now=4_000, limit=1_000))
        assert sorted(s.key.url for s in due) == sorted(
            s.key.url for s in states if s.next_visit <= 4_000)
    finally:
        await call(store.close())


#: Run by layout 7's code: 12 pages on 4 hosts checked at 1,000,001; the
#: run's mark set at 1,000,005 (every old shard's P:nvm); 6 of them checked
#: again at 1,000,010 (after the mark: in the shards' P:ck).
_MARKED_WRITER = _LAYOUT_7_HEAD + textwrap.dedent("""

    async def main():
        keys = [PageKey(scope, f"https://h{h}.example/p{n}") for h in range(4) for n in range(3)]
        store = RedisStateStore(url, prefix=prefix)
        for n, key in enumerate(keys):
            store.stage_page(full_state(key, 1, callback="parse", next_visit=1_000 + n))
        await store.flush()
        store.mark_run_start(scope, 1_000_005)
        for n, key in enumerate(keys[::2]):
            store.stage_page(full_state(key, 10, callback="parse", next_visit=2_000 + n))
        await store.flush()
        await store.close()

    asyncio.run(main())
""")


@pytest.mark.parametrize("migration", ["whole", "cut and resumed"])
@pytest_twisted.ensureDeferred
async def test_the_checks_since_the_runs_mark_are_recounted_by_the_layout_7_migration(
    redis_cluster: LoopbackCluster, prefix: str, layout_7: Path, migration: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A layout-7 store whose run's mark (1,000,005) falls between its
    pages' two checks (12 pages checked at 1,000,001, 6 of them again at
    1,000,010), migrated whole or cut at its second group and resumed:
    each group keeps its old shard's mark and the checks since it, so a
    summary of the pages not checked since a time between the two checks
    counts the 6 left (not the 12: the checks since the mark lost), and
    every summary with a cutoff is the pages'."""
    subprocess.run(
        [sys.executable, "-c", _MARKED_WRITER, redis_cluster.url, prefix, SCOPE],
        cwd=layout_7, env={**os.environ, "PYTHONPATH": str(layout_7)}, check=True,
        capture_output=True, text=True, timeout=300)
    if migration == "cut and resumed":
        original = RedisStateStore._write_group_sums
        written: list[str] = []

        def cut_second(self: RedisStateStore, tag: str, *args: Any) -> None:
            if len(written) == 1:
                raise redis.exceptions.ConnectionError("the second group's node is unreachable")
            written.append(tag)
            original(self, tag, *args)

        with monkeypatch.context() as patched:
            patched.setattr(RedisStateStore, "_write_group_sums", cut_second)
            with pytest.raises(StateStoreError, match="migrating the layout failed"):
                RedisStateStore(redis_cluster.url, prefix=prefix)
        with redis_cluster.client() as client:
            assert client.hget(f"{prefix}:meta", "upgrading") == b"7"
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        with redis_cluster.client() as client:
            assert b"upgrading" not in client.hgetall(f"{prefix}:meta")
            # Each built group holds its old shard's mark.
            groups = sorted({host_group(f"h{h}.example") for h in range(4)})
            assert [client.hget(f"{prefix}:nvm:{{{SCOPE}|{group}}}", "mark")
                    for group in groups] == [b"1000005"] * len(groups)
        states = list(store.iter_pages(SCOPE))
        assert sorted(s.last_checked for s in states) == [1_000_001] * 6 + [1_000_010] * 6
        between = await call(store.summarize_pages(SCOPE, after=-math.inf, upto=math.inf,
                                                   checked_before=1_000_008))
        assert between[0] == 6
        for before in (1_000_008, 1_000_011, math.inf):
            for after, upto in ((-math.inf, math.inf), (0, 1_500), (1_500, math.inf)):
                got = await call(store.summarize_pages(SCOPE, after=after, upto=upto,
                                                       checked_before=before))
                assert tuple(got) == brute_summary(states, after, upto, before, ()), (
                    before, after, upto)
    finally:
        await call(store.close())
