"""Old import path of :mod:`incremental_crawler.change.accounting` (the
schedule itself is :mod:`incremental_crawler.change.revisit`), kept."""

from incremental_crawler.change.accounting import (
    META_LASTMOD_MODIFIED,
    META_LISTING,
    META_WHY,
    META_WHY_URL,
    PageOutcome,
    ScheduleCounter,
    Why,
    decided,
    mark,
)

__all__ = [
    "META_LASTMOD_MODIFIED", "META_LISTING", "META_WHY", "META_WHY_URL", "PageOutcome",
    "ScheduleCounter", "Why", "decided", "mark",
]
