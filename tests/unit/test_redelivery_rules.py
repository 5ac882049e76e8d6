"""Which stored versions are emitted again as one item (at-least-once delivery)."""

from __future__ import annotations

from incremental_crawler.crawl.ledger import _one_per_item
from incremental_crawler.state.records import StoredVersion, Undelivered


def version(key: str, n: int, change: str, stored_at: float, /, **data: object) -> Undelivered:
    return Undelivered("c1", StoredVersion("s", key, n, change, stored_at,
                                           "" if change == "deleted" else f"fp-{key}",
                                           dict(data)))


def keys(chunk: list[Undelivered]) -> list[list[str]]:
    return [[p.version.key for p in group] for group in _one_per_item(chunk)]


def test_each_version_is_an_item_of_its_own() -> None:
    chunk = [version("a", 1, "new", 10, url="a"), version("a", 2, "changed", 11, url="a"),
             version("b", 1, "new", 11, url="b")]
    assert keys(chunk) == [["a"], ["a"], ["b"]]


def test_a_tombstone_stored_once_per_item_of_its_page_is_one_item() -> None:
    gone = {"url": "p", "change": "deleted", "item_keys": ["p#1", "p#2"]}
    chunk = [version("p#1", 2, "deleted", 20, **gone), version("p#2", 2, "deleted", 20, **gone),
             # Another page's tombstone, and the same one stored at another time.
             version("q", 2, "deleted", 20, url="q", change="deleted"),
             version("p#3", 2, "deleted", 21, **gone)]
    assert keys(chunk) == [["p#1", "p#2"], ["q"], ["p#3"]]


def test_a_tombstone_is_one_item_where_it_first_comes() -> None:
    gone = {"url": "p", "change": "deleted"}
    chunk = [version("o", 1, "new", 20, url="o"), version("p#1", 2, "deleted", 20, **gone),
             version("x", 1, "new", 20, url="x"), version("p#2", 2, "deleted", 20, **gone)]
    assert keys(chunk) == [["o"], ["p#1", "p#2"], ["x"]]
