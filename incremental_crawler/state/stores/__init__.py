"""State stores, chosen by the scheme of ``INCREMENTAL_STATE_URI``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from scrapy.exceptions import NotConfigured
from scrapy.utils.misc import load_object
from scrapy.utils.project import data_path

from incremental_crawler.config import DEFAULT_SETTINGS
from incremental_crawler.state.stores.base import StateStore, StateStoreError
from incremental_crawler.uris import redacted

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "StateStore", "StateStoreError", "default_state_uri", "open_existing_store", "open_store",
    "state_uri",
    "state_uri_setting",
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


def open_store(settings: BaseSettings) -> StateStore:
    """Build the store :func:`state_uri` names.

    The scheme picks a class from ``INCREMENTAL_STATE_STORES`` (import paths,
    so a user can plug in a backend of their own); the class is built with
    ``from_uri(uri, settings=settings)``.
    """
    uri = state_uri(settings)
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


def open_existing_store(settings: BaseSettings) -> StateStore:
    """The store a crawl with *settings* uses (:func:`state_uri`: in cluster
    mode, the cluster's Redis), if it exists.

    Opening creates a store that does not exist (a SQLite file, a Redis
    prefix's layout record): reading one must not, or a typo in the URI
    would look like a store that holds nothing.
    """
    uri = state_uri(settings)
    check = state_uri_setting(settings)
    scheme = uri.split(":", 1)[0].lower()
    if scheme == "sqlite":
        from incremental_crawler.state.stores.sqlite import path_from_uri  # noqa: PLC0415

        path = path_from_uri(uri)
        if not path.exists():
            raise StateStoreError(f"no state store at {path} (check {check})")
    elif scheme in ("redis", "rediss", "unix"):
        # Imported here: every crawl imports this module, and Redis's client
        # would cost a crawl on SQLite a tenth of a second at its start.
        import redis  # noqa: PLC0415

        from incremental_crawler.state.stores.redis import parse_redis_uri  # noqa: PLC0415

        clean, prefix = parse_redis_uri(uri)
        client = redis.Redis.from_url(clean, socket_connect_timeout=5, socket_timeout=30)
        try:
            found = client.exists(f"{prefix}:meta")
        except redis.RedisError as exc:
            raise StateStoreError(
                f"State store {redacted(uri)}: cannot be reached ({exc})") from exc
        finally:
            client.close()
        if not found:
            raise StateStoreError(f"no state store under prefix {prefix!r} of "
                                  f"{redacted(clean)} (check {check})")
    return open_store(settings)
