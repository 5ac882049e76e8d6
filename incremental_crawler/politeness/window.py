"""Per-domain AIMD windows: the budget each download slot may use.

Each download slot (a domain, a host group, or a ``DOWNLOAD_SLOTS`` entry)
has a *rate* in requests per second. It doubles after each window of
healthy answers until the first hard signal (slow start, as TCP), then grows
by ``increase`` after each window of healthy answers (about one second's worth, each faster than the
target latency) and is multiplied by ``decrease`` on a hard signal (429,
503, a timeout, a refused connection) — at most once per window of
requests in flight, so one burst of errors cuts it once, not to the floor.
A lone soft error (a reset, a DNS hiccup) costs less; a run of hard errors
puts the slot in the penalty box: one probe request at a time until an
answer is good again. The rate becomes the slot's delay (1/rate, never
below robots.txt's Crawl-delay) and its concurrency (what the rate needs at
the observed latency, or a whole group where the slot sends its requests in
groups), so a fast server is held to its real budget.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from incremental_crawler.config import SettingError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["DomainWindow", "WindowPolicy"]


@dataclass(frozen=True, slots=True)
class WindowPolicy:
    """Bounds and steps of a window; per-domain overrides replace fields."""

    start_rate: float = 4.0
    min_rate: float = 0.1
    max_rate: float = 50.0
    increase: float = 1.0
    # 0.7 as TCP CUBIC: the freeze after a 429 already enforces the wait; a
    # halving on top would leave a site's budget half unused for seconds.
    decrease: float = 0.7
    soft_decrease: float = 0.9
    target_latency: float = 2.0
    max_concurrency: int = 16
    penalty_after: int = 3
    backoff_base: float = 1.0
    backoff_max: float = 60.0

    @classmethod
    def checked_overrides(
        cls, domains: Mapping[str, Mapping[str, Any]],
    ) -> Mapping[str, Mapping[str, Any]]:
        """*domains* (INCREMENTAL_THROTTLE_DOMAINS), whose overrides name only
        fields of the policy."""
        known = {f.name for f in fields(cls)}
        for domain, override in domains.items():
            if unknown := set(override) - known:
                raise SettingError(
                    f"INCREMENTAL_THROTTLE_DOMAINS[{domain!r}]: unknown keys {sorted(unknown)}"
                )
        return domains


@dataclass(slots=True)
class DomainWindow:
    """The state of one slot's window; methods return a reason when it moved."""

    policy: WindowPolicy
    rate: float = 0.0
    #: robots.txt Crawl-delay (capped): the delay never goes below it.
    delay_floor: float = 0.0
    sent: int = 0
    cut_at: int = 0
    healthy: int = 0
    consecutive_hard: int = 0
    #: Until the first hard signal the window doubles (TCP's slow start),
    #: so it finds a site's budget in a few seconds, not tens.
    slow_start: bool = True
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    responses: int = 0
    hard: int = 0
    soft: int = 0
    status_429: int = 0
    status_5xx: int = 0
    timeouts: int = 0
    frozen_until: float = 0.0
    frozen_seconds: float = 0.0
    parked: bool = False
    #: Whether the Scrapy slot's own settings were taken as bounds.
    bounded: bool = False
    #: Started above the start rate from the last crawl's rate, and not yet
    #: confirmed by a window of healthy answers this crawl: a hard signal
    #: before then means the site changed, and the window drops to the start
    #: rate at once (a remembered rate never costs more than a first crawl).
    unproven: bool = False
    #: Requests the slot lets leave together (its burst, set by the
    #: throttle): the concurrency lets a whole group be in flight, and says
    #: so wherever it is shown.
    group: int = 1

    def __post_init__(self) -> None:
        # Within the bounds from the start, as in the shared budget's script:
        # a per-domain override (INCREMENTAL_THROTTLE_DOMAINS) may set a
        # max_rate below the global start_rate, or a min_rate above it.
        policy = self.policy
        self.rate = min(policy.max_rate, max(policy.min_rate, self.rate or policy.start_rate))

    @property
    def penalty_box(self) -> bool:
        return self.consecutive_hard >= self.policy.penalty_after

    def stamp(self) -> int:
        """A request leaves: its sequence number, to tell old losses from new."""
        self.sent += 1
        return self.sent

    def ok(self, latency: float) -> str | None:
        self.responses += 1
        self.latencies.append(latency)
        self.consecutive_hard = 0
        if latency > self.policy.target_latency:
            return None
        self.healthy += 1
        if self.unproven and self.healthy >= max(1.0, self.rate):
            self.unproven = False
        if self.healthy >= max(1.0, self.rate) and self.rate < self.policy.max_rate:
            self.healthy = 0
            if self.slow_start:
                self.rate = min(self.policy.max_rate, self.rate * 2)
                return "slow-start increase"
            self.rate = min(self.policy.max_rate, self.rate + self.policy.increase)
            return "increase"
        return None

    def hard_error(self, seq: int) -> str | None:
        self.responses += 1
        self.hard += 1
        self.consecutive_hard += 1
        self.healthy = 0
        self.slow_start = False
        if seq <= self.cut_at:
            return None  # in flight before the last cut: already paid for
        self.cut_at = self.sent
        self.rate = max(self.policy.min_rate, self.rate * self.policy.decrease)
        if self.unproven:
            self.unproven = False
            self.rate = min(self.rate, self.policy.start_rate)
            return "decrease (the last crawl's rate is too fast now)"
        return "decrease"

    def soft_error(self, seq: int) -> str | None:
        self.responses += 1
        self.soft += 1
        if self.consecutive_hard:
            return self.hard_error(seq)
        self.healthy = 0
        self.rate = max(self.policy.min_rate, self.rate * self.policy.soft_decrease)
        return "soft decrease"

    def backoff(self) -> float:
        """Seconds to stay away after a failure without Retry-After (with jitter)."""
        base = self.policy.backoff_base * 2 ** max(0, self.consecutive_hard - 1)
        return min(self.policy.backoff_max, base) * random.uniform(0.5, 1.5)  # noqa: S311 (jitter)

    def freeze(self, now: float, seconds: float) -> float:
        until = now + seconds
        if until > self.frozen_until:
            self.frozen_seconds += until - max(now, self.frozen_until)
            self.frozen_until = until
        return self.frozen_until

    @property
    def delay(self) -> float:
        return max(1.0 / self.rate, self.delay_floor)

    @property
    def concurrency(self) -> int:
        if self.penalty_box:
            return 1
        latency = statistics.median(self.latencies) if self.latencies else 0.1
        needed = math.ceil(self.rate * latency) + 1
        return max(1, self.group, min(self.policy.max_concurrency, needed))

    def burst(self, tick: float) -> int:
        """How many requests may leave together, a group every *tick* seconds.

        One unless the window is at its ceiling (``max_rate``) and that
        is more than one request per *tick*, reached without a single
        error, and a window of healthy answers came at the ceiling itself:
        the site has taken the most this crawl ever sends it, and the
        groups do not raise the rate. One, too, with a delay floor (a
        Crawl-delay or the user's delay promises a gap between any two
        requests). Never above the concurrency ceiling.
        """
        if (tick <= 0 or self.delay_floor > 0 or self.rate < self.policy.max_rate
                or not self.slow_start or self.hard or self.soft or self.penalty_box
                # A window that starts at its ceiling (a start rate equal to
                # the max rate, a per-domain override, a remembered rate) has
                # no answer yet that says the site takes that rate: groups
                # wait for a window of healthy answers at the ceiling.
                # ``healthy`` counts the answers since the rate last rose (at
                # the ceiling it is no longer reset); a remembered rate not yet
                # confirmed (``unproven``) has fewer than that, too.
                or self.healthy < max(1.0, self.rate)):
            return 1
        return max(1, min(self.policy.max_concurrency, int(tick * self.rate)))

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
