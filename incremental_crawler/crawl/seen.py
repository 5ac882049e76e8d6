"""Which request fingerprints the scheduler's dupefilter already saw this crawl.

A replayed request whose fingerprint the dupefilter saw would be built,
sent through every spider middleware and then dropped by the scheduler: a
replay leaves it out unread instead (:mod:`.replay`). That is exact because
the fingerprint recorded is the one the dupefilter computes, of the request
as it left the spider middlewares, and the spider middlewares make the same
request of the same recipe again; the dupefilter only ever learns more
fingerprints during a crawl, so one seen when the replay asks is still seen
when the request would have reached it.

Only dupefilters whose memory can be read are asked: Scrapy's own
``RFPDupeFilter`` (its fingerprints, with the crawl's fingerprinter), and a
dupefilter that says itself, with a ``seen_fingerprints(fingerprints)``
method returning the subset of the hex fingerprints it saw (the cluster's,
in Redis: one ``SMISMEMBER`` per replayed page). Any other class
(``BaseDupeFilter`` lets every request through; a subclass may decide
otherwise) gets the full replay: every recorded request is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.dupefilters import RFPDupeFilter

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scrapy.crawler import Crawler

__all__ = ["seen_reader"]


def seen_reader(crawler: Crawler) -> Callable[[Sequence[str]], set[str]] | None:
    """How to ask the crawl's dupefilter what it saw (``None``: it cannot be asked)."""
    engine = crawler.engine
    scheduler = engine.scheduler if engine is not None else None
    df = getattr(scheduler, "df", None)
    if df is None:
        return None
    if type(df) is RFPDupeFilter and df.fingerprinter is crawler.request_fingerprinter:
        return _local(df)
    seen = getattr(df, "seen_fingerprints", None)
    return seen if callable(seen) else None


def _local(df: RFPDupeFilter) -> Callable[[Sequence[str]], set[str]]:
    # The set itself (RFPDupeFilter.fingerprints makes a copy, and is deprecated).
    known: set[bytes] = df._fingerprints

    def seen(fingerprints: Sequence[str]) -> set[str]:
        return {fp for fp in fingerprints if bytes.fromhex(fp) in known}

    return seen
