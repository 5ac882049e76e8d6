"""The interface every state store implements.

Reads are ``async`` so that a networked store (Redis) never blocks the
reactor; writes are *staged* in memory and committed by :meth:`flush`, which
commits everything staged so far atomically and in staging order. That is
what "state is never ahead of data" rests on: the ledger stages a page's validators only after
the items extracted from that page, so no flush can ever commit the
validators without the data.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, NamedTuple

from incremental_crawler.config import DEFAULT_SETTINGS, SettingError

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Iterator

    from scrapy.settings import BaseSettings

    from incremental_crawler.state.records import (
        HostTrust,
        ItemRecord,
        PageKey,
        PageState,
        StoredVersion,
    )

__all__ = ["PagesSummary", "StateStore", "StateStoreError", "item_history_setting"]


class PagesSummary(NamedTuple):
    """Pages of a scope in aggregate (:meth:`StateStore.summarize_pages`)."""

    pages: int = 0
    #: Their stored body sizes, summed.
    size: int = 0
    #: The earliest of their next visits (``None``: no page).
    first_due: float | None = None


def item_history_setting(settings: BaseSettings | None) -> int:
    """INCREMENTAL_ITEM_HISTORY from *settings* (its default without them)."""
    name = "INCREMENTAL_ITEM_HISTORY"
    raw = None if settings is None else settings.get(name)
    if raw is None:
        return int(DEFAULT_SETTINGS[name])
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise SettingError(f"{name}={raw!r} is not a whole number") from None
    if value < 0:
        raise SettingError(f"{name}={raw!r} must be at least 0 (0 keeps every version)")
    return value


class StateStoreError(RuntimeError):
    """The state store cannot be used; the message names it and says why.

    Raised instead of ever starting over with an empty store: a store that
    silently forgot its state would re-download everything at best, and at
    worst (half a store) lose changes.
    """


class StateStore(ABC):
    """Validators, fingerprints and counters per page; items per key.

    Besides its state, a page may have a *links record* (the requests its
    callback yielded, kept apart from the state because it can be large):
    written with :meth:`stage_links`, read only by :meth:`get_links`.
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

    @abstractmethod
    async def get_page(self, key: PageKey) -> PageState | None:
        """The page's state, including page states staged but not yet flushed.

        Staged checks and redirects (counters only) may show only after a flush.
        """

    @abstractmethod
    async def get_pages(self, keys: Iterable[PageKey]) -> dict[PageKey, PageState]:
        """The states of those of *keys* the store knows (batched lookups)."""

    @abstractmethod
    async def get_links(self, key: PageKey) -> str | None:
        """The page's links record (see :meth:`stage_links`), or ``None``.

        Staged links records (and deletions) are visible at once, as staged
        page states are to :meth:`get_page`. Only this reads links: page
        reads never do, as a record may hold a thousand requests.
        """

    @abstractmethod
    async def get_due(self, scope: str, now: float, limit: int,
                      offset: int = 0) -> list[PageState]:
        """Up to *limit* pages of *scope* whose next visit is not after *now*.

        Only pages with a callback (they can be requested again): fetched
        ones, and failed ones recorded without a fingerprint
        (:meth:`stage_failure`). Most overdue first, in a total order (ties
        by URL), so that reading with *offset* 0, *limit*, 2 * *limit*...
        pages through them while the store does not change. *now* may be
        infinite (every page).
        """

    @abstractmethod
    async def summarize_pages(self, scope: str, *, after: float, upto: float,
                              checked_before: float,
                              exclude_callbacks: Collection[str] = ()) -> PagesSummary:
        """The pages of *scope* that can be requested again (a callback, not
        one of *exclude_callbacks*), whose next visit is after *after* and
        not after *upto* (either may be infinite), and that were last checked
        before *checked_before*: how many, their stored sizes, and the
        earliest next visit. One pass, no states kept.
        """

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

    @abstractmethod
    def stage_page(self, state: PageState) -> None:
        """Stage a full page state (validators, fingerprint, counters)."""

    @abstractmethod
    def stage_check(
        self, key: PageKey, status: int, when: float, *, lastmod: float | None = None,
        schedule: tuple[float, float] | None = None,
    ) -> None:
        """Stage a visit that changed nothing but counters and ``last_status``.

        Used for 304s and for 3xx answers: validators and fingerprints are
        never touched (only a 2xx updates them). A 304 may record a newer
        *lastmod* (the stored data is that version) and the revisit
        *schedule* ``(interval, next_visit)``. It ends a run of failures
        (``failures`` becomes 0).
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

        The item's version number goes up by one. With ``record.data`` the
        version is kept in the history with ``record.change`` and
        ``record.stored_at``, and versions beyond :attr:`history_limit` are
        pruned, oldest first, in the same flush. A ``deleted`` record (a
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

    @property
    @abstractmethod
    def pending(self) -> int:
        """Number of staged writes not yet flushed."""

    @abstractmethod
    async def flush(self) -> int:
        """Commit every staged write atomically; return how many there were."""

    @abstractmethod
    async def close(self) -> None:
        """Flush and release the store."""

    @abstractmethod
    def iter_items(self, scope: str | None = None) -> Iterator[dict[str, object]]:
        """The latest version of every live stored item, oldest key first.

        Items whose latest version is a tombstone are left out.
        """

    @abstractmethod
    def iter_versions(self, scope: str | None = None, *, since: float | None = None,
                      every_version: bool = False) -> Iterator[StoredVersion]:
        """Stored item versions that have data, tombstones included.

        Only versions stored at or after *since* (``None``: all); with
        *every_version* each of them, else only the latest version of each
        item, provided it was stored at or after *since*. In the order they
        were stored (``stored_at``, then scope, key and version), so that
        applying them in turn leaves a copy in the store's state.
        """

    @abstractmethod
    def item_history(self, scope: str, item_key: str) -> list[tuple[int, str]]:
        """``(version, fingerprint)`` of every stored version of an item."""

    @abstractmethod
    def count_pages(self, scope: str | None = None) -> int:
        """How many pages the store knows (for reports and tests)."""
