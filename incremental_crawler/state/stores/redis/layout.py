"""The Redis store's layout: what ``P:meta`` must say for a prefix to be
opened, what the server must be (its version, its eviction policy, its
memory), and the migrations that bring a prefix of an older layout to this
one in place, one process at a time under a lock. All of it runs once, when
the store opens, before any crawl-time command; apart from the store so that
the layout's history (what each version changed, and how a prefix moves on
from it) reads in one place."""

from __future__ import annotations

import json
import math
import time
import uuid
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import redis
from redis.cluster import RedisCluster

from incremental_crawler.state.records import PageKey, PageState
from incremental_crawler.state.stores.redis.core import (
    GROUP_MARK,
    HOST_GROUPS,
    OUT_OF_MEMORY,
    SHARD_MARK,
    RedisCore,
    _glob,
    _key_part,
    fine_part,
    host_group,
    host_tag,
    key_tag,
    logger,
    old_scope_shard,
    old_shard_part,
)
from incremental_crawler.state.stores.redis.due import _DUE_BUCKETS
from incremental_crawler.state.stores.redis.ledger_entry import entry_of, read_entry
from incremental_crawler.state.stores.redis.pages import host_part
from incremental_crawler.state.stores.redis.scripts import (
    _BYPAGE_TO_ZSET_LUA,
    _RENEW_LUA,
    _SCRIPTS,
    _SUMS_BUILD_LUA,
    _UNLOCK_LUA,
    CLUSTER_REGROUP_LUA,
    CLUSTER_SCRIPTS,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["CLUSTER_LAYOUT_VERSION", "LAYOUT", "LAYOUT_VERSION", "MIN_REDIS_VERSION",
           "RedisLayout"]

#: Written to ``P:meta``; a prefix holding another layout is refused. A
#: name, not a module path: it stays as the first stores wrote it.
LAYOUT = "incremental_crawler.state"
#: Bumped when the key layout changes incompatibly (with a migration here).
#: Additions older code can ignore are no change: ``P:links:<s>`` and the
#: page records' ``recipe`` came without one (a prefix without them reads as
#: pages with no links record and no recipe), and neither did the change
#: feed's items' ``page``, ``born`` and ``died`` and the history entries'
#: ``change`` (a prefix without them reads as items of the page of their
#: key, of unknown live runs, versions new for version 1, else changed).
#: Gone pages in ``P:due:<s>`` were no change either (code before them
#: skips gone pages it reads there; ``P:meta`` notes when a prefix's older
#: gone pages were added). Nor were the write generations (``P:wg``) and
#: the walk memos (``P:memo``; see :mod:`.memo`): an absent counter reads as
#: 0 and no memo, and older code neither reads nor deletes them. It does
#: not raise them either: a page written by an older worker leaves a memo
#: standing that it should have made stale, so no older worker may write
#: a prefix beside newer ones (docs/cluster.md says so to the upgrader; a
#: version bump would refuse older workers, at the price of a migration
#: for nothing else).
#: Version 2: ``P:bypage:<s>`` became a sorted set (a hash of JSON lists in
#: version 1; :meth:`RedisLayout._migrate` converts it).
#: Version 3: pages in packed records, in buckets per host, the links per
#: host, the revisit index one of buckets (``P:pages:<s>``, ``P:links:<s>``
#: and ``P:due:<s>`` before; ``_migrate`` moves them). A field added to a
#: page record takes a new bit of its mask: no layout change (see
#: :mod:`~incremental_crawler.state.stores.packed`).
#: Version 4: each scope's pages with a callback in sums by next visit
#: (``P:nvs:<s>``, ``P:nvf:<s>:<minute>``), kept by every page write, and
#: its checks since its last crawl's start (``P:nvm:<s>``, ``P:ck:<s>``):
#: a summary reads those, not every page (``_migrate`` builds them once;
#: code of layout 3 would write pages without them).
LAYOUT_VERSION = 4
#: Version 5, the first cluster layout: every key tagged (a scope's own
#: keys ``{<s>}``, the items by group ``{<s>#<g>}``), the flush in phases
#: (see :mod:`.cluster`). Version 6: as 5, but what
#: the flush's last phase writes of a scope (its hosts, revisit index,
#: splits, sums, checks, intents, applied effects) per scope shard
#: ``{<s>^<x>}`` (see :data:`~.core.SCOPE_SHARDS`). Only a store on a Redis
#: Cluster is of them (none existed before 5: the store refused a cluster),
#: and one server keeps layout 4 until a migration moves it. A version-5
#: store is refused, not migrated (the cluster layout is opt-in). The
#: delivery marks moved from the scope's own slot to the item groups
#: without a new version: code of version 6 before kept them in the scope's
#: slot, whence newer code moves them when it lists the crawls waiting (see
#: :mod:`.cluster`); no worker of the code before may run beside it.
#: Version 7: a host's keys (record, buckets, links, write generation) tagged
#: by its host group, ``{<s>|<g>}:<h>`` (see :data:`~.core.HOST_GROUPS`),
#: its group's ledger ``P:fx:{<s>|<g>}`` one for the group's hosts, the
#: write-ahead intents naming groups: a flush's phase 2 is one script a
#: group, not a host (at 1,000 hosts a flush of 500 pages was ~500
#: scripts, whose per-call work dominated the cluster's CPU a page). A
#: store of version 6 is migrated in place (:meth:`RedisLayout._migrate_cluster`).
#: Version 8: a scope's shards are its 64 host groups (``{<s>|<g>}``, the
#: eight ``{<s>^<x>}`` before): a host's revisit index, sums, checks and
#: listing are in its group's slot, and the group's script of phase 2
#: applies them itself, with no ledger, intents or phase 3 for them.
CLUSTER_LAYOUT_VERSION = 8
#: The first cluster layout (see CLUSTER_LAYOUT_VERSION).
_FIRST_CLUSTER_LAYOUT = 5
#: The cluster layouts a store is migrated from (older ones are refused).
_MIGRATED_CLUSTER_LAYOUTS = (6, 7)
#: The host groups' parts (a key's tag names one: see _regroup_scopes).
_GROUPS = frozenset(HOST_GROUPS)
#: Seconds of a minute of the sums (as SUM_MINUTE in sums.lua).
_SUM_MINUTE = 60
#: A migration to layout 8 recounts a host group's pages this many buckets
#: a script (bounded work a call, the lock renewed between calls).
_REGROUP_BUCKETS = 256
#: ... and logs its progress within a group every this many scripts: a
#: scope of one huge host is one group, whose recount can take minutes.
_REGROUP_PROGRESS = 64
#: ``P:nvm`` field of a host group whose keys a migration to layout 8 built
#: (its sums written in the same transaction): a migration resumed does
#: not read its pages again (building it again would write the same: its
#: sums are set whole, HSET, not added to). Kept afterwards, a field
#: nothing else reads.
_REGROUPED = "regrouped"
#: The keys of layouts 6 and 7 of a scope's eight shards (``{<s>^<x>}``)
#: and of the host groups' ledgers, which layout 8 no longer keeps (what
#: they held is recounted from the pages).
_OLD_SHARD_KINDS = frozenset({"dueb", "splits", "hs", "nvs", "nvf", "nvm", "ck", "duer",
                              "fxdone", "fxheld", "fxhosts"})
#: A host's keys of the cluster layout a migration renames (6 → 7).
_HOST_KINDS = frozenset({"hd", "ln", "wg", "pg", "pgl"})
#: ``P:meta`` field: the layout version a migration under way started from
#: (see :meth:`RedisLayout._migrate`).
_UPGRADING = "upgrading"
#: A migration's lock lapses this long after its last step (a process that
#: died); others wait for it this many times this long at most.
_MIGRATION_LOCK_TTL = 120
_MIGRATION_WAITS = 1_200
_MIGRATION_WAIT = 0.5
#: How long after its write-ahead intent a flush's phase 2 may still write
#: (the cluster path's adopt_after // 2: past it the group's or host's
#: script refuses, 'late'): an intent younger than this may be a live
#: worker's flush in flight, and a migration is refused while one is there.
_LIVE_INTENT = 300
#: A scope's live holds (P:holds: holder -> when it lapses, on the server's
#: clock) or its intents (P:fxhosts: scored by the server's TIME at their
#: write) younger than ARGV[1] seconds: the seconds until the last of them
#: lapses (its score plus ARGV[1], on the key's node's clock), 0 for none.
_LIVE_LUA = """#!lua flags=no-writes
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local last = redis.call('ZRANGE', KEYS[1], 0, 0, 'REV', 'WITHSCORES')
if #last == 0 then return 0 end
local left = tonumber(last[2]) + tonumber(ARGV[1]) - now
if left <= 0 then return 0 end
return math.ceil(left)
"""
#: The keys a cluster migration (6 or 7 -> 8) reads or writes by their
#: kind, not copied whole (DUMP, RESTORE): by the kind in their name, the
#: tags they are checked under (``any``; ``old``: an old scope shard's,
#: ``{<s>^<x>}``; ``group``: a host group's, ``{<s>|<g>}``), the type each
#: must have and what it is. One of another type (damaged) would stop the
#: migration midway, the version raised, with a bare WRONGTYPE that names
#: no key. The old shards' other keys are deleted, never read: not checked.
_HOST_RECORD = "a host's record"
_OLD_SHARD_META = "an old scope shard's meta (its mark of the run is read)"
_MIGRATION_KEY_TYPES = {
    "fx": ("any", "hash", "a ledger of flushes' effects"),
    "fxheld": ("any", "hash", "a scope shard's applied tokens held"),
    "fxhosts": ("any", "zset", "a scope shard's write-ahead intents"),
    "holds": ("any", "zset", "a scope's holds"),
    # Every host's record (its bucket count read) and buckets (every page
    # read by the recount).
    "hd": ("any", "hash", _HOST_RECORD),
    "pg": ("any", "hash", "a bucket of a host's pages"),
    "pgl": ("any", "hash", "a bucket of a host's links records"),
    # The old shard's mark of the run, read and copied to its groups.
    "nvm": ("old", "hash", _OLD_SHARD_META),
    # What the recount writes in a group (there already when a migration
    # cut short is resumed).
    "dueb": ("group", "zset", "a host group's revisit index"),
    "ck": ("group", "zset", "a host group's checks since the mark"),
    "hs": ("group", "set", "a host group's hosts"),
    "nvs": ("group", "hash", "a host group's sums"),
    "nvf": ("group", "hash", "a host group's fine sums"),
}
#: ... and a host group's meta (``nvm`` under a group's tag).
_GROUP_META_TYPE = ("hash", "a host group's meta")
#: Pages (or links records) per flush of a migration.
_MIGRATION_BATCH = 2_000
#: The oldest Redis the store runs on: its scripts carry flags (``#!lua``),
#: which Redis 7.0 introduced; an older Redis is refused when the store opens.
MIN_REDIS_VERSION = (7, 0)


#: Refusing a Redis that may evict keys (see :func:`_evicts`).
_EVICTS = ("{where} evicts keys when full (maxmemory-policy {policy}, maxmemory {limit}): "
           "stored state, or the records that make a write sent again apply once (they "
           "expire), would vanish silently; set maxmemory-policy noeviction (the store "
           "needs a Redis of its own if other applications rely on eviction)")

#: Warning of a Redis whose policy would evict but that has no maxmemory.
_WOULD_EVICT = ("State store %s: %s has maxmemory-policy %s but no maxmemory (0): it "
                "never evicts now, but would evict the store's keys once a maxmemory is "
                "set (stored state lost silently, writes sent again applied twice); set "
                "maxmemory-policy noeviction, or give the store a Redis of its own")


#: Seconds between two checks of the eviction policy during a crawl (by the
#: flushes): an operator, or a failover to a replica configured otherwise,
#: can make Redis evict after the store opened. One ``INFO memory`` (one a
#: primary on a cluster) a minute costs nothing beside the flushes; a
#: policy changed is seen within a minute of a flush.
EVICTION_RECHECK = 60.0


#: What INFO meets while a cluster fails over (all of them ResponseErrors
#: in redis-py, as a refusal is): not a refusal, the check made again.
_FAILING_OVER = (redis.exceptions.ClusterError, redis.exceptions.TryAgainError,
                 redis.exceptions.AskError)


def _eviction_policy(memory: dict[str, Any]) -> str:
    """``INFO memory``'s ``maxmemory_policy`` when it is one that evicts
    (any but noeviction; '' when it does not say or does not evict)."""
    policy = str(memory.get("maxmemory_policy", ""))
    return "" if policy in ("", "noeviction") else policy


def _evicts(memory: dict[str, Any]) -> bool:
    """Whether Redis may evict keys (by its ``INFO memory``): a policy but
    noeviction with a maxmemory set (or not said: taken as set).
    allkeys-* evicts any key; volatile-* the keys with a TTL, and the
    store's idempotency records have one (``P:flush:*``: a flush's script
    whose reply was lost, sent again after its token was evicted, would
    apply its writes twice). With maxmemory 0 Redis never evicts (see
    :func:`_would_evict`)."""
    return bool(_eviction_policy(memory)) and not _would_evict(memory)


def _would_evict(memory: dict[str, Any]) -> bool:
    """Whether Redis has an evicting policy but no maxmemory (0): it never
    evicts now, and would once a maxmemory is set (warned of)."""
    try:
        limit = int(memory.get("maxmemory", -1))
    except (TypeError, ValueError):
        limit = -1
    return bool(_eviction_policy(memory)) and limit == 0


def _over_limit(memory: dict[str, Any]) -> bool:
    """Whether ``INFO memory`` says Redis refuses writes for memory now."""
    try:
        used, limit = int(memory.get("used_memory", 0)), int(memory.get("maxmemory", 0))
    except (TypeError, ValueError):
        return False
    policy = str(memory.get("maxmemory_policy", ""))
    return limit > 0 and used > limit and policy == "noeviction"


def _per_node(info: dict[str, Any]) -> bool:
    """Whether an ``INFO`` reply of a cluster's client is one per node
    (``host:port`` -> the node's), not one node's."""
    return bool(info) and all(isinstance(value, dict) for value in info.values())


def _entry_of_host(raw: bytes, part: str) -> bytes:
    """A ledger entry of layout 6's host ledger (of host *part*) as its
    group's ledger keeps it: its effects list the host (``hosts``) where
    they said ``new_host``, the group's ledger naming no host. An entry that
    is not one (the scripts drop those) is kept as it is."""
    try:
        entry = read_entry(raw)
    except ValueError:
        return raw
    if entry is None:
        return raw
    effects = entry.effects
    if effects.pop("new_host", False):
        effects["hosts"] = sorted({*effects.get("hosts", []), part})
    return entry_of(entry.stamped, effects)


def _bucket_count(raw: bytes | None) -> int | None:
    """A host's stored bucket count as the scripts' ``bucket_count`` reads
    it (absent: 1); None where they refuse it (not a whole number >= 1):
    a count read as anything else would recount some of the host's
    buckets only, its other pages never due or summed again."""
    if raw is None:
        return 1
    try:
        n = float(raw)
    except ValueError:
        return None
    if not math.isfinite(n) or n < 1 or n != math.floor(n):
        return None
    return int(n)


def _run_mark(raw: bytes | None) -> bool:
    """Whether an old shard's mark of the run reads as the summaries read
    it (a whole number of seconds), or is absent."""
    if raw is None:
        return True
    try:
        int(raw)
    except ValueError:
        return False
    return True


def _migration_key_type(key: str, prefix: str) -> tuple[str, str] | None:
    """The type a key under *prefix* must have for a cluster migration to
    read or write it, and what it is (see :data:`_MIGRATION_KEY_TYPES`);
    None for a key the migration copies whole, deletes unread or never
    touches."""
    start = key.find("{")
    end = key.find("}", start + 1)
    if not key.startswith(prefix) or start < 0 or end < 0:
        return None
    kind = key[len(prefix):].partition(":")[0]
    inside = key[start + 1:end]
    group = inside.rpartition(GROUP_MARK)[2] in _GROUPS
    if kind == "nvm" and group:
        return _GROUP_META_TYPE
    rule = _MIGRATION_KEY_TYPES.get(kind)
    if rule is None:
        return None
    where, wanted, what = rule
    if where == "old" and SHARD_MARK not in inside:
        return None
    if where == "group" and not group:
        return None
    return wanted, what


def _legacy_page_key(scope: str, field: str) -> PageKey:
    """The page of a field of a layout-2 pages hash (``URL NUL variant``)."""
    url, _, variant = field.partition("\0")
    return PageKey(scope, url, variant)


class RedisLayout(RedisCore):
    """Opening a prefix: its layout checked, and migrated when older (see
    the module docstring)."""

    def _check_layout(self) -> None:
        """Refuse a prefix holding a newer or foreign layout; mark a new one."""
        meta = f"{self.prefix}:meta"
        try:
            self._check_server()
            pipe = self._sync.pipeline(transaction=False)
            pipe.type(meta)
            pipe.hgetall(meta)
            pipe.exists(f"{self.prefix}:scopes")
            # Loaded now, so that the first flush and reads are one round-trip.
            for script in _SCRIPTS:
                pipe.script_load(script)
            pipe.info("memory")
            pipe.config_get("hash-max-listpack-value")
            kind, found, has_scopes, *_, memory, listpack = pipe.execute(raise_on_error=False)
            self.roundtrips += 1
            if isinstance(kind, Exception):
                raise kind
            # The longest entry a small hash keeps flat (a managed Redis may
            # not tell: its default then).
            if isinstance(listpack, dict) and str(
                    listpack.get("hash-max-listpack-value", "")).isdigit():
                self._listpack_value = int(listpack["hash-max-listpack-value"])
            # Only noeviction: an allkeys-* policy evicts state silently (an
            # items hash gone, its pages' validators kept), a volatile-* one
            # the keys with a TTL, among them the flushes' tokens
            # (P:flush:*) that make a write sent again apply once.
            # (With no maxmemory Redis never evicts: accepted, warned of.)
            if not isinstance(memory, Exception):
                self._check_eviction(memory, "Redis")
            if not isinstance(memory, Exception) and _over_limit(memory):
                raise self._fail(OUT_OF_MEMORY)
            if kind == b"none":
                if has_scopes:
                    raise self._fail(
                        f"holds state keys but no {meta} (damaged, or written by "
                        "something else); point INCREMENTAL_STATE_URI at another "
                        "prefix or restore it"
                    )
                # HSETNX: two workers opening a new store at once agree.
                pipe = self._sync.pipeline(transaction=True)
                pipe.hsetnx(meta, "layout", LAYOUT)
                pipe.hsetnx(meta, "version", LAYOUT_VERSION)
                pipe.hgetall(meta)
                found = pipe.execute()[-1]
                self.roundtrips += 1
            elif kind != b"hash":
                found = {}
        except redis.RedisError as exc:
            raise self._fail(
                "cannot be reached or read (is Redis running at this address?)", exc
            ) from exc
        version = self._meta_version(meta, found, LAYOUT_VERSION)
        if version < LAYOUT_VERSION or _UPGRADING.encode() in found:
            self._migrate()

    def _check_eviction(self, memory: dict[str, Any], where: str, every: str = "") -> None:
        """Refuse a Redis (node) that may evict the store's keys
        (:func:`_evicts`); warn of one that would once given a maxmemory."""
        policy = _eviction_policy(memory)
        if _evicts(memory):
            raise self._fail(_EVICTS.format(
                policy=policy, where=where, limit=memory.get("maxmemory", "?")) + every)
        if _would_evict(memory):
            logger.warning(_WOULD_EVICT, self.location, where, policy)

    async def _recheck_eviction(self) -> None:
        """During a crawl, refuse to write again on a Redis (any primary of
        a cluster) that may now evict the store's keys: checked again at
        most every :data:`EVICTION_RECHECK` seconds, before a flush sends
        anything, so that the crawl stops with nothing more flushed."""
        now = time.monotonic()
        if now - self._eviction_checked < EVICTION_RECHECK:
            return
        try:
            if self.cluster:
                memories = await self._again(lambda: self._async.info(
                    "memory", target_nodes=RedisCluster.PRIMARIES))
            else:
                memories = await self._again(lambda: self._async.info("memory"))
        except _FAILING_OVER as exc:
            # A failover under way (CLUSTERDOWN, MASTERDOWN, TRYAGAIN, a
            # slot moving): the very moment a primary configured otherwise
            # may take over, and no refusal. This flush goes on (its own
            # commands meet the same state, and fail on their own if it
            # lasts); the next flush checks again.
            logger.info("State store %s: the eviction policy could not be checked now (%s); "
                        "the next flush checks it", self.location, exc)
            return
        except redis.exceptions.ResponseError as exc:
            # INFO refused since the store opened (an ACL changed, the
            # command renamed): no check possible, which is no sign of
            # eviction; said once, tried again a minute later.
            self._eviction_checked = now
            if not self._eviction_unread_said:
                self._eviction_unread_said = True
                logger.warning("State store %s: Redis refused INFO memory (%s): whether it "
                               "may evict the store's keys is not checked during the crawl",
                               self.location, exc)
            return
        except redis.RedisError as exc:
            raise self._fail("Redis command failed", exc) from exc
        self.roundtrips += 1
        where = "a node of the cluster" if self.cluster else "Redis"
        every = " on every node" if self.cluster else ""
        for memory in memories.values() if _per_node(memories) else [memories]:
            # Only eviction possible now stops the crawl: a policy without a
            # maxmemory was warned of when the store opened, and a
            # maxmemory set later is seen by the next check.
            if _evicts(memory):
                raise self._fail(_EVICTS.format(
                    policy=_eviction_policy(memory), where=where,
                    limit=memory.get("maxmemory", "?")) + every)
        self._eviction_checked = now

    def _meta_version(self, meta: str, found: dict[bytes, bytes], newest: int) -> int:
        """The layout version the store's record *found* (of key *meta*)
        gives, refused when it is not a store's or newer than *newest*."""
        layout = found.get(b"layout", b"").decode(errors="replace")
        version = found.get(b"version", b"").decode(errors="replace")
        if layout != LAYOUT or not version.isdigit():
            raise self._fail(
                f"{meta} does not describe an incremental_crawler state store "
                f"(layout {layout!r}, version {version!r}); the prefix belongs to "
                "something else: choose another with ?prefix=...")
        if int(version) > newest:
            raise self._fail(
                f"has layout version {version}, newer than this code knows "
                f"({newest}); upgrade incremental_crawler")
        return int(version)

    def _check_cluster_layout(self) -> None:
        """:meth:`_check_layout` on a Redis Cluster: the cluster layout (6),
        its scripts loaded on every primary, and every primary's eviction
        policy and memory checked (each holds part of the state)."""
        meta = f"{self.prefix}:meta"
        try:
            self._check_version(self._sync.info("server"))
            self.roundtrips += 1
            memories = self._sync.info("memory", target_nodes=RedisCluster.PRIMARIES)
            self.roundtrips += 1
            for memory in memories.values() if _per_node(memories) else [memories]:
                self._check_eviction(memory, "a node of the cluster", " on every node")
                if _over_limit(memory):
                    raise self._fail(OUT_OF_MEMORY)
            listpack: Any = self._sync.config_get("hash-max-listpack-value")
            self.roundtrips += 1
            if str(listpack.get("hash-max-listpack-value", "")).isdigit():
                self._listpack_value = int(listpack["hash-max-listpack-value"])
            for script in CLUSTER_SCRIPTS:
                self.roundtrips += 1
                self._sync.script_load(script)
            kind = self._sync.type(meta)
            self.roundtrips += 1
            if kind == b"none":
                if self._sync.exists(f"{self.prefix}:scopes"):
                    raise self._fail(
                        f"holds state keys but no {meta} (damaged, or written by "
                        "something else); point INCREMENTAL_STATE_URI at another "
                        "prefix or restore it")
                # HSETNX: two workers opening a new store at once agree; in
                # one MULTI (one key, one slot), so that a worker opening
                # between them never reads a layout without its version.
                with self._sync.pipeline(transaction=True) as pipe:
                    pipe.hsetnx(meta, "layout", LAYOUT)
                    pipe.hsetnx(meta, "version", CLUSTER_LAYOUT_VERSION)
                    pipe.hgetall(meta)
                    found: Any = pipe.execute()[-1]
                self.roundtrips += 1
            else:
                found = self._sync.hgetall(meta) if kind == b"hash" else {}
                self.roundtrips += 1
        except redis.RedisError as exc:
            raise self._fail(
                "cannot be reached or read (is Redis running at this address?)", exc
            ) from exc
        version = self._meta_version(meta, found, CLUSTER_LAYOUT_VERSION)
        if version in _MIGRATED_CLUSTER_LAYOUTS or _UPGRADING.encode() in found:
            self._migrate_cluster()
            return
        if _FIRST_CLUSTER_LAYOUT <= version < CLUSTER_LAYOUT_VERSION:
            # Written by older code of the cluster layout: its scope's keys
            # in one slot, where this code reads them per scope shard.
            raise self._fail(
                f"has the cluster layout version {version}, which keeps each scope's "
                f"revisit index, sums and hosts in one slot; this code keeps them per "
                f"scope shard (version {CLUSTER_LAYOUT_VERSION}) and does not migrate "
                "that first cluster layout: run the older code on it, or start this code "
                "on another prefix (or delete the old one's keys)")
        if version < CLUSTER_LAYOUT_VERSION:
            # No store of an older layout was ever written to a cluster.
            raise self._fail(
                f"has layout version {version} on a Redis Cluster, where only the "
                f"cluster layout ({CLUSTER_LAYOUT_VERSION}) runs; it was not written "
                "by this store: choose another prefix")

    def _check_server(self) -> None:
        """Refuse a Redis older than :data:`MIN_REDIS_VERSION` (before any write)."""
        self._check_version(self._sync.info("server"))
        self.roundtrips += 1

    def _check_version(self, server: dict[str, Any]) -> None:
        """Refuse a Redis older than :data:`MIN_REDIS_VERSION`."""
        version = str(server.get("redis_version", ""))
        parts = version.split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit() and (
                (int(parts[0]), int(parts[1])) < MIN_REDIS_VERSION):
            raise self._fail(
                f"Redis {version} is too old: this store needs Redis "
                f"{'.'.join(map(str, MIN_REDIS_VERSION))} or newer (its scripts declare "
                "whether they write, so that Redis refuses them whole when it is out "
                "of memory); upgrade Redis")

    # -- migrations ------------------------------------------------------------

    def _migrate(self) -> None:
        """Bring a prefix of an older layout to this one, one process at a time.

        The first process takes a lock (``P:migrating``, renewed as it goes)
        and the others wait for it. The layout version is raised before any
        page moves, with ``upgrading`` noting the version moved from, so
        code of the older layout refuses the prefix from then on; a process
        that dies midway leaves ``upgrading`` set, and the next one to open
        the store resumes (every step can be done again).

        1 → 2: each scope's page index, a hash of JSON lists, becomes the
        sorted set of ``page NUL key``.
        2 → 3: each scope's pages hash (JSON records) and links hash move
        to the hosts' buckets (packed records) and links hashes, the
        revisit index becomes one of buckets, and the old keys go, scope by
        scope (see :meth:`_move_pages`).
        """
        try:
            with self._migration_lock() as (lock, token):
                start, resumed = self._migration_start(LAYOUT_VERSION)
                if start >= LAYOUT_VERSION:
                    return  # done by the process we waited for
                self._raise_version(LAYOUT_VERSION, start)
                if start < 2:
                    for key in self._scan_keys(f"{_glob(self.prefix)}:bypage:*"):
                        self.roundtrips += 1
                        self._sync.eval(_BYPAGE_TO_ZSET_LUA, 1, key)
                moved = self._move_pages(lock, token) if start < 3 else 0
                if start == 3 or resumed:
                    # Pages moved from layout 2 now were summed as they were
                    # written; a move resumed (begun by a process of layout 3,
                    # which kept no sums) has pages moved before: built anew.
                    self._build_sums(lock, token)
                self._finish_migration(lock, token)
        except redis.RedisError as exc:
            raise self._fail("migrating the layout failed", exc) from exc
        logger.info("State store %s: layout migrated from version %d to %d (%d pages moved)",
                    self.location, start, LAYOUT_VERSION, moved)

    @contextmanager
    def _migration_lock(self) -> Iterator[tuple[str, str]]:
        """The migration's lock (``P:migrating``) held for the block, as
        (lock, this process's token): taken first, waiting for another
        process's migration (:data:`_MIGRATION_WAITS` times
        :data:`_MIGRATION_WAIT` at most), released at its end whatever
        happened (by its holder only: a lock that lapsed and was taken by
        another process stays that one's)."""
        lock = f"{self.prefix}:migrating"
        token = uuid.uuid4().hex
        for _ in range(_MIGRATION_WAITS):
            self.roundtrips += 1
            if self._sync.set(lock, token, nx=True, ex=_MIGRATION_LOCK_TTL):
                break
            time.sleep(_MIGRATION_WAIT)
        else:
            raise self._fail(
                f"another process has been migrating the layout for over "
                f"{_MIGRATION_WAITS * _MIGRATION_WAIT:.0f} s ({lock} is held); "
                "try again when it is done")
        try:
            yield lock, token
        finally:
            self.roundtrips += 1
            self._sync.eval(_UNLOCK_LUA, 1, lock, token)

    def _migration_start(self, target: int) -> tuple[int, bool]:
        """Read under the lock: the layout version a migration to *target*
        starts from (the one a migration under way started from, its
        ``upgrading``: resumed; *target* or later: done by the process
        waited for), and whether it is resumed."""
        self.roundtrips += 1
        found = self._sync.hgetall(f"{self.prefix}:meta")
        version = int(found.get(b"version", target))
        return int(found.get(_UPGRADING.encode(), version)), _UPGRADING.encode() in found

    def _raise_version(self, target: int, start: int) -> None:
        """The layout version raised to *target* before anything moves,
        ``upgrading`` noting *start*: code of the older layout refuses the
        prefix from then on, and a process that dies midway leaves it for
        the next to resume."""
        self.roundtrips += 1
        self._sync.hset(f"{self.prefix}:meta", mapping={"version": target, _UPGRADING: start})

    def _finish_migration(self, lock: str, token: str) -> None:
        """Every step of the migration done: ``upgrading`` goes from
        ``P:meta`` (the store opens as one of the new layout from now on),
        only if no other process took the lock over meanwhile (this one
        stalled past its time: the other goes on, and finishes it)."""
        self._renew(lock, token)
        self.roundtrips += 1
        self._sync.hdel(f"{self.prefix}:meta", _UPGRADING)

    def _migrate_cluster(self) -> None:
        """Cluster layout 6 or 7 → 8 in place, one process at a time (the
        lock and ``upgrading`` as :meth:`_migrate`: the version is raised
        first, so that code of the older layout refuses the prefix from
        then on, and a process that dies midway leaves ``upgrading`` for
        the next to resume; every step can be done again).

        From 6: every host key (``P:<kind>:{<s>|<h>}``, found on every
        primary) is copied to its group's slot (``DUMP``, ``RESTORE …
        REPLACE``) before it is deleted (a host's ledger's entries go to its
        group's ledger, dropped with the rest below). Then, from 6 or 7,
        what the eight scope shards of a scope kept (hosts, revisit index,
        sums, checks since the mark, splits) is recounted from the pages
        into each host group's own keys (:meth:`_regroup_scopes`): the
        sums cannot be split by group without the pages, and a dead
        worker's effects pending in a ledger (its pages written, its phase 3
        not) are counted from its pages with the rest; the shards' keys,
        the ledgers, intents and applied tokens then go."""
        try:
            with self._migration_lock() as (lock, token):
                start, resumed = self._migration_start(CLUSTER_LAYOUT_VERSION)
                if start >= CLUSTER_LAYOUT_VERSION:
                    return  # done by the process we waited for
                # Before the version is raised: a damaged key refused
                # then leaves the store as it was, the old code still opens it.
                self._refuse_damaged_keys(resumed=resumed)
                if not resumed:
                    # (Resumed, the version is raised: the old code refused.)
                    self._refuse_live_workers(start)
                self._raise_version(CLUSTER_LAYOUT_VERSION, start)
                moved = self._move_host_keys(lock, token) if start < 7 else 0
                pages = self._regroup_scopes(lock, token)
                self._finish_migration(lock, token)
        except redis.RedisError as exc:
            raise self._fail("migrating the layout failed", exc) from exc
        logger.info("State store %s: cluster layout migrated from version %d to %d (%d host "
                    "keys moved to their groups' slots, %d pages recounted by host group)",
                    self.location, start, CLUSTER_LAYOUT_VERSION, moved, pages)

    def _regroup_scopes(self, lock: str, token: str) -> int:
        """Layout 7 → 8 (see :meth:`_migrate_cluster`): each host group's
        keys built from its hosts' pages, then the old shards' keys and the
        ledgers deleted; how many pages were read. The hosts are found by
        their records (``P:hd:{<s>|<g>}:<h>``, a SCAN of every primary: a
        host whose first flush died after its pages were written is found
        too), a group's pages read :data:`_REGROUP_BUCKETS` buckets a script;
        its sums are set (whole: a group built again writes the same) at its
        end in one transaction with its mark of done (``regrouped`` in its
        ``P:nvm``), which a migration resumed skips."""
        head = f"{self.prefix}:hd:{{"
        groups: dict[tuple[str, str], set[str]] = {}
        for page in self._scan_pages(f"{_glob(self.prefix)}:hd:{{*|=*}}:*"):
            for key in page:
                if not key.startswith(head):
                    continue
                inside, _, tail = key[len(head):].partition("}")
                scope_part, _, group = inside.rpartition("|")
                if scope_part and group in _GROUPS and tail.startswith(":"):
                    groups.setdefault((scope_part, group), set()).add(tail[1:])
        pages = 0
        for n, (scope_part, group) in enumerate(sorted(groups)):
            self._renew(lock, token)
            pages += self._regroup(scope_part, group, sorted(groups[scope_part, group]),
                                   lock, token)
            if (n + 1) % 64 == 0:
                logger.info("State store %s: %d host groups of %d recounted so far",
                            self.location, n + 1, len(groups))
        # The old shards' keys ({<s>^<x>}) and every ledger, found on every
        # primary, deleted a SCAN page at a time.
        prefix = f"{self.prefix}:"
        for pattern in (f"{_glob(self.prefix)}:*{SHARD_MARK}*", f"{_glob(self.prefix)}:fx:{{*}}"):
            for page in self._scan_pages(pattern):
                doomed = [key for key in page if key.startswith(prefix) and (
                    (key[len(prefix):].partition(":")[0] in _OLD_SHARD_KINDS
                     and SHARD_MARK in key_tag(key)) or key[len(prefix):].startswith("fx:{"))]
                if doomed:
                    self._renew(lock, token)
                    pipe = self._sync.pipeline(transaction=False)
                    for key in doomed:
                        pipe.delete(key)
                    self._sync_run(pipe)
        return pages

    def _regroup(self, scope_part: str, group: str, hosts: list[str], lock: str,
                 token: str) -> int:
        """One host group of :meth:`_regroup_scopes`: its pages read, its
        keys written (nothing when a migration before built it); how many
        pages."""
        tag = f"{{{scope_part}|{group}}}"
        meta = f"{self.prefix}:nvm:{tag}"
        self.roundtrips += 1
        if self._sync.hexists(meta, _REGROUPED):
            return 0
        old = f"{{{old_shard_part(scope_part, old_scope_shard(group))}}}"
        self.roundtrips += 1
        mark: Any = self._sync.hget(f"{self.prefix}:nvm:{old}", "mark")
        if not _run_mark(mark):
            raise self._fail(
                f"migrating the layout stopped: the mark of the run in "
                f"{self.prefix}:nvm:{old} is {mark!r}, not a whole number of seconds; repair "
                f"it or delete that field (HDEL {self.prefix}:nvm:{old} mark: the run's checks "
                f"since its mark are then not kept), then open the store again (the migration "
                f"begun resumes then)")
        pipe = self._sync.pipeline(transaction=False)
        for part in hosts:
            pipe.hget(f"{self.prefix}:hd:{tag}:{part}", "n")
        counts: list[int] = []
        for part, raw in zip(hosts, self._sync_run(pipe), strict=True):
            n = _bucket_count(raw)
            if n is None:  # damaged since the check before the version was raised
                raise self._fail(
                    f"migrating the layout stopped: the bucket count in "
                    f"{self.prefix}:hd:{tag}:{part} (field n) is {raw!r}, not a whole number "
                    f">= 1: damaged; set it to the host's number of buckets, then open the "
                    f"store again (the migration begun resumes then)")
            counts.append(n)
        sums: dict[str, list[int]] = {}
        latest: int | None = None
        read = scripts = 0
        # (host, first bucket, how many): a large host's buckets over
        # several calls, so that no call reads more than _REGROUP_BUCKETS.
        spans = [(part, first, min(_REGROUP_BUCKETS, n - first))
                 for part, n in zip(hosts, counts, strict=True)
                 for first in range(0, n, _REGROUP_BUCKETS)]
        batch: list[tuple[str, int, int]] = []
        for span in [*spans, ("", 0, 0)]:
            if batch and (not span[0]
                          or sum(b for _, _, b in batch) + span[2] > _REGROUP_BUCKETS):
                self._renew(lock, token)
                last, count = self._regroup_batch(tag, mark, batch, sums)
                if last is not None:
                    latest = last if latest is None else max(latest, last)
                read += count
                batch = []
                scripts += 1
                if scripts % _REGROUP_PROGRESS == 0:
                    logger.info("State store %s: host group %s: %d pages recounted so far "
                                "(%d scripts)", self.location, tag, read, scripts)
            if span[0]:
                batch.append(span)
        self._write_group_sums(tag, sums, mark, latest, lock, token)
        return read

    def _regroup_batch(self, tag: str, mark: bytes | None, batch: list[tuple[str, int, int]],
                       sums: dict[str, list[int]]) -> tuple[int | None, int]:
        """Some hosts' buckets of a group (key part, first bucket, how
        many) read by one script (``cluster_regroup.lua``): their sums
        added to *sums*; the latest check read and the pages read."""
        keys = [f"{self.prefix}:dueb:{tag}", f"{self.prefix}:ck:{tag}",
                f"{self.prefix}:hs:{tag}"]
        args: list[Any] = ["" if mark is None else mark.decode(), len(batch)]
        for host, first, buckets in batch:
            args += [host, first, buckets]
            for b in range(first, first + buckets):
                keys += [f"{self.prefix}:pg:{tag}:{host}:{b}",
                         f"{self.prefix}:pgl:{tag}:{host}:{b}"]
        self.roundtrips += 1
        reply = self._sync.eval(CLUSTER_REGROUP_LUA, len(keys), *keys, *args)
        if len(reply) > 3:
            # A record that cannot be read: the version is raised (this is
            # past the pre-check), but nothing of the group is marked done,
            # so once it is repaired the next open resumes and reads it.
            bucket, field, why = (v.decode(errors="replace") if isinstance(v, bytes) else str(v)
                                  for v in reply[3:6])
            raise self._fail(
                f"migrating the layout stopped: the page record {field!r} of {bucket} cannot "
                f"be read ({why}); repair it or delete that field (HDEL {bucket} {field}: "
                f"its page is lost, crawled again as new), then open the store again (the "
                f"migration begun resumes then; the code of the older layout no longer "
                f"opens the store)")
        found, last, count = reply
        for field, (pages, total) in json.loads(found or "{}").items():
            was = sums.setdefault(field, [0, 0])
            was[0] += int(pages)
            was[1] += int(total)
        return (int(last) if last else None), int(count)

    def _write_group_sums(self, tag: str, sums: dict[str, list[int]], mark: bytes | None,
                          latest: int | None, lock: str, token: str) -> None:
        """A group's sums by next visit written (coarse by minute, fine by
        second) with its mark, latest check and mark of done, in one
        transaction (one slot)."""
        coarse: dict[str, list[int]] = {}
        fine: dict[int, dict[str, str]] = {}
        for field, (pages, total) in sums.items():
            visit, _, callback = field.partition("|")
            minute = int(visit) // _SUM_MINUTE
            at = coarse.setdefault(f"{minute}|{callback}", [0, 0])
            at[0] += pages
            at[1] += total
            fine.setdefault(fine_part(int(visit)), {})[f"{int(visit)}|{callback}"] = (
                f"{pages} {total}")
        # (Any: redis-py types its mappings' keys invariantly.)
        pipe: Any = self._sync.pipeline(transaction=True)
        if coarse:
            pipe.hset(f"{self.prefix}:nvs:{tag}", mapping={
                field: f"{pages} {total}" for field, (pages, total) in coarse.items()})
        for part, fields in fine.items():
            pipe.hset(f"{self.prefix}:nvf:{tag}:{part}", mapping=fields)
        done: dict[str, Any] = {_REGROUPED: 1}
        if mark is not None:
            done["mark"] = mark
        if latest is not None:
            done["latest"] = latest
        pipe.hset(f"{self.prefix}:nvm:{tag}", mapping=done)
        self._renew(lock, token)
        self._sync_run(pipe)

    def _refuse_damaged_keys(self, resumed: bool) -> None:
        """Refuse the migration, before it changes anything, while a key it
        reads or writes by its kind (:data:`_MIGRATION_KEY_TYPES`: every
        host's record and buckets, the old shards' meta, the ledgers, ...)
        is of another type: one line naming the key and what to do. Found
        midway, its WRONGTYPE would stop the migration with the version
        raised: a store that neither layout's code opens until that key,
        unnamed, is found. One SCAN of the prefix's keys on every primary,
        a ``TYPE`` of each key checked in one pipeline a SCAN page. Checked
        again when a migration is resumed (a key damaged since)."""
        prefix = f"{self.prefix}:"
        for page in self._scan_pages(f"{_glob(self.prefix)}:*"):
            checked: list[tuple[str, str, str]] = []
            for key in page:
                found = _migration_key_type(key, prefix)
                if found is not None:
                    checked.append((key, *found))
            if not checked:
                continue
            pipe = self._sync.pipeline(transaction=False)
            for key, _, _ in checked:
                pipe.type(key)
            left = ("the migration begun resumes then" if resumed
                    else "nothing was changed: the old code still opens the store")
            for (key, wanted, what), found in zip(checked, self._sync_run(pipe), strict=True):
                kind = found.decode() if isinstance(found, bytes) else str(found)
                # ("none": deleted since the SCAN saw it.)
                if kind in (wanted, "none"):
                    continue
                raise self._fail(
                    f"migration refused: {key} ({what}) is a {kind}, not a {wanted}: "
                    f"damaged; repair it or delete it (what it held is lost), then "
                    f"open the store again ({left})")
            self._refuse_damaged_values(checked, left)

    def _refuse_damaged_values(self, checked: list[tuple[str, str, str]], left: str) -> None:
        """Refuse the migration while a value it reads and relies on is not
        what the scripts write: a host's bucket count (read as 1, the
        recount would read the first bucket only, the host's other pages
        never due or summed again) or an old shard's mark of the run (a
        time no summary could read after). One ``HGET`` a host record or
        old shard meta, in one pipeline a SCAN page."""
        values = [(key, what) for key, _, what in checked
                  if what in (_HOST_RECORD, _OLD_SHARD_META)]
        if not values:
            return
        pipe = self._sync.pipeline(transaction=False)
        for key, what in values:
            pipe.hget(key, "n" if what == _HOST_RECORD else "mark")
        for (key, what), raw in zip(values, self._sync_run(pipe), strict=True):
            if what == _HOST_RECORD and _bucket_count(raw) is None:
                raise self._fail(
                    f"migration refused: the bucket count in {key} (field n) is {raw!r}, not "
                    f"a whole number >= 1: damaged; set it to the host's number of buckets "
                    f"(one more than the highest n of its {key.replace(':hd:', ':pg:', 1)}:<n> "
                    f"keys), then open the store again ({left})")
            if what == _OLD_SHARD_META and not _run_mark(raw):
                raise self._fail(
                    f"migration refused: the mark of the run in {key} is {raw!r}, not a whole "
                    f"number of seconds: damaged; repair it or delete that field (HDEL {key} "
                    f"mark: the run's checks since its mark are then not kept), then open the "
                    f"store again ({left})")

    def _refuse_live_workers(self, start: int) -> None:
        """Refuse the migration, nothing changed, while a worker of the old
        layout may be running: a live hold of a scope (a crawl's), or a
        write-ahead intent young enough that its flush may still write
        (:data:`_LIVE_INTENT`). Such a worker would go on writing host keys
        of layout 6 that nothing moves, its phase 3 counting pages that no
        read finds. The line says how long to wait once every old worker
        is stopped: until the last live hold lapses (a crashed worker's,
        which no one renews: its lapse time is in the key) or the last
        young intent is :data:`_LIVE_INTENT` s old, whichever is later."""
        glob = _glob(self.prefix)
        first: tuple[str, str] | None = None
        wait = 0
        for kind, within, said in (("holds", 0, "a live hold of a scope"),
                                   ("fxhosts", _LIVE_INTENT,
                                    f"a flush's intent under {_LIVE_INTENT} s old")):
            for key in self._scan_keys(f"{glob}:{kind}:*"):
                self.roundtrips += 1
                left = int(self._sync.eval(_LIVE_LUA, 1, key, within))
                if left > 0:
                    first = first or (said, key)
                    wait = max(wait, left)
        if first is not None:
            said, key = first
            raise self._fail(
                f"migration refused: {said} ({key}) shows a worker of the cluster "
                f"layout {start} running; stop every worker of "
                f"the old code, wait {wait} s (until the last such hold or intent "
                "lapses), then open the store again (nothing was changed)")

    def _group_ledger(self, ledger: str) -> str | None:
        """The group's ledger (layout 7) of a host's ledger of layout 6,
        from its name alone (a migration resumed has no record of what it
        moved); None for a name that is not a host's ledger (one of layout
        7 already, or not a ledger)."""
        head = f"{self.prefix}:fx:{{"
        if not ledger.startswith(head) or not ledger.endswith("}"):
            return None
        scope_part, _, part = key_tag(ledger)[1:-1].rpartition("|")
        if not scope_part or not part or part.startswith("="):
            return None
        return self._group_ledger_key(scope_part, host_group(part))

    def _move_host_keys(self, lock: str, token: str) -> int:
        """The host keys of layout 6 moved to their groups (see
        :meth:`_migrate_cluster`): how many. Walked one SCAN page at a
        time, moved a batch at a time (a store of millions of host keys is
        never listed whole in memory), the progress logged."""
        head = f"{self.prefix}:"
        moves: list[tuple[str, str]] = []
        ledgers: dict[str, str] = {}
        moved = batches = 0
        for page in self._scan_pages(f"{_glob(self.prefix)}:*{{*|*}}*"):
            for key in page:
                if not key.startswith(head) or not key[len(head):].partition(":")[2].startswith(
                        "{"):
                    continue
                kind, _, rest = key[len(head):].partition(":")
                inside, _, tail = rest[1:].partition("}")
                scope_part, _, part = inside.rpartition("|")
                if not scope_part or part.startswith("="):
                    continue  # not a host's tag, or of layout 7 already
                group_ledger = self._group_ledger(key) if kind == "fx" and not tail else None
                if group_ledger is not None:
                    ledgers[key] = group_ledger
                elif kind in _HOST_KINDS:
                    moves.append((key, f"{head}{kind}:{host_tag(scope_part, part)}{tail}"))
            if len(moves) + len(ledgers) >= _MIGRATION_BATCH:
                moved += self._move_batch(moves, ledgers, lock, token)
                moves, ledgers = [], {}
                batches += 1
                if batches % 10 == 0:
                    logger.info("State store %s: %d host keys moved to their groups so far",
                                self.location, moved)
        return moved + self._move_batch(moves, ledgers, lock, token)

    def _move_batch(self, moves: list[tuple[str, str]], ledgers: dict[str, str], lock: str,
                    token: str) -> int:
        """One batch of :meth:`_move_host_keys`: host keys copied to their
        new names (old, new) then deleted, host ledgers' entries into their
        groups' (old -> new); how many keys."""
        self._renew(lock, token)
        if moves:
            pipe = self._sync.pipeline(transaction=False)
            for old, _ in moves:
                pipe.dump(old)
            dumped = self._sync_run(pipe)
            pipe = self._sync.pipeline(transaction=False)
            for (_, new), data in zip(moves, dumped, strict=True):
                if data is not None:
                    pipe.restore(new, 0, data, replace=True)
            self._sync_run(pipe)
            # Copied: the old keys go (a migration cut before this copies
            # them again, REPLACE, when resumed).
            pipe = self._sync.pipeline(transaction=False)
            for old, _ in moves:
                pipe.delete(old)
            self._sync_run(pipe)
        if ledgers:
            # Three pipelines a batch, not three round trips a ledger (a
            # batch of 2,000 under one renewal of the lock): read, merged
            # into the groups' ledgers, then deleted (a migration cut
            # before the deletes merges them again when resumed: the same
            # tokens, HSET of the same entries).
            olds = sorted(ledgers)
            pipe = self._sync.pipeline(transaction=False)
            for old in olds:
                pipe.hgetall(old)
            read = self._sync_run(pipe)
            self._renew(lock, token)
            pipe = self._sync.pipeline(transaction=False)
            for old, entries in zip(olds, read, strict=True):
                part = key_tag(old)[1:-1].rpartition("|")[2]
                if entries:
                    pipe.hset(ledgers[old], mapping={
                        name: _entry_of_host(raw, part) for name, raw in entries.items()})
            self._sync_run(pipe)
            pipe = self._sync.pipeline(transaction=False)
            for old in olds:
                pipe.delete(old)
            self._sync_run(pipe)
        return len(moves) + len(ledgers)

    def _move_pages(self, lock: str, token: str) -> int:
        """Layout 2 → 3 for every scope: returns the pages moved.

        Each page record is read as JSON and written as a page write of a
        flush (the same script: its bucket, its host's count, the revisit
        index of buckets), every page with a callback in the revisit index
        (gone ones too); then each links record. A scope's old keys are
        deleted once all of it is written, in one transaction.
        """
        head = f"{_glob(self.prefix)}:"
        names = {key.split(":", 2)[2] for kind in ("pages", "links", "due")
                 for key in self._scan_keys(f"{head}{kind}:*")
                 if key.count(":") == self.prefix.count(":") + 2}
        moved = 0
        for part in sorted(names):
            scope = unquote(part)
            ops: list[tuple[Any, ...]] = []
            old = {kind: f"{self.prefix}:{kind}:{part}" for kind in ("pages", "links", "due")}
            for field, raw in self._hscan(old["pages"]):
                key = _legacy_page_key(scope, field.decode())
                try:
                    state = self._decode(PageState, raw, key=key)
                except (ValueError, TypeError) as exc:
                    raise self._fail(
                        f"cannot migrate the page record {field!r} of {old['pages']}: "
                        f"{exc}; repair or delete it, then open the store again") from exc
                ops.append(self._page_op(state))
                moved += 1
                if len(ops) >= _MIGRATION_BATCH:
                    self._apply_now(ops, {scope}, lock, token)
                    ops = []
            for field, data in self._hscan(old["links"]):
                key = _legacy_page_key(scope, field.decode())
                ops.append(("links", *self._page_args(key), data))
                if len(ops) >= _MIGRATION_BATCH:
                    self._apply_now(ops, {scope}, lock, token)
                    ops = []
            if ops:
                self._apply_now(ops, {scope}, lock, token)
            self._renew(lock, token)
            self.roundtrips += 1
            self._sync.delete(*old.values())
            if moved:
                logger.info("State store %s: %d pages of scope %r moved so far",
                            self.location, moved, scope)
        return moved

    def _build_sums(self, lock: str, token: str) -> None:
        """Layout 3 → 4 for every scope: its sums of pages by next visit,
        built once from every page (those of a build cut short are deleted
        and built again: the step can be done again)."""
        for scope in self._stored_scopes():
            self._renew(lock, token)
            self.roundtrips += 1
            self._sync.delete(*(self._key(kind, scope) for kind in ("nvs", "nvm", "ck")),
                              *self._fine_sums_keys(scope))
            buckets = self._buckets(scope)
            pages = 0
            for start in range(0, len(buckets), _DUE_BUCKETS):
                if start % (_DUE_BUCKETS * 100) == 0:
                    self._renew(lock, token)
                args = [arg for host, b in buckets[start:start + _DUE_BUCKETS]
                        for arg in (host_part(host), b)]
                self.roundtrips += 1
                pages += int(self._sync.eval(_SUMS_BUILD_LUA, 0, self.prefix,
                                             _key_part(scope), *args))
            logger.info("State store %s: the sums of the %d pages of scope %r built",
                        self.location, pages, scope)

    def _renew(self, lock: str, token: str) -> None:
        """Renew the migration's lock; fail if this process no longer holds it."""
        self.roundtrips += 1
        if not self._sync.eval(_RENEW_LUA, 1, lock, token, _MIGRATION_LOCK_TTL):
            raise self._fail(
                f"the migration's lock {lock} lapsed while this process held it (it "
                f"stalled over {_MIGRATION_LOCK_TTL} s); another process may be migrating: "
                "open the store again to wait for it or resume")

    def _apply_now(self, ops: list[tuple[Any, ...]], scopes: set[str], lock: str,
                   token: str) -> None:
        """Run writes as one flush, synchronously (a migration), while this
        process holds the migration's lock (renewed first).

        A lock that lapsed (this process stalled past its time) may have
        been taken by another process: this one stops rather than migrate
        beside it (each step can be done again: the other goes on).
        """
        self._renew(lock, token)
        # (No hold checked: a migration holds its lock.)
        keys = [self._token_key(uuid.uuid4().hex), f"{self.prefix}:scopes",
                self._key("holds", "")]
        args: list[Any] = [self.prefix, self._listpack_value, "", len(scopes), *sorted(scopes)]
        for op in ops:
            args.extend(op)
        pipe = self._sync.pipeline(transaction=False)
        pipe.evalsha(self._script_sha, len(keys), *keys, *args)
        pipe.delete(keys[0])  # no reply to lose: nothing to remember
        reply: Any = self._sync_run(pipe)[0]
        if len(reply) > 2:
            raise self._fail(f"migrating the layout failed: {reply[2].decode(errors='replace')}")
