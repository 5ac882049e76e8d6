"""The sitemap/feed corpus, crawled by ours and by plain Scrapy's SitemapSpider.

What it measures
    For every case of ``tests/corpus/sitemaps/index.toml`` (fixtures that
    reproduce test cases of ultimate-sitemap-parser, feedparser and Scrapy,
    and rules of sitemaps.org and Google's documentation), two real crawls
    against the loopback test site, each on a fresh site:

    * ours: the ``sitemap`` spider (the add-on on, a SQLite state store in a
      temporary directory);
    * plain Scrapy: a minimal ``SitemapSpider`` with the same start URL,
      ``sitemap_alternate_links``, ``sitemap_rules`` and ``sitemap_follow``
      (the add-on loaded with ``INCREMENTAL_ENABLED=False``).

    A case passes when the pages the crawl requested (the site's log, plus
    any request that left for another host) are exactly the expected set.

How to read it
    One row per source suite: cases, passed by ours, passed by plain Scrapy;
    then each case either fails, with what it requested. The cases where
    our expectation deviates from the source suite say why in the index.

    python bench/sitemap_corpus.py [--case NAME]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scrapy import Spider, signals
from scrapy.crawler import CrawlerRunner
from scrapy.spiders import SitemapSpider
from scrapy.utils.reactor import install_reactor

install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")

from twisted.internet import defer, task

from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from tests.site import LoopbackSite
from tests.sitemap_corpus import (
    Case,
    load_cases,
    requested_pages,
    serve,
    spider_attributes,
    start_url,
)

ADDON = "incremental_crawler.addon.IncrementalAddon"
BASE_SETTINGS: dict[str, Any] = {
    "ADDONS": {ADDON: 0},
    "ROBOTSTXT_OBEY": True,
    "LOG_LEVEL": "ERROR",
    "LOGSTATS_INTERVAL": 0,
    "TELNETCONSOLE_ENABLED": False,
    "INCREMENTAL_REVISIT_ENABLED": False,
    "INCREMENTAL_THROTTLE_ENABLED": False,
    "RETRY_ENABLED": False,
    "DOWNLOAD_TIMEOUT": 10,
}


class PlainSitemapSpider(SitemapSpider):
    """Scrapy's SitemapSpider as a user writes it: pages parsed, nothing else."""

    name = "plain_sitemap"

    def __init__(self, sitemap_url: str, alternate_links: str = "false", **kwargs: Any) -> None:
        self.sitemap_urls = [sitemap_url]
        self.sitemap_alternate_links = alternate_links == "true"
        super().__init__(**kwargs)

    def parse(self, response: Any) -> Any:
        return None


async def run(case: Case, spider: type[Spider], settings: dict[str, Any]) -> set[str]:
    """The pages one crawl of *case* requested (other hosts as full URLs)."""
    site = LoopbackSite()
    site.start()
    try:
        serve(site, case)
        runner = CrawlerRunner(settings)
        spidercls = type(f"{spider.__name__}_{case.name}", (spider,),
                         spider_attributes(case))
        crawler = runner.create_crawler(spidercls)
        elsewhere: set[str] = set()
        # The site's two names ({base}, {alias}): both are the site, logged there.
        own = {urlsplit(site.base_url).netloc,
               urlsplit(site.base_url).netloc.replace("127.0.0.1", "localhost")}

        def reached(request: Any, spider: Any) -> None:
            if urlsplit(request.url).netloc not in own:
                elsewhere.add(request.url)

        crawler.signals.connect(reached, signal=signals.request_reached_downloader)
        await runner.crawl(crawler, sitemap_url=start_url(site, case), **case.args)
        return requested_pages(site, case) | elsewhere
    finally:
        await site.stop()


async def main(args: argparse.Namespace) -> None:
    # The add-on's "Disabled ..." notices of the plain crawls: not results.
    logging.disable(logging.WARNING)
    cases = [c for c in load_cases() if not args.case or c.name == args.case]
    total: Counter[str] = Counter()
    ours_ok: Counter[str] = Counter()
    plain_ok: Counter[str] = Counter()
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for number, case in enumerate(cases):
            state = f"sqlite:///{Path(tmp) / f'{number}.db'}"
            ours = await run(case, SitemapPagesSpider,
                             {**BASE_SETTINGS, "INCREMENTAL_STATE_URI": state})
            plain = await run(case, PlainSitemapSpider,
                              {**BASE_SETTINGS, "INCREMENTAL_ENABLED": False})
            expected = set(case.expected)
            total[case.suite] += 1
            ours_ok[case.suite] += ours == expected
            plain_ok[case.suite] += plain == expected
            for who, got in (("ours", ours), ("plain Scrapy", plain)):
                if got != expected:
                    failures.append(f"  {case.name} ({case.suite}), {who}: requested "
                                    f"{sorted(got)}, expected {sorted(expected)}")
    rows = [(suite, total[suite], ours_ok[suite], plain_ok[suite]) for suite in total]
    rows.append(("all", sum(total.values()), sum(ours_ok.values()), sum(plain_ok.values())))
    widths = [max(len(str(r[i])) for r in [("source suite", "cases", "ours", "plain Scrapy"),
                                            *rows]) for i in range(4)]
    for row in [("source suite", "cases", "ours", "plain Scrapy"), *rows]:
        print("  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w)
                        for i, (v, w) in enumerate(zip(row, widths, strict=True))))
    if failures:
        print("\nfailed:")
        print("\n".join(failures))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", help="run this case only")
    return parser.parse_args()


if __name__ == "__main__":
    options = _parse_args()
    task.react(lambda _reactor: defer.ensureDeferred(main(options)))
