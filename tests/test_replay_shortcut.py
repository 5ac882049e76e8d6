"""Replay's shortcuts send and schedule what the full replay does.

A documentation manual's link graph (``LoopbackSite.manual``: index pages of
1,200 links, ~120 links per page, fragments, source texts, links off the
site), crawled by a ``CrawlSpider`` with ``LinkExtractor()`` and no
``allow=``, a rule's ``process_request``, a spider middleware of the user's
that drops some requests and tags the others, ``allowed_domains`` (links to
example.org are offsite) and, in one case, ``DEPTH_LIMIT``. After a cold
crawl the store is copied; each later crawl runs once on each copy, with
``INCREMENTAL_REPLAY_SHORTCUTS`` on and off:

- at the same moment, nothing due: with the shortcuts the store shows that
  nothing the start page leads to can matter, and no stand-in is made;
- with one page made due (its revisit time put in the past in both
  copies): the walk gives up, pages are replayed, the seen ones left out;
- two days later, pages changed: every page asked conditionally.

Compared each time: what the server saw (each request, its answer, whether
it was conditional) and the items; where the walk gave up, every request
the scheduler took, stand-ins included (URL, depth, callback, rule, meta the
rule and the middleware set). One concurrent request, so both orders are
the same.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
import pytest_twisted
from scrapy import Request, signals
from scrapy.crawler import CrawlerRunner
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule
from scrapy.utils.defer import deferred_from_coro

from incremental_crawler.state.records import PageKey
from incremental_crawler.state.stores.sqlite import SQLiteStateStore
from tests.clock_util import later
from tests.conftest import crawl_settings
from tests.site import LoopbackSite
from tests.site.manual import CONTENTS, page_path

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from scrapy.crawler import Crawler
    from scrapy.http import Response


class ManualSpider(CrawlSpider):
    name = "manual_shortcut"
    allowed_domains = ("127.0.0.1",)
    rules = (Rule(LinkExtractor(), callback="parse_item", follow=True, process_request="mark"),)

    def __init__(self, start_url: str = "", **kwargs: Any) -> None:
        self.start_urls = [start_url]
        super().__init__(**kwargs)

    def mark(self, request: Request, response: Response) -> Request:
        request.meta["via"] = "rule"
        return request

    def parse_item(self, response: Response) -> dict[str, Any]:
        return {"url": response.url, "title": response.css("title::text").get()}


class DropSomeTagOthers:
    """A user's spider middleware: pages numbered 3 mod 7 are never followed."""

    async def process_spider_output(self, response: Response, result: AsyncIterator[Any]
                                    ) -> AsyncIterator[Any]:
        async for obj in result:
            if isinstance(obj, Request):
                if any(obj.url.split("#")[0].endswith(f"{n:04d}.html")
                       for n in range(3, 60, 7)):
                    continue
                obj.meta["tag"] = "user-mw"
            yield obj


def scheduled_key(request: Request) -> tuple[Any, ...]:
    meta = request.meta
    callback = getattr(request.callback, "__name__", None)
    return (request.url, meta.get("depth"), callback, meta.get("rule"), meta.get("via"),
            meta.get("tag"), request.dont_filter)


async def run(spider_kwargs: dict[str, Any], settings: dict[str, Any], state_uri: str
              ) -> tuple[Crawler, list[tuple[Any, ...]], list[dict[str, Any]]]:
    runner = CrawlerRunner(crawl_settings(state_uri, **settings))
    crawler = runner.create_crawler(ManualSpider)
    # request_scheduled fires before the dupefilter, request_dropped right
    # after it refused the same request: what the scheduler took is the
    # first less the second.
    taken: list[tuple[Any, ...]] = []
    items: list[dict[str, Any]] = []

    def on_scheduled(request: Request, spider: Any) -> None:
        taken.append(scheduled_key(request))

    def on_dropped(request: Request, spider: Any) -> None:
        assert taken.pop() == scheduled_key(request)

    def on_item(item: Any) -> None:
        items.append(dict(item))

    crawler.signals.connect(on_scheduled, signal=signals.request_scheduled)
    crawler.signals.connect(on_dropped, signal=signals.request_dropped)
    crawler.signals.connect(on_item, signal=signals.item_scraped)
    # The dispatcher keeps weak references: keep the handlers alive.
    crawler._handlers = (on_scheduled, on_dropped, on_item)  # type: ignore[attr-defined]
    await runner.crawl(crawler, **spider_kwargs)
    return crawler, taken, items


def served(site: LoopbackSite) -> list[tuple[str, int, bool]]:
    return sorted((r.path, r.status, r.if_none_match is not None or r.if_modified_since
                   is not None) for r in site.log)


@pytest.mark.parametrize(("start", "depth_limit"), [(CONTENTS, 0), (page_path(5), 1)])
@pytest_twisted.ensureDeferred
async def test_leaving_out_seen_requests_schedules_what_the_full_replay_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str, depth_limit: int) -> None:
    site = LoopbackSite.manual(30, page_size=1500)
    site.start()
    try:
        await _compare(site, tmp_path, monkeypatch, start, depth_limit)
    finally:
        await site.stop()


async def _compare(site: LoopbackSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   start: str, depth_limit: int) -> None:
    settings = {
        "INCREMENTAL_REVISIT_ENABLED": True,
        "CONCURRENT_REQUESTS": 1,
        "DEPTH_LIMIT": depth_limit,
        "SPIDER_MIDDLEWARES": {f"{__name__}.DropSomeTagOthers": 500},
        # No flush before a crawl's end (its ~30 pages stay under the batch
        # size). A 304's check becomes visible to the store's reads only
        # once flushed; the start page comes back at depth 1 (it links to
        # itself, and the start request's dont_filter left the dupefilter
        # without it), and is decided again on what the store shows: with a
        # flush in between (every second by default) not due, without one
        # due and asked twice. Which of the two runs that compare got a
        # flush there depended on the machine's speed.
        "INCREMENTAL_FLUSH_INTERVAL": 3600,
    }
    kwargs = {"start_url": site.url(start)}
    shortcut, full = tmp_path / "shortcut.db", tmp_path / "full.db"
    first, cold, _ = await run(kwargs, settings, f"sqlite:///{shortcut}")
    assert first.stats.get_value("incremental/replay/recorded_pages")
    # Fragments and repeats were not stored: the index pages alone yield hundreds each.
    assert first.stats.get_value("incremental/replay/duplicates_not_recorded") > 0
    with sqlite3.connect(shortcut) as src, sqlite3.connect(full) as dst:
        src.backup(dst)
    # Offsite links and the middleware's drops were never scheduled.
    assert not any("example.org" in key[0] for key in cold)
    assert [k for k in cold if k[5] != "user-mw" and k[0] != site.url(start)
            and not k[0].startswith("data:")] == []  # (the re-seeder's own request)

    due_one = page_path(22)
    edited = [page_path(i) for i in (1, 8, 22, 28)]
    moments = (("the same moment", [], None), ("one page due", [], due_one),
               ("two days later", edited, None))
    for moment, changed, made_due in moments:
        for path in changed:
            site.change(path)
        if changed:
            later(monkeypatch, 2)
        if made_due:
            # Through the store, as a crawl writes (a write by other means
            # would not move its write generation: the walk's memo, kept
            # by the crawl before, would be taken).
            for db in (shortcut, full):
                store = SQLiteStateStore(db)
                key = PageKey(ManualSpider.name, site.url(made_due))
                stored = await deferred_from_coro(store.get_page(key))
                assert stored is not None
                store.stage_page(stored.copy(next_visit=1))
                await deferred_from_coro(store.close())
        outcomes, scheduled_all, built, walked = {}, {}, {}, {}
        everything_served: dict[str, list[tuple[str, int, bool]]] = {}
        for name, uri, on in (("shortcut", shortcut, True), ("full", full, False)):
            site.reset_log()
            crawler, scheduled, items = await run(
                kwargs, {**settings, "INCREMENTAL_REPLAY_SHORTCUTS": on}, f"sqlite:///{uri}")
            stats = crawler.stats
            # (robots.txt apart: a crawl that sends no request needs none.)
            outcomes[name] = ([r for r in served(site) if r[0] != "/robots.txt"],
                              sorted(item["url"] for item in items))
            everything_served[name] = served(site)
            scheduled_all[name] = sorted(scheduled, key=repr)
            built[name] = (stats.get_value("incremental/replay/requests", 0),
                           stats.get_value("incremental/replay/seen_left_out", 0))
            walked[name] = stats.get_value("incremental/replay/walk/inert_pages", 0)
        assert outcomes["shortcut"] == outcomes["full"], moment
        assert walked["full"] == 0, moment
        if moment == "the same moment":
            # Nothing due: nothing sent either way; with the shortcuts no
            # stand-in, no page replayed, every reachable page found inert.
            assert outcomes["shortcut"][0] == []
            assert everything_served["shortcut"] == []  # not even robots.txt
            assert built["shortcut"] == (0, 0)
            assert walked["shortcut"] > 0 and built["full"][0] > 0
            assert len(scheduled_all["shortcut"]) < len(scheduled_all["full"])
            continue
        # The walk gave up (a page due): the same requests scheduled, stand-ins
        # included; the full replay built what the shortcut built plus what it
        # left out.
        assert walked["shortcut"] == 0, moment
        assert scheduled_all["shortcut"] == scheduled_all["full"], moment
        assert built["full"] == (sum(built["shortcut"]), 0), moment
        if not depth_limit:
            # (Under DEPTH_LIMIT 1 the pages reached record no links.)
            assert built["shortcut"][1] > built["shortcut"][0], moment
        if made_due:
            assert outcomes["shortcut"][0] == [(made_due, 304, True)], moment
        if changed:
            # Every page due and asked; the changed ones found (those the
            # depth limit or the middleware let the crawl reach).
            found = {site.url(p) for p in changed} & {key[0] for key in cold}
            assert found and set(outcomes["shortcut"][1]) == found


class ErrbackSpider(CrawlSpider):
    """Records its errbacks' calls."""

    name = "manual_errback"
    allowed_domains = ("127.0.0.1",)
    rules = (Rule(LinkExtractor(), callback="parse_item", errback="failed", follow=True),)
    failures: ClassVar[list[tuple[str, str]]] = []

    def __init__(self, start_url: str = "", **kwargs: Any) -> None:
        self.start_urls = [start_url]
        super().__init__(**kwargs)

    def parse_item(self, response: Response) -> dict[str, Any]:
        return {"url": response.url}

    def failed(self, failure: Any) -> None:
        type(self).failures.append((failure.request.url, type(failure.value).__name__))


@pytest_twisted.ensureDeferred
async def test_a_304_whose_links_were_all_seen_ends_as_its_stand_in_would(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page answering 304 whose recorded requests the dupefilter saw
    already ends without a stand-in response (it would yield nothing), and
    calls neither its callback nor its errback, as its stand-in would not:
    two days later, the errbacks called (the 304s of pages without links,
    ``NotModified``) and what the server saw are those of the full replay."""
    site = LoopbackSite.manual(30, page_size=1000)
    site.start()
    try:
        shortcut, full = tmp_path / "shortcut.db", tmp_path / "full.db"
        kwargs = {"start_url": site.url(CONTENTS)}
        base = {"INCREMENTAL_REVISIT_ENABLED": True, "CONCURRENT_REQUESTS": 1}
        await CrawlerRunner(crawl_settings(f"sqlite:///{shortcut}", **base)).crawl(
            ErrbackSpider, **kwargs)
        with sqlite3.connect(shortcut) as src, sqlite3.connect(full) as dst:
            src.backup(dst)
        later(monkeypatch, 2)
        seen: dict[bool, tuple[list[Any], list[Any]]] = {}
        for on, db in ((True, shortcut), (False, full)):
            ErrbackSpider.failures.clear()
            site.reset_log()
            runner = CrawlerRunner(crawl_settings(
                f"sqlite:///{db}", **base, INCREMENTAL_REPLAY_SHORTCUTS=on))
            crawler = runner.create_crawler(ErrbackSpider)
            await runner.crawl(crawler, **kwargs)
            assert crawler.stats is not None
            if on:
                # Some pages' links were all seen when they answered.
                assert crawler.stats.get_value("incremental/replay/no_stand_in", 0) >= 10
            seen[on] = (sorted(ErrbackSpider.failures), served(site))
        assert seen[True] == seen[False]
        assert {status for _, status, _ in seen[True][1]} <= {304, 200}
        assert seen[True][0] and {kind for _, kind in seen[True][0]} == {"NotModified"}
    finally:
        await site.stop()
