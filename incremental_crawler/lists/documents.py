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

A gzipped body is gunzipped by the caller (it knows the size limits) with
:func:`gunzip`, which tells a stream cut off from a complete one: the last
line of a cut-off text sitemap is dropped (it may be a fragment of a URL).
A document encoded in UTF-16 or UTF-32 (a byte-order mark, or ``<`` as a
wide character) is read as XML. At most *limit* (50,000, as sitemaps.org
allows) entries are kept; the others are only counted.

Never invent a URL. A well-formed document is read by a strict parse. A
bare ``&`` (one that starts no reference) can only mean itself: it is
escaped and the document parsed strictly again, so its URLs are kept as
written (as feedparser does) and the ``&amp;`` of the other entries stays
``&``. One still not well-formed (a truncated file, an undeclared entity) is
read as far as the strict parse gets: every entry closed before the fault is
intact. The rest is read by lxml's recovering parse, which repairs by
guessing (it closes a ``<loc>`` cut off mid-URL, drops what it cannot
read): an entry it yields is kept only when each of its URLs (an Atom
link's ``xml:base`` chain included) is the exact text of a complete
element, or the exact value of an attribute, of the raw document outside
comments (a CDATA section counts as its text); its date is dropped (it may
be cut off); the others are counted in :attr:`Listing.unproven` and
skipped. A URL taken from an attribute of a document that declares entities
is checked the same way even by the strict parse, which expands entities in
attribute values. Leading whitespace and a byte-order mark before the XML
declaration (a known fault of some WordPress installs) are stripped first:
that is no guess, and it keeps such a sitemap out of the recovering parse
altogether.
"""

from __future__ import annotations

import html
import re
import zlib
from dataclasses import dataclass, field
from io import BytesIO
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

import lxml.etree

from incremental_crawler.lists.sitemaps import MAX_URLS

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["FEED_KINDS", "SITEMAP_KINDS", "Listing", "gunzip", "parse_listing"]

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
#: How a document in a wide encoding starts (a byte-order mark, else ``<``
#: as a wide character) -> its codec. UTF-32 first: its little-endian mark
#: starts with UTF-16's.
_WIDE = (
    (b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"),
    (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"),
    (b"<\x00\x00\x00", "utf-32-le"), (b"\x00\x00\x00<", "utf-32-be"),
    (b"<\x00", "utf-16-le"), (b"\x00<", "utf-16-be"),
)
_DECLARED_ENCODING = re.compile(rb"""^(<\?xml[^>]*?\sencoding\s*=\s*)(["'])[^"']*\2""")
_LINE = re.compile(r"[^\r\n]+")
_URL_LINE = re.compile(r"^https?://\S+$", re.IGNORECASE)
# An ``&`` that starts no reference, outside comments, CDATA sections and
# processing instructions (where ``&`` is itself).
_BARE_AMP = re.compile(
    rb"<!--.*?-->|<!\[CDATA\[.*?\]\]>|<\?.*?\?>"
    rb"|&(?!#[0-9]+;|#x[0-9a-fA-F]+;|[A-Za-z_:\x80-\xff][\w.:\x80-\xff-]*;)",
    re.DOTALL)
# For proofs: comments (to their end, or the document's) are no text;
# a CDATA section is its text, escaped (cut off: no text).
_RAW_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
_RAW_CDATA = re.compile(r"<!\[CDATA\[(.*?)(\]\]>|\Z)", re.DOTALL)
# Complete elements of the raw document (for proofs): no markup inside.
_RAW_ELEMENT = re.compile(
    r"<(?:[\w.-]+:)?(loc|link|guid)(?:\s[^<>]*)?>([^<]*)</(?:[\w.-]+:)?\1\s*>")
_RAW_HREF = re.compile(
    r"""\s(?:href|rdf:about|xml:base)\s*=\s*(?:"([^"<]*)"|'([^'<]*)')""")
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
    #: Entries whose URLs are not in the raw document as given (a guess of
    #: the recovering parse, a cut-off URL, an entity): skipped.
    unproven: int = 0
    #: Lines of a text sitemap that are not one absolute URL (or were cut
    #: off): skipped.
    ignored_lines: int = 0
    #: Entries past the limit: not read.
    over_limit: int = 0
    #: Bare ``&`` of a not well-formed document, kept as written.
    bare_ampersands: int = 0

    @property
    def pages(self) -> bool:
        """Whether the entries are pages (not child sitemaps)."""
        return self.kind != "sitemapindex"

    def _add(self, entry: dict[str, Any], limit: int) -> None:
        if len(self.entries) >= limit:
            self.over_limit += 1
        else:
            self.entries.append(_public(entry))


def gunzip(body: bytes, max_size: int) -> tuple[bytes, bool] | None:
    """``(data, complete)`` of a gzipped *body*; ``None`` if it is no gzip
    stream or holds more than *max_size* bytes.

    *complete* is false when the stream is cut off (or corrupt past some
    output), where Scrapy's ``gunzip`` silently returns what it read.
    Members are concatenated, as gzip does; NUL padding after the last one
    is ignored.
    """
    out = bytearray()
    rest = body
    while True:
        stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += stream.decompress(rest, max_size + 1 - len(out))
            while stream.unconsumed_tail and len(out) <= max_size:
                out += stream.decompress(stream.unconsumed_tail, max_size + 1 - len(out))
        except zlib.error:
            if rest is body:
                return None  # not gzip at all
            # Garbage after a complete member: gzip ignores it too.
            return bytes(out), True
        if len(out) > max_size:
            return None
        if not stream.eof:
            return bytes(out), False
        rest = stream.unused_data.lstrip(b"\x00")
        if not rest:
            return bytes(out), True


def parse_listing(body: bytes, url: str, *, truncated: bool = False,
                  limit: int = MAX_URLS) -> Listing | None:
    """What *body* (fetched from *url*) lists, or ``None`` if it is no list.

    *truncated*: the body is known to be cut off (a gzip stream that ends
    early); *limit*: the entries kept at most (the rest are counted).
    """
    for mark, codec in _WIDE:
        if body.startswith(mark):
            return _xml(_to_utf8(body, codec), url, limit)
    body = body.lstrip(b" \t\r\n")
    while body.startswith(_BOM):
        body = body[len(_BOM):].lstrip(b" \t\r\n")
    if not body:
        return None
    if not body.startswith(b"<"):
        return _text(body, truncated=truncated, limit=limit)
    return _xml(body, url, limit)


def _to_utf8(body: bytes, codec: str) -> bytes:
    """A UTF-16/32 document as UTF-8, its declaration saying so (empty if
    it does not decode)."""
    try:
        text = body.decode(codec).lstrip("\ufeff")
    except UnicodeDecodeError:
        return b""
    return _DECLARED_ENCODING.sub(rb'\1"UTF-8"', text.lstrip(" \t\r\n").encode("utf-8"),
                                  count=1)


def _text(body: bytes, *, truncated: bool, limit: int) -> Listing | None:
    """sitemaps.org's text format: one URL per line, nothing else."""
    cut_off = False
    if truncated and not body.endswith((b"\n", b"\r")):
        # The last line may be a fragment of a URL ("http://h/page_").
        end = max(body.rfind(b"\n"), body.rfind(b"\r")) + 1
        cut_off = bool(body[end:].strip())
        body = body[:end]
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    listing = Listing("text", ignored_lines=int(cut_off))
    # Line by line, without splitting a 50 MB body into a list.
    for match in _LINE.finditer(text):
        line = match.group().strip()
        if not line:
            continue
        if not _URL_LINE.match(line):
            listing.ignored_lines += 1
        elif len(listing.entries) >= limit:
            listing.over_limit += 1
        else:
            listing.entries.append({"loc": line, "lastmod": None, "modified": True})
    return listing if listing.entries else None


def _xml(body: bytes, url: str, limit: int) -> Listing | None:
    if not body:
        return None
    # The strict parse expands entities in attribute values: a document
    # declaring any has its attribute URLs checked against the raw text.
    attrs = _raw_proofs(body)[1] if b"<!ENTITY" in body else None
    strict, complete = _strict(body, url, limit, attrs)
    if complete:
        return strict
    repaired, bare = _escape_bare_ampersands(body)
    if bare:
        body = repaired
        strict, complete = _strict(body, url, limit, attrs)
        if strict is not None:
            strict.bare_ampersands = bare
        if complete:
            return strict
    # Still not well-formed: what the strict parse read before the fault is
    # intact; what only the recovering parse reads must be proven.
    intact = {_key(e) for e in strict.entries} if strict is not None else set()
    texts, raw_attrs = _raw_proofs(body)
    listing: Listing | None = None
    try:
        for kind, entry in _iterparse(body, url, recover=True):
            if listing is None:
                listing = Listing(kind, recovered=True, bare_ampersands=bare)
            elif _key(entry) in intact:
                listing._add(entry, limit)
            elif not entry.get("_broken") and all(
                (value in texts) if source == "text" else (value in raw_attrs)
                for source, value in entry["_raw"]
            ):
                # Its URLs are proven; its date may be cut off ("2024-01"
                # of "2024-01-31"): no date, the page is asked conditionally.
                entry["lastmod"] = None
                listing._add(entry, limit)
            else:
                listing.unproven += 1
    except lxml.etree.XMLSyntaxError:
        pass  # nothing the recovering parse could read further
    return listing


def _strict(body: bytes, url: str, limit: int, attrs: set[str] | None,
            ) -> tuple[Listing | None, bool]:
    """What a strict parse reads of *body*, and whether it read all of it.

    *attrs*: the raw attribute values an attribute URL must be one of.
    """
    listing: Listing | None = None
    try:
        for kind, entry in _iterparse(body, url, recover=False):
            if listing is None:
                listing = Listing(kind)
            elif entry.get("_broken") or (attrs is not None and any(
                    source == "attr" and value not in attrs
                    for source, value in entry["_raw"])):
                listing.unproven += 1
            else:
                listing._add(entry, limit)
    except lxml.etree.XMLSyntaxError:
        return listing, False
    return listing, True


def _escape_bare_ampersands(body: bytes) -> tuple[bytes, int]:
    """*body* with each bare ``&`` escaped, and how many there were."""
    count = 0

    def escape(match: re.Match[bytes]) -> bytes:
        nonlocal count
        if match.group() != b"&":
            return match.group()
        count += 1
        return b"&amp;"

    escaped = _BARE_AMP.sub(escape, body)
    return escaped, count


def _raw_proofs(body: bytes) -> tuple[set[str], set[str]]:
    """The texts of the raw document's complete URL elements, and its
    attribute values (XML's references decoded), outside comments."""
    raw = _RAW_COMMENT.sub("", body.decode("utf-8", "replace"))
    raw = _RAW_CDATA.sub(
        lambda m: html.escape(m.group(1), quote=False) if m.group(2) else "<", raw)
    texts = {_unescape(m.group(2)) for m in _RAW_ELEMENT.finditer(raw)}
    attrs = {_unescape(m.group(1) if m.group(1) is not None else m.group(2))
             for m in _RAW_HREF.finditer(raw)}
    return texts, attrs


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


def _children(elem: Any, name: str, *, own: bool = False) -> Iterator[Any]:
    """*elem*'s children of local name *name*; *own*: only those in
    *elem*'s own namespace (an RSS item's ``link``, not an ``atom:link``)."""
    if own:
        tag = elem.tag
        qname = tag[:tag.index("}") + 1] + name if tag.startswith("{") else name
        return (child for child in elem if child.tag == qname)
    return (child for child in elem if _local(child.tag) == name)


def _child_text(elem: Any, *names: str, own: bool = False) -> str | None:
    """The first non-empty text of a child named one of *names*, in order."""
    for name in names:
        for child in _children(elem, name, own=own):
            if text := _text_of(child):
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
    # The item's own link: an <atom:link rel="related"> (or any other
    # namespace's link) before it is not it.
    link = _child_text(elem, "link", own=True)
    if link:
        raw.append(("text", link))
    else:
        # RSS 2.0: an item without <link> is addressable by a permalink guid.
        guid = next(_children(elem, "guid", own=True), None)
        if guid is not None and guid.get("isPermaLink", "true") == "true":
            link = _text_of(guid)
            if link:
                raw.append(("text", link))
    return {"loc": urljoin(url, link) if link else "", **_item_date(elem, rss=True),
            "_raw": raw}


def _item_date(elem: Any, *, rss: bool = False) -> dict[str, Any]:
    """An RSS item's date: ``dcterms:modified`` is a modification date; a
    ``pubDate`` (the item's own, RSS 2.0) is when the item was published,
    and a ``dc:date`` may be (Dublin Core leaves open which date it is):
    neither vouches."""
    if modified := _child_text(elem, "modified"):
        return {"lastmod": modified, "modified": True}
    published = (_child_text(elem, "pubDate", own=True) if rss else None) or _child_text(
        elem, "date")
    return {"lastmod": published, "modified": False}


def _rdf_entry(elem: Any, url: str) -> dict[str, Any]:
    raw: list[tuple[str, str]] = []
    link = _child_text(elem, "link", own=True)
    if link:
        raw.append(("text", link))
    elif link := (elem.get(_RDF_ABOUT) or "").strip():
        raw.append(("attr", link))
    return {"loc": urljoin(url, link) if link else "", **_item_date(elem), "_raw": raw}


def _base(elem: Any, url: str, raw: list[tuple[str, str]]) -> str:
    """*elem*'s base URL: the ``xml:base`` of it and its ancestors on *url*.

    Each ``xml:base`` is a URL of the entry's, to prove like its ``href``
    (a recovering parse garbles ``xml:base="/a&b=1/"`` into ``/a=1/``).
    """
    chain = []
    node = elem
    while node is not None:
        if (base := node.get(_XML_BASE)) is not None:
            chain.append(base.strip())
        node = node.getparent()
    bases: list[tuple[str, str]] = []
    for base in reversed(chain):
        url = urljoin(url, base)
        if urlsplit(base).scheme:
            bases.clear()  # an absolute base: the outer ones do not count
        bases.append(("attr", base))
    raw.extend(bases)
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
            link = href if urlsplit(href).scheme else urljoin(_base(child, url, raw), href)
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
