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

Gone pages (:mod:`.tombstones`) are decided here too. A final 404 or 410
of a known page may make it gone: it is recorded as a failure first, as
any 404 or 410 is, then its tombstone goes through the item pipelines
before the response goes on (the crawl cannot end meanwhile: the request
is still the downloader's). A page flagged GONE that answers 404 or 410
again stays GONE, checked again INCREMENTAL_GONE_RECHECK later, with no
second tombstone. A 301 or 308 never gets this far when it is followed:
RedirectMiddleware (600) turns it into a request for its target first, so
:class:`MovedPageMiddleware` (605) sees it just before, whether it is
followed or not, and wherever the target is (offsite, disallowed, already
seen this crawl, answering 304 or not due); a GONE page that redirects
stays GONE there, checked again INCREMENTAL_GONE_RECHECK later.

A page asked twice in one crawl (start requests are ``dont_filter``) may
have both answers decide it gone, each request having read its state
before either answer came: the first claims its tombstone
(:meth:`~incremental_crawler.state.ledger.Ledger.claim_tombstone`; in
cluster mode, once for the whole run), and the page's later answers of the
crawl record nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urljoin

from scrapy.exceptions import IgnoreRequest, NotConfigured
from w3lib.url import safe_url_string

from incremental_crawler.change.middleware import callback_name, page_context
from incremental_crawler.change.policy import Outcome, final_outcome
from incremental_crawler.change.schedule import PageOutcome
from incremental_crawler.change.tombstones import (
    MOVED_STATUSES,
    Gone,
    GoneReason,
    gone_reason,
    is_gone,
    known_page,
)
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.links.recipes import own_recipe
from incremental_crawler.meta import META_DISCOVERY, META_LASTMOD
from incremental_crawler.state.ledger import Ledger

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from incremental_crawler.state.records import PageKey

__all__ = ["FinalOutcomeMiddleware", "MovedPageMiddleware"]


class FinalOutcomeMiddleware:
    """See the module docstring."""

    def __init__(self, crawler: Crawler, config: IncrementalConfig) -> None:
        if not config.enabled:
            raise NotConfigured("INCREMENTAL_ENABLED is False; no page state is kept")
        self.ledger = Ledger.for_component(crawler)
        spider = self.ledger.spider_for_component()
        self.spider = spider

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler, IncrementalConfig.from_settings(crawler.settings))

    async def process_response(self, request: Request, response: Response) -> Response:
        status = response.status
        outcome = final_outcome(status, truncated="dataloss" in response.flags)
        if outcome is None:
            return response
        page = page_context(request)
        tombstones = self.ledger.tombstones
        if (page is not None and status in (404, 410) and tombstones.enabled
                and not request.meta.get(META_DISCOVERY)):
            key, prior = page
            if key in self.ledger.tombstoned:
                # Asked again this crawl: its tombstone (sent, or another
                # worker's) decides the page; recording this answer could
                # overwrite the GONE state staged already.
                return response
            if is_gone(prior):
                assert prior is not None
                self.ledger.still_gone(key, prior, status, lastmod=_listed(request))
                self._count(request, key, outcome)
                return response
            reason = gone_reason(prior, status)
            if reason is not None and not self.ledger.claim_tombstone(key):
                return response
            self._record(request, status, outcome)
            if reason is not None:
                assert prior is not None
                # Its claim left it out of _record: its tombstone records it.
                self._count(request, key, outcome)
                await tombstones.send(
                    Gone(key, prior, status, reason, lastmod=_listed(request)), response)
            return response
        self._record(request, status, outcome)
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        if not isinstance(exception, IgnoreRequest):
            self._record(request, 0, Outcome.FAILED)

    def _record(self, request: Request, status: int, outcome: Outcome) -> None:
        page = page_context(request)
        if page is None or page[0] in self.ledger.tombstoned:
            # Its tombstone this crawl decides the page (see the module docstring).
            return
        key, prior = page
        self.ledger.record_failure(
            key, prior, status, callback=callback_name(request, self.spider),
            recipe=own_recipe(request, self.spider, self.ledger.recipe_rules),
            counted=outcome is Outcome.FAILED,
        )
        self._count(request, key, outcome)

    def _count(self, request: Request, key: PageKey, outcome: Outcome) -> None:
        """The page's column in the crawl's accounting (sitemaps and feeds
        are not pages)."""
        if not request.meta.get(META_DISCOVERY):
            self.ledger.schedule.outcome(
                PageOutcome.FAILED if outcome is Outcome.FAILED else PageOutcome.GONE, key.url)


class MovedPageMiddleware:
    """A known page answering 301 or 308 to another URL is gone (moved).

    A GONE page answering any redirect (but a 304) stays GONE, checked again
    INCREMENTAL_GONE_RECHECK later: followed, its answer never reaches the
    outcome middleware.

    Downloader middleware order 605, just above RedirectMiddleware (600): a
    response goes through ``process_response`` from the highest order down,
    so this sees the redirect itself, before it is followed (see the module
    docstring). A redirect is never retried: it is the page's final answer.
    The conditional middleware (585) read the page's state when its request
    went out (:func:`~.middleware.page_context`).
    """

    def __init__(self, crawler: Crawler, config: IncrementalConfig) -> None:
        if not config.enabled:
            raise NotConfigured("INCREMENTAL_ENABLED is False; no page state is kept")
        self.ledger = Ledger.for_component(crawler)
        if not self.ledger.tombstones.enabled:
            raise NotConfigured("no tombstones (INCREMENTAL_TOMBSTONES or "
                                "INCREMENTAL_CHANGE_FIELD is off)")

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler, IncrementalConfig.from_settings(crawler.settings))

    async def process_response(self, request: Request, response: Response) -> Response:
        status = response.status
        if not 300 <= status < 400 or status == 304 or request.meta.get(META_DISCOVERY):
            return response
        page = page_context(request)
        if page is None or page[0] in self.ledger.tombstoned:
            return response
        key, prior = page
        if is_gone(prior):
            # A moved page redirects still (followed or not, the answer never
            # reaches the outcome middleware): checked again much later.
            assert prior is not None
            self.ledger.still_gone(key, prior, status, lastmod=_listed(request))
            return response
        location = response.headers.get(b"Location")
        if status not in MOVED_STATUSES or not location or not known_page(prior):
            return response
        assert prior is not None
        # Where RedirectMiddleware would go (the Location is Latin-1 on the wire).
        target = self.ledger.canonical(
            safe_url_string(urljoin(request.url, location.decode("latin-1"))))
        if target == key.url or not self.ledger.claim_tombstone(key):
            return response
        await self.ledger.tombstones.send(
            Gone(key, prior, response.status, GoneReason.MOVED, target=target,
                 lastmod=_listed(request)), response)
        return response


def _listed(request: Request) -> float | None:
    """The date the list that named the page gave it (``None``: none)."""
    lastmod = request.meta.get(META_LASTMOD)
    return lastmod if isinstance(lastmod, (int, float)) else None
