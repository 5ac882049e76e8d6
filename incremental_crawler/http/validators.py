"""Parsing, checking and comparing HTTP validators (RFC 9110 §8.8).

Everything that comes from a server is untrusted: a validator is stored and
sent back only if it is safe to (an ETag without control characters, within
its size, unquoted ones included; a Last-Modified that is an HTTP-date), so a
hostile or broken server cannot make us store a header-injection payload or
an unparseable date.
"""

from __future__ import annotations

import calendar
import re
import time
from email.utils import formatdate

__all__ = [
    "MAX_ETAG_LENGTH",
    "format_http_date",
    "parse_etag",
    "parse_http_date",
    "parse_last_modified",
    "weak_match",
]

#: ETags longer than this are not stored (nor sent back): no server needs
#: them, and a hostile one would make every request carry them.
MAX_ETAG_LENGTH = 8192

# RFC 9110 §8.8.3: entity-tag = [ weak ] opaque-tag; opaque-tag = DQUOTE
# *etagc DQUOTE; etagc = %x21 / %x23-7E / obs-text. No spaces, no controls,
# no inner quotes.
_ETAG_RE = re.compile(rb'^(W/)?"[\x21\x23-\x7e\x80-\xff]*"$')
# C0 controls (CR, LF, NUL, HTAB inside a value...) and DEL: never part of
# an ETag, quoted or not.
_CONTROLS_RE = re.compile(rb"[\x00-\x1f\x7f]")

_MONTHS = {
    m: i
    for i, m in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun",
         "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
# RFC 9110 §5.6.7: IMF-fixdate, the obsolete RFC 850 form and asctime.
_IMF_FIXDATE = re.compile(
    r"^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\d{2}) ([A-Za-z]{3}) (\d{4}) "
    r"(\d{2}):(\d{2}):(\d{2}) GMT$"
)
_RFC850 = re.compile(
    r"^(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), "
    r"(\d{2})-([A-Za-z]{3})-(\d{2}) (\d{2}):(\d{2}):(\d{2}) GMT$"
)
_ASCTIME = re.compile(
    r"^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ([A-Za-z]{3}) ([ \d]\d) "
    r"(\d{2}):(\d{2}):(\d{2}) (\d{4})$"
)


def _has_controls(value: bytes) -> bool:
    # RFC 9110 §5.5: CR, LF and NUL are never valid in a field value; a
    # value carrying them is an injection attempt or garbage.
    return b"\r" in value or b"\n" in value or b"\0" in value


def parse_etag(raw: bytes | None) -> str | None:
    """Return the ETag to store and send back, or ``None`` to refuse it.

    A well-formed entity-tag is kept. So is an unquoted one (``foo``,
    ``W/foo``), which many servers send: it is kept and sent back as
    received, as browsers and caches do, since refusing it would mean never
    revalidating the page. It is returned one character per byte
    (Latin-1): obs-text (0x80-0xFF) included, it encodes back to the bytes
    received. Refused: control characters (C0, DEL), values
    over :data:`MAX_ETAG_LENGTH`, a double quote outside a well-formed
    entity-tag (a tag broken in transit, or a list), and an unquoted value
    holding a comma or that is ``*``: sent back in ``If-None-Match`` it
    would be a list, or the wildcard that every representation matches.

    >>> parse_etag(b'"abc"'), parse_etag(b'W/"x"'), parse_etag(b"abc")
    ('"abc"', 'W/"x"', 'abc')
    >>> parse_etag(b'"abc'), parse_etag(b"a, *"), parse_etag(b"a\\x7fb")
    (None, None, None)
    """
    if not raw:
        return None
    raw = raw.strip(b" \t")
    if not raw or len(raw) > MAX_ETAG_LENGTH or _CONTROLS_RE.search(raw):
        return None
    if _ETAG_RE.match(raw):
        return raw.decode("latin-1")
    if b'"' in raw or b"," in raw or _opaque_bytes(raw) == b"*":
        return None
    return raw.decode("latin-1")


def _opaque_bytes(tag: bytes) -> bytes:
    return tag[2:] if tag.startswith(b"W/") else tag


def _opaque(tag: str) -> str:
    return tag[2:] if tag.startswith("W/") else tag


def weak_match(a: str | None, b: str | None) -> bool:
    """Weak comparison of two entity-tags (RFC 9110 §8.8.3.2).

    Unquoted tags compare the same way: as strings once ``W/`` is stripped,
    so ``foo`` matches ``W/foo`` and not ``"foo"``.

    >>> weak_match('W/"x"', '"x"'), weak_match('"x"', '"y"'), weak_match("foo", "W/foo")
    (True, False, True)
    """
    if not a or not b:
        return False
    return _opaque(a) == _opaque(b)


def _checked_timestamp(
    year: int, month: int, day: int, hh: int, mm: int, ss: int
) -> float | None:
    if not (1 <= month <= 12 and 0 <= hh <= 23 and 0 <= mm <= 59 and 0 <= ss <= 60):
        return None
    if not 1 <= day <= calendar.monthrange(year, month)[1]:
        return None
    return float(calendar.timegm((year, month, day, hh, mm, min(ss, 59), 0, 0, 0)))


def parse_http_date(value: str | bytes | None) -> float | None:
    """Parse an HTTP-date in any of the three forms of RFC 9110 §5.6.7.

    Returns a POSIX timestamp, or ``None`` for anything that is not a real
    date (``0``, ``-1``, day 32, ...).

    >>> parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT")
    784111777.0
    >>> parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT")
    784111777.0
    >>> parse_http_date("Sun Nov  6 08:49:37 1994")
    784111777.0
    >>> parse_http_date("Sun, 32 Nov 1994 08:49:37 GMT") is None
    True
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    value = value.strip()
    if m := _IMF_FIXDATE.match(value):
        day, mon, year, hh, mm, ss = m.groups()
    elif m := _RFC850.match(value):
        day, mon, yy, hh, mm, ss = m.groups()
        # RFC 9110 §5.6.7: a two-digit year more than 50 years in the future
        # is the most recent past year with the same last two digits.
        this_year = time.gmtime().tm_year
        year = str(this_year - this_year % 100 + int(yy))
        if int(year) > this_year + 50:
            year = str(int(year) - 100)
    elif m := _ASCTIME.match(value):
        mon, day, hh, mm, ss, year = m.groups()
    else:
        return None
    month = _MONTHS.get(mon.lower())
    if month is None:
        return None
    return _checked_timestamp(int(year), month, int(day), int(hh), int(mm), int(ss))


def parse_last_modified(raw: bytes | None) -> str | None:
    """Return the Last-Modified value to echo back, or ``None``.

    The value is echoed byte for byte as received (RFC 9110 §13.1.3), but
    only if it is a valid HTTP-date: an invalid date is never sent back
    (a date that is not a date is no validator).
    """
    if not raw or _has_controls(raw) or len(raw) > 64:
        return None
    raw = raw.strip(b" \t")
    if parse_http_date(raw) is None:
        return None
    return raw.decode("ascii")


def format_http_date(timestamp: float) -> str:
    """Format *timestamp* as IMF-fixdate, the only form we generate.

    >>> format_http_date(784111777)
    'Sun, 06 Nov 1994 08:49:37 GMT'
    """
    return formatdate(timestamp, usegmt=True)
