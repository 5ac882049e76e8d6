"""Whether Scrapy's OffsiteMiddleware drops a request, asked ahead of it.

Scrapy 2.19 drops offsite requests in its downloader middleware's
``request_scheduled`` handler, before the scheduler, with no signal saying
so. Code that must know the fate of a request it does not send itself (the
walk over stored links, the move of a page to another site) asks the same
middleware instance the same question, so both answer alike (a project's
subclass overriding ``should_follow`` included).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.downloadermiddlewares.offsite import OffsiteMiddleware

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler

__all__ = ["offsite_drops"]


def offsite_drops(crawler: Crawler) -> Callable[[Request], bool]:
    """``drops(request)``: whether the crawl's OffsiteMiddleware drops *request*
    (never, when it is not enabled). Ask once the engine runs."""
    engine = crawler.engine
    downloader = engine.downloader if engine is not None else None
    middlewares = downloader.middleware.middlewares if downloader is not None else ()
    found = next((mw for mw in middlewares if isinstance(mw, OffsiteMiddleware)), None)
    spider = crawler.spider
    if found is None or spider is None:
        return lambda request: False
    offsite = found

    def drops(request: Request) -> bool:
        return not (request.dont_filter or request.meta.get("allow_offsite")
                    or offsite.should_follow(request, spider))

    return drops
