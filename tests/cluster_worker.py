"""A cluster worker: one real ``scrapy crawl`` process with ``INCREMENTAL_CLUSTER_URL``.

Workers are separate processes started with the same command line, as an
operator starts them on several machines; what they share goes through
Redis only. The test site counts what it served.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from typing import TYPE_CHECKING

import pytest
import redis
from twisted.internet.threads import deferToThread

from incremental_crawler.fatal import exit_status
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from tests.conftest import run_crawl
from tests.redis_util import CLUSTER_REDIS_URI
from tests.scrapy_cli import start_scrapy

if TYPE_CHECKING:
    from pathlib import Path

    from scrapy import Spider
    from scrapy.crawler import Crawler

__all__ = ["Worker", "crawl_in_process", "leftover_keys", "page_gets", "worker_settings"]


def worker_settings(state_uri: str | None, prefix: str) -> dict[str, object]:
    """The settings every test worker crawls with (:class:`Worker`'s ``-s``
    options, :func:`crawl_in_process`'s settings): cluster *prefix* on the
    cluster tests' Redis, the store *state_uri* (None: the one a cluster
    crawl picks by itself)."""
    return {
        "INCREMENTAL_CLUSTER_URL": CLUSTER_REDIS_URI,
        "INCREMENTAL_CLUSTER_PREFIX": prefix,
        **({"INCREMENTAL_STATE_URI": state_uri} if state_uri is not None else {}),
        "INCREMENTAL_CLUSTER_HEARTBEAT": 0.2,
        "INCREMENTAL_CLUSTER_IDLE_GRACE": 0.6,
        # Long enough that a worker starved of CPU on a busy machine is not
        # taken for dead; the kill tests shorten it.
        "INCREMENTAL_CLUSTER_WORKER_TTL": 10,
        "INCREMENTAL_FLUSH_INTERVAL": 0.2,
        "CONCURRENT_REQUESTS": 4,
        "INCREMENTAL_THROTTLE_ENABLED": False,
        "INCREMENTAL_REVISIT_ENABLED": False,
        "LOG_LEVEL": "INFO",
    }


async def crawl_in_process(site, state_uri: str, prefix: str, *,
                           spider: tuple[type[Spider], dict[str, str]] | None = None,
                           **overrides: object) -> Crawler:
    """A run of one worker, as :class:`Worker` runs it (the same settings,
    *overrides* over them; the sitemap spider of *site*, or *spider*: its
    class and arguments), crawled in this process: for a run whose worker
    need not be a process of its own (no kill, no signal), without the
    second of CPU each start-up of a Python process with Scrapy costs. The
    finished crawler, what it emitted in ``crawler.collected``.

    The run must end as a worker process must for its exit status to be 0
    (:func:`~incremental_crawler.fatal.exit_status`, what the project's
    ``crawl`` command exits with): no fatal finish reason (fenced, the
    cluster's or the store's Redis lost), no store error at the last
    commit. A crawl that cannot start raises here."""
    spidercls, kwargs = spider or (SitemapPagesSpider, {"sitemap_url": site.url("/robots.txt")})
    crawler = await run_crawl(state_uri, spidercls,
                              {**worker_settings(state_uri, prefix), **overrides}, **kwargs)
    assert exit_status(crawler) == 0, crawler.stats.get_stats()
    return crawler


class Worker:
    """One ``scrapy crawl`` process in cluster mode (the sitemap spider by
    default), its feed and its log.

    Its cluster is *prefix* on the cluster tests' Redis unless *extra* sets
    another ``INCREMENTAL_CLUSTER_URL``; *extra* (more ``-s`` options) comes
    after the defaults, and wins.
    """

    def __init__(self, site, state_uri: str | None, prefix: str, tmp_path: Path, name: str,
                 *extra: str, spider: tuple[str, ...] = ()) -> None:
        self.feed = tmp_path / f"items-{name}.jsonl"
        self.log = tmp_path / f"worker-{name}.log"
        #: The spider and its arguments (the project's sitemap spider by default).
        self.spider = spider or ("sitemap", "-a", f"sitemap_url={site.url('/robots.txt')}")
        with self.log.open("wb") as log:  # the child keeps its own descriptor
            self.proc = start_scrapy(
                "crawl", *self.spider,
                "-O", str(self.feed),
                *(arg for name, value in worker_settings(state_uri, prefix).items()
                  for arg in ("-s", f"{name}={value}")),
                *extra,
                stderr=log,
            )

    async def wait(self, timeout: float = 60) -> int:
        try:
            return await deferToThread(self.proc.wait, timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            await deferToThread(self.proc.wait)
            pytest.fail(f"worker did not exit by itself within {timeout} s:\n{self.tail()}")

    def urls(self) -> list[str]:
        if not self.feed.exists():
            return []
        return [json.loads(line)["url"] for line in self.feed.read_text().splitlines()
                if line.strip()]

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self) -> str:
        """The end of the log, for a failure's message (search :meth:`text`)."""
        return self.text()[-3000:]


def abandoned_mark(client: redis.Redis, key: bytes) -> bool:
    """Whether *key* is the mark of an abandoned run (``<run>:abandoned``,
    set by join.lua for a day), which expires by itself."""
    return key.endswith(b":abandoned") and 0 < client.ttl(key) <= 86400


def leftover_keys(prefix: str) -> list[bytes]:
    """The keys under *prefix* in the cluster tests' Redis (a run ended by
    its last worker leaves none), but for the marks of abandoned runs."""
    client = redis.Redis.from_url(CLUSTER_REDIS_URI)
    try:
        return sorted(key for key in client.scan_iter(f"{prefix}:*", count=1000)
                      if not abandoned_mark(client, key))
    finally:
        client.close()


def page_gets(site) -> Counter[str]:
    """GETs of the site's pages (``/p/...``), per path."""
    return Counter(r.path for r in site.log if r.path.startswith("/p/") and r.method == "GET")
