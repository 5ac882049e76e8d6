"""Server-side politeness checks for the loopback site: a rate limiter.

A token bucket per client address, as rate-limited servers and CDNs apply
it: ``rate`` requests per second, bursts of ``burst``; above it the answer
is ``429 Too Many Requests`` with ``Retry-After`` (RFC 6585 §4, RFC 9110
§10.2.3) as delay-seconds or as an HTTP-date.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from email.utils import formatdate

__all__ = ["TokenBucketLimiter"]


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass
class TokenBucketLimiter:
    """``allow(client)`` → ``None`` (go ahead) or the Retry-After value to send."""

    rate: float
    burst: float
    #: "seconds" (delay-seconds) or "date" (an IMF-fixdate).
    retry_after: str = "seconds"
    buckets: dict[str, _Bucket] = field(default_factory=dict)
    #: Requests refused so far, and when the latest refusal said to come back.
    refused: int = 0
    #: client -> (from, until): monotonic times between which a request of
    #: that client breaks the promise. It starts a little after the 429 was
    #: sent: requests already on the wire then left before the client could
    #: know (the client may run several requests at once).
    promises: dict[str, tuple[float, float]] = field(default_factory=dict)
    grace: float = 0.005
    #: Requests that arrived while their client had been told to wait.
    broken_promises: int = 0

    def allow(self, client: str, now: float | None = None) -> str | None:
        now = time.monotonic() if now is None else now
        start, until = self.promises.get(client, (0.0, 0.0))
        if start <= now < until:
            self.broken_promises += 1
        bucket = self.buckets.get(client)
        if bucket is None:
            bucket = self.buckets[client] = _Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        self.refused += 1
        # Whole seconds until one token is back (Retry-After has no fraction).
        wait = max(1, math.ceil((1.0 - bucket.tokens) / self.rate))
        self.promises[client] = (now + self.grace, now + wait - 0.05)  # the client may round
        if self.retry_after == "date":
            return formatdate(time.time() + wait + 1, usegmt=True)
        return str(wait)
