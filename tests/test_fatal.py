"""Every fatal condition: one clear line, a non-zero exit status, nothing lost.

Each test runs a real ``scrapy crawl`` subprocess in the project and checks
its exit status and the line it logged (a worker whose cluster Redis dies
is in tests/test_cluster.py). The sitemap URL is a closed loopback port:
these crawls must stop before they request anything.

A read-only store needs a directory the crawl cannot write. As a normal
user, ``chmod``; as root (CI containers), ``chmod`` does not stop root, so
the crawl runs in a private mount namespace (``unshare --mount``) where the
directory is bind-mounted read-only over itself: the host's mounts are not
touched, and the namespace ends with the process.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_twisted
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro

from incremental_crawler.state.stores import open_store

PROJECT = Path(__file__).resolve().parents[1]
SITEMAP = "sitemap_url=http://127.0.0.1:9/sitemap.xml"


def crawl_args(*settings: str) -> list[str]:
    args = [sys.executable, "-m", "scrapy", "crawl", "sitemap", "-a", SITEMAP]
    for setting in settings:
        args += ["-s", setting]
    return args


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=PROJECT, capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, "PYTHONPATH": str(PROJECT)})


def run_with_read_only(directory: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run *args* with *directory* read-only for it (see the module docstring)."""
    if os.geteuid() != 0:
        mode = directory.stat().st_mode
        directory.chmod(0o555)
        try:
            return run(args)
        finally:
            directory.chmod(mode)
    unshare = shutil.which("unshare")
    probe = subprocess.run(
        [unshare or "unshare", "--mount", "sh", "-c",
         f"mount --bind -o ro {directory} {directory} && touch {directory}/probe"],
        capture_output=True, text=True, check=False) if unshare else None
    if probe is None or "Read-only file system" not in probe.stderr:
        pytest.skip("running as root, and no read-only bind mount possible here "
                    f"(unshare --mount): {probe.stderr if probe else 'no unshare'}")
    script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
    return run([unshare, "--mount", "sh", "-c", script, str(directory), *args])


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    assert "Task exception was never retrieved" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "ERROR:" in line]
    assert len(errors) == 1, result.stderr
    return errors[0].split("ERROR: ", 1)[1]


async def make_store(path: Path) -> str:
    """An intact state store at *path*; its SHA-256."""
    store = open_store(Settings({"INCREMENTAL_STATE_URI": f"sqlite:///{path}"}))
    await deferred_from_coro(store.close())
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest_twisted.ensureDeferred
async def test_an_intact_store_in_a_read_only_directory_is_named_read_only_and_left_alone(
    tmp_path,
):
    directory = tmp_path / "state"
    directory.mkdir()
    path = directory / "state.db"
    digest = await make_store(path)
    before = sorted(p.name for p in directory.iterdir())
    result = run_with_read_only(
        directory, crawl_args(f"INCREMENTAL_STATE_URI=sqlite:///{path}"))
    assert result.returncode == 1
    line = one_error_line(result)
    assert line.startswith(f"State store {path}: cannot be written: ")
    assert "read-only" in line
    assert "The store is intact and was not changed" in line
    assert "corrupt" not in line and "backup" not in line
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in directory.iterdir()) == before


def test_a_store_in_a_read_only_directory_cannot_be_created(tmp_path):
    directory = tmp_path / "state"
    directory.mkdir()
    path = directory / "state.db"
    result = run_with_read_only(
        directory, crawl_args(f"INCREMENTAL_STATE_URI=sqlite:///{path}"))
    assert result.returncode == 1
    line = one_error_line(result)
    assert line.startswith(f"State store {path}: cannot be created: ")
    assert "read-only" in line
    assert not path.exists()


def test_a_store_under_a_file_cannot_be_created(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file")
    path = blocker / "state.db"
    result = run(crawl_args(f"INCREMENTAL_STATE_URI=sqlite:///{path}"))
    assert result.returncode == 1
    assert one_error_line(result) == (
        f"State store {path}: cannot be created: {blocker} is not a directory; point "
        "INCREMENTAL_STATE_URI at a file in a directory")
    assert blocker.read_text() == "a file"


def test_a_bad_setting_is_one_line_naming_it():
    result = run(crawl_args('INCREMENTAL_THROTTLE_DOMAINS={"example.com": {"max_rat": 2}}'))
    assert result.returncode == 1
    assert one_error_line(result) == (
        "Invalid setting: INCREMENTAL_THROTTLE_DOMAINS['example.com']: unknown keys ['max_rat']")


def test_an_unreachable_redis_state_store_is_one_line_naming_it():
    # Port 1 on loopback: nothing listens there.
    result = run(crawl_args("INCREMENTAL_STATE_URI=redis://127.0.0.1:1/0?prefix=fatal-test"))
    assert result.returncode == 1
    line = one_error_line(result)
    assert line.startswith("State store redis://127.0.0.1:1/0?prefix=fatal-test: cannot be "
                           "reached or read (is Redis running at this address?)")
