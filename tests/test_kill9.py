"""State is never ahead of data, under kill -9: no validator is ever stored ahead of its data.

A real ``scrapy crawl`` process is killed with SIGKILL at several points of
a crawl; after each kill the state file must hold, for every page that has
validators, the item extracted from it. Then pages change and a crawl runs
to the end: every page's latest content must be in the store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

PROJECT = Path(__file__).resolve().parents[1]
N_PAGES = 150


def start_crawl(site, state_uri: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "scrapy", "crawl", "sitemap", *extra,
            "-a", f"sitemap_url={site.url('/robots.txt')}",
            "-s", f"INCREMENTAL_STATE_URI={state_uri}",
            # Small batches and a short interval: many commits, so a kill
            # lands between them as well as inside one.
            "-s", "INCREMENTAL_BATCH_SIZE=3",
            "-s", "INCREMENTAL_FLUSH_INTERVAL=0.02",
            "-s", "CONCURRENT_REQUESTS=4",
            # Politeness is tested elsewhere; here the crawl should be quick.
            "-s", "INCREMENTAL_THROTTLE_ENABLED=False",
            "-s", "LOG_LEVEL=WARNING",
        ],
        cwd=PROJECT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


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

    proc = start_crawl(site, state_uri)
    _, stderr = await deferToThread(proc.communicate)
    assert proc.returncode == 0, stderr.decode()

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
