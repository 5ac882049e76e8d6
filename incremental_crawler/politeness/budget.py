"""One per-domain budget in Redis for every worker of a crawl.

N Scrapy workers that each keep their own throttle are N times too fast for
a site (scrapyd #221, scrapy-redis #14). Here the window of a download slot
(its AIMD rate), a token bucket that paces it, and any Retry-After freeze
or park live in one Redis hash per slot, changed only by the Lua script
``budget.lua`` (:data:`BUDGET_LUA`; atomic; Redis's own clock, so workers
with different clocks agree). The site sees one polite client:

* **acquire**: the bucket refills at the shared rate (never above the
  robots.txt Crawl-delay / ``DOWNLOAD_DELAY`` cap) and holds at most one
  batch, ``max(1, rate x 0.1)`` tokens; a worker gets up to a batch at a
  time (one round trip for a tenth of a second's requests), or the seconds
  to wait (empty bucket, freeze).
* **report**: healthy answers (grow the window as one client would: doubling
  per window in slow start, then +increase), a hard signal (x decrease, at
  most once per window: each token carries a sequence number, and a signal
  of a request granted before the last cut is already paid for, so N
  workers seeing one burst of 429s cut once), soft errors, a freeze
  (Retry-After or backoff) and a park.

The URL may name a Redis Cluster (:mod:`incremental_crawler.redis_cluster`):
each slot's hash is one key, the only key its script touches, so the script
runs on the node that holds it (Redis's clock there), and the slots spread
over the nodes.

The worker side, :class:`SharedBudget`, is asyncio (redis.asyncio, on
Scrapy's asyncio reactor): requests wait for a token without blocking the
reactor; the waiting requests of a slot share one round trip; tokens left
over expire after :data:`TOKEN_TTL` (a worker does not hoard the budget) and
are dropped when the slot freezes. Signals raised in one reactor turn go out
in one round trip, healthy answers ride along with the next acquire.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import NoScriptError, RedisError

from incremental_crawler.config import DEFAULT_SETTINGS
from incremental_crawler.lua import load_script
from incremental_crawler.redis_cluster import AsyncClusterClient, connect_async
from incremental_crawler.redis_retry import Silence
from incremental_crawler.uris import redacted

if TYPE_CHECKING:
    from collections.abc import Callable

    from redis import asyncio as aioredis

    from incremental_crawler.politeness.window import WindowPolicy

__all__ = ["BUDGET_LUA", "Grant", "SharedBudget", "SharedBudgetClosing", "SharedBudgetParked",
           "script_args"]

logger = logging.getLogger(__name__)

#: Seconds a worker may keep tokens it was granted but has no request for.
TOKEN_TTL = 0.1
#: Share of a second's rate granted (and held by the bucket) at most at once.
BATCH_SHARE = 0.1
#: Seconds an idle slot's state stays in Redis (the next crawl starts from
#: the rate the site allowed, not from scratch, if it comes soon).
IDLE_TTL = 3600
#: A park (Retry-After above INCREMENTAL_THROTTLE_RETRY_AFTER_MAX) is shared
#: for the site's wait, at most this long.
PARK_MAX = 86_400.0
#: Healthy answers counted per round trip at most (bounds the script's loop).
GOOD_MAX = 1000

#: The script that alone changes a slot's hash (ARGV and reply: see the
#: comment at its top, and :func:`script_args`); a file of the package.
BUDGET_LUA = load_script("incremental_crawler.politeness", "budget.lua")


@dataclass(frozen=True, slots=True)
class Grant:
    """The script's answer: tokens granted (sequence numbers first..), or a wait."""

    granted: int
    first_seq: int
    wait: float
    rate: float
    frozen_for: float
    parked: bool
    change: str
    batch: int

    @classmethod
    def from_reply(cls, reply: list[Any]) -> Grant:
        def text(value: Any) -> str:
            return value.decode() if isinstance(value, bytes) else str(value)

        return cls(int(reply[0]), int(reply[1]), float(text(reply[2])), float(text(reply[3])),
                   float(text(reply[4])), bool(int(reply[5])), text(reply[6]), int(reply[7]))


def script_args(op: str, policy: WindowPolicy, *, want: int = 0, cap: float = 0.0,
                good: int = 0, hard_seq: int = 0, soft: int = 0, freeze: float = 0.0,
                park: float = 0.0) -> list[Any]:
    """ARGV of :data:`BUDGET_LUA` (see the comment at the top of ``budget.lua``)."""
    return [op, want, cap, policy.start_rate, policy.min_rate, policy.max_rate,
            policy.increase, policy.decrease, policy.soft_decrease, min(good, GOOD_MAX),
            hard_seq, soft, freeze, min(park, PARK_MAX), IDLE_TTL, BATCH_SHARE]


class SharedBudgetParked(Exception):
    """The slot is parked in the shared budget (by this worker or another)."""


class SharedBudgetClosing(Exception):
    """The crawl is closing: a request still waiting for a token does not go."""


@dataclass(slots=True)
class _Report:
    good: int = 0
    hard_seq: int = 0
    soft: int = 0
    freeze: float = 0.0
    park: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.hard_seq or self.soft or self.freeze or self.park)


@dataclass(slots=True)
class _Slot:
    """What one worker knows of a slot between round trips."""

    policy: WindowPolicy
    cap: float = 0.0
    #: Sequence numbers of tokens granted and not used yet, valid until expires.
    tokens: deque[int] = field(default_factory=deque)
    expires: float = 0.0
    waiters: deque[asyncio.Future[int]] = field(default_factory=deque)
    #: A round trip (or the sleep after one) is under way.
    busy: bool = False
    frozen_until: float = 0.0
    pending: _Report = field(default_factory=_Report)
    flush_scheduled: bool = False


class SharedBudget:
    """A worker's side of the shared budget; see the module docstring.

    ``on_reply(key, grant)`` is called with every answer of the script (the
    shared rate, freezes and parks other workers caused); ``on_failure(exc)``
    when Redis cannot be used: the caller stops the crawl.

    A Redis that does not answer (restarted, failing over) is asked again
    for up to *retry_time* seconds (INCREMENTAL_REDIS_RETRY_TIME) since it
    last answered, as the state store does: requests wait for their tokens
    meanwhile (none leaves unthrottled); then ``on_failure`` with a
    :class:`~incremental_crawler.redis_retry.RedisSilent`.
    """

    def __init__(self, url: str, prefix: str, *, stats: Any,
                 on_reply: Callable[[str, Grant], None],
                 on_failure: Callable[[Exception], None],
                 retry_time: float = DEFAULT_SETTINGS["INCREMENTAL_REDIS_RETRY_TIME"]) -> None:
        #: Redis's client, made by :meth:`open` (one server's or a Redis
        #: Cluster's: :func:`~incremental_crawler.redis_cluster.connect_async`).
        self.client: aioredis.Redis | AsyncClusterClient | None = None
        self.url = url
        self.prefix = prefix
        self.silence = Silence(f"The shared budget at {redacted(url)}", float(retry_time))
        self.stats = stats
        self.on_reply = on_reply
        self.on_failure = on_failure
        self.slots: dict[str, _Slot] = {}
        self._sha: str | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._flushes: set[asyncio.Task[Any]] = set()
        self.failed: Exception | None = None
        #: No more tokens for this worker (the crawl is closing)...
        self.closing = False
        #: ... and no more reports either (its spider is closed).
        self.closed = False

    def redis_key(self, key: str) -> str:
        return f"{self.prefix}:{key}"

    async def open(self) -> None:
        # A blip is retried by the client for about half a second; a dead
        # server fails the call within seconds, it never hangs it; a longer
        # silence is ridden out by self.silence. On a Redis Cluster each
        # slot's hash is one key: its script runs on the node of that key.
        self.client = await connect_async(
            self.url, socket_timeout=5, socket_connect_timeout=5,
            retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.25), 5))
        await self._load()

    def stop_waiting(self) -> int:
        """The crawl is closing: requests waiting for a token (and later ones) do not go.

        How many were waiting. Reports still go out until :meth:`close`.
        """
        self.closing = True
        failed = 0
        for slot in self.slots.values():
            failed += self._fail_waiters(slot, SharedBudgetClosing("the crawl is closing"))
            slot.tokens.clear()
        return failed

    async def close(self) -> None:
        self.stop_waiting()
        self.closed = True
        # The last signals (a 429's freeze) still reach the other workers;
        # a round trip is milliseconds, a dead server fails it in seconds.
        if self._flushes:
            await asyncio.wait(set(self._flushes), timeout=2.0)
        for task in list(self._tasks):
            task.cancel()
        if self.client is not None:
            await self.client.aclose()

    # -- the worker's API --------------------------------------------------------

    async def acquire(self, key: str, policy: WindowPolicy, cap: float) -> int:
        """Wait for a token of *key*'s slot; its sequence number."""
        if self.failed is not None:
            raise self.failed
        if self.closing:
            raise SharedBudgetClosing("the crawl is closing")
        slot = self._slot(key, policy, cap)
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        slot.waiters.append(waiter)
        self._pump(key, slot)
        return await waiter

    def good(self, key: str) -> None:
        """A healthy answer (faster than the target latency): sent with the next call."""
        slot = self.slots.get(key)
        if slot is not None:
            slot.pending.good += 1

    def report(self, key: str, policy: WindowPolicy, *, hard_seq: int = 0, soft: int = 0,
               freeze: float = 0.0, park: float = 0.0) -> None:
        """A hard signal, a soft error, a freeze or a park: sent at once.

        What is reported in one reactor turn (the 429 and its freeze) goes
        in one round trip.
        """
        slot = self._slot(key, policy, None)
        pending = slot.pending
        if hard_seq:
            pending.hard_seq = max(pending.hard_seq, hard_seq) if hard_seq > 0 else (
                pending.hard_seq or -1)
        pending.soft += soft
        pending.freeze = max(pending.freeze, freeze)
        pending.park = max(pending.park, park)
        if freeze or park:
            self.freeze_locally(key, max(freeze, park))
        if not slot.flush_scheduled and not self.closed:
            slot.flush_scheduled = True
            task = self._spawn(self._flush(key, slot))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    def freeze_locally(self, key: str, seconds: float) -> None:
        """Nothing of *key* leaves this worker for *seconds*: tokens held are dropped."""
        slot = self.slots.get(key)
        if slot is None:
            return
        slot.frozen_until = max(slot.frozen_until, time.monotonic() + seconds)
        if slot.tokens:
            self.stats.inc_value("incremental/throttle/shared/tokens_dropped", len(slot.tokens))
            slot.tokens.clear()

    # -- internals ---------------------------------------------------------------

    def _slot(self, key: str, policy: WindowPolicy, cap: float | None) -> _Slot:
        slot = self.slots.get(key)
        if slot is None:
            slot = self.slots[key] = _Slot(policy)
        slot.policy = policy
        if cap is not None:
            slot.cap = cap
        return slot

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        # The loop keeps weak references to tasks: keep them until done.
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _pump(self, key: str, slot: _Slot) -> None:
        """Hand tokens held to waiting requests; ask Redis when some still wait."""
        if self.closing:
            return
        if slot.tokens and time.monotonic() >= slot.expires:
            self.stats.inc_value("incremental/throttle/shared/tokens_expired", len(slot.tokens))
            slot.tokens.clear()
        while slot.waiters and slot.tokens:
            waiter = slot.waiters.popleft()
            if not waiter.done():  # a cancelled request's waiter is skipped
                waiter.set_result(slot.tokens.popleft())
        while slot.waiters and slot.waiters[0].done():
            slot.waiters.popleft()
        if slot.waiters and not slot.busy:
            slot.busy = True
            self._spawn(self._refill(key, slot))

    async def _refill(self, key: str, slot: _Slot) -> None:
        """One round trip for the waiting requests (or a sleep until one is worth it)."""
        try:
            wait = slot.frozen_until - time.monotonic()
            if wait > 0:
                # Frozen here already: Redis would only say so.
                await asyncio.sleep(wait)
                return
            want = sum(1 for w in slot.waiters if not w.done())
            if not want:
                return
            # Healthy answers ride along; signals waiting for their own
            # flush (this turn's 429 and freeze) stay for it.
            good, slot.pending.good = slot.pending.good, 0
            grant = await self._call(key, "acquire", slot.policy, want=want, cap=slot.cap,
                                     good=good)
            if grant.parked:
                self._fail_waiters(slot, SharedBudgetParked(f"{key} is parked"))
                return
            if grant.granted:
                self.stats.inc_value("incremental/throttle/shared/acquires", grant.granted)
                if slot.frozen_until > time.monotonic():
                    # Our own 429 came while the tokens were on their way:
                    # they were granted before the site said to stay away.
                    self.stats.inc_value("incremental/throttle/shared/tokens_dropped",
                                         grant.granted)
                    return
                slot.tokens.extend(range(grant.first_seq, grant.first_seq + grant.granted))
                slot.expires = time.monotonic() + TOKEN_TTL
                return
            self.stats.inc_value("incremental/throttle/shared/waits")
            if grant.frozen_for > 0:
                self.freeze_locally(key, grant.frozen_for)
            # The bucket said when a token is back for us (or the freeze
            # ends); a millisecond more, so that it is there.
            await asyncio.sleep(grant.wait + 0.001)
        except RedisError as exc:
            self._failed(exc)
            self._fail_waiters(slot, exc)
        finally:
            slot.busy = False
            if self.failed is None:
                self._pump(key, slot)

    async def _flush(self, key: str, slot: _Slot) -> None:
        slot.flush_scheduled = False
        pending, slot.pending = slot.pending, _Report()
        if not pending and not pending.good:
            return
        try:
            await self._call(key, "report", slot.policy, good=pending.good,
                             hard_seq=pending.hard_seq, soft=pending.soft,
                             freeze=pending.freeze, park=pending.park)
        except RedisError as exc:
            self._failed(exc)

    async def _call(self, key: str, op: str, policy: WindowPolicy, **kwargs: Any) -> Grant:
        args = script_args(op, policy, **kwargs)

        async def attempt() -> Any:
            sha = self._sha if self._sha is not None else await self._load()
            self.stats.inc_value("incremental/throttle/shared/roundtrips")
            try:
                return await self._redis().evalsha(sha, 1, self.redis_key(key), *args)
            except NoScriptError:
                # The server restarted or ran SCRIPT FLUSH (or a cluster node
                # that took the slot over never had it): load it again, once.
                sha = await self._load()
                self.stats.inc_value("incremental/throttle/shared/roundtrips")
                return await self._redis().evalsha(sha, 1, self.redis_key(key), *args)

        # Asked again while Redis does not answer: an acquire whose reply was
        # lost only spent tokens (the rate stays), a report sent twice counts
        # its healthy answers twice (a hard signal cuts once per window).
        reply = await self.silence.again(attempt)
        grant = Grant.from_reply(reply)
        self.on_reply(key, grant)
        return grant

    async def _load(self) -> str:
        """Load the script; its SHA-1 (kept for the next calls)."""
        self.stats.inc_value("incremental/throttle/shared/roundtrips")
        # On a Redis Cluster: loaded on every primary.
        sha: str = await self._redis().script_load(BUDGET_LUA)
        self._sha = sha
        return sha

    def _redis(self) -> aioredis.Redis | AsyncClusterClient:
        if self.client is None:
            raise RuntimeError("SharedBudget.open() was not called")
        return self.client

    def _fail_waiters(self, slot: _Slot, exc: Exception) -> int:
        waiters, slot.waiters = slot.waiters, deque()
        failed = 0
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(exc)
                failed += 1
        return failed

    def _failed(self, exc: Exception) -> None:
        if self.failed is None:
            self.failed = exc
            self.on_failure(exc)
