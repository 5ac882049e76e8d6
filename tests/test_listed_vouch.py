"""A listed date vouches for a page only while a list still gives it (real crawls).

A page whose trusted modification date did not move is not requested. Once
its sitemap or feed no longer lists it (the list changed and was read in
full), that date says nothing any more: the page goes by its revisit
schedule, so its edit or its deletion is found when it is due, whether the
list answers 304 then or is read in full in that very crawl. A page still
listed with an unmoved date is still not asked.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted

from incremental_crawler.spiders.feed import FeedPagesSpider
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from tests.clock_util import DAY, later
from tests.test_feed import atom
from tests.test_lastmod import urlset

both_stores = pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)
only_sqlite = pytest.mark.parametrize("state_uri", ["sqlite"], indirect=True)

SETTINGS = {
    "INCREMENTAL_REVISIT_ENABLED": True,
    "INCREMENTAL_REVISIT_INITIAL": DAY,
    "INCREMENTAL_REVISIT_MIN": 3600,
    # No rotating sample, no sampled full re-check: what is asked is exact.
    "INCREMENTAL_LASTMOD_RECHECK_SHARE": 0,
    "INCREMENTAL_RECHECK_EVERY": 0,
}
DATE = "2024-01-01T10:00:00Z"


def publish(site: Any, kind: str, paths: list[str], etag: str) -> None:
    """The list at /list: a sitemap or an Atom feed, every entry dated DATE
    (a modification date in both)."""
    entries = [(path, DATE) for path in paths]
    if kind == "sitemap":
        site.add_document("/list", urlset([(site.url(p), d) for p, d in entries]),
                          "application/xml", etag=etag)
    else:
        site.add_document("/list", atom(site, entries), "application/atom+xml", etag=etag)


async def crawl_list(crawl: Any, kind: str, site: Any) -> Any:
    if kind == "sitemap":
        return await crawl(SitemapPagesSpider, settings=SETTINGS, sitemap_url=site.url("/list"))
    return await crawl(FeedPagesSpider, settings=SETTINGS, feed_url=site.url("/list"))


def answers(site: Any) -> list[tuple[str, int]]:
    return sorted((r.path, r.status) for r in site.log if r.path != "/robots.txt")


@both_stores
@pytest.mark.parametrize("kind", ["sitemap", "feed"])
@pytest_twisted.ensureDeferred
async def test_a_page_its_list_dropped_is_asked_when_due_behind_a_304(
    site, crawl, monkeypatch, kind
):
    for path in ("/kept", "/dropped"):
        site.add_page(path, "strong", size=1500)
    publish(site, kind, ["/kept", "/dropped"], '"1"')
    first = await crawl_list(crawl, kind, site)
    assert len(first.collected) == 2

    # The list drops /dropped and is read in full; nothing is due yet.
    publish(site, kind, ["/kept"], '"2"')
    site.reset_log()
    await crawl_list(crawl, kind, site)
    assert answers(site) == [("/list", 200)]

    # Both pages are edited; two days later both are due by their schedule.
    # The list answers 304: /kept's date still vouches for it, /dropped's
    # does not (its list no longer gives it).
    site.change("/kept")
    site.change("/dropped")
    later(monkeypatch, 2)
    site.reset_log()
    third = await crawl_list(crawl, kind, site)
    assert answers(site) == [("/dropped", 200), ("/list", 304)]
    assert [(i["url"], i["change"]) for i in third.collected] == [
        (site.url("/dropped"), "changed")]
    assert third.stats.get_value("incremental/schedule/skipped/lastmod_unchanged") == 1

    # Then it is deleted: found when it is due again, still behind a 304.
    site.override("/dropped", status=410)
    later(monkeypatch, 4)
    site.reset_log()
    fourth = await crawl_list(crawl, kind, site)
    assert answers(site) == [("/dropped", 410), ("/list", 304)]
    assert [(i["url"], i["change"]) for i in fourth.collected] == [
        (site.url("/dropped"), "deleted")]


@both_stores
@pytest_twisted.ensureDeferred
async def test_a_page_dropped_by_a_sitemap_read_in_full_is_asked_in_that_crawl(
    site, crawl, monkeypatch
):
    for path in ("/kept", "/dropped"):
        site.add_page(path, "strong", size=1500)
    publish(site, "sitemap", ["/kept", "/dropped"], '"1"')
    await crawl_list(crawl, "sitemap", site)

    # Two days later (both due) the only list, read in full, no longer
    # lists /dropped, which is gone: it is re-seeded and asked.
    publish(site, "sitemap", ["/kept"], '"2"')
    site.override("/dropped", status=410)
    later(monkeypatch, 2)
    site.reset_log()
    second = await crawl_list(crawl, "sitemap", site)
    assert answers(site) == [("/dropped", 410), ("/list", 200)]
    assert [(i["url"], i["change"]) for i in second.collected] == [
        (site.url("/dropped"), "deleted")]


@both_stores
@pytest_twisted.ensureDeferred
async def test_behind_an_index_a_page_one_child_dropped_is_asked_and_the_others_vouched(
    site, crawl, monkeypatch
):
    """Several lists: /one.xml drops /p while /two.xml stays unchanged (not
    read); a crawl later the index answers 304."""
    for path in ("/a", "/p", "/b"):
        site.add_page(path, "strong", size=1500)

    def index(one: str) -> str:
        rows = "".join(f"<sitemap><loc>{site.url(path)}</loc><lastmod>{lastmod}</lastmod>"
                       "</sitemap>" for path, lastmod in (("/one.xml", one),
                                                          ("/two.xml", "2024-01-01")))
        return ('<?xml version="1.0"?><sitemapindex '
                f'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{rows}</sitemapindex>')

    site.add_document("/one.xml", urlset([(site.url("/a"), DATE), (site.url("/p"), DATE)]),
                      "application/xml", etag='"one-1"')
    site.add_document("/two.xml", urlset([(site.url("/b"), DATE)]), "application/xml",
                      etag='"two-1"')
    site.add_document("/index.xml", index("2024-01-01"), "application/xml", etag='"i-1"')

    async def run() -> Any:
        return await crawl(SitemapPagesSpider, settings=SETTINGS,
                           sitemap_url=site.url("/index.xml"))

    await run()
    site.add_document("/one.xml", urlset([(site.url("/a"), DATE)]), "application/xml",
                      etag='"one-2"')
    site.add_document("/index.xml", index("2024-02-01"), "application/xml", etag='"i-2"')
    site.reset_log()
    second = await run()
    assert answers(site) == [("/index.xml", 200), ("/one.xml", 200)]
    assert second.stats.get_value("incremental/sitemap/child_unchanged") == 1

    for path in ("/a", "/p", "/b"):
        site.change(path)
    later(monkeypatch, 2)
    site.reset_log()
    third = await run()
    # The index answers 304: the lists it named when last read are its
    # lists still, and their memberships are on record: neither is read.
    # /a and /b are vouched for; /p, which /one.xml dropped, is not.
    assert answers(site) == [("/index.xml", 304), ("/p", 200)]
    assert third.stats.get_value("incremental/sitemap/child_unchanged") == 2
    assert [i["url"] for i in third.collected] == [site.url("/p")]
    assert third.stats.get_value("incremental/schedule/skipped/lastmod_unchanged") == 2


@only_sqlite
@pytest_twisted.ensureDeferred
async def test_a_list_stored_without_its_membership_is_read_in_full_once(
    site, crawl, state_db, state_uri
):
    # A store written by a version that did not record what lists list
    # (schema 15): the list answers 304, and what it lists would be
    # unknown, so no page's date could be known to be given still.
    site.add_page("/a", "strong", size=1500)
    publish(site, "sitemap", ["/a"], '"1"')
    await crawl_list(crawl, "sitemap", site)
    state_db("UPDATE pages SET listing = NULL")

    site.reset_log()
    second = await crawl_list(crawl, "sitemap", site)
    assert answers(site) == [("/list", 200), ("/list", 304)]
    assert second.stats.get_value("incremental/sitemap/reread_unknown_listing") == 1
    assert state_db("SELECT listing IS NOT NULL FROM pages WHERE url = ?",
                    site.url("/list")) == [(1,)]

    # On record again: a 304 is the whole of the next crawl's list.
    site.reset_log()
    third = await crawl_list(crawl, "sitemap", site)
    assert answers(site) == [("/list", 304)]
    assert third.stats.get_value("incremental/sitemap/reread_unknown_listing") is None



def undated_index(site: Any, paths: list[str]) -> str:
    """A sitemap index that gives its lists no ``<lastmod>``."""
    rows = "".join(f"<sitemap><loc>{site.url(p)}</loc></sitemap>" for p in paths)
    return ('<?xml version="1.0"?><sitemapindex '
            f'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{rows}</sitemapindex>')


async def run_from(crawl: Any, site: Any, path: str) -> Any:
    return await crawl(SitemapPagesSpider, settings=SETTINGS, sitemap_url=site.url(path))


@only_sqlite
@pytest_twisted.ensureDeferred
async def test_behind_an_undated_index_answering_304_its_lists_are_asked(
        site, crawl, monkeypatch):
    """The common static index (no <lastmod>) answers 304 for ever while its
    lists change: a 304 says nothing of them, so each is asked
    (conditionally), and /p, which its list dropped and the site deleted, is
    asked when due. (Found by a review; before, the list was not asked.)"""
    for path in ("/a", "/p"):
        site.add_page(path, "strong", size=1500)
    site.add_document("/index.xml", undated_index(site, ["/one.xml"]), "application/xml",
                      etag='"i"')
    site.add_document("/one.xml", urlset([(site.url("/a"), DATE), (site.url("/p"), DATE)]),
                      "application/xml", etag='"one-1"')
    await run_from(crawl, site, "/index.xml")
    site.add_document("/one.xml", urlset([(site.url("/a"), DATE)]), "application/xml",
                      etag='"one-2"')
    site.override("/p", status=410)
    later(monkeypatch, 2)
    site.reset_log()
    await run_from(crawl, site, "/index.xml")
    assert ("/one.xml", 200) in answers(site)
    assert ("/p", 410) in answers(site), answers(site)


@only_sqlite
@pytest_twisted.ensureDeferred
async def test_a_list_that_answered_with_no_list_gives_no_date_behind_its_304(
        site, crawl, monkeypatch):
    """The sitemap becomes a 200 HTML page (a soft 404) with an ETag: it
    lists nothing now, so its 304 next time makes no date current."""
    for path in ("/a", "/p"):
        site.add_page(path, "strong", size=1500)
    site.add_document("/list", urlset([(site.url("/a"), DATE), (site.url("/p"), DATE)]),
                      "application/xml", etag='"1"')
    await run_from(crawl, site, "/list")
    site.add_document("/list", "<html><body>Not found</body></html>", "text/html",
                      etag='"2"')
    site.reset_log()
    await run_from(crawl, site, "/list")          # nothing due yet: only the list
    assert answers(site) == [("/list", 200)]
    site.override("/p", status=410)
    later(monkeypatch, 2)
    site.reset_log()
    third = await run_from(crawl, site, "/list")
    # No list gives /a or /p a date any more: both due, both asked.
    assert ("/p", 410) in answers(site), (answers(site), third.stats.get_value(
        "incremental/schedule/skipped/lastmod_unchanged"))


@only_sqlite
@pytest_twisted.ensureDeferred
async def test_a_page_its_list_still_names_but_no_longer_dates_is_asked_when_due(
        site, crawl, monkeypatch):
    """/list keeps /p but no longer dates it: the date an earlier read gave
    vouches no more, though the list's membership (its URLs) is the same."""
    for path in ("/a", "/p"):
        site.add_page(path, "strong", size=1500)
    site.add_document("/list", urlset([(site.url("/a"), DATE), (site.url("/p"), DATE)]),
                      "application/xml", etag='"1"')
    await run_from(crawl, site, "/list")
    site.add_document("/list", urlset([(site.url("/a"), DATE), (site.url("/p"), None)]),
                      "application/xml", etag='"2"')
    site.reset_log()
    await run_from(crawl, site, "/list")          # read in full; nothing due yet
    assert answers(site) == [("/list", 200)]
    site.change("/p")
    later(monkeypatch, 2)
    site.reset_log()
    await run_from(crawl, site, "/list")
    # No list gives /p a date: it goes by its schedule (due), and is asked.
    assert ("/p", 200) in answers(site), answers(site)


@only_sqlite
@pytest_twisted.ensureDeferred
async def test_an_index_that_names_itself_is_read_once(site, crawl, monkeypatch, state_db):
    """Indexes naming themselves (or each other) exist in the wild: no
    recursion without end when one answers 304."""
    site.add_page("/a", "strong", size=1500)
    site.add_document("/index.xml", undated_index(site, ["/index.xml", "/one.xml"]),
                      "application/xml", etag='"i"')
    site.add_document("/one.xml", urlset([(site.url("/a"), DATE)]), "application/xml",
                      etag='"one"')
    await run_from(crawl, site, "/index.xml")
    site.reset_log()
    second = await run_from(crawl, site, "/index.xml")
    # The index gives its lists no date: each is asked (conditionally),
    # itself once.
    assert answers(site) == [("/index.xml", 304), ("/one.xml", 304)]
    assert second.stats.get_value("spider_exceptions/RecursionError") is None


class RunNotes:
    """A cluster run's shared notes, kept in this process: what the
    ledger tells the run, in order (the rest answers as a lone worker's run)."""

    run_started = None
    run_unrecorded = 0

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def note_listing(self, listing: str) -> None:
        self.events.append(("listing", listing))

    def note_decided(self, urls: list[str]) -> None:
        self.events.extend(("decided", url) for url in urls)

    def run_listings(self) -> set[str]:
        return {value for kind, value in self.events if kind == "listing"}

    def decided_in_run(self, urls: list[str]) -> list[bool]:
        return [False] * len(urls)

    def claim_tombstone(self, key: Any) -> bool:
        return True

    def note_unrecorded_failure(self) -> None:
        pass

    def note_first_second_visit(self, key: Any) -> None:
        pass

    def first_second_visits(self) -> set[Any]:
        return set()


class JoinRun:
    """An extension giving the crawl's ledger a :class:`RunNotes` as its run."""

    notes: RunNotes | None = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> JoinRun:
        from scrapy import signals

        ext = cls()
        ext.crawler = crawler
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        return ext

    def spider_opened(self, spider: Any) -> None:
        from incremental_crawler.crawl.ledger import Ledger

        JoinRun.notes = RunNotes()
        self.crawler.get_extension(Ledger).run_gate = JoinRun.notes


@only_sqlite
@pytest_twisted.ensureDeferred
async def test_a_list_notes_its_pages_decided_before_its_membership(site, crawl):
    # In cluster mode the worker that re-seeds the run takes in the run's
    # memberships, then asks which due pages a list of the run decided. Were
    # a membership noted first, a re-seed between the two notes would find
    # the pages listed, not decided, and decide (and count) them again: a
    # list read on one worker while another re-seeds (seen once under load:
    # 40 pages counted skipped twice).
    paths = ["/p/a", "/p/b", "/p/c"]
    for path in paths:
        site.add_page(path, "strong")
    publish(site, "sitemap", paths, '"v1"')
    await crawl(SitemapPagesSpider, sitemap_url=site.url("/list"),
                settings={**SETTINGS, "EXTENSIONS": {JoinRun: 0}})
    events = JoinRun.notes.events
    listing = [i for i, (kind, _) in enumerate(events) if kind == "listing"]
    decided = {url: i for i, (kind, url) in enumerate(events) if kind == "decided"}
    assert len(listing) == 1
    assert sorted(decided) == sorted(site.url(p) for p in paths)
    assert max(decided.values()) < listing[0]
