"""State stores, found by the scheme of ``INCREMENTAL_STATE_URI``.

The one registry of stores is ``INCREMENTAL_STATE_STORES`` (URI scheme →
import path of a store class), over its defaults (:func:`store_classes`):
the crawl opens its store through it (:func:`open_store`), and so do the
commands that read one (:func:`open_existing_store`, which asks the class
whether the URI names a store that exists, and :func:`admin_store`, which
asks the store whether it has the administration interface). No code
switches on a scheme.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from scrapy.exceptions import NotConfigured
from scrapy.utils.misc import load_object
from scrapy.utils.project import data_path

from incremental_crawler.config import DEFAULT_SETTINGS
from incremental_crawler.state.stores.base import (
    AdminStore,
    CrawlStore,
    StateStore,
    StateStoreError,
)
from incremental_crawler.uris import redacted

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "AdminStore", "CrawlStore", "StateStore", "StateStoreError",
    "default_state_uri", "open_admin_store", "open_existing_store", "open_store", "state_uri",
    "state_uri_setting",
    "store_class", "store_classes",
]


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


def state_uri(settings: BaseSettings) -> str:
    """The URI of the store a crawl with *settings* uses.

    ``INCREMENTAL_STATE_URI``; else, in cluster mode, the cluster's Redis
    (``INCREMENTAL_CLUSTER_URL``); else the SQLite file under the project's
    data dir. One rule for the crawl (:func:`open_store`) and for the
    commands that read its store (``scrapy state``, ``items``, ``report``):
    given the crawl's settings, they read what it wrote.
    """
    return (settings.get("INCREMENTAL_STATE_URI") or settings.get("INCREMENTAL_CLUSTER_URL")
            or default_state_uri())


def state_uri_setting(settings: BaseSettings) -> str:
    """The setting :func:`state_uri` took the store from (its default
    included): the one a message tells the user to check."""
    if not settings.get("INCREMENTAL_STATE_URI") and settings.get("INCREMENTAL_CLUSTER_URL"):
        return "INCREMENTAL_CLUSTER_URL"
    return "INCREMENTAL_STATE_URI"


def store_classes(settings: BaseSettings) -> dict[str, str]:
    """The registry: URI scheme → import path of its store class,
    ``INCREMENTAL_STATE_STORES`` merged over its defaults."""
    return {
        **DEFAULT_SETTINGS["INCREMENTAL_STATE_STORES"],
        **settings.getdict("INCREMENTAL_STATE_STORES"),
    }


def store_class(uri: str, settings: BaseSettings,
                named_by: str | None = None) -> type[StateStore]:
    """The class the scheme of *uri* names in the registry (:func:`store_classes`).
    *named_by*: where *uri* came from, for a message (by default the
    setting :func:`state_uri` took it from)."""
    scheme = uri.split(":", 1)[0].lower()
    backends = store_classes(settings)
    if scheme not in backends:
        raise StateStoreError(
            f"{named_by or state_uri_setting(settings)} {redacted(uri)!r}: no store for "
            f"scheme {scheme!r} "
            f"(known: {', '.join(sorted(backends))}; add one with INCREMENTAL_STATE_STORES)"
        )
    store_cls = load_object(backends[scheme])
    if not (isinstance(store_cls, type) and issubclass(store_cls, StateStore)):
        raise StateStoreError(
            f"INCREMENTAL_STATE_STORES[{scheme!r}] = {backends[scheme]!r} is not a "
            "state store class (a subclass of incremental_crawler.state.stores.base.StateStore)")
    return store_cls


def open_store(settings: BaseSettings) -> StateStore:
    """Build the store :func:`state_uri` names.

    The scheme picks a class from ``INCREMENTAL_STATE_STORES`` (import paths,
    so a user can plug in a backend of their own); the class is built with
    ``from_uri(uri, settings=settings)``.
    """
    uri = state_uri(settings)
    return store_class(uri, settings).from_uri(uri, settings=settings)


def open_existing_store(settings: BaseSettings) -> StateStore:
    """The store a crawl with *settings* uses (:func:`state_uri`: in cluster
    mode, the cluster's Redis), if it exists.

    Opening creates a store that does not exist (a SQLite file, a Redis
    prefix's layout record): reading one must not, or a typo in the URI
    would look like a store that holds nothing. The store's class says
    whether one exists (:meth:`StateStore.exists`).
    """
    uri = state_uri(settings)
    return _open_existing(uri, store_class(uri, settings), settings)


def open_admin_store(settings: BaseSettings, command: str) -> AdminStore:
    """:func:`open_existing_store` for the command *command* (``"state"``),
    which needs the administration interface (:class:`AdminStore`): a store
    class without it is refused, before anything is opened, with a message
    that says what it lacks."""
    uri = state_uri(settings)
    store_cls = store_class(uri, settings)
    if not issubclass(store_cls, AdminStore):
        missing = sorted(AdminStore.__abstractmethods__ - StateStore.__abstractmethods__)
        raise StateStoreError(
            f"scrapy {command} cannot read the state store {redacted(uri)}: its class "
            f"{store_cls.__module__}.{store_cls.__qualname__} has the crawl interface only "
            "(incremental_crawler.state.stores.base.StateStore); the command needs the "
            "administration interface, incremental_crawler.state.stores.base.AdminStore "
            f"({', '.join(missing)})")
    store = _open_existing(uri, store_cls, settings)
    assert isinstance(store, AdminStore)
    return store


def _open_existing(uri: str, store_cls: type[StateStore], settings: BaseSettings) -> StateStore:
    if not store_cls.exists(uri, settings=settings):
        raise StateStoreError(
            f"no state store {store_cls.where(uri)} (check {state_uri_setting(settings)})")
    return store_cls.from_uri(uri, settings=settings)
