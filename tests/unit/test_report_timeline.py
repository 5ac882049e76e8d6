"""The report's per-slot timeline stays bounded whatever the crawl's length and breadth."""

from __future__ import annotations

import time

from scrapy.utils.test import get_crawler

from incremental_crawler.change.host_counts import OTHER_HOSTS, HostCounts
from incremental_crawler.politeness.extension import AdaptiveThrottle
from incremental_crawler.report.timeline import OTHER, Timeline


def throttle() -> AdaptiveThrottle:
    return AdaptiveThrottle(get_crawler(settings_dict={"INCREMENTAL_THROTTLE_ENABLED": True}))


def test_a_long_crawl_keeps_at_most_max_points_samples_and_slows_its_sampling() -> None:
    t = throttle()
    window = t.window("a.example")
    timeline = Timeline(t, interval=0.25, max_points=8)
    for i in range(40):
        window.ok(0.01 * (i + 1))
        timeline._tick()
    data = timeline.to_json(top=10)
    assert len(data["times_s"]) <= 8
    assert len(data["slots"]["a.example"]["latency_p50_ms"]) == len(data["times_s"])
    # 40 ticks into at most 8 samples: every other dropped twice, then thrice.
    assert data["interval_s"] >= 0.25 * 4


def test_only_max_slots_get_series_and_the_drawn_ones_are_the_busiest() -> None:
    t = throttle()
    for i in range(6):
        t.window(f"s{i}.example").sent = 10 * i
    timeline = Timeline(t, max_slots=4)
    timeline.sample()
    assert set(timeline.slots) == {"s0.example", "s1.example", "s2.example", "s3.example"}
    # A slot without series: its freezes are not recorded either.
    now = time.monotonic()
    timeline.frozen("s5.example", now, now + 1, "429")
    timeline.frozen("s3.example", now, now + 1, "429, Retry-After: 1")
    timeline.frozen("s3.example", now + 0.5, now + 2, "429, Retry-After: 1")
    timeline.sample()
    data = timeline.to_json(top=2)
    assert list(data["slots"]) == ["s3.example", "s2.example", OTHER]
    assert data["slots_tracked"] == 4 and data["slots_untracked"] == 2
    spans = data["slots"]["s3.example"]["frozen_spans"]
    # Two overlapping freezes, one span; both counted.
    assert len(spans) == 1 and data["slots"]["s3.example"]["freezes"] == 2
    # The others summed: 10 + 0 requests.
    assert data["slots"][OTHER]["requests"][-1] == 10


def test_host_counts_are_bounded() -> None:
    counts = HostCounts(max_hosts=2)
    for host in ("a", "b", "c", "d"):
        counts.count(host, "not_modified")
    table = counts.table()
    assert table == {"a": {"not_modified": 1}, "b": {"not_modified": 1},
                     OTHER_HOSTS: {"not_modified": 2}}
