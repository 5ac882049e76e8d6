"""Old import path, kept: ``incremental_crawler.change.pipeline`` is now
:mod:`incremental_crawler.crawl.fingerprint_pipeline`
(settings naming the old path keep loading)."""

from incremental_crawler.crawl.fingerprint_pipeline import FingerprintPipeline

__all__ = ["FingerprintPipeline"]
