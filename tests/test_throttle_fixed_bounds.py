"""A project's own DOWNLOAD_DELAY and CONCURRENT_REQUESTS_PER_DOMAIN (as
``scrapy startproject`` writes them) on real crawls: honoured, named in one
warning at start-up, and reported as the rate they let through."""

from __future__ import annotations

import logging
import re

import pytest
import pytest_twisted

from tests.send_log import kept_apart
from tests.spiders import ListSpider

THROTTLE_LOGGER = "incremental_crawler.politeness.extension"
REPORT_LOGGER = "incremental_crawler.report.extension"
#: The window starts far above what the delay lets through: the figures
#: must not show it as the crawl's rate.
POLITE = {"INCREMENTAL_THROTTLE_ENABLED": True, "INCREMENTAL_THROTTLE_START_RATE": 40}
#: The template's values, with a shorter delay to keep the test short: the
#: point is the cap, 1/0.2 = 5 requests/s.
DELAY = 0.2


def cap_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Warnings (of any logger) naming either setting."""
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
            and ("DOWNLOAD_DELAY" in r.getMessage()
                 or "CONCURRENT_REQUESTS_PER_DOMAIN" in r.getMessage())]


@pytest_twisted.ensureDeferred
async def test_the_templates_delay_and_concurrency_are_honoured_named_and_reported(
        site, crawl, caplog):
    paths = site.add_pages(6, size=800)
    caplog.set_level(logging.INFO)
    crawler = await crawl(ListSpider, settings={
        **POLITE, "DOWNLOAD_DELAY": DELAY, "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        # The periodic line, a few times during the crawl (about 1.4 s).
        "LOGSTATS_INTERVAL": 0.25,
        "DOWNLOADER": "tests.send_log.SendLogDownloader",
    }, urls=[site.url(p) for p in paths])

    assert {r.path for r in site.log if r.status == 200} >= set(paths)
    # The promise kept: every request of the slot (robots.txt too) left one
    # delay after the previous one (no jitter: Scrapy's default would let
    # them go 0.5-1.5 delays apart), in the order the server saw them, and
    # the server had one at a time. Each arrived one delay or more after the
    # previous one left; two arrivals closer than the delay are the earlier
    # request's transit (its connection's opening), not the crawler's pace
    # (tests/send_log.py).
    downloader = crawler.engine.downloader
    assert [send.url for send in downloader.sends] == [site.url(r.path) for r in site.log]
    assert kept_apart(site.log, downloader, DELAY) == []
    assert max(site.max_in_flight.values()) == 1

    # One warning, naming both settings, their values and what they cost.
    [warning] = cap_warnings(caplog)
    assert [r.name for r in caplog.records if r.getMessage() == warning] == [THROTTLE_LOGGER]
    assert "DOWNLOAD_DELAY = 0.2: every domain at most 5 requests/s" in warning
    assert "CONCURRENT_REQUESTS_PER_DOMAIN = 1: every domain at most 1 request at a time" in (
        warning)
    assert "remove it from settings.py" in warning

    # The figures are the rate the delay lets through, not the window's.
    stats = crawler.stats
    assert stats.get_value("incremental/throttle/127.0.0.1/window") == pytest.approx(1 / DELAY)
    assert stats.get_value("incremental/throttle/127.0.0.1/window_uncapped") >= 40
    lines = [r.getMessage() for r in caplog.records
             if r.name == REPORT_LOGGER and "windows:" in r.getMessage()]
    assert lines, "no periodic line with the windows"
    for line in lines:
        windows = line.split("windows: ", 1)[1]
        assert re.fullmatch(r"127\.0\.0\.1 5\.0/s \(delay floor 0\.2 s; window \d+\.\d/s\)",
                            windows), windows
    [report] = [r.getMessage() for r in caplog.records
                if r.name == REPORT_LOGGER and r.getMessage().startswith("Incremental report")]
    assert "  politeness: 127.0.0.1 5.0/s (delay floor 0.2 s; window " in report


@pytest_twisted.ensureDeferred
async def test_scrapys_defaults_cap_nothing_and_warn_of_nothing(site, crawl, caplog):
    paths = site.add_pages(4, size=800)
    caplog.set_level(logging.INFO)
    # crawl_settings sets neither DOWNLOAD_DELAY nor CONCURRENT_REQUESTS_PER_DOMAIN.
    crawler = await crawl(ListSpider, settings=POLITE, urls=[site.url(p) for p in paths])
    assert crawler.settings.getfloat("DOWNLOAD_DELAY") == 0
    assert crawler.settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN") == 8
    assert {r.path for r in site.log if r.status == 200} >= set(paths)
    assert cap_warnings(caplog) == []
    [report] = [r.getMessage() for r in caplog.records
                if r.name == REPORT_LOGGER and r.getMessage().startswith("Incremental report")]
    assert "  politeness: 127.0.0.1 " in report
    assert "delay floor" not in report
