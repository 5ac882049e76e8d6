"""Figures written for people: the same in ``scrapy state`` and the HTML report."""

from __future__ import annotations

__all__ = ["duration", "shares", "size"]


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


def shares(downloaded: float, saved: float) -> str:
    """The one phrase for what a re-crawl cost against a full one: *downloaded*
    bytes, and *saved* ones (by 304s and by pages not requested).

    >>> shares(50, 150)
    'downloaded 25.0% of a full re-crawl, saved 75.0%'
    >>> shares(0, 0)
    ''
    """
    full = downloaded + saved
    if not full:
        return ""
    return (f"downloaded {100 * downloaded / full:.1f}% of a full re-crawl, "
            f"saved {100 * saved / full:.1f}%")
