"""A user's pipeline that batches its writes (a bulk indexer): items are
kept in memory and written when the spider closes, to the file named by
the ``TEST_INDEX_FILE`` setting (one JSON line each, appended)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter

if TYPE_CHECKING:
    from typing import Self

    from scrapy.crawler import Crawler


class BufferedIndexPipeline:
    def __init__(self, path: str) -> None:
        self.path = path
        self.batch: list[dict[str, Any]] = []

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler.settings["TEST_INDEX_FILE"])

    def process_item(self, item: Any) -> Any:
        self.batch.append(ItemAdapter(item).asdict())
        return item

    def close_spider(self) -> None:
        with Path(self.path).open("a", encoding="utf-8") as out:
            for record in self.batch:
                out.write(json.dumps(record) + "\n")
