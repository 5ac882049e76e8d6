"""The link graph of a documentation manual, as a Sphinx build links its pages.

A manual's pages do not link to three neighbours: each carries a navigation
bar (previous, next, the contents, the general index), a sidebar listing
its section's pages, links into its own sections (``#fragment``), cross
references into other pages' sections, and a link to its source text
(``_sources/...txt``); a contents page links to every page, and the general
index is split into letter pages of a thousand links or more, most of them
to a page's fragment. That shape is what makes a link-following spider's
re-crawl expensive (Python's own manual: ~120 links per page, ~64,000 over
530 pages), so the replay tests and ``bench/adoption.py`` crawl it.

:func:`manual_graph` gives each page's links (hrefs, in page order), from the
page's index alone (the graph never changes between versions); it is pure,
seeded, and knows nothing of the server.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["CONTENTS", "Manual", "manual_graph", "page_path", "source_path"]

#: The contents page: a link to every page of the manual.
CONTENTS = "/p/index.html"


def page_path(i: int) -> str:
    return f"/p/{i:04d}.html"


def index_path(k: int) -> str:
    return f"/p/genindex-{k}.html"


def source_path(i: int) -> str:
    """The page's source text (``text/plain``), as Sphinx's "Show Source" link."""
    return f"/p/_sources/{i:04d}.rst.txt"


@dataclass(frozen=True)
class Manual:
    """Links per page of each kind (the defaults: a page of ~120 links)."""

    pages: int
    index_pages: int = 8
    #: Links on each index page (most to a fragment of a page).
    index_links: int = 1200
    section: int = 30
    own_fragments: int = 20
    cross_references: int = 40

    def content_links(self, i: int) -> list[str]:
        n = self.pages
        links = [CONTENTS, page_path((i - 1) % n), page_path((i + 1) % n)]
        links += [index_path(k) for k in range(self.index_pages)]
        links.append(source_path(i))
        start = i - i % self.section
        links += [page_path(j) for j in range(start, min(start + self.section, n))]
        links += [f"#sec-{k}" for k in range(self.own_fragments)]
        rng = random.Random(f"manual:{i}")
        links += [f"{page_path(rng.randrange(n))}#ref-{k}" for k in range(self.cross_references)]
        return links

    def contents_links(self) -> list[str]:
        return [page_path(i) for i in range(self.pages)] + [
            index_path(k) for k in range(self.index_pages)]

    def index_links_of(self, k: int) -> list[str]:
        rng = random.Random(f"genindex:{k}")
        return [CONTENTS] + [f"{page_path(rng.randrange(self.pages))}#idx-{k}-{m}"
                             for m in range(self.index_links)]


def manual_graph(manual: Manual) -> dict[str, list[str]]:
    """Every HTML page of *manual* (contents, index pages, content pages) and its links."""
    graph = {CONTENTS: manual.contents_links()}
    for k in range(manual.index_pages):
        graph[index_path(k)] = manual.index_links_of(k)
    for i in range(manual.pages):
        graph[page_path(i)] = manual.content_links(i)
    return graph
