"""A response's parsed tree is freed when its callback's output ends, not by the GC.

Real crawls of the loopback site with Python's cyclic garbage collector
switched off: what is still alive then is what reference counting alone
would never free. Scrapy's response and its selector refer to each other,
so without the release every parsed response of the crawl stays alive.
"""

from __future__ import annotations

import gc
import weakref
from typing import TYPE_CHECKING, Any

import pytest_twisted
from scrapy import signals

from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from tests.site import PLAIN_KINDS

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy.http import Response

RELEASE = "incremental_crawler.parsed_trees.ParsedTreeReleaseMiddleware"
PAGES = 12


class WatchedSitemapSpider(SitemapPagesSpider):
    """Our sitemap spider, keeping a weak reference to each page's response."""

    name = "watched_sitemap"

    def __init__(self, reread: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reread_items = reread
        self.responses: list[weakref.ref[Response]] = []
        #: Each item's page title, read again from its response by an
        #: ``item_scraped`` handler (after the release: a new selector).
        self.titles_again: list[str | None] = []

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> WatchedSitemapSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        if spider.reread_items:
            crawler.signals.connect(spider.reread, signal=signals.item_scraped)
        return spider

    def parse(self, response: Response) -> Iterator[Any]:
        self.responses.append(weakref.ref(response))
        yield from super().parse(response)

    def reread(self, item: Any, response: Response) -> None:
        self.titles_again.append(response.css("title::text").get())


class FailingParseSpider(WatchedSitemapSpider):
    """Its callback, a plain function, parses each page and then raises: it
    never returns an output for the middlewares to go through."""

    name = "failing_parse"

    def parse(self, response: Response) -> Any:  # type: ignore[override]
        self.responses.append(weakref.ref(response))
        response.css("title::text").get()
        raise ValueError("a callback bug")


async def crawl_without_gc(crawl: Any, site: Any, *, reread: bool = False,
                           spidercls: type[WatchedSitemapSpider] = WatchedSitemapSpider,
                           **settings: Any) -> tuple[Any, int, int]:
    """A crawl with the cyclic GC off: the crawler, how many of the parsed
    responses are still alive when it ends, and how many of those still
    hold their parsed tree (their cached selector)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        crawler = await crawl(spidercls, settings=settings,
                              sitemap_url=site.url("/robots.txt"), reread=reread)
        alive = [r for ref in crawler.spider.responses if (r := ref()) is not None]
        trees = sum(1 for r in alive if getattr(r, "_cached_selector", None) is not None)
        count = len(alive)
        del alive
    finally:
        if was_enabled:
            gc.enable()
    return crawler, count, trees


@pytest_twisted.ensureDeferred
async def test_a_parsed_page_is_freed_once_its_output_ends(site, crawl):
    site.add_pages(PAGES, kinds=PLAIN_KINDS)
    crawler, alive, _ = await crawl_without_gc(crawl, site)
    assert len(crawler.spider.responses) == PAGES
    assert alive == 0


@pytest_twisted.ensureDeferred
async def test_a_response_read_again_after_the_release_is_parsed_again(site, crawl):
    site.add_pages(PAGES, kinds=PLAIN_KINDS)
    crawler, _, _ = await crawl_without_gc(crawl, site, reread=True)
    titles = crawler.spider.titles_again
    assert len(titles) == PAGES and all(titles)
    assert sorted(titles) == sorted(i["title"] for i in crawler.collected)


@pytest_twisted.ensureDeferred
async def test_without_the_release_every_parsed_page_waits_for_the_gc(site, crawl):
    # What the middleware is for: with Scrapy's behaviour every response
    # that was parsed stays alive until the cyclic collector runs.
    site.add_pages(PAGES, kinds=PLAIN_KINDS)
    _, alive, _ = await crawl_without_gc(crawl, site, SPIDER_MIDDLEWARES={RELEASE: None})
    assert alive == PAGES


@pytest_twisted.ensureDeferred
async def test_a_callback_that_raises_before_its_output_frees_its_tree(site, crawl):
    # The exception's traceback keeps the response itself until the GC runs;
    # its parsed tree, most of its memory, need not wait with it.
    site.add_pages(PAGES, kinds=PLAIN_KINDS)
    crawler, _, trees = await crawl_without_gc(crawl, site, spidercls=FailingParseSpider)
    assert len(crawler.spider.responses) == PAGES
    assert crawler.stats.get_value("spider_exceptions/ValueError") == PAGES
    assert trees == 0
