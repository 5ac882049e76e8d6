"""Cluster mode: several real ``scrapy crawl`` workers share one crawl through Redis.

Workers are separate processes started with the same command line plus
``INCREMENTAL_CLUSTER_URL`` (:class:`tests.cluster_worker.Worker`); a run
of one worker that is neither killed nor signalled (a fill, a next run) is
crawled in the test's process with the same settings
(:func:`tests.cluster_worker.crawl_in_process`). The test site counts what
it served. Redis db 12, a key prefix per test, every key
removed afterwards.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import time
from types import SimpleNamespace

import pytest
import pytest_twisted
import redis
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from incremental_crawler.config import DEFAULT_SETTINGS
from incremental_crawler.state.records import PageKey, PageState
from incremental_crawler.state.stores import open_store, state_uri
from tests.cluster_worker import Worker, crawl_in_process, leftover_keys, page_gets
from tests.redis_util import CLUSTER_REDIS_URI, OwnRedis
from tests.scrapy_cli import scrapy_in_process
from tests.waiting import until

REDIS_URL = CLUSTER_REDIS_URI


async def stored_state(state_uri: str, urls: list[str]) -> tuple[set[str], set[str]]:
    """Pages stored with validators, and item urls, read through the store's API."""
    store = open_store(Settings({"INCREMENTAL_STATE_URI": state_uri}))
    try:
        pages = await deferred_from_coro(
            store.get_pages([PageKey("sitemap", url) for url in urls]))
        items = {str(item["url"]) for item in store.iter_items("sitemap")}
    finally:
        await deferred_from_coro(store.close())
    return {key.url for key, state in pages.items() if state.has_validators}, items


async def until_all_have_work(site, workers: int) -> None:
    """Hold the pages' answers until each of *workers* has its 4 requests
    (CONCURRENT_REQUESTS) on the wire, then let them go: however slowly a
    process starts on a busy machine, it has work before the others can
    finish the crawl without it. The caller releases (``site.release()``)."""
    site.hold("/p/")
    await until(lambda: site.held >= workers * 4, f"{workers} workers to have requests",
                seconds=60)


@pytest.mark.parametrize("state_uri", ["redis", "sqlite"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_workers_share_one_crawl_and_exit_by_themselves(
    site, state_uri, cluster_prefix, tmp_path
):
    n = 120
    for i in range(n):
        site.add_page(f"/p/{i:04d}", ("strong", "weak", "lastmod")[i % 3], size=2000)
    # Slow pages, so that the work is spread over the workers.
    site.slow("/p/", 0.1)

    first = [Worker(site, state_uri, cluster_prefix, tmp_path, str(i)) for i in range(2)]
    # A third worker joins late, mid-crawl. The others cannot finish the
    # crawl (and leave on their idle grace) before it has work, however long
    # it takes to start on a busy machine.
    # Two worker processes start before this: as long as the waits below for
    # a slow start (a loaded machine), not until's default.
    await until(lambda: sum(page_gets(site).values()) >= 15, "the crawl to start", seconds=60)
    late = Worker(site, state_uri, cluster_prefix, tmp_path, "late")
    await until_all_have_work(site, 3)
    site.release()
    workers = [*first, late]
    for worker in workers:
        assert await worker.wait() == 0, worker.tail()

    gets = page_gets(site)
    assert len(gets) == n
    assert max(gets.values()) == 1, [p for p, c in gets.items() if c > 1]
    # The sitemaps were read once in all, by whichever worker got them.
    for path in ("/sitemap_index.xml", "/sitemap-1.xml", "/sitemap-2.xml.gz"):
        assert len(site.requests_for(path)) == 1, path
    per_worker = [worker.urls() for worker in workers]
    emitted = [url for urls in per_worker for url in urls]
    assert sorted(emitted) == sorted(site.url(f"/p/{i:04d}") for i in range(n))
    assert sum(1 for urls in per_worker if urls) >= 2, [len(u) for u in per_worker]
    assert late.urls(), "the late worker got no share of the work"
    # The run ended with its last worker: nothing of it is left in Redis.
    assert leftover_keys(cluster_prefix) == []
    if state_uri.startswith("sqlite"):
        # Given up on SQLite: a next run of two worker processes sharing the
        # one file (a changed lastmod fetched once, the rest kept away, a
        # report pair per worker); it runs on Redis below. A next run on
        # SQLite is still crawled, by one worker in this process, in the
        # withheld-page tests below.
        return

    # Next run: 5 pages changed. Last run's dupefilter is gone, so the
    # changed pages are fetched; the sitemap lastmods keep the rest away
    # (the rotating sample off: the test counts requests exactly).
    changed = set(site.change_fraction(0.05, seed=3))
    site.reset_log()
    reports = tmp_path / "reports"
    workers = [Worker(site, state_uri, cluster_prefix, tmp_path, f"2-{i}",
                      "-s", "INCREMENTAL_LASTMOD_RECHECK_SHARE=0",
                      "-s", f"INCREMENTAL_REPORT_DIR={reports}") for i in range(2)]
    for worker in workers:
        assert await worker.wait() == 0, worker.tail()
    assert dict(page_gets(site)) == dict.fromkeys(changed, 1)
    assert sorted(url for w in workers for url in w.urls()) == sorted(
        site.url(path) for path in changed)
    assert leftover_keys(cluster_prefix) == []
    # One report pair per worker, its id in the names (and no shared report.html).
    latest = sorted(p.name for p in reports.glob("report-*.json")
                    if not re.match(r"report-\d{8}T", p.name))
    assert len(latest) == 2 and not (reports / "report.html").exists(), latest
    for name in latest:
        crawl = json.loads((reports / name).read_text())["crawl"]
        worker = re.sub(r"[^A-Za-z0-9._-]+", "-", crawl["worker"])
        assert crawl["worker"] and name == f"report-{worker}.json"
        assert (reports / name).with_suffix(".html").exists()
    # Each crawl's own JSON; no page per crawl (each worker's page holds them).
    assert len(list(reports.glob("report-*T*Z-*.json"))) == 2
    assert list(reports.glob("report-*T*Z-*.html")) == []


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_killed_worker_stalls_nothing_and_loses_nothing(
    site, state_uri, cluster_prefix, tmp_path
):
    n = 60
    site.add_pages(n, size=2000)
    site.slow("/p/", 0.05)
    reports = tmp_path / "reports"
    victim, survivor = (Worker(site, state_uri, cluster_prefix, tmp_path, name,
                               "-s", "INCREMENTAL_CLUSTER_WORKER_TTL=2",
                               "-s", f"INCREMENTAL_REPORT_DIR={reports}")
                        for name in ("victim", "survivor"))
    await until(lambda: sum(page_gets(site).values()) >= 20, "the crawl to get going")
    # The victim dies with requests on the wire (however late it started).
    await until_all_have_work(site, 2)
    os.kill(victim.proc.pid, signal.SIGKILL)
    await deferToThread(victim.proc.wait)
    site.release()

    # The survivor takes back what the victim held (its heartbeat stops),
    # finishes the crawl and exits by itself.
    assert await survivor.wait() == 0, survivor.tail()
    requeued = re.search(r"(\d+) of their requests went back to the queue", survivor.text())
    assert requeued, survivor.tail()
    urls = [site.url(f"/p/{i:04d}") for i in range(n)]
    with_validators, with_items = await stored_state(state_uri, urls)
    assert with_validators == set(urls)
    assert with_items == set(urls)
    gets = page_gets(site)
    assert len(gets) == n
    # Only what the victim held when it died (in flight, or processed but
    # not committed) is fetched twice.
    twice = [path for path, count in gets.items() if count > 1]
    assert max(gets.values()) <= 2
    assert len(twice) <= int(requeued.group(1)), twice
    assert leftover_keys(cluster_prefix) == []
    # The run's totals are the survivor's alone (the victim recorded no
    # crawl): what the victim counted that no worker counted again, the
    # survivor counted when it ended the run. Every page once, each in one
    # column, none below zero.
    s = run_summary(reports)
    assert (s["pages_known"], s["requested"], s["pages_no_outcome"]) == (n, n, 0), s
    assert all(v >= 0 for k, v in s.items() if k.startswith(("pages_", "requested"))), s


def run_summary(reports) -> dict[str, int]:
    """The report summaries of the workers that recorded their crawls, summed."""
    total: dict[str, int] = {}
    for path in reports.glob("report-*.json"):
        if not re.match(r"report-\d{8}T", path.name):
            for k, v in json.loads(path.read_text())["summary"].items():
                total[k] = total.get(k, 0) + v
    return total


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_the_pages_a_killed_lister_counted_are_in_the_runs_totals(
    site, state_uri, cluster_prefix, tmp_path
):
    # The lister reads the sitemaps (it starts alone) and counts every page
    # requested; none answers until both workers have requests on the wire;
    # the lister is killed. Its count of the pages still queued dies with
    # it (their requests carry it: nobody decides them again): the
    # survivor, ending the run, counts them.
    n = 30
    site.add_pages(n, size=2000)
    site.hold("/p/")
    reports = tmp_path / "reports"
    options = ("-s", "INCREMENTAL_CLUSTER_WORKER_TTL=2", "-s", f"INCREMENTAL_REPORT_DIR={reports}")
    lister = Worker(site, state_uri, cluster_prefix, tmp_path, "lister", *options)
    await until(lambda: site.held >= 4, "the lister to have requests", seconds=60)
    survivor = Worker(site, state_uri, cluster_prefix, tmp_path, "survivor", *options)
    await until(lambda: site.held >= 8, "both workers to have requests", seconds=60)
    os.kill(lister.proc.pid, signal.SIGKILL)
    await deferToThread(lister.proc.wait)
    site.release()
    assert await survivor.wait() == 0, survivor.tail()
    assert leftover_keys(cluster_prefix) == []
    s = run_summary(reports)
    assert (s["pages_known"], s["requested"], s["pages_new"], s["pages_no_outcome"]) == \
        (n, n, n, 0), s
    assert s["requested_of_killed"] > 0, s
    assert re.search(r"worker\(s\) of run \w+ were killed before their crawls were recorded",
                     survivor.text()), survivor.tail()


@pytest_twisted.ensureDeferred
async def test_the_dupefilter_keys_requests_by_scrapys_own_fingerprint(cluster_prefix):
    from scrapy import Request, Spider
    from scrapy.extension import ExtensionManager
    from scrapy.utils.test import get_crawler

    from incremental_crawler.cluster.coordinator import ClusterCoordinator
    from incremental_crawler.cluster.scheduler import ClusterDupeFilter

    crawler = get_crawler(Spider, {
        **DEFAULT_SETTINGS,
        "INCREMENTAL_CLUSTER_URL": REDIS_URL, "INCREMENTAL_CLUSTER_PREFIX": cluster_prefix,
    })
    spider = Spider("dupes")
    spider.crawler, spider.settings = crawler, crawler.settings
    coordinator = ClusterCoordinator.from_crawler(crawler)
    # Installed as the crawl would (the dupefilter finds it as an extension).
    crawler.extensions = ExtensionManager(coordinator, crawler=crawler)
    coordinator.join(spider)
    try:
        dupefilter = ClusterDupeFilter.from_spider(spider)
        request = Request("http://127.0.0.1/a?b=2&a=1#top")
        assert not dupefilter.request_seen(request)
        # Same request for Scrapy (query order, fragment): seen.
        assert dupefilter.request_seen(Request("http://127.0.0.1/a?a=1&b=2"))
        client = redis.Redis.from_url(REDIS_URL)
        members = client.smembers(coordinator.seen_key)
        client.close()
        assert members == {crawler.request_fingerprinter.fingerprint(request).hex().encode()}
        assert coordinator.run in coordinator.seen_key
    finally:
        coordinator.leave("finished")
    # The last worker out ended the run: its filter is gone.
    assert leftover_keys(cluster_prefix) == []


def test_an_unreachable_cluster_redis_is_a_clear_error():
    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from incremental_crawler.cluster.coordinator import ClusterCoordinator, ClusterError

    # Port 1 on loopback: nothing listens there.
    crawler = get_crawler(Spider, {
        **DEFAULT_SETTINGS, "INCREMENTAL_CLUSTER_URL": "redis://:secret@127.0.0.1:1/0",
    })
    # The password never shows.
    with pytest.raises(ClusterError, match=r"INCREMENTAL_CLUSTER_URL redis://:\*\*\*@127\.0\.0\.1:1/0"):
        ClusterCoordinator.from_crawler(crawler)


def options(settings: dict[str, object]) -> tuple[str, ...]:
    """*settings* as a worker's ``-s`` options."""
    return tuple(arg for name, value in settings.items() for arg in ("-s", f"{name}={value}"))


async def crawled_and_due_again(site, n: int, state_uri: str, prefix: str,
                                *, sample_share: float) -> tuple[str, ...]:
    """*n* pages crawled by one worker (in this process: its run is the
    fill, not what is tested), revisits of a second, then every page due
    again; the workers' ``-s`` options for that (no sampled full re-check:
    every revisit is a 304; *sample_share*: the vouched pages' rotating
    sample)."""
    site.add_pages(n, size=2000)
    revisits = {"INCREMENTAL_REVISIT_ENABLED": True,
                "INCREMENTAL_REVISIT_INITIAL": 1, "INCREMENTAL_REVISIT_MIN": 1,
                "INCREMENTAL_RECHECK_EVERY": 0,
                "INCREMENTAL_LASTMOD_RECHECK_SHARE": sample_share}
    crawler = await crawl_in_process(site, state_uri, prefix, **revisits)
    assert sorted(str(item["url"]) for item in crawler.collected) == sorted(
        site.url(f"/p/{i:04d}") for i in range(n))
    assert leftover_keys(prefix) == []
    await deferLater(reactor, 1.2)  # every page is due again
    site.reset_log()
    return options(revisits)


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_due_pages_are_reseeded_once_for_the_whole_cluster(
    site, state_uri, cluster_prefix, tmp_path
):
    # Crawl 2 reads no sitemap (304s): the due pages come from the store,
    # re-seeded by one worker into the shared queue, fetched once each.
    n = 60
    # The pages' trusted lastmods vouch for them: re-seeded as the rotating
    # sample, here all of them.
    revisits = await crawled_and_due_again(site, n, state_uri, cluster_prefix, sample_share=1)

    # Slow pages, and both workers have some on the wire before any is
    # answered: the work is spread over them, whichever started first.
    site.slow("/p/", 0.1)
    workers = [Worker(site, state_uri, cluster_prefix, tmp_path, f"2-{i}", *revisits)
               for i in range(2)]
    await until_all_have_work(site, 2)
    site.release()
    for worker in workers:
        assert await worker.wait() == 0, worker.tail()
    # The index's lastmods did not move: its sitemaps were not read.
    assert not site.requests_for("/sitemap-1.xml") and not site.requests_for("/sitemap-2.xml.gz")
    gets = page_gets(site)
    assert len(gets) == n and max(gets.values()) == 1
    assert all(r.status == 304 for r in site.log if r.path.startswith("/p/"))
    logs = [w.text() for w in workers]
    assert sum("Re-seeded 60 due pages" in log for log in logs) == 1, logs
    # Both workers fetched re-seeded pages: the one that did not re-seed
    # waited for the other instead of leaving.
    fetched = [int(m.group(1)) if (m := re.search(r"'incremental/not_modified': (\d+)", log))
               else 0 for log in logs]
    assert min(fetched) > 0, fetched
    assert leftover_keys(cluster_prefix) == []


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_runs_first_worker_marks_the_runs_start_on_one_redis(
    site, state_uri, cluster_prefix, tmp_path
):
    # The store on one Redis server (layout 4): the worker that starts the
    # run sets the scope's mark at the run's start (no hold, so no crawl
    # start did), and P:ck notes the run's checks from then on.
    n = 20
    site.add_pages(n, size=1500)
    before = math.floor(time.time())
    await crawl_in_process(site, state_uri, cluster_prefix)
    store = open_store(Settings({"INCREMENTAL_STATE_URI": state_uri}))
    try:
        mark = store._sync.hget(store._key("nvm", "sitemap"), "mark")
        assert mark is not None and int(mark) >= before
        checks = store._sync.zrange(store._key("ck", "sitemap"), 0, -1, withscores=True)
        checked = [s for s in store.iter_pages("sitemap")
                   if s.callback is not None and s.last_checked >= int(mark)]
        assert len(checks) == len(checked) >= n
        assert min(score for _, score in checks) >= int(mark)
    finally:
        await deferred_from_coro(store.close())


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_redirects_and_retries_travel_through_the_shared_queue(
    site, state_uri, cluster_prefix, caplog
):
    # A redirect or a retry is a new request built from the old one's meta
    # (our middlewares' notes included): it must survive serialisation into
    # Redis and be handled like any page.
    for i in range(6):
        site.add_page(f"/p/{i:04d}", "strong", size=1000)
    site.add_page("/moved/0001", "strong", size=1000)
    site.add_redirect("/p/0001", "/moved/0001")
    site.override("/p/0002", status=500)
    # Scrapy's engine logs a request that does not serialise at INFO ("Error
    # while handling downloader output", with its traceback); in this
    # process nothing lowers the root logger from WARNING, so caplog must.
    caplog.set_level(logging.INFO)
    await crawl_in_process(site, state_uri, cluster_prefix, RETRY_TIMES=1)
    # Nothing raised on the way through Redis.
    assert "Traceback" not in caplog.text, caplog.text
    assert [r.status for r in site.requests_for("/moved/0001")] == [200]
    assert len(site.requests_for("/p/0002")) == 2  # the first try and one retry
    with_validators, _ = await stored_state(state_uri, [site.url("/moved/0001")])
    assert with_validators == {site.url("/moved/0001")}


def test_one_setting_switches_cluster_mode_on_and_the_project_keeps_its_own_choices():
    from incremental_crawler.addon import IncrementalAddon

    settings = Settings()
    settings.set("INCREMENTAL_CLUSTER_URL", "redis://10.0.0.5:6379/3", priority="project")
    IncrementalAddon().update_settings(settings)
    assert settings["SCHEDULER"] == "incremental_crawler.cluster.scheduler.ClusterScheduler"
    assert settings["DUPEFILTER_CLASS"] == "incremental_crawler.cluster.scheduler.ClusterDupeFilter"
    # The store, as a crawl and the commands that read its store take it.
    assert state_uri(settings) == "redis://10.0.0.5:6379/3"
    assert settings["INCREMENTAL_THROTTLE_SHARED_URL"] == "redis://10.0.0.5:6379/3"
    assert settings.getbool("SCHEDULER_PERSIST")
    assert "incremental_crawler.cluster.coordinator.ClusterCoordinator" in settings["EXTENSIONS"]

    own = Settings()
    own.set("INCREMENTAL_CLUSTER_URL", "redis://10.0.0.5:6379/3", priority="project")
    own.set("INCREMENTAL_STATE_URI", "sqlite:////data/state.db", priority="project")
    IncrementalAddon().update_settings(own)
    assert state_uri(own) == "sqlite:////data/state.db"

    plain = Settings()
    IncrementalAddon().update_settings(plain)
    assert plain["SCHEDULER"] == "scrapy.core.scheduler.Scheduler"


async def a_worker_withholding_pages(site, state_uri, cluster_prefix, tmp_path,
                                     *extra: str) -> tuple[Worker, list[str]]:
    """A run of two workers over 60 slow pages: one reads the sitemaps, the
    other joins late and its item pipeline fails on every item. The failing
    worker and the URLs whose state it withheld."""
    site.add_pages(60, size=1000)
    site.slow("/p/", 0.1)
    reader = Worker(site, state_uri, cluster_prefix, tmp_path, "reader", *extra)
    await until(lambda: sum(page_gets(site).values()) >= 10, "the sitemaps to be read")
    failing = Worker(site, state_uri, cluster_prefix, tmp_path, "failing", *extra,
                     "-s", 'ITEM_PIPELINES={"tests.spiders.FailingPipeline": 800}',
                     "-s", "TEST_FAIL_ON=")
    await until_all_have_work(site, 2)
    site.release()
    for worker in (reader, failing):
        assert await worker.wait() == 0, worker.tail()
    withheld = re.findall(r"Not saving validators of (\S+):", failing.text())
    assert withheld, failing.tail()
    return failing, withheld


async def test_a_page_withheld_by_another_worker_and_not_recorded_keeps_the_sitemaps_unsaved(
    site, state_uri, cluster_prefix, tmp_path
):
    # The first worker reads every sitemap; the second joins later and
    # every page it handles fails in a user pipeline (state withheld).
    # Without revisits nothing re-seeds a page from its failure record, so
    # the failures are not recorded to be asked again: the sitemaps' state
    # must not be saved, or the next run skips them as unchanged and never
    # asks again for the pages that failed.
    failing, withheld = await a_worker_withholding_pages(site, state_uri, cluster_prefix,
                                                         tmp_path)
    assert re.search(r"'incremental/failures_unrecorded': [1-9]",
                     failing.text())
    assert await sitemaps_saved(state_uri, site) == set()
    # The next run asks again for the pages that failed.
    site.reset_log()
    site.slow("/p/", 0.0)
    await crawl_in_process(site, state_uri, cluster_prefix)
    assert set(withheld) <= {site.url(path) for path in page_gets(site)}
    assert leftover_keys(cluster_prefix) == []


SITEMAPS = ("/sitemap_index.xml", "/sitemap-1.xml", "/sitemap-2.xml.gz")
REVISITS = ("-s", "INCREMENTAL_REVISIT_ENABLED=True")


async def test_a_page_withheld_by_another_worker_and_recorded_lets_the_sitemaps_be_saved(
    site, state_uri, cluster_prefix, tmp_path
):
    # As above, with revisits: the failing worker's withheld pages are
    # recorded (due on the next run, re-seeded from the store), so the
    # run's sitemaps are saved. The site's sitemaps have no validators: the
    # index is read again, but its children's lastmods did not move, so
    # they are not; the pages that failed are asked again all the same.
    failing, withheld = await a_worker_withholding_pages(site, state_uri, cluster_prefix,
                                                         tmp_path, *REVISITS)
    assert "incremental/failures_unrecorded" not in failing.text()
    assert await sitemaps_saved(state_uri, site) == set(SITEMAPS)
    site.reset_log()
    site.slow("/p/", 0.0)
    await crawl_in_process(site, state_uri, cluster_prefix, INCREMENTAL_REVISIT_ENABLED=True)
    assert [len(site.requests_for(path)) for path in SITEMAPS] == [1, 0, 0]
    assert {site.url(path) for path in page_gets(site)} == set(withheld)
    assert leftover_keys(cluster_prefix) == []


async def sitemaps_saved(state_uri: str, site) -> set[str]:
    """The site's sitemaps whose state (fingerprint) is stored."""
    store = open_store(Settings({"INCREMENTAL_STATE_URI": state_uri}))
    try:
        pages = await deferred_from_coro(
            store.get_pages([PageKey("sitemap", site.url(path)) for path in SITEMAPS]))
    finally:
        await deferred_from_coro(store.close())
    return {path for path in SITEMAPS
            if (state := pages.get(PageKey("sitemap", site.url(path)))) and state.fingerprint}


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_workers_with_items_only_in_feeds_exit_by_themselves(
    site, state_uri, cluster_prefix, tmp_path
):
    # Items only in feeds: page state is committed when the feeds close, at
    # the very end. Processed requests waiting for that must not count as
    # work in progress, or no worker ever sees the cluster quiet.
    n = 30
    site.add_pages(n, size=1000)
    site.slow("/p/", 0.05)
    workers = [Worker(site, state_uri, cluster_prefix, tmp_path, str(i),
                      "-s", "INCREMENTAL_STORE_ITEMS=False") for i in range(2)]
    for worker in workers:
        assert await worker.wait(30) == 0, worker.tail()
    gets = page_gets(site)
    assert len(gets) == n and max(gets.values()) == 1
    urls = [site.url(f"/p/{i:04d}") for i in range(n)]
    assert sorted(url for w in workers for url in w.urls()) == sorted(urls)
    with_validators, _ = await stored_state(state_uri, urls)
    assert with_validators == set(urls)
    assert leftover_keys(cluster_prefix) == []


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_killed_worker_with_items_only_in_feeds_loses_nothing(
    site, state_uri, cluster_prefix, tmp_path
):
    # Its feed dies with it and it committed nothing: every request it
    # took, processed or not, goes back to the queue for the survivor.
    n = 40
    site.add_pages(n, size=1000)
    site.slow("/p/", 0.05)
    feeds_only = ("-s", "INCREMENTAL_STORE_ITEMS=False")
    victim, survivor = (Worker(site, state_uri, cluster_prefix, tmp_path, name, *feeds_only,
                               "-s", "INCREMENTAL_CLUSTER_WORKER_TTL=2")
                        for name in ("victim", "survivor"))
    await until(lambda: sum(page_gets(site).values()) >= 20, "the crawl to get going")
    # The victim dies with requests on the wire (however late it started).
    await until_all_have_work(site, 2)
    os.kill(victim.proc.pid, signal.SIGKILL)
    await deferToThread(victim.proc.wait)
    site.release()
    assert await survivor.wait(30) == 0, survivor.tail()
    urls = [site.url(f"/p/{i:04d}") for i in range(n)]
    assert sorted(survivor.urls()) == sorted(urls)
    # Only what the victim held when it died is fetched twice.
    requeued = re.search(r"(\d+) of their requests went back to the queue", survivor.text())
    assert requeued, survivor.tail()
    gets = page_gets(site)
    twice = [path for path, count in gets.items() if count > 1]
    assert len(gets) == n and max(gets.values()) <= 2
    assert len(twice) <= int(requeued.group(1)), twice
    # Committed when the survivor's feed closed.
    with_validators, _ = await stored_state(state_uri, urls)
    assert with_validators == set(urls)
    assert leftover_keys(cluster_prefix) == []


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_a_worker_stopped_with_sigint_hands_back_only_what_it_did_not_finish(
    site, state_uri, cluster_prefix, tmp_path
):
    # A graceful stop lets the requests on the wire finish: their pages are
    # committed before the worker leaves, so none is fetched again.
    n = 60
    site.add_pages(n, size=1000)
    site.slow("/p/", 0.15)
    stopped, other = (Worker(site, state_uri, cluster_prefix, tmp_path, name)
                      for name in ("stopped", "other"))
    await until(lambda: sum(page_gets(site).values()) >= 16, "the crawl to get going")
    # Stopped with requests on the wire (however late it started); they are
    # answered after the signal.
    await until_all_have_work(site, 2)
    os.kill(stopped.proc.pid, signal.SIGINT)
    site.release()
    await stopped.wait()
    assert await other.wait() == 0, other.tail()
    assert "left run" in stopped.text() and "(shutdown)" in stopped.text(), stopped.tail()
    gets = page_gets(site)
    assert len(gets) == n
    assert max(gets.values()) == 1, [p for p, c in gets.items() if c > 1]
    urls = [site.url(f"/p/{i:04d}") for i in range(n)]
    with_validators, with_items = await stored_state(state_uri, urls)
    assert with_validators == set(urls) and with_items == set(urls)
    assert leftover_keys(cluster_prefix) == []


@pytest_twisted.ensureDeferred
async def test_a_redis_error_does_not_stop_the_heartbeat(cluster_prefix):
    # A worker whose heartbeat stopped for good on one Redis error would be
    # taken for dead by the others while it works: its requests fetched
    # twice, the run ended under it.
    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from incremental_crawler.cluster.coordinator import ClusterCoordinator

    crawler = get_crawler(Spider, {
        **DEFAULT_SETTINGS,
        "INCREMENTAL_CLUSTER_URL": REDIS_URL, "INCREMENTAL_CLUSTER_PREFIX": cluster_prefix,
        "INCREMENTAL_CLUSTER_HEARTBEAT": 0.05, "INCREMENTAL_CLUSTER_WORKER_TTL": 1,
    })
    spider = Spider("blip")
    spider.crawler, spider.settings = crawler, crawler.settings
    crawler.engine = SimpleNamespace(_slot=None)  # nothing in progress
    coordinator = ClusterCoordinator.from_crawler(crawler)
    coordinator.join(spider)
    beat, calls = coordinator._beat, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise redis.ConnectionError("Redis went away")
        return beat(*args, **kwargs)

    coordinator._beat = flaky
    try:
        await deferLater(reactor, 0.5)
        assert coordinator._task.running
        assert len(calls) >= 4, calls
        assert crawler.stats.get_value("cluster/heartbeat_errors") == 1
        # Redis errors while idle: not quiet (the worker waits), no crash.
        calls.clear()
        coordinator._beat = lambda *a, **k: (_ for _ in ()).throw(redis.ConnectionError("down"))
        assert not coordinator.quiet()
    finally:
        coordinator._beat = beat
        coordinator.leave("finished")
    assert leftover_keys(cluster_prefix) == []


def test_a_run_starts_when_its_first_worker_joins(cluster_prefix, monkeypatch):
    # Next visits are counted from the crawl's start, and in cluster mode a
    # crawl is the run: a worker joining later (or whose clock is ahead)
    # must judge "due" exactly as the first one does.
    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from incremental_crawler import clock
    from incremental_crawler.cluster.coordinator import ClusterCoordinator
    from incremental_crawler.crawl.ledger import Ledger

    settings = {**DEFAULT_SETTINGS, "INCREMENTAL_CLUSTER_URL": REDIS_URL,
                "INCREMENTAL_CLUSTER_PREFIX": cluster_prefix}
    spider = Spider("starts")
    workers = []
    for started in (1_000.0, 5_000.0):
        monkeypatch.setattr(clock, "now", lambda started=started: started)
        crawler = get_crawler(Spider, settings)
        crawler.engine = SimpleNamespace(_slot=None)  # nothing in progress
        coordinator = ClusterCoordinator.from_crawler(crawler)
        coordinator.join(spider)
        workers.append(coordinator)
    try:
        first, second = workers
        assert first.run == second.run
        assert first.run_started == second.run_started == 1_000.0
        # The ledger reads its crawl's start from the run.
        ledger = SimpleNamespace(run_gate=second, _started=5_000.0)
        assert Ledger.crawl_started.fget(ledger) == 1_000.0
    finally:
        for coordinator in workers:
            coordinator.leave("finished")
    # The last worker out ends the run: its start goes with it.
    assert leftover_keys(cluster_prefix) == []


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_pages_listed_with_unmoved_dates_are_not_asked_whichever_worker_re_seeds(
    site, state_uri, cluster_prefix, tmp_path
):
    # Every page is due again and listed with an unmoved, trusted date (no
    # sample): none is asked, though the worker that re-seeds the run may
    # not be the one that read its lists. (Found by a review: without the
    # run's memberships, 2 runs in 5 asked all 40 pages.)
    n = 40
    revisits = await crawled_and_due_again(site, n, state_uri, cluster_prefix, sample_share=0)
    # The lists held until the three workers joined the run: a run that asks
    # no page may end before a slow-starting worker joins it, which then
    # starts a run of its own and decides every page again.
    site.hold("/sitemap_index.xml")
    workers = [Worker(site, state_uri, cluster_prefix, tmp_path, f"2-{i}", *revisits)
               for i in range(3)]
    coordination = redis.Redis.from_url(CLUSTER_REDIS_URI)
    try:
        await until(lambda: coordination.hlen(f"{cluster_prefix}:{{sitemap}}:workers") >= 3,
                    "the three workers to join the run", seconds=60)
    finally:
        coordination.close()
        site.release()
    for worker in workers:
        assert await worker.wait() == 0, worker.tail()
    assert sum(page_gets(site).values()) == 0
    # Each page decided once in the run: skipped by whoever read its list.
    skipped = [int(m.group(1)) if (m := re.search(
        r"'incremental/schedule/skipped/lastmod_unchanged': (\d+)", w.text())) else 0
        for w in workers]
    assert sum(skipped) == n, skipped
    assert leftover_keys(cluster_prefix) == []


def test_the_lists_one_worker_read_vouch_for_pages_another_re_seeds(cluster_prefix):
    # Lists are read by whichever worker pops them, and the run's due pages
    # re-seeded by one worker: a date vouches for a page there only while a
    # list of the run (not only of that worker) still gives it.
    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from incremental_crawler.cluster.coordinator import ClusterCoordinator
    from incremental_crawler.crawl.ledger import Ledger

    settings = {**DEFAULT_SETTINGS, "INCREMENTAL_CLUSTER_URL": REDIS_URL,
                "INCREMENTAL_CLUSTER_PREFIX": cluster_prefix}
    spider = Spider("lists")
    coordinators = []
    for _ in range(2):
        crawler = get_crawler(Spider, settings)
        crawler.engine = SimpleNamespace(_slot=None)  # nothing in progress
        coordinator = ClusterCoordinator.from_crawler(crawler)
        coordinator.join(spider)
        coordinators.append(coordinator)
    reader, reseeder = (SimpleNamespace(run_gate=c, listings=set()) for c in coordinators)
    page = PageState(PageKey("lists", "http://h/a"), listing="0123456789abcdef")
    try:
        Ledger.note_listing(reader, "0123456789abcdef")
        assert not Ledger.listed(reseeder, page)
        Ledger.gather_listings(reseeder)
        assert Ledger.listed(reseeder, page)
        assert not Ledger.listed(reseeder, page.copy(listing="fedcba9876543210"))
    finally:
        for coordinator in coordinators:
            coordinator.leave("finished")
    # The run's memberships end with it.
    assert leftover_keys(cluster_prefix) == []


@pytest_twisted.ensureDeferred
async def test_a_worker_whose_cluster_redis_dies_stops_loudly_by_itself(
    site, state_uri, state_db, tmp_path
):
    # The cluster's Redis (a throwaway server: the shared one stays up) is
    # stopped mid-crawl; the worker must neither hang nor finish as if
    # nothing happened, and nothing it did not store is recorded as done.
    n = 60
    site.add_pages(n, size=1000)
    site.slow("/p/", 0.05)
    own = OwnRedis()
    own.start()
    try:
        worker = Worker(site, state_uri, "own", tmp_path, "1",
                        "-s", f"INCREMENTAL_CLUSTER_URL={own.uri}",
                        "-s", "INCREMENTAL_CLUSTER_WORKER_TTL=2",
                        "-s", "INCREMENTAL_REDIS_RETRY_TIME=1")
        await until(lambda: sum(page_gets(site).values()) >= 15, "the crawl to get going")
        own.stop()
        # Not a success: supervisors and schedulers must see it failed.
        assert await worker.wait(timeout=30) == 1, worker.tail()
    finally:
        own.stop()
        own.remove()
    log = worker.log.read_text(errors="replace")
    assert "'finish_reason': 'cluster_redis_error'" in log, worker.tail()
    # Tried again for the bound (a WARNING), then one ERROR line saying so.
    assert "Redis does not answer" in log, worker.tail()
    errors = [line.split("ERROR: ", 1)[1] for line in log.splitlines() if "ERROR:" in line]
    assert len(errors) == 1, errors
    assert errors[0].startswith(
        f"Cluster {own.uri}: Redis has not answered for 1 s (INCREMENTAL_REDIS_RETRY_TIME): "
    ), errors
    assert errors[0].endswith("; stopping this worker"), errors
    # State is never ahead of data for what it stored; the sitemaps' state is not
    # saved (the run's failures could not be read), so the next run reads
    # them in full and requests what this one did not store.
    ahead = state_db(
        "SELECT p.url FROM pages p LEFT JOIN items i ON i.scope = p.scope AND i.item_key = p.url "
        "WHERE p.etag IS NOT NULL AND i.item_key IS NULL")
    assert ahead == []
    assert state_db("SELECT COUNT(*) FROM pages WHERE url LIKE '%sitemap%'")[0][0] == 0
    assert state_db("SELECT COUNT(*) FROM pages WHERE etag IS NOT NULL")[0][0] < n


@pytest_twisted.ensureDeferred
async def test_cluster_workers_go_on_across_a_restart_of_their_redis(site, tmp_path):
    # Queue, dupefilter, membership, in-flight requests and the state store
    # on one Redis (AOF on), shut down gracefully mid-crawl and started a
    # second later: both workers ride it out, every page is fetched once.
    n = 60
    site.add_pages(n, size=1000)
    site.slow("/p/", 0.05)
    own = OwnRedis("--appendonly", "yes")
    own.start()
    try:
        workers = [Worker(site, None, "own", tmp_path, str(i),
                          "-s", f"INCREMENTAL_CLUSTER_URL={own.uri}") for i in range(2)]
        # Both workers crawling before Redis goes away, however late one
        # started: one still starting then fails at once (its scheduler
        # cannot open), which is no restart ridden out.
        await until_all_have_work(site, 2)
        site.release()
        await until(lambda: sum(page_gets(site).values()) >= 15, "the crawl to get going")
        await deferToThread(own.shut_down)
        await deferLater(reactor, 1.0)
        await deferToThread(own.start)
        for worker in workers:
            assert await worker.wait(timeout=90) == 0, worker.tail()
    finally:
        own.remove()
    gets = page_gets(site)
    assert len(gets) == n
    assert max(gets.values()) == 1, [p for p, c in gets.items() if c > 1]
    emitted = sorted(url for worker in workers for url in worker.urls())
    assert emitted == sorted(site.url(f"/p/{i:04d}") for i in range(n))
    logs = [worker.text() for worker in workers]
    assert not [line for log in logs for line in log.splitlines() if "ERROR:" in line]
    assert any(f"Cluster {own.uri}: Redis does not answer" in log for log in logs), logs[0][-3000:]
    assert any(f"Cluster {own.uri}: Redis answers again after" in log for log in logs)


@pytest_twisted.ensureDeferred
async def test_state_items_and_report_given_the_cluster_url_read_the_store_the_crawl_wrote(
    site, tmp_path
):
    # Only INCREMENTAL_CLUSTER_URL names the store (the cluster's Redis, a
    # throwaway server: its default prefix is the test's alone). The
    # commands given the same setting read what the crawl stored there, not
    # the project's local SQLite default.
    site.add_pages(3, size=1000)
    urls = sorted(site.url(f"/p/{i:04d}") for i in range(3))
    own = OwnRedis()
    own.start()
    try:
        worker = Worker(site, None, "own", tmp_path, "1",
                        "-s", f"INCREMENTAL_CLUSTER_URL={own.uri}")
        assert await worker.wait() == 0, worker.tail()
        assert sorted(worker.urls()) == urls
        cluster = ("-s", f"INCREMENTAL_CLUSTER_URL={own.uri}")
        state = await deferToThread(scrapy_in_process, "state", "--spider", "sitemap",
                                    "--hosts", *cluster)
        items = await deferToThread(scrapy_in_process, "items", "-o", "-", *cluster)
        report = await deferToThread(scrapy_in_process, "report", "--scope", "sitemap",
                                     "-o", str(tmp_path / "report"), *cluster)
    finally:
        own.remove()
    assert state.returncode == 0, state.stderr
    assert "scope sitemap" in state.stdout
    assert re.search(r"^  127\.0\.0\.1\s+\d+", state.stdout, re.MULTILINE), state.stdout
    assert items.returncode == 0, items.stderr
    assert sorted(json.loads(line)["url"] for line in items.stdout.splitlines()) == urls
    assert report.returncode == 0, report.stderr
    history = json.loads((tmp_path / "report" / "history-sitemap.json").read_text())
    assert own.socket in history["store"]
    assert [entry["figures"]["pages_new"] for entry in history["history"]] == [3]

