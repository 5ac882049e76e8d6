"""A fast slot's requests leave in small groups, at the same rate; one at a
time wherever a gap is owed.

Which requests left together, and when, is read on the crawler's side
(tests/send_log.py: the downloader's releases of the slot's queue), which
holds at any machine load: the server sees each request some transit later,
and that transit wavers on a busy machine (two single requests may arrive
together, a group's may arrive apart)."""

from __future__ import annotations

import itertools

import pytest
import pytest_twisted

from incremental_crawler.metrics.collector import CrawlCollector
from incremental_crawler.politeness.extension import AdaptiveThrottle
from tests.redis_util import BUDGET_REDIS_URI
from tests.send_log import Send, kept_apart, left_groups
from tests.spiders import ListSpider

FAST = {"INCREMENTAL_THROTTLE_ENABLED": True, "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 16, "INCREMENTAL_THROTTLE_START_RATE": 50,
        "INCREMENTAL_THROTTLE_MAX_RATE": 50,
        "DOWNLOADER": "tests.send_log.SendLogDownloader"}
#: Page requests a slot starting at its ceiling (50/s) sends one at a time: a
#: window of healthy answers at that rate comes before any group.
SINGLES = 50


def page_starts(site) -> list[float]:
    return sorted(r.started for r in site.log if r.path.startswith("/p/"))


def sends(crawler) -> list[Send]:
    """The page requests as the crawler let them go, in that order."""
    return [send for group in left_groups(crawler.engine.downloader) for send in group]


def groups(crawler) -> list[list[Send]]:
    return left_groups(crawler.engine.downloader)


def answers_before(crawler, moment: float) -> int:
    """The page answers the crawler had read before *moment*."""
    return sum(1 for send in sends(crawler) if send.answered is not None
               and send.answered < moment)


def most_in_flight(site) -> int:
    """The most page requests the server had begun and not yet answered at once."""
    events = sorted((t, step) for r in site.log if r.path.startswith("/p/")
                    for t, step in ((r.started, 1), (r.finished, -1)))
    in_flight = most = 0
    for _t, step in events:
        in_flight += step
        most = max(most, in_flight)
    return most


def most_in_flight_sent(crawler) -> int:
    """The most page requests the crawler had let go and not yet read the
    answer of, at once (an answer counts at the moment it was read)."""
    events = sorted((t, step) for send in sends(crawler)
                    for t, step in ((send.left, 1), (send.answered, -1)) if t is not None)
    in_flight = most = 0
    for _t, step in events:
        in_flight += step
        most = max(most, in_flight)
    return most


def most_in_one_second(starts: list[float]) -> int:
    return max(sum(1 for t in starts[i:] if t < start + 1.0) for i, start in enumerate(starts))


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
    crawler = await crawl(ListSpider, settings=settings, urls=[site.url(p) for p in paths])
    assert len(page_starts(site)) == 90
    found = groups(crawler)
    # One at a time, though the window is at its ceiling from the first
    # request (no answer yet says the site takes it), until a window of
    # healthy answers at the ceiling came back (50 at 50/s; the slot's
    # robots.txt answer counts too).
    first_group = next(g for g in found if len(g) > 1)
    assert answers_before(crawler, first_group[0].left) >= SINGLES - 1
    assert all(len(g) == 1 for g in found[:SINGLES - 1])
    # Then, the ceiling confirmed: groups.
    assert max(len(g) for g in found) >= 3


@pytest_twisted.ensureDeferred
async def test_a_fast_slot_sends_groups_of_rate_times_tick_at_the_same_rate(site, crawl):
    paths = site.add_pages(SINGLES + 60, size=800)
    crawler = await crawl(ListSpider, settings=FAST, urls=[site.url(p) for p in paths])
    assert len(page_starts(site)) == SINGLES + 60
    found = groups(crawler)
    sizes = [len(g) for g in found]
    # 50/s * 0.1 s: five at a time, never more (fewer when the slot's
    # concurrency is still taken by the last group's answers).
    assert max(sizes) == 5
    # Once groups began, they did the sending: 60 requests in at most 20
    # releases, most of them groups of five.
    start = next(i for i, g in enumerate(found) if len(g) > 1)
    grouped = sizes[start:]
    assert len(grouped) <= 20
    assert grouped.count(5) >= len(grouped) // 2
    # A release of n uses n intervals of 1/50 s: the next one leaves that
    # long after it began, on the crawler's clock (single requests too; the
    # last interval is the next release's own delay).
    assert all(b[0].left >= a[0].entered + (len(a) - 1) * a[0].delay + b[0].delay - 1e-9
               for a, b in itertools.pairwise(found))
    # The rate is the window's: in any second at most rate + one group left.
    assert most_in_one_second([send.left for send in sends(crawler)]) <= 55


@pytest_twisted.ensureDeferred
async def test_without_a_tick_requests_leave_one_at_a_time(site, crawl):
    # Past the window of answers after which a tick would let groups go.
    paths = site.add_pages(SINGLES + 40, size=800)
    crawler = await crawl(ListSpider, settings={**FAST, "INCREMENTAL_THROTTLE_TICK": 0},
                          urls=[site.url(p) for p in paths])
    assert len(page_starts(site)) == SINGLES + 40
    assert [len(g) for g in groups(crawler)] == [1] * (SINGLES + 40)


@pytest_twisted.ensureDeferred
async def test_a_users_delay_promises_a_gap_between_any_two_requests(site, crawl):
    # Past the window of answers after which groups would go.
    paths = site.add_pages(SINGLES + 40, size=800)
    # 1/50 s: the window may reach 50/s all the same, so nothing else holds it.
    crawler = await crawl(ListSpider, settings={**FAST, "DOWNLOAD_DELAY": 0.02},
                          urls=[site.url(p) for p in paths])
    assert len(page_starts(site)) == SINGLES + 40
    assert [len(g) for g in groups(crawler)] == [1] * (SINGLES + 40)
    # And each left the delay after the one before (the crawler's clock).
    assert kept_apart(site.log, crawler.engine.downloader, 0.02) == []


@pytest_twisted.ensureDeferred
async def test_a_site_that_refuses_a_group_gets_one_request_at_a_time_after(site, crawl):
    # A limiter that takes 50/s evenly but no more than two at once, as
    # nginx's limit_req with a small burst does.
    site.limit(rate=50, burst=2)
    paths = site.add_pages(SINGLES + 40, size=800)
    crawler = await crawl(ListSpider, settings=FAST, urls=[site.url(p) for p in paths])
    pages = [r for r in site.log if r.path.startswith("/p/")]
    assert {r.path for r in pages if r.status == 200} == set(paths)
    sent = sends(crawler)
    first_429 = min(s.answered for s in sent if s.status == 429 and s.answered is not None)
    # Retry-After: 1 froze the slot for a second; what left after the
    # crawler read the 429 left one at a time, at the cut window's 35/s.
    after = [g for g in groups(crawler) if g[0].left > first_429]
    assert sum(len(g) for g in after) >= 20
    assert all(len(g) == 1 for g in after)
    # The groups cost one round of refusals, not one per group: the 429s
    # answered requests of the groups that left before the crawler read the
    # first one.
    round_one = [s for s in sent if s.status == 429 and s.left < first_429]
    assert 1 <= len(round_one) <= 4
    assert len({s.release for s in round_one}) <= 2


@pytest_twisted.ensureDeferred
async def test_the_concurrency_figure_lets_a_whole_group_be_in_flight(site, crawl):
    # 30 ms answers at 50/s: the rate alone needs 3 in flight, a group of
    # five puts five there at once.
    paths = site.add_pages(SINGLES + 60, size=800)
    site.slow("/p/", 0.03)
    crawler = await crawl(ListSpider, settings=FAST, urls=[site.url(p) for p in paths])
    # Groups of five (its tick at the ceiling); how many of one left
    # together depends on the answers read by then (the machine's load).
    (window,) = crawler.get_extension(AdaptiveThrottle).site_windows()
    assert window[1].group == 5
    assert max(len(g) for g in groups(crawler)) <= 5
    # What the metrics say the slot may have in flight is its window's
    # concurrency, which lets a whole group be in flight (more than the
    # rate alone needs). Its figure at the end, not its peak: a loaded
    # machine's slower answers raise the concurrency for a while.
    collector = CrawlCollector(crawler, slots=10, constant={}, info={})
    figure = next(family for family in collector.collect()
                  if family.name == "incremental_slot_concurrency")
    (sample,) = figure.samples
    assert sample.value == window[1].concurrency >= 5
    assert crawler.engine.downloader.slots[window[0]].concurrency == window[1].concurrency


@pytest_twisted.ensureDeferred
async def test_nothing_leaves_inside_a_retry_after_that_stops_the_groups(site, crawl):
    paths = site.add_pages(SINGLES + 60, size=800)
    site.override(paths[SINGLES + 35], status=429, headers={"Retry-After": "1"})
    # One 429: its retries would freeze the slot again and again.
    crawler = await crawl(ListSpider, settings={**FAST, "RETRY_ENABLED": False,
                                                "INCREMENTAL_THROTTLE_MAX_RETRIES": 0},
                          urls=[site.url(p) for p in paths])
    (refusal,) = [s for s in sends(crawler) if s.status == 429]
    assert refusal.answered is not None
    # It came in the middle of groups.
    assert max(len(g) for g in groups(crawler) if g[0].left < refusal.answered) >= 3
    # What a group had let go before the crawler read the 429 was on its
    # way; nothing left after it for the whole second (the crawler's clock).
    # (The throttle froze the slot a moment before the 429 was logged as
    # read: 50 ms of margin, far below the second it holds.)
    assert [s.url for s in sends(crawler)
            if refusal.answered < s.left < refusal.answered + 0.95] == []
    assert any(s.left >= refusal.answered + 1.0 for s in sends(crawler))


@pytest_twisted.ensureDeferred
async def test_the_users_concurrency_bounds_the_group(site, crawl):
    paths = site.add_pages(SINGLES + 40, size=800)
    site.slow("/p/", 0.03)
    crawler = await crawl(ListSpider, settings={**FAST, "CONCURRENT_REQUESTS_PER_DOMAIN": 3},
                          urls=[site.url(p) for p in paths])
    # The window's groups are the user's 3, not its tick's worth at the
    # ceiling (more): what leaves together is at most that. How many did
    # leave together depends on the machine (a group leaves with the
    # requests whose answers were read by then), so only the bound is
    # asserted on what left.
    (window,) = crawler.get_extension(AdaptiveThrottle).site_windows()
    throttle = crawler.get_extension(AdaptiveThrottle)
    assert int(throttle.tick * window[1].rate) > 3
    assert window[1].group == 3
    assert max(len(g) for g in groups(crawler)) <= 3
    assert most_in_flight_sent(crawler) <= 3
    assert most_in_flight(site) <= 3


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
