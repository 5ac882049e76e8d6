"""Every fatal condition: one clear line, a non-zero exit status, nothing lost.

Each test runs a real ``scrapy crawl`` subprocess in the project and checks
its exit status and the line it logged (a worker whose cluster Redis dies
is in tests/test_cluster.py). The sitemap URL is a closed loopback port:
these crawls must stop before they request anything.

A read-only store needs a directory the crawl cannot write. As a normal
user, ``chmod``; as root (CI containers), ``chmod`` does not stop root, so
the crawl runs in a private mount namespace (``unshare --mount``) where the
directory is bind-mounted read-only over itself: the host's mounts are not
touched, and the namespace ends with the process. A full disk is a small
tmpfs mounted the same way (root only). A crawl that must run before its
store fails crawls the test site served by a process of its own
(``python -m tests.site``): a subprocess test blocks the reactor.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_twisted
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro

from incremental_crawler.state.stores import open_store
from incremental_crawler.state.stores.sqlite import SQLiteStateStore
from tests.scrapy_cli import PROJECT, child_env, run, scrapy_argv

if TYPE_CHECKING:
    from collections.abc import Iterator

SITEMAP = "sitemap_url=http://127.0.0.1:9/sitemap.xml"


def crawl_args(*settings: str) -> list[str]:
    """``scrapy crawl`` of a sitemap at a closed port, with *settings* (``-s``)."""
    return scrapy_argv("crawl", "sitemap", "-a", SITEMAP,
                       *(arg for setting in settings for arg in ("-s", setting)))


def run_with_read_only(directory: Path, args: list[str],
                       cwd: Path = PROJECT) -> subprocess.CompletedProcess[str]:
    """Run *args* in *cwd* with *directory* read-only for it (see the module docstring)."""
    if os.geteuid() != 0:
        mode = directory.stat().st_mode
        directory.chmod(0o555)
        try:
            return run(args, cwd)
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
    return run([unshare, "--mount", "sh", "-c", script, str(directory), *args], cwd)


def unshare_mount(mount: str, directory: Path) -> str:
    """`unshare` when *mount* (``mount`` options, then the directory) works here; else skip."""
    unshare = shutil.which("unshare")
    probe = subprocess.run(
        [unshare or "unshare", "--mount", "sh", "-c", f"mount {mount} {directory}"],
        capture_output=True, text=True, check=False) if unshare else None
    if unshare is None or probe is None or probe.returncode != 0:
        pytest.skip(f"no private mount possible here (unshare --mount, mount {mount}): "
                    f"{probe.stderr if probe else 'no unshare'}")
    return unshare


def run_on_tmpfs(directory: Path, size: str,
                 args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run *args* with a tmpfs of *size* mounted on *directory* for it alone."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (unshare --mount)")
    unshare = unshare_mount(f"-t tmpfs -o size={size} tmpfs", directory)
    script = f'mount -t tmpfs -o size={size} tmpfs "$0" && exec "$@"'
    return run([unshare, "--mount", "sh", "-c", script, str(directory), *args])


@contextmanager
def served_site(pages: int) -> Iterator[str]:
    """The test site with *pages* pages, in a process of its own; its base URL."""
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.site", "--pages", str(pages), "--page-size", "3000"],
        cwd=PROJECT, stdout=subprocess.PIPE, text=True, env=child_env())
    assert server.stdout is not None
    with server.stdout:
        try:
            yield server.stdout.readline().strip()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)


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


def test_a_bad_setting_is_one_line_naming_it(tmp_path):
    # A store of the test's own: the default one is in the checkout's .scrapy/.
    result = run(crawl_args('INCREMENTAL_THROTTLE_DOMAINS={"example.com": {"max_rat": 2}}',
                            f"INCREMENTAL_STATE_URI=sqlite:///{tmp_path / 'state.db'}"))
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


def test_a_store_that_fails_its_last_commit_exits_non_zero(tmp_path):
    # The only commit is the one at the end (no flush before: a long flush
    # interval, batches larger than the crawl), and the disk is full then:
    # the crawl itself finished. SQLite rolls a transaction back itself
    # when the disk is full; the error must say so (not "cannot rollback").
    directory = tmp_path / "state"
    directory.mkdir()
    path = directory / "state.db"
    with served_site(60) as base:
        result = run_on_tmpfs(directory, "160k", scrapy_argv(
            "crawl", "sitemap", "-a", f"sitemap_url={base}/sitemap.xml",
            "-s", f"INCREMENTAL_STATE_URI=sqlite:///{path}",
            "-s", "INCREMENTAL_FLUSH_INTERVAL=3600", "-s", "INCREMENTAL_BATCH_SIZE=100000",
            # Nor the re-seeder's, which commits this crawl's visits before
            # it reads the due pages.
            "-s", "INCREMENTAL_RESEED_ENABLED=False",
            "-s", "INCREMENTAL_THROTTLE_ENABLED=False"))
    assert result.returncode == 1, result.stderr
    line = one_error_line(result)
    assert line.startswith(f"State store {path}: the disk is full; free space and re-run: ")
    assert line.endswith("staged writes were not stored (the next run fetches those pages "
                         "again)")
    assert "cannot rollback" not in line
    assert "'finish_reason': 'finished'" in result.stderr  # the crawl itself finished


@pytest.mark.parametrize("content", [os.urandom(8192), b"not a database\n" * 64],
                         ids=["random-bytes", "text"])
def test_a_corrupt_store_in_a_read_only_directory_is_called_corrupt(tmp_path, content):
    directory = tmp_path / "state"
    directory.mkdir()
    path = directory / "state.db"
    path.write_bytes(content)
    result = run_with_read_only(
        directory, crawl_args(f"INCREMENTAL_STATE_URI=sqlite:///{path}"))
    assert result.returncode == 1
    line = one_error_line(result)
    assert line.startswith(f"State store {path}: is not a readable SQLite database "
                           "(corrupt or not a state store; besides, ")
    assert "read-only" in line
    assert "intact" not in line
    assert path.read_bytes() == content


def store_with_commits_in_its_wal(source: Path, directory: Path, *, rows: int) -> None:
    """A store in *directory* whose last commits are in its -wal file alone.

    As a crawl killed before a checkpoint leaves it, or a copy that kept
    state.db and state.db-wal (not -shm): the files are copied while the
    writer's connection is open (closing it would checkpoint the -wal into
    the store file). *rows* pages are committed after the store was created
    and closed; with ``rows=0`` the store is new: its schema itself is in
    the -wal only.
    """
    path = source / "state.db"
    if rows:
        store = SQLiteStateStore(path)
        store._db.close()
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("PRAGMA wal_autocheckpoint=0")
        for i in range(rows):
            db.execute("INSERT INTO pages(scope, url) VALUES ('s', ?)", (f"http://h/p/{i}",))
    else:
        store = SQLiteStateStore(path)  # created and migrated, never checkpointed
        db = store._db
    try:
        for name in ("state.db", "state.db-wal"):
            shutil.copyfile(source / name, directory / name)
    finally:
        db.close()


def pages_in(*files: Path) -> int | None:
    """The pages rows of a copy of *files* (a store and maybe its -wal); ``None``: no table."""
    with tempfile.TemporaryDirectory() as tmp:
        for file in files:
            shutil.copyfile(file, Path(tmp) / file.name)
        db = sqlite3.connect(Path(tmp) / files[0].name)
        try:
            return int(db.execute("SELECT COUNT(*) FROM pages").fetchone()[0])
        except sqlite3.OperationalError:
            return None
        finally:
            db.close()


@pytest.mark.parametrize("rows", [500, 0], ids=["commits-in-wal", "new-store-schema-in-wal"])
def test_a_store_with_commits_in_its_wal_in_a_read_only_directory_names_both_files(
    tmp_path, rows,
):
    # The store file alone is stale (without its pages, or without even a
    # schema): "copy it" would lose them. An immutable read (no -wal) found
    # it "intact"; the check replays the -wal on a copy, and the advice
    # names both files.
    source = tmp_path / "writer"
    source.mkdir()
    directory = tmp_path / "state"
    directory.mkdir()
    store_with_commits_in_its_wal(source, directory, rows=rows)
    path = directory / "state.db"
    wal = directory / "state.db-wal"
    assert pages_in(path) == (None if rows == 0 else 0)  # the store file alone
    assert pages_in(path, wal) == rows
    files = {p.name: p.read_bytes() for p in directory.iterdir()}
    result = run_with_read_only(
        directory, crawl_args(f"INCREMENTAL_STATE_URI=sqlite:///{path}"))
    assert result.returncode == 1
    line = one_error_line(result)
    assert line.startswith(f"State store {path}: cannot be written: ")
    assert "read-only" in line
    assert line.endswith(
        "The store is intact and was not changed; its last commits are in state.db-wal: "
        "make it writable, or copy state.db together with state.db-wal to a writable place "
        "(the one without the other loses them) and point INCREMENTAL_STATE_URI at the copy")
    assert "corrupt" not in line
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == files
