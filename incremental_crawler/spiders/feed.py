"""``scrapy crawl feed -a feed_url=URL``: the pages an RSS or Atom feed links.

RSS 2.0, RSS 1.0 (RDF) and Atom 1.0 and 0.3 are read, relative links
resolved (:mod:`incremental_crawler.lists.documents`).

The feed is fetched conditionally; an entry is requested when it is new or
its date (Atom ``updated``, else ``published``; RSS ``dcterms:modified``,
else ``pubDate``, else ``dc:date``) moved past the one stored with our copy.
Only an Atom ``updated`` (Atom 0.3: ``modified``) and an RSS
``dcterms:modified`` are modification dates: one that did not move vouches
for our copy (on a host whose lastmods are trusted), and the page is not
requested. A publication date (RSS ``pubDate``, ``dc:date``, Atom
``published``) that did not move, or no date, leaves the page to its
revisit schedule and a conditional request. One item per new or
changed page, like the ``sitemap`` spider; ``-a recheck=all`` requests every
known page, conditionally.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from incremental_crawler.lists.dates import parse_feed_date
from incremental_crawler.lists.documents import FEED_KINDS, parse_listing
from incremental_crawler.spiders.listed import ListedPagesSpider

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from scrapy import Request
    from scrapy.http import Response

__all__ = ["FeedPagesSpider", "feed_entries"]

logger = logging.getLogger(__name__)


def feed_entries(body: bytes, url: str = "") -> tuple[str, Iterator[dict[str, Any]]] | None:
    """``(kind, entries)`` of an RSS 2.0, RSS 1.0 (RDF) or Atom feed, or ``None``.

    Entries are ``{"loc": link, "lastmod": raw date, "modified": whether
    that date is a modification date}``, relative links resolved against
    ``xml:base`` and *url* (:func:`~incremental_crawler.lists.documents.parse_listing`).
    """
    listing = parse_listing(body, url)
    if listing is None or listing.kind not in FEED_KINDS:
        return None
    return listing.kind, iter(listing.entries)


class FeedPagesSpider(ListedPagesSpider):
    """Arguments (``-a``): ``feed_url`` (required), and those of
    :class:`~incremental_crawler.spiders.listed.ListedPagesSpider`."""

    name = "feed"
    list_callbacks = frozenset({"parse_feed"})

    def __init__(self, feed_url: str | None = None, **kwargs: Any) -> None:
        if not feed_url:
            raise ValueError("the feed spider needs -a feed_url=URL (RSS or Atom)")
        super().__init__(**kwargs)
        self.feed_url = feed_url

    async def start(self) -> AsyncIterator[Any]:
        yield self.list_request(self.feed_url, self.parse_feed)

    async def parse_feed(self, response: Response) -> AsyncIterator[Request]:
        stats = self.crawler.stats
        # As the sitemap spider's lists: faults counted, skipped entries warned of.
        listing = self.read_listing(response)
        if listing is None or listing.kind not in FEED_KINDS:
            stats.inc_value("incremental/feed/invalid")
            logger.warning("Ignoring invalid feed: %(response)s", {"response": response})
            self.not_a_list(response)
            return
        stats.inc_value(f"incremental/feed/{listing.kind}")
        entries = self.entries(response.url, parse_date=parse_feed_date)
        candidates = entries.candidates(listing.entries)
        async for request in self.listed_requests(entries, candidates, self._page_callback,
                                                  response):
            yield request

    def _page_callback(self, loc: str) -> Any:
        return self.parse
