"""Re-seeding due pages for every spider in add-on mode, on real crawls.

The second crawl of each test runs "two days later" (the revisit interval is
one day, so every known page is due), and its entry page answers 304. Replay
on 304 is off (but in the last test): the entry page's links are not seen,
and the pages behind it are reached only if they are re-seeded from the
store.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import pytest_twisted
from scrapy import Spider
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule

from tests.clock_util import DAY, later

pytestmark = pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)


REVISITS = {
    "INCREMENTAL_REVISIT_ENABLED": True,
    "INCREMENTAL_REVISIT_INITIAL": DAY,
    "INCREMENTAL_REVISIT_MIN": 3600,
    # No sampled full re-check: an unchanged page answers 304.
    "INCREMENTAL_RECHECK_EVERY": 0,
    # A 304 list yields nothing: what is found behind it, re-seeding found.
    "INCREMENTAL_REPLAY_ENABLED": False,
}


def listing(paths: list[str]) -> str:
    links = "".join(f'<li><a href="{path}">{path}</a></li>' for path in paths)
    return f"<html><head><title>List</title></head><body><ul>{links}</ul></body></html>"


def add_items(site: Any, n: int) -> list[str]:
    paths = [f"/item/{i}" for i in range(n)]
    for path in paths:
        site.add_page(path, "strong", size=1500)
    site.add_document("/list", listing(paths), "text/html", etag='"list-1"')
    return paths


def without_text(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items without their text and fingerprint (the page's content) and
    what the change feed says of them (tests/test_change_feed.py)."""
    return [{k: v for k, v in item.items()
             if k not in ("text", "fingerprint", "change", "previous_fingerprint")}
            for item in items]


def paths_requested(site: Any, prefix: str) -> list[tuple[str, int]]:
    return sorted((r.path, r.status) for r in site.log if r.path.startswith(prefix))


class PlainSpider(Spider):
    """A plain Scrapy spider: its list is a start URL (``dont_filter``, no
    callback), its items come with ``cb_kwargs`` and meta the callback needs."""

    name = "plain"

    def __init__(self, list_url: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [list_url]

    def parse(self, response):
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse_item, meta={"shelf": 7},
                                  cb_kwargs={"section": "news"})

    def parse_item(self, response, section):
        # A request made again without what its callback needs fails here.
        assert response.meta["shelf"] == 7
        yield {"url": response.url, "section": section, "shelf": response.meta["shelf"],
               "text": " ".join(response.css("main ::text").getall())}


@pytest_twisted.ensureDeferred
async def test_a_plain_spider_gets_its_due_pages_with_their_own_callback_and_meta(
    site, crawl, monkeypatch
):
    paths = add_items(site, 4)
    url = site.url("/list")
    first = await crawl(PlainSpider, settings=REVISITS, list_url=url)
    assert len(first.collected) == 4
    site.change("/item/2")  # the list itself does not change
    site.reset_log()
    later(monkeypatch, 2)
    second = await crawl(PlainSpider, settings=REVISITS, list_url=url)
    # The list answered 304: no link was seen...
    assert [r.status for r in site.requests_for("/list")] == [304]
    # ...yet every item was re-seeded, conditionally, once.
    assert paths_requested(site, "/item/") == [
        (path, 200 if path == "/item/2" else 304) for path in paths]
    # Its callback got the cb_kwargs and meta of the page's own request.
    assert without_text(second.collected) == [
        {"url": site.url("/item/2"), "section": "news", "shelf": 7}]
    # The list was requested this crawl already (it is not due any more):
    # it is not re-seeded although its start request skipped the dupefilter.
    assert second.stats.get_value("incremental/reseeded") == 4
    assert second.stats.get_value("spider_exceptions/AssertionError") is None


class PlainSpiderRenamed(Spider):
    """The same spider after its item callback was renamed."""

    name = "plain"

    def __init__(self, list_url: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [list_url]

    def parse(self, response):
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse_article, meta={"shelf": 7},
                                  cb_kwargs={"section": "news"})

    def parse_article(self, response, section):
        yield {"url": response.url, "text": " ".join(response.css("main ::text").getall())}


@pytest_twisted.ensureDeferred
async def test_a_page_whose_callback_is_gone_is_skipped_and_counted(site, crawl, monkeypatch):
    add_items(site, 3)
    url = site.url("/list")
    await crawl(PlainSpider, settings=REVISITS, list_url=url)
    site.change("/item/1")
    site.reset_log()
    later(monkeypatch, 2)
    second = await crawl(PlainSpiderRenamed, settings=REVISITS, list_url=url)
    assert paths_requested(site, "/item/") == []
    assert second.collected == []
    assert second.stats.get_value("incremental/reseed/skipped/callback_missing") == 3
    assert second.stats.get_value("incremental/reseeded") == 0


class NoReseedSpider(PlainSpider):
    custom_settings: ClassVar[dict[str, Any]] = {"INCREMENTAL_RESEED_ENABLED": False}


class NoReseedAttributeSpider(PlainSpider):
    incremental_reseed = False


@pytest.mark.parametrize(("spidercls", "settings"), [
    (PlainSpider, {"INCREMENTAL_RESEED_ENABLED": False}),
    (NoReseedSpider, {}),
    (NoReseedAttributeSpider, {}),
], ids=["setting", "custom_settings", "attribute"])
@pytest_twisted.ensureDeferred
async def test_re_seeding_switched_off_requests_nothing_from_the_store(
    site, crawl, monkeypatch, spidercls, settings
):
    add_items(site, 3)
    url = site.url("/list")
    await crawl(spidercls, settings={**REVISITS, **settings}, list_url=url)
    site.change("/item/1")
    site.reset_log()
    later(monkeypatch, 2)
    second = await crawl(spidercls, settings={**REVISITS, **settings}, list_url=url)
    assert [r.status for r in site.requests_for("/list")] == [304]
    assert paths_requested(site, "/item/") == []  # the change is missed
    assert second.collected == []
    assert second.stats.get_value("incremental/reseeded") is None


class OtherScopeSpider(PlainSpider):
    """Another spider sharing the store, with a list of its own."""

    name = "other"


@pytest_twisted.ensureDeferred
async def test_only_the_crawls_own_scope_is_re_seeded(site, crawl, monkeypatch):
    add_items(site, 3)
    site.add_page("/elsewhere/0", "strong", size=1500)
    site.add_document("/other-list", listing(["/elsewhere/0"]), "text/html", etag='"o-1"')
    await crawl(PlainSpider, settings=REVISITS, list_url=site.url("/list"))
    await crawl(OtherScopeSpider, settings=REVISITS, list_url=site.url("/other-list"))
    site.reset_log()
    later(monkeypatch, 2)
    second = await crawl(OtherScopeSpider, settings=REVISITS, list_url=site.url("/other-list"))
    # The "plain" spider's items are due too, but not this spider's pages.
    assert paths_requested(site, "/item/") == []
    assert paths_requested(site, "/elsewhere/") == [("/elsewhere/0", 304)]
    assert second.stats.get_value("incremental/reseeded") == 1


class Catalogue(CrawlSpider):
    """Shelves lead to books; only books have a callback (rule 1)."""

    name = "catalogue"
    rules = (
        Rule(LinkExtractor(allow=r"/shelf/"), follow=True),
        Rule(LinkExtractor(allow=r"/book/"), callback="parse_book"),
    )

    def __init__(self, start: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = start

    def parse_book(self, response):
        yield {"url": response.url, "rule": response.meta["rule"],
               "text": " ".join(response.css("main ::text").getall())}


class CatalogueReordered(Catalogue):
    """The same spider after its rules were swapped."""

    rules = (
        Rule(LinkExtractor(allow=r"/book/"), callback="parse_book"),
        Rule(LinkExtractor(allow=r"/shelf/"), follow=True),
    )


def add_catalogue(site: Any, books: list[str]) -> None:
    for path in books:
        site.add_page(path, "strong", size=1500)
    site.add_document("/shelf/a", listing(books), "text/html", etag='"shelf-1"')
    site.add_document("/catalogue", listing(["/shelf/a"]), "text/html", etag='"cat-1"')


@pytest_twisted.ensureDeferred
async def test_a_crawl_spider_page_is_re_seeded_with_its_rule(site, crawl, monkeypatch):
    books = ["/book/0", "/book/1", "/book/2"]
    add_catalogue(site, books)
    start = [site.url("/catalogue")]
    first = await crawl(Catalogue, settings=REVISITS, start=start)
    assert sorted(item["url"] for item in first.collected) == [site.url(b) for b in books]
    site.change("/book/1")
    site.reset_log()
    later(monkeypatch, 2)
    second = await crawl(Catalogue, settings=REVISITS, start=start)
    assert [r.status for r in site.requests_for("/catalogue")] == [304]
    # The shelf (rule 0, no callback) and the books (rule 1) came from the
    # store; the shelf is unchanged, so its links are not seen either.
    assert paths_requested(site, "/shelf/") == [("/shelf/a", 304)]
    assert paths_requested(site, "/book/") == [
        (b, 200 if b == "/book/1" else 304) for b in books]
    # CrawlSpider's own callback found rule 1 by its index, and called its callback.
    assert without_text(second.collected) == [{"url": site.url("/book/1"), "rule": 1}]
    assert second.stats.get_value("incremental/reseeded") == 4


@pytest_twisted.ensureDeferred
async def test_a_crawl_spider_page_whose_rule_changed_is_skipped(site, crawl, monkeypatch):
    add_catalogue(site, ["/book/0", "/book/1"])
    start = [site.url("/catalogue")]
    await crawl(Catalogue, settings=REVISITS, start=start)
    site.change("/book/1")
    site.reset_log()
    later(monkeypatch, 2)
    second = await crawl(CatalogueReordered, settings=REVISITS, start=start)
    # Rule 1 has no callback now and rule 0 another one: neither a book nor
    # the shelf is requested with the wrong rule.
    assert paths_requested(site, "/book/") == []
    assert paths_requested(site, "/shelf/") == []
    assert second.stats.get_value("incremental/reseed/skipped/rule_missing") == 3
    assert second.stats.get_value("incremental/reseeded") == 0


@pytest_twisted.ensureDeferred
async def test_a_crawl_spider_entry_page_is_re_seeded_as_a_start_page(
    site, crawl, monkeypatch
):
    # The entry page had no callback: CrawlSpider parsed it with its rules.
    # Re-seeded, it must be parsed the same way (its ``parse`` is no callback).
    add_catalogue(site, ["/book/0"])
    await crawl(Catalogue, settings=REVISITS, start=[site.url("/catalogue")])
    site.add_page("/book/new", "strong", size=1500)
    site.add_document("/catalogue", listing(["/shelf/a", "/book/new"]), "text/html",
                      etag='"cat-2"')
    site.reset_log()
    later(monkeypatch, 2)
    # No start URL this time: everything comes from the store.
    second = await crawl(Catalogue, settings=REVISITS, start=[])
    assert [r.status for r in site.requests_for("/catalogue")] == [200]
    assert [item["url"] for item in second.collected] == [site.url("/book/new")]
    assert second.stats.get_value("spider_exceptions/NotImplementedError") is None


@pytest_twisted.ensureDeferred
async def test_with_replay_a_page_no_longer_linked_is_still_revisited(
    site, crawl, monkeypatch
):
    # Replay on 304 covers an unchanged list; a page the list stopped linking
    # to is reached only by re-seeding.
    paths = add_items(site, 3)
    url = site.url("/list")
    replay = {**REVISITS, "INCREMENTAL_REPLAY_ENABLED": True}
    await crawl(PlainSpider, settings=replay, list_url=url)
    site.add_document("/list", listing(paths[:2]), "text/html", etag='"list-2"')
    site.change("/item/2")
    site.reset_log()
    later(monkeypatch, 2)
    second = await crawl(PlainSpider, settings=replay, list_url=url)
    assert [r.status for r in site.requests_for("/list")] == [200]
    assert paths_requested(site, "/item/") == [
        ("/item/0", 304), ("/item/1", 304), ("/item/2", 200)]
    assert without_text(second.collected) == [
        {"url": site.url("/item/2"), "section": "news", "shelf": 7}]
    # The list linked to the other two this crawl: only the third is re-seeded.
    assert second.stats.get_value("incremental/reseeded") == 1
