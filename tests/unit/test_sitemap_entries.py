"""Sitemap entry checks without a crawl: the 50,000-URL cap and loc rules."""

from __future__ import annotations

from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from incremental_crawler.lists.sitemaps import MAX_URLS, SitemapEntries
from incremental_crawler.state.keys import Canonicalizer


def entries_for(
    url: str = "https://example.com/sitemap.xml",
) -> tuple[SitemapEntries, MemoryStatsCollector]:
    stats = MemoryStatsCollector(get_crawler())
    return SitemapEntries(url, stats, Canonicalizer(), now=1_700_000_000), stats


def test_a_sitemap_over_50000_urls_is_capped_and_counted():
    entries, stats = entries_for()
    listed = ({"loc": f"https://example.com/p/{i}", "lastmod": "2024-01-01"}
              for i in range(MAX_URLS + 7))
    candidates = entries.candidates(listed)
    assert len(candidates) == MAX_URLS
    assert stats.get_value("incremental/sitemap/urls_over_limit") == 7


def test_duplicates_other_hosts_and_allowed_hosts():
    stats = MemoryStatsCollector(get_crawler())
    entries = SitemapEntries("https://example.com/s.xml", stats, Canonicalizer(),
                             allowed_hosts=["static.example.com"])
    candidates = entries.candidates([
        {"loc": "https://example.com/a?y=1&x=2"},
        {"loc": "https://example.com/a?x=2&y=1"},  # the same page, canonically
        {"loc": "https://static.example.com/b"},
        {"loc": "https://evil.example.net/c"},
    ])
    assert [c.loc for c in candidates] == ["https://example.com/a?y=1&x=2",
                                           "https://static.example.com/b"]
    assert stats.get_value("incremental/sitemap/duplicate_loc") == 1
    assert stats.get_value("incremental/sitemap/loc_rejected/other_host") == 1
