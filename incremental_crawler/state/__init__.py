"""What a crawl keeps between runs: storage only.

- :mod:`.records`: the records a store keeps (pages, items, host trust), never bodies;
- :mod:`.keys`: how requests and items are keyed (canonical URLs, variants);
- :mod:`.stores`: the store interface and its backends (SQLite, Redis).

The ledger that commits a page's state after its items, with its spider
middlewares and pipeline, is in :mod:`incremental_crawler.crawl`
(``state.ledger``, ``state.middlewares``, ``state.delivery`` and
``state.pipeline`` are its old import paths, kept).
"""
