"""State is never ahead of data, and only a 2xx updates validators: on real crawls."""

from __future__ import annotations

import pytest_twisted

from tests.spiders import ListSpider


def urls(site, paths):
    return [site.url(p) for p in paths]


@pytest_twisted.ensureDeferred
async def test_page_state_is_not_on_disk_while_its_item_is_in_a_user_pipeline(
    site, crawl, state_db
):
    for i in range(6):
        site.add_page(f"/p/{i}", "strong", size=2000)
    paths = [f"/p/{i}" for i in range(6)]
    crawler = await crawl(
        ListSpider,
        settings={"ITEM_PIPELINES": {"tests.spiders.StateProbePipeline": 500}},
        urls=urls(site, paths),
    )
    # While each item was in the user's pipeline, even after a forced flush,
    # the file held no validators for its page.
    assert len(crawler.state_probe) == 6
    assert all(row is None for _, row in crawler.state_probe)
    # And once the crawl is over, every page's validators are stored.
    rows = state_db("SELECT etag FROM pages WHERE etag IS NOT NULL")
    assert len(rows) == 6


@pytest_twisted.ensureDeferred
async def test_a_failing_user_pipeline_withholds_the_page_validators(site, crawl, state_db):
    for path in ("/ok", "/bad"):
        site.add_page(path, "strong", size=2000)
    settings = {
        "ITEM_PIPELINES": {"tests.spiders.FailingPipeline": 500},
        "TEST_FAIL_ON": "/bad",
    }
    first = await crawl(ListSpider, settings=settings, urls=urls(site, ["/ok", "/bad"]))
    assert first.stats.get_value("incremental/state_withheld") == 1
    site.reset_log()
    # The user's database is back: the page that failed is fetched in full,
    # not answered 304 for content that never reached it.
    second = await crawl(ListSpider, urls=urls(site, ["/ok", "/bad"]))
    by_path = {r.path: r for r in site.log if r.path in ("/ok", "/bad")}
    assert by_path["/ok"].status == 304
    assert by_path["/bad"].if_none_match is None
    assert by_path["/bad"].status == 200
    assert [item["url"] for item in second.collected] == [site.url("/bad")]


@pytest_twisted.ensureDeferred
async def test_a_failing_callback_withholds_the_page_validators(site, crawl, state_db):
    site.add_page("/fragile", "strong", size=2000)
    first = await crawl(ListSpider, urls=[site.url("/fragile")], fail_on=("/fragile",))
    assert first.stats.get_value("spider_exceptions/ValueError") == 1
    assert state_db("SELECT etag FROM pages WHERE etag IS NOT NULL") == []
    site.reset_log()
    second = await crawl(ListSpider, urls=[site.url("/fragile")])
    [record] = [r for r in site.log if r.path == "/fragile"]
    assert record.if_none_match is None and record.status == 200
    assert len(second.collected) == 1


@pytest_twisted.ensureDeferred
async def test_opt_out_and_variants(site, crawl, state_db):
    site.add_page("/page", "strong", size=2000)
    url = site.url("/page")
    await crawl(ListSpider, urls=[url], meta={"incremental_skip": True})
    assert state_db("SELECT COUNT(*) FROM pages") == [(0,)]

    await crawl(ListSpider, urls=[url], meta={"incremental_variant": "de"})
    site.reset_log()
    # Another variant of the same URL has no state of its own yet: a full fetch.
    await crawl(ListSpider, urls=[url], meta={"incremental_variant": "fr"})
    await crawl(ListSpider, urls=[url], meta={"incremental_variant": "de"})
    assert [(r.if_none_match is not None, r.status) for r in site.log if r.path == "/page"] == [
        (False, 200), (True, 304),
    ]
    assert sorted(state_db("SELECT variant FROM pages")) == [("de",), ("fr",)]
