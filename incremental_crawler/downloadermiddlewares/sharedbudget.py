"""The gate of the shared per-domain budget: no request leaves without a token.

With ``INCREMENTAL_THROTTLE_SHARED_URL`` set, every request waits here for a
token of its slot from the budget all workers share in Redis
(:mod:`incremental_crawler.shared_budget`), without blocking the reactor:
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

from typing import TYPE_CHECKING

from redis.exceptions import RedisError
from scrapy.exceptions import IgnoreRequest, NotConfigured

from incremental_crawler.extensions.throttle import SHARED_SEQ
from incremental_crawler.shared_budget import SharedBudgetClosing, SharedBudgetParked

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler

    from incremental_crawler.extensions.throttle import AdaptiveThrottle

__all__ = ["SharedBudgetMiddleware"]


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
        throttle: AdaptiveThrottle | None = getattr(crawler, "incremental_throttle", None)
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
