"""``scrapy parse``, Scrapy's, with nothing incremental: it runs a spider's callback on a page,
fetched in full and not recorded as a crawl's visit
(:mod:`incremental_crawler.commands._full_pages`)."""

from __future__ import annotations

from scrapy.commands.parse import Command as ScrapyParseCommand

from incremental_crawler.commands._full_pages import NothingKept
from incremental_crawler.commands._in_project import InProject

__all__ = ["Command"]


class Command(InProject, NothingKept, ScrapyParseCommand):
    """See the module docstring."""
