"""Failed pages are recorded by their final outcome, after every retry.

:class:`FinalOutcomeMiddleware` records a page whose request ended without
its data: no HTTP answer (a network error, a timeout: recorded as status
``0``), a 5xx, 408, 429, 401 or 403, or a truncated body (failures), and
404, 410 and the other 4xx (answers, not failures). The ledger stores it
(:meth:`~incremental_crawler.state.ledger.Ledger.record_failure`):
validators and fingerprint stay as they were, the page is due on the next
crawl and then backs off; a page never fetched is stored without a
fingerprint, with its callback and recipe, so that the re-seeder requests
it again even when the sitemap that listed it answers 304.

Downloader middleware order 540: below RetryMiddleware (550), and so below
the Retry-After middleware (575) and the conditional middleware (585). A
response goes through ``process_response`` from the highest order to the
lowest, and a middleware that retries returns a new request instead,
which ends the response's way there; an exception likewise goes through
``process_exception`` from the highest order down until one returns a
request. Below every retrying middleware, only final answers and final
exceptions arrive: a retried attempt never does, and a 503 retried until it
succeeds is no failure. It applies to the requests the conditional
middleware let out (GET, a spider callback, not ``incremental_skip``;
sitemaps and feeds included: :func:`~.middleware.page_context`). Requests
dropped on purpose (``IgnoreRequest``: not due, not modified, offsite,
robots.txt) are no outcome.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.exceptions import IgnoreRequest, NotConfigured

from incremental_crawler.change.middleware import callback_name, page_context
from incremental_crawler.change.policy import Outcome, final_outcome
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.links.recipes import own_recipe
from incremental_crawler.state.ledger import Ledger

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["FinalOutcomeMiddleware"]


class FinalOutcomeMiddleware:
    """See the module docstring."""

    def __init__(self, crawler: Crawler, config: IncrementalConfig) -> None:
        if not config.enabled:
            raise NotConfigured("INCREMENTAL_ENABLED is False; no page state is kept")
        self.ledger = Ledger.for_component(crawler)
        spider = crawler.spider
        assert spider is not None
        self.spider = spider

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler, IncrementalConfig.from_settings(crawler.settings))

    def process_response(self, request: Request, response: Response) -> Response:
        outcome = final_outcome(response.status, truncated="dataloss" in response.flags)
        if outcome is not None:
            self._record(request, response.status, outcome)
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        if not isinstance(exception, IgnoreRequest):
            self._record(request, 0, Outcome.FAILED)

    def _record(self, request: Request, status: int, outcome: Outcome) -> None:
        page = page_context(request)
        if page is None:
            return
        key, prior = page
        self.ledger.record_failure(
            key, prior, status, callback=callback_name(request, self.spider),
            recipe=own_recipe(request, self.spider, self.ledger.recipe_rules),
            counted=outcome is Outcome.FAILED,
        )
