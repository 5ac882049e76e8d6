"""When a crawl cannot go on: which conditions are fatal, and the exit status they give.

Two kinds. A crawl that cannot start (its state store cannot be opened, a
setting is wrong, the cluster's Redis cannot be reached) fails while its
components are built, with one of :data:`FATAL_ERRORS`: their message names
the cause and the file, setting or server, and is the whole story, so it is
logged as one line, without a traceback. A crawl that started and then
cannot go on (the store fails to commit, the cluster's or the shared
budget's Redis dies) closes with one of :data:`FATAL_REASONS` after its
component logged one ERROR line naming the cause. A crawl whose store
failed only at its end (the last commit, when the spider closes) finished
otherwise; its ``incremental/store_errors`` stat says so, and it is fatal
too: what it did was not stored. Either way nothing that
was not stored is recorded as done, and the process must exit with a
non-zero status: a supervisor or a scheduler must not see success.

Scrapy's own ``crawl`` command exits with 1 when the crawl could not start,
but with 0 after any crawl that ran, whatever its finish reason; the
project's ``crawl`` command (:mod:`incremental_crawler.commands.crawl`)
reads :func:`exit_status` instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from incremental_crawler.config import SettingError
from incremental_crawler.exceptions import ClusterError
from incremental_crawler.state.stores.base import StateStoreError

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

__all__ = ["FATAL_ERRORS", "FATAL_REASONS", "FATAL_STATUS", "SHARED_UNAVAILABLE", "exit_status"]

#: The finish reason of a crawl whose shared budget cannot be used
#: (:class:`~incremental_crawler.politeness.extension.AdaptiveThrottle`).
SHARED_UNAVAILABLE = "shared_budget_unavailable"

#: The finish reasons of a crawl that was stopped because it could not go on.
FATAL_REASONS: frozenset[str] = frozenset({
    "incremental_store_error",  # the state store failed (Ledger.store_failed)
    "cluster_redis_error",  # the cluster's Redis failed (ClusterCoordinator.lost)
    "cluster_worker_fenced",  # taken for dead by the cluster (ClusterCoordinator.fenced)
    SHARED_UNAVAILABLE,  # the shared budget's Redis failed (AdaptiveThrottle)
})

#: Exceptions, raised while a crawl is built, whose message says it all.
FATAL_ERRORS: tuple[type[Exception], ...] = (StateStoreError, SettingError, ClusterError)

#: The stat counting the state store's failures (:class:`~.state.ledger.Ledger`).
STORE_ERRORS = "incremental/store_errors"

#: The exit status of a crawl that could not start or could not go on.
FATAL_STATUS = 1


def exit_status(crawler: Crawler, *, started: bool = True) -> int:
    """The process exit status for *crawler*'s crawl, once it is over.

    ``started=False``: the crawl failed before it ran (Scrapy's
    ``bootstrap_failed``).
    """
    if not started:
        return FATAL_STATUS
    # The private attribute: the public one raises when the crawl never set it.
    stats = crawler._stats
    reason = stats.get_value("finish_reason") if stats is not None else None
    if reason in FATAL_REASONS:
        return FATAL_STATUS
    # The store failing at the end leaves the finish reason as it was
    # ("finished"): the ledger counts every store failure.
    if stats is not None and stats.get_value(STORE_ERRORS, 0) > 0:
        return FATAL_STATUS
    return 0
