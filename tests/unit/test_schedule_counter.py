"""The schedule counter counts each page once a crawl, in the column its answers merge into;
its stats, and the metrics read from them, only go up."""

from __future__ import annotations

import pytest
from scrapy import Request
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from incremental_crawler.change.accounting import (
    PageOutcome,
    ScheduleCounter,
    Why,
    counted_key,
    mark,
)
from incremental_crawler.metrics.collector import CrawlCollector
from incremental_crawler.report.extension import summarize
from incremental_crawler.state.records import PageKey, PageState

PAGE = PageKey("s", "http://a.example/p")
OTHER = PageKey("s", "http://a.example/q")


def counter() -> ScheduleCounter:
    return ScheduleCounter(MemoryStatsCollector(get_crawler()))


def stored(key: PageKey, next_visit: float, size: int = 100) -> PageState:
    return PageState(key=key, next_visit=next_visit, size=size)


def figures(c: ScheduleCounter) -> dict[str, int]:
    s = summarize(c.stats.get_stats())
    return {k: v for k, v in s.items() if v and (k.startswith(("pages_", "requested"))
                                                 or k in ("not_due", "failed", "first_due",
                                                          "bytes_skipped"))}


def test_a_page_requested_twice_is_requested_once_and_a_success_replaces_its_failure() -> None:
    c = counter()
    c.requested(Why.DUE, "a.example", PAGE)
    c.requested(Why.DUE, "a.example", PAGE)
    c.outcome(PageOutcome.FAILED, PAGE)
    c.failed(PAGE)
    c.failed(PAGE)
    assert figures(c) == {"requested": 1, "requested_due": 1, "pages_known": 1,
                          "pages_checked": 1, "pages_failed": 1, "failed": 1}
    # Asked again, it answered 304: not failed in the end.
    c.outcome(PageOutcome.NOT_MODIFIED, PAGE)
    assert figures(c) == {"requested": 1, "requested_due": 1, "pages_known": 1,
                          "pages_checked": 1, "pages_not_modified": 1}
    [host] = c.hosts.table().values()
    assert host == {"requested/due": 1, "outcome/failed": 0, "failed": 0,
                    "outcome/not_modified": 1}


def test_a_page_not_due_then_requested_leaves_not_due_and_the_first_due_moves_on() -> None:
    c = counter()
    c.not_due(stored(PAGE, 1000.0, size=300))
    c.not_due(stored(OTHER, 2000.0, size=50))
    c.not_due(stored(PAGE, 1000.0, size=300))  # once
    assert figures(c) == {"not_due": 2, "first_due": 1000, "bytes_skipped": 350,
                          "pages_known": 2}
    c.requested(Why.DUE, "a.example", PAGE)
    c.outcome(PageOutcome.UNCHANGED, PAGE)
    c.not_due(stored(PAGE, 1000.0))  # a later request for it: requested it stays
    assert figures(c) == {"not_due": 1, "first_due": 2000, "bytes_skipped": 50,
                          "requested": 1, "requested_due": 1, "pages_known": 2,
                          "pages_checked": 1, "pages_unchanged": 1}
    assert c.counted_after(0) == (1, 50)


def test_the_last_page_not_due_requested_leaves_the_bulk_counts_first_due() -> None:
    c = counter()
    c.summed = lambda state: state.next_visit >= 5000.0
    c.not_due_elsewhere(3, 30, 5000.0)
    c.not_due(stored(PAGE, 1000.0))
    c.requested(Why.DUE, "a.example", PAGE)
    assert figures(c)["first_due"] == 5000


def test_a_page_counted_in_bulk_is_not_counted_again_and_leaves_when_requested() -> None:
    # Three pages not due, counted in bulk by the store's sums: no keys,
    # their state tells them.
    c = counter()
    c.summed = lambda state: state.next_visit >= 5000.0
    c.not_due_elsewhere(3, 300, 5000.0)
    c.not_due(stored(PAGE, 6000.0))
    c.skipped(stored(PAGE, 6000.0))
    c.requested(Why.RECHECK, "a.example", OTHER, stored(OTHER, 7000.0, size=100))
    c.outcome(PageOutcome.UNCHANGED, OTHER)
    # Asked again: it left once.
    c.requested(Why.RECHECK, "a.example", OTHER, stored(OTHER, 7000.0, size=100))
    assert figures(c) == {"not_due": 2, "first_due": 5000, "bytes_skipped": 200,
                          "requested": 1, "requested_recheck": 1, "pages_known": 3,
                          "pages_checked": 1, "pages_unchanged": 1}
    # A page the bulk did not count is counted as it comes.
    third = PageKey("s", "http://a.example/r")
    c.not_due(stored(third, 1000.0))
    assert figures(c)["not_due"] == 3 and figures(c)["pages_known"] == 4


def test_the_counted_key_goes_with_the_why_along_a_redirect_not_into_another_page() -> None:
    request = Request(PAGE.url)
    mark(request, Why.NEW, PAGE)
    hop = request.replace(url="http://a.example/elsewhere",
                          meta={**request.meta, "redirect_urls": [PAGE.url]})
    assert counted_key(request) == counted_key(hop) == PAGE
    # A callback's request that copied the meta is for another page.
    copied = Request(OTHER.url, meta=dict(request.meta))
    assert counted_key(copied) is None


def counters(c: ScheduleCounter) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The counters the live metrics export from *c*'s stats."""
    collector = CrawlCollector(get_crawler(), slots=1, constant={}, info={})
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in collector._pages(c.stats.get_stats()) if family.type == "counter"
            for sample in family.samples if sample.name.endswith("_total")}


def test_stats_and_counters_only_go_up_when_a_page_leaves_a_column() -> None:
    c = counter()
    c.not_due(stored(PAGE, 1000.0, size=5000))
    c.skipped(stored(OTHER, 0.0, size=70))
    third = PageKey("s", "http://a.example/r")
    c.requested(Why.NEW, "a.example", third)
    c.failed(third)
    c.outcome(PageOutcome.FAILED, third)
    stats, before = dict(c.stats.get_stats()), counters(c)
    # Not due, then asked after all; skipped, then asked; failed, then a 304.
    c.requested(Why.DUE, "a.example", PAGE)
    c.outcome(PageOutcome.UNCHANGED, PAGE)
    c.requested(Why.SAMPLED, "a.example", OTHER)
    c.outcome(PageOutcome.CHANGED, OTHER)
    c.outcome(PageOutcome.NOT_MODIFIED, third)
    after = c.stats.get_stats()
    assert [k for k, v in stats.items() if k != "incremental/schedule/first_due"
            and after.get(k, 0) < v] == []
    now = counters(c)
    assert [k for k, v in before.items() if now.get(k, 0) < v] == []
    # The report takes the departures off: each page in one column.
    assert figures(c) == {"requested": 3, "requested_new": 1, "requested_due": 1,
                          "requested_sampled": 1, "pages_known": 3, "pages_checked": 3,
                          "pages_unchanged": 1, "pages_changed": 1, "pages_not_modified": 1}
    # The metrics export the departures as counters of their own.
    assert now[("incremental_known_pages_total", (("decision", "not_due"),))] == 1
    assert now[("incremental_known_pages_left_total", (("decision", "not_due"),))] == 1
    assert now[("incremental_known_pages_left_total", (("decision", "lastmod_unchanged"),))] == 1
    assert now[("incremental_saved_bytes_total", (("by", "not_requested"),))] == 5070
    assert now[("incremental_saved_bytes_left_total", ())] == 5070
    assert now[("incremental_failed_pages_total", ())] == 1
    assert now[("incremental_failed_pages_recovered_total", ())] == 1


@pytest.mark.parametrize(("answers", "column"), [
    # A second fetch is judged against the first: the strongest stays.
    (["changed", "page_changed"], "changed"),
    (["changed", "unchanged"], "changed"),
    (["new", "unchanged"], "new"),
    (["not_modified", "unchanged"], "unchanged"),
    (["unchanged", "changed"], "changed"),
    # A success replaces any other answer; any other answer replaces a
    # success (the store keeps it: a 410 tombstones the page's items).
    (["failed", "changed"], "changed"),
    (["gone", "not_modified"], "not_modified"),
    (["withheld", "new"], "new"),
    (["redirected", "unchanged"], "unchanged"),
    (["changed", "failed"], "failed"),
    (["new", "withheld"], "withheld"),
    (["unchanged", "gone"], "gone"),
    # The last of two answers that are no success stands.
    (["failed", "gone"], "gone"),
    (["gone", "failed"], "failed"),
])
def test_a_pages_answers_merge_into_one_column(answers: list[str], column: str) -> None:
    c = counter()
    c.requested(Why.DUE, "a.example", PAGE)
    for answer in answers:
        if answer == "failed":
            c.failed(PAGE)
        c.outcome(PageOutcome(answer), PAGE)
    s = summarize(c.stats.get_stats())
    assert {o: s[f"pages_{o}"] for o in PageOutcome if s[f"pages_{o}"]} == {column: 1}
    # schedule/failed follows the last answer, as the store does.
    assert s["failed"] == (answers[-1] == "failed")
    [host] = c.hosts.table().values()
    assert {k: v for k, v in host.items() if k.startswith("outcome/") and v} == {
        f"outcome/{column}": 1}


class OtherWorkerFirst:
    """A run whose other worker counted *theirs* first (requested), as the
    run's script answers; each call recorded."""

    def __init__(self, theirs: set[PageKey]) -> None:
        self.columns = dict.fromkeys(theirs, "r0:0")
        self.calls: list[list[tuple[PageKey, str]]] = []
        self.answered: set[PageKey] = set()

    def count_pages(self, pages):
        self.calls.append([(key, column) for key, column, _, _ in pages])
        had = []
        for key, column, size, _ in pages:
            old = self.columns.get(key, "")
            if not old or (column == "r" and not old.startswith("r")):
                self.columns[key] = f"{column}0:{size}"
            had.append(old)
        return had

    def bulk_counted(self):
        return 0, 0

    def answer(self, key, event):
        """The first answer of a page is its column (the run's merge, in short)."""
        if key in self.answered:
            return ",,0,0"
        self.answered.add(key)
        return f"{event},,0,0"


def test_a_batch_counts_its_pages_in_the_run_in_one_call_and_each_page_once() -> None:
    c = counter()
    third = PageKey("s", "http://a.example/r")
    run = c.run = OtherWorkerFirst({OTHER})
    with c.batch():
        c.requested(Why.DUE, "a.example", PAGE, stored(PAGE, 0.0))
        c.requested(Why.DUE, "a.example", OTHER, stored(OTHER, 0.0))
        c.not_due(stored(third, 5000.0, size=40))
        c.requested(Why.DUE, "a.example", PAGE, stored(PAGE, 0.0))  # again: once
        assert figures(c) == {}  # counted when the batch closes
    assert run.calls == [[(PAGE, "r"), (OTHER, "r"), (third, "d"), (PAGE, "r")]]
    # OTHER is the other worker's: the answer it gets here is counted
    # here all the same (the run merges a page's answers wherever they land).
    c.outcome(PageOutcome.NEW, PAGE)
    c.outcome(PageOutcome.NEW, OTHER)
    assert run.answered == {PAGE, OTHER}
    assert figures(c) == {"requested": 1, "requested_due": 1, "not_due": 1,
                          "first_due": 5000, "bytes_skipped": 40, "pages_known": 2,
                          "pages_checked": 1, "pages_new": 2, "pages_no_outcome": -1}


def test_a_redirect_not_followed_leaves_an_answered_page_in_its_column() -> None:
    c = counter()
    c.requested(Why.DUE, "a.example", PAGE)
    c.unanswered(PageOutcome.REDIRECTED, PAGE)
    c.requested(Why.DUE, "a.example", OTHER)
    c.outcome(PageOutcome.NOT_MODIFIED, OTHER)
    c.unanswered(PageOutcome.REDIRECTED, OTHER)
    assert {k: v for k, v in figures(c).items() if k.startswith("pages_")} == {
        "pages_known": 2, "pages_checked": 2, "pages_not_modified": 1, "pages_redirected": 1}


def test_the_pages_counted_in_the_sum_are_those_the_sum_counts_not_all_those_due_later(
) -> None:
    # The re-seeder's sum of the pages not due leaves lists out (and pages
    # checked this crawl, other scopes): a list counted not due one by one
    # is not taken off it.
    c = counter()
    c.summed = lambda s: s.next_visit > 100.0 and s.callback != "parse_list"
    c.not_due(PageState(key=PAGE, next_visit=1000.0, size=300, callback="parse_list"))
    c.not_due(PageState(key=OTHER, next_visit=2000.0, size=50, callback="parse"))
    assert c.counted_in_sum(100.0) == (1, 50)
