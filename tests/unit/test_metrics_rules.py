"""Live metrics, the parts without a crawl: the port setting, the slot
labels' bound, and the documented list of metrics."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from scrapy.settings import Settings

from incremental_crawler.config import SettingError
from incremental_crawler.metrics.collector import (
    METRICS,
    SLOT_OTHER,
    STATUS_OTHER,
    SlotLabels,
    status_label,
)
from incremental_crawler.metrics.endpoint import MetricsSettings, port_range
from incremental_crawler.politeness.window import DomainWindow, WindowPolicy

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("", None), ("none", None),
    (9410, (9410, 9410)), ("9410", (9410, 9410)), (0, (0, 0)),
    ([9410, 9419], (9410, 9419)), ((9410, 9419), (9410, 9419)),
    ("9410,9419", (9410, 9419)), ("9410-9419", (9410, 9419)), (" 9410 - 9419 ", (9410, 9419)),
    (["9410"], (9410, 9410)),
])
def test_the_port_setting_takes_a_port_or_a_range(value, expected) -> None:
    assert port_range(value) == expected


@pytest.mark.parametrize("value", [
    True, "abc", "9419-9410", [1, 2, 3], 70_000, -1, "0-10", {"port": 1}, 9.5e9,
    9410.7, [9410.7, 9419], [True, 9410], "9410.7",
])
def test_a_port_setting_that_is_no_port_or_range_is_an_error_naming_it(value) -> None:
    with pytest.raises(SettingError, match="INCREMENTAL_METRICS_PORT"):
        port_range(value)


def test_metrics_are_off_by_default_and_the_other_settings_are_checked() -> None:
    assert MetricsSettings.from_settings(Settings()) is None
    config = MetricsSettings.from_settings(Settings({"INCREMENTAL_METRICS_PORT": "9410"}))
    assert config is not None
    assert (config.host, config.slots, config.targets_dir) == ("127.0.0.1", 20, None)
    for bad in ("x", -1):
        with pytest.raises(SettingError, match="INCREMENTAL_METRICS_SLOTS"):
            MetricsSettings.from_settings(Settings({"INCREMENTAL_METRICS_PORT": 9410,
                                                    "INCREMENTAL_METRICS_SLOTS": bad}))


def windows(sent: dict[str, int]) -> list[tuple[str, DomainWindow]]:
    found = []
    for key, count in sorted(sent.items()):
        window = DomainWindow(WindowPolicy())
        window.sent = count
        found.append((key, window))
    return found


def test_slot_labels_go_to_the_busiest_and_are_kept_for_the_crawl() -> None:
    labels = SlotLabels(2)
    own, rest = labels.split(windows({"a": 1, "b": 5, "c": 3}))
    assert [key for key, _ in own] == ["b", "c"]
    assert [w.sent for w in rest] == [1]
    # "a" becomes the busiest: the labels stay (a counter must not move).
    own, rest = labels.split(windows({"a": 50, "b": 5, "c": 3, "d": 9}))
    assert [key for key, _ in own] == ["b", "c"]
    assert sorted(w.sent for w in rest) == [9, 50]


def test_room_left_is_filled_at_a_later_scrape_and_a_slot_named_other_never_gets_it() -> None:
    labels = SlotLabels(2)
    own, _ = labels.split(windows({"a": 1}))
    assert [key for key, _ in own] == ["a"]
    own, rest = labels.split(windows({"a": 1, SLOT_OTHER: 7, "z": 2}))
    assert [key for key, _ in own] == ["a", "z"]
    assert [w.sent for w in rest] == [7]
    none = SlotLabels(0)
    own, rest = none.split(windows({"a": 1, "b": 2}))
    assert own == []
    assert len(rest) == 2


@pytest.mark.parametrize(("status", "label"), [
    ("100", "100"), ("200", "200"), ("304", "304"), ("599", "599"),
    ("99", STATUS_OTHER), ("600", STATUS_OTHER), ("999", STATUS_OTHER),
    ("1000", STATUS_OTHER), ("-200", STATUS_OTHER), ("0", STATUS_OTHER),
])
def test_a_status_label_is_an_http_status_or_other(status, label) -> None:
    assert status_label(status) == label


def test_the_documented_metrics_are_the_exported_ones() -> None:
    rows = re.findall(r"^\| `(incremental_\w+)` \| (\w+) \| ([^|]*) \|", DOCS.read_text(),
                      re.MULTILINE)
    documented = [(name, kind, labels.strip()) for name, kind, labels in rows]
    assert documented == [(name, kind, labels or "-") for name, kind, labels, _ in METRICS]
