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

from incremental_crawler.downloadermiddlewares.conditional import (
    META_DISCOVERY,
    META_LASTMOD,
    META_SKIP,
)
from incremental_crawler.ledger import Ledger
from incremental_crawler.sitemaps import Candidate, SitemapEntries, decide
from incremental_crawler.spiders.base import IncrementalSpider
from incremental_crawler.state import PageKey, PageState

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

    from scrapy.http import Response

__all__ = ["SitemapPagesSpider", "extract_main_text"]

logger = logging.getLogger(__name__)

#: sitemaps.org: at most 50 MB (52,428,800 bytes) uncompressed per file.
MAX_SITEMAP_BYTES = 52_428_800
#: A sitemap whose lastmods are (nearly) all within this many seconds of
#: the fetch is stamping its generation time, not the pages' changes.
GENERATED_WINDOW = 300.0
GENERATED_SHARE = 0.9
GENERATED_MIN_ENTRIES = 10
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
        #: Canonical URLs of the pages the sitemaps listed this crawl.
        self._decided: set[str] = set()
        self.text_selectors = (
            (text_selector, *DEFAULT_TEXT_SELECTORS) if text_selector else DEFAULT_TEXT_SELECTORS
        )
        super().__init__(**kwargs)

    async def start(self) -> AsyncIterator[Any]:
        for url in self.sitemap_urls:
            yield self._sitemap_request(url)

    def _sitemap_request(self, url: str, lastmod: float | None = None) -> Request:
        # Sitemaps are fetched conditionally, whatever their schedule; their
        # state is saved only when the crawl finishes (META_DISCOVERY). A 304
        # sitemap yields no work but the due pages re-seeded at the end.
        # robots.txt is small and always read in full. sitemaps.org caps a
        # file at 50 MB uncompressed; Scrapy applies download_maxsize to
        # gunzipped bodies too.
        meta: dict[str, Any] = {"download_maxsize": MAX_SITEMAP_BYTES}
        if url.endswith("/robots.txt"):
            meta[META_SKIP] = True
        else:
            meta[META_DISCOVERY] = True
        if lastmod is not None:
            meta[META_LASTMOD] = lastmod
        return Request(url, callback=self._parse_sitemap, meta=meta)

    def reseed_skip(self, state: PageState) -> bool:
        # Pages a sitemap listed this crawl were decided already; sitemaps
        # themselves are reached from robots.txt and indexes.
        return state.key.url in self._decided or state.callback == "_parse_sitemap"

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
        candidates = entries.candidates(self.sitemap_filter(sitemap))
        keys = [PageKey(ledger.scope, c.canonical) for c in candidates]
        stored = await ledger.store.get_pages(keys)
        now = time.time()
        if sitemap.type == "sitemapindex":
            # An index's lastmod says when each child sitemap changed: a
            # child that did not change is not read again.
            for child, key in zip(candidates, keys, strict=True):
                if not any(rule.search(child.loc) for rule in self._follow):
                    continue
                reason = decide(
                    child, stored.get(key), use_lastmod=self.use_lastmod,
                    max_age=ledger.config.max_age, now=now,
                )
                if reason is None:
                    stats.inc_value("incremental/sitemap/child_unchanged")
                    continue
                yield self._sitemap_request(child.loc, child.lastmod)
            return
        use_lastmod = self.use_lastmod and await self._lastmods_trusted(
            ledger, entries.host, candidates, now
        )
        for candidate, key in zip(candidates, keys, strict=True):
            self._decided.add(candidate.canonical)
            reason = decide(
                candidate, stored.get(key), use_lastmod=use_lastmod,
                max_age=ledger.config.max_age, now=now,
            )
            if reason is None:
                stats.inc_value("incremental/lastmod/skipped")
                continue
            stats.inc_value(f"incremental/lastmod/requested/{reason}")
            callback = next((cb for rule, cb in self._cbs if rule.search(candidate.loc)), None)
            if callback is None:
                continue
            meta = {}
            if use_lastmod and candidate.lastmod is not None:
                meta[META_LASTMOD] = candidate.lastmod
            yield Request(candidate.loc, callback=callback, meta=meta)

    async def _lastmods_trusted(
        self, ledger: Ledger, host: str, candidates: list[Candidate], now: float
    ) -> bool:
        trust = await ledger.trust.load(host)
        if not ledger.trust.trusted(trust, now):
            self.crawler.stats.inc_value("incremental/lastmod/distrusted_sitemaps")
            return False
        dated = [c.lastmod for c in candidates if c.lastmod is not None]
        generated = sum(1 for lastmod in dated if abs(now - lastmod) <= GENERATED_WINDOW)
        if len(dated) >= GENERATED_MIN_ENTRIES and generated >= GENERATED_SHARE * len(dated):
            # Every lastmod is "now": the sitemap stamps its generation time.
            ledger.trust.distrust(trust, now, "its lastmods are the time the sitemap was made")
            self.crawler.stats.inc_value("incremental/lastmod/distrusted_sitemaps")
            return False
        return True

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
