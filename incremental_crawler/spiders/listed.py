"""The base of spiders whose pages come from a dated list: sitemaps, feeds.

The list is fetched conditionally (a 304 list yields no work but the due
pages re-seeded at the end); each listed page is checked (sitemaps.org
limits, same host) and decided (:func:`~incremental_crawler.lists.sitemaps.decide`):
requested when it is new, when its listed date moved past the one stored
with our copy, when it is due for max age or for a retry, or when its date
does not vouch for it (not trusted, not a modification date) and its
revisit is due. A trusted modification date that did not move vouches for
our copy: the page is not requested, except for the rotating sample
(:mod:`incremental_crawler.change.sample`). Every listed page is counted
once (``incremental/schedule/...``), and each request carries its why.

A list read in full stores its membership (``PageState.listing``, a digest
of the URLs it lists) with its own state and with each page it lists (with
the page's visit, or alone when it is not visited). At re-seeding a page's
date vouches for it only while one of this crawl's lists has the membership
stored with the page (:meth:`ListedPagesSpider.lastmod_listed`): a page that
left its list goes by its revisit schedule. A list whose membership is not
on record (an index, or a list stored before memberships were) is read in
full when it answers 304.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

from scrapy import Request
from scrapy.exceptions import CloseSpider
from scrapy.http import TextResponse

from incremental_crawler import clock
from incremental_crawler.change.accounting import (
    META_LASTMOD_MODIFIED,
    META_LISTING,
    ScheduleCounter,
    Why,
    mark,
)
from incremental_crawler.change.policy import CrawlDueRules
from incremental_crawler.change.sample import RotatingSample
from incremental_crawler.crawl.conditional import page_context
from incremental_crawler.crawl.ledger import TXN_META
from incremental_crawler.exceptions import NotModified
from incremental_crawler.hosts import host_of
from incremental_crawler.lists.dates import parse_w3c_datetime
from incremental_crawler.lists.documents import gunzip, parse_listing
from incremental_crawler.lists.sitemaps import (
    NO_LISTING,
    Candidate,
    SitemapEntries,
    decide,
    listing_digest,
)
from incremental_crawler.meta import META_DISCOVERY, META_LASTMOD, META_REFRESH
from incremental_crawler.spiders.base import IncrementalSpider
from incremental_crawler.spiders.main_text import DEFAULT_TEXT_SELECTORS, extract_main_text
from incremental_crawler.state.keys import Canonicalizer
from incremental_crawler.state.records import PageFlags, PageKey, PageState
from incremental_crawler.state.stores import StateStoreError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable

    from scrapy.http import Response
    from twisted.python.failure import Failure

    from incremental_crawler.crawl.ledger import Ledger
    from incremental_crawler.lists.documents import Listing

__all__ = ["DEFAULT_TEXT_SELECTORS", "ListedPagesSpider", "extract_main_text"]

logger = logging.getLogger(__name__)

#: sitemaps.org: at most 50 MB (52,428,800 bytes) uncompressed per file.
MAX_LIST_BYTES = 52_428_800
#: A list whose dates are (nearly) all within this many seconds of the
#: fetch is stamping its generation time, not the pages' changes.
GENERATED_WINDOW = 300.0
GENERATED_SHARE = 0.9
GENERATED_MIN_ENTRIES = 10
#: Listed pages looked up in the store at a time.
_LOOKUP_CHUNK = 1000


class _Listed(NamedTuple):
    """A listed page kept for the rotating sample."""

    candidate: Candidate
    state: PageState
    callback: Callable[..., Any]


def _recheck(value: str | None) -> bool:
    if value is None:
        return False
    if str(value).strip().lower() == "all":
        return True
    raise ValueError(f"-a recheck={value!r}: the only value is all")


def _flag(value: str | bool, name: str) -> bool:
    if isinstance(value, bool):
        return value
    lowered = str(value).strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"-a {name}={value!r}: use true or false")


class ListedPagesSpider(IncrementalSpider):
    """Arguments (``-a``): ``text_selector`` (a CSS selector for the main
    content, tried before the defaults), ``use_lastmod`` (``true``/``false``:
    use the listed dates: a newer one asks for the page, a trusted
    modification date that did not move skips it; default true; with
    false, pages go by their revisit schedules), ``recheck`` (``all``:
    request every known page this crawl, conditionally, whatever its
    lastmod or schedule), ``allowed_hosts`` (comma-separated hosts besides
    the list's own whose URLs it may list)."""

    def __init__(
        self,
        text_selector: str | None = None,
        use_lastmod: str | bool = True,
        allowed_hosts: str = "",
        recheck: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.use_lastmod = _flag(use_lastmod, "use_lastmod")
        #: ``-a recheck=all`` (the ledger's recheck_all reads it).
        self.incremental_recheck_all = _recheck(recheck)
        self.allowed_hosts = [h.strip() for h in allowed_hosts.split(",") if h.strip()]
        self.text_selectors = (
            (text_selector, *DEFAULT_TEXT_SELECTORS) if text_selector else DEFAULT_TEXT_SELECTORS
        )
        #: Canonical URLs for a plain crawl (INCREMENTAL_ENABLED=False).
        self._canonical = Canonicalizer()
        #: Canonical URLs of the pages the lists named this crawl.
        self._decided: set[str] = set()
        #: A plain crawl's current list memberships (the ledger keeps an
        #: incremental crawl's: see :meth:`current`).
        self._listings: set[str] = set()

    def list_request(self, url: str, callback: Callable[..., Any],
                     lastmod: float | None = None) -> Request:
        """A sitemap or feed: conditional whatever its schedule, state saved at the end."""
        meta: dict[str, Any] = {META_DISCOVERY: True, "download_maxsize": MAX_LIST_BYTES}
        if lastmod is not None:
            meta[META_LASTMOD] = lastmod
        return Request(url, callback=callback, errback=self._list_failed, meta=meta)

    async def _list_failed(self, failure: Failure) -> AsyncIterator[Request]:
        """A list that answered 304 lists what it listed when last read in
        full: that membership is current this crawl, and an index's lists
        are as it named them then. One whose membership is not on record
        (stored before memberships were) is read in full."""
        if not failure.check(NotModified):
            return
        request = failure.request  # type: ignore[attr-defined]
        context = page_context(request)
        stored = context[1] if context is not None else None
        if stored is None or stored.listing is None:
            self.crawler.stats.inc_value("incremental/sitemap/reread_unknown_listing")
            yield self._read_in_full(request)
            return
        self.current(stored.listing)
        if stored.flags & PageFlags.HAS_LINKS:
            async for child in self._children_of(stored, request, set()):
                yield child

    async def _children_of(self, index: PageState, request: Request,
                           seen: set[PageKey]) -> AsyncIterator[Request]:
        """The lists an index that answered 304 names, as last read.

        A child the index dated (its stored lastmod is the one the index
        gives: the index did not change) is as it was when last read: its
        membership is current. A child the index gives no date, one whose
        membership is not on record or whose last visit failed, is
        requested (conditionally: a 304 is cheap). *seen*: the indexes met
        on the way (an index that names itself is read once).
        """
        ledger = self.ledger
        assert ledger is not None
        seen.add(index.key)
        try:
            record = await ledger.store.get_links(index.key)
        except StateStoreError as exc:
            ledger.store_failed(exc)
            raise CloseSpider("incremental_store_error") from exc
        locs = [line for line in (record or "").splitlines() if line]
        stored = await self.stored_states([
            Candidate(loc, ledger.canonical(loc), None) for loc in locs])
        for loc, state in zip(locs, stored, strict=True):
            if state is not None and state.key in seen:
                continue
            if (state is not None and state.listing is not None and not state.failures
                    and state.lastmod is not None):
                self.crawler.stats.inc_value("incremental/sitemap/child_unchanged")
                self.current(state.listing)
                if state.flags & PageFlags.HAS_LINKS:  # an index in an index
                    async for child in self._children_of(state, request, seen):
                        yield child
                continue
            meta = {key: value for key, value in request.meta.items()
                    if key in (META_DISCOVERY, "download_maxsize")}
            if state is not None and state.lastmod is not None:
                meta[META_LASTMOD] = state.lastmod
            yield request.replace(url=loc, meta=meta, headers=None)

    @staticmethod
    def _read_in_full(request: Request) -> Request:
        """*request* again without its conditions, to be read in full."""
        meta = {key: value for key, value in request.meta.items()
                if key in (META_DISCOVERY, META_LASTMOD, "download_maxsize")}
        meta[META_REFRESH] = True
        headers = request.headers.copy()
        for name in (b"If-None-Match", b"If-Modified-Since"):  # the 304's conditions
            headers.pop(name, None)
        return request.replace(meta=meta, headers=headers, dont_filter=True)

    def needs_reseed(self) -> bool:
        # A page no list read this crawl named (it left its list, or its
        # list was not read) may be due.
        return self.incremental_reseed

    @property
    def listings(self) -> set[str]:
        """The memberships (``PageState.listing``) of this crawl's current
        lists: read in full, or not read (304, unchanged in their index) and
        as last read in full."""
        ledger = self.ledger
        return ledger.listings if ledger is not None else self._listings

    def current(self, listing: str) -> None:
        """A list of this crawl is current, with membership *listing*."""
        ledger = self.ledger
        if ledger is not None:
            ledger.note_listing(listing)
        else:
            self._listings.add(listing)

    def lastmod_listed(self, state: PageState) -> bool:
        """Whether a list of this crawl still gives the page the date stored
        with it (the re-seeder asks before letting that date vouch)."""
        ledger = self.ledger
        return ledger is not None and ledger.listed(state)

    def reseed_skip(self, state: PageState) -> bool:
        # Pages a list named this crawl were decided already; lists are
        # reached from their own entry points, except one whose last visit
        # failed: the list naming it may answer 304 and not name it again.
        if state.key.url in self._decided:
            return True
        return state.callback in self.list_callbacks and not state.failures

    #: Callbacks that parse lists (never re-seeded as pages).
    list_callbacks: frozenset[str] = frozenset()

    #: Replay on 304 is not for these spiders: a list answering 304 is
    #: decided by its entries' lastmods and states, and its due pages are
    #: re-seeded (see the module docstring); its pages yield no requests.
    incremental_replay = False

    def entries(self, source_url: str,
                parse_date: Callable[[str | None], float | None] = parse_w3c_datetime,
                named_by: Iterable[str] = (),
                ) -> SitemapEntries:
        """The checks of one list's entries; *named_by*: hosts whose
        robots.txt named the list (sitemaps.org's cross-submission: it may
        list their URLs)."""
        ledger = self.ledger
        canonical = ledger.canonical if ledger is not None else self._canonical
        return SitemapEntries(source_url, self.crawler.stats, canonical,
                              allowed_hosts=[*self.allowed_hosts, *named_by],
                              parse_date=parse_date)

    def read_listing(self, response: Response) -> Listing | None:
        """What a list response lists (gunzipped within the list size
        limit), or ``None``; its faults counted and, when entries were
        skipped for them, one warning."""
        body = response.body
        # A body cut off in transfer (DOWNLOAD_FAIL_ON_DATALOSS off) or a
        # gzip file cut off: the last line of a text sitemap is a fragment.
        truncated = "dataloss" in response.flags
        if body[:3] == b"\x1f\x8b\x08":
            unzipped = gunzip(body, response.meta.get("download_maxsize", MAX_LIST_BYTES))
            if unzipped is None:
                return None
            body, complete = unzipped
            truncated = truncated or not complete
        listing = parse_listing(body, response.url, truncated=truncated)
        if listing is None:
            return None
        stats = self.crawler.stats
        if listing.recovered:
            stats.inc_value("incremental/sitemap/recovered")
        if listing.unproven:
            stats.inc_value("incremental/sitemap/loc_unproven", listing.unproven)
            logger.warning(
                "%(response)s is not well-formed: skipped %(n)d entries whose URL a "
                "recovering parse would have had to guess (cut off, or garbled)",
                {"response": response, "n": listing.unproven})
        if listing.bare_ampersands:
            stats.inc_value("incremental/sitemap/bare_ampersands", listing.bare_ampersands)
        if listing.ignored_lines:
            stats.inc_value("incremental/sitemap/lines_ignored", listing.ignored_lines)
        if listing.over_limit:
            stats.inc_value("incremental/sitemap/urls_over_limit", listing.over_limit)
        return listing

    async def stored_states(self, candidates: list[Candidate]) -> list[PageState | None]:
        ledger = self.ledger
        if ledger is None:  # a plain crawl: nothing is known
            return [None] * len(candidates)
        keys = [PageKey(ledger.scope, c.canonical) for c in candidates]
        try:
            stored = await ledger.store.get_pages(keys)
        except StateStoreError as exc:
            # The crawl stops (one ERROR line); the list is read again next time.
            ledger.store_failed(exc)
            raise CloseSpider("incremental_store_error") from exc
        return [stored.get(key) for key in keys]

    def read_in_full(self, response: Response | None, candidates: list[Candidate],
                     children: list[str] | None = None) -> str:
        """Note a list read in full: its membership (``PageState.listing``),
        current this crawl, stored with the list's state when the crawl
        finishes, as is an index's record of the lists it names
        (*children*, their URLs)."""
        listing = listing_digest(candidates)
        self.current(listing)
        txn = response.meta.get(TXN_META) if response is not None else None
        if txn is not None:
            txn.listing = listing
            txn.list_children = "\n".join(children) if children is not None else None
        return listing

    def not_a_list(self, response: Response) -> None:
        """Note a list that answered with something else (a 2xx that is no
        sitemap or feed): it lists nothing now, and an index's record of
        lists goes."""
        txn = response.meta.get(TXN_META)
        if txn is not None:
            txn.listing = NO_LISTING
            txn.list_children = None

    def due_rules(self) -> CrawlDueRules:
        """This crawl's rules (a plain crawl: every listed page is new)."""
        ledger = self.ledger
        if ledger is not None:
            return ledger.due_rules()
        now = clock.now()
        return CrawlDueRules(started=now, due_at=now, revisit=False)

    async def listed_requests(
        self, entries: SitemapEntries, candidates: list[Candidate],
        callback_for: Callable[[str], Callable[..., Any] | None],
        response: Response | None = None,
    ) -> AsyncIterator[Request]:
        """Requests for the listed pages worth fetching; see the module docstring.

        *response*: the list's, read in full; its membership
        (``PageState.listing``) is stored with it, and with each listed
        page whose stored one differs.
        """
        ledger = self.ledger
        if ledger is not None:
            # Before the membership is noted: in cluster mode a worker that
            # re-seeds meanwhile and sees the membership must also see that
            # this list decides its pages, or both decide (and count) them.
            ledger.note_decided([candidate.canonical for candidate in candidates])
        listing = self.read_in_full(response, candidates)
        now = clock.now()
        use_lastmod = ledger is not None and self.use_lastmod and await self._lastmods_trusted(
            ledger, entries.host, candidates, now
        )
        # A host on probation for stale lastmods: newer dates ask, none vouches.
        vouching = use_lastmod and ledger is not None and not ledger.trust.on_probation(
            ledger.trust.loaded(entries.host))
        share = ledger.config.lastmod_recheck_share if ledger is not None else 0.0
        sample: RotatingSample[_Listed] = RotatingSample(share, len(candidates))
        counter = ledger.counter if ledger is not None else ScheduleCounter(self.crawler.stats)
        rules = self.due_rules()
        # In chunks: memory holds one chunk's stored states (and the sample's
        # few), not a whole 50,000-URL sitemap's.
        for start in range(0, len(candidates), _LOOKUP_CHUNK):
            chunk = candidates[start:start + _LOOKUP_CHUNK]
            stored = await self.stored_states(chunk)
            # Counted in one batch (cluster mode: one round trip a chunk),
            # then yielded.
            requests: list[Request] = []
            with counter.batch():
                for candidate, state in zip(chunk, stored, strict=True):
                    self._decided.add(candidate.canonical)
                    if ledger is not None:
                        ledger.clock_skew.notice(state)
                    callback = callback_for(candidate.loc)
                    if callback is None:
                        continue  # not one of the crawl's pages
                    why = decide(candidate, state, use_lastmod=use_lastmod, rules=rules,
                                 vouching=vouching)
                    # The list's membership goes with a page it dates (a
                    # modification date): that date vouches while the list has it.
                    dates = listing if candidate.lastmod is not None and candidate.modified else (
                        NO_LISTING)
                    if state is not None and why in (Why.LASTMOD_UNCHANGED, Why.NOT_DUE):
                        other = state.listing != listing and state.listing in self.listings
                        moved = (state.listing or NO_LISTING) != dates
                        if ledger is not None and moved and not other:
                            # Not visited: the membership is stored alone (not
                            # over that of another list of this crawl naming it).
                            ledger.stage_listing(state.key, dates)
                        self._not_requested(_Listed(candidate, state, callback), why, sample,
                                            counter)
                        continue
                    counter.requested(why, host_of(candidate.loc), self._key(candidate), state)
                    requests.append(self._page_request(candidate, state, callback, why,
                                                       use_lastmod, listing))
            for request in requests:
                yield request
        sampled, rest = sample.take()
        with counter.batch():
            for listed in rest:
                self._skipped(listed.state, counter)
            for listed in sampled:
                counter.requested(Why.SAMPLED, host_of(listed.candidate.loc),
                                  self._key(listed.candidate), listed.state)
        for listed in sampled:
            yield self._page_request(*listed, Why.SAMPLED, use_lastmod, listing)

    def _not_requested(self, listed: _Listed, why: Why, sample: RotatingSample[_Listed],
                       counter: ScheduleCounter) -> None:
        """Count a page not requested; one its lastmod vouches for may yet be sampled."""
        if why is Why.NOT_DUE:
            counter.not_due(listed.state)
        elif (out := sample.offer(listed.state.last_checked, listed)) is not None:
            self._skipped(out.state, counter)

    def _skipped(self, state: PageState, counter: ScheduleCounter) -> None:
        counter.skipped(state)
        self.crawler.stats.inc_value("incremental/lastmod/skipped")

    def _page_request(self, candidate: Candidate, state: PageState | None,
                      callback: Callable[..., Any], why: Why, use_lastmod: bool,
                      listing: str) -> Request:
        """A listed page's request, decided already (its why in its meta)."""
        # The list's membership is stored with the page's visit, if it dates it.
        meta: dict[str, Any] = {META_LISTING: listing if candidate.lastmod is not None
                                and candidate.modified else NO_LISTING}
        if use_lastmod and candidate.lastmod is not None:
            meta[META_LASTMOD] = candidate.lastmod
            if candidate.modified:
                meta[META_LASTMOD_MODIFIED] = True
        key = self._key(candidate)
        if self.ledger is not None and key is not None:
            self.ledger.prefetched(key, state)
        request = Request(candidate.loc, callback=callback, meta=meta)
        mark(request, why, key)
        return request

    def _key(self, candidate: Candidate) -> PageKey | None:
        """The listed page's store key, as the request path keys it (``None``:
        a plain crawl, nothing is stored)."""
        ledger = self.ledger
        return None if ledger is None else PageKey(ledger.scope, candidate.canonical)

    async def _lastmods_trusted(
        self, ledger: Ledger, host: str, candidates: list[Candidate], now: float
    ) -> bool:
        trust = await ledger.trust.load(host)
        if not ledger.trust.trusted(trust, now):
            self.crawler.stats.inc_value("incremental/lastmod/distrusted_sitemaps")
            return False
        dated = [c.lastmod for c in candidates if c.lastmod is not None]
        generated = sum(1 for lastmod in dated if abs(now - lastmod) <= GENERATED_WINDOW)
        if len(dated) >= GENERATED_MIN_ENTRIES and generated >= GENERATED_SHARE * len(dated):
            # Every date is "now": the list stamps its generation time.
            ledger.trust.distrust(trust, now, "its dates are the time the list was made")
            self.crawler.stats.inc_value("incremental/lastmod/distrusted_sitemaps")
            return False
        return True

    def parse(self, response: Response) -> Iterable[dict[str, Any]]:
        if not isinstance(response, TextResponse):
            self.crawler.stats.inc_value("incremental/skipped_not_text")
            logger.info("Skipping %(url)s: not a text page", {"url": response.url})
            return
        yield {
            "url": response.url,
            "title": (response.css("title::text").get() or "").strip(),
            "text": extract_main_text(response, self.text_selectors),
        }
