"""Figures written for people: the same in ``scrapy state`` and the HTML report."""

from __future__ import annotations

__all__ = ["duration", "size"]


def size(n: float) -> str:
    """``1536`` → ``"1.5 KB"`` (binary multiples, as file managers show)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def duration(seconds: float) -> str:
    """``3725`` → ``"1 h 2 min"``; below a minute, in seconds."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"
