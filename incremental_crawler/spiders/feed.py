"""``scrapy crawl feed -a feed_url=URL``: the pages an RSS or Atom feed links.

The feed is fetched conditionally; an entry is requested when it is new or
its date (Atom ``updated``, else ``published``; RSS ``pubDate``) moved past
the one stored with our copy. Only an Atom ``updated`` is a modification
date: one that did not move vouches for our copy (on a host whose lastmods
are trusted), and the page is not requested. A publication date (RSS
``pubDate``, Atom ``published``) that did not move, or no date, leaves the
page to its revisit schedule and a conditional request. One item per new or
changed page, like the ``sitemap`` spider; ``-a recheck=all`` requests every
known page, conditionally.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import lxml.etree

from incremental_crawler.lists.dates import parse_feed_date
from incremental_crawler.spiders.listed import ListedPagesSpider

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from scrapy import Request
    from scrapy.http import Response

__all__ = ["FeedPagesSpider", "feed_entries"]

logger = logging.getLogger(__name__)


def _local(tag: object) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _child_text(element: Any, *names: str) -> str | None:
    for name in names:
        for child in element:
            if _local(child.tag) == name and child.text:
                return child.text.strip()
    return None


def feed_entries(body: bytes) -> tuple[str, Iterator[dict[str, Any]]] | None:
    """``(kind, entries)`` of an RSS 2.0 or Atom feed, or ``None``.

    Entries are ``{"loc": link, "lastmod": raw date, "modified": whether
    that date is a modification date}``. The parser never
    resolves entities or reaches the network (no billion laughs, no XXE).
    """
    parser = lxml.etree.XMLParser(
        resolve_entities=False, no_network=True, recover=True, huge_tree=False,
        remove_comments=True, remove_pis=True,
    )
    try:
        root = lxml.etree.fromstring(body, parser=parser)
    except lxml.etree.XMLSyntaxError:
        return None
    if root is None:
        return None
    kind = _local(root.tag)
    if kind == "rss":
        return "rss", _rss(root)
    if kind == "feed":
        return "atom", _atom(root)
    return None


def _rss(root: Any) -> Iterator[dict[str, Any]]:
    for item in root.iter():
        if _local(item.tag) != "item":
            continue
        # RSS 2.0: an item without <link> is still addressable by a permalink guid.
        link = _child_text(item, "link")
        if not link:
            for child in item:
                if _local(child.tag) == "guid" and child.get("isPermaLink", "true") == "true":
                    link = (child.text or "").strip()
        # pubDate is when the item was published: no modification date.
        yield {"loc": link or "", "lastmod": _child_text(item, "pubDate"), "modified": False}


def _atom(root: Any) -> Iterator[dict[str, Any]]:
    for entry in root:
        if _local(entry.tag) != "entry":
            continue
        link = ""
        for child in entry:
            if _local(child.tag) == "link" and child.get("rel", "alternate") == "alternate":
                link = child.get("href", "")
                break
        updated = _child_text(entry, "updated")
        yield {"loc": link, "lastmod": updated or _child_text(entry, "published"),
               "modified": updated is not None}


class FeedPagesSpider(ListedPagesSpider):
    """Arguments (``-a``): ``feed_url`` (required), and those of
    :class:`~incremental_crawler.spiders.listed.ListedPagesSpider`."""

    name = "feed"
    list_callbacks = frozenset({"parse_feed"})

    def __init__(self, feed_url: str | None = None, **kwargs: Any) -> None:
        if not feed_url:
            raise ValueError("the feed spider needs -a feed_url=URL (RSS 2.0 or Atom)")
        super().__init__(**kwargs)
        self.feed_url = feed_url

    async def start(self) -> AsyncIterator[Any]:
        yield self.list_request(self.feed_url, self.parse_feed)

    async def parse_feed(self, response: Response) -> AsyncIterator[Request]:
        stats = self.crawler.stats
        parsed = feed_entries(response.body)
        if parsed is None:
            stats.inc_value("incremental/feed/invalid")
            logger.warning("Ignoring invalid feed: %(response)s", {"response": response})
            return
        kind, raw_entries = parsed
        stats.inc_value(f"incremental/feed/{kind}")
        entries = self.entries(response.url, parse_date=parse_feed_date)
        candidates = entries.candidates(raw_entries)
        async for request in self.listed_requests(entries, candidates, self._page_callback):
            yield request

    def _page_callback(self, loc: str) -> Any:
        return self.parse

    def needs_reseed(self) -> bool:
        # A feed is a window of recent entries: pages that left it are only
        # reached again by re-seeding (those it lists were decided already).
        return self.incremental_reseed
