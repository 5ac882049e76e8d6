"""Old import path, kept: ``incremental_crawler.state.ledger`` is now
:mod:`incremental_crawler.crawl.ledger`
(settings naming the old path keep loading)."""

from incremental_crawler.crawl.ledger import TXN_META, Ledger, PageTransaction

__all__ = ["TXN_META", "Ledger", "PageTransaction"]
