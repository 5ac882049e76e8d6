"""The rotating sample: trusted lastmods that did not move are checked, a few per crawl.

A trusted lastmod is authoritative: a page whose lastmod did not move since
our copy is not requested, whatever its revisit schedule. A sitemap whose
dates stopped moving while its pages change would then hide those changes
for ever; the sample finds them. Among the P pages of a list (or, when
re-seeding, of a host) skipped this way in a crawl, it picks

    n = max(1, ceil(INCREMENTAL_LASTMOD_RECHECK_SHARE * P))

(none when the share is 0 or nothing was skipped), the least recently
checked first (their ``last_checked``), and they are requested
conditionally (``Why.SAMPLED``). A check moves a page's ``last_checked`` to
now and a skip does not, so the sample rotates through the skipped pages:

* **every skipped page is checked at least once every ceil(P / n) crawls**
  (while P stays the same);
* so **a change hidden behind an unmoved lastmod is found within ceil(P / n)
  crawls** - the stored fingerprint stays the old one until then, so the
  check compares against the content we last stored;
* each page found changed this way is a stale-lastmod finding, counted on
  its host; after INCREMENTAL_LASTMOD_STALE_AFTER findings **the host's
  lastmods are distrusted** for INCREMENTAL_LASTMOD_DISTRUST_TTL and its
  pages fall back to their revisit schedules (the count starts again once
  the distrust is forgiven). A sampled page that answers 304, or comes back
  with the same content, is no finding.

With the default share of 1 %, a 10,000-page sitemap costs 100 conditional
requests per crawl, and every page of it is checked within 100 crawls.

Memory is bounded: :class:`RotatingSample` keeps at most
``ceil(share * capacity)`` entries (*capacity*: an upper bound of P, such as
the length of the list), in a heap.
"""

from __future__ import annotations

import heapq
import math
from typing import Generic, TypeVar

__all__ = ["RotatingSample", "sample_size"]

T = TypeVar("T")


def sample_size(share: float, skipped: int) -> int:
    """How many of *skipped* pages are checked: ``max(1, ceil(share * skipped))``.

    >>> sample_size(0.01, 0), sample_size(0.0, 500), sample_size(0.01, 50), sample_size(0.01, 250)
    (0, 0, 1, 3)
    """
    if share <= 0 or skipped <= 0:
        return 0
    return min(skipped, max(1, math.ceil(share * skipped)))


class RotatingSample(Generic[T]):
    """The least recently checked of the pages offered; see the module docstring.

    ``offer()`` each skipped page; a page that can no longer be picked is
    handed back at once (count it skipped). ``take()`` at the end returns
    ``(sampled, rest)``.
    """

    def __init__(self, share: float, capacity: int) -> None:
        self.share = share
        self._keep = sample_size(share, capacity)
        #: (-last_checked, -order, item): heap[0] is the most recently checked kept.
        self._heap: list[tuple[float, int, T]] = []
        self.offered = 0

    def offer(self, last_checked: float, item: T) -> T | None:
        """Keep *item* as a candidate; return the one that can no longer be picked, if any."""
        self.offered += 1
        entry = (-last_checked, -self.offered, item)
        if len(self._heap) < self._keep:
            heapq.heappush(self._heap, entry)
            return None
        if not self._heap or entry[:2] <= self._heap[0][:2]:
            return item  # checked more recently than every page kept
        return heapq.heapreplace(self._heap, entry)[2]

    def take(self) -> tuple[list[T], list[T]]:
        """``(sampled, rest)``: the pages to check (least recently checked
        first), and the other pages kept."""
        ordered = [entry[2] for entry in sorted(self._heap, key=lambda e: (-e[0], -e[1]))]
        self._heap = []
        n = sample_size(self.share, self.offered)
        return ordered[:n], ordered[n:]
