"""One run shared by N workers: membership, in-flight requests, when to stop.

Keys, under ``<INCREMENTAL_CLUSTER_PREFIX>:{<spider>}:`` (the spider's
name in braces: a Redis Cluster hash tag, so that every key of a spider's
crawl is in one hash slot, and each script runs on one node):

- ``queue``: scrapy-redis's priority queue (a sorted set);
- ``run``: the current run's id, its start and its worker TTL
  (``<id>|<start>|<ttl>``: the first worker's clock and
  ``INCREMENTAL_CLUSTER_WORKER_TTL``, every worker of the run must use the
  same); ``{run}:seen`` its dupefilter,
  ``{run}:unrecorded`` its failed pages that could not be
  recorded, ``{run}:claims`` one-per-run jobs (job → the worker that
  claimed it, ``job:done`` once its work is queued; a claim not done whose
  worker is dead is taken over), ``{run}:tombstones``
  gone page (scope, URL and variant, NUL-separated) → the worker that
  sends its tombstone (one per run), ``{run}:listings`` and
  ``{run}:decided`` the lists' memberships and the pages they decided, for
  the worker that re-seeds, ``{run}:counted`` the pages counted in the
  run's accounting (each by one worker: ``count_page.lua``), ``{run}:early``
  the pages visited in the run's first second, ``{run}:left`` the workers
  that left the run (their crawls recorded: what they counted stays
  counted; a page counted by a worker killed is counted again by the next
  worker to reach it);
- ``workers``: worker id → last heartbeat (Redis server time, so workers'
  clocks need not agree); a run none of whose workers beat within the TTL
  is abandoned by the next worker that joins it, for a new run (join.lua);
- ``inflight:{worker}``: ticket → ``score|request`` for every request the
  worker popped and has not finished;
- ``held:{worker}``: the same for requests the worker processed but whose
  page state waits for the end of the crawl to be committed (items only in
  feeds): requeued if the worker dies, but not counted as busy (they
  cannot discover more links), or the cluster would never be quiet.

Every step that moves a request between the queue and an in-flight hash is
one Lua script, so a request is always in exactly one of them, whoever
dies when. Every key a script touches is declared in its KEYS, all of one
hash slot: the same scripts run on one Redis server and on a Redis Cluster
(:mod:`incremental_crawler.redis_cluster` picks the client). The heartbeat,
which requeues what dead workers held and counts the busy ones, is given
the keys of every worker this worker knows of; a worker it did not know
yet (one that joined since) makes the script answer with the members,
change nothing, and be sent again with their keys.

The coordinator talks to Redis synchronously, as scrapy-redis's scheduler
does (Scrapy's scheduler interface is synchronous): one short round trip
to queue a request and one to pop it, one per heartbeat, per failed
page that could not be recorded and per page found gone, two per idle
check, on a Redis that should be near the workers.

A Redis that does not answer (restarted, failing over) is ridden out for
up to ``INCREMENTAL_REDIS_RETRY_TIME`` seconds since it last answered, as
the state store does (:mod:`incremental_crawler.redis_retry`), without
blocking the reactor on the busy paths: meanwhile nothing is popped,
requests to queue wait in this worker (sent, before any ticket is released,
once Redis answers) and only the heartbeat asks Redis, once per beat.
When it answers again, requests this worker popped whose reply was lost
go back to the queue. The rare commands (claims, a tombstone, a failure
that could not be recorded, leaving) wait for Redis where they are. A
Redis silent past the bound stops the worker: one ERROR line, finish
reason ``cluster_redis_error``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from scrapy import signals
from scrapy.exceptions import DontCloseSpider, NotConfigured
from scrapy.utils.asyncio import create_looping_call
from scrapy.utils.defer import deferred_from_coro

from incremental_crawler import clock
from incremental_crawler.change.host_counts import UNLISTED
from incremental_crawler.cluster import ClusterError
from incremental_crawler.cluster.settle import ANSWERS_FIELD, PAGE_FIELD, Settlement
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.lua import load_script
from incremental_crawler.redis_cluster import connect
from incremental_crawler.redis_retry import NO_ANSWER, RedisSilent, Silence
from incremental_crawler.state.records import PageKey
from incremental_crawler.state.stores.base import SHARED_HOLD
from incremental_crawler.uris import redacted

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from incremental_crawler.change.accounting import RunCount, ScheduleCounter
    from incremental_crawler.config import ClusterSettings

logger = logging.getLogger(__name__)

__all__ = ["ClusterCoordinator", "ClusterError"]

#: Where this module's Lua scripts are (``.lua`` files, read by :func:`load_script`).
_LUA_PACKAGE = "incremental_crawler.cluster"

#: ``fenced(run_key, run_id, workers_key, worker, ttl)``: the check every
#: script that writes to the run makes first (see fence.lua), put before its
#: own body, as the state store's scripts take their libraries.
_FENCE = load_script(_LUA_PACKAGE, "fence.lua")

# Join the current run, or start one (stamped with its first worker's
# clock: next visits are counted from the run's start); a run none of whose
# workers is alive is abandoned for a new one. KEYS and ARGV: see join.lua.
_JOIN = load_script(_LUA_PACKAGE, "join.lua")

# Queue a request unless the run has seen it (no fingerprint: dont_filter).
_PUSH = _FENCE + load_script(_LUA_PACKAGE, "push.lua")

# Pop the best request and hold it in the worker's in-flight hash, atomically.
_POP = _FENCE + load_script(_LUA_PACKAGE, "pop.lua")

# Beat: drop finished tickets, move processed ones waiting for the end of
# the crawl to the held hash, stamp the worker, return to the queue what
# workers silent for longer than the TTL held, and say how busy the cluster
# is. KEYS and ARGV: see the comment at the top of beat.lua.
_BEAT = load_script(_LUA_PACKAGE, "beat.lua")

# Leave: what the worker still holds goes back to the queue; the last worker
# out with the queue drained ends the run. KEYS and ARGV: see leave.lua.
_LEAVE = load_script(_LUA_PACKAGE, "leave.lua")

# After Redis did not answer: requests in this worker's in-flight hash that
# it does not know (popped, the reply lost) go back to the queue. KEYS:
# in-flight hash, queue; ARGV: the tickets the worker knows.
_RECLAIM = load_script(_LUA_PACKAGE, "reclaim.lua")


# Claim a one-per-run job (taken over from a dead owner that did not do
# it). KEYS and ARGV: see claim.lua.
_CLAIM = _FENCE + load_script(_LUA_PACKAGE, "claim.lua")

# A claimed job queued its work, if the caller still owns it. KEYS and
# ARGV: see claim_done.lua.
_CLAIM_DONE = _FENCE + load_script(_LUA_PACKAGE, "claim_done.lua")

# Claim a gone page's tombstone for the run (one per run). KEYS and ARGV:
# see claim_tombstone.lua.
_CLAIM_TOMBSTONE = _FENCE + load_script(_LUA_PACKAGE, "claim_tombstone.lua")

# Count pages in the run's accounting, each once. KEYS and ARGV: see count_page.lua.
_COUNT_PAGE = _FENCE + load_script(_LUA_PACKAGE, "count_page.lua")

# Merge a page's answer into its column for the run. KEYS, ARGV: see answer.lua.
_ANSWER = _FENCE + load_script(_LUA_PACKAGE, "answer.lua")

# The re-seeder counts the pages not due in bulk. KEYS: see bulk_counted.lua.
_BULK_COUNTED = _FENCE + load_script(_LUA_PACKAGE, "bulk_counted.lua")

# A plain write to a run key, refused to a worker fenced off the run.
# KEYS and ARGV: see run_note.lua.
_RUN_NOTE = _FENCE + load_script(_LUA_PACKAGE, "run_note.lua")

# How many jobs other live workers claimed and have not done yet.
# KEYS: claims, workers; ARGV: this worker, the worker TTL.
_CLAIMS_PENDING = load_script(_LUA_PACKAGE, "claims_pending.lua")


#: Heartbeat round trips at most, when workers keep joining between them
#: (and joins, when the run keeps changing between reading it and joining).
BEAT_TRIES = 5
#: A worker starting while the run's last worker settles it (join.lua)
#: asks again every SETTLING_POLL s, SETTLING_WAIT s at most (a settler
#: killed is silent past the TTL, and its run abandoned). The wait blocks
#: the reactor, which refreshes the scope hold the ledger took before the
#: join (60 s, crawl/ledger.py HOLD_TTL) and handles SIGTERM: it stays well
#: below that TTL, and a settle that outlasts it stops the joiner (start it
#: again once the run is over) rather than let its hold lapse.
SETTLING_POLL, SETTLING_WAIT = 0.5, 40.0
#: Members a round trip when a large run set is read (SSCAN's COUNT).
SCAN_CHUNK = 1000

#: The keys of a run, ``<run>:<name>``, in the order join.lua and leave.lua
#: take them (join.lua reads ``unrecorded``, the second).
RUN_KEYS = ("seen", "unrecorded", "claims", "tombstones", "listings", "decided", "counted",
            "early", "left", "requested_in_sum")


class LostSum(NamedTuple):
    """What the worker that ends a run counts for its re-seeder, killed
    (leave.lua): the pages not due and their size (and the earliest next
    visit among them); *taken* ``"sum"``: the sum the re-seeder recorded,
    ``"left"``: the pages counted leaving a sum it did not record, ``""``:
    nothing; then the same for the due pages it deferred."""

    pages: int
    size: int
    first_due: float | None
    taken: str
    deferred: int
    deferred_taken: str


#: How the run scripts refuse a worker fenced off the run (fence.lua): its
#: run is no longer the current one, or it was taken for dead.
FENCED = "FENCED"


def fenced_off(exc: redis.RedisError) -> bool:
    """Whether *exc* is a run script refusing a fenced worker."""
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(FENCED)


def run_field(key: PageKey) -> bytes:
    """A page's field in the run's counted pages: 12 bytes of a hash of its
    key (a full URL would make the hash, one hash slot, ~3x the size)."""
    return hashlib.blake2b("\0".join(key).encode(), digest_size=12).digest()


def spider_key(prefix: str, spider: str) -> str:
    """Where the keys of *spider*'s crawl are: ``<prefix>:{<spider>}`` (the
    braces: a Redis Cluster hash tag, one hash slot for every key of it)."""
    return f"{prefix}:{{{spider}}}"


class ClusterCoordinator:
    """This worker's membership of the cluster's current run."""

    #: Whether this worker, ending the run, counted what its killed
    #: workers' stats took with them (:meth:`settle_killed`).
    _settled = False
    #: The replies of the pages' answers merged again while settling the
    #: run's killed workers (:meth:`settle_killed`), by field: kept across
    #: its tries.
    _settle_replies: dict[bytes, str] | None = None
    #: The tags of the killed workers it settled: its leave.lua records them
    #: as gone with their counts recorded (in this worker's crawl).
    _settled_tags: frozenset[str] = frozenset()
    #: How long a worker starting waits for the run's last worker to end it
    #: while it settles its killed workers' counts (seconds).
    settling_wait = SETTLING_WAIT

    def __init__(self, crawler: Crawler, config: ClusterSettings) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        #: The INCREMENTAL_CLUSTER_* settings, checked.
        self.config = config
        self.url = config.url
        self.prefix = config.prefix
        self.heartbeat = config.heartbeat
        self.worker_ttl = config.worker_ttl
        self.idle_grace = config.idle_grace
        #: The worker's tag in the run's counted pages: its id's random part.
        self.tag = uuid.uuid4().hex[:8]
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{self.tag}"
        #: Since when Redis has not answered (INCREMENTAL_REDIS_RETRY_TIME).
        self.silence = Silence(f"Cluster {redacted(self.url)}", config.retry_time)
        #: Requests to queue while Redis does not answer: (fingerprint, score, data).
        self._unsent: list[tuple[str | None, float, bytes]] = []
        try:
            # No retries in the client: a Redis that does not answer is
            # ridden out by self.silence, never by blocking the reactor.
            self.redis = connect(self.url, socket_timeout=10, retry=Retry(NoBackoff(), 0))
            self.redis.ping()
        except (redis.RedisError, ValueError) as exc:
            raise ClusterError(
                f"INCREMENTAL_CLUSTER_URL {redacted(self.url)}: {exc}"
            ) from exc
        self._join = self.redis.register_script(_JOIN)
        self._push = self.redis.register_script(_PUSH)
        self._pop = self.redis.register_script(_POP)
        self._beat = self.redis.register_script(_BEAT)
        self._leave = self.redis.register_script(_LEAVE)
        self._claim = self.redis.register_script(_CLAIM)
        self._claim_done = self.redis.register_script(_CLAIM_DONE)
        self._claims_pending = self.redis.register_script(_CLAIMS_PENDING)
        self._claim_tombstone = self.redis.register_script(_CLAIM_TOMBSTONE)
        self._reclaim = self.redis.register_script(_RECLAIM)
        self._count_page = self.redis.register_script(_COUNT_PAGE)
        self._bulk_counted = self.redis.register_script(_BULK_COUNTED)
        self._answer = self.redis.register_script(_ANSWER)
        self._run_note = self.redis.register_script(_RUN_NOTE)
        #: Calls of :meth:`answer` so far: each has its own id.
        self._answer_calls = 0
        self.run: str | None = None
        self.spider_key = ""
        #: The other workers of the run this worker knows of (the heartbeat
        #: is given their keys).
        self._others: list[str] = []
        #: Requests this worker popped and has not finished, by ticket.
        self._tickets: dict[bytes, Request] = {}
        #: Processed requests → the ledger's staged count when first seen
        #: done: released once the ledger committed that far.
        self._processed: dict[bytes, int] = {}
        #: Processed requests moved to the held hash (their page state is
        #: committed only when the crawl ends).
        self._held: set[bytes] = set()
        self._quiet_since: float | None = None
        #: Whether this worker ran out of work and waits for the others.
        self._waiting = False
        self._task: Any = None
        #: Since when Redis has been failing (monotonic), and whether this
        #: worker gave up on it.
        self._failing_since: float | None = None
        self._lost = False
        #: Whether this worker was fenced off its run (see :meth:`fenced`).
        self._fenced = False
        #: Failed pages of the whole run that could not be recorded, read
        #: when this worker leaves.
        self.run_unrecorded: int | None = None
        #: When the run started (its first worker's clock), once joined.
        self.run_started: float | None = None
        #: The crawl's ledger (None with INCREMENTAL_ENABLED=False), once joined.
        self.ledger: Ledger | None = None
        #: The crawl's accounting (the ledger's), once the spider opened.
        self.counter: ScheduleCounter | None = None
        crawler.signals.connect(self.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = IncrementalConfig.from_settings(crawler.settings).cluster
        if config is None:
            raise NotConfigured("INCREMENTAL_CLUSTER_URL is not set")
        return cls(crawler, config)

    @classmethod
    def of(cls, crawler: Crawler) -> Self:
        """The crawler's coordinator (an extension; the scheduler needs it)."""
        coordinator = crawler.get_extension(cls)
        if coordinator is None:
            raise ClusterError(
                "cluster mode needs the ClusterCoordinator extension: set "
                "INCREMENTAL_CLUSTER_URL and install the add-on"
            )
        return coordinator

    def spider_opened(self) -> None:
        # Every component exists now: the ledger counts this worker's
        # unrecorded failures for the whole run.
        self.ledger = self.crawler.get_extension(Ledger)
        if self.ledger is not None:
            self.ledger.run_gate = self
            # Each page in one column for the run, whichever workers count it.
            self.ledger.counter.run = self
            self.counter = self.ledger.counter

    # -- keys ------------------------------------------------------------------

    def key(self, name: str) -> str:
        return f"{self.spider_key}:{name}"

    @property
    def queue_key(self) -> str:
        return self.key("queue")

    @property
    def inflight_prefix(self) -> str:
        return self.key("inflight:")

    @property
    def held_prefix(self) -> str:
        return self.key("held:")

    @property
    def run_prefix(self) -> str:
        return self.key(f"{self.run}:")

    @property
    def run_id(self) -> str:
        """The id of this worker's run ('' before it joined one)."""
        return self.run or ""

    @property
    def seen_key(self) -> str:
        return self.run_prefix + "seen"

    def worker_keys(self, worker: str) -> list[str]:
        """*worker*'s in-flight and held hashes."""
        return [self.inflight_prefix + worker, self.held_prefix + worker]

    def _know(self, workers: list[bytes]) -> None:
        self._others = [w.decode() for w in workers if w.decode() != self.worker_id]

    # -- membership ------------------------------------------------------------

    def join(self, spider: Spider) -> None:
        """Join the spider's current run, or start one (called by the scheduler)."""
        # The spider's name is the hash tag of every key of its crawl.
        self.spider_key = spider_key(self.prefix, spider.name)
        new_run = uuid.uuid4().hex[:12]
        ledger = self.crawler.get_extension(Ledger)
        if ledger is not None and ledger.hold_name.startswith(SHARED_HOLD):
            # Named as its hold on the scope (taken before it joins): the
            # holder `scrapy state` names is the worker the cluster knows.
            self.worker_id = ledger.hold_name.removeprefix(SHARED_HOLD)
        run, workers, abandoned = self._join_run(new_run)
        run_id, _, rest = run.decode().partition("|")
        started = rest.partition("|")[0]
        self.run = run_id
        self.run_started = float(started)
        self._know(workers)
        # The scheduler opens before the spider_opened signal: the ledger
        # holds its scope, and records its crawl, as this worker.
        if ledger is not None:
            ledger.worker = self.worker_id
            if run_id == new_run:
                # This worker started the run: the store notes the run's
                # checks from its start, once a run (see mark_run_start).
                ledger.store.mark_run_start(ledger.scope, self.run_started)
        self.stats.set_value("cluster/worker", self.worker_id)
        self.stats.set_value("cluster/run", self.run)
        if abandoned:
            self.stats.inc_value("cluster/abandoned_runs")
            logger.warning(
                "Cluster: run %(old)s of %(spider)s had no live worker (none beat within "
                "INCREMENTAL_CLUSTER_WORKER_TTL): abandoned, its keys deleted; run %(run)s "
                "starts in its place", {"old": abandoned, "spider": spider.name, "run": run_id},
            )
        logger.info(
            "Cluster %(url)s: worker %(worker)s joined run %(run)s of %(spider)s",
            {"url": redacted(self.url), "worker": self.worker_id,
             "run": self.run, "spider": spider.name}, extra={"spider": spider},
        )
        self._task = create_looping_call(self.beat)
        self._task.start(self.heartbeat, now=False)

    def _join_run(self, new_run: str) -> tuple[bytes, list[bytes], str]:
        """join.lua: the run joined (``<id>|<start>``), the workers, and the
        id of the run abandoned for it ('' if none was). While the run's
        last worker settles its killed workers' counts, this one waits for
        it to end (polls, :attr:`settling_wait` at most)."""
        said = False
        for _ in range(int(self.settling_wait / SETTLING_POLL) + 1):
            joined = self._join_once(new_run)
            if not isinstance(joined, str):
                return joined
            if not said:
                said = True
                logger.info("Cluster: worker %(settler)s is ending the run of %(spider)s "
                            "(it counts its killed workers' counts); worker %(worker)s "
                            "waits to start the next",
                            {"settler": joined, "spider": self.spider_key,
                             "worker": self.worker_id})
            time.sleep(SETTLING_POLL)
        raise ClusterError(
            f"the run of {self.spider_key} was still being ended by worker {joined} after "
            f"{self.settling_wait:g} s (it counts its killed workers' counts): start this "
            "worker again once it is over")

    def _join_once(self, new_run: str) -> tuple[bytes, list[bytes], str] | str:
        """:meth:`_join_run` once: or the worker settling the run ended."""
        for _ in range(BEAT_TRIES):
            # Read first: the script deletes the abandoned run's keys, and
            # every key it touches is named in KEYS.
            self.roundtrip()
            current = self.redis.get(self.key("run"))
            text = current.decode() if isinstance(current, bytes) else current
            old = text.partition("|")[0] if text else None
            keys = [self.key("run"), self.key("workers"),
                    self.key(f"{new_run}:unrecorded"),
                    *(self.key(f"{old}:{name}") for name in (*RUN_KEYS, "abandoned")
                      if old is not None)]
            self.roundtrip()
            reply = self._join(keys=keys, args=[self.worker_id, new_run, repr(clock.now()),
                                                self.worker_ttl, current or b""])
            if len(reply) == 3:
                run, workers, abandoned = reply
                return run, workers, abandoned.decode()
            if reply[0] == b"settling":
                return cast("bytes", reply[1]).decode()
            if reply[0] == b"ttl":
                raise ClusterError(
                    f"INCREMENTAL_CLUSTER_WORKER_TTL is {self.worker_ttl:g} s here, but the "
                    f"current run of {self.spider_key} (run {old}) was started with "
                    f"{float(reply[1]):g} s: every worker of a run must use the same "
                    "(a smaller one takes live workers for dead); set it alike on every "
                    "worker, or start the workers anew once this run ended")
        raise ClusterError(f"the run of {self.spider_key} changed at each of {BEAT_TRIES} "
                           "tries to join it")

    def leave(self, reason: str) -> None:
        """Give back what this worker holds; end the run if it was the last."""
        if self._task is not None and self._task.running:
            self._task.stop()
        if self.run is None:
            return
        # Every request is processed and the ledger committed what it could
        # (ClusterScheduler.close): what is committed is released.
        # "finished" releases the rest too (state held for the feeds, or
        # committed when the spider closes: a failure there is loud and
        # keeps nothing). Any other ending (shutdown, a store failure)
        # gives back every request whose page is not committed: it is
        # fetched again, none is lost.
        try:
            self.silence.again_blocking(
                lambda: self._beat_once(release_all=reason == "finished"))
            back, unrecorded, ended, taken_over = self.silence.again_blocking(self._leave_run)
        except redis.RedisError as exc:
            # run_unrecorded stays unknown: the sitemaps' state is not saved.
            # What this worker held is reaped by the others once Redis is back.
            # Said once: a worker that gave up on Redis said why already.
            logger.log(logging.WARNING if self._lost else logging.ERROR,
                       "Cluster %(url)s: leaving the run failed (%(error)s)",
                       {"url": redacted(self.url), "error": exc})
            self.stats.inc_value("cluster/redis_errors")
            # Whether the run kept this worker's counts (leave.lua ran) is
            # unknown: they are handed to the run, which counts them again
            # if it did not; if it did, the run's totals miss them, and
            # this crawl's record says they may be incomplete.
            if self.counter is not None:
                self.counter.hand_over_to_run()
                self.stats.set_value("cluster/run_counts_incomplete", 1)
            self.redis.close()
            return
        if self._fenced and self.counter is not None:
            self._settle_fenced_counts(ended)
        if unrecorded >= 0:
            self.run_unrecorded = unrecorded
        elif not self._fenced:  # a fenced worker said so when it was fenced
            # This worker was silent past the TTL and its run, every worker
            # of it taken for dead, was abandoned: what it failed to record
            # is unknown, the sitemaps' state is not saved.
            logger.warning("Cluster: run %(run)s was abandoned while worker %(worker)s was "
                           "silent; it left a run that is no more",
                           {"run": self.run, "worker": self.worker_id})
            self.stats.inc_value("cluster/left_abandoned_run")
        if back:
            self.stats.inc_value("cluster/requeued_on_leave", back)
        if taken_over is not None:
            self._take_over_sum(taken_over)
        logger.info(
            "Cluster: worker %(worker)s left run %(run)s (%(reason)s)%(end)s",
            {"worker": self.worker_id, "run": self.run, "reason": reason,
             "end": "; the run is over" if ended else ""},
        )
        self._tickets.clear()
        self._held.clear()
        self.redis.close()

    def _settle_fenced_counts(self, ended: int) -> None:
        """Where the counts of this worker, fenced (taken for dead), go once
        it left. Its run, still current or ended by another worker, counts
        them again (the worker that reaches a page next, or the one that
        ends the run): they are handed to it. A run abandoned meanwhile
        (join.lua, marked "<run>:abandoned") counts nothing more: they stay
        in this crawl's record."""
        counter = self.counter
        assert counter is not None
        if not ended:
            try:
                self.roundtrip()
                abandoned = self.redis.exists(self.run_prefix + "abandoned")
            except redis.RedisError as exc:
                # Unknown: handed over, and the totals said incomplete.
                logger.warning("Cluster %(url)s: whether run %(run)s was abandoned is unknown "
                               "(%(error)s): this worker's counts are handed to it, and its "
                               "totals may be short", {"url": redacted(self.url),
                                                       "run": self.run, "error": exc})
                self.stats.inc_value("cluster/redis_errors")
                counter.hand_over_to_run()
                self.stats.set_value("cluster/run_counts_incomplete", 1)
                return
            if abandoned:
                logger.warning("Cluster: run %(run)s was abandoned while worker %(worker)s was "
                               "taken for dead: no run counts its pages again, its crawl "
                               "record keeps its counts", {"run": self.run,
                                                           "worker": self.worker_id})
                self.stats.set_value("cluster/counts_kept_run_abandoned", 1)
                return
        counter.hand_over_to_run()
        if ended:
            # ... but this worker ended it: nobody settles them.
            self.stats.set_value("cluster/run_counts_incomplete", 1)

    def _leave_run(self) -> tuple[int, int, int, LostSum | None]:
        """leave.lua: (requeued, the run's unrecorded failures or -1, whether
        the current run ended, what this worker counts for a re-seeder whose
        crawl is not recorded). A worker whose leaving ends the run settles
        its killed workers' counts first (:meth:`settle_killed`)."""
        for _ in range(BEAT_TRIES + 1):
            # Read first: the last worker out ends the current run, whichever
            # it is, and every key the script touches is named in KEYS.
            self.roundtrip()
            current = self.redis.get(self.key("run"))
            text = current.decode() if isinstance(current, bytes) else current
            named = text.partition("|")[0] if text else None
            self.roundtrip()
            reply = self._leave(keys=self.leave_keys(named),
                                args=[self.worker_id, self.run_id, current or b"",
                                      "1" if self._fenced else "0",
                                      "1" if self._settled else "0",
                                      *sorted(self._settled_tags)])
            if reply[0] == b"settle":
                killed = {tag.decode() for tag in reply[1:]}
                self.settle_killed(killed)
                self._settled_tags |= killed
                continue
            if len(reply) == 9:
                back, unrecorded, ended, pages, size, first_due, taken, deferred, dtaken = reply
                lost = (LostSum(int(pages), int(size), float(first_due) if first_due else None,
                                taken.decode(), int(deferred), dtaken.decode())
                        if taken or dtaken else None)
                if int(ended):
                    self._forget_ended_reply()
                return int(back), int(unrecorded), int(ended), lost
        raise redis.RedisError(f"the run of {self.spider_key} changed at each of "
                               f"{BEAT_TRIES} tries to leave it")

    def _forget_ended_reply(self) -> None:
        """Delete the reply leave.lua kept for a call run again: it is here.
        Best effort: the run is over with this worker recorded, so a failed
        delete (a failover's READONLY, a lost connection) must not turn the
        leave into a failure; the key expires in a day anyway."""
        self.roundtrip()
        try:
            self.redis.delete(self.run_prefix + f"ended|{self.worker_id}")
        except redis.RedisError as exc:
            logger.warning("Cluster %(url)s: the run is over, but deleting the reply kept for "
                           "its ending leave failed (%(error)s); it expires in a day",
                           {"url": redacted(self.url), "error": exc})
            self.stats.inc_value("cluster/redis_errors")

    def settle_killed(self, killed: set[str]) -> None:
        """This worker is the last of the run, which workers tagged *killed*
        left without their crawls recorded (their stats died with them):
        it counts, in its own figures, what they counted that no worker
        counted again, so that the run's totals hold every page once and no
        column below zero. Read from the run's counted pages in chunks of
        :data:`SCAN_CHUNK`: a page's column a killed worker
        counted (requested, not due, skipped; one it requested leaves the
        column it was in), and each page whose answers a killed worker
        counted, merged again (answer.lua: its answers stand, its counts
        are made again here). Counted once the whole scan is read, columns
        and answers together: a try that fails half way counts nothing, and
        the next gets the replies of the answers merged by then again (one
        call id for them all, kept with the page). It beats between chunks
        (leave stopped the heartbeat); fenced meanwhile, it stops with a
        FENCED error, having counted nothing."""
        counter = self.counter
        if counter is None:
            # No ledger (a worker that never opened its spider): what the
            # killed workers counted is in no crawl's record.
            self.stats.set_value("cluster/run_counts_incomplete", 1)
            self._settled = True
            return
        counted = self.run_prefix + "counted"
        self.roundtrip()
        bulk, summed, deferred, dsum = cast("list[bytes | None]", self.redis.hmget(
            counted, "#bulk", "#sum", "#deferred", "#dsum"))
        recorded = {m.decode() for m in cast("set[bytes]",
                                             self.redis.smembers(self.run_prefix + "left"))}
        recorded.add(self.worker_id)

        @functools.cache
        def worker(tag: str) -> str | None:
            w = cast("bytes | None", self.redis.hget(counted, f"#w|{tag}"))
            return w.decode() if w else None

        @functools.cache
        def sum_left_out(tag: str) -> bool:
            return bool(self.redis.hexists(counted, f"#took|{worker(tag) or ''}"))

        settlement = Settlement(
            killed,
            sum_stands=bulk is not None and (summed is not None
                                             or worker(bulk.decode()) in recorded),
            deferral_stands=deferred is not None and (dsum is not None
                                                      or worker(deferred.decode()) in recorded),
            sum_left_out=sum_left_out)
        # The replies of the pages' answers merged again, by field: kept
        # across tries (a lost reply, a failed chunk), counted only once the
        # whole scan is read, with the columns.
        if self._settle_replies is None:
            self._settle_replies = {}
        replies = self._settle_replies
        settle_call = f"{self.tag}:settle"
        mark = f"{settle_call}=".encode()
        self.roundtrip()
        length = int(self.redis.hlen(counted))
        cursor = 0
        beat_at = time.monotonic()
        for _ in range(16 + 2 * length // SCAN_CHUNK):
            beat_at = self._beat_while_settling(beat_at)
            self.roundtrip()
            cursor, chunk = self.redis.hscan(counted, cursor, count=SCAN_CHUNK)
            merge = []
            for field, value in cast("dict[bytes, bytes]", chunk).items():
                if len(field) == PAGE_FIELD:
                    settlement.page(value)
                elif (len(field) == ANSWERS_FIELD and field.endswith(b"a")
                        and field not in replies
                        and (settlement.answers_lost(value) or mark in value)):
                    merge.append(field)
            if merge:
                # Merged again: the killed workers' answers stand, their
                # counts are made again by this worker. One call id for
                # every page settled: a call run again after its reply was
                # lost gets its first reply (answer.lua).
                replies.update(zip(merge, self._settle_answers(merge, settle_call),
                                   strict=True))
            if int(cursor) == 0:
                break
        else:
            raise ClusterError("the run's counted pages did not end their scan")
        # A run abandoned meanwhile (this worker silent past the TTL, see
        # join.lua) had its keys deleted: the scan ended early, on nothing.
        self.roundtrip()
        run = cast("bytes | None", self.redis.get(self.key("run"))) or b""
        settler = cast("bytes | None", self.redis.hget(counted, "#settling"))
        if not run.startswith(f"{self.run_id}|".encode()) or settler != self.worker_id.encode():
            raise redis.ResponseError(f"{FENCED} run {self.run_id} was abandoned while worker "
                                      f"{self.worker_id} settled it")
        for reply in replies.values():
            counter.count_run_answer(UNLISTED, reply)
        answers = len(replies)
        counter.count_taken_over(settlement.totals)
        self._settled = True
        if settlement.pages or answers:
            self.stats.inc_value("cluster/killed_pages_taken_over", settlement.pages)
            self.stats.inc_value("cluster/killed_answers_taken_over", answers)
            logger.warning(
                "Cluster: %(n)d worker(s) of run %(run)s were killed before their crawls were "
                "recorded; worker %(worker)s, which ends the run, counts what they counted: "
                "%(pages)d pages' columns, %(answers)d pages' answers (their hosts and why "
                "they were requested are not known)",
                {"n": len(killed), "run": self.run, "worker": self.worker_id,
                 "pages": settlement.pages, "answers": answers})

    def _beat_while_settling(self, beat_at: float) -> float:
        """Beat if the last beat (monotonic *beat_at*) is a heartbeat old:
        leave() stopped the heartbeat, and a long settling would be taken
        for dead (a worker joining abandons the run). When it beat last."""
        if time.monotonic() - beat_at < self.heartbeat:
            return beat_at
        self._beat_once(release_all=True)
        if self._fenced:
            raise redis.ResponseError(f"{FENCED} worker {self.worker_id} was taken for "
                                      "dead while it settled the run")
        return time.monotonic()

    def _settle_answers(self, fields: list[bytes], call: str) -> list[str]:
        """answer.lua's event "" for each page's answers field *fields*,
        under the call id *call*: sent together (one round trip for a chunk
        of the scan, not one a page), but on a Redis Cluster, whose client
        pipelines no script."""
        keys = self._counted_keys()
        if isinstance(self.redis, redis.RedisCluster):
            replies = []
            for field in fields:
                self.roundtrip()
                replies.append(self._answer(keys=keys, args=[
                    self.worker_id, self.tag, call, field, "", self.run_id]))
        else:
            self.roundtrip()
            pipe = self.redis.pipeline(transaction=False)
            for field in fields:
                self._answer(keys=keys, args=[
                    self.worker_id, self.tag, call, field, "", self.run_id], client=pipe)
            replies = pipe.execute()
        return [cast("bytes", reply).decode() for reply in replies]

    def _take_over_sum(self, lost: LostSum) -> None:
        """This worker ended the run, whose re-seeder's crawl is not
        recorded (killed): its sum of the pages not due (and its count of
        the due pages it deferred), which died with its stats, is counted
        here, or, if it was killed before it recorded the sum, the pages
        the run's workers counted leaving it are (so that no column of the
        run's totals goes below zero; the rest of that sum is lost, and
        said to be)."""
        counter = self.counter
        if counter is None:
            return
        if lost.deferred_taken:
            # Not told apart by host, as the re-seeder's own count.
            counter.stats.inc_value("incremental/schedule/deferred", lost.deferred)
            if lost.deferred_taken == "sum":
                self.stats.inc_value("cluster/reseeder_deferred_taken_over", lost.deferred)
            else:
                self.stats.inc_value("cluster/reseeder_deferred_lost")
            logger.warning(
                "Cluster: the worker that re-seeded run %(run)s was killed; %(what)s",
                {"run": self.run, "what": f"its {lost.deferred} due pages deferred are "
                 f"counted by worker {self.worker_id}, which ended the run"
                 if lost.deferred_taken == "sum" else "it deferred due pages and was killed "
                 "before it counted them: the run's totals leave them out"})
        if not lost.taken:
            return
        counter.not_due_elsewhere(lost.pages, lost.size, lost.first_due)
        if lost.taken == "sum":
            self.stats.inc_value("cluster/reseeder_sum_taken_over", lost.pages)
            logger.warning(
                "Cluster: the worker that re-seeded run %(run)s was killed; its sum of "
                "%(pages)d pages not due is counted by worker %(worker)s, which ended the run",
                {"run": self.run, "pages": lost.pages, "worker": self.worker_id})
        else:
            self.stats.inc_value("cluster/reseeder_sum_lost")
            logger.warning(
                "Cluster: the worker that re-seeded run %(run)s was killed before it "
                "counted the pages not due: the run's totals leave them out",
                {"run": self.run})

    def leave_keys(self, current: str | None) -> list[str]:
        """The keys of leave.lua, in its order, for the run key naming the
        run *current*."""
        keys = [self.key("workers"), self.queue_key, self.key("run"),
                *self.worker_keys(self.worker_id)]
        keys += (self.key(f"{current or self.run}:{name}") for name in RUN_KEYS)
        keys.append(self.run_prefix + f"ended|{self.worker_id}")
        if current != self.run:
            keys += (self.run_prefix + name for name in RUN_KEYS)
        return keys

    # -- the shared queue ------------------------------------------------------

    def push(self, fingerprint: str | None, score: float, data: bytes) -> bool:
        """Queue a request unless the run has seen *fingerprint*; one round trip.

        While Redis does not answer, the request waits in this worker (True:
        it will be queued, unless the run saw it by then); the heartbeat
        sends it once Redis answers.
        """
        if self._fenced:
            return False
        if self.silence.silent:
            self._unsent.append((fingerprint, score, data))
            return True
        self.roundtrip()
        try:
            queued = self._push(keys=self._push_keys(), args=[fingerprint or "", score, data,
                                                              self.run_id])
        except NO_ANSWER as exc:
            self._unsent.append((fingerprint, score, data))
            self._no_answer(exc)
            return True
        except redis.ResponseError as exc:
            if not fenced_off(exc):
                raise
            self.fenced(str(exc))
            return False
        self.silence.answered()
        return bool(queued)

    def _send_unsent(self) -> None:
        """Queue the requests kept while Redis did not answer (before any ticket
        is released: their parents' pages must not be done before they are queued)."""
        while self._unsent:
            fingerprint, score, data = self._unsent[0]
            self.roundtrip()
            self._push(keys=self._push_keys(), args=[fingerprint or "", score, data, self.run_id])
            self._unsent.pop(0)

    def _push_keys(self) -> list[str]:
        return [self.seen_key, self.queue_key, self.key("run")]

    def queued(self) -> int:
        """Requests queued (while Redis does not answer: those waiting here, at least 1)."""
        if self.silence.silent:
            return max(1, len(self._unsent))
        self.roundtrip()
        try:
            queued = int(self.redis.zcard(self.queue_key))
        except NO_ANSWER as exc:
            self._no_answer(exc)
            return max(1, len(self._unsent))
        self.silence.answered()
        return queued + len(self._unsent)

    def roundtrip(self) -> None:
        self.stats.inc_value("cluster/redis_roundtrips")

    def pop(self) -> tuple[bytes, bytes] | None:
        """The next request's ``(ticket, data)``, held in flight, or None
        (None too while Redis does not answer: the heartbeat asks it)."""
        if self.silence.silent or self._fenced:
            return None
        self.roundtrip()
        try:
            popped = self._pop(keys=[self.queue_key, self.key(f"inflight:{self.worker_id}"),
                                     self.key("run"), self.key("workers")],
                               args=[self.worker_id, self.run_id])
        except NO_ANSWER as exc:
            self._no_answer(exc)
            return None
        except redis.ResponseError as exc:
            if not fenced_off(exc):
                raise
            self.fenced(str(exc))
            return None
        self.silence.answered()
        if not popped:
            return None
        ticket, data = popped
        self._waiting = False
        return ticket, data

    def track(self, ticket: bytes, request: Request) -> None:
        self._tickets[ticket] = request

    # -- heartbeats and the end of a run ---------------------------------------

    def beat(self) -> None:
        # An exception would stop the looping call for good: the others
        # would take this worker for dead while it works.
        was_silent = self.silence.silent
        try:
            self._beat_once()
        except redis.RedisError as exc:
            self._redis_error("heartbeat", exc)
            return
        # After a silence too: nothing was popped meanwhile.
        if self._waiting or was_silent:
            # Scrapy looks at an idle engine only every 5 s: wake it so it
            # pops what the others queued, or closes once the grace passed.
            nextcall = getattr(getattr(self.crawler.engine, "_slot", None), "nextcall", None)
            if nextcall is not None:
                nextcall.schedule()

    def _beat_once(self, *, release_all: bool = False) -> bool:
        """Send a heartbeat; whether the cluster has nothing queued or in flight.

        After Redis did not answer, the requests kept meanwhile are queued
        first, and those popped whose reply was lost go back to the queue.
        A worker fenced off its run (beat.lua) beats no more: not quiet.
        """
        if self._fenced:
            return False
        self._send_unsent()
        if self.silence.missed:
            self.roundtrip()
            back = self._reclaim(keys=[self.key(f"inflight:{self.worker_id}"), self.queue_key],
                                 args=list(self._tickets))
            self.silence.missed = False
            if back:
                self.stats.inc_value("cluster/requeued_unknown", int(back))
        finished: list[bytes]
        hold: list[bytes]
        if release_all:
            finished, hold = list(self._tickets), []
        else:
            finished, hold = self._settled_tickets()
        # Bounded: a worker that joined since the last beat costs one more
        # round trip; the membership changing at every one of them is a fault.
        for _ in range(BEAT_TRIES):
            self.roundtrip()
            others = self._others
            reply = self._beat(
                keys=[self.key("workers"), self.queue_key, self.key("run"),
                      *self.worker_keys(self.worker_id),
                      *(key for worker in others for key in self.worker_keys(worker))],
                args=[self.worker_id, self.worker_ttl, self.run_id, len(finished), len(hold),
                      *finished, *hold, *others],
            )
            if reply == [b"fenced"]:
                self.fenced("")
                return False
            if len(reply) == 1:  # workers it did not know of: their keys, and again
                self._know(reply[0])
                continue
            break
        else:
            raise redis.RedisError(
                f"the run's workers changed at each of {BEAT_TRIES} heartbeats in a row")
        queued, busy, workers, requeued, dead, mine, members = reply
        self._know(members)
        self._failing_since = None
        self.silence.answered()
        for ticket in finished:
            self._tickets.pop(ticket, None)
            self._processed.pop(ticket, None)
            self._held.discard(ticket)
        self._held.update(hold)
        self.stats.max_value("cluster/workers_max", int(workers))
        if dead:
            self.stats.inc_value("cluster/dead_workers", int(dead))
            self.stats.inc_value("cluster/requeued_from_dead", int(requeued))
            logger.warning(
                "Cluster: %(dead)d worker(s) stopped beating; %(n)d of their requests "
                "went back to the queue", {"dead": dead, "n": requeued},
            )
        return not (queued or busy or mine)

    def _settled_tickets(self) -> tuple[list[bytes], list[bytes]]:
        # A request is processed once the engine let go of it: download,
        # callback and item pipelines are done (Scrapy keeps it in the
        # engine slot's ``inprogress`` until then). It is finished once the
        # page state staged by then is committed: a worker killed before
        # that gives the request back instead of losing the page.
        # Returns the finished tickets, and the processed ones to hold: with
        # items only in feeds nothing is committed before the crawl ends.
        inprogress = getattr(getattr(self.crawler.engine, "_slot", None), "inprogress", None)
        if inprogress is None:
            return [], []
        ledger = self.ledger
        holding = ledger is not None and ledger.holds_until_close
        finished, hold = [], []
        for ticket, request in self._tickets.items():
            if request in inprogress:
                continue
            mark = self._processed.setdefault(ticket, ledger.staged if ledger else 0)
            if ledger is None or ledger.committed >= mark:
                finished.append(ticket)
            elif holding and ticket not in self._held:
                hold.append(ticket)
        return finished, hold

    def quiet(self) -> bool:
        """Whether the cluster has been quiet (nothing queued or in flight) long enough.

        Quiet means no worker can discover more links; the grace covers
        another worker's heartbeat lag and a worker about to queue work.
        """
        now = time.monotonic()
        try:
            busy = not self._beat_once() or bool(self._claims_pending(
                keys=[self.run_prefix + "claims", self.key("workers")],
                args=[self.worker_id, self.worker_ttl]))
            self.roundtrip()
        except redis.RedisError as exc:
            # Unknown is not quiet: wait (the engine asks again).
            self._redis_error("idle check", exc)
            busy = True
        if busy:
            self._quiet_since = None
            return False
        if self._quiet_since is None:
            self._quiet_since = now
        return now - self._quiet_since >= self.idle_grace

    def spider_idle(self, spider: Spider) -> None:
        if self.run is None:
            return
        if not self.quiet():
            self._waiting = True
            raise DontCloseSpider

    def _no_answer(self, exc: redis.RedisError) -> None:
        """Redis did not answer: noted (a WARNING the first time); past the
        bound, this worker stops."""
        try:
            self.silence.failed(exc)
        except RedisSilent as silent:
            self.lost(silent)

    def _redis_error(self, what: str, exc: redis.RedisError) -> None:
        self.stats.inc_value("cluster/heartbeat_errors")
        if isinstance(exc, NO_ANSWER):
            self._no_answer(exc)
            return
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if now - self._failing_since > self.worker_ttl:
            # The others have taken this worker for dead by now (its
            # requests went back to the queue): waiting longer is a stall.
            self.lost(exc)
            return
        logger.warning(
            "Cluster %(url)s: %(what)s failed (%(error)s); trying again",
            {"url": redacted(self.url), "what": what, "error": exc},
        )

    def lost(self, exc: redis.RedisError) -> None:
        """The cluster's Redis is gone: stop this worker, loudly.

        Nothing not stored is recorded as done: requests it held go back to
        the queue when Redis returns (the others reap them), pages it could
        not queue are fetched by the next run.
        """
        if fenced_off(exc):
            self.fenced(str(exc))
            return
        self.stats.inc_value("cluster/redis_errors")
        if self._lost:
            return
        self._lost = True
        logger.error(
            "Cluster %(url)s: %(what)s; stopping this worker",
            {"url": redacted(self.url),
             "what": exc if isinstance(exc, RedisSilent) else f"Redis failed ({exc})"},
        )
        engine = self.crawler.engine
        if engine is not None and engine.running:
            deferred_from_coro(engine.close_spider_async(reason="cluster_redis_error"))

    def fenced(self, why: str) -> None:
        """This worker was silent past INCREMENTAL_CLUSTER_WORKER_TTL (a
        pause, a stalled reactor) and the others took it for dead: what it
        held went back to the queue, its claims may be taken over, its run
        may have been abandoned for a new one. It writes nothing more to
        the run and stops, loudly: what it has in flight is fetched again.
        """
        if self._fenced:
            return
        self._fenced = True
        self.stats.inc_value("cluster/fenced")
        logger.error(
            "Cluster: worker %(worker)s of run %(run)s was silent longer than "
            "INCREMENTAL_CLUSTER_WORKER_TTL (%(ttl)s s) and taken for dead%(why)s; "
            "stopping this worker",
            {"worker": self.worker_id, "run": self.run, "ttl": self.worker_ttl,
             "why": f" ({why})" if why else ""},
        )
        # Fenced at any step, before the crawl started too.
        engine = self.crawler._engine
        if engine is not None and engine.running and not self._lost:
            self._lost = True
            deferred_from_coro(engine.close_spider_async(reason="cluster_worker_fenced"))

    def claim(self, job: str) -> bool:
        """Whether this worker holds the run's *job*: the first to claim it
        does, and a worker that claims it after its owner died without
        doing it (:meth:`claim_done`) takes it over."""
        if self._fenced:
            return False
        self.roundtrip()
        try:
            owner, done, taken_from = self.silence.again_blocking(lambda: self._claim(
                keys=[self.run_prefix + "claims", self.key("workers"), self.key("run")],
                args=[job, self.worker_id, self.worker_ttl, self.run_id]))
        except redis.RedisError as exc:
            self.lost(exc)
            return False
        if taken_from:
            self.stats.inc_value("cluster/claims_taken_over")
            logger.warning(
                "Cluster: worker %(dead)s claimed the run's %(job)s and stopped beating "
                "before it was done; worker %(worker)s takes it over",
                {"dead": taken_from.decode(), "job": job, "worker": self.worker_id},
            )
        if owner == self.worker_id.encode():
            return True
        if not done:
            # Another worker holds it and will queue work: be quiet for a
            # whole grace again before taking the cluster for finished.
            # Once it is queued, the queue says whether the cluster is busy:
            # a worker asking again at every idle would never be quiet.
            self._quiet_since = None
        return False

    def claim_done(self, job: str) -> None:
        """The claimed *job* queued its work: the others need not wait for it.

        A job taken over meanwhile (this worker was silent past the TTL:
        taken for dead) is its new owner's to mark done: this worker is
        fenced off the run.
        """
        if self._fenced:
            return
        self.roundtrip()
        try:
            owned = self.silence.again_blocking(lambda: self._claim_done(
                keys=[self.run_prefix + "claims", self.key("run")],
                args=[job, self.worker_id, self.run_id]))
        except redis.RedisError as exc:
            self.lost(exc)
            return
        if not owned:
            self.fenced(f"its claim of the run's {job} was taken over")

    def claim_tombstone(self, key: PageKey) -> bool:
        """Whether this worker sends the gone page *key*'s tombstone (one per run).

        Requests that bypass the run's seen set (``dont_filter``: every
        worker yields the start requests) may ask one page on two workers,
        each reading its state before either found it gone.
        """
        if self._fenced:
            return False
        self.roundtrip()
        try:
            owner = self.silence.again_blocking(lambda: self._claim_tombstone(
                keys=[self.run_prefix + "tombstones", self.key("workers"), self.key("run")],
                args=["\0".join(key), self.worker_id, self.run_id]))
        except redis.RedisError as exc:
            # Not sent, not recorded: the next run decides the page again.
            self.lost(exc)
            return False
        return bool(owner == self.worker_id.encode())

    def note_listing(self, listing: str) -> None:
        """A list this worker read (or found unchanged) is current with
        membership *listing*: for whichever worker re-seeds the run."""
        # Not shared when Redis fails: the re-seeding worker lets fewer dates vouch.
        self._add_to_run_set("listings", listing)

    def run_listings(self) -> set[str] | None:
        """The memberships every worker of the run noted; ``None``: unknown."""
        return self._run_set("listings")

    def _add_to_run_set(self, name: str, member: str) -> None:
        """Add *member* to the run's set *name* (one round trip; a Redis
        failure is noted as lost, and the member is not shared)."""
        self._note_in_run(name, "SADD", member)

    def _note_in_run(self, name: str, command: str, *args: str | bytes) -> bool:
        """Write to the run's key *name* (run_note.lua: *command* and its
        arguments after the key), unless this worker is fenced off the run:
        checked by the script, in the same step (a worker paused past the
        TTL may call this before its next heartbeat tells it so). Whether
        it was written; a Redis failure is noted as lost, a fenced worker
        stops."""
        if self._fenced:
            return False
        self.roundtrip()
        try:
            self.silence.again_blocking(lambda: self._run_note(
                keys=[self.run_prefix + name, self.key("workers"), self.key("run")],
                args=[self.worker_id, self.worker_ttl, self.run_id, command, *args]))
        except redis.RedisError as exc:
            # lost() tells a fenced worker's refusal from a failure.
            self.lost(exc)
            return False
        return True

    def _run_set(self, name: str) -> set[str] | None:
        """The members of the run's set *name*; ``None`` when Redis failed."""
        self.roundtrip()
        try:
            members = self.silence.again_blocking(
                lambda: self.redis.smembers(self.run_prefix + name))
        except redis.RedisError as exc:
            self.lost(exc)
            return None
        return {m.decode() if isinstance(m, bytes) else m for m in members}

    def note_decided(self, urls: list[str]) -> None:
        """Pages a list of this worker named and decided, for the worker
        that re-seeds the run (it would decide and count them again)."""
        if not urls:
            return
        self._note_in_run("decided", "SADD", *urls)

    def decided_in_run(self, urls: list[str]) -> list[bool] | None:
        """Which of *urls* a list of the run decided; ``None``: unknown."""
        self.roundtrip()
        try:
            found = self.silence.again_blocking(
                lambda: self.redis.smismember(self.run_prefix + "decided", urls))
        except redis.RedisError as exc:
            self.lost(exc)
            return None
        return [bool(x) for x in found]

    def count_pages(self, pages: list[RunCount]) -> list[str] | None:
        """Count *pages* in the run's accounting (see
        :meth:`~incremental_crawler.change.accounting.RunCounts.count_pages`):
        one round trip per page this worker counts, or per list's chunk."""
        if self._fenced:
            return None
        args: list[str | bytes | int] = [self.worker_id, self.tag, self.run_id,
                *(arg for key, column, size, in_sum in pages
                  for arg in (run_field(key), column, size, in_sum,
                              "\0".join(key) if column == "r" and in_sum != "0" else ""))]
        self.roundtrip()
        try:
            # Safe to run again (a lost reply): the run answers a worker's
            # own count as it did the first time.
            had = self.silence.again_blocking(lambda: self._count_page(
                keys=self._counted_keys(), args=args))
        except redis.RedisError as exc:
            # Counted by this worker alone: the worker stops anyway.
            self.lost(exc)
            return None
        return [v.decode() if isinstance(v, bytes) else str(v) for v in had]

    def answer(self, key: PageKey, event: str) -> str | None:
        """Merge an answer of *key* into its column for the run (see
        :meth:`~incremental_crawler.change.accounting.RunCounts.answer`):
        one round trip per answer."""
        if self._fenced:
            return None
        self._answer_calls += 1
        args: list[str | bytes] = [self.worker_id, self.tag,
                                   f"{self.tag}:{self._answer_calls}", run_field(key) + b"a",
                                   event, self.run_id]
        self.roundtrip()
        try:
            # Safe to run again: the call's id gets its first reply.
            reply = self.silence.again_blocking(lambda: self._answer(
                keys=self._counted_keys(), args=args))
        except redis.RedisError as exc:
            self.lost(exc)
            return None
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def deferred_counted(self) -> set[PageKey] | None:
        """This worker re-seeded and deferred due pages over its limit (see
        :meth:`~incremental_crawler.change.accounting.RunCounts.deferred_counted`)."""
        if not self._note_in_run("counted", "HSET", "#deferred", self.tag,
                                 f"#w|{self.tag}", self.worker_id):
            return None
        # count_page.lua adds no page requested in the due sum from now on.
        return self._requested_in_sums()

    def _counted_keys(self) -> list[str]:
        """The keys of count_page.lua, answer.lua and bulk_counted.lua: the
        run's counted pages, who is alive or gone with its crawl recorded
        (whose counts the run's totals keep), the pages requested in the
        re-seeder's sum, and the run key (a worker fenced off its run
        writes none of them)."""
        return [self.run_prefix + "counted", self.key("workers"), self.run_prefix + "left",
                self.run_prefix + "requested_in_sum", self.key("run")]

    def bulk_counted(self) -> tuple[int, int, set[PageKey]] | None:
        """The re-seeder counts the run's pages not due in bulk (see
        :meth:`~incremental_crawler.change.accounting.RunCounts.bulk_counted`)."""
        if self._fenced:
            return None
        self.roundtrip()
        try:
            pages, size = self.silence.again_blocking(lambda: self._bulk_counted(
                keys=self._counted_keys(), args=[self.worker_id, self.tag, self.run_id]))
        except redis.RedisError as exc:
            self.lost(exc)
            return None
        requested = self._requested_in_sums()
        if requested is None:
            return None
        return int(pages), int(size), requested

    def deferred_sum(self, pages: int) -> None:
        """The re-seeder counted *pages* due pages deferred (see
        :meth:`~incremental_crawler.change.accounting.RunCounts.deferred_sum`)."""
        self._note_in_run("counted", "HSET", "#dsum", str(pages))

    def sum_counted(self, pages: int, size: int, first_due: float | None) -> None:
        """The re-seeder counted its sum of the pages not due (see
        :meth:`~incremental_crawler.change.accounting.RunCounts.sum_counted`)."""
        self._note_in_run("counted", "HSET", "#sum", f"{pages}|{size}|{first_due or ''}")

    def _requested_in_sums(self) -> set[PageKey] | None:
        """The pages requested whose stored state one of the re-seeder's
        sums counted when they were (count_page.lua); ``None``: unknown."""
        members = self._scan_run_set("requested_in_sum")
        return None if members is None else {PageKey(*k.split("\0")) for k in members}

    def _scan_run_set(self, name: str) -> set[str] | None:
        """The members of the run's set *name*, read in chunks of
        :data:`SCAN_CHUNK` (a set that may be large: one SMEMBERS would
        hold the server for all of it); ``None`` when Redis failed. The set
        must no longer grow (SSCAN then returns every member, once or
        more)."""
        self.roundtrip()
        try:
            size = int(self.silence.again_blocking(
                lambda: self.redis.scard(self.run_prefix + name)))
        except redis.RedisError as exc:
            self.lost(exc)
            return None
        members: set[str] = set()
        cursor: int | str | bytes = 0
        # A cursor goes back to 0 after one pass over the set's table (up
        # to twice its size while it is being resized), with room to spare.
        for _ in range(16 + 2 * size // SCAN_CHUNK):
            self.roundtrip()
            try:
                cursor, chunk = self.silence.again_blocking(functools.partial(
                    self.redis.sscan, self.run_prefix + name, int(cursor), count=SCAN_CHUNK))
            except redis.RedisError as exc:
                self.lost(exc)
                return None
            members.update(m.decode() if isinstance(m, bytes) else m for m in chunk)
            if int(cursor) == 0:
                return members
        raise ClusterError(f"the run's set {name} did not end its scan: is it still growing?")

    def note_first_second_visit(self, key: PageKey) -> None:
        """This worker visited *key* in the run's first second (for the
        worker that re-seeds: see ``Ledger.first_second_visits``)."""
        self._add_to_run_set("early", "\0".join(key))

    def first_second_visits(self) -> set[PageKey] | None:
        """The pages the run's workers visited in its first second; ``None``: unknown."""
        members = self._run_set("early")
        return None if members is None else {PageKey(*m.split("\0")) for m in members}

    def note_unrecorded_failure(self) -> None:
        """A page failed and could not be recorded: the run's sitemap validators must not
        be saved."""
        # Not counted when Redis fails: leaving fails too, the sitemaps'
        # state is not saved (nor by a fenced worker: see leave.lua).
        self._note_in_run("unrecorded", "INCR")

