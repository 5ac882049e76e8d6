"""Where the Redis store keeps page states: per host, in small buckets.

A scope's pages are grouped by host (:func:`host_of`), and a host's pages
are spread over *buckets* of about :data:`BUCKET_LOAD` pages each, by a
hash of the URL. Small, so that Redis keeps each one as a flat listpack (up
to ``hash-max-listpack-entries``, 128 by default, entries of up to
``hash-max-listpack-value``, 64 bytes): a few bytes of overhead a page where
a hash table spends ~80. One entry longer than that would turn its whole
bucket into a hash table for good, so a bucket is two hashes: ``pg`` for
the pages whose field and record both fit, ``pgl`` (rarely there) for the
others (a long URL, a long recipe). A host's bucket count grows by *linear
hashing*: when its pages exceed ``BUCKET_LOAD`` times its buckets, the next
bucket in turn splits in two (about half its pages move to a new one), so a
host grows one small step at a time and never rehashes all at once.

Every key of a host holds the same ``{scope|host}`` hash tag: in a Redis
Cluster, a host's pages, links and bucket count are in one hash slot (see
``docs/capacity.md``).

Within a host, a page is its *field*: the URL less ``scheme://host``, with
one letter for the scheme (``s``: https, ``h``: http, ``u``: anything else,
then the whole URL), then NUL and the variant if it has one. All variants
of a URL are in one bucket (the hash is of the URL part).

The bucket a field is in depends on the host's bucket count, stored with
the host: the scripts (flush, reads) look it up and choose the bucket in
Redis, in the same step as they read or write it, so a split by another
worker can never make a read miss a page. :func:`bucket_of` is the same
choice in Python, for repairs (which run while no crawl holds the scope).

The revisit index is per scope and counts buckets, not pages: a sorted set
of the buckets holding pages with a callback, each scored by a *lower
bound* of their pages' next visits. A write can only lower a bucket's score
(``ZADD LT``), so the bound never misses a page; reads that look at every
page of a bucket (a summary, a split) set it to the exact minimum again.
The next visit itself lives in the page record: the index costs a few bytes
per bucket, not ~50 a page.
"""

from __future__ import annotations

import functools
import hashlib
from urllib.parse import quote, unquote

from incremental_crawler.hosts import host_of
from incremental_crawler.lua import load_script
from incremental_crawler.state.records import PageKey
from incremental_crawler.state.stores.packed import LUA_CODEC

__all__ = [
    "BUCKET_LOAD", "DUE_INDEX_LUA", "DUE_READ_LUA", "LUA_BUCKETS", "LUA_BUCKET_PAGES",
    "LUA_READS", "LUA_SUMS", "LUA_WRITES",
    "READ_PAGES_LUA", "SUMMARY_LUA", "SUMS_BUILD_LUA", "SUMS_FORGET_LUA", "SUMS_MARK_LUA",
    "SUMS_READ_LUA",
    "bucket_of", "host_part", "page_field", "page_key_of", "url_of",
]

#: Where this module's Lua scripts are (``.lua`` files, read by :func:`load_script`).
_LUA_PACKAGE = "incremental_crawler.state.stores.redis"

#: Pages per bucket, on average, before a host's buckets grow. Buckets not
#: yet split in a round hold up to twice as many, so 40 keeps nearly every
#: bucket under Redis's default of 128 listpack entries.
BUCKET_LOAD = 40
#: Buckets a flush splits per host at most (a flush of many new pages of
#: one host leaves the rest to the next flushes).
MAX_SPLITS = 512

_SCHEMES = (("https://", "s"), ("http://", "h"))


@functools.lru_cache(maxsize=4096)
def host_part(host: str) -> str:
    """The host as it appears in keys (percent-quoted: no ``|``, ``{`` or ``}``)."""
    return quote(host, safe="")


def _url_part(host: str, url: str) -> str:
    for scheme, letter in _SCHEMES:
        head = scheme + host
        if url.startswith(head):
            return letter + url[len(head):]
    return "u" + url


def page_field(key: PageKey) -> tuple[str, str]:
    """``(host, field)`` of a page: its host and its field in the host's buckets."""
    host = host_of(key.url)
    part = _url_part(host, key.url)
    return host, f"{part}\0{key.variant}" if key.variant else part


def url_field(url: str) -> tuple[str, str]:
    """``(host, URL part)`` of *url*: its field without a variant."""
    host = host_of(url)
    return host, _url_part(host, url)


def url_of(host: str, part: str) -> str:
    """The URL of a field's URL part (:func:`url_field` reversed)."""
    letter, rest = part[:1], part[1:]
    if letter == "s":
        return "https://" + host + rest
    if letter == "h":
        return "http://" + host + rest
    return rest


def page_key_of(scope: str, host: str, field: str) -> PageKey:
    part, _, variant = field.partition("\0")
    return PageKey(scope, url_of(host, part), variant)


def host_of_part(quoted: str) -> str:
    """A host from its key part (:func:`host_part` reversed)."""
    return unquote(quoted)


def field_hash(field: str) -> int:
    """The hash that places a field in a bucket (its URL part's: variants together)."""
    part = field.partition("\0")[0]
    return int.from_bytes(hashlib.sha1(part.encode(), usedforsecurity=False).digest()[:4], "big")


def bucket_of(field: str, buckets: int) -> int:
    """The bucket of *field* in a host of *buckets* buckets (linear hashing)."""
    level = 1
    while level * 2 <= buckets:
        level *= 2
    hashed = field_hash(field)
    bucket = hashed % (2 * level)
    return bucket if bucket < buckets else hashed % level


#: The first line of every script (Redis 7.0's flags; a script without one
#: is a "legacy" script, which Redis refuses for memory only at its first
#: write that adds data, and lets write past ``maxmemory`` after that).
#: A script that may write is refused as a whole, before it runs, while
#: Redis is above ``maxmemory``; a read-only one runs whatever the memory.
LUA_WRITES = "#!lua\n"
LUA_READS = "#!lua flags=no-writes\n"


#: ``bucket_of(n, field)`` and ``field_hash(field)`` in Lua, the same as in
#: Python (SHA-1's first four bytes of the URL part).
LUA_BUCKETS = load_script(_LUA_PACKAGE, "buckets.lua")

#: ``sums_keys(prefix, scope)`` and ``count_page(z, old, new)``: a scope's
#: sums of pages by next visit, kept by every page write (layout 4).
LUA_SUMS = load_script(_LUA_PACKAGE, "sums.lua")

#: ``bucket_pages(prefix, tag, b)``: every field and record of a bucket,
#: flat (both of its hashes).
LUA_BUCKET_PAGES = load_script(_LUA_PACKAGE, "bucket_pages.lua")

# Reads pages where they are now. ARGV: the key prefix, then per page its
# scope part, host part and field. Returns per page its record (nil: none).
READ_PAGES_LUA = LUA_READS + LUA_BUCKETS + (
    load_script(_LUA_PACKAGE, "read_pages.lua"))

# The due pages of some buckets, in a range of next visits. ARGV: the key
# prefix, the scope part, the time (pages due at or before it), the cap,
# then per bucket its member ("host|n") and the next visit its pages were
# read up to before (those at or before it are left out). Returns two
# strings (a reply of a few elements parses fast, one of thousands does
# not). The first has a part per bucket, apart by 0xFE, each of fields
# apart by 0xFF (bytes UTF-8 never holds): its member, the earliest next
# visit of its pages due after the cap ('' if none: where to go on from),
# the earliest next visit of all its pages with a callback ('' if none: a
# bound in the index below it is stale, set right by the next flush),
# then the next visit, field and record length of each page due after what
# was read before and not after the cap. The second is those pages' records
# one after the other, in that order (binary: cut by their lengths). Then
# the scope's count of bucket splits ('' for none yet).
DUE_READ_LUA = LUA_READS + LUA_CODEC + LUA_BUCKET_PAGES + (
    load_script(_LUA_PACKAGE, "due_read.lua"))

# A chunk of a scope's revisit index by score. ARGV: its key, the least
# score (a number, or '(' and one: after it), the greatest, the offset and
# count of ZRANGE ... LIMIT, the key of the scope's count of splits. Returns
# one string (one reply element, not two per bucket): members and scores,
# apart by 0xFF; and the count of splits ('' for none yet).
DUE_INDEX_LUA = LUA_READS + load_script(_LUA_PACKAGE, "due_index.lua")

# The pages of some buckets in aggregate (StateStore.summarize_pages), and
# each bucket's score in the revisit index set to its exact minimum (the
# pages are all read here anyway). ARGV: the key prefix, the scope part,
# after, upto, checked_before, the number of callbacks left out, those
# callbacks, then bucket members. Returns pages, size, earliest next visit
# (false: none).
SUMMARY_LUA = LUA_WRITES + LUA_CODEC + LUA_BUCKET_PAGES + (
    load_script(_LUA_PACKAGE, "summary.lua"))

# The pages of a scope in aggregate from its sums (layout 4; see
# sums.lua), this crawl's checks left out one by one. ARGV: the key
# prefix, the scope part, after, upto, checked_before (whole seconds; a
# page last checked at or after it is left out), the number of callbacks
# left out, those callbacks. Returns pages, size, earliest next visit
# (false: none); or 'scan' when the checks at or after checked_before are
# not known one by one (no mark, or an earlier one): read every page then.
SUMS_READ_LUA = LUA_READS + LUA_CODEC + LUA_BUCKETS + LUA_SUMS + (
    load_script(_LUA_PACKAGE, "sums_read.lua"))
SUMS_BUILD_LUA = LUA_WRITES + LUA_CODEC + LUA_BUCKET_PAGES + LUA_SUMS + (
    load_script(_LUA_PACKAGE, "sums_build.lua"))
SUMS_FORGET_LUA = LUA_WRITES + LUA_CODEC + LUA_BUCKET_PAGES + LUA_SUMS + (
    load_script(_LUA_PACKAGE, "sums_forget.lua"))
SUMS_MARK_LUA = LUA_WRITES + LUA_SUMS + load_script(_LUA_PACKAGE, "sums_mark.lua")
