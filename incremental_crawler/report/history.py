"""Each crawl's summary, kept in the state store (``scrapy state`` shows it).

When the crawl ends, one :class:`~incremental_crawler.state.records.CrawlRecord`
per crawl (per worker in cluster mode) with the figures of the end-of-crawl
report is staged into the store through the ledger's record sources: the
ledger asks for it just before its last flush, so it is committed with the
crawl's last writes whatever order the ``spider_closed`` handlers run in.
The store keeps the newest ``INCREMENTAL_CRAWL_HISTORY`` per scope.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from incremental_crawler import clock
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.report.extension import summarize
from incremental_crawler.state.records import CrawlRecord

if TYPE_CHECKING:
    from typing import Self

    from scrapy.crawler import Crawler

__all__ = ["CrawlHistory", "crawl_figures"]

#: Figure name in the record → the report's figure (:func:`summarize`).
FIGURES = {
    "requests": "checked",
    "not_modified": "not_modified",
    "pages_new": "new",
    "pages_changed": "changed",
    "pages_unchanged": "unchanged_200",
    "new": "items_new",
    "changed": "items_changed",
    "unchanged": "items_unchanged",
    "bytes_received": "bytes_downloaded",
    "bytes_saved": "bytes_saved_estimate",
    "bytes_skipped": "bytes_skipped",
    "skipped_lastmod": "skipped_lastmod",
    "not_due": "not_due",
    "failed": "failed",
    "state_withheld": "state_withheld",
}


def crawl_figures(stats: dict[str, Any]) -> dict[str, float]:
    """The figures a crawl record keeps, from the crawl's stats."""
    s = summarize(stats)
    figures: dict[str, float] = {name: s[key] for name, key in FIGURES.items()}
    # Tombstones (gone pages' items), when the crawl emitted any.
    figures["deleted"] = int(stats.get("incremental/items_deleted", 0) or 0)
    figures["items"] = int(stats.get("item_scraped_count", 0) or 0)
    # Politeness, for the history charts: 429 answers, and the freezes
    # (Retry-After, backoff) they caused.
    figures["responses_429"] = int(stats.get("downloader/response_status_count/429", 0) or 0)
    figures["freezes"] = int(stats.get("incremental/retry_after_waits", 0) or 0)
    return figures


class CrawlHistory:
    """Gives the ledger this crawl's record when it ends."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self._record: CrawlRecord | None = None
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        if not IncrementalConfig.from_settings(crawler.settings).enabled:
            raise NotConfigured("INCREMENTAL_ENABLED is False: no state store to keep crawls in")
        return cls(crawler)

    def spider_opened(self) -> None:
        # Every extension exists now (the ledger may be built after this one).
        ledger = self.crawler.get_extension(Ledger)
        if ledger is not None:
            ledger.add_record_source(lambda reason: [self.record(ledger, reason)])

    def record(self, ledger: Ledger, reason: str) -> CrawlRecord:
        """This crawl's record: its run's start (cluster: the run's, shared
        by its workers), its own duration, and the report's figures.

        Made once: the HTML report asks for it too, and shows the record stored.
        """
        if self._record is not None:
            return self._record
        assert self.crawler.stats is not None
        finished = clock.now()
        figures = crawl_figures(self.crawler.stats.get_stats())
        figures["duration"] = round(max(0.0, finished - ledger.own_start), 3)
        self._record = CrawlRecord(scope=ledger.scope, started=ledger.crawl_started,
                                   finished=finished, worker=ledger.worker, reason=reason,
                                   figures=figures)
        return self._record
