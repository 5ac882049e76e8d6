"""How requests and items are keyed in the state store."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from w3lib.url import canonicalize_url

from incremental_crawler.meta import META_VARIANT
from incremental_crawler.state.records import PageKey

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request

__all__ = ["Canonicalizer", "canonical_url", "page_key"]

def canonical_url(url: str) -> str:
    """The URL as stored: canonical, so equivalent spellings share state.

    >>> canonical_url("http://Example.com/a?b=2&a=1#frag")
    'http://example.com/a?a=1&b=2'
    """
    return canonicalize_url(url)


# URLs that are canonical already: lowercase host, a path of unreserved
# characters with no dot segment, no query, no fragment, no escapes. Most
# sitemap URLs look like this; canonicalize_url would return them unchanged
# (tests/unit/test_keys.py checks that against w3lib).
_ALREADY_CANONICAL = re.compile(r"https?://[a-z0-9.-]+(?::[0-9]+)?/(?!\.)(?:[A-Za-z0-9_~-]|/(?!\.)|\.)*")


class Canonicalizer:
    """:func:`canonical_url` with a fast path and a small bounded memo.

    A page's URL is canonicalised for its request and again for the item
    extracted from it, and a sitemap's 50,000 URLs once each:
    canonicalisation is the costliest step of keying.
    """

    def __init__(self, size: int = 2048) -> None:
        self._size = size
        self._memo: dict[str, str] = {}

    def __call__(self, url: str) -> str:
        if _ALREADY_CANONICAL.fullmatch(url):
            return url
        # The same with a fragment, which canonicalisation drops: links to
        # a page's sections (a manual's cross references, each its own URL)
        # would otherwise each go through canonicalize_url.
        base, mark, _ = url.partition("#")
        if mark and _ALREADY_CANONICAL.fullmatch(base):
            return base
        canonical = self._memo.get(url)
        if canonical is None:
            if len(self._memo) >= self._size:
                self._memo.clear()
            canonical = self._memo[url] = canonical_url(url)
        return canonical


def _encoding_token(value: bytes | str | None) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return "".join(value.split()).lower()


def page_key(
    request: Request, scope: str, canonical: Callable[[str], str] = canonical_url,
    *, default_encoding: bytes | None = None,
) -> PageKey:
    """The store key of the page *request* asks for.

    A request whose ``Accept-Encoding`` is not *default_encoding* (what the
    crawl sends when the request sets none) asks for another representation
    of the URL, with its own validators (RFC 9110 §8.8.3.3: the gzip and
    identity variants have different ETags): it gets its own variant, so
    the two never overwrite each other's validators.

    >>> from scrapy import Request
    >>> page_key(Request("http://a/"), "s", default_encoding=b"gzip, br")
    PageKey(scope='s', url='http://a/', variant='')
    >>> page_key(Request("http://a/", headers={"Accept-Encoding": "identity"}), "s",
    ...          default_encoding=b"gzip, br").variant
    'ae=identity'
    """
    variant = str(request.meta.get(META_VARIANT) or "")
    encoding = _encoding_token(request.headers.get(b"Accept-Encoding"))
    if encoding and encoding != _encoding_token(default_encoding):
        tag = f"ae={encoding}"
        variant = f"{variant}|{tag}" if variant else tag
    return PageKey(scope, canonical(request.url), variant)
