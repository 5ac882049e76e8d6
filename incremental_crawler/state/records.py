"""The records a state store keeps: per page and per item, never bodies."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import IntFlag, StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from typing import Self

__all__ = [
    "Change", "CrawlRecord", "HostTrust", "ItemRecord", "PageFlags", "PageKey", "PageState",
    "SlotRate", "StoredVersion", "Undelivered", "has_flag", "is_gone",
]


class PageKey(NamedTuple):
    """Identifies one stored page.

    ``scope`` keeps two spiders that visit the same URL apart (each needs its
    own validators, or one would get 304s for pages only the other stored);
    ``url`` is canonical (w3lib); ``variant`` tells apart versions of one URL
    served to different clients (region, language, proxy exit).
    """

    scope: str
    url: str
    variant: str = ""


class PageFlags(IntFlag):
    """Bit flags stored with a page (as the plain int they add up to)."""

    #: The last 2xx body came with ``Vary: *``: a 304 is not trusted blindly.
    VARY_STAR = 1
    #: The page answered with a redirect; ``redirect_to`` says where.
    REDIRECTED = 2
    #: Its validators changed while its content did not, on
    #: INCREMENTAL_UNSTABLE_AFTER full fetches in a row (unstable).
    UNSTABLE_VALIDATORS = 4
    #: The requests the page's callback yielded on its last full fetch were
    #: recorded (possibly none), so a 304 can replay them: without the flag
    #: a 304 cannot tell "yielded nothing" from "never recorded".
    LINKS_KNOWN = 8
    #: A links record is stored for the page (``StateStore.get_links``): a
    #: 304 reads the store for its requests only when this is set.
    HAS_LINKS = 16
    #: Its requests could not all be recorded faithfully, or a replayed one
    #: could not be rebuilt: the next visit fetches it without conditions, so
    #: its callback runs and yields them again.
    LINKS_INCOMPLETE = 32
    #: The lastmod stored with the page is a modification date (a sitemap
    #: ``<lastmod>``, an Atom ``<updated>``): trusted, it vouches for our copy
    #: while it does not move, also when the page is re-seeded.
    LASTMOD_MODIFIED = 64
    #: The page is gone (410, 404 on two checks in a row, or a permanent
    #: redirect elsewhere) and its tombstone was delivered: it is not
    #: re-seeded, is requested again only when something names it and its
    #: (rare) next visit is due, without conditions, and is new if it answers.
    GONE = 128


class Change(StrEnum):
    """What an emitted item (and a stored item version) is."""

    NEW = "new"
    CHANGED = "changed"
    #: A tombstone: the page the item came from is gone.
    DELETED = "deleted"


@dataclass(slots=True)
class PageState:
    """What we know about a page: validators, fingerprint and counters."""

    key: PageKey
    etag: str | None = None
    last_modified: str | None = None
    fingerprint: str | None = None
    #: Body size of the last full (2xx) response, for the bytes-saved estimate.
    size: int = 0
    last_status: int | None = None
    first_seen: float = 0.0
    last_checked: float = 0.0
    #: When we last got a full 2xx response (drives INCREMENTAL_MAX_AGE).
    last_fetched: float = 0.0
    last_changed: float = 0.0
    checks: int = 0
    changes: int = 0
    flags: int = 0
    redirect_to: str | None = None
    #: The page's sitemap/feed lastmod when we last stored it (POSIX time).
    lastmod: float | None = None
    #: Adaptive revisits: seconds between visits, and when the next is due.
    interval: float = 0.0
    next_visit: float = 0.0
    #: Name of the spider method that parses the page (to re-seed it).
    callback: str | None = None
    #: Full fetches in a row whose validators changed while the content did
    #: not (INCREMENTAL_UNSTABLE_AFTER of them flag the page unstable).
    churns: int = 0
    #: How to request the page again beyond its URL and ``callback`` (meta,
    #: cb_kwargs, errback, priority), as compact JSON, for re-seeding; the
    #: store keeps it as it is, without reading it.
    recipe: str | None = None
    #: Visits in a row whose final outcome was a failure (no HTTP answer,
    #: 5xx, 429, 401, 403), a 404 or 410, or whose data was withheld (its
    #: callback or an item pipeline failed); any 2xx or 304 resets it. It
    #: sets the failure schedule (``change.revisit.failure_next_visit``).
    failures: int = 0
    #: The membership of a list (a sitemap or feed), as a short digest of
    #: the canonical URLs it lists (:func:`~incremental_crawler.lists.sitemaps.listing_digest`).
    #: For a list: its own, at its last full read (``None``: not on record,
    #: e.g. an index). For a page: that of the list that last gave it the
    #: date stored with it; the date vouches for the page at re-seeding only
    #: while a list of this crawl still has that membership.
    listing: str | None = None

    @property
    def has_validators(self) -> bool:
        return bool(self.etag or self.last_modified)

    def copy(self, **changes: Any) -> Self:
        return replace(self, **changes)


def has_flag(flags: int, flag: PageFlags) -> bool:
    """Whether *flags* (a page's, as a store reads them: a plain int, or
    PageFlags) has *flag* set.

    Tested as plain ints: ``flags & PageFlags.X`` on an int makes Python
    call IntFlag's reflected operator, which builds a PageFlags value (a few
    microseconds; the decisions test flags several times per page, and the
    stored-graph walk decides every stored page of a nothing-due re-crawl).
    """
    return int.__and__(flags, flag) != 0


def is_gone(state: PageState | None) -> bool:
    """Whether the stored page is flagged GONE (its tombstone was delivered):
    the one test of it, for the decisions, the crawl and the stores alike."""
    return state is not None and has_flag(state.flags, PageFlags.GONE)


@dataclass(slots=True)
class ItemRecord:
    """One item version, as handed to a store once it passed every pipeline.

    ``data`` is the item as JSON, or ``None`` when only its fingerprint is
    kept (item storage switched off).
    """

    scope: str
    key: str
    url: str | None
    fingerprint: str
    data: str | None = None
    stored_at: float = 0.0
    #: SimHash of the item's main text (near-duplicate mode only).
    simhash: int | None = None
    #: What this version is. A ``deleted`` version (a tombstone) has an
    #: empty ``fingerprint``: the item reads as unknown afterwards
    #: (``get_item_fingerprint`` gives ``None``), so if it comes back it is new.
    change: str = Change.NEW
    #: Canonical URL of the page the item came from (``None``: unknown), so
    #: that a gone page finds the items last stored from it.
    page: str | None = None
    #: The crawl that stores the version and has yet to confirm its
    #: delivery (its feeds closed cleanly), see
    #: :meth:`~incremental_crawler.state.stores.base.StateStore.stage_delivered`;
    #: ``None``: nothing to confirm. Kept with a version that has data only.
    delivery: str | None = None


class StoredVersion(NamedTuple):
    """One stored item version, as ``StateStore.iter_versions`` reads it back."""

    scope: str
    key: str
    version: int
    #: A :class:`Change` value.
    change: str
    stored_at: float
    #: Empty for a tombstone.
    fingerprint: str
    #: The item's fields as stored (for a tombstone, the tombstone's).
    data: dict[str, Any]


class Undelivered(NamedTuple):
    """A stored item version whose delivery its crawl never confirmed
    (what ``StateStore.undelivered`` reads)."""

    #: The crawl it waits on (its ``ItemRecord.delivery``).
    crawl: str
    version: StoredVersion


@dataclass(slots=True)
class CrawlRecord:
    """A small summary of one finished crawl, kept per scope (bounded)."""

    scope: str
    started: float
    finished: float
    #: The cluster worker that ran it ("": a single process).
    worker: str = ""
    #: Scrapy's finish reason ("finished", "shutdown", ...).
    reason: str = ""
    #: The crawl's figures by name, as the end-of-crawl report counts them
    #: (requests, not_modified, new, changed, deleted, bytes_received,
    #: bytes_saved, ...): numbers only, so a store keeps them as JSON.
    figures: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class SlotRate:
    """What a download slot's politeness window learned by the end of a crawl.

    The next crawl's window of the slot starts from it (when it is recent
    enough), as TCP starts a connection from a destination's cached metrics.
    """

    scope: str
    #: The throttle's slot key: a host, a host group, a ``DOWNLOAD_SLOTS`` key.
    slot: str
    #: Requests per second the site was last let through (never above the
    #: window's own rate).
    rate: float
    #: Whether the window was still in slow start: it saw no hard signal.
    slow_start: bool
    #: When the crawl ended (the project clock, POSIX seconds).
    saved_at: float
    #: How the slot ended: "" (healthy), "penalty box", "frozen" or "parked".
    ended: str = ""

    def readable(self) -> bool:
        """Whether the record holds values a window can start from."""
        numbers = (self.rate, self.saved_at)
        return (all(isinstance(n, int | float) and not isinstance(n, bool)
                    and math.isfinite(n) for n in numbers)
                and self.rate > 0 and isinstance(self.slow_start, bool)
                and isinstance(self.ended, str))


@dataclass(slots=True)
class HostTrust:
    """Lastmod and validator evidence for one host of one scope."""

    scope: str
    host: str
    checks: int = 0
    lies: int = 0
    distrusted_until: float = 0.0
    #: Until when this host's 304s are not trusted (its validators lied).
    validators_distrusted_until: float = 0.0
    #: Consistent full fetches in a row while distrusted (re-trust after M).
    validators_consistent: int = 0
    #: Since when most of its pages' validators are unstable (0: they are not).
    validators_unstable_since: float = 0.0
    #: Pages found changed behind a lastmod that did not move (the rotating
    #: sample), since its lastmods were last trusted afresh.
    stale_lastmods: int = 0
