"""The offsite check by URL (:func:`offsite_url_drops`) answers as Scrapy's
OffsiteMiddleware does for the request of that URL (:func:`offsite_drops`),
asked in a running crawl: the stored-graph walk decides plain stored
requests by the first without building them, and a request it took for
offsite that the middleware lets through would be a page the walk never
looked at."""

from __future__ import annotations

from typing import Any

import pytest_twisted
from scrapy import Request, Spider
from scrapy.downloadermiddlewares.offsite import OffsiteMiddleware

from incremental_crawler.offsite import offsite_drops, offsite_url_drops

URLS = [
    "http://127.0.0.1:1/a", "http://127.0.0.1/b?q=1#f", "https://127.0.0.1:8443/",
    "http://example.com/", "http://www.example.com/x", "http://deep.www.example.com/",
    "http://notexample.com/", "http://example.com.evil.test/", "http://EXAMPLE.com/up",
    "http://user:pw@example.com:8080/p", "http://[::1]:8080/v6", "http://[::1]/",
    "http://example.org/", "http://127.0.0.2/", "data:,hello", "ftp://example.com/f",
    "file:///tmp/x", "http://evil.test\\@example.com/x", "http://example.com/p@evil.test",
    "http:///x", "http://ex%61mple.com/", "http://example.com?q=1", "http://example.com#f",
]


class AskingSpider(Spider):
    name = "asking"
    allowed_domains = ("127.0.0.1", "example.com", "::1")

    def __init__(self, start_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [start_url]
        self.answers: list[tuple[str, bool, bool]] = []

    def parse(self, response: Any) -> Any:
        by_request = offsite_drops(self.crawler)
        by_url = offsite_url_drops(self.crawler)
        assert by_url is not None
        # Twice: the second answer of a site comes from the memo.
        for url in URLS + URLS:
            self.answers.append((url, by_url(url), by_request(Request(url))))
        return []


class RootOnly(OffsiteMiddleware):
    """A project's policy reading more than the host name."""

    def should_follow(self, request: Request, spider: Spider) -> bool:
        return not request.url.endswith("/x")


class RefusedSpider(AskingSpider):
    name = "refused"

    def parse(self, response: Any) -> Any:
        self.answers.append(("", offsite_url_drops(self.crawler) is None, True))
        return []


@pytest_twisted.ensureDeferred
async def test_the_check_by_url_answers_as_the_middleware(site, crawl) -> None:
    site.add_page("/start", "strong", size=200)
    crawler = await crawl(AskingSpider, start_url=site.url("/start"))
    answers = crawler.spider.answers
    assert len(answers) == 2 * len(URLS)
    assert [(url, by_url) for url, by_url, _ in answers] == [
        (url, by_request) for url, _, by_request in answers]
    # Both kinds of answer were asked (not a check that lets all through).
    assert {by_url for _, by_url, _ in answers} == {True, False}


@pytest_twisted.ensureDeferred
async def test_a_projects_own_offsite_policy_is_not_read_by_url(site, crawl) -> None:
    site.add_page("/start", "strong", size=200)
    middlewares = {"scrapy.downloadermiddlewares.offsite.OffsiteMiddleware": None,
                   f"{__name__}.RootOnly": 50}
    crawler = await crawl(RefusedSpider, settings={"DOWNLOADER_MIDDLEWARES": middlewares},
                          start_url=site.url("/start"))
    assert crawler.spider.answers == [("", True, True)]
