"""The ``twisted.web`` site that answers ``GET /metrics`` for :mod:`.endpoint`.

A module of its own so that Twisted's web server is imported only by
crawls that serve metrics: the endpoint's module is imported by every crawl
(the add-on lists the extension), and Scrapy's own crawl needs no server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twisted.web import resource, server

if TYPE_CHECKING:
    from collections.abc import Callable

    from prometheus_client import CollectorRegistry
    from twisted.web import http

__all__ = ["METRICS_PATH", "metrics_site"]

#: The path Prometheus scrapes by default.
METRICS_PATH = b"/metrics"


def metrics_site(registry: CollectorRegistry, scraped: Callable[[], None]) -> server.Site:
    """The site serving *registry* at ``/metrics``; *scraped* is called after each scrape."""
    return _QuietSite(_MetricsPage(registry, scraped))


class _MetricsPage(resource.Resource):
    """``GET /metrics``: the registry in the format the scraper accepts; 404
    for any other path."""

    isLeaf = True  # noqa: N815 (Twisted API)

    def __init__(self, registry: CollectorRegistry, scraped: Callable[[], None]) -> None:
        super().__init__()
        self.registry = registry
        self.scraped = scraped

    def render_GET(self, request: server.Request) -> bytes:  # noqa: N802 (Twisted API)
        from prometheus_client.exposition import choose_encoder  # noqa: PLC0415 (opt-in)

        if request.path != METRICS_PATH:
            request.setResponseCode(404)
            return b"Not found: the metrics are at /metrics\n"
        accept = request.getHeader(b"accept")
        encoder, content_type = choose_encoder(accept.decode("latin-1") if accept else "")
        body = encoder(self.registry)
        request.setHeader(b"Content-Type", content_type.encode())
        self.scraped()
        return body


class _QuietSite(server.Site):
    """No access log line per scrape."""

    noisy = False

    def log(self, request: http.Request) -> None:
        pass
