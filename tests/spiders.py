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


class FailingPipeline:
    """A user's pipeline that fails on one URL (its database is down, say)."""

    def __init__(self, crawler):
        self.fail_on = crawler.settings.get("TEST_FAIL_ON")

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    def process_item(self, item):
        if item["url"].endswith(self.fail_on):
            raise RuntimeError("user database unavailable")
        return item


class StateProbePipeline:
    """A user's pipeline that forces a flush of the state store while it
    holds an item, then records what a second connection sees in the file:
    the page state must not be there yet (invariant 1)."""

    def __init__(self, crawler):
        self.crawler = crawler
        self.path = crawler.settings.get("INCREMENTAL_STATE_URI").removeprefix("sqlite:///")
        self.seen: list[tuple[str, object]] = []
        crawler.state_probe = self.seen

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    def process_item(self, item):
        import sqlite3

        ledger = self.crawler.incremental_ledger
        ledger.store.flush_now()
        db = sqlite3.connect(self.path)
        try:
            row = db.execute(
                "SELECT etag, last_modified, fingerprint FROM pages WHERE url = ?",
                (item["url"],),
            ).fetchone()
        finally:
            db.close()
        self.seen.append((item["url"], row))
        return item
