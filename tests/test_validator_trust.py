"""When validators fail: noise, random ETags, validators that lie (issue 5)."""

from __future__ import annotations

import pytest_twisted

from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from tests.spiders import ListSpider


def urls(site, paths):
    return [site.url(p) for p in paths]


@pytest_twisted.ensureDeferred
async def test_random_etags_unchanged_content_no_item_and_host_reported_unstable(
    site, crawl, state_db, caplog
):
    paths = [f"/r/{i}" for i in range(4)]
    for path in paths:
        site.add_page(path, "random", size=1500)
    await crawl(ListSpider, urls=urls(site, paths))
    caplog.clear()
    with caplog.at_level("INFO"):
        second = await crawl(ListSpider, urls=urls(site, paths))
    # Every conditional request missed (the tag is new each time)...
    assert all(r.status == 200 for r in site.log if r.path.startswith("/r/"))
    # ...but the content did not change: no item, validators flagged unstable.
    assert second.collected == []
    assert second.stats.get_value("incremental/items_unchanged") == 4
    assert second.stats.get_value("incremental/validators/unstable") == 4
    assert state_db("SELECT COUNT(*) FROM pages WHERE flags & 4") == [(4,)]
    report = next(r.getMessage() for r in caplog.records
                  if r.getMessage().startswith("Incremental report"))
    assert "127.0.0.1: validators reliable 0 / unstable 4 / lying 0 / absent 0" in report


@pytest_twisted.ensureDeferred
async def test_the_sampled_recheck_finds_changes_behind_stuck_validators(site, crawl, state_db):
    paths = [f"/s/{i}" for i in range(10)]
    for path in paths:
        site.add_page(path, "stuck", size=1500)
    settings = {"INCREMENTAL_RECHECK_EVERY": 5}
    await crawl(ListSpider, settings=settings, urls=urls(site, paths))
    for path in paths:
        site.change(path)  # the content moves; ETag "stuck" does not
    site.reset_log()
    second = await crawl(ListSpider, settings={**settings, "CONCURRENT_REQUESTS": 1},
                         urls=urls(site, paths))
    # The 5th conditional request went without conditions: the change behind
    # the unchanged validator was found and the host distrusted, so every
    # later page is fetched in full too.
    records = [r for r in site.log if r.path.startswith("/s/")]
    assert [r.if_none_match is None for r in records] == [False] * 4 + [True] * 6
    assert second.stats.get_value("incremental/validators/hosts_distrusted") == 1
    assert second.stats.get_value("incremental/requests/sample") == 1
    assert second.stats.get_value("incremental/requests/host_lying") == 5
    assert len(second.collected) == 6  # the 4 answered 304 wait for the next crawl
    [(until,)] = state_db("SELECT validators_distrusted_until FROM hosts")
    assert until > 0
    site.reset_log()
    third = await crawl(ListSpider, settings=settings, urls=urls(site, paths))
    # Still distrusted: the 4 remaining changes are found now.
    assert all(r.if_none_match is None for r in site.log if r.path.startswith("/s/"))
    assert len(third.collected) == 4


@pytest_twisted.ensureDeferred
async def test_noise_outside_and_inside_the_main_content_makes_no_item(site, crawl):
    paths = [f"/n/{i}" for i in range(3)]
    for path in paths:
        site.add_page(path, "noisy", size=1500)
    site.add_page("/n/real", "noisy", size=1500)
    await crawl(SitemapPagesSpider, sitemap_url=site.url("/sitemap.xml"))
    site.change("/n/real")
    site.reset_log()
    second = await crawl(SitemapPagesSpider, sitemap_url=site.url("/sitemap.xml"),
                         use_lastmod="false")
    # Every page was fetched in full (no validators)...
    assert len([r for r in site.log if r.path.startswith("/n/") and r.status == 200]) == 4
    # ...the per-response timestamps are ignored; the real change is not.
    assert [item["url"] for item in second.collected] == [site.url("/n/real")]
    assert second.stats.get_value("incremental/validators/absent") == 4


def article(words: list[str]) -> str:
    return ("<html><head><title>story</title></head><body><main><p>"
            + " ".join(words) + "</p></main></body></html>")


@pytest_twisted.ensureDeferred
async def test_a_one_word_change_is_an_item_by_default_and_suppressed_as_near_duplicate(
    site, crawl
):
    words = [f"word{i}" for i in range(400)]
    site.add_document("/story", article(words), "text/html")
    site.add_document("/s.xml", '<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/'
                      f'schemas/sitemap/0.9"><url><loc>{site.url("/story")}</loc></url></urlset>',
                      "application/xml")
    near = {"INCREMENTAL_NEAR_DUPLICATES": True}
    await crawl(SitemapPagesSpider, settings=near, sitemap_url=site.url("/s.xml"))
    words[200] = "changed"
    site.add_document("/story", article(words), "text/html")
    # Near-duplicate mode: the one-word change is within the distance; it is
    # suppressed and counted (the trade-off the README states).
    suppressed = await crawl(SitemapPagesSpider, settings=near, sitemap_url=site.url("/s.xml"))
    assert suppressed.collected == []
    assert suppressed.stats.get_value("incremental/items_near_duplicate") == 1
    # Default mode: every real change is an item.
    default = await crawl(SitemapPagesSpider, sitemap_url=site.url("/s.xml"))
    assert [item["url"] for item in default.collected] == [site.url("/story")]
    # A larger change passes the distance in near-duplicate mode too.
    words[:120] = [f"new{i}" for i in range(120)]
    site.add_document("/story", article(words), "text/html")
    rewritten = await crawl(SitemapPagesSpider, settings=near, sitemap_url=site.url("/s.xml"))
    assert len(rewritten.collected) == 1
