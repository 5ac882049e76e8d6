"""Old import path, kept: ``incremental_crawler.state.middlewares`` is now
:mod:`incremental_crawler.crawl.callback_output`
(settings naming the old path keep loading)."""

from incremental_crawler.crawl.callback_output import CallbackGuardMiddleware, PageOutputMiddleware

__all__ = ["CallbackGuardMiddleware", "PageOutputMiddleware"]
