"""Cluster mode after workers were killed: a run none of whose workers is
alive is abandoned for a new one, and a run's job claimed by a worker that
died before doing it is taken over.

Real ``scrapy crawl`` workers (:class:`tests.cluster_worker.Worker`) killed
with SIGKILL, against the loopback test site; whether a worker is alive is
read in Redis (its last heartbeat against Redis's own clock), never guessed
from a sleep.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import pytest_twisted
import redis
from scrapy import Spider
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.test import get_crawler
from twisted.internet.threads import deferToThread

from incremental_crawler import clock
from incremental_crawler.cluster.coordinator import ClusterCoordinator
from incremental_crawler.config import DEFAULT_SETTINGS
from incremental_crawler.state.records import PageKey
from incremental_crawler.state.stores import open_store
from tests.cluster_worker import Worker, abandoned_mark, leftover_keys, page_gets
from tests.redis_util import CLUSTER_REDIS_URI
from tests.waiting import until

#: Revisits every second: a page checked is due again a second later
#: (MAX too: a 304 does not stretch the interval past what the test waits),
#: no sampled full re-check (a revisit is a 304), every vouched page in the
#: rotating sample (all of them re-seeded).
REVISITS = ("-s", "INCREMENTAL_REVISIT_ENABLED=True",
            "-s", "INCREMENTAL_REVISIT_INITIAL=1", "-s", "INCREMENTAL_REVISIT_MIN=1",
            "-s", "INCREMENTAL_REVISIT_MAX=1", "-s", "INCREMENTAL_RECHECK_EVERY=0",
            "-s", "INCREMENTAL_LASTMOD_RECHECK_SHARE=1")

#: A worker taken for dead after 2 s without a heartbeat (they beat every 0.2 s).
TTL = 2


@dataclass
class Coordination:
    """Where the workers coordinate: a Redis client on it, the workers'
    extra options, the key prefix."""

    client: redis.Redis | redis.RedisCluster
    extra: tuple[str, ...]
    prefix: str

    def key(self, name: str) -> str:
        return f"{self.prefix}:{{sitemap}}:{name}"

    def run(self) -> str | None:
        run = self.client.get(self.key("run"))
        return run.decode().partition("|")[0] if run else None

    def lapsed(self, worker: bytes) -> bool:
        """Whether *worker*'s last heartbeat is older than the TTL by Redis's
        clock (or the others reaped it already)."""
        beat = self.client.hget(self.key("workers"), worker)
        seconds, micros = self.client.time()
        return beat is None or seconds + micros / 1e6 - float(beat) > TTL

    def leftover(self) -> list[bytes]:
        """The keys left under the prefix, but for abandoned runs' marks."""
        return sorted(key for key in self.client.keys(f"{self.prefix}:*")
                      if not abandoned_mark(self.client, key))


@pytest.fixture(params=["redis", "redis-cluster"])
def coordination(request, cluster_prefix):
    """One Redis server, or the real Redis Cluster (its own prefix, cleaned)."""
    if request.param == "redis":
        client = redis.Redis.from_url(CLUSTER_REDIS_URI)
        yield Coordination(client, (), cluster_prefix)
        client.close()
        return
    cluster = request.getfixturevalue("redis_cluster")
    client = cluster.client()
    yield Coordination(client, ("-s", f"INCREMENTAL_CLUSTER_URL={cluster.url}"), cluster_prefix)
    client.close()
    cluster.delete(f"{cluster_prefix}*")


async def first_crawl(site, state_uri, coordination: Coordination, tmp_path, n: int) -> None:
    """Every page (n of them) crawled once by one worker; then every page due again."""
    worker = Worker(site, state_uri, coordination.prefix, tmp_path, "first",
                    *REVISITS, *coordination.extra)
    assert await worker.wait() == 0, worker.tail()
    assert coordination.run() is None
    # Due a second after the crawl's start (its time in the store): often
    # already past as the worker exits; waited for if not.
    store = open_store(Settings({"INCREMENTAL_STATE_URI": state_uri}))
    try:
        pages = [await deferred_from_coro(store.get_page(
            PageKey("sitemap", site.url(f"/p/{i:04d}")))) for i in range(n)]
    finally:
        await deferred_from_coro(store.close())
    assert all(page is not None and page.next_visit > 0 for page in pages)
    due = max(page.next_visit for page in pages if page is not None)
    await until(lambda: clock.now() > due, "every page to be due again", seconds=5)
    site.reset_log()


async def killed(worker: Worker) -> None:
    os.kill(worker.proc.pid, signal.SIGKILL)
    await deferToThread(worker.proc.wait)


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_run_whose_every_worker_was_killed_is_abandoned_for_a_new_one(
    site, state_uri, coordination, tmp_path
):
    n = 20
    site.add_pages(n, size=1000)
    await first_crawl(site, state_uri, coordination, tmp_path, n)

    # The second crawl's only worker re-seeds every page, gets all but one
    # answered, and is killed with that one on the wire once every other
    # request is finished in the run (out of its in-flight hash: the run's
    # dupefilter alone remembers them).
    last = f"/p/{n - 1:04d}"
    site.hold(last)
    victim = Worker(site, state_uri, coordination.prefix, tmp_path, "victim",
                    *REVISITS, *coordination.extra, "-s", f"INCREMENTAL_CLUSTER_WORKER_TTL={TTL}")

    def only_the_held_one_left() -> bool:
        workers = coordination.client.hkeys(coordination.key("workers"))
        if len(page_gets(site)) < n - 1 or site.held != 1 or len(workers) != 1:
            return False
        inflight = coordination.client.hlen(coordination.key(f"inflight:{workers[0].decode()}"))
        held = coordination.client.hlen(coordination.key(f"held:{workers[0].decode()}"))
        return (inflight, held, coordination.client.zcard(coordination.key("queue"))) == (1, 0, 0)

    await until(only_the_held_one_left, "the victim to finish all but the held page", seconds=60)
    old_run = coordination.run()
    (dead,) = coordination.client.hkeys(coordination.key("workers"))
    await killed(victim)
    site.release()
    # A week passes: a page the dead run saw changes, the victim's heartbeat lapses.
    changed = "/p/0003"
    site.change(changed)
    site.reset_log()
    await until(lambda: coordination.lapsed(dead), "the victim's heartbeat to lapse")

    late = Worker(site, state_uri, coordination.prefix, tmp_path, "late",
                  *REVISITS, *coordination.extra, "-s", f"INCREMENTAL_CLUSTER_WORKER_TTL={TTL}")
    assert await late.wait() == 0, late.tail()
    log = late.text()
    joined = re.search(r"joined run (\w+)", log)
    assert joined and joined.group(1) != old_run, late.tail()
    assert f"run {old_run} of sitemap had no live worker" in log, late.tail()
    # A new run: re-seeded, the changed page asked and its new version emitted.
    assert re.search(r"Re-seeded \d+ due pages", log), late.tail()
    assert [r.status for r in site.log if r.path == changed] == [200]
    assert site.url(changed) in late.urls()
    # The page the victim held went back to the queue: fetched, not lost.
    assert page_gets(site)[last] >= 1
    # The abandoned run's keys went with it; the new run ended with its worker.
    assert coordination.leftover() == []


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_reseeding_worker_killed_after_claiming_is_taken_over(
    site, state_uri, cluster_prefix, tmp_path
):
    n = 20
    site.add_pages(n, size=1000)
    coordination = Coordination(redis.Redis.from_url(CLUSTER_REDIS_URI), (), cluster_prefix)
    try:
        await first_crawl(site, state_uri, coordination, tmp_path, n)
        ttl = ("-s", f"INCREMENTAL_CLUSTER_WORKER_TTL={TTL}")
        # The survivor is busy (its sitemap index held) while the other
        # worker, with nothing to do, claims the run's re-seeding and waits
        # for the cluster to be quiet before doing it: killed then.
        site.hold("/sitemap_index.xml")
        survivor = Worker(site, state_uri, cluster_prefix, tmp_path, "survivor",
                          *REVISITS, *ttl)
        await until(lambda: site.held >= 1, "the survivor's index to be on the wire",
                    seconds=60)
        claimer = Worker(site, state_uri, cluster_prefix, tmp_path, "claimer", *REVISITS, *ttl,
                         spider=("sitemap", "-a", f"sitemap_url={site.url('/none.txt')}"))

        def claimed() -> bytes | None:
            run = coordination.run()
            if run is None:
                return None
            owner: bytes | None = coordination.client.hget(coordination.key(f"{run}:claims"),
                                                           "reseed")
            return owner

        await until(claimed, "the re-seeding to be claimed", seconds=60)
        owner = claimed()
        assert owner is not None
        assert f"worker {owner.decode()} joined run" in claimer.text(), claimer.tail()
        assert not coordination.client.hexists(
            coordination.key(f"{coordination.run()}:claims"), "reseed:done")
        await killed(claimer)
        await until(lambda: coordination.lapsed(owner), "the claimer's heartbeat to lapse")
        site.release()

        assert await survivor.wait() == 0, survivor.tail()
        log = survivor.text()
        assert "takes it over" in log, survivor.tail()
        assert log.count(f"Re-seeded {n} due pages") == 1, survivor.tail()
        # Every due page asked once.
        assert dict(page_gets(site)) == {f"/p/{i:04d}": 1 for i in range(n)}
        assert leftover_keys(cluster_prefix) == []
    finally:
        coordination.client.close()


def test_an_abandoned_runs_failures_not_recorded_carry_over_and_its_keys_go(cluster_prefix):
    settings = {**DEFAULT_SETTINGS, "INCREMENTAL_CLUSTER_URL": CLUSTER_REDIS_URI,
                "INCREMENTAL_CLUSTER_PREFIX": cluster_prefix,
                "INCREMENTAL_CLUSTER_HEARTBEAT": 0.2, "INCREMENTAL_CLUSTER_WORKER_TTL": TTL}
    spider = Spider("abandoned")

    def joined() -> ClusterCoordinator:
        crawler = get_crawler(Spider, settings)
        crawler.engine = SimpleNamespace(_slot=None, running=False)  # nothing in progress
        coordinator = ClusterCoordinator.from_crawler(crawler)
        coordinator.join(spider)
        coordinator._task.stop()  # its beats are the test's own
        return coordinator

    client = redis.Redis.from_url(CLUSTER_REDIS_URI)
    old = joined()
    try:
        old.note_unrecorded_failure()
        old.note_unrecorded_failure()
        assert old.push("fingerprint", 0, b"queued by the old run")
        # The old run's only worker last beat past the TTL ago, by Redis's clock.
        seconds, _ = client.time()
        client.hset(old.key("workers"), old.worker_id, seconds - TTL - 1)
        new = joined()
        assert new.run != old.run
        assert new.crawler.stats.get_value("cluster/abandoned_runs") == 1
        # Its failures not recorded carry over (the sitemaps stay unsaved),
        # its other keys are gone, its queue is kept.
        assert client.get(new.run_prefix + "unrecorded") == b"2"
        # (but its mark, for a worker of it that comes back: it expires).
        assert client.keys(old.run_prefix + "*") == [old.run_prefix.encode() + b"abandoned"]
        assert abandoned_mark(client, old.run_prefix.encode() + b"abandoned")
        assert new.queued() == 1
        # A worker of the old run, only silent, comes back and leaves: fenced
        # at its heartbeat (its run is no more), what it failed to record
        # unknown, nothing of its run written again.
        old.leave("finished")
        assert old.run_unrecorded is None
        assert old.crawler.stats.get_value("cluster/fenced") == 1
        assert client.keys(old.run_prefix + "*") == [old.run_prefix.encode() + b"abandoned"]
        client.delete(new.queue_key)
        new.leave("finished")
        assert new.run_unrecorded == 2
    finally:
        client.close()
    assert leftover_keys(cluster_prefix) == []
