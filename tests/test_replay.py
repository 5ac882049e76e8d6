"""Replay on 304, on real crawls of spiders that know nothing of the add-on.

Each spider here is plain Scrapy (a ``scrapy.Spider`` following links, a
``CrawlSpider`` with rules, Scrapy's own ``SitemapSpider``), run with the
add-on line only (the ``crawl`` fixture installs it), or the same
link-following spider on our own ``IncrementalSpider``. The second crawl runs
"two days later" with revisits on, as a project gets them by default: every
page is due again (a day is the first interval), so each is asked
conditionally once, and the test shows what a 304 does to the pages behind
it. The server's log says what was asked and answered.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
import scrapy
from scrapy import Request
from scrapy.linkextractors import LinkExtractor
from scrapy.settings import Settings
from scrapy.spiders import CrawlSpider, Rule, SitemapSpider

from incremental_crawler.change.policy import recheck_due
from incremental_crawler.report.extension import IncrementalLogStats
from incremental_crawler.spiders import IncrementalSpider
from incremental_crawler.state.records import PageFlags, PageKey
from incremental_crawler.state.stores import open_store
from tests.clock_util import later
from tests.links import nav_depths, nav_links

if TYPE_CHECKING:
    from tests.site import LoopbackSite

#: Revisits as a project has them by default (the fixture switches them off).
REVISITS = {"INCREMENTAL_REVISIT_ENABLED": True}
BACKENDS = pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)




#: What a request got: a full answer, or a 304 without a body.
FULL, NOT_MODIFIED = (200, True), (304, False)


def answers(site: LoopbackSite) -> dict[str, list[tuple[int, bool, bool]]]:
    """Path -> ``(status, with a body, sent with conditions)`` of each request for it."""
    found: dict[str, list[tuple[int, bool, bool]]] = {}
    for r in site.log:
        if r.path != "/robots.txt":
            found.setdefault(r.path, []).append(
                (r.status, r.body_bytes > 0, r.if_none_match is not None))
    return found


def full(*, conditional: bool) -> tuple[int, bool, bool]:
    return (*FULL, conditional)


def not_modified() -> tuple[int, bool, bool]:
    return (*NOT_MODIFIED, True)


def report_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The lines of the end-of-crawl report logged since *caplog* was cleared."""
    reports = [m for r in caplog.records if (m := r.getMessage()).startswith("Incremental report")]
    assert len(reports) == 1
    return reports[0].splitlines()


def html(*links: str) -> str:
    anchors = "".join(f'<a href="{href}">{text}</a> ' for href, text in
                      (link.split("|") if "|" in link else (link, link) for link in links))
    return f"<html><head><title>listing</title></head><body>{anchors}</body></html>"


# -- a plain scrapy.Spider following links -------------------------------------


class FollowSpider(scrapy.Spider):
    """One item per page; follows the page's navigation links."""

    name = "follow"

    def __init__(self, start: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_url = start

    async def start(self):
        # Not start_urls: Scrapy gives those dont_filter=True, so a link back
        # to the start page would fetch it twice (with or without the add-on).
        yield Request(self.start_url)

    def parse(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}
        for href in response.css("nav a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)


def make_pages(site: LoopbackSite, n: int = 30) -> list[str]:
    paths = [f"/p/{i:04d}" for i in range(n)]
    for path in paths:
        site.add_page(path, "strong", size=1500)
    return paths


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_a_plain_spider_finds_a_change_behind_unchanged_pages(site, crawl, monkeypatch,
                                                                   caplog):
    paths = make_pages(site)
    depths = nav_depths(site, paths[0])
    assert sorted(depths) == paths  # every page is reached from the first
    changed = next(p for p in paths if depths[p] == 2)
    # None is due for its sampled full fetch (INCREMENTAL_RECHECK_EVERY) on
    # visits 2 and 3: every unchanged page can be expected to answer 304.
    assert not any(recheck_due(site.url(p), visit, 200) for p in paths for visit in (2, 3))

    first = await crawl(FollowSpider, settings=REVISITS, start=site.url(paths[0]))
    assert len(first.collected) == len(paths)
    assert first.stats.get_value("incremental/replay/recorded_pages") == len(paths)
    assert answers(site) == {p: [full(conditional=False)] for p in paths}

    site.change(changed)
    site.reset_log()
    later(monkeypatch, 2)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        # The periodic line on (the fixture turns it off) to read it below.
        second = await crawl(FollowSpider, settings={**REVISITS, "LOGSTATS_INTERVAL": 60},
                             start=site.url(paths[0]))
    # Each page asked once, conditionally; the unchanged ones answered 304
    # without a body, yet the pages behind them were reached.
    assert answers(site) == {
        p: [full(conditional=True) if p == changed else not_modified()] for p in paths}
    assert [item["url"] for item in second.collected] == [site.url(changed)]
    stats = second.stats
    assert stats.get_value("incremental/replay/pages") == len(paths) - 1
    assert stats.get_value("incremental/not_modified") == len(paths) - 1
    assert stats.get_value("incremental/replay/dropped/callback_missing") is None
    # The report says what the 304s did: every unchanged page's nav links
    # were yielded again, but for those the dupefilter had seen already
    # (left out unread), and no page had to be fetched for its links.
    replayed = sum(len(nav_links(site, p)) for p in paths if p != changed)
    left_out = stats.get_value("incremental/replay/seen_left_out")
    assert left_out and stats.get_value("incremental/replay/requests") == replayed - left_out
    lines = report_lines(caplog)
    assert lines[1] == (
        f"  {len(paths)} pages checked, {len(paths) - 1} not modified (304), 0 new, 1 changed, "
        "0 page changed, items unchanged, 0 unchanged in full; items: 0 new, 1 changed, "
        "0 unchanged dropped")
    replay_line = (f"  replay: {len(paths) - 1} pages' links replayed ({replayed - left_out} "
                   f"requests; {left_out} already seen this crawl left out), "
                   "0 pages fetched in full (links unknown or incomplete)")
    assert replay_line in lines
    # And so does the periodic line (logged once more here, with the
    # crawl's final figures, rather than waiting for its timer).
    caplog.clear()
    with caplog.at_level(logging.INFO):
        second.get_extension(IncrementalLogStats).log(second.spider)
    periodic = [m for r in caplog.records if (m := r.getMessage()).startswith("Incremental: ")]
    assert periodic == [(f"Incremental: {lines[1].strip()}; known: requested {len(paths)}; "
                         f"{replay_line.strip()}")]

    # A day later the unchanged pages are not due (their interval grew to
    # 1.4 days), the changed one is (0.8 days): nothing is asked but that
    # page, reached through the stored links of pages not requested.
    site.change(changed)
    site.reset_log()
    later(monkeypatch, 3)
    third = await crawl(FollowSpider, settings=REVISITS, start=site.url(paths[0]))
    assert answers(site) == {changed: [full(conditional=True)]}
    assert [item["url"] for item in third.collected] == [site.url(changed)]
    assert third.stats.get_value("incremental/not_due") == len(paths) - 1
    assert third.stats.get_value("incremental/replay/pages") == len(paths) - 1


@pytest_twisted.ensureDeferred
async def test_after_an_upgrade_pages_with_links_are_fetched_in_full_once(site, crawl,
                                                                           monkeypatch):
    # A store written without replay (as by an earlier version): no page's
    # links are known, so a 304 would hide them.
    paths = make_pages(site, 12)
    await crawl(FollowSpider, settings={**REVISITS, "INCREMENTAL_REPLAY_ENABLED": False},
                start=site.url(paths[0]))
    site.reset_log()
    later(monkeypatch, 0.5)  # not due yet: unknown links override the schedule
    second = await crawl(FollowSpider, settings=REVISITS, start=site.url(paths[0]))
    assert answers(site) == {p: [full(conditional=False)] for p in paths}
    assert second.stats.get_value("incremental/requests/links_unknown") == len(paths)
    assert second.collected == []  # fetched in full, but nothing changed

    site.reset_log()
    later(monkeypatch, 2)
    await crawl(FollowSpider, settings=REVISITS, start=site.url(paths[0]))
    assert answers(site) == {p: [not_modified()] for p in paths}


# -- our own IncrementalSpider following links -----------------------------------


class IncrementalFollowSpider(IncrementalSpider, FollowSpider):
    """The same spider on our base class (which also re-seeds due pages
    from the store once the crawl runs out of links)."""

    name = "incremental-follow"


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_our_incremental_spider_finds_a_change_behind_unchanged_pages(
    site, crawl, monkeypatch
):
    paths = make_pages(site)
    depths = nav_depths(site, paths[0])
    changed = next(p for p in paths if depths[p] == 2)
    # As for the plain spider: no sampled full fetch on visit 2.
    assert not any(recheck_due(site.url(p), 2, 200) for p in paths)

    first = await crawl(IncrementalFollowSpider, settings=REVISITS, start=site.url(paths[0]))
    assert len(first.collected) == len(paths)
    assert answers(site) == {p: [full(conditional=False)] for p in paths}

    site.change(changed)
    site.reset_log()
    later(monkeypatch, 2)
    second = await crawl(IncrementalFollowSpider, settings=REVISITS, start=site.url(paths[0]))
    # Each page asked once (neither the replayed links nor the re-seeding
    # of due pages ask for one again), conditionally; 304s without a body.
    assert answers(site) == {
        p: [full(conditional=True) if p == changed else not_modified()] for p in paths}
    # The change, two links behind pages that answered 304, with its new
    # revision; nothing unchanged.
    assert [(item["url"], item["title"]) for item in second.collected] == [
        (site.url(changed), f"{site.page(changed).title} v1")]
    # Our spider's re-seeding of due pages would ask for them too, once the
    # links ran out: the stat shows the 304s yielded their links again.
    assert second.stats.get_value("incremental/replay/pages") == len(paths) - 1


# -- a CrawlSpider with rules ----------------------------------------------------


class RulesSpider(CrawlSpider):
    """Listings followed by a rule without callback; items by a rule with one."""

    name = "rules"
    rules = (
        Rule(LinkExtractor(allow=r"/list/"), follow=True),
        Rule(LinkExtractor(allow=r"/item/"), callback="parse_item",
             process_request="from_listing"),
    )

    def __init__(self, start: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_url = start

    async def start(self):
        # Filtered, unlike start_urls: /list/2 links back to /list/0.
        yield Request(self.start_url)

    def from_listing(self, request, response):
        request.meta["listing"] = response.url
        return request

    def parse_item(self, response):
        yield {"url": response.url, "title": response.css("title::text").get(),
               "listing": response.meta["listing"], "link_text": response.meta["link_text"]}


def make_listings(site: LoopbackSite) -> None:
    """Three listings in a ring, two items each; items link to nothing followed."""
    for i in range(6):
        site.add_page(f"/item/{i}", "strong", size=1500)
    for i in range(3):
        site.add_document(
            f"/list/{i}",
            html(f"/list/{(i + 1) % 3}|more", f"/item/{2 * i}|Item {2 * i}",
                 f"/item/{2 * i + 1}|Item {2 * i + 1}"),
            "text/html; charset=utf-8", etag=f'"list-{i}"')


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_a_crawl_spider_finds_a_change_behind_unchanged_listings(site, crawl,
                                                                        monkeypatch):
    make_listings(site)
    paths = [f"/list/{i}" for i in range(3)] + [f"/item/{i}" for i in range(6)]
    first = await crawl(RulesSpider, settings=REVISITS, start=site.url("/list/0"))
    assert len(first.collected) == 6
    site.change("/item/2")  # /list/0 -> /list/1 -> /item/2
    site.reset_log()
    later(monkeypatch, 2)
    second = await crawl(RulesSpider, settings=REVISITS, start=site.url("/list/0"))
    assert answers(site) == {
        p: [full(conditional=True) if p == "/item/2" else not_modified()]
        for p in paths}
    # The item came through /list/1's stored requests: the meta its rule's
    # process_request set, and the link text, are those of that listing.
    assert [(i["url"], i["listing"], i["link_text"]) for i in second.collected] == [
        (site.url("/item/2"), site.url("/list/1"), "Item 2")]
    # Listings replay; items yielded no request, so they raise NotModified.
    assert second.stats.get_value("incremental/replay/pages") == 3
    assert second.stats.get_value("incremental/not_modified") == 8


# -- Scrapy's own SitemapSpider over a sitemap index -----------------------------


class PagesSitemapSpider(SitemapSpider):
    name = "scrapy-sitemap"

    def __init__(self, index: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sitemap_urls = [index]

    def parse(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}


def urlset(site: LoopbackSite, paths: list[str]) -> str:
    urls = "".join(f"<url><loc>{site.url(p)}</loc></url>" for p in paths)
    return ('<?xml version="1.0" encoding="UTF-8"?><urlset '
            f'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>')


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_scrapys_sitemap_spider_finds_a_change_behind_unchanged_sitemaps(
    site, crawl, monkeypatch
):
    pages = [f"/page/{i}" for i in range(6)]
    for path in pages:
        site.add_page(path, "strong", size=1500)
    # Static files with ETags, as most sites serve their sitemaps.
    site.add_document("/sm/a.xml", urlset(site, pages[:3]), "application/xml", etag='"a"')
    site.add_document("/sm/b.xml", urlset(site, pages[3:]), "application/xml", etag='"b"')
    site.add_document(
        "/sm/index.xml",
        '<?xml version="1.0" encoding="UTF-8"?><sitemapindex '
        'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        f'<sitemap><loc>{site.url("/sm/a.xml")}</loc></sitemap>'
        f'<sitemap><loc>{site.url("/sm/b.xml")}</loc></sitemap></sitemapindex>',
        "application/xml", etag='"index"')
    first = await crawl(PagesSitemapSpider, settings=REVISITS, index=site.url("/sm/index.xml"))
    assert len(first.collected) == 6
    site.change("/page/4")  # index -> b.xml -> /page/4
    site.reset_log()
    later(monkeypatch, 2)
    second = await crawl(PagesSitemapSpider, settings=REVISITS,
                         index=site.url("/sm/index.xml"))
    assert answers(site) == {
        p: [full(conditional=True) if p == "/page/4" else not_modified()]
        for p in ["/sm/index.xml", "/sm/a.xml", "/sm/b.xml", *pages]}
    assert [item["url"] for item in second.collected] == [site.url("/page/4")]


# -- what cannot be replayed --------------------------------------------------


class Product(scrapy.Item):
    url = scrapy.Field()
    listing = scrapy.Field()
    title = scrapy.Field()


class ItemInMetaSpider(scrapy.Spider):
    """The common idiom: the listing's half-built item rides in meta."""

    name = "item-in-meta"

    def __init__(self, starts: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = starts

    def parse(self, response):
        for href in response.css("a::attr(href)").getall():
            item = Product(listing=response.url)
            yield response.follow(href, callback=self.parse_detail, meta={"item": item})

    def parse_detail(self, response):
        item = response.meta["item"]
        item["url"] = response.url
        item["title"] = response.css("title::text").get()
        yield item


@pytest_twisted.ensureDeferred
async def test_a_page_yielding_an_item_in_meta_is_fetched_in_full_and_warned_about_once(
    site, crawl, monkeypatch, caplog
):
    for i in range(4):
        site.add_page(f"/detail/{i}", "strong", size=1500)
    site.add_document("/list/a", html("/detail/0", "/detail/1"), "text/html", etag='"a"')
    site.add_document("/list/b", html("/detail/2", "/detail/3"), "text/html", etag='"b"')
    starts = [site.url("/list/a"), site.url("/list/b")]
    with caplog.at_level(logging.INFO):
        first = await crawl(ItemInMetaSpider, settings=REVISITS, starts=starts)
    assert len(first.collected) == 4
    assert first.stats.get_value("incremental/replay/unrecordable/meta_not_json") == 2
    # The report says so, by reason.
    assert ("  replay: 0 pages' links replayed (0 requests), 0 pages fetched in full "
            "(links unknown or incomplete), requests not recordable on 2 pages "
            "(meta_not_json 2)") in report_lines(caplog)
    warnings = [m for r in caplog.records if "cannot all be replayed" in (m := r.getMessage())]
    assert len(warnings) == 1
    assert "meta_not_json" in warnings[0] and "/detail/" in warnings[0]
    assert "dict(item)" in warnings[0]  # what to do about it

    site.reset_log()
    later(monkeypatch, 2)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        second = await crawl(ItemInMetaSpider, settings=REVISITS, starts=starts)
    # The listings' callback runs again (no conditions sent); the details,
    # which yield no request, answer 304 as before.
    assert answers(site) == {
        "/list/a": [full(conditional=False)],
        "/list/b": [full(conditional=False)],
        **{f"/detail/{i}": [not_modified()] for i in range(4)}}
    assert second.stats.get_value("incremental/requests/links_unknown") == 2
    assert ("  replay: 0 pages' links replayed (0 requests), 2 pages fetched in full "
            "(links unknown or incomplete), requests not recordable on 2 pages "
            "(meta_not_json 2)") in report_lines(caplog)


class ListingSpider(scrapy.Spider):
    """A listing whose links go to ``parse_detail``."""

    name = "evolving"

    def __init__(self, start: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [start]

    def parse(self, response):
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse_detail)

    def parse_detail(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}


class RenamedSpider(scrapy.Spider):
    """The same spider (same name, so the same state) after a refactoring:
    ``parse_detail`` is now ``parse_page``."""

    name = "evolving"

    def __init__(self, start: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [start]

    def parse(self, response):
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse_page)

    def parse_page(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}


@pytest_twisted.ensureDeferred
async def test_a_replayed_request_whose_callback_is_gone_is_dropped_and_its_page_refetched(
    site, crawl, monkeypatch, caplog
):
    for i in range(3):
        site.add_page(f"/detail/{i}", "strong", size=1500)
    site.add_document("/list", html("/detail/0", "/detail/1", "/detail/2"), "text/html",
                      etag='"list"')
    await crawl(ListingSpider, settings=REVISITS, start=site.url("/list"))
    site.reset_log()
    later(monkeypatch, 2)
    with caplog.at_level(logging.INFO):
        second = await crawl(RenamedSpider, settings=REVISITS, start=site.url("/list"))
    assert answers(site) == {"/list": [not_modified()]}
    assert second.stats.get_value("incremental/replay/dropped/callback_missing") == 3
    assert ("  replay: 1 pages' links replayed (0 requests), 0 pages fetched in full "
            "(links unknown or incomplete), 3 replayed requests dropped "
            "(callback_missing 3)") in report_lines(caplog)
    warnings = [m for r in caplog.records if "cannot be made again" in (m := r.getMessage())]
    assert len(warnings) == 1 and "parse_detail" in warnings[0]

    # Next time the listing's callback runs (whatever its schedule: its
    # interval grew to 1.4 days), and its links are the new spider's.
    site.reset_log()
    later(monkeypatch, 3)
    third = await crawl(RenamedSpider, settings=REVISITS, start=site.url("/list"))
    assert answers(site) == {"/list": [full(conditional=False)],
                             **{f"/detail/{i}": [not_modified()] for i in range(3)}}
    assert third.stats.get_value("incremental/requests/links_unknown") == 1
    assert third.stats.get_value("incremental/replay/dropped/callback_missing") is None


class ManyLinksSpider(scrapy.Spider):
    name = "many-links"

    def __init__(self, starts: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = starts

    def parse(self, response):
        for href in response.css("a::attr(href)").getall():
            yield Request(response.urljoin(href), callback=self.parse_detail)

    def parse_detail(self, response):
        yield {"url": response.url}


@pytest_twisted.ensureDeferred
async def test_a_page_yielding_more_requests_than_the_bound_is_fetched_in_full(
    site, crawl, monkeypatch
):
    for i in range(7):
        site.add_page(f"/detail/{i}", "strong", size=500)
    site.add_document("/small", html(*(f"/detail/{i}" for i in range(3))), "text/html",
                      etag='"small"')
    site.add_document("/big", html(*(f"/detail/{i}" for i in range(3, 7))), "text/html",
                      etag='"big"')
    settings = {**REVISITS, "INCREMENTAL_REPLAY_MAX_REQUESTS": 3}
    starts = [site.url("/small"), site.url("/big")]
    first = await crawl(ManyLinksSpider, settings=settings, starts=starts)
    assert first.stats.get_value("incremental/replay/unrecordable/over_limit") == 1
    assert first.stats.get_value("incremental/replay/recorded_requests") == 3
    site.reset_log()
    later(monkeypatch, 2)
    await crawl(ManyLinksSpider, settings=settings, starts=starts)
    assert answers(site) == {
        "/small": [not_modified()],  # its 3 requests replayed
        "/big": [full(conditional=False)],  # 4: over the bound
        **{f"/detail/{i}": [not_modified()] for i in range(7)}}


class ErrbackSpider(scrapy.Spider):
    """Every request has an errback that notes what it was told."""

    name = "errbacks"

    def __init__(self, start: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_url = start
        self.failures: list[tuple[str, str]] = []

    async def start(self):
        yield Request(self.start_url, errback=self.failed)

    def parse(self, response):
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse_detail, errback=self.failed)

    def parse_detail(self, response):
        yield {"url": response.url}

    def failed(self, failure):
        self.failures.append((failure.request.url, type(failure.value).__name__))


@pytest_twisted.ensureDeferred
async def test_the_not_modified_errback_is_not_called_for_a_page_whose_links_are_replayed(
    site, crawl, monkeypatch
):
    for i in range(2):
        site.add_page(f"/detail/{i}", "strong", size=500)
    site.add_document("/list", html("/detail/0", "/detail/1"), "text/html", etag='"list"')
    await crawl(ErrbackSpider, settings=REVISITS, start=site.url("/list"))
    later(monkeypatch, 2)
    second = await crawl(ErrbackSpider, settings=REVISITS, start=site.url("/list"))
    # The listing's 304 replays its links (its errback is not called); the
    # details yield nothing and end in NotModified, as before.
    assert sorted(second.spider.failures) == [
        (site.url(f"/detail/{i}"), "NotModified") for i in range(2)]


@pytest_twisted.ensureDeferred
async def test_a_page_whose_record_the_store_lost_is_fetched_in_full(
    site, crawl, monkeypatch, state_uri
):
    for i in range(2):
        site.add_page(f"/detail/{i}", "strong", size=500)
    site.add_document("/list", html("/detail/0", "/detail/1"), "text/html", etag='"list"')
    await crawl(ListingSpider, settings=REVISITS, start=site.url("/list"))
    # The page stays flagged HAS_LINKS; its record is gone (a store restored
    # in part, a Redis key evicted).
    store = open_store(Settings({"INCREMENTAL_STATE_URI": state_uri}))
    key = PageKey("evolving", site.url("/list"))
    assert (await store.get_page(key)).flags & PageFlags.HAS_LINKS
    store.stage_links(key, None)
    await store.close()
    site.reset_log()
    later(monkeypatch, 2)
    second = await crawl(ListingSpider, settings=REVISITS, start=site.url("/list"))
    assert answers(site) == {"/list": [full(conditional=False)],
                             **{f"/detail/{i}": [not_modified()] for i in range(2)}}
    assert second.stats.get_value("incremental/replay/record_missing") == 1


class PollingSpider(scrapy.Spider):
    """Asks for its own page again once (``dont_filter``), as a callback that
    retries a page it found incomplete does."""

    name = "polling"

    def __init__(self, start: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_url = start

    async def start(self):
        yield Request(self.start_url, cb_kwargs={"again": True})

    def parse(self, response, again=False):
        if again:
            yield response.request.replace(dont_filter=True, cb_kwargs={})
        for href in response.css('a[href^="/detail"]::attr(href)').getall():
            yield response.follow(href, callback=self.parse)


@pytest_twisted.ensureDeferred
async def test_a_page_asking_for_itself_again_is_replayed_once_per_crawl(
    site, crawl, monkeypatch
):
    site.add_page("/detail", "strong", size=500)
    site.add_document("/list", html("/detail"), "text/html", etag='"list"')
    # Without the bound a 304 would replay the request for itself for ever:
    # the timeout ends such a crawl, and the assertions below fail.
    settings = {**REVISITS, "CLOSESPIDER_TIMEOUT": 20}
    first = await crawl(PollingSpider, settings=settings, start=site.url("/list"))
    assert first.stats.get_value("finish_reason") == "finished"
    site.reset_log()
    later(monkeypatch, 2)
    second = await crawl(PollingSpider, settings=settings, start=site.url("/list"))
    assert second.stats.get_value("finish_reason") == "finished"
    assert answers(site) == {"/list": [not_modified(), not_modified()],
                             "/detail": [not_modified()]}
    assert second.stats.get_value("incremental/replay/pages") == 1
