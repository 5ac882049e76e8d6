"""Gone pages become tombstones, once: the change feed's ``deleted`` items.

A known page (stored with a fingerprint: it answered a 2xx before, and is
not gone already) is gone when its final answer is

- a **410**, at once (``gone_410``);
- a **404** on two checks in a row (``gone_404``): the stored
  ``last_status`` was 404. A single 404 is recorded as a failure, which
  makes the page due on the next crawl whatever its interval or lastmod
  (:func:`~.revisit.failure_next_visit`), so a transient one costs a
  request and no tombstone;
- a **301 or 308** to another URL (``moved``) that proved live (it answered
  a 2xx or a 304, or, not fetched, the store knows it live: see
  :mod:`.outcomes`): the target is a page of its own (new if unknown), the
  tombstone says where it went.

A page merely no longer listed by a sitemap is *not* gone: it stays known
and is revisited on its schedule.

The page then yields one tombstone, a plain dict sent through the item
pipelines (the user's too) with the response it came from
(``Scraper.start_itemproc_async``): ``url``, the change field set to
``deleted``, ``status``, ``reason``, ``last_seen`` (ISO 8601 UTC of its
last 2xx), ``redirected_to`` for a moved page, and ``item_keys``, the keys
of the items last stored from it. The ledger tracks it until it leaves the
pipelines (:meth:`~incremental_crawler.crawl.ledger.Ledger.tombstone_sent`):
delivered (``item_scraped``, or a DropItem: a decision, not a failure) it
stages a ``deleted`` version of each of those items (they read as unknown:
if they come back they are new), then the page's state flagged
``PageFlags.GONE``, checked again only INCREMENTAL_GONE_RECHECK seconds
later, its next visit (asked by what names it then, else re-seeded: a page
restored behind a sitemap that answers 304 is found), or when a list dates
it after both the date recorded and that check. Withheld (``item_error``), nothing of
it is stored: the page is recorded as a failure, due on the next crawl,
which decides and sends it again.

A gone page none of whose items is stored (a listing page of a
link-following spider, which yields only requests) sends no tombstone: a
downstream index holds nothing of it to delete, and ``item_keys: []``
would only be noise there. Its disappearance is recorded all the same
(flagged GONE, counted in ``incremental/tombstones/<reason>`` and
``incremental/tombstones/unsent_no_items``).

Without a change field (INCREMENTAL_CHANGE_FIELD off) no tombstone is sent:
one that did not say what it is would reach every pipeline as an item.
Gone pages are then failures, as with INCREMENTAL_TOMBSTONES off.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.log import failure_to_exc_info

from incremental_crawler.state.records import Change, PageKey, PageState, is_gone
from incremental_crawler.state.stores import StateStoreError

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from incremental_crawler.config import IncrementalConfig
    from incremental_crawler.state.stores import StateStore

__all__ = [
    "MOVED_STATUSES", "Gone", "GoneReason", "TombstoneBook", "TombstoneSender", "gone_reason",
    "is_gone", "known_page", "tombstone",
]

logger = logging.getLogger(__name__)

#: Redirects that say a page moved for good (RFC 9110 §15.4.2, §15.4.9).
MOVED_STATUSES = frozenset({301, 308})


class GoneReason(StrEnum):
    """Why a page is gone; the last part of ``incremental/tombstones/<reason>``."""

    GONE_410 = "gone_410"
    GONE_404 = "gone_404"
    MOVED = "moved"


def known_page(prior: PageState | None) -> bool:
    """Whether a page can become a tombstone: fetched with a 2xx before, not gone."""
    return prior is not None and prior.fingerprint is not None and not is_gone(prior)


def gone_reason(prior: PageState | None, status: int) -> GoneReason | None:
    """Whether a final *status* 404 or 410 makes the page *prior* gone.

    >>> page = PageState(PageKey("s", "http://h/a"), fingerprint="f", last_status=200)
    >>> [gone_reason(page, s) for s in (410, 404, 500)]
    [<GoneReason.GONE_410: 'gone_410'>, None, None]
    >>> gone_reason(page.copy(last_status=404), 404)
    <GoneReason.GONE_404: 'gone_404'>
    >>> gone_reason(page.copy(fingerprint=None), 410) is None
    True
    """
    if not known_page(prior):
        return None
    assert prior is not None
    if status == 410:
        return GoneReason.GONE_410
    if status == 404 and prior.last_status == 404:
        return GoneReason.GONE_404
    return None


@dataclass(slots=True)
class Gone:
    """A gone page, from the decision until its tombstone left the pipelines."""

    key: PageKey
    #: The page as stored when its request went out.
    prior: PageState
    #: The final status (404, 410, 301, 308).
    status: int
    reason: GoneReason
    #: Where a moved page went (canonical URL).
    target: str | None = None
    #: Keys of the items last stored from the page.
    item_keys: list[str] = field(default_factory=list)
    #: The date the list that named the page gave it (recorded with the
    #: GONE state: only a newer one asks for the page again).
    lastmod: float | None = None


def _utc(timestamp: float) -> str | None:
    if not timestamp:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


def tombstone(gone: Gone, change_field: str) -> dict[str, Any]:
    """The tombstone item of *gone* (see the module docstring)."""
    item: dict[str, Any] = {
        "url": gone.key.url,
        change_field: str(Change.DELETED),
        "status": gone.status,
        "reason": str(gone.reason),
        "last_seen": _utc(gone.prior.last_fetched),
    }
    if gone.target is not None:
        item["redirected_to"] = gone.target
    item["item_keys"] = list(gone.item_keys)
    return item


class TombstoneBook(Protocol):
    """What the sender needs of the ledger, which tracks the tombstones it sends."""

    config: IncrementalConfig
    store: StateStore

    @property
    def scope(self) -> str: ...

    def tombstone_sent(self, item: Any, gone: Gone) -> None: ...

    def tombstone_unsent(self, gone: Gone) -> None: ...

    def store_failed(self, error: BaseException) -> None: ...


class TombstoneSender:
    """Sends tombstones through the item pipelines; one per crawler (the ledger's).

    A crawl does not finish with a tombstone on its way: the scraper counts
    it in its slot from the moment it enters the pipelines, and until then
    (the store read for its item keys) this holds the spider open.
    """

    def __init__(self, crawler: Crawler, ledger: TombstoneBook) -> None:
        self.crawler = crawler
        self.ledger = ledger
        config = ledger.config
        self.change_field = config.change_field
        #: Whether gone pages become tombstones (both settings on).
        self.enabled = bool(config.enabled and config.tombstones and config.change_field)
        self._sending = 0
        crawler.signals.connect(self.spider_idle, signal=signals.spider_idle)

    async def send(self, gone: Gone, response: Response | None) -> None:
        """Send *gone*'s tombstone through the pipelines; return once it left them."""
        assert self.change_field is not None
        ledger = self.ledger
        self._sending += 1
        try:
            try:
                gone.item_keys = await ledger.store.get_page_items(ledger.scope, gone.key.url)
            except StateStoreError as exc:
                # Nothing decided is lost: the page's record is as it was.
                ledger.store_failed(exc)
                return
            if not gone.item_keys:
                # Nothing of the page is in a downstream index (a listing
                # page of a link-following spider): recorded, not sent.
                ledger.tombstone_unsent(gone)
                logger.debug("Page gone (%(reason)s), no item of it stored: %(url)s",
                             {"reason": gone.reason, "url": gone.key.url})
                return
            item = tombstone(gone, self.change_field)
            ledger.tombstone_sent(item, gone)
            engine = self.crawler.engine
            assert engine is not None
            logger.debug("Page gone (%(reason)s): %(url)s",
                         {"reason": gone.reason, "url": gone.key.url})
            await engine.scraper.start_itemproc_async(item, response=response)
        finally:
            self._sending -= 1

    def hold_open(self, decision: Coroutine[Any, Any, None]) -> None:
        """Run *decision* (a store read, then maybe :meth:`send`), the spider held
        open until it is done: a signal handler that cannot wait for it."""
        self._sending += 1
        done = deferred_from_coro(decision)
        done.addErrback(lambda failure: logger.error(
            "Could not decide a tombstone", exc_info=failure_to_exc_info(failure)))

        def finished(_: object) -> None:
            self._sending -= 1
            if not self._sending:
                # Scrapy looks at an idle engine only every 5 s: wake it, so
                # a crawl whose last work was this decision closes now.
                engine = self.crawler.engine
                nextcall = getattr(getattr(engine, "_slot", None), "nextcall", None)
                if nextcall is not None:
                    nextcall.schedule()

        done.addBoth(finished)

    def spider_idle(self, spider: Spider) -> None:
        if self._sending:
            raise DontCloseSpider
