"""Re-seeding: once a crawl runs out of requests, its due known pages are requested again.

A listing that answers 304 (or is not due) yields no links, so the pages
only it leads to would wait for the listing to change. :class:`Reseeder`,
an extension the add-on installs for every spider, makes up for it: once per
crawl, when the engine is idle, it reads from the store the pages of the
crawl's own scope whose revisit is due, most overdue first (at most
``INCREMENTAL_RESEED_LIMIT``), and requests each again as the page's own
request was made: its callback, and what :func:`~.recipes.own_recipe` kept
of it (meta such as a CrawlSpider's rule index, ``cb_kwargs``, errback,
priority). A page whose request cannot be made again (its callback or rule
is gone, its request could not be recorded, the record is not one this
version reads) is skipped and counted
(``incremental/reseed/skipped/<reason>``).

How the requests are made: a local ``data:`` request goes through the
scheduler, and its callback reads the store and yields the pages' requests.
A callback may await (the store may be remote: no read blocks the reactor),
the engine does not close the spider while the request is processed, and
what the callback yields is handled as any callback's output: through the
spider middlewares (depth, referer, URL length, the project's own), the
scheduler and its dupefilter, so a page already requested this crawl is not
requested twice. Requests made by ``engine.crawl()`` from the idle handler
would skip the spider middlewares.

Spiders steer it with optional attributes, looked up on the spider:
``incremental_reseed = False`` turns it off (as does
``INCREMENTAL_RESEED_ENABLED``, also in ``custom_settings``),
``needs_reseed()`` says whether this crawl may have missed known pages, and
``reseed_skip(state)`` leaves out a due page (the sitemap and feed spiders
re-seed only when a list was not read, and never the pages a list named).

Cluster mode: one worker per run re-seeds (the pages go to the shared
queue), once no worker can discover more links.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.exceptions import DontCloseSpider, NotConfigured

from incremental_crawler import clock
from incremental_crawler.cluster.coordinator import ClusterCoordinator
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.links.recipes import Unbuildable, page_request
from incremental_crawler.meta import META_SKIP, META_VARIANT
from incremental_crawler.state.ledger import Ledger

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from typing import Self

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from incremental_crawler.state.records import PageState

__all__ = ["CALLBACK_ATTRIBUTE", "RESEED_URL", "Reseeder"]

logger = logging.getLogger(__name__)

#: The local request whose callback reads the due pages.
RESEED_URL = "data:,reseed"

#: The spider attribute holding that callback. Scrapy serialises a request
#: (JOBDIR's disk queues, cluster mode's shared queue) with the name its
#: callback has among the spider's methods, and an extension's method has
#: none: held by the spider, it has one (Scrapy's lookup sees bound methods
#: held by the instance too). The worker that pops the request may not be
#: the one that queued it: it finds its own Reseeder's callback there.
CALLBACK_ATTRIBUTE = "_incremental_reseed_due"

#: Priority added to a page that changed on every visit (pages that changed
#: often are likelier to have changed again).
CHANGE_PRIORITY = 100


class Reseeder:
    """Extension; see the module docstring."""

    def __init__(self, crawler: Crawler, config: IncrementalConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.stats = crawler.stats
        #: Whether this worker queued the re-seed request (once per crawl).
        self.requested = False
        # The spider is bound when it opens: a crawler built for a test
        # (scrapy.utils.test.get_crawler) has none while extensions are built.
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_idle, signal=signals.spider_idle)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = IncrementalConfig.from_settings(crawler.settings)
        if not config.reseeds:
            # Without revisits no page is ever due: nothing to re-seed. No
            # message: Scrapy would log a warning for a choice.
            raise NotConfigured
        return cls(crawler, config)

    @property
    def spider(self) -> Spider:
        spider = self.crawler.spider
        assert spider is not None
        return spider

    def spider_opened(self, spider: Spider) -> None:
        setattr(spider, CALLBACK_ATTRIBUTE, self.reseed_due)  # see CALLBACK_ATTRIBUTE

    def wanted(self) -> bool:
        """Whether the spider wants its due pages re-seeded this crawl."""
        if not self.config.reseeds_for(self.spider):
            return False
        needs = getattr(self.spider, "needs_reseed", None)
        return bool(needs()) if callable(needs) else True

    def spider_idle(self) -> None:
        # Once per crawl, when the links are exhausted.
        if self.requested or not self.wanted():
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
        self.requested = True
        engine = self.crawler.engine
        assert engine is not None
        engine.crawl(
            Request(
                RESEED_URL, callback=self.reseed_due, dont_filter=True,
                meta={META_SKIP: True, "allow_offsite": True},
            )
        )
        if cluster is not None:
            cluster.claim_done("reseed")  # the request is queued: the cluster is busy
        raise DontCloseSpider

    async def reseed_due(self, response: Response) -> AsyncIterator[Request]:
        """The re-seed request's callback: the due pages' requests."""
        ledger = self.crawler.get_extension(Ledger)
        if ledger is None:
            return
        # This crawl's own visits first: a page checked already is not due
        # any more, though a 304's check is invisible until committed (and a
        # request with dont_filter, a start URL, passes the dupefilter).
        await ledger.commit_staged()
        due = await ledger.store.get_due(ledger.scope, clock.now(), self.config.reseed_limit)
        skip = getattr(self.spider, "reseed_skip", None)
        count = 0
        for state in due:
            if callable(skip) and skip(state):
                continue
            request = self.request_for(state)
            if isinstance(request, Unbuildable):
                self.stats.inc_value(f"incremental/reseed/skipped/{request.value}")
                logger.debug("Not re-seeding %(url)s: %(reason)s",
                             {"url": state.key.url, "reason": request.value})
                continue
            count += 1
            yield request
        self.stats.inc_value("incremental/reseeded", count)
        logger.info("Re-seeded %(count)d due pages from the store", {"count": count})

    def request_for(self, state: PageState) -> Request | Unbuildable:
        """The due page's own request again, or why it cannot be made."""
        # "parse" is also what a request without a callback is stored as:
        # Scrapy then calls spider._parse, which is parse for a Spider and,
        # for a CrawlSpider, parse_start_url and its rules (its parse is
        # not a callback). None does the same for both.
        callback = None if state.callback == "parse" else state.callback
        request = page_request(state.key.url, callback, state.recipe, self.spider)
        if isinstance(request, Unbuildable):
            return request
        meta: dict[str, Any] = dict(request.meta)
        if state.key.variant:
            meta[META_VARIANT] = state.key.variant
        changed = CHANGE_PRIORITY * state.changes // max(state.checks, 1)
        # Never dont_filter (a start URL's): a page this crawl requested
        # already is not requested again.
        return request.replace(meta=meta, priority=request.priority + changed,
                               dont_filter=False)
