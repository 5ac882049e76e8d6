"""The main text of an HTML page: the text of its main element, whitespace folded.

The main element is the first one matching the first CSS selector that
matches anything (``main``, then ``[role=main]``, ``article``, ``body`` by
default). Its text is every text node under it but those inside a
``<script>``, ``<style>`` or ``<noscript>`` (even one above it), joined with
spaces, whitespace runs folded to one space, stripped: the XPath
``.//text()[not(ancestor::script or ancestor::style or ancestor::noscript)]``.

That XPath, run through Scrapy's selectors, wraps every text node in a
``Selector`` (thousands on a documentation page) and tests three ancestor
axes per node: most of a crawl's CPU on large pages. The same text nodes are
read here from the lxml tree the response has already parsed: with one
``descendant::text()`` per subtree free of excluded elements (most main
elements have none), stepping down only into the elements that contain one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lxml import etree

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy.http import Response

__all__ = ["DEFAULT_TEXT_SELECTORS", "extract_main_text", "main_text_of"]

#: Where the main content is, in order of preference.
DEFAULT_TEXT_SELECTORS = ("main", "[role=main]", "article", "body")
#: Elements whose text is never content.
_EXCLUDED = ("script", "style", "noscript")
_EXCLUDED_SET = frozenset(_EXCLUDED)
# Plain str results (smart_strings=False): no back-reference to the tree.
_ALL_TEXT = etree.XPath("descendant::text()", smart_strings=False)
_CHILD_NODES = etree.XPath("child::node()", smart_strings=False)


def extract_main_text(response: Response, selectors: Iterable[str]) -> str:
    """The text of the first element matching one of *selectors*, whitespace folded.

    *response* must be text (a :class:`~scrapy.http.TextResponse`): Scrapy's
    other responses raise ``NotSupported`` from ``css()``. A selector that
    matches text or attributes (``::text``, ``::attr()``) gives ``""``.
    """
    for css in selectors:
        found = response.css(css)
        if found:
            return main_text_of(found[0].root)
    return ""


def main_text_of(node: Any) -> str:
    """The text of *node* (an lxml element; anything else has none), see the
    module docstring."""
    if not isinstance(node, etree._Element) or not isinstance(node.tag, str):
        return ""
    if node.tag in _EXCLUDED_SET or next(node.iterancestors(*_EXCLUDED), None) is not None:
        return ""  # every text node under it is inside an excluded element
    if _has_excluded(node):
        texts: list[str] = []
        _collect(node, texts)
    else:
        texts = _ALL_TEXT(node)
    # str.split() and the regex \s fold exactly the same (Unicode) whitespace.
    return " ".join(" ".join(texts).split())


def _has_excluded(element: etree._Element) -> bool:
    return next(element.iter(*_EXCLUDED), None) is not None


def _collect(element: etree._Element, texts: list[str]) -> None:
    """Append the text nodes under *element* (not excluded, containing an
    excluded element) outside excluded elements, in document order."""
    for child in _CHILD_NODES(element):
        if isinstance(child, str):
            texts.append(child)  # a text node of element itself
        elif not isinstance(child.tag, str):
            continue  # a comment or processing instruction: no text node
        elif child.tag in _EXCLUDED_SET:
            continue
        elif _has_excluded(child):
            _collect(child, texts)
        else:
            texts.extend(_ALL_TEXT(child))
