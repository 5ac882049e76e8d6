"""Per-host counts of a crawl's decisions and answers, for the report's per-host table.

The crawl's stats count decisions and outcomes for the whole crawl
(``incremental/schedule/...``, ``incremental/not_modified``, ...). The
same events are counted here per host, by whoever counts them in the stats
(the schedule counter, the conditional middleware), so that the report can
say which site skipped, checked and saved what.

Bounded: the first :data:`MAX_HOSTS` hosts seen get counters of their own;
the events of any later host add up under :data:`OTHER_HOSTS`. Each host
holds one small ``dict`` of the event names below, whatever the crawl's
size.
"""

from __future__ import annotations

from incremental_crawler.hosts import host_of

__all__ = ["EVENTS", "MAX_HOSTS", "OTHER_HOSTS", "UNLISTED", "HostCounts"]

#: Hosts with counters of their own, at most.
MAX_HOSTS = 1000
#: Where the events of hosts beyond MAX_HOSTS add up.
OTHER_HOSTS = "(other hosts)"
#: Known pages that nothing listed or linked this crawl, counted not due by
#: the re-seeder in one store query: their hosts are not told apart.
UNLISTED = "(not listed or linked)"

#: The events counted, as their stats are named without ``incremental/``:
#: ``requested/<why>`` (the schedule's reasons,
#: :class:`~incremental_crawler.change.accounting.Why`), ``requests/<reason>``
#: (with conditions or not, :class:`~incremental_crawler.change.policy.RequestReason`),
#: and these.
EVENTS = (
    "skipped_lastmod", "not_due", "failed", "not_modified", "pages_new", "pages_changed",
    "pages_unchanged", "bytes_saved_estimate", "bytes_skipped",
)



class HostCounts:
    """``count(host, event, n)``; :meth:`table` gives the counts per host."""

    def __init__(self, max_hosts: int = MAX_HOSTS) -> None:
        self.max_hosts = max_hosts
        self._hosts: dict[str, dict[str, int]] = {}

    def count(self, host: str, event: str, n: int = 1) -> None:
        counts = self._hosts.get(host)
        if counts is None:
            if len(self._hosts) >= self.max_hosts and host not in (OTHER_HOSTS, UNLISTED):
                host = OTHER_HOSTS
            counts = self._hosts.setdefault(host, {})
        counts[event] = counts.get(event, 0) + n

    def count_url(self, url: str, event: str, n: int = 1) -> None:
        self.count(host_of(url), event, n)

    def drop(self, events: tuple[str, ...]) -> None:
        """Forget the counts of *events* (a name ending in "/": every event
        under it) on every host."""
        for counts in self._hosts.values():
            for event in list(counts):
                if any(event == e or (e.endswith("/") and event.startswith(e))
                       for e in events):
                    del counts[event]

    def table(self) -> dict[str, dict[str, int]]:
        """Host -> event -> count (events never seen are absent), hosts sorted."""
        return {host: dict(self._hosts[host]) for host in sorted(self._hosts)}
