"""The sitemap/feed corpus (``tests/corpus/sitemaps/``): cases, serving, judging.

Shared by ``tests/test_sitemap_corpus.py`` (our ``sitemap`` spider, one
real crawl per case) and ``bench/sitemap_corpus.py`` (ours next to plain
Scrapy's ``SitemapSpider``). ``index.toml`` there describes the fields.
"""

from __future__ import annotations

import gzip
import tomllib
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.site import LoopbackSite

CORPUS = Path(__file__).resolve().parent / "corpus" / "sitemaps"

_CONTENT_TYPES = {".xml": "application/xml", ".rdf": "application/rdf+xml",
                  ".txt": "text/plain; charset=utf-8"}


@dataclass(frozen=True)
class Case:
    """One fixture case of ``index.toml``."""

    name: str
    suite: str
    reproduces: str
    start: str
    expected: frozenset[str]
    documents: dict[str, str] = field(default_factory=dict)
    robots: str | None = None
    gzip: frozenset[str] = frozenset()
    gzip_cut: dict[str, int] = field(default_factory=dict)
    encoding: str = "utf-8"
    args: dict[str, str] = field(default_factory=dict)
    rules: tuple[str, ...] = ()
    follow: tuple[str, ...] = ()
    invalid_lastmods: int = 0
    other_hosts: int = 0
    deviation: str = ""


def load_cases() -> list[Case]:
    """Every case of the corpus, in the index's order."""
    with (CORPUS / "index.toml").open("rb") as f:
        raw = tomllib.load(f)["case"]
    return [Case(**{**c, "expected": frozenset(c["expected"]),
                    "gzip": frozenset(c.get("gzip", ())),
                    "rules": tuple(c.get("rules", ())), "follow": tuple(c.get("follow", ()))})
            for c in raw]


def _fill(site: LoopbackSite, template: str) -> str:
    """*template* with the site's base URL (``{base}``) and its other name
    (``{alias}``: ``localhost``, another host that reaches the same site)."""
    alias = site.base_url.replace("://127.0.0.1:", "://localhost:")
    return template.replace("{base}", site.base_url).replace("{alias}", alias)


def start_url(site: LoopbackSite, case: Case) -> str:
    """The URL the crawl of *case* starts at."""
    return _fill(site, case.start) if case.start.startswith("{") else site.url(case.start)


def _cut_gzip(body: bytes, chars: int) -> bytes:
    """A gzip file of *body* cut off where its stream has given all but the
    last *chars* bytes: no end of stream, no trailer."""
    stream = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    return stream.compress(body[:-chars]) + stream.flush(zlib.Z_SYNC_FLUSH)


def serve(site: LoopbackSite, case: Case) -> None:
    """Serve *case*'s robots.txt and documents on *site* (started)."""
    if case.robots is not None:
        site.robots_txt = _fill(site, case.robots)
    for path, fixture in case.documents.items():
        text = _fill(site, (CORPUS / fixture).read_text(encoding="utf-8"))
        body = text.encode(case.encoding)
        content_type = _CONTENT_TYPES[Path(fixture).suffix]
        if path in case.gzip_cut:
            body, content_type = _cut_gzip(body, case.gzip_cut[path]), "application/x-gzip"
        elif path in case.gzip:
            body, content_type = gzip.compress(body, mtime=0), "application/x-gzip"
        site.add_document(path, body, content_type)


def requested_pages(site: LoopbackSite, case: Case) -> set[str]:
    """The page paths (with query) the crawl asked the site for: lists excluded."""
    lists = {"/robots.txt", *case.documents}
    return {r.path for r in site.log if r.path.split("?", 1)[0] not in lists}


def spider_attributes(case: Case, callback: Any = "parse") -> dict[str, Any]:
    """Class attributes for a spider subclass with the case's rules and follow."""
    attrs: dict[str, Any] = {}
    if case.rules:
        attrs["sitemap_rules"] = [(rule, callback) for rule in case.rules]
    if case.follow:
        attrs["sitemap_follow"] = list(case.follow)
    return attrs
