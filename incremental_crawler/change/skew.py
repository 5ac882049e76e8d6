"""Our own clock going backwards: pages checked "in the future".

A crawl run while the clock was fast (say five days) stored every page's
last check, and counted every next visit, from that clock. Once the clock
is put right, those next visits lie days ahead: without this, the crawls
of the following days would request none of those pages, miss their
changes, and say nothing, until the real time caught up.

The rule (:func:`~.policy.schedule_due`): a page whose last check is later
than now, by more than the tolerance (:func:`skew_tolerance`), was really
checked at some moment before now that no one knows; the next visit
counted from it says nothing, so the page is due. Capping its next visit at
now plus its interval would not do: that cap moves with every crawl's now,
and the page, really checked up to an interval ago, would wait a whole
interval more at each crawl until the clock caught up.

:class:`ClockSkew` does the rest, for one crawl:

- when the crawl opens, it compares the crawl's start with the newest crawl
  start recorded for the scope (:class:`~incremental_crawler.report.history.CrawlHistory`);
  an earlier one is warned about once, naming the skew, and the next
  visits of the pages checked in the future are brought forward to the
  crawl's start in the store (the stores' due reads, which the re-seeder
  uses, select by next visit: the Redis store's revisit index never finds a
  page by its last check). Their last checks are kept: they are what the
  clock said, and keep the pages due until a visit stores a true one;
- a page checked in the future that a decision meets (the history may not
  show the skew: a crawl killed before its record was stored) is warned
  about once per crawl; ``incremental/clock/checked_ahead`` is how far
  ahead of now the furthest such check was (seconds).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from incremental_crawler import clock

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

    from incremental_crawler.state.records import PageState
    from incremental_crawler.state.stores.base import StateStore

__all__ = ["ClockSkew", "skew_tolerance"]

logger = logging.getLogger(__name__)

#: The least skew that counts: clocks of a cluster's workers differ by
#: seconds, and stored times are whole seconds.
MIN_TOLERANCE = 60.0


def skew_tolerance(due_tolerance: float) -> float:
    """How far ahead of now a last check may be before it counts as "in the future".

    INCREMENTAL_DUE_TOLERANCE (at least :data:`MIN_TOLERANCE`): a clock fast
    by less than it shifts next visits by less than the tolerance every due
    decision allows anyway.

    >>> skew_tolerance(3600), skew_tolerance(0)
    (3600, 60.0)
    """
    return max(MIN_TOLERANCE, due_tolerance)


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(seconds: float) -> str:
    days, rest = divmod(round(seconds), 86_400)
    hours, rest = divmod(rest, 3600)
    return (f"{days} d " if days else "") + f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


class ClockSkew:
    """One crawl's view of a clock gone backwards; see the module docstring."""

    def __init__(self, store: StateStore, scope: str, stats: StatsCollector | None,
                 tolerance: float) -> None:
        self.store = store
        self.scope = scope
        self.stats = stats
        self.tolerance = tolerance
        #: Warned this crawl already (once is enough: it names the skew).
        self.warned = False

    def checked_by(self) -> float:
        """A page whose last check is after this was checked in the future."""
        return clock.now() + self.tolerance

    def notice(self, state: PageState | None) -> None:
        """Count, and warn once about, a page a decision met checked in the future."""
        if state is None or state.last_checked <= self.checked_by():
            return
        ahead = state.last_checked - clock.now()
        if self.stats is not None:
            self.stats.max_value("incremental/clock/checked_ahead", round(ahead))
        if not self.warned:
            self.warned = True
            logger.warning(
                "Our clock is behind the state store's: %(url)s was last checked at "
                "%(checked)s, %(ahead)s after now (the clock was fast then, or is slow "
                "now). Pages checked after now are due: their next visits, counted "
                "from that clock, are not trusted",
                {"url": state.key.url, "checked": _when(state.last_checked),
                 "ahead": _span(ahead)})

    def crawl_opened(self, started: float) -> list[PageState]:
        """Warn if this crawl starts before the scope's newest recorded crawl
        did; then the states of the pages checked in the future, their next
        visits brought forward to *started*, for the caller to stage."""
        newest = self.store.crawls(self.scope, 1)
        if not newest or newest[0].started <= started + self.tolerance:
            return []
        checked_by = self.checked_by()
        moved = [state.copy(next_visit=started) for state in self.store.iter_pages(self.scope)
                 if state.last_checked > checked_by and state.next_visit > started]
        self.warned = True
        if self.stats is not None:
            self.stats.set_value("incremental/clock/behind_last_crawl",
                                 round(newest[0].started - started))
            self.stats.set_value("incremental/clock/next_visits_brought_forward", len(moved))
        logger.warning(
            "Our clock is behind the state store's: this crawl started at %(started)s, "
            "%(behind)s before the last recorded crawl of scope %(scope)r (%(last)s); the "
            "clock was fast then, or is slow now. Pages checked after now are due: "
            "%(n)d next visits counted from that clock brought forward to now",
            {"started": _when(started), "behind": _span(newest[0].started - started),
             "scope": self.scope, "last": _when(newest[0].started), "n": len(moved)})
        return moved
