"""Why each known page is requested in a crawl, or not, and the counts of it.

Every page a crawl knows (stored, or listed by a sitemap or feed) ends the
crawl in one of these columns; the end-of-crawl report reads them back from
the stats. The values of :class:`Why` are the last part of stats keys and
never change:

- ``incremental/schedule/requested/<why>``: requested, and why;
- ``incremental/schedule/skipped/lastmod_unchanged``: not requested, its
  trusted lastmod vouches for the copy we hold;
- ``incremental/schedule/not_due``: not requested, its revisit is not due;
  ``incremental/schedule/first_due`` is the earliest next visit among them
  (POSIX time);
- ``incremental/schedule/bytes_skipped``: the stored size of the pages not
  requested (the "share of a full re-crawl" counts them);
- ``incremental/schedule/failed``: pages whose final answer was a failure
  (network error, 5xx, 429, 401, 403), recorded to be asked again;
- ``incremental/schedule/outcome/<outcome>``: what became of each page
  requested, once per page whatever its retries and re-fetches cost in
  requests (:class:`PageOutcome`). With the three "not requested" counts
  above (and ``deferred``) they are the report's columns: every known page
  is in exactly one.

Whoever decides a request's why (a list spider, the re-seeder) puts it in
the request's meta under :data:`META_WHY`; a request that arrives without
one is decided, and counted, by the conditional middleware.

The same counts are kept per host (:attr:`ScheduleCounter.hosts`) for the
report's per-host table.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from incremental_crawler.change.host_counts import UNLISTED, HostCounts
from incremental_crawler.hosts import host_of

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from incremental_crawler.state.records import PageKey, PageState

__all__ = [
    "META_LASTMOD_MODIFIED", "META_WHY", "PageOutcome", "ScheduleCounter", "Why", "decided", "mark",
]

#: Request meta key: the :class:`Why` of a request decided (and counted)
#: already. The conditional middleware does not decide again whether such a
#: request is due, and a :attr:`Why.SAMPLED` page found changed is evidence
#: against its host's lastmods.
META_WHY = "_incremental_why"
#: Request meta key: the URL the why was decided for. Meta copied into a
#: request for another page (``meta=response.meta``) carries the why along;
#: it does not hold for that page (see :func:`decided`).
META_WHY_URL = "_incremental_why_url"
#: Request meta key: ``True`` when the request's ``incremental_lastmod`` is a
#: modification date (a sitemap ``<lastmod>``, an Atom ``<updated>``), not a
#: publication date; recorded with the page (PageFlags.LASTMOD_MODIFIED).
META_LASTMOD_MODIFIED = "_incremental_lastmod_modified"
#: On a listed page's request: the membership digest of the list that gave
#: its date (``PageState.listing``), stored with the page's visit.
META_LISTING = "_incremental_listing"


def mark(request: Request, why: Why) -> None:
    """Record on *request* that its page was decided (and counted) as *why*."""
    request.meta[META_WHY] = why
    request.meta[META_WHY_URL] = request.url


def decided(request: Request) -> Why | None:
    """The why *request*'s page was decided as this crawl, or ``None``.

    Its retries and re-fetches (same URL) keep it, and so does the request
    of each redirect it follows (its previous hop is the URL the why was
    last confirmed for: the conditional middleware marks every request it
    lets out again, at its own URL). A request for another page that copied
    its meta (``meta=response.meta``, redirects included) does not.
    """
    meta = request.meta
    why = meta.get(META_WHY)
    if why is None:
        return None
    seen = meta.get(META_WHY_URL)
    hops = meta.get("redirect_urls")
    if seen == request.url or (hops and hops[-1] == seen):
        return Why(why)
    return None


class Why(StrEnum):
    """Why a page is requested this crawl (or, for the last two, why not)."""

    #: Never stored.
    NEW = "new"
    #: Its sitemap or feed lastmod is newer than the one stored.
    LASTMOD_NEWER = "lastmod_newer"
    #: Its revisit is due (no lastmod, or one that cannot be trusted or is
    #: not a modification date).
    DUE = "due"
    #: The share of lastmod-skipped pages checked each crawl.
    SAMPLED = "sampled"
    #: Its last full fetch is older than INCREMENTAL_MAX_AGE (with jitter).
    MAX_AGE = "max_age"
    #: Its last visit failed: asked again on its failure schedule.
    RETRY = "retry"
    #: INCREMENTAL_RECHECK_ALL (``-a recheck=all``).
    RECHECK = "recheck"
    #: Not requested: a trusted lastmod that did not move.
    LASTMOD_UNCHANGED = "lastmod_unchanged"
    #: Not requested: its next visit is after this crawl's start (+ tolerance).
    NOT_DUE = "not_due"

    @property
    def requested(self) -> bool:
        """Whether a page decided so is requested (all but the last two).

        >>> Why.DUE.requested, Why.LASTMOD_UNCHANGED.requested, Why.NOT_DUE.requested
        (True, False, False)
        """
        return self not in _NOT_REQUESTED


#: The whys of the pages not requested.
_NOT_REQUESTED = frozenset({Why.LASTMOD_UNCHANGED, Why.NOT_DUE})


class PageOutcome(StrEnum):
    """What became of a page requested this crawl: each ends in exactly one.

    Counted once per page, at its final answer (after every retry, and
    after its items left the pipelines): ``requested`` pages = the sum of
    these, but for pages whose request was dropped before an answer
    (robots.txt, offsite, the crawl stopping), which have none.
    """

    #: A 304 taken: our copy is the page.
    NOT_MODIFIED = "not_modified"
    #: Fetched in full for the first time (or again after it was gone).
    NEW = "new"
    #: Fetched in full, its content (what its items say) changed.
    CHANGED = "changed"
    #: Fetched in full, its body changed but its items did not (an edit
    #: outside the fields the spider keeps, or noise).
    PAGE_CHANGED = "page_changed"
    #: Fetched in full, the same body as stored.
    UNCHANGED = "unchanged"
    #: Fetched in full, but its callback or an item pipeline failed: its new
    #: state was not stored.
    WITHHELD = "withheld"
    #: The final answer was a failure (no answer, 5xx, 408, 429, 401, 403,
    #: a truncated body).
    FAILED = "failed"
    #: The final answer was a 404, a 410 or another 4xx (a page gone, or
    #: going).
    GONE = "gone"
    #: A redirect that was not followed.
    REDIRECTED = "redirected"


class ScheduleCounter:
    """Counts the crawl's decisions into the stats (see the module docstring).

    One per crawl (the ledger's), shared by whoever decides, so that the
    pages counted as not requested are known when the re-seeder accounts
    for the rest of the store (:meth:`not_due_elsewhere`).
    """

    def __init__(self, stats: StatsCollector) -> None:
        self.stats = stats
        #: The same counts per host (and the conditional middleware's outcomes).
        self.hosts = HostCounts()
        #: Pages counted as not requested: their next visit and stored size.
        self._unrequested: dict[PageKey, tuple[float, int]] = {}

    def requested(self, why: Why, host: str, count: int = 1) -> None:
        self.stats.inc_value(f"incremental/schedule/requested/{why}", count)
        self.hosts.count(host, f"requested/{why}", count)

    def skipped(self, state: PageState) -> None:
        """Not requested: its trusted lastmod did not move."""
        self.stats.inc_value("incremental/schedule/skipped/lastmod_unchanged")
        self._unrequested_page(state, "skipped_lastmod")

    def not_due(self, state: PageState) -> None:
        """Not requested: not due before ``state.next_visit``."""
        self.stats.inc_value("incremental/schedule/not_due")
        self._unrequested_page(state, "not_due")
        if state.next_visit:
            self.stats.min_value("incremental/schedule/first_due", state.next_visit)

    def _unrequested_page(self, state: PageState, event: str) -> None:
        self.stats.inc_value("incremental/schedule/bytes_skipped", state.size)
        self._unrequested[state.key] = (state.next_visit, state.size)
        host = host_of(state.key.url)
        self.hosts.count(host, event)
        self.hosts.count(host, "bytes_skipped", state.size)

    def counted_after(self, due_at: float) -> tuple[int, int]:
        """Pages counted as not requested whose next visit is after *due_at*, and their sizes."""
        later = [size for next_visit, size in self._unrequested.values() if next_visit > due_at]
        return len(later), sum(later)

    def counted_keys(self, *, upto: float) -> set[PageKey]:
        """Pages counted as not requested whose next visit is not after *upto*."""
        return {key for key, (next_visit, _) in self._unrequested.items() if next_visit <= upto}

    def deferred(self, pages: int) -> None:
        """Due pages left unread over INCREMENTAL_RESEED_LIMIT (next crawl's first)."""
        if pages > 0:
            self.stats.inc_value("incremental/schedule/deferred", pages)

    def not_due_elsewhere(self, pages: int, size: int, first_due: float | None) -> None:
        """Known pages that nothing listed or linked this crawl, and not due."""
        if pages <= 0:
            return
        self.stats.inc_value("incremental/schedule/not_due", pages)
        self.stats.inc_value("incremental/schedule/bytes_skipped", size)
        # One store query counted them: their hosts are not told apart.
        self.hosts.count(UNLISTED, "not_due", pages)
        self.hosts.count(UNLISTED, "bytes_skipped", size)
        if first_due:
            self.stats.min_value("incremental/schedule/first_due", first_due)

    def outcome(self, outcome: PageOutcome, url: str) -> None:
        """What became of a page requested this crawl (once per page)."""
        self.stats.inc_value(f"incremental/schedule/outcome/{outcome}")
        self.hosts.count(host_of(url), f"outcome/{outcome}")

    def failed(self, url: str) -> None:
        self.stats.inc_value("incremental/schedule/failed")
        self.hosts.count(host_of(url), "failed")
