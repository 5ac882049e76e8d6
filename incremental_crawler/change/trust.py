"""Whether a host's sitemap lastmods, and its validators, can be believed.

A sitemap lies when its lastmods move while the pages do not change (they
answer 304 or come back with the same fingerprint), or when every lastmod
is simply the time the sitemap was generated. A host caught lying often
enough stops being trusted for a while: its pages fall back to conditional
requests on their revisit schedule.

Validators lie when a page's content changed behind an unchanged ETag or
Last-Modified: a conditional request gets a 304 and the change is hidden.
Two things find it: the forced refresh (INCREMENTAL_MAX_AGE, a time bound)
and the sampled re-check, a bound in visits. With
``INCREMENTAL_RECHECK_EVERY = N``, a page goes without conditions on the
visits ``v`` (its ``checks`` count, this one included) where
``(v + phase) % N == 0``, ``phase`` a CRC-32 of its path and query. So:

* every page is fetched in full on exactly one of any N consecutive visits
  (a deterministic rotation, not luck): **a change hidden behind a lying
  validator is found at the latest on the N-th visit of its page after
  the change** - within N crawls for a page visited once per crawl. The
  stored fingerprint stays the old one until then, so nothing is lost by
  waiting: the full fetch compares against the content we last stored;
* the phases spread a host's P pages evenly, so each crawl fetches about
  P / N of them in full (1/N of the conditional requests: the cost), and a
  page is never re-sampled before every other page of its phase cycle was.
  A host with hidden changes on h of its pages is caught within N crawls
  of its first hidden change, and after about N / (h + 1) crawls on average;
* once caught, the host is *distrusted*: every one of its pages is fetched
  in full, decided by its fingerprint, so **every hidden change of the host
  is found on the next visit of its page**. It is trusted again after
  INCREMENTAL_VALIDATORS_RETRUST_AFTER = M changes in a row whose
  validators changed with them (a new lie starts the count again; an
  unchanged page is no evidence either way: a liar's unchanged pages look
  the same; by the rule of three, no lie in M = 100 changes bounds the
  share of changes hidden below 3% at 95% confidence), or at the latest
  after INCREMENTAL_VALIDATORS_DISTRUST_TTL seconds.

Validators that change while the content does not are *unstable*: after
INCREMENTAL_UNSTABLE_AFTER full fetches in a row the page is flagged, and a
host with more than INCREMENTAL_UNSTABLE_HOST_SHARE of at least
INCREMENTAL_UNSTABLE_HOST_MIN_PAGES pages judged in a crawl flagged is marked
unstable (stored, reported). They are still sent (a 304 is still free); a
full fetch is decided by the fingerprint, so unchanged content makes no
item. Evidence is kept per host in the store.

"Content" is what the page's items say (normalised, main content only)
when its raw body changed: noise behind validators that hold is no lie, and
noise behind validators that move is a churn. A page without items is
judged on its raw body.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from incremental_crawler.change.policy import recheck_due
from incremental_crawler.state.records import HostTrust

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

    from incremental_crawler.config import IncrementalConfig
    from incremental_crawler.state.stores.base import StateStore

__all__ = ["HostTrustBook", "VALIDATOR_VERDICTS", "recheck_due"]

#: What a full fetch says about a page's validators.
VALIDATOR_VERDICTS = ("reliable", "unstable", "lying", "absent")

logger = logging.getLogger(__name__)


class HostTrustBook:
    """Per-host trust for a crawl; see the module docstring."""

    def __init__(self, config: IncrementalConfig, store: StateStore, scope: str,
                 stats: StatsCollector) -> None:
        self.min_samples = config.lastmod_min_samples
        self.max_lie_share = config.lastmod_max_lie_share
        self.distrust_ttl = config.lastmod_distrust_ttl
        self.recheck_every = config.recheck_every
        self.validators_ttl = config.validators_distrust_ttl
        self.retrust_after = config.validators_retrust_after
        self.unstable_share = config.unstable_host_share
        self.unstable_min_pages = config.unstable_host_min_pages
        #: host -> verdict -> pages, for the end-of-crawl report.
        self.verdicts: dict[str, dict[str, int]] = {}
        #: host -> [pages with validators judged, of which flagged unstable],
        #: this crawl.
        self.judged: dict[str, list[int]] = {}
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
            # The TTL is the upper bound of a distrust; evidence usually
            # ends it sooner (see consistent()).
            self._retrust(trust, f"{self.validators_ttl:.0f} s passed")
        return not trust.validators_distrusted_until

    def sample_due(self, url: str, visit: int) -> bool:
        """Whether *visit* of *url* is its sampled re-check (see the module docstring)."""
        return recheck_due(url, visit, self.recheck_every)

    def verdict(self, host: str, verdict: str) -> None:
        counts = self.verdicts.setdefault(host, dict.fromkeys(VALIDATOR_VERDICTS, 0))
        counts[verdict] += 1
        self.stats.inc_value(f"incremental/validators/{verdict}")

    def caught_lying(self, trust: HostTrust, now: float, url: str) -> None:
        self.verdict(trust.host, "lying")
        self._dirty.add(trust.host)
        already = bool(trust.validators_distrusted_until)
        # A new lie of a distrusted host: the evidence starts again, and so
        # does the TTL.
        trust.validators_distrusted_until = now + self.validators_ttl
        trust.validators_consistent = 0
        if already:
            return
        self.stats.inc_value("incremental/validators/hosts_distrusted")
        logger.warning(
            "%(url)s changed behind unchanged validators: not trusting 304s from "
            "%(host)s (every page fetched in full, decided by fingerprint) until "
            "%(m)d changes in a row come with new validators, or %(ttl).0f s",
            {"url": url, "host": trust.host, "m": self.retrust_after, "ttl": self.validators_ttl},
        )

    def consistent(self, trust: HostTrust) -> None:
        """A full fetch whose content changed, and its validators with it."""
        if not trust.validators_distrusted_until:
            return
        trust.validators_consistent += 1
        self._dirty.add(trust.host)
        if trust.validators_consistent >= self.retrust_after:
            self._retrust(trust, f"{trust.validators_consistent} changes in a row with validators that moved")

    def _retrust(self, trust: HostTrust, why: str) -> None:
        trust.validators_distrusted_until = 0.0
        trust.validators_consistent = 0
        self._dirty.add(trust.host)
        self.stats.inc_value("incremental/validators/hosts_retrusted")
        logger.info("Trusting the validators of %(host)s again: %(why)s",
                    {"host": trust.host, "why": why})

    def page_judged(self, trust: HostTrust, *, unstable: bool, now: float) -> None:
        """A page with validators was fetched (or answered 304): is it flagged unstable?"""
        counts = self.judged.setdefault(trust.host, [0, 0])
        counts[0] += 1
        counts[1] += unstable
        if (
            not trust.validators_unstable_since
            and counts[0] >= self.unstable_min_pages
            and counts[1] > self.unstable_share * counts[0]
        ):
            trust.validators_unstable_since = now
            self._dirty.add(trust.host)
            self.stats.inc_value("incremental/validators/hosts_unstable")
            logger.warning(
                "The validators of %(host)s are unstable (%(n)d of %(m)d pages change "
                "them while their content does not): still sent, the fingerprint decides",
                {"host": trust.host, "n": counts[1], "m": counts[0]},
            )

    def _settle_unstable(self) -> None:
        # A host marked unstable is cleared by a crawl that judged enough of
        # its pages and found most of them stable.
        for host, (judged, unstable) in self.judged.items():
            trust = self._hosts.get(host)
            if (
                trust is not None and trust.validators_unstable_since
                and judged >= self.unstable_min_pages
                and unstable <= self.unstable_share * judged
            ):
                trust.validators_unstable_since = 0.0
                self._dirty.add(host)
                logger.info("The validators of %(host)s are stable again (%(n)d of %(m)d "
                            "pages flagged)", {"host": host, "n": unstable, "m": judged})

    def report_lines(self) -> list[str]:
        self._settle_unstable()
        lines = []
        for host in sorted(self.verdicts.keys() | self.judged.keys()):
            counts = self.verdicts.get(host) or dict.fromkeys(VALIDATOR_VERDICTS, 0)
            parts = " / ".join(f"{name} {counts[name]}" for name in VALIDATOR_VERDICTS)
            line = f"  {host}: validators {parts}"
            trust = self._hosts.get(host)
            if trust is not None and trust.validators_distrusted_until:
                line += (f"; host lying: 304s not trusted ({trust.validators_consistent} of "
                         f"{self.retrust_after} changes with moved validators to re-trust)")
            if trust is not None and trust.validators_unstable_since:
                judged, unstable = self.judged.get(host, (0, 0))
                line += f"; host unstable ({unstable} of {judged} pages flagged)"
            lines.append(line)
        return lines

    def save(self) -> None:
        self._settle_unstable()
        for host in sorted(self._dirty):
            self.store.stage_host(self._hosts[host])
        self._dirty.clear()
