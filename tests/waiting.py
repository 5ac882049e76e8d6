"""Waiting for what a crawl does, on the reactor: a condition polled, never a fixed sleep."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from twisted.internet import reactor
from twisted.internet.task import deferLater

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["until"]


async def until(condition: Callable[[], object], what: str, seconds: float = 30) -> None:
    """Return once *condition()* is true; fail naming *what* after *seconds*
    (polled every 20 ms, the reactor running meanwhile)."""
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await deferLater(reactor, 0.02)
    pytest.fail(f"timed out waiting for {what}")
