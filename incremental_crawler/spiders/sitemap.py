"""``scrapy crawl sitemap -a sitemap_url=URL``: every page a sitemap lists.

``sitemap_url`` may be a sitemap (XML or plain text), a sitemap index, an
RSS or Atom feed (gzipped or not), or a robots.txt whose ``Sitemap:`` lines
name them (:mod:`incremental_crawler.lists.documents` reads them all). One item per new or changed
page: ``url``, ``title``, ``text`` (the main content) and ``fingerprint``.
Pages whose ``<lastmod>`` did not move are not requested (on a host whose
lastmods are trusted; a small rotating sample of them is still checked);
an index's child sitemaps whose ``<lastmod>`` did not move are not read.
``-a recheck=all`` requests every known page, conditionally.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.spiders import SitemapSpider

from incremental_crawler.change.accounting import Why
from incremental_crawler.hosts import host_of
from incremental_crawler.lists.dates import parse_feed_date, parse_w3c_datetime
from incremental_crawler.lists.documents import FEED_KINDS
from incremental_crawler.lists.robots import sitemap_urls_from_robots
from incremental_crawler.lists.sitemaps import decide
from incremental_crawler.meta import META_SKIP
from incremental_crawler.spiders.listed import (
    DEFAULT_TEXT_SELECTORS,
    MAX_LIST_BYTES,
    ListedPagesSpider,
    _flag,
    extract_main_text,
)
from incremental_crawler.state.records import PageFlags, PageKey

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable, Iterator

    from scrapy.http import Response

__all__ = ["DEFAULT_TEXT_SELECTORS", "SitemapPagesSpider", "extract_main_text"]

logger = logging.getLogger(__name__)


class SitemapPagesSpider(ListedPagesSpider, SitemapSpider):
    """Crawls every page of a sitemap; see the module docstring.

    Arguments (``-a``): ``sitemap_url`` (required), ``alternate_links``
    (``true``: also request the ``xhtml:link`` alternates of each entry, as
    Scrapy's ``sitemap_alternate_links``, which a subclass may set too), and
    those of :class:`~incremental_crawler.spiders.listed.ListedPagesSpider`.
    ``sitemap_rules``, ``sitemap_follow`` and ``sitemap_filter`` work as in
    Scrapy's ``SitemapSpider``.
    """

    name = "sitemap"
    list_callbacks = frozenset({"_parse_sitemap"})

    def __init__(self, sitemap_url: str | None = None,
                 alternate_links: str | bool | None = None, **kwargs: Any) -> None:
        if not sitemap_url:
            raise ValueError(
                "the sitemap spider needs -a sitemap_url=URL (a sitemap, a "
                "sitemap index, a feed or a robots.txt)"
            )
        self.sitemap_urls = [sitemap_url]
        super().__init__(**kwargs)
        if alternate_links is not None:
            self.sitemap_alternate_links = _flag(alternate_links, "alternate_links")

    async def start(self) -> AsyncIterator[Any]:
        for url in self.sitemap_urls:
            yield self._sitemap_request(url)

    def _sitemap_request(self, url: str, lastmod: float | None = None,
                         named_by: list[str] | None = None) -> Request:
        if url.endswith("/robots.txt"):
            # Small, and it names the sitemaps: always read in full.
            return Request(url, callback=self._parse_sitemap,
                           meta={META_SKIP: True, "download_maxsize": MAX_LIST_BYTES})
        request = self.list_request(url, self._parse_sitemap, lastmod)
        if named_by:
            request.cb_kwargs["named_by"] = named_by
        return request

    # Replaces SitemapSpider's (sync) parser as an async generator callback,
    # under its name: stored page states and list_callbacks refer to it.
    async def _parse_sitemap(  # type: ignore[override]
        self, response: Response, named_by: list[str] | None = None,
    ) -> AsyncIterator[Request]:
        """*named_by*: the hosts whose robots.txt named this list (or the
        index that did): sitemaps.org lets it list their URLs."""
        stats = self.crawler.stats
        if response.url.endswith("/robots.txt"):
            host = host_of(response.url)
            for url in sitemap_urls_from_robots(response.body, base_url=response.url):
                yield self._sitemap_request(url, named_by=[host])
            return
        listing = self.read_listing(response)
        if listing is None:
            stats.inc_value("incremental/sitemap/invalid")
            logger.warning("Ignoring invalid sitemap: %(response)s", {"response": response})
            self.not_a_list(response)
            return
        stats.inc_value(f"incremental/sitemap/{listing.kind}")
        parse_date = parse_feed_date if listing.kind in FEED_KINDS else parse_w3c_datetime
        entries = self.entries(response.url, parse_date=parse_date, named_by=named_by or ())
        filtered = self.sitemap_filter(listing.entries)
        if listing.pages:
            candidates = entries.candidates(self._with_alternates(filtered))
            async for request in self.listed_requests(entries, candidates, self._callback_for,
                                                      response):
                yield request
            return
        # An index's lastmod says when each child sitemap changed: a child
        # that did not change is not read again, and the membership it had
        # when last read in full is current. Lists have no revisit
        # schedule of their own: any other answer reads the child, as does
        # a child whose membership is not on record. Its alternates are
        # followed too (sitemap_alternate_links), as Scrapy's.
        candidates = [child for child in entries.candidates(self._with_alternates(filtered))
                      if any(rule.search(child.loc) for rule in self._follow)]
        self.read_in_full(response, candidates, children=[child.loc for child in candidates])
        rules = replace(self.due_rules(), revisit=False)
        stored = await self.stored_states(candidates)
        for child, state in zip(candidates, stored, strict=True):
            why = decide(child, state, use_lastmod=self.use_lastmod, rules=rules)
            if why is Why.LASTMOD_UNCHANGED and state is not None and state.listing is not None:
                stats.inc_value("incremental/sitemap/child_unchanged")
                self.current(state.listing)
                if state.flags & PageFlags.HAS_LINKS and response.request is not None:
                    # An index in an index (read once, if it names this one).
                    seen = {PageKey(state.key.scope, entries.canonical(response.url))}
                    async for request in self._children_of(state, response.request, seen):
                        yield request
                continue
            yield self._sitemap_request(child.loc, child.lastmod, named_by)

    def _with_alternates(self, entries: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """*entries*, then (``sitemap_alternate_links``) their alternates.

        After all the entries: an alternate listed in its own ``<url>``
        keeps that entry's lastmod (duplicates are dropped, the first wins).
        An alternate has no date of its own, and may be on another host
        (Google's cross-domain hreflang; Scrapy requests it too).
        """
        alternates: list[str] = []
        for entry in entries:
            yield entry
            if self.sitemap_alternate_links:
                alternates.extend(entry.get("alternate", ()))
        for loc in alternates:
            yield {"loc": loc, "lastmod": None, "modified": False, "alternate_link": True}

    def _callback_for(self, loc: str) -> Any:
        return next((cb for rule, cb in self._cbs if rule.search(loc)), None)
