"""The Redis store's reads of pages by next visit: ``get_due``, a scope's due
pages most overdue first, merged from its buckets in the order of the
revisit index (see :mod:`.pages`), with a cursor that a reader paging
through them goes on with; and ``summarize_pages``, the pages of a window of
next visits in aggregate, from the scope's sums or, when those cannot tell,
from every bucket. Apart from the rest of the crawl-time store because the
merge and its cursor are a job of their own; it reads staged pages, and
stages a bucket's stale bound, through two hooks the store provides."""

from __future__ import annotations

import heapq
import math
from abc import abstractmethod
from typing import TYPE_CHECKING, Any

from incremental_crawler.state.records import PageKey
from incremental_crawler.state.stores.base import PagesSummary, checked_after, due_after
from incremental_crawler.state.stores.redis.core import (
    _SCAN_COUNT,
    _SCAN_ROUNDS,
    RedisCore,
    _key_part,
    fine_part,
    logger,
    scope_shard,
)
from incremental_crawler.state.stores.redis.pages import host_of_part, page_key_of
from incremental_crawler.state.stores.redis.scripts import (
    _DUE_INDEX_SHA,
    _DUE_READ_SHA,
    _SUMMARY_SHA,
    _SUMS_READ_SHA,
    CLUSTER_DUE_INDEX_LUA,
    CLUSTER_DUE_READ_LUA,
    CLUSTER_RAISE_LUA,
    CLUSTER_SUMMARY_LUA,
    CLUSTER_SUMS_COARSE_LUA,
)

if TYPE_CHECKING:
    from collections.abc import Collection

    from incremental_crawler.state.records import PageState
    from incremental_crawler.state.stores.base import DueAfter

__all__ = ["RedisDueReads"]

#: Buckets per due-pages script and per summary script, and summary
#: scripts per round-trip.
_DUE_BUCKETS = 64
#: Due-pages scripts per round-trip once a cap is known, and buckets of the
#: index read per round-trip: a re-seed reads most buckets of the scope
#: whose bound is before its last due page, and a round-trip per 64 of them
#: cost more than the reads themselves.
_DUE_SCRIPTS = 8
_DUE_INDEX_CHUNK = _DUE_BUCKETS * _DUE_SCRIPTS * 2
#: Readings of the due pages a get_due starts at most while other workers
#: split buckets (see _DueCursor.note_splits).
_DUE_STARTS = 4
#: How many times the due pages wanted a merge reads ahead (see _read_due).
_DUE_AHEAD = 4
_SUMMARY_BUCKETS = 16
_SUMMARY_SCRIPTS = 8
#: Stands for an infinite time in scripts (Lua reads no "inf"): beyond any
#: stored time (see _LUA_INT_LIMIT in core.py).
_FOREVER = 10**15


def _limit(value: float, *, up: bool = False) -> int:
    """A time as the scripts compare it: whole seconds (*up*: rounded up),
    infinities as ±_FOREVER."""
    if math.isinf(value):
        return _FOREVER if value > 0 else -_FOREVER
    return math.ceil(value) if up else math.floor(value)


#: A due page read: (next visit, URL, variant, record).
_DuePage = tuple[int, str, str, bytes]


class _IndexPart:
    """How far one revisit index of a scope was read (one server: the
    scope's; a cluster: each scope shard's, merged by bound)."""

    def __init__(self, index: str, splits: str) -> None:
        #: The index's key and its count of splits' key (one slot).
        self.index, self.splits = index, splits
        #: Where it was read up to (a bound, and how many read have it),
        #: and whether it was read to its end.
        self.low = "-inf"
        self.ties = 0
        self.done = False


class _DueCursor:
    """How far a reading of a scope's due pages went (``get_due``)."""

    def __init__(self, scope: str, now: float, flushes: int,
                 after: DueAfter | None = None,
                 parts: list[_IndexPart] | None = None) -> None:
        self.scope, self.now, self.flushes = scope, now, flushes
        #: Where the reading starts (pages after it), and the last page sent.
        self.after = after
        self.last = after
        #: The place of the last page sent as it was sent (a staged page's
        #: staged next visit): what the reader passes back as *after*.
        self.sent = after
        #: Pages due at or before this next visit are not read (before *after*).
        self.floor = -_FOREVER if after is None else int(after[0]) - 1
        #: Due pages read, not yet in place: a heap of _DuePage.
        self.waiting: list[_DuePage] = []
        #: Due pages in place, in order; the first is due page number `base`.
        self.ready: list[_DuePage] = []
        self.base = 0
        #: Buckets of the index not read yet: a heap of (bound, member);
        #: the index's parts (each read in order of bounds, up to a point).
        self.unread: list[tuple[float, bytes]] = []
        self.parts = parts or []
        #: The part of each bucket of ``unread``, by member.
        self.part_of: dict[bytes, int] = {}
        self.seen: set[bytes] = set()
        #: The bounds of the buckets not read yet (a bucket read whose
        #: pages are all after its bound is set right by the next flush).
        self.bounds: dict[bytes, float] = {}
        #: Buckets read up to a cap, with pages due after it: a heap of (the
        #: earliest of those, member, the cap).
        self.parked: list[tuple[int, bytes, int]] = []
        #: The cap of the reads for the due pages wanted: (how many, cap).
        self.cap: tuple[int, int] | None = None
        #: The scope's counts of bucket splits (per key: a cluster's per
        #: shard) when first read, and whether a read since found another
        #: (pages may have moved: start over).
        self.splits: dict[str, bytes] = {}
        self.moved = False

    @property
    def index_done(self) -> bool:
        return all(part.done for part in self.parts)

    def note_splits(self, key: str, splits: bytes) -> None:
        if self.splits.setdefault(key, splits) != splits:
            self.moved = True

    def frontier(self) -> float:
        """The least bound of the buckets not read yet: those unread or
        parked, and every index part's rest (after where it was read to)."""
        rest = min((float(part.low) for part in self.parts if not part.done),
                   default=math.inf)
        return min(self.unread[0][0] if self.unread else math.inf,
                   self.parked[0][0] if self.parked else math.inf, rest)

    def settle(self, need: int) -> bool:
        """Move the waiting pages now certainly in place to ``ready``;
        whether *need* are ready (or nothing is left to read)."""
        frontier = self.frontier()
        while self.waiting and self.waiting[0][0] < frontier:
            self.ready.append(heapq.heappop(self.waiting))
        if frontier == math.inf:
            self.ready += sorted(self.waiting)
            self.waiting = []
            return True
        return self.base + len(self.ready) >= need

    def cap_for(self, need: int, until: int) -> int:
        """The next visits to read up to: the pages that can still be among
        the *need* first, and ahead of them (a reader paging through asks
        for more next, and a bucket read again costs more than a few pages
        sent now). Worked out once enough are waiting: a cap that could be
        lower costs a few pages more, not a read."""
        ahead = _DUE_AHEAD * (need - self.base - len(self.ready))
        frontier = self.frontier()
        # Past it, every bucket left is after the cap: a new one is due.
        if self.cap is None or self.cap[0] != need or self.cap[1] < frontier:
            self.cap = None
            if len(self.waiting) >= ahead:
                self.cap = (need, heapq.nsmallest(ahead, self.waiting)[-1][0])
        return until if self.cap is None else self.cap[1]

    def choose(self, cap: int, most: int) -> list[tuple[bytes, int]]:
        """The next *most* buckets to read (unread or parked, least bound
        first, none whose bound is after *cap*), each with what it was read
        up to."""
        chosen: list[tuple[bytes, int]] = []
        while len(chosen) < most:
            unread = self.unread[0][0] if self.unread else math.inf
            parked = self.parked[0][0] if self.parked else math.inf
            if min(unread, parked) > cap:
                break
            if unread <= parked:
                member = heapq.heappop(self.unread)[1]
                self.part_of.pop(member, None)
                chosen.append((member, self.floor))
            else:
                _, member, after = heapq.heappop(self.parked)
                chosen.append((member, after))
        return chosen


class RedisDueReads(RedisCore):
    """The reads of pages by next visit (see the module docstring)."""

    #: Flushes started so far (the store counts them), and the last reading
    #: of due pages: a reader paging through them goes on from there while
    #: none started.
    _flushes: int
    _due_cursor: _DueCursor | None

    # The crawl-time store's staging (:class:`~.store.RedisStateStore`): a
    # due page staged since it was stored is sent as staged, and a bucket
    # whose bound in the index is stale is set right by the next flush.

    @abstractmethod
    def _staged_page(self, key: PageKey) -> PageState | None:
        """The state staged for the page *key* and not flushed yet, if any."""

    @abstractmethod
    def _stage(self, scope: str, op: tuple[Any, ...]) -> None:
        """Stage the write *op* of *scope* for the next flush."""

    # -- due pages -------------------------------------------------------------

    async def get_due(self, scope: str, now: float, limit: int,
                      after: DueAfter | None = None) -> list[PageState]:
        # Most overdue first, ties by URL (then variant): a total order. A
        # reader paging through them (after the last page each call
        # returned) goes on from where the previous call stopped while this
        # store flushed nothing in between (the re-seeder reads so); else a
        # reading starts again from *after*'s next visit.
        after = checked_after(after)
        if limit <= 0:
            return []
        cursor = self._due_cursor
        # The reader passes the place of the last page sent as it was sent:
        # a staged one's staged next visit, not its stored place, which
        # the cursor follows (``sent``).
        if (cursor is None or after is None or (cursor.scope, cursor.now, cursor.flushes)
                != (scope, now, self._flushes) or after not in (cursor.last, cursor.sent)):
            cursor = self._new_cursor(scope, now, after)
        while True:
            for _ in range(_DUE_STARTS):
                self._due_cursor = cursor
                await self._read_due(cursor, cursor.base + limit)
                if not cursor.moved:
                    break
                # Another worker split buckets meanwhile: pages not read may
                # have moved out of the buckets still to read (or into them).
                cursor = self._new_cursor(scope, now, after)
            else:
                logger.warning("State store %s: buckets of %r kept splitting while its due "
                               "pages were read (%d times): some may be missing until the "
                               "next reading", self.location, scope, _DUE_STARTS)
            sent = cursor.ready[:limit]
            del cursor.ready[:limit]
            cursor.base += len(sent)
            due = []
            for visit, url, variant, raw in sent:
                # As its bucket was read during this paging through the due
                # pages (a staged one as staged): not read again, a page is
                # sent once. One another worker wrote meanwhile reads as it
                # was, as with any read (this store's own flushes start over).
                key = PageKey(scope, url, variant)
                state = self._staged_page(key) or self._page(key, raw)
                # A record written by another version cannot re-seed a bad page.
                if state.callback is not None and state.next_visit <= now:
                    due.append(state)
                cursor.last = (visit, url, variant)
            if due:
                cursor.sent = due_after(due[-1])
                return due
            if not sent:
                return due
            # Every page read was left out (staged since with a later next
            # visit): read on, or the reader would take the end for reached.

    def _new_cursor(self, scope: str, now: float, after: DueAfter | None) -> _DueCursor:
        """A reading of the scope's due pages from *after*: of its one
        revisit index, or (a cluster) of every scope shard's, merged."""
        parts = [_IndexPart(index, splits) for index, splits in zip(
            self._shard_keys("dueb", scope), self._shard_keys("splits", scope), strict=True)]
        return _DueCursor(scope, now, self._flushes, after, parts)

    async def _read_due(self, cursor: _DueCursor, need: int) -> None:
        """Merge the scope's buckets until *need* due pages are in place.

        Each bucket is a stream of due pages. The index gives the buckets
        not read yet in the order of their bounds; a bucket read up to a
        cap, with pages due after it, is *parked* with the earliest of
        those. Every page due before the least bound of the unread buckets
        and the parked ones is in place: it moves from ``waiting`` (a heap)
        to ``ready``. Each read asks only for the pages due up to a cap: the
        ones that can still be among the *need* first (all of them while
        fewer are waiting), so a bucket sends only what the reader keeps,
        records included (they are not read again). Each round-trip reads
        a chunk of the index or up to ``_DUE_SCRIPTS`` scripts of buckets,
        and each reply is two strings, not an element per page: a re-seed
        reads most of the scope's buckets, and per-element parsing and
        round-trips were most of its client time.
        """
        until = _FOREVER if cursor.now == math.inf else int(cursor.now)
        for _ in range(_SCAN_ROUNDS):
            if cursor.base + len(cursor.ready) >= need or cursor.moved:
                return
            await self._next_buckets(cursor, until)
            if cursor.moved or cursor.settle(need):
                return
            cap = cursor.cap_for(need, until)
            # Until a cap is known every due page of a bucket read is sent:
            # one script's worth then.
            chosen = cursor.choose(
                cap, _DUE_BUCKETS * (1 if cursor.cap is None else _DUE_SCRIPTS))
            if self.tagged:
                replies = await self._cluster_due_read(cursor.scope, until, cap, chosen)
            else:
                head = [self.prefix, _key_part(cursor.scope), until, cap]
                replies = await self._read_scripts([
                    (_DUE_READ_SHA, [*head, *(arg for pair in chosen[at:at + _DUE_BUCKETS]
                                              for arg in pair)])
                    for at in range(0, len(chosen), _DUE_BUCKETS)])
                key = cursor.parts[0].splits
                replies = [(heads, records, {key: splits})
                           for heads, records, splits in replies]
            for heads, records, splits in replies:
                for key, value in splits.items():
                    cursor.note_splits(key, value)
                at = 0
                for head in heads.split(b"\xfe") if heads else ():
                    member, above, least, *pages = head.split(b"\xff")
                    if above:
                        heapq.heappush(cursor.parked, (int(above), member, cap))
                    bound = cursor.bounds.pop(member, None)
                    if bound is not None and (not least or int(least) > bound):
                        # Its pages moved on since its bound was set: set
                        # right by the next flush (a write script).
                        bucket_host, _, bucket = member.decode().partition("|")
                        self._stage(cursor.scope, ("rebound", _key_part(cursor.scope),
                                                   bucket_host, bucket))
                    host = host_of_part(member.partition(b"|")[0].decode())
                    for n in range(0, len(pages), 3):
                        page = page_key_of(cursor.scope, host, pages[n + 1].decode())
                        end = at + int(pages[n + 2])
                        place = (int(pages[n]), page.url, page.variant)
                        if cursor.after is None or place > cursor.after:
                            heapq.heappush(cursor.waiting, (*place, records[at:end]))
                        at = end
        raise self._fail(f"reading the due pages of {cursor.scope!r} did not finish")

    async def _next_buckets(self, cursor: _DueCursor, until: int) -> None:
        """Keep a chunk of each index part's unread buckets at hand (by
        bound): the parts short of theirs read in one round trip (on a
        cluster, a script per scope shard, pipelined per node)."""
        chunk = max(_DUE_INDEX_CHUNK // len(cursor.parts), _DUE_BUCKETS)
        held = [0] * len(cursor.parts)
        for n in cursor.part_of.values():
            held[n] += 1
        wanted = [n for n, part in enumerate(cursor.parts) if not part.done and held[n] < chunk]
        if not wanted:
            return
        if self.tagged:
            replies = await self._eval_many([(CLUSTER_DUE_INDEX_LUA, [
                cursor.parts[n].index, cursor.parts[n].splits],
                [cursor.parts[n].low, until, cursor.parts[n].ties, chunk]) for n in wanted])
            for reply in replies:
                if isinstance(reply, Exception):
                    raise self._fail("read failed", reply)
        else:
            part = cursor.parts[0]
            replies = await self._read_scripts([(_DUE_INDEX_SHA, [
                part.index, part.low, until, part.ties, chunk, part.splits])])
        for n, (flat, splits) in zip(wanted, replies, strict=True):
            part = cursor.parts[n]
            cursor.note_splits(part.splits, splits)
            items = flat.split(b"\xff") if flat else []
            pairs = [(items[k], float(items[k + 1])) for k in range(0, len(items), 2)]
            for member, score in pairs:
                if member not in cursor.seen:
                    cursor.seen.add(member)
                    cursor.bounds[member] = score
                    cursor.part_of[member] = n
                    heapq.heappush(cursor.unread, (score, member))
            if pairs:
                last = pairs[-1][1]
                at_last = sum(1 for _, score in pairs if score == last)
                same = part.low != "-inf" and float(part.low) == last
                part.ties = part.ties + at_last if same else at_last
                part.low = repr(last)
            part.done = len(pairs) < chunk

    async def _cluster_due_read(self, scope: str, until: int, cap: int,
                                chosen: list[tuple[bytes, int]]) -> list[Any]:
        """The due read of *chosen* buckets on a Redis Cluster: a script per
        host and chunk of its buckets (each host's buckets are in its own
        slot), pipelined, each reply given the scope's count of splits
        (read in the scope's slot in the same round-trip)."""
        by_host: dict[str, list[tuple[bytes, int]]] = {}
        for member, after in chosen:
            by_host.setdefault(member.decode().partition("|")[0], []).append((member, after))
        calls = []
        for part, buckets in by_host.items():
            for at in range(0, len(buckets), _DUE_BUCKETS):
                keys: list[str] = []
                args: list[Any] = [until, cap]
                for member, after in buckets[at:at + _DUE_BUCKETS]:
                    bucket = member.decode().partition("|")[2]
                    keys += self._bucket_keys(scope, host_of_part(part), int(bucket))
                    args += [member, after]
                calls.append((CLUSTER_DUE_READ_LUA, keys, args))
        keys = self._shard_keys("splits", scope)
        replies = await self._eval_many(calls, [("GET", key) for key in keys])
        for reply in replies:
            if isinstance(reply, Exception):
                raise self._fail("read failed", reply)
        splits = {key: value or b"" for key, value in zip(
            keys, replies[len(calls):], strict=True)}
        return [(heads, records, splits) for heads, records in replies[:len(calls)]]

    # -- pages in aggregate ----------------------------------------------------

    async def summarize_pages(self, scope: str, *, after: float, upto: float,
                              checked_before: float,
                              exclude_callbacks: Collection[str] = ()) -> PagesSummary:
        # The scope's sums by next visit, less this crawl's checks, one by
        # one (see redis_sums_read.lua); every page read only when those
        # are not known one by one (no crawl took the scope since a page
        # was last checked at or after checked_before: cluster workers,
        # a clock that went back).
        if self.tagged:
            return await self._cluster_summary(scope, after=after, upto=upto,
                                               checked_before=checked_before,
                                               exclude_callbacks=exclude_callbacks)
        reply = await self._read_script(_SUMS_READ_SHA, [
            self.prefix, _key_part(scope), _limit(after), _limit(upto),
            _limit(checked_before, up=True), len(exclude_callbacks), *exclude_callbacks,
        ])
        pages, size, first = [*reply, None, None][:3]
        if pages != b"scan":
            return PagesSummary(int(pages), int(size),
                                None if first is None else float(first))
        return await self._summarize_scan(scope, after=after, upto=upto,
                                          checked_before=checked_before,
                                          exclude_callbacks=exclude_callbacks)

    async def _summarize_scan(self, scope: str, *, after: float, upto: float,
                              checked_before: float,
                              exclude_callbacks: Collection[str] = ()) -> PagesSummary:
        """:meth:`summarize_pages` from every page of the scope."""
        # Every bucket of the index whose bound is not after `upto`, read in
        # Redis (the scripts sum them up, and set each bucket's bound to its
        # exact minimum). ZSCAN walks the index in O(1) per bucket and may
        # return one twice while Redis resizes it, hence the set of seen.
        def limit(value: float) -> int:
            if math.isinf(value):
                return _FOREVER if value > 0 else -_FOREVER
            return math.floor(value)

        head = [self.prefix, _key_part(scope), limit(after), limit(upto),
                limit(checked_before), len(exclude_callbacks), *exclude_callbacks]
        count = size = 0
        first: float | None = None
        seen: set[bytes] = set()
        pending: list[bytes] = []
        cursor = 0

        async def run(members: list[bytes]) -> None:
            nonlocal count, size, first
            calls = [(_SUMMARY_SHA, [*head, *members[n:n + _SUMMARY_BUCKETS]])
                     for n in range(0, len(members), _SUMMARY_BUCKETS)]
            for pages, sizes, earliest in await self._read_scripts(calls):
                count += int(pages)
                size += int(sizes)
                if earliest is not None:
                    value = float(earliest)
                    first = value if first is None else min(first, value)

        for _ in range(_SCAN_ROUNDS):
            cursor, pairs = await self._call("ZSCAN", self._key("dueb", scope), cursor,
                                             "COUNT", _SCAN_COUNT)
            for member, score in pairs:
                if member not in seen and float(score) <= upto:
                    seen.add(member)
                    pending.append(member)
            while len(pending) >= _SUMMARY_BUCKETS * _SUMMARY_SCRIPTS:
                await run(pending[:_SUMMARY_BUCKETS * _SUMMARY_SCRIPTS])
                del pending[:_SUMMARY_BUCKETS * _SUMMARY_SCRIPTS]
            if int(cursor) == 0:
                if pending:
                    await run(pending)
                return PagesSummary(count, size, first)
        raise self._fail(f"scanning the due pages of {scope!r} did not finish")

    # -- pages in aggregate on a Redis Cluster ----------------------------------

    async def _cluster_summary(self, scope: str, *, after: float, upto: float,
                               checked_before: float,
                               exclude_callbacks: Collection[str] = ()) -> PagesSummary:
        """:meth:`summarize_pages` on a Redis Cluster: what sums_read.lua
        does in one script, in steps, since the sums are in the scope
        shards' slots and the pages checked since the mark in their hosts':
        every shard's mark and checks in one round-trip, then those pages
        (their hosts' slots), then every shard's coarse sums of the window
        (added up in Redis: ``cluster_sums_coarse.lua``), then the minutes'
        fine sums. Not one instant: a flush between the steps is counted in
        part (as any summary read while workers flush)."""
        low_t, high_t = _limit(after), _limit(upto)
        before = _limit(checked_before, up=True)
        excluded = set(exclude_callbacks)
        checks = await self._shard_checks(scope, before)
        if checks is None:
            return await self._cluster_summary_scan(
                scope, after=after, upto=upto, checked_before=checked_before,
                exclude_callbacks=exclude_callbacks)
        pages = size = 0
        # Per shard: a shard's checks are in its own sums (its hosts').
        less_minute: dict[int, dict[int, int]] = {}
        less_visit: dict[int, int] = {}
        if checks:
            # This crawl's checks are in the sums: taken out one by one.
            for shard, visit, page_size in await self._checked_since(
                    scope, checks, before, low_t, high_t, excluded):
                pages, size = pages - 1, size - page_size
                minute = visit // _SUM_MINUTE
                by = less_minute.setdefault(shard, {})
                by[minute] = by.get(minute, 0) + 1
                less_visit[visit] = less_visit.get(visit, 0) + 1
        low, high = (low_t + 1) // _SUM_MINUTE, high_t // _SUM_MINUTE
        # Each shard's coarse sums in the window added up in Redis, and its
        # earliest minute with pages left: the scope's is the least of them
        # (a shard's count of a minute is never below its checks there).
        shards = len(self._shard_keys("nvs", scope))
        head = [low, high, len(excluded), *sorted(excluded)]
        replies = await self._eval_many([
            (CLUSTER_SUMS_COARSE_LUA, [self._shard_key("nvs", scope, k)],
             [*head, *(x for pair in sorted(less_minute.get(k, {}).items()) for x in pair)])
            for k in range(shards)])
        least: int | None = None
        for reply in replies:
            if isinstance(reply, Exception):
                raise self._fail("read failed", reply)
            count, total, earliest = reply
            pages, size = pages + int(count), size + int(total)
            if earliest:
                least = int(earliest) if least is None else min(least, int(earliest))
        ends = [low] if high <= low else [low, high]
        fine = dict(zip(ends, await self._fine_sums(scope, ends), strict=True))
        by_minute = {}
        for end in ends:
            by, count, total = self._minute_pages(fine[end], end, low_t, high_t,
                                                  excluded, less_visit)
            by_minute[end] = by
            pages, size = pages + count, size + total
        first = _earliest(by_minute[low])
        if first is None and least is not None:
            [raw] = await self._fine_sums(scope, [least])
            first = _earliest(self._minute_pages(raw, least, low_t, high_t, excluded,
                                                 less_visit)[0])
        if first is None and high > low:
            first = _earliest(by_minute[high])
        return PagesSummary(pages, size, None if first is None else float(first))

    async def _shard_checks(self, scope: str, before: int
                            ) -> list[tuple[int, bytes]] | None:
        """Every scope shard's mark and checks since *before*, in one round
        trip: the checks to take out of the sums (shard, member); None when
        a shard cannot tell (a page checked since *before* and no mark
        before it; or its sums marked lost: a stored sum found damaged, see
        cluster_host.lua): every page is read then."""
        shards = len(self._shard_keys("nvm", scope))
        read = await self._commands([
            command for k in range(shards) for command in (
                ("HMGET", self._shard_key("nvm", scope, k), "mark", "latest", "lost"),
                ("ZRANGEBYSCORE", self._shard_key("ck", scope, k), before, "+inf"))])
        checks: list[tuple[int, bytes]] = []
        for k in range(shards):
            meta, shard_checks = read[2 * k:2 * k + 2]
            if meta[2] is not None:
                return None
            mark, latest = (None if v is None else int(v) for v in meta[:2])
            if latest is not None and before <= latest:
                if mark is None or before < mark:
                    return None
                checks += [(k, member) for member in shard_checks]
        return checks

    async def _fine_sums(self, scope: str, minutes: list[int]) -> list[dict[bytes, bytes]]:
        """The fine sums of each of *minutes* ("<second>|<callback>"), every
        scope shard's added up (one round trip). A shard (host group) keeps
        them in ``FINE_KEYS`` hashes, a visit's in its hour's modulo that
        (each field the visit and callback): the minute's fields are picked
        out of its hash's."""
        keys = self._shard_keys("nvf", scope)
        parts = sorted({fine_part(m * _SUM_MINUTE) for m in minutes})
        flat = await self._commands([("HGETALL", f"{key}:{part}")
                                     for part in parts for key in keys])
        by_part = {part: flat[n * len(keys):(n + 1) * len(keys)]
                   for n, part in enumerate(parts)}
        out = []
        for minute in minutes:
            first = minute * _SUM_MINUTE
            total: dict[bytes, bytes] = {}
            for raw in by_part[fine_part(first)]:
                mine = {}
                for field, value in raw.items():
                    visit, _, callback = field.partition(b"|")
                    at = int(visit) - first
                    if 0 <= at < _SUM_MINUTE:
                        mine[b"%d|%s" % (at, callback)] = value
                _add_sums(total, mine)
            out.append(total)
        return out

    async def _checked_since(self, scope: str, members: list[tuple[int, bytes]],
                             before: int, after: int, upto: int,
                             excluded: set[str]) -> list[tuple[int, int, int]]:
        """(shard, next visit, size) of the pages of *members* (each
        shard's checks since its mark) last checked at or after *before*
        with a callback not *excluded* and a next visit in (after, upto]:
        read in their hosts' slots."""
        keys = []
        for _, member in members:
            part, _, name = member.decode().partition("|")
            keys.append(page_key_of(scope, host_of_part(part), name))
        found = []
        for (shard, _), key, raw in zip(members, keys, await self._cluster_read_pages(keys),
                                        strict=True):
            if raw is None:
                continue
            state = self._page(key, raw)
            visit = int(state.next_visit)
            if (state.callback is not None and state.callback not in excluded
                    and int(state.last_checked) >= before and after < visit <= upto):
                found.append((shard, visit, int(state.size or 0)))
        return found

    @staticmethod
    def _minute_pages(flat: dict[bytes, bytes], minute: int, after: int, upto: int,
                      excluded: set[str], less_visit: dict[int, int],
                      ) -> tuple[dict[int, int], int, int]:
        """The pages of one minute in range by next visit (this crawl's
        checks left out), and their sums (``minute_pages`` of sums_read.lua)."""
        by: dict[int, int] = {}
        count = total = 0
        for field, value in flat.items():
            second, _, callback = field.decode().partition("|")
            if callback in excluded:
                continue
            visit = minute * _SUM_MINUTE + int(second)
            if after < visit <= upto:
                c, t = (int(v) for v in value.split())
                by[visit] = by.get(visit, 0) + c
                count, total = count + c, total + t
        for visit, less in less_visit.items():
            if visit in by:
                by[visit] -= less
        return by, count, total

    async def _cluster_summary_scan(self, scope: str, *, after: float, upto: float,
                                    checked_before: float,
                                    exclude_callbacks: Collection[str] = ()) -> PagesSummary:
        """:meth:`_summarize_scan` on a Redis Cluster: every bucket of the
        index whose bound is not after *upto*, read by a script per host
        (its slot), then each bucket's bound set to the least next visit
        read (``cluster_raise.lua``) if the mark set on it before the read
        (``P:duer:{<s>}``) is still there: a flush that lowered the bound
        meanwhile dropped it (a page it wrote may be due earlier)."""
        head = [_limit(after), _limit(upto), _limit(checked_before), len(exclude_callbacks),
                *exclude_callbacks]
        members = await self._index_members(scope, upto)
        by_host: dict[str, list[bytes]] = {}
        for member in sorted(members):
            by_host.setdefault(member.decode().partition("|")[0], []).append(member)
        calls, read = [], []
        for part, chunk_members in by_host.items():
            for at in range(0, len(chunk_members), _SUMMARY_BUCKETS):
                chunk = chunk_members[at:at + _SUMMARY_BUCKETS]
                keys: list[str] = []
                for member in chunk:
                    bucket = member.decode().partition("|")[2]
                    keys += self._bucket_keys(scope, host_of_part(part), int(bucket))
                calls.append((CLUSTER_SUMMARY_LUA, keys, head))
                read.append(chunk)
        await self._mark_buckets(scope, members)
        count = size = 0
        first: float | None = None
        bounds: list[Any] = []
        step = _SUMMARY_SCRIPTS * 8
        for start in range(0, len(calls), step):
            replies = await self._eval_many(calls[start:start + step])
            for chunk, reply in zip(read[start:start + step], replies, strict=True):
                if isinstance(reply, Exception):
                    raise self._fail("read failed", reply)
                pages, sizes, earliest, least = reply
                count += int(pages)
                size += int(sizes)
                if earliest:
                    value = float(earliest)
                    first = value if first is None else min(first, value)
                for member, low in zip(chunk, least.split(b" "), strict=True):
                    bounds += [member, low]
        await self._raise_bounds(scope, bounds)
        return PagesSummary(count, size, first)

    async def _mark_buckets(self, scope: str, members: set[bytes]) -> None:
        """Mark each bucket a summary is about to read, in its host's
        shard (``P:duer``, beside its bound): see :meth:`_raise_bounds`."""
        by_shard: dict[int, list[bytes]] = {}
        for member in sorted(members):
            by_shard.setdefault(self._member_shard(member), []).append(member)
        for k, shard_members in sorted(by_shard.items()):
            marks = self._shard_key("duer", scope, k)
            for start in range(0, len(shard_members), _SCAN_COUNT):
                await self._commands([("HSET", marks, *(arg for member in shard_members[
                    start:start + _SCAN_COUNT] for arg in (member, 1)))])

    async def _raise_bounds(self, scope: str, bounds: list[Any]) -> None:
        """Set each bucket's bound (*bounds*: member, least next visit read,
        ...) where its mark is still there (``cluster_raise.lua``), each
        shard's in its slot, pipelined."""
        bounds_by: dict[int, list[Any]] = {}
        for n in range(0, len(bounds), 2):
            bounds_by.setdefault(self._member_shard(bounds[n]), []).extend(bounds[n:n + 2])
        calls = [(CLUSTER_RAISE_LUA, [self._shard_key("dueb", scope, k),
                                      self._shard_key("duer", scope, k)],
                  shard_bounds[start:start + 2 * _SCAN_COUNT])
                 for k, shard_bounds in sorted(bounds_by.items())
                 for start in range(0, len(shard_bounds), 2 * _SCAN_COUNT)]
        for reply in await self._eval_many(calls) if calls else []:
            if isinstance(reply, Exception):
                raise self._fail("Redis command failed", reply)

    def _member_shard(self, member: bytes) -> int:
        """The scope shard of a bucket of the revisit index (its host's)."""
        return scope_shard(member.partition(b"|")[0].decode()) if self.tagged else 0

    async def _index_members(self, scope: str, upto: float) -> set[bytes]:
        """The buckets of the scope's revisit index whose bound is not
        after *upto* (ZSCAN: O(1) a bucket, one seen twice counted once)."""
        members: set[bytes] = set()
        for index in self._shard_keys("dueb", scope):
            cursor = 0
            for _ in range(_SCAN_ROUNDS):
                cursor, pairs = await self._call("ZSCAN", index, cursor, "COUNT", _SCAN_COUNT)
                members.update(member for member, score in pairs if float(score) <= upto)
                if int(cursor) == 0:
                    break
            else:
                raise self._fail(f"scanning the due pages of {scope!r} did not finish")
        return members


#: Seconds of a minute of the sums (SUM_MINUTE in sums.lua).
_SUM_MINUTE = 60


def _add_sums(total: dict[bytes, bytes], more: dict[bytes, bytes]) -> None:
    """Add the sums *more* (field -> "pages bytes") into *total*."""
    for field, value in more.items():
        was = total.get(field)
        if was is None:
            total[field] = value
        else:
            a, b = (int(v) for v in was.split())
            c, d = (int(v) for v in value.split())
            total[field] = b"%d %d" % (a + c, b + d)


def _earliest(by: dict[int, int]) -> int | None:
    """The least key with a positive count (``earliest`` of sums_read.lua)."""
    found = [key for key, count in by.items() if count > 0]
    return min(found) if found else None
