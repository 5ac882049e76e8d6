"""Pages not due for their revisit: dropped as the spider yields them, and accounted for.

Real crawls of spiders that know nothing of the add-on (a ``scrapy.Spider``
following links, a ``CrawlSpider``) and of our ``sitemap`` spider. The
first crawl stores every page with its first revisit a day later; the
second runs a minute later, when no stored page is due. The server's log
says what was asked; the stats and the end-of-crawl report say why the
rest was not.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted

from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from tests.clock_util import DAY, later
from tests.follow_spider import FollowSpider
from tests.links import nav_depths, nav_links
from tests.site import PLAIN_KINDS
from tests.test_replay import REVISITS, RulesSpider, make_listings, make_pages

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy.http import Response
    from twisted.python.failure import Failure

MINUTE = 60 / DAY
NO_REPLAY = {**REVISITS, "INCREMENTAL_REPLAY_ENABLED": False}


class ErrbackFollowSpider(FollowSpider):
    """The follow spider, with an errback on every link it follows."""

    name = "follow_errback"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.failures: list[Failure] = []

    def parse(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "title": response.css("title::text").get()}
        for href in response.css("nav a::attr(href)").getall():
            yield response.follow(href, callback=self.parse, errback=self.failed)

    def failed(self, failure: Failure) -> None:
        self.failures.append(failure)


class MetaCopyingFollowSpider(FollowSpider):
    """The follow spider, passing each response's meta on to its links (a
    common way to carry data from page to page)."""

    name = "follow_meta"

    def parse(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "title": response.css("title::text").get()}
        for href in response.css("nav a::attr(href)").getall():
            yield response.follow(href, callback=self.parse, meta=dict(response.meta))


def a_minute_later_without(site: Any, state_db: Any, monkeypatch: Any, url: str) -> None:
    """Forget the start page (fetched as new next time, its callback yields
    its links again) and move the next crawl a minute on."""
    state_db("DELETE FROM pages WHERE url = ?", url)
    site.reset_log()
    later(monkeypatch, MINUTE)


def pages_asked(site: Any) -> list[tuple[str, int]]:
    return sorted((r.path, r.status) for r in site.log if r.path != "/robots.txt")


def report_text(caplog: Any) -> str:
    [report] = [m for r in caplog.records if (m := r.getMessage()).startswith("Incremental report")]
    return report


def utc(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))


@pytest_twisted.ensureDeferred
async def test_not_due_links_are_dropped_before_the_scheduler(site, crawl, state_db,
                                                             monkeypatch, caplog):
    paths = make_pages(site, 12)
    start = paths[0]
    before = time.time()
    await crawl(ErrbackFollowSpider, settings=NO_REPLAY, start_url=site.url(start))
    after = time.time()
    # The start page is forgotten: fetched as new, its callback yields its
    # links again, and none of them is due.
    a_minute_later_without(site, state_db, monkeypatch, site.url(start))
    caplog.clear()
    with caplog.at_level(logging.INFO):
        second = await crawl(ErrbackFollowSpider, settings=NO_REPLAY, start_url=site.url(start))
    assert pages_asked(site) == [(start, 200)]
    stats = second.stats
    assert stats.get_value("downloader/exception_count") is None
    assert stats.get_value("incremental/not_due") is None  # none reached the downloader
    dropped = sorted(set(nav_links(site, start)) - {start})
    assert dropped
    # The links dropped, and the known pages nothing linked this crawl
    # (counted by the re-seeder): every known page but the start.
    others = [p for p in paths if p != start]
    assert stats.get_value("incremental/schedule/not_due") == len(others)
    assert stats.get_value("incremental/schedule/requested/new") == 1
    assert second.spider.failures == []
    # The first of them falls due a day (the first interval) after crawl 1.
    placeholders = ",".join("?" * len(others))
    [(first_due, size)] = state_db(
        f"SELECT MIN(next_visit), SUM(size) FROM pages WHERE url IN ({placeholders})",
        *(site.url(p) for p in others))
    assert stats.get_value("incremental/schedule/first_due") == first_due
    assert int(before + DAY) <= first_due <= after + DAY  # stored to the second
    assert stats.get_value("incremental/schedule/bytes_skipped") == size

    # The report accounts for them, and counts them in the share of a full
    # re-crawl at their stored size: a page of 12 downloaded is a small share.
    report = report_text(caplog)
    assert (f"known pages: requested 1 (new 1), not due {len(others)} "
            f"(the first falls due {utc(first_due)})") in report
    downloaded = stats.get_value("downloader/response_bytes")
    share = 100 * downloaded / (downloaded + size)
    assert share < 30
    assert (f"bytes downloaded {downloaded:,}, saved ~0 by 304s and ~{size:,} by pages not "
            f"requested: downloaded {share:.1f}% of a full re-crawl, "
            f"saved {100 - share:.1f}%") in report
    assert "requested nothing" not in report


@pytest_twisted.ensureDeferred
async def test_without_the_filter_the_errback_meets_not_due(site, crawl, state_db, monkeypatch):
    # The same second crawl with the filter switched off: the downloader
    # middleware's NotDue is the fallback, counted the same way.
    paths = make_pages(site, 12)
    start = paths[0]
    await crawl(ErrbackFollowSpider, settings=NO_REPLAY, start_url=site.url(start))
    a_minute_later_without(site, state_db, monkeypatch, site.url(start))
    unfiltered = {**NO_REPLAY, "SPIDER_MIDDLEWARES": {
        "incremental_crawler.crawl.due_filter.NotDueFilterMiddleware": None}}
    second = await crawl(ErrbackFollowSpider, settings=unfiltered, start_url=site.url(start))
    assert pages_asked(site) == [(start, 200)]
    dropped = set(nav_links(site, start)) - {start}
    stats = second.stats
    assert stats.get_value("incremental/not_due") == len(dropped)
    # The links dropped, and the other known pages (counted by the re-seeder).
    assert stats.get_value("incremental/schedule/not_due") == len(paths) - 1
    assert len(second.spider.failures) == len(dropped)


@pytest.mark.parametrize("shortcuts", [False, True])
@pytest_twisted.ensureDeferred
async def test_with_replay_every_page_is_reached_and_nothing_requested(site, crawl, state_db,
                                                                      monkeypatch, caplog,
                                                                      shortcuts):
    paths = make_pages(site, 12)
    assert sorted(nav_depths(site, paths[0])) == paths
    await crawl(FollowSpider, settings=REVISITS, start_url=site.url(paths[0]))
    site.reset_log()
    later(monkeypatch, MINUTE)
    caplog.clear()
    settings = {**REVISITS, "INCREMENTAL_REPLAY_SHORTCUTS": shortcuts}
    with caplog.at_level(logging.INFO):
        second = await crawl(FollowSpider, settings=settings, start_url=site.url(paths[0]))
    assert pages_asked(site) == []
    stats = second.stats
    with_links = [p for p in paths if nav_links(site, p)]
    if shortcuts:
        # The store shows nothing the start page leads to is due or new: no
        # page is replayed, every one is found inert from the store alone.
        assert stats.get_value("incremental/replay/pages") is None
        assert stats.get_value("incremental/replay/walk/inert_pages") == len(paths)
    else:
        # Every page's links were yielded again: not-due pages with links go
        # through the filter to be replayed.
        assert stats.get_value("incremental/replay/pages") == len(with_links)
    assert stats.get_value("incremental/schedule/not_due") == len(paths)
    assert stats.get_value("downloader/exception_count") is None
    [(first_due,)] = state_db("SELECT MIN(next_visit) FROM pages")
    report = report_text(caplog)
    why = f"{len(paths)} not due (the first falls due {utc(first_due)})"
    assert f"known pages: requested 0, not due {len(paths)} (the first" in report
    assert (f"requested nothing: {why}; to check every known page now: "
            "-s INCREMENTAL_RECHECK_ALL=True (or -a recheck=all on the sitemap and feed "
            "spiders)") in report


@pytest_twisted.ensureDeferred
async def test_a_crawl_spider_s_not_due_rules_requests_are_dropped(site, crawl, state_db,
                                                                  monkeypatch):
    make_listings(site)
    await crawl(RulesSpider, settings=NO_REPLAY, start=site.url("/list/0"))
    a_minute_later_without(site, state_db, monkeypatch, site.url("/list/0"))
    second = await crawl(RulesSpider, settings=NO_REPLAY, start=site.url("/list/0"))
    assert pages_asked(site) == [("/list/0", 200)]
    stats = second.stats
    assert stats.get_value("downloader/exception_count") is None
    # Every known page but the start: /list/1, /item/0 and /item/1 dropped,
    # the others counted by the re-seeder.
    [(known,)] = state_db("SELECT COUNT(*) FROM pages WHERE url != ?", site.url("/list/0"))
    assert stats.get_value("incremental/schedule/not_due") == known


@pytest_twisted.ensureDeferred
async def test_the_sitemap_spider_s_not_due_pages_are_dropped(site, crawl, monkeypatch):
    paths = site.add_pages(40, kinds=PLAIN_KINDS)
    await crawl(SitemapPagesSpider, settings=REVISITS, sitemap_url=site.url("/robots.txt"))
    site.change_fraction(0.05, seed=3)  # so the sitemaps are read again
    site.reset_log()
    later(monkeypatch, MINUTE)
    second = await crawl(SitemapPagesSpider, settings=REVISITS,
                         sitemap_url=site.url("/robots.txt"), use_lastmod="false")
    assert [p for p, _ in pages_asked(site) if p.startswith("/p/")] == []
    stats = second.stats
    assert stats.get_value("downloader/exception_count") is None
    assert stats.get_value("incremental/schedule/not_due") == len(paths)


@pytest_twisted.ensureDeferred
async def test_meta_copied_from_a_decided_request_does_not_make_another_page_due(
    site, crawl, state_db, monkeypatch
):
    # The start page's request was decided (new) and marked so; its links,
    # carrying a copy of its meta, are other pages: each is decided on its
    # own state, so the ones not due are still dropped.
    paths = make_pages(site, 12)
    start = paths[0]
    await crawl(MetaCopyingFollowSpider, settings=NO_REPLAY, start_url=site.url(start))
    a_minute_later_without(site, state_db, monkeypatch, site.url(start))
    second = await crawl(MetaCopyingFollowSpider, settings=NO_REPLAY,
                         start_url=site.url(start))
    assert pages_asked(site) == [(start, 200)]
    # The links dropped, and the other known pages (counted by the re-seeder).
    assert second.stats.get_value("incremental/schedule/not_due") == len(paths) - 1


@pytest_twisted.ensureDeferred
async def test_meta_copied_from_a_redirected_response_does_not_make_links_due(
    site, crawl, state_db, monkeypatch
):
    # The start URL redirects to the start page: the response's meta has
    # the redirect's history, and the links copy it along with the why.
    paths = make_pages(site, 12)
    start = paths[0]
    site.add_redirect("/entry", start)
    await crawl(MetaCopyingFollowSpider, settings=NO_REPLAY, start_url=site.url("/entry"))
    a_minute_later_without(site, state_db, monkeypatch, site.url(start))
    second = await crawl(MetaCopyingFollowSpider, settings=NO_REPLAY,
                         start_url=site.url("/entry"))
    assert [path for path, _ in pages_asked(site)] == ["/entry", start]
    # The links dropped, and the other known pages (counted by the re-seeder).
    assert second.stats.get_value("incremental/schedule/not_due") == len(paths) - 1
