"""The stored-graph walk's memo: taken while nothing was written and
nothing fell due, never past either.

A documentation manual (``LoopbackSite.manual``: index pages of hundreds
of links, fragments, links off the site) crawled by a ``CrawlSpider`` with
``LinkExtractor()``, revisits on. After the cold crawl, re-crawls at the
same moment: the first walks the stored links and keeps a memo; the next
takes it (nothing read, nothing sent). Then each thing that must end a
memo, one at a time, with what the server saw and what the store holds:
a page forgotten by a repair (found again, as new), another crawl's flush,
the settings, a day later (every page due: asked conditionally), and a
damaged memo.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
from scrapy import Request
from scrapy.downloadermiddlewares.offsite import OffsiteMiddleware
from scrapy.linkextractors import LinkExtractor
from scrapy.settings import Settings
from scrapy.spiders import CrawlSpider, Rule
from scrapy.utils.defer import deferred_from_coro

from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.state.records import PageKey
from incremental_crawler.state.stores import open_store
from tests.clock_util import later
from tests.site import LoopbackSite
from tests.site.manual import CONTENTS, page_path

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from scrapy.crawler import Crawler
    from scrapy.http import Response

    Crawl = Callable[..., Awaitable[Crawler]]


class ManualSpider(CrawlSpider):
    name = "manual_memo"
    allowed_domains = ("127.0.0.1",)
    rules = (Rule(LinkExtractor(), callback="parse_item", follow=True),)

    def __init__(self, start_url: str = "", **kwargs: Any) -> None:
        self.start_urls = [start_url]
        super().__init__(**kwargs)

    def parse_item(self, response: Response) -> dict[str, Any]:
        return {"url": response.url, "title": response.css("title::text").get()}


SETTINGS = {"INCREMENTAL_REVISIT_ENABLED": True, "CONCURRENT_REQUESTS": 4}


def memo_stats(crawler: Crawler) -> dict[str, Any]:
    stats = crawler.stats.get_stats()  # type: ignore[union-attr]
    return {key.removeprefix("incremental/replay/walk/"): value for key, value in stats.items()
            if key.startswith("incremental/replay/walk/")}


def pages_served(site: LoopbackSite) -> list[tuple[str, int, bool]]:
    """What the server saw, robots.txt apart: (path, status, conditional)."""
    return sorted((r.path, r.status, r.if_none_match is not None
                   or r.if_modified_since is not None)
                  for r in site.log if r.path != "/robots.txt")


async def in_store(state_uri: str, job: Callable[[Any], Any]) -> Any:
    """Run *job* on the store a crawl with these settings opens (a repair
    between crawls, as ``scrapy state`` makes one); a coroutine it returns
    is awaited as Scrapy runs one."""
    store = open_store(Settings({"INCREMENTAL_STATE_URI": state_uri}))
    try:
        done = job(store)
        if inspect.isawaitable(done):
            done = await deferred_from_coro(done)
        return done
    finally:
        await deferred_from_coro(store.close())


@pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_memo_is_taken_until_a_write_or_time_ends_it(
        crawl: Crawl, state_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    site = LoopbackSite.manual(24, page_size=1500)
    site.start()
    try:
        kwargs = {"start_url": site.url(CONTENTS)}
        cold = await crawl(ManualSpider, settings=SETTINGS, **kwargs)
        known = len(cold.collected)  # type: ignore[attr-defined]
        assert known > 20

        # Same moment: the walk reads the store and keeps its answer.
        site.reset_log()
        first = await crawl(ManualSpider, settings=SETTINGS, **kwargs)
        walked = memo_stats(first)
        assert walked["inert_pages"] >= known and walked["memo/kept"] == 1
        assert "memo/taken" not in walked
        assert pages_served(site) == []

        # Again: the memo is taken; no page read, nothing sent.
        second = await crawl(ManualSpider, settings=SETTINGS, **kwargs)
        assert memo_stats(second) == {"memo/taken": 1}
        assert pages_served(site) == [] and second.collected == []  # type: ignore[attr-defined]

        # A repair forgets a page the start page leads to: the memo is
        # stale, the walk meets a page the store does not know and gives
        # up, and the page is fetched again as new.
        forgotten = page_path(22)
        removed = await in_store(state_uri, lambda store: store.forget_page(
            "manual_memo", site.url(forgotten)))
        assert removed.pages == 1
        third = await crawl(ManualSpider, settings=SETTINGS, **kwargs)
        walked = memo_stats(third)
        assert walked["memo/not_taken/written"] == 1 and walked["gave_up"] == 1
        assert (forgotten, 200, False) in pages_served(site)
        assert site.url(forgotten) in [i["url"] for i in third.collected]  # type: ignore[attr-defined]

        # That crawl's own writes (its flush) end the memo too; the next
        # walk keeps a new one, taken by the crawl after.
        site.reset_log()
        fourth = await crawl(ManualSpider, settings=SETTINGS, **kwargs)
        assert memo_stats(fourth)["memo/kept"] == 1
        assert pages_served(site) == []
        assert memo_stats(await crawl(ManualSpider, settings=SETTINGS, **kwargs)) == {
            "memo/taken": 1}

        # Other settings: the memo is not taken (the walk answers again).
        other = await crawl(ManualSpider, settings={**SETTINGS, "INCREMENTAL_MAX_AGE": 10**7},
                            **kwargs)
        walked = memo_stats(other)
        assert walked["memo/not_taken/settings"] == 1 and walked["memo/kept"] == 1
        assert pages_served(site) == []

        # A memo whose bounds say a page it reached falls due (its earliest
        # next visit made now) is not taken: the walk answers again.
        key = PageKey("manual_memo", site.url(CONTENTS))
        kept = json.loads(await in_store(state_uri, lambda store: store.get_walk_memo(
            key.scope, f" {key.url}")))
        # The earliest next visit of the pages the walk reached (every page).
        earliest = await in_store(state_uri, lambda store: min(
            page.next_visit for page in store.iter_pages(key.scope)))
        assert kept["due_before"] == earliest
        await in_store(state_uri, lambda store: store.put_walk_memo(
            key.scope, f" {key.url}", json.dumps({**kept, "due_before": time.time()})))
        walked = memo_stats(await crawl(
            ManualSpider, settings={**SETTINGS, "INCREMENTAL_MAX_AGE": 10**7}, **kwargs))
        assert walked["memo/not_taken/due"] == 1 and walked["memo/kept"] == 1
        assert pages_served(site) == []

        # A damaged memo is not taken: the walk answers and writes it anew.
        await in_store(state_uri, lambda store: store.put_walk_memo(
            key.scope, f" {key.url}", "{not json"))
        damaged = await crawl(ManualSpider, settings={**SETTINGS, "INCREMENTAL_MAX_AGE": 10**7},
                              **kwargs)
        walked = memo_stats(damaged)
        assert walked["memo/kept"] == 1 and walked["inert_pages"] >= known
        assert pages_served(site) == []

        # A day later every page is due, the start page first: asked with
        # its validators, as every page it leads to; no memo is asked.
        later(monkeypatch, 1)
        day = await crawl(ManualSpider, settings={**SETTINGS, "INCREMENTAL_MAX_AGE": 10**7},
                          **kwargs)
        assert "memo/taken" not in memo_stats(day)
        served = pages_served(site)
        assert len(served) >= known and all(conditional for _, _, conditional in served)
    finally:
        await site.stop()


@pytest_twisted.ensureDeferred
async def test_no_memo_is_taken_or_kept_while_this_crawl_has_writes_not_flushed(
        crawl: Crawl, state_uri: str) -> None:
    """A page this crawl wrote but has not flushed is not counted in the
    store's write generation yet, and the walk reads it: a memo taken then
    could stand for links that changed, and one kept then would outlive
    those writes if they were lost (a crawl killed before its flush). Start
    pages: a page the contents page leads to, forgotten by a repair (fetched
    again, as new: its state staged, no flush before the crawl's end), then
    the contents page, whose memo the crawl before kept."""
    site = LoopbackSite.manual(30, page_size=1500)
    site.start()
    try:
        settings = {**SETTINGS, "CONCURRENT_REQUESTS": 1, "INCREMENTAL_FLUSH_INTERVAL": 3600}
        contents = {"start_url": site.url(CONTENTS)}
        await crawl(ManualSpider, settings=settings, **contents)
        kept = await crawl(ManualSpider, settings=settings, **contents)
        assert memo_stats(kept)["memo/kept"] == 1
        forgotten = page_path(5)
        await in_store(state_uri, lambda store: store.forget_page(
            "manual_memo", site.url(forgotten)))

        class TwoStarts(ManualSpider):
            name = "manual_memo"

            async def start(self) -> Any:
                yield Request(site.url(forgotten), callback=self.parse_item)
                # The first start request's page is staged before the second
                # leaves (waited for at most 30 s).
                store = Ledger.for_component(self.crawler).store
                for _ in range(3000):
                    if store.pending:
                        break
                    await asyncio.sleep(0.01)
                yield Request(site.url(CONTENTS))

        site.reset_log()
        two = await crawl(TwoStarts, settings=settings)
        walked = memo_stats(two)
        assert walked["memo/not_taken/staged"] == 1
        # The walk found everything inert (the forgotten page's staged state
        # among it), and kept nothing.
        assert walked["inert_pages"] > 25 and "memo/kept" not in walked
        assert [path for path, _, _ in pages_served(site)] == [forgotten]
    finally:
        await site.stop()


class OwnOffsite(OffsiteMiddleware):
    """A project's offsite policy: anything but the manual's source texts."""

    def should_follow(self, request: Request, spider: Any) -> bool:
        return "/_sources/" not in request.url and super().should_follow(request, spider)


class AlsoExampleOrg(ManualSpider):
    """The same spider (name, class), another ``allowed_domains``."""

    allowed_domains = ("127.0.0.1", "example.org")


AlsoExampleOrg.__qualname__ = ManualSpider.__qualname__


class RenamedCallback(ManualSpider):
    """The same spider (name, class), its callback renamed: stored requests
    naming ``parse_item`` cannot be made again."""

    rules = (Rule(LinkExtractor(), callback="parse_page", follow=True),)
    parse_item = None  # type: ignore[assignment]

    def parse_page(self, response: Response) -> dict[str, Any]:
        return {"url": response.url}


RenamedCallback.__qualname__ = ManualSpider.__qualname__


@pytest_twisted.ensureDeferred
async def test_what_else_the_walk_read_ends_a_memo(crawl: Crawl, state_uri: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The host pattern of the offsite check and the spider's callbacks end
    a memo; a project's own ``should_follow`` keeps none; and a write by
    another process while the walk reads makes the memo it keeps stale."""
    site = LoopbackSite.manual(30, page_size=1500)
    site.start()
    try:
        kwargs = {"start_url": site.url(CONTENTS)}
        await crawl(ManualSpider, settings=SETTINGS, **kwargs)
        assert memo_stats(await crawl(ManualSpider, settings=SETTINGS, **kwargs))[
            "memo/kept"] == 1
        walked = memo_stats(await crawl(AlsoExampleOrg, settings=SETTINGS, **kwargs))
        assert walked["memo/not_taken/settings"] == 1 and walked["memo/kept"] == 1

        own = {**SETTINGS, "DOWNLOADER_MIDDLEWARES": {
            "scrapy.downloadermiddlewares.offsite.OffsiteMiddleware": None,
            f"{__name__}.OwnOffsite": 50}}
        for _ in range(2):
            walked = memo_stats(await crawl(ManualSpider, settings=own, **kwargs))
            assert walked["inert_pages"] > 25 and not any(k.startswith("memo/") for k in walked)

        # Another process writes a page while the walk reads the links: the
        # memo kept carries the generation from before, and is not taken.
        # (A write first, so that this crawl walks.)
        await in_store(state_uri, lambda store: _flush(store, PageKey(
            "manual_memo", site.url(page_path(7)))))
        store_class = type(open_store(Settings({"INCREMENTAL_STATE_URI": state_uri})))
        reads = store_class.get_links_many
        written: list[bool] = []

        async def write_meanwhile(self: Any, keys: Any) -> Any:
            if not written:
                written.append(True)
                # (In the crawl's asyncio task: the store's coroutines awaited as they are.)
                other = open_store(Settings({"INCREMENTAL_STATE_URI": state_uri}))
                await _flush(other, PageKey("manual_memo", site.url(page_path(7))))
                await other.close()
            return await reads(self, keys)

        monkeypatch.setattr(store_class, "get_links_many", write_meanwhile)
        walked = memo_stats(await crawl(ManualSpider, settings=SETTINGS, **kwargs))
        assert written and walked["memo/kept"] == 1
        monkeypatch.setattr(store_class, "get_links_many", reads)
        walked = memo_stats(await crawl(ManualSpider, settings=SETTINGS, **kwargs))
        assert walked["memo/not_taken/written"] == 1 and walked["memo/kept"] == 1

        # Last: the pages are recorded with the new callback from here on.
        site.reset_log()
        renamed = await crawl(RenamedCallback, settings=SETTINGS, **kwargs)
        walked = memo_stats(renamed)
        # The walk meets a request it cannot make again: it gives up, and the
        # replay marks the pages whose stored requests name the old callback,
        # fetched in full by the next crawl.
        assert walked["memo/not_taken/settings"] == 1 and walked["gave_up"] == 1
        await crawl(RenamedCallback, settings=SETTINGS, **kwargs)
        assert (CONTENTS, 200, False) in pages_served(site)

    finally:
        await site.stop()


def _flush(store: Any, key: PageKey) -> Any:
    """A write of *key*'s page that changes nothing it decides on (a flag
    the walk does not read)."""
    store.stage_flags(key, 0)
    return store.flush()
