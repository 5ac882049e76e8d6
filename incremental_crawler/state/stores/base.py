"""The interfaces of a state store: what a crawl needs, and what administration needs.

:class:`StateStore` is the crawl interface, the one every store implements:
reads, staged writes, flushes, crawl records and a crawl's hold on its scope.
:class:`AdminStore` adds what ``scrapy state`` and ``scrapy items`` need: the
read-outs, the repairs and the exports; a store without it runs crawls, and
those commands refuse it, naming what is missing. A store is found by the
scheme of its URI in ``INCREMENTAL_STATE_STORES`` (see
:mod:`incremental_crawler.state.stores`); it says whether a URI names an
existing store (:meth:`StateStore.exists`), so that the commands never
create one.

Reads are ``async`` so that a networked store (Redis) never blocks the
reactor; writes are *staged* in memory and committed by :meth:`flush`, which
commits everything staged so far atomically and in staging order. That is
what "state is never ahead of data" rests on: the ledger stages a page's validators only after
the items extracted from that page, so no flush can ever commit the
validators without the data.
"""

from __future__ import annotations

import os
import socket
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, NamedTuple

from incremental_crawler.config import DEFAULT_SETTINGS, SettingError, redis_retry_setting
from incremental_crawler.hosts import host_of
from incremental_crawler.state.records import is_gone
from incremental_crawler.uris import redacted

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Iterator
    from typing import Self

    from scrapy.settings import BaseSettings

    from incremental_crawler.state.records import (
        CrawlRecord,
        HostTrust,
        ItemRecord,
        PageKey,
        PageState,
        SlotRate,
        StoredVersion,
        Undelivered,
    )

__all__ = [
    "COPY_HOLD",
    "REPAIR_HOLD",
    "SHARED_HOLD",
    "SLOT_RATES_KEPT",
    "AdminStore",
    "CrawlStore",
    "DueAfter",
    "HoldLapsed",
    "HostSummary",
    "PagesSummary",
    "Removed",
    "RepairStopped",
    "ScopeHeld",
    "SlotRates",
    "StateStore",
    "StateStoreError",
    "StoredItem",
    "StoredStateDamaged",
    "UrlRecord",
    "checked_after",
    "crawl_history_setting",
    "dead_pid",
    "describe_holder",
    "due_after",
    "hold_process",
    "holder_gone",
    "holds_conflict",
    "host_of",
    "item_history_setting",
    "redis_retry_setting",
    "takes_over",
]


#: Remembered politeness rates kept per scope (:meth:`StateStore.stage_slot_rates`):
#: the slots saved most recently. A broad crawl of more sites than this
#: starts the others from the default rate.
SLOT_RATES_KEPT = 1000
#: Due pages read per step by the default :meth:`StateStore.summarize_pages`.
_SUMMARY_CHUNK = 1000


#: Where a reading of the due pages goes on from (:meth:`StateStore.get_due`):
#: the last page read, as its place in their order (next visit, URL, variant).
DueAfter = tuple[int, str, str]


def due_after(state: PageState) -> DueAfter:
    """The place of *state* in the order of the due pages: a reader paging
    through them passes the last page it read as ``get_due(..., after=...)``."""
    return (int(state.next_visit), state.key.url, state.key.variant)


def checked_after(after: object) -> DueAfter | None:
    """*after* as :meth:`StateStore.get_due` takes it, or a clear error (an
    offset, the argument's meaning before it, is refused: paging by offset
    cost every page read before)."""
    if after is None:
        return None
    if (isinstance(after, tuple) and len(after) == 3 and isinstance(after[0], int | float)
            and not isinstance(after[0], bool)
            and isinstance(after[1], str) and isinstance(after[2], str)):
        return (int(after[0]), after[1], after[2])
    raise TypeError(
        f"get_due(after={after!r}): the place of the last page read, (next visit, URL, "
        "variant) as due_after(state) gives it, or None; not an offset")


class SlotRates(NamedTuple):
    """A scope's remembered politeness rates (:meth:`StateStore.slot_rates`)."""

    rates: list[SlotRate]
    #: The slots whose record could not be read (damaged): left out of *rates*.
    unreadable: list[str]


class PagesSummary(NamedTuple):
    """Pages of a scope in aggregate (:meth:`StateStore.summarize_pages`)."""

    pages: int = 0
    #: Their stored body sizes, summed.
    size: int = 0
    #: The earliest of their next visits (``None``: no page).
    first_due: float | None = None


class HostSummary(NamedTuple):
    """The pages of one host of a scope in aggregate, with its trust record
    (:meth:`StateStore.summarize_hosts`)."""

    host: str
    pages: int = 0
    #: Pages that can be requested again (a callback) whose next visit is
    #: not after the time asked about: gone ones too once their (rare)
    #: recheck is due.
    due: int = 0
    #: Pages flagged ``PageFlags.GONE``.
    gone: int = 0
    #: Pages whose last visits failed (``failures > 0``).
    failing: int = 0
    #: Their stored body sizes, summed.
    size: int = 0
    #: The host's stored lastmod and validator trust (``None``: none stored).
    trust: HostTrust | None = None


class UrlRecord(NamedTuple):
    """Everything stored about one URL of a scope (:meth:`StateStore.url_record`)."""

    scope: str
    url: str
    #: Its page states, one per variant (the plain one first); empty when
    #: the store does not know the page.
    pages: list[PageState]
    #: Its links records, by variant.
    links: dict[str, str]
    #: Keys of the live items last stored from the page.
    items: list[str]
    #: The latest version of each of those items that was stored with data.
    latest: list[StoredVersion]


class StoredItem(NamedTuple):
    """Everything stored of one item of a scope (:meth:`AdminStore.iter_item_states`):
    its record as the latest version left it, and its kept history."""

    scope: str
    key: str
    #: The URL stored with its latest version (the key when none was given).
    url: str
    #: The page it was last stored from (the key when none was given).
    page: str
    #: Its latest version's fingerprint; empty for a tombstone.
    fingerprint: str
    simhash: int | None
    #: Its latest version's number (versions without data count too).
    version: int
    #: When its first version was stored, and its latest (whole seconds).
    first_seen: float
    stored_at: float
    #: Its kept versions with data (tombstones included), oldest first.
    versions: list[StoredVersion]
    #: When its current live run began (``None`` while it is deleted), and
    #: when its latest tombstone was stored (``None``: never deleted), whole
    #: seconds: what a change feed since a time tells new by
    #: (:meth:`AdminStore.iter_versions`), kept when its versions are pruned.
    born: float | None = None
    died: float | None = None


class Removed(NamedTuple):
    """What a repair deleted, by kind of record."""

    pages: int = 0
    links: int = 0
    items: int = 0
    #: Stored item versions (the items' history).
    versions: int = 0
    hosts: int = 0
    crawls: int = 0
    #: Remembered politeness rates (of the slot named by a forgotten host);
    #: a reset deletes the scope's without counting them (not data).
    rates: int = 0

    def describe(self) -> str:
        """``"3 pages, 1 links record, ..."``: the counts, for people (the
        remembered rate only when one went)."""
        names = (("page", "pages"), ("links record", "links records"), ("item", "items"),
                 ("item version", "item versions"), ("host record", "host records"),
                 ("crawl record", "crawl records"),
                 ("remembered politeness rate", "remembered politeness rates"))
        return ", ".join(f"{n} {one if n == 1 else many}"
                         for i, (n, (one, many)) in enumerate(zip(self, names, strict=True))
                         if n or i < len(names) - 1)


#: How the holder of a scope's hold begins when the hold is not a crawl's
#: exclusive one (``host:pid``). Cluster workers of a run hold the scope
#: together (shared); a repair holds it alone, as a crawl does, and no
#: crawl or worker may start while it does (nor it while one holds).
SHARED_HOLD = "worker@"
REPAIR_HOLD = "repair@"
#: A ``scrapy state copy``'s hold (on the source and the destination): alone,
#: as a crawl's, but no crawl (no checks to note from its start).
COPY_HOLD = "copy@"


def _hold_kind(holder: str) -> tuple[str, str]:
    """*holder*'s kind (:data:`SHARED_HOLD`, :data:`REPAIR_HOLD`,
    :data:`COPY_HOLD`, '' for a crawl) and its process's name
    (``host:pid...``)."""
    for kind in (SHARED_HOLD, REPAIR_HOLD, COPY_HOLD):
        if holder.startswith(kind):
            return kind, holder[len(kind):]
    return "", holder


def holds_conflict(holder: str, other: str) -> bool:
    """Whether *holder* may not hold a scope beside *other*'s live hold:
    only cluster workers share one (a holder never conflicts with itself)."""
    return holder != other and not (holder.startswith(SHARED_HOLD)
                                    and other.startswith(SHARED_HOLD))


def describe_holder(holder: str) -> str:
    """*holder* for people: ``crawl host:pid``, ``cluster worker
    host:pid:id``, ``repair host:pid``, ``copy host:pid``."""
    kind, name = _hold_kind(holder)
    return {SHARED_HOLD: "cluster worker", REPAIR_HOLD: "repair",
            COPY_HOLD: "copy"}.get(kind, "crawl") + f" {name}"


def is_crawl_hold(holder: str) -> bool:
    """Whether *holder* is a crawl's own hold (one process, not a cluster
    worker, a repair or a copy): its start is where its checks are noted
    from (the stores' marks)."""
    return _hold_kind(holder)[0] == ""


def hold_process(holder: str) -> str:
    """The process (``host:pid``) of *holder*, of any kind: a cluster
    worker's hold is named apart from its worker id, in the same process."""
    host, _, rest = _hold_kind(holder)[1].partition(":")
    return f"{host}:{rest.partition(':')[0]}"


def dead_pid(holder: str) -> int | None:
    """The pid of *holder* (``host:pid...``, a crawl's hold, or a worker's
    or a repair's) if it is a process of this host that is not running: a
    killed crawl, whose hold has not lapsed yet."""
    host, _, rest = _hold_kind(holder)[1].partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit() or int(pid) <= 0:
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return int(pid)
    except OSError:  # it runs, as another user
        return None
    return None


def _whole_number_setting(settings: BaseSettings | None, name: str, minimum: int,
                          hint: str = "") -> int:
    """The whole-number setting *name* from *settings* (its default without
    them), at least *minimum*: a store reads it before any component would."""
    raw = None if settings is None else settings.get(name)
    if raw is None:
        return int(DEFAULT_SETTINGS[name])
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise SettingError(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise SettingError(f"{name}={raw!r} must be at least {minimum}{hint}")
    return value


def crawl_history_setting(settings: BaseSettings | None) -> int:
    """INCREMENTAL_CRAWL_HISTORY from *settings* (its default without them)."""
    return _whole_number_setting(settings, "INCREMENTAL_CRAWL_HISTORY", 1)


def item_history_setting(settings: BaseSettings | None) -> int:
    """INCREMENTAL_ITEM_HISTORY from *settings* (its default without them)."""
    return _whole_number_setting(settings, "INCREMENTAL_ITEM_HISTORY", 0,
                                 " (0 keeps every version)")


def holder_gone(holder: str) -> bool:
    """Whether *holder* (``host:pid``, a crawl's name in its scope's holds)
    is a process of this host that is no longer running: its hold (a crawl
    killed by ``kill -9``) need not be waited for. A process of another host
    is never known to be gone: its hold lapses by itself."""
    return dead_pid(holder) is not None


def takes_over(holder: str, other: str) -> bool:
    """Whether *holder*, starting, takes over *other*'s hold that has not
    lapsed: its process is gone (:func:`holder_gone`). Not by a repair: it
    waits until the hold lapses (``scrapy state`` names the killed crawl
    meanwhile), as it always did. Nor a repair's hold: a pid is known gone
    only in this PID namespace, and containers sharing a host name would
    take a live repair's over; it lapses a minute after the repair died."""
    return (not holder.startswith(REPAIR_HOLD) and not other.startswith(REPAIR_HOLD)
            and holder_gone(other))


class StateStoreError(RuntimeError):
    """The state store cannot be used; the message names it and says why.

    Raised instead of ever starting over with an empty store: a store that
    silently forgot its state would re-download everything at best, and at
    worst (half a store) lose changes.
    """


class StoredStateDamaged(StateStoreError):
    """A flush stored all it held but met stored state of another writer
    that it cannot apply (a damaged entry of a Redis Cluster store's
    ledger): nothing of this flush is left to write again, so a flush
    after it may succeed, and the error must be said all the same (the
    damage stays until repaired by hand)."""


class HoldLapsed(StateStoreError):
    """A hold could not be refreshed: it lapsed, or was released or taken
    over, before its refresh. Another may have held the scope meanwhile (a
    repair that came and went), so the hold is not taken again: its holder
    stops writing."""

    @classmethod
    def of(cls, location: str, scope: str, holder: str) -> HoldLapsed:
        return cls(f"State store {location}: the hold of {describe_holder(holder)} on scope "
                   f"{scope!r} lapsed or was released (another may have held the scope "
                   "meanwhile): it is not taken again, and nothing more is written under it")


class RepairStopped(StateStoreError):
    """A repair stopped before a step that deletes (its hold was lost, see
    :attr:`AdminStore.repair_guard`): nothing further was deleted;
    *removed* is what it had deleted before, as far as the store knows."""

    def __init__(self, message: str, removed: Removed | None = None) -> None:
        super().__init__(message)
        self.removed = removed if removed is not None else Removed()


class ScopeHeld(HoldLapsed):
    """A hold on a scope was refused: *holder* holds it (until *expires*),
    and the two may not hold it together (:func:`holds_conflict`)."""

    def __init__(self, message: str, holder: str, expires: float) -> None:
        super().__init__(message)
        self.holder = holder
        self.expires = expires


class StateStore(ABC):
    """What a crawl needs of a store: validators, fingerprints and counters
    per page, items per key; reads, staged writes, flushes; the scope's crawl
    records and a crawl's hold on its scope.

    Besides its state, a page may have a *links record* (the requests its
    callback yielded, kept apart from the state because it can be large):
    written with :meth:`stage_links`, read only by :meth:`get_links`.

    A crawl-only store implements the abstract methods (:meth:`from_uri`
    and 26 others); the others have defaults in terms of them
    (:meth:`get_pages`, :meth:`get_links_many`, :meth:`summarize_pages`,
    :meth:`close`, :meth:`exists`) or keep nothing (remembered politeness
    rates, delivery marks, :meth:`stage_postpone`, the walk's memos and
    write generation: without them every nothing-due re-crawl walks the
    stored links again). ``scrapy state`` and
    ``scrapy items`` need :class:`AdminStore` too.
    """

    #: Where the store lives, for messages (a path or a URI without secrets).
    location: str
    #: Network round-trips to the store's server so far (0 for an embedded
    #: store); published as the ``incremental/store_roundtrips`` stat.
    roundtrips: int = 0
    #: Versions kept per item, tombstones included (INCREMENTAL_ITEM_HISTORY;
    #: 0: every version). Writing a version prunes the oldest beyond it, in
    #: the same flush: history never needs a rewrite of the whole store.
    history_limit: int = 10
    #: Crawl records kept per scope (INCREMENTAL_CRAWL_HISTORY): writing one
    #: prunes the oldest beyond it, in the same flush.
    crawl_history: int = 100
    #: Remembered politeness rates kept per scope (:meth:`stage_slot_rates`).
    slot_rates_kept: int = SLOT_RATES_KEPT
    #: The hold a flush writes for, ``(scope, holder)``: set (by a crawl,
    #: once it holds its scope), a flush writes only while that hold is
    #: there and has not lapsed (or, in the built-in stores, lapsed while
    #: nobody took the scope: see :meth:`hold_scope`), checked as it
    #: commits; otherwise it raises
    #: :class:`HoldLapsed` (:class:`ScopeHeld`), writing nothing and keeping
    #: what is staged. ``None``: no check (a store used directly, a copy
    #: writing under its own hold). The built-in stores check it; one of
    #: one's own may not.
    flush_hold: tuple[str, str] | None = None

    # -- finding and opening a store -------------------------------------------

    @classmethod
    @abstractmethod
    def from_uri(cls, uri: str, *, settings: BaseSettings | None = None) -> Self:
        """The store *uri* names (its scheme picked this class in
        ``INCREMENTAL_STATE_STORES``), opened with the crawl's *settings*;
        created if it does not exist. Raises :class:`StateStoreError` when
        it cannot be used."""

    @classmethod
    def exists(cls, uri: str, *, settings: BaseSettings | None = None) -> bool:
        """Whether *uri* names a store that exists, creating nothing: the
        commands that read a store (``scrapy state``, ``items``, ``report``)
        ask this before :meth:`from_uri`, so that a typo in a URI is not
        taken for a store that holds nothing. Raises
        :class:`StateStoreError` when it cannot tell (unreachable).

        A store whose opening creates nothing may keep this default (yes)."""
        return True

    @classmethod
    def where(cls, uri: str) -> str:
        """Where *uri* points, for the message that no store is there
        (``"at /path/state.db"``); no secrets."""
        return f"at {redacted(uri)}"

    # -- crawl: reads ------------------------------------------------------------

    @abstractmethod
    async def get_page(self, key: PageKey) -> PageState | None:
        """The page's state, including page states staged but not yet flushed.

        Staged checks and redirects (counters only) may show only after a flush.
        """

    async def get_pages(self, keys: Iterable[PageKey]) -> dict[PageKey, PageState]:
        """The states of those of *keys* the store knows (batched lookups).

        By default one :meth:`get_page` per key: a networked store batches them."""
        found = {}
        for key in keys:
            state = await self.get_page(key)
            if state is not None:
                found[key] = state
        return found

    @abstractmethod
    async def get_links(self, key: PageKey) -> str | None:
        """The page's links record (see :meth:`stage_links`), or ``None``.

        Staged links records (and deletions) are visible at once, as staged
        page states are to :meth:`get_page`. Only this reads links: page
        reads never do, as a record may hold a thousand requests.
        """

    async def get_links_many(self, keys: Iterable[PageKey]) -> dict[PageKey, str | None]:
        """The links records of several pages (see :meth:`get_links`), by key.

        One by one here; a store that can read them in one round trip (a
        remote one) says so by overriding this.
        """
        return {key: await self.get_links(key) for key in keys}

    @abstractmethod
    async def get_due(self, scope: str, now: float, limit: int,
                      after: DueAfter | None = None) -> list[PageState]:
        """Up to *limit* pages of *scope* whose next visit is not after *now*.

        Only pages with a callback (they can be requested again): fetched
        ones, failed ones recorded without a fingerprint
        (:meth:`stage_failure`), and pages flagged ``PageFlags.GONE`` (their
        next visit is their rare recheck: one that came back is new again).
        Most overdue first, in a total order (next visit, then URL, then
        variant), starting after *after* (:func:`due_after` of the last page
        a previous call returned; ``None``: from the first), so that a reader
        pages through them at a cost of the pages it reads, not of those it
        read before. *now* may be infinite (every page).
        """

    async def summarize_pages(self, scope: str, *, after: float, upto: float,
                              checked_before: float,
                              exclude_callbacks: Collection[str] = ()) -> PagesSummary:
        """The pages of *scope* that can be requested again (a callback, not
        one of *exclude_callbacks*; gone ones too, as :meth:`get_due`), whose
        next visit is after *after* and not after *upto* (either may be
        infinite), and that were last checked before *checked_before*: how
        many, their stored sizes, and the earliest next visit. No states kept.

        A crawl asks this at its start (the pages not due, and the due ones
        over its limit): a store should answer it without reading every page
        of the scope (the built-in ones keep sums of the pages by next
        visit). By default the pages :meth:`get_due` reads up to *upto*, a
        chunk at a time.
        """
        pages = size = 0
        first_due: float | None = None
        last: DueAfter | None = None
        while True:
            chunk = await self.get_due(scope, upto, _SUMMARY_CHUNK, last)
            for state in chunk:
                if (state.next_visit <= after or state.last_checked >= checked_before
                        or state.callback is None or state.callback in exclude_callbacks):
                    continue
                pages += 1
                size += state.size
                if first_due is None or state.next_visit < first_due:
                    first_due = state.next_visit
            if len(chunk) < _SUMMARY_CHUNK:
                return PagesSummary(pages, size, first_due)
            last = due_after(chunk[-1])

    @abstractmethod
    async def get_item_simhash(self, scope: str, item_key: str) -> int | None:
        """The SimHash stored with the latest version of an item, if any."""

    @abstractmethod
    async def get_host(self, scope: str, host: str) -> HostTrust | None:
        """The stored lastmod trust of *host*."""

    @abstractmethod
    def stage_host(self, trust: HostTrust) -> None:
        """Stage a host's lastmod trust."""

    @abstractmethod
    async def get_item_fingerprint(self, scope: str, item_key: str) -> str | None:
        """The fingerprint of the latest stored version of an item.

        ``None`` for an item the store does not know, and for one whose
        latest version is a tombstone (it is new if it comes back).
        """

    @abstractmethod
    async def get_item_data(self, scope: str, item_key: str) -> str | None:
        """The data (JSON) of the latest stored version of an item.

        ``None`` for an item the store does not know, one stored without
        data (item storage switched off) and one whose latest version is a
        tombstone. Staged versions count once flushed.
        """

    @abstractmethod
    async def get_page_items(self, scope: str, page_url: str) -> list[str]:
        """Keys of the live items last stored from the page *page_url*.

        An item belongs to the page its latest version came from
        (``ItemRecord.page``; an item stored without one belongs to the page
        whose URL is its key). Items whose latest version is a tombstone are
        left out. Staged items count once flushed.
        """

    # -- crawl: staged writes, committed in staging order by flush() -------------

    @abstractmethod
    def stage_page(self, state: PageState) -> None:
        """Stage a full page state (validators, fingerprint, counters)."""

    @abstractmethod
    def stage_check(
        self, key: PageKey, status: int, when: float, *, lastmod: float | None = None,
        schedule: tuple[float, float] | None = None,
        validators: tuple[str | None, str | None] | None = None,
    ) -> None:
        """Stage a visit that changed nothing but counters and ``last_status``.

        Used for 304s and for 3xx answers: fingerprints are never touched
        (only a 2xx updates them). A 304 may record a newer *lastmod* (the
        stored data is that version), the revisit *schedule* ``(interval,
        next_visit)``, and the *validators* ``(etag, last_modified)`` it
        brought for that same data (``None`` in either place keeps the
        stored one). It ends a run of failures (``failures`` becomes 0).
        """

    @abstractmethod
    def stage_failure(
        self, key: PageKey, status: int, when: float, *, failures: int, next_visit: float,
        callback: str | None = None, recipe: str | None = None,
    ) -> None:
        """Stage a visit whose final outcome was a failure, a 404 or a 410.

        ``last_status`` becomes *status* (0: no HTTP answer), ``last_checked``
        *when*, ``failures`` and ``next_visit`` the values given; validators,
        fingerprint, size, lastmod and interval stay as they are. A page the
        store does not know is stored without a fingerprint, with *callback*
        and *recipe* (so :meth:`get_due` returns it); a known page without a
        callback takes them too.
        """

    @abstractmethod
    def stage_redirect(self, key: PageKey, target: str, status: int, when: float) -> None:
        """Stage that *key* redirected to *target* (validators untouched)."""

    @abstractmethod
    def stage_item(self, record: ItemRecord) -> None:
        """Stage an item version: its fingerprint, page and, with data, its history.

        The item's version number goes up by one. A ``record.page`` of
        ``None`` or ``""`` means the page whose URL is the item's key. With
        ``record.data`` the version is kept in the history with
        ``record.change`` and ``record.stored_at``, and versions beyond
        :attr:`history_limit` are pruned, oldest first, in the same flush.
        A ``deleted`` record (a
        tombstone: empty fingerprint) makes the item read as unknown to
        :meth:`get_item_fingerprint` and :meth:`get_page_items`.
        """

    @abstractmethod
    def stage_links(self, key: PageKey, data: str | None) -> None:
        """Stage the page's links record; ``None`` stages its deletion.

        *data* is opaque text to the store (JSON of the requests the page's
        callback yielded, to replay them on a 304). It is applied in staging
        order with every other write. Staged right before the page's state,
        the two are committed together or not at all, in every store (in
        Redis, a write staged between them that fails, such as a check of a
        damaged record, would stop a flush between them).
        """

    @abstractmethod
    def stage_flags(self, key: PageKey, add: int) -> None:
        """Stage OR-ing *add* into the flags of the page, if it is stored.

        Nothing else of the page changes (counters, validators, schedule);
        a page that is not stored when the write is applied stays unknown.
        A staged state of the page shows the flags at once; otherwise they
        show after the flush, like a check.
        """

    @abstractmethod
    def stage_listing(self, key: PageKey, listing: str) -> None:
        """Stage setting the page's ``listing`` (the membership digest of the
        list that gives its date), if it is stored.

        Nothing else of the page changes; a page that is not stored when the
        write is applied stays unknown. A staged state of the page shows it
        at once; otherwise it shows after the flush, like a check.
        """

    def stage_postpone(self, key: PageKey, was: float,  # noqa: B027 (see below)
                       next_visit: float) -> None:
        """Stage moving the next visit of the page from *was* to
        *next_visit*, if it is still *was* when the write is applied (a check
        staged or stored meanwhile wins); nothing else of the page changes,
        and a page not stored stays unknown. The re-seeder moves so the due
        pages a trusted lastmod vouches for, so that the next crawls do not
        read past them again.

        Not abstract: a store that keeps none reads those pages past again
        at each crawl start."""

    # -- crawl: the stored-graph walk's memo ----------------------------------------

    #: Whether :meth:`write_generation` counts the writes of the hosts asked
    #: (else the whole scope's: a walk reaching a host it did not name
    #: before it began may keep its memo all the same).
    write_generation_per_host: bool = False

    async def write_generation(self, scope: str, hosts: Collection[str]) -> str | None:
        """A token that changes whenever a page state or a links record of
        *scope* is written or deleted, by any process, at least for the
        pages of *hosts* (a store may count a whole scope). Reads never
        change it, nor do writes of anything else (items, hosts, crawl
        records, memos). It never comes back to an earlier value, even
        across a reset of the scope (a store restored from a backup goes
        back with its memos, which were true of what it held then).

        A crawl remembers that the stored links from one of its start pages
        lead to nothing that can matter (see
        :mod:`incremental_crawler.crawl.inert`) with the token read before
        that walk; a later crawl takes the memo only while the token is
        the same. ``None`` (the default): the store keeps no such token,
        and every crawl walks."""
        return None

    async def get_walk_memo(self, scope: str, name: str) -> str | None:
        """The walk memo stored under *name* in *scope* (see
        :meth:`put_walk_memo`), or ``None``."""
        return None

    def get_walk_memo_now(self, scope: str, name: str) -> str | None:
        """:meth:`get_walk_memo`, synchronously: a crawl reads the mark of
        ``scrapy state copy`` (see :meth:`put_walk_memo`) before it takes its
        scope, outside the event loop's turn. ``None`` by default (a store
        that keeps no memos is refused as a copy's destination)."""
        return None

    async def put_walk_memo(self, scope: str, name: str, data: str) -> None:  # noqa: B027
        """Store the walk memo *data* under *name* in *scope*, at once (not
        staged), replacing any. Nothing a crawl needs is lost without it: a
        store that keeps none (the default) makes every crawl walk. A reset
        of the scope deletes its memos. ``scrapy state copy`` keeps its mark
        of a copied scope under the name ``scope-copy`` (a walk's names hold
        a URL), and copies into no store that keeps none."""

    @property
    @abstractmethod
    def pending(self) -> int:
        """Number of staged writes not yet flushed."""

    @abstractmethod
    async def flush(self) -> int:
        """Commit every staged write atomically; return how many there were."""

    async def close(self) -> None:
        """Flush and release the store (by default: flush; a store holding
        connections or files releases them too)."""
        await self.flush()

    # -- crawl records -------------------------------------------------------

    @abstractmethod
    def stage_crawl(self, record: CrawlRecord) -> None:
        """Stage a finished crawl's summary, committed with the next flush.

        Records beyond :attr:`crawl_history` of the record's scope are
        pruned, oldest first, in the same flush. Several records may share
        a scope and a start (the workers of one cluster run: ``worker``
        tells them apart).
        """

    @abstractmethod
    def crawls(self, scope: str, limit: int) -> list[CrawlRecord]:
        """Up to *limit* of the scope's stored crawl records, newest first
        (by start, then finish)."""

    # -- remembered politeness rates ---------------------------------------------

    # Not abstract: a store of the user's own that keeps none still works,
    # every crawl then starting each window from the default rate.

    def stage_slot_rates(self, rates: Iterable[SlotRate]) -> None:  # noqa: B027 (see above)
        """Stage what each slot's window learned this crawl, committed with
        the next flush: a slot's record replaces the one stored, and the
        scope keeps the :attr:`slot_rates_kept` saved most recently (ties:
        the first slot by name goes first), the others pruned in the same flush."""

    async def slot_rates(self, scope: str) -> SlotRates:
        """The scope's remembered rates (staged ones once flushed); a record
        that cannot be read is named in ``unreadable``, never raised."""
        return SlotRates([], [])

    # -- delivery of item versions ---------------------------------------------

    # Not abstract: a store of the user's own that keeps no delivery marks
    # still works; what a killed crawl stored is then not emitted again.

    def stage_delivered(self, scope: str, crawl: str) -> None:  # noqa: B027 (see above)
        """Stage that every version of *scope* waiting on *crawl* (stored by
        it with ``ItemRecord.delivery``, or taken over with
        :meth:`stage_redelivered`) was delivered: its feeds closed cleanly.
        Committed with the next flush, in staging order."""

    def stage_redelivered(self, pending: Undelivered, crawl: str) -> None:  # noqa: B027
        """Stage that *pending* went through *crawl*'s pipelines again: it
        waits on *crawl* from now on (nothing if it was pruned meanwhile)."""

    def stage_settled(self, scope: str, crawl: str) -> None:  # noqa: B027 (see above)
        """Stage forgetting *crawl* among :meth:`undelivered_crawls` if no
        version waits on it any more (a store that lists them apart)."""

    async def undelivered_crawls(self, scope: str) -> list[str]:
        """The crawls of *scope* that have versions waiting on them, sorted."""
        return []

    async def undelivered(self, scope: str, crawl: str, *, after: Undelivered | None = None,
                          limit: int = 500) -> list[Undelivered]:
        """Up to *limit* of the versions (with data) waiting on *crawl*, in
        the order they were stored (``stored_at``, item key, version),
        starting after *after*; versions pruned since are left out. Staged
        writes count once flushed."""
        return []

    # -- a crawl's hold on its scope -------------------------------------------

    # Written at once, not staged: a crawl may hold its page writes back
    # (items only in feeds, committed at the end), and its hold must show
    # all the same; a hold is bookkeeping, in no order with any data.

    # A holder's name says its kind (:data:`SHARED_HOLD`, :data:`REPAIR_HOLD`,
    # else a crawl's exclusive hold): only cluster workers hold a scope
    # together (:func:`holds_conflict`).

    @abstractmethod
    async def hold_scope(self, scope: str, holder: str, ttl: float,
                         now: float | None = None) -> None:
        """Refresh *holder*'s hold on *scope*, lapsing *ttl* seconds after
        *now* (``None``: the clock's now). Holds of other holders stay.
        Only a hold that is there and has not lapsed is refreshed (only
        :meth:`take_scope` takes one), or, in the built-in stores, one that
        lapsed while nobody took the scope since this store's take of it
        (the scope's hold epoch, which every take but a worker's beside
        live workers' raises; not one released): raises :class:`ScopeHeld`,
        holding nothing, while a holder that conflicts with *holder* holds
        the scope (one that took it over once this hold lapsed), else
        :class:`HoldLapsed` when the hold lapsed or is gone (a repair may
        have taken the scope, and ended, meanwhile): checked and written in
        one transaction. A store of one's own may keep to the first rule
        (a crawl stalled past its hold then stops)."""

    @abstractmethod
    def take_scope(self, scope: str, holder: str, ttl: float,
                   now: float) -> tuple[str, float] | None:
        """Take *holder*'s hold on *scope* for a crawl (a worker, a repair)
        that starts, unless a holder that conflicts with it holds it:
        ``None`` when taken, else that holder and when its hold lapses.
        Synchronous, at once, in one transaction: of two crawls starting
        together, one takes it. A hold that lapsed, or whose process is gone
        (:func:`holder_gone`), is taken over. Taken again by its holder, a
        hold is refreshed."""

    @abstractmethod
    async def release_scope(self, scope: str, holder: str) -> None:
        """Drop *holder*'s hold on *scope* (nothing if it holds none)."""

    @abstractmethod
    def scope_holders(self, scope: str, now: float) -> dict[str, float]:
        """Holders of *scope* whose hold has not lapsed at *now*, and when each lapses."""

    def mark_run_start(self, scope: str, started: float) -> None:  # noqa: B027 (optional)
        """A crawl of *scope* shared by several workers (a cluster's run)
        started at *started*: a store that keeps its summaries from reading
        every page by noting the checks since a crawl's start (the Redis
        store's mark, which :meth:`take_scope` sets for a crawl of one
        process) notes them from then on. Called once a run, by the worker
        that started it, before it writes; best effort (a store that cannot
        says so and its summaries read every page). Nothing by default."""

    # -- a scope's pages, read at once (the crawl's clock-skew repair) ---------

    @abstractmethod
    def iter_pages(self, scope: str) -> Iterator[PageState]:
        """Every stored page of *scope* (any order, bounded memory)."""



class AdminStore(StateStore):
    """What administration needs besides the crawl interface: the read-outs
    of ``scrapy state`` and ``scrapy report``, the exports of ``scrapy
    items``, the repairs (synchronous, at once: they run outside a crawl,
    while no crawl holds the scope). The built-in stores implement it.

    A store of one's own written before the split derives from this class
    to keep serving those commands.
    """

    #: Called before each step of a repair that deletes: raises
    #: :class:`RepairStopped` once the repair may no longer hold its scope
    #: alone, so that it deletes nothing further beside another holder.
    #: ``None`` (a store used directly): no check.
    repair_guard: Callable[[], None] | None = None

    def before_deleting(self) -> None:
        """:attr:`repair_guard`'s check, before a repair's step that deletes."""
        if self.repair_guard is not None:
            self.repair_guard()

    def store_identity(self) -> str:
        """What tells this store from every other, whatever URI names it (a
        symlink, ``..``, another host name): ``scrapy state copy`` refuses
        to copy a store into itself. :attr:`location` by default."""
        return self.location

    # -- read-outs ---------------------------------------------------------------

    @abstractmethod
    def scopes(self) -> list[str]:
        """Every scope the store holds anything of, sorted."""

    @abstractmethod
    def iter_hosts(self, scope: str) -> Iterator[HostTrust]:
        """Every stored host trust record of *scope*."""

    def page_hosts(self, scope: str) -> list[str]:
        """The hosts of *scope*'s stored pages, sorted: what
        :meth:`write_generation` is asked for a whole scope where it counts
        per host. Read from every page by default."""
        return sorted({host_of(state.key.url) for state in self.iter_pages(scope)})

    def summarize_hosts(self, scope: str, now: float) -> list[HostSummary]:
        """Per host of *scope*: its pages in aggregate (due at *now*), and its
        trust record; by host name. A host with a trust record and no page
        is listed too."""
        counts: dict[str, list[int]] = {}  # pages, due, gone, failing, size
        for state in self.iter_pages(scope):
            row = counts.setdefault(host_of(state.key.url), [0, 0, 0, 0, 0])
            row[0] += 1
            row[1] += int(state.callback is not None and state.next_visit <= now)
            row[2] += int(is_gone(state))
            row[3] += int(state.failures > 0)
            row[4] += state.size
        trusts = {trust.host: trust for trust in self.iter_hosts(scope)}
        summaries = []
        for host in sorted(counts.keys() | trusts.keys()):
            pages, due, gone, failing, size = counts.get(host, [0, 0, 0, 0, 0])
            summaries.append(HostSummary(host, pages, due, gone, failing, size, trusts.get(host)))
        return summaries

    @abstractmethod
    def url_record(self, scope: str, url: str) -> UrlRecord:
        """Everything stored about the canonical *url* of *scope*."""

    def read_slot_rates(self, scope: str) -> SlotRates:
        """:meth:`slot_rates`, read at once (a store that keeps none: none)."""
        return SlotRates([], [])

    def count_pages(self, scope: str | None = None) -> int:
        """How many pages the store knows (for reports and tests); by
        default :meth:`iter_pages` of each scope counted."""
        scopes = self.scopes() if scope is None else [scope]
        return sum(1 for name in scopes for _ in self.iter_pages(name))

    # -- exports -------------------------------------------------------------------

    @abstractmethod
    def iter_items(self, scope: str | None = None) -> Iterator[dict[str, object]]:
        """The latest version of every live stored item, oldest key first.

        Items whose latest version is a tombstone are left out.
        """

    @abstractmethod
    def iter_versions(self, scope: str | None = None, *, since: float | None = None,
                      every_version: bool = False) -> Iterator[StoredVersion]:
        """Stored item versions that have data, tombstones included.

        Only versions stored at or after *since* (``None``: all); stored
        times are whole seconds, so a *since* with a fraction counts from
        its whole second (a version is rather given twice than missed).
        With *every_version* each of them, with its own change; else only
        the latest version of each item, provided it was stored at or after
        *since*. In the order they were stored (``stored_at``, then scope,
        key and version), so that applying them in turn leaves a copy in
        the store's state.

        A latest version read with *since* is ``new`` when the item was not
        live before *since* (no version of it then, or a tombstone last),
        whatever the version itself says: a reader that has what was stored
        before *since* never saw the item. It is so when the item's current
        live run began at or after *since* and no earlier run's tombstone
        was stored at or after *since*. An item that was deleted and came
        back more than once inside the window, and items whose live run
        began before the store kept these marks, keep their own change.
        Tombstones stay ``deleted``.

        Not a snapshot in every store: an item written while the versions
        are read yields the version stored then (Redis: its latest, if
        still at or after *since*), and with *every_version* a version
        pruned meanwhile (newer ones beyond :attr:`history_limit`) may be
        left out.
        """

    def iter_item_states(self, scope: str) -> Iterator[StoredItem]:
        """Every item of *scope*, tombstoned ones too, with its kept history
        (any order, bounded memory): what ``scrapy state copy`` reads to
        write the items again elsewhere. A store without it cannot be the
        source of a copy."""
        raise StateStoreError(
            f"{type(self).__module__}.{type(self).__qualname__} cannot list its items "
            "with their history (AdminStore.iter_item_states)")

    @abstractmethod
    def item_history(self, scope: str, item_key: str) -> list[tuple[int, str]]:
        """``(version, fingerprint)`` of every stored version of an item."""

    # -- repairs (synchronous, at once: run while the repair holds the scope
    # alone, see REPAIR_HOLD) ------------------------------------------------

    @abstractmethod
    def forget_page(self, scope: str, url: str) -> Removed:
        """Delete the page *url* of *scope* (every variant): its state, its
        links record, and the items last stored from it with their history,
        so that the next crawl finds it, and them, new."""

    @abstractmethod
    def forget_host(self, scope: str, host: str) -> Removed:
        """:meth:`forget_page` for every page of *host* (:func:`host_of`) in
        *scope*, the host's trust record, and the remembered politeness rate
        of the download slot named *host* (a slot of another name, a
        ``DOWNLOAD_SLOTS`` key or a host group, stays)."""

    @abstractmethod
    def reset_scope(self, scope: str) -> Removed:
        """Delete everything of *scope*: pages, links, items and their
        history, host records, crawl records (holds are left to lapse)."""

    @abstractmethod
    def count_scope(self, scope: str) -> Removed:
        """What :meth:`reset_scope` would delete now, deleting nothing."""


#: The crawl interface, by the name that says so (:class:`StateStore`).
CrawlStore = StateStore
