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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from incremental_crawler.state.records import HostTrust, ItemRecord, PageKey, PageState

__all__ = ["StateStore", "StateStoreError"]


class StateStoreError(RuntimeError):
    """The state store cannot be used; the message names it and says why.

    Raised instead of ever starting over with an empty store: a store that
    silently forgot its state would re-download everything at best, and at
    worst (half a store) lose changes.
    """


class StateStore(ABC):
    """Validators, fingerprints and counters per page; items per key."""

    #: Where the store lives, for messages (a path or a URI without secrets).
    location: str
    #: Network round-trips to the store's server so far (0 for an embedded
    #: store); published as the ``incremental/store_roundtrips`` stat.
    roundtrips: int = 0

    @abstractmethod
    async def get_page(self, key: PageKey) -> PageState | None:
        """The page's state, including page states staged but not yet flushed.

        Staged checks and redirects (counters only) may show only after a flush.
        """

    @abstractmethod
    async def get_pages(self, keys: Iterable[PageKey]) -> dict[PageKey, PageState]:
        """The states of those of *keys* the store knows (batched lookups)."""

    @abstractmethod
    async def get_due(self, scope: str, now: float, limit: int) -> list[PageState]:
        """Up to *limit* fetched pages of *scope* whose next visit is due, most overdue first."""

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
        """The fingerprint of the latest stored version of an item."""

    @abstractmethod
    def stage_page(self, state: PageState) -> None:
        """Stage a full page state (validators, fingerprint, counters)."""

    @abstractmethod
    def stage_check(
        self, key: PageKey, status: int, when: float, *, lastmod: float | None = None,
        schedule: tuple[float, float] | None = None,
    ) -> None:
        """Stage a visit that changed nothing but counters and ``last_status``.

        Used for 304s and for 3xx/4xx/5xx answers: validators and
        fingerprints are never touched (only a 2xx updates them). A 304 may record a
        newer *lastmod* (the stored data is that version) and the revisit
        *schedule* ``(interval, next_visit)``.
        """

    @abstractmethod
    def stage_redirect(self, key: PageKey, target: str, status: int, when: float) -> None:
        """Stage that *key* redirected to *target* (validators untouched)."""

    @abstractmethod
    def stage_item(self, record: ItemRecord) -> None:
        """Stage an item version (and its fingerprint)."""

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
        """The latest version of every stored item, oldest key first."""

    @abstractmethod
    def item_history(self, scope: str, item_key: str) -> list[tuple[int, str]]:
        """``(version, fingerprint)`` of every stored version of an item."""

    @abstractmethod
    def count_pages(self, scope: str | None = None) -> int:
        """How many pages the store knows (for reports and tests)."""
