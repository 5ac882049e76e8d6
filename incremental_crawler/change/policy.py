"""What change detection decides, apart from how it is plumbed into Scrapy.

Pure decisions over the stored records (:class:`PageState`, :class:`HostTrust`)
and the facts of one response, with the times passed in (``now``, the
crawl's start, the moment pages are due until); nothing here touches a
request, the store, the stats or the clock. The downloader middleware
(:mod:`.middleware`) reads the headers, asks :class:`ChangePolicy`, and
applies what it answers (stats, the host trust book, the ledger).

The values of the enums are the names of stats keys
(``incremental/requests/<reason>``, ``incremental/refetch/<reason>``,
``incremental/validators/<verdict>``): they never change.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from incremental_crawler.change.accounting import Why
from incremental_crawler.change.revisit import RevisitSchedule
from incremental_crawler.http.validators import parse_http_date, weak_match
from incremental_crawler.state.records import (
    HostTrust,
    PageFlags,
    PageKey,
    PageState,
    has_flag,
    is_gone,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Self

    from incremental_crawler.config import IncrementalConfig

__all__ = [
    "HOST_CONSULTED",
    "WHY_TABLE",
    "ChangePolicy",
    "CrawlDueRules",
    "Fetch",
    "Judgement",
    "NotDueBounds",
    "Outcome",
    "PageCase",
    "Refetch",
    "RequestReason",
    "Verdict",
    "answered",
    "failed_last",
    "final_outcome",
    "future_last_modified",
    "gone_due",
    "is_due",
    "known_date",
    "lastmod_flags",
    "links_unknown",
    "max_age_due",
    "newer_date",
    "not_due_bounds",
    "recheck_due",
    "schedule_due",
    "schedule_why",
    "url_phase",
]


class RequestReason(StrEnum):
    """Why a request goes out with conditions, or without them."""

    #: Never stored: nothing to send.
    NEW = "new"
    #: Stored without an ETag or a Last-Modified: nothing to send.
    NO_VALIDATORS = "no_validators"
    #: The stored validators are sent (the only reason that sends them).
    CONDITIONAL = "conditional"
    #: The request asked for a full fetch (META_REFRESH).
    REFRESH = "refresh"
    #: The requests the page yields are not all stored (stored before replay
    #: on 304 existed, or one could not be recorded or rebuilt): a 304 would
    #: hide its links, so its callback must run.
    LINKS_UNKNOWN = "links_unknown"
    #: The last full fetch is older than INCREMENTAL_MAX_AGE.
    MAX_AGE = "max_age"
    #: The host's validators lied: its pages are fetched in full.
    HOST_LYING = "host_lying"
    #: The page's sampled full fetch (INCREMENTAL_RECHECK_EVERY).
    SAMPLE = "sample"


#: Reasons decided with the host's trust: a distrust whose time is up ends
#: when one of them is given (HostTrustBook.validators_trusted).
HOST_CONSULTED = frozenset(
    {RequestReason.CONDITIONAL, RequestReason.HOST_LYING, RequestReason.SAMPLE}
)


class Refetch(StrEnum):
    """Why a 304 is not taken: the page is asked for again, in full."""

    #: A 304 to a request that sent none of our conditions.
    UNSOLICITED = "unsolicited_304"
    #: The conditions sent were not the stored validators (the user's own).
    FOREIGN_CONDITIONS = "foreign_conditions_304"
    #: The stored response came with ``Vary: *``.
    VARY_STAR = "vary_star_304"
    #: The sitemap or feed says the page changed since we stored it.
    LASTMOD_CONTRADICTS = "lastmod_contradicts_304"
    #: The 304 names another representation than the one stored.
    ETAG_MISMATCH = "etag_mismatch_304"
    #: Asked by date only, the 304 says the page was modified after it.
    LAST_MODIFIED_LATER = "last_modified_later_304"


class Verdict(StrEnum):
    """What a response says about a page's validators (reported per host)."""

    #: They changed with the content, or held with it (and every 304).
    RELIABLE = "reliable"
    #: They changed while the content did not.
    UNSTABLE = "unstable"
    #: The content changed behind unchanged validators.
    LYING = "lying"
    #: The response had none.
    ABSENT = "absent"


class Outcome(StrEnum):
    """What a page's final answer (after every retry) was, when it was no page."""

    #: No HTTP answer (network error, timeout: status 0), a 5xx, a 408,
    #: 429, 401 or 403, or a truncated body: counted as failed.
    FAILED = "failed"
    #: Any other 4xx, 404 and 410 among them: the server's answer, not a
    #: failure, but the page has no data this crawl either.
    ANSWERED = "answered"


#: 4xx answers that say "not now" or "not you" rather than "no such page".
_FAILED_4XX = frozenset({401, 403, 408, 429})


def final_outcome(status: int, *, truncated: bool = False) -> Outcome | None:
    """How a final answer is recorded; ``None``: it is not a failure record.

    *status* 0 stands for no HTTP answer at all. 2xx (complete), 304 and
    3xx answers are recorded elsewhere (the page's data or a check).

    >>> [str(final_outcome(s)) for s in (0, 200, 304, 404, 410, 403, 503)]
    ['failed', 'None', 'None', 'answered', 'answered', 'failed', 'failed']
    >>> str(final_outcome(200, truncated=True))
    'failed'
    """
    if truncated or status == 0 or status >= 500 or status in _FAILED_4XX or status == 206:
        return Outcome.FAILED
    if status >= 400:
        return Outcome.ANSWERED
    return None


@dataclass(frozen=True, slots=True)
class Judgement:
    """A response's verdict on a page's validators, and where it leaves the page."""

    #: ``None``: nothing to judge (a sitemap or feed, or nothing to compare with).
    verdict: Verdict | None = None
    #: Whether the page is flagged unstable after this response (a 304:
    #: ``False``, its validators held; its stored flag waits for a full fetch).
    unstable: bool = False
    #: Full fetches in a row whose validators churned (full fetches only).
    churns: int = 0
    #: Flagged unstable by this response.
    flagged: bool = False
    #: The content changed and the validators with it: the evidence that
    #: re-trusts a host caught lying.
    consistent: bool = False

    @property
    def judged(self) -> bool:
        """Whether the page counts towards its host's share of unstable pages."""
        return self.verdict is not None and self.verdict is not Verdict.ABSENT


@dataclass(frozen=True, slots=True)
class Fetch:
    """A full (2xx) response, as far as the policy needs it."""

    key: PageKey
    #: Validators well formed and believable (see future_last_modified).
    etag: str | None
    last_modified: str | None
    #: Of the raw body (noise included: the items decide on the content).
    fingerprint: str
    size: int
    status: int
    #: The response came with ``Vary: *``.
    vary_star: bool = False
    #: The lastmod the request's sitemap or feed announced (META_LASTMOD).
    lastmod: float | None = None
    #: The spider method parsing the page, to re-seed it.
    callback: str | None = None
    #: A sitemap or feed (META_DISCOVERY), not one of the site's pages.
    discovery: bool = False
    #: The rest of the page's request, to re-seed it (links.recipes.own_recipe).
    recipe: str | None = None
    #: ``lastmod`` is a modification date (a sitemap ``<lastmod>``, an Atom
    #: ``<updated>``), not a publication date.
    lastmod_modified: bool = False
    #: The membership digest of the list that gave ``lastmod`` (META_LISTING).
    listing: str | None = None

    @property
    def validators(self) -> tuple[str | None, str | None]:
        return self.etag, self.last_modified


def recheck_due(url: str, visit: int, every: int) -> bool:
    """Whether *visit* (1 = the first) of *url* is its sampled full fetch.

    One visit in every *every* consecutive ones, at a phase set by the URL's
    path and query (not its host or port: pages of one host spread evenly).
    The bound this gives is in the docstring of :mod:`.trust`.

    >>> [v for v in range(1, 9) if recheck_due("http://h/a", v, 4)]
    [4, 8]
    >>> recheck_due("http://h/a", 3, 0)
    False
    """
    if every <= 0:
        return False
    parts = urlsplit(url)
    phase = zlib.crc32(f"{parts.path}?{parts.query}".encode()) % every
    return (visit + phase) % every == 0


def url_phase(url: str) -> float:
    """A number in [0, 1) fixed by *url*'s path and query (not its host or port).

    >>> 0 <= url_phase("http://h/a?b") < 1, url_phase("http://h/a") == url_phase("http://g/a")
    (True, True)
    """
    parts = urlsplit(url)
    return zlib.crc32(f"{parts.path}?{parts.query}".encode()) / 2**32


def is_due(next_visit: float, due_at: float) -> bool:
    """Whether a page whose next visit is *next_visit* is due in a crawl.

    *due_at* is the crawl's start plus INCREMENTAL_DUE_TOLERANCE (infinite
    under INCREMENTAL_RECHECK_ALL): whether a page is due is the same at
    every moment of the crawl. A next visit of 0 (never scheduled) is due.
    """
    return next_visit <= due_at


def schedule_due(state: PageState, due_at: float, checked_by: float = math.inf) -> bool:
    """Whether *state*'s schedule makes its page due in a crawl.

    Its next visit is not after *due_at* (see :func:`is_due`), or its last
    check is after *checked_by*: stored by a clock that was fast then
    (:mod:`.skew`), it happened at some moment before now that no one knows,
    so the next visit counted from it says nothing: the page is due.

    >>> page = PageState(PageKey("s", "http://h/a"), last_checked=500, next_visit=600)
    >>> schedule_due(page, 599), schedule_due(page, 600), schedule_due(page, 0, checked_by=499)
    (False, True, True)
    """
    return is_due(state.next_visit, due_at) or state.last_checked > checked_by


def max_age_due(url: str, last_fetched: float, *, max_age: float, jitter: float,
                started: float) -> bool:
    """Whether the page's forced full fetch (INCREMENTAL_MAX_AGE) falls due this crawl.

    Once its last full fetch is older, at the crawl's start, than
    ``max_age * (1 - jitter * u)``, ``u`` = :func:`url_phase`: pages fetched
    on one day fall due over ``jitter * max_age`` instead of on one day.

    >>> max_age_due("http://h/a", 0, max_age=100, jitter=0, started=101)
    True
    >>> max_age_due("http://h/a", 0, max_age=0, jitter=0, started=10**9)
    False
    """
    if not max_age:
        return False
    age = started - last_fetched
    # The bound lies between max_age and max_age * (1 - jitter) (u in [0, 1),
    # and rounding keeps the products in order): outside of them the answer
    # is known without url_phase, which splits the URL (most pages of a
    # re-crawl are far younger than their max age).
    low, high = sorted((max_age, max_age * (1 - jitter)))
    if age <= low:
        return False
    if age > high:
        return True
    return age > max_age * (1 - jitter * url_phase(url))


def failed_last(state: PageState) -> bool:
    """Whether the page's last visit ended without its content: a failure
    (no answer, 5xx, 429, 401, 403, a truncated body), a 404/410, or a page
    whose callback or items failed (its record kept the old status).

    Every such outcome is recorded with ``failures`` counted up, and every
    2xx or 304 taken sets it back to 0, so the counter, not the status,
    tells. Such a page may have no data (a listed page that never answered
    2xx): it is not new, it is retried when its next visit is due, and no
    lastmod vouches for it.
    """
    return state.failures > 0


def answered(state: PageState) -> bool:
    """Whether the page's last answer was a 2xx or a 304 taken: our copy is the page."""
    status = state.last_status
    return (status is not None and (200 <= status < 300 or status == 304)
            and not failed_last(state))


# -- which known pages a crawl requests, and why: one table --------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CrawlDueRules:
    """One crawl's terms for its known pages: its moment and the settings
    that decide whether a page is requested (read by :data:`WHY_TABLE`)."""

    #: The crawl's start (cluster mode: the run's), the base of max age.
    started: float
    #: Pages whose next visit is not after this are due (see :func:`is_due`).
    due_at: float
    #: Pages whose last check is after this are due: checked "in the
    #: future", by a clock that was fast (see :func:`schedule_due`).
    checked_by: float = math.inf
    #: INCREMENTAL_RECHECK_ALL (or ``-a recheck=all``).
    recheck_all: bool = False
    #: INCREMENTAL_REVISIT_ENABLED: without it, nothing is ever "not due".
    revisit: bool = True
    #: INCREMENTAL_MAX_AGE (0: never forced) and INCREMENTAL_MAX_AGE_JITTER.
    max_age: float = 0.0
    jitter: float = 0.0

    def too_old(self, state: PageState) -> bool:
        return max_age_due(state.key.url, state.last_fetched, max_age=self.max_age,
                           jitter=self.jitter, started=self.started)

    def due(self, state: PageState) -> bool:
        return schedule_due(state, self.due_at, self.checked_by)


def known_date(state: PageState) -> float | None:
    """The latest date we know *state*'s page by, that a listed date must
    pass to be newer: the date stored with it; for a GONE page, at least
    when it was last checked (a CMS may bump a page's date when it deletes
    it, and that date is older than the check that found it gone).

    >>> page = PageState(PageKey("s", "http://h/a"), lastmod=10, last_checked=50)
    >>> known_date(page), known_date(page.copy(flags=PageFlags.GONE))
    (10, 50)
    """
    if is_gone(state):
        return max(state.lastmod or 0.0, state.last_checked)
    return state.lastmod


def newer_date(state: PageState, lastmod: float | None) -> bool:
    """Whether a request's *lastmod* (META_LASTMOD) is newer than
    :func:`known_date` (any is, when no date is known)."""
    known = known_date(state)
    return lastmod is not None and (known is None or lastmod > known)


@dataclass(frozen=True, slots=True)
class PageCase:
    """One known page in one crawl: what the rows of :data:`WHY_TABLE` test."""

    stored: PageState
    rules: CrawlDueRules
    #: A (trusted) date newer than :func:`known_date`: a list's, or the request's own.
    newer: bool = False
    #: A trusted modification date (listed now, or recorded with the page)
    #: says our copy is current.
    vouched: bool = False
    #: Asked for whatever its schedule: an explicit refresh (META_REFRESH),
    #: a sitemap or feed (META_DISCOVERY).
    forced: bool = False
    #: The requests the page yields are not all stored (:func:`links_unknown`):
    #: skipping it would hide the pages it leads to.
    links_unknown: bool = False

    @property
    def due(self) -> bool:
        """Its next visit is due (see :func:`schedule_due`), or it is forced."""
        return self.forced or self.rules.due(self.stored)


#: Why a known page is requested this crawl, or why not: the first row
#: whose test holds, read top to bottom. The request path (a request that
#: reaches the conditional middleware undecided: :meth:`ChangePolicy.due`)
#: and the deciders ahead of it (a list's entries, :func:`decide`; the
#: re-seeder's due pages) ask the same rows through :func:`schedule_why`;
#: a page is requested unless its why says not (:attr:`Why.requested`).
WHY_TABLE: tuple[tuple[Callable[[PageCase], bool], Why], ...] = (
    # A GONE page comes before all the rest: asked again, as new (no
    # conditions: it is new if it answers), only when its (rare) next visit
    # is due (INCREMENTAL_GONE_RECHECK after it was found gone), or a date
    # newer than any we know of it (see known_date) says it may have come
    # back. Nothing else brings it back: not revisits, max age or recheck
    # all's schedule (recheck all makes every next visit due anyway).
    (lambda case: is_gone(case.stored) and case.newer, Why.LASTMOD_NEWER),
    (lambda case: is_gone(case.stored) and case.due, Why.NEW),
    (lambda case: is_gone(case.stored), Why.NOT_DUE),
    # A page whose last answer failed (see failed_last) is retried when due,
    # data or not; nothing else asks for it (no date, no max age).
    (lambda case: failed_last(case.stored) and case.due, Why.RETRY),
    (lambda case: failed_last(case.stored), Why.NOT_DUE),
    # A page without data (no fingerprint) is new: always requested.
    (lambda case: case.stored.fingerprint is None, Why.NEW),
    # Then recheck all, the forced full fetch after INCREMENTAL_MAX_AGE, and
    # a newer date: they override the schedule.
    (lambda case: case.rules.recheck_all, Why.RECHECK),
    (lambda case: case.rules.too_old(case.stored), Why.MAX_AGE),
    (lambda case: case.newer, Why.LASTMOD_NEWER),
    # A vouching date, for a page whose last answer was a 2xx or 304 taken
    # (our copy is the page): not requested, whatever its schedule.
    (lambda case: case.vouched and answered(case.stored), Why.LASTMOD_UNCHANGED),
    # The revisit schedule (without revisits, every page is due); unknown
    # links make a page due too.
    (lambda case: case.due or case.links_unknown or not case.rules.revisit, Why.DUE),
    (lambda case: True, Why.NOT_DUE),
)


def schedule_why(stored: PageState, rules: CrawlDueRules, *, newer: bool = False,
                 vouched: bool = False, forced: bool = False,
                 links_unknown: bool = False) -> Why:
    """Why a known page is requested this crawl, or why not: the first row
    of :data:`WHY_TABLE` that holds for it (see :class:`PageCase` for the
    arguments).

    >>> rules = CrawlDueRules(started=0, due_at=100)
    >>> page = PageState(PageKey("s", "http://h/a"), fingerprint="f", last_status=200,
    ...                  next_visit=200)
    >>> [str(schedule_why(page, rules, **facts)) for facts in (
    ...     {}, {"newer": True}, {"vouched": True}, {"forced": True})]
    ['not_due', 'lastmod_newer', 'lastmod_unchanged', 'due']
    """
    case = PageCase(stored, rules, newer=newer, vouched=vouched, forced=forced,
                    links_unknown=links_unknown)
    return next(why for holds, why in WHY_TABLE if holds(case))


@dataclass(frozen=True, slots=True)
class NotDueBounds:
    """How long known pages that are not due (asked for plainly: nothing
    forces them, no date comes with them) stay so while nothing is written
    to them: in every crawl whose ``due_at`` is before :attr:`due_before`,
    whose start is before :attr:`started_before` and whose ``checked_by``
    is at least :attr:`checked_upto` (see :class:`CrawlDueRules`), and
    which neither rechecks all nor runs without revisits.

    :func:`not_due_bounds` gives a page's; :meth:`join` those of several
    pages (all of them not due). Nothing else in :data:`WHY_TABLE` moves
    with time: a page's flags, fingerprint and failures change only when
    it is written.
    """

    #: The earliest next visit: it falls due once a crawl's ``due_at`` reaches it.
    due_before: float = math.inf
    #: The earliest moment a page's forced full fetch (max age) may fall
    #: due, less a second (a margin for the rounding of times as floats).
    started_before: float = math.inf
    #: The latest last check: a crawl whose clock puts it in the future
    #: (:func:`schedule_due`) takes the page for due.
    checked_upto: float = -math.inf

    def join(self, other: NotDueBounds) -> NotDueBounds:
        return NotDueBounds(min(self.due_before, other.due_before),
                            min(self.started_before, other.started_before),
                            max(self.checked_upto, other.checked_upto))

    def hold(self, rules: CrawlDueRules) -> bool:
        """Whether pages within these bounds are still not due under *rules*."""
        return (not rules.recheck_all and rules.revisit and rules.due_at < self.due_before
                and rules.started < self.started_before
                and rules.checked_by >= self.checked_upto)


def not_due_bounds(stored: PageState, rules: CrawlDueRules, *,
                   links_unknown: bool = False) -> NotDueBounds | None:
    """How long *stored*'s page stays not due (see :class:`NotDueBounds`),
    asked for plainly; ``None`` when it is due under *rules* now.

    Read off :data:`WHY_TABLE`'s rows: a GONE page or one whose last answer
    failed waits for its next visit alone (nothing else asks for it); any
    other, for its next visit and, with a max age, for its last full fetch
    to grow older than the bound :func:`max_age_due` sets for its URL.

    >>> rules = CrawlDueRules(started=0, due_at=100, max_age=1_000)
    >>> page = PageState(PageKey("s", "http://h/a"), fingerprint="f", last_status=200,
    ...                  next_visit=200, last_checked=50, last_fetched=40)
    >>> not_due_bounds(page, rules)
    NotDueBounds(due_before=200, started_before=1039.0, checked_upto=50)
    >>> not_due_bounds(page, CrawlDueRules(started=0, due_at=200)) is None
    True
    """
    if schedule_why(stored, rules, links_unknown=links_unknown) is not Why.NOT_DUE:
        return None
    started_before = math.inf
    if not (is_gone(stored) or failed_last(stored)) and rules.max_age:
        # max_age_due is False while the page's age is at most the low end
        # of its bounds, or at most its URL's own bound (and the high end).
        max_age, jitter = rules.max_age, rules.jitter
        low, high = sorted((max_age, max_age * (1 - jitter)))
        own = max_age * (1 - jitter * url_phase(stored.key.url)) if low < high else low
        started_before = stored.last_fetched + max(low, min(own, high)) - 1.0
    return NotDueBounds(stored.next_visit, started_before, stored.last_checked)


def gone_due(state: PageState, *, due_at: float, lastmod: float | None = None,
             checked_by: float = math.inf) -> bool:
    """Whether a GONE page is asked again when something names it this crawl
    (the first rows of :data:`WHY_TABLE`), with the date *lastmod*.

    >>> page = PageState(PageKey("s", "http://h/a"), flags=PageFlags.GONE, next_visit=100,
    ...                  last_checked=50)
    >>> gone_due(page, due_at=99), gone_due(page, due_at=100), gone_due(page, due_at=0, lastmod=60)
    (False, True, True)
    >>> gone_due(page.copy(lastmod=10), due_at=0, lastmod=40)
    False
    """
    rules = CrawlDueRules(started=0.0, due_at=due_at, checked_by=checked_by)
    return schedule_why(state, rules, newer=newer_date(state, lastmod)).requested


#: Clock skew tolerated between a Last-Modified and the server's Date.
_CLOCK_SKEW = 60.0
#: How far a Last-Modified may be ahead of our own clock. A server whose
#: clock is fast sends a Date as far ahead as its Last-Modified, so the check
#: against its Date passes; once its clock is put right, that date sent back
#: as If-Modified-Since would make it answer 304 to every change until the
#: real time catches up with it. A day: a local clock slow by up to a day
#: (a wrong time zone is at most 14 hours) still takes correct dates, and a
#: fast server's date taken within it hides changes for less than a day.
OWN_CLOCK_TOLERANCE = 86_400.0


def future_last_modified(last_modified: str, date: str | bytes | None, now: float) -> bool:
    """Whether *last_modified* is ahead of the server's clock (its *date*,
    else *now*) or of ours (*now*, by more than :data:`OWN_CLOCK_TOLERANCE`).

    RFC 9110 §8.8.2.1: an origin server must not send a Last-Modified later
    than its Date. One that does is not stored: it would make every later
    change answer 304. Neither is one a year ahead with a Date a year ahead
    (a server's clock that is fast): it would do the same once that clock
    is right.

    >>> date = "Sun, 06 Nov 1994 08:49:37 GMT"
    >>> future_last_modified(date, None, 0.0), future_last_modified(date, date, 7.9e8)
    (True, False)
    >>> future_last_modified(date, date, 0.0)  # the server's Date as fast as its date
    True
    """
    modified = parse_http_date(last_modified)
    if modified is None:
        return False
    server_now = parse_http_date(date) or now
    return modified > server_now + _CLOCK_SKEW or modified > now + OWN_CLOCK_TOLERANCE


def _later(last_modified: str | None, than: str | None) -> bool:
    """Whether the HTTP-date *last_modified* is after *than* (both given and dates)."""
    when, before = parse_http_date(last_modified), parse_http_date(than)
    return when is not None and before is not None and when > before


def _lastmod_moved(lastmod: float | None, prior: PageState) -> bool:
    """Whether the sitemap's *lastmod* is newer than the one stored with the page."""
    return lastmod is not None and prior.lastmod is not None and lastmod > prior.lastmod


def links_unknown(prior: PageState | None, *, replay: bool) -> bool:
    """Whether a 304 (or a skipped visit) could not stand for the page's links.

    Only where links are replayed (*replay*): a page whose yielded requests
    were never recorded (no LINKS_KNOWN: stored by an earlier version, or
    while replay was off) or not all of them (LINKS_INCOMPLETE).
    """
    if not replay or prior is None:
        return False
    flags = prior.flags
    return (not has_flag(flags, PageFlags.LINKS_KNOWN)
            or has_flag(flags, PageFlags.LINKS_INCOMPLETE))


def _is_unstable(state: PageState) -> bool:
    return bool(state.flags & PageFlags.UNSTABLE_VALIDATORS)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangePolicy:
    """The decisions; see the module docstring. Durations in seconds."""

    #: INCREMENTAL_MAX_AGE (0: never forced).
    max_age: float
    #: INCREMENTAL_UNSTABLE_AFTER.
    unstable_after: int
    #: INCREMENTAL_RECHECK_EVERY (0: no sampled full fetches).
    recheck_every: int
    #: The revisit schedule, ``None`` without revisits.
    schedule: RevisitSchedule | None
    #: INCREMENTAL_MAX_AGE_JITTER (see :func:`max_age_due`).
    max_age_jitter: float = 0.0

    @classmethod
    def from_config(cls, config: IncrementalConfig) -> Self:
        return cls(
            max_age=config.max_age, unstable_after=config.unstable_after,
            recheck_every=config.recheck_every,
            schedule=RevisitSchedule.from_config(config) if config.revisit_enabled else None,
            max_age_jitter=config.max_age_jitter,
        )

    # -- before the request ------------------------------------------------

    def why(self, prior: PageState, *, refresh: bool = False, discovery: bool = False,
            lastmod: float | None = None, links_unknown: bool = False, started: float,
            due_at: float, checked_by: float = math.inf, recheck_all: bool = False) -> Why:
        """Why a request's known page is requested in this crawl, or why not
        (:data:`WHY_TABLE`, as for a list's entries and the re-seeder's pages).

        *started* is the crawl's start, *due_at* the moment next visits are
        due until (see :func:`is_due`), *checked_by* the latest believable
        last check (see :func:`schedule_due`). An explicit refresh and a
        sitemap or feed are requested whatever the schedule (*forced*); a
        request's own *lastmod* newer than the page's (:func:`newer_date`)
        and unknown links (see :func:`links_unknown`: skipping the page
        would hide the pages it leads to) ask for it too.
        """
        rules = CrawlDueRules(started=started, due_at=due_at, checked_by=checked_by,
                              recheck_all=recheck_all, revisit=self.schedule is not None,
                              max_age=self.max_age, jitter=self.max_age_jitter)
        return schedule_why(prior, rules, newer=newer_date(prior, lastmod),
                            forced=refresh or discovery, links_unknown=links_unknown)

    def due(self, prior: PageState, *, refresh: bool = False, discovery: bool = False,
            lastmod: float | None = None, links_unknown: bool = False, started: float,
            due_at: float, checked_by: float = math.inf) -> bool:
        """Whether the page may be requested in this crawl: its :meth:`why`
        says so (:attr:`Why.requested`)."""
        return self.why(prior, refresh=refresh, discovery=discovery, lastmod=lastmod,
                        links_unknown=links_unknown, started=started, due_at=due_at,
                        checked_by=checked_by).requested

    def request_reason(self, prior: PageState | None, *, refresh: bool = False,
                       links_unknown: bool = False, host: HostTrust | None = None, url: str,
                       now: float, started: float) -> RequestReason:
        """Whether the stored validators go out with the request, and why (not).

        *host* is the trust of the page's host (``None``: not known, trusted);
        *links_unknown* see :func:`links_unknown`; *started* is the crawl's
        start (max age is judged per crawl).
        """
        if prior is None or is_gone(prior):
            # A GONE page asked again is new if it answers: no conditions.
            return RequestReason.NEW
        if not prior.has_validators:
            return RequestReason.NO_VALIDATORS
        if refresh:
            return RequestReason.REFRESH
        if links_unknown:
            return RequestReason.LINKS_UNKNOWN
        if self._too_old(prior, started):
            # Some servers never change their validators while the content
            # does; a full fetch now and then catches it.
            return RequestReason.MAX_AGE
        if host is not None and host.validators_distrusted_until > now:
            # Its validators lied: every page in full, decided by fingerprint.
            return RequestReason.HOST_LYING
        if recheck_due(url, prior.checks + 1, self.recheck_every):
            return RequestReason.SAMPLE
        return RequestReason.CONDITIONAL

    def _too_old(self, prior: PageState, started: float) -> bool:
        return max_age_due(prior.key.url, prior.last_fetched, max_age=self.max_age,
                           jitter=self.max_age_jitter, started=started)

    # -- a 304 -------------------------------------------------------------

    def not_modified(self, prior: PageState | None, *, conditional: bool,
                     sent: tuple[str, str], lastmod: float | None = None,
                     etag: str | None = None,
                     last_modified: str | None = None) -> Refetch | None:
        """``None`` if a 304 stands for the stored page; else why to fetch it in full.

        *sent* is the If-None-Match and If-Modified-Since that went out
        ("" when absent), *etag* and *last_modified* the 304's own
        validators, parsed (a Last-Modified ahead of the server's clock
        left out).
        """
        if not conditional or prior is None:
            # An intermediary's, or our conditions were dropped: never an empty item.
            return Refetch.UNSOLICITED
        if sent != (prior.etag or "", prior.last_modified or ""):
            # The user's own conditions: the 304 does not vouch for what we hold.
            return Refetch.FOREIGN_CONDITIONS
        if prior.flags & PageFlags.VARY_STAR:
            # RFC 9110 §12.5.5: the response varies on things outside the
            # request, so a 304 is never trusted blindly.
            return Refetch.VARY_STAR
        if _lastmod_moved(lastmod, prior):
            # The sitemap says the page changed, the validators say not: one
            # of them is wrong, and only the content can tell which.
            return Refetch.LASTMOD_CONTRADICTS
        if etag and prior.etag and not weak_match(etag, prior.etag):
            # RFC 9111 §4.3.4: a 304 naming another representation selects
            # nothing we hold; update nothing and fetch it in full.
            return Refetch.ETAG_MISMATCH
        if not prior.etag and _later(last_modified, prior.last_modified):
            # Asked by date alone, "not modified since X" and "modified
            # after X" at once: the 304 contradicts itself, only the content
            # can tell. (Asked by ETag, the date is no condition: RFC 9110
            # §13.1.3, the server ignored If-Modified-Since.)
            return Refetch.LAST_MODIFIED_LATER
        return None

    @staticmethod
    def revalidated(prior: PageState, *, etag: str | None,
                    last_modified: str | None) -> tuple[str | None, str | None] | None:
        """The validators a 304 taken leaves stored; ``None``: those held, unchanged.

        RFC 9111 §4.3.4: the stored response takes up the validators the 304
        carries. Its Last-Modified replaces ours (asked by ETag, or by a date
        no later than it: :meth:`not_modified` refused a later one); its ETag
        is taken up when we held none (asked by date: the page is validated
        by the ETag from then on). An ETag we hold stays as it is: the 304's
        matched it (weakly, or :meth:`not_modified` refused it), and ours is
        what the server knows us by.

        >>> page = PageState(PageKey("s", "http://h/a"), etag='"x"', last_modified="A")
        >>> ChangePolicy.revalidated(page, etag='W/"x"', last_modified="B")
        ('"x"', 'B')
        >>> ChangePolicy.revalidated(page, etag=None, last_modified=None) is None
        True
        """
        held = (prior.etag, prior.last_modified)
        taken = (prior.etag or etag, last_modified or prior.last_modified)
        return None if taken == held else taken

    @staticmethod
    def held(*, discovery: bool = False) -> Judgement:
        """A 304 taken: the page's validators held (sitemaps and feeds are not judged)."""
        return Judgement() if discovery else Judgement(Verdict.RELIABLE)

    # -- a full (2xx) response ----------------------------------------------

    @staticmethod
    def body_changed(prior: PageState | None, fetch: Fetch) -> bool:
        return prior is None or prior.fingerprint != fetch.fingerprint

    def defers(self, prior: PageState | None, fetch: Fetch) -> bool:
        """Whether the verdict on the content waits for the page's items.

        A body that changed may be noise only (a timestamp, a token): what
        turns on the content (the schedule, the change counters, the evidence
        on lastmods and validators) waits until the page's items left the
        pipelines (PageTransaction.judge). New pages, unchanged bodies, and
        sitemaps and feeds (no items) are judged on their body at once.
        """
        return prior is not None and not fetch.discovery and self.body_changed(prior, fetch)

    @staticmethod
    def verdict(prior: PageState | None, fetch: Fetch, *, changed: bool) -> Verdict | None:
        """What a full fetch says about the page's validators.

        Validators that moved are judged on the response: they are unstable
        only when its body is the one stored, byte for byte; a body that
        moved with them (a text edit outside the user's items, a "generated
        at" footer) proves them right, whatever the items say. Validators
        that held are judged on the content (*changed*: the items say): a
        lie is a change a 304 would have hidden from them, and a body that
        moved with the same items behind them hides nothing (weak validators
        may even promise no more, RFC 9110 §8.8.1).
        """
        if fetch.discovery:
            return None  # sitemaps and feeds are not the site's pages
        if fetch.validators == (None, None):
            return Verdict.ABSENT
        if prior is None or not prior.has_validators:
            return None  # nothing to compare with yet
        if fetch.validators == (prior.etag, prior.last_modified):
            # Content moved behind the same validators: they lie. Content
            # that held is no evidence for a host caught lying: a liar sends
            # unchanged validators with unchanged content too.
            return Verdict.LYING if changed else Verdict.RELIABLE
        body_moved = prior.fingerprint != fetch.fingerprint
        return Verdict.RELIABLE if changed or body_moved else Verdict.UNSTABLE

    def judge(self, prior: PageState | None, fetch: Fetch, *, changed: bool) -> Judgement:
        """The verdict of a full fetch, and the page's churn count and flag after it."""
        verdict = self.verdict(prior, fetch, changed=changed)
        if prior is None:
            return Judgement(verdict)
        held = fetch.validators == (prior.etag, prior.last_modified)
        churns, unstable = self._churns(prior, verdict, held=held)
        flagged = (verdict not in (None, Verdict.ABSENT) and not unstable
                   and churns >= self.unstable_after)
        # The evidence that re-trusts a liar is a change of the content with
        # validators that moved: a body moving in its noise alone proves
        # nothing about the changes a 304 would hide.
        return Judgement(verdict, unstable or flagged, churns, flagged,
                         consistent=verdict is Verdict.RELIABLE and changed and not held)

    @staticmethod
    def _churns(prior: PageState, verdict: Verdict | None, *, held: bool) -> tuple[int, bool]:
        """``(churns, unstable)`` of the page, before flagging it."""
        if verdict is Verdict.UNSTABLE:
            return prior.churns + 1, _is_unstable(prior)
        if verdict in (Verdict.RELIABLE, Verdict.LYING) and held:
            return 0, False  # the validators held still: the run of churns is over
        return prior.churns, _is_unstable(prior)

    @staticmethod
    def unjudged(prior: PageState) -> Judgement:
        """The page as it was, while the verdict on its content waits."""
        return Judgement(unstable=_is_unstable(prior), churns=prior.churns)

    @staticmethod
    def tests_lastmod(prior: PageState, lastmod: float | None) -> bool:
        """Whether this visit tests the sitemap's *lastmod*: fetched because it moved.

        Only when our copy is older than the announced change: a newer copy
        is no evidence either way.
        """
        if lastmod is None or not _lastmod_moved(lastmod, prior):
            return False
        return prior.last_fetched < lastmod

    def next_visit(self, prior: PageState | None, *, changed: bool,
                   started: float) -> tuple[float, float] | None:
        """``(interval, next_visit)`` after a visit in the crawl that *started* then.

        Counted from the crawl's start, not the visit's moment: a page
        fetched late in a daily crawl is due in the next one. ``None``
        without revisits. Pages with a sitemap lastmod get the same
        schedule: it matters when their lastmod does not vouch for them
        (distrusted, not a modification date, switched off).
        """
        if self.schedule is None:
            return None
        return self.schedule.after_visit(prior.interval if prior else 0, changed=changed,
                                         now=started)

    def after_fetch(self, prior: PageState | None, fetch: Fetch, *, changed: bool,
                    judgement: Judgement, now: float, started: float) -> PageState:
        """The page's state after a full fetch at *now* whose content *changed* (or not).

        Its next visit is counted from *started*, the crawl's start.
        """
        interval, next_visit = (
            self.next_visit(prior, changed=changed, started=started) or (0, 0.0))
        vary = int(PageFlags.VARY_STAR if fetch.vary_star else 0)
        if prior is None:
            return PageState(
                fetch.key, fetch.etag, fetch.last_modified, fetch.fingerprint, fetch.size,
                fetch.status, first_seen=now, last_checked=now, last_fetched=now,
                last_changed=now, checks=1, changes=0, flags=lastmod_flags(vary, fetch),
                lastmod=fetch.lastmod,
                interval=interval, next_visit=next_visit, callback=fetch.callback,
                recipe=fetch.recipe, listing=fetch.listing,
            )
        unstable = PageFlags.UNSTABLE_VALIDATORS if judgement.unstable else PageFlags(0)
        # As ints: ``~`` of an IntFlag keeps only the bits it names, and would
        # clear any other bit the stored page carries.
        kept = int(prior.flags) & ~int(PageFlags.VARY_STAR | PageFlags.UNSTABLE_VALIDATORS)
        return prior.copy(
            etag=fetch.etag, last_modified=fetch.last_modified, fingerprint=fetch.fingerprint,
            size=fetch.size, last_status=fetch.status, last_checked=now, last_fetched=now,
            last_changed=now if changed else prior.last_changed,
            checks=prior.checks + 1, changes=prior.changes + changed,
            flags=lastmod_flags(kept | vary | unstable, fetch),
            lastmod=prior.lastmod if fetch.lastmod is None else fetch.lastmod,
            interval=interval, next_visit=next_visit, callback=fetch.callback,
            recipe=fetch.recipe, churns=judgement.churns, failures=0,
            listing=prior.listing if fetch.listing is None else fetch.listing,
        )


def lastmod_flags(flags: int, fetch: Fetch) -> int:
    """*flags* with LASTMOD_MODIFIED saying whether the lastmod stored is a modification date.

    A fetch without a lastmod keeps the stored one, and its flag.
    """
    if fetch.lastmod is None:
        return int(flags)
    if fetch.lastmod_modified:
        return int(flags) | PageFlags.LASTMOD_MODIFIED
    return int(flags) & ~int(PageFlags.LASTMOD_MODIFIED)
