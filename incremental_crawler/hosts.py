"""A URL's host, as the store keeps a host's trust and the report counts it."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["host_of"]


def host_of(url: str) -> str:
    """The host of *url*, lowercase, as the store keeps a host's trust under
    (pure: the decision modules that count import nothing from Scrapy)."""
    return (urlsplit(url).hostname or "").lower()
