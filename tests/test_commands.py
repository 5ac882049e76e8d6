"""The project's commands and start-up errors, as a user runs them.

A command that starts a crawl (or a shell) runs in a process of its own;
``scrapy items`` through Scrapy's command line in the test process
(tests/scrapy_cli.py).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet.threads import deferToThread

from incremental_crawler.demo import DemoSite
from incremental_crawler.report.extension import OUTCOMES
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from incremental_crawler.state.stores import StateStoreError
from tests.scrapy_cli import PROJECT, child_env, run, run_scrapy, scrapy_in_process
from tests.spiders import ListSpider


def test_scrapy_demo_crawls_twice_and_reports_savings(tmp_path):
    result = run_scrapy("demo", "--pages", "40", "--change", "0.1",
                    "--state-uri", f"sqlite:///{tmp_path / 'demo.db'}",
                    "--report-dir", str(tmp_path / "report"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    first = re.search(r"crawl 1 \(cold\):\s+(\d+) pages fetched, (\d+) items stored", out)
    assert first and first.groups() == ("40", "40")
    changed = re.search(r"changed on the site:\s+(\d+) pages", out)
    assert changed and changed.group(1) == "4"
    skipped = re.search(
        r"crawl 2 \(incremental\): (\d+) unchanged sitemaps? not read; of the (\d+) known pages, "
        r"(\d+) skipped", out)
    # Changed pages are in both of the index's sitemaps, so both are read;
    # of the 36 unchanged pages they list, one per sitemap is checked (the
    # rotating sample, a 304) and the others are skipped by lastmod.
    assert skipped and skipped.groups() == ("0", "40", "34"), out
    second = re.search(
        r"(\d+) pages checked, (\d+) not modified \(304\), (\d+) changed", out)
    assert second and (second.group(1), second.group(3)) == ("6", "4"), out
    # The two sampled pages: a 304 each, unless the sample (least recently
    # checked first: ties within crawl 1's second) fell on a page without
    # validators, which can only be fetched in full.
    full = re.search(r"(\d+) unchanged in full \(no validators to ask with\)", out)
    assert full and int(second.group(2)) + int(full.group(1)) == 2, out
    stored = re.search(r"(\d+) items stored \((\d+) changed", out)
    assert stored and stored.groups() == ("4", "4")
    # Each crawl wrote its report; the page printed is the second's, with both in its history.
    assert (tmp_path / "report" / "report.html").as_uri() in out
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["summary"]["changed"] == 4
    assert [e["figures"]["pages_new"] for e in report["history"]] == [0, 40]
    # Crawl 1's own section of the page too (its timestamped JSON's name),
    # with its 40 new pages.
    first_page = re.search(r"crawl 1's report \(.*\): file://(\S+)/report\.html#"
                           r"(report-\d{8}T\d{9}Z)$", out, re.MULTILINE)
    assert first_page, out
    assert f'<section class="crawl" id="{first_page.group(2)}"' in (
        Path(first_page.group(1)) / "report.html").read_text()
    first_report = json.loads(
        (Path(first_page.group(1)) / f"{first_page.group(2)}.json").read_text())
    assert first_report["summary"]["new"] == 40 and first_report["history"] == report["history"][1:]


def test_scrapy_demo_without_the_report_extra_points_to_the_json(tmp_path):
    # Installed without plotly (the package's report extra): as if it were
    # not there, for this process only.
    without_plotly = ("import sys; sys.modules['plotly'] = None; "
                      "from scrapy.cmdline import execute; execute(sys.argv[1:])")
    result = run(
        [sys.executable, "-c", without_plotly, "scrapy", "demo", "--pages", "20", "--state-uri",
         f"sqlite:///{tmp_path / 'demo.db'}", "--report-dir", str(tmp_path / "report")])
    assert result.returncode == 0, result.stderr
    assert "this crawl will write report.json only" in result.stderr
    assert result.stdout.rstrip().endswith(
        "crawl report (JSON; the page needs pip install 'incremental-crawler[report]'): "
        f"{(tmp_path / 'report' / 'report.json').as_uri()}"), result.stdout
    assert not list((tmp_path / "report").glob("*.html"))


def test_scrapy_demo_accounts_for_each_of_its_60_pages_once(tmp_path):
    # The default demo: one of the index's sitemaps is not read, and its 30
    # pages are known (stored) all the same. Its second crawl starts within
    # the second the first one ended in.
    result = run_scrapy("demo", "--state-uri", f"sqlite:///{tmp_path / 'demo.db'}",
                    "--report-dir", str(tmp_path / "report"))
    assert result.returncode == 0, result.stderr
    assert "1 unchanged sitemap not read; of the 60 known pages, 26 skipped" in result.stdout
    assert "30 not due" in result.stdout
    summary = json.loads((tmp_path / "report" / "report.json").read_text())["summary"]
    columns = ("skipped_lastmod", "not_due", "deferred", "pages_no_outcome",
               *(f"pages_{outcome}" for outcome in OUTCOMES))
    assert {column: summary[column] for column in columns if summary[column]} == {
        "skipped_lastmod": 26, "not_due": 30, "pages_changed": 3,
        # The rotating sample's page: a 304, or a page without validators.
        **({"pages_not_modified": 1} if summary["pages_not_modified"]
           else {"pages_unchanged": 1})}
    assert summary["pages_known"] == 60
    assert re.search(r"downloaded \d+\.\d% of a full re-crawl, saved \d+\.\d%$",
                     result.stdout.split("\n\n")[1].splitlines()[-1]), result.stdout


@pytest_twisted.ensureDeferred
async def test_scrapy_items_exports_the_latest_version_of_each_item(
    site, crawl, state_uri, tmp_path,
):
    for i in range(5):
        site.add_page(f"/p/{i}", "strong", size=1500)
    await crawl(SitemapPagesSpider, sitemap_url=site.url("/sitemap.xml"))
    site.change("/p/3")
    await crawl(SitemapPagesSpider, sitemap_url=site.url("/sitemap.xml"))
    out = tmp_path / "items.jsonl"
    result = await deferToThread(
        scrapy_in_process, "items", "-o", str(out), "-s", f"INCREMENTAL_STATE_URI={state_uri}")
    assert result.returncode == 0, result.stderr
    items = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(item["url"] for item in items) == [site.url(f"/p/{i}") for i in range(5)]
    titles = {item["url"]: item["title"] for item in items}
    assert titles[site.url("/p/3")] == "Page p/3 v1"
    assert all(item["fingerprint"] and item["text"] for item in items)


@pytest_twisted.ensureDeferred
async def test_a_corrupt_state_file_stops_the_crawl_and_is_left_alone(site, crawl, tmp_path):
    site.add_page("/p", "strong", size=1500)
    path = tmp_path / "state.db"
    garbage = b"this is not a database " * 100
    path.write_bytes(garbage)
    with pytest.raises(StateStoreError, match=re.escape(str(path))):
        await crawl(ListSpider, urls=[site.url("/p")])
    assert path.read_bytes() == garbage
    assert not [r for r in site.log if r.path == "/p"]


def test_scrapy_crawl_with_a_corrupt_state_file_exits_with_the_file_named(tmp_path):
    path = tmp_path / "state.db"
    path.write_bytes(b"\x00garbage" * 200)
    result = run_scrapy("crawl", "sitemap", "-a", "sitemap_url=http://127.0.0.1:9/sitemap.xml",
                    "-s", f"INCREMENTAL_STATE_URI=sqlite:///{path}")
    assert result.returncode != 0
    assert str(path) in result.stderr
    assert "not a readable SQLite database" in result.stderr


@pytest_twisted.ensureDeferred
async def test_scrapy_items_on_a_missing_state_file_is_an_error_not_an_empty_store(tmp_path):
    path = tmp_path / "never-crawled" / "state.db"
    result = await deferToThread(scrapy_in_process, "items", "-o", str(tmp_path / "out.jsonl"),
                                 "-s", f"INCREMENTAL_STATE_URI=sqlite:///{path}")
    assert result.returncode == 1
    assert f"no state store at {path}" in result.stderr
    assert not path.exists() and not path.parent.exists()


def test_the_demo_site_answers_conditional_requests_as_rfc_9110_says():
    # The demo's own small server (not the test site): 304 only when the
    # validators match, If-None-Match deciding alone when present.
    site = DemoSite(8, page_size=3000)
    answers = {path: site.respond(path) for path in ("/p/0000", "/p/0001", "/p/0002", "/p/0003")}
    assert {path: (status, len(body)) for path, (status, _, body) in answers.items()} == (
        dict.fromkeys(answers, (200, 3000)))
    strong, weak, lastmod, none = (headers for _, headers, _ in answers.values())
    assert strong["ETag"].startswith('"') and "Last-Modified" in strong
    assert weak["ETag"].startswith('W/"') and "Last-Modified" not in weak
    assert "ETag" not in lastmod and "Last-Modified" in lastmod
    assert "ETag" not in none and "Last-Modified" not in none
    date = strong["Last-Modified"]
    assert site.respond("/p/0000", strong["ETag"])[0] == 304
    # Weak comparison: W/ on either side is ignored; any member of the list may match.
    assert site.respond("/p/0000", f'"other", W/{strong["ETag"]}')[0] == 304
    assert site.respond("/p/0001", weak["ETag"].removeprefix("W/"))[0] == 304
    # If-None-Match wins over If-Modified-Since, both ways.
    assert site.respond("/p/0000", '"other"', date)[0] == 200
    assert site.respond("/p/0000", strong["ETag"], "Thu, 01 Jan 1970 00:00:00 GMT")[0] == 304
    assert site.respond("/p/0002", None, date)[0] == 304
    assert site.respond("/p/0002", None, "Thu, 01 Jan 1970 00:00:00 GMT")[0] == 200
    assert site.respond("/p/0002", None, "not a date")[0] == 200
    assert site.respond("/p/0003", None, date)[0] == 200
    # A changed page: new body, new validators; the old ones no longer match.
    changed = site.change_fraction(0.5, seed=1)
    assert changed == DemoSite(8).change_fraction(0.5, seed=1)  # the seed decides
    assert changed == ["/p/0000", "/p/0002", "/p/0004", "/p/0007"]
    status, headers, body = site.respond("/p/0000")
    assert status == 200 and body != answers["/p/0000"][2]
    assert headers["ETag"] != strong["ETag"] and headers["Last-Modified"] != date
    assert site.respond("/p/0000", strong["ETag"])[0] == 200
    assert site.respond("/p/0002", None, date)[0] == 200


@pytest_twisted.ensureDeferred
async def test_a_crawl_without_redis_imports_no_redis_client(site, tmp_path):
    """``scrapy crawl`` on the defaults (SQLite, politeness on) imports
    neither Redis's client nor, before Scrapy builds its download handlers,
    Scrapy's HTTP/1.1 handler module (imported from the deep stack of
    Scrapy's command lookup, its deprecated aliases inspect that whole stack:
    each costs every crawl's start a tenth of a second), nor Twisted's web
    server (``scrapy demo``'s site: Scrapy imports every command's module)."""
    for i in range(3):
        site.add_page(f"/p/{i}", "strong", size=1500)
    result = await deferToThread(
        run_scrapy, "crawl", "sitemap", "-a", f"sitemap_url={site.url('/sitemap.xml')}",
        "-s", f"INCREMENTAL_STATE_URI=sqlite:///{tmp_path / 'state.db'}",
        "-s", 'EXTENSIONS={"tests.import_probe.ImportProbe": 0}', "-s", "LOG_LEVEL=WARNING")
    assert result.returncode == 0, result.stderr
    probes = [json.loads(line.split("import probe: ", 1)[1])
              for line in result.stderr.splitlines() if "import probe: " in line]
    assert probes == [{"built": []}, {"closed": ["scrapy.core.downloader.handlers.http11"]}]
    assert sum(1 for r in site.log if r.path.startswith("/p/")) == 3


@pytest.mark.parametrize("settings_module", ["incremental_crawler.settings",
                                             "tests.user_settings"],
                         ids=["project-shell", "user-project-scrapy-shell"])
@pytest_twisted.ensureDeferred
async def test_scrapy_shell_fetches_a_known_page_in_full_and_keeps_nothing(
    site, crawl, state_uri, state_db, settings_module,
):
    # Scrapy's shell builds its engine before it has a spider, and a stored
    # ETag would make its fetch a 304 without a body: the project's shell
    # runs without the incremental components, and in a project of a user's
    # own (Scrapy's shell, the add-on line) they stay out for want of a spider.
    site.add_page("/p", "strong", size=1500)
    await crawl(ListSpider, urls=[site.url("/p")])
    before = state_db("SELECT * FROM pages")
    site.reset_log()
    result = await deferToThread(
        run_scrapy, "shell", site.url("/p"), "-c", "(response.status, len(response.body))",
        "-s", f"INCREMENTAL_STATE_URI={state_uri}", "-s", "LOG_LEVEL=WARNING",
        env=child_env(SCRAPY_SETTINGS_MODULE=settings_module))
    assert result.returncode == 0, result.stderr
    status, size = json.loads(result.stdout.strip().replace("(", "[").replace(")", "]"))
    assert status == 200 and size > 1000
    [asked] = [r for r in site.log if r.path == "/p"]
    assert "if-none-match" not in asked.headers
    assert state_db("SELECT * FROM pages") == before
    # Nor does the session hold a scope of the store (its spider's, "default").
    assert state_db("SELECT scope FROM holds") == []


#: A spider with a contract on the test site's page, in the ListSpider's scope.
CONTRACT_SPIDER = '''
from tests.scrapy_cli import PROJECT, child_env, run, run_scrapy, scrapy_in_process
from tests.spiders import ListSpider


class ContractSpider(ListSpider):
    name = "contracted"
    incremental_scope = "list"

    def __init__(self, **kwargs):
        super().__init__(urls=[], **kwargs)

    def parse(self, response):
        """@url {url}
        @returns items 1 1
        """
        yield from super().parse(response)
'''


@pytest.mark.parametrize("command", ["fetch", "parse", "check"])
@pytest_twisted.ensureDeferred
async def test_commands_that_look_at_a_page_fetch_it_in_full_and_keep_nothing(
    site, crawl, state_uri, state_db, tmp_path, command,
):
    # A page a crawl just stored is not due and has an ETag: with the
    # add-on on, fetch would print nothing, parse would find no response,
    # check would run no contract; and each would record its visit in the
    # spider's scope, so that the next crawl leaves the page out.
    site.add_page("/p", "strong", size=1500)
    url = site.url("/p")
    await crawl(ListSpider, urls=[url])
    before = (state_db("SELECT * FROM pages"), state_db("SELECT * FROM crawls"))
    site.reset_log()
    (tmp_path / "contract_spiders.py").write_text(CONTRACT_SPIDER.format(url=url))
    args, spiders = {
        "fetch": (["fetch", url], "tests.spiders"),
        "parse": (["parse", "--spider", "list", "-a", "urls=", url], "tests.spiders"),
        "check": (["check", "contracted"], "contract_spiders"),
    }[command]
    result = await deferToThread(
        run_scrapy, *args, "-s", f"INCREMENTAL_STATE_URI={state_uri}", "-s", "LOG_LEVEL=WARNING",
        "-s", f"SPIDER_MODULES={spiders}",
        env=child_env(PYTHONPATH=os.pathsep.join([str(tmp_path), str(PROJECT)])))
    assert result.returncode == 0, result.stderr
    [asked] = [r for r in site.log if r.path == "/p"]
    assert "if-none-match" not in asked.headers
    if command == "fetch":
        assert "<title>Page p" in result.stdout and len(result.stdout) > 1000
    elif command == "parse":
        assert f"'url': '{url}'" in result.stdout
    else:
        assert "Ran 1 contract" in result.stderr and "OK" in result.stderr
    assert (state_db("SELECT * FROM pages"), state_db("SELECT * FROM crawls")) == before


#: Prints each command's ``--help`` at several terminal widths, through
#: Scrapy's own command line (one process for them all).
HELP_SCRIPT = """
import contextlib, io, json, os
from scrapy.cmdline import execute
for columns in (60, 80, 100, 140):
    os.environ["COLUMNS"] = str(columns)
    for name in ("demo", "items", "state", "report"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            execute(["scrapy", name, "--help"])
        print(json.dumps([columns, name, out.getvalue()]))
"""


def test_the_commands_help_has_scrapys_three_headings_and_no_other():
    # Scrapy's help formatter underlines any line ending with a colon as a
    # heading: an option's help wrapped after "default:" came out as one.
    result = run([sys.executable, "-c", HELP_SCRIPT])
    assert result.returncode == 0, result.stderr
    pages = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(pages) == 16
    for columns, name, text in pages:
        lines = text.splitlines()
        headings = [above for above, line in itertools.pairwise(lines)
                    if line and set(line) <= {"=", "-"}]
        assert headings == ["Usage", "Options", "Global Options"], (columns, name, text)
