"""The contract every state store backend passes, and SQLite specifics.

:class:`StateStoreContract` holds backend-neutral tests: it only uses the
:class:`~incremental_crawler.state.stores.base.StateStore` interface. A backend
subclasses it and provides a ``make_store`` fixture (see the contract's
docstring); :class:`TestSQLiteStore` does so for the embedded SQLite store.
Tests that depend on SQLite itself (files, locks, pragmas, URIs) live in
:class:`TestSQLiteOnly`.

Store reads and ``flush``/``close`` are coroutines. They are driven the way
Scrapy drives them under the asyncio reactor (:func:`call`), so a backend
that awaits asyncio I/O (Redis) runs under these tests unchanged.
"""

from __future__ import annotations

import json
import logging
import math
import random
import socket
import sqlite3
import subprocess
import sys
import tracemalloc
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
import redis
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro

from incremental_crawler import clock
from incremental_crawler.state.records import (
    Change,
    CrawlRecord,
    HostTrust,
    ItemRecord,
    PageFlags,
    PageKey,
    PageState,
    SlotRate,
    StoredVersion,
)
from incremental_crawler.state.stores import (
    AdminStore,
    StateStore,
    StateStoreError,
    default_state_uri,
    open_store,
)
from incremental_crawler.state.stores.base import (
    HoldLapsed,
    HostSummary,
    Removed,
    ScopeHeld,
    due_after,
)
from incremental_crawler.state.stores.redis import RedisStateStore
from incremental_crawler.state.stores.redis.core import ITEM_GROUPS
from incremental_crawler.state.stores.sqlite import (
    MIGRATIONS,
    SCHEMA_VERSION,
    SQLiteStateStore,
    path_from_uri,
)
from tests.redis_util import REDIS_URI, new_prefix
from tests.waiting import until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Iterator
    from contextlib import AbstractContextManager

    from twisted.internet.defer import Deferred

    from tests.redis_cluster_util import LoopbackCluster

    #: Opens the test's store; keywords go to the store class (history_limit).
    MakeStore = Callable[..., StateStore]
    FailingFlush = Callable[[], AbstractContextManager[None]]
    #: Overwrites the stored record of a slot of a scope with garbage.
    DamageSlotRate = Callable[[str, str], None]


def call(awaitable: Awaitable[Any]) -> Deferred[Any]:
    """Run a store coroutine as Scrapy does (an asyncio task, as a Deferred)."""
    return deferred_from_coro(awaitable)


SCOPE = "books"
URL = "https://example.com/a"


def full_state(key: PageKey, n: int = 1, **changes: Any) -> PageState:
    """A page state with every field set (whole seconds: stores keep seconds)."""
    state = PageState(
        key,
        etag=f'W/"etag-{n}"',
        last_modified="Sun, 06 Nov 1994 08:49:37 GMT",
        fingerprint=f"{n:064x}",
        size=1000 + n,
        last_status=200,
        first_seen=1_000_000,
        last_checked=1_000_000 + n,
        last_fetched=1_000_000 + n,
        last_changed=1_000_000 + n,
        checks=n,
        changes=n - 1,
        flags=0,
        redirect_to=None,
    )
    return state.copy(**changes)


def item(
    key: str, n: int = 1, *, scope: str = SCOPE, data: Any = ..., stored_at: float = 0,
    change: Change = Change.NEW, page: str | None = None,
) -> ItemRecord:
    if data is ...:
        data = {"name": key, "version": n}
    return ItemRecord(
        scope=scope,
        key=key,
        url=f"https://example.com/{key}",
        # A tombstone has no fingerprint.
        fingerprint="" if change == Change.DELETED else f"fp-{key}-{n}",
        data=None if data is None else json.dumps(data),
        stored_at=stored_at or 2_000_000 + n,
        change=change,
        page=page,
    )


class StateStoreContract:
    """Tests every :class:`StateStore` backend must pass.

    A subclass provides a ``make_store`` fixture: a callable that opens a
    store (keyword arguments, such as ``history_limit``, go to the store
    class's constructor). Every call within one test opens the *same* backing
    storage (a path, a Redis key prefix...), which starts out empty for each
    test; ``await call(store.close())`` then ``make_store()`` is how
    durability is checked. The fixture closes whatever the test left open.

    It also provides ``failing_flush``: a callable returning a context
    manager inside which a flush that writes pages of ``SCOPE`` fails the way
    the backend fails in production (another process's lock, a damaged
    key), for a test that stored no page of ``SCOPE`` before; and
    ``damage_slot_rate(scope, slot)``, which overwrites a stored politeness
    rate with a value no window can start from.
    """

    @pytest.fixture
    def store(self, make_store: MakeStore) -> StateStore:
        return make_store()

    @pytest.fixture
    def client_overhead(self) -> int:
        """Bytes a store's clients take when it opens, whatever it holds
        (0: counted against the bound of the reads)."""
        return 0

    # -- pages ---------------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_empty_store(self, store: StateStore) -> None:
        assert await call(store.get_page(PageKey(SCOPE, URL))) is None
        assert await call(store.get_item_fingerprint(SCOPE, "a")) is None
        assert store.pending == 0
        assert store.count_pages() == 0
        assert list(store.iter_items()) == []
        assert store.item_history(SCOPE, "a") == []
        assert await call(store.flush()) == 0
        assert isinstance(store.location, str) and store.location

    @pytest_twisted.ensureDeferred
    async def test_staged_page_visible_before_flush(self, store: StateStore) -> None:
        key = PageKey(SCOPE, URL)
        state = full_state(key)
        store.stage_page(state)
        assert store.pending == 1
        got = await call(store.get_page(key))
        assert got == state
        assert got is not None and got.key == key

    @pytest_twisted.ensureDeferred
    async def test_flush_commits_and_returns_count(self, store: StateStore) -> None:
        keys = [PageKey(SCOPE, f"{URL}/{i}") for i in range(3)]
        for i, key in enumerate(keys):
            store.stage_page(full_state(key, i + 1))
        assert store.pending == 3
        assert await call(store.flush()) == 3
        assert store.pending == 0
        assert await call(store.flush()) == 0
        assert store.count_pages() == 3
        for i, key in enumerate(keys):
            assert await call(store.get_page(key)) == full_state(key, i + 1)

    @pytest_twisted.ensureDeferred
    async def test_durable_after_close_and_reopen(self, make_store: MakeStore) -> None:
        key = PageKey(SCOPE, URL, "de")
        state = full_state(key, 3, flags=PageFlags.VARY_STAR)
        store = make_store()
        store.stage_page(state)
        store.stage_item(item("a"))
        assert await call(store.flush()) == 2
        await call(store.close())

        store = make_store()
        assert await call(store.get_page(key)) == state
        assert await call(store.get_item_fingerprint(SCOPE, "a")) == "fp-a-1"
        assert store.count_pages() == 1

    @pytest_twisted.ensureDeferred
    async def test_validator_churns_are_kept_with_the_page(self, make_store: MakeStore) -> None:
        key = PageKey(SCOPE, URL)
        state = full_state(key, 2, churns=2, flags=PageFlags.UNSTABLE_VALIDATORS)
        store = make_store()
        store.stage_page(state)
        await call(store.close())
        store = make_store()
        assert await call(store.get_page(key)) == state

    @pytest_twisted.ensureDeferred
    async def test_host_trust_is_kept_with_every_field(self, make_store: MakeStore) -> None:
        trust = HostTrust(
            SCOPE, "example.com", checks=12, lies=7, distrusted_until=1_000_100,
            validators_distrusted_until=1_000_200, validators_consistent=42,
            validators_unstable_since=1_000_300,
        )
        store = make_store()
        store.stage_host(trust)
        store.stage_host(HostTrust("other", "example.com"))
        await call(store.close())
        store = make_store()
        assert await call(store.get_host(SCOPE, "example.com")) == trust
        assert await call(store.get_host("other", "example.com")) == HostTrust(
            "other", "example.com")
        assert await call(store.get_host(SCOPE, "example.org")) is None

    @pytest_twisted.ensureDeferred
    async def test_close_flushes_staged_writes(self, make_store: MakeStore) -> None:
        key = PageKey(SCOPE, URL)
        store = make_store()
        store.stage_item(item("a"))
        store.stage_page(full_state(key))
        await call(store.close())

        store = make_store()
        assert await call(store.get_page(key)) == full_state(key)
        assert await call(store.get_item_fingerprint(SCOPE, "a")) == "fp-a-1"

    @pytest_twisted.ensureDeferred
    async def test_unflushed_writes_are_not_visible_to_another_store(
        self, make_store: MakeStore
    ) -> None:
        # Staged writes live in the store object until a flush: another
        # process (here: another store on the same storage) cannot see them.
        writer = make_store()
        writer.stage_page(full_state(PageKey(SCOPE, URL)))
        reader = make_store()
        assert await call(reader.get_page(PageKey(SCOPE, URL))) is None
        await call(writer.flush())
        assert await call(reader.get_page(PageKey(SCOPE, URL))) == full_state(PageKey(SCOPE, URL))

    @pytest_twisted.ensureDeferred
    async def test_page_staged_twice_in_one_batch_keeps_the_last_state(
        self, make_store: MakeStore
    ) -> None:
        key = PageKey(SCOPE, URL)
        store = make_store()
        store.stage_page(full_state(key, 1))
        store.stage_page(full_state(key, 2))
        assert store.pending == 2
        assert await call(store.get_page(key)) == full_state(key, 2)
        assert await call(store.flush()) == 2
        await call(store.close())

        store = make_store()
        assert await call(store.get_page(key)) == full_state(key, 2)
        assert store.count_pages() == 1

    @pytest_twisted.ensureDeferred
    async def test_stage_check_keeps_validators_and_fingerprint(self, store: StateStore) -> None:
        key = PageKey(SCOPE, URL)
        before = full_state(key, 4)
        store.stage_page(before)
        await call(store.flush())

        store.stage_check(key, 304, 3_000_000)
        assert await call(store.flush()) == 1
        after = await call(store.get_page(key))
        assert after == before.copy(last_status=304, last_checked=3_000_000, checks=5)

        # An error answer is a check too: still nothing but counters.
        store.stage_check(key, 503, 3_000_100)
        await call(store.flush())
        after = await call(store.get_page(key))
        assert after == before.copy(last_status=503, last_checked=3_000_100, checks=6)

    @pytest_twisted.ensureDeferred
    async def test_stage_check_of_unknown_page_creates_row_without_validators(
        self, store: StateStore
    ) -> None:
        key = PageKey(SCOPE, URL)
        store.stage_check(key, 404, 3_000_000)
        assert store.pending == 1
        assert await call(store.flush()) == 1
        state = await call(store.get_page(key))
        assert state is not None
        assert state.key == key
        assert (state.etag, state.last_modified, state.fingerprint) == (None, None, None)
        assert not state.has_validators
        assert state.last_status == 404
        assert state.last_checked == 3_000_000
        assert state.checks == 1
        assert store.count_pages() == 1

    @pytest_twisted.ensureDeferred
    async def test_stage_redirect_sets_target_and_keeps_validators(self, store: StateStore) -> None:
        key = PageKey(SCOPE, URL)
        before = full_state(key, 2)
        store.stage_page(before)
        await call(store.flush())

        store.stage_redirect(key, "https://example.com/b", 301, 3_000_000)
        assert store.pending == 1
        assert await call(store.flush()) == 1
        after = await call(store.get_page(key))
        assert after is not None
        assert after.redirect_to == "https://example.com/b"
        assert after.last_status == 301
        assert after.last_checked == 3_000_000
        assert after.checks == before.checks + 1
        assert after.flags & PageFlags.REDIRECTED
        for field in ("etag", "last_modified", "fingerprint", "size", "first_seen",
                      "last_fetched", "last_changed", "changes"):
            assert getattr(after, field) == getattr(before, field), field

    @pytest_twisted.ensureDeferred
    async def test_stage_redirect_of_unknown_page(self, store: StateStore) -> None:
        key = PageKey(SCOPE, URL)
        store.stage_redirect(key, "https://example.com/b", 308, 3_000_000)
        await call(store.flush())
        state = await call(store.get_page(key))
        assert state is not None
        assert state.redirect_to == "https://example.com/b"
        assert state.last_status == 308
        assert not state.has_validators
        assert state.fingerprint is None

    @pytest_twisted.ensureDeferred
    async def test_scopes_and_variants_are_isolated(self, store: StateStore) -> None:
        keys = [
            PageKey(SCOPE, URL),
            PageKey(SCOPE, URL, "lang=de"),
            PageKey("other", URL),
            PageKey("other", URL, "lang=de"),
        ]
        for n, key in enumerate(keys, start=1):
            store.stage_page(full_state(key, n))
        # Staged, then flushed: isolated either way.
        for n, key in enumerate(keys, start=1):
            assert await call(store.get_page(key)) == full_state(key, n)
        await call(store.flush())
        for n, key in enumerate(keys, start=1):
            assert await call(store.get_page(key)) == full_state(key, n)

        # A check on one key leaves the others alone.
        store.stage_check(keys[1], 304, 3_000_000)
        await call(store.flush())
        for key in keys:
            got = await call(store.get_page(key))
            assert got is not None
            assert got.last_status == (304 if key == keys[1] else 200)
        assert await call(store.get_page(PageKey("third", URL))) is None
        assert await call(store.get_page(PageKey(SCOPE, URL, "lang=fr"))) is None

    @pytest_twisted.ensureDeferred
    async def test_count_pages(self, store: StateStore) -> None:
        for i in range(5):
            store.stage_page(full_state(PageKey(SCOPE, f"{URL}/{i}")))
        for i in range(2):
            store.stage_page(full_state(PageKey("other", f"{URL}/{i}")))
        store.stage_check(PageKey("other", f"{URL}/new"), 404, 3_000_000)
        await call(store.flush())
        assert store.count_pages() == 8
        assert store.count_pages(SCOPE) == 5
        assert store.count_pages("other") == 3
        assert store.count_pages("nobody") == 0

    @pytest_twisted.ensureDeferred
    async def test_pending_counts_staged_writes(self, store: StateStore) -> None:
        assert store.pending == 0
        store.stage_item(item("a"))
        store.stage_page(full_state(PageKey(SCOPE, URL)))
        store.stage_check(PageKey(SCOPE, f"{URL}/x"), 304, 3_000_000)
        store.stage_redirect(PageKey(SCOPE, f"{URL}/y"), URL, 301, 3_000_000)
        assert store.pending == 4
        assert await call(store.flush()) == 4
        assert store.pending == 0

    # -- items ---------------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_item_fingerprint_before_and_after_flush(self, make_store: MakeStore) -> None:
        store = make_store()
        store.stage_item(item("a"))
        assert await call(store.get_item_fingerprint(SCOPE, "a")) == "fp-a-1"
        assert await call(store.get_item_fingerprint("other", "a")) is None
        assert await call(store.get_item_fingerprint(SCOPE, "b")) is None
        assert await call(store.flush()) == 1
        assert await call(store.get_item_fingerprint(SCOPE, "a")) == "fp-a-1"

        store.stage_item(item("a", 2))
        assert await call(store.get_item_fingerprint(SCOPE, "a")) == "fp-a-2"
        await call(store.close())

        store = make_store()
        assert await call(store.get_item_fingerprint(SCOPE, "a")) == "fp-a-2"

    @pytest_twisted.ensureDeferred
    async def test_item_versions_increment_and_history_lists_each(self, store: StateStore) -> None:
        for n in (1, 2, 3):
            store.stage_item(item("a", n))
            await call(store.flush())
        assert store.item_history(SCOPE, "a") == [(1, "fp-a-1"), (2, "fp-a-2"), (3, "fp-a-3")]
        assert store.item_history("other", "a") == []
        assert store.item_history(SCOPE, "b") == []

    @pytest_twisted.ensureDeferred
    async def test_iter_items_latest_version_filtered_by_scope(self, store: StateStore) -> None:
        store.stage_item(item("b", 1, stored_at=100))
        store.stage_item(item("a", 1, stored_at=200))
        store.stage_item(item("c", 1, scope="other", stored_at=150))
        await call(store.flush())
        store.stage_item(item("b", 2, stored_at=300))
        await call(store.flush())

        items = list(store.iter_items(SCOPE))
        # Latest version of each key, oldest key first.
        assert items == [
            {"name": "b", "version": 2, "url": "https://example.com/b", "fingerprint": "fp-b-2"},
            {"name": "a", "version": 1, "url": "https://example.com/a", "fingerprint": "fp-a-1"},
        ]
        assert list(store.iter_items("other")) == [
            {"name": "c", "version": 1, "url": "https://example.com/c", "fingerprint": "fp-c-1"},
        ]
        assert list(store.iter_items("nobody")) == []
        every = list(store.iter_items())
        assert len(every) == 3
        assert {i["fingerprint"] for i in every} == {"fp-a-1", "fp-b-2", "fp-c-1"}

    @pytest_twisted.ensureDeferred
    async def test_item_without_data_keeps_only_its_fingerprint(
        self, make_store: MakeStore,
    ) -> None:
        store = make_store()
        store.stage_item(item("a", data=None))
        assert await call(store.flush()) == 1
        await call(store.close())

        store = make_store()
        assert await call(store.get_item_fingerprint(SCOPE, "a")) == "fp-a-1"
        assert store.item_history(SCOPE, "a") == []
        assert list(store.iter_items(SCOPE)) == [
            {"url": "https://example.com/a", "fingerprint": "fp-a-1"}
        ]

    # -- boundedness ---------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_reading_pages_does_not_load_the_store(self, make_store: MakeStore,
                                                         client_overhead: int) -> None:
        rows = 20_000
        keys = [PageKey(SCOPE, f"https://example.com/catalogue/page-{i:06d}.html")
                for i in range(rows)]
        store = make_store()
        for i, key in enumerate(keys):
            store.stage_page(full_state(key, i + 1))
        assert await call(store.flush()) == rows
        await call(store.close())

        # Loading every row into memory (PageStates with their strings)
        # would take well over 10 MB; 1,000 point reads need almost nothing.
        # The store is opened while tracing, so loading at open counts too.
        picks = random.Random(7).sample(range(rows), 1_000)
        tracemalloc.start()
        try:
            store = make_store()
            for i in picks:
                state = await call(store.get_page(keys[i]))
                assert state is not None and state.fingerprint == f"{i + 1:064x}"
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 3 * 1024 * 1024 + client_overhead, f"peak {peak} bytes for 1,000 reads"
        assert store.count_pages() == rows

    # -- batched reads and lastmod -----------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_get_pages_returns_known_pages_staged_or_flushed(
        self, make_store: MakeStore
    ) -> None:
        store = make_store()
        flushed = [PageKey(SCOPE, f"{URL}/{i}") for i in range(1200)]
        for i, key in enumerate(flushed):
            store.stage_page(full_state(key, i))
        await call(store.flush())
        staged = PageKey(SCOPE, f"{URL}/staged", "de")
        store.stage_page(full_state(staged, 7))
        unknown = PageKey(SCOPE, f"{URL}/unknown")
        other_scope = PageKey("other", f"{URL}/1")
        found = await call(store.get_pages([*flushed, staged, unknown, other_scope]))
        assert set(found) == {*flushed, staged}
        assert found[flushed[1100]] == full_state(flushed[1100], 1100)
        assert found[staged] == full_state(staged, 7)

    @pytest_twisted.ensureDeferred
    async def test_a_check_may_record_a_newer_lastmod_and_nothing_else(
        self, make_store: MakeStore
    ) -> None:
        key = PageKey(SCOPE, URL)
        store = make_store()
        store.stage_page(full_state(key, 1, lastmod=1_000))
        store.stage_check(key, 304, 5_000, lastmod=2_000)
        store.stage_check(key, 304, 6_000)  # no lastmod: keeps the last one
        await call(store.flush())
        await call(store.close())
        state = await call(make_store().get_page(key))
        assert state.lastmod == 2_000
        assert (state.etag, state.fingerprint) == (full_state(key, 1).etag,
                                                   full_state(key, 1).fingerprint)

    @pytest_twisted.ensureDeferred
    async def test_a_check_may_take_up_the_validators_a_304_brought(
        self, make_store: MakeStore
    ) -> None:
        # Stored in their compact forms in Redis (a hex ETag, an IMF-fixdate):
        # a check replaces them with the plain form, or keeps them.
        key, other = PageKey(SCOPE, URL), PageKey(SCOPE, f"{URL}/other")
        store = make_store()
        store.stage_page(full_state(key, 1, etag='"5f3c1a-7d4e"'))
        store.stage_page(full_state(other, 1, etag=None))
        store.stage_check(key, 304, 5_000, validators=(None, "Mon, 07 Nov 1994 08:49:37 GMT"))
        store.stage_check(other, 304, 5_000, validators=('"caf\xe9"', None))
        await call(store.flush())
        store.stage_check(key, 304, 6_000)  # none: both kept
        await call(store.flush())
        await call(store.close())
        found = await call(make_store().get_pages([key, other]))
        assert (found[key].etag, found[key].last_modified) == (
            '"5f3c1a-7d4e"', "Mon, 07 Nov 1994 08:49:37 GMT")
        assert (found[other].etag, found[other].last_modified) == (
            '"caf\xe9"', full_state(other).last_modified)
        assert (found[key].checks, found[key].fingerprint) == (3, full_state(key).fingerprint)

    # -- staging order ----------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_two_versions_of_an_item_in_one_batch_both_reach_history(
        self, make_store: MakeStore
    ) -> None:
        store = make_store()
        store.stage_item(item("k", 1))
        store.stage_item(item("k", 2))
        await call(store.flush())
        assert store.item_history(SCOPE, "k") == [(1, "fp-k-1"), (2, "fp-k-2")]

    @pytest_twisted.ensureDeferred
    async def test_a_later_page_state_wins_over_an_earlier_check_in_one_batch(
        self, make_store: MakeStore
    ) -> None:
        key = PageKey(SCOPE, URL)
        store = make_store()
        store.stage_check(key, 503, 1_000)
        store.stage_page(full_state(key, 5))
        await call(store.flush())
        await call(store.close())
        assert await call(make_store().get_page(key)) == full_state(key, 5)


    # -- revisits, host trust, near-duplicates --------------------------------

    @pytest_twisted.ensureDeferred
    async def test_a_failure_keeps_the_data_and_puts_the_page_on_its_schedule(
        self, store: StateStore
    ) -> None:
        known, new = PageKey(SCOPE, f"{URL}/known"), PageKey(SCOPE, f"{URL}/new")
        lost = PageKey(SCOPE, f"{URL}/no-callback")
        before = full_state(known, 3, next_visit=50_000, interval=3600, callback="parse",
                            recipe='{"p":1}', lastmod=999, churns=1)
        store.stage_page(before)
        await call(store.flush())
        # A known page keeps its callback and recipe; a new one takes those given.
        store.stage_failure(known, 503, 900, failures=1, next_visit=800,
                            callback="other", recipe=None)
        store.stage_failure(new, 0, 900, failures=1, next_visit=700,
                            callback="parse_item", recipe='{"p":2}')
        store.stage_failure(lost, 404, 900, failures=1, next_visit=600)
        await call(store.flush())
        assert await call(store.get_page(known)) == before.copy(
            last_status=503, last_checked=900, checks=4, failures=1, next_visit=800)
        assert await call(store.get_page(new)) == PageState(
            new, last_status=0, first_seen=900, last_checked=900, checks=1, failures=1,
            next_visit=700, callback="parse_item", recipe='{"p":2}')
        # Without a fingerprint, with a callback: due; without a callback: not listed.
        due = await call(store.get_due(SCOPE, 1_000, 10))
        assert [s.key for s in due] == [new, known]
        assert due[0] == await call(store.get_page(new))
        lost_state = await call(store.get_page(lost))
        assert (lost_state.last_status, lost_state.failures, lost_state.callback) == (404, 1, None)

        # Failures in a row are what the caller counted; an answer ends the run.
        store.stage_failure(new, 500, 1_900, failures=2, next_visit=5_000, callback="parse")
        store.stage_check(known, 304, 2_000, schedule=(3600, 9_000))
        await call(store.flush())
        again = await call(store.get_page(new))
        assert (again.failures, again.next_visit, again.checks) == (2, 5_000, 2)
        assert (again.callback, again.recipe, again.first_seen) == ("parse_item", '{"p":2}', 900)
        answered = await call(store.get_page(known))
        assert (answered.failures, answered.last_status, answered.next_visit) == (0, 304, 9_000)
        assert answered.etag == before.etag and answered.fingerprint == before.fingerprint
        assert [s.key for s in await call(store.get_due(SCOPE, 5_000, 10))] == [new]
        assert [s.key for s in await call(store.get_due(SCOPE, 9_000, 10))] == [new, known]

    @pytest_twisted.ensureDeferred
    async def test_get_due_lists_overdue_fetched_pages_most_overdue_first(
        self, store: StateStore
    ) -> None:
        def page(name: str, next_visit: float, **changes: Any) -> PageState:
            fields = {"next_visit": next_visit, "interval": 3600, "callback": "parse", **changes}
            return full_state(PageKey(SCOPE, f"{URL}/{name}"), 1, **fields)

        store.stage_page(page("late", 500))
        store.stage_page(page("later", 100))
        store.stage_page(page("now", 1_000))
        store.stage_page(page("future", 1_001))
        store.stage_page(page("no-callback", 10, callback=None))
        store.stage_page(full_state(PageKey("other", f"{URL}/x"), 1, next_visit=10,
                                    callback="parse"))
        await call(store.flush())
        due = await call(store.get_due(SCOPE, 1_000, 10))
        assert [s.key.url.rsplit("/", 1)[1] for s in due] == ["later", "late", "now"]
        assert due[0] == page("later", 100)
        assert [s.key.url for s in await call(store.get_due(SCOPE, 1_000, 1))] == [f"{URL}/later"]
        assert await call(store.get_due("nobody", 1_000, 10)) == []

        # A check with a schedule moves the page; one without keeps it.
        store.stage_check(PageKey(SCOPE, f"{URL}/later"), 304, 900, schedule=(7200, 5_000))
        store.stage_check(PageKey(SCOPE, f"{URL}/late"), 304, 900)
        await call(store.flush())
        due = await call(store.get_due(SCOPE, 1_000, 10))
        assert [s.key.url.rsplit("/", 1)[1] for s in due] == ["late", "now"]
        moved = await call(store.get_page(PageKey(SCOPE, f"{URL}/later")))
        assert (moved.interval, moved.next_visit, moved.checks) == (7200, 5_000, 2)
        assert moved.fingerprint == page("later", 100).fingerprint
        due = await call(store.get_due(SCOPE, 5_000, 10))
        assert [s.key.url for s in due][-1] == f"{URL}/later"

        # A new state without a callback takes the page off the list.
        store.stage_page(page("now", 1_000, callback=None))
        await call(store.flush())
        due = await call(store.get_due(SCOPE, 1_000, 10))
        assert [s.key.url.rsplit("/", 1)[1] for s in due] == ["late"]

    @pytest_twisted.ensureDeferred
    async def test_summarize_pages_counts_by_next_visit_check_and_callback(
        self, store: StateStore
    ) -> None:
        def page(name: str, next_visit: float, **changes: Any) -> PageState:
            fields = {"next_visit": next_visit, "callback": "parse", "size": 100,
                      "last_checked": 1_000, **changes}
            return full_state(PageKey(SCOPE, f"{URL}/{name}"), 1, **fields)

        store.stage_page(page("due", 500))
        store.stage_page(page("later", 2_000, size=250))
        store.stage_page(page("latest", 3_000))
        store.stage_page(page("checked-now", 2_500, last_checked=5_000))
        store.stage_page(page("a-list", 2_500, callback="parse_list"))
        store.stage_page(page("no-callback", 2_500, callback=None))
        store.stage_page(full_state(PageKey("other", f"{URL}/x"), 1, next_visit=2_000,
                                    callback="parse"))
        await call(store.flush())

        async def summary(after: float, upto: float) -> tuple[int, int, float | None]:
            result = await call(store.summarize_pages(
                SCOPE, after=after, upto=upto, checked_before=4_000,
                exclude_callbacks=("parse_list",)))
            return tuple(result)

        assert await summary(1_000, math.inf) == (2, 350, 2_000)
        assert await summary(-math.inf, 1_000) == (1, 100, 500)
        assert await summary(-math.inf, math.inf) == (3, 450, 500)
        assert await summary(5_000, math.inf) == (0, 0, None)

    @pytest_twisted.ensureDeferred
    async def test_get_due_pages_through_the_due_pages_after_the_last_read(
        self, store: StateStore
    ) -> None:
        # Ties on next_visit included: the order is total, so pages of two
        # follow on without a gap or a repeat.
        for i, next_visit in enumerate((300, 100, 100, 200, 100, 900)):
            store.stage_page(full_state(PageKey(SCOPE, f"{URL}/{i}"), 1,
                                        next_visit=next_visit, callback="parse"))
        store.stage_page(full_state(PageKey(SCOPE, f"{URL}/2", "v"), 1, next_visit=100,
                                    callback="parse"))
        await call(store.flush())
        read: list[str] = []
        after = None
        for _ in range(5):
            due = await call(store.get_due(SCOPE, 500, 2, after))
            read += [s.key.url.rsplit("/", 1)[1] + s.key.variant for s in due]
            if due:
                after = due_after(due[-1])
        assert read == ["1", "2", "2v", "4", "3", "0"]
        # Where a reader stopped need not be a page still due: the order
        # goes on from the place (a page checked since moved on).
        assert [s.key.url.rsplit("/", 1)[1] for s in await call(store.get_due(
            SCOPE, 500, 10, (150, f"{URL}/9", "")))] == ["3", "0"]
        # An infinite bound (recheck all) lists every fetched page.
        every = await call(store.get_due(SCOPE, float("inf"), 10))
        assert [s.key.url.rsplit("/", 1)[1] + s.key.variant for s in every] == [
            "1", "2", "2v", "4", "3", "0", "5"]

    @pytest_twisted.ensureDeferred
    async def test_get_due_pages_on_past_a_page_staged_since_it_was_stored(
        self, store: StateStore
    ) -> None:
        # A page of the crawl staged, not flushed yet, while the re-seeder
        # pages through the due pages: it comes as staged, and the reader
        # passing its place as it came (its staged next visit) misses
        # nothing. (Found by a review: Redis skipped b.)
        for name, next_visit in (("a", 100), ("b", 200), ("c", 300)):
            store.stage_page(full_state(PageKey(SCOPE, f"{URL}/{name}"), 1,
                                        next_visit=next_visit, callback="parse"))
        await call(store.flush())
        store.stage_page(full_state(PageKey(SCOPE, f"{URL}/a"), 2, next_visit=250,
                                    callback="parse"))
        read: list[str] = []
        after = None
        for _ in range(5):
            due = await call(store.get_due(SCOPE, 1_000, 1, after))
            if not due:
                break
            read.append(due[0].key.url.rsplit("/", 1)[1])
            after = due_after(due[-1])
        assert sorted(read) == ["a", "b", "c"], read
        # A first page of results all staged since with a later next visit
        # is not an empty answer while pages after it are due (the reader
        # would take it for the end).
        store.stage_page(full_state(PageKey(SCOPE, f"{URL}/a"), 3, next_visit=5_000,
                                    callback="parse"))
        assert await call(store.get_due(SCOPE, 1_000, 1))

    @pytest_twisted.ensureDeferred
    async def test_summaries_stay_those_of_the_pages_through_every_kind_of_write(
        self, make_store: MakeStore
    ) -> None:
        """A store that keeps sums of its pages (by next visit) keeps them
        right through every write and repair: a summary is always what the
        pages one by one say (a drift would show in a crawl's report)."""
        rng = random.Random(16)
        callbacks = ("parse", "parse", "parse_item", "parse_list", None)
        keys = [PageKey(SCOPE, f"https://h{n % 3}.example.com/p/{n}",
                        "gzip" if n % 11 == 0 else "") for n in range(150)]

        def state(key: PageKey) -> PageState:
            return full_state(key, 1, next_visit=rng.randrange(-1_500, 40_000),
                              last_checked=rng.randrange(0, 6_000),
                              size=rng.randrange(0, 90_000), callback=rng.choice(callbacks))

        store = make_store()
        # A crawl takes the scope before it writes: a store may note its
        # checks from then on (the summaries below leave them out).
        assert store.take_scope(SCOPE, "a crawl", 60, now=0) is None
        for key in keys:
            store.stage_page(state(key))
        store.stage_page(full_state(PageKey("other", "https://h0.example.com/x"), 1,
                                    next_visit=100, callback="parse"))
        await call(store.flush())

        # Every range between two cuts (the sums' minute and second fields
        # on both sides of each), each with one of the twelve pairs of a
        # checks cut and callbacks left out, in turn; the whole range with
        # every pair; and ranges upside down (empty). Not the full product
        # (1,200 summaries a check: minutes on a cluster, for no more cuts).
        cuts = (-math.inf, -601, 0, 599, 600, 1_199, 7_777, 20_000, 39_999, math.inf)
        pairs = [(before, excluded) for before in (-math.inf, 2_500, 5_999, math.inf)
                 for excluded in ((), ("parse_list",), ("parse_list", "parse_item"))]
        ranges = [(after, upto) for after in cuts for upto in cuts if after <= upto]
        asked = [(*span, *pairs[n % len(pairs)]) for n, span in enumerate(ranges)]
        asked += [(-math.inf, math.inf, *pair) for pair in pairs]
        asked += [(600, 0, *pairs[4]), (math.inf, -math.inf, *pairs[11]), (7_777, 7_776, *pairs[7])]

        async def check(store: StateStore) -> None:
            states = list(store.iter_pages(SCOPE))
            for after, upto, before, excluded in asked:
                got = await call(store.summarize_pages(
                    SCOPE, after=after, upto=upto, checked_before=before,
                    exclude_callbacks=excluded))
                assert tuple(got) == brute_summary(states, after, upto, before, excluded), (
                    after, upto, before, excluded)

        await check(store)
        # Every kind of write moves pages between times, callbacks and sizes.
        for n, key in enumerate(keys):
            match n % 6:
                case 0:
                    store.stage_page(state(key))
                case 1:
                    store.stage_check(key, 304, rng.randrange(0, 6_000),
                                      schedule=(3_600, rng.randrange(0, 40_000)))
                case 2:
                    store.stage_failure(key, 503, rng.randrange(0, 6_000), failures=2,
                                        next_visit=rng.randrange(0, 40_000),
                                        callback="parse")
                case 3:
                    store.stage_redirect(key, "https://h0.example.com/", 301, 4_000)
                case 4:
                    store.stage_flags(key, PageFlags.GONE)
                case _:
                    store.stage_check(key, 304, 5_500)
        for n in range(5):  # new pages, by a failure and by a check
            store.stage_failure(PageKey(SCOPE, f"https://h1.example.com/new/{n}"), 0, 5_000,
                                failures=1, next_visit=9_000 + n, callback="parse")
            store.stage_check(PageKey(SCOPE, f"https://h1.example.com/checked/{n}"), 304, 5_000,
                              schedule=(60, 9_100 + n))
        await call(store.flush())
        await check(store)
        assert isinstance(store, AdminStore)
        store.forget_page(SCOPE, keys[0].url)  # both variants
        store.forget_page(SCOPE, keys[7].url)
        store.forget_host(SCOPE, "h2.example.com")
        await check(store)
        await call(store.close())
        store = make_store()  # what was stored, read again
        await check(store)
        store.reset_scope(SCOPE)
        assert tuple(await call(store.summarize_pages(
            SCOPE, after=-math.inf, upto=math.inf, checked_before=math.inf))) == (0, 0, None)
        assert tuple(await call(store.summarize_pages(
            "other", after=-math.inf, upto=math.inf, checked_before=math.inf))) == (1, 1001, 100)

    @pytest_twisted.ensureDeferred
    async def test_host_trust_round_trip(self, make_store: MakeStore) -> None:
        store = make_store()
        assert await call(store.get_host(SCOPE, "example.com")) is None
        trust = HostTrust(SCOPE, "example.com", checks=12, lies=7, distrusted_until=5_000,
                          validators_distrusted_until=6_000, stale_lastmods=2)
        store.stage_host(trust)
        store.stage_host(HostTrust("other", "example.com", checks=1))
        assert store.pending == 2
        assert await call(store.flush()) == 2
        assert await call(store.get_host(SCOPE, "example.com")) == trust
        store.stage_host(HostTrust(SCOPE, "example.com", checks=3))
        await call(store.close())

        store = make_store()
        assert await call(store.get_host(SCOPE, "example.com")) == HostTrust(
            SCOPE, "example.com", checks=3)
        assert await call(store.get_host("other", "example.com")) == HostTrust(
            "other", "example.com", checks=1)
        assert await call(store.get_host(SCOPE, "example.org")) is None

    @pytest_twisted.ensureDeferred
    async def test_item_simhash_is_the_latest_versions(self, store: StateStore) -> None:
        # A full signed 64-bit SimHash survives (no float rounding on the way).
        big = -(2**63) + 12345
        record = item("a")
        record.simhash = big
        store.stage_item(record)
        store.stage_item(item("b"))
        await call(store.flush())
        assert await call(store.get_item_simhash(SCOPE, "a")) == big
        assert await call(store.get_item_simhash(SCOPE, "b")) is None
        assert await call(store.get_item_simhash(SCOPE, "c")) is None
        assert await call(store.get_item_simhash("other", "a")) is None
        newer = item("a", 2)
        newer.simhash = 42
        store.stage_item(newer)
        await call(store.flush())
        assert await call(store.get_item_simhash(SCOPE, "a")) == 42

    @pytest_twisted.ensureDeferred
    async def test_odd_scopes_keys_and_variants_stay_apart(self, make_store: MakeStore) -> None:
        # Separators a backend might use inside its own keys.
        pairs = [("a:b", "c"), ("a", "b:c"), ("a%3Ab", "c"), ("ü *?", "k\n")]
        store = make_store()
        for n, (scope, key) in enumerate(pairs, start=1):
            store.stage_item(item(key, n, scope=scope))
        pages = [PageKey("a:b", URL), PageKey("a", URL, "b"), PageKey("a", URL, "x\0y:z"),
                 PageKey("a", URL)]
        for n, key in enumerate(pages, start=1):
            store.stage_page(full_state(key, n))
        await call(store.flush())
        await call(store.close())

        store = make_store()
        for n, (scope, key) in enumerate(pairs, start=1):
            assert await call(store.get_item_fingerprint(scope, key)) == f"fp-{key}-{n}"
            assert store.item_history(scope, key) == [(1, f"fp-{key}-{n}")]
            assert [i["fingerprint"] for i in store.iter_items(scope)] == [f"fp-{key}-{n}"]
        for n, key in enumerate(pages, start=1):
            assert await call(store.get_page(key)) == full_state(key, n)
        found = await call(store.get_pages(pages))
        assert found == {key: full_state(key, n) for n, key in enumerate(pages, start=1)}
        assert store.count_pages("a") == 3
        assert store.count_pages() == 4

    # -- links records and recipes (replay on 304, re-seeding) ---------------

    @pytest_twisted.ensureDeferred
    async def test_links_round_trip_staged_and_flushed(self, make_store: MakeStore) -> None:
        # As large as a record gets (a thousand requests), with text a
        # backend might mangle: non-ASCII, quotes, escapes, a NUL.
        requests = [{"url": f"https://example.com/é/{i}?q=\"x\"", "cb": "parse", "n": i}
                    for i in range(1_000)]
        data = json.dumps(requests, ensure_ascii=False) + "\0"
        keys = [PageKey(SCOPE, URL), PageKey(SCOPE, URL, "de"), PageKey("other", URL),
                PageKey("a:b", URL, "x\0y:z")]
        store = make_store()
        for n, key in enumerate(keys):
            store.stage_links(key, f"{data}{n}")
        assert store.pending == len(keys)
        # Staged records are what reads see, as staged page states are.
        for n, key in enumerate(keys):
            assert await call(store.get_links(key)) == f"{data}{n}"
        assert await call(store.get_links(PageKey(SCOPE, URL, "fr"))) is None
        assert await call(store.flush()) == len(keys)
        for n, key in enumerate(keys):
            assert await call(store.get_links(key)) == f"{data}{n}"
        await call(store.close())

        store = make_store()
        for n, key in enumerate(keys):
            assert await call(store.get_links(key)) == f"{data}{n}"
        assert await call(store.get_links(PageKey("third", URL))) is None
        # A links record is not a page.
        assert store.count_pages() == 0
        assert await call(store.get_page(keys[0])) is None

    @pytest_twisted.ensureDeferred
    async def test_links_none_deletes_and_the_last_staged_wins(
        self, make_store: MakeStore,
    ) -> None:
        a, b, c = (PageKey(SCOPE, f"{URL}/{name}") for name in "abc")
        store = make_store()
        store.stage_links(a, '["a1"]')
        store.stage_links(b, '["b1"]')
        store.stage_links(c, '["c1"]')
        await call(store.flush())

        store.stage_links(a, None)
        assert await call(store.get_links(a)) is None  # a staged deletion shows at once
        store.stage_links(b, None)
        store.stage_links(b, '["b2"]')
        store.stage_links(c, '["c2"]')
        store.stage_links(c, None)
        store.stage_links(PageKey(SCOPE, f"{URL}/never"), None)  # nothing to delete
        assert store.pending == 6
        assert [await call(store.get_links(k)) for k in (a, b, c)] == [None, '["b2"]', None]
        assert await call(store.flush()) == 6
        await call(store.close())

        store = make_store()
        assert [await call(store.get_links(k)) for k in (a, b, c)] == [None, '["b2"]', None]

    @pytest_twisted.ensureDeferred
    async def test_links_of_several_pages_read_at_once_as_one_by_one(
        self, make_store: MakeStore,
    ) -> None:
        a, b, c, d = (PageKey(SCOPE, f"{URL}/{name}") for name in "abcd")
        # Other hosts, another scope, a variant: read in the same call.
        e = PageKey(SCOPE, "http://other.example/e")
        f = PageKey("another-scope", f"{URL}/a")
        g = PageKey(SCOPE, f"{URL}/a", "ae=identity")
        store = make_store()
        for key, record in ((a, '["a1"]'), (b, '["b1"]'), (e, '["e1"]'), (f, '["f1"]'),
                            (g, '["g1"]')):
            store.stage_links(key, record)
        await call(store.flush())
        store.stage_links(b, None)  # staged: shows at once
        store.stage_links(c, '["c1"]')
        keys = [a, b, c, d, e, f, g]
        one_by_one = {key: await call(store.get_links(key)) for key in keys}
        assert one_by_one == {a: '["a1"]', b: None, c: '["c1"]', d: None, e: '["e1"]',
                              f: '["f1"]', g: '["g1"]'}
        assert await call(store.get_links_many(keys)) == one_by_one
        assert await call(store.get_links_many([])) == {}
        await call(store.close())

    @pytest_twisted.ensureDeferred
    async def test_links_and_the_page_state_staged_after_them_commit_together(
        self, make_store: MakeStore, failing_flush: FailingFlush,
    ) -> None:
        # The ledger's order for a page: its items, its links, its state.
        key = PageKey(SCOPE, URL)
        state = full_state(key, 2, flags=PageFlags.LINKS_KNOWN | PageFlags.HAS_LINKS,
                           recipe='{"priority":3}')
        store = make_store()
        store.stage_item(item("a"))
        store.stage_links(key, '["https://example.com/b"]')
        store.stage_page(state)
        with failing_flush(), pytest.raises(StateStoreError):
            await call(store.flush())
        # Nothing of it was committed...
        reader = make_store()
        assert await call(reader.get_links(key)) is None
        assert await call(reader.get_page(key)) is None
        assert await call(reader.get_item_fingerprint(SCOPE, "a")) is None
        # ...and all of it is still staged, visible to the writer's reads.
        assert store.pending == 3
        assert await call(store.get_links(key)) == '["https://example.com/b"]'
        assert await call(store.get_page(key)) == state

        assert await call(store.flush()) == 3
        assert await call(reader.get_links(key)) == '["https://example.com/b"]'
        assert await call(reader.get_page(key)) == state
        assert await call(reader.get_item_fingerprint(SCOPE, "a")) == "fp-a-1"

    @pytest_twisted.ensureDeferred
    async def test_stage_flags_ors_into_a_stored_page_and_touches_nothing_else(
        self, make_store: MakeStore,
    ) -> None:
        key = PageKey(SCOPE, URL)
        before = full_state(key, 3, flags=PageFlags.VARY_STAR, churns=2, lastmod=900,
                            interval=3600, next_visit=500, callback="parse",
                            recipe='{"meta":{"depth":2}}', redirect_to=f"{URL}/r")
        store = make_store()
        store.stage_page(before)
        await call(store.flush())

        store.stage_flags(key, PageFlags.LINKS_KNOWN | PageFlags.HAS_LINKS)
        assert store.pending == 1
        assert await call(store.flush()) == 1
        flags = PageFlags.VARY_STAR | PageFlags.LINKS_KNOWN | PageFlags.HAS_LINKS
        assert await call(store.get_page(key)) == before.copy(flags=flags)
        # A flag already set stays set; OR never clears one.
        store.stage_flags(key, PageFlags.LINKS_INCOMPLETE | PageFlags.VARY_STAR)
        await call(store.close())

        store = make_store()
        after = await call(store.get_page(key))
        assert after == before.copy(flags=flags | PageFlags.LINKS_INCOMPLETE)
        # Still due where it was: the revisit index is left alone too.
        assert await call(store.get_due(SCOPE, 1_000, 10)) == [after]

    @pytest_twisted.ensureDeferred
    async def test_stage_listing_sets_a_stored_page_s_listing_and_touches_nothing_else(
        self, make_store: MakeStore,
    ) -> None:
        key = PageKey(SCOPE, URL)
        unknown = PageKey(SCOPE, f"{URL}/unknown")
        staged = PageKey(SCOPE, f"{URL}/staged")
        before = full_state(key, 3, flags=PageFlags.LASTMOD_MODIFIED, lastmod=900,
                            interval=3600, next_visit=500, callback="parse",
                            recipe='{"meta":{"depth":2}}', listing="0123456789abcdef")
        store = make_store()
        store.stage_page(before)
        await call(store.flush())
        assert await call(store.get_page(key)) == before  # the field round-trips

        store.stage_listing(key, "fedcba9876543210")
        store.stage_listing(unknown, "fedcba9876543210")
        # A state staged before it shows it at once.
        store.stage_page(full_state(staged, 1))
        store.stage_listing(staged, "00000000000000aa")
        assert (await call(store.get_page(staged))).listing == "00000000000000aa"
        assert await call(store.flush()) == 4
        await call(store.close())

        store = make_store()
        after = await call(store.get_page(key))
        assert after == before.copy(listing="fedcba9876543210")
        assert (await call(store.get_page(staged))).listing == "00000000000000aa"
        assert await call(store.get_page(unknown)) is None
        # Still due where it was: the revisit index is left alone.
        assert await call(store.get_due(SCOPE, 1_000, 10)) == [after]

    @pytest_twisted.ensureDeferred
    async def test_stage_flags_of_an_unknown_page_does_nothing(
        self, make_store: MakeStore,
    ) -> None:
        store = make_store()
        unknown = PageKey(SCOPE, f"{URL}/unknown")
        store.stage_page(full_state(PageKey(SCOPE, URL)))
        store.stage_flags(unknown, PageFlags.LINKS_INCOMPLETE)
        assert await call(store.get_page(unknown)) is None
        assert await call(store.flush()) == 2
        await call(store.close())

        store = make_store()
        assert await call(store.get_page(unknown)) is None
        assert store.count_pages() == 1

    @pytest_twisted.ensureDeferred
    async def test_stage_flags_follows_staging_order(self, make_store: MakeStore) -> None:
        staged = PageKey(SCOPE, f"{URL}/staged")
        checked = PageKey(SCOPE, f"{URL}/checked")
        late = PageKey(SCOPE, f"{URL}/late")
        store = make_store()
        # A state staged before the flags: reads see the flags at once.
        store.stage_page(full_state(staged, 1))
        store.stage_flags(staged, PageFlags.LINKS_KNOWN)
        assert (await call(store.get_page(staged))).flags == PageFlags.LINKS_KNOWN
        # A check creates the page, then the flags apply to it.
        store.stage_check(checked, 404, 3_000_000)
        store.stage_flags(checked, PageFlags.LINKS_INCOMPLETE)
        # Flags staged before the page exists are lost with nothing to apply to.
        store.stage_flags(late, PageFlags.LINKS_INCOMPLETE)
        store.stage_page(full_state(late, 1))
        await call(store.flush())
        await call(store.close())

        store = make_store()
        assert await call(store.get_page(staged)) == full_state(
            staged, 1, flags=PageFlags.LINKS_KNOWN)
        got = await call(store.get_page(checked))
        assert (got.flags, got.last_status, got.checks) == (PageFlags.LINKS_INCOMPLETE, 404, 1)
        assert await call(store.get_page(late)) == full_state(late, 1)

    @pytest_twisted.ensureDeferred
    async def test_recipe_is_kept_with_the_page_and_defaults_to_none(
        self, make_store: MakeStore,
    ) -> None:
        assert PageState(PageKey(SCOPE, URL)).recipe is None
        recipe = json.dumps({"meta": {"lang": "é", "path": "/a\\b"}, "cb_kwargs": {"n": 2**62},
                             "errback": "failed", "priority": -3}, ensure_ascii=False)
        with_recipe = PageKey(SCOPE, f"{URL}/with")
        without = PageKey(SCOPE, f"{URL}/without")
        state = full_state(with_recipe, 1, callback="parse", next_visit=10, recipe=recipe)
        store = make_store()
        store.stage_page(state)
        store.stage_page(full_state(without, 2))
        assert (await call(store.get_page(with_recipe))).recipe == recipe
        await call(store.flush())
        # Checks, redirects and flags rewrite the record around it (in
        # Redis, in Lua): the recipe comes through each untouched.
        store.stage_check(with_recipe, 304, 3_000_000)
        store.stage_redirect(with_recipe, f"{URL}/elsewhere", 301, 3_000_001)
        store.stage_flags(with_recipe, PageFlags.HAS_LINKS)
        await call(store.close())

        store = make_store()
        got = await call(store.get_page(with_recipe))
        assert got.recipe == recipe
        assert got.checks == state.checks + 2
        assert (await call(store.get_page(without))).recipe is None
        found = await call(store.get_pages([with_recipe, without]))
        assert (found[with_recipe].recipe, found[without].recipe) == (recipe, None)
        assert [s.recipe for s in await call(store.get_due(SCOPE, 1_000, 10))] == [recipe]

    @pytest_twisted.ensureDeferred
    async def test_page_reads_never_load_links(self, make_store: MakeStore) -> None:
        # 40 pages with a 150 kB links record each (6 MB): reading every
        # page, or one page's links, must not bring the others' links along.
        keys = [PageKey(SCOPE, f"{URL}/{i:03d}") for i in range(40)]
        big = [json.dumps([f"https://example.com/{i}/{n:05d}" for n in range(5_000)])
               for i in range(len(keys))]
        assert all(len(data) > 150_000 for data in big)
        store = make_store()
        for key, data in zip(keys, big, strict=True):
            store.stage_links(key, data)
            store.stage_page(full_state(key, 1, callback="parse", next_visit=10,
                                        flags=PageFlags.LINKS_KNOWN | PageFlags.HAS_LINKS))
        await call(store.flush())
        await call(store.close())

        store = make_store()
        assert await call(store.get_page(keys[0])) is not None  # connected, warmed up
        tracemalloc.start()
        try:
            found = await call(store.get_pages(keys))
            for key in keys:
                assert await call(store.get_page(key)) == found[key]
            due = await call(store.get_due(SCOPE, 1_000, 100))
            _, pages_peak = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            assert await call(store.get_links(keys[7])) == big[7]
            _, links_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(found) == len(due) == len(keys)
        assert pages_peak < 1024 * 1024, f"peak {pages_peak} bytes to read 40 pages"
        assert links_peak < 1536 * 1024, f"peak {links_peak} bytes to read one links record"

    # -- the change feed -----------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_change_types_are_stored_and_read_back(self, make_store: MakeStore) -> None:
        store = make_store()
        tombstone = {"url": "https://example.com/a", "change": "deleted"}
        store.stage_item(item("a", 1, stored_at=100))
        store.stage_item(item("b", 1, stored_at=150))
        await call(store.flush())
        store.stage_item(item("a", 2, stored_at=200, change=Change.CHANGED))
        store.stage_item(item("a", 3, stored_at=300, change=Change.DELETED, data=tombstone))
        store.stage_item(item("a", 4, stored_at=400))  # back: new again
        await call(store.close())

        store = make_store()
        assert list(store.iter_versions(SCOPE, every_version=True)) == [
            StoredVersion(SCOPE, "a", 1, "new", 100, "fp-a-1", {"name": "a", "version": 1}),
            StoredVersion(SCOPE, "b", 1, "new", 150, "fp-b-1", {"name": "b", "version": 1}),
            StoredVersion(SCOPE, "a", 2, "changed", 200, "fp-a-2",
                          {"name": "a", "version": 2}),
            StoredVersion(SCOPE, "a", 3, "deleted", 300, "", tombstone),
            StoredVersion(SCOPE, "a", 4, "new", 400, "fp-a-4", {"name": "a", "version": 4}),
        ]
        assert store.item_history(SCOPE, "a") == [
            (1, "fp-a-1"), (2, "fp-a-2"), (3, ""), (4, "fp-a-4")]

    @pytest_twisted.ensureDeferred
    async def test_history_keeps_the_limits_newest_versions(self, make_store: MakeStore) -> None:
        store = make_store(history_limit=3)
        assert store.history_limit == 3
        for n in (1, 2):
            store.stage_item(item("a", n))
            await call(store.flush())
        assert store.item_history(SCOPE, "a") == [(1, "fp-a-1"), (2, "fp-a-2")]
        # Several versions in one flush are pruned as each is written.
        for n in (3, 4, 5):
            store.stage_item(item("a", n))
        store.stage_item(item("b", 1))
        await call(store.flush())
        assert store.item_history(SCOPE, "a") == [(3, "fp-a-3"), (4, "fp-a-4"), (5, "fp-a-5")]
        assert store.item_history(SCOPE, "b") == [(1, "fp-b-1")]
        # A version without data uses a number: the limit counts numbers.
        store.stage_item(item("a", 6, data=None))
        store.stage_item(item("a", 7))
        await call(store.close())
        assert make_store().item_history(SCOPE, "a") == [(5, "fp-a-5"), (7, "fp-a-7")]

        # A lower limit takes effect at the item's next version.
        store = make_store(history_limit=1)
        store.stage_item(item("a", 8))
        await call(store.close())
        assert make_store().item_history(SCOPE, "a") == [(8, "fp-a-8")]
        assert make_store().item_history(SCOPE, "b") == [(1, "fp-b-1")]

        # 0 keeps every version.
        store = make_store(history_limit=0)
        for n in range(1, 13):
            store.stage_item(item("c", n))
        await call(store.flush())
        assert store.item_history(SCOPE, "c") == [(n, f"fp-c-{n}") for n in range(1, 13)]

    @pytest_twisted.ensureDeferred
    async def test_a_tombstone_makes_the_item_unknown_until_it_comes_back(
        self, make_store: MakeStore,
    ) -> None:
        listing = "https://example.com/list"
        odd = 'https://example.com/q"uote\\back/slash'  # JSON needs escapes
        store = make_store()
        store.stage_item(item(listing))  # keyed by its page's URL
        for key in ("x", odd):
            store.stage_item(item(key, page=listing))
        store.stage_item(item("z", page="https://example.com/other"))
        await call(store.flush())
        assert await call(store.get_page_items(SCOPE, listing)) == sorted([listing, "x", odd])
        assert await call(store.get_page_items(SCOPE, "https://example.com/other")) == ["z"]
        assert await call(store.get_page_items(SCOPE, "https://example.com/none")) == []
        assert await call(store.get_page_items("other", listing)) == []

        tombstone = {"url": "https://example.com/x", "change": "deleted"}
        store.stage_item(item("x", 2, page=listing, change=Change.DELETED, data=tombstone))
        store.stage_item(item(listing, 2, change=Change.DELETED, data=tombstone))
        # Unknown at once (staged), and after the flush.
        assert await call(store.get_item_fingerprint(SCOPE, "x")) is None
        await call(store.close())
        store = make_store()
        assert await call(store.get_item_fingerprint(SCOPE, "x")) is None
        assert await call(store.get_item_fingerprint(SCOPE, listing)) is None
        assert await call(store.get_item_fingerprint(SCOPE, odd)) == f"fp-{odd}-1"
        assert await call(store.get_page_items(SCOPE, listing)) == [odd]
        assert sorted(i["fingerprint"] for i in store.iter_items(SCOPE)) == sorted(
            [f"fp-{odd}-1", "fp-z-1"])

        # A later version of the item is read again.
        store.stage_item(item("x", 3, page=listing))
        await call(store.flush())
        assert await call(store.get_item_fingerprint(SCOPE, "x")) == "fp-x-3"
        assert await call(store.get_page_items(SCOPE, listing)) == sorted(["x", odd])
        assert sorted(i["fingerprint"] for i in store.iter_items(SCOPE)) == sorted(
            ["fp-x-3", f"fp-{odd}-1", "fp-z-1"])

    @pytest_twisted.ensureDeferred
    async def test_an_item_that_moves_leaves_the_first_pages_list(
        self, make_store: MakeStore,
    ) -> None:
        first, second = "https://example.com/p1", "https://example.com/p2"
        store = make_store()
        store.stage_item(item("m", 1, page=first))
        store.stage_item(item("n", 1, page=first))
        await call(store.flush())
        assert await call(store.get_page_items(SCOPE, first)) == ["m", "n"]

        store.stage_item(item("m", 2, page=second))
        await call(store.flush())
        assert await call(store.get_page_items(SCOPE, first)) == ["n"]
        assert await call(store.get_page_items(SCOPE, second)) == ["m"]

        # Twice in one flush; then to the page of its own key (stored
        # without a page, or naming it).
        store.stage_item(item("n", 2, page=second))
        store.stage_item(item("n", 3, page=first))
        store.stage_item(item("m", 3))
        store.stage_item(item("k", 1, page=first))
        store.stage_item(item("k", 2, page="k"))
        await call(store.close())
        store = make_store()
        assert await call(store.get_page_items(SCOPE, first)) == ["n"]
        assert await call(store.get_page_items(SCOPE, second)) == []
        assert await call(store.get_page_items(SCOPE, "m")) == ["m"]
        assert await call(store.get_page_items(SCOPE, "k")) == ["k"]

        # An item keyed by a page's URL but last stored from another page
        # belongs to that other page.
        store.stage_item(item(first, 1, page=second))
        await call(store.flush())
        assert await call(store.get_page_items(SCOPE, first)) == ["n"]
        assert await call(store.get_page_items(SCOPE, second)) == [first]

    @pytest_twisted.ensureDeferred
    async def test_iter_versions_since_and_every_version(self, store: StateStore) -> None:
        def at(key: str, n: int, when: float, *, scope: str = SCOPE,
               data: Any = ...) -> ItemRecord:
            return item(key, n, stored_at=when, scope=scope, data=data,
                        change=Change.NEW if n == 1 else Change.CHANGED)

        for record in (at("a", 1, 100), at("d", 1, 100), at("b", 1, 200), at("a", 2, 300),
                       at("c", 1, 300, scope="other"), at("b", 2, 400), at("a", 3, 500),
                       at("d", 2, 600, data=None)):
            store.stage_item(record)
        await call(store.flush())

        def versions(scope: str | None = SCOPE, **options: Any) -> list[tuple[str, int, str]]:
            return [(v.key, v.version, v.change)
                    for v in store.iter_versions(scope, **options)]

        # Ties on stored_at by scope, key, then version; d's latest version
        # has no data: it is not listed as the latest.
        assert versions(every_version=True) == [
            ("a", 1, "new"), ("d", 1, "new"), ("b", 1, "new"), ("a", 2, "changed"),
            ("b", 2, "changed"), ("a", 3, "changed")]
        assert versions() == [("b", 2, "changed"), ("a", 3, "changed")]
        assert versions(since=350, every_version=True) == [
            ("b", 2, "changed"), ("a", 3, "changed")]
        assert versions(since=300, every_version=True) == [
            ("a", 2, "changed"), ("b", 2, "changed"), ("a", 3, "changed")]
        # Stored times are whole seconds: a window from 400.5 starts at 400
        # (b's version of 400 may have been stored after 400.5).
        assert versions(since=400.5) == [("b", 2, "changed"), ("a", 3, "changed")]
        assert versions(since=400.5, every_version=True) == versions(since=400)
        assert versions(since=500.999) == [("a", 3, "changed")]
        assert versions(since=501) == []
        assert versions(None, since=300, every_version=True) == [
            ("a", 2, "changed"), ("c", 1, "new"), ("b", 2, "changed"), ("a", 3, "changed")]
        assert [v.scope for v in store.iter_versions(None, since=300, every_version=True)] == [
            SCOPE, "other", SCOPE, SCOPE]
        assert versions("nobody", every_version=True) == []
        latest = list(store.iter_versions(SCOPE, since=450))
        assert latest == [StoredVersion(SCOPE, "a", 3, "changed", 500, "fp-a-3",
                                        {"name": "a", "version": 3})]

    @pytest_twisted.ensureDeferred
    async def test_latest_since_is_new_for_items_not_live_before_it(
        self, make_store: MakeStore,
    ) -> None:
        """A reader that has what was stored before *since* never saw an
        item first stored (or back) after it: its latest version is new to
        it, however often it changed since; even once its history no longer
        holds the new version."""
        store = make_store(history_limit=1)

        def at(key: str, n: int, when: float, change: Change) -> ItemRecord:
            return item(key, n, stored_at=when, change=change)

        new, changed, deleted = Change.NEW, Change.CHANGED, Change.DELETED
        for record in (
            at("fresh", 1, 200, new), at("fresh", 2, 300, changed),
            at("old", 1, 100, new), at("old", 2, 300, changed),
            at("back", 1, 100, new), at("back", 2, 120, deleted), at("back", 3, 200, new),
            at("back", 4, 300, changed),
            at("gone", 1, 200, new), at("gone", 2, 300, deleted),
            at("again", 1, 100, new), at("again", 2, 250, deleted), at("again", 3, 260, new),
            at("again", 4, 300, changed),
        ):
            store.stage_item(record)
        await call(store.flush())

        def latest(**options: Any) -> dict[str, tuple[int, str]]:
            return {v.key: (v.version, v.change) for v in store.iter_versions(SCOPE, **options)}

        assert latest(since=150) == {
            "fresh": (2, "new"), "old": (2, "changed"), "back": (4, "new"),
            "gone": (2, "deleted"),
            # Live before the window: its tombstone in the window, then back.
            "again": (4, "changed"),
        }
        # Every item was live before 250 but "again", gone at 250.
        assert latest(since=250) == {
            "fresh": (2, "changed"), "old": (2, "changed"), "back": (4, "changed"),
            "gone": (2, "deleted"), "again": (4, "changed")}
        assert latest(since=255)["again"] == (4, "new")
        # Without a window, or with every version: each version's own change.
        assert latest()["fresh"] == (2, "changed")
        assert latest(since=150, every_version=True)["fresh"] == (2, "changed")

    @pytest_twisted.ensureDeferred
    async def test_an_empty_page_is_the_page_of_the_key(self, store: StateStore) -> None:
        store.stage_item(item("a", page=""))
        await call(store.flush())
        assert await call(store.get_page_items(SCOPE, "a")) == ["a"]
        assert await call(store.get_page_items(SCOPE, "")) == []
        assert store.url_record(SCOPE, "a").items == ["a"]

    @pytest_twisted.ensureDeferred
    async def test_gone_pages_are_due_at_their_next_visit(self, store: StateStore) -> None:
        """A gone page is rechecked rarely, not never: it is in get_due (and
        summarize_pages) once its next visit is due, like any page."""
        def page(name: str, **changes: Any) -> PageState:
            fields = {"next_visit": 500, "callback": "parse", "size": 100,
                      "last_checked": 100, **changes}
            return full_state(PageKey(SCOPE, f"{URL}/{name}"), 1, **fields)

        live = page("live")
        gone = page("gone", flags=PageFlags.GONE, next_visit=5_000)
        flagged = page("flagged", next_visit=400)
        for state in (live, gone, flagged):
            store.stage_page(state)
        await call(store.flush())
        store.stage_flags(flagged.key, PageFlags.GONE)  # nothing else changes
        await call(store.flush())

        async def due(now: float) -> list[str]:
            listed = await call(store.get_due(SCOPE, now, 10))
            return [s.key.url.rsplit("/", 1)[1] for s in listed]

        async def summary(upto: float) -> tuple[int, int, float | None]:
            return tuple(await call(store.summarize_pages(
                SCOPE, after=-math.inf, upto=upto, checked_before=math.inf)))

        assert await due(1_000) == ["flagged", "live"]
        assert await due(4_999) == ["flagged", "live"]
        assert await due(5_000) == ["flagged", "live", "gone"]
        assert await due(math.inf) == ["flagged", "live", "gone"]
        assert await summary(1_000) == (2, 200, 400)
        assert await summary(math.inf) == (3, 300, 400)
        assert (await call(store.get_page(flagged.key))).flags & PageFlags.GONE

        # Checks and failures move them in the index as they move any page.
        store.stage_check(gone.key, 304, 900, schedule=(3600, 9_000))
        store.stage_failure(flagged.key, 404, 1_000, failures=2, next_visit=6_000,
                            callback="parse")
        await call(store.flush())
        assert await due(5_000) == ["live"]
        assert await due(6_000) == ["live", "flagged"]
        assert await due(math.inf) == ["live", "flagged", "gone"]
        assert await summary(math.inf) == (3, 300, 500)
        stored = await call(store.get_page(flagged.key))
        assert (stored.next_visit, stored.failures, stored.checks) == (6_000, 2, 2)
        assert stored.flags & PageFlags.GONE

        # Still gone when rechecked: stored again, due a recheck later.
        store.stage_page(page("gone", flags=PageFlags.GONE, next_visit=20_000))
        await call(store.flush())
        assert await due(19_999) == ["live", "flagged"]
        # A page that answers again is stored without the flag, due as any.
        store.stage_page(page("gone", next_visit=200))
        await call(store.flush())
        assert await due(1_000) == ["gone", "live"]
        assert await summary(1_000) == (2, 200, 200)

    # -- delivery of item versions ---------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_versions_wait_on_their_crawl_until_it_confirms_them(
        self, store: StateStore, make_store: MakeStore,
    ) -> None:
        async def waiting(crawl: str, limit: int = 500) -> list[tuple[str, int, str]]:
            """(key, version, change) of what waits on *crawl*, read *limit* at a time."""
            found, after = [], None
            while chunk := await call(store.undelivered(SCOPE, crawl, after=after,
                                                        limit=limit)):
                found += [(p.version.key, p.version.version, p.version.change) for p in chunk]
                assert all(p.crawl == crawl for p in chunk)
                after = chunk[-1]
            return found

        def delivered_by(record: ItemRecord, crawl: str | None) -> ItemRecord:
            record.delivery = crawl
            return record

        store.stage_item(delivered_by(item("b", 1, stored_at=2_000_010), "c1"))
        store.stage_item(delivered_by(item("a", 1, stored_at=2_000_010), "c1"))
        store.stage_item(delivered_by(item("a", 2, stored_at=2_000_020, change=Change.CHANGED),
                                      "c1"))
        store.stage_item(delivered_by(item("z", 1), None))  # nothing to confirm
        store.stage_item(delivered_by(item("y", 1, data=None), "c1"))  # no data: none
        store.stage_item(delivered_by(
            item("b", 2, stored_at=2_000_030, change=Change.DELETED,
                 data={"url": "https://example.com/b", "change": "deleted"}), "c1"))
        # Staged, not flushed: nothing waits yet.
        assert await call(store.undelivered_crawls(SCOPE)) == []
        await call(store.flush())
        assert await call(store.undelivered_crawls(SCOPE)) == ["c1"]
        # In the order they were stored, whatever the chunk size.
        stored = [("a", 1, "new"), ("b", 1, "new"), ("a", 2, "changed"), ("b", 2, "deleted")]
        assert await waiting("c1") == stored
        assert await waiting("c1", limit=1) == stored
        [first] = await call(store.undelivered(SCOPE, "c1", limit=1))
        assert first.version.data == {"name": "a", "version": 1}
        assert first.version.fingerprint == "fp-a-1"
        assert first.version.stored_at == 2_000_010
        # Emitted again by crawl c2: it waits on c2 now.
        store.stage_redelivered(first, "c2")
        await call(store.flush())
        assert await waiting("c1") == stored[1:]
        assert await waiting("c2") == stored[:1]
        assert await call(store.undelivered_crawls(SCOPE)) == ["c1", "c2"]
        # c2 confirms: c1 still has versions waiting, and stays listed.
        store.stage_delivered(SCOPE, "c2")
        store.stage_settled(SCOPE, "c1")
        await call(store.flush())
        assert await waiting("c2") == []
        assert await call(store.undelivered_crawls(SCOPE)) == ["c1"]
        # Durable, and confirmed by c1 at last.
        await call(store.close())
        store = make_store()
        assert await waiting("c1") == stored[1:]
        store.stage_delivered(SCOPE, "c1")
        await call(store.flush())
        assert await waiting("c1") == []
        assert await call(store.undelivered_crawls(SCOPE)) == []
        # The versions themselves are untouched.
        assert [(v.key, v.version) for v in store.iter_versions(SCOPE, every_version=True)] == [
            ("z", 1), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]

    @pytest_twisted.ensureDeferred
    async def test_a_reset_forgets_what_waits_and_a_pruned_version_is_not_read(
        self, make_store: MakeStore,
    ) -> None:
        store = make_store(history_limit=1)
        for n in (1, 2):
            record = item("a", n, stored_at=2_000_000 + n)
            record.delivery = "c1"
            store.stage_item(record)
        await call(store.flush())
        # Version 1 was pruned by version 2: only version 2 is read.
        assert [(p.version.key, p.version.version)
                for p in await call(store.undelivered(SCOPE, "c1"))] == [("a", 2)]
        store.reset_scope(SCOPE)
        assert await call(store.undelivered_crawls(SCOPE)) == []
        assert await call(store.undelivered(SCOPE, "c1")) == []

    # -- crawl records, holds, read-outs and repairs ----------------------------

    @pytest_twisted.ensureDeferred
    async def test_crawl_records_are_kept_newest_first_and_bounded(
        self, make_store: MakeStore,
    ) -> None:
        store = make_store()
        store.crawl_history = 3
        records = [CrawlRecord(SCOPE, 1_000.0 + 10 * n, 1_005.5 + 10 * n, reason="finished",
                               figures={"requests": n, "bytes_saved": 1.5 * n})
                   for n in range(4)]
        # Two workers of one cluster run: one start, told apart by worker.
        records.append(CrawlRecord(SCOPE, 1_030.0, 1_036.25, worker="w2", reason="shutdown",
                                   figures={"requests": 9}))
        other = CrawlRecord("other", 1.0, 2.0, figures={"requests": 1})
        for record in [*records, other]:
            store.stage_crawl(record)
        assert store.crawls(SCOPE, 10) == []  # staged: committed by the flush
        await call(store.flush())
        # The newest 3 (by start, then finish): pruned as written.
        assert store.crawls(SCOPE, 10) == [records[4], records[3], records[2]]
        assert store.crawls(SCOPE, 1) == [records[4]]
        await call(store.close())

        store = make_store()
        store.crawl_history = 3
        assert store.crawls("other", 10) == [other]
        store.stage_crawl(CrawlRecord(SCOPE, 2_000.0, 2_001.0))
        await call(store.flush())
        assert [r.started for r in store.crawls(SCOPE, 10)] == [2_000.0, 1_030.0, 1_030.0]

    @pytest_twisted.ensureDeferred
    async def test_slot_rates_roundtrip_per_scope_bounded_to_the_most_recent(
        self, make_store: MakeStore,
    ) -> None:
        store = make_store()
        store.slot_rates_kept = 3
        records = [SlotRate(SCOPE, f"host{n}.example", 2.5 * (n + 1), n % 2 == 0,
                            1_000.25 + n, "" if n else "penalty box") for n in range(4)]
        other = SlotRate("other", "host0.example", 50.0, True, 1.5)
        store.stage_slot_rates([*records, other])
        assert (await call(store.slot_rates(SCOPE))).rates == []  # staged
        await call(store.flush())
        # The 3 saved most recently (the first one pruned as written), by
        # slot; fractions kept (a rate is not whole).
        found = await call(store.slot_rates(SCOPE))
        assert found.rates == records[1:] and found.unreadable == []
        assert (await call(store.slot_rates("other"))).rates == [other]
        await call(store.close())

        store = make_store()
        store.slot_rates_kept = 3
        # A slot saved again replaces its record.
        again = SlotRate(SCOPE, "host1.example", 3.5, False, 2_000.0, "frozen")
        store.stage_slot_rates([again])
        await call(store.flush())
        assert (await call(store.slot_rates(SCOPE))).rates == [again, *records[2:]]
        # Ties of one time beyond the bound: the first slot by name goes.
        newer = [SlotRate(SCOPE, f"new{n}.example", 7.0, True, 2_000.0) for n in range(3)]
        store.stage_slot_rates(newer)
        await call(store.flush())
        assert (await call(store.slot_rates(SCOPE))).rates == newer
        # A reset forgets them with the rest of the scope.
        store.reset_scope(SCOPE)
        assert (await call(store.slot_rates(SCOPE))).rates == []
        assert (await call(store.slot_rates("other"))).rates == [other]

    @pytest_twisted.ensureDeferred
    async def test_a_damaged_slot_rate_is_named_not_raised(
        self, make_store: MakeStore, damage_slot_rate: DamageSlotRate,
    ) -> None:
        store = make_store()
        good = SlotRate(SCOPE, "a.example", 12.5, True, 1_000.0)
        store.stage_slot_rates([good, SlotRate(SCOPE, "b.example", 3.0, False, 1_000.0)])
        await call(store.flush())
        damage_slot_rate(SCOPE, "b.example")
        found = await call(store.slot_rates(SCOPE))
        assert found.rates == [good] and found.unreadable == ["b.example"]
        # Saved again, it reads again.
        store.stage_slot_rates([SlotRate(SCOPE, "b.example", 4.0, False, 1_100.0)])
        await call(store.flush())
        assert [r.rate for r in (await call(store.slot_rates(SCOPE))).rates] == [12.5, 4.0]

    def test_a_repairs_hold_is_never_taken_over_by_its_pid(self, store: StateStore) -> None:
        # A pid not running here may run in another PID namespace (containers
        # sharing a host name): a repair's hold lapses, it is not taken over.
        killed = subprocess.Popen([sys.executable, "-c", "pass"])
        killed.wait()
        host = socket.gethostname()
        repair, crawl = f"repair@{host}:{killed.pid}", f"{host}:{killed.pid}"
        assert store.take_scope(SCOPE, repair, 60, clock.now()) is None
        for other in ("elsewhere:1", "worker@elsewhere:2:a", "repair@elsewhere:3"):
            held = store.take_scope(SCOPE, other, 60, clock.now())
            assert held is not None and held[0] == repair, other
        assert list(store.scope_holders(SCOPE, clock.now())) == [repair]
        # A crawl's hold of a gone process is taken over, by a crawl.
        assert store.take_scope("other", crawl, 60, clock.now()) is None
        assert store.take_scope("other", "elsewhere:1", 60, clock.now()) is None
        assert list(store.scope_holders("other", clock.now())) == ["elsewhere:1"]

    @pytest_twisted.ensureDeferred
    async def test_a_flush_for_a_hold_writes_only_while_it_is_held(
        self, make_store: MakeStore,
    ) -> None:
        crawl, repair = "host:1", "repair@host:2"
        store, other = make_store(), make_store()
        store.flush_hold = (SCOPE, crawl)
        # Never taken: nothing written, the writes kept staged.
        store.stage_page(full_state(PageKey(SCOPE, URL), 1))
        with pytest.raises(HoldLapsed, match="lapsed or was released"):
            await call(store.flush())
        assert store.pending and other.count_pages(SCOPE) == 0
        # Held: written.
        assert store.take_scope(SCOPE, crawl, 60, clock.now()) is None
        assert await call(store.flush()) == 1
        assert other.count_pages(SCOPE) == 1
        # Taken over by a repair (the hold lapsed): nothing written.
        await call(store.release_scope(SCOPE, crawl))
        assert other.take_scope(SCOPE, repair, 60, clock.now()) is None
        assert other.forget_page(SCOPE, URL).pages == 1
        store.stage_page(full_state(PageKey(SCOPE, URL), 2))
        with pytest.raises(HoldLapsed):
            await call(store.flush())
        assert other.count_pages(SCOPE) == 0
        # A store that names no hold writes (a store used directly).
        other.stage_page(full_state(PageKey(SCOPE, f"{URL}?other"), 1))
        assert await call(other.flush()) == 1
        store.flush_hold = None

    @pytest_twisted.ensureDeferred
    async def test_a_lapsed_hold_is_taken_again_only_while_nobody_took_the_scope(
        self, make_store: MakeStore,
    ) -> None:
        # A crawl that stalled past its hold's ttl (a blocking callback, a
        # laptop asleep) goes on when nobody took its scope meanwhile; once
        # a repair took it (and released it: the holds alone cannot tell),
        # neither a refresh nor a flush takes it again. Lapses by the
        # clock of each store's holds: the caller's, or the server's.
        crawl, repair = "host:1", "repair@host:2"
        store, other = make_store(), make_store()
        store.flush_hold = (SCOPE, crawl)
        assert store.take_scope(SCOPE, crawl, 0.2, clock.now()) is None
        await until(lambda: not store.scope_holders(SCOPE, clock.now()), "the hold to lapse")
        await call(store.hold_scope(SCOPE, crawl, 60))
        assert list(store.scope_holders(SCOPE, clock.now())) == [crawl]
        # A flush finding it lapsed, nobody having taken the scope, commits.
        await call(store.hold_scope(SCOPE, crawl, 0.2))
        await until(lambda: not store.scope_holders(SCOPE, clock.now()), "the hold to lapse")
        store.stage_page(full_state(PageKey(SCOPE, URL), 1))
        assert await call(store.flush()) == 1
        assert other.count_pages(SCOPE) == 1
        # A repair takes the lapsed hold's scope, and ends.
        await call(store.hold_scope(SCOPE, crawl, 0.2))
        await until(lambda: not store.scope_holders(SCOPE, clock.now()), "the hold to lapse")
        assert other.take_scope(SCOPE, repair, 60, clock.now()) is None
        assert other.forget_page(SCOPE, URL).pages == 1
        await call(other.release_scope(SCOPE, repair))
        store.stage_page(full_state(PageKey(SCOPE, URL), 2))
        with pytest.raises(HoldLapsed, match="lapsed or was released"):
            await call(store.flush())
        with pytest.raises(HoldLapsed, match="lapsed or was released"):
            await call(store.hold_scope(SCOPE, crawl, 60))
        assert store.scope_holders(SCOPE, clock.now()) == {}
        assert other.count_pages(SCOPE) == 0
        store.flush_hold = None

    @pytest_twisted.ensureDeferred
    async def test_hosts_summarized_with_their_trust(self, make_store: MakeStore) -> None:
        a, b = "https://a.example", "https://b.example:8443"
        store = make_store()
        store.stage_page(full_state(PageKey(SCOPE, f"{a}/1"), 1, callback="parse",
                                    next_visit=500))  # due
        store.stage_page(full_state(PageKey(SCOPE, f"{a}/2"), 2, callback="parse",
                                    next_visit=5_000))  # not yet
        store.stage_page(full_state(PageKey(SCOPE, f"{a}/3"), 3, callback="parse",
                                    next_visit=10, flags=PageFlags.GONE, failures=2))
        store.stage_page(full_state(PageKey(SCOPE, f"{a}/4"), 4, next_visit=10))  # no callback
        store.stage_failure(PageKey(SCOPE, f"{b}/x"), 503, 900, failures=1, next_visit=800,
                            callback="parse")
        store.stage_page(full_state(PageKey("other", f"{a}/1"), 1, callback="parse"))
        trust = HostTrust(SCOPE, "a.example", checks=7, lies=1, distrusted_until=9_000,
                          validators_distrusted_until=8_000, validators_unstable_since=700,
                          stale_lastmods=2)
        store.stage_host(trust)
        store.stage_host(HostTrust(SCOPE, "c.example", checks=1))
        await call(store.close())

        store = make_store()
        assert store.scopes() == ["books", "other"]
        assert sorted(s.key.url for s in store.iter_pages(SCOPE)) == [
            f"{a}/1", f"{a}/2", f"{a}/3", f"{a}/4", f"{b}/x"]
        assert store.summarize_hosts(SCOPE, 1_000) == [
            # The gone page's recheck is due (it is re-seeded): counted.
            HostSummary("a.example", pages=4, due=2, gone=1, failing=1,
                        size=1001 + 1002 + 1003 + 1004, trust=trust),
            HostSummary("b.example", pages=1, due=1, failing=1),
            HostSummary("c.example", trust=HostTrust(SCOPE, "c.example", checks=1)),
        ]
        assert store.summarize_hosts("none", 1_000) == []

    async def _two_pages_with_items(self, store: StateStore) -> tuple[PageKey, PageKey]:
        page, kept = PageKey(SCOPE, URL), PageKey(SCOPE, f"{URL}/kept")
        store.stage_links(page, '["https://example.com/b"]')
        store.stage_page(full_state(page, 1, callback="parse", flags=PageFlags.HAS_LINKS))
        store.stage_page(full_state(page._replace(variant="fr"), 2))
        store.stage_links(kept, '["https://example.com/c"]')
        store.stage_page(full_state(kept, 3, callback="parse"))
        # The page's own item (key = URL), twice; two more items stored
        # from it under other keys, one of them since tombstoned.
        for n in (1, 2):
            store.stage_item(ItemRecord(SCOPE, URL, URL, f"fp-{n}", json.dumps({"v": n}),
                                        stored_at=3_000 + n,
                                        change=Change.NEW if n == 1 else Change.CHANGED))
        store.stage_item(ItemRecord(SCOPE, "sku-1", URL, "fp-sku", json.dumps({"sku": 1}),
                                    stored_at=3_010, page=URL))
        store.stage_item(ItemRecord(SCOPE, "sku-2", URL, "fp-sku2", json.dumps({"sku": 2}),
                                    stored_at=3_011, page=URL))
        store.stage_item(ItemRecord(SCOPE, "sku-2", URL, "", json.dumps({"gone": True}),
                                    stored_at=3_012, change=Change.DELETED, page=URL))
        store.stage_item(item("kept"))
        store.stage_item(ItemRecord(SCOPE, kept.url, kept.url, "fp-k", json.dumps({"k": 1}),
                                    stored_at=3_020))
        store.stage_host(HostTrust(SCOPE, "example.com", checks=3))
        store.stage_crawl(CrawlRecord(SCOPE, 1.0, 2.0))
        await call(store.flush())
        return page, kept

    @pytest_twisted.ensureDeferred
    async def test_url_record_holds_everything_of_the_url(self, store: StateStore) -> None:
        page, _ = await self._two_pages_with_items(store)
        record = store.url_record(SCOPE, URL)
        assert record.pages == [await call(store.get_page(page)),
                                await call(store.get_page(page._replace(variant="fr")))]
        assert record.links == {"": '["https://example.com/b"]'}
        assert record.items == [URL, "sku-1"]  # live ones only
        latest = {v.key: (v.version, v.change, v.fingerprint, v.data) for v in record.latest}
        assert latest == {URL: (2, "changed", "fp-2", {"v": 2}),
                          "sku-1": (1, "new", "fp-sku", {"sku": 1})}
        unknown = store.url_record(SCOPE, f"{URL}/unknown")
        assert (unknown.pages, unknown.links, unknown.items, unknown.latest) == ([], {}, [], [])

    @pytest_twisted.ensureDeferred
    async def test_forget_page_deletes_it_its_links_and_its_items(
        self, make_store: MakeStore,
    ) -> None:
        store = make_store()
        page, kept = await self._two_pages_with_items(store)
        assert store.forget_page(SCOPE, URL) == Removed(
            pages=2, links=1, items=3, versions=5)
        await call(store.close())

        store = make_store()
        assert await call(store.get_page(page)) is None
        assert await call(store.get_page(page._replace(variant="fr"))) is None
        assert await call(store.get_links(page)) is None
        for key in (URL, "sku-1", "sku-2"):
            assert await call(store.get_item_fingerprint(SCOPE, key)) is None
            assert store.item_history(SCOPE, key) == []
        # Nothing of the page's item index is left either.
        assert await call(store.get_page_items(SCOPE, URL)) == []
        assert await call(store.get_due(SCOPE, 10**9, 10)) == [await call(store.get_page(kept))]
        assert await call(store.get_links(kept)) == '["https://example.com/c"]'
        assert sorted(i["url"] for i in store.iter_items(SCOPE)) == [
            kept.url, "https://example.com/kept"]
        assert store.forget_page(SCOPE, URL) == Removed()
        # Stored again, it is new: version 1.
        store.stage_item(ItemRecord(SCOPE, URL, URL, "fp-3", json.dumps({"v": 3}),
                                    stored_at=4_000))
        await call(store.flush())
        assert store.item_history(SCOPE, URL) == [(1, "fp-3")]
        assert await call(store.get_page_items(SCOPE, URL)) == [URL]

    @pytest_twisted.ensureDeferred
    async def test_forget_host_deletes_its_pages_items_and_trust(
        self, store: StateStore,
    ) -> None:
        await self._two_pages_with_items(store)
        elsewhere = PageKey(SCOPE, "https://other.example/p")
        store.stage_page(full_state(elsewhere, 1))
        store.stage_item(ItemRecord(SCOPE, elsewhere.url, elsewhere.url, "fp-o", "{}"))
        store.stage_host(HostTrust(SCOPE, "other.example", checks=1))
        await call(store.flush())
        assert store.forget_host(SCOPE, "example.com") == Removed(
            pages=3, links=2, items=4, versions=6, hosts=1)
        assert [s.key for s in store.iter_pages(SCOPE)] == [elsewhere]
        assert [h.host for h in store.iter_hosts(SCOPE)] == ["other.example"]
        # An item stored from no known page of the host stays ("kept": its
        # key is no URL of the host's pages).
        assert sorted(i["url"] for i in store.iter_items(SCOPE)) == [
            "https://example.com/kept", elsewhere.url]
        assert store.forget_host(SCOPE, "example.com") == Removed()

    @pytest_twisted.ensureDeferred
    async def test_forget_host_deletes_the_rate_of_the_slot_named_by_the_host(
        self, store: StateStore,
    ) -> None:
        await self._two_pages_with_items(store)
        store.slot_rates_kept = 2
        # A slot of another name (a DOWNLOAD_SLOTS key, a host group) is no
        # host, and the host's rate in another scope is that scope's.
        kept = SlotRate(SCOPE, "my-slot", 12.0, True, 1_000.0)
        elsewhere = SlotRate("other", "example.com", 30.0, True, 1_000.0)
        # Saved last: a stale entry in the store's index by time would count
        # towards the bound below and prune a live record.
        store.stage_slot_rates([kept, elsewhere, SlotRate(SCOPE, "example.com", 50.0, True,
                                                          1_001.0)])
        await call(store.flush())
        assert store.forget_host(SCOPE, "example.com") == Removed(
            pages=3, links=2, items=4, versions=6, hosts=1, rates=1)
        assert (await call(store.slot_rates(SCOPE))).rates == [kept]
        assert store.read_slot_rates(SCOPE).rates == [kept]  # as `scrapy state` reads them
        assert (await call(store.slot_rates("other"))).rates == [elsewhere]
        newer = SlotRate(SCOPE, "new.example", 7.0, True, 1_002.0)
        store.stage_slot_rates([newer])
        await call(store.flush())
        assert (await call(store.slot_rates(SCOPE))).rates == [kept, newer]
        # A host with nothing stored but its rate has something to forget.
        assert store.forget_host(SCOPE, "new.example") == Removed(rates=1)
        assert "1 remembered politeness rate" in Removed(rates=1).describe()
        assert "remembered" not in Removed(pages=1).describe()

    @pytest_twisted.ensureDeferred
    async def test_reset_scope_deletes_everything_of_it_and_nothing_else(
        self, make_store: MakeStore,
    ) -> None:
        store = make_store()
        await self._two_pages_with_items(store)
        store.stage_page(full_state(PageKey("other", URL), 1))
        store.stage_item(item("a", scope="other"))
        store.stage_crawl(CrawlRecord("other", 1.0, 2.0))
        await call(store.flush())
        assert store.take_scope(SCOPE, "someone", 60, now=clock.now()) is None
        expected = Removed(pages=3, links=2, items=5, versions=7, hosts=1, crawls=1)
        assert store.count_scope(SCOPE) == expected
        assert store.count_scope(SCOPE) == expected  # counting deletes nothing
        assert store.reset_scope(SCOPE) == expected
        await call(store.close())

        store = make_store()
        assert store.scopes() == ["other"]
        assert store.count_scope(SCOPE) == Removed()
        assert store.count_pages(SCOPE) == 0
        assert list(store.iter_items(SCOPE)) == []
        assert store.crawls(SCOPE, 10) == []
        assert store.count_scope("other") == Removed(pages=1, items=1, versions=1, crawls=1)
        # Holds lapse by themselves.
        assert list(store.scope_holders(SCOPE, clock.now())) == ["someone"]


    # -- the stored-graph walk's memo: the write generation ------------------------

    @pytest_twisted.ensureDeferred
    async def test_write_generation_moves_with_every_write_of_a_page_or_its_links(
        self, store: StateStore,
    ) -> None:
        """Every way a page's state or links record is written or deleted
        changes the token (for the page's host); no token ever comes back."""
        host = "example.com"
        key = PageKey(SCOPE, URL)
        other = PageKey(SCOPE, f"{URL}/other")
        store.stage_page(full_state(key, 1, next_visit=2_000_000))
        store.stage_page(full_state(other, 1))
        await call(store.flush())
        first = await call(store.write_generation(SCOPE, [host]))
        assert first is not None

        def written() -> list[Callable[[], object]]:
            return [
                lambda: store.stage_page(full_state(key, 2, next_visit=2_000_000)),
                lambda: store.stage_check(key, 304, 3_000_000),
                lambda: store.stage_failure(key, 503, 3_000_100, failures=1,
                                            next_visit=3_100_000),
                lambda: store.stage_redirect(key, f"{URL}/b", 301, 3_000_200),
                lambda: store.stage_links(key, '{"v":3,"n":0}'),
                lambda: store.stage_links(key, None),
                lambda: store.stage_flags(key, PageFlags.UNSTABLE_VALIDATORS),
                lambda: store.stage_listing(key, "digest"),
                lambda: store.stage_postpone(key, 3_100_000, 3_200_000),
            ]

        seen = [first]
        for write in written():
            write()
            await call(store.flush())
            token = await call(store.write_generation(SCOPE, [host]))
            assert token not in seen, (write, token, seen)
            seen.append(token)
        for repair in (lambda: store.forget_page(SCOPE, f"{URL}/other"),
                       lambda: store.forget_host(SCOPE, host),
                       lambda: store.reset_scope(SCOPE)):
            store.stage_page(full_state(key, 3))
            await call(store.flush())
            seen.append(await call(store.write_generation(SCOPE, [host])))
            repair()
            token = await call(store.write_generation(SCOPE, [host]))
            assert token not in seen, (repair, token, seen)
            seen.append(token)
        # Written again after the reset: still no token seen before.
        store.stage_page(full_state(key, 4))
        await call(store.flush())
        assert await call(store.write_generation(SCOPE, [host])) not in seen

    @pytest_twisted.ensureDeferred
    async def test_write_generation_stays_through_reads_and_other_records(
        self, store: StateStore,
    ) -> None:
        host = "example.com"
        key = PageKey(SCOPE, URL)
        store.stage_page(full_state(key, 1))
        store.stage_links(key, '{"v":3,"n":0}')
        await call(store.flush())
        token = await call(store.write_generation(SCOPE, [host]))
        await call(store.get_pages([key]))
        await call(store.get_links_many([key]))
        store.stage_item(item("a"))
        store.stage_host(HostTrust(SCOPE, host, checks=1))
        store.stage_crawl(CrawlRecord(SCOPE, 1_000, 1_010, figures={"requests": 1}))
        await call(store.flush())
        await call(store.put_walk_memo(SCOPE, "start", "memo"))
        # Another scope's pages.
        store.stage_page(full_state(PageKey("other", URL), 1))
        await call(store.flush())
        assert await call(store.write_generation(SCOPE, [host])) == token

    @pytest_twisted.ensureDeferred
    async def test_walk_memo_is_kept_per_scope_and_name_and_reset_with_the_scope(
        self, make_store: MakeStore,
    ) -> None:
        store = make_store()
        assert await call(store.get_walk_memo(SCOPE, "start")) is None
        await call(store.put_walk_memo(SCOPE, "start", "one"))
        await call(store.put_walk_memo(SCOPE, "start", "two"))
        await call(store.put_walk_memo(SCOPE, "elsewhere", "three"))
        await call(store.put_walk_memo("other", "start", "four"))
        await call(store.close())
        store = make_store()
        assert await call(store.get_walk_memo(SCOPE, "start")) == "two"
        assert await call(store.get_walk_memo(SCOPE, "elsewhere")) == "three"
        store.reset_scope(SCOPE)
        assert await call(store.get_walk_memo(SCOPE, "start")) is None
        assert await call(store.get_walk_memo("other", "start")) == "four"


class HoldsOnTheCallersClock:
    """Holds of a store that judges them on the caller's *now* (SQLite): the
    tests move time by passing it. Redis judges holds on its server's clock
    (:class:`HoldsOnTheServersClock`)."""

    @pytest_twisted.ensureDeferred
    async def test_holds_lapse_after_their_ttl(self, store: StateStore) -> None:
        # (Cluster workers: the holds that may be held together.)
        one, two, three = "worker@host:1", "worker@host:2 worker", "worker@host:3"
        assert store.take_scope(SCOPE, one, 60, now=1_000) is None
        assert store.take_scope(SCOPE, two, 60, now=1_030) is None
        assert store.scope_holders(SCOPE, 1_000) == {one: 1_060, two: 1_090}
        assert store.scope_holders(SCOPE, 1_060) == {two: 1_090}
        assert store.scope_holders(SCOPE, 1_090) == {}
        assert store.scope_holders("other", 1_000) == {}
        # A hold never taken is not refreshed (only taken).
        with pytest.raises(HoldLapsed, match="lapsed or was released"):
            await call(store.hold_scope(SCOPE, "never held", 60, now=1_100))
        assert store.scope_holders(SCOPE, 1_100) == {}
        # A refresh moves its lapse; a release drops it, and no other.
        assert store.take_scope(SCOPE, one, 60, now=1_100) is None
        await call(store.hold_scope(SCOPE, one, 60, now=1_120))
        assert store.scope_holders(SCOPE, 1_120) == {one: 1_180}
        assert store.take_scope(SCOPE, three, 60, now=1_120) is None
        await call(store.release_scope(SCOPE, one))
        await call(store.release_scope(SCOPE, "never held"))
        assert store.scope_holders(SCOPE, 1_120) == {three: 1_180}
        with pytest.raises(HoldLapsed):
            await call(store.hold_scope(SCOPE, one, 60, now=1_130))  # released
        # Not staged: visible to every reader at once.
        assert store.pending == 0

    @pytest_twisted.ensureDeferred
    async def test_a_workers_lapsed_hold_is_taken_again_while_its_run_held_the_scope(
        self, store: StateStore,
    ) -> None:
        one, two, three = "worker@host:3:a", "worker@host:3:b", "worker@host:4:c"
        repair = "repair@host:2"
        # A worker taking beside a live worker leaves the epoch: the first
        # worker, stalled past its hold while the second held the scope
        # (no repair could take it), takes it again.
        assert store.take_scope(SCOPE, one, 60, now=1_000) is None
        assert store.take_scope(SCOPE, two, 60, now=1_010) is None
        await call(store.hold_scope(SCOPE, two, 60, now=1_050))
        await call(store.hold_scope(SCOPE, one, 60, now=1_070))
        assert store.scope_holders(SCOPE, 1_070) == {one: 1_130, two: 1_110}
        # Every worker lapsed, a new run's worker took the scope: the old
        # workers do not take it again (a repair may have come and gone
        # between the runs).
        assert store.take_scope(SCOPE, three, 60, now=1_200) is None
        with pytest.raises(HoldLapsed):
            await call(store.hold_scope(SCOPE, one, 60, now=1_210))
        # Nor once a repair took it and ended.
        await call(store.release_scope(SCOPE, three))
        assert store.take_scope(SCOPE, three, 60, now=1_220) is None
        assert store.take_scope(SCOPE, repair, 60, now=1_300) is None
        await call(store.release_scope(SCOPE, repair))
        with pytest.raises(HoldLapsed):
            await call(store.hold_scope(SCOPE, three, 60, now=1_310))
        assert store.scope_holders(SCOPE, 1_310) == {}

    @pytest_twisted.ensureDeferred
    async def test_workers_hold_a_scope_together_and_a_repair_or_crawl_holds_it_alone(
        self, store: StateStore,
    ) -> None:
        crawl, repair = "host:1", "repair@host:2"
        one, two = "worker@host:3:a", "worker@host:3:b"
        # The workers of a run hold together; a crawl or a repair is refused
        # while any does, and says who holds (the one lapsing last).
        assert store.take_scope(SCOPE, one, 60, now=1_000) is None
        assert store.take_scope(SCOPE, two, 60, now=1_010) is None
        assert store.take_scope(SCOPE, crawl, 60, now=1_020) == (two, 1_070)
        assert store.take_scope(SCOPE, repair, 60, now=1_020) == (two, 1_070)
        assert store.scope_holders(SCOPE, 1_020) == {one: 1_060, two: 1_070}
        await call(store.release_scope(SCOPE, one))
        await call(store.release_scope(SCOPE, two))
        # A repair holds alone: no worker, crawl or other repair beside it.
        assert store.take_scope(SCOPE, repair, 60, now=1_100) is None
        for other in (one, crawl, "repair@host:4"):
            assert store.take_scope(SCOPE, other, 60, now=1_110) == (repair, 1_160), other
        # A worker whose hold lapsed meanwhile does not take it again by
        # refreshing it: refused, and nothing held.
        with pytest.raises(ScopeHeld, match="held by repair host:2") as held:
            await call(store.hold_scope(SCOPE, one, 60, now=1_120))
        assert (held.value.holder, held.value.expires) == (repair, 1_160)
        with pytest.raises(ScopeHeld):
            await call(store.hold_scope(SCOPE, crawl, 60, now=1_120))
        assert store.scope_holders(SCOPE, 1_120) == {repair: 1_160}
        # Taken again by itself, the repair's hold is renewed.
        assert store.take_scope(SCOPE, repair, 60, now=1_150) is None
        assert store.scope_holders(SCOPE, 1_150) == {repair: 1_210}
        # Lapsed, it is taken over; a crawl then holds alone, workers too.
        assert store.take_scope(SCOPE, crawl, 60, now=1_210) is None
        assert store.take_scope(SCOPE, one, 60, now=1_220) == (crawl, 1_270)
        await call(store.hold_scope(SCOPE, crawl, 60, now=1_230))
        assert store.scope_holders(SCOPE, 1_230) == {crawl: 1_290}


class TestSQLiteStore(HoldsOnTheCallersClock, StateStoreContract):
    """The contract, for :class:`SQLiteStateStore`."""

    @pytest_twisted.async_yield_fixture
    async def make_store(self, tmp_path: Path) -> AsyncIterator[MakeStore]:
        opened: list[SQLiteStateStore] = []

        def make(**options: Any) -> StateStore:
            store = SQLiteStateStore(tmp_path / "state" / "state.db", busy_timeout=1.0,
                                     **options)
            opened.append(store)
            return store

        yield make
        for store in opened:
            await call(store.close())

    @pytest.fixture
    def failing_flush(self, tmp_path: Path) -> FailingFlush:
        @contextmanager
        def failing() -> Iterator[None]:
            # Another process holds the write lock: the flush's one
            # transaction cannot begin (after the 1 s busy timeout).
            path = tmp_path / "state" / "state.db"
            with closing(sqlite3.connect(path, isolation_level=None)) as other:
                other.execute("BEGIN EXCLUSIVE")
                try:
                    yield
                finally:
                    other.execute("ROLLBACK")

        return failing

    @pytest.fixture
    def damage_slot_rate(self, tmp_path: Path) -> DamageSlotRate:
        def damage(scope: str, slot: str) -> None:
            # SQLite keeps text in a REAL column.
            write_sqlite(tmp_path / "state" / "state.db",
                         f"UPDATE slot_rates SET rate = 'fast' WHERE scope = '{scope}' "
                         f"AND slot = '{slot}'")

        return damage


class HoldsOnTheServersClock:
    """A Redis store's holds, judged on the server's clock (TIME) whatever
    the caller's: a host whose clock is ahead, or a crawl under faketime,
    neither takes a live hold nor holds one past its lapse."""

    @pytest_twisted.ensureDeferred
    async def test_a_callers_clock_neither_takes_a_live_hold_nor_stretches_one(
        self, store: StateStore,
    ) -> None:
        crawl, repair = "host:1", "repair@host:2"
        one, two = "worker@host:3:a", "worker@host:3:b"
        assert store.take_scope(SCOPE, repair, 60, clock.now()) is None
        # A crawl whose host's clock is a minute ahead (or two days, under
        # faketime) finds the repair's hold live; it is told when it lapses
        # on its own clock.
        for ahead in (61, 2 * 86_400):
            now = clock.now() + ahead
            held = store.take_scope(SCOPE, crawl, 60, now)
            assert held is not None and held[0] == repair
            assert now < held[1] <= now + 60
        # A refresh under a clock ahead renews from the server's now.
        await call(store.hold_scope(SCOPE, repair, 60, clock.now() + 2 * 86_400))
        assert store.scope_holders(SCOPE, clock.now())[repair] <= clock.now() + 60
        await call(store.release_scope(SCOPE, repair))
        # A crawl taking under a clock two days ahead holds for its ttl,
        # not two days (a killed one would block every repair meanwhile);
        # nor does one two days behind hold nothing.
        for skew in (2 * 86_400, -2 * 86_400):
            assert store.take_scope(SCOPE, crawl, 60, clock.now() + skew) is None
            assert clock.now() < store.scope_holders(SCOPE, clock.now())[crawl] \
                <= clock.now() + 60
            await call(store.release_scope(SCOPE, crawl))
        # Workers hold together; a crawl or a repair alone.
        assert store.take_scope(SCOPE, one, 60, clock.now()) is None
        assert store.take_scope(SCOPE, two, 60, clock.now()) is None
        for other in (crawl, repair):
            held = store.take_scope(SCOPE, other, 60, clock.now())
            assert held is not None and held[0] in (one, two)
        assert sorted(store.scope_holders(SCOPE, clock.now())) == [one, two]
        with pytest.raises(ScopeHeld, match="held by cluster worker host:3"):
            await call(store.hold_scope(SCOPE, crawl, 60))

    @pytest_twisted.ensureDeferred
    async def test_a_hold_lapses_on_the_servers_clock_and_is_not_refreshed_after(
        self, store: StateStore,
    ) -> None:
        crawl, repair = "host:1", "repair@host:2"
        assert store.take_scope(SCOPE, crawl, 60, clock.now()) is None
        await call(store.hold_scope(SCOPE, crawl, 0.2))  # lapses 0.2 s on
        await until(lambda: not store.scope_holders(SCOPE, 0), "the hold to lapse")
        # Taken by a repair since (see the contract's epoch test).
        assert store.take_scope(SCOPE, repair, 60, clock.now()) is None
        await call(store.release_scope(SCOPE, repair))
        with pytest.raises(HoldLapsed, match="lapsed or was released"):
            await call(store.hold_scope(SCOPE, crawl, 60))
        assert store.scope_holders(SCOPE, 0) == {}


class TestRedisStore(HoldsOnTheServersClock, StateStoreContract):
    """The contract, for :class:`RedisStateStore` on the real Redis (db 9)."""

    @pytest_twisted.async_yield_fixture
    async def make_store(self, redis_prefix: str) -> AsyncIterator[MakeStore]:
        opened: list[RedisStateStore] = []

        def make(**options: Any) -> StateStore:
            store = RedisStateStore(REDIS_URI, prefix=redis_prefix, **options)
            opened.append(store)
            return store

        yield make
        for store in opened:
            await call(store.close())

    @pytest.fixture
    def failing_flush(self, redis_prefix: str) -> FailingFlush:
        @contextmanager
        def failing() -> Iterator[None]:
            # A damaged key: the scope's revisit index (of buckets) is not a
            # sorted set, so a page write fails, the last of a page's writes
            # (items and links come before it).
            due = f"{redis_prefix}:dueb:{SCOPE}"
            client = redis.Redis.from_url(REDIS_URI)
            try:
                assert client.set(due, "not a sorted set", nx=True)
                try:
                    yield
                finally:
                    client.delete(due)
            finally:
                client.close()

        return failing

    @pytest.fixture
    def damage_slot_rate(self, redis_prefix: str) -> DamageSlotRate:
        def damage(scope: str, slot: str) -> None:
            client = redis.Redis.from_url(REDIS_URI)
            try:
                client.hset(f"{redis_prefix}:slots:{scope}", slot, '{"rate": "fast"')
            finally:
                client.close()

        return damage


class TestRedisClusterStore(HoldsOnTheServersClock, StateStoreContract):
    """The contract, for :class:`RedisStateStore` on a real Redis Cluster
    (three loopback primaries, ``tests/redis_cluster_util.py``): the cluster
    layout (5) and its phased flush. Each test has a key prefix of its own,
    its keys deleted from every node afterwards (SCAN per node)."""

    @pytest.fixture
    def cluster_prefix(self, redis_cluster: LoopbackCluster) -> Iterator[str]:
        prefix = new_prefix()
        yield prefix
        redis_cluster.delete(f"{prefix}:*")

    @pytest_twisted.async_yield_fixture
    async def make_store(self, redis_cluster: LoopbackCluster,
                         cluster_prefix: str) -> AsyncIterator[MakeStore]:
        opened: list[RedisStateStore] = []

        def make(**options: Any) -> StateStore:
            store = RedisStateStore(redis_cluster.url, prefix=cluster_prefix, **options)
            assert store.tagged  # the cluster layout, not layout 4's names
            opened.append(store)
            return store

        yield make
        for store in opened:
            await call(store.close())

    @pytest_twisted.async_fixture
    async def client_overhead(self, redis_cluster: LoopbackCluster) -> int:
        # A cluster's clients (blocking and asyncio) each map the 16,384
        # slots to nodes and parse the server's command table when they
        # start (~4.5 MB with redis-py 8), whatever the store holds:
        # measured on a store of an empty prefix opened and read once.
        tracemalloc.start()
        try:
            store = RedisStateStore(redis_cluster.url, prefix=new_prefix())
            await call(store.get_page(PageKey(SCOPE, URL)))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        await call(store.close())
        return peak

    @pytest_twisted.ensureDeferred
    async def test_a_hold_taken_between_two_phases_stops_the_phases_after(
        self, make_store: MakeStore, monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        # The phases of a flush are separate awaits: a callback blocking the
        # reactor between two may outlast the writer's hold, and a repair
        # take the scope. The phases after are not sent: the repair's
        # deletions are not written back.
        crawl, repair = "host:1", "repair@host:2"
        store, other = make_store(), make_store()
        assert store.take_scope(SCOPE, crawl, 60, clock.now()) is None
        store.flush_hold = (SCOPE, crawl)
        phase_items = type(store)._phase_items

        async def items_then_a_repair(self: Any, *args: Any) -> None:
            await phase_items(self, *args)
            await store.release_scope(SCOPE, crawl)
            assert other.take_scope(SCOPE, repair, 60, clock.now()) is None

        monkeypatch.setattr(type(store), "_phase_items", items_then_a_repair)
        store.stage_item(item("k", scope=SCOPE, page=URL))
        store.stage_page(full_state(PageKey(SCOPE, URL), 1))
        with pytest.raises(HoldLapsed):
            await call(store.flush())
        monkeypatch.undo()
        assert other.count_pages(SCOPE) == 0
        assert list(other.scope_holders(SCOPE, clock.now())) == [repair]
        store.flush_hold = None

    @pytest.fixture
    def failing_flush(self, redis_cluster: LoopbackCluster,
                      cluster_prefix: str) -> FailingFlush:
        @contextmanager
        def failing() -> Iterator[None]:
            # Damaged keys in the slots of both phases that write a page's
            # data: every item group's version numbers of SCOPE (phase 1:
            # a flush with items fails before any page is written) and the
            # record of the host of URL (phase 2: one without items fails
            # at its pages). What a failure in phase 2 after items were
            # written leaves is tested apart (tests/test_redis_cluster_store.py).
            damaged = [f"{cluster_prefix}:itemver:{{{SCOPE}#{g}}}" for g in range(ITEM_GROUPS)]
            damaged.append(f"{cluster_prefix}:hd:{{{SCOPE}|example.com}}")
            with redis_cluster.client() as client:
                for key in damaged:
                    assert client.set(key, "damaged", nx=True)
                try:
                    yield
                finally:
                    for key in damaged:
                        client.delete(key)

        return failing

    @pytest.fixture
    def damage_slot_rate(self, redis_cluster: LoopbackCluster,
                         cluster_prefix: str) -> DamageSlotRate:
        def damage(scope: str, slot: str) -> None:
            with redis_cluster.client() as client:
                client.hset(f"{cluster_prefix}:slots:{{{scope}}}", slot, '{"rate": "fast"')

        return damage


def write_sqlite(path: Path, *statements: str) -> None:
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        for statement in statements:
            db.execute(statement)


class TestSQLiteOnly:
    """What only the SQLite backend does: files, pragmas, locks, URIs."""

    @pytest.fixture
    def db_path(self, tmp_path: Path) -> Path:
        return tmp_path / "state.db"

    def test_corrupt_file_is_an_error_and_left_alone(self, db_path: Path) -> None:
        garbage = random.Random(1234).randbytes(16_384)
        db_path.write_bytes(garbage)
        with pytest.raises(StateStoreError) as info:
            SQLiteStateStore(db_path, busy_timeout=0.1)
        assert str(db_path) in str(info.value)
        assert db_path.read_bytes() == garbage

    def test_foreign_sqlite_database_is_refused(self, db_path: Path) -> None:
        write_sqlite(
            db_path,
            "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)",
            "INSERT INTO customers (name) VALUES ('Ada')",
        )
        with pytest.raises(StateStoreError) as info:
            SQLiteStateStore(db_path, busy_timeout=0.1)
        message = str(info.value)
        assert str(db_path) in message
        assert "not an incremental_crawler state store" in message
        # The other program's data is untouched.
        with closing(sqlite3.connect(db_path)) as db:
            assert db.execute("SELECT name FROM customers").fetchall() == [("Ada",)]
            assert db.execute("PRAGMA user_version").fetchone()[0] == 0
            tables = {
                r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"customers"}

    def test_newer_schema_is_refused(self, db_path: Path) -> None:
        newer = SCHEMA_VERSION + 1
        write_sqlite(db_path, "CREATE TABLE future (x)", f"PRAGMA user_version = {newer}")
        with pytest.raises(StateStoreError) as info:
            SQLiteStateStore(db_path, busy_timeout=0.1)
        message = str(info.value)
        assert str(db_path) in message
        assert f"schema version {newer}" in message
        with closing(sqlite3.connect(db_path)) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == newer

    @pytest_twisted.ensureDeferred
    async def test_new_store_gets_current_schema_version(self, db_path: Path) -> None:
        await call(SQLiteStateStore(db_path).close())
        with closing(sqlite3.connect(db_path)) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION

    def test_open_locked_new_file_is_an_error(self, db_path: Path) -> None:
        # A rollback-journal database held by BEGIN EXCLUSIVE: switching it
        # to WAL (and creating the schema) needs the lock.
        with closing(sqlite3.connect(db_path, isolation_level=None)) as other:
            other.execute("BEGIN EXCLUSIVE")
            with pytest.raises(StateStoreError) as info:
                SQLiteStateStore(db_path, busy_timeout=0.1)
            other.execute("ROLLBACK")
        message = str(info.value)
        assert "locked" in message
        assert str(db_path) in message

    @pytest_twisted.ensureDeferred
    async def test_flush_to_locked_store_is_an_error_and_keeps_staged_writes(
        self, db_path: Path
    ) -> None:
        await call(SQLiteStateStore(db_path).close())  # an existing (WAL) store
        key = PageKey(SCOPE, URL)
        with closing(sqlite3.connect(db_path, isolation_level=None)) as other:
            other.execute("BEGIN EXCLUSIVE")
            # Readers work beside a writer in WAL mode, so opening succeeds...
            store = SQLiteStateStore(db_path, busy_timeout=0.1)
            assert await call(store.get_page(key)) is None
            store.stage_item(item("a"))
            store.stage_page(full_state(key))
            # ...but committing cannot.
            with pytest.raises(StateStoreError) as info:
                await call(store.flush())
            other.execute("ROLLBACK")
        message = str(info.value)
        assert "locked" in message
        assert str(db_path) in message
        # Nothing is recorded as stored that was not; a later flush commits it.
        assert store.pending == 2
        assert await call(store.get_page(key)) == full_state(key)
        assert await call(store.flush()) == 2
        await call(store.close())
        reopened = SQLiteStateStore(db_path)
        assert await call(reopened.get_page(key)) == full_state(key)
        assert await call(reopened.get_item_fingerprint(SCOPE, "a")) == "fp-a-1"
        await call(reopened.close())

    @pytest_twisted.ensureDeferred
    async def test_wal_mode(self, db_path: Path) -> None:
        store = SQLiteStateStore(db_path)
        try:
            with closing(sqlite3.connect(db_path)) as other:
                assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        finally:
            await call(store.close())

    @pytest_twisted.ensureDeferred
    async def test_a_page_cache_that_holds_a_large_stores_indexes(self, db_path: Path) -> None:
        # SQLite's default (2,000 KiB) makes every page write of a store of
        # a million pages read the indexes' inner pages again.
        store = SQLiteStateStore(db_path)
        try:
            assert store._db.execute("PRAGMA cache_size").fetchone()[0] == -65_536
        finally:
            await call(store.close())

    @pytest_twisted.ensureDeferred
    async def test_creates_missing_directories(self, tmp_path: Path) -> None:
        path = tmp_path / "a" / "b" / "state.db"
        store = SQLiteStateStore(path)
        await call(store.close())
        assert path.is_file()

    @pytest_twisted.ensureDeferred
    async def test_get_page_is_a_primary_key_lookup(self, db_path: Path) -> None:
        store = SQLiteStateStore(db_path)
        try:
            for i in range(50):
                store.stage_page(full_state(PageKey(SCOPE, f"{URL}/{i}")))
            await call(store.flush())
            statements: list[str] = []
            store._db.set_trace_callback(statements.append)
            try:
                assert await call(store.get_page(PageKey(SCOPE, f"{URL}/7"))) is not None
            finally:
                store._db.set_trace_callback(None)
            assert len(statements) == 1, statements
            [select] = statements
            assert select.lstrip().upper().startswith("SELECT")
            # The traced text has the parameters expanded (or not, depending
            # on the Python version): plan it either way.
            params = (SCOPE, f"{URL}/7", "") if "?" in select else ()
            with closing(sqlite3.connect(db_path)) as other:
                plan = other.execute("EXPLAIN QUERY PLAN " + select, params).fetchall()
            details = " ".join(row[-1] for row in plan)
            assert "SEARCH" in details and "PRIMARY KEY" in details, details
            assert "SCAN" not in details, details
        finally:
            await call(store.close())

    @pytest_twisted.ensureDeferred
    async def test_get_links_is_a_key_lookup(self, db_path: Path) -> None:
        store = SQLiteStateStore(db_path)
        try:
            for i in range(50):
                store.stage_links(PageKey(SCOPE, f"{URL}/{i}"), f"[{i}]")
            await call(store.flush())
            statements: list[str] = []
            store._db.set_trace_callback(statements.append)
            try:
                assert await call(store.get_links(PageKey(SCOPE, f"{URL}/7"))) == "[7]"
            finally:
                store._db.set_trace_callback(None)
            [select] = statements
            params = (SCOPE, f"{URL}/7", "") if "?" in select else ()
            with closing(sqlite3.connect(db_path)) as other:
                plan = other.execute("EXPLAIN QUERY PLAN " + select, params).fetchall()
            details = " ".join(row[-1] for row in plan)
            # The key's index (links is a rowid table: its records are large).
            assert "SEARCH" in details and "scope=? AND url=? AND variant=?" in details, details
            assert "SCAN" not in details, details
        finally:
            await call(store.close())

    # -- URIs and open_store -------------------------------------------------

    def test_default_state_uri_is_under_the_project_data_dir(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
        monkeypatch.chdir(tmp_path)
        (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = nothing.settings\n")
        uri = default_state_uri()
        assert uri.startswith("sqlite:///")
        assert uri.endswith("incremental/state.db")
        expected = tmp_path.resolve() / ".scrapy" / "incremental" / "state.db"
        assert path_from_uri(uri) == expected

    @pytest_twisted.ensureDeferred
    async def test_open_store_without_uri_uses_the_default(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
        monkeypatch.chdir(tmp_path)
        (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = nothing.settings\n")
        store = open_store(Settings())
        try:
            assert isinstance(store, SQLiteStateStore)
            expected = tmp_path.resolve() / ".scrapy" / "incremental" / "state.db"
            assert store.path == expected
            assert expected.is_file()
            assert store.location == str(expected)
        finally:
            await call(store.close())

    @pytest_twisted.ensureDeferred
    async def test_open_store_with_sqlite_uri(self, tmp_path: Path) -> None:
        path = tmp_path / "x" / "state.db"
        store = open_store(Settings({"INCREMENTAL_STATE_URI": f"sqlite:///{path}"}))
        try:
            assert isinstance(store, SQLiteStateStore)
            assert store.path == path
        finally:
            await call(store.close())

    def test_open_store_unknown_scheme(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        monkeypatch.chdir(tmp_path)
        settings = Settings({"INCREMENTAL_STATE_URI": "mongodb://localhost/state"})
        with pytest.raises(StateStoreError) as info:
            open_store(settings)
        message = str(info.value)
        assert "'mongodb'" in message
        assert "sqlite" in message  # lists the known schemes
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize(
        ("uri", "expected"),
        [
            ("sqlite:///state.db", "state.db"),
            ("sqlite:///rel/path/state.db", "rel/path/state.db"),
            ("sqlite:////abs/state.db", "/abs/state.db"),
            ("sqlite:////abs/dir/state.db", "/abs/dir/state.db"),
        ],
    )
    def test_path_from_uri(self, uri: str, expected: str) -> None:
        assert path_from_uri(uri) == Path(expected)
        assert path_from_uri(uri).is_absolute() == expected.startswith("/")

    @pytest.mark.parametrize(
        "uri",
        ["sqlite://", "sqlite:///", "sqlite://host/state.db", "sqlite:state.db",
         "state.db", "redis://localhost/0", ""],
    )
    def test_path_from_bad_uri(self, uri: str) -> None:
        with pytest.raises(StateStoreError) as info:
            path_from_uri(uri)
        assert repr(uri) in str(info.value)
        assert "sqlite:////absolute/path.db" in str(info.value)

    @pytest_twisted.ensureDeferred
    async def test_from_uri_reads_busy_timeout_setting(self, tmp_path: Path) -> None:
        path = tmp_path / "state.db"
        settings = Settings({"INCREMENTAL_SQLITE_BUSY_TIMEOUT": "0.25"})
        store = SQLiteStateStore.from_uri(f"sqlite:///{path}", settings=settings)
        try:
            assert store._busy_timeout == 0.25
            assert store.path == path
        finally:
            await call(store.close())



def brute_summary(states: Iterable[PageState], after: float, upto: float,
                  checked_before: float,
                  excluded: Collection[str] = ()) -> tuple[int, int, float | None]:
    """What ``summarize_pages`` answers, from every page one by one."""
    chosen = [s for s in states if s.callback is not None and s.callback not in excluded
              and after < s.next_visit <= upto and s.last_checked < checked_before]
    return (len(chosen), sum(s.size for s in chosen),
            min((s.next_visit for s in chosen), default=None))


def schema_at(path: Path, version: int) -> sqlite3.Connection:
    """A SQLite store at *path* with the schema of *version* (its first
    migrations applied), open for a test to fill in."""
    db = sqlite3.connect(path)
    for migration in MIGRATIONS[:version]:
        # A whole script: a trigger's body has statements of its own.
        db.executescript(migration)
    return db


async def store_with_one_page(path: Path, version: int) -> SQLiteStateStore:
    """A store of schema *version* holding one page, opened (migrated) now;
    the page kept."""
    with closing(schema_at(path, version)) as db:
        db.execute("INSERT INTO pages (scope, url, etag, fingerprint) "
                   "VALUES ('s', 'http://a/', '\"x\"', 'ff')")
        db.execute(f"PRAGMA user_version = {version}")
        db.commit()
    store = SQLiteStateStore(path)
    assert (await call(store.get_page(PageKey("s", "http://a/")))).etag == '"x"'
    return store


def assert_upgraded(path: Path) -> None:
    """The store at *path* is at the current schema (19) after its migration."""
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 19


class TestSQLiteMigrations:
    """An existing store of an older schema is migrated in place, data kept."""

    @pytest_twisted.ensureDeferred
    async def test_a_new_store_says_once_that_it_was_created_an_old_one_each_step(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    ) -> None:
        caplog.set_level(logging.INFO, logger="incremental_crawler.state.stores.sqlite")
        new = SQLiteStateStore(tmp_path / "new.db")
        await call(new.close())
        await call((await store_with_one_page(tmp_path / "old.db", SCHEMA_VERSION - 2)).close())
        assert [r.getMessage() for r in caplog.records] == [
            f"State store {tmp_path / 'new.db'} created at schema version {SCHEMA_VERSION}",
            *(f"State store {tmp_path / 'old.db'} migrated to schema version {v}"
              for v in (SCHEMA_VERSION - 1, SCHEMA_VERSION)),
        ]

    @pytest_twisted.ensureDeferred
    async def test_version_15_store_gets_list_memberships_and_keeps_its_pages(
        self, tmp_path: Path,
    ) -> None:
        path = tmp_path / "v15.db"
        store = await store_with_one_page(path, 15)
        key = PageKey("s", "http://a/")
        old = await call(store.get_page(key))
        # Not on record: such a page's date does not vouch when re-seeded.
        assert (old.etag, old.fingerprint, old.listing) == ('"x"', "ff", None)
        store.stage_listing(key, "0123456789abcdef")
        await call(store.close())
        assert_upgraded(path)
        store = SQLiteStateStore(path)
        assert await call(store.get_page(key)) == old.copy(listing="0123456789abcdef")
        await call(store.close())

    @pytest_twisted.ensureDeferred
    async def test_version_1_store_is_migrated_and_keeps_its_pages(self, tmp_path: Path) -> None:
        path = tmp_path / "old.db"
        with closing(sqlite3.connect(path)) as db:
            # The real version-1 schema, as the first migration creates it.
            for statement in MIGRATIONS[0].split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(
                "INSERT INTO pages (scope, url, etag, fingerprint, first_seen, checks) "
                "VALUES ('s', 'http://a/', '\"x\"', 'ff', 1, 3)")
            db.execute("PRAGMA user_version = 1")
            db.commit()
        store = SQLiteStateStore(path)
        state = await call(store.get_page(PageKey("s", "http://a/")))
        assert (state.etag, state.fingerprint, state.checks, state.lastmod) == (
            '"x"', "ff", 3, None)
        store.stage_check(PageKey("s", "http://a/"), 304, 10, lastmod=9)
        await call(store.close())
        with closing(sqlite3.connect(path)) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
            assert db.execute("SELECT lastmod FROM pages").fetchone()[0] == 9

    @pytest_twisted.ensureDeferred
    async def test_version_6_store_gets_unstable_and_retrust_evidence(self, tmp_path: Path) -> None:
        path = tmp_path / "v6.db"
        with closing(schema_at(path, 6)) as db:
            db.execute(
                "INSERT INTO pages (scope, url, etag, fingerprint, first_seen, checks, flags) "
                "VALUES ('s', 'http://a/', '\"x\"', 'ff', 1, 3, 4)")
            db.execute("INSERT INTO hosts (scope, host, validators_distrusted_until) "
                       "VALUES ('s', 'a', 99)")
            db.execute("PRAGMA user_version = 6")
            db.commit()
        store = SQLiteStateStore(path)
        state = await call(store.get_page(PageKey("s", "http://a/")))
        assert (state.etag, state.flags, state.churns) == ('"x"', 4, 0)
        trust = await call(store.get_host("s", "a"))
        assert trust == HostTrust("s", "a", validators_distrusted_until=99)
        store.stage_page(state.copy(churns=2))
        await call(store.close())
        with closing(sqlite3.connect(path)) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
            assert db.execute("SELECT churns FROM pages").fetchone()[0] == 2

    @pytest_twisted.ensureDeferred
    async def test_version_7_store_gets_links_and_recipes_and_keeps_its_data(
        self, tmp_path: Path,
    ) -> None:
        path = tmp_path / "v7.db"
        with closing(schema_at(path, 7)) as db:
            db.execute(
                "INSERT INTO pages (scope, url, variant, etag, last_modified, fingerprint, "
                "size, last_status, first_seen, last_checked, last_fetched, last_changed, "
                "checks, changes, flags, redirect_to, lastmod, interval, next_visit, "
                "callback, churns) VALUES ('s', 'http://a/', 'de', '\"x\"', 'Sun', 'ff', "
                "10, 200, 1, 2, 3, 4, 5, 6, 5, NULL, 7, 3600, 8, 'parse', 1)")
            db.execute("INSERT INTO hosts (scope, host, lastmod_checks, validators_consistent) "
                       "VALUES ('s', 'a', 4, 2)")
            db.execute("INSERT INTO items (scope, item_key, fingerprint, first_seen, "
                       "last_changed, simhash) VALUES ('s', 'k', 'fp', 1, 1, 42)")
            db.execute("INSERT INTO item_versions VALUES ('s', 'k', 1, 'fp', '{\"n\": 1}', 1)")
            db.execute("PRAGMA user_version = 7")
            db.commit()
        key = PageKey("s", "http://a/", "de")
        old = PageState(key, '"x"', "Sun", "ff", 10, 200, 1, 2, 3, 4, 5, 6, 5, None, 7,
                        3600, 8, "parse", 1)
        store = SQLiteStateStore(path)
        assert await call(store.get_page(key)) == old
        assert old.recipe is None
        assert await call(store.get_links(key)) is None
        assert await call(store.get_host("s", "a")) == HostTrust(
            "s", "a", checks=4, validators_consistent=2)
        assert await call(store.get_item_simhash("s", "k")) == 42
        assert list(store.iter_items("s")) == [{"n": 1, "url": "k", "fingerprint": "fp"}]
        store.stage_links(key, '["http://a/b"]')
        store.stage_page(old.copy(recipe='{"priority":1}'))
        store.stage_flags(key, PageFlags.LINKS_KNOWN | PageFlags.HAS_LINKS)
        await call(store.close())

        store = SQLiteStateStore(path)
        assert await call(store.get_links(key)) == '["http://a/b"]'
        assert await call(store.get_page(key)) == old.copy(recipe='{"priority":1}', flags=29)
        await call(store.close())
        with closing(sqlite3.connect(path)) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
            columns = [row[1] for row in db.execute("PRAGMA table_info(links)")]
            assert columns == ["scope", "url", "variant", "data"]
            assert "recipe" in [row[1] for row in db.execute("PRAGMA table_info(pages)")]

    @pytest_twisted.ensureDeferred
    async def test_version_8_store_gets_failures_in_a_row_and_keeps_its_pages(
        self, tmp_path: Path,
    ) -> None:
        path = tmp_path / "v8.db"
        with closing(schema_at(path, 8)) as db:
            db.execute(
                "INSERT INTO pages (scope, url, variant, etag, fingerprint, last_status, "
                "next_visit, callback, recipe) VALUES ('s', 'http://a/', '', '\"x\"', 'ff', "
                "200, 8, 'parse', '{\"p\":1}')")
            db.execute("PRAGMA user_version = 8")
            db.commit()
        key = PageKey("s", "http://a/")
        store = SQLiteStateStore(path)
        old = await call(store.get_page(key))
        assert (old.etag, old.fingerprint, old.recipe, old.failures) == ('"x"', "ff", '{"p":1}', 0)
        store.stage_failure(key, 503, 10, failures=1, next_visit=5)
        await call(store.close())
        store = SQLiteStateStore(path)
        assert await call(store.get_page(key)) == old.copy(
            last_status=503, last_checked=10, checks=1, failures=1, next_visit=5)
        await call(store.close())
        assert_upgraded(path)

    @pytest_twisted.ensureDeferred
    async def test_version_10_store_gets_the_change_feed_and_keeps_its_data(
        self, tmp_path: Path,
    ) -> None:
        path = tmp_path / "v10.db"
        with closing(schema_at(path, 10)) as db:
            db.execute(
                "INSERT INTO pages (scope, url, variant, etag, fingerprint, last_status, "
                "next_visit, callback, flags) VALUES ('s', 'http://a/', '', '\"x\"', 'ff', "
                "200, 8, 'parse', 4)")
            db.execute("INSERT INTO items (scope, item_key, url, fingerprint, first_seen, "
                       "last_changed, version) VALUES ('s', 'http://a/', NULL, 'fp2', 1, 5, 2)")
            db.execute("INSERT INTO item_versions VALUES "
                       "('s', 'http://a/', 1, 'fp1', '{\"n\": 1}', 1)")
            db.execute("INSERT INTO item_versions VALUES "
                       "('s', 'http://a/', 2, 'fp2', '{\"n\": 2}', 5)")
            db.execute("PRAGMA user_version = 10")
            db.commit()
        key = PageKey("s", "http://a/")
        store = SQLiteStateStore(path)
        assert await call(store.get_page(key)) == PageState(
            key, '"x"', fingerprint="ff", last_status=200, next_visit=8, callback="parse",
            flags=4)
        # Versions stored before have no change type: new for version 1.
        assert list(store.iter_versions("s", every_version=True)) == [
            StoredVersion("s", "http://a/", 1, "new", 1, "fp1", {"n": 1}),
            StoredVersion("s", "http://a/", 2, "changed", 5, "fp2", {"n": 2}),
        ]
        # Stored without a page: the item belongs to the page of its key.
        assert await call(store.get_page_items("s", "http://a/")) == ["http://a/"]
        assert await call(store.get_item_fingerprint("s", "http://a/")) == "fp2"
        assert [due.key for due in await call(store.get_due("s", 10, 10))] == [key]
        store.stage_item(ItemRecord("s", "http://a/", "http://a/", "", '{"gone": 1}', 9,
                                    change=Change.DELETED))
        await call(store.close())

        store = SQLiteStateStore(path)
        assert [(v.version, v.change) for v in store.iter_versions("s", every_version=True)] == [
            (1, "new"), (2, "changed"), (3, "deleted")]
        assert await call(store.get_page_items("s", "http://a/")) == []
        await call(store.close())
        assert_upgraded(path)

    @pytest_twisted.ensureDeferred
    async def test_version_8_store_gets_stale_lastmod_findings(self, tmp_path: Path) -> None:
        path = tmp_path / "v8.db"
        with closing(schema_at(path, 8)) as db:
            db.execute("INSERT INTO hosts (scope, host, lastmod_checks, distrusted_until) "
                       "VALUES ('s', 'a', 4, 77)")
            db.execute("PRAGMA user_version = 8")
            db.commit()
        store = SQLiteStateStore(path)
        trust = await call(store.get_host("s", "a"))
        assert trust == HostTrust("s", "a", checks=4, distrusted_until=77, stale_lastmods=0)
        store.stage_host(HostTrust("s", "a", checks=4, distrusted_until=77, stale_lastmods=2))
        await call(store.close())
        store = SQLiteStateStore(path)
        assert (await call(store.get_host("s", "a"))).stale_lastmods == 2
        await call(store.close())
        assert_upgraded(path)

    @pytest_twisted.ensureDeferred
    async def test_version_11_store_gets_crawl_records_and_holds(self, tmp_path: Path) -> None:
        path = tmp_path / "v11.db"
        store = await store_with_one_page(path, 11)
        assert store.crawls("s", 5) == [] and store.scope_holders("s", 0) == {}
        store.stage_crawl(CrawlRecord("s", 1.5, 2.25, figures={"requests": 1}))
        assert store.take_scope("s", "me", 60, now=100) is None
        await call(store.close())
        store = SQLiteStateStore(path)
        assert store.crawls("s", 5) == [CrawlRecord("s", 1.5, 2.25, figures={"requests": 1})]
        assert store.scope_holders("s", 100) == {"me": 160}
        await call(store.close())
        assert_upgraded(path)

    @pytest_twisted.ensureDeferred
    async def test_version_12_store_gets_live_run_marks(self, tmp_path: Path) -> None:
        path = tmp_path / "v12.db"
        with closing(schema_at(path, 12)) as db:
            db.execute("INSERT INTO items (scope, item_key, fingerprint, first_seen, "
                       "last_changed, version) VALUES ('s', 'k', 'fp2', 5, 10, 2)")
            db.executemany(
                "INSERT INTO item_versions (scope, item_key, version, fingerprint, data, "
                "stored_at, change) VALUES ('s', 'k', ?, ?, ?, ?, ?)",
                [(1, "fp1", '{"n": 1}', 5, "new"), (2, "fp2", '{"n": 2}', 10, "changed")])
            db.execute("PRAGMA user_version = 12")
            db.commit()
        store = SQLiteStateStore(path)
        # When its live run began is unknown: the version's own change.
        assert [(v.version, v.change) for v in store.iter_versions("s", since=1)] == [
            (2, "changed")]
        store.stage_item(ItemRecord("s", "k", "k", "", '{"gone": 1}', 20, change=Change.DELETED))
        store.stage_item(ItemRecord("s", "k", "k", "fp4", '{"n": 4}', 30, change=Change.NEW))
        store.stage_item(ItemRecord("s", "k", "k", "fp5", '{"n": 5}', 40,
                                    change=Change.CHANGED))
        await call(store.close())
        store = SQLiteStateStore(path)
        assert [(v.version, v.change) for v in store.iter_versions("s", since=25)] == [
            (5, "new")]
        assert [(v.version, v.change) for v in store.iter_versions("s", since=15)] == [
            (5, "changed")]
        await call(store.close())
        assert_upgraded(path)

    @pytest_twisted.ensureDeferred
    async def test_version_15_store_gets_due_indexes_and_sums_of_its_pages(
        self, tmp_path: Path,
    ) -> None:
        """The sums a summary reads are built once from the pages there are:
        a store of schema 15 summarizes as it did (never an empty store)."""
        path = tmp_path / "v15.db"
        rows = [(f"http://a/{n}", "", 10 + n, n * 397 % 5_000, 1_000 + n % 7,
                 None if n % 5 == 0 else ("parse", "parse_list")[n % 3 == 0])
                for n in range(60)]
        with closing(schema_at(path, 15)) as db:
            db.executemany(
                "INSERT INTO pages (scope, url, variant, size, next_visit, last_checked, "
                "callback) VALUES ('s', ?, ?, ?, ?, ?, ?)", rows)
            db.execute("PRAGMA user_version = 15")
            db.commit()
        store = SQLiteStateStore(path)
        states = list(store.iter_pages("s"))
        for after, upto, checked_before in ((-math.inf, math.inf, math.inf),
                                            (700, math.inf, 1_004), (-5, 2_400, 1_003)):
            expected = brute_summary(states, after, upto, checked_before, ("parse_list",))
            assert tuple(await call(store.summarize_pages(
                "s", after=after, upto=upto, checked_before=checked_before,
                exclude_callbacks=("parse_list",)))) == expected
        due = await call(store.get_due("s", 600, 100))
        assert [s.next_visit for s in due] == sorted(
            nv for _, _, _, nv, _, callback in rows if callback and nv <= 600)
        await call(store.close())
        assert_upgraded(path)

    @pytest_twisted.ensureDeferred
    async def test_version_13_store_gets_remembered_slot_rates(self, tmp_path: Path) -> None:
        path = tmp_path / "v13.db"
        store = await store_with_one_page(path, 13)
        assert (await call(store.slot_rates("s"))).rates == []
        rate = SlotRate("s", "a", 12.5, False, 100.0, "penalty box")
        store.stage_slot_rates([rate])
        await call(store.close())
        store = SQLiteStateStore(path)
        assert (await call(store.slot_rates("s"))).rates == [rate]
        await call(store.close())
        assert_upgraded(path)

    @pytest_twisted.ensureDeferred
    async def test_version_17_store_gets_write_generations_and_walk_memos(
        self, tmp_path: Path,
    ) -> None:
        """A migrated store starts its scopes' generations from nothing; its
        first write of a page moves them."""
        path = tmp_path / "v17.db"
        store = await store_with_one_page(path, 17)
        before = await call(store.write_generation("s", ["a"]))
        assert await call(store.get_walk_memo("s", "start")) is None
        await call(store.put_walk_memo("s", "start", "memo"))
        assert await call(store.write_generation("s", ["a"])) == before
        store.stage_check(PageKey("s", "http://a/"), 304, 1_000)
        await call(store.flush())
        assert await call(store.write_generation("s", ["a"])) != before
        assert await call(store.get_walk_memo("s", "start")) == "memo"
        await call(store.close())
        assert_upgraded(path)
