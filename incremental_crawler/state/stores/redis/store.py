"""The Redis state store itself, the class a crawl opens: the crawl-time reads
(pages, links, items, hosts), the staged writes and the flushes that send
them as one run of a script, delivery marks, crawl records, remembered
rates and a crawl's hold on its scope; and the class that puts the store's
parts together over their shared core (:mod:`.core`): the layout checked
and migrated when it opens (:mod:`.layout`), the reads of pages by next
visit (:mod:`.due`) and the administration (:mod:`.admin`). The key layout
is in the package's docstring (:mod:`incremental_crawler.state.stores.redis`);
its URIs in :mod:`.uri`, where it keeps pages in :mod:`.pages`, its Lua
scripts in :mod:`.scripts` and the ``.lua`` files of the package."""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import redis
import redis.asyncio

from incremental_crawler import clock
from incremental_crawler.config import DEFAULT_SETTINGS
from incremental_crawler.redis_cluster import connect, is_cluster_url, names_cluster
from incremental_crawler.state.records import (
    CrawlRecord,
    HostTrust,
    ItemRecord,
    PageFlags,
    PageKey,
    PageState,
    SlotRate,
    Undelivered,
)
from incremental_crawler.state.stores.base import (
    REPAIR_HOLD,
    SHARED_HOLD,
    HoldLapsed,
    ScopeHeld,
    SlotRates,
    StateStoreError,
    crawl_history_setting,
    describe_holder,
    is_crawl_hold,
    item_history_setting,
    redis_retry_setting,
    takes_over,
)
from incremental_crawler.state.stores.redis.admin import RedisAdmin
from incremental_crawler.state.stores.redis.cluster import RedisClusterPath
from incremental_crawler.state.stores.redis.core import (
    OUT_OF_MEMORY,
    _key_part,
    _page_range,
    _slot_rates,
    _stored_version,
    logger,
)
from incremental_crawler.state.stores.redis.due import RedisDueReads
from incremental_crawler.state.stores.redis.layout import RedisLayout
from incremental_crawler.state.stores.redis.memo import RedisWalkMemo
from incremental_crawler.state.stores.redis.pages import page_field, page_key_of
from incremental_crawler.state.stores.redis.scripts import (
    _FLUSH_LUA,
    _READ_PAGES_SHA,
    _SUMS_MARK_LUA,
    CLUSTER_SUMS_MARK_LUA,
    HOLD_LUA,
)
from incremental_crawler.state.stores.redis.uri import DEFAULT_PREFIX, parse_redis_uri
from incremental_crawler.uris import redacted

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = ["RedisStateStore"]

#: Keys per pipelined round-trip of a batched read (get_pages, get_links_many).
_READ_BATCH = 10_000
#: Pages per read script (each is a hash and a lookup in Redis: a bound on
#: how long one blocks the server), and read scripts per round-trip.
_READ_SCRIPT_PAGES = 2_000
#: Fields per HMGET of links records (a bound on one reply's size).
_HMGET_FIELDS = 500


#: Why a Redis Cluster is refused when INCREMENTAL_STATE_ON_REDIS_CLUSTER is
#: False (said before anything is written there).
NOT_ON_A_CLUSTER = (
    "is a Redis Cluster, and INCREMENTAL_STATE_ON_REDIS_CLUSTER is False: the "
    "state store keeps nothing on a cluster; remove that setting to keep it "
    "there (in the cluster layout), or set INCREMENTAL_STATE_URI to a Redis "
    "server (redis://host:port/db?prefix=name) or a SQLite file (sqlite:///path)")


def _refuse_cluster(uri: str, clean: str) -> None:
    """Refuse a Redis Cluster before anything is written to it (one ``INFO``
    for a ``redis://`` URL; one that cannot be reached is left to the store,
    which says so)."""
    try:
        cluster = is_cluster_url(clean) or names_cluster(
            clean, socket_timeout=10, socket_connect_timeout=10)
    except ValueError as exc:
        raise StateStoreError(f"State store {redacted(uri)}: {exc}") from exc
    except redis.RedisError:
        return
    if cluster:
        raise StateStoreError(f"State store {redacted(uri)}: {NOT_ON_A_CLUSTER}")


class RedisStateStore(RedisLayout, RedisDueReads, RedisAdmin, RedisClusterPath,
                      RedisWalkMemo):
    """State in Redis; see the module docstring."""

    def __init__(self, uri: str, *, prefix: str = DEFAULT_PREFIX,
                 history_limit: int = DEFAULT_SETTINGS["INCREMENTAL_ITEM_HISTORY"]) -> None:
        super().__init__(uri, prefix)
        self._init_cluster()
        self.history_limit = history_limit
        # Staged writes (one per stage_* call: a name and its arguments for
        # _FLUSH_LUA), in staging order, and the scopes they touch
        # (registered in P:scopes by the same flush).
        self._ops: list[tuple[Any, ...]] = []
        self._scopes: set[str] = set()
        # (token, number of writes) of the batch at the front of _ops whose
        # outcome is unknown (its reply was lost): Redis knows how much of it
        # was applied. Tokens whose outcome is known are forgotten next time.
        self._unsure: tuple[str, int] | None = None
        # When that batch's reply was lost (its token lives _TOKEN_TTL).
        self._unsure_since = 0.0
        self._spent_tokens: list[str] = []
        #: The epoch and ttl of each hold this store took (hold.lua).
        self._hold_takes: dict[tuple[str, str], tuple[int, float]] = {}
        # Latest staged page states, links records (None: a staged
        # deletion) and item fingerprints, for reads; the `_flushing_*` ones
        # belong to a flush in flight, still readable.
        self._pages: dict[PageKey, PageState] = {}
        self._links: dict[PageKey, str | None] = {}
        self._item_fps: dict[tuple[str, str], str] = {}
        self._flushing_pages: dict[PageKey, PageState] = {}
        self._flushing_links: dict[PageKey, str | None] = {}
        self._flushing_fps: dict[tuple[str, str], str] = {}
        self._flushing_count = 0
        self._flush_lock: asyncio.Lock | None = None
        # Flushes started so far, and the last reading of due pages (a
        # reader paging through them goes on from there while none started).
        self._flushes = 0
        self._due_cursor = None
        self._closed = False
        try:
            # A Redis Cluster: the cluster layout (one server keeps layout 4).
            if self.cluster:
                self._check_cluster_layout()
            else:
                self._check_layout()
        except BaseException:
            self._sync.close()
            raise

    @classmethod
    def from_uri(cls, uri: str, *, settings: BaseSettings | None = None) -> Self:
        clean, prefix = parse_redis_uri(uri)
        refused = settings is not None and not settings.getbool(
            "INCREMENTAL_STATE_ON_REDIS_CLUSTER", True)
        if refused:
            _refuse_cluster(uri, clean)
        store = cls(clean, prefix=prefix, history_limit=item_history_setting(settings))
        store.crawl_history = crawl_history_setting(settings)
        store.retry_time = redis_retry_setting(settings)
        return store

    @classmethod
    def exists(cls, uri: str, *, settings: BaseSettings | None = None) -> bool:
        """Whether the prefix *uri* names holds a store (its layout record):
        opening one writes it."""
        clean, prefix = parse_redis_uri(uri)
        try:
            # A cluster's client asks the node of the key's slot (one
            # server's would be answered MOVED by a node that is not it).
            client = connect(clean, socket_connect_timeout=5, socket_timeout=30)
        except ValueError as exc:
            raise StateStoreError(f"State store {redacted(uri)}: {exc}") from exc
        except redis.RedisError as exc:
            raise StateStoreError(
                f"State store {redacted(uri)}: cannot be reached ({exc})") from exc
        try:
            return bool(client.exists(f"{prefix}:meta"))
        except redis.RedisError as exc:
            raise StateStoreError(
                f"State store {redacted(uri)}: cannot be reached ({exc})") from exc
        finally:
            client.close()

    @classmethod
    def where(cls, uri: str) -> str:
        clean, prefix = parse_redis_uri(uri)
        return f"under prefix {prefix!r} of {redacted(clean)}"

    # -- reads ---------------------------------------------------------------

    def _staged_page(self, key: PageKey) -> PageState | None:
        staged = self._pages.get(key)
        return staged if staged is not None else self._flushing_pages.get(key)

    async def get_page(self, key: PageKey) -> PageState | None:
        # Staged page states are visible at once; staged checks (counters
        # only) become visible when flushed, as in the SQLite store.
        staged = self._staged_page(key)
        if staged is not None:
            return staged
        if self.tagged:
            [raw] = await self._cluster_read_pages([key])
            return None if raw is None else self._page(key, raw)
        [raw] = await self._read_script(_READ_PAGES_SHA, [self.prefix, *self._page_args(key)])
        return None if raw is None else self._page(key, raw)

    async def get_pages(self, keys: Iterable[PageKey]) -> dict[PageKey, PageState]:
        found: dict[PageKey, PageState] = {}
        wanted: list[PageKey] = []
        for key in keys:
            staged = self._staged_page(key)
            if staged is not None:
                found[key] = staged
            else:
                wanted.append(key)
        for start in range(0, len(wanted), _READ_BATCH):
            batch = wanted[start:start + _READ_BATCH]
            if self.tagged:
                for key, raw in zip(batch, await self._cluster_read_pages(batch), strict=True):
                    if raw is not None:
                        found[key] = self._page(key, raw)
                continue
            calls: list[tuple[str, list[Any]]] = []
            for at in range(0, len(batch), _READ_SCRIPT_PAGES):
                args: list[Any] = [self.prefix]
                for key in batch[at:at + _READ_SCRIPT_PAGES]:
                    args.extend(self._page_args(key))
                calls.append((_READ_PAGES_SHA, args))
            replies = [raw for reply in await self._read_scripts(calls) for raw in reply]
            for key, raw in zip(batch, replies, strict=True):
                if raw is not None:
                    found[key] = self._page(key, raw)
        return found

    async def get_links(self, key: PageKey) -> str | None:
        for staged in (self._links, self._flushing_links):
            if key in staged:
                return staged[key]
        host, field = page_field(key)
        raw = await self._call("HGET", self._host_key("ln", key.scope, host), field)
        return None if raw is None else raw.decode()

    async def get_links_many(self, keys: Iterable[PageKey]) -> dict[PageKey, str | None]:
        found: dict[PageKey, str | None] = {}
        wanted: list[PageKey] = []
        for key in keys:
            for staged in (self._links, self._flushing_links):
                if key in staged:
                    found[key] = staged[key]
                    break
            else:
                wanted.append(key)
        for start in range(0, len(wanted), _READ_BATCH):
            batch = wanted[start:start + _READ_BATCH]
            # One HMGET per host's links hash (a host's pages are fields of
            # one key, in one slot on a cluster), not an HGET per page: a
            # walk reads every record of a site at once.
            by_host: dict[str, list[tuple[PageKey, str]]] = {}
            for key in batch:
                host, field = page_field(key)
                by_host.setdefault(self._host_key("ln", key.scope, host), []).append((key, field))
            commands = []
            asked: list[list[PageKey]] = []
            for hash_key, fields in by_host.items():
                for at in range(0, len(fields), _HMGET_FIELDS):
                    chunk = fields[at:at + _HMGET_FIELDS]
                    commands.append(("HMGET", hash_key, *(field for _, field in chunk)))
                    asked.append([key for key, _ in chunk])
            for keys_asked, reply in zip(asked, await self._commands(commands), strict=True):
                for key, raw in zip(keys_asked, reply, strict=True):
                    found[key] = None if raw is None else raw.decode()
        return found

    async def _item(self, scope: str, item_key: str) -> dict[str, Any] | None:
        raw = await self._call("HGET", self._item_key("items", scope, item_key), item_key)
        return None if raw is None else json.loads(raw)

    async def get_item_simhash(self, scope: str, item_key: str) -> int | None:
        record = await self._item(scope, item_key)
        return None if record is None else record.get("simhash")

    async def get_item_fingerprint(self, scope: str, item_key: str) -> str | None:
        for staged in (self._item_fps, self._flushing_fps):
            if (scope, item_key) in staged:
                return staged[scope, item_key] or None  # "": a tombstone
        record = await self._item(scope, item_key)
        return None if record is None else record["fingerprint"] or None

    async def get_page_items(self, scope: str, page_url: str) -> list[str]:
        # Items from another page are listed under it (one range of the
        # index); the item keyed by the page's URL belongs to it unless it
        # names another page.
        listed, own = await self._commands([
            ("ZRANGEBYLEX", self._item_key("bypage", scope, page_url), *_page_range(page_url)),
            ("HGET", self._item_key("items", scope, page_url), page_url)],
            "Redis command failed")
        keys = [member.partition(b"\0")[2].decode() for member in listed]
        if self.tagged and keys:
            # On a cluster a moved item's old member is removed in phase 3,
            # after its record names the new page (phase 1): a worker gone
            # between them leaves it. Listed only while its record still
            # names this page (else a tombstone would go out for an item
            # alive on another page).
            records = await self._commands([
                ("HGET", self._item_key("items", scope, key), key) for key in keys],
                "Redis command failed")
            keys = [key for key, raw in zip(keys, records, strict=True)
                    if raw is not None and _names_page(json.loads(raw), page_url)]
        if own is not None:
            record = json.loads(own)
            if record["fingerprint"] and record.get("page", page_url) == page_url:
                keys.append(page_url)
        return sorted(keys)

    async def get_item_data(self, scope: str, item_key: str) -> str | None:
        # The latest version's number, then that entry of the item's history.
        version = await self._call("HGET", self._item_key("itemver", scope, item_key), item_key)
        if version is None:
            return None
        raw = await self._call("HGET", self._hist_key(scope, item_key), version)
        if raw is None:
            return None
        entry = json.loads(raw)
        if not entry.get("fingerprint") or "data" not in entry:
            return None  # a tombstone
        return json.dumps(entry["data"])

    async def get_host(self, scope: str, host: str) -> HostTrust | None:
        raw = await self._call("HGET", self._key("hosts", scope), host)
        return None if raw is None else self._decode(HostTrust, raw, scope=scope, host=host)

    # -- staged writes -------------------------------------------------------

    def _stage(self, scope: str, op: tuple[Any, ...]) -> None:
        self._scopes.add(scope)
        self._ops.append(op)

    def stage_host(self, trust: HostTrust) -> None:
        value = self._encode(trust, ("scope", "host"))
        self._stage(trust.scope, ("host", self._key("hosts", trust.scope), trust.host, value))

    def stage_page(self, state: PageState) -> None:
        self._stage(state.key.scope, self._page_op(state))
        self._pages[state.key] = state

    def stage_check(
        self, key: PageKey, status: int, when: float, *, lastmod: float | None = None,
        schedule: tuple[float, float] | None = None,
        validators: tuple[str | None, str | None] | None = None,
    ) -> None:
        interval, next_visit = (
            ("", "") if schedule is None else (int(schedule[0]), int(schedule[1])))
        # ('' keeps the stored value: no validator is empty.)
        etag, last_modified = validators or (None, None)
        self._stage(key.scope, (
            "check", *self._page_args(key), status, int(when),
            "" if lastmod is None else int(lastmod), interval, next_visit,
            etag or "", last_modified or "",
        ))

    def stage_failure(
        self, key: PageKey, status: int, when: float, *, failures: int, next_visit: float,
        callback: str | None = None, recipe: str | None = None,
    ) -> None:
        self._stage(key.scope, (
            "failure", *self._page_args(key), status, int(when), failures, int(next_visit),
            callback or "", recipe or "",
        ))

    def stage_redirect(self, key: PageKey, target: str, status: int, when: float) -> None:
        self._stage(key.scope, (
            "redirect", *self._page_args(key), status, int(when), target,
            int(PageFlags.REDIRECTED),
        ))

    def stage_links(self, key: PageKey, data: str | None) -> None:
        if data is None:
            self._stage(key.scope, ("unlink", *self._page_args(key)))
        else:
            self._stage(key.scope, ("links", *self._page_args(key), data))
        self._links[key] = data

    def stage_flags(self, key: PageKey, add: int) -> None:
        self._stage(key.scope, ("flags", *self._page_args(key), int(add)))
        staged = self._staged_page(key)
        if staged is not None:
            # What the flush will leave: the staged state, then the flags.
            self._pages[key] = staged.copy(flags=int(staged.flags) | int(add))

    def stage_postpone(self, key: PageKey, was: float, next_visit: float) -> None:
        self._stage(key.scope, ("postpone", *self._page_args(key), int(was), int(next_visit)))
        staged = self._staged_page(key)
        if staged is not None and staged.next_visit == int(was):
            self._pages[key] = staged.copy(next_visit=int(next_visit))

    def stage_listing(self, key: PageKey, listing: str) -> None:
        self._stage(key.scope, ("listing", *self._page_args(key), listing))
        staged = self._staged_page(key)
        if staged is not None:
            self._pages[key] = staged.copy(listing=listing)

    def stage_item(self, record: ItemRecord) -> None:
        scope, key = record.scope, record.key
        # The URL and the page usually are the key: not stored twice (they
        # read back as the key). The change is the version's: in its entry.
        skip = ["scope", "key", "data", "change", "delivery"]
        if record.url == key:
            skip.append("url")
        page = "" if record.page in (None, key) else record.page
        if not page:
            skip.append("page")
        entry = ""
        if record.data is not None:
            # The item's JSON is embedded as it is, not escaped into a string.
            head = json.dumps(
                {"fingerprint": record.fingerprint, "stored_at": int(record.stored_at)},
                separators=(",", ":"))
            entry = f'{head[:-1]},"data":{record.data}}}'
        # (On a cluster the page index's key is that of the page's group:
        # where the item's member goes.)
        self._stage(scope, (
            "item", self._item_key("items", scope, key), self._item_key("itemver", scope, key),
            self._item_key("order", scope, key), self._hist_key(scope, key),
            self._item_key("bypage", scope, page or key),
            key, self._encode(record, skip), int(record.stored_at), entry, str(record.change),
            page, "1" if record.fingerprint else "0", self.history_limit,
        ))
        if record.data is not None and record.delivery:
            # On a cluster the mark is in the item's group, written by the
            # same script as the version (cluster_items.lua).
            self._stage(scope, (
                "undeliv", self._undelivered_key(scope, record.delivery, key),
                self._item_key("undelc", scope, key), record.delivery,
                self._item_key("itemver", scope, key), key,
                int(record.stored_at)))
        self._item_fps[scope, key] = record.fingerprint

    # -- delivery of item versions ---------------------------------------------

    def _undelivered_key(self, scope: str, crawl: str, item_key: str = "") -> str:
        """A crawl's marks (``P:undel``): the scope's in layout 4; on a
        cluster, those of *item_key*'s group."""
        return f"{self._item_key('undel', scope, item_key)}:{quote(crawl, safe='')}"

    def stage_delivered(self, scope: str, crawl: str) -> None:
        if self.tagged:
            # Every group's marks of the crawl, after the flush's phases.
            self._stage(scope, ("settle", scope, crawl, "1"))
            return
        self._stage(scope, ("delivered", self._undelivered_key(scope, crawl),
                            self._key("undelc", scope), crawl, "1"))

    def stage_settled(self, scope: str, crawl: str) -> None:
        """Stage forgetting *crawl* among those with waiting versions, if none is left."""
        if self.tagged:
            self._stage(scope, ("settle", scope, crawl, "0"))
            return
        self._stage(scope, ("delivered", self._undelivered_key(scope, crawl),
                            self._key("undelc", scope), crawl, "0"))

    def stage_redelivered(self, pending: Undelivered, crawl: str) -> None:
        version = pending.version
        scope, key = version.scope, version.key
        self._stage(scope, (
            "redeliv", self._undelivered_key(scope, pending.crawl, key),
            self._undelivered_key(scope, crawl, key), self._item_key("undelc", scope, key),
            crawl, _undelivered_member(version.stored_at, key, version.version)))

    async def undelivered_crawls(self, scope: str) -> list[str]:
        if self.tagged:
            return await self._cluster_undelivered_crawls(scope)
        members = await self._call("SMEMBERS", self._key("undelc", scope))
        return sorted(m.decode() for m in members)

    async def undelivered(self, scope: str, crawl: str, *, after: Undelivered | None = None,
                          limit: int = 500) -> list[Undelivered]:
        start = "-" if after is None else "(" + _undelivered_member(
            after.version.stored_at, after.version.key, after.version.version)
        if self.tagged:
            # Every item group's marks, merged in their order.
            marks = await self._merged_marks(scope, crawl, start, limit)
        else:
            zset = self._undelivered_key(scope, crawl)
            members = await self._call("ZRANGE", zset, start, "+", "BYLEX", "LIMIT", 0, limit)
            marks = [(member, zset) for member in members]
        if not marks:
            return []
        wanted = []
        for member, zset in marks:
            key, _, digits = member.decode().partition("\0")[2].rpartition("\0")
            wanted.append((key, int(digits), member, zset))
        pipe = self._async.pipeline(transaction=False)
        for key, number, _, _ in wanted:
            pipe.hget(self._hist_key(scope, key), number)
        self.roundtrips += 1
        try:
            entries = await pipe.execute()
        except redis.RedisError as exc:
            raise self._fail("read failed", exc) from exc
        found: list[Undelivered] = []
        pruned: dict[str, list[bytes]] = {}
        for (key, number, member, zset), entry in zip(wanted, entries, strict=True):
            if entry is None:
                pruned.setdefault(zset, []).append(member)
            else:
                found.append(Undelivered(crawl, _stored_version(scope, key, number,
                                                                json.loads(entry))))
        for zset, members in pruned.items():
            # The version is gone (pruned, forgotten): its mark means
            # nothing any more, and goes at once (bookkeeping, like a hold).
            await self._call("ZREM", zset, *members)
        return found

    # -- flushes ---------------------------------------------------------------

    @property
    def pending(self) -> int:
        return len(self._ops) + self._flushing_count

    async def flush(self) -> int:
        if self._flush_lock is None:
            self._flush_lock = asyncio.Lock()
        # One flush at a time (a timed flush may still be in flight at close).
        async with self._flush_lock:
            if self._ops or (self.tagged and not self._carried.empty()):
                await self._recheck_eviction()
            return await self._flush()

    async def _flush(self) -> int:
        if self.tagged:
            return await self._flush_phased()
        if not self._ops:
            return 0
        if self._unsure is not None:
            self._refuse_forgotten_token(self._unsure_since)
        self._flushes += 1
        ops, scopes, unsure = self._ops, self._scopes, self._unsure
        self._flushing_pages, self._flushing_fps = self._pages, self._item_fps
        self._flushing_links = self._links
        self._flushing_count = len(ops)
        self._ops, self._scopes, self._unsure = [], set(), None
        self._pages, self._links, self._item_fps = {}, {}, {}
        done = 0  # writes of `ops` applied so far, from the front
        sending: tuple[str, int] | None = None
        try:
            if unsure is not None:
                # Sent before, outcome unknown: Redis says how much of it
                # it applied (all of it, if only the reply was lost).
                sending = unsure
                applied, error = await self._apply(unsure[0], ops[:unsure[1]], scopes)
                done += applied
                if error is not None:
                    raise self._fail(f"a write failed in Redis ({error}); "
                                     "nothing staged after it was sent")
            if done < len(ops):
                sending = (uuid.uuid4().hex, len(ops) - done)
                applied, error = await self._apply(sending[0], ops[done:], scopes)
                done += applied
                if error is not None:
                    raise self._fail(f"a write failed in Redis ({error}); "
                                     "nothing staged after it was sent")
        except BaseException as exc:
            # Nothing is recorded as stored that was not: what was not
            # applied goes back in front of whatever was staged meanwhile,
            # for a later flush.
            self._ops = ops[done:] + self._ops
            self._scopes |= scopes
            if (
                not isinstance(exc, StateStoreError) or exc.__cause__ is not None
            ) and sending is not None:
                # No reply (or not one we understood): the batch may or may
                # not have run; its token will tell.
                if unsure is None or sending[0] != unsure[0]:
                    self._unsure_since = clock.now()
                self._unsure = (sending[0], sending[1])
            self._pages = {**self._flushing_pages, **self._pages}
            self._links = {**self._flushing_links, **self._links}
            self._item_fps = {**self._flushing_fps, **self._item_fps}
            raise
        finally:
            self._flushing_pages, self._flushing_fps, self._flushing_count = {}, {}, 0
            self._flushing_links = {}
        return done

    async def _flush_phased(self) -> int:
        """:meth:`_flush` in the cluster layout: the phases of
        :meth:`_cluster_apply`. The writes it did not apply stay staged, in
        order, in front of whatever was staged meanwhile; the page index's
        members phases 1 and 2 made and phase 3 did not write are kept for
        the next flush."""
        if not self._ops and self._carried.empty():
            return 0
        live = {token for token, _ in self._unsure_slots.values()}
        for token in set(self._unsure_slot_since) - live:
            del self._unsure_slot_since[token]
        for token in live:
            self._refuse_forgotten_token(self._unsure_slot_since.get(token, clock.now()))
        self._flushes += 1
        ops, scopes = self._ops, self._scopes
        self._flushing_pages, self._flushing_fps = self._pages, self._item_fps
        self._flushing_links = self._links
        self._flushing_count = len(ops)
        self._ops, self._scopes = [], set()
        self._pages, self._links, self._item_fps = {}, {}, {}
        applied: set[int] = set()
        try:
            try:
                error = await self._cluster_apply(ops, scopes, applied)
            except redis.exceptions.OutOfMemoryError as exc:
                raise self._fail("", exc) from None
            except redis.RedisError as exc:
                raise self._fail("Redis command failed", exc) from exc
            if error is not None and _refused_for_memory(error):
                # A script refused above maxmemory (before it wrote: Redis
                # refuses a script that may write when full): said as what
                # it is, with what to do, not as a failed write.
                raise StateStoreError(
                    f"State store {self.location}: {OUT_OF_MEMORY} (a script of the flush "
                    "refused; the writes after it in its slot, and the phases after it, "
                    "were not sent: kept, the next flush sends them)")
            if error is not None:
                raise self._fail(f"a write failed in Redis ({error}); the writes after "
                                 "it in its slot (of a host group: of its host), and the "
                                 "phases after it, were not sent")
        except BaseException:
            # Nothing is recorded as stored that was not.
            self._ops = [op for n, op in enumerate(ops) if n not in applied] + self._ops
            self._scopes |= scopes
            self._pages = {**self._flushing_pages, **self._pages}
            self._links = {**self._flushing_links, **self._links}
            self._item_fps = {**self._flushing_fps, **self._item_fps}
            raise
        finally:
            self._flushing_pages, self._flushing_fps, self._flushing_count = {}, {}, 0
            self._flushing_links = {}
        return len(applied)

    async def _apply(self, token: str, ops: list[tuple[Any, ...]],
                     scopes: set[str]) -> tuple[int, str | None]:
        """Run one batch; ``(writes applied, error of the one that failed)``.

        Raises (chained to the Redis error) when the outcome is unknown.
        """
        hold = self.flush_hold
        keys = [self._token_key(token), f"{self.prefix}:scopes",
                self._key("holds", hold[0] if hold is not None else ""),
                *(self._token_key(t) for t in self._spent_tokens)]
        args: list[Any] = [self.prefix, self._listpack_value, hold[1] if hold is not None else "",
                           len(scopes), *sorted(scopes)]
        for op in ops:
            args.extend(op)

        async def attempt() -> Any:
            # Sent again with the same token when Redis did not answer.
            self.roundtrips += 1
            try:
                return await self._async.evalsha(self._script_sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                # Not run (a restarted Redis forgot it): sent in full once.
                self.roundtrips += 1
                return await self._async.eval(_FLUSH_LUA, len(keys), *keys, *args)

        reply = await self._send_batch(attempt)
        if int(reply[1]) == 2:
            # Its hold lapsed (nothing written: not unsure): taken again
            # when nobody took the scope since (hold.lua's epoch; raises
            # HoldLapsed otherwise), and the batch sent once more.
            assert hold is not None
            await self._check_flush_hold()
            reply = await self._send_batch(attempt)
            if int(reply[1]) == 2:
                raise HoldLapsed.of(self.location, *hold)
        self._spent_tokens = [token]
        applied = int(reply[0])
        error = reply[2].decode(errors="replace") if len(reply) > 2 else None
        if int(reply[1]) and applied < len(ops):
            # A replay of a batch that stopped at a failed write: the rest
            # is tried again by the caller.
            error = None
        return applied, error

    async def close(self) -> None:
        try:
            flushed = False
            try:
                await self.flush()
                flushed = True
            finally:
                # Even when the last flush failed (a store error stops the
                # crawl): the tokens of what earlier flushes applied go all
                # the same (else they wait a day to expire).
                try:
                    await self._clean_up_at_close()
                except StateStoreError as exc:
                    if flushed:
                        raise
                    # The flush's own error is the one raised.
                    logger.warning("State store %s: the tokens' clean-up at close failed "
                                   "too (%s); they expire within a day",
                                   self.location, exc.__cause__ or exc)
        finally:
            if not self._closed:
                self._closed = True
                self._sync.close()
                await self._async.aclose()

    async def _clean_up_at_close(self) -> None:
        """The last flushes' tokens (their replies came: nothing to
        replay), one a slot written: not left behind. Every command deletes
        what is known to be done, so this runs after a failed flush too."""
        if not self.tagged or not self._spent_slot_tokens:
            return
        spent, self._spent_slot_tokens = self._spent_slot_tokens, []
        await self._commands([("DEL", key) for key in spent], "Redis command failed")

    # -- crawl records -------------------------------------------------------

    def stage_crawl(self, record: CrawlRecord) -> None:
        value = json.dumps({"started": record.started, "finished": record.finished,
                            "worker": record.worker, "reason": record.reason,
                            "figures": record.figures}, sort_keys=True, separators=(",", ":"))
        self._stage(record.scope, ("crawl", self._key("crawls", record.scope),
                                   repr(float(record.started)), value, self.crawl_history))

    def crawls(self, scope: str, limit: int) -> list[CrawlRecord]:
        if limit <= 0:
            return []
        pipe = self._sync.pipeline(transaction=False)
        pipe.zrevrange(self._key("crawls", scope), 0, limit - 1)
        [members] = self._sync_run(pipe)
        records = [CrawlRecord(scope=scope, **json.loads(raw)) for raw in members]
        # Ties of one start (a cluster run's workers): the later finish first.
        return sorted(records, key=lambda r: (r.started, r.finished), reverse=True)

    # -- remembered politeness rates -------------------------------------------

    def stage_slot_rates(self, rates: Iterable[SlotRate]) -> None:
        for rate in rates:
            # Not _encode: a rate keeps its fraction (2.8/s is not 2/s).
            value = json.dumps({"rate": rate.rate, "slow_start": rate.slow_start,
                                "saved_at": rate.saved_at, "ended": rate.ended},
                               sort_keys=True, separators=(",", ":"))
            self._stage(rate.scope, (
                "slotrate", self._key("slots", rate.scope), self._key("slotsat", rate.scope),
                rate.slot, value, repr(float(rate.saved_at)), self.slot_rates_kept))

    async def slot_rates(self, scope: str) -> SlotRates:
        return _slot_rates(scope, await self._call("HGETALL", self._key("slots", scope)))

    async def _send_batch(self, attempt: Callable[[], Awaitable[Any]]) -> Any:
        """flush.lua's reply to *attempt*, sent again while Redis does not answer."""
        try:
            return await self._again(attempt)
        except redis.exceptions.OutOfMemoryError as exc:
            # Refused whole before it ran (the script's flags): not unsure.
            raise self._fail("", exc) from None
        except redis.RedisError as exc:
            raise self._fail("Redis command failed", exc) from exc

    # -- holds ---------------------------------------------------------------

    # Holds are judged on the server's clock (hold.lua reads TIME): a caller
    # whose clock is ahead (another host's, a crawl under faketime) neither
    # takes a live hold nor keeps one past its lapse. A caller's *now* only
    # places the lapses it is told of on its own clock.

    def _hold_script(self, mode: str, scope: str, holder: str = "", ttl: float = 0.0,
                     gone: Sequence[str] = ()) -> tuple[str, list[str], float]:
        """hold.lua's answer: its status, the holders and lapses it names
        (each lapse placed on this host's clock), and the server's now."""
        pipe = self._sync.pipeline(transaction=False)
        pipe.execute_command("EVAL", HOLD_LUA, 2, self._key("holds", scope),
                             self._key("holdepoch", scope), mode, holder,
                             repr(float(ttl)), SHARED_HOLD, "", *gone)
        [reply] = self._sync_run(pipe)
        return self._hold_reply(reply)

    @staticmethod
    def _hold_reply(reply: list[bytes]) -> tuple[str, list[str], float]:
        server_now, status, *named = (part.decode() for part in reply)
        here = clock.now() - float(server_now)
        return status, [name if i % 2 == 0 else repr(float(name) + here)
                        for i, name in enumerate(named)], float(server_now)

    async def hold_scope(self, scope: str, holder: str, ttl: float,
                         now: float | None = None) -> None:
        await self._held_still(scope, holder, "refresh", ttl)

    async def _check_flush_hold(self) -> None:
        """A phased flush's check that its writer holds its scope still
        (:attr:`flush_hold`), before each phase writes: one script on the
        scope's slot, not in the phases' (a hold taken over between a check
        and its phase goes unseen: one round trip, unless the reactor is
        blocked right then); a lapsed hold taken again when nobody took
        the scope since (hold.lua's epoch)."""
        if self.flush_hold is not None:
            scope, holder = self.flush_hold
            taken = self._hold_takes.get(self.flush_hold)
            await self._held_still(scope, holder, "check", taken[1] if taken else 0.0)

    async def _held_still(self, scope: str, holder: str, mode: str, ttl: float = 0.0) -> None:
        taken = self._hold_takes.get((scope, holder))
        # One script on the scope's slot: checked and written at once; a
        # lapsed hold taken again only while its take's epoch is the scope's.
        [reply] = await self._commands(
            [("EVAL", HOLD_LUA, 2, self._key("holds", scope), self._key("holdepoch", scope),
              mode, holder, repr(float(ttl)), SHARED_HOLD,
              "" if taken is None else str(taken[0]))],
            "Redis command failed")
        status, named, _ = self._hold_reply(reply)
        if status == "lapsed":
            raise HoldLapsed.of(self.location, scope, holder)
        if status == "other":
            name, expires = named[0], float(named[1])
            raise ScopeHeld(f"State store {self.location}: scope {scope!r} is held by "
                            f"{describe_holder(name)}, which {describe_holder(holder)} may "
                            "not hold it beside", name, expires)

    def take_scope(self, scope: str, holder: str, ttl: float,
                   now: float) -> tuple[str, float] | None:
        crawl = is_crawl_hold(holder)
        # Holds of processes of this host that are gone are taken over (a
        # repair's never: it waits for them to lapse); which are gone is
        # known here only, and a gone process does not come back.
        gone: list[str] = []
        if not holder.startswith(REPAIR_HOLD):
            _, named, _ = self._hold_script("read", scope)
            gone = [name for name in named[::2] if takes_over(holder, name)]
        status, named, _ = self._hold_script("take", scope, holder, ttl, gone)
        if status == "other":
            return named[0], now + (float(named[1]) - clock.now())
        self._hold_takes[(scope, holder)] = (int(named[0]), ttl)
        if crawl:
            # This crawl's checks, from its start on, are noted one by one
            # (see summarize_pages), once the hold is taken and before the
            # crawl writes. Not a worker's: a run's workers start apart,
            # and each would clear the others' checks. A mark not set (a
            # failure) leaves it as it was: its summaries then read the
            # pages, or take out the checks since the older mark, right
            # either way.
            marks = self._sync.pipeline(transaction=False)
            if self.tagged:
                for nvm, checks in zip(self._shard_keys("nvm", scope),
                                       self._shard_keys("ck", scope), strict=True):
                    marks.execute_command("EVAL", CLUSTER_SUMS_MARK_LUA, 2, nvm,
                                          checks, math.floor(now))
            else:
                marks.eval(_SUMS_MARK_LUA, 0, self.prefix, _key_part(scope), math.floor(now))
            try:
                self._sync_run(marks)
            except StateStoreError as exc:
                logger.warning("State store %s: the marks of the crawl's start on %r were not "
                               "all set (%s): summaries may read pages", self.location, scope,
                               exc.__cause__ or exc)
        return None

    def mark_run_start(self, scope: str, started: float) -> None:
        # The mark moves to the run's start: P:ck keeps the run's checks
        # only (a mark never moved would keep a member for every page
        # checked since, ~140 bytes each, and summaries would read them
        # all). Refused where a page was checked at or after it already
        # (another worker wrote first, or a clock ahead): no mark there,
        # its summaries read every page, right either way.
        at = math.floor(started)
        try:
            if self.tagged:
                pipe = self._sync.pipeline(transaction=False)
                for nvm, checks in zip(self._shard_keys("nvm", scope),
                                       self._shard_keys("ck", scope), strict=True):
                    pipe.execute_command("EVAL", CLUSTER_SUMS_MARK_LUA, 2, nvm, checks, at)
            else:
                pipe = self._sync.pipeline(transaction=False)
                pipe.eval(_SUMS_MARK_LUA, 0, self.prefix, _key_part(scope), at)
            replies = self._sync_run(pipe)
        except StateStoreError as exc:
            logger.warning("State store %s: the mark of the run's start on %r was not set "
                           "(%s): its summaries may read every page", self.location, scope,
                           exc.__cause__ or exc)
            return
        refused = sum(1 for reply in replies if not int(reply))
        if refused:
            # Right either way, but a summary reading every page is slow on
            # a large scope: the operator should know why.
            logger.info("State store %s: the mark of the run's start on %r was not set "
                        "(%s of %s): a page there was checked at or after the run's start "
                        "(another worker wrote first, or a clock ahead); its summaries "
                        "read every page there until a later run's start is marked",
                        self.location, scope, refused, len(replies))

    async def release_scope(self, scope: str, holder: str) -> None:
        self._hold_takes.pop((scope, holder), None)  # released: never taken again
        await self._call("ZREM", self._key("holds", scope), holder)

    def scope_holders(self, scope: str, now: float) -> dict[str, float]:
        # Live on the server's clock, each lapse placed on this host's.
        _, named, _ = self._hold_script("read", scope)
        return {holder: float(expires) for holder, expires in zip(named[::2], named[1::2],
                                                                  strict=True)
                if float(expires) > now}

    # -- a scope's pages, read at once (the crawl's clock-skew repair) ---------

    def iter_pages(self, scope: str) -> Iterator[PageState]:
        for host, field, raw in self._iter_bucket_pages(scope, self._buckets(scope)):
            yield self._page(page_key_of(scope, host, field.decode()), raw)


def _names_page(record: dict[str, Any], page_url: str) -> bool:
    """Whether an item's stored record is a live item of *page_url*."""
    return bool(record.get("fingerprint")) and record.get("page") == page_url


def _undelivered_member(stored_at: float, item_key: str, version: int) -> str:
    """A version's member in a crawl's ``P:undel`` set (as ``OPS.undeliv`` writes it)."""
    return f"{int(stored_at):015d}\0{item_key}\0{version:010d}"


def _refused_for_memory(error: str) -> bool:
    """Whether a script's error (a reply of a pipeline, not raised) is
    Redis refusing it above ``maxmemory`` (``OOM command not allowed when
    used memory > 'maxmemory'``; the ``OOM`` code may be cut off)."""
    return error.startswith("OOM ") or "command not allowed when used memory" in error
