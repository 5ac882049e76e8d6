"""A fast slot's requests leave in small groups, at the same rate, as the
server sees them; one at a time wherever a gap is owed."""

from __future__ import annotations

import itertools

import pytest
import pytest_twisted

from incremental_crawler.metrics.collector import CrawlCollector
from incremental_crawler.politeness.extension import AdaptiveThrottle
from tests.redis_util import BUDGET_REDIS_URI
from tests.spiders import ListSpider

#: Request times as the server saw them, to a few ms: the tests marked with
#: it run while no other test's crawlers do (under xdist).
ALONE = pytest.mark.alone

FAST = {"INCREMENTAL_THROTTLE_ENABLED": True, "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 16, "INCREMENTAL_THROTTLE_START_RATE": 50,
        "INCREMENTAL_THROTTLE_MAX_RATE": 50}
#: Requests that start closer than this are one group (groups are 0.1 s apart).
SAME_GROUP = 0.03
#: Page requests a slot starting at its ceiling (50/s) sends one at a time: a
#: window of healthy answers at that rate comes before any group.
SINGLES = 50


def page_starts(site) -> list[float]:
    return sorted(r.started for r in site.log if r.path.startswith("/p/"))


def groups(starts: list[float], within: float = SAME_GROUP) -> list[list[float]]:
    out: list[list[float]] = []
    for t in starts:
        if out and t - out[-1][-1] < within:
            out[-1].append(t)
        else:
            out.append([t])
    return out


def assert_one_at_a_time(starts: list[float]) -> None:
    """20 ms apart as they leave. What the server sees wavers by several ms
    under load (two may arrive together), but a group's requests arrive
    within a ms or two of each other, all of them."""
    assert max(len(g) for g in groups(starts, within=0.004)) <= 2


def most_in_flight(site) -> int:
    """The most page requests the server had begun and not yet answered at once."""
    events = sorted((t, step) for r in site.log if r.path.startswith("/p/")
                    for t, step in ((r.started, 1), (r.finished, -1)))
    in_flight = most = 0
    for _t, step in events:
        in_flight += step
        most = max(most, in_flight)
    return most


def most_in_one_second(starts: list[float]) -> int:
    return max(sum(1 for t in starts[i:] if t < start + 1.0) for i, start in enumerate(starts))


@ALONE
@pytest.mark.parametrize("settings", [
    FAST,
    # The ceiling a per-domain override sets, the start rate its own.
    {**FAST, "INCREMENTAL_THROTTLE_START_RATE": None,
     "INCREMENTAL_THROTTLE_DOMAINS": {"127.0.0.1": {"start_rate": 50, "max_rate": 50}}},
], ids=["start-rate-is-max-rate", "per-domain-override"])
@pytest_twisted.ensureDeferred
async def test_a_slot_starting_at_its_ceiling_sends_no_group_before_a_window_of_answers(
    site, crawl, settings
):
    paths = site.add_pages(90, size=800)
    await crawl(ListSpider, settings=settings, urls=[site.url(p) for p in paths])
    starts = page_starts(site)
    assert len(starts) == 90
    # The first second's requests: one at a time, though the window is at
    # its ceiling from the first request (no answer yet says the site takes it).
    # (At 50/s about 50 of them; fewer when the machine is busy.)
    first_second = [t for t in starts if t < starts[0] + 1.0]
    assert len(first_second) >= 20
    assert_one_at_a_time(first_second)
    # Then, the ceiling confirmed by a window of healthy answers: groups.
    assert max(len(g) for g in groups(starts[SINGLES:], within=0.004)) >= 3


@ALONE
@pytest_twisted.ensureDeferred
async def test_a_fast_slot_sends_groups_of_rate_times_tick_at_the_same_rate(site, crawl):
    paths = site.add_pages(SINGLES + 60, size=800)
    await crawl(ListSpider, settings=FAST, urls=[site.url(p) for p in paths])
    starts = page_starts(site)
    assert len(starts) == SINGLES + 60
    # The first second's requests leave one at a time (see above); the last
    # of them, 20 ms apart, count as one group with the first group here.
    found = groups(starts[SINGLES:])
    sizes = [len(g) for g in found]
    # 50/s * 0.1 s: five at a time, never more.
    assert max(sizes[1:]) == 5
    assert sizes.count(5) >= len(found) // 2
    # A fifth of the wake-ups, or about.
    assert len(found) <= 20
    # A group of n uses n intervals of 1/50 s: the next one leaves that long
    # after it (a group is smaller when the slot's concurrency is still
    # taken by the last one's answers). Margin: what the server sees wavers.
    assert all(b[0] - a[0] >= 0.7 * len(a) / 50 for a, b in itertools.pairwise(found))
    # The rate is the window's: in any second at most rate + one group.
    assert most_in_one_second(starts) <= 55


@ALONE
@pytest_twisted.ensureDeferred
async def test_without_a_tick_requests_leave_one_at_a_time(site, crawl):
    paths = site.add_pages(30, size=800)
    await crawl(ListSpider, settings={**FAST, "INCREMENTAL_THROTTLE_TICK": 0},
                urls=[site.url(p) for p in paths])
    starts = page_starts(site)
    assert len(starts) == 30
    assert_one_at_a_time(starts)


@ALONE
@pytest_twisted.ensureDeferred
async def test_a_users_delay_promises_a_gap_between_any_two_requests(site, crawl):
    paths = site.add_pages(30, size=800)
    # 1/50 s: the window may reach 50/s all the same, so nothing else holds it.
    await crawl(ListSpider, settings={**FAST, "DOWNLOAD_DELAY": 0.02},
                urls=[site.url(p) for p in paths])
    starts = page_starts(site)
    assert len(starts) == 30
    assert_one_at_a_time(starts)


@ALONE
@pytest_twisted.ensureDeferred
async def test_a_site_that_refuses_a_group_gets_one_request_at_a_time_after(site, crawl):
    # A limiter that takes 50/s evenly but no more than two at once, as
    # nginx's limit_req with a small burst does.
    limiter = site.limit(rate=50, burst=2)
    paths = site.add_pages(SINGLES + 40, size=800)
    await crawl(ListSpider, settings=FAST, urls=[site.url(p) for p in paths])
    pages = [r for r in site.log if r.path.startswith("/p/")]
    assert {r.path for r in pages if r.status == 200} == set(paths)
    first_429 = min(r.finished for r in pages if r.status == 429)
    # Retry-After: 1 froze the slot for a second; what left after it left
    # one at a time, at the cut window's 35/s (~28 ms apart).
    after = sorted(r.started for r in pages if r.started > first_429 + 0.5)
    assert len(after) >= 20
    assert_one_at_a_time(after)
    # The groups cost one round of refusals, not one per group.
    assert limiter.refused <= 4


@ALONE
@pytest_twisted.ensureDeferred
async def test_the_concurrency_figure_lets_a_whole_group_be_in_flight(site, crawl):
    # 30 ms answers at 50/s: the rate alone needs 3 in flight, a group of
    # five puts five there at once.
    paths = site.add_pages(SINGLES + 60, size=800)
    site.slow("/p/", 0.03)
    crawler = await crawl(ListSpider, settings=FAST, urls=[site.url(p) for p in paths])
    # (The first second's single requests, 20 ms apart, are no group.)
    assert max(len(g) for g in groups(page_starts(site), within=0.004)) == 5
    seen = most_in_flight(site)
    assert seen >= 4
    # What the metrics say the slot may have in flight covers what the
    # server saw in flight.
    collector = CrawlCollector(crawler, slots=10, constant={}, info={})
    figure = next(family for family in collector.collect()
                  if family.name == "incremental_slot_concurrency")
    (sample,) = figure.samples
    assert sample.value >= seen


@ALONE
@pytest_twisted.ensureDeferred
async def test_nothing_leaves_inside_a_retry_after_that_stops_the_groups(site, crawl):
    paths = site.add_pages(SINGLES + 60, size=800)
    site.override(paths[SINGLES + 35], status=429, headers={"Retry-After": "1"})
    # One 429: its retries would freeze the slot again and again.
    await crawl(ListSpider, settings={**FAST, "RETRY_ENABLED": False,
                                      "INCREMENTAL_THROTTLE_MAX_RETRIES": 0},
                urls=[site.url(p) for p in paths])
    pages = [r for r in site.log if r.path.startswith("/p/")]
    first_429 = min(r.finished for r in pages if r.status == 429)
    before = [t for t in page_starts(site) if t < first_429]
    # It came in the middle of groups (the first counts the last single
    # requests of the first second too, see above).
    assert max(len(g) for g in groups(before[SINGLES:])[1:]) == 5
    # What a group had on the wire when the 429 came may still arrive just
    # after it; nothing else before the second is over.
    assert [r.path for r in pages if first_429 + 0.05 < r.started < first_429 + 0.95] == []


@ALONE
@pytest_twisted.ensureDeferred
async def test_the_users_concurrency_bounds_the_group(site, crawl):
    paths = site.add_pages(SINGLES + 40, size=800)
    site.slow("/p/", 0.03)
    await crawl(ListSpider, settings={**FAST, "CONCURRENT_REQUESTS_PER_DOMAIN": 3},
                urls=[site.url(p) for p in paths])
    assert max(len(g) for g in groups(page_starts(site), within=0.004)) == 3
    assert most_in_flight(site) <= 3


# No timing asserted: beside other tests.
@pytest_twisted.ensureDeferred
async def test_the_shared_budget_never_sends_groups(site, crawl, budget_prefix):
    paths = site.add_pages(60, size=800)
    crawler = await crawl(ListSpider, settings={
        **FAST, "INCREMENTAL_THROTTLE_SHARED_URL": BUDGET_REDIS_URI,
        "INCREMENTAL_THROTTLE_SHARED_PREFIX": budget_prefix}, urls=[site.url(p) for p in paths])
    assert len(page_starts(site)) == 60
    # Its bucket grants a token per request: the slot lets them go one by one.
    (window,) = crawler.get_extension(AdaptiveThrottle).site_windows()
    assert window[1].rate == 50
    assert window[1].group == 1
    assert {slot.burst for slot in crawler.engine.downloader.slots.values()} == {1}
