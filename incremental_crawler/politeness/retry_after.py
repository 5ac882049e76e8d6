"""Retry-After values (RFC 9110 §10.2.3): delay-seconds or an HTTP-date."""

from __future__ import annotations

import re

from incremental_crawler import clock
from incremental_crawler.http.validators import parse_http_date

__all__ = ["parse_retry_after"]

_DELAY_SECONDS = re.compile(r"^\s*(\d{1,10})\s*$")


def parse_retry_after(value: bytes | str | None, now: float | None = None) -> float | None:
    """Seconds to wait, or ``None`` when *value* is neither form.

    An HTTP-date is measured from *now*: pass the server's own ``Date`` so
    that a clock difference between it and us does not shorten the wait.
    A date at or before *now* is valid and means "retry now": ``0.0``, as
    ``"0"`` does (RFC 9110 §10.2.3 bounds neither form below).

    >>> parse_retry_after(b"120"), parse_retry_after("abc"), parse_retry_after("-5")
    (120.0, None, None)
    >>> parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now=784111770)
    7.0
    >>> parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now=784111780)
    0.0
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
    return max(0.0, when - (clock.now() if now is None else now))
