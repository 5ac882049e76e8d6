"""A ``206 Partial Content`` that no one asked for is not the page.

RFC 9110 §15.3.7: a server sends 206 to a request with a ``Range``. One that
sends it to a request without (a broken cache or proxy, a server resuming a
download it thinks we started) hands over part of the page as if it were
all of it: a callback would make an item of half a page, stored as a
change, and the next full answer would be stored as a change back.

:class:`UnaskedPartialMiddleware` drops such a response before any callback
sees it (``IgnoreRequest``: the request's errback gets it, counted in
``incremental/partial_unasked``). The page's state is left as it was: its
answer is recorded as a failure by :class:`~.outcomes.FinalOutcomeMiddleware`
(status 206), so the page is asked again on the next crawl. A 206 to a
request that sent a ``Range`` (the spider's own) goes on to its callback.

Downloader middleware order 530: just below FinalOutcomeMiddleware (540),
which sees a response first (``process_response`` runs from the highest
order down) and records it, and below every middleware that retries.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.exceptions import IgnoreRequest

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["UnaskedPartialMiddleware"]

logger = logging.getLogger(__name__)


class UnaskedPartialMiddleware:
    """See the module docstring."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_response(self, request: Request, response: Response) -> Response:
        if response.status != 206 or b"Range" in request.headers:
            return response
        assert self.crawler.stats is not None
        self.crawler.stats.inc_value("incremental/partial_unasked")
        logger.warning(
            "Dropping %(response)s: partial content (206) to a request that asked "
            "for no range; the page is asked again on the next crawl",
            {"response": response}, extra={"spider": self.crawler.spider},
        )
        raise IgnoreRequest(f"206 to a request without Range: {request.url}")
