"""Retry-After on 429 and 503, backoff without it, parked domains.

RFC 9110 §10.2.3 and RFC 6585 §4: ``Retry-After`` is delay-seconds or an
HTTP-date saying how long to stay away. The answer's slot is frozen until
then (AdaptiveThrottle moves the slot's clock: no request of that domain
leaves earlier) and the request is retried after it, without spending
RetryMiddleware's retry budget. A value above
``INCREMENTAL_THROTTLE_RETRY_AFTER_MAX`` is not retried early (that makes
retry storms): the domain is parked for the rest of the crawl and the
report says so. Without a usable Retry-After: exponential backoff with
jitter, per consecutive failure.

Order 575: after RedirectMiddleware and the conditional middleware on the
way back, before RetryMiddleware (550), which never sees these answers.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING

from scrapy.exceptions import IgnoreRequest, NotConfigured

from incremental_crawler.config import setting_or_default, throttle_enabled
from incremental_crawler.validators import parse_http_date

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from incremental_crawler.extensions.throttle import AdaptiveThrottle

__all__ = ["RetryAfterMiddleware", "parse_retry_after"]

logger = logging.getLogger(__name__)

_TRIES = "_throttle_retries"
_DELAY_SECONDS = re.compile(r"^\s*(\d{1,10})\s*$")


def parse_retry_after(value: bytes | str | None, now: float | None = None) -> float | None:
    """Seconds to wait, or ``None`` when *value* is neither form.

    An HTTP-date is measured from *now*: pass the server's own ``Date`` so
    that a clock difference between it and us does not shorten the wait.

    >>> parse_retry_after(b"120"), parse_retry_after("abc"), parse_retry_after("-5")
    (120.0, None, None)
    >>> parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now=784111770)
    7.0
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if match := _DELAY_SECONDS.match(value):
        return float(match.group(1))
    when = parse_http_date(value)
    if when is None:
        return None
    return max(0.0, when - (time.time() if now is None else now))


class RetryAfterMiddleware:
    """See the module docstring."""

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        if not throttle_enabled(settings):
            raise NotConfigured("INCREMENTAL_ENABLED or INCREMENTAL_THROTTLE_ENABLED is False")
        self.crawler = crawler
        self.max_tries = int(setting_or_default(settings, "INCREMENTAL_THROTTLE_MAX_RETRIES"))

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    @property
    def throttle(self) -> AdaptiveThrottle | None:
        # The extension holds the windows; without it (disabled, or a bad
        # setting it reported) this middleware steps aside.
        return getattr(self.crawler, "incremental_throttle", None)

    def process_request(self, request: Request) -> None:
        throttle = self.throttle
        if throttle is None:
            return
        key = throttle.slot_key(request)
        if "download_slot" not in request.meta and key != throttle.crawler.engine.downloader.get_slot_key(request):
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
        key = throttle.slot_key(request)
        if throttle.window(key).parked:
            return response
        tries = request.meta.get(_TRIES, 0)
        if tries >= self.max_tries:
            return response  # RetryMiddleware's own budget takes over
        retry = request.copy()
        retry.meta[_TRIES] = tries + 1
        retry.dont_filter = True
        self.crawler.stats.inc_value(f"incremental/throttle/retried/{response.status}")
        return retry

    def process_exception(self, request: Request, exception: Exception) -> None:
        if self.throttle is not None and not isinstance(exception, IgnoreRequest):
            self.throttle.on_exception(request, exception)
