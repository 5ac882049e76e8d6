"""Requests for pages that are not due, dropped as they leave the spider.

A request a callback (or ``start()``) yields for a page whose revisit is
not due would be refused by the conditional downloader middleware
(``NotDue``) only after the scheduler, the downloader's slots and Scrapy's
error accounting (``downloader/exception_count``) had it, and its errback
would be called. :class:`NotDueFilterMiddleware` drops it before the
scheduler instead, counted as not due (``incremental/schedule/not_due``,
with the time it falls due); its errback is not called.

It decides with the rules the downloader middleware uses
(:class:`~.due.RequestRules`), on the page's stored state, read in one batch per
chunk of a callback's output (one at a time for ``start()``, which may be
lazy), and hands each state it read to that middleware
(``Ledger.prefetched``) so the store is not asked twice. Passed through
untouched:

- requests the conditional middleware does not apply to (not a GET,
  ``NO_CALLBACK``, ``incremental_skip``), sitemaps and feeds
  (``incremental_discovery``) and forced full fetches
  (``incremental_refresh``), which are always due;
- requests whose reason was decided, and counted, by whoever made them
  (``META_WHY``: the list spiders, the re-seeder);
- a not-due page with a stored links record where links are replayed: the
  downloader middleware answers it with a stand-in response yielding the
  page's links, since the pages behind it may be due. Unless the store
  shows nothing they lead to can matter this crawl
  (:mod:`~incremental_crawler.crawl.inert`: walked from the start requests):
  then it is dropped as not due, without a stand-in.

``dont_filter`` changes nothing: it asks the scheduler not to drop a
duplicate, not for a page to be fetched whatever its schedule (the
downloader middleware would refuse it all the same); ``incremental_refresh``
is the way to fetch a page that is not due.

Installed at order 0, outside ``PageOutputMiddleware`` (1): a request it
drops is still recorded among the page's links, to be replayed when the
page is next unchanged. Without revisits (``INCREMENTAL_REVISIT_ENABLED``
False) every page is due, and it lets everything through untouched.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.exceptions import NotConfigured

from incremental_crawler.change.accounting import decided
from incremental_crawler.change.policy import links_unknown
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.crawl.due import RequestRules
from incremental_crawler.crawl.inert import StoredGraphWalk
from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.meta import META_DISCOVERY, META_REFRESH
from incremental_crawler.state.records import PageFlags, has_flag, is_gone
from incremental_crawler.state.stores import StateStoreError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from typing import Self

    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from incremental_crawler.state.records import PageKey, PageState

__all__ = ["NotDueFilterMiddleware"]

logger = logging.getLogger(__name__)

#: Objects of a callback's output decided together (one store read).
_CHUNK = 500
#: Pages whose state this crawl already read: a duplicate request (the
#: scheduler's dupefilter drops it later anyway) costs no store read, and a
#: page dropped twice is counted once. Beyond it, duplicates are read again.
_MEMO_LIMIT = 50_000


class NotDueFilterMiddleware:
    """Spider middleware; see the module docstring."""

    def __init__(self, crawler: Crawler, config: IncrementalConfig) -> None:
        #: Without revisits every page is due: everything goes through as it
        #: comes (not NotConfigured: its warning would be logged on every crawl).
        self.active = config.revisit_enabled
        self.ledger = Ledger.for_component(crawler)
        spider = self.ledger.spider_for_component()
        self.rules = RequestRules.for_crawler(crawler, config, spider)
        self.counter = self.ledger.counter
        self._memo: dict[PageKey, PageState | None] = {}
        #: Whether a not-due page's stored links can lead to anything this
        #: crawl, read from the store (None: every such page gets its stand-in).
        self.walk = (StoredGraphWalk(crawler, self.ledger, self.rules, spider)
                     if config.replay_shortcuts and self.rules.replay else None)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = IncrementalConfig.from_settings(crawler.settings)
        if not config.enabled:
            raise NotConfigured("INCREMENTAL_ENABLED is False")
        return cls(crawler, config)

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for obj in start:
            for kept in await self._filter([obj], start=True) if self.active else [obj]:
                yield kept

    async def process_spider_output(
        self, response: Response, result: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        if not self.active:
            async for obj in result:
                yield obj
            return
        chunk: list[Any] = []
        async for obj in result:
            chunk.append(obj)
            if len(chunk) >= _CHUNK:
                for kept in await self._filter(chunk):
                    yield kept
                chunk = []
        for kept in await self._filter(chunk):
            yield kept

    async def _filter(self, objs: list[Any], *, start: bool = False) -> list[Any]:
        keyed = [(obj, self._key(obj)) for obj in objs]
        wanted = {key for _, key in keyed if key is not None}
        if not wanted:
            return objs
        not_due: list[PageState] = []
        try:
            fresh = await self._read(wanted)
            kept = []
            for obj, key in keyed:
                if key is None or await self._keep(obj, key, fresh, not_due, start=start):
                    kept.append(obj)
        except StateStoreError:
            # The downloader middleware meets the error too, and stops the crawl.
            return objs
        # The chunk's pages dropped: in cluster mode one round trip, not one a link.
        with self.counter.batch():
            for state in not_due:
                self.counter.not_due(state)
        return kept

    def _key(self, obj: Any) -> PageKey | None:
        """The page key of a request this middleware decides on, else ``None``."""
        if not isinstance(obj, Request) or not self.rules.applies(obj):
            return None
        meta = obj.meta
        if decided(obj) is not None or meta.get(META_DISCOVERY) or meta.get(META_REFRESH):
            return None
        return self.rules.key(obj, self.ledger)

    async def _read(self, keys: set[PageKey]) -> dict[PageKey, PageState | None]:
        """The states of *keys* not looked up yet this crawl (a batch already
        read, else one store read)."""
        fresh: dict[PageKey, PageState | None] = {}
        missing = []
        for key in keys - self._memo.keys():
            found, state = self.ledger.take_prefetched(key)
            if found:
                fresh[key] = state
            else:
                missing.append(key)
        if missing:
            stored = await self.ledger.store.get_pages(missing)
            fresh.update((key, stored.get(key)) for key in missing)
        return fresh

    async def _keep(self, request: Request, key: PageKey,
                    fresh: dict[PageKey, PageState | None], not_due: list[PageState], *,
                    start: bool) -> bool:
        """Whether *request* goes on; a page dropped as not due for the
        first time is added to *not_due* (to count)."""
        first = key in fresh
        if first:
            state = fresh.pop(key)
            if len(self._memo) < _MEMO_LIMIT:
                self._memo[key] = state
        elif key in self._memo:
            state = self._memo[key]
        else:
            return True  # a duplicate in a chunk once the memo is full
        if state is None or self._due(request, state) or (
                self._links_replayed(request, state)
                and not await self._inert(key, state, start=start)):
            if first:
                self.ledger.prefetched(key, state)
            return True
        if first:
            not_due.append(state)
        logger.debug("Not due before %(due).0f, dropped: %(request)s",
                     {"due": state.next_visit, "request": request})
        return False

    async def _inert(self, key: PageKey, state: PageState, *, start: bool) -> bool:
        """Whether a not-due request kept for its stored links can be dropped:
        nothing they lead to can matter this crawl (see
        :mod:`~incremental_crawler.crawl.inert`: walked from start requests,
        remembered for the rest of the crawl)."""
        if self.walk is None:
            return False
        if self.walk.is_inert(key):
            return True
        return start and await self.walk.walk(key, state)

    def _due(self, request: Request, state: PageState) -> bool:
        unknown = links_unknown(state, replay=self.rules.replays(request))
        return self.rules.due(request, state, links_unknown=unknown, ledger=self.ledger)

    def _links_replayed(self, request: Request, state: PageState) -> bool:
        """Whether a not-due page's stored links are yielded again (a gone
        page's never are: the downloader refuses it)."""
        return (self.rules.replays(request) and has_flag(state.flags, PageFlags.HAS_LINKS)
                and not is_gone(state))
