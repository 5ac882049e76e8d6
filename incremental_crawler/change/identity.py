"""What identifies an item across runs, and what fingerprints its content."""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter

from incremental_crawler.change.fingerprints import Normaliser, comparable, item_fingerprint
from incremental_crawler.state.keys import canonical_url

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Spider

    from incremental_crawler.config import IncrementalConfig

__all__ = ["ItemIdentity", "serialize_item"]


def serialize_item(item: Any) -> str:
    """The item as stored: JSON of its fields (ASCII-escaped: faster to encode)."""
    return json.dumps(ItemAdapter(item).asdict(), default=str)


class ItemIdentity:
    """Item key and fingerprint, from settings with per-spider overrides.

    A spider may set ``incremental_item_key_field`` (a field name),
    ``incremental_fingerprint_fields`` (only these fields count),
    ``incremental_volatile_fields`` (these never count) or
    ``incremental_fingerprint_ignore`` (regexes removed from text), or define
    ``incremental_item_key(item) -> str``.

    The fields the crawl itself writes into items (the fingerprint, the
    change feed's change, previous fingerprint and changed fields) never
    count in the fingerprint: an item that only gained them is unchanged.
    """

    def __init__(
        self, config: IncrementalConfig, spider: Spider,
        canonical: Callable[[str], str] = canonical_url,
    ) -> None:
        self._canonical = canonical
        self.fingerprint_field = config.fingerprint_field
        self.change_field = config.change_field
        self.previous_field = config.previous_fingerprint_field
        self.changed_fields_field = config.changed_fields_field
        own = {self.fingerprint_field, self.change_field, self.previous_field,
               self.changed_fields_field}
        self.key_field: str = getattr(
            spider, "incremental_item_key_field", config.item_key_field
        )
        volatile = getattr(spider, "incremental_volatile_fields", config.volatile_fields)
        self.exclude = frozenset(volatile) | {name for name in own if name}
        include = getattr(spider, "incremental_fingerprint_fields", None)
        self.include = frozenset(include) if include is not None else None
        self.normaliser = Normaliser(
            getattr(spider, "incremental_fingerprint_ignore", config.fingerprint_ignore)
        )
        self._key_method = getattr(spider, "incremental_item_key", None)

    def fingerprint(self, item: Any) -> str:
        return item_fingerprint(
            item, exclude=self.exclude, include=self.include, normaliser=self.normaliser
        )

    def key(self, item: Any, fingerprint: str | None = None) -> str:
        if self._key_method is not None:
            return str(self._key_method(item))
        value = ItemAdapter(item).get(self.key_field)
        if isinstance(value, str) and value:
            if value.startswith(("http://", "https://")):
                return self._canonical(value)
            return value
        if value is not None:
            return str(value)
        # No key field: the content is the identity, so an identical item is
        # still recognised as already stored.
        return "fp:" + (fingerprint or self.fingerprint(item))

    def url(self, item: Any) -> str | None:
        value = ItemAdapter(item).get("url")
        return value if isinstance(value, str) else None

    def set_fingerprint(self, item: Any, fingerprint: str) -> None:
        # An item class without that field cannot carry it; the fingerprint
        # is still stored beside the item.
        _set(item, self.fingerprint_field, fingerprint)

    def set_change(self, item: Any, change: str, *, previous: str | None = None,
                   changed_fields: list[str] | None = None) -> None:
        """Say in *item* what it is (the change feed's fields, those switched on).

        *previous* (a changed item's stored fingerprint) and *changed_fields*
        are set only when given. Like the fingerprint, a field the item's
        class lacks is left out.
        """
        _set(item, self.change_field, str(change))
        if previous is not None:
            _set(item, self.previous_field, previous)
        if changed_fields is not None:
            _set(item, self.changed_fields_field, changed_fields)

    def changed_fields(self, item: Any, stored: str) -> list[str]:
        """Top-level fields of *item* whose values differ from *stored* (JSON).

        Only the fields that count in the fingerprint (so never a volatile
        one), compared as the fingerprint compares them (text normalised), a
        field present on one side only included. The item is compared as
        stored: through JSON, as :func:`serialize_item` writes it.
        """
        old = json.loads(stored)
        new = json.loads(serialize_item(item))
        if not isinstance(old, dict):
            old = {}
        names = set(old) | set(new)
        return sorted(
            name for name in names
            if name not in self.exclude and (self.include is None or name in self.include)
            and (name not in old or name not in new
                 or comparable(old[name], self.normaliser)
                 != comparable(new[name], self.normaliser))
        )


def _set(item: Any, field: str | None, value: Any) -> None:
    if field is None:
        return
    with contextlib.suppress(KeyError):
        ItemAdapter(item)[field] = value
