"""``scrapy view``, Scrapy's, with nothing incremental: it opens a page in a browser,
fetched in full and not recorded as a crawl's visit
(:mod:`incremental_crawler.commands._full_pages`)."""

from __future__ import annotations

from scrapy.commands.view import Command as ScrapyViewCommand

from incremental_crawler.commands._full_pages import NothingKept

__all__ = ["Command"]


class Command(NothingKept, ScrapyViewCommand):
    """See the module docstring."""
