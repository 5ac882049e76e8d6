"""The site ``scrapy demo`` crawls: generated pages served on loopback.

Small on purpose: what the demo shows and nothing else. ``/robots.txt``
names a sitemap index of two sitemaps (the first and the second half of the
pages); pages are ``/p/0000``, ``/p/0001``... and cycle through four kinds
of validators:

* ``strong``  -- a strong ``ETag`` (a hash of the body) and ``Last-Modified``;
* ``weak``    -- a weak ``ETag`` (``W/"..."``) only;
* ``lastmod`` -- ``Last-Modified`` only;
* ``none``    -- no validators.

A page changes only through :meth:`DemoSite.change_fraction`, which gives it
a new version: new text, new validators, and a ``<lastmod>`` one hour later
in its sitemap and in the index. Every request is logged (path, status,
body bytes) in :attr:`DemoSite.log`.

The server side is written here, from the standard library's dates and an
ETag comparison of its own, rather than borrowed from the crawler: the demo
shows the crawler talking to an HTTP server, not to itself.

Importing this module starts nothing: the reactor is imported by
:meth:`DemoSite.start` and :meth:`DemoSite.stop` only, after Scrapy has
installed the one it wants.
"""

from __future__ import annotations

import email.utils
import hashlib
import random
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, cast

from twisted.internet.defer import maybeDeferred, succeed
from twisted.protocols.policies import WrappingFactory
from twisted.web import resource, server

from incremental_crawler._reactor import get_reactor

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred
    from twisted.web import http

    from incremental_crawler._reactor import ListeningPort

__all__ = ["KINDS", "DemoSite", "Hit", "etag_matches", "not_modified"]

#: The kinds of validators the pages cycle through (see the module docstring).
KINDS: tuple[str, ...] = ("strong", "weak", "lastmod", "none")

# Every date is fixed and in the past, so that the output is the same from
# one run to the next and no Last-Modified is later than the response's Date
# (RFC 9110 §8.8.2.1): version v of a page was modified at BASE + v hours.
_BASE_EPOCH = 1_700_000_000
_VERSION_STEP = 3600

_SITEMAPS = ("/sitemap-1.xml", "/sitemap-2.xml")
_HTML = "text/html; charset=utf-8"
_XML = "application/xml; charset=utf-8"
_TEXT = "text/plain; charset=utf-8"

_WORDS: tuple[str, ...] = (
    "archive", "beacon", "bridge", "cache", "channel", "compass", "crawler", "delta",
    "digest", "domain", "engine", "fragment", "garden", "harbor", "header", "index",
    "journal", "kernel", "ledger", "meadow", "mirror", "module", "network", "orbit",
    "packet", "quartz", "query", "record", "river", "schema", "signal", "sketch", "spider",
    "stream", "summit", "syntax", "thread", "token", "update", "valley", "vector", "window",
    "winter", "zenith",
)

# An entity-tag is an opaque-tag in quotes, ``W/`` before it for a weak one
# (RFC 9110 §8.8.3); inside the quotes anything but a quote is allowed,
# commas included, so an If-None-Match list cannot be split on commas. The
# list may have empty members (RFC 9110 §5.6.1).
_ENTITY_TAG = re.compile(r'(?:W/)?"([^"]*)"')
_ENTITY_TAG_LIST = re.compile(r'[\s,]*(?:(?:W/)?"[^"]*"\s*(?:,[\s,]*|\Z))*')


@dataclass(frozen=True)
class Hit:
    """One request the site answered: path (with query), status, body bytes sent."""

    path: str
    status: int
    body_bytes: int


@dataclass
class _Page:
    path: str
    kind: str
    version: int = 0

    @property
    def modified(self) -> int:
        """Epoch seconds of the current version."""
        return _BASE_EPOCH + self.version * _VERSION_STEP


# -- HTTP semantics (pure functions) -------------------------------------------


def _http_date(ts: int) -> str:
    return email.utils.formatdate(ts, usegmt=True)


def _parse_http_date(value: str) -> float | None:
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:
        # "-0000" parses as naive; an HTTP-date is always GMT.
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _w3c_datetime(ts: int) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat()


def etag_matches(if_none_match: str, etag: str | None) -> bool:
    """Whether an ``If-None-Match`` value matches the current ``etag``.

    The weak comparison (RFC 9110 §8.8.3.2, the one §13.1.2 prescribes):
    two entity-tags match when their opaque-tags are equal, ``W/`` or not.
    ``*`` matches any current representation, with or without an ETag.
    A malformed list matches nothing: the page is sent in full.
    """
    if if_none_match.strip() == "*":
        return True
    if etag is None:
        return False
    current = _ENTITY_TAG.fullmatch(etag)
    if current is None or not _ENTITY_TAG_LIST.fullmatch(if_none_match):
        return False
    return current.group(1) in _ENTITY_TAG.findall(if_none_match)


def not_modified(
    etag: str | None,
    last_modified: int | None,
    if_none_match: str | None,
    if_modified_since: str | None,
) -> bool:
    """Whether a GET or HEAD of a page with these validators gets a 304.

    RFC 9110 §13.2.2: when ``If-None-Match`` is present it alone decides
    and ``If-Modified-Since`` is ignored (§13.1.3); otherwise the page is not
    modified if its last modification is not later than the date given. An
    invalid date is ignored (§13.1.3), as is If-Modified-Since on a page
    without ``Last-Modified``.
    """
    if if_none_match is not None:
        return etag_matches(if_none_match, etag)
    if if_modified_since is None or last_modified is None:
        return False
    since = _parse_http_date(if_modified_since)
    return since is not None and last_modified <= since


def _page_html(page: _Page, size: int) -> bytes:
    """The page's HTML, exactly ``size`` bytes (if that leaves room for the
    markup), the same for the same ``(path, version)``."""
    title = f"Page {page.path} (revision {page.version})"
    head = (
        f"<!DOCTYPE html><html><head><title>{title}</title></head>"
        f"<body><main><h1>{title}</h1>"
    )
    tail = "</main><footer>incremental_crawler demo site</footer></body></html>"
    room = size - len(head) - len(tail)
    rng = random.Random(f"{page.path}:{page.version}")  # noqa: S311 (text, not secrets)
    parts: list[str] = []
    while room > 0:
        text = " ".join(rng.choices(_WORDS, k=rng.randint(40, 90))).capitalize() + "."
        # The last paragraph is cut to fill the page to the byte.
        para = f"<p>{text[: room - 7]}</p>" if room >= 8 else " " * room
        parts.append(para)
        room -= len(para)
    return (head + "".join(parts) + tail).encode("ascii")


# -- the site ------------------------------------------------------------------


class DemoSite:
    """``pages`` generated pages of ``page_size`` bytes, served on ``host``.

    Use from the reactor thread only: :meth:`start`, then crawl, then
    :meth:`stop`.
    """

    def __init__(self, pages: int = 60, *, page_size: int = 12_000,
                 host: str = "127.0.0.1") -> None:
        if pages < 0:
            raise ValueError(f"pages must be >= 0, got {pages}")
        self.host = host
        self.page_size = page_size
        #: Every request answered since the last :meth:`reset_log`, in order.
        self.log: list[Hit] = []
        self._pages = [_Page(f"/p/{i:04d}", KINDS[i % len(KINDS)]) for i in range(pages)]
        self._by_path = {page.path: page for page in self._pages}
        # path -> (version, body, strong ETag): the current version only.
        self._bodies: dict[str, tuple[int, bytes, str]] = {}
        self._port: ListeningPort | None = None
        self._connections: WrappingFactory | None = None
        self._base_url = ""

    # -- changes and log -------------------------------------------------------

    def change_fraction(self, fraction: float, *, seed: int = 0) -> list[str]:
        """Give ``round(pages * fraction)`` pages (at least one if ``fraction``
        is above 0) a new version; return their paths in site order.

        The pages are drawn with ``random.Random(seed)``: the same arguments
        change the same pages.
        """
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be within [0, 1], got {fraction}")
        n = len(self._pages)
        k = min(n, max(round(n * fraction), 1 if fraction > 0 else 0))
        chosen = sorted(random.Random(seed).sample(range(n), k))  # noqa: S311 (not a secret)
        for i in chosen:
            self._pages[i].version += 1
        return [self._pages[i].path for i in chosen]

    def reset_log(self) -> None:
        """Forget the requests logged so far."""
        self.log.clear()

    # -- responses -------------------------------------------------------------

    def respond(
        self, path: str, if_none_match: str | None = None,
        if_modified_since: str | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """Status, header fields and body of a GET of ``path`` (no query)."""
        page = self._by_path.get(path)
        if page is not None:
            return self._page_response(page, if_none_match, if_modified_since)
        if path == "/robots.txt":
            body = f"User-agent: *\nAllow: /\n\nSitemap: {self.base_url}/sitemap_index.xml\n"
            return 200, {"Content-Type": _TEXT}, body.encode()
        if path == "/sitemap_index.xml":
            return 200, {"Content-Type": _XML}, self._sitemap_index()
        if path in _SITEMAPS:
            return 200, {"Content-Type": _XML}, self._urlset(self._halves()[_SITEMAPS.index(path)])
        return 404, {"Content-Type": _TEXT}, b"Not Found\n"

    def _page_response(
        self, page: _Page, if_none_match: str | None, if_modified_since: str | None,
    ) -> tuple[int, dict[str, str], bytes]:
        cached = self._bodies.get(page.path)
        if cached is None or cached[0] != page.version:
            body = _page_html(page, self.page_size)
            cached = (page.version, body, f'"{hashlib.sha256(body).hexdigest()[:20]}"')
            self._bodies[page.path] = cached
        _, body, strong = cached
        etag = {"strong": strong, "weak": f"W/{strong}"}.get(page.kind)
        last_modified = page.modified if page.kind in ("strong", "lastmod") else None
        headers: dict[str, str] = {}
        if etag is not None:
            headers["ETag"] = etag
        if last_modified is not None:
            headers["Last-Modified"] = _http_date(last_modified)
        if not_modified(etag, last_modified, if_none_match, if_modified_since):
            # A 304 carries the validators a 200 would (RFC 9110 §15.4.5).
            return 304, headers, b""
        headers["Content-Type"] = _HTML
        return 200, headers, body

    def _halves(self) -> tuple[list[_Page], list[_Page]]:
        mid = (len(self._pages) + 1) // 2
        return self._pages[:mid], self._pages[mid:]

    def _urlset(self, pages: list[_Page]) -> bytes:
        urls = "".join(
            f"<url><loc>{self.base_url}{page.path}</loc>"
            f"<lastmod>{_w3c_datetime(page.modified)}</lastmod></url>\n"
            for page in pages
        )
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
            f"{urls}</urlset>\n"
        ).encode()

    def _sitemap_index(self) -> bytes:
        # A sitemap's <lastmod> is its latest page's: it moves only when one
        # of its pages changed, so the crawler can leave the other one unread.
        sitemaps = "".join(
            f"<sitemap><loc>{self.base_url}{name}</loc><lastmod>"
            f"{_w3c_datetime(max((p.modified for p in half), default=_BASE_EPOCH))}"
            "</lastmod></sitemap>\n"
            for name, half in zip(_SITEMAPS, self._halves(), strict=True)
        )
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
            f"{sitemaps}</sitemapindex>\n"
        ).encode()

    def _render(self, request: server.Request) -> int:
        path = request.path.decode("utf-8", "replace")
        inm = request.requestHeaders.getRawHeaders(b"if-none-match")
        ims = request.requestHeaders.getRawHeaders(b"if-modified-since")
        status, headers, body = self.respond(
            path,
            # Repeated lines of a list field are one list (RFC 9110 §5.3).
            None if inm is None else ", ".join(v.decode("latin-1") for v in inm),
            # Repeated If-Modified-Since lines are not one date: ignored (§13.1.3).
            ims[0].decode("latin-1") if ims is not None and len(ims) == 1 else None,
        )
        request.setResponseCode(status)
        for name, value in headers.items():
            request.setHeader(name, value)
        if status != 304:
            # HEAD gets the Content-Length its GET would (RFC 9110 §9.3.2). A
            # 304 gets none: it would have to be the 200's, not 0 (§8.6).
            request.setHeader("Content-Length", str(len(body)))
        sent = b"" if request.method == b"HEAD" or status == 304 else body
        self.log.append(Hit(request.uri.decode("utf-8", "replace"), status, len(sent)))
        if sent:
            request.write(sent)
        request.finish()
        return server.NOT_DONE_YET

    # -- listening -------------------------------------------------------------

    def start(self, port: int = 0) -> str:
        """Listen on ``host:port`` (0: any free port); return the base URL."""
        if self._port is not None:
            raise RuntimeError("the demo site is already started")
        site = _QuietSite(_Resource(self))
        # The wrapper keeps the open connections, for stop() to close them.
        self._connections = WrappingFactory(site)
        self._connections.noisy = False
        self._port = get_reactor().listenTCP(port, self._connections, interface=self.host)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._base_url = f"http://{host}:{self._port.getHost().port}"
        return self._base_url

    def stop(self) -> Deferred[None]:
        """Stop listening and drop the open connections (a no-op if not started)."""
        port, connections = self._port, self._connections
        self._port = self._connections = None
        if port is None:
            return succeed(None)
        for wrapper in list(connections.protocols if connections else ()):
            wrapper.transport.abortConnection()
        # The Deferred stopListening may return is chained: its result is ours.
        return cast("Deferred[None]", maybeDeferred(port.stopListening))

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the started site."""
        if not self._base_url:
            raise RuntimeError("the demo site has not been started")
        return self._base_url


class _Resource(resource.Resource):
    """Every path, answered by the :class:`DemoSite`; other methods than
    GET and HEAD get Twisted's 405 with ``Allow``."""

    isLeaf = True  # noqa: N815 (Twisted API)

    def __init__(self, site: DemoSite) -> None:
        super().__init__()
        self._site = site

    def render_GET(self, request: server.Request) -> int:  # noqa: N802 (Twisted API)
        return self._site._render(request)

    render_HEAD = render_GET  # noqa: N815 (Twisted API)


class _QuietSite(server.Site):
    """No access log and no "Starting factory" lines: :attr:`DemoSite.log` is the log."""

    noisy = False

    def log(self, request: http.Request) -> None:
        pass
