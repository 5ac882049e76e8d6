"""``scrapy shell``, fetching pages in full: nothing incremental in a shell.

A shell fetches a page to look at it: a stored ETag would turn it into a
304 without a body, and a page fetched there is not a crawl's to record.
Scrapy's shell also builds its engine before it has a spider, which the
add-on's components need. This command (registered through the
package's ``scrapy.commands`` entry point, so it replaces Scrapy's) sets
``INCREMENTAL_ENABLED`` to ``False`` where the add-on is enabled, unless
the command line set it
(:class:`~incremental_crawler.commands._full_pages.NothingKept`); the rest
is Scrapy's shell unchanged (robots.txt is still obeyed).
"""

from __future__ import annotations

from scrapy.commands.shell import Command as ScrapyShellCommand

from incremental_crawler.commands._full_pages import NothingKept

__all__ = ["Command"]


class Command(NothingKept, ScrapyShellCommand):
    """See the module docstring."""
