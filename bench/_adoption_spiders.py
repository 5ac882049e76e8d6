"""The spiders of ``bench/adoption.py``: ordinary Scrapy spiders, nothing incremental.

Each is what a user already has in a project: the add-on line in the
project's settings is all that makes them incremental. Run with
``scrapy crawl adopt_<kind> -s SPIDER_MODULES=bench._adoption_spiders``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy import Spider
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule, SitemapSpider

from incremental_crawler.spiders import IncrementalSpider

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy.http import Response


def page_item(response: Response) -> dict[str, Any]:
    return {
        "url": response.url,
        "title": response.css("title::text").get(""),
        "text": " ".join(response.css("main ::text").getall()).strip(),
    }


class FollowSpider(Spider):
    """A plain spider following every link with ``response.follow``."""

    name = "adopt_follow"

    def __init__(self, start_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [start_url]

    def parse(self, response: Response) -> Iterator[Any]:
        yield page_item(response)
        for href in response.css("nav a::attr(href), main a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)


class RulesSpider(CrawlSpider):
    """The issue's case: one Rule with a LinkExtractor, a callback, follow=True."""

    name = "adopt_crawl"
    rules = (Rule(LinkExtractor(allow=r"/p/"), callback="parse_item", follow=True),)

    def __init__(self, start_url: str = "", **kwargs: Any) -> None:
        self.start_urls = [start_url]
        super().__init__(**kwargs)

    def parse_item(self, response: Response) -> dict[str, Any]:
        return page_item(response)


class ScrapySitemapSpider(SitemapSpider):
    """Scrapy's own SitemapSpider over the site's robots.txt."""

    name = "adopt_sitemap"

    def __init__(self, start_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        base = start_url.split("/p/", maxsplit=1)[0]
        self.sitemap_urls = [f"{base}/robots.txt"]

    def parse(self, response: Response) -> dict[str, Any]:  # type: ignore[override]
        return page_item(response)


class OurSpider(FollowSpider, IncrementalSpider):
    """The same link-following spider on our own base class."""

    name = "adopt_incremental"


class ManualAllSpider(CrawlSpider):
    """The issue's spider on a manual: ``Rule(LinkExtractor(), follow=True)``, no ``allow=``.

    It follows everything: fragments, source texts, index pages of 1,200
    links; ``allowed_domains`` keeps it on the loopback site (a manual's
    pages link to other sites).
    """

    name = "adopt_manual_all"
    allowed_domains = ("127.0.0.1",)
    rules = (Rule(LinkExtractor(), callback="parse_item", follow=True),)

    def __init__(self, start_url: str = "", **kwargs: Any) -> None:
        self.start_urls = [start_url]
        super().__init__(**kwargs)

    def parse_item(self, response: Response) -> dict[str, Any]:
        return {"url": response.url, "title": response.css("title::text").get(),
                "h1": response.css("h1::text").get()}


class ManualHtmlSpider(ManualAllSpider):
    """The same with ``LinkExtractor(allow=r"\\.html$")``: pages only, no fragments."""

    name = "adopt_manual_html"
    rules = (Rule(LinkExtractor(allow=r"\.html$"), callback="parse_item", follow=True),)
