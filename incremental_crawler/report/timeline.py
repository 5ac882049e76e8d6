"""Each download slot's politeness over the crawl's time, for the HTML report.

:class:`Timeline` samples every slot's window of the
:class:`~incremental_crawler.politeness.extension.AdaptiveThrottle` once
per :data:`INTERVAL` (a ``LoopingCall``): the effective rate (what the
window, the user's delay floor and the concurrency let through), the
window's own rate, the latency of the responses since the previous sample
(p50, p95), and the cumulative 429s, 5xx and timeouts. Freezes (a
Retry-After, a backoff, a parked slot) are events: the throttle calls
:meth:`Timeline.frozen` when one starts, and each becomes a span
``(start, end, why)``.

Bounded, whatever the crawl's length and breadth:

- at most :data:`MAX_POINTS` samples: when full, every other sample is
  dropped and the interval doubles (a crawl of a day keeps about one
  sample per 2 minutes);
- at most :data:`MAX_SLOTS` slots get series (the first seen): a sample
  visits only them, so a broad crawl of thousands of sites costs no more
  than one of fifty. The report draws the busiest of them and sums the
  rest into :data:`OTHER` (rates and counters summed, latency the highest);
- at most :data:`MAX_SPANS` freeze spans per slot: overlapping or touching
  freezes merge into one, and past the limit the last span stretches.

Sampling costs one pass over the tracked slots per interval (a sort of at
most 200 latencies each): nothing per request.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import create_looping_call

from incremental_crawler.politeness.extension import effective_rate

if TYPE_CHECKING:
    from incremental_crawler.politeness.extension import AdaptiveThrottle
    from incremental_crawler.politeness.window import DomainWindow

__all__ = ["INTERVAL", "MAX_POINTS", "MAX_SLOTS", "MAX_SPANS", "OTHER", "Timeline"]

#: Seconds between samples at the start of a crawl: short crawls (a few
#: seconds) still get a curve; a pass over the slots costs microseconds.
INTERVAL = 0.25
#: Samples kept, at most (then every other is dropped, the interval doubles).
MAX_POINTS = 720
#: Slots with series of their own, at most.
MAX_SLOTS = 50
#: Freeze spans kept per slot, at most.
MAX_SPANS = 200
#: The chart where the tracked slots beyond the busiest shown add up.
OTHER = "(other slots)"
#: The per-slot series, in the JSON's order.
SERIES = ("rate", "window", "latency_p50_ms", "latency_p95_ms", "status_429", "status_5xx",
          "timeouts", "requests")


@dataclass
class _Slot:
    """One slot's series (aligned with :attr:`Timeline.times`; ``None``: no value)."""

    series: dict[str, list[float | None]]
    spans: list[list[Any]] = field(default_factory=list)
    #: Freezes seen (spans merge; this counts every one).
    freezes: int = 0


def _ok(window: DomainWindow) -> int:
    """Answers the window counted as good (their latencies are in the window)."""
    return window.responses - window.hard - window.soft


def _recent_latencies(window: DomainWindow, new: int) -> list[float]:
    """The latencies of the *new* latest good answers, sorted."""
    if new <= 0:
        return []
    return sorted(itertools.islice(reversed(window.latencies), new))


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Timeline:
    """The per-slot series of one crawl; :meth:`start`, then :meth:`stop`."""

    def __init__(self, throttle: AdaptiveThrottle, *, interval: float = INTERVAL,
                 max_points: int = MAX_POINTS, max_slots: int = MAX_SLOTS) -> None:
        self.throttle = throttle
        self.interval = interval
        self.max_points = max_points
        self.max_slots = max_slots
        #: Seconds since the start, one per sample.
        self.times: list[float] = []
        self.slots: dict[str, _Slot] = {}
        self.started = time.monotonic()
        self.ended: float | None = None
        self._task: Any = None
        #: Per tracked slot: the window's count of good answers at the previous sample.
        self._ok_seen: dict[str, int] = {}
        #: The throttle's windows at the last look for new ones.
        self._windows_seen = 0
        #: CPU seconds spent sampling (the report's log line says it).
        self.cpu = 0.0
        #: Samples to skip before the next one is kept (the interval doubled).
        self._stride = 1
        self._ticks = 0

    # -- recording --------------------------------------------------------------

    def start(self) -> None:
        self.started = time.monotonic()
        self.throttle.freeze_observers.append(self.frozen)
        self._task = create_looping_call(self._tick)
        self._task.start(self.interval, now=True)

    def stop(self) -> None:
        """Take the last sample and stop (the crawl ended)."""
        if self._task is not None and self._task.running:
            self._task.stop()
        if self.frozen in self.throttle.freeze_observers:
            self.throttle.freeze_observers.remove(self.frozen)
        if self.ended is None:
            self.sample()
            self.ended = time.monotonic()

    def _tick(self) -> None:
        self._ticks += 1
        if self._ticks % self._stride == 0:
            self.sample()

    def _slot(self, key: str) -> _Slot:
        slot = self.slots.get(key)
        if slot is None:
            slot = self.slots[key] = _Slot({name: [None] * len(self.times) for name in SERIES})
        return slot

    def _track_new_slots(self) -> None:
        """Give the slots the throttle made since the last look series, up to MAX_SLOTS."""
        windows = self.throttle.windows
        if len(self.slots) >= self.max_slots or len(windows) == self._windows_seen:
            return
        self._windows_seen = len(windows)
        for key in windows:
            if len(self.slots) >= self.max_slots:
                return
            if key:  # "": requests without a host, no site behind them
                self._slot(key)

    def sample(self) -> None:
        """One sample of every tracked slot's window."""
        started = time.process_time()
        try:
            self._sample()
        finally:
            self.cpu += time.process_time() - started

    def _sample(self) -> None:
        if len(self.times) >= self.max_points:
            self._decimate()
        # Slots first seen now are made (their past: no values) before this
        # sample's time is added.
        self._track_new_slots()
        windows = self.throttle.windows
        values = {key: self._values(key, windows[key]) for key in self.slots if key in windows}
        self.times.append(round(time.monotonic() - self.started, 3))
        for key, slot in self.slots.items():
            row = values.get(key, {})
            for name in SERIES:
                slot.series[name].append(row.get(name))

    def _values(self, key: str, window: DomainWindow) -> dict[str, float | None]:
        ok = _ok(window)
        recent = _recent_latencies(window, ok - self._ok_seen.get(key, 0))
        self._ok_seen[key] = ok
        return {
            "rate": round(effective_rate(window)[0], 3),
            "window": round(window.rate, 3),
            "latency_p50_ms": round(1000 * _quantile(recent, 0.5), 1) if recent else None,
            "latency_p95_ms": round(1000 * _quantile(recent, 0.95), 1) if recent else None,
            "status_429": window.status_429,
            "status_5xx": window.status_5xx,
            "timeouts": window.timeouts,
            "requests": window.sent,
        }

    def _decimate(self) -> None:
        """Drop every other sample; sample half as often from now on."""
        self.times = self.times[::2]
        for slot in self.slots.values():
            for name in SERIES:
                slot.series[name] = slot.series[name][::2]
        self._stride *= 2

    def frozen(self, key: str, start: float, until: float, why: str) -> None:
        """A freeze of slot *key* from *start* to *until* (monotonic), for *why*."""
        slot = self.slots.get(key)
        if slot is None:
            if len(self.slots) >= self.max_slots:
                return  # not tracked: its freezes are in the throttle's stats
            slot = self._slot(key)
        slot.freezes += 1
        begin, end = round(start - self.started, 3), round(until - self.started, 3)
        spans = slot.spans
        if spans and begin <= spans[-1][1]:
            # It overlaps (or extends) the last one: one span.
            spans[-1][1] = max(spans[-1][1], end)
            return
        if len(spans) >= MAX_SPANS:
            spans[-1][1] = max(spans[-1][1], end)
            spans[-1][2] = "several freezes (span limit reached)"
            return
        spans.append([begin, end, why])

    # -- reading ----------------------------------------------------------------------

    def to_json(self, top: int) -> dict[str, Any]:
        """The series of the *top* slots by requests, the others summed in OTHER.

        Spans are cut at the crawl's end (a parked slot's freeze outlasts it).
        """
        ended = round((self.ended or time.monotonic()) - self.started, 3)
        ranked = sorted(self.slots, key=lambda k: (k == OTHER, -self._requests(k), k))
        shown, rest = ranked[:top], ranked[top:]
        slots: dict[str, Any] = {key: self._slot_json(self.slots[key], ended) for key in shown}
        if rest:
            merged = _Slot({name: [None] * len(self.times) for name in SERIES})
            for key in rest:
                slot = self.slots[key]
                merged.freezes += slot.freezes
                merged.spans.extend(slot.spans)
                for name in SERIES:
                    merged.series[name] = [
                        _merge(name, a, b) for a, b in zip(merged.series[name],
                                                           slot.series[name], strict=True)]
            merged.spans.sort()
            slots[OTHER] = self._slot_json(merged, ended)
        return {
            "interval_s": self.interval * self._stride,
            "duration_s": ended,
            "times_s": list(self.times),
            "slots": slots,
            "slots_tracked": len(self.slots),
            # Slots of the throttle without series (over MAX_SLOTS).
            "slots_untracked": sum(1 for key in self.throttle.windows
                                   if key and key not in self.slots),
        }

    def _requests(self, key: str) -> float:
        return max((v for v in self.slots[key].series["requests"] if v is not None), default=0)

    @staticmethod
    def _slot_json(slot: _Slot, ended: float) -> dict[str, Any]:
        spans = [{"start_s": start, "end_s": min(end, ended), "why": why}
                 for start, end, why in slot.spans if start <= ended]
        return {**{name: list(values) for name, values in slot.series.items()},
                "freezes": slot.freezes, "frozen_spans": spans}


def _merge(name: str, a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b) if name.startswith("latency") else round(a + b, 3)
