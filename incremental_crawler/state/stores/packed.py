"""Page states packed into a few dozen bytes, for the Redis store.

A page record is a bit mask of the fields present, then each present field
in the order of :data:`FIELDS`, so a field at its default costs nothing:

- integers are zigzag varints (7 bits a byte, the sign in the lowest bit);
- times are whole seconds: ``last_checked`` from :data:`EPOCH`, the others
  from ``last_checked`` (a page's times are close to each other: two or
  three bytes each instead of five);
- strings are a varint length, then their UTF-8 bytes.

Four fields have a compact form beside their plain one (two bits of the
mask, one set at most): a ``callback`` of ``"parse"`` (the usual one) is a
bit alone; a lowercase hex ``fingerprint`` is kept as its bytes; an ETag of
hex runs (``"5f3c1a-7d4e"``, ``W/"…"``: nginx, Apache, S3) as their
nibbles; a ``Last-Modified`` in the exact IMF-fixdate form a server sends
(``Sun, 06 Nov 1994 08:49:37 GMT``) as its time. Anything else is kept as
it is, so every value reads back exactly as it was written.

Why not JSON: a realistic record is ~360 bytes of JSON and ~60 packed, and
Redis keeps a small hash (its entries up to ``hash-max-listpack-value``, 64
bytes by default) as one flat block, several times smaller than a hash table
of the same entries (see ``docs/capacity.md``).

A field added to :class:`PageState` takes the next bit: code that does not
know it reads the fields it knows and ignores the rest (the unknown bits are
higher, their bytes come last), and the Lua upserts keep them as they are.
:data:`LUA_CODEC` is the same codec for the flush script, which rewrites
records in place (a check adds one to ``checks``, a failure sets
``next_visit``...); it keeps the compact forms it does not read as bytes.
"""

from __future__ import annotations

import calendar
import re
import time
from typing import TYPE_CHECKING

from incremental_crawler.lua import load_script
from incremental_crawler.state.records import PageState

if TYPE_CHECKING:
    from incremental_crawler.state.records import PageKey

__all__ = ["EPOCH", "FIELDS", "LUA_CODEC", "PackedRecordError", "due_of", "pack", "unpack"]

#: Where this module's Lua scripts are (``.lua`` files, read by :func:`load_script`).
_LUA_PACKAGE = "incremental_crawler.state.stores"

#: ``last_checked`` is kept from this time (2025-06-15): recent times are
#: small numbers (four bytes, not five).
EPOCH = 1_750_000_000

#: (name, kind) by bit of the mask. Kinds: ``T`` the base time
#: (``last_checked``, from EPOCH), ``t`` a time from the base, ``i`` an
#: integer, ``s`` a string, ``z`` a bit alone (no bytes). Names ending in
#: ``@`` are compact forms of the field before the ``@``. New fields go at
#: the end, never in between.
FIELDS: tuple[tuple[str, str], ...] = (
    ("last_checked", "T"),
    ("first_seen", "t"),
    ("last_fetched", "t"),
    ("last_changed", "t"),
    ("next_visit", "t"),
    ("interval", "i"),
    ("last_status", "i"),
    ("size", "i"),
    ("checks", "i"),
    ("changes", "i"),
    ("flags", "i"),
    ("callback@parse", "z"),
    ("fingerprint@hex", "s"),
    ("etag@hex", "s"),
    ("last_modified@date", "t"),
    ("lastmod", "t"),
    ("etag", "s"),
    ("last_modified", "s"),
    ("fingerprint", "s"),
    ("callback", "s"),
    ("churns", "i"),
    ("failures", "i"),
    ("redirect_to", "s"),
    ("recipe", "s"),
    ("listing", "s"),
)
#: Fields whose absence means their default; ``None`` is the default of
#: these (so 0 is stored): the others default to 0 (or 0.0).
_NONE_DEFAULT = frozenset({"last_status", "lastmod"})
#: The fields written in one of two forms (chosen first in :func:`pack`).
_TWO_FORMS = frozenset(name.partition("@")[0] for name, _ in FIELDS if "@" in name)
_CHOSEN_FORM, _ZERO_IS_DEFAULT, _NONE_IS_DEFAULT = range(3)
#: (bit, name, kind, how its default is told) by field, in order.
_PLAN = tuple(
    (1 << n, name, kind,
     _CHOSEN_FORM if "@" in name or name in _TWO_FORMS
     else _NONE_IS_DEFAULT if kind == "s" or name in _NONE_DEFAULT else _ZERO_IS_DEFAULT)
    for n, (name, kind) in enumerate(FIELDS))
#: Numbers a record keeps when 0: 0 is not their default (``None`` is), or
#: they are the compact form chosen for a value (a Last-Modified at 0).
_ZERO_KEPT = frozenset(name for _, name, kind, how in _PLAN
                       if kind not in ("s", "z") and how != _ZERO_IS_DEFAULT)
#: Fields :func:`unpack` does not set as they are: compact forms, and
#: strings (stored as bytes).
_SPECIAL = frozenset(name for name, kind in FIELDS if "@" in name or kind == "s")

_HEX = re.compile(r"[0-9a-f]+")
_HEX_ETAG = re.compile(r'(W/)?"([0-9a-f]+(?:-[0-9a-f]+)*)"')


class PackedRecordError(ValueError):
    """A stored page record that is not one (cut short, or not packed)."""


# -- encoding ------------------------------------------------------------------


def _uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _pack_etag(etag: str) -> bytes | None:
    """Hex-run ETags as a weak flag and nibble runs (``None``: not one)."""
    match = _HEX_ETAG.fullmatch(etag)
    if match is None:
        return None
    out = bytearray([1 if match.group(1) else 0])
    for run in match.group(2).split("-"):
        _uvarint(out, len(run))
        out += bytes.fromhex(run + "0" * (len(run) % 2))
    return bytes(out)


def _unpack_etag(data: bytes) -> str:
    runs = []
    pos = 1
    while pos < len(data):
        length, pos = _read_uvarint(data, pos)
        size = (length + 1) // 2
        runs.append(data[pos:pos + size].hex()[:length])
        pos += size
    quoted = '"' + "-".join(runs) + '"'
    return "W/" + quoted if data[0] & 1 else quoted


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTH_NUMBER = {name: n for n, name in enumerate(_MONTHS, 1)}
_FIXDATE = re.compile(r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\d\d) ([A-Z][a-z][a-z]) (\d{4}) "
                      r"(\d\d):(\d\d):(\d\d) GMT")


#: Dates met lately, both ways: many pages of a site share a Last-Modified
#: (a deploy, a sitemap's build), and each costs a few microseconds.
_DATES_SEEN: dict[str, int | None] = {}
_TIMES_SEEN: dict[int, str] = {}
_DATES_KEPT = 4096


def _format_date(when: int) -> str:
    """*when* as an IMF-fixdate (``email.utils.formatdate(when, usegmt=True)``)."""
    found = _TIMES_SEEN.get(when)
    if found is None:
        t = time.gmtime(when)
        found = (f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} "
                 f"{t.tm_year:04d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")
        if len(_TIMES_SEEN) >= _DATES_KEPT:
            _TIMES_SEEN.clear()
        _TIMES_SEEN[when] = found
    return found


def _date_of(value: str) -> int | None:
    """The time of an IMF-fixdate that formats back to exactly *value*."""
    if value in _DATES_SEEN:
        return _DATES_SEEN[value]
    when = _parse_date(value)
    if len(_DATES_SEEN) >= _DATES_KEPT:
        _DATES_SEEN.clear()
    _DATES_SEEN[value] = when
    return when


def _parse_date(value: str) -> int | None:
    match = _FIXDATE.fullmatch(value)
    if match is None:
        return None
    day, month, year, hour, minute, second = match.groups()
    number = _MONTH_NUMBER.get(month)
    if number is None:
        return None
    try:
        when = calendar.timegm((int(year), number, int(day), int(hour), int(minute),
                                int(second)))
    except (ValueError, OverflowError):
        return None
    # A weekday that does not match, a 31st of April: not kept as a time.
    return when if _format_date(when) == value else None


def _chosen_forms(state: PageState) -> dict[str, object]:
    """The fields of two forms in the one they are kept in, by name."""
    chosen: dict[str, object] = {}
    callback = state.callback
    if callback == "parse":
        chosen["callback@parse"] = True
    elif callback is not None:
        chosen["callback"] = callback
    fingerprint = state.fingerprint
    if fingerprint is not None:
        if len(fingerprint) % 2 == 0 and _HEX.fullmatch(fingerprint):
            chosen["fingerprint@hex"] = bytes.fromhex(fingerprint)
        else:
            chosen["fingerprint"] = fingerprint
    if state.etag is not None:
        packed_etag = _pack_etag(state.etag)
        if packed_etag is not None:
            chosen["etag@hex"] = packed_etag
        else:
            chosen["etag"] = state.etag
    if state.last_modified is not None:
        when = _date_of(state.last_modified)
        if when is not None:
            chosen["last_modified@date"] = when
        else:
            chosen["last_modified"] = state.last_modified
    return chosen


def pack(state: PageState) -> bytes:
    """*state* (its key aside) as a packed record; times as whole seconds."""
    chosen = _chosen_forms(state)
    mask = 0
    body = bytearray()
    base = int(state.last_checked)
    for bit, name, kind, how in _PLAN:
        if how == _CHOSEN_FORM:
            value = chosen.get(name)
            if value is None:
                continue
        else:
            value = getattr(state, name)
            # Kept in whole seconds: a value under one second is 0, the default.
            if value is None or (how == _ZERO_IS_DEFAULT and not int(value)):
                continue
        mask |= bit
        if kind == "s":
            data = value if isinstance(value, bytes) else str(value).encode()
            _uvarint(body, len(data))
            body += data
        elif kind != "z":
            number = int(value)  # type: ignore[call-overload]
            if kind == "T":
                number -= EPOCH
            elif kind == "t":
                number -= base
            _uvarint(body, number * 2 if number >= 0 else -number * 2 - 1)
    out = bytearray()
    _uvarint(out, mask)
    out += body
    return bytes(out)


# -- decoding ------------------------------------------------------------------


def _read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        try:
            byte = data[pos]
        except IndexError:
            raise PackedRecordError("a packed page record is cut short") from None
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(raw: bytes) -> dict[str, object]:
    """The known fields of a record, by name (compact forms as stored)."""
    mask, pos = _read_uvarint(raw, 0)
    found: dict[str, object] = {}
    base = 0
    size = len(raw)
    for bit, name, kind, _ in _PLAN:
        if bit > mask:
            break
        if not mask & bit:
            continue
        if kind == "z":
            found[name] = True
            continue
        # An inline varint: one byte is the usual case.
        byte = raw[pos] if pos < size else -1
        if 0 <= byte < 0x80:
            number = byte
            pos += 1
        else:
            number, pos = _read_uvarint(raw, pos)
        if kind == "s":
            end = pos + number
            if end > size:
                raise PackedRecordError("a packed page record is cut short")
            found[name] = raw[pos:end]
            pos = end
            continue
        number = number >> 1 if not number & 1 else -(number >> 1) - 1
        if kind == "T":
            base = number + EPOCH
            found[name] = base
        elif kind == "t":
            found[name] = number + base
        else:
            found[name] = number
    return found


def unpack(key: PageKey, raw: bytes) -> PageState:
    """The page state a packed record holds (fields it does not know ignored)."""
    found = _fields(raw)
    state = PageState(key)
    for name, value in found.items():
        if name in _SPECIAL:
            if name == "callback@parse":
                state.callback = "parse"
            elif name == "fingerprint@hex":
                state.fingerprint = value.hex()  # type: ignore[attr-defined]
            elif name == "etag@hex":
                state.etag = _unpack_etag(value)  # type: ignore[arg-type]
            elif name == "last_modified@date":
                state.last_modified = _format_date(value)  # type: ignore[arg-type]
            else:
                setattr(state, name, value.decode())  # type: ignore[attr-defined]
        else:
            setattr(state, name, value)
    return state


def due_of(raw: bytes) -> float | None:
    """The next visit of a record's page if it has a callback, else ``None``."""
    found = _fields(raw)
    if "callback@parse" not in found and "callback" not in found:
        return None
    return float(found.get("next_visit", 0))  # type: ignore[arg-type]


# -- the same in Lua (Redis scripts) ---------------------------------------------

# The Lua due_of reads the fields before next_visit as numbers (varints).
assert all(kind in "Tti" for name, kind in FIELDS[:[n for n, _ in FIELDS].index("next_visit")])
_LUA_FIELDS = ", ".join(f"{{'{name}', '{kind}'}}" for name, kind in FIELDS)

#: Defines ``unpack_page(raw)`` (a table of the fields by name, times as
#: absolute seconds, strings and compact forms as bytes, plus ``_mask`` and
#: ``_tail``: bits and bytes of fields this code does not know) and
#: ``pack_page(page)``, its inverse; ``page_callback(page)`` and
#: ``set_callback(page, name)`` read and set the callback in either form;
#: ``due_of(raw)``: the next visit of a page with a callback, else nil (it
#: reads only the head of the record); ``page_summary(raw)``: its callback,
#: last check, next visit and size (strings skipped, not copied).
LUA_CODEC = load_script(_LUA_PACKAGE, "packed.lua").replace(
    "{FIELDS}", "{" + _LUA_FIELDS + "}").replace("EPOCH_VALUE", str(EPOCH)).replace(
    "{ZERO_KEPT}", "{" + ", ".join(f"['{name}'] = true" for name in sorted(_ZERO_KEPT)) + "}")
