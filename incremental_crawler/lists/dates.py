"""Sitemap ``<lastmod>`` and feed dates: parsing, checking, clamping.

Sitemaps use W3C Datetime (https://www.w3.org/TR/NOTE-datetime), which is
ISO 8601 at six levels of precision; RSS 2.0 uses RFC 822 dates and Atom
RFC 3339. Anything that is not a real date counts as missing: a page with a
missing lastmod is simply requested (conditionally), never skipped.
"""

from __future__ import annotations

import calendar
import re
from email.utils import parsedate_tz

__all__ = ["parse_feed_date", "parse_w3c_datetime"]

# YYYY | YYYY-MM | YYYY-MM-DD | YYYY-MM-DDThh:mmTZD | ...:ssTZD | ...:ss.sTZD
_W3C = re.compile(
    r"^(?P<y>\d{4})(?:-(?P<m>\d{2})(?:-(?P<d>\d{2})"
    r"(?:T(?P<hh>\d{2}):(?P<mm>\d{2})(?::(?P<ss>\d{2})(?:\.\d+)?)?"
    r"(?P<tz>Z|[+-]\d{2}:\d{2}))?)?)?$"
)


def _timestamp(y: int, m: int, d: int, hh: int, mm: int, ss: int, offset: int) -> float | None:
    if not (1 <= m <= 12 and 0 <= hh <= 23 and 0 <= mm <= 59 and 0 <= ss <= 60):
        return None
    if not 1 <= d <= calendar.monthrange(y, m)[1]:
        return None
    return float(calendar.timegm((y, m, d, hh, mm, min(ss, 59), 0, 0, 0)) - offset)


def parse_w3c_datetime(value: str | None) -> float | None:
    """A POSIX timestamp for a W3C Datetime, or ``None`` if it is not one.

    >>> parse_w3c_datetime("2024-05-01T10:00:00+02:00") == parse_w3c_datetime("2024-05-01T08:00Z")
    True
    >>> parse_w3c_datetime("2024"), parse_w3c_datetime("2024-13-45")
    (1704067200.0, None)
    """
    if not value:
        return None
    match = _W3C.match(value.strip())
    if match is None:
        return None
    g = match.groupdict()
    offset = 0
    tz = g["tz"]
    if tz and tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        hours, minutes = int(tz[1:3]), int(tz[4:6])
        if hours > 23 or minutes > 59:
            return None
        offset = sign * (hours * 3600 + minutes * 60)
    return _timestamp(
        int(g["y"]), int(g["m"] or 1), int(g["d"] or 1),
        int(g["hh"] or 0), int(g["mm"] or 0), int(g["ss"] or 0), offset,
    )


def parse_feed_date(value: str | None) -> float | None:
    """RSS 2.0 ``pubDate`` (RFC 822, 2- or 4-digit year) or Atom ``updated`` (RFC 3339).

    >>> parse_feed_date("Sat, 07 Sep 2002 09:42:31 GMT") == parse_feed_date("2002-09-07T09:42:31Z")
    True
    """
    if not value:
        return None
    value = value.strip()
    if (ts := parse_w3c_datetime(value)) is not None:
        return ts
    parsed = parsedate_tz(value)
    if parsed is None:
        return None
    y, m, d, hh, mm, ss = parsed[:6]
    if y < 100:  # RFC 822 two-digit years
        y += 2000 if y < 70 else 1900
    return _timestamp(y, m, d, hh, mm, ss, parsed[9] or 0)
