"""The sitemaps a robots.txt names, read as the big crawlers read them.

Scrapy's ``sitemap_urls_from_robots`` takes a line only when it starts with
``sitemap:``: it misses ``Site-map:`` (Google's parser accepts that spelling),
a line whose key and value are separated by whitespace only
(``Sitemap http://...``), lines ended by a lone CR (old Mac files), and the
first line when the file starts with a UTF-8 byte order mark. Protego, the
parser Scrapy obeys robots.txt with, reads all of these; its ``sitemaps``
are used here, the BOM removed first, relative URLs resolved against
robots.txt's own URL (as Scrapy does), each URL once, in file order.

The allow/disallow rules need nothing of ours: Protego already accepts the
misspellings Google's open-source parser tolerates (``dissallow``,
``dissalow``, ``disalow``, ``diasllow``, ``disallaw``, ``useragent``,
``user agent``) and a byte order mark (Scrapy decodes it away).
"""

from __future__ import annotations

from urllib.parse import urljoin

from protego import Protego

__all__ = ["sitemap_urls_from_robots"]


def sitemap_urls_from_robots(body: bytes, *, base_url: str) -> list[str]:
    """The sitemap URLs robots.txt *body* names, absolute, each once, in order."""
    text = body.decode("utf-8-sig", errors="replace")
    urls: dict[str, None] = {}
    for url in Protego.parse(text).sitemaps:
        if url := url.strip():
            urls.setdefault(urljoin(base_url, url), None)
    return list(urls)
