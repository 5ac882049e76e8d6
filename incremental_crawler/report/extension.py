"""What a crawl saved: a periodic log line and an end-of-crawl report."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.extensions.logstats import LogStats

from incremental_crawler.change.accounting import PageOutcome, Why
from incremental_crawler.change.policy import Verdict
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.formats import shares
from incremental_crawler.politeness.extension import AdaptiveThrottle

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from incremental_crawler.change.trust import HostTrustBook

__all__ = [
    "OUTCOMES", "IncrementalLogStats", "IncrementalReport", "accounting_line", "crawl_lines",
    "report_lines", "summarize", "trust_lines",
]

logger = logging.getLogger(__name__)

#: The reasons a known page is requested, in the report's order.
REQUESTED = (Why.NEW, Why.LASTMOD_NEWER, Why.DUE, Why.SAMPLED, Why.MAX_AGE, Why.RETRY,
             Why.RECHECK)

#: What became of the pages requested, in the report's order; the first
#: five are always shown, the others when not 0.
OUTCOMES = (PageOutcome.NOT_MODIFIED, PageOutcome.NEW, PageOutcome.CHANGED,
            PageOutcome.PAGE_CHANGED, PageOutcome.UNCHANGED, PageOutcome.FAILED,
            PageOutcome.GONE, PageOutcome.WITHHELD, PageOutcome.REDIRECTED)
#: Each outcome's words in the report's first line.
OUTCOME_WORDS = {
    PageOutcome.NOT_MODIFIED: "not modified (304)",
    PageOutcome.NEW: "new",
    PageOutcome.CHANGED: "changed",
    PageOutcome.PAGE_CHANGED: "page changed, items unchanged",
    PageOutcome.UNCHANGED: "unchanged in full",
    PageOutcome.FAILED: "failed",
    PageOutcome.GONE: "gone or not found (404, 410, other 4xx)",
    PageOutcome.WITHHELD: "withheld (callback or pipeline failed)",
    PageOutcome.REDIRECTED: "redirected (not followed)",
}

#: How to check every known page now, whatever the schedule says.
RECHECK_ADVICE = ("to check every known page now: -s INCREMENTAL_RECHECK_ALL=True "
                  "(or -a recheck=all on the sitemap and feed spiders)")


def summarize(stats: dict[str, Any]) -> dict[str, int]:
    """The headline figures of a crawl, from its ``incremental/`` stats."""

    def get(name: str) -> int:
        return int(stats.get(f"incremental/{name}", 0) or 0)

    requests = sum(
        int(v) for k, v in stats.items() if k.startswith("incremental/requests/")
    )
    # Per reason, as "unrecordable/<reason>" and "dropped/<reason>" (present
    # when non-zero), and their totals.
    reasons = {
        k.removeprefix("incremental/replay/"): int(v or 0) for k, v in stats.items()
        if k.startswith(("incremental/replay/unrecordable/", "incremental/replay/dropped/"))
    }
    return {
        **_schedule(stats),
        "checked": requests,
        "conditional": get("requests/conditional"),
        "not_modified": get("not_modified"),
        "new": get("pages_new"),
        "changed": get("pages_changed"),
        "unchanged_200": get("pages_unchanged"),
        "items_new": get("items_new"),
        "items_changed": get("items_changed"),
        "items_unchanged": get("items_unchanged"),
        # Tombstones delivered: pages gone (410, 404 twice, moved).
        "items_deleted": get("items_deleted"),
        "bytes_saved_estimate": get("bytes_saved_estimate"),
        "bytes_downloaded": int(stats.get("downloader/response_bytes", 0) or 0),
        "state_withheld": get("state_withheld"),
        "lastmod_skipped": get("lastmod/skipped"),
        "sitemaps_unchanged": get("sitemap/child_unchanged") + get("discovery/not_modified"),
        # Replay on 304: pages (304 or not due) whose stored requests were
        # yielded again, and those requests; pages fetched in full because
        # their requests were not all stored.
        "replayed_pages": get("replay/pages"),
        "replayed_requests": get("replay/requests"),
        "replay_seen_left_out": get("replay/seen_left_out"),
        "links_unknown": get("requests/links_unknown"),
        "unrecordable": sum(v for k, v in reasons.items() if k.startswith("unrecordable/")),
        "dropped": sum(v for k, v in reasons.items() if k.startswith("dropped/")),
        **reasons,
    }


def _schedule(stats: dict[str, Any]) -> dict[str, int]:
    """The crawl's accounting of its known pages (``incremental/schedule/``)."""

    def get(name: str) -> int:
        return int(stats.get(f"incremental/schedule/{name}", 0) or 0)

    # The stats only go up: a page that leaves a column (counted not
    # requested, then requested; an answer replaced by a later one; a
    # failure answered after all) is counted leaving it, and taken off here.
    requested = {f"requested_{why}": get(f"requested/{why}") for why in REQUESTED}
    # Cluster mode: pages requested by workers killed, counted for them by
    # the worker that ended the run (why is not known).
    requested["requested_of_killed"] = get("requested_of_killed")
    pages_requested = sum(requested.values())
    outcomes = {f"pages_{outcome}": get(f"outcome/{outcome}") - get(f"outcome_replaced/{outcome}")
                for outcome in OUTCOMES}
    not_requested = {
        "skipped_lastmod": get(f"skipped/{Why.LASTMOD_UNCHANGED}")
        - get(f"skipped_left/{Why.LASTMOD_UNCHANGED}"),
        "not_due": get("not_due") - get("not_due_left"),
        "deferred": get("deferred") - get("deferred_left"),
    }
    return {
        "requested": pages_requested,
        **requested,
        **not_requested,
        # Cluster mode: the re-seeder was killed before it counted its sum
        # of the pages not due, or of the due pages it deferred: the pages
        # of that sum nobody reached are in no column (see cluster.md).
        "sums_lost": int(stats.get("cluster/reseeder_sum_lost", 0) or 0)
        + int(stats.get("cluster/reseeder_deferred_lost", 0) or 0),
        # Cluster mode: counts of workers the run took for dead that no
        # worker counted again (see cluster.md).
        "counts_incomplete": int(stats.get("cluster/run_counts_incomplete", 0) or 0),
        # Cluster mode: the pages this worker counted and handed to the run
        # (fenced: taken for dead), which the run counts again.
        "counts_handed_to_run": _handed_to_run(stats),
        # POSIX time, 0 when no page was not due.
        "first_due": get("first_due"),
        "failed": get("failed") - get("failed_recovered"),
        "bytes_skipped": get("bytes_skipped") - get("bytes_skipped_left"),
        # The columns every known page is in exactly one of: the three
        # kinds not requested, and what became of each page requested.
        "pages_known": pages_requested + sum(not_requested.values()),
        "pages_checked": pages_requested,
        **outcomes,
        # Requested, with no answer recorded (dropped before one: robots.txt,
        # offsite, the crawl stopping).
        "pages_no_outcome": pages_requested - sum(outcomes.values()),
    }


def _handed_to_run(stats: dict[str, Any]) -> int:
    """The known pages of the counts a cluster worker handed to its run
    (``cluster/handed_to_run/*``: its ``incremental/schedule/*`` stats)."""
    prefix = "cluster/handed_to_run/"
    handed = {f"incremental/schedule/{k.removeprefix(prefix)}": v
              for k, v in stats.items() if k.startswith(prefix)}
    return _schedule(handed)["pages_known"] if handed else 0


def _utc(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))


def _first_due(s: dict[str, int]) -> str:
    return f" (the first falls due {_utc(s['first_due'])})" if s["first_due"] else ""


def accounting_line(s: dict[str, int]) -> str:
    """Where every known page went this crawl; empty when no page was counted.

    >>> line = accounting_line(summarize({"incremental/schedule/requested/new": 1,
    ...     "incremental/schedule/requested/due": 2, "incremental/schedule/not_due": 5,
    ...     "incremental/schedule/first_due": 86400}))
    >>> line.removesuffix(" (the first falls due 1970-01-02 00:00 UTC); 8 in all")
    'known pages: requested 3 (new 1, due 2), not due 5'
    """
    parts = [f"requested {s['requested']}"]
    reasons = ", ".join(f"{why.replace('_', ' ')} {s[f'requested_{why}']}"
                        for why in REQUESTED if s[f"requested_{why}"])
    if s["requested_of_killed"]:
        killed = f"{s['requested_of_killed']} of cluster workers killed (why not known)"
        reasons = f"{reasons}, {killed}" if reasons else killed
    if s["failed"]:
        # Requested too: a share of the requests, not a column of its own.
        reasons += f"; {s['failed']} of them failed" if reasons else f"{s['failed']} failed"
    if reasons:
        parts[0] += f" ({reasons})"
    if s["skipped_lastmod"]:
        parts.append(f"skipped {s['skipped_lastmod']} (lastmod unchanged)")
    if s["not_due"]:
        parts.append(f"not due {s['not_due']}{_first_due(s)}")
    if s["deferred"]:
        parts.append(f"deferred {s['deferred']} (due, over INCREMENTAL_RESEED_LIMIT: "
                     "the most overdue go first next crawl)")
    handed = s.get("counts_handed_to_run", 0)
    if len(parts) == 1 and not s["requested"] and not s["counts_incomplete"] and not handed:
        return ""
    line = "known pages: " + ", ".join(parts) + f"; {s['pages_known']} in all"
    if handed:
        line += (f"; {handed} more handed to the run (this cluster worker was taken for "
                 "dead: the run counts them again)")
    if s["sums_lost"]:
        line += (" (incomplete: a cluster worker that re-seeded was killed before it counted "
                 "the pages not due or deferred, which no worker reached are in no column)")
    if s["counts_incomplete"]:
        line += (" (incomplete: what a cluster worker taken for dead counted may be in no "
                 "column: it ended the run, or its leaving failed)")
    return line


def _short_accounting(s: dict[str, int]) -> str:
    """The accounting line's totals, for the periodic line."""
    counts = (("requested", s["requested"]), ("skipped", s["skipped_lastmod"]),
              ("not due", s["not_due"]), ("deferred", s["deferred"]))
    if not any(n for _, n in counts):
        return ""
    return "known: " + ", ".join(f"{name} {n}" for name, n in counts if n or name == "requested")


def _nothing_requested(s: dict[str, int]) -> str:
    """Why a crawl requested no page, and how to check them all; empty if it did."""
    if s["requested"] or s["checked"]:
        return ""
    reasons = []
    if s["skipped_lastmod"]:
        reasons.append(f"{s['skipped_lastmod']} skipped (lastmod unchanged)")
    if s["not_due"]:
        reasons.append(f"{s['not_due']} not due{_first_due(s)}")
    if s["sitemaps_unchanged"]:
        reasons.append(_unchanged_lists(s["sitemaps_unchanged"]))
    why = ", ".join(reasons) or "no page was listed, linked or due"
    return f"requested nothing: {why}; {RECHECK_ADVICE}"


def _bytes_line(s: dict[str, int], *, worker: bool = False) -> str:
    """Bytes downloaded, and saved: by 304s, by pages not requested at all.

    A cluster *worker* gives no share: its pages are a part of the run's,
    and the pages not requested are counted by one worker for the whole
    run (``scrapy state`` sums the run's workers).
    """
    downloaded, saved, skipped = s["bytes_downloaded"], s["bytes_saved_estimate"], s[
        "bytes_skipped"]
    not_requested = f" and ~{skipped:,} by pages not requested" if skipped else ""
    line = f"bytes downloaded {downloaded:,}, saved ~{saved:,} by 304s{not_requested}"
    if worker:
        return line + " (this worker's part of the run: scrapy state gives the run's shares)"
    share = shares(downloaded, saved + skipped)
    return f"{line}: {share}" if share else line


def report_lines(s: dict[str, int], *, worker: bool = False) -> list[str]:
    """The report's lines on pages and bytes, from :func:`summarize`
    (*worker*: one cluster worker's, see :func:`_bytes_line`)."""
    lines = [_line(s, worker=worker)]
    if accounting := accounting_line(s):
        # Each page is counted by one worker of the run: a worker's columns
        # are its share (one may be below zero: pages that left a column
        # another worker counted them in).
        lines.append(accounting + (" (this worker's share: scrapy state sums the run's workers)"
                                   if worker else ""))
    if nothing := _nothing_requested(s):
        lines.append(nothing)
    lines.append(_bytes_line(s, worker=worker))
    if replay := _replay_line(s):
        lines.append(replay)
    return lines


def _line(s: dict[str, int], *, worker: bool = False, running: bool = False) -> str:
    skipped = (
        f"{s['lastmod_skipped']} skipped (sitemap lastmod unchanged), "
        if s["lastmod_skipped"] else ""
    )
    if s["sitemaps_unchanged"]:
        skipped = f"{_unchanged_lists(s['sitemaps_unchanged'])}, " + skipped
    deleted = (f", {s['items_deleted']} deleted (pages gone)"
               if s.get("items_deleted") else "")
    # Pages once each (their retries and re-fetches are requests, said
    # apart when there were any), and one column each for what became of them.
    checked = f"{s['pages_checked']} pages checked"
    if s["checked"] != s["pages_checked"]:
        checked += f" ({s['checked']} requests)"
    columns = [f"{s[f'pages_{outcome}']} {OUTCOME_WORDS[outcome]}"
               for i, outcome in enumerate(OUTCOMES) if i < 5 or s[f"pages_{outcome}"]]
    if worker:
        # A worker's answers are its share of the run's pages: a page it
        # counted requested is often answered on another worker (the shared
        # queue), so requested less answered says nothing of this worker.
        columns[-1] += " (this worker's share: scrapy state sums the run's workers)"
    elif s["pages_no_outcome"] and running:
        # While the crawl runs, a page requested and not answered yet is
        # mostly one queued or in flight, not one dropped.
        columns.append(f"{s['pages_no_outcome']} not answered yet (queued, in flight or dropped)")
    elif s["pages_no_outcome"]:
        columns.append(f"{s['pages_no_outcome']} without an answer (dropped before one)")
    return (
        f"{skipped}{checked}, {', '.join(columns)}; items: {s['items_new']} new, "
        f"{s['items_changed']} changed, {s['items_unchanged']} unchanged dropped{deleted}"
    )


def _unchanged_lists(n: int) -> str:
    return f"{n} unchanged sitemap{'' if n == 1 else 's'} not read"


def _replay_line(s: dict[str, int]) -> str:
    """What replay on 304 did; empty when it did nothing (a spider that
    yields no requests, or one that does not replay: sitemaps, feeds)."""
    if not (s["replayed_pages"] or s["links_unknown"] or s["unrecordable"] or s["dropped"]):
        return ""
    line = (f"replay: {s['replayed_pages']} pages' links replayed "
            f"({s['replayed_requests']} requests{_left_out(s)}), {s['links_unknown']} pages "
            "fetched in full (links unknown or incomplete)")
    if s["unrecordable"]:
        line += (f", requests not recordable on {s['unrecordable']} pages "
                 f"({_reasons(s, 'unrecordable/')})")
    if s["dropped"]:
        line += f", {s['dropped']} replayed requests dropped ({_reasons(s, 'dropped/')})"
    return line


def _left_out(s: dict[str, int]) -> str:
    n = s.get("replay_seen_left_out", 0)
    return f"; {n} already seen this crawl left out" if n else ""


def _reasons(s: dict[str, int], prefix: str) -> str:
    return ", ".join(f"{k.removeprefix(prefix)} {v}" for k, v in sorted(s.items())
                     if k.startswith(prefix) and v)


def trust_lines(book: HostTrustBook) -> list[str]:
    """One line per host whose validators were judged this crawl."""
    book.settle_unstable()  # the crawl's last word on unstable hosts
    return [_trust_line(book, host) for host in sorted(book.verdicts.keys() | book.judged.keys())]


def _trust_line(book: HostTrustBook, host: str) -> str:
    counts = book.verdicts.get(host, {})
    parts = " / ".join(f"{verdict} {counts.get(verdict, 0)}" for verdict in Verdict)
    line = f"  {host}: validators {parts}"
    trust = book.known(host)
    if trust is not None and trust.validators_distrusted_until:
        line += (f"; host lying: 304s not trusted ({trust.validators_consistent} of "
                 f"{book.rules.retrust_after} changes with moved validators to re-trust)")
    if trust is not None and trust.validators_unstable_since:
        judged, unstable = book.judged.get(host, (0, 0))
        line += f"; host unstable ({unstable} of {judged} pages flagged)"
    return line


def progress_line(s: dict[str, int]) -> str:
    """The periodic line's figures, from :func:`summarize` (the crawl still
    running: a page requested and not answered yet is not said dropped)."""
    line = _line(s, running=True)
    if accounting := _short_accounting(s):
        line += f"; {accounting}"
    if replay := _replay_line(s):
        line += f"; {replay}"
    return line


class IncrementalLogStats(LogStats):
    """Scrapy's periodic "Crawled N pages" line, with the incremental figures
    and each slot's effective rate (its window under the user's delay and
    concurrency bounds)."""

    crawler: Crawler | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        ext = super().from_crawler(crawler)
        ext.crawler = crawler
        return ext

    def log(self, spider: Spider) -> None:
        super().log(spider)
        line = progress_line(summarize(self.stats.get_stats()))
        throttle = self.crawler.get_extension(AdaptiveThrottle) if self.crawler else None
        if throttle is not None and throttle.site_windows():
            line += f"; windows: {throttle.summary()}"
        logger.info("Incremental: %(line)s", {"line": line}, extra={"spider": spider})


class IncrementalReport:
    """A short human report of the ``incremental/`` stats when a crawl ends."""

    def __init__(self, stats: StatsCollector, crawler: Crawler | None = None) -> None:
        self.stats = stats
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = IncrementalConfig.from_settings(crawler.settings)
        if not (config.enabled and config.report):
            raise NotConfigured("INCREMENTAL_REPORT is False")
        ext = cls(crawler.stats, crawler)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_closed(self, spider: Spider, reason: str) -> None:
        lines = [f"Incremental report ({reason}):"]
        lines.extend(f"  {line}" for line in crawl_lines(self.stats.get_stats(), self.crawler))
        logger.info("\n".join(lines), extra={"spider": spider})


def crawl_lines(stats: dict[str, Any], crawler: Crawler | None) -> list[str]:
    """Every line of the end-of-crawl report (the HTML report shows them too)."""
    s = summarize(stats)
    worker = (crawler is not None
              and IncrementalConfig.from_settings(crawler.settings).cluster is not None)
    lines = report_lines(s, worker=worker)
    throttle = crawler.get_extension(AdaptiveThrottle) if crawler else None
    if throttle is not None and throttle.site_windows():
        # What each slot's requests could reach, as in the periodic line.
        lines.append(f"politeness: {throttle.summary()}")
    if throttle is not None and (started := throttle.memory.started_line()):
        lines.append(f"politeness: {started}")
    ledger = crawler.get_extension(Ledger) if crawler else None
    if ledger is not None:
        lines.extend(line.strip() for line in trust_lines(ledger.trust))
    if s["state_withheld"]:
        lines.append(
            f"{s['state_withheld']} pages keep their old validators "
            "(callback or pipeline failed): they will be fetched again"
        )
    return lines
