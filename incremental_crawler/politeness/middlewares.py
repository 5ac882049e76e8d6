"""The politeness downloader middlewares: Retry-After retries, and the shared budget's gate.

:class:`RetryAfterMiddleware`, order 575: Retry-After on 429 and 503,
backoff without it, parked domains. RFC 9110 §10.2.3 and RFC 6585 §4:
``Retry-After`` is delay-seconds or an HTTP-date saying how long to stay
away. The answer's slot is frozen until then (AdaptiveThrottle moves the
slot's clock: no request of that domain leaves earlier) and the request is
retried after it, without spending RetryMiddleware's retry budget. A value
above ``INCREMENTAL_THROTTLE_RETRY_AFTER_MAX`` is not retried early (that
makes retry storms): the domain is parked for the rest of the crawl and the
report says so. Without a usable Retry-After: exponential backoff with
jitter, per consecutive failure. Order 575 puts it after RedirectMiddleware
and the conditional middleware on the way back, before RetryMiddleware
(550), which never sees these answers.

A request with ``meta["dont_retry"]`` is not retried here (RetryMiddleware
does not retry it either): its 429 or 503 goes to the spider. The slot is
frozen all the same, since that happened when the answer arrived
(politeness towards the site is not the request's to turn off).

A request with ``meta[MAX_RETRY_AFTER]`` (robots.txt, see
:mod:`incremental_crawler.politeness.robots`) is retried here at most that
many times instead of ``INCREMENTAL_THROTTLE_MAX_RETRIES``: robots.txt
answering 503 must not hold a host's crawl for minutes of backoff.

The retries are counted in a meta key of our own (``_throttle_retries``,
at most ``INCREMENTAL_THROTTLE_MAX_RETRIES``), not with Scrapy's
``get_retry_request``: its priority and stats keys can be set, but it
always counts in ``meta["retry_times"]``, which RetryMiddleware reads, so
every wait the site asked for would spend one of the ``RETRY_TIMES``
retries meant for broken answers (and past ``RETRY_TIMES`` waits, a
request could no longer be retried after a timeout).

:class:`SharedBudgetMiddleware`, order 950: the gate of the shared per-domain
budget: no request leaves without a token.

With ``INCREMENTAL_THROTTLE_SHARED_URL`` set, every request waits here for a
token of its slot from the budget all workers share in Redis
(:mod:`incremental_crawler.politeness.budget`), without blocking the reactor:
the wait is an asyncio future, the slot's waiting requests share one round
trip. The token's sequence number goes into the request's meta, so that a
429 answered to it is counted once per window across workers. A slot parked
in the shared budget (by any worker) drops its requests; when Redis cannot
be used the request is dropped and the crawl closes (AdaptiveThrottle does
that): never a request sent without a token. Unset: this middleware is not
installed and each process keeps its own budget, as before.

Order 950: the last ``process_request`` before the downloader, after
HttpCacheMiddleware (900), so that only requests that go out need a token
(robots.txt ones included), and after the Retry-After middleware (575),
which puts host groups into ``download_slot`` and drops parked slots' requests.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.exceptions import IgnoreRequest, NotConfigured

from incremental_crawler.config import throttle_enabled
from incremental_crawler.politeness.extension import SHARED_SEQ, AdaptiveThrottle

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["MAX_RETRY_AFTER", "RetryAfterMiddleware", "SharedBudgetMiddleware"]

logger = logging.getLogger(__name__)

_TRIES = "_throttle_retries"

#: Request meta key: at most this many Retry-After retries for the request
#: (instead of INCREMENTAL_THROTTLE_MAX_RETRIES).
MAX_RETRY_AFTER = "_incremental_max_retry_after"


class RetryAfterMiddleware:
    """See the module docstring."""

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        if not throttle_enabled(settings):
            raise NotConfigured("INCREMENTAL_ENABLED or INCREMENTAL_THROTTLE_ENABLED is False")
        # Extensions are built before the downloader: the throttle holds the
        # windows; without it (a bad setting it reported) this steps aside.
        throttle = crawler.get_extension(AdaptiveThrottle)
        if throttle is None:
            raise NotConfigured("RetryAfterMiddleware needs the AdaptiveThrottle extension")
        self.crawler = crawler
        self.throttle = throttle
        self.max_tries = throttle.config.max_retries

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_request(self, request: Request) -> None:
        throttle = self.throttle
        if throttle is None:
            return
        key = throttle.slot_key(request)
        if "download_slot" not in request.meta and (
            key != throttle.crawler.engine.downloader.get_slot_key(request)
        ):
            # Hosts of one site share one budget (one slot).
            request.meta["download_slot"] = key
        if throttle.window(key).parked:
            self.crawler.stats.inc_value("incremental/throttle/parked_requests")
            raise IgnoreRequest(f"{key} is parked (it asked us to stay away too long)")

    def process_response(self, request: Request, response: Response) -> Request | Response:
        # AdaptiveThrottle already froze the slot (or parked it) when the
        # answer arrived; here the request is retried after the freeze.
        throttle = self.throttle
        if response.status not in (429, 503) or throttle is None:
            return response
        if request.meta.get("dont_retry", False):
            return response  # the freeze stands; the answer goes to the spider
        key = throttle.slot_key(request)
        if throttle.window(key).parked:
            return response
        tries = request.meta.get(_TRIES, 0)
        if tries >= request.meta.get(MAX_RETRY_AFTER, self.max_tries):
            return response  # RetryMiddleware's own budget takes over
        retry = request.copy()
        retry.meta[_TRIES] = tries + 1
        retry.dont_filter = True
        self.crawler.stats.inc_value(f"incremental/throttle/retried/{response.status}")
        return retry

    def process_exception(self, request: Request, exception: Exception) -> None:
        if self.throttle is not None and not isinstance(exception, IgnoreRequest):
            self.throttle.on_exception(request, exception)


class SharedBudgetMiddleware:
    """See the module docstring."""

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        if not settings.get("INCREMENTAL_THROTTLE_SHARED_URL"):
            # The default (each worker keeps its own budget): no message, so
            # Scrapy does not log a warning on every crawl.
            raise NotConfigured
        # Extensions are built before the downloader: the throttle, with its
        # client of the shared budget, is there now or was switched off.
        throttle = crawler.get_extension(AdaptiveThrottle)
        if throttle is None or throttle.shared is None:
            # (A bad URL: the throttle is closing the crawl as it opens.)
            raise NotConfigured("the shared budget needs AdaptiveThrottle "
                                "(INCREMENTAL_ENABLED and INCREMENTAL_THROTTLE_ENABLED)")
        self.crawler = crawler
        self.throttle = throttle
        self.shared = throttle.shared

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    async def process_request(self, request: Request) -> None:
        throttle = self.throttle
        key = throttle.slot_key(request)
        window = throttle.window(key)
        # robots.txt's Crawl-delay (and DOWNLOAD_DELAY) cap the shared rate:
        # the workers together keep it, as one client would.
        cap = 1.0 / window.delay_floor if window.delay_floor > 0 else 0.0
        # Imported here: a crawl without a shared budget (this middleware is
        # then not built) does not import Redis's client, which they need.
        from redis.exceptions import RedisError  # noqa: PLC0415

        from incremental_crawler.politeness.budget import (  # noqa: PLC0415
            SharedBudgetClosing,
            SharedBudgetParked,
        )

        try:
            request.meta[SHARED_SEQ] = await self.shared.acquire(key, window.policy, cap)
        except SharedBudgetParked as exc:
            self.crawler.stats.inc_value("incremental/throttle/parked_requests")
            raise IgnoreRequest(str(exc)) from exc
        except SharedBudgetClosing as exc:
            raise IgnoreRequest(str(exc)) from exc
        except RedisError as exc:
            # AdaptiveThrottle has logged it and is closing the crawl.
            raise IgnoreRequest(f"the shared budget is unavailable ({exc})") from exc
