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

from tests.redis_util import CLUSTER_REDIS_URI
from tests.scrapy_cli import start_scrapy

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["Worker", "leftover_keys", "page_gets"]


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
                "-s", f"INCREMENTAL_CLUSTER_URL={CLUSTER_REDIS_URI}",
                "-s", f"INCREMENTAL_CLUSTER_PREFIX={prefix}",
                # None: the store a cluster crawl picks by itself.
                *(("-s", f"INCREMENTAL_STATE_URI={state_uri}") if state_uri is not None else ()),
                "-s", "INCREMENTAL_CLUSTER_HEARTBEAT=0.2",
                "-s", "INCREMENTAL_CLUSTER_IDLE_GRACE=0.6",
                # Long enough that a worker starved of CPU on a busy machine
                # is not taken for dead; the kill test shortens it.
                "-s", "INCREMENTAL_CLUSTER_WORKER_TTL=10",
                "-s", "INCREMENTAL_FLUSH_INTERVAL=0.2",
                "-s", "CONCURRENT_REQUESTS=4",
                "-s", "INCREMENTAL_THROTTLE_ENABLED=False",
                "-s", "INCREMENTAL_REVISIT_ENABLED=False",
                "-s", "LOG_LEVEL=INFO",
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
