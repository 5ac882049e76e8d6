"""A worker silent past INCREMENTAL_CLUSTER_WORKER_TTL (SIGSTOP, a VM
paused, a stalled reactor) that comes back is fenced off the run: it is no
live worker of the run that replaced its own, writes none of its old run's
keys again, and its claims stay with whoever took them over. Real Redis,
the real scripts; a worker's silence is its heartbeat set back in Redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from scrapy.utils.test import get_crawler

from incremental_crawler.cluster import ClusterError
from incremental_crawler.cluster.coordinator import ClusterCoordinator
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.state.records import PageKey
from tests.redis_util import REDIS_URI, delete_prefix, new_prefix

if TYPE_CHECKING:
    from collections.abc import Iterator

TTL = 2


def coordinator(prefix: str) -> ClusterCoordinator:
    """A worker's coordinator, not joined yet, with no engine (nothing it
    popped is finished)."""
    crawler = get_crawler(settings_dict={"INCREMENTAL_CLUSTER_URL": REDIS_URI,
                                         "INCREMENTAL_CLUSTER_PREFIX": prefix})
    config = IncrementalConfig.from_settings(crawler.settings).cluster
    assert config is not None
    c = ClusterCoordinator(crawler, config)
    c.spider_key = f"{prefix}:{{spider}}"
    c.worker_ttl = TTL
    c._settled_tickets = lambda: ([], [])  # type: ignore[method-assign]
    return c


@pytest.fixture
def pair() -> Iterator[tuple[ClusterCoordinator, ClusterCoordinator]]:
    prefix = new_prefix()
    a, b = coordinator(prefix), coordinator(prefix)
    yield a, b
    a.redis.close()
    b.redis.close()
    delete_prefix(prefix)


def silent_for(worker: ClusterCoordinator, seconds: float) -> None:
    """*worker*'s last heartbeat was *seconds* ago, by Redis's clock."""
    s, us = worker.redis.time()
    worker.redis.hset(worker.key("workers"), worker.worker_id, s + us / 1e6 - seconds)


def join(worker: ClusterCoordinator, new_run: str) -> str:
    """*worker* joins (join.lua); the id of the run it abandoned, if any."""
    run, _, abandoned = worker._join_run(new_run)
    worker.run = run.decode().partition("|")[0]
    return abandoned


def silent_run(a: ClusterCoordinator) -> None:
    """*a* is the only worker of run r1 and has been silent 10 s (> TTL)."""
    assert join(a, "r1") == ""
    silent_for(a, 10)


def reaped_in_its_own_run(a: ClusterCoordinator, b: ClusterCoordinator) -> None:
    """*a* and *b* in run r1, *a* silent past the TTL and reaped by *b*'s
    beat: the run goes on with *b*."""
    join(a, "r1")
    join(b, "r1")
    silent_for(a, 10)
    b._beat_once()


def abandoned_keys(worker: ClusterCoordinator) -> list[bytes]:
    """The keys of run r1 left, but for the mark join.lua sets when it
    abandons r1 (it expires in a day)."""
    marker = worker.key("r1:abandoned").encode()
    return sorted(k for k in worker.redis.keys(worker.key("r1:*")) if k != marker)


def test_a_silent_worker_back_is_not_a_live_worker_of_the_new_run(pair):
    a, b = pair
    assert join(a, "r1") == ""
    a.redis.zadd(a.queue_key, {b"a request of r1": 0})
    assert a.pop() is not None
    silent_for(a, 10)
    assert join(b, "r2") == "r1"
    a.redis.zadd(a.queue_key, {b"a request of r2": 1})
    assert a._beat_once() is False  # back: fenced, not quiet
    assert not a.redis.hexists(a.key("workers"), a.worker_id)
    assert a.crawler.stats.get_value("cluster/fenced") == 1
    # What it held went back to the queue; it pops nothing from the queue
    # the new run shares.
    assert a.redis.hlen(a.key(f"inflight:{a.worker_id}")) == 0
    assert a.pop() is None
    assert a.redis.zrange(a.queue_key, 0, -1) == [b"a request of r1", b"a request of r2"]


def test_the_new_run_ends_when_its_last_worker_leaves(pair):
    a, b = pair
    silent_run(a)
    join(b, "r2")
    # b leaves first: a's stale heartbeat is still in the workers hash.
    assert b._leave_run()[2] == 0
    _, unrecorded, ended, _ = a._leave_run()
    assert (unrecorded, ended) == (-1, 1)
    assert a.redis.get(a.key("run")) is None
    assert a.redis.keys(a.key("r2:*")) == []


def test_reseed_is_not_claimed_twice_across_the_abandoned_and_new_run(pair):
    a, b = pair
    silent_run(a)
    join(b, "r2")
    assert b.claim("reseed")
    # a comes back and, before its next heartbeat, claims a job of its run.
    assert not a.claim("reseed")
    assert a.crawler.stats.get_value("cluster/fenced") == 1
    assert abandoned_keys(a) == []


def test_a_gone_pages_tombstone_is_sent_once_across_the_abandoned_and_new_run(pair):
    a, b = pair
    silent_run(a)
    join(b, "r2")
    # b's first beat reaps a: a's in-flight gone page goes back to the queue,
    # b fetches it (404) and sends its tombstone ...
    b._beat_once()
    gone = PageKey("s", "http://a.example/gone")
    assert b.claim_tombstone(gone)
    # ... while a, back from its pause, finishes the same request (still in
    # its engine): it sends no tombstone, and writes nothing to its old run.
    a._beat_once()
    assert not a.claim_tombstone(gone)
    assert a.push("fp", 0, b"a link a found") is False
    assert a.count_pages([(gone, "r", 0, "0")]) is None
    assert abandoned_keys(a) == []
    assert a.redis.zcard(a.queue_key) == 0


def test_a_worker_reaped_in_its_own_run_is_fenced(pair):
    a, b = pair
    join(a, "r1")
    join(b, "r1")
    silent_for(a, 10)
    b._beat_once()  # reaps a
    assert not a.redis.hexists(a.key("workers"), a.worker_id)
    assert a._beat_once() is False
    assert not a.redis.hexists(a.key("workers"), a.worker_id)
    # Leaving, a gives back what it holds but is not counted among the
    # workers gone with their crawls recorded: its counts are not kept.
    _, unrecorded, ended, _ = a._leave_run()
    assert (unrecorded, ended) == (-1, 0)
    assert not a.redis.sismember(a.run_prefix + "left", a.worker_id)


def test_a_slow_but_live_owner_keeps_its_claim(pair):
    a, b = pair
    join(a, "r1")
    join(b, "r1")
    assert a.claim("reseed")
    # a blocks 10 s (its reactor stalled) without being killed: b takes over.
    silent_for(a, 10)
    assert b.claim("reseed")
    a.claim_done("reseed")  # a comes back and marks it done anyway
    claims = a.run_prefix + "claims"
    assert a.redis.hget(claims, "reseed") == b.worker_id.encode()
    assert a.redis.hget(claims, "reseed:done") is None
    assert a.crawler.stats.get_value("cluster/fenced") == 1
    b.claim_done("reseed")
    assert a.redis.hget(claims, "reseed:done") == b.worker_id.encode()


def test_a_worker_with_a_smaller_ttl_does_not_abandon_a_live_run(pair):
    a, b = pair
    join(a, "r1")
    assert float(a.redis.get(a.key("run")).decode().split("|")[2]) == TTL
    # a beat 1.5 s ago: alive by the run's TTL (2 s), dead by b's (1 s).
    silent_for(a, 1.5)
    b.worker_ttl = 1
    with pytest.raises(ClusterError, match=r"INCREMENTAL_CLUSTER_WORKER_TTL is 1 s here, "
                                           r"but the current run .* \(run r1\) was started "
                                           r"with 2 s: every worker of a run must use the same"):
        b._join_run("r2")
    assert a.redis.get(a.key("run")).decode().startswith("r1|")
    assert not a.redis.hexists(a.key("workers"), b.worker_id)
    # The same TTL joins.
    b.worker_ttl = TTL
    assert join(b, "r2") == ""
    assert b.run == "r1"


GONE = PageKey("s", "http://a.example/gone")

#: The coordinator's writes that count pages in its run's accounting.
COUNTS = [
    pytest.param(lambda c: c.count_pages([(GONE, "r", 0, "0")]), id="count_pages"),
    pytest.param(lambda c: c.answer(GONE, "new"), id="answer"),
    pytest.param(lambda c: c.bulk_counted(), id="bulk_counted"),
]


@pytest.mark.parametrize("count", COUNTS)
def test_a_silent_worker_back_counts_nothing_in_its_abandoned_run(pair, count):
    a, b = pair
    silent_run(a)
    join(b, "r2")
    # Back before its next heartbeat: the run's accounting refuses it.
    assert count(a) is None
    assert a.crawler.stats.get_value("cluster/fenced") == 1
    assert abandoned_keys(a) == []


#: The coordinator's plain writes to its run's keys (no page counted), and
#: the key each writes.
NOTES = [
    pytest.param(lambda c: c.note_listing("membership"), "listings", id="note_listing"),
    pytest.param(lambda c: c.note_decided(["http://a.example/p"]), "decided",
                 id="note_decided"),
    pytest.param(lambda c: c.note_first_second_visit(GONE), "early",
                 id="note_first_second_visit"),
    pytest.param(lambda c: c.note_unrecorded_failure(), "unrecorded",
                 id="note_unrecorded_failure"),
    pytest.param(lambda c: c.deferred_counted(), "counted", id="deferred_counted"),
]


@pytest.mark.parametrize(("note", "name"), NOTES)
def test_a_silent_worker_back_does_not_re_create_its_abandoned_runs_keys(pair, note, name):
    a, b = pair
    silent_run(a)
    join(b, "r2")
    # Back (SIGCONT) before its next heartbeat: the write is refused in
    # Redis, not only by the worker's own flag (not set yet).
    assert not a._fenced
    note(a)
    assert abandoned_keys(a) == []
    assert a.crawler.stats.get_value("cluster/fenced") == 1
    # Nor written to the new run's key of that name.
    assert not a.redis.exists(b.run_prefix + name)


@pytest.mark.parametrize(("note", "name"), NOTES)
def test_a_worker_reaped_in_its_own_run_writes_none_of_its_keys(pair, note, name):
    a, b = pair
    reaped_in_its_own_run(a, b)
    note(a)
    assert not a.redis.exists(a.run_prefix + name)
    assert a.crawler.stats.get_value("cluster/fenced") == 1


@pytest.mark.parametrize(("note", "name"), NOTES)
def test_a_worker_silent_past_the_ttl_but_not_yet_reaped_writes_none_of_its_keys(pair, note, name):
    # Its run current and its name still in the workers hash (nobody beat
    # since to reap it), but its last beat older than the TTL by Redis's
    # clock: another worker may take it for dead at any moment, so its
    # plain writes are refused as a reaped worker's are.
    a, b = pair
    join(a, "r1")
    join(b, "r1")
    silent_for(a, 10)
    assert a.redis.hexists(a.key("workers"), a.worker_id)
    note(a)
    assert not a.redis.exists(a.run_prefix + name)
    assert a.crawler.stats.get_value("cluster/fenced") == 1


@pytest.mark.parametrize(("note", "name"), NOTES)
def test_a_live_worker_writes_its_runs_keys(pair, note, name):
    (a, _) = pair
    join(a, "r1")
    note(a)
    assert a.redis.exists(a.run_prefix + name)
    assert a.crawler.stats.get_value("cluster/fenced") is None


@pytest.mark.parametrize("count", COUNTS)
def test_a_worker_reaped_in_its_own_run_counts_nothing(pair, count):
    a, b = pair
    reaped_in_its_own_run(a, b)
    # Back before its next heartbeat: the run's accounting refuses it (its
    # counts would be taken for a killed worker's and counted again).
    assert count(a) is None
    assert a.crawler.stats.get_value("cluster/fenced") == 1
    assert not a.redis.exists(a.run_prefix + "counted")


# The queue's and the claims' scripts (push.lua, pop.lua, claim_done.lua,
# claim_tombstone.lua) run the run's fence (fence.lua) too: a worker back
# from a silence is refused in Redis before any heartbeat of its own has
# set its flag (``_fenced``, which stops it calling them at all).


def test_a_silent_worker_back_queues_nothing_in_its_abandoned_run(pair):
    a, b = pair
    silent_run(a)
    join(b, "r2")
    assert not a._fenced
    assert a.push("fp", 0, b"a link a found") is False
    assert a.crawler.stats.get_value("cluster/fenced") == 1
    assert a.redis.zcard(a.queue_key) == 0
    assert abandoned_keys(a) == []  # its old run's seen set not re-created


def abandoned_for_r2(a: ClusterCoordinator, b: ClusterCoordinator) -> None:
    """*a*'s run r1 abandoned while *a* was silent: *b* joins a new run."""
    silent_run(a)
    join(b, "r2")


def reaped_in_r1(a: ClusterCoordinator, b: ClusterCoordinator) -> None:
    """*a* reaped by *b*'s heartbeat, their run r1 going on with *b*."""
    join(a, "r1")
    join(b, "r1")
    silent_for(a, 10)
    b._beat_once()


@pytest.mark.parametrize("fenced_off_by", [abandoned_for_r2, reaped_in_r1],
                         ids=["its-run-abandoned", "reaped-in-its-run"])
def test_a_fenced_worker_back_pops_nothing(pair, fenced_off_by):
    a, b = pair
    fenced_off_by(a, b)
    a.redis.zadd(a.queue_key, {b"a request": 0})
    # Back before its next heartbeat (nobody would give back what it pops).
    assert not a._fenced
    assert a.pop() is None
    assert a.crawler.stats.get_value("cluster/fenced") == 1
    assert a.redis.zrange(a.queue_key, 0, -1) == [b"a request"]
    assert a.redis.hlen(a.key(f"inflight:{a.worker_id}")) == 0


def test_a_silent_worker_back_claims_no_tombstone_in_its_abandoned_run(pair):
    a, b = pair
    silent_run(a)
    join(b, "r2")
    assert a.claim_tombstone(GONE) is False
    assert a.crawler.stats.get_value("cluster/fenced") == 1
    assert abandoned_keys(a) == []  # its old run's tombstones not re-created
    assert b.claim_tombstone(GONE)


def test_a_silent_worker_back_marks_no_claim_done_in_its_abandoned_run(pair, caplog):
    a, b = pair
    join(a, "r1")
    assert a.claim("reseed")
    silent_for(a, 10)
    join(b, "r2")
    a.claim_done("reseed")
    assert a.crawler.stats.get_value("cluster/fenced") == 1
    assert abandoned_keys(a) == []
    # Refused for its run, in Redis: not only found no owner of the claim.
    assert "FENCED run r1 is not the current run" in caplog.text
