"""``scrapy`` as a user runs it: in a process of its own, or Scrapy's command line in this one.

A process of its own is for what only a process shows: the entry points a
fresh interpreter finds, a crawl with its own reactor, its exit status, a
signal or a kill, a read-only mount around it. Those are started here by
:func:`run_scrapy` (to the end) and :func:`start_scrapy` (left running),
always the same way: ``python -m scrapy`` from the repository root (or a
user's project), the repository on ``PYTHONPATH`` (the tests' spiders and
pipelines), no proxy of the environment in the way of loopback crawls.

Commands that start no crawl (``scrapy state``, ``items``, ``report``:
Scrapy gives them no crawler process) are run by :func:`scrapy_in_process`
through the same ``scrapy.cmdline.execute`` in this process: what they
print and their exit status are the same, without the second of CPU that
each start-up of a Python process with Scrapy costs.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING

from scrapy.cmdline import execute

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

__all__ = [
    "PROJECT", "child_env", "run", "run_scrapy", "scrapy_argv", "scrapy_in_process",
    "start_scrapy",
]

#: The repository root: its scrapy.cfg makes it the project the commands run in.
PROJECT = Path(__file__).resolve().parents[1]


def scrapy_argv(*args: str) -> list[str]:
    """``python -m scrapy ARGS`` with this interpreter."""
    return [sys.executable, "-m", "scrapy", *args]


def child_env(**overrides: str) -> dict[str, str]:
    """The environment of a child process: this one's, the repository first
    on ``PYTHONPATH``, without proxy variables; then *overrides*."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROJECT), os.environ.get("PYTHONPATH", "")) if p)
    return {**env, **overrides}


def run(argv: Sequence[str], cwd: Path = PROJECT, *, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run *argv* (a ``scrapy`` command line, maybe wrapped: ``unshare``...)
    in *cwd* to the end; its output as text."""
    return subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False, env=env or child_env())


def run_scrapy(*args: str, cwd: Path = PROJECT, env: dict[str, str] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``scrapy ARGS`` in a process of its own, in *cwd*, to the end."""
    return run(scrapy_argv(*args), cwd, env=env, timeout=timeout)


def start_scrapy(*args: str, cwd: Path = PROJECT, env: dict[str, str] | None = None,
                 wrapper: Sequence[str] = (), stderr: int | IO[bytes] = subprocess.PIPE,
                 ) -> subprocess.Popen[bytes]:
    """``scrapy ARGS`` started in a process of its own (behind *wrapper*,
    e.g. ``faketime``), left running; its stderr to *stderr*, stdout nowhere."""
    return subprocess.Popen([*wrapper, *scrapy_argv(*args)], cwd=cwd, env=env or child_env(),
                            stdout=subprocess.DEVNULL, stderr=stderr)


# -- in this process -----------------------------------------------------------------

#: sys.stdout and sys.stderr are the process's: one command at a time.
_one_at_a_time = threading.Lock()


class _Stdout(io.TextIOWrapper):
    """A captured stdout with the bytes underneath that a command may write
    to (``sys.stdout.buffer``: ``scrapy items -o -``)."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", write_through=True)

    def text(self) -> str:
        self.flush()
        raw = self.buffer.getvalue()  # type: ignore[attr-defined]
        # As a child's output read as text: universal newlines.
        return raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


@contextlib.contextmanager
def _process_state_kept(argv: list[str]) -> Iterator[None]:
    """``sys.argv`` set to *argv* meanwhile; the environment, ``sys.path``
    and ``sys.argv`` as they were afterwards (Scrapy's project lookup sets
    ``SCRAPY_SETTINGS_MODULE`` and adds the project to ``sys.path``)."""
    environ, path, old_argv = dict(os.environ), list(sys.path), sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv, sys.path[:] = old_argv, path
        os.environ.clear()
        os.environ.update(environ)


def scrapy_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``scrapy ARGS`` through Scrapy's own command line, in this process:
    its exit status, stdout and stderr, as :func:`run_scrapy` gives them.

    Only for commands that start no crawl (they run no reactor of their
    own), from the repository root (the project the suite runs in). Call it
    off the reactor's thread (``deferToThread``): the commands close their
    store with ``asyncio.run``, which a running event loop forbids.
    """
    if Path.cwd() != PROJECT:
        raise RuntimeError(f"scrapy_in_process runs in the project at {PROJECT}, "
                           f"not in {Path.cwd()}")
    argv = ["scrapy", *args]
    stdout, stderr = _Stdout(), io.StringIO()
    with (_one_at_a_time, _process_state_kept(argv), contextlib.redirect_stdout(stdout),
          contextlib.redirect_stderr(stderr)):
        try:
            execute(argv)
            status = 0  # (execute always exits)
        except SystemExit as exit_:
            if exit_.code is None or isinstance(exit_.code, int):
                status = exit_.code or 0
            else:  # a message: Python prints it, and the status is 1
                print(exit_.code, file=sys.stderr)
                status = 1
    return subprocess.CompletedProcess(argv, status, stdout.text(), stderr.getvalue())
