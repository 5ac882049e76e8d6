"""What a crawl keeps between runs, and when it may keep it.

- :mod:`.records`: the records a store keeps (pages, items, host trust), never bodies;
- :mod:`.keys`: how requests and items are keyed (canonical URLs, variants);
- :mod:`.stores`: the store interface and its backends (SQLite, Redis);
- :mod:`.ledger`: commits a page's state only after that page's items
  passed every item pipeline (state is never ahead of data), with its two
  spider middlewares (:mod:`.middlewares`) and the item storage pipeline
  (:mod:`.pipeline`).
"""
