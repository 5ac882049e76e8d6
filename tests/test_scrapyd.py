"""Deployed to a real scrapyd: the egg, the HTTP API, jobs and their state.

A scrapyd (the one pinned in requirements.txt) runs on loopback in a
temporary directory with a config file of its own; the real ``scrapyd-deploy``
builds the project's egg and uploads it; jobs are scheduled through
``schedule.json`` against the test site, run out of process, and are checked
the way a user checks them: ``listjobs.json``, the job's log and items feed
as scrapyd serves them, the state store, and what the site was asked.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.error import URLError
from urllib.parse import urlencode
from urllib.request import urlopen

import pytest
import pytest_twisted
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro
from twisted.internet.threads import deferToThread

from incremental_crawler.state.records import PageKey
from incremental_crawler.state.stores import default_state_uri, open_store
from tests.redis_util import REDIS_URI, delete_prefix, new_prefix
from tests.scrapy_cli import scrapy_in_process

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from twisted.internet.defer import Deferred

PROJECT = Path(__file__).resolve().parents[1]
#: The project name scrapyd knows us by: scrapy.cfg's [deploy] ``project``.
SCRAPYD_PROJECT = "incremental_crawler"
N_PAGES = 12
#: Written into the copy of the project that is deployed (see ``deployed``).
PROBE_LUA = "incremental_crawler/state/stores/deploy_probe.lua"
#: Every wait in this module is bounded by this many seconds.
TIMEOUT = 60.0


# -- processes -----------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    # SCRAPY_* / SCRAPYD_* variables from the caller would override what the
    # test configures (SCRAPYD_HTTP_PORT beats http_port, SCRAPY_SETTINGS_MODULE
    # beats the egg's entry point).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCRAPY_", "SCRAPYD_"))}
    env.update(extra)
    return env


def start(args: list[str], *, cwd: Path, out: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
    # A session of its own, so that stop() reaches the whole group: scrapyd's
    # crawl processes are its children in the same process group.
    with out.open("wb") as sink:
        return subprocess.Popen(args, cwd=cwd, stdout=kwargs.pop("stdout", sink),
                                stderr=sink, start_new_session=True, **kwargs)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group, then SIGKILL to whatever is left of it.

    The second signal reaches crawl processes still shutting down after
    scrapyd (which does not stop its jobs when it exits) is gone.
    """
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


def tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, data: list[tuple[str, str]] | None = None) -> bytes:
    body = urlencode(data).encode() if data is not None else None
    with urlopen(url, body, timeout=10) as resp:
        return resp.read()


# -- scrapyd -------------------------------------------------------------------


@dataclass
class Scrapyd:
    root: Path
    url: str
    output: Path

    def get(self, endpoint: str, **params: str) -> dict[str, Any]:
        query = f"?{urlencode(params)}" if params else ""
        return self._ok(http(f"{self.url}/{endpoint}{query}"))

    def post(self, endpoint: str, data: list[tuple[str, str]]) -> dict[str, Any]:
        return self._ok(http(f"{self.url}/{endpoint}", data))

    def _ok(self, body: bytes) -> dict[str, Any]:
        answer = json.loads(body)
        assert answer.get("status") == "ok", answer
        return answer

    def schedule(self, spider: str, *, args: dict[str, str],
                 settings: dict[str, str] | None = None) -> str:
        # Spider arguments are plain form fields; each Scrapy setting is a
        # ``setting=NAME=VALUE`` field (scrapyd turns them into -a and -s).
        data = [("project", SCRAPYD_PROJECT), ("spider", spider), *args.items(),
                *(("setting", f"{k}={v}") for k, v in (settings or {}).items())]
        return self.post("schedule.json", data)["jobid"]

    def wait_finished(self, job: str) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            jobs = self.get("listjobs.json", project=SCRAPYD_PROJECT)
            done = [j for j in jobs["finished"] if j["id"] == job]
            if done:
                return done[0]
            time.sleep(0.2)
        pytest.fail(f"job {job} not finished after {TIMEOUT:.0f} s; "
                    f"listjobs: {jobs}\nscrapyd output:\n{tail(self.output)}")

    def run(self, spider: str, **kwargs: Any) -> Job:
        """Schedule a job, wait for it, check it ended cleanly; its results."""
        job_id = self.schedule(spider, **kwargs)
        finished = self.wait_finished(job_id)
        log = http(self.url + finished["log_url"]).decode()
        # scrapyd reports a job as finished whatever its exit status: the
        # exit status is only in scrapyd's own log.
        died = [line for line in self.output.read_text().splitlines()
                if "Process died" in line and job_id in line]
        assert not died, died
        errors = [line for line in log.splitlines() if " ERROR: " in line or "Traceback" in line]
        assert not errors, "\n".join(errors) + "\n\n" + log[-4000:]
        assert "'finish_reason': 'finished'" in log, log[-4000:]
        items = [json.loads(line) for line in
                 http(self.url + finished["items_url"]).decode().splitlines()]
        return Job(job_id, log, items)


@dataclass
class Job:
    id: str
    log: str
    items: list[dict[str, Any]]


def scrapyd_config(root: Path, port: int) -> str:
    return f"""\
[scrapyd]
bind_address = 127.0.0.1
http_port = {port}
eggs_dir = {root / 'eggs'}
logs_dir = {root / 'logs'}
items_dir = {root / 'items'}
dbs_dir = {root / 'dbs'}
max_proc = 2
# Seconds between looks at the job queue (5 by default): a job starts
# within this long of being scheduled.
poll_interval = 0.1
"""


def start_scrapyd(root: Path) -> tuple[subprocess.Popen[bytes], Scrapyd]:
    output = root / "scrapyd.out"
    # scrapyd takes a port number, not 0: a free port is picked, and picked
    # again if someone else took it before scrapyd could listen on it.
    for _ in range(3):
        port = free_port()
        (root / "scrapyd.conf").write_text(scrapyd_config(root, port))
        # scrapyd reads scrapyd.conf from its working directory, then
        # ~/.scrapyd.conf: HOME is the test's directory so that no personal
        # config overrides the test's.
        proc = start([sys.executable, "-m", "scrapyd"], cwd=root, out=output,
                     env=child_env(HOME=str(root)))
        server = Scrapyd(root, f"http://127.0.0.1:{port}", output)
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                server.get("daemonstatus.json")
                return proc, server
            except (URLError, ConnectionError):
                time.sleep(0.1)
        stop(proc)
        if "Address already in use" not in output.read_text(errors="replace"):
            break
    pytest.fail(f"scrapyd did not answer daemonstatus.json within {TIMEOUT:.0f} s "
                f"(exit status {proc.returncode}):\n{tail(output)}")


@pytest.fixture(scope="module")
def scrapyd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrapyd]:
    root = tmp_path_factory.mktemp("scrapyd")
    proc, server = start_scrapyd(root)
    try:
        yield server
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def deployed(scrapyd: Scrapyd, tmp_path_factory: pytest.TempPathFactory) -> Scrapyd:
    """scrapyd with the project's egg uploaded by ``scrapyd-deploy``."""
    # scrapyd-deploy builds the egg in the directory of the closest scrapy.cfg
    # (``setup.py clean -a`` then ``bdist_egg``) and takes the target from
    # it: a copy of the project, whose [deploy] url names this scrapyd,
    # leaves the repository's files and build dir alone.
    src = tmp_path_factory.mktemp("project")
    shutil.copytree(PROJECT, src, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".tox", "build", "dist", "*.egg-info", "__pycache__",
        ".pytest_cache", ".scrapy", "*.db", "*.db-*"))
    # A Lua script no packaging file names: package data goes by globs, so a
    # script added to the package ships without an edit there.
    (src / PROBE_LUA).write_text("return 1\n")
    cfg = configparser.ConfigParser()
    cfg.read(src / "scrapy.cfg")
    cfg["deploy"]["url"] = scrapyd.url + "/"
    with (src / "scrapy.cfg").open("w") as f:
        cfg.write(f)
    result = subprocess.run(
        [sys.executable, "-m", "scrapyd_client.deploy"], cwd=src, env=child_env(),
        capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    answer = json.loads(result.stdout)
    assert answer["status"] == "ok" and answer["project"] == SCRAPYD_PROJECT, answer
    return scrapyd


# -- the test site, out of process ---------------------------------------------


@dataclass
class Site:
    url: str

    @property
    def pages(self) -> list[str]:
        return [f"{self.url}/p/{i:04d}" for i in range(N_PAGES)]

    def log(self) -> list[dict[str, Any]]:
        return json.loads(http(f"{self.url}/__site__/log"))

    def reset(self) -> None:
        http(f"{self.url}/__site__/reset", [])

    def change(self, path: str) -> None:
        assert json.loads(http(f"{self.url}/__site__/change", [("path", path)])) == [path]


@pytest.fixture
def remote_site(tmp_path: Path) -> Iterator[Site]:
    # Pages that all send validators (strong and weak ETags, Last-Modified),
    # so that the state store must hold validators for every one of them.
    # The test site is not installed with the package: the checkout's root on
    # PYTHONPATH makes ``tests.site`` importable from the test's directory.
    pythonpath = os.pathsep.join(filter(None, (str(PROJECT), os.environ.get("PYTHONPATH"))))
    proc = start([sys.executable, "-m", "tests.site",
                  "--pages", str(N_PAGES), "--page-size", "4000",
                  "--kinds", "strong,weak,lastmod"],
                 cwd=tmp_path, out=tmp_path / "site.err", stdout=subprocess.PIPE,
                 env=child_env(PYTHONPATH=pythonpath))
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
        line = proc.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("http://127.0.0.1:"):
            pytest.fail(f"the test site did not start: {line!r}\n{tail(tmp_path / 'site.err')}")
        yield Site(line)
    finally:
        stop(proc)


# -- the state store, read back --------------------------------------------------


async def read_state(uri: str, scope: str,
                     urls: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The stored items (by URL) and page states (by URL), via the store's own API."""
    store = open_store(Settings({"INCREMENTAL_STATE_URI": uri}))
    try:
        items = {str(item["url"]): item for item in store.iter_items(scope)}
        # As Scrapy runs store coroutines: asyncio tasks (Redis needs one).
        pages = await deferred_from_coro(store.get_pages([PageKey(scope, url) for url in urls]))
        return items, {key.url: state for key, state in pages.items()}
    finally:
        await deferred_from_coro(store.close())


# One entry per state store the deployed spiders are tested with: the URI the
# job gets, then whatever clean-up the store needs.
def sqlite_state(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'state.db'}"


def redis_state(tmp_path: Path) -> Iterator[str]:
    prefix = new_prefix()
    try:
        yield f"{REDIS_URI}?prefix={prefix}"
    finally:
        delete_prefix(prefix)


STATE_STORES: dict[str, Callable[[Path], Iterator[str]]] = {
    "sqlite": sqlite_state, "redis": redis_state,
}


@pytest.fixture(params=sorted(STATE_STORES))
def job_state_uri(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from STATE_STORES[request.param](tmp_path)


def crawl(deployed: Scrapyd, site: Site, **settings: str) -> Deferred[Job]:
    """Run ``sitemap`` on *site* as a scrapyd job.

    The site answers at once on loopback: the job's politeness window
    starts at 50 requests/s (as ``scrapy demo``'s), not 4. Waiting for the
    job blocks: it runs off the reactor thread, which the tests need for
    reading the state store.
    """
    return deferToThread(deployed.run, "sitemap",
                         args={"sitemap_url": f"{site.url}/robots.txt"},
                         settings={"INCREMENTAL_THROTTLE_START_RATE": "50", **settings})


# -- tests -------------------------------------------------------------------------


def test_scrapyd_deploy_uploads_an_egg_of_the_package_only(deployed: Scrapyd) -> None:
    assert SCRAPYD_PROJECT in deployed.get("listprojects.json")["projects"]
    spiders = deployed.get("listspiders.json", project=SCRAPYD_PROJECT)["spiders"]
    assert {"sitemap", "feed", "news"} <= set(spiders)

    (version,) = deployed.get("listversions.json", project=SCRAPYD_PROJECT)["versions"]
    egg = deployed.root / "eggs" / SCRAPYD_PROJECT / f"{version}.egg"
    with zipfile.ZipFile(egg) as z:
        names = z.namelist()
        entry_points = z.read("EGG-INFO/entry_points.txt").decode()
    # tests/ (the test site included), bench/ and the virtualenv stay out;
    # the demo's site stays in, because `scrapy demo` imports it and Scrapy
    # imports every command of COMMANDS_MODULE at start-up, scrapyd's crawls
    # included.
    assert {name.split("/")[0] for name in names} == {"EGG-INFO", "incremental_crawler"}
    assert "incremental_crawler/spiders/sitemap.py" in names
    assert "incremental_crawler/demo/site.py" in names
    # Not modules: in the egg only as package data (pyproject.toml's globs),
    # every file of the package that is not Python, the probe's included.
    data = {path.relative_to(PROJECT).as_posix()
            for path in (PROJECT / "incremental_crawler").rglob("*")
            if path.is_file() and path.suffix not in (".py", ".pyc")}
    assert "incremental_crawler/politeness/budget.lua" in data
    assert data | {PROBE_LUA} <= set(names)
    assert re.search(r"\[scrapy\]\s+settings = incremental_crawler\.settings", entry_points)
    # The commands, as pyproject.toml registers them.
    commands = re.search(r"\[scrapy\.commands\]\n((?:.+\n?)+)", entry_points)
    assert commands is not None, entry_points
    assert {line.split(" = ")[0] for line in commands.group(1).splitlines()} == {
        "demo", "items", "state", "report", "crawl", "shell", "fetch", "view", "parse",
        "check"}

    # The crawl processes import the project from the egg, as scrapyd's runner
    # sets it up (not from the development checkout this test runs in).
    probe = subprocess.run(
        [sys.executable, "-c",
         ("from scrapyd.runner import project_environment\n"
          f"with project_environment({SCRAPYD_PROJECT!r}):\n"
          "    import incremental_crawler.spiders.sitemap as m\n"
          "    from incremental_crawler.politeness.budget import BUDGET_LUA\n"
          "    assert \"redis.call('HMGET'\" in BUDGET_LUA\n"
          "    print(m.__file__)")],
        cwd=deployed.root, env=child_env(SCRAPY_PROJECT=SCRAPYD_PROJECT, HOME=str(deployed.root)),
        capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()).is_relative_to(egg), probe.stdout


@pytest_twisted.ensureDeferred
async def test_scheduled_sitemap_jobs_crawl_then_recrawl_incrementally(
    deployed: Scrapyd, remote_site: Site, job_state_uri: str
) -> None:
    site = remote_site
    first = await crawl(deployed, site, INCREMENTAL_STATE_URI=job_state_uri)

    # The items feed scrapyd keeps for the job: one item per page.
    assert sorted(item["url"] for item in first.items) == site.pages
    assert all(item["title"].endswith(" v0") and item["fingerprint"] for item in first.items)
    # The state store: every page's item, and every page's validators.
    items, pages = await read_state(job_state_uri, "sitemap", site.pages)
    assert sorted(items) == site.pages
    missing = [url for url in site.pages if url not in pages or not pages[url].has_validators]
    assert missing == []
    fetched = [r["path"] for r in site.log() if r["path"].startswith("/p/")]
    assert sorted(fetched) == [f"/p/{i:04d}" for i in range(N_PAGES)]

    changed = "/p/0003"
    site.reset()
    site.change(changed)
    second = await crawl(deployed, site, INCREMENTAL_STATE_URI=job_state_uri)

    # What the site saw: an unchanged page was not requested at all (its
    # <lastmod> did not move) or only conditionally, answered with a 304;
    # the changed page was asked for with the validators the first job stored.
    page_requests = [r for r in site.log() if r["path"].startswith("/p/")]
    assert [r["path"] for r in page_requests
            if r["path"] != changed and r["status"] != 304] == []
    (request,) = [r for r in page_requests if r["path"] == changed]
    assert request["status"] == 200
    assert request["if_none_match"] or request["if_modified_since"], request
    # No unchanged item: the changed page only, at its new version.
    assert [(item["url"], item["title"]) for item in second.items] == [
        (f"{site.url}{changed}", "Page p/0003 v1")]
    items, _ = await read_state(job_state_uri, "sitemap", site.pages)
    assert items[f"{site.url}{changed}"]["title"] == "Page p/0003 v1"
    assert sorted(items) == site.pages


@pytest_twisted.ensureDeferred
async def test_jobs_without_a_state_uri_keep_state_in_scrapyds_directory(
    deployed: Scrapyd, remote_site: Site, tmp_path: Path
) -> None:
    site = remote_site
    # No INCREMENTAL_STATE_URI: the embedded default. A scrapyd job has no
    # scrapy.cfg, so the file lands under scrapyd's working directory.
    job = await crawl(deployed, site)
    assert sorted(item["url"] for item in job.items) == site.pages
    state_db = deployed.root / ".scrapy" / "incremental" / "state.db"
    assert f"Incremental state store: {state_db}" in job.log
    items, pages = await read_state(f"sqlite:///{state_db}", "sitemap", site.pages)
    assert sorted(items) == site.pages
    assert all(pages[url].has_validators for url in site.pages)

    # The documented way (docs/scrapyd.md) to read a scrapyd job's items: `scrapy items` from a
    # checkout of the project, pointed at the job's state (Scrapy's command
    # line in this process: the command starts no crawl).
    out = tmp_path / "items.jsonl"
    result = await deferToThread(
        scrapy_in_process, "items", "--spider", "sitemap", "-o", str(out),
        "-s", f"INCREMENTAL_STATE_URI=sqlite:///{state_db}")
    assert result.returncode == 0, result.stderr
    assert sorted(json.loads(line)["url"] for line in out.read_text().splitlines()) == site.pages


def test_default_state_uri_without_scrapy_cfg_is_under_the_working_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # How a scrapyd job starts: the settings module is known (the egg's entry
    # point), but no scrapy.cfg is anywhere above the working directory.
    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "incremental_crawler.settings")
    monkeypatch.chdir(tmp_path)
    expected = tmp_path.resolve() / ".scrapy" / "incremental" / "state.db"
    assert default_state_uri() == f"sqlite:///{expected}"
