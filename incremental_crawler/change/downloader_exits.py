"""Every exception that leaves Scrapy's downloader middlewares, seen in one place.

Scrapy (2.19, ``scrapy/core/downloader/middleware.py``) hands an exception
raised by a download or by a ``process_request`` to the middlewares'
``process_exception`` methods, but one raised by a ``process_response``
goes straight out of the chain to the request's errback: no middleware
sees it, and no signal tells. HttpCompressionMiddleware raises there on a
body that is not the encoding its header names, or that decompresses past
DOWNLOAD_MAXSIZE; RedirectMiddleware raises ``IgnoreRequest`` there when
REDIRECT_MAX_TIMES is exceeded; so may a user's middleware. A page whose
answer ended that way brought no data and must be recorded as a failure,
or a sitemap answering 304 next time hides it.

The one place every exception leaving the chain passes is the middleware
manager's ``download_async``, which the downloader calls for each request.
:func:`watch_downloader_exits` wraps it on the crawler's engine (once the
engine exists: when the spider opens) and hands each exception to a
watcher before it goes on, unchanged, to the errback.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["watch_downloader_exits"]

logger = logging.getLogger(__name__)



def watch_downloader_exits(
    crawler: Crawler, watcher: Callable[[Request, Exception], Awaitable[None]]
) -> bool:
    """Call *watcher* with every exception leaving the engine's downloader middlewares.

    Returns whether it could (``False``: the engine has no such manager).
    The watcher's own errors are logged, never raised: the exception it
    was shown goes on as it was.
    """
    downloader = getattr(crawler.engine, "downloader", None)
    manager: Any = getattr(downloader, "middleware", None)
    download = getattr(manager, "download_async", None)
    if download is None:
        return False

    async def download_async(
        download_func: Callable[[Request], Coroutine[Any, Any, Response]], request: Request
    ) -> Response | Request:
        try:
            result: Response | Request = await download(download_func, request)
        except Exception as exc:
            try:
                await watcher(request, exc)
            except Exception:
                logger.exception("Could not record the failure of %(request)s",
                                 {"request": request}, extra={"spider": crawler.spider})
            raise
        return result

    manager.download_async = download_async
    return True
