"""ChangePolicy: every decision of change detection, one table each.

Each row is a stored page (or none) and what one request or response says;
the expected value is the decision. No reactor, no network, no store.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from incremental_crawler.change.accounting import Why
from incremental_crawler.change.policy import (
    ChangePolicy,
    CrawlDueRules,
    Fetch,
    Judgement,
    NotDueBounds,
    Refetch,
    RequestReason,
    Verdict,
    future_last_modified,
    gone_due,
    links_unknown,
    not_due_bounds,
    recheck_due,
    schedule_why,
)
from incremental_crawler.change.revisit import RevisitSchedule
from incremental_crawler.state.records import HostTrust, PageFlags, PageKey, PageState

KEY = PageKey("scope", "http://h/a")
URL = KEY.url
LM1 = "Mon, 01 Jan 2024 00:00:00 GMT"
LM2 = "Tue, 02 Jan 2024 00:00:00 GMT"
DAY = 86400.0
SCHEDULE = RevisitSchedule(initial=DAY, minimum=3600, maximum=30 * DAY, inc_rate=0.4,
                           dec_rate=0.2)
NOW = 10 * DAY
#: The revisit interval after a visit with DAY: the content changed, or not.
SOONER, LATER = 69_120, 120_960
UNSTABLE = PageFlags.UNSTABLE_VALIDATORS


def policy(**changes: Any) -> ChangePolicy:
    base = ChangePolicy(max_age=0.0, unstable_after=2, recheck_every=0, schedule=None)
    return replace(base, **changes)


def page(**changes: Any) -> PageState:
    """A stored page: fetched 9 days ago, both validators, due tomorrow."""
    base = PageState(
        KEY, etag='"v1"', last_modified=LM1, fingerprint="body1", size=100, last_status=200,
        first_seen=DAY, last_checked=DAY, last_fetched=DAY, last_changed=DAY, checks=3,
        changes=1, lastmod=DAY, interval=DAY, next_visit=NOW + DAY, callback="parse",
    )
    return base.copy(**changes)


def fetch(**changes: Any) -> Fetch:
    """A 2xx for KEY with the stored validators and body."""
    return replace(Fetch(KEY, '"v1"', LM1, "body1", 100, 200, callback="parse"), **changes)


def test_enum_values_are_the_stats_key_names() -> None:
    # Stats keys are built from them, e.g. incremental/requests/host_lying.
    assert [str(r) for r in RequestReason] == [
        "new", "no_validators", "conditional", "refresh", "links_unknown", "max_age",
        "host_lying", "sample"]
    assert [str(r) for r in Refetch] == [
        "unsolicited_304", "foreign_conditions_304", "vary_star_304",
        "lastmod_contradicts_304", "etag_mismatch_304", "last_modified_later_304"]
    assert [str(v) for v in Verdict] == ["reliable", "unstable", "lying", "absent"]
    assert f"incremental/refetch/{Refetch.VARY_STAR}" == "incremental/refetch/vary_star_304"


def test_page_flags_are_the_ints_the_stores_keep() -> None:
    assert (PageFlags.VARY_STAR, PageFlags.REDIRECTED, UNSTABLE) == (1, 2, 4)
    flags = PageFlags.VARY_STAR | UNSTABLE
    assert flags == 5 and f"{flags}" == "5"
    assert 7 & ~(PageFlags.VARY_STAR | UNSTABLE) == PageFlags.REDIRECTED


def test_policy_and_trust_rules_import_nothing_from_scrapy_or_twisted() -> None:
    code = ("import sys, incremental_crawler.change.policy, incremental_crawler.change.trust; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'scrapy', 'twisted'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- is the page due? ---------------------------------------------------------

DUE = [
    # (case, policy, prior, request, due)
    ("no revisit schedule: always", {}, {}, {}, True),
    ("scheduled, not yet", {"schedule": SCHEDULE}, {}, {}, False),
    ("scheduled, time has come", {"schedule": SCHEDULE}, {"next_visit": NOW}, {}, True),
    ("no data stored yet", {"schedule": SCHEDULE}, {"fingerprint": None}, {}, True),
    ("explicit refresh", {"schedule": SCHEDULE}, {}, {"refresh": True}, True),
    ("a sitemap or feed", {"schedule": SCHEDULE}, {}, {"discovery": True}, True),
    ("lastmod moved", {"schedule": SCHEDULE}, {}, {"lastmod": 2 * DAY}, True),
    ("lastmod the same", {"schedule": SCHEDULE}, {}, {"lastmod": DAY}, False),
    ("lastmod older", {"schedule": SCHEDULE}, {}, {"lastmod": DAY / 2}, False),
    ("lastmod, none stored", {"schedule": SCHEDULE}, {"lastmod": None}, {"lastmod": DAY}, True),
    ("max age passed", {"schedule": SCHEDULE, "max_age": 8 * DAY}, {}, {}, True),
    ("max age not passed", {"schedule": SCHEDULE, "max_age": 9 * DAY}, {}, {}, False),
    # The jitter brings the refresh forward by up to its share, never later.
    ("max age not passed, jitter", {"schedule": SCHEDULE, "max_age": 9 * DAY,
                                    "max_age_jitter": 0.25}, {}, {}, True),
    # A page whose last answer failed: retried on its schedule, data or not.
    ("failed, not yet", {"schedule": SCHEDULE},
     {"last_status": 503, "failures": 1, "fingerprint": None}, {}, False),
    ("failed, no revisits: by its own schedule", {}, {"last_status": 0, "failures": 1}, {}, False),
    ("failed, time has come", {}, {"last_status": 404, "failures": 1, "next_visit": NOW}, {}, True),
    ("failed, a newer lastmod waits", {"schedule": SCHEDULE}, {"last_status": 429, "failures": 2},
     {"lastmod": 2 * DAY}, False),
    ("failed, explicit refresh", {"schedule": SCHEDULE}, {"last_status": 500, "failures": 1},
     {"refresh": True}, True),
]


def test_due_is_judged_per_crawl_with_its_tolerance() -> None:
    # Stored by yesterday's crawl, which started an hour earlier in the day:
    # due today for the crawl's whole length, not only once it reaches that hour.
    stored = page(next_visit=NOW + 3600)
    scheduled = policy(schedule=SCHEDULE)
    assert scheduled.due(stored, started=NOW, due_at=NOW + 3600)
    assert not scheduled.due(stored, started=NOW, due_at=NOW + 3599)


@pytest.mark.parametrize(("case", "settings", "prior", "request_", "due"), DUE,
                         ids=[row[0] for row in DUE])
def test_due(case: str, settings: dict[str, Any], prior: dict[str, Any],
             request_: dict[str, Any], due: bool) -> None:
    assert policy(**settings).due(page(**prior), started=NOW, due_at=NOW, **request_) is due


# -- conditions on the request ------------------------------------------------

LIAR = HostTrust("scope", "h", validators_distrusted_until=NOW + 1)
SERVED = HostTrust("scope", "h", validators_distrusted_until=NOW)
# recheck_due(URL, 4, 4): the 4th visit of URL is its sampled one (3 checks so far).
assert recheck_due(URL, 4, 4) and not recheck_due(URL, 5, 4)

REASONS = [
    # (case, policy, prior (None: never stored), request, reason)
    ("never stored", {}, None, {}, RequestReason.NEW),
    ("stored without validators", {}, {"etag": None, "last_modified": None}, {"refresh": True},
     RequestReason.NO_VALIDATORS),
    ("ETag only", {}, {"last_modified": None}, {}, RequestReason.CONDITIONAL),
    ("Last-Modified only", {}, {"etag": None}, {}, RequestReason.CONDITIONAL),
    ("refresh asked", {}, {}, {"refresh": True, "host": LIAR}, RequestReason.REFRESH),
    ("max age passed", {"max_age": 8 * DAY}, {}, {"host": LIAR}, RequestReason.MAX_AGE),
    ("max age not passed", {"max_age": 9 * DAY}, {}, {}, RequestReason.CONDITIONAL),
    ("host lying", {"recheck_every": 4}, {}, {"host": LIAR}, RequestReason.HOST_LYING),
    ("host's distrust over", {}, {}, {"host": SERVED}, RequestReason.CONDITIONAL),
    ("host trusted", {}, {}, {"host": HostTrust("scope", "h")}, RequestReason.CONDITIONAL),
    ("the sampled visit", {"recheck_every": 4}, {}, {}, RequestReason.SAMPLE),
    ("not the sampled visit", {"recheck_every": 4}, {"checks": 4}, {},
     RequestReason.CONDITIONAL),
]


@pytest.mark.parametrize(("case", "settings", "prior", "request_", "reason"), REASONS,
                         ids=[row[0] for row in REASONS])
def test_request_reason(case: str, settings: dict[str, Any], prior: dict[str, Any] | None,
                        request_: dict[str, Any], reason: RequestReason) -> None:
    stored = None if prior is None else page(**prior)
    assert policy(**settings).request_reason(stored, url=URL, now=NOW, started=NOW,
                                             **request_) is reason


# -- what a 304 means -----------------------------------------------------------

SENT = ('"v1"', LM1)
NOT_MODIFIED = [
    # (case, prior (None: never stored), 304 context, refetch or None: take it)
    ("to our conditions", {}, {}, None),
    ("to our ETag only", {"last_modified": None}, {"sent": ('"v1"', "")}, None),
    ("a weak ETag naming ours", {}, {"etag": 'W/"v1"'}, None),
    ("unconditional request", {}, {"conditional": False}, Refetch.UNSOLICITED),
    ("nothing stored", None, {}, Refetch.UNSOLICITED),
    ("the user's own If-None-Match", {}, {"sent": ('"mine"', LM1)},
     Refetch.FOREIGN_CONDITIONS),
    ("our If-Modified-Since missing", {}, {"sent": ('"v1"', "")}, Refetch.FOREIGN_CONDITIONS),
    ("foreign beats Vary: *", {"flags": PageFlags.VARY_STAR}, {"sent": ("", "")},
     Refetch.FOREIGN_CONDITIONS),
    ("stored with Vary: *", {"flags": PageFlags.VARY_STAR}, {}, Refetch.VARY_STAR),
    ("lastmod moved", {}, {"lastmod": 2 * DAY}, Refetch.LASTMOD_CONTRADICTS),
    ("lastmod the same", {}, {"lastmod": DAY}, None),
    ("lastmod, none stored", {"lastmod": None}, {"lastmod": 2 * DAY}, None),
    ("another ETag", {}, {"etag": '"v2"'}, Refetch.ETAG_MISMATCH),
    ("another ETag, none stored", {"etag": None}, {"sent": ("", LM1), "etag": '"v2"'}, None),
    ("asked by date, a later one", {"etag": None}, {"sent": ("", LM1), "last_modified": LM2},
     Refetch.LAST_MODIFIED_LATER),
    ("asked by date, the same one", {"etag": None}, {"sent": ("", LM1), "last_modified": LM1},
     None),
    ("asked by date, an earlier one", {"etag": None, "last_modified": LM2},
     {"sent": ("", LM2), "last_modified": LM1}, None),
    ("asked by ETag, a later date", {}, {"last_modified": LM2}, None),
]


@pytest.mark.parametrize(("case", "prior", "context", "refetch"), NOT_MODIFIED,
                         ids=[row[0] for row in NOT_MODIFIED])
def test_not_modified(case: str, prior: dict[str, Any] | None, context: dict[str, Any],
                      refetch: Refetch | None) -> None:
    stored = None if prior is None else page(**prior)
    kwargs = {"conditional": True, "sent": SENT, **context}
    assert policy().not_modified(stored, **kwargs) is refetch


REVALIDATED = [
    # (case, prior, the 304's (etag, last_modified), validators stored after it)
    ("nothing new", {}, ('"v1"', LM1), None),
    ("none carried", {}, (None, None), None),
    ("a new Last-Modified, by ETag", {}, ('"v1"', LM2), ('"v1"', LM2)),
    ("our ETag kept, weak or not", {}, ('W/"v1"', None), None),
    ("an ETag where we had none", {"etag": None}, ('"v2"', None), ('"v2"', LM1)),
    ("and an earlier date", {"etag": None, "last_modified": LM2}, ('"v2"', LM1),
     ('"v2"', LM1)),
]


@pytest.mark.parametrize(("case", "prior", "carried", "validators"), REVALIDATED,
                         ids=[row[0] for row in REVALIDATED])
def test_validators_a_taken_304_leaves(case: str, prior: dict[str, Any],
                                       carried: tuple[str | None, str | None],
                                       validators: tuple[str, str] | None) -> None:
    etag, last_modified = carried
    assert ChangePolicy.revalidated(page(**prior), etag=etag,
                                    last_modified=last_modified) == validators


def test_a_taken_304_says_the_validators_held_except_for_lists() -> None:
    held = ChangePolicy.held()
    assert (held.verdict, held.unstable, held.judged) == (Verdict.RELIABLE, False, True)
    assert ChangePolicy.held(discovery=True) == Judgement()
    assert not Judgement().judged


# -- what a full fetch says about the validators ----------------------------------

R, U, L, A = Verdict.RELIABLE, Verdict.UNSTABLE, Verdict.LYING, Verdict.ABSENT
V2 = {"etag": '"v2"'}
NONE = {"etag": None, "last_modified": None}
JUDGEMENTS = [
    # (case, prior (None: never stored), response, content changed, judgement)
    ("new page without validators", None, NONE, True, Judgement(A)),
    ("new page with validators", None, {}, True, Judgement(None)),
    ("a sitemap", {"churns": 1, "flags": UNSTABLE}, {"discovery": True, "etag": None}, False,
     Judgement(None, unstable=True, churns=1)),
    ("stored without validators", NONE, {}, False, Judgement(None)),
    ("validators gone", {"churns": 5}, NONE, False, Judgement(A, churns=5)),
    ("held, content held", {"churns": 1, "flags": UNSTABLE}, {}, False, Judgement(R)),
    ("held, content changed: a lie", {"churns": 1}, {}, True, Judgement(L)),
    ("moved with the content", {"churns": 1}, V2, True,
     Judgement(R, churns=1, consistent=True)),
    ("Last-Modified moved with it", {}, {"last_modified": LM2}, True,
     Judgement(R, consistent=True)),
    ("moved alone, first churn", {}, V2, False, Judgement(U, churns=1)),
    ("moved alone, second churn", {"churns": 1}, V2, False,
     Judgement(U, unstable=True, churns=2, flagged=True)),
    ("moved alone, flagged already", {"churns": 5, "flags": UNSTABLE}, V2, False,
     Judgement(U, unstable=True, churns=6)),
    ("churns past a lowered bound", {"churns": 3}, V2, True,
     Judgement(R, unstable=True, churns=3, flagged=True, consistent=True)),
]


@pytest.mark.parametrize(("case", "prior", "response", "changed", "expected"), JUDGEMENTS,
                         ids=[row[0] for row in JUDGEMENTS])
def test_judge(case: str, prior: dict[str, Any] | None, response: dict[str, Any],
               changed: bool, expected: Judgement) -> None:
    stored = None if prior is None else page(**prior)
    judgement = policy().judge(stored, fetch(**response), changed=changed)
    assert judgement == expected
    assert judgement.judged is (expected.verdict in (R, U, L))


def test_unjudged_keeps_the_page_as_it_was() -> None:
    assert ChangePolicy.unjudged(page(churns=2, flags=UNSTABLE)) == Judgement(
        unstable=True, churns=2)


# -- which bodies wait for their items ------------------------------------------

DEFERS: list[tuple[str, dict[str, Any] | None, dict[str, Any], bool, bool]] = [
    # (case, prior, response, body changed, defers)
    ("a new page", None, {}, True, False),
    ("same body", {}, {}, False, False),
    ("another body", {}, {"fingerprint": "body2"}, True, True),
    ("another body of a sitemap", {}, {"fingerprint": "body2", "discovery": True}, True, False),
]


@pytest.mark.parametrize(("case", "prior", "response", "changed", "defers"), DEFERS,
                         ids=[row[0] for row in DEFERS])
def test_body_changed_and_defers(case: str, prior: dict[str, Any] | None,
                                 response: dict[str, Any], changed: bool, defers: bool) -> None:
    stored = None if prior is None else page(**prior)
    assert policy().body_changed(stored, fetch(**response)) is changed
    assert policy().defers(stored, fetch(**response)) is defers


# -- evidence about sitemap lastmods ----------------------------------------------

LASTMOD_TESTS = [
    # (case, prior, announced lastmod, tested)
    ("no lastmod announced", {}, None, False),
    ("none stored", {"lastmod": None}, 2 * DAY, False),
    ("not newer", {}, DAY, False),
    ("newer than our copy", {"last_fetched": DAY}, 2 * DAY, True),
    ("newer, our copy newer still", {"last_fetched": 3 * DAY}, 2 * DAY, False),
    ("newer, fetched at that instant", {"last_fetched": 2 * DAY}, 2 * DAY, False),
]


@pytest.mark.parametrize(("case", "prior", "lastmod", "tested"), LASTMOD_TESTS,
                         ids=[row[0] for row in LASTMOD_TESTS])
def test_tests_lastmod(case: str, prior: dict[str, Any], lastmod: float | None,
                       tested: bool) -> None:
    assert ChangePolicy.tests_lastmod(page(**prior), lastmod) is tested


# -- the next visit ---------------------------------------------------------------

NEXT_VISITS = [
    # (case, schedule, prior interval (None: new page), changed, (interval, next_visit))
    ("no revisits", None, DAY, True, None),
    ("a new page", SCHEDULE, None, True, (DAY, NOW + DAY)),
    ("changed: sooner", SCHEDULE, DAY, True, (SOONER, NOW + SOONER)),
    ("unchanged: later", SCHEDULE, DAY, False, (LATER, NOW + LATER)),
    ("never beyond the maximum", SCHEDULE, 30 * DAY, False, (30 * DAY, NOW + 30 * DAY)),
]


@pytest.mark.parametrize(("case", "schedule", "interval", "changed", "expected"), NEXT_VISITS,
                         ids=[row[0] for row in NEXT_VISITS])
def test_next_visit(case: str, schedule: RevisitSchedule | None, interval: float | None,
                    changed: bool, expected: tuple[float, float] | None) -> None:
    prior = None if interval is None else page(interval=interval)
    assert policy(schedule=schedule).next_visit(prior, changed=changed, started=NOW) == expected


# -- the page's state after a 2xx ------------------------------------------------

def test_a_new_page_is_stored_with_its_first_visit() -> None:
    got = policy(schedule=SCHEDULE).after_fetch(
        None, fetch(vary_star=True, lastmod=DAY), changed=True, judgement=Judgement(), now=NOW,
        started=NOW)
    assert got == PageState(
        KEY, '"v1"', LM1, "body1", 100, 200, first_seen=NOW, last_checked=NOW, last_fetched=NOW,
        last_changed=NOW, checks=1, changes=0, flags=PageFlags.VARY_STAR, lastmod=DAY,
        interval=DAY, next_visit=NOW + DAY, callback="parse", churns=0)


AFTER_FETCH = [
    # (case, prior, response, changed, judgement, expected changes to the prior)
    ("unchanged: counted, later", {}, {}, False, Judgement(Verdict.RELIABLE),
     {"last_changed": DAY, "changes": 1, "interval": LATER}),
    ("changed: counted, sooner", {}, {"etag": '"v2"', "fingerprint": "body2", "size": 7}, True,
     Judgement(Verdict.RELIABLE),
     {"etag": '"v2"', "fingerprint": "body2", "size": 7, "last_changed": NOW, "changes": 2,
      "interval": SOONER}),
    ("Vary: * and the flag set", {"flags": PageFlags.REDIRECTED}, {"vary_star": True}, False,
     Judgement(Verdict.UNSTABLE, unstable=True, churns=2),
     {"flags": PageFlags.REDIRECTED | PageFlags.VARY_STAR | UNSTABLE, "churns": 2,
      "last_changed": DAY, "changes": 1, "interval": LATER}),
    ("both flags cleared, others kept", {"flags": 7, "churns": 2}, {}, False,
     Judgement(Verdict.RELIABLE),
     {"flags": PageFlags.REDIRECTED, "churns": 0, "last_changed": DAY, "changes": 1,
      "interval": LATER}),
    # A bit PageFlags does not name (a later version's, another writer's) is
    # the page's own: only the two this visit decides are cleared.
    ("bits not named kept", {"flags": 8 | 4 | 1, "churns": 2}, {}, False,
     Judgement(Verdict.RELIABLE),
     {"flags": 8, "churns": 0, "last_changed": DAY, "changes": 1, "interval": LATER}),
    ("a new lastmod stored", {}, {"lastmod": 2 * DAY}, False, Judgement(),
     {"lastmod": 2 * DAY, "last_changed": DAY, "changes": 1, "interval": LATER}),
    ("no lastmod: the stored one kept", {}, {"lastmod": None, "callback": None}, False,
     Judgement(), {"callback": None, "last_changed": DAY, "changes": 1, "interval": LATER}),
]


@pytest.mark.parametrize(("case", "prior", "response", "changed", "judgement", "expected"),
                         AFTER_FETCH, ids=[row[0] for row in AFTER_FETCH])
def test_after_fetch(case: str, prior: dict[str, Any], response: dict[str, Any], changed: bool,
                     judgement: Judgement, expected: dict[str, Any]) -> None:
    stored = page(**prior)
    got = policy(schedule=SCHEDULE).after_fetch(stored, fetch(**response), changed=changed,
                                                judgement=judgement, now=NOW, started=NOW)
    visit = {"last_status": 200, "last_checked": NOW, "last_fetched": NOW, "checks": 4}
    schedule = {"next_visit": NOW + expected["interval"]}
    assert got == stored.copy(**{**visit, **expected, **schedule})


DEFERRED = [
    # (case, the items say the content changed, expected of the committed state)
    # The body moved with the validators: no churn, though the items held.
    ("noise only", False, {"changes": 1, "last_changed": DAY, "interval": LATER,
                           "churns": 0}),
    ("a real change", True, {"changes": 2, "last_changed": NOW, "interval": SOONER,
                             "churns": 0}),
]


@pytest.mark.parametrize(("case", "content_changed", "expected"), DEFERRED,
                         ids=[row[0] for row in DEFERRED])
def test_a_changed_body_waits_for_its_items(case: str, content_changed: bool,
                                            expected: dict[str, Any]) -> None:
    # A new body behind new validators: noise (a token) or a real change.
    rules = policy(schedule=SCHEDULE)
    prior = page()
    response = fetch(etag='"v2"', fingerprint="body2")
    assert rules.defers(prior, response)
    # Until the items tell, the state held is the body's own ("changed").
    pending = rules.after_fetch(prior, response, changed=True,
                                judgement=rules.unjudged(prior), now=NOW, started=NOW)
    assert (pending.fingerprint, pending.changes, pending.churns) == ("body2", 2, 0)
    judgement = rules.judge(prior, response, changed=content_changed)
    # Validators that moved are judged on the body, which moved too.
    assert judgement.verdict is Verdict.RELIABLE
    # Only a change of the content re-trusts a liar.
    assert judgement.consistent is content_changed
    final = rules.after_fetch(prior, response, changed=content_changed, judgement=judgement,
                              now=NOW, started=NOW)
    # The new body is stored either way (the next visit compares with it).
    assert (final.etag, final.fingerprint) == ('"v2"', "body2")
    got = {name: getattr(final, name) for name in expected}
    assert got == expected


# -- believable Last-Modified ---------------------------------------------------

DATE = "Mon, 01 Jan 2024 00:00:00 GMT"
JAN_1 = 1704067200.0
DAY = 86_400.0
NEXT_YEAR = "Wed, 01 Jan 2025 00:00:00 GMT"
FUTURE = [
    # (case, Last-Modified, the response's Date, now, in the future)
    ("same as Date", DATE, DATE, JAN_1, False),
    ("within the tolerated skew", "Mon, 01 Jan 2024 00:01:00 GMT", DATE, JAN_1, False),
    ("past the skew", "Mon, 01 Jan 2024 00:01:01 GMT", DATE, JAN_1, True),
    ("Date as bytes", "Mon, 01 Jan 2024 00:01:01 GMT", DATE.encode(), JAN_1, True),
    ("no Date: our clock", DATE, None, JAN_1 - 61, True),
    ("no Date: our clock, in skew", DATE, None, JAN_1 - 60, False),
    ("a bad Date: our clock", DATE, "yesterday", JAN_1, False),
    ("not a date", "yesterday", DATE, 0.0, False),
    # A server's clock a year fast: its Date as far ahead as its date.
    ("the server's clock fast", NEXT_YEAR, NEXT_YEAR, JAN_1, True),
    # Our clock slow: a day of it does not refuse a correct date.
    ("our clock a day slow", DATE, DATE, JAN_1 - DAY, False),
    ("our clock over a day slow", DATE, DATE, JAN_1 - DAY - 1, True),
]


@pytest.mark.parametrize(("case", "last_modified", "date", "now", "future"), FUTURE,
                         ids=[row[0] for row in FUTURE])
def test_future_last_modified(case: str, last_modified: str, date: str | bytes | None,
                              now: float, future: bool) -> None:
    assert future_last_modified(last_modified, date, now) is future


def test_from_config_reads_the_settings() -> None:
    from scrapy.settings import Settings

    from incremental_crawler.config import IncrementalConfig

    config = IncrementalConfig.from_settings(Settings({
        "INCREMENTAL_MAX_AGE": 5, "INCREMENTAL_UNSTABLE_AFTER": 7,
        "INCREMENTAL_RECHECK_EVERY": 9, "INCREMENTAL_REVISIT_ENABLED": False}))
    assert ChangePolicy.from_config(config) == ChangePolicy(
        max_age=5, unstable_after=7, recheck_every=9, schedule=None, max_age_jitter=0.25)
    revisits = IncrementalConfig.from_settings(Settings({"INCREMENTAL_REVISIT_ENABLED": True}))
    assert ChangePolicy.from_config(revisits).schedule == RevisitSchedule.from_config(revisits)


def test_a_gone_page_comes_back_only_with_a_date_after_the_check_that_found_it_gone():
    # Stored with its 2024-01-01 date, found gone at 1_800_000_000 (2027):
    # a list dating it 2024-06-01 (a CMS stamping its deletion) does not
    # ask for it again, a date after that check does.
    gone = PageState(PageKey("s", "http://h/a"), flags=PageFlags.GONE, lastmod=1_704_067_200,
                     last_checked=1_800_000_000, next_visit=1_802_592_000)
    assert not gone_due(gone, due_at=1_800_000_060, lastmod=1_717_200_000)
    assert gone_due(gone, due_at=1_800_000_060, lastmod=1_800_000_030)
    assert gone_due(gone, due_at=1_802_592_000)


VERDICTS = [
    # (case, response validators, its body, the items changed, verdict)
    ("moved, the same body", '"v2"', "body1", False, Verdict.UNSTABLE),
    ("moved with the body, items held", '"v2"', "body2", False, Verdict.RELIABLE),
    ("moved with the content", '"v2"', "body2", True, Verdict.RELIABLE),
    ("held, the body moved, items held", '"v1"', "body2", False, Verdict.RELIABLE),
    ("held, the content moved", '"v1"', "body2", True, Verdict.LYING),
]


@pytest.mark.parametrize(("case", "etag", "body", "changed", "verdict"), VERDICTS,
                         ids=[row[0] for row in VERDICTS])
def test_validators_that_moved_are_judged_on_the_body_and_a_lie_on_the_items(
    case: str, etag: str, body: str, changed: bool, verdict: Verdict
) -> None:
    prior = page(etag='"v1"', fingerprint="body1")
    assert ChangePolicy.verdict(prior, fetch(etag=etag, fingerprint=body),
                                changed=changed) is verdict


def test_not_due_bounds_hold_exactly_as_long_as_the_table_says_not_due() -> None:
    """A page not due under one crawl's rules stays not due under any later
    (or earlier) crawl's whose rules its bounds hold for; and the bounds
    are not loose: at many moments just past one of them the page is due.

    Random pages of every row of WHY_TABLE (gone, failed, without data,
    unknown links, with and without max age and jitter), 20,000 cases."""
    rng = random.Random(20261206)
    held = past = 0
    for n in range(20_000):
        flags = rng.choice([0, 0, PageFlags.GONE, PageFlags.LINKS_KNOWN,
                            PageFlags.LINKS_KNOWN | PageFlags.LINKS_INCOMPLETE])
        state = PageState(
            PageKey("s", f"http://h/{rng.randrange(10**6)}?q={n}"), flags=flags,
            fingerprint=rng.choice(["f", "f", "f", None]), last_status=rng.choice([200, 304, 404]),
            failures=rng.choice([0, 0, 0, 2]), next_visit=rng.uniform(1e9, 1e9 + 1e6),
            last_checked=rng.uniform(1e9 - 1e6, 1e9), last_fetched=rng.uniform(1e9 - 4e6, 1e9))
        max_age = rng.choice([0.0, 1e6, 3e6, 5e6])
        jitter = rng.choice([0.0, 0.25, 1.0])
        tolerance = rng.choice([0.0, 3600.0])

        def rules(started: float, checked_by: float, *, max_age: float = max_age,
                  jitter: float = jitter, tolerance: float = tolerance) -> CrawlDueRules:
            return CrawlDueRules(started=started, due_at=started + tolerance,
                                 checked_by=checked_by, max_age=max_age, jitter=jitter)

        unknown = links_unknown(state, replay=True)
        start = rng.uniform(1e9 - 2e6, 1e9 + 1e6)
        bounds = not_due_bounds(state, rules(start, start + 60), links_unknown=unknown)
        if bounds is None:
            assert schedule_why(state, rules(start, start + 60),
                                links_unknown=unknown) is not Why.NOT_DUE
            continue
        for later in (rng.uniform(start - 1e6, start + 1e6) for _ in range(5)):
            checked_by = later + rng.choice([60.0, -1e6])
            if bounds.hold(rules(later, checked_by)):
                held += 1
                assert schedule_why(state, rules(later, checked_by),
                                    links_unknown=unknown) is Why.NOT_DUE, (state, later)
        # Just past the bound that ends first, the page is due.
        first = min(bounds.due_before - tolerance, bounds.started_before + 1.0)
        if first < math.inf:
            past += 1
            assert schedule_why(state, rules(first + 1.0, first + 61.0),
                                links_unknown=unknown) is not Why.NOT_DUE, (state, bounds)
    assert held > 4_000 and past > 2_500


def test_not_due_bounds_join_is_the_tightest_of_them() -> None:
    one = NotDueBounds(due_before=10, started_before=50, checked_upto=3)
    two = NotDueBounds(due_before=20, started_before=40, checked_upto=5)
    assert one.join(two) == NotDueBounds(10, 40, 5)
    crawl = CrawlDueRules(started=30, due_at=9, checked_by=5)
    assert one.join(two).hold(crawl)
    assert not one.join(two).hold(replace(crawl, recheck_all=True))
    assert not one.join(two).hold(replace(crawl, revisit=False))
    assert not one.join(two).hold(replace(crawl, due_at=10))
    assert not one.join(two).hold(replace(crawl, started=40))
    assert not one.join(two).hold(replace(crawl, checked_by=4.9))
