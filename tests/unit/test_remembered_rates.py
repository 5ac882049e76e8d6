"""Where a slot's window starts from a remembered rate (RateMemory.start)."""

from __future__ import annotations

from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from incremental_crawler.politeness.remembered import RateMemory
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
