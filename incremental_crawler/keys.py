"""How requests and items are keyed in the state store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from w3lib.url import canonicalize_url

from incremental_crawler.state import PageKey

if TYPE_CHECKING:
    from scrapy import Request

__all__ = ["META_VARIANT", "canonical_url", "page_key"]

#: Request meta key: which version of a URL this client gets (region,
#: language, proxy exit). Each variant keeps its own validators.
META_VARIANT = "incremental_variant"


def canonical_url(url: str) -> str:
    """The URL as stored: canonical, so equivalent spellings share state.

    >>> canonical_url("http://Example.com/a?b=2&a=1#frag")
    'http://example.com/a?a=1&b=2'
    """
    return canonicalize_url(url)


def page_key(request: Request, scope: str) -> PageKey:
    """The store key of the page *request* asks for."""
    variant = request.meta.get(META_VARIANT) or ""
    return PageKey(scope, canonical_url(request.url), str(variant))
