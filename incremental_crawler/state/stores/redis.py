"""The networked state store: Redis, shared by crawl workers on many machines.

``INCREMENTAL_STATE_URI=redis://host:6379/0?prefix=incremental`` (also
``rediss://`` and ``unix:///path/redis.sock?db=0``). Every key starts with
the prefix; ``<s>`` is the scope, percent-quoted so it never holds a ``:``:

==============================  ==========================================
``P:meta``                      hash: ``layout`` and ``version`` of the layout,
                                ``gone_due`` (gone pages are in ``P:due``)
``P:scopes``                    set of the scopes stored
``P:pages:<s>``                 hash: page field → page state (JSON)
``P:due:<s>``                   sorted set: pages with a callback (gone ones
                                too), by next_visit
``P:links:<s>``                 hash: page field → the page's links record (opaque text)
``P:hosts:<s>``                 hash: host → lastmod/validator trust (JSON)
``P:items:<s>``                 hash: item key → latest url/fingerprint/simhash/page,
                                stored_at, born/died (JSON)
``P:itemver:<s>``               hash: item key → latest version number
``P:order:<s>``                 sorted set: item keys by first_seen (exports)
``P:hist:<s>:<item key>``       hash: version → fingerprint, time, change and data (JSON)
``P:bypage:<s>``                sorted set, all scores 0: ``page URL NUL item key``
                                of the live items last stored from a page, other
                                than the one keyed by its URL
``P:flush:<token>``             how many writes of a flush were applied (expires)
``P:crawls:<s>``                sorted set: crawl records (JSON) by start, newest N kept
``P:holds:<s>``                 sorted set: crawls holding the scope, by when each lapses
==============================  ==========================================

``P:crawls:<s>`` and ``P:holds:<s>`` came without a layout change (older
code ignores them). Repairs (``forget_page``, ``forget_host``,
``reset_scope``) run at once, each in one ``MULTI``; a reset deletes the
scope's keys of the kinds above (``P:holds:<s>`` excepted: holds lapse by
themselves; other ``P:<name>:<s>`` keys, such as a shared politeness budget
``P:budget:<host>``, are not this store's) and its ``P:hist:<s>:*`` keys,
and takes it out of ``P:scopes``.

A page field is the URL, plus ``\\0`` and the variant when there is one.
Records are JSON objects of their dataclass fields, defaults left out, so a
field added to :class:`PageState`, :class:`HostTrust` or :class:`ItemRecord`
is stored without a layout change and reads back as its default where it is
missing. Floats are POSIX times or durations, kept as whole seconds as the
SQLite store does.

The change feed: an item record names its source ``page`` only when that
is not its own key (the usual case costs nothing), and a tombstone is a
version with the fingerprint ``""``. A history entry names its ``change``
only when it is not what an entry without one reads as: ``new`` for version
1, else ``changed`` (so entries stored before the change feed read right).
A version with data prunes, in the same script, the versions
``INCREMENTAL_ITEM_HISTORY`` no longer keeps. An item's record also keeps
``born``, when its current live run began (its latest ``new`` version), and
``died``, when its latest tombstone was stored: ``iter_versions`` with
``since`` tells with them whether an item was live before the window.

``P:bypage:<s>`` finds the items of a gone page: an item keyed by its
page's URL needs no entry (one ``HGET`` of the items hash finds it, so a
crawl of such items creates no key); the others are members
``page NUL key`` while they are live, and the script moves an item to its
new page's member when it comes from another page, and drops it when it
is a tombstone. One sorted set per scope, all scores 0, read by lexical
range (from ``[page NUL`` to ``(page \\1``): adding or removing an item
costs O(log n) however many items its page has, and only when an item's
page changes (new, moved, gone or back), never when it is crawled again
from the same page; a page's items are one range, and one key per scope
costs no per-page key overhead.

Reads are one round-trip each (``get_pages``: one pipelined round-trip per
10,000 keys) on a ``redis.asyncio`` client, so the reactor never waits on
the network. Writes are staged in memory; :meth:`RedisStateStore.flush`
sends them all as one run of a Lua script, in staging order: atomic for
every reader and worker like a ``MULTI``/``EXEC``, but it stops at the first
write that fails (``EXEC`` would go on with the ones after it), so a page's
validators are never applied without the items staged before them
(state is never ahead of data). Redis keeps how many writes of a batch it applied under the
batch's token: a batch whose reply was lost is not applied twice when it is
sent again. Checks, redirects, flags and item versions are read-modify-write
upserts inside that script. Before applying anything, the script checks that
every key it will write is of the right type (or absent): a damaged key
fails the whole flush, so writes that can fail only that way (a page state,
a links record) are never split by one.

An export (``iter_versions``) is not a snapshot: Redis has no index by time,
so it notes the versions wanted, then reads them. Latest versions are read
again as they are then (an item written meanwhile yields its newer
version); with every version, one pruned meanwhile is left out.

Opening the store (once, before a crawl) and the synchronous reports
(``iter_items``, ``iter_versions``, ``item_history``, ``count_pages``) use a
blocking client.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import uuid
from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

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
    StoredVersion,
)
from incremental_crawler.state.stores.base import (
    PagesSummary,
    Removed,
    StateStore,
    StateStoreError,
    UrlRecord,
    crawl_history_setting,
    host_of,
    item_history_setting,
)
from incremental_crawler.uris import redacted

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = ["RedisStateStore", "parse_redis_uri"]

logger = logging.getLogger(__name__)

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
#: gone pages were added).
#: Version 2: ``P:bypage:<s>`` became a sorted set (a hash of JSON lists in
#: version 1; :meth:`RedisStateStore._migrate` converts it).
LAYOUT_VERSION = 2
DEFAULT_PREFIX = "incremental"
#: ``P:meta`` field: the gone pages of every scope are in ``P:due`` (see
#: :meth:`RedisStateStore._index_gone_pages`).
_GONE_INDEXED = "gone_due"
#: Keys per pipelined round-trip of a batched read, and fields per HMGET.
_READ_BATCH = 10_000
_HMGET_CHUNK = 1_000
#: Query parameters of the URI that redis-py understands, besides ``prefix``.
_REDIS_QUERY = frozenset({
    "db", "socket_timeout", "socket_connect_timeout", "socket_keepalive",
    "health_check_interval", "max_connections", "ssl_cert_reqs", "ssl_ca_certs",
    "ssl_certfile", "ssl_keyfile", "ssl_check_hostname", "protocol", "client_name",
})
#: A Redis that hangs must not hang the crawl; the URI may set other values.
_DEFAULT_TIMEOUTS = {"socket_connect_timeout": 5.0, "socket_timeout": 30.0}
#: Lua numbers are doubles and cjson prints 14 significant digits: larger
#: integers in a page record would not survive the check/redirect upsert.
_LUA_INT_LIMIT = 10**14

#: How long Redis remembers how much of a batch it applied (see _FLUSH_LUA).
_TOKEN_TTL = 86_400

# One flush is one run of this script: atomic for every other client, like a
# MULTI/EXEC, but it stops at the first write that fails (a damaged key, a
# record it cannot read) where EXEC would go on with the writes after it: a
# page's validators, staged after its items, are never applied when one of
# its items was not (state is never ahead of data). How many writes it applied is kept under
# the batch's token, so a batch whose reply was lost (a timeout, a cut after
# it was sent) is not applied twice when it is sent again.
#
# The upserts mirror the SQLite store's: a check, a failure or a redirect
# touches counters, status and (check) lastmod and schedule, (failure) the
# failures in a row and the schedule, never validators or fingerprints
# (only a 2xx updates them); an item gets the next version number of its key,
# and its versions beyond the history kept are pruned (as SQLite's
# _PRUNE_VERSIONS). A page flagged gone stays in the due index like any
# page with a callback, at its (rare) next visit: the re-seeder asks it
# again then, as a new page (it may have come back). An item write keeps the
# page index (P:bypage) in step: an item leaves the page it was listed under
# when it comes from another page or is a tombstone.
#
# Before any write, every key the batch writes is checked for its type
# (TYPES: by argument, the type the key must have unless absent). A page
# state or a links record can only fail on a key of another type, so the
# links record staged right before its page's state is committed with it or not
# at all; a damaged record read by a check, redirect or flags write still
# stops the batch at that write.
#
# KEYS: token, scopes set, tokens to forget. ARGV: number of scopes, the
# scopes, then the writes, each its name followed by ARITY[name] arguments.
_FLUSH_LUA = """
local ARITY = {host = 3, page = 5, check = 8, failure = 9, redirect = 7, item = 13,
               links = 3, unlink = 2, flags = 3}
local TYPES = {host = {'hash'}, page = {'hash', 'zset'}, check = {'hash', 'zset'},
               failure = {'hash', 'zset'},
               redirect = {'hash'}, item = {'hash', 'hash', 'zset', 'hash', 'zset'},
               links = {'hash'}, unlink = {'hash'}, flags = {'hash'}}
local OPS = {}
function OPS.host(a, i)
  redis.call('HSET', a[i], a[i + 1], a[i + 2])
end
function OPS.page(a, i)
  -- pages, due, field, record, next_visit ('' : not in the due index)
  redis.call('HSET', a[i], a[i + 2], a[i + 3])
  if a[i + 4] ~= '' then
    redis.call('ZADD', a[i + 1], a[i + 4], a[i + 2])
  else
    redis.call('ZREM', a[i + 1], a[i + 2])
  end
end
local function visit(a, i)
  -- pages, due, field, status, when; then for a check lastmod, interval,
  -- next_visit ('' keeps the stored value), for a redirect target, flag
  local raw = redis.call('HGET', a[i], a[i + 2])
  local page
  if raw then
    page = cjson.decode(raw)
    page.checks = (page.checks or 0) + 1
  else
    page = {first_seen = tonumber(a[i + 4]), checks = 1}
  end
  page.last_status = tonumber(a[i + 3])
  page.last_checked = tonumber(a[i + 4])
  return page
end
local function reindex(due, field, page)
  -- A page with a callback is due at its next visit (a gone one too: its
  -- next visit is its rare recheck).
  if page.callback then
    redis.call('ZADD', due, page.next_visit, field)
  end
end
function OPS.check(a, i)
  local page = visit(a, i)
  page.failures = nil  -- an answer ends a run of failures
  if a[i + 5] ~= '' then page.lastmod = tonumber(a[i + 5]) end
  local schedule = a[i + 6] ~= ''
  if schedule then
    page.interval = tonumber(a[i + 6])
    page.next_visit = tonumber(a[i + 7])
  end
  redis.call('HSET', a[i], a[i + 2], cjson.encode(page))
  if schedule then
    reindex(a[i + 1], a[i + 2], page)
  end
end
function OPS.failure(a, i)
  -- pages, due, field, status, when, failures, next_visit, callback,
  -- recipe ('': none); a page without a callback takes the one given
  local page = visit(a, i)
  page.failures = tonumber(a[i + 5])
  page.next_visit = tonumber(a[i + 6])
  if not page.callback and a[i + 7] ~= '' then
    page.callback = a[i + 7]
    page.recipe = nil
    if a[i + 8] ~= '' then page.recipe = a[i + 8] end
  end
  redis.call('HSET', a[i], a[i + 2], cjson.encode(page))
  reindex(a[i + 1], a[i + 2], page)
end
function OPS.redirect(a, i)
  local page = visit(a, i)
  page.flags = bit.bor(page.flags or 0, tonumber(a[i + 6]))
  page.redirect_to = a[i + 5]
  redis.call('HSET', a[i], a[i + 2], cjson.encode(page))
end
function OPS.flags(a, i)
  -- pages, field, flags to OR in: nothing else changes (the due index
  -- neither), nothing if unknown
  local raw = redis.call('HGET', a[i], a[i + 1])
  if raw then
    local page = cjson.decode(raw)
    page.flags = bit.bor(page.flags or 0, tonumber(a[i + 2]))
    redis.call('HSET', a[i], a[i + 1], cjson.encode(page))
  end
end
function OPS.links(a, i)
  -- links, field, record
  redis.call('HSET', a[i], a[i + 1], a[i + 2])
end
function OPS.unlink(a, i)
  -- links, field
  redis.call('HDEL', a[i], a[i + 1])
end
function OPS.item(a, i)
  -- items, itemver, order, hist, bypage, item key, record, when, history
  -- entry ('': none), change, page ('': none, or the item key), live ('1',
  -- '0': a tombstone), versions kept (0: all).
  -- Every read, decode and check comes first, then the writes: an item op
  -- that fails (a damaged record or version number) applies nothing.
  local items, itemver, order, hist, bypage = a[i], a[i + 1], a[i + 2], a[i + 3], a[i + 4]
  local key, record, when, entry = a[i + 5], a[i + 6], tonumber(a[i + 7]), a[i + 8]
  local live = a[i + 11] == '1'
  -- The page index lists a live item under its page when that is not its
  -- own key: where it was listed, where it goes.
  local was, now = false, false
  -- When its current live run began (its latest new version; unknown for
  -- records stored before these marks) and its latest tombstone's time.
  local born, died = when, nil
  local raw = redis.call('HGET', items, key)
  if raw then
    local old = cjson.decode(raw)
    if type(old.page) == 'string' and old.fingerprint ~= '' then was = old.page end
    if old.fingerprint ~= '' then born = old.born end
    died = old.died
  end
  if live then
    if a[i + 10] ~= '' then now = a[i + 10] end
  else
    born, died = nil, when
  end
  local version = 1
  local stored = redis.call('HGET', itemver, key)
  if stored then
    local number = tonumber(stored)
    if not number or number < 0 or number ~= math.floor(number) then
      error('the version of ' .. key .. ' in ' .. itemver .. ' is not a number: ' .. stored, 0)
    end
    version = number + 1
  end
  local prune = {}
  if entry ~= '' then
    local implied = 'changed'
    if version == 1 then implied = 'new' end
    if a[i + 9] ~= implied then
      -- Named only when it is not what an entry without one reads as.
      entry = '{"change":' .. cjson.encode(a[i + 9]) .. ',' .. string.sub(entry, 2)
    end
    local oldest = version - tonumber(a[i + 12])
    if oldest < version and oldest >= 1 then
      -- Versions are numbered, not every one has data and the limit may
      -- have been larger: every stored version <= oldest goes. The hash
      -- holds at most limit + 1 of them (this prune keeps it so).
      for _, field in ipairs(redis.call('HKEYS', hist)) do
        local number = tonumber(field)
        if not number then
          error('version ' .. field .. ' in ' .. hist .. ' is not a number', 0)
        end
        if number <= oldest then prune[#prune + 1] = field end
      end
    end
  end
  -- The record with the marks (it is a JSON object with a fingerprint).
  local marks = ''
  if born then marks = marks .. ',"born":' .. string.format('%d', born) end
  if died then marks = marks .. ',"died":' .. string.format('%d', died) end
  if marks ~= '' then record = string.sub(record, 1, -2) .. marks .. '}' end

  if was ~= now then
    -- Members page NUL key, all of score 0: a page's items are one range.
    if was then redis.call('ZREM', bypage, was .. '\\0' .. key) end
    if now then redis.call('ZADD', bypage, 0, now .. '\\0' .. key) end
  end
  redis.call('HSET', itemver, key, version)
  redis.call('HSET', items, key, record)
  redis.call('ZADD', order, 'NX', when, key)
  if entry ~= '' then
    redis.call('HSET', hist, version, entry)
    for _, field in ipairs(prune) do redis.call('HDEL', hist, field) end
  end
end
ARITY.crawl, TYPES.crawl = 4, {'zset'}
function OPS.crawl(a, i)
  -- crawls, started, record (JSON), records kept: the newest are
  redis.call('ZADD', a[i], a[i + 1], a[i + 2])
  redis.call('ZREMRANGEBYRANK', a[i], 0, -1 - tonumber(a[i + 3]))
end

local function wrong_type(first)
  local seen = {}
  local i = first
  while i <= #ARGV do
    local name = ARGV[i]
    for k, want in ipairs(TYPES[name]) do
      local key = ARGV[i + k]
      if not seen[key] then
        seen[key] = redis.call('TYPE', key).ok
      end
      if seen[key] ~= 'none' and seen[key] ~= want then
        return 'WRONGTYPE ' .. key .. ' is a ' .. seen[key] .. ', not a ' .. want
          .. ': nothing of the flush was applied'
      end
    end
    i = i + 1 + ARITY[name]
  end
end

for k = 3, #KEYS do redis.call('DEL', KEYS[k]) end
local done = redis.call('GET', KEYS[1])
if done then
  return {tonumber(done), 1}
end
local scopes = tonumber(ARGV[1])
local applied, i = 0, 2 + scopes
local failed = wrong_type(i)
if failed then
  redis.call('SET', KEYS[1], 0, 'EX', TOKEN_TTL)
  return {0, 0, failed}
end
if scopes > 0 then
  redis.call('SADD', KEYS[2], unpack(ARGV, 2, 1 + scopes))
end
while i <= #ARGV do
  local name = ARGV[i]
  local ok, err = pcall(OPS[name], ARGV, i + 1)
  if not ok then
    if type(err) == 'table' then err = err.err end
    failed = tostring(err)
    break
  end
  applied = applied + 1
  i = i + 1 + ARITY[name]
end
redis.call('SET', KEYS[1], applied, 'EX', TOKEN_TTL)
if failed then
  return {applied, 0, failed}
end
return {applied, 0}
""".replace("TOKEN_TTL", str(_TOKEN_TTL))


# Read-only: the latest version of items, each one's version number, history
# entry and record read at one instant. KEYS: per item its items hash,
# itemver hash and history key; ARGV: the item keys. Returns per item its
# version number, that version's entry and its record (nil where absent).
_LATEST_LUA = """
local out = {}
for n = 1, #ARGV do
  local version = redis.call('HGET', KEYS[3 * n - 1], ARGV[n])
  local entry = false
  if version then entry = redis.call('HGET', KEYS[3 * n], version) end
  out[3 * n - 2] = version
  out[3 * n - 1] = entry
  out[3 * n] = redis.call('HGET', KEYS[3 * n - 2], ARGV[n])
end
return out
"""

# Layout 1 → 2: KEYS[1], a page index of layout 1 (hash: page URL → JSON
# list of item keys), becomes the sorted set of layout 2; nothing if it is
# not a hash (converted already).
_BYPAGE_TO_ZSET_LUA = """
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
local flat = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
for j = 1, #flat, 2 do
  for _, key in ipairs(cjson.decode(flat[j + 1])) do
    redis.call('ZADD', KEYS[1], 0, flat[j] .. '\\0' .. key)
  end
end
return 1
"""

# Stores before gone pages were re-seeded left them out of the due index:
# KEYS[1] pages hash, KEYS[2] its due index; ARGV: page fields read as gone
# (with a callback) by a scan. Each is read again here, so a page written or
# forgotten since the scan is indexed only if it is still such a page.
_INDEX_GONE_LUA = """
for n = 1, #ARGV do
  local raw = redis.call('HGET', KEYS[1], ARGV[n])
  if raw then
    local ok, page = pcall(cjson.decode, raw)
    if ok and type(page) == 'table' and type(page.callback) == 'string'
        and bit.band(tonumber(page.flags) or 0, GONE_FLAG) ~= 0 then
      redis.call('ZADD', KEYS[2], tonumber(page.next_visit) or 0, ARGV[n])
    end
  end
end
return 0
""".replace("GONE_FLAG", str(int(PageFlags.GONE)))
#: Page fields per run of _INDEX_GONE_LUA.
_INDEX_GONE_CHUNK = 1_000

#: The kinds of ``P:<kind>:<s>`` keys a reset deletes: every one this store
#: writes per scope but ``holds`` (holds lapse by themselves).
_SCOPE_KINDS = ("pages", "due", "links", "hosts", "items", "itemver", "order", "bypage",
                "crawls")

#: Members asked per ZSCAN step, and steps at most (100 million members).
_SCAN_COUNT = 1000
_SCAN_ROUNDS = 100_000


def parse_redis_uri(uri: str) -> tuple[str, str]:
    """``redis://h:p/db?prefix=x`` → (URI for redis-py, key prefix).

    >>> parse_redis_uri("redis://127.0.0.1:6379/9?prefix=books")
    ('redis://127.0.0.1:6379/9', 'books')
    >>> parse_redis_uri("unix:///run/redis.sock?db=2")
    ('unix:///run/redis.sock?db=2', 'incremental')
    """
    def bad(why: str) -> StateStoreError:
        return StateStoreError(
            f"State store {redacted(uri)}: {why}; use "
            "redis://host:port/db?prefix=name (or rediss://, or "
            "unix:///path/redis.sock?db=N)"
        )

    try:
        parts = urlsplit(uri)
        port = parts.port  # parsed lazily: an invalid port raises here
    except ValueError as exc:
        raise bad(f"not a valid URI ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("redis", "rediss", "unix"):
        raise bad(f"scheme {parts.scheme!r} is not a Redis one")
    query, prefix = _split_query(parts.query, bad)
    if scheme == "unix":
        if not parts.path:
            raise bad("no socket path")
    else:
        if not parts.hostname:
            raise bad("no host")
        if port == 0:
            raise bad("port 0")
        db = parts.path.strip("/")
        # redis-py would silently fall back to db 0 on anything else.
        if db and not db.isdigit():
            raise bad(f"database {db!r} is not a number")
    for name, value in query:
        if name == "db" and not value.isdigit():
            raise bad(f"database {value!r} is not a number")
    # Not urlunsplit: it drops the empty authority of unix:///path.
    clean = f"{scheme}://{parts.netloc}{parts.path}"
    if query:
        clean += f"?{urlencode(query)}"
    return clean, prefix


def _split_query(
    query_string: str, bad: Callable[[str], StateStoreError],
) -> tuple[list[tuple[str, str]], str]:
    """The query's redis-py parameters, and the key prefix it names."""
    query: list[tuple[str, str]] = []
    prefixes: list[str] = []
    for name, value in parse_qsl(query_string, keep_blank_values=True):
        if name == "prefix":
            prefixes.append(value)
        elif name in _REDIS_QUERY:
            query.append((name, value))
        else:
            raise bad(f"unknown parameter {name!r}")
    if len(prefixes) > 1 or (prefixes and not prefixes[0]):
        raise bad("give one non-empty prefix")
    return query, prefixes[0] if prefixes else DEFAULT_PREFIX


def _key_part(scope: str) -> str:
    # Percent-quoted: no ':' inside, so P:hist:<s>:<key> splits one way only,
    # and common scope names (spider names) read as they are.
    return quote(scope, safe="")


def _page_field(key: PageKey) -> str:
    # Canonical URLs never contain NUL; a variant may contain anything.
    return f"{key.url}\0{key.variant}" if key.variant else key.url


def _page_key(scope: str, field: str) -> PageKey:
    url, _, variant = field.partition("\0")
    return PageKey(scope, url, variant)


def _page_range(url: str) -> tuple[bytes, bytes]:
    """ZRANGEBYLEX bounds of the page index members ``url NUL key`` of *url*."""
    head = url.encode()
    return b"[" + head + b"\0", b"(" + head + b"\1"


class RedisStateStore(StateStore):
    """State in Redis; see the module docstring."""

    def __init__(self, uri: str, *, prefix: str = DEFAULT_PREFIX,
                 history_limit: int = DEFAULT_SETTINGS["INCREMENTAL_ITEM_HISTORY"]) -> None:
        self.prefix = prefix
        self.history_limit = history_limit
        query = f"&prefix={prefix}" if "?" in uri else f"?prefix={prefix}"
        self.location = redacted(uri) + query
        #: Network round-trips to Redis so far (one per command or pipeline).
        self.roundtrips = 0
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
        # EVALSHA names a script by its SHA-1 (what SCRIPT LOAD returns).
        self._script_sha = hashlib.sha1(_FLUSH_LUA.encode(), usedforsecurity=False).hexdigest()
        self._fields = {cls: fields(cls) for cls in (PageState, HostTrust, ItemRecord)}
        # The fields a stored record may hold (the key ones are in the Redis key).
        self._names = {
            PageState: frozenset(f.name for f in self._fields[PageState]) - {"key"},
            HostTrust: frozenset(f.name for f in self._fields[HostTrust]) - {"scope", "host"},
        }
        self._closed = False
        # No retries: a transaction whose reply was lost may have run, and
        # running it twice would count checks and item versions twice.
        options: dict[str, Any] = {**_DEFAULT_TIMEOUTS, "retry": Retry(NoBackoff(), 0)}
        try:
            self._sync = redis.Redis.from_url(uri, **options)
            # Bound to the event loop of its first command (the reactor's).
            self._async = redis.asyncio.Redis.from_url(
                uri, **{**options, "retry": AsyncRetry(NoBackoff(), 0)}
            )
        except ValueError as exc:
            raise self._fail("bad URI", exc) from exc
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
        return store

    # -- keys and records ------------------------------------------------------

    def _key(self, kind: str, scope: str) -> str:
        return f"{self.prefix}:{kind}:{_key_part(scope)}"

    def _hist_key(self, scope: str, item_key: str) -> str:
        return f"{self.prefix}:hist:{_key_part(scope)}:{item_key}"

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

    def _page(self, key: PageKey, raw: bytes | str) -> PageState:
        return self._decode(PageState, raw, key=key)

    # -- opening ---------------------------------------------------------------

    def _fail(self, what: str, exc: BaseException | None = None) -> StateStoreError:
        detail = f": {exc}" if exc else ""
        return StateStoreError(f"State store {self.location}: {what}{detail}")

    def _check_layout(self) -> None:
        """Refuse a prefix holding a newer or foreign layout; mark a new one."""
        meta = f"{self.prefix}:meta"
        try:
            pipe = self._sync.pipeline(transaction=False)
            pipe.type(meta)
            pipe.hgetall(meta)
            pipe.exists(f"{self.prefix}:scopes")
            # Loaded now, so that the first flush is one round-trip.
            pipe.script_load(_FLUSH_LUA)
            pipe.info("memory")
            kind, found, has_scopes, _, memory = pipe.execute(raise_on_error=False)
            self.roundtrips += 1
            if isinstance(kind, Exception):
                raise kind
            # State keys never expire: only an allkeys-* policy evicts them,
            # silently (an items hash gone, its pages' validators kept).
            policy = ("" if isinstance(memory, Exception)
                      else str(memory.get("maxmemory_policy", "")))
            if policy.startswith("allkeys"):
                raise self._fail(
                    f"Redis evicts keys when full (maxmemory-policy {policy}): stored "
                    "state would vanish silently; use a Redis with maxmemory-policy "
                    "noeviction (or volatile-*)"
                )
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
                pipe.hsetnx(meta, _GONE_INDEXED, 1)
                pipe.hgetall(meta)
                found = pipe.execute()[-1]
                self.roundtrips += 1
            elif kind != b"hash":
                found = {}
        except redis.RedisError as exc:
            raise self._fail(
                "cannot be reached or read (is Redis running at this address?)", exc
            ) from exc
        layout = found.get(b"layout", b"").decode(errors="replace")
        version = found.get(b"version", b"").decode(errors="replace")
        if layout != LAYOUT or not version.isdigit():
            raise self._fail(
                f"{meta} does not describe an incremental_crawler state store "
                f"(layout {layout!r}, version {version!r}); the prefix belongs to "
                "something else: choose another with ?prefix=..."
            )
        if int(version) > LAYOUT_VERSION:
            raise self._fail(
                f"has layout version {version}, newer than this code knows "
                f"({LAYOUT_VERSION}); upgrade incremental_crawler"
            )
        if int(version) < LAYOUT_VERSION:
            self._migrate(int(version))
        if _GONE_INDEXED.encode() not in found:
            self._index_gone_pages()

    def _migrate(self, version: int) -> None:
        """Bring a prefix of layout *version* to this one.

        1 → 2: each scope's page index, a hash of JSON lists, becomes the
        sorted set of ``page NUL key``. One script per scope converts it
        (a second worker opening the store at once finds it converted).
        """
        meta = f"{self.prefix}:meta"
        try:
            if version < 2:
                for key in self._scan_keys(f"{_glob(self.prefix)}:bypage:*"):
                    self.roundtrips += 1
                    self._sync.eval(_BYPAGE_TO_ZSET_LUA, 1, key)
            self.roundtrips += 1
            self._sync.hset(meta, "version", LAYOUT_VERSION)
        except redis.RedisError as exc:
            raise self._fail(f"migrating the layout from version {version} failed", exc) from exc
        logger.info("State store %s: layout migrated from version %d to %d",
                    self.location, version, LAYOUT_VERSION)

    def _index_gone_pages(self) -> None:
        """Put the gone pages of every scope in ``P:due``, once per prefix.

        Stores before gone pages were re-seeded kept them out of the due
        index: left so, such a page would never be checked again. Not a
        layout change (code before it opens the prefix, and skips gone pages
        itself); ``P:meta`` notes it done. A worker opening the store
        meanwhile does the same (idempotent).
        """
        meta = f"{self.prefix}:meta"
        head = f"{self.prefix}:pages:"
        indexed = 0
        try:
            for pages in self._scan_keys(f"{_glob(head)}*"):
                due = f"{self.prefix}:due:{pages[len(head):]}"
                gone = [field for field, raw in self._hscan(pages) if _gone_page(raw)]
                for start in range(0, len(gone), _INDEX_GONE_CHUNK):
                    self.roundtrips += 1
                    self._sync.eval(_INDEX_GONE_LUA, 2, pages, due,
                                    *gone[start:start + _INDEX_GONE_CHUNK])
                indexed += len(gone)
            self.roundtrips += 1
            self._sync.hset(meta, _GONE_INDEXED, 1)
        except redis.RedisError as exc:
            raise self._fail("indexing the gone pages for their recheck failed", exc) from exc
        if indexed:
            logger.info("State store %s: %d gone pages indexed for their recheck",
                        self.location, indexed)

    # -- async plumbing --------------------------------------------------------

    async def _run(self, pipe: Any) -> list[Any]:
        self.roundtrips += 1
        try:
            return await pipe.execute()
        except redis.RedisError as exc:
            raise self._fail("Redis command failed", exc) from exc

    async def _call(self, *args: Any) -> Any:
        self.roundtrips += 1
        try:
            return await self._async.execute_command(*args)
        except redis.RedisError as exc:
            raise self._fail("read failed", exc) from exc

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
        raw = await self._call("HGET", self._key("pages", key.scope), _page_field(key))
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
            by_scope: dict[str, list[PageKey]] = {}
            for key in batch:
                by_scope.setdefault(key.scope, []).append(key)
            pipe = self._async.pipeline(transaction=False)
            order: list[list[PageKey]] = []
            for scope, scope_keys in by_scope.items():
                for at in range(0, len(scope_keys), _HMGET_CHUNK):
                    chunk = scope_keys[at:at + _HMGET_CHUNK]
                    pipe.hmget(self._key("pages", scope), [_page_field(k) for k in chunk])
                    order.append(chunk)
            for chunk, values in zip(order, await self._run(pipe), strict=True):
                for key, raw in zip(chunk, values, strict=True):
                    if raw is not None:
                        found[key] = self._page(key, raw)
        return found

    async def get_links(self, key: PageKey) -> str | None:
        for staged in (self._links, self._flushing_links):
            if key in staged:
                return staged[key]
        raw = await self._call("HGET", self._key("links", key.scope), _page_field(key))
        return None if raw is None else raw.decode()

    async def get_due(self, scope: str, now: float, limit: int,
                      offset: int = 0) -> list[PageState]:
        if limit <= 0:
            return []
        # Members of one score are in lexical order: a total order to page through.
        upto = "+inf" if now == float("inf") else int(now)
        page_fields = await self._call(
            "ZRANGE", self._key("due", scope), "-inf", upto, "BYSCORE", "LIMIT", offset, limit
        )
        if not page_fields:
            return []
        values = await self._call("HMGET", self._key("pages", scope), *page_fields)
        due = []
        for field, raw in zip(page_fields, values, strict=True):
            if raw is None:
                continue
            state = self._page(_page_key(scope, field.decode()), raw)
            # The sorted set only holds such pages; checked again so that a
            # record written by another version cannot re-seed a bad page.
            if state.callback is not None:
                due.append(state)
        return due

    async def summarize_pages(self, scope: str, *, after: float, upto: float,
                              checked_before: float,
                              exclude_callbacks: Collection[str] = ()) -> PagesSummary:
        # The due index holds exactly the pages with a callback, scored by
        # next visit. ZSCAN walks it in O(1) per member (ZRANGE with an
        # offset would cost O(offset) per page of results); it may return a
        # member twice while Redis resizes the set, hence the set of seen.
        count = size = 0
        first: float | None = None
        seen: set[bytes] = set()
        cursor = 0
        for _ in range(_SCAN_ROUNDS):
            cursor, pairs = await self._call("ZSCAN", self._key("due", scope), cursor,
                                             "COUNT", _SCAN_COUNT)
            fields = [member for member, score in pairs
                      if after < float(score) <= upto and member not in seen]
            seen.update(fields)
            if fields:
                values = await self._call("HMGET", self._key("pages", scope), *fields)
                for field, raw in zip(fields, values, strict=True):
                    if raw is None:
                        continue
                    state = self._page(_page_key(scope, field.decode()), raw)
                    if (state.callback is None or state.callback in exclude_callbacks
                            or state.last_checked >= checked_before):
                        continue
                    count += 1
                    size += state.size
                    first = state.next_visit if first is None else min(first, state.next_visit)
            if int(cursor) == 0:
                return PagesSummary(count, size, first)
        raise self._fail(f"scanning the due pages of {scope!r} did not finish")

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
        key = state.key
        value = self._encode(state, ("key",), lua_safe=True)
        # get_due's index: the pages that know their callback (gone ones
        # too: their next visit is their rare recheck).
        indexed = state.callback is not None
        self._stage(key.scope, (
            "page", self._key("pages", key.scope), self._key("due", key.scope),
            _page_field(key), value, int(state.next_visit) if indexed else "",
        ))
        self._pages[key] = state

    def stage_check(
        self, key: PageKey, status: int, when: float, *, lastmod: float | None = None,
        schedule: tuple[float, float] | None = None,
    ) -> None:
        interval, next_visit = (
            ("", "") if schedule is None else (int(schedule[0]), int(schedule[1])))
        self._stage(key.scope, (
            "check", self._key("pages", key.scope), self._key("due", key.scope),
            _page_field(key), status, int(when),
            "" if lastmod is None else int(lastmod), interval, next_visit,
        ))

    def stage_failure(
        self, key: PageKey, status: int, when: float, *, failures: int, next_visit: float,
        callback: str | None = None, recipe: str | None = None,
    ) -> None:
        self._stage(key.scope, (
            "failure", self._key("pages", key.scope), self._key("due", key.scope),
            _page_field(key), status, int(when), failures, int(next_visit),
            callback or "", recipe or "",
        ))

    def stage_redirect(self, key: PageKey, target: str, status: int, when: float) -> None:
        self._stage(key.scope, (
            "redirect", self._key("pages", key.scope), self._key("due", key.scope),
            _page_field(key), status, int(when), target, int(PageFlags.REDIRECTED),
        ))

    def stage_links(self, key: PageKey, data: str | None) -> None:
        links = self._key("links", key.scope)
        if data is None:
            self._stage(key.scope, ("unlink", links, _page_field(key)))
        else:
            self._stage(key.scope, ("links", links, _page_field(key), data))
        self._links[key] = data

    def stage_flags(self, key: PageKey, add: int) -> None:
        self._stage(key.scope, ("flags", self._key("pages", key.scope), _page_field(key),
                                int(add)))
        staged = self._staged_page(key)
        if staged is not None:
            # What the flush will leave: the staged state, then the flags.
            self._pages[key] = staged.copy(flags=int(staged.flags) | int(add))

    def stage_item(self, record: ItemRecord) -> None:
        scope, key = record.scope, record.key
        # The URL and the page usually are the key: not stored twice (they
        # read back as the key). The change is the version's: in its entry.
        skip = ["scope", "key", "data", "change"]
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
        self._item_fps[scope, key] = record.fingerprint

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
        args: list[Any] = [len(scopes), *sorted(scopes)]
        for op in ops:
            args.extend(op)
        self.roundtrips += 1
        try:
            try:
                reply = await self._async.evalsha(self._script_sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                # Not run (a restarted Redis forgot it): sent in full once.
                self.roundtrips += 1
                reply = await self._async.eval(_FLUSH_LUA, len(keys), *keys, *args)
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

    def _token_key(self, token: str) -> str:
        return f"{self.prefix}:flush:{token}"

    async def close(self) -> None:
        try:
            await self.flush()
        finally:
            if not self._closed:
                self._closed = True
                self._sync.close()
                await self._async.aclose()

    # -- reports and exports (synchronous) ---------------------------------

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
        scopes = self._stored_scopes() if scope is None else [scope]
        pipe = self._sync.pipeline(transaction=False)
        for name in scopes:
            pipe.hlen(self._key("pages", name))
        return sum(self._sync_run(pipe)) if scopes else 0

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

    async def release_scope(self, scope: str, holder: str) -> None:
        await self._call("ZREM", self._key("holds", scope), holder)

    def scope_holders(self, scope: str, now: float) -> dict[str, float]:
        pipe = self._sync.pipeline(transaction=False)
        pipe.zrangebyscore(self._key("holds", scope), f"({now!r}", "+inf", withscores=True)
        [pairs] = self._sync_run(pipe)
        return {holder.decode(): float(expires) for holder, expires in pairs}

    # -- read-outs -----------------------------------------------------------

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

    def _scan_keys(self, match: str) -> list[str]:
        """Every key matching the glob *match* (bounded steps)."""
        found: list[str] = []
        cursor = 0
        for _ in range(_SCAN_ROUNDS):
            self.roundtrips += 1
            try:
                reply: Any = self._sync.scan(cursor, match=match, count=_SCAN_COUNT)
            except redis.RedisError as exc:
                raise self._fail("read failed", exc) from exc
            cursor, keys = reply
            found.extend(k.decode() for k in keys)
            if cursor == 0:
                return sorted(set(found))
        raise self._fail(f"scanning the keys {match} did not finish")

    def scopes(self) -> list[str]:
        return self._stored_scopes()

    def iter_pages(self, scope: str) -> Iterator[PageState]:
        for field, raw in self._hscan(self._key("pages", scope)):
            yield self._page(_page_key(scope, field.decode()), raw)

    def iter_hosts(self, scope: str) -> Iterator[HostTrust]:
        pipe = self._sync.pipeline(transaction=False)
        pipe.hgetall(self._key("hosts", scope))
        [hosts] = self._sync_run(pipe)
        for host in sorted(hosts):
            yield self._decode(HostTrust, hosts[host], scope=scope, host=host.decode())

    def _page_fields(self, scope: str, url: str) -> list[str]:
        """The stored page fields of *url* (its variants)."""
        fields_ = [f.decode() for f, _ in self._hscan(
            self._key("pages", scope), match=_glob(url) + "\0*")]
        pipe = self._sync.pipeline(transaction=False)
        pipe.hexists(self._key("pages", scope), url)
        [plain] = self._sync_run(pipe)
        return ([url] if plain else []) + sorted(f for f in fields_ if f.startswith(url + "\0"))

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
        page_fields = self._page_fields(scope, url)
        items = self._items_by_page(scope, {url}, live=True)
        pipe = self._sync.pipeline(transaction=False)
        for field in page_fields:
            pipe.hget(self._key("pages", scope), field)
            pipe.hget(self._key("links", scope), field)
        for key in items:
            pipe.hget(self._key("itemver", scope), key)
        replies = self._sync_run(pipe)
        pages, links = [], {}
        for n, field in enumerate(page_fields):
            raw, record = replies[2 * n], replies[2 * n + 1]
            page_key = _page_key(scope, field)
            if raw is not None:
                pages.append(self._page(page_key, raw))
            if record is not None:
                links[page_key.variant] = record.decode()
        versions = replies[2 * len(page_fields):]
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

    def _forget(self, scope: str, page_fields: list[str], urls: Collection[str],
                host: str | None = None) -> Removed:
        items = self._items_by_page(scope, urls, live=False)
        hist = [self._hist_key(scope, key) for key in items]
        pipe = self._sync.pipeline(transaction=True)
        # What each reply counts (None: nothing), in the pipeline's order.
        kinds: list[str | None] = []
        for key in hist:
            pipe.hlen(key)
            kinds.append("versions")
        if page_fields:
            pipe.hdel(self._key("pages", scope), *page_fields)
            pipe.zrem(self._key("due", scope), *page_fields)
            pipe.hdel(self._key("links", scope), *page_fields)
            kinds += ["pages", None, "links"]
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
            kinds.append("hosts")
        counts = dict.fromkeys(Removed._fields, 0)
        for kind, n in zip(kinds, self._sync_run(pipe), strict=True):
            if kind is not None:
                counts[kind] += int(n)
        return Removed(**counts)

    def forget_page(self, scope: str, url: str) -> Removed:
        return self._forget(scope, self._page_fields(scope, url), {url})

    def forget_host(self, scope: str, host: str) -> Removed:
        page_fields = sorted(f.decode() for f, _ in self._hscan(self._key("pages", scope))
                             if host_of(_page_key(scope, f.decode()).url) == host)
        urls = {_page_key(scope, f).url for f in page_fields}
        return self._forget(scope, page_fields, urls, host)

    def _scope_keys(self, scope: str) -> tuple[list[str], list[str]]:
        """The scope's keys of this store's kinds (holds excepted), and its
        history keys. Only these kinds: other ``P:<name>:<s>`` keys may be
        anybody's (a shared politeness budget is ``P:budget:<host>``, and a
        scope may be named after its host)."""
        kinds = [self._key(kind, scope) for kind in _SCOPE_KINDS]
        hist = self._scan_keys(f"{_glob(self.prefix)}:hist:{_glob(_key_part(scope))}:*")
        return kinds, hist

    def _count(self, scope: str, hist: list[str], pipe: Any) -> None:
        pipe.hlen(self._key("pages", scope))
        pipe.hlen(self._key("links", scope))
        pipe.hlen(self._key("items", scope))
        for key in hist:
            pipe.hlen(key)
        pipe.hlen(self._key("hosts", scope))
        pipe.zcard(self._key("crawls", scope))

    @staticmethod
    def _counted(replies: list[int], hist: list[str]) -> Removed:
        pages, links, items, *rest = replies
        return Removed(pages, links, items, sum(rest[:len(hist)]), *rest[len(hist):])

    def count_scope(self, scope: str) -> Removed:
        _, hist = self._scope_keys(scope)
        pipe = self._sync.pipeline(transaction=True)
        self._count(scope, hist, pipe)
        return self._counted(self._sync_run(pipe), hist)

    def reset_scope(self, scope: str) -> Removed:
        kinds, hist = self._scope_keys(scope)
        pipe = self._sync.pipeline(transaction=True)
        self._count(scope, hist, pipe)
        for start in range(0, len(kinds) + len(hist), _HMGET_CHUNK):
            pipe.delete(*(kinds + hist)[start:start + _HMGET_CHUNK])
        pipe.srem(f"{self.prefix}:scopes", scope)
        replies = self._sync_run(pipe)
        return self._counted(replies[:5 + len(hist)], hist)


def _stored_version(scope: str, item_key: str, number: int,
                    stored: dict[str, Any]) -> StoredVersion:
    """A history entry read back. It names its change only when that is not
    the one an entry without it reads as (what entries stored before the
    change feed read as)."""
    change = stored.get("change") or (Change.NEW if number == 1 else Change.CHANGED)
    return StoredVersion(scope, item_key, number, str(change), stored["stored_at"],
                         stored["fingerprint"], stored["data"])


def _gone_page(raw: bytes) -> bool:
    """Whether a stored page record is a gone page with a callback (one the
    re-seeder rechecks); an unreadable one is not."""
    try:
        page = json.loads(raw)
    except ValueError:
        return False
    return (isinstance(page, dict) and isinstance(page.get("callback"), str)
            and isinstance(page.get("flags"), int) and bool(page["flags"] & PageFlags.GONE))


def _glob(text: str) -> str:
    """*text* matched literally in a Redis glob pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
