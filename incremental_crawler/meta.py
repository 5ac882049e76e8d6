"""The request meta keys a spider may set (``Request(url, meta={...})``)."""

from __future__ import annotations

__all__ = ["META_DISCOVERY", "META_LASTMOD", "META_REFRESH", "META_SKIP", "META_VARIANT"]

#: ``True`` opts a request out entirely (no validators sent, no state kept).
META_SKIP = "incremental_skip"
#: ``True`` fetches without conditions but keeps the state.
META_REFRESH = "incremental_refresh"
#: The page's lastmod (POSIX time) as its sitemap or feed announced it; a
#: newer one overrides the revisit schedule, and it is stored with the
#: page's data.
META_LASTMOD = "incremental_lastmod"
#: ``True`` for a page that lists others (a sitemap, a feed): fetched
#: conditionally whatever its revisit schedule, and its state is saved only
#: when the crawl finishes cleanly.
META_DISCOVERY = "incremental_discovery"
#: Which version of a URL this client gets (region, language, proxy exit):
#: each variant keeps its own validators.
META_VARIANT = "incremental_variant"
