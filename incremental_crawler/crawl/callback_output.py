"""The ledger's two spider middlewares: what a callback yielded, and whether it ran.

:class:`PageOutputMiddleware` must be the outermost spider middleware (the
lowest order number, 1; only the not-due filter, which drops requests and
never items, is outside it, at 0): it then sees exactly the items the engine sends to
the item pipelines, after every other middleware had its chance to drop or
add some, and tells the ledger how many items each response produced and
when the callback's output ended; it also hands the ledger every request
the callback yielded, as it leaves the spider (after the other middlewares
dropped or changed it), to be replayed when the page answers 304.

:class:`CallbackGuardMiddleware` must be the innermost one (order 10,000,
above every built-in spider middleware): its ``process_spider_input`` is the
last one before the callback, so when it is called every other middleware
let the response through; its ``process_spider_exception`` is the first one
offered a callback's exception, before any other middleware can swallow it.
Either way the ledger learns the truth about the page before it decides to
commit it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy import Request

from incremental_crawler.crawl.ledger import TXN_META, Ledger

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from typing import Self

    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["CallbackGuardMiddleware", "PageOutputMiddleware"]


class PageOutputMiddleware:
    """Tells the ledger how many items each response produced, and when, and
    which requests.

    Async only (Scrapy >= 2.13 feeds synchronous callbacks' output to it as
    an async iterable).
    """

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(Ledger.for_component(crawler))

    async def process_spider_output(
        self, response: Response, result: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        txn = response.meta.get(TXN_META) if response is not None else None
        if txn is None:
            async for obj in result:
                yield obj
            return
        try:
            async for obj in result:
                # Scrapy sends everything but None and requests to the item
                # pipelines (a pipeline may turn any object into an item).
                if isinstance(obj, Request):
                    self.ledger.request_yielded(txn, obj)
                elif obj is not None:
                    self.ledger.item_yielded(txn, obj)
                yield obj
        except Exception as exc:
            self.ledger.output_failed(txn, f"the callback failed ({exc!r})")
            raise
        self.ledger.output_finished(txn)


class CallbackGuardMiddleware:
    """Marks a page's transaction once its callback runs; records its failure."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(Ledger.for_component(crawler))

    def process_spider_input(self, response: Response) -> None:
        if (txn := response.meta.get(TXN_META)) is not None:
            txn.callback_called = True

    def process_spider_exception(self, response: Response, exception: Exception) -> None:
        if (txn := response.meta.get(TXN_META)) is not None:
            self.ledger.callback_failed(txn, f"the callback failed ({exception!r})")
