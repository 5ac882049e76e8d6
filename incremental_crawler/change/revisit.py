"""Adaptive revisit intervals, after Nutch's AdaptiveFetchSchedule.

Each page carries an interval and a next-visit time. A visit that finds
the page unchanged stretches the interval by ``inc_rate``; a visit that
finds it changed shrinks it by ``dec_rate``; the interval stays within
``[minimum, maximum]``. Pages that change often are looked at often, pages
that never change drift towards ``maximum`` (and INCREMENTAL_MAX_AGE still
forces a full fetch now and then).

A page whose visit failed (see :func:`failure_next_visit`) is on another
schedule until it answers again: due on the next crawl after its first
failure in a row, then backing off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Self

    from incremental_crawler.config import IncrementalConfig

__all__ = ["RevisitSchedule", "failure_next_visit"]


def failure_next_visit(failures: int, crawl_started: float, initial: float,
                       maximum: float) -> float:
    """When a page is due again after *failures* failed visits in a row.

    The first failure makes it due at the start of the crawl it failed in,
    so the next crawl asks again whatever its interval or lastmod; the n-th
    (n >= 2) waits ``min(initial * 2 ** (n - 2), maximum)`` from that start.

    >>> [failure_next_visit(n, 1000, 3600, 10_000) for n in (1, 2, 3, 4)]
    [1000, 4600, 8200, 11000]
    """
    if failures <= 1:
        return crawl_started
    # The exponent is capped: past 2**62 the maximum holds anyway.
    return crawl_started + min(initial * 2 ** min(failures - 2, 62), maximum)


@dataclass(frozen=True, slots=True)
class RevisitSchedule:
    """See the module docstring; all durations in seconds."""

    initial: float
    minimum: float
    maximum: float
    inc_rate: float
    dec_rate: float

    @classmethod
    def from_config(cls, config: IncrementalConfig) -> Self:
        return cls(
            config.revisit_initial, config.revisit_min, config.revisit_max,
            config.revisit_inc_rate, config.revisit_dec_rate,
        )

    def after_visit(self, interval: float, *, changed: bool, now: float) -> tuple[int, float]:
        """``(interval, next_visit)`` after a visit at *now*.

        >>> s = RevisitSchedule(86400, 3600, 30 * 86400, 0.4, 0.2)
        >>> s.after_visit(0, changed=True, now=0)       # a new page
        (86400, 86400)
        >>> s.after_visit(86400, changed=False, now=0)[0]
        120960
        >>> s.after_visit(86400, changed=True, now=0)[0]
        69120
        """
        if interval <= 0:
            interval = self.initial
        elif changed:
            interval *= 1 - self.dec_rate
        else:
            interval *= 1 + self.inc_rate
        interval = round(min(max(interval, self.minimum), self.maximum))
        return interval, now + interval
