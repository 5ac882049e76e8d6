"""One budget per domain for all workers: real Redis, real worker processes.

The workers are ``scrapy crawl sitemap`` processes, each with its own
sitemap (disjoint pages) on the same loopback site, which limits each
client *address* to R requests/s: all workers come from 127.0.0.1, so its
limiter sees them as one client, as a real site would see one crawler
running N machines behind one NAT. What counts is what the server saw.

Redis db 10 only (INCREMENTAL_TEST_BUDGET_REDIS_URI), a unique key prefix per
test, its keys deleted afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import time
from typing import TYPE_CHECKING

import pytest
import pytest_twisted
import redis
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from incremental_crawler.politeness.budget import (
    BUDGET_LUA,
    Grant,
    SharedBudget,
    script_args,
)
from incremental_crawler.politeness.window import WindowPolicy
from tests.redis_util import BUDGET_REDIS_URI, OwnRedis
from tests.scrapy_cli import start_scrapy
from tests.send_log import kept_apart
from tests.spiders import ListSpider
from tests.test_fatal import one_error_line

if TYPE_CHECKING:
    from pathlib import Path

REDIS_URL = BUDGET_REDIS_URI
#: Sleeps of tenths of a second against the script, and what the site saw of
#: worker processes' timing: the tests marked with it run while no other
#: test's crawlers do (under xdist). Those at the end assert no timing,
#: check a gap on the crawler's side (tests/send_log.py), or assert what
#: load only makes likelier (promises broken): they hold at any load.
ALONE = pytest.mark.alone


@pytest.fixture
def prefix(budget_prefix: str) -> str:
    return budget_prefix


# -- the Lua script against real Redis -----------------------------------------------


class Worker:
    """One worker's calls of the script (sync client: the script is what is tested)."""

    def __init__(self, key: str, policy: WindowPolicy) -> None:
        self.client = redis.Redis.from_url(REDIS_URL)
        self.sha = self.client.script_load(BUDGET_LUA)
        self.key, self.policy = key, policy

    def call(self, op: str, **kwargs) -> Grant:
        args = script_args(op, self.policy, **kwargs)
        return Grant.from_reply(self.client.evalsha(self.sha, 1, self.key, *args))

    def acquire(self, want: int = 1, **kwargs) -> Grant:
        return self.call("acquire", want=want, **kwargs)


@pytest.fixture
def workers(prefix):
    made: list[Worker] = []

    def make(policy: WindowPolicy | None = None, slot: str = "example.com") -> Worker:
        made.append(Worker(f"{prefix}:{slot}", policy or WindowPolicy()))
        return made[-1]

    yield make
    for worker in made:
        worker.client.close()


@ALONE
def test_the_bucket_refills_at_the_shared_rate_and_grants_small_batches(workers):
    a, b = workers(WindowPolicy(start_rate=40.0)), workers(WindowPolicy(start_rate=40.0))
    first = a.acquire(want=10)
    # A batch is a tenth of a second's rate (4 of 40/s); a fresh bucket holds one.
    assert (first.granted, first.first_seq, first.batch) == (1, 1, 4)
    empty = b.acquire(want=10)
    assert empty.granted == 0 and 0 < empty.wait <= 1 / 40 + 0.001
    time.sleep(0.3)
    # 0.3 s at 40/s is 12 tokens, but the bucket holds one batch only.
    batch = b.acquire(want=10)
    assert (batch.granted, batch.first_seq) == (4, 2)
    # What is left is at most the fraction of the next token (kept so that a
    # worker late for its token does not slow everyone down).
    assert a.acquire(want=10).granted <= 1
    # Two workers drawing as fast as they can get the rate between them, not
    # each: 0.5 s of polling hands out about 40/s x 0.5 s tokens.
    granted, started = 0, time.monotonic()
    for _ in range(10_000):  # bounded; ends on time
        if time.monotonic() - started >= 0.5:
            break
        for worker in (a, b):
            grant = worker.acquire(want=4)
            granted += grant.granted
    assert 15 <= granted <= 25


@ALONE
def test_a_freeze_is_shared_and_drops_the_bucket(workers):
    a, b = workers(WindowPolicy(start_rate=20.0)), workers(WindowPolicy(start_rate=20.0))
    assert a.acquire().granted == 1
    a.call("report", freeze=0.4)
    frozen = b.acquire()
    assert frozen.granted == 0 and 0.35 < frozen.wait <= 0.4 and frozen.frozen_for > 0.35
    time.sleep(0.42)
    after = b.acquire(want=5)
    # The freeze emptied the bucket; it refilled from nothing since.
    assert after.granted == 1 and after.frozen_for == 0


@ALONE
def test_a_burst_of_429s_seen_by_two_workers_cuts_the_window_once(workers):
    policy = WindowPolicy(start_rate=10.0)
    a, b = workers(policy), workers(policy)
    time.sleep(0.1)
    seq_a = a.acquire().first_seq
    time.sleep(0.11)
    seq_b = b.acquire().first_seq
    assert seq_b == seq_a + 1
    # Both requests were in flight together: both answered 429.
    assert a.call("report", hard_seq=seq_a).rate == pytest.approx(7.0)
    assert b.call("report", hard_seq=seq_b).rate == pytest.approx(7.0)
    # A request granted after the cut gets its own cut.
    time.sleep(0.15)
    later = a.acquire().first_seq
    assert b.call("report", hard_seq=later).rate == pytest.approx(4.9)


@ALONE
def test_healthy_answers_of_all_workers_grow_one_window(workers):
    policy = WindowPolicy(start_rate=4.0, max_rate=50.0)
    a, b = workers(policy), workers(policy)
    # Slow start: one window (rate answers, from any worker) doubles it.
    assert a.call("report", good=2).rate == 4.0
    assert b.call("report", good=2).rate == 8.0
    # After a hard signal: +1 per window.
    seq = a.acquire().first_seq
    assert a.call("report", hard_seq=seq).rate == pytest.approx(5.6)
    assert b.call("report", good=6).rate == pytest.approx(6.6)
    assert a.call("report", good=7).rate == pytest.approx(7.6)


@ALONE
def test_a_park_is_shared_and_ends_with_the_sites_wait(workers):
    a, b = workers(), workers()
    a.call("report", park=0.3)
    parked = b.acquire()
    assert parked.parked and parked.granted == 0
    time.sleep(0.32)
    assert not b.acquire().parked


@ALONE
def test_the_crawl_delay_caps_the_shared_rate(workers):
    a = workers(WindowPolicy(start_rate=40.0))
    a.acquire()
    time.sleep(0.5)
    # Capped at 2/s (Crawl-delay 0.5): one token after 0.5 s, not a batch.
    grant = a.acquire(want=4, cap=2.0)
    assert grant.granted == 1 and grant.batch == 1
    assert a.acquire(cap=2.0).wait == pytest.approx(0.5, abs=0.01)


# -- real workers against one rate-limited site --------------------------------------


def add_worker_pages(site, workers: int, pages: int, *, size: int = 600) -> list[list[str]]:
    """Pages /w<i>/<j> and a sitemap /w<i>.xml for each worker; their paths."""
    lists = []
    for i in range(workers):
        paths = [f"/w{i}/{j:03d}" for j in range(pages)]
        for path in paths:
            site.add_page(path, "strong", size=size)
        urls = "".join(f"<url><loc>{site.url(p)}</loc></url>" for p in paths)
        site.add_document(f"/w{i}.xml", '<?xml version="1.0" encoding="UTF-8"?>'
                          '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                          f"{urls}</urlset>", "application/xml")
        lists.append(paths)
    return lists


def start_worker(site, tmp_path: Path, i: int, *settings: str) -> subprocess.Popen[bytes]:
    return start_scrapy("crawl", "sitemap", "-a", f"sitemap_url={site.url(f'/w{i}.xml')}",
                        "-s", f"INCREMENTAL_STATE_URI=sqlite:///{tmp_path / f'w{i}.db'}",
                        "-s", "LOG_LEVEL=INFO", "-s", "LOGSTATS_INTERVAL=0",
                        "-s", "TELNETCONSOLE_ENABLED=False",
                        *(arg for setting in settings for arg in ("-s", setting)))


async def run_workers(site, tmp_path: Path, n: int, *settings: str,
                      on_tick=None) -> list[str]:
    """Run n workers to the end, serving the site meanwhile; their logs."""
    tmp_path.mkdir(exist_ok=True)
    procs = [start_worker(site, tmp_path, i, *settings) for i in range(n)]
    done = [deferToThread(proc.communicate) for proc in procs]
    # Bounded: 120 s at most (the crawls take seconds).
    for _ in range(24_000):
        if all(proc.poll() is not None for proc in procs):
            break
        if on_tick is not None:
            on_tick()
        await deferLater(reactor, 0.005)
    else:
        for proc in procs:
            proc.kill()
        pytest.fail("the workers did not finish in 120 s")
    logs = []
    for proc, d in zip(procs, done, strict=True):
        _, stderr = await d
        logs.append(stderr.decode(errors="replace"))
        assert proc.returncode == 0, logs[-1][-3000:]
    return logs


def stat(log: str, name: str) -> int:
    match = re.search(rf"'{re.escape(name)}': (\d+)", log)
    return int(match.group(1)) if match else 0


def busiest_second(site, prefix: str = "/") -> int:
    """The most requests (under *prefix*) that reached the server within any one second."""
    starts = sorted(r.started for r in site.log if r.path.startswith(prefix))
    most, lo = 0, 0
    for hi, t in enumerate(starts):
        while t - starts[lo] >= 1.0:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


def shared(prefix: str) -> tuple[str, ...]:
    return (f"INCREMENTAL_THROTTLE_SHARED_URL={REDIS_URL}",
            f"INCREMENTAL_THROTTLE_SHARED_PREFIX={prefix}")


def shared_stats(logs: list[str]) -> dict[str, int]:
    """The workers' shared-budget stats, summed."""
    names = ("roundtrips", "acquires", "waits", "freezes_seen", "tokens_dropped",
             "tokens_expired")
    return {name: sum(stat(log, f"incremental/throttle/shared/{name}") for log in logs)
            for name in names} | {"requests": sum(stat(log, "downloader/request_count")
                                                  for log in logs)}


RATE, BURST = 10, 3
#: Each worker's window starts at 8/s: 3 of them alone offer 24/s to a site
#: that allows 10, the shared window 8/s.
START = ("INCREMENTAL_THROTTLE_START_RATE=8",)


@ALONE
@pytest_twisted.ensureDeferred
async def test_three_workers_share_one_window_and_every_retry_after(site, tmp_path, prefix):
    # 30 pages: the shared window doubles to 16/s after its first 8 answers
    # and overshoots the site's 10/s (+3) well before the last of them.
    lists = add_worker_pages(site, 3, 10)
    limiter = site.limit(rate=RATE, burst=BURST)
    logs = await run_workers(site, tmp_path / "shared", 3, *shared(prefix), *START)
    fetched = {r.path for r in site.log if r.status == 200}
    assert all(set(paths) <= fetched for paths in lists)
    n429 = sum(1 for r in site.log if r.status == 429)
    figures = shared_stats(logs)
    # The shared window overshot once or twice in slow start, as one client's
    # would: the site answered 429 + Retry-After, and every worker stayed
    # away for as long as the site had said (5 ms grace for requests already
    # on the wire: the limiter's broken_promises).
    assert 1 <= n429 <= 0.1 * len(site.log)
    assert figures["freezes_seen"] >= 1  # a worker held by another's 429
    assert limiter.broken_promises == 0
    # No second in which the workers together sent more than the site
    # allows (its rate plus its bucket).
    assert busiest_second(site) <= RATE + BURST
    # Every request went out with a token (granted tokens not used were
    # dropped by a freeze or expired).
    used = figures["acquires"] - figures["tokens_dropped"] - figures["tokens_expired"]
    assert used == figures["requests"]
    # (Its control, the same workers each with a budget of its own, breaking
    # those promises, runs beside other tests: see
    # test_three_workers_each_with_its_own_budget_break_the_promises_made_to_the_others.)


@ALONE
@pytest_twisted.ensureDeferred
async def test_two_workers_keep_one_crawl_delay_between_them(site, tmp_path, prefix):
    lists = add_worker_pages(site, 2, 10)
    # 10 requests/s for the site as a whole, whoever sends them; each
    # worker's window starts above it (20/s), so the Crawl-delay is what
    # paces them from the first request.
    site.robots_txt = "User-agent: *\nCrawl-delay: 0.1\nAllow: /\n"
    start = "INCREMENTAL_THROTTLE_START_RATE=20"
    # Their pages start together (sitemaps held until both asked): a worker
    # starting a second late would keep the span and the busiest second
    # within bounds even with no delay shared.
    await run_workers(site, tmp_path / "shared", 2, *shared(prefix), start,
                      on_tick=held_until_all_workers_ask(site, 2))
    fetched = {r.path for r in site.log if r.status == 200}
    assert all(set(paths) <= fetched for paths in lists)
    starts = sorted(r.started for r in site.log if r.path.startswith("/w"))
    span = starts[-1] - starts[0]
    # 0.1 s between any two of them (1 ms of slack each for the two clocks
    # of the test).
    assert span >= (len(starts) - 1) * 0.099
    # (robots.txt is fetched before its Crawl-delay is known: not counted.)
    # 10 a second kept; 13 leaves room for a stall of the test's server
    # bunching a few arrivals (each worker keeping its own: 20).
    assert busiest_second(site, "/w") <= 13

    # Control: each worker keeps the Crawl-delay on its own: twice the rate
    # (their pages started together: their sitemaps held until both asked).
    site.reset_log()
    await run_workers(site, tmp_path / "alone", 2, start,
                      on_tick=held_until_all_workers_ask(site, 2))
    assert busiest_second(site, "/w") >= 16


# -- Redis unavailable: the crawl stops, loudly, rather than crawl unthrottled ------


POLITE = {"INCREMENTAL_THROTTLE_ENABLED": True, "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
          "CONCURRENT_REQUESTS": 16, "INCREMENTAL_THROTTLE_START_RATE": 40}


@pytest.fixture
def private_redis():
    """A redis-server of this test's own (the test kills it)."""
    own = OwnRedis()
    own.start()
    try:
        yield own
    finally:
        own.remove()


@ALONE
@pytest_twisted.ensureDeferred
async def test_losing_redis_mid_crawl_stops_the_crawl_and_its_requests(
        site, crawl, private_redis, caplog):
    url = private_redis.uri
    paths = [f"/p/{i:03d}" for i in range(60)]
    for path in paths:
        site.add_page(path, "strong", size=500)
    crawling = defer.ensureDeferred(crawl(ListSpider, settings={
        **POLITE, "INCREMENTAL_THROTTLE_START_RATE": 20, "INCREMENTAL_THROTTLE_SHARED_URL": url,
        "INCREMENTAL_REDIS_RETRY_TIME": 1}, urls=[site.url(p) for p in paths]))
    for _ in range(6000):  # bounded: 30 s for the crawl to get going
        if len(site.log) >= 10 or crawling.called:
            break
        await deferLater(reactor, 0.005)
    private_redis.stop()
    killed_at = time.monotonic()
    crawler = await crawling
    assert crawler.stats.get_value("finish_reason") == "shared_budget_unavailable"
    assert "The shared budget at unix://" in caplog.text and "closing the crawl" in caplog.text
    assert 10 <= len(site.log) < len(paths)
    # Nothing left without a token: only requests that held one when Redis
    # died (a batch lives 0.1 s) reached the site after it.
    assert [r.path for r in site.log if r.started > killed_at + 0.5] == []


@pytest.fixture
def aof_redis():
    """A redis-server of this test's own that keeps its data across a restart."""
    own = OwnRedis("--appendonly", "yes")
    own.start()
    try:
        yield own
    finally:
        own.remove()


async def until_requests(site, n: int) -> None:
    for _ in range(6000):  # bounded: 30 s for the crawl to get going
        if len(site.log) >= n:
            return
        await deferLater(reactor, 0.005)
    pytest.fail("the crawl did not get going")


@ALONE
@pytest_twisted.ensureDeferred
async def test_a_crawl_goes_on_across_a_restart_of_the_budgets_redis(
        site, crawl, aof_redis, caplog):
    # Shut down gracefully mid-crawl, started a second later: requests wait
    # for their tokens meanwhile (none leaves unthrottled), then go on.
    url = aof_redis.uri
    paths = [f"/p/{i:03d}" for i in range(60)]
    for path in paths:
        site.add_page(path, "strong", size=500)
    with caplog.at_level(logging.WARNING):
        crawling = defer.ensureDeferred(crawl(ListSpider, settings={
            **POLITE, "INCREMENTAL_THROTTLE_START_RATE": 20,
            "INCREMENTAL_THROTTLE_SHARED_URL": url}, urls=[site.url(p) for p in paths]))
        await until_requests(site, 10)
        await deferToThread(aof_redis.shut_down)
        down_at = time.monotonic()
        await deferLater(reactor, 1.0)
        up_at = time.monotonic()
        await deferToThread(aof_redis.start)
        crawler = await crawling
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert sorted(r.path for r in site.log if r.path.startswith("/p/")) == paths  # once each
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith(f"The shared budget at {url}: Redis does not answer")
               for m in warnings), warnings
    assert any(m.startswith(f"The shared budget at {url}: Redis answers again after")
               for m in warnings), warnings
    # Only requests holding a token when Redis went away (a batch lives
    # 0.1 s) reached the site while it was away.
    assert [r.path for r in site.log if down_at + 0.5 < r.started < up_at] == []


# -- no timing asserted, or a gap kept on the crawler's side: beside other tests ----


def held_until_all_workers_ask(site, n: int):
    """Hold the workers' sitemaps (``/w<i>.xml``) until all *n* are on the
    wire, then let them go together: *run_workers*' ``on_tick``. Their page
    requests start at one moment, however late a loaded machine started one
    of the processes."""
    for i in range(n):
        site.hold(f"/w{i}.xml")

    def tick() -> None:
        if site.held >= n:
            site.release()

    return tick


# Not marked alone (it runs beside other tests): what it asserts, load only
# makes likelier. The workers start their pages together (their sitemaps
# held until all three asked), so their crawls overlap, each at its own 8/s:
# 24/s offered to a site allowing 10. Whenever one of them reads a 429, the
# others know nothing of it and go on sending; the site counts a request
# arriving inside the wait it asked for as a broken promise (a late arrival,
# a loaded machine's, counts too: load adds broken promises, never removes
# them). The same workers on the shared budget make none
# (test_three_workers_share_one_window_and_every_retry_after).
@pytest_twisted.ensureDeferred
async def test_three_workers_each_with_its_own_budget_break_the_promises_made_to_the_others(
        site, tmp_path):
    add_worker_pages(site, 3, 10)
    limiter = site.limit(rate=RATE, burst=BURST)
    await run_workers(site, tmp_path / "alone", 3, *START,
                      on_tick=held_until_all_workers_ask(site, 3))
    assert sum(1 for r in site.log if r.status == 429) >= 1
    assert limiter.broken_promises > 0


@pytest_twisted.ensureDeferred
async def test_closing_while_frozen_drops_the_requests_waiting_for_a_token(site, crawl, prefix):
    # A 429 froze the slot for 20 s, the other requests wait at the gate;
    # the crawl is closed 2 s in: close must not wait out the freeze and
    # then send them (after the close was asked).
    paths = [f"/p/{i:03d}" for i in range(10)]
    for path in paths:
        site.add_page(path, "strong", size=500)
    site.override("/p/000", status=429, headers={"Retry-After": "20"})
    crawler = await crawl(ListSpider, settings={
        **POLITE, "INCREMENTAL_THROTTLE_START_RATE": 2, "CLOSESPIDER_TIMEOUT": 2,
        "INCREMENTAL_THROTTLE_SHARED_URL": REDIS_URL,
        "INCREMENTAL_THROTTLE_SHARED_PREFIX": prefix,
        "DOWNLOADER": "tests.send_log.SendLogDownloader"}, urls=[site.url(p) for p in paths])
    closed = time.monotonic()
    assert crawler.stats.get_value("finish_reason") == "closespider_timeout"
    downloader = crawler.engine.downloader
    refusal = downloader.send_of(next(r for r in site.log if r.path == "/p/000"))
    assert refusal.status == 429 and refusal.answered is not None
    # Nothing left the crawler after it read the 429 (those that had left
    # before were on their way: 2/s leaves none on a quiet machine)...
    assert [s.url for s in downloader.sends if s.left > refusal.answered] == []
    # ... and the crawl closed inside the freeze, not after waiting it out.
    assert closed < refusal.answered + 20
    assert crawler.stats.get_value("incremental/throttle/dropped_at_close", 0) >= 1


@pytest_twisted.ensureDeferred
async def test_an_unreachable_budget_closes_the_crawl_before_any_request(
        site, crawl, prefix, caplog):
    site.add_page("/a", "strong", size=500)
    crawler = await crawl(ListSpider, settings={
        **POLITE, "INCREMENTAL_THROTTLE_SHARED_URL": "redis://127.0.0.1:1/10",
        "INCREMENTAL_THROTTLE_SHARED_PREFIX": prefix}, urls=[site.url("/a")])
    assert crawler.stats.get_value("finish_reason") == "shared_budget_unavailable"
    assert site.log == []
    assert "The shared budget at redis://127.0.0.1:1/10 cannot be used" in caplog.text
    # A URL that is not Redis's: the same, not a crawl without any throttle.
    crawler = await crawl(ListSpider, settings={
        **POLITE, "INCREMENTAL_THROTTLE_SHARED_URL": "http://127.0.0.1:6379/10"},
        urls=[site.url("/a")])
    assert crawler.stats.get_value("finish_reason") == "shared_budget_unavailable"
    assert site.log == []
    assert "INCREMENTAL_THROTTLE_SHARED_URL='http://127.0.0.1:6379/10'" in caplog.text


@pytest_twisted.ensureDeferred
async def test_a_budgets_redis_that_stays_away_stops_the_crawl_with_one_line(
        site, tmp_path, aof_redis):
    [paths] = add_worker_pages(site, 1, 60)
    proc = start_worker(site, tmp_path, 0, "INCREMENTAL_THROTTLE_ENABLED=True",
                        f"INCREMENTAL_THROTTLE_SHARED_URL={aof_redis.uri}",
                        "INCREMENTAL_THROTTLE_START_RATE=20", "INCREMENTAL_REDIS_RETRY_TIME=1")
    try:
        await until_requests(site, 10)
        await deferToThread(aof_redis.shut_down)  # and not started again
    finally:
        if proc.poll() is None and aof_redis.proc is not None:
            proc.kill()
    _, stderr = await deferToThread(proc.communicate, timeout=120)
    result = subprocess.CompletedProcess([], proc.returncode, "", stderr.decode())
    assert proc.returncode == 1, result.stderr[-3000:]
    assert "'finish_reason': 'shared_budget_unavailable'" in result.stderr
    line = one_error_line(result)
    assert line.startswith(
        f"The shared budget at {aof_redis.uri} failed (Redis has not answered for 1 s "
        "(INCREMENTAL_REDIS_RETRY_TIME): "), line
    assert len([r for r in site.log if r.path.startswith("/w0/")]) < len(paths)


class _Stats(dict):
    def inc_value(self, key, count=1):
        self[key] = self.get(key, 0) + count


@pytest_twisted.ensureDeferred
async def test_a_freeze_reported_as_the_spider_closes_still_reaches_the_others(prefix):
    # The last answer of a closing crawl was a 429: its freeze must not be
    # lost with the worker (the others would go on hitting the site).
    async def run() -> None:
        budget = SharedBudget(REDIS_URL, prefix, stats=_Stats(), on_reply=lambda k, g: None,
                              on_failure=lambda exc: None)
        await budget.open()
        policy = WindowPolicy()
        await budget.acquire("example.com", policy, 0.0)
        budget.report("example.com", policy, hard_seq=1, freeze=30.0)
        await budget.close()

    await defer.Deferred.fromFuture(asyncio.ensure_future(run()))
    other = Worker(f"{prefix}:example.com", WindowPolicy())
    try:
        grant = other.acquire()
    finally:
        other.client.close()
    assert grant.granted == 0 and grant.frozen_for > 25


@pytest_twisted.ensureDeferred
async def test_the_download_delay_caps_the_first_tokens_of_a_warm_budget(site, crawl, workers,
                                                                         prefix):
    # A budget left at 40/s by an earlier crawl (its bucket full): the first
    # acquire of this crawl, before any request reached Scrapy's slot, must
    # already be capped by DOWNLOAD_DELAY, not get a batch of 4 at once.
    warm = workers(WindowPolicy(start_rate=40.0), slot="127.0.0.1")
    warm.acquire()
    time.sleep(0.3)
    paths = [f"/p/{i}" for i in range(4)]
    for path in paths:
        site.add_page(path, "strong", size=500)
    crawler = await crawl(ListSpider, settings={
        **POLITE, "ROBOTSTXT_OBEY": False, "DOWNLOAD_DELAY": 0.5, "DOWNLOAD_DELAY_JITTER": 0,
        "INCREMENTAL_THROTTLE_SHARED_URL": REDIS_URL,
        "INCREMENTAL_THROTTLE_SHARED_PREFIX": prefix,
        "DOWNLOADER": "tests.send_log.SendLogDownloader"}, urls=[site.url(p) for p in paths])
    assert len(site.log) == 4
    assert kept_apart(site.log, crawler.engine.downloader, 0.5) == []
    # The slot keeps the user's delay too: the bucket grants on the Redis
    # server's clock, and a grant whose round trip came back quicker than
    # the one before it would let a request leave a few milliseconds early.
    assert crawler.engine.downloader.slots["127.0.0.1"].delay == 0.5
