"""Compile the project's and the tests' bytecode once a run, before the test processes start.

Without it every process compiles the same sources again: each xdist
worker rewrites the asserts of the same ~100 test modules (~7 s of CPU a
worker, four at once on two cores), and every ``scrapy crawl`` a test
starts compiles ``incremental_crawler`` from source (~0.4 s of CPU a
process), wherever ``PYTHONDONTWRITEBYTECODE`` is set (no process writes
what it compiled) or the checkout is new (the workers start together:
none finds another's). The run's controller compiles both once, split
over the cores, where Python and pytest look for them (the ``__pycache__``
directories, git-ignored; pytest's rewritten modules under their own
name): a source already compiled is skipped, so a run after the first
costs next to nothing here.

It writes them even under ``PYTHONDONTWRITEBYTECODE``, and only there: a
cache, never read unless it matches its source (by time stamp for
Python's own, by a hash of the source for pytest's). Not through
``PYTHONPYCACHEPREFIX``: a prefix hides every ``__pycache__``, the
installed packages' included, and each process would compile Scrapy and
Twisted from source instead.

The rewritten modules are written as pytest itself writes them (its
``_rewrite_test``, ``_read_pyc`` and ``_write_pyc``, private: pytest is
pinned in ``requirements.txt``); if a pytest release moves them, that part
is skipped and each worker rewrites its modules as before, slower,
nothing else.
"""

from __future__ import annotations

import compileall
import os
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

ROOT = Path(__file__).resolve().parents[1]


def _rewrite(config: pytest.Config, paths: list[Path]) -> None:
    """Write each test module's rewritten bytecode where pytest looks for it."""
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return
    needed = ("_rewrite_test", "_read_pyc", "_write_pyc", "get_cache_dir", "PYC_TAIL")
    if not all(hasattr(rewrite, name) for name in needed):
        return
    state = config.stash[rewrite.assertstate_key]
    for path in paths:
        cache_dir = rewrite.get_cache_dir(path)
        pyc = cache_dir / (path.name[:-3] + rewrite.PYC_TAIL)
        if rewrite._read_pyc(path, pyc) is not None:
            continue  # up to date
        cache_dir.mkdir(parents=True, exist_ok=True)
        source_hash, code = rewrite._rewrite_test(path, config)
        rewrite._write_pyc(state, code, source_hash, pyc)


def _compile(config: pytest.Config, paths: list[Path], tests: list[Path]) -> None:
    for path in paths:
        compileall.compile_file(str(path), quiet=2)
    _rewrite(config, tests)
    # A forked child: no atexit handlers, no buffers of the parent flushed twice.
    os._exit(0)


def _collected(config: pytest.Config, path: Path) -> bool:
    """A test module or conftest (what pytest rewrites here) under the
    run's arguments (every one without arguments: the testpaths)."""
    if not path.is_relative_to(ROOT / "tests"):
        return False
    if path.name != "conftest.py" and not path.name.startswith("test_"):
        return False
    for arg in config.args:
        root = Path(config.invocation_params.dir, arg.split("::", 1)[0]).resolve()
        if path == root or path.is_relative_to(root):
            return True
    return False


def warm(config: pytest.Config, processes: int = 2) -> None:
    """Compile what is not compiled yet, in *processes* forked processes."""
    sources = [*sorted((ROOT / "incremental_crawler").rglob("*.py")),
               *sorted((ROOT / "tests").rglob("*.py"))]
    tests = [path for path in sources if _collected(config, path)]
    # Round-robin shares: the large modules spread over the processes.
    shares = [(sources[i::processes], tests[i::processes]) for i in range(processes)]
    # Forked, not pickled: the config is the parent's own.
    fork = get_context("fork")
    children = [fork.Process(target=_compile, args=(config, *share)) for share in shares]
    for child in children:
        child.start()
    for child in children:
        child.join()
