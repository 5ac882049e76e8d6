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

Validators that move are judged on the response: they churn only when the
body is the one stored, byte for byte, and a body that moved with them
proves them right whatever the user's items say. A lie is judged on the
content, what the page's items say (normalised, main content only) when its
raw body changed: noise behind validators that hold hides nothing, and is
no lie; so is the evidence that re-trusts a liar (a change of the content,
validators moved with it). A page without items is judged on its raw body.

:class:`TrustRules` are these rules, pure: over a host's :class:`HostTrust`
and ``now``, they change that record and say what happened
(:class:`HostChange`). :class:`HostTrustBook` applies them for a crawl: it
caches the records, stores the ones that changed, and counts and logs what
happened. The sampled re-check itself (:func:`recheck_due`) is a decision on
a request, in :mod:`.policy`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from incremental_crawler.change.policy import Verdict, recheck_due
from incremental_crawler.state.records import HostTrust

if TYPE_CHECKING:
    from typing import Self

    from scrapy.statscollectors import StatsCollector

    from incremental_crawler.change.policy import Judgement
    from incremental_crawler.config import IncrementalConfig
    from incremental_crawler.state.stores.base import StateStore

__all__ = ["HostChange", "HostEvent", "HostTrustBook", "TrustRules", "recheck_due"]

logger = logging.getLogger(__name__)



class HostEvent(StrEnum):
    """What a rule did to a host's record."""

    #: Evidence counted; nothing decided.
    COUNTED = "counted"
    #: Its sitemap lastmods are not believed for a while.
    LASTMODS_DISTRUSTED = "lastmods_distrusted"
    #: That distrust served its time: the evidence starts from scratch.
    LASTMODS_FORGIVEN = "lastmods_forgiven"
    #: Its 304s are not believed for a while (a change hidden behind its validators).
    VALIDATORS_DISTRUSTED = "validators_distrusted"
    #: A new lie of a host distrusted already: its TTL and its count start again.
    VALIDATORS_LIED_AGAIN = "validators_lied_again"
    #: Its validators are believed again (evidence, or time served).
    VALIDATORS_RETRUSTED = "validators_retrusted"
    #: Too many of its pages flagged unstable this crawl.
    UNSTABLE = "unstable"
    #: Marked unstable, and a crawl found most of its pages stable.
    STABLE = "stable"


@dataclass(frozen=True, slots=True)
class HostChange:
    """What happened to a host's record, and why, in words for the log."""

    event: HostEvent
    why: str = ""


@dataclass(frozen=True, slots=True)
class TrustRules:
    """The thresholds; see the module docstring. Durations in seconds.

    Each rule changes only the :class:`HostTrust` it is given, and returns
    what happened (``None``: nothing, the record is as it was).
    """

    #: INCREMENTAL_LASTMOD_MIN_SAMPLES, _MAX_LIE_SHARE, _DISTRUST_TTL.
    min_samples: int
    max_lie_share: float
    distrust_ttl: float
    #: INCREMENTAL_VALIDATORS_DISTRUST_TTL and _RETRUST_AFTER.
    validators_ttl: float
    retrust_after: int
    #: INCREMENTAL_UNSTABLE_HOST_SHARE and _MIN_PAGES.
    unstable_share: float
    unstable_min_pages: int
    #: INCREMENTAL_LASTMOD_STALE_AFTER.
    stale_after: int = 3

    @classmethod
    def from_config(cls, config: IncrementalConfig) -> Self:
        return cls(
            config.lastmod_min_samples, config.lastmod_max_lie_share,
            config.lastmod_distrust_ttl, config.validators_distrust_ttl,
            config.validators_retrust_after, config.unstable_host_share,
            config.unstable_host_min_pages, config.lastmod_stale_after,
        )

    # -- sitemap lastmods ----------------------------------------------------

    def lastmods_expire(self, trust: HostTrust, now: float) -> HostChange | None:
        """A distrust of the host's lastmods whose time is up ends."""
        if not trust.distrusted_until or now < trust.distrusted_until:
            return None
        # Time served: another chance. The evidence of moved lastmods starts
        # from scratch; stale-lastmod findings stay (probation: no date
        # vouches, HostTrustBook.on_probation) until lastmods that move with
        # their pages wear them down (lastmod_tested).
        trust.distrusted_until = 0.0
        trust.checks = trust.lies = 0
        return HostChange(HostEvent.LASTMODS_FORGIVEN)

    def lastmod_tested(self, trust: HostTrust, *, lied: bool, now: float) -> HostChange | None:
        """A page fetched because its lastmod moved: it changed, or it *lied*."""
        if trust.distrusted_until:
            return None
        trust.checks += 1
        trust.lies += lied
        if not lied and trust.stale_lastmods:
            # A lastmod that moved with its page: the dates are kept again.
            trust.stale_lastmods -= 1
        if trust.checks >= self.min_samples and trust.lies > self.max_lie_share * trust.checks:
            return self.distrust_lastmods(trust, now, f"{trust.lies} of {trust.checks} "
                                          "lastmod changes came with unchanged pages")
        if trust.checks >= 4 * self.min_samples:
            # Keep the evidence recent: old behaviour weighs half.
            trust.checks //= 2
            trust.lies //= 2
        return HostChange(HostEvent.COUNTED)

    def lastmod_stale(self, trust: HostTrust, now: float) -> HostChange | None:
        """A sampled page changed behind its lastmod that did not move."""
        if trust.distrusted_until:
            return None
        trust.stale_lastmods += 1
        if trust.stale_lastmods >= self.stale_after:
            return self.distrust_lastmods(trust, now, f"{trust.stale_lastmods} pages changed "
                                          "behind lastmods that did not move")
        return HostChange(HostEvent.COUNTED)

    def distrust_lastmods(self, trust: HostTrust, now: float, why: str) -> HostChange:
        trust.distrusted_until = now + self.distrust_ttl
        return HostChange(HostEvent.LASTMODS_DISTRUSTED, why)

    # -- validators ------------------------------------------------------------

    def validators_expire(self, trust: HostTrust, now: float) -> HostChange | None:
        """A distrust of the host's validators whose time is up ends.

        The TTL is the upper bound of a distrust; evidence usually ends it
        sooner (see validators_consistent).
        """
        if not trust.validators_distrusted_until or now < trust.validators_distrusted_until:
            return None
        return self._retrust(trust, f"{self.validators_ttl:.0f} s passed")

    def validators_lied(self, trust: HostTrust, now: float) -> HostChange:
        """A page's content changed behind its unchanged validators."""
        already = bool(trust.validators_distrusted_until)
        # A new lie of a distrusted host: the evidence starts again, and so
        # does the TTL.
        trust.validators_distrusted_until = now + self.validators_ttl
        trust.validators_consistent = 0
        return HostChange(HostEvent.VALIDATORS_LIED_AGAIN if already
                          else HostEvent.VALIDATORS_DISTRUSTED)

    def validators_consistent(self, trust: HostTrust) -> HostChange | None:
        """A page's content changed, and its validators with it."""
        if not trust.validators_distrusted_until:
            return None  # no evidence needed
        trust.validators_consistent += 1
        if trust.validators_consistent >= self.retrust_after:
            return self._retrust(trust, f"{trust.validators_consistent} changes in a row "
                                 "with validators that moved")
        return HostChange(HostEvent.COUNTED)

    @staticmethod
    def _retrust(trust: HostTrust, why: str) -> HostChange:
        trust.validators_distrusted_until = 0.0
        trust.validators_consistent = 0
        return HostChange(HostEvent.VALIDATORS_RETRUSTED, why)

    def host_unstable(self, trust: HostTrust, *, judged: int, flagged: int,
                      now: float) -> HostChange | None:
        """*flagged* of the *judged* pages of this crawl so far are unstable: is the host?"""
        if trust.validators_unstable_since or not self._many(judged):
            return None
        if flagged <= self.unstable_share * judged:
            return None
        trust.validators_unstable_since = now
        return HostChange(HostEvent.UNSTABLE)

    def host_stable(self, trust: HostTrust, *, judged: int, flagged: int) -> HostChange | None:
        """The crawl's last word: a host marked unstable whose pages mostly were not is cleared."""
        if not trust.validators_unstable_since or not self._many(judged):
            return None
        if flagged > self.unstable_share * judged:
            return None
        trust.validators_unstable_since = 0.0
        return HostChange(HostEvent.STABLE)

    def _many(self, judged: int) -> bool:
        return judged >= self.unstable_min_pages


class HostTrustBook:
    """Per-host trust for a crawl: applies :class:`TrustRules`, stores, counts and logs."""

    def __init__(self, config: IncrementalConfig, store: StateStore, scope: str,
                 stats: StatsCollector) -> None:
        self.rules = TrustRules.from_config(config)
        #: host -> verdict -> pages, for the end-of-crawl report.
        self.verdicts: dict[str, dict[Verdict, int]] = {}
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

    def known(self, host: str) -> HostTrust | None:
        """The host's trust if this crawl loaded it."""
        return self._hosts.get(host)

    def _mark(self, trust: HostTrust, change: HostChange | None) -> None:
        # A record a rule changed is stored when the crawl ends.
        if change is not None:
            self._dirty.add(trust.host)

    # -- sitemap lastmods ----------------------------------------------------

    def trusted(self, trust: HostTrust, now: float) -> bool:
        """Whether the host's sitemap lastmods are believed at *now*."""
        self._mark(trust, self.rules.lastmods_expire(trust, now))
        return not trust.distrusted_until

    def on_probation(self, trust: HostTrust) -> bool:
        """Whether the host's lastmods were found stale (and not worn down
        since): a newer date still asks for a page, but none vouches for one."""
        return trust.stale_lastmods >= self.rules.stale_after

    def observe(self, host: str, *, lied: bool, now: float) -> None:
        """A page fetched because its lastmod moved: did it change?"""
        trust = self._hosts.get(host)
        if trust is None:
            return
        change = self.rules.lastmod_tested(trust, lied=lied, now=now)
        if change is None:
            return
        self._mark(trust, change)
        self.stats.inc_value("incremental/lastmod/lied" if lied else "incremental/lastmod/truthful")
        if change.event is HostEvent.LASTMODS_DISTRUSTED:
            self._lastmods_distrusted(trust, change.why, now)

    def stale(self, host: str, now: float) -> None:
        """A sampled page changed behind its unmoved lastmod: a stale-lastmod finding."""
        trust = self._hosts.get(host)
        if trust is None:
            return
        change = self.rules.lastmod_stale(trust, now)
        if change is None:
            return
        self._mark(trust, change)
        self.stats.inc_value("incremental/lastmod/stale")
        if change.event is HostEvent.LASTMODS_DISTRUSTED:
            self._lastmods_distrusted(trust, change.why, now)

    def distrust(self, trust: HostTrust, now: float, why: str) -> None:
        self._mark(trust, self.rules.distrust_lastmods(trust, now, why))
        self._lastmods_distrusted(trust, why, now)

    def _lastmods_distrusted(self, trust: HostTrust, why: str, now: float) -> None:
        self.stats.inc_value("incremental/lastmod/hosts_distrusted")
        logger.warning(
            "Not trusting the sitemap lastmods of %(host)s for %(ttl).0f s: %(why)s",
            {"host": trust.host, "ttl": trust.distrusted_until - now, "why": why},
        )

    # -- validators --------------------------------------------------------

    def validators_trusted(self, trust: HostTrust, now: float) -> bool:
        """Whether the host's 304s are believed at *now* (a distrust whose time is up ends)."""
        self._retrusted(trust, self.rules.validators_expire(trust, now))
        return not trust.validators_distrusted_until

    def validators_judged(self, host: str, judgement: Judgement, *, now: float,
                          url: str) -> None:
        """Count a response's verdict on the validators of *url*, and act on it."""
        verdict = judgement.verdict
        if verdict is None:
            return
        if verdict is Verdict.LYING:
            self._caught_lying(self.loaded(host), now, url)
        elif judgement.consistent:
            trust = self.loaded(host)
            self._retrusted(trust, self.rules.validators_consistent(trust))
        counts = self.verdicts.setdefault(host, dict.fromkeys(Verdict, 0))
        counts[verdict] += 1
        self.stats.inc_value(f"incremental/validators/{verdict}")
        if judgement.judged:
            self._page_judged(self.loaded(host), unstable=judgement.unstable, now=now)

    def _caught_lying(self, trust: HostTrust, now: float, url: str) -> None:
        change = self.rules.validators_lied(trust, now)
        self._mark(trust, change)
        if change.event is not HostEvent.VALIDATORS_DISTRUSTED:
            return  # distrusted already: said once
        self.stats.inc_value("incremental/validators/hosts_distrusted")
        logger.warning(
            "%(url)s changed behind unchanged validators: not trusting 304s from "
            "%(host)s (every page fetched in full, decided by fingerprint) until "
            "%(m)d changes in a row come with new validators, or %(ttl).0f s",
            {"url": url, "host": trust.host, "m": self.rules.retrust_after,
             "ttl": self.rules.validators_ttl},
        )

    def _retrusted(self, trust: HostTrust, change: HostChange | None) -> None:
        self._mark(trust, change)
        if change is None or change.event is not HostEvent.VALIDATORS_RETRUSTED:
            return
        self.stats.inc_value("incremental/validators/hosts_retrusted")
        logger.info("Trusting the validators of %(host)s again: %(why)s",
                    {"host": trust.host, "why": change.why})

    def _page_judged(self, trust: HostTrust, *, unstable: bool, now: float) -> None:
        counts = self.judged.setdefault(trust.host, [0, 0])
        counts[0] += 1
        counts[1] += unstable
        change = self.rules.host_unstable(trust, judged=counts[0], flagged=counts[1], now=now)
        if change is None:
            return
        self._mark(trust, change)
        self.stats.inc_value("incremental/validators/hosts_unstable")
        logger.warning(
            "The validators of %(host)s are unstable (%(n)d of %(m)d pages change "
            "them while their content does not): still sent, the fingerprint decides",
            {"host": trust.host, "n": counts[1], "m": counts[0]},
        )

    def settle_unstable(self) -> None:
        """Clear the hosts marked unstable whose pages this crawl mostly found stable.

        Called when the crawl ends (before its report, and before saving);
        a second call changes nothing.
        """
        for host, (judged, flagged) in self.judged.items():
            trust = self._hosts.get(host)
            if trust is None:
                continue
            change = self.rules.host_stable(trust, judged=judged, flagged=flagged)
            if change is not None:
                self._mark(trust, change)
                logger.info("The validators of %(host)s are stable again (%(n)d of %(m)d "
                            "pages flagged)", {"host": host, "n": flagged, "m": judged})

    def save(self) -> None:
        self.settle_unstable()
        for host in sorted(self._dirty):
            self.store.stage_host(self._hosts[host])
        self._dirty.clear()
