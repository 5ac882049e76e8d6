"""Politeness on real crawls: AIMD windows, Retry-After, Crawl-delay, parking."""

from __future__ import annotations

import time
from email.utils import formatdate
from typing import TYPE_CHECKING

import pytest
import pytest_twisted

from incremental_crawler.politeness.extension import AdaptiveThrottle
from incremental_crawler.politeness.retry_after import parse_retry_after
from tests.redis_util import BUDGET_REDIS_URI as REDIS_URL
from tests.send_log import kept_apart, sent_inside_a_wait
from tests.site import LoopbackSite
from tests.spiders import ListSpider

if TYPE_CHECKING:
    from tests.site.server import RequestRecord

POLITE = {"INCREMENTAL_THROTTLE_ENABLED": True, "CONCURRENT_REQUESTS": 16,
          "CONCURRENT_REQUESTS_PER_DOMAIN": 16, "INCREMENTAL_THROTTLE_MAX_RATE": 100}


#: The downloader that records when each request left and each answer came.
SEND_LOG = "tests.send_log.SendLogDownloader"


def under(site, *prefixes: str) -> list[RequestRecord]:
    """What the site was asked under the path *prefixes*."""
    return [r for r in site.log if r.path.startswith(prefixes)]


@pytest_twisted.ensureDeferred
async def test_in_flight_never_exceeds_the_window(site, crawl):
    paths = site.add_pages(24, size=800)
    site.slow("/p/", 0.15)
    await crawl(ListSpider, settings={**POLITE, "INCREMENTAL_THROTTLE_MAX_CONCURRENCY": 3,
                                      "INCREMENTAL_THROTTLE_START_RATE": 50},
                urls=[site.url(p) for p in paths])
    assert max(site.max_in_flight.values()) <= 3
    assert len([r for r in site.log if r.path.startswith("/p/")]) == 24


@pytest_twisted.ensureDeferred
async def test_a_healthy_domain_keeps_its_pace_beside_a_throttled_one(site, crawl):
    # Each 429 freezes the limited site's slot for a whole second (Retry-After
    # has no fraction), so it is the crawl's length: 5 pages, about 2 s. A
    # window starting at 20/s overshoots 5/s in its first requests.
    limited = site.add_pages(5, size=800)
    site.limit(rate=5, burst=2)
    healthy_site = LoopbackSite(host="127.0.0.1")
    healthy_site.start()
    try:
        healthy = healthy_site.add_pages(30, size=800)
        healthy_urls = [healthy_site.url(p).replace("127.0.0.1", "localhost") for p in healthy]
        crawler = await crawl(ListSpider, settings={**POLITE, "INCREMENTAL_THROTTLE_DEBUG": True,
                                                    "INCREMENTAL_THROTTLE_START_RATE": 20},
                              urls=[site.url(p) for p in limited] + healthy_urls)
    finally:
        await healthy_site.stop()
    throttle = crawler.get_extension(AdaptiveThrottle)
    slow, fast = throttle.windows["127.0.0.1"], throttle.windows["localhost"]
    assert slow.status_429 > 0 and slow.frozen_seconds > 0
    assert fast.status_429 == 0 and fast.frozen_seconds == 0 and fast.hard == 0
    assert fast.rate > slow.rate
    assert {r.path for r in healthy_site.log if r.status == 200} >= set(healthy)


@pytest_twisted.ensureDeferred
async def test_a_retry_after_over_the_maximum_parks_the_domain(site, crawl):
    paths = site.add_pages(10, size=800)
    site.override("/p/0000", status=429, headers={"Retry-After": "86400"})
    crawler = await crawl(ListSpider, settings={**POLITE, "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
                                                "INCREMENTAL_THROTTLE_START_RATE": 50,
                                                "RETRY_ENABLED": False},
                          urls=[site.url(p) for p in paths])
    stats = crawler.stats
    assert stats.get_value("incremental/throttle/parked_domains") == 1
    assert stats.get_value("incremental/throttle/127.0.0.1/parked") is True
    # Nothing was asked again early; requests after the park were dropped.
    assert len([r for r in site.log if r.path == "/p/0000"]) == 1
    assert stats.get_value("incremental/throttle/parked_requests", 0) + len(
        [r for r in site.log if r.path.startswith("/p/")]) == 10


@pytest_twisted.ensureDeferred
async def test_robots_crawl_delay_is_a_floor_and_a_huge_one_is_capped(site, crawl):
    paths = site.add_pages(5, size=800)
    site.robots_txt = "User-agent: *\nCrawl-delay: 0.2\nAllow: /\n"
    crawler = await crawl(ListSpider, settings={**POLITE, "INCREMENTAL_THROTTLE_START_RATE": 50,
                                                "DOWNLOADER": SEND_LOG},
                          urls=[site.url(p) for p in paths])
    assert kept_apart(under(site, "/p/"), crawler.engine.downloader, 0.2) == []

    site.reset_log()
    site.robots_txt = "User-agent: *\nCrawl-delay: 1e9\nAllow: /\n"
    crawler = await crawl(ListSpider, settings={**POLITE, "INCREMENTAL_THROTTLE_START_RATE": 50,
                                                "INCREMENTAL_THROTTLE_CRAWL_DELAY_MAX": 0.1,
                                                "DOWNLOADER": SEND_LOG},
                          urls=[site.url(p) for p in paths])
    assert crawler.stats.get_value("incremental/throttle/crawl_delay_capped") == 1
    assert kept_apart(under(site, "/p/"), crawler.engine.downloader, 0.1) == []
    assert len([r for r in site.log if r.path.startswith("/p/")]) == 5


def test_retry_after_values():
    # RFC 9110 §10.2.3: delay-seconds (a non-negative integer) or an HTTP-date.
    assert parse_retry_after("120") == 120
    assert parse_retry_after("abc") is None
    assert parse_retry_after("-5") is None
    assert parse_retry_after("1e12") is None
    assert parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now=784111700) == 77
    # "Retry now" is valid: "0", a date long past, a date a few seconds past
    # (the server's clock a little behind) or exactly now are all 0, not None.
    assert parse_retry_after("0") == 0
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT") == 0
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now=784111780) == 0
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now=784111777) == 0
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now=784111779) == 0


@pytest_twisted.ensureDeferred
async def test_hanging_responses_shrink_the_window(site, crawl):
    paths = site.add_pages(4, size=800, prefix="/hang/")
    site.slow("/hang/", 3.0)
    crawler = await crawl(ListSpider, settings={**POLITE, "DOWNLOAD_TIMEOUT": 0.3,
                                                "RETRY_ENABLED": False,
                                                "INCREMENTAL_THROTTLE_START_RATE": 8},
                          urls=[site.url(p) for p in paths])
    window = crawler.get_extension(AdaptiveThrottle).windows["127.0.0.1"]
    assert window.timeouts == 4
    assert window.rate < 8
    assert crawler.stats.get_value("incremental/throttle/127.0.0.1/share_timeout") > 0


@pytest_twisted.ensureDeferred
async def test_the_users_download_delay_and_per_domain_concurrency_bound_the_window(site, crawl):
    paths = site.add_pages(6, size=800)
    crawler = await crawl(ListSpider, settings={
        **POLITE, "DOWNLOAD_DELAY": 0.25, "DOWNLOAD_DELAY_JITTER": 0,
        "INCREMENTAL_THROTTLE_START_RATE": 40, "DOWNLOADER": SEND_LOG},
        urls=[site.url(p) for p in paths])
    assert kept_apart(under(site, "/p/"), crawler.engine.downloader, 0.25) == []
    site.reset_log()
    # The first crawl's peak goes too: its delay spaces sends, not answers,
    # and a loaded machine's slow answers overlap (3 in flight once).
    site.max_in_flight.clear()
    # More pages than the window would have in flight at once without the bound.
    slow = site.add_pages(6, size=800, prefix="/slow/")
    site.slow("/slow/", 0.3)
    await crawl(ListSpider, settings={**POLITE, "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
                                      "INCREMENTAL_THROTTLE_START_RATE": 40},
                urls=[site.url(p) for p in slow])
    assert max(site.max_in_flight.values()) <= 2


@pytest_twisted.ensureDeferred
async def test_crawl_delay_applies_to_a_host_group(site, crawl):
    paths = site.add_pages(5, size=800)
    site.robots_txt = "User-agent: *\nCrawl-delay: 0.2\nAllow: /\n"
    crawler = await crawl(ListSpider, settings={
        **POLITE, "INCREMENTAL_THROTTLE_START_RATE": 40,
        "INCREMENTAL_THROTTLE_HOST_GROUPS": {"grp": ["127.0.0.1"]}, "DOWNLOADER": SEND_LOG},
        urls=[site.url(p) for p in paths])
    assert kept_apart(under(site, "/p/"), crawler.engine.downloader, 0.2) == []


@pytest_twisted.ensureDeferred
async def test_a_retry_after_date_is_read_against_the_servers_clock(site, crawl):
    site.add_page("/a", "strong", size=500)
    server_now = time.time() - 60  # the server's clock is a minute behind ours
    site.override("/a", status=503, headers={
        "Date": formatdate(server_now, usegmt=True),
        "Retry-After": formatdate(server_now + 1, usegmt=True)})
    crawler = await crawl(ListSpider, settings={**POLITE, "INCREMENTAL_THROTTLE_START_RATE": 50,
                                                "INCREMENTAL_THROTTLE_MAX_RETRIES": 1,
                                                "RETRY_ENABLED": False, "DOWNLOADER": SEND_LOG},
                          urls=[site.url("/a")])
    downloader = crawler.engine.downloader
    first, retry = (downloader.send_of(r) for r in under(site, "/a"))
    # One second after the server's Date (read against our clock: long past, at once).
    assert retry.lastseen - first.answered >= 0.9


@pytest.mark.parametrize(("dont_retry", "sent", "ours", "retry_middlewares"),
                         [(True, 1, None, None), (False, 3, 1, 1)])
@pytest_twisted.ensureDeferred
async def test_dont_retry_is_honoured_and_the_slot_is_frozen_all_the_same(
    site, crawl, dont_retry, sent, ours, retry_middlewares
):
    site.add_page("/a", "strong", size=500)
    site.override("/a", status=429, headers={"Retry-After": "1"})
    crawler = await crawl(ListSpider, settings={**POLITE, "INCREMENTAL_THROTTLE_START_RATE": 50,
                                                "INCREMENTAL_THROTTLE_MAX_RETRIES": 1,
                                                "RETRY_ENABLED": True, "RETRY_TIMES": 1},
                          urls=[site.url("/a")], meta={"dont_retry": dont_retry})
    # With dont_retry the 429 went out once and neither we (after the
    # Retry-After) nor RetryMiddleware asked again; without it we retried
    # once (INCREMENTAL_THROTTLE_MAX_RETRIES), then RetryMiddleware once
    # (RETRY_TIMES: our retry did not spend it).
    assert [r.status for r in site.log if r.path == "/a"] == [429] * sent
    stats = crawler.stats
    assert stats.get_value("incremental/throttle/retried/429") == ours
    assert stats.get_value("retry/count") == retry_middlewares
    # Every 429 froze the slot, dont_retry or not (RFC 6585 §4).
    assert stats.get_value("incremental/retry_after_waits") == sent
    assert stats.get_value("incremental/throttle/127.0.0.1/frozen_seconds") >= 1.0


@pytest.mark.parametrize("shared", [False, True])
@pytest_twisted.ensureDeferred
async def test_a_redirect_to_another_host_is_paced_by_that_hosts_budget(site, crawl, shared,
                                                                         request):
    # Scrapy copies the source's download_slot into a redirect: the pages
    # of "localhost" reached through redirects went in 127.0.0.1's slot (and
    # shared budget), beside its own pages in its own, twice its
    # Crawl-delay; and its Crawl-delay was applied to 127.0.0.1.
    other = LoopbackSite(host="127.0.0.1")
    other.start()
    try:
        other.robots_txt = "User-agent: *\nCrawl-delay: 0.2\nAllow: /\n"
        urls = []
        for i in range(4):
            other.add_page(f"/p/{i}", "strong", size=500)
            other.add_page(f"/q/{i}", "strong", size=500)
            site.add_page(f"/r/{i}", "strong", size=500)
            site.add_redirect(f"/r/{i}", other.url(f"/p/{i}").replace("127.0.0.1", "localhost"))
            urls += [site.url(f"/r/{i}"), other.url(f"/q/{i}").replace("127.0.0.1", "localhost")]
        settings = {**POLITE, "INCREMENTAL_THROTTLE_START_RATE": 40, "DOWNLOADER": SEND_LOG}
        if shared:
            prefix = request.getfixturevalue("budget_prefix")
            settings |= {"INCREMENTAL_THROTTLE_SHARED_URL": REDIS_URL,
                         "INCREMENTAL_THROTTLE_SHARED_PREFIX": prefix}
        crawler = await crawl(ListSpider, settings=settings, urls=urls)
    finally:
        await other.stop()
    paced = under(other, "/p/", "/q/")
    assert len(paced) == 8
    assert kept_apart(paced, crawler.engine.downloader, 0.2) == []
    windows = crawler.get_extension(AdaptiveThrottle).windows
    assert windows["localhost"].delay_floor == 0.2
    assert windows["127.0.0.1"].delay_floor == 0


# -- after a 429: what the server refused, what the crawler sent and when ----------
# The gaps a crawl keeps, the waits it honours and what it sends after a
# close are checked on the crawler's side (tests/send_log.py) or as an
# order, which hold at any load.


@pytest.mark.parametrize("retry_after", ["seconds", "date"])
@pytest_twisted.ensureDeferred
async def test_a_rate_limited_site_gets_every_page_and_no_request_inside_retry_after(
    site, crawl, retry_after
):
    paths = site.add_pages(30, size=800)
    # A budget a loaded machine's crawl still exceeds (at 20/s, a suite run
    # beside other work once sent too slowly to meet a single 429).
    site.limit(rate=10, burst=3, retry_after=retry_after)
    # Start above the site's budget: the window must find it. Each 429 holds
    # the crawl a second or two (Retry-After has no fraction): halving the
    # window at each (0.7 by default) finds the budget in two cuts, not four.
    crawler = await crawl(ListSpider, settings={
        **POLITE, "INCREMENTAL_THROTTLE_START_RATE": 30, "INCREMENTAL_THROTTLE_MAX_RATE": 100,
        "INCREMENTAL_THROTTLE_DOMAINS": {"127.0.0.1": {"decrease": 0.5}},
        "DOWNLOADER": SEND_LOG}, urls=[site.url(p) for p in paths])
    fetched = {r.path for r in site.log if r.status == 200}
    assert set(paths) <= fetched
    # Every Retry-After was honoured: no request that left after the crawler
    # read a 429 arrived inside the wait it asked for. (Those already on
    # their way may arrive there, however late a loaded machine reads them.)
    assert sent_inside_a_wait(site.log, crawler.engine.downloader) == []
    statuses = [r.status for r in site.log]
    assert 0 < statuses.count(429) <= 0.15 * len(statuses)
    assert crawler.stats.get_value("incremental/retry_after_waits") == statuses.count(429)
    # 429s were retried by us, not by RetryMiddleware's budget.
    assert crawler.stats.get_value("retry/count") is None


@pytest.mark.parametrize("behind", [30 * 365 * 86400, 2], ids=["long-past", "seconds-past"])
@pytest_twisted.ensureDeferred
async def test_a_retry_after_date_in_the_past_retries_now(site, crawl, behind):
    # RFC 9110 §10.2.3: a past HTTP-date is a valid Retry-After saying
    # "retry now", a few seconds past (clock skew) too. It used to count as
    # invalid and wait a random backoff of 0.5 to 1.5 s.
    site.add_page("/a", "strong", size=500)
    site.override("/a", status=429,
                  headers={"Retry-After": formatdate(time.time() - behind, usegmt=True)})
    crawler = await crawl(ListSpider, settings={**POLITE, "INCREMENTAL_THROTTLE_START_RATE": 50,
                                                "INCREMENTAL_THROTTLE_MAX_RETRIES": 1,
                                                "RETRY_ENABLED": False, "DOWNLOADER": SEND_LOG},
                          urls=[site.url("/a")])
    assert [r.status for r in site.log if r.path == "/a"] == [429, 429]
    # The retry was held by the slot's delay alone (1/rate after the cut:
    # 0.04 s here), far below the smallest backoff (0.5 s); no freeze and no
    # backoff held it (the stats below): the earliest moment the slot would
    # let it go, as its release began, was within 0.3 s of the 429 being
    # read: what the crawler meant, at any load.
    first, retry = (crawler.engine.downloader.send_of(r) for r in under(site, "/a"))
    assert first.answered is not None and retry.left > first.answered
    assert retry.due - first.answered < 0.3
    stats = crawler.stats
    assert stats.get_value("incremental/throttle/retry_after_now") == 2
    assert stats.get_value("incremental/throttle/retried/429") == 1
    assert stats.get_value("incremental/throttle/retry_after_invalid") is None
    assert stats.get_value("incremental/throttle/backoffs") is None
    assert stats.get_value("incremental/retry_after_waits") is None
    assert stats.get_value("incremental/throttle/127.0.0.1/frozen_seconds", 0) == 0


@pytest_twisted.ensureDeferred
async def test_closing_while_frozen_drops_the_queued_requests(site, crawl):
    # The same without the shared budget: the requests wait in the frozen
    # Scrapy slot's queue.
    paths = site.add_pages(10, size=800)
    site.override("/p/0000", status=429, headers={"Retry-After": "20"})
    crawler = await crawl(ListSpider, settings={**POLITE, "INCREMENTAL_THROTTLE_START_RATE": 2,
                                                "CLOSESPIDER_TIMEOUT": 2, "DOWNLOADER": SEND_LOG},
                          urls=[site.url(p) for p in paths])
    closed = time.monotonic()
    assert crawler.stats.get_value("finish_reason") == "closespider_timeout"
    downloader = crawler.engine.downloader
    refusal = downloader.send_of(next(r for r in site.log if r.path == "/p/0000"))
    assert refusal.status == 429 and refusal.answered is not None
    # Nothing left the crawler after it read the 429 (those that had left
    # before were on their way: 2/s leaves none on a quiet machine)...
    assert [s.url for s in downloader.sends if s.left > refusal.answered] == []
    # ... and the crawl closed inside the freeze, not after waiting it out.
    assert closed < refusal.answered + 20
    assert crawler.stats.get_value("incremental/throttle/dropped_at_close", 0) >= 1
