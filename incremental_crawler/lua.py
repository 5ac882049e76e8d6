"""The Lua scripts the package runs in Redis, read from the ``.lua`` files
that ship with it (``pyproject.toml``: package data ``**/*.lua``).

One way for every module with a script: the script is a file next to its
module, read once at import with :func:`load_script`. A script made of a
shared library and its own body (the Redis store's; the cluster's run
scripts, behind their fence) is put together where it is used, its flag
line (``#!lua``, Redis 7's script flags) first when it has one.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["load_script"]


def load_script(package: str, name: str) -> str:
    """The text of the script *name* (``"flush.lua"``) of *package*
    (``"incremental_crawler.state.stores.redis"``), as the file holds it."""
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")
