"""The crawler's own side of a crawl: when each request left and when its answer came.

The site's log says when each request *arrived*. That alone cannot tell
whether a crawl honoured a Retry-After: a request that had already left
when the 429 came back was on its way (the crawl may run several requests
at once), and on a loaded machine it can arrive at the server any time
later, inside the wait. Whether the crawl *could* have held it back is a
question of order, not of milliseconds: did it leave before or after the
crawler read the 429?

:class:`SendLogDownloader` (the ``DOWNLOADER`` setting) is the crawl's own
downloader, recording:

* when each request left its downloader slot: the moment Scrapy's
  downloader lets it go, which is what the slot's delay (and a freeze)
  decides; from there it goes to the wire whatever happens next;
* when its answer came back, with its status: the ``response_downloaded``
  signal, where the throttle freezes the slot on a 429, before the
  downloader lets the next request of the slot leave;
* the slot's ``lastseen`` as it let the request go: the instant Scrapy
  counts the slot's delay from (for requests leaving one at a time, the
  moment it left, on the slot's own clock).

Whether a crawl kept a gap between requests is a question for the crawler's
side too (:func:`kept_apart`): the server sees each request some transit
later, and that transit varies (a connection being opened, a busy machine),
so two arrivals may be closer than the gap the crawler kept; no arrival is
closer than the gap to the previous request's departure.

Each request carries its record's number in the ``X-Test-Send`` header, so a
test matches the site's log records to the crawler's.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy import signals

from incremental_crawler.politeness.downloader import PacedDownloader

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterable

    from scrapy import Request
    from scrapy.core.downloader import Slot
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.internet.defer import Deferred

    from tests.site.server import RequestRecord

__all__ = ["HEADER", "Send", "SendLogDownloader", "kept_apart", "left_gaps", "left_groups",
           "sent_inside_a_wait"]

#: The request header carrying the send's number (lower-cased in the site's log).
HEADER = "X-Test-Send"


@dataclass
class Send:
    """One request as the crawler sent it (:func:`time.monotonic` times, as the site's)."""

    url: str
    #: When the downloader let it leave its slot.
    left: float
    #: The slot's ``lastseen`` then (see the module docstring).
    lastseen: float
    #: The slot's delay then: the pace the crawler meant to keep (1/rate),
    #: whatever pace a busy machine let it keep.
    delay: float = 0.0
    #: The number of the downloader's release of the slot's queue that let it
    #: go: requests of one number left together (a group), as one step.
    release: int = 0
    #: When the downloader began the release that let it go (at or before
    #: the moment Scrapy's downloader took as "now" for it).
    entered: float = 0.0
    #: The earliest moment the slot would let a request go, as that release
    #: began: its ``lastseen`` + delay (a freeze or backoff moves
    #: ``lastseen`` on; the delay does not show them).
    due: float = 0.0
    #: When its answer came back (``None``: none did, e.g. a timeout).
    answered: float | None = None
    status: int | None = None


class SendLogDownloader(PacedDownloader):
    """The project's downloader, keeping :attr:`sends` (see the module docstring)."""

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self.sends: list[Send] = []
        self.releases = 0
        #: (entered, due) of the release running now (see :class:`Send`).
        self._release = (0.0, 0.0)
        crawler.signals.connect(self._answered, signal=signals.response_downloaded)

    def _process_queue(self, slot: Slot) -> None:
        # Each call is one release: what it lets go leaves together. (A
        # release that lets one request go calls it again for the next,
        # which then waits for the slot's delay: a number of its own.)
        self.releases += 1
        self._release = (time.monotonic(), slot.lastseen + slot.delay)
        super()._process_queue(slot)

    def _wait_for_download(self, slot: Slot, request: Request,
                           queue_dfd: Deferred[Response]) -> Coroutine[Any, Any, None]:
        # Called (not awaited) as the request leaves the slot; the download
        # itself starts when the loop runs the coroutine, which on a busy
        # machine may be after an answer read meanwhile.
        request.headers[HEADER] = str(len(self.sends))
        entered, due = self._release
        self.sends.append(Send(request.url, time.monotonic(), slot.lastseen,
                               slot.download_delay(), self.releases, entered, due))
        return super()._wait_for_download(slot, request, queue_dfd)

    def _answered(self, response: Response, request: Request, spider: Any) -> None:
        send = self.sends[int(request.headers[HEADER])]
        send.answered, send.status = time.monotonic(), response.status

    def send_of(self, record: RequestRecord) -> Send:
        """The crawler's record of the request the site logged as *record*."""
        return self.sends[int(record.headers[HEADER.lower()])]


def sent_inside_a_wait(log: Iterable[RequestRecord], downloader: SendLogDownloader) -> list[str]:
    """The requests of the site's *log* (one client's) that arrived inside the
    wait a 429's Retry-After asked for, and left the crawler after it had
    read that 429: one line each, saying when.

    A request that left before the crawler read the 429 is not one: it was
    on its way, however late the server read it. The rule holds at any
    machine load; an empty list is a crawl that honoured every wait.
    """
    records = list(log)
    broken = []
    for refusal in records:
        if refusal.wait_until is None:
            continue
        read = downloader.send_of(refusal).answered
        if read is None:
            continue  # never read: the crawler did not know of the wait
        broken += [
            f"{record.path} left {downloader.send_of(record).left - read:.3f} s after the "
            f"crawler read the 429 to {refusal.path} and arrived "
            f"{record.started - refusal.started:.3f} s into its "
            f"{refusal.wait_until - refusal.started:.2f} s wait"
            for record in records
            if refusal.started <= record.started < refusal.wait_until
            and downloader.send_of(record).left > read]
    return broken


def left_gaps(downloader: SendLogDownloader, path_prefix: str, n: int | None = None
              ) -> list[float]:
    """The gaps between the first *n* (all: ``None``) requests under
    *path_prefix* as they left the crawler: the pace it kept, whatever the
    transit to the server."""
    left = [send.lastseen for send in downloader.sends
            if urlsplit(send.url).path.startswith(path_prefix)][:n]
    return [b - a for a, b in itertools.pairwise(left)]


def left_groups(downloader: SendLogDownloader, path_prefix: str = "/p/") -> list[list[Send]]:
    """The requests under *path_prefix* as they left the crawler, in groups:
    those let go by one release of the slot's queue (a single request is a
    group of one). Which requests left together is the crawler's decision,
    whatever the transit to the server."""
    out: list[list[Send]] = []
    for send in downloader.sends:
        if not urlsplit(send.url).path.startswith(path_prefix):
            continue
        if out and out[-1][-1].release == send.release:
            out[-1].append(send)
        else:
            out.append([send])
    return out


def kept_apart(log: Iterable[RequestRecord], downloader: SendLogDownloader,
               gap: float) -> list[str]:
    """The requests of the site's *log* that left the crawler less than *gap*
    after the one before them, or reached the server less than *gap* after
    the one before them left: one line each. An empty list is a gap kept,
    at any machine load (see the module docstring)."""
    sent = sorted(((downloader.send_of(record), record) for record in log),
                  key=lambda pair: pair[0].lastseen)
    broken = []
    for (before, _), (send, record) in itertools.pairwise(sent):
        if send.lastseen - before.lastseen < gap - 1e-9:
            broken.append(f"{record.path} left {send.lastseen - before.lastseen:.4f} s after "
                          "the request before it")
        if record.started - before.lastseen < gap - 1e-9:
            broken.append(f"{record.path} reached the server {record.started - before.lastseen:.4f}"
                          " s after the request before it left")
    return broken
