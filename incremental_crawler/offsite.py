"""Whether Scrapy's OffsiteMiddleware drops a request, asked ahead of it.

Scrapy 2.19 drops offsite requests in its downloader middleware's
``request_scheduled`` handler, before the scheduler, with no signal saying
so. Code that must know the fate of a request it does not send itself (the
walk over stored links, the move of a page to another site) asks the same
middleware instance the same question, so both answer alike (a project's
subclass overriding ``should_follow`` included).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from scrapy import Request
from scrapy.downloadermiddlewares.offsite import OffsiteMiddleware

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Spider
    from scrapy.crawler import Crawler

__all__ = ["offsite_check", "offsite_drops", "offsite_url_drops"]


#: An http(s) URL's scheme and authority (urlsplit's netloc: up to the
#: first ``/``, ``?`` or ``#``), matched rather than split: a walk asks it
#: for every distinct stored request.
_SITE = re.compile(r"https?://[^/?#]*")


def _enabled(crawler: Crawler) -> tuple[OffsiteMiddleware, Spider] | None:
    """The crawl's OffsiteMiddleware and spider, when it is enabled."""
    engine = crawler.engine
    downloader = engine.downloader if engine is not None else None
    middlewares = downloader.middleware.middlewares if downloader is not None else ()
    found = next((mw for mw in middlewares if isinstance(mw, OffsiteMiddleware)), None)
    spider = crawler.spider
    if found is None or spider is None:
        return None
    return found, spider


def offsite_check(crawler: Crawler) -> str | None:
    """What the crawl's offsite check answers from, for a memo of its
    answers: Scrapy's OffsiteMiddleware (``""``: none enabled) and the host
    pattern it built from the spider's ``allowed_domains`` (a project's
    ``get_host_regex`` included). ``None`` when the project's middleware
    overrides ``should_follow``: it may read anything."""
    enabled = _enabled(crawler)
    if enabled is None:
        return ""
    offsite, spider = enabled
    if type(offsite).should_follow is not OffsiteMiddleware.should_follow:
        return None
    pattern = getattr(getattr(offsite, "host_regex", None), "pattern", None)
    if pattern is None:
        pattern = repr(getattr(spider, "allowed_domains", None))
    return f"{type(offsite).__module__}.{type(offsite).__qualname__} {pattern}"


def offsite_drops(crawler: Crawler) -> Callable[[Request], bool]:
    """``drops(request)``: whether the crawl's OffsiteMiddleware drops *request*
    (never, when it is not enabled). Ask once the engine runs."""
    enabled = _enabled(crawler)
    if enabled is None:
        return lambda request: False
    offsite, spider = enabled

    def drops(request: Request) -> bool:
        return not (request.dont_filter or request.meta.get("allow_offsite")
                    or offsite.should_follow(request, spider))

    return drops


def offsite_url_drops(crawler: Crawler) -> Callable[[str], bool] | None:
    """``drops(url)``: :func:`offsite_drops` for a request of *url* without
    ``dont_filter`` or ``allow_offsite``, asked once per scheme and host:
    Scrapy's own ``should_follow`` reads nothing of a request but its host
    name. ``None`` when the project's OffsiteMiddleware overrides
    ``should_follow`` (it may read more: ask :func:`offsite_drops`).

    Meant for one pass over many stored requests (the spider's
    ``allowed_domains`` is read as the pass begins)."""
    enabled = _enabled(crawler)
    if enabled is None:
        return lambda url: False
    offsite, spider = enabled
    if type(offsite).should_follow is not OffsiteMiddleware.should_follow:
        return None
    answers: dict[str, bool] = {}

    def drops(url: str) -> bool:
        site = _SITE.match(url)
        if site is None:
            return not offsite.should_follow(Request(url), spider)
        answer = answers.get(site.group())
        if answer is None:
            # A request of the site's root has the URL's host name.
            root = Request(f"{site.group()}/")
            answer = answers[site.group()] = not offsite.should_follow(root, spider)
        return answer

    return drops
