"""PacedDownloader: Scrapy's Downloader, letting a fast slot's requests leave
in small groups at the same rate.

Scrapy's Downloader lets one request of a slot leave per ``delay``: at 50
requests/s that is 50 wake-ups of the crawl process a second, each handling
one request alone after a sleep, with cold caches. That costs no more
instructions, but on a shared machine it costs CPU time: a crawl paced at
50/s spends ~20% more CPU than the same crawl unpaced.

A :class:`PacedSlot` has a ``burst``, set by the throttle
(:meth:`~incremental_crawler.politeness.window.DomainWindow.burst`): when
it is above 1, up to ``burst`` queued requests leave together and the next
group ``burst * delay`` later (a token bucket of ``burst`` tokens filled at
the slot's rate). The rate is the same; in any second at most ``burst``
requests more than the rate leave. The throttle gives a slot a burst only
while its window is at its ceiling, reached without a single error and
confirmed there by a window of healthy answers (the site has taken the most
the crawl ever sends it, also where the window started at its ceiling),
that is more than one
request per ``INCREMENTAL_THROTTLE_TICK``, and there is no Crawl-delay or
user delay (both promise a gap between any two requests): a site that
answers a group with a 429 or a 503 gets one request at a time from then
on.
"""

from __future__ import annotations

from time import monotonic
from typing import TYPE_CHECKING

from scrapy.core.downloader import Downloader, Slot
from scrapy.utils.asyncio import call_later

# Private, as Scrapy's own Downloader schedules each download with it.
from scrapy.utils.defer import _schedule_coro

if TYPE_CHECKING:
    from scrapy import Request, Spider

__all__ = ["PacedDownloader", "PacedSlot"]


class PacedSlot(Slot):
    """A downloader slot with a burst: how many requests may leave together."""

    __slots__ = ("burst",)

    def __init__(self, concurrency: int, delay: float, jitter: float | None = None) -> None:
        super().__init__(concurrency, delay, jitter)
        self.burst = 1


class PacedDownloader(Downloader):
    """See the module docstring; the ``DOWNLOADER`` the add-on installs."""

    def _get_slot(self, request: Request, spider: Spider | None = None) -> tuple[str, Slot]:
        key, slot = super()._get_slot(request)
        if not isinstance(slot, PacedSlot):
            # Scrapy made the slot (its concurrency, delay and jitter from
            # the settings): the same, with a burst of 1 until the throttle
            # says otherwise.
            slot = self.slots[key] = PacedSlot(slot.concurrency, slot.delay, slot.jitter)
        return key, slot

    def _process_queue(self, slot: Slot) -> None:
        burst = slot.burst if isinstance(slot, PacedSlot) else 1
        delay = slot.download_delay()
        if burst <= 1 or not delay:
            super()._process_queue(slot)
            return
        if slot.latercall:
            return  # the next group's time is already set
        now = monotonic()
        # lastseen + delay is when the next request may leave, as in Scrapy's.
        wait = slot.lastseen + delay - now
        if wait > 0:
            slot.latercall = call_later(wait, self._latercall, slot)
            return
        # Counted once: a released request joins slot.transferring only when
        # its task starts, after this loop.
        room = min(burst, slot.free_transfer_slots())
        released = 0
        while slot.queue and released < room:
            request, queue_dfd = slot.queue.popleft()
            _schedule_coro(self._wait_for_download(slot, request, queue_dfd))
            released += 1
        if released:
            # The group used `released` intervals: the next leaves that long
            # after this one (lastseen may lie ahead of now).
            slot.lastseen = now + (released - 1) * delay
            if slot.queue:
                self._process_queue(slot)
