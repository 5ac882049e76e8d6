"""Our clock going backwards, on real crawls (the injectable clock moves them).

A crawl runs while the clock is five days fast; the clock is put right, and
the next day's crawl must still ask every page (their next visits were
counted from the fast clock), see the change among them, and say why.
"""

from __future__ import annotations

import logging
import re

import pytest
import pytest_twisted

from tests.spiders import ListSpider
from tests.test_failures import DAY, SETTINGS, at, crawl_sitemap, serve

PAGES = [f"/p/{i}" for i in range(10)]


def requested(site) -> list[tuple[str, int]]:
    return sorted((r.path, r.status) for r in site.log if r.path.startswith("/p/"))


@pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_clock_put_back_leaves_no_page_waiting(site, crawl, monkeypatch, caplog):
    # A sitemap without dates (the pages go by their schedules) that answers
    # 304 once read: the second crawl's pages come from the store's due read.
    serve(site, PAGES)
    at(monkeypatch, 5 * DAY)  # the clock five days fast
    first = await crawl_sitemap(crawl, site)
    assert first.stats.get_value("incremental/schedule/requested/new") == len(PAGES)

    at(monkeypatch, DAY)  # put right, the next day
    site.change("/p/3")
    site.reset_log()
    with caplog.at_level(logging.WARNING):
        second = await crawl_sitemap(crawl, site)
    [sitemap] = [r for r in site.log if r.path == "/sitemap.xml"]
    assert sitemap.status == 304
    # Every page, really checked a day ago, is asked again; the change is seen.
    assert requested(site) == sorted((p, 200 if p == "/p/3" else 304) for p in PAGES)
    assert [item["url"] for item in second.collected] == [site.url("/p/3")]
    assert second.stats.get_value("incremental/reseeded") == len(PAGES)
    # Said once, naming the skew (four days).
    warnings = [r.getMessage() for r in caplog.records if "Our clock is behind" in r.getMessage()]
    assert len(warnings) == 1
    # The pages' next visits, and the sitemap's, brought forward.
    # Four days less the time between the two crawls' starts (the first
    # crawl's own length): any machine takes less than a minute.
    assert re.search(r"(3 d 23:59:\d\d|4 d 0:00:\d\d) before", warnings[0]), warnings[0]
    assert "11 next visits" in warnings[0]
    assert second.stats.get_value("incremental/clock/next_visits_brought_forward") == 11

    # Checked again at the true time, the pages are back on their schedules.
    site.reset_log()
    third = await crawl_sitemap(crawl, site)
    assert requested(site) == []
    assert third.stats.get_value("incremental/schedule/not_due") == len(PAGES)


@pytest_twisted.ensureDeferred
async def test_a_page_checked_in_the_future_is_due(site, crawl, state_db, monkeypatch, caplog):
    # A crawl killed under the fast clock leaves no crawl record: the pages
    # themselves show the skew when a crawl decides them.
    for path in PAGES[:3]:
        site.add_page(path, "strong", size=1500)
    urls = [site.url(p) for p in PAGES[:3]]
    at(monkeypatch, 5 * DAY)
    await crawl(ListSpider, settings=SETTINGS, urls=urls)
    state_db("DELETE FROM crawls")

    at(monkeypatch, DAY)
    site.change("/p/1")
    site.reset_log()
    with caplog.at_level(logging.WARNING):
        second = await crawl(ListSpider, settings=SETTINGS, urls=urls)
    assert requested(site) == [("/p/0", 304), ("/p/1", 200), ("/p/2", 304)]
    assert [item["url"] for item in second.collected] == [site.url("/p/1")]
    warnings = [r.getMessage() for r in caplog.records if "Our clock is behind" in r.getMessage()]
    assert len(warnings) == 1 and "last checked at" in warnings[0]
    assert 4 * DAY - 60 < second.stats.get_value("incremental/clock/checked_ahead") <= 4 * DAY
