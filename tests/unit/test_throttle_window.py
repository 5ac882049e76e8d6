"""The AIMD window's rules, without a crawl (the crawl tests are in tests/test_throttle.py)."""

from __future__ import annotations

from incremental_crawler.politeness.window import DomainWindow, WindowPolicy

POLICY = WindowPolicy(start_rate=8, min_rate=0.5, max_rate=12, increase=1, decrease=0.5,
                      penalty_after=3)  # decrease 0.5 here for round numbers


def test_slow_start_doubles_until_the_first_hard_signal():
    window = DomainWindow(POLICY)
    for _ in range(7):
        assert window.ok(0.01) is None
    assert window.ok(0.01) == "slow-start increase" and window.rate == 12  # 16, capped
    window.hard_error(window.stamp())
    assert window.rate == 6 and not window.slow_start


def test_additive_increase_after_a_window_of_healthy_answers_up_to_the_bound():
    window = DomainWindow(POLICY, slow_start=False)
    for _ in range(7):
        assert window.ok(0.01) is None
    assert window.ok(0.01) == "increase" and window.rate == 9
    for _ in range(200):
        window.ok(0.01)
    assert window.rate == 12  # max_rate


def test_slow_answers_do_not_grow_the_window():
    window = DomainWindow(POLICY)
    for _ in range(50):
        window.ok(POLICY.target_latency + 1)
    assert window.rate == 8


def test_one_cut_per_window_of_requests_in_flight():
    window = DomainWindow(POLICY)
    seqs = [window.stamp() for _ in range(10)]  # a burst in flight
    assert window.hard_error(seqs[0]) == "decrease" and window.rate == 4
    for seq in seqs[1:]:  # the rest of the same burst fails too
        assert window.hard_error(seq) is None
    assert window.rate == 4
    later = window.stamp()  # sent after the cut
    assert window.hard_error(later) == "decrease" and window.rate == 2


def test_a_lone_soft_error_weighs_less_and_a_run_of_hard_ones_opens_the_penalty_box():
    window = DomainWindow(POLICY)
    assert window.soft_error(window.stamp()) == "soft decrease"
    assert 7 < window.rate < 8
    for _ in range(3):
        window.hard_error(window.stamp())
    assert window.penalty_box and window.concurrency == 1
    window.ok(0.01)
    assert not window.penalty_box


def test_rate_sets_delay_and_crawl_delay_is_a_floor():
    window = DomainWindow(POLICY)
    assert window.delay == 1 / 8
    window.delay_floor = 2.0
    assert window.delay == 2.0
    # Concurrency: what the rate needs at the median latency, plus one.
    assert window.concurrency == 2  # no answer yet: 0.1 s assumed, ceil(8 x 0.1) + 1
    for latency in (0.4, 0.5, 3.0):
        window.ok(latency)
    assert window.rate == 8 and window.concurrency == 5  # median 0.5 s: ceil(8 x 0.5) + 1


def test_backoff_grows_per_consecutive_failure_within_bounds():
    window = DomainWindow(POLICY)
    window.hard_error(window.stamp())
    first = window.backoff()
    for _ in range(10):
        window.hard_error(window.stamp())
    assert 0.5 * POLICY.backoff_base <= first <= 1.5 * POLICY.backoff_base
    assert window.backoff() <= 1.5 * POLICY.backoff_max
