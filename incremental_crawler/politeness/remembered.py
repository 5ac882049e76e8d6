"""Each slot's window starts from the rate it reached in the last crawl.

A re-crawl of a site that took 50 requests a second yesterday need not
slow-start from INCREMENTAL_THROTTLE_START_RATE again: at the end of a
crawl, what each slot's window learned (its rate, whether it left slow
start, how it ended) is kept in the state store, per scope
(:class:`~incremental_crawler.state.records.SlotRate`), and the next crawl's
window of that slot starts there, as TCP starts a connection from a
destination's cached metrics (RFC 2140). Only a record not older than
INCREMENTAL_THROTTLE_REMEMBER_FOR seconds (0: never) is used.

A crawl refreshes a slot's record only when its window learned something:
it had an answer, and, if it started above the start rate from a remembered
rate, it confirmed that rate (a window of healthy answers) or a hard signal
cut it. A crawl of a few pages that ended with the remembered rate still
unconfirmed leaves the record as it was, its age included: otherwise each
such crawl would keep an old rate "recent" for another REMEMBER_FOR with no
evidence that the site still takes it.

The rate kept is what the site was let through (the window's rate, held
down by the user's delay or concurrency if they held it), never more; a
window that saw a hard signal starts there in additive increase, not slow
start (TCP starts at its ssthresh), one that saw none in slow start, never
below the start rate. The slot's bounds (INCREMENTAL_THROTTLE_*
rates, a per-domain override) and floors (DOWNLOAD_DELAY, Crawl-delay)
still win. With the shared budget in Redis (cluster mode) nothing is
remembered here: that budget keeps its own state.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from incremental_crawler import clock
from incremental_crawler.formats import duration
from incremental_crawler.state.records import SlotRate

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy.statscollectors import StatsCollector

    from incremental_crawler.politeness.window import DomainWindow
    from incremental_crawler.state.stores.base import SlotRates

__all__ = ["RateMemory", "ended_as", "learned", "not_used"]

logger = logging.getLogger(__name__)

#: Slots named at most in the start-up line (the count says how many).
_NAMED = 5
#: Seconds a record may have been saved ahead of this crawl's clock (two
#: machines' clocks) and still be used.
_CLOCK_SKEW = 60.0


def not_used(record: SlotRate, now: float, remember_for: float) -> str | None:
    """Why a crawl at *now* would not start from *record* (``None``: it would)."""
    if remember_for <= 0:
        return "remembering is off"
    if record.saved_at > now + _CLOCK_SKEW:
        # Saved by a clock ahead of this one (faketime, a clock set wrong):
        # its age is unknown, so REMEMBER_FOR cannot bound it.
        return "saved later than now, by a clock ahead"
    if now - record.saved_at > remember_for:
        return "too old"
    return None


def ended_as(window: DomainWindow, now: float) -> str:
    """How *window* ended (*now*: monotonic): "" when healthy."""
    if window.parked:
        return "parked"
    if window.penalty_box:
        return "penalty box"
    if window.frozen_until > now:
        return "frozen"
    return ""


def learned(scope: str, windows: Iterable[tuple[str, DomainWindow]],
            rate_of: dict[str, float]) -> list[SlotRate]:
    """What to remember of *windows*; *rate_of*: the rate each slot's
    requests could reach.

    A window without an answer, or still unproven (a remembered rate that
    no window of healthy answers confirmed and no hard signal cut) learned
    nothing: its slot's stored record stays as it was, saved_at included.
    """
    saved_at = clock.now()
    now = time.monotonic()
    return [SlotRate(scope, key, min(window.rate, rate_of.get(key, window.rate)),
                     window.slow_start, saved_at, ended_as(window, now))
            for key, window in windows if key and window.responses and not window.unproven]


class RateMemory:
    """The remembered rates one crawl starts its windows from."""

    def __init__(self, remember_for: float, stats: StatsCollector) -> None:
        self.remember_for = remember_for
        self.stats = stats
        self.rates: dict[str, SlotRate] = {}
        #: Slots whose window started from a remembered rate, and that rate.
        self.started: dict[str, float] = {}
        #: Those windows, to tell at the end which confirmed their rate.
        self.windows: dict[str, DomainWindow] = {}
        #: Slots whose remembered rate was older than remember_for.
        self.stale: list[str] = []

    def load(self, stored: SlotRates) -> None:
        """Keep the records young enough; say what was found and left out."""
        now = clock.now()
        ahead = []
        for record in stored.rates:
            why = not_used(record, now, self.remember_for)
            if why is None:
                self.rates[record.slot] = record
            elif why == "too old":
                self.stale.append(record.slot)
            else:
                ahead.append(record.slot)
        if self.stale or ahead:
            self.stats.set_value("incremental/throttle/remembered_stale",
                                 len(self.stale) + len(ahead))
        if self.stale:
            logger.info("%(n)d remembered politeness rate%(s)s older than %(age)s not used: "
                        "%(slots)s start%(verb_s)s from the start rate",
                        {"n": len(self.stale), "s": "" if len(self.stale) == 1 else "s",
                         "age": self.age_limit(), "slots": _listed(sorted(self.stale)),
                         "verb_s": "s" if len(self.stale) == 1 else ""})
        if ahead:
            logger.warning(
                "%(n)d remembered politeness rates were saved later than now (by a clock "
                "ahead of this one): %(slots)s start from the default rate",
                {"n": len(ahead), "slots": _listed(ahead)})
        if stored.unreadable:
            # State is never silently reset: said, counted, then the
            # default rate for these slots.
            self.stats.set_value("incremental/throttle/remembered_unreadable",
                                 len(stored.unreadable))
            logger.warning(
                "%(n)d remembered politeness rates could not be read (damaged): "
                "%(slots)s start from the default rate",
                {"n": len(stored.unreadable), "slots": _listed(stored.unreadable)})
        if self.rates:
            n = len(self.rates)
            logger.info("%(n)d slot%(s)s start%(verb_s)s from the last crawl's rate: %(rates)s",
                        {"n": n, "s": "" if n == 1 else "s", "verb_s": "s" if n == 1 else "",
                         "rates": self.describe()})

    def describe(self) -> str:
        """``"host 50/s, other 2.8/s (after hard signals), ... and 3 more"``."""
        records = sorted(self.rates.values(), key=lambda r: r.slot)
        return _listed([f"{r.slot} {r.rate:.3g}/s"
                        + ("" if r.slow_start else " (after hard signals)")
                        + (f" ({r.ended})" if r.ended else "")
                        for r in records])

    def age_limit(self) -> str:
        """REMEMBER_FOR in words: ``"7 days"``, ``"3600 s"``."""
        days = self.remember_for / 86400
        if days >= 1 and days == int(days):
            return f"{int(days)} day{'' if days == 1 else 's'} (INCREMENTAL_THROTTLE_REMEMBER_FOR)"
        return f"{self.remember_for:g} s (INCREMENTAL_THROTTLE_REMEMBER_FOR)"

    def started_line(self) -> str | None:
        """What the end-of-crawl report says of the windows started here."""
        parts = []
        if self.started:
            n = len(self.started)
            parts.append(
                f"{n} slot{'' if n == 1 else 's'} started from the last crawl's rate ("
                + _listed([f"{key} {rate:.3g}/s" for key, rate in sorted(self.started.items())])
                + ")")
        if unconfirmed := self.unconfirmed():
            n = len(unconfirmed)
            whose = "slot's" if n == 1 else "slots'"
            now = clock.now()
            parts.append(
                f"{n} {whose} last rate not confirmed by this crawl's answers, kept as saved, "
                "not refreshed (" + _listed([
                    f"{key} saved {duration(max(0.0, now - self.rates[key].saved_at))} ago"
                    for key in unconfirmed]) + ")")
        if self.stale:
            n = len(self.stale)
            whose = "slot's" if n == 1 else "slots'"
            parts.append(f"{n} {whose} last rate older than {self.age_limit()}, not used "
                         f"({_listed(sorted(self.stale))})")
        return "; ".join(parts) or None

    def unconfirmed(self) -> list[str]:
        """Slots whose window started above the start rate from a remembered
        rate and is still unproven: their records are not rewritten
        (:func:`learned`)."""
        return sorted(key for key, window in self.windows.items() if window.unproven)

    def start(self, key: str, window: DomainWindow) -> None:
        """Start *key*'s new *window* from its remembered rate, if any."""
        record = self.rates.get(key)
        if record is None:
            return
        policy = window.policy
        rate = record.rate
        if record.slow_start:
            # No hard signal last time: nothing says the site cannot take the
            # start rate (the rate may be low because a delay the user has
            # since removed held it, or a few soft errors cut it).
            rate = max(rate, policy.start_rate)
        # The slot's bounds (a per-domain override, a lowered max) still win.
        window.rate = min(policy.max_rate, max(policy.min_rate, rate))
        window.slow_start = record.slow_start
        window.unproven = window.rate > policy.start_rate
        self.started[key] = window.rate
        self.windows[key] = window
        self.stats.inc_value("incremental/throttle/remembered_slots")


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_NAMED])
    return shown if len(names) <= _NAMED else f"{shown} and {len(names) - _NAMED} more"
