"""``scrapy crawl news -a start_url=URL``: a listing page and its articles.

An example of a link-following incremental spider: it is nothing but two
callbacks. The listing page is fetched conditionally like any other page;
when it answers 304, the article requests it yielded last time are yielded
again (replay on 304), and once the crawl runs out of links the articles due
for a revisit are re-seeded from the store, so a changed article behind an
unchanged listing is still found.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from scrapy import Request

from incremental_crawler.spiders.base import IncrementalSpider
from incremental_crawler.spiders.listed import DEFAULT_TEXT_SELECTORS, extract_main_text

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

    from scrapy.http import Response

__all__ = ["NewsSpider"]


class NewsSpider(IncrementalSpider):
    """Arguments: ``start_url`` (the listing), ``article_pattern`` (regex
    an article URL matches; default ``/news/``), ``next_selector`` (CSS of the
    "next page" link; default ``a[rel=next]``)."""

    name = "news"

    def __init__(
        self,
        start_url: str | None = None,
        article_pattern: str = r"/news/",
        next_selector: str = "a[rel=next]::attr(href)",
        **kwargs: Any,
    ) -> None:
        if not start_url:
            raise ValueError("the news spider needs -a start_url=URL (a listing page)")
        super().__init__(**kwargs)
        self.start_url = start_url
        self.article_re = re.compile(article_pattern)
        self.next_selector = next_selector

    async def start(self) -> AsyncIterator[Any]:
        yield Request(self.start_url, callback=self.parse_listing)

    def parse_listing(self, response: Response) -> Iterable[Request]:
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href)
            if self.article_re.search(url):
                yield Request(url, callback=self.parse_article)
        if next_page := response.css(self.next_selector).get():
            yield Request(response.urljoin(next_page), callback=self.parse_listing)

    def parse_article(self, response: Response) -> Iterable[dict[str, Any]]:
        yield {
            "url": response.url,
            "title": (response.css("title::text").get() or "").strip(),
            "text": extract_main_text(response, DEFAULT_TEXT_SELECTORS),
        }
