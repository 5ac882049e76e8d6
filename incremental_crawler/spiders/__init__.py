"""The project's spiders, and the base class for incremental ones."""

from incremental_crawler.spiders.base import IncrementalSpider

__all__ = ["IncrementalSpider"]
