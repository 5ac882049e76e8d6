"""The report accounts for every known page once: pages known = the sum of its columns.

The columns: not requested (skipped by lastmod, not due, deferred), and
what became of each page requested (304, new, changed, page changed with
its items unchanged, unchanged in full, failed, gone or not found,
withheld, redirected). Pages are counted once, their requests apart.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
from scrapy import Request, Spider
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule
from twisted.internet.threads import deferToThread

from incremental_crawler import clock
from incremental_crawler.report.extension import OUTCOMES
from tests.clock_util import later
from tests.cluster_worker import Worker, crawl_in_process, leftover_keys, page_gets
from tests.follow_spider import StartsSpider
from tests.site import LoopbackSite
from tests.site.manual import CONTENTS
from tests.spiders import ListSpider
from tests.waiting import until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

    from scrapy.http import Response

#: The columns of report.json's summary that every known page is in exactly one of.
COLUMNS = ("skipped_lastmod", "not_due", "deferred", "pages_no_outcome",
           *(f"pages_{outcome}" for outcome in OUTCOMES))


def report_of(caplog) -> str:
    return next(r.getMessage() for r in caplog.records
                if r.getMessage().startswith("Incremental report"))


@pytest_twisted.ensureDeferred
async def test_a_crawl_with_404s_410s_429s_and_a_5xx_puts_every_page_in_one_column(
    site, crawl, tmp_path, caplog
):
    paths = site.add_pages(30, size=800, prefix="/a/", width=2)
    await crawl(ListSpider, urls=[site.url(p) for p in paths])
    site.change(paths[5])
    site.change(paths[6])
    for path in paths[:3]:
        site.override(path, status=404)
    site.override(paths[3], status=410)
    site.override(paths[4], status=500)
    # Above its budget the site answers 429 (Retry-After): retried, the
    # same pages, more requests.
    site.limit(rate=20, burst=5)
    site.reset_log()
    report_dir = tmp_path / "report"
    caplog.clear()
    with caplog.at_level("INFO"):
        # A third of the pages are not listed: the re-seeder asks for them
        # (all are due: recheck all).
        crawler = await crawl(
            ListSpider, urls=[site.url(p) for p in paths[:20]],
            settings={"INCREMENTAL_REVISIT_ENABLED": True, "INCREMENTAL_RECHECK_ALL": True,
                      "INCREMENTAL_THROTTLE_ENABLED": True, "CONCURRENT_REQUESTS": 16,
                      "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
                      "INCREMENTAL_THROTTLE_START_RATE": 60,
                      "INCREMENTAL_THROTTLE_MAX_RATE": 100,
                      "INCREMENTAL_REPORT_DIR": str(report_dir)})
    page_log = [r for r in site.log if r.path.startswith("/a/")]
    statuses = [r.status for r in page_log]
    assert statuses.count(429) > 0
    # The 500 was retried by RetryMiddleware (twice by default).
    assert statuses.count(500) == 3
    summary = json.loads((report_dir / "report.json").read_text())["summary"]
    assert {k: summary[k] for k in ("pages_known", "pages_checked", "pages_not_modified",
                                    "pages_changed", "pages_failed", "pages_gone",
                                    "pages_no_outcome")} == {
        "pages_known": 30, "pages_checked": 30, "pages_not_modified": 23, "pages_changed": 2,
        "pages_failed": 1, "pages_gone": 4, "pages_no_outcome": 0}
    assert sum(summary[column] for column in COLUMNS) == summary["pages_known"] == 30
    # Requests apart: every attempt the server saw, retries and 429s included.
    assert summary["checked"] == len(page_log) > 30
    report = report_of(caplog)
    assert (f"30 pages checked ({len(page_log)} requests), 23 not modified (304), 0 new, "
            "2 changed, 0 page changed, items unchanged, 0 unchanged in full, 1 failed, "
            "4 gone or not found (404, 410, other 4xx); items:") in report
    assert "; 30 in all" in report
    # The per-host table puts each page in one column too.
    [host] = json.loads((report_dir / "report.json").read_text())["hosts"]
    assert sum(host["outcomes"].values()) == host["requested"] == 30
    assert crawler.stats.get_value("incremental/schedule/outcome/gone") == 4


@pytest_twisted.ensureDeferred
async def test_a_crawl_started_within_the_second_of_the_last_one_counts_the_pages_it_left(
    site, crawl, monkeypatch, caplog
):
    # Last checks are stored in whole seconds. The first crawl's visits and
    # the second's start fall in one second: the pages the second crawl
    # neither listed nor requested are still known, not due.
    paths = site.add_pages(10, size=800, prefix="/a/", width=2)
    second = math.floor(clock.now()) + 0.2
    revisits = {"INCREMENTAL_REVISIT_ENABLED": True}
    monkeypatch.setattr(clock, "now", lambda: second)
    await crawl(ListSpider, settings=revisits, urls=[site.url(p) for p in paths])
    monkeypatch.setattr(clock, "now", lambda: second + 0.5)
    caplog.clear()
    with caplog.at_level("INFO"):
        # Three listed (not due), one of them fetched in full in this
        # crawl's first second; seven not listed.
        crawler = await crawl(ListSpider, settings=revisits,
                              urls=[site.url(p) for p in paths[:3]])
        refreshed = await crawl(ListSpider, settings=revisits,
                                urls=[site.url(paths[3])], meta={"incremental_refresh": True})
    stats = crawler.stats.get_value
    assert stats("incremental/schedule/not_due") == 10
    assert "known pages: requested 0, not due 10 (the first falls due" in report_of(caplog)
    # The page fetched in this second is requested, not also not due.
    assert refreshed.stats.get_value("incremental/schedule/requested/due") == 1
    assert refreshed.stats.get_value("incremental/schedule/not_due") == 9
    assert refreshed.stats.get_value("incremental/schedule/outcome/unchanged") == 1


def columns_of(summary: dict[str, int]) -> dict[str, int]:
    return {column: summary[column] for column in COLUMNS}


def assert_each_page_once(summary: dict[str, int], pages: int) -> None:
    """The report's columns hold *pages* known pages, each in one column:
    none negative, none requested without an outcome."""
    assert summary["pages_known"] == pages, columns_of(summary)
    assert all(count >= 0 for count in columns_of(summary).values()), columns_of(summary)
    assert summary["pages_no_outcome"] == 0, columns_of(summary)
    assert sum(columns_of(summary).values()) == pages


#: The manual's contents page and its content pages; not its general index.
_MANUAL_PAGES = r"/p/\d+\.html$|/p/index\.html$"


class SelfLinkingSpider(Spider):
    """A user's spider from its start page (``start_urls``: ``dont_filter``);
    the manual's contents page links to itself, so Scrapy lets the start URL
    through again when that link is followed."""

    name = "self_linking"

    def __init__(self, start_url: str = "", **kwargs: Any) -> None:
        self.start_urls = [start_url]
        super().__init__(**kwargs)

    def parse(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url}
        for link in LinkExtractor(allow=_MANUAL_PAGES).extract_links(response):
            yield response.follow(link, callback=self.parse)


class SelfLinkingCrawlSpider(CrawlSpider):
    """The same crawl as a CrawlSpider: its rules follow the self-link."""

    name = "self_linking_rules"
    rules = (Rule(LinkExtractor(allow=_MANUAL_PAGES), callback="parse_item", follow=True),)

    def __init__(self, start_url: str = "", **kwargs: Any) -> None:
        self.start_urls = [start_url]
        super().__init__(**kwargs)

    def parse_item(self, response: Response) -> dict[str, Any]:
        return {"url": response.url}


@pytest.mark.parametrize("spider", [SelfLinkingSpider, SelfLinkingCrawlSpider])
@pytest_twisted.ensureDeferred
async def test_a_start_page_that_links_to_itself_is_counted_once_each_crawl(
    crawl, state_db, tmp_path, monkeypatch, spider
):
    site = LoopbackSite.manual(12, page_size=1500)
    site.start()
    report = tmp_path / "report" / "report.json"
    # No flush before a crawl's end (a dozen pages): the start page's second
    # request is decided on what the store shows then. Cold, its first visit
    # is staged: the second is not due. A day later its first visit was a
    # 304, not flushed: due, and asked again (a second 304).
    settings = {"INCREMENTAL_REVISIT_ENABLED": True, "CONCURRENT_REQUESTS": 1,
                "INCREMENTAL_FLUSH_INTERVAL": 3600,
                "INCREMENTAL_REPORT_DIR": str(report.parent)}
    runs = []
    try:
        for days in (0, 1):
            later(monkeypatch, days)
            site.reset_log()
            await crawl(spider, settings=settings, start_url=site.url(CONTENTS))
            runs.append((json.loads(report.read_text()), [r.path for r in site.log]))
    finally:
        await site.stop()
    [(stored,)] = state_db("SELECT COUNT(*) FROM pages")
    assert stored == 13  # the contents and 12 pages
    (cold, cold_paths), (day_later, later_paths) = runs
    for run in (cold, day_later):
        assert_each_page_once(run["summary"], stored)
        # The per-host table puts each page in one column too.
        [host] = run["hosts"]
        assert sum(host["outcomes"].values()) == host["requested"] == stored
    # Cold: the start page's link to itself was decided (not due), not sent.
    assert cold_paths.count(CONTENTS) == 1
    assert cold["summary"]["pages_new"] == stored
    # A day later every page is due: the contents page was asked twice
    # (that is Scrapy's doing), one page checked, two requests.
    assert later_paths.count(CONTENTS) == 2
    assert day_later["summary"]["pages_checked"] == stored
    assert day_later["summary"]["pages_not_modified"] == stored
    assert day_later["summary"]["checked"] == stored + 1


@pytest_twisted.ensureDeferred
async def test_a_redirect_keeps_its_outcome_when_its_target_is_also_asked(
    site, crawl, tmp_path
):
    # Both start URLs are dont_filter, and so is the redirect's hop: /new is
    # fetched twice, once as itself and once as where /old went. Each page
    # counted has its own outcome (the answer at the chain's end is /old's).
    site.add_page("/new", "strong", size=1500)
    site.add_redirect("/old", "/new", 302)
    report = tmp_path / "report" / "report.json"
    settings = {"INCREMENTAL_REPORT_DIR": str(report.parent)}
    await crawl(ListSpider, settings=settings, urls=[site.url("/old"), site.url("/new")])
    summary = json.loads(report.read_text())["summary"]
    assert [r.path for r in site.log if r.path != "/robots.txt"].count("/new") == 2
    assert summary["requested"] == 2
    assert summary["pages_no_outcome"] == 0
    assert summary["pages_new"] == 2
    assert_each_page_once(summary, 2)


class NotDueThenRefreshedSpider(Spider):
    """Its start page asks for another page twice: plainly (not due: dropped,
    counted not due) and as a refresh (fetched), in the *order* given."""

    name = "not_due_then_refreshed"

    def __init__(self, start_url: str = "", other: str = "", order: str = "", **kw: Any):
        super().__init__(**kw)
        self.start_url, self.other, self.order = start_url, other, order.split(",")

    async def start(self) -> AsyncIterator[Any]:
        yield Request(self.start_url, meta={"incremental_refresh": True}, dont_filter=True)

    def parse(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "title": response.css("title::text").get()}
        if response.url != self.start_url:
            return
        for how in self.order:
            meta = {"incremental_refresh": True} if how == "refresh" else {}
            yield Request(self.other, callback=self.parse, meta=meta, dont_filter=True)


@pytest.mark.parametrize("order", ["plain,refresh", "refresh,plain"])
@pytest_twisted.ensureDeferred
async def test_a_page_counted_not_due_then_fetched_ends_in_its_answers_column(
    site, crawl, tmp_path, order
):
    start, other = site.add_pages(2, size=800, prefix="/a/", width=1)
    revisits = {"INCREMENTAL_REVISIT_ENABLED": True}
    urls = {"start_url": site.url(start), "other": site.url(other)}
    await crawl(NotDueThenRefreshedSpider, settings=revisits, order="refresh", **urls)
    site.reset_log()
    report = tmp_path / "report" / "report.json"
    await crawl(NotDueThenRefreshedSpider, settings={
        **revisits, "INCREMENTAL_REPORT_DIR": str(report.parent)}, order=order, **urls)
    summary = json.loads(report.read_text())["summary"]
    assert [r.path for r in site.log].count(other) == 1
    # Both fetched in full (unchanged); the other page is not also not due.
    assert summary["pages_unchanged"] == 2
    assert_each_page_once(summary, 2)


@pytest_twisted.ensureDeferred
async def test_a_redirect_to_a_failing_page_is_one_failed_page(site, crawl, tmp_path):
    # The target's failure is recorded for it and for the page asked (each
    # asked again next crawl); the report counts the page asked, once.
    site.add_page("/broken", "strong", size=1500)
    site.override("/broken", status=500)
    site.add_redirect("/old", "/broken", 302)
    report = tmp_path / "report" / "report.json"
    await crawl(ListSpider, settings={"INCREMENTAL_REPORT_DIR": str(report.parent),
                                      "INCREMENTAL_REVISIT_ENABLED": True},
                urls=[site.url("/old")])
    summary = json.loads(report.read_text())["summary"]
    assert summary["requested"] == summary["pages_failed"] == 1
    assert summary["pages_no_outcome"] == 0
    # Recorded twice (the target and /old), one page failed.
    assert summary["failed"] == 1
    [host] = json.loads(report.read_text())["hosts"]
    assert sum(host["outcomes"].values()) == host["requested"] == 1


@pytest_twisted.ensureDeferred
async def test_a_page_that_changed_and_is_fetched_twice_stays_changed(site, crawl, tmp_path):
    # The second fetch is judged against the first one's state and items
    # (page changed, or unchanged): the page's column is its strongest answer.
    start, other = site.add_pages(2, size=800, prefix="/a/", width=1)
    revisits = {"INCREMENTAL_REVISIT_ENABLED": True}
    urls = {"start_url": site.url(start), "other": site.url(other)}
    await crawl(NotDueThenRefreshedSpider, settings=revisits, order="refresh", **urls)
    site.change(other)
    site.reset_log()
    report = tmp_path / "report" / "report.json"
    await crawl(NotDueThenRefreshedSpider, settings={
        **revisits, "INCREMENTAL_REPORT_DIR": str(report.parent)}, order="refresh,refresh",
        **urls)
    summary = json.loads(report.read_text())["summary"]
    assert [r.path for r in site.log].count(other) == 2
    assert summary["items_changed"] == 1
    assert summary["pages_changed"] == summary["pages_unchanged"] == 1, columns_of(summary)
    assert_each_page_once(summary, 2)


class AnswersTwiceSpider(Spider):
    """Asks its one page twice in a crawl (a refresh each time); *between*
    runs after the first answer (the site changes its mind)."""

    name = "answers_twice"

    def __init__(self, url: str = "", between: Any = None, **kw: Any):
        super().__init__(**kw)
        self.url, self.between, self.answers = url, between, 0

    async def start(self) -> AsyncIterator[Any]:
        yield Request(self.url, meta={"incremental_refresh": True}, dont_filter=True)

    def parse(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "title": response.css("title::text").get()}
        self.answers += 1
        if self.answers == 1 and self.between is not None:
            self.between()
            yield Request(self.url, meta={"incremental_refresh": True}, dont_filter=True,
                          callback=self.parse)


@pytest_twisted.ensureDeferred
async def test_a_page_that_changed_then_went_away_in_one_crawl_is_gone(site, crawl, tmp_path):
    # Its 410 tombstones its items in the store: the report says gone, as
    # the store has it (a later answer that is no success is the page's).
    [page] = site.add_pages(1, size=800, prefix="/a/", width=1)
    url = site.url(page)
    await crawl(AnswersTwiceSpider, url=url)
    site.change(page)
    site.reset_log()
    report = tmp_path / "report" / "report.json"
    await crawl(AnswersTwiceSpider, settings={"INCREMENTAL_REPORT_DIR": str(report.parent)},
                url=url, between=lambda: site.override(page, status=410))
    assert [(r.path, r.status) for r in site.log if r.path == page] == [(page, 200), (page, 410)]
    summary = json.loads(report.read_text())["summary"]
    assert summary["pages_gone"] == 1 and summary["items_deleted"] == 1, columns_of(summary)
    assert summary["pages_changed"] == 0
    assert_each_page_once(summary, 1)


class FollowsSpider(Spider):
    """Asks its start page; the answer of *linker* (the start page unless
    given) asks the *then* pages (as a refresh if *refresh*): plain requests
    (not ``dont_filter``), which the dupefilter and the offsite check see,
    as a link-following spider's are."""

    name = "follows"
    allowed_domains = ("127.0.0.1",)

    def __init__(self, start: str = "", then: str = "", linker: str = "",
                 refresh: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.start_url, self.then = start, then.split()
        self.linker, self.refresh = linker or start, refresh

    async def start(self) -> AsyncIterator[Any]:
        yield Request(self.start_url)

    def parse(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "title": response.css("title::text").get()}
        if response.url == self.linker:
            meta = {"incremental_refresh": True} if self.refresh else {}
            for url in self.then:
                yield Request(url, callback=self.parse, meta=meta)


@pytest.mark.parametrize("where", ["seen", "offsite"])
@pytest_twisted.ensureDeferred
async def test_a_page_redirected_to_a_target_not_fetched_for_it_ends_redirected(
    site, crawl, tmp_path, where
):
    # /old's redirect is not followed: its target was fetched already this
    # crawl (the dupefilter drops the hop), or is on another host (the
    # offsite check drops it). /old is requested and ends redirected.
    site.add_page("/a", "strong", size=1500)
    target = site.url("/a") if where == "seen" else site.url("/a").replace(
        "127.0.0.1", "localhost")
    site.add_redirect("/old", target, 302)
    report = tmp_path / "report" / "report.json"
    await crawl(FollowsSpider, settings={"INCREMENTAL_REPORT_DIR": str(report.parent)},
                start=site.url("/a"), then=site.url("/old"))
    assert [r.path for r in site.log if r.path != "/robots.txt"] == ["/a", "/old"]
    summary = json.loads(report.read_text())["summary"]
    assert summary["requested"] == 2
    assert (summary["pages_new"], summary["pages_redirected"]) == (1, 1), columns_of(summary)
    assert_each_page_once(summary, 2)
    [host] = json.loads(report.read_text())["hosts"]
    assert sum(host["outcomes"].values()) == host["requested"] == 2


@pytest.mark.parametrize("how", ["redirected", "asked"])
@pytest_twisted.ensureDeferred
async def test_a_page_refused_by_a_robots_txt_that_failed_is_one_failed_page(
    site, crawl, tmp_path, how
):
    # The other host's robots.txt answers 500: its pages are refused, and
    # recorded as failures. Refused as the hop of /old's redirect, the
    # failure is /old's (the page that was asked); refused as a page asked
    # by a callback, the conditional middleware never saw it: counted where
    # it is refused.
    other = LoopbackSite()
    other.start()
    try:
        other.add_page("/p/1", "strong", size=1500)
        other.override("/robots.txt", status=500)
        site.add_page("/a", "strong", size=1500)
        site.add_redirect("/old", other.url("/p/1"), 302)
        asked = site.url("/old") if how == "redirected" else other.url("/p/1")
        report = tmp_path / "report" / "report.json"
        crawler = await crawl(
            FollowsSpider, settings={"INCREMENTAL_REPORT_DIR": str(report.parent),
                                     "INCREMENTAL_REVISIT_ENABLED": True, "RETRY_TIMES": 0},
            start=site.url("/a"), then=asked)
    finally:
        await other.stop()
    assert not [r for r in other.log if r.path == "/p/1"]
    assert crawler.stats.get_value("incremental/robotstxt/refused") == 1
    summary = json.loads(report.read_text())["summary"]
    assert summary["requested"] == 2
    assert (summary["pages_new"], summary["pages_failed"]) == (1, 1), columns_of(summary)
    # Recorded as a failure, to be asked again: counted once, for the page asked.
    assert summary["failed"] == 1
    assert_each_page_once(summary, 2)


@pytest.mark.parametrize("then", ["linked", "refreshed"])
@pytest_twisted.ensureDeferred
async def test_a_page_counted_not_due_in_bulk_then_reached_by_a_link_is_counted_once(
    site, crawl, tmp_path, monkeypatch, then
):
    # /a links to /b. A day later /b alone is fetched (no re-seeding): /a is
    # due, /b is not. Then a crawl from a new page, /c: the re-seeder asks
    # /a (due), and counts the pages nothing reached as not due in bulk,
    # /b among them, by the store's sums. /a's 304 replays its link to /b
    # (not due: dropped), or its new version asks /b as a refresh (fetched):
    # /b is in one column all the same.
    site.add_pages(3, size=800, prefix="/", width=1)
    a, b, c = (site.url(f"/{i}") for i in range(3))
    revisits = {"INCREMENTAL_REVISIT_ENABLED": True}
    await crawl(FollowsSpider, settings=revisits, start=a, then=b)
    later(monkeypatch, 1)
    await crawl(FollowsSpider, settings={**revisits, "INCREMENTAL_RESEED_ENABLED": False},
                start=b)
    if then == "refreshed":
        site.change("/0")
    site.reset_log()
    report = tmp_path / "report" / "report.json"
    crawler = await crawl(
        FollowsSpider, settings={**revisits, "INCREMENTAL_REPORT_DIR": str(report.parent)},
        start=c, then=b, linker=a, refresh=(then == "refreshed"))
    paths = [r.path for r in site.log if r.path != "/robots.txt"]
    assert crawler.stats.get_value("incremental/reseeded") == 1
    summary = json.loads(report.read_text())["summary"]
    if then == "linked":
        assert paths == ["/2", "/0"]
        assert summary["not_due"] == 1 and summary["pages_not_modified"] == 1
    else:
        assert paths == ["/2", "/0", "/1"]
        assert summary["not_due"] == 0 and summary["pages_unchanged"] == 1
    assert_each_page_once(summary, 3)


def run_summary(reports: Path, workers: int) -> dict[str, int]:
    """The run's figures: its workers' latest reports summed, as ``scrapy
    state`` sums their crawls."""
    summaries = [json.loads(path.read_text())["summary"] for path in reports.glob("report-*.json")
                 if not re.match(r"report-\d{8}T", path.name)]
    assert len(summaries) == workers
    return {name: sum(s[name] for s in summaries)
            for name in (*COLUMNS, "requested", "pages_known", "not_due")}


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_page_two_cluster_workers_ask_is_counted_once_for_the_run(
    site, state_uri, cluster_prefix, tmp_path
):
    # Every worker yields every start URL (dont_filter: the run's seen set
    # does not keep a page from being asked twice). One request at a time
    # each, and the page's answers held until two requests wait for them:
    # one is each worker's, both read the page's state before either
    # stored it. Asked by both, counted by one.
    [path] = site.add_pages(1, size=1500)
    site.hold("/p/")
    reports = tmp_path / "reports"
    workers = [Worker(site, state_uri, cluster_prefix, tmp_path, str(i),
                      "-s", f"INCREMENTAL_REPORT_DIR={reports}",
                      "-s", "CONCURRENT_REQUESTS=1",
                      spider=("starts", "-a", f"urls={site.url(path)}", "-a", f"tag={i}",
                              "-s", "SPIDER_MODULES=tests.follow_spider"))
               for i in range(2)]
    await until(lambda: site.held >= 2, "both workers to ask the page", seconds=60)
    site.release()
    for worker in workers:
        assert await worker.wait() == 0, worker.tail()
    assert page_gets(site) == {path: 2}
    # Its item once or twice: a worker whose answer's item comes after the
    # other stored the same one drops it as unchanged (a race of the two).
    assert 1 <= sum(len(worker.urls()) for worker in workers) <= 2
    run = run_summary(reports, 2)
    assert run["requested"] == 1, run
    assert run["pages_new"] == 1, run
    assert_each_page_once(run, 1)
    assert leftover_keys(cluster_prefix) == []


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_pages_one_cluster_worker_counted_not_due_are_not_in_the_re_seeders_sum(
    site, state_uri, cluster_prefix, tmp_path
):
    # Run 1 stores six pages. Run 2, moments later: each worker yields three
    # of them (not due: dropped, and counted, by the worker that yields
    # them) and a new page; the new pages' answers are held until each
    # worker has one on the wire, so both are in the run. One worker
    # re-seeds, and counts the known pages nothing reached by the store's
    # sums: the pages the other worker counted are not counted again.
    pages = site.add_pages(6, size=1500)
    new = site.add_pages(2, size=1500, prefix="/n/")
    revisits = ("-s", "INCREMENTAL_REVISIT_ENABLED=True")

    def spider(urls: list[str], tag: str) -> tuple[str, ...]:
        return ("starts", "-a", f"urls={' '.join(site.url(u) for u in urls)}", "-a",
                f"tag={tag}", "-s", "SPIDER_MODULES=tests.follow_spider")

    # Run 1, one worker (in this process: the fill).
    await crawl_in_process(site, state_uri, cluster_prefix, INCREMENTAL_REVISIT_ENABLED=True,
                           spider=(StartsSpider, {
                               "urls": " ".join(site.url(u) for u in pages), "tag": "1"}))
    site.reset_log()
    site.hold("/n/")
    reports = tmp_path / "reports"
    workers = [Worker(site, state_uri, cluster_prefix, tmp_path, f"2-{i}", *revisits,
                      "-s", f"INCREMENTAL_REPORT_DIR={reports}",
                      "-s", "CONCURRENT_REQUESTS=1",
                      spider=spider([new[i], *pages[3 * i:3 * i + 3]], f"2-{i}"))
               for i in range(2)]
    await until(lambda: site.held >= 2, "both workers to ask a new page", seconds=60)
    site.release()
    for worker in workers:
        assert await worker.wait() == 0, worker.tail()
    assert page_gets(site) == {}
    assert sorted(r.path for r in site.log if r.path.startswith("/n/")) == new
    assert sum("Re-seeded 0 due pages" in worker.text() for worker in workers) == 1
    run = run_summary(reports, 2)
    assert (run["not_due"], run["requested"], run["pages_new"]) == (6, 2, 2), run
    assert_each_page_once(run, 8)
    assert leftover_keys(cluster_prefix) == []


@pytest_twisted.ensureDeferred
async def test_a_page_deferred_over_the_re_seed_limit_then_reached_by_a_link_is_counted_once(
    site, crawl, tmp_path, monkeypatch
):
    # /0 links to /1 and /2. A day later all three are due; the crawl starts
    # from a new page, /3, and re-seeds one page (INCREMENTAL_RESEED_LIMIT):
    # /0, the first of the due pages (their next visits tie; then by URL).
    # The other two are deferred, until /0's 304 replays its links to them:
    # requested after all, they leave the deferred column.
    site.add_pages(4, size=800, prefix="/", width=1)
    first, *linked, start = (site.url(f"/{i}") for i in range(4))
    revisits = {"INCREMENTAL_REVISIT_ENABLED": True}
    await crawl(FollowsSpider, settings=revisits, start=first, then=" ".join(linked))
    later(monkeypatch, 1)
    site.reset_log()
    report = tmp_path / "report" / "report.json"
    crawler = await crawl(
        FollowsSpider, settings={**revisits, "INCREMENTAL_RESEED_LIMIT": 1,
                                 "INCREMENTAL_REPORT_DIR": str(report.parent)},
        start=start)
    assert crawler.stats.get_value("incremental/reseeded") == 1
    assert crawler.stats.get_value("incremental/schedule/deferred") == 2
    assert sorted(r.path for r in site.log if r.path != "/robots.txt") == [
        "/0", "/1", "/2", "/3"]
    summary = json.loads(report.read_text())["summary"]
    assert summary["deferred"] == 0, columns_of(summary)
    assert (summary["pages_new"], summary["pages_not_modified"]) == (1, 3), columns_of(summary)
    assert_each_page_once(summary, 4)


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_pages_a_killed_cluster_worker_counted_are_counted_by_the_worker_left(
    site, state_uri, cluster_prefix, tmp_path
):
    # The victim decides and counts every page for the run, its requests
    # held on the wire; SIGKILLed, it records no crawl (its figures are
    # lost). The survivor starts from the same pages (decided while the
    # victim is not yet taken for dead: counted elsewhere), takes back the
    # victim's requests once it is, and counts those pages itself: the
    # run's figures (the survivor's) hold every page, once.
    paths = site.add_pages(4, size=1500)
    site.hold("/p/")
    reports = tmp_path / "reports"

    def worker(name: str) -> Worker:
        return Worker(site, state_uri, cluster_prefix, tmp_path, name,
                      "-s", f"INCREMENTAL_REPORT_DIR={reports}",
                      "-s", "INCREMENTAL_CLUSTER_WORKER_TTL=2",
                      spider=("starts", "-a", f"urls={' '.join(site.url(p) for p in paths)}",
                              "-a", f"tag={name}", "-s", "SPIDER_MODULES=tests.follow_spider"))

    victim = worker("victim")
    await until(lambda: site.held >= len(paths), "the victim to ask every page", seconds=60)
    os.kill(victim.proc.pid, signal.SIGKILL)
    await deferToThread(victim.proc.wait)
    site.release()
    survivor = worker("survivor")
    assert await survivor.wait() == 0, survivor.tail()
    assert re.search(r"(\d+) of their requests went back to the queue", survivor.text()), (
        survivor.tail())
    run = run_summary(reports, 1)
    assert (run["requested"], run["pages_new"]) == (4, 4), run
    assert_each_page_once(run, 4)
    assert leftover_keys(cluster_prefix) == []


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_page_failing_in_a_cluster_crawl_is_one_failed_page(
    site, state_uri, cluster_prefix, tmp_path
):
    paths = site.add_pages(2, size=1500)
    site.override(paths[1], status=503)
    reports = tmp_path / "reports"
    # One worker, in this process (what is counted is the subject, not the process).
    await crawl_in_process(site, state_uri, cluster_prefix,
                           INCREMENTAL_REPORT_DIR=str(reports), RETRY_TIMES=0,
                           spider=(StartsSpider, {
                               "urls": " ".join(site.url(p) for p in paths), "tag": "0"}))
    run = run_summary(reports, 1)
    assert (run["requested"], run["pages_new"], run["pages_failed"],
            run["pages_no_outcome"]) == (2, 1, 1, 0), run
    assert leftover_keys(cluster_prefix) == []
