"""``scrapy items``: stored items and their history, through the feed exporters.

The command runs through Scrapy's command line, in the project
(:func:`tests.scrapy_cli.scrapy_in_process`), against a store written by
real crawls of the loopback test site (the crawls' clock moved to known
times), or by item versions staged with exact ``stored_at`` times
where a boundary needs them to the second. What it wrote is parsed back.
"""

from __future__ import annotations

import csv
import io
import json
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

import pytest
import pytest_twisted
from scrapy.utils.defer import deferred_from_coro
from twisted.internet.threads import deferToThread

from incremental_crawler import clock
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from incremental_crawler.state.records import Change, ItemRecord
from tests.scrapy_cli import scrapy_in_process
from tests.spiders import ListSpider, SharedScopeSpider

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

    from incremental_crawler.state.stores import StateStore

DAY = 86400
BOTH_STORES = pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)


async def items(state_uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``scrapy items ARGS`` on the store at *state_uri*, in a thread (the reactor runs on)."""
    return await deferToThread(scrapy_in_process, "items", *args,
                               "-s", f"INCREMENTAL_STATE_URI={state_uri}")


async def exported(state_uri: str, *args: str) -> list[dict[str, Any]]:
    """The records ``scrapy items -o - ARGS`` writes (JSON lines on stdout)."""
    result = await items(state_uri, "-o", "-", *args)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


async def exported_each(state_uri: str, *runs: tuple[str, ...]) -> list[list[dict[str, Any]]]:
    """:func:`exported` for each argument list, one after the other."""
    return [await exported(state_uri, *args) for args in runs]


def iso(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# -- real crawls -------------------------------------------------------------

@BOTH_STORES
@pytest_twisted.ensureDeferred
async def test_since_exports_what_the_later_crawl_stored_and_all_versions_the_history(
    site, crawl, state_uri, monkeypatch,
):
    for i in range(4):
        site.add_page(f"/p/{i}", "strong", size=1500)
    sitemap = site.url("/sitemap.xml")
    first = float(int(time.time()))
    second = first + DAY
    monkeypatch.setattr(clock, "now", lambda: first)
    await crawl(SitemapPagesSpider, sitemap_url=sitemap)
    site.change("/p/2")
    monkeypatch.setattr(clock, "now", lambda: second)
    await crawl(SitemapPagesSpider, sitemap_url=sitemap)
    urls = [site.url(f"/p/{i}") for i in range(4)]

    (since_then, since_second, since_after, all_since_then, history, since_before,
     latest) = await exported_each(
        state_uri,
        ("--since", iso(first + DAY / 2)), ("--since", iso(second)), ("--since", iso(second + 1)),
        ("--since", iso(first + 1), "--all-versions"), ("--all-versions",),
        ("--since", iso(first - 1)), ())
    assert [(r["url"], r["title"], r["version"], r["stored_at"]) for r in since_then] == [
        (urls[2], "Page p/2 v1", 2, iso(second))]
    # At the second it was stored: included; a second later: not.
    assert since_second == since_then
    assert since_after == []
    # Only one version was stored since then: --all-versions finds no other.
    assert all_since_then == since_then

    assert [(r["url"], r["version"], r["stored_at"]) for r in history] == [
        *((url, 1, iso(first)) for url in urls), (urls[2], 2, iso(second))]
    assert [r["title"] for r in history if r["url"] == urls[2]] == ["Page p/2 v0", "Page p/2 v1"]
    assert [r["change"] for r in history] == ["new"] * 4 + ["changed"]
    # The latest of each item since a time before either crawl: new to a
    # reader that had nothing then, though p/2 changed since.
    assert [(r["url"], r["version"], r["change"]) for r in since_before] == [
        *((url, 1, "new") for url in urls if url != urls[2]), (urls[2], 2, "new")]

    # Without the options: the latest live items, as before.
    assert sorted(r["url"] for r in latest) == urls
    assert {r["url"]: r["title"] for r in latest}[urls[2]] == "Page p/2 v1"
    assert not any("stored_at" in r or "version" in r for r in latest)


@pytest_twisted.ensureDeferred
async def test_spider_limits_to_the_scope_the_spider_crawls_in(site, crawl, state_uri):
    site.add_page("/a", "strong", size=1500)
    site.add_page("/b", "strong", size=1500)
    await crawl(ListSpider, urls=[site.url("/a")])
    await crawl(SharedScopeSpider, urls=[site.url("/b")])
    spiders = ("-s", "SPIDER_MODULES=tests.spiders")
    scoped, scoped_all, plain, scope, nobody = (
        [r["url"] for r in records] for records in await exported_each(
            state_uri,
            (*spiders, "--spider", "scoped"), (*spiders, "--spider", "scoped", "--all-versions"),
            (*spiders, "--spider", "list"), (*spiders, "--spider", "shared"),
            (*spiders, "--spider", "nobody")))

    # "scoped" is a spider of the project: its incremental_scope, "shared".
    assert scoped == [site.url("/b")]
    assert scoped_all == [site.url("/b")]
    # "list" is a spider without one: its name.
    assert plain == [site.url("/a")]
    # Not a spider: a scope.
    assert scope == [site.url("/b")]
    assert nobody == []


# -- staged versions, exact times ----------------------------------------------

A, B, C, D = (f"https://example.com/{name}" for name in "abcd")


def item(url: str, title: str, **extra: Any) -> str:
    return json.dumps({"url": url, "title": title, **extra})


#: Staged in the order they were stored; C is gone on December 1st.
HISTORY = [
    ItemRecord("news", A, A, "a1", item(A, "A one"), at("2026-11-29T10:00:00+00:00")),
    ItemRecord("news", C, C, "c1", item(C, "C one"), at("2026-11-29T12:00:00+00:00")),
    ItemRecord("news", B, B, "b1", item(B, "B one"), at("2026-11-29T23:59:59+00:00")),
    ItemRecord("news", A, A, "a2", item(A, "A two"), at("2026-11-30T00:00:00+00:00"),
               change=Change.CHANGED),
    ItemRecord("blog", D, D, "d1", item(D, "D one"), at("2026-11-30T06:00:00+00:00")),
    ItemRecord("news", C, C, "", json.dumps({"url": C, "gone": True, "status": 410}),
               at("2026-12-01T08:00:00+00:00"), change=Change.DELETED),
]


async def stage_history(store: StateStore) -> None:
    for record in HISTORY:
        store.stage_item(record)
    # Driven as Scrapy drives a store's coroutines (Redis awaits asyncio I/O).
    await deferred_from_coro(store.flush())


def summary(records: list[dict[str, Any]], change: str = "change") -> list[tuple[Any, ...]]:
    return [(r["url"], r[change], r["stored_at"], r["version"]) for r in records]


@BOTH_STORES
@pytest_twisted.ensureDeferred
async def test_since_and_all_versions_export_exactly_the_versions_stored_since(
    state_store, state_uri,
):
    await stage_history(state_store)
    a2 = (A, "changed", "2026-11-30T00:00:00Z", 2)
    d1 = (D, "new", "2026-11-30T06:00:00Z", 1)
    c2 = (C, "deleted", "2026-12-01T08:00:00Z", 2)

    since, zoned, second_after, second_before, history, news, latest = await exported_each(
        state_uri,
        ("--since", "2026-11-30"),  # midnight UTC
        ("--since", "2026-11-30T01:00:00+01:00"), ("--since", "2026-11-30T00:00:01Z"),
        ("--since", "2026-11-29T23:59:59Z"), ("--all-versions",),
        ("--all-versions", "--since", "2026-11-30", "--spider", "news"), ())
    assert summary(since) == [a2, d1, c2]
    assert since[0]["title"] == "A two"
    assert since[2] == {"url": C, "gone": True, "status": 410, "change": "deleted",
                        "stored_at": "2026-12-01T08:00:00Z", "version": 2}
    # A zone offset is honoured: 01:00 at +01:00 is midnight UTC.
    assert zoned == since
    assert summary(second_after) == [d1, c2]
    # B's one version was stored a second before midnight, C's first the day before.
    assert summary(second_before) == [
        (B, "new", "2026-11-29T23:59:59Z", 1), a2, d1, c2]

    assert summary(history) == [
        (A, "new", "2026-11-29T10:00:00Z", 1),
        (C, "new", "2026-11-29T12:00:00Z", 1),
        (B, "new", "2026-11-29T23:59:59Z", 1),
        a2, d1, c2,
    ]
    assert summary(news) == [a2, c2]
    # The latest live items, as without the options (by scope): C is gone.
    assert [(r["url"], r["title"], r["fingerprint"]) for r in latest] == [
        (D, "D one", "d1"), (A, "A two", "a2"), (B, "B one", "b1")]


@pytest_twisted.ensureDeferred
async def test_the_change_type_goes_under_the_configured_change_field(state_store, state_uri):
    await stage_history(state_store)
    renamed, off = await exported_each(
        state_uri, ("--since", "2026-12-01", "-s", "INCREMENTAL_CHANGE_FIELD=kind"),
        ("--since", "2026-12-01", "-s", "INCREMENTAL_CHANGE_FIELD=none"))
    assert summary(renamed, change="kind") == [(C, "deleted", "2026-12-01T08:00:00Z", 2)]
    assert "change" not in renamed[0]
    # Switched off for items, a version read back still says what it is.
    assert summary(off) == summary(renamed, change="kind")


# -- formats -----------------------------------------------------------------

def normalized(records: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Records as text, as CSV and XML keep them; a field CSV leaves empty is absent."""
    return [{name: str(value) for name, value in record.items() if value != ""}
            for record in records]


def parse(path: Path, fmt: str) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if fmt == "jsonl":
        return [json.loads(line) for line in text.splitlines()]
    if fmt == "json":
        return json.loads(text)
    if fmt == "csv":
        return list(csv.DictReader(io.StringIO(text, newline="")))
    root = ElementTree.fromstring(text.encode())
    assert root.tag == "items"
    return [{field.tag: field.text or "" for field in element} for element in root]


@pytest_twisted.ensureDeferred
async def test_each_format_holds_the_same_records(state_store, state_uri, tmp_path):
    await stage_history(state_store)
    outputs = {fmt: tmp_path / f"history.{fmt}" for fmt in ("jsonl", "json", "csv", "xml")}
    # -t forces a format, whatever the extension says.
    forced = tmp_path / "history.txt"
    runs = [("-o", "-"), *(("-o", str(path)) for path in outputs.values()),
            ("-t", "xml", "-o", str(forced))]
    to_stdout, *to_files, to_forced = [await items(state_uri, "--all-versions", *args)
                                       for args in runs]
    assert to_stdout.returncode == 0, to_stdout.stderr
    expected = [json.loads(line) for line in to_stdout.stdout.splitlines()]
    assert len(expected) == len(HISTORY)
    for (fmt, path), result in zip(outputs.items(), to_files, strict=True):
        assert result.returncode == 0, result.stderr
        assert f"6 item versions written to {path} ({fmt})" in result.stderr
        # The tombstone's own fields (gone, status) are kept in CSV too,
        # though the first record has none of them.
        assert normalized(parse(path, fmt)) == normalized(expected), fmt
    assert parse(outputs["jsonl"], "jsonl") == expected
    assert parse(outputs["json"], "json") == expected
    header = outputs["csv"].read_text().splitlines()[0]
    assert header == "url,title,change,stored_at,version,gone,status"
    assert to_forced.returncode == 0, to_forced.stderr
    assert normalized(parse(forced, "xml")) == normalized(expected)


@pytest_twisted.ensureDeferred
async def test_the_default_export_honours_feed_export_fields_and_indent(
    state_store, state_uri, tmp_path,
):
    await stage_history(state_store)
    out = tmp_path / "items.json"
    result = await items(state_uri, "-o", str(out), "-s", "FEED_EXPORT_FIELDS=title,url",
                   "-s", "FEED_EXPORT_INDENT=2")
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert text.startswith('[\n{\n  "title": "D one",\n  "url": ')
    assert json.loads(text) == [{"title": t, "url": u}
                                for u, t in ((D, "D one"), (A, "A two"), (B, "B one"))]


# -- errors ------------------------------------------------------------------

@pytest.mark.parametrize("when", ["yesterday", "2026-11-31", "1733000000"])
@pytest_twisted.ensureDeferred
async def test_a_since_that_is_not_iso_8601_is_a_usage_error(
    state_store, state_uri, tmp_path, when,
):
    await stage_history(state_store)
    out = tmp_path / "out.jsonl"
    result = await items(state_uri, "-o", str(out), "--since", when)
    assert result.returncode == 2
    assert f"--since {when!r} is not an ISO 8601 date or time" in result.stderr
    assert not out.exists()


@pytest_twisted.ensureDeferred
async def test_an_unknown_format_is_a_usage_error(state_store, state_uri, tmp_path):
    await stage_history(state_store)
    unknown_extension = await items(state_uri, "-o", str(tmp_path / "out.txt"))
    unknown_type = await items(state_uri, "-o", "-", "-t", "yaml")
    result = unknown_extension
    assert result.returncode == 2
    assert "cannot tell the format of" in result.stderr and "-t FORMAT" in result.stderr
    result = unknown_type
    assert result.returncode == 2
    assert "-t yaml: unknown format" in result.stderr


@pytest.mark.parametrize("where", ["missing-dir/out.jsonl", "a-dir.jsonl"])
@pytest_twisted.ensureDeferred
async def test_an_output_that_cannot_be_written_is_one_line_and_exit_1(
    state_store, state_uri, tmp_path, where,
):
    await stage_history(state_store)
    path = tmp_path / where
    if where == "a-dir.jsonl":
        path.mkdir()
    result = await items(state_uri, "--all-versions", "-o", str(path))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: cannot write {path}: "
        + ("Is a directory" if path.is_dir() else "No such file or directory")]


@pytest_twisted.ensureDeferred
async def test_a_csv_header_and_its_rows_come_from_one_read_of_the_store(tmp_path):
    """A crawl's flush between the header pass and the writing pass must
    not add a row with fields the header lacks: the records are read once."""
    from scrapy.exporters import CsvItemExporter
    from scrapy.settings import Settings

    from incremental_crawler.commands.items import Command, _versions
    from incremental_crawler.state.stores.sqlite import SQLiteStateStore

    path = tmp_path / "state.db"
    crawl, reader = SQLiteStateStore(path), SQLiteStateStore(path)
    crawl.stage_item(ItemRecord("s", "a", "a", "fp", json.dumps({"url": "a", "title": "A"}),
                                stored_at=100))
    crawl.flush_now()
    reads = 0

    def records() -> Any:
        nonlocal reads
        reads += 1
        if reads == 2:  # a second read would find what a crawl stored meanwhile
            crawl.stage_item(ItemRecord("s", "b", "b", "fp", json.dumps(
                {"url": "b", "title": "B", "price": "9.99"}), stored_at=101))
            crawl.flush_now()
        return _versions(reader, None, None, True, "change")

    out = tmp_path / "out.csv"
    command = Command()
    assert command._export(records, str(out), CsvItemExporter, Settings(), "csv") == 1
    assert reads == 1
    rows = list(csv.DictReader(io.StringIO(out.read_text(), newline="")))
    assert rows == [{"url": "a", "title": "A", "change": "new",
                     "stored_at": "1970-01-01T00:01:40Z", "version": "1"}]
    for store in (crawl, reader):
        await deferred_from_coro(store.close())
