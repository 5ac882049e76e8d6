"""Copying a scope's stored state from one store to another (``scrapy state copy``).

A user who outgrows a store (SQLite, one Redis server) moves to a larger one
(a Redis server, a Redis Cluster) without starting over: everything the
scope holds is read through the source's administration interface and
written through the destination's own staged writes, so that a crawl on the
destination does what it would have done on the source (the same pages not
due, the same validators sent, no item new, undelivered versions still
waiting on their crawl).

What is copied, in this order: host trust records, remembered politeness
rates, crawl records, pages with their links records, then items with
their kept versions (tombstones too) and delivery marks. Walk memos are
not: they hold only while the store's write generation stays, and the
destination's is its own; the first crawl there walks the stored links once.

A copy never merges: a destination that holds anything of the scope is
refused. It marks the destination's scope before writing anything (a memo
named :data:`COPY_MARK`) and marks it done only once every kind of record
was counted the same on both sides, so a copy cut short is told apart from
a whole one: it is refused next time until the partial scope is reset,
and a crawl there refuses to start (:func:`refuse_a_crawl_of_a_partial_copy`).
Both scopes are held (as a crawl holds its scope) while the copy runs; a
writer that does not hold the source's scope (a crawl whose hold lapsed
while its process stalled, a process that takes none) is told by the
source's write generation, read once held and again at the end: the copy
is then not verified.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
from typing import TYPE_CHECKING, NamedTuple

from incremental_crawler import clock
from incremental_crawler.state.records import ItemRecord
from incremental_crawler.state.stores.base import (
    COPY_HOLD,
    Removed,
    StateStoreError,
    describe_holder,
)
from incremental_crawler.uris import redacted

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

    from incremental_crawler.state.records import PageState, StoredVersion
    from incremental_crawler.state.stores.base import AdminStore, StateStore, StoredItem

__all__ = [
    "COPY_MARK",
    "CopyCounts",
    "ScopeCopyError",
    "copy_plan",
    "copy_scope",
    "refuse_a_crawl_of_a_partial_copy",
    "refuse_destination",
]

#: The memo of a copied scope in the destination: JSON with ``"done"``
#: false while the copy runs (or after it was cut short), true once verified.
COPY_MARK = "scope-copy"
#: Pages (with their links) per flush, and item writes per flush (one per
#: version an item ever had, a long history's flushed in several): memory
#: is bounded by this many records, whatever the scope's size.
BATCH = 500
#: Seconds a copy's holds last unless refreshed (between batches, and
#: between the steps of a count): ten times a crawl's, as one step (a
#: store's count of a large scope) refreshes nothing while it runs. A
#: killed copy's hold lapses then, or at once for a crawl of this host (its
#: pid is gone).
_HOLD_TTL = 600.0


class ScopeCopyError(StateStoreError):
    """A copy refused or stopped; the message says why and what to do."""


async def _nothing() -> None:
    return None


class CopyCounts(NamedTuple):
    """What a scope holds, by kind, as a copy counts it on each side."""

    records: Removed
    #: Remembered politeness rates (not among what a reset counts).
    rates: int
    #: Item versions waiting on a crawl's delivery.
    undelivered: int

    def describe(self) -> str:
        return (f"{self.records.describe()}, {self.rates} remembered politeness "
                f"rate{'' if self.rates == 1 else 's'}, {self.undelivered} "
                f"undelivered item version{'' if self.undelivered == 1 else 's'}")


async def count(store: AdminStore, scope: str,
                refresh: Callable[[], Awaitable[None]] = _nothing) -> CopyCounts:
    """Every kind of record of *scope* in *store*, counted; *refresh*
    awaited between the steps (a copy's holds kept)."""
    records = store.count_scope(scope)._replace(rates=0)
    await refresh()
    pending = 0
    for crawl in await store.undelivered_crawls(scope):
        async for _ in _undelivered(store, scope, crawl):
            pending += 1
            await refresh()
    return CopyCounts(records, len(store.read_slot_rates(scope).rates), pending)


async def _undelivered(store: AdminStore, scope: str,
                       crawl: str) -> AsyncIterator[StoredVersion]:
    """The versions of *scope* waiting on *crawl*, read :data:`BATCH` at a time."""
    after = None
    while True:
        chunk = await store.undelivered(scope, crawl, after=after, limit=BATCH)
        for pending in chunk:
            yield pending.version
        if len(chunk) < BATCH:
            return
        after = chunk[-1]


async def refuse_destination(destination: AdminStore, scope: str, dest_uri: str) -> None:
    """Refuse a destination that holds anything of *scope*, or the remains
    of a copy of it that was cut short."""
    mark = await destination.get_walk_memo(scope, COPY_MARK)
    reset = _reset_hint(scope, dest_uri)
    if mark is not None and not _done(mark):
        raise ScopeCopyError(
            f"a copy of scope {scope!r} into {destination.location} was cut short (or "
            f"could not be verified): its partial scope is there. Delete it with: "
            f"{reset} (then copy again)")
    if scope in destination.scopes():
        raise ScopeCopyError(
            f"{destination.location} already holds scope {scope!r} "
            f"({destination.count_scope(scope).describe()}); a copy never merges into "
            f"it: copy to another store, or delete it there first with: {reset}")


def refuse_a_crawl_of_a_partial_copy(store: StateStore, scope: str) -> None:
    """Refuse a crawl of *scope* in *store* while a copy into it is under
    way, or after one was cut short (its mark there is not done): the scope
    is partial there, and a crawl would take every item the copy had not
    written yet for new (and every page for unknown). One memo read."""
    mark = store.get_walk_memo_now(scope, COPY_MARK)
    if mark is not None and not _done(mark):
        raise StateStoreError(
            f"State store {store.location}: scope {scope!r} is a copy made by 'scrapy state "
            "copy' that is under way, or was cut short (or could not be verified): what it "
            "holds is partial, and a crawl would emit as new every item not copied yet. "
            "If no copy is running, delete it with 'scrapy state reset --spider "
            f"{shlex.quote(scope)} --yes' on this store, then copy again")


def _done(mark: str) -> bool:
    """Whether a copy mark says the copy was verified (one that cannot be
    read says nothing of the kind)."""
    try:
        return json.loads(mark).get("done") is True
    except (ValueError, AttributeError):
        return False


def _reset_hint(scope: str, dest_uri: str) -> str:
    """The command that deletes *scope* from the destination, quoted for a
    shell (no secrets: the user puts back a password the URI had)."""
    return (f"scrapy state reset --spider {shlex.quote(scope)} --yes "
            f"-s {shlex.quote(f'INCREMENTAL_STATE_URI={redacted(dest_uri)}')}")


async def copy_plan(source: AdminStore, scope: str,
                    refresh: Callable[[], Awaitable[None]] = _nothing) -> CopyCounts:
    """What a copy of *scope* would write (nothing is written); *refresh*
    as for :func:`count`."""
    if scope not in source.scopes():
        raise ScopeCopyError(f"scope {scope!r} has nothing stored in {source.location}")
    mark = await source.get_walk_memo(scope, COPY_MARK)
    if mark is not None and not _done(mark):
        # Copied on, it would verify against itself and be marked done.
        raise ScopeCopyError(
            f"scope {scope!r} of {source.location} is itself a copy that is under way, or "
            f"was cut short (or could not be verified){_copied_from(mark)}: it is partial, "
            "and a copy of it would be too; copy from the store it came from")
    return await count(source, scope, refresh)


def _copied_from(mark: str) -> str:
    """Where a copy mark says its scope was copied from, for a message."""
    try:
        where = json.loads(mark).get("from")
    except (ValueError, AttributeError):
        return ""
    return f" from {where}" if isinstance(where, str) else ""


class _Holds:
    """A copy's holds on the source's and the destination's scope (as a
    crawl's: no crawl of the scope starts on either while it copies)."""

    def __init__(self, stores: list[AdminStore], scope: str) -> None:
        self.stores, self.scope = stores, scope
        self.holder = f"{COPY_HOLD}{socket.gethostname()}:{os.getpid()}"
        self.taken: list[AdminStore] = []
        self.at = 0.0

    def take(self) -> None:
        now = clock.now()
        for store in self.stores:
            held = store.take_scope(self.scope, self.holder, _HOLD_TTL, now)
            if held is not None:
                raise ScopeCopyError(
                    f"scope {self.scope!r} of {store.location} is held by "
                    f"{describe_holder(held[0])}; "
                    "try again when it has finished or its hold has lapsed")
            self.taken.append(store)
        self.at = now

    async def refresh(self) -> None:
        now = clock.now()
        if now - self.at >= _HOLD_TTL / 3:
            for store in self.taken:
                await store.hold_scope(self.scope, self.holder, _HOLD_TTL, now)
            self.at = now

    async def release(self) -> None:
        for store in self.taken:
            await store.release_scope(self.scope, self.holder)


async def copy_scope(source: AdminStore, destination: AdminStore, scope: str, dest_uri: str,
                     *, say: Callable[[str], None] = lambda line: None) -> CopyCounts:
    """Copy everything of *scope* from *source* into *destination*; verify
    that every kind of record counts the same on both sides. Returns the
    counts. Raises :class:`ScopeCopyError` (the destination's partial scope
    named, and what to do) when it is refused, stops or does not verify."""
    await refuse_destination(destination, scope, dest_uri)
    holds = _Holds([source, destination], scope)
    try:
        holds.take()
        # Again once held: a crawl (or another copy) that wrote the scope
        # there and ended between the first look and the hold is merged
        # into otherwise.
        await refuse_destination(destination, scope, dest_uri)
        # Counted once held: no crawl that holds its scope changes the
        # source from here on; the write generation tells whether a writer
        # that does not hold it wrote it meanwhile.
        hosts = source.page_hosts(scope) if source.write_generation_per_host else []
        generation = await source.write_generation(scope, hosts)
        expected = await copy_plan(source, scope, holds.refresh)
        say(f"counted in the source: {expected.describe()}")
        mark = {"done": False, "from": source.location, "started": clock.now()}
        await destination.put_walk_memo(scope, COPY_MARK, json.dumps(mark))
        if await destination.get_walk_memo(scope, COPY_MARK) is None:
            raise ScopeCopyError(
                f"{destination.location} keeps no memos (StateStore.put_walk_memo): a copy "
                "cut short could not be told from a whole one there, so none is made")
        try:
            await _copy(source, destination, scope, expected, holds, say)
        except (StateStoreError, OSError) as exc:
            raise ScopeCopyError(
                f"the copy of scope {scope!r} stopped: {exc}. The destination "
                f"{destination.location} holds part of it, marked as cut short; delete it "
                f"with: {_reset_hint(scope, dest_uri)} (then copy again)") from exc
        if await _source_moved(source, scope, hosts, generation):
            raise ScopeCopyError(
                f"the source {source.location} changed while scope {scope!r} was copied (a "
                "page state or a links record was written by a process that does not hold "
                "the scope: a crawl whose hold lapsed, or one that takes none); the copy is "
                "not verified and stays marked as cut short. Stop that crawl, then delete "
                "the copy with: "
                f"{_reset_hint(scope, dest_uri)} (then copy again)")
        copied = await count(destination, scope, holds.refresh)
        if copied != expected:
            raise ScopeCopyError(
                f"the copy of scope {scope!r} does not verify: the source holds "
                f"{expected.describe()}; {destination.location} holds {copied.describe()}. "
                "It stays marked as cut short (a crawl there would not do what it did "
                "on the source); check the destination's INCREMENTAL_ITEM_HISTORY and "
                "INCREMENTAL_CRAWL_HISTORY (they prune what is written beyond them)")
        mark.update(done=True, finished=clock.now())
        await destination.put_walk_memo(scope, COPY_MARK, json.dumps(mark))
        return copied
    finally:
        await holds.release()


async def _source_moved(source: AdminStore, scope: str, hosts: list[str],
                        generation: str | None) -> bool:
    """Whether a page state or a links record of the source's scope was
    written since *generation* was read for *hosts* (the counts may match
    all the same: a check changes no count). A store that keeps no write
    generation (``None``) cannot tell: its copy is verified by counts only."""
    if generation is None:
        return False
    if source.write_generation_per_host and source.page_hosts(scope) != hosts:
        return True
    return await source.write_generation(scope, hosts) != generation


async def _copy(source: AdminStore, destination: AdminStore, scope: str,
                expected: CopyCounts, holds: _Holds, say: Callable[[str], None]) -> None:
    for trust in source.iter_hosts(scope):
        destination.stage_host(trust)
    rates = source.read_slot_rates(scope)
    if rates.unreadable:
        raise ScopeCopyError(
            f"the remembered politeness rates of slots {', '.join(rates.unreadable)} of "
            f"scope {scope!r} in {source.location} cannot be read (damaged); forget their "
            "hosts with 'scrapy state forget-host' first")
    destination.stage_slot_rates(rates.rates)
    # Oldest first, as crawls wrote them: the destination keeps the newest.
    for record in reversed(source.crawls(scope, max(1, expected.records.crawls))):
        destination.stage_crawl(record)
    await destination.flush()
    say("host records, remembered rates and crawl records copied")

    pages = 0
    batch: list[PageState] = []
    for state in source.iter_pages(scope):
        batch.append(state)
        if len(batch) == BATCH:
            pages += await _copy_pages(source, destination, batch)
            batch = []
            await holds.refresh()
    pages += await _copy_pages(source, destination, batch)
    say(f"{_count(pages, 'page')} copied, with their links records")

    pending: dict[tuple[str, int], str] = {}
    for crawl in await source.undelivered_crawls(scope):
        # Held whole (keys and numbers only): as many as a killed crawl
        # left undelivered, usually none.
        async for version in _undelivered(source, scope, crawl):
            pending[version.key, version.version] = crawl
            await holds.refresh()

    async def flush_when_full() -> None:
        # By writes, not items: an item of a long history stages one write
        # per version it ever had (see _stage_item), flushed as they go.
        if destination.pending >= BATCH:
            await destination.flush()
            await holds.refresh()

    items = 0
    for item in source.iter_item_states(scope):
        await _stage_item(destination, item, pending, flush_when_full)
        items += 1
    await destination.flush()
    say(f"{_count(items, 'item')} copied, with their kept versions")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


async def _copy_pages(source: AdminStore, destination: AdminStore,
                      batch: list[PageState]) -> int:
    links = await source.get_links_many([state.key for state in batch])
    for state in batch:
        data = links.get(state.key)
        if data is not None:
            # Right before the page's state, as a crawl stages them: both
            # are committed together.
            destination.stage_links(state.key, data)
        destination.stage_page(state)
    await destination.flush()
    return len(batch)


async def _stage_item(destination: AdminStore, item: StoredItem,
                      pending: dict[tuple[str, int], str],
                      after_each: Callable[[], Awaitable[None]]) -> None:
    """Stage *item*'s versions in order, so that the destination ends with
    the same version numbers, history, record and delivery marks, and the
    same live run (born, died: a change feed since a time says the same).

    A store numbers an item's versions itself (each write one up): the
    versions the source no longer keeps (pruned beyond its history, or
    stored without data) are written as versions without data, which the
    destination numbers and does not keep either (see :func:`_item_writes`).
    *after_each* is awaited after each write (it flushes them by batches).
    """
    def record(**fields: object) -> ItemRecord:
        return ItemRecord(scope=item.scope, key=item.key, url=item.url, page=item.page,
                          simhash=item.simhash, **fields)  # type: ignore[arg-type]

    for fingerprint, stored_at, kept in _item_writes(item):
        if kept is None:
            destination.stage_item(record(fingerprint=fingerprint, stored_at=stored_at))
        else:
            destination.stage_item(record(
                fingerprint=kept.fingerprint, stored_at=kept.stored_at,
                data=json.dumps(kept.data, separators=(",", ":"), ensure_ascii=False),
                change=kept.change, delivery=pending.get((item.key, kept.version))))
        await after_each()


def _item_writes(item: StoredItem) -> Iterator[tuple[str, float, StoredVersion | None]]:
    """One write per version number of *item*, in order: a kept version's
    own, or a filler (fingerprint, when; empty fingerprint: a tombstone).

    The fillers stand for versions that left no data: each repeats the
    write before it (the first: live, when the item was first seen), but
    for what a store derives from them, the item's live run: the latest
    tombstone when its own version is pruned (:attr:`StoredItem.died`), and
    after a tombstone the comeback (:attr:`StoredItem.born`).
    """
    kept = item.versions
    # Any live fingerprint: a filler's is not kept, only told from a tombstone's.
    live = next((v.fingerprint for v in kept if v.fingerprint), item.fingerprint) or "-"
    first = kept[0].version if kept else item.version
    unkept = first - 1
    died_at = 0  # the filler slot of the latest tombstone, when it is pruned
    if item.died is not None and unkept >= 2 and not any(
            not v.fingerprint and v.stored_at == item.died for v in kept):
        # Its comeback a filler too when the first kept version is not it.
        comeback_kept = not kept or item.born is None or kept[0].stored_at == item.born
        died_at = unkept if comeback_kept or unkept < 3 else unkept - 1
    fingerprint, when = live, item.first_seen

    def filler(slot: int) -> tuple[str, float, None]:
        nonlocal fingerprint, when
        if slot == item.version:
            # The latest version: the item's record as the source has it.
            fingerprint, when = item.fingerprint, item.stored_at
        elif slot == died_at:
            fingerprint, when = "", item.died  # type: ignore[assignment]
        elif not fingerprint:
            # Back after a tombstone: its live run begins.
            fingerprint = live
            if item.born is not None and item.born >= when:
                when = item.born
        return fingerprint, when, None

    slot = 0
    for version in kept:
        while slot < version.version - 1:
            slot += 1
            yield filler(slot)
        slot = version.version
        fingerprint, when = version.fingerprint, version.stored_at
        yield version.fingerprint, version.stored_at, version
    while slot < item.version:
        slot += 1
        yield filler(slot)
