"""A store of one's own: the test double of :mod:`tests.memory_store`,
registered for a scheme of its own through ``INCREMENTAL_STATE_STORES``.

Written against the crawl interface alone, it runs a real crawl of the
loopback site, and a second one that answers 304s (its state round-trips:
the second crawl reads it from the file the first one's flushes wrote);
``scrapy state`` and ``scrapy items`` (Scrapy's command line, in this
process) refuse it, naming what it lacks. With the administration interface added, they read it.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import pytest
import pytest_twisted
from scrapy.settings import Settings
from twisted.internet.threads import deferToThread

from incremental_crawler.state.records import CrawlRecord
from incremental_crawler.state.stores import (
    StateStoreError,
    open_admin_store,
    open_existing_store,
    open_store,
)
from tests.memory_store import STORES, MemoryAdminStore, MemoryStore
from tests.scrapy_cli import scrapy_in_process
from tests.spiders import ListSpider

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

SCOPE = "list"
SETTINGS = {"INCREMENTAL_STATE_STORES": STORES}


@pytest.fixture(params=["memory", "memory-admin"])
def state_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"{request.param}://{tmp_path / 'state.pickle'}"


async def command(state_uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await deferToThread(scrapy_in_process, *args,
                               "-s", f"INCREMENTAL_STATE_URI={state_uri}",
                               "-s", f"INCREMENTAL_STATE_STORES={json.dumps(STORES)}")


@pytest_twisted.ensureDeferred
async def test_a_crawl_only_store_runs_crawls_and_the_commands_ask_it(site, crawl, state_uri):
    for i in range(3):
        site.add_page(f"/p/{i}", "strong", size=3000)
    urls = [site.url(f"/p/{i}") for i in range(3)]
    first = await crawl(ListSpider, urls=urls, settings=SETTINGS)
    assert first.stats.get_value("incremental/items_new") == 3
    assert first.stats.get_value("finish_reason") == "finished"

    site.change("/p/2")
    site.reset_log()
    second = await crawl(ListSpider, urls=urls, settings=SETTINGS)
    asked = {r.path: (r.status, r.if_none_match is not None)
             for r in site.log if r.path.startswith("/p/")}
    assert asked == {"/p/0": (304, True), "/p/1": (304, True), "/p/2": (200, True)}
    assert second.stats.get_value("incremental/not_modified") == 2
    assert [item["url"] for item in second.collected] == [urls[2]]
    assert second.stats.get_value("incremental/items_changed") == 1

    summary = await command(state_uri, "state", "--spider", SCOPE)
    exported = await command(state_uri, "items", "-o", "-", "--spider", SCOPE)
    if state_uri.startswith("memory-admin:"):
        assert summary.returncode == 0, summary.stderr
        assert "scope list" in summary.stdout
        assert re.search(r"^  crawls kept +2 ", summary.stdout, re.M), summary.stdout
        assert exported.returncode == 0, exported.stderr
        records = [json.loads(line) for line in exported.stdout.splitlines()]
        assert sorted(r["url"] for r in records) == sorted(urls)
        assert {r["title"] for r in records if r["url"] == urls[2]} == {"Page p/2 v1"}
    else:
        for result, name in ((summary, "state"), (exported, "items")):
            assert result.returncode == 1
            message = result.stderr.strip()
            assert message.startswith(f"error: scrapy {name} cannot read the state store "), message
            assert "tests.memory_store.MemoryStore has the crawl interface only" in message
            assert "AdminStore (count_scope, forget_host, forget_page, item_history" in message


@pytest_twisted.ensureDeferred
async def test_the_registry_finds_the_store_by_its_scheme(tmp_path):
    uri = f"memory://{tmp_path / 'state.pickle'}"
    settings = Settings({"INCREMENTAL_STATE_URI": uri, **SETTINGS})
    with pytest.raises(StateStoreError, match=r"no state store at .*state\.pickle \(check "):
        open_existing_store(settings)
    store = open_store(settings)
    assert type(store) is MemoryStore
    with pytest.raises(StateStoreError, match="has the crawl interface only"):
        open_admin_store(settings, "state")
    admin = Settings({"INCREMENTAL_STATE_URI": "memory-admin" + uri[len("memory"):], **SETTINGS})
    with pytest.raises(StateStoreError, match="no state store at"):
        open_admin_store(admin, "state")  # nothing saved yet: the file is not there
    store.stage_crawl(CrawlRecord(SCOPE, 1.0, 2.0))
    await store.flush()  # saves the file
    assert type(open_admin_store(admin, "state")) is MemoryAdminStore


@pytest_twisted.ensureDeferred
async def test_a_crawl_whose_refreshes_fail_up_to_its_holds_end_stops(
    site, state_uri, monkeypatch, caplog,
):
    # A store of one's own may not check the hold as it commits: the crawl
    # itself stops writing once its refreshes failed for a whole ttl (a
    # repair may have taken the scope meanwhile).
    from scrapy.crawler import CrawlerRunner
    from twisted.internet.defer import ensureDeferred

    from incremental_crawler.crawl import ledger as ledger_module
    from tests.conftest import crawl_settings
    from tests.waiting import until

    async def unreachable(*args: object, **kwargs: object) -> None:
        raise StateStoreError("the store's hold cannot be reached")

    monkeypatch.setattr(ledger_module, "HOLD_TTL", 0.3)  # refreshed every 0.1 s
    for i in range(2):
        site.add_page(f"/p/{i}", "strong", size=3000)
    site.hold("/p/")
    runner = CrawlerRunner(crawl_settings(state_uri, INCREMENTAL_FLUSH_INTERVAL=0.05,
                                          **SETTINGS))
    crawler = runner.create_crawler(ListSpider)
    done = ensureDeferred(runner.crawl(crawler, urls=[site.url(f"/p/{i}") for i in range(2)]))
    try:
        await until(lambda: site.held >= 1, "the crawl to send a request")
        monkeypatch.setattr(MemoryStore, "hold_scope", unreachable)
        await until(lambda: crawler.stats.get_value("incremental/store_errors"),
                    "the crawl to stop for its hold")
    finally:
        site.release()
    await done
    assert crawler.stats.get_value("finish_reason") == "incremental_store_error"
    assert any("could not be refreshed before it lapsed; stopping the crawl" in r.getMessage()
               for r in caplog.records if r.levelname == "ERROR")
