"""The feed spider: RSS 2.0 and Atom entries whose date moved are requested."""

from __future__ import annotations

import pytest_twisted

from incremental_crawler.spiders.feed import FeedPagesSpider


def rss(site, items: list[tuple[str, str]]) -> str:
    rows = "".join(f"<item><title>{p}</title><link>{site.url(p)}</link>"
                   f"<pubDate>{date}</pubDate></item>" for p, date in items)
    return (f'<?xml version="1.0"?><rss version="2.0"><channel><title>t</title>{rows}'
            "</channel></rss>")


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
    # A pubDate is no modification date: an unmoved one leaves the page to
    # its revisit schedule (a day, not due in these crawls).
    revisits = {"INCREMENTAL_REVISIT_ENABLED": True}
    first = await crawl(FeedPagesSpider, settings=revisits, feed_url=site.url("/rss"))
    assert len(first.collected) == 3
    assert first.stats.get_value("incremental/feed/rss") == 1

    site.change("/b")
    dates["/b"] = "Tue, 02 Jan 2024 10:00:00 GMT"
    site.add_document("/rss", rss(site, list(dates.items())), "application/rss+xml",
                      etag='"rss-2"')
    site.reset_log()
    second = await crawl(FeedPagesSpider, settings=revisits, feed_url=site.url("/rss"))
    assert sorted((r.path, r.status) for r in site.log if r.path != "/robots.txt") == [
        ("/b", 200), ("/rss", 200)]
    assert second.stats.get_value("incremental/schedule/not_due") == 2
    assert [i["url"] for i in second.collected] == [site.url("/b")]

    site.reset_log()
    third = await crawl(FeedPagesSpider, settings=revisits, feed_url=site.url("/rss"))
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


@pytest_twisted.ensureDeferred
async def test_an_edited_article_and_one_that_left_the_feed_are_revisited_when_due(
    site, crawl, state_db
):
    for path in ("/a", "/old", "/b"):
        site.add_page(path, "strong", size=1500)
    settings = {"INCREMENTAL_REVISIT_ENABLED": True}
    site.add_document("/rss", rss(site, [("/old", "Sun, 31 Dec 2023 10:00:00 GMT"),
                                         ("/a", "Mon, 01 Jan 2024 10:00:00 GMT")]),
                      "application/rss+xml", etag='"1"')
    await crawl(FeedPagesSpider, settings=settings, feed_url=site.url("/rss"))
    # /a is corrected (its pubDate does not move), /old leaves the feed and
    # is edited too, /b is new.
    site.change("/a")
    site.change("/old")
    site.add_document("/rss", rss(site, [("/a", "Mon, 01 Jan 2024 10:00:00 GMT"),
                                         ("/b", "Tue, 02 Jan 2024 10:00:00 GMT")]),
                      "application/rss+xml", etag='"2"')
    state_db("UPDATE pages SET next_visit = 1")  # everything is due for a revisit
    site.reset_log()
    second = await crawl(FeedPagesSpider, settings=settings, feed_url=site.url("/rss"))
    fetched = {r.path for r in site.log if r.status == 200}
    assert {"/a", "/old", "/b"} <= fetched
    assert sorted(i["url"] for i in second.collected) == [site.url(p) for p in ("/a", "/b", "/old")]


def dated_feed(root: str, entries: list[tuple[str, str]]) -> str:
    """A feed under *root* (``rss`` or Atom 0.3 ``feed``), each entry a link and its date
    element (``<tag>date</tag>``, namespaces declared on the root)."""
    if root == "rss":
        rows = "".join(f"<item><link>{link}</link>{dated}</item>" for link, dated in entries)
        return ('<?xml version="1.0"?><rss version="2.0" '
                'xmlns:dc="http://purl.org/dc/elements/1.1/" '
                'xmlns:dcterms="http://purl.org/dc/terms/"><channel><title>t</title>'
                f"{rows}</channel></rss>")
    rows = "".join(f'<entry><link rel="alternate" type="text/html" href="{link}"/>{dated}</entry>'
                   for link, dated in entries)
    return f'<?xml version="1.0"?><feed version="0.3" xmlns="http://purl.org/atom/ns#">{rows}</feed>'


def page_requests(site) -> list[tuple[str, int]]:
    return sorted((r.path, r.status) for r in site.log if r.path.startswith("/p"))


@pytest_twisted.ensureDeferred
async def test_rss_dublin_core_dates_are_read_with_their_zones(site, crawl):
    # RSS items dated by dc:date (no pubDate), one by dcterms:modified. As in
    # feedparser's item_dc_date and item_dcterms_modified fixtures.
    for path in ("/pa", "/pb", "/pc"):
        site.add_page(path, "strong", size=1500)

    def publish(a: str, b: str, etag: str) -> None:
        site.add_document("/rss", dated_feed("rss", [
            (site.url("/pa"), f"<dc:date>{a}</dc:date>"),
            (site.url("/pb"), f"<dc:date>{b}</dc:date>"),
            (site.url("/pc"), ("<dcterms:modified>2024-01-01T10:00:00Z</dcterms:modified>"
                               "<pubDate>Mon, 01 Jan 2024 09:00:00 GMT</pubDate>")),
        ]), "application/rss+xml", etag=etag)

    settings = {"INCREMENTAL_REVISIT_ENABLED": True, "INCREMENTAL_LASTMOD_RECHECK_SHARE": 0}
    publish("2024-01-01T10:00:00Z", "2024-01-01T10:00:00Z", '"1"')
    first = await crawl(FeedPagesSpider, settings=settings, feed_url=site.url("/rss"))
    assert len(first.collected) == 3
    assert not first.stats.get_value("incremental/lastmod/missing")

    # /pa's date is written in another zone, the same instant: it did not
    # move. /pb's moved by an hour, written as local time (+02:00).
    site.change("/pb")
    publish("2024-01-01T12:00:00+02:00", "2024-01-01T13:00:00+02:00", '"2"')
    site.reset_log()
    second = await crawl(FeedPagesSpider, settings=settings, feed_url=site.url("/rss"))
    assert page_requests(site) == [("/pb", 200)]
    assert second.stats.get_value("incremental/schedule/requested/lastmod_newer") == 1
    # dc:date is no modification date: /pa is left to its schedule (not due);
    # dcterms:modified is one: /pc is vouched for.
    assert second.stats.get_value("incremental/schedule/not_due") == 1
    assert second.stats.get_value("incremental/schedule/skipped/lastmod_unchanged") == 1


@pytest_twisted.ensureDeferred
async def test_atom_03_modified_and_issued_are_read(site, crawl):
    # Atom 0.3 (feedparser's entry_modified and entry_issued fixtures): the
    # modification date is <modified>, the publication date <issued>, both
    # RFC 822 or W3C dates.
    for path in ("/px", "/py"):
        site.add_page(path, "strong", size=1500)

    def publish(modified: str, etag: str) -> None:
        site.add_document("/atom", dated_feed("feed", [
            (site.url("/px"), (f"<modified>{modified}</modified>"
                               "<issued>2024-05-01T08:00:00Z</issued>")),
            (site.url("/py"), "<issued>Wed, 01 May 2024 10:00:00 GMT</issued>"),
        ]), "application/atom+xml", etag=etag)

    # Without revisits every page without a vouching date is due.
    settings = {"INCREMENTAL_LASTMOD_RECHECK_SHARE": 0}
    publish("Wed, 01 May 2024 10:00:00 GMT", '"1"')
    first = await crawl(FeedPagesSpider, settings=settings, feed_url=site.url("/atom"))
    assert first.stats.get_value("incremental/feed/atom") == 1
    assert len(first.collected) == 2
    assert not first.stats.get_value("incremental/lastmod/missing")

    # The same instant, in US Eastern daylight time: /px did not move.
    publish("Wed, 01 May 2024 06:00:00 EDT", '"2"')
    site.reset_log()
    second = await crawl(FeedPagesSpider, settings=settings, feed_url=site.url("/atom"))
    assert page_requests(site) == [("/py", 304)]
    assert second.stats.get_value("incremental/schedule/skipped/lastmod_unchanged") == 1
    assert second.stats.get_value("incremental/schedule/requested/due") == 1


@pytest_twisted.ensureDeferred
async def test_a_feed_cut_off_mid_link_warns_and_counts_what_it_skipped(site, crawl, caplog):
    # Found in review: the feed spider dropped unproven entries silently.
    base = site.base_url
    cut = (f'<rss version="2.0"><channel><title>t</title>'
           f"<item><link>{base}/whole</link></item>"
           f"<item><link>{base}/cut-of").encode()
    site.add_document("/rss", cut, "application/rss+xml")
    crawler = await crawl(FeedPagesSpider, feed_url=site.url("/rss"))
    assert crawler.stats.get_value("incremental/sitemap/recovered") == 1
    assert crawler.stats.get_value("incremental/sitemap/loc_unproven") == 1
    assert "skipped 1 entries whose URL a recovering parse would have had to guess" in caplog.text
    assert {r.path for r in site.log} >= {"/whole"}
    assert not [r for r in site.log if r.path.startswith("/cut")]
