"""Whether a host's sitemap lastmods, and its validators, can be believed.

A sitemap lies when its lastmods move while the pages do not change (they
answer 304 or come back with the same fingerprint), or when every lastmod
is simply the time the sitemap was generated. A host caught lying often
enough stops being trusted for a while: its pages fall back to conditional
requests on their revisit schedule.

Validators lie when a page's content changed behind an unchanged ETag or
Last-Modified; the forced refresh (INCREMENTAL_MAX_AGE) and a sampled
re-check (every Nth conditional request of a host sent without
conditions) find it. Such a host is not trusted for 304s for a while:
every page is fetched in full and decided by its fingerprint. Validators
that change while the content does not are *unstable*: still sent (a 304
is still free), counted and reported. Evidence is kept per host in the
store.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

    from incremental_crawler.config import IncrementalConfig
    from incremental_crawler.stores.base import StateStore

__all__ = ["HostTrust", "HostTrustBook", "VALIDATOR_VERDICTS"]

#: What a full fetch says about a page's validators.
VALIDATOR_VERDICTS = ("reliable", "unstable", "lying", "absent")

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class HostTrust:
    """Lastmod evidence for one host of one scope."""

    scope: str
    host: str
    checks: int = 0
    lies: int = 0
    distrusted_until: float = 0.0
    #: Until when this host's 304s are not trusted (its validators lied).
    validators_distrusted_until: float = 0.0


class HostTrustBook:
    """Per-host trust for a crawl; see the module docstring."""

    def __init__(self, config: IncrementalConfig, store: StateStore, scope: str,
                 stats: StatsCollector) -> None:
        self.min_samples = config.lastmod_min_samples
        self.max_lie_share = config.lastmod_max_lie_share
        self.distrust_ttl = config.lastmod_distrust_ttl
        self.recheck_every = config.recheck_every
        self.validators_ttl = config.validators_distrust_ttl
        self._conditional: dict[str, int] = {}
        #: host -> verdict -> pages, for the end-of-crawl report.
        self.verdicts: dict[str, dict[str, int]] = {}
        self.store = store
        self.scope = scope
        self.stats = stats
        self._hosts: dict[str, HostTrust] = {}
        self._dirty: set[str] = set()

    async def load(self, host: str) -> HostTrust:
        trust = self._hosts.get(host)
        if trust is None:
            trust = await self.store.get_host(self.scope, host) or HostTrust(self.scope, host)
            self._hosts[host] = trust
        return trust

    def loaded(self, host: str) -> HostTrust:
        """The host's trust as loaded this crawl (a blank one if it never was)."""
        trust = self._hosts.get(host)
        if trust is None:
            trust = self._hosts[host] = HostTrust(self.scope, host)
        return trust

    def trusted(self, trust: HostTrust, now: float) -> bool:
        if trust.distrusted_until and now >= trust.distrusted_until:
            # Time served: give the host another chance, from scratch.
            trust.distrusted_until = 0.0
            trust.checks = trust.lies = 0
            self._dirty.add(trust.host)
        return not trust.distrusted_until

    def observe(self, host: str, *, lied: bool, now: float) -> None:
        """A page fetched because its lastmod moved: did it change?"""
        trust = self._hosts.get(host)
        if trust is None or trust.distrusted_until:
            return
        trust.checks += 1
        trust.lies += lied
        self._dirty.add(host)
        self.stats.inc_value("incremental/lastmod/lied" if lied else "incremental/lastmod/truthful")
        if trust.checks >= self.min_samples and trust.lies > self.max_lie_share * trust.checks:
            self.distrust(trust, now, f"{trust.lies} of {trust.checks} lastmod changes "
                                      "came with unchanged pages")
        elif trust.checks >= 4 * self.min_samples:
            # Keep the evidence recent: old behaviour weighs half.
            trust.checks //= 2
            trust.lies //= 2

    def distrust(self, trust: HostTrust, now: float, why: str) -> None:
        trust.distrusted_until = now + self.distrust_ttl
        self._dirty.add(trust.host)
        self.stats.inc_value("incremental/lastmod/hosts_distrusted")
        logger.warning(
            "Not trusting the sitemap lastmods of %(host)s for %(ttl).0f s: %(why)s",
            {"host": trust.host, "ttl": self.distrust_ttl, "why": why},
        )

    # -- validators --------------------------------------------------------

    def validators_trusted(self, trust: HostTrust, now: float) -> bool:
        if trust.validators_distrusted_until and now >= trust.validators_distrusted_until:
            trust.validators_distrusted_until = 0.0  # proves itself again
            self._dirty.add(trust.host)
        return not trust.validators_distrusted_until

    def sample_due(self, host: str) -> bool:
        """Whether this conditional request of *host* is the sampled one."""
        if not self.recheck_every:
            return False
        count = self._conditional[host] = self._conditional.get(host, 0) + 1
        return count % self.recheck_every == 0

    def verdict(self, host: str, verdict: str) -> None:
        counts = self.verdicts.setdefault(host, dict.fromkeys(VALIDATOR_VERDICTS, 0))
        counts[verdict] += 1
        self.stats.inc_value(f"incremental/validators/{verdict}")

    def caught_lying(self, trust: HostTrust, now: float, url: str) -> None:
        self.verdict(trust.host, "lying")
        if trust.validators_distrusted_until:
            return
        trust.validators_distrusted_until = now + self.validators_ttl
        self._dirty.add(trust.host)
        self.stats.inc_value("incremental/validators/hosts_distrusted")
        logger.warning(
            "%(url)s changed behind unchanged validators: not trusting 304s from "
            "%(host)s for %(ttl).0f s (every page fetched in full, decided by fingerprint)",
            {"url": url, "host": trust.host, "ttl": self.validators_ttl},
        )

    def report_lines(self) -> list[str]:
        lines = []
        for host, counts in sorted(self.verdicts.items()):
            parts = " / ".join(f"{name} {counts[name]}" for name in VALIDATOR_VERDICTS)
            lines.append(f"  {host}: validators {parts}")
        return lines

    def save(self) -> None:
        for host in sorted(self._dirty):
            self.store.stage_host(self._hosts[host])
        self._dirty.clear()
