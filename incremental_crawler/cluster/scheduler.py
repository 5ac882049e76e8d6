"""scrapy-redis's scheduler, queue and dupefilter, made safe for N workers.

- :class:`ClusterScheduler` joins the run when the spider opens and leaves
  it when it closes, instead of flushing the shared queue (scrapy-redis
  clears queue and filter when its *first* worker closes unless told to
  persist them forever).
- :class:`ClusterQueue` pops through the coordinator: the request is held
  in this worker's in-flight hash in the same atomic step.
- :class:`ClusterDupeFilter` uses Scrapy's own request fingerprinter
  (scrapy-redis computes its own, which disagrees with Scrapy's on the same
  request) and the run's key, so a later run starts with an empty filter.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import redis
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.misc import load_object
from scrapy_redis.dupefilter import RFPDupeFilter
from scrapy_redis.queue import PriorityQueue
from scrapy_redis.scheduler import Scheduler

from incremental_crawler.cluster.coordinator import ClusterCoordinator, ClusterError
from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.uris import redacted

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

__all__ = ["ClusterDupeFilter", "ClusterQueue", "ClusterScheduler"]

logger = logging.getLogger(__name__)


class ClusterScheduler(Scheduler):
    """See the module docstring."""

    crawler: Crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        coordinator = ClusterCoordinator.of(crawler)  # fails loudly on a bad URL
        try:
            instance = super().from_crawler(crawler)
        except redis.RedisError as exc:
            raise ClusterError(f"REDIS_URL {redacted(coordinator.url)}: {exc}") from exc
        instance.crawler = crawler
        # One client for the scheduler, its queue and filter, and the
        # coordinator: one connection, one round-trip count.
        instance.server.close()
        instance.server = coordinator.redis
        return instance

    def open(self, spider: Spider) -> None:
        ClusterCoordinator.of(self.crawler).join(spider)
        self.spider = spider
        self.queue = load_object(self.queue_cls)(
            server=self.server, spider=spider,
            key=self.queue_key % {"spider": spider.name}, serializer=self.serializer,
        )
        self.df = load_object(self.dupefilter_cls).from_spider(spider)
        if len(self.queue):
            logger.info("Joining a crawl with %(n)d requests queued", {"n": len(self.queue)},
                        extra={"spider": spider})

    def close(self, reason: str) -> Deferred[None]:
        return deferred_from_coro(self._close(reason))

    async def _close(self, reason: str) -> None:
        # Every request is done by now (the engine waited for them): commit
        # their pages first, so that leaving releases them instead of
        # handing them back to be fetched again.
        ledger = self.crawler.get_extension(Ledger)
        if ledger is not None:
            await ledger.commit_staged()
        ClusterCoordinator.of(self.crawler).leave(reason)

    def has_pending_requests(self) -> bool:
        coordinator = ClusterCoordinator.of(self.crawler)
        try:
            return coordinator.queued() > 0
        except redis.RedisError as exc:
            coordinator.lost(exc)
            return False

    # scrapy-redis's own version checks the filter and queues in two round
    # trips (and passes ``spider`` to the stats collector, which Scrapy 2.19
    # deprecates): one script does both.
    def enqueue_request(self, request: Request) -> bool:
        fingerprint = None if request.dont_filter else self.df.request_fingerprint(request)
        data = self.queue._encode_request(request)
        coordinator = ClusterCoordinator.of(self.crawler)
        try:
            queued = coordinator.push(fingerprint, -request.priority, data)
        except redis.RedisError as exc:
            # Not queued, not done: the next run requests it again.
            coordinator.lost(exc)
            return False
        if not queued:
            self.df.log(request, self.spider)
            return False
        self.stats.inc_value("scheduler/enqueued/redis")
        return True

    def next_request(self) -> Request | None:
        try:
            request = self.queue.pop()
        except redis.RedisError as exc:
            ClusterCoordinator.of(self.crawler).lost(exc)
            return None
        if request is not None:
            self.stats.inc_value("scheduler/dequeued/redis")
        return request


class ClusterQueue(PriorityQueue):
    """scrapy-redis's priority queue; popping holds the request in flight."""

    def pop(self, timeout: int = 0) -> Request | None:
        coordinator = ClusterCoordinator.of(self.spider.crawler)
        popped = coordinator.pop()
        if popped is None:
            return None
        ticket, data = popped
        request = self._decode_request(data)
        coordinator.track(ticket, request)
        return request


class ClusterDupeFilter(RFPDupeFilter):
    """Seen requests of the current run, by Scrapy's request fingerprint."""

    def __init__(self, server: Any, key: str, debug: bool = False,
                 fingerprinter: Any = None) -> None:
        super().__init__(server, key, debug)
        self.fingerprinter = fingerprinter

    @classmethod
    def from_spider(cls, spider: Spider) -> Self:
        coordinator = ClusterCoordinator.of(spider.crawler)
        return cls(
            coordinator.redis, key=coordinator.seen_key,
            debug=spider.settings.getbool("DUPEFILTER_DEBUG"),
            fingerprinter=spider.crawler.request_fingerprinter,
        )

    def request_fingerprint(self, request: Request) -> str:
        return self.fingerprinter.fingerprint(request).hex()

    def seen_fingerprints(self, fingerprints: Sequence[str]) -> set[str]:
        """The hex fingerprints of *fingerprints* this run saw (a replay leaves
        them out: :mod:`incremental_crawler.crawl.seen`)."""
        if not fingerprints:
            return set()
        try:
            flags = self.server.smismember(self.key, list(fingerprints))
        except redis.RedisError:
            # Nothing left out: the full replay's requests meet the error where
            # the scheduler meets it, and are handled there.
            return set()
        return {fp for fp, flag in zip(fingerprints, flags, strict=True) if flag}

    def close(self, reason: str = "") -> None:
        # The run's filter outlives this worker; the coordinator ends it.
        pass
