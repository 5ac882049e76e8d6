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
import shlex
from typing import Any, NamedTuple

__all__ = ["EXPIRED_EMPTY", "DamagedEffects", "LedgerEntry", "damaged_entry", "entry_effects",
           "entry_of", "read_entry"]


class LedgerEntry(NamedTuple):
    """A ledger entry, read."""

    #: When it was written, on the clock of the ledger's node (seconds; an
    #: int as the scripts write it).
    stamped: float
    effects: dict[str, Any]


class DamagedEffects(ValueError):
    """An entry's effects are not a JSON object, or one of its members not
    of its kind (see :func:`entry_effects`)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"a ledger entry's {what}")
        #: What is wrong with them ("effects are not ...").
        self.what = what


def read_entry(raw: bytes | str) -> LedgerEntry | None:
    """The entry *raw* (a ledger's value); None for a value that is not one
    (not a JSON pair, or its time not a number). An entry whose effects are
    not a JSON object raises :class:`DamagedEffects` (see :func:`entry_effects`)."""
    try:
        stamped, effects = json.loads(raw)
        when = float(stamped)
    except (ValueError, TypeError):
        return None
    # (An int kept as such: a migration writes the entry again as it was.)
    return LedgerEntry(stamped if type(stamped) is int else when, entry_effects(effects))


def entry_effects(value: Any) -> dict[str, Any]:
    """An entry's effects, whether written as a string of JSON (the
    scripts) or as the object (a migration); :class:`DamagedEffects` when
    they are not a JSON object, or a member is not of its kind (a damaged
    entry, which the scripts do not check: the flush or adoption that would
    apply it stops on it with the store's error, :func:`damaged_entry`; a
    listing of the hosts it names skips it, a migration keeps it as it
    is)."""
    try:
        effects = json.loads(value) if isinstance(value, str) else value
    except ValueError as exc:
        raise DamagedEffects(f"effects are not JSON ({exc}): {str(value)[:80]!r}") from exc
    if not isinstance(effects, dict):
        raise DamagedEffects(f"effects are not a JSON object: {str(value)[:80]!r}")
    _check_members(effects)
    return effects


def _whole(value: Any) -> bool:
    """Whether *value* reads as the whole number the readers take of it
    (``int()``: a number or a string of digits; not inf or NaN)."""
    if not isinstance(value, int | float | str):
        return False
    try:
        int(value)
    except (ValueError, ArithmeticError):
        return False
    return True


def _check_members(effects: dict[str, Any]) -> None:
    """Raises :class:`DamagedEffects` naming the first member of *effects*
    that is not of its kind, so that every damage is found where the entry
    is read (not later, where its effects are merged or sent). An empty
    member of any kind is none (cjson writes an empty table as ``{}``)."""
    def check(name: str, kind: str, ok: bool) -> None:
        if not ok:
            raise DamagedEffects(f"effects' {name} are not {kind}: "
                                 f"{str(effects.get(name))[:80]!r}")

    sums = effects.get("sums") or {}
    check("sums", "an object of '<visit>|<callback>': [pages, bytes]",
          isinstance(sums, dict) and all(
              _whole(key.partition("|")[0]) and isinstance(pair, list) and len(pair) == 2
              and all(_whole(n) for n in pair) for key, pair in sums.items()))
    checks = effects.get("checks") or []
    check("checks", "a list of [page, time or '']",
          isinstance(checks, list) and all(
              isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
              and (pair[1] == "" or _whole(pair[1])) for pair in checks))
    due = effects.get("due") or {}
    check("due", "an object of bucket: next visit",
          isinstance(due, dict) and all(_whole(visit) for visit in due.values()))
    check("splits", "a whole number", _whole(effects.get("splits") or 0))
    hosts = effects.get("hosts") or []
    check("hosts", "a list of host names",
          isinstance(hosts, list) and all(isinstance(host, str) for host in hosts))
    check("latest", "a time", effects.get("latest") in (None, "") or _whole(effects["latest"]))


#: What a damaged entry is rewritten as to be let go: an entry of time 0,
#: so past the time its effects are honoured, with no effects. The next
#: flush or reading that takes it applies it as an expired one (the
#: shard's sums marked lost, unless its token is noted applied: then
#: nothing) and deletes it.
EXPIRED_EMPTY = '[0,"{}"]'


def damaged_entry(ledger: str, token: str, exc: BaseException) -> str:
    """What a flush or a reading that met a damaged entry says (after the
    store's name): the entry, why it cannot be applied, and what can be
    done (the command quoted for a shell). Nothing applies it or deletes
    it on its own: its effects (a flush's on its scope's shard) would be
    lost unseen, the sums by next visit off with no mark saying so."""
    # (entry_effects says what is wrong; anything else raised reading
    # the object's members is named as what it is.)
    why = f"its {exc.what}" if isinstance(exc, DamagedEffects) else (
        f"its effects cannot be read ({exc!r})")
    rewrite = shlex.join(["redis-cli", "-c", "HSET", ledger, token, EXPIRED_EMPTY])
    return (
        f"the ledger {ledger} holds a damaged entry (token {token}): {why}; the effects it "
        "keeps (a flush's on its scope: hosts listed, revisit bounds, sums by next visit) "
        "cannot be applied, so every flush that writes a host of that group and every "
        "reading of the scope stops on it (nothing of it was applied or deleted; a flush "
        "stores all else it holds first). Repair the entry if you know what it held (a JSON "
        "pair [time, effects object]), or rewrite it as expired and empty: "
        f"{rewrite}; the next such flush or reading then deletes it. Unless its "
        "effects were applied already (then nothing is lost), the scope's sums by next "
        "visit are then marked lost (summaries read every page: exact, slower, until a "
        "'scrapy state reset' of the scope), and the hosts and buckets it listed may be "
        "missing from the scope's hosts and revisit index until their pages are written "
        "again")


def entry_of(stamped: float, effects: dict[str, Any]) -> bytes:
    """The ledger's value of the entry written at *stamped* with *effects*
    (the object itself, compact)."""
    return json.dumps([stamped, effects], separators=(",", ":")).encode()
