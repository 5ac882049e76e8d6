"""The HTML and JSON crawl report (INCREMENTAL_REPORT_DIR) and ``scrapy report``.

Real crawls of the loopback site; the page is opened in headless Chromium
(Debian's ``chromium`` and ``chromedriver``, driven by Selenium), which must
draw every chart with no console error. Skipped only where Chromium is not
installed.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import tempfile
import time
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
from scrapy.settings import Settings
from twisted.internet.threads import deferToThread

from incremental_crawler.report.files import ReportFiles
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from incremental_crawler.state.records import ItemRecord
from incremental_crawler.state.stores import open_store
from tests.scrapy_cli import PROJECT, child_env, run_scrapy, scrapy_in_process
from tests.site import VALIDATED_KINDS

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

DOCS = PROJECT / "docs" / "report.md"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
#: Chromium's flags on a machine without a display, a GPU or a network.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1280,1000")
#: What the browser tests miss, named, and Debian's package of each.
MISSING_BROWSER = {name: package for name, package, path in (
    ("chromium", "chromium", CHROMIUM), ("chromedriver", "chromium-driver", CHROMEDRIVER),
) if path is None}
needs_chromium = pytest.mark.skipif(
    bool(MISSING_BROWSER),
    reason=f"{' and '.join(MISSING_BROWSER)} not installed (Debian: apt-get install "
           f"{' '.join(MISSING_BROWSER.values())}; .ci/run installs them)")

POLITE = {"INCREMENTAL_THROTTLE_ENABLED": True, "CONCURRENT_REQUESTS": 16,
          "CONCURRENT_REQUESTS_PER_DOMAIN": 16, "INCREMENTAL_THROTTLE_MAX_RATE": 100}


def page_log(site) -> list[Any]:
    return [r for r in site.log if r.path.startswith("/p/")]


# -- the browser ----------------------------------------------------------------------


class Browser:
    """Headless Chromium through Selenium, with the browser's console log."""

    def __init__(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service

        options = Options()
        options.binary_location = CHROMIUM or ""
        self.profile = tempfile.mkdtemp(prefix="report-test-chromium-")
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={self.profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        # The Debian driver, named: Selenium Manager would try to download one.
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)

    def open(self, path: Path, section: str = "") -> int:
        """Load *path* (at its *section*, a crawl's) and wait (at most 30 s)
        until every chart of the crawl shown is drawn; how many."""
        # A fresh load each time, as from a link or the address bar (the same
        # page at another section would only be scrolled).
        self.driver.get("about:blank")
        self.driver.get(path.as_uri() + (f"#{section}" if section else ""))
        return self.rendered()

    def rendered(self) -> int:
        """Wait (at most 30 s) until the charts of the crawl shown are drawn; how many."""
        for _ in range(300):
            rendered = self.driver.execute_script(
                "return document.body && document.body.getAttribute('data-charts-rendered')")
            if rendered is not None:
                return int(rendered)
            time.sleep(0.1)
        pytest.fail(f"{self.driver.current_url}: the charts were not drawn within 30 s")

    def js(self, script: str) -> Any:
        return self.driver.execute_script(script)

    def console(self) -> list[dict[str, Any]]:
        return self.driver.get_log("browser")

    def screenshot(self, path: Path) -> None:
        # The window's size (1280 x 1000): a full-page one costs seconds.
        self.driver.save_screenshot(str(path))

    def close(self) -> None:
        self.driver.quit()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """One headless Chromium for the module's browser tests: its start-up takes seconds."""
    browser = Browser()
    yield browser
    browser.close()


@pytest.fixture
def browser(chromium: Browser) -> Browser:
    """The module's Chromium, its console log read out: a test sees its own pages' messages."""
    chromium.console()
    return chromium


#: The charts of the crawl the page shows, by name (``slot-0``, ``history-pages``).
SHOWN = "section.crawl:not([hidden]) [data-chart={}]"


def chart_paths(browser: Browser, chart: str) -> list[str]:
    """The ``d`` of every drawn line of a chart of the crawl shown (empty ones left out)."""
    return browser.js(
        f"return Array.from(document.querySelectorAll('{SHOWN.format(chart)} path.js-line'))"
        ".map(p => p.getAttribute('d')).filter(d => d && d.length > 2);")


def host_row_cells(browser: Browser, host: str) -> list[str]:
    return browser.js(
        "const rows = Array.from(document.querySelectorAll('table tr'));"
        f"const row = rows.find(r => r.cells.length && r.cells[0].textContent === {host!r});"
        "return row ? Array.from(row.cells).map(c => c.textContent) : [];")


def check_page(browser: Browser, path: Path, shot: Path, section: str = "") -> int:
    """Open *path* (at *section*); every chart drawn, no console error; a
    screenshot; the charts' count."""
    charts = browser.open(path, section)
    assert charts == browser.js("return document.querySelectorAll('.js-plotly-plot').length")
    # Every chart has drawn SVG: its axes at least.
    assert browser.js("return Array.from(document.querySelectorAll('.js-plotly-plot'))"
                      ".every(c => c.querySelector('svg.main-svg'))")
    errors = [entry for entry in browser.console() if entry["level"] == "SEVERE"]
    assert errors == [], errors
    browser.screenshot(shot)
    assert shot.stat().st_size > 20_000
    return charts


# -- a crawl's report -------------------------------------------------------------------


@needs_chromium
@pytest_twisted.ensureDeferred
async def test_the_report_of_a_rate_limited_crawl_draws_in_chromium(site, crawl, tmp_path,
                                                                     browser):
    reports = tmp_path / "reports"
    paths = site.add_pages(30, kinds=VALIDATED_KINDS)
    limiter = site.limit(rate=20, burst=5)
    # Start above the site's budget: 429s, Retry-After freezes, back-offs.
    first = await crawl(SitemapPagesSpider, sitemap_url=site.url("/robots.txt"), settings={
        **POLITE, "INCREMENTAL_THROTTLE_START_RATE": 40, "INCREMENTAL_REPORT_DIR": str(reports)})
    first_log = page_log(site)
    first_files = set(first.get_extension(ReportFiles).written)
    site.limiter = None
    changed = {"/p/0001", "/p/0002", "/p/0004"}
    for path in changed:
        site.change(path)
    site.reset_log()
    second = await crawl(SitemapPagesSpider, sitemap_url=site.url("/robots.txt"), settings={
        **POLITE, "INCREMENTAL_REPORT_DIR": str(reports)})
    second_log = page_log(site)

    # The latest under fixed names, each crawl's JSON under its own; one
    # page (one copy of Plotly.js) for both crawls.
    names = sorted(p.name for p in reports.iterdir())
    assert "report.html" in names and "report.json" in names
    stamped = [n for n in names if re.fullmatch(r"report-\d{8}T\d{9}Z\.(html|json)", n)]
    assert len(stamped) == 2 and all(n.endswith(".json") for n in stamped), names
    assert first_files <= set(names)

    # Crawl 1's figures against what the server saw.
    stamped_first = reports / next(n for n in sorted(first_files) if n.endswith(".json")
                                   and n != "report.json")
    one = json.loads(stamped_first.read_text())
    slot = one["politeness"]["slots"]["127.0.0.1"]
    assert limiter.refused > 0 and slot["final"]["status_429"] == limiter.refused
    assert slot["status_429"][-1] == limiter.refused
    assert slot["freezes"] >= 1 and slot["frozen_spans"]
    # The reason as the site sent it, readable: "429, Retry-After: 1".
    assert all(s["end_s"] > s["start_s"] and re.fullmatch(r"429, Retry-After: \d+", s["why"])
               for s in slot["frozen_spans"]), slot["frozen_spans"]
    [host] = [h for h in one["hosts"] if h["host"] == "127.0.0.1"]
    assert host["requested_by_reason"]["new"] == len(paths) == host["new"]
    assert host["checked"] == len(first_log)
    assert one["history"][0]["figures"]["requests"] == requests(first)

    # Crawl 2: skipped by lastmod, 304s and changes, per host, as served.
    two = json.loads((reports / "report.json").read_text())
    [host] = [h for h in two["hosts"] if h["host"] == "127.0.0.1"]
    assert host["changed"] == len(changed)
    assert host["not_modified"] == sum(1 for r in second_log if r.status == 304)
    assert host["checked"] == len(second_log)
    # The sitemap listing the changed pages was read: its other pages skipped.
    assert host["skipped_lastmod"] == second.stats.get_value(
        "incremental/schedule/skipped/lastmod_unchanged") == 15 - len(second_log)
    assert host["validator_trust"] == "trusted"
    assert [entry["figures"]["requests"] for entry in two["history"]] == [
        len(second_log), len(first_log)]

    # Crawl 2: the per-host table and the history charts.
    charts = await deferToThread(check_page, browser, reports / "report.html",
                                 tmp_path / "latest.png")
    assert charts == 3  # one slot, two history charts
    cells = await deferToThread(host_row_cells, browser, "127.0.0.1")
    assert cells[2:8] == [str(host["skipped_lastmod"]), "0", str(len(second_log)),
                          str(host["not_modified"]), str(len(changed)), "0"], cells
    bars = await deferToThread(browser.js, "return document.querySelectorAll("
                               f"'{SHOWN.format('history-pages')} .bars path').length")
    assert bars >= 5  # 2 crawls x 3 series, an empty one (no 304 in crawl 1) aside
    # Crawl 1, its section of the same page: the slot chart, its lines
    # and its freezes shaded.
    charts = await deferToThread(check_page, browser, reports / "report.html",
                                 tmp_path / "rate-limited.png", stamped_first.stem)
    assert charts == 3
    assert await deferToThread(browser.js, "return document.querySelector("
                               "'section.crawl:not([hidden])').id") == stamped_first.stem
    assert len(await deferToThread(chart_paths, browser, "slot-0")) >= 4
    shaded = await deferToThread(browser.js, "return document.querySelectorAll("
                                 f"'{SHOWN.format('slot-0')} .shapelayer path').length")
    assert shaded == len(slot["frozen_spans"])
    # Its link in the page's list of kept crawls leads to it too.
    links = await deferToThread(browser.js, "return Array.from(document.querySelectorAll("
                                "'nav.crawls a')).map(a => a.getAttribute('href'))")
    assert links == [f"#{stamped[-1].removesuffix('.json')}", f"#{stamped_first.stem}"]
    # Back to crawl 2 by its link: shown, its charts drawn, crawl 1 hidden.
    # (the mark of drawn charts taken off first: the page sets it again
    # once the section it shows is drawn)
    await deferToThread(browser.js, "document.body.removeAttribute('data-charts-rendered');"
                        "document.querySelector('nav.crawls a').click()")
    assert await deferToThread(browser.rendered) == 3
    assert await deferToThread(browser.js, "return document.querySelector("
                               "'section.crawl:not([hidden])').id") == links[0][1:]
    assert len(await deferToThread(browser.js, "return document.querySelectorAll("
                                   f"'{SHOWN.format('history-pages')} .bars path')")) >= 5


#: A Retry-After a hostile site could send: markup that would break out of
#: the page's inline JSON (and an element with a script, were it parsed).
HOSTILE = "<!--<script><img src=x onerror=document.title=1>"


@needs_chromium
@pytest_twisted.ensureDeferred
async def test_a_sites_markup_in_a_freeze_reason_is_shown_as_text(site, crawl, tmp_path,
                                                                  browser):
    reports = tmp_path / "reports"
    site.add_pages(6, kinds=VALIDATED_KINDS)
    site.override("/p/0003", status=503, headers={"Retry-After": HOSTILE})
    await crawl(SitemapPagesSpider, sitemap_url=site.url("/robots.txt"), settings={
        **POLITE, "RETRY_TIMES": 0, "INCREMENTAL_THROTTLE_MAX_RETRIES": 0,
        "INCREMENTAL_REPORT_DIR": str(reports)})
    report = json.loads((reports / "report.json").read_text())
    [span] = report["politeness"]["slots"]["127.0.0.1"]["frozen_spans"]
    assert re.fullmatch(re.escape(f"503, Retry-After: {HOSTILE} (unreadable), backoff ")
                        + r"\d+\.\d s", span["why"]), span

    charts = await deferToThread(check_page, browser, reports / "report.html",
                                 tmp_path / "hostile.png")
    assert charts == 3
    # Nothing of the header became markup; the chart holds it as text.
    assert await deferToThread(browser.js, "return document.title") == (
        "Crawl report: sitemap")
    assert await deferToThread(browser.js,
                               "return document.querySelectorAll('img').length") == 0
    hover = await deferToThread(browser.js, "return document.querySelector("
                                f"'{SHOWN.format('slot-0')}').data.at(-1).text")
    assert hover == [html.escape(f"frozen {span['end_s'] - span['start_s']:.1f} s: "
                                 f"{span['why']}", quote=False)]


def requests(crawler) -> int:
    """Requests for pages the crawl counted (``incremental/requests/<reason>``)."""
    return sum(v for k, v in crawler.stats.get_stats().items()
               if k.startswith("incremental/requests/"))


# -- the JSON schema ------------------------------------------------------------------------


def documented_fields() -> dict[str, str]:
    """Path -> type of every row of the schema tables in docs/report.md."""
    text = DOCS.read_text()
    schema = text[text.index("## report.json schema"):]
    return {path: kind.strip() for path, kind in
            re.findall(r"^\| `([^`]+)` \| ([a-z ]+) \|", schema, re.MULTILINE)}


_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
          "object": dict, "array": list, "null": type(None)}


def _segment(pattern: str) -> re.Pattern[str]:
    # "<name>" stands for any key (a slot may hold dots: "127.0.0.1").
    return re.compile("".join(".+" if part.startswith("<") else re.escape(part)
                              for part in re.split(r"(<[a-z_]+>)", pattern) if part))


def _documented_path(keys: tuple[str, ...], documented: dict[str, str]) -> str | None:
    """The documented pattern the path *keys* matches (``a[]`` for an array's element)."""
    for pattern in documented:
        parts = pattern.split(".")
        if len(parts) == len(keys) and all(
                _segment(part).fullmatch(key) for part, key in zip(parts, keys, strict=True)):
            return pattern
    return None


def check_schema(report: dict[str, Any], documented: dict[str, str]) -> set[str]:
    """Every field of *report* documented with its type; the patterns met."""
    met: set[str] = set()

    def visit(value: Any, keys: tuple[str, ...]) -> None:
        # An array's objects are documented by their fields.
        if keys and not (keys[-1].endswith("[]") and isinstance(value, dict)):
            path = ".".join(keys)
            pattern = _documented_path(keys, documented)
            assert pattern is not None, f"{path} is not documented in docs/report.md"
            met.add(pattern)
            allowed = tuple(_TYPES[t.strip()] for t in documented[pattern].split(" or "))
            ok = isinstance(value, allowed) and not (
                isinstance(value, bool) and bool not in allowed)
            assert ok, f"{path}: {value!r} is not {documented[pattern]}"
        if isinstance(value, dict):
            for key, item in value.items():
                visit(item, (*keys, key))
        elif isinstance(value, list):
            for item in value:
                visit(item, (*keys[:-1], f"{keys[-1]}[]"))

    visit(report, ())
    return met


@pytest_twisted.ensureDeferred
async def test_report_json_and_scrapy_report_follow_the_documented_schema(
        site, crawl, state_uri, tmp_path):
    """Three crawls (one with a 429 and a 5xx), their JSON against the documented
    fields, INCREMENTAL_REPORT_KEEP's pruning, and ``scrapy report`` from the store."""
    reports = tmp_path / "reports"
    site.add_pages(12, kinds=VALIDATED_KINDS)
    site.override("/p/0003", status=503, headers={"Retry-After": "0"})
    settings = {**POLITE, "INCREMENTAL_THROTTLE_START_RATE": 50, "RETRY_TIMES": 0,
                "INCREMENTAL_REPORT_DIR": str(reports), "INCREMENTAL_REPORT_KEEP": 2,
                "INCREMENTAL_CRAWL_HISTORY": 2}
    crawlers = []
    for _ in range(3):
        crawlers.append(await crawl(SitemapPagesSpider, sitemap_url=site.url("/robots.txt"),
                                    settings=settings))
        site.clear_override("/p/0003")
        site.change("/p/0005")
    documented = documented_fields()
    report = json.loads((reports / "report.json").read_text())
    assert report["schema"] == "incremental-crawler-report" and report["version"] == 1
    met = check_schema(report, documented)
    # Keep 2: the third crawl's files and the second's.
    stamped = sorted(p.name for p in reports.glob("report-*.json"))
    assert len(stamped) == 2, stamped
    assert json.loads((reports / stamped[-1]).read_text()) == report
    # One page for the kept crawls, each a section of it, with one copy of
    # Plotly.js: the directory's size does not grow with the crawls kept.
    assert [p.name for p in reports.glob("*.html")] == ["report.html"]
    latest = (reports / "report.html").read_text()
    assert re.findall(r'<section class="crawl" id="([^"]+)"', latest) == [
        name.removesuffix(".json") for name in reversed(stamped)]
    assert len(re.findall(r"plotly\.js v\d", latest)) == 1
    # The store keeps 2 crawl records: the report shows them, this crawl's included.
    assert [e["figures"]["requests"] for e in report["history"]] == [
        requests(c) for c in reversed(crawlers)][:2]

    result = await deferToThread(
        run_scrapy, "report", "--scope", "sitemap", "-o", str(tmp_path / "history"),
        "-s", f"INCREMENTAL_STATE_URI={state_uri}",
        # An ASCII locale (a bare container): the page is written as UTF-8 all the same.
        env=child_env(LC_ALL="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0"))
    assert result.returncode == 0, result.stderr
    assert "scope sitemap: 2 crawls" in result.stdout
    history = json.loads((tmp_path / "history" / "history-sitemap.json").read_text())
    met |= check_schema(history, documented)
    assert history["kind"] == "history"
    assert [e["figures"] for e in history["history"]] == [
        e["figures"] for e in report["history"]]
    [stored] = history["stored_hosts"]
    # The 12 pages, the sitemap index and its two sitemaps.
    assert stored["host"] == "127.0.0.1" and stored["pages"] == 12 + 3
    page = (tmp_path / "history" / "history-sitemap.html").read_text()
    assert 'data-chart="history-pages"' in page and "Plotly" in page

    # Every scope (no --scope): one holding only an item (no crawl, no page)
    # is said and passed over; the others still get their page.
    store = open_store(Settings({"INCREMENTAL_STATE_URI": state_uri}))
    store.stage_item(ItemRecord(scope="only-items", key="k", url=None, fingerprint="f",
                                stored_at=time.time()))
    await store.flush()
    await store.close()
    result = await deferToThread(
        scrapy_in_process, "report", "-o", str(tmp_path / "every"),
        "-s", f"INCREMENTAL_STATE_URI={state_uri}")
    assert result.returncode == 0, result.stderr
    assert "scope only-items: nothing stored to report, skipped" in result.stdout
    assert sorted(p.name for p in (tmp_path / "every").iterdir()) == [
        "history-sitemap.html", "history-sitemap.json"]
    # No resource is fetched: nothing but inline scripts and data: URIs.
    assert not re.search(r"""<(script|link|img)[^>]+(src|href)=["'](?!data:)""", page)

    # Every documented field was met (fields present only on some rows or
    # some crawls: a 429's span, a parked slot's limit, `(other …)` rows,
    # per-reason counts that were 0).
    optional = {p for p in documented if "<reason>" in p or "frozen_spans[]" in p
                or p.startswith(("summary.unrecordable/", "summary.dropped/"))}
    assert set(documented) - met - optional == set()


@pytest_twisted.ensureDeferred
async def test_scrapy_report_refuses_a_missing_store(tmp_path):
    result = await deferToThread(scrapy_in_process, "report", "-o", str(tmp_path), "-s",
                                 f"INCREMENTAL_STATE_URI=sqlite:///{tmp_path / 'none.db'}")
    assert result.returncode == 1
    assert "no state store at" in result.stderr
    assert not (tmp_path / "none.db").exists() and not list(tmp_path.glob("history-*"))
