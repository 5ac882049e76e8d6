"""The exceptions a spider meets: requests not sent or answered 304, items dropped.

Each is an ``IgnoreRequest`` or a ``DropItem``, so Scrapy handles them as
usual; an errback (or a ``item_dropped`` handler) can tell them apart.
"""

from __future__ import annotations

from scrapy.exceptions import DropItem, IgnoreRequest

__all__ = ["ItemNearDuplicate", "ItemUnchanged", "NotDue", "NotModified"]


class NotModified(IgnoreRequest):
    """The page answered 304: it is unchanged, so its callback is not called."""


class NotDue(IgnoreRequest):
    """The page's revisit schedule says it is not due yet; it was not requested."""


class ItemUnchanged(DropItem):
    """The item equals the stored version."""


class ItemNearDuplicate(ItemUnchanged):
    """The item differs from the stored version only by a few SimHash bits."""
