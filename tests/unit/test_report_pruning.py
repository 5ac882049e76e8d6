"""Pruning the timestamped reports of INCREMENTAL_REPORT_DIR touches only the report's own files."""

from __future__ import annotations

from typing import TYPE_CHECKING

from incremental_crawler.report.files import prune, report_names

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
