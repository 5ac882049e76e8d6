"""Stores items in the state store, in the same transaction as page state.

Keep it last (order 900): the stored version is the item as every other
pipeline left it. The write itself happens when the item has passed every
pipeline (the ``item_scraped`` signal), staged just before the page state
of the response it came from, so both reach the disk in one commit.
A tombstone passes untouched: the ledger stores it when it left the
pipelines (as the ``deleted`` version of the gone page's items); so does a
stored version emitted again (at-least-once delivery: it is stored already).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured

from incremental_crawler.change.identity import serialize_item
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.crawl.ledger import Ledger

if TYPE_CHECKING:
    from typing import Self

    from scrapy.crawler import Crawler

__all__ = ["StoragePipeline"]


class StoragePipeline:
    """Keeps the latest version of every item, and a history of versions."""

    def __init__(self, crawler: Crawler) -> None:
        config = IncrementalConfig.from_settings(crawler.settings)
        if not config.enabled:
            raise NotConfigured("INCREMENTAL_ENABLED is False")
        if not config.store_items:
            raise NotConfigured(
                "INCREMENTAL_STORE_ITEMS is False; items go only to your own "
                "pipelines and feeds"
            )
        self.ledger = Ledger.for_component(crawler)
        self.ledger.stores_items = True

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_item(self, item: Any) -> Any:
        if self.ledger.tombstone_of(item) is None and not self.ledger.is_redelivered(item):
            self.ledger.remember(item).data = serialize_item(item)
        return item
