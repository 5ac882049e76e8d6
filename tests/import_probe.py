"""An extension that logs which costly modules a crawl imported, and when.

``-s EXTENSIONS={"tests.import_probe.ImportProbe": 0}``: one WARNING line
``import probe: {...}`` (JSON) when the extension is built (after Scrapy
loaded the commands, the settings and the other components, before its
engine and download handlers exist) and one when the spider closes.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import TYPE_CHECKING

from scrapy import signals

if TYPE_CHECKING:
    from typing import Self

    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: Modules a crawl without Redis, or before its download handlers, need not
#: import; nor Twisted's web server (the ``scrapy demo`` site's).
WATCHED = ("redis", "scrapy_redis", "scrapy.core.downloader.handlers.http11",
           "twisted.web.server")


def _loaded() -> list[str]:
    return [name for name in WATCHED if name in sys.modules]


class ImportProbe:
    def __init__(self, crawler: Crawler) -> None:
        logger.warning("import probe: %s", json.dumps({"built": _loaded()}))
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def spider_closed(self) -> None:
        logger.warning("import probe: %s", json.dumps({"closed": _loaded()}))
