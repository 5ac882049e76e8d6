"""The report accounts for every known page once: pages known = the sum of its columns.

The columns: not requested (skipped by lastmod, not due, deferred), and
what became of each page requested (304, new, changed, page changed with
its items unchanged, unchanged in full, failed, gone or not found,
withheld, redirected). Pages are counted once, their requests apart.
"""

from __future__ import annotations

import json
import math

import pytest_twisted

from incremental_crawler import clock
from incremental_crawler.report.extension import OUTCOMES
from tests.spiders import ListSpider

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
