"""The base class that makes any spider incremental.

Subclass :class:`IncrementalSpider` instead of :class:`scrapy.Spider` (or
mix it into any Scrapy spider class) and write callbacks as usual: the
add-on is switched on for the spider even in a project that does not list
it in ``ADDONS``, every request carries the stored validators, 304s never
reach your callbacks, and unchanged items are dropped before storage.

Per-spider knobs (class attributes, all optional):

- ``incremental_scope``: the namespace of this spider's state (default: its
  name). Two spiders sharing a scope share validators and items.
- ``incremental_item_key_field``: the field identifying an item across runs
  (default ``INCREMENTAL_ITEM_KEY_FIELD``, ``url``), or define
  ``incremental_item_key(self, item) -> str``.
- ``incremental_fingerprint_fields`` / ``incremental_volatile_fields``:
  which fields count for "changed", or which never do.

Link-following crawls do not lose subtrees: when a listing page answers
304, its links are not seen again, so once the crawl runs out of work the
spider re-seeds the pages it fetched before whose revisit is due, from the
store (as a crawl database does), most likely to have changed first
(``incremental_reseed = False`` turns it off; ``INCREMENTAL_RESEED_LIMIT``
bounds it per crawl).

Requests that must see every link every time (a sitemap) can be fetched in
full with :meth:`discovery_request`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider, signals
from scrapy.exceptions import DontCloseSpider

from incremental_crawler import clock
from incremental_crawler.cluster.coordinator import ClusterCoordinator
from incremental_crawler.meta import META_SKIP, META_VARIANT
from incremental_crawler.state.ledger import Ledger

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from typing import Self

    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

    from incremental_crawler.state.records import PageState

logger = logging.getLogger(__name__)

__all__ = ["IncrementalSpider"]

ADDON_PATH = "incremental_crawler.addon.IncrementalAddon"


class IncrementalSpider(Spider):
    """See the module docstring."""

    incremental_reseed: bool = True
    #: Whether this crawl re-seeded its due pages (set by from_crawler).
    _reseeded: bool

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> Self:
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider._reseeded = False
        crawler.signals.connect(spider._reseed_when_idle, signal=signals.spider_idle)
        return spider

    @property
    def ledger(self) -> Ledger | None:
        """The crawl's ledger: the state store and what it knows (None when
        INCREMENTAL_ENABLED is False: the spider then crawls as a plain one)."""
        return self.crawler.get_extension(Ledger)

    def needs_reseed(self) -> bool:
        """Whether this crawl may have missed known pages (it re-seeds if so)."""
        return self.incremental_reseed

    def reseed_skip(self, state: PageState) -> bool:
        """Whether a due page should not be re-seeded (already decided this crawl)."""
        return False

    def _reseed_when_idle(self) -> None:
        # Once per crawl, when the links are exhausted: a local data: request
        # whose callback reads the due pages from the store (the store may
        # be remote: reads are async, and a callback may await).
        if self._reseeded or not self.needs_reseed():
            return
        cluster = self.crawler.get_extension(ClusterCoordinator)
        if cluster is not None:
            # In cluster mode: by one worker per run (the due pages go to
            # the shared queue), once no worker can discover more links.
            # Claimed first: the others wait for a claimed job to be done
            # instead of leaving before its pages are queued.
            if not cluster.claim("reseed"):
                return
            if not cluster.quiet():
                raise DontCloseSpider
        self._reseeded = True
        self.crawler.engine.crawl(
            Request(
                "data:,reseed", callback=self._reseed_due, dont_filter=True,
                meta={META_SKIP: True, "allow_offsite": True},
            )
        )
        if cluster is not None:
            cluster.claim_done("reseed")  # the request is queued: the cluster is busy
        raise DontCloseSpider

    async def _reseed_due(self, response: Response) -> AsyncIterator[Request]:
        ledger = self.ledger
        if ledger is None or not ledger.config.revisit_enabled:
            return
        due = await ledger.store.get_due(ledger.scope, clock.now(), ledger.config.reseed_limit)
        count = 0
        for state in due:
            request = self._reseed_request(state)
            if request is not None and not self.reseed_skip(state):
                count += 1
                yield request
        self.crawler.stats.inc_value("incremental/reseeded", count)
        logger.info("Re-seeded %(count)d due pages from the store", {"count": count})

    def _reseed_request(self, state: PageState) -> Request | None:
        callback = getattr(self, state.callback or "", None)
        if not callable(callback):
            return None
        meta = {META_VARIANT: state.key.variant} if state.key.variant else {}
        # Pages that changed often are likelier to have changed again.
        priority = int(100 * state.changes / max(state.checks, 1))
        return Request(state.key.url, callback=callback, meta=meta, priority=priority)

    @classmethod
    def update_settings(cls, settings: BaseSettings) -> None:
        super().update_settings(settings)
        addons = settings.getdict("ADDONS")
        if ADDON_PATH not in addons:
            settings.set("ADDONS", {**addons, ADDON_PATH: 0}, priority="spider")

    @staticmethod
    def discovery_request(url: str, **kwargs: Any) -> Request:
        """A request fetched without conditions and without stored state."""
        meta = {**kwargs.pop("meta", {}), META_SKIP: True}
        return Request(url, meta=meta, **kwargs)
