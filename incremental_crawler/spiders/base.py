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

Requests that discover other pages (sitemaps, listings, feeds) should be
fetched in full every time, or a 304 would hide what they link to: build
them with :meth:`discovery_request`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider

from incremental_crawler.downloadermiddlewares.conditional import META_SKIP

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["IncrementalSpider"]

ADDON_PATH = "incremental_crawler.addon.IncrementalAddon"


class IncrementalSpider(Spider):
    """See the module docstring."""

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
