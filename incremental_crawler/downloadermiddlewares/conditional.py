"""Old import path of the conditional middleware and its exceptions.

Kept so that ``from incremental_crawler.downloadermiddlewares.conditional
import NotModified`` (an errback's check) and the ``META_*`` keys keep
working; the exceptions live in :mod:`incremental_crawler.exceptions`, the
meta keys in :mod:`incremental_crawler.meta`, the middleware in
:mod:`incremental_crawler.crawl.conditional`.
"""

from incremental_crawler.crawl.conditional import ConditionalRequestMiddleware
from incremental_crawler.exceptions import NotDue, NotModified
from incremental_crawler.meta import META_DISCOVERY, META_LASTMOD, META_REFRESH, META_SKIP

__all__ = [
    "META_DISCOVERY", "META_LASTMOD", "META_REFRESH", "META_SKIP",
    "ConditionalRequestMiddleware", "NotDue", "NotModified",
]
