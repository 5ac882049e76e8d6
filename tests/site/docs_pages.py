"""Generated documentation pages: the structure of a Sphinx-built manual.

A real documentation page (Python's own HTML manual, say) is not a run of
``<p>`` elements: it is ~100 kB of navigation bars, a sidebar table of
contents, a footer, inline ``<script>``/``<style>``, and a main part full of
syntax-highlighted code (one ``<span>`` per token), API signatures (a
``<span>`` per name and bracket), tables, admonitions, definition lists,
entities and non-ASCII text, so thousands of text nodes per page. Text
extraction and parsing cost depend on that structure, which is why the
cold-crawl benchmark and the extraction tests use these pages rather than
the site's plain ones.

:func:`render_docs_page` is deterministic: the same *seed* gives the same
bytes. Nothing here is third-party content: the prose is drawn from a word
list, the code is generated.
"""

from __future__ import annotations

import html
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["render_docs_page"]

_WORDS: tuple[str, ...] = (
    "the", "of", "a", "to", "is", "and", "in", "value", "object", "argument", "returns",
    "function", "module", "default", "string", "list", "if", "not", "be", "can", "with",
    "called", "instance", "method", "attribute", "raised", "exception", "parser", "option",
    "file", "path", "encoding", "buffer", "stream", "socket", "thread", "lock", "queue",
    "iterator", "generator", "context", "manager", "keyword", "positional", "optional",
    "mapping", "sequence", "bytes", "integer", "float", "None", "True", "False", "this",
    "that", "when", "which", "used", "new", "see", "also", "changed", "version", "deprecated",
    "since", "must", "may", "should", "each", "every", "first", "last", "number", "size",
    "timeout", "signal", "handler", "event", "loop", "task", "future", "result", "callback",
    "protocol", "transport", "server", "client", "request", "response", "header", "cookie",
    # Non-ASCII, as in a manual's examples and names.
    "café", "naïve", "Zürich", "straße", "résumé", "Ελληνικά", "日本語", "中文", "Ünïcödé",
    "emoji 🐍", "naïveté", "Dvořák", "Łódź", "ångström",
)
_IDENTS: tuple[str, ...] = (
    "parser", "args", "value", "result", "data", "path", "name", "items", "key", "self",
    "config", "stream", "buf", "handler", "loop", "task", "conn", "sock", "timeout", "msg",
)
_CALLS: tuple[str, ...] = (
    "open", "read", "write", "add_argument", "parse_args", "get", "append", "join", "split",
    "encode", "decode", "connect", "send", "recv", "run", "create_task", "sleep", "close",
)
_TYPES: tuple[str, ...] = ("str", "int", "bytes", "list", "dict", "float", "bool", "object")
_ENTITIES: tuple[str, ...] = (
    "&amp;", "&lt;", "&gt;", "&quot;", "&#8212;", "&#8217;", "&nbsp;", "&copy;", "&hellip;",
    "&#x2014;", "&eacute;", "&rarr;",
)
_HEAD_SCRIPT = (
    "<script>\n  var DOCUMENTATION_OPTIONS = {VERSION: '3.12', LANGUAGE: 'en', "
    "HAS_SOURCE: true};\n  if (window.innerWidth < 700 && document.body) "
    "{ document.body.classList.add('mobile'); }\n  /* </p> inside a script is not text */\n"
    "  var s = '<div class=\"x\">not content</div>';\n</script>\n"
)
_HEAD_STYLE = (
    "<style>\n  @media only screen { div.document { margin: 0 auto; } }\n"
    "  div.body p > code::before { content: '\\201C'; }\n</style>\n"
)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _inline(rng: random.Random) -> str:
    """One sentence of prose with the inline markup a manual has."""
    parts: list[str] = [_words(rng, rng.randint(4, 12)).capitalize()]
    for _ in range(rng.randint(1, 4)):
        pick = rng.random()
        ident = rng.choice(_IDENTS)
        if pick < 0.35:
            parts.append(f'<code class="docutils literal notranslate"><span class="pre">'
                         f"{ident}</span></code>")
        elif pick < 0.55:
            parts.append(f'<a class="reference internal" href="#{ident}" title="{ident}">'
                         f'<code class="xref py py-func docutils literal notranslate">'
                         f'<span class="pre">{ident}()</span></code></a>')
        elif pick < 0.7:
            parts.append(f"<em>{_words(rng, 2)}</em>")
        elif pick < 0.8:
            parts.append(f"<strong>{_words(rng, 1)}</strong>")
        elif pick < 0.9:
            parts.append(rng.choice(_ENTITIES))
        else:
            parts.append(f'<a class="reference external" href="https://example.org/{ident}">'
                         f"{_words(rng, 2)}</a>")
        parts.append(_words(rng, rng.randint(3, 10)))
    return " ".join(parts) + "."


def _paragraph(rng: random.Random) -> str:
    return "<p>" + " ".join(_inline(rng) for _ in range(rng.randint(1, 4))) + "</p>\n"


def _code_block(rng: random.Random) -> str:
    """A highlighted code example: a span per token, whitespace as in the source."""
    lines = []
    for _ in range(rng.randint(3, 14)):
        indent = " " * (4 * rng.randint(0, 2))
        target, call = rng.choice(_IDENTS), rng.choice(_CALLS)
        arg = rng.choice(_IDENTS)
        pick = rng.random()
        if pick < 0.5:
            lines.append(
                f'{indent}<span class="n">{target}</span> <span class="o">=</span> '
                f'<span class="n">{arg}</span><span class="o">.</span>'
                f'<span class="n">{call}</span><span class="p">(</span>'
                f'<span class="s1">&#39;{rng.choice(_WORDS)}&#39;</span>'
                f'<span class="p">,</span> <span class="n">{rng.choice(_IDENTS)}</span>'
                f'<span class="o">=</span><span class="mi">{rng.randint(0, 999)}</span>'
                f'<span class="p">)</span>')
        elif pick < 0.7:
            lines.append(f'{indent}<span class="k">for</span> <span class="n">{target}</span>'
                         f' <span class="ow">in</span> <span class="n">{arg}</span>'
                         f'<span class="p">:</span>')
        elif pick < 0.85:
            lines.append(f'{indent}<span class="c1"># {_words(rng, 5)} &lt;&amp;&gt;</span>')
        else:
            lines.append(f'<span class="gp">&gt;&gt;&gt; </span><span class="nb">print'
                         f'</span><span class="p">(</span><span class="n">{target}</span>'
                         f'<span class="p">)</span>\n<span class="go">{_words(rng, 3)}'
                         f"</span>")
    return ('<div class="highlight-python3 notranslate"><div class="highlight"><pre>'
            "<span></span>" + "\n".join(lines) + "\n</pre></div>\n</div>\n")


def _signature(rng: random.Random, module: str) -> str:
    """An API entry: signature spans, then its description."""
    name = rng.choice(_CALLS)
    params = [
        f'<em class="sig-param"><span class="n"><span class="pre">{rng.choice(_IDENTS)}'
        f'</span></span><span class="p"><span class="pre">:</span></span>'
        f'<span class="w"> </span><span class="n"><span class="pre">{rng.choice(_TYPES)}'
        f'</span></span><span class="w"> </span><span class="o"><span class="pre">=</span>'
        f'</span><span class="w"> </span><span class="default_value">'
        f'<span class="pre">None</span></span></em>'
        for _ in range(rng.randint(1, 5))
    ]
    sep = '<span class="sig-paren">, </span>'
    return (
        f'<dl class="py function">\n<dt class="sig sig-object py" id="{module}.{name}">\n'
        f'<span class="sig-prename descclassname"><span class="pre">{module}.</span></span>'
        f'<span class="sig-name descname"><span class="pre">{name}</span></span>'
        f'<span class="sig-paren">(</span>{sep.join(params)}<span class="sig-paren">)</span>'
        f'<a class="headerlink" href="#{module}.{name}" title="Link to this definition">'
        f"¶</a>\n</dt>\n<dd>{_paragraph(rng)}{_paragraph(rng)}"
        + (_code_block(rng) if rng.random() < 0.5 else "")
        + '<div class="versionchanged">\n<p><span class="versionmodified changed">Changed in '
        f"version 3.{rng.randint(2, 12)}: </span>{_words(rng, 8)}.</p>\n</div>\n</dd></dl>\n"
    )


def _table(rng: random.Random) -> str:
    rows = []
    for i in range(rng.randint(3, 10)):
        cells = "".join(f"<td><p>{_words(rng, rng.randint(1, 6))}</p></td>" for _ in range(3))
        rows.append(f'<tr class="row-{"odd" if i % 2 else "even"}">{cells}</tr>\n')
    return ('<table class="docutils align-default">\n<thead>\n<tr class="row-odd">'
            '<th class="head"><p>Name</p></th><th class="head"><p>Meaning</p></th>'
            '<th class="head"><p>Default</p></th></tr>\n</thead>\n<tbody>\n'
            + "".join(rows) + "</tbody>\n</table>\n")


def _admonition(rng: random.Random) -> str:
    kind = rng.choice(("note", "warning", "seealso"))
    return (f'<div class="admonition {kind}">\n<p class="admonition-title">{kind.title()}</p>\n'
            f"{_paragraph(rng)}</div>\n")


def _bullets(rng: random.Random) -> str:
    items = "".join(f"<li><p>{_inline(rng)}</p>\n<ul><li><p>{_words(rng, 4)}</p></li></ul>"
                    f"</li>\n" for _ in range(rng.randint(2, 6)))
    return f'<ul class="simple">\n{items}</ul>\n'


def _block(rng: random.Random, module: str) -> str:
    pick = rng.random()
    if pick < 0.45:
        return _paragraph(rng)
    if pick < 0.6:
        return _code_block(rng)
    if pick < 0.72:
        return _signature(rng, module)
    if pick < 0.8:
        return _table(rng)
    if pick < 0.87:
        return _admonition(rng)
    if pick < 0.95:
        return _bullets(rng)
    return f"<!-- {_words(rng, 4)} -->\n<p>{_words(rng, 10)}\n\n   {_words(rng, 5)}</p>\n"


def _toc(rng: random.Random, sections: Sequence[str]) -> str:
    items = "".join(f'<li><a class="reference internal" href="#{s}">{html.escape(s)}</a>'
                    f"<ul><li><a class=\"reference internal\" href=\"#{s}-x\">"
                    f"{_words(rng, 3)}</a></li></ul></li>\n" for s in sections)
    return f"<ul>\n{items}</ul>\n"


def render_docs_page(seed: str, title: str, links: Sequence[tuple[str, str]],
                     size: int, revision: int = 0) -> bytes:
    """A documentation page of about *size* bytes (never much less; at most
    one content block more), seeded by *seed*.

    *links* (href, text) fill the navigation bars; *revision* is printed in
    the main part, so a new revision is new content.
    """
    rng = random.Random(seed)
    module = rng.choice(_IDENTS) + rng.choice(("lib", "utils", "io", "core"))
    esc_title = html.escape(title)
    nav = "".join(f'<li class="right"><a href="{html.escape(href)}" accesskey="N">'
                  f"{html.escape(text)}</a> |</li>\n" for href, text in links)
    head = (
        '<!DOCTYPE html>\n\n<html lang="en" data-content_root="../">\n  <head>\n'
        '    <meta charset="utf-8" />\n'
        '    <meta name="viewport" content="width=device-width, initial-scale=1.0" />\n'
        f'    <meta property="og:title" content="{esc_title}" />\n'
        f"    <title>{esc_title} &#8212; Reference manual</title>\n"
        '    <link rel="stylesheet" type="text/css" href="../_static/pygments.css" />\n'
        '    <script src="../_static/documentation_options.js"></script>\n'
        + _HEAD_SCRIPT + _HEAD_STYLE
        + "  </head><body>\n"
        '<div class="mobile-nav"><input type="checkbox" id="menuToggler" />'
        '<nav class="nav-content" role="navigation"><a href="../index.html">Home</a>'
        '<form role="search" class="search" action="../search.html" method="get">'
        '<input type="text" name="q" aria-label="Quick search"/>'
        '<input type="submit" value="Go"/></form></nav></div>\n'
        '<div class="related" role="navigation" aria-label="Related">\n<h3>Navigation</h3>\n'
        f"<ul>\n{nav}</ul>\n</div>\n"
        '<div class="document">\n<div class="documentwrapper">\n<div class="bodywrapper">\n'
        '<div class="body" role="main">\n'
        f'<section id="module-{module}">\n<h1><code class="xref py py-mod docutils literal '
        f'notranslate"><span class="pre">{module}</span></code> &#8212; {esc_title}'
        f'<a class="headerlink" href="#module-{module}" title="Link to this heading">¶</a>'
        f'</h1>\n<p class="revision">Revision {revision}</p>\n'
        f'<p><strong>Source code:</strong> <a class="reference external" '
        f'href="https://example.org/{module}.py">Lib/{module}.py</a></p>\n'
        '<hr class="docutils" />\n'
    )
    sections = [f"{module}-{i}" for i in range(rng.randint(3, 8))]
    sidebar = (
        '</section>\n<div class="clearer"></div>\n</div>\n</div>\n</div>\n'
        '<div class="sphinxsidebar" role="navigation" aria-label="Main">\n'
        '<div class="sphinxsidebarwrapper">\n<div>\n<h3><a href="../contents.html">'
        f"Table of Contents</a></h3>\n{_toc(rng, sections)}</div>\n"
        '<div role="note" aria-label="source link"><h3>This Page</h3>\n<ul class="this-page-menu">'
        '<li><a href="../bugs.html">Report a Bug</a></li>\n</ul></div>\n'
        "<noscript><p>Enable JavaScript for the search box.</p></noscript>\n"
        '<script>document.getElementById("searchbox").style.display = "block"</script>\n'
        "</div>\n</div>\n</div>\n"
    )
    tail = (
        '<div class="related" role="navigation" aria-label="Related">\n'
        f"<h3>Navigation</h3>\n<ul>\n{nav}</ul>\n</div>\n"
        '<div class="footer">\n&copy; <a href="../copyright.html">Copyright</a> 2001-2024, '
        "the authors.<br />\nLast updated on Jan 01, 2024 (00:00 UTC).\n"
        "<!-- build 1234 -->\n</div>\n</body>\n</html>\n"
    )
    budget = size - len(head) - len(sidebar) - len(tail)
    parts: list[str] = []
    used = 0
    section = 0
    while used < budget:
        if section < len(sections) and used >= section * budget / len(sections):
            block = (f'<section id="{sections[section]}">\n<h2>{_words(rng, 3).title()}'
                     f'<a class="headerlink" href="#{sections[section]}" '
                     'title="Link to this heading">¶</a></h2>\n</section>\n')
            section += 1
        else:
            block = _block(rng, module)
        parts.append(block)
        used += len(block.encode("utf-8"))
    return (head + "".join(parts) + sidebar + tail).encode("utf-8")
