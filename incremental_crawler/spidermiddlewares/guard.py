"""The innermost spider middleware: did the callback run, did it fail?

Order 10,000 (above every built-in spider middleware): its
``process_spider_input`` is the last one before the callback, so when it is
called every other middleware let the response through; its
``process_spider_exception`` is the first one offered a callback's
exception, before any other middleware can swallow it. Either way the
ledger learns the truth about the page before it decides to commit it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from incremental_crawler.ledger import TXN_META, Ledger

if TYPE_CHECKING:
    from typing import Self

    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["CallbackGuardMiddleware"]


class CallbackGuardMiddleware:
    """See the module docstring."""

    def __init__(self, crawler: Crawler) -> None:
        self.ledger = Ledger.for_component(crawler)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_spider_input(self, response: Response) -> None:
        if (txn := response.meta.get(TXN_META)) is not None:
            txn.callback_called = True

    def process_spider_exception(self, response: Response, exception: Exception) -> None:
        if (txn := response.meta.get(TXN_META)) is not None:
            self.ledger.callback_failed(txn, f"the callback failed ({exception!r})")
