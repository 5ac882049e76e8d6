"""``scrapy state``, run as a user runs it, on stores written by real crawls.

Every test crawls the loopback site in this process (the state store on
SQLite, or on Redis under a prefix of the test's own), then runs
``scrapy state ...`` through Scrapy's command line against that store
(:func:`tests.scrapy_cli.scrapy_in_process`), and checks its output and exit
status, the store afterwards, and what the next real crawl asks the site for.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
from scrapy import signals
from scrapy.crawler import CrawlerRunner
from scrapy.linkextractors import LinkExtractor
from scrapy.settings import Settings
from scrapy.spiders import CrawlSpider, Rule
from scrapy.utils.defer import deferred_from_coro
from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread

from incremental_crawler import clock
from incremental_crawler.commands._repair_hold import RepairHold
from incremental_crawler.crawl import ledger as ledger_module
from incremental_crawler.crawl.ledger import HOLD_TTL
from incremental_crawler.recipes import load_links
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from incremental_crawler.state.records import SlotRate
from incremental_crawler.state.stores import StateStoreError, open_admin_store
from tests.cluster_worker import Worker, leftover_keys
from tests.conftest import crawl_settings
from tests.scrapy_cli import scrapy_in_process
from tests.site import LoopbackSite
from tests.site.manual import CONTENTS, page_path
from tests.spiders import ListSpider
from tests.test_fatal import one_error_line
from tests.waiting import until

if TYPE_CHECKING:
    from incremental_crawler.state.stores import StateStore

#: ListSpider is no spider of the project: ``--spider list`` names its scope.
SCOPE = "list"
BACKENDS = pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)


async def state(state_uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``scrapy state ARGS`` on the test's store, in a thread (the reactor runs on)."""
    return await deferToThread(scrapy_in_process, "state", *args,
                               "-s", f"INCREMENTAL_STATE_URI={state_uri}")


async def states(state_uri: str, *runs: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """:func:`state` for each argument list, one after the other."""
    return [await state(state_uri, *args) for args in runs]


def take_once_lapsed(store: StateStore, holder: str) -> None:
    """Take the scope for *holder* once the running crawl's short hold
    lapsed, on the reactor's thread: the crawl refreshes nothing meanwhile
    (as when its reactor stalls past its hold)."""
    import time
    for _ in range(2000):  # bounded: the crawl's hold lasts 0.3 s
        if store.take_scope(SCOPE, holder, 60, clock.now()) is None:
            return
        time.sleep(0.01)
    pytest.fail("the crawl's hold never lapsed")


def release_at_once(state_uri: str, holder: str) -> None:
    """Drop *holder*'s hold on the reactor's thread (a store of its own,
    in a thread joined at once): nothing of the crawl's runs between."""
    import asyncio

    async def release() -> None:
        store = open_admin_store(Settings(crawl_settings(state_uri)), "state")
        try:
            await store.release_scope(SCOPE, holder)
        finally:
            await store.close()

    released = threading.Thread(target=asyncio.run, args=(release(),))
    released.start()
    released.join()


def pages(site: Any, n: int = 3) -> list[str]:
    for i in range(n):
        site.add_page(f"/p/{i}", "strong", size=3000)
    return [site.url(f"/p/{i}") for i in range(n)]


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_summary_shows_the_pages_and_the_last_crawls_figures(site, crawl, state_uri):
    urls = pages(site)
    await crawl(ListSpider, urls=urls)
    site.change("/p/2")
    await crawl(ListSpider, urls=urls)
    result, hosts, unknown = await states(
        state_uri, (), ("--spider", SCOPE, "--hosts"), ("--spider", "nothing-here"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"^scope list$", out, re.M), out
    # 3 pages of ~3 KB each, all due (revisits are off: no next visit), none failing.
    assert re.search(r"^  pages +3 \(due now 3, gone 0, failing 0\), [\d.]+ KB stored$",
                     out, re.M), out
    # The second crawl: 3 requests, 2 of them 304s; 1 changed item.
    assert re.search(r"^    requests +3, of which 304 not modified 2 \(66\.7%\)$", out, re.M), out
    assert re.search(r"^    items +0 new, 1 changed, 0 deleted, 0 unchanged$", out, re.M), out
    assert re.search(r"^  last crawl +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, ran [\d.]+ s "
                     r"\(finished\)$", out, re.M), out
    assert re.search(r"^  crawls kept +2 \(at most 100\)$", out, re.M), out
    assert "held by" not in out  # both crawls released their hold

    assert hosts.returncode == 0, hosts.stderr
    assert re.search(r"^  host +pages +due +gone +failing +stored +lastmod trust +validators$",
                     hosts.stdout, re.M), hosts.stdout
    assert re.search(r"^  127\.0\.0\.1 +3 +3 +0 +0 +[\d.]+ KB +- +-$", hosts.stdout,
                     re.M), hosts.stdout
    assert unknown.returncode == 1
    assert "scope 'nothing-here' has nothing stored" in unknown.stderr


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_url_shows_the_whole_record(site, crawl, state_uri, state_store):
    urls = pages(site, 2)
    await crawl(ListSpider, urls=urls)
    text, machine, missing = await states(
        state_uri, ("url", urls[1], "--spider", SCOPE), ("url", urls[1], "--json"),
        ("url", site.url("/never"), "--json"))
    assert text.returncode == 0, text.stderr
    [stored] = state_store.url_record(SCOPE, urls[1]).pages
    etag = stored.etag
    assert etag and etag.startswith('"')
    assert f"{urls[1]}  (scope list)" in text.stdout
    assert re.search(rf"^    validators +ETag {re.escape(etag)}, Last-Modified ", text.stdout,
                     re.M), text.stdout
    assert re.search(r"^  items +1$", text.stdout, re.M), text.stdout
    assert f"    {urls[1]}: version 1 (new, " in text.stdout

    assert machine.returncode == 0, machine.stderr
    [record] = json.loads(machine.stdout)
    assert record["scope"] == SCOPE and record["items"] == [urls[1]]
    assert record["pages"][0]["etag"] == etag
    assert record["pages"][0]["fingerprint"] == stored.fingerprint
    assert record["latest"][0]["data"]["title"] == "Page p/1 v0"
    assert missing.returncode == 1 and "nothing stored for" in missing.stderr


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_forget_makes_the_next_crawl_fetch_the_page_in_full_and_emit_it_again(
    site, crawl, state_uri,
):
    urls = pages(site)
    await crawl(ListSpider, urls=urls)
    result = await state(state_uri, "forget", urls[1], "--spider", SCOPE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"forgot {urls[1]} in scope 'list': 1 page, 0 links records, 1 item, "
        "1 item version, 0 host records, 0 crawl records")
    site.reset_log()
    again = await crawl(ListSpider, urls=urls)
    asked = {r.path: (r.status, r.if_none_match is not None)
             for r in site.log if r.path.startswith("/p/")}
    # The forgotten page: no validators sent, fetched in full; the others 304.
    assert asked == {"/p/0": (304, True), "/p/1": (200, False), "/p/2": (304, True)}
    assert [item["url"] for item in again.collected] == [urls[1]]
    assert again.stats.get_value("incremental/items_new") == 1
    twice = await state(state_uri, "forget", urls[1] + "?unknown=1", "--spider", SCOPE)
    assert twice.returncode == 1 and "has nothing stored for" in twice.stderr


@pytest_twisted.ensureDeferred
async def test_a_killed_crawl_of_this_host_is_named_killed_until_its_hold_lapses(
    site, crawl, state_uri, state_store: StateStore,
):
    await crawl(ListSpider, urls=pages(site, 1))
    # A crawl of this host killed with -9: its pid runs no more, its hold stays.
    killed = subprocess.Popen([sys.executable, "-c", "pass"])
    killed.wait()
    host = socket.gethostname()
    for holder in (f"{host}:{killed.pid}", f"{host}:{killed.pid}:0a1b2c3d"):
        assert state_store.take_scope(SCOPE, holder, HOLD_TTL, clock.now()) is None
        held, summary = await states(
            state_uri, ("forget", site.url("/p/0"), "--spider", SCOPE), ("--spider", SCOPE))
        assert held.returncode == 1
        assert held.stderr.startswith(
            f"error: scope 'list' is held by crawl {holder} (pid {killed.pid} is not running "
            "on this host: it was killed; its hold lapses at "), held.stderr
        assert f"{holder} (pid {killed.pid} is not running on this host: it was killed; " \
            in summary.stdout, summary.stdout
        await deferred_from_coro(state_store.release_scope(SCOPE, holder))
    # This host's running process (the test's) is running, or killed.
    alive = f"{host}:{os.getpid()}"
    assert state_store.take_scope(SCOPE, alive, HOLD_TTL, clock.now()) is None
    held = await state(state_uri, "forget", site.url("/p/0"), "--spider", SCOPE)
    assert f"held by crawl {alive} (running, or killed: its hold lapses at " in held.stderr


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_reset_refuses_without_yes_and_while_a_crawl_holds_the_scope(
    site, crawl, state_uri, state_store: StateStore,
):
    await crawl(ListSpider, urls=pages(site))
    before = state_store.count_scope(SCOPE)
    assert (before.pages, before.items, before.crawls) == (3, 3, 1)

    refused = await state(state_uri, "reset", "--spider", SCOPE)
    assert refused.returncode == 2
    assert ("reset would delete everything of scope 'list'" in refused.stderr
            and "3 pages, 0 links records, 3 items, 3 item versions, 0 host records, "
            "1 crawl record; add --yes to do it" in refused.stderr), refused.stderr
    assert state_store.count_scope(SCOPE) == before

    # A crawl holds the scope (as a running one does, through the store).
    assert state_store.take_scope(SCOPE, "crawler-host:4242", HOLD_TTL, clock.now()) is None
    expires = state_store.scope_holders(SCOPE, clock.now())["crawler-host:4242"]
    refusals = (("reset", "--yes"), ("forget", site.url("/p/0")), ("forget-host", "127.0.0.1"))
    *refused_all, summary = await states(
        state_uri, *((*args, "--spider", SCOPE) for args in refusals), ("--spider", SCOPE))
    for args, held in zip(refusals, refused_all, strict=True):
        assert held.returncode == 1, args
        assert held.stderr.startswith(
            "error: scope 'list' is held by crawl crawler-host:4242 (running, or killed: its "
            "hold lapses at "), held.stderr
        assert held.stderr.endswith(
            "); try again when it has finished or its hold has lapsed\n"), held.stderr
        assert held.stderr.count("\n") == 1
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", held.stderr)
    assert state_store.count_scope(SCOPE) == before
    assert re.search(r"^  held by +crawl crawler-host:4242 \(running, or killed: its hold "
                     r"lapses at ", summary.stdout, re.M), summary.stdout

    # A killed crawl's hold lapses: an explicit now past it, through the store.
    assert state_store.scope_holders(SCOPE, expires + 1) == {}
    await deferred_from_coro(state_store.release_scope(SCOPE, "crawler-host:4242"))
    done = await state(state_uri, "reset", "--spider", SCOPE, "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("reset scope 'list': deleted 3 pages")
    assert state_store.count_scope(SCOPE) == type(before)()
    assert SCOPE not in state_store.scopes()


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_a_crawl_holds_its_scope_and_writes_one_record_and_the_store_keeps_the_newest(
    site, state_uri, state_store: StateStore,
):
    urls = pages(site)
    held: list[dict[str, float]] = []

    async def run() -> Any:
        settings = crawl_settings(state_uri, INCREMENTAL_CRAWL_HISTORY=2)
        runner = CrawlerRunner(settings)
        crawler = runner.create_crawler(ListSpider)

        def seen(item: Any) -> None:
            # Read by another client, as `scrapy state` does, mid-crawl.
            held.append(state_store.scope_holders(SCOPE, clock.now()))

        crawler.signals.connect(seen, signal=signals.item_scraped)
        crawler._seen = seen  # type: ignore[attr-defined] (weak references)
        await runner.crawl(crawler, urls=urls)
        return crawler

    first = await run()
    assert held and all(len(h) == 1 for h in held)
    [holder] = held[0]
    assert re.fullmatch(r".+:\d+", holder)  # host name and pid
    assert state_store.scope_holders(SCOPE, clock.now()) == {}  # released at the end
    [record] = state_store.crawls(SCOPE, 10)
    assert (record.scope, record.worker, record.reason) == (SCOPE, "", "finished")
    assert record.figures["requests"] == 3 and record.figures["new"] == 3
    assert record.figures["bytes_received"] == first.stats.get_value("downloader/response_bytes")
    assert 0 <= record.figures["duration"] <= record.finished - record.started + 1

    site.change("/p/0")
    await run()
    await run()
    records = state_store.crawls(SCOPE, 10)
    assert len(records) == 2  # INCREMENTAL_CRAWL_HISTORY
    assert records[0].started > records[1].started > record.started
    assert [(r.figures["not_modified"], r.figures["changed"]) for r in records] == [
        (3, 0), (2, 1)]


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_rates_shows_the_remembered_rates_and_forget_host_forgets_its_own(
    site, crawl, state_uri, state_store: StateStore,
):
    urls = pages(site)
    await crawl(ListSpider, settings={"INCREMENTAL_THROTTLE_ENABLED": True}, urls=urls)
    # A slot of another name (DOWNLOAD_SLOTS), saved 8 days ago after hard signals.
    state_store.stage_slot_rates([SlotRate(SCOPE, "my-slot", 2.8, False,
                                           clock.now() - 8 * 86400, "penalty box")])
    await deferred_from_coro(state_store.flush())

    summary, table = await states(state_uri, ("--spider", SCOPE),
                                  ("--spider", SCOPE, "--rates"))
    assert summary.returncode == 0, summary.stderr
    assert re.search(r"^  politeness +rates of 2 slots remembered \(not used: 1 too old\)$",
                     summary.stdout, re.M), summary.stdout
    assert "after hard signals" not in summary.stdout  # the table is --rates'
    assert table.returncode == 0, table.stderr
    assert re.search(r"^  slot +rate +after hard signals +ended +saved$", table.stdout,
                     re.M), table.stdout
    # The start rate, 4/s, doubled once four answers (robots.txt's among
    # them) came healthy.
    assert re.search(r"^  127\.0\.0\.1 +[48]/s +no +healthy +[\d.]+ s ago$", table.stdout,
                     re.M), table.stdout
    assert re.search(r"^  my-slot +2\.8/s +yes +penalty box +8 d 0 h ago "
                     r"\(not used: too old\)$", table.stdout, re.M), table.stdout

    forgot = await state(state_uri, "forget-host", "127.0.0.1", "--spider", SCOPE)
    assert forgot.returncode == 0, forgot.stderr
    assert forgot.stdout.strip().endswith(", 1 remembered politeness rate"), forgot.stdout
    # The slot of another name is no host: it stays.
    assert [r.slot for r in state_store.read_slot_rates(SCOPE).rates] == ["my-slot"]


class ContentsSpider(CrawlSpider):
    """Follows every link of a manual (its links records: version 3)."""

    name = SCOPE
    allowed_domains = ("127.0.0.1",)
    rules = (Rule(LinkExtractor(), follow=True),)

    def __init__(self, start_url: str = "", **kwargs: Any) -> None:
        self.start_urls = [start_url]
        super().__init__(**kwargs)


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_url_counts_the_requests_a_links_record_holds(crawl, state_uri, state_store):
    site = LoopbackSite.manual(8, page_size=800)
    site.start()
    try:
        contents = site.url(CONTENTS)
        await crawl(ContentsSpider, start_url=contents)
        text, machine = await states(state_uri, ("url", contents, "--spider", SCOPE),
                                     ("url", contents, "--json"))
    finally:
        await site.stop()
    data = state_store.url_record(SCOPE, contents).links[""]
    assert data.startswith('{"v":3,')
    recorded = load_links(data)
    assert recorded is not None and len(recorded) > 8
    assert text.returncode == 0, text.stderr
    assert re.search(rf"^    links +{len(recorded)} requests recorded, [\d.]+ [kKM]?B "
                     r"\(replayed on a 304\)$", text.stdout, re.M), text.stdout
    [record] = json.loads(machine.stdout)
    assert record["links"][""] == recorded
    assert {recipe["u"] for recipe in recorded} >= {site.url(page_path(1))}


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_a_crawl_and_a_cluster_worker_refuse_to_start_while_a_repair_holds_the_scope(
    site, crawl, state_uri, state_store: StateStore, cluster_prefix, tmp_path, monkeypatch,
):
    paths = [f"/p/{i:04d}" for i in range(4)]
    for path in paths:
        site.add_page(path, "strong", size=1500)
    await crawl(SitemapPagesSpider, sitemap_url=site.url("/robots.txt"))
    before = state_store.count_scope("sitemap")
    assert before.items == 4  # (the pages: these, robots.txt and the sitemaps)
    # The repair waits, holding the scope, before it reads or deletes anything.
    paused, go = threading.Event(), threading.Event()
    store_class = type(state_store)
    forget_host = store_class.forget_host

    def then_wait(self: Any, scope: str, host: str) -> Any:
        paused.set()
        go.wait(60)
        return forget_host(self, scope, host)

    monkeypatch.setattr(store_class, "forget_host", then_wait)
    repair = deferToThread(scrapy_in_process, "state", "forget-host", "127.0.0.1",
                           "--spider", "sitemap", "-s", f"INCREMENTAL_STATE_URI={state_uri}")
    try:
        assert await deferToThread(paused.wait, 60)
        site.reset_log()
        repairer = f"repair {socket.gethostname()}:{os.getpid()}"
        with pytest.raises(StateStoreError) as refused:
            await crawl(SitemapPagesSpider, sitemap_url=site.url("/robots.txt"))
        assert str(refused.value).startswith(
            f"State store {state_store.location}: scope 'sitemap' is held by {repairer} "
            "(its hold lapses in "), refused.value
        assert str(refused.value).endswith(
            "a crawl beside a repair would write what the repair deletes: wait until it "
            "ends"), refused.value
        worker = Worker(site, state_uri, cluster_prefix, tmp_path, "0")
        assert await worker.wait() == 1, worker.tail()
        line = one_error_line(subprocess.CompletedProcess([], 1, "", worker.text()))
        assert line.startswith(f"State store {state_store.location}: scope 'sitemap' is held "
                               f"by {repairer} (its hold lapses in "), line
        # Nothing asked of the site, nothing written, no run joined.
        assert site.log == []
        assert state_store.count_scope("sitemap") == before
        assert leftover_keys(cluster_prefix) == []
        assert list(state_store.scope_holders("sitemap", clock.now())) == [
            f"repair@{socket.gethostname()}:{os.getpid()}"]
    finally:
        go.set()
    done = await repair
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"forgot host 127.0.0.1 in scope 'sitemap': {before.pages} pages"), done.stdout
    assert state_store.scope_holders("sitemap", clock.now()) == {}  # released
    # The next crawl starts, and finds every page new.
    again = await crawl(SitemapPagesSpider, sitemap_url=site.url("/robots.txt"))
    assert again.stats.get_value("incremental/items_new") == 4


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_a_crawl_whose_hold_was_taken_over_by_a_repair_stops_and_does_not_take_it_back(
    site, state_uri, state_store: StateStore, monkeypatch, caplog,
):
    # A short hold, refreshed every 0.1 s: a lapse is a moment away.
    monkeypatch.setattr(ledger_module, "HOLD_TTL", 0.3)
    urls = pages(site, 6)
    site.hold("/p/")
    runner = CrawlerRunner(crawl_settings(state_uri, INCREMENTAL_FLUSH_INTERVAL=0.05,
                                          CONCURRENT_REQUESTS=2))
    crawler = runner.create_crawler(ListSpider)
    done = ensureDeferred(runner.crawl(crawler, urls=urls))
    try:
        await until(lambda: site.held >= 1, "the crawl to send a request")
        # Its hold lapsed (as when its reactor stalls past it) and a repair
        # took the scope.
        repair = "repair@elsewhere:4242"
        take_once_lapsed(state_store, repair)
        later = clock.now()
        assert list(state_store.scope_holders(SCOPE, later)) == [repair]
        await until(lambda: crawler.stats.get_value("incremental/store_errors"),
                    "the crawl to find its hold taken")
        # Not taken back while the crawl ran on.
        assert list(state_store.scope_holders(SCOPE, later)) == [repair]
    finally:
        site.release()
    await done
    assert crawler.stats.get_value("finish_reason") == "incremental_store_error"
    # What it staged (its crawl record at least) was dropped, and counted.
    assert crawler.stats.get_value("incremental/writes_dropped") >= 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(f"scope {SCOPE!r} is held by repair elsewhere:4242, which crawl "
               f"{socket.gethostname()}:{os.getpid()} may not hold it beside; stopping the crawl"
               in error for error in errors), errors
    assert list(state_store.scope_holders(SCOPE, later)) == [repair]


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_a_repairs_hold_is_renewed_while_it_runs_and_released_at_the_end(
    state_uri, state_store: StateStore,
):
    settings = crawl_settings(state_uri)

    def open_admin() -> Any:
        return open_admin_store(Settings(settings), "state")

    crawl = f"{socket.gethostname()}:{os.getpid()}"
    hold = RepairHold(open_admin, SCOPE, ttl=0.6)  # renewed every 0.2 s
    # (In a thread, as the command runs it: its store closes with asyncio.run.)
    await deferToThread(hold.__enter__)
    try:
        [(name, first)] = state_store.scope_holders(SCOPE, clock.now()).items()
        assert name == f"repair@{crawl}"
        # Bounded: until a renewal moved its lapse (a minute at most).
        await until(lambda: state_store.scope_holders(SCOPE, 0).get(name, 0) > first,
                    "the repair's hold to be renewed", seconds=60)
        # A crawl starting meanwhile is refused, naming the repair.
        held = state_store.take_scope(SCOPE, crawl, 60, clock.now())
        assert held is not None and held[0] == name
    finally:
        await deferToThread(hold.__exit__, None, None, None)
    assert state_store.scope_holders(SCOPE, 0) == {}  # released
    assert hold.lost is None


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_a_crawl_whose_hold_lapsed_under_a_whole_repair_stops(
    site, crawl, state_uri, state_store: StateStore, monkeypatch,
):
    # The crawl's hold lapses, and a quick repair takes the scope, forgets
    # its pages and ends, all before the crawl's next refresh: the refresh
    # does not take the hold again (the crawl would write on from what it
    # read before the repair), it stops the crawl.
    urls = pages(site, 4)
    await crawl(ListSpider, urls=urls)
    monkeypatch.setattr(ledger_module, "HOLD_TTL", 0.3)  # refreshed every 0.1 s
    site.hold("/p/")
    runner = CrawlerRunner(crawl_settings(state_uri, INCREMENTAL_FLUSH_INTERVAL=0.05,
                                          CONCURRENT_REQUESTS=4))
    crawler = runner.create_crawler(ListSpider)
    done = ensureDeferred(runner.crawl(crawler, urls=urls))
    repair = "repair@elsewhere:4242"
    try:
        await until(lambda: site.held >= 1, "the crawl to send a request")
        # On the reactor's thread, as a whole: no refresh runs between.
        take_once_lapsed(state_store, repair)
        for url in urls:
            state_store.forget_page(SCOPE, url)
        release_at_once(state_uri, repair)
        await until(lambda: crawler.stats.get_value("incremental/store_errors"),
                    "the crawl to find its hold gone")
    finally:
        site.release()
    await done
    assert crawler.stats.get_value("finish_reason") == "incremental_store_error"
    assert crawler.stats.get_value("incremental/writes_dropped") >= 1
    assert state_store.scope_holders(SCOPE, clock.now()) == {}  # not taken again


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_a_repair_whose_hold_was_taken_deletes_nothing_further(
    site, crawl, state_uri, state_store: StateStore, monkeypatch,
):
    # The repair's hold is taken by a crawl while the repair runs (its hold
    # lapsed unseen): the repair stops before it deletes, and says why.
    import time

    from incremental_crawler.commands import state as state_command
    urls = pages(site, 3)
    await crawl(ListSpider, urls=urls)
    before = state_store.count_scope(SCOPE)
    holds: list[RepairHold] = []

    class Seen(RepairHold):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, ttl=0.6, **kwargs)  # renewed every 0.2 s
            holds.append(self)

    monkeypatch.setattr(state_command, "RepairHold", Seen)
    store_class = type(state_store)
    forget_host = store_class.forget_host
    crawl_name = "elsewhere:99"

    def taken_then_forget(self: Any, scope: str, host: str) -> Any:
        [hold] = holds
        release_at_once(state_uri, hold.name)
        assert self.take_scope(scope, crawl_name, 60, clock.now()) is None
        for _ in range(1000):  # bounded: its next renewal finds the crawl's
            if hold.lost is not None:
                break
            time.sleep(0.01)
        return forget_host(self, scope, host)

    monkeypatch.setattr(store_class, "forget_host", taken_then_forget)
    done = await state(state_uri, "forget-host", "127.0.0.1", "--spider", SCOPE)
    assert done.returncode == 1
    assert done.stderr.startswith(
        "error: the repair of scope 'list' stopped, nothing further deleted: crawl "
        "elsewhere:99 took the scope (the hold lapsed); "), done.stderr
    assert state_store.count_scope(SCOPE) == before
    assert list(state_store.scope_holders(SCOPE, clock.now())) == [crawl_name]


@BACKENDS
@pytest.mark.parametrize("validators", ["strong", "none"])
@pytest_twisted.ensureDeferred
async def test_a_crawl_whose_hold_was_taken_over_writes_nothing_beside_the_repair(
    site, crawl, state_uri, state_store: StateStore, monkeypatch, validators,
):
    # What the crawl staged or answers once a repair took its scope is not
    # written: a 304 staged as a check would bring the page back "seen"
    # (validators kept) with its items deleted, so the next crawl would get
    # 304s and never store them again; an unchanged 200 would bring the
    # page back with its fingerprint, its items gone.
    for i in range(4):
        site.add_page(f"/p/{i}", validators, size=3000)
    urls = [site.url(f"/p/{i}") for i in range(4)]
    await crawl(ListSpider, urls=urls)
    monkeypatch.setattr(ledger_module, "HOLD_TTL", 0.3)  # refreshed every 0.1 s
    site.hold("/p/")
    runner = CrawlerRunner(crawl_settings(state_uri, INCREMENTAL_FLUSH_INTERVAL=0.05,
                                          CONCURRENT_REQUESTS=4))
    crawler = runner.create_crawler(ListSpider)
    done = ensureDeferred(runner.crawl(crawler, urls=urls))
    try:
        await until(lambda: site.held >= 1, "the crawl to send a request")
        take_once_lapsed(state_store, "repair@elsewhere:4242")
        for url in urls:
            state_store.forget_page(SCOPE, url)
    finally:
        site.release()
    await done
    assert crawler.stats.get_value("incremental/store_errors")
    assert crawler.stats.get_value("incremental/writes_dropped") >= 1
    # What the repair deleted stays deleted.
    assert [url for url in urls if state_store.url_record(SCOPE, url).pages] == []
    assert state_store.count_scope(SCOPE) == type(state_store.count_scope(SCOPE))(crawls=1)


def stall_until_lapsed(store: StateStore) -> None:
    """Block the reactor (a blocking callback, a laptop asleep) until every
    hold on the scope lapsed, by the clock of the store's holds (bounded)."""
    import time
    for _ in range(1000):
        if not store.scope_holders(SCOPE, clock.now()):
            return
        time.sleep(0.01)


def emitted_items(crawler: Any) -> list[object]:
    """The items *crawler* emits (item_scraped), as it emits them."""
    emitted: list[object] = []

    def collect(item: object) -> None:
        emitted.append(item)

    crawler.signals.connect(collect, signal=signals.item_scraped, weak=False)
    return emitted


async def crawl_stalled_once(site: Any, state_uri: str, state_store: StateStore,
                             **settings: Any) -> tuple[Any, list[object]]:
    """A crawl of four pages whose reactor stalls until its hold lapsed
    (nobody else taking the scope), once its first request reached the
    site; the crawler and the items it emitted."""
    from twisted.internet import reactor

    urls = pages(site, 4)
    site.hold("/p/")
    runner = CrawlerRunner(crawl_settings(state_uri, INCREMENTAL_FLUSH_INTERVAL=0.05,
                                          **settings))
    crawler = runner.create_crawler(ListSpider)
    emitted = emitted_items(crawler)
    done = ensureDeferred(runner.crawl(crawler, urls=urls))
    try:
        await until(lambda: site.held >= 1, "the crawl to send a request")
        reactor.callLater(0, stall_until_lapsed, state_store)
    finally:
        site.release()
    await done
    return crawler, emitted


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_a_lone_crawl_stalled_past_its_ttl_goes_on_and_stores_what_it_emitted(
    site, state_uri, state_store: StateStore, monkeypatch,
):
    # A blocking callback, a huge parse, a laptop asleep: the reactor
    # stalls past the hold's ttl while nobody touches the scope. The crawl
    # takes its hold again (the scope's hold epoch has not moved) rather
    # than stop and drop what it emitted (the next crawl would emit it
    # again as new).
    monkeypatch.setattr(ledger_module, "HOLD_TTL", 0.3)
    crawler, emitted = await crawl_stalled_once(site, state_uri, state_store)
    stats = crawler.stats.get_stats()
    assert stats.get("finish_reason") == "finished", stats
    assert not stats.get("incremental/writes_dropped"), stats
    assert not stats.get("incremental/store_errors"), stats
    assert state_store.count_pages(SCOPE) == len(emitted) == 4


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_a_feeds_only_crawl_stalled_once_keeps_the_whole_crawls_state(
    site, state_uri, state_store: StateStore, monkeypatch, tmp_path,
):
    # INCREMENTAL_STORE_ITEMS = False with FEEDS: nothing is committed until
    # the feeds close, so one stall past the ttl anywhere in the crawl would
    # drop every write of it while its feed is delivered.
    monkeypatch.setattr(ledger_module, "HOLD_TTL", 0.3)
    feed = tmp_path / "items.jsonl"
    crawler, _ = await crawl_stalled_once(
        site, state_uri, state_store, INCREMENTAL_STORE_ITEMS=False,
        FEEDS={str(feed): {"format": "jsonlines"}})
    delivered = [json.loads(line) for line in feed.read_text().splitlines() if line]
    stats = crawler.stats.get_stats()
    assert stats.get("finish_reason") == "finished", stats
    assert not stats.get("incremental/writes_dropped"), stats
    assert state_store.count_pages(SCOPE) == len(delivered) == 4


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_a_slow_start_past_the_ttl_does_not_run_a_whole_crawl_whose_writes_are_dropped(
    site, state_uri, state_store: StateStore, monkeypatch,
):
    # The hold is taken as the Ledger is built; its first refresh is when
    # the spider opens. A start slower than the ttl (extensions loading, a
    # big JOBDIR queue) finds it lapsed: taken again, nobody having taken
    # the scope meanwhile; never a whole crawl emitted and then dropped.
    monkeypatch.setattr(ledger_module, "HOLD_TTL", 0.3)
    taken = ledger_module.Ledger._take_scope

    def slow_take(self: Any) -> None:
        taken(self)
        stall_until_lapsed(state_store)

    monkeypatch.setattr(ledger_module.Ledger, "_take_scope", slow_take)
    urls = pages(site, 3)
    runner = CrawlerRunner(crawl_settings(state_uri, INCREMENTAL_FLUSH_INTERVAL=0.05))
    crawler = runner.create_crawler(ListSpider)
    emitted = emitted_items(crawler)
    await runner.crawl(crawler, urls=urls)
    stats = crawler.stats.get_stats()
    assert stats.get("finish_reason") == "finished", stats
    assert not stats.get("incremental/writes_dropped"), stats
    assert state_store.count_pages(SCOPE) == len(emitted) == 3


@BACKENDS
@pytest_twisted.ensureDeferred
async def test_a_crawl_whose_hold_was_taken_before_it_ran_stops_and_emits_nothing(
    site, state_uri, state_store: StateStore, monkeypatch,
):
    # A slow start past the ttl, and a repair took the scope and ended
    # meanwhile: the hold's first refresh (as the spider opens, before the
    # engine runs) finds it lapsed. The crawl stops once its engine runs and
    # emits nothing meanwhile, rather than run whole and drop every write.
    monkeypatch.setattr(ledger_module, "HOLD_TTL", 0.3)
    taken = ledger_module.Ledger._take_scope
    repair = "repair@elsewhere:4242"

    def slow_take_under_a_repair(self: Any) -> None:
        taken(self)
        take_once_lapsed(state_store, repair)
        release_at_once(state_uri, repair)

    monkeypatch.setattr(ledger_module.Ledger, "_take_scope", slow_take_under_a_repair)
    urls = pages(site, 3)
    runner = CrawlerRunner(crawl_settings(state_uri, INCREMENTAL_FLUSH_INTERVAL=0.05))
    crawler = runner.create_crawler(ListSpider)
    emitted = emitted_items(crawler)
    await runner.crawl(crawler, urls=urls)
    stats = crawler.stats.get_stats()
    assert stats.get("finish_reason") == "incremental_store_error", stats
    assert emitted == []
    assert crawler.stats.get_value("incremental/writes_dropped") >= 1
    assert state_store.count_pages(SCOPE) == 0
    assert state_store.scope_holders(SCOPE, clock.now()) == {}  # not taken again


@pytest.mark.parametrize("state_uri", ["sqlite"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_repair_whose_renewals_all_failed_past_its_ttl_says_so(
    state_uri, state_store: StateStore,
):
    # Every renewal fails (the store unreachable) until the repair ends,
    # past the hold's ttl: the hold lapsed (a crawl may have written beside
    # the repair), and the repair says so.
    import time

    from incremental_crawler.commands._repair_hold import HoldLost
    settings = crawl_settings(state_uri)
    hold = RepairHold(lambda: open_admin_store(Settings(settings), "state"), SCOPE, ttl=0.6)
    await deferToThread(hold.__enter__)

    def fails(*args: Any) -> Any:
        raise StateStoreError("the hold's node is unreachable")

    hold._store.take_scope = fails  # type: ignore[method-assign,union-attr]
    await deferToThread(time.sleep, 1.5)  # past the ttl: the hold lapsed
    assert state_store.scope_holders(SCOPE, clock.now()) == {}
    with pytest.raises(HoldLost, match=re.escape(
            "the hold lapsed (the hold could not be renewed: the hold's node is unreachable)")):
        await deferToThread(hold.__exit__, None, None, None)
