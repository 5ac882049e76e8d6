"""The Redis store on a Redis Cluster: the cluster layout (7), its phased
flush and its reads of pages.

A Redis Cluster runs a script only on the node of its keys' slot, and every
key a script touches must be in its ``KEYS`` and in one slot (Redis 7
refuses a "non local key"). In the cluster layout every key carries a hash
tag: a host's keys its host group's ``{<s>|<g>}``, the host after the tag
(``P:hd:{<s>|<g>}:<h>``; see :data:`~.core.HOST_GROUPS`), a scope's own keys
``{<s>}`` (``P:hosts:{<s>}``, ``P:crawls:{<s>}``, ...), what phase 3 writes
of a scope per scope shard ``{<s>^<x>}`` (``P:dueb``, ``P:nvs``, ``P:hs``,
...: a host's in the shard :func:`~.core.scope_shard` gives, so that one
scope's writes spread over the primaries; see :data:`~.core.SCOPE_SHARDS`),
and the items by group, ``{<s>#<g>}`` with ``g`` a hash of the item key modulo
:data:`~.core.ITEM_GROUPS` (``P:items:{<s>#<g>}``, ``P:hist:{<s>#<g>}:<key>``,
the delivery marks of the group's versions ``P:undel:{<s>#<g>}:<crawl>`` and
``P:undelc:{<s>#<g>}``; ``P:bypage:{<s>#<g>}`` in the group of the *page*'s
URL, so that one page's items are one range). ``P:meta`` and ``P:scopes``
are one key each.

A flush runs in three phases (``docs/capacity.md``, "The state store: the
plan"), each one script per slot, pipelined (the cluster client sends each
node its own), a phase sent only when every script of the one before
succeeded:

1. the item writes, per item group (``cluster_items.lua``), each with its
   delivery mark: a version is never stored without the mark that waits
   on its crawl, whatever phase a worker is gone in; and the marks moved
   to a crawl that emitted their versions again;
2. the page and links writes, per host group (``cluster_host.lua``: the
   group's hosts one after the other, one token, one ledger entry and one
   intent a group), and the page index's new members (after the items
   they list);
3. per scope shard touched (``cluster_scope.lua``): what phase 2's scripts
   of its hosts returned of their writes (the shard's hosts, the revisit
   index lowered, the splits, the sums by next visit, the checks since the
   mark); per scope, the same script in the scope's own slot with the
   scope's own writes (host trust, crawl records, rates: kept by the
   worker until applied, in no ledger, so a worker gone before its phase 3
   loses them); the page index's stale members (``cluster_bypage.lua``:
   skipped where a later item version wrote the member since);
   ``P:scopes``.

A crawl's marks are settled (its delivery confirmed, ``stage_delivered``,
``stage_settled``) after the three phases, in every item group of its
scope (``cluster_settle.lua``, one pipeline); a mark staged after that in
the same flush goes in a second round of the phases. The reads of the
marks merge the groups (:meth:`RedisClusterPath._merged_marks`); marks
that code before kept in the scope's own slot are moved to their groups
when the crawls waiting are listed.

Every script keeps its own token in its slot (``P:flush:{tag}:<token>``)
with how many of its writes it applied and what it returned, so that a
script whose reply was lost, sent again, applies nothing twice and returns
the same. State is never ahead of data: a page's validators are written in
phase 2, after every item of the flush. A flush that fails in phase 1
writes no page; one that fails in phase 2 leaves items stored with their
pages' old state (the page is fetched again). What phases 1 and 2 applied
and phase 3 has not is kept by the store (:class:`_Carried`) and sent with
the next flush; phase 2's effects also stay in their host group's ledger
(``P:fx:{<s>|<g>}``) until applied, so that a worker gone before its phase 3
leaves them to the next flush that writes the group (after
:attr:`RedisClusterPath.adopt_after`) or, listed by the write-ahead intents
the flush wrote in the host's scope shard before its phase 2
(``P:fxhosts:{<s>^<x>}``), to the next reading of the scope
(:meth:`RedisClusterPath.adopt_ledgers`, every shard's); the shard's script
applies each script's effects once (``P:fxdone:{<s>^<x>}``), whoever sends
them. A phase 3 whose script fails on one shard leaves the other shards'
effects applied, and that shard's to the retry or to an adoption.

Reads of what phase 3 wrote fan out per shard, pipelined (the cluster
client sends each node its own): a due read merges the shards' revisit
indexes by bound (each read in chunks; a page is in place once it is due
before every shard's unread rest), a summary adds up the shards' sums and
takes out each shard's checks, the scope's hosts are every shard's.

A script that writes a page chooses its bucket from the host's bucket
count: here the caller reads the count (and page count) first, plans the
splits and the buckets, and declares their keys; the script writes nothing
and says so when the count is another by then (another worker split), and
the caller plans again.

The admin read-outs, exports and repairs run on it too (:mod:`.admin`:
items merged over their groups, a repair one ``MULTI`` per slot, its
host's part first, a page repair's in one script, ``cluster_forget.lua``; keys
found by ``SCAN`` on every primary). A summary that reads every bucket
sets their bounds across slots (marked before its read, raised only where
the mark stayed: see ``due.py``). Not built on the cluster yet: a due read
that finds a bound stale does not raise it (layout 4 stages a ``rebound``).
"""

from __future__ import annotations

import heapq
import json
import math
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import redis

from incremental_crawler import clock
from incremental_crawler.state.stores.base import StateStoreError, StoredStateDamaged
from incremental_crawler.state.stores.redis.core import (
    ITEM_GROUPS,
    SCOPE_SHARDS,
    RedisCore,
    _key_part,
    _whole,
    group_shard,
    host_group,
    host_of_part,
    host_tag,
    item_group,
    key_tag,
    ledger_shard,
    logger,
    scope_of_shard,
    shard_part,
)
from incremental_crawler.state.stores.redis.ledger_entry import (
    damaged_entry,
    entry_effects,
    read_entry,
)
from incremental_crawler.state.stores.redis.pages import (
    BUCKET_LOAD,
    MAX_SPLITS,
    bucket_of,
)
from incremental_crawler.state.stores.redis.scripts import (
    _LEDGER_HONOURED,
    CLUSTER_BYPAGE_LUA,
    CLUSTER_HELD_RELEASE_LUA,
    CLUSTER_HOST_LUA,
    CLUSTER_INTENT_ADD_LUA,
    CLUSTER_INTENT_DROP_LUA,
    CLUSTER_INTENTS_READ_LUA,
    CLUSTER_ITEMS_LUA,
    CLUSTER_LEDGER_READ_LUA,
    CLUSTER_SCOPE_LUA,
    CLUSTER_SETTLE_LUA,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Sequence

__all__ = ["RedisClusterPath"]


def _declared(keys: list[str]) -> tuple[list[str], Callable[[str], int]]:
    """A script's KEYS, *keys* first, and ``at(name)``: the (1-based) index
    of *name* in them, appended the first time it is met (a script must
    declare every key it touches, each once)."""
    index: dict[str, int] = {}

    def at(name: str) -> int:
        if name not in index:
            keys.append(name)
            index[name] = len(keys)
        return index[name]

    return keys, at

#: The writes of phase 2 (a host's) and of phase 3 (a scope's own).
_HOST_OPS = frozenset({"page", "check", "failure", "redirect", "links", "unlink", "flags",
                       "listing", "postpone"})
_SCOPE_OPS = frozenset({"host", "crawl", "slotrate"})
#: The writes of phase 1 (an item group's): the items, with their delivery
#: marks (an ``undeliv`` goes with the item write staged right before it).
_GROUP_OPS = frozenset({"item", "undeliv", "redeliv"})
#: Writes that may add a page to its host (the splits are planned for them).
_ADDS = frozenset({"page", "check", "failure", "redirect"})
#: Which arguments of a scope's write are keys (after its name).
_KEY_ARGS = {"host": (0,), "crawl": (0,), "slotrate": (0, 1)}
#: See RedisClusterPath.adopt_after: well past a flush's phases (a worker
#: retrying an unreachable node keeps its own for its retry time).
_ADOPT_AFTER = 600
#: Seconds of a minute of the sums (as SUM_MINUTE in sums.lua).
_SUM_MINUTE = 60
#: Times a phase's scripts are planned and sent again (a bucket count
#: another worker changed meanwhile, a replayed script's rest).
_PHASE_ROUNDS = 8


def _level(n: int) -> int:
    level = 1
    while level * 2 <= n:
        level *= 2
    return level


def _plan_buckets(ops: list[tuple[Any, ...]], positions: list[int], n: int, pages: int,
                  limit: int) -> tuple[int, set[int]]:
    """The splits (at most *limit*) a host of *n* buckets and *pages* pages
    needs for the writes at *positions*, and the buckets those touch."""
    adding = sum(1 for at in positions if ops[at][0] in _ADDS)
    splits = 0
    while splits < limit and pages + adding > (n + splits) * BUCKET_LOAD:
        splits += 1
    buckets: set[int] = set()
    for s in range(splits):
        buckets.update((n + s - _level(n + s), n + s))
    for at in positions:
        if ops[at][0] not in ("links", "unlink"):
            buckets.add(bucket_of(ops[at][3], n + splits))
    return splits, buckets


def _refused_write(exc: BaseException | None) -> bool:
    """Whether *exc* (or what it was raised from) is Redis refusing a write
    before it ran: above maxmemory (OOM) or a replica (READONLY)."""
    while exc is not None:
        if isinstance(exc, (redis.exceptions.OutOfMemoryError,
                            redis.exceptions.ReadOnlyError)):
            return True
        if isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith(
                ("OOM", "READONLY")):
            return True
        exc = exc.__cause__
    return False


def _applied_bucket(token: str) -> int:
    """The bucket of ``P:fxdone`` a script's token is noted in once its
    effects are applied: its first three hex digits (cluster_scope.lua)."""
    try:
        return int(token[:3], 16)
    except ValueError:
        return 0


def _has_effects(reply: dict[str, Any]) -> bool:
    """Whether a group script's effects change anything in its scope's
    shard (as cluster_host.lua keeps a ledger entry for them)."""
    return bool(reply.get("splits") or reply.get("hosts") or reply.get("new_host")
                or reply.get("sums") or reply.get("checks") or reply.get("due"))


def _listed_hosts(reply: dict[str, Any], part: str) -> list[str]:
    """The hosts (key parts) a group script's effects list in their scope:
    its ``hosts``; an entry of a host's own script (layout 6, left in a
    ledger a migration moved) says ``new_host`` of its host, *part*."""
    hosts = list(reply.get("hosts") or [])
    if reply.get("new_host"):
        hosts.append(part)
    return hosts


#: What reading a ledger entry's effects can raise on a damaged one (what
#: entry_effects finds, and what building a bundle of them would raise on
#: a damage it did not foresee: inf reaches int() as OverflowError).
_UNREADABLE = (ValueError, TypeError, AttributeError, ArithmeticError)


def _entry_bundle(effects: dict[str, Any], part: str, ledger: str, where: tuple[str, str],
                  *, expired: bool) -> _Effects:
    """The effects of a ledger entry of group *part*, to be applied: whole,
    or, *expired*, its idempotent parts (see :meth:`_Effects.expired`).
    *effects* are checked already (:func:`entry_effects`): one of
    ``_UNREADABLE`` raised here is a damage that check missed, said the
    same way."""
    if expired:
        return _Effects.expired(effects, part, ledger, where)
    bundle = _Effects(ledger=ledger, where=where)
    bundle.add(effects, part)
    return bundle


def _entries_gone(held: list[tuple[str, str]], there: list[Any]) -> list[tuple[str, str]]:
    """The held tokens' entries (ledger, token) that ``HEXISTS`` (its
    replies *there*) found gone. An entry is written (phase 2) before its
    token is held (phase 3): one missing now was deleted, and never comes
    back (a token names one script)."""
    for found in there:
        if isinstance(found, Exception):
            raise found
    return [entry for entry, found in zip(held, there, strict=True) if not int(found)]


@dataclass
class _Effects:
    """What phase 2 applied that phase 3 writes in a scope's slot."""

    sums: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)
    due: dict[str, int] = field(default_factory=dict)
    splits: int = 0
    hosts: set[str] = field(default_factory=set)
    latest: int | None = None
    #: Some effects were dropped (see :meth:`expired`): the shard's sums
    #: are marked not to be trusted (``P:nvm`` ``lost``).
    lost: bool = False
    #: The host group's ledger that keeps them until they are applied ('' none).
    ledger: str = ""
    #: (shard part, group part) of that group: its write-ahead intent
    #: (P:fxhosts of its scope shard) is dropped once none of its effects
    #: is pending.
    where: tuple[str, str] = ("", "")

    def add(self, reply: dict[str, Any], part: str) -> None:
        for key, (pages, size) in (reply.get("sums") or {}).items():
            visit, _, callback = key.partition("|")
            total = self.sums.setdefault((int(visit), callback), [0, 0])
            total[0] += int(pages)
            total[1] += int(size)
        checks = reply.get("checks") or []
        for member, at in checks:
            self._check(member, "" if at == "" else str(int(at)))
        for member, raw in (reply.get("due") or {}).items():
            visit = int(raw)
            self.due[member] = min(self.due.get(member, visit), visit)
        self.splits += int(reply.get("splits") or 0)
        self.hosts.update(_listed_hosts(reply, part))
        latest = reply.get("latest")
        if latest not in (None, ""):
            self.latest = max(int(latest), self.latest or int(latest))

    @classmethod
    def expired(cls, reply: dict[str, Any], part: str, ledger: str,
                where: tuple[str, str]) -> _Effects:
        """The effects of a ledger entry older than ``_LEDGER_HONOURED``
        (its worker died between its phases 2 and 3, or before its ledger's
        clean-up, and nothing read the scope for that long): ``P:fxdone``
        may have forgotten they were
        applied, so only what may be applied twice is: the host listed in
        its shard (SADD, when the entry lists it: a repair's does not) and
        the revisit bounds lowered (ZADD LT). The
        sums, checks and splits are dropped and the shard's sums marked
        lost: a summary then reads every page (:meth:`_shard_checks`).
        Nothing of it is applied, nothing marked, when the shard's
        ``P:fxdone`` or ``P:fxheld`` lists its token (applied: 'done')."""
        bundle = cls(ledger=ledger, where=where, lost=True)
        for member, raw in (reply.get("due") or {}).items():
            visit = int(raw)
            bundle.due[member] = min(bundle.due.get(member, visit), visit)
        bundle.hosts.update(_listed_hosts(reply, part))
        return bundle

    def _check(self, member: str, checked: str) -> None:
        """A page's check noted: the latest of those noted (its time, or ''
        for a page without a callback now, which changes nothing when
        applied: see cluster_scope.lua), whatever order they come in."""
        was = self.checks.get(member, "")
        if was == "" or (checked != "" and int(checked) > int(was)):
            self.checks[member] = checked

    def merge(self, newer: _Effects) -> None:
        for key, (pages, size) in newer.sums.items():
            total = self.sums.setdefault(key, [0, 0])
            total[0] += pages
            total[1] += size
        for member, checked in newer.checks.items():
            self._check(member, checked)
        for member, visit in newer.due.items():
            self.due[member] = min(self.due.get(member, visit), visit)
        self.splits += newer.splits
        self.hosts |= newer.hosts
        self.lost |= newer.lost
        if newer.latest is not None:
            self.latest = max(newer.latest, self.latest or newer.latest)


@dataclass
class _Carried:
    """What phases 1 and 2 applied and phase 3 (or phase 2's page index
    members) has not written yet: sent with the next flush."""

    #: Per scope shard (its part, ``<s>^<x>``), phase 2's effects by the
    #: token of the script that returned them (each applied once by the
    #: shard's script).
    effects: dict[str, dict[str, _Effects]] = field(default_factory=dict)
    #: Effects sent to a scope's script, by its tag, until its reply says
    #: what became of them (kept as sent when the reply was lost).
    sent_effects: dict[str, dict[str, _Effects]] = field(default_factory=dict)
    #: Ledger entries (host group's ledger, token) whose effects were applied:
    #: deleted with the next pipeline.
    ledger_done: list[tuple[str, str]] = field(default_factory=list)
    #: Ledger entries deleted (their pipeline answered): their tokens go
    #: from their shard's ``P:fxheld`` with the next pipeline (not with the
    #: deletion: a token let go before its entry is gone would leave an
    #: applied entry that nothing says was applied, once P:fxdone forgets).
    held_done: list[tuple[str, str]] = field(default_factory=list)
    #: Hosts (shard part, host part) some of whose effects were applied:
    #: this worker's intent on them is dropped with the next pipeline when
    #: none of their effects is pending any more.
    intents_done: set[tuple[str, str]] = field(default_factory=set)
    #: The page index's members to add and to remove: (key, member) ->
    #: the item version of the write that made each (see cluster_bypage.lua).
    bypage_add: dict[tuple[str, str], int] = field(default_factory=dict)
    bypage_remove: dict[tuple[str, str], int] = field(default_factory=dict)

    def empty(self) -> bool:
        return not (self.effects or self.sent_effects or self.bypage_add
                    or self.bypage_remove)


def _host_groups(ops: list[tuple[Any, ...]], applied: set[int]
                 ) -> tuple[dict[tuple[str, str], list[int]], dict[str, list[int]],
                            dict[str, tuple[str, str]]]:
    """Phase 2's writes: by host (scope part, host part) and by host
    group's tag, and each tag's (scope part, group part). One script a
    group: its hosts' writes in staging order (a script's count of writes
    applied is of a prefix of them, the same when they are sent again
    with more after them: see cluster_host.lua). A
    ``rebound`` is noted applied: not on a cluster (raising a bound there
    needs a mark set before the bucket was read, a summary's; the due read
    set none: a stale bound stays a lower bound until then)."""
    by_host: dict[tuple[str, str], list[int]] = {}
    for n, op in enumerate(ops):
        if op[0] in _HOST_OPS:
            by_host.setdefault((op[1], op[2]), []).append(n)
        elif op[0] == "rebound":
            applied.add(n)
    groups: dict[str, list[int]] = {}
    heads: dict[str, tuple[str, str]] = {}
    for (scope_part, part), positions in by_host.items():
        tag = f"{{{scope_part}|{host_group(part)}}}"
        heads.setdefault(tag, (scope_part, host_group(part)))
        groups.setdefault(tag, []).extend(positions)
    for positions in groups.values():
        positions.sort()
    return by_host, groups, heads


def _settle_rounds(ops: list[tuple[Any, ...]]) -> list[int]:
    """Where the rounds of a flush's phases end: after a ``settle`` that a
    write of a group (an item, a mark) follows, so that the crawl's marks
    are settled after those staged before it and before those after it."""
    ends = []
    settled = False
    for n, op in enumerate(ops):
        if op[0] == "settle":
            settled = True
        elif settled and op[0] in _GROUP_OPS:
            ends.append(n)
            settled = False
    return [*ends, len(ops)]


class _PhaseFailed(Exception):
    """A script of a phase failed (its error said): the next is not sent."""


class RedisClusterPath(RedisCore):
    """The flush and page reads of the cluster layout (see the module
    docstring)."""

    #: What is left of earlier flushes for phase 3, and the scripts whose
    #: outcome is unknown (their reply was lost): slot tag -> (token, how
    #: many of that slot's first writes it held).
    _carried: _Carried
    _unsure_slots: dict[str, tuple[str, int]]
    #: The hosts whose writes an unsure token's script did not hold,
    #: though staged among them (set apart after a damaged host's write:
    #: see _send_phase): skipped when the token's writes are found again.
    _unsure_apart: dict[str, frozenset[Any]]
    #: When each unsure token's reply was lost (its token lives _TOKEN_TTL).
    _unsure_slot_since: dict[str, float]
    #: Tokens of scripts whose outcome is known: deleted with the next flush.
    _spent_slot_tokens: list[str]

    def _init_cluster(self) -> None:
        #: Seconds after which another flush's effects left in a host's
        #: ledger are taken by a flush that writes that host (their worker
        #: died before its phase 3, or is slow: applied once either way).
        self.adopt_after = _ADOPT_AFTER
        #: Names this store's write-ahead intents (P:fxhosts: one member
        #: per host and worker, so that one worker's drop leaves another's).
        self._worker_id = uuid.uuid4().hex
        self._carried = _Carried()
        self._unsure_slots = {}
        self._unsure_apart = {}
        self._unsure_slot_since = {}
        self._spent_slot_tokens = []
        #: Whether an adoption refused by Redis was logged (once a store).
        self._adoption_refused_said = False

    # -- the phased flush ------------------------------------------------------

    async def _cluster_apply(self, ops: list[tuple[Any, ...]], scopes: set[str],
                             applied: set[int]) -> str | None:
        """Apply *ops* in three phases, noting in *applied* the positions
        applied as their replies come; the error of the script that failed
        (None: all applied). Raises (chained to the Redis error) when the
        outcome of a phase is unknown, *applied* then holding what the
        phases before it applied; its scripts are noted in
        ``_unsure_slots``. Raises the store's error naming a damaged ledger
        entry a group's script took (phase 2) once the flush ran to its end
        (the entry is another flush's, not a failed write of this one: the
        rest of this flush is sent, so that nothing of it stays only in
        this worker's memory).

        A crawl's marks are settled (``settle``: :meth:`_phase_settle`)
        after the three phases, so after every mark the flush wrote; a
        mark staged after a ``settle`` goes in a second round of the
        phases, after it (staging order)."""
        start = 0
        error: str | None = None
        damaged: list[str] = []
        for end in _settle_rounds(ops):
            done: set[int] = set()
            try:
                error = await self._apply_round(ops[start:end], scopes, done, damaged)
            finally:
                applied.update(start + n for n in done)
            if error is not None:
                break
            start = end
        if damaged:
            also = "" if error is None else (
                f"; a write failed in Redis too ({error}): the writes after it in its slot, "
                "and the phases after it, were not sent")
            raise StoredStateDamaged(f"State store {self.location}: {damaged[0]}{also}")
        return error

    async def _check_flush_hold(self) -> None:
        """Raises HoldLapsed when the flush's writer no longer holds its
        scope (``flush_hold``; the store's)."""
        raise NotImplementedError

    async def _apply_round(self, ops: list[tuple[Any, ...]], scopes: set[str],
                           applied: set[int], damaged: list[str]) -> str | None:
        """:meth:`_cluster_apply` of one round of *ops* (what it says of
        each damaged ledger entry met noted in *damaged*)."""
        carried = self._carried
        spent, self._spent_slot_tokens = self._spent_slot_tokens, []
        try:
            # The writer's hold checked before each phase (the phases are
            # separate awaits: a callback blocking the reactor between two
            # could outlast the hold, and a repair run meanwhile): a phase
            # runs only under a hold checked after the phase before it.
            await self._check_flush_hold()
            await self._phase_items(ops, applied, carried, spent)
            await self._check_flush_hold()
            await self._phase_hosts(ops, applied, carried, damaged)
            await self._check_flush_hold()
            await self._phase_scopes(ops, applied, carried, scopes)
            await self._check_flush_hold()
            await self._phase_settle(ops, applied)
        except _PhaseFailed as exc:
            return str(exc)
        return None

    async def _send_phase(self, groups: dict[str, list[int]], build: Any, applied: set[int],
                          on_reply: Any, plain: Sequence[tuple[Any, ...]] = (),
                          always: frozenset[str] = frozenset(),
                          set_apart: Any = None, part_of: Any = None) -> None:
        """Send one script per slot group (the positions of its writes, in
        order), built by ``build(tag, positions, token)`` -> (script, keys,
        args); each reply is given to ``on_reply(tag, positions, reply, token)``
        as it comes, before a failure is raised (what a script applied is
        accounted for whatever the others did). A group whose script is
        unsure from a flush before sends those writes under that token
        first (a replay applies nothing again and returns what it did),
        then the rest under a new one. A reply ``[b'n' | b'blocked', ...]``
        wrote nothing: the caller plans that group again. Groups in
        *always* are sent even without writes (what they write besides).

        A script that failed at a write stops there; ``set_apart(tag,
        rest, error)``, when given, says which of the writes from that
        one on are still sent and what they leave out (a host group's:
        those of its other hosts, the failed host, so that a damaged host
        costs them nothing): sent under a new token before the first
        failure is raised. Should that script's
        reply be lost, its token's writes are found again (a flush after)
        as the group's writes but those of the hosts left out
        (``part_of(position)``), in order, until a reply of that token is
        read."""
        pending = {tag: list(positions) for tag, positions in groups.items()
                   if positions or tag in always}
        send_plain = list(plain)
        failures: list[str] = []
        # The hosts left out of each group's writes (set apart).
        apart: dict[str, frozenset[Any]] = {}
        rounds = 0
        # Each host set apart earns a round of its own (a group of many
        # damaged hosts costs its healthy ones nothing): still bounded,
        # a host's writes being set apart once.
        while rounds < _PHASE_ROUNDS + sum(len(hosts) for hosts in apart.values()):
            rounds += 1
            if not pending and not send_plain:
                break
            calls, sent = [], []
            for tag, positions in pending.items():
                token, chunk, skip = self._next_chunk(tag, positions, part_of)
                calls.append(build(tag, chunk, token))
                # The hosts this token's writes leave out: those its replay
                # was filtered by, or those set apart in this call.
                sent.append((tag, chunk, token, skip or apart.get(tag, frozenset())))
            try:
                replies = await self._eval_many(calls, send_plain)
            except BaseException:
                # No reply (or none understood): each script may or may not
                # have run; its token will tell. What it left out is kept
                # with it until a reply of that token is read (its reply may
                # be lost again: a replay then must leave out the same hosts,
                # or it would count their writes as its own).
                for tag, chunk, token, skip in sent:
                    self._unsure_slots[tag] = (token, len(chunk))
                    self._unsure_slot_since.setdefault(token, clock.now())
                    if skip:
                        self._unsure_apart[tag] = skip
                raise
            errors = [str(answer) for answer in replies[len(calls):]
                      if isinstance(answer, Exception)]
            send_plain = []
            kept: set[str] = set()
            for (tag, chunk, token, _), reply in zip(sent, replies[:len(calls)], strict=True):
                error = self._take_reply(tag, chunk, token, reply, pending, applied, on_reply,
                                         set_apart, kept, apart)
                if error:
                    errors.append(error)
            if errors:
                failures.extend(errors)
                # Only what was set apart from a failed write goes on.
                pending = {tag: rest for tag, rest in pending.items() if tag in kept}
        else:
            if pending or send_plain:
                failures.append("the flush did not settle: a phase kept being sent again")
        if failures:
            raise _PhaseFailed(failures[0])

    def _next_chunk(self, tag: str, positions: list[int],
                    part_of: Any) -> tuple[str, list[int], frozenset[Any]]:
        """The token and writes of a group's next script, and the hosts
        they leave out: an unsure token's writes found again (see
        :meth:`_send_phase`), else all under a new token."""
        token, held = self._unsure_slots.pop(tag, (None, 0))
        skip = self._unsure_apart.pop(tag, frozenset())
        if not token:
            return uuid.uuid4().hex, positions, frozenset()
        if skip and part_of is not None:
            positions = [at for at in positions if part_of(at) not in skip]
        return token, positions[:held], skip

    def _take_reply(self, tag: str, chunk: list[int], token: str, reply: Any,
                    pending: dict[str, list[int]], applied: set[int],
                    on_reply: Any, set_apart: Any = None,
                    kept: set[str] | None = None,
                    apart: dict[str, frozenset[Any]] | None = None) -> str | None:
        """One script's reply of :meth:`_send_phase`: what it applied, what
        of its group is left to send (in *pending*; a failed script's
        writes *set_apart* from its failure noted in *kept*); its error,
        if any."""
        if isinstance(reply, Exception):
            del pending[tag]
            return str(reply)
        on_reply(tag, chunk, reply, token)
        if reply and reply[0] in (b"n", b"late", b"blocked", b"done"):
            del pending[tag]
            return None
        self._spent_slot_tokens.append(self._token_key(token, tag))
        count, replayed, error = int(reply[0]), int(reply[1]), reply[2]
        applied.update(chunk[:count])
        # (A token's writes are a prefix of the group's but for hosts set
        # apart: what is left is the group's writes not applied.)
        done = set(chunk[:count])
        rest = [at for at in pending[tag] if at not in done]
        if error and not replayed:
            said = error.decode(errors="replace")
            others, left_out = (set_apart(tag, rest, said) if set_apart is not None and rest
                                else ([], None))
            if others and kept is not None and apart is not None:
                pending[tag] = others
                kept.add(tag)
                apart[tag] = apart.get(tag, frozenset()) | {left_out}
            else:
                del pending[tag]
            return said
        if rest:
            # A replay that stopped short, or the writes after it.
            pending[tag] = rest
        else:
            del pending[tag]
        return None

    async def _phase_items(self, ops: list[tuple[Any, ...]], applied: set[int],
                           carried: _Carried, spent: list[str]) -> None:
        groups: dict[str, list[int]] = {}
        # A delivery mark goes with its item's write (the one staged right
        # before it, same key): one write of the group's script, so that a
        # version is never stored without the mark that waits on it.
        marks: dict[int, int] = {}
        last_item: dict[tuple[str, str], int] = {}
        for n, op in enumerate(ops):
            if op[0] == "item":
                tag = key_tag(op[1])
                groups.setdefault(tag, []).append(n)
                last_item[tag, op[6]] = n
            elif op[0] == "undeliv":
                tag = key_tag(op[1])
                at = last_item.pop((tag, op[5]), None)
                if at is not None and at not in marks:
                    marks[at] = n
                else:
                    groups.setdefault(tag, []).append(n)  # on its own (a safeguard)
            elif op[0] == "redeliv":
                groups.setdefault(key_tag(op[1]), []).append(n)

        def build(tag: str, positions: list[int], token: str) -> Any:
            return self._items_call(tag, token, [ops[n] for n in positions],
                                    [None if n not in marks else ops[marks[n]]
                                     for n in positions])

        # The versions the items got, and the page index's members the
        # items made stale (removed in phase 3).
        versions: dict[int, int] = {}
        # This flush's stale members (netted within each group's script:
        # not undone by this flush's additions, which came before them).
        removals: dict[tuple[str, str], int] = {}

        def on_reply(tag: str, chunk: list[int], reply: Any, token: str) -> None:
            count = int(reply[0])
            done = json.loads(reply[3]) if reply[3] else {}
            for n, number in zip(chunk[:count], done.get("versions") or [], strict=False):
                versions[n] = int(number)
            scope_part = tag[1:tag.index("#")]
            for member, version in done.get("remove") or []:
                page = member.partition("\0")[0]
                where = (self._group_key("bypage", scope_part, page), member)
                removals[where] = max(int(version), removals.get(where, 0))

        cleanup, sent = self._ledger_cleanup()
        try:
            # The tokens of the flush before go with the first pipeline.
            await self._send_phase(groups, build, applied, on_reply, [
                *(("DEL", key) for key in spent), *cleanup])
            self._ledger_cleaned(sent)
        finally:
            # A mark is applied with its item's write.
            applied.update(mark for at, mark in marks.items() if at in applied)
            for n, op in enumerate(ops):
                if op[0] == "item" and n in versions and op[12] == "1" and op[11]:
                    # Its page's member, added in phase 2 (after the item);
                    # a removal left from a flush before is undone.
                    member = f"{op[11]}\0{op[6]}"
                    carried.bypage_add[op[5], member] = versions[n]
                    carried.bypage_remove.pop((op[5], member), None)
            for where, version in removals.items():
                carried.bypage_remove[where] = max(version,
                                                   carried.bypage_remove.get(where, 0))

    def _items_call(self, tag: str, token: str, writes: list[tuple[Any, ...]],
                    marks: list[tuple[Any, ...] | None]) -> tuple[str, list[str], list[Any]]:
        """An item group's script of phase 1 (``cluster_items.lua``): its
        keys and arguments for the group's *writes*, each item write with
        its delivery mark (in *marks*, ``None``: none)."""
        def head(kind: str) -> str:
            return f"{self.prefix}:{kind}:{tag}"

        keys, key_at = _declared([self._token_key(token, tag), head("items"), head("itemver"),
                                  head("order"), head("undelc")])

        args: list[Any] = []
        for op, mark in zip(writes, marks, strict=True):
            if op[0] == "item":
                crawl, at = ("", 0) if mark is None else (mark[3], key_at(mark[1]))
                args += ["item", key_at(op[4]), *op[6:14], crawl, at]
            elif op[0] == "redeliv":
                args += ["redeliv", key_at(op[1]), key_at(op[2]), op[4], op[5]]
            else:
                args += ["undeliv", key_at(op[1]), op[3], op[5], op[6]]
        return CLUSTER_ITEMS_LUA, keys, args

    def _group_key(self, kind: str, scope_part: str, name: str) -> str:
        return f"{self.prefix}:{kind}:{{{scope_part}#{item_group(name)}}}"

    async def _phase_hosts(self, ops: list[tuple[Any, ...]], applied: set[int],
                           carried: _Carried, damaged: list[str]) -> None:
        by_host, groups, heads = _host_groups(ops, applied)
        # Each group's scope shard (its hosts'): its intents and its
        # effects go there.
        shards = {tag: shard_part(scope_part, group_shard(group))
                  for tag, (scope_part, group) in heads.items()}
        # The write-ahead intent, before any host script runs: one script
        # per scope of the hosts about to be written, so that a worker gone
        # before its phase 3 leaves its effects findable from the scope
        # (its host may never be written again: see adopt_ledgers).
        #
        # When a reader may drop an intent: it is scored by its node's
        # TIME (cluster_intent_add.lua), and a host script of this flush
        # writes only up to that time + adopt_after // 2 on its own node's
        # clock (else it writes nothing and says 'late': the intent is
        # written again, the script resent); a reader drops an intent only
        # when, by the intents' node's time it read them with, it is
        # adopt_after old (before it read the ledgers). So no ledger entry
        # can land after a reader dropped its intent unless the nodes'
        # clocks differ by more than adopt_after // 2 - 1 s (the workers'
        # clocks and stalls play no part: a stalled worker's phase 2 is
        # late, a fast reader clock is not used).
        intents: dict[str, list[str]] = {}
        for tag, (_, group) in heads.items():
            intents.setdefault(shards[tag], []).append(self._intent_member(group))
        first = sorted(intents)
        counts, said = await self._part_counts(list(by_host),
                                               self._intent_calls(intents, first))
        stamps = {shard: int(at) for shard, at in zip(first, said, strict=True)}
        late: set[str] = set()
        limits: dict[tuple[str, str], int] = {}

        def build(tag: str, positions: list[int], token: str) -> Any:
            return self._group_call(tag, heads[tag][0], token, ops, positions, counts, limits,
                                    stamps[shards[tag]] + self.adopt_after // 2)

        again: dict[str, list[int]] = {}

        def on_reply(tag: str, chunk: list[int], reply: Any, token: str) -> None:
            scope_part, group = heads[tag]
            if reply[0] == b"n":
                for k in range(1, len(reply), 2):
                    part = reply[k].decode()
                    counts[scope_part, part] = (int(reply[k + 1]), counts[scope_part, part][1])
                again[tag] = groups[tag]
            elif reply[0] == b"late":
                late.add(shards[tag])
                again[tag] = groups[tag]
            elif reply[0] == b"blocked":
                for k in range(1, len(reply), 2):
                    limits[tag, reply[k].decode()] = int(reply[k + 1])
                again[tag] = groups[tag]
            else:
                done = self._take_effects(carried.effects.setdefault(shards[tag], {}), tag,
                                          (shards[tag], group), token, reply, damaged)
                for part, (n, pages) in (done.get("counts") or {}).items():
                    counts[scope_part, part] = (int(n or 1), int(pages or 0))

        def set_apart(tag: str, rest: list[int],
                      error: str) -> tuple[list[int], tuple[Any, ...] | None]:
            # A host's damaged key stops the group's script at that host's
            # write (its writes before applied): the group's other hosts'
            # writes after it are still sent, as they were with a script a
            # host (layout 6). A damaged ledger is the whole group's.
            if f"{self.prefix}:fx:{tag}" in error:
                return [], None
            failed = ops[rest[0]][1:3]
            return [at for at in rest if ops[at][1:3] != failed], failed

        def part_of(at: int) -> tuple[Any, ...]:
            return tuple(ops[at][1:3])

        adds = dict(carried.bypage_add)
        failure: _PhaseFailed | None = None
        for _ in range(_PHASE_ROUNDS):
            try:
                await self._send_phase(groups, build, applied, on_reply,
                                       self._bypage_calls("add", adds), set_apart=set_apart,
                                       part_of=part_of)
            except _PhaseFailed as exc:
                # (Raised once the groups planned again are written too.)
                failure = failure or exc
            else:
                for where, version in adds.items():
                    if carried.bypage_add.get(where) == version:
                        del carried.bypage_add[where]
            adds = {}
            if not again:
                break
            await self._say_again(intents, late, stamps)
            groups = {tag: [at for at in positions if at not in applied]
                      for tag, positions in again.items()}
            again = {}
        else:
            failure = failure or _PhaseFailed("the flush did not settle: buckets kept changing")
        # A damaged entry a script took (noted in *damaged*) fails no
        # write of this flush: its scripts' writes were applied, their
        # effects are carried, so phase 3 is sent (the entry left in its
        # ledger; the store's error raised at the flush's end).
        if failure is not None:
            raise failure

    def _group_call(self, tag: str, scope_part: str, token: str, ops: list[tuple[Any, ...]],
                    positions: list[int], counts: dict[tuple[str, str], tuple[int, int]],
                    limits: dict[tuple[str, str], int],
                    deadline: int) -> tuple[str, list[str], list[Any]]:
        """A host group's script of phase 2 (``cluster_host.lua``): its keys
        and arguments for the writes at *positions* (in staging order, each
        naming its host: a replay's prefix is the same writes), each host's
        splits and buckets planned from its *counts* (at most its *limits*
        of splits), its writes refused past *deadline*."""
        mine: dict[str, list[int]] = {}
        for at in positions:
            mine.setdefault(ops[at][2], []).append(at)
        keys = [self._token_key(token, tag), f"{self.prefix}:fx:{tag}"]
        args: list[Any] = [self._listpack_value, self.adopt_after, deadline, len(mine)]
        number: dict[str, int] = {}
        for part, at_host in mine.items():
            n, pages = counts[scope_part, part]
            splits, buckets = _plan_buckets(ops, at_host, n, pages,
                                            limits.get((tag, part), MAX_SPLITS))
            head = host_tag(scope_part, part)
            base = len(keys) + 1
            keys += [f"{self.prefix}:hd:{head}", f"{self.prefix}:ln:{head}",
                     f"{self.prefix}:wg:{head}"]
            for b in sorted(buckets):
                keys += [f"{self.prefix}:pg:{head}:{b}", f"{self.prefix}:pgl:{head}:{b}"]
            args += [part, n, splits, base, len(buckets), *sorted(buckets)]
            number[part] = len(number) + 1
        for at in positions:
            args += [number[ops[at][2]], ops[at][0], *ops[at][3:]]
        return CLUSTER_HOST_LUA, keys, args

    def _take_effects(self, bundles: dict[str, _Effects], tag: str, where: tuple[str, str],
                      token: str, reply: Any, damaged: list[str]) -> dict[str, Any]:
        """A group script's effects into *bundles* (under its token), and
        those it took from its group's ledger (under theirs: another flush
        left them there, its worker dead before its phase 3, or slow; the
        scope's script applies each token's once). Returns its own, decoded.
        A taken entry that cannot be read is left in the ledger as it is,
        what the flush says of it noted in *damaged* (raised at the flush's
        end, the rest of it sent: the script applied its writes, which must
        not be sent again, and its effects go to this flush's phase 3).

        The taken ones go in first (they were in the ledger before this
        script wrote); the order matters to nothing the scope's script
        applies (sums add up, bounds only lower, checks only raise)."""
        ledger = f"{self.prefix}:fx:{tag}"
        part = where[1]
        done = json.loads(reply[3]) if reply[3] else {}
        taken = json.loads(reply[4]) if len(reply) > 4 and reply[4] else []
        for other, raw, *expired in taken:
            try:
                bundle = _entry_bundle(entry_effects(raw), part, ledger, where,
                                       expired=bool(expired and expired[0]))
            except _UNREADABLE as exc:
                damaged.append(damaged_entry(ledger, other, exc))
                continue
            bundles.setdefault(other, bundle)
        if done and (int(reply[0]) or _has_effects(done)):
            # Even with no write applied: its splits were made before the
            # writes (the new bucket's bound, the host listed), and a
            # replay returns the same.
            bundles[token] = _Effects(ledger=ledger, where=where)
            bundles[token].add(done, part)
        return done

    def _scope_call(self, tag: str, token: str, bundles: dict[str, _Effects],
                    writes: list[tuple[Any, ...]]) -> tuple[str, list[str], list[Any]]:
        """The scope's script of phase 3 (``cluster_scope.lua``): its keys
        and arguments for the effects *bundles* (by the token of the
        script that returned each) and the scope's *writes*."""
        effects = _Effects()
        for bundle in bundles.values():
            effects.merge(bundle)
        def head(kind: str) -> str:
            return f"{self.prefix}:{kind}:{tag}"

        keys, key_at = _declared([self._token_key(token, tag), head("dueb"), head("splits"),
                                  head("hs"), head("nvs"), head("nvm"), head("ck"), head("duer"),
                                  head("fxheld")])

        args: list[Any] = [len(bundles)]
        for other in sorted(bundles):
            # Its bucket of the tokens applied, and its ledger (what
            # P:fxheld notes: see cluster_scope.lua).
            args += [other, key_at(f"{head('fxdone')}:{_applied_bucket(other)}"),
                     bundles[other].ledger]
        args.append(len(effects.sums))
        for (visit, callback), (pages, size) in sorted(effects.sums.items()):
            args += [visit, callback, pages, size,
                     key_at(f"{head('nvf')}:{math.floor(visit / _SUM_MINUTE)}")]
        args.append(len(effects.checks))
        for member, checked in sorted(effects.checks.items()):
            args += [member, checked]
        args.append("" if effects.latest is None else effects.latest)
        args.append(len(effects.due))
        for member, visit in sorted(effects.due.items()):
            args += [member, visit]
        args += [effects.splits, int(effects.lost), len(effects.hosts),
                 *sorted(effects.hosts)]
        for op in writes:
            out = list(op[1:])
            for k in _KEY_ARGS[op[0]]:
                out[k] = key_at(op[1 + k])
            args += [op[0], *out]
        return CLUSTER_SCOPE_LUA, keys, args

    async def _part_counts(self, parts: list[tuple[str, str]],
                           before: Sequence[tuple[Any, ...]] = ()
                           ) -> tuple[dict[tuple[str, str], tuple[int, int]], list[Any]]:
        """Each host's bucket count and page count by key parts (scope
        part, host part): the flush plans its splits and buckets from them.
        The writes *before* go in the same pipeline (their errors raised,
        their replies returned second)."""
        if not parts and not before:
            return {}, []
        replies = await self._eval_many([], [*before, *(
            ("HMGET", f"{self.prefix}:hd:{host_tag(s, h)}", "n", "p") for s, h in parts)])
        for reply in replies[:len(before)]:
            if isinstance(reply, Exception):
                raise _PhaseFailed(str(reply))
        said, replies = replies[:len(before)], replies[len(before):]
        counts = {}
        for pair, reply in zip(parts, replies, strict=True):
            if isinstance(reply, Exception):
                raise _PhaseFailed(str(reply))
            counts[pair] = (_whole(reply[0], 1), _whole(reply[1], 0))
        return counts, said

    async def _phase_scopes(self, ops: list[tuple[Any, ...]], applied: set[int],
                            carried: _Carried, scopes: set[str]) -> None:
        groups: dict[str, list[int]] = {}
        for n, op in enumerate(ops):
            if op[0] in _SCOPE_OPS:
                groups.setdefault(key_tag(op[1]), []).append(n)
        effect_tags = {f"{{{part}}}" for part, bundles in carried.effects.items()
                       if bundles} | set(carried.sent_effects)
        for tag in effect_tags:
            groups.setdefault(tag, [])

        def build(tag: str, positions: list[int], token: str) -> Any:
            # The effects sent under a token are the ones sent again under
            # it (its replay must be of the same); new ones go with a new token.
            bundles = carried.sent_effects.get(tag)
            if bundles is None:
                bundles = carried.effects.pop(tag[1:-1], {})
                carried.sent_effects[tag] = bundles
            return self._scope_call(tag, token, bundles, [ops[at] for at in positions])

        again: dict[str, list[int]] = {}

        def on_reply(tag: str, chunk: list[int], reply: Any, token: str) -> None:
            bundles = carried.sent_effects.pop(tag, {})
            if reply[0] == b"done":
                # Applied already (sent by another worker too): dropped,
                # the rest sent again under a new token.
                for seen in reply[1:]:
                    bundle = bundles.pop(seen.decode(), None)
                    if bundle is not None and bundle.ledger:
                        carried.ledger_done.append((bundle.ledger, seen.decode()))
                        carried.intents_done.add(bundle.where)
                carried.effects.setdefault(tag[1:-1], {}).update(bundles)
                again[tag] = groups[tag]
            elif int(reply[3]):
                carried.ledger_done += [(bundle.ledger, other)
                                        for other, bundle in bundles.items() if bundle.ledger]
                carried.intents_done.update(bundle.where for bundle in bundles.values()
                                            if bundle.ledger)
            else:
                # Refused before they were applied (a damaged key): kept.
                carried.effects.setdefault(tag[1:-1], {}).update(bundles)

        plain: list[tuple[Any, ...]] = self._bypage_calls("remove", carried.bypage_remove)
        if scopes:
            plain.append(("SADD", f"{self.prefix}:scopes", *sorted(scopes)))
        removals = dict(carried.bypage_remove)
        for _ in range(_PHASE_ROUNDS):
            await self._send_phase(groups, build, applied, on_reply, plain,
                                   always=frozenset(effect_tags))
            for where, version in removals.items():
                if carried.bypage_remove.get(where) == version:
                    del carried.bypage_remove[where]
            plain, removals = [], {}
            if not again:
                return
            groups = {tag: [at for at in positions if at not in applied]
                      for tag, positions in again.items()}
            effect_tags = set(again)
            again = {}
        raise _PhaseFailed("the flush did not settle: effects kept being applied elsewhere")

    async def _phase_settle(self, ops: list[tuple[Any, ...]], applied: set[int]) -> None:
        """The crawls' marks settled (``stage_delivered``,
        ``stage_settled``) in every item group of their scope, and in the
        scope's own slot (where code before the marks moved to the groups
        kept them): one small script a slot (``cluster_settle.lua``),
        pipelined, each applied as often as sent. A ``settle`` counts as
        applied once every slot's script ran."""
        calls: list[tuple[str, list[str], list[Any]]] = []
        owners: list[int] = []
        for n, op in enumerate(ops):
            if op[0] != "settle":
                continue
            _, scope, crawl, every = op
            part, name = _key_part(scope), quote(crawl, safe="")
            for tag in (*(f"{{{part}#{g}}}" for g in range(ITEM_GROUPS)), f"{{{part}}}"):
                calls.append((CLUSTER_SETTLE_LUA, [f"{self.prefix}:undel:{tag}:{name}",
                                                   f"{self.prefix}:undelc:{tag}"],
                              [crawl, every]))
                owners.append(n)
        if not calls:
            return
        replies = await self._eval_many(calls)
        failed: dict[int, str] = {}
        for n, reply in zip(owners, replies, strict=True):
            if isinstance(reply, Exception):
                failed.setdefault(n, str(reply))
        applied.update(n for n in owners if n not in failed)
        if failed:
            raise _PhaseFailed(next(iter(failed.values())))

    # -- delivery marks, read ----------------------------------------------------

    def _marks_keys(self, scope: str, crawl: str) -> list[str]:
        """A crawl's marks in every item group of *scope*."""
        part, name = _key_part(scope), quote(crawl, safe="")
        return [f"{self.prefix}:undel:{{{part}#{g}}}:{name}" for g in range(ITEM_GROUPS)]

    async def _read_all(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Read-only *commands* in one pipeline; a failed one raises."""
        replies = await self._eval_many([], commands)
        for reply in replies:
            if isinstance(reply, Exception):
                raise self._fail("read failed", reply)
        return replies

    async def _cluster_undelivered_crawls(self, scope: str) -> list[str]:
        """The crawls with marks in any item group of *scope* (every
        group's ``P:undelc``, one pipeline); marks of the scope's own slot
        (written by code before the marks moved to the groups) moved to
        their groups first."""
        part = _key_part(scope)
        old = f"{self.prefix}:undelc:{{{part}}}"
        replies = await self._read_all([
            ("SMEMBERS", old),
            *(("SMEMBERS", f"{self.prefix}:undelc:{{{part}#{g}}}")
              for g in range(ITEM_GROUPS))])
        if replies[0]:
            for crawl in sorted(m.decode() for m in replies[0]):
                await self._move_scope_marks(scope, crawl)
            return await self._cluster_undelivered_crawls(scope)
        return sorted({m.decode() for reply in replies[1:] for m in reply})

    async def _move_scope_marks(self, scope: str, crawl: str) -> None:
        """Move *crawl*'s marks kept in the scope's own slot (code before
        the marks moved to the item groups wrote them in phase 3) to their
        items' groups: each chunk written in its groups before it is taken
        out of the scope's slot, so that a move cut short loses none."""
        part = _key_part(scope)
        old = f"{self.prefix}:undel:{{{part}}}:{quote(crawl, safe='')}"
        while True:
            members = await self._call("ZRANGE", old, "-", "+", "BYLEX", "LIMIT", 0, 1_000)
            if not members:
                break
            commands: list[tuple[Any, ...]] = []
            for member in members:
                key = member.decode().partition("\0")[2].rpartition("\0")[0]
                group = f"{{{part}#{item_group(key)}}}"
                commands += [
                    ("ZADD", f"{self.prefix}:undel:{group}:{quote(crawl, safe='')}", 0, member),
                    ("SADD", f"{self.prefix}:undelc:{group}", crawl)]
            await self._read_all(commands)
            await self._call("ZREM", old, *members)
        await self._call("EVAL", CLUSTER_SETTLE_LUA, 2, old, f"{self.prefix}:undelc:{{{part}}}",
                         crawl, "0")

    async def _merged_marks(self, scope: str, crawl: str, start: str,
                            limit: int) -> list[tuple[bytes, str]]:
        """Up to *limit* of *crawl*'s marks (member, its group's key) after
        *start* (a ZRANGE BYLEX bound), merged over the item groups in
        their order: each group read a few at a time, one pipeline a round
        (the first reads every group; the next only those whose read ran
        out before the merge could go on)."""
        keys = self._marks_keys(scope, crawl)
        per = max(4, -(-2 * limit // len(keys)))
        bound: dict[str, bytes] = dict.fromkeys(keys, start.encode())
        pool: dict[str, list[bytes]] = {key: [] for key in keys}
        more = set(keys)  # groups whose read may have more after it
        heap: list[tuple[bytes, str]] = []
        out: list[tuple[bytes, str]] = []
        while len(out) < limit:
            read = [key for key in keys if key in more and not pool[key]]
            if read:
                replies = await self._read_all([
                    ("ZRANGE", key, bound[key], "+", "BYLEX", "LIMIT", 0, per) for key in read])
                for key, members in zip(read, replies, strict=True):
                    if len(members) < per:
                        more.discard(key)
                    if members:
                        bound[key] = b"(" + members[-1]
                        pool[key] = list(reversed(members))
                        heapq.heappush(heap, (pool[key].pop(), key))
            while len(out) < limit and heap:
                member, key = heapq.heappop(heap)
                out.append((member, key))
                if pool[key]:
                    heapq.heappush(heap, (pool[key].pop(), key))
                elif key in more:
                    break  # its next is not read yet: read before going on
            else:
                if not heap:
                    break
        return out

    def _bypage_calls(self, op: str, members: dict[tuple[str, str], int]
                      ) -> list[tuple[Any, ...]]:
        """The page index's additions or removals, one script a key (with
        its versions' hash, same slot: ``cluster_bypage.lua``)."""
        by_key: dict[str, list[Any]] = {}
        for (key, member), version in sorted(members.items()):
            by_key.setdefault(key, []).extend((op, member, version))
        index = f"{self.prefix}:bypage:"
        return [("EVAL", CLUSTER_BYPAGE_LUA, 2, key,
                 f"{self.prefix}:bypagev:{key[len(index):]}", *args)
                for key, args in by_key.items()]

    # -- write-ahead intents and the adoption of a dead worker's effects -------

    def _intents_key(self, shard: str) -> str:
        """The write-ahead intents of a scope shard (by its part, ``<s>^<x>``)."""
        return f"{self.prefix}:fxhosts:{{{shard}}}"

    def _intent_member(self, part: str) -> str:
        return f"{part}\0{self._worker_id}"

    def _intent_calls(self, intents: dict[str, list[str]],
                      shards: list[str]) -> list[tuple[Any, ...]]:
        # One script per scope shard: its members scored by its node's TIME.
        return [("EVAL", CLUSTER_INTENT_ADD_LUA, 1, self._intents_key(shard),
                 *intents[shard]) for shard in shards]

    async def _say_again(self, intents: dict[str, list[str]], late: set[str],
                         stamps: dict[str, int]) -> None:
        """Write again the intents of the shards whose host scripts were
        past their deadline (this worker stalled: see _phase_hosts), newly
        stamped, before those hosts are sent again."""
        if not late:
            return
        resaid = sorted(late)
        _, said = await self._part_counts([], self._intent_calls(intents, resaid))
        stamps.update(zip(resaid, (int(at) for at in said), strict=True))
        late.clear()

    def _ledger_bundles(self, shard: str, parts: list[str], ledgers: list[str],
                        entries: list[Any]) -> dict[str, _Effects]:
        """The effects of the ledgers' entries by token (those too old to
        apply whole, their idempotent parts): see :meth:`_adoption`."""
        found_all: list[tuple[float, str, _Effects]] = []
        for part, ledger, reply in zip(parts, ledgers, entries, strict=True):
            if isinstance(reply, Exception):
                raise reply
            # The ledger's node's time first: an entry's age is told on the
            # clock that stamped it (the host script's TIME), not ours.
            ledger_now, found = int(reply[0]), reply[1:]
            for k in range(0, len(found), 2):
                token = found[k].decode()
                try:
                    entry = read_entry(found[k + 1])
                    if entry is None:
                        continue  # not an entry (the host script drops those)
                    stamped, effects = entry
                    # Past _LEDGER_HONOURED P:fxdone may have forgotten it
                    # was applied (it keeps _APPLIED_KEPT, on its own node's
                    # clock): applying it whole could count it twice. Only
                    # its idempotent parts are applied (as the host script's
                    # caller does): the host listed, its bounds lowered, the
                    # shard's sums marked lost; unless P:fxdone or P:fxheld
                    # lists its token (the scope's script says 'done':
                    # nothing marked).
                    bundle = _entry_bundle(effects, part, ledger, (shard, part),
                                           expired=ledger_now - stamped > _LEDGER_HONOURED)
                except _UNREADABLE as exc:
                    # Damaged: the reading stops before anything is applied
                    # (every entry stays for the reading after its repair).
                    raise self._fail(damaged_entry(ledger, token, exc)) from exc
                found_all.append((stamped, token, bundle))
        # Oldest first (a ledger's hash has no order of its own); what the
        # scope's script applies of them does not depend on it.
        found_all.sort(key=lambda found: found[0])
        return {token: bundle for _, token, bundle in found_all}

    def _ledger_cleanup(self) -> tuple[list[tuple[Any, ...]],
                                       tuple[list[Any], set[Any], list[Any]]]:
        """The commands that delete the ledger entries whose effects were
        applied, and drop this worker's intents on hosts none of whose
        effects it still holds (the next flush that writes such a host says
        so again before its phase 2); and what they clean, for
        :meth:`_ledger_cleaned` once they were sent. Kept until then: a
        pipeline that fails sends them again with the next (HDEL and ZREM
        of what is gone change nothing)."""
        carried = self._carried
        pending = {bundle.where for by_token in (*carried.effects.values(),
                                                 *carried.sent_effects.values())
                   for bundle in by_token.values()}
        unsure = set(self._unsure_slots)
        entries = list(carried.ledger_done)
        commands: list[tuple[Any, ...]] = [("HDEL", ledger, token) for ledger, token in entries]
        released = list(carried.held_done)
        commands += self._release_held(released)
        dropped = set()
        for where in sorted(carried.intents_done):
            shard, part = where
            if where in pending or f"{{{scope_of_shard(shard)}|{part}}}" in unsure:
                continue
            commands.append(("ZREM", self._intents_key(shard), self._intent_member(part)))
            dropped.add(where)
        return commands, (entries, dropped, released)

    def _ledger_cleaned(self, sent: tuple[list[Any], set[Any], list[Any]]) -> None:
        """Forget what :meth:`_ledger_cleanup`'s commands cleaned: they were
        sent and answered. The entries deleted have their tokens let go of
        next (:attr:`_Carried.held_done`)."""
        entries, dropped, released = sent
        carried = self._carried
        gone = set(entries)
        carried.ledger_done = [entry for entry in carried.ledger_done if entry not in gone]
        carried.intents_done -= dropped
        let_go = set(released)
        carried.held_done = [entry for entry in carried.held_done if entry not in let_go]
        carried.held_done += [entry for entry in entries if entry not in carried.held_done]

    def _release_held(self, entries: list[tuple[str, str]]) -> list[tuple[Any, ...]]:
        """The commands that let go of the tokens of ledger entries known to
        be gone (host group's ledger, token): one script a shard
        (cluster_held_release.lua). The one rule for a token held in
        ``P:fxheld``: it goes once its entry is known to be gone (the
        pipeline that deleted it answered, or a reading found it gone),
        never before, and is noted anew in ``P:fxdone``, which answers for
        it two days more: a flush that took the entry as expired before it
        went still finds it applied."""
        by_shard: dict[str, set[str]] = {}
        for ledger, token in entries:
            scope_part, _, group = key_tag(ledger)[1:-1].rpartition("|")
            by_shard.setdefault(shard_part(scope_part, ledger_shard(group)), set()).add(token)
        commands: list[tuple[Any, ...]] = []
        for shard, tokens in sorted(by_shard.items()):
            ordered = sorted(tokens)
            buckets = [f"{self.prefix}:fxdone:{{{shard}}}:{_applied_bucket(token)}"
                       for token in ordered]
            commands.append(("EVAL", CLUSTER_HELD_RELEASE_LUA, 1 + len(ordered),
                             f"{self.prefix}:fxheld:{{{shard}}}", *buckets, *ordered))
        return commands

    def _held_tokens(self, shards: list[str], held: list[Any]) -> list[tuple[str, str]]:
        """The tokens held in the *shards*' ``P:fxheld`` (their ``HGETALL``
        replies *held*) as (ledger, token): each to be looked for in its
        ledger. A value that names no ledger of this prefix (a time, as
        code before wrote) is left alone: its entry cannot be looked for."""
        found = []
        ours = f"{self.prefix}:fx:{{"
        for shard, reply in zip(shards, held, strict=True):
            if isinstance(reply, Exception):
                raise reply
            scope_part = scope_of_shard(shard)
            for token, ledger in dict(reply).items():
                name = ledger.decode(errors="replace")
                if name.startswith(f"{ours}{scope_part}|"):
                    found.append((name, token.decode()))
        return found

    def _adoption(self, scope: str, settled_only: bool = False,
                  refused: set[str] | None = None
                  ) -> Generator[list[tuple[Any, ...]], list[Any], None]:
        """Apply every effect left in the ledgers of the hosts the scope's
        intents list (``P:fxhosts:{<s>^<x>}``, one per scope shard): a
        worker gone between its phases 2 and 3 on a host nobody writes
        again would otherwise leave that host's pages out of the scope's
        hosts and revisit index for good. Yields the commands of each round
        trip (every shard's at once) and is sent their replies (run by
        :meth:`adopt_ledgers` or :meth:`adopt_ledgers_sync`); costs one
        round trip (two reads per shard) when nothing is pending or held,
        else one a host listed.

        Every entry read is sent to its shard's script (which applies a
        token's effects once: a live worker's own phase 3 then finds them
        applied). Of an entry older than the tokens' lifetime on its node's
        clock only the idempotent parts are applied, the shard's sums
        marked lost (:meth:`_Effects.expired`; as a flush of its host does). An intent is
        dropped only when, by its node's time read with it, it is
        :attr:`adopt_after` old (its flush's host scripts write nothing past
        half that: its entry, if any, was in the ledger read; see
        :meth:`_phase_hosts`) and still as read (see
        ``cluster_intent_drop.lua``). A shard whose script Redis refused (a
        damaged key) keeps its ledgers and intents for a later try; the
        others are applied (the shards refused noted in *refused*, if given).

        The tokens held in the shards' ``P:fxheld`` are read with the
        intents, and their entries looked for with the ledgers: those whose
        entries are gone are let go (:meth:`_release_held`), whoever
        deleted the entries (a worker killed before it let go of its own)."""
        scope_part = _key_part(scope)
        shards = [shard_part(scope_part, k) for k in range(len(SCOPE_SHARDS))]
        reads = yield [*(("EVAL", CLUSTER_INTENTS_READ_LUA, 1, self._intents_key(shard))
                         for shard in shards),
                       *(("HGETALL", f"{self.prefix}:fxheld:{{{shard}}}") for shard in shards)]
        reads, held = reads[:len(shards)], self._held_tokens(shards, reads[len(shards):])
        listed: dict[str, tuple[int, list[tuple[bytes, bytes]]]] = {}
        for shard, read in zip(shards, reads, strict=True):
            if isinstance(read, Exception):
                raise read
            # Their node's time first: their ages are told on the clock that
            # scored them (see _phase_hosts), before the ledgers are read.
            intents_now, flat = int(read[0]), read[1:]
            pairs = [(flat[k], flat[k + 1]) for k in range(0, len(flat), 2)]
            if settled_only:
                # Only intents adopt_after old: their workers' flushes are
                # dead or past their deadline; a live worker's in-flight
                # effects are left to its own phase 3 (no ledger read, no
                # script for them).
                pairs = [(member, score) for member, score in pairs
                         if intents_now - float(score) >= self.adopt_after]
            if pairs:
                listed[shard] = (intents_now, pairs)
        if not listed and not held:
            return
        parts = {shard: sorted({member.decode().rpartition("\0")[0] for member, _ in pairs})
                 for shard, (_, pairs) in listed.items()}
        ledgers = {shard: [self._group_ledger_key(scope_part, part) for part in found]
                   for shard, found in parts.items()}
        entries = yield [*(("EVAL", CLUSTER_LEDGER_READ_LUA, 1, ledger)
                           for shard in listed for ledger in ledgers[shard]),
                         *(("HEXISTS", ledger, token) for ledger, token in held)]
        entries, there = entries[:len(entries) - len(held)], entries[len(entries) - len(held):]
        gone = _entries_gone(held, there)
        bundles: dict[str, dict[str, _Effects]] = {}
        at = 0
        for shard in listed:
            count = len(ledgers[shard])
            bundles[shard] = self._ledger_bundles(
                shard, parts[shard], ledgers[shard], entries[at:at + count])
            at += count
        applied: list[tuple[str, str]] = []
        spent: list[tuple[Any, ...]] = []
        if refused is None:
            refused = set()
        yield from self._adopt_rounds(bundles, applied, spent, refused)
        drops = []
        for shard, (intents_now, pairs) in listed.items():
            if shard in refused:
                continue
            old = [(member, score) for member, score in pairs
                   if intents_now - float(score) >= self.adopt_after]
            if old:
                drops.append(("EVAL", CLUSTER_INTENT_DROP_LUA, 1, self._intents_key(shard),
                              *(x for pair in old for x in pair)))
        cleanup = [*spent, *(("HDEL", ledger, token) for ledger, token in applied), *drops]
        if cleanup:
            yield cleanup
        # Their entries gone (the pipeline answered): their tokens let go,
        # with those whose entries were found gone.
        if applied or gone:
            yield self._release_held([*applied, *gone])

    def _adopt_rounds(self, bundles: dict[str, dict[str, _Effects]],
                      applied: list[tuple[str, str]], spent: list[tuple[Any, ...]],
                      refused: set[str]) -> Generator[list[tuple[Any, ...]], list[Any], None]:
        """:meth:`_adoption`'s scripts: each shard's *bundles* sent to its
        script, all shards' in one round trip, until each is applied or
        refused; notes the ledger entries *applied*, the tokens *spent* and
        the shards *refused* (a damaged key)."""
        pending = [shard for shard, by_token in bundles.items() if by_token]
        while pending:
            calls = []
            for shard in pending:
                script, keys, args = self._scope_call(f"{{{shard}}}", uuid.uuid4().hex,
                                                      bundles[shard], [])
                calls.append((shard, keys[0], ("EVAL", script, len(keys), *keys, *args)))
            replies = yield [call for _, _, call in calls]
            again = []
            for (shard, token_key, _), reply in zip(calls, replies, strict=True):
                if isinstance(reply, Exception):
                    raise reply
                if reply[0] == b"done":
                    # Applied already (their worker's phase 3, or another
                    # reader): their entries go; the rest is sent again.
                    for seen in reply[1:]:
                        gone = bundles[shard].pop(seen.decode(), None)
                        if gone is not None:
                            applied.append((gone.ledger, seen.decode()))
                    if bundles[shard]:
                        again.append(shard)
                    continue
                spent.append(("DEL", token_key))  # its reply came: nothing to replay
                if not int(reply[3]):
                    # Refused (a damaged key of the shard): left in the
                    # ledgers and the intents for a later try.
                    refused.add(shard)
                    continue
                applied += [(bundle.ledger, other) for other, bundle in bundles[shard].items()]
            pending = again

    async def adopt_ledgers(self, scope: str, settled_only: bool = False) -> None:
        """:meth:`_adoption` on the async client (a crawl's reads); best
        effort (see :meth:`_adoption_refused`). *settled_only*: only the
        hosts of intents :attr:`adopt_after` old (a due reading)."""
        if not self.tagged:
            return
        plan = self._adoption(scope, settled_only)
        replies: Any = None
        try:
            while True:
                commands = plan.send(replies)
                replies = await self._commands(commands, "Redis command failed")
        except StopIteration:
            return
        except (redis.RedisError, StateStoreError) as exc:
            self._adoption_refused(scope, exc)

    def adopt_ledgers_sync(self, scope: str, strict: bool = False) -> None:
        """:meth:`_adoption` on the sync client (holds, admin); best effort
        (see :meth:`_adoption_refused`). *strict* (a repair's): an adoption
        not applied whole (Redis refused a write, or a shard's script
        refused: a damaged key) raises a :class:`StateStoreError`."""
        if not self.tagged:
            return
        refused: set[str] = set()
        plan = self._adoption(scope, refused=refused)
        replies: Any = None
        try:
            while True:
                commands = plan.send(replies)
                pipe = self._sync.pipeline(transaction=False)
                for command in commands:
                    pipe.execute_command(*command)
                replies = self._sync_run(pipe)
        except StopIteration:
            pass
        except (redis.RedisError, StateStoreError) as exc:
            if strict:
                if not _refused_write(exc):
                    raise
                raise StateStoreError(
                    f"State store {self.location}: repair refused: the effects pending in "
                    f"its scope's ledgers could not be applied first (nothing was deleted; "
                    f"Redis refused the write: {exc})") from exc
            self._adoption_refused(scope, exc)
            return
        if strict and refused:
            raise self._fail(
                "repair refused: the effects pending in its scope's ledgers could not be "
                f"applied first (a damaged key in shard(s) {', '.join(sorted(refused))}; "
                "nothing was deleted)")

    def _adoption_refused(self, scope: str, exc: BaseException) -> None:
        """An adoption Redis refused to write (above maxmemory, or a
        replica): the read that runs it goes on without it (a full store
        still opens and reads, and reset_scope, the way to free memory,
        still runs). Nothing is lost: its effects stay in the ledgers and
        the intents for a later writer or reader, and one applied in part
        is applied once (P:fxdone). Any other error is raised."""
        if not _refused_write(exc):
            raise exc
        if not self._adoption_refused_said:
            self._adoption_refused_said = True
            logger.warning(
                "State store %s: a dead worker's effects on scope %r were not applied "
                "(Redis refused the write: %s); they stay in their ledgers for a later "
                "write or read", self.location, scope, exc)

    def _scope_hosts(self, scope: str) -> list[str]:
        # The hosts a dead worker's effects would add first (every read of
        # a scope's hosts: pages, counts, repairs).
        self.adopt_ledgers_sync(scope)
        hosts = super()._scope_hosts(scope)
        # And the hosts the entries in the ledgers of the groups the
        # intents name list: where the adoption was refused (Redis full) a
        # dead worker's host has pages stored but is not in the scope's
        # hosts yet; a reset must delete them all the same, and a read see
        # them (a host with no pages reads as none).
        scope_part = _key_part(scope)
        pipe = self._sync.pipeline(transaction=False)
        for k in range(len(SCOPE_SHARDS)):
            pipe.zrange(self._intents_key(shard_part(scope_part, k)), 0, -1)
        groups = sorted({m.decode().rpartition("\0")[0]
                         for members in self._sync_run(pipe) for m in members})
        if not groups:
            return hosts
        pipe = self._sync.pipeline(transaction=False)
        for group in groups:
            pipe.hvals(self._group_ledger_key(scope_part, group))
        listed: set[str] = set()
        for group, values in zip(groups, self._sync_run(pipe), strict=True):
            for raw in values:
                try:
                    entry = read_entry(raw)
                    if entry is not None:
                        listed.update(host_of_part(part)
                                      for part in _listed_hosts(entry.effects, group))
                except _UNREADABLE:
                    # Damaged: its effects not an object, or their hosts not a
                    # list of host parts. (None: no entry; see ledger_entry.)
                    continue
        return hosts + sorted(listed - set(hosts))
