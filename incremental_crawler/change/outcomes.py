"""Old import path, kept: ``incremental_crawler.change.outcomes`` is now
:mod:`incremental_crawler.crawl.outcomes`
(settings naming the old path keep loading)."""

from incremental_crawler.crawl.outcomes import FinalOutcomeMiddleware, MovedPageMiddleware

__all__ = ["FinalOutcomeMiddleware", "MovedPageMiddleware"]
