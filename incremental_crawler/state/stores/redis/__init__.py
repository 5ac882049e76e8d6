"""The networked state store: Redis, shared by crawl workers on many machines.

``INCREMENTAL_STATE_URI=redis://host:6379/0?prefix=incremental`` (also
``rediss://`` and ``unix:///path/redis.sock?db=0``). Every key starts with
the prefix; ``<s>`` is the scope and ``<h>`` a host, percent-quoted so that
neither holds a ``:``, ``|`` or brace:

==============================  ==========================================
``P:meta``                      hash: ``layout`` and ``version`` of the layout
                                (``upgrading``: a migration under way)
``P:scopes``                    set of the scopes stored
``P:hs:<s>``                    set of the hosts with pages or links records
``P:hd:{<s>|<h>}``              hash: the host's bucket count ``n``, pages ``p``
``P:pg:{<s>|<h>}:<n>``          hash, bucket *n* of the host: page field →
                                page state (packed)
``P:ln:{<s>|<h>}``              hash: page field → the page's links record (opaque text)
``P:dueb:<s>``                  sorted set: buckets ``<h>|<n>`` holding pages with a
                                callback (gone ones too), by a lower bound of
                                their next visits
``P:splits:<s>``                how many buckets of the scope split so far (a
                                reader of due pages starts over when it grows)
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
``P:holds:<s>``                 sorted set: crawls, cluster workers (``worker@``), repairs
                                (``repair@``) and copies (``copy@``) holding the scope, by
                                when each lapses
                                (on the server's clock, its TIME)
``P:holdepoch:<s>``             the scope's hold epoch: a counter every take of a hold
                                raises (a cluster worker's beside live workers'
                                excepted); a lapsed hold is taken again only while
                                it is the one of its take
``P:slots:<s>``                 hash: slot → the rate its politeness window
                                learned (JSON)
``P:slotsat:<s>``               sorted set: those slots by when each was saved,
                                the newest ``SLOT_RATES_KEPT`` (1000) kept
``P:undel:<s>:<c>``             sorted set, all scores 0: ``stored_at NUL item key
                                NUL version`` (zero-padded) of the versions waiting
                                on crawl *c* to confirm their delivery
``P:undelc:<s>``                set of the crawls *c* with such versions
``P:wg:<s>``                    the scope's write generation: a counter every
                                flush that writes its page states or links
                                records raises once (see :mod:`.memo`)
``P:memo:<s>``                  hash: name → the stored-graph walk's memo
``P:migrating``                 the lock of a layout migration (expires)
==============================  ==========================================

``P:crawls:<s>``, ``P:holds:<s>``, ``P:holdepoch:<s>``, ``P:slots:<s>``,
``P:slotsat:<s>``, ``P:undel:<s>:<c>``, ``P:undelc:<s>``, ``P:wg:<s>`` and ``P:memo:<s>``
came without a layout change (older code ignores them; an absent
``P:wg:<s>`` reads as 0). Repairs (``forget_page``, ``forget_host``,
``reset_scope``) run at once, each in one ``MULTI``; a reset deletes the
scope's keys of the kinds above (``P:holds:<s>`` excepted: holds lapse by
themselves; ``P:holdepoch:<s>``, which never goes back; and ``P:wg:<s>``,
which it raises: a token read before the reset
never comes back; other ``P:<name>:<s>`` keys, such as a shared politeness
budget ``P:budget:<host>``, are not this store's), its hosts' keys, its
``P:hist:<s>:*`` and ``P:undel:<s>:*`` keys, and takes it out of ``P:scopes``.

On a Redis Cluster the store keeps the *cluster layout* (version 8, see
:mod:`~incremental_crawler.state.stores.redis.cluster`): the same kinds of
keys, every one hash-tagged so that a script's keys are one slot: a scope's
own ``P:<kind>:{<s>}`` (``P:hosts``, ``P:crawls``, ``P:holds``, ``P:holdepoch``,
``P:slots``, ``P:slotsat``, ``P:undelc``, ``P:undel:{<s>}:<c>``,
``P:memo``); a host's keys tagged by its host group ``{<s>|<g>}`` (one of
64 a scope, by a hash of the host: see
:data:`~incremental_crawler.state.stores.redis.core.HOST_GROUPS`), the
host after the tag: ``P:hd:{<s>|<g>}:<h>``, ``P:pg:{<s>|<g>}:<h>:<n>``,
``P:pgl:…``, ``P:ln:{<s>|<g>}:<h>`` and its write generation
``P:wg:{<s>|<g>}:<h>`` (one a host, in place of the scope's one counter;
kept through a reset as that one is); what a page write changes of its
scope, per scope shard, which is the host's group (``{<s>|<g>}``, in the
same slot as its hosts' pages: see
:data:`~incremental_crawler.state.stores.redis.core.SCOPE_SHARDS`):
``P:hs``, ``P:dueb``, ``P:splits``, ``P:nvs``, ``P:nvm``, ``P:ck``,
``P:nvf:{<s>|<g>}:<k>`` (``FINE_KEYS`` hashes, every one in the
group script's ``KEYS``) and the buckets a summary is reading
``P:duer``; the items by group ``P:items:{<s>#<g>}``,
``P:itemver:{<s>#<g>}``, ``P:order:{<s>#<g>}``,
``P:hist:{<s>#<g>}:<item key>`` and ``P:bypage:{<s>#<g>}`` (the group of
the page's URL), a flush's tokens ``P:flush:{<tag>}:<token>`` per script.
Its flush runs in three phases, not one script (phase 2 one script a host
group, which applies its pages' effects on the scope itself). One server
keeps the layout above.

Pages are kept per host in small buckets (see
:mod:`~incremental_crawler.state.stores.redis.pages`: how a page's field
and bucket are chosen, how a host's buckets grow, why the revisit index
counts buckets), each page a packed record (see
:mod:`~incremental_crawler.state.stores.packed`: a field added to
:class:`PageState` is stored without a layout change and reads back as its
default where it is missing). The other records are JSON objects of their
dataclass fields, defaults left out, so a field added to
:class:`HostTrust` or :class:`ItemRecord` needs no layout change either.
Floats are POSIX times or durations, kept as whole seconds as the SQLite
store does. ``docs/capacity.md`` measures what each costs.

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
10,000 keys; page reads are scripts, which find a page's bucket in Redis)
on a ``redis.asyncio`` client, so the reactor never waits on the network.
Writes are staged in memory; :meth:`RedisStateStore.flush` sends them all
as one run of a Lua script, in staging order: atomic for every reader and
worker like a ``MULTI``/``EXEC``, but it stops at the first write that
fails (``EXEC`` would go on with the ones after it), so a page's
validators are never applied without the items staged before them (state
is never ahead of data). Redis keeps how many writes of a batch it applied
under the batch's token: a batch whose reply was lost is not applied twice
when it is sent again. Checks, redirects, flags and item versions are read-modify-write
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

from incremental_crawler.state.stores.redis.layout import (
    LAYOUT,
    LAYOUT_VERSION,
    MIN_REDIS_VERSION,
)
from incremental_crawler.state.stores.redis.store import RedisStateStore
from incremental_crawler.state.stores.redis.uri import DEFAULT_PREFIX, parse_redis_uri

__all__ = [
    "DEFAULT_PREFIX", "LAYOUT", "LAYOUT_VERSION", "MIN_REDIS_VERSION", "RedisStateStore",
    "parse_redis_uri",
]
