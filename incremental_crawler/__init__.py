"""incremental_crawler: incremental re-crawls for Scrapy.

Stored validators make every re-visit a conditional request, 304s are
dropped, unchanged items are recognised by their fingerprint, and page state
is committed only together with the data extracted from the page.
"""

__version__ = "0.1.0"
