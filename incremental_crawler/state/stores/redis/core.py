"""What every part of the Redis store shares: its two clients (a blocking one
for opening and the reports, a ``redis.asyncio`` one for the crawl), the
names of its keys, how its records are encoded, what a failure is called,
and its round-trips: the crawl's, tried again while Redis does not answer,
and the bounded scans that the layout checks, the repairs and the read-outs
make. The store's parts build on :class:`RedisCore`, so that each one reads
and writes the same keys the same way."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from incremental_crawler import clock
from incremental_crawler.config import DEFAULT_SETTINGS
from incremental_crawler.redis_cluster import async_twin, connect
from incremental_crawler.redis_retry import RedisSilent, Silence
from incremental_crawler.state.records import (
    Change,
    HostTrust,
    ItemRecord,
    PageKey,
    PageState,
    SlotRate,
    StoredVersion,
)
from incremental_crawler.state.stores.base import SlotRates, StateStore, StateStoreError
from incremental_crawler.state.stores.packed import (
    PackedRecordError,
    pack,
    unpack,
)
from incremental_crawler.state.stores.redis.pages import (
    bucket_of,
    host_of_part,
    host_part,
    page_field,
)
from incremental_crawler.state.stores.redis.scripts import (
    _FLUSH_LUA,
    _SCRIPTS,
    _TOKEN_TTL,
    CLUSTER_READ_PAGES_LUA,
    _sha1,
)
from incremental_crawler.uris import redacted

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator, Sequence

__all__ = ["RedisCore"]

#: The store's one logger, named after the module that once held all of
#: the store: log settings that name it keep applying to every part.
logger = logging.getLogger("incremental_crawler.state.stores.redis.store")

_T = TypeVar("_T")

#: Fields per HMGET, and keys per round-trip of a synchronous read.
_HMGET_CHUNK = 1_000
#: What a write refused for memory is called (Redis's own words are vaguer).
OUT_OF_MEMORY = (
    "Redis is out of memory (OOM: its used memory is above its maxmemory, and "
    "maxmemory-policy noeviction refuses writes); nothing more was written: free "
    "memory in Redis or raise its maxmemory, then re-run")

#: A Redis that hangs must not hang the crawl; the URI may set other values.
_DEFAULT_TIMEOUTS = {"socket_connect_timeout": 5.0, "socket_timeout": 30.0}
#: Lua numbers are doubles: larger integers in a page record would not
#: survive the check/redirect upsert (nor cjson's 14 digits, for items).
_LUA_INT_LIMIT = 10**14
#: The numbers of a page record the Lua upserts read and write back.
_LUA_NUMBERS = ("size", "last_status", "first_seen", "last_checked", "last_fetched",
                "last_changed", "checks", "changes", "flags", "lastmod", "interval",
                "next_visit", "churns", "failures")

#: Pages of one host a read script of the cluster layout names at most,
#: and times a read is asked again when its hosts' buckets split meanwhile.
_READ_PAGES = 2_000
_READ_ROUNDS = 8

#: Members asked per ZSCAN step, and steps at most (100 million members).
_SCAN_COUNT = 1000
_SCAN_ROUNDS = 100_000
#: Entries a round of a walk over many hashes asks for in all (its HSCAN
#: steps in one pipeline): about what one step over one hash returns, so
#: that a round holds no more than a hash's walk step by step did.
_SCAN_ROUND_ENTRIES = _SCAN_COUNT


#: Item groups of a scope in the cluster layout: its items spread over
#: this many slots (as its hosts' pages do), each group's keys in one.
ITEM_GROUPS = 1_024


def item_group(name: str) -> int:
    """The item group of an item key (or of a page URL, for the page index)."""
    digest = hashlib.sha1(name.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big") % ITEM_GROUPS


def _group_tag(scope: str, name: str) -> str:
    return f"{{{_key_part(scope)}#{item_group(name)}}}"


#: The host groups of the cluster layout (version 7): a host's keys (its
#: record, buckets, links, write generation) are tagged by its scope and
#: its group, ``{<s>|<g>}``, the host's own name after the tag, so that one
#: phase-2 script a group writes the pages of all the group's hosts a flush
#: wrote (at a thousand hosts a flush of 500 pages was ~500 scripts of one
#: page each, whose per-call work dominated the cluster's CPU a page). A
#: host's group is the first four bytes of the SHA-1 of its key part modulo
#: 64. The parts' own CRC16s differ only in the slot's top six bits (CRC16
#: is linear), so the 64 groups of any scope fall one in each 64th of the
#: slots whatever its name; each starts with ``=``, which a host's key
#: part never has (percent-quoted), so that no group's tag is a host's of
#: layout 6.
HOST_GROUPS = (
    "=j65", "=hqk", "=rk4", "=ajr", "=j2u", "=y33", "=cmd", "=an2", "=wu8", "=d0v", "=ol1",
    "=mog", "=fsh", "=d46", "=gai", "=0ho", "=sh7", "=qka", "=k56", "=irh", "=bng", "=yf9",
    "=c8n", "=xt8", "=no2", "=lld", "=v23", "=e3u", "=fbj", "=1kl", "=gpk", "=e75", "=h4s",
    "=bz5", "=akb", "=ch4", "=h03", "=jwm", "=pm2", "=clt", "=dun", "=fv8", "=ego", "=gd9",
    "=lx6", "=frx", "=mj7", "=oia", "=hay", "=bk7", "=isx", "=cy6", "=he9", "=bow", "=iw8",
    "=ktn", "=ddl", "=3mj", "=evm", "=g13", "=li4", "=fcz", "=t45", "=g5s")
_GROUP_INDEX = {part: k for k, part in enumerate(HOST_GROUPS)}

#: The scope shards of the cluster layout: the keys of a scope that its
#: hosts' page writes change (its hosts, revisit index, splits, sums,
#: checks, and the applied effects behind a repair's) are kept per shard,
#: a host's in its shard. Since layout 8 a scope's shards are its 64 host
#: groups, ``{<s>|<g>}``: a host's shard keys are in its group's slot, so
#: that the group's script applies its pages' effects itself, in the same
#: atomic script as the writes (layouts 6 and 7 had eight shards,
#: ``{<s>^<x>}``, written by a flush's third phase). A shard is named by
#: its index here (the group's in :data:`HOST_GROUPS`).
SCOPE_SHARDS = HOST_GROUPS
#: The eight shards' suffixes of layouts 6 and 7 (``{<s>^<x>}``): only the
#: migration to layout 8 reads them.
OLD_SCOPE_SHARDS = ("la2", "qf7", "lp0", "h85", "fjl", "bfa", "nrv", "bwc")
#: Between a scope's part and its old shard's suffix (layouts 6 and 7):
#: percent-quoted in a scope (``%5E``), so that no scope's own tag is
#: another's shard.
SHARD_MARK = "^"
#: Between a scope's part and its host group's.
GROUP_MARK = "|"
#: Seconds of an hour of a host group's fine sums (cluster layout 8).
FINE_SPAN = 3_600
#: A host group's fine sums are kept in this many hashes,
#: ``P:nvf:{<s>|<g>}:<k>``, a page's sum in the one of its next visit's hour
#: modulo it, each field the visit (its second) and callback: a fixed set
#: of keys the group's scripts are given in KEYS whatever the hours their
#: pages' old records name (an hour a hash was formed in the script, known
#: once it read the record: an undeclared key). 128, not fewer: a hash
#: stays a listpack up to 128 fields (``hash-max-listpack-entries``), and
#: at 1 M pages a scope 32 hashes a group held ~490 fields each, a hash
#: table (243 bytes a page, against 202 an hour a hash; 128: 208).
FINE_KEYS = 128


def fine_part(visit: int) -> int:
    """Which of a group's fine sums' hashes (``P:nvf:{<s>|<g>}:<k>``)
    holds the sums of the next visit *visit* (a second)."""
    return visit // FINE_SPAN % FINE_KEYS


@functools.lru_cache(maxsize=65_536)
def host_group(part: str) -> str:
    """The host group of a host, by its key part (its tag's second half)."""
    digest = hashlib.sha1(part.encode(), usedforsecurity=False).digest()
    return HOST_GROUPS[int.from_bytes(digest[:4], "big") % len(HOST_GROUPS)]


def scope_shard(part: str) -> int:
    """The scope shard of a host, by its key part (:func:`host_part`): its
    host group's index."""
    return _GROUP_INDEX[host_group(part)]


def group_shard(group: str) -> int:
    """The scope shard of a host group (that of each of its hosts): the
    group's own (layout 8)."""
    return _GROUP_INDEX[group]


def old_scope_shard(part: str) -> int:
    """The shard of layouts 6 and 7 (of :data:`OLD_SCOPE_SHARDS`) of a host
    by its key part, or of a host group by its own: only the migration to
    layout 8 reads it."""
    if part in _GROUP_INDEX:
        return _GROUP_INDEX[part] % len(OLD_SCOPE_SHARDS)
    digest = hashlib.sha1(part.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big") % len(OLD_SCOPE_SHARDS)


def host_tag(scope_part: str, part: str) -> str:
    """What a host's keys carry in the cluster layout: its group's tag, then
    the host (``{<s>|<g>}:<h>``)."""
    return f"{{{scope_part}{GROUP_MARK}{host_group(part)}}}:{part}"


def key_tag(key: str) -> str:
    """The hash tag of a key (``{...}``, braces included)."""
    start = key.index("{")
    return key[start:key.index("}", start) + 1]


def shard_part(scope_part: str, shard: int) -> str:
    """The tag's inside of a scope's shard (``<s>|<g>``: its host group's)."""
    return f"{scope_part}{GROUP_MARK}{HOST_GROUPS[shard]}"


def old_shard_part(scope_part: str, shard: int) -> str:
    """The tag's inside of a scope's shard of layouts 6 and 7 (``<s>^<x>``)."""
    return f"{scope_part}{SHARD_MARK}{OLD_SCOPE_SHARDS[shard]}"


def scope_of_shard(part: str) -> str:
    """The scope part of a shard's (:func:`shard_part` reversed)."""
    return part.rpartition(GROUP_MARK)[0]


@functools.lru_cache(maxsize=256)
def _key_part(scope: str) -> str:
    # Percent-quoted: no ':' inside, so P:hist:<s>:<key> splits one way only,
    # and common scope names (spider names) read as they are.
    return quote(scope, safe="")


def _page_range(url: str) -> tuple[bytes, bytes]:
    """ZRANGEBYLEX bounds of the page index members ``url NUL key`` of *url*."""
    head = url.encode()
    return b"[" + head + b"\0", b"(" + head + b"\1"


class RedisCore(StateStore):
    """The clients, keys, record codecs and round-trips of a Redis store
    (see the module docstring); :class:`~.store.RedisStateStore` is the
    store itself."""

    def __init__(self, uri: str, prefix: str) -> None:
        self.prefix = prefix
        query = f"&prefix={prefix}" if "?" in uri else f"?prefix={prefix}"
        self.location = redacted(uri) + query
        #: Network round-trips to Redis so far (one per command or pipeline).
        self.roundtrips = 0
        # EVALSHA names a script by its SHA-1 (what SCRIPT LOAD returns).
        self._script_sha = _sha1(_FLUSH_LUA)
        self._fields = {cls: fields(cls) for cls in (PageState, HostTrust, ItemRecord)}
        # The fields a stored record may hold (the key ones are in the Redis key).
        self._names = {
            PageState: frozenset(f.name for f in self._fields[PageState]) - {"key"},
            HostTrust: frozenset(f.name for f in self._fields[HostTrust]) - {"scope", "host"},
        }
        #: Since when Redis has not answered, and for how long the
        #: crawl-time commands keep trying (:attr:`retry_time`).
        self._silence = Silence(f"State store {self.location}",
                                float(DEFAULT_SETTINGS["INCREMENTAL_REDIS_RETRY_TIME"]))
        #: Redis's hash-max-listpack-value (read on opening; 64 by default).
        self._listpack_value = 64
        #: When Redis's eviction policy was last found safe (checked on
        #: opening, then again by the flushes: see ``_recheck_eviction``),
        #: on the monotonic clock: a wall clock set back would silence it.
        self._eviction_checked = time.monotonic()
        #: Whether a refused INFO (no check possible) was warned of.
        self._eviction_unread_said = False
        # No retries: a transaction whose reply was lost may have run, and
        # running it twice would count checks and item versions twice.
        options: dict[str, Any] = {**_DEFAULT_TIMEOUTS, "retry": Retry(NoBackoff(), 0)}
        try:
            # One server, or a Redis Cluster (named by its seed nodes, or a
            # node whose INFO says so): the cluster's client then, which
            # sends each command to the node of its key's slot.
            self._sync = connect(uri, **options)
            # Bound to the event loop of its first command (the reactor's).
            # Any: a cluster's pipelines are not one server's (no command
            # stack to copy: the cluster layout builds each attempt's).
            self._async: Any = async_twin(
                uri, self._sync, **{**options, "retry": AsyncRetry(NoBackoff(), 0)}
            )
        except ValueError as exc:
            raise self._fail("bad URI", exc) from exc
        except redis.RedisError as exc:
            raise self._fail(
                "cannot be reached or read (is Redis running at this address?)", exc
            ) from exc
        #: Whether the store is on a Redis Cluster (its cluster layout, 6).
        self.cluster = isinstance(self._sync, RedisCluster)
        #: Whether its keys are those of the cluster layout (6): every key
        #: carries a hash tag, per scope ``{<s>}``, per scope shard
        #: ``{<s>^<x>}``, per item group
        #: ``{<s>#<g>}`` (see :mod:`.cluster`). Only on a cluster, for now:
        #: one server keeps layout 4's names (a migration could move it).
        self.tagged = self.cluster

    # -- keys and records ------------------------------------------------------

    def _key(self, kind: str, scope: str) -> str:
        """A key of the scope's own (cluster layout: tagged ``{<s>}``, so that
        every one of them is in one slot)."""
        if self.tagged:
            return f"{self.prefix}:{kind}:{{{_key_part(scope)}}}"
        return f"{self.prefix}:{kind}:{_key_part(scope)}"

    def _shard_key(self, kind: str, scope: str, shard: int) -> str:
        """A key of the scope's shard *shard* (layout 6: ``{<s>^<x>}``);
        on one server the scope's own key (it has no shards)."""
        if self.tagged:
            return f"{self.prefix}:{kind}:{{{shard_part(_key_part(scope), shard)}}}"
        return self._key(kind, scope)

    def _shard_keys(self, kind: str, scope: str) -> list[str]:
        """The key of *kind* of every shard of the scope (layout 6), or the
        scope's one key (one server)."""
        if self.tagged:
            return [self._shard_key(kind, scope, k) for k in range(len(SCOPE_SHARDS))]
        return [self._key(kind, scope)]

    def _host_shard_key(self, kind: str, scope: str, host: str) -> str:
        """The key of *kind* of the shard *host* is in (one server: the
        scope's)."""
        return self._shard_key(kind, scope, scope_shard(host_part(host)))

    def _item_key(self, kind: str, scope: str, item_key: str) -> str:
        """A key of the items (``items``, ``itemver``, ``order``,
        ``bypage``) holding *item_key* (for ``bypage``: the page *item_key*
        names): the scope's one key in layout 4, its item group's in
        the cluster layout (see :func:`item_group`)."""
        if self.tagged:
            return f"{self.prefix}:{kind}:{_group_tag(scope, item_key)}"
        return self._key(kind, scope)

    def _hist_key(self, scope: str, item_key: str) -> str:
        if self.tagged:
            return f"{self.prefix}:hist:{_group_tag(scope, item_key)}:{item_key}"
        return f"{self.prefix}:hist:{_key_part(scope)}:{item_key}"

    def _token_key(self, token: str, tag: str = "") -> str:
        """A flush's token; on a cluster, each script's, in its slot (*tag*)."""
        if tag:
            return f"{self.prefix}:flush:{tag}:{token}"
        return f"{self.prefix}:flush:{token}"

    def _encode(self, record: Any, skip: Sequence[str], *, lua_safe: bool = False) -> str:
        """A dataclass as compact JSON: fields at their default are left out."""
        out: dict[str, Any] = {}
        for f in self._fields[type(record)]:
            if f.name in skip:
                continue
            value = getattr(record, f.name)
            if f.default is not MISSING and value == f.default:
                continue
            if isinstance(value, float):
                value = int(value)  # whole seconds, as in the SQLite store
            if lua_safe and isinstance(value, int) and abs(value) >= _LUA_INT_LIMIT:
                raise self._fail(f"{f.name}={value} is too large for its Lua upserts")
            out[f.name] = value
        return json.dumps(out, separators=(",", ":"), ensure_ascii=False)

    def _decode(self, cls: type, raw: bytes | str, **fixed: Any) -> Any:
        data = json.loads(raw)
        names = self._names[cls]
        if not data.keys() <= names:
            # Fields this code does not know (written by a newer version)
            # are ignored; missing ones take their defaults.
            data = {k: v for k, v in data.items() if k in names}
        return cls(**fixed, **data)

    def _page(self, key: PageKey, raw: bytes) -> PageState:
        try:
            return unpack(key, raw)
        except (PackedRecordError, UnicodeDecodeError) as exc:
            raise self._fail(f"the stored record of {key.url} is damaged", exc) from exc

    def _pack(self, state: PageState) -> bytes:
        for name in _LUA_NUMBERS:
            value = getattr(state, name)
            if value is not None and abs(value) >= _LUA_INT_LIMIT:
                raise self._fail(f"{name}={value} is too large for its Lua upserts")
        return pack(state)

    def _host_key(self, kind: str, scope: str, host: str) -> str:
        """A key of one host of *scope*: its ``{scope|host}`` hash tag on one
        server, its group's ``{scope|group}:host`` in the cluster layout."""
        if self.tagged:
            return f"{self.prefix}:{kind}:{host_tag(_key_part(scope), host_part(host))}"
        return f"{self.prefix}:{kind}:{{{_key_part(scope)}|{host_part(host)}}}"

    def _group_ledger_key(self, scope_part: str, group: str) -> str:
        """A host group's ledger of effects (cluster layouts 6 and 7, which a
        migration reads), by the key
        parts of its scope and group."""
        return f"{self.prefix}:fx:{{{scope_part}|{group}}}"

    def _refuse_forgotten_token(self, since: float) -> None:
        """Refuse to send again, now, a write whose reply was lost at *since*
        when Redis may have forgotten its token (kept ``_TOKEN_TTL``): sent
        again, it could apply its writes twice. Its writes stay staged."""
        if clock.now() - since > _TOKEN_TTL / 2:
            raise StateStoreError(
                f"State store {self.location}: a flush whose reply was lost has waited to "
                f"be sent again for over {_TOKEN_TTL // 7200} hours, close to the "
                f"{_TOKEN_TTL // 3600} hours Redis keeps the token that tells whether it "
                "ran: sent again it could apply its writes twice, so it is not sent. Stop "
                "this crawl: the pages it had not stored are asked again next crawl")

    def _generation_key(self, scope: str, host: str) -> str:
        """The write generation counting *host*'s page and links writes
        (``P:wg``): on one server the scope's one counter (the flush raises
        it once a scope, see flush.lua), in the cluster layout the host's
        own, in its slot (its host script raises it)."""
        if self.tagged:
            return self._host_key("wg", scope, host)
        return self._key("wg", scope)

    def _bucket_key(self, scope: str, host: str, bucket: int, *, large: bool = False) -> str:
        """A bucket's hash of pages (its listpack), or of its large entries."""
        return f"{self._host_key('pgl' if large else 'pg', scope, host)}:{bucket}"

    def _bucket_keys(self, scope: str, host: str, bucket: int) -> tuple[str, str]:
        return (self._bucket_key(scope, host, bucket),
                self._bucket_key(scope, host, bucket, large=True))

    def _page_args(self, key: PageKey) -> tuple[str, str, str]:
        """What a page write or read names the page by: scope and host key
        parts, and the page's field."""
        host, field = page_field(key)
        return _key_part(key.scope), host_part(host), field

    def _page_op(self, state: PageState) -> tuple[Any, ...]:
        # The revisit index: the pages that know their callback (gone ones
        # too: their next visit is their rare recheck).
        indexed = state.callback is not None
        return ("page", *self._page_args(state.key), self._pack(state),
                int(state.next_visit) if indexed else "")

    # -- failures --------------------------------------------------------------

    def _fail(self, what: str, exc: BaseException | None = None) -> StateStoreError:
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            # Refused before anything ran: said as what it is, not as
            # "unreachable" or a failed command.
            return StateStoreError(f"State store {self.location}: {OUT_OF_MEMORY}")
        detail = f": {exc}" if exc else ""
        return StateStoreError(f"State store {self.location}: {what}{detail}")

    # -- async plumbing --------------------------------------------------------

    async def _again(self, attempt: Callable[[], Awaitable[_T]]) -> _T:
        """``await attempt()``, again while Redis does not answer (down,
        restarting, loading its data), for up to :attr:`retry_time` seconds
        since it last answered (:class:`~incremental_crawler.redis_retry.Silence`);
        then a :class:`StateStoreError` saying so.

        Safe for every crawl-time command: reads and holds are idempotent,
        and a flush sent again is known by its token (what Redis applied of
        it is not applied twice).
        """
        try:
            return await self._silence.again(attempt)
        except RedisSilent as exc:
            raise self._fail(exc.what, exc.cause) from exc.cause

    @property
    def retry_time(self) -> float:
        """Seconds the crawl-time commands keep trying a Redis that does not
        answer (INCREMENTAL_REDIS_RETRY_TIME)."""
        return self._silence.bound

    @retry_time.setter
    def retry_time(self, seconds: float) -> None:
        self._silence.bound = seconds

    async def _run(self, pipe: Any) -> list[Any]:
        try:
            return await self._run_raw(pipe)
        except redis.RedisError as exc:
            raise self._fail("Redis command failed", exc) from exc

    async def _run_raw(self, pipe: Any) -> list[Any]:
        """:meth:`_run`, Redis's errors left as they are."""
        # A pipeline forgets its commands once executed, failed or not: each
        # attempt gets a copy of them.
        stack, transaction = list(pipe.command_stack), pipe.is_transaction

        async def attempt() -> list[Any]:
            again = self._async.pipeline(transaction=transaction)
            again.command_stack = list(stack)
            self.roundtrips += 1
            return await again.execute()

        return await self._again(attempt)

    async def _commands(self, commands: list[tuple[Any, ...]],
                        what: str = "read failed") -> list[Any]:
        """Commands in one pipelined round-trip (not a transaction), again
        while Redis does not answer; the first error raised. On a cluster
        the client sends each node its own (its pipelines keep no command
        stack to send again: each attempt builds one)."""
        async def attempt() -> list[Any]:
            pipe = self._async.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            self.roundtrips += 1
            return await pipe.execute()

        try:
            return await self._again(attempt)
        except redis.RedisError as exc:
            raise self._fail(what, exc) from exc

    async def _eval_many(self, calls: list[tuple[str, list[str], list[Any]]],
                         plain: Sequence[tuple[Any, ...]] = ()) -> list[Any]:
        """Run scripts (text, keys, arguments) and plain commands in one
        pipeline: the cluster client sends each node its own. Replies in
        order, errors as exceptions in their place; a node that forgot a
        script (restarted, or took the slot over) is sent every script
        once, and the scripts it refused are sent again (they did not run).
        Sent again while the cluster does not answer (see ``_again``): every
        write script is known by its token."""

        async def attempt() -> list[Any]:
            pipe = self._async.pipeline(transaction=False)
            for script, keys, args in calls:
                pipe.execute_command("EVALSHA", _sha1(script), len(keys), *keys, *args)
            for command in plain:
                pipe.execute_command(*command)
            self.roundtrips += 1
            return await pipe.execute(raise_on_error=False)

        replies = await self._again(attempt)
        missing = [n for n, reply in enumerate(replies[:len(calls)])
                   if isinstance(reply, redis.exceptions.NoScriptError)]
        if missing:
            for script in {calls[n][0] for n in missing}:
                self.roundtrips += 1
                await self._async.script_load(script)
            again = await self._eval_many([calls[n] for n in missing])
            for n, reply in zip(missing, again, strict=True):
                replies[n] = reply
        return replies

    async def _cluster_read_pages(self, keys: list[PageKey]) -> list[bytes | None]:
        """The stored records of *keys*, in order: one script per host
        (per chunk of a host's pages), pipelined; a host whose bucket count
        changed since it was read is asked again."""
        by_host: dict[tuple[str, str], list[tuple[int, str]]] = {}
        for n, key in enumerate(keys):
            host, name = page_field(key)
            by_host.setdefault((key.scope, host), []).append((n, name))
        out: list[bytes | None] = [None] * len(keys)
        counts = await self._host_counts(list(by_host))
        pending = list(by_host)
        for _ in range(_READ_ROUNDS):
            calls, plans = [], []
            for scope, host in pending:
                n = counts[scope, host][0]
                pages = by_host[scope, host]
                for at in range(0, len(pages), _READ_PAGES):
                    chunk = pages[at:at + _READ_PAGES]
                    buckets = sorted({bucket_of(name, n) for _, name in chunk})
                    index = {b: i for i, b in enumerate(buckets)}
                    declared = [self._host_key("hd", scope, host)]
                    for b in buckets:
                        declared.extend(self._bucket_keys(scope, host, b))
                    args: list[Any] = [n]
                    for _, name in chunk:
                        args += [name, index[bucket_of(name, n)]]
                    calls.append((CLUSTER_READ_PAGES_LUA, declared, args))
                    plans.append(((scope, host), chunk))
            replies = await self._eval_many(calls)
            pending = []
            for (host_id, chunk), reply in zip(plans, replies, strict=True):
                if isinstance(reply, Exception):
                    raise self._fail("read failed", reply)
                if reply and reply[0] == b"n":
                    counts[host_id] = (int(reply[1]), counts[host_id][1])
                    if host_id not in pending:
                        pending.append(host_id)
                    continue
                for (n, _), raw in zip(chunk, reply, strict=True):
                    out[n] = raw
            if not pending:
                return out
        raise self._fail("reading pages did not settle: their hosts' buckets kept splitting")

    async def _host_counts(self, hosts: list[tuple[str, str]]) -> dict[tuple[str, str],
                                                                       tuple[int, int]]:
        """Each host's bucket count and page count (``hd``'s ``n``, ``p``)."""
        if not hosts:
            return {}
        replies = await self._eval_many([], [
            ("HMGET", self._host_key("hd", scope, host), "n", "p") for scope, host in hosts])
        counts = {}
        for host_id, reply in zip(hosts, replies, strict=True):
            if isinstance(reply, Exception):
                raise self._fail("read failed", reply)
            n, p = reply
            counts[host_id] = (_whole(n, 1), _whole(p, 0))
        return counts

    async def _call(self, *args: Any) -> Any:
        async def attempt() -> Any:
            self.roundtrips += 1
            return await self._async.execute_command(*args)

        try:
            return await self._again(attempt)
        except redis.RedisError as exc:
            raise self._fail("read failed", exc) from exc

    async def _read_scripts(self, calls: list[tuple[str, list[Any]]]) -> list[Any]:
        """Run read scripts (a SHA-1 and its arguments each) in one
        pipelined round-trip; a Redis that forgot them (restarted) is sent
        them once, then asked again."""
        for attempt in range(2):
            pipe = self._async.pipeline(transaction=False)
            for sha, args in calls:
                pipe.execute_command("EVALSHA", sha, 0, *args)
            try:
                return await self._run_raw(pipe)
            except redis.exceptions.NoScriptError:
                if attempt:
                    raise
                pipe = self._async.pipeline(transaction=False)
                for script in _SCRIPTS:
                    pipe.script_load(script)
                await self._run(pipe)
            except redis.RedisError as exc:
                raise self._fail("read failed", exc) from exc
        raise AssertionError("unreachable")

    async def _read_script(self, sha: str, args: list[Any]) -> Any:
        """Run one read script (:meth:`_read_scripts` without a pipeline)."""

        async def attempt() -> Any:
            self.roundtrips += 1
            try:
                return await self._async.evalsha(sha, 0, *args)
            except redis.exceptions.NoScriptError:
                self.roundtrips += 1
                script = next(s for s in _SCRIPTS if _sha1(s) == sha)
                return await self._async.eval(script, 0, *args)

        try:
            return await self._again(attempt)
        except redis.RedisError as exc:
            raise self._fail("read failed", exc) from exc

    # -- synchronous reads and scans -------------------------------------------

    def _sync_run(self, pipe: Any) -> list[Any]:
        self.roundtrips += 1
        try:
            return pipe.execute()
        except redis.RedisError as exc:
            raise self._fail("read failed", exc) from exc

    def _stored_scopes(self) -> list[str]:
        pipe = self._sync.pipeline(transaction=False)
        pipe.smembers(f"{self.prefix}:scopes")
        [members] = self._sync_run(pipe)
        return sorted(m.decode() for m in members)

    def _hscan(self, key: str, match: str | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Every field and value of the hash *key* (bounded steps)."""
        cursor = 0
        for _ in range(_SCAN_ROUNDS):
            self.roundtrips += 1
            try:
                reply: Any = self._sync.hscan(key, cursor, match=match, count=_SCAN_COUNT)
            except redis.RedisError as exc:
                raise self._fail("read failed", exc) from exc
            cursor, pairs = reply
            yield from pairs.items()
            if cursor == 0:
                return
        raise self._fail(f"scanning {key} did not finish")

    def _hscan_many(self, keys: list[str]) -> Iterator[tuple[bytes, bytes]]:
        """Every field and value of the hashes *keys* (an item kind's
        groups, on a cluster), walked together: their sizes first, then
        rounds of HSCAN steps, not a round trip a step of each hash in turn.
        Each time every primary is sent its part as one plain pipeline
        (:meth:`_on_primaries`): a round trip a primary. A round's steps ask
        for about :data:`_SCAN_ROUND_ENTRIES` entries in all (each hash for
        what it has left, :data:`_SCAN_COUNT` at most): a round holds about
        what one step of :meth:`_hscan` holds, and an empty hash costs no
        step. A small hash's step returns it whole (Redis walks a listpack
        in one step, whatever COUNT says): at most its size, counted.

        Not a snapshot. A hash that was empty when the sizes were read is
        not walked at all, so fields written to it after that are not
        found; a hash walked may miss fields written behind its cursor, as
        any HSCAN may. Enough for a repair, which holds its scope (no crawl
        writes meanwhile); ``url_record`` never promised more."""
        # What each hash still holds, as far as its size said (fields
        # written meanwhile: at least one more step while its cursor runs).
        sizes = self._on_primaries(keys, lambda pipe, key: pipe.hlen(key))
        left = {key: int(n) for key, n in zip(keys, sizes, strict=True) if n}
        cursors = dict.fromkeys(left, 0)
        steps = dict.fromkeys(left, 0)
        while cursors:
            batch: list[str] = []
            asked = 0
            for key in cursors:
                want = min(max(left[key], 1), _SCAN_COUNT)
                if batch and asked + want > _SCAN_ROUND_ENTRIES:
                    break
                batch.append(key)
                asked += want
            replies = self._on_primaries(
                batch, lambda pipe, key: pipe.hscan(key, cursors[key], count=_SCAN_COUNT))
            for key, (cursor, pairs) in zip(batch, replies, strict=True):
                yield from pairs.items()
                steps[key] += 1
                if cursor == 0:
                    del cursors[key]
                elif steps[key] >= _SCAN_ROUNDS:
                    raise self._fail(f"scanning {key} did not finish")
                else:
                    cursors[key] = cursor
                    left[key] -= len(pairs)

    def _on_primaries(self, keys: list[str],
                      command: Callable[[Any, str], object]) -> list[Any]:
        """``command(pipe, key)`` for each of *keys* (cluster layout), each
        primary's share in one plain pipeline on that primary's own
        connection, the primaries one after the other: the replies in the
        order of *keys*; the first error, or a primary that does not answer,
        fails the whole as a :class:`StateStoreError`.

        Not the cluster client's pipeline: when a node does not answer, that
        one sends the node's commands again one at a time, each waiting out
        the timeout (hundreds of timeouts for a walk of the item groups,
        hours at the store's timeouts, with the repair holding its scope).
        Here the first timeout ends it. A slot that moved meanwhile
        (resharding, failover) is answered MOVED or ASK: not followed, a
        :class:`StateStoreError` saying to run it again (the client's slot
        table is set right for that run)."""
        cluster: Any = self._sync
        by_node: dict[str, tuple[Any, list[int]]] = {}
        try:
            for n, key in enumerate(keys):
                node = cluster.get_node_from_key(key)
                by_node.setdefault(node.name, (node, []))[1].append(n)
        except redis.exceptions.RedisClusterException as exc:
            # A slot no primary serves (as far as the client knows).
            raise self._fail("read failed", exc) from exc
        replies: list[Any] = [None] * len(keys)
        for node, places in by_node.values():
            pipe = cluster.get_redis_connection(node).pipeline(transaction=False)
            for n in places:
                command(pipe, keys[n])
            self.roundtrips += 1
            try:
                answers = pipe.execute()
            except (redis.exceptions.MovedError, redis.exceptions.AskError) as exc:
                if isinstance(exc, redis.exceptions.MovedError):
                    cluster.nodes_manager.move_slot(exc)
                raise self._fail("read failed: a slot moved during the walk (the cluster "
                                 "is being resharded or failed over); run it again", exc) from exc
            except redis.RedisError as exc:
                raise self._fail(f"read failed on {node.name}", exc) from exc
            for n, answer in zip(places, answers, strict=True):
                replies[n] = answer
        return replies

    def _scan_keys(self, match: str) -> list[str]:
        """Every key matching the glob *match* (bounded steps); on a
        cluster, on every primary (each holds the keys of its slots)."""
        return sorted({key for page in self._scan_pages(match) for key in page})

    def _scan_pages(self, match: str) -> Iterator[list[str]]:
        """The keys matching the glob *match* one SCAN page at a time
        (bounded steps; on a cluster every primary's in turn), for a walk
        over more keys than are worth holding at once. A key may come twice
        (SCAN's own guarantee): the caller's steps can be done again."""
        if not self.cluster:
            nodes: list[Any] = [self._sync]
        else:
            cluster: Any = self._sync
            nodes = [cluster.get_redis_connection(node) for node in cluster.get_primaries()]
        for client in nodes:
            cursor = 0
            for _ in range(_SCAN_ROUNDS):
                self.roundtrips += 1
                try:
                    reply: Any = client.scan(cursor, match=match, count=_SCAN_COUNT)
                except redis.RedisError as exc:
                    raise self._fail("read failed", exc) from exc
                cursor, keys = reply
                yield [k.decode() for k in keys]
                if cursor == 0:
                    break
            else:
                raise self._fail(f"scanning the keys {match} did not finish")

    def _scan_set(self, key: str) -> list[bytes]:
        """Every member of the set *key* (bounded steps)."""
        found: set[bytes] = set()
        cursor = 0
        for _ in range(_SCAN_ROUNDS):
            self.roundtrips += 1
            try:
                reply: Any = self._sync.sscan(key, cursor, count=_SCAN_COUNT)
            except redis.RedisError as exc:
                raise self._fail("read failed", exc) from exc
            cursor, members = reply
            found.update(members)
            if cursor == 0:
                return sorted(found)
        raise self._fail(f"scanning {key} did not finish")

    def _scope_hosts(self, scope: str) -> list[str]:
        """The hosts of *scope* with pages or links records stored (every
        shard's, on a cluster: the 64 groups' sets walked together, a step
        of each in one pipeline, so a round trip a primary a step, not a
        group)."""
        keys = self._shard_keys("hs", scope)
        if len(keys) == 1:
            return [host_of_part(m.decode()) for m in self._scan_set(keys[0])]
        found: dict[str, set[bytes]] = {key: set() for key in keys}
        cursors: dict[str, Any] = dict.fromkeys(keys, 0)
        for _ in range(_SCAN_ROUNDS):
            if not cursors:
                break
            pipe = self._sync.pipeline(transaction=False)
            for key, cursor in cursors.items():
                pipe.sscan(key, cursor, count=_SCAN_COUNT)
            steps = self._sync_run(pipe)
            walked, cursors = cursors, {}
            for key, (cursor, members) in zip(walked, steps, strict=True):
                found[key].update(members)
                if int(cursor) != 0:
                    cursors[key] = cursor
        else:
            if cursors:
                raise self._fail(f"scanning {sorted(cursors)[0]} did not finish")
        return [host_of_part(m.decode()) for key in keys for m in sorted(found[key])]

    def _bucket_counts(self, scope: str, hosts: list[str]) -> dict[str, int]:
        """Each host's number of buckets."""
        counts: dict[str, int] = {}
        for start in range(0, len(hosts), _HMGET_CHUNK):
            chunk = hosts[start:start + _HMGET_CHUNK]
            pipe = self._sync.pipeline(transaction=False)
            for host in chunk:
                pipe.hget(self._host_key("hd", scope, host), "n")
            for host, n in zip(chunk, self._sync_run(pipe), strict=True):
                counts[host] = int(n or 1)
        return counts

    def _buckets(self, scope: str) -> list[tuple[str, int]]:
        """Every bucket of *scope*, as (host, number)."""
        counts = self._bucket_counts(scope, self._scope_hosts(scope))
        return [(host, b) for host, n in counts.items() for b in range(n)]

    def _iter_bucket_pages(self, scope: str,
                           buckets: list[tuple[str, int]]) -> Iterator[tuple[str, bytes, bytes]]:
        """(host, field, record) of every page of *buckets*, a few buckets a
        round-trip (each holds some dozens of pages)."""
        for start in range(0, len(buckets), _SCAN_COUNT // 10):
            chunk = buckets[start:start + _SCAN_COUNT // 10]
            pipe = self._sync.pipeline(transaction=False)
            for host, b in chunk:
                for key in self._bucket_keys(scope, host, b):
                    pipe.hgetall(key)
            replies = self._sync_run(pipe)
            for n, (host, _) in enumerate(chunk):
                for pages in replies[2 * n:2 * n + 2]:
                    for field, raw in pages.items():
                        yield host, field, raw

    def _fine_sums_keys(self, scope: str) -> list[str]:
        if self.tagged:
            return self._shard_scan_keys("nvf", scope)
        return self._scan_keys(f"{_glob(self._key('nvf', scope))}:*")

    def _shard_scan_keys(self, kind: str, scope: str) -> list[str]:
        """The keys ``P:<kind>:{<s>|<g>}:<anything>`` of every scope shard
        of *scope* (cluster layout), in one scan of every primary."""
        head = f"{self.prefix}:{kind}:{{{_key_part(scope)}{GROUP_MARK}"
        tags = {f"{{{shard_part(_key_part(scope), k)}}}" for k in range(len(SCOPE_SHARDS))}
        return [key for key in self._scan_keys(f"{_glob(head)}*}}:*")
                if key[len(self.prefix) + len(kind) + 2:].partition(":")[0] in tags]


def _whole(raw: bytes | None, default: int) -> int:
    """A count as stored (its default if absent or not a number)."""
    try:
        return default if raw is None else int(raw)
    except ValueError:
        return default


def _slot_rates(scope: str, raw: dict[bytes, bytes]) -> SlotRates:
    """A scope's remembered rates from its ``slots`` hash; a record that
    cannot be read is named, not raised."""
    found = SlotRates([], [])
    for slot_raw, value in sorted(raw.items()):
        slot = slot_raw.decode(errors="replace")
        try:
            data = json.loads(value)
            record = SlotRate(scope, slot, data["rate"], data["slow_start"],
                              data["saved_at"], data.get("ended", ""))
        except (ValueError, TypeError, KeyError, AttributeError):
            found.unreadable.append(slot)
            continue
        if record.readable():
            found.rates.append(record)
        else:
            found.unreadable.append(slot)
    return found


def _stored_version(scope: str, item_key: str, number: int,
                    stored: dict[str, Any]) -> StoredVersion:
    """A history entry read back. It names its change only when that is not
    the one an entry without it reads as (what entries stored before the
    change feed read as)."""
    change = stored.get("change") or (Change.NEW if number == 1 else Change.CHANGED)
    return StoredVersion(scope, item_key, number, str(change), stored["stored_at"],
                         stored["fingerprint"], stored["data"])


def _glob(text: str) -> str:
    """*text* matched literally in a Redis glob pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
