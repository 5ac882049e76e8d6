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
* 4xx but 429: no robots.txt, everything allowed (RFC 9309 §2.3.1.3), as
  Scrapy does;
* 5xx, 429 (as Google does: it is the server asking us to go away) or no
  answer at all (connection refused, a timeout, DNS): **unavailable**. One
  warning names the host; every request to it is refused for the rest of
  the crawl (:class:`~incremental_crawler.exceptions.RobotsTxtUnavailable`,
  counted in ``incremental/robotstxt/refused``). It is not asked again in
  this crawl: the requests refused are gone by then, and a crawl is short
  next to the RFC's notion of a long outage (30 days). The next crawl asks
  again.

Nothing is lost: a refused request is a page that was due and not fetched,
a failure that cannot be recorded (it never reached the conditional
middleware that knows its page), so the ledger counts it
(``incremental/failures_unrecorded``) and keeps every sitemap and feed state
of the crawl unsaved: the next crawl reads them in full and lists the
refused pages again.

A robots.txt request refused by another middleware (``IgnoreRequest``: a
parked domain, a closing shared budget) allows everything, as in Scrapy:
those middlewares drop the host's requests themselves.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware as ScrapyRobotsTxt
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Request
from scrapy.http.request import NO_CALLBACK
from scrapy.robotstxt import RobotParser
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred

from incremental_crawler.exceptions import RobotsTxtUnavailable
from incremental_crawler.politeness.middlewares import MAX_RETRY_AFTER
from incremental_crawler.state.ledger import Ledger

if TYPE_CHECKING:
    from typing import Self

    from scrapy.crawler import Crawler

__all__ = ["SCRAPY_ROBOTSTXT", "RobotsTxtMiddleware", "unavailable_status"]

logger = logging.getLogger(__name__)

#: At most this many Retry-After waits for robots.txt (a 429 or 503): with the
#: backoff's 1 s doubling, a few seconds, not minutes.
ROBOTS_RETRY_AFTER = 2

#: Scrapy's middleware, which the add-on replaces with this one.
SCRAPY_ROBOTSTXT = "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware"


def unavailable_status(status: int) -> bool:
    """Whether a final robots.txt answer with *status* means complete disallow."""
    return status >= 500 or status == 429


class _Unavailable(RobotParser):
    """The parser of a host whose robots.txt could not be read: nothing is allowed."""

    def __init__(self, why: str) -> None:
        self.why = why

    @classmethod
    def from_crawler(cls, crawler: Crawler, robotstxt_body: bytes) -> Self:
        raise NotImplementedError("built by RobotsTxtMiddleware only")

    def allowed(self, url: str | bytes, user_agent: str | bytes) -> bool:
        return False


class RobotsTxtMiddleware(ScrapyRobotsTxt):
    """See the module docstring."""

    async def robot_parser(self, request: Request) -> RobotParser | None:
        url = urlparse_cached(request)
        netloc = url.netloc
        if netloc not in self._parsers:
            self._parsers[netloc] = Deferred()
            robotsreq = Request(
                f"{url.scheme}://{netloc}/robots.txt",
                priority=self.DOWNLOAD_PRIORITY,
                meta={"dont_obey_robotstxt": True, MAX_RETRY_AFTER: ROBOTS_RETRY_AFTER},
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
                    self._stats.inc_value(
                        f"robotstxt/response_status_count/{response.status}")
                    self._unavailable(netloc, f"it answered {response.status}")
                else:
                    try:
                        await self._parse_robots(response, netloc, request)
                    except Exception as exc:
                        # As Scrapy does: a parser that fails allows everything.
                        logger.exception("Error parsing %(request)s: %(error)s",
                                         {"request": robotsreq, "error": exc},
                                         extra={"spider": self.crawler.spider})
                        self._robots_error(exc, netloc)
            self._stats.inc_value("robotstxt/request_count")
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

    def _unavailable(self, netloc: str, why: str) -> None:
        logger.warning(
            "robots.txt of %(host)s could not be read (%(why)s): every request to "
            "%(host)s is refused for the rest of this crawl (RFC 9309: complete "
            "disallow); the next crawl asks again",
            {"host": netloc, "why": why}, extra={"spider": self.crawler.spider},
        )
        self._stats.inc_value("incremental/robotstxt/unavailable")
        waiting = self._parsers[netloc]
        parser = _Unavailable(why)
        self._parsers[netloc] = parser
        if isinstance(waiting, Deferred):
            waiting.callback(parser)

    def process_request_2(self, rp: RobotParser | None, request: Request) -> None:
        if isinstance(rp, _Unavailable):
            self._stats.inc_value("incremental/robotstxt/refused")
            self._note_unrecorded()
            raise RobotsTxtUnavailable(
                f"robots.txt of {urlparse_cached(request).netloc} could not be read "
                f"({rp.why})")
        super().process_request_2(rp, request)

    def _note_unrecorded(self) -> None:
        ledger = self.crawler.get_extension(Ledger)
        if ledger is not None:
            ledger.note_unrecorded_failure()
