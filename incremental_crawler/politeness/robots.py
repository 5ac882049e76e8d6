"""robots.txt that cannot be read means complete disallow for its host.

RFC 9309 §2.3.1.4: when robots.txt is unreachable because of a server or
network error, a crawler MUST assume complete disallow. Scrapy's
RobotsTxtMiddleware does the opposite: it parses a 5xx answer's body as the
robots.txt (usually nothing, so everything is allowed) and takes a server
that does not answer for one without a robots.txt (everything allowed).
With our throttle it was worse: a 503 was waited out with backoff for
minutes, then everything was fetched.

:class:`RobotsTxtMiddleware` (this module) replaces it at the same order
(100; the add-on swaps them when the project did not configure Scrapy's
itself). Per host, robots.txt's *final* answer decides: after
RetryMiddleware's ``RETRY_TIMES`` retries, and for a 429 or 503 at most
:data:`ROBOTS_RETRY_AFTER` Retry-After waits before them (not the
``INCREMENTAL_THROTTLE_MAX_RETRIES`` a page gets, which took minutes):

* 2xx (after redirects): parsed, as Scrapy does;
* 4xx but 429: no robots.txt, everything allowed (RFC 9309 §2.3.1.3),
  whatever its body says (Scrapy parses it: an error page holding
  ``Disallow: /`` blocked the host);
* 5xx, 429 (as Google does: it is the server asking us to go away) or no
  answer at all (connection refused, a timeout, DNS): **unavailable**. One
  warning names the host; every request to it is refused
  (:class:`~incremental_crawler.exceptions.RobotsTxtUnavailable`, counted in
  ``incremental/robotstxt/refused``) until robots.txt can be read. It is
  asked again at the first request to the host :data:`ROBOTS_RECHECK_AFTER`
  seconds later (``incremental/robotstxt/rechecks``), once, without
  retries and with a timeout of :data:`ROBOTS_WAIT_MAX`; requests refused
  meanwhile stay refused, and so are those that come while it is asked
  (nothing waits for it). The next crawl asks again in any case. The RFC
  allows treating an outage of 30 days as "no robots.txt"; we never do.

A Retry-After longer than :data:`ROBOTS_WAIT_MAX` on robots.txt is not
waited for: the answer is final (the host's slot is frozen as the site
asked, but no request of the host waits behind it).

Nothing is lost: a refused page is recorded as a failure, as a final
failure of its download is (:meth:`Ledger.record_failure
<incremental_crawler.crawl.ledger.Ledger.record_failure>`, status 0: no
answer): due on the next crawl, then backing off, and requested again from
its record by the re-seeder even when the list naming it answers 304. A
page that was not due is left alone. Only a refusal that no record can
bring back (re-seeding off, a request that cannot be rebuilt, an engine
download, a not-due page whose links would have been replayed) is counted
as unrecorded (``incremental/failures_unrecorded``): it keeps every sitemap
and feed state of the crawl unsaved, and the next crawl reads them in full
and lists the refused pages again. In the crawl's accounting a refused
page is requested and failed: the page that was asked, when the refused
request is a redirect's hop.

A page with a record the re-seeder asks for that robots.txt *forbids*
(refused while it could not be read, or fetched before it forbade it) is
recorded as a failure too (``incremental/robotstxt/forbidden_recorded``):
it backs off to ``INCREMENTAL_REVISIT_MAX`` instead of staying due, which
re-seeded it, forbidden, on every crawl. Other forbidden requests are
dropped as Scrapy drops them: nothing asks for them again.

A robots.txt request refused by another middleware (``IgnoreRequest``: a
parked domain, a closing shared budget) allows everything, as in Scrapy:
those middlewares drop the host's requests themselves.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, NoReturn

from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware as ScrapyRobotsTxt
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Request
from scrapy.http.request import NO_CALLBACK
from scrapy.robotstxt import RobotParser
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred

from incremental_crawler.change.accounting import PageOutcome, Why, counted_key
from incremental_crawler.change.policy import links_unknown
from incremental_crawler.crawl.conditional import callback_name
from incremental_crawler.crawl.due import RequestRules
from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.exceptions import RobotsTxtUnavailable
from incremental_crawler.hosts import host_of
from incremental_crawler.meta import META_DISCOVERY
from incremental_crawler.politeness.extension import MAX_WAIT
from incremental_crawler.politeness.middlewares import MAX_RETRY_AFTER
from incremental_crawler.recipes import own_recipe
from incremental_crawler.state.records import PageFlags, is_gone
from incremental_crawler.state.stores import StateStoreError

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Spider
    from scrapy.crawler import Crawler

    from incremental_crawler.state.records import PageKey, PageState

__all__ = ["SCRAPY_ROBOTSTXT", "RobotsTxtMiddleware", "unavailable_status"]

logger = logging.getLogger(__name__)

#: At most this many Retry-After waits for robots.txt (a 429 or 503): with the
#: backoff's 1 s doubling, a few seconds, not minutes.
ROBOTS_RETRY_AFTER = 2

#: The longest Retry-After robots.txt is retried after (seconds): a site
#: asking for more (``Retry-After: 300``) gets its wait (its slot is frozen),
#: but its answer is final: the host is unavailable until the re-check.
ROBOTS_WAIT_MAX = 5.0

#: Seconds after which an unavailable robots.txt is asked again, at the
#: first request to its host from then on (requests refused meanwhile stay
#: refused, and are refused while it is asked). That one request is not
#: retried and times out after :data:`ROBOTS_WAIT_MAX` (or
#: ``DOWNLOAD_TIMEOUT`` when shorter): no request waits for its answer, but
#: a crawl that ran out of requests does (it is in the downloader), and
#: ``RETRY_TIMES`` full timeouts held a finished crawl open for minutes.
ROBOTS_RECHECK_AFTER = 300.0

#: Scrapy's middleware, which the add-on replaces with this one.
SCRAPY_ROBOTSTXT = "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware"


def unavailable_status(status: int) -> bool:
    """Whether a final robots.txt answer with *status* means complete disallow."""
    return status >= 500 or status == 429


class _Unavailable(RobotParser):
    """The parser of a host whose robots.txt could not be read: nothing is allowed."""

    def __init__(self, why: str) -> None:
        self.why = why
        #: When robots.txt may be asked again (``time.monotonic()``).
        self.recheck_at = time.monotonic() + ROBOTS_RECHECK_AFTER

    @classmethod
    def from_crawler(cls, crawler: Crawler, robotstxt_body: bytes) -> Self:
        raise NotImplementedError("built by RobotsTxtMiddleware only")

    def allowed(self, url: str | bytes, user_agent: str | bytes) -> bool:
        return False


class RobotsTxtMiddleware(ScrapyRobotsTxt):
    """See the module docstring."""

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        # Hosts whose robots.txt is being asked again: their requests are
        # refused meanwhile, with the parser they had.
        self._rechecking: dict[str, _Unavailable] = {}
        self._request_rules: RequestRules | None = None

    async def process_request(self, request: Request, spider: Spider | None = None) -> None:
        # (*spider*: Scrapy's signature, which passes it no more.)
        if request.meta.get("dont_obey_robotstxt"):
            return
        if request.url.startswith(("data:", "file:")):
            return
        rp = await self.robot_parser(request)
        if isinstance(rp, _Unavailable):
            await self._refuse(request, rp)
        try:
            self.process_request_2(rp, request)
        except IgnoreRequest:
            # Forbidden by robots.txt (Scrapy's stat robotstxt/forbidden).
            await self._forbidden(request)
            raise

    async def robot_parser(self, request: Request) -> RobotParser | None:
        url = urlparse_cached(request)
        netloc = url.netloc
        if netloc in self._rechecking:
            return self._rechecking[netloc]
        parser = self._parsers.get(netloc)
        if isinstance(parser, _Unavailable) and time.monotonic() >= parser.recheck_at:
            # Asked again in the background: this request and those until
            # the answer are refused with the parser the host had.
            self._rechecking[netloc] = parser
            self._parsers[netloc] = Deferred()
            deferred_from_coro(self._recheck(url.scheme, netloc, request))
            return parser
        if netloc not in self._parsers:
            self._parsers[netloc] = Deferred()
            await self._ask(url.scheme, netloc, request)
        parser = self._parsers[netloc]
        if isinstance(parser, Deferred):
            # Not the Deferred's result: only its first waiter gets the parser
            # (the callback adapting it to a future returns None to the next
            # one, which Scrapy's middleware then takes for "allow all"). The
            # parser is stored before the Deferred fires.
            await maybe_deferred_to_future(parser)
            parser = self._parsers[netloc]
            assert not isinstance(parser, Deferred)
        return parser

    async def _recheck(self, scheme: str, netloc: str, request: Request) -> None:
        self._stats.inc_value("incremental/robotstxt/rechecks")
        try:
            await self._ask(scheme, netloc, request, recheck=True)
        finally:
            del self._rechecking[netloc]

    async def _ask(self, scheme: str, netloc: str, request: Request, *,
                   recheck: bool = False) -> None:
        """Fetch *netloc*'s robots.txt; its parser replaces the Deferred in ``_parsers``.

        *recheck*: asked again in the background (see
        :data:`ROBOTS_RECHECK_AFTER`): one short attempt.
        """
        meta: dict[str, object] = {"dont_obey_robotstxt": True,
                                   MAX_RETRY_AFTER: ROBOTS_RETRY_AFTER, MAX_WAIT: ROBOTS_WAIT_MAX}
        if recheck:
            timeout = self.crawler.settings.getfloat("DOWNLOAD_TIMEOUT")
            if timeout <= 0 or timeout > ROBOTS_WAIT_MAX:  # (0: no timeout)
                timeout = ROBOTS_WAIT_MAX
            meta.update({"dont_retry": True, MAX_RETRY_AFTER: 0, "download_timeout": timeout})
        robotsreq = Request(
            f"{scheme}://{netloc}/robots.txt",
            priority=self.DOWNLOAD_PRIORITY,
            meta=meta,
            callback=NO_CALLBACK,
        )
        try:
            response = await self.crawler.engine.download_async(robotsreq)
        except IgnoreRequest as exc:
            self._robots_error(exc, netloc)
        except Exception as exc:  # any network error: no answer
            self._unavailable(netloc, f"no answer: {type(exc).__name__}: {exc}")
        else:
            if unavailable_status(response.status):
                self._stats.inc_value("robotstxt/response_count")
                self._stats.inc_value(f"robotstxt/response_status_count/{response.status}")
                self._unavailable(netloc, f"it answered {response.status}")
            else:
                if 400 <= response.status < 500:
                    # No robots.txt, whatever the error page says (RFC 9309
                    # §2.3.1.3): Scrapy parsed a 404's body, and an error
                    # page holding "Disallow: /" blocked the host.
                    response = response.replace(body=b"")
                try:
                    await self._parse_robots(response, netloc, request)
                except Exception as exc:
                    # As Scrapy does: a parser that fails allows everything.
                    logger.exception("Error parsing %(request)s: %(error)s",
                                     {"request": robotsreq, "error": exc},
                                     extra={"spider": self.crawler.spider})
                    self._robots_error(exc, netloc)
        self._stats.inc_value("robotstxt/request_count")

    def _unavailable(self, netloc: str, why: str) -> None:
        logger.warning(
            "robots.txt of %(host)s could not be read (%(why)s): every request to "
            "%(host)s is refused (RFC 9309: complete disallow) until it can be read; "
            "it is asked again in %(recheck)g s at the earliest, and by the next crawl",
            {"host": netloc, "why": why, "recheck": ROBOTS_RECHECK_AFTER},
            extra={"spider": self.crawler.spider},
        )
        self._stats.inc_value("incremental/robotstxt/unavailable")
        waiting = self._parsers[netloc]
        parser = _Unavailable(why)
        self._parsers[netloc] = parser
        if isinstance(waiting, Deferred):
            waiting.callback(parser)

    def process_request_2(self, rp: RobotParser | None, request: Request) -> None:
        if isinstance(rp, _Unavailable):
            raise self._refusal(request, rp)
        super().process_request_2(rp, request)

    @staticmethod
    def _refusal(request: Request, rp: _Unavailable) -> RobotsTxtUnavailable:
        return RobotsTxtUnavailable(
            f"robots.txt of {urlparse_cached(request).netloc} could not be read ({rp.why})")

    async def _refuse(self, request: Request, rp: _Unavailable) -> NoReturn:
        """Refuse *request*, its page recorded as a failure when it can be."""
        self._stats.inc_value("incremental/robotstxt/refused")
        ledger = self.crawler.get_extension(Ledger)
        if ledger is not None:
            try:
                await self._record(ledger, request)
            except StateStoreError as exc:
                # The store cannot be read: the crawl stops, nothing is recorded.
                ledger.store_failed(exc)
        raise self._refusal(request, rp)

    async def _forbidden(self, request: Request) -> None:
        """Record a forbidden page that the re-seeder would ask again, as a failure.

        A page with a record the re-seeder requests (one refused while
        robots.txt could not be read, or fetched before robots.txt forbade
        it) stays due for ever if nothing is written: it would be re-seeded
        and forbidden on every crawl. Recorded as a failure (no answer:
        status 0), it backs off to ``INCREMENTAL_REVISIT_MAX`` and is asked
        again then, fetched once robots.txt allows it. A gone page at its
        rare recheck is no failure: it stays gone, due a recheck
        (INCREMENTAL_GONE_RECHECK) later. Any other forbidden request is
        left as Scrapy leaves it: nothing asks for it again.
        """
        ledger = self.crawler.get_extension(Ledger)
        spider = self.crawler.spider
        if ledger is None or spider is None or not ledger.config.reseeds_for(spider):
            return
        try:
            found = await self._due_page(ledger, request)
        except StateStoreError as exc:
            ledger.store_failed(exc)
            return
        if found is None:
            return
        key, prior, why = found
        if prior is None or prior.callback is None or not why.requested:
            return
        if is_gone(prior):
            # Its rare recheck: not a failure, the next one a recheck later.
            ledger.gone_unasked(key, prior)
            self._stats.inc_value("incremental/robotstxt/forbidden_recorded")
            return
        ledger.record_failure(
            key, prior, 0, callback=callback_name(request, spider),
            recipe=own_recipe(request, spider, ledger.recipe_rules), counted=False)
        self._stats.inc_value("incremental/robotstxt/forbidden_recorded")

    def _rules(self, ledger: Ledger) -> RequestRules:
        if self._request_rules is None:
            spider = self.crawler.spider
            assert spider is not None
            self._request_rules = RequestRules.for_crawler(self.crawler, ledger.config, spider)
        return self._request_rules

    async def _due_page(
        self, ledger: Ledger, request: Request,
    ) -> tuple[PageKey, PageState | None, Why] | None:
        """The page of *request*: its key, stored state, and why it is
        requested this crawl, or not (``Why.requested``).

        The conditional middleware (585) never sees a refused request: the
        page's state is read here. ``None``: the request has no page of its
        own (an engine download).
        """
        rules = self._rules(ledger)
        if not rules.applies(request):
            return None
        key = rules.key(request, ledger)
        found, prior = ledger.take_prefetched(key)
        if not found:
            prior = await ledger.store.get_page(key)
        why = Why.NEW if prior is None else rules.why(
            request, prior, links_unknown=links_unknown(prior, replay=rules.replays(request)),
            ledger=ledger)
        return key, prior, why

    async def _record(self, ledger: Ledger, request: Request) -> None:
        """Record the refused page's failure, as a final failure of its download is.

        A page not due is left alone (it would not have been fetched). A due
        page, or a new one, is recorded through :meth:`Ledger.record_failure`
        (no answer: status 0), so that it is due on the next crawl (then
        backs off) and the re-seeder requests it then, even when the list
        naming it answers 304; only a failure that cannot be requested again
        from its record counts as unrecorded (it keeps the crawl's sitemaps
        unsaved).
        """
        spider = self.crawler.spider
        assert spider is not None
        found = await self._due_page(ledger, request)
        if found is None:
            # No page of its own (an engine download): nothing to record it in.
            ledger.note_unrecorded_failure()
            return
        key, prior, why = found
        # The conditional middleware, below this one, never sees the
        # request: its page is counted here, unless whoever made the
        # request counted it (a list, the re-seeder; a redirect's hop
        # carries the page that was asked, whose answer this refusal is).
        counted = counted_key(request)
        page = not request.meta.get(META_DISCOVERY)
        if not why.requested:
            assert prior is not None
            if page and counted is None:
                ledger.counter.not_due(prior)
            if self._rules(ledger).replays(request) and prior.flags & PageFlags.HAS_LINKS:
                # Not due, but its links would have been replayed: the
                # pages behind it are not reached this crawl.
                ledger.note_unrecorded_failure()
            return
        if page and counted is None:
            ledger.counter.requested(why, host_of(request.url), key, prior)
        ledger.record_failure(
            key, prior, 0, callback=callback_name(request, spider),
            recipe=own_recipe(request, spider, ledger.recipe_rules), counted=True,
            counted_as=counted)
        if page:
            ledger.counter.outcome(PageOutcome.FAILED, counted or key)
