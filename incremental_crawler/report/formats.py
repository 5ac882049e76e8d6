"""Figures written for people: the same in ``scrapy state`` and the HTML report."""

from __future__ import annotations

__all__ = ["size"]


def size(n: float) -> str:
    """``1536`` → ``"1.5 KB"`` (binary multiples, as file managers show)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
