"""Old import path of the conditional middleware and its exceptions.

Kept so that ``from incremental_crawler.downloadermiddlewares.conditional
import NotModified`` (an errback's check) keeps working; the exceptions live
in :mod:`incremental_crawler.exceptions`, the middleware in
:mod:`incremental_crawler.change.middleware`.
"""

from incremental_crawler.change.middleware import ConditionalRequestMiddleware
from incremental_crawler.exceptions import NotDue, NotModified

__all__ = ["ConditionalRequestMiddleware", "NotDue", "NotModified"]
