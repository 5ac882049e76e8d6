"""The feed a user reads is never behind the store: at-least-once delivery.

A crawl stopped before its feeds and pipelines closed (a second SIGTERM, a
``kill -9``) leaves item versions in the store that its ``-O`` file and a
user's batching pipeline never got; the next crawl emits them again,
marked ``redelivered``, through both. Real ``scrapy crawl`` processes
against the loopback site, whose held pages stop the crawl at a known
point; SQLite and Redis stores.
"""

from __future__ import annotations

import json
import os
import signal
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
from scrapy.utils.defer import deferred_from_coro
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from tests.test_kill9 import crawl_here as kill9_crawl_here
from tests.test_kill9 import scrapy_crawl

if TYPE_CHECKING:
    from pathlib import Path

N_PAGES = 40
PIPELINE = '{"tests.delivery_pipeline.BufferedIndexPipeline": 500}'


def crawl(site, state_uri: str, run: Path, name: str) -> Any:
    """The sitemap spider with an ``-O`` feed and the batching pipeline, logging to a file."""
    return scrapy_crawl(
        state_uri, "sitemap", "-a", f"sitemap_url={site.url('/robots.txt')}",
        "-O", str(run / f"{name}.jsonl"),
        "-s", f"ITEM_PIPELINES={PIPELINE}", "-s", f"TEST_INDEX_FILE={run / f'{name}.index'}",
        "-s", f"LOG_FILE={run / f'{name}.log'}", log_level="INFO")


async def crawl_here(site, state_uri: str, run: Path, name: str) -> None:
    """The same crawl as :func:`crawl` (its feed, its pipeline), in this
    process and to its end: a crawl after the stopped one need not be a
    process of its own (it is neither signalled nor killed)."""
    await kill9_crawl_here(state_uri, SitemapPagesSpider, {
        # ``-O``: the feed overwritten, its format from the extension.
        "FEEDS": {str(run / f"{name}.jsonl"): {"format": "jsonlines", "overwrite": True}},
        "ITEM_PIPELINES": json.loads(PIPELINE), "TEST_INDEX_FILE": str(run / f"{name}.index"),
        "LOG_LEVEL": "INFO",
    }, sitemap_url=site.url("/robots.txt"))


def records(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of *path* (a killed crawl may leave half a line)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


async def until(condition, what: str, proc, state=lambda: "") -> None:
    # Bounded: 12,000 polls of 5 ms (a minute).
    for _ in range(12_000):
        if condition():
            return
        assert proc.poll() is None, f"the crawl ended before {what}"
        await deferLater(reactor, 0.005)
    pytest.fail(f"timed out waiting until {what} {state()}")


def stored(store, scope: str) -> dict[str, str]:
    """Item key → fingerprint of every live item in the store."""
    return {item["url"]: item["fingerprint"] for item in store.iter_items(scope)}


async def stop(proc, how: str, log: Path) -> None:
    if how == "kill -9":
        os.kill(proc.pid, signal.SIGKILL)
    else:
        # A forced stop: the first SIGTERM starts a graceful shutdown that
        # waits for the held answers; the second stops the reactor at once.
        os.kill(proc.pid, signal.SIGTERM)
        await until(lambda: "shutting down gracefully" in log.read_text(),
                    "the first SIGTERM was taken", proc)
        os.kill(proc.pid, signal.SIGTERM)
    await deferToThread(proc.communicate)


@pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)
@pytest.mark.parametrize("how", ["second SIGTERM", "kill -9"])
@pytest_twisted.ensureDeferred
async def test_what_a_stopped_crawl_stored_reaches_its_feed_and_pipeline_next_crawl(
    site, state_uri, state_store, tmp_path, how,
):
    for i in range(N_PAGES):
        site.add_page(f"/p/{i:04d}", "strong", size=400)
    # One page is held: the crawl does every other one, then waits for it.
    site.hold("/p/0000")

    def answered() -> int:
        return sum(1 for r in site.log if r.path.startswith("/p/"))

    proc = crawl(site, state_uri, tmp_path, "first")
    log = tmp_path / "first.log"
    try:
        # Every other page answered, and its item committed.
        await until(lambda: site.held == 1 and answered() == N_PAGES - 1
                    and len(list(state_store.iter_items())) == answered(),
                    "the answered pages were stored", proc,
                    lambda: (f"(held {site.held}, answered {answered()}, stored "
                             f"{len(list(state_store.iter_items()))})"))
        await stop(proc, how, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    [scope] = state_store.scopes()
    kept = stored(state_store, scope)
    assert len(kept) == N_PAGES - 1

    first_feed = {r["url"]: r for r in records(tmp_path / "first.jsonl")}
    first_index = records(tmp_path / "first.index")
    assert first_index == []  # the pipeline's batch died with the crawl

    site.release()
    await crawl_here(site, state_uri, tmp_path, "second")

    second_feed = records(tmp_path / "second.jsonl")
    second_index = records(tmp_path / "second.index")
    # What the first crawl stored, each version as stored, is in a feed:
    # those its -O file missed come in the second crawl's, marked.
    redelivered = {r["url"]: r for r in second_feed if r.get("redelivered") is True}
    for url, fingerprint in kept.items():
        if url not in first_feed:
            assert url in redelivered, f"{url} stored, in no -O file"
        got = redelivered.get(url) or first_feed[url]
        assert got["fingerprint"] == fingerprint
        assert got["change"] == "new"
    # The pipeline that batched its writes gets each of them now.
    indexed = {r["url"]: r for r in second_index if r.get("redelivered") is True}
    assert {url: r["fingerprint"] for url, r in indexed.items()} == kept
    # Repeats only of what the first crawl stored, once each; the other
    # pages are new items of this crawl, not marked.
    assert len([r for r in second_feed if r.get("redelivered")]) == len(kept)
    fresh = {r["url"] for r in second_feed if "redelivered" not in r}
    assert fresh == {site.url(p.path) for p in site.pages} - kept.keys()

    # Delivered now: a third crawl emits nothing again.
    assert await deferred_from_coro(state_store.undelivered_crawls(scope)) == []
    await crawl_here(site, state_uri, tmp_path, "third")
    assert [r for r in records(tmp_path / "third.jsonl") if r.get("redelivered")] == []
    assert records(tmp_path / "third.index") == []
