"""``scrapy crawl sitemap -a sitemap_url=URL``: every page a sitemap lists.

``sitemap_url`` may be a sitemap, a sitemap index, gzipped or not, or a
robots.txt whose ``Sitemap:`` lines name them. One item per new or changed
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
from scrapy.utils.sitemap import Sitemap

from incremental_crawler.change.schedule import Why
from incremental_crawler.lists.robots import sitemap_urls_from_robots
from incremental_crawler.lists.sitemaps import decide
from incremental_crawler.meta import META_SKIP
from incremental_crawler.spiders.listed import (
    DEFAULT_TEXT_SELECTORS,
    MAX_LIST_BYTES,
    ListedPagesSpider,
    extract_main_text,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from scrapy.http import Response

__all__ = ["DEFAULT_TEXT_SELECTORS", "SitemapPagesSpider", "extract_main_text"]

logger = logging.getLogger(__name__)


class SitemapPagesSpider(ListedPagesSpider, SitemapSpider):
    """Crawls every page of a sitemap; see the module docstring.

    Arguments (``-a``): ``sitemap_url`` (required), and those of
    :class:`~incremental_crawler.spiders.listed.ListedPagesSpider`.
    """

    name = "sitemap"
    list_callbacks = frozenset({"_parse_sitemap"})

    def __init__(self, sitemap_url: str | None = None, **kwargs: Any) -> None:
        if not sitemap_url:
            raise ValueError(
                "the sitemap spider needs -a sitemap_url=URL (a sitemap, a "
                "sitemap index or a robots.txt)"
            )
        self.sitemap_urls = [sitemap_url]
        super().__init__(**kwargs)

    async def start(self) -> AsyncIterator[Any]:
        for url in self.sitemap_urls:
            yield self._sitemap_request(url)

    def _sitemap_request(self, url: str, lastmod: float | None = None) -> Request:
        if url.endswith("/robots.txt"):
            # Small, and it names the sitemaps: always read in full.
            return Request(url, callback=self._parse_sitemap,
                           meta={META_SKIP: True, "download_maxsize": MAX_LIST_BYTES})
        return self.list_request(url, self._parse_sitemap, lastmod)

    # Replaces SitemapSpider's (sync) parser as an async generator callback,
    # under its name: stored page states and list_callbacks refer to it.
    async def _parse_sitemap(  # type: ignore[override]
        self, response: Response,
    ) -> AsyncIterator[Request]:
        stats = self.crawler.stats
        if response.url.endswith("/robots.txt"):
            for url in sitemap_urls_from_robots(response.body, base_url=response.url):
                yield self._sitemap_request(url)
            return
        body = self._get_sitemap_body(response)
        sitemap = Sitemap(body) if body else None
        if sitemap is None or sitemap.type not in ("sitemapindex", "urlset"):
            stats.inc_value("incremental/sitemap/invalid")
            logger.warning("Ignoring invalid sitemap: %(response)s", {"response": response})
            return
        stats.inc_value(f"incremental/sitemap/{sitemap.type}")
        entries = self.entries(response.url)
        candidates = entries.candidates(self.sitemap_filter(sitemap))
        if sitemap.type == "urlset":
            async for request in self.listed_requests(entries, candidates, self._callback_for):
                yield request
            return
        # An index's lastmod says when each child sitemap changed: a child
        # that did not change is not read again. Lists have no revisit
        # schedule of their own: any other answer reads the child.
        rules = replace(self.due_rules(), revisit=False)
        stored = await self.stored_states(candidates)
        for child, state in zip(candidates, stored, strict=True):
            if not any(rule.search(child.loc) for rule in self._follow):
                continue
            why = decide(child, state, use_lastmod=self.use_lastmod, rules=rules)
            if why is Why.LASTMOD_UNCHANGED:
                stats.inc_value("incremental/sitemap/child_unchanged")
                self.lists_skipped = True
                continue
            yield self._sitemap_request(child.loc, child.lastmod)

    def _callback_for(self, loc: str) -> Any:
        return next((cb for rule, cb in self._cbs if rule.search(loc)), None)
