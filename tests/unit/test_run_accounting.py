"""Each known page in one column for a cluster run: the workers' counters
(:class:`ScheduleCounter`) counting through the real run record
(``count_page.lua``, ``bulk_counted.lua``, ``leave.lua``) on a real Redis.

A worker's figures are its stats; the run's are its recorded workers'
stats summed (a killed worker records nothing: its stats are lost).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest
import redis
from scrapy.utils.test import get_crawler

from incremental_crawler.change.accounting import PageOutcome, ScheduleCounter, Why
from incremental_crawler.cluster import ClusterError
from incremental_crawler.cluster import coordinator as coordinator_module
from incremental_crawler.cluster.coordinator import ClusterCoordinator
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.report.extension import accounting_line, summarize
from incremental_crawler.state.records import PageKey, PageState
from tests.redis_util import REDIS_URI, delete_prefix, new_prefix
from tests.unit.test_cluster_fencing import coordinator as fencing_coordinator
from tests.unit.test_cluster_fencing import silent_for

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

P = PageKey("s", "http://a.example/p")
Q = PageKey("s", "http://a.example/q")
HOST = "a.example"
RUN = "run1"


class Worker:
    """One worker of the run: its counter, counting through its coordinator."""

    def __init__(self, prefix: str) -> None:
        crawler = get_crawler(settings_dict={"INCREMENTAL_CLUSTER_URL": REDIS_URI,
                                             "INCREMENTAL_CLUSTER_PREFIX": prefix})
        config = IncrementalConfig.from_settings(crawler.settings).cluster
        assert config is not None
        self.coordinator = ClusterCoordinator(crawler, config)
        self.coordinator.spider_key = f"{prefix}:{{spider}}"
        self.coordinator.run = RUN
        # Joined: the run is the current one, and this worker alive in the
        # workers hash (what join.lua records).
        self.coordinator.redis.set(self.coordinator.key("run"), f"{RUN}|0")
        self.coordinator.redis.hset(self.coordinator.key("workers"),
                                    self.coordinator.worker_id, time.time())
        # The crawler's stats, which its coordinator counts into too.
        self.counter = ScheduleCounter(crawler.stats)
        self.counter.run = self.coordinator
        # What the ledger gives it when the spider opens.
        self.coordinator.counter = self.counter

    def killed(self) -> None:
        """SIGKILLed, and reaped by another's heartbeat (beat.lua): out of
        the workers hash, its stats lost."""
        self.coordinator.redis.hdel(self.coordinator.key("workers"),
                                    self.coordinator.worker_id)

    def left(self) -> None:
        """Left the run (its crawl, and stats, recorded): the last worker
        out with the queue drained ends it."""
        self.coordinator.leave("finished")


@pytest.fixture
def cluster_workers() -> Iterator[Callable[[int], list[Worker]]]:
    """Workers of one run, made on demand."""
    prefix = new_prefix()
    made: list[Worker] = []

    def more(n: int) -> list[Worker]:
        new = [Worker(prefix) for _ in range(n)]
        made.extend(new)
        return new

    yield more
    for w in made:
        w.coordinator.redis.close()
    delete_prefix(prefix)


def run_summary(*recorded: Worker) -> dict[str, int]:
    """The run's figures: its recorded workers' stats summed, as ``scrapy state`` does."""
    total: dict[str, int] = {}
    for w in recorded:
        for k, v in w.counter.stats.get_stats().items():
            total[k] = total.get(k, 0) + v
    return summarize(total)


def lose_first_reply(worker: Worker, script: str,
                     meanwhile: Callable[[], None] | None = None) -> list[bool]:
    """Make *worker*'s coordinator script *script* run, then lose its first
    reply (a timeout, after *meanwhile* ran: another worker's call between
    the two sends); the list returned says whether it was lost."""
    run = getattr(worker.coordinator, script)
    lost: list[bool] = []

    def reply_lost_once(**kwargs):
        reply = run(**kwargs)
        if not lost:
            lost.append(True)
            if meanwhile is not None:
                meanwhile()
            raise redis.TimeoutError("reply lost")
        return reply

    setattr(worker.coordinator, script, reply_lost_once)
    return lost


def state(key: PageKey, next_visit: float = 5000.0, size: int = 100) -> PageState:
    return PageState(key=key, next_visit=next_visit, size=size, callback="parse")


def answered_then_killed(worker: Worker, page: PageKey, outcome: PageOutcome) -> None:
    """*worker* asks *page* (due) and counts its answer *outcome*, then is
    killed before its request is done (its request goes back to the queue)."""
    worker.counter.requested(Why.DUE, HOST, page, state(page))
    worker.counter.outcome(outcome, page)
    worker.killed()


def summed(s: PageState) -> bool:
    """The re-seeder's sum of the pages not due (next visit after 1000)."""
    return s.next_visit > 1000.0


def test_a_killed_workers_page_is_counted_by_the_worker_its_request_went_back_to(
    cluster_workers,
):
    a, b = cluster_workers(2)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.killed()
    # Its in-flight request, requeued, is decided again on b.
    b.counter.requested(Why.DUE, HOST, P, state(P))
    b.counter.outcome(PageOutcome.NEW, P)
    s = run_summary(b)
    assert (s["pages_known"], s["requested"], s["pages_new"]) == (1, 1, 1), s


def test_a_page_counted_by_a_worker_that_left_is_not_counted_again(cluster_workers):
    a, b = cluster_workers(2)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.outcome(PageOutcome.NEW, P)
    a.left()
    b.counter.requested(Why.DUE, HOST, P, state(P))
    b.counter.outcome(PageOutcome.NEW, P)
    s = run_summary(a, b)
    assert (s["pages_known"], s["requested"], s["pages_new"]) == (1, 1, 1), s


def test_a_page_counted_not_due_by_a_worker_killed_before_the_sum_stays_in_the_sum(
    cluster_workers,
):
    a, b = cluster_workers(2)
    a.counter.summed = b.counter.summed = summed
    a.counter.not_due(state(P))
    a.killed()
    # b re-seeds: the store's sum has P; a's count of it is lost, the sum keeps it.
    counted, size = b.counter.counted_in_sum(1000.0)
    assert (counted, size) == (0, 0)
    b.counter.not_due_elsewhere(1 - counted, 100 - size, 5000.0)
    b.counter.not_due(state(P))  # reached again: in the sum already
    s = run_summary(b)
    assert (s["pages_known"], s["not_due"]) == (1, 1), s


def test_a_page_counted_not_due_by_a_worker_killed_after_the_sum_is_counted_again(
    cluster_workers,
):
    a, b = cluster_workers(2)
    a.counter.summed = b.counter.summed = summed
    a.counter.not_due(state(P))
    counted, size = b.counter.counted_in_sum(1000.0)
    assert (counted, size) == (1, 100)  # a's: the sum leaves it out
    b.counter.not_due_elsewhere(1 - counted, 100 - size, 5000.0)
    a.killed()
    b.counter.not_due(state(P))
    s = run_summary(b)
    assert (s["pages_known"], s["not_due"]) == (1, 1), s


def test_a_count_run_again_after_its_reply_was_lost_is_the_callers(cluster_workers):
    (a,) = cluster_workers(1)
    lost = lose_first_reply(a, "_count_page")
    a.counter.requested(Why.DUE, HOST, P, state(P))
    assert lost
    a.counter.outcome(PageOutcome.NEW, P)
    lost.clear()
    a.counter.not_due(state(Q))
    s = run_summary(a)
    assert (s["requested"], s["pages_new"], s["not_due"]) == (1, 1, 1), s


def test_a_not_due_count_run_again_is_taken_off_the_sum_once(cluster_workers):
    a, b = cluster_workers(2)
    a.counter.summed = b.counter.summed = summed
    script = a.coordinator._count_page

    def ran_twice(**kwargs):
        script(**kwargs)
        return script(**kwargs)

    a.coordinator._count_page = ran_twice
    a.counter.not_due(state(P))
    # b re-seeds: the store's sum has P and another page.
    counted, size = b.counter.counted_in_sum(1000.0)
    b.counter.not_due_elsewhere(2 - counted, 200 - size, 5000.0)
    s = run_summary(a, b)
    assert (s["pages_known"], s["not_due"]) == (2, 2), s


def deferrable(s: PageState) -> bool:
    """The re-seeder's sum of the due pages it may defer (next visit up to 1000)."""
    return s.next_visit <= 1000.0


def test_a_page_the_re_seeder_deferred_requested_on_another_worker_leaves_deferred(
    cluster_workers,
):
    # a re-seeds over its limit and defers two due pages (counted by the
    # store's sum: no keys); a re-seeded page's 304 is answered on b, which
    # replays its links: b requests P, one of the deferred pages.
    a, b = cluster_workers(2)
    a.counter.deferrable = b.counter.deferrable = deferrable
    a.counter.deferred(2, lambda s: deferrable(s) and s.key != Q)
    b.counter.requested(Why.DUE, HOST, P, state(P, next_visit=100.0))
    b.counter.outcome(PageOutcome.NOT_MODIFIED, P)
    s = run_summary(a, b)
    assert (s["pages_known"], s["deferred"], s["pages_not_modified"]) == (2, 1, 1), s


def test_a_due_page_requested_when_nothing_was_deferred_stays_requested(cluster_workers):
    a, b = cluster_workers(2)
    a.counter.deferrable = b.counter.deferrable = deferrable
    a.counter.deferred(0, deferrable)
    b.counter.requested(Why.DUE, HOST, P, state(P, next_visit=100.0))
    b.counter.outcome(PageOutcome.NOT_MODIFIED, P)
    s = run_summary(a, b)
    assert (s["pages_known"], s["deferred"], s["pages_not_modified"]) == (1, 0, 1), s


def test_a_list_of_2500_pages_is_counted_in_the_run_1000_at_a_time(cluster_workers):
    (a,) = cluster_workers(1)
    calls: list[int] = []
    script = a.coordinator._count_page

    def counted(**kwargs):
        # The worker and its tag, then five arguments a page.
        calls.append((len(kwargs["args"]) - 3) // 5)
        return script(**kwargs)

    a.coordinator._count_page = counted
    pages = [PageKey("s", f"http://a.example/{i}") for i in range(2_500)]
    with a.counter.batch():
        for key in pages:
            a.counter.not_due(state(key))
    assert calls == [1_000, 1_000, 500]
    s = run_summary(a)
    assert (s["pages_known"], s["not_due"]) == (2_500, 2_500), s


def test_a_page_counted_elsewhere_then_requeued_when_its_counter_was_killed_is_counted(
    cluster_workers,
):
    # b decides its own start request for P while a, which counted P, is
    # alive; a is killed, and its request of P goes back to the queue: b
    # decides it again and counts it.
    a, b = cluster_workers(2)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    b.counter.requested(Why.DUE, HOST, P, state(P))
    a.killed()
    b.counter.requested(Why.DUE, HOST, P, state(P))
    b.counter.outcome(PageOutcome.NEW, P)
    s = run_summary(b)
    assert (s["pages_known"], s["requested"], s["pages_new"]) == (1, 1, 1), s


def test_a_page_a_list_counted_answered_on_the_worker_with_its_start_url_is_answered_once(
    cluster_workers,
):
    # a's sitemap counts P requested and yields it; b's start URL P
    # (dont_filter) is decided on b: counted elsewhere. The shared queue
    # hands a's request to b too: b answers both, a none.
    a, b = cluster_workers(2)
    with a.counter.batch():
        a.counter.requested(Why.LASTMOD_NEWER, HOST, P, state(P))
    b.counter.requested(Why.DUE, HOST, P, state(P))
    b.counter.outcome(PageOutcome.NEW, P)
    b.counter.outcome(PageOutcome.NOT_MODIFIED, P)
    s = run_summary(a, b)
    assert (s["requested"], s["pages_new"], s["pages_no_outcome"]) == (1, 1, 0), s


def test_one_page_answered_on_three_workers_has_one_column(cluster_workers):
    # b counts its start URL P; a's list decides P too (counted elsewhere)
    # and yields it; c pops a's request and answers it, b its own.
    a, b, c = cluster_workers(3)
    b.counter.requested(Why.DUE, HOST, P, state(P))
    with a.counter.batch():
        a.counter.requested(Why.LASTMOD_NEWER, HOST, P, state(P))
    c.counter.outcome(PageOutcome.UNCHANGED, P)
    b.counter.outcome(PageOutcome.CHANGED, P)
    s = run_summary(a, b, c)
    assert (s["requested"], s["pages_changed"], s["pages_unchanged"],
            s["pages_no_outcome"]) == (1, 1, 0, 0), s


def test_a_failure_then_a_success_on_another_worker_ends_the_page_answered(cluster_workers):
    a, b = cluster_workers(2)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.outcome(PageOutcome.FAILED, P)
    a.counter.failed(P)
    b.counter.outcome(PageOutcome.NOT_MODIFIED, P)
    # A redirect hop of another request of P, not fetched: P has its answer.
    a.counter.unanswered(PageOutcome.REDIRECTED, P)
    s = run_summary(a, b)
    assert (s["requested"], s["pages_not_modified"], s["pages_failed"],
            s["pages_redirected"], s["failed"]) == (1, 1, 0, 0, 0), s


def test_an_answer_run_again_after_its_reply_was_lost_is_counted_once(cluster_workers):
    a, b = cluster_workers(2)
    lost = lose_first_reply(a, "_answer")
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.outcome(PageOutcome.NEW, P)
    assert lost
    b.counter.outcome(PageOutcome.UNCHANGED, P)
    s = run_summary(a, b)
    assert (s["requested"], s["pages_new"], s["pages_no_outcome"]) == (1, 1, 0), s


def test_an_answer_counted_by_a_killed_worker_is_counted_again(cluster_workers):
    # a's answer is counted on a, which is killed before its request is
    # done: requeued, b asks the page again and counts its answer.
    a, b = cluster_workers(2)
    answered_then_killed(a, P, PageOutcome.NEW)
    b.counter.requested(Why.DUE, HOST, P, state(P))
    b.counter.outcome(PageOutcome.UNCHANGED, P)
    s = run_summary(b)
    assert (s["requested"], s["pages_unchanged"], s["pages_no_outcome"]) == (1, 1, 0), s


def test_a_workers_report_lines_say_its_answers_are_its_share(cluster_workers):
    # The ordinary cluster case: a's sitemap counts P requested; the shared
    # queue hands P's request to b, which answers it. Neither worker's
    # report says P went without an answer (a's requested 1 less answered 0
    # is not that): both say the columns are their share.
    from incremental_crawler.report.extension import report_lines

    a, b = cluster_workers(2)
    with a.counter.batch():
        a.counter.requested(Why.LASTMOD_NEWER, HOST, P, state(P))
    b.counter.outcome(PageOutcome.NEW, P)
    lines = [report_lines(summarize(w.counter.stats.get_stats()), worker=True)
             for w in (a, b)]
    for first, *_ in lines:
        assert "without an answer" not in first, lines
        assert "this worker's share" in first, lines
    assert ", 1 new, " in lines[1][0], lines


def test_a_page_requested_whose_visit_is_not_stored_when_the_sum_is_read_is_not_in_it(
    cluster_workers,
):
    # b's sitemap says P's lastmod is newer (P is not due): b requests and
    # answers P, its visit staged, not flushed (or held for the feeds) when
    # a re-seeds: the store's sum still counts P by its old state. The run
    # tells a the pages requested that the sum counted; those whose stored
    # state is still the old one are taken off it.
    a, b = cluster_workers(2)
    a.counter.summed = b.counter.summed = summed
    b.counter.requested(Why.LASTMOD_NEWER, HOST, P, state(P))
    b.counter.outcome(PageOutcome.CHANGED, P)
    stored = {P: state(P), Q: state(Q)}  # the store's states: P's visit not in yet
    counted, size = a.counter.counted_in_sum(1000.0)
    requested = a.counter.requested_in_sum()
    assert requested == {P}
    unvisited = [stored[key].size for key in requested if summed(stored[key])]
    a.counter.not_due_elsewhere(2 - counted - len(unvisited), 200 - size - sum(unvisited),
                                5000.0)
    s = run_summary(a, b)
    assert (s["pages_known"], s["requested"], s["not_due"]) == (2, 1, 1), s


def test_a_final_failure_is_counted_failed_in_the_run(cluster_workers):
    # The outcome "failed" (an answer that was a failure) and the event of a
    # failure recorded were one string: the run took the outcome for the
    # event, and the page ended in no column.
    (a,) = cluster_workers(1)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.failed(P)
    a.counter.outcome(PageOutcome.FAILED, P)
    s = run_summary(a)
    assert (s["requested"], s["pages_failed"], s["pages_no_outcome"]) == (1, 1, 0), s


def test_the_pages_requested_in_the_sum_are_read_in_chunks(cluster_workers):
    # 2500 pages requested (not due: lastmod newer) before the sum: the
    # re-seeder gets them all, read in SSCAN chunks, none in the script's
    # reply (one reply of 1e5+ members would hold the server).
    r, b = cluster_workers(2)
    r.counter.summed = b.counter.summed = summed
    pages = [PageKey("s", f"http://a.example/{i}") for i in range(2_500)]
    with b.counter.batch():
        for key in pages:
            b.counter.requested(Why.LASTMOD_NEWER, HOST, key, state(key))
    replies: list[int] = []
    script = r.coordinator._bulk_counted

    def bulk_counted(**kwargs):
        reply = script(**kwargs)
        replies.append(len(reply))
        return reply

    r.coordinator._bulk_counted = bulk_counted
    scans: list[int] = []
    sscan = r.coordinator.redis.sscan

    def scanned(*args, **kwargs):
        cursor, chunk = sscan(*args, **kwargs)
        scans.append(len(chunk))
        return cursor, chunk

    r.coordinator.redis.sscan = scanned
    assert r.counter.counted_in_sum(1000.0) == (0, 0)
    assert r.counter.requested_in_sum() == set(pages)
    assert replies == [2]  # the pages and their size only
    assert len(scans) >= 2 and sum(scans) >= 2_500, scans


def outcomes(s: dict[str, int]) -> int:
    """The run's pages with a success counted (as many as pages answered so)."""
    return sum(s[f"pages_{o}"] for o in ("new", "changed", "page_changed", "unchanged",
                                          "not_modified"))


def test_an_answer_replaced_by_a_worker_killed_since_is_not_counted_twice(cluster_workers):
    # a answers P unchanged; b's new replaces it (b counts new and unchanged
    # replaced) and b is killed (those counts lost): P's request, requeued,
    # answers 304 on c. a's unchanged is P's column again, which c's 304
    # does not replace: one success for P.
    a, b, c = cluster_workers(3)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.outcome(PageOutcome.UNCHANGED, P)
    b.counter.outcome(PageOutcome.NEW, P)
    b.killed()
    c.counter.requested(Why.DUE, HOST, P, state(P))
    c.counter.outcome(PageOutcome.NOT_MODIFIED, P)
    s = run_summary(a, c)
    assert (s["requested"], outcomes(s), s["pages_unchanged"]) == (1, 1, 1), s


def test_an_answer_replacing_one_handed_back_by_a_killed_worker_counts_it_replaced(
    cluster_workers,
):
    a, b, c = cluster_workers(3)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.outcome(PageOutcome.NOT_MODIFIED, P)
    b.counter.outcome(PageOutcome.UNCHANGED, P)
    b.killed()
    c.counter.requested(Why.DUE, HOST, P, state(P))
    c.counter.outcome(PageOutcome.CHANGED, P)
    s = run_summary(a, c)
    assert (s["requested"], outcomes(s), s["pages_changed"]) == (1, 1, 1), s


def test_a_recovery_by_a_worker_killed_since_does_not_leave_the_page_failed(cluster_workers):
    # a counts P failed; b's 304 counts its recovery and b is killed (the
    # recovery lost): P is failed again, and c's 304 recovers it.
    a, b, c = cluster_workers(3)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.failed(P)
    b.counter.outcome(PageOutcome.NOT_MODIFIED, P)
    b.killed()
    c.counter.requested(Why.DUE, HOST, P, state(P))
    c.counter.outcome(PageOutcome.NOT_MODIFIED, P)
    s = run_summary(a, c)
    assert (s["requested"], s["pages_not_modified"], s["failed"]) == (1, 1, 0), s


def test_an_answer_run_again_after_another_workers_answer_is_counted(cluster_workers):
    # a's answer (new) runs, its reply is lost; b's 304 runs before a sends
    # its call again: a's call still gets its first reply (a counts new).
    a, b = cluster_workers(2)
    lost = lose_first_reply(a, "_answer",
                            lambda: b.counter.outcome(PageOutcome.NOT_MODIFIED, P))
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.outcome(PageOutcome.NEW, P)
    assert lost
    s = run_summary(a, b)
    assert (s["requested"], s["pages_new"], s["pages_no_outcome"]) == (1, 1, 0), s


def test_a_count_run_again_after_another_worker_requested_the_page_is_counted(
    cluster_workers,
):
    # a counts Q not due, its reply lost; b requests Q before a sends its
    # call again (b counts Q requested, not due left): a's call gets its
    # first reply (a counts Q not due), not b's.
    a, b = cluster_workers(2)
    a.counter.summed = b.counter.summed = summed
    lost = lose_first_reply(a, "_count_page",
                            lambda: b.counter.requested(Why.DUE, HOST, Q, state(Q)))
    a.counter.not_due(state(Q))
    assert lost
    b.counter.outcome(PageOutcome.NEW, Q)
    s = run_summary(a, b)
    assert (s["pages_known"], s["requested"], s["not_due"]) == (1, 1, 0), s


def test_a_due_page_requested_elsewhere_before_the_re_seeder_defers_is_not_deferred_too(
    cluster_workers,
):
    # b requests the due page P (a link), its visit staged, not stored,
    # when the re-seeder r sums the due pages over its limit: the store's
    # sum still has P by its old state. The run tells r the pages requested
    # before; those whose stored state is still due are taken off (as
    # count_deferred does).
    r, b = cluster_workers(2)
    r.counter.deferrable = b.counter.deferrable = deferrable
    b.counter.requested(Why.DUE, HOST, P, state(P, next_visit=100.0))
    b.counter.outcome(PageOutcome.NEW, P)
    stored = {P: state(P, next_visit=100.0), Q: state(Q, next_visit=100.0)}  # P's visit not in
    requested = r.counter.deferring()
    assert requested == {P}
    r.counter.deferred(2 - sum(deferrable(stored[key]) for key in requested), deferrable)
    s = run_summary(r, b)
    assert (s["pages_known"], s["requested"], s["deferred"]) == (2, 1, 1), s


def test_a_due_page_requested_before_the_deferral_by_a_killed_worker_stays_out_of_deferred(
    cluster_workers,
):
    # a's list counts the due P requested; r reads P within its limit (not
    # in the deferred sum) and defers Q. a is killed: P's request, requeued,
    # is counted on b, which is not told P leaves the deferred pages.
    a, r, b = cluster_workers(3)
    for w in (a, r, b):
        w.counter.deferrable = deferrable
    with a.counter.batch():
        a.counter.requested(Why.LASTMOD_NEWER, HOST, P, state(P, next_visit=100.0))
    r.counter.deferred(1, lambda s: deferrable(s) and s.key != P)
    a.killed()
    b.counter.requested(Why.DUE, HOST, P, state(P, next_visit=100.0))
    b.counter.outcome(PageOutcome.NEW, P)
    s = run_summary(r, b)
    assert (s["pages_known"], s["requested"], s["deferred"]) == (2, 1, 1), s


def re_seed(r: Worker, pages: int, size: int) -> None:
    """*r* counts the store's sum of the pages not due (*pages*, *size*),
    as count_the_rest does."""
    counted, counted_size = r.counter.counted_in_sum(1000.0)
    r.counter.not_due_elsewhere(pages - counted, size - counted_size, 5000.0)


def test_a_re_seeder_killed_after_its_sum_leaves_no_column_below_zero(cluster_workers):
    # r sums the pages not due (P and Q: 2); b requests P after the sum
    # (P leaves the not-due column, on b) and r is killed: r's sum dies
    # with its stats. The run keeps the sum; b, ending the run, counts it.
    r, b = cluster_workers(2)
    r.counter.summed = b.counter.summed = summed
    re_seed(r, 2, 200)
    b.counter.requested(Why.DUE, HOST, P, state(P))
    b.counter.outcome(PageOutcome.NEW, P)
    r.killed()
    b.counter.not_due(state(Q))  # reached after the kill: in the sum still
    b.left()
    s = run_summary(b)
    assert (s["pages_known"], s["requested"], s["not_due"], s["bytes_skipped"]) == \
        (2, 1, 1, 100), s
    assert b.counter.stats.get_value("cluster/reseeder_sum_taken_over") == 2


def test_a_re_seeder_killed_before_recording_its_sum_leaves_no_column_below_zero(
    cluster_workers,
):
    # r reads the run's counted pages for its sum (count_page.lua counts
    # none of the sum's one by one from then on) and is killed before it
    # counts the sum: b had requested P, in the sum, meanwhile (not due
    # left, against a sum no stats will hold). b, ending the run, makes up
    # for it; the rest of the sum is lost, and said to be.
    r, b = cluster_workers(2)
    r.counter.summed = b.counter.summed = summed
    r.counter.counted_in_sum(1000.0)
    b.counter.requested(Why.DUE, HOST, P, state(P))
    b.counter.outcome(PageOutcome.NEW, P)
    r.killed()
    b.counter.not_due(state(Q))  # the sum is lost: Q counted one by one
    b.left()
    s = run_summary(b)
    assert (s["pages_known"], s["requested"], s["not_due"], s["bytes_skipped"]) == \
        (2, 1, 1, 100), s
    # The rest of the sum (pages nobody reached) is in no column: said so.
    from incremental_crawler.report.extension import accounting_line

    assert s["sums_lost"] == 1
    assert "(incomplete: a cluster worker that re-seeded was killed" in accounting_line(s)


def test_a_re_seeder_that_left_keeps_its_sum_counted_once(cluster_workers):
    # r's crawl is recorded with its sum: the worker that ends the run
    # counts nothing more.
    r, b = cluster_workers(2)
    r.counter.summed = b.counter.summed = summed
    re_seed(r, 2, 200)
    r.left()
    b.counter.requested(Why.DUE, HOST, P, state(P))
    b.counter.outcome(PageOutcome.NEW, P)
    b.left()
    s = run_summary(r, b)
    assert (s["pages_known"], s["requested"], s["not_due"], s["bytes_skipped"]) == \
        (2, 1, 1, 100), s
    assert b.counter.stats.get_value("cluster/reseeder_sum_taken_over") is None


@pytest.mark.parametrize("recorded", [True, False], ids=["counted", "killed_before_counting"])
def test_a_re_seeder_killed_after_deferring_leaves_no_column_below_zero(cluster_workers,
                                                                        recorded):
    # r defers the due pages P and Q over its limit (or is killed before it
    # counts them, once the run was told); b requests P after (P leaves the
    # deferred column, on b) and r is killed: r's count dies with its stats.
    r, b = cluster_workers(2)
    r.counter.deferrable = b.counter.deferrable = deferrable
    if recorded:
        r.counter.deferred(2, deferrable)
    else:
        r.counter.deferring()
    b.counter.requested(Why.DUE, HOST, P, state(P, next_visit=100.0))
    b.counter.outcome(PageOutcome.NEW, P)
    r.killed()
    b.left()
    s = run_summary(b)
    assert (s["pages_known"], s["requested"], s["deferred"]) == \
        ((2, 1, 1) if recorded else (1, 1, 0)), s
    stat = "cluster/reseeder_deferred_taken_over" if recorded else "cluster/reseeder_deferred_lost"
    assert b.counter.stats.get_value(stat) == (2 if recorded else 1)



def columns_at_least_zero(s: dict[str, int]) -> bool:
    return all(v >= 0 for k, v in s.items() if k.startswith("pages_") or k in (
        "requested", "not_due", "skipped_lastmod", "deferred", "failed"))


def test_an_answer_goes_back_past_every_replacer_killed_in_turn(cluster_workers):
    # a answers P unchanged, b's changed replaces it, c's new replaces b's;
    # c is killed, then b: a's unchanged is P's column again (its count
    # stands on a), which d's 304 does not replace: one success.
    a, b, c, d = cluster_workers(4)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.outcome(PageOutcome.UNCHANGED, P)
    b.counter.outcome(PageOutcome.CHANGED, P)
    c.counter.outcome(PageOutcome.NEW, P)
    c.killed()
    b.killed()
    d.counter.requested(Why.DUE, HOST, P, state(P))
    d.counter.outcome(PageOutcome.NOT_MODIFIED, P)
    a.left()
    d.left()
    s = run_summary(a, d)
    assert (s["requested"], outcomes(s), s["pages_unchanged"]) == (1, 1, 1), s
    assert columns_at_least_zero(s), s


@pytest.mark.parametrize("answered_again", [True, False], ids=["answered_again", "not_again"])
def test_a_replacer_killed_under_a_live_one_leaves_no_column_below_zero(cluster_workers,
                                                                        answered_again):
    # a's unchanged, replaced by b's changed, replaced by c's new; b is
    # killed, c lives: c counted b's changed replaced, which b's stats no
    # longer hold. Whether P is answered again (d's 304) or not, the run
    # has one success for P, new, and no column below zero.
    a, b, c, d = cluster_workers(4)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.outcome(PageOutcome.UNCHANGED, P)
    b.counter.outcome(PageOutcome.CHANGED, P)
    c.counter.outcome(PageOutcome.NEW, P)
    b.killed()
    if answered_again:
        d.counter.outcome(PageOutcome.NOT_MODIFIED, P)
    for w in (a, c, d):
        w.left()
    s = run_summary(a, c, d)
    assert (s["requested"], outcomes(s), s["pages_new"]) == (1, 1, 1), s
    assert columns_at_least_zero(s), s


def test_a_failure_counted_by_a_killed_worker_recovered_by_a_live_one_is_not_below_zero(
    cluster_workers,
):
    # a counts P failed and is killed; b's 304 counts P recovered (from a
    # failure a's stats no longer hold); c answers P again.
    a, b, c = cluster_workers(3)
    b.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.failed(P)
    b.counter.outcome(PageOutcome.NOT_MODIFIED, P)
    a.killed()
    c.counter.outcome(PageOutcome.NOT_MODIFIED, P)
    s = run_summary(b, c)
    assert (s["requested"], s["pages_not_modified"], s["failed"]) == (1, 1, 0), s


R = PageKey("s", "http://a.example/r")


def test_pages_only_a_killed_worker_counted_are_counted_by_the_worker_that_ends_the_run(
    cluster_workers,
):
    # a counts P requested (and its answer, new) and Q not due, and is
    # killed once done with P (nothing of it goes back to the queue): no
    # worker reaches P or Q again. b, ending the run, counts them.
    a, b = cluster_workers(2)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.outcome(PageOutcome.NEW, P)
    a.counter.not_due(state(Q))
    a.killed()
    b.counter.requested(Why.DUE, HOST, R, state(R))
    b.counter.outcome(PageOutcome.NOT_MODIFIED, R)
    b.left()
    s = run_summary(b)
    assert (s["pages_known"], s["requested"], s["requested_of_killed"], s["not_due"],
            s["bytes_skipped"], s["pages_new"], s["pages_not_modified"],
            s["pages_no_outcome"]) == (3, 2, 1, 1, 100, 1, 1, 0), s
    stats = b.counter.stats
    assert (stats.get_value("cluster/killed_pages_taken_over"),
            stats.get_value("cluster/killed_answers_taken_over")) == (2, 1)


def test_a_page_a_killed_worker_counted_not_due_then_requested_elsewhere_is_not_below_zero(
    cluster_workers,
):
    # a counts P not due; b requests P (P leaves not due, on b); a is killed.
    a, b = cluster_workers(2)
    a.counter.not_due(state(P))
    b.counter.requested(Why.DUE, HOST, P, state(P))
    b.counter.outcome(PageOutcome.NEW, P)
    a.killed()
    b.left()
    s = run_summary(b)
    assert (s["pages_known"], s["requested"], s["not_due"], s["bytes_skipped"]) == \
        (1, 1, 0, 0), s


def test_a_page_a_killed_worker_counted_in_the_re_seeders_sum_is_not_counted_twice(
    cluster_workers,
):
    # a counts P not due before the sum and is killed before r sums: the
    # sum counts P (a's count is lost), so the run's end counts nothing
    # more for it.
    a, r = cluster_workers(2)
    a.counter.summed = r.counter.summed = summed
    a.counter.not_due(state(P))
    a.killed()
    re_seed(r, 2, 200)
    r.left()
    s = run_summary(r)
    assert (s["pages_known"], s["not_due"], s["bytes_skipped"]) == (2, 2, 200), s


def test_leaving_again_after_settling_counts_the_killed_workers_once(cluster_workers):
    a, b = cluster_workers(2)
    answered_then_killed(a, P, PageOutcome.NEW)
    # b settles, then its leave.lua that would end the run gets no answer
    # (not run): b leaves again, and is told again that it ends the run
    # with a killed worker.
    leave = b.coordinator._leave
    lost: list[bool] = []

    def unanswered_after_settling(**kwargs):
        if b.coordinator._settled and not lost:
            lost.append(True)
            raise redis.TimeoutError("no answer")
        return leave(**kwargs)

    b.coordinator._leave = unanswered_after_settling
    b.left()
    assert lost
    s = run_summary(b)
    assert (s["pages_known"], s["requested"], s["pages_new"]) == (1, 1, 1), s


def test_a_fenced_workers_recorded_crawl_and_the_settling_count_its_pages_once(
    cluster_workers,
):
    # a counts P (requested, new), is reaped while its run goes on, and
    # leaves fenced: its crawl is recorded all the same. b, ending the run,
    # settles a's counts as a killed worker's: a's record hands them to the
    # run, so that `scrapy state`'s sums hold P once.
    a, b = cluster_workers(2)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.outcome(PageOutcome.NEW, P)
    a.killed()  # reaped by b's heartbeat (beat.lua): a is fenced when back
    a.left()
    assert a.coordinator._fenced
    b.left()
    s = run_summary(a, b)
    assert (s["pages_known"], s["requested"], s["pages_new"]) == (1, 1, 1), s
    assert s["counts_incomplete"] == 0, s
    a_stats = a.counter.stats.get_stats()
    assert a_stats["cluster/handed_to_run/outcome/new"] == 1, a_stats


def test_a_fenced_worker_that_ends_the_run_says_its_totals_are_incomplete(cluster_workers):
    # b leaves first; a, silent past the TTL, is fenced by its own heartbeat
    # and is the last out: it ends the run, and nobody counts again what it
    # counted. The run's totals miss P, and say so.
    a, b = cluster_workers(2)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.outcome(PageOutcome.NEW, P)
    b.left()
    silent_for(a.coordinator, 3600)
    a.left()
    assert a.coordinator._fenced
    assert not a.coordinator.redis.exists(a.coordinator.key("run"))  # a ended it
    s = run_summary(a, b)
    assert (s["pages_known"], s["counts_incomplete"]) == (0, 1), s
    assert "incomplete" in accounting_line(s)


@pytest.mark.parametrize("first", ["deferred", "bulk"])
def test_a_re_seeder_killed_after_marking_the_run_has_its_own_pages_settled(
    cluster_workers, first,
):
    # r marks the run (its deferral, run_note.lua; or its sum of the pages
    # not due, bulk_counted.lua: both write its #w|<tag>) before it counts
    # a page one by one; it counts Q (requested, new) and is killed. The
    # worker that ends the run must know r's tag to settle Q.
    r, b = cluster_workers(2)
    if first == "deferred":
        r.counter.deferrable = b.counter.deferrable = deferrable
        r.counter.deferred(1, deferrable)
    else:
        r.counter.summed = b.counter.summed = summed
        r.counter.counted_in_sum(1000.0)
        r.counter.not_due_elsewhere(0, 0, None)
    answered_then_killed(r, Q, PageOutcome.NEW)
    b.counter.requested(Why.DUE, HOST, P, state(P))
    b.counter.outcome(PageOutcome.NOT_MODIFIED, P)
    b.left()
    s = run_summary(b)
    assert (s["requested"], s["pages_new"], s["pages_not_modified"]) == (2, 1, 1), s


@pytest.mark.parametrize("merged", [1, 2])
def test_a_lost_reply_while_settling_a_pages_answers_loses_no_outcome(cluster_workers,
                                                                       merged):
    # a counts P and Q requested and new and is killed. b, ending the run,
    # merges their answers again (answer.lua, event ""): *merged* of them
    # run but the reply is lost (a timeout): leaving is tried again, the
    # settling too, which finds those pages' answers already merged by b.
    a, b = cluster_workers(2)
    for key in (P, Q):
        a.counter.requested(Why.DUE, HOST, key, state(key))
        a.counter.outcome(PageOutcome.NEW, key)
    a.killed()
    settle_answers = b.coordinator._settle_answers
    calls: list[int] = []

    def reply_lost_once(fields, call):
        calls.append(len(fields))
        if len(calls) == 1:
            settle_answers(fields[:merged], call)
            raise redis.TimeoutError("reply lost")
        return settle_answers(fields, call)

    b.coordinator._settle_answers = reply_lost_once
    b.left()
    assert calls == [2, 2]  # the pages sent again
    s = run_summary(b)
    assert (s["requested"], outcomes(s), s["pages_new"]) == (2, 2, 2), s


def test_a_lost_reply_of_the_leave_that_ends_the_run_keeps_the_killed_re_seeders_sum(
    cluster_workers,
):
    # r sums the pages not due (P and Q) and is killed; b requests P. b's
    # leave.lua ends the run (deletes its keys) and hands b r's sum to
    # count, but its reply is lost: b leaves again and gets the same reply.
    r, b = cluster_workers(2)
    r.counter.summed = b.counter.summed = summed
    re_seed(r, 2, 200)
    b.counter.requested(Why.DUE, HOST, P, state(P))
    b.counter.outcome(PageOutcome.NEW, P)
    r.killed()
    lost = lose_first_reply(b, "_leave")
    b.left()
    assert lost
    s = run_summary(b)
    assert (s["pages_known"], s["requested"], s["not_due"], s["bytes_skipped"]) == (
        2, 1, 1, 100), s
    assert b.counter.stats.get_value("cluster/reseeder_sum_taken_over") == 2


def test_a_worker_joining_while_the_last_one_settles_waits_for_the_run_to_end(
    cluster_workers,
):
    # a counts P and is killed; b, last of the run, settles a's counts. A
    # worker starting meanwhile (join.lua) is kept out of the run b ends: it
    # would count a's pages again, or end the run later and settle a again.
    a, b = cluster_workers(2)
    answered_then_killed(a, P, PageOutcome.NEW)
    joiner = fencing_coordinator(b.coordinator.spider_key.partition(":")[0])
    joiner.spider_key = b.coordinator.spider_key
    joiner.settling_wait = 0.0
    settle = b.coordinator.settle_killed
    refused: list[str] = []

    def settle_while_one_joins(killed):
        with pytest.raises(ClusterError, match="still being ended by worker"):
            joiner._join_run("r2")
        refused.append(joiner.redis.hget(b.coordinator.key("workers"), joiner.worker_id))
        settle(killed)

    b.coordinator.settle_killed = settle_while_one_joins
    try:
        b.left()
        assert refused == [None]  # not in the run's workers
        s = run_summary(b)
        assert (s["pages_known"], s["requested"], s["pages_new"]) == (1, 1, 1), s
        # The run is over: the joiner starts the next.
        run, _, abandoned = joiner._join_run("r2")
        assert (run.decode().partition("|")[0], abandoned) == ("r2", "")
    finally:
        joiner.redis.close()


def test_a_worker_in_the_run_after_its_settling_does_not_settle_the_killed_again(
    cluster_workers,
):
    # b, last of the run, settles a's counts; c is in the run's workers when
    # b's leave.lua runs again (b's leaving does not end the run). c ends it
    # later: a's counts, in b's crawl record now, are not settled again.
    a, b = cluster_workers(2)
    answered_then_killed(a, P, PageOutcome.NEW)
    settle = b.coordinator.settle_killed
    joined: list[Worker] = []

    def settle_then_c_is_in(killed):
        settle(killed)
        joined.extend(cluster_workers(1))

    b.coordinator.settle_killed = settle_then_c_is_in
    b.left()
    (c,) = joined
    c.counter.requested(Why.DUE, HOST, Q, state(Q))
    c.counter.outcome(PageOutcome.NOT_MODIFIED, Q)
    c.left()
    s = run_summary(b, c)
    assert (s["pages_known"], s["requested"], s["pages_new"]) == (2, 2, 1), s


def test_the_worker_settling_the_run_beats_while_it_does(cluster_workers):
    # leave() stops b's heartbeat; its settling beats between chunks of the
    # scan (here at each: heartbeat 0), so that a long one is not taken for
    # dead. b's last beat was 25 s ago (TTL 30) when it starts settling.
    a, b = cluster_workers(2)
    answered_then_killed(a, P, PageOutcome.NEW)
    b.coordinator.heartbeat = 0.0
    settle = b.coordinator.settle_killed
    settle_answers = b.coordinator._settle_answers
    silence: list[float] = []

    def stale_then_settle(killed):
        silent_for(b.coordinator, 25)
        settle(killed)

    def beat_age_then_answers(fields, call):
        seconds, micros = b.coordinator.redis.time()
        last = float(b.coordinator.redis.hget(b.coordinator.key("workers"),
                                              b.coordinator.worker_id))
        silence.append(seconds + micros / 1e6 - last)
        return settle_answers(fields, call)

    b.coordinator.settle_killed = stale_then_settle
    b.coordinator._settle_answers = beat_age_then_answers
    b.left()
    assert len(silence) == 1 and silence[0] < 20, silence
    s = run_summary(b)
    assert (s["requested"], s["pages_new"]) == (1, 1), s


def test_a_settling_longer_than_the_ttl_leaves_the_run_consistent(cluster_workers,
                                                                  monkeypatch):
    # a counts 300 pages requested (new) and is killed (600 fields: a hash
    # HSCAN reads in chunks, past 512). b, ending the run,
    # settles them in chunks of 20; after its first chunk its beat is a
    # minute old (a chunk longer than the TTL) and a worker starting
    # meanwhile finds the run abandoned (join.lua) and deletes its keys: b's
    # next chunk is refused. What b counted is counted whole (columns and
    # answers together) or not at all, and its totals say so.
    monkeypatch.setattr(coordinator_module, "SCAN_CHUNK", 20)
    a, b = cluster_workers(2)
    keys = [PageKey("s", f"http://a.example/{i}") for i in range(300)]
    with a.counter.batch():
        for key in keys:
            a.counter.requested(Why.DUE, HOST, key, state(key))
    for key in keys:
        a.counter.outcome(PageOutcome.NEW, key)
    a.killed()
    settle_answers = b.coordinator._settle_answers
    joiner = fencing_coordinator(b.coordinator.spider_key.partition(":")[0])
    joiner.spider_key = b.coordinator.spider_key
    joiner.worker_ttl = 30
    abandoned: list[str] = []

    def slow_chunk(fields, call):
        replies = settle_answers(fields, call)
        if not abandoned:
            silent_for(b.coordinator, 60)
            abandoned.append(joiner._join_run("r2")[2])
        return replies

    b.coordinator._settle_answers = slow_chunk
    try:
        b.left()
    finally:
        joiner.redis.close()
    assert abandoned == [RUN]
    s = run_summary(b)
    assert columns_at_least_zero(s) and s["pages_no_outcome"] == 0, s
    assert (s["requested"], s["pages_new"], s["counts_incomplete"]) == (0, 0, 1), s


def test_a_worker_that_got_the_reply_of_the_leave_ending_the_run_keeps_its_counts(
    cluster_workers,
):
    # b, the run's only worker, counts P and leaves: leave.lua ends the run
    # (b recorded in it) and b gets the reply. Deleting the reply kept for a
    # call run again (<run>:ended|<worker>, which expires in a day anyway)
    # then fails (a failover: READONLY). The run did record b's counts: b's
    # record keeps them, not handed to a run that is over.
    (b,) = cluster_workers(1)
    b.counter.requested(Why.DUE, HOST, P, state(P))
    b.counter.outcome(PageOutcome.NEW, P)
    client = b.coordinator.redis
    delete = client.delete
    refused: list[str] = []

    def read_only(*names):
        if any(str(n).endswith(f"ended|{b.coordinator.worker_id}") for n in names):
            refused.append(str(names[0]))
            raise redis.ReadOnlyError("You can't write against a read only replica.")
        return delete(*names)

    client.delete = read_only  # type: ignore[method-assign]
    b.left()
    assert refused  # the delete was tried, and failed
    assert not client.exists(b.coordinator.key("run"))  # the run ended
    s = run_summary(b)
    assert (s["pages_known"], s["pages_new"], s.get("counts_incomplete", 0)) == (1, 1, 0), s


def test_a_fenced_worker_whose_run_was_abandoned_keeps_its_counts(cluster_workers):
    # a, the run's only worker, counts P (requested, new), then is silent
    # past the TTL (a pause). A worker starting meanwhile abandons the run
    # (join.lua deletes its keys, <run>:counted included) and starts r2. a
    # comes back, is fenced, and leaves: its run is no more, so nobody will
    # ever count P again. a's crawl record keeps P, and says it was not
    # handed over.
    (a,) = cluster_workers(1)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.outcome(PageOutcome.NEW, P)
    silent_for(a.coordinator, 3600)
    joiner = fencing_coordinator(a.coordinator.spider_key.partition(":")[0])
    joiner.spider_key = a.coordinator.spider_key
    try:
        assert joiner._join_run("r2")[2] == RUN
        assert joiner.redis.ttl(joiner.key(f"{RUN}:abandoned")) > 0  # marked, and expires
        a.left()
    finally:
        joiner.redis.close()
    assert a.coordinator._fenced
    stats = a.counter.stats.get_stats()
    assert stats.get("cluster/counts_kept_run_abandoned") == 1
    assert "cluster/counts_handed_to_run" not in stats
    s = run_summary(a)
    assert (s["pages_known"], s["requested"], s["pages_new"]) == (1, 1, 1), s
    assert s.get("counts_incomplete", 0) == 0, s


def test_a_fenced_worker_whose_run_another_worker_ended_hands_its_counts_over(
    cluster_workers,
):
    # a counts P and is taken for dead (fenced); b ends the run, settling a's
    # counts (a is killed to it): a's record hands them over, so that P is
    # counted once, in b's record. The run is not marked abandoned.
    a, b = cluster_workers(2)
    a.counter.requested(Why.DUE, HOST, P, state(P))
    a.counter.outcome(PageOutcome.NEW, P)
    silent_for(a.coordinator, 3600)
    b.left()
    assert not b.coordinator.redis.exists(b.coordinator.key("run"))  # b ended the run
    a.left()
    assert a.coordinator._fenced
    assert a.counter.stats.get_value("cluster/counts_handed_to_run") == 1
    s = run_summary(a, b)
    assert (s["pages_known"], s["requested"], s["pages_new"]) == (1, 1, 1), s
    # a's own report says what it handed over: not an idle worker's.
    mine = run_summary(a)
    assert (mine["pages_known"], mine["counts_handed_to_run"]) == (0, 1), mine
    assert "1 more handed to the run (this cluster worker was taken for dead" \
        in accounting_line(mine), accounting_line(mine)


def test_a_joiners_wait_for_the_settler_ends_before_its_scope_hold_would_lapse():
    # The wait blocks the reactor, which refreshes the scope hold the ledger
    # took before the join: a wait as long as the hold's TTL would let it
    # lapse (a repair could take the scope) and SIGTERM wait as long. Every
    # poll of the wait, and one more poll's slack, fits within the TTL.
    from incremental_crawler.crawl.ledger import HOLD_TTL

    polls = int(coordinator_module.SETTLING_WAIT / coordinator_module.SETTLING_POLL) + 1
    assert (polls + 1) * coordinator_module.SETTLING_POLL < HOLD_TTL * 0.75


@pytest.mark.parametrize("column", ["skipped", "not_due"])
def test_a_page_a_killed_worker_requested_then_counted_not_requested_elsewhere_stays_requested(
    cluster_workers, column
):
    # a requests P and counts its answer, then is killed holding the list
    # that named P (a sitemap's state waits for the end of the crawl): the
    # list goes back to the queue and b reads it again, P stored by then,
    # lastmod unchanged (skipped) or not due. P was requested in the run:
    # it stays requested (b, ending the run, counts a's lost count), not
    # also skipped or not due beside its answer.
    a, b = cluster_workers(2)
    answered_then_killed(a, P, PageOutcome.NEW)
    getattr(b.counter, column)(state(P))
    b.left()
    s = run_summary(b)
    assert (s["pages_known"], s["requested"], s["requested_of_killed"], s["skipped_lastmod"],
            s["not_due"], s["bytes_skipped"], s["pages_new"],
            s["pages_no_outcome"]) == (1, 1, 1, 0, 0, 0, 1, 0), s
