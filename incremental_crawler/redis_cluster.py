"""A Redis URL to a client: one Redis server, or a Redis Cluster.

The cluster's coordination keys, the shared politeness budget and
scrapy-redis's queue and dupefilter run on either; :func:`connect` (and
:func:`connect_async`, for the budget) pick the client:

- ``redis+cluster://[[user]:password@]host:port[,host:port...][/0][?opts]``
  (``rediss+cluster://`` for TLS) names a Redis Cluster by one or more of
  its nodes (the others are found from them);
- ``redis://host:port/0`` (``rediss://``) names one server, which may be a
  node of a Redis Cluster: ``INFO cluster`` says so (``cluster_enabled:1``),
  and the cluster client is used, starting from that node. A cluster has
  only database 0: any other number is refused, as is a Unix socket URL
  pointing at a cluster node (the cluster's nodes are found by TCP address);
- anything else (``unix://``) is one server, as redis-py reads it.

Errors a cluster client raises that are not Redis errors, or that mean the
cluster cannot serve for now (``CLUSTERDOWN``, a slot no node serves, no
node reachable), are raised as :class:`ClusterUnavailable`, a
:class:`redis.exceptions.ConnectionError`: "no answer", which every user
rides out for ``INCREMENTAL_REDIS_RETRY_TIME`` as it does a restart of one
server (:mod:`incremental_crawler.redis_retry`), then fails loudly.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from redis import asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ClusterDownError, RedisClusterException

from incremental_crawler.uris import redacted

__all__ = [
    "CLUSTER_SCHEMES", "AnyRedis", "AsyncClusterClient", "ClusterUnavailable",
    "SyncClusterClient", "async_twin", "connect", "connect_async", "is_cluster_url",
    "names_cluster",
]

#: The URL schemes that name a Redis Cluster by its seed nodes.
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


class ClusterUnavailable(redis.exceptions.ConnectionError):
    """The Redis Cluster cannot serve a command now (no node reachable,
    ``CLUSTERDOWN``, a slot no node serves): no answer, ridden out like a
    restart of one server."""


def is_cluster_url(url: str) -> bool:
    """Whether *url* names a Redis Cluster by its form (``redis+cluster://``)."""
    return url.split(":", 1)[0].lower() in CLUSTER_SCHEMES


def _seeds(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """``redis+cluster://u:p@h1:p1,h2:p2/0?opts`` → the seed nodes, and the
    connection options (password, TLS, the query's options) for every node."""
    scheme, rest = url.split("://", 1) if "://" in url else (url, "")
    netloc, _, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    if "?" in netloc:  # redis+cluster://h:p?opts
        netloc, _, query = netloc.partition("?")
    userinfo, _, hosts = netloc.rpartition("@")
    if path.strip("/") not in ("", "0"):
        raise ValueError(f"a Redis Cluster has only database 0, not {path.strip('/')!r}")
    nodes: list[tuple[str, int]] = []
    for seed in hosts.split(","):
        part = seed.strip()
        if not part:
            continue
        try:
            parsed = urlsplit(f"//{part}")
            host, port = parsed.hostname, parsed.port or 6379
        except ValueError as exc:
            raise ValueError(f"seed node {part!r}: {exc}") from None
        if not host:
            raise ValueError(f"seed node {part!r} has no host")
        nodes.append((host, port))
    if not nodes:
        raise ValueError("no seed node (use redis+cluster://host:port[,host:port...]/)")
    base = "rediss" if scheme.lower() == "rediss+cluster" else "redis"
    auth = f"{userinfo}@" if userinfo else ""
    # redis-py reads the options as for one server (the first seed's URL).
    options = redis.connection.parse_url(
        f"{base}://{auth}{nodes[0][0]}:{nodes[0][1]}/0" + (f"?{query}" if query else ""))
    for name in ("host", "port", "db", "path", "connection_class"):
        options.pop(name, None)
    if base == "rediss":
        options["ssl"] = True
    return nodes, options


def _cluster_enabled(info: dict[str, Any]) -> bool:
    return str(info.get("cluster_enabled", "0")) == "1"


def _refuse_db(url: str) -> None:
    """A node of a Redis Cluster named with a database other than 0."""
    parts = urlsplit(url)
    db = parts.path.strip("/") or dict(
        pair.split("=", 1) for pair in parts.query.split("&") if "=" in pair).get("db", "0")
    if parts.scheme.lower() == "unix":
        raise ValueError(f"{redacted(url)} is a node of a Redis Cluster: name it by TCP "
                         "address (redis://host:port/0 or redis+cluster://host:port/)")
    if db not in ("", "0"):
        raise ValueError(f"{redacted(url)} is a node of a Redis Cluster, which has only "
                         f"database 0, not {db}")


def _refuse_cluster_select(url: str, exc: redis.ResponseError) -> None:
    """A cluster node refused to select the URL's database: say why."""
    if "cluster mode" in str(exc):
        _refuse_db(url)


class SyncClusterClient(RedisCluster):
    """redis-py's cluster client whose "cannot serve now" errors are
    :class:`ClusterUnavailable` (see the module docstring)."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)
        except (ClusterDownError, RedisClusterException) as exc:
            raise ClusterUnavailable(f"Redis Cluster: {exc}") from exc


class AsyncClusterClient(AsyncRedisCluster):
    """:class:`SyncClusterClient` for asyncio."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except (ClusterDownError, RedisClusterException) as exc:
            raise ClusterUnavailable(f"Redis Cluster: {exc}") from exc


#: Connection options a cluster client is not given: it refuses ``db``;
#: ``retry_on_timeout`` (in scrapy-redis's default ``REDIS_PARAMS``) is
#: deprecated by redis-py 6 on the client it builds for each node, and does
#: nothing there: a node's connections never retry (their ``Retry`` has no
#: attempts), the cluster client retries timeouts itself, on another node if
#: need be (its ``retry``).
_NOT_FOR_A_CLUSTER = frozenset({"db", "retry_on_timeout"})


def _cluster_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k not in _NOT_FOR_A_CLUSTER}


def _sync_cluster(nodes: list[tuple[str, int]], options: dict[str, Any],
                  kwargs: dict[str, Any]) -> SyncClusterClient:
    try:
        return SyncClusterClient(startup_nodes=[ClusterNode(h, p) for h, p in nodes],
                                 **options, **_cluster_kwargs(kwargs))
    except (ClusterDownError, RedisClusterException) as exc:
        raise ClusterUnavailable(f"Redis Cluster: {exc}") from exc


def connect(url: str, **kwargs: Any) -> redis.Redis | SyncClusterClient:
    """A client for *url*: the cluster client for a Redis Cluster (see the
    module docstring), else ``redis.Redis.from_url(url, **kwargs)``.

    Asks a ``redis://`` server ``INFO cluster`` (one round trip); raises a
    :class:`redis.RedisError` if it cannot, :class:`ValueError` for a URL
    that cannot name what it points at.
    """
    if is_cluster_url(url):
        nodes, options = _seeds(url)
        return _sync_cluster(nodes, options, kwargs)
    client = redis.Redis.from_url(url, **kwargs)
    try:
        if not _cluster_enabled(client.info("cluster")):
            return client
    except redis.ResponseError as exc:
        client.close()
        _refuse_cluster_select(url, exc)
        raise
    except BaseException:
        client.close()
        raise
    client.close()
    return _sync_cluster(*_node_target(url), kwargs)


def _node_target(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """A ``redis://`` URL of a node known to be a cluster's → the seed node
    and the options for every node (what :func:`_seeds` gives for
    ``redis+cluster://``)."""
    _refuse_db(url)
    options = redis.connection.parse_url(url)
    host, port = options.pop("host"), options.pop("port", 6379)
    for name in ("db", "path", "connection_class"):
        options.pop(name, None)
    if urlsplit(url).scheme.lower() == "rediss":
        options["ssl"] = True
    return [(host, port)], options


def async_twin(url: str, client: redis.Redis | SyncClusterClient,
               **kwargs: Any) -> aioredis.Redis | AsyncClusterClient:
    """The asyncio client of what *client* (:func:`connect`'s for *url*)
    talks to, without a round trip: it connects at its first command, in
    the event loop that runs it (a store opened before the reactor runs
    its commands in the reactor's loop)."""
    if not isinstance(client, RedisCluster):
        return aioredis.Redis.from_url(url, **kwargs)
    nodes, options = _seeds(url) if is_cluster_url(url) else _node_target(url)
    try:
        return AsyncClusterClient(startup_nodes=[AsyncClusterNode(h, p) for h, p in nodes],
                                  **options, **_cluster_kwargs(kwargs))
    except (ClusterDownError, RedisClusterException) as exc:
        raise ClusterUnavailable(f"Redis Cluster: {exc}") from exc


async def connect_async(url: str, **kwargs: Any) -> aioredis.Redis | AsyncClusterClient:
    """:func:`connect` for asyncio (the cluster client initialized)."""
    nodes: list[tuple[str, int]]
    if is_cluster_url(url):
        nodes, options = _seeds(url)
    else:
        client = aioredis.Redis.from_url(url, **kwargs)
        try:
            if not _cluster_enabled(await client.info("cluster")):
                return client
        except redis.ResponseError as exc:
            await client.aclose()
            _refuse_cluster_select(url, exc)
            raise
        except BaseException:
            await client.aclose()
            raise
        await client.aclose()
        nodes, options = _node_target(url)
    try:
        cluster = AsyncClusterClient(
            startup_nodes=[AsyncClusterNode(h, p) for h, p in nodes],
            **options, **_cluster_kwargs(kwargs))
    except (ClusterDownError, RedisClusterException) as exc:
        raise ClusterUnavailable(f"Redis Cluster: {exc}") from exc
    try:
        await cluster.initialize()
    except (ClusterDownError, RedisClusterException) as exc:
        await cluster.aclose()
        raise ClusterUnavailable(f"Redis Cluster: {exc}") from exc
    except BaseException:
        await cluster.aclose()
        raise
    return cluster


def names_cluster(url: str, **kwargs: Any) -> bool:
    """Whether *url* is a Redis Cluster (by its form, else by asking the
    server: :func:`connect`'s rule)."""
    client = connect(url, **kwargs)
    try:
        return isinstance(client, RedisCluster)
    finally:
        client.close()


class AnyRedis:
    """scrapy-redis's ``REDIS_PARAMS["redis_cls"]``: ``from_url`` gives
    :func:`connect`'s client (scrapy-redis builds its client with it)."""

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> redis.Redis | SyncClusterClient:
        return connect(url, **kwargs)
