"""What a sitemap or feed document lists: URLs, their dates, their alternates.

One reader for every list the ``sitemap`` and ``feed`` spiders fetch, on
lxml, never resolving entities or reaching the network (no billion laughs,
no XXE) and with libxml2's default size limits (``huge_tree`` off, as
Scrapy's ``Sitemap`` has it). It understands:

- sitemaps.org XML sitemaps (``urlset``) and indexes (``sitemapindex``), in
  any namespace or none, with ``xhtml:link`` alternates;
- plain-text sitemaps (sitemaps.org: one absolute URL per line, UTF-8);
- RSS 2.0 (``link``, else a permalink ``guid``), RSS 1.0 / 0.90 (RDF:
  ``link``, else ``rdf:about``), Atom 1.0 and 0.3 (the ``alternate`` link's
  ``href``, else its text), relative links resolved against ``xml:base``
  and the document's URL, since sitemaps.org and Google accept feeds as
  sitemaps.

A gzipped body must be gunzipped by the caller (it knows the size limits).

Never invent a URL. A well-formed document is read by a strict parse. One
that is not (a truncated file, a bare ``&``, an undeclared entity) is read
as far as the strict parse gets: every entry closed before the fault is
intact. The rest is read by lxml's recovering parse, which repairs by
guessing (it drops a bare ``&`` and what follows up to the next ``=``, it
closes a ``<loc>`` cut off mid-URL): an entry it yields is kept only when
each of its URLs is the exact text of a complete element, or the exact
value of an attribute, of the raw document (its date is dropped: it may be
cut off); the others are counted in :attr:`Listing.unproven` and skipped.
Leading whitespace and a byte-order mark before the XML declaration (a
known fault of some WordPress installs) are stripped first: that is no
guess, and it keeps such a sitemap out of the recovering parse altogether.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from io import BytesIO
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

import lxml.etree

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["FEED_KINDS", "SITEMAP_KINDS", "Listing", "parse_listing"]

#: Kinds of lists whose entries are pages.
SITEMAP_KINDS = ("urlset", "text")
#: Feeds: their entries are pages too.
FEED_KINDS = ("rss", "rdf", "atom")

_XML_BASE = "{http://www.w3.org/XML/1998/namespace}base"
_RDF_ABOUT = "{http://www.w3.org/1999/02/22-rdf-syntax-ns#}about"
#: The root element's local name -> (kind, the entries' local name).
_ROOTS = {
    "urlset": ("urlset", "url"),
    "sitemapindex": ("sitemapindex", "sitemap"),
    "rss": ("rss", "item"),
    "RDF": ("rdf", "item"),
    "feed": ("atom", "entry"),
}
_BOM = b"\xef\xbb\xbf"
_URL_LINE = re.compile(r"^https?://\S+$", re.IGNORECASE)
# Complete elements of the raw document (for proofs): no markup inside.
_RAW_ELEMENT = re.compile(
    r"<(?:[\w.-]+:)?(loc|link|guid)(?:\s[^<>]*)?>([^<]*)</(?:[\w.-]+:)?\1\s*>")
_RAW_HREF = re.compile(r"""\s(?:href|rdf:about)\s*=\s*(?:"([^"<]*)"|'([^'<]*)')""")
_XML_REFS = re.compile(r"&(#[0-9]+|#x[0-9a-fA-F]+|amp|lt|gt|quot|apos);")


@dataclass(slots=True)
class Listing:
    """The entries of one list, and how sure we are of them."""

    #: ``urlset``, ``sitemapindex``, ``text``, ``rss``, ``rdf`` or ``atom``.
    kind: str
    #: ``{"loc": URL, "lastmod": raw date or None, "modified": whether that
    #: date is a modification date}``; a sitemap entry also has its other
    #: children by local name (``changefreq``, ``priority``...) and its
    #: ``alternate`` URLs, as Scrapy's ``Sitemap`` gives them to
    #: ``sitemap_filter``.
    entries: list[dict[str, Any]] = field(default_factory=list)
    #: The document was not well-formed: part of it was read by the
    #: recovering parse.
    recovered: bool = False
    #: Entries the recovering parse gave whose URLs are not in the raw
    #: document as given (a guess, a cut-off URL): skipped.
    unproven: int = 0
    #: Lines of a text sitemap that are not one absolute URL: skipped.
    ignored_lines: int = 0

    @property
    def pages(self) -> bool:
        """Whether the entries are pages (not child sitemaps)."""
        return self.kind != "sitemapindex"


def parse_listing(body: bytes, url: str) -> Listing | None:
    """What *body* (fetched from *url*) lists, or ``None`` if it is no list."""
    body = body.lstrip(b" \t\r\n")
    while body.startswith(_BOM):
        body = body[len(_BOM):].lstrip(b" \t\r\n")
    if not body:
        return None
    if not body.startswith(b"<"):
        return _text(body)
    return _xml(body, url)


def _text(body: bytes) -> Listing | None:
    """sitemaps.org's text format: one URL per line, nothing else."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    listing = Listing("text")
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line:
            continue
        if _URL_LINE.match(line):
            listing.entries.append({"loc": line, "lastmod": None, "modified": True})
        else:
            listing.ignored_lines += 1
    return listing if listing.entries else None


def _xml(body: bytes, url: str) -> Listing | None:
    strict: Listing | None = None
    try:
        for kind, entry in _iterparse(body, url, recover=False):
            if strict is None:
                strict = Listing(kind)
            elif entry.get("_broken"):
                strict.unproven += 1
            else:
                strict.entries.append(_public(entry))
    except lxml.etree.XMLSyntaxError:
        pass
    else:
        return strict
    # Not well-formed: what the strict parse read before the fault is
    # intact; what only the recovering parse reads must be proven.
    intact = {_key(e) for e in strict.entries} if strict is not None else set()
    raw = body.decode("utf-8", "replace")
    texts = {_unescape(m.group(2)) for m in _RAW_ELEMENT.finditer(raw)}
    attrs = {_unescape(m.group(1) if m.group(1) is not None else m.group(2))
             for m in _RAW_HREF.finditer(raw)}
    listing: Listing | None = None
    try:
        for kind, entry in _iterparse(body, url, recover=True):
            if listing is None:
                listing = Listing(kind, recovered=True)
            elif _key(entry) in intact:
                listing.entries.append(_public(entry))
            elif not entry.get("_broken") and all(
                (value in texts) if source == "text" else (value in attrs)
                for source, value in entry["_raw"]
            ):
                # Its URLs are proven; its date may be cut off ("2024-01"
                # of "2024-01-31"): no date, the page is asked conditionally.
                entry["lastmod"] = None
                listing.entries.append(_public(entry))
            else:
                listing.unproven += 1
    except lxml.etree.XMLSyntaxError:
        pass  # nothing the recovering parse could read further
    return listing


def _key(entry: dict[str, Any]) -> tuple[Any, ...]:
    return (entry["loc"], *entry.get("alternate", ()))


def _public(entry: dict[str, Any]) -> dict[str, Any]:
    entry.pop("_raw", None)
    return entry


def _unescape(raw: str) -> str:
    """XML's own references only (what a parser decodes): a bare ``&`` stays."""
    return _XML_REFS.sub(lambda m: html.unescape(m.group(0)), raw).strip()


def _local(tag: object) -> str:
    # Comments, PIs and (unresolved) entity references have no str tag.
    return tag.rpartition("}")[2] if isinstance(tag, str) else ""


def _iterparse(body: bytes, url: str, *, recover: bool,
               ) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(kind, {})`` for the root, then ``(kind, entry)`` per entry closed.

    An entry with ``_broken`` has a URL element that is not all text (an
    entity reference inside): part of its URL is missing.

    Raises ``XMLSyntaxError`` where a strict parse meets a fault.
    """
    events = lxml.etree.iterparse(
        BytesIO(body), events=("start", "end"), recover=recover, resolve_entities=False,
        no_network=True, huge_tree=False, remove_comments=True, remove_pis=True,
        collect_ids=False, load_dtd=False,
    )
    kind = entry_tag = None
    for event, elem in events:
        if kind is None:
            found = _ROOTS.get(_local(elem.tag))
            if found is None:
                return  # not a list
            kind, entry_tag = found
            yield kind, {}
            continue
        if event != "end" or _local(elem.tag) != entry_tag:
            continue
        entry = _ENTRY_READERS[kind](elem, url)
        # Memory: a 50,000-entry sitemap is read one entry at a time.
        elem.clear(keep_tail=True)
        parent = elem.getparent()
        if parent is not None:
            while elem.getprevious() is not None:
                del parent[0]
        if entry is not None:
            yield kind, entry


def _text_of(elem: Any) -> str | None:
    """The text of a simple element; ``None`` if anything (an entity
    reference, markup) is inside it: then the text is not all of it."""
    if len(elem):
        return None
    return (elem.text or "").strip()


def _child(elem: Any, *names: str) -> Any:
    for name in names:
        for child in elem:
            if _local(child.tag) == name:
                return child
    return None


def _child_text(elem: Any, *names: str) -> str | None:
    for name in names:
        child = _child(elem, name)
        if child is not None and (text := _text_of(child)):
            return text
    return None


def _sitemap_entry(elem: Any, url: str) -> dict[str, Any] | None:
    # As Scrapy's Sitemap: every child by local name, ``link`` hrefs as
    # ``alternate`` (xhtml:link rel="alternate" hreflang=...).
    entry: dict[str, Any] = {}
    alternate: list[str] = []
    raw: list[tuple[str, str]] = []
    loc = None
    for child in elem:
        name = _local(child.tag)
        if not name:
            continue
        if name == "link":
            if href := (child.get("href") or "").strip():
                alternate.append(href)
                raw.append(("attr", href))
            continue
        text = _text_of(child)
        if name == "loc":
            if loc is not None:
                continue
            loc = text
            if loc is None:
                # <loc>http://h/&xxe;</loc>: part of the URL is missing.
                return {"loc": "", "_broken": True}
            raw.append(("text", loc))
        entry[name] = text if text is not None else ""
    if loc is None:
        return None
    entry["loc"] = loc
    entry["modified"] = True
    entry.setdefault("lastmod", None)
    if alternate:
        entry["alternate"] = alternate
    entry["_raw"] = raw
    return entry


def _rss_entry(elem: Any, url: str) -> dict[str, Any]:
    raw: list[tuple[str, str]] = []
    link = _child_text(elem, "link")
    if link:
        raw.append(("text", link))
    else:
        # RSS 2.0: an item without <link> is addressable by a permalink guid.
        guid = _child(elem, "guid")
        if guid is not None and guid.get("isPermaLink", "true") == "true":
            link = _text_of(guid)
            if link:
                raw.append(("text", link))
    return {"loc": urljoin(url, link) if link else "", **_item_date(elem, "pubDate", "date"),
            "_raw": raw}


def _item_date(elem: Any, *published: str) -> dict[str, Any]:
    """An RSS item's date: ``dcterms:modified`` is a modification date; a
    ``pubDate`` is when the item was published, and a ``dc:date`` may be
    (Dublin Core leaves open which date it is): neither vouches."""
    if modified := _child_text(elem, "modified"):
        return {"lastmod": modified, "modified": True}
    return {"lastmod": _child_text(elem, *published), "modified": False}


def _rdf_entry(elem: Any, url: str) -> dict[str, Any]:
    raw: list[tuple[str, str]] = []
    link = _child_text(elem, "link")
    if link:
        raw.append(("text", link))
    elif link := (elem.get(_RDF_ABOUT) or "").strip():
        raw.append(("attr", link))
    return {"loc": urljoin(url, link) if link else "", **_item_date(elem, "date"), "_raw": raw}


def _base(elem: Any, url: str) -> str:
    """*elem*'s base URL: the ``xml:base`` of it and its ancestors on *url*."""
    chain = []
    node = elem
    while node is not None:
        if (base := node.get(_XML_BASE)) is not None:
            chain.append(base.strip())
        node = node.getparent()
    for base in reversed(chain):
        url = urljoin(url, base)
    return url


def _atom_entry(elem: Any, url: str) -> dict[str, Any]:
    raw: list[tuple[str, str]] = []
    link = ""
    for child in elem:
        if _local(child.tag) != "link" or child.get("rel", "alternate") != "alternate":
            continue
        href = (child.get("href") or "").strip()
        if href:
            raw.append(("attr", href))
        elif text := _text_of(child):
            # Atom 0.3 as some publish it: the link as the element's text.
            href = text
            raw.append(("text", href))
        if href:
            link = urljoin(_base(child, url), href)
            break
    # Atom 1.0 updated / 0.3 modified are modification dates; published /
    # issued / created are not.
    updated = _child_text(elem, "updated", "modified")
    return {"loc": link,
            "lastmod": updated or _child_text(elem, "published", "issued", "created"),
            "modified": updated is not None, "_raw": raw}


_ENTRY_READERS = {
    "urlset": _sitemap_entry,
    "sitemapindex": _sitemap_entry,
    "rss": _rss_entry,
    "rdf": _rdf_entry,
    "atom": _atom_entry,
}
