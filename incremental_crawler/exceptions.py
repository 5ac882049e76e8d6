"""The exceptions a spider meets: requests not sent or answered 304, items dropped.

Each is an ``IgnoreRequest`` or a ``DropItem``, so Scrapy handles them as
usual; an errback (or a ``item_dropped`` handler) can tell them apart.
"""

from __future__ import annotations

from scrapy.exceptions import DropItem, IgnoreRequest

__all__ = [
    "ClusterError", "ItemNearDuplicate", "ItemUnchanged", "NotDue", "NotModified",
    "RobotsTxtUnavailable",
]


class NotModified(IgnoreRequest):
    """The page answered 304: it is unchanged, so its callback is not called."""


class NotDue(IgnoreRequest):
    """The page's revisit schedule says it is not due yet; it was not requested.

    A request for a page that is not due, yielded by a callback or by
    ``start()``, is dropped before it reaches the scheduler: it never raises
    this, and its errback is not called. ``NotDue`` is raised only for a
    request that reaches the downloader without passing through the spider
    middlewares (one a component or the engine schedules itself, e.g. with
    ``engine.crawl()``), or when the not-due filter is switched off
    (``SPIDER_MIDDLEWARES``), and for a page with stored links asked again
    in a crawl that replayed them already.
    """


class RobotsTxtUnavailable(IgnoreRequest):
    """The host's robots.txt could not be read (a 5xx, a 429, no answer): not requested.

    RFC 9309 §2.3.1.4: an unreachable robots.txt means complete disallow. The
    host's requests are refused for the rest of the crawl; robots.txt is asked
    again on the next one.
    """


class ItemUnchanged(DropItem):
    """The item equals the stored version."""


class StoreUnavailable(DropItem):
    """The state store failed while the item was checked against it: the
    crawl stops (one ERROR line says why), and the item's page is not
    recorded as done. Dropped quietly, not as an error per item in flight."""


class ItemNearDuplicate(ItemUnchanged):
    """The item differs from the stored version only by a few SimHash bits."""


class ClusterError(RuntimeError):
    """The cluster's Redis cannot be used; the message names it and says why.

    Here, not with the coordinator: what tells a fatal error (the crawl
    command) must not import Redis's client into every crawl. Also
    importable from :mod:`incremental_crawler.cluster`.
    """
