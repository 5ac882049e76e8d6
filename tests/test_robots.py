"""robots.txt that cannot be read is complete disallow for its host (RFC 9309 §2.3.1.4).

Real crawls against the loopback site, whose robots.txt is made to answer
an error; the default politeness (throttle, Retry-After) is on, as users
run it. Also: the ``Sitemap:`` lines of robots.txt, in the spellings the big
crawlers accept.
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
import pytest_twisted
from scrapy import Request, signals
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.task import deferLater

from incremental_crawler.lists.robots import sitemap_urls_from_robots
from incremental_crawler.politeness import robots
from incremental_crawler.politeness.robots import ROBOTS_RETRY_AFTER
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from tests.site import LoopbackSite
from tests.test_failures import at, sitemap_xml
from tests.waiting import until

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

PAGES = [f"/p/{i}" for i in range(4)]
# The politeness users get; RETRY_TIMES is Scrapy's default, named for the count.
# Through the per-domain override a user has, the loopback sites' window
# starts at 20 requests/s instead of 4, and its backoff (the wait after a 503
# or 429 without Retry-After) at 50 ms instead of 1 s: what is waited for,
# and how often, stays the same, in a fraction of the time. Each crawl starts
# there, not at the rate the last one ended at (a window cut by robots.txt's
# errors paced the next crawls of a test at 3 requests/s).
SETTINGS = {"INCREMENTAL_THROTTLE_ENABLED": True, "RETRY_TIMES": 2,
            "INCREMENTAL_THROTTLE_DOMAINS": {
                "127.0.0.1": {"start_rate": 20.0, "backoff_base": 0.05}},
            "INCREMENTAL_THROTTLE_REMEMBER_FOR": 0}


def robots_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.getMessage().startswith("robots.txt of")]


def gets(site: Any) -> list[str]:
    return [r.path for r in site.log if r.method == "GET"]


@pytest.mark.parametrize("status", [500, 503, 429])
@pytest_twisted.ensureDeferred
async def test_robots_txt_answering_an_error_disallows_its_host_for_the_crawl(
    site, crawl, caplog, status,
):
    for path in PAGES:
        site.add_page(path, "strong", size=1500)
    site.override("/robots.txt", status=status)
    with caplog.at_level("WARNING"):
        crawler = await crawl(SitemapPagesSpider, settings=SETTINGS,
                              sitemap_url=site.url("/sitemap.xml"))
    # robots.txt asked with RetryMiddleware's two retries, after two
    # Retry-After waits for a 429 or 503 (not ten: a 503 used to be waited
    # out for minutes), then nothing else.
    waits = ROBOTS_RETRY_AFTER if status in (429, 503) else 0
    assert gets(site) == ["/robots.txt"] * (3 + waits)
    stats = crawler.stats.get_stats()
    assert stats["incremental/robotstxt/unavailable"] == 1
    assert stats["incremental/robotstxt/refused"] == 1  # the sitemap
    assert stats["incremental/failures_unrecorded"] == 1
    host = site.url("/").split("/")[2]
    assert robots_warnings(caplog) == [
        (f"robots.txt of {host} could not be read (it answered {status}): every request "
         f"to {host} is refused (RFC 9309: complete disallow) until it can be read; it is "
         "asked again in 300 s at the earliest, and by the next crawl"),
    ]
    # The next crawl asks again; robots.txt is back: everything is fetched.
    site.clear_override("/robots.txt")
    site.log.clear()
    crawler = await crawl(SitemapPagesSpider, settings=SETTINGS,
                          sitemap_url=site.url("/sitemap.xml"))
    assert sorted(p for p in gets(site) if p.startswith("/p/")) == PAGES
    assert "incremental/robotstxt/unavailable" not in crawler.stats.get_stats()


@pytest.mark.parametrize("status", [404, 403, 410])
@pytest_twisted.ensureDeferred
async def test_robots_txt_answering_4xx_allows_everything(site, crawl, status):
    for path in PAGES:
        site.add_page(path, "strong", size=1500)
    site.override("/robots.txt", status=status)
    crawler = await crawl(SitemapPagesSpider, settings=SETTINGS,
                          sitemap_url=site.url("/sitemap.xml"))
    assert sorted(p for p in gets(site) if p.startswith("/p/")) == PAGES
    assert "incremental/robotstxt/unavailable" not in crawler.stats.get_stats()


@pytest.mark.parametrize("status", [404, 410])
@pytest_twisted.ensureDeferred
async def test_robots_txt_answering_4xx_with_rules_in_its_body_allows_everything(
    site, crawl, status,
):
    # RFC 9309 §2.3.1.3: a 4xx is "no robots.txt", whatever its body holds
    # (a site's error page that is a copy of a robots.txt).
    for path in PAGES:
        site.add_page(path, "strong", size=1500)
    site.override("/robots.txt", status=status, body="User-agent: *\nDisallow: /\n")
    crawler = await crawl(SitemapPagesSpider, settings=SETTINGS,
                          sitemap_url=site.url("/sitemap.xml"))
    assert sorted(p for p in gets(site) if p.startswith("/p/")) == PAGES
    assert "robotstxt/forbidden" not in crawler.stats.get_stats()


@pytest.mark.parametrize("robots_txt", [
    # RFC 9309 §2.2.1: the product token is what the value starts with.
    "User-agent: Scrapy/2.0 (+https://scrapy.org)\nDisallow: /p/1\n",
    # §2.2.4: a line that is no rule does not end the run of user agents.
    "User-agent: Scrapy\nNoindex: /p/2\nUser-agent: other\nDisallow: /p/1\n",
], ids=["agent-with-a-version", "unknown-line-in-the-group"])
@pytest_twisted.ensureDeferred
async def test_robots_txt_groups_are_read_as_rfc_9309_says(site, crawl, robots_txt):
    # Scrapy's default parser (Protego) read both as "no group for Scrapy":
    # everything allowed.
    for path in PAGES:
        site.add_page(path, "strong", size=1500)
    site.robots_txt = robots_txt
    crawler = await crawl(SitemapPagesSpider, settings=SETTINGS,
                          sitemap_url=site.url("/sitemap.xml"))
    assert sorted(p for p in gets(site) if p.startswith("/p/")) == ["/p/0", "/p/2", "/p/3"]
    assert crawler.stats.get_value("robotstxt/forbidden") == 1


@pytest_twisted.ensureDeferred
async def test_a_projects_own_robots_txt_parser_wins(site, crawl):
    for path in PAGES:
        site.add_page(path, "strong", size=1500)
    site.robots_txt = "User-agent: Scrapy\nNoindex: /p/2\nUser-agent: other\nDisallow: /p/1\n"
    crawler = await crawl(SitemapPagesSpider, sitemap_url=site.url("/sitemap.xml"), settings={
        **SETTINGS, "ROBOTSTXT_PARSER": "scrapy.robotstxt.ProtegoRobotParser"})
    assert sorted(p for p in gets(site) if p.startswith("/p/")) == PAGES
    assert crawler.stats.get_value("robotstxt/forbidden") is None


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest_twisted.ensureDeferred
async def test_a_host_that_does_not_answer_robots_txt_is_not_crawled(crawl, caplog):
    port = closed_port()
    with caplog.at_level("WARNING"):
        crawler = await crawl(SitemapPagesSpider, settings={**SETTINGS, "RETRY_TIMES": 1},
                              sitemap_url=f"http://127.0.0.1:{port}/sitemap.xml")
    stats = crawler.stats.get_stats()
    # Two attempts at robots.txt, the sitemap never asked.
    assert stats["downloader/request_count"] == 2
    assert stats["incremental/robotstxt/unavailable"] == 1
    assert stats["incremental/robotstxt/refused"] == 1
    [warning] = robots_warnings(caplog)
    assert f"robots.txt of 127.0.0.1:{port} could not be read (no answer: " in warning


@pytest_twisted.ensureDeferred
async def test_pages_refused_on_another_host_keep_the_sitemap_unsaved(site, crawl):
    # The sitemap's host is fine; the pages it lists are on a host whose
    # robots.txt fails. The sitemap answers 304 when unchanged: saving its
    # ETag would hide the refused pages from the next crawl.
    other = LoopbackSite()
    other.start()
    try:
        for path in PAGES:
            other.add_page(path, "strong", size=1500)
        other.override("/robots.txt", status=503)
        site.add_document("/sitemap.xml", sitemap_xml(other, PAGES), "application/xml",
                          etag='"sm-1"')
        crawler = await crawl(SitemapPagesSpider, settings=SETTINGS,
                              sitemap_url=site.url("/sitemap.xml"))
        assert gets(other) == ["/robots.txt"] * (3 + ROBOTS_RETRY_AFTER)
        assert crawler.stats.get_value("incremental/robotstxt/refused") == len(PAGES)
        other.clear_override("/robots.txt")
        other.log.clear()
        site.log.clear()
        await crawl(SitemapPagesSpider, settings=SETTINGS,
                    sitemap_url=site.url("/sitemap.xml"))
        # Read in full (no ETag was saved), and every page fetched now.
        assert [r.status for r in site.requests_for("/sitemap.xml")] == [200]
        assert sorted(p for p in gets(other) if p.startswith("/p/")) == PAGES
    finally:
        await other.stop()


@pytest_twisted.ensureDeferred
async def test_requests_waiting_for_robots_txt_all_obey_it(site, crawl):
    # Several pages wait while robots.txt is fetched; each must get its
    # answer (with Scrapy's middleware only the first waiter does: the
    # others are let through as if there were no robots.txt).
    other = LoopbackSite()
    other.start()
    try:
        for path in PAGES:
            other.add_page(path, "strong", size=1500)
        other.robots_txt = "User-agent: *\nDisallow: /p/\n"
        other.slow("/robots.txt", 0.3)
        site.add_document("/sitemap.xml", sitemap_xml(other, PAGES), "application/xml")
        crawler = await crawl(SitemapPagesSpider, sitemap_url=site.url("/sitemap.xml"))
        assert gets(other) == ["/robots.txt"]
        assert crawler.stats.get_value("robotstxt/forbidden") == len(PAGES)
    finally:
        await other.stop()


@pytest_twisted.ensureDeferred
async def test_sitemap_lines_in_the_spellings_google_accepts(site, crawl):
    # Google's robots.txt parser (github.com/google/robotstxt, robots.cc:
    # KeyIsSitemap, and robots_test.cc ID_UTF8ByteOrderMarkIsSkipped,
    # ID_LineSyntax_Line) accepts "Site-map", a BOM, and a key separated
    # by whitespace; Scrapy's sitemap_urls_from_robots misses all three.
    for path in PAGES:
        site.add_page(path, "strong", size=1500)
    site.add_document("/a.xml", sitemap_xml(site, PAGES[:2]), "application/xml")
    site.add_document("/b.xml", sitemap_xml(site, PAGES[2:3]), "application/xml")
    site.add_document("/c.xml", sitemap_xml(site, PAGES[3:]), "application/xml")
    site.robots_txt = "\ufeffSite-map: /a.xml\r\nSitemap /b.xml\rUser-agent: *\rsitemap: c.xml\r"
    await crawl(SitemapPagesSpider, sitemap_url=site.url("/robots.txt"))
    assert sorted(p for p in gets(site) if p.startswith("/p/")) == PAGES


def test_sitemap_urls_are_absolute_unique_and_in_file_order():
    body = b"\xef\xbb\xbfSITEMAP: /b.xml # comment\nSite-map: http://h/a.xml\nsitemap: /b.xml\n"
    assert sitemap_urls_from_robots(body, base_url="http://h/robots.txt") == [
        "http://h/b.xml", "http://h/a.xml"]


@pytest_twisted.ensureDeferred
async def test_refused_pages_are_recorded_and_re_seeded_with_their_sitemap_saved(
    site, crawl, state_db,
):
    # With re-seeding on (revisits on, as users run it), a refused page is a
    # failure recorded like any other: due next crawl, with the callback
    # that requests it again. So the sitemap's ETag is saved (not read in
    # full on every crawl while one host's robots.txt fails), and the next
    # crawl gets it back from its record though the sitemap answers 304.
    settings = {**SETTINGS, "INCREMENTAL_REVISIT_ENABLED": True}
    other = LoopbackSite()
    other.start()
    try:
        for path in PAGES:
            other.add_page(path, "strong", size=1500)
        other.override("/robots.txt", status=503)
        site.add_document("/sitemap.xml", sitemap_xml(other, PAGES), "application/xml",
                          etag='"sm-1"')
        crawler = await crawl(SitemapPagesSpider, settings=settings,
                              sitemap_url=site.url("/sitemap.xml"))
        stats = crawler.stats.get_stats()
        assert stats["incremental/robotstxt/refused"] == len(PAGES)
        assert "incremental/failures_unrecorded" not in stats
        assert sorted(state_db("SELECT url, last_status, failures, callback FROM pages "
                               "WHERE url LIKE ?", other.url("/p/%"))) == [
            (other.url(path), 0, 1, "parse") for path in PAGES]
        other.clear_override("/robots.txt")
        other.log.clear()
        site.log.clear()
        await crawl(SitemapPagesSpider, settings=settings, sitemap_url=site.url("/sitemap.xml"))
        assert [r.status for r in site.requests_for("/sitemap.xml")] == [304]
        assert sorted(p for p in gets(other) if p.startswith("/p/")) == PAGES
    finally:
        await other.stop()


@pytest_twisted.ensureDeferred
async def test_a_recorded_page_robots_txt_forbids_backs_off_instead_of_being_re_seeded_each_crawl(
    site, crawl, state_db, monkeypatch,
):
    # Refused while robots.txt was down, the pages got failure records the
    # re-seeder asks for. robots.txt comes back and forbids them: unless
    # that is recorded too, they stay due and are re-seeded (and forbidden)
    # on every crawl for ever. Recorded as a failure, each backs off (a day
    # after a second failure: INCREMENTAL_REVISIT_INITIAL), and is fetched
    # once it is due and robots.txt allows it.
    settings = {**SETTINGS, "INCREMENTAL_REVISIT_ENABLED": True}
    other = LoopbackSite()
    other.start()

    def rows() -> list[tuple[str, int, int]]:
        return sorted(state_db("SELECT url, last_status, failures FROM pages WHERE url LIKE ?",
                               other.url("/p/%")))

    try:
        for path in PAGES:
            other.add_page(path, "strong", size=1500)
        other.override("/robots.txt", status=503)
        site.add_document("/sitemap.xml", sitemap_xml(other, PAGES), "application/xml",
                          etag='"sm-1"')
        at(monkeypatch, 0)
        await crawl(SitemapPagesSpider, settings=settings, sitemap_url=site.url("/sitemap.xml"))
        assert rows() == [(other.url(path), 0, 1) for path in PAGES]
        other.clear_override("/robots.txt")
        other.robots_txt = "User-agent: *\nDisallow: /p/\n"

        crawler = await crawl(SitemapPagesSpider, settings=settings,
                              sitemap_url=site.url("/sitemap.xml"))
        stats = crawler.stats.get_stats()
        assert stats["incremental/reseeded"] == len(PAGES)
        assert stats["robotstxt/forbidden"] == len(PAGES)
        assert stats["incremental/robotstxt/forbidden_recorded"] == len(PAGES)
        assert "incremental/failures_unrecorded" not in stats
        assert rows() == [(other.url(path), 0, 2) for path in PAGES]

        # The next crawls, before the back-off ends, ask nothing of them.
        for offset in (0, 3600):
            at(monkeypatch, offset)
            crawler = await crawl(SitemapPagesSpider, settings=settings,
                                  sitemap_url=site.url("/sitemap.xml"))
            stats = crawler.stats.get_stats()
            assert stats.get("incremental/reseeded", 0) == 0
            assert "robotstxt/forbidden" not in stats
            assert rows() == [(other.url(path), 0, 2) for path in PAGES]

        # Two days later robots.txt allows them: due again, re-seeded, fetched.
        other.robots_txt = "User-agent: *\nDisallow: /private/\n"
        other.log.clear()
        at(monkeypatch, 2 * 86400)
        crawler = await crawl(SitemapPagesSpider, settings=settings,
                              sitemap_url=site.url("/sitemap.xml"))
        assert crawler.stats.get_value("incremental/reseeded") == len(PAGES)
        assert sorted(p for p in gets(other) if p.startswith("/p/")) == PAGES
        assert rows() == [(other.url(path), 200, 0) for path in PAGES]
    finally:
        await other.stop()


def sitemap_index(site: Any, paths: list[str]) -> str:
    entries = "".join(f"<sitemap><loc>{site.url(path)}</loc></sitemap>" for path in paths)
    return ('<?xml version="1.0" encoding="UTF-8"?><sitemapindex '
            f'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{entries}</sitemapindex>')


@pytest_twisted.ensureDeferred
async def test_an_unavailable_robots_txt_is_asked_again_after_a_while(
    site, crawl, monkeypatch,
):
    # robots.txt fails, then is fixed. The pages come in three waves (three
    # sitemaps, the answers to two of them held back): the first is
    # refused; the second, past the re-check delay, is refused too while
    # robots.txt is asked again; the third, once it was, is fetched.
    # Without the re-check the whole crawl would be refused.
    monkeypatch.setattr(robots, "ROBOTS_RECHECK_AFTER", 0.5)
    other = LoopbackSite()
    other.start()
    try:
        for path in PAGES:
            other.add_page(path, "strong", size=1500)
        other.override("/robots.txt", status=503)
        site.add_document("/sitemap.xml", sitemap_index(site, ["/a.xml", "/b.xml", "/c.xml"]),
                          "application/xml")
        site.add_document("/a.xml", sitemap_xml(other, PAGES[:1]), "application/xml")
        site.add_document("/b.xml", sitemap_xml(other, PAGES[1:2]), "application/xml")
        site.add_document("/c.xml", sitemap_xml(other, PAGES[2:]), "application/xml")
        site.hold("/b.xml")
        site.hold("/c.xml")
        crawling = ensureDeferred(crawl(SitemapPagesSpider, settings={"RETRY_TIMES": 0},
                                        sitemap_url=site.url("/sitemap.xml")))
        await until(lambda: site.requests_for("/a.xml") and other.requests_for("/robots.txt"),
                    "the first wave to meet robots.txt's 503")
        await deferLater(reactor, robots.ROBOTS_RECHECK_AFTER)
        other.clear_override("/robots.txt")
        site.release("/b.xml")
        await until(lambda: len(other.requests_for("/robots.txt")) == 2,
                    "robots.txt to be asked again")
        site.release("/c.xml")
        crawler = await crawling
        assert gets(other)[:2] == ["/robots.txt", "/robots.txt"]
        assert sorted(gets(other)[2:]) == PAGES[2:]
        assert [r.status for r in other.requests_for("/robots.txt")] == [503, 200]
        stats = crawler.stats.get_stats()
        assert stats["incremental/robotstxt/refused"] == 2
        assert stats["incremental/robotstxt/rechecks"] == 1
    finally:
        await other.stop()


@pytest_twisted.ensureDeferred
async def test_a_long_retry_after_on_robots_txt_is_not_waited_for(site, crawl):
    # Retry-After: 60 is below INCREMENTAL_THROTTLE_RETRY_AFTER_MAX (the host
    # is not parked): a page would wait for it, robots.txt does not (more
    # than ROBOTS_WAIT_MAX): its answer is final, the host unavailable.
    assert robots.ROBOTS_WAIT_MAX < 60
    for path in PAGES:
        site.add_page(path, "strong", size=1500)
    site.override("/robots.txt", status=503, headers={"Retry-After": "60"})
    crawler = await crawl(SitemapPagesSpider, settings=SETTINGS,
                          sitemap_url=site.url("/sitemap.xml"))
    assert gets(site) == ["/robots.txt"]
    stats = crawler.stats.get_stats()
    assert stats["incremental/robotstxt/unavailable"] == 1
    assert stats["incremental/robotstxt/refused"] == 1


class RobotsAttempts:
    """Extension: the meta of every robots.txt request reaching the downloader (retries too)."""

    seen: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def __init__(self, crawler: Crawler) -> None:
        crawler.signals.connect(self.reached, signal=signals.request_reached_downloader)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RobotsAttempts:
        return cls(crawler)

    def reached(self, request: Request, spider: Any = None) -> None:
        if request.url.endswith("/robots.txt"):
            self.seen.append((request.url, dict(request.meta)))


@pytest_twisted.ensureDeferred
async def test_asking_robots_txt_again_is_one_short_attempt(site, crawl, monkeypatch):
    # robots.txt fails (503), then hangs. When it is asked again, every page
    # was refused already and no request waits for the answer, but the
    # crawl cannot finish while it is in the downloader: it is one attempt
    # (no retry), with a timeout of ROBOTS_WAIT_MAX, not RETRY_TIMES + 1
    # attempts of DOWNLOAD_TIMEOUT each (minutes, by default).
    monkeypatch.setattr(robots, "ROBOTS_RECHECK_AFTER", 0.5)
    monkeypatch.setattr(robots, "ROBOTS_WAIT_MAX", 1.0)
    monkeypatch.setattr(RobotsAttempts, "seen", [])
    other = LoopbackSite()
    other.start()
    try:
        for path in PAGES:
            other.add_page(path, "strong", size=1500)
        other.override("/robots.txt", status=503)
        site.add_document("/sitemap.xml", sitemap_index(site, ["/a.xml", "/b.xml"]),
                          "application/xml")
        site.add_document("/a.xml", sitemap_xml(other, PAGES[:1]), "application/xml")
        site.add_document("/b.xml", sitemap_xml(other, PAGES[1:]), "application/xml")
        site.slow("/b.xml", 1.5)
        # From 1 s on robots.txt does not answer (a server going down).
        reactor.callLater(1.0, other.slow, "/robots.txt", 60.0)  # type: ignore[attr-defined]
        crawler = await crawl(
            SitemapPagesSpider,
            settings={"RETRY_TIMES": 2, "DOWNLOAD_TIMEOUT": 4,
                      "EXTENSIONS": {f"{__name__}.RobotsAttempts": 0}},
            sitemap_url=site.url("/sitemap.xml"))
        stats = crawler.stats.get_stats()
        assert stats["incremental/robotstxt/rechecks"] == 1
        assert stats["incremental/robotstxt/refused"] == len(PAGES)
        # The first ask: three attempts (503s) with the crawl's timeout;
        # asking again: one, with the short one.
        assert [r.status for r in other.requests_for("/robots.txt")] == [503] * 3
        assert [(m["download_timeout"], m.get("dont_retry", False))
                for url, m in RobotsAttempts.seen
                if url == other.url("/robots.txt")] == [(4, False)] * 3 + [(1.0, True)]
        assert stats["downloader/exception_type_count/scrapy.exceptions.DownloadTimeoutError"] == 1
    finally:
        await other.stop()


@pytest_twisted.ensureDeferred
async def test_a_gone_page_robots_txt_forbids_at_its_recheck_waits_for_the_next_one(
    site, crawl, state_db, monkeypatch,
):
    # A gone page is re-seeded when its rare recheck is due. Forbidden then,
    # it is no failure: it stays gone and its next recheck is a period later
    # (left due, it would be re-seeded and forbidden on every crawl).
    day, recheck = 86400, 30 * 86400
    settings = {**SETTINGS, "INCREMENTAL_REVISIT_ENABLED": True, "INCREMENTAL_MAX_AGE": 0}
    for path in PAGES[:2]:
        site.add_page(path, "strong", size=1500)
    # An ETag: the sitemap answers 304, only the re-seeder asks its pages.
    site.add_document("/sitemap.xml", sitemap_xml(site, PAGES[:2]), "application/xml",
                      etag='"sm-1"')

    def gone_row() -> tuple[int, int, int]:
        [row] = state_db("SELECT flags & 128, failures, next_visit FROM pages WHERE url = ?",
                         site.url("/p/1"))
        return row

    async def run(offset: float) -> Crawler:
        at(monkeypatch, offset)
        return await crawl(SitemapPagesSpider, settings=settings,
                           sitemap_url=site.url("/sitemap.xml"))

    await run(0)
    site.override("/p/1", status=410)
    await run(2 * day)
    flagged, failures, next_visit = gone_row()
    assert (flagged, failures) == (128, 0)
    site.robots_txt = "User-agent: *\nDisallow: /p/1\n"

    crawler = await run(2 * day + recheck + 60)
    stats = crawler.stats.get_stats()
    assert stats["robotstxt/forbidden"] == 1
    assert stats["incremental/robotstxt/forbidden_recorded"] == 1
    flagged, failures, later = gone_row()
    assert (flagged, failures) == (128, 0)
    assert later >= next_visit + recheck

    site.log.clear()
    crawler = await run(2 * day + recheck + 120)
    assert "robotstxt/forbidden" not in crawler.stats.get_stats()
    assert "/p/1" not in gets(site)
