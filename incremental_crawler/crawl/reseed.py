"""Re-seeding: once a crawl runs out of requests, its due known pages are requested again.

A listing that answers 304 (or is not due) yields no links, so the pages
only it leads to would wait for the listing to change. :class:`Reseeder`,
an extension the add-on installs for every spider, makes up for it: once per
crawl, when the engine is idle, it reads from the store the pages of the
crawl's own scope whose revisit is due in this crawl, most overdue first,
in pages of a bounded size, decides each (see below) and requests at most
``INCREMENTAL_RESEED_LIMIT`` of them again as the page's own request was
made: its callback, and what :func:`~.recipes.own_recipe` kept
of it (meta such as a CrawlSpider's rule index, ``cb_kwargs``, errback,
priority). A page whose request cannot be made again (its callback or rule
is gone, its request could not be recorded, the record is not one this
version reads) is skipped and counted
(``incremental/reseed/skipped/<reason>``).

How the requests are made: a local ``data:`` request goes through the
scheduler, and its callback reads the store and yields the pages' requests.
A callback may await (the store may be remote: no read blocks the reactor),
the engine does not close the spider while the request is processed, and
what the callback yields is handled as any callback's output: through the
spider middlewares (depth, referer, URL length, the project's own), the
scheduler and its dupefilter, so a page already requested this crawl is not
requested twice. Requests made by ``engine.crawl()`` from the idle handler
would skip the spider middlewares.

Each due page is decided as a listed page is
(:func:`~incremental_crawler.change.policy.schedule_why`): retried after a
failure, rechecked, refreshed for max age, or due. A page flagged GONE is
in the store's due pages once its rare recheck (INCREMENTAL_GONE_RECHECK)
is due: it is asked as a new page, without conditions, so one restored
behind a list that answers 304 is found. A page vouched for by a
modification-date lastmod recorded with it (PageFlags.LASTMOD_MODIFIED),
whose last answer was a 2xx or 304, on a host whose lastmods are trusted,
stays "due" by its schedule but is not requested (its lastmod is
authoritative): counted skipped, except the rotating sample
(:mod:`incremental_crawler.change.sample`), per host. Such pages are read
past, so they never crowd out the pages really due, and each one skipped
moves on by its interval in the store (``incremental/reseed/postponed``), so
the next crawls do not read past it again before then. Each request carries
its why (META_WHY). The due pages are read in pages of ``_READ``, each
after the last page read (a store answers at the cost of what it reads),
and the pages not due are counted from the store's sums.

Spiders steer it with optional attributes, looked up on the spider:
``incremental_reseed = False`` turns it off (as does
``INCREMENTAL_RESEED_ENABLED``, also in ``custom_settings``),
``needs_reseed()`` says whether this crawl may have missed known pages, and
``reseed_skip(state)`` leaves out a due page (the sitemap and feed spiders
re-seed only when a list was not read, and never the pages a list named).

Cluster mode: one worker per run re-seeds (the pages go to the shared
queue), once no worker can discover more links.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Protocol

from scrapy import Request, signals
from scrapy.exceptions import DontCloseSpider, NotConfigured

from incremental_crawler import clock
from incremental_crawler.change.accounting import META_LASTMOD_MODIFIED, Why, mark
from incremental_crawler.change.policy import CrawlDueRules, schedule_why
from incremental_crawler.change.sample import RotatingSample
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.hosts import host_of
from incremental_crawler.meta import META_LASTMOD, META_SKIP, META_VARIANT
from incremental_crawler.recipes import Unbuildable, page_request
from incremental_crawler.state.records import PageFlags
from incremental_crawler.state.stores.base import due_after

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from typing import Self

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from incremental_crawler.state.records import PageKey, PageState
    from incremental_crawler.state.stores.base import DueAfter

__all__ = ["CALLBACK_ATTRIBUTE", "RESEED_URL", "Reseeder", "RunClaims"]

logger = logging.getLogger(__name__)


class RunClaims(Protocol):
    """A cluster's jobs done once per run, by the one worker that claims them
    (what the re-seeder asks of the cluster's coordinator). A claim not
    done (:meth:`claim_done`) whose worker died is taken over by the next
    worker that claims the job."""

    def claim(self, job: str) -> bool: ...

    def quiet(self) -> bool: ...

    def claim_done(self, job: str) -> None: ...

#: The local request whose callback reads the due pages.
RESEED_URL = "data:,reseed"

#: The spider attribute holding that callback. Scrapy serialises a request
#: (JOBDIR's disk queues, cluster mode's shared queue) with the name its
#: callback has among the spider's methods, and an extension's method has
#: none: held by the spider, it has one (Scrapy's lookup sees bound methods
#: held by the instance too). The worker that pops the request may not be
#: the one that queued it: it finds its own Reseeder's callback there.
CALLBACK_ATTRIBUTE = "_incremental_reseed_due"

#: Due pages (and pages requested in the sum) read from the store at a time.
_READ = 1000
#: Per host, the sample keeps the least recently checked of at most this
#: many vouched pages' share (a bound on memory: share * this states).
_SAMPLE_BASE = 50_000

#: Priority added to a page that changed on every visit (pages that changed
#: often are likelier to have changed again).
CHANGE_PRIORITY = 100


class Reseeder:
    """Extension; see the module docstring."""

    def __init__(self, crawler: Crawler, config: IncrementalConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.stats = crawler.stats
        #: Whether this worker queued the re-seed request (once per crawl).
        self.requested = False
        # The spider is bound when it opens: a crawler built for a test
        # (scrapy.utils.test.get_crawler) has none while extensions are built.
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_idle, signal=signals.spider_idle)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = IncrementalConfig.from_settings(crawler.settings)
        if not config.reseeds:
            # Without revisits no page is ever due: nothing to re-seed. No
            # message: Scrapy would log a warning for a choice.
            raise NotConfigured
        return cls(crawler, config)

    @property
    def spider(self) -> Spider:
        spider = self.crawler.spider
        assert spider is not None
        return spider

    def spider_opened(self, spider: Spider) -> None:
        setattr(spider, CALLBACK_ATTRIBUTE, self.reseed_due)  # see CALLBACK_ATTRIBUTE
        ledger = self.crawler.get_extension(Ledger)
        if ledger is not None and self.config.reseeds_for(spider):
            ledger.counter.summed = _summed_by(ledger, spider)
            ledger.counter.deferrable = _deferrable_by(ledger, spider)

    def wanted(self) -> bool:
        """Whether the spider wants its due pages re-seeded this crawl."""
        if not self.config.reseeds_for(self.spider):
            return False
        needs = getattr(self.spider, "needs_reseed", None)
        return bool(needs()) if callable(needs) else True

    def _cluster(self) -> RunClaims | None:
        """The cluster's claims on a run's jobs, in cluster mode (only then
        are there any): :class:`~incremental_crawler.cluster.reseed.ClusterReseeder`
        answers them, the re-seeder cluster mode installs in this one's place."""
        return None

    def spider_idle(self) -> None:
        # Once per crawl, when the links are exhausted.
        if self.requested or not self.wanted():
            return
        cluster = self._cluster()
        if cluster is not None:
            # In cluster mode: by one worker per run (the due pages go to
            # the shared queue), once no worker can discover more links.
            # Claimed first: the others wait for a claimed job to be done
            # instead of leaving before its pages are queued (and take it
            # over if its worker dies first: asked again at each idle).
            if not cluster.claim("reseed"):
                return
            if not cluster.quiet():
                raise DontCloseSpider
        self.requested = True
        engine = self.crawler.engine
        assert engine is not None
        engine.crawl(
            Request(
                RESEED_URL, callback=self.reseed_due, dont_filter=True,
                meta={META_SKIP: True, "allow_offsite": True},
            )
        )
        if cluster is not None:
            cluster.claim_done("reseed")  # the request is queued: the cluster is busy
        raise DontCloseSpider

    async def reseed_due(self, response: Response) -> AsyncIterator[Request]:
        """The re-seed request's callback: the due pages' requests."""
        ledger = self.crawler.get_extension(Ledger)
        if ledger is None:
            return
        # This crawl's own visits first: a page checked already is not due
        # any more, though a 304's check is invisible until committed (and a
        # request with dont_filter, a start URL, passes the dupefilter).
        await ledger.commit_staged()
        ledger.gather_listings()
        # Decided in full before any is yielded: a request fetched meanwhile
        # would move its page out of the pages still to read.
        requests = await _DueReader(self, ledger).read()
        self.stats.inc_value("incremental/reseeded", len(requests))
        logger.info("Re-seeded %(count)d due pages from the store", {"count": len(requests)})
        for request in requests:
            yield request

    def build(self, state: PageState, why: Why) -> Request | None:
        """The page's request carrying *why*, or ``None`` (counted) if it cannot be made."""
        request = self.request_for(state)
        if isinstance(request, Unbuildable):
            self.stats.inc_value(f"incremental/reseed/skipped/{request.value}")
            logger.debug("Not re-seeding %(url)s: %(reason)s",
                         {"url": state.key.url, "reason": request.value})
            return None
        mark(request, why, state.key)
        return request

    def request_for(self, state: PageState) -> Request | Unbuildable:
        """The due page's own request again, or why it cannot be made."""
        # "parse" is also what a request without a callback is stored as:
        # Scrapy then calls spider._parse, which is parse for a Spider and,
        # for a CrawlSpider, parse_start_url and its rules (its parse is
        # not a callback). None does the same for both.
        callback = None if state.callback == "parse" else state.callback
        request = page_request(state.key.url, callback, state.recipe, self.spider)
        if isinstance(request, Unbuildable):
            return request
        meta: dict[str, Any] = dict(request.meta)
        if state.key.variant:
            meta[META_VARIANT] = state.key.variant
        if state.flags & PageFlags.LASTMOD_MODIFIED and meta.get(META_LASTMOD) is not None:
            # The recipe keeps the lastmod but not our own (underscored)
            # meta: without this, the fetch would record the date as a
            # publication date and the page would lose its vouching.
            meta[META_LASTMOD_MODIFIED] = True
        changed = CHANGE_PRIORITY * state.changes // max(state.checks, 1)
        # Never dont_filter (a start URL's): a page this crawl requested
        # already is not requested again.
        return request.replace(meta=meta, priority=request.priority + changed,
                               dont_filter=False)


def _summed_by(ledger: Ledger, spider: Spider) -> Callable[[PageState], bool]:
    """Whether a page's stored state puts it among the pages the re-seeder
    counts not due by the store's sums (:meth:`_DueReader.count_the_rest`).
    Asked from the crawl's start on, before the sums are read: a page
    counted one by one is told apart from them (in cluster mode by the run,
    whose start and due time every worker shares)."""
    scope = ledger.scope
    lists = frozenset(getattr(spider, "list_callbacks", ()))

    def summed(state: PageState) -> bool:
        second_after = math.floor(ledger.crawl_started) + 1
        return (state.key.scope == scope and state.next_visit > ledger.due_at
                and state.last_checked < second_after and state.callback is not None
                and state.callback not in lists)

    return summed


def _deferrable_by(ledger: Ledger, spider: Spider) -> Callable[[PageState], bool]:
    """Whether a page's stored state puts it among the due pages the
    re-seeder sums when it defers some (:meth:`_DueReader.count_deferred`):
    in cluster mode, a page another worker requests leaves the deferred
    column by it (the run tells whether the re-seeder deferred any)."""
    scope = ledger.scope
    lists = frozenset(getattr(spider, "list_callbacks", ()))

    def deferrable(state: PageState) -> bool:
        return (state.key.scope == scope and state.next_visit <= ledger.due_at
                and state.last_checked < math.floor(ledger.crawl_started)
                and state.callback is not None and state.callback not in lists)

    return deferrable


class _DueReader:
    """One re-seed: reads the due pages, decides them, keeps the sample."""

    def __init__(self, reseeder: Reseeder, ledger: Ledger) -> None:
        self.reseeder = reseeder
        self.ledger = ledger
        self.rules: CrawlDueRules = ledger.due_rules()
        self.limit = reseeder.config.reseed_limit
        self.counter = ledger.counter
        self.skip = getattr(reseeder.spider, "reseed_skip", None)
        self.listed = getattr(reseeder.spider, "lastmod_listed", None)
        self.use_lastmod = bool(getattr(reseeder.spider, "use_lastmod", True))
        self.samples: dict[str, RotatingSample[PageState]] = {}
        self.trusted: dict[str, bool] = {}
        self.requests: list[Request] = []
        #: The counts of the pages decided since the last :meth:`count_decided`.
        self.to_count: list[Callable[[], None]] = []
        #: Vouched pages skipped (not sampled): moved on once counted.
        self.vouched_skipped: list[PageState] = []
        #: The due pages read (decided, or left to whoever decided them).
        self.read_keys: set[PageKey] = set()
        #: Lists are not pages (they are not counted).
        self.list_callbacks: frozenset[str] = frozenset(
            getattr(reseeder.spider, "list_callbacks", ()))

    async def read(self) -> list[Request]:
        last: DueAfter | None = None
        limited = False
        while not (limited := len(self.requests) >= self.limit):
            due = await self.ledger.store.get_due(self.ledger.scope, self.rules.due_at, _READ,
                                                  last)
            if not due:
                break
            last = due_after(due[-1])
            # Decided by a list another worker of the run read (cluster mode).
            elsewhere = self.ledger.decided_elsewhere([state.key.url for state in due])
            for state in due:
                if len(self.requests) >= self.limit:
                    break
                self.read_keys.add(state.key)
                if not self.visited(state) and not (callable(self.skip) and self.skip(state)) \
                        and state.key.url not in elsewhere:
                    await self.decide(state)
            self.count_decided()
        self.take_samples()
        self.count_decided()
        if limited:
            await self.count_deferred()
        await self.count_the_rest()
        self.postpone_vouched()
        return self.requests

    async def count_deferred(self) -> None:
        """Count the due pages left over INCREMENTAL_RESEED_LIMIT: not read,
        so not decided; the most overdue come first next crawl."""
        rules = self.rules
        due = await self.ledger.store.summarize_pages(
            self.ledger.scope, after=-math.inf, upto=rules.due_at,
            checked_before=math.floor(rules.started), exclude_callbacks=self.list_callbacks)
        # Read above, or counted by whoever decided them (a list read in full).
        decided = self.read_keys | self.counter.counted_keys(upto=rules.due_at)
        scope, lists, before = self.ledger.scope, self.list_callbacks, math.floor(rules.started)

        def deferred(state: PageState) -> bool:
            # Among the due pages summed above, and not read.
            return (state.key.scope == scope and state.next_visit <= rules.due_at
                    and state.last_checked < before and state.callback is not None
                    and state.callback not in lists and state.key not in decided)

        pages = due.pages - len(decided)
        if pages > 0:
            # Requested elsewhere before (cluster mode), their visits not
            # stored yet: the sum counted them by the state read now.
            requested = self.counter.deferring() - decided
            pages -= (await self._stored_among(requested, deferred))[0]
        self.counter.deferred(pages, deferred)

    async def count_the_rest(self) -> None:
        """Count the known pages no one decided this crawl: not due (nothing
        listed or linked them, and the pages read above were the due ones).

        Pages checked this crawl and pages counted as not requested already
        (a list read in full, a callback's request dropped) are left out, as
        are lists (they are not pages).
        """
        rules = self.rules
        # Last checks are stored in whole seconds: a previous crawl's visit
        # in the second this crawl started in is stored as this crawl's
        # first visits are. Every page checked up to the end of that second
        # is summed (a crawl started a moment after another, as the demo's,
        # loses none of the first's), and this crawl's visits in it are
        # taken out again, one by one.
        second_after = math.floor(rules.started) + 1
        summary = await self.ledger.store.summarize_pages(
            self.ledger.scope, after=rules.due_at, upto=math.inf,
            checked_before=second_after, exclude_callbacks=self.list_callbacks)
        # Read after the store's sums: a page counted one by one meanwhile
        # is in both (cluster mode: the run's, which counts none from then on).
        counted, counted_size = self.counter.counted_in_sum(rules.due_at)
        early, early_size = await self._visited_first_second(second_after)
        unvisited, unvisited_size = await self._requested_not_stored()
        self.counter.not_due_elsewhere(summary.pages - counted - early - unvisited,
                                       summary.size - counted_size - early_size - unvisited_size,
                                       summary.first_due)

    async def _requested_not_stored(self) -> tuple[int, int]:
        """The pages requested (counted so) that the summary of the rest
        counts all the same: their stored state is the one before their
        visit (held for the feeds, not flushed yet), which the sum counts."""
        summed = self.counter.summed
        requested = self.counter.requested_in_sum() - (self.ledger.first_second_visits() or set())
        if summed is None or not requested:
            return 0, 0
        return await self._stored_among(requested, summed)

    async def _stored_among(self, keys: set[PageKey],
                            among: Callable[[PageState], bool]) -> tuple[int, int]:
        """How many of *keys* have a stored state *among* holds, their sizes."""
        pages = size = 0
        # Read in chunks: a large crawl may have many (one read of all
        # would hold every page's state at once).
        listed = list(keys)
        for start in range(0, len(listed), _READ):
            states = await self.ledger.store.get_pages(listed[start:start + _READ])
            for state in states.values():
                if among(state):
                    pages += 1
                    size += state.size
        return pages, size

    async def _visited_first_second(self, second_after: int) -> tuple[int, int]:
        """This crawl's visits in the second it started in that the summary
        of the rest counts (:meth:`count_the_rest`): how many, their sizes."""
        pages = size = 0
        counted = self.counter.counted_keys(upto=math.inf)
        for key in self.ledger.first_second_visits() - counted:
            state = await self.ledger.store.get_page(key)
            if (state is not None and state.callback is not None
                    and state.callback not in self.list_callbacks
                    and state.next_visit > self.rules.due_at
                    and state.last_checked < second_after):
                pages += 1
                size += state.size
        return pages, size

    def visited(self, state: PageState) -> bool:
        """Whether this crawl checked the page already (decided and counted then).

        Its next visit, counted from the crawl's start, may fall within the
        tolerance: it is due in the next crawl, not again in this one.
        """
        # The ledger knows this worker's visits; the stored time (whole
        # seconds, rounded down, so an earlier crawl's is always before this
        # crawl's start) tells another worker's in cluster mode; one later
        # than now was stored by a clock that was fast (see change.skew).
        return (state.key in self.ledger.visited_due
                or self.rules.started <= state.last_checked <= self.rules.checked_by)

    async def decide(self, state: PageState) -> None:
        self.ledger.clock_skew.notice(state)
        why = schedule_why(state, self.rules, vouched=await self.vouched(state))
        if why is Why.LASTMOD_UNCHANGED:
            host = host_of(state.key.url)
            sample = self.samples.get(host)
            if sample is None:
                share = self.reseeder.config.lastmod_recheck_share
                sample = self.samples[host] = RotatingSample(share, _SAMPLE_BASE)
            if (out := sample.offer(state.last_checked, state)) is not None:
                self.skip_vouched(out)
        elif why is Why.NOT_DUE:
            self.to_count.append(lambda: self.counter.not_due(state))
        else:
            self.add(state, why)

    def count_decided(self) -> None:
        """Count the pages decided since the last call: in cluster mode in
        one round trip per chunk (a re-seed decides up to
        INCREMENTAL_RESEED_LIMIT pages), not one per page."""
        to_count, self.to_count = self.to_count, []
        with self.counter.batch():
            for count in to_count:
                count()

    def skip_vouched(self, state: PageState) -> None:
        """Not requested: vouched for by its lastmod, and not sampled."""
        self.to_count.append(lambda: self.counter.skipped(state))
        self.vouched_skipped.append(state)

    def postpone_vouched(self) -> None:
        """Each vouched page skipped moves on by its interval (from now), so
        the next crawls do not read past it again before then: left to the
        ledger, which stages it when the crawl finishes, if the page's host
        is still trusted then (its sample, asked this crawl, may show its
        dates lie: its pages are then due at the next crawl), and applied
        only if no check moved the page meanwhile."""
        now = clock.now()
        for state in self.vouched_skipped:
            if state.interval > 0 and now + state.interval > state.next_visit:
                self.ledger.postpone_when_finished(state.key, state.next_visit,
                                                   math.floor(now + state.interval))

    def add(self, state: PageState, why: Why) -> None:
        request = self.reseeder.build(state, why)
        if request is not None:
            self.to_count.append(
                lambda: self.counter.requested(why, host_of(state.key.url), state.key))
            self.requests.append(request)

    async def vouched(self, state: PageState) -> bool:
        """Whether a trusted modification-date lastmod recorded with the page vouches for it."""
        if not (self.use_lastmod and state.lastmod is not None
                and state.flags & PageFlags.LASTMOD_MODIFIED):
            return False
        if callable(self.listed) and not self.listed(state):
            # No list of this crawl gives that date any more.
            return False
        host = host_of(state.key.url)
        trusted = self.trusted.get(host)
        if trusted is None:
            book = self.ledger.trust
            trust = await book.load(host)
            # Not on probation for stale lastmods either: then none vouches.
            trusted = self.trusted[host] = (book.trusted(trust, clock.now())
                                            and not book.on_probation(trust))
        return trusted

    def take_samples(self) -> None:
        # At least one per host, beyond the limit: the sample is what keeps
        # a stale lastmod from hiding changes for ever.
        for sample in self.samples.values():
            sampled, rest = sample.take()
            for state in rest:
                self.skip_vouched(state)
            for state in sampled:
                self.add(state, Why.SAMPLED)
