"""The Redis state store itself: opening a prefix (its layout checked and
migrated in place), the crawl-time reads, staged writes and flushes, the
due-page reads, holds, and the administration read-outs and repairs. The key
layout is in the package's docstring (:mod:`incremental_crawler.state.stores.redis`);
its URIs in :mod:`.uri`, its Lua scripts in :mod:`.scripts` and the ``.lua``
files of the package."""

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
from incremental_crawler.state.records import (
    Change,
    CrawlRecord,
    HostTrust,
    ItemRecord,
    PageFlags,
    PageKey,
    PageState,
    SlotRate,
    StoredVersion,
    Undelivered,
)
from incremental_crawler.state.stores.base import (
    AdminStore,
    Removed,
    SlotRates,
    StateStoreError,
    UrlRecord,
    crawl_history_setting,
    holder_gone,
    item_history_setting,
    redis_retry_setting,
)
from incremental_crawler.state.stores.redis.pages import (
    bucket_of,
    host_part,
    page_field,
    page_key_of,
    url_field,
)
from incremental_crawler.uris import redacted

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Iterator
    from typing import Self

    from scrapy.settings import BaseSettings


from incremental_crawler.state.stores.redis.core import (
    _HMGET_CHUNK,
    _glob,
    _key_part,
    _page_range,
    _slot_rates,
    _stored_version,
)
from incremental_crawler.state.stores.redis.due import RedisDueReads
from incremental_crawler.state.stores.redis.layout import (
    LAYOUT,
    LAYOUT_VERSION,
    MIN_REDIS_VERSION,
    RedisLayout,
)
from incremental_crawler.state.stores.redis.scripts import (
    _FLUSH_LUA,
    _LATEST_LUA,
    _READ_PAGES_SHA,
    _SUMS_FORGET_LUA,
    _SUMS_MARK_LUA,
)
from incremental_crawler.state.stores.redis.uri import DEFAULT_PREFIX, parse_redis_uri

__all__ = ["LAYOUT", "LAYOUT_VERSION", "MIN_REDIS_VERSION", "RedisStateStore"]


#: Keys per pipelined round-trip of a batched read (get_pages, get_links_many).
_READ_BATCH = 10_000


#: Pages per read script (each is a hash and a lookup in Redis: a bound on
#: how long one blocks the server), and read scripts per round-trip.
_READ_SCRIPT_PAGES = 2_000

#: The kinds of ``P:<kind>:<s>`` keys a reset deletes: every one this store
#: writes per scope but ``holds`` (holds lapse by themselves); and the kinds
#: of a host's keys (``P:<kind>:{<s>|<host>}``, buckets ``…:<n>``).
_SCOPE_KINDS = ("hosts", "items", "itemver", "order", "bypage", "crawls", "hs", "dueb",
                "splits", "slots", "slotsat", "undelc", "nvs", "nvm", "ck")
_HOST_KINDS = ("hd", "ln")


class RedisStateStore(RedisLayout, RedisDueReads, AdminStore):
    """State in Redis; see the module docstring."""

    def __init__(self, uri: str, *, prefix: str = DEFAULT_PREFIX,
                 history_limit: int = DEFAULT_SETTINGS["INCREMENTAL_ITEM_HISTORY"]) -> None:
        super().__init__(uri, prefix)
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
        self._spent_tokens: list[str] = []
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
            self._check_layout()
        except BaseException:
            self._sync.close()
            raise

    @classmethod
    def from_uri(cls, uri: str, *, settings: BaseSettings | None = None) -> Self:
        clean, prefix = parse_redis_uri(uri)
        store = cls(clean, prefix=prefix, history_limit=item_history_setting(settings))
        store.crawl_history = crawl_history_setting(settings)
        store.retry_time = redis_retry_setting(settings)
        return store

    @classmethod
    def exists(cls, uri: str, *, settings: BaseSettings | None = None) -> bool:
        """Whether the prefix *uri* names holds a store (its layout record):
        opening one writes it."""
        clean, prefix = parse_redis_uri(uri)
        client = redis.Redis.from_url(clean, socket_connect_timeout=5, socket_timeout=30)
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
            pipe = self._async.pipeline(transaction=False)
            for key in batch:
                host, field = page_field(key)
                pipe.execute_command("HGET", self._host_key("ln", key.scope, host), field)
            try:
                replies = await self._run_raw(pipe)
            except redis.RedisError as exc:
                raise self._fail("read failed", exc) from exc
            for key, raw in zip(batch, replies, strict=True):
                found[key] = None if raw is None else raw.decode()
        return found

    async def _item(self, scope: str, item_key: str) -> dict[str, Any] | None:
        raw = await self._call("HGET", self._key("items", scope), item_key)
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
        pipe = self._async.pipeline(transaction=False)
        pipe.zrangebylex(self._key("bypage", scope), *_page_range(page_url))
        pipe.hget(self._key("items", scope), page_url)
        listed, own = await self._run(pipe)
        keys = [member.partition(b"\0")[2].decode() for member in listed]
        if own is not None:
            record = json.loads(own)
            if record["fingerprint"] and record.get("page", page_url) == page_url:
                keys.append(page_url)
        return sorted(keys)

    async def get_item_data(self, scope: str, item_key: str) -> str | None:
        # The latest version's number, then that entry of the item's history.
        version = await self._call("HGET", self._key("itemver", scope), item_key)
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
        self._stage(scope, (
            "item", self._key("items", scope), self._key("itemver", scope),
            self._key("order", scope), self._hist_key(scope, key), self._key("bypage", scope),
            key, self._encode(record, skip), int(record.stored_at), entry, str(record.change),
            page, "1" if record.fingerprint else "0", self.history_limit,
        ))
        if record.data is not None and record.delivery:
            self._stage(scope, (
                "undeliv", self._undelivered_key(scope, record.delivery),
                self._key("undelc", scope), record.delivery, self._key("itemver", scope), key,
                int(record.stored_at)))
        self._item_fps[scope, key] = record.fingerprint

    # -- delivery of item versions ---------------------------------------------

    def _undelivered_key(self, scope: str, crawl: str) -> str:
        return f"{self._key('undel', scope)}:{quote(crawl, safe='')}"

    def stage_delivered(self, scope: str, crawl: str) -> None:
        self._stage(scope, ("delivered", self._undelivered_key(scope, crawl),
                            self._key("undelc", scope), crawl, "1"))

    def stage_settled(self, scope: str, crawl: str) -> None:
        """Stage forgetting *crawl* among those with waiting versions, if none is left."""
        self._stage(scope, ("delivered", self._undelivered_key(scope, crawl),
                            self._key("undelc", scope), crawl, "0"))

    def stage_redelivered(self, pending: Undelivered, crawl: str) -> None:
        version = pending.version
        self._stage(version.scope, (
            "redeliv", self._undelivered_key(version.scope, pending.crawl),
            self._undelivered_key(version.scope, crawl), self._key("undelc", version.scope),
            crawl, _undelivered_member(version.stored_at, version.key, version.version)))

    async def undelivered_crawls(self, scope: str) -> list[str]:
        members = await self._call("SMEMBERS", self._key("undelc", scope))
        return sorted(m.decode() for m in members)

    async def undelivered(self, scope: str, crawl: str, *, after: Undelivered | None = None,
                          limit: int = 500) -> list[Undelivered]:
        zset = self._undelivered_key(scope, crawl)
        start = "-" if after is None else "(" + _undelivered_member(
            after.version.stored_at, after.version.key, after.version.version)
        members = await self._call("ZRANGE", zset, start, "+", "BYLEX", "LIMIT", 0, limit)
        if not members:
            return []
        wanted = []
        for member in members:
            key, _, number = member.decode().partition("\0")[2].rpartition("\0")
            wanted.append((key, int(number), member))
        pipe = self._async.pipeline(transaction=False)
        for key, number, _ in wanted:
            pipe.hget(self._hist_key(scope, key), number)
        self.roundtrips += 1
        try:
            entries = await pipe.execute()
        except redis.RedisError as exc:
            raise self._fail("read failed", exc) from exc
        found, pruned = [], []
        for (key, number, member), entry in zip(wanted, entries, strict=True):
            if entry is None:
                pruned.append(member)
            else:
                found.append(Undelivered(crawl, _stored_version(scope, key, number,
                                                                json.loads(entry))))
        if pruned:
            # The version is gone (pruned, forgotten): its mark means
            # nothing any more, and goes at once (bookkeeping, like a hold).
            await self._call("ZREM", zset, *pruned)
        return found

    @property
    def pending(self) -> int:
        return len(self._ops) + self._flushing_count

    async def flush(self) -> int:
        if self._flush_lock is None:
            self._flush_lock = asyncio.Lock()
        # One flush at a time (a timed flush may still be in flight at close).
        async with self._flush_lock:
            return await self._flush()

    async def _flush(self) -> int:
        if not self._ops:
            return 0
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
                self._unsure = (sending[0], sending[1])
            self._pages = {**self._flushing_pages, **self._pages}
            self._links = {**self._flushing_links, **self._links}
            self._item_fps = {**self._flushing_fps, **self._item_fps}
            raise
        finally:
            self._flushing_pages, self._flushing_fps, self._flushing_count = {}, {}, 0
            self._flushing_links = {}
        return done

    async def _apply(self, token: str, ops: list[tuple[Any, ...]],
                     scopes: set[str]) -> tuple[int, str | None]:
        """Run one batch; ``(writes applied, error of the one that failed)``.

        Raises (chained to the Redis error) when the outcome is unknown.
        """
        keys = [self._token_key(token), f"{self.prefix}:scopes",
                *(self._token_key(t) for t in self._spent_tokens)]
        args: list[Any] = [self.prefix, self._listpack_value, len(scopes), *sorted(scopes)]
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

        try:
            reply = await self._again(attempt)
        except redis.exceptions.OutOfMemoryError as exc:
            # Refused whole before it ran (the script's flags): not unsure.
            raise self._fail("", exc) from None
        except redis.RedisError as exc:
            raise self._fail("Redis command failed", exc) from exc
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
            await self.flush()
        finally:
            if not self._closed:
                self._closed = True
                self._sync.close()
                await self._async.aclose()

    # -- reports and exports (synchronous) ---------------------------------

    def _iter_item_keys(self, scope: str) -> Iterator[list[bytes]]:
        """The scope's item keys, oldest first, in chunks of ``_HMGET_CHUNK``."""
        order = self._key("order", scope)
        for start in range(0, 2**63, _HMGET_CHUNK):
            pipe = self._sync.pipeline(transaction=False)
            pipe.zrange(order, start, start + _HMGET_CHUNK - 1)
            [keys] = self._sync_run(pipe)
            if keys:
                yield keys
            if len(keys) < _HMGET_CHUNK:
                return

    def iter_versions(self, scope: str | None = None, *, since: float | None = None,
                      every_version: bool = False) -> Iterator[StoredVersion]:
        # Redis has no index by time: one pass notes (stored_at, scope, key,
        # version) of the versions wanted, sorted; a second reads them in
        # that order, in bounded chunks. Only those small tuples are held,
        # never the items' data. Stored times are whole seconds: a window
        # from a fraction of a second starts at its whole second.
        floor = -math.inf if since is None else math.floor(since)
        wanted: list[tuple[int, str, str, int]] = []
        for name in self._stored_scopes() if scope is None else [scope]:
            for keys in self._iter_item_keys(name):
                wanted += self._note_versions(name, keys, floor, every_version)
        wanted.sort()
        for start in range(0, len(wanted), _HMGET_CHUNK):
            chunk = [(name, key, n) for _, name, key, n in wanted[start:start + _HMGET_CHUNK]]
            if every_version:
                yield from self._read_versions(chunk)
            else:
                yield from self._read_latest(chunk, None if since is None else floor)

    def _note_versions(self, scope: str, keys: list[bytes], floor: float,
                       every_version: bool) -> list[tuple[int, str, str, int]]:
        """(stored_at, scope, key, version) of the versions of *keys* stored
        at or after *floor*: each one, or (version 0) the latest of each."""
        pipe = self._sync.pipeline(transaction=False)
        noted: list[tuple[int, str, str, int]] = []
        if every_version:
            for key in keys:
                pipe.hgetall(self._hist_key(scope, key.decode()))
            for key, history in zip(keys, self._sync_run(pipe), strict=True):
                for version, entry in history.items():
                    stored_at = json.loads(entry)["stored_at"]
                    if stored_at >= floor:
                        noted.append((stored_at, scope, key.decode(), int(version)))
            return noted
        # Latest only: the items' records say when their latest version was
        # stored (no history entry, no data, is read).
        pipe.hmget(self._key("items", scope), keys)
        [records] = self._sync_run(pipe)
        for key, raw in zip(keys, records, strict=True):
            if raw is not None:
                stored_at = json.loads(raw).get("stored_at", 0)
                if stored_at >= floor:
                    noted.append((stored_at, scope, key.decode(), 0))
        return noted

    def _read_versions(self, chunk: list[tuple[str, str, int]]) -> Iterator[StoredVersion]:
        """The history entries (scope, key, version) of *chunk* still stored.

        A version pruned since it was noted (newer ones were written
        meanwhile, beyond the history kept) is left out.
        """
        pipe = self._sync.pipeline(transaction=False)
        for name, item_key, number in chunk:
            pipe.hget(self._hist_key(name, item_key), number)
        for (name, item_key, number), entry in zip(chunk, self._sync_run(pipe), strict=True):
            if entry is not None:
                yield _stored_version(name, item_key, number, json.loads(entry))

    def _read_latest(self, chunk: list[tuple[str, str, int]],
                     floor: float | None) -> Iterator[StoredVersion]:
        """The latest version of each item of *chunk*, as stored now.

        Read in one script, so each item's version number, history entry
        and record agree: an item written since it was noted yields its
        newer version (still in the window), never nothing. A latest
        version without data yields nothing.
        """
        keys: list[str] = []
        for name, item_key, _ in chunk:
            keys += [self._key("items", name), self._key("itemver", name),
                     self._hist_key(name, item_key)]
        self.roundtrips += 1
        try:
            reply: Any = self._sync.eval(_LATEST_LUA, len(keys), *keys,
                                         *(item_key for _, item_key, _ in chunk))
        except redis.RedisError as exc:
            raise self._fail("read failed", exc) from exc
        for n, (name, item_key, _) in enumerate(chunk):
            version, entry, raw = reply[3 * n:3 * n + 3]
            if version is None or entry is None:
                continue
            stored = json.loads(entry)
            if floor is not None and stored["stored_at"] < floor:
                continue
            found = _stored_version(name, item_key, int(version), stored)
            if floor is not None and raw is not None and found.change != Change.DELETED:
                # New to whoever has what was stored before the window:
                # the item was not live then (its live run began in the
                # window, and no tombstone of an earlier one is in it).
                record = json.loads(raw)
                born, died = record.get("born"), record.get("died")
                if born is not None and born >= floor and (died is None or died < floor):
                    found = found._replace(change=str(Change.NEW))
            yield found

    def iter_items(self, scope: str | None = None) -> Iterator[dict[str, object]]:
        scopes = self._stored_scopes() if scope is None else [scope]
        for name in scopes:
            yield from self._iter_scope_items(name)

    def _iter_scope_items(self, scope: str) -> Iterator[dict[str, object]]:
        # Oldest key first (by first_seen, then key), in bounded chunks.
        for keys in self._iter_item_keys(scope):
            pipe = self._sync.pipeline(transaction=False)
            pipe.hmget(self._key("items", scope), keys)
            pipe.hmget(self._key("itemver", scope), keys)
            records, versions = self._sync_run(pipe)
            pipe = self._sync.pipeline(transaction=False)
            for key, version in zip(keys, versions, strict=True):
                pipe.hget(self._hist_key(scope, key.decode()), version or b"0")
            entries = self._sync_run(pipe)
            for key, raw, entry in zip(keys, records, entries, strict=True):
                if raw is None:
                    continue
                record = json.loads(raw)
                if not record["fingerprint"]:
                    continue  # a tombstone: the item is gone
                item: dict[str, object] = json.loads(entry)["data"] if entry else {}
                item.setdefault("url", record.get("url") or key.decode())
                item["fingerprint"] = record["fingerprint"]
                yield item

    def item_history(self, scope: str, item_key: str) -> list[tuple[int, str]]:
        pipe = self._sync.pipeline(transaction=False)
        pipe.hgetall(self._hist_key(scope, item_key))
        [versions] = self._sync_run(pipe)
        return sorted((int(v), json.loads(raw)["fingerprint"]) for v, raw in versions.items())

    def count_pages(self, scope: str | None = None) -> int:
        # Each host's record counts its pages (a write that adds one adds one).
        total = 0
        for name in self._stored_scopes() if scope is None else [scope]:
            hosts = self._scope_hosts(name)
            for start in range(0, len(hosts), _HMGET_CHUNK):
                pipe = self._sync.pipeline(transaction=False)
                for host in hosts[start:start + _HMGET_CHUNK]:
                    pipe.hget(self._host_key("hd", name, host), "p")
                total += sum(int(n or 0) for n in self._sync_run(pipe))
        return total

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

    def read_slot_rates(self, scope: str) -> SlotRates:
        pipe = self._sync.pipeline(transaction=False)
        pipe.hgetall(self._key("slots", scope))
        [raw] = self._sync_run(pipe)
        return _slot_rates(scope, raw)

    # -- holds ---------------------------------------------------------------

    async def hold_scope(self, scope: str, holder: str, ttl: float,
                         now: float | None = None) -> None:
        if now is None:
            now = clock.now()
        holds = self._key("holds", scope)
        pipe = self._async.pipeline(transaction=True)
        pipe.zremrangebyscore(holds, "-inf", now)  # lapsed ones go
        pipe.zadd(holds, {holder: now + ttl})
        await self._run(pipe)

    def take_scope(self, scope: str, holder: str, ttl: float,
                   now: float) -> tuple[str, float] | None:
        holds = self._key("holds", scope)
        try:
            with self._sync.pipeline(transaction=True) as pipe:
                # Bounded: another crawl taking it at the same instant makes
                # this one read again (WATCH); it then finds that crawl's hold.
                for _ in range(100):
                    try:
                        pipe.watch(holds)
                        pairs: list[tuple[bytes, float]] = pipe.zrangebyscore(  # type: ignore[assignment]
                            holds, f"({now!r}", "+inf", withscores=True)
                        self.roundtrips += 2
                        others = sorted(
                            ((name, float(expires)) for name, expires in
                             ((raw.decode(), expires) for raw, expires in pairs)
                             if name != holder and not holder_gone(name)),
                            key=lambda pair: -pair[1])
                        if others:
                            pipe.unwatch()
                            return others[0]
                        pipe.multi()
                        pipe.delete(holds)  # lapsed holds, and those of gone processes
                        pipe.zadd(holds, {holder: now + ttl})
                        # This crawl's checks, from its start on, are noted
                        # one by one (see summarize_pages).
                        pipe.eval(_SUMS_MARK_LUA, 0, self.prefix, _key_part(scope),
                                  math.floor(now))
                        pipe.execute()
                        self.roundtrips += 1
                        return None
                    except redis.WatchError:
                        continue
        except redis.RedisError as exc:
            raise self._fail("cannot be reached or read (is Redis running at this "
                             "address?)", exc) from exc
        raise self._fail(f"could not take the hold on scope {scope!r}: it kept changing")

    async def release_scope(self, scope: str, holder: str) -> None:
        await self._call("ZREM", self._key("holds", scope), holder)

    def scope_holders(self, scope: str, now: float) -> dict[str, float]:
        pipe = self._sync.pipeline(transaction=False)
        pipe.zrangebyscore(self._key("holds", scope), f"({now!r}", "+inf", withscores=True)
        [pairs] = self._sync_run(pipe)
        return {holder.decode(): float(expires) for holder, expires in pairs}

    # -- read-outs -----------------------------------------------------------

    def scopes(self) -> list[str]:
        return self._stored_scopes()

    def iter_pages(self, scope: str) -> Iterator[PageState]:
        for host, field, raw in self._iter_bucket_pages(scope, self._buckets(scope)):
            yield self._page(page_key_of(scope, host, field.decode()), raw)

    def iter_hosts(self, scope: str) -> Iterator[HostTrust]:
        pipe = self._sync.pipeline(transaction=False)
        pipe.hgetall(self._key("hosts", scope))
        [hosts] = self._sync_run(pipe)
        for host in sorted(hosts):
            yield self._decode(HostTrust, hosts[host], scope=scope, host=host.decode())

    def _page_fields(self, scope: str, url: str) -> tuple[str, int, list[str]]:
        """The host and bucket of *url*, and its stored page fields there
        (its variants)."""
        host, part = url_field(url)
        pipe = self._sync.pipeline(transaction=False)
        pipe.hget(self._host_key("hd", scope, host), "n")
        [n] = self._sync_run(pipe)
        bucket = bucket_of(part, int(n or 1))
        pipe = self._sync.pipeline(transaction=False)
        for key in self._bucket_keys(scope, host, bucket):
            pipe.hkeys(key)
        stored = [field for fields_ in self._sync_run(pipe) for field in fields_]
        variants = sorted(f.decode() for f in stored if f.startswith(part.encode() + b"\0"))
        plain = [part] if part.encode() in stored else []
        return host, bucket, plain + variants

    def _items_by_page(self, scope: str, urls: Collection[str], *, live: bool) -> list[str]:
        """Keys of the items last stored from any of *urls* (one scan of the items)."""
        keys: list[str] = []
        for key, raw in self._hscan(self._key("items", scope)):
            record = json.loads(raw)
            page = record.get("page") or key.decode()
            if page in urls and (not live or record.get("fingerprint")):
                keys.append(key.decode())
        return sorted(keys)

    def url_record(self, scope: str, url: str) -> UrlRecord:
        host, bucket, page_fields = self._page_fields(scope, url)
        items = self._items_by_page(scope, {url}, live=True)
        pipe = self._sync.pipeline(transaction=False)
        for field in page_fields:
            for key in self._bucket_keys(scope, host, bucket):
                pipe.hget(key, field)
            pipe.hget(self._host_key("ln", scope, host), field)
        for key in items:
            pipe.hget(self._key("itemver", scope), key)
        replies = self._sync_run(pipe)
        pages, links = [], {}
        for n, field in enumerate(page_fields):
            small, large, record = replies[3 * n:3 * n + 3]
            raw = small if small is not None else large
            page_key = page_key_of(scope, host, field)
            if raw is not None:
                pages.append(self._page(page_key, raw))
            if record is not None:
                links[page_key.variant] = record.decode()
        versions = replies[3 * len(page_fields):]
        pipe = self._sync.pipeline(transaction=False)
        for key, version in zip(items, versions, strict=True):
            pipe.hget(self._hist_key(scope, key), version or b"0")
        latest = []
        for key, version, entry in zip(items, versions, self._sync_run(pipe), strict=True):
            if entry is None:
                continue
            data = json.loads(entry)
            number = int(version)
            change = data.get("change") or (Change.NEW if number == 1 else Change.CHANGED)
            latest.append(StoredVersion(scope, key, number, str(change), data["stored_at"],
                                        data["fingerprint"], data["data"]))
        return UrlRecord(scope, url, pages, links, items, latest)

    # -- repairs -------------------------------------------------------------

    def _forget(self, scope: str, urls: Collection[str],
                delete_pages: Callable[[Any], list[str | None]],
                host: str | None = None) -> Removed:
        """Delete the items last stored from *urls*, with their history, and
        what *delete_pages* adds to the transaction (it returns what each of
        its replies counts), and *host*'s trust record and remembered rate,
        in one ``MULTI``."""
        items = self._items_by_page(scope, urls, live=False)
        hist = [self._hist_key(scope, key) for key in items]
        pipe = self._sync.pipeline(transaction=True)
        # What each reply counts (None: nothing), in the pipeline's order.
        kinds: list[str | None] = []
        for key in hist:
            pipe.hlen(key)
            kinds.append("versions")
        kinds += delete_pages(pipe)
        if items:
            pipe.hdel(self._key("items", scope), *items)
            pipe.hdel(self._key("itemver", scope), *items)
            pipe.zrem(self._key("order", scope), *items)
            pipe.delete(*hist)
            kinds += ["items", None, None, None]
        for url in sorted(urls):
            # Every item listed under these pages is gone with them.
            pipe.zremrangebylex(self._key("bypage", scope), *_page_range(url))
            kinds.append(None)
        if host is not None:
            pipe.hdel(self._key("hosts", scope), host)
            pipe.hdel(self._key("slots", scope), host)
            pipe.zrem(self._key("slotsat", scope), host)
            kinds += ["hosts", "rates", None]
        counts = dict.fromkeys(Removed._fields, 0)
        for kind, n in zip(kinds, self._sync_run(pipe), strict=True):
            if kind is not None:
                counts[kind] += int(n)
        return Removed(**counts)

    def forget_page(self, scope: str, url: str) -> Removed:
        host, bucket, page_fields = self._page_fields(scope, url)

        def delete_pages(pipe: Any) -> list[str | None]:
            if not page_fields:
                return []
            pipe.eval(_SUMS_FORGET_LUA, 0, self.prefix, _key_part(scope), host_part(host),
                      "fields", bucket, *page_fields)
            for key in self._bucket_keys(scope, host, bucket):
                pipe.hdel(key, *page_fields)
            pipe.hincrby(self._host_key("hd", scope, host), "p", -len(page_fields))
            pipe.hdel(self._host_key("ln", scope, host), *page_fields)
            # The bucket's bound in the revisit index may now be low: a
            # lower bound still (the next summary sets it right).
            return [None, "pages", "pages", None, "links"]

        return self._forget(scope, {url}, delete_pages)

    def forget_host(self, scope: str, host: str) -> Removed:
        n = self._bucket_counts(scope, [host])[host]
        buckets = [(host, b) for b in range(n)]
        urls = {page_key_of(scope, host, field.decode()).url
                for _, field, _ in self._iter_bucket_pages(scope, buckets)}

        def delete_pages(pipe: Any) -> list[str | None]:
            pipe.eval(_SUMS_FORGET_LUA, 0, self.prefix, _key_part(scope), host_part(host),
                      "buckets", *(b for _, b in buckets))
            kinds: list[str | None] = [None]
            doomed = [key for _, b in buckets for key in self._bucket_keys(scope, host, b)]
            for key in doomed:
                pipe.hlen(key)
                kinds.append("pages")
            pipe.hlen(self._host_key("ln", scope, host))
            kinds.append("links")
            pipe.delete(*doomed, *(self._host_key(kind, scope, host) for kind in _HOST_KINDS))
            pipe.srem(self._key("hs", scope), host_part(host))
            pipe.zrem(self._key("dueb", scope), *(f"{host_part(host)}|{b}" for _, b in buckets))
            return [*kinds, None, None, None]

        return self._forget(scope, urls, delete_pages, host)

    def _scope_keys(self, scope: str) -> tuple[list[str], list[str], list[str], list[str]]:
        """The scope's keys of this store's kinds (holds excepted): the
        scope's own, its hosts' buckets and links hashes, then its history
        keys. Only these kinds: other ``P:<name>:<s>`` keys may be
        anybody's (a shared politeness budget is ``P:budget:<host>``, and a
        scope may be named after its host)."""
        kinds = [self._key(kind, scope) for kind in _SCOPE_KINDS]
        counts = self._bucket_counts(scope, self._scope_hosts(scope))
        buckets = [key for host, n in counts.items() for b in range(n)
                   for key in self._bucket_keys(scope, host, b)]
        links = [self._host_key("ln", scope, host) for host in counts]
        kinds += [self._host_key("hd", scope, host) for host in counts]
        hist = self._scan_keys(f"{_glob(self.prefix)}:hist:{_glob(_key_part(scope))}:*")
        kinds += self._scan_keys(f"{_glob(self.prefix)}:undel:{_glob(_key_part(scope))}:*")
        kinds += self._fine_sums_keys(scope)
        return kinds, buckets, links, hist

    def _count(self, scope: str, buckets: list[str], links: list[str], hist: list[str],
               pipe: Any) -> None:
        for key in buckets + links:
            pipe.hlen(key)
        pipe.hlen(self._key("items", scope))
        for key in hist:
            pipe.hlen(key)
        pipe.hlen(self._key("hosts", scope))
        pipe.zcard(self._key("crawls", scope))

    @staticmethod
    def _counted(replies: list[int], buckets: list[str], links: list[str],
                 hist: list[str]) -> Removed:
        pages = sum(replies[:len(buckets)])
        rest = replies[len(buckets):]
        linked = sum(rest[:len(links)])
        items, *rest = rest[len(links):]
        return Removed(pages, linked, items, sum(rest[:len(hist)]), *rest[len(hist):])

    def count_scope(self, scope: str) -> Removed:
        _, buckets, links, hist = self._scope_keys(scope)
        pipe = self._sync.pipeline(transaction=True)
        self._count(scope, buckets, links, hist, pipe)
        return self._counted(self._sync_run(pipe), buckets, links, hist)

    def reset_scope(self, scope: str) -> Removed:
        kinds, buckets, links, hist = self._scope_keys(scope)
        pipe = self._sync.pipeline(transaction=True)
        self._count(scope, buckets, links, hist, pipe)
        counted = len(buckets) + len(links) + 1 + len(hist) + 2
        doomed = kinds + buckets + links + hist
        for start in range(0, len(doomed), _HMGET_CHUNK):
            pipe.delete(*doomed[start:start + _HMGET_CHUNK])
        pipe.srem(f"{self.prefix}:scopes", scope)
        replies = self._sync_run(pipe)
        return self._counted(replies[:counted], buckets, links, hist)


def _undelivered_member(stored_at: float, item_key: str, version: int) -> str:
    """A version's member in a crawl's ``P:undel`` set (as ``OPS.undeliv`` writes it)."""
    return f"{int(stored_at):015d}\0{item_key}\0{version:010d}"


