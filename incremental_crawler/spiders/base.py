"""The base class that makes any spider incremental.

Subclass :class:`IncrementalSpider` instead of :class:`scrapy.Spider` (or
mix it into any Scrapy spider class) and write callbacks as usual: the
add-on is switched on for the spider even in a project that does not list
it in ``ADDONS``, every request carries the stored validators, 304s never
reach your callbacks, and unchanged items are dropped before storage.

Per-spider knobs (class attributes, all optional):

- ``incremental_scope``: the namespace of this spider's state (default: its
  name). Two spiders sharing a scope share validators and items.
- ``incremental_item_key_field``: the field identifying an item across runs
  (default ``INCREMENTAL_ITEM_KEY_FIELD``, ``url``), or define
  ``incremental_item_key(self, item) -> str``.
- ``incremental_fingerprint_fields`` / ``incremental_volatile_fields``:
  which fields count for "changed", or which never do.

Link-following crawls do not lose subtrees: when a listing page answers
304, its links are not seen again, so once the crawl runs out of work the
pages fetched before whose revisit is due are re-seeded from the store (as a
crawl database does), most likely to have changed first. The add-on's
:class:`~incremental_crawler.crawl.reseed.Reseeder` does it for every spider;
``incremental_reseed = False`` turns it off, and :meth:`needs_reseed` and
:meth:`reseed_skip` are its hooks (``INCREMENTAL_RESEED_LIMIT`` bounds it per
crawl).

Requests that must see every link every time (a sitemap) can be fetched in
full with :meth:`discovery_request`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider

from incremental_crawler.crawl.ledger import Ledger
from incremental_crawler.meta import META_SKIP

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

    from incremental_crawler.state.records import PageState

__all__ = ["IncrementalSpider"]

ADDON_PATH = "incremental_crawler.addon.IncrementalAddon"


class IncrementalSpider(Spider):
    """See the module docstring."""

    #: ``False``: do not re-seed due pages from the store (read by the
    #: add-on's Reseeder, which any spider may steer the same way).
    incremental_reseed: bool = True

    @property
    def ledger(self) -> Ledger | None:
        """The crawl's ledger: the state store and what it knows (None when
        INCREMENTAL_ENABLED is False: the spider then crawls as a plain one)."""
        return self.crawler.get_extension(Ledger)

    def needs_reseed(self) -> bool:
        """Whether this crawl may have missed known pages (they are re-seeded if so)."""
        return self.incremental_reseed

    def reseed_skip(self, state: PageState) -> bool:
        """Whether a due page should not be re-seeded (already decided this crawl)."""
        return False

    @classmethod
    def update_settings(cls, settings: BaseSettings) -> None:
        super().update_settings(settings)
        addons = settings.getdict("ADDONS")
        if ADDON_PATH not in addons:
            settings.set("ADDONS", {**addons, ADDON_PATH: 0}, priority="spider")

    @staticmethod
    def discovery_request(url: str, **kwargs: Any) -> Request:
        """A request fetched without conditions and without stored state."""
        meta = {**kwargs.pop("meta", {}), META_SKIP: True}
        return Request(url, meta=meta, **kwargs)
