"""Moving a test's crawls in time: the one helper the crawl tests share."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from incremental_crawler import clock

if TYPE_CHECKING:
    import pytest

DAY = 86_400.0


def later(monkeypatch: pytest.MonkeyPatch, days: float) -> None:
    """Move every date-dependent decision of the next crawls *days* ahead of
    the real clock (the test site's clock stays)."""
    offset = days * DAY
    monkeypatch.setattr(clock, "now", lambda: time.time() + offset)
