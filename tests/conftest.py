"""Fixtures: the loopback test site, a state store per test, real crawls."""

from __future__ import annotations

import fcntl
import sqlite3
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
from scrapy import signals
from scrapy.crawler import CrawlerRunner
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro

from incremental_crawler.state.stores import open_store
from tests import bytecode_cache

# The session's Redis Cluster (three loopback primaries), for the tests that ask.
from tests.redis_cluster_util import redis_cluster  # noqa: F401
from tests.redis_util import (
    CLUSTER_REDIS_URI,
    REDIS_URI,
    delete_budget_prefix,
    delete_prefix,
    new_prefix,
)
from tests.site import LoopbackSite

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

ADDON = "incremental_crawler.addon.IncrementalAddon"


class _RunAlone:
    """Under pytest-xdist, the tests marked ``alone`` run while no other test does.

    Those tests assert what a server saw of the crawlers' timing (the gaps
    between requests, a promise kept within 5 ms of a 429): a second test
    process starting crawlers beside them on a 2-core machine delays
    requests enough to break them. Every other test holds a shared lock on a
    file of the run, a marked one an exclusive lock, kept over a run of
    marked tests in a row (a module of them waits once for the other
    process's test to end, not once per test); a turnstile lock keeps new
    shared holders out while a marked test waits. Without xdist nothing runs
    beside anyway.
    """

    def __init__(self, run: str) -> None:
        base = Path(tempfile.gettempdir()) / f"incremental-tests-{run}"
        self.paths = [Path(f"{base}-turnstile.lock"), Path(f"{base}-running.lock")]
        # Opened once per process: a process that has finished may remove the
        # files while the other one still holds them open.
        self.turnstile, self.running = (path.open("a") for path in self.paths)
        self.exclusive = False

    def before(self, alone: bool) -> None:
        if alone:
            if not self.exclusive:
                fcntl.flock(self.turnstile, fcntl.LOCK_EX)
                fcntl.flock(self.running, fcntl.LOCK_EX)
                self.exclusive = True
            return
        fcntl.flock(self.turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.running, fcntl.LOCK_SH)
        finally:
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)

    def after(self, alone: bool, next_alone: bool) -> None:
        if alone and next_alone:
            return
        fcntl.flock(self.running, fcntl.LOCK_UN)
        if self.exclusive:
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)
            self.exclusive = False

    def close(self) -> None:
        for lock in (self.turnstile, self.running):
            lock.close()  # which releases its lock
        for path in self.paths:
            path.unlink(missing_ok=True)


_run_alone: _RunAlone | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _run_alone  # one per test process
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        _run_alone = _RunAlone(workerinput["testrunuid"])
    elif config.getoption("numprocesses", None):
        # The controller of an xdist run, before its workers start.
        bytecode_cache.warm(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _run_alone is not None:
        _run_alone.close()


def _alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    if _run_alone is None:
        return (yield)
    alone = _alone(item)
    _run_alone.before(alone)
    try:
        return (yield)
    finally:
        _run_alone.after(alone, _alone(nextitem))


#: The modules without a test marked ``alone`` that take longest, longest
#: first (ranked by a full run's per-module times, over 5 s each, on a
#: quiet 2-core machine with four test processes). xdist (``--dist
#: loadfile``) hands a test process a whole module at a time, in the order
#: :func:`pytest_collection_modifyitems` leaves them: a long one handed out
#: last keeps one process busy while the others are idle at the end (the
#: cluster store's 74 s module, left unranked, ended a run 26-40 s after the
#: other processes), while the short ones left in collection order fill the
#: gaps. Rank them again when a module's time moves (``--durations``).
LONGEST_FIRST = (
    "tests/test_cluster.py",
    "tests/test_redis_cluster_store.py",
    "tests/test_store_contract.py",
    "tests/test_cluster_abandoned.py",
    "tests/test_throttle.py",
    "tests/test_throttle_remember.py",
    "tests/test_page_accounting.py",
    "tests/test_report_files.py",
    "tests/test_state_command.py",
    "tests/test_throttle_groups.py",
    "tests/test_walk_memo.py",
    "tests/test_change_feed.py",
    "tests/test_commands.py",
    "tests/test_scrapyd.py",
    "tests/test_cluster_host_groups.py",
    "tests/test_store_faults.py",
    "tests/test_replay_shortcut.py",
    "tests/test_state_copy.py",
    "tests/test_kill9.py",
    "tests/test_robots.py",
    "tests/test_fatal.py",
    "tests/test_user_project.py",
    "tests/test_redis_store.py",
    "tests/unit/test_layout.py",
    "tests/test_metrics.py",
    "tests/test_redelivery.py",
    "tests/test_failures.py",
    "tests/test_replay.py",
    "tests/unit/test_run_accounting.py",
    "tests/unit/test_docs.py",
    "tests/test_schedule.py",
    "tests/test_sitemap_corpus.py",
    "tests/test_validator_trust.py",
    "tests/unit/test_main_text.py",
    "tests/test_reseed.py",
)
for _path in LONGEST_FIRST:
    # A module renamed or split must be named here again.
    assert (Path(__file__).parents[1] / _path).is_file(), _path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules with tests marked ``alone`` first, those tests first in
    them; then :data:`LONGEST_FIRST`; then the others, in collection order.

    While a test marked alone runs, the other test processes wait: the
    runs of them come first, back to back, before the processes share
    out the rest (with ``--no-loadscope-reorder``, xdist keeps this order).
    Each module's tests stay together, in their order otherwise.
    """
    modules = list(dict.fromkeys(item.nodeid.split("::", 1)[0] for item in items))
    with_alone = {item.nodeid.split("::", 1)[0] for item in items if _alone(item)}

    def module_rank(module: str) -> tuple[int, int]:
        if module in with_alone:
            return 0, modules.index(module)
        if module in LONGEST_FIRST:
            return 1, LONGEST_FIRST.index(module)
        return 2, modules.index(module)

    items.sort(key=lambda item: (module_rank(item.nodeid.split("::", 1)[0]), not _alone(item)))


@pytest.fixture
def site():
    """A started site; pages are added by the test (or use ``make_site``)."""
    site = LoopbackSite()
    site.start()
    yield site
    pytest_twisted.blockon(site.stop())


@pytest.fixture
def state_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite in the test's tmp dir; ``indirect`` parametrization with
    ``"redis"`` gives a Redis store under a prefix of the test's own."""
    if getattr(request, "param", "sqlite") == "redis":
        return f"{REDIS_URI}?prefix={request.getfixturevalue('redis_prefix')}"
    return f"sqlite:///{tmp_path / 'state.db'}"


@pytest.fixture
def state_store(state_uri: str):
    """The crawls' state store, opened through its interface (any backend)."""
    store = open_store(Settings({"INCREMENTAL_STATE_URI": state_uri}))
    yield store
    pytest_twisted.blockon(deferred_from_coro(store.close()))


@pytest.fixture
def state_db(tmp_path: Path):
    """Query the state store's file directly, from a second connection."""

    def query(sql: str, *params: Any) -> list[tuple[Any, ...]]:
        db = sqlite3.connect(tmp_path / "state.db")
        try:
            rows = db.execute(sql, params).fetchall()
            db.commit()
            return rows
        finally:
            db.close()

    return query


def crawl_settings(state_uri: str, **overrides: Any) -> dict[str, Any]:
    return {
        "ADDONS": {ADDON: 0},
        "INCREMENTAL_STATE_URI": state_uri,
        "ROBOTSTXT_OBEY": True,
        "LOG_LEVEL": "INFO",
        "LOGSTATS_INTERVAL": 0,
        "TELNETCONSOLE_ENABLED": False,
        "CONCURRENT_REQUESTS": 8,
        # Tests crawl again within seconds; revisit tests switch it on.
        "INCREMENTAL_REVISIT_ENABLED": False,
        # Loopback pages by the hundred: politeness tests switch it on.
        "INCREMENTAL_THROTTLE_ENABLED": False,
        **overrides,
    }


@pytest.fixture
def crawl(state_uri: str):
    """``await crawl(SpiderCls, settings=..., **spider_kwargs)`` → the finished crawler."""

    async def run(spidercls: type[Spider], *, settings: dict[str, Any] | None = None,
                  **kwargs: Any) -> Crawler:
        return await run_crawl(state_uri, spidercls, settings or {}, **kwargs)

    return run


async def run_crawl(state_uri: str, spidercls: type[Spider], settings: dict[str, Any],
                    **kwargs: Any) -> Crawler:
    """A real crawl of *spidercls* on the store *state_uri*; the finished
    crawler, what it emitted in ``crawler.collected``."""
    runner = CrawlerRunner(crawl_settings(state_uri, **settings))
    crawler = runner.create_crawler(spidercls)
    items: list[Any] = []

    def collect(item: Any) -> None:
        items.append(item)

    crawler.signals.connect(collect, signal=signals.item_scraped)
    crawler.collected = items  # type: ignore[attr-defined]
    # The dispatcher keeps weak references: keep the handler alive.
    crawler._collect_handler = collect  # type: ignore[attr-defined]
    await runner.crawl(crawler, **kwargs)
    return crawler


@pytest.fixture
def redis_prefix():
    """A key prefix of its own in the tests' Redis db, deleted afterwards."""
    prefix = new_prefix()
    yield prefix
    delete_prefix(prefix)


@pytest.fixture
def budget_prefix():
    """A shared-budget key prefix of the test's own; its keys deleted afterwards."""
    name = f"incremental:test:{new_prefix()}"
    yield name
    delete_budget_prefix(name)


@pytest.fixture
def cluster_prefix():
    """A cluster run's key prefix of its own in the cluster tests' Redis db,
    deleted afterwards."""
    prefix = "test-cluster-" + new_prefix().removeprefix("test-")
    yield prefix
    delete_prefix(prefix, CLUSTER_REDIS_URI)
