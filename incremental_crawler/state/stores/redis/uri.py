"""The Redis store's URIs: ``redis://host:port/db?prefix=name``, ``rediss://``,
``unix:///path/redis.sock?db=N``, and a Redis Cluster's by its seed nodes,
``redis+cluster://host:port,host:port/?prefix=name`` (``rediss+cluster://``);
a ``redis://`` URL may name a node of a cluster too (see
:mod:`incremental_crawler.redis_cluster`)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit

from incremental_crawler.redis_cluster import _seeds, is_cluster_url
from incremental_crawler.state.stores.base import (
    StateStoreError,
)
from incremental_crawler.uris import redacted

if TYPE_CHECKING:
    from collections.abc import Callable


__all__ = ["DEFAULT_PREFIX", "parse_redis_uri"]

DEFAULT_PREFIX = "incremental"
#: Query parameters of the URI that redis-py understands, besides ``prefix``.
_REDIS_QUERY = frozenset({
    "db", "socket_timeout", "socket_connect_timeout", "socket_keepalive",
    "health_check_interval", "max_connections", "ssl_cert_reqs", "ssl_ca_certs",
    "ssl_certfile", "ssl_keyfile", "ssl_check_hostname", "protocol", "client_name",
})

def parse_redis_uri(uri: str) -> tuple[str, str]:
    """``redis://h:p/db?prefix=x`` → (URI for redis-py, key prefix).

    >>> parse_redis_uri("redis://127.0.0.1:6379/9?prefix=books")
    ('redis://127.0.0.1:6379/9', 'books')
    >>> parse_redis_uri("unix:///run/redis.sock?db=2")
    ('unix:///run/redis.sock?db=2', 'incremental')
    """
    def bad(why: str) -> StateStoreError:
        return StateStoreError(
            f"State store {redacted(uri)}: {why}; use "
            "redis://host:port/db?prefix=name (or rediss://, "
            "unix:///path/redis.sock?db=N, or a Redis Cluster's "
            "redis+cluster://host:port,host:port/?prefix=name)"
        )

    if is_cluster_url(uri):
        return _parse_cluster_uri(uri, bad)
    try:
        parts = urlsplit(uri)
        port = parts.port  # parsed lazily: an invalid port raises here
    except ValueError as exc:
        raise bad(f"not a valid URI ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("redis", "rediss", "unix"):
        raise bad(f"scheme {parts.scheme!r} is not a Redis one")
    query, prefix = _split_query(parts.query, bad)
    if scheme == "unix":
        if not parts.path:
            raise bad("no socket path")
    else:
        if not parts.hostname:
            raise bad("no host")
        if port == 0:
            raise bad("port 0")
        db = parts.path.strip("/")
        # redis-py would silently fall back to db 0 on anything else.
        if db and not db.isdigit():
            raise bad(f"database {db!r} is not a number")
    for name, value in query:
        if name == "db" and not value.isdigit():
            raise bad(f"database {value!r} is not a number")
    # Not urlunsplit: it drops the empty authority of unix:///path.
    clean = f"{scheme}://{parts.netloc}{parts.path}"
    if query:
        clean += f"?{urlencode(query)}"
    return clean, prefix


def _parse_cluster_uri(uri: str, bad: Callable[[str], StateStoreError]) -> tuple[str, str]:
    """``redis+cluster://h1:p1,h2:p2/?prefix=x`` (a Redis Cluster by its seed
    nodes) → (the URL for :func:`~incremental_crawler.redis_cluster.connect`,
    key prefix).

    >>> parse_redis_uri("redis+cluster://10.0.0.1:7000,10.0.0.2:7000/?prefix=books")
    ('redis+cluster://10.0.0.1:7000,10.0.0.2:7000/', 'books')
    """
    head, _, query_string = uri.partition("?")
    query, prefix = _split_query(query_string, bad)
    if any(name == "db" for name, _ in query):
        raise bad("a Redis Cluster has only database 0")
    clean = head + (f"?{urlencode(query)}" if query else "")
    try:
        _seeds(clean)
    except ValueError as exc:
        raise bad(str(exc)) from None
    return clean, prefix


def _split_query(
    query_string: str, bad: Callable[[str], StateStoreError],
) -> tuple[list[tuple[str, str]], str]:
    """The query's redis-py parameters, and the key prefix it names."""
    query: list[tuple[str, str]] = []
    prefixes: list[str] = []
    for name, value in parse_qsl(query_string, keep_blank_values=True):
        if name == "prefix":
            prefixes.append(value)
        elif name in _REDIS_QUERY:
            query.append((name, value))
        else:
            raise bad(f"unknown parameter {name!r}")
    if len(prefixes) > 1 or (prefixes and not prefixes[0]):
        raise bad("give one non-empty prefix")
    return query, prefixes[0] if prefixes else DEFAULT_PREFIX


