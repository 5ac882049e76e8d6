"""Sitemap ``<lastmod>`` and feed dates: parsing, checking, zones.

Sitemaps use W3C Datetime (https://www.w3.org/TR/NOTE-datetime), the ISO
8601 profile sitemaps.org and Google document (``YYYY-MM-DD``, or a time
with its zone); feeds use RFC 822/2822 (RSS ``pubDate``) and RFC 3339 (Atom,
``dc:date``). Real lists bend both, and the forms other parsers' test suites
accept are understood too (``tests/unit/test_dates.py`` holds the table):

- ISO 8601, extended format: a space instead of ``T`` (MSSQL), fractions of
  a second (dropped), ``+hhmm``/``+hh`` zones, lowercase ``t``/``z``, a
  three-digit month with a leading zero (``2003-012-31``, old Blogger
  feeds); no zone means UTC, a date alone midnight UTC.
- RFC 822/2822 and their relatives (feeds only): day name optional (and a
  comma without a space after it), two-digit years (00-49 are 20xx, 50-99
  19xx, RFC 2822 section 4.3), month and day swapped, full month names, an
  extra comma after the month, no seconds, no time (midnight UTC), asctime
  (``Sun Jan  4 16:29:06 2004``, a zone before the year too), Perforce's
  ``2006/09/15 08:19:53 EDT``; zones as ``+hhmm``, ``+hh:mm``,
  ``GMT+hh:mm``, ``Etc/GMT``, IANA's ``Etc/GMT+5`` (UTC-5: IANA's sign is
  POSIX's) or a name (RFC 822's, its military letters read as UTC as RFC
  2822 says, and the US and central European ones below); no zone means
  UTC.

Anything else is refused, never guessed: an impossible date or time (31
June, 25 o'clock), a zone out of range (``-99:99``) or not known
(``+zz:00``, ``XYZ``: a wrong guess would shift the date by hours), two-digit
ISO years and ordinal dates, non-ASCII digits, localized month names. A
refused date counts as missing: a page with a missing lastmod is simply
requested (conditionally), never skipped.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

__all__ = ["parse_feed_date", "parse_w3c_datetime"]

# YYYY[-MM[-DD[Thh:mm[:ss[.s]][TZD]]]]; re.ASCII: \d is 0-9, not every
# script's digits (int() would read those as if they were).
_ISO = re.compile(
    r"(?P<y>\d{4})(?:-(?P<m>0?\d\d)(?:-(?P<d>\d\d)"
    r"(?:[Tt\x20](?P<hh>\d\d):(?P<mm>\d\d)(?::(?P<ss>\d\d)(?:[.,]\d+)?)?"
    r"\x20?(?P<tz>[Zz]|[+-]\d\d(?::?\d\d)?)?)?)?)?",
    re.ASCII,
)
_NUMERIC_ZONE = re.compile(r"[+-]\d\d:?\d\d", re.ASCII)
_TIME = re.compile(r"(?P<hh>\d{1,2}):(?P<mm>\d\d)(?::(?P<ss>\d\d))?", re.ASCII)
_SLASHED_DATE = re.compile(r"(?P<y>\d{4})/(?P<m>\d\d)/(?P<d>\d\d)", re.ASCII)
_NUMBER = re.compile(r"\d{1,4}", re.ASCII)

_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december")
_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

# Zone names, in hours east of UTC. RFC 822 section 5.1 (its military
# letters read as UTC: RFC 2822 section 4.3 says to take them for -0000,
# "no information about the local zone", because RFC 822 gave them the
# wrong signs and senders used both; feedparser keeps RFC 822's signs. J is
# not a zone), the bare US names (AT, ET, CT, MT, PT) feedparser accepts,
# UTC, and central Europe (MET/MEST as feedparser, CET/CEST their other
# names). Names worn by several zones (BST, IST) are refused.
_ZONES: dict[str, int] = {
    "ut": 0, "utc": 0, "gmt": 0, "z": 0,
    "est": -5, "edt": -4, "cst": -6, "cdt": -5, "mst": -7, "mdt": -6, "pst": -8, "pdt": -7,
    "ast": -4, "adt": -3, "at": -4, "et": -5, "ct": -6, "mt": -7, "pt": -8,
    "met": 1, "mest": 2, "cet": 1, "cest": 2,
    **dict.fromkeys("abcdefghiklmnopqrstuvwxy", 0),
}

# IANA's Etc/GMT+N zones (N whole hours, up to 14) are POSIX-style: N hours
# *west* of UTC (Etc/GMT+5 is UTC-5).
_IANA_ETC_GMT = re.compile(r"gmt([+-])(\d{1,2})")
#: IANA's other Etc/ names of UTC.
_IANA_ETC_UTC = frozenset({"gmt", "gmt0", "greenwich", "uct", "ut", "utc", "universal", "zulu"})


def _month(token: str) -> int | None:
    """1-12 for an English month name or its three-letter (or longer) abbreviation."""
    token = token.lower().rstrip(".")
    if len(token) < 3:
        return None
    for number, name in enumerate(_MONTHS, start=1):
        if name.startswith(token):
            return number
    return None


def _numeric_offset(sign: str, hours: str, minutes: str) -> int | None:
    """Seconds east of UTC for ``±hh:mm``, or ``None`` out of range."""
    h, m = int(hours), int(minutes)
    if h > 23 or m > 59:
        return None
    return (h * 3600 + m * 60) * (-1 if sign == "-" else 1)


def _zone(token: str) -> int | None:
    """Seconds east of UTC for an RFC 822-style zone, or ``None`` if not one."""
    token = token.lower()
    if token.startswith("etc/"):
        # Only IANA's own names: Etc/GMT, Etc/UTC, Etc/GMT+5 (UTC-5). Any
        # other signed form (Etc/GMT+05:00) is no IANA name, and its sign
        # could mean either: refused.
        token = token[4:]
        if (iana := _IANA_ETC_GMT.fullmatch(token)) is not None:
            west = int(iana[2])
            return None if west > 14 else west * 3600 * (1 if iana[1] == "-" else -1)
        return 0 if token in _IANA_ETC_UTC else None
    if token.startswith("gmt") and len(token) > 3:
        token = token[3:]  # GMT+01:00, GMT-0500
    if _NUMERIC_ZONE.fullmatch(token):
        return _numeric_offset(token[0], token[1:3], token[-2:])
    hours = _ZONES.get(token)
    return None if hours is None else hours * 3600


def _timestamp(y: int, m: int, d: int, hh: int, mm: int, ss: int, offset: int) -> float | None:
    """POSIX time of a civil date and time at *offset* seconds east of UTC, if it exists."""
    try:
        moment = datetime(y, m, d, hh, mm, 59 if ss == 60 else ss,  # a leap second
                          tzinfo=timezone(timedelta(seconds=offset)) if offset else UTC)
    except ValueError:  # 31 June, 25 o'clock, year 0
        return None
    return moment.timestamp()


def parse_w3c_datetime(value: str | None) -> float | None:
    """A POSIX timestamp for a sitemap lastmod (W3C Datetime, ISO 8601), or ``None``.

    >>> parse_w3c_datetime("2024-05-01T10:00:00+02:00") == parse_w3c_datetime("2024-05-01T08:00Z")
    True
    >>> parse_w3c_datetime("2024"), parse_w3c_datetime("2024-13-45")
    (1704067200.0, None)
    """
    if not value:
        return None
    match = _ISO.fullmatch(value.strip())
    if match is None:
        return None
    g = match.groupdict()
    offset = 0
    tz = g["tz"]
    if tz and tz not in "Zz":
        zone = _numeric_offset(tz[0], tz[1:3], tz[-2:] if len(tz) > 3 else "00")
        if zone is None:
            return None
        offset = zone
    return _timestamp(
        int(g["y"]), int(g["m"] or 1), int(g["d"] or 1),
        int(g["hh"] or 0), int(g["mm"] or 0), int(g["ss"] or 0), offset,
    )


def _year(token: str) -> int | None:
    if not _NUMBER.fullmatch(token) or len(token) not in (2, 4):
        return None
    year = int(token)
    if len(token) == 2:  # RFC 2822 section 4.3
        year += 2000 if year < 50 else 1900
    return year


def _day(token: str) -> int | None:
    return int(token) if _NUMBER.fullmatch(token) and len(token) <= 2 else None


def _clock(tokens: list[str]) -> tuple[int, int, int, int] | None:
    """``(hh, mm, ss, offset)`` from ``[]``, ``[time]`` or ``[time, zone]``."""
    if not tokens:
        return 0, 0, 0, 0
    match = _TIME.fullmatch(tokens[0])
    if match is None or len(tokens) > 2:
        return None
    offset = _zone(tokens[1]) if len(tokens) == 2 else 0
    if offset is None:
        return None
    return int(match["hh"]), int(match["mm"]), int(match["ss"] or 0), offset


def _date(tokens: list[str]) -> tuple[int, int, int, list[str]] | None:
    """``(y, m, d, rest)``: the date at the head of *tokens* (day name removed)."""
    if slashed := _SLASHED_DATE.fullmatch(tokens[0]):  # Perforce: 2006/09/15 08:19:53 EDT
        return int(slashed["y"]), int(slashed["m"]), int(slashed["d"]), tokens[1:]
    if len(tokens) < 3:
        return None
    day: int | None
    if (month := _month(tokens[0])) is not None:
        day = _day(tokens[1])
        if _TIME.fullmatch(tokens[2]):  # asctime: Jan  4 16:29:06 [zone] 2004
            year = _year(tokens[-1]) if len(tokens) in (4, 5) else None
            rest = tokens[2:-1]
        else:  # day and month swapped: Aug 30 2012 17:26:16 +0200
            year, rest = _year(tokens[2]), tokens[3:]
    elif (month := _month(tokens[1])) is not None:  # 30 Aug 2012 17:26:16 +0200
        day, year, rest = _day(tokens[0]), _year(tokens[2]), tokens[3:]
    else:
        return None
    if day is None or year is None:
        return None
    return year, month, day, rest


def _parse_rfc822(value: str) -> float | None:
    """RFC 822/2822 dates and their relatives (see the module docstring)."""
    tokens = value.replace(",", " ").split()
    name = tokens[0].lower().rstrip(".") if tokens else ""
    if len(name) >= 3 and name.isalpha() and any(day.startswith(name) for day in _DAYS):
        tokens = tokens[1:]
    if not tokens or (date := _date(tokens)) is None:
        return None
    y, m, d, rest = date
    clock = _clock(rest)
    if clock is None:
        return None
    return _timestamp(y, m, d, *clock)


def parse_feed_date(value: str | None) -> float | None:
    """A POSIX timestamp for a feed date (RFC 822/2822, RFC 3339, W3C Datetime), or ``None``.

    >>> parse_feed_date("Sat, 07 Sep 2002 09:42:31 GMT") == parse_feed_date("2002-09-07T09:42:31Z")
    True
    >>> parse_feed_date("Sat, 07 Sep 2002 05:42:31 EDT") == parse_feed_date("2002-09-07T09:42:31Z")
    True
    """
    if not value:
        return None
    value = value.strip()
    if (ts := parse_w3c_datetime(value)) is not None:
        return ts
    if not value.isascii():
        return None
    return _parse_rfc822(value)
