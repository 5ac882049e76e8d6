"""A state store written as a user would write one: a test double.

:class:`MemoryStore` implements the crawl interface alone
(:class:`~incremental_crawler.state.stores.base.StateStore`: its abstract
methods, nothing else); :class:`MemoryAdminStore` adds the administration
interface (:class:`~incremental_crawler.state.stores.base.AdminStore`).
Registered for schemes of their own through ``INCREMENTAL_STATE_STORES``
(:data:`STORES`): ``memory:///path`` and ``memory-admin:///path``.

The state lives in memory; each flush (and each hold, written at once)
also writes it to the file the URI names, with pickle, and opening a URI
reads that file back: a second crawl, and a ``scrapy state`` in another
process, see what the first crawl stored. Nothing here is atomic or shared
safely between two processes writing at once: a test double, not a store.
"""

from __future__ import annotations

import pickle
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from incremental_crawler.state.records import (
    CrawlRecord,
    HostTrust,
    ItemRecord,
    PageFlags,
    PageKey,
    PageState,
    StoredVersion,
)
from incremental_crawler.state.stores.base import (
    AdminStore,
    DueAfter,
    HoldLapsed,
    Removed,
    ScopeHeld,
    StateStore,
    UrlRecord,
    checked_after,
    due_after,
    holds_conflict,
    host_of,
    item_history_setting,
    takes_over,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Self

    from scrapy.settings import BaseSettings

#: What a test puts in ``INCREMENTAL_STATE_STORES``.
STORES = {
    "memory": "tests.memory_store.MemoryStore",
    "memory-admin": "tests.memory_store.MemoryAdminStore",
}


def path_of(uri: str) -> Path:
    """``memory:///abs/path`` → ``/abs/path``."""
    return Path(uri.split(":", 1)[1].removeprefix("//"))


class _State:
    """Everything stored, pickled whole."""

    def __init__(self) -> None:
        self.pages: dict[PageKey, PageState] = {}
        self.links: dict[PageKey, str] = {}
        self.hosts: dict[tuple[str, str], HostTrust] = {}
        #: (scope, item key) → its versions, oldest first: (number, record).
        self.items: dict[tuple[str, str], list[tuple[int, ItemRecord]]] = defaultdict(list)
        self.crawls: dict[str, list[CrawlRecord]] = defaultdict(list)
        self.holds: dict[str, dict[str, float]] = defaultdict(dict)
        #: Each scope's hold epoch: its takes, a worker's beside live ones' excepted.
        self.hold_epochs: dict[str, int] = defaultdict(int)


class MemoryStore(StateStore):
    """The crawl interface, in memory, saved to a file at each flush."""

    def __init__(self, path: Path, history_limit: int = 10) -> None:
        self.path = path
        self.location = f"memory:///{path}"
        self.history_limit = history_limit
        self.state = pickle.loads(path.read_bytes()) if path.exists() else _State()
        self._ops: list[Callable[[], None]] = []
        #: The epoch of each hold this store took.
        self._hold_takes: dict[tuple[str, str], int] = {}
        self._staged_pages: dict[PageKey, PageState] = {}
        self._staged_links: dict[PageKey, str | None] = {}

    @classmethod
    def from_uri(cls, uri: str, *, settings: BaseSettings | None = None) -> Self:
        return cls(path_of(uri), history_limit=item_history_setting(settings))

    @classmethod
    def exists(cls, uri: str, *, settings: BaseSettings | None = None) -> bool:
        return path_of(uri).exists()

    @classmethod
    def where(cls, uri: str) -> str:
        return f"at {path_of(uri)}"

    def _save(self) -> None:
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_bytes(pickle.dumps(self.state))
        temporary.replace(self.path)

    # -- reads -----------------------------------------------------------------

    async def get_page(self, key: PageKey) -> PageState | None:
        state = self._staged_pages.get(key) or self.state.pages.get(key)
        return None if state is None else state.copy()

    async def get_links(self, key: PageKey) -> str | None:
        if key in self._staged_links:
            return self._staged_links[key]
        return self.state.links.get(key)

    async def get_due(self, scope: str, now: float, limit: int,
                      after: DueAfter | None = None) -> list[PageState]:
        after = checked_after(after)
        due = sorted((s for k, s in self.state.pages.items()
                      if k.scope == scope and s.callback is not None and s.next_visit <= now
                      and (after is None or due_after(s) > after)),
                     key=due_after)
        return [s.copy() for s in due[:limit]]

    def _latest(self, scope: str, item_key: str) -> ItemRecord | None:
        versions = self.state.items.get((scope, item_key))
        if not versions or not versions[-1][1].fingerprint:  # unknown, or a tombstone
            return None
        return versions[-1][1]

    async def get_item_simhash(self, scope: str, item_key: str) -> int | None:
        latest = self._latest(scope, item_key)
        return None if latest is None else latest.simhash

    async def get_item_fingerprint(self, scope: str, item_key: str) -> str | None:
        latest = self._latest(scope, item_key)
        return None if latest is None else latest.fingerprint

    async def get_item_data(self, scope: str, item_key: str) -> str | None:
        latest = self._latest(scope, item_key)
        return None if latest is None else latest.data

    async def get_page_items(self, scope: str, page_url: str) -> list[str]:
        return sorted(key for (s, key), versions in self.state.items.items()
                      if s == scope and versions and versions[-1][1].fingerprint
                      and (versions[-1][1].page or key) == page_url)

    async def get_host(self, scope: str, host: str) -> HostTrust | None:
        trust = self.state.hosts.get((scope, host))
        return None if trust is None else replace(trust)

    # -- staged writes -----------------------------------------------------------

    def stage_host(self, trust: HostTrust) -> None:
        trust = replace(trust)
        self._ops.append(lambda: self.state.hosts.__setitem__((trust.scope, trust.host), trust))

    def stage_page(self, state: PageState) -> None:
        state = state.copy()
        self._staged_pages[state.key] = state
        self._ops.append(lambda: self.state.pages.__setitem__(state.key, state.copy()))

    def _upsert(self, key: PageKey, when: float, change: Callable[[PageState], None]) -> None:
        def apply() -> None:
            stored = self.state.pages.get(key)
            if stored is None:
                stored = PageState(key, first_seen=int(when))
                self.state.pages[key] = stored
            stored.checks += 1
            stored.last_checked = int(when)
            change(stored)
        self._ops.append(apply)

    def stage_check(
        self, key: PageKey, status: int, when: float, *, lastmod: float | None = None,
        schedule: tuple[float, float] | None = None,
        validators: tuple[str | None, str | None] | None = None,
    ) -> None:
        def change(page: PageState) -> None:
            page.last_status, page.failures = status, 0
            if lastmod is not None:
                page.lastmod = int(lastmod)
            if schedule is not None:
                page.interval, page.next_visit = (int(n) for n in schedule)
            etag, last_modified = validators or (None, None)
            page.etag = etag or page.etag
            page.last_modified = last_modified or page.last_modified
        self._upsert(key, when, change)

    def stage_failure(
        self, key: PageKey, status: int, when: float, *, failures: int, next_visit: float,
        callback: str | None = None, recipe: str | None = None,
    ) -> None:
        def change(page: PageState) -> None:
            page.last_status, page.failures, page.next_visit = status, failures, int(next_visit)
            if page.callback is None:
                page.callback, page.recipe = callback, recipe
        self._upsert(key, when, change)

    def stage_redirect(self, key: PageKey, target: str, status: int, when: float) -> None:
        def change(page: PageState) -> None:
            page.last_status, page.redirect_to = status, target
            page.flags |= PageFlags.REDIRECTED
        self._upsert(key, when, change)

    def stage_item(self, record: ItemRecord) -> None:
        record = replace(record, stored_at=int(record.stored_at))

        def apply() -> None:
            versions = self.state.items[(record.scope, record.key)]
            versions.append((versions[-1][0] + 1 if versions else 1, record))
            if self.history_limit:
                del versions[:-self.history_limit]
        self._ops.append(apply)

    def stage_links(self, key: PageKey, data: str | None) -> None:
        self._staged_links[key] = data

        def apply() -> None:
            if data is None:
                self.state.links.pop(key, None)
            else:
                self.state.links[key] = data
        self._ops.append(apply)

    def _stage_change(self, key: PageKey, change: Callable[[PageState], None]) -> None:
        if key in self._staged_pages:
            change(self._staged_pages[key])

        def apply() -> None:
            if key in self.state.pages:
                change(self.state.pages[key])
        self._ops.append(apply)

    def stage_flags(self, key: PageKey, add: int) -> None:
        def change(page: PageState) -> None:
            page.flags |= add
        self._stage_change(key, change)

    def stage_postpone(self, key: PageKey, was: float, next_visit: float) -> None:
        def change(page: PageState) -> None:
            if page.next_visit == was:
                page.next_visit = next_visit
        self._stage_change(key, change)

    def stage_listing(self, key: PageKey, listing: str) -> None:
        def change(page: PageState) -> None:
            page.listing = listing
        self._stage_change(key, change)

    def stage_crawl(self, record: CrawlRecord) -> None:
        def apply() -> None:
            records = self.state.crawls[record.scope]
            records.append(replace(record))
            records.sort(key=lambda r: (r.started, r.finished))
            del records[:-self.crawl_history]
        self._ops.append(apply)

    @property
    def pending(self) -> int:
        return len(self._ops)

    async def flush(self) -> int:
        ops, self._ops = self._ops, []
        for op in ops:
            op()
        self._staged_pages.clear()
        self._staged_links.clear()
        if ops:
            self._save()
        return len(ops)

    # -- crawl records, holds, a scope's pages -------------------------------------

    def crawls(self, scope: str, limit: int) -> list[CrawlRecord]:
        records = sorted(self.state.crawls.get(scope, []),
                         key=lambda r: (r.started, r.finished), reverse=True)
        return [replace(r) for r in records[:limit]]

    async def hold_scope(self, scope: str, holder: str, ttl: float,
                         now: float | None = None) -> None:
        from incremental_crawler import clock

        now = clock.now() if now is None else now
        holds = self.state.holds[scope]
        others = sorted(((other, until) for other, until in holds.items()
                         if until > now and holds_conflict(holder, other)),
                        key=lambda hold: -hold[1])
        if others:
            raise ScopeHeld(f"scope {scope!r} is held by {others[0][0]}", *others[0])
        if holds.get(holder, now) <= now and (
                self._hold_takes.get((scope, holder)) != self.state.hold_epochs[scope]):
            # Lapsed, and taken by another since (else taken again).
            raise HoldLapsed(f"the hold of {holder} on scope {scope!r} lapsed")
        holds[holder] = now + ttl
        self._save()

    def take_scope(self, scope: str, holder: str, ttl: float,
                   now: float) -> tuple[str, float] | None:
        holds = self.state.holds[scope]
        others = sorted(((other, until) for other, until in holds.items()
                         if until > now and holds_conflict(holder, other)
                         and not takes_over(holder, other)),
                        key=lambda hold: -hold[1])
        if others:
            return others[0]
        self.state.holds[scope] = {other: until for other, until in holds.items()
                                   if until > now and not takes_over(holder, other)}
        if not any(other != holder for other in self.state.holds[scope]):
            self.state.hold_epochs[scope] += 1
        self.state.holds[scope][holder] = now + ttl
        self._hold_takes[(scope, holder)] = self.state.hold_epochs[scope]
        self._save()
        return None

    async def release_scope(self, scope: str, holder: str) -> None:
        self._hold_takes.pop((scope, holder), None)  # released: never taken again
        if self.state.holds[scope].pop(holder, None) is not None:
            self._save()

    def scope_holders(self, scope: str, now: float) -> dict[str, float]:
        return {h: until for h, until in sorted(self.state.holds.get(scope, {}).items())
                if until > now}

    def iter_pages(self, scope: str) -> Iterator[PageState]:
        return iter([s.copy() for k, s in self.state.pages.items() if k.scope == scope])


class MemoryAdminStore(MemoryStore, AdminStore):
    """:class:`MemoryStore` with the administration interface: its abstract
    methods, nothing else."""

    def scopes(self) -> list[str]:
        found = ({k.scope for k in self.state.pages} | {s for s, _ in self.state.items}
                 | {s for s, _ in self.state.hosts}
                 | {s for s, r in self.state.crawls.items() if r})
        return sorted(found)

    def iter_hosts(self, scope: str) -> Iterator[HostTrust]:
        return iter([replace(t) for (s, _), t in sorted(self.state.hosts.items()) if s == scope])

    def url_record(self, scope: str, url: str) -> UrlRecord:
        pages = sorted((s.copy() for k, s in self.state.pages.items()
                        if k.scope == scope and k.url == url), key=lambda s: s.key.variant)
        links = {k.variant: d for k, d in self.state.links.items()
                 if k.scope == scope and k.url == url}
        keys = [key for (s, key), versions in sorted(self.state.items.items())
                if s == scope and versions[-1][1].fingerprint
                and (versions[-1][1].page or key) == url]
        latest = [self._version(scope, key, *self.state.items[(scope, key)][-1]) for key in keys
                  if self.state.items[(scope, key)][-1][1].data is not None]
        return UrlRecord(scope, url, pages, links, keys, latest)

    @staticmethod
    def _version(scope: str, key: str, number: int, record: ItemRecord) -> StoredVersion:
        import json

        data: dict[str, Any] = json.loads(record.data) if record.data else {}
        return StoredVersion(scope, key, number, record.change, record.stored_at,
                             record.fingerprint, data)

    def iter_items(self, scope: str | None = None) -> Iterator[dict[str, object]]:
        for (s, key), versions in sorted(self.state.items.items(),
                                         key=lambda kv: (kv[0][0], kv[1][0][1].stored_at,
                                                         kv[0][1])):
            record = versions[-1][1]
            if (scope is None or s == scope) and record.fingerprint:
                item = self._version(s, key, *versions[-1]).data
                item.setdefault("url", record.url or key)
                item["fingerprint"] = record.fingerprint
                yield item

    def iter_versions(self, scope: str | None = None, *, since: float | None = None,
                      every_version: bool = False) -> Iterator[StoredVersion]:
        floor = float("-inf") if since is None else int(since)
        found = [self._version(s, key, number, record)
                 for (s, key), versions in self.state.items.items()
                 if scope is None or s == scope
                 for number, record in (versions if every_version else versions[-1:])
                 if record.data is not None and record.stored_at >= floor]
        yield from sorted(found, key=lambda v: (v.stored_at, v.scope, v.key, v.version))

    def item_history(self, scope: str, item_key: str) -> list[tuple[int, str]]:
        return [(n, r.fingerprint) for n, r in self.state.items.get((scope, item_key), [])]

    def _remove(self, scope: str, urls: set[str], hosts: set[str] = frozenset()) -> Removed:
        pages = [k for k in self.state.pages if k.scope == scope and k.url in urls]
        links = [k for k in self.state.links if k.scope == scope and k.url in urls]
        items = [(s, key) for (s, key), versions in self.state.items.items()
                 if s == scope and (versions[-1][1].page or key) in urls]
        trusts = [(scope, h) for h in hosts if (scope, h) in self.state.hosts]
        removed = Removed(len(pages), len(links), len(items),
                          sum(len(self.state.items[i]) for i in items), len(trusts))
        for table, keys in ((self.state.pages, pages), (self.state.links, links),
                            (self.state.items, items), (self.state.hosts, trusts)):
            for k in keys:
                del table[k]  # type: ignore[attr-defined]
        self._save()
        return removed

    def forget_page(self, scope: str, url: str) -> Removed:
        return self._remove(scope, {url})

    def forget_host(self, scope: str, host: str) -> Removed:
        urls = {k.url for k in self.state.pages if k.scope == scope and host_of(k.url) == host}
        return self._remove(scope, urls, {host})

    def count_scope(self, scope: str) -> Removed:
        items = [v for (s, _), v in self.state.items.items() if s == scope]
        return Removed(sum(k.scope == scope for k in self.state.pages),
                       sum(k.scope == scope for k in self.state.links), len(items),
                       sum(len(v) for v in items),
                       sum(s == scope for s, _ in self.state.hosts),
                       len(self.state.crawls.get(scope, [])))

    def reset_scope(self, scope: str) -> Removed:
        counts = self.count_scope(scope)
        self.state.pages = {k: s for k, s in self.state.pages.items() if k.scope != scope}
        self.state.links = {k: d for k, d in self.state.links.items() if k.scope != scope}
        for table in (self.state.items, self.state.hosts):
            for k in [k for k in table if k[0] == scope]:
                del table[k]  # type: ignore[attr-defined]
        self.state.crawls.pop(scope, None)
        self._save()
        return counts


__all__ = ["STORES", "MemoryAdminStore", "MemoryStore"]
