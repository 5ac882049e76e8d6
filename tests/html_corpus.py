"""A seeded corpus of HTML pages with the hazards of real ones, for text extraction.

Every page is generated (no third-party content), the same seed giving the
same bytes:

* :func:`hazard_pages`: random trees built from the elements and the
  malformations real pages have: navigation, header, footer, aside, nested
  divs, tables, code blocks, ``<script>``/``<style>``/``<noscript>`` in the
  head, the body and inside the main part (and main parts inside them),
  comments (also inside scripts), CDATA sections, processing instructions,
  named, numeric, unknown and unterminated entities, whitespace runs of
  every kind (tabs, CR/LF, no-break and ideographic spaces, the C0
  separators), non-ASCII text (accents, CJK, right-to-left, emoji,
  combining marks), upper-case tags, unclosed and stray end tags, several
  ``main``/``article`` elements, ``role=main`` in various cases, templates,
  textareas, SVG, NUL bytes;
* :func:`docs_pages`: documentation pages (:mod:`tests.site.docs_pages`);
* :func:`site_pages`: the test site's own plain pages.

:func:`reference_main_text` is the main-text extraction as it was first
written, with Scrapy's selectors (a ``Selector`` per text node): the oracle
the faster one is checked against.
"""

from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING, Any

from tests.site import LoopbackSite
from tests.site.docs_pages import render_docs_page

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["corpus", "docs_pages", "hazard_pages", "reference_main_text", "site_pages"]

_FOLD = re.compile(r"\s+")
_TEXT_XPATH = ".//text()[not(ancestor::script or ancestor::style or ancestor::noscript)]"


def reference_main_text(response: Any, selectors: Iterable[str]) -> str:
    """The text of the first element matching one of *selectors* (see the
    module docstring)."""
    for css in selectors:
        node = response.css(css)
        if node:
            return _FOLD.sub(" ", " ".join(node[0].xpath(_TEXT_XPATH).getall())).strip()
    return ""

_TEXT_WORDS = (
    "alpha", "beta", "gamma", "main", "body", "script", "style", "text", "café", "naïve",
    "日本語", "中文字", "한국어", "العربية", "עברית", "Ελληνικά", "русский", "🐍", "👍🏽",
    "e\u0301", "ﬁ", "Ⅻ", "x²", "½", "«quote»", "“curly”", "a<b", "x&y",
)
_SPACES = (" ", "  ", "\t", "\n", "\r\n", "\n\n   \t", "\xa0", "\u2003", "\u3000", "\u200b",
           "\x0b", "\x0c", "\x1c", "\x1f", "\u2028", "\x85", " \xa0 ")
_ENTITIES = ("&amp;", "&lt;", "&gt;", "&nbsp;", "&#160;", "&#x2014;", "&#8212;", "&copy;",
             "&eacute;", "&unknownentity;", "&amp", "&lt", "&#12345", "&#x1F40D;", "&#0;",
             "& loose", "&;")
_INLINE = ("span", "a", "em", "strong", "b", "i", "code", "small", "sup", "kbd", "abbr", "q")
_BLOCK = ("div", "section", "p", "blockquote", "pre", "header", "footer", "nav", "aside",
          "figure", "figcaption", "details", "summary", "address", "center", "font")
_CONTAINERS = ("main", "article", 'div role="main"', 'div role="MAIN"', 'div role="Main "',
               'section role="main"', "MAIN", "Article")
_EXCLUDED = ("script", "style", "noscript", "SCRIPT", "NoScript",
             'script type="application/ld+json"', 'script type="text/template"')
_ODD = (
    "<![CDATA[ cdata text <b>not bold</b> ]]>",
    "<?php echo 'pi'; ?>",
    "<?xml-stylesheet href='x'?>",
    "<!-- a comment with <p>markup</p> -->",
    "<!---->",
    "<!-- unterminated -- comment -- >",
    "<!DOCTYPE html>",
    "</p>",
    "</div>",
    "</span>",
    "<br>",
    "<br/>",
    "<hr>",
    '<img alt="alt text is not text" src="x.png">',
    '<input value="value is not text">',
    "<wbr>",
    "<template><p>template content</p></template>",
    "<textarea>textarea <b>raw</b> text</textarea>",
    "<title>a second title</title>",
    "<svg><title>svg title</title><text>svg text</text><script>svg()</script></svg>",
    "<math><mi>x</mi></math>",
    "<iframe>iframe fallback</iframe>",
    "<object>object <param>fallback</object>",
    "<select><option>option one<option>option two</select>",
    "<table><tr><td>cell<td>cell two</table>",
    "<ul><li>one<li>two</ul>",
    "<dl><dt>term<dd>definition</dl>",
    "<p>unclosed paragraph",
    "<b><i>misnested</b></i>",
    "\x00nul\x00",
    "<unknown-element>custom</unknown-element>",
    "<frameset><frame></frameset>",
    "<plaintext-not>x</plaintext-not>",
)


def _text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 8)):
        pick = rng.random()
        if pick < 0.6:
            parts.append(rng.choice(_TEXT_WORDS).replace("<", "&lt;").replace("&y", "&amp;y"))
        elif pick < 0.85:
            parts.append(rng.choice(_SPACES))
        else:
            parts.append(rng.choice(_ENTITIES))
        if rng.random() < 0.7:
            parts.append(rng.choice(_SPACES[:6]))
    return "".join(parts)


def _script_body(rng: random.Random) -> str:
    return rng.choice((
        "var a = 1 < 2 && 3 > 2;",
        "document.write('<p>written</p>');",
        "var s = '<div>not text</div>'; // </scr' + 'ipt>",
        "<!-- var hidden = true; -->",
        "if (a) { b(); }\n\t  /* comment */",
        '{"@type": "Article", "headline": "json ld text"}',
        "body { color: red; } p::before { content: '\\201C'; }",
        "<p>noscript <b>markup</b> text</p>",
        "",
        "   \n  ",
    ))


def _node(rng: random.Random, depth: int) -> str:
    """One random node (with children below *depth*)."""
    pick = rng.random()
    if pick < 0.3 or depth <= 0:
        return _text(rng)
    if pick < 0.38:
        tag = rng.choice(_EXCLUDED)
        inner = (_script_body(rng) if rng.random() < 0.7
                 else "".join(_node(rng, depth - 1) for _ in range(rng.randint(1, 3))))
        return f"<{tag}>{inner}</{tag.split()[0]}>"
    if pick < 0.48:
        return rng.choice(_ODD)
    if pick < 0.53:
        tag = rng.choice(_CONTAINERS)
    elif pick < 0.75:
        tag = rng.choice(_INLINE)
    else:
        tag = rng.choice(_BLOCK)
    if rng.random() < 0.2:
        tag = tag.upper()
    attrs = ""
    if rng.random() < 0.3:
        attrs = f' class="c{rng.randint(0, 5)}" id="n{rng.randint(0, 99)}"'
    children = "".join(_node(rng, depth - 1) for _ in range(rng.randint(0, 5)))
    # Sometimes left unclosed, as real pages do.
    close = "" if rng.random() < 0.1 else f"</{tag.split()[0]}>"
    return f"<{tag}{attrs}>{children}{close}"


def hazard_page(seed: int) -> bytes:
    """One page of random structure (see the module docstring)."""
    rng = random.Random(seed)
    head_bits = "".join(rng.choice((
        "<meta charset='utf-8'>",
        f"<script>{_script_body(rng)}</script>",
        f"<style>{_script_body(rng)}</style>",
        f"<noscript>{_node(rng, 2)}</noscript>",
        "<!-- head comment -->",
        "<link rel=stylesheet href=x.css>",
    )) for _ in range(rng.randint(0, 5)))
    title = f"<title>{_text(rng)}</title>" if rng.random() < 0.8 else ""
    body = "".join(_node(rng, rng.randint(2, 6)) for _ in range(rng.randint(1, 12)))
    shape = rng.random()
    if shape < 0.75:
        html = (f"<!DOCTYPE html>\n<html><head>{title}{head_bits}</head>\n"
                f"<body>{body}</body></html>")
    elif shape < 0.85:
        html = f"{title}{body}"  # a fragment: the parser adds html and body
    elif shape < 0.9:
        html = f"<html><head>{title}</head>{body}"  # no body element
    elif shape < 0.95:
        html = f"<html><body>{body}</body></html>\n\n  trailing text after html"
    else:
        html = rng.choice(("", "   ", "<html></html>", "just text", "<!-- only -->",
                           "<script>only()</script>", "<main></main>",
                           "<noscript><main>hidden main</main></noscript>body text"))
    data = html.encode("utf-8")
    if rng.random() < 0.03:
        data += b"\xff\xfe broken utf-8 \xc3("
    return data


def hazard_pages(n: int, seed: int = 0) -> list[tuple[str, bytes]]:
    return [(f"hazard-{seed}-{i}", hazard_page(seed * 1_000_003 + i)) for i in range(n)]


def docs_pages(n: int, size: int = 60_000) -> list[tuple[str, bytes]]:
    links = [("/p/0001", "First"), ("/p/0002", "Second & third")]
    return [(f"docs-{i}", render_docs_page(f"docs:{i}", f"Doc page {i}", links, size, i))
            for i in range(n)]


def site_pages(n: int) -> list[tuple[str, bytes]]:
    site = LoopbackSite.generated(n, page_size=8_000)
    return [(p.path, site.body(p.path)) for p in site.pages]


def corpus() -> list[tuple[str, bytes]]:
    """Every page of the corpus: (name, HTML bytes)."""
    return [*hazard_pages(400), *docs_pages(12), *site_pages(10)]
