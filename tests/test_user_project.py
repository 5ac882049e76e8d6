"""A user's own project, as ``scrapy startproject`` writes it, with the package installed.

The package's commands come through its ``scrapy.commands`` entry points,
for every project of the environment: in a project with the add-on line
alone (no ``COMMANDS_MODULE``) they are there and the crawl's exit status
is the project's; in a project without the add-on, the ones that replace
Scrapy's (``crawl``, ``shell``, ...) are Scrapy's own. Each command is a
real ``scrapy`` process in the new project's directory.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import pytest_twisted
from twisted.internet.defer import gatherResults
from twisted.internet.threads import deferToThread

from tests.scrapy_cli import run, scrapy_argv
from tests.test_fatal import one_error_line, run_with_read_only

if TYPE_CHECKING:
    from pathlib import Path

ADDON_LINE = 'ADDONS = {"incremental_crawler.addon.IncrementalAddon": 0}\n'

#: The new project's spiders: one crawling the URLs it is given, one that
#: stops its crawl with the finish reason of a failed store (a reason the
#: project's crawl command reads, and Scrapy's does not).
SPIDERS = '''
import scrapy
from scrapy.exceptions import CloseSpider


class PagesSpider(scrapy.Spider):
    name = "pages"

    def __init__(self, urls="", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = urls.split()

    def parse(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}


class StoppedSpider(scrapy.Spider):
    name = "stopped"
    start_urls = ["data:,a page"]

    def parse(self, response):
        raise CloseSpider("incremental_store_error")
'''


def new_project(tmp_path: Path, *, addon: bool) -> Path:
    """``scrapy startproject userproj``, its settings as written plus the
    add-on line if *addon*, and :data:`SPIDERS`; the project's directory."""
    created = run(scrapy_argv("startproject", "userproj"), tmp_path)
    assert created.returncode == 0, created.stderr
    project = tmp_path / "userproj"
    settings = project / "userproj" / "settings.py"
    assert "COMMANDS_MODULE" not in settings.read_text()
    if addon:
        with settings.open("a") as f:
            f.write(ADDON_LINE)
    (project / "userproj" / "spiders" / "pages.py").write_text(SPIDERS)
    return project


@pytest_twisted.ensureDeferred
async def test_a_new_project_with_the_addon_line_alone_has_every_command(site, tmp_path):
    project = new_project(tmp_path, addon=True)
    for i in range(2):
        site.add_page(f"/p/{i}", "strong", size=1500)
    urls = [site.url(f"/p/{i}") for i in range(2)]

    crawl = await deferToThread(
        run, scrapy_argv("crawl", "pages", "-a", f"urls={' '.join(urls)}"), project)
    assert crawl.returncode == 0, crawl.stderr
    # Reads of the store the crawl wrote, side by side (each start-up costs a
    # second of CPU).
    state, items, report = await gatherResults([
        deferToThread(run, scrapy_argv(*args), project)
        for args in (("state",), ("items", "-o", "items.jsonl"), ("report", "-o", "report"))])
    assert state.returncode == 0, state.stdout + state.stderr
    assert "scope pages" in state.stdout
    assert re.search(r"^  pages\s+2 \(", state.stdout, re.MULTILINE), state.stdout
    assert items.returncode == 0, items.stderr
    exported = [json.loads(line) for line in (project / "items.jsonl").read_text().splitlines()]
    assert sorted(item["url"] for item in exported) == urls
    assert report.returncode == 0, report.stderr
    history = json.loads((project / "report" / "history-pages.json").read_text())
    assert [entry["figures"]["pages_new"] for entry in history["history"]] == [2]
    assert (project / "report" / "history-pages.html").exists()

    # The store cannot be written: one line, no traceback, exit status 1.
    # Beside it the shell, which opens no store (the add-on's switch is off
    # in it); the stopped crawl writes the store, so it comes after.
    store = project / ".scrapy" / "incremental"
    failed, shell = await gatherResults([
        deferToThread(run_with_read_only, store,
                      scrapy_argv("crawl", "pages", "-a", f"urls={urls[0]}"), project),
        deferToThread(run, scrapy_argv("shell", "-c", "settings.get('INCREMENTAL_ENABLED')",
                                       "--nolog"), project)])
    assert failed.returncode == 1
    assert one_error_line(failed).startswith(f"State store {store / 'state.db'}: cannot be "
                                             "written: ")
    # A crawl stopped because it could not go on exits with 1 (Scrapy's
    # command: 0, after any crawl that ran).
    stopped = await deferToThread(run, scrapy_argv("crawl", "stopped"), project)
    assert "'finish_reason': 'incremental_store_error'" in stopped.stderr
    assert stopped.returncode == 1
    # The shell fetches in full.
    assert shell.stdout.strip() == "False", shell.stderr


@pytest_twisted.ensureDeferred
async def test_a_new_project_without_the_addon_gets_scrapys_own_commands(tmp_path):
    project = new_project(tmp_path, addon=False)
    # Three commands side by side: without the add-on none writes anything.
    stopped, shell, state = await gatherResults([
        deferToThread(run, scrapy_argv(*args), project)
        for args in (("crawl", "stopped"),
                     ("shell", "-c", "settings.get('INCREMENTAL_ENABLED')", "--nolog"),
                     ("state",))])
    # Scrapy's crawl: 0 after any crawl that ran, whatever its finish reason.
    assert "'finish_reason': 'incremental_store_error'" in stopped.stderr
    assert stopped.returncode == 0, stopped.stderr
    # Scrapy's shell: nothing of the add-on's set.
    assert shell.stdout.strip() == "None", shell.stderr
    # The package's own commands are there all the same.
    assert state.returncode == 1
    assert state.stderr.strip() == (f"error: no state store at {project.resolve()}/.scrapy/"
                                    "incremental/state.db (check INCREMENTAL_STATE_URI)")


@pytest_twisted.ensureDeferred
async def test_outside_a_project_the_project_commands_refuse_as_scrapys_do(tmp_path):
    commands = ("crawl", "state")
    results = await gatherResults([deferToThread(run, scrapy_argv(command, "pages"), tmp_path)
                                   for command in commands])
    for command, result in zip(commands, results, strict=True):
        assert result.returncode == 2
        assert f"scrapy {command} is only available from within a project" in result.stderr
