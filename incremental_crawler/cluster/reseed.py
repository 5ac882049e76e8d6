"""The re-seeder of cluster mode: once per run, by the worker that claims it.

:func:`~incremental_crawler.cluster.apply_cluster_settings` installs it in
place of :class:`~incremental_crawler.crawl.reseed.Reseeder` (at the same
order): the cluster's coordinator says which worker re-seeds a run, and when.
"""

from __future__ import annotations

from incremental_crawler.crawl.reseed import Reseeder, RunClaims

__all__ = ["ClusterReseeder"]


class ClusterReseeder(Reseeder):
    """:class:`Reseeder` asking the cluster's coordinator for the run's job."""

    def _cluster(self) -> RunClaims | None:
        # Imported here: it imports Redis's client, which a crawl that is not
        # a cluster's does without (a tenth of a second of its start).
        from incremental_crawler.cluster.coordinator import ClusterCoordinator  # noqa: PLC0415

        return self.crawler.get_extension(ClusterCoordinator)
