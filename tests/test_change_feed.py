"""The change feed on real crawls: items say what they are; gone pages become tombstones, once.

Successive crawls of the loopback site (the clock shifted between them)
with a SQLite store; the site's log says what was asked, the store what
was kept. The last test runs two cluster workers on a Redis store.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
import pytest_twisted
import scrapy
from scrapy.exceptions import DropItem
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro
from twisted.internet.defer import Deferred

from incremental_crawler import clock
from incremental_crawler.crawl import ledger as ledger_module
from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from incremental_crawler.state.keys import canonical_url
from incremental_crawler.state.records import PageFlags, PageKey, PageState
from incremental_crawler.state.stores import open_store
from tests.cluster_worker import Worker, crawl_in_process, leftover_keys, page_gets
from tests.follow_spider import StartsSpider
from tests.spiders import HalfSpider, ListSpider
from tests.test_failures import serve

if TYPE_CHECKING:
    from collections.abc import Iterable

DAY = 86_400.0
MINUTE = 60.0
RECHECK = 30 * DAY

#: Revisits on, one day first: a page is not due a minute after its visit.
REVISITS = {
    "INCREMENTAL_REVISIT_ENABLED": True,
    "INCREMENTAL_REVISIT_INITIAL": DAY,
    "INCREMENTAL_REVISIT_MIN": 3600,
    "INCREMENTAL_REVISIT_MAX": 30 * DAY,
    "INCREMENTAL_RECHECK_EVERY": 0,
}


def at(monkeypatch: pytest.MonkeyPatch, offset: float) -> None:
    """Every date-dependent decision of the next crawls *offset* seconds ahead."""
    monkeypatch.setattr(clock, "now", lambda: time.time() + offset)


class Recorder:
    """A user's pipeline that records every item it sees (tombstones included)."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def process_item(self, item: Any) -> Any:
        Recorder.seen.append(dict(item))
        return item


class DropTombstones:
    """A user's pipeline that drops tombstones (it has no index to update)."""

    def process_item(self, item: Any) -> Any:
        if item.get("change") == "deleted":
            raise DropItem("no index here")
        return item


class FailOnTombstones:
    """A user's pipeline whose index is down when a tombstone comes."""

    def process_item(self, item: Any) -> Any:
        if item.get("change") == "deleted":
            raise RuntimeError("index unavailable")
        return item


class SlowTombstones:
    """A user's pipeline that takes its time over tombstones (a remote index)."""

    async def process_item(self, item: Any) -> Any:
        if item.get("change") == "deleted":
            await asyncio.sleep(0.5)
        return item


class CopyItems:
    """A user's pipeline that returns a copy of every item (a common style)."""

    def process_item(self, item: Any) -> Any:
        return dict(item)


@pytest.fixture(autouse=True)
def _recorder() -> Iterable[None]:
    Recorder.seen = []
    yield
    Recorder.seen = []


def pipelines(*classes: type) -> dict[str, Any]:
    return {"ITEM_PIPELINES": {f"{__name__}.{cls.__name__}": 500 + i
                               for i, cls in enumerate(classes)}}


def deleted(items: list[Any]) -> list[dict[str, Any]]:
    return [dict(item) for item in items if item.get("change") == "deleted"]


def gets(site: Any, path: str) -> list[Any]:
    return [r for r in site.requests_for(path) if r.method == "GET"]


class Store:
    """Reads the crawls' store through its interface, between crawls."""

    def __init__(self, state_uri: str, scope: str) -> None:
        self.uri, self.scope = state_uri, scope

    async def _with(self, read: Any) -> Any:
        store = open_store(Settings({"INCREMENTAL_STATE_URI": self.uri}))
        try:
            return await deferred_from_coro(read(store))
        finally:
            await deferred_from_coro(store.close())

    async def page(self, url: str) -> PageState | None:
        return await self._with(lambda s: s.get_page(PageKey(self.scope, url)))

    async def fingerprint(self, key: str) -> str | None:
        return await self._with(lambda s: s.get_item_fingerprint(self.scope, key))

    async def page_items(self, url: str) -> list[str]:
        return await self._with(lambda s: s.get_page_items(self.scope, url))

    async def versions(self, key: str) -> list[tuple[str, str]]:
        async def read(store: Any) -> list[tuple[str, str]]:
            return [(v.change, v.fingerprint) for v in store.iter_versions(
                self.scope, every_version=True) if v.key == key]
        return await self._with(read)


def crawl_start(crawler: Any) -> float:
    ledger = crawler.get_extension(Ledger)
    assert ledger is not None
    return ledger.crawl_started


# -- A. every item says what it is --------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_items_say_new_or_changed_with_the_fingerprint_they_replace(
    site, crawl, state_uri, monkeypatch
):
    site.add_page("/a", "strong", size=1500)
    site.add_page("/b", "strong", size=1500)
    urls = [site.url("/a"), site.url("/b")]
    settings = {"INCREMENTAL_CHANGED_FIELDS_FIELD": "changed_fields", **pipelines(CopyItems)}
    at(monkeypatch, 0)
    first = await crawl(ListSpider, urls=urls, settings=settings)
    assert sorted((i["url"], i["change"]) for i in first.collected) == [
        (urls[0], "new"), (urls[1], "new")]
    assert all("previous_fingerprint" not in i and "changed_fields" not in i
               for i in first.collected)
    before = {i["url"]: i["fingerprint"] for i in first.collected}
    # The change feed's fields never count in the fingerprint.
    ledger = first.get_extension(Ledger)
    assert all(ledger.identity.fingerprint(i) == i["fingerprint"] for i in first.collected)

    site.change("/a")
    at(monkeypatch, MINUTE)
    second = await crawl(ListSpider, urls=urls, settings=settings)
    [item] = second.collected  # /b is unchanged: dropped
    assert item["url"] == urls[0] and item["change"] == "changed"
    assert item["previous_fingerprint"] == before[urls[0]] != item["fingerprint"]
    # The page's new version changed its title and main text, not its URL.
    assert item["changed_fields"] == ["text", "title"]
    assert second.get_extension(Ledger).identity.fingerprint(item) == item["fingerprint"]
    # The store keeps what each version was, and the page it came from;
    # a pipeline's copy kept its change field all the same.
    store = Store(state_uri, "list")
    assert [c for c, _ in await store.versions(canonical_url(urls[0]))] == ["new", "changed"]
    assert await store.page_items(canonical_url(urls[0])) == [canonical_url(urls[0])]
    assert second.stats.get_value("incremental/items_changed") == 1


class PageItem(scrapy.Item):
    """An item class with none of the change feed's fields (nor a fingerprint)."""

    url = scrapy.Field()
    title = scrapy.Field()
    text = scrapy.Field()


class ItemClassSpider(ListSpider):
    name = "itemclass"

    def parse(self, response: Any) -> Any:
        for item in super().parse(response):
            yield PageItem(**item)


@pytest_twisted.ensureDeferred
async def test_an_item_class_without_those_fields_passes_unharmed(
    site, crawl, state_uri, monkeypatch
):
    site.add_page("/a", "strong", size=1500)
    urls = [site.url("/a")]
    settings = {"INCREMENTAL_CHANGED_FIELDS_FIELD": "changed_fields"}
    at(monkeypatch, 0)
    first = await crawl(ItemClassSpider, urls=urls, settings=settings)
    site.change("/a")
    at(monkeypatch, MINUTE)
    second = await crawl(ItemClassSpider, urls=urls, settings=settings)
    for crawler in (first, second):
        [item] = crawler.collected
        assert isinstance(item, PageItem) and set(item) == {"url", "title", "text"}
        assert crawler.stats.get_value("item_scraped_count") == 1
        assert crawler.stats.get_value("log_count/ERROR") is None
    # The store knows what each version was all the same.
    store = Store(state_uri, "itemclass")
    assert [c for c, _ in await store.versions(canonical_url(urls[0]))] == ["new", "changed"]


# -- B. gone pages become tombstones, once ---------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_410_yields_one_tombstone_and_a_page_that_comes_back_is_new(
    site, crawl, state_uri, monkeypatch, caplog
):
    site.add_page("/a", "strong", size=1500)
    site.add_page("/b", "strong", size=1500)
    urls = [site.url("/a"), site.url("/b")]
    a = canonical_url(urls[0])
    store = Store(state_uri, "list")

    async def run(offset: float) -> Any:
        site.reset_log()
        at(monkeypatch, offset)
        return await crawl(ListSpider, urls=urls, settings=pipelines(Recorder))

    await run(0)
    last_seen = (await store.page(a)).last_fetched

    site.override("/a", status=410)
    caplog.set_level(logging.INFO, logger="incremental_crawler.report.extension")
    second = await run(MINUTE)
    [tombstone] = deleted(second.collected)
    assert tombstone == {
        "url": a, "change": "deleted", "status": 410, "reason": "gone_410",
        "last_seen": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last_seen)),
        "item_keys": [a],
    }
    # The user's pipeline saw it, as it sees items.
    assert deleted(Recorder.seen) == [tombstone]
    stats = second.stats.get_stats()
    assert stats["incremental/items_deleted"] == 1
    assert stats["incremental/tombstones/gone_410"] == 1
    assert "incremental/tombstones/withheld" not in stats
    assert any("items: 0 new, 0 changed, 0 unchanged dropped, 1 deleted (pages gone)"
               in r.getMessage() for r in caplog.records)
    gone = await store.page(a)
    assert gone is not None and gone.flags & PageFlags.GONE
    assert (gone.last_status, gone.failures) == (410, 0)
    assert gone.next_visit >= crawl_start(second) + RECHECK - 1
    # Its item is deleted: unknown to the store, its tombstone kept in the history.
    assert await store.fingerprint(a) is None
    assert await store.page_items(a) == []
    assert [c for c, _ in await store.versions(a)] == ["new", "deleted"]

    # Named again a minute and a day later: not asked, no second tombstone.
    for offset in (2 * MINUTE, DAY):
        again = await run(offset)
        assert gets(site, "/a") == []
        assert deleted(again.collected) == []
        assert len(gets(site, "/b")) == 1

    # Past the recheck, still 410: asked (without conditions), still gone, no tombstone.
    third = await run(RECHECK + DAY)
    [ask] = gets(site, "/a")
    assert (ask.status, ask.if_none_match, ask.if_modified_since) == (410, None, None)
    assert deleted(third.collected) == []
    assert third.stats.get_value("incremental/items_deleted") is None
    still = await store.page(a)
    assert still is not None and still.flags & PageFlags.GONE
    assert still.next_visit >= crawl_start(third) + RECHECK - 1
    assert len(deleted(Recorder.seen)) == 1

    # It comes back: asked without conditions, new, its item new.
    site.clear_override("/a")
    fourth = await run(2 * RECHECK + 2 * DAY)
    [ask] = gets(site, "/a")
    assert (ask.status, ask.if_none_match, ask.if_modified_since) == (200, None, None)
    [item] = [i for i in fourth.collected if i["url"] == urls[0]]
    assert item["change"] == "new" and "previous_fingerprint" not in item
    back = await store.page(a)
    assert back is not None and not back.flags & PageFlags.GONE
    assert back.last_status == 200 and back.fingerprint is not None
    assert [c for c, _ in await store.versions(a)] == ["new", "deleted", "new"]
    assert fourth.stats.get_value("incremental/schedule/requested/new") == 1


@pytest_twisted.ensureDeferred
async def test_a_404_is_gone_on_its_second_check_in_a_row(site, crawl, state_uri, monkeypatch):
    site.add_page("/a", "strong", size=1500)
    urls = [site.url("/a")]
    a = canonical_url(urls[0])
    store = Store(state_uri, "list")

    async def run(offset: float) -> Any:
        site.reset_log()
        at(monkeypatch, offset)
        # The crawl waits for its tombstones to leave the pipelines.
        return await crawl(ListSpider, urls=urls, settings=pipelines(SlowTombstones))

    await run(0)
    site.override("/a", status=404)
    once = await run(MINUTE)
    assert [r.status for r in gets(site, "/a")] == [404]
    assert deleted(once.collected) == []
    failed = await store.page(a)
    assert failed is not None and (failed.last_status, failed.failures) == (404, 1)
    assert not failed.flags & PageFlags.GONE
    assert await store.fingerprint(a) is not None

    twice = await run(2 * MINUTE)
    [tombstone] = deleted(twice.collected)
    assert (tombstone["status"], tombstone["reason"], tombstone["item_keys"]) == (
        404, "gone_404", [a])
    assert twice.stats.get_value("incremental/tombstones/gone_404") == 1
    gone = await store.page(a)
    assert gone is not None and gone.flags & PageFlags.GONE
    assert await store.fingerprint(a) is None

    after = await run(3 * MINUTE)
    assert gets(site, "/a") == [] and deleted(after.collected) == []


@pytest_twisted.ensureDeferred
async def test_a_transient_404_is_asked_again_next_crawl_and_yields_no_tombstone(
    site, crawl, state_uri, monkeypatch
):
    site.add_page("/a", "strong", size=1500)
    site.add_page("/b", "strong", size=1500)
    urls = [site.url("/a"), site.url("/b")]

    async def run(offset: float) -> Any:
        site.reset_log()
        at(monkeypatch, offset)
        return await crawl(ListSpider, urls=urls, settings=REVISITS)

    await run(0)
    site.override("/a", status=404)
    await run(2 * DAY)  # both due
    assert [r.status for r in gets(site, "/a")] == [404]
    site.clear_override("/a")
    # A minute later neither page is due by its schedule; the 404 is asked
    # again (with its old validators: the page is back as it was).
    third = await run(2 * DAY + MINUTE)
    assert [r.status for r in gets(site, "/a")] == [304]
    assert gets(site, "/b") == []
    assert third.stats.get_value("incremental/schedule/requested/retry") == 1
    assert deleted(third.collected) == []
    assert third.stats.get_value("incremental/items_deleted") is None
    page = await Store(state_uri, "list").page(canonical_url(urls[0]))
    assert page is not None and page.failures == 0 and not page.flags & PageFlags.GONE


@pytest_twisted.ensureDeferred
async def test_a_dropped_tombstone_is_delivered(site, crawl, state_uri, monkeypatch):
    site.add_page("/a", "strong", size=1500)
    urls = [site.url("/a")]
    a = canonical_url(urls[0])
    at(monkeypatch, 0)
    await crawl(ListSpider, urls=urls)
    site.override("/a", status=410)
    at(monkeypatch, MINUTE)
    second = await crawl(ListSpider, urls=urls, settings=pipelines(DropTombstones))
    assert deleted(second.collected) == []  # dropped: never scraped
    stats = second.stats.get_stats()
    assert stats["item_dropped_count"] == 1
    assert stats["incremental/items_deleted"] == 1
    store = Store(state_uri, "list")
    gone = await store.page(a)
    assert gone is not None and gone.flags & PageFlags.GONE
    assert await store.fingerprint(a) is None
    # Delivered once: not asked again, no second tombstone.
    site.reset_log()
    at(monkeypatch, 2 * MINUTE)
    third = await crawl(ListSpider, urls=urls, settings=pipelines(Recorder))
    assert gets(site, "/a") == [] and Recorder.seen == []
    assert third.stats.get_value("incremental/items_deleted") is None


@pytest_twisted.ensureDeferred
async def test_a_tombstone_a_pipeline_failed_on_is_withheld_and_sent_next_crawl(
    site, crawl, state_uri, monkeypatch
):
    site.add_page("/a", "strong", size=1500)
    site.add_page("/b", "strong", size=1500)
    urls = [site.url("/a"), site.url("/b")]
    a = canonical_url(urls[0])
    store = Store(state_uri, "list")
    at(monkeypatch, 0)
    await crawl(ListSpider, urls=urls, settings=REVISITS)
    site.override("/a", status=410)
    at(monkeypatch, 2 * DAY)
    second = await crawl(ListSpider, urls=urls,
                         settings={**REVISITS, **pipelines(FailOnTombstones)})
    assert second.stats.get_value("incremental/tombstones/withheld") == 1
    assert second.stats.get_value("incremental/items_deleted") is None
    assert deleted(second.collected) == []
    # Nothing of it is stored: the page is a failure, due on the next crawl.
    page = await store.page(a)
    assert page is not None and not page.flags & PageFlags.GONE
    assert (page.last_status, page.failures) == (410, 1)
    assert abs(page.next_visit - crawl_start(second)) <= 1
    assert await store.fingerprint(a) is not None

    # A minute later (not due by its schedule), it is asked and delivered.
    site.reset_log()
    at(monkeypatch, 2 * DAY + MINUTE)
    third = await crawl(ListSpider, urls=urls, settings={**REVISITS, **pipelines(Recorder)})
    assert [r.status for r in gets(site, "/a")] == [410]
    assert gets(site, "/b") == []
    [tombstone] = deleted(third.collected)
    assert tombstone["item_keys"] == [a]
    assert deleted(Recorder.seen) == [tombstone]
    gone = await store.page(a)
    assert gone is not None and gone.flags & PageFlags.GONE
    assert await store.fingerprint(a) is None


@pytest_twisted.ensureDeferred
async def test_a_page_moved_for_good_is_a_tombstone_and_its_target_new(
    site, crawl, state_uri, monkeypatch
):
    site.add_page("/old", "strong", size=1500)
    site.add_page("/new", "strong", size=1500, title="Moved here")
    urls = [site.url("/old")]
    old, new = canonical_url(site.url("/old")), canonical_url(site.url("/new"))
    store = Store(state_uri, "list")
    at(monkeypatch, 0)
    await crawl(ListSpider, urls=urls)
    site.add_redirect("/old", "/new", 301)
    site.reset_log()
    at(monkeypatch, MINUTE)
    second = await crawl(ListSpider, urls=urls, settings=pipelines(CopyItems))
    assert [r.status for r in gets(site, "/old")] == [301]
    assert [r.status for r in gets(site, "/new")] == [200]
    [tombstone] = deleted(second.collected)
    assert tombstone["reason"] == "moved" and tombstone["status"] == 301
    assert tombstone["redirected_to"] == new and tombstone["item_keys"] == [old]
    [item] = [i for i in second.collected if i.get("change") != "deleted"]
    assert (item["url"], item["change"]) == (site.url("/new"), "new")
    assert second.stats.get_value("incremental/tombstones/moved") == 1
    moved = await store.page(old)
    assert moved is not None and moved.flags & PageFlags.GONE
    assert moved.redirect_to == new
    assert await store.fingerprint(old) is None
    assert await store.fingerprint(new) is not None

    site.reset_log()
    at(monkeypatch, 2 * MINUTE)
    third = await crawl(ListSpider, urls=urls)
    assert gets(site, "/old") == [] and deleted(third.collected) == []


@pytest_twisted.ensureDeferred
async def test_a_gone_page_that_never_yielded_an_item_is_recorded_not_sent(
    site, crawl, state_uri, monkeypatch
):
    site.add_page("/listing", "strong", size=1500)
    urls = [site.url("/listing")]
    listing = canonical_url(urls[0])
    store = Store(state_uri, "list")
    at(monkeypatch, 0)
    await crawl(ListSpider, urls=urls, listings=("/listing",))
    site.override("/listing", status=410)
    at(monkeypatch, MINUTE)
    second = await crawl(ListSpider, urls=urls, listings=("/listing",),
                         settings=pipelines(Recorder))
    assert second.collected == [] and Recorder.seen == []
    stats = second.stats.get_stats()
    assert stats["incremental/tombstones/gone_410"] == 1
    assert stats["incremental/tombstones/unsent_no_items"] == 1
    assert "incremental/items_deleted" not in stats
    gone = await store.page(listing)
    assert gone is not None and gone.flags & PageFlags.GONE and gone.last_status == 410
    assert gone.next_visit >= crawl_start(second) + RECHECK - 1


@pytest.mark.parametrize("target", ["404", "loop"])
@pytest_twisted.ensureDeferred
async def test_a_move_to_a_target_that_never_answers_is_a_failure_not_a_tombstone(
    site, crawl, state_uri, monkeypatch, target
):
    site.add_page("/old", "strong", size=1500)
    urls = [site.url("/old")]
    old, new = canonical_url(site.url("/old")), canonical_url(site.url("/new"))
    store = Store(state_uri, "list")
    at(monkeypatch, 0)
    await crawl(ListSpider, urls=urls)
    site.add_redirect("/old", "/new", 301)
    if target == "loop":  # /new does not exist and redirects back
        site.add_redirect("/new", "/old", 301)
    at(monkeypatch, MINUTE)
    second = await crawl(ListSpider, urls=urls, settings={"REDIRECT_MAX_TIMES": 3})
    assert deleted(second.collected) == []
    assert second.stats.get_value("incremental/tombstones/moved") is None
    failed = await store.page(old)
    assert failed is not None and not failed.flags & PageFlags.GONE
    assert (failed.last_status, failed.failures) == (301, 1)
    assert abs(failed.next_visit - crawl_start(second)) <= 1
    assert await store.fingerprint(old) is not None

    # The target answers at last: the move is proved, the page is a tombstone.
    site.remove_redirect("/new")
    site.add_page("/new", "strong", size=1500, title="Moved here")
    site.reset_log()
    at(monkeypatch, 2 * MINUTE)
    third = await crawl(ListSpider, urls=urls)
    assert [r.status for r in gets(site, "/old")] == [301]
    [tombstone] = deleted(third.collected)
    assert (tombstone["reason"], tombstone["redirected_to"]) == ("moved", new)
    moved = await store.page(old)
    assert moved is not None and moved.flags & PageFlags.GONE


@pytest.mark.parametrize("target", ["known", "unknown"])
@pytest_twisted.ensureDeferred
async def test_a_move_not_followed_is_a_tombstone_only_to_a_page_known_live(
    site, crawl, state_uri, monkeypatch, target
):
    site.add_page("/old", "strong", size=1500)
    site.add_page("/new", "strong", size=1500, title="Moved here")
    old, new = canonical_url(site.url("/old")), canonical_url(site.url("/new"))
    store = Store(state_uri, "list")
    at(monkeypatch, 0)
    first_urls = [site.url("/old")] + ([site.url("/new")] if target == "known" else [])
    await crawl(ListSpider, urls=first_urls)
    site.add_redirect("/old", "/new", 301)
    site.reset_log()
    at(monkeypatch, MINUTE)
    second = await crawl(ListSpider, urls=[site.url("/old")],
                         meta={"dont_redirect": True})
    assert gets(site, "/new") == []
    page = await store.page(old)
    assert page is not None and page.last_status == 301 and page.redirect_to == new
    if target == "known":
        [tombstone] = deleted(second.collected)
        assert tombstone["redirected_to"] == new
        assert page.flags & PageFlags.GONE
    else:
        # Nothing proves the move: no tombstone, the page goes by its schedule.
        assert deleted(second.collected) == []
        assert not page.flags & PageFlags.GONE and page.failures == 0
        assert await store.fingerprint(old) is not None


@pytest.mark.parametrize("user", [(Recorder,), (SlowTombstones, CopyItems, Recorder)],
                         ids=["same-object", "slow-copying-pipeline"])
@pytest_twisted.ensureDeferred
async def test_a_page_asked_twice_in_one_crawl_yields_one_tombstone(
    site, crawl, state_uri, monkeypatch, user
):
    site.add_page("/a", "strong", size=1500)
    url = site.url("/a")
    a = canonical_url(url)
    store = Store(state_uri, "list")
    at(monkeypatch, 0)
    await crawl(ListSpider, urls=[url])
    site.override("/a", status=410)
    site.reset_log()
    at(monkeypatch, MINUTE)
    # Start requests are dont_filter: both go out before either answer is back.
    second = await crawl(ListSpider, urls=[url, url], settings=pipelines(*user))
    assert [r.status for r in gets(site, "/a")] == [410, 410]
    [tombstone] = deleted(Recorder.seen)
    assert deleted(second.collected) == [tombstone]
    assert second.collected == [tombstone]  # no copy went the items' way
    stats = second.stats.get_stats()
    assert stats["incremental/items_deleted"] == 1
    assert stats["incremental/tombstones/gone_410"] == 1
    assert "incremental/items_new" not in stats
    assert [c for c, _ in await store.versions(a)] == ["new", "deleted"]
    gone = await store.page(a)
    assert gone is not None and gone.flags & PageFlags.GONE and gone.failures == 0
    assert gone.next_visit >= crawl_start(second) + RECHECK - 1
    assert await store.fingerprint(a) is None

    # It comes back: new, once.
    site.clear_override("/a")
    Recorder.seen.clear()
    at(monkeypatch, RECHECK + DAY)
    third = await crawl(ListSpider, urls=[url], settings=pipelines(*user))
    assert [(i["url"], i["change"]) for i in third.collected] == [(url, "new")]
    assert [c for c, _ in await store.versions(a)] == ["new", "deleted", "new"]


@pytest_twisted.ensureDeferred
async def test_the_deleted_versions_are_never_stored_without_the_gone_page(
    site, crawl, state_uri, monkeypatch
):
    from incremental_crawler.state.stores.sqlite import SQLiteStateStore

    site.add_page("/p", "strong", size=1500)
    url = site.url("/p")
    page = canonical_url(url)
    at(monkeypatch, 0)
    await crawl(HalfSpider, urls=[url])
    assert await Store(state_uri, "half").page_items(page) == sorted(
        [page, canonical_url(url + "?part=2")])
    site.override("/p", status=410)
    # After every commit, what a kill -9 would leave: no item deleted from a
    # page that is not GONE (it would keep its validators and answer 304).
    commits: list[tuple[int, int]] = []
    flush_now = SQLiteStateStore.flush_now

    def checked_flush(store: SQLiteStateStore) -> int:
        count = flush_now(store)
        deleted_items, orphans = store._db.execute(
            "SELECT count(*), sum(NOT EXISTS (SELECT 1 FROM pages p WHERE p.scope = i.scope"
            " AND p.url = coalesce(i.page, i.item_key) AND p.flags & ?))"
            " FROM items i WHERE i.fingerprint = ''", (int(PageFlags.GONE),)).fetchone()
        commits.append((deleted_items, orphans or 0))
        return count

    monkeypatch.setattr(SQLiteStateStore, "flush_now", checked_flush)
    # A flush starts at once, as Scrapy starts coroutines on a reactor
    # without asyncio (with it, a flush waits for the loop's next turn).
    monkeypatch.setattr(ledger_module, "deferred_from_coro", Deferred.fromCoroutine)
    at(monkeypatch, MINUTE)
    second = await crawl(HalfSpider, urls=[url], settings={"INCREMENTAL_BATCH_SIZE": 1})
    assert len(deleted(second.collected)) == 1
    assert (2, 0) in commits
    assert all(orphans == 0 for _, orphans in commits), commits


@pytest_twisted.ensureDeferred
async def test_a_gone_page_that_still_redirects_is_asked_once_per_recheck(
    site, crawl, state_uri, monkeypatch
):
    site.add_page("/old", "strong", size=1500)
    site.add_page("/new", "strong", size=1500, title="Moved here")
    urls = [site.url("/old")]
    old = canonical_url(urls[0])
    store = Store(state_uri, "list")
    at(monkeypatch, 0)
    await crawl(ListSpider, urls=urls)
    site.add_redirect("/old", "/new", 301)
    at(monkeypatch, MINUTE)
    second = await crawl(ListSpider, urls=urls)
    assert len(deleted(second.collected)) == 1
    # Past its recheck it redirects still: asked, still gone, checked again a
    # recheck later; not asked on the next crawls.
    asked = []
    for offset in (RECHECK + DAY, RECHECK + DAY + MINUTE, RECHECK + 2 * DAY):
        site.reset_log()
        at(monkeypatch, offset)
        again = await crawl(ListSpider, urls=urls)
        asked.append([r.status for r in gets(site, "/old")])
        assert deleted(again.collected) == []
        if offset == RECHECK + DAY:
            moved = await store.page(old)
            assert moved is not None and moved.flags & PageFlags.GONE
            assert moved.last_status == 301 and moved.redirect_to == canonical_url(
                site.url("/new"))
            assert moved.next_visit >= crawl_start(again) + RECHECK - 1
    assert asked == [[301], [], []]
    assert await store.fingerprint(old) is None


@pytest_twisted.ensureDeferred
async def test_a_gone_page_its_sitemap_dated_when_it_went_is_asked_once(
    site, crawl, state_uri, monkeypatch
):
    from tests.test_lastmod import urlset

    paths = ["/p/0", "/p/1"]
    for path in paths:
        site.add_page(path, "strong", size=1500)
    lastmods = {"/p/0": "2024-01-01", "/p/1": "2024-01-01"}
    store = Store(state_uri, "sitemap")

    async def run(offset: float) -> Any:
        # No ETag: the sitemap is read in full every crawl.
        site.add_document("/sitemap.xml", urlset([(site.url(p), lastmods[p]) for p in paths]),
                          "application/xml")
        site.reset_log()
        at(monkeypatch, offset)
        return await crawl(SitemapPagesSpider, sitemap_url=site.url("/sitemap.xml"))

    await run(0)
    site.override("/p/1", status=410)
    lastmods["/p/1"] = "2024-06-01"  # the CMS dates the page when it deletes it
    asked = []
    for offset in (MINUTE, 2 * MINUTE, 3 * MINUTE):
        again = await run(offset)
        asked.append([r.status for r in gets(site, "/p/1")])
        assert len(deleted(again.collected)) == (offset == MINUTE)
    assert asked == [[410], [], []]
    gone = await store.page(canonical_url(site.url("/p/1")))
    assert gone is not None and gone.flags & PageFlags.GONE
    # A date after the check that found it gone asks again: it may have
    # come back (and has).
    site.clear_override("/p/1")
    lastmods["/p/1"] = time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                     time.gmtime(time.time() + 4 * MINUTE - 30))
    back = await run(4 * MINUTE)
    assert [r.status for r in gets(site, "/p/1")] == [200]
    assert [(i["url"], i["change"]) for i in back.collected] == [(site.url("/p/1"), "new")]


async def _gone_behind_an_unchanged_sitemap(site: Any, crawl: Any, state_uri: str,
                                            monkeypatch: pytest.MonkeyPatch) -> Any:
    """/p/1 answers 410 on a re-seed (its sitemap, with an ETag, answers 304):
    one tombstone, the page GONE; then the site restores it, sitemap unchanged.
    Returns ``run(offset, **settings)``."""
    serve(site, ["/p/0", "/p/1"])
    url = canonical_url(site.url("/p/1"))
    store = Store(state_uri, "sitemap")

    async def run(offset: float, **settings: Any) -> Any:
        site.reset_log()
        at(monkeypatch, offset)
        # No max age: the sitemap is never fetched in full for it (it would
        # name the page, and the list would decide it instead).
        crawler = await crawl(SitemapPagesSpider,
                              settings={**REVISITS, "INCREMENTAL_MAX_AGE": 0, **settings},
                              sitemap_url=site.url("/sitemap.xml"))
        if offset:
            # The list did not change: only the re-seeder asks its pages.
            assert [r.status for r in gets(site, "/sitemap.xml")] == [304]
        return crawler

    await run(0)
    site.override("/p/1", status=410)
    found = await run(2 * DAY)
    assert [r.status for r in gets(site, "/p/1")] == [410]
    [tombstone] = deleted(found.collected)
    assert tombstone["url"] == site.url("/p/1") and tombstone["reason"] == "gone_410"
    gone = await store.page(url)
    assert gone is not None and gone.flags & PageFlags.GONE
    assert gone.next_visit >= crawl_start(found) + RECHECK - 1
    site.clear_override("/p/1")
    return run


@pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_gone_page_behind_an_unchanged_sitemap_is_rechecked_and_comes_back_new(
    site, crawl, state_uri, monkeypatch
):
    """The rare recheck is real: the re-seeder asks a GONE page once its next
    visit is due, though no list names it (its sitemap answers 304)."""
    run = await _gone_behind_an_unchanged_sitemap(site, crawl, state_uri, monkeypatch)
    # Before its recheck: not asked, however often the site is crawled.
    for offset in (2 * DAY + MINUTE, 5 * DAY, RECHECK + DAY):
        before = await run(offset)
        assert gets(site, "/p/1") == []
        assert before.collected == [] or all(
            i["url"] != site.url("/p/1") for i in before.collected)
    # Its recheck is due: asked as a new page (no conditions), and it is one.
    back = await run(2 * DAY + RECHECK + MINUTE)
    [ask] = gets(site, "/p/1")
    assert (ask.status, ask.if_none_match, ask.if_modified_since) == (200, None, None)
    [item] = [i for i in back.collected if i["url"] == site.url("/p/1")]
    assert item["change"] == "new" and "previous_fingerprint" not in item
    assert back.stats.get_value("incremental/schedule/requested/new") == 1
    page = await Store(state_uri, "sitemap").page(canonical_url(site.url("/p/1")))
    assert page is not None and not page.flags & PageFlags.GONE
    # A page again: revisited on its schedule, not asked the next crawl.
    await run(2 * DAY + RECHECK + 2 * MINUTE)
    assert gets(site, "/p/1") == []


@pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_gone_page_behind_an_unchanged_sitemap_is_asked_at_once_by_recheck_all(
    site, crawl, state_uri, monkeypatch
):
    run = await _gone_behind_an_unchanged_sitemap(site, crawl, state_uri, monkeypatch)
    back = await run(2 * DAY + MINUTE, INCREMENTAL_RECHECK_ALL=True)
    [ask] = gets(site, "/p/1")
    assert (ask.status, ask.if_none_match, ask.if_modified_since) == (200, None, None)
    assert [(i["url"], i["change"]) for i in back.collected] == [(site.url("/p/1"), "new")]


@pytest_twisted.ensureDeferred
async def test_a_gone_page_still_gone_at_its_recheck_is_not_asked_the_next_crawl(
    site, crawl, state_uri, monkeypatch
):
    """Still 410 when rechecked: no second tombstone, due a recheck later
    (not re-seeded again the crawl after)."""
    run = await _gone_behind_an_unchanged_sitemap(site, crawl, state_uri, monkeypatch)
    site.override("/p/1", status=410)
    asked = []
    for offset in (2 * DAY + RECHECK + MINUTE, 2 * DAY + RECHECK + 2 * MINUTE,
                   2 * DAY + RECHECK + 2 * DAY):
        again = await run(offset)
        asked.append([(r.status, r.if_none_match) for r in gets(site, "/p/1")])
        assert deleted(again.collected) == []
        if offset == 2 * DAY + RECHECK + MINUTE:
            still = await Store(state_uri, "sitemap").page(canonical_url(site.url("/p/1")))
            assert still is not None and still.flags & PageFlags.GONE
            assert still.next_visit >= crawl_start(again) + RECHECK - 1
    assert asked == [[(410, None)], [], []]


@pytest_twisted.ensureDeferred
async def test_a_tombstone_names_every_item_last_stored_from_its_page(
    site, crawl, state_uri, monkeypatch
):
    site.add_page("/p", "strong", size=1500)
    url = site.url("/p")
    page, part2 = canonical_url(url), canonical_url(url + "?part=2")
    store = Store(state_uri, "half")
    at(monkeypatch, 0)
    await crawl(HalfSpider, urls=[url])
    # The second item's key is not its page's URL: the page was recorded.
    assert await store.page_items(page) == sorted([page, part2])
    site.override("/p", status=410)
    at(monkeypatch, MINUTE)
    second = await crawl(HalfSpider, urls=[url])
    [tombstone] = deleted(second.collected)
    assert tombstone["item_keys"] == sorted([page, part2])
    assert await store.fingerprint(page) is None
    assert await store.fingerprint(part2) is None
    assert [c for c, _ in await store.versions(part2)] == ["new", "deleted"]


@pytest_twisted.ensureDeferred
async def test_a_page_no_longer_listed_by_its_sitemap_is_not_gone(
    site, crawl, state_uri, monkeypatch
):
    paths = ["/p/0", "/p/1"]
    serve(site, paths)
    store = Store(state_uri, "sitemap")

    async def run(offset: float) -> Any:
        site.reset_log()
        at(monkeypatch, offset)
        return await crawl(SitemapPagesSpider, settings=REVISITS,
                           sitemap_url=site.url("/sitemap.xml"))

    await run(0)
    # The sitemap drops /p/1; the page itself is still there.
    from tests.test_failures import sitemap_xml
    site.add_document("/sitemap.xml", sitemap_xml(site, ["/p/0"]), "application/xml",
                      etag='"sm-2"')
    second = await run(MINUTE)
    assert gets(site, "/p/1") == []
    assert deleted(second.collected) == []
    unlisted = await store.page(canonical_url(site.url("/p/1")))
    assert unlisted is not None and not unlisted.flags & PageFlags.GONE
    # Revisited on its schedule (the re-seeder), still a page, still no tombstone.
    third = await run(2 * DAY)
    assert [r.status for r in gets(site, "/p/1")] == [304]
    assert deleted(third.collected) == []
    assert third.stats.get_value("incremental/items_deleted") is None
    assert await store.fingerprint(canonical_url(site.url("/p/1"))) is not None


# -- cluster mode ------------------------------------------------------------------


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_one_tombstone_per_page_across_workers(
    site, state_uri, cluster_prefix, tmp_path
):
    n = 24
    site.add_pages(n, size=1500)
    site.slow("/p/", 0.05)
    # The pages stored by a run of one worker (in this process: the fill).
    await crawl_in_process(site, state_uri, cluster_prefix)
    gone = [f"/p/{i:04d}" for i in range(0, n, 4)]
    for path in gone:
        site.override(path, status=410)

    def tombstones(workers: list[Worker]) -> list[str]:
        found = []
        for worker in workers:
            if worker.feed.exists():
                found.extend(item["url"] for line in worker.feed.read_text().splitlines()
                             if line.strip() and (item := json.loads(line))["change"] == "deleted")
        return found

    # Every page asked again (conditionally): the gone ones answer 410.
    recheck = ("-s", "INCREMENTAL_RECHECK_ALL=True")
    for run in (2, 3):
        site.reset_log()
        workers = [Worker(site, state_uri, cluster_prefix, tmp_path, f"{run}-{i}", *recheck)
                   for i in range(2)]
        for worker in workers:
            assert await worker.wait() == 0, worker.tail()
        assert sum(page_gets(site).values()) == n
        expected = sorted(canonical_url(site.url(p)) for p in gone) if run == 2 else []
        assert sorted(tombstones(workers)) == expected, run


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_page_two_workers_find_gone_in_one_run_yields_one_tombstone(
    site, state_uri, cluster_prefix, tmp_path
):
    n = 16
    site.add_pages(n, size=1500)
    # Slow answers: both copies of a page are out at once, mostly.
    site.slow("/p/", 0.2)
    urls = " ".join(site.url(f"/p/{i:04d}") for i in range(n))

    def workers(run: str) -> list[Worker]:
        # Start requests: every worker yields them all, dont_filter (the
        # run's seen set does not keep a page from being asked twice).
        return [Worker(site, state_uri, cluster_prefix, tmp_path, f"{run}-{i}",
                       spider=("starts", "-a", f"urls={urls}", "-a", f"tag={i}",
                               "-s", "SPIDER_MODULES=tests.follow_spider"))
                for i in range(2)]

    # The pages stored by a run of one worker (in this process: the fill).
    await crawl_in_process(site, state_uri, cluster_prefix,
                           spider=(StartsSpider, {"urls": urls, "tag": "1"}))
    for i in range(n):
        site.override(f"/p/{i:04d}", status=410)
    site.reset_log()
    second = workers("2")
    for worker in second:
        assert await worker.wait() == 0, worker.tail()
    # Asked once or twice each (a copy that went out once the page was
    # stored GONE is not due)...
    assert set(page_gets(site).values()) <= {1, 2} and len(page_gets(site)) == n
    found = []
    for worker in second:
        if worker.feed.exists():
            found.extend(item["url"] for line in worker.feed.read_text().splitlines()
                         if line.strip() and (item := json.loads(line))["change"] == "deleted")
    # ...one tombstone each, whichever worker found it gone.
    assert sorted(found) == sorted(canonical_url(site.url(f"/p/{i:04d}")) for i in range(n))
    store = open_store(Settings({"INCREMENTAL_STATE_URI": state_uri}))
    try:
        pages = await deferred_from_coro(store.get_pages(
            [PageKey("starts", canonical_url(site.url(f"/p/{i:04d}"))) for i in range(n)]))
    finally:
        await deferred_from_coro(store.close())
    assert all(state.flags & PageFlags.GONE for state in pages.values()) and len(pages) == n
    assert leftover_keys(cluster_prefix) == []


# -- the store's side -----------------------------------------------------------------


@pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_get_item_data_reads_the_latest_live_version(state_store):
    from incremental_crawler.state.records import ItemRecord

    store = state_store

    async def check() -> None:  # in a task: the Redis client needs one
        assert await store.get_item_data("s", "k") is None
        store.stage_item(ItemRecord("s", "k", "k", "f1", data='{"a": 1}', stored_at=1))
        store.stage_item(ItemRecord("s", "k", "k", "f2", data='{"a": 2, "b": "x"}',
                                    stored_at=2, change="changed"))
        store.stage_item(ItemRecord("s", "bare", "bare", "f1", data=None, stored_at=1))
        await store.flush()
        assert json.loads(await store.get_item_data("s", "k")) == {"a": 2, "b": "x"}
        assert await store.get_item_data("s", "bare") is None  # stored without data
        store.stage_item(ItemRecord("s", "k", None, "", data='{"change": "deleted"}',
                                    stored_at=3, change="deleted", page="k"))
        await store.flush()
        assert await store.get_item_data("s", "k") is None  # a tombstone

    await deferred_from_coro(check())


@pytest_twisted.ensureDeferred
async def test_a_gone_page_failing_at_its_recheck_waits_for_the_next_recheck(
    site, crawl, state_uri, monkeypatch
):
    """A gone page whose host fails when it is rechecked (a 503, no answer)
    stays gone and waits a recheck more, not the failure schedule's day."""
    run = await _gone_behind_an_unchanged_sitemap(site, crawl, state_uri, monkeypatch)
    site.override("/p/1", status=503)
    offset = 2 * DAY + RECHECK + MINUTE
    again = await run(offset, RETRY_ENABLED=False)
    assert [r.status for r in gets(site, "/p/1")] == [503]
    assert deleted(again.collected) == []
    page = await Store(state_uri, "sitemap").page(canonical_url(site.url("/p/1")))
    assert page is not None and page.flags & PageFlags.GONE
    assert page.next_visit >= crawl_start(again) + RECHECK - 1
    # Not asked on the next day's crawl.
    await run(offset + DAY)
    assert gets(site, "/p/1") == []
