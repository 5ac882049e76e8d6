"""Validator parsing and comparison: weak/strong ETags, oversize and control
characters, dates that are not dates."""

from __future__ import annotations

import re

import pytest

from incremental_crawler.http.validators import (
    MAX_ETAG_LENGTH,
    format_http_date,
    parse_etag,
    parse_http_date,
    parse_last_modified,
    weak_match,
)

RFC_EXAMPLE = 784111777.0  # Sun, 06 Nov 1994 08:49:37 GMT (RFC 9110 §5.6.7)
IMF_FIXDATE = "Sun, 06 Nov 1994 08:49:37 GMT"
RFC850 = "Sunday, 06-Nov-94 08:49:37 GMT"
ASCTIME = "Sun Nov  6 08:49:37 1994"
IMF_FIXDATE_RE = re.compile(
    r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{2} "
    r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} "
    r"\d{2}:\d{2}:\d{2} GMT$"
)

# -- ETag: well formed ---------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'"abc"', '"abc"'),
        (b'W/"abc"', 'W/"abc"'),
        (b'""', '""'),
        (b'W/""', 'W/""'),
        (b'"5f3c-1a2b3c4d"', '"5f3c-1a2b3c4d"'),
        (b'  "abc"\t', '"abc"'),  # optional whitespace around a field value
        (b'"caf\xe9"', '"caf\xe9"'),  # obs-text is allowed
        # unquoted, as many servers send them: kept as received
        (b"abc", "abc"),
        (b"W/abc", "W/abc"),
        (b"5f3c-1a2b3c4d", "5f3c-1a2b3c4d"),
        (b"  abc\t", "abc"),
        (b"'abc'", "'abc'"),
        (b"a b", "a b"),
        (b"W/", "W/"),
    ],
)
def test_parse_etag_valid(raw: bytes, expected: str) -> None:
    assert parse_etag(raw) == expected


def test_parse_etag_at_the_size_limit() -> None:
    raw = b'"' + b"a" * (MAX_ETAG_LENGTH - 2) + b'"'
    assert len(raw) == MAX_ETAG_LENGTH == 8192
    assert parse_etag(raw) == raw.decode()
    assert parse_etag(b"a" * MAX_ETAG_LENGTH) == "a" * MAX_ETAG_LENGTH


# -- ETag: bad input 5 (controls, badly quoted, lists, over 8 KiB) ---------------


@pytest.mark.parametrize(
    "raw",
    [
        # CR, LF, NUL anywhere (header injection attempts included)
        b'"abc"\r\nSet-Cookie: session=evil',
        b'"abc"\r\n',
        b'"abc"\n',
        b'"abc"\r',
        b'"ab\rc"',
        b'"ab\nc"',
        b'"ab\x00c"',
        b'\x00"abc"',
        b'W/"abc"\x00',
        # the same in unquoted tags, and every other C0 control and DEL
        b"abc\r\nSet-Cookie: session=evil",
        b"ab\x00c",
        b"ab\x01c",
        b"ab\x1fc",
        b"a\tb",
        b"a\x7fb",
        # badly quoted
        b'"abc',
        b'abc"',
        b'"a"b"',
        b'"a b"',
        b'"a\tb"',
        b'"a\x7fb"',
        b'w/"abc"',  # the weak prefix is case-sensitive
        b'W/ "abc"',
        b'"abc", "def"',
        # unquoted lists and the wildcard: If-None-Match would read them as
        # other tags or as "any representation"
        b"abc, def",
        b"abc,*",
        b"*",
        b"W/*",
        # over 8 KiB
        b'"' + b"a" * (MAX_ETAG_LENGTH - 1) + b'"',
        b'W/"' + b"a" * (MAX_ETAG_LENGTH - 3) + b'"',
        b'"' + b"a" * (64 * 1024) + b'"',
        b"a" * (MAX_ETAG_LENGTH + 1),
        # nothing
        b"",
        b"   ",
        None,
    ],
)
def test_parse_etag_rejects(raw: bytes | None) -> None:
    assert parse_etag(raw) is None


# -- ETag comparison: bad input 1 ----------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # RFC 9110 §8.8.3.2, the table of weak/strong comparisons
        ('W/"1"', 'W/"1"', True),
        ('W/"1"', 'W/"2"', False),
        ('W/"1"', '"1"', True),
        ('"1"', 'W/"1"', True),
        ('"1"', '"1"', True),
        ('"1"', '"2"', False),
        ('W/"1"', '"2"', False),
        # unquoted tags: strings compared once W/ is stripped
        ("foo", "foo", True),
        ("W/foo", "foo", True),
        ("W/foo", "W/foo", True),
        ("foo", "bar", False),
        ("foo", '"foo"', False),
        # nothing stored or nothing received: never a match
        (None, '"1"', False),
        ('"1"', None, False),
        (None, None, False),
        ("", "", False),
    ],
)
def test_weak_match(a: str | None, b: str | None, expected: bool) -> None:
    assert weak_match(a, b) is expected
    assert weak_match(b, a) is expected


def test_stored_weak_tag_matches_new_strong_tag() -> None:
    # Stored W/"x", the server now sends "x": still a match (weak comparison).
    stored = parse_etag(b'W/"x"')
    received = parse_etag(b'"x"')
    assert weak_match(received, stored)


# -- HTTP-dates ------------------------------------------------------------------


@pytest.mark.parametrize("value", [IMF_FIXDATE, RFC850, ASCTIME])
def test_three_date_forms_parse_to_the_same_timestamp(value: str) -> None:
    assert parse_http_date(value) == RFC_EXAMPLE
    assert parse_http_date(value.encode("ascii")) == RFC_EXAMPLE


def test_asctime_with_two_digit_day() -> None:
    assert parse_http_date("Thu Nov 24 08:49:37 1994") == parse_http_date(
        "Thu, 24 Nov 1994 08:49:37 GMT"
    )


def test_leap_day() -> None:
    assert parse_http_date("Thu, 29 Feb 2024 00:00:00 GMT") == 1709164800.0
    assert parse_http_date("Wed, 29 Feb 2023 00:00:00 GMT") is None


@pytest.mark.parametrize("value", [IMF_FIXDATE, RFC850, ASCTIME])
def test_last_modified_is_echoed_byte_for_byte(value: str) -> None:
    raw = value.encode("ascii")
    echoed = parse_last_modified(raw)
    assert echoed == value
    assert echoed is not None and echoed.encode("ascii") == raw


def test_last_modified_is_not_normalised() -> None:
    # The obsolete forms are sent back as received, never reformatted into
    # IMF-fixdate; only optional whitespace around the field value goes.
    assert parse_last_modified(RFC850.encode()) == RFC850 != format_http_date(RFC_EXAMPLE)
    assert parse_last_modified(ASCTIME.encode()) == ASCTIME != format_http_date(RFC_EXAMPLE)
    assert parse_last_modified(b" Sun, 06 Nov 1994 08:49:37 GMT\t") == IMF_FIXDATE


# -- Last-Modified: bad input 6 -----------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"0",
        b"-1",
        b"1",
        b"784111777",
        b"Sun, 32 Nov 1994 08:49:37 GMT",  # day 32
        b"Tue, 30 Feb 2021 08:49:37 GMT",  # Feb 30
        b"Sat, 31 Jun 2024 00:00:00 GMT",  # Jun 31
        b"Sun, 00 Nov 1994 08:49:37 GMT",  # day 0
        b"Sun, 06 Foo 1994 08:49:37 GMT",  # no such month
        b"Sun, 06 Nov 1994 24:00:00 GMT",
        b"Sun, 06 Nov 1994 08:60:37 GMT",
        b"Sun, 06 Nov 1994 08:49:61 GMT",
        b"Sun, 06 Nov 1994 08:49:37 UTC",  # must be GMT
        b"Sun, 06 Nov 1994 08:49:37 +0000",
        b"Sun, 6 Nov 1994 08:49:37 GMT",  # IMF-fixdate has a 2-digit day
        b"Sunday, 32-Nov-94 08:49:37 GMT",
        b"Sun Nov 31 08:49:37 1994",
        b"1994-11-06T08:49:37Z",
        b"garbage",
        b"Thu, 01 Jan 1970 00:00:00 GMT\r\nSet-Cookie: a=b",
        b"Sun, 06 Nov 1994 08:49:37 GMT\n",
        b"Sun, 06 Nov 1994\x00 08:49:37 GMT",
        b"Sun, 06 Nov 1994 08:49:37 GMT" + b" " * 64,  # absurdly long
        b"Sun, 06 Nov 1994 08:49:37 GMT\xff",
        b"",
        None,
    ],
)
def test_parse_last_modified_rejects(raw: bytes | None) -> None:
    assert parse_last_modified(raw) is None


@pytest.mark.parametrize(
    "value",
    ["0", "-1", "Sun, 32 Nov 1994 08:49:37 GMT", "Tue, 30 Feb 2021 08:49:37 GMT", "garbage", ""],
)
def test_parse_http_date_rejects(value: str) -> None:
    assert parse_http_date(value) is None


def test_parse_http_date_none_and_non_ascii() -> None:
    assert parse_http_date(None) is None
    assert parse_http_date(b"Sun, 06 Nov 1994 08:49:37 GMT" + b"\xe9") is None


# -- generating dates ------------------------------------------------------------


@pytest.mark.parametrize(
    ("timestamp", "expected"),
    [
        (RFC_EXAMPLE, IMF_FIXDATE),
        (784111777, IMF_FIXDATE),
        (0, "Thu, 01 Jan 1970 00:00:00 GMT"),
        (1709164800, "Thu, 29 Feb 2024 00:00:00 GMT"),
        (1_700_000_000, "Tue, 14 Nov 2023 22:13:20 GMT"),
    ],
)
def test_format_http_date_is_imf_fixdate(timestamp: float, expected: str) -> None:
    formatted = format_http_date(timestamp)
    assert formatted == expected
    assert IMF_FIXDATE_RE.match(formatted)
    assert parse_http_date(formatted) == float(int(timestamp))
    assert parse_last_modified(formatted.encode("ascii")) == formatted
