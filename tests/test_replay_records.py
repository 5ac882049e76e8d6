"""What a page's links record keeps: every request the crawl could schedule.

Requests are recorded once per fingerprint, but two requests of one
fingerprint that the not-due filter or the offsite check tell apart (one
dropped before the dupefilter, the other let through) are both kept; and a
record made under another request fingerprinter is not replayed by this
one's fingerprints (the page is fetched in full and recorded again). The
reproductions came from a review of the recording change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
import scrapy
from scrapy import Request
from scrapy.utils.request import fingerprint

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from scrapy.http import Response

REVISITS = {"INCREMENTAL_REVISIT_ENABLED": True}


class TwinSpider(scrapy.Spider):
    """The listing yields one URL twice: plainly, then with a meta key that
    lets it through where the plain one is dropped."""

    name = "twins"
    allowed_domains = ("127.0.0.1",)
    incremental_reseed = False

    def __init__(self, start: str = "", target: str = "", twin: str = "", **kw: Any) -> None:
        super().__init__(**kw)
        self.start_url, self.target, self.twin = start, target, twin

    async def start(self) -> AsyncIterator[Any]:
        yield Request(self.start_url, callback=self.parse_listing)

    def parse_listing(self, response: Response) -> Any:
        yield Request(self.target, callback=self.parse_page)
        meta = ({"allow_offsite": True} if self.twin == "offsite"
                else {"incremental_refresh": True})
        yield Request(self.target, callback=self.parse_page, meta=meta)

    def parse_page(self, response: Response) -> Any:
        yield {"url": response.url}


@pytest.mark.parametrize("twin", ["offsite", "refresh"])
@pytest_twisted.ensureDeferred
async def test_the_twin_that_was_scheduled_is_replayed(site, crawl, twin):
    site.add_page("/list", "strong", size=1500)
    site.add_page("/p/x", "strong", size=1500)
    if twin == "offsite":
        # Another host name of the same server: offsite unless allow_offsite;
        # every page due (revisits off): the list answers 304 and is replayed.
        target = site.url("/p/x").replace("127.0.0.1", "localhost")
        settings: dict[str, Any] = {}
    else:
        # The list is not due and replayed; the twin asks for a full fetch.
        target, settings = site.url("/p/x"), REVISITS
    args = {"start": site.url("/list"), "target": target, "twin": twin}
    await crawl(TwinSpider, settings=settings, **args)
    # The first crawl fetched the target, through the twin.
    assert [r.status for r in site.requests_for("/p/x")] == [200]
    site.change("/p/x")
    site.reset_log()
    await crawl(TwinSpider, settings=settings, **args)
    # The list's replay yields the twin, which is asked again.
    assert [r.status for r in site.requests_for("/list")] == (
        [304] if twin == "offsite" else [])
    assert [r.status for r in site.requests_for("/p/x")] == [200]


class KeepFragments:
    """A project's request fingerprinter telling fragments apart (a hash-routed site)."""

    def fingerprint(self, request: Request) -> bytes:
        return fingerprint(request, keep_fragments=True)


class FragmentSpider(scrapy.Spider):
    name = "fragments"
    incremental_reseed = False

    def __init__(self, base: str = "", **kw: Any) -> None:
        super().__init__(**kw)
        self.base = base

    async def start(self) -> AsyncIterator[Any]:
        yield Request(self.base + "/a", callback=self.parse_page)
        yield Request(self.base + "/list", callback=self.parse_list)

    def parse_list(self, response: Response) -> Any:
        yield Request(self.base + "/a#one", callback=self.parse_page)
        yield Request(self.base + "/a#two", callback=self.parse_page)

    def parse_page(self, response: Response) -> Any:
        yield {"url": response.url}


@pytest.mark.parametrize("shortcuts", [True, False])
@pytest_twisted.ensureDeferred
async def test_a_record_of_another_fingerprinter_is_fetched_again(site, crawl, shortcuts):
    site.add_page("/a", "strong", size=1500)
    site.add_page("/list", "strong", size=1500)
    base = site.url("").rstrip("/")
    await crawl(FragmentSpider, settings={"CONCURRENT_REQUESTS": 1}, base=base)
    site.reset_log()
    second = await crawl(FragmentSpider, settings={
        "CONCURRENT_REQUESTS": 1, "INCREMENTAL_REPLAY_SHORTCUTS": shortcuts,
        "REQUEST_FINGERPRINTER_CLASS": f"{__name__}.KeepFragments"}, base=base)
    # /list's record kept one of /a#one and /a#two (one fingerprint then):
    # under a fingerprinter that tells them apart it is fetched in full, and
    # both are asked, as its callback yields them.
    assert [r.status for r in site.requests_for("/list")] == [200]
    assert len(site.requests_for("/a")) == 3
    assert second.stats.get_value("incremental/replay/record_other_fingerprinter") == 1
    assert second.stats.get_value("incremental/replay/seen_left_out") is None
