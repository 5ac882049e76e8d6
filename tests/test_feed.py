"""The feed spider: RSS 2.0 and Atom entries whose date moved are requested."""

from __future__ import annotations

import pytest_twisted

from incremental_crawler.spiders.feed import FeedPagesSpider


def rss(site, items: list[tuple[str, str]]) -> str:
    rows = "".join(f"<item><title>{p}</title><link>{site.url(p)}</link>"
                   f"<pubDate>{date}</pubDate></item>" for p, date in items)
    return f'<?xml version="1.0"?><rss version="2.0"><channel><title>t</title>{rows}</channel></rss>'


def atom(site, entries: list[tuple[str, str]]) -> str:
    rows = "".join(f'<entry><title>{p}</title><link rel="alternate" href="{site.url(p)}"/>'
                   f"<updated>{date}</updated></entry>" for p, date in entries)
    return f'<?xml version="1.0"?><feed xmlns="http://www.w3.org/2005/Atom"><title>t</title>{rows}</feed>'


@pytest_twisted.ensureDeferred
async def test_rss_entries_whose_pubdate_moved_are_the_only_requests(site, crawl):
    for path in ("/a", "/b", "/c"):
        site.add_page(path, "strong", size=1500)
    dates = {"/a": "Mon, 01 Jan 2024 10:00:00 GMT", "/b": "Mon, 01 Jan 24 10:00:00 GMT",
             "/c": "Mon, 01 Jan 2024 10:00:00 +0000"}
    site.add_document("/rss", rss(site, list(dates.items())), "application/rss+xml",
                      etag='"rss-1"')
    first = await crawl(FeedPagesSpider, feed_url=site.url("/rss"))
    assert len(first.collected) == 3
    assert first.stats.get_value("incremental/feed/rss") == 1

    site.change("/b")
    dates["/b"] = "Tue, 02 Jan 2024 10:00:00 GMT"
    site.add_document("/rss", rss(site, list(dates.items())), "application/rss+xml",
                      etag='"rss-2"')
    site.reset_log()
    second = await crawl(FeedPagesSpider, feed_url=site.url("/rss"))
    assert sorted((r.path, r.status) for r in site.log if r.path != "/robots.txt") == [
        ("/b", 200), ("/rss", 200)]
    assert [i["url"] for i in second.collected] == [site.url("/b")]

    site.reset_log()
    third = await crawl(FeedPagesSpider, feed_url=site.url("/rss"))
    # The feed did not change: it answers 304 and nothing else is asked.
    assert [(r.path, r.status) for r in site.log if r.path != "/robots.txt"] == [("/rss", 304)]
    assert third.collected == []


@pytest_twisted.ensureDeferred
async def test_atom_entries_and_a_hostile_feed(site, crawl):
    for path in ("/x", "/y"):
        site.add_page(path, "weak", size=1500)
    site.add_document("/atom", atom(site, [("/x", "2024-05-01T10:00:00Z"),
                                           ("/y", "2024-05-01T10:00:00+02:00")]),
                      "application/atom+xml")
    first = await crawl(FeedPagesSpider, feed_url=site.url("/atom"))
    assert first.stats.get_value("incremental/feed/atom") == 1
    assert sorted(i["url"] for i in first.collected) == [site.url("/x"), site.url("/y")]

    evil = ('<?xml version="1.0"?><!DOCTYPE r [<!ENTITY a "aaaaaaaaaa">'
            '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY x SYSTEM "file:///etc/hostname">]>'
            f'<rss version="2.0"><channel><item><link>{site.url("/x")}&b;&x;</link>'
            '</item><item><link>javascript:alert(1)</link></item></channel></rss>')
    site.add_document("/evil", evil, "application/rss+xml")
    site.reset_log()
    hostile = await crawl(FeedPagesSpider, feed_url=site.url("/evil"))
    assert hostile.stats.get_value("finish_reason") == "finished"
    assert hostile.stats.get_value("incremental/sitemap/loc_rejected/scheme") == 1
    assert not [r for r in site.log if "aaaa" in r.path or "etc" in r.path]
