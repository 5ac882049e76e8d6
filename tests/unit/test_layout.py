"""The package's shape: no import circles, no components hung on the crawler.

Components find each other through Scrapy's own lookups
(``crawler.get_extension()``) or are handed what they need; a module never
imports, directly or through others, a module that imports it back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "incremental_crawler"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(*, with_type_checking: bool) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in its body)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        skip: set[int] = set()
        if not with_type_checking:
            for node in ast.walk(tree):
                if isinstance(node, ast.If) and _is_type_checking(node):
                    skip.update(id(n) for child in node.body for n in ast.walk(child))
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            found: list[str] = []
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            targets.update(t for t in found if t in modules and t != name)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("with_type_checking", [False, True])
def test_no_import_circles(with_type_checking: bool) -> None:
    graph = import_graph(with_type_checking=with_type_checking)
    assert len(graph) > 30  # the walk found the package
    assert cycles(graph) == []


def test_no_component_is_hung_on_the_crawler() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "crawler.incremental_" in line or 'crawler, "incremental_' in line:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{number}")
    assert offenders == []


def test_the_wall_clock_is_read_in_one_place() -> None:
    # Tests move a crawl to "a day later" by replacing clock.now: a module
    # reading time.time() itself would stay in the present.
    readers = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "demo" or relative.name == "clock.py":
            continue  # the demo's server keeps its own clock, as a server does
        if "time.time()" in path.read_text():
            readers.append(str(relative))
    assert readers == []


def test_the_documented_old_import_paths_still_work() -> None:
    # Settings and errbacks written for the earlier layout keep loading.
    from scrapy.utils.misc import load_object

    from incremental_crawler import exceptions, meta
    from incremental_crawler.downloadermiddlewares import conditional
    from incremental_crawler.state.stores.redis import RedisStateStore
    from incremental_crawler.state.stores.sqlite import SQLiteStateStore

    assert conditional.NotModified is exceptions.NotModified
    assert conditional.NotDue is exceptions.NotDue
    assert conditional.META_SKIP == meta.META_SKIP
    assert load_object("incremental_crawler.stores.sqlite.SQLiteStateStore") is SQLiteStateStore
    assert load_object("incremental_crawler.stores.redis.RedisStateStore") is RedisStateStore
    assert load_object("incremental_crawler.addon.IncrementalAddon").__name__ == "IncrementalAddon"
