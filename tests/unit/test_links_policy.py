"""ChangePolicy and a page's stored links: when a 304 could not stand for them.

One table each, as in test_change_policy.py: a stored page, what the request
says, the decision. No reactor, no store.
"""

from __future__ import annotations

from typing import Any

import pytest
from scrapy.settings import Settings

from incremental_crawler.change.policy import ChangePolicy, Fetch, RequestReason, links_unknown
from incremental_crawler.change.revisit import RevisitSchedule
from incremental_crawler.config import IncrementalConfig, SettingError
from incremental_crawler.state.records import HostTrust, PageFlags, PageKey, PageState

KEY = PageKey("scope", "http://h/a")
DAY = 86400.0
NOW = 10 * DAY
KNOWN, HAS, INCOMPLETE = PageFlags.LINKS_KNOWN, PageFlags.HAS_LINKS, PageFlags.LINKS_INCOMPLETE
SCHEDULE = RevisitSchedule(initial=DAY, minimum=3600, maximum=30 * DAY, inc_rate=0.4,
                           dec_rate=0.2)


def policy(**changes: Any) -> ChangePolicy:
    return ChangePolicy(**{"max_age": 0.0, "unstable_after": 2, "recheck_every": 0,
                           "schedule": SCHEDULE, **changes})


def page(flags: int = KNOWN | HAS, **changes: Any) -> PageState:
    """A page stored 9 days ago with validators, due tomorrow."""
    return PageState(KEY, etag='"v1"', fingerprint="body1", last_fetched=DAY, checks=3,
                     interval=DAY, next_visit=NOW + DAY, flags=flags).copy(**changes)


LINKS_UNKNOWN = {
    "nothing stored": (None, True, False),
    "replay off": (page(0), False, False),
    "stored before replay existed": (page(0), True, True),
    "links known, none yielded": (page(KNOWN), True, False),
    "links known and stored": (page(KNOWN | HAS), True, False),
    "incomplete": (page(INCOMPLETE), True, True),
    "a replayed request was dropped": (page(KNOWN | HAS | INCOMPLETE), True, True),
    "other flags do not count": (page(PageFlags.VARY_STAR | PageFlags.REDIRECTED), True, True),
}


@pytest.mark.parametrize(("prior", "replay", "expected"), list(LINKS_UNKNOWN.values()),
                         ids=list(LINKS_UNKNOWN))
def test_links_unknown(prior: PageState | None, replay: bool, expected: bool) -> None:
    assert links_unknown(prior, replay=replay) is expected


LIAR = HostTrust("scope", "h", validators_distrusted_until=NOW + DAY)

REASONS: dict[str, tuple[PageState | None, dict[str, Any], RequestReason]] = {
    "new page": (None, {}, RequestReason.NEW),
    "no validators: fetched in full anyway": (page(0, etag=None), {}, RequestReason.NO_VALIDATORS),
    "an explicit refresh comes first": (page(0), {"refresh": True}, RequestReason.REFRESH),
    "links unknown": (page(0), {}, RequestReason.LINKS_UNKNOWN),
    "before max age": (page(0, last_fetched=0.0), {"policy": {"max_age": DAY}},
                       RequestReason.LINKS_UNKNOWN),
    "before a lying host": (page(0), {"host": LIAR}, RequestReason.LINKS_UNKNOWN),
    "links known: conditional": (page(KNOWN | HAS), {}, RequestReason.CONDITIONAL),
    "links known, host lying": (page(KNOWN | HAS), {"host": LIAR}, RequestReason.HOST_LYING),
}


@pytest.mark.parametrize(("prior", "given", "expected"), list(REASONS.values()), ids=list(REASONS))
def test_request_reason_with_unknown_links(prior: PageState | None, given: dict[str, Any],
                                           expected: RequestReason) -> None:
    given = dict(given)
    decide = policy(**given.pop("policy", {}))
    unknown = links_unknown(prior, replay=True)
    assert decide.request_reason(prior, links_unknown=unknown, url=KEY.url, now=NOW, started=NOW,
                                 **given) is expected


DUE = {
    "not due, links known": (page(KNOWN | HAS), False),
    "not due, links unknown: due, or the pages behind it are lost": (page(0), True),
    "not due, incomplete": (page(KNOWN | INCOMPLETE), True),
    "due anyway": (page(KNOWN, next_visit=NOW), True),
}


@pytest.mark.parametrize(("prior", "expected"), list(DUE.values()), ids=list(DUE))
def test_unknown_links_override_the_revisit_schedule(prior: PageState, expected: bool) -> None:
    unknown = links_unknown(prior, replay=True)
    assert policy().due(prior, links_unknown=unknown, started=NOW, due_at=NOW) is expected


def test_replay_settings_are_read_and_checked() -> None:
    config = IncrementalConfig.from_settings(Settings())
    assert (config.replay_enabled, config.replay_max_requests) == (True, 50_000)
    config = IncrementalConfig.from_settings(Settings({
        "INCREMENTAL_REPLAY_ENABLED": "false", "INCREMENTAL_REPLAY_MAX_REQUESTS": "20"}))
    assert (config.replay_enabled, config.replay_max_requests) == (False, 20)
    with pytest.raises(SettingError, match="INCREMENTAL_REPLAY_MAX_REQUESTS"):
        IncrementalConfig.from_settings(Settings({"INCREMENTAL_REPLAY_MAX_REQUESTS": 0}))


@pytest.mark.parametrize("prior", [None, page(KNOWN | HAS)], ids=["new", "known"])
def test_a_full_fetch_stores_the_pages_own_recipe(prior: PageState | None) -> None:
    # For re-seeding the page as it was requested (links.recipes.own_recipe).
    recipe = '{"meta":{"rule":1}}'
    fetch = Fetch(KEY, '"v2"', None, "body2", 10, 200, callback="_callback", recipe=recipe)
    decide = policy()
    state = decide.after_fetch(prior, fetch, changed=True,
                               judgement=decide.judge(prior, fetch, changed=True), now=NOW,
                               started=NOW)
    assert (state.callback, state.recipe) == ("_callback", recipe)
