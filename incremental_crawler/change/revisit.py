"""Adaptive revisit intervals, after Nutch's AdaptiveFetchSchedule.

Each page carries an interval and a next-visit time. A visit that finds
the page unchanged stretches the interval by ``inc_rate``; a visit that
finds it changed shrinks it by ``dec_rate``; the interval stays within
``[minimum, maximum]``. Pages that change often are looked at often, pages
that never change drift towards ``maximum`` (and INCREMENTAL_MAX_AGE still
forces a full fetch now and then).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Self

    from incremental_crawler.config import IncrementalConfig

__all__ = ["RevisitSchedule"]


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
