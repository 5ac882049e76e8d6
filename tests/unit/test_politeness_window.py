"""The AIMD window's rules, one table each (pure: no reactor, no crawl).

Policies use binary-exact factors (0.5, 0.75) so that rates compare exactly.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from incremental_crawler.politeness.window import DomainWindow, WindowPolicy

POLICY = WindowPolicy(start_rate=4, min_rate=0.5, max_rate=20, increase=1, decrease=0.5,
                      soft_decrease=0.75, target_latency=1.0, max_concurrency=8,
                      penalty_after=3, backoff_base=1.0, backoff_max=30.0)
FAST, SLOW = 0.01, 1.5  # below and above the target latency


def apply(window: DomainWindow, kind: str, arg: Any = None) -> str | None:
    """One step: ("ok" | "slow" | "send", count) or ("hard" | "soft", seq or None: the latest)."""
    if kind in ("ok", "slow"):
        reasons = [window.ok(FAST if kind == "ok" else SLOW) for _ in range(arg)]
        return reasons[-1]
    if kind == "send":
        for _ in range(arg):
            window.stamp()
        return None
    seq = window.sent if arg is None else arg
    return window.hard_error(seq) if kind == "hard" else window.soft_error(seq)


# (policy changes, steps: ((kind, arg), reason of the last event, rate after))
RATE_ROWS: dict[str, tuple[dict[str, Any], list[tuple[tuple[str, Any], str | None, float]]]] = {
    "slow start doubles after each window (rate answers)": ({}, [
        (("ok", 3), None, 4), (("ok", 1), "slow-start increase", 8),
        (("ok", 7), None, 8), (("ok", 1), "slow-start increase", 16),
        (("ok", 16), "slow-start increase", 20),  # 32, capped at max_rate
        (("ok", 40), None, 20)]),
    "slow answers neither count nor reset the count": ({}, [
        (("ok", 2), None, 4), (("slow", 10), None, 4), (("ok", 1), None, 4),
        (("ok", 1), "slow-start increase", 8)]),
    "after slow start: +increase per window": ({"slow_start": False}, [
        (("ok", 3), None, 4), (("ok", 1), "increase", 5), (("ok", 4), None, 5),
        (("ok", 1), "increase", 6)]),
    "a hard signal ends slow start": ({}, [
        (("send", 1), None, 4), (("hard", 1), "decrease", 2),
        (("ok", 1), None, 2), (("ok", 1), "increase", 3)]),
    "a hard signal cuts once per window of requests in flight": ({}, [
        (("send", 4), None, 4), (("hard", 1), "decrease", 2),
        (("hard", 2), None, 2), (("hard", 4), None, 2),  # same burst: paid for
        (("send", 1), None, 2), (("hard", 3), None, 2),  # still an old one
        (("hard", 5), "decrease", 1),  # sent after the cut
        (("hard", None), None, 1)]),  # nothing sent since
    "cuts stop at min_rate": ({"rate": 1.0}, [
        (("send", 1), None, 1), (("hard", 1), "decrease", 0.5),
        (("send", 1), None, 0.5), (("hard", 2), "decrease", 0.5)]),
    "a soft error costs a little and restarts the count, not slow start": ({}, [
        (("ok", 3), None, 4), (("soft", None), "soft decrease", 3),
        (("ok", 2), None, 3), (("ok", 1), "slow-start increase", 6),
        (("soft", None), "soft decrease", 4.5)]),
    "soft errors stop at min_rate": ({"rate": 0.6}, [
        (("soft", None), "soft decrease", 0.5), (("soft", None), "soft decrease", 0.5)]),
    "a soft error after a hard one is hard (and a healthy answer ends the run)": ({}, [
        (("send", 2), None, 4), (("hard", 1), "decrease", 2),
        (("soft", 2), None, 2),  # hard, but in flight before the cut
        (("send", 1), None, 2), (("soft", 3), "decrease", 1),
        (("ok", 1), "increase", 2), (("soft", 3), "soft decrease", 1.5)]),
}


@pytest.mark.parametrize("row", list(RATE_ROWS))
def test_rate_steps(row):
    changes, steps = RATE_ROWS[row]
    window = DomainWindow(POLICY, **changes)
    for number, ((kind, arg), reason, rate) in enumerate(steps, 1):
        assert (apply(window, kind, arg), window.rate) == (reason, rate), f"step {number}"


def test_a_soft_error_after_a_hard_one_is_counted_as_hard():
    window = DomainWindow(POLICY)
    hard = []
    for kind, arg in (("send", 1), ("hard", 1), ("soft", 1), ("ok", 1), ("soft", 1)):
        apply(window, kind, arg)
        hard.append(window.hard)
    assert hard == [0, 1, 2, 2, 2]


# (steps, in the penalty box after them)
PENALTY_ROWS: dict[str, tuple[list[tuple[str, Any]], bool]] = {
    "two hard signals: not yet": ([("hard", None)] * 2, False),
    "three hard signals in a row": ([("hard", None)] * 3, True),
    "a soft error after two hard ones is the third": ([("hard", None)] * 2 + [("soft", None)],
                                                      True),
    "soft errors alone never": ([("soft", None)] * 10, False),
    "a healthy answer ends it": ([("hard", None)] * 5 + [("ok", 1)], False),
    "a slow answer ends it too (the server answers)": ([("hard", None)] * 5 + [("slow", 1)],
                                                        False),
    "a healthy answer in between restarts the run": (
        [("hard", None)] * 2 + [("ok", 1)] + [("hard", None)] * 2, False),
}


@pytest.mark.parametrize("row", list(PENALTY_ROWS))
def test_penalty_box(row):
    steps, boxed = PENALTY_ROWS[row]
    window = DomainWindow(POLICY, rate=20)
    window.latencies.extend([1.0] * 5)  # the rate needs 8 requests in flight
    for kind, arg in steps:
        apply(window, kind, arg)
    assert window.penalty_box is boxed
    # In the box: one probe request at a time, whatever the rate needs.
    assert (window.concurrency == 1) is boxed


# (rate, Crawl-delay floor, delay)
DELAY_ROWS = [(4, 0.0, 0.25), (4, 0.1, 0.25), (4, 0.5, 0.5), (0.5, 1.0, 2.0), (0.5, 3.0, 3.0),
              (20, 0.0, 0.05)]


@pytest.mark.parametrize(("rate", "floor", "delay"), DELAY_ROWS)
def test_the_delay_is_one_over_the_rate_and_never_below_the_crawl_delay(rate, floor, delay):
    window = DomainWindow(POLICY, rate=rate, delay_floor=floor)
    assert window.delay == delay


# (rate, latencies seen, max_concurrency, concurrency): what the rate needs at
# the median latency, plus one, within 1..max_concurrency.
CONCURRENCY_ROWS = [
    (4, [], 8, 2),  # no answer yet: 0.1 s assumed, ceil(0.4) + 1
    (4, [0.5], 8, 3),  # ceil(2) + 1
    (10, [0.1, 0.25, 5.0], 8, 4),  # the median (0.25 s), not the mean: ceil(2.5) + 1
    (16, [0.25] * 3, 8, 5),
    (20, [1.0], 8, 8),  # 21 needed, bounded
    (20, [1.0], 16, 16),
    (0.5, [0.001], 8, 2),  # ceil(0.0005) + 1
    (0.5, [0.001], 1, 1),  # a slot held to one request (CONCURRENT_REQUESTS_PER_DOMAIN=1)
]


@pytest.mark.parametrize(("rate", "latencies", "most", "concurrency"), CONCURRENCY_ROWS)
def test_concurrency_is_what_the_rate_needs_at_the_observed_latency(rate, latencies, most,
                                                                    concurrency):
    window = DomainWindow(replace(POLICY, max_concurrency=most), rate=rate)
    window.latencies.extend(latencies)
    assert window.concurrency == concurrency


# (hard signals in a row, backoff without jitter): base x 2^(n-1), at most backoff_max
BACKOFF_ROWS = [(0, 1.0), (1, 1.0), (2, 2.0), (3, 4.0), (5, 16.0), (6, 30.0), (20, 30.0)]


@pytest.mark.parametrize(("hard", "base"), BACKOFF_ROWS)
def test_backoff_doubles_per_hard_signal_within_bounds_with_jitter(hard, base, monkeypatch):
    window = DomainWindow(POLICY)
    for _ in range(hard):
        window.hard_error(window.stamp())
    drawn: list[tuple[float, float]] = []

    def lowest(a: float, b: float) -> float:
        drawn.append((a, b))
        return a

    monkeypatch.setattr(random, "uniform", lowest)
    low = window.backoff()
    monkeypatch.setattr(random, "uniform", lambda a, b: b)
    high = window.backoff()
    # Jitter of +-50% around the base, so that clients told to back off
    # together do not come back together.
    assert drawn == [(0.5, 1.5)]
    assert (low, high) == (0.5 * base, 1.5 * base)
