"""Drops items whose fingerprint equals the stored one.

Runs early (order 50) so unchanged items never cost the user's own
pipelines anything, and never reach storage (invariant 3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy.exceptions import DropItem

from incremental_crawler.ledger import Ledger

if TYPE_CHECKING:
    from typing import Self

    from scrapy.crawler import Crawler

__all__ = ["FingerprintPipeline", "ItemUnchanged"]


class ItemUnchanged(DropItem):
    """The item equals the stored version."""


class FingerprintPipeline:
    """Fingerprint each item; drop it if unchanged, else mark it new/changed."""

    def __init__(self, crawler: Crawler) -> None:
        self.ledger = Ledger.for_component(crawler)
        self.stats = crawler.stats

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    async def process_item(self, item: Any) -> Any:
        ledger = self.ledger
        identity = ledger.identity
        fingerprint = identity.fingerprint(item)
        key = identity.key(item, fingerprint)
        stored = await ledger.store.get_item_fingerprint(ledger.scope, key)
        if stored == fingerprint:
            self.stats.inc_value("incremental/items_unchanged")
            # DEBUG, not Scrapy's default WARNING: on a re-crawl most items
            # are unchanged, and that is the point.
            raise ItemUnchanged(f"Unchanged item {key}", log_level="DEBUG")
        self.stats.inc_value(
            "incremental/items_new" if stored is None else "incremental/items_changed"
        )
        identity.set_fingerprint(item, fingerprint)
        pending = ledger.remember(item)
        pending.key = key
        pending.fingerprint = fingerprint
        return item
