"""``scrapy report [--scope S] [-o DIR]``: a scope's crawl history page, from the store alone.

Writes ``history-<scope>.html`` (one self-contained page: the scope's last
crawls as charts and a table, and its stored hosts with their trust) and
``history-<scope>.json`` (the same figures, schema in ``docs/report.md``)
for the scope ``--scope`` names (a spider of the project, its
``incremental_scope``, or a scope by name), or for every scope of the store
without it. ``-o DIR`` defaults to ``INCREMENTAL_REPORT_DIR``, else the
current directory. The store is the one ``INCREMENTAL_STATE_URI`` names, as
for ``scrapy state``; it is only read, never created.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from scrapy.commands import ScrapyCommand

from incremental_crawler import clock
from incremental_crawler.commands._in_project import InProject
from incremental_crawler.commands.state import resolve_scope
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.report.document import history_entries, history_report
from incremental_crawler.report.files import write_whole
from incremental_crawler.report.page import PlotlyMissing, render_parts
from incremental_crawler.state.stores import StateStoreError, open_admin_store

if TYPE_CHECKING:
    import argparse

    from incremental_crawler.state.stores import AdminStore

__all__ = ["Command", "scope_report"]

FAILED = 1


def scope_report(store: AdminStore, scope: str, probation_after: int) -> dict[str, Any]:
    """The history report object of *scope*: its stored crawls and hosts."""
    now = clock.now()
    return history_report(
        scope=scope, generated=now,
        history=history_entries(store.crawls(scope, store.crawl_history)),
        hosts=store.summarize_hosts(scope, now), probation_after=probation_after,
        store=store.location)


def _file_name(scope: str) -> str:
    return "history-" + (re.sub(r"[^A-Za-z0-9._-]+", "-", scope).strip("-.") or "scope")


class Command(InProject, ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "[--scope NAME] [-o DIR]"

    def short_desc(self) -> str:
        return "Write a scope's crawl history page (HTML and JSON) from the state store"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        # No ": " in option help: Scrapy's help formatter takes a wrapped
        # line that ends with a colon for a heading.
        super().add_options(parser)
        parser.add_argument("--scope", metavar="NAME", default=None,
                            help="a spider (its incremental_scope) or a scope by name "
                                 "(default every scope of the store)")
        parser.add_argument("-o", "--output", metavar="DIR", default=None,
                            help="directory to write to (default INCREMENTAL_REPORT_DIR, "
                                 "else the current directory)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        config = IncrementalConfig.from_settings(self.settings)
        directory = Path(opts.output or config.report_dir or ".").expanduser()
        try:
            store = open_admin_store(self.settings, "report")
        except StateStoreError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = FAILED
            return
        try:
            scopes = ([resolve_scope(self.settings, opts.scope)] if opts.scope is not None
                      else store.scopes())
            if not scopes:
                raise StateStoreError(f"{store.location} holds no scope yet")
            for scope in scopes:
                report = scope_report(store, scope, config.lastmod_stale_after)
                if not report["history"] and not report["stored_hosts"]:
                    if opts.scope is None:
                        # Every scope asked for: one with nothing to show is
                        # said and passed over, the others still get a page.
                        print(f"scope {scope}: nothing stored to report, skipped")
                        continue
                    raise StateStoreError(f"scope {scope!r} has nothing stored in "
                                          f"{store.location} (scopes: "
                                          f"{', '.join(store.scopes()) or 'none'})")
                self._write(directory, scope, report)
        except (StateStoreError, PlotlyMissing, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = FAILED
        finally:
            asyncio.run(store.close())

    @staticmethod
    def _write(directory: Path, scope: str, report: dict[str, Any]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        name = _file_name(scope)
        # Whole files (a reader never sees half a page), UTF-8 whatever the locale.
        data = json.dumps(report, indent=1, allow_nan=False) + "\n"
        write_whole(directory / f"{name}.json", [data.encode("utf-8")])
        write_whole(directory / f"{name}.html", render_parts(report, json_name=f"{name}.json",
                                                                    anchor=name))
        crawls = len(report["history"])
        print(f"scope {scope}: {crawls} crawl{'' if crawls == 1 else 's'} -> "
              f"{directory / name}.html, {name}.json")
