"""Spiders used by the tests (each a real spider, run in a real crawl)."""

from __future__ import annotations

from typing import Any

from scrapy import Request

from incremental_crawler.spiders import IncrementalSpider


class ListSpider(IncrementalSpider):
    """Fetches the given URLs; one item per page."""

    name = "list"

    def __init__(self, urls: list[str], meta: dict[str, Any] | None = None,
                 fail_on: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.urls = urls
        self.meta = meta or {}
        self.fail_on = fail_on

    async def start(self):
        for url in self.urls:
            yield Request(url, meta=dict(self.meta), dont_filter=True)

    def parse(self, response):
        if any(response.url.endswith(path) for path in self.fail_on):
            raise ValueError(f"callback bug on {response.url}")
        yield {
            "url": response.url,
            "title": response.css("title::text").get(),
            "text": " ".join(response.css("main ::text").getall()),
        }
