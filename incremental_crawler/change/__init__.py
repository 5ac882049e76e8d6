"""Change detection: what to ask a server, and what its answer means.

- :mod:`.policy`: the decisions, pure, over stored records and ``now``;
- :mod:`.trust`: per-host evidence on validators and sitemap lastmods;
- :mod:`.revisit`: the adaptive revisit schedule;
- :mod:`.fingerprints` and :mod:`.identity`: what makes an item "the same";
- :mod:`.middleware` and :mod:`.pipeline`: the thin Scrapy components that
  apply them (conditional requests, 304s dropped, unchanged items dropped).
"""
