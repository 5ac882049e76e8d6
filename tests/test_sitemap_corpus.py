"""The sitemap/feed corpus, crawled: each fixture is one real crawl of our
``sitemap`` spider against the test site, and the pages it asked the site
for must be the case's expected set (``tests/corpus/sitemaps/index.toml``).

The cases reproduce test cases of ultimate-sitemap-parser, feedparser and
Scrapy, and rules of sitemaps.org and Google's documentation; each names
its source, and where our expectation differs from the source suite's, why.
"""

from __future__ import annotations

import pytest
import pytest_twisted

from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from tests.sitemap_corpus import (
    load_cases,
    requested_pages,
    serve,
    spider_attributes,
    start_url,
)

CASES = load_cases()


def test_the_corpus_names_its_sources_and_its_fixtures_exist():
    assert len({c.name for c in CASES}) == len(CASES)
    assert {c.suite for c in CASES} == {"ultimate-sitemap-parser", "feedparser", "scrapy",
                                        "sitemaps.org/google", "review"}
    for case in CASES:
        assert case.reproduces and case.documents, case.name
        assert (case.suite == "review") == case.reproduces.startswith("found in review"), case.name
        path = case.start.removeprefix("{alias}")
        assert path == "/robots.txt" or path in case.documents, case.name


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_corpus_case(site, crawl, case):
    serve(site, case)
    spidercls = type(f"Corpus_{case.name}", (SitemapPagesSpider,), spider_attributes(case))
    crawler = await crawl(spidercls, sitemap_url=start_url(site, case), **case.args)
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert requested_pages(site, case) == case.expected
    assert (crawler.stats.get_value("incremental/lastmod/invalid") or 0) == case.invalid_lastmods
    assert (crawler.stats.get_value("incremental/sitemap/loc_rejected/other_host")
            or 0) == case.other_hosts


@pytest_twisted.ensureDeferred
async def test_a_url_a_recovering_parse_would_guess_is_skipped_loudly(site, crawl, caplog):
    (case,) = [c for c in CASES if c.name == "review_comment_is_no_proof"]
    serve(site, case)
    crawler = await crawl(SitemapPagesSpider, sitemap_url=start_url(site, case))
    assert crawler.stats.get_value("incremental/sitemap/recovered") == 1
    assert crawler.stats.get_value("incremental/sitemap/loc_unproven") == 1
    assert "skipped 1 entries whose URL a recovering parse would have had to guess" in caplog.text
    assert not [r for r in site.log if r.path.startswith("/admin")]


@pytest_twisted.ensureDeferred
async def test_a_bare_ampersand_is_kept_as_written_and_counted(site, crawl, caplog):
    (case,) = [c for c in CASES if c.name == "review_bare_ampersand_then_escaped"]
    serve(site, case)
    crawler = await crawl(SitemapPagesSpider, sitemap_url=start_url(site, case))
    assert crawler.stats.get_value("incremental/sitemap/bare_ampersands") == 1
    assert crawler.stats.get_value("incremental/sitemap/recovered") is None
    assert crawler.stats.get_value("incremental/sitemap/loc_unproven") is None
    assert "skipped" not in caplog.text
