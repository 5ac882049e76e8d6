"""The crawl's orchestration: the components that drive a crawl through the ledger.

- :mod:`.ledger`: the ``Ledger`` extension: owns the store, commits a page's
  state only after that page's items passed every item pipeline;
- :mod:`.callback_output` (what a callback yielded, whether it ran),
  :mod:`.delivery` (at-least-once item delivery), :mod:`.storage_pipeline`
  and :mod:`.fingerprint_pipeline`: its spider middlewares and pipelines;
- :mod:`.conditional`, :mod:`.due`, :mod:`.due_filter`, :mod:`.outcomes`:
  conditional requests, the due rule and its filter, final outcomes;
- :mod:`.replay`, :mod:`.seen`, :mod:`.inert`, :mod:`.reseed`: the links of a
  page yielded again, the stored graph walked, due pages re-seeded.

It applies the decisions of :mod:`incremental_crawler.change` to what
:mod:`incremental_crawler.state` stores; nothing below it imports it.
"""
