"""The Redis store on a Redis Cluster: the cluster layout (8), its phased
flush and its reads of pages.

A Redis Cluster runs a script only on the node of its keys' slot, and every
key a script touches must be in its ``KEYS`` and in one slot (Redis 7
refuses a "non local key"). In the cluster layout every key carries a hash
tag: a host's keys its host group's ``{<s>|<g>}``, the host after the tag
(``P:hd:{<s>|<g>}:<h>``; see :data:`~.core.HOST_GROUPS`), a scope's own keys
``{<s>}`` (``P:hosts:{<s>}``, ``P:crawls:{<s>}``, ...), what a page write
changes of its scope per scope shard, which is the host's group, in the
group's slot (``P:dueb:{<s>|<g>}``, ``P:nvs``, ``P:hs``, ...: so that one
scope's writes spread over the primaries, and the group's script applies
them with its pages; see :data:`~.core.SCOPE_SHARDS`),
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
   group's hosts one after the other, one token a group), with what they
   change of the scope in the group's own keys (its hosts, the revisit
   index lowered, the splits, the sums by next visit, the checks since the
   mark: layout 8; layouts 6 and 7 returned them for a third phase, kept
   meanwhile in ledgers), and the page index's new members (after the
   items they list);
3. per scope, the scope's own writes in its own slot
   (``cluster_scope.lua``: host trust, crawl records, rates: kept by the
   worker until applied, so a worker gone before its phase 3 loses them);
   the page index's stale members (``cluster_bypage.lua``: skipped where a
   later item version wrote the member since); ``P:scopes``.

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
and phase 3 has not (the page index's members) is kept by the store
(:class:`_Carried`) and sent with the next flush. A page write and its
effects on the scope are one script: a worker gone after it left nothing
pending.

Reads of the scope shards fan out over the 64 groups, pipelined (the cluster
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
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import redis

from incremental_crawler import clock
from incremental_crawler.state.stores.redis.core import (
    FINE_KEYS,
    ITEM_GROUPS,
    RedisCore,
    _key_part,
    _whole,
    host_group,
    host_tag,
    item_group,
    key_tag,
    logger,
)
from incremental_crawler.state.stores.redis.pages import (
    BUCKET_LOAD,
    MAX_SPLITS,
    bucket_of,
)
from incremental_crawler.state.stores.redis.scripts import (
    CLUSTER_BYPAGE_LUA,
    CLUSTER_HOST_LUA,
    CLUSTER_ITEMS_LUA,
    CLUSTER_SCOPE_LUA,
    CLUSTER_SETTLE_LUA,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

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


@dataclass
class _Carried:
    """What phases 1 and 2 applied that a later phase has not written
    yet: sent with the next flush."""

    #: The page index's members to add and to remove: (key, member) ->
    #: the item version of the write that made each (see cluster_bypage.lua).
    bypage_add: dict[tuple[str, str], int] = field(default_factory=dict)
    bypage_remove: dict[tuple[str, str], int] = field(default_factory=dict)

    def empty(self) -> bool:
        return not (self.bypage_add or self.bypage_remove)


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

    #: What is left of earlier flushes for a later phase (the page index's
    #: members), and the scripts whose
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
        self._carried = _Carried()
        self._unsure_slots = {}
        self._unsure_apart = {}
        self._unsure_slot_since = {}
        self._spent_slot_tokens = []

    # -- the phased flush ------------------------------------------------------

    async def _cluster_apply(self, ops: list[tuple[Any, ...]], scopes: set[str],
                             applied: set[int]) -> str | None:
        """Apply *ops* in three phases, noting in *applied* the positions
        applied as their replies come; the error of the script that failed
        (None: all applied). Raises (chained to the Redis error) when the
        outcome of a phase is unknown, *applied* then holding what the
        phases before it applied; its scripts are noted in
        ``_unsure_slots``.

        A crawl's marks are settled (``settle``: :meth:`_phase_settle`)
        after the three phases, so after every mark the flush wrote; a
        mark staged after a ``settle`` goes in a second round of the
        phases, after it (staging order)."""
        start = 0
        error: str | None = None
        for end in _settle_rounds(ops):
            done: set[int] = set()
            try:
                error = await self._apply_round(ops[start:end], scopes, done)
            finally:
                applied.update(start + n for n in done)
            if error is not None:
                break
            start = end
        return error

    async def _check_flush_hold(self) -> None:
        """Raises HoldLapsed when the flush's writer no longer holds its
        scope (``flush_hold``; the store's)."""
        raise NotImplementedError

    async def _apply_round(self, ops: list[tuple[Any, ...]], scopes: set[str],
                           applied: set[int]) -> str | None:
        """:meth:`_cluster_apply` of one round of *ops*."""
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
            await self._phase_hosts(ops, applied, carried)
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

        try:
            # The tokens of the flush before go with the first pipeline.
            await self._send_phase(groups, build, applied, on_reply, [
                *(("DEL", key) for key in spent)])
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
                           carried: _Carried) -> None:
        # One script a host group, which applies its writes' effects on
        # the scope in the group's own keys (layout 8: the group is its
        # hosts' scope shard): nothing is left for a later phase.
        by_host, groups, heads = _host_groups(ops, applied)
        counts, _ = await self._part_counts(list(by_host))
        limits: dict[tuple[str, str], int] = {}

        def build(tag: str, positions: list[int], token: str) -> Any:
            return self._group_call(tag, heads[tag][0], token, ops, positions, counts, limits)

        again: dict[str, list[int]] = {}

        def on_reply(tag: str, chunk: list[int], reply: Any, token: str) -> None:
            scope_part, _ = heads[tag]
            if reply[0] == b"n":
                for k in range(1, len(reply), 2):
                    part = reply[k].decode()
                    counts[scope_part, part] = (int(reply[k + 1]), counts[scope_part, part][1])
                again[tag] = groups[tag]
            elif reply[0] == b"blocked":
                for k in range(1, len(reply), 2):
                    limits[tag, reply[k].decode()] = int(reply[k + 1])
                again[tag] = groups[tag]
            else:
                answer = json.loads(reply[3]) if reply[3] else {}
                for part, (n, pages) in (answer.get("counts") or {}).items():
                    counts[scope_part, part] = (int(n or 1), int(pages or 0))
                if answer.get("lost") and not int(reply[1]):
                    logger.warning(
                        "State store %s: a stored sum of %s could not be added to (damaged): "
                        "the group's sums are marked lost, and every summary of the scope "
                        "reads its pages", self.location, tag)

        def set_apart(tag: str, rest: list[int],
                      error: str) -> tuple[list[int], tuple[Any, ...] | None]:
            # A host's damaged key stops the group's script at that host's
            # write (its writes before applied): the group's other hosts'
            # writes after it are still sent, as they were with a script a
            # host (layout 6). A damaged key of the group's own is the
            # whole group's.
            if "nothing of the group was applied" in error:
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
            groups = {tag: [at for at in positions if at not in applied]
                      for tag, positions in again.items()}
            again = {}
        else:
            failure = failure or _PhaseFailed("the flush did not settle: buckets kept changing")
        if failure is not None:
            raise failure

    def _group_call(self, tag: str, scope_part: str, token: str, ops: list[tuple[Any, ...]],
                    positions: list[int], counts: dict[tuple[str, str], tuple[int, int]],
                    limits: dict[tuple[str, str], int]) -> tuple[str, list[str], list[Any]]:
        """A host group's script of phase 2 (``cluster_host.lua``): its keys
        and arguments for the writes at *positions* (in staging order, each
        naming its host: a replay's prefix is the same writes), each host's
        splits and buckets planned from its *counts* (at most its *limits*
        of splits), with the group's own keys its writes' effects go to."""
        mine: dict[str, list[int]] = {}
        for at in positions:
            mine.setdefault(ops[at][2], []).append(at)

        def head(kind: str) -> str:
            return f"{self.prefix}:{kind}:{tag}"

        keys = [self._token_key(token, tag), head("dueb"), head("splits"), head("hs"),
                head("nvs"), head("nvm"), head("ck"), head("duer"),
                *(f"{head('nvf')}:{k}" for k in range(FINE_KEYS))]
        args: list[Any] = [self._listpack_value, FINE_KEYS, len(mine)]
        number: dict[str, int] = {}
        for part, at_host in mine.items():
            n, pages = counts[scope_part, part]
            splits, buckets = _plan_buckets(ops, at_host, n, pages,
                                            limits.get((tag, part), MAX_SPLITS))
            host_head = host_tag(scope_part, part)
            base = len(keys) + 1
            keys += [f"{self.prefix}:hd:{host_head}", f"{self.prefix}:ln:{host_head}",
                     f"{self.prefix}:wg:{host_head}"]
            for b in sorted(buckets):
                keys += [f"{self.prefix}:pg:{host_head}:{b}", f"{self.prefix}:pgl:{host_head}:{b}"]
            args += [part, n, splits, base, len(buckets), *sorted(buckets)]
            number[part] = len(number) + 1
        for at in positions:
            args += [number[ops[at][2]], ops[at][0], *ops[at][3:]]
        return CLUSTER_HOST_LUA, keys, args

    def _scope_call(self, tag: str, token: str,
                    writes: list[tuple[Any, ...]]) -> tuple[str, list[str], list[Any]]:
        """The scope's script of phase 3 (``cluster_scope.lua``): its keys
        and arguments for the scope's *writes*."""
        keys, key_at = _declared([self._token_key(token, tag)])
        args: list[Any] = []
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

        def build(tag: str, positions: list[int], token: str) -> Any:
            return self._scope_call(tag, token, [ops[at] for at in positions])

        def on_reply(tag: str, chunk: list[int], reply: Any, token: str) -> None:
            return None

        plain: list[tuple[Any, ...]] = self._bypage_calls("remove", carried.bypage_remove)
        if scopes:
            plain.append(("SADD", f"{self.prefix}:scopes", *sorted(scopes)))
        removals = dict(carried.bypage_remove)
        await self._send_phase(groups, build, applied, on_reply, plain)
        for where, version in removals.items():
            if carried.bypage_remove.get(where) == version:
                del carried.bypage_remove[where]

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
