"""Two real crawls of the loopback site: what the server saw, what was stored."""

from __future__ import annotations

import pytest
import pytest_twisted
from scrapy.http import HtmlResponse

from incremental_crawler.spiders.main_text import DEFAULT_TEXT_SELECTORS
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from tests.html_corpus import reference_main_text
from tests.site import PLAIN_KINDS
from tests.spiders import ListSpider


def page_requests(site):
    return [r for r in site.log if r.path.startswith("/p/")]


@pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_second_crawl_is_conditional_and_emits_only_changes(
    site, crawl, state_uri, state_store, state_db
):
    paths = site.add_pages(20, kinds=PLAIN_KINDS, size=4000)
    first = await crawl(SitemapPagesSpider, sitemap_url=site.url("/robots.txt"))
    assert first.stats.get_value("finish_reason") == "finished"
    seen = page_requests(site)
    assert sorted(r.path for r in seen) == paths
    assert all(r.if_none_match is None and r.if_modified_since is None for r in seen)
    assert len(first.collected) == 20
    assert all(item["fingerprint"] for item in first.collected)

    changed = ["/p/0000", "/p/0001", "/p/0002", "/p/0003"]  # one of each kind
    for path in changed:
        site.change(path)
    site.reset_log()
    # Sitemap lastmod off: every page gets a conditional request.
    second = await crawl(SitemapPagesSpider, sitemap_url=site.url("/robots.txt"),
                         use_lastmod="false")

    by_path = {r.path: r for r in page_requests(site)}
    assert sorted(by_path) == paths  # each page asked exactly once
    for path in paths:
        kind, record = site.page(path).kind, by_path[path]
        if kind in ("strong", "weak"):
            # The stored tag, echoed as it was received (weak ones too).
            assert record.if_none_match is not None
            assert record.if_none_match.startswith("W/") == (kind == "weak")
        if kind in ("strong", "lastmod"):
            assert record.if_modified_since is not None
        if kind == "none":
            assert record.if_none_match is None and record.if_modified_since is None
        unchanged_with_validators = path not in changed and kind != "none"
        assert record.status == (304 if unchanged_with_validators else 200), path
        # A 304 costs no body; a full answer carries the page's whole current body.
        assert record.body_bytes == (0 if unchanged_with_validators
                                     else len(site.body(path))), path

    emitted = sorted(item["url"].removeprefix(site.base_url) for item in second.collected)
    assert emitted == changed
    stats = second.stats
    assert stats.get_value("incremental/not_modified") == 12
    assert stats.get_value("incremental/items_changed") == 4
    assert stats.get_value("incremental/items_unchanged") == 4  # the "none" pages
    assert stats.get_value("incremental/bytes_saved_estimate") > 12 * 3000
    # Counted by a networked store only; an embedded one has no round-trips.
    roundtrips = [c.stats.get_value("incremental/store_roundtrips") for c in (first, second)]
    if state_uri.startswith("redis"):
        assert all(n > 0 for n in roundtrips), roundtrips
    else:
        assert roundtrips == [0, 0]
    # Latest version of each changed item stored, with its history.
    latest = {item["url"]: item for item in state_store.iter_items("sitemap")}
    assert len(latest) == 20
    for path in changed:
        url = site.url(path)
        history = state_store.item_history("sitemap", url)
        assert [version for version, _ in history] == [1, 2]
        assert history[1][1] == latest[url]["fingerprint"] != history[0][1]
        assert latest[url]["title"].endswith("v1")
    assert [v for v, _ in state_store.item_history("sitemap", site.url("/p/0004"))] == [1]
    if state_uri.startswith("sqlite:"):
        # Every version's data is kept, not only the latest one's.
        for path in changed:
            titles = [t for (t,) in state_db(
                "SELECT json_extract(data, '$.title') FROM item_versions "
                "WHERE item_key = ? ORDER BY version", site.url(path))]
            assert titles[0].endswith("v0") and titles[1].endswith("v1")


@pytest_twisted.ensureDeferred
async def test_validators_that_never_change_are_caught_by_max_age(site, crawl, state_db):
    site.add_page("/stuck", "stuck", size=3000)

    await crawl(ListSpider, urls=[site.url("/stuck")])
    site.change("/stuck")
    second = await crawl(ListSpider, urls=[site.url("/stuck")])
    # The server's validator did not move: the change is invisible to a 304.
    assert site.log[-1].status == 304
    assert second.collected == []

    # Age the page past INCREMENTAL_MAX_AGE: the next visit is unconditional.
    state_db("UPDATE pages SET last_fetched = last_fetched - 7200")
    third = await crawl(ListSpider, settings={"INCREMENTAL_MAX_AGE": 3600},
                        urls=[site.url("/stuck")])
    last = site.log[-1]
    assert last.if_none_match is None and last.if_modified_since is None
    assert last.status == 200
    assert [item["title"] for item in third.collected] == ["Page stuck v1"]
    assert third.stats.get_value("incremental/requests/max_age") == 1


@pytest_twisted.ensureDeferred
async def test_report_at_the_end_and_figures_in_the_periodic_line(site, crawl, caplog):
    site.add_pages(8, size=4000)
    await crawl(SitemapPagesSpider, sitemap_url=site.url("/sitemap.xml"))
    site.change("/p/0000")
    caplog.clear()
    with caplog.at_level("INFO"):
        await crawl(SitemapPagesSpider, settings={"LOGSTATS_INTERVAL": 0.01},
                    sitemap_url=site.url("/sitemap.xml"), use_lastmod="false")
    report = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith("Incremental report")]
    assert len(report) == 1
    assert "8 pages checked, 7 not modified (304), 0 new, 1 changed" in report[0]
    assert "items: 0 new, 1 changed" in report[0]
    periodic = [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("Incremental: ")]
    assert periodic, "the periodic log line carries the incremental figures"


@pytest_twisted.ensureDeferred
async def test_a_crawl_on_the_defaults_logs_no_disabled_component_warning(site, crawl, caplog):
    # Components that are off by default (the shared budget without a URL,
    # cluster mode) stay quiet; a warning on every crawl trains users to
    # ignore warnings.
    site.add_page("/p/1", "strong", size=500)
    with caplog.at_level("WARNING"):
        await crawl(ListSpider, settings={"INCREMENTAL_THROTTLE_ENABLED": True},
                    urls=[site.url("/p/1")])
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []


@pytest_twisted.ensureDeferred
async def test_items_carry_the_main_text_of_documentation_pages(site, crawl):
    """Pages structured like a manual's (scripts, sidebar, code, tables; the
    main part a ``div role=main``): each item's text is the reference
    extraction of the page the server sent, and its title the page's."""
    for i in range(6):
        site.add_page(f"/doc/{i}", "strong", size=40_000, layout="docs")
    first = await crawl(SitemapPagesSpider, sitemap_url=site.url("/sitemap.xml"))
    items = {item["url"].removeprefix(site.base_url): item for item in first.collected}
    assert sorted(items) == [f"/doc/{i}" for i in range(6)]
    for path, item in items.items():
        page = HtmlResponse(site.url(path), body=site.body(path), encoding="utf-8")
        assert item["text"] == reference_main_text(page, DEFAULT_TEXT_SELECTORS), path
        assert item["title"] == f"Page doc/{path[-1]} v0 \u2014 Reference manual"
        assert len(item["text"]) > 10_000 and "DOCUMENTATION_OPTIONS" not in item["text"]
