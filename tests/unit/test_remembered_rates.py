"""Where a slot's window starts from a remembered rate (RateMemory.start)."""

from __future__ import annotations

from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from incremental_crawler.politeness.remembered import RateMemory, learned
from incremental_crawler.politeness.window import DomainWindow, WindowPolicy
from incremental_crawler.state.records import SlotRate


def started(record: SlotRate, policy: WindowPolicy) -> DomainWindow:
    memory = RateMemory(86400, MemoryStatsCollector(get_crawler()))
    memory.rates[record.slot] = record
    window = DomainWindow(policy)
    memory.start(record.slot, window)
    return window


def test_after_a_hard_signal_the_cut_rate_in_additive_increase():
    window = started(SlotRate("s", "a", 1.5, False, 0.0, "penalty box"), WindowPolicy())
    assert (window.rate, window.slow_start) == (1.5, False)


def test_without_a_hard_signal_slow_start_from_at_least_the_start_rate():
    window = started(SlotRate("s", "a", 30.0, True, 0.0), WindowPolicy())
    assert (window.rate, window.slow_start) == (30.0, True)
    # Held low by a delay, or cut by soft errors: no slower than a first crawl.
    window = started(SlotRate("s", "a", 1.0, True, 0.0), WindowPolicy(start_rate=4.0))
    assert (window.rate, window.slow_start) == (4.0, True)


def test_the_slots_bounds_win():
    assert started(SlotRate("s", "a", 50.0, True, 0.0), WindowPolicy(max_rate=10)).rate == 10
    assert started(SlotRate("s", "a", 0.2, False, 0.0), WindowPolicy(min_rate=0.5)).rate == 0.5


def test_a_hard_signal_before_the_remembered_rate_is_confirmed_drops_to_the_start_rate():
    # The site got slower since: a remembered rate costs no more than a
    # first crawl would (one cut to the start rate, not 50 -> 35 -> 24 ...).
    window = started(SlotRate("s", "a", 50.0, True, 0.0), WindowPolicy(start_rate=4.0))
    assert window.unproven
    window.stamp()
    assert window.hard_error(1) == "decrease (the last crawl's rate is too fast now)"
    assert window.rate == 4.0
    assert not window.unproven
    window.stamp()
    window.hard_error(2)
    assert window.rate == 4.0 * 0.7  # from then on the usual cuts


def test_a_window_of_healthy_answers_confirms_the_remembered_rate():
    window = started(SlotRate("s", "a", 20.0, False, 0.0), WindowPolicy(start_rate=4.0))
    for _ in range(20):
        window.stamp()
        window.ok(0.01)
    assert not window.unproven
    window.stamp()
    assert window.hard_error(window.sent) == "decrease"
    assert window.rate == 21.0 * 0.7  # grew by one, then the usual cut


def test_a_remembered_rate_at_or_below_the_start_rate_has_nothing_to_confirm():
    assert not started(SlotRate("s", "a", 2.0, False, 0.0), WindowPolicy(start_rate=4.0)).unproven


def test_no_groups_until_the_remembered_ceiling_is_confirmed():
    window = started(SlotRate("s", "a", 50.0, True, 0.0), WindowPolicy(max_rate=50.0))
    assert window.burst(0.1) == 1
    for _ in range(50):
        window.stamp()
        window.ok(0.01)
    assert window.burst(0.1) == 5


def test_only_a_window_that_learned_something_is_saved():
    record = SlotRate("s", "a", 50.0, True, 0.0)
    # Three answers: the remembered 50/s is not confirmed, the record stays.
    unconfirmed = started(record, WindowPolicy(max_rate=50.0))
    for _ in range(3):
        unconfirmed.stamp()
        unconfirmed.ok(0.01)
    # A window of healthy answers confirmed it.
    confirmed = started(record, WindowPolicy(max_rate=50.0))
    for _ in range(50):
        confirmed.stamp()
        confirmed.ok(0.01)
    # A hard signal cut it: the site's answer is news.
    cut = started(record, WindowPolicy(max_rate=50.0))
    cut.hard_error(cut.stamp())
    # Started from no memory: one answer is enough.
    fresh = DomainWindow(WindowPolicy())
    fresh.stamp()
    fresh.ok(0.01)
    saved = learned("s", [("unconfirmed", unconfirmed), ("confirmed", confirmed),
                          ("cut", cut), ("fresh", fresh)], {})
    assert [r.slot for r in saved] == ["confirmed", "cut", "fresh"]
