"""One entry of a host group's ledger on a Redis Cluster (cluster layout:
``P:fx:{<s>|<g>}``, token -> entry), read and written in one place.

An entry is the JSON pair ``[when, effects]``: *when* the time (whole
seconds) of the ledger's node when the entry was written, which its age is
told by; *effects* what the group's writes change in its scope's shard (a
JSON object: ``sums``, ``checks``, ``due``, ``splits``, ``hosts``, ...; see
:class:`~incremental_crawler.state.stores.redis.cluster.RedisClusterPath`).
``cluster_host.lua`` and ``cluster_forget.lua`` write the effects as a
string of JSON (cjson's encoding of what they built), a migration from
layout 6 as the object itself (:func:`entry_of`): both read alike.

``cluster_host.lua``, the one script that reads entries, deletes a value
that is not an array with a number first; :func:`read_entry` asks for a
pair (the scripts and :func:`entry_of` write pairs only), so a longer
array with a number first, which no code writes, is adopted by the script
and skipped by the readers here.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

__all__ = ["LedgerEntry", "entry_effects", "entry_of", "read_entry"]


class LedgerEntry(NamedTuple):
    """A ledger entry, read."""

    #: When it was written, on the clock of the ledger's node (seconds; an
    #: int as the scripts write it).
    stamped: float
    effects: dict[str, Any]


def read_entry(raw: bytes | str) -> LedgerEntry | None:
    """The entry *raw* (a ledger's value); None for a value that is not one
    (not a JSON pair, or its time not a number). An entry whose effects are
    not a JSON object raises :class:`ValueError` (see :func:`entry_effects`)."""
    try:
        stamped, effects = json.loads(raw)
        when = float(stamped)
    except (ValueError, TypeError):
        return None
    # (An int kept as such: a migration writes the entry again as it was.)
    return LedgerEntry(stamped if type(stamped) is int else when, entry_effects(effects))


def entry_effects(value: Any) -> dict[str, Any]:
    """An entry's effects, whether written as a string of JSON (the
    scripts) or as the object (a migration); :class:`ValueError` when they
    are not a JSON object (a damaged entry, which the scripts do not
    check: the flush or adoption that would apply it stops on it, a
    listing of the hosts it names skips it, a migration keeps it as it
    is)."""
    effects = json.loads(value) if isinstance(value, str) else value
    if not isinstance(effects, dict):
        raise ValueError(f"a ledger entry's effects are not a JSON object: {str(value)[:80]!r}")
    return effects


def entry_of(stamped: float, effects: dict[str, Any]) -> bytes:
    """The ledger's value of the entry written at *stamped* with *effects*
    (the object itself, compact)."""
    return json.dumps([stamped, effects], separators=(",", ":")).encode()
