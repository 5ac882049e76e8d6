"""``scrapy`` as a user runs it, in a process of its own.

Started by :func:`run_scrapy` (to the end) and :func:`start_scrapy` (left
running), always the same way: ``python -m scrapy`` from the repository root (or a
user's project), the repository on ``PYTHONPATH`` (the tests' spiders and
pipelines), no proxy of the environment in the way of loopback crawls.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["PROJECT", "child_env", "run", "run_scrapy", "scrapy_argv", "start_scrapy"]

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
