"""Shared plumbing of the benchmark scripts in ``bench/`` (not a benchmark itself).

* :class:`Site` runs ``python -m tests.site`` (the test site) in its own
  process on 127.0.0.1 and talks to its ``/__site__/...`` control endpoints.
* :func:`run_crawl` runs ``scrapy crawl sitemap ...`` as a separate process
  and collects that process's own CPU time and peak RSS with ``os.wait4``;
  :func:`run_process` does the same for any other command.
* :func:`run_workers` starts N such crawls together (cluster workers) and
  waits for all of them; :func:`worker_stats` reads a crawl's stats dump.
* :class:`RedisServer` is a throwaway ``redis-server`` on a free loopback port.
* :func:`summarize_log`, :func:`dir_apparent_bytes`, :func:`sqlite_compact_size`
  and :func:`print_table` turn the raw figures into the printed tables.

Every wait is bounded by a timeout, every HTTP request goes to the loopback
site only (proxies from the environment are ignored, in this process and in
the children), and nothing is written outside the temporary directories the
callers pass in.
"""

from __future__ import annotations

import ast
import compileall
import contextlib
import json
import math
import os
import re
import select
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

import redis

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

#: The project root (where scrapy.cfg is); crawls run with this as their cwd.
REPO = Path(__file__).resolve().parents[1]

#: Settings every crawl gets.
COMMON_SETTINGS: dict[str, str] = {
    "LOG_LEVEL": "WARNING",
    "LOGSTATS_INTERVAL": "0",
    "ROBOTSTXT_OBEY": "True",
}

# no_proxy too: with no proxy variable left it changes nothing, and set it
# makes Scrapy's HttpProxyMiddleware read the whole environment on every
# request (urllib's proxy_bypass), a CPU cost no ordinary crawl pays.
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "ftp_proxy", "no_proxy")
# No proxies at all for the control requests of this process.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def ensure_importable() -> None:
    """Make ``import incremental_crawler`` and ``import tests.site`` work without
    installing the project (the test site is never installed)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


def child_env() -> dict[str, str]:
    """Environment of child processes: project importable, no proxies."""
    env = dict(os.environ)
    for name in _PROXY_VARS:
        env.pop(name, None)
        env.pop(name.upper(), None)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    env.pop("SCRAPY_SETTINGS_MODULE", None)  # scrapy.cfg in REPO decides
    env["PYTHONHASHSEED"] = "0"
    return env


def compile_bytecode() -> None:
    """Write the bytecode of the project's package and of the bench's spider
    files, as an installed package has it (pip compiles on install): a crawl
    that compiled them from source each time (``PYTHONDONTWRITEBYTECODE``, a
    fresh checkout) would count the compiler against ours, not against a
    plain crawl whose Scrapy is installed."""
    compileall.compile_dir(REPO / "incremental_crawler", quiet=1)
    for spider in (REPO / "bench").glob("_*spider*.py"):
        compileall.compile_file(spider, quiet=1)


# ---------------------------------------------------------------------------
# Child processes with their own rusage
# ---------------------------------------------------------------------------


@dataclass
class ProcUsage:
    """What ``os.wait4`` reported for one finished child process."""

    returncode: int
    user: float
    sys: float
    #: Peak resident set size (see :func:`_wait4`).
    maxrss_kib: int
    wall: float

    @property
    def cpu(self) -> float:
        return self.user + self.sys


def _tree_peaks(pid: int, peaks: dict[int, int]) -> None:
    """Record the peak RSS (VmHWM, KiB) of *pid* and its descendants so far."""
    try:
        with Path(f"/proc/{pid}/status").open(encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    peaks[pid] = max(peaks.get(pid, 0), int(line.split()[1]))
                    break
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except (OSError, ValueError):
        return
    for child in children:
        _tree_peaks(int(child), peaks)


def _wait4(proc: subprocess.Popen, timeout: float, started: float) -> ProcUsage:
    """Reap *proc* with ``os.wait4`` (its own rusage); kill it if it has not
    ended *timeout* s from now. *started* (perf_counter) is for the wall time.

    The peak RSS is the largest VmHWM of the process (or of a process it
    started: ``faketime`` runs the crawl as its child) seen while it ran:
    ``ru_maxrss`` also counts the memory of this process when it started the
    child, so a bench that holds a crawl's items would see its own size.
    """
    deadline = time.perf_counter() + timeout
    delay = 0.002
    peaks: dict[int, int] = {}
    while True:
        _tree_peaks(proc.pid, peaks)
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            wall = time.perf_counter() - started
            rc = os.waitstatus_to_exitcode(status)
            proc.returncode = rc  # tell Popen it is reaped
            peak = max(peaks.values(), default=0) or ru.ru_maxrss
            return ProcUsage(rc, ru.ru_utime, ru.ru_stime, peak, wall)
        if time.perf_counter() > deadline:
            proc.kill()
            os.wait4(proc.pid, 0)
            proc.returncode = -9
            raise TimeoutError(f"process {proc.args!r} did not finish within {timeout:.0f} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def run_process(cmd: Sequence[str], *, timeout: float = 120.0) -> ProcUsage:
    """Run *cmd* (in the repository, with :func:`child_env`, output discarded)
    and return its own rusage; raises if it fails."""
    started = time.perf_counter()
    proc = subprocess.Popen(list(cmd), cwd=REPO, env=child_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    usage = _wait4(proc, timeout, started)
    if usage.returncode != 0:
        raise RuntimeError(f"{list(cmd)!r} failed (rc={usage.returncode})")
    return usage


class Site:
    """The loopback site in its own process; use as a context manager.

    ``Site(pages=400, page_size=30_000, kinds="strong,weak,lastmod")``;
    ``extra_args`` are appended to the site's command line (e.g.
    ``["--rate", "20", "--burst", "5"]``).
    """

    def __init__(self, pages: int, page_size: int, kinds: str, *, start_timeout: float = 60.0,
                 extra_args: Sequence[str] = ()):
        self.pages, self.page_size, self.kinds = pages, page_size, kinds
        self.start_timeout = start_timeout
        self.extra_args = [str(a) for a in extra_args]
        self.proc: subprocess.Popen | None = None
        self.base_url = ""
        self.usage: ProcUsage | None = None

    def __enter__(self) -> Site:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> str:
        cmd = [
            sys.executable, "-m", "tests.site",
            "--pages", str(self.pages), "--page-size", str(self.page_size),
            "--kinds", self.kinds, "--host", "127.0.0.1", "--port", "0",
            *self.extra_args,
        ]
        self._started = time.perf_counter()
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=None,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], self.start_timeout)
        line = self.proc.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("http://127.0.0.1:"):
            self.stop()
            raise RuntimeError(f"loopback site did not start (got {line!r})")
        self.base_url = line
        return line

    def stop(self, timeout: float = 20.0) -> ProcUsage | None:
        proc, self.proc = self.proc, None
        if proc is None:
            return self.usage
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            self.usage = _wait4(proc, timeout, self._started) if proc.returncode is None else None
        except ChildProcessError:  # already reaped by poll()
            self.usage = None
        if proc.stdout is not None:
            proc.stdout.close()
        return self.usage

    # -- control endpoints (never logged by the site) ------------------------

    def _call(self, method: str, path: str, form: Sequence[tuple[str, str]] = ()) -> Any:
        """One control request; *form* goes as an urlencoded body."""
        assert self.base_url.startswith("http://127.0.0.1:")
        data = urlencode(list(form)).encode() if form else None
        headers = {"Content-Type": "application/x-www-form-urlencoded"} if form else {}
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers=headers)
        with _OPENER.open(req, timeout=30) as resp:
            return json.loads(resp.read())

    @property
    def robots_url(self) -> str:
        return self.base_url + "/robots.txt"

    def reset(self) -> None:
        self._call("POST", "/__site__/reset")

    def log(self) -> list[dict[str, Any]]:
        return self._call("GET", "/__site__/log")

    def change(self, fraction: float, seed: int) -> list[str]:
        """Change ``fraction`` of the pages (seeded); return their paths."""
        return self._call("POST", f"/__site__/change?fraction={fraction}&seed={seed}")

    def change_paths(self, paths: Sequence[str]) -> list[str]:
        """Give each page of *paths* a new version, in one call whatever their number."""
        if not paths:
            return []
        return self._call("POST", "/__site__/change", [("path", p) for p in paths])

    def set_status(self, paths: Sequence[str], status: int) -> None:
        """Pages of *paths* answer *status* from now on (200: their content again)."""
        if paths:
            self._call("POST", f"/__site__/status?status={status}",
                       [("path", p) for p in paths])

    def set_sitemap_lastmods(self, mode: str) -> None:
        """What the sitemaps' ``<lastmod>`` say from now on: honest, stale or none."""
        self._call("POST", f"/__site__/lastmods?mode={mode}")


@dataclass
class LogSummary:
    requests: int
    not_modified: int
    body_bytes: int
    page_requests: int
    statuses: dict[int, int] = field(default_factory=dict)


def summarize_log(records: Iterable[dict[str, Any]]) -> LogSummary:
    """Server-side counts of one run (all paths: pages, robots.txt, sitemaps)."""
    records = list(records)
    statuses: dict[int, int] = {}
    for r in records:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return LogSummary(
        requests=len(records),
        not_modified=statuses.get(304, 0),
        body_bytes=sum(r["body_bytes"] for r in records),
        page_requests=sum(1 for r in records if r["path"].startswith("/p/")),
        statuses=statuses,
    )


# ---------------------------------------------------------------------------
# Crawls
# ---------------------------------------------------------------------------


def plain_settings() -> dict[str, str]:
    """Plain Scrapy: every incremental component raises NotConfigured."""
    return {"INCREMENTAL_ENABLED": "False"}


def httpcache_settings(cache_dir: Path) -> dict[str, str]:
    """Plain Scrapy plus its HTTP cache with the RFC 2616 policy."""
    return {
        "INCREMENTAL_ENABLED": "False",
        "HTTPCACHE_ENABLED": "True",
        "HTTPCACHE_POLICY": "scrapy.extensions.httpcache.RFC2616Policy",
        "HTTPCACHE_DIR": str(cache_dir),
    }


def httpcache_revalidate_settings(cache_dir: Path) -> dict[str, str]:
    """HttpCache (RFC2616Policy) revalidating every page on every crawl: each
    request carries ``Cache-Control: max-age=0``, so a cached page is asked
    conditionally and a 304 hands the cached body to the callback."""
    return {
        **httpcache_settings(cache_dir),
        "DEFAULT_REQUEST_HEADERS": json.dumps({
            "Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            "Accept-Language": "en",
            "Cache-Control": "max-age=0"}),
    }


def ours_settings(db_path: Path, *, store_items: bool = True) -> dict[str, str]:
    """The project's defaults, with the state store at *db_path*."""
    s = {"INCREMENTAL_STATE_URI": "sqlite:///" + str(db_path)}  # absolute -> sqlite:////...
    if not store_items:
        s["INCREMENTAL_STORE_ITEMS"] = "False"
    return s


@dataclass
class CrawlResult:
    usage: ProcUsage
    #: The emitted items (read when the crawl finished; the file may be gone).
    item_list: list[dict[str, Any]]
    #: What the crawl logged (stdout and stderr).
    log: str = ""

    @property
    def items(self) -> int:
        return len(self.item_list)

    def by_path(self) -> dict[str, dict[str, Any]]:
        """Items keyed by the path of their ``url``."""
        return {urlsplit(i["url"]).path: i for i in self.item_list}

    def item_paths(self) -> set[str]:
        return set(self.by_path())


def read_items(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_crawl(
    site_url: str,
    settings: dict[str, str],
    workdir: Path,
    name: str,
    *,
    spider: str = "sitemap",
    timeout: float = 600.0,
    spider_args: dict[str, str] | None = None,
    command: Sequence[str] | None = None,
    allow_errors: bool = False,
    wrapper: Sequence[str] = (),
    cwd: Path | None = None,
) -> CrawlResult:
    """``scrapy crawl sitemap -a sitemap_url=<site>/robots.txt`` in its own process.

    *command* replaces ``crawl <spider> -a sitemap_url=...`` (the scrapy
    arguments before ``-O``), e.g. ``["runspider", "bench/x.py"]``.
    *wrapper* goes before the Python command (e.g. ``["faketime", "-f",
    "+2d"]``: the crawl runs two days later). *cwd* replaces the repository
    as the working directory (outside it, no project settings: plain Scrapy).
    Items go to ``workdir/<name>.jsonl``, stderr to ``workdir/<name>.err``.
    Raises if the crawl fails, times out, or (unless *allow_errors*, for
    baselines that are expected to give up on requests) logs an
    ERROR/CRITICAL line.
    """
    assert site_url.startswith("http://127.0.0.1:")
    items = workdir / f"{name}.jsonl"
    err = workdir / f"{name}.err"
    if command is None:
        command = ["crawl", spider, "-a", f"sitemap_url={site_url}/robots.txt"]
    cmd = [*wrapper, sys.executable, "-m", "scrapy", *command, "-O", str(items)]
    for key, value in (spider_args or {}).items():
        cmd += ["-a", f"{key}={value}"]
    for key, value in {**COMMON_SETTINGS, **settings}.items():
        cmd += ["-s", f"{key}={value}"]
    with err.open("wb") as errf:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd or REPO, env=child_env(),
                                stdin=subprocess.DEVNULL, stdout=errf, stderr=errf)
        usage = _wait4(proc, timeout, started)
    log = err.read_text(encoding="utf-8", errors="replace")
    logged_errors = " ERROR: " in log or " CRITICAL: " in log
    if usage.returncode != 0 or (logged_errors and not allow_errors):
        tail = "\n".join(log.splitlines()[-30:])
        raise RuntimeError(f"crawl {name} failed (rc={usage.returncode}):\n{tail}")
    return CrawlResult(usage, read_items(items), log)


def worker_stats(err_file: Path) -> dict[str, Any]:
    """Every stat Scrapy dumped at the end of a crawl (LOG_LEVEL=INFO), from
    the crawl's stderr file; empty if it dumped none."""
    text = err_file.read_text(errors="replace")
    match = re.search(r"Dumping Scrapy stats:\n(\{.*?\})\n", text, re.S)
    if not match:
        return {}
    body = re.sub(r"datetime\.datetime\([^)]*\)", "None", match.group(1))
    return ast.literal_eval(body)


def run_workers(
    site_url: str,
    n: int,
    settings: dict[str, str],
    workdir: Path,
    name: str,
    *,
    timeout: float = 600.0,
    spider_args: dict[str, str] | None = None,
    allow_errors: bool = True,
    wrapper: Sequence[str] = (),
) -> tuple[list[CrawlResult], list[dict[str, Any]], float]:
    """Start *n* crawls of :func:`run_crawl` together (cluster workers: the
    same command and settings, at LOG_LEVEL=INFO so each dumps its stats),
    each under the same *wrapper*; wait for all of them (each bounded by
    *timeout*). Worker *i* writes ``workdir/<name>-<i>.jsonl`` and ``.err``.

    Returns the workers' results, their stats (:func:`worker_stats`) and the
    wall time from the first start to the last exit. Raises if any worker
    fails (after all have ended).
    """
    started = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(run_crawl, site_url, {**settings, "LOG_LEVEL": "INFO"},
                               workdir, f"{name}-{i}", timeout=timeout,
                               spider_args=spider_args, allow_errors=allow_errors,
                               wrapper=wrapper)
                   for i in range(n)]
        results = [f.result() for f in futures]
    wall = time.perf_counter() - started
    return results, [worker_stats(workdir / f"{name}-{i}.err") for i in range(n)], wall


_STAT_LINE = re.compile(r"'(incremental/[^']+)': (\d+)")


def logged_stats(log: str) -> dict[str, int]:
    """The integer ``incremental/...`` stats of Scrapy's end-of-crawl stats
    dump in *log* (empty unless the crawl logged at INFO level)."""
    dump = log.rsplit("Dumping Scrapy stats:", 1)
    if len(dump) < 2:
        return {}
    return {k: int(v) for k, v in _STAT_LINE.findall(dump[1])}


# ---------------------------------------------------------------------------
# Sizes, numbers, tables
# ---------------------------------------------------------------------------


def dir_apparent_bytes(path: Path) -> int:
    """Sum of ``st_size`` of every file under *path* (apparent size)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            total += (Path(root) / f).lstat().st_size
    return total


def sqlite_compact_size(db_path: Path) -> int:
    """Bytes of the database once compacted: an online backup (which reads
    through the WAL) into a temporary copy, VACUUMed, ``page_count*page_size``."""
    with tempfile.TemporaryDirectory(prefix="bench-sqlite-") as tmp:
        copy = Path(tmp) / "copy.db"
        src = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        dst = sqlite3.connect(copy)
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")
            dst.execute("VACUUM")
            pages = dst.execute("PRAGMA page_count").fetchone()[0]
            size = dst.execute("PRAGMA page_size").fetchone()[0]
            free = dst.execute("PRAGMA freelist_count").fetchone()[0]
        finally:
            src.close()
            dst.close()
        return (pages - free) * size


def copy_sqlite(src: Path, dst: Path) -> None:
    """Copy a closed SQLite store (checkpointed first, so one file suffices).

    The copy is fsynced, so the kernel's write-back of a large copy does not
    run during (and disturb) the crawl measured next.
    """
    con = sqlite3.connect(src)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()
    shutil.copyfile(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}x" if b else "n/a"


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def vm_rss_kib() -> int:
    """Current resident set size of this process (VmRSS, KiB)."""
    with Path("/proc/self/status").open(encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A compact left/right aligned text table."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )

    print(fmt(cells[0]))
    print("  ".join("-" * w for w in widths))
    for r in cells[1:]:
        print(fmt(r))


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


class RedisServer:
    """A throwaway ``redis-server`` on a free loopback port (nothing persisted),
    its files in *workdir*; no other client's traffic is counted."""

    def __init__(self, workdir: Path, start_timeout: float = 20.0) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.dir = workdir / "redis"
        self.dir.mkdir()
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port),
             "--save", "", "--appendonly", "no", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.uri = self.url(0)
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            try:
                with redis.Redis(host="127.0.0.1", port=self.port) as client:
                    client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start")

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def used_memory(self) -> int:
        with redis.Redis(host="127.0.0.1", port=self.port) as client:
            return int(client.info("memory")["used_memory"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)


#: INCREMENTAL_LASTMOD_RECHECK_SHARE's default: the share of lastmod-skipped
#: pages the rotating sample checks each crawl.
RECHECK_SHARE = 0.01


def sample_bound(pages: int) -> int:
    """Pages the rotating sample may check in a crawl of the test site: drawn
    per list, and its sitemap index lists two halves of its pages."""
    halves = ((pages + 1) // 2, pages // 2)
    return sum(max(1, math.ceil(RECHECK_SHARE * n)) for n in halves if n)


#: Where Debian's python3-doc puts Python's HTML manual.
DOC_ROOT = Path("/usr/share/doc")
DOC_DIR_PATTERNS = ("python3/html", "python3.*/html", "python3-doc/html")


def find_python_docs() -> Path | None:
    """The python3-doc HTML directory, if the package is installed."""
    for pattern in DOC_DIR_PATTERNS:
        for path in sorted(DOC_ROOT.glob(pattern)):
            if (path / "index.html").is_file() and sum(1 for _ in path.rglob("*.html")) >= 50:
                return path
    return None


@contextlib.contextmanager
def git_trees(refs: Sequence[str], into: Path) -> Iterator[list[Path]]:
    """Each of *refs* checked out (detached) in a git worktree of its own
    under *into*, for a bench to run that commit's code beside this tree's;
    the worktrees removed after, whatever happens (a run killed midway
    leaves them registered: ``git worktree prune`` forgets them)."""
    added: list[Path] = []
    try:
        for n, ref in enumerate(refs):
            tree = into / f"ref-{n}"
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), ref],
                           cwd=REPO, check=True, capture_output=True, timeout=120)
            added.append(tree)
        yield added
    finally:
        for tree in added:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)],
                           cwd=REPO, check=False, capture_output=True, timeout=120)
