"""Old import path, kept: ``incremental_crawler.change.middleware`` is now
:mod:`incremental_crawler.crawl.conditional`
(settings naming the old path keep loading)."""

from incremental_crawler.crawl.conditional import ConditionalRequestMiddleware

__all__ = ["ConditionalRequestMiddleware"]
