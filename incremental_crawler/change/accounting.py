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

Every stat only goes up (the live metrics export them as counters): a page
that leaves a column is counted leaving it, and the report
(:func:`~incremental_crawler.report.extension.summarize`) takes the
departures off:

- ``incremental/schedule/not_due_left``,
  ``incremental/schedule/skipped_left/lastmod_unchanged``,
  ``incremental/schedule/deferred_left``: pages counted not requested, then
  requested after all; ``.../bytes_skipped_left``, the stored sizes of the
  first two;
- ``incremental/schedule/outcome_replaced/<outcome>``: a page's answer
  replaced by a later one (see below);
- ``incremental/schedule/failed_recovered``: pages counted failed that
  answered after all.

(``first_due`` alone moves later, when the page first due is requested.)

Whoever decides a request's why (a list spider, the re-seeder) puts it in
the request's meta under :data:`META_WHY`, with the page it counted under
:data:`META_COUNTED`; a request that arrives without one is decided, and
counted, by the conditional middleware.

Once per page: Scrapy may ask for a page twice in one crawl (a start URL is
``dont_filter``, and a page linking to it, itself included, asks again), so
:class:`ScheduleCounter` keeps the pages it counted. A page is requested
once however many requests reach a decision; one counted not requested
(not due, skipped) that is then requested leaves that column for its
answer's; and its answers merge (:func:`replaces`):

- among successes the strongest stays, :data:`SUCCESSES`' order (new,
  changed, page changed, unchanged, not modified): a later fetch is judged
  against the earlier one of the same crawl, not the crawl's start, so a
  page that changed and was fetched again would otherwise end unchanged;
- a success replaces a failure, gone, withheld or redirected answer;
- a failure, gone, withheld or redirected answer replaces whatever came
  before, as the store takes it: a failure records the page's status and
  its failure schedule (asked again next crawl), a 410 tombstones its
  items, a withheld answer leaves it to be fetched again;
- ``incremental/schedule/failed`` counts each time a page's answer is a
  failure; ``schedule/failed_recovered`` each time a page that had failed
  then answered.

An answer is the page's that was counted (:func:`counted_key`): a
redirect's target answers for the page asked, not for itself.

Sums without keys: the re-seeder counts the known pages nothing reached
as not due, and the due ones over its limit as deferred, from the store's
sums. Each page's stored state says whether a sum counted it: one reached
later is not counted again (not due), or leaves that column (requested:
``not_due_left``, ``deferred_left``). A page requested before the sum is
read whose visit is not stored by then (held for the feeds, staged) is
in the sum by its old state: the re-seeder takes it off.

Cluster mode: once per *run*. The first worker to count a page counts it
for the run (:class:`RunCounts`); another that requests a page the first
counted not requested counts it leaving that column. A page's answers
land on whichever worker popped its request (the shared queue): the run
merges them as one crawl does (:meth:`RunCounts.answer`), and the worker
that gets an answer counts what it changes. The run's workers' stats
summed (``scrapy state``) put each page in one column; one worker's
alone are its share, and a column of them may be negative. A killed
worker's stats are lost: a page it counted, or whose answer it counted,
is counted again by the next worker that reaches it, or, if none does, by
the worker that ends the run (``ClusterCoordinator.settle_killed``).

The same counts are kept per host (:attr:`ScheduleCounter.hosts`) for the
report's per-host table.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from incremental_crawler.change.host_counts import UNLISTED, HostCounts
from incremental_crawler.hosts import host_of
from incremental_crawler.state.records import PageKey

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from incremental_crawler.state.records import PageState

__all__ = [
    "META_COUNTED", "META_LASTMOD_MODIFIED", "META_WHY", "SUCCESSES", "PageOutcome",
    "ScheduleCounter", "Why", "counted_key", "decided", "mark", "replaces",
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
#: Request meta key: the page (its :class:`PageKey`, as a plain tuple) the
#: why was counted for. Its answer is that page's, wherever the request was
#: redirected (see :func:`counted_key`); held as long as the why is.
META_COUNTED = "_incremental_counted"
#: Request meta key: ``True`` when the request's ``incremental_lastmod`` is a
#: modification date (a sitemap ``<lastmod>``, an Atom ``<updated>``), not a
#: publication date; recorded with the page (PageFlags.LASTMOD_MODIFIED).
META_LASTMOD_MODIFIED = "_incremental_lastmod_modified"
#: On a listed page's request: the membership digest of the list that gave
#: its date (``PageState.listing``), stored with the page's visit.
META_LISTING = "_incremental_listing"


def mark(request: Request, why: Why, key: PageKey | None = None) -> None:
    """Record on *request* that its page was decided (and counted) as *why*,
    counted as the page *key* (``None``: the one counted before, if any)."""
    request.meta[META_WHY] = why
    request.meta[META_WHY_URL] = request.url
    if key is not None:
        request.meta[META_COUNTED] = tuple(key)


def counted_key(request: Request) -> PageKey | None:
    """The page whose column *request*'s answer decides, or ``None`` when
    none was counted with its why (the caller's own key then stands).

    Kept by its retries, re-fetches and redirect hops, as its why is
    (:func:`decided`): the answer at a redirect chain's end is the answer
    of the page that was asked.
    """
    if decided(request) is None:
        return None
    key = request.meta.get(META_COUNTED)
    return None if key is None else PageKey(*key)


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
    (robots.txt forbidding it, offsite, the crawl stopping), which have
    none.
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
    #: A redirect that was not followed (``dont_redirect``), or whose target
    #: this request does not fetch: off the site, or asked already this crawl.
    REDIRECTED = "redirected"


#: A page's column in the run's record (:meth:`RunCounts.count_page`):
#: requested, not due, skipped (lastmod unchanged), counted in the
#: re-seeder's sum of the pages not due, or among the due pages it
#: deferred (over its limit).
RUN_REQUESTED, RUN_NOT_DUE, RUN_SKIPPED, RUN_IN_BULK, RUN_DEFERRED = "r", "d", "s", "b", "f"

#: The events of a page's answers the run merges (:meth:`RunCounts.answer`)
#: besides its outcomes: a failure recorded; an outcome unless the page
#: has one (a request that got no answer). A failure recorded is no outcome
#: name: an answer that was a failure (the outcome ``failed``) is an outcome.
RUN_FAILED, RUN_UNANSWERED = "!failed", "?"

#: Which of the re-seeder's sums a page's stored state puts it in: the
#: pages not due (:attr:`ScheduleCounter.summed`), the due pages it may
#: defer (:attr:`ScheduleCounter.deferrable`), or neither.
IN_NOT_DUE_SUM, IN_DUE_SUM, IN_NO_SUM = "1", "f", "0"

#: Pages counted in the run by one call at most (one script run, which
#: holds Redis meanwhile: about 20 µs a page).
RUN_BATCH = 1_000

#: A page to count in the run: its key, column, stored size, and which of
#: the re-seeder's sums counts it too (:data:`IN_NOT_DUE_SUM`...).
RunCount = tuple[PageKey, str, int, str]


class RunCounts(Protocol):
    """The pages the workers of a run counted (cluster mode): each page is
    counted by the first worker to count it, in one column for the run."""

    def count_pages(self, pages: list[RunCount]) -> list[str] | None:
        """Count each page in its column for the run, in order, unless a
        worker counted it already; a page counted not requested moves to
        requested. What the run had for each: ``""`` nothing (this worker
        counts it), :data:`RUN_IN_BULK` the re-seeder's sum,
        :data:`RUN_DEFERRED` the due pages it deferred (a page requested
        leaves either), else its column and stored size (``"d1:1234"``);
        ``None``: unknown."""

    def answer(self, key: PageKey, event: str) -> str | None:
        """Merge an answer of the page *key* into its column for the run
        (*event*: a :class:`PageOutcome`, :data:`RUN_FAILED`, or
        :data:`RUN_UNANSWERED` and an outcome): what the caller counts,
        ``"<outcomes>,<outcomes replaced>,<failures>,<recoveries>"``
        (outcomes ``+`` between, empty: none): its answer's change, and
        what the counts of workers killed since lack (their stats died
        with them); ``None``: unknown."""

    def deferred_counted(self) -> set[PageKey] | None:
        """The re-seeder counts the due pages over its limit deferred: from
        now on a page of that sum that no worker counted yet, once
        requested, leaves that column (:data:`RUN_DEFERRED`). The pages
        requested before whose stored state either sum counted when they
        were (their visits may not be stored yet: the due sum counts them
        by their old state); ``None``: unknown."""

    def bulk_counted(self) -> tuple[int, int, set[PageKey]] | None:
        """The re-seeder counts the pages not due by the store's sums: from
        now on the run counts no page of that sum one by one. The pages
        counted one by one not requested that the sum counts too, their
        sizes, and the pages requested whose stored state the sum counted
        when they were (``None``: unknown)."""

    def deferred_sum(self, pages: int) -> None:
        """The re-seeder counted *pages* due pages deferred (after
        :meth:`deferred_counted`): recorded in the run, as :meth:`sum_counted`."""

    def sum_counted(self, pages: int, size: int, first_due: float | None) -> None:
        """The re-seeder counted its sum of the pages not due (*pages* of
        *size* bytes, the earliest next visit *first_due*, after
        :meth:`bulk_counted`): recorded in the run, which stands by it
        whatever becomes of the re-seeder (killed, its stats die with it:
        the worker that ends the run counts it then)."""


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
        #: Pages counted as not requested: their next visit, stored size and
        #: column (its event in :attr:`hosts`).
        self._unrequested: dict[PageKey, tuple[float, int, str]] = {}
        #: Those of them the re-seeder's sum of the pages not due counts
        #: too (:attr:`summed`, asked when counted), and their sizes.
        self._in_sum: dict[PageKey, int] = {}
        #: Pages counted requested whose stored state the sum counted when
        #: they were (their visits may not be stored when it is read).
        self._requested_in_sum: set[PageKey] = set()
        #: Pages counted as requested, and the column their answers merged
        #: into: a page is counted once, its requests apart (see the
        #: module docstring).
        self._requested: set[PageKey] = set()
        self._outcomes: dict[PageKey, PageOutcome] = {}
        #: Pages whose last answer was a failure (``incremental/schedule/failed``,
        #: less ``failed_recovered``).
        self._failed: set[PageKey] = set()
        #: The earliest next visit of the pages counted not due in bulk
        #: (:meth:`not_due_elsewhere`), for ``first_due`` if one counted
        #: alone leaves the column.
        self._first_due_elsewhere = math.inf
        #: Whether a page's stored state puts it among the known pages the
        #: re-seeder counts not due in bulk, by the store's sums (set by the
        #: re-seeder; ``None``: it does not count them). No key is kept of
        #: them: their state tells when one is reached after all.
        self.summed: Callable[[PageState], bool] | None = None
        #: Whether a page's stored state puts it among the due pages the
        #: re-seeder would defer over its limit (set by the re-seeder, on
        #: every worker of a cluster run: the run tells whether it did).
        self.deferrable: Callable[[PageState], bool] | None = None
        #: Whether the re-seeder counted them (this crawl, or in cluster
        #: mode, when the run does it, the run: see :attr:`run`).
        self._bulk_counted = False
        #: Whether a page's stored state puts it among the due pages the
        #: re-seeder left unread, over its limit (``None``: none were).
        self._deferred: Callable[[PageState], bool] | None = None
        #: The run was told due pages are being deferred (:meth:`deferring`).
        self._deferring = False
        #: The run read the pages counted one by one for this crawl's sum
        #: (:meth:`counted_in_sum`): the sum, once counted, is recorded there.
        self._run_summed = False
        #: In cluster mode, the run's record of the pages its workers
        #: counted: each page is counted by one worker of the run.
        self.run: RunCounts | None = None
        #: While a batch is open (:meth:`batch`), the pages to count in the
        #: run, and how to count each once the run answered.
        self._batch: list[tuple[RunCount, Callable[[], None]]] | None = None
        #: The run's answer for the page being counted from a batch.
        self._answer: str | None = None
        #: Pages another worker of the run counted, and its column
        #: (:data:`RUN_REQUESTED`...): one counted not requested is asked
        #: about once.
        self._elsewhere: dict[PageKey, str] = {}

    def requested(self, why: Why, host: str, key: PageKey | None = None,
                  state: PageState | None = None) -> None:
        """Count a page requested as *why*, unless *key* was counted
        requested already this crawl (``None``: a page no one else counts).
        A page counted not requested leaves that column for this one: its
        stored *state*, when the caller read it, tells one counted in a sum
        (not due, deferred). In cluster mode a page another worker of the
        run counted requested is not counted again."""
        if key is not None:
            # One another worker counted requested is asked about again: that
            # worker may have been killed since (its count lost, the page
            # this worker's to count; a request asked twice is rare).
            if key in self._requested:
                return
            if self._later(key, RUN_REQUESTED, state,
                           lambda: self.requested(why, host, key, state)):
                return
            had = self._count_in_run(key, RUN_REQUESTED, state)
            if had[:1] == RUN_REQUESTED:
                self._elsewhere[key] = RUN_REQUESTED
                return
            self._requested.add(key)
            self._elsewhere.pop(key, None)
            if state is not None and self.summed is not None and self.summed(state):
                self._requested_in_sum.add(key)
            if not self._unrequested_no_more(key):
                self._left_uncounted(key, had, state)
        self.stats.inc_value(f"incremental/schedule/requested/{why}")
        self.hosts.count(host, f"requested/{why}")

    def skipped(self, state: PageState) -> None:
        """Not requested: its trusted lastmod did not move."""
        if self._counted_unrequested(state, RUN_SKIPPED, lambda: self.skipped(state)):
            return
        self.stats.inc_value("incremental/schedule/skipped/lastmod_unchanged")
        self._unrequested_page(state, "skipped_lastmod")

    def not_due(self, state: PageState) -> None:
        """Not requested: not due before ``state.next_visit``."""
        if self._counted_unrequested(state, RUN_NOT_DUE, lambda: self.not_due(state)):
            return
        self.stats.inc_value("incremental/schedule/not_due")
        self._unrequested_page(state, "not_due")
        if state.next_visit:
            self.stats.min_value("incremental/schedule/first_due", state.next_visit)

    def _counted_unrequested(self, state: PageState, column: str,
                             again: Callable[[], None]) -> bool:
        """Whether *state*'s page is in a column already, counting it in the
        run's *column* if not (cluster mode; in a batch, *again* counts it
        once the run answered): a page requested stays requested (its
        answer decides), one not requested is counted once."""
        key = state.key
        if key in self._requested or key in self._unrequested or key in self._elsewhere \
                or self._counted_in_bulk(state):
            return True
        if self._later(key, column, state, again):
            return True
        had = self._count_in_run(key, column, state)
        if had:
            self._elsewhere[key] = had[:1]
            return True
        return False

    def _left_uncounted(self, key: PageKey, had: str, state: PageState | None) -> None:
        """A page requested that this crawl did not count not requested one
        by one: counted so by another worker of the run (*had*), or in one
        of the re-seeder's sums, it leaves that column."""
        if had[:1] == RUN_DEFERRED:
            self.stats.inc_value("incremental/schedule/deferred_left")
        elif had:
            self._left_elsewhere(key, had, state)
        elif state is None or self.run is not None:
            # In cluster mode the run says whether a sum counts it (above).
            return
        elif self._counted_in_bulk(state):
            self._bulk_no_more(state.size)
        elif self._deferred is not None and self._deferred(state):
            self.stats.inc_value("incremental/schedule/deferred_left")

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Count the pages decided within in the run with one round trip
        per :data:`RUN_BATCH` pages (cluster mode; a list's pages, a
        re-seed's): each is counted when it closes."""
        if self.run is None or self._batch is not None:
            yield
            return
        self._batch = []
        try:
            yield
        finally:
            batch, self._batch = self._batch, None
            # A script holds Redis while it runs: a list's 50,000 pages in
            # one would stall every worker of the run.
            for start in range(0, len(batch), RUN_BATCH):
                self._count_batch(batch[start:start + RUN_BATCH])

    def _count_batch(self, batch: list[tuple[RunCount, Callable[[], None]]]) -> None:
        assert self.run is not None
        answers = self.run.count_pages([page for page, _ in batch])
        # Unknown (Redis did not answer; the worker stops): counted here.
        for (_, count), had in zip(batch, answers or [""] * len(batch), strict=True):
            self._answer = had
            try:
                count()
            finally:
                self._answer = None

    def _later(self, key: PageKey, column: str, state: PageState | None,
               count: Callable[[], None]) -> bool:
        """Whether *key* is counted when the open batch closes (by *count*)."""
        if self._batch is None:
            return False
        self._batch.append((self._run_count(key, column, state), count))
        return True

    def _run_count(self, key: PageKey, column: str, state: PageState | None) -> RunCount:
        if state is None:
            return key, column, 0, IN_NO_SUM
        if self.summed is not None and self.summed(state):
            in_sum = IN_NOT_DUE_SUM
        elif self.deferrable is not None and self.deferrable(state):
            in_sum = IN_DUE_SUM
        else:
            in_sum = IN_NO_SUM
        return key, column, state.size, in_sum

    def _count_in_run(self, key: PageKey, column: str, state: PageState | None) -> str:
        """What the run had counted *key* as (``""``: nothing, or no run),
        now that this worker counts it in *column*."""
        if self.run is None:
            return ""
        if self._answer is not None:
            return self._answer  # asked in a batch
        answers = self.run.count_pages([self._run_count(key, column, state)])
        # Unknown (Redis did not answer; the worker stops): counted here.
        return answers[0] if answers else ""

    def _left_elsewhere(self, key: PageKey, had: str, state: PageState | None) -> None:
        """A page another worker of the run counted not requested (*had*, as
        :meth:`RunCounts.count_page` says) is requested here: it leaves that
        column, counted by this worker (the run's workers' stats are summed)."""
        column, _, size_text = had.partition(":")
        size = int(size_text) if size_text else (state.size if state is not None else 0)
        if column[:1] == RUN_IN_BULK:
            self._bulk_no_more(size)
            return
        not_due = column[:1] == RUN_NOT_DUE
        self.stats.inc_value("incremental/schedule/not_due_left" if not_due
                             else "incremental/schedule/skipped_left/lastmod_unchanged")
        self.stats.inc_value("incremental/schedule/bytes_skipped_left", size)
        host = host_of(key.url)
        self.hosts.count(host, "not_due" if not_due else "skipped_lastmod", -1)
        self.hosts.count(host, "bytes_skipped", -size)

    def _unrequested_page(self, state: PageState, event: str) -> None:
        self.stats.inc_value("incremental/schedule/bytes_skipped", state.size)
        self._unrequested[state.key] = (state.next_visit, state.size, event)
        if self.summed is not None and self.summed(state):
            self._in_sum[state.key] = state.size
        host = host_of(state.key.url)
        self.hosts.count(host, event)
        self.hosts.count(host, "bytes_skipped", state.size)

    def _counted_in_bulk(self, state: PageState) -> bool:
        """Whether *state*'s page is among those counted not due in bulk by
        this crawl (and not alone: the caller asked first). In cluster mode
        the run tells (:meth:`RunCounts.count_page`)."""
        return (self._bulk_counted and self.run is None and self.summed is not None
                and self.summed(state))

    def _bulk_no_more(self, size: int) -> None:
        """A page counted not due in bulk is requested after all: it leaves
        that column as a page counted alone does (``first_due`` stays: the
        bulk's earliest is not known page by page)."""
        self.stats.inc_value("incremental/schedule/not_due_left")
        self.stats.inc_value("incremental/schedule/bytes_skipped_left", size)
        self.hosts.count(UNLISTED, "not_due", -1)
        self.hosts.count(UNLISTED, "bytes_skipped", -size)

    def _unrequested_no_more(self, key: PageKey) -> bool:
        """Take *key* out of the column of the pages not requested, if it
        was counted there (it is requested after all): counted as leaving it
        (``*_left``), the stats only go up; the report subtracts. Returns
        whether it was."""
        entry = self._unrequested.pop(key, None)
        self._in_sum.pop(key, None)
        if entry is None:
            return False
        next_visit, size, event = entry
        self.stats.inc_value("incremental/schedule/not_due_left" if event == "not_due"
                             else "incremental/schedule/skipped_left/lastmod_unchanged")
        self.stats.inc_value("incremental/schedule/bytes_skipped_left", size)
        host = host_of(key.url)
        self.hosts.count(host, event, -1)
        self.hosts.count(host, "bytes_skipped", -size)
        if event == "not_due" and next_visit and next_visit == self.stats.get_value(
                "incremental/schedule/first_due"):
            # It was the first to fall due: the next one is now (a min
            # cannot be undone; rare, a page not due then asked for anyway).
            first = min((visit for visit, _, column in self._unrequested.values()
                         if column == "not_due" and visit), default=self._first_due_elsewhere)
            if math.isinf(first):
                self.stats.set_value("incremental/schedule/first_due", 0)
            else:
                self.stats.set_value("incremental/schedule/first_due", first)
        return True

    def counted_after(self, due_at: float) -> tuple[int, int]:
        """Pages counted as not requested whose next visit is after *due_at*, and their sizes."""
        later = [size for next_visit, size, _ in self._unrequested.values()
                 if next_visit > due_at]
        return len(later), sum(later)

    def counted_keys(self, *, upto: float) -> set[PageKey]:
        """Pages counted as not requested whose next visit is not after *upto*."""
        return {key for key, (next_visit, _, _) in self._unrequested.items()
                if next_visit <= upto}

    def deferring(self) -> set[PageKey]:
        """About to count due pages deferred (:meth:`deferred`): in cluster
        mode the run tells requesters of those pages from now on, and
        answers the pages counted requested before whose stored state the
        due sum may count (visits not stored yet: the re-seeder takes those
        off). This crawl alone: its own are not known so (empty)."""
        if self.run is None:
            return set()
        self._deferring = True
        return self.run.deferred_counted() or set()

    def deferred(self, pages: int, among: Callable[[PageState], bool]) -> None:
        """Due pages left unread over INCREMENTAL_RESEED_LIMIT (next crawl's
        first): those whose stored state *among* holds. One reached later in
        the crawl and requested leaves the column (``deferred_left``)."""
        self._deferred = among
        if self.run is not None and (pages > 0 or self._deferring):
            if not self._deferring:
                # Another worker may request one (a link, a 304's replay).
                self.run.deferred_counted()
            self.run.deferred_sum(max(pages, 0))
        if pages > 0:
            self.stats.inc_value("incremental/schedule/deferred", pages)

    def counted_in_sum(self, due_at: float) -> tuple[int, int]:
        """The pages counted one by one (and their sizes) that the
        re-seeder's sum of the pages not due (:attr:`summed`) counts too:
        this crawl's, or in cluster mode the run's, whose other workers
        count no page of the sum from then on (it is being counted)."""
        if self.run is not None:
            counted = self.run.bulk_counted()
            if counted is not None:
                pages, size, self._requested_in_sum = counted
                self._run_summed = True
                return pages, size
        if self.summed is not None:
            # What the sum counts (scope, lists, last check), not only the
            # next visit: a list counted not due is not in it.
            return len(self._in_sum), sum(self._in_sum.values())
        return self.counted_after(due_at)

    def requested_in_sum(self) -> set[PageKey]:
        """The pages counted requested (this crawl's, in cluster mode the
        run's, once :meth:`counted_in_sum` asked) whose stored state the
        sum of the pages not due counted when they were: the sum counts
        those whose visits are not stored yet (held for the feeds, staged
        by another worker), and the re-seeder takes them off."""
        return self._requested_in_sum

    def not_due_elsewhere(self, pages: int, size: int, first_due: float | None) -> None:
        """Known pages that nothing listed or linked this crawl, and not due:
        those :attr:`summed` tells, but the pages counted already. One
        reached later in the crawl is not counted again: not due, it is
        counted already; requested, it leaves the column."""
        self._bulk_counted = True
        if self._run_summed:
            self._run_summed = False
            assert self.run is not None
            self.run.sum_counted(max(pages, 0), max(size, 0), first_due)
        if pages <= 0:
            return
        self.stats.inc_value("incremental/schedule/not_due", pages)
        self.stats.inc_value("incremental/schedule/bytes_skipped", size)
        # One store query counted them: their hosts are not told apart.
        self.hosts.count(UNLISTED, "not_due", pages)
        self.hosts.count(UNLISTED, "bytes_skipped", size)
        if first_due:
            self.stats.min_value("incremental/schedule/first_due", first_due)
            self._first_due_elsewhere = min(self._first_due_elsewhere, first_due)

    def outcome(self, outcome: PageOutcome, key: PageKey) -> None:
        """What became of the page *key* requested this crawl: its answers
        merged (see the module docstring). An answer that replaces an
        earlier one counts that one replaced (``outcome_replaced/<outcome>``):
        the stats only go up; the report subtracts. In cluster mode the run
        merges the answers its workers get (:meth:`RunCounts.answer`)."""
        if self._answer_in_run(key, str(outcome)):
            return
        if outcome is not PageOutcome.FAILED and key in self._failed:
            # It answered after its failure: not failed in the end.
            self._failed.discard(key)
            self._count_answer(host_of(key.url), recovered=True)
        before = self._outcomes.get(key)
        if before is not None and not replaces(outcome, before):
            return
        self._outcomes[key] = outcome
        self._count_answer(host_of(key.url), counted=outcome, replaced=before)

    def unanswered(self, outcome: PageOutcome, key: PageKey) -> None:
        """What became of the page *key* when a request of it got no answer
        and the store records nothing (a redirect hop not fetched): its
        column unless an answer of this crawl gave it one already."""
        if self._answer_in_run(key, f"{RUN_UNANSWERED}{outcome}"):
            return
        if key not in self._outcomes:
            self.outcome(outcome, key)

    def failed(self, key: PageKey) -> None:
        """A page whose answer was a failure, recorded to be asked again (once per page)."""
        if self._answer_in_run(key, RUN_FAILED):
            return
        if key in self._failed:
            return
        self._failed.add(key)
        self._count_answer(host_of(key.url), failed=True)

    def _answer_in_run(self, key: PageKey, event: str) -> bool:
        """In cluster mode, count what the run says *event* changes in the
        page's column (whichever worker asked the page, and whichever got
        which of its answers); whether it did."""
        if self.run is None:
            return False
        reply = self.run.answer(key, event)
        if reply is None:
            return False  # Redis did not answer (the worker stops): counted here
        self.count_run_answer(host_of(key.url), reply)
        return True

    def count_taken_over(self, counts: dict[str, int]) -> None:
        """Count what the stats of the run's killed workers took with them
        (the worker that ends the run does: see
        ``ClusterCoordinator.settle_killed``): *counts* by stat name under
        ``incremental/schedule/``. The run knows no page's URL (a hash) nor
        why a page was requested: their pages are counted under
        :data:`~incremental_crawler.change.host_counts.UNLISTED`, and
        requested as ``requested_of_killed``."""
        for name, n in counts.items():
            if not n:
                continue
            self.stats.inc_value(f"incremental/schedule/{name}", n)
            event = _TAKEN_OVER_HOST_EVENTS.get(name)
            if event is not None:
                self.hosts.count(UNLISTED, event[0], event[1] * n)

    def hand_over_to_run(self) -> None:
        """Cluster mode: this worker's counts are not the run's (fenced:
        taken for dead, or its leaving not recorded), so the run counts its
        pages again, by the worker that gets them next or the one that ends
        the run, as a killed worker's. Its own crawl record keeps them
        apart, under ``cluster/handed_to_run/``, which ``scrapy state``
        does not sum: every page stays counted once."""
        prefix = "incremental/schedule/"
        stats, handed = {}, {}
        for name, value in self.stats.get_stats().items():
            if name.startswith(prefix) and name != f"{prefix}first_due":
                handed[name[len(prefix):]] = value
            else:
                stats[name] = value
        self.stats.set_stats(stats)
        for name, value in handed.items():
            self.stats.set_value(f"cluster/handed_to_run/{name}", value)
        self.stats.set_value("cluster/counts_handed_to_run", 1)
        # The per-host table leaves them out too; the conditional
        # middleware's counts there are this worker's own, and stay.
        self.hosts.drop(_SCHEDULE_HOST_EVENTS)

    def count_run_answer(self, host: str, reply: str) -> None:
        """Count what the run's merge of a page's answers tells this worker
        to (:meth:`RunCounts.answer`: its own answer, and what the answers
        of workers killed since lack), for the page's *host*."""
        counted, replaced, failed, recovered = reply.split(",")
        for outcome in filter(None, counted.split("+")):
            self._count_answer(host, counted=PageOutcome(outcome))
        for outcome in filter(None, replaced.split("+")):
            self._count_answer(host, replaced=PageOutcome(outcome))
        for _ in range(int(failed)):
            self._count_answer(host, failed=True)
        for _ in range(int(recovered)):
            self._count_answer(host, recovered=True)

    def _count_answer(self, host: str, *, counted: PageOutcome | None = None,
                      replaced: PageOutcome | None = None, failed: bool = False,
                      recovered: bool = False) -> None:
        if recovered:
            self.stats.inc_value("incremental/schedule/failed_recovered")
            self.hosts.count(host, "failed", -1)
        if failed:
            self.stats.inc_value("incremental/schedule/failed")
            self.hosts.count(host, "failed")
        if replaced is not None:
            self.stats.inc_value(f"incremental/schedule/outcome_replaced/{replaced}")
            self.hosts.count(host, f"outcome/{replaced}", -1)
        if counted is not None:
            self.stats.inc_value(f"incremental/schedule/outcome/{counted}")
            self.hosts.count(host, f"outcome/{counted}")


#: The per-host events of the schedule's columns (``requested/<why>``,
#: ``outcome/<outcome>``, the rest by name): a worker whose counts the run
#: counts again drops them (:meth:`ScheduleCounter.hand_over_to_run`).
_SCHEDULE_HOST_EVENTS = ("requested/", "outcome/", "failed", "not_due", "skipped_lastmod",
                         "bytes_skipped")


#: The per-host event (and its sign) of each stat the worker that ends a
#: run counts for its killed workers (:meth:`ScheduleCounter.count_taken_over`).
_TAKEN_OVER_HOST_EVENTS = {
    "not_due": ("not_due", 1), "not_due_left": ("not_due", -1),
    f"skipped/{Why.LASTMOD_UNCHANGED}": ("skipped_lastmod", 1),
    f"skipped_left/{Why.LASTMOD_UNCHANGED}": ("skipped_lastmod", -1),
    "bytes_skipped": ("bytes_skipped", 1), "bytes_skipped_left": ("bytes_skipped", -1),
}


#: The answers that found the page, strongest first: of a page's answers in
#: a crawl, the strongest is its column (see the module docstring).
SUCCESSES = (PageOutcome.NEW, PageOutcome.CHANGED, PageOutcome.PAGE_CHANGED,
             PageOutcome.UNCHANGED, PageOutcome.NOT_MODIFIED)
_STRENGTH = {outcome: len(SUCCESSES) - rank for rank, outcome in enumerate(SUCCESSES)}


def replaces(later: PageOutcome, earlier: PageOutcome) -> bool:
    """Whether a page's *later* answer this crawl takes the column of its *earlier* one.

    A stronger success replaces a weaker one, and a success replaces a
    non-success; a non-success replaces anything (the store keeps the last
    answer that is not a success):

    >>> replaces(PageOutcome.UNCHANGED, PageOutcome.CHANGED)
    False
    >>> replaces(PageOutcome.CHANGED, PageOutcome.UNCHANGED)
    True
    >>> replaces(PageOutcome.NOT_MODIFIED, PageOutcome.FAILED)
    True
    >>> replaces(PageOutcome.FAILED, PageOutcome.NEW)
    True
    >>> replaces(PageOutcome.GONE, PageOutcome.FAILED)
    True
    """
    if later is earlier:
        return False
    before, after = _STRENGTH.get(earlier, 0), _STRENGTH.get(later, 0)
    if before == 0 or after == 0:
        return True
    return after > before
