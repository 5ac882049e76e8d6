"""The Redis store's own Lua scripts, put together from the ``.lua`` files of
this package and the libraries of :mod:`~incremental_crawler.state.stores.redis.pages`
and :mod:`~incremental_crawler.state.stores.packed` (the flag line first), and
the SHA-1s EVALSHA names them by."""

from __future__ import annotations

import hashlib

from incremental_crawler.lua import load_script
from incremental_crawler.state.stores.packed import (
    LUA_CODEC as PAGE_CODEC,
)
from incremental_crawler.state.stores.redis.pages import (
    BUCKET_LOAD,
    DUE_INDEX_LUA,
    DUE_READ_LUA,
    LUA_BUCKET_PAGES,
    LUA_READS,
    LUA_SUMS,
    LUA_WRITES,
    MAX_SPLITS,
    READ_PAGES_LUA,
    SUMMARY_LUA,
    SUMS_BUILD_LUA,
    SUMS_FORGET_LUA,
    SUMS_MARK_LUA,
    SUMS_READ_LUA,
)
from incremental_crawler.state.stores.redis.pages import (
    LUA_BUCKETS as PAGE_BUCKETS,
)

__all__: list[str] = []

#: Where this package's Lua scripts are (``.lua`` files, read by :func:`load_script`).
_LUA_PACKAGE = "incremental_crawler.state.stores.redis"

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
# touches counters, status and (check) lastmod, schedule and the validators
# a 304 brought, (failure) the failures in a row and the schedule, never
# fingerprints (only a 2xx updates them); an item gets the next version number of its key,
# and its versions beyond the history kept are pruned (as SQLite's
# _PRUNE_VERSIONS). A page flagged gone stays in the due index like any
# page with a callback, at its (rare) next visit: the re-seeder asks it
# again then, as a new page (it may have come back). An item write keeps the
# page index (P:bypage) in step: an item leaves the page it was listed under
# when it comes from another page or is a tombstone.
#
# Page writes go to the page's bucket (see pages.py), chosen in the
# script from the host's bucket count. Before any write, the hosts whose
# pages would outgrow their buckets are split (a split moves records
# between buckets of one host, changing nothing a reader sees, and is
# skipped when its new bucket's key is taken); no write changes the count.
# A write of a page with a callback lowers its bucket's score in the
# revisit index to the page's next visit if that is earlier (a lower bound
# of the bucket's next visits, never above one).
#
# Before any write, every key the batch writes is checked for its type
# (the keys of each write: keys_of, with the type each must have unless
# absent). A page state or a links record can only fail on a key of
# another type, so the links record staged right before its page's state
# is committed with it or not at all; a damaged record read by a check,
# redirect or flags write still stops the batch at that write.
#
# KEYS: token, scopes set, the writer's scope's holds key, tokens to forget.
# ARGV: the key prefix, the server's hash-max-listpack-value, the writer's
# hold ('': no check; else nothing is written, {0, 2}, unless it is there
# and not lapsed), the number of scopes, the scopes, then
# the writes, each its name followed by ARITY[name] arguments; a page
# write's first three are the scope's and the host's key parts and the
# page's field.
_FLUSH_LUA = LUA_WRITES + PAGE_CODEC + PAGE_BUCKETS + LUA_BUCKET_PAGES + LUA_SUMS + (
    load_script(_LUA_PACKAGE, "flush.lua")).replace("TOKEN_TTL", str(_TOKEN_TTL)).replace(
    "MAX_SPLITS", str(MAX_SPLITS)).replace("BUCKET_LOAD", str(BUCKET_LOAD))


# Read-only: the latest version of items, each one's version number, history
# entry and record read at one instant. KEYS: per item its items hash,
# itemver hash and history key; ARGV: the item keys. Returns per item its
# version number, that version's entry and its record (nil where absent).
_LATEST_LUA = LUA_READS + load_script(_LUA_PACKAGE, "latest.lua")

# Layout 1 → 2: KEYS[1], a page index of layout 1 (hash: page URL → JSON
# list of item keys), becomes the sorted set of layout 2; nothing if it is
# not a hash (converted already).
_BYPAGE_TO_ZSET_LUA = LUA_WRITES + load_script(_LUA_PACKAGE, "bypage_to_zset.lua")

# A migration's lock is released by its holder only (KEYS[1]: the lock,
# ARGV[1]: the holder's token).
_UNLOCK_LUA = LUA_WRITES + load_script(_LUA_PACKAGE, "unlock.lua")

# ... and renewed by its holder only (ARGV[2]: seconds): 0 when it is not
# held by ARGV[1] any more (it lapsed, and maybe another process took it).
_RENEW_LUA = LUA_WRITES + load_script(_LUA_PACKAGE, "renew.lua")


# A repair's raise of the write generations it deletes pages of (see
# generation.lua), in the repair's MULTI. Allowed above maxmemory, as the
# reset's deletions are: a reset that Redis refused for one INCR would
# leave the memory full.
_GENERATION_LUA = "#!lua flags=allow-oom\n" + load_script(_LUA_PACKAGE, "generation.lua")


def _sha1(script: str) -> str:
    """What EVALSHA names a script by (what SCRIPT LOAD returns)."""
    return hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest()


#: Loaded when the store opens: the flush, then the read scripts.
_SCRIPTS = (_FLUSH_LUA, READ_PAGES_LUA, DUE_READ_LUA, SUMMARY_LUA, DUE_INDEX_LUA,
            SUMS_READ_LUA)
_READ_PAGES_SHA, _DUE_READ_SHA, _SUMMARY_SHA, _DUE_INDEX_SHA, _SUMS_READ_SHA = (
    _sha1(script) for script in (READ_PAGES_LUA, DUE_READ_LUA, SUMMARY_LUA, DUE_INDEX_LUA,
                                 SUMS_READ_LUA))
# Run now, by repairs, a migration and a crawl taking its scope (see
# pages.py): sent whole (EVAL), rarely.
_SUMS_BUILD_LUA, _SUMS_FORGET_LUA, _SUMS_MARK_LUA = SUMS_BUILD_LUA, SUMS_FORGET_LUA, SUMS_MARK_LUA


# A crawl's (a worker's, a repair's) refresh of its hold, in both layouts
# (one key): sent whole (EVAL), every twenty seconds at most.
HOLD_LUA = LUA_WRITES + load_script(_LUA_PACKAGE, "hold.lua")


# The cluster layout's scripts (see cluster.py and each .lua file): every
# key each touches is in its KEYS, all in one slot.
CLUSTER_ITEMS_LUA = LUA_WRITES + load_script(_LUA_PACKAGE, "cluster_items.lua").replace(
    "TOKEN_TTL", str(_TOKEN_TTL))
# A host group's sums added to, checked: the group's write and repair scripts.
_GROUP_SUMS = load_script(_LUA_PACKAGE, "group_sums.lua")
CLUSTER_HOST_LUA = LUA_WRITES + PAGE_CODEC + PAGE_BUCKETS + _GROUP_SUMS + load_script(
    _LUA_PACKAGE, "cluster_host.lua").replace("TOKEN_TTL", str(_TOKEN_TTL))
CLUSTER_SCOPE_LUA = LUA_WRITES + load_script(_LUA_PACKAGE, "cluster_scope.lua").replace(
    "TOKEN_TTL", str(_TOKEN_TTL))
CLUSTER_READ_PAGES_LUA = LUA_READS + PAGE_BUCKETS + load_script(
    _LUA_PACKAGE, "cluster_read_pages.lua")
CLUSTER_DUE_INDEX_LUA = LUA_READS + load_script(_LUA_PACKAGE, "cluster_due_index.lua")
CLUSTER_DUE_READ_LUA = LUA_READS + PAGE_CODEC + load_script(_LUA_PACKAGE, "cluster_due_read.lua")
CLUSTER_SUMMARY_LUA = LUA_READS + PAGE_CODEC + load_script(_LUA_PACKAGE, "cluster_summary.lua")
CLUSTER_RAISE_LUA = LUA_WRITES + load_script(_LUA_PACKAGE, "cluster_raise.lua")
CLUSTER_FORGET_LUA = LUA_WRITES + PAGE_CODEC + PAGE_BUCKETS + _GROUP_SUMS + load_script(
    _LUA_PACKAGE, "cluster_forget.lua").replace("TOKEN_TTL", str(_TOKEN_TTL))
CLUSTER_BYPAGE_LUA = LUA_WRITES + load_script(_LUA_PACKAGE, "cluster_bypage.lua")
CLUSTER_SUMS_COARSE_LUA = LUA_READS + load_script(_LUA_PACKAGE, "cluster_sums_coarse.lua")
CLUSTER_SETTLE_LUA = LUA_WRITES + load_script(_LUA_PACKAGE, "cluster_settle.lua")
#: Loaded on every primary when a store of the cluster layout opens.
CLUSTER_SCRIPTS = (CLUSTER_ITEMS_LUA, CLUSTER_HOST_LUA, CLUSTER_SCOPE_LUA,
                   CLUSTER_READ_PAGES_LUA, CLUSTER_DUE_INDEX_LUA, CLUSTER_DUE_READ_LUA,
                   CLUSTER_SUMMARY_LUA, CLUSTER_RAISE_LUA, CLUSTER_BYPAGE_LUA,
                   CLUSTER_SUMS_COARSE_LUA, CLUSTER_SETTLE_LUA)
# A migration's (cluster layout 7 -> 8), once a batch of a host group's
# hosts (sent whole: EVAL).
CLUSTER_REGROUP_LUA = LUA_WRITES + PAGE_CODEC + load_script(_LUA_PACKAGE, "cluster_regroup.lua")
# Run in take_scope's MULTI (sent whole: EVAL, rarely).
CLUSTER_SUMS_MARK_LUA = LUA_WRITES + load_script(_LUA_PACKAGE, "cluster_sums_mark.lua")
