"""``scrapy check``, Scrapy's, with nothing incremental: it runs a spider's contracts on the
pages they name, fetched in full and not recorded as a crawl's visit
(:mod:`incremental_crawler.commands._full_pages`)."""

from __future__ import annotations

from scrapy.commands.check import Command as ScrapyCheckCommand

from incremental_crawler.commands._full_pages import NothingKept
from incremental_crawler.commands._in_project import InProject

__all__ = ["Command"]


class Command(InProject, NothingKept, ScrapyCheckCommand):
    """See the module docstring."""
