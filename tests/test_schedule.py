"""Which known pages a crawl requests, on real crawls days apart.

The clock of the crawls (``incremental_crawler.clock.now``) is moved; the
site keeps its own. What the server saw decides: which pages were
requested, with which conditions.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted

from incremental_crawler import clock
from incremental_crawler.spiders.feed import FeedPagesSpider
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from incremental_crawler.state.records import PageFlags
from tests.site import VALIDATED_KINDS
from tests.spiders import ListSpider
from tests.test_lastmod import urlset

if TYPE_CHECKING:
    from collections.abc import Callable

DAY = 86400.0
#: Revisits as in production: a new page is due again a day later.
REVISITS: dict[str, Any] = {"INCREMENTAL_REVISIT_ENABLED": True}


def at(monkeypatch: pytest.MonkeyPatch, now: Callable[[], float]) -> None:
    monkeypatch.setattr(clock, "now", now)


def later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The next crawls run *seconds* from now (the site's clock stays)."""
    at(monkeypatch, lambda: time.time() + seconds)


def page_requests(site, prefix: str = "/p/") -> list[str]:
    return sorted(r.path for r in site.log if r.path.startswith(prefix))


@pytest_twisted.ensureDeferred
async def test_honest_lastmods_two_days_later_request_only_the_changed_pages_and_the_sample(
    site, crawl, monkeypatch
):
    n = 40
    site.add_pages(n, kinds=VALIDATED_KINDS)
    sitemap = site.url("/robots.txt")  # an index of two sitemaps
    await crawl(SitemapPagesSpider, settings=REVISITS, sitemap_url=sitemap)
    changed = site.change_fraction(0.05, seed=3)
    later(monkeypatch, 2 * DAY)  # every revisit is due: the lastmods decide
    site.reset_log()
    second = await crawl(SitemapPagesSpider, settings=REVISITS, sitemap_url=sitemap)

    stats = second.stats
    # One sampled page per sitemap (1% of 18 or 20 skipped, at least one).
    sampled = [r for r in site.log if r.path.startswith("/p/") and r.path not in changed]
    assert len(sampled) == 2
    assert all(r.status == 304 and (r.if_none_match or r.if_modified_since) for r in sampled)
    assert page_requests(site) == sorted([*changed, *(r.path for r in sampled)])
    assert sorted(i["url"] for i in second.collected) == [site.url(p) for p in changed]
    assert stats.get_value("incremental/schedule/requested/lastmod_newer") == len(changed)
    assert stats.get_value("incremental/schedule/requested/sampled") == 2
    assert stats.get_value("incremental/schedule/skipped/lastmod_unchanged") == n - 4
    assert stats.get_value("incremental/schedule/requested/due") is None
    # The sampled pages answered 304: no finding against the host.
    assert stats.get_value("incremental/lastmod/stale") is None


@pytest_twisted.ensureDeferred
async def test_a_daily_job_finds_due_every_page_fetched_late_the_day_before(
    site, crawl, monkeypatch, state_db
):
    paths = site.add_pages(12, kinds=VALIDATED_KINDS)
    urls = [site.url(p) for p in paths]
    settings = {**REVISITS, "CONCURRENT_REQUESTS": 2}
    site.slow("/p/", 0.15)
    # Crawl 1 starts at T and its clock runs fast (a real second is two
    # hours): its last pages are fetched hours after its start.
    t0, start = time.time(), 1_900_000_000.0
    at(monkeypatch, lambda: start + (time.time() - t0) * 7200)
    await crawl(ListSpider, settings=settings, urls=urls)
    rows = state_db("SELECT last_checked, next_visit FROM pages")
    checked = [row[0] for row in rows]
    assert max(checked) - min(checked) >= 3600, "the pages were not fetched over hours"
    # Every next visit is a day after the crawl's start, not after the visit.
    assert len({row[1] for row in rows}) == 1
    first_start = rows[0][1] - DAY

    # Crawl 2 runs a day later, five minutes earlier in the day.
    at(monkeypatch, lambda: first_start + DAY - 300)
    site.reset_log()
    strict = await crawl(ListSpider, settings={**settings, "INCREMENTAL_DUE_TOLERANCE": 0},
                         urls=urls)
    # Without the tolerance nothing is due yet...
    assert page_requests(site) == []
    assert strict.stats.get_value("incremental/schedule/not_due") == len(paths)
    site.reset_log()
    second = await crawl(ListSpider, settings=settings, urls=urls)
    # ...with it, every page is, however late it was fetched.
    assert page_requests(site) == paths
    assert all(r.status == 304 for r in site.log if r.path.startswith("/p/"))
    assert second.stats.get_value("incremental/schedule/not_due") is None


@pytest_twisted.ensureDeferred
async def test_use_lastmod_false_a_minute_later_requests_no_page(site, crawl, monkeypatch,
                                                                state_db):
    n = 30
    site.add_pages(n, kinds=VALIDATED_KINDS)
    sitemap = site.url("/robots.txt")
    await crawl(SitemapPagesSpider, settings=REVISITS, sitemap_url=sitemap)
    later(monkeypatch, 60)
    site.reset_log()
    second = await crawl(SitemapPagesSpider, settings=REVISITS, sitemap_url=sitemap,
                         use_lastmod="false")
    stats = second.stats
    # The lists are read (their lastmods are not used), their pages are not due.
    assert page_requests(site) == []
    assert site.requests_for("/sitemap-1.xml") and site.requests_for("/sitemap-2.xml.gz")
    assert stats.get_value("downloader/exception_count") is None
    assert stats.get_value("incremental/schedule/not_due") == n
    [(first_due,)] = state_db("SELECT MIN(next_visit) FROM pages WHERE url LIKE '%/p/%'")
    assert stats.get_value("incremental/schedule/first_due") == first_due
    assert stats.get_value("incremental/schedule/skipped/lastmod_unchanged") is None


def fixed_sitemap(site, paths: list[str], *, etag: str | None = None,
                  undated: tuple[str, ...] = ()) -> None:
    """A sitemap whose dates never move, whatever the pages do."""
    entries = [(site.url(p), None if p in undated else "2024-01-01") for p in paths]
    site.add_document("/s.xml", urlset(entries), "application/xml", etag=etag)


async def changed_behind_fixed_dates(site, crawl, monkeypatch, *, etag: str | None = None):
    """Four pages crawled, then all changed behind dates that do not move,
    and crawled again two days later, half the skipped pages sampled (2 of
    4), the host distrusted after 2 findings: (paths, settings, sitemap URL,
    the second crawl)."""
    paths = site.add_pages(4)
    fixed_sitemap(site, paths, etag=etag)
    settings = {**REVISITS, "INCREMENTAL_LASTMOD_RECHECK_SHARE": 0.5,
                "INCREMENTAL_LASTMOD_STALE_AFTER": 2}
    sitemap = site.url("/s.xml")
    await crawl(SitemapPagesSpider, settings=settings, sitemap_url=sitemap)
    for path in paths:
        site.change(path)  # behind lastmods that do not move
    later(monkeypatch, 2 * DAY)
    site.reset_log()
    second = await crawl(SitemapPagesSpider, settings=settings, sitemap_url=sitemap)
    return paths, settings, sitemap, second


@pytest_twisted.ensureDeferred
async def test_stale_lastmods_are_found_by_the_sample_and_distrust_the_host(
    site, crawl, monkeypatch, state_db
):
    paths, settings, sitemap, second = await changed_behind_fixed_dates(
        site, crawl, monkeypatch)
    sampled = page_requests(site)
    assert len(sampled) == 2
    assert sorted(i["url"] for i in second.collected) == [site.url(p) for p in sampled]
    assert second.stats.get_value("incremental/schedule/requested/sampled") == 2
    assert second.stats.get_value("incremental/lastmod/stale") == 2
    assert second.stats.get_value("incremental/lastmod/hosts_distrusted") == 1
    [(until, stale)] = state_db("SELECT distrusted_until, stale_lastmods FROM hosts")
    # Distrusted for the TTL (7 days) from the findings, i.e. from the
    # sampled pages' checks (stored to the second).
    [(checked,)] = state_db("SELECT MAX(last_checked) FROM pages")
    assert abs(until - (checked + 7 * DAY)) <= 2 and stale == 2

    # Distrusted: the pages fall back to their revisit schedules. The two
    # found changed (due again 0.8 day after) are not due half a day later;
    # the two skipped (due a day after crawl 1) are, and are fetched.
    later(monkeypatch, 2.5 * DAY)
    site.reset_log()
    third = await crawl(SitemapPagesSpider, settings=settings, sitemap_url=sitemap)
    assert third.stats.get_value("incremental/lastmod/distrusted_sitemaps") == 1
    unsampled = sorted(set(paths) - set(sampled))
    assert page_requests(site) == unsampled
    assert sorted(i["url"] for i in third.collected) == [site.url(p) for p in unsampled]
    assert third.stats.get_value("incremental/schedule/requested/due") == 2
    assert third.stats.get_value("incremental/schedule/not_due") == 2

    # The distrust is over; the host is on probation (its findings kept):
    # unmoved dates no longer vouch, every page goes by its schedule, and
    # there is nothing to sample.
    later(monkeypatch, 2 * DAY + 8 * DAY)
    site.reset_log()
    fourth = await crawl(SitemapPagesSpider, settings=settings, sitemap_url=sitemap)
    assert fourth.stats.get_value("incremental/lastmod/distrusted_sitemaps") is None
    assert page_requests(site) == sorted(paths)
    assert fourth.stats.get_value("incremental/schedule/requested/due") == len(paths)
    assert fourth.stats.get_value("incremental/schedule/skipped/lastmod_unchanged") is None
    assert fourth.stats.get_value("incremental/schedule/requested/sampled") is None
    assert state_db("SELECT distrusted_until, stale_lastmods FROM hosts") == [(0, 2)]


@pytest_twisted.ensureDeferred
async def test_a_sitemap_answering_304_reseeds_only_what_its_lastmods_do_not_vouch_for(
    site, crawl, monkeypatch, state_db
):
    paths = site.add_pages(6)
    fixed_sitemap(site, paths, etag='"s-1"', undated=("/p/0005",))
    sitemap = site.url("/s.xml")
    await crawl(SitemapPagesSpider, settings=REVISITS, sitemap_url=sitemap)
    flags = dict(state_db("SELECT url, flags FROM pages WHERE url LIKE '%/p/%'"))
    assert [bool(flags[site.url(p)] & PageFlags.LASTMOD_MODIFIED) for p in paths] == [
        True] * 5 + [False]
    later(monkeypatch, 2 * DAY)  # every page is due by its revisit schedule
    site.reset_log()
    second = await crawl(SitemapPagesSpider, settings=REVISITS, sitemap_url=sitemap)
    assert [(r.path, r.status) for r in site.log if r.path == "/s.xml"] == [("/s.xml", 304)]
    requested = [r for r in site.log if r.path.startswith("/p/")]
    # The undated page, by its schedule, and one vouched page: the sample.
    assert len(requested) == 2 and "/p/0005" in {r.path for r in requested}
    assert all(r.status == 304 and r.if_none_match for r in requested)
    stats = second.stats
    assert stats.get_value("incremental/reseeded") == 2
    assert stats.get_value("incremental/schedule/requested/due") == 1
    assert stats.get_value("incremental/schedule/requested/sampled") == 1
    assert stats.get_value("incremental/schedule/skipped/lastmod_unchanged") == 4


@pytest_twisted.ensureDeferred
async def test_vouched_pages_skipped_move_on_by_their_interval_and_are_not_read_again(
    site, crawl, monkeypatch
):
    """A page a trusted lastmod vouches for, skipped (not sampled), moves on
    by its interval: the next crawl's re-seed does not read it again (it
    used to read past every vouched page at every crawl start)."""
    paths = site.add_pages(6)
    fixed_sitemap(site, paths, etag='"s-1"', undated=("/p/0005",))
    sitemap = site.url("/s.xml")
    await crawl(SitemapPagesSpider, settings=REVISITS, sitemap_url=sitemap)
    later(monkeypatch, 2 * DAY)
    second = await crawl(SitemapPagesSpider, settings=REVISITS, sitemap_url=sitemap)
    assert second.stats.get_value("incremental/schedule/skipped/lastmod_unchanged") == 4
    assert second.stats.get_value("incremental/reseed/postponed") == 4
    # A minute later: the four are not due (a day on), the two requested
    # were rescheduled by their visits: nothing is read past, nothing asked.
    later(monkeypatch, 2 * DAY + 60)
    site.reset_log()
    third = await crawl(SitemapPagesSpider, settings=REVISITS, sitemap_url=sitemap)
    assert page_requests(site) == []
    stats = third.stats
    assert stats.get_value("incremental/schedule/skipped/lastmod_unchanged") is None
    assert stats.get_value("incremental/reseed/postponed") is None
    assert stats.get_value("incremental/schedule/not_due") == 6
    # A day and a half on, they are due again (the sampled one too): read,
    # one sampled, the others skipped and moved on again.
    later(monkeypatch, 3 * DAY + DAY / 2)
    fourth = await crawl(SitemapPagesSpider, settings=REVISITS, sitemap_url=sitemap)
    assert fourth.stats.get_value("incremental/schedule/skipped/lastmod_unchanged") == 4
    assert fourth.stats.get_value("incremental/schedule/requested/sampled") == 1
    assert fourth.stats.get_value("incremental/reseed/postponed") == 4


@pytest_twisted.ensureDeferred
async def test_vouched_pages_of_a_host_its_sample_found_stale_stay_due(
    site, crawl, monkeypatch
):
    """The re-seeder's sample finds the host's dates stale: the vouched
    pages it skipped in that crawl are not moved on by their interval, and
    the next crawl asks them (found by a review: they waited an interval)."""
    paths, settings, sitemap, second = await changed_behind_fixed_dates(
        site, crawl, monkeypatch, etag='"s-1"')
    assert [(r.path, r.status) for r in site.log if r.path == "/s.xml"] == [("/s.xml", 304)]
    sampled = page_requests(site)
    assert len(sampled) == 2
    assert second.stats.get_value("incremental/lastmod/hosts_distrusted") == 1
    assert second.stats.get_value("incremental/reseed/postponed") is None
    # Half a day on, the two skipped (due a day after crawl 1) are asked.
    later(monkeypatch, 2.5 * DAY)
    site.reset_log()
    third = await crawl(SitemapPagesSpider, settings=settings, sitemap_url=sitemap)
    unsampled = sorted(set(paths) - set(sampled))
    assert page_requests(site) == unsampled
    assert sorted(i["url"] for i in third.collected) == [site.url(p) for p in unsampled]


def rss(site, dates: dict[str, str]) -> str:
    rows = "".join(f"<item><title>{p}</title><link>{site.url(p)}</link>"
                   f"<pubDate>{date}</pubDate></item>" for p, date in dates.items())
    return (f'<?xml version="1.0"?><rss version="2.0"><channel><title>t</title>{rows}'
            "</channel></rss>")


def atom(site, dates: dict[str, str]) -> str:
    rows = "".join(f'<entry><title>{p}</title><link rel="alternate" href="{site.url(p)}"/>'
                   f"<updated>{date}</updated></entry>" for p, date in dates.items())
    return ('<?xml version="1.0"?><feed xmlns="http://www.w3.org/2005/Atom"><title>t</title>'
            f"{rows}</feed>")


@pytest.mark.parametrize(("kind", "requested"), [("rss", True), ("atom", False)])
@pytest_twisted.ensureDeferred
async def test_an_unmoved_feed_date_vouches_only_when_it_is_a_modification_date(
    site, crawl, monkeypatch, kind, requested
):
    paths = site.add_pages(3)
    dates = dict.fromkeys(paths, "Mon, 01 Jan 2024 10:00:00 GMT" if kind == "rss"
                          else "2024-01-01T10:00:00Z")
    site.add_document("/feed", (rss if kind == "rss" else atom)(site, dates),
                      "application/xml")
    settings = {**REVISITS, "INCREMENTAL_LASTMOD_RECHECK_SHARE": 0}
    await crawl(FeedPagesSpider, settings=settings, feed_url=site.url("/feed"))
    later(monkeypatch, 2 * DAY)  # every revisit is due
    site.reset_log()
    second = await crawl(FeedPagesSpider, settings=settings, feed_url=site.url("/feed"))
    stats = second.stats
    if requested:
        # A pubDate says when the item was published: the revisit decides.
        assert page_requests(site) == paths
        assert all(r.status == 304 for r in site.log if r.path.startswith("/p/"))
        assert stats.get_value("incremental/schedule/requested/due") == 3
    else:
        # An Atom <updated> that did not move vouches for our copy.
        assert page_requests(site) == []
        assert stats.get_value("incremental/schedule/skipped/lastmod_unchanged") == 3


@pytest_twisted.ensureDeferred
async def test_recheck_all_requests_every_known_page_with_its_conditions(
    site, crawl, monkeypatch
):
    paths = site.add_pages(10, kinds=("strong", "lastmod"))
    sitemap = site.url("/robots.txt")
    await crawl(SitemapPagesSpider, settings=REVISITS, sitemap_url=sitemap)
    later(monkeypatch, 60)  # nothing is due, no lastmod moved
    site.reset_log()
    second = await crawl(SitemapPagesSpider, settings=REVISITS, sitemap_url=sitemap,
                         recheck="all")
    assert page_requests(site) == paths
    pages = [r for r in site.log if r.path.startswith("/p/")]
    assert all(r.status == 304 for r in pages)
    assert all(r.if_none_match or r.if_modified_since for r in pages)
    assert second.stats.get_value("incremental/schedule/requested/recheck") == len(paths)


class EtagSitemapSite:
    """Pages listed by one sitemap served with an ETag (a 304 when unchanged),
    crawled by the sitemap spider with the clock *offset* seconds ahead."""

    def __init__(self, site: Any, crawl: Any, monkeypatch: pytest.MonkeyPatch,
                 paths: list[str], lastmod: str | None, settings: dict[str, Any]) -> None:
        for path in paths:
            site.add_page(path, "strong", size=1500)
        site.add_document("/sitemap.xml", urlset([(site.url(p), lastmod) for p in paths]),
                          "application/xml", etag='"sm-1"')
        self.site, self.crawl, self.monkeypatch = site, crawl, monkeypatch
        self.settings = settings

    async def run(self, offset: float) -> Any:
        from tests.test_failures import at as shift

        self.site.reset_log()
        shift(self.monkeypatch, offset)
        return await self.crawl(SitemapPagesSpider, settings=self.settings,
                                sitemap_url=self.site.url("/sitemap.xml"))


@pytest_twisted.ensureDeferred
async def test_a_page_fetched_through_the_reseeder_keeps_its_lastmod_vouching(
    site, crawl, state_uri, monkeypatch
):
    # Every page changed behind its unmoved lastmod; the sitemap answers
    # 304, so the sample comes through the re-seeder, rebuilt from the
    # page's recipe. Fetched in full, the page must stay marked as carrying
    # a modification date, or the next 304 crawl would stop vouching for it.
    from tests.test_failures import SETTINGS, gets, stored

    paths = [f"/v/{i}" for i in range(6)]
    run = EtagSitemapSite(site, crawl, monkeypatch, paths, "2024-01-01", SETTINGS).run

    await run(0)
    for path in paths:
        site.change(path)
    second = await run(2 * DAY)
    assert gets(site, "/sitemap.xml") == [304]
    sampled = [p for p in paths if gets(site, p) == [200]]
    assert sampled and second.stats.get_value("incremental/schedule/requested/sampled") == len(
        sampled)
    for path in paths:
        assert (await stored(state_uri, site, path)).flags & PageFlags.LASTMOD_MODIFIED, path


@pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_minute_later_every_known_page_is_accounted_for(
    site, crawl, state_uri, monkeypatch, caplog
):
    # The sitemap answers 304: no list names a page, none is due. The
    # re-seeder counts them from the store, so the report says what
    # happened to every known page and when the first falls due.
    import logging

    from tests.test_failures import SETTINGS, gets, stored

    paths = [f"/m/{i}" for i in range(8)]
    run = EtagSitemapSite(site, crawl, monkeypatch, paths, "2024-01-01", SETTINGS).run

    await run(0)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        second = await run(60)
    assert [r.path for r in site.log if r.path != "/robots.txt"] == ["/sitemap.xml"]
    assert gets(site, "/sitemap.xml") == [304]
    states = [await stored(state_uri, site, p) for p in paths]
    stats = second.stats
    assert stats.get_value("incremental/schedule/not_due") == len(paths)
    assert stats.get_value("incremental/schedule/bytes_skipped") == sum(s.size for s in states)
    first_due = min(s.next_visit for s in states)
    assert stats.get_value("incremental/schedule/first_due") == first_due
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(first_due))
    [report] = [m for r in caplog.records
                if (m := r.getMessage()).startswith("Incremental report")]
    assert f"not due {len(paths)} (the first falls due {when})" in report
    assert "requested nothing" in report and "INCREMENTAL_RECHECK_ALL" in report


@pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_due_pages_over_the_reseed_limit_are_counted_as_deferred(
    site, crawl, state_uri, monkeypatch
):
    # Every page due behind a sitemap answering 304 (undated: nothing
    # vouches), and room to re-seed only three: the rest are in a column of
    # their own, not lost from the count.
    from tests.test_failures import SETTINGS, gets

    paths = [f"/d/{i}" for i in range(10)]
    run = EtagSitemapSite(site, crawl, monkeypatch, paths, None,
                          {**SETTINGS, "INCREMENTAL_RESEED_LIMIT": 3}).run

    await run(0)
    second = await run(2 * DAY)
    assert gets(site, "/sitemap.xml") == [304]
    stats = second.stats
    assert len([r for r in site.log if r.path.startswith("/d/")]) == 3
    assert stats.get_value("incremental/schedule/requested/due") == 3
    assert stats.get_value("incremental/schedule/deferred") == len(paths) - 3
    assert stats.get_value("incremental/schedule/not_due") is None
