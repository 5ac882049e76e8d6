"""The rules of which known pages a crawl requests: pure, one table each.

No reactor, no network, no store.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from incremental_crawler.change.policy import (
    ChangePolicy,
    CrawlDueRules,
    Fetch,
    Judgement,
    failed_last,
    max_age_due,
    url_phase,
)
from incremental_crawler.change.revisit import RevisitSchedule
from incremental_crawler.change.sample import RotatingSample, sample_size
from incremental_crawler.change.schedule import Why
from incremental_crawler.lists.sitemaps import Candidate, decide
from incremental_crawler.spiders.feed import FeedPagesSpider, feed_entries
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from incremental_crawler.state.records import PageFlags, PageKey, PageState

DAY = 86400.0
START = 100 * DAY
KEY = PageKey("scope", "http://h/a")
RULES = CrawlDueRules(started=START, due_at=START + 3600, max_age=30 * DAY)


def stored(**changes: Any) -> PageState:
    """Fetched 10 days ago, lastmod day 50 (a modification date), due in a day."""
    base = PageState(KEY, etag='"v1"', fingerprint="body", size=10, last_status=200,
                     last_checked=START - 10 * DAY, last_fetched=START - 10 * DAY,
                     lastmod=50 * DAY, interval=DAY, next_visit=START + DAY,
                     flags=PageFlags.LASTMOD_MODIFIED)
    return base.copy(**changes)


# -- max age, with its jitter ------------------------------------------------------

def test_max_age_jitter_spreads_pages_fetched_on_one_day_over_its_share() -> None:
    # 2,000 pages fetched on day 0, INCREMENTAL_MAX_AGE 40 days, jitter 0.25:
    # they fall due over the last quarter, past day 30, all by day 40.
    max_age, jitter = 40 * DAY, 0.25
    urls = [f"http://h/p/{i}" for i in range(2000)]

    def first_due_day(url: str) -> int:
        return next(day for day in range(60)
                    if max_age_due(url, 0.0, max_age=max_age, jitter=jitter,
                                   started=day * DAY + 1))

    days = Counter(first_due_day(url) for url in urls)
    assert sorted(days) == list(range(31, 41))  # past 30 days, by the 40th
    # Spread evenly: each of the ten days gets about a tenth.
    assert all(100 <= count <= 300 for count in days.values()), days
    # Without jitter they all fall due together.
    assert {next(d for d in range(60) if max_age_due(url, 0.0, max_age=max_age, jitter=0,
                                                     started=d * DAY + 1))
            for url in urls[:50]} == {40}


def test_max_age_due_answers_as_its_formula_at_and_around_the_bounds() -> None:
    # max_age_due answers without url_phase outside max_age and
    # max_age * (1 - jitter): the same answer as the formula, at the bounds
    # and a float step either side of them, jitter and max age of any sign.
    urls = [f"http://h/p/{i}?q={i % 7}" for i in range(200)]
    for max_age in (40 * DAY, 1.0, -5.0):
        for jitter in (0.0, 0.25, 1.0, 1.5, -0.5):
            ages = []
            for bound in (max_age, max_age * (1 - jitter)):
                ages += [bound, math.nextafter(bound, -math.inf),
                         math.nextafter(bound, math.inf)]
            ages += [0.0, max_age / 2, 2 * max_age, -max_age]
            for url in urls:
                u = url_phase(url)
                for age in ages:
                    expected = age > max_age * (1 - jitter * u)
                    # Fetched at 0: the age is the start, exactly.
                    assert max_age_due(url, 0.0, max_age=max_age, jitter=jitter,
                                       started=age) == expected, (url, max_age, jitter, age)


def test_the_phase_is_stable_and_of_the_path_and_query_only() -> None:
    assert url_phase("http://a/p?q=1") == url_phase("https://b:81/p?q=1")
    assert url_phase("http://a/p?q=1") != url_phase("http://a/p?q=2")
    assert 0 <= url_phase("http://a/") < 1


FAILED = [
    # (last status, failures in a row, failed)
    (None, 0, False), (200, 0, False), (304, 0, False), (301, 0, False),
    (0, 1, True), (500, 1, True), (503, 2, True), (429, 1, True), (401, 1, True),
    (403, 1, True), (404, 1, True), (410, 1, True), (408, 1, True),
    # A page whose callback or items failed keeps its last (2xx) status.
    (200, 1, True), (206, 1, True),
]


@pytest.mark.parametrize(("status", "failures", "failed"), FAILED,
                         ids=[f"{s}x{n}" for s, n, _ in FAILED])
def test_failed_last(status: int | None, failures: int, failed: bool) -> None:
    assert failed_last(stored(last_status=status, failures=failures)) is failed


# -- what a list's entry asks for ---------------------------------------------------

NEW_DATE, SAME, OLD = 60 * DAY, 50 * DAY, 40 * DAY
DECIDE = [
    # (case, stored (None: never), candidate lastmod, modified, use_lastmod, rules, why)
    ("never stored", None, SAME, True, True, {}, Why.NEW),
    ("stored without data", {"fingerprint": None, "last_status": 200}, SAME, True, True, {},
     Why.NEW),
    ("failed, no data, not due", {"fingerprint": None, "last_status": 503, "failures": 1},
     NEW_DATE, True, True, {}, Why.NOT_DUE),
    ("failed, due", {"last_status": 0, "failures": 1, "next_visit": START}, SAME, True, True,
     {}, Why.RETRY),
    ("404, due within the tolerance",
     {"last_status": 404, "failures": 1, "next_visit": START + 3600}, None, True, True, {},
     Why.RETRY),
    ("withheld (callback failed), unmoved modification date: no vouching",
     {"last_status": 200, "failures": 1, "next_visit": START}, SAME, True, True, {},
     Why.RETRY),
    ("recheck all", {}, SAME, True, True, {"recheck_all": True, "due_at": math.inf},
     Why.RECHECK),
    ("max age", {"last_fetched": START - 31 * DAY}, SAME, True, True, {}, Why.MAX_AGE),
    ("newer date", {}, NEW_DATE, True, True, {}, Why.LASTMOD_NEWER),
    ("newer publication date", {}, NEW_DATE, False, True, {}, Why.LASTMOD_NEWER),
    ("unmoved modification date, due", {"next_visit": START}, SAME, True, True, {},
     Why.LASTMOD_UNCHANGED),
    ("older modification date", {}, OLD, True, True, {}, Why.LASTMOD_UNCHANGED),
    ("unmoved, last answer a 304", {"last_status": 304}, SAME, True, True, {},
     Why.LASTMOD_UNCHANGED),
    ("unmoved, last answer a redirect: its schedule", {"last_status": 301}, SAME, True, True,
     {}, Why.NOT_DUE),
    ("unmoved publication date, due", {"next_visit": START}, SAME, False, True, {}, Why.DUE),
    ("unmoved publication date, not due", {}, SAME, False, True, {}, Why.NOT_DUE),
    ("lastmods off (or distrusted), not due", {}, NEW_DATE, True, False, {}, Why.NOT_DUE),
    ("lastmods off, due", {"next_visit": START + 3600}, SAME, True, False, {}, Why.DUE),
    ("no listed date, not due", {}, None, True, True, {}, Why.NOT_DUE),
    ("no stored date, not due", {"lastmod": None}, SAME, True, True, {}, Why.NOT_DUE),
    ("no revisits: not vouched is due", {}, SAME, False, True, {"revisit": False}, Why.DUE),
    ("no revisits: vouched is skipped", {}, SAME, True, True, {"revisit": False},
     Why.LASTMOD_UNCHANGED),
]


@pytest.mark.parametrize(("case", "state", "lastmod", "modified", "use", "rules", "why"),
                         DECIDE, ids=[row[0] for row in DECIDE])
def test_decide(case: str, state: dict[str, Any] | None, lastmod: float | None,
                modified: bool, use: bool, rules: dict[str, Any], why: Why) -> None:
    candidate = Candidate(KEY.url, KEY.url, lastmod, modified=modified)
    page = None if state is None else stored(**state)
    assert decide(candidate, page, use_lastmod=use, rules=replace(RULES, **rules)) is why


# -- the rotating sample ----------------------------------------------------------------

def test_sample_size() -> None:
    assert [sample_size(0.01, p) for p in (0, 1, 100, 101, 50_000)] == [0, 1, 1, 2, 500]
    assert sample_size(0, 1000) == 0 and sample_size(1.0, 7) == 7


def test_the_sample_is_the_least_recently_checked_and_bounded() -> None:
    sample: RotatingSample[int] = RotatingSample(0.1, capacity=1000)
    handed_back = []
    for i in range(1000):
        # Checked at 1000 - i: the last offered are the least recently checked.
        out = sample.offer(1000 - i, i)
        if out is not None:
            handed_back.append(out)
        assert len(sample._heap) <= 100  # memory: share x capacity
    sampled, rest = sample.take()
    assert sampled == list(range(999, 899, -1))  # least recently checked first
    assert rest == [] and len(handed_back) == 900


def test_fewer_skipped_than_the_capacity_samples_their_share() -> None:
    sample: RotatingSample[str] = RotatingSample(0.1, capacity=1000)
    for i in range(25):
        assert sample.offer(float(i), f"p{i}") is None
    sampled, rest = sample.take()
    assert sampled == ["p0", "p1", "p2"] and len(rest) == 22  # ceil(2.5)


def test_the_sample_rotates_through_every_page_within_its_bound() -> None:
    # P pages skipped every crawl; each crawl checks n of them, which moves
    # their last_checked: every page is checked within ceil(P / n) crawls.
    pages, share = 250, 0.03
    n = sample_size(share, pages)
    bound = math.ceil(pages / n)
    last_checked = dict.fromkeys(range(pages), 0.0)
    last_seen = dict.fromkeys(range(pages), 0)
    gaps = []
    for crawl in range(1, 4 * bound):
        sample: RotatingSample[int] = RotatingSample(share, pages)
        for page in range(pages):
            sample.offer(last_checked[page], page)
        sampled, _ = sample.take()
        assert len(sampled) == n
        for page in sampled:
            gaps.append(crawl - last_seen[page])
            last_seen[page], last_checked[page] = crawl, float(crawl)
    assert max(gaps) <= bound
    assert min(last_seen.values()) > 0


# -- what a fetch records -----------------------------------------------------------

@pytest.mark.parametrize(("lastmod", "modified", "before", "after"), [
    (SAME, True, 0, PageFlags.LASTMOD_MODIFIED),
    (SAME, False, PageFlags.LASTMOD_MODIFIED, 0),
    (None, False, PageFlags.LASTMOD_MODIFIED, PageFlags.LASTMOD_MODIFIED),  # kept with the date
])
def test_a_fetch_records_whether_its_lastmod_is_a_modification_date(
    lastmod: float | None, modified: bool, before: int, after: int
) -> None:
    policy = ChangePolicy(max_age=0, unstable_after=2, recheck_every=0, schedule=None)
    fetch = Fetch(KEY, '"v1"', None, "body", 10, 200, lastmod=lastmod, lastmod_modified=modified)
    state = policy.after_fetch(stored(flags=before), fetch, changed=False, judgement=Judgement(),
                               now=START, started=START)
    assert state.flags & PageFlags.LASTMOD_MODIFIED == after
    new = policy.after_fetch(None, fetch, changed=True, judgement=Judgement(), now=START,
                             started=START)
    assert bool(new.flags & PageFlags.LASTMOD_MODIFIED) is (lastmod is not None and modified)


def test_next_visits_are_counted_from_the_crawls_start() -> None:
    schedule = RevisitSchedule(DAY, 3600, 30 * DAY, 0.4, 0.2)
    policy = ChangePolicy(max_age=0, unstable_after=2, recheck_every=0, schedule=schedule)
    fetch = Fetch(KEY, '"v1"', None, "body", 10, 200)
    state = policy.after_fetch(None, fetch, changed=True, judgement=Judgement(),
                               now=START + 5 * 3600, started=START)
    assert (state.last_checked, state.last_fetched) == (START + 5 * 3600,) * 2
    assert state.next_visit == START + DAY


# -- arguments and feeds ------------------------------------------------------------------

def test_recheck_all_argument() -> None:
    spider = SitemapPagesSpider(sitemap_url="http://h/s.xml", recheck="all")
    assert spider.incremental_recheck_all is True
    assert FeedPagesSpider(feed_url="http://h/f").incremental_recheck_all is False
    with pytest.raises(ValueError, match="recheck='some'"):
        FeedPagesSpider(feed_url="http://h/f", recheck="some")


def test_feeds_tell_modification_dates_from_publication_dates() -> None:
    rss = (b'<rss version="2.0"><channel><item><link>http://h/a</link>'
           b"<pubDate>Mon, 01 Jan 2024 10:00:00 GMT</pubDate></item></channel></rss>")
    atom = (b'<feed xmlns="http://www.w3.org/2005/Atom">'
            b'<entry><link href="http://h/u"/><updated>2024-01-02T00:00:00Z</updated>'
            b"<published>2024-01-01T00:00:00Z</published></entry>"
            b'<entry><link href="http://h/p"/><published>2024-01-01T00:00:00Z</published>'
            b"</entry></feed>")
    parsed = feed_entries(rss)
    assert parsed is not None
    assert [(e["loc"], e["modified"]) for e in parsed[1]] == [("http://h/a", False)]
    parsed = feed_entries(atom)
    assert parsed is not None
    assert [(e["loc"], e["lastmod"], e["modified"]) for e in parsed[1]] == [
        ("http://h/u", "2024-01-02T00:00:00Z", True),
        ("http://h/p", "2024-01-01T00:00:00Z", False)]


def test_a_gone_page_comes_back_only_for_a_date_after_it_was_found_gone() -> None:
    # A CMS may date a page's deletion: that date is newer than the one stored
    # with our copy, but older than the check that found the page gone.
    gone = PageState(KEY, fingerprint="f", lastmod=START - 10 * DAY, flags=PageFlags.GONE,
                     last_checked=START - 2 * DAY, next_visit=START + 20 * DAY)
    dated_deletion = Candidate(KEY.url, KEY.url, START - 3 * DAY)
    dated_after = Candidate(KEY.url, KEY.url, START - DAY)
    assert decide(dated_deletion, gone, use_lastmod=True, rules=RULES) is Why.NOT_DUE
    assert decide(dated_after, gone, use_lastmod=True, rules=RULES) is Why.LASTMOD_NEWER
    # Without a stored date, the check that found it gone is what is known.
    undated = gone.copy(lastmod=None)
    assert decide(dated_deletion, undated, use_lastmod=True, rules=RULES) is Why.NOT_DUE
    assert decide(dated_after, undated, use_lastmod=True, rules=RULES) is Why.LASTMOD_NEWER
