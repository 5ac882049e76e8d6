"""The docs cover the code, and the code's names are the docs' names.

- every setting of ``DEFAULT_SETTINGS`` has a heading in
  ``docs/reference/settings.md`` with the same default, and nothing else does;
- every ``META_*`` key of ``incremental_crawler/meta.py`` has a heading in
  ``docs/reference/meta.md``, and nothing else does;
- every stat the package writes (``incremental/...``, ``cluster/...``, found
  by reading the source with :mod:`ast`) has a row in
  ``docs/reference/stats.md``, and every row names a stat the code writes;
- every relative link of README.md and docs/ reaches a file (and a heading,
  for ``#anchors``);
- neither the package nor the docs point at notes outside the repository.

Formats the checks rely on (see the pages themselves):

- settings.md: ``### INCREMENTAL_NAME`` then, before the next heading, a line
  ``Default: `<Python literal>` `` (or ``Default:`` followed by a
  ```` ```python ```` block holding the literal);
- meta.md: ``### incremental_key``;
- stats.md: table rows whose first cell is the stat in backticks,
  ``| `incremental/not_modified` | ...``; a ``<name>`` part stands for a value
  the code fills in (a status code, a slot).
"""

from __future__ import annotations

import ast
import functools
import re
from itertools import product
from pathlib import Path
from typing import Any

import pytest

from incremental_crawler import meta
from incremental_crawler.change.policy import Refetch, RequestReason, Verdict
from incremental_crawler.config import DEFAULT_SETTINGS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "incremental_crawler"
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"

#: Stat namespaces the project owns.
STAT_PREFIXES = ("incremental/", "cluster/")
#: StatsCollector methods that write a stat; their first argument is its key.
STAT_WRITERS = frozenset({"inc_value", "set_value", "max_value", "min_value"})
#: Strings of the package that start like a stat but are none.
NOT_STATS = frozenset({
    "incremental/state.db",  # the SQLite file under Scrapy's data dir
})


# -- Markdown ------------------------------------------------------------------

_FENCE = re.compile(r"^\s*(```|~~~)")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """``(number, line)`` of the lines outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading (before de-duplication).

    >>> github_slug("Several workers (cluster mode)")
    'several-workers-cluster-mode'
    >>> github_slug("INCREMENTAL_MAX_AGE")
    'incremental_max_age'
    >>> github_slug("`incremental_skip`: opt out")
    'incremental_skip-opt-out'
    """
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, duplicates numbered as GitHub does."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _prose_lines(path.read_text()):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = github_slug(match.group(1))
        if slug in seen:
            seen[slug] += 1
            found.add(f"{slug}-{seen[slug]}")
        else:
            seen[slug] = 0
            found.add(slug)
    return found


def headings(path: Path, level: int) -> list[tuple[str, list[str]]]:
    """``(heading text, body lines)`` of every heading of *level* in *path*."""
    sections: list[tuple[str, list[str]]] = []
    fenced = False
    for line in path.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        match = None if fenced else re.match(r"^(#{1,6})\s+(.*?)\s*$", line)
        if match:
            if len(match.group(1)) == level:
                sections.append((match.group(2), []))
                continue
            if len(match.group(1)) < level:
                sections.append(("", []))  # a higher heading ends the section
                continue
        if sections:
            sections[-1][1].append(line)
    return [(title, body) for title, body in sections if title]


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


# -- settings ------------------------------------------------------------------


def documented_settings() -> dict[str, list[str]]:
    """Setting name -> the body of its heading in settings.md."""
    found: dict[str, list[str]] = {}
    for title, body in headings(REFERENCE / "settings.md", 3):
        assert title not in found, f"settings.md: {title} has two headings"
        found[title] = body
    return found


def documented_default(name: str, body: list[str]) -> Any:
    """The default a settings.md entry gives, as a Python value."""
    for index, line in enumerate(body):
        if line.startswith("Default: `"):
            match = re.match(r"^Default: `([^`]+)`", line)
            assert match, f"settings.md, {name}: {line!r} is not 'Default: `VALUE`'"
            return ast.literal_eval(match.group(1))
        if line.strip() == "Default:":
            rest = body[index + 1:]
            start = next(i for i, text in enumerate(rest) if text.strip())
            assert rest[start].strip() == "```python", (
                f"settings.md, {name}: 'Default:' must be followed by a ```python block")
            end = next(i for i in range(start + 1, len(rest)) if rest[i].strip() == "```")
            return ast.literal_eval("\n".join(rest[start + 1:end]))
    raise AssertionError(f"settings.md, {name}: no 'Default: `VALUE`' line")


def same_value(documented: Any, actual: Any) -> bool:
    """Equal, and of the same types all the way down (``True`` is not ``1``)."""
    if type(documented) is not type(actual):
        return False
    if isinstance(actual, dict):
        return documented.keys() == actual.keys() and all(
            same_value(documented[k], actual[k]) for k in actual)
    if isinstance(actual, (list, tuple)):
        return len(documented) == len(actual) and all(
            same_value(d, a) for d, a in zip(documented, actual, strict=True))
    return documented == actual


def test_every_setting_is_documented() -> None:
    documented = documented_settings()
    missing = sorted(set(DEFAULT_SETTINGS) - set(documented))
    assert missing == [], f"settings without an entry in docs/reference/settings.md: {missing}"


def test_every_documented_setting_exists() -> None:
    unknown = sorted(set(documented_settings()) - set(DEFAULT_SETTINGS))
    assert unknown == [], f"docs/reference/settings.md documents settings the code lacks: {unknown}"


def test_documented_defaults_are_the_code_defaults() -> None:
    wrong = []
    for name, body in documented_settings().items():
        if name not in DEFAULT_SETTINGS:
            continue
        value = documented_default(name, body)
        if not same_value(value, DEFAULT_SETTINGS[name]):
            wrong.append(f"{name}: documented {value!r}, code {DEFAULT_SETTINGS[name]!r}")
    assert wrong == [], "defaults in docs/reference/settings.md differ:\n" + "\n".join(wrong)


def test_settings_are_named_in_full() -> None:
    # "INCREMENTAL_REVISIT_MIN / _MAX": grep finds neither _MAX nor the setting.
    offenders = []
    for path in doc_pages():
        for number, line in _prose_lines(path.read_text()):
            offenders.extend(
                f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
                for match in re.finditer(r"(?<![A-Z0-9_])_[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*\b", line))
    assert offenders == [], "write settings in full:\n" + "\n".join(offenders)


# -- request meta keys ---------------------------------------------------------


def meta_keys() -> dict[str, str]:
    """``META_*`` constant -> its value, read from incremental_crawler/meta.py."""
    tree = ast.parse((PACKAGE / "meta.py").read_text())
    found = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.startswith("META_"):
                    found[target.id] = node.value.value
    return found


def test_meta_module_is_read() -> None:
    keys = meta_keys()
    # The keys the module exports, read from its source with their values.
    assert {name: keys.get(name) for name in meta.__all__} == {
        name: getattr(meta, name) for name in meta.__all__}
    assert "incremental_skip" in keys.values()


def test_every_meta_key_is_documented() -> None:
    documented = {title.strip("`") for title, _ in headings(REFERENCE / "meta.md", 3)}
    missing = sorted(set(meta_keys().values()) - documented)
    assert missing == [], f"meta keys without an entry in docs/reference/meta.md: {missing}"


def test_every_documented_meta_key_exists() -> None:
    documented = {title.strip("`") for title, _ in headings(REFERENCE / "meta.md", 3)}
    unknown = sorted(documented - set(meta_keys().values()))
    assert unknown == [], f"docs/reference/meta.md documents keys meta.py lacks: {unknown}"


# -- stats -----------------------------------------------------------------------


class _Module:
    """One source file: its functions, to follow a key's parts to their values."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = ast.parse(path.read_text(), str(path))
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        self.parent: dict[int, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[id(child)] = node
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, []).append(node)

    def enclosing_function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        while (node := self.parent.get(id(node))) is not None:  # type: ignore[assignment]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
        return None

    def values(self, node: ast.expr, depth: int = 0) -> set[str]:
        """The strings *node* can be: ``<name>`` where a part is only known at run time."""
        if depth > 8:
            return {_placeholder(node)}
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.IfExp):
            return self.values(node.body, depth + 1) | self.values(node.orelse, depth + 1)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return {a + b for a, b in product(self.values(node.left, depth + 1),
                                              self.values(node.right, depth + 1))}
        if isinstance(node, ast.JoinedStr):
            parts: list[set[str]] = []
            for value in node.values:
                if isinstance(value, ast.FormattedValue):
                    parts.append(self.values(value.value, depth + 1))
                else:
                    parts.append(self.values(value, depth + 1))
            return {"".join(combo) for combo in product(*parts)}
        if isinstance(node, ast.Name):
            return self._name_values(node, depth)
        if isinstance(node, ast.Call):
            return self._returned_values(node, depth)
        return {_placeholder(node)}

    def _returned_values(self, call: ast.Call, depth: int) -> set[str]:
        """What a helper of this module returns (``self._key(...)``), if it is one."""
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        found: set[str] = set()
        for function in self.functions.get(name or "", []):
            for node in ast.walk(function):
                if isinstance(node, ast.Return) and node.value is not None:
                    found |= self.values(node.value, depth + 1)
        return found or {_placeholder(call)}

    def _name_values(self, node: ast.Name, depth: int) -> set[str]:
        function = self.enclosing_function(node)
        if function is None:
            return {_placeholder(node)}
        found: set[str] = set()
        for statement in ast.walk(function):
            if isinstance(statement, ast.Assign):
                for target in statement.targets:
                    found |= self._assigned(target, statement.value, node.id, depth)
            elif isinstance(statement, (ast.For, ast.AsyncFor, ast.comprehension)) and any(
                    isinstance(n, ast.Name) and n.id == node.id
                    for n in ast.walk(statement.target)):
                found.add(_placeholder(node))
        params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
        if node.id in params:
            found |= self._argument_values(function, params.index(node.id), node.id, depth)
        return found or {_placeholder(node)}

    def _assigned(self, target: ast.expr, value: ast.expr, name: str, depth: int) -> set[str]:
        if isinstance(target, ast.Name):
            return self.values(value, depth + 1) if target.id == name else set()
        if isinstance(target, ast.Tuple):
            if isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts):
                found: set[str] = set()
                for sub_target, sub_value in zip(target.elts, value.elts, strict=True):
                    found |= self._assigned(sub_target, sub_value, name, depth)
                return found
            if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target)):
                return {f"<{name}>"}
        return set()

    def _argument_values(self, function: ast.FunctionDef | ast.AsyncFunctionDef, index: int,
                         name: str, depth: int) -> set[str]:
        """What the module's own calls of *function* pass as its parameter *name*.

        A public function may be called from other modules too: its
        parameter also stands for any value (``<name>``).
        """
        is_method = bool(function.args.args) and function.args.args[0].arg in ("self", "cls")
        found: set[str] = set() if function.name.startswith("_") else {f"<{name}>"}
        for call in ast.walk(self.tree):
            if not isinstance(call, ast.Call):
                continue
            func = call.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called != function.name:
                continue
            position = index - 1 if is_method and isinstance(func, ast.Attribute) else index
            argument = next((k.value for k in call.keywords if k.arg == name), None)
            if argument is None and 0 <= position < len(call.args):
                argument = call.args[position]
            if argument is not None:
                found |= self.values(argument, depth + 1)
        return found

    def stat_writes(self) -> set[str]:
        """Every key this module's stats writes can have, in our namespaces."""
        keys: set[str] = set()
        for node in ast.walk(self.tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in STAT_WRITERS and node.args):
                keys |= {k for k in self.values(node.args[0]) if k.startswith(STAT_PREFIXES)}
        return keys

    def stat_like_strings(self) -> set[str]:
        """Every string or f-string of the module that starts like one of our stats."""
        found: set[str] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if self._inside_joined_str(node):
                    continue
                found.add(node.value)
            elif isinstance(node, ast.JoinedStr):
                found.add("".join(
                    v.value if isinstance(v, ast.Constant) else _placeholder(v.value)
                    for v in node.values))
        return {s for s in found if s.startswith(STAT_PREFIXES)}

    def _inside_joined_str(self, node: ast.AST) -> bool:
        return isinstance(self.parent.get(id(node)), ast.JoinedStr)


def _placeholder(node: ast.expr) -> str:
    """``<name>`` for a part known only at run time: ``sitemap.type`` -> ``<type>``."""
    names = [n.attr if isinstance(n, ast.Attribute) else n.id
             for n in ast.walk(node) if isinstance(n, (ast.Attribute, ast.Name))]
    return f"<{names[0] if names else 'value'}>"


def _modules() -> list[_Module]:
    return [_Module(path) for path in sorted(PACKAGE.rglob("*.py"))]


@functools.cache  # the package's sources, parsed once for the module's tests (read only)
def code_stats() -> dict[str, set[str]]:
    """Stat key pattern -> the modules writing it."""
    found: dict[str, set[str]] = {}
    for module in _modules():
        for key in module.stat_writes():
            found.setdefault(key, set()).add(str(module.path.relative_to(ROOT)))
    return found


def documented_stats() -> set[str]:
    found: set[str] = set()
    for _, line in _prose_lines((REFERENCE / "stats.md").read_text()):
        match = re.match(r"^\|\s*`([^`]+)`\s*\|", line)
        if match and match.group(1).startswith(STAT_PREFIXES):
            assert match.group(1) not in found, f"stats.md: {match.group(1)} has two rows"
            found.add(match.group(1))
    return found


def _pattern(key: str) -> re.Pattern[str]:
    """A code key as a regex: its ``<name>`` parts match any one path segment part."""
    parts = re.split(r"(<[^<>/]+>)", key)
    return re.compile("".join(
        "[^/]+" if part.startswith("<") and part.endswith(">") else re.escape(part)
        for part in parts))


def matches(documented: str, code_key: str) -> bool:
    """Whether a documented stat is one the code key can be.

    A ``<name>`` of the code matches anything in its segment (a documented
    ``<status>`` or a value, ``404``); a ``<name>`` of the docs matches only
    a ``<name>`` of the code.
    """
    return _pattern(code_key).fullmatch(documented) is not None


def test_the_stat_finder_follows_keys_through_the_code() -> None:
    stats = code_stats()
    # Literals, f-strings, a prefix chosen by an expression plus an argument
    # of a helper, and a prefix kept in a variable.
    for key in ("incremental/not_due", "incremental/status_kept/<status>",
                "incremental/discovery/not_modified", "incremental/discovery/pages_new",
                "incremental/throttle/<key>/window", "cluster/workers_max"):
        assert key in stats, key


# Stats whose last part is an enum's value: each value needs its own row.
ENUM_STATS = {
    "incremental/requests/": RequestReason,
    "incremental/discovery/requests/": RequestReason,
    "incremental/refetch/": Refetch,
    "incremental/validators/": Verdict,
}


@pytest.mark.parametrize("prefix", list(ENUM_STATS))
def test_every_value_of_a_stat_enum_is_documented(prefix: str) -> None:
    stats = code_stats()
    # The code builds the key from the enum (one f-string for every value)...
    assert any(key.startswith(prefix + "<") for key in stats), prefix
    # ... and every value it can take has a row.
    documented = documented_stats()
    missing = [prefix + value for value in ENUM_STATS[prefix]
               if prefix + value not in documented]
    assert missing == [], f"stats.md lacks rows for {missing}"


def test_every_stat_the_code_writes_is_documented() -> None:
    documented = documented_stats()
    missing = sorted(
        f"{key}  ({', '.join(sorted(where))})" for key, where in code_stats().items()
        if not any(matches(doc, key) for doc in documented))
    assert missing == [], "stats without a row in docs/reference/stats.md:\n" + "\n".join(missing)


def test_every_documented_stat_is_written_by_the_code() -> None:
    stats = code_stats()
    unknown = sorted(doc for doc in documented_stats()
                     if not any(matches(doc, key) for key in stats))
    assert unknown == [], f"docs/reference/stats.md documents stats no code writes: {unknown}"


def test_every_stat_like_string_of_the_package_is_documented() -> None:
    # A key built where the finder above cannot follow it still shows as a
    # string: it must name (or begin) a documented stat.
    documented = documented_stats()
    stray = []
    for module in _modules():
        for text in module.stat_like_strings() - NOT_STATS:
            if text.endswith("/"):
                ok = any(doc.startswith(text) for doc in documented)
            else:
                ok = any(matches(doc, text) for doc in documented)
            if not ok:
                stray.append(f"{module.path.relative_to(ROOT)}: {text}")
    assert stray == [], "stat-like strings not in docs/reference/stats.md:\n" + "\n".join(stray)


# -- links and outside references ------------------------------------------------

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in _prose_lines(path.read_text()):
        prose = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        found.extend((number, target) for target in _LINK.findall(prose))
    return found


def test_docs_exist() -> None:
    for name in ("guide.md", "politeness.md", "cluster.md", "scrapyd.md", "design.md",
                 "architecture.md", "reference/settings.md", "reference/stats.md",
                 "reference/meta.md"):
        assert (DOCS / name).is_file(), name


def test_links_reach_files_and_headings() -> None:
    broken = []
    for page in doc_pages():
        for number, target in _links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            if ROOT not in linked.parents and linked != ROOT:
                broken.append(f"{where} (outside the repository)")
            elif not linked.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
                broken.append(f"{where} (no such heading)")
    assert broken == [], "broken links:\n" + "\n".join(broken)


_OUTSIDE = re.compile(r"rules\.md|product\.md|\binvariants?\s*(?:no\.?\s*|#\s*)?\d", re.I)


@pytest.mark.parametrize("where", ["package", "docs"])
def test_nothing_points_outside_the_repository(where: str) -> None:
    if where == "package":
        paths = [p for p in sorted(PACKAGE.rglob("*")) if p.suffix in (".py", ".lua", ".md")]
    else:
        paths = doc_pages()
    offenders = []
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if match := _OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)}")
    assert offenders == [], "references to notes outside the repository:\n" + "\n".join(offenders)
