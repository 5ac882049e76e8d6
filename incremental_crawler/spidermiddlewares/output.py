"""Counts what a callback yields, so the ledger knows when a page is done.

It must be the outermost spider middleware (the lowest order number): it
then sees exactly the items the engine sends to the item pipelines, after
every other middleware had its chance to drop or add some.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy import Request

from incremental_crawler.ledger import TXN_META, Ledger

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from typing import Self

    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["PageOutputMiddleware"]


class PageOutputMiddleware:
    """Tells the ledger how many items each response produced, and when.

    Async only (Scrapy >= 2.13 feeds synchronous callbacks' output to it as
    an async iterable).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.ledger = Ledger.for_component(crawler)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

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
                if obj is not None and not isinstance(obj, Request):
                    self.ledger.item_yielded(txn, obj)
                yield obj
        except Exception as exc:
            self.ledger.output_failed(txn, f"the callback failed ({exc!r})")
            raise
        self.ledger.output_finished(txn)
