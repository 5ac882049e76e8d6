"""Stable fingerprints of response bodies and of items."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter

if TYPE_CHECKING:
    from collections.abc import Collection

__all__ = ["body_fingerprint", "item_fingerprint"]

# 64 bits: a per-key comparison, not a global set, so a collision needs the
# same key to hash equal across two versions (2**-64); 16 hex digits keep
# the per-page state small.
_DIGEST_SIZE = 8


def body_fingerprint(body: bytes) -> str:
    """Fingerprint of a response body.

    >>> body_fingerprint(b"hello")
    'a7b6eda801e5347d'
    """
    return hashlib.blake2b(body, digest_size=_DIGEST_SIZE).hexdigest()


def _default(value: Any) -> Any:
    # Sets have no order; everything else unknown is reduced to its text.
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def item_fingerprint(
    item: Any,
    *,
    exclude: Collection[str] = (),
    include: Collection[str] | None = None,
) -> str:
    """Fingerprint of an item's fields, independent of field order.

    *include* limits the fields used; *exclude* drops volatile ones (a crawl
    timestamp must not make an item look changed).

    >>> item_fingerprint({"a": 1, "b": [1, 2]}) == item_fingerprint({"b": [1, 2], "a": 1})
    True
    >>> item_fingerprint({"a": 1, "t": 5}, exclude={"t"}) == item_fingerprint({"a": 1})
    True
    """
    adapter = ItemAdapter(item)
    fields = {
        name: value
        for name, value in adapter.items()
        if name not in exclude and (include is None or name in include)
    }
    canonical = json.dumps(
        fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
        default=_default,
    )
    return hashlib.blake2b(
        canonical.encode("utf-8"), digest_size=_DIGEST_SIZE
    ).hexdigest()
