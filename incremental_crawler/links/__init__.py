"""Old import paths, kept: the pages behind a page are now
:mod:`incremental_crawler.recipes` (requests as recipes) and
:mod:`incremental_crawler.crawl` (replay, re-seed, the stored graph's walk);
``links.reseed`` re-exports the ``Reseeder``.
"""
