"""``scrapy shell``, fetching pages in full: nothing incremental in a shell.

A shell fetches a page to look at it: a stored ETag would turn it into a
304 without a body, and a page fetched there is not a crawl's to record.
Scrapy's shell also builds its engine before it has a spider, which the
add-on's components need. This command (registered through
``COMMANDS_MODULE``, so it replaces Scrapy's in the project) sets
``INCREMENTAL_ENABLED`` to ``False`` unless the command line set it; the
rest is Scrapy's shell unchanged (robots.txt is still obeyed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.commands.shell import Command as ScrapyShellCommand
from scrapy.settings import SETTINGS_PRIORITIES

if TYPE_CHECKING:
    import argparse

__all__ = ["Command"]


class Command(ScrapyShellCommand):
    """See the module docstring."""

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)
        assert self.settings is not None
        if (self.settings.getpriority("INCREMENTAL_ENABLED") or 0) < SETTINGS_PRIORITIES["cmdline"]:
            self.settings.set("INCREMENTAL_ENABLED", False, priority="cmdline")
