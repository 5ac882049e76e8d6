"""Which of a spider's requests the conditional middleware handles, the
page each asks for, and whether that page is due this crawl: one set of
rules (:class:`RequestRules`) for every place that asks.

The spider middleware :mod:`.due_filter` drops requests for pages that are
not due as they leave a callback; the conditional downloader middleware
(:mod:`.conditional`) decides again for whatever reaches it (and counts
why: :meth:`RequestRules.why`); the stored-graph walk (:mod:`.inert`) and
robots.txt's refusals ask the same, so a request is never dropped by one
and sent by the other for a different reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy.downloadermiddlewares.httpcompression import ACCEPTED_ENCODINGS
from scrapy.http.request import NO_CALLBACK

from incremental_crawler.change.accounting import META_WHY, decided
from incremental_crawler.change.policy import ChangePolicy
from incremental_crawler.meta import (
    META_DISCOVERY,
    META_LASTMOD,
    META_REFRESH,
    META_SKIP,
    META_VARIANT,
)
from incremental_crawler.state.keys import page_key
from incremental_crawler.state.records import PageKey

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from incremental_crawler.change.accounting import Why
    from incremental_crawler.config import IncrementalConfig
    from incremental_crawler.crawl.ledger import Ledger
    from incremental_crawler.state.records import PageState

__all__ = ["RULES_META", "RequestRules", "default_encoding"]

_COMPRESSION = "scrapy.downloadermiddlewares.httpcompression.HttpCompressionMiddleware"


def default_encoding(crawler: Crawler) -> bytes | None:
    """The Accept-Encoding a request without one goes out with (None: no header)."""
    settings = crawler.settings
    enabled = settings.getwithbase("DOWNLOADER_MIDDLEWARES").get(_COMPRESSION) is not None
    if not (enabled and settings.getbool("COMPRESSION_ENABLED")):
        return None
    return b", ".join(ACCEPTED_ENCODINGS)


#: The meta keys :class:`RequestRules` read of a request (and Scrapy's
#: OffsiteMiddleware, ``allow_offsite``), besides its method, callback, URL,
#: ``dont_filter`` and ``Accept-Encoding``. A GET with none of them, no
#: headers and no ``dont_filter`` is decided by its URL alone
#: (:meth:`RequestRules.plain_key`, :meth:`RequestRules.plain_due`).
RULES_META = frozenset({META_SKIP, META_DISCOVERY, META_REFRESH, META_LASTMOD, META_VARIANT,
                        META_WHY, "allow_offsite"})


@dataclass(frozen=True, slots=True)
class RequestRules:
    """What the crawl's rules say of a spider's request: whether the
    conditional middleware handles it, the store key of its page, whether
    its page's links are replayed, and why its page is requested (or not)."""

    policy: ChangePolicy
    #: Whether pages' yielded requests are recorded and replayed: not for a
    #: spider that opts out (``incremental_replay = False``: our sitemap and
    #: feed spiders, which decide on their lists' entries themselves).
    replay: bool
    #: The Accept-Encoding a request without one goes out with.
    encoding: bytes | None

    @classmethod
    def for_crawler(cls, crawler: Crawler, config: IncrementalConfig, spider: Spider) -> Self:
        replay = config.replay_enabled and bool(getattr(spider, "incremental_replay", True))
        return cls(ChangePolicy.from_config(config), replay, default_encoding(crawler))

    @staticmethod
    def applies(request: Request) -> bool:
        """Whether the conditional middleware handles *request* at all.

        Only GETs whose response goes to a spider callback: engine-level
        downloads (robots.txt, NO_CALLBACK) have no items to wait for.
        """
        return (
            request.method == "GET"
            and request.callback is not NO_CALLBACK
            and not request.meta.get(META_SKIP)
        )

    def replays(self, request: Request) -> bool:
        """Whether the page's yielded requests are recorded and replayed.

        Not for sitemaps and feeds (META_DISCOVERY): a list is read in full
        when it changed and otherwise its entries are decided by their own
        lastmods and states.
        """
        return self.replay and not request.meta.get(META_DISCOVERY)

    def key(self, request: Request, ledger: Ledger) -> PageKey:
        """The store key of the page *request* asks for (as the downloader sends it)."""
        return page_key(request, ledger.scope, ledger.canonical, default_encoding=self.encoding)

    def plain_key(self, url: str, ledger: Ledger) -> PageKey:
        """:meth:`key` of a plain GET of *url* (see :data:`RULES_META`):
        without an Accept-Encoding of its own, its page is the URL's default
        variant."""
        return PageKey(ledger.scope, ledger.canonical(url), "")

    def plain_due(self, prior: PageState, *, links_unknown: bool, ledger: Ledger) -> bool:
        """:meth:`due` for a plain GET (see :data:`RULES_META`): nothing
        forces it, no date comes with it, and it was not decided before."""
        return self._why(prior, ledger, links_unknown=links_unknown).requested

    def why(self, request: Request, prior: PageState, *, links_unknown: bool,
            ledger: Ledger) -> Why:
        """Why *prior*'s page is requested in this crawl (the ledger's start
        and ``due_at``), or why not; see :meth:`ChangePolicy.why`.

        A request whose page was decided already this crawl (a list spider's,
        the re-seeder's: :func:`~incremental_crawler.change.accounting.decided`)
        is not decided again: its why is the one decided.
        """
        if (why := decided(request)) is not None:
            return why
        meta = request.meta
        return self._why(prior, ledger, refresh=bool(meta.get(META_REFRESH)),
                         discovery=bool(meta.get(META_DISCOVERY)),
                         lastmod=meta.get(META_LASTMOD), links_unknown=links_unknown)

    def _why(self, prior: PageState, ledger: Ledger, *, refresh: bool = False,
             discovery: bool = False, lastmod: float | None = None,
             links_unknown: bool) -> Why:
        ledger.clock_skew.notice(prior)
        return self.policy.why(prior, refresh=refresh, discovery=discovery, lastmod=lastmod,
                               links_unknown=links_unknown, started=ledger.crawl_started,
                               due_at=ledger.due_at, checked_by=ledger.clock_skew.checked_by(),
                               recheck_all=ledger.recheck_all)

    def due(self, request: Request, prior: PageState, *, links_unknown: bool,
            ledger: Ledger) -> bool:
        """Whether *prior*'s page may be requested in this crawl: its
        :meth:`why` says so."""
        return self.why(request, prior, links_unknown=links_unknown, ledger=ledger).requested
