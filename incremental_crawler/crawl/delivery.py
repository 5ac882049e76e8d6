"""At-least-once delivery: what a killed crawl stored, emitted again.

A crawl stores each item version in the same commit as its page's state,
long before its feeds are done: Scrapy's feed exports buffer their files
and finish (S3, FTP: upload) them only when the spider closes, and a user's
pipeline may batch its writes until its ``close_spider``. A crawl that
never got there (a second SIGTERM, ``kill -9``, a feed that could not be
stored) leaves versions in the store that no reader of its feeds has seen;
the next crawl finds their pages unchanged and would never emit them.

So each version is stored waiting on its crawl (``ItemRecord.delivery``),
and the crawl confirms them all when it closes with its feeds stored
(``Ledger._confirm_delivery``). :class:`RedeliveryMiddleware` emits, before
anything of the spider's own ``start()``, the versions still waiting on a
crawl that is over: as items, through every item pipeline and feed, each
marked ``redelivered`` (``INCREMENTAL_REDELIVERED_FIELD``). Once one left
the pipelines it waits on this crawl instead, so a crawl killed again
emits it again next time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured

from incremental_crawler.config import IncrementalConfig
from incremental_crawler.crawl.ledger import Ledger

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from typing import Self

    from scrapy.crawler import Crawler

__all__ = ["RedeliveryMiddleware"]


class RedeliveryMiddleware:
    """Spider middleware: the versions waiting on crawls that are over come
    first out of ``start()``, as items."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = IncrementalConfig.from_settings(crawler.settings)
        if not config.enabled:
            raise NotConfigured("INCREMENTAL_ENABLED is False")
        if not config.redeliver:
            raise NotConfigured("INCREMENTAL_REDELIVER is False")
        ledger = Ledger.for_component(crawler)
        ledger.spider_for_component()
        return cls(ledger)

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for item in self.ledger.redeliveries():
            yield item
        async for obj in start:
            yield obj
