"""``scrapy crawl sitemap -a sitemap_url=URL``: every page a sitemap lists.

``sitemap_url`` may be a sitemap, a sitemap index, gzipped or not, or a
robots.txt whose ``Sitemap:`` lines name them. One item per new or changed
page: ``url``, ``title``, ``text`` (the main content) and ``fingerprint``.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.http import TextResponse
from scrapy.spiders import SitemapSpider
from scrapy.utils.sitemap import Sitemap, sitemap_urls_from_robots

from incremental_crawler.downloadermiddlewares.conditional import META_LASTMOD, META_SKIP
from incremental_crawler.ledger import Ledger
from incremental_crawler.sitemaps import SitemapEntries, decide
from incremental_crawler.spiders.base import IncrementalSpider
from incremental_crawler.state import PageKey

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

    from scrapy.http import Response

__all__ = ["SitemapPagesSpider", "extract_main_text"]

logger = logging.getLogger(__name__)

#: sitemaps.org: at most 50 MB (52,428,800 bytes) uncompressed per file.
MAX_SITEMAP_BYTES = 52_428_800
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
    ``use_lastmod`` (``true``/``false``: skip pages whose lastmod is not newer
    than the stored one; default true), ``allowed_hosts`` (comma-separated
    hosts besides the sitemap's own whose URLs a sitemap may list).
    """

    name = "sitemap"
    # Every sitemap is fetched in full, so every listed page is decided on
    # each crawl: nothing to re-seed.
    incremental_reseed = False

    def __init__(
        self,
        sitemap_url: str | None = None,
        text_selector: str | None = None,
        use_lastmod: str | bool = True,
        allowed_hosts: str = "",
        **kwargs: Any,
    ) -> None:
        if not sitemap_url:
            raise ValueError(
                "the sitemap spider needs -a sitemap_url=URL (a sitemap, a "
                "sitemap index or a robots.txt)"
            )
        self.sitemap_urls = [sitemap_url]
        self.use_lastmod = _flag(use_lastmod, "use_lastmod")
        self.allowed_hosts = [h.strip() for h in allowed_hosts.split(",") if h.strip()]
        self.text_selectors = (
            (text_selector, *DEFAULT_TEXT_SELECTORS) if text_selector else DEFAULT_TEXT_SELECTORS
        )
        super().__init__(**kwargs)

    async def start(self) -> AsyncIterator[Any]:
        for url in self.sitemap_urls:
            yield self._sitemap_request(url)

    def _sitemap_request(self, url: str) -> Request:
        # Sitemaps and robots.txt are always fetched in full: a 304 there
        # would hide every page they list. sitemaps.org caps a file at 50 MB
        # uncompressed; Scrapy applies download_maxsize to gunzipped bodies.
        return Request(
            url, callback=self._parse_sitemap,
            meta={META_SKIP: True, "download_maxsize": MAX_SITEMAP_BYTES},
        )

    async def _parse_sitemap(self, response: Response) -> AsyncIterator[Request]:
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
        ledger = Ledger.of(self.crawler)
        entries = SitemapEntries(
            response.url, stats, ledger.canonical, allowed_hosts=self.allowed_hosts
        )
        if sitemap.type == "sitemapindex":
            children = entries.candidates(self.sitemap_filter(sitemap))
            for child in children:
                if any(rule.search(child.loc) for rule in self._follow):
                    yield self._sitemap_request(child.loc)
            return
        candidates = entries.candidates(self.sitemap_filter(sitemap))
        keys = [PageKey(ledger.scope, c.canonical) for c in candidates]
        stored = await ledger.store.get_pages(keys)
        now = time.time()
        for candidate, key in zip(candidates, keys, strict=True):
            reason = decide(
                candidate, stored.get(key), use_lastmod=self.use_lastmod,
                max_age=ledger.config.max_age, now=now,
            )
            if reason is None:
                stats.inc_value("incremental/lastmod/skipped")
                continue
            stats.inc_value(f"incremental/lastmod/requested/{reason}")
            callback = next((cb for rule, cb in self._cbs if rule.search(candidate.loc)), None)
            if callback is None:
                continue
            meta = {} if candidate.lastmod is None else {META_LASTMOD: candidate.lastmod}
            yield Request(candidate.loc, callback=callback, meta=meta)

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
