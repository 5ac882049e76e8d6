"""State is never ahead of data, under kill -9: no validator is ever stored ahead of its data.

A real ``scrapy crawl`` process is killed with SIGKILL at several points of
a crawl; after each kill the state file must hold, for every page that has
validators, the item extracted from it. Then pages change and a crawl runs
to the end: every page's latest content must be in the store.

Nor is a page's state ever ahead of its outlinks: a link-following spider,
killed the same way, must leave every page it stored with the links record
its flags promise, so that a 304 later yields the links behind it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from incremental_crawler.fatal import exit_status
from incremental_crawler.recipes import load_links
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from incremental_crawler.state.records import PageFlags
from tests.conftest import run_crawl
from tests.follow_spider import FollowSpider
from tests.links import nav_depths, nav_links
from tests.scrapy_cli import start_scrapy

if TYPE_CHECKING:
    import subprocess

    from scrapy import Spider
    from scrapy.crawler import Crawler

N_PAGES = 150


def scrapy_crawl(state_uri: str, *args: str, wrapper: tuple[str, ...] = (),
                 log_level: str = "WARNING", batch_size: int = 3) -> subprocess.Popen[bytes]:
    """``scrapy crawl <args>`` in a process of its own, run from the repository root."""
    return start_scrapy(
        "crawl", *args,
        "-s", f"INCREMENTAL_STATE_URI={state_uri}",
        # Small batches and a short interval: many commits, so a kill
        # lands between them as well as inside one.
        "-s", f"INCREMENTAL_BATCH_SIZE={batch_size}",
        "-s", "INCREMENTAL_FLUSH_INTERVAL=0.02",
        "-s", "CONCURRENT_REQUESTS=4",
        # Politeness is tested elsewhere; here the crawl should be quick.
        "-s", "INCREMENTAL_THROTTLE_ENABLED=False",
        "-s", f"LOG_LEVEL={log_level}",
        wrapper=wrapper,
    )


async def crawl_here(state_uri: str, spidercls: type[Spider],
                     settings: dict[str, Any] | None = None, **spider_kwargs: str) -> Crawler:
    """A crawl with :func:`scrapy_crawl`'s settings (and the project's
    default revisits), run to its end in this process: a crawl after the
    killed ones need not be a process of its own, and this spares the
    second of CPU each start-up of a Python process with Scrapy costs.

    It must end as the process would with exit status 0
    (:func:`~incremental_crawler.fatal.exit_status`: no store error, at the
    last commit included), and by running out of work."""
    crawler = await run_crawl(state_uri, spidercls, {
        "INCREMENTAL_BATCH_SIZE": 3, "INCREMENTAL_FLUSH_INTERVAL": 0.02,
        "CONCURRENT_REQUESTS": 4, "INCREMENTAL_REVISIT_ENABLED": True,
        "LOG_LEVEL": "WARNING", **(settings or {}),
    }, **spider_kwargs)
    assert exit_status(crawler) == 0, crawler.stats.get_stats()
    assert crawler.stats.get_value("finish_reason") == "finished", crawler.stats.get_stats()
    return crawler


def start_crawl(site, state_uri: str, *extra: str) -> subprocess.Popen[bytes]:
    return scrapy_crawl(state_uri, "sitemap", *extra,
                        "-a", f"sitemap_url={site.url('/robots.txt')}")


async def kill_after(site, proc: subprocess.Popen[bytes], page_requests: int) -> None:
    # Bounded: at most 12,000 polls of 5 ms (a minute) for the crawl to get there.
    for _ in range(12_000):
        if sum(1 for r in site.log if r.path.startswith("/p/")) >= page_requests:
            break
        assert proc.poll() is None, proc.stderr.read().decode()
        await deferLater(reactor, 0.005)
    else:
        pytest.fail("the crawl made no progress")
    os.kill(proc.pid, signal.SIGKILL)
    await deferToThread(proc.communicate)  # reaps it and closes the pipe


def assert_no_validator_ahead_of_data(state_db) -> int:
    ahead = state_db(
        "SELECT p.url FROM pages p LEFT JOIN items i "
        "ON i.scope = p.scope AND i.item_key = p.url "
        "LEFT JOIN item_versions v ON v.scope = i.scope "
        "AND v.item_key = i.item_key AND v.version = i.version "
        "WHERE (p.etag IS NOT NULL OR p.last_modified IS NOT NULL) "
        "AND v.data IS NULL"
    )
    assert ahead == [], f"validators stored without their data: {ahead[:5]}"
    return state_db("SELECT COUNT(*) FROM pages WHERE etag IS NOT NULL "
                    "OR last_modified IS NOT NULL")[0][0]


@pytest_twisted.ensureDeferred
async def test_kill_9_never_leaves_validators_ahead_of_data(site, state_uri, state_db):
    for i in range(N_PAGES):
        site.add_page(f"/p/{i:04d}", ("strong", "weak", "lastmod")[i % 3], size=1500)

    stored_after_kill = []
    for kill_at in (15, 60, 110):
        proc = start_crawl(site, state_uri)
        await kill_after(site, proc, kill_at)
        assert proc.returncode == -signal.SIGKILL
        stored_after_kill.append(assert_no_validator_ahead_of_data(state_db))
        changed = site.change_fraction(0.1, seed=kill_at)
        assert changed
    # The kills really landed mid-crawl: some state was committed, not all.
    assert min(stored_after_kill) > 0 and max(stored_after_kill) < N_PAGES

    await crawl_here(state_uri, SitemapPagesSpider, sitemap_url=site.url("/robots.txt"))

    # Every page's latest content is in the store.
    rows = dict(state_db(
        "SELECT i.item_key, v.data FROM items i JOIN item_versions v "
        "ON v.scope = i.scope AND v.item_key = i.item_key AND v.version = i.version"))
    for page in site.pages:
        data = rows.get(site.url(page.path))
        assert data is not None, page.path
        assert json.loads(data)["title"].endswith(f"v{page.version}"), page.path
    assert assert_no_validator_ahead_of_data(state_db) == N_PAGES


@pytest_twisted.ensureDeferred
async def test_kill_9_with_items_only_in_a_feed_loses_no_change(
    site, state_uri, state_db, tmp_path,
):
    # With INCREMENTAL_STORE_ITEMS=False the data lives only in the feed,
    # which Scrapy buffers and finishes at the end: no page state may be on
    # disk before the feed is closed.
    for i in range(N_PAGES):
        site.add_page(f"/p/{i:04d}", "strong", size=1500)
    feed = tmp_path / "items.jsonl"
    proc = start_crawl(site, state_uri, "-O", str(feed), "-s", "INCREMENTAL_STORE_ITEMS=False")
    await kill_after(site, proc, 100)
    in_feed = set()
    if feed.exists():
        in_feed = {json.loads(line)["url"] for line in feed.read_text().splitlines()
                   if line.strip().endswith("}")}
    committed = set()
    if (tmp_path / "state.db").exists():
        committed = {url for (url,) in state_db("SELECT url FROM pages WHERE etag IS NOT NULL")}
    assert committed <= in_feed


# -- a page's state is never ahead of its outlinks --------------------------------


def start_follow_crawl(site, state_uri: str, *extra: str,
                       **options: Any) -> subprocess.Popen[bytes]:
    """A plain ``scrapy.Spider`` following the site's ``<nav>`` links from ``/p/0000``."""
    return scrapy_crawl(state_uri, "follow", "-a", f"start_url={site.url('/p/0000')}",
                        "-s", "SPIDER_MODULES=tests.follow_spider", *extra, **options)


def assert_no_state_ahead_of_links(site, state_db) -> int:
    """Every page stored with validators has the links record its flags
    promise, listing the page's outlinks; returns how many pages that is."""
    rows = state_db(
        "SELECT p.url, p.flags, l.data FROM pages p LEFT JOIN links l "
        "ON l.scope = p.scope AND l.url = p.url AND l.variant = p.variant "
        "WHERE p.etag IS NOT NULL OR p.last_modified IS NOT NULL")
    # HAS_LINKS without the record: the state was committed ahead of it.
    ahead = [url for url, flags, data in rows if flags & PageFlags.HAS_LINKS and data is None]
    assert ahead == [], f"states stored without their links record: {ahead[:5]}"
    # Every page of the site links on, so each one stored must say so: a page
    # flagged LINKS_KNOWN without HAS_LINKS would replay nothing on a 304,
    # and the pages behind it would be lost to the crawl.
    wanted = PageFlags.LINKS_KNOWN | PageFlags.HAS_LINKS
    flagged = [(url, flags) for url, flags, _ in rows
               if flags & (wanted | PageFlags.LINKS_INCOMPLETE) != wanted]
    assert flagged == [], f"pages whose flags do not promise their links: {flagged[:5]}"
    # And the record is the page's own outlinks, not another page's or a part.
    wrong = [url for url, _, data in rows
             if sorted(r["u"] for r in load_links(data) or [])
             != sorted(site.url(p) for p in nav_links(site, url.removeprefix(site.base_url)))]
    assert wrong == [], f"links records not listing their page's links: {wrong[:5]}"
    return len(rows)


def logged_stat(log: str, name: str) -> int:
    """A counter from the stats Scrapy dumps at the end of a crawl (0: absent)."""
    assert "Dumping Scrapy stats" in log
    found = re.search(rf"'{re.escape(name)}': (\d+)", log)
    return int(found.group(1)) if found else 0


@pytest_twisted.ensureDeferred
async def test_kill_9_never_leaves_a_pages_state_ahead_of_its_links(
    site, state_uri, state_db, tmp_path,
):
    for i in range(N_PAGES):
        site.add_page(f"/p/{i:04d}", ("strong", "weak", "lastmod")[i % 3], size=1500)
    depths = nav_depths(site, "/p/0000")
    assert len(depths) == N_PAGES  # the first page leads to every page

    # The ledger stages a page's links record just before its state, in the
    # same turn of the reactor, so one flush commits both. Were the record
    # staged after the state with a flush possible between, a kill there
    # would leave a state flagged HAS_LINKS without its record (the first
    # check of assert_no_state_ahead_of_links).
    stored_after_kill = []
    # A page stages three writes (its item, its links, its state): with
    # batches of 3 the flushes could fall at the same place among them in
    # every page, and batches of 2 and 4 move that place.
    for kill_at, batch_size in ((15, 3), (45, 2), (75, 4), (110, 3)):
        proc = start_follow_crawl(site, state_uri, batch_size=batch_size)
        await kill_after(site, proc, kill_at)
        assert proc.returncode == -signal.SIGKILL
        assert_no_validator_ahead_of_data(state_db)
        stored_after_kill.append(assert_no_state_ahead_of_links(site, state_db))
    # The kills really landed mid-crawl: some state was committed, not all.
    assert min(stored_after_kill) > 0 and max(stored_after_kill) < N_PAGES

    # A crawl to the end, at once: the pages stored so far are not due (a
    # day is the first interval), so only their stored links lead on to the
    # pages behind them; every page must be reached and stored.
    await crawl_here(state_uri, FollowSpider, start_url=site.url("/p/0000"))
    assert assert_no_state_ahead_of_links(site, state_db) == N_PAGES

    changed = min(path for path, depth in depths.items() if depth == 2)
    site.change(changed)
    site.reset_log()
    # Two days later every page is due: faketime moves the crawl's clock.
    # Without faketime (CI may not have it), INCREMENTAL_REVISIT_ENABLED=False
    # makes every page due the same way. No sampled full fetch (RECHECK_EVERY
    # 0): each unchanged page must answer 304.
    wrapper: tuple[str, ...] = ("faketime", "-f", "+2d") if shutil.which("faketime") else ()
    later = () if wrapper else ("-s", "INCREMENTAL_REVISIT_ENABLED=False")
    feed = tmp_path / "items.jsonl"
    proc = start_follow_crawl(site, state_uri, *later, "-O", str(feed),
                              "-s", "INCREMENTAL_RECHECK_EVERY=0",
                              wrapper=wrapper, log_level="INFO")
    _, stderr = await deferToThread(proc.communicate)
    log = stderr.decode()
    assert proc.returncode == 0, log

    # The change two links deep is found, behind pages that answered 304;
    # no unchanged page is emitted.
    items = [json.loads(line) for line in feed.read_text().splitlines()]
    assert [(item["url"], item["title"]) for item in items] == [
        (site.url(changed), f"{site.page(changed).title} v1")]
    # Each page asked once, conditionally; a 304 costs no body.
    asked: dict[str, list[tuple[int, bool, bool]]] = {}
    for r in site.log:
        if r.path.startswith("/p/"):
            conditional = r.if_none_match is not None or r.if_modified_since is not None
            asked.setdefault(r.path, []).append((r.status, r.body_bytes > 0, conditional))
    assert asked == {path: [(200, True, True) if path == changed else (304, False, True)]
                     for path in depths}
    assert logged_stat(log, "incremental/replay/pages") == N_PAGES - 1
    assert logged_stat(log, "incremental/replay/record_missing") == 0
    assert logged_stat(log, "incremental/requests/links_unknown") == 0
