"""The Redis store's side of the stored-graph walk's memo
(:mod:`incremental_crawler.crawl.inert`): the write generation a memo is
taken with, and the memos themselves.

The write generation is a counter that every write of a page state or a
links record raises, in the script that writes it (atomic with the write,
no round trip of its own), and that nothing else touches:

- on one server, one counter per scope, ``P:wg:<s>``, raised once per flush
  that writes the scope's pages (``flush.lua``): the cheapest per flush
  (one INCR whatever the hosts written) and per read (one GET); a token
  then moves with every page of the scope, not only of the hosts asked;
- in the cluster layout, one per host, ``P:wg:{<s>|<g>}:<h>``, in the slot of
  the host's pages so that its host script (``cluster_host.lua``, phase 2)
  can raise it: a scope's counter would be in another slot. The token is
  the hosts' counters (``<h>=<n>``, ``<h>`` the host's key part, by host,
  comma-separated), read in one pipelined round trip.

A repair raises the counters of what it deletes (``generation.lua``, in
its ``MULTI``, after the deletions; a reset of a full Redis, whose
``MULTI`` Redis refuses, sends the same commands as a plain pipeline, so
a reader could then read the old value between the deletions and the
raise). Counters are never deleted, not even by a reset (it raises them):
a counter that started again from nothing would give a token read before
the reset again. They cost one small key per scope (one server) or per
host ever written (cluster layout). An absent counter reads as 0; one that
is not an integer fails the writes before any (the scripts check it: the
INCR comes after the writes).

The phases after phase 2 (a scope shard's effects, a ledger's adoption or
replay by another worker) write no page state nor links record: what they
apply (the sums, the revisit bounds, the scope's hosts) is derived from
pages written, and the counter moved when they were. A host script sent
again under its token (its reply lost) writes nothing and raises nothing.

Code older than the counters writes pages without raising them: see the
layout notes (``layout.py``) and the upgrade note in ``docs/cluster.md``.

The memos: a hash per scope (``P:memo:<s>``, cluster ``P:memo:{<s>}``),
one field per name, written at once; a reset deletes it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from incremental_crawler.state.stores.redis.core import RedisCore, _whole
from incremental_crawler.state.stores.redis.pages import host_part

if TYPE_CHECKING:
    from collections.abc import Collection

__all__ = ["RedisWalkMemo", "counter_ok"]

#: What INCR takes, and can raise without overflowing (the scripts check
#: the same before their writes: the INCR comes after them).
_COUNTER = re.compile(rb"0|[1-9][0-9]{0,17}|-[1-9][0-9]{0,16}")


def counter_ok(raw: bytes | str | None) -> bool:
    """Whether a counter as stored (``None``: absent) can be raised."""
    if isinstance(raw, str):
        raw = raw.encode()
    return raw is None or _COUNTER.fullmatch(raw) is not None


class RedisWalkMemo(RedisCore):
    """The write generation and the walk memos (see the module docstring)."""

    @property
    def write_generation_per_host(self) -> bool:  # type: ignore[override]
        """Per host in the cluster layout; one server counts the whole scope."""
        return self.tagged

    async def write_generation(self, scope: str, hosts: Collection[str]) -> str | None:
        if not self.tagged:
            [raw] = await self._commands([("GET", self._generation_key(scope, ""))])
            # A damaged counter stands for no token: no memo is kept or taken.
            return str(_whole(raw, 0)) if counter_ok(raw) else None
        # As the store keys pages by host (hosts.host_of: lowercase).
        names = sorted({host.lower() for host in hosts})
        # One GET per host (its slot's): the cluster client sends each node
        # its own, in one round trip.
        replies = await self._commands(
            [("GET", self._generation_key(scope, host)) for host in names])
        if not all(counter_ok(raw) for raw in replies):
            return None
        return ",".join(f"{host_part(host)}={_whole(raw, 0)}"
                        for host, raw in zip(names, replies, strict=True))

    async def get_walk_memo(self, scope: str, name: str) -> str | None:
        [raw] = await self._commands([("HGET", self._key("memo", scope), name)])
        return None if raw is None else raw.decode()

    def get_walk_memo_now(self, scope: str, name: str) -> str | None:
        pipe = self._sync.pipeline(transaction=False)
        pipe.hget(self._key("memo", scope), name)
        [raw] = self._sync_run(pipe)
        return None if raw is None else raw.decode()

    async def put_walk_memo(self, scope: str, name: str, data: str) -> None:
        await self._commands([("HSET", self._key("memo", scope), name, data)],
                             "Redis command failed")
