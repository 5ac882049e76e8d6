"""The report's files in INCREMENTAL_REPORT_DIR: written whole, pruning touches
only them, one page for the kept crawls."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from incremental_crawler.report.document import crawl_report
from incremental_crawler.report.files import prune, report_names, write_report, write_whole

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


def crawl(finished: float) -> dict:
    return crawl_report(stats={}, lines=[], scope="s", spider="sp", worker="",
                        reason="finished", started=finished - 5, finished=finished, hosts=[],
                        politeness=None, slot_stats={}, history=[])


def test_one_page_holds_every_kept_crawl_and_leaves_out_what_it_cannot_draw(
        tmp_path: Path) -> None:
    older = [report_names(t, "") for t in (1_700_000_000.0, 1_700_000_100.0)]
    for (_, stamped), finished in zip(older, (1_700_000_000.0, 1_700_000_100.0), strict=True):
        write_report(crawl(finished), tmp_path, ("report", stamped), keep=5)
    # Another version's report, and a file that is not JSON, under kept names.
    (tmp_path / f"{report_names(1_700_000_150.0, '')[1]}.json").write_text('{"kind": "crawl"}')
    (tmp_path / f"{report_names(1_700_000_160.0, '')[1]}.json").write_text("{")
    latest = report_names(1_700_000_200.0, "")

    sizes = write_report(crawl(1_700_000_200.0), tmp_path, latest, keep=5)

    assert sorted(sizes) == sorted(["report.html", "report.json", f"{latest[1]}.json"])
    assert [p.name for p in tmp_path.glob("*.html")] == ["report.html"]
    page = (tmp_path / "report.html").read_text()
    # This crawl first, shown; the older ones newest first, hidden until asked for.
    sections = re.findall(r'<section class="crawl" id="([^"]+)" data-title="[^"]*"( hidden)?>',
                          page)
    assert sections == [
        (latest[1], ""), (older[1][1], " hidden"), (older[0][1], " hidden")]
    assert re.findall(r'<nav class="crawls">.*?</nav>', page)[0].count("<a href=") == 3
