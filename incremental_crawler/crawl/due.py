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

from incremental_crawler.change.accounting import decided
from incremental_crawler.change.policy import ChangePolicy
from incremental_crawler.meta import META_DISCOVERY, META_LASTMOD, META_REFRESH, META_SKIP
from incremental_crawler.state.keys import page_key

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from incremental_crawler.change.accounting import Why
    from incremental_crawler.config import IncrementalConfig
    from incremental_crawler.crawl.ledger import Ledger
    from incremental_crawler.state.records import PageKey, PageState

__all__ = ["RequestRules", "default_encoding"]

_COMPRESSION = "scrapy.downloadermiddlewares.httpcompression.HttpCompressionMiddleware"


def default_encoding(crawler: Crawler) -> bytes | None:
    """The Accept-Encoding a request without one goes out with (None: no header)."""
    settings = crawler.settings
    enabled = settings.getwithbase("DOWNLOADER_MIDDLEWARES").get(_COMPRESSION) is not None
    if not (enabled and settings.getbool("COMPRESSION_ENABLED")):
        return None
    return b", ".join(ACCEPTED_ENCODINGS)


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
        ledger.clock_skew.notice(prior)
        meta = request.meta
        return self.policy.why(prior, refresh=bool(meta.get(META_REFRESH)),
                               discovery=bool(meta.get(META_DISCOVERY)),
                               lastmod=meta.get(META_LASTMOD), links_unknown=links_unknown,
                               started=ledger.crawl_started, due_at=ledger.due_at,
                               checked_by=ledger.clock_skew.checked_by(),
                               recheck_all=ledger.recheck_all)

    def due(self, request: Request, prior: PageState, *, links_unknown: bool,
            ledger: Ledger) -> bool:
        """Whether *prior*'s page may be requested in this crawl: its
        :meth:`why` says so."""
        return self.why(request, prior, links_unknown=links_unknown, ledger=ledger).requested
