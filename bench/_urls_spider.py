"""``scrapy runspider bench/_urls_spider.py -a urls_file=FILE``: fetch a URL list.

A benchmark helper (not a benchmark): reads one URL per line from
``urls_file`` (blank lines and ``#`` comments skipped), yields one Request
per URL in file order and one item ``{"url": response.url}`` per answer.
``-a if_none_match=*`` sends every request with that ``If-None-Match``: a
server with the page answers 304, which Scrapy's ``HttpErrorMiddleware``
drops before ``parse`` (the least a Scrapy process spends asking these
pages whether they changed). Run it with the repository as the working
directory so that the project's settings (``scrapy.cfg``) and its add-on
apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import scrapy


class UrlsSpider(scrapy.Spider):
    name = "urls"

    def __init__(self, urls_file: str | None = None, if_none_match: str = "",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.if_none_match = if_none_match
        if not urls_file:
            raise ValueError("the urls spider needs -a urls_file=FILE (one URL per line)")
        lines = Path(urls_file).read_text(encoding="utf-8").splitlines()
        self.urls = [u.strip() for u in lines if u.strip() and not u.lstrip().startswith("#")]

    async def start(self):
        headers = {"If-None-Match": self.if_none_match} if self.if_none_match else None
        for url in self.urls:
            yield scrapy.Request(url, callback=self.parse, headers=headers)

    def parse(self, response):
        yield {"url": response.url}
