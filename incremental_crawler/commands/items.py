"""``scrapy items -o FILE``: stored items, through Scrapy's feed exporters.

Without options it writes the latest version of every live item (what a
full crawl that found everything new would emit). ``--since WHEN`` and
``--all-versions`` read the store's item history instead
(``AdminStore.iter_versions``): the change feed as stored, tombstones
included, each record with its change type, ``stored_at`` and ``version``,
so a consumer that missed crawls catches up from the store rather than by
crawling again.

The format is chosen as ``scrapy crawl -o`` chooses it, by the file's
extension among the project's ``FEED_EXPORTERS`` (``-t`` forces one), and
the exporter gets the project's ``FEED_EXPORT_ENCODING``, ``FEED_EXPORT_FIELDS``
and ``FEED_EXPORT_INDENT``: an export reads like a crawl's feed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from scrapy.exporters import CsvItemExporter
from scrapy.spiderloader import get_spider_loader
from scrapy.utils.conf import feed_complete_default_values_from_settings
from scrapy.utils.misc import load_object
from scrapy.utils.python import without_none_values

from incremental_crawler.commands._in_project import InProject
from incremental_crawler.config import IncrementalConfig, SettingError
from incremental_crawler.state.stores import StateStoreError, open_admin_store

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterator

    from scrapy.exporters import BaseItemExporter
    from scrapy.settings import BaseSettings

    from incremental_crawler.state.stores import AdminStore

__all__ = ["Command", "format_time", "parse_since", "resolve_scope"]

#: ``-o -``: standard output.
STDOUT = "-"
#: The change field of exported versions when INCREMENTAL_CHANGE_FIELD is off
#: (items then carry none, but a version read back must say what it is).
DEFAULT_CHANGE_FIELD = "change"


def parse_since(text: str) -> float:
    """POSIX time of an ISO 8601 date or time; without a zone offset, UTC.

    ``2026-11-30`` is midnight UTC; ``2026-11-30T00:00:00Z`` and
    ``2026-11-30T01:00:00+01:00`` are the same instant.
    """
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(
            f"--since {text!r} is not an ISO 8601 date or time "
            "(e.g. 2026-11-30, 2026-11-30T08:00:00Z or 2026-11-30T09:00:00+01:00)",
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def format_time(when: float) -> str:
    """ISO 8601 in UTC with a ``Z``; whole seconds, as stores keep them."""
    stamp = datetime.fromtimestamp(when, UTC)
    spec = "seconds" if when == int(when) else "milliseconds"
    return stamp.isoformat(timespec=spec).replace("+00:00", "Z")


def resolve_scope(name: str, settings: BaseSettings) -> str:
    """The state scope ``--spider NAME`` means.

    A spider of the project is looked up as a crawl would (its class's
    ``incremental_scope``, else its name: ``Ledger.scope``); any other name
    is taken as a scope, so that items of a spider no longer in the project,
    or of a scope several spiders share, can be exported too.
    """
    loader = get_spider_loader(settings)
    if name not in loader.list():
        return name
    spidercls = loader.load(name)
    scope = getattr(spidercls, "incremental_scope", None)
    return scope if isinstance(scope, str) and scope else spidercls.name or name


def _exporter_class(output: str, forced: str | None,
                    settings: BaseSettings) -> tuple[str, type[BaseItemExporter]]:
    """The format (``-t``, else the file's extension) and its exporter class."""
    exporters: dict[str, str] = without_none_values(settings.getwithbase("FEED_EXPORTERS"))
    if forced:
        fmt = forced
    elif output == STDOUT:
        fmt = "jsonlines"
    else:
        fmt = Path(output).suffix.removeprefix(".")
    if fmt not in exporters:
        known = ", ".join(sorted(exporters))
        if forced:
            raise UsageError(f"-t {fmt}: unknown format (known: {known})")
        raise UsageError(
            f"cannot tell the format of {output!r} from its extension: use one of "
            f"{known} as its extension, or -t FORMAT")
    return fmt, load_object(exporters[fmt])


class Command(InProject, ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "-o FILE [-t FORMAT] [--since WHEN] [--all-versions] [--spider NAME]"

    def short_desc(self) -> str:
        return "Export stored items (or their history) through the feed exporters"

    def long_desc(self) -> str:
        return (
            "Write the latest version of every stored item to FILE, in the format its "
            "extension names (jsonl, json, csv, xml, or any of FEED_EXPORTERS). With "
            "--since and/or --all-versions, write stored versions instead, tombstones "
            "included, each with its change type, stored_at and version."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("-o", "--output", metavar="FILE", required=True,
                            help="where to write ('-' for stdout, JSON lines unless -t)")
        parser.add_argument("-t", "--output-format", metavar="FORMAT", default=None,
                            help="format to write, whatever FILE's extension")
        parser.add_argument("--since", metavar="WHEN", default=None,
                            help="versions stored at or after WHEN (ISO 8601; UTC "
                                 "unless it has an offset), the latest of each item")
        parser.add_argument("--all-versions", action="store_true",
                            help="every stored version, not only the latest")
        parser.add_argument("--spider", metavar="NAME", default=None,
                            help="only items of this spider's scope (or of scope NAME)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        settings = self.settings
        if args:
            raise UsageError("scrapy items takes no positional arguments")
        # Every usage error before anything is opened or written.
        since = None if opts.since is None else parse_since(opts.since)
        fmt, exporter_cls = _exporter_class(opts.output, opts.output_format, settings)
        versions = since is not None or opts.all_versions
        try:
            change_field = (IncrementalConfig.from_settings(settings).change_field
                            or DEFAULT_CHANGE_FIELD)
        except SettingError as exc:
            self._error(str(exc))
            return
        scope = None if opts.spider is None else resolve_scope(opts.spider, settings)

        try:
            # The store a crawl with these settings uses, never created
            # here: an empty one would look like a crawl that stored nothing.
            store = open_admin_store(settings, "items")
        except StateStoreError as exc:
            self._error(str(exc))
            return
        try:
            records: Callable[[], Iterator[dict[str, Any]]] = (
                partial(_versions, store, scope, since, opts.all_versions, change_field)
                if versions else partial(_latest, store, scope))
            count = self._export(records, opts.output, exporter_cls, settings, fmt)
        except StateStoreError as exc:
            self._error(str(exc))
            return
        finally:
            asyncio.run(store.close())
        if count is not None and opts.output != STDOUT:
            what = "item versions" if versions else "items"
            print(f"{count} {what} written to {opts.output} ({fmt}) from {store.location}",
                  file=sys.stderr)

    def _export(self, records: Callable[[], Iterator[dict[str, Any]]], output: str,
                exporter_cls: type[BaseItemExporter], settings: BaseSettings,
                fmt: str) -> int | None:
        """Write *records* (read once) to *output*; the count, or ``None``
        after an error."""
        options = feed_complete_default_values_from_settings({"format": fmt}, settings)
        fields = options["fields"]
        with tempfile.TemporaryFile() as spool:
            if fields is None and issubclass(exporter_cls, CsvItemExporter):
                # A CSV header is written before the first row, from the
                # first record's fields unless told: a tombstone, or an item
                # a spider gave a new field, would lose fields. The records
                # are read once, for their names, and spooled to disk (not
                # kept in memory) to be written: read twice, a crawl's flush
                # between the reads could add records whose fields the
                # header lacks.
                fields = _spool(records(), spool)
                records = partial(_unspool, spool)
            return self._write(records(), output, exporter_cls, options, fields)

    def _write(self, records: Iterator[dict[str, Any]], output: str,
               exporter_cls: type[BaseItemExporter], options: dict[str, Any],
               fields: list[str] | None) -> int | None:
        """Write *records* to *output* with *fields*; as :meth:`_export`."""
        if output == STDOUT:
            file: IO[bytes] = sys.stdout.buffer
        else:
            try:
                file = Path(output).open("wb")  # noqa: SIM115 (closed in the finally below)
            except OSError as exc:
                self._error(f"cannot write {output}: {exc.strerror or exc}")
                return None
        count = 0
        done = False
        try:
            # Built as Scrapy's feed slots build them: the file, then options.
            build: Callable[..., BaseItemExporter] = exporter_cls
            exporter = build(file, fields_to_export=fields, encoding=options["encoding"],
                             indent=options["indent"], **options["item_export_kwargs"])
            exporter.start_exporting()
            for record in records:
                exporter.export_item(record)
                count += 1
            exporter.finish_exporting()
            file.flush()
            done = True
        except BrokenPipeError:
            if output != STDOUT:
                raise
            # The reader went away (`| head`): nothing more to say, and
            # Python must not fail flushing stdout again at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            self.exitcode = 1
            return None
        except OSError as exc:
            self._error(f"cannot write {'stdout' if output == STDOUT else output}: "
                        f"{exc.strerror or exc}")
            return None
        finally:
            if output != STDOUT:
                file.close()
                if not done:
                    # Half an export reads like a whole one (JSON lines, CSV):
                    # an error leaves no file rather than a short one.
                    Path(output).unlink(missing_ok=True)
        return count

    def _error(self, message: str) -> None:
        print(f"error: {message}", file=sys.stderr)
        self.exitcode = 1


def _spool(records: Iterator[dict[str, Any]], spool: IO[bytes]) -> list[str]:
    """Write *records* to *spool* as JSON lines; the names of their fields,
    in the order first met."""
    names: dict[str, None] = {}
    for record in records:
        names.update(dict.fromkeys(record))
        spool.write(json.dumps(record, ensure_ascii=False).encode() + b"\n")
    return list(names)


def _unspool(spool: IO[bytes]) -> Iterator[dict[str, Any]]:
    """The records :func:`_spool` wrote, in their order."""
    spool.seek(0)
    for line in spool:
        yield json.loads(line)


def _latest(store: AdminStore, scope: str | None) -> Iterator[dict[str, Any]]:
    yield from store.iter_items(scope)


def _versions(store: AdminStore, scope: str | None, since: float | None,
              every_version: bool, change_field: str) -> Iterator[dict[str, Any]]:
    """Stored versions as records: the item's fields, then what the version is.

    The three added fields win over item fields of the same names, as the
    change field does on emitted items.
    """
    for version in store.iter_versions(scope, since=since, every_version=every_version):
        record = dict(version.data)
        record[change_field] = version.change
        record["stored_at"] = format_time(version.stored_at)
        record["version"] = version.version
        yield record
