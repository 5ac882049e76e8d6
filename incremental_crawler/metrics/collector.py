"""The crawl's metrics, read from its state when a scrape asks for them.

A ``prometheus_client`` custom collector: nothing is counted twice and
nothing runs between scrapes. Each scrape reads the crawl's stats (the
figures of the end-of-crawl report), the politeness windows
(:class:`~incremental_crawler.politeness.extension.AdaptiveThrottle`) and
the state store's counters, and turns them into metric families.

Label sets are bounded: every label but ``slot`` takes its values from a
fixed list (the request reasons, the scheduling decisions, the HTTP
statuses 100 to 599 and ``other``...) or is one value per process
(``worker``); ``slot`` takes at most
``INCREMENTAL_METRICS_SLOTS`` values plus ``"other"``, the sum of the rest
(see :class:`SlotLabels`).

docs/metrics.md lists every metric; :data:`METRICS` is that list, for the
docs and the tests.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from incremental_crawler import clock
from incremental_crawler.change.accounting import Why
from incremental_crawler.change.policy import RequestReason
from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.politeness.extension import AdaptiveThrottle, effective_rate

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from prometheus_client.metrics_core import Metric
    from scrapy.crawler import Crawler

    from incremental_crawler.politeness.window import DomainWindow

__all__ = ["METRICS", "SLOT_OTHER", "STATUS_OTHER", "CrawlCollector", "SlotLabels", "status_label"]

#: The ``slot`` label of the slots summed together.
SLOT_OTHER = "other"

#: Scheduling decisions on known pages (``decision`` label), as counted in
#: the ``incremental/schedule/...`` stats: the reasons a known page was
#: requested, then the reasons it was not.
REQUESTED = (Why.NEW, Why.LASTMOD_NEWER, Why.DUE, Why.SAMPLED, Why.MAX_AGE, Why.RETRY,
             Why.RECHECK)
_NOT_REQUESTED = {
    Why.LASTMOD_UNCHANGED.value: "incremental/schedule/skipped/lastmod_unchanged",
    Why.NOT_DUE.value: "incremental/schedule/not_due",
    "deferred": "incremental/schedule/deferred",
}
#: The pages of those decided not requested, then requested after all.
_LEFT = {
    Why.LASTMOD_UNCHANGED.value: "incremental/schedule/skipped_left/lastmod_unchanged",
    Why.NOT_DUE.value: "incremental/schedule/not_due_left",
    "deferred": "incremental/schedule/deferred_left",
}

#: Pages and lists (sitemaps, feeds) are counted apart (``kind`` label).
_KINDS = {"page": "incremental/", "list": "incremental/discovery/"}

#: ``errors_total{kind}`` → the stat counting them.
_ERRORS = {
    "download": "downloader/exception_count",
    "spider": "spider_exceptions/count",
    "store": "incremental/store_errors",
    "log": "log_count/ERROR",
}

#: ``slot_errors_total{kind}`` → the window's counter.
_SLOT_ERRORS = {"429": "status_429", "5xx": "status_5xx", "timeout": "timeouts"}

_STATUS_PREFIX = "downloader/response_status_count/"
#: The ``status`` label of the answers whose status is no HTTP status.
STATUS_OTHER = "other"


def status_label(status: str) -> str:
    """The ``status`` label of a response status as Scrapy counts it.

    HTTP statuses are three digits, 100 to 599 (RFC 9110); Twisted takes any
    integer a server sends, so a server could otherwise add a series per
    answer. The rest are summed under ``other``.
    """
    if len(status) == 3 and status.isdigit() and "100" <= status <= "599":
        return status
    return STATUS_OTHER

#: Every metric: (name as exposed, type, labels, meaning). ``worker`` is
#: added to every one in cluster mode.
METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("incremental_crawl_info", "info", "spider, scope[, scrapyd_job]",
     "The crawl: its spider, its state scope, its scrapyd job id when run by scrapyd"),
    ("incremental_crawl_start_time_seconds", "gauge", "",
     "When this crawl (this worker) started, Unix time"),
    ("incremental_requests_total", "counter", "kind, reason",
     "Requests of the incremental middleware, by why they carry conditions or not "
     "(reason: " + ", ".join(r.value for r in RequestReason) + "); kind: page or list "
     "(sitemaps and feeds)"),
    ("incremental_not_modified_total", "counter", "kind", "304 Not Modified answers taken"),
    ("incremental_known_pages_total", "counter", "decision",
     "Known pages by what the crawl decided: requested (decision: "
     + ", ".join(w.value for w in REQUESTED) + ") or not (lastmod_unchanged, not_due, "
     "deferred); a page decided not requested, then requested after all, is in both "
     "(see incremental_known_pages_left_total)"),
    ("incremental_known_pages_left_total", "counter", "decision",
     ("Pages decided not requested (decision: lastmod_unchanged, not_due), then requested "
      "after all: subtracted from incremental_known_pages_total, the pages still not "
      "requested")),
    ("incremental_pages_total", "counter", "outcome",
     "Pages fetched in full, by what their content did (outcome: new, changed, unchanged)"),
    ("incremental_items_total", "counter", "outcome",
     "Items by outcome: new, changed, unchanged (dropped), deleted (tombstones)"),
    ("incremental_responses_total", "counter", "status",
     ("Responses downloaded, by HTTP status (other: a number that is no HTTP status, "
      "outside 100-599)")),
    ("incremental_downloaded_bytes_total", "counter", "", "Response bytes downloaded"),
    ("incremental_saved_bytes_total", "counter", "by",
     ("Bytes not downloaded, estimated from the stored sizes (by: not_modified, "
     "not_requested: see incremental_saved_bytes_left_total)")),
    ("incremental_saved_bytes_left_total", "counter", "",
     ("Stored sizes of the pages decided not requested, then requested after all: "
      "subtracted from incremental_saved_bytes_total{by=\"not_requested\"}, the bytes "
      "the pages not requested saved")),
    ("incremental_errors_total", "counter", "kind",
     ("Errors: download (network errors, retried ones included), spider (callback "
     "exceptions), store (state store failures), log (ERROR lines)")),
    ("incremental_failed_pages_total", "counter", "",
     ("Pages whose answer (after retries) was a failure; those that answered after all "
      "are in incremental_failed_pages_recovered_total")),
    ("incremental_failed_pages_recovered_total", "counter", "",
     ("Pages counted in incremental_failed_pages_total that answered after all (asked "
      "again this crawl): the difference is the pages whose last answer was a failure")),
    ("incremental_state_withheld_total", "counter", "",
     "Pages whose state was not saved because their callback or an item pipeline failed"),
    ("incremental_downloads_in_flight", "gauge", "",
     ("Requests in the downloader now: the ones on the wire and the ones its slots hold "
      "back for their delay or concurrency (Scrapy's downloader.active)")),
    ("incremental_downloads_transferring", "gauge", "",
     "Requests on the wire now: handed to the download handler, their answer not in yet"),
    ("incremental_store_roundtrips_total", "counter", "",
     "Network round trips to the state store (0 for SQLite)"),
    ("incremental_store_writes_total", "counter", "", "Writes committed to the state store"),
    ("incremental_store_pending_writes", "gauge", "", "Writes staged, not yet committed"),
    ("incremental_slots", "gauge", "", "Download slots with a politeness window"),
    ("incremental_slot_window_requests_per_second", "gauge", "slot",
     ("Effective rate: the window under the delay floor and the concurrency ceiling "
     "(other: the sum)")),
    ("incremental_slot_window_uncapped_requests_per_second", "gauge", "slot",
     "The AIMD window's own rate (other: the sum)"),
    ("incremental_slot_concurrency", "gauge", "slot",
     "Requests the slot may have in flight (other: the sum)"),
    ("incremental_slot_latency_p50_seconds", "gauge", "slot",
     ("Median latency of the slot's last 200 answers that were not errors (none for "
      "other, nor for a slot without such an answer yet)")),
    ("incremental_slot_latency_p95_seconds", "gauge", "slot",
     ("95th percentile latency of the slot's last 200 answers that were not errors "
      "(none for other, nor for a slot without such an answer yet)")),
    ("incremental_slot_requests_total", "counter", "slot", "Requests sent to the slot"),
    ("incremental_slot_responses_total", "counter", "slot",
     "Answers from the slot (responses and download errors)"),
    ("incremental_slot_errors_total", "counter", "slot, kind",
     "Answers that slowed the window down (kind: 429, 5xx, timeout)"),
    ("incremental_slot_frozen_seconds_total", "counter", "slot",
     ("Seconds of freezes of the slot (Retry-After, backoff, park), each counted whole "
     "when it starts")),
    ("incremental_slot_frozen", "gauge", "slot",
     "1 while the slot is frozen (other: how many are)"),
    ("incremental_slot_parked", "gauge", "slot",
     "1 once the slot is parked for the rest of the crawl (other: how many are)"),
)
_HELP = {name: meaning for name, _kind, _labels, meaning in METRICS}


class SlotLabels:
    """Which download slots get a ``slot`` label of their own.

    At most *limit*, and once given, for the whole crawl: a slot that lost
    its label would move its counts into ``other``, which Prometheus would
    read as a counter reset of both series. When more slots than there is
    room for appear between two scrapes, the busiest (most requests) get
    the room. A slot named ``other`` is always counted in ``other``.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.own: set[str] = set()

    def split(self, windows: Sequence[tuple[str, DomainWindow]]
              ) -> tuple[list[tuple[str, DomainWindow]], list[DomainWindow]]:
        """The slots with a label of their own, and the others' windows."""
        room = self.limit - len(self.own)
        if room > 0:
            new = [(key, w) for key, w in windows if key not in self.own and key != SLOT_OTHER]
            new.sort(key=lambda item: item[1].sent, reverse=True)
            self.own.update(key for key, _ in new[:room])
        own = [(key, w) for key, w in windows if key in self.own]
        rest = [w for key, w in windows if key not in self.own]
        return own, rest


class CrawlCollector:
    """Reads the crawler's state into metric families at each scrape.

    *constant* labels go on every sample (the worker id in cluster mode);
    *info* labels on ``incremental_crawl_info`` only.
    """

    def __init__(self, crawler: Crawler, *, slots: int, constant: dict[str, str],
                 info: dict[str, str]) -> None:
        self.crawler = crawler
        self.slot_labels = SlotLabels(slots)
        self.constant = constant
        self.info = info

    # prometheus_client calls describe() (if present) when a collector is
    # registered; without it, a custom collector is only read at scrapes.

    def collect(self) -> Iterator[Metric]:
        stats: dict[str, Any] = self.crawler.stats.get_stats() if self.crawler.stats else {}
        yield from self._crawl(stats)
        yield from self._pages(stats)
        yield from self._store(stats)
        yield from self._slots()

    # -- families ------------------------------------------------------------

    def _family(self, cls: type[Any], name: str, labels: Sequence[str] = ()) -> Any:
        # The counter's name without _total: prometheus_client adds it.
        return cls(name.removesuffix("_total") if cls is CounterMetricFamily else name,
                   _HELP[name], labels=[*self.constant, *labels])

    def counter(self, name: str, labels: Sequence[str] = ()) -> CounterMetricFamily:
        family: CounterMetricFamily = self._family(CounterMetricFamily, name, labels)
        return family

    def gauge(self, name: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
        family: GaugeMetricFamily = self._family(GaugeMetricFamily, name, labels)
        return family

    def add(self, family: CounterMetricFamily | GaugeMetricFamily, value: float,
            *labels: str) -> None:
        family.add_metric([*self.constant.values(), *labels], float(value))

    def single(self, cls: type[Any], name: str, value: float) -> Metric:
        family = self._family(cls, name)
        self.add(family, value)
        return family

    # -- the crawl -----------------------------------------------------------

    def _crawl(self, stats: dict[str, Any]) -> Iterator[Metric]:
        info = InfoMetricFamily("incremental_crawl", _HELP["incremental_crawl_info"],
                                labels=list(self.constant))
        info.add_metric(list(self.constant.values()), self.info)
        yield info
        started = stats.get("start_time")
        yield self.single(GaugeMetricFamily, "incremental_crawl_start_time_seconds",
                          started.timestamp() if started is not None else clock.now())
        engine = self.crawler.engine
        downloader = engine.downloader if engine is not None else None
        # Named as it is for the dashboards that read it; it counts what
        # the slots hold back too, hence the second gauge.
        active = downloader.active if downloader is not None else ()
        yield self.single(GaugeMetricFamily, "incremental_downloads_in_flight", len(active))
        transferring = (sum(len(slot.transferring) for slot in downloader.slots.values())
                        if downloader is not None else 0)
        yield self.single(GaugeMetricFamily, "incremental_downloads_transferring", transferring)

    def _pages(self, stats: dict[str, Any]) -> Iterator[Metric]:
        def stat(key: str) -> float:
            return float(stats.get(key, 0) or 0)

        requests = self.counter("incremental_requests_total", ["kind", "reason"])
        not_modified = self.counter("incremental_not_modified_total", ["kind"])
        for kind, prefix in _KINDS.items():
            for reason in RequestReason:
                self.add(requests, stat(f"{prefix}requests/{reason}"), kind, reason.value)
            self.add(not_modified, stat(f"{prefix}not_modified"), kind)
        yield requests
        yield not_modified
        known = self.counter("incremental_known_pages_total", ["decision"])
        for why in REQUESTED:
            self.add(known, stat(f"incremental/schedule/requested/{why}"), why.value)
        for decision, key in _NOT_REQUESTED.items():
            self.add(known, stat(key), decision)
        yield known
        left = self.counter("incremental_known_pages_left_total", ["decision"])
        for decision, key in _LEFT.items():
            self.add(left, stat(key), decision)
        yield left
        pages = self.counter("incremental_pages_total", ["outcome"])
        for outcome in ("new", "changed", "unchanged"):
            self.add(pages, stat(f"incremental/pages_{outcome}"), outcome)
        yield pages
        items = self.counter("incremental_items_total", ["outcome"])
        for outcome in ("new", "changed", "unchanged", "deleted"):
            self.add(items, stat(f"incremental/items_{outcome}"), outcome)
        yield items
        by_status: dict[str, float] = {}
        for key, value in stats.items():
            if key.startswith(_STATUS_PREFIX):
                label = status_label(key.removeprefix(_STATUS_PREFIX))
                by_status[label] = by_status.get(label, 0.0) + float(value or 0)
        statuses = self.counter("incremental_responses_total", ["status"])
        for label, count in by_status.items():
            self.add(statuses, count, label)
        yield statuses
        yield self.single(CounterMetricFamily, "incremental_downloaded_bytes_total",
                          stat("downloader/response_bytes"))
        saved = self.counter("incremental_saved_bytes_total", ["by"])
        self.add(saved, stat("incremental/bytes_saved_estimate"), "not_modified")
        self.add(saved, stat("incremental/schedule/bytes_skipped"), "not_requested")
        yield saved
        yield self.single(CounterMetricFamily, "incremental_saved_bytes_left_total",
                          stat("incremental/schedule/bytes_skipped_left"))
        errors = self.counter("incremental_errors_total", ["kind"])
        for kind, key in _ERRORS.items():
            self.add(errors, stat(key), kind)
        yield errors
        yield self.single(CounterMetricFamily, "incremental_failed_pages_total",
                          stat("incremental/schedule/failed"))
        yield self.single(CounterMetricFamily, "incremental_failed_pages_recovered_total",
                          stat("incremental/schedule/failed_recovered"))
        yield self.single(CounterMetricFamily, "incremental_state_withheld_total",
                          stat("incremental/state_withheld"))

    def _store(self, stats: dict[str, Any]) -> Iterator[Metric]:
        ledger = self.crawler.get_extension(Ledger)
        if ledger is None:
            return
        # Read from the store itself: the stat is only written at the end.
        yield self.single(CounterMetricFamily, "incremental_store_roundtrips_total",
                          ledger.store.roundtrips)
        yield self.single(CounterMetricFamily, "incremental_store_writes_total",
                          float(stats.get("incremental/store_writes", 0) or 0))
        yield self.single(GaugeMetricFamily, "incremental_store_pending_writes",
                          ledger.store.pending)

    # -- politeness windows ----------------------------------------------------

    def _slots(self) -> Iterator[Metric]:
        throttle = self.crawler.get_extension(AdaptiveThrottle)
        if throttle is None:
            return
        windows = throttle.site_windows()
        yield self.single(GaugeMetricFamily, "incremental_slots", len(windows))
        own, rest = self.slot_labels.split(windows)
        now = time.monotonic()
        rate = self.gauge("incremental_slot_window_requests_per_second", ["slot"])
        uncapped = self.gauge("incremental_slot_window_uncapped_requests_per_second", ["slot"])
        concurrency = self.gauge("incremental_slot_concurrency", ["slot"])
        p50 = self.gauge("incremental_slot_latency_p50_seconds", ["slot"])
        p95 = self.gauge("incremental_slot_latency_p95_seconds", ["slot"])
        requests = self.counter("incremental_slot_requests_total", ["slot"])
        responses = self.counter("incremental_slot_responses_total", ["slot"])
        errors = self.counter("incremental_slot_errors_total", ["slot", "kind"])
        frozen_for = self.counter("incremental_slot_frozen_seconds_total", ["slot"])
        frozen = self.gauge("incremental_slot_frozen", ["slot"])
        parked = self.gauge("incremental_slot_parked", ["slot"])
        groups: list[tuple[str, list[DomainWindow]]] = [(key, [w]) for key, w in own]
        if rest:
            groups.append((SLOT_OTHER, rest))
        for slot, group in groups:
            self.add(rate, sum(effective_rate(w)[0] for w in group), slot)
            self.add(uncapped, sum(w.rate for w in group), slot)
            self.add(concurrency, sum(w.concurrency for w in group), slot)
            if slot != SLOT_OTHER and group[0].latencies:
                # Percentiles of several slots do not add up: none for other.
                # None either for a slot with no answer but errors yet (the
                # window keeps the latencies of the others): 0 would read as
                # a fast site.
                (window,) = group
                self.add(p50, window.percentile(0.5), slot)
                self.add(p95, window.percentile(0.95), slot)
            self.add(requests, sum(w.sent for w in group), slot)
            self.add(responses, sum(w.responses for w in group), slot)
            for kind, attribute in _SLOT_ERRORS.items():
                self.add(errors, sum(getattr(w, attribute) for w in group), slot, kind)
            self.add(frozen_for, sum(w.frozen_seconds for w in group), slot)
            self.add(frozen, sum(w.frozen_until > now for w in group), slot)
            self.add(parked, sum(w.parked for w in group), slot)
        yield from (rate, uncapped, concurrency, p50, p95, requests, responses, errors,
                    frozen_for, frozen, parked)
