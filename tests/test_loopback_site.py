"""Tests for the loopback test site, tests.site (real sockets, asyncio reactor).

Run with: python -m pytest -p pytest_twisted --reactor=asyncio tests/test_loopback_site.py
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import re
import selectors
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol
from twisted.internet.threads import deferToThread
from twisted.web.client import Agent, ResponseDone
from twisted.web.http_headers import Headers

from tests.site import (
    BASE_EPOCH,
    VERSION_STEP,
    LoopbackSite,
    Page,
    RequestRecord,
    etag_matches,
    http_date,
    parse_http_date,
    w3c_datetime,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from twisted.python.failure import Failure
    from twisted.web.iweb import IResponse

PROJECT_ROOT = Path(__file__).resolve().parent.parent
HEX16 = re.compile(r"[0-9a-f]{16}")


class Fetched:
    """Status, headers and body of one response."""

    def __init__(self, status: int, headers: Headers, body: bytes, length: int | None) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        # Agent strips Content-Length from the headers and exposes it here.
        self.length = length

    def header(self, name: str) -> str | None:
        values = self.headers.getRawHeaders(name.encode("latin-1"))
        return None if values is None else values[0].decode("latin-1")


class _BodyCollector(Protocol):
    """Collect a response body.

    Used instead of ``twisted.web.client.readBody``, which emits a spurious
    DeprecationWarning for every Agent response because the response's
    TransportProxyProducer has no abortConnection (twisted/twisted#8227).
    """

    def __init__(self, done: Deferred[bytes]) -> None:
        self._done = done
        self._chunks: list[bytes] = []

    def dataReceived(self, data: bytes) -> None:
        self._chunks.append(data)

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        if reason.check(ResponseDone):
            self._done.callback(b"".join(self._chunks))
        else:
            self._done.errback(reason)


def read_body(response: IResponse) -> Deferred[bytes]:
    """Deferred with the whole body of ``response``."""
    done: Deferred[bytes] = Deferred()
    response.deliverBody(_BodyCollector(done))
    return done


async def fetch(url: str, method: str = "GET", **headers: str) -> Fetched:
    """One request with a non-persistent Agent (connection closed after)."""
    from twisted.internet import reactor

    hdrs = Headers({k.replace("_", "-").encode(): [v.encode()] for k, v in headers.items()})
    response = await Agent(reactor).request(method.encode(), url.encode(), hdrs)
    body = await read_body(response)
    length = response.length if isinstance(response.length, int) else None
    return Fetched(response.code, response.headers, body, length)


@pytest_twisted.async_yield_fixture()
async def site() -> AsyncIterator[LoopbackSite]:
    s = LoopbackSite(
        [
            Page("/strong", "strong", size=3000),
            Page("/weak", "weak", size=3000),
            Page("/lastmod", "lastmod", size=3000),
            Page("/none", "none", size=3000),
            Page("/stuck", "stuck", size=3000),
        ]
    )
    s.start()
    yield s
    await s.stop()


# -- pure / offline ------------------------------------------------------------


def test_import_has_no_side_effects_and_pages_are_deterministic() -> None:
    a = LoopbackSite.generated(8, page_size=5000)
    b = LoopbackSite.generated(8, page_size=5000)
    assert [p.path for p in a.pages] == [f"/p/{i:04d}" for i in range(8)]
    assert [p.kind for p in a.pages[:5]] == ["strong", "weak", "lastmod", "none", "strong"]
    body = a.body("/p/0001")
    assert body == b.body("/p/0001")
    assert abs(len(body) - 5000) < 200
    text = body.decode()
    assert text.startswith("<!DOCTYPE html><html><head><title>Page p/0001 v0</title>")
    assert "<nav>" in text and "<main>" in text and "<footer>" in text
    main_v0 = text.split("<main>")[1].split("</main>")[0]
    a.change("/p/0001")
    main_v1 = a.body("/p/0001").decode().split("<main>")[1].split("</main>")[0]
    assert main_v0 != main_v1
    with pytest.raises(RuntimeError):
        _ = a.base_url
    with pytest.raises(ValueError):
        Page("no-slash", "strong")
    with pytest.raises(ValueError):
        Page("/x", "bogus")



def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_site_and_the_package_import_nothing_from_each_other() -> None:
    # The test site is the other side of the wire: sharing the crawler's date
    # or ETag code would let one bug pass on both sides. And the package is
    # installed without tests/, so it must not need the test site.
    site_imports = {
        str(path.relative_to(PROJECT_ROOT)): sorted(
            m for m in _imported_modules(path) if m.split(".")[0] == "incremental_crawler")
        for path in (PROJECT_ROOT / "tests" / "site").glob("*.py")
    }
    assert "tests/site/server.py" in site_imports
    assert all(not found for found in site_imports.values()), site_imports
    package_imports = {
        str(path.relative_to(PROJECT_ROOT)): sorted(
            m for m in _imported_modules(path) if m.split(".")[0] == "tests")
        for path in (PROJECT_ROOT / "incremental_crawler").rglob("*.py")
    }
    assert "incremental_crawler/demo/site.py" in package_imports
    assert all(not found for found in package_imports.values()), package_imports


def test_change_fraction_is_deterministic() -> None:
    a = LoopbackSite.generated(100)
    b = LoopbackSite.generated(100)
    changed = a.change_fraction(0.05, seed=1)
    assert changed == b.change_fraction(0.05, seed=1)
    assert len(changed) == 5
    assert all(a.page(p).version == 1 for p in changed)
    assert sum(p.version for p in a.pages) == 5
    assert len(LoopbackSite.generated(10).change_fraction(0.001)) == 1
    assert LoopbackSite.generated(10).change_fraction(0.0) == []


def test_conditional_helpers() -> None:
    assert etag_matches('"abc"', '"abc"')
    assert etag_matches('W/"abc"', '"abc"')  # weak comparison, RFC 9110 §8.8.3.2
    assert etag_matches('"abc"', 'W/"abc"')
    assert etag_matches('"x", W/"abc" ,"y"', '"abc"')
    assert not etag_matches('"abcd"', '"abc"')
    assert etag_matches("*", None)
    assert not etag_matches('"abc"', None)
    assert parse_http_date(http_date(BASE_EPOCH)) == BASE_EPOCH
    assert parse_http_date("not a date") is None


# -- over HTTP -----------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_200_validators_per_kind(site: LoopbackSite) -> None:
    strong = await fetch(site.url("/strong"))
    assert strong.status == 200
    assert strong.header("Content-Type") == "text/html; charset=utf-8"
    assert strong.length == len(strong.body)
    assert strong.body == site.body("/strong")
    etag = strong.header("ETag")
    assert etag is not None and etag.startswith('"') and HEX16.fullmatch(etag.strip('"'))
    assert strong.header("Last-Modified") == http_date(BASE_EPOCH)

    weak = await fetch(site.url("/weak"))
    weak_etag = weak.header("ETag")
    assert weak_etag is not None and re.fullmatch(r'W/"[0-9a-f]{16}"', weak_etag)
    assert weak.header("Last-Modified") is None

    lastmod = await fetch(site.url("/lastmod"))
    assert lastmod.header("ETag") is None
    assert lastmod.header("Last-Modified") == "Tue, 14 Nov 2023 22:13:20 GMT"

    none = await fetch(site.url("/none"))
    assert none.status == 200
    assert none.header("ETag") is None and none.header("Last-Modified") is None

    stuck = await fetch(site.url("/stuck"))
    assert stuck.header("ETag") == '"stuck"'
    assert stuck.header("Last-Modified") == http_date(BASE_EPOCH)

    head = await fetch(site.url("/strong"), "HEAD")
    assert head.status == 200 and head.body == b""
    assert head.header("ETag") == etag
    # Agent hides Content-Length of HEAD responses; check it with urllib.
    req = urllib.request.Request(site.url("/strong"), method="HEAD")

    def head_length() -> str | None:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.headers["Content-Length"]

    assert await deferToThread(head_length) == str(len(strong.body))
    assert site.requests_for("/strong")[-1].body_bytes == 0


@pytest_twisted.ensureDeferred
async def test_conditional_requests(site: LoopbackSite) -> None:
    etag = site.etag("/strong")
    assert etag is not None
    r = await fetch(site.url("/strong"), If_None_Match=etag)
    assert r.status == 304 and r.body == b""
    # A 304 carries the validators a 200 would (RFC 9110 §15.4.5).
    assert r.header("ETag") == etag
    assert r.header("Last-Modified") == http_date(BASE_EPOCH)

    # Weak comparison in both directions, and lists.
    r = await fetch(site.url("/strong"), If_None_Match="W/" + etag)
    assert r.status == 304
    weak = site.etag("/weak")
    assert weak is not None
    r = await fetch(site.url("/weak"), If_None_Match=f'"nope", {weak.removeprefix("W/")}')
    assert r.status == 304
    r = await fetch(site.url("/weak"), If_None_Match='"nope"')
    assert r.status == 200 and r.body == site.body("/weak")

    # If-None-Match present => If-Modified-Since ignored (RFC 9110 §13.1.3).
    r = await fetch(
        site.url("/strong"), If_None_Match='"other"', If_Modified_Since=http_date(BASE_EPOCH)
    )
    assert r.status == 200

    lm = site.last_modified("/lastmod")
    assert lm is not None
    r = await fetch(site.url("/lastmod"), If_Modified_Since=lm)
    assert r.status == 304 and r.header("Last-Modified") == lm
    r = await fetch(site.url("/lastmod"), If_Modified_Since=http_date(BASE_EPOCH - 1))
    assert r.status == 200
    r = await fetch(site.url("/lastmod"), If_Modified_Since="garbage")
    assert r.status == 200
    r = await fetch(site.url("/lastmod"), If_None_Match="*")
    assert r.status == 304

    # "none" never answers 304.
    for hdrs in ({"If_None_Match": "*"}, {"If_Modified_Since": http_date(BASE_EPOCH + 10**6)}):
        r = await fetch(site.url("/none"), **hdrs)
        assert r.status == 200 and r.body == site.body("/none")

    assert site.count(status=304) == 5
    assert site.count(status=304, path_prefix="/lastmod") == 2


@pytest_twisted.ensureDeferred
async def test_change_updates_body_and_validators(site: LoopbackSite) -> None:
    before = await fetch(site.url("/strong"))
    old_etag = before.header("ETag")
    assert old_etag is not None
    site.change("/strong")
    after = await fetch(site.url("/strong"), If_None_Match=old_etag)
    assert after.status == 200
    assert after.body != before.body and b"<title>Page strong v1</title>" in after.body
    assert after.header("ETag") != old_etag
    assert after.header("Last-Modified") == http_date(BASE_EPOCH + 3600)

    lm = site.last_modified("/lastmod")
    assert lm is not None
    site.change("/lastmod")
    r = await fetch(site.url("/lastmod"), If_Modified_Since=lm)
    assert r.status == 200 and r.header("Last-Modified") == http_date(BASE_EPOCH + 3600)

    # "stuck": content changes, validators do not, and the server still 304s.
    old = await fetch(site.url("/stuck"))
    site.change("/stuck")
    new = await fetch(site.url("/stuck"))
    assert new.body != old.body
    assert new.header("ETag") == old.header("ETag") == '"stuck"'
    assert new.header("Last-Modified") == old.header("Last-Modified")
    r = await fetch(site.url("/stuck"), If_None_Match='"stuck"')
    assert r.status == 304
    r = await fetch(site.url("/stuck"), If_Modified_Since=http_date(BASE_EPOCH))
    assert r.status == 304


@pytest_twisted.ensureDeferred
async def test_robots_and_sitemaps() -> None:
    s = LoopbackSite.generated(5, kinds=("strong", "none", "stuck"))
    base = s.start()
    try:
        s.change("/p/0004")
        robots = await fetch(base + "/robots.txt")
        expected = f"User-agent: *\nAllow: /\n\nSitemap: {base}/sitemap_index.xml\n"
        assert robots.body.decode() == expected
        s.robots_txt = "User-agent: *\nDisallow: /p/0001\n"
        assert (await fetch(base + "/robots.txt")).body == b"User-agent: *\nDisallow: /p/0001\n"

        full = (await fetch(base + "/sitemap.xml")).body.decode()
        locs = re.findall(r"<loc>(.*?)</loc>", full)
        assert locs == [f"{base}/p/{i:04d}" for i in range(5)]
        lastmods = re.findall(r"<lastmod>(.*?)</lastmod>", full)
        assert lastmods[0] == "2023-11-14T22:13:20+00:00"
        assert lastmods[4] == "2023-11-14T23:13:20+00:00"

        index = await fetch(base + "/sitemap_index.xml")
        assert "<sitemapindex" in index.body.decode()
        children = re.findall(r"<loc>(.*?)</loc>", index.body.decode())
        assert children == [f"{base}/sitemap-1.xml", f"{base}/sitemap-2.xml.gz"]

        first = await fetch(children[0])
        assert re.findall(r"<loc>(.*?)</loc>", first.body.decode()) == locs[:3]
        second = await fetch(children[1])
        assert second.header("Content-Type") == "application/gzip"
        assert second.header("Content-Encoding") is None
        xml = gzip.decompress(second.body).decode()
        assert "<urlset" in xml
        assert re.findall(r"<loc>(.*?)</loc>", xml) == locs[3:]
        assert s.body_bytes(path_prefix="/sitemap-2") == len(second.body)
    finally:
        await s.stop()


async def _sitemap_dates(base: str) -> tuple[list[str], list[str], list[str]]:
    """The ``<lastmod>`` values of the index, sitemap-1 and sitemap-2."""
    index = (await fetch(base + "/sitemap_index.xml")).body.decode()
    first = (await fetch(base + "/sitemap-1.xml")).body.decode()
    second = gzip.decompress((await fetch(base + "/sitemap-2.xml.gz")).body).decode()
    return tuple(re.findall(r"<lastmod>(.*?)</lastmod>", x)  # type: ignore[return-value]
                 for x in (index, first, second))


@pytest_twisted.ensureDeferred
async def test_sitemap_lastmod_modes() -> None:
    s = LoopbackSite.generated(4, kinds=("strong",))
    base = s.start()
    try:
        s.change("/p/0000")
        s.change("/p/0003")
        s.change("/p/0003")
        v0, v1, v2 = (w3c_datetime(BASE_EPOCH + n * VERSION_STEP) for n in range(3))
        # honest (the default): each page's version date; the index the latest.
        assert s.sitemap_lastmods == "honest"
        assert await _sitemap_dates(base) == ([v1, v2], [v1, v0], [v0, v2])
        # stale: the first version's date whatever the version, index included.
        r = await fetch(base + "/__site__/lastmods?mode=stale", "POST")
        assert json.loads(r.body) == {"mode": "stale"} and s.sitemap_lastmods == "stale"
        assert await _sitemap_dates(base) == ([v0, v0], [v0, v0], [v0, v0])
        # none: no <lastmod> anywhere, the <loc>s unchanged.
        s.set_sitemap_lastmods("none")
        assert await _sitemap_dates(base) == ([], [], [])
        index = (await fetch(base + "/sitemap_index.xml")).body.decode()
        assert re.findall(r"<loc>(.*?)</loc>", index) == [
            f"{base}/sitemap-1.xml", f"{base}/sitemap-2.xml.gz"]
        assert "<loc>" in (await fetch(base + "/sitemap-1.xml")).body.decode()
        r = await fetch(base + "/__site__/lastmods?mode=sometimes", "POST")
        assert r.status == 400 and s.sitemap_lastmods == "none"
        with pytest.raises(ValueError, match="lastmod mode"):
            s.set_sitemap_lastmods("sometimes")
    finally:
        await s.stop()


@pytest_twisted.ensureDeferred
async def test_list_etags() -> None:
    s = LoopbackSite.generated(4, kinds=("strong",))
    base = s.start()
    try:
        # Off by default: no ETag, never a 304.
        plain = await fetch(base + "/sitemap-1.xml")
        assert plain.header("ETag") is None
        assert (await fetch(base + "/sitemap-1.xml", If_None_Match="*")).status == 200
        s.list_etags = True
        for path in ("/robots.txt", "/sitemap.xml", "/sitemap_index.xml", "/sitemap-1.xml",
                     "/sitemap-2.xml.gz"):
            full = await fetch(base + path)
            etag = full.header("ETag")
            assert etag is not None and re.fullmatch(r'"[0-9a-f]{16}"', etag), path
            again = await fetch(base + path, If_None_Match=etag)
            assert (again.status, again.body, again.header("ETag")) == (304, b"", etag)
            assert (await fetch(base + path, If_None_Match='"other"')).status == 200
        assert s.log[-1].body_bytes > 0 and s.log[-2].body_bytes == 0
        # A changed page changes its sitemap's (and the index's) body and ETag,
        # not the other sitemap's.
        tags = {p: (await fetch(base + p)).header("ETag")
                for p in ("/sitemap_index.xml", "/sitemap-1.xml", "/sitemap-2.xml.gz")}
        s.change("/p/0000")
        assert (await fetch(base + "/sitemap-1.xml", If_None_Match=tags["/sitemap-1.xml"])
                ).status == 200
        assert (await fetch(base + "/sitemap_index.xml",
                            If_None_Match=tags["/sitemap_index.xml"])).status == 200
        assert (await fetch(base + "/sitemap-2.xml.gz",
                            If_None_Match=tags["/sitemap-2.xml.gz"])).status == 304
        # Stale lastmods: a change leaves the sitemaps' bytes, so their ETags, alone.
        s.set_sitemap_lastmods("stale")
        tag = (await fetch(base + "/sitemap-1.xml")).header("ETag")
        s.change("/p/0001")
        assert (await fetch(base + "/sitemap-1.xml", If_None_Match=tag)).status == 304
        assert (await fetch(base + "/missing", If_None_Match="*")).status == 404
    finally:
        await s.stop()


@pytest_twisted.ensureDeferred
async def test_docs_layout_cache_control_and_pages_from_files(tmp_path: Path) -> None:
    """Documentation-structured pages of the size asked, Cache-Control on
    pages, and a site serving a directory's HTML files as its pages."""
    with pytest.raises(ValueError, match="plain layout"):
        Page("/n", "noisy", layout="docs")
    s = LoopbackSite.generated(3, kinds=("strong",), page_size=50_000, layout="docs")
    base = s.start()
    try:
        first = await fetch(base + "/p/0001")
        assert first.status == 200 and first.header("Cache-Control") is None
        assert 50_000 <= len(first.body) < 60_000
        assert first.body == s.body("/p/0001")  # deterministic
        for marker in (b'<div class="body" role="main">', b'<div class="highlight">',
                       b"<script>", b"<style>", b'class="sphinxsidebar"', b"<table"):
            assert marker in first.body, marker
        s.cache_control = "max-age=0"
        again = await fetch(base + "/p/0001", If_None_Match=first.header("ETag") or "")
        assert (again.status, again.header("Cache-Control")) == (304, "max-age=0")
        s.change("/p/0001")
        changed = await fetch(base + "/p/0001")
        assert changed.header("Cache-Control") == "max-age=0"
        assert b"Revision 1" in changed.body and changed.body != first.body
    finally:
        await s.stop()

    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "b.html").write_bytes(b"<html><body><p>b</p></body></html>")
    (tmp_path / "a.html").write_bytes(b"<html><body><p>a</p></body></html>")
    (tmp_path / "notes.txt").write_bytes(b"not a page")
    s = LoopbackSite.from_directory(tmp_path, kinds=("strong", "lastmod"))
    base = s.start()
    try:
        assert [(p.path, p.kind) for p in s.pages] == [
            ("/p/a.html", "strong"), ("/p/library/b.html", "lastmod")]
        page = await fetch(base + "/p/library/b.html")
        assert page.body == b"<html><body><p>b</p></body></html>"
        sitemap = (await fetch(base + "/sitemap.xml")).body
        assert sitemap.count(b"<loc>") == 2 and b"/p/library/b.html" in sitemap
        s.change("/p/a.html")
        assert (await fetch(base + "/p/a.html")).body == (
            b"<html><body><p>a</p><p>Revision 1</p></body></html>")
    finally:
        await s.stop()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no"):
        LoopbackSite.from_directory(tmp_path / "empty")


@pytest_twisted.ensureDeferred
async def test_redirect_and_404(site: LoopbackSite) -> None:
    site.add_redirect("/old", "/strong")
    site.add_redirect("/temp", "/weak", status=302)
    r = await fetch(site.url("/old"))
    assert r.status == 301 and r.body == b""
    assert r.header("Location") == site.url("/strong")
    r = await fetch(site.url("/temp?x=1"))
    assert r.status == 302 and r.header("Location") == site.base_url + "/weak"
    r = await fetch(site.url("/missing"))
    assert r.status == 404 and r.body
    r = await fetch(site.url("/strong"), "POST")
    assert r.status == 405 and r.header("Allow") == "GET, HEAD"
    assert [x.status for x in site.log] == [301, 302, 404, 405]
    assert site.log[1].path == "/temp?x=1"
    assert site.requests_for("/temp")[0].status == 302
    assert site.requests_for("/temp?x=2") == []


@pytest_twisted.ensureDeferred
async def test_log_records(site: LoopbackSite) -> None:
    etag = site.etag("/strong")
    assert etag is not None
    full = await fetch(site.url("/strong"), User_Agent="tester/1")
    await fetch(site.url("/strong"), If_None_Match=etag, If_Modified_Since=http_date(BASE_EPOCH))
    assert len(site.log) == 2
    first, second = site.log
    assert isinstance(first, RequestRecord)
    assert (first.method, first.path, first.status) == ("GET", "/strong", 200)
    assert first.body_bytes == len(full.body)
    assert first.if_none_match is None and first.if_modified_since is None
    assert first.headers["user-agent"] == "tester/1"
    assert first.started <= first.finished <= second.started <= second.finished
    assert second.status == 304 and second.body_bytes == 0
    assert second.if_none_match == etag
    assert second.if_modified_since == http_date(BASE_EPOCH)
    assert second.headers["if-none-match"] == etag
    assert site.count() == 2 and site.count(status=200) == 1
    assert site.count(method="get", path_prefix="/str") == 2
    assert site.body_bytes() == len(full.body)
    site.reset_log()
    assert site.log == [] and site.count() == 0


@pytest_twisted.ensureDeferred
async def test_control_endpoints() -> None:
    s = LoopbackSite.generated(20, page_size=1000)
    base = s.start()
    try:
        await fetch(base + "/p/0000")
        await fetch(base + "/nothing")
        log = await fetch(base + "/__site__/log")
        assert log.status == 200
        records = json.loads(log.body)
        assert [(r["path"], r["status"]) for r in records] == [("/p/0000", 200), ("/nothing", 404)]
        assert set(records[0]) == set(RequestRecord.__dataclass_fields__)

        r = await fetch(base + "/__site__/change?path=/p/0001", "POST")
        assert json.loads(r.body) == ["/p/0001"] and s.page("/p/0001").version == 1
        r = await fetch(base + "/__site__/change?fraction=0.1&seed=3", "POST")
        changed = json.loads(r.body)
        assert changed == LoopbackSite.generated(20).change_fraction(0.1, seed=3)
        assert len(changed) == 2
        r = await fetch(base + "/__site__/change?path=/nope", "POST")
        assert r.status == 404
        # Hundreds of paths in one call: a form body (a query that long
        # would not fit in a request line).
        many = [f"/p/{i:04d}" for i in range(20)] * 30
        before = {p: s.page(p).version for p in many}
        r = await deferToThread(_post_form, base + "/__site__/change",
                                "&".join(f"path={p}" for p in many))
        assert r == many
        assert all(s.page(p).version == v + 30 for p, v in before.items())
        r = await fetch(base + "/__site__/change", "GET")
        assert r.status == 405

        r = await fetch(base + "/__site__/reset", "POST")
        assert r.status == 200
        # Control requests are never logged.
        assert s.log == []
        assert json.loads((await fetch(base + "/__site__/log")).body) == []
    finally:
        await s.stop()


def _post_form(url: str, body: str) -> object:
    """POST an ``application/x-www-form-urlencoded`` body; the JSON answer."""
    req = urllib.request.Request(
        url, data=body.encode(), method="POST",
        headers={"Content-Type": "application/x-www-form-urlencoded"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=10) as resp:
        return json.load(resp)


@pytest_twisted.ensureDeferred
async def test_stop_closes_keepalive_connections() -> None:
    from twisted.internet import reactor
    from twisted.web.client import HTTPConnectionPool

    s = LoopbackSite.generated(2, page_size=500)
    base = s.start()
    pool = HTTPConnectionPool(reactor, persistent=True)
    try:
        agent = Agent(reactor, pool=pool)
        await read_body(await agent.request(b"GET", (base + "/p/0000").encode()))
        assert s._site is not None and len(s._site.channels) == 1
        site_factory = s._site
        await s.stop()
        assert not site_factory.channels
        await s.stop()  # idempotent
    finally:
        await pool.closeCachedConnections()


# -- CLI -----------------------------------------------------------------------


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise TimeoutError("no base URL line from the site process")
    return proc.stdout.readline()


def test_cli_subprocess() -> None:
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.site", "--pages", "6",
         "--page-size", "2000", "--kinds", "strong,lastmod",
         "--sitemap-lastmods", "none", "--list-etags"],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = _readline(proc, timeout=15)
        base = line.strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", base), line
        with urllib.request.urlopen(base + "/p/0001", timeout=5) as resp:
            assert resp.status == 200
            assert resp.headers["Last-Modified"] == http_date(BASE_EPOCH)
            assert resp.headers["ETag"] is None
            body = resp.read()
        assert b"<title>Page p/0001 v0</title>" in body
        req = urllib.request.Request(base + "/__site__/change?path=/p/0001", method="POST")
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert json.load(resp) == ["/p/0001"]
        with urllib.request.urlopen(base + "/__site__/log", timeout=5) as resp:
            records = json.load(resp)
        assert [(r["path"], r["status"], r["body_bytes"]) for r in records] == [
            ("/p/0001", 200, len(body))
        ]
        with urllib.request.urlopen(base + "/sitemap-1.xml", timeout=5) as resp:
            assert re.fullmatch(r'"[0-9a-f]{16}"', resp.headers["ETag"])
            assert b"<loc>" in resp.read()
        with urllib.request.urlopen(base + "/sitemap-1.xml", timeout=5) as resp:
            assert b"<lastmod>" not in resp.read()
    finally:
        proc.terminate()
        try:
            rc = proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            assert proc.stdout is not None
            rest = proc.stdout.read()
            proc.stdout.close()
    assert rc == 0
    assert rest == ""  # exactly one line on stdout
