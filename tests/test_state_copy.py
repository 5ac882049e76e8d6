"""``scrapy state copy``: a scope moved to another store, then crawled there.

Real crawls of the loopback site write the source (SQLite, a Redis server
or a real Redis Cluster); ``scrapy state copy`` runs through Scrapy's
command line; then the same crawl runs on the destination and on the
source, and the site must have seen the same requests from both (the same
conditional headers, no page asked that was not due) and the same items
emitted (none new).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import uuid
from contextlib import closing
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
import redis
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro
from twisted.internet.threads import deferToThread

from incremental_crawler import clock
from incremental_crawler.state import scope_copy
from incremental_crawler.state.records import HostTrust, ItemRecord, PageKey, PageState, SlotRate
from incremental_crawler.state.scope_copy import COPY_MARK, ScopeCopyError, copy_scope
from incremental_crawler.state.stores import AdminStore, StateStoreError, open_store
from incremental_crawler.state.stores.base import describe_holder
from tests.conftest import run_crawl
from tests.follow_spider import FollowSpider
from tests.links import nav_depths
from tests.memory_store import STORES as MEMORY_STORES
from tests.redis_util import REDIS_URI, delete_prefix, new_prefix
from tests.scrapy_cli import scrapy_in_process
from tests.site import PLAIN_KINDS
from tests.spiders import ListSpider

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Coroutine, Iterator
    from pathlib import Path

    from scrapy.crawler import Crawler

    from incremental_crawler.state.stores.base import Removed
    from tests.redis_cluster_util import LoopbackCluster

SCOPE = "list"
ON_CLUSTER = {"INCREMENTAL_STATE_ON_REDIS_CLUSTER": True}
REVISITS = {"INCREMENTAL_REVISIT_ENABLED": True}


@pytest.fixture
def stores(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """URIs of a store of each kind, of the test's own (SQLite files, a
    prefix on the Redis server, a prefix on the loopback Redis Cluster),
    deleted afterwards. The cluster is started only for a test that uses it."""
    prefixes = {kind: new_prefix() for kind in ("redis", "redis2", "cluster")}
    cluster: LoopbackCluster | None = None
    uris = {
        "sqlite": f"sqlite:///{tmp_path / 'source.db'}",
        "sqlite2": f"sqlite:///{tmp_path / 'copy.db'}",
        "redis": f"{REDIS_URI}?prefix={prefixes['redis']}",
        "redis2": f"{REDIS_URI}?prefix={prefixes['redis2']}",
    }
    if "cluster" in request.node.name:
        cluster = request.getfixturevalue("redis_cluster")
        uris["cluster"] = f"{cluster.url}?prefix={prefixes['cluster']}"
    yield uris
    delete_prefix(prefixes["redis"])
    delete_prefix(prefixes["redis2"])
    if cluster is not None:
        cluster.delete(f"{prefixes['cluster']}:*")


async def crawl_on(uri: str, urls: list[str], spidercls: type = ListSpider,
                   **settings: Any) -> Crawler:
    """A real crawl of ListSpider (*urls*), or of *spidercls* from ``urls[0]``,
    on the store *uri*; what it emitted in ``crawler.collected``."""
    if spidercls is ListSpider:
        return await run_crawl(uri, spidercls, {**ON_CLUSTER, **settings}, urls=urls)
    return await run_crawl(uri, spidercls, {**ON_CLUSTER, **settings}, start_url=urls[0])


async def state(source: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``scrapy state ARGS`` on *source*, in a thread (the reactor runs on)."""
    return await deferToThread(scrapy_in_process, "state", *args,
                               "-s", f"INCREMENTAL_STATE_URI={source}",
                               "-s", "INCREMENTAL_STATE_ON_REDIS_CLUSTER=True")


def opened(uri: str) -> AdminStore:
    store = open_store(Settings({"INCREMENTAL_STATE_URI": uri, **ON_CLUSTER}))
    assert isinstance(store, AdminStore)
    return store


def seen(site: Any) -> list[tuple[str, str | None, str | None, int]]:
    """What the site was asked for its pages: path, conditions, answer."""
    return sorted((r.path, r.if_none_match, r.if_modified_since, r.status)
                  for r in site.log if r.path.startswith("/p/"))


def emitted(crawler: Crawler) -> list[tuple[str, str]]:
    return sorted((item["url"], item.get("change", "?")) for item in crawler.collected)


async def source_with_history(site: Any, uri: str) -> list[str]:
    """Crawls of the site into *uri*: two, a page changed between them (so
    an item has two versions), then one with revisits on (every page gets
    its next visit); one item version left waiting on a crawl that never
    confirmed it."""
    paths = site.add_pages(8, kinds=PLAIN_KINDS, size=2000)
    urls = [site.url(path) for path in paths]
    await crawl_on(uri, urls)
    site.change(paths[1])
    await crawl_on(uri, urls)
    await crawl_on(uri, urls, **REVISITS)
    store = opened(uri)
    try:
        store.stage_item(ItemRecord(SCOPE, site.url("/extra"), site.url("/extra"), "fp-extra",
                                    data=json.dumps({"url": site.url("/extra")}),
                                    stored_at=1_700_000_000, delivery="killed-crawl"))
        await deferred_from_coro(store.flush())
    finally:
        await deferred_from_coro(store.close())
    return urls


async def counts(uri: str, changed: str) -> tuple[Any, ...]:
    """What *uri* holds of the scope: counts by kind, the waiting crawls,
    the changed item's history, the hosts, the crawl records."""
    store = opened(uri)
    try:
        pending = await deferred_from_coro(store.undelivered_crawls(SCOPE))
        history = store.item_history(SCOPE, changed)
        return (store.count_scope(SCOPE), store.count_pages(SCOPE), pending, history,
                sorted(store.iter_hosts(SCOPE), key=lambda h: h.host),
                len(store.crawls(SCOPE, 100)))
    finally:
        await deferred_from_coro(store.close())


ROUTES = pytest.mark.parametrize("route", [
    ("sqlite", "redis"), ("redis", "cluster"), ("cluster", "sqlite2")],
    ids=["sqlite-to-redis", "redis-to-cluster", "cluster-to-sqlite"])


@ROUTES
@pytest_twisted.ensureDeferred
async def test_a_copied_scope_crawls_on_the_destination_as_on_the_source(
        site: Any, stores: dict[str, str], route: tuple[str, str]) -> None:
    source, destination = (stores[kind] for kind in route)
    urls = await source_with_history(site, source)

    dry = await state(source, "copy", "--to", destination, "--spider", SCOPE)
    assert dry.returncode == 2, dry.stderr
    assert "copy would copy" in dry.stderr and "8 pages" in dry.stderr, dry.stderr
    assert "1 undelivered item version" in dry.stderr, dry.stderr
    done = await state(source, "copy", "--to", destination, "--spider", SCOPE, "--yes")
    assert done.returncode == 0, done.stderr
    assert "verified" in done.stdout, done.stdout
    copied = await counts(destination, urls[1])
    assert copied == await counts(source, urls[1])
    assert copied[0].pages == 8 and copied[0].versions == 10  # 9 items, one with 2 versions
    assert [version for version, _ in copied[3]] == [1, 2]
    assert copied[2] == ["killed-crawl"]

    # Seconds later no page is due: neither crawl asks for any; each
    # delivers the version the killed crawl left waiting, once.
    site.reset_log()
    on_copy = await crawl_on(destination, urls, **REVISITS)
    assert seen(site) == []
    site.reset_log()
    on_source = await crawl_on(source, urls, **REVISITS)
    assert seen(site) == []
    for crawler in (on_copy, on_source):
        assert crawler.stats.get_value("incremental/schedule/not_due") == len(urls)
        assert crawler.stats.get_value("incremental/redelivered") == 1
    assert emitted(on_copy) == emitted(on_source) == [(site.url("/extra"), "?")]

    # Revisits off (every page asked) and one page changed: the same
    # conditional requests from both, the same items, none new.
    site.change("/p/0002")
    site.reset_log()
    on_copy = await crawl_on(destination, urls)
    asked_by_copy = seen(site)
    site.reset_log()
    on_source = await crawl_on(source, urls)
    assert asked_by_copy == seen(site)
    assert [path for path, *_ in asked_by_copy] == [f"/p/{i:04d}" for i in range(8)]
    # Every page with validators is asked with the validators stored for it
    # (the same as the source sent, above); most are unchanged: 304s.
    kinds = {path: site.page(path).kind for path, *_ in asked_by_copy}
    for path, etag, since, _ in asked_by_copy:
        assert (etag is not None or since is not None) == (kinds[path] != "none"), path
    assert sum(status == 304 for *_, status in asked_by_copy) >= 4
    assert emitted(on_copy) == emitted(on_source) == [(site.url("/p/0002"), "changed")]
    assert on_copy.stats.get_value("incremental/items_changed") == 1
    assert on_copy.stats.get_value("incremental/items_new", 0) == 0


@pytest_twisted.ensureDeferred
async def test_copy_refuses_a_destination_that_holds_the_scope_and_a_held_source(
        site: Any, stores: dict[str, str]) -> None:
    source, destination = stores["sqlite"], stores["redis"]
    urls = await source_with_history(site, source)
    await crawl_on(destination, urls[:1])  # the destination holds the scope already
    before = (await counts(destination, urls[1]))[0]
    refused = await state(source, "copy", "--to", destination, "--spider", SCOPE, "--yes")
    assert refused.returncode == 1
    assert "already holds scope 'list'" in refused.stderr and "never merges" in refused.stderr
    assert (await counts(destination, urls[1]))[0] == before

    held = opened(source)
    try:
        assert held.take_scope(
            SCOPE, f"elsewhere:{uuid.uuid4().int % 10**6}", 600, clock.now()) is None
    finally:
        await deferred_from_coro(held.close())
    refused = await state(source, "copy", "--to", stores["redis2"], "--spider", SCOPE, "--yes")
    assert refused.returncode == 1
    assert "is held by crawl elsewhere:" in refused.stderr, refused.stderr
    fresh = opened(stores["redis2"])
    try:
        assert fresh.scopes() == []
    finally:
        await deferred_from_coro(fresh.close())


@pytest_twisted.ensureDeferred
async def test_a_copy_cut_short_by_an_unreadable_record_is_refused_until_reset(
        site: Any, stores: dict[str, str], tmp_path: Path) -> None:
    source, destination = stores["sqlite"], stores["redis"]
    urls = await source_with_history(site, source)
    db = sqlite3.connect(tmp_path / "source.db")
    db.execute("UPDATE item_versions SET data = '{damaged' WHERE item_key = ? AND version = 2",
               (urls[1],))
    db.commit()

    stopped = await state(source, "copy", "--to", destination, "--spider", SCOPE, "--yes")
    assert stopped.returncode == 1
    assert f"version 2 of item {urls[1]!r}" in stopped.stderr, stopped.stderr
    assert "cut short" in stopped.stderr and "scrapy state reset" in stopped.stderr
    partial = opened(destination)
    try:
        mark = await deferred_from_coro(partial.get_walk_memo(SCOPE, COPY_MARK))
        assert mark is not None and json.loads(mark)["done"] is False
    finally:
        await deferred_from_coro(partial.close())

    db.execute("UPDATE item_versions SET data = '{}' WHERE item_key = ? AND version = 2",
               (urls[1],))
    db.commit()
    db.close()
    again = await state(source, "copy", "--to", destination, "--spider", SCOPE, "--yes")
    assert again.returncode == 1
    assert "was cut short" in again.stderr, again.stderr

    reset = await state(destination, "reset", "--spider", SCOPE, "--yes")
    assert reset.returncode == 0, reset.stderr
    done = await state(source, "copy", "--to", destination, "--spider", SCOPE, "--yes")
    assert done.returncode == 0, done.stderr
    assert await counts(destination, urls[1]) == await counts(source, urls[1])


@pytest.mark.parametrize("mode", ["one-process", "cluster-mode-worker"])
@pytest_twisted.ensureDeferred
async def test_a_crawl_refuses_a_destination_whose_copy_was_cut_short(
        site: Any, stores: dict[str, str], tmp_path: Path, mode: str) -> None:
    """The copy stops at an unreadable item version, after the pages: the
    destination has every page and no item. A crawl there would emit the
    changed page's item as new; it refuses to start, naming the copy (a
    worker of a cluster-mode run too)."""
    source, destination = stores["sqlite"], stores["redis"]
    cluster_prefix = new_prefix()
    worker = ({"INCREMENTAL_CLUSTER_URL": REDIS_URI, "INCREMENTAL_CLUSTER_PREFIX": cluster_prefix}
              if mode == "cluster-mode-worker" else {})
    urls = await source_with_history(site, source)
    damage_version_2(tmp_path / "source.db", urls[1])
    stopped = await state(source, "copy", "--to", destination, "--spider", SCOPE, "--yes")
    assert stopped.returncode == 1 and "cut short" in stopped.stderr, stopped.stderr

    site.change("/p/0002")
    site.reset_log()
    try:
        with pytest.raises(StateStoreError, match=r"scope 'list' is a copy made by 'scrapy "
                                                  r"state copy' that is under way, or was cut "
                                                  r"short"):
            await crawl_on(destination, urls, **worker)
    finally:
        delete_prefix(cluster_prefix)
    assert seen(site) == []


@pytest_twisted.ensureDeferred
async def test_a_scope_whose_own_copy_was_cut_short_is_not_copied_on_as_verified(
        site: Any, stores: dict[str, str], tmp_path: Path) -> None:
    """SQLite -> Redis cut short (no item got there), then Redis -> SQLite:
    copied on, the partial scope would verify against itself and be marked
    done, and the mark of the first copy would be lost. It is refused, and
    nothing is written to the last store."""
    source, middle, last = stores["sqlite"], stores["redis"], stores["sqlite2"]
    urls = await source_with_history(site, source)
    damage_version_2(tmp_path / "source.db", urls[1])
    stopped = await state(source, "copy", "--to", middle, "--spider", SCOPE, "--yes")
    assert stopped.returncode == 1 and "cut short" in stopped.stderr, stopped.stderr

    onward = await state(middle, "copy", "--to", last, "--spider", SCOPE, "--yes")
    assert onward.returncode == 1, onward.stdout
    assert (f"is itself a copy that is under way, or was cut short (or could not be "
            f"verified) from {tmp_path / 'source.db'}") in onward.stderr, onward.stderr
    fresh = opened(last)
    try:
        assert fresh.scopes() == []
    finally:
        await deferred_from_coro(fresh.close())


@pytest.mark.parametrize("alias", ["symlink", "dotdot", "localhost", "another-cluster-node"])
@pytest_twisted.ensureDeferred
async def test_a_destination_that_is_the_source_by_another_name_is_not_advised_reset(
        stores: dict[str, str], tmp_path: Path, alias: str,
        request: pytest.FixtureRequest) -> None:
    """--to names the source under another spelling: refused as the source
    itself, not as a destination that holds the scope (whose advice would
    be to reset it, deleting the source's scope)."""
    if alias == "localhost":
        source = stores["redis"]
        to = source.replace("//127.0.0.1:", "//localhost:")
    elif alias == "another-cluster-node":
        cluster = request.getfixturevalue("redis_cluster")
        source = stores["cluster"]
        to = source.replace(f":{cluster.ports[0]}/", f":{cluster.ports[1]}/")
    else:
        source = stores["sqlite"]
        if alias == "symlink":
            (tmp_path / "alias.db").symlink_to(tmp_path / "source.db")
            to = f"sqlite:///{tmp_path / 'alias.db'}"
        else:
            (tmp_path / "sub").mkdir()
            to = f"sqlite:///{tmp_path / 'sub' / '..' / 'source.db'}"
    assert to != source
    await deferred_from_coro(write_items(source))
    refused = await state(source, "copy", "--to", to, "--spider", SCOPE, "--yes")
    assert refused.returncode == 1
    assert "is the store the copy reads from" in refused.stderr, refused.stderr
    assert "scrapy state reset" not in refused.stderr, refused.stderr


@pytest.mark.parametrize(("to", "said"), [
    (f"{REDIS_URI}?prefix=x&password=hunter2", "unknown parameter 'password'"),
    ("nosuch://user:hunter2@127.0.0.1/",
     "--to 'nosuch://user:***@127.0.0.1/': no store for scheme 'nosuch'"),
], ids=["password-in-the-query", "unknown-scheme"])
@pytest_twisted.ensureDeferred
async def test_a_bad_destination_is_named_as_to_without_its_password(
        stores: dict[str, str], to: str, said: str) -> None:
    await deferred_from_coro(write_items(stores["sqlite"]))
    refused = await state(stores["sqlite"], "copy", "--to", to, "--spider", SCOPE, "--yes")
    assert refused.returncode == 1
    assert said in refused.stderr and "--to" in refused.stderr, refused.stderr
    assert "hunter2" not in refused.stderr + refused.stdout, refused.stderr
    assert "INCREMENTAL_STATE_URI" not in refused.stderr, refused.stderr


def damage_version_2(path: Path, key: str) -> None:
    """Version 2 of the item *key* of the SQLite store at *path* made unreadable."""
    db = sqlite3.connect(path)
    try:
        db.execute("UPDATE item_versions SET data = '{damaged' WHERE item_key = ? "
                   "AND version = 2", (key,))
        db.commit()
    finally:
        db.close()


def in_another_thread(work: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run *work* to its end on an event loop of its own, in another
    thread (another process's store, writing beside the copy's)."""
    thread = threading.Thread(target=asyncio.run, args=(work(),))
    thread.start()
    thread.join()


@pytest_twisted.ensureDeferred
async def test_a_write_to_the_source_during_the_copy_is_not_verified_away(
        tmp_path: Path) -> None:
    """A process that does not hold the scope answers a 304 on
    the source while the copy runs: the page's next visit moves, no count
    changes. The copy is not verified, and its mark stays not done."""
    source_uri, dest_uri = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    key = PageKey(SCOPE, "https://a.example/p")

    async def a_worker_answers_a_304() -> None:
        worker = open_store(Settings({"INCREMENTAL_STATE_URI": source_uri}))
        worker.stage_check(key, 304, 1_700_000_200, schedule=(86_400, 1_700_086_600))
        await worker.flush()
        await worker.close()

    def during_the_copy(line: str) -> None:
        if line.startswith("1 page copied"):
            in_another_thread(a_worker_answers_a_304)

    async def run() -> None:
        source, destination = opened(source_uri), opened(dest_uri)
        try:
            source.stage_page(PageState(key, etag='"1"', fingerprint="f",
                                        first_seen=1_700_000_000, last_checked=1_700_000_000,
                                        next_visit=1_700_000_100, interval=100,
                                        callback="parse"))
            await source.flush()
            with pytest.raises(ScopeCopyError, match="changed while scope 'list' was copied"):
                await copy_scope(source, destination, SCOPE, dest_uri, say=during_the_copy)
            mark = await destination.get_walk_memo(SCOPE, COPY_MARK)
            assert mark is not None and json.loads(mark)["done"] is False
        finally:
            await source.close()
            await destination.close()

    await deferred_from_coro(run())


@pytest_twisted.ensureDeferred
async def test_the_destination_is_checked_again_once_held(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crawl on the destination writes the scope and ends after the copy
    first looked there and before it held the scope: the copy refuses (it
    would merge into it), and the crawl's page stays as it wrote it."""
    source_uri, dest_uri = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    key = PageKey(SCOPE, "https://a.example/p")

    async def a_crawl_on_the_destination() -> None:
        other = open_store(Settings({"INCREMENTAL_STATE_URI": dest_uri}))
        other.stage_page(PageState(key, etag='"other"', fingerprint="g", callback="parse"))
        await other.flush()
        await other.close()

    take = scope_copy._Holds.take

    def a_crawl_ends_then_take(holds: Any) -> None:
        in_another_thread(a_crawl_on_the_destination)
        take(holds)

    monkeypatch.setattr(scope_copy._Holds, "take", a_crawl_ends_then_take)

    async def run() -> None:
        source, destination = opened(source_uri), opened(dest_uri)
        try:
            source.stage_page(PageState(key, etag='"1"', fingerprint="f", callback="parse"))
            await source.flush()
            with pytest.raises(ScopeCopyError, match="already holds scope 'list'"):
                await copy_scope(source, destination, SCOPE, dest_uri)
            page = await destination.get_page(key)
            assert page is not None and page.etag == '"other"'
            assert await destination.get_walk_memo(SCOPE, COPY_MARK) is None
        finally:
            await source.close()
            await destination.close()

    await deferred_from_coro(run())


@pytest_twisted.ensureDeferred
async def test_no_crawl_takes_either_scope_while_the_copy_runs(tmp_path: Path) -> None:
    """Another process's crawl starting while the copy runs finds the copy's
    hold on the scope, in the source and in the destination."""
    source_uri, dest_uri = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    found: list[tuple[str, float] | None] = []

    async def a_crawl_starts(uri: str) -> None:
        other = open_store(Settings({"INCREMENTAL_STATE_URI": uri}))
        try:
            found.append(other.take_scope(SCOPE, "elsewhere:1", 60, clock.now()))
        finally:
            await other.close()

    def during_the_copy(line: str) -> None:
        if line.startswith("1 page copied"):
            for uri in (source_uri, dest_uri):
                in_another_thread(lambda uri=uri: a_crawl_starts(uri))

    async def run() -> None:
        source, destination = opened(source_uri), opened(dest_uri)
        try:
            source.stage_page(PageState(PageKey(SCOPE, "https://a.example/p"), fingerprint="f",
                                        callback="parse"))
            await source.flush()
            await copy_scope(source, destination, SCOPE, dest_uri, say=during_the_copy)
        finally:
            await source.close()
            await destination.close()

    await deferred_from_coro(run())
    assert len(found) == 2
    assert all(held is not None and held[0].startswith("copy@") for held in found), found
    assert {describe_holder(held[0]).split()[0] for held in found if held} == {"copy"}
    # A copy is no crawl: no crawl's start is marked (its checks noted from
    # then on) by its hold.
    for path in (tmp_path / "a.db", tmp_path / "b.db"):
        with closing(sqlite3.connect(path)) as db:
            assert db.execute("SELECT mark FROM check_marks WHERE scope = ? AND mark IS NOT "
                              "NULL", (SCOPE,)).fetchall() == [], path


@pytest_twisted.ensureDeferred
async def test_a_copy_whose_counts_differ_is_not_verified(stores: dict[str, str]) -> None:
    """The destination keeps one item version where the source kept two (a
    smaller INCREMENTAL_ITEM_HISTORY): the copy says so and stays marked as
    cut short; a crawl there is refused."""
    source, destination = stores["sqlite"], stores["redis"]
    await deferred_from_coro(write_items(source))
    refused = await state(source, "copy", "--to", destination, "--spider", SCOPE, "--yes",
                          "-s", "INCREMENTAL_ITEM_HISTORY=1")
    assert refused.returncode == 1
    assert "the copy of scope 'list' does not verify: the source holds" in refused.stderr
    assert "INCREMENTAL_ITEM_HISTORY" in refused.stderr, refused.stderr
    partial = opened(destination)
    try:
        mark = await deferred_from_coro(partial.get_walk_memo(SCOPE, COPY_MARK))
        assert mark is not None and json.loads(mark)["done"] is False
    finally:
        await deferred_from_coro(partial.close())


@pytest_twisted.ensureDeferred
async def test_a_long_copy_refreshes_its_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A third of the holds' time gone (the clock moved on while the first
    records were copied): the next batch of pages refreshes both holds."""
    source_uri, dest_uri = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    start = 1_800_000_000.0
    now = [start]
    monkeypatch.setattr(clock, "now", lambda: now[0])
    monkeypatch.setattr(scope_copy, "BATCH", 2)
    later = start + scope_copy._HOLD_TTL / 3
    held: list[dict[str, float]] = []

    def during_the_copy(line: str) -> None:
        if line.startswith("host records"):
            now[0] = later
        elif line.startswith("3 pages copied"):
            held.extend(store.scope_holders(SCOPE, later) for store in stores)

    source, destination = opened(source_uri), opened(dest_uri)
    stores = [source, destination]

    async def run() -> None:
        try:
            for n in range(3):
                source.stage_page(PageState(PageKey(SCOPE, f"https://a.example/{n}"),
                                            fingerprint="f", callback="parse"))
            await source.flush()
            await copy_scope(source, destination, SCOPE, dest_uri, say=during_the_copy)
        finally:
            await source.close()
            await destination.close()

    await deferred_from_coro(run())
    assert [list(holders.values()) for holders in held] == [
        [later + scope_copy._HOLD_TTL]] * 2


@pytest_twisted.ensureDeferred
async def test_a_long_count_refreshes_the_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting the source's records takes a third of the holds' time: both
    holds are refreshed before the copy goes on."""
    source_uri, dest_uri = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    start = 1_800_000_000.0
    now = [start]
    monkeypatch.setattr(clock, "now", lambda: now[0])
    later = start + scope_copy._HOLD_TTL / 3
    held: list[dict[str, float]] = []
    source, destination = opened(source_uri), opened(dest_uri)
    count_scope = source.count_scope

    def a_long_count(scope: str) -> Removed:
        now[0] = later
        return count_scope(scope)

    def after_the_count(line: str) -> None:
        if line.startswith("counted in the source"):
            held.extend(store.scope_holders(SCOPE, later) for store in (source, destination))

    monkeypatch.setattr(source, "count_scope", a_long_count)

    async def run() -> None:
        try:
            source.stage_page(PageState(PageKey(SCOPE, "https://a.example/p"), fingerprint="f",
                                        callback="parse"))
            await source.flush()
            await copy_scope(source, destination, SCOPE, dest_uri, say=after_the_count)
        finally:
            await source.close()
            await destination.close()

    await deferred_from_coro(run())
    assert [list(holders.values()) for holders in held] == [
        [later + scope_copy._HOLD_TTL]] * 2


@pytest_twisted.ensureDeferred
async def test_an_item_of_a_long_history_is_written_in_bounded_flushes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An item at version 10 (two kept) stages ten writes: flushed by the
    batch as they are staged, not all at once."""
    source_uri, dest_uri = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    monkeypatch.setattr(scope_copy, "BATCH", 3)
    settings = {"INCREMENTAL_ITEM_HISTORY": 2}
    key = "https://a.example/long"
    flushed: list[int] = []

    async def run() -> None:
        source = open_store(Settings({"INCREMENTAL_STATE_URI": source_uri, **settings}))
        destination = open_store(Settings({"INCREMENTAL_STATE_URI": dest_uri, **settings}))
        assert isinstance(source, AdminStore) and isinstance(destination, AdminStore)
        flush = destination.flush

        async def counted_flush() -> int:
            flushed.append(destination.pending)
            return await flush()

        monkeypatch.setattr(destination, "flush", counted_flush)
        try:
            for n in range(10):
                source.stage_item(ItemRecord(SCOPE, key, key, f"fp-{n}",
                                             data=json.dumps({"n": n}),
                                             stored_at=1_700_000_000 + n))
            await source.flush()
            await copy_scope(source, destination, SCOPE, dest_uri)
            assert destination.item_history(SCOPE, key) == source.item_history(SCOPE, key)
        finally:
            await source.close()
            await destination.close()

    await deferred_from_coro(run())
    assert sum(flushed) == 10 and max(flushed) <= 3, flushed


@pytest.mark.parametrize(("args", "status", "said"), [
    (("--spider", SCOPE, "--yes"), 2, "needs --to URI"),
    (("--to", "{sqlite2}", "--yes"), 2, "needs one of --spider NAME (one scope) and --all"),
    (("--to", "{sqlite2}", "--spider", SCOPE, "--all", "--yes"), 2, "needs one of --spider"),
    (("--to", "{sqlite}", "--spider", SCOPE, "--yes"), 1, "is the store the copy reads from"),
    (("--to", "memory:///{tmp}/m", "--spider", SCOPE, "--yes"), 1,
     "has the crawl interface only; a copy needs AdminStore there"),
    (("--to", "memory-admin:///{tmp}/m", "--spider", SCOPE, "--yes"), 1,
     "keeps no memos (StateStore.put_walk_memo)"),
], ids=["no-to", "no-scope", "spider-and-all", "same-uri", "crawl-interface-only", "no-memos"])
@pytest_twisted.ensureDeferred
async def test_a_copy_that_cannot_be_made_says_why(
        stores: dict[str, str], tmp_path: Path, args: tuple[str, ...], status: int,
        said: str) -> None:
    await deferred_from_coro(write_items(stores["sqlite"]))
    refused = await state(stores["sqlite"], "copy",
                          *(arg.format(tmp=tmp_path, **stores) for arg in args),
                          "-s", f"INCREMENTAL_STATE_STORES={json.dumps(MEMORY_STORES)}")
    assert refused.returncode == status, refused.stderr
    assert said in refused.stderr, refused.stderr


async def write_items(uri: str) -> None:
    """Items of every shape a store keeps, written as crawls write them,
    with two versions kept per item: history pruned, a tombstone, a latest
    version without data, an item of another page with a SimHash, one that
    never had data, and a version waiting on its crawl's delivery."""
    store = open_store(Settings({"INCREMENTAL_STATE_URI": uri, "INCREMENTAL_ITEM_HISTORY": 2,
                                 **ON_CLUSTER}))
    t = 1_700_000_000

    def item(key: str, n: int, **fields: Any) -> ItemRecord:
        fields.setdefault("data", json.dumps({"url": key, "n": n}))
        fields.setdefault("fingerprint", f"{key}-{n}")
        return ItemRecord(SCOPE, key, key, stored_at=t + 10 * n, **fields)

    try:
        for n in range(4):
            store.stage_item(item("https://a.example/pruned", n,
                                  change="new" if n == 0 else "changed"))
        store.stage_item(item("https://a.example/gone", 0))
        store.stage_item(item("https://a.example/gone", 1, fingerprint="", change="deleted"))
        store.stage_item(item("https://a.example/quiet", 0))
        store.stage_item(item("https://a.example/quiet", 1, data=None))
        store.stage_item(item("https://a.example/child", 0, page="https://a.example/parent",
                              simhash=123_456, delivery="crawl-x"))
        store.stage_item(item("https://a.example/bare", 0, data=None))
        store.stage_host(HostTrust(SCOPE, "a.example", checks=7, lies=2,
                                   distrusted_until=t + 86_400, stale_lastmods=1,
                                   validators_unstable_since=t))
        store.stage_slot_rates([SlotRate(SCOPE, "a.example", 3.5, False, t, "penalty box")])
        await store.flush()
    finally:
        await store.close()


async def items_of(uri: str) -> tuple[Any, ...]:
    store = open_store(Settings({"INCREMENTAL_STATE_URI": uri, **ON_CLUSTER}))
    assert isinstance(store, AdminStore)
    try:
        pending = [(crawl, [(p.version.key, p.version.version)
                            for p in await store.undelivered(SCOPE, crawl)])
                   for crawl in await store.undelivered_crawls(SCOPE)]
        return (sorted(store.iter_item_states(SCOPE)), pending,
                await store.get_page_items(SCOPE, "https://a.example/parent"),
                list(store.iter_items(SCOPE)), list(store.iter_hosts(SCOPE)),
                store.read_slot_rates(SCOPE))
    finally:
        await store.close()


@ROUTES
@pytest_twisted.ensureDeferred
async def test_items_keep_their_numbers_history_pages_and_delivery_marks(
        stores: dict[str, str], route: tuple[str, str]) -> None:
    source, destination = (stores[kind] for kind in route)
    await deferred_from_coro(write_items(source))
    done = await state(source, "copy", "--to", destination, "--all", "--yes",
                       "-s", "INCREMENTAL_ITEM_HISTORY=2")
    assert done.returncode == 0, done.stderr
    copied = await deferred_from_coro(items_of(destination))
    assert copied == await deferred_from_coro(items_of(source))
    states = {item.key.rsplit("/", 1)[1]: item for item in copied[0]}
    assert [v.version for v in states["pruned"].versions] == [3, 4]
    assert states["pruned"].version == 4
    assert states["gone"].fingerprint == "" and states["gone"].versions[-1].change == "deleted"
    assert states["quiet"].version == 2 and len(states["quiet"].versions) == 1
    assert states["child"].simhash == 123_456
    assert copied[1] == [("crawl-x", [("https://a.example/child", 1)])]
    assert copied[2] == ["https://a.example/child"]
    assert [(h.host, h.checks, h.lies) for h in copied[4]] == [("a.example", 7, 2)]
    assert [(r.slot, r.rate, r.ended) for r in copied[5].rates] == [
        ("a.example", 3.5, "penalty box")]


async def write_deleted_and_back(uri: str, history: int) -> None:
    """An item stored, deleted, back, changed, with *history* versions
    kept: its tombstone is pruned (its comeback too when 1)."""
    store = open_store(Settings({"INCREMENTAL_STATE_URI": uri,
                                 "INCREMENTAL_ITEM_HISTORY": history, **ON_CLUSTER}))
    key = "https://a.example/back"
    try:
        for n, (fingerprint, change) in enumerate([("a", "new"), ("", "deleted"), ("b", "new"),
                                                   ("c", "changed")]):
            store.stage_item(ItemRecord(SCOPE, key, key, fingerprint, data=json.dumps({"n": n}),
                                        stored_at=1_700_000_000 + 1000 * n, change=change))
        await store.flush()
    finally:
        await store.close()


async def feed(uri: str, since: float) -> list[tuple[str, int, str]]:
    """The scope's change feed since *since*: key, version, change."""
    store = opened(uri)
    try:
        return [(v.key, v.version, v.change) for v in store.iter_versions(SCOPE, since=since)]
    finally:
        await store.close()


@pytest.mark.parametrize("route", [("sqlite", "sqlite2"), ("redis", "sqlite2"),
                                   ("sqlite", "redis")],
                         ids=["sqlite-to-sqlite", "redis-to-sqlite", "sqlite-to-redis"])
@pytest.mark.parametrize("history", [2, 1])
@pytest_twisted.ensureDeferred
async def test_a_change_feed_on_the_copy_says_what_it_says_on_the_source(
        stores: dict[str, str], route: tuple[str, str], history: int) -> None:
    """A feed since between the (pruned) tombstone and the comeback says
    'new' on the source: the item was not live at its start. The copy
    says so too, its live run beginning at the comeback, not at first_seen."""
    source, destination = (stores[kind] for kind in route)
    await deferred_from_coro(write_deleted_and_back(source, history))
    done = await state(source, "copy", "--to", destination, "--spider", SCOPE, "--yes",
                       "-s", f"INCREMENTAL_ITEM_HISTORY={history}")
    assert done.returncode == 0, done.stderr
    since = 1_700_000_000 + 1500
    on_source = await deferred_from_coro(feed(source, since))
    assert on_source == [("https://a.example/back", 4, "new")]
    assert await deferred_from_coro(feed(destination, since)) == on_source
    copied = await deferred_from_coro(items_of(destination))
    assert copied == await deferred_from_coro(items_of(source))
    [item] = copied[0]
    assert (item.born, item.died) == (1_700_002_000, 1_700_001_000)


@pytest.mark.parametrize("route", [("sqlite", "redis"), ("redis", "cluster")],
                         ids=["sqlite-to-redis", "redis-to-cluster"])
@pytest_twisted.ensureDeferred
async def test_copied_links_records_replay_on_304s_as_on_the_source(
        site: Any, stores: dict[str, str], route: tuple[str, str]) -> None:
    """Pages linked by their ``<nav>``: a 304 replays the requests the page
    yielded from its stored links record, so the crawl reaches the pages
    behind it without fetching it in full."""
    source, destination = (stores[kind] for kind in route)
    paths = [f"/p/{i:04d}" for i in range(20)]
    for path in paths:
        site.add_page(path, "strong", size=1500)
    start = [site.url(paths[0])]
    await crawl_on(source, start, FollowSpider)
    done = await state(source, "copy", "--to", destination, "--spider", FollowSpider.name,
                       "--yes")
    assert done.returncode == 0, done.stderr
    deep = max(paths, key=lambda path: nav_depths(site, paths[0])[path])
    site.change(deep)
    site.reset_log()
    on_copy = await crawl_on(destination, start, FollowSpider)
    asked_by_copy = seen(site)
    site.reset_log()
    on_source = await crawl_on(source, start, FollowSpider)
    assert asked_by_copy == seen(site)
    assert sorted(path for path, *_ in asked_by_copy) == paths
    assert [path for path, *_, status in asked_by_copy if status == 200] == [deep]
    assert emitted(on_copy) == emitted(on_source) == [(site.url(deep), "changed")]


@pytest_twisted.ensureDeferred
async def test_an_unreadable_item_of_a_redis_store_stops_the_copy_naming_it(
        stores: dict[str, str]) -> None:
    source, destination = stores["redis"], stores["sqlite2"]
    await deferred_from_coro(write_items(source))
    store = opened(source)
    try:
        damaged = store._hist_key(SCOPE, "https://a.example/pruned")  # type: ignore[attr-defined]
        client = redis.Redis.from_url(REDIS_URI)
        client.hset(damaged, "4", "{not json")
        client.close()
    finally:
        await deferred_from_coro(store.close())
    stopped = await state(source, "copy", "--to", destination, "--spider", SCOPE, "--yes",
                          "-s", "INCREMENTAL_ITEM_HISTORY=2")
    assert stopped.returncode == 1
    assert "the item 'https://a.example/pruned' of scope 'list' cannot be read" in stopped.stderr
    assert "marked as cut short" in stopped.stderr, stopped.stderr
