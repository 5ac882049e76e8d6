"""Old import path, kept: ``incremental_crawler.links.reseed`` is now
:mod:`incremental_crawler.crawl.reseed`
(settings naming the old path keep loading)."""

from incremental_crawler.crawl.reseed import Reseeder

__all__ = ["Reseeder"]
