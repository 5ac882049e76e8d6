"""TrustRules, one table per rule; then the book that applies them, and its report.

Each row is a host's record before, what happened, and the expected
record after and event. No reactor, no network.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest
from scrapy.settings import Settings
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from incremental_crawler.change.policy import Judgement, Verdict
from incremental_crawler.change.trust import (
    HostChange,
    HostEvent,
    HostTrustBook,
    TrustRules,
)
from incremental_crawler.config import DEFAULT_SETTINGS, IncrementalConfig
from incremental_crawler.report.extension import trust_lines
from incremental_crawler.state.records import HostTrust
from incremental_crawler.state.stores.sqlite import SQLiteStateStore

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

RULES = TrustRules(min_samples=4, max_lie_share=0.5, distrust_ttl=1000.0, validators_ttl=500.0,
                   retrust_after=3, unstable_share=0.5, unstable_min_pages=4)
NOW = 10_000.0


def host(**fields: Any) -> HostTrust:
    return HostTrust("scope", "h", **fields)


def check(rule: Callable[[HostTrust], HostChange | None], before: dict[str, Any],
          after: dict[str, Any], change: HostChange | None) -> None:
    trust = host(**before)
    assert rule(trust) == change
    assert trust == host(**{**before, **after})


# -- sitemap lastmods -------------------------------------------------------------

LASTMODS_EXPIRE = [
    # (case, before, after, change)
    ("trusted", {"checks": 3, "lies": 1}, {}, None),
    ("distrusted, not yet", {"distrusted_until": NOW + 1, "lies": 9}, {}, None),
    ("time served", {"distrusted_until": NOW, "checks": 9, "lies": 6},
     {"distrusted_until": 0.0, "checks": 0, "lies": 0},
     HostChange(HostEvent.LASTMODS_FORGIVEN)),
    # Stale-lastmod findings stay: the host is on probation.
    ("time served, stale findings kept", {"distrusted_until": NOW, "stale_lastmods": 3},
     {"distrusted_until": 0.0}, HostChange(HostEvent.LASTMODS_FORGIVEN)),
]


@pytest.mark.parametrize(("case", "before", "after", "change"), LASTMODS_EXPIRE,
                         ids=[row[0] for row in LASTMODS_EXPIRE])
def test_lastmods_expire(case: str, before: dict[str, Any], after: dict[str, Any],
                         change: HostChange | None) -> None:
    check(lambda t: RULES.lastmods_expire(t, NOW), before, after, change)


COUNTED = HostChange(HostEvent.COUNTED)
LASTMOD_TESTED = [
    # (case, before, lied, after, change)
    ("distrusted: not counted", {"distrusted_until": NOW + 1}, True, {}, None),
    ("a first lie", {}, True, {"checks": 1, "lies": 1}, COUNTED),
    ("a truthful one", {"checks": 1, "lies": 1}, False, {"checks": 2}, COUNTED),
    ("too few samples to judge", {"checks": 2, "lies": 2}, True, {"checks": 3, "lies": 3},
     COUNTED),
    ("half lied: not more than half", {"checks": 3, "lies": 1}, True, {"checks": 4, "lies": 2},
     COUNTED),
    ("more than half lied", {"checks": 3, "lies": 2}, True,
     {"checks": 4, "lies": 3, "distrusted_until": NOW + 1000},
     HostChange(HostEvent.LASTMODS_DISTRUSTED,
                "3 of 4 lastmod changes came with unchanged pages")),
    ("old evidence weighs half", {"checks": 15, "lies": 5}, False, {"checks": 8, "lies": 2},
     COUNTED),
    # A lastmod that moved with its page wears a stale-lastmod finding down.
    ("truthful, on probation", {"stale_lastmods": 3}, False,
     {"checks": 1, "stale_lastmods": 2}, COUNTED),
    ("a lie does not", {"stale_lastmods": 3}, True,
     {"checks": 1, "lies": 1, "stale_lastmods": 3}, COUNTED),
]


@pytest.mark.parametrize(("case", "before", "lied", "after", "change"), LASTMOD_TESTED,
                         ids=[row[0] for row in LASTMOD_TESTED])
def test_lastmod_tested(case: str, before: dict[str, Any], lied: bool, after: dict[str, Any],
                        change: HostChange | None) -> None:
    check(lambda t: RULES.lastmod_tested(t, lied=lied, now=NOW), before, after, change)


LASTMOD_STALE = [
    # (case, before, after, change); RULES.stale_after is 3.
    ("distrusted already: not counted", {"distrusted_until": NOW + 1}, {}, None),
    ("a first finding", {}, {"stale_lastmods": 1}, COUNTED),
    ("one short", {"stale_lastmods": 1}, {"stale_lastmods": 2}, COUNTED),
    ("the third finding", {"stale_lastmods": 2},
     {"stale_lastmods": 3, "distrusted_until": NOW + 1000},
     HostChange(HostEvent.LASTMODS_DISTRUSTED,
                "3 pages changed behind lastmods that did not move")),
]


@pytest.mark.parametrize(("case", "before", "after", "change"), LASTMOD_STALE,
                         ids=[row[0] for row in LASTMOD_STALE])
def test_lastmod_stale(case: str, before: dict[str, Any], after: dict[str, Any],
                       change: HostChange | None) -> None:
    check(lambda t: RULES.lastmod_stale(t, NOW), before, after, change)


def test_distrust_lastmods_for_a_reason_given() -> None:
    check(lambda t: RULES.distrust_lastmods(t, NOW, "dates are now"), {"checks": 2},
          {"distrusted_until": NOW + 1000},
          HostChange(HostEvent.LASTMODS_DISTRUSTED, "dates are now"))


# -- validators -----------------------------------------------------------------

RETRUSTED_BY_TIME = HostChange(HostEvent.VALIDATORS_RETRUSTED, "500 s passed")
VALIDATORS_EXPIRE = [
    ("trusted", {}, {}, None),
    ("distrusted, not yet", {"validators_distrusted_until": NOW + 1}, {}, None),
    ("time served", {"validators_distrusted_until": NOW, "validators_consistent": 2},
     {"validators_distrusted_until": 0.0, "validators_consistent": 0}, RETRUSTED_BY_TIME),
]


@pytest.mark.parametrize(("case", "before", "after", "change"), VALIDATORS_EXPIRE,
                         ids=[row[0] for row in VALIDATORS_EXPIRE])
def test_validators_expire(case: str, before: dict[str, Any], after: dict[str, Any],
                           change: HostChange | None) -> None:
    check(lambda t: RULES.validators_expire(t, NOW), before, after, change)


VALIDATORS_LIED = [
    ("a first lie", {}, {"validators_distrusted_until": NOW + 500},
     HostChange(HostEvent.VALIDATORS_DISTRUSTED)),
    ("a lie while distrusted: count and TTL restart",
     {"validators_distrusted_until": NOW + 1, "validators_consistent": 2},
     {"validators_distrusted_until": NOW + 500, "validators_consistent": 0},
     HostChange(HostEvent.VALIDATORS_LIED_AGAIN)),
    ("a lie after the TTL, not yet ended", {"validators_distrusted_until": NOW - 1},
     {"validators_distrusted_until": NOW + 500}, HostChange(HostEvent.VALIDATORS_LIED_AGAIN)),
]


@pytest.mark.parametrize(("case", "before", "after", "change"), VALIDATORS_LIED,
                         ids=[row[0] for row in VALIDATORS_LIED])
def test_validators_lied(case: str, before: dict[str, Any], after: dict[str, Any],
                         change: HostChange) -> None:
    check(lambda t: RULES.validators_lied(t, NOW), before, after, change)


DISTRUSTED = {"validators_distrusted_until": NOW + 1}
VALIDATORS_CONSISTENT = [
    ("trusted: no evidence needed", {}, {}, None),
    ("distrusted: counted", DISTRUSTED, {"validators_consistent": 1}, COUNTED),
    ("the M-th in a row re-trusts", {**DISTRUSTED, "validators_consistent": 2},
     {"validators_distrusted_until": 0.0, "validators_consistent": 0},
     HostChange(HostEvent.VALIDATORS_RETRUSTED,
                "3 changes in a row with validators that moved")),
]


@pytest.mark.parametrize(("case", "before", "after", "change"), VALIDATORS_CONSISTENT,
                         ids=[row[0] for row in VALIDATORS_CONSISTENT])
def test_validators_consistent(case: str, before: dict[str, Any], after: dict[str, Any],
                               change: HostChange | None) -> None:
    check(RULES.validators_consistent, before, after, change)


MARKED = {"validators_unstable_since": 5.0}
HOST_UNSTABLE = [
    # (case, before, judged, flagged, after, change)
    ("marked already", MARKED, 10, 10, {}, None),
    ("too few pages judged", {}, 3, 3, {}, None),
    ("half flagged: not more than half", {}, 4, 2, {}, None),
    ("more than half flagged", {}, 4, 3, {"validators_unstable_since": NOW},
     HostChange(HostEvent.UNSTABLE)),
]


@pytest.mark.parametrize(("case", "before", "judged", "flagged", "after", "change"),
                         HOST_UNSTABLE, ids=[row[0] for row in HOST_UNSTABLE])
def test_host_unstable(case: str, before: dict[str, Any], judged: int, flagged: int,
                       after: dict[str, Any], change: HostChange | None) -> None:
    check(lambda t: RULES.host_unstable(t, judged=judged, flagged=flagged, now=NOW),
          before, after, change)


HOST_STABLE = [
    ("not marked", {}, 10, 0, {}, None),
    ("too few pages judged", MARKED, 3, 0, {}, None),
    ("more than half flagged still", MARKED, 4, 3, {}, None),
    ("half or fewer flagged", MARKED, 4, 2, {"validators_unstable_since": 0.0},
     HostChange(HostEvent.STABLE)),
]


@pytest.mark.parametrize(("case", "before", "judged", "flagged", "after", "change"),
                         HOST_STABLE, ids=[row[0] for row in HOST_STABLE])
def test_host_stable(case: str, before: dict[str, Any], judged: int, flagged: int,
                     after: dict[str, Any], change: HostChange | None) -> None:
    check(lambda t: RULES.host_stable(t, judged=judged, flagged=flagged), before, after, change)


def test_rules_from_config_read_the_settings() -> None:
    config = IncrementalConfig.from_settings(Settings({
        "INCREMENTAL_VALIDATORS_RETRUST_AFTER": 3, "INCREMENTAL_UNSTABLE_HOST_MIN_PAGES": 4}))
    assert TrustRules.from_config(config) == replace(
        RULES, min_samples=DEFAULT_SETTINGS["INCREMENTAL_LASTMOD_MIN_SAMPLES"],
        max_lie_share=DEFAULT_SETTINGS["INCREMENTAL_LASTMOD_MAX_LIE_SHARE"],
        distrust_ttl=DEFAULT_SETTINGS["INCREMENTAL_LASTMOD_DISTRUST_TTL"],
        validators_ttl=DEFAULT_SETTINGS["INCREMENTAL_VALIDATORS_DISTRUST_TTL"],
        unstable_share=DEFAULT_SETTINGS["INCREMENTAL_UNSTABLE_HOST_SHARE"])


# -- the book: cache, stats, storage; and the report's lines --------------------------

@pytest.fixture
def book(tmp_path: Path) -> HostTrustBook:
    config = IncrementalConfig.from_settings(Settings({
        "INCREMENTAL_VALIDATORS_RETRUST_AFTER": 2, "INCREMENTAL_UNSTABLE_HOST_MIN_PAGES": 2,
        "INCREMENTAL_VALIDATORS_DISTRUST_TTL": 500}))
    stats = MemoryStatsCollector(get_crawler())
    return HostTrustBook(config, SQLiteStateStore(tmp_path / "state.db"), "scope", stats)


def stat(book: HostTrustBook, name: str) -> int:
    return book.stats.get_value(f"incremental/validators/{name}", 0)


def test_a_lie_distrusts_the_host_once_and_consistent_changes_retrust_it(
    book: HostTrustBook,
) -> None:
    lie, consistent = Judgement(Verdict.LYING), Judgement(Verdict.RELIABLE, consistent=True)
    for _ in range(2):
        book.validators_judged("h", lie, now=NOW, url="http://h/a")
    assert (stat(book, "lying"), stat(book, "hosts_distrusted")) == (2, 1)
    trust = book.known("h")
    assert trust is not None and trust.validators_distrusted_until == NOW + 500
    book.validators_judged("h", consistent, now=NOW, url="http://h/b")
    assert trust.validators_distrusted_until  # one of two
    book.validators_judged("h", consistent, now=NOW, url="http://h/c")
    assert trust.validators_distrusted_until == 0.0
    assert (stat(book, "reliable"), stat(book, "hosts_retrusted")) == (2, 1)
    book.save()
    assert book.store.pending == 1  # the host's record, staged once


def test_a_page_without_validators_leaves_no_host_record(book: HostTrustBook) -> None:
    # Its lastmod evidence only counts for a host loaded this crawl.
    book.validators_judged("h", Judgement(Verdict.ABSENT), now=NOW, url="http://h/a")
    assert stat(book, "absent") == 1
    assert book.known("h") is None and book.judged == {}
    book.save()
    assert book.store.pending == 0


def test_report_lines_say_what_the_crawl_found_per_host(book: HostTrustBook) -> None:
    flagged = Judgement(Verdict.UNSTABLE, unstable=True, churns=2, flagged=True)
    for _ in range(2):
        book.validators_judged("b.example", flagged, now=NOW, url="http://b.example/")
    book.validators_judged("a.example", Judgement(Verdict.LYING), now=NOW, url="http://a/")
    book.validators_judged("a.example", Judgement(Verdict.ABSENT), now=NOW, url="http://a/x")
    assert stat(book, "hosts_unstable") == 1
    assert trust_lines(book) == [
        ("  a.example: validators reliable 0 / unstable 0 / lying 1 / absent 1; host lying: "
         "304s not trusted (0 of 2 changes with moved validators to re-trust)"),
        ("  b.example: validators reliable 0 / unstable 2 / lying 0 / absent 0; "
         "host unstable (2 of 2 pages flagged)"),
    ]


def test_a_crawl_that_finds_a_host_stable_again_clears_it(book: HostTrustBook) -> None:
    trust = book.loaded("h")
    trust.validators_unstable_since = 5.0
    for _ in range(2):
        book.validators_judged("h", Judgement(Verdict.RELIABLE), now=NOW, url="http://h/")
    assert trust_lines(book) == [
        "  h: validators reliable 2 / unstable 0 / lying 0 / absent 0"]
    assert trust.validators_unstable_since == 0.0
    book.save()
    assert book.store.pending == 1
