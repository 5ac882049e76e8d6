"""The one wall clock of the incremental components (POSIX seconds).

Every decision that depends on the date (due or not, max age, lastmods in
the future, distrust until, when a page or item was stored) reads it here,
through :func:`now`, so that a test can move a whole crawl to "a day later"
by replacing this function (``monkeypatch.setattr(clock, "now", ...)``), and
a whole ``scrapy crawl`` process can be moved with ``faketime``. Pacing and
freezes (politeness) use ``time.monotonic()`` instead: they measure
intervals, not dates.
"""

from __future__ import annotations

import time

__all__ = ["now"]


def now() -> float:
    """The current time, in seconds since the epoch."""
    return time.time()
