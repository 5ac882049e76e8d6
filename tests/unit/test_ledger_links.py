"""The ledger and a page's yielded requests: what is stored, flagged, and when.

A real Ledger on a real SQLite store; the test plays the engine's part (as
tests/unit/test_ledger.py does): it opens a page's transaction, hands the
ledger the requests the callback yielded, and ends the output. What the
store holds is read back through a second store on the same file.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
from scrapy import Request, Spider
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.test import get_crawler

from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.recipes import load_links
from incremental_crawler.state.records import PageFlags, PageKey, PageState
from incremental_crawler.state.stores import open_store

if TYPE_CHECKING:
    from pathlib import Path

KNOWN, HAS, INCOMPLETE = PageFlags.LINKS_KNOWN, PageFlags.HAS_LINKS, PageFlags.LINKS_INCOMPLETE
URL = "https://example.com/list"


class LinkSpider(Spider):
    name = "links"

    def parse_item(self, response):
        return []


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'state.db'}"


@pytest.fixture
def make_ledger(uri: str):
    built: list[Ledger] = []

    def make(**settings: Any) -> Ledger:
        crawler = get_crawler(LinkSpider, {
            "INCREMENTAL_STATE_URI": uri, "INCREMENTAL_FLUSH_INTERVAL": 3600,
            "EXTENSIONS_BASE": {}, **settings})
        crawler.spider = LinkSpider.from_crawler(crawler)
        ledger = Ledger.from_crawler(crawler)
        built.append(ledger)
        return ledger

    yield make
    for ledger in built:
        pytest_twisted.blockon(deferred_from_coro(ledger.store.close()))


async def read_back(uri: str, key: PageKey) -> tuple[int | None, list[str] | None]:
    """``(flags, recorded URLs)`` of the page, as another process reads the file."""
    store = open_store(Settings({"INCREMENTAL_STATE_URI": uri}))
    try:
        state = await store.get_page(key)
        data = await store.get_links(key)
    finally:
        await store.close()
    urls = None if data is None else [r["u"] for r in load_links(data) or []]
    return (None if state is None else state.flags), urls


def commit(ledger: Ledger, state: PageState, requests: list[Request], *,
           record_links: bool = True, failed: bool = False) -> None:
    """A page fetched in full: its callback yields *requests*, then ends."""
    txn = ledger.begin(Request(state.key.url).meta, state, record_links=record_links)
    txn.callback_called = True
    for request in requests:
        ledger.request_yielded(txn, request)
    if failed:
        ledger.output_failed(txn, "the callback failed (ValueError('bug'))")
    else:
        ledger.output_finished(txn)


def fetched(ledger: Ledger, flags: int = 0) -> PageState:
    return PageState(PageKey(ledger.scope, URL), etag='"v1"', fingerprint="f", last_status=200,
                     flags=flags)


def links(ledger: Ledger, n: int) -> list[Request]:
    spider = ledger.crawler.spider
    return [Request(f"{URL}/{i}", callback=spider.parse_item) for i in range(n)]


@pytest_twisted.ensureDeferred
async def test_the_requests_are_staged_just_before_the_state_and_committed_with_it(
    make_ledger, uri
):
    ledger = make_ledger()
    calls: list[str] = []
    store = ledger.store
    for name in ("stage_links", "stage_page"):
        real = getattr(store, name)
        # A spy on the real store: which writes the ledger stages, in order.
        setattr(store, name, lambda *a, _real=real, _name=name: (calls.append(_name), _real(*a)))
    state = fetched(ledger)
    commit(ledger, state, links(ledger, 2))
    assert calls == ["stage_links", "stage_page"]
    assert store.pending == 2  # nothing flushed between them
    await deferred_from_coro(ledger.commit_staged())
    assert await read_back(uri, state.key) == (KNOWN | HAS, [f"{URL}/0", f"{URL}/1"])
    assert ledger.stats.get_value("incremental/replay/recorded_pages") == 1
    assert ledger.stats.get_value("incremental/replay/recorded_requests") == 2


#: (flags stored before, yielded requests, recorded?) -> (flags after, record after)
TRANSITIONS = {
    "new links": (0, 2, True, KNOWN | HAS, 2),
    "no request: known, nothing stored": (0, 0, True, KNOWN, None),
    "links gone: the old record is deleted": (KNOWN | HAS, 0, True, KNOWN, None),
    "incomplete before, complete now": (INCOMPLETE, 1, True, KNOWN | HAS, 1),
    "not recorded (replay off): flags and record dropped, others kept": (
        KNOWN | HAS | PageFlags.VARY_STAR, 2, False, PageFlags.VARY_STAR, None),
}


@pytest.mark.parametrize(("before", "n", "record", "after", "urls"), list(TRANSITIONS.values()),
                         ids=list(TRANSITIONS))
@pytest_twisted.ensureDeferred
async def test_the_flags_say_what_is_stored(make_ledger, uri, before, n, record, after, urls):
    ledger = make_ledger()
    key = PageKey(ledger.scope, URL)
    if before & HAS:
        ledger.store.stage_links(key, '{"v":1,"r":[{"u":"https://example.com/old"}]}')
    commit(ledger, fetched(ledger, before), links(ledger, n), record_links=record)
    await deferred_from_coro(ledger.commit_staged())
    flags, stored = await read_back(uri, key)
    assert flags == after
    assert stored == (None if urls is None else [f"{URL}/{i}" for i in range(urls)])


@pytest_twisted.ensureDeferred
async def test_a_request_that_cannot_be_recorded_flags_the_page_and_warns_once(
    make_ledger, uri, caplog
):
    ledger = make_ledger()
    with caplog.at_level(logging.WARNING):
        for path in ("/a", "/b"):
            state = PageState(PageKey(ledger.scope, URL + path), etag='"v"', fingerprint="f",
                              flags=KNOWN | HAS)
            ledger.store.stage_links(state.key, '{"v":1,"r":[{"u":"https://example.com/x"}]}')
            commit(ledger, state, [*links(ledger, 1),
                                   Request(URL + "/item", meta={"item": object()})])
    await deferred_from_coro(ledger.commit_staged())
    for path in ("/a", "/b"):
        assert await read_back(uri, PageKey(ledger.scope, URL + path)) == (INCOMPLETE, None)
    assert ledger.stats.get_value("incremental/replay/unrecordable/meta_not_json") == 2
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{URL}/a" in warning and f"{URL}/item" in warning and "meta_not_json" in warning


@pytest_twisted.ensureDeferred
async def test_a_failed_callback_stages_neither_state_nor_links(make_ledger, uri):
    ledger = make_ledger()
    state = fetched(ledger)
    commit(ledger, state, links(ledger, 2), failed=True)
    # Only its failure record: no links record, no link flags, no validators.
    assert ledger.store.pending == 1
    await deferred_from_coro(ledger.commit_staged())
    assert await read_back(uri, state.key) == (0, None)
    stored = await ledger.store.get_page(state.key)
    assert stored is not None and (stored.etag, stored.fingerprint) == (None, None)
