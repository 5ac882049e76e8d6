"""The embedded state store: one SQLite file in WAL mode.

Reads are primary-key lookups (nothing is loaded into memory up front);
writes are staged and committed in batches, one transaction per flush, so
the reactor thread spends a bounded, small time in SQLite per batch.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import shutil
import sqlite3
import tempfile
from contextlib import contextmanager
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from incremental_crawler import clock
from incremental_crawler.config import DEFAULT_SETTINGS
from incremental_crawler.state.records import (
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
    DueAfter,
    HoldLapsed,
    PagesSummary,
    Removed,
    ScopeHeld,
    SlotRates,
    StateStoreError,
    StoredItem,
    UrlRecord,
    checked_after,
    crawl_history_setting,
    describe_holder,
    holds_conflict,
    host_of,
    is_crawl_hold,
    item_history_setting,
    takes_over,
)

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Iterator
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = ["SQLiteStateStore"]

logger = logging.getLogger(__name__)

#: Seconds of next visits summed together in ``page_sums`` (schema 17): a
#: summary reads the pages of at most two slots, its ends, one by one.
_SUM_SLOT = 600


def _slot_sql(column: str) -> str:
    """The ``page_sums`` slot of the next visit *column*: floor division."""
    return (f"(CASE WHEN {column} >= 0 THEN {column} / {_SUM_SLOT} "
            f"ELSE ({column} + 1) / {_SUM_SLOT} - 1 END)")


#: Each entry migrates the schema from version ``i`` to ``i + 1``.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE pages (
        scope TEXT NOT NULL,
        url TEXT NOT NULL,
        variant TEXT NOT NULL DEFAULT '',
        etag TEXT,
        last_modified TEXT,
        fingerprint TEXT,
        size INTEGER NOT NULL DEFAULT 0,
        last_status INTEGER,
        first_seen INTEGER NOT NULL DEFAULT 0,
        last_checked INTEGER NOT NULL DEFAULT 0,
        last_fetched INTEGER NOT NULL DEFAULT 0,
        last_changed INTEGER NOT NULL DEFAULT 0,
        checks INTEGER NOT NULL DEFAULT 0,
        changes INTEGER NOT NULL DEFAULT 0,
        flags INTEGER NOT NULL DEFAULT 0,
        redirect_to TEXT,
        PRIMARY KEY (scope, url, variant)
    ) WITHOUT ROWID;
    CREATE TABLE items (
        scope TEXT NOT NULL,
        item_key TEXT NOT NULL,
        url TEXT,
        fingerprint TEXT NOT NULL,
        first_seen INTEGER NOT NULL,
        last_changed INTEGER NOT NULL,
        version INTEGER NOT NULL DEFAULT 1,
        PRIMARY KEY (scope, item_key)
    ) WITHOUT ROWID;
    CREATE TABLE item_versions (
        scope TEXT NOT NULL,
        item_key TEXT NOT NULL,
        version INTEGER NOT NULL,
        fingerprint TEXT NOT NULL,
        data TEXT NOT NULL,
        stored_at INTEGER NOT NULL,
        PRIMARY KEY (scope, item_key, version)
    ) WITHOUT ROWID;
    """,
    # 2: the sitemap/feed lastmod of the stored version of a page.
    """
    ALTER TABLE pages ADD COLUMN lastmod INTEGER;
    """,
    # 3: adaptive revisits, and the callback that re-seeds a page.
    """
    ALTER TABLE pages ADD COLUMN interval INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE pages ADD COLUMN next_visit INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE pages ADD COLUMN callback TEXT;
    """,
    # 4: per-host trust in sitemap lastmods.
    """
    CREATE TABLE hosts (
        scope TEXT NOT NULL,
        host TEXT NOT NULL,
        lastmod_checks INTEGER NOT NULL DEFAULT 0,
        lastmod_lies INTEGER NOT NULL DEFAULT 0,
        distrusted_until INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (scope, host)
    ) WITHOUT ROWID;
    """,
    # 5: per-host trust in validators (304s).
    """
    ALTER TABLE hosts ADD COLUMN validators_distrusted_until INTEGER NOT NULL DEFAULT 0;
    """,
    # 6: SimHash of an item's main text (near-duplicate mode).
    """
    ALTER TABLE items ADD COLUMN simhash INTEGER;
    """,
    # 7: unstable validators (per page and per host), re-trust on evidence.
    """
    ALTER TABLE pages ADD COLUMN churns INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE hosts ADD COLUMN validators_consistent INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE hosts ADD COLUMN validators_unstable_since INTEGER NOT NULL DEFAULT 0;
    """,
    # 8: replay on 304 and re-seeding: each page's links record (the requests
    # its callback yielded) and how to request the page again. A table of its
    # own, so that page reads never load links (up to a thousand requests
    # each). Not WITHOUT ROWID, unlike the others: SQLite advises that only
    # for rows much smaller than a database page, and records this large are
    # read about five times faster from a rowid table and its key index.
    """
    CREATE TABLE links (
        scope TEXT NOT NULL,
        url TEXT NOT NULL,
        variant TEXT NOT NULL DEFAULT '',
        data TEXT NOT NULL,
        PRIMARY KEY (scope, url, variant)
    );
    ALTER TABLE pages ADD COLUMN recipe TEXT;
    """,
    # 9: failures in a row (the failure schedule); failed pages are stored
    # without a fingerprint when they were never fetched.
    """
    ALTER TABLE pages ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
    """,
    # 10: pages found changed behind a sitemap lastmod that did not move.
    """
    ALTER TABLE hosts ADD COLUMN stale_lastmods INTEGER NOT NULL DEFAULT 0;
    """,
    # 11: the change feed. Each item remembers the page it came from (NULL
    # when that page's URL is its key, the usual case, which costs nothing),
    # so a gone page finds its items; each version what it was (NULL in
    # versions stored before: new for version 1, else changed).
    """
    ALTER TABLE items ADD COLUMN page TEXT;
    ALTER TABLE item_versions ADD COLUMN change TEXT;
    CREATE INDEX items_by_page ON items (scope, page) WHERE page IS NOT NULL;
    """,
    # 12: a summary of each finished crawl (kept per scope, bounded), and
    # the crawls holding a scope now (repairs wait for them). Times as REAL:
    # a crawl's duration matters below the second. A rowid table: records
    # of one scope and start differ by worker, and nothing else is unique.
    """
    CREATE TABLE crawls (
        scope TEXT NOT NULL,
        started REAL NOT NULL,
        finished REAL NOT NULL,
        worker TEXT NOT NULL DEFAULT '',
        reason TEXT NOT NULL DEFAULT '',
        figures TEXT NOT NULL
    );
    CREATE INDEX crawls_by_scope ON crawls (scope, started, finished);
    CREATE TABLE holds (
        scope TEXT NOT NULL,
        holder TEXT NOT NULL,
        expires REAL NOT NULL,
        PRIMARY KEY (scope, holder)
    ) WITHOUT ROWID;
    """,
    # 13: when each item's current live run began (its latest new version)
    # and when its latest tombstone was stored, so that a change feed from
    # a time tells an item that was not live then (new to its reader) from
    # one that was. NULL in items stored before: unknown.
    """
    ALTER TABLE items ADD COLUMN born INTEGER;
    ALTER TABLE items ADD COLUMN died INTEGER;
    """,
    # 14: what each download slot's politeness window learned by the end of
    # the scope's last crawl (the next one starts from it); the slots saved
    # most recently kept. Values unchecked by SQLite: a reader checks them.
    """
    CREATE TABLE slot_rates (
        scope TEXT NOT NULL,
        slot TEXT NOT NULL,
        rate REAL NOT NULL,
        slow_start INTEGER NOT NULL,
        saved_at REAL NOT NULL,
        ended TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (scope, slot)
    ) WITHOUT ROWID;
    """,
    # 15: at-least-once delivery. Each version names the crawl that stored
    # it until that crawl's feeds closed cleanly (NULL: delivered, and every
    # version stored before); the index holds only those waiting.
    """
    ALTER TABLE item_versions ADD COLUMN crawl TEXT;
    CREATE INDEX versions_undelivered ON item_versions (scope, crawl, stored_at)
        WHERE crawl IS NOT NULL;
    """,
    # 16: the membership digest of a list (a sitemap's or feed's own, at its
    # last full read; a page's, of the list that gave its date). NULL in
    # pages stored before: not on record (such a list is read in full once,
    # and such a page's date does not vouch for it when re-seeded).
    """
    ALTER TABLE pages ADD COLUMN listing TEXT;
    """,
    # 17: a crawl start costs what is due, not the scope's size. The pages
    # that can be requested again by next visit (the due pages, read in
    # their order, after the last one read); the sums of those pages per
    # callback and slot of next visits (_SUM_SLOT seconds), kept by
    # triggers at every write, built here once from the pages there are;
    # and per scope the pages checked since its last crawl started (its
    # mark), which the sums count and a summary of the pages not checked
    # this crawl takes out again, and the latest last check ever written.
    f"""
    CREATE INDEX pages_by_next_visit ON pages (scope, next_visit, url, variant)
        WHERE callback IS NOT NULL;
    CREATE TABLE check_marks (
        scope TEXT PRIMARY KEY,
        mark INTEGER,
        latest INTEGER
    ) WITHOUT ROWID;
    CREATE TABLE page_checks (
        scope TEXT NOT NULL,
        url TEXT NOT NULL,
        variant TEXT NOT NULL,
        PRIMARY KEY (scope, url, variant)
    ) WITHOUT ROWID;
    INSERT INTO check_marks (scope, latest)
    SELECT scope, MAX(last_checked) FROM pages GROUP BY scope;
    CREATE TABLE page_sums (
        scope TEXT NOT NULL,
        callback TEXT NOT NULL,
        slot INTEGER NOT NULL,
        pages INTEGER NOT NULL,
        size INTEGER NOT NULL,
        PRIMARY KEY (scope, callback, slot)
    ) WITHOUT ROWID;
    CREATE TRIGGER page_sums_insert AFTER INSERT ON pages
    WHEN NEW.callback IS NOT NULL BEGIN
        INSERT INTO page_sums (scope, callback, slot, pages, size)
        VALUES (NEW.scope, NEW.callback, {_slot_sql("NEW.next_visit")}, 1, NEW.size)
        ON CONFLICT (scope, callback, slot) DO UPDATE SET
            pages = pages + 1, size = size + excluded.size;
    END;
    CREATE TRIGGER page_sums_delete AFTER DELETE ON pages
    WHEN OLD.callback IS NOT NULL BEGIN
        UPDATE page_sums SET pages = pages - 1, size = size - OLD.size
        WHERE scope = OLD.scope AND callback = OLD.callback
            AND slot = {_slot_sql("OLD.next_visit")};
    END;
    CREATE TRIGGER page_sums_update AFTER UPDATE OF scope, callback, next_visit, size ON pages
    WHEN (OLD.callback IS NOT NULL OR NEW.callback IS NOT NULL) AND NOT (
        OLD.scope = NEW.scope AND OLD.callback IS NEW.callback AND OLD.size = NEW.size
        AND {_slot_sql("OLD.next_visit")} = {_slot_sql("NEW.next_visit")}) BEGIN
        UPDATE page_sums SET pages = pages - 1, size = size - OLD.size
        WHERE OLD.callback IS NOT NULL AND scope = OLD.scope AND callback = OLD.callback
            AND slot = {_slot_sql("OLD.next_visit")};
        INSERT INTO page_sums (scope, callback, slot, pages, size)
        SELECT NEW.scope, NEW.callback, {_slot_sql("NEW.next_visit")}, 1, NEW.size
        WHERE NEW.callback IS NOT NULL
        ON CONFLICT (scope, callback, slot) DO UPDATE SET
            pages = pages + 1, size = size + excluded.size;
    END;
    INSERT INTO page_sums (scope, callback, slot, pages, size)
    SELECT scope, callback, {_slot_sql("next_visit")}, COUNT(*), SUM(size) FROM pages
    WHERE callback IS NOT NULL GROUP BY 1, 2, 3;
    """,  # noqa: S608 (constant SQL)
    # 18: the stored-graph walk's memo. Each scope's write generation,
    # moved once by every transaction that writes or deletes a page state
    # or links record of the scope (a flush, a repair: one statement each,
    # not a trigger per row, which cost a tenth of the page write rate at
    # 1 M pages), never deleted, so it never comes back to an earlier
    # value; and the memos, taken while it stays the same.
    """
    CREATE TABLE write_generations (
        scope TEXT PRIMARY KEY,
        generation INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE walk_memos (
        scope TEXT NOT NULL,
        name TEXT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (scope, name)
    ) WITHOUT ROWID;
    """,
    # 19: each scope's hold epoch: its takes counted (a worker's beside
    # live workers' excepted), so that a lapsed hold is taken again only
    # when nobody took the scope since.
    """
    CREATE TABLE hold_epochs (
        scope TEXT PRIMARY KEY,
        epoch INTEGER NOT NULL
    ) WITHOUT ROWID;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
#: The connection's page cache, in KiB (SQLite's default is 2,000). A page
#: write updates the pages table and the index on next visits at places
#: that are random in both: past ~100,000 pages the default cache holds
#: neither's inner pages, and each write reads them again from the OS
#: (bench/capacity.py at 1 M pages: 8,500 page writes/s with the default,
#: 10,000-11,800 with this). Memory is taken as pages are read, so a small
#: store costs no more.
_CACHE_KIB = 65_536
#: URLs per batched lookup (SQLite allows 32,766 host parameters).
_CHUNK = 500

_PAGE_COLUMNS = (
    "etag, last_modified, fingerprint, size, last_status, first_seen, "
    "last_checked, last_fetched, last_changed, checks, changes, flags, redirect_to, "
    "lastmod, interval, next_visit, callback, churns, recipe, failures, listing"
)
# S608 (SQL built from strings) in this module: what is formatted into the
# SQL is a constant of the module (_PAGE_COLUMNS, PageFlags, a count of ?),
# every value is a ? parameter.
_SELECT_PAGE = (
    f"SELECT {_PAGE_COLUMNS} FROM pages WHERE scope = ? AND url = ? AND variant = ?"  # noqa: S608 (constant SQL)
)
# An upsert, not INSERT OR REPLACE: the row a REPLACE deletes fires no
# trigger, and page_sums would count the page twice.
_UPSERT_PAGE = (
    f"INSERT INTO pages (scope, url, variant, {_PAGE_COLUMNS}) "  # noqa: S608 (constant SQL)
    f"VALUES ({', '.join('?' * 24)}) ON CONFLICT (scope, url, variant) DO UPDATE SET "
    + ", ".join(f"{column} = excluded.{column}" for column in _PAGE_COLUMNS.split(", "))
)
# A check never touches validators or fingerprints (only a 2xx updates them). It may
# record a newer lastmod (a 304 says the stored data is that version) and
# the revisit schedule; an answer ends a run of failures.
_UPSERT_CHECK = (
    "INSERT INTO pages (scope, url, variant, last_status, first_seen, "
    "last_checked, checks, lastmod, interval, next_visit, etag, last_modified) "
    "VALUES (?, ?, ?, ?, ?, ?, 1, ?, COALESCE(?, 0), COALESCE(?, 0), ?, ?) "
    "ON CONFLICT (scope, url, variant) DO UPDATE SET "
    "last_status = excluded.last_status, last_checked = excluded.last_checked, "
    "checks = pages.checks + 1, lastmod = COALESCE(excluded.lastmod, pages.lastmod), "
    "interval = COALESCE(?, pages.interval), next_visit = COALESCE(?, pages.next_visit), "
    "etag = COALESCE(excluded.etag, pages.etag), "
    "last_modified = COALESCE(excluded.last_modified, pages.last_modified), "
    "failures = 0"
)
# A failure keeps everything a 2xx stored (validators, fingerprint, size,
# lastmod, interval); a page never fetched gets a row without fingerprint,
# with the callback and recipe that re-seed it.
_UPSERT_FAILURE = (
    "INSERT INTO pages (scope, url, variant, last_status, first_seen, "
    "last_checked, checks, failures, next_visit, callback, recipe) "
    "VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?) "
    "ON CONFLICT (scope, url, variant) DO UPDATE SET "
    "last_status = excluded.last_status, last_checked = excluded.last_checked, "
    "checks = pages.checks + 1, failures = excluded.failures, "
    "next_visit = excluded.next_visit, callback = COALESCE(pages.callback, excluded.callback), "
    "recipe = CASE WHEN pages.callback IS NULL THEN excluded.recipe ELSE pages.recipe END"
)
_UPSERT_REDIRECT = (
    "INSERT INTO pages (scope, url, variant, last_status, first_seen, "  # noqa: S608 (constant SQL)
    f"last_checked, checks, flags, redirect_to) VALUES (?, ?, ?, ?, ?, ?, 1, "
    f"{PageFlags.REDIRECTED}, ?) "
    "ON CONFLICT (scope, url, variant) DO UPDATE SET "
    "last_status = excluded.last_status, last_checked = excluded.last_checked, "
    f"checks = pages.checks + 1, flags = pages.flags | {PageFlags.REDIRECTED}, "
    "redirect_to = excluded.redirect_to"
)
# `items` holds the latest fingerprint and version number of each item;
# the data of every version (the latest included) lives in `item_versions`
# only, so it is written once.
# Only the flags of a stored page; no row for an unknown one.
_OR_FLAGS = "UPDATE pages SET flags = flags | ? WHERE scope = ? AND url = ? AND variant = ?"
# Only the listing of a stored page; no row for an unknown one.
_SET_LISTING = "UPDATE pages SET listing = ? WHERE scope = ? AND url = ? AND variant = ?"
# Only the next visit of a stored page, if it is still the one read.
_POSTPONE = ("UPDATE pages SET next_visit = ? WHERE scope = ? AND url = ? AND variant = ? "
             "AND next_visit = ?")
#: Run by every transaction that writes a page state or links record of the
#: scope (see StateStore.write_generation).
_NEW_GENERATION = ("INSERT INTO write_generations (scope, generation) VALUES (?, 1) "
                   "ON CONFLICT (scope) DO UPDATE SET generation = generation + 1")
_UPSERT_LINKS = "INSERT OR REPLACE INTO links (scope, url, variant, data) VALUES (?, ?, ?, ?)"
_DELETE_LINKS = "DELETE FROM links WHERE scope = ? AND url = ? AND variant = ?"
# A tombstone is a version with an empty fingerprint. `born` (given for a
# live version, NULL for a tombstone) is kept while the item stays live, and
# taken when it comes back; `died` (given for a tombstone) is kept until the
# next tombstone.
_UPSERT_ITEM = (
    "INSERT INTO items (scope, item_key, url, fingerprint, first_seen, "
    "last_changed, version, simhash, page, born, died) "
    "VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?) "
    "ON CONFLICT (scope, item_key) DO UPDATE SET url = excluded.url, "
    "fingerprint = excluded.fingerprint, simhash = excluded.simhash, "
    "last_changed = excluded.last_changed, version = items.version + 1, "
    "page = excluded.page, "
    "born = CASE WHEN items.fingerprint = '' THEN excluded.born "
    "WHEN excluded.fingerprint = '' THEN NULL ELSE items.born END, "
    "died = COALESCE(excluded.died, items.died)"
)
_ADD_ITEM_VERSION = (
    "INSERT OR REPLACE INTO item_versions "
    "(scope, item_key, version, fingerprint, data, stored_at, change, crawl) "
    "SELECT scope, item_key, version, fingerprint, ?, last_changed, ?, ? FROM items "
    "WHERE scope = ? AND item_key = ?"
)
# Delivery marks (see StateStore.stage_delivered): by the partial index.
_DELIVERED = "UPDATE item_versions SET crawl = NULL WHERE scope = ? AND crawl = ?"
_REDELIVERED = ("UPDATE item_versions SET crawl = ? WHERE scope = ? AND item_key = ? "
                "AND version = ? AND crawl = ?")
# The versions beyond the history kept, by primary key: a range delete.
_PRUNE_VERSIONS = (
    "DELETE FROM item_versions WHERE scope = ? AND item_key = ? AND version <= "
    "(SELECT version FROM items WHERE scope = ? AND item_key = ?) - ?"
)
# The items of a scope by key, a chunk at a time (iter_item_states).
_ITEM_STATES = ("SELECT item_key, url, page, fingerprint, simhash, version, first_seen, "
                "last_changed, born, died FROM items WHERE scope = ? ")
_ITEM_STATES_FIRST = _ITEM_STATES + "ORDER BY item_key LIMIT ?"
_ITEM_STATES_AFTER = _ITEM_STATES + "AND item_key > ? ORDER BY item_key LIMIT ?"
_ADD_CRAWL = (
    "INSERT INTO crawls (scope, started, finished, worker, reason, figures) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
# The newest N of the scope stay (by start, finish, then insertion).
_PRUNE_CRAWLS = (
    "DELETE FROM crawls WHERE scope = ? AND rowid NOT IN (SELECT rowid FROM crawls "
    "WHERE scope = ? ORDER BY started DESC, finished DESC, rowid DESC LIMIT ?)"
)
_UPSERT_SLOT_RATE = (
    "INSERT OR REPLACE INTO slot_rates (scope, slot, rate, slow_start, saved_at, ended) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
# The slot_rates_kept saved most recently stay (ties: the first by name goes,
# as in the Redis store).
_PRUNE_SLOT_RATES = (
    "DELETE FROM slot_rates WHERE scope = ? AND slot NOT IN (SELECT slot FROM slot_rates "
    "WHERE scope = ? ORDER BY saved_at DESC, slot DESC LIMIT ?)"
)
#: Every table with a scope column that a reset empties (holds excepted:
#: they lapse by themselves; and hold epochs, which never go back: a crawl's
#: lapsed hold must not match a count started again), with what
#: :class:`Removed` calls its rows.
_SCOPE_TABLES = (("pages", "pages"), ("links", "links"), ("items", "items"),
                 ("item_versions", "versions"), ("hosts", "hosts"), ("crawls", "crawls"))
# Versions stored before schema 11 have no change type.
_CHANGE = "COALESCE(v.change, CASE WHEN v.version = 1 THEN 'new' ELSE 'changed' END)"


def _clamp(value: float, *, up: bool = False) -> int:
    """A time as whole seconds compare with it (*up*: rounded up, else
    down), infinities as 2**62 (beyond any stored)."""
    value = max(min(value, 2**62), -(2**62))
    return math.ceil(value) if up else math.floor(value)


def _statements(script: str) -> Iterator[str]:
    """The statements of *script* one by one (a trigger's body holds ``;``)."""
    pending = ""
    for part in script.split(";"):
        pending += part + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                yield pending
            pending = ""
    if pending.strip(" \n;"):
        raise ValueError(f"incomplete SQL statement in a migration: {pending!r}")


def _rollback(db: sqlite3.Connection) -> None:
    """Roll back the transaction under way, if SQLite has not already.

    After some errors (SQLITE_FULL, SQLITE_IOERR, SQLITE_NOMEM) SQLite rolls
    the transaction back itself; a ROLLBACK then fails with "cannot rollback
    - no transaction is active", which would replace the error that says
    what happened (the disk is full) with one that says nothing.
    """
    if db.in_transaction:
        db.execute("ROLLBACK")


@contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction: ``BEGIN IMMEDIATE`` (the write lock taken up
    front, so another process's writer waits for this one rather than
    failing half-way), committed when the block ends, rolled back when it
    raises."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        _rollback(db)
        raise


def _damaged(exc: sqlite3.Error) -> bool:
    """Whether SQLite found the file damaged or not a database at all."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return True
    message = str(exc)
    return "not a database" in message or "malformed" in message


def path_from_uri(uri: str) -> Path:
    """``sqlite:///rel/path.db`` → ``rel/path.db``; ``sqlite:////abs.db`` → ``/abs.db``.

    The same convention as SQLAlchemy's URLs.
    """
    prefix = "sqlite:///"
    if not uri.lower().startswith(prefix) or len(uri) == len(prefix):
        raise StateStoreError(
            f"INCREMENTAL_STATE_URI {uri!r} is not a SQLite URI: use "
            "sqlite:///relative/path.db or sqlite:////absolute/path.db"
        )
    return Path(uri[len(prefix):])


class SQLiteStateStore(AdminStore):
    """State in one SQLite file; see the module docstring."""

    def __init__(self, path: str | Path, *, busy_timeout: float = 5.0,
                 history_limit: int = DEFAULT_SETTINGS["INCREMENTAL_ITEM_HISTORY"]) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        self._busy_timeout = busy_timeout
        self.history_limit = history_limit
        # Staged writes, as (statement, parameters) in staging order: a
        # flush applies them in that order, so a later write always wins.
        self._ops: list[tuple[str, tuple[object, ...]]] = []
        #: The epoch and ttl of each hold this store took (see take_scope).
        self._hold_takes: dict[tuple[str, str], tuple[int, float]] = {}
        # Latest staged page states, links records (None: a staged
        # deletion) and item fingerprints, for reads.
        self._pages: dict[PageKey, PageState] = {}
        self._links: dict[PageKey, str | None] = {}
        #: Scopes whose pages or links the staged writes touch: the flush
        #: moves their write generations.
        self._page_scopes: set[str] = set()
        self._item_fps: dict[tuple[str, str], str] = {}
        # Per scope, the last check each staged write gives a page.
        self._checks: dict[str, dict[tuple[str, str], int]] = {}
        #: Staged writes (one per stage_* call; an item takes two statements).
        self._staged = 0
        self._db = self._connect()

    @classmethod
    def exists(cls, uri: str, *, settings: BaseSettings | None = None) -> bool:
        """Whether the file *uri* names exists (opening it would create it)."""
        return path_from_uri(uri).exists()

    @classmethod
    def where(cls, uri: str) -> str:
        return f"at {path_from_uri(uri)}"

    @classmethod
    def from_uri(cls, uri: str, *, settings: BaseSettings | None = None) -> Self:
        name = "INCREMENTAL_SQLITE_BUSY_TIMEOUT"
        busy_timeout = DEFAULT_SETTINGS[name]
        if settings is not None and settings.get(name) is not None:
            busy_timeout = settings.getfloat(name)
        store = cls(path_from_uri(uri), busy_timeout=busy_timeout,
                    history_limit=item_history_setting(settings))
        store.crawl_history = crawl_history_setting(settings)
        return store

    # -- opening -----------------------------------------------------------

    def _fail(self, what: str, exc: BaseException | None = None) -> StateStoreError:
        detail = f": {exc}" if exc else ""
        return StateStoreError(f"State store {self.location}: {what}{detail}")

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise self._fail(
                f"cannot be created: {exc.filename or self.path.parent} is not a "
                "directory; point INCREMENTAL_STATE_URI at a file in a directory"
            ) from exc
        except OSError as exc:
            if isinstance(exc, PermissionError) or exc.errno == errno.EROFS:
                raise self._fail(
                    f"cannot be created: its directory {exc.filename or self.path.parent} "
                    f"cannot be created ({(exc.strerror or str(exc)).lower()}); point "
                    "INCREMENTAL_STATE_URI at a writable place"
                ) from exc
            raise self._fail("cannot create its directory", exc) from exc
        try:
            db = sqlite3.connect(
                self.path, timeout=self._busy_timeout, isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise self._unwritable_error(exc) or self._fail(
                "cannot be opened (check the path and permissions)", exc) from exc
        try:
            # Refuse a file that is not ours before changing anything in it
            # (switching a foreign database to WAL would alter its header).
            self._check_schema(db)
            # WAL lets readers (e.g. `scrapy items`) run beside a crawl;
            # synchronous=NORMAL is durable across process crashes in WAL
            # mode, which is what kill -9 safety needs.
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                logger.warning(
                    "State store %(path)s could not switch to WAL (mode %(mode)s)",
                    {"path": self.location, "mode": mode},
                )
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
            self._migrate(db)
        except sqlite3.DatabaseError as exc:
            db.close()
            message = str(exc)
            if "locked" in message or "busy" in message:
                raise self._fail(
                    "is locked by another process (another crawl using the same "
                    "store?); wait for it to finish or set INCREMENTAL_STATE_URI "
                    "to another file",
                    exc,
                ) from exc
            # What SQLite says decides first: a file it finds damaged or not
            # a database is that, wherever it lies. Only then may a place
            # that cannot be written explain the failure, and the store is
            # called intact only once a read-only look at it found it so:
            # the advice for a corrupt file (move it away) would throw good
            # state away, and "intact" about a broken file would hide it.
            if not _damaged(exc) and (unwritable := self._unwritable_error(exc)) is not None:
                raise unwritable from exc
            why = self._unwritable()
            raise self._fail(
                "is not a readable SQLite database (corrupt or not a state "
                f"store{'' if why is None else '; besides, ' + why}); restore it "
                "from a backup or move it away to start afresh deliberately",
                exc,
            ) from exc
        except BaseException:
            db.close()
            raise
        return db

    def _unwritable(self) -> str | None:
        """Why the file system lets no one write the store here; ``None``: it does."""
        directory = self.path.parent
        try:
            if os.statvfs(directory).f_flag & os.ST_RDONLY:
                return f"it is on a read-only file system ({directory})"
        except OSError:
            pass
        if self.path.exists() and not os.access(self.path, os.W_OK):
            return "the file is read-only (permission denied)"
        if not os.access(directory, os.W_OK | os.X_OK):
            # Even an existing store needs it: SQLite creates its -wal and
            # -shm files beside the database.
            return (f"its directory {directory} is read-only (permission denied: SQLite "
                    "creates its -wal and -shm files there)")
        return None

    def _unwritable_error(self, exc: sqlite3.Error) -> StateStoreError | None:
        """The error for a store SQLite could not open for writing, if that is why.

        ``None`` when the place is writable, and when the file, read without
        writing, is not a sound store either (then it is reported as corrupt).
        A store whose last commits are still in its -wal file (a crawl killed
        before a checkpoint, a copy that kept both files) is only sound with
        it: the advice names both files, since copying the store file alone
        loses those commits (all of a new store's schema, even).
        """
        why = self._unwritable()
        if why is None:
            return None
        if not self.path.exists():
            return self._fail(
                f"cannot be created: {why} (SQLite: {exc}); point INCREMENTAL_STATE_URI "
                "at a writable place")
        wal = Path(f"{self.path}-wal")
        try:
            has_wal = wal.stat().st_size > 0
        except FileNotFoundError:
            has_wal = False
        except OSError:
            has_wal = True  # there, but unreadable: the check below says so
        intact = self._intact(wal if has_wal else None)
        if intact is False:
            return None
        if not has_wal:
            return self._fail(
                f"cannot be written: {why} (SQLite: {exc}). The store is intact and was not "
                "changed: make it writable, or copy it to a writable place and point "
                "INCREMENTAL_STATE_URI at the copy")
        state = ("The store is intact and was not changed" if intact else
                 "The store was not changed, but could not be checked here")
        return self._fail(
            f"cannot be written: {why} (SQLite: {exc}). {state}; its last commits are in "
            f"{wal.name}: make it writable, or copy {self.path.name} together with "
            f"{wal.name} to a writable place (the one without the other loses them) and "
            "point INCREMENTAL_STATE_URI at the copy")

    def _intact(self, wal: Path | None = None) -> bool | None:
        """Whether the file, read without writing anything, is a sound store.

        ``immutable=1``: SQLite reads the file as it is, without its -shm
        file (which a read-only directory may not let it create) and without
        locks; ``quick_check`` reads every page of it. An immutable read
        ignores the -wal file, though: with a non-empty *wal*, the store and
        its -wal are copied together to a temporary directory and checked
        there, opened normally (which replays the -wal's commits); ``None``
        when that copy cannot be made (it cannot be told).
        """
        if wal is not None:
            try:
                with tempfile.TemporaryDirectory(prefix="incremental-store-check-") as tmp:
                    copy = Path(tmp) / self.path.name
                    shutil.copyfile(self.path, copy)
                    shutil.copyfile(wal, Path(f"{copy}-wal"))
                    return self._sound(str(copy), uri=False)
            except OSError:
                return None
        return self._sound(f"{self.path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)

    def _sound(self, database: str, *, uri: bool) -> bool:
        """Whether *database* opens as a store of ours and passes ``quick_check``."""
        try:
            db = sqlite3.connect(database, uri=uri)
        except sqlite3.Error:
            return False
        try:
            self._check_schema(db)
            return bool(db.execute("PRAGMA quick_check").fetchone()[0] == "ok")
        except (sqlite3.Error, StateStoreError):
            return False
        finally:
            db.close()

    def _check_schema(self, db: sqlite3.Connection) -> None:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise self._fail(
                f"has schema version {version}, newer than this code knows "
                f"({SCHEMA_VERSION}); upgrade incremental_crawler"
            )
        if version == 0:
            tables = db.execute(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'"
            ).fetchone()[0]
            if tables:
                raise self._fail(
                    "is a SQLite database but not an incremental_crawler state "
                    "store (it has tables and no schema version); point "
                    "INCREMENTAL_STATE_URI at another file"
                )

    def _migrate(self, db: sqlite3.Connection) -> None:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        # The write lock up front: two processes opening a new store at once
        # cannot both migrate it.
        with _immediate(db):
            version = db.execute("PRAGMA user_version").fetchone()[0]
            for step in range(version, SCHEMA_VERSION):
                for statement in _statements(MIGRATIONS[step]):
                    db.execute(statement)
                if version:
                    logger.info(
                        "State store %(path)s migrated to schema version %(v)d",
                        {"path": self.location, "v": step + 1},
                    )
            if not version:
                # A new store runs every migration in one transaction: it is
                # created at the current version, and says so once.
                logger.info("State store %(path)s created at schema version %(v)d",
                            {"path": self.location, "v": SCHEMA_VERSION})
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # -- reads ---------------------------------------------------------------

    async def get_page(self, key: PageKey) -> PageState | None:
        # Staged page states are visible at once; staged checks (counters
        # only) become visible when flushed.
        return self.get_page_now(key)

    def get_page_now(self, key: PageKey) -> PageState | None:
        """Synchronous :meth:`get_page` (SQLite lookups are fast and local)."""
        staged = self._pages.get(key)
        if staged is not None:
            return staged
        try:
            row = self._db.execute(_SELECT_PAGE, key).fetchone()
        except sqlite3.DatabaseError as exc:
            raise self._fail("read failed", exc) from exc
        if row is None:
            return None
        return PageState(key, *row)

    async def get_pages(self, keys: Iterable[PageKey]) -> dict[PageKey, PageState]:
        found: dict[PageKey, PageState] = {}
        # One query per (scope, variant) and chunk of URLs: a sitemap's 50,000
        # entries cost 100 lookups, not 50,000.
        groups: dict[tuple[str, str], list[str]] = {}
        for key in keys:
            staged = self._pages.get(key)
            if staged is not None:
                found[key] = staged
            else:
                groups.setdefault((key.scope, key.variant), []).append(key.url)
        for (scope, variant), urls in groups.items():
            for start in range(0, len(urls), _CHUNK):
                chunk = urls[start:start + _CHUNK]
                query = (
                    f"SELECT url, {_PAGE_COLUMNS} FROM pages WHERE scope = ? AND "  # noqa: S608 (constant SQL)
                    f"variant = ? AND url IN ({', '.join('?' * len(chunk))})"
                )
                try:
                    rows = self._db.execute(query, (scope, variant, *chunk)).fetchall()
                except sqlite3.DatabaseError as exc:
                    raise self._fail("read failed", exc) from exc
                for url, *columns in rows:
                    key = PageKey(scope, url, variant)
                    found[key] = PageState(key, *columns)
        return found

    async def get_links(self, key: PageKey) -> str | None:
        if key in self._links:
            return self._links[key]
        try:
            row = self._db.execute(
                "SELECT data FROM links WHERE scope = ? AND url = ? AND variant = ?", key,
            ).fetchone()
        except sqlite3.DatabaseError as exc:
            raise self._fail("read failed", exc) from exc
        return None if row is None else row[0]

    async def write_generation(self, scope: str, hosts: Collection[str]) -> str | None:
        # The whole scope's (triggers cannot tell a page's host cheaply).
        rows = self._read("SELECT generation FROM write_generations WHERE scope = ?", (scope,))
        return f"{rows[0][0] if rows else 0}"

    async def get_walk_memo(self, scope: str, name: str) -> str | None:
        return self.get_walk_memo_now(scope, name)

    def get_walk_memo_now(self, scope: str, name: str) -> str | None:
        rows = self._read("SELECT data FROM walk_memos WHERE scope = ? AND name = ?",
                          (scope, name))
        return rows[0][0] if rows else None

    async def put_walk_memo(self, scope: str, name: str, data: str) -> None:
        self._write(("INSERT OR REPLACE INTO walk_memos (scope, name, data) VALUES (?, ?, ?)",
                     (scope, name, data)))

    async def get_links_many(self, keys: Iterable[PageKey]) -> dict[PageKey, str | None]:
        # One query per (scope, variant) and chunk of URLs, as get_pages: the
        # stored-graph walk reads a level of the graph at once, every page of
        # a manual in a nothing-due re-crawl, and a query per page cost as
        # much again as decoding its record.
        found: dict[PageKey, str | None] = {}
        groups: dict[tuple[str, str], list[str]] = {}
        for key in keys:
            if key in self._links:
                found[key] = self._links[key]
            else:
                found[key] = None
                groups.setdefault((key.scope, key.variant), []).append(key.url)
        for (scope, variant), urls in groups.items():
            for start in range(0, len(urls), _CHUNK):
                chunk = urls[start:start + _CHUNK]
                query = (
                    "SELECT url, data FROM links WHERE scope = ? AND variant = ? AND "  # noqa: S608 (constant SQL)
                    f"url IN ({', '.join('?' * len(chunk))})"
                )
                try:
                    rows = self._db.execute(query, (scope, variant, *chunk)).fetchall()
                except sqlite3.DatabaseError as exc:
                    raise self._fail("read failed", exc) from exc
                for url, data in rows:
                    found[PageKey(scope, url, variant)] = data
        return found

    async def get_due(self, scope: str, now: float, limit: int,
                      after: DueAfter | None = None) -> list[PageState]:
        # A range of the index by next visit (its entries end with the URL
        # and variant: the order is total), from the page after `after`.
        due_at = _clamp(now)  # an infinite due_at (recheck all): every page
        after = checked_after(after)
        params: tuple[object, ...] = ()
        if after is None:
            where = ""
        else:
            where, params = "AND (next_visit, url, variant) > (?, ?, ?) ", tuple(after)
        query = (
            f"SELECT url, variant, {_PAGE_COLUMNS} FROM pages "  # noqa: S608 (constant SQL)
            "INDEXED BY pages_by_next_visit WHERE scope = ? "
            f"AND callback IS NOT NULL AND next_visit <= ? {where}"
            "ORDER BY next_visit, url, variant LIMIT ?"
        )
        try:
            rows = self._db.execute(query, (scope, due_at, *params, limit)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._fail("read failed", exc) from exc
        return [PageState(PageKey(scope, url, variant), *columns)
                for url, variant, *columns in rows]

    async def summarize_pages(self, scope: str, *, after: float, upto: float,
                              checked_before: float,
                              exclude_callbacks: Collection[str] = ()) -> PagesSummary:
        try:
            return self._summarize(scope, _clamp(after), _clamp(upto),
                                   _clamp(checked_before, up=True), tuple(exclude_callbacks))
        except sqlite3.DatabaseError as exc:
            raise self._fail("read failed", exc) from exc

    def _summarize(self, scope: str, after: int, upto: int, checked_before: int,
                   excluded: tuple[str, ...]) -> PagesSummary:
        """:meth:`summarize_pages`: the sums of whole slots of next visits
        (``page_sums``), less their pages checked at or after
        *checked_before* (by last check: this crawl's), and the pages of
        the two slots at the ends one by one (by next visit)."""
        if upto <= after:
            return PagesSummary()
        not_excluded = (f" AND callback NOT IN ({','.join('?' * len(excluded))})"
                        if excluded else "")
        db = self._db
        marks = db.execute("SELECT mark, latest FROM check_marks WHERE scope = ?",
                           (scope,)).fetchone()
        mark, latest = marks or (None, None)
        if latest is not None and checked_before <= latest and (
                mark is None or checked_before < mark):
            # The pages checked at or after checked_before are not known one
            # by one (no crawl took the scope since, a clock that went
            # back): every page of the scope is read.
            count, size, first = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0), MIN(next_visit) FROM pages "  # noqa: S608 (placeholders only)
                "NOT INDEXED WHERE scope = ? AND callback IS NOT NULL AND next_visit > ? "
                "AND next_visit <= ? AND last_checked < ?" + not_excluded,
                (scope, after, upto, checked_before, *excluded)).fetchone()
            return PagesSummary(count, size, first)
        # Slots wholly inside (after, upto]: those strictly between the
        # slots of its ends (a slot is a range of next visits).
        low, high = (after + 1) // _SUM_SLOT, upto // _SUM_SLOT
        ends = [(after, min(upto, (low + 1) * _SUM_SLOT - 1))]
        if high > low:
            ends.append((high * _SUM_SLOT - 1, upto))

        def pages_in(first: int, last: int) -> tuple[int, int, int | None]:
            """Pages of next visit in (first, last], one by one."""
            count, size, least = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0), MIN(next_visit) FROM pages "  # noqa: S608 (placeholders only)
                "INDEXED BY pages_by_next_visit WHERE scope = ? AND callback IS NOT NULL "
                "AND next_visit > ? AND next_visit <= ? AND last_checked < ?" + not_excluded,
                (scope, first, last, checked_before, *excluded)).fetchone()
            return count, size, least

        pages = size = 0
        first_due: int | None = None
        head = pages_in(*ends[0])
        pages, size, first_due = head[0], head[1], head[2]
        if high - low > 1:
            sums = {slot: (count, bytes_) for slot, count, bytes_ in db.execute(
                "SELECT slot, SUM(pages), SUM(size) FROM page_sums "  # noqa: S608 (placeholders only)
                "WHERE scope = ? AND slot > ? AND slot < ? AND pages != 0" + not_excluded
                + " GROUP BY slot ORDER BY slot", (scope, low, high, *excluded))}
            # This crawl's checks (last checked at or after checked_before)
            # are in the sums: taken out again, by slot.
            # (None when no page was checked at or after it.) CROSS JOIN:
            # from the checks noted to their pages, never the other way.
            recent = {} if latest is None or checked_before > latest else {
                slot: (count, bytes_) for slot, count, bytes_ in db.execute(
                f"SELECT {_slot_sql('p.next_visit')}, COUNT(*), SUM(p.size) "  # noqa: S608 (constant SQL)
                "FROM page_checks c CROSS JOIN pages p ON p.scope = c.scope AND p.url = c.url "
                "AND p.variant = c.variant WHERE c.scope = ? AND p.callback IS NOT NULL "
                "AND p.last_checked >= ? AND p.next_visit >= ? AND p.next_visit < ?"
                + not_excluded.replace("callback", "p.callback") + " GROUP BY 1",
                (scope, checked_before, (low + 1) * _SUM_SLOT, high * _SUM_SLOT, *excluded))}
            for slot, (total, total_bytes) in sums.items():
                less, less_bytes = recent.get(slot, (0, 0))
                pages += total - less
                size += total_bytes - less_bytes
                if first_due is None and total > less:
                    # The earliest of the first slot holding any: its pages.
                    first_due = pages_in(slot * _SUM_SLOT - 1, (slot + 1) * _SUM_SLOT - 1)[2]
        if len(ends) > 1:
            tail = pages_in(*ends[1])
            pages += tail[0]
            size += tail[1]
            if first_due is None:
                first_due = tail[2]
        return PagesSummary(pages, size, first_due)

    async def get_item_simhash(self, scope: str, item_key: str) -> int | None:
        row = self._db.execute(
            "SELECT simhash FROM items WHERE scope = ? AND item_key = ?", (scope, item_key)
        ).fetchone()
        return row[0] if row else None

    async def get_host(self, scope: str, host: str) -> HostTrust | None:
        row = self._db.execute(
            "SELECT lastmod_checks, lastmod_lies, distrusted_until, "
            "validators_distrusted_until, validators_consistent, "
            "validators_unstable_since, stale_lastmods FROM hosts "
            "WHERE scope = ? AND host = ?", (scope, host),
        ).fetchone()
        return None if row is None else HostTrust(scope, host, *row)

    def stage_host(self, trust: HostTrust) -> None:
        self._staged += 1
        self._ops.append((
            ("INSERT OR REPLACE INTO hosts (scope, host, lastmod_checks, lastmod_lies, "
             "distrusted_until, validators_distrusted_until, validators_consistent, "
             "validators_unstable_since, stale_lastmods) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"),
            (trust.scope, trust.host, trust.checks, trust.lies, int(trust.distrusted_until),
             int(trust.validators_distrusted_until), trust.validators_consistent,
             int(trust.validators_unstable_since), trust.stale_lastmods),
        ))

    async def get_item_fingerprint(self, scope: str, item_key: str) -> str | None:
        staged = self._item_fps.get((scope, item_key))
        if staged is None:
            try:
                row = self._db.execute(
                    "SELECT fingerprint FROM items WHERE scope = ? AND item_key = ?",
                    (scope, item_key),
                ).fetchone()
            except sqlite3.DatabaseError as exc:
                raise self._fail("read failed", exc) from exc
            staged = row[0] if row else None
        return staged or None  # "": a tombstone

    async def get_item_data(self, scope: str, item_key: str) -> str | None:
        try:
            row = self._db.execute(
                "SELECT v.data FROM items i JOIN item_versions v ON v.scope = i.scope "
                "AND v.item_key = i.item_key AND v.version = i.version "
                "WHERE i.scope = ? AND i.item_key = ? AND i.fingerprint != ''",
                (scope, item_key),
            ).fetchone()
        except sqlite3.DatabaseError as exc:
            raise self._fail("read failed", exc) from exc
        return None if row is None else row[0]

    async def get_page_items(self, scope: str, page_url: str) -> list[str]:
        try:
            rows = self._db.execute(
                "SELECT item_key FROM items WHERE scope = ? AND fingerprint != '' AND "
                "(page = ? OR (page IS NULL AND item_key = ?)) ORDER BY item_key",
                (scope, page_url, page_url),
            ).fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._fail("read failed", exc) from exc
        return [key for (key,) in rows]

    # -- staged writes -------------------------------------------------------

    def stage_page(self, state: PageState) -> None:
        self._page_scopes.add(state.key.scope)
        self._staged += 1
        self._pages[state.key] = state
        self._checked(state.key, state.last_checked)
        self._ops.append((_UPSERT_PAGE, (
            *state.key, state.etag, state.last_modified, state.fingerprint, state.size,
            state.last_status, int(state.first_seen), int(state.last_checked),
            int(state.last_fetched), int(state.last_changed), state.checks,
            state.changes, state.flags, state.redirect_to,
            None if state.lastmod is None else int(state.lastmod),
            int(state.interval), int(state.next_visit), state.callback, state.churns,
            state.recipe, state.failures, state.listing,
        )))

    def stage_check(
        self, key: PageKey, status: int, when: float, *, lastmod: float | None = None,
        schedule: tuple[float, float] | None = None,
        validators: tuple[str | None, str | None] | None = None,
    ) -> None:
        self._page_scopes.add(key.scope)
        self._staged += 1
        lastmod_ = None if lastmod is None else int(lastmod)
        interval, next_visit = (None, None) if schedule is None else map(int, schedule)
        etag, last_modified = validators or (None, None)
        self._checked(key, when)
        self._ops.append((_UPSERT_CHECK, (
            *key, status, int(when), int(when), lastmod_,
            interval, next_visit, etag, last_modified, interval, next_visit,
        )))

    def stage_failure(
        self, key: PageKey, status: int, when: float, *, failures: int, next_visit: float,
        callback: str | None = None, recipe: str | None = None,
    ) -> None:
        self._page_scopes.add(key.scope)
        self._staged += 1
        self._checked(key, when)
        self._ops.append((_UPSERT_FAILURE, (
            *key, status, int(when), int(when), failures, int(next_visit), callback, recipe,
        )))

    def stage_redirect(self, key: PageKey, target: str, status: int, when: float) -> None:
        self._page_scopes.add(key.scope)
        self._staged += 1
        self._checked(key, when)
        self._ops.append((_UPSERT_REDIRECT, (*key, status, int(when), int(when), target)))

    def stage_item(self, record: ItemRecord) -> None:
        self._staged += 1
        when = int(record.stored_at)
        # The URL usually is the key, and the page too: not stored twice.
        # No page ("" too) is the page of the key, as in every store.
        url = None if record.url == record.key else record.url
        page = None if record.page in (None, "", record.key) else record.page
        live = bool(record.fingerprint)
        self._ops.append((_UPSERT_ITEM, (
            record.scope, record.key, url, record.fingerprint, when, when, record.simhash,
            page, when if live else None, None if live else when,
        )))
        if record.data is not None:
            self._ops.append((_ADD_ITEM_VERSION, (
                record.data, str(record.change), record.delivery, record.scope, record.key)))
            if self.history_limit:
                self._ops.append((_PRUNE_VERSIONS, (
                    record.scope, record.key, record.scope, record.key, self.history_limit)))
        self._item_fps[record.scope, record.key] = record.fingerprint

    def stage_links(self, key: PageKey, data: str | None) -> None:
        self._page_scopes.add(key.scope)
        self._staged += 1
        self._links[key] = data
        if data is None:
            self._ops.append((_DELETE_LINKS, tuple(key)))
        else:
            self._ops.append((_UPSERT_LINKS, (*key, data)))

    def stage_flags(self, key: PageKey, add: int) -> None:
        self._page_scopes.add(key.scope)
        self._staged += 1
        self._ops.append((_OR_FLAGS, (int(add), *key)))
        staged = self._pages.get(key)
        if staged is not None:
            # What the flush will leave: the staged state, then the flags.
            self._pages[key] = staged.copy(flags=int(staged.flags) | int(add))

    def stage_listing(self, key: PageKey, listing: str) -> None:
        self._page_scopes.add(key.scope)
        self._staged += 1
        self._ops.append((_SET_LISTING, (listing, *key)))
        staged = self._pages.get(key)
        if staged is not None:
            self._pages[key] = staged.copy(listing=listing)

    def _checked(self, key: PageKey, when: float) -> None:
        """A staged write sets the page's last check to *when* (or an
        earlier write's; the highest kept: a page noted is read again)."""
        checked = self._checks.setdefault(key.scope, {})
        place = (key.url, key.variant)
        checked[place] = max(int(when), checked.get(place, int(when)))

    def stage_postpone(self, key: PageKey, was: float, next_visit: float) -> None:
        self._page_scopes.add(key.scope)
        self._staged += 1
        self._ops.append((_POSTPONE, (int(next_visit), *key, int(was))))
        staged = self._pages.get(key)
        if staged is not None and staged.next_visit == int(was):
            self._pages[key] = staged.copy(next_visit=int(next_visit))

    @property
    def pending(self) -> int:
        return self._staged

    async def flush(self) -> int:
        return self.flush_now()

    def flush_now(self) -> int:
        """Commit every staged write, in staging order, in one transaction."""
        if not self._ops:
            return 0
        try:
            with _immediate(self._db) as db:
                if self.flush_hold is not None and not self._holds_still(
                        *self.flush_hold, clock.now()):
                    # Its hold lapsed and the scope was taken since: writes
                    # now could undo a repair's. Kept staged (the crawl stops).
                    raise HoldLapsed.of(self.location, *self.flush_hold)
                # Runs of the same statement go to SQLite in one call.
                for sql, group in groupby(self._ops, key=itemgetter(0)):
                    db.executemany(sql, [params for _, params in group])
                self._note_checks()
                db.executemany(_NEW_GENERATION, [(scope,) for scope in self._page_scopes])
        except sqlite3.DatabaseError as exc:
            # Staged writes are kept: a later flush (e.g. once a lock is
            # released) can still commit them, and nothing is recorded as
            # stored that was not.
            message = str(exc)
            if "locked" in message or "busy" in message:
                raise self._fail("is locked by another process; could not commit", exc) from exc
            if "full" in message:
                raise self._fail("the disk is full; free space and re-run", exc) from exc
            raise self._fail("commit failed", exc) from exc
        count, self._staged = self._staged, 0
        self._ops.clear()
        self._checks.clear()
        self._pages.clear()
        self._links.clear()
        self._item_fps.clear()
        self._page_scopes.clear()
        return count

    async def close(self) -> None:
        try:
            self.flush_now()
        finally:
            self._db.close()

    # -- reports and exports -------------------------------------------------

    def iter_items(self, scope: str | None = None) -> Iterator[dict[str, object]]:
        query = (
            "SELECT i.scope, i.item_key, i.url, i.fingerprint, v.data FROM items i "
            "LEFT JOIN item_versions v ON v.scope = i.scope "
            "AND v.item_key = i.item_key AND v.version = i.version "
            "WHERE i.fingerprint != ''"
        )
        params: tuple[str, ...] = ()
        if scope is not None:
            query += " AND i.scope = ?"
            params = (scope,)
        query += " ORDER BY i.scope, i.first_seen, i.item_key"
        for _scope, key, url, fp, data in self._db.execute(query, params):
            item: dict[str, object] = json.loads(data) if data else {}
            item.setdefault("url", url or key)
            item["fingerprint"] = fp
            yield item

    def iter_versions(self, scope: str | None = None, *, since: float | None = None,
                      every_version: bool = False) -> Iterator[StoredVersion]:
        # Stored times are whole seconds: a window from a fraction of a
        # second starts at its whole second (at least once, never missed).
        floor = -(2**62) if since is None else math.floor(since)
        where = ["v.stored_at >= ?"]
        params: list[object] = [floor]
        if scope is not None:
            where.append("v.scope = ?")
            params.append(scope)
        change = _CHANGE
        if not every_version:
            where.append("v.version = i.version")
            if since is not None:
                # New to whoever has what was stored before the window: the
                # item was not live then (its live run began in the window,
                # and no tombstone of an earlier one is in it).
                change = (f"CASE WHEN {_CHANGE} != 'deleted' AND i.born >= ? AND "
                          f"(i.died IS NULL OR i.died < ?) THEN 'new' ELSE {_CHANGE} END")
                params[:0] = [floor, floor]
        query = (
            f"SELECT v.scope, v.item_key, v.version, {change}, v.stored_at, "  # noqa: S608 (constant SQL)
            "v.fingerprint, v.data FROM item_versions v JOIN items i "
            "ON i.scope = v.scope AND i.item_key = v.item_key "
            f"WHERE {' AND '.join(where)} "
            "ORDER BY v.stored_at, v.scope, v.item_key, v.version"
        )
        for scope_, key, version, change, stored_at, fingerprint, data in self._db.execute(
                query, params):
            yield StoredVersion(scope_, key, version, change, stored_at, fingerprint,
                                json.loads(data))

    def count_pages(self, scope: str | None = None) -> int:
        if scope is None:
            return self._db.execute("SELECT COUNT(*) FROM pages").fetchone()[0]
        return self._db.execute(
            "SELECT COUNT(*) FROM pages WHERE scope = ?", (scope,)
        ).fetchone()[0]

    def iter_item_states(self, scope: str) -> Iterator[StoredItem]:
        # By key, _CHUNK items at a time (each chunk's versions in one read).
        after = None
        while True:
            # Two statements, not an OR: each chunk a range of the primary key.
            rows = self._read(
                _ITEM_STATES_FIRST if after is None else _ITEM_STATES_AFTER,
                (scope, _CHUNK) if after is None else (scope, after, _CHUNK))
            if not rows:
                return
            keys = [row[0] for row in rows]
            versions: dict[str, list[StoredVersion]] = {key: [] for key in keys}
            for key, version, change, stored_at, fp, data in self._read(
                    f"SELECT v.item_key, v.version, {_CHANGE}, v.stored_at, v.fingerprint, "  # noqa: S608 (placeholders only)
                    "v.data FROM item_versions v WHERE v.scope = ? AND v.item_key IN "
                    f"({', '.join('?' * len(keys))}) ORDER BY v.item_key, v.version",
                    (scope, *keys)):
                try:
                    parsed = json.loads(data)
                except ValueError as exc:
                    raise self._fail(f"version {version} of item {key!r} of scope {scope!r} "
                                     "is not JSON: it cannot be read", exc) from exc
                versions[key].append(
                    StoredVersion(scope, key, version, change, stored_at, fp, parsed))
            for key, url, page, fp, simhash, version, first_seen, stored_at, born, died in rows:
                yield StoredItem(scope, key, url or key, page or key, fp, simhash, version,
                                 first_seen, stored_at, versions[key], born, died)
            after = keys[-1]

    def item_history(self, scope: str, item_key: str) -> list[tuple[int, str]]:
        """(version, fingerprint) of every stored version of an item."""
        return self._db.execute(
            "SELECT version, fingerprint FROM item_versions WHERE scope = ? "
            "AND item_key = ? ORDER BY version",
            (scope, item_key),
        ).fetchall()

    # -- delivery of item versions ---------------------------------------------

    def stage_delivered(self, scope: str, crawl: str) -> None:
        self._staged += 1
        self._ops.append((_DELIVERED, (scope, crawl)))

    def stage_redelivered(self, pending: Undelivered, crawl: str) -> None:
        self._staged += 1
        version = pending.version
        self._ops.append((_REDELIVERED, (
            crawl, version.scope, version.key, version.version, pending.crawl)))

    async def undelivered_crawls(self, scope: str) -> list[str]:
        return [crawl for (crawl,) in self._read(
            "SELECT DISTINCT crawl FROM item_versions WHERE scope = ? AND crawl IS NOT NULL "
            "ORDER BY crawl", (scope,))]

    async def undelivered(self, scope: str, crawl: str, *, after: Undelivered | None = None,
                          limit: int = 500) -> list[Undelivered]:
        where = "scope = ? AND crawl = ?"
        params: list[object] = [scope, crawl]
        if after is not None:
            where += " AND (stored_at, item_key, version) > (?, ?, ?)"
            last = after.version
            params += [int(last.stored_at), last.key, last.version]
        rows = self._read(
            f"SELECT item_key, version, {_CHANGE.replace('v.', '')}, stored_at, "  # noqa: S608 (constant SQL)
            f"fingerprint, data FROM item_versions WHERE {where} "
            "ORDER BY stored_at, item_key, version LIMIT ?", (*params, limit))
        return [Undelivered(crawl, StoredVersion(scope, key, version, change, stored_at, fp,
                                                 json.loads(data)))
                for key, version, change, stored_at, fp, data in rows]

    # -- crawl records -------------------------------------------------------

    def stage_crawl(self, record: CrawlRecord) -> None:
        self._staged += 1
        self._ops.append((_ADD_CRAWL, (
            record.scope, record.started, record.finished, record.worker, record.reason,
            json.dumps(record.figures, sort_keys=True, separators=(",", ":")),
        )))
        self._ops.append((_PRUNE_CRAWLS, (record.scope, record.scope, self.crawl_history)))

    def crawls(self, scope: str, limit: int) -> list[CrawlRecord]:
        rows = self._read(
            "SELECT started, finished, worker, reason, figures FROM crawls WHERE scope = ? "
            "ORDER BY started DESC, finished DESC, rowid DESC LIMIT ?", (scope, limit))
        return [CrawlRecord(scope, started, finished, worker, reason, json.loads(figures))
                for started, finished, worker, reason, figures in rows]

    # -- remembered politeness rates -------------------------------------------

    def stage_slot_rates(self, rates: Iterable[SlotRate]) -> None:
        scopes = []
        for rate in rates:
            self._staged += 1
            self._ops.append((_UPSERT_SLOT_RATE, (
                rate.scope, rate.slot, rate.rate, int(rate.slow_start), rate.saved_at,
                rate.ended)))
            if rate.scope not in scopes:
                scopes.append(rate.scope)
        for scope in scopes:
            self._ops.append((_PRUNE_SLOT_RATES, (scope, scope, self.slot_rates_kept)))

    async def slot_rates(self, scope: str) -> SlotRates:
        return self.read_slot_rates(scope)

    def read_slot_rates(self, scope: str) -> SlotRates:
        found = SlotRates([], [])
        for slot, rate, slow_start, saved_at, ended in self._read(
                "SELECT slot, rate, slow_start, saved_at, ended FROM slot_rates "
                "WHERE scope = ? ORDER BY slot", (scope,)):
            # SQLite keeps whatever a column was given: a damaged row reads
            # as text where a number belongs, and is left out.
            record = SlotRate(scope, slot, rate, bool(slow_start), saved_at, ended)
            if slow_start in (0, 1) and record.readable():
                found.rates.append(record)
            else:
                found.unreadable.append(slot)
        return found

    # -- holds ---------------------------------------------------------------

    async def hold_scope(self, scope: str, holder: str, ttl: float,
                         now: float | None = None) -> None:
        if now is None:
            now = clock.now()
        # Its own transaction, beside the staged writes (never inside a
        # flush: the reactor runs one thing at a time); lapsed holds go. A
        # hold that lapsed is not taken again: a repair may have held the
        # scope, and ended, meanwhile.
        try:
            with _immediate(self._db) as db:
                other = self._conflicting_hold(scope, holder, now, gone_too=True)
                if other is not None:
                    raise self._held(scope, holder, *other)
                if not self._holds_still(scope, holder, now):
                    raise HoldLapsed.of(self.location, scope, holder)
                db.execute("DELETE FROM holds WHERE scope = ? AND expires <= ?", (scope, now))
                db.execute("INSERT OR REPLACE INTO holds (scope, holder, expires) "
                           "VALUES (?, ?, ?)", (scope, holder, now + ttl))
        except sqlite3.DatabaseError as exc:
            raise self._fail("write failed", exc) from exc

    def _epoch(self, scope: str) -> int:
        row = self._db.execute("SELECT epoch FROM hold_epochs WHERE scope = ?",
                               (scope,)).fetchone()
        return 0 if row is None else int(row[0])

    def _holds_still(self, scope: str, holder: str, now: float) -> bool:
        """Whether *holder*'s hold on *scope* is live at *now*, or lapsed
        while nobody took the scope (the epoch of its take is the scope's:
        a stalled crawl goes on, see :meth:`take_scope`). Taken again then,
        for the ttl of its take; in the caller's transaction."""
        if self._db.execute("SELECT 1 FROM holds WHERE scope = ? AND holder = ? "
                            "AND expires > ?", (scope, holder, now)).fetchone() is not None:
            return True
        taken = self._hold_takes.get((scope, holder))
        if taken is None or taken[0] != self._epoch(scope) or self._conflicting_hold(
                scope, holder, now, gone_too=True) is not None:
            return False
        self._db.execute("INSERT OR REPLACE INTO holds (scope, holder, expires) "
                         "VALUES (?, ?, ?)", (scope, holder, now + taken[1]))
        return True

    def _conflicting_hold(self, scope: str, holder: str, now: float, *,
                          gone_too: bool = False) -> tuple[str, float] | None:
        """The live hold of *scope* that *holder* may not hold beside, the
        one lapsing last (one whose process is gone counts *gone_too*)."""
        others = [(other, expires) for other, expires in self._db.execute(
            "SELECT holder, expires FROM holds WHERE scope = ? AND expires > ? "
            "ORDER BY expires DESC", (scope, now))
            if holds_conflict(holder, other) and (gone_too or not takes_over(holder, other))]
        return others[0] if others else None

    def _held(self, scope: str, holder: str, other: str, expires: float) -> ScopeHeld:
        return ScopeHeld(f"State store {self.location}: scope {scope!r} is held by "
                         f"{describe_holder(other)}, which {describe_holder(holder)} may "
                         "not hold it beside", other, expires)

    def take_scope(self, scope: str, holder: str, ttl: float,
                   now: float) -> tuple[str, float] | None:
        try:
            # Another crawl's take waits for this one.
            with _immediate(self._db) as db:
                other = self._conflicting_hold(scope, holder, now)
                if other is not None:
                    return other  # nothing written: the commit is empty
                # Lapsed holds go, and those whose process is gone; the
                # live ones left are cluster workers holding beside a worker.
                gone = [(scope, name) for (name,) in db.execute(
                    "SELECT holder FROM holds WHERE scope = ?", (scope,))
                    if takes_over(holder, name)]
                db.executemany("DELETE FROM holds WHERE scope = ? AND holder = ?", gone)
                db.execute("DELETE FROM holds WHERE scope = ? AND expires <= ?", (scope, now))
                # Every take moves the epoch but a worker's beside live
                # workers' (they hold the scope together).
                beside = any(name != holder and not holds_conflict(holder, name)
                             for (name,) in db.execute(
                                 "SELECT holder FROM holds WHERE scope = ?", (scope,)))
                if not beside:
                    db.execute("INSERT INTO hold_epochs (scope, epoch) VALUES (?, 1) "
                               "ON CONFLICT (scope) DO UPDATE SET epoch = epoch + 1", (scope,))
                db.execute("INSERT OR REPLACE INTO holds (scope, holder, expires) "
                           "VALUES (?, ?, ?)", (scope, holder, now + ttl))
                self._hold_takes[(scope, holder)] = (self._epoch(scope), ttl)
                if is_crawl_hold(holder):
                    # A crawl's (a cluster run's workers start apart: each
                    # would clear the others' checks).
                    self._mark_checks(scope, math.floor(now))
        except sqlite3.DatabaseError as exc:
            raise self._fail("write failed", exc) from exc
        return None

    def _mark_checks(self, scope: str, at: int) -> None:
        """A crawl of *scope* starts at *at*: its checks are noted one by one
        from then on (``page_checks``, written by the flushes), so that a
        summary leaves them out without reading every page. Not when a page
        was checked at or after *at* already (a clock that went back): no
        mark then, and such summaries read every page."""
        db = self._db
        mark, latest = db.execute("SELECT mark, latest FROM check_marks WHERE scope = ?",
                                  (scope,)).fetchone() or (None, None)
        if mark == at:
            return
        db.execute("DELETE FROM page_checks WHERE scope = ?", (scope,))
        db.execute("INSERT INTO check_marks (scope, mark, latest) VALUES (?, ?, ?) "
                   "ON CONFLICT (scope) DO UPDATE SET mark = excluded.mark",
                   (scope, None if latest is not None and latest >= at else at, latest))

    def _note_checks(self) -> None:
        """In the flush's transaction: each scope's latest last check, and
        its pages checked since its mark (see :meth:`_mark_checks`)."""
        db = self._db
        for scope, checked in self._checks.items():
            mark, latest = db.execute("SELECT mark, latest FROM check_marks WHERE scope = ?",
                                      (scope,)).fetchone() or (None, None)
            highest = max(checked.values())
            if latest is None or highest > latest:
                db.execute("INSERT INTO check_marks (scope, latest) VALUES (?, ?) "
                           "ON CONFLICT (scope) DO UPDATE SET latest = excluded.latest",
                           (scope, highest))
            if mark is not None:
                db.executemany(
                    "INSERT OR IGNORE INTO page_checks (scope, url, variant) VALUES (?, ?, ?)",
                    [(scope, url, variant) for (url, variant), when in checked.items()
                     if when >= mark])

    async def release_scope(self, scope: str, holder: str) -> None:
        self._hold_takes.pop((scope, holder), None)  # released: never taken again
        self._write(("DELETE FROM holds WHERE scope = ? AND holder = ?", (scope, holder)))

    def scope_holders(self, scope: str, now: float) -> dict[str, float]:
        return dict(self._read(
            "SELECT holder, expires FROM holds WHERE scope = ? AND expires > ? "
            "ORDER BY holder", (scope, now)))

    # -- read-outs -----------------------------------------------------------

    def _read(self, sql: str, params: Iterable[object] = ()) -> list[Any]:
        try:
            return self._db.execute(sql, tuple(params)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._fail("read failed", exc) from exc

    def _write(self, *statements: tuple[str, tuple[object, ...]]) -> list[int]:
        """Run *statements* in one transaction now; the rows each changed."""
        try:
            with _immediate(self._db) as db:
                changed = [db.execute(sql, params).rowcount for sql, params in statements]
        except sqlite3.DatabaseError as exc:
            raise self._fail("write failed", exc) from exc
        return changed

    def store_identity(self) -> str:
        try:
            stat = self.path.stat()
        except OSError:
            return self.location
        return f"sqlite:{stat.st_dev}:{stat.st_ino}"

    def scopes(self) -> list[str]:
        union = " UNION ".join(f"SELECT DISTINCT scope FROM {table}"  # noqa: S608 (constant SQL)
                               for table, _ in _SCOPE_TABLES)
        return [scope for (scope,) in self._read(f"{union} ORDER BY scope")]

    def iter_pages(self, scope: str) -> Iterator[PageState]:
        query = f"SELECT url, variant, {_PAGE_COLUMNS} FROM pages WHERE scope = ?"  # noqa: S608 (constant SQL)
        for url, variant, *columns in self._db.execute(query, (scope,)):
            yield PageState(PageKey(scope, url, variant), *columns)

    def iter_hosts(self, scope: str) -> Iterator[HostTrust]:
        for row in self._read(
                "SELECT host, lastmod_checks, lastmod_lies, distrusted_until, "
                "validators_distrusted_until, validators_consistent, "
                "validators_unstable_since, stale_lastmods FROM hosts WHERE scope = ? "
                "ORDER BY host", (scope,)):
            yield HostTrust(scope, *row)

    def _page_items(self, scope: str, urls: list[str], *, live: bool) -> list[str]:
        """Keys of the items last stored from any of *urls* (live ones only, or all)."""
        keys: list[str] = []
        for start in range(0, len(urls), _CHUNK):
            chunk = urls[start:start + _CHUNK]
            marks = ", ".join("?" * len(chunk))
            query = (
                f"SELECT item_key FROM items WHERE scope = ? AND (page IN ({marks}) OR "  # noqa: S608 (placeholders only)
                f"(page IS NULL AND item_key IN ({marks})))"
                + (" AND fingerprint != ''" if live else "")
            )
            keys.extend(key for (key,) in self._read(query, (scope, *chunk, *chunk)))
        return sorted(keys)

    def url_record(self, scope: str, url: str) -> UrlRecord:
        pages = [PageState(PageKey(scope, url, variant), *columns) for variant, *columns in
                 self._read(f"SELECT variant, {_PAGE_COLUMNS} FROM pages "  # noqa: S608 (constant SQL)
                            "WHERE scope = ? AND url = ? ORDER BY variant", (scope, url))]
        links = dict(self._read(
            "SELECT variant, data FROM links WHERE scope = ? AND url = ?", (scope, url)))
        items = self._page_items(scope, [url], live=True)
        latest: list[StoredVersion] = []
        for key in items:
            latest.extend(StoredVersion(scope, key, version, change, stored_at, fp,
                                        json.loads(data))
                          for version, change, stored_at, fp, data in self._read(
                              f"SELECT v.version, {_CHANGE}, v.stored_at, v.fingerprint, "  # noqa: S608 (constant SQL)
                              "v.data FROM items i JOIN item_versions v ON v.scope = i.scope "
                              "AND v.item_key = i.item_key AND v.version = i.version "
                              "WHERE i.scope = ? AND i.item_key = ?", (scope, key)))
        return UrlRecord(scope, url, pages, links, items, latest)

    # -- repairs -------------------------------------------------------------

    def _forget(self, scope: str, urls: list[str], *, host: str | None = None) -> Removed:
        """Delete the pages *urls* of *scope*, their links and items (and
        *host*'s trust record and remembered rate), in one transaction."""
        items = self._page_items(scope, urls, live=False)
        statements: list[tuple[str, tuple[object, ...]]] = []
        kinds: list[str] = []
        for kind, table, column, keys in (
                ("pages", "pages", "url", urls), ("links", "links", "url", urls),
                ("items", "items", "item_key", items),
                ("versions", "item_versions", "item_key", items)):
            for start in range(0, len(keys), _CHUNK):
                chunk = tuple(keys[start:start + _CHUNK])
                kinds.append(kind)
                sql = (f"DELETE FROM {table} WHERE scope = ? AND {column} IN "  # noqa: S608 (constant SQL)
                       f"({', '.join('?' * len(chunk))})")
                statements.append((sql, (scope, *chunk)))
        if host is not None:
            kinds.append("hosts")
            statements.append(("DELETE FROM hosts WHERE scope = ? AND host = ?", (scope, host)))
            kinds.append("rates")
            statements.append(("DELETE FROM slot_rates WHERE scope = ? AND slot = ?",
                               (scope, host)))
        kinds.append("")
        statements.append((_NEW_GENERATION, (scope,)))
        # One transaction: checked once, before it.
        self.before_deleting()
        counts = dict.fromkeys((*Removed._fields, ""), 0)
        for kind, n in zip(kinds, self._write(*statements), strict=True):
            counts[kind] += n
        del counts[""]
        return Removed(**counts)

    def forget_page(self, scope: str, url: str) -> Removed:
        return self._forget(scope, [url])

    def forget_host(self, scope: str, host: str) -> Removed:
        urls = sorted({url for (url,) in self._read(
            "SELECT url FROM pages WHERE scope = ?", (scope,)) if host_of(url) == host})
        return self._forget(scope, urls, host=host)

    def count_scope(self, scope: str) -> Removed:
        return Removed(**{
            name: self._read(f"SELECT COUNT(*) FROM {table} WHERE scope = ?",  # noqa: S608 (constant SQL)
                             (scope,))[0][0]
            for table, name in _SCOPE_TABLES})

    def reset_scope(self, scope: str) -> Removed:
        # The remembered politeness rates go too (not counted: not data).
        self.before_deleting()
        changed = self._write(*(
            (f"DELETE FROM {table} WHERE scope = ?", (scope,))  # noqa: S608 (constant SQL)
            for table, _ in _SCOPE_TABLES),
            *((f"DELETE FROM {table} WHERE scope = ?", (scope,))  # noqa: S608 (constant SQL)
              for table in ("slot_rates", "page_sums", "page_checks", "check_marks",
                            "walk_memos")),
            (_NEW_GENERATION, (scope,)))
        return Removed(**{name: n for (_, name), n in zip(_SCOPE_TABLES, changed[:-6],
                                                          strict=True)})
