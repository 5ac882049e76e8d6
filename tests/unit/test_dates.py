"""Sitemap and feed dates: one table, drawn from other parsers' test suites.

Each row is a date as a list gives it, the POSIX time we read from it (or
``REFUSED``: counted as no lastmod), which parser reads it (a sitemap
``<lastmod>``, a feed date, or both), and where it comes from: the suite
and its test case (feedparser ``tests/test_date_parsers.py`` and its feed
fixtures, ultimate-sitemap-parser ``tests/test_helpers.py`` and
``tests/tree``, Scrapy ``tests/test_utils_sitemap.py`` and
``tests/test_spider_sitemap.py``), the W3C Datetime note and sitemaps.org's
examples, or ``ours`` for a rule of our own. The inputs are the suites';
the rows are written here.

Where we read a date otherwise than a suite, the row says ``deviation``
and why (docs/guide.md lists them): feedparser's localized forms (Greek,
Hungarian, Korean) and ISO 8601's two-digit-year and ordinal forms are
refused; an unknown zone name is refused, not read as UTC; a two-digit RFC
822 year follows RFC 2822 (50-99 are 19xx), not feedparser's 90 cutoff.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from incremental_crawler.lists.dates import parse_feed_date, parse_w3c_datetime

if TYPE_CHECKING:
    from collections.abc import Callable

REFUSED = None
FEED, SITEMAP, BOTH = "feed", "sitemap", "both"


def utc(y: int, m: int, d: int, hh: int = 0, mm: int = 0, ss: int = 0) -> float:
    """The POSIX time of a UTC date and time (the suites' expected tuples)."""
    return float(calendar.timegm((y, m, d, hh, mm, ss, 0, 0, 0)))


@dataclass(frozen=True)
class Case:
    source: str
    kind: str
    value: str | None
    expected: float | None
    deviation: str = ""


FP = "feedparser test_date_parsers.py"
FPW = "feedparser tests/wellformed"
USP = "ultimate-sitemap-parser"
SCRAPY = "scrapy"

CASES = [
    # -- feedparser: tests/test_date_parsers.py ---------------------------------------
    Case(f"{FP} test_none", FEED, None, REFUSED),
    Case(f"{FP} test_year_10000_date", FEED, "Sun, 31 Dec 9999 23:59:59 -9999", REFUSED),
    # _parse_date_greek
    Case(f"{FP} greek: empty string", FEED, "", REFUSED),
    Case(f"{FP} greek", FEED, "\u039a\u03c5\u03c1, 11 \u0399\u03bf\u03cd\u03bb 2004 12:00:00 EST",
         REFUSED, deviation="localized month names: feedparser reads 2004-07-11 17:00 UTC"),
    # _parse_date_hungarian
    Case(f"{FP} hungarian: empty string", FEED, "", REFUSED),
    Case(f"{FP} hungarian", FEED, "2004-j\u00falius-13T9:15-05:00", REFUSED,
         deviation="localized month names: feedparser reads 2004-07-13 14:15 UTC"),
    # _parse_date_iso8601
    Case(f"{FP} iso8601: empty string", BOTH, "", REFUSED),
    Case(f"{FP} iso8601: 2-digit year/month only variant", BOTH, "-0312", REFUSED,
         deviation="two-digit ISO year (ISO 8601:1988 only): feedparser reads 2003-12-01"),
    Case(f"{FP} iso8601: 2-digit year/month/day only, no hyphens", BOTH, "031231", REFUSED,
         deviation="two-digit ISO year: feedparser reads 2003-12-31"),
    Case(f"{FP} iso8601: 2-digit year/month/day only", BOTH, "03-12-31", REFUSED,
         deviation="two-digit ISO year: feedparser reads 2003-12-31"),
    Case(f"{FP} iso8601: 2-digit year/month only", BOTH, "-03-12", REFUSED,
         deviation="two-digit ISO year: feedparser reads 2003-12-01"),
    Case(f"{FP} iso8601: 2-digit year/ordinal, no hyphens", BOTH, "03335", REFUSED,
         deviation="two-digit ISO year, ordinal day: feedparser reads 2003-12-01"),
    Case(f"{FP} iso8601: fractional seconds", BOTH, "2003-12-31T10:14:55.1234Z",
         utc(2003, 12, 31, 10, 14, 55)),
    Case(f"{FP} iso8601: Google's extra zero in the month", BOTH, "2003-012-31T10:14:55+00:00",
         utc(2003, 12, 31, 10, 14, 55)),
    # _parse_date_nate, _parse_date_onblog (Korean blog hosts)
    Case(f"{FP} nate: empty string", FEED, "", REFUSED),
    Case(f"{FP} nate", FEED, "2004-05-25 \uc624\ud6c4 11:23:17", REFUSED,
         deviation="localized (Korean) form: feedparser reads 2004-05-25 14:23:17 UTC"),
    Case(f"{FP} onblog: empty string", FEED, "", REFUSED),
    Case(f"{FP} onblog", FEED, "2004\ub144 05\uc6d4 28\uc77c  01:31:15", REFUSED,
         deviation="localized (Korean) form: feedparser reads 2004-05-27 16:31:15 UTC"),
    # _parse_date_perforce
    Case(f"{FP} perforce: empty string", FEED, "", REFUSED),
    Case(f"{FP} perforce", FEED, "Fri, 2006/09/15 08:19:53 EDT", utc(2006, 9, 15, 12, 19, 53)),
    # _parse_date_rfc822
    Case(f"{FP} rfc822: empty string", FEED, "", REFUSED),
    Case(f"{FP} rfc822: MET", FEED, "Thu, 30 Apr 2015 08:57:00 MET", utc(2015, 4, 30, 7, 57)),
    Case(f"{FP} rfc822: MEST", FEED, "Thu, 30 Apr 2015 08:57:00 MEST", utc(2015, 4, 30, 6, 57)),
    Case(f"{FP} rfc822: ancient date", FEED, "Thu, 01 Jan 0100 00:00:01 +0100",
         utc(99, 12, 31, 23, 0, 1)),
    Case(f"{FP} rfc822: 2-digit year", FEED, "Thu, 01 Jan 04 19:48:21 GMT",
         utc(2004, 1, 1, 19, 48, 21)),
    Case(f"{FP} rfc822: 4-digit year", FEED, "Thu, 01 Jan 2004 19:48:21 GMT",
         utc(2004, 1, 1, 19, 48, 21)),
    Case(f"{FP} rfc822: 1-digit day", FEED, "Thu,  5 Apr 2012 10:00:00 GMT",
         utc(2012, 4, 5, 10)),
    Case(f"{FP} rfc822: etc/gmt timezone", FEED, "Wed, 19 Aug 2009 18:28:00 Etc/GMT",
         utc(2009, 8, 19, 18, 28)),
    Case(f"{FP} rfc822: gmt+hh:mm timezone", FEED, "Wed, 19 Feb 2012 22:40:00 GMT-01:01",
         utc(2012, 2, 19, 23, 41)),
    Case(f"{FP} rfc822: +hh:mm timezone", FEED, "Wed, 19 Feb 2012 22:40:00 -01:01",
         utc(2012, 2, 19, 23, 41)),
    Case(f"{FP} rfc822: extraneous comma", FEED, "Mon, 13 Feb, 2012 06:28:00 UTC",
         utc(2012, 2, 13, 6, 28)),
    Case(f"{FP} rfc822: no seconds", FEED, "Thu, 01 Jan 2004 00:00 GMT", utc(2004, 1, 1)),
    Case(f"{FP} rfc822: no time", FEED, "Thu, 01 Jan 2004", utc(2004, 1, 1)),
    Case(f"{FP} rfc822: long month name, AT", FEED, "Mon, 26 January 2004 16:31:00 AT",
         utc(2004, 1, 26, 20, 31)),
    Case(f"{FP} rfc822: long month name, ET", FEED, "Mon, 26 January 2004 16:31:00 ET",
         utc(2004, 1, 26, 21, 31)),
    Case(f"{FP} rfc822: long month name, CT", FEED, "Mon, 26 January 2004 16:31:00 CT",
         utc(2004, 1, 26, 22, 31)),
    Case(f"{FP} rfc822: long month name, MT", FEED, "Mon, 26 January 2004 16:31:00 MT",
         utc(2004, 1, 26, 23, 31)),
    Case(f"{FP} rfc822: long month name, PT", FEED, "Mon, 26 January 2004 16:31:00 PT",
         utc(2004, 1, 27, 0, 31)),
    Case(f"{FP} rfc822: swapped month and day", FEED, "Thu Aug 30 2012 17:26:16 +0200",
         utc(2012, 8, 30, 15, 26, 16)),
    Case(f"{FP} rfc822: comma without spaces", FEED, "Fri,24 Nov 2023 18:28:36 -0000",
         utc(2023, 11, 24, 18, 28, 36)),
    Case(f"{FP} rfc822: invalid time", FEED, "Sun, 16 Dec 2012 1:2:3:4 GMT", REFUSED),
    Case(f"{FP} rfc822: invalid month", FEED, "Sun, 16 zzz 2012 11:47:32 GMT", REFUSED),
    Case(f"{FP} rfc822: invalid day (swapped day/month)", FEED, "Sun, Dec x 2012 11:47:32 GMT",
         REFUSED),
    Case(f"{FP} rfc822: invalid year", FEED, "Sun, 16 Dec zz 11:47:32 GMT", REFUSED),
    Case(f"{FP} rfc822: invalid timezone hour", FEED, "Sun, 16 Dec 2012 11:47:32 +zz:00",
         REFUSED),
    Case(f"{FP} rfc822: invalid timezone minute", FEED, "Sun, 16 Dec 2012 11:47:32 +00:zz",
         REFUSED),
    Case(f"{FP} rfc822: out-of-range day", FEED, "Sun, 99 Jun 2009 12:00:00 GMT", REFUSED),
    # _parse_date_asctime
    Case(f"{FP} asctime", FEED, "Sun Jan  4 16:29:06 2004", utc(2004, 1, 4, 16, 29, 6)),
    Case(f"{FP} asctime with a zone", FEED, "Sun Jul 15 01:16:00 +0000 2012",
         utc(2012, 7, 15, 1, 16)),
    # _parse_date_w3dtf
    Case(f"{FP} w3dtf: empty string", BOTH, "", REFUSED),
    Case(f"{FP} w3dtf: UTC", BOTH, "2003-12-31T10:14:55Z", utc(2003, 12, 31, 10, 14, 55)),
    Case(f"{FP} w3dtf: San Francisco timezone", BOTH, "2003-12-31T10:14:55-08:00",
         utc(2003, 12, 31, 18, 14, 55)),
    Case(f"{FP} w3dtf: Tokyo timezone", BOTH, "2003-12-31T18:14:55+08:00",
         utc(2003, 12, 31, 10, 14, 55)),
    Case(f"{FP} w3dtf: fractional seconds", BOTH, "2007-04-23T23:25:47.538+10:00",
         utc(2007, 4, 23, 13, 25, 47)),
    Case(f"{FP} w3dtf: year/month/day only", BOTH, "2003-12-31", utc(2003, 12, 31)),
    Case(f"{FP} w3dtf: year/month only", BOTH, "2003-12", utc(2003, 12, 1)),
    Case(f"{FP} w3dtf: year only", BOTH, "2003", utc(2003, 1, 1)),
    Case(f"{FP} w3dtf: feb 28 in leap year", BOTH, "2004-02-28T18:14:55-08:00",
         utc(2004, 2, 29, 2, 14, 55)),
    Case(f"{FP} w3dtf: feb 28 in non-leap year", BOTH, "2003-02-28T18:14:55-08:00",
         utc(2003, 3, 1, 2, 14, 55)),
    Case(f"{FP} w3dtf: feb 28 in leap year on century divisible by 400", BOTH,
         "2000-02-28T18:14:55-08:00", utc(2000, 2, 29, 2, 14, 55)),
    Case(f"{FP} w3dtf: date is out-of-range", BOTH, "9999-12-31T23:59:59-99:99", REFUSED),
    Case(f"{FP} w3dtf: invalid (25 hours)", BOTH, "2003-12-31T25:14:55Z", REFUSED),
    Case(f"{FP} w3dtf: invalid (61 minutes)", BOTH, "2003-12-31T10:61:55Z", REFUSED),
    Case(f"{FP} w3dtf: invalid (61 seconds)", BOTH, "2003-12-31T10:14:61Z", REFUSED),
    Case(f"{FP} w3dtf: year is too long", BOTH, "22013", REFUSED),
    Case(f"{FP} w3dtf: year is too short", BOTH, "013", REFUSED),
    Case(f"{FP} w3dtf: date has too many parts", BOTH, "2013-01-27-01", REFUSED),
    Case(f"{FP} w3dtf: too many 't's", BOTH, "2013-01-28T11:30:00-06:00Textra", REFUSED),
    Case(f"{FP} w3dtf: non-integer date", BOTH, "2013-xx-27", REFUSED),
    Case(f"{FP} w3dtf: non-integer time", BOTH, "2013-01-28T09:xx:00Z", REFUSED),
    Case(f"{FP} w3dtf: non-integer timezone", BOTH, "2013-01-28T09:00:00+00:xx", REFUSED),
    Case(f"{FP} w3dtf: MSSQL-style, with timezone", BOTH, "2004-07-08 23:56:58 -00:20",
         utc(2004, 7, 9, 0, 16, 58)),
    Case(f"{FP} w3dtf: MSSQL-style, without timezone", BOTH, "2004-07-08 23:56:58",
         utc(2004, 7, 8, 23, 56, 58)),
    Case(f"{FP} w3dtf: MSSQL-style, with fractional second", BOTH, "2004-07-08 23:56:58.0",
         utc(2004, 7, 8, 23, 56, 58)),
    # -- feedparser: feed fixtures (the element names are the feed spider's) -------
    Case(f"{FPW}/rss/item_dc_date_parsed.xml", FEED, "2003-12-31T10:14:55Z",
         utc(2003, 12, 31, 10, 14, 55)),
    Case(f"{FPW}/atom/entry_issued.xml (Atom 0.3, an RFC 822 date)", FEED,
         "Thu, 01 Jan 2004 19:48:21 GMT", utc(2004, 1, 1, 19, 48, 21)),
    Case(f"{FPW}/rss/channel_lastBuildDate_parsed.xml", FEED, "Sat, 07 Sep 2002 00:00:01 GMT",
         utc(2002, 9, 7, 0, 0, 1)),
    Case("feedparser tests/illformed/http_high_bit_date.xml", FEED,
         "\u03a4\u03c1\u03b9, 29 \u0399\u03bf\u03cd\u03bd 2004 12:53:00 GMT", REFUSED),
    # -- ultimate-sitemap-parser: tests/test_helpers.py, tests/tree --------------
    Case(f"{USP} test_parse_iso8601_date: empty", BOTH, "", REFUSED),
    Case(f"{USP} test_parse_iso8601_date: date", BOTH, "1997-07-16", utc(1997, 7, 16)),
    Case(f"{USP} test_parse_iso8601_date: minutes, +01:00", BOTH, "1997-07-16T19:20+01:00",
         utc(1997, 7, 16, 18, 20)),
    Case(f"{USP} test_parse_iso8601_date: seconds, +01:00", BOTH, "1997-07-16T19:20:30+01:00",
         utc(1997, 7, 16, 18, 20, 30)),
    Case(f"{USP} test_parse_iso8601_date: fraction, +01:00", BOTH,
         "1997-07-16T19:20:30.45+01:00", utc(1997, 7, 16, 18, 20, 30)),
    Case(f"{USP} test_parse_iso8601_date: Z", BOTH, "2018-01-12T21:57:27Z",
         utc(2018, 1, 12, 21, 57, 27)),
    Case(f"{USP} test_parse_iso8601_invalid_date: GH#31", BOTH, "2021-06-18T112:13:04+00:00",
         REFUSED),
    Case(f"{USP} test_parse_iso8601_invalid_date: not a date", BOTH, "not a date", REFUSED),
    Case(f"{USP} test_parse_rfc2822_date: -0000", FEED, "Tue, 10 Aug 2010 20:43:53 -0000",
         utc(2010, 8, 10, 20, 43, 53)),
    Case(f"{USP} test_parse_rfc2822_date: +0200", FEED, "Thu, 17 Dec 2009 12:04:56 +0200",
         utc(2009, 12, 17, 10, 4, 56)),
    Case(f"{USP} test_parse_rfc2822_date_invalid_date: GH#31", FEED,
         "Fri, 18 Jun 2021 112:13:04 UTC", REFUSED),
    Case(f"{USP} test_parse_rfc2822_date_invalid_date: not a date", FEED, "not a date", REFUSED),
    Case(f"{USP} tree/base.py TEST_DATE_STR_ISO8601 (lastmod, Atom 0.3 issued/modified)",
         BOTH, "2009-12-17T12:04:56+02:00", utc(2009, 12, 17, 10, 4, 56)),
    Case(f"{USP} tree/test_edges.py test_max_recursion_level_sitemap_with_robots", SITEMAP,
         "2024-01-01", utc(2024, 1, 1)),
    Case(f"{USP} tree/base.py: <lastmod />", SITEMAP, "", REFUSED),
    # -- Scrapy: tests/test_utils_sitemap.py, tests/test_spider_sitemap.py -------
    Case(f"{SCRAPY} test_utils_sitemap.py test_sitemap", SITEMAP, "2009-08-16",
         utc(2009, 8, 16)),
    Case(f"{SCRAPY} test_utils_sitemap.py test_sitemap_index", SITEMAP,
         "2004-10-01T18:23:17+00:00", utc(2004, 10, 1, 18, 23, 17)),
    Case(f"{SCRAPY} test_utils_sitemap.py test_sitemap_index", SITEMAP, "2005-01-01",
         utc(2005, 1, 1)),
    Case(f"{SCRAPY} test_utils_sitemap.py test_sitemap_strip: <lastmod />", SITEMAP, "",
         REFUSED),
    Case(f"{SCRAPY} test_utils_sitemap.py test_sitemap_blanklines", SITEMAP, "2013-07-15",
         utc(2013, 7, 15)),
    Case(f"{SCRAPY} test_spider_sitemap.py test_sitemap_filter", SITEMAP, "2010-01-01",
         utc(2010, 1, 1)),
    Case(f"{SCRAPY} test_spider_sitemap.py test_sitemap_filter_with_alternate_links", SITEMAP,
         "2015-01-01", utc(2015, 1, 1)),
    Case(f"{SCRAPY} test_spider_sitemap.py test_sitemapindex_filter", SITEMAP,
         "2004-01-01T20:00:00+00:00", utc(2004, 1, 1, 20)),
    # -- the W3C Datetime note's and sitemaps.org's own examples -----------------
    Case("W3C NOTE-datetime: year and month", SITEMAP, "1997-07", utc(1997, 7, 1)),
    Case("W3C NOTE-datetime: year", SITEMAP, "1997", utc(1997, 1, 1)),
    Case("sitemaps.org protocol: <lastmod> with a time", SITEMAP, "2004-12-23T18:00:15+00:00",
         utc(2004, 12, 23, 18, 0, 15)),
    # -- ours: the rules the suites leave open -----------------------------------
    Case("ours: a W3C lastmod without a zone is UTC", SITEMAP, "2024-05-01T10:00:00",
         utc(2024, 5, 1, 10)),
    Case("ours: minutes without a zone", SITEMAP, "2024-05-01T10:00", utc(2024, 5, 1, 10)),
    Case("ours: +hhmm zone", BOTH, "2024-05-01T10:00:00+0200", utc(2024, 5, 1, 8)),
    Case("ours: +hh zone", BOTH, "2024-05-01T10:00:00-03", utc(2024, 5, 1, 13)),
    Case("ours: RFC 3339 lowercase t and z", BOTH, "2024-05-01t10:00:00z", utc(2024, 5, 1, 10)),
    Case("ours: a leap second is its minute's last second", BOTH, "2016-12-31T23:59:60Z",
         utc(2016, 12, 31, 23, 59, 59)),
    Case("ours: surrounding whitespace", BOTH, "\n  2024-05-01\n", utc(2024, 5, 1)),
    Case("ours: 30 February", BOTH, "2024-02-30", REFUSED),
    Case("ours: 29 February of a common year", BOTH, "2023-02-29", REFUSED),
    Case("ours: month 13", BOTH, "2024-13-01", REFUSED),
    Case("ours: 24:00", BOTH, "2024-05-01T24:00:00Z", REFUSED),
    Case("ours: year 0", BOTH, "0000-01-01", REFUSED),
    Case("ours: zone beyond 23:59", BOTH, "2024-05-01T10:00:00+24:00", REFUSED),
    Case("ours: non-ASCII digits", BOTH, "\uff12\uff10\uff12\uff14-05-01", REFUSED),
    Case("ours: a date with its zone but no time", BOTH, "2024-05-01Z", REFUSED),
    Case("ours: an RFC 822 date is no sitemap lastmod (sitemaps.org: W3C Datetime)", SITEMAP,
         "Thu, 01 Jan 2004 19:48:21 GMT", REFUSED),
    Case("ours: RFC 822 EST", FEED, "Thu, 01 Jan 2004 14:48:21 EST", utc(2004, 1, 1, 19, 48, 21)),
    Case("ours: RFC 822 PDT, lowercase", FEED, "thu, 01 jan 2004 12:48:21 pdt",
         utc(2004, 1, 1, 19, 48, 21)),
    Case("ours: RFC 822 UT", FEED, "01 Jan 2004 19:48:21 UT", utc(2004, 1, 1, 19, 48, 21)),
    Case("ours: RFC 822 Z", FEED, "01 Jan 2004 19:48:21 Z", utc(2004, 1, 1, 19, 48, 21)),
    Case("ours: RFC 822 military A is UTC (RFC 2822 section 4.3: read as -0000)", FEED,
         "01 Jan 2004 19:48:21 A", utc(2004, 1, 1, 19, 48, 21),
         deviation="feedparser reads military letters with RFC 822's signs (A: UTC-1)"),
    Case("ours: RFC 822 military Y is UTC (RFC 2822 section 4.3)", FEED,
         "01 Jan 2004 19:48:21 Y", utc(2004, 1, 1, 19, 48, 21),
         deviation="feedparser reads military letters with RFC 822's signs (Y: UTC+12)"),
    Case("ours: IANA Etc/GMT+5 is UTC-5 (IANA's sign is POSIX's)", FEED,
         "Wed, 19 Aug 2009 18:28:00 Etc/GMT+5", utc(2009, 8, 19, 23, 28)),
    Case("ours: IANA Etc/GMT-10 is UTC+10", FEED,
         "Wed, 19 Aug 2009 18:28:00 Etc/GMT-10", utc(2009, 8, 19, 8, 28)),
    Case("ours: IANA Etc/UTC", FEED, "Wed, 19 Aug 2009 18:28:00 Etc/UTC",
         utc(2009, 8, 19, 18, 28)),
    Case("ours: Etc/GMT+05:00 is no IANA name, its sign ambiguous", FEED,
         "Wed, 19 Aug 2009 18:28:00 Etc/GMT+05:00", REFUSED),
    Case("ours: Etc/+0500 is no IANA name", FEED, "Wed, 19 Aug 2009 18:28:00 Etc/+0500",
         REFUSED),
    Case("ours: IANA has no Etc/GMT+15", FEED, "Wed, 19 Aug 2009 18:28:00 Etc/GMT+15",
         REFUSED),
    Case("ours: RFC 822 military J is not a zone", FEED, "01 Jan 2004 19:48:21 J", REFUSED),
    Case("ours: RFC 822 CEST", FEED, "Wed, 01 May 2024 12:00:00 CEST", utc(2024, 5, 1, 10)),
    Case("ours: RFC 822 without a zone is UTC", FEED, "Wed, 01 May 2024 12:00:00",
         utc(2024, 5, 1, 12)),
    Case("ours: an unknown zone name", FEED, "Wed, 01 May 2024 12:00:00 XYZ", REFUSED,
         deviation="feedparser reads an unknown zone as UTC"),
    Case("ours: an ambiguous zone name (British or Bangladesh)", FEED,
         "Wed, 01 May 2024 12:00:00 BST", REFUSED,
         deviation="feedparser reads an unknown zone as UTC"),
    Case("ours: RFC 2822 two-digit year 60 is 1960", FEED, "Fri, 01 Jan 60 00:00:00 GMT",
         utc(1960, 1, 1), deviation="feedparser reads 2060 (its cutoff is 90)"),
    Case("ours: RFC 2822 two-digit year 49 is 2049", FEED, "Fri, 01 Jan 49 00:00:00 GMT",
         utc(2049, 1, 1)),
    Case("ours: RFC 822 31 June", FEED, "Thu, 31 Jun 2004 19:48:21 GMT", REFUSED),
    Case("ours: RFC 822 zone +2400", FEED, "Thu, 01 Jan 2004 19:48:21 +2400", REFUSED),
    Case("ours: RFC 822 a zone without a time", FEED, "Thu, 01 Jan 2004 GMT", REFUSED),
    Case("ours: RFC 822 trailing garbage", FEED, "Thu, 01 Jan 2004 19:48:21 GMT extra", REFUSED),
]


def _parsers(kind: str) -> list[tuple[str, Callable[[str | None], float | None]]]:
    return [(name, parse) for name, parse in (("sitemap", parse_w3c_datetime),
                                              ("feed", parse_feed_date))
            if kind in (name, BOTH)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.source} {c.value!r}")
def test_dates(case: Case) -> None:
    for name, parse in _parsers(case.kind):
        assert parse(case.value) == case.expected, (name, case.source)
