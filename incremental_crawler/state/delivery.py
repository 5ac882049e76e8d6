"""Old import path, kept: ``incremental_crawler.state.delivery`` is now
:mod:`incremental_crawler.crawl.delivery`
(settings naming the old path keep loading)."""

from incremental_crawler.crawl.delivery import RedeliveryMiddleware

__all__ = ["RedeliveryMiddleware"]
