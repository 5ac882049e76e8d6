"""Spiders used by the tests (each a real spider, run in a real crawl)."""

from __future__ import annotations

import asyncio
from typing import Any

from scrapy import Request

from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.spiders import IncrementalSpider


class ListSpider(IncrementalSpider):
    """Fetches the given URLs; one item per page, but the *listings* (pages
    whose URL ends with one of them), which yield nothing, as a listing
    page of a link-following spider yields only requests."""

    name = "list"

    def __init__(self, urls: list[str], meta: dict[str, Any] | None = None,
                 fail_on: tuple[str, ...] = (), headers: dict[str, str] | None = None,
                 listings: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.listings = listings
        self.urls = urls
        self.meta = meta or {}
        self.fail_on = fail_on
        self.headers = headers

    async def start(self):
        for url in self.urls:
            yield Request(url, meta=dict(self.meta), headers=self.headers, dont_filter=True)

    def parse(self, response):
        if any(response.url.endswith(path) for path in self.fail_on):
            raise ValueError(f"callback bug on {response.url}")
        if any(response.url.endswith(path) for path in self.listings):
            return
        yield {
            "url": response.url,
            "title": response.css("title::text").get(),
            "text": " ".join(response.css("main ::text").getall()),
        }


class HeadingSpider(ListSpider):
    """A ListSpider whose item keeps the page's heading only: an edit of the
    page's text (a new version on the test site) leaves the item as it was."""

    name = "heading"

    def parse(self, response):
        yield {"url": response.url, "h1": response.css("h1::text").get()}


class SharedScopeSpider(ListSpider):
    """A ListSpider whose state lives in the scope ``shared``, not its name."""

    name = "scoped"
    incremental_scope = "shared"


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
    the page state must not be there yet (state is never ahead of data)."""

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

        ledger = self.crawler.get_extension(Ledger)
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


# -- user code that makes life hard for the ledger (reviewed hazards) --


class SwallowErrors:
    """A user's spider middleware that logs and swallows callback errors (common)."""
    def process_spider_exception(self, response, exception):
        return []


class HalfSpider(IncrementalSpider):
    """Yields the page's first item, then its callback crashes before the second."""
    name = "half"

    def __init__(self, urls, **kw):
        super().__init__(**kw)
        self.urls = urls

    async def start(self):
        for u in self.urls:
            yield Request(u, dont_filter=True)

    def parse(self, response):
        yield {"url": response.url, "part": 1, "title": response.css("title::text").get()}
        if getattr(self, "crash", False):
            raise ValueError("bug after first item")
        yield {"url": response.url + "?part=2", "part": 2,
               "title": response.css("title::text").get()}


class MetaPassSpider(IncrementalSpider):
    """Passes response.meta on to a follow-up request (a common idiom)."""
    name = "metapass"

    def __init__(self, parent, child, **kw):
        super().__init__(**kw)
        self.parent, self.child = parent, child

    async def start(self):
        yield Request(self.parent, dont_filter=True)

    async def parse(self, response):
        if response.url == self.parent:
            yield Request(self.child, meta=response.meta, dont_filter=True)
            await asyncio.sleep(1.0)   # slow work before the page's item
        yield {"url": response.url, "title": response.css("title::text").get()}


class DiscoveryMetaSpider(IncrementalSpider):
    """A page links to a listing fetched in full (discovery_request), passing meta on."""
    name = "discmeta"

    def __init__(self, page, listing, **kw):
        super().__init__(**kw)
        self.page, self.listing = page, listing

    async def start(self):
        yield Request(self.page, dont_filter=True)

    def parse(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}
        if response.url == self.page:
            yield self.discovery_request(self.listing, meta=response.meta, dont_filter=True)


class Article:
    """A plain class the user's own pipeline turns into a dict (not an itemadapter item)."""
    def __init__(self, url, title):
        self.url, self.title = url, title


class ArticleToDict:
    def process_item(self, item):
        if isinstance(item, Article):
            return {"url": item.url + "?article", "title": item.title}
        return item


class SlowOnFlag:
    async def process_item(self, item):
        if item.get("slow"):
            await asyncio.sleep(0.5)
        return item


class PlainObjectSpider(IncrementalSpider):
    name = "plainobj"

    def __init__(self, url, **kw):
        super().__init__(**kw)
        self.url = url

    async def start(self):
        yield Request(self.url, dont_filter=True)

    def parse(self, response):
        yield Article(response.url, "a")
        yield {"url": response.url, "title": "b", "slow": True}


class NormalizeCopy:
    """A user's pipeline that returns a new, normalised dict (a common style)."""
    def process_item(self, item):
        return {**item, "title": (item.get("title") or "").upper()}


class RejectInput:
    """A user's spider mw that rejects some 2xx responses (ban/captcha check)."""
    def process_spider_input(self, response):
        if response.url.endswith("/p"):
            raise ValueError("looks like a captcha page")


class ErrbackSpider(IncrementalSpider):
    name = "errb"

    def __init__(self, url, **kw):
        super().__init__(**kw)
        self.url = url

    async def start(self):
        yield Request(self.url, errback=self.on_error, dont_filter=True)

    def parse(self, response):
        yield {"url": response.url}

    def on_error(self, failure):
        self.logger.info("gave up on %s", failure.request.url)
        return []
