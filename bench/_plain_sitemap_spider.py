"""The plain-Scrapy baseline of ``cold_overhead.py`` (not a benchmark itself).

``scrapy runspider bench/_plain_sitemap_spider.py -a sitemap_url=URL``: Scrapy's
own ``SitemapSpider``, nothing of the project loaded, emitting the fields our
``sitemap`` spider emits (``url``, ``title``, ``text``, ``fingerprint``) with
an equally careful main-text extraction written for speed on the lxml tree
Scrapy already parsed: the first ``main``, ``[role=main]``, ``article`` or
``body`` element, its text nodes outside ``script``/``style``/``noscript``
(above it too), whitespace folded; the same text as ours, which
``cold_overhead.py`` checks. The fingerprint is a SHA-256 of title and text.

``-a if_none_match=*`` sends every page request with that ``If-None-Match``
(sitemaps are asked as usual): a server with the page answers 304, which
Scrapy's ``HttpErrorMiddleware`` drops before ``parse``. Nothing is stored
or read: the least a Scrapy process can spend asking every page of a
sitemap whether it changed (``cold_overhead.py``'s ``scrapy-304s``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from lxml import etree
from scrapy.spiders import SitemapSpider

_EXCLUDED = ("script", "style", "noscript")
_MAIN = tuple(etree.XPath(q) for q in (
    "descendant-or-self::main", "descendant-or-self::*[@role = 'main']",
    "descendant-or-self::article", "descendant-or-self::body"))
_TITLE = etree.XPath("descendant-or-self::title/text()", smart_strings=False)
_ALL_TEXT = etree.XPath("descendant::text()", smart_strings=False)
_TEXT_OUTSIDE = etree.XPath(
    "descendant::text()[not(ancestor::script or ancestor::style or ancestor::noscript)]",
    smart_strings=False)


def main_text(root: Any) -> str:
    for query in _MAIN:
        found = query(root)
        if found:
            node = found[0]
            if (next(node.iter(*_EXCLUDED), None) is None
                    and next(node.iterancestors(*_EXCLUDED), None) is None):
                texts = _ALL_TEXT(node)  # nothing to leave out: no predicate
            else:
                texts = _TEXT_OUTSIDE(node)
            return " ".join(" ".join(texts).split())
    return ""


class PlainSitemapSpider(SitemapSpider):
    name = "plain_sitemap"

    def __init__(self, sitemap_url: str, if_none_match: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sitemap_urls = [sitemap_url]
        self.if_none_match = if_none_match

    def _parse_sitemap(self, response: Any) -> Any:
        for request in super()._parse_sitemap(response):
            if self.if_none_match and request.callback != self._parse_sitemap:
                request.headers["If-None-Match"] = self.if_none_match
            yield request

    def parse(self, response: Any) -> Any:
        root = response.selector.root
        titles = _TITLE(root)
        title = titles[0].strip() if titles else ""
        text = main_text(root)
        fingerprint = hashlib.sha256(f"{title}\0{text}".encode()).hexdigest()[:16]
        yield {"url": response.url, "title": title, "text": text, "fingerprint": fingerprint}
