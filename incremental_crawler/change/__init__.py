"""Change detection: what to ask a server, and what its answer means.

- :mod:`.policy`: the decisions, pure, over stored records and ``now``;
- :mod:`.trust`: per-host evidence on validators and sitemap lastmods;
- :mod:`.revisit`: the adaptive revisit schedule;
- :mod:`.fingerprints` and :mod:`.identity`: what makes an item "the same".

The Scrapy components that apply them through the ledger (conditional
requests, 304s dropped, unchanged items dropped) are in
:mod:`incremental_crawler.crawl` (``change.middleware``, ``change.pipeline``,
``change.due_filter`` and ``change.outcomes`` are their old import paths, kept).
"""
