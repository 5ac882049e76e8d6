"""The package's metadata (pyproject.toml) and its optional features.

Plotly (the HTML report) and prometheus_client (live metrics) are extras,
``incremental-crawler[report]`` and ``[metrics]``: a crawl that switches one
of them on without it says which extra to install. requirements.txt, which
the tests run with, pins every dependency and every extra.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
import tomllib
from pathlib import Path

import pytest
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from incremental_crawler.metrics.endpoint import MetricsEndpoint
from incremental_crawler.report import page
from incremental_crawler.report.files import ReportFiles, write_report

PROJECT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((PROJECT / "pyproject.toml").read_text())
COMMANDS = ("demo", "items", "state", "report", "crawl", "shell", "fetch", "view", "parse",
            "check")


def _name(requirement: str) -> str:
    """A requirement's project name, normalized (PEP 503)."""
    found = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert found, requirement
    return re.sub(r"[-_.]+", "-", found.group()).lower()


def test_plotly_and_prometheus_client_are_extras_not_requirements():
    project = PYPROJECT["project"]
    required = {_name(r) for r in project["dependencies"]}
    assert {"plotly", "prometheus-client"}.isdisjoint(required)
    extras = {extra: {_name(r) for r in reqs}
              for extra, reqs in project["optional-dependencies"].items()}
    assert extras == {"report": {"plotly"}, "metrics": {"prometheus-client"}}


def test_requirements_txt_pins_every_dependency_and_every_extra():
    project = PYPROJECT["project"]
    pinned = {_name(line) for line in (PROJECT / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    wanted = {_name(r) for r in project["dependencies"]}
    wanted |= {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    assert wanted - pinned == set()


def test_entry_points_register_the_settings_and_every_command():
    entry_points = PYPROJECT["project"]["entry-points"]
    assert entry_points["scrapy"] == {"settings": "incremental_crawler.settings"}
    commands = entry_points["scrapy.commands"]
    assert commands == {name: f"incremental_crawler.commands.{name}:Command"
                        for name in COMMANDS}
    for target in commands.values():
        module, attr = target.split(":")
        assert hasattr(importlib.import_module(module), attr), target


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch):
    """Make a package not installed, as far as imports and find_spec go."""

    def hide(name: str) -> None:
        for loaded in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            monkeypatch.delitem(sys.modules, loaded)
        # None in sys.modules: `import` raises ImportError, find_spec gives None.
        monkeypatch.setitem(sys.modules, name, None)

    page.plotly_js.cache_clear()
    yield hide
    page.plotly_js.cache_clear()


def test_metrics_without_the_extra_stop_the_crawl_naming_it(without):
    without("prometheus_client")
    crawler = get_crawler(settings_dict={"INCREMENTAL_METRICS_PORT": "9410"})
    with pytest.raises(Exception, match=re.escape(
            "pip install 'incremental-crawler[metrics]'")) as raised:
        MetricsEndpoint.from_crawler(crawler)
    assert not isinstance(raised.value, NotConfigured)


def test_a_report_dir_without_the_extra_warns_at_start_and_writes_the_json(
        without, tmp_path, caplog):
    without("plotly")
    crawler = get_crawler(settings_dict={"INCREMENTAL_REPORT_DIR": str(tmp_path)})
    with caplog.at_level(logging.WARNING):
        ReportFiles.from_crawler(crawler)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "pip install 'incremental-crawler[report]'" in warning
    assert "report.json only" in warning

    report = {"kind": "crawl"}
    with pytest.raises(page.PlotlyMissing, match=re.escape("incremental-crawler[report]")):
        write_report(report, tmp_path, ("report", "report-20260101T000000000Z"), keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report-20260101T000000000Z.json", "report.json"]
