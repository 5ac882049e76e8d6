"""Old import path, kept: ``incremental_crawler.state.pipeline`` is now
:mod:`incremental_crawler.crawl.storage_pipeline`
(settings naming the old path keep loading)."""

from incremental_crawler.crawl.storage_pipeline import StoragePipeline

__all__ = ["StoragePipeline"]
