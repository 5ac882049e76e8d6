"""``scrapy fetch``, Scrapy's, with nothing incremental: it prints a page's body or its headers,
fetched in full and not recorded as a crawl's visit
(:mod:`incremental_crawler.commands._full_pages`)."""

from __future__ import annotations

from scrapy.commands.fetch import Command as ScrapyFetchCommand

from incremental_crawler.commands._full_pages import NothingKept

__all__ = ["Command"]


class Command(NothingKept, ScrapyFetchCommand):
    """See the module docstring."""
