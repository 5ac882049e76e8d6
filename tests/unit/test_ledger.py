"""The ledger on its own: when a page's state reaches the store, and when it never does.

Each test builds a real Ledger on a real SQLite store and plays the engine's
part: it opens a page transaction as the conditional downloader middleware
does, reports yielded items and the end of the callback's output as the
spider middlewares do, and sends the item and spider signals the scraper
sends. What reached the store is read back from the file through a second
connection, as another process would see it.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
from scrapy import Spider, signals
from scrapy.core.engine import ExecutionEngine
from scrapy.exceptions import DropItem, NotConfigured
from scrapy.http import HtmlResponse, Request
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.test import get_crawler
from twisted.python.failure import Failure

from incremental_crawler.crawl import ledger as ledger_module
from incremental_crawler.crawl.ledger import Ledger, PageTransaction
from incremental_crawler.exceptions import ItemNearDuplicate, ItemUnchanged
from incremental_crawler.state.records import PageKey, PageState
from incremental_crawler.state.stores import StateStoreError

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from scrapy.crawler import Crawler

ADDON = "incremental_crawler.addon.IncrementalAddon"


class UnitSpider(Spider):
    name = "unit"


class Gate:
    """A cluster run's count of unrecorded failures, as the coordinator reports it."""

    def __init__(self, run_unrecorded: int | None) -> None:
        self.run_unrecorded = run_unrecorded
        self.run_started: float | None = None
        self.noticed = 0

    def note_unrecorded_failure(self) -> None:
        self.noticed += 1

    def note_first_second_visit(self, key: object) -> None:
        """Visits in the run's first second matter to the re-seeder's sum
        only, which these tests do not read."""


# -- building and reading --------------------------------------------------------


def state_uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'state.db'}"


@pytest.fixture
def make_ledger(tmp_path: Path):
    """``make_ledger(**settings)`` → a Ledger built as Scrapy builds the extension."""
    built: list[Ledger] = []

    def make(**settings: Any) -> Ledger:
        crawler = get_crawler(UnitSpider, {
            "INCREMENTAL_STATE_URI": state_uri(tmp_path),
            # Flushes happen when a test asks for them, not on a timer.
            "INCREMENTAL_FLUSH_INTERVAL": 3600,
            # Scrapy's own extensions (stats, log lines, feeds) are left out:
            # the signals a test sends are for the ledger alone.
            "EXTENSIONS_BASE": {},
            **settings,
        })
        # Scrapy creates the spider before the extensions; the ledger reads
        # its scope from it.
        crawler.spider = UnitSpider.from_crawler(crawler)
        ledger = Ledger.from_crawler(crawler)
        built.append(ledger)
        return ledger

    yield make
    for ledger in built:
        # A test that failed half-way may leave the flush timer running.
        if ledger._task is not None and ledger._task.running:
            ledger._task.stop()
        pytest_twisted.blockon(deferred_from_coro(ledger.store.close()))


def stored(tmp_path: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of the state file as a second connection (another process) sees them."""
    db = sqlite3.connect(tmp_path / "state.db")
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def stored_etags(tmp_path: Path) -> dict[str, str | None]:
    return dict(stored(tmp_path, "SELECT url, etag FROM pages"))


async def flush(ledger: Ledger) -> None:
    """Commit what is staged, as the periodic flush does, and wait for it."""
    await in_asyncio(ledger.commit_staged())


def in_asyncio(coro: Any) -> Any:
    """A coroutine that awaits asyncio futures (the ledger's do), run as a
    task so that a pytest-twisted test (a Deferred coroutine) can await it."""
    return deferred_from_coro(coro)


def send(crawler: Crawler, signal: object, **kwargs: Any) -> None:
    """Send a signal as Scrapy does; a handler that raised fails the test
    (send_catch_log would only log it)."""
    results = crawler.signals.send_catch_log(signal, spider=crawler.spider, **kwargs)
    assert [r for _, r in results if isinstance(r, Failure)] == []


class Page:
    """One fetched page with an open transaction, and the items its callback yields."""

    def __init__(self, ledger: Ledger, path: str = "/a", *, n_items: int = 0,
                 discovery: bool = False, callback_called: bool = True,
                 callback: str | None = "parse") -> None:
        self.ledger = ledger
        self.url = f"https://example.com{path}"
        request = Request(self.url)
        self.key = PageKey(ledger.scope, self.url)
        # "parse": a method of the spider, so a failure record can request it again.
        state = PageState(self.key, etag=f'"{path}-v2"', fingerprint=f"body{path}",
                          last_status=200, callback=callback)
        self.txn: PageTransaction = ledger.begin(request.meta, state, discovery=discovery)
        # CallbackGuardMiddleware sets it when every spider middleware let
        # the response through to its callback.
        self.txn.callback_called = callback_called
        self.response = HtmlResponse(self.url, body=b"<html></html>", request=request)
        self.items = [{"url": f"https://example.com/item{path}/{i}", "title": f"item {i}"}
                      for i in range(n_items)]

    def play(self, event: str) -> None:
        """One step of the page's life, named as in the tables below."""
        crawler = self.ledger.crawler
        name, _, index = event.partition(":")
        item = self.items[int(index)] if index else None
        if name == "yield":
            self.ledger.item_yielded(self.txn, item)
        elif name == "output_end":
            self.ledger.output_finished(self.txn)
        elif name == "output_failed":
            self.ledger.output_failed(self.txn, "the callback failed (ValueError('bug'))")
        elif name == "callback_failed":
            # CallbackGuardMiddleware sees the exception, a user middleware swallows it.
            self.ledger.callback_failed(self.txn, "the callback failed (ValueError('bug'))")
        elif name == "spider_error":
            send(crawler, signals.spider_error, failure=Failure(ValueError("callback bug")),
                 response=self.response)
        elif name == "scraped":
            send(crawler, signals.item_scraped, item=item, response=self.response)
        elif name == "unchanged":
            send(crawler, signals.item_dropped, item=item, response=self.response,
                 exception=ItemUnchanged("same as stored"))
        elif name == "near_duplicate":
            send(crawler, signals.item_dropped, item=item, response=self.response,
                 exception=ItemNearDuplicate("a few bits away"))
        elif name == "dropped":
            send(crawler, signals.item_dropped, item=item, response=self.response,
                 exception=DropItem("not wanted"))
        elif name == "error":
            send(crawler, signals.item_error, item=item, response=self.response,
                 failure=Failure(RuntimeError("user database unavailable")))
        else:
            raise AssertionError(f"unknown event {event!r}")

    async def staged(self) -> bool:
        # get_page sees staged page states before they are flushed.
        return await self.ledger.store.get_page(self.key) is not None


JUDGED_ETAG = '"judged"'


def recording_judge(page: Page, verdicts: list[bool]) -> Callable[[bool], PageState]:
    """A judgement hook that records its verdicts and marks the state it returns."""

    def judge(changed: bool) -> PageState:
        verdicts.append(changed)
        return page.txn.state.copy(etag=JUDGED_ETAG)

    return judge


# -- when a page's state is staged -------------------------------------------------

STAGING_ORDERS = {
    "no items: staged when the output ends": (
        0, ["output_end"], 0),
    "output ends first, the item is scraped last": (
        1, ["yield:0", "output_end", "scraped:0"], 2),
    "the item is scraped before the output ends": (
        1, ["yield:0", "scraped:0", "output_end"], 2),
    "the last item is dropped after the output ended": (
        2, ["yield:0", "yield:1", "scraped:0", "output_end", "dropped:1"], 4),
    "an unchanged item leaves before the next is yielded": (
        2, ["yield:0", "unchanged:0", "yield:1", "output_end", "scraped:1"], 4),
    "every item gone before the output ends": (
        2, ["yield:0", "yield:1", "unchanged:0", "dropped:1", "output_end"], 4),
}


@pytest.mark.parametrize(("n_items", "events", "staged_at"), list(STAGING_ORDERS.values()),
                         ids=list(STAGING_ORDERS))
@pytest_twisted.ensureDeferred
async def test_state_is_staged_once_the_output_ended_and_the_last_item_left(
    make_ledger, tmp_path, n_items, events, staged_at
):
    ledger = make_ledger()
    page = Page(ledger, n_items=n_items)
    seen = []
    for event in events:
        page.play(event)
        seen.append(await page.staged())
    assert seen == [i >= staged_at for i in range(len(events))]
    assert ledger.stats.get_value("incremental/state_committed") == 1
    assert ledger.stats.get_value("incremental/state_withheld") is None
    await flush(ledger)
    assert stored_etags(tmp_path) == {page.url: '"/a-v2"'}


@pytest_twisted.ensureDeferred
async def test_an_item_still_in_a_pipeline_keeps_the_state_out_of_the_file(make_ledger, tmp_path):
    ledger = make_ledger()
    # As StoragePipeline does when item storage is on: items are written
    # by the ledger, in the same flushes as page states.
    ledger.stores_items = True
    page = Page(ledger, n_items=2)
    for event in ("yield:0", "yield:1", "output_end", "scraped:0"):
        page.play(event)
    await flush(ledger)
    # The first item's data is stored; the page, whose second item is
    # still in a pipeline, is not, though a flush just ran.
    assert [k for (k,) in stored(tmp_path, "SELECT item_key FROM items")] == [page.items[0]["url"]]
    assert stored_etags(tmp_path) == {}

    page.play("scraped:1")
    await flush(ledger)
    assert sorted(k for (k,) in stored(tmp_path, "SELECT item_key FROM items")) == sorted(
        item["url"] for item in page.items)
    assert stored_etags(tmp_path) == {page.url: '"/a-v2"'}


# -- when it is withheld -------------------------------------------------------------

WITHHELD = {
    "an item failed in a pipeline": (
        True, ["yield:0", "output_end", "error:0"], "an item pipeline failed"),
    "an item failed, its sibling was scraped": (
        True, ["yield:0", "yield:1", "error:0", "output_end", "scraped:1"],
        "an item pipeline failed"),
    "the callback raised after yielding an item": (
        True, ["yield:0", "output_failed", "scraped:0"], "the callback failed"),
    "the callback raised, a user middleware swallowed it": (
        True, ["yield:0", "callback_failed", "output_end", "scraped:0"],
        "the callback failed"),
    # A plain function (or coroutine) callback that raises never returns
    # an output for PageOutputMiddleware to see: Scrapy only sends spider_error.
    "the callback raised before returning any output": (
        True, ["spider_error"], "the callback failed"),
    "the callback never ran": (
        False, ["output_end"], "its callback never ran"),
    "the callback never ran, an errback's item was scraped": (
        False, ["yield:0", "output_end", "scraped:0"], "its callback never ran"),
}


@pytest.mark.parametrize(("callback_called", "events", "reason"), list(WITHHELD.values()),
                         ids=list(WITHHELD))
@pytest_twisted.ensureDeferred
async def test_a_failed_page_keeps_its_old_state(
    make_ledger, tmp_path, caplog, callback_called, events, reason
):
    ledger = make_ledger()
    page = Page(ledger, n_items=2, callback_called=callback_called)
    verdicts: list[bool] = []
    page.txn.judge = recording_judge(page, verdicts)
    with caplog.at_level("WARNING", logger=ledger_module.__name__):
        for event in events:
            page.play(event)
    await flush(ledger)
    # Only its failure record: no validator, no fingerprint, due on the next crawl.
    assert stored(tmp_path, "SELECT url, etag, fingerprint, last_status, failures, "
                  "next_visit, callback FROM pages") == [
        (page.url, None, None, 200, 1, int(ledger.crawl_started), "parse")]
    assert ledger.stats.get_value("incremental/state_withheld") == 1
    assert ledger.stats.get_value("incremental/failures_unrecorded") is None
    assert ledger.stats.get_value("incremental/state_committed") is None
    # No verdict on validators from a page whose content was not handled.
    assert verdicts == []
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(f"Not saving validators of {page.url}: {reason}")


# -- what the items say about the page's content -------------------------------------

VERDICTS = {
    "no items: the body decides (it changed)": ([], True),
    "an item new or changed": (["scraped"], True),
    "an item unchanged": (["unchanged"], False),
    "a near-duplicate counts as unchanged": (["near_duplicate"], False),
    "an item dropped by a user pipeline says nothing": (["dropped"], True),
    "unchanged and no evidence": (["unchanged", "dropped"], False),
    "one unchanged, one changed": (["unchanged", "scraped"], True),
}


@pytest.mark.parametrize(("fates", "changed"), list(VERDICTS.values()), ids=list(VERDICTS))
@pytest_twisted.ensureDeferred
async def test_items_decide_whether_the_content_changed(make_ledger, fates, changed):
    ledger = make_ledger()
    page = Page(ledger, n_items=len(fates))
    verdicts: list[bool] = []
    page.txn.judge = recording_judge(page, verdicts)
    for i in range(len(fates)):
        page.play(f"yield:{i}")
    page.play("output_end")
    for i, fate in enumerate(fates):
        assert verdicts == []  # not before the last item left
        page.play(f"{fate}:{i}")
    assert verdicts == [changed]
    assert page.txn.content_changed() is changed
    # The state the judgement returned is the one staged.
    staged = await ledger.store.get_page(page.key)
    assert staged is not None
    assert staged.etag == JUDGED_ETAG


# -- sitemaps and feeds: held until the crawl ends well -----------------------------

FAILED_PAGE = ("yield:0", "output_end", "error:0")
RAISED_BEFORE_OUTPUT = ("spider_error",)

#: (finish reason, unrecorded failures, events of a withheld page, its callback,
#: run gate, saved?)
DISCOVERY = {
    "finished, nothing failed": ("finished", 0, None, None, None, True),
    "finished, the run gate reports no failure": ("finished", 0, None, None, Gate(0), True),
    "closed by the user": ("shutdown", 0, None, None, None, False),
    "a failure that could not be recorded": ("finished", 1, None, None, None, False),
    "a page's item failed in a pipeline (recorded)": (
        "finished", 0, FAILED_PAGE, "parse", None, True),
    "a page's callback raised before any output (recorded)": (
        "finished", 0, RAISED_BEFORE_OUTPUT, "parse", None, True),
    "a withheld page whose callback is unknown": (
        "finished", 0, FAILED_PAGE, None, None, False),
    "a withheld page whose callback is gone": (
        "finished", 0, FAILED_PAGE, "gone", None, False),
    "an unrecorded failure, in cluster mode": ("finished", 1, None, None, Gate(0), False),
    "a page's state was withheld and recorded, in cluster mode": (
        "finished", 0, FAILED_PAGE, "parse", Gate(0), True),
    "a withheld page not recorded, in cluster mode": (
        "finished", 0, FAILED_PAGE, None, Gate(0), False),
    "another worker could not record a failure": ("finished", 0, None, None, Gate(2), False),
    "the run's unrecorded failures are unknown": ("finished", 0, None, None, Gate(None), False),
}


@pytest.mark.parametrize(("reason", "unrecorded", "withheld", "callback", "gate", "saved"),
                         list(DISCOVERY.values()), ids=list(DISCOVERY))
@pytest_twisted.ensureDeferred
async def test_discovery_states_are_saved_only_when_every_failure_was_recorded(
    make_ledger, tmp_path, caplog, reason, unrecorded, withheld, callback, gate, saved
):
    ledger = make_ledger()
    ledger.run_gate = gate
    sitemap = Page(ledger, "/sitemap.xml", discovery=True)
    sitemap.play("output_end")
    for _ in range(unrecorded):
        ledger.note_unrecorded_failure()
    if withheld:
        # A page the sitemap listed: its state is withheld.
        page = Page(ledger, "/p", n_items=1, callback=callback)
        for event in withheld:
            page.play(event)
    failed = unrecorded + bool(withheld and callback != "parse")
    # A sitemap's state is never staged before the crawl ends, flushes or not.
    await flush(ledger)
    assert not await sitemap.staged()
    # Nothing but the withheld page's failure record, without validators.
    assert set(stored_etags(tmp_path).values()) <= {None}
    if gate is not None:
        # This worker's own unrecorded failures are counted for the whole run.
        assert gate.noticed == failed

    with caplog.at_level("INFO", logger=ledger_module.__name__):
        await in_asyncio(ledger.crawler.signals.send_catch_log_async(
            signals.spider_closed, spider=ledger.crawler.spider, reason=reason))

    held = [r.getMessage() for r in caplog.records if "sitemaps are not saved" in r.getMessage()]
    if saved:
        assert stored_etags(tmp_path)[sitemap.url] == '"/sitemap.xml-v2"'
        assert ledger.stats.get_value("incremental/discovery_committed") == 1
        assert held == []
    else:
        assert sitemap.url not in stored_etags(tmp_path)
        assert ledger.stats.get_value("incremental/discovery_committed") is None
        if gate is not None:
            failed = "an unknown number of" if gate.run_unrecorded is None else max(
                failed, gate.run_unrecorded)
        assert held == [
            (f"Crawl ended {reason} with {failed} failed pages that could not be recorded "
             "to be asked again: the validators of 1 sitemaps are not saved, they will be "
             "read in full next time")
        ]


# -- prefetched states ------------------------------------------------------------------


def test_prefetched_states_are_bounded_and_taken_once(make_ledger):
    ledger = make_ledger()
    known = PageKey(ledger.scope, "https://example.com/known")
    missing = PageKey(ledger.scope, "https://example.com/missing")
    state = PageState(known, etag='"x"')
    ledger.prefetched(known, state)
    # A batch that found nothing is an answer too: no need to ask again.
    ledger.prefetched(missing, None)
    assert ledger.take_prefetched(known) == (True, state)
    assert ledger.take_prefetched(known) == (False, None)
    assert ledger.take_prefetched(missing) == (True, None)
    assert ledger.take_prefetched(missing) == (False, None)

    keys = [PageKey(ledger.scope, f"https://example.com/{i}")
            for i in range(ledger_module._PREFETCH_LIMIT + 1)]
    for key in keys:
        ledger.prefetched(key, None)
    # Once full, more reads are not kept (their requests read the store);
    # the ones kept are still there.
    assert ledger.take_prefetched(keys[-1]) == (False, None)
    assert ledger.take_prefetched(keys[0]) == (True, None)
    # Taking one frees a place.
    ledger.prefetched(keys[-1], None)
    assert ledger.take_prefetched(keys[-1]) == (True, None)


# -- a store that fails --------------------------------------------------------------


@pytest.fixture
def engine_of():
    """Gives a ledger's crawler a real, not running, engine: the ledger asks
    it to stop the crawl when the store fails (Crawler.engine raises before
    one exists)."""
    engines: list[ExecutionEngine] = []

    def attach(ledger: Ledger) -> ExecutionEngine:
        engine = ExecutionEngine(ledger.crawler, lambda _: None)
        ledger.crawler.engine = engine
        engines.append(engine)
        return engine

    yield attach
    for engine in engines:
        engine.downloader.close()


@pytest_twisted.ensureDeferred
async def test_a_store_failure_is_reported_once_and_stops_the_flushes(
    make_ledger, engine_of, tmp_path, caplog
):
    ledger = make_ledger(INCREMENTAL_SQLITE_BUSY_TIMEOUT=0.05)
    engine_of(ledger)
    Page(ledger, "/first").play("output_end")
    # Another process holds the write lock: the commit fails.
    locker = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        with caplog.at_level("ERROR", logger=ledger_module.__name__):
            await flush(ledger)
            # Later flushes are not attempted (so not counted again), even
            # with more writes staged.
            Page(ledger, "/second").play("output_end")
            await flush(ledger)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert ledger.stats.get_value("incremental/store_errors") == 1
    [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "is locked by another process" in error
    assert error.endswith("stopping the crawl (nothing not stored is recorded as done)")

    # The lock is gone, yet nothing more is committed during the crawl: the
    # staged writes wait for the last attempt when the store closes.
    ledger.flush()
    await flush(ledger)
    assert stored_etags(tmp_path) == {}
    assert ledger.store.pending == 2
    assert ledger.committed == 0


@pytest_twisted.ensureDeferred
async def test_a_store_error_in_an_item_pipeline_withholds_the_page_and_stops_the_flushes(
    make_ledger, engine_of, tmp_path, caplog
):
    ledger = make_ledger()
    engine_of(ledger)
    page = Page(ledger, n_items=1)
    page.play("yield:0")
    page.play("output_end")
    with caplog.at_level("ERROR", logger=ledger_module.__name__):
        # The FingerprintPipeline could not read the stored fingerprint.
        send(ledger.crawler, signals.item_error, item=page.items[0], response=page.response,
             failure=Failure(StateStoreError("State store x: read failed")))
    assert ledger.stats.get_value("incremental/store_errors") == 1
    assert ledger.stats.get_value("incremental/state_withheld") == 1
    with caplog.at_level("ERROR", logger=ledger_module.__name__):
        # Items already in the pipelines meet the same store: the crawl is
        # being stopped already, one ERROR says so.
        other = Page(ledger, "/b", n_items=1)
        other.play("yield:0")
        other.play("output_end")
        send(ledger.crawler, signals.item_error, item=other.items[0], response=other.response,
             failure=Failure(StateStoreError("State store x: read failed again")))
    assert ledger.stats.get_value("incremental/state_withheld") == 2
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "State store x: read failed; stopping the crawl (nothing not stored is recorded as done)"
    ]
    Page(ledger, "/other").play("output_end")
    await flush(ledger)
    assert stored_etags(tmp_path) == {}


# -- items kept only in feeds --------------------------------------------------------

FEED_MODES = {
    # Feeds are written at the end: a state committed before could outlive
    # a killed crawl's lost feed.
    "items only in feeds": ({"INCREMENTAL_STORE_ITEMS": False}, True, True),
    "items stored too": ({}, True, False),
    "no feeds": ({"INCREMENTAL_STORE_ITEMS": False}, False, False),
}


@pytest.mark.parametrize(("settings", "feeds", "holds"), list(FEED_MODES.values()),
                         ids=list(FEED_MODES))
@pytest_twisted.ensureDeferred
async def test_items_only_in_feeds_hold_every_commit_until_the_feeds_are_closed(
    make_ledger, tmp_path, settings, feeds, holds
):
    if feeds:
        # No FeedExporter runs (see make_ledger): the test says when the
        # feeds are closed.
        settings = {**settings, "FEEDS": {str(tmp_path / "items.jsonl"): {"format": "jsonlines"}}}
    ledger = make_ledger(**settings)
    # What StoragePipeline does when it is enabled (INCREMENTAL_STORE_ITEMS).
    ledger.stores_items = ledger.config.store_items
    crawler = ledger.crawler
    send(crawler, signals.spider_opened)
    assert ledger.holds_until_close is holds

    page = Page(ledger, n_items=1)
    for event in ("yield:0", "output_end", "scraped:0"):
        page.play(event)
    assert await page.staged()
    ledger.flush()  # what the flush timer runs
    await flush(ledger)
    assert stored_etags(tmp_path) == ({} if holds else {page.url: '"/a-v2"'})

    closing = deferred_from_coro(crawler.signals.send_catch_log_async(
        signals.spider_closed, spider=crawler.spider, reason="finished"))
    if holds:
        await flush(ledger)
        # The ledger's spider_closed is under way (it counted the sitemap
        # states it saved, none) and waits for the feeds: nothing is stored.
        assert ledger.stats.get_value("incremental/discovery_committed") == 0
        assert not closing.called
        assert stored_etags(tmp_path) == {}
        send(crawler, signals.feed_exporter_closed)
    await closing
    assert stored_etags(tmp_path) == {page.url: '"/a-v2"'}


# -- building ---------------------------------------------------------------------------


def test_from_crawler_is_not_configured_when_incremental_is_disabled(tmp_path):
    crawler = get_crawler(UnitSpider, {"INCREMENTAL_ENABLED": False,
                                       "INCREMENTAL_STATE_URI": state_uri(tmp_path)})
    crawler.spider = UnitSpider.from_crawler(crawler)
    with pytest.raises(NotConfigured, match="INCREMENTAL_ENABLED is False"):
        Ledger.from_crawler(crawler)
    # Disabled means untouched: no store was created.
    assert not (tmp_path / "state.db").exists()


@pytest.mark.parametrize("settings", [
    {},
    # The add-on lists the ledger, which leaves itself out.
    {"ADDONS": {ADDON: 0}, "INCREMENTAL_ENABLED": False},
], ids=["no ledger extension", "add-on with INCREMENTAL_ENABLED False"])
def test_for_component_is_not_configured_without_a_ledger(tmp_path, settings):
    crawler = get_crawler(UnitSpider, {"INCREMENTAL_STATE_URI": state_uri(tmp_path), **settings})
    with pytest.raises(NotConfigured, match="no incremental ledger"):
        Ledger.for_component(crawler)


def test_a_test_crawler_gets_its_spider_after_the_ledger(tmp_path):
    # scrapy.utils.test.get_crawler builds the extensions before any spider
    # exists (a real crawl creates the spider first): what needs the spider
    # is made on first use, once it is there.
    crawler = get_crawler(Spider, {
        "ADDONS": {"incremental_crawler.addon.IncrementalAddon": 0},
        "INCREMENTAL_STATE_URI": f"sqlite:///{tmp_path / 'state.db'}",
    })
    ledger = crawler.get_extension(Ledger)
    assert ledger is not None
    with pytest.raises(RuntimeError, match="spider"):
        _ = ledger.scope
    crawler.spider = Spider("later")
    assert ledger.scope == "later"
    assert ledger.trust.scope == "later"


@pytest.mark.parametrize("settings", [{"INCREMENTAL_RESEED_ENABLED": False},
                                      {"INCREMENTAL_REVISIT_ENABLED": False}],
                         ids=["re-seeding off", "revisits off"])
@pytest_twisted.ensureDeferred
async def test_without_re_seeding_no_failure_is_recorded_to_be_asked_again(
    make_ledger, tmp_path, settings
):
    # Nothing would request the page again from its record: the sitemap
    # listing it must be read in full next time.
    ledger = make_ledger(**settings)
    sitemap = Page(ledger, "/sitemap.xml", discovery=True)
    sitemap.play("output_end")
    page = Page(ledger, "/p", n_items=1)
    for event in FAILED_PAGE:
        page.play(event)
    await in_asyncio(ledger.crawler.signals.send_catch_log_async(
        signals.spider_closed, spider=ledger.crawler.spider, reason="finished"))
    assert ledger.stats.get_value("incremental/failures_unrecorded") == 1
    assert sitemap.url not in stored_etags(tmp_path)


class _Run:
    """A cluster run's tombstone claims: another worker owns the page until
    it is dead (the coordinator's takeover rule)."""

    run_unrecorded: int | None = 0
    run_started: float | None = None

    def __init__(self) -> None:
        self.owner_alive = True

    def note_unrecorded_failure(self) -> None:
        pass

    def claim_tombstone(self, key: PageKey) -> bool:
        return not self.owner_alive


def test_a_tombstone_claim_lost_to_a_worker_that_dies_is_claimed_again(make_ledger):
    ledger = make_ledger()
    run = _Run()
    ledger.run_gate = run
    key = PageKey("unit", "http://h/gone")
    assert not ledger.claim_tombstone(key)  # the other worker sends it
    run.owner_alive = False  # ... but dies first: its request comes back here
    assert ledger.claim_tombstone(key)
    assert not ledger.claim_tombstone(key)  # sent here once: settled for the crawl
