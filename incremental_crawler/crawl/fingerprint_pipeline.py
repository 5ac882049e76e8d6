"""Drops items whose fingerprint equals the stored one; says what the others are.

Runs early (order 50) so unchanged items never cost the user's own
pipelines anything, and never reach storage. An item that goes on says what
it is in the change field (``new`` or ``changed``); a changed one also
carries the fingerprint it replaces and (opt-in) the top-level fields that
changed since the stored version. Tombstones (a gone page's ``deleted``
item, :mod:`.tombstones`) pass untouched: they are no content to compare;
so do stored versions emitted again (``Ledger.redeliveries``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter

from incremental_crawler.change.fingerprints import hamming, simhash
from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.exceptions import ItemNearDuplicate, ItemUnchanged, StoreUnavailable
from incremental_crawler.state.records import Change
from incremental_crawler.state.stores import StateStoreError

if TYPE_CHECKING:
    from typing import Self

    from scrapy.crawler import Crawler

__all__ = ["FingerprintPipeline"]


class FingerprintPipeline:
    """Fingerprint each item; drop it if unchanged, else mark it new/changed."""

    def __init__(self, crawler: Crawler) -> None:
        self.ledger = Ledger.for_component(crawler)
        self.stats = crawler.stats
        config = self.ledger.config
        self.near_duplicates = config.near_duplicates
        self.simhash_field = config.simhash_field
        self.simhash_distance = config.simhash_distance
        #: INCREMENTAL_CHANGED_FIELDS_FIELD is on (it costs a read of the stored data).
        self.changed_fields = config.changed_fields_field is not None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    async def process_item(self, item: Any) -> Any:
        try:
            return await self._process(item)
        except StateStoreError as exc:
            # The crawl stops (Ledger.store_failed logs the one line); the
            # ledger withholds the item's page (StoreUnavailable).
            self.ledger.store_failed(exc)
            raise StoreUnavailable(f"State store unavailable: {exc}", log_level="DEBUG") from exc

    async def _process(self, item: Any) -> Any:
        ledger = self.ledger
        if ledger.failed:
            # The crawl stops: what it emitted now would not be stored, and
            # the next crawl would emit it again as new.
            raise StoreUnavailable("State store failed: the crawl is stopping",
                                   log_level="DEBUG")
        if ledger.tombstone_of(item) is not None or ledger.is_redelivered(item):
            return item
        identity = ledger.identity
        fingerprint = identity.fingerprint(item)
        key = identity.key(item, fingerprint)
        # "" (a tombstone, in a store that says so) is unknown too: new.
        stored = await ledger.store.get_item_fingerprint(ledger.scope, key) or None
        if stored == fingerprint:
            self.stats.inc_value("incremental/items_unchanged")
            # DEBUG, not Scrapy's default WARNING: on a re-crawl most items
            # are unchanged, and that is the point.
            raise ItemUnchanged(f"Unchanged item {key}", log_level="DEBUG")
        sketch = None
        if self.near_duplicates:
            sketch = await self._near_duplicate(item, key, stored)
        self.stats.inc_value(
            "incremental/items_new" if stored is None else "incremental/items_changed"
        )
        changed_fields = None
        if stored is not None and self.changed_fields:
            data = await ledger.store.get_item_data(ledger.scope, key)
            if data is not None:
                changed_fields = identity.changed_fields(item, data)
        change = Change.NEW if stored is None else Change.CHANGED
        identity.set_fingerprint(item, fingerprint)
        identity.set_change(item, change, previous=stored, changed_fields=changed_fields)
        pending = ledger.remember(item)
        pending.key = key
        pending.fingerprint = fingerprint
        pending.simhash = sketch
        pending.change = change
        return item

    async def _near_duplicate(self, item: Any, key: str, stored: str | None) -> int | None:
        """The item's SimHash; raises ItemNearDuplicate when it is one."""
        text = ItemAdapter(item).get(self.simhash_field)
        if not isinstance(text, str):
            return None
        sketch = simhash(text, self.ledger.identity.normaliser)
        if stored is None:
            return sketch
        previous = await self.ledger.store.get_item_simhash(self.ledger.scope, key)
        if previous is not None and hamming(previous, sketch) <= self.simhash_distance:
            # The stored version stays the reference, so small changes that
            # add up still make an item once they pass the distance.
            self.stats.inc_value("incremental/items_near_duplicate")
            self.stats.inc_value("incremental/items_unchanged")
            raise ItemNearDuplicate(
                f"Near-duplicate item {key} ({hamming(previous, sketch)} bits)", log_level="DEBUG"
            )
        return sketch
