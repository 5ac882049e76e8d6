"""Stable fingerprints of response bodies and of items."""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter

from incremental_crawler.ignore_patterns import DEFAULT_IGNORE_PATTERNS

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable

__all__ = [
    "DEFAULT_IGNORE_PATTERNS", "Normaliser", "body_fingerprint", "comparable", "hamming",
    "item_fingerprint", "simhash",
]

#: Where the default patterns can match, so that the pattern is tried there
#: only: a literal first lets the regex engine skip through a text fast,
#: where the pattern itself is tried at every digit or at every capital
#: (ten times slower on a page of text). Every ISO 8601 match has
#: "-MM-DDTHH:" four characters after its start; every RFC 822 one has
#: ", D Mon D" (the day of the month, the month's name, the year's first
#: digit) three characters after its start, after the day's name. An anchor
#: says as much of the match as the regex engine checks in C: each anchor
#: found is a try in Python, and a bare ", D" is in every list of numbers.
#: Neither anchor can overlap itself (no proper suffix of it is a prefix of
#: it), so scanning a text for non-overlapping anchors misses none.
_ANCHORS: dict[str, tuple[re.Pattern[str], int]] = {
    DEFAULT_IGNORE_PATTERNS[0]: (re.compile(r"-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:"), 4),
    DEFAULT_IGNORE_PATTERNS[1]: (re.compile(
        r", [0-9]{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [0-9]"), 3),
}
#: Every character str.split() splits on but the space (str.isspace();
#: tests check the list against the running Python's Unicode database).
OTHER_SPACES = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003"
                "\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_OTHER_SPACE_CHARS = tuple(OTHER_SPACES)


def _folded(value: str) -> bool:
    """Whether ``" ".join(value.split()) == value``, without building the
    copy: most text reaching a fingerprint (a spider's extracted main text)
    is folded already.

    One ``in`` per whitespace character rather than a regex character class:
    each is a memchr-like scan in C (and none at all for a character wider
    than the text's storage), about half the instructions of the class
    tested at every character.
    """
    if not value:
        return True
    if value[0] == " " or value[-1] == " " or "  " in value:
        return False
    return not any(c in value for c in _OTHER_SPACE_CHARS)


class Normaliser:
    """Removes ignored patterns and folds whitespace, before fingerprinting.

    >>> Normaliser().text("  Updated 2024-05-01T10:00:00Z   news ")
    'Updated news'
    """

    def __init__(self, patterns: Iterable[str] = DEFAULT_IGNORE_PATTERNS) -> None:
        self.patterns = tuple(patterns)
        # One regex each, applied in turn: an alternation of them all loses
        # the engine's literal-prefix shortcuts and is slower.
        self._text = [(re.compile(p), _ANCHORS.get(p)) for p in self.patterns]

    def text(self, value: str) -> str:
        replaced = False
        for pattern, anchor in self._text:
            if anchor is None:
                value, n = pattern.subn(" ", value)
            else:
                value, n = _sub_anchored(pattern, *anchor, value)
            replaced = replaced or n > 0
        if not replaced and _folded(value):
            return value
        # split/join folds whitespace several times faster than a regex.
        return " ".join(value.split())


def _sub_anchored(pattern: re.Pattern[str], anchor: re.Pattern[str], offset: int,
                  value: str) -> tuple[str, int]:
    """``pattern.subn(" ", value)`` for a pattern whose every match has a match
    of *anchor* *offset* characters after its start (and anchor matches that
    never overlap): the same leftmost, non-overlapping matches, looked for
    at the anchors only."""
    pieces: list[str] = []
    pos = 0
    for hit in anchor.finditer(value):
        start = hit.start() - offset
        if start < pos:
            continue
        match = pattern.match(value, start)
        if match is None:
            continue
        pieces += (value[pos:start], " ")
        pos = match.end()
    if not pieces:
        return value, 0
    pieces.append(value[pos:])
    return "".join(pieces), len(pieces) // 2


# 64 bits: a per-key comparison, not a global set, so a collision needs the
# same key to hash equal across two versions (2**-64); 16 hex digits keep
# the per-page state small. SHA-256 because CPUs hash it in hardware: about
# three times faster than BLAKE2 or SHA-1 here.
_HEX_DIGITS = 16


def body_fingerprint(body: bytes) -> str:
    """Fingerprint of a response body, as received (normalising a whole page
    costs milliseconds; items are fingerprinted normalised).

    >>> body_fingerprint(b"hello")
    '2cf24dba5fb0a30e'
    """
    return hashlib.sha256(body).hexdigest()[:_HEX_DIGITS]


def _default(value: Any) -> Any:
    # Sets have no order; everything else unknown is reduced to its text.
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def _encoded(value: Any, normaliser: Normaliser | None) -> bytes:
    # Text, the common case (titles, bodies), is hashed normalised; anything
    # else as canonical JSON. A type tag keeps "1" and 1 apart.
    if isinstance(value, str):
        if normaliser is not None:
            value = normaliser.text(value)
        return b"s" + value.encode("utf-8", "surrogatepass")
    return b"j" + json.dumps(
        value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=_default
    ).encode("utf-8", "surrogatepass")


def comparable(value: Any, normaliser: Normaliser | None = None) -> bytes:
    """A field's value as :func:`item_fingerprint` hashes it: two values that
    compare equal here never make an item look changed.

    >>> comparable("a  b", Normaliser()) == comparable(" a b", Normaliser())
    True
    >>> comparable("1") == comparable(1)
    False
    """
    return _encoded(value, normaliser)


def item_fingerprint(
    item: Any,
    *,
    exclude: Collection[str] = (),
    include: Collection[str] | None = None,
    normaliser: Normaliser | None = None,
) -> str:
    """Fingerprint of an item's fields, independent of field order.

    *include* limits the fields used; *exclude* drops volatile ones (a crawl
    timestamp must not make an item look changed). Each field is hashed as
    its name and length-prefixed value, so no two items share a byte stream.

    >>> item_fingerprint({"a": 1, "b": [1, 2]}) == item_fingerprint({"b": [1, 2], "a": 1})
    True
    >>> item_fingerprint({"a": 1, "t": 5}, exclude={"t"}) == item_fingerprint({"a": 1})
    True
    >>> item_fingerprint({"a": "1"}) == item_fingerprint({"a": 1})
    False
    """
    digest = hashlib.sha256()
    for name, value in sorted(ItemAdapter(item).items()):
        if name in exclude or (include is not None and name not in include):
            continue
        for part in (name.encode("utf-8", "surrogatepass"), _encoded(value, normaliser)):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
    return digest.hexdigest()[:_HEX_DIGITS]


def simhash(text: str, normaliser: Normaliser | None = None) -> int:
    """64-bit SimHash of *text* over word 3-shingles (Charikar, 2002).

    Texts that differ by a few words get hashes a few bits apart; the value
    is signed so that SQLite stores it as an INTEGER. Costs about 15 µs per
    word (pure Python): it is opt-in.

    >>> a = simhash(" ".join(f"word{i}" for i in range(300)))
    >>> b = simhash(" ".join(f"word{i}" if i != 150 else "other" for i in range(300)))
    >>> hamming(a, b) <= 8 < hamming(a, simhash("something else entirely, and short"))
    True
    """
    if normaliser is not None:
        text = normaliser.text(text)
    words = text.split()
    shingles = [" ".join(words[i:i + 3]) for i in range(max(1, len(words) - 2))]
    weights = [0] * 64
    for shingle in shingles:
        value = int.from_bytes(
            hashlib.blake2b(shingle.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
            "big",
        )
        for bit in range(64):
            weights[bit] += 1 if value >> bit & 1 else -1
    result = sum(1 << bit for bit in range(64) if weights[bit] > 0)
    return result - (1 << 64) if result >= 1 << 63 else result


def hamming(a: int, b: int) -> int:
    """Bits that differ between two SimHashes."""
    return ((a ^ b) & 0xFFFFFFFFFFFFFFFF).bit_count()
