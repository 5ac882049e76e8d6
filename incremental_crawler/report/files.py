"""``report.html`` and ``report.json`` of each crawl, in ``INCREMENTAL_REPORT_DIR``.

:class:`ReportFiles` records the per-slot politeness series while the crawl
runs (:mod:`~incremental_crawler.report.timeline`) and writes the report
when the engine stops (after every ``spider_closed`` handler, so that the
figures are the final ones):

- the latest crawl under fixed names: ``report.html`` and ``report.json``
  (cluster mode: ``report-<worker>.html`` and ``.json``, one pair per
  worker);
- each crawl's JSON also under a timestamped name, ``report-<UTC
  time>.json`` (cluster mode: ``report-<UTC time>-<worker>.json``), the
  newest ``INCREMENTAL_REPORT_KEEP`` kept;
- the page holds every kept crawl, each in a section of its own
  (``report.html#report-<UTC time>``): Plotly.js (4.8 MB) is written once
  per page, not once per kept crawl, so a directory's reports stay about
  one page's size however many crawls it keeps.

The scope's last crawls come from the store, read through the ledger's
record sources (called while the store is still open, just before its last
flush): the stored ones and this one.

A report that cannot be written (a directory that cannot be created, a
full disk, no Plotly.js) is logged and counted (``incremental/report/...``);
the crawl and its state are not affected.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from incremental_crawler import clock
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.politeness.extension import AdaptiveThrottle, effective_rate
from incremental_crawler.report.document import (
    crawl_report,
    history_entries,
    host_rows,
    trust_fields,
)
from incremental_crawler.report.extension import crawl_lines
from incremental_crawler.report.history import CrawlHistory
from incremental_crawler.report.page import PlotlyMissing, plotly_js_path, render_parts
from incremental_crawler.report.timeline import Timeline

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Spider
    from scrapy.crawler import Crawler

    from incremental_crawler.state.records import CrawlRecord

__all__ = ["SLOTS_SHOWN", "ReportFiles", "kept_reports", "prune", "report_names", "write_report",
           "write_whole"]

logger = logging.getLogger(__name__)

#: Slots drawn, at most (the busiest by requests; the others summed in one chart).
SLOTS_SHOWN = 10
#: A timestamped report's name: report-<time>[-<worker>].<html|json>.
_STAMPED = re.compile(r"^report-(\d{8}T\d{9}Z)(?:-(.+))?\.(html|json)$")


def _safe(worker: str) -> str:
    """A worker id ("host:pid") as a file name part."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", worker).strip("-.") or "worker"


def _stamp(timestamp: float) -> str:
    millis = round(timestamp * 1000) % 1000
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(timestamp)) + f"{millis:03d}Z"


def report_names(finished: float, worker: str) -> tuple[str, str]:
    """The latest report's base name, and this crawl's timestamped one (no extension)."""
    if worker:
        return f"report-{_safe(worker)}", f"report-{_stamp(finished)}-{_safe(worker)}"
    return "report", f"report-{_stamp(finished)}"


def write_whole(path: Path, parts: list[bytes]) -> int:
    """Write *parts* to *path* whole (a reader never sees half a file); its size."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            for part in parts:
                f.write(part)
        tmp.replace(path)
    except BaseException:
        # A full disk, a rename refused: no half-written temporary file left behind.
        tmp.unlink(missing_ok=True)
        raise
    return sum(len(part) for part in parts)


def prune(directory: Path, keep: int) -> list[Path]:
    """Delete all but the newest *keep* timestamped reports (pairs), and the
    latest-report files of the cluster workers whose last timestamped
    reports this removed.

    Only names this module writes are touched: a ``report-<name>.html`` of
    the user's own (no timestamped report of a worker ``<name>``) stays.
    """
    stamped: dict[tuple[str, str], list[Path]] = {}
    for path in directory.iterdir():
        found = _STAMPED.match(path.name)
        if found:
            stamped.setdefault((found.group(1), found.group(2) or ""), []).append(path)
    removed: list[Path] = []
    pruned_workers: set[str] = set()
    for crawl in sorted(stamped, reverse=True)[keep:]:
        pruned_workers.add(crawl[1])
        for path in stamped.pop(crawl):
            path.unlink(missing_ok=True)
            removed.append(path)
    # A worker's latest report goes with its last timestamped one (worker
    # ids hold a pid: each run's workers are new names). A worker still
    # writing its first report has none pruned: its files are not touched.
    left = {worker for _, worker in stamped}
    for worker in sorted(pruned_workers - left - {""}):
        for suffix in (".html", ".json"):
            path = directory / f"report-{worker}{suffix}"
            if path.exists():
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def kept_reports(directory: Path, skip: str) -> list[tuple[str, dict[str, Any]]]:
    """The timestamped crawl reports of *directory* as ``(name, report)``,
    newest first, *skip* left out; a file that cannot be read is passed over
    (a user's, another version's: the page is drawn without it)."""
    found = []
    for path in directory.iterdir():
        stamped = _STAMPED.match(path.name)
        if stamped is None or stamped.group(3) != "json" or path.stem == skip:
            continue
        try:
            report = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(report, dict):
            found.append(((stamped.group(1), stamped.group(2) or ""), path.stem, report))
    return [(name, report) for _, name, report in sorted(found, reverse=True,
                                                          key=lambda f: f[0])]


def write_report(report: dict[str, Any], directory: Path, names: tuple[str, str], *,
                 keep: int) -> dict[str, int]:
    """Write *report*'s JSON under both *names*, and the page under the latest
    one; the files' sizes by name.

    The page holds this crawl and every other kept in the directory (their
    timestamped JSON), one copy of Plotly.js for all: a timestamped page of
    its own per crawl would cost 4.8 MB each. This crawl's section is
    ``<latest>.html#<timestamped name>``.

    Raises :class:`~incremental_crawler.report.page.PlotlyMissing` after
    writing the JSON when the HTML cannot be drawn, ``OSError`` when a file
    cannot be written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    latest, stamped = names
    files = (latest, stamped) if keep else (latest,)
    data = [(json.dumps(report, indent=1, allow_nan=False) + "\n").encode("utf-8")]
    sizes = {}
    for name in files:
        sizes[f"{name}.json"] = write_whole(directory / f"{name}.json", data)
    if keep:
        prune(directory, keep)
    # The page links this crawl's own JSON: kept as long as the crawl is.
    kept = kept_reports(directory, skip=stamped) if keep else []
    page = render_parts(report, json_name=f"{files[-1]}.json", anchor=stamped, kept=kept)
    sizes[f"{latest}.html"] = write_whole(directory / f"{latest}.html", page)
    return sizes


class ReportFiles:
    """See the module docstring; settings ``INCREMENTAL_REPORT_DIR``, ``_KEEP``."""

    def __init__(self, crawler: Crawler, directory: Path, keep: int) -> None:
        self.crawler = crawler
        self.directory = directory
        self.keep = keep
        self.timeline: Timeline | None = None
        self.reason = "unknown"
        self.finished: float | None = None
        #: What the ledger gave before the store closed (see _capture).
        self.captured: dict[str, Any] | None = None
        #: The files written, by name, and their sizes (tests and the demo read it).
        self.written: dict[str, int] = {}
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(self.engine_stopped, signal=signals.engine_stopped)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = IncrementalConfig.from_settings(crawler.settings)
        if not config.enabled:
            raise NotConfigured("INCREMENTAL_ENABLED is False")
        if not config.report_dir:
            # Off by default: no message, so Scrapy logs no warning on every crawl.
            raise NotConfigured
        try:
            plotly_js_path()
        except PlotlyMissing as exc:
            # Said now, not only when the crawl ends hours later: the JSON
            # is still written, the page is not.
            logger.warning("INCREMENTAL_REPORT_DIR is set but %(exc)s; this crawl will write "
                           "report.json only", {"exc": exc})
        return cls(crawler, Path(config.report_dir).expanduser(), config.report_keep)

    @property
    def ledger(self) -> Ledger | None:
        return self.crawler.get_extension(Ledger)

    def spider_opened(self, spider: Spider) -> None:
        throttle = self.crawler.get_extension(AdaptiveThrottle)
        if throttle is not None:
            self.timeline = Timeline(throttle)
            self.timeline.start()
        ledger = self.ledger
        if ledger is not None:
            ledger.add_record_source(self._capture)

    def _capture(self, reason: str) -> list[CrawlRecord]:
        """Read the store while it is open: the scope's stored crawls and this one."""
        ledger = self.ledger
        assert ledger is not None
        history_ext = self.crawler.get_extension(CrawlHistory)
        own = [history_ext.record(ledger, reason)] if history_ext is not None else []
        try:
            stored = ledger.store.crawls(ledger.scope, ledger.store.crawl_history)
        except Exception as exc:  # a store failing now fails the crawl's close anyway
            logger.warning("The crawl report has no history: the store could not be read "
                           "(%(exc)s)", {"exc": exc})
            stored = []
        # As the store will keep them: this crawl's record and the newest
        # stored, INCREMENTAL_CRAWL_HISTORY in all.
        records = [*own, *stored][:ledger.store.crawl_history]
        self.captured = {"history": history_entries(records),
                         "hosts": self._hosts(ledger)}
        return []  # nothing to store: CrawlHistory stages the crawl's own record

    def _hosts(self, ledger: Ledger) -> list[dict[str, Any]]:
        book = ledger.trust
        now = clock.now()
        verdicts = {host: {str(v): n for v, n in counts.items()}
                    for host, counts in book.verdicts.items()}
        return host_rows(
            ledger.counter.hosts.table(), verdicts,
            lambda host: trust_fields(book.known(host), now,
                                      probation_after=book.rules.stale_after))

    def spider_closed(self, spider: Spider, reason: str) -> None:
        self.reason = reason
        self.finished = clock.now()
        if self.timeline is not None:
            self.timeline.stop()

    def _slot_stats(self) -> dict[str, dict[str, Any]]:
        throttle = self.crawler.get_extension(AdaptiveThrottle)
        if throttle is None:
            return {}
        found = {}
        for key, w in throttle.site_windows():
            rate, limit = effective_rate(w)
            found[key] = {
                "rate": round(rate, 3), "window": round(w.rate, 3), "limit": limit,
                "latency_p50_ms": round(1000 * w.percentile(0.5), 1),
                "latency_p95_ms": round(1000 * w.percentile(0.95), 1),
                "responses": w.responses, "status_429": w.status_429,
                "status_5xx": w.status_5xx, "timeouts": w.timeouts,
                "frozen_seconds": round(w.frozen_seconds, 3), "parked": w.parked,
            }
        return found

    def build(self) -> dict[str, Any]:
        """This crawl's report object."""
        assert self.crawler.stats is not None
        ledger = self.ledger
        captured = self.captured or {
            "history": [], "hosts": self._hosts(ledger) if ledger is not None else []}
        finished = self.finished or clock.now()
        spider = self.crawler.spider
        return crawl_report(
            stats=self.crawler.stats.get_stats(),
            lines=crawl_lines(self.crawler.stats.get_stats(), self.crawler),
            scope=ledger.scope if ledger is not None else "",
            spider=getattr(spider, "name", "") or "",
            worker=ledger.worker if ledger is not None else "",
            reason=self.reason,
            started=ledger.own_start if ledger is not None else finished,
            finished=finished,
            hosts=captured["hosts"],
            politeness=self.timeline.to_json(SLOTS_SHOWN) if self.timeline else None,
            slot_stats=self._slot_stats(),
            history=captured["history"],
        )

    def engine_stopped(self) -> None:
        stats = self.crawler.stats
        assert stats is not None
        started = time.process_time()
        report = self.build()
        names = report_names(report["crawl"]["finished"], report["crawl"]["worker"])
        try:
            self.written = write_report(report, self.directory, names, keep=self.keep)
        except PlotlyMissing as exc:
            stats.inc_value("incremental/report/html_skipped")
            logger.error("Crawl report: %(exc)s; only %(dir)s/%(name)s.json was written",
                         {"exc": exc, "dir": self.directory, "name": names[0]})
            return
        except OSError as exc:
            stats.inc_value("incremental/report/errors")
            logger.error("Crawl report: could not write to %(dir)s: %(exc)s",
                         {"dir": self.directory, "exc": exc})
            return
        cpu_ms = round(1000 * (time.process_time() - started))
        stats.set_value("incremental/report/html_bytes", self.written[f"{names[0]}.html"])
        stats.set_value("incremental/report/cpu_ms", cpu_ms)
        sampling = round(1000 * self.timeline.cpu) if self.timeline is not None else 0
        logger.info("Crawl report: %(path)s (%(size).1f MB, %(ms)d ms of CPU to write, "
                    "%(sampling)d ms to sample the slots; this crawl's section: #%(stamped)s)",
                    {"path": self.directory / f"{names[0]}.html", "ms": cpu_ms,
                     "sampling": sampling, "size": self.written[f"{names[0]}.html"] / 1e6,
                     "stamped": names[1]})
