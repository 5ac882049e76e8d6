"""The end-of-crawl report's accounting of known pages, from a stats dict."""

from __future__ import annotations

from incremental_crawler.report.extension import progress_line, report_lines, summarize

#: 2024-03-01 12:30:00 UTC.
FIRST_DUE = 1709296200.0


def test_the_accounting_line_leaves_zeros_out_and_dates_the_first_due_page() -> None:
    s = summarize({
        "incremental/schedule/requested/new": 3,
        "incremental/schedule/requested/lastmod_newer": 20,
        "incremental/schedule/requested/due": 0,
        "incremental/schedule/requested/retry": 2,
        "incremental/schedule/skipped/lastmod_unchanged": 504,
        "incremental/schedule/not_due": 1,
        "incremental/schedule/first_due": FIRST_DUE,
        "incremental/schedule/failed": 0,
    })
    assert s["requested"] == 25 and isinstance(s["first_due"], int)
    assert report_lines(s)[1] == (
        "known pages: requested 25 (new 3, lastmod newer 20, retry 2), "
        "skipped 504 (lastmod unchanged), not due 1 (the first falls due 2024-03-01 12:30 UTC); "
        "530 in all")


def test_the_share_of_a_full_recrawl_counts_the_pages_not_requested() -> None:
    s = summarize({
        "downloader/response_bytes": 50_000,
        "incremental/bytes_saved_estimate": 150_000,
        "incremental/schedule/bytes_skipped": 800_000,
        "incremental/schedule/requested/due": 2,
        "incremental/schedule/skipped/lastmod_unchanged": 40,
        "incremental/schedule/failed": 1,
        "incremental/requests/conditional": 2,
    })
    lines = report_lines(s)
    assert lines[1] == ("known pages: requested 2 (due 2; 1 of them failed), "
                        "skipped 40 (lastmod unchanged); 42 in all")
    assert lines[2] == ("bytes downloaded 50,000, saved ~150,000 by 304s and ~800,000 by pages "
                        "not requested: downloaded 5.0% of a full re-crawl, saved 95.0%")


def test_a_crawl_that_requested_nothing_says_why_and_how_to_check_everything() -> None:
    s = summarize({
        "incremental/schedule/skipped/lastmod_unchanged": 26,
        "incremental/schedule/not_due": 504,
        "incremental/schedule/first_due": FIRST_DUE,
        "incremental/schedule/bytes_skipped": 1000,
    })
    assert report_lines(s)[1:3] == [
        ("known pages: requested 0, skipped 26 (lastmod unchanged), not due 504 "
        "(the first falls due 2024-03-01 12:30 UTC); 530 in all"),
        ("requested nothing: 26 skipped (lastmod unchanged), 504 not due (the first falls due "
        "2024-03-01 12:30 UTC); to check every known page now: -s INCREMENTAL_RECHECK_ALL=True "
        "(or -a recheck=all on the sitemap and feed spiders)"),
    ]


def test_a_crawl_without_any_count_has_no_accounting_line() -> None:
    s = summarize({"downloader/response_bytes": 10})
    lines = report_lines(s)
    assert not any(line.startswith("known pages") for line in lines)
    assert lines[-1] == ("bytes downloaded 10, saved ~0 by 304s: downloaded 100.0% of a full "
                         "re-crawl, saved 0.0%")


def test_pages_are_counted_once_and_their_requests_apart() -> None:
    # 30 pages, 15 of them answered 429 first and retried: 45 requests.
    s = summarize({
        "incremental/schedule/requested/new": 30,
        "incremental/requests/new": 45,
        "incremental/schedule/outcome/new": 30,
    })
    assert s["checked"] == 45 and s["pages_checked"] == 30 and s["pages_known"] == 30
    assert report_lines(s)[0].startswith(
        "30 pages checked (45 requests), 0 not modified (304), 30 new, 0 changed, "
        "0 page changed, items unchanged, 0 unchanged in full; items:")


def test_every_requested_page_has_one_column_and_failed_and_gone_pages_show() -> None:
    s = summarize({
        "incremental/schedule/requested/due": 530,
        "incremental/schedule/skipped/lastmod_unchanged": 10,
        "incremental/requests/conditional": 530,
        "incremental/schedule/outcome/not_modified": 524,
        "incremental/schedule/outcome/unchanged": 1,
        "incremental/schedule/outcome/failed": 1,
        "incremental/schedule/outcome/gone": 3,
    })
    assert s["pages_known"] == 540 and s["pages_no_outcome"] == 1
    assert report_lines(s)[0].startswith(
        "530 pages checked, 524 not modified (304), 0 new, 0 changed, 0 page changed, items "
        "unchanged, 1 unchanged in full, 1 failed, 3 gone or not found (404, 410, other 4xx), "
        "1 without an answer (dropped before one); items:")


def test_a_cluster_worker_gives_no_share_of_the_run() -> None:
    s = summarize({"downloader/response_bytes": 10, "incremental/schedule/bytes_skipped": 0})
    assert report_lines(s, worker=True)[-1] == (
        "bytes downloaded 10, saved ~0 by 304s (this worker's part of the run: scrapy state "
        "gives the run's shares)")


def test_a_cluster_workers_accounting_says_it_is_the_workers_share() -> None:
    s = summarize({"incremental/schedule/requested/new": 2,
                   "incremental/schedule/not_due": 1,
                   "incremental/schedule/not_due_left": 2})
    [line] = [line for line in report_lines(s, worker=True) if line.startswith("known pages:")]
    assert line == ("known pages: requested 2 (new 2), not due -1; 1 in all "
                    "(this worker's share: scrapy state sums the run's workers)")


def test_pages_not_answered_yet_are_not_said_dropped_while_the_crawl_runs() -> None:
    # Mid-crawl (the periodic line), 16 of 315 requested pages are queued or
    # in flight (a DOWNLOAD_DELAY of 1 s queues them); at the end, a page
    # requested and never answered was dropped before an answer.
    s = summarize({"incremental/schedule/requested/due": 315,
                   "incremental/requests/conditional": 315,
                   "incremental/schedule/outcome/not_modified": 299})
    line = progress_line(s)
    assert "16 not answered yet (queued, in flight or dropped)" in line, line
    assert "dropped before one" not in line
    assert "16 without an answer (dropped before one)" in report_lines(s)[0]
