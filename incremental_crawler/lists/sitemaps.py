"""Which pages a sitemap (or a feed) makes worth requesting.

The cheapest request is the one never sent: on a host whose lastmods are
trusted, a page whose ``<lastmod>`` is not newer than the lastmod stored
with our copy of it is not requested (:func:`decide`). Entries
are checked against the sitemaps protocol first (sitemaps.org): at most
50,000 URLs per file, ``loc`` an absolute http(s) URL on the sitemap's own
host (or one of *allowed_hosts*: the user's, and the host whose robots.txt
named the sitemap, a cross-submission) and under 2,048 characters; a bad
entry is skipped with a stat and the rest of the sitemap still counts. An
``xhtml:link`` alternate (``"alternate_link": True`` in its entry) may be
on any host: the site names its own language versions, on other domains
too, as Google documents for hreflang.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from incremental_crawler import clock
from incremental_crawler.change.accounting import Why
from incremental_crawler.change.policy import known_date, schedule_why
from incremental_crawler.hosts import host_of
from incremental_crawler.lists.dates import parse_w3c_datetime

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable

    from scrapy.statscollectors import StatsCollector

    from incremental_crawler.change.policy import CrawlDueRules
    from incremental_crawler.state.records import PageState

__all__ = ["MAX_LOC_LENGTH", "MAX_URLS", "NO_LISTING", "Candidate", "SitemapEntries",
           "decide", "listing_digest"]

#: sitemaps.org: "no more than 50,000 URLs" per sitemap file (and index).
MAX_URLS = 50_000
#: sitemaps.org: "less than 2,048 characters".
MAX_LOC_LENGTH = 2048
#: A lastmod further than this in the future is not a date we can use.
_FUTURE_TOLERANCE = 60.0
_DATE_MEMO = 4096


@dataclass(slots=True)
class Candidate:
    """A page listed by a sitemap, with its canonical URL and lastmod."""

    loc: str
    canonical: str
    lastmod: float | None
    #: *lastmod* is a modification date (a sitemap ``<lastmod>``, an Atom
    #: ``<updated>``), not a publication date (an RSS ``<pubDate>``).
    modified: bool = True


#: A membership no list has (``PageState.listing``): a page that the list
#: naming it last gave no modification date, a list whose last answer was
#: not one (a 2xx that is no sitemap or feed). It never vouches.
NO_LISTING = "-"


def listing_digest(candidates: Iterable[Candidate]) -> str:
    """A list's membership: 16 hex digits of a hash of the canonical URLs it
    lists, in any order (dates aside: a list whose dates move lists the
    same pages).

    >>> a, b = (Candidate(u, u, 1.0) for u in ("http://h/a", "http://h/b"))
    >>> listing_digest([a, b]) == listing_digest([b, Candidate(a.loc, a.canonical, 9.0)])
    True
    >>> listing_digest([a]) == listing_digest([a, b])
    False
    """
    digest = hashlib.sha256()
    for url in sorted({c.canonical for c in candidates}):
        digest.update(url.encode())
        digest.update(b"\n")
    return digest.hexdigest()[:16]


class SitemapEntries:
    """Checks, normalises and de-duplicates the entries of one sitemap."""

    def __init__(
        self,
        sitemap_url: str,
        stats: StatsCollector,
        canonical: Callable[[str], str],
        *,
        allowed_hosts: Collection[str] = (),
        now: float | None = None,
        parse_date: Callable[[str | None], float | None] = parse_w3c_datetime,
    ) -> None:
        self.parse_date = parse_date
        self.host = host_of(sitemap_url)
        self.allowed_hosts = {self.host, *(h.lower() for h in allowed_hosts)}
        self.stats = stats
        self.canonical = canonical
        self.now = clock.now() if now is None else now
        self._dates: dict[str, float | None] = {}

    def _reject(self, reason: str) -> None:
        self.stats.inc_value(f"incremental/sitemap/loc_rejected/{reason}")

    def check_loc(self, loc: str, *, any_host: bool = False) -> bool:
        """Whether *loc* may be requested (counted when it may not).

        *any_host*: *loc* may be on another host than the allowed ones.
        """
        if not loc:
            self._reject("empty")
            return False
        if len(loc) >= MAX_LOC_LENGTH:
            self._reject("too_long")
            return False
        parts = urlsplit(loc)
        if parts.scheme not in ("http", "https"):
            self._reject("scheme" if parts.scheme else "relative")
            return False
        if not any_host and host_of(loc) not in self.allowed_hosts:
            self._reject("other_host")
            return False
        return True

    def lastmod(self, raw: str | None) -> float | None:
        if not raw:
            self.stats.inc_value("incremental/lastmod/missing")
            return None
        # Sitemaps repeat a few dates over thousands of entries.
        try:
            value = self._dates[raw]
        except KeyError:
            if len(self._dates) >= _DATE_MEMO:
                self._dates.clear()
            value = self._dates[raw] = self.parse_date(raw)
        if value is None:
            self.stats.inc_value("incremental/lastmod/invalid")
            return None
        if value > self.now + _FUTURE_TOLERANCE:
            # Clamped to "now" it would be newer than anything stored, on
            # every crawl; a stored year 2999 would hide every later real
            # change. It tells nothing: it counts as missing.
            self.stats.inc_value("incremental/lastmod/future_clamped")
            return None
        return value

    def candidates(self, entries: Iterable[dict[str, Any]]) -> list[Candidate]:
        """The valid, distinct entries of a urlset, at most :data:`MAX_URLS`."""
        seen: set[str] = set()
        result: list[Candidate] = []
        for entry in entries:
            if len(result) >= MAX_URLS:
                self.stats.inc_value("incremental/sitemap/urls_over_limit")
                continue
            loc = entry.get("loc") or ""
            if not self.check_loc(loc, any_host=entry.get("alternate_link", False)):
                continue
            canonical = self.canonical(loc)
            if canonical in seen:
                self.stats.inc_value("incremental/sitemap/duplicate_loc")
                continue
            seen.add(canonical)
            result.append(Candidate(loc, canonical, self.lastmod(entry.get("lastmod")),
                                    modified=entry.get("modified", True)))
        return result


def decide(candidate: Candidate, stored: PageState | None, *, use_lastmod: bool,
           rules: CrawlDueRules, vouching: bool = True) -> Why:
    """Why *candidate* is requested this crawl, or why not (:func:`schedule_why`).

    *use_lastmod*: the list's dates are used (switched on, and the host's
    lastmods trusted). A listed date newer than the one stored with our copy
    asks for the page; a modification date that did not move vouches for
    our copy whatever its revisit schedule. A date that is not a
    modification date (a publication date) never vouches: an unmoved one
    leaves the page to its schedule. *vouching* ``False`` (a host on
    probation for stale lastmods): newer dates still ask, but no date vouches.
    """
    if stored is None:
        return Why.NEW
    # A gone page came back only if the list dates it after we found it
    # gone (a CMS may date the deletion: see known_date).
    listed, known = candidate.lastmod, known_date(stored)
    if not use_lastmod or listed is None or known is None:
        return schedule_why(stored, rules)
    newer = listed > known
    return schedule_why(stored, rules, newer=newer,
                        vouched=vouching and candidate.modified and not newer)
