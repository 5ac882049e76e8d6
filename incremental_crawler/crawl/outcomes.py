"""Failed pages are recorded by their final outcome, after every retry.

:class:`FinalOutcomeMiddleware` records a page whose request ended without
its data: no HTTP answer (a network error, a timeout: recorded as status
``0``), a 5xx, 408, 429, 401 or 403, or a truncated body (failures), and
404, 410 and the other 4xx (answers, not failures). The ledger stores it
(:meth:`~incremental_crawler.crawl.ledger.Ledger.record_failure`):
validators and fingerprint stay as they were, the page is due on the next
crawl and then backs off; a page never fetched is stored without a
fingerprint, with its callback and recipe, so that the re-seeder requests
it again even when the sitemap that listed it answers 304.

Downloader middleware order 540: below RetryMiddleware (550), and so below
the Retry-After middleware (575) and the conditional middleware (585). A
response goes through ``process_response`` from the highest order to the
lowest, and a middleware that retries returns a new request instead,
which ends the response's way there. Below every retrying middleware, only
final answers arrive: a retried attempt never does, and a 503 retried until
it succeeds is no failure. It applies to the requests the conditional
middleware let out (GET, a spider callback, not ``incremental_skip``;
sitemaps and feeds included: :func:`~.middleware.page_context`).

Exceptions are taken where every one that ends a request passes
(:mod:`.downloader_exits`): one raised by a ``process_response`` on the
answer's way back (a body that does not decode, a decompression limit,
REDIRECT_MAX_TIMES exceeded, a user's middleware) never reaches a
``process_exception``. Each is a failure of the page (status ``0``) but
for the requests dropped on purpose before they were sent (an
``IgnoreRequest`` that went through ``process_exception``: offsite,
robots.txt) and the conditional middleware's own (``NotModified``,
``NotDue``), which settle the page themselves. An answer already recorded
is not recorded again when an exception follows it.

Redirects. A page whose redirects lead nowhere brought no data: the page
that was asked (the chain's *origin*, remembered on each hop's request) is
recorded as a failure too, with its own redirect status, when the final
hop's outcome is one (an error, a 4xx, 5xx), when RedirectMiddleware gives
up (REDIRECT_MAX_TIMES), and when the chain comes back to a URL it went
through (a loop: the dupefilter drops that request, see
:meth:`FinalOutcomeMiddleware.request_dropped`). A loop and a redirect
limit are said in one WARNING line each. A hop that is not fetched because
another request of the crawl asks its target (the dupefilter), or because
it leaves the site (the offsite check), leaves the page asked redirected in
the crawl's accounting.

Gone pages (:mod:`.tombstones`) are decided here too. A final 404 or 410
of a known page may make it gone: it is recorded as a failure first, as
any 404 or 410 is, then its tombstone goes through the item pipelines
before the response goes on (the crawl cannot end meanwhile: the request
is still the downloader's). A page flagged GONE that answers 404 or 410
again stays GONE, checked again INCREMENTAL_GONE_RECHECK later, with no
second tombstone. A 301 or 308 is seen by :class:`MovedPageMiddleware`
(605) before RedirectMiddleware (600) follows it; the page is moved (its
tombstone sent) only once its target proved live: it answered a 2xx or a
304, or, when this request did not fetch it (redirects off,
``dont_redirect``, offsite, robots.txt, not due, already requested this
crawl), the store knows it as a live page (fetched, not failing, not
gone). A target that fails makes the origin a failure, as above; a target
not fetched and not known live leaves the origin's 301 recorded as a
redirect (``redirect_to``), not a tombstone. A GONE page that redirects
stays GONE, checked again INCREMENTAL_GONE_RECHECK later.

A page asked twice in one crawl (start requests are ``dont_filter``) may
have both answers decide it gone, each request having read its state
before either answer came: the first claims its tombstone
(:meth:`~incremental_crawler.crawl.ledger.Ledger.claim_tombstone`; in
cluster mode, once for the whole run), and the page's later answers of the
crawl record nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from urllib.parse import urljoin
from weakref import WeakSet

from scrapy import signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from w3lib.url import safe_url_string

from incremental_crawler.change.accounting import PageOutcome, counted_key
from incremental_crawler.change.downloader_exits import watch_downloader_exits
from incremental_crawler.change.policy import Outcome, final_outcome
from incremental_crawler.change.tombstones import (
    MOVED_STATUSES,
    Gone,
    GoneReason,
    gone_reason,
    is_gone,
    known_page,
)
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.crawl.conditional import callback_name, page_context
from incremental_crawler.crawl.ledger import TXN_META, Ledger
from incremental_crawler.exceptions import NotDue, NotModified
from incremental_crawler.meta import META_DISCOVERY, META_LASTMOD
from incremental_crawler.offsite import offsite_drops
from incremental_crawler.recipes import own_recipe
from incremental_crawler.state.records import PageKey, PageState
from incremental_crawler.state.stores import StateStoreError

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["FinalOutcomeMiddleware", "MovedPageMiddleware"]

logger = logging.getLogger(__name__)

#: Meta key: ``(key, prior)`` of the page a redirect chain started from,
#: set on its second hop (the first hop's context is still in the copied
#: meta then) and copied along the chain.
_ORIGIN = "_incremental_origin"
#: Meta key: the :class:`Gone` of a known page that answered 301 or 308,
#: waiting for its target to prove live (copied to the redirected request).
_MOVED = "_incremental_moved"

#: RedirectMiddleware's reason when REDIRECT_MAX_TIMES is exceeded (Scrapy
#: 2.19 raises a plain IgnoreRequest: its message is what tells it apart).
_MAX_REDIRECTS = "max redirections reached"

Page = tuple[PageKey, PageState | None]


class FinalOutcomeMiddleware:
    """See the module docstring."""

    def __init__(self, crawler: Crawler, config: IncrementalConfig) -> None:
        if not config.enabled:
            raise NotConfigured("INCREMENTAL_ENABLED is False; no page state is kept")
        self.crawler = crawler
        self.ledger = Ledger.for_component(crawler)
        spider = self.ledger.spider_for_component()
        self.spider: Spider = spider
        # Exceptions that went through process_exception: raised before the
        # request was sent (or by the download itself), not on the way back.
        self._way_out: WeakSet[BaseException] = WeakSet()
        # Requests whose outcome is recorded: an exception after it is not
        # a second failure.
        self._recorded: WeakSet[Request] = WeakSet()
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.request_dropped, signal=signals.request_dropped)
        crawler.signals.connect(self.request_scheduled, signal=signals.request_scheduled)
        #: Whether OffsiteMiddleware drops a request (found once the engine runs).
        self._offsite: Callable[[Request], bool] | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler, IncrementalConfig.from_settings(crawler.settings))

    def spider_opened(self, spider: Spider) -> None:
        if not watch_downloader_exits(self.crawler, self.download_failed):
            logger.warning(
                "The downloader's middleware manager has no download_async: exceptions "
                "raised on an answer's way back are not recorded as failures",
                extra={"spider": spider})

    def _hop(self, request: Request) -> bool:
        """Whether *request* is a redirect's next hop: the context copied with its
        meta is that of the URL it was redirected from (not response.meta copied
        by a callback into a request for another page)."""
        urls: list[str] = request.meta.get("redirect_urls") or []
        page = page_context(request)
        if not urls or page is None:
            return False
        canonical = self.ledger.canonical
        # (Its own URL: a retry of the hop.)
        return page[0].url in (canonical(urls[-1]), canonical(request.url))

    def process_request(self, request: Request) -> None:
        meta = request.meta
        if self._hop(request):
            # A later hop: the meta copied from the first one holds its context.
            if _ORIGIN not in meta and (first := page_context(request)) is not None:
                meta[_ORIGIN] = first
        else:
            meta.pop(_ORIGIN, None)
            meta.pop(_MOVED, None)

    async def process_response(self, request: Request, response: Response) -> Response:
        status = response.status
        outcome = final_outcome(status, truncated="dataloss" in response.flags)
        if outcome is None:
            if request.meta.get(_MOVED) is not None:
                if 200 <= status < 300:
                    await self._moved(request, response, live=True)
                elif 300 <= status < 400:
                    # Not followed: what the store knows of the target decides.
                    await self._moved(request, response, live=None)
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
                self._recorded.add(request)
                self.ledger.still_gone(key, prior, status, lastmod=_listed(request))
                self._origin_failed(request, own=page)
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
        # Recorded (or not) where it leaves the chain: download_failed.
        self._way_out.add(exception)

    async def download_failed(self, request: Request, exception: Exception) -> None:
        """*exception* ended *request* (see :mod:`.downloader_exits`)."""
        way_out = exception in self._way_out
        self._way_out.discard(exception)
        if isinstance(exception, NotModified):
            # The target of a move answered 304: our copy of it is live.
            await self._moved(request, None, live=True)
            return
        if isinstance(exception, NotDue) or (isinstance(exception, IgnoreRequest) and way_out):
            # Not sent, on purpose (not due, offsite, robots.txt...): no outcome.
            await self._moved(request, None, live=None)
            return
        if request in self._recorded:
            return
        if isinstance(exception, IgnoreRequest) and exception.args == (_MAX_REDIRECTS,):
            origin = self._chain_origin(request)
            if origin is not None:
                logger.warning(
                    "Too many redirects from %(url)s (REDIRECT_MAX_TIMES, through "
                    "%(hops)d URLs): recorded as failed, asked again next crawl",
                    {"url": origin[0].url, "hops": len(request.meta["redirect_urls"]) + 1
                     if request.meta.get("redirect_urls") else 1},
                    extra={"spider": self.spider})
                self._chain_failed(request, origin)
            return
        if isinstance(exception, IgnoreRequest) and page_context(request) is not None:
            logger.info(
                "The answer of %(url)s was dropped on its way back (%(why)s): recorded "
                "as failed, asked again next crawl",
                {"url": request.url, "why": exception}, extra={"spider": self.spider})
        if (txn := request.meta.get(TXN_META)) is not None:
            # A 2xx the conditional middleware took, lost before its callback:
            # its state is never committed, the failure record stands instead.
            txn.done = True
        self._record(request, 0, Outcome.FAILED)

    def request_scheduled(self, request: Request, spider: Spider) -> None:
        """A moved page's hop that the offsite check drops before the scheduler (no
        signal tells): decided now, by what the store knows of the target."""
        # A page's transaction copied into a new request (MetaRefresh, a user's
        # retry of a 2xx) is not the new request's, and cannot be pickled.
        request.meta.pop(TXN_META, None)
        moved = request.meta.get(_MOVED) is not None and self.ledger.tombstones.enabled
        hop = _redirect_hop_of_counted_page(request)
        if not (moved or hop):
            return
        if self._offsite is None:
            self._offsite = offsite_drops(self.crawler)
        if not self._offsite(request):
            return
        if hop:
            self._redirected_away(request)
        if moved:
            self.ledger.tombstones.hold_open(self._moved(request, None, live=None))

    def request_dropped(self, request: Request, spider: Spider) -> None:
        """A redirect whose target this crawl requested already (the dupefilter)."""
        urls: list[str] = request.meta.get("redirect_urls") or []
        origin = self._chain_origin(request) if urls and self._hop(request) else None
        if origin is None:
            return
        canonical = self.ledger.canonical
        if canonical(request.url) in {canonical(url) for url in urls}:
            logger.warning(
                "Redirect loop: %(url)s redirects back to %(target)s: recorded as failed, "
                "asked again next crawl",
                {"url": origin[0].url, "target": request.url}, extra={"spider": spider})
            self._chain_failed(request, origin)
            return
        # Another request of this crawl fetches the target: what the store
        # knows of it decides whether a move is proved.
        self._redirected_away(request)
        tombstones = self.ledger.tombstones
        if request.meta.get(_MOVED) is not None and tombstones.enabled:
            tombstones.hold_open(self._moved(request, None, live=None))

    def _redirected_away(self, request: Request) -> None:
        """A redirect hop that is not fetched (its target is another
        request's of this crawl, or off the site): the page that was asked
        ends redirected, its chain not followed here, unless another request
        of it this crawl was answered."""
        key = counted_key(request)
        if key is not None and not request.meta.get(META_DISCOVERY):
            self.ledger.counter.unanswered(PageOutcome.REDIRECTED, key)

    def _record(self, request: Request, status: int, outcome: Outcome) -> None:
        self._recorded.add(request)
        page = page_context(request)
        if page is not None and page[0] not in self.ledger.tombstoned:
            # (Its tombstone this crawl decides the page: see the module docstring.)
            key, prior = page
            self.ledger.record_failure(
                key, prior, status, callback=callback_name(request, self.spider),
                recipe=own_recipe(request, self.spider, self.ledger.recipe_rules),
                counted=outcome is Outcome.FAILED, counted_as=counted_key(request),
            )
            self._count(request, key, outcome)
        self._origin_failed(request, own=page)

    def _chain_origin(self, request: Request) -> Page | None:
        """The page a redirect chain started from (for a hop never sent:
        the first one's context, still in its copied meta)."""
        origin: Page | None = request.meta.get(_ORIGIN)
        return origin if origin is not None else page_context(request)

    def _origin_failed(self, request: Request, *, own: Page | None) -> None:
        """The final hop of a redirect chain failed: so did the page that was asked."""
        origin: Page | None = request.meta.get(_ORIGIN)
        if origin is None or (own is not None and own[0] == origin[0]):
            return
        self._chain_failed(request, origin)

    def _chain_failed(self, request: Request, origin: Page) -> None:
        request.meta.pop(_MOVED, None)  # no move proved: no tombstone
        key, prior = origin
        if key in self.ledger.tombstoned:
            return
        reasons = request.meta.get("redirect_reasons") or [0]
        status = reasons[0] if isinstance(reasons[0], int) else 0
        self.ledger.record_failure(
            key, prior, status, callback=callback_name(request, self.spider),
            recipe=own_recipe(request, self.spider, self.ledger.recipe_rules), counted=True,
            counted_as=counted_key(request))
        self._count(request, key, Outcome.FAILED)

    async def _moved(self, request: Request, response: Response | None, *,
                     live: bool | None) -> None:
        """Send the tombstone of the page that moved to *request*'s URL, if its target is
        *live* (``None``: not fetched by this request, the store decides)."""
        gone: Gone | None = request.meta.pop(_MOVED, None)
        if gone is None or gone.key in self.ledger.tombstoned:
            return
        if live is None:
            try:
                target = await self.ledger.store.get_page(
                    PageKey(gone.key.scope, gone.target or ""))
            except StateStoreError as exc:
                self.ledger.store_failed(exc)  # the crawl stops; nothing is decided
                return
            live = _live(target)
            if not live:
                # The 301 is recorded where it points; no tombstone for a move unproved.
                self.ledger.stage_redirect(gone.key, gone.target or "", gone.status)
                return
        if self.ledger.claim_tombstone(gone.key):
            await self.ledger.tombstones.send(gone, response)

    def _count(self, request: Request, key: PageKey, outcome: Outcome) -> None:
        """The page's column in the crawl's accounting (sitemaps and feeds
        are not pages): the page counted when *request* was decided (a
        redirect chain's origin), else *key*'s."""
        if not request.meta.get(META_DISCOVERY):
            self.ledger.counter.outcome(
                PageOutcome.FAILED if outcome is Outcome.FAILED else PageOutcome.GONE,
                counted_key(request) or key)


class MovedPageMiddleware:
    """A known page answering 301 or 308 to another URL is gone (moved), once
    its target proved live (see the module docstring).

    A GONE page answering any redirect (but a 304) stays GONE, checked again
    INCREMENTAL_GONE_RECHECK later: followed, its answer never reaches the
    outcome middleware.

    Downloader middleware order 605, just above RedirectMiddleware (600): a
    response goes through ``process_response`` from the highest order down,
    so this sees the redirect itself, before it is followed. It leaves the
    page's :class:`Gone` in the request's meta, which RedirectMiddleware
    copies to the target's request; :class:`FinalOutcomeMiddleware` sends
    its tombstone when the target answers (or not). A redirect is never
    retried: it is the page's final answer. The conditional middleware
    (585) read the page's state when its request went out
    (:func:`~.middleware.page_context`).
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
        if target != key.url:
            request.meta[_MOVED] = Gone(key, prior, response.status, GoneReason.MOVED,
                                        target=target, lastmod=_listed(request))
        return response


def _redirect_hop_of_counted_page(request: Request) -> bool:
    """Whether *request* is a redirect's next hop carrying the page counted
    when its chain was decided (see :func:`counted_key`)."""
    return bool(request.meta.get("redirect_urls")) and counted_key(request) is not None


def _live(state: PageState | None) -> bool:
    """Whether the store knows *state*'s page as live: fetched, not failing, not gone."""
    if state is None or not known_page(state) or state.failures:
        return False
    status = state.last_status or 0
    return 200 <= status < 300 or status == 304


def _listed(request: Request) -> float | None:
    """The date the list that named the page gave it (``None``: none)."""
    lastmod = request.meta.get(META_LASTMOD)
    return lastmod if isinstance(lastmod, (int, float)) else None


