"""A counting HTTP test site served on loopback with Twisted Web.

The site exists so that the incremental crawler can be tested and
benchmarked against a server whose behaviour is fully known: every page
has a *kind* that decides which validators (``ETag`` / ``Last-Modified``) it
sends, pages change only when told to (:meth:`LoopbackSite.change`), and every
request served is recorded in :attr:`LoopbackSite.log` so that callers can
count requests, ``304 Not Modified`` answers and body bytes.

It imports nothing from ``incremental_crawler``: dates come from the standard
library and ETags are matched here, so a bug in the crawler's own date or
ETag handling cannot be mirrored on the server side and pass unnoticed.

Importing this module starts nothing: the reactor is imported only inside
:meth:`LoopbackSite.start` / :meth:`LoopbackSite.stop` and in the CLI entry
point, so the caller (Scrapy, pytest-twisted, a benchmark) stays in charge of
which reactor gets installed.

Out-of-process use (benchmarks, kill -9 tests), from the repository root or
with it on ``PYTHONPATH``::

    python -m tests.site --pages 1000 --port 0

prints exactly one line, the base URL, and then serves until SIGTERM/SIGINT.
The ``/__site__/...`` control endpoints (see :class:`LoopbackSite`) expose the
request log and let the other process change pages.
"""

from __future__ import annotations

import argparse
import email.utils
import gzip
import hashlib
import html
import json
import logging
import random
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape as xml_escape

from twisted.web import http, resource, server

from tests.site.docs_pages import render_docs_page
from tests.site.limits import TokenBucketLimiter
from tests.site.manual import Manual, manual_graph, source_path

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from twisted.internet.defer import Deferred
    from twisted.internet.interfaces import IListeningPort
    from twisted.python.failure import Failure

logger = logging.getLogger(__name__)

#: Page kinds, i.e. which validators a page sends (see :class:`Page`).
KINDS: tuple[str, ...] = ("strong", "weak", "lastmod", "none", "stuck", "random", "noisy")
#: The kinds whose validators tell the truth (a conditional request works).
VALIDATED_KINDS: tuple[str, ...] = KINDS[:3]
#: The well-behaved kinds: those, and pages that send no validator.
PLAIN_KINDS: tuple[str, ...] = KINDS[:4]

#: Fixed base epoch of every ``Last-Modified`` / sitemap ``<lastmod>``; each
#: version adds one hour. A fixed base keeps responses reproducible across
#: runs and processes, and keeps all dates in the past (a server must not
#: send a Last-Modified later than its Date, RFC 9110 §8.8.2.1).
BASE_EPOCH: int = 1_700_000_000

#: Seconds added to :data:`BASE_EPOCH` per page version.
VERSION_STEP: int = 3600

#: Prefix of the control endpoints; requests below it are not logged.
CONTROL_PREFIX: str = "/__site__/"

#: How a generated page is built (see :class:`Page`).
LAYOUTS: tuple[str, ...] = ("plain", "docs")

#: What the generated sitemaps say in ``<lastmod>`` (see
#: :attr:`LoopbackSite.sitemap_lastmods`).
LASTMOD_MODES: tuple[str, ...] = ("honest", "stale", "none")

_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_TEXT: Mapping[str, str] = MappingProxyType({"Content-Type": "text/plain; charset=utf-8"})
_XML: Mapping[str, str] = MappingProxyType({"Content-Type": "application/xml; charset=utf-8"})

# Filler vocabulary for page bodies; immutable, so not module *state*.
_WORDS: tuple[str, ...] = (
    "alpha", "anchor", "archive", "basket", "beacon", "binary", "bridge", "buffer", "cache",
    "canvas", "carbon", "channel", "cipher", "circuit", "cluster", "column", "comet", "compass",
    "crawler", "crystal", "cursor", "delta", "digest", "domain", "ember", "engine", "entropy",
    "fabric", "falcon", "feather", "fiber", "filter", "fjord", "forest", "fragment", "galaxy",
    "garden", "glacier", "gossip", "gradient", "harbor", "header", "horizon", "index", "island",
    "journal", "kernel", "lantern", "ledger", "lemon", "marble", "meadow", "mirror", "module",
    "nebula", "needle", "network", "oasis", "orbit", "packet", "paper", "pepper", "pixel",
    "planet", "pocket", "quartz", "query", "radar", "record", "ribbon", "river", "rocket",
    "saddle", "schema", "signal", "silver", "sketch", "socket", "spider", "spiral", "stone",
    "stream", "summit", "syntax", "tablet", "thread", "timber", "token", "tunnel", "update",
    "valley", "vector", "velvet", "vertex", "violet", "voyage", "walnut", "window", "winter",
    "yellow", "zenith",
)
# One word per possible random byte (the slight bias is irrelevant here).
_WORD_TABLE: tuple[str, ...] = tuple(_WORDS[i % len(_WORDS)] for i in range(256))

# entity-tag = [ weak ] opaque-tag  (RFC 9110 §8.8.3); etagc excludes DQUOTE,
# so a quoted string without inner quotes is exactly an opaque-tag. A regex is
# used rather than a naive split(",") because etagc may contain commas.
_ENTITY_TAG_RE = re.compile(r'(W/)?"([^"]*)"')


# --------------------------------------------------------------------------
# Data model
# --------------------------------------------------------------------------


@dataclass
class Page:
    """One HTML page of the site.

    ``kind`` decides the validators the page sends:

    * ``strong``  -- strong ``ETag`` (hash of the body) and ``Last-Modified``;
    * ``weak``    -- weak ``ETag`` (``W/"..."``) only;
    * ``lastmod`` -- ``Last-Modified`` only;
    * ``none``    -- no validators, never answers 304;
    * ``stuck``   -- constant ``ETag: "stuck"`` and constant
      ``Last-Modified`` although the content changes with the version: a
      misbehaving server whose validators lie;
    * ``random``  -- a new random strong ``ETag`` on every response (per
      process, per CDN node...) although the content only changes with the
      version: validators that never match;
    * ``noisy``   -- no validators, and a per-response timestamp in the page
      (outside ``<main>``) and a per-response token inside it, the way ad
      slots and "generated at" footers make every response differ.

    With ``gzip`` the page negotiates its encoding: a request accepting
    gzip gets the gzip variant (``Content-Encoding: gzip``, its ETag
    suffixed ``-gzip``, as Apache's mod_deflate does), any other the
    identity variant; both with ``Vary: Accept-Encoding``, and each variant
    answers 304 only to its own ETag (RFC 9110 §8.8.3.3).

    ``layout`` decides the HTML: ``plain`` -- ``<nav>``, ``<main>`` of
    ``<p>`` paragraphs, ``<footer>``; ``docs`` -- the structure of a
    Sphinx-built manual page (:mod:`tests.site.docs_pages`: navigation bars,
    sidebar, inline script and style, highlighted code, API signatures,
    tables; the main part is ``<div role="main">``). A page with a ``body``
    (a file served as it is) ignores both; a version above 0 adds a
    ``<p>Revision N</p>`` before its ``</body>``.
    """

    path: str
    kind: str
    version: int = 0
    size: int = 20_000
    title: str = ""
    gzip: bool = False
    #: The ``noisy`` kind's per-response timestamps, on a page of any kind
    #: (a "generated at" footer behind validators that hold).
    noise: bool = False
    layout: str = "plain"
    body: bytes | None = None
    #: The hrefs of a ``docs`` page's navigation bars, in order (``None``: its
    #: neighbours and a few stable picks, as a plain page's ``<nav>``).
    links: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"page path must start with '/': {self.path!r}")
        if self.kind not in KINDS:
            raise ValueError(f"unknown page kind {self.kind!r}; expected one of {KINDS}")
        if self.size < 0:
            raise ValueError(f"page size must be >= 0, got {self.size}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown page layout {self.layout!r}; expected one of {LAYOUTS}")
        if (self.kind == "noisy" or self.noise) and (self.layout != "plain" or self.body):
            raise ValueError("the noisy kind's timestamps need the plain layout")
        if not self.title:
            self.title = "Page " + (self.path.strip("/") or "home")

    @property
    def modified_ts(self) -> int:
        """Epoch seconds of this version (the page's real last change)."""
        return BASE_EPOCH + self.version * VERSION_STEP


@dataclass(frozen=True)
class RequestRecord:
    """One request served by the site (control endpoints excluded).

    ``path`` includes the query string. ``body_bytes`` counts the response
    body actually sent (0 for HEAD, 304 and redirects). ``headers`` maps
    lower-cased request header names to values (repeated fields joined with
    ``", "``). ``started`` / ``finished`` are :func:`time.monotonic` values
    taken when rendering began and when the response was handed to the
    transport. ``wait_until``, on a ``429`` of the rate limiter
    (:meth:`LoopbackSite.limit`): the :func:`time.monotonic` time until
    which its ``Retry-After`` told the client to stay away.
    """

    method: str
    path: str
    status: int
    body_bytes: int
    if_none_match: str | None
    if_modified_since: str | None
    headers: dict[str, str]
    started: float
    finished: float
    wait_until: float | None = None


@dataclass
class _Response:
    """A fully computed response, before it is written to the request."""

    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    # For HEAD, the body is computed (so Content-Length is right) but not sent.
    send_body: bool = True


# --------------------------------------------------------------------------
# Helpers (pure functions)
# --------------------------------------------------------------------------


def http_date(ts: float) -> str:
    """Format epoch seconds as an IMF-fixdate (RFC 9110 §5.6.7)."""
    return email.utils.formatdate(ts, usegmt=True)


def w3c_datetime(ts: float) -> str:
    """Format epoch seconds as a W3C datetime for sitemap ``<lastmod>``."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")


def parse_http_date(value: str) -> float | None:
    """Parse an HTTP-date into epoch seconds, or ``None`` if invalid.

    RFC 9110 §13.1.3: a recipient MUST ignore ``If-Modified-Since`` if the
    value is not a valid HTTP-date, hence ``None`` rather than an exception.
    """
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:
        # "-0000" yields a naive datetime; HTTP-dates are always GMT (§5.6.7).
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def etag_matches(if_none_match: str, etag: str | None) -> bool:
    """Evaluate an ``If-None-Match`` field value against the current ETag.

    RFC 9110 §13.1.2: ``*`` matches any current representation; otherwise the
    value is a comma-separated list of entity-tags compared with the *weak*
    comparison function (§8.8.3.2), i.e. the ``W/`` prefix is ignored on both
    sides and only the opaque-tags are compared.
    """
    if if_none_match.strip() == "*":
        return True
    if etag is None:
        return False
    current = _ENTITY_TAG_RE.fullmatch(etag.strip())
    if current is None:
        # An unquoted tag (``ETag: foo``), as some servers send: they match
        # the If-None-Match value as a whole, ``W/`` aside, as a string.
        return _unweak(if_none_match.strip()) == _unweak(etag.strip())
    return any(m.group(2) == current.group(2) for m in _ENTITY_TAG_RE.finditer(if_none_match))


def _unweak(tag: str) -> str:
    return tag[2:] if tag.startswith("W/") else tag


def _accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an ``Accept-Encoding`` field value accepts gzip (RFC 9110 §12.5.3)."""
    for member in (accept_encoding or "").split(","):
        name, _, params = member.strip().partition(";")
        if name.strip().lower() in ("gzip", "x-gzip", "*"):
            q = params.strip().lower().removeprefix("q=")
            return not params or q.strip("0.") != ""
    return False


def _absolute(base_url: str, target: str) -> str:
    """Resolve ``target`` (a path or an absolute URL) against the site."""
    if target.startswith(("http://", "https://")):
        return target
    return base_url + (target if target.startswith("/") else "/" + target)


# --------------------------------------------------------------------------
# Twisted plumbing
# --------------------------------------------------------------------------


class _TrackingChannel(http.HTTPChannel):
    """HTTP/1.1 channel that registers itself with its site.

    Tracking is needed so :meth:`LoopbackSite.stop` can close keep-alive
    connections; otherwise pytest-twisted tests would leave sockets (and
    their timeout DelayedCalls) behind in the reactor.
    """

    factory: _TrackingSite

    def __init__(self) -> None:
        super().__init__()
        self._lost_waiters: list[Deferred[None]] = []

    def connectionMade(self) -> None:
        super().connectionMade()
        self.factory.channels.add(self)

    def connectionLost(self, reason: Failure) -> None:
        try:
            super().connectionLost(reason)
        finally:
            self.factory.channels.discard(self)
            waiters, self._lost_waiters = self._lost_waiters, []
            for waiter in waiters:
                waiter.callback(None)

    def when_lost(self) -> Deferred[None]:
        """Return a Deferred that fires once this connection is closed."""
        from twisted.internet.defer import Deferred

        d: Deferred[None] = Deferred()
        self._lost_waiters.append(d)
        return d


class _TrackingSite(server.Site):
    """:class:`twisted.web.server.Site` that knows its open connections.

    Plain HTTP/1.1 only (no ALPN/HTTP/2 negotiation is needed on loopback).
    """

    protocol = _TrackingChannel  # type: ignore[assignment]
    noisy = False  # no "Starting factory" log lines per start/stop

    def __init__(self, root: resource.Resource) -> None:
        super().__init__(root)
        self.channels: set[_TrackingChannel] = set()

    def log(self, request: server.Request) -> None:
        """Disable the access log; :attr:`LoopbackSite.log` replaces it."""


class _SiteResource(resource.Resource):
    """Leaf resource that hands every request to the :class:`LoopbackSite`."""

    isLeaf = True  # noqa: N815 (Twisted API)

    def __init__(self, site: LoopbackSite) -> None:
        super().__init__()
        self._site = site

    def render(self, request: server.Request) -> bytes:
        return self._site._render(request)


# --------------------------------------------------------------------------
# The site
# --------------------------------------------------------------------------


class LoopbackSite:
    """A deterministic, counting HTTP site on loopback.

    Served resources:

    * every :class:`Page` at its path (GET and HEAD, conditional requests
      handled per RFC 9110 §13);
    * ``/robots.txt`` (:attr:`robots_txt`, default points at the sitemap
      index);
    * ``/sitemap.xml`` -- a urlset of all pages;
    * ``/sitemap_index.xml`` -- index of ``/sitemap-1.xml`` (first half of
      the pages) and ``/sitemap-2.xml.gz`` (second half, gzip file served as
      ``application/gzip`` without ``Content-Encoding``, like real sites);
    * redirects registered with :meth:`add_redirect` (checked before pages);
    * ``404`` for anything else.

    The generated sitemaps' ``<lastmod>`` follow :attr:`sitemap_lastmods`;
    with :attr:`list_etags`, robots.txt and the generated sitemaps send a
    strong ``ETag`` (a hash of the body) and answer a matching
    ``If-None-Match`` with 304, as nginx serving static files does.

    Control endpoints (not logged), for driving the site from another
    process: ``GET /__site__/log`` (JSON list of records), ``GET /__site__/stats``
    (rate limiter and in-flight figures),
    ``POST /__site__/reset``, ``POST /__site__/change?path=/p/0001`` (the
    ``path`` parameter may repeat, in the query or in an
    ``application/x-www-form-urlencoded`` body: the body form takes any
    number of paths, a query only as many as fit in a request line) and
    ``POST /__site__/change?fraction=0.05&seed=1``; both change forms answer
    with the JSON list of changed paths. ``POST /__site__/kind?path=/p/0001&kind=strong``
    (``path`` may repeat) switches pages to another kind (:meth:`set_kind`).
    ``POST /__site__/status?path=/p/0001&status=410`` (``path`` may repeat)
    makes pages answer that status, ``status=200`` gives them back their
    content (:meth:`override`). ``POST /__site__/lastmods?mode=stale`` sets
    :attr:`sitemap_lastmods` (answers ``{"mode": ...}``).

    Not thread-safe: use it from the reactor thread only.
    """

    def __init__(self, pages: Iterable[Page] = (), *, host: str = "127.0.0.1") -> None:
        self.host = host
        #: Every request served, in order (control endpoints excluded).
        self.log: list[RequestRecord] = []
        #: robots.txt body; ``None`` serves the generated default.
        self.robots_txt: str | None = None
        #: The generated sitemaps' ``<lastmod>``, one of :data:`LASTMOD_MODES`:
        #: ``honest`` -- each page's version date (it moves when the page
        #: changes; an index entry carries the latest of its sitemap's);
        #: ``stale`` -- each page's first version date whatever its version
        #: (a sitemap generator that never updates its dates); ``none`` -- no
        #: ``<lastmod>`` at all, in the sitemaps and in the index.
        self.sitemap_lastmods: str = "honest"
        #: Strong ETags (hash of the body) on robots.txt and the generated
        #: sitemaps, with 304 to a matching ``If-None-Match``.
        self.list_etags: bool = False
        #: ``Cache-Control`` sent with every page's 200 and 304 (e.g.
        #: ``max-age=0``: an HTTP cache revalidates each page every time).
        self.cache_control: str | None = None
        self._pages: dict[str, Page] = {}
        self._order: list[str] = []
        self._index: dict[str, int] = {}
        self._redirects: dict[str, tuple[str, int]] = {}
        # path -> (body, content type, etag); see add_document().
        self._documents: dict[str, tuple[bytes, str, str | None]] = {}
        # Responses served so far (the noisy kind's per-response token).
        self._served = 0
        #: Per-client rate limit (429 + Retry-After), see limit().
        self.limiter: TokenBucketLimiter | None = None
        # path prefix -> seconds before answering; see slow().
        self._slow: dict[str, float] = {}
        # Path prefixes whose answers wait for release(), and the answers
        # waiting: each its path, and what sends its response (after its
        # slow() delay); see hold().
        self._hold: set[str] = set()
        self._held: list[tuple[str, Callable[[], None]]] = []
        #: Requests being answered now, and the most at once, per Host header.
        self.in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}
        # path -> (status or None, header changes, body or None); see override().
        self._overrides: dict[str, tuple[int | None, dict[str, str | None], bytes | None]] = {}
        # path -> (version, body, etag opaque-tag). Keyed by path so only the
        # current version of each page is kept (bounded memory).
        self._bodies: dict[str, tuple[int, bytes, str]] = {}
        self._port: IListeningPort | None = None
        self._site: _TrackingSite | None = None
        self._base_url: str | None = None
        for page in pages:
            self._add(page)

    # -- construction ------------------------------------------------------

    @classmethod
    def generated(
        cls,
        n_pages: int = 100,
        *,
        kinds: Sequence[str] = ("strong", "weak", "lastmod", "none"),
        page_size: int = 20_000,
        host: str = "127.0.0.1",
        layout: str = "plain",
    ) -> LoopbackSite:
        """Build a site with pages ``/p/0000`` .. cycling through ``kinds``."""
        if n_pages < 0:
            raise ValueError(f"n_pages must be >= 0, got {n_pages}")
        if not kinds:
            raise ValueError("kinds must not be empty")
        pages = (
            Page(path=f"/p/{i:04d}", kind=kinds[i % len(kinds)], size=page_size, layout=layout)
            for i in range(n_pages)
        )
        return cls(pages, host=host)

    @classmethod
    def from_directory(
        cls,
        directory: Path,
        *,
        kinds: Sequence[str] = ("strong", "weak", "lastmod", "none"),
        limit: int = 0,
        host: str = "127.0.0.1",
    ) -> LoopbackSite:
        """Build a site serving the ``*.html`` files under *directory* (sorted,
        the first *limit* of them when *limit* > 0), each at ``/p/`` + its
        relative path, as it is, cycling through ``kinds``; and the source
        texts a Sphinx build links its pages to (``_sources/**/*.txt``), as
        documents with strong ETags, so that a spider following every link
        finds them as it would on the real site."""
        if not kinds:
            raise ValueError("kinds must not be empty")
        files = sorted(f for f in directory.rglob("*.html") if f.is_file())
        if limit > 0:
            files = files[:limit]
        if not files:
            raise ValueError(f"no *.html file under {directory}")
        pages = (
            Page(path="/p/" + f.relative_to(directory).as_posix(), kind=kinds[i % len(kinds)],
                 body=f.read_bytes())
            for i, f in enumerate(files)
        )
        site = cls(pages, host=host)
        for text in sorted((directory / "_sources").rglob("*.txt")):
            if text.is_file():
                body = text.read_bytes()
                site.add_document("/p/" + text.relative_to(directory).as_posix(), body,
                                  "text/plain; charset=utf-8",
                                  etag=hashlib.sha1(body).hexdigest()[:16])
        return site

    @classmethod
    def manual(
        cls,
        n_pages: int = 530,
        *,
        kinds: Sequence[str] = ("strong",),
        page_size: int = 20_000,
        host: str = "127.0.0.1",
    ) -> LoopbackSite:
        """A documentation manual of *n_pages* content pages linked as Sphinx
        links them (:mod:`tests.site.manual`): ``/p/index.html`` (the contents,
        where a crawl starts), the general index's letter pages
        ``/p/genindex-K.html`` (1,200 links each), ``/p/NNNN.html`` (~120 links
        each) and their source texts ``/p/_sources/NNNN.rst.txt``; plus the
        top-level pages every page's chrome links to (``/index.html``,
        ``/contents.html``, ``/bugs.html``, ``/copyright.html``). Pages cycle
        through *kinds*; the source texts have strong ETags and never change."""
        shape = Manual(n_pages)
        graph = manual_graph(shape)
        pages = [
            Page(path=path, kind=kinds[i % len(kinds)], size=page_size, layout="docs",
                 links=tuple(links))
            for i, (path, links) in enumerate(graph.items())
        ]
        pages += [Page(path=f"/{name}.html", kind=kinds[0], size=2_000, layout="docs",
                       links=()) for name in ("index", "contents", "bugs", "copyright")]
        site = cls(pages, host=host)
        for i in range(n_pages):
            text = f"Source of page {i}\n{'=' * 20}\n\n" + "reST text. " * 200
            site.add_document(source_path(i), text, "text/plain; charset=utf-8",
                              etag=f"src-{i}")
        return site

    def _add(self, page: Page) -> Page:
        if page.path in self._pages:
            raise ValueError(f"duplicate page path {page.path!r}")
        self._index[page.path] = len(self._order)
        self._order.append(page.path)
        self._pages[page.path] = page
        return page

    def add_page(self, path: str, kind: str, *, size: int = 20_000, title: str = "",
                 gzip: bool = False, noise: bool = False, layout: str = "plain") -> Page:
        """Add a page (version 0) and return it."""
        return self._add(Page(path=path, kind=kind, size=size, title=title, gzip=gzip,
                              noise=noise, layout=layout))

    def add_pages(self, n: int, *, kinds: Sequence[str] = ("strong",), size: int = 1500,
                  prefix: str = "/p/", width: int = 4) -> list[str]:
        """Add pages ``{prefix}0000`` .. (*width* digits), cycling through
        *kinds*; return their paths."""
        paths = [f"{prefix}{i:0{width}d}" for i in range(n)]
        for i, path in enumerate(paths):
            self.add_page(path, kinds[i % len(kinds)], size=size)
        return paths

    def page(self, path: str) -> Page:
        """Return the page at ``path`` (``KeyError`` if there is none)."""
        return self._pages[path]

    @property
    def pages(self) -> list[Page]:
        """All pages in insertion order (a new list; the pages are live)."""
        return [self._pages[p] for p in self._order]

    def add_redirect(self, src: str, dst: str, status: int = 301) -> None:
        """Answer ``src`` with ``status`` and ``Location: dst`` (made absolute).

        ``src`` is matched against the request path without query string.
        """
        if not src.startswith("/"):
            raise ValueError(f"redirect source must start with '/': {src!r}")
        if status not in _REDIRECT_STATUSES:
            raise ValueError(f"not a redirect status: {status}")
        self._redirects[src] = (dst, status)

    def remove_redirect(self, src: str) -> None:
        """Stop redirecting ``src`` (a page there, if any, answers again)."""
        self._redirects.pop(src, None)

    def add_document(
        self, path: str, body: bytes | str, content_type: str, *, etag: str | None = None
    ) -> None:
        """Serve *body* as it is at *path* (a hand-made sitemap, feed, listing).

        With *etag* (an entity-tag, or an unquoted tag such as ``foo``, which
        some servers send) the document answers a matching If-None-Match
        with 304.
        """
        if isinstance(body, str):
            body = body.encode("utf-8")
        self._documents[path] = (body, content_type, etag)

    def limit(
        self, rate: float, burst: float, *, retry_after: str = "seconds",
    ) -> TokenBucketLimiter:
        """Allow each client *rate* requests/s (bursts of *burst*); 429 above."""
        self.limiter = TokenBucketLimiter(rate, burst, retry_after)
        return self.limiter

    def slow(self, path_prefix: str, seconds: float) -> None:
        """Answer requests under *path_prefix* after *seconds* (a slow server)."""
        self._slow[path_prefix] = seconds

    def hold(self, path_prefix: str) -> None:
        """Keep the answers to requests under *path_prefix* until :meth:`release`.

        The requests arrive (and count in :attr:`in_flight`) but are not
        answered: a test can wait until every client has requests on the
        wire (:attr:`held`) before it lets the work go on, instead of hoping
        that a process starting late still finds some.
        """
        self._hold.add(path_prefix)

    @property
    def held(self) -> int:
        """Requests whose answer :meth:`hold` keeps now."""
        return len(self._held)

    def release(self, path_prefix: str | None = None) -> None:
        """Stop holding (what :meth:`hold` was given *path_prefix*, or all):
        answer those held requests (after their slow() delay), and the next."""
        if path_prefix is None:
            self._hold.clear()
        else:
            self._hold.discard(path_prefix)
        held, self._held = self._held, []
        for path, answer in held:
            if path_prefix is None or path.startswith(path_prefix):
                answer()
            else:
                self._held.append((path, answer))

    def override(
        self, path: str, *, status: int | None = None,
        headers: dict[str, str | None] | None = None, body: bytes | str | None = None,
    ) -> None:
        """Misbehave on ``path`` until :meth:`clear_override`.

        ``status`` answers with that status and a short text body instead of
        the page (an error: 404, 429, 500, 503...), or with ``body`` when
        given (a 404 whose body holds rules, half a page with a 206);
        ``headers`` sets response header fields (``None`` removes one) on
        whatever is answered, e.g. an invalid ETag or Last-Modified.
        """
        if isinstance(body, str):
            body = body.encode("utf-8")
        self._overrides[path] = (status, dict(headers or {}), body)

    def clear_override(self, path: str) -> None:
        self._overrides.pop(path, None)

    # -- changes -----------------------------------------------------------

    def change(self, path: str) -> None:
        """Give the page at ``path`` a new version (new content)."""
        self._pages[path].version += 1

    def set_kind(self, path: str, kind: str) -> None:
        """Change which validators the page at ``path`` sends from now on
        (e.g. a ``stuck`` server fixed to send ``strong`` ones); the content
        stays the same version."""
        if kind not in KINDS:
            raise ValueError(f"unknown page kind {kind!r}; expected one of {KINDS}")
        self._pages[path].kind = kind

    def change_fraction(self, fraction: float, *, seed: int = 0) -> list[str]:
        """Change ``round(n * fraction)`` pages (at least one if ``fraction > 0``).

        The pages are picked with ``random.Random(seed)``, so the same
        ``(fraction, seed)`` always picks the same pages. Returns their paths
        in site order.
        """
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be within [0, 1], got {fraction}")
        n = len(self._order)
        k = round(n * fraction)
        if fraction > 0 and k == 0:
            k = 1
        k = min(k, n)
        chosen = sorted(random.Random(seed).sample(range(n), k))
        paths = [self._order[i] for i in chosen]
        for path in paths:
            self.change(path)
        logger.debug("changed %d page(s) (fraction=%s, seed=%s)", len(paths), fraction, seed)
        return paths

    # -- representation ----------------------------------------------------

    def body(self, path: str) -> bytes:
        """The current HTML body of the page at ``path``."""
        return self._representation(self._pages[path])[0]

    def etag(self, path: str) -> str | None:
        """The ``ETag`` the page at ``path`` currently sends, if any."""
        page = self._pages[path]
        return self._validators(page, self._representation(page)[1])[0]

    def last_modified(self, path: str) -> str | None:
        """The ``Last-Modified`` the page at ``path`` currently sends, if any."""
        page = self._pages[path]
        lm_ts = self._validators(page, "")[1]
        return None if lm_ts is None else http_date(lm_ts)

    def _representation(self, page: Page) -> tuple[bytes, str]:
        """Return ``(body, opaque etag)`` for the page's current version."""
        cached = self._bodies.get(page.path)
        if cached is not None and cached[0] == page.version:
            return cached[1], cached[2]
        body = self._render_html(page)
        tag = hashlib.sha1(body).hexdigest()[:16]
        self._bodies[page.path] = (page.version, body, tag)
        return body, tag

    @staticmethod
    def _validators(page: Page, tag: str) -> tuple[str | None, int | None]:
        """Return ``(ETag header value, Last-Modified epoch)`` for ``page``."""
        if page.kind == "strong":
            return f'"{tag}"', page.modified_ts
        if page.kind == "weak":
            # W/ marks a weak validator (RFC 9110 §8.8.3): only usable with
            # the weak comparison, which is what If-None-Match uses anyway.
            return f'W/"{tag}"', None
        if page.kind == "lastmod":
            return None, page.modified_ts
        if page.kind == "stuck":
            return '"stuck"', BASE_EPOCH
        if page.kind == "random":
            return f'"{random.getrandbits(64):016x}"', None
        return None, None

    def _nav_links(self, page: Page) -> list[str]:
        """Paths linked from ``page``: neighbours plus a few stable picks.

        Seeded by the path only, so the link graph does not change between
        versions; only ``<main>`` does.
        """
        n = len(self._order)
        i = self._index[page.path]
        links: list[str] = []
        if n > 1:
            links += [self._order[(i - 1) % n], self._order[(i + 1) % n]]
        rng = random.Random(f"links:{page.path}")
        for _ in range(min(3, n)):
            links.append(self._order[rng.randrange(n)])
        seen: set[str] = {page.path}
        return [p for p in links if not (p in seen or seen.add(p))]

    def _render_html(self, page: Page) -> bytes:
        """Deterministic HTML for ``(page.path, page.version)``."""
        if page.body is not None:
            if not page.version:
                return page.body
            revision = f"<p>Revision {page.version}</p>".encode()
            at = page.body.rfind(b"</body>")
            at = len(page.body) if at < 0 else at
            return page.body[:at] + revision + page.body[at:]
        if page.layout == "docs":
            links = ([(href, href) for href in page.links] if page.links is not None
                     else [(p, self._pages[p].title) for p in self._nav_links(page)])
            return render_docs_page(f"{page.path}:{page.version}",
                                    f"{page.title} v{page.version}", links, page.size,
                                    page.version)
        title = html.escape(page.title)
        links = "".join(
            f'<a href="{html.escape(p)}">{html.escape(self._pages[p].title)}</a> '
            for p in self._nav_links(page)
        )
        head = (
            f"<!DOCTYPE html><html><head><title>{title} v{page.version}</title></head>"
            f"<body><nav>{links}</nav><main><h1>{title}</h1>"
            f'<p class="revision">Revision {page.version}</p>'
        )
        tail = (
            '</main><footer><a href="/sitemap.xml">Sitemap</a> | LoopbackSite</footer>'
            "</body></html>"
        )
        budget = page.size - len(head) - len(tail)
        rng = random.Random(f"{page.path}:{page.version}")
        parts: list[str] = []
        used = 0
        # Draw words in batches via randbytes() and a 256-entry table: several
        # times faster than choices(), which matters for benchmarks serving
        # thousands of 20 kB pages.
        pool: list[str] = []
        pos = 0
        while used < budget:
            n = rng.randint(30, 90)
            if len(pool) - pos < n:
                fresh = [_WORD_TABLE[b] for b in rng.randbytes(max(n, budget // 6))]
                pool, pos = pool[pos:] + fresh, 0
            words = pool[pos : pos + n]
            pos += n
            para = "<p>" + " ".join(words).capitalize() + ".</p>"
            room = budget - used
            if len(para) > room:
                # Trim the last paragraph at a word boundary so the body
                # lands close to page.size instead of overshooting by ~600 B.
                text = " ".join(words)[: max(room - 8, 0)].rsplit(" ", 1)[0]
                if not text:
                    break
                para = "<p>" + text.capitalize() + ".</p>"
            parts.append(para)
            used += len(para)
        return (head + "".join(parts) + tail).encode("utf-8")

    # -- listening ---------------------------------------------------------

    def start(self, port: int = 0) -> str:
        """Listen on ``host:port`` (0 = any free port); return the base URL.

        Uses the globally installed reactor, which must be running (or be run
        later) for requests to be served.
        """
        from twisted.internet import reactor

        if self._port is not None:
            raise RuntimeError("LoopbackSite is already started")
        site = _TrackingSite(_SiteResource(self))
        listening = reactor.listenTCP(port, site, interface=self.host)  # type: ignore[attr-defined]
        actual = listening.getHost().port
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._port, self._site = listening, site
        self._base_url = f"http://{host}:{actual}"
        logger.info("LoopbackSite listening on %s (%d pages)", self._base_url, len(self._order))
        return self._base_url

    def stop(self) -> Deferred[None]:
        """Stop listening and close every open connection.

        Returns a :class:`~twisted.internet.defer.Deferred` that fires once
        the port is closed and all connections are gone. A Deferred (rather
        than a coroutine) works everywhere: ``await site.stop()`` in
        ``async def`` code run via ``Deferred.fromCoroutine`` / pytest-twisted
        ``ensureDeferred``, ``yield site.stop()`` under ``inlineCallbacks``,
        and as a reactor "before shutdown" trigger. Calling it when not
        started is a no-op. Open connections are aborted, not drained.
        """
        from twisted.internet.defer import gatherResults, maybeDeferred, succeed

        port, site = self._port, self._site
        self._port = self._site = None
        if port is None or site is None:
            return succeed(None)
        waits: list[Deferred[Any]] = [maybeDeferred(port.stopListening)]
        for channel in list(site.channels):
            waits.append(channel.when_lost())
            if channel.transport is not None:
                channel.transport.abortConnection()  # type: ignore[attr-defined]
        d = gatherResults(waits, consumeErrors=True)
        d.addCallback(lambda _: logger.info("LoopbackSite on %s stopped", self._base_url))
        return d

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the running site (``RuntimeError`` before start)."""
        if self._base_url is None:
            raise RuntimeError("LoopbackSite has not been started")
        return self._base_url

    def url(self, path: str) -> str:
        """Absolute URL of ``path`` on the running site."""
        return _absolute(self.base_url, path)

    def urls(self, paths: Iterable[str]) -> list[str]:
        """Absolute URLs of *paths* (e.g. what :meth:`add_pages` returned)."""
        return [self.url(path) for path in paths]

    # -- log ---------------------------------------------------------------

    def reset_log(self) -> None:
        """Forget all recorded requests."""
        self.log.clear()

    def requests_for(self, path: str) -> list[RequestRecord]:
        """Records for ``path``.

        Without ``?`` in ``path`` the query string of records is ignored;
        with one, the full path-with-query must match.
        """
        if "?" in path:
            return [r for r in self.log if r.path == path]
        return [r for r in self.log if r.path.split("?", 1)[0] == path]

    def count(
        self,
        *,
        status: int | None = None,
        path_prefix: str | None = None,
        method: str | None = None,
    ) -> int:
        """Number of logged requests matching all given filters."""
        return sum(
            1
            for r in self.log
            if (status is None or r.status == status)
            and (path_prefix is None or r.path.startswith(path_prefix))
            and (method is None or r.method == method.upper())
        )

    def body_bytes(self, *, path_prefix: str | None = None) -> int:
        """Sum of response body bytes sent (optionally under ``path_prefix``)."""
        return sum(
            r.body_bytes for r in self.log if path_prefix is None or r.path.startswith(path_prefix)
        )

    # -- request handling --------------------------------------------------

    def _render(self, request: server.Request) -> bytes:
        """Render one request: compute, write headers, log, return body."""
        started = time.monotonic()
        method = request.method.decode("latin-1")
        raw_path = request.path.decode("utf-8", "replace")
        uri = request.uri.decode("utf-8", "replace")

        if raw_path.startswith(CONTROL_PREFIX):
            resp = self._control(method, raw_path, request.args)
            return self._write(request, resp)

        headers = {
            name.decode("latin-1").lower(): ", ".join(v.decode("latin-1") for v in values)
            for name, values in request.requestHeaders.getAllRawHeaders()
        }
        host = headers.get("host", "")
        self.in_flight[host] = self.in_flight.get(host, 0) + 1
        self.max_in_flight[host] = max(self.max_in_flight.get(host, 0), self.in_flight[host])
        resp = None
        wait_until = None
        if self.limiter is not None:
            client = request.getClientAddress().host
            retry_after = self.limiter.allow(client)
            if retry_after is not None:
                resp = _Response(429, b"Too Many Requests\n", {**_TEXT, "Retry-After": retry_after})
                wait_until = self.limiter.promises[client][1]
        if resp is None:
            resp = self._respond(method, raw_path, request)
        delay = next((d for prefix, d in self._slow.items() if raw_path.startswith(prefix)), 0.0)

        def finish() -> bytes:
            self.in_flight[host] -= 1
            body = self._write(request, resp)
            self.log.append(
                RequestRecord(
                    method=method,
                    path=uri,
                    status=resp.status,
                    body_bytes=len(body),
                    if_none_match=headers.get("if-none-match"),
                    if_modified_since=headers.get("if-modified-since"),
                    headers=headers,
                    started=started,
                    finished=time.monotonic(),
                    wait_until=wait_until,
                )
            )
            return body

        held = any(raw_path.startswith(prefix) for prefix in self._hold)
        if not delay and not held:
            return finish()
        from twisted.internet import reactor

        def later() -> None:
            if request.finished or request._disconnected:
                self.in_flight[host] -= 1
                return
            request.write(finish())
            request.finish()

        if held:
            self._held.append(
                (raw_path, lambda: reactor.callLater(delay, later)))  # type: ignore[attr-defined]
        else:
            reactor.callLater(delay, later)  # type: ignore[attr-defined]
        return server.NOT_DONE_YET  # type: ignore[return-value]

    @staticmethod
    def _write(request: server.Request, resp: _Response) -> bytes:
        """Apply ``resp`` to ``request``; return the bytes to send."""
        request.setResponseCode(resp.status)
        for name, value in resp.headers.items():
            request.setHeader(name, value)
        if resp.status == http.NOT_MODIFIED:
            # RFC 9110 §15.4.5: a 304 never has content.
            return b""
        request.setHeader("Content-Length", str(len(resp.body)))
        # HEAD: same header fields as GET but no content (RFC 9110 §9.3.2).
        if not resp.send_body or request.method == b"HEAD":
            return b""
        return resp.body

    def _respond(self, method: str, path: str, request: server.Request) -> _Response:
        resp = self._respond_normally(method, path, request)
        if path not in self._overrides:
            return resp
        status, headers, body = self._overrides[path]
        if status is not None:
            resp = _Response(status, f"status {status}\n".encode() if body is None else body,
                             dict(_TEXT))
        for name, value in headers.items():
            if value is None:
                resp.headers.pop(name, None)
            else:
                resp.headers[name] = value
        return resp

    def _respond_normally(self, method: str, path: str, request: server.Request) -> _Response:
        if method not in ("GET", "HEAD"):
            # RFC 9110 §15.5.6: a 405 MUST carry Allow.
            return _Response(
                405,
                b"Method Not Allowed\n",
                {"Content-Type": "text/plain; charset=utf-8", "Allow": "GET, HEAD"},
            )
        if path in self._redirects:
            dst, status = self._redirects[path]
            return _Response(status, b"", {"Location": _absolute(self.base_url, dst)})
        page = self._pages.get(path)
        if page is not None:
            return self._page_response(page, request)
        if path in self._documents:
            return self._document_response(path, request)
        return self._list_response(path, request)

    def _document_response(self, path: str, request: server.Request) -> _Response:
        body, content_type, etag = self._documents[path]
        if etag is None:
            return _Response(200, body, {"Content-Type": content_type})
        inm = request.getHeader("if-none-match")
        if inm is not None and etag_matches(inm, etag):
            return _Response(304, b"", {"ETag": etag})
        return _Response(200, body, {"Content-Type": content_type, "ETag": etag})

    def _list_response(self, path: str, request: server.Request) -> _Response:
        """robots.txt and the sitemaps (a 404 for any other path), with a
        strong ETag and 304s when :attr:`list_etags` is on."""
        resp = self._list_body(path)
        if resp.status != 200 or not self.list_etags:
            return resp
        etag = '"' + hashlib.sha1(resp.body).hexdigest()[:16] + '"'
        inm = request.getHeader("if-none-match")
        if inm is not None and etag_matches(inm, etag):
            return _Response(304, b"", {"ETag": etag})
        resp.headers["ETag"] = etag
        return resp

    def _list_body(self, path: str) -> _Response:
        if path == "/robots.txt":
            return _Response(200, self._robots().encode("utf-8"), dict(_TEXT))
        if path == "/sitemap.xml":
            return _Response(200, self._urlset(self.pages), dict(_XML))
        if path == "/sitemap_index.xml":
            return _Response(200, self._sitemap_index(), dict(_XML))
        if path == "/sitemap-1.xml":
            return _Response(200, self._urlset(self._halves()[0]), dict(_XML))
        if path == "/sitemap-2.xml.gz":
            # A .xml.gz *file*: gzip bytes as the payload, no Content-Encoding,
            # which is how most real sites serve compressed sitemaps. mtime=0
            # keeps the bytes deterministic.
            gz = gzip.compress(self._urlset(self._halves()[1]), mtime=0)
            return _Response(200, gz, {"Content-Type": "application/gzip"})
        return _Response(404, b"Not Found\n", dict(_TEXT))

    def _page_response(self, page: Page, request: server.Request) -> _Response:
        body, tag = self._representation(page)
        etag, lm_ts = self._validators(page, tag)
        headers: dict[str, str] = {}
        gzipped = page.gzip and _accepts_gzip(request.getHeader("accept-encoding"))
        if page.gzip:
            headers["Vary"] = "Accept-Encoding"
        if gzipped and etag is not None:
            # A different representation, a different entity-tag (§8.8.3.3).
            etag = etag[:-1] + '-gzip"'
        if etag is not None:
            headers["ETag"] = etag
        if lm_ts is not None:
            headers["Last-Modified"] = http_date(lm_ts)
        if self.cache_control is not None:
            headers["Cache-Control"] = self.cache_control
        if self._not_modified(page, etag, lm_ts, request):
            # RFC 9110 §15.4.5: the 304 carries the validators a 200 would.
            return _Response(304, b"", headers)
        headers["Content-Type"] = "text/html; charset=utf-8"
        if page.kind == "noisy" or page.noise:
            self._served += 1
            stamp = datetime.now(UTC).isoformat(timespec="microseconds")
            body = body.replace(
                b"<footer>", f"<footer><p>Generated at {stamp}</p>".encode(), 1
            ).replace(
                b"</main>", f"<p>Updated {stamp}</p></main>".encode(), 1
            )
        if gzipped:
            body = gzip.compress(body, mtime=0)
            headers["Content-Encoding"] = "gzip"
        return _Response(200, body, headers)

    @staticmethod
    def _not_modified(
        page: Page, etag: str | None, lm_ts: int | None, request: server.Request
    ) -> bool:
        """Evaluate the conditional request (RFC 9110 §13.2.2 order)."""
        if page.kind == "none":
            # A page without validators is always sent in full, even for
            # "If-None-Match: *": this kind models a server ignoring
            # preconditions altogether.
            return False
        inm = request.requestHeaders.getRawHeaders(b"if-none-match")
        if inm is not None:
            # §13.1.3 / §13.2.2 step 3-4: when If-None-Match is present,
            # If-Modified-Since MUST be ignored; If-None-Match alone decides.
            value = ", ".join(v.decode("latin-1") for v in inm)
            return etag_matches(value, etag)
        ims = request.requestHeaders.getRawHeaders(b"if-modified-since")
        if ims is None or lm_ts is None:
            return False
        if len(ims) != 1:
            # §13.1.3: ignore a field value with more than one member.
            return False
        ims_ts = parse_http_date(ims[0].decode("latin-1"))
        # §13.1.3: false (=> 304) if the last modification date is earlier
        # than or equal to the date provided.
        return ims_ts is not None and lm_ts <= ims_ts

    # -- robots & sitemaps -------------------------------------------------

    def _robots(self) -> str:
        if self.robots_txt is not None:
            return self.robots_txt
        return f"User-agent: *\nAllow: /\n\nSitemap: {self.base_url}/sitemap_index.xml\n"

    def _halves(self) -> tuple[list[Page], list[Page]]:
        pages = self.pages
        mid = (len(pages) + 1) // 2
        return pages[:mid], pages[mid:]

    def set_sitemap_lastmods(self, mode: str) -> None:
        """Set :attr:`sitemap_lastmods` (``ValueError`` for an unknown mode)."""
        if mode not in LASTMOD_MODES:
            raise ValueError(f"unknown lastmod mode {mode!r}; expected one of {LASTMOD_MODES}")
        self.sitemap_lastmods = mode

    def _sitemap_lastmod(self, page: Page) -> int | None:
        """The ``<lastmod>`` the sitemaps give *page* (``None``: no element)."""
        if self.sitemap_lastmods == "none":
            return None
        if self.sitemap_lastmods == "stale":
            return BASE_EPOCH  # the date of version 0, the page's first
        return page.modified_ts

    def _lastmod_element(self, ts: int | None) -> str:
        return "" if ts is None else f"<lastmod>{w3c_datetime(ts)}</lastmod>"

    def _urlset(self, pages: Iterable[Page]) -> bytes:
        entries = "".join(
            f"<url><loc>{xml_escape(self.url(p.path))}</loc>"
            f"{self._lastmod_element(self._sitemap_lastmod(p))}</url>\n"
            for p in pages
        )
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
            f"{entries}</urlset>\n"
        ).encode()

    def _sitemap_index(self) -> bytes:
        entries = []
        for name, half in zip(("sitemap-1.xml", "sitemap-2.xml.gz"), self._halves(), strict=True):
            dates = [d for p in half if (d := self._sitemap_lastmod(p)) is not None]
            lastmod = None if self.sitemap_lastmods == "none" else max(dates, default=BASE_EPOCH)
            entries.append(
                f"<sitemap><loc>{xml_escape(self.url('/' + name))}</loc>"
                f"{self._lastmod_element(lastmod)}</sitemap>\n"
            )
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
            f"{''.join(entries)}</sitemapindex>\n"
        ).encode()

    # -- control endpoints ---------------------------------------------------

    def _control(self, method: str, path: str, args: dict[bytes, list[bytes]]) -> _Response:
        """Handle ``/__site__/...``; these requests are deliberately not logged."""
        params = {k.decode("utf-8"): [v.decode("utf-8") for v in vs] for k, vs in args.items()}
        name = path[len(CONTROL_PREFIX) :]
        expected = {"log": "GET", "stats": "GET", "reset": "POST", "change": "POST",
                    "kind": "POST", "lastmods": "POST", "status": "POST"}.get(name)
        if expected is None:
            return _json(404, {"error": f"unknown control endpoint {path!r}"})
        if method != expected:
            resp = _json(405, {"error": f"use {expected}"})
            resp.headers["Allow"] = expected
            return resp
        if name == "log":
            return _json(200, [asdict(r) for r in self.log])
        if name == "stats":
            limiter = self.limiter
            return _json(200, {
                "max_in_flight": self.max_in_flight,
                "refused": limiter.refused if limiter else 0,
                "broken_promises": limiter.broken_promises if limiter else 0,
            })
        if name == "reset":
            self.reset_log()
            self.max_in_flight.clear()
            if self.limiter is not None:
                self.limiter.refused = self.limiter.broken_promises = 0
                self.limiter.buckets.clear()
                self.limiter.promises.clear()
            return _json(200, {"ok": True})
        return self._control_change(name, params)

    def _control_change(self, name: str, params: dict[str, list[str]]) -> _Response:
        """``POST /__site__/change``, ``/__site__/kind`` and ``/__site__/lastmods``."""
        try:
            if name == "lastmods":
                self.set_sitemap_lastmods(params.get("mode", [""])[0])
                return _json(200, {"mode": self.sitemap_lastmods})
            if name == "status":
                return self._control_status(params)
            if name == "kind":
                kind = params.get("kind", [""])[0]
                for p in params.get("path", []):
                    self.set_kind(p, kind)
                return _json(200, params.get("path", []))
            if "path" in params:
                for p in params["path"]:
                    self.change(p)
                return _json(200, params["path"])
            if "fraction" in params:
                seed = int(params.get("seed", ["0"])[0])
                return _json(200, self.change_fraction(float(params["fraction"][0]), seed=seed))
        except KeyError as exc:
            return _json(404, {"error": f"no such page {exc.args[0]!r}"})
        except ValueError as exc:
            return _json(400, {"error": str(exc)})
        return _json(400, {"error": "give path=... or fraction=...[&seed=...]"})


    def _control_status(self, params: dict[str, list[str]]) -> _Response:
        """``POST /__site__/status?path=/p/0001&path=...&status=410``: those pages
        answer that status from now on (:meth:`override`); ``status=200``
        gives them back their content (:meth:`clear_override`)."""
        status = int(params.get("status", ["200"])[0])
        paths = params.get("path", [])
        for p in paths:
            self.page(p)  # KeyError: no such page
            if status == 200:
                self.clear_override(p)
            else:
                self.override(p, status=status)
        return _json(200, paths)


def _json(status: int, payload: Any) -> _Response:
    return _Response(
        status, json.dumps(payload).encode("utf-8"), {"Content-Type": "application/json"}
    )


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.site",
        description="Serve a LoopbackSite; print its base URL on one line, "
        "then serve until SIGTERM/SIGINT.",
    )
    parser.add_argument("--pages", type=int, default=100, help="number of pages")
    parser.add_argument("--page-size", type=int, default=20_000, help="approx. HTML bytes per page")
    parser.add_argument(
        "--kinds",
        default="strong,weak,lastmod,none",
        help=f"comma-separated page kinds to cycle through, from {','.join(KINDS)}",
    )
    parser.add_argument("--port", type=int, default=0, help="TCP port (0 = any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--log-level", default="WARNING", help="logging level (stderr)")
    parser.add_argument("--rate", type=float, default=0,
                        help="per-client requests/s before 429 + Retry-After (0 = no limit)")
    parser.add_argument("--burst", type=float, default=5, help="token bucket size (5)")
    parser.add_argument("--retry-after", choices=("seconds", "date"), default="seconds",
                        help="Retry-After as delay-seconds or as an HTTP-date")
    parser.add_argument("--latency", type=float, default=0,
                        help="seconds before each page (/p/...) is answered (0)")
    parser.add_argument("--sitemap-lastmods", choices=LASTMOD_MODES, default="honest",
                        help="the sitemaps' <lastmod>: each page's version date (honest), "
                        "its first version's whatever its version (stale), or none")
    parser.add_argument("--list-etags", action="store_true",
                        help="strong ETags (and 304s) on robots.txt and the sitemaps")
    parser.add_argument("--layout", choices=LAYOUTS, default="plain",
                        help="generated pages: plain paragraphs, or the structure of a "
                        "documentation page (docs)")
    parser.add_argument("--manual", action="store_true",
                        help="a documentation manual's link graph (tests/site/manual.py): "
                        "--pages content pages of --page-size bytes, index pages of 1,200 "
                        "links, ~120 links per page, fragments, source texts")
    parser.add_argument("--docs-dir", type=Path, default=None,
                        help="serve the *.html files under this directory as the pages "
                        "(as they are; --pages > 0 keeps the first N) instead of generated ones")
    parser.add_argument("--cache-control", default=None,
                        help="Cache-Control value sent with every page (e.g. max-age=0)")
    args = parser.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in args.kinds if k not in KINDS]
    if bad or not args.kinds:
        parser.error(f"invalid --kinds {bad or args.kinds}; choose from {','.join(KINDS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the process exit code."""
    args = _parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper())

    # Install the asyncio reactor *before* anything imports
    # twisted.internet.reactor (which would install the default one).
    from scrapy.utils.reactor import install_reactor

    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    from twisted.internet import reactor

    if args.manual:
        site = LoopbackSite.manual(args.pages, kinds=args.kinds, page_size=args.page_size,
                                   host=args.host)
    elif args.docs_dir is not None:
        site = LoopbackSite.from_directory(args.docs_dir, kinds=args.kinds, limit=args.pages,
                                           host=args.host)
    else:
        site = LoopbackSite.generated(args.pages, kinds=args.kinds, page_size=args.page_size,
                                      host=args.host, layout=args.layout)
    site.cache_control = args.cache_control
    if args.rate > 0:
        site.limit(args.rate, args.burst, retry_after=args.retry_after)
    if args.latency > 0:
        site.slow("/p/", args.latency)
    site.set_sitemap_lastmods(args.sitemap_lastmods)
    site.list_etags = args.list_etags
    base_url = site.start(args.port)
    # Exactly one line on stdout: the parent process reads it to learn the port.
    sys.stdout.write(base_url + "\n")
    sys.stdout.flush()
    # reactor.run() installs SIGINT/SIGTERM handlers that stop the reactor,
    # but leaves SIGINT alone unless it has Python's default handler. A
    # process started in the background by a non-interactive shell inherits
    # SIGINT as *ignored*, so restore the default to honour SIGINT there too.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Closing the site before the reactor stops makes shutdown clean.
    reactor.addSystemEventTrigger("before", "shutdown", site.stop)  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    sys.exit(main())
