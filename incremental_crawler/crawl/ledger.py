"""The ledger: commits a page's state only after that page's data is safe.

State is never ahead of data: the design rests on it. The downloader middleware computes the
new state of a page from a 2xx response but does not store it; it opens a
:class:`PageTransaction` on the request's meta instead. The spider
middleware counts the items the callback yields from that response; each
item then runs through *every* item pipeline (ours and the user's own).
Only when the callback has finished and every one of its items has been
scraped or deliberately dropped is the page state staged, behind the items'
own records. The store commits staged writes in order, atomically per flush,
so at no instant can a stored validator be ahead of its data: a kill -9 loses
at most both, and the next run fetches the page again.

If the callback raises, or an item fails in a pipeline (``item_error``), the
page state is withheld: the next run asks again with the old validators.
The page is recorded as a failure instead (:meth:`Ledger.record_failure`:
counters, status and the failure schedule, never a validator or a
fingerprint), so it is due on the next crawl even if the sitemap listing it
answers 304 then.

Sitemaps and feeds (discovery pages) are committed when the crawl finished,
and only if every page that failed this crawl (after retries) was recorded
so it can be requested again: a failure that could not be recorded (its
callback is not a method of the spider, its request cannot be rebuilt)
keeps their validators unsaved, and they are read in full next time.

Tombstones (:mod:`incremental_crawler.change.tombstones`) go through the
same signals: a gone page's tombstone is tracked from the moment it is
sent until it leaves the pipelines. Delivered (scraped, or dropped: a
decision), the ``deleted`` versions of the page's items are staged, then
the page's state flagged GONE, in one flush; an error withholds it all, and
the page is recorded as a failure, so the next crawl decides and sends it
again. A page gets one tombstone per crawl (per run in cluster mode),
however often it is asked (:meth:`Ledger.claim_tombstone`).

The requests the callback yields are recorded on the transaction too
(:class:`~incremental_crawler.recipes.LinkRecorder`), and their links
record is staged just before the page state, in the same flush: a 304 to
the page next time can then yield them again (replay on 304). A page whose
requests could not all be recorded is flagged LINKS_INCOMPLETE instead, and
is fetched in full next time.

While it runs, a crawl *holds* its scope in the store (a record that lapses
unless refreshed, see :data:`HOLD_TTL`), so that ``scrapy state`` refuses to
repair a scope under a running crawl; a killed crawl's hold lapses by
itself. When it ends, the crawl's summary (:class:`CrawlRecord`, from the
sources registered with :meth:`Ledger.add_record_source`) is staged and
committed with its last writes, before the hold is released.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import uuid
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from itemadapter import ItemAdapter
from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.extensions.feedexport import FeedExporter
from scrapy.http import Response
from scrapy.utils.asyncio import call_later, create_looping_call
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from twisted.internet.defer import Deferred

from incremental_crawler import clock
from incremental_crawler.change.accounting import PageOutcome, ScheduleCounter
from incremental_crawler.change.identity import ItemIdentity, serialize_item
from incremental_crawler.change.policy import CrawlDueRules
from incremental_crawler.change.revisit import failure_next_visit
from incremental_crawler.change.skew import ClockSkew, skew_tolerance
from incremental_crawler.change.tombstones import TombstoneSender
from incremental_crawler.change.trust import HostTrustBook
from incremental_crawler.config import IncrementalConfig, unknown_settings
from incremental_crawler.exceptions import ItemUnchanged, StoreUnavailable
from incremental_crawler.hosts import host_of
from incremental_crawler.lists.sitemaps import NO_LISTING
from incremental_crawler.recipes import (
    ADVICE,
    LinkRecorder,
    RecipeRules,
    Unbuildable,
    Unrecordable,
    fingerprint_canary,
    page_request,
)
from incremental_crawler.state.keys import Canonicalizer
from incremental_crawler.state.records import (
    Change,
    CrawlRecord,
    ItemRecord,
    PageFlags,
    PageKey,
    PageState,
    Undelivered,
    is_gone,
)
from incremental_crawler.state.scope_copy import refuse_a_crawl_of_a_partial_copy
from incremental_crawler.state.stores import StateStore, StateStoreError, open_store
from incremental_crawler.state.stores.base import (
    COPY_HOLD,
    REPAIR_HOLD,
    SHARED_HOLD,
    HoldLapsed,
    ScopeHeld,
    StoredStateDamaged,
    dead_pid,
    describe_holder,
    hold_process,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from twisted.python.failure import Failure

    from incremental_crawler.change.tombstones import Gone

__all__ = ["TXN_META", "Ledger", "PageTransaction"]

logger = logging.getLogger(__name__)

#: At most this many batched reads kept for their requests (a request that
#: is filtered out never takes its entry).
_PREFETCH_LIMIT = 10_000

#: Seconds a crawl's hold on its scope lasts unless refreshed (the flush loop
#: refreshes it every third of that, or of three flush intervals if longer):
#: long enough for a busy reactor to miss a refresh, short enough that a
#: killed crawl's scope can be repaired a minute later.
HOLD_TTL = 60.0

#: Versions read from the store at a time to be emitted again.
_REDELIVER_CHUNK = 500

#: Request meta key holding the open :class:`PageTransaction` of a response.
TXN_META = "_incremental_txn"

#: The flags that say what is known of a page's links; set afresh at each commit.
LINK_FLAGS = PageFlags.LINKS_KNOWN | PageFlags.HAS_LINKS | PageFlags.LINKS_INCOMPLETE


def _one_per_item(chunk: list[Undelivered]) -> list[list[Undelivered]]:
    """*chunk*'s versions, each alone, but a tombstone stored once per item
    key of its gone page (same time, same data) once, where it first comes."""
    groups: list[list[Undelivered]] = []
    tombstones: dict[tuple[float, str], list[Undelivered]] = {}
    for pending in chunk:
        version = pending.version
        if version.change != Change.DELETED:
            groups.append([pending])
            continue
        same = (version.stored_at, json.dumps(version.data, sort_keys=True, default=str))
        if same in tombstones:
            tombstones[same].append(pending)
        else:
            tombstones[same] = [pending]
            groups.append(tombstones[same])
    return groups


def _gone_lastmod(prior: PageState, listed: float | None) -> float | None:
    """The date recorded with a GONE page: the newest a list gave it.

    A list that dated the page when it was found gone (a CMS may bump the
    date when it deletes a page) asks for it again only with a newer date.
    """
    if listed is None or (prior.lastmod is not None and prior.lastmod >= listed):
        return prior.lastmod
    return listed


class PageTransaction:
    """The pending state of one fetched page, waiting for its items."""

    __slots__ = (
        "callback_called", "counted", "discovery", "done", "failed", "item_ids",
        "items_changed", "items_unchanged", "judge", "links", "list_children", "listing",
        "open_items", "outcome", "output_done", "prior", "state",
    )

    def __init__(self, state: PageState, *, discovery: bool = False,
                 links: LinkRecorder | None = None, prior: PageState | None = None,
                 counted: PageKey | None = None) -> None:
        self.state = state
        #: The page whose column in the crawl's accounting this answer
        #: decides (``None``: the state's own): the page a redirect chain
        #: started from is the one that was asked, and counted.
        self.counted = counted
        #: The page as stored before this fetch (``None``: not stored), for
        #: the failure record of a page whose state is withheld.
        self.prior = prior
        #: The requests the callback yielded, recorded to replay them on a
        #: 304 (``None``: not recorded, replay does not apply to the page).
        self.links = links
        #: Set by CallbackGuardMiddleware once every spider middleware let
        #: the response through to its callback (an errback's output after a
        #: rejected response must not commit the page).
        self.callback_called = False
        #: ids of the items yielded, to forget the pipelines' notes on them.
        self.item_ids: list[int] = []
        #: A page that lists other pages (a sitemap): its state waits for
        #: the crawl to finish, see Ledger._maybe_commit.
        self.discovery = discovery
        self.open_items = 0
        self.output_done = False
        self.failed: str | None = None
        self.done = False
        #: Items of the page that left the pipelines as new or changed, and
        #: that the FingerprintPipeline dropped as unchanged.
        self.items_changed = 0
        self.items_unchanged = 0
        #: Called with whether the page's content changed (its items say;
        #: without items, its raw body) just before its state is staged,
        #: and returning that state: for a raw body that changed, which
        #: noise alone may have done, the verdict on the content waits for
        #: the items (see ChangePolicy.defers); ``state`` is meanwhile the
        #: body's own.
        self.judge: Callable[[bool], PageState] | None = None
        #: The page's column in the crawl's accounting once it is stored
        #: (set with its state, or by ``judge``); a withheld page is counted
        #: as withheld instead.
        self.outcome: PageOutcome | None = None
        #: A list read in full: its membership (``PageState.listing``),
        #: stored with its state, and for an index, the lists it names (one
        #: URL a line), stored as its links record (``None``: not an index;
        #: a record it had is deleted).
        self.listing: str | None = None
        self.list_children: str | None = None

    def content_changed(self) -> bool:
        """Whether the page's content changed, for a body that did.

        Its items decide, as they do for the output (normalised, main
        content only); a page without items to tell falls back on its body.
        """
        return self.items_changed > 0 or self.items_unchanged == 0


class RunGate(Protocol):
    """What a run of several workers shares (cluster mode).

    Its unrecorded failures: a sitemap's state may be saved only when every
    page it listed that failed was recorded to be requested again, whichever
    worker fetched it. Its tombstones: one per page, whichever worker found
    the page gone. Its lists' memberships: the worker that re-seeds the due
    pages is not the one that read every list.
    """

    #: Failures of the run that could not be recorded, read when this worker
    #: left (None: unknown).
    run_unrecorded: int | None
    #: When the run started (its first worker's clock), once joined.
    run_started: float | None

    def note_unrecorded_failure(self) -> None:
        """A page of this worker failed and could not be recorded: count it for the run."""

    def claim_tombstone(self, key: PageKey) -> bool:
        """Whether this worker sends *key*'s tombstone: the run's first claim does.

        The run's requests that bypass its seen set (``dont_filter``: start
        requests, which every worker yields) may ask one page on two workers.
        """

    def note_listing(self, listing: str) -> None:
        """A list of this worker is current with membership *listing*: one for the run."""

    def run_listings(self) -> set[str] | None:
        """The memberships every worker of the run noted (``None``: unknown)."""

    def note_decided(self, urls: list[str]) -> None:
        """Pages (canonical URLs) a list of this worker named and decided."""

    def decided_in_run(self, urls: list[str]) -> list[bool] | None:
        """Which of *urls* a list of the run named and decided (``None``: unknown)."""

    def note_first_second_visit(self, key: PageKey) -> None:
        """This worker visited *key* in the second the run started in."""

    def first_second_visits(self) -> set[PageKey] | None:
        """The pages the run's workers visited in the second it started in
        (``None``: unknown)."""


class _Pending:
    """What the pipelines learnt about an item on its way through them."""

    __slots__ = ("change", "data", "fingerprint", "item", "key", "simhash")

    def __init__(self, item: Any) -> None:
        self.item = item
        self.key: str | None = None
        self.fingerprint: str | None = None
        self.data: str | None = None
        self.simhash: int | None = None
        #: New or changed, as the FingerprintPipeline found it.
        self.change: Change | None = None


class Ledger:
    """One per crawler: owns the state store and the page transactions."""

    #: The crawl's close was asked (its store failed).
    _close_asked = False

    def __init__(self, crawler: Crawler, config: IncrementalConfig, store: StateStore) -> None:
        self.crawler = crawler
        self.config = config
        self.store = store
        self.stats = crawler.stats
        #: Canonical URLs, shared by page keys and item keys.
        self.canonical = Canonicalizer()
        #: Set by the storage pipeline when it is enabled.
        self.stores_items = False
        #: Set by the cluster coordinator in cluster mode.
        self.run_gate: RunGate | None = None
        #: Why each known page was requested or not, for the whole crawl.
        self.counter = ScheduleCounter(crawler.stats)
        # This crawl's start (set again when the spider opens).
        self._started = clock.now()
        self._pending: dict[int, _Pending] = {}
        # Tombstones in the pipelines: by id (the item sent), and by page (a
        # pipeline may return a copy: item_scraped then has another object).
        self._tombstones: dict[int, tuple[Any, Gone]] = {}
        self._tombstone_pages: dict[PageKey, int] = {}
        #: Pages whose tombstone this crawl sent (or, in cluster mode, another
        #: worker of the run claimed): one per page, however often it is asked.
        self.tombstoned: set[PageKey] = set()
        self._discovered: list[PageTransaction] = []
        #: The memberships (PageState.listing) of this crawl's current lists:
        #: read in full, or not read (304, unchanged in their index) and as
        #: last read in full. A listed date vouches for a page only while one
        #: of them is that of the list that gave it (see :meth:`listed`).
        self.listings: set[str] = set()
        #: Vouched pages the re-seeder skipped, to move on by their
        #: interval when the crawl finishes: (key, next visit read, to).
        self._postpones: list[tuple[PageKey, float, int]] = []
        # Failures of this crawl that could not be recorded to be asked again.
        self._unrecorded = 0
        #: What a yielded request's recipe holds (DEPTH_PRIORITY, the timeout).
        self.recipe_rules = RecipeRules.from_crawler(crawler)
        #: What this crawl's links records carry to say which fingerprinter made them.
        self.links_canary = fingerprint_canary(crawler.request_fingerprinter.fingerprint)
        # Reasons already warned about: one warning per reason per crawl.
        self._warned: set[Unrecordable] = set()
        # With items kept only in feeds (buffered, uploaded at the end), page
        # state is committed once the feeds are closed; see spider_opened.
        self._hold_until_feeds: Deferred[None] | None = None
        #: This crawl's delivery id: the item versions it stores wait on it
        #: until its feeds closed cleanly ("": none kept, see spider_opened).
        self.delivery = ""
        # Fired when Scrapy's feed exporter closed its feeds (None: no feeds).
        self._feeds_closed: Deferred[None] | None = None
        # Versions emitted again and in the pipelines, by item id; their
        # ids by (item key, fingerprint) for a copy a pipeline returns.
        self._redelivering: dict[int, tuple[Any, list[Undelivered]]] = {}
        self._redelivering_ids: dict[tuple[str, str], int] = {}
        # The crawls whose versions this crawl emitted again.
        self._redelivered_from: set[str] = set()
        self._flushing = False
        self._failed = False
        self._task: Any = None
        #: States a list's batched lookup already read, for the page's
        #: request (saves the store a round trip per page); bounded.
        self._prefetched: dict[PageKey, PageState | None] = {}
        #: Pages this crawl visited whose next visit, counted from the
        #: crawl's start, is still within its due window (an interval not
        #: longer than INCREMENTAL_DUE_TOLERANCE): due in the next crawl, not
        #: again in this one (the re-seeder leaves them out).
        self.visited_due: set[PageKey] = set()
        #: Pages this crawl visited within the whole second it started in:
        #: stored in whole seconds, their last check looks like that of a
        #: previous crawl's visit in the same second (the re-seeder's count
        #: of the pages no one decided tells them apart with this). Few: one
        #: second's worth.
        self.visited_first_second: set[PageKey] = set()
        #: Page writes staged so far, and how many of them are committed
        #: (cluster mode releases a request only once its page is stored).
        self.staged = 0
        self.committed = 0
        self._flushing_upto = 0
        self._flush_done: Deferred[Any] | None = None
        #: Who this crawl is (set when the spider opens), and its name in its
        #: scope's holds (a worker's says that it shares the scope).
        self.holder = self.hold_name = ""
        self.hold_ttl = max(HOLD_TTL, 3 * config.flush_interval)
        self._held_at = 0.0
        self._hold_done: Deferred[Any] | None = None
        #: This worker's id in cluster mode ("": none), handed over by the
        #: coordinator when it joins its run, before the spider opens.
        self.worker = ""
        #: Why this ledger keeps nothing (see spider_for_component); None: it keeps state.
        self.aside: str | None = None
        #: Give this crawl's summaries when it ends (see add_record_source).
        self._record_sources: list[Callable[[str], Iterable[CrawlRecord]]] = []
        #: Stage their own writes when it ends (see add_closing_writer).
        self._closing_writers: list[Callable[[str], None]] = []
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(self.item_scraped, signal=signals.item_scraped)
        crawler.signals.connect(self.item_dropped, signal=signals.item_dropped)
        crawler.signals.connect(self.item_error, signal=signals.item_error)
        crawler.signals.connect(self.spider_error, signal=signals.spider_error)

    # What depends on the spider is made on first use: a crawl creates its
    # spider before its extensions, but a crawler built for a test
    # (scrapy.utils.test.get_crawler) gets its spider afterwards.

    @cached_property
    def scope(self) -> str:
        """The spider's state namespace (``incremental_scope``, else its name)."""
        spider = self._spider()
        return getattr(spider, "incremental_scope", None) or spider.name

    @cached_property
    def identity(self) -> ItemIdentity:
        """Item keys and fingerprints, with the spider's own overrides."""
        return ItemIdentity(self.config, self._spider(), self.canonical)

    @cached_property
    def clock_skew(self) -> ClockSkew:
        """Pages checked "in the future" (our clock went backwards)."""
        return ClockSkew(self.store, self.scope, self.stats,
                         skew_tolerance(self.config.due_tolerance))

    @cached_property
    def tombstones(self) -> TombstoneSender:
        """Sends gone pages' tombstones through the pipelines (see :meth:`tombstone_sent`)."""
        return TombstoneSender(self.crawler, self)

    @cached_property
    def trust(self) -> HostTrustBook:
        """Which hosts' sitemap lastmods and validators can be believed."""
        return HostTrustBook(self.config, self.store, self.scope, self.stats)

    def _spider(self) -> Spider:
        spider = self.crawler.spider
        if spider is None:
            raise RuntimeError("the ledger needs the crawler's spider: none is set yet")
        return spider

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Built as an extension, before the downloader and the scraper.

        Opening the store happens here, before the crawl starts, so a store
        that cannot be used stops the crawl with an error naming it instead
        of running with an empty store.
        """
        config = IncrementalConfig.from_settings(crawler.settings)
        if not config.enabled:
            raise NotConfigured("INCREMENTAL_ENABLED is False; set it to True to keep state")
        ledger = cls(crawler, config, open_store(crawler.settings))
        try:
            ledger._take_scope()
        except BaseException:
            # Nothing staged; the crawl does not start.
            deferred_from_coro(ledger.store.close()).addErrback(lambda _: None)
            raise
        return ledger

    def _take_scope(self) -> None:
        """Hold the spider's scope before the crawl starts, or refuse to start
        while another crawl or a repair holds it: two crawls of one scope at
        once would fetch every page twice and store every item twice, as
        new; a crawl beside a repair would write what the repair deletes.
        Workers of a cluster run share their scope on purpose (a shared
        hold, see SHARED_HOLD); a crawler built without its spider (a
        test's, the shell's) takes its hold when the spider opens.
        """
        if self.crawler.spider is None:
            return
        # Before any hold: a cluster worker's too.
        refuse_a_crawl_of_a_partial_copy(self.store, self.scope)
        process = f"{socket.gethostname()}:{os.getpid()}"
        # A worker's name, made here: it holds before it joins the run
        # (before it takes any work), and the cluster then knows it by it.
        self.hold_name = (process if self.config.cluster is None
                          else f"{SHARED_HOLD}{process}:{uuid.uuid4().hex[:8]}")
        now = clock.now()
        held = self.store.take_scope(self.scope, self.hold_name, self.hold_ttl, now)
        if held is not None:
            other, lapses = held
            why = ("a crawl beside a repair would write what the repair deletes: wait "
                   "until it ends" if other.startswith(REPAIR_HOLD) else
                   "a crawl beside a copy would write what the copy reads or writes: wait "
                   "until it ends" if other.startswith(COPY_HOLD) else
                   "two crawls of one scope at once would fetch every page and store every "
                   "item twice: wait until it ends, or give this crawl another scope "
                   "(incremental_scope)")
            raise StateStoreError(
                f"State store {self.store.location}: scope {self.scope!r} is held by "
                f"{describe_holder(other)} (its hold lapses in "
                f"{max(0, math.ceil(lapses - now))} s unless it refreshes it); {why}")
        self._held(now)

    def _held(self, now: float) -> None:
        """The hold taken at *now*: from then on the store writes only
        while this crawl holds its scope (a repair may take it over a hold
        that lapsed, and what was staged before would undo its work)."""
        self._held_at = now
        self.store.flush_hold = (self.scope, self.hold_name)

    def _warn_unknown_settings(self, spider: Spider) -> None:
        """One warning per ``INCREMENTAL_*`` name that is none of ours: a
        misspelt setting does nothing, and the crawl would not say so."""
        unknown = unknown_settings(self.crawler.settings)
        for name, meant in unknown:
            logger.warning(
                "Setting %(name)s is not an incremental_crawler setting and does "
                "nothing%(hint)s", {"name": name, "hint": f" (did you mean {meant}?)"
                                    if meant else ""},
                extra={"spider": spider})
        if unknown:
            self.stats.set_value("incremental/unknown_settings", len(unknown))

    @classmethod
    def for_component(cls, crawler: Crawler) -> Ledger:
        """The crawler's ledger, for a component built after the extensions.

        Raises ``NotConfigured`` (the component is then left out) when there
        is none: INCREMENTAL_ENABLED is False, or the add-on is not installed.
        """
        ledger = crawler.get_extension(cls)
        if ledger is None:
            raise NotConfigured(
                "no incremental ledger: INCREMENTAL_ENABLED is False, or the add-on "
                "(ADDONS = {'incremental_crawler.addon.IncrementalAddon': 0}) is not installed"
            )
        return ledger

    def spider_for_component(self) -> Spider:
        """The crawler's spider, for a component built with the engine.

        Raises ``NotConfigured`` when there is none yet: Scrapy's shell
        builds its engine before it has a spider, and fetches pages to look
        at them (a 304 would have no body), so the component stays out, and
        the ledger keeps nothing of the session (:attr:`aside`).
        """
        spider = self.crawler.spider
        if spider is None:
            self.aside = "the engine was built before its spider (scrapy shell)"
            raise NotConfigured(
                f"{self.aside}: pages are fetched in full, nothing is stored; "
                "-s INCREMENTAL_ENABLED=False silences this")
        return spider

    # -- lifecycle -----------------------------------------------------------

    # -- the crawl's clock --------------------------------------------------------

    @property
    def crawl_started(self) -> float:
        """When this crawl started; in cluster mode, when its run did.

        Next visits are counted from it, and a page is due when its next
        visit is not after it (plus INCREMENTAL_DUE_TOLERANCE): whether a
        page is due is the same at every moment of a crawl.
        """
        started = self.run_gate.run_started if self.run_gate is not None else None
        return self._started if started is None else started

    @property
    def own_start(self) -> float:
        """When this crawl (this worker, in cluster mode) started."""
        return self._started

    @property
    def due_at(self) -> float:
        """Pages whose next visit is not after this are due in this crawl."""
        if self.recheck_all:
            return float("inf")
        return self.crawl_started + self.config.due_tolerance

    def due_rules(self) -> CrawlDueRules:
        """This crawl's rules for whether a known page is requested."""
        config = self.config
        return CrawlDueRules(started=self.crawl_started, due_at=self.due_at,
                             checked_by=self.clock_skew.checked_by(),
                             recheck_all=self.recheck_all, revisit=config.revisit_enabled,
                             max_age=config.max_age, jitter=config.max_age_jitter)

    @property
    def recheck_all(self) -> bool:
        """Every known page due this crawl (INCREMENTAL_RECHECK_ALL, or the
        spider's ``incremental_recheck_all``, as ``-a recheck=all`` sets it)."""
        spider = self.crawler.spider
        return self.config.recheck_all or bool(getattr(spider, "incremental_recheck_all", False))

    def add_record_source(self, source: Callable[[str], Iterable[CrawlRecord]]) -> None:
        """Ask *source* for crawl records when the crawl ends.

        It is called with the crawl's finish reason once every page write
        is staged and before the store is flushed and closed, whatever order
        the ``spider_closed`` handlers run in; its records are staged.
        """
        self._record_sources.append(source)

    def add_closing_writer(self, writer: Callable[[str], None]) -> None:
        """Call *writer* with the crawl's finish reason when the crawl ends,
        with the record sources: it stages its own writes in :attr:`store`,
        committed with the crawl's last ones (the throttle's learned rates)."""
        self._closing_writers.append(writer)

    def spider_opened(self, spider: Spider) -> None:
        self._warn_unknown_settings(spider)
        if self.aside is not None:
            logger.info("Incremental state not kept: %(why)s", {"why": self.aside},
                        extra={"spider": spider})
            return
        self._started = clock.now()
        self._clock_checked()
        # The cluster worker id holds host and pid already.
        self.holder = self.worker or f"{socket.gethostname()}:{os.getpid()}"
        if not self.hold_name:
            self.hold_name = (self.holder if self.config.cluster is None
                              else f"{SHARED_HOLD}{self.holder}")
        if self.stores_items and self.config.redeliver:
            self.delivery = f"{self.holder}/{uuid.uuid4().hex[:12]}"
        # Under way at once; spider_closed waits for it before releasing.
        self._hold_done = deferred_from_coro(self._hold())
        logger.info(
            "Incremental state store: %(location)s (scope %(scope)r)",
            {"location": self.store.location, "scope": self.scope},
            extra={"spider": spider},
        )
        if self.crawler.get_extension(FeedExporter) is not None:
            self._feeds_closed = Deferred()
            self.crawler.signals.connect(
                self.feed_exporter_closed, signal=signals.feed_exporter_closed
            )
        if not self.stores_items and self.crawler.settings.getdict("FEEDS"):
            # Feed files are buffered and uploaded at the end: a validator
            # committed earlier could outlive a killed crawl's lost feed.
            # Nothing is committed until the feeds are closed.
            self._hold_until_feeds = Deferred()
            if self._feeds_closed is None:
                self.crawler.signals.connect(
                    self.feed_exporter_closed, signal=signals.feed_exporter_closed
                )
            logger.info(
                "Items go only to feeds: page state is committed when they are closed",
                extra={"spider": spider},
            )
        self._task = create_looping_call(self._tick)
        self._task.start(self.config.flush_interval, now=False)

    def _clock_checked(self) -> None:
        """Bring forward the next visits a fast clock counted (see
        :mod:`~incremental_crawler.change.skew`), before anything is decided.

        Staged into the store alone: they are no visits of this crawl (the
        re-seeder must not take them for visited), and committed with the
        crawl's first flush.
        """
        try:
            moved = self.clock_skew.crawl_opened(self._started)
        except StateStoreError as exc:
            logger.warning("%(error)s; could not compare the clock with the last crawl's",
                           {"error": exc}, extra={"spider": self.crawler.spider})
            return
        for state in moved:
            self.store.stage_page(state)
            self.staged += 1

    def _tick(self) -> None:
        if self._failed:
            self._close_failed()  # failed before the engine ran
            return
        idle = self._hold_done is None or self._hold_done.called
        if idle and clock.now() - self._held_at >= self.hold_ttl / 3:
            # Refreshed before it flushes: a hold found lost stops the crawl
            # before it writes (the store checks the hold as it commits too).
            self._hold_done = deferred_from_coro(self._hold())
            self._hold_done.addCallback(lambda _: self.flush())
            return
        self.flush()

    async def _hold(self) -> None:
        """Refresh this crawl's hold on its scope, or take it (a crawler
        built without its spider) (a failure is logged: the crawl goes on,
        and a store that fails stops it at its next flush; a hold that
        lapsed or another took over stops it at once)."""
        try:
            if self.store.flush_hold is not None:  # taken
                await self.store.hold_scope(self.scope, self.hold_name, self.hold_ttl)
                self._held_at = clock.now()
            else:
                self._take_hold_late()
        except HoldLapsed as exc:
            # This hold lapsed (the reactor stalled past it): a repair or
            # another crawl took the scope, or did and ended already. The
            # crawl stops rather than write on beside it or after it.
            self.store_failed(exc)
        except StateStoreError as exc:
            if clock.now() - self._held_at >= self.hold_ttl:
                # Refreshes failed up to the hold's end: a repair may have
                # taken the scope meanwhile; nothing more is written.
                self.store_failed(HoldLapsed(f"{exc}; the hold on scope {self.scope!r} could "
                                             "not be refreshed before it lapsed"))
                return
            logger.warning("%(error)s; could not hold scope %(scope)r",
                           {"error": exc, "scope": self.scope},
                           extra={"spider": self.crawler.spider})

    def _take_hold_late(self) -> None:
        """The hold of a crawler built without its spider, taken as it opens."""
        now = clock.now()
        held = self.store.take_scope(self.scope, self.hold_name, self.hold_ttl, now)
        if held is not None:
            raise ScopeHeld(f"State store {self.store.location}: scope {self.scope!r} is held "
                            f"by {describe_holder(held[0])}, which "
                            f"{describe_holder(self.hold_name)} may not hold it beside",
                            *held)
        self._held(now)

    @property
    def holds_until_close(self) -> bool:
        """Whether page state is committed only when the crawl ends (feeds only)."""
        return self._hold_until_feeds is not None

    def feed_exporter_closed(self) -> None:
        for closed in (self._hold_until_feeds, self._feeds_closed):
            if closed is not None and not closed.called:
                closed.callback(None)

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        if self.aside is not None:
            await self.store.close()  # nothing staged: nothing to lose
            return
        if self._task is not None and self._task.running:
            self._task.stop()
        abandoned = sum(1 for p in self._pending.values() if p.key is not None)
        if abandoned:
            self.stats.set_value("incremental/items_abandoned", abandoned)
        # In cluster mode another worker may have failed a page this
        # worker's sitemap listed; the run's count was read when it left.
        # None: the count could not be read (Redis gone), so failures are
        # not ruled out.
        run_unrecorded = self.run_gate.run_unrecorded if self.run_gate is not None else 0
        if reason == "finished" and run_unrecorded == 0 and not self._unrecorded:
            for txn in self._discovered:
                self._stage_list(txn)
            self._postpone()
            self.stats.inc_value("incremental/discovery_committed", len(self._discovered))
        elif self._discovered:
            # A sitemap answering 304 next time would hide the pages whose
            # failure could not be recorded: it is read in full instead.
            logger.info(
                "Crawl ended %(reason)s with %(failed)s failed pages that could not be "
                "recorded to be asked again: the validators of %(n)d sitemaps are not "
                "saved, they will be read in full next time",
                {"reason": reason, "n": len(self._discovered),
                 "failed": "an unknown number of" if run_unrecorded is None
                 else max(self._unrecorded, run_unrecorded)},
                extra={"spider": spider},
            )
        if self._hold_until_feeds is not None:
            await maybe_deferred_to_future(self._hold_until_feeds)
            self._hold_until_feeds = None
        self.trust.save()
        await self._confirm_delivery(spider)
        self._stage_closing(reason)
        if self._hold_done is not None:
            await maybe_deferred_to_future(self._hold_done)  # never fails
        if not self._failed:
            # Held still? A hold lost (a repair took the scope) stops the
            # last flush too: what is staged is dropped, not written.
            await self._hold()
        if not self._failed:
            try:
                # Committed before the hold goes: a repair waiting for this
                # crawl never races its last writes. A failure leaves the
                # hold to lapse.
                self._count_commit(await self.store.flush())
                await self.store.release_scope(self.scope, self.hold_name)
            except StoredStateDamaged as exc:
                # All of it stored: the close's flush has nothing left to
                # fail on, so the damage is said here (the close's line, if
                # it meets the damage again, a WARNING after it).
                self._failed = True
                self.stats.inc_value("incremental/store_errors")
                logger.error("%(error)s (the crawl's writes were all stored)",
                             {"error": exc}, extra={"spider": spider})
            except StateStoreError:
                pass  # closing tries the flush again, and says what was lost
        await self._close_store(spider)
        self.stats.set_value("incremental/store_roundtrips", self.store.roundtrips)

    async def _close_store(self, spider: Spider) -> None:
        """Close the store (its last flush of what is left staged), saying
        what it did not store."""
        try:
            await self.store.close()
        except HoldLapsed as exc:
            # Written now, they could undo what a repair deleted meanwhile.
            self.stats.inc_value("incremental/store_errors")
            self.stats.set_value("incremental/writes_dropped", self.store.pending)
            logger.log(
                logging.WARNING if self._failed else logging.ERROR,
                "%(error)s; %(n)d staged writes were dropped, not stored (the next run "
                "fetches those pages again)",
                {"error": exc, "n": self.store.pending}, extra={"spider": spider},
            )
        except StateStoreError as exc:
            self.stats.inc_value("incremental/store_errors")
            logger.log(
                # The crawl stopped for it already: one ERROR line said why.
                logging.WARNING if self._failed else logging.ERROR,
                "%(error)s; %(n)d staged writes were not stored (the next run "
                "fetches those pages again)",
                {"error": exc, "n": self.store.pending}, extra={"spider": spider},
            )

    async def _confirm_delivery(self, spider: Spider) -> None:
        """Stage that the versions this crawl stored (or emitted again) were
        delivered: its item pipelines closed (this crawl is closing), and so
        did its feeds, every one stored without an error. Otherwise they
        wait on this crawl, and the next crawl emits them again."""
        if not self.delivery:
            return
        if self._feeds_closed is not None:
            await maybe_deferred_to_future(self._feeds_closed)
        failed = sum(int(count) for name, count in self.stats.get_stats().items()
                     if name.startswith("feedexport/failed_count/"))
        if failed:
            self.stats.set_value("incremental/redelivery/unconfirmed", 1)
            logger.warning(
                "%(n)d feeds could not be stored: the item versions this crawl stored "
                "are emitted again by the next crawl (at-least-once delivery)",
                {"n": failed}, extra={"spider": spider})
            return
        self.store.stage_delivered(self.scope, self.delivery)
        for crawl in sorted(self._redelivered_from):
            self.store.stage_settled(self.scope, crawl)

    def _stage_closing(self, reason: str) -> None:
        """Stage what the record sources and closing writers give at the end."""
        for source in self._record_sources:
            for record in source(reason):
                self.store.stage_crawl(record)
        for writer in self._closing_writers:
            writer(reason)

    # -- transactions (downloader and spider middleware) ---------------------

    def begin(
        self, meta: dict[str, Any], state: PageState, *, discovery: bool = False,
        record_links: bool = False, prior: PageState | None = None,
        counted: PageKey | None = None,
    ) -> PageTransaction:
        """Open the page's transaction; with *record_links*, record its yielded requests.

        *prior* is the page as stored before this fetch (its failure record
        if the state is withheld starts from it); *counted*, the page whose
        column its outcome is (see :attr:`PageTransaction.counted`).
        """
        links = None
        if record_links:
            spider = self.crawler.spider
            assert spider is not None
            links = LinkRecorder(spider, self.recipe_rules, self.config.replay_max_requests,
                                 self.crawler.request_fingerprinter.fingerprint,
                                 self.links_canary)
        txn = PageTransaction(state, discovery=discovery, links=links, prior=prior,
                              counted=counted)
        meta[TXN_META] = txn
        return txn

    def item_yielded(self, txn: PageTransaction, item: Any) -> None:
        txn.open_items += 1
        txn.item_ids.append(id(item))

    def request_yielded(self, txn: PageTransaction, request: Request) -> None:
        """Record a request the page's callback yielded, as it left the spider middlewares."""
        if txn.links is None:
            return
        reason = txn.links.add(request)
        if reason is None:
            return
        # Per page: the pages fetched in full next time, for this reason.
        self.stats.inc_value(f"incremental/replay/unrecordable/{reason}")
        if reason not in self._warned:
            self._warned.add(reason)
            logger.warning(
                "Requests yielded by %(page)s cannot all be replayed on a 304 (%(reason)s, "
                "e.g. %(url)s): %(advice)s. Such pages are fetched in full on every visit "
                "(stat incremental/replay/unrecordable/%(reason)s; this is said once).",
                {"page": txn.state.key.url, "reason": reason, "url": request.url,
                 "advice": ADVICE[reason]},
                extra={"spider": self.crawler.spider},
            )

    def callback_failed(self, txn: PageTransaction, reason: str) -> None:
        txn.failed = txn.failed or reason

    def record_failure(self, key: PageKey, prior: PageState | None, status: int, *,
                       callback: str | None, recipe: str | None, counted: bool,
                       counted_as: PageKey | None = None) -> bool:
        """Record a visit that left no data: a final failure, a 404 or 410, a withheld page.

        *status* is the final one (0: no HTTP answer). The stored validators,
        fingerprint, size, lastmod and interval stay; the page goes on its
        failure schedule (:func:`~incremental_crawler.change.revisit.failure_next_visit`).
        A page not stored yet is stored without a fingerprint, with its
        *callback* and *recipe*, so the re-seeder can request it again.
        *counted*: a failure for the stats (``incremental/schedule/failed``),
        of the page *counted_as* (``None``: *key*'s; a redirect's target fails
        for the page that was asked, counted once).

        Returns whether the page can be requested again from its record;
        when it cannot, the failure is counted as unrecorded and keeps this
        crawl's (and run's) sitemaps from being saved.
        """
        failures = (prior.failures if prior is not None else 0) + 1
        next_visit = failure_next_visit(failures, self.crawl_started,
                                        self.config.revisit_initial, self.config.revisit_max)
        if is_gone(prior):
            # A gone page that failed at its recheck (a dead host) waits for
            # its next rare recheck, not the failure schedule's next day.
            next_visit = max(next_visit, clock.now() + self.config.gone_recheck)
        self.store.stage_failure(key, status, clock.now(), failures=failures,
                                 next_visit=next_visit, callback=callback, recipe=recipe)
        # Due on the next crawl, not again in this one (the re-seeder would
        # ask a page requested with dont_filter twice).
        self._note_visit(key, next_visit, clock.now())
        self._after_stage()
        if not self._requestable(key, prior, callback, recipe):
            self.note_unrecorded_failure()
            return False
        if counted:
            self.counter.failed(counted_as or key)
        return True

    def _requestable(self, key: PageKey, prior: PageState | None, callback: str | None,
                     recipe: str | None) -> bool:
        """Whether the page will be requested again from its record.

        Only the re-seeder does that (a list answering 304 does not name the
        page again): without it, no record brings a failed page back.
        """
        if not self.config.reseeds_for(self._spider()):
            return False
        if prior is not None and prior.callback is not None:
            return True  # the record keeps the callback and recipe it has
        if callback is None:
            return False
        return not isinstance(page_request(key.url, callback, recipe, self._spider()),
                              Unbuildable)

    def note_unrecorded_failure(self) -> None:
        """A page of this crawl failed and its failure could not be recorded."""
        self._unrecorded += 1
        self.stats.inc_value("incremental/failures_unrecorded")
        # In cluster mode another worker may have read the sitemap listing
        # this page: the run's count gates its validators too.
        if self.run_gate is not None:
            self.run_gate.note_unrecorded_failure()

    def output_finished(self, txn: PageTransaction) -> None:
        txn.output_done = True
        self._maybe_commit(txn)

    def output_failed(self, txn: PageTransaction, reason: str) -> None:
        txn.failed = txn.failed or reason
        txn.output_done = True
        self._maybe_commit(txn)

    def _item_finished(self, response: Any, *, error: str | None = None,
                       changed: bool | None = None) -> None:
        if not isinstance(response, Response):
            return
        txn: PageTransaction | None = response.meta.get(TXN_META)
        if txn is None:
            return
        if changed is True:
            txn.items_changed += 1
        elif changed is False:
            txn.items_unchanged += 1
        txn.open_items = max(0, txn.open_items - 1)
        if error:
            txn.failed = txn.failed or error
        self._maybe_commit(txn)

    def _maybe_commit(self, txn: PageTransaction) -> None:
        if txn.done or not txn.output_done or txn.open_items > 0:
            return
        txn.done = True
        for item_id in txn.item_ids:
            self._pending.pop(item_id, None)
        if not txn.callback_called and not txn.failed:
            txn.failed = "its callback never ran (a spider middleware rejected the response)"
        if txn.failed:
            # Keep the old validators: the next run re-fetches this page
            # instead of getting a 304 for data that was never stored. Its
            # failure record makes it due then, whatever its sitemap says.
            self.stats.inc_value("incremental/state_withheld")
            logger.log(
                # Once the store failed, its one ERROR line says it for every page.
                logging.DEBUG if self._failed else logging.WARNING,
                "Not saving validators of %(url)s: %(reason)s",
                {"url": txn.state.key.url, "reason": txn.failed},
                extra={"spider": self.crawler.spider},
            )
            state = txn.state
            self.record_failure(state.key, txn.prior, state.last_status or 0,
                                callback=state.callback, recipe=state.recipe, counted=False)
            if not txn.discovery:
                self.counter.outcome(PageOutcome.WITHHELD, txn.counted or state.key)
            return
        if txn.judge is not None:
            txn.state = txn.judge(txn.content_changed())
        if txn.outcome is not None and not txn.discovery:
            self.counter.outcome(txn.outcome, txn.counted or txn.state.key)
        if txn.discovery:
            # A sitemap's validators say "everything it lists was handled":
            # true only once the requests it produced have run, so they are
            # staged when the crawl finishes. A crash before that re-reads
            # the sitemap in full next time.
            self._discovered.append(txn)
            return
        state = self._stage_links(txn.state, txn.links)
        self.stage_page(state)
        self.stats.inc_value("incremental/state_committed")

    def _stage_list(self, txn: PageTransaction) -> None:
        """Stage a list's state, with what its callback read of it when it
        was read in full: its membership, and an index's record of the
        lists it names (staged first: a state saying HAS_LINKS never goes
        without its record)."""
        state = txn.state
        if txn.listing is not None:
            flags = state.flags & ~PageFlags.HAS_LINKS
            if txn.list_children is not None:
                flags |= PageFlags.HAS_LINKS
            prior_flags = txn.prior.flags if txn.prior is not None else 0
            if txn.list_children is not None or (state.flags | prior_flags) & PageFlags.HAS_LINKS:
                self.store.stage_links(state.key, txn.list_children)  # None: delete
            state = state.copy(listing=txn.listing, flags=int(flags))
        self.store.stage_page(state)

    def _stage_links(self, state: PageState, links: LinkRecorder | None) -> PageState:
        """Stage the page's links record, and return its state flagged to match.

        Staged right before the state (no flush can come between: both are
        staged in this call's turn of the reactor), so the two are committed
        together: a state saying HAS_LINKS never goes without its record.
        """
        had_record = bool(state.flags & PageFlags.HAS_LINKS)
        flags = state.flags & ~LINK_FLAGS
        record = None
        if links is not None and links.complete:
            record = links.record()
            flags |= PageFlags.LINKS_KNOWN
            if record is not None:
                flags |= PageFlags.HAS_LINKS
                self.stats.inc_value("incremental/replay/recorded_pages")
                self.stats.inc_value("incremental/replay/recorded_requests", len(links.tokens))
            if links.duplicates:
                self.stats.inc_value("incremental/replay/duplicates_not_recorded",
                                     links.duplicates)
        elif links is not None:
            flags |= PageFlags.LINKS_INCOMPLETE
        # (links None: replay does not apply; the flags are cleared, so a
        # crawl that replays again fetches the page in full first.)
        if record is not None or had_record:
            self.store.stage_links(state.key, record)  # None: delete the old one
        return state.copy(flags=int(flags))

    # -- item signals --------------------------------------------------------

    def remember(self, item: Any) -> _Pending:
        """The pipelines' notes on *item*, kept until it leaves the pipelines."""
        pending = self._pending.get(id(item))
        if pending is None or pending.item is not item:
            pending = self._pending[id(item)] = _Pending(item)
        return pending

    def item_scraped(self, item: Any, response: Any, spider: Spider) -> None:
        if self._redelivery_done(item):
            return
        if (gone := self._take_tombstone(item)) is not None:
            self._tombstone_delivered(gone, item)
            return
        pending = self._pending.pop(id(item), None)
        if pending is None or pending.item is not item:
            pending = _Pending(item)
        if pending.fingerprint is None:
            # A pipeline returned a new object: the fingerprint field the
            # FingerprintPipeline set survives copies, so the next run
            # compares alike; without it, describe the output itself.
            carried = ItemAdapter(item).get(self.config.fingerprint_field)
            if isinstance(carried, str) and carried:
                pending.fingerprint = carried
            elif self.stores_items:
                pending.fingerprint = self.identity.fingerprint(item)
        if pending.fingerprint is not None:
            if pending.key is None:
                pending.key = self.identity.key(item, pending.fingerprint)
            if pending.data is None and self.stores_items:
                pending.data = serialize_item(item)
            txn: PageTransaction | None = (
                response.meta.get(TXN_META) if isinstance(response, Response) else None)
            self.store.stage_item(
                ItemRecord(
                    scope=self.scope,
                    key=pending.key,
                    url=self.identity.url(item),
                    fingerprint=pending.fingerprint,
                    data=pending.data,
                    stored_at=clock.now(),
                    simhash=pending.simhash,
                    change=pending.change or self._carried_change(item),
                    page=None if txn is None else txn.state.key.url,
                    delivery=self.delivery or None,
                )
            )
            if pending.data is not None:
                self.stats.inc_value("incremental/items_stored")
            self._after_stage()
        # Out of every pipeline: new or changed (unchanged ones are dropped).
        self._item_finished(response, changed=True)

    def _carried_change(self, item: Any) -> Change:
        """What an item the pipelines' notes lost (a copy) says it is (new by default)."""
        field = self.config.change_field
        carried = ItemAdapter(item).get(field) if field else None
        return Change.CHANGED if carried == Change.CHANGED else Change.NEW

    def item_dropped(
        self, item: Any, response: Any, exception: BaseException, spider: Spider
    ) -> None:
        # Dropped is delivered: a pipeline decided on it.
        if self._redelivery_done(item):
            return
        if (gone := self._take_tombstone(item)) is not None:
            # Dropped is delivered: a pipeline decided on it.
            self._tombstone_delivered(gone, item)
            return
        self._pending.pop(id(item), None)
        if isinstance(exception, StoreUnavailable):
            # Not a decision: the store could not be asked.
            self._item_finished(response, error="the state store failed")
            return
        # A dropped item is a decision, not a failure: the page is done.
        # Unchanged: evidence about the page's content; other drops are not.
        self._item_finished(response, changed=False if isinstance(exception, ItemUnchanged)
                            else None)

    def item_error(self, item: Any, response: Any, spider: Spider, failure: Failure) -> None:
        if (entries := self._take_redelivery(item)) is not None:
            # It waits on the crawl it waited on: emitted again next crawl.
            self.stats.inc_value("incremental/redelivery/failed", len(entries))
            return
        self._pending.pop(id(item), None)
        if failure.check(StateStoreError):
            assert failure.value is not None
            self.store_failed(failure.value)
        if (gone := self._take_tombstone(item)) is not None:
            self._tombstone_withheld(gone, failure)
            return
        self._item_finished(
            response, error=f"an item pipeline failed ({failure.getErrorMessage()})"
        )

    def spider_error(self, failure: Failure, response: Any, spider: Spider) -> None:
        if isinstance(response, Response) and (txn := response.meta.get(TXN_META)):
            # No output follows a spider_error. A callback that raised before
            # returning its output (a plain function, a coroutine) never
            # reached PageOutputMiddleware: its page ends here, withheld, and
            # counts as failed (a sitemap listing it must not be saved).
            self.output_failed(txn, f"the callback failed ({failure.getErrorMessage()})")

    # -- at-least-once delivery -------------------------------------------------

    async def redeliveries(self) -> AsyncIterator[dict[str, Any]]:
        """The item versions crawls that ended without confirming their
        delivery stored, as items to emit again (see :meth:`_confirm_delivery`).

        A crawl that holds the scope still is running (its versions are not
        its to confirm yet), unless it is a process of this host that is not
        running any more (killed: its hold has not lapsed yet).
        """
        if not self.delivery:
            return
        crawls = await self.store.undelivered_crawls(self.scope)
        if not crawls:
            return
        # By process: a worker's hold is not named by its worker id.
        holding = {hold_process(holder) for holder in
                   self.store.scope_holders(self.scope, clock.now())}
        for crawl in crawls:
            holder = crawl.rpartition("/")[0]
            if crawl == self.delivery or (hold_process(holder) in holding
                                          and holder != self.holder
                                          and dead_pid(holder) is None):
                continue
            after: Undelivered | None = None
            while True:
                chunk = await self.store.undelivered(self.scope, crawl, after=after,
                                                     limit=_REDELIVER_CHUNK)
                if not chunk:
                    break
                after = chunk[-1]
                self._redelivered_from.add(crawl)
                for entries in _one_per_item(chunk):
                    yield self._redelivered_item(entries)
                if len(chunk) < _REDELIVER_CHUNK:
                    break

    def _redelivered_item(self, entries: list[Undelivered]) -> dict[str, Any]:
        """The item of *entries* (one version, or a tombstone stored once per
        item key of its page) as stored, marked, and tracked until it leaves
        the pipelines."""
        version = entries[0].version
        item = dict(version.data)
        if version.fingerprint:
            item.setdefault(self.config.fingerprint_field, version.fingerprint)
        item[self.config.redelivered_field] = True
        self._redelivering[id(item)] = (item, entries)
        self._redelivering_ids[self._redelivery_key(item)] = id(item)
        self.stats.inc_value("incremental/redelivered")
        return item

    def _redelivery_key(self, item: Any) -> tuple[str, str]:
        fingerprint = ItemAdapter(item).get(self.config.fingerprint_field)
        return (self.identity.key(item, fingerprint if isinstance(fingerprint, str) else ""),
                fingerprint if isinstance(fingerprint, str) else "")

    def is_redelivered(self, item: Any) -> bool:
        """Whether *item* is a stored version emitted again (the pipelines pass it on)."""
        if id(item) in self._redelivering and self._redelivering[id(item)][0] is item:
            return True
        return (ItemAdapter.is_item(item)
                and ItemAdapter(item).get(self.config.redelivered_field) is True)

    def _take_redelivery(self, item: Any) -> list[Undelivered] | None:
        """The versions *item* emits again, no longer tracked (``None``: not one)."""
        if not self.is_redelivered(item):
            return None
        item_id = id(item)
        if item_id not in self._redelivering or self._redelivering[item_id][0] is not item:
            # A copy a pipeline returned: known by its key and fingerprint.
            found = self._redelivering_ids.get(self._redelivery_key(item))
            if found is None:
                return []
            item_id = found
        original, entries = self._redelivering.pop(item_id)
        key = self._redelivery_key(original)
        if self._redelivering_ids.get(key) == item_id:
            del self._redelivering_ids[key]
        return entries

    def _redelivery_done(self, item: Any) -> bool:
        """If *item* is a version emitted again: it left the pipelines, and
        waits on this crawl from now on. Whether it was one."""
        entries = self._take_redelivery(item)
        if entries is None:
            return False
        for pending in entries:
            self.store.stage_redelivered(pending, self.delivery)
            self._after_stage()
        return True

    # -- tombstones ------------------------------------------------------------

    def claim_tombstone(self, key: PageKey) -> bool:
        """Whether this crawl sends *key*'s tombstone: the first to decide it gone does.

        A page can be asked twice in one crawl (start requests are
        ``dont_filter``), both requests reading its state before either
        answer came back: the second answer is no second tombstone. In
        cluster mode the run's workers claim each page once (see
        :class:`RunGate`). Claimed or not, the page is then settled for
        this crawl: its later answers record nothing (:attr:`tombstoned`).
        """
        if key in self.tombstoned:
            return False
        if self.run_gate is not None and not self.run_gate.claim_tombstone(key):
            # Another worker of the run sends it. Not settled here: should
            # that worker die first, the page's request comes back, and its
            # answer claims the tombstone again (the run takes it over).
            return False
        self.tombstoned.add(key)
        return True

    def tombstone_sent(self, item: Any, gone: Gone) -> None:
        """Track *item*, *gone*'s tombstone, until it leaves the pipelines."""
        self._tombstones[id(item)] = (item, gone)
        self._tombstone_pages[gone.key] = id(item)

    def tombstone_of(self, item: Any) -> Gone | None:
        """The gone page whose tombstone *item* is (``None``: an item)."""
        item_id = self._tombstone_id(item)
        return None if item_id is None else self._tombstones[item_id][1]

    def _tombstone_id(self, item: Any) -> int | None:
        entry = self._tombstones.get(id(item))
        if entry is not None and entry[0] is item:
            return id(item)
        # A copy a pipeline made: it says it is one, for a page in flight.
        field = self.config.change_field
        if not self._tombstone_pages or field is None or not ItemAdapter.is_item(item):
            return None
        adapter = ItemAdapter(item)
        url = adapter.get("url")
        if adapter.get(field) != Change.DELETED or not isinstance(url, str):
            return None
        return self._tombstone_pages.get(PageKey(self.scope, url))

    def _take_tombstone(self, item: Any) -> Gone | None:
        """The gone page whose tombstone *item* is, no longer tracked."""
        item_id = self._tombstone_id(item)
        if item_id is None:
            return None
        _, gone = self._tombstones.pop(item_id)
        if self._tombstone_pages.get(gone.key) == item_id:
            del self._tombstone_pages[gone.key]
        return gone

    def _tombstone_delivered(self, gone: Gone, item: Any) -> None:
        """Stage the page's items as deleted, then the page as GONE (in that order)."""
        now = clock.now()
        data = serialize_item(item) if self.stores_items else None
        # No flush between the items and the page (stage_page may start
        # one): the deleted versions are never stored without the GONE page,
        # which would keep its validators, answer 304 if it came back, and
        # its items would never come back as new.
        for key in gone.item_keys:
            self.store.stage_item(ItemRecord(
                scope=self.scope, key=key, url=None, fingerprint="", data=data,
                stored_at=now, change=Change.DELETED, page=gone.key.url,
                delivery=self.delivery or None))
        self.staged += len(gone.item_keys)
        self._stage_gone(gone, now)
        self.stats.inc_value("incremental/items_deleted")
        self.stats.inc_value(f"incremental/tombstones/{gone.reason}")

    def tombstone_unsent(self, gone: Gone) -> None:
        """A gone page none of whose items is stored (a listing page): flagged GONE,
        no tombstone sent (a downstream index holds nothing of it to delete)."""
        self._stage_gone(gone, clock.now())
        self.stats.inc_value(f"incremental/tombstones/{gone.reason}")
        self.stats.inc_value("incremental/tombstones/unsent_no_items")

    def _stage_gone(self, gone: Gone, now: float) -> None:
        prior = gone.prior
        flags = int(prior.flags) | PageFlags.GONE
        redirect_to = prior.redirect_to
        if gone.target is not None:
            flags |= PageFlags.REDIRECTED
            redirect_to = gone.target
        self.stage_page(prior.copy(
            flags=int(flags), redirect_to=redirect_to, last_status=gone.status,
            last_checked=now, checks=prior.checks + 1, lastmod=_gone_lastmod(prior, gone.lastmod),
            next_visit=now + self.config.gone_recheck, failures=0))

    def _tombstone_withheld(self, gone: Gone, failure: Failure) -> None:
        """Nothing of the tombstone is stored; the page is due on the next crawl."""
        self.stats.inc_value("incremental/tombstones/withheld")
        logger.warning(
            "Page %(url)s is gone (%(reason)s) but an item pipeline failed on its "
            "tombstone (%(error)s): it is sent again next crawl",
            {"url": gone.key.url, "reason": gone.reason, "error": failure.getErrorMessage()},
            extra={"spider": self.crawler.spider},
        )
        prior = gone.prior
        # As after a first failure: due at this crawl's start, so the next
        # crawl asks again (and decides again) whatever its schedule.
        self.record_failure(gone.key, prior.copy(failures=0), gone.status,
                            callback=prior.callback, recipe=prior.recipe, counted=False)

    def still_gone(self, key: PageKey, prior: PageState, status: int, *,
                   lastmod: float | None = None) -> None:
        """A GONE page answered 404, 410 or a redirect: no second tombstone, checked much later.

        *lastmod*: the date the list that named it gave it (recorded: only a
        newer one asks for it again).
        """
        now = clock.now()
        self.stage_page(prior.copy(
            last_status=status, last_checked=now, checks=prior.checks + 1,
            lastmod=_gone_lastmod(prior, lastmod),
            next_visit=now + self.config.gone_recheck, failures=0))

    def gone_unasked(self, key: PageKey, prior: PageState) -> None:
        """A GONE page due for its recheck could not be asked (robots.txt
        forbids it): due again a recheck later, nothing else changed (left
        due, it would be re-seeded, and refused, on every crawl)."""
        self.stage_page(prior.copy(next_visit=clock.now() + self.config.gone_recheck))

    # -- states read ahead -------------------------------------------------------

    def prefetched(self, key: PageKey, state: PageState | None) -> None:
        """Keep *state*, just read in a batch, for the request of that page."""
        if len(self._prefetched) < _PREFETCH_LIMIT:
            self._prefetched[key] = state

    def take_prefetched(self, key: PageKey) -> tuple[bool, PageState | None]:
        """``(True, state)`` if a batch read the page's state; ``(False, None)`` if not."""
        if key in self._prefetched:
            return True, self._prefetched.pop(key)
        return False, None

    # -- staging and flushing --------------------------------------------------

    def stage_page(self, state: PageState) -> None:
        self.store.stage_page(state)
        self._note_visit(state.key, state.next_visit, state.last_checked)
        self._after_stage()

    def stage_check(
        self, key: PageKey, status: int, *, lastmod: float | None = None,
        schedule: tuple[float, float] | None = None,
        validators: tuple[str | None, str | None] | None = None,
    ) -> None:
        self.store.stage_check(key, status, clock.now(), lastmod=lastmod, schedule=schedule,
                               validators=validators)
        if schedule is not None:
            self._note_visit(key, schedule[1], clock.now())
        self._after_stage()

    def _note_visit(self, key: PageKey, next_visit: float, checked: float) -> None:
        """A visit of this crawl staged: *checked* is the last check stored
        with it (a page's state is staged after its items, later)."""
        # Few pages: only those whose interval is within the tolerance.
        if 0 < next_visit <= self.due_at:
            self.visited_due.add(key)
        if checked < math.floor(self.crawl_started) + 1 and key not in self.visited_first_second:
            self.visited_first_second.add(key)
            if self.run_gate is not None:
                # For the worker that re-seeds: it tells them from the
                # previous crawls' visits stored in that second (see
                # first_second_visits).
                self.run_gate.note_first_second_visit(key)

    def stage_flags(self, key: PageKey, add: int) -> None:
        """OR *add* into the stored page's flags (a replayed request was dropped)."""
        self.store.stage_flags(key, add)
        self._after_stage()

    def postpone_when_finished(self, key: PageKey, was: float, to: int) -> None:
        """Move the vouched page *key* on to *to* when the crawl finishes,
        if its host's dates are still trusted then (see :meth:`_postpone`)."""
        self._postpones.append((key, was, to))

    def _postpone(self) -> None:
        """Stage the postpones of the pages whose host is trusted still: a
        sample that found its dates stale this crawl leaves its other pages
        due, to be asked at the next crawl. A crawl that did not finish
        stages none (its sample may not have answered)."""
        now = clock.now()
        moved = 0
        for key, was, to in self._postpones:
            trust = self.trust.loaded(host_of(key.url))
            if self.trust.trusted(trust, now) and not self.trust.on_probation(trust):
                self.store.stage_postpone(key, was, to)
                moved += 1
        self._postpones.clear()
        if moved:
            self.stats.inc_value("incremental/reseed/postponed", moved)

    def note_listing(self, listing: str) -> None:
        """A list of this crawl is current, with membership *listing*."""
        if listing in self.listings or listing == NO_LISTING:
            return
        self.listings.add(listing)
        if self.run_gate is not None:
            self.run_gate.note_listing(listing)

    def listed(self, state: PageState) -> bool:
        """Whether a list of this crawl still gives *state* the date stored with it."""
        return state.listing is not None and state.listing in self.listings

    def note_decided(self, urls: list[str]) -> None:
        """Pages (canonical URLs) a list of this crawl named and decided
        (requested or not): in cluster mode, for whichever worker re-seeds."""
        if self.run_gate is not None:
            self.run_gate.note_decided(urls)

    def first_second_visits(self) -> set[PageKey]:
        """The pages visited in the second this crawl started in (stored
        with the same last check as a previous crawl's visit in it); in
        cluster mode, by every worker of the run (unknown: this one's)."""
        if self.run_gate is None:
            return set(self.visited_first_second)
        return self.visited_first_second | (self.run_gate.first_second_visits() or set())

    def decided_elsewhere(self, urls: list[str]) -> set[str]:
        """Which of *urls* a list read by another worker of the run decided
        (cluster mode; unknown: none, and they are decided again)."""
        if self.run_gate is None or not urls:
            return set()
        decided = self.run_gate.decided_in_run(urls)
        if decided is None:
            return set()
        return {url for url, known in zip(urls, decided, strict=True) if known}

    def gather_listings(self) -> None:
        """Take in the memberships the run's other workers noted (cluster
        mode), before due pages are decided by them: lists are read by
        whichever worker pops them. Unknown (Redis lost): this worker's own
        only, so a date vouches for fewer pages, never for more."""
        if self.run_gate is not None:
            self.listings |= self.run_gate.run_listings() or set()

    def stage_listing(self, key: PageKey, listing: str) -> None:
        """Record on the stored page the membership digest of the list giving its date."""
        self.store.stage_listing(key, listing)
        self._after_stage()

    def stage_redirect(self, key: PageKey, target: str, status: int) -> None:
        self.store.stage_redirect(key, target, status, clock.now())
        self._after_stage()

    def _after_stage(self) -> None:
        self.staged += 1
        # Bounded pending writes: flush as soon as a batch is full.
        if self.store.pending >= self.config.batch_size:
            self.flush()

    def flush(self) -> None:
        if self._flushing or self._failed:
            return
        if not self.store.pending:
            self.committed = self.staged
            return
        if self._hold_until_feeds is not None:
            return
        self._flushing = True
        self._flushing_upto = self.staged
        d = deferred_from_coro(self.store.flush())
        d.addCallbacks(self._flushed, self._flush_failed)
        self._flush_done = d

    async def commit_staged(self) -> None:
        """Commit what is staged now, waiting for a flush under way.

        Cluster mode calls it before a worker gives back its requests, so
        that the ones it processed are released instead of fetched again.
        Nothing happens with a failed store or state held for the feeds.
        """
        for _ in range(3):  # a flush under way, then ours
            if self._flushing and self._flush_done is not None:
                await maybe_deferred_to_future(self._flush_done)
                continue
            if self._failed or self._hold_until_feeds is not None:
                return
            if not self.store.pending:
                self.committed = self.staged
                return
            self.flush()

    def _flushed(self, count: int) -> None:
        self._flushing = False
        self.committed = max(self.committed, self._flushing_upto)
        self._count_commit(count)

    def _count_commit(self, count: int) -> None:
        """A commit of *count* writes, during the crawl or the last one at its close."""
        if count:
            self.stats.inc_value("incremental/store_flushes")
            self.stats.inc_value("incremental/store_writes", count)

    def _flush_failed(self, failure: Failure) -> None:
        self._flushing = False
        assert failure.value is not None
        self.store_failed(failure.value)

    @property
    def failed(self) -> bool:
        """Whether the store failed: the crawl stops, and emits no more
        items (they would not be stored: the next crawl emits them again)."""
        return self._failed

    def store_failed(self, error: BaseException) -> None:
        """The store failed (a commit or a read): stop the crawl, loudly, once.

        Staged writes stay staged (the store keeps them; closing tries once
        more), so nothing that was not stored is recorded as done: the next
        run fetches those pages again.
        """
        self.stats.inc_value("incremental/store_errors")
        if self._failed:
            return
        self._failed = True
        logger.error(
            "%(error)s; stopping the crawl (nothing not stored is recorded as done)",
            {"error": error},
            extra={"spider": self.crawler.spider},
        )
        engine = self.crawler.engine
        if engine is not None and not engine.running:
            # Before the engine runs (the hold's first refresh, as the
            # spider opens): closed as it starts (else by the next tick).
            self.crawler.signals.connect(self._close_when_started,
                                         signal=signals.engine_started)
        self._close_failed()

    def _close_when_started(self) -> None:
        # engine_started comes a few turns of the loop before the engine
        # runs (the signal is awaited): asked again until it does.
        self._close_failed(tries=100)

    def _close_failed(self, tries: int = 0) -> None:
        """Close the crawl whose store failed, once its engine runs (tried
        again on the next turns of the loop *tries* times, and by each
        tick); meanwhile no item goes out (see :attr:`failed`), none is
        written."""
        engine = self.crawler.engine
        if engine is None or self._close_asked:
            return
        if not engine.running:
            if tries:
                call_later(0, self._close_failed, tries - 1)
            return
        self._close_asked = True
        deferred_from_coro(engine.close_spider_async(reason="incremental_store_error"))
