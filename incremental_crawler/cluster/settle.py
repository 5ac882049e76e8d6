"""What the stats of a cluster run's killed workers took with them, read
back from the run's counted pages by the worker that ends the run.

A worker killed (SIGKILL, a lost machine) records no crawl: its stats, its
share of the run's accounting, die with it. The run's counted pages
(``count_page.lua``) say which worker counted each page, in which column,
and what a page requested left; the worker that ends the run counts the
killed workers' shares again in its own figures
(:meth:`~incremental_crawler.cluster.coordinator.ClusterCoordinator.settle_killed`),
so that the run's totals hold every page once. The run keeps no page's URL
(a hash) nor why a page was requested: those pages are counted requested
as ``requested_of_killed``, under no host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from incremental_crawler.change.accounting import Why

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Settlement"]

#: A page's field in the run's counted pages is 12 bytes (see run_field);
#: its answers' field is the same and "a".
PAGE_FIELD, ANSWERS_FIELD = 12, 13

_SKIPPED = f"skipped/{Why.LASTMOD_UNCHANGED}"
_SKIPPED_LEFT = f"skipped_left/{Why.LASTMOD_UNCHANGED}"


class Settlement:
    """The killed workers' shares, as ``incremental/schedule/`` stats
    (:attr:`totals`), from the run's counted pages read one by one."""

    def __init__(self, killed: set[str], *, sum_stands: bool, deferral_stands: bool,
                 sum_left_out: Callable[[str], bool]) -> None:
        #: The tags of the killed workers.
        self.killed = killed
        #: Whether the re-seeder's sum of the pages not due, and its count of
        #: the due pages it deferred, are in the run's totals (its crawl
        #: recorded, or its sum recorded in the run: leave.lua counts it).
        self.sum_stands = sum_stands
        self.deferral_stands = deferral_stands
        #: Whether the sum left out the pages the worker of a tag counted
        #: one by one (``#took``: it had counted them).
        self.sum_left_out = sum_left_out
        #: Stat name (under ``incremental/schedule/``) → what to count.
        self.totals: dict[str, int] = {}
        #: Pages whose column a killed worker counted.
        self.pages = 0

    def answers_lost(self, value: bytes) -> bool:
        """Whether a page's answers field (answer.lua) holds counts of a
        killed worker: its answers are to be merged again."""
        counts = value.split(b"|")[1].decode()
        return any(c.split(":")[1] in self.killed for c in counts.split(";") if c)

    def page(self, value: bytes) -> None:
        """Count a killed worker's share of a page's field (count_page.lua:
        ``<column><summed>:<size>|<tag>|<reply>`` or, requested after it
        was counted not requested, ``...|<its count>|<its tag>|<its reply>``)."""
        parts = value.decode().split("|")
        count, owner = parts[0], parts[1]
        reply = parts[2] if len(parts) > 2 else ""
        if count[:1] == "b":
            return  # the re-seeder's sum: leave.lua's
        if owner in self.killed:
            self.pages += 1
            if count[:1] == "r":
                self._add("requested_of_killed")
                if reply:
                    self._left(reply)
            elif not (reply or self._in_the_sum(count, owner)):
                self._unrequested(count)
        if (len(parts) >= 5 and parts[3] in self.killed and not parts[4]
                and parts[2][:1] in ("d", "s") and not self._in_the_sum(parts[2], parts[3])):
            # Counted not requested by a killed worker, requested by another.
            self.pages += 1
            self._unrequested(parts[2])

    def _add(self, name: str, n: int = 1) -> None:
        self.totals[name] = self.totals.get(name, 0) + n

    def _in_the_sum(self, count: str, tag: str) -> bool:
        """Whether the re-seeder's sum counts a page counted not requested
        (its stored state is in the sum, and the sum did not leave out the
        pages its counter counted)."""
        return count[1:2] == "1" and self.sum_stands and not self.sum_left_out(tag)

    def _unrequested(self, count: str) -> None:
        self._add("not_due" if count[:1] == "d" else _SKIPPED)
        self._add("bytes_skipped", _size(count))

    def _left(self, count: str) -> None:
        """A page requested that was counted not requested as *count*."""
        column = count[:1]
        if column == "f":
            if self.deferral_stands:
                self._add("deferred_left")
            return
        if column == "b" and not self.sum_stands:
            return  # a sum no stats hold: nothing to leave
        self._add("not_due_left" if column in ("b", "d") else _SKIPPED_LEFT)
        self._add("bytes_skipped_left", _size(count))


def _size(count: str) -> int:
    return int(count.partition(":")[2] or 0)
