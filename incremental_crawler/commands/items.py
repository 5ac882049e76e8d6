"""``scrapy items -o FILE``: the latest version of every stored item."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from incremental_crawler.state.stores import StateStoreError, default_state_uri, open_store
from incremental_crawler.state.stores.sqlite import path_from_uri

if TYPE_CHECKING:
    import argparse


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "-o FILE [--spider NAME]"

    def short_desc(self) -> str:
        return "Write the latest version of every stored item as JSON lines"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("-o", "--output", metavar="FILE", required=True,
                            help="where to write the JSON lines ('-' for stdout)")
        parser.add_argument("--spider", metavar="NAME", default=None,
                            help="only items of this spider's scope")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        if args:
            raise UsageError("scrapy items takes no positional arguments")
        uri = self.settings.get("INCREMENTAL_STATE_URI") or default_state_uri()
        if uri.split(":", 1)[0].lower() == "sqlite" and not path_from_uri(uri).exists():
            # Reading must not create an empty store: that would look like a
            # crawl that stored nothing.
            print(f"error: no state store at {path_from_uri(uri)} "
                  "(check INCREMENTAL_STATE_URI)", file=sys.stderr)
            self.exitcode = 1
            return
        try:
            store = open_store(self.settings)
        except StateStoreError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 1
            return
        # Closed in the finally below (not a with: stdout stays open).
        out = sys.stdout if opts.output == "-" else Path(opts.output).open("w", encoding="utf-8")  # noqa: SIM115
        count = 0
        try:
            for item in store.iter_items(opts.spider):
                out.write(json.dumps(item, ensure_ascii=False) + "\n")
                count += 1
        finally:
            if out is not sys.stdout:
                out.close()
            asyncio.run(store.close())
        if out is not sys.stdout:
            print(f"{count} items written to {opts.output} from {store.location}",
                  file=sys.stderr)
