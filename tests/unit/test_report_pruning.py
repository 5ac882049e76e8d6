"""The report's files in INCREMENTAL_REPORT_DIR: written whole, and pruning touches only them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from incremental_crawler.report.files import prune, report_names, write_whole

if TYPE_CHECKING:
    from pathlib import Path


def touch(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).write_text("x")


def pair(directory: Path, finished: float, worker: str = "") -> tuple[str, str]:
    latest, stamped = report_names(finished, worker)
    touch(directory, f"{latest}.html", f"{latest}.json", f"{stamped}.html", f"{stamped}.json")
    return latest, stamped


def test_pruning_keeps_the_newest_pairs_and_never_a_users_own_files(tmp_path: Path) -> None:
    # The user's files that look like reports, in the same directory.
    own = ("report-final.html", "report-notes.json", "report-summary.json", "report.css",
           "history-sitemap.html")
    touch(tmp_path, *own)
    _, oldest = pair(tmp_path, 1_700_000_000.0)
    _, middle = pair(tmp_path, 1_700_000_100.0)
    _, newest = pair(tmp_path, 1_700_000_200.0)

    removed = prune(tmp_path, keep=2)

    assert sorted(p.name for p in removed) == [f"{oldest}.html", f"{oldest}.json"]
    names = {p.name for p in tmp_path.iterdir()}
    assert set(own) <= names
    assert {f"{middle}.html", f"{newest}.json", "report.html", "report.json"} <= names


def test_a_cluster_workers_latest_report_goes_with_its_last_timestamped_one(
        tmp_path: Path) -> None:
    # Run 1's workers (ids hold a pid), then run 2's.
    gone, _ = pair(tmp_path, 1_700_000_000.0, "host:101")
    kept, _ = pair(tmp_path, 1_700_000_100.0, "host:202")
    # A worker of run 2 that has written its latest JSON, not yet its timestamped one.
    touch(tmp_path, "report-host-303.json")

    prune(tmp_path, keep=1)

    names = {p.name for p in tmp_path.iterdir()}
    assert f"{gone}.html" not in names and f"{gone}.json" not in names
    assert {f"{kept}.html", f"{kept}.json", "report-host-303.json"} <= names


def test_a_file_that_cannot_be_written_leaves_no_temporary_file(tmp_path: Path) -> None:
    write_whole(tmp_path / "report.json", [b"{", b"}"])
    assert (tmp_path / "report.json").read_bytes() == b"{}"
    # The rename fails (a directory holds the name): the error is raised, nothing is left.
    (tmp_path / "report.html").mkdir()
    with pytest.raises(OSError):
        write_whole(tmp_path / "report.html", [b"<html>"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.json"]
