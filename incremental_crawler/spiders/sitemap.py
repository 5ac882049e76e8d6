"""``scrapy crawl sitemap -a sitemap_url=URL``: every page a sitemap lists.

``sitemap_url`` may be a sitemap, a sitemap index, gzipped or not, or a
robots.txt whose ``Sitemap:`` lines name them. One item per new or changed
page: ``url``, ``title``, ``text`` (the main content) and ``fingerprint``.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from scrapy.http import TextResponse
from scrapy.spiders import SitemapSpider

from incremental_crawler.downloadermiddlewares.conditional import META_SKIP
from incremental_crawler.spiders.base import IncrementalSpider

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

    from scrapy import Request
    from scrapy.http import Response

__all__ = ["SitemapPagesSpider", "extract_main_text"]

logger = logging.getLogger(__name__)

#: Where the main content is, in order of preference.
DEFAULT_TEXT_SELECTORS = ("main", "[role=main]", "article", "body")
_SPACES = re.compile(r"\s+")
_TEXT_XPATH = ".//text()[not(ancestor::script or ancestor::style or ancestor::noscript)]"


def extract_main_text(response: TextResponse, selectors: Iterable[str]) -> str:
    """The text of the first element matching one of *selectors*, whitespace folded."""
    for css in selectors:
        node = response.css(css)
        if node:
            return _SPACES.sub(" ", " ".join(node[0].xpath(_TEXT_XPATH).getall())).strip()
    return ""


def _flag(value: str | bool, name: str) -> bool:
    if isinstance(value, bool):
        return value
    lowered = str(value).strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"-a {name}={value!r}: use true or false")


class SitemapPagesSpider(IncrementalSpider, SitemapSpider):
    """Crawls every page of a sitemap; see the module docstring.

    Arguments (``-a``): ``sitemap_url`` (required), ``text_selector`` (a CSS
    selector for the main content, tried before the defaults),
    ``use_lastmod`` (``true``/``false``; lastmod-driven skipping is not
    implemented yet, every listed page gets a conditional request).
    """

    name = "sitemap"

    def __init__(
        self,
        sitemap_url: str | None = None,
        text_selector: str | None = None,
        use_lastmod: str | bool = True,
        **kwargs: Any,
    ) -> None:
        if not sitemap_url:
            raise ValueError(
                "the sitemap spider needs -a sitemap_url=URL (a sitemap, a "
                "sitemap index or a robots.txt)"
            )
        self.sitemap_urls = [sitemap_url]
        self.use_lastmod = _flag(use_lastmod, "use_lastmod")
        self.text_selectors = (
            (text_selector, *DEFAULT_TEXT_SELECTORS) if text_selector else DEFAULT_TEXT_SELECTORS
        )
        super().__init__(**kwargs)

    async def start(self) -> AsyncIterator[Any]:
        async for request in super().start():
            yield self._as_discovery(request)

    def _as_discovery(self, request: Request) -> Request:
        # Sitemaps and robots.txt are always fetched in full: a 304 there
        # would hide every page they list.
        if request.callback == self._parse_sitemap:
            request.meta[META_SKIP] = True
        return request

    def _parse_sitemap(self, response: Response) -> Iterable[Request]:
        for request in super()._parse_sitemap(response):
            yield self._as_discovery(request)

    def parse(self, response: Response) -> Iterable[dict[str, Any]]:
        if not isinstance(response, TextResponse):
            self.crawler.stats.inc_value("incremental/skipped_not_text")
            logger.info("Skipping %(url)s: not a text page", {"url": response.url})
            return
        yield {
            "url": response.url,
            "title": (response.css("title::text").get() or "").strip(),
            "text": extract_main_text(response, self.text_selectors),
        }
