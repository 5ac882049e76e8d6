"""The user's delay and concurrency against the windows (pure: no crawl):
which settings the start-up warning names, and the effective rate."""

from __future__ import annotations

from typing import Any

import pytest
from scrapy.settings import Settings

from incremental_crawler.politeness.extension import capping_settings, effective_rate
from incremental_crawler.politeness.window import DomainWindow, WindowPolicy

POLICY = WindowPolicy()  # max_rate 50, max_concurrency 16


def named(values: dict[str, Any], overrides: dict[str, dict[str, Any]] | None = None
          ) -> list[str]:
    """The settings the warning names, in order."""
    return [cap.split(" = ", 1)[0]
            for cap in capping_settings(Settings(values), POLICY, overrides)]


@pytest.mark.parametrize(("values", "expected"), [
    # Scrapy's defaults (DOWNLOAD_DELAY 0, CONCURRENT_REQUESTS_PER_DOMAIN 8).
    ({}, []),
    ({"DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 8}, []),
    # scrapy startproject's template.
    ({"DOWNLOAD_DELAY": 1, "CONCURRENT_REQUESTS_PER_DOMAIN": 1},
     ["DOWNLOAD_DELAY", "CONCURRENT_REQUESTS_PER_DOMAIN"]),
    ({"DOWNLOAD_DELAY": 0.5}, ["DOWNLOAD_DELAY"]),
    # Caps nothing: 1/0.02 = 50/s is the window's own bound, 16 its own ceiling.
    ({"DOWNLOAD_DELAY": 0.02, "CONCURRENT_REQUESTS_PER_DOMAIN": 16}, []),
    ({"CONCURRENT_REQUESTS_PER_DOMAIN": 4}, ["CONCURRENT_REQUESTS_PER_DOMAIN"]),
    # Scrapy's Downloader: a per-IP concurrency replaces the per-domain one.
    ({"CONCURRENT_REQUESTS_PER_IP": 2, "CONCURRENT_REQUESTS_PER_DOMAIN": 1},
     ["CONCURRENT_REQUESTS_PER_IP"]),
    # Written per site, on purpose.
    ({"DOWNLOAD_SLOTS": {"example.com": {"delay": 2, "concurrency": 1}}}, []),
])
def test_the_warning_names_the_settings_that_cap_the_windows(values, expected):
    assert named(values) == expected


def test_a_domain_allowed_above_the_global_bounds_is_capped_too():
    overrides = {"fast.example": {"max_rate": 200, "max_concurrency": 32}}
    assert named({"DOWNLOAD_DELAY": 0.01, "CONCURRENT_REQUESTS_PER_DOMAIN": 16},
                 overrides) == ["DOWNLOAD_DELAY", "CONCURRENT_REQUESTS_PER_DOMAIN"]


def test_the_warning_says_what_the_templates_values_mean():
    delay, concurrency = capping_settings(
        Settings({"DOWNLOAD_DELAY": 1, "CONCURRENT_REQUESTS_PER_DOMAIN": 1}), POLICY)
    assert delay.startswith("DOWNLOAD_DELAY = 1: every domain at most 1 request/s")
    assert "set it to 0" in delay
    assert concurrency.startswith(
        "CONCURRENT_REQUESTS_PER_DOMAIN = 1: every domain at most 1 request at a time")


def window(rate: float, *, floor: float = 0.0, max_concurrency: int = 16,
           latency: float | None = None) -> DomainWindow:
    w = DomainWindow(WindowPolicy(max_rate=100, max_concurrency=max_concurrency), rate=rate)
    w.delay_floor = floor
    if latency is not None:
        w.latencies.append(latency)
    return w


@pytest.mark.parametrize(("w", "rate", "limit"), [
    (window(50), 50, None),
    # The delay floor: 1/floor, whatever the window.
    (window(50, floor=1), 1, "delay floor 1 s"),
    (window(0.5, floor=1), 0.5, None),
    # The concurrency ceiling, once a latency is known: concurrency/latency.
    (window(50, max_concurrency=1, latency=0.25), 4, "concurrency 1 at 250 ms"),
    (window(50, max_concurrency=1), 50, None),
    # Below the ceiling the window takes the concurrency its rate needs.
    (window(50, latency=0.25), 50, None),
    # Both: the tighter one.
    (window(50, floor=0.2, max_concurrency=1, latency=0.5), 2, "concurrency 1 at 500 ms"),
    (window(50, floor=1, max_concurrency=1, latency=0.5), 1, "delay floor 1 s"),
])
def test_the_effective_rate_is_what_the_floor_and_ceiling_let_through(w, rate, limit):
    assert effective_rate(w) == (pytest.approx(rate), limit)
