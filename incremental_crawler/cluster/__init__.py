"""Cluster mode: N workers, one crawl, switched on by ``INCREMENTAL_CLUSTER_URL``.

Workers started with the same command share one crawl through one Redis:

- scrapy-redis's scheduler with a queue of our own (:mod:`.scheduler`): a
  request popped by a worker is held in that worker's *in-flight* hash in
  the same atomic step, and leaves it only once the request was fully
  processed (callback and item pipelines done). A worker that dies is
  noticed by its stale heartbeat and its in-flight requests go back to the
  queue, so nothing it took is lost;
- a dupefilter keyed by Scrapy's own request fingerprinter (so keys agree
  with everything else in Scrapy) and scoped to one *run*: the run ends
  when the last worker leaves with the queue drained, and the next run
  starts with an empty filter, so a revisit is never blocked by last run's
  fingerprints;
- the coordinator (:mod:`.coordinator`): workers register, beat, and a
  worker whose local work ran out waits while any other worker is busy
  (it may yet discover links), then exits by itself once the whole cluster
  has been quiet for ``INCREMENTAL_CLUSTER_IDLE_GRACE`` seconds;
- the Redis state store and the shared per-domain budget, both pointed at
  the same Redis unless set otherwise.

The URL may name one Redis server or a Redis Cluster (a node of it, or
``redis+cluster://`` with seed nodes: :mod:`incremental_crawler.redis_cluster`).
On a cluster, the coordination keys, the queue, the dupefilter, the shared
budget and the state store (its cluster layout,
:mod:`incremental_crawler.state.stores.redis.cluster`) run there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.settings import SETTINGS_PRIORITIES

from incremental_crawler.exceptions import ClusterError

if TYPE_CHECKING:
    from scrapy.settings import Settings

__all__ = ["ClusterError", "apply_cluster_settings"]

_P = "incremental_crawler.cluster."
#: The re-seeder of a crawl that is not a cluster's (the add-on's component).
RESEEDER = "incremental_crawler.crawl.reseed.Reseeder"


def apply_cluster_settings(settings: Settings) -> None:
    """Point Scrapy's scheduler and the budget at the cluster.

    Set with the add-on's priority: whatever the project set itself (a
    budget elsewhere, say) wins. The state store follows the cluster by
    :func:`~incremental_crawler.state.stores.state_uri` (unless
    ``INCREMENTAL_STATE_URI`` names one), the same rule for a crawl and for
    the commands that read its store, which never run the add-on.
    """
    url = settings.get("INCREMENTAL_CLUSTER_URL")
    if not url:
        return
    prefix = settings.get("INCREMENTAL_CLUSTER_PREFIX")
    # scrapy-redis builds its client with this class: a Redis Cluster's for
    # a cluster (the scheduler then shares the coordinator's). A class the
    # project names itself wins.
    params = {"redis_cls": "incremental_crawler.redis_cluster.AnyRedis",
              **settings.getdict("REDIS_PARAMS")}
    settings.set("REDIS_PARAMS", params,
                 priority=max(settings.getpriority("REDIS_PARAMS") or 0,
                              SETTINGS_PRIORITIES["addon"]))
    values = {
        "SCHEDULER": _P + "scheduler.ClusterScheduler",
        "SCHEDULER_QUEUE_CLASS": _P + "scheduler.ClusterQueue",
        # The coordinator's queue key (coordinator.spider_key: the spider's
        # name is the hash tag of its crawl's keys).
        "SCHEDULER_QUEUE_KEY": f"{prefix}:{{%(spider)s}}:queue",
        "DUPEFILTER_CLASS": _P + "scheduler.ClusterDupeFilter",
        # scrapy-redis would otherwise wipe the shared queue and filter when
        # the first worker closes; the coordinator ends a run instead.
        "SCHEDULER_PERSIST": True,
        "REDIS_URL": url,
        "INCREMENTAL_THROTTLE_SHARED_URL": url,
    }
    for name, value in values.items():
        settings.set(name, value, priority="addon")
    settings["EXTENSIONS"].set(_P + "coordinator.ClusterCoordinator", 0, priority="addon")
    # The due pages re-seeded by one worker per run: the coordinator's claim.
    extensions = settings["EXTENSIONS"]
    order = extensions.get(RESEEDER)
    if order is not None:
        extensions.set(RESEEDER, None, priority="addon")
        extensions.set(_P + "reseed.ClusterReseeder", order, priority="addon")
