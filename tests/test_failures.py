"""Failed pages are recorded by their final outcome, on real crawls.

A hand-made sitemap (with an ETag: it answers 304 when unchanged) lists
pages of which some fail. The failures are recorded (after Scrapy's
retries), so the sitemap's validators are saved all the same, and the next
crawl, whose sitemap answers 304, asks again for the failed pages only (the
re-seeder reads their records), backing off when they keep failing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import pytest_twisted
from scrapy import signals
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro

from incremental_crawler import clock
from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from incremental_crawler.state.records import PageKey, PageState
from incremental_crawler.state.stores import open_store
from tests.test_lastmod import urlset

DAY = 86_400.0
MINUTE = 60.0

SETTINGS = {
    "INCREMENTAL_REVISIT_ENABLED": True,
    "INCREMENTAL_REVISIT_INITIAL": DAY,
    "INCREMENTAL_REVISIT_MIN": 3600,
    "INCREMENTAL_REVISIT_MAX": 30 * DAY,
    "INCREMENTAL_RECHECK_EVERY": 0,
    # A timeout is a failure quickly; one retry, so a retried page can succeed.
    # Long enough that a loaded machine answers every other page within it
    # (at 0.5 s the 500s of a busy run timed out too).
    "DOWNLOAD_TIMEOUT": 1.5,
    "RETRY_TIMES": 1,
}

GOOD = [f"/p/{i}" for i in range(4)]
BROKEN, GONE, SLOW = "/p/broken", "/p/gone", "/p/slow"


def sitemap_xml(site: Any, paths: list[str]) -> str:
    urls = "".join(f"<url><loc>{site.url(path)}</loc></url>" for path in paths)
    return ('<?xml version="1.0" encoding="UTF-8"?>'
            f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>')


def serve(site: Any, paths: list[str], etag: str = '"sm-1"') -> None:
    for path in paths:
        if path not in (BROKEN, GONE):
            site.add_page(path, "strong", size=1500)
    site.add_document("/sitemap.xml", sitemap_xml(site, paths), "application/xml", etag=etag)


def at(monkeypatch: pytest.MonkeyPatch, offset: float) -> None:
    """Every date-dependent decision of the next crawls *offset* seconds ahead."""
    monkeypatch.setattr(clock, "now", lambda: time.time() + offset)


async def crawl_sitemap(crawl: Any, site: Any, spidercls: type = SitemapPagesSpider,
                        **settings: Any) -> Any:
    return await crawl(spidercls, settings={**SETTINGS, **settings},
                       sitemap_url=site.url("/sitemap.xml"))


async def stored(state_uri: str, site: Any, path: str, *, scope: str = "sitemap"
                 ) -> PageState | None:
    """The page at *path* as the store holds it (the sitemap spider's scope by default)."""
    store = open_store(Settings({"INCREMENTAL_STATE_URI": state_uri}))
    try:
        return await deferred_from_coro(store.get_page(PageKey(scope, site.url(path))))
    finally:
        await deferred_from_coro(store.close())


def gets(site: Any, path: str) -> list[int]:
    """Statuses of the GETs the site answered for *path*."""
    return [r.status for r in site.requests_for(path) if r.method == "GET"]


def crawl_start(crawler: Any) -> float:
    """The crawl's start on the ledger's clock (what failure schedules count from)."""
    ledger = crawler.get_extension(Ledger)
    assert ledger is not None
    return ledger.crawl_started


@pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_failed_pages_are_recorded_and_the_sitemap_is_saved_all_the_same(
    site, crawl, state_uri, monkeypatch
):
    serve(site, [*GOOD, BROKEN, GONE, SLOW])
    site.override(BROKEN, status=500)
    site.override(GONE, status=404)
    site.slow(SLOW, 4.0)
    at(monkeypatch, 0)
    first = await crawl_sitemap(crawl, site)
    # Retried once each: the 500 and the timeout; a 404 is not retried.
    assert gets(site, BROKEN) == [500, 500]
    assert gets(site, GONE) == [404]
    stats = first.stats.get_stats()
    # The slow page timed out twice (the site logs no answer it could not send).
    assert stats["downloader/exception_type_count/scrapy.exceptions.DownloadTimeoutError"] == 2
    assert stats["incremental/schedule/failed"] == 2
    assert "incremental/failures_unrecorded" not in stats
    # The sitemap's validators are saved: one dead link costs it nothing.
    sitemap = await stored(state_uri, site, "/sitemap.xml")
    assert sitemap is not None and sitemap.etag == '"sm-1"'
    assert stats["incremental/discovery_committed"] == 1
    for path, status in ((BROKEN, 500), (GONE, 404), (SLOW, 0)):
        state = await stored(state_uri, site, path)
        assert state is not None, path
        assert (state.last_status, state.failures, state.callback) == (status, 1, "parse"), path
        assert (state.fingerprint, state.etag) == (None, None), path
        # Due on the next crawl: the start of the crawl it failed in.
        assert abs(state.next_visit - crawl_start(first)) <= 1, path
    good = await stored(state_uri, site, GOOD[0])
    assert good is not None and good.failures == 0 and good.fingerprint is not None

    # A minute later: the sitemap answers 304, the slow page answers in time.
    site.reset_log()
    site.slow(SLOW, 0.0)
    at(monkeypatch, MINUTE)
    second = await crawl_sitemap(crawl, site)
    assert gets(site, "/sitemap.xml") == [304]
    assert gets(site, BROKEN) == [500, 500]
    assert gets(site, GONE) == [404]
    assert gets(site, SLOW) == [200]
    assert all(gets(site, path) == [] for path in GOOD)
    assert second.stats.get_value("incremental/reseeded") == 3
    assert second.stats.get_value("incremental/schedule/failed") == 1
    recovered = await stored(state_uri, site, SLOW)
    assert recovered is not None and recovered.failures == 0
    assert recovered.fingerprint is not None
    # Failed twice in a row: due a revisit interval after the second crawl's start.
    broken = await stored(state_uri, site, BROKEN)
    assert broken is not None and broken.failures == 2
    assert abs(broken.next_visit - (crawl_start(second) + DAY)) <= 1

    # Two minutes after the first: backing off, nothing is requested.
    site.reset_log()
    at(monkeypatch, 2 * MINUTE)
    await crawl_sitemap(crawl, site)
    assert gets(site, "/sitemap.xml") == [304]
    assert gets(site, BROKEN) == gets(site, GONE) == []

    # A day later it is due again; its third failure waits two days.
    at(monkeypatch, DAY + 2 * MINUTE)
    fourth = await crawl_sitemap(crawl, site)
    assert gets(site, BROKEN) == [500, 500]
    broken = await stored(state_uri, site, BROKEN)
    assert broken is not None and broken.failures == 3
    assert abs(broken.next_visit - (crawl_start(fourth) + 2 * DAY)) <= 1



class FlakySitemapSpider(SitemapPagesSpider):
    """The sitemap spider; the site's ``flaky`` page heals once it answered 500."""

    name = "sitemap"

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> Any:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.downloaded, signal=signals.response_downloaded)
        return spider

    def downloaded(self, response: Any, request: Any, spider: Any) -> None:
        # Every attempt is downloaded; only the last one reaches the engine.
        if response.status == 500:
            self.site.clear_override(self.flaky)


@pytest_twisted.ensureDeferred
async def test_a_5xx_retried_until_it_succeeds_is_no_failure(site, crawl, state_uri):
    serve(site, [*GOOD, "/p/flaky"])
    site.override("/p/flaky", status=500)
    first = await crawl(FlakySitemapSpider, settings=SETTINGS,
                        sitemap_url=site.url("/sitemap.xml"), site=site, flaky="/p/flaky")
    assert gets(site, "/p/flaky") == [500, 200]
    stats = first.stats.get_stats()
    assert "incremental/schedule/failed" not in stats
    state = await stored(state_uri, site, "/p/flaky")
    assert state is not None
    assert (state.last_status, state.failures, state.checks) == (200, 0, 1)
    assert state.fingerprint is not None


class RaisingSitemapSpider(SitemapPagesSpider):
    """The sitemap spider whose callback raises on the pages in ``broken``."""

    name = "sitemap"
    broken: tuple[str, ...] = ()

    def parse(self, response: Any) -> Any:
        if any(response.url.endswith(path) for path in self.broken):
            raise ValueError("a bug in the callback")
        return super().parse(response)


@pytest_twisted.ensureDeferred
async def test_a_page_whose_callback_raised_is_due_though_its_sitemap_answers_304(
    site, crawl, state_uri, monkeypatch
):
    async def run(offset: float, broken: tuple[str, ...] = ()) -> Any:
        site.reset_log()
        at(monkeypatch, offset)
        return await crawl(RaisingSitemapSpider, settings=SETTINGS,
                           sitemap_url=site.url("/sitemap.xml"), broken=broken)

    serve(site, [*GOOD, "/p/bad"])
    first = await run(0, ("/p/bad",))
    # A new page withheld: a failure record; the sitemap is saved all the same.
    assert first.stats.get_value("incremental/state_withheld") == 1
    assert first.stats.get_value("incremental/failures_unrecorded") is None
    assert first.stats.get_value("incremental/schedule/failed") is None
    bad = await stored(state_uri, site, "/p/bad")
    assert bad is not None
    assert (bad.last_status, bad.failures, bad.callback, bad.fingerprint) == (200, 1, "parse", None)
    assert abs(bad.next_visit - crawl_start(first)) <= 1
    sitemap = await stored(state_uri, site, "/sitemap.xml")
    assert sitemap is not None and sitemap.etag == '"sm-1"'

    # A minute later the sitemap answers 304: the page is asked again all the same.
    await run(MINUTE)
    assert gets(site, "/sitemap.xml") == [304]
    assert gets(site, "/p/bad") == [200]
    assert all(gets(site, path) == [] for path in GOOD)
    bad = await stored(state_uri, site, "/p/bad")
    assert bad is not None and bad.failures == 0 and bad.fingerprint is not None

    # A known page withheld keeps its old validators, and is due next crawl.
    old = await stored(state_uri, site, GOOD[0])
    assert old is not None and old.etag is not None
    site.change(GOOD[0])
    third = await run(2 * DAY, (GOOD[0],))
    assert gets(site, GOOD[0]) == [200]
    assert third.stats.get_value("incremental/state_withheld") == 1
    kept = await stored(state_uri, site, GOOD[0])
    assert kept is not None
    assert (kept.etag, kept.fingerprint, kept.failures) == (old.etag, old.fingerprint, 1)
    assert abs(kept.next_visit - crawl_start(third)) <= 1
    await run(2 * DAY + MINUTE)
    assert gets(site, "/sitemap.xml") == [304]
    [again] = site.requests_for(GOOD[0])
    assert (again.status, again.if_none_match) == (200, old.etag)
    assert all(gets(site, path) == [] for path in GOOD[1:])


@pytest_twisted.ensureDeferred
async def test_a_withheld_change_is_asked_again_behind_a_304_sitemap(
    site, crawl, state_uri, monkeypatch
):
    # The page changed and its sitemap lastmod moved; its callback failed,
    # so its state kept the old lastmod and its 2xx status. The sitemap was
    # saved (the failure was recorded): a 304 to it next time must not let
    # the old lastmod vouch for the page.
    paths = [f"/w/{i}" for i in range(4)]
    for path in paths:
        site.add_page(path, "strong", size=1500)
    lastmods = dict.fromkeys(paths, "2024-01-01")

    def serve(etag: str) -> None:
        site.add_document("/sitemap.xml", urlset([(site.url(p), lastmods[p]) for p in paths]),
                          "application/xml", etag=etag)

    async def run(offset: float, broken: tuple[str, ...] = ()) -> Any:
        site.reset_log()
        at(monkeypatch, offset)
        return await crawl(RaisingSitemapSpider, settings=SETTINGS,
                           sitemap_url=site.url("/sitemap.xml"), broken=broken)

    serve('"sm-1"')
    await run(0)
    site.change(paths[0])
    lastmods[paths[0]] = "2024-02-01"
    serve('"sm-2"')
    second = await run(2 * DAY, (paths[0],))
    assert gets(site, paths[0]) == [200]
    assert second.stats.get_value("incremental/state_withheld") == 1
    assert (await stored(state_uri, site, "/sitemap.xml")).etag == '"sm-2"'

    third = await run(2 * DAY + MINUTE)
    assert gets(site, "/sitemap.xml") == [304]
    assert gets(site, paths[0]) == [200]
    assert third.stats.get_value("incremental/schedule/requested/retry") == 1


# -- answers lost on their way back ----------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_an_answer_that_cannot_be_decoded_is_a_failure_asked_again_behind_a_304(
    site, crawl, state_uri, monkeypatch
):
    garbled = "/p/garbled"
    serve(site, [*GOOD, garbled])
    # Not the gzip its header names: HttpCompressionMiddleware raises in its
    # process_response, where no middleware's process_exception sees it.
    site.override(garbled, headers={"Content-Encoding": "gzip"})
    at(monkeypatch, 0)
    first = await crawl_sitemap(crawl, site)
    assert gets(site, garbled) == [200]
    state = await stored(state_uri, site, garbled)
    assert state is not None
    assert (state.last_status, state.failures, state.fingerprint) == (0, 1, None)
    assert abs(state.next_visit - crawl_start(first)) <= 1
    assert first.stats.get_value("incremental/schedule/failed") == 1
    sitemap = await stored(state_uri, site, "/sitemap.xml")
    assert sitemap is not None and sitemap.etag == '"sm-1"'

    # The sitemap answers 304: the failed page is asked again all the same.
    site.clear_override(garbled)
    site.reset_log()
    at(monkeypatch, MINUTE)
    await crawl_sitemap(crawl, site)
    assert gets(site, "/sitemap.xml") == [304]
    assert gets(site, garbled) == [200]
    assert all(gets(site, path) == [] for path in GOOD)
    recovered = await stored(state_uri, site, garbled)
    assert recovered is not None and recovered.failures == 0
    assert recovered.fingerprint is not None


@pytest.mark.parametrize("chain", ["loop", "self", "too-long"])
@pytest_twisted.ensureDeferred
async def test_a_redirect_that_ends_nowhere_fails_the_page_asked(
    site, crawl, state_uri, monkeypatch, caplog, chain
):
    page = "/p/moving"
    serve(site, [*GOOD, page])
    if chain == "loop":  # to another URL and back: the dupefilter drops the return
        site.add_redirect(page, "/p/elsewhere", 302)
        site.add_redirect("/p/elsewhere", page, 302)
    elif chain == "self":
        site.add_redirect(page, page, 302)
    else:  # more hops than REDIRECT_MAX_TIMES
        site.add_redirect(page, "/r/1", 302)
        site.add_redirect("/r/1", "/r/2", 302)
        site.add_redirect("/r/2", "/r/3", 302)
    caplog.set_level(logging.INFO, logger="incremental_crawler.crawl.outcomes")
    at(monkeypatch, 0)
    first = await crawl_sitemap(crawl, site, REDIRECT_MAX_TIMES=2)
    state = await stored(state_uri, site, page)
    assert state is not None
    assert (state.last_status, state.failures, state.fingerprint) == (302, 1, None)
    assert abs(state.next_visit - crawl_start(first)) <= 1
    assert first.stats.get_value("incremental/schedule/failed") == 1
    said = [r for r in caplog.records if r.levelno >= logging.INFO
            and site.url(page) in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert ("loop" if chain != "too-long" else "Too many redirects") in said[0].getMessage()

    # Behind a sitemap answering 304, the page is asked again.
    site.reset_log()
    at(monkeypatch, MINUTE)
    await crawl_sitemap(crawl, site, REDIRECT_MAX_TIMES=2)
    assert gets(site, "/sitemap.xml") == [304]
    assert gets(site, page) == [302]


@pytest_twisted.ensureDeferred
async def test_a_response_header_over_16384_bytes_is_a_failure_naming_its_cause(
        crawl, state_db, caplog):
    # Twisted's HTTP client parses lines of at most 16384 bytes and closes
    # the connection on a longer one: said as "Connection was closed
    # cleanly" unless the add-on names the cause.
    from tests.scripted_server import NOT_FOUND, ScriptedServer, answer
    from tests.spiders import ListSpider

    def script(head: bytes) -> bytes:
        if not head.startswith(b"GET /page "):
            return NOT_FOUND
        return answer("200 OK", [(b"Content-Type", b"text/html"),
                                 (b"X-Big", b"x" * 100_000)], b"<html><body>hi</body></html>")

    with ScriptedServer(script) as server, caplog.at_level(logging.INFO):
        url = server.url("/page")
        crawler = await crawl(ListSpider, urls=[url], settings={"RETRY_ENABLED": False})
    assert server.heads_for("/page")
    assert crawler.collected == []
    assert state_db("SELECT last_status, failures FROM pages WHERE url = ?", url) == [(0, 1)]
    problems = [f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records
                if r.levelno >= logging.WARNING and url in r.getMessage()]
    assert len(problems) == 1, problems
    assert "response header line over 16384 bytes" in problems[0], problems
    assert "closed cleanly" not in caplog.text
