"""A page's recorded requests, yielded again through a stand-in response.

When a page answers 304 (or is not due) the change-detection middleware
returns, instead of raising ``NotModified`` (or ``NotDue``), a *stand-in*
response: status 304, no body, flagged ``incremental_replay``, whose
``.request`` is a copy of the page's request with our replay function as
its callback. Scrapy's scraper calls ``response.request.callback``, so the
requests the function returns leave through every spider middleware
(depth, referer, URL length, the user's own) exactly as the page's own
callback output did, then meet the scheduler's dupefilter and the offsite
check: the crawl goes on behind an unchanged page as if its callback had
run. The user's callback is not called (there is no body to parse), nor is
the request's errback.

A page's requests are replayed at most once per crawl: a request the page
yielded to itself with ``dont_filter`` (a callback retrying its own page)
would otherwise replay it for ever, the 304 never changing. A page asked
again in the same crawl ends in ``NotModified`` or ``NotDue`` as before.

A recorded request whose fingerprint the scheduler's dupefilter already
saw this crawl is left out unread (:mod:`.seen`): built and sent through
the spider middlewares, it would only be dropped by the scheduler. So a
page's links cost a replay what is still new to the crawl, not what the
page holds (an index page of a thousand links, all reached already, costs a
set lookup each). A page answering 304 whose recorded requests were all
seen already gets no stand-in at all: its request ends there, calling
neither its callback nor its errback, as the stand-in would have ended it
(it then counts no ``response_received``, as Scrapy's page count and
``CLOSESPIDER_PAGECOUNT`` read it, and logs no "Crawled (304)" line).
``INCREMENTAL_REPLAY_SHORTCUTS = False`` builds every recorded request (the
full replay; the scheduler drops the same ones).

A recorded request that cannot be built again (its callback, errback or
CrawlSpider rule is gone) is dropped, counted, and its source page flagged
LINKS_INCOMPLETE: the next visit fetches it in full, so its callback runs
and records what it yields now.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, overload

from scrapy import Request
from scrapy.http import Response

from incremental_crawler.crawl.seen import seen_reader
from incremental_crawler.recipes import (
    NO_FINGERPRINT,
    Unbuildable,
    build,
    entry_fingerprint,
    read_record,
    recipe_in,
    record_tokens,
)
from incremental_crawler.state.records import PageFlags

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Headers
    from scrapy.statscollectors import StatsCollector

    from incremental_crawler.state.records import PageKey

__all__ = ["REPLAY_FLAG", "Replayer"]

logger = logging.getLogger(__name__)

#: The flag of a stand-in response (Scrapy logs it: ``Crawled (304) ... ['incremental_replay']``).
REPLAY_FLAG = "incremental_replay"

#: Meta keys of ours that belong to the page's own fetch, not to its stand-in.
_OURS = "_incremental_"


class Replayer:
    """Builds stand-in responses, and their requests when the scraper asks."""

    def __init__(self, crawler: Crawler, spider: Spider,
                 stage_flags: Callable[[PageKey, int], None], *, skip_seen: bool = True) -> None:
        self.crawler = crawler
        self.spider = spider
        assert crawler.stats is not None
        self.stats: StatsCollector = crawler.stats
        #: INCREMENTAL_REPLAY_SHORTCUTS: leave out what the dupefilter saw.
        self.skip_seen = skip_seen
        #: The dupefilter's reader, found on the first replay (the engine has
        #: no scheduler before the crawl starts); ``None``: none can be asked.
        self._seen: Callable[[Sequence[str]], set[str]] | None = None
        self._seen_found = not skip_seen
        #: Ledger.stage_flags, to flag a page whose request was dropped.
        self.stage_flags = stage_flags
        self._warned: set[Unbuildable] = set()
        #: Pages whose requests were replayed this crawl (see the module docstring).
        self._replayed: set[PageKey] = set()

    def first(self, key: PageKey) -> bool:
        """Whether the page's requests were not replayed yet this crawl (now they are)."""
        if key in self._replayed:
            return False
        self._replayed.add(key)
        return True

    @overload
    def response(self, request: Request, key: PageKey, data: str,
                 headers: Headers | None = None, *, always: Literal[True]) -> Response: ...

    @overload
    def response(self, request: Request, key: PageKey, data: str,
                 headers: Headers | None = None, *, always: bool = False) -> Response | None: ...

    def response(self, request: Request, key: PageKey, data: str,
                 headers: Headers | None = None, *, always: bool = False) -> Response | None:
        """The stand-in response of *request*'s page, whose links record is *data*.

        *headers* are those of the 304, if there was one (RefererMiddleware
        reads a Referrer-Policy from them, as from the page's own answer).

        ``None`` when the dupefilter already saw every request the record
        holds (see the module docstring), unless *always*: the stand-in
        would yield nothing, at the cost of Scrapy's whole path of a
        response (the spider middlewares, the callback, the scraper's
        workers). The caller (a 304's, in ``process_response``) ends the
        request as a stand-in would: neither its callback nor its errback
        is called. A page not due (``process_request``) always gets its
        stand-in: an exception raised there is counted by Scrapy as a
        download error.
        """
        if not always and self.skip_seen and self._all_seen(data):
            return None
        meta = {k: v for k, v in request.meta.items() if not k.startswith(_OURS)}
        # HttpErrorMiddleware passes only 2xx to callbacks unless told.
        meta["handle_httpstatus_list"] = [304]
        source = Request(
            request.url, callback=partial(self._requests, key, data), headers=request.headers,
            meta=meta, priority=request.priority, dont_filter=True, flags=list(request.flags),
        )
        return Response(request.url, status=304, headers=headers, flags=[REPLAY_FLAG],
                        request=source)

    def _all_seen(self, data: str) -> bool:
        """Whether the dupefilter saw every request of the links record
        *data* (a record whose requests all have a fingerprint: none with
        ``dont_filter``, which the dupefilter lets through). Counted as a
        replay that left them all out."""
        tokens = record_tokens(data, whole=True)
        if not tokens or NO_FINGERPRINT in tokens:
            # (A damaged record too: the full replay drops it, and flags the page.)
            return False
        fingerprints = [entry_fingerprint(token) for token in tokens]
        if len(self._seen_of(fingerprints)) < len(set(fingerprints)):
            return False
        self.stats.inc_value("incremental/replay/pages")
        self.stats.inc_value("incremental/replay/seen_left_out", len(tokens))
        self.stats.inc_value("incremental/replay/no_stand_in")
        return True

    def _requests(self, key: PageKey, data: str, response: Response, **_: Any) -> list[Request]:
        # A list, not a generator: Scrapy reads a generator callback's source
        # to warn about return values, on every call for a new partial.
        entries = read_record(data)
        if entries is None:
            entries = [(None, "")]  # another format: one drop, the page flagged
        seen = self._seen_of([entry_fingerprint(t) for t, _ in entries if t is not None])
        requests: list[Request] = []
        left_out = 0
        for token, entry in entries:
            if token is not None and entry_fingerprint(token) in seen:
                left_out += 1
                continue
            recipe = recipe_in(entry)
            built = build(recipe, self.spider) if isinstance(recipe, dict) else (
                Unbuildable.MALFORMED)
            if isinstance(built, Unbuildable):
                self._dropped(key, built, recipe)
            else:
                requests.append(built)
        self.stats.inc_value("incremental/replay/pages")
        self.stats.inc_value("incremental/replay/requests", len(requests))
        if left_out:
            self.stats.inc_value("incremental/replay/seen_left_out", left_out)
        logger.debug("Replaying %(n)d requests of %(url)s", {"n": len(requests), "url": key.url},
                     extra={"spider": self.spider})
        return requests

    def _seen_of(self, fingerprints: list[str]) -> set[str]:
        """Those of *fingerprints* the dupefilter already saw (none when not asked)."""
        if not self._seen_found:
            self._seen_found = True
            self._seen = seen_reader(self.crawler)
            if self._seen is None:
                logger.info(
                    "The dupefilter (DUPEFILTER_CLASS) cannot be asked which requests it "
                    "saw: every recorded request of a replayed page is built again",
                    extra={"spider": self.spider})
        if self._seen is None or not fingerprints:
            return set()
        return self._seen(fingerprints)

    def _dropped(self, key: PageKey, reason: Unbuildable, recipe: Any) -> None:
        self.stats.inc_value(f"incremental/replay/dropped/{reason}")
        # The page's callback must run next time, to yield what it yields now.
        self.stage_flags(key, PageFlags.LINKS_INCOMPLETE)
        if reason in self._warned:
            return
        self._warned.add(reason)
        logger.warning(
            "A request recorded from %(page)s cannot be made again (%(reason)s: the spider "
            "changed since the page was last fetched in full; %(recipe)s): dropped. The page "
            "is fetched in full on its next visit (stat incremental/replay/dropped/%(reason)s; "
            "this is said once).",
            {"page": key.url, "reason": reason, "recipe": _describe(recipe)},
            extra={"spider": self.spider},
        )


def _describe(recipe: Any) -> str:
    if not isinstance(recipe, dict):
        return "a record this version does not read"
    parts = [str(recipe.get("u"))]
    for key, label in (("cb", "callback"), ("eb", "errback")):
        if key in recipe:
            parts.append(f"{label} {recipe[key]!r}")
    if isinstance(recipe.get("meta"), dict) and "rule" in recipe["meta"]:
        parts.append(f"rule {recipe['meta']['rule']!r}")
    return ", ".join(parts)
