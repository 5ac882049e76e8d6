"""The package's shape: layers that point one way, no import circles, no
components hung on the crawler.

Components find each other through Scrapy's own lookups
(``crawler.get_extension()``) or are handed what they need; a module never
imports, directly or through others, a module that imports it back.

The layers, bottom to top (:data:`LAYERS`, the same list as in
docs/architecture.md): a module imports only modules of its own layer or of
a lower one. Every import counts: at the top of a module, inside a function
(an import deferred for the start-up time it costs is still a dependency)
and under ``TYPE_CHECKING`` (an annotation naming a higher layer's class is
a dependency on it as well: a lower layer that needs to name what a higher
one hands it names a ``Protocol`` of its own, as
:class:`~incremental_crawler.crawl.reseed.RunClaims` does).
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


#: Bottom to top: each layer's modules, by the longest dotted prefix that names
#: them (a package names its modules, a module itself; the package's own
#: ``__init__``, ``incremental_crawler``, names only itself).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Pure helpers: no records, no decisions, nothing of a crawl.
    ("helpers", (
        "incremental_crawler", "incremental_crawler.meta", "incremental_crawler.clock",
        "incremental_crawler.exceptions", "incremental_crawler.uris",
        "incremental_crawler._reactor", "incremental_crawler.config",
        "incremental_crawler.ignore_patterns", "incremental_crawler.hosts",
        "incremental_crawler.formats", "incremental_crawler.recipes",
        "incremental_crawler.offsite", "incremental_crawler.parsed_trees",
        "incremental_crawler.redis_retry", "incremental_crawler.redis_cluster",
        "incremental_crawler.lua", "incremental_crawler.http",
    )),
    # What a crawl keeps: records, keys, stores. Storage only.
    ("storage", ("incremental_crawler.state",)),
    # The decisions over what is stored: change detection, lists, what ends a crawl.
    ("decisions", (
        "incremental_crawler.change", "incremental_crawler.lists", "incremental_crawler.fatal",
    )),
    # The crawl's orchestration: the ledger and the components that drive it.
    ("orchestration", ("incremental_crawler.crawl",)),
    # Staying welcome: the throttle and robots.txt, over the crawl's ledger.
    ("politeness", ("incremental_crawler.politeness",)),
    # What is built on all of it, and the old import paths (re-exports only).
    ("top", (
        "incremental_crawler.spiders", "incremental_crawler.cluster",
        "incremental_crawler.report", "incremental_crawler.metrics",
        "incremental_crawler.commands", "incremental_crawler.demo",
        "incremental_crawler.addon", "incremental_crawler.settings",
        *(OLD_PATHS := (
            "incremental_crawler.stores", "incremental_crawler.downloadermiddlewares",
            "incremental_crawler.state.ledger", "incremental_crawler.state.middlewares",
            "incremental_crawler.state.delivery", "incremental_crawler.state.pipeline",
            "incremental_crawler.change.middleware", "incremental_crawler.change.pipeline",
            "incremental_crawler.change.due_filter", "incremental_crawler.change.outcomes",
            "incremental_crawler.change.schedule", "incremental_crawler.links",
        )),
    )),
)


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of *module*'s layer (its longest prefix)."""
    best, depth = -1, -1
    for number, (_name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module.startswith(prefix + ".") and prefix != PACKAGE.name
            if (module == prefix or inside) and prefix.count(".") > depth:
                best, depth = number, prefix.count(".")
    if best < 0:
        raise LookupError(f"{module} is in no layer: add it to LAYERS")
    return best


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a lower layer to a higher one, as "importer -> imported"."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items() for target in targets
        if layer_of(target) > layer_of(module))


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


def test_layer_checker_finds_an_upward_import() -> None:
    graph = {
        "incremental_crawler.state.records": {"incremental_crawler.crawl.ledger"},
        "incremental_crawler.crawl.ledger": {"incremental_crawler.state.records"},
        "incremental_crawler.state.stores.base": {"incremental_crawler.config"},
    }
    assert upward_imports(graph) == [
        "incremental_crawler.state.records -> incremental_crawler.crawl.ledger"]
    assert layer_of("incremental_crawler.state.ledger") == len(LAYERS) - 1  # an old path
    with pytest.raises(LookupError):
        layer_of("incremental_crawler.somewhere_new")


def test_layers_point_one_way() -> None:
    graph = import_graph(with_type_checking=True)
    assert len(graph) > 30  # the walk found the package
    for module in graph:
        layer_of(module)  # every module has its layer
    assert upward_imports(graph) == []


def test_old_import_paths_only_re_export() -> None:
    # An old path is a thin re-export, at the top: nothing of the package
    # imports it, and it defines nothing of its own.
    graph = import_graph(with_type_checking=True)
    old = {m for m in graph if any(m == p or m.startswith(p + ".") for p in OLD_PATHS)}
    assert len(old) >= len(OLD_PATHS)
    importers = sorted(f"{m} -> {t}" for m in graph.keys() - old for t in graph[m] & old)
    assert importers == []
    for module in old:
        path = PACKAGE.parent / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = PACKAGE.parent / module.replace(".", "/") / "__init__.py"
        body = ast.parse(path.read_text()).body
        defined = [n for n in body if not isinstance(n, (ast.Import, ast.ImportFrom, ast.Expr))
                   and not (isinstance(n, ast.Assign) and n.targets[0].id == "__all__")]
        assert defined == [], module


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


@pytest.mark.parametrize(("old", "new"), [
    ("state.ledger.Ledger", "crawl.ledger.Ledger"),
    ("state.middlewares.PageOutputMiddleware", "crawl.callback_output.PageOutputMiddleware"),
    ("state.middlewares.CallbackGuardMiddleware", "crawl.callback_output.CallbackGuardMiddleware"),
    ("state.delivery.RedeliveryMiddleware", "crawl.delivery.RedeliveryMiddleware"),
    ("state.pipeline.StoragePipeline", "crawl.storage_pipeline.StoragePipeline"),
    ("change.pipeline.FingerprintPipeline", "crawl.fingerprint_pipeline.FingerprintPipeline"),
    ("change.middleware.ConditionalRequestMiddleware",
     "crawl.conditional.ConditionalRequestMiddleware"),
    ("change.due_filter.NotDueFilterMiddleware", "crawl.due_filter.NotDueFilterMiddleware"),
    ("change.outcomes.FinalOutcomeMiddleware", "crawl.outcomes.FinalOutcomeMiddleware"),
    ("change.outcomes.MovedPageMiddleware", "crawl.outcomes.MovedPageMiddleware"),
    ("links.reseed.Reseeder", "crawl.reseed.Reseeder"),
    ("change.schedule.Why", "change.accounting.Why"),
    ("change.schedule.ScheduleCounter", "change.accounting.ScheduleCounter"),
    ("cluster.ClusterError", "exceptions.ClusterError"),
])
def test_the_components_old_paths_still_load(old: str, new: str) -> None:
    # Component paths a project's settings may name, from before the layers.
    from scrapy.utils.misc import load_object

    assert load_object(f"incremental_crawler.{old}") is load_object(f"incremental_crawler.{new}")
