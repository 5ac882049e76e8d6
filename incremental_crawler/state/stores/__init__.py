"""State stores, chosen by the scheme of ``INCREMENTAL_STATE_URI``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from scrapy.exceptions import NotConfigured
from scrapy.utils.misc import load_object
from scrapy.utils.project import data_path

from incremental_crawler.config import DEFAULT_SETTINGS
from incremental_crawler.state.stores.base import StateStore, StateStoreError

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["StateStore", "StateStoreError", "default_state_uri", "open_store"]


def default_state_uri() -> str:
    """The embedded default: a SQLite file under the project's data dir.

    A scrapyd job has a project (its settings module comes from the egg) but
    no ``scrapy.cfg`` to put the data dir next to, and Scrapy refuses to
    guess one (``NotConfigured``). The file then goes where Scrapy keeps data
    outside a project, ``.scrapy/`` in the working directory: for scrapyd,
    its own directory, which every job of that scrapyd shares.
    """
    try:
        path = Path(data_path("incremental/state.db", createdir=False))
    except NotConfigured:
        path = Path(".scrapy", "incremental", "state.db")
    return f"sqlite:///{path.resolve()}"


def open_store(settings: BaseSettings) -> StateStore:
    """Build the store named by ``INCREMENTAL_STATE_URI``.

    The scheme picks a class from ``INCREMENTAL_STATE_STORES`` (import paths,
    so a user can plug in a backend of their own); the class is built with
    ``from_uri(uri, settings=settings)``.
    """
    uri = settings.get("INCREMENTAL_STATE_URI") or default_state_uri()
    scheme = uri.split(":", 1)[0].lower()
    backends: dict[str, str] = {
        **DEFAULT_SETTINGS["INCREMENTAL_STATE_STORES"],
        **settings.getdict("INCREMENTAL_STATE_STORES"),
    }
    if scheme not in backends:
        raise StateStoreError(
            f"INCREMENTAL_STATE_URI {uri!r}: no store for scheme {scheme!r} "
            f"(known: {', '.join(sorted(backends))})"
        )
    store_cls = load_object(backends[scheme])
    return store_cls.from_uri(uri, settings=settings)
