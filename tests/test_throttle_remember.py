"""A re-crawl starts each slot's window from the rate its last crawl reached."""

from __future__ import annotations

import itertools
import logging
import statistics

import pytest
import pytest_twisted
from scrapy.utils.defer import deferred_from_coro

from incremental_crawler import clock
from incremental_crawler.politeness.extension import AdaptiveThrottle
from incremental_crawler.report.extension import crawl_lines
from incremental_crawler.state.records import SlotRate
from tests.redis_util import BUDGET_REDIS_URI as REDIS_URL
from tests.send_log import left_gaps
from tests.spiders import ListSpider

#: A crawl's pace is read from its own side (tests/send_log.py): the gaps it
#: kept cannot shrink under load, so a pace at least that slow holds at any
#: load; a pace as fast as 50/s is read from the slot's delay as each request
#: left (the pace the crawler meant), which a busy machine cannot change.

#: Healthy pages enough for a window starting at 4/s to slow-start to 50/s
#: (4 + 8 + 16 + 32 answers), and some; a window at 50/s (50 answers)
#: confirms a remembered rate.
PAGES = 80
POLITE = {"INCREMENTAL_THROTTLE_ENABLED": True, "CONCURRENT_REQUESTS": 16,
          "CONCURRENT_REQUESTS_PER_DOMAIN": 16, "INCREMENTAL_THROTTLE_MAX_RATE": 50,
          # Every page asked again in the second crawl.
          "INCREMENTAL_RECHECK_ALL": True,
          "DOWNLOADER": "tests.send_log.SendLogDownloader"}
HOST = "127.0.0.1"
#: The page requests whose gaps show the pace a crawl started at (five gaps:
#: their median at 4/s is 0.25 s, at 50/s 0.02 s). A crawl that is only
#: asked for that pace fetches no more pages than these.
SAMPLE = 6


def first_gaps(crawler, n: int = SAMPLE) -> list[float]:
    """The gaps between the first *n* page requests as the crawler let them go."""
    return left_gaps(crawler.engine.downloader, "/p/", n)


def first_delays(crawler, n: int = SAMPLE) -> list[float]:
    """The slot's delay as each of the first *n* page requests left: the pace
    the crawler meant, whatever pace a busy machine let it keep."""
    return [send.delay for send in crawler.engine.downloader.sends if "/p/" in send.url][:n]


def sample_urls(site) -> list[str]:
    """The first :data:`SAMPLE` pages (added already)."""
    return [site.url(f"/p/{i:04d}") for i in range(SAMPLE)]


#: Where :func:`healthy_first_crawl` starts: two windows of slow start (a
#: second each) to 50/s, not four from the default 4/s.
FIRST_START = 12.5


async def healthy_first_crawl(site, crawl) -> list[float]:
    """A first crawl that slow-starts from 12.5/s to 50/s; the gaps of its
    first requests."""
    urls = site.urls(site.add_pages(PAGES, size=800))
    crawler = await crawl(ListSpider, settings={
        **POLITE, "INCREMENTAL_THROTTLE_START_RATE": FIRST_START}, urls=urls)
    assert crawler.get_extension(AdaptiveThrottle).windows[HOST].rate == 50
    gaps = first_gaps(crawler)
    site.reset_log()
    return gaps


async def remembered(site, state_store, saved_at: float | None = None) -> None:
    """The pages, and the record a healthy first crawl leaves (50/s, slow
    start never ended, healthy), staged without crawling: the next test
    shows a first crawl saves just this."""
    site.add_pages(PAGES, size=800)
    state_store.stage_slot_rates(
        [SlotRate("list", HOST, 50.0, True, clock.now() if saved_at is None else saved_at)])
    await state_store.flush()


@pytest_twisted.ensureDeferred
async def test_a_site_that_answered_429_starts_at_the_cut_rate_in_additive_increase(
    site, crawl, state_store
):
    # Four pages: the first crawl's 429s cut the window; the first three
    # requests of the next crawl show the pace it starts at.
    urls = site.urls(site.add_pages(4, size=800))
    site.limit(rate=2, burst=1)
    first = await crawl(ListSpider, settings=POLITE, urls=urls)
    assert first.get_extension(AdaptiveThrottle).windows[HOST].status_429 > 0
    [stored] = (await state_store.slot_rates("list")).rates
    assert not stored.slow_start and stored.rate < 4
    site.limiter = None
    site.reset_log()

    crawler = await crawl(ListSpider, settings={**POLITE, "INCREMENTAL_THROTTLE_DEBUG": True},
                          urls=urls)
    window = crawler.get_extension(AdaptiveThrottle).windows[HOST]
    assert crawler.get_extension(AdaptiveThrottle).memory.started == {HOST: stored.rate}
    # Not above the cut rate: the first requests (before an increase) 1/rate apart.
    assert min(first_gaps(crawler, 3)) >= 1 / stored.rate - 1e-9
    # Never in slow start though every answer was healthy: additive
    # increase, one step per window of answers, from the cut rate.
    assert window.hard == 0 and not window.slow_start
    assert window.rate <= stored.rate + 10 * window.policy.increase


@pytest_twisted.ensureDeferred
async def test_a_site_that_got_slower_since_drops_the_remembered_rate_at_its_first_429(
    site, crawl, state_store
):
    await remembered(site, state_store)
    # Every page but the first is asked after the freeze (the first again too).
    urls = sample_urls(site)
    site.limit(rate=3, burst=1)
    crawler = await crawl(ListSpider, settings=POLITE, urls=urls)
    window = crawler.get_extension(AdaptiveThrottle).windows[HOST]
    assert crawler.get_extension(AdaptiveThrottle).memory.started == {HOST: 50.0}
    assert window.status_429 > 0
    sends = crawler.engine.downloader.sends
    first_429 = min(send.answered for send in sends if send.status == 429)
    # Retry-After: 1 froze the slot; what left after the crawler read the
    # 429 left at the start rate (4/s, 0.25 s apart), not at 50 x 0.7 (28 ms).
    after = [send.lastseen for send in sends if "/p/" in send.url and send.lastseen > first_429]
    assert len(after) >= 5
    assert min(b - a for a, b in itertools.pairwise(after)) >= 0.2


@pytest_twisted.ensureDeferred
async def test_a_rate_older_than_remember_for_is_ignored(site, crawl, state_store,
                                                       monkeypatch):
    await remembered(site, state_store)
    real_now = clock.now
    monkeypatch.setattr(clock, "now", lambda: real_now() + 8 * 86400)  # default: 7 days

    crawler = await crawl(ListSpider, settings=POLITE,
                          urls=sample_urls(site))
    assert_started_again_as_too_old(crawler)


def assert_started_again_as_too_old(crawler) -> None:
    """The crawl's window started at 4/s again, its record being too old,
    and the stats and the end-of-crawl report say why."""
    assert statistics.median(first_gaps(crawler)) > 0.15  # 4/s again
    assert crawler.stats.get_value("incremental/throttle/remembered_stale") == 1
    assert crawler.stats.get_value("incremental/throttle/remembered_slots") is None
    assert any("1 slot's last rate older than 7 days (INCREMENTAL_THROTTLE_REMEMBER_FOR), "
               f"not used ({HOST})" in line
               for line in crawl_lines(crawler.stats.get_stats(), crawler))


@pytest_twisted.ensureDeferred
async def test_a_short_crawl_that_never_confirmed_the_rate_does_not_keep_it_fresh(
    site, crawl, state_store, monkeypatch
):
    await remembered(site, state_store)
    [first] = (await state_store.slot_rates("list")).rates
    real_now = clock.now

    # Three days later, a crawl of three pages: the window starts at 50/s
    # and ends without a window of healthy answers at that rate.
    monkeypatch.setattr(clock, "now", lambda: real_now() + 3 * 86400)
    short = await crawl(ListSpider, settings=POLITE,
                        urls=[site.url(f"/p/{i:04d}") for i in range(3)])
    assert short.get_extension(AdaptiveThrottle).memory.started == {HOST: 50}
    assert short.get_extension(AdaptiveThrottle).windows[HOST].unproven
    # It learned nothing: the record stays as the first crawl saved it.
    assert (await state_store.slot_rates("list")).rates == [first]
    assert short.stats.get_value("incremental/throttle/remembered_unconfirmed") == 1
    assert ("politeness: 1 slot started from the last crawl's rate (127.0.0.1 50/s); "
            "1 slot's last rate not confirmed by this crawl's answers, kept as saved, "
            "not refreshed (127.0.0.1 saved 3 d 0 h ago)") in crawl_lines(
        short.stats.get_stats(), short)

    # Eight days after the first crawl its rate is too old: the short crawl
    # did not make it look five days old.
    monkeypatch.setattr(clock, "now", lambda: real_now() + 8 * 86400)
    site.reset_log()
    later = await crawl(ListSpider, settings=POLITE,
                        urls=sample_urls(site))
    assert later.get_extension(AdaptiveThrottle).memory.started == {}
    assert_started_again_as_too_old(later)
    assert later.stats.get_value("incremental/throttle/remembered_unconfirmed") is None
    # A window that did not start from memory learned its rate: saved as today.
    [saved] = (await state_store.slot_rates("list")).rates
    assert abs(saved.saved_at - (real_now() + 8 * 86400)) < 600


@pytest_twisted.ensureDeferred
async def test_remember_for_0_starts_every_slot_at_the_start_rate(site, crawl, state_store):
    await remembered(site, state_store)
    crawler = await crawl(ListSpider, settings={**POLITE, "INCREMENTAL_THROTTLE_REMEMBER_FOR": 0},
                          urls=sample_urls(site))
    assert statistics.median(first_gaps(crawler)) > 0.15
    assert crawler.stats.get_value("incremental/throttle/remembered_slots") is None
    # Not even read: nothing is stale or damaged when nothing is remembered.
    assert crawler.stats.get_value("incremental/throttle/remembered_stale") is None


@pytest_twisted.ensureDeferred
async def test_a_per_domain_max_rate_below_the_remembered_rate_wins(site, crawl, state_store):
    await remembered(site, state_store)
    crawler = await crawl(ListSpider, settings={
        **POLITE, "INCREMENTAL_THROTTLE_DOMAINS": {HOST: {"max_rate": 5}}},
        urls=sample_urls(site))
    assert crawler.get_extension(AdaptiveThrottle).memory.started == {HOST: 5}
    assert min(first_gaps(crawler)) >= 0.8 / 5


@pytest_twisted.ensureDeferred
async def test_a_damaged_remembered_rate_is_counted_and_the_default_used(site, crawl, state_store,
                                                                  state_db):
    await remembered(site, state_store)
    state_db("UPDATE slot_rates SET rate = 'fast'")
    crawler = await crawl(ListSpider, settings=POLITE,
                          urls=sample_urls(site))
    assert crawler.stats.get_value("incremental/throttle/remembered_unreadable") == 1
    assert statistics.median(first_gaps(crawler)) > 0.15
    # This crawl's rate replaced the damaged record.
    assert state_db("SELECT typeof(rate) FROM slot_rates") == [("real",)]


@pytest_twisted.ensureDeferred
async def test_the_shared_budget_keeps_its_own_state_and_nothing_is_remembered(
    site, crawl, state_store, budget_prefix
):
    urls = site.urls(site.add_pages(3, size=800))
    shared = {**POLITE, "INCREMENTAL_THROTTLE_SHARED_URL": REDIS_URL,
              "INCREMENTAL_THROTTLE_SHARED_PREFIX": budget_prefix}
    await crawl(ListSpider, settings=shared, urls=urls)
    assert (await state_store.slot_rates("list")).rates == []
    # A rate remembered by a single-process crawl is not used either: the
    # shared window stands.
    state_store.stage_slot_rates([SlotRate("list", HOST, 50.0, True, clock.now())])
    await state_store.flush()
    crawler = await crawl(ListSpider, settings=shared, urls=urls)
    assert crawler.stats.get_value("incremental/throttle/remembered_slots") is None
    assert crawler.get_extension(AdaptiveThrottle).memory.started == {}


@pytest_twisted.ensureDeferred
async def test_a_rate_saved_by_a_clock_ahead_is_not_used(site, crawl, state_store):
    # A crawl run under `faketime +30d` (or on a machine whose clock ran
    # ahead) saves its rates 30 days in the future: their age is unknown,
    # and INCREMENTAL_THROTTLE_REMEMBER_FOR cannot bound it.
    real_now = clock.now
    await remembered(site, state_store, saved_at=real_now() + 30 * 86400)

    crawler = await crawl(ListSpider, settings=POLITE,
                          urls=sample_urls(site))
    assert crawler.get_extension(AdaptiveThrottle).memory.started == {}
    assert statistics.median(first_gaps(crawler)) > 0.15  # 4/s again
    assert crawler.stats.get_value("incremental/throttle/remembered_stale") == 1
    # This crawl's record, of the real time, replaced it.
    [stored] = (await state_store.slot_rates("list")).rates
    assert abs(stored.saved_at - real_now()) < 600


# -- a crawl that starts at 50/s ---------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_second_crawl_paces_from_the_rate_the_first_reached(site, crawl, state_store,
                                                                     caplog):
    caplog.set_level(logging.INFO, logger="incremental_crawler.politeness.remembered")
    before = await healthy_first_crawl(site, crawl)
    [stored] = (await state_store.slot_rates("list")).rates
    assert (stored.slot, stored.rate, stored.slow_start, stored.ended) == (HOST, 50, True, "")

    # All the pages again: a window of healthy answers at 50/s confirms the rate.
    crawler = await crawl(ListSpider, settings=POLITE, urls=[site.url(f"/p/{i:04d}")
                                                             for i in range(PAGES)])
    after = first_delays(crawler)
    assert "1 slot starts from the last crawl's rate: 127.0.0.1 50/s" in caplog.text
    # The first crawl's first requests left at 12.5/s (0.08 s apart: load
    # only widens those gaps), the second's were meant to leave at 50/s (a
    # slot delay of 0.02 s).
    assert statistics.median(before) > 0.07
    assert statistics.median(after) < 0.04
    assert crawler.stats.get_value("incremental/throttle/remembered_slots") == 1
    assert crawler.get_extension(AdaptiveThrottle).memory.started == {HOST: 50}
    assert "politeness: 1 slot started from the last crawl's rate (127.0.0.1 50/s)" in crawl_lines(
        crawler.stats.get_stats(), crawler)


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_the_redis_store_remembers_too(site, crawl, state_store):
    await healthy_first_crawl(site, crawl)
    # In a task of its own: the Redis client's timeouts want one.
    [stored] = (await deferred_from_coro(state_store.slot_rates("list"))).rates
    assert (stored.slot, stored.rate, stored.slow_start) == (HOST, 50, True)
    crawler = await crawl(ListSpider, settings=POLITE,
                          urls=sample_urls(site))
    assert crawler.get_extension(AdaptiveThrottle).memory.started == {HOST: 50}
    assert statistics.median(first_delays(crawler)) < 0.1
