"""Adaptive revisits and re-seeding from the store, on real crawls."""

from __future__ import annotations

import pytest_twisted

from incremental_crawler.spiders.news import NewsSpider
from tests.spiders import ListSpider

# Every page is due again at once, so a test can crawl twice in a row.
ALWAYS_DUE = {
    "INCREMENTAL_REVISIT_ENABLED": True,
    "INCREMENTAL_REVISIT_INITIAL": 0,
    "INCREMENTAL_REVISIT_MIN": 0,
}


def listing(site, n: int) -> str:
    links = "".join(f'<li><a href="/news/{i}">story {i}</a></li>' for i in range(n))
    return f"<html><head><title>News</title></head><body><ul>{links}</ul></body></html>"


@pytest_twisted.ensureDeferred
async def test_a_listing_answering_304_does_not_hide_a_changed_article(site, crawl, state_db):
    for i in range(6):
        site.add_page(f"/news/{i}", "strong", size=1500)
    site.add_document("/news", listing(site, 6), "text/html", etag='"listing-1"')
    first = await crawl(NewsSpider, settings=ALWAYS_DUE, start_url=site.url("/news"))
    assert len(first.collected) == 6
    site.change("/news/3")  # the listing itself does not change
    site.reset_log()
    second = await crawl(NewsSpider, settings=ALWAYS_DUE, start_url=site.url("/news"))
    [listing_record] = [r for r in site.log if r.path == "/news"]
    assert listing_record.status == 304  # so no article link was seen...
    articles = sorted((r.path, r.status) for r in site.log if r.path.startswith("/news/"))
    # ...yet every known article was requested again, conditionally, once.
    assert articles == sorted(
        (f"/news/{i}", 200 if i == 3 else 304) for i in range(6))
    assert [item["url"] for item in second.collected] == [site.url("/news/3")]
    # The listing's 304 replayed its article requests: every page was
    # visited in this crawl already, none is re-seeded again.
    assert second.stats.get_value("incremental/reseeded") == 0


@pytest_twisted.ensureDeferred
async def test_a_page_not_yet_due_is_not_requested(site, crawl, state_db):
    site.add_page("/p", "strong", size=1500)
    # No tolerance: the next crawl starts seconds later, an hour too early.
    settings = {"INCREMENTAL_REVISIT_ENABLED": True, "INCREMENTAL_REVISIT_INITIAL": 3600,
                "INCREMENTAL_REVISIT_MIN": 60, "INCREMENTAL_DUE_TOLERANCE": 0}
    first = await crawl(ListSpider, settings=settings, urls=[site.url("/p")])
    [(interval, next_visit, last_checked)] = state_db(
        "SELECT interval, next_visit, last_checked FROM pages WHERE url = ?", site.url("/p"))
    # Counted from the crawl's start, not from the visit.
    started = first.stats.get_value("start_time").timestamp()
    assert interval == 3600 and abs(next_visit - (started + 3600)) <= 1
    assert next_visit - 3600 <= last_checked
    site.reset_log()
    second = await crawl(ListSpider, settings=settings, urls=[site.url("/p")])
    assert [r for r in site.log if r.path == "/p"] == []
    # Dropped as start() yielded it: it never reached the downloader.
    assert second.stats.get_value("incremental/schedule/not_due") == 1
    assert second.stats.get_value("incremental/not_due") is None
    assert second.stats.get_value("downloader/exception_count") is None

    # Once due, an unchanged page stretches its interval; a changed one shrinks it.
    state_db("UPDATE pages SET next_visit = 0")
    await crawl(ListSpider, settings=settings, urls=[site.url("/p")])
    [(interval,)] = state_db("SELECT interval FROM pages WHERE url = ?", site.url("/p"))
    assert interval == round(3600 * 1.4)
    state_db("UPDATE pages SET next_visit = 0")
    site.change("/p")
    await crawl(ListSpider, settings=settings, urls=[site.url("/p")])
    [(interval,)] = state_db("SELECT interval FROM pages WHERE url = ?", site.url("/p"))
    assert interval == round(round(3600 * 1.4) * 0.8)


@pytest_twisted.ensureDeferred
async def test_noise_does_not_make_a_page_look_changed_to_its_revisit_schedule(
    site, crawl, state_db
):
    # A per-response timestamp changes the raw body on every visit; the
    # page's items say the content did not change, and they decide: the
    # interval grows as for an unchanged page (x1.4), it does not shrink.
    site.add_page("/noisy", "noisy", size=1500)
    site.add_page("/real", "noisy", size=1500)
    settings = {**ALWAYS_DUE, "INCREMENTAL_REVISIT_INITIAL": 1000}
    urls = [site.url("/noisy"), site.url("/real")]
    # Not due for 1000 s: fetched anyway (refresh) to see what a visit does.
    refresh = {"incremental_refresh": True}
    await crawl(ListSpider, settings=settings, urls=urls, meta=refresh)
    site.change("/real")
    second = await crawl(ListSpider, settings=settings, urls=urls, meta=refresh)
    assert [item["url"] for item in second.collected] == [site.url("/real")]
    intervals = dict(state_db("SELECT url, interval FROM pages"))
    assert intervals[site.url("/noisy")] == 1400  # unchanged: 1000 x 1.4
    assert intervals[site.url("/real")] == 800  # changed: 1000 x 0.8
    assert second.stats.get_value("incremental/pages_unchanged") == 1
    assert second.stats.get_value("incremental/pages_changed") == 1
    [(changes,)] = state_db("SELECT changes FROM pages WHERE url = ?", site.url("/noisy"))
    assert changes == 0
