"""Sitemap lastmod decides which pages are requested at all."""

from __future__ import annotations

import gzip
import time

import pytest_twisted

from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from tests.site import PLAIN_KINDS

N = 40


def requested_pages(site) -> list[str]:
    return sorted(r.path for r in site.log if r.path.startswith("/p/"))


@pytest_twisted.ensureDeferred
async def test_only_pages_with_a_newer_lastmod_are_requested(site, crawl):
    site.add_pages(N, kinds=PLAIN_KINDS)
    # No rotating sample here: the test counts requests exactly.
    no_sample = {"INCREMENTAL_LASTMOD_RECHECK_SHARE": 0}
    await crawl(SitemapPagesSpider, settings=no_sample, sitemap_url=site.url("/robots.txt"))
    changed = site.change_fraction(0.05, seed=3)
    assert len(changed) == 2
    site.reset_log()
    second = await crawl(SitemapPagesSpider, settings=no_sample,
                         sitemap_url=site.url("/robots.txt"))
    # Only the changed pages, plus robots.txt and the sitemaps themselves.
    assert requested_pages(site) == changed
    others = sorted(r.path for r in site.log if not r.path.startswith("/p/"))
    # robots.txt twice: once for ROBOTSTXT_OBEY, once as the sitemap source.
    assert others == ["/robots.txt", "/robots.txt", "/sitemap-1.xml",
                      "/sitemap-2.xml.gz", "/sitemap_index.xml"]
    assert sorted(i["url"] for i in second.collected) == [site.url(p) for p in changed]
    assert second.stats.get_value("incremental/lastmod/skipped") == N - 2
    assert second.stats.get_value("incremental/schedule/skipped/lastmod_unchanged") == N - 2
    assert second.stats.get_value("incremental/schedule/requested/lastmod_newer") == 2

    site.reset_log()
    # Without lastmods (and without revisits) every page is due.
    third = await crawl(SitemapPagesSpider, settings=no_sample,
                        sitemap_url=site.url("/robots.txt"), use_lastmod="false")
    assert requested_pages(site) == sorted(p.path for p in site.pages)
    assert third.collected == []


def publish_moving_lastmods(site, paths: list[str], n: int) -> None:
    """Publication *n* of /s.xml: every lastmod moves, past our last fetch,
    while no page changes."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 2 + n))
    site.add_document("/s.xml", urlset([(site.url(p), stamp) for p in paths]),
                      "application/xml")


def urlset(entries: list[tuple[str, str | None]]) -> str:
    rows = []
    for loc, lastmod in entries:
        extra = f"<lastmod>{lastmod}</lastmod>" if lastmod is not None else ""
        rows.append(f"<url><loc>{loc}</loc>{extra}</url>")
    return ('<?xml version="1.0" encoding="UTF-8"?>'
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            + "".join(rows) + "</urlset>")


@pytest_twisted.ensureDeferred
async def test_a_304_contradicting_a_newer_lastmod_is_settled_by_the_content(
    site, crawl, state_db
):
    site.add_page("/a", "strong", size=1500)
    site.add_document("/s.xml", urlset([(site.url("/a"), "2024-01-01")]), "application/xml")
    no_sample = {"INCREMENTAL_LASTMOD_RECHECK_SHARE": 0}
    await crawl(SitemapPagesSpider, settings=no_sample, sitemap_url=site.url("/s.xml"))
    site.add_document("/s.xml", urlset([(site.url("/a"), "2024-02-01T10:00Z")]),
                      "application/xml")
    site.reset_log()
    second = await crawl(SitemapPagesSpider, settings=no_sample, sitemap_url=site.url("/s.xml"))
    # The sitemap says "changed", the validators "not modified": the page is
    # fetched in full once, and its content (unchanged) decides.
    assert [(r.status, r.if_none_match is None) for r in site.log if r.path == "/a"] == [
        (304, False), (200, True)]
    assert second.collected == []
    assert second.stats.get_value("incremental/refetch/lastmod_contradicts_304") == 1
    # Our copy is that version: the new lastmod is recorded...
    [(lastmod,)] = state_db("SELECT lastmod FROM pages WHERE url = ?", site.url("/a"))
    assert lastmod == 1706781600
    site.reset_log()
    # ...so the next crawl does not ask again.
    third = await crawl(SitemapPagesSpider, settings=no_sample, sitemap_url=site.url("/s.xml"))
    assert [r.path for r in site.log if r.path == "/a"] == []
    assert third.stats.get_value("incremental/lastmod/skipped") == 1


@pytest_twisted.ensureDeferred
async def test_invalid_and_future_lastmods(site, crawl):
    for path in ("/bad", "/future", "/none", "/ok"):
        site.add_page(path, "strong", size=1500)
    entries = [
        (site.url("/bad"), "2024-13-45"),
        (site.url("/future"), "2999-01-01T00:00:00Z"),
        (site.url("/none"), None),
        (site.url("/ok"), "2024-05-01"),
    ]
    site.add_document("/s.xml", urlset(entries), "application/xml")
    no_sample = {"INCREMENTAL_LASTMOD_RECHECK_SHARE": 0}
    first = await crawl(SitemapPagesSpider, settings=no_sample, sitemap_url=site.url("/s.xml"))
    assert first.stats.get_value("incremental/lastmod/invalid") == 1
    assert first.stats.get_value("incremental/lastmod/future_clamped") == 1
    assert first.stats.get_value("incremental/lastmod/missing") == 1
    site.reset_log()
    second = await crawl(SitemapPagesSpider, settings=no_sample, sitemap_url=site.url("/s.xml"))
    # Invalid, missing and future lastmods never skip a page: their revisit
    # schedule (off here: always due) and conditional requests decide. A
    # future one is never stored (a stored year 2999 would make every later
    # real lastmod look old and hide changes).
    assert requested_pages_of(site, "/bad", "/none", "/future") == ["/bad", "/future", "/none"]
    assert all(r.status == 304 for r in site.log if r.path in ("/bad", "/none", "/future"))
    assert not [r for r in site.log if r.path == "/ok"]
    assert second.stats.get_value("incremental/schedule/requested/due") == 3


def requested_pages_of(site, *paths):
    return sorted(r.path for r in site.log if r.path in paths)


@pytest_twisted.ensureDeferred
async def test_lastmod_zones_are_honoured_and_invalid_zones_refused(site, crawl):
    paths = ("/zoned", "/zoneless", "/dated", "/badzone", "/year0")
    for path in paths:
        site.add_page(path, "strong", size=1500)

    def publish(zoned: str, zoneless: str) -> None:
        site.add_document("/s.xml", urlset([
            (site.url("/zoned"), zoned),
            (site.url("/zoneless"), zoneless),  # no zone: UTC
            (site.url("/dated"), "2024-05-01"),  # midnight UTC
            (site.url("/badzone"), "2024-05-01T10:00:00+25:00"),
            (site.url("/year0"), "0000-01-01"),
        ]), "application/xml")

    no_sample = {"INCREMENTAL_LASTMOD_RECHECK_SHARE": 0}
    publish("2024-05-01T10:00:00Z", "2024-05-01 10:00:00")
    first = await crawl(SitemapPagesSpider, settings=no_sample, sitemap_url=site.url("/s.xml"))
    assert first.stats.get_value("incremental/lastmod/invalid") == 2
    assert first.stats.get_value("finish_reason") == "finished"
    assert not first.stats.get_value("spider_exceptions")

    # The same instants, written in other zones and forms: nothing moved.
    publish("2024-05-01T12:00:00+02:00", "2024-05-01T10:00:00")
    site.reset_log()
    second = await crawl(SitemapPagesSpider, settings=no_sample, sitemap_url=site.url("/s.xml"))
    # Refused lastmods are no lastmods: those pages go by their schedule
    # (revisits off: due) and a conditional request.
    assert requested_pages_of(site, *paths) == ["/badzone", "/year0"]
    assert second.stats.get_value("incremental/schedule/skipped/lastmod_unchanged") == 3

    # /zoneless moved by a minute (still UTC); /zoned by an hour, written
    # in US time: -04:00.
    site.change("/zoned")
    site.change("/zoneless")
    publish("2024-05-01T07:00:00-04:00", "2024-05-01T10:01")
    site.reset_log()
    third = await crawl(SitemapPagesSpider, settings=no_sample, sitemap_url=site.url("/s.xml"))
    assert requested_pages_of(site, "/zoned", "/zoneless", "/dated") == ["/zoned", "/zoneless"]
    assert third.stats.get_value("incremental/schedule/requested/lastmod_newer") == 2


@pytest_twisted.ensureDeferred
async def test_hostile_sitemap_entries_are_skipped_and_the_rest_still_counts(site, crawl):
    site.add_page("/good", "strong", size=1500)
    site.add_page("/good2", "strong", size=1500)
    entries = [
        ("/relative", None),
        ("javascript:alert(1)", None),
        ("file:///etc/passwd", None),
        ("http://elsewhere.invalid/page", None),
        (site.url("/" + "x" * 2100), None),
        (site.url("/good"), None),
        (site.url("/good"), None),  # listed twice
        (site.url("/good2"), None),
    ]
    site.add_document("/s.xml", urlset(entries), "application/xml")
    # Billion laughs and an external entity: lxml must not expand them.
    laughs = (
        '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
        '<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">'
        '<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">'
        '<!ENTITY xxe SYSTEM "file:///etc/hostname">]>'
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        f'<url><loc>{site.url("/good2")}&lol3;&xxe;</loc></url></urlset>'
    )
    site.add_document("/evil.xml.gz", gzip.compress(laughs.encode()), "application/gzip")
    index = ('<?xml version="1.0"?><sitemapindex '
             'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
             f'<sitemap><loc>{site.url("/s.xml")}</loc></sitemap>'
             f'<sitemap><loc>{site.url("/evil.xml.gz")}</loc></sitemap>'
             f'<sitemap><loc>{site.url("/index.xml")}</loc></sitemap>'  # itself
             '</sitemapindex>')
    site.add_document("/index.xml", index, "application/xml")
    crawler = await crawl(SitemapPagesSpider, sitemap_url=site.url("/index.xml"))
    stats = crawler.stats
    assert crawler.stats.get_value("finish_reason") == "finished"
    for reason, count in [("relative", 1), ("scheme", 2), ("other_host", 1), ("too_long", 1)]:
        assert stats.get_value(f"incremental/sitemap/loc_rejected/{reason}") == count, reason
    assert stats.get_value("incremental/sitemap/duplicate_loc") == 1
    assert sorted(r.path for r in site.log if r.path.startswith("/good")) == ["/good", "/good2"]
    # The index listing itself was fetched once.
    assert len([r for r in site.log if r.path == "/index.xml"]) == 1
    assert not [r for r in site.log if "lol" in r.path or "etc" in r.path]


def sitemap_index(site, children: list[tuple[str, str]]) -> str:
    rows = "".join(f"<sitemap><loc>{site.url(path)}</loc><lastmod>{lastmod}</lastmod></sitemap>"
                   for path, lastmod in children)
    return ('<?xml version="1.0"?><sitemapindex '
            f'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{rows}</sitemapindex>')


@pytest_twisted.ensureDeferred
async def test_sitemaps_are_conditional_and_unchanged_children_are_not_read(site, crawl):
    for path in ("/a", "/b"):
        site.add_page(path, "strong", size=1500)
    site.add_document("/one.xml", urlset([(site.url("/a"), "2024-01-01")]),
                      "application/xml", etag='"one-1"')
    site.add_document("/two.xml", urlset([(site.url("/b"), "2024-01-01")]),
                      "application/xml", etag='"two-1"')
    site.add_document("/index.xml", sitemap_index(site, [("/one.xml", "2024-01-01"),
                                                         ("/two.xml", "2024-01-01")]),
                      "application/xml", etag='"index-1"')
    settings = {"INCREMENTAL_REVISIT_ENABLED": True}
    await crawl(SitemapPagesSpider, settings=settings, sitemap_url=site.url("/index.xml"))

    # Nothing changed: the index answers 304; the lists it named when last
    # read are its lists still (their memberships on record): none is read.
    site.reset_log()
    second = await crawl(SitemapPagesSpider, settings=settings,
                         sitemap_url=site.url("/index.xml"))
    assert [(r.path, r.status) for r in site.log if r.path != "/robots.txt"] == [
        ("/index.xml", 304)]
    assert second.stats.get_value("incremental/discovery/not_modified") == 1
    assert second.stats.get_value("incremental/sitemap/child_unchanged") == 2

    # /b changes; its sitemap and the index say so. /one.xml is not read.
    site.change("/b")
    site.add_document("/two.xml", urlset([(site.url("/b"), "2024-03-01")]),
                      "application/xml", etag='"two-2"')
    site.add_document("/index.xml", sitemap_index(site, [("/one.xml", "2024-01-01"),
                                                         ("/two.xml", "2024-03-01")]),
                      "application/xml", etag='"index-2"')
    site.reset_log()
    third = await crawl(SitemapPagesSpider, settings=settings, sitemap_url=site.url("/index.xml"))
    assert sorted((r.path, r.status) for r in site.log if r.path != "/robots.txt") == [
        ("/b", 200), ("/index.xml", 200), ("/two.xml", 200)]
    assert third.stats.get_value("incremental/sitemap/child_unchanged") == 1
    assert [i["url"] for i in third.collected] == [site.url("/b")]


@pytest_twisted.ensureDeferred
async def test_a_crawl_that_does_not_finish_keeps_no_sitemap_validators(site, crawl, state_db):
    for i in range(6):
        site.add_page(f"/p/{i}", "strong", size=1500)
    entries = [(site.url(f"/p/{i}"), "2024-01-01") for i in range(6)]
    site.add_document("/s.xml", urlset(entries), "application/xml", etag='"s-1"')
    stopped = await crawl(SitemapPagesSpider,
                          settings={"CLOSESPIDER_ITEMCOUNT": 1, "CONCURRENT_REQUESTS": 1},
                          sitemap_url=site.url("/s.xml"))
    assert stopped.stats.get_value("finish_reason") == "closespider_itemcount"
    stored = {url for (url,) in state_db("SELECT url FROM pages WHERE etag IS NOT NULL")}
    assert site.url("/s.xml") not in stored
    missing = {f"/p/{i}" for i in range(6)} - {u.removeprefix(site.base_url) for u in stored}
    assert missing  # the stop really left pages behind
    site.reset_log()
    # The sitemap is read in full again, so the pages the stopped crawl never
    # reached are found.
    await crawl(SitemapPagesSpider, sitemap_url=site.url("/s.xml"))
    [sitemap] = [r for r in site.log if r.path == "/s.xml"]
    assert sitemap.if_none_match is None and sitemap.status == 200
    fetched = {r.path for r in site.log if r.path.startswith("/p/") and r.status == 200}
    assert missing <= fetched


@pytest_twisted.ensureDeferred
async def test_a_page_that_failed_keeps_its_sitemap_from_answering_304(site, crawl):
    for i in range(3):
        site.add_page(f"/p/{i}", "strong", size=1500)
    entries = [(site.url(f"/p/{i}"), "2024-01-01") for i in range(3)]
    site.add_document("/s.xml", urlset(entries), "application/xml", etag='"s-1"')
    site.override("/p/1", status=503)
    first = await crawl(SitemapPagesSpider, settings={"RETRY_TIMES": 1},
                        sitemap_url=site.url("/s.xml"))
    assert first.stats.get_value("finish_reason") == "finished"
    assert first.stats.get_value("incremental/discovery_committed") is None
    site.clear_override("/p/1")
    site.reset_log()
    await crawl(SitemapPagesSpider, sitemap_url=site.url("/s.xml"))
    [sitemap] = [r for r in site.log if r.path == "/s.xml"]
    assert sitemap.if_none_match is None and sitemap.status == 200
    assert [(r.path, r.status) for r in site.log if r.path == "/p/1"] == [("/p/1", 200)]


@pytest_twisted.ensureDeferred
async def test_a_sitemap_whose_lastmods_lie_stops_being_trusted(site, crawl, state_db):
    paths = [f"/p/{i}" for i in range(6)]
    for path in paths:
        site.add_page(path, "strong", size=1500)
    settings = {"INCREMENTAL_LASTMOD_MIN_SAMPLES": 4}

    def publish(n: int) -> None:
        publish_moving_lastmods(site, paths, n)

    publish(1)
    await crawl(SitemapPagesSpider, settings=settings, sitemap_url=site.url("/s.xml"))
    publish(2)
    lied = await crawl(SitemapPagesSpider, settings=settings, sitemap_url=site.url("/s.xml"))
    assert lied.stats.get_value("incremental/lastmod/lied") >= 4
    assert lied.stats.get_value("incremental/lastmod/hosts_distrusted") == 1
    [(until,)] = state_db("SELECT distrusted_until FROM hosts")
    assert until > 0

    publish(3)
    site.reset_log()
    third = await crawl(SitemapPagesSpider, settings=settings, sitemap_url=site.url("/s.xml"))
    # Distrusted: lastmod no longer decides; every page goes by its revisit
    # schedule (off here: always due) and gets a conditional request (304s
    # here), and the moving lastmods are not recorded.
    assert third.stats.get_value("incremental/lastmod/distrusted_sitemaps") == 1
    assert third.stats.get_value("incremental/schedule/requested/due") == 6
    assert sorted((r.path, r.status) for r in site.log if r.path.startswith("/p/")) == [
        (p, 304) for p in paths]


@pytest_twisted.ensureDeferred
async def test_lastmods_that_are_the_generation_time_are_not_trusted(site, crawl):
    paths = [f"/p/{i}" for i in range(12)]
    for path in paths:
        site.add_page(path, "strong", size=1500)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    site.add_document("/s.xml", urlset([(site.url(p), now) for p in paths]), "application/xml")
    first = await crawl(SitemapPagesSpider, sitemap_url=site.url("/s.xml"))
    assert first.stats.get_value("incremental/lastmod/hosts_distrusted") == 1
    assert first.stats.get_value("incremental/schedule/requested/new") == 12


@pytest_twisted.ensureDeferred
async def test_a_304_sitemap_yields_only_the_pages_due_for_a_revisit(site, crawl, state_db):
    for path in ("/due", "/later"):
        site.add_page(path, "strong", size=1500)
    entries = [(site.url("/due"), None), (site.url("/later"), None)]
    site.add_document("/s.xml", urlset(entries), "application/xml", etag='"s-1"')
    settings = {"INCREMENTAL_REVISIT_ENABLED": True}
    first = await crawl(SitemapPagesSpider, settings=settings, sitemap_url=site.url("/s.xml"))
    # Every list was read: nothing is due, nothing re-seeded.
    assert first.stats.get_value("incremental/reseeded") == 0
    state_db("UPDATE pages SET next_visit = 0 WHERE url = ?", site.url("/due"))
    site.reset_log()
    second = await crawl(SitemapPagesSpider, settings=settings, sitemap_url=site.url("/s.xml"))
    assert sorted((r.path, r.status) for r in site.log if r.path != "/robots.txt") == [
        ("/due", 304), ("/s.xml", 304)]
    assert second.stats.get_value("incremental/reseeded") == 1


@pytest_twisted.ensureDeferred
async def test_moving_lastmods_of_noisy_pages_that_did_not_change_are_lies(site, crawl):
    # Pages without validators and with a per-response timestamp: each
    # fetch's raw body differs, but their items do not. A sitemap moving
    # their lastmods without a change lies, and is caught.
    paths = [f"/n/{i}" for i in range(6)]
    for path in paths:
        site.add_page(path, "noisy", size=1500)
    settings = {"INCREMENTAL_LASTMOD_MIN_SAMPLES": 4}

    def publish(n: int) -> None:
        publish_moving_lastmods(site, paths, n)

    publish(1)
    await crawl(SitemapPagesSpider, settings=settings, sitemap_url=site.url("/s.xml"))
    publish(2)
    lied = await crawl(SitemapPagesSpider, settings=settings, sitemap_url=site.url("/s.xml"))
    assert lied.collected == []
    assert lied.stats.get_value("incremental/lastmod/lied") >= 4
    assert lied.stats.get_value("incremental/lastmod/hosts_distrusted") == 1
