"""Live metrics of a crawl for Prometheus (opt-in: ``INCREMENTAL_METRICS_PORT``).

:mod:`.collector` turns the crawl's state (its stats, the politeness
windows, the state store) into metric families when a scrape asks for them;
:mod:`.endpoint` is the extension that serves them over HTTP on the crawl's
reactor, with the ``twisted.web`` site of :mod:`.site` (imported only when
metrics are on). See docs/metrics.md.
"""
