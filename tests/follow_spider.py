"""A spider for crawls run in their own process (``scrapy crawl follow``).

An ordinary Scrapy spider following links, nothing incremental in it: the
project's ``ADDONS`` line is all that makes it incremental, as it is for a
user's existing spider. A separate module because ``scrapy crawl`` finds
spiders through ``SPIDER_MODULES`` (the tests pass
``-s SPIDER_MODULES=tests.follow_spider``, from the repository root).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import scrapy

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy.http import Response


class FollowSpider(scrapy.Spider):
    """One item per page; follows the page's ``<nav>`` links."""

    name = "follow"

    def __init__(self, start_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_url = start_url

    async def start(self):
        # Not start_urls: Scrapy gives those dont_filter=True, so a link back
        # to the start page would fetch it twice (with or without the add-on).
        yield scrapy.Request(self.start_url)

    def parse(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "title": response.css("title::text").get()}
        for href in response.css("nav a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)


class StartsSpider(scrapy.Spider):
    """One item per page of its start URLs (space-separated ``-a urls=``).

    Start requests are ``dont_filter``, as Scrapy makes start URLs: in
    cluster mode every worker yields them, and the run's seen set does not
    keep a page from being asked on two workers. Each carries ``-a tag=``
    in its meta (what queued it), so that the shared queue holds them apart.
    """

    name = "starts"

    def __init__(self, urls: str = "", tag: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.urls = urls.split()
        self.tag = tag

    async def start(self):
        for url in self.urls:
            yield scrapy.Request(url, meta={"tag": self.tag}, dont_filter=True)

    def parse(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "title": response.css("title::text").get()}
