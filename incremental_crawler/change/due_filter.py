"""Old import path, kept: ``incremental_crawler.change.due_filter`` is now
:mod:`incremental_crawler.crawl.due_filter`
(settings naming the old path keep loading)."""

from incremental_crawler.crawl.due_filter import NotDueFilterMiddleware

__all__ = ["NotDueFilterMiddleware"]
