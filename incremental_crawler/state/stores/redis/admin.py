"""The Redis store's administration, what
:class:`~incremental_crawler.state.stores.base.AdminStore` adds to the crawl
interface: the read-outs of ``scrapy state`` and ``scrapy report`` (scopes,
hosts, what is stored of a URL, remembered rates, page counts), the exports
of ``scrapy items`` (``iter_items``, ``iter_versions``, ``item_history``)
and the repairs (``forget_page``, ``forget_host``, ``reset_scope``, and
``count_scope``, what a reset would delete). All synchronous, on the
blocking client, and apart from the crawl-time store as the two interfaces
are: a crawl never calls them, and the repairs run while no crawl holds the
scope, each in one ``MULTI`` (a page repair's under ``WATCH`` of its host's
record: see :meth:`RedisAdmin._forget`; on a cluster one per slot, a page
repair's host part one script: see :meth:`RedisAdmin._forget_in_slots`)."""

from __future__ import annotations

import heapq
import json
import math
import uuid
from typing import TYPE_CHECKING, Any

import redis
from redis.crc import key_slot

from incremental_crawler.hosts import host_of
from incremental_crawler.state.records import Change, HostTrust, StoredVersion
from incremental_crawler.state.stores.base import (
    AdminStore,
    Removed,
    RepairStopped,
    SlotRates,
    StateStoreError,
    StoredItem,
    UrlRecord,
)
from incremental_crawler.state.stores.redis.cluster import RedisClusterPath
from incremental_crawler.state.stores.redis.core import (
    _HMGET_CHUNK,
    FINE_KEYS,
    ITEM_GROUPS,
    _glob,
    _key_part,
    _page_range,
    _slot_rates,
    _stored_version,
    host_group,
    logger,
)
from incremental_crawler.state.stores.redis.memo import counter_ok
from incremental_crawler.state.stores.redis.pages import (
    bucket_of,
    host_part,
    page_key_of,
    url_field,
)
from incremental_crawler.state.stores.redis.scripts import (
    _GENERATION_LUA,
    _LATEST_LUA,
    _SUMS_FORGET_LUA,
    CLUSTER_FORGET_LUA,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterator

__all__ = ["RedisAdmin"]

#: The kinds of ``P:<kind>:<s>`` keys a reset deletes: every one this store
#: writes per scope but ``holds`` (holds lapse by themselves) and ``wg``
#: (the write generation, raised, never deleted: see memo.py); and the kinds
#: of a host's keys (``P:<kind>:{<s>|<host>}``, buckets ``…:<n>``; a host's
#: ``wg`` kept as a scope's is).
_SCOPE_KINDS = ("hosts", "items", "itemver", "order", "bypage", "crawls", "hs", "dueb",
                "splits", "slots", "slotsat", "undelc", "nvs", "nvm", "ck", "memo")
#: Those kept per scope shard in the cluster layout (see SCOPE_SHARDS).
_SHARD_KINDS = frozenset({"hs", "dueb", "splits", "nvs", "nvm", "ck"})
_HOST_KINDS = ("hd", "ln")
#: The kinds kept per item group in the cluster layout (``{<s>#<g>}``).
_GROUP_KINDS = ("items", "itemver", "order", "bypage", "bypagev")
#: Times a cluster repair's host part is planned again (a crawl split the
#: host's buckets meanwhile).
_FORGET_ROUNDS = 8


class RedisAdmin(RedisClusterPath, AdminStore):
    """The administration of a Redis store (see the module docstring)."""

    # -- read-outs -------------------------------------------------------------

    def store_identity(self) -> str:
        # The server by its run id (on a cluster: the node of the prefix's
        # scopes key, the same whichever nodes the URI names), its database
        # and the prefix.
        key = f"{self.prefix}:scopes"
        client: Any = self._sync
        try:
            if self.cluster:
                info = client.info("server", target_nodes=client.get_node_from_key(key))
            else:
                info = client.info("server")
        except redis.exceptions.ResponseError:
            return self.location  # INFO refused (an ACL): the URI is all there is
        except redis.RedisError as exc:
            raise self._fail("read failed", exc) from exc
        db = 0 if self.cluster else client.connection_pool.connection_kwargs.get("db", 0)
        return f"redis:{info['run_id']}:{db}:{self.prefix}"

    def scopes(self) -> list[str]:
        return self._stored_scopes()

    def iter_hosts(self, scope: str) -> Iterator[HostTrust]:
        pipe = self._sync.pipeline(transaction=False)
        pipe.hgetall(self._key("hosts", scope))
        [hosts] = self._sync_run(pipe)
        for host in sorted(hosts):
            yield self._decode(HostTrust, hosts[host], scope=scope, host=host.decode())

    def page_hosts(self, scope: str) -> list[str]:
        # Links records' hosts too: a write of either moves the generation.
        return sorted(set(self._scope_hosts(scope)))

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
        """Keys of the items last stored from any of *urls* (one scan of the
        items: on a cluster, of every item group's)."""
        return sorted(self._item_pages(scope, urls, live=live))

    def _item_pages(self, scope: str, urls: Collection[str], *, live: bool,
                    host: str | None = None) -> dict[str, str]:
        """The page of each item last stored from any of *urls*, or from
        any page of *host*, by item key."""
        found: dict[str, str] = {}
        # On a cluster every group's hash, walked together (pipelined
        # rounds of about _SCAN_ROUND_ENTRIES entries, a round trip a
        # primary each), not a round trip per group (1,024) whatever the
        # scope holds.
        pairs = (self._hscan_many(self._group_keys("items", scope)) if self.tagged
                 else self._hscan(self._key("items", scope)))
        for key, raw in pairs:
            record = json.loads(raw)
            page = record.get("page") or key.decode()
            if (page in urls or (host is not None and host_of(page) == host)) and (
                    not live or record.get("fingerprint")):
                found[key.decode()] = page
        return found

    def url_record(self, scope: str, url: str) -> UrlRecord:
        host, bucket, page_fields = self._page_fields(scope, url)
        items = self._items_by_page(scope, {url}, live=True)
        pipe = self._sync.pipeline(transaction=False)
        for field in page_fields:
            for key in self._bucket_keys(scope, host, bucket):
                pipe.hget(key, field)
            pipe.hget(self._host_key("ln", scope, host), field)
        for key in items:
            pipe.hget(self._item_key("itemver", scope, key), key)
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

    def read_slot_rates(self, scope: str) -> SlotRates:
        pipe = self._sync.pipeline(transaction=False)
        pipe.hgetall(self._key("slots", scope))
        [raw] = self._sync_run(pipe)
        return _slot_rates(scope, raw)

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

    # -- exports ---------------------------------------------------------------

    def _iter_item_keys(self, scope: str) -> Iterator[list[bytes]]:
        """The scope's item keys, oldest first, in chunks of ``_HMGET_CHUNK``."""
        if self.tagged:
            yield from self._iter_grouped_item_keys(scope)
            return
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
        records = self._item_fields("items", scope, keys)
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
        reply = self._latest(chunk)
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
            records = self._item_fields("items", scope, keys)
            versions = self._item_fields("itemver", scope, keys)
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

    def iter_item_states(self, scope: str) -> Iterator[StoredItem]:
        # Each export order (the scope's, or on a cluster each item
        # group's) in chunks: its scores are the items' first_seen.
        orders = self._group_keys("order", scope) if self.tagged else [self._key("order", scope)]
        for order in orders:
            for start in range(0, 2**63, _HMGET_CHUNK):
                pipe = self._sync.pipeline(transaction=False)
                pipe.zrange(order, start, start + _HMGET_CHUNK - 1, withscores=True)
                [pairs] = self._sync_run(pipe)
                if pairs:
                    yield from self._item_states(scope, pairs)
                if len(pairs) < _HMGET_CHUNK:
                    break

    def _item_states(self, scope: str, pairs: list[tuple[bytes, float]]) -> Iterator[StoredItem]:
        keys = [raw_key for raw_key, _ in pairs]
        records = self._item_fields("items", scope, keys)
        numbers = self._item_fields("itemver", scope, keys)
        pipe = self._sync.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(self._hist_key(scope, key.decode()))
        histories = self._sync_run(pipe)
        for (raw_key, first_seen), raw, number, history in zip(
                pairs, records, numbers, histories, strict=True):
            item_key = raw_key.decode()
            try:
                record = json.loads(raw)
                version = int(number)
                versions = sorted((_stored_version(scope, item_key, int(n), json.loads(entry))
                                   for n, entry in history.items()), key=lambda v: v.version)
                yield StoredItem(scope, item_key, record.get("url") or item_key,
                                 record.get("page") or item_key,
                                 record["fingerprint"], record.get("simhash"), version,
                                 first_seen, record.get("stored_at", first_seen), versions,
                                 record.get("born"), record.get("died"))
            except (TypeError, ValueError, KeyError) as exc:
                raise self._fail(f"the item {item_key!r} of scope {scope!r} cannot be read "
                                 f"(record {raw!r}, version {number!r}): {exc!r}") from exc

    # -- repairs ---------------------------------------------------------------

    def _forget(self, scope: str, page_host: str,
                plan: Callable[[], tuple[Collection[str], Callable[[Any], list[str | None]]]],
                host: str | None = None) -> Removed:
        """Delete the items last stored from the pages *plan* reads (it
        returns their URLs and what to add to the transaction to delete
        them, which returns what each of its replies counts), with their
        history, and *host*'s trust record and remembered rate, in one
        ``MULTI``, under ``WATCH`` of the record of *page_host* (the pages'
        host): a crawl that splits its buckets or adds a page to it after
        *plan* read makes the repair read again (a split would leave pages
        in a bucket not deleted; the sums are taken out in the ``MULTI``,
        from the records it deletes)."""
        watched = self._host_key("hd", scope, page_host)
        counter = self._generation_key(scope, page_host)
        for _ in range(_FORGET_ROUNDS):
            with self._sync.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(watched, counter)
                    # Raised last in the MULTI, which runs on when a command
                    # fails: a counter that cannot be raised is refused now.
                    if not counter_ok(pipe.get(counter)):
                        raise self._fail(f"repair refused: {counter} is not a counter "
                                         "(nothing was deleted)")
                    urls, delete_pages = plan()
                    kinds = self._forget_commands(scope, urls, delete_pages, host, pipe)
                    self.before_deleting()
                    self.roundtrips += 1
                    replies = pipe.execute()
                except redis.WatchError:
                    continue
                except redis.RedisError as exc:
                    raise self._fail("repair failed (nothing was deleted)", exc) from exc
            counts = dict.fromkeys(Removed._fields, 0)
            for kind, n in zip(kinds, replies, strict=True):
                if kind is not None:
                    counts[kind] += int(n)
            return Removed(**counts)
        raise self._fail("repair failed (nothing was deleted): the host's pages kept being "
                         "written by a crawl; run it again once no crawl holds the scope")

    def _forget_commands(self, scope: str, urls: Collection[str],
                         delete_pages: Callable[[Any], list[str | None]],
                         host: str | None, pipe: Any) -> list[str | None]:
        """:meth:`_forget`'s transaction, queued on *pipe*: what each reply
        counts (None: nothing), in the pipeline's order."""
        items = self._items_by_page(scope, urls, live=False)
        hist = [self._hist_key(scope, key) for key in items]
        pipe.multi()
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
        return kinds

    def forget_page(self, scope: str, url: str) -> Removed:
        if self.tagged:
            host, url_part = url_field(url)

            def plan() -> tuple[int, list[int], str]:
                n = self._bucket_counts(scope, [host])[host]
                return n, [bucket_of(url_part, n)], url_part

            return self._forget_in_slots(scope, {url}, host, plan, whole_host=False)
        return self._forget(scope, url_field(url)[0], lambda: ({url}, self._page_deletion(
            scope, url)))

    def _page_deletion(self, scope: str, url: str) -> Callable[[Any], list[str | None]]:
        """What deletes the page *url* (every variant), as stored now (one
        server: see :meth:`_forget`)."""
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
            pipe.eval(_GENERATION_LUA, 1, self._generation_key(scope, host))
            # The bucket's bound in the revisit index may now be low: a
            # lower bound still (the next summary sets it right).
            return [None, "pages", "pages", None, "links", None]

        return delete_pages

    def forget_host(self, scope: str, host: str) -> Removed:
        if self.tagged:

            def plan() -> tuple[int, list[int], str]:
                n = self._bucket_counts(scope, [host])[host]
                return n, list(range(n)), ""

            # (Its items: every item of a page of the host, found by their
            # records.)
            return self._forget_in_slots(scope, (), host, plan, whole_host=True)
        return self._forget(scope, host, lambda: self._host_deletion(scope, host), host)

    def _host_deletion(self, scope: str, host: str
                       ) -> tuple[set[str], Callable[[Any], list[str | None]]]:
        """The URLs of *host*'s pages and what deletes them, as stored now
        (one server: see :meth:`_forget`)."""
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
            pipe.eval(_GENERATION_LUA, 1, self._generation_key(scope, host))
            return [*kinds, None, None, None, None]

        return urls, delete_pages

    # -- the cluster layout: items by group, repairs a MULTI per slot ---------

    def _group_keys(self, kind: str, scope: str) -> list[str]:
        """Every item group's key of *kind* (``items``, ``itemver``,
        ``order``, ``bypage``) of *scope*."""
        part = _key_part(scope)
        return [f"{self.prefix}:{kind}:{{{part}#{g}}}" for g in range(ITEM_GROUPS)]

    def _item_fields(self, kind: str, scope: str, keys: list[bytes]) -> list[Any]:
        """The field of each item key in the hash *kind* (``items``,
        ``itemver``): one HMGET in layout 4, an HGET per item (in its
        group's key) in one pipeline on a cluster."""
        pipe = self._sync.pipeline(transaction=False)
        if self.tagged:
            for key in keys:
                pipe.hget(self._item_key(kind, scope, key.decode()), key)
            return self._sync_run(pipe)
        pipe.hmget(self._key(kind, scope), keys)
        [values] = self._sync_run(pipe)
        return list(values)

    def _iter_grouped_item_keys(self, scope: str) -> Iterator[list[bytes]]:
        """:meth:`_iter_item_keys` on a cluster: every group's export order
        merged (by first_seen, then key, as one sorted set orders them)."""
        def stream(order: str) -> Iterator[tuple[float, bytes]]:
            for start in range(0, 2**63, _HMGET_CHUNK):
                pipe = self._sync.pipeline(transaction=False)
                pipe.zrange(order, start, start + _HMGET_CHUNK - 1, withscores=True)
                [pairs] = self._sync_run(pipe)
                for member, score in pairs:
                    yield float(score), member
                if len(pairs) < _HMGET_CHUNK:
                    return

        chunk: list[bytes] = []
        for _, key in heapq.merge(*(stream(order) for order in
                                    self._group_keys("order", scope))):
            chunk.append(key)
            if len(chunk) == _HMGET_CHUNK:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def _latest(self, chunk: list[tuple[str, str, int]]) -> list[Any]:
        """:data:`_LATEST_LUA`'s reply for *chunk* (per item its version,
        entry and record): one script, or on a cluster one per item group
        (each group's keys are one slot), the replies put back in order."""
        groups: dict[str, list[int]] = {}
        for n, (name, item_key, _) in enumerate(chunk):
            # One server: the whole chunk in one script, whatever its scopes.
            groups.setdefault(self._item_key("items", name, item_key) if self.tagged else "",
                              []).append(n)
        out: list[Any] = [None] * (3 * len(chunk))
        for ns in groups.values():
            keys: list[str] = []
            for n in ns:
                name, item_key, _ = chunk[n]
                keys += [self._item_key("items", name, item_key),
                         self._item_key("itemver", name, item_key),
                         self._hist_key(name, item_key)]
            self.roundtrips += 1
            try:
                reply: Any = self._sync.eval(_LATEST_LUA, len(keys), *keys,
                                             *(chunk[n][1] for n in ns))
            except redis.RedisError as exc:
                raise self._fail("read failed", exc) from exc
            for at, n in enumerate(ns):
                out[3 * n:3 * n + 3] = reply[3 * at:3 * at + 3]
        return out

    def _multi_per_slot(self, commands: list[tuple[Any, ...]],
                        plain_if_full: bool = False, cut_short: str = "") -> list[Any]:
        """*commands* (each of one key, its second element; a script's,
        ``EVAL script 1 key``, its fourth) as one ``MULTI`` per hash slot
        (a cluster runs a transaction only in one slot); the replies in
        the order given. Not one transaction: each slot's part is applied
        whole, one after the other, the slots in the order *commands*
        first name them (a repair runs while no crawl holds the scope).
        *plain_if_full*: a slot whose node is above maxmemory (it
        refuses every command queued in a MULTI) gets its part as a plain
        pipeline (for commands Redis runs when full: reads, DEL, SREM).
        *cut_short*: what a failure after the first slot's part was
        applied is said to be (a repair or reset then to run again)."""
        by_slot: dict[int, list[int]] = {}
        for n, command in enumerate(commands):
            key = command[3] if command[0] == "EVAL" else command[1]
            by_slot.setdefault(key_slot(str(key).encode()), []).append(n)
        out: list[Any] = [None] * len(commands)
        for done, ns in enumerate(by_slot.values()):
            try:
                self.before_deleting()
            except RepairStopped as exc:
                raise RepairStopped(f"{exc} ({done} of {len(by_slot)} slots applied)",
                                    exc.removed) from None
            try:
                replies = self._slot_multi(commands, ns, plain_if_full)
            except StateStoreError as exc:
                if not (done and cut_short):
                    raise
                raise StateStoreError(f"{exc} ({cut_short}: {done} of {len(by_slot)} "
                                      "slots applied; run it again)") from exc
            for n, reply in zip(ns, replies, strict=True):
                out[n] = reply
        return out

    def _slot_multi(self, commands: list[tuple[Any, ...]], ns: list[int],
                    plain_if_full: bool) -> list[Any]:
        """One slot's part of :meth:`_multi_per_slot` (the commands *ns*)."""
        pipe = self._sync.pipeline(transaction=True)
        for n in ns:
            pipe.execute_command(*commands[n])
        try:
            return self._sync_run(pipe)
        except StateStoreError as exc:
            if not (plain_if_full and isinstance(
                    exc.__cause__, redis.exceptions.OutOfMemoryError)):
                raise
            pipe = self._sync.pipeline(transaction=False)
            for n in ns:
                pipe.execute_command(*commands[n])
            return self._sync_run(pipe)

    def _forget_in_slots(self, scope: str, urls: Collection[str], host: str,
                         plan: Callable[[], tuple[int, list[int], str]], *,
                         whole_host: bool) -> Removed:
        """:meth:`forget_page` / :meth:`forget_host` on a cluster: the
        host's part in one script (``cluster_forget.lua``: the pages, their
        links, the host's record or page count, and what they take out of
        the scope's sums, computed from the records as it deletes them),
        then the rest as one ``MULTI`` per slot (:meth:`_multi_per_slot`),
        *plan* gives
        the host's bucket count, the buckets to delete from and the page's
        URL part ('': every page of the host), read again when a crawl
        split the host's buckets meanwhile.

        The sums are the host group's (its scope shard's, layout 8), in the
        pages' slot: the script takes the pages deleted out of them as it
        deletes them, computed from the records, whatever a crawl wrote
        after the repair planned.

        The host's slot goes first, the items' groups after: a repair cut
        between them leaves items whose page is gone (the page is fetched
        as new and its items written again), never a page whose validators
        say "seen" with its items gone (a 304 would never store them
        again). Run again, it finds those items: a host's repair takes
        every item of a page of the host (its pages are gone by then)."""
        pages_of = self._item_pages(scope, urls, live=False, host=host if whole_host else None)
        items = sorted(pages_of)
        # (A host's run again after a cut: its items' pages, gone by then.)
        urls = {*urls, *pages_of.values()}
        pages, links = self._forget_host_slot(scope, host, uuid.uuid4().hex, plan)
        counts = dict.fromkeys(Removed._fields, 0)
        counts.update(pages=pages, links=links)
        commands: list[tuple[Any, ...]] = []
        kinds: list[str | None] = []

        def run(kind: str | None, *command: Any) -> None:
            commands.append(command)
            kinds.append(kind)

        if whole_host:
            # Not the host's place in its shard (listed, its buckets'
            # bounds in the revisit index): a crawl may have written a page
            # of the host since the host's script deleted them, and listed
            # it; taken out now, that page would never be due. A bound left
            # for an empty bucket is a lower bound still (a due read finds
            # nothing there; a summary that reads the buckets drops it).
            run("hosts", "HDEL", self._key("hosts", scope), host)
            run("rates", "HDEL", self._key("slots", scope), host)
            run(None, "ZREM", self._key("slotsat", scope), host)
        # (Otherwise the bucket's bound in the revisit index may now be
        # low: a lower bound still, which the next summary sets right.)
        for key in items:
            run("versions", "HLEN", self._hist_key(scope, key))
            run("items", "HDEL", self._item_key("items", scope, key), key)
            run(None, "HDEL", self._item_key("itemver", scope, key), key)
            run(None, "ZREM", self._item_key("order", scope, key), key)
            run(None, "DEL", self._hist_key(scope, key))
        for url in sorted(urls):
            # Every item listed under these pages is gone with them.
            run(None, "ZREMRANGEBYLEX", self._item_key("bypage", scope, url), *_page_range(url))
        try:
            replies = self._multi_per_slot(commands)
        except RepairStopped as exc:
            # (The deleted pages are out of the sums already.)
            raise RepairStopped(f"{exc}; its pages were deleted, not all of their items",
                                Removed(pages=pages, links=links)) from None
        except StateStoreError as exc:
            raise StateStoreError(f"{exc} (repair cut short: its pages were deleted, not "
                                  "all of the rest: run it again)") from exc
        for kind, n in zip(kinds, replies, strict=True):
            if kind is not None:
                counts[kind] += int(n)
        return Removed(**counts)

    def _forget_host_slot(self, scope: str, host: str, token: str,
                          plan: Callable[[], tuple[int, list[int], str]]) -> tuple[int, int]:
        """The host's part of a repair (``cluster_forget.lua``, under
        *token*), planned again while a crawl splits the host's buckets
        meanwhile: the pages and links deleted, taken out of the group's
        sums in the same script."""
        tag = f"{{{_key_part(scope)}|{host_group(host_part(host))}}}"
        for _ in range(_FORGET_ROUNDS):
            n, buckets, url_part = plan()
            keys = [self._host_key("hd", scope, host), self._host_key("ln", scope, host),
                    self._generation_key(scope, host), f"{self.prefix}:nvs:{tag}",
                    self._token_key(token, tag), f"{self.prefix}:nvm:{tag}",
                    *(f"{self.prefix}:nvf:{tag}:{k}" for k in range(FINE_KEYS)),
                    *(key for b in buckets for key in self._bucket_keys(scope, host, b))]
            args = [n, token, FINE_KEYS,
                    *(("page", url_part) if url_part else ("host",))]
            self.before_deleting()
            self.roundtrips += 1
            try:
                reply: Any = self._sync.eval(CLUSTER_FORGET_LUA, len(keys), *keys, *args)
            except redis.RedisError as exc:
                raise self._fail("repair failed (nothing was deleted)", exc) from exc
            if reply[0] != b"n":
                pages, links, lost = reply
                if int(lost):
                    logger.warning(
                        "State store %s: a stored sum of %s could not be taken from "
                        "(damaged): the group's sums are marked lost, and every summary "
                        "of the scope reads its pages", self.location, tag)
                return int(pages), int(links)
        raise self._fail("repair failed (nothing was deleted): the host's buckets kept "
                         "being split by a crawl; run it again")

    def _scope_keys(self, scope: str) -> tuple[list[str], list[str], list[str], list[str],
                                                list[str]]:
        """The scope's keys of this store's kinds (holds excepted): the
        scope's own, its hosts' buckets and links hashes, then its history
        keys; and the write generations a reset raises (the scope's, or
        its hosts': see memo.py). Only these kinds: other ``P:<name>:<s>``
        keys may be anybody's (a shared politeness budget is
        ``P:budget:<host>``, and a scope may be named after its host)."""
        kinds = [key for kind in _SCOPE_KINDS
                 if not (self.tagged and kind in _GROUP_KINDS)
                 for key in (self._shard_keys(kind, scope) if kind in _SHARD_KINDS
                             else [self._key(kind, scope)])]
        counts = self._bucket_counts(scope, self._scope_hosts(scope))
        buckets = [key for host, n in counts.items() for b in range(n)
                   for key in self._bucket_keys(scope, host, b)]
        links = [self._host_key("ln", scope, host) for host in counts]
        kinds += [self._host_key("hd", scope, host) for host in counts]
        generations = sorted({self._generation_key(scope, host) for host in counts}
                             if self.tagged else {self._generation_key(scope, "")})
        if self.tagged:
            # The items' keys of every group; the history and delivery keys
            # found on every node (tagged {<s>#<g>} and {<s>}).
            part = _glob(_key_part(scope))
            kinds += [key for kind in _GROUP_KINDS for key in self._group_keys(kind, scope)]
            hist = self._scan_keys(f"{_glob(self.prefix)}:hist:{{{part}#*}}:*")
            # The delivery marks, by item group (and in the scope's own
            # slot, where code before the groups' marks kept them).
            kinds += self._group_keys("undelc", scope)
            kinds += self._scan_keys(f"{_glob(self.prefix)}:undel:{{{part}#*}}:*")
            kinds += self._scan_keys(f"{_glob(self._key('undel', scope))}:*")
            kinds += self._fine_sums_keys(scope)
            # The buckets a summary is reading, per shard (host group).
            kinds += self._shard_keys("duer", scope)
            return kinds, buckets, links, hist, generations
        hist = self._scan_keys(f"{_glob(self.prefix)}:hist:{_glob(_key_part(scope))}:*")
        kinds += self._scan_keys(f"{_glob(self.prefix)}:undel:{_glob(_key_part(scope))}:*")
        kinds += self._fine_sums_keys(scope)
        return kinds, buckets, links, hist, generations

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

    def _count_commands(self, scope: str, buckets: list[str], links: list[str],
                        hist: list[str]) -> list[tuple[Any, ...]]:
        """:meth:`_count` as commands (the cluster's: the items of every group)."""
        items = (self._group_keys("items", scope) if self.tagged
                 else [self._key("items", scope)])
        return [*(("HLEN", key) for key in buckets + links), *(("HLEN", key) for key in items),
                *(("HLEN", key) for key in hist), ("HLEN", self._key("hosts", scope)),
                ("ZCARD", self._key("crawls", scope))]

    def _counted_groups(self, replies: list[int], buckets: list[str], links: list[str],
                        hist: list[str]) -> Removed:
        """:meth:`_counted` of :meth:`_count_commands`' replies."""
        groups = len(replies) - len(buckets) - len(links) - len(hist) - 2
        head = replies[:len(buckets) + len(links)]
        items = sum(replies[len(head):len(head) + groups])
        return self._counted([*head, items, *replies[len(head) + groups:]], buckets, links,
                             hist)

    def count_scope(self, scope: str) -> Removed:
        if self.tagged:
            _, buckets, links, hist, _ = self._scope_keys(scope)
            commands = self._count_commands(scope, buckets, links, hist)
            # Only reads: above maxmemory too (a slot's MULTI, which Redis
            # then refuses, sent as a plain pipeline).
            return self._counted_groups(self._multi_per_slot(commands, plain_if_full=True),
                                        buckets, links, hist)
        _, buckets, links, hist, _ = self._scope_keys(scope)
        pipe = self._sync.pipeline(transaction=True)
        self._count(scope, buckets, links, hist, pipe)
        return self._counted(self._sync_run(pipe), buckets, links, hist)

    def reset_scope(self, scope: str) -> Removed:
        if self.tagged:
            # Counted and deleted in one MULTI per slot (a key a DEL).
            kinds, buckets, links, hist, generations = self._scope_keys(scope)
            commands = self._count_commands(scope, buckets, links, hist)
            counted = len(commands)
            commands += [("DEL", key) for key in kinds + buckets + links + hist]
            commands.append(("SREM", f"{self.prefix}:scopes", scope))
            # Each host's write generation raised in its pages' MULTI, after
            # their deletion (a script allowed when full: a slot's MULTI
            # refused for memory goes as a plain pipeline, in this order).
            commands += [("EVAL", _GENERATION_LUA, 1, key) for key in generations]
            # Above maxmemory too: a reset is how memory is freed (its
            # reads and deletions Redis runs when full, not in a MULTI).
            # (The hosts' slots come first, named by the counts: a reset cut
            # short leaves items whose page is gone, never the reverse.)
            replies = self._multi_per_slot(commands, plain_if_full=True,
                                           cut_short="reset cut short")
            return self._counted_groups(replies[:counted], buckets, links, hist)
        kinds, buckets, links, hist, generations = self._scope_keys(scope)
        counted = len(buckets) + len(links) + 1 + len(hist) + 2
        doomed = kinds + buckets + links + hist

        def reset(transaction: bool) -> list[Any]:
            pipe = self._sync.pipeline(transaction=transaction)
            self._count(scope, buckets, links, hist, pipe)
            for start in range(0, len(doomed), _HMGET_CHUNK):
                pipe.delete(*doomed[start:start + _HMGET_CHUNK])
            pipe.srem(f"{self.prefix}:scopes", scope)
            # The scope's write generation raised after the deletions,
            # by a script allowed when full.
            pipe.eval(_GENERATION_LUA, len(generations), *generations)
            return self._sync_run(pipe)

        self.before_deleting()
        try:
            replies = reset(transaction=True)
        except StateStoreError as exc:
            # Above maxmemory Redis refuses a MULTI holding a script, even
            # one allowed when full; a reset is how memory is freed: its
            # commands then go as a plain pipeline, in the same order (the
            # raise right after the deletions, on the same connection).
            if not isinstance(exc.__cause__, redis.exceptions.OutOfMemoryError):
                raise
            replies = reset(transaction=False)
        return self._counted(replies[:counted], buckets, links, hist)
