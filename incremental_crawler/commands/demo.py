"""``scrapy demo``: an incremental re-crawl, end to end, with no network.

Serves a small bundled site on loopback, crawls it with the ``sitemap``
spider, changes a few pages, crawls it again, and prints what the second
crawl saved. Each crawl writes its HTML and JSON report
(``INCREMENTAL_REPORT_DIR``) into a directory the demo prints. The state
lives in a fresh SQLite store (a temporary directory unless
``--state-uri`` names one), so the demo never touches a real crawl's
state.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from scrapy.commands import ScrapyCommand
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from twisted.internet.defer import Deferred

from incremental_crawler._reactor import get_reactor
from incremental_crawler.formats import shares
from incremental_crawler.report.extension import summarize
from incremental_crawler.report.files import ReportFiles
from incremental_crawler.report.page import INSTALL_REPORT
from incremental_crawler.spiders.sitemap import SitemapPagesSpider

if TYPE_CHECKING:
    import argparse

    from scrapy.crawler import Crawler

    from incremental_crawler.demo import DemoSite


async def _wait(result: Any) -> Any:
    # Crawler processes return Deferreds (Twisted) or futures (asyncio).
    if isinstance(result, Deferred):
        return await maybe_deferred_to_future(result)
    return await result


class Command(ScrapyCommand):
    requires_project = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_LEVEL": "WARNING"}

    def syntax(self) -> str:
        return "[--pages N] [--change FRACTION] [--state-uri URI] [--report-dir DIR]"

    def short_desc(self) -> str:
        return "Crawl a bundled loopback site twice and show what incremental crawling saves"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--pages", type=int, default=60, help="pages on the demo site (60)")
        parser.add_argument("--change", type=float, default=0.05,
                            help="share of pages changed between the crawls (0.05)")
        parser.add_argument("--state-uri", default=None,
                            help="state store to use (default a new one in a temp dir)")
        parser.add_argument("--report-dir", default=None,
                            help="where each crawl writes report.html and report.json "
                                 "(default: a new temp dir)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        # Imported here: Scrapy imports every command's module on every
        # ``scrapy`` call, and the demo site brings in Twisted's web server.
        from incremental_crawler.demo import DemoSite  # noqa: PLC0415

        assert self.crawler_process is not None
        work = Path(tempfile.mkdtemp(prefix="incremental-demo-"))
        state_uri = opts.state_uri or f"sqlite:///{work / 'state.db'}"
        report_dir = Path(opts.report_dir or work / "report").resolve()
        site = DemoSite(opts.pages, page_size=12_000)
        base = site.start()
        out = sys.stdout
        out.write(
            f"incremental_crawler demo: {opts.pages} pages served on {base} "
            "(strong ETags, weak ETags, Last-Modified only, no validators)\n"
            f"state store: {state_uri}\n\n"
        )
        process = self.crawler_process
        # The demo site is local and answers in a millisecond: start its
        # politeness window at 50 requests/s instead of 4.
        settings = {"INCREMENTAL_STATE_URI": state_uri, "LOGSTATS_INTERVAL": 0,
                    "INCREMENTAL_REPORT_DIR": str(report_dir),
                    "INCREMENTAL_THROTTLE_START_RATE": 50, "INCREMENTAL_THROTTLE_MAX_RATE": 200}
        results: dict[str, Any] = {}

        async def crawl(label: str) -> None:
            crawler: Crawler = process.create_crawler(SitemapPagesSpider)
            crawler.settings.setdict(settings, priority="cmdline")
            site.reset_log()
            await _wait(process.crawl(crawler, sitemap_url=f"{base}/robots.txt"))
            results[label] = self._figures(crawler, site)
            files = crawler.get_extension(ReportFiles)
            # This crawl's own section of report.html, named after its
            # timestamped JSON (report.html shows the latest crawl first).
            results[f"{label}_report"] = next(
                (name.removesuffix(".json") for name in (files.written if files else ())
                 if name.endswith(".json") and name != "report.json"), None)

        async def scenario() -> None:
            try:
                await crawl("first")
                results["changed"] = site.change_fraction(opts.change, seed=7)
                await crawl("second")
            finally:
                await _wait(site.stop())
                reactor = get_reactor()
                reactor.callLater(0, reactor.stop)

        deferred_from_coro(scenario())
        process.start(stop_after_crawl=False)
        if "second" not in results:
            out.write("the demo did not complete; see the log above\n")
            self.exitcode = 1
            return
        self._report(out, results, state_uri)
        if not (report_dir / "report.html").exists():
            # No plotly (the package's report extra): the JSON was written.
            out.write(f"crawl report (JSON; the page needs {INSTALL_REPORT}): "
                      f"{(report_dir / 'report.json').as_uri()}\n")
            return
        out.write(f"crawl report (charts, per-host table, both crawls' history): "
                  f"{(report_dir / 'report.html').as_uri()}\n")
        if results["first_report"] is not None:
            # The cold crawl's slot charts show the window climbing; the
            # second crawl mostly skips and lasts a fraction of a second.
            out.write(f"crawl 1's report (the cold crawl's politeness charts): "
                      f"{(report_dir / 'report.html').as_uri()}#{results['first_report']}\n")

    @staticmethod
    def _figures(crawler: Crawler, site: DemoSite) -> dict[str, Any]:
        assert crawler.stats is not None
        page_records = [r for r in site.log if r.path.startswith("/p/")]
        return {
            **summarize(crawler.stats.get_stats()),
            "server_requests": len(page_records),
            "server_bytes": sum(r.body_bytes for r in page_records),
            "server_304": sum(1 for r in page_records if r.status == 304),
            "items": crawler.stats.get_value("item_scraped_count", 0),
        }

    @staticmethod
    def _report(out: Any, results: dict[str, Any], state_uri: str) -> None:
        first, second, changed = results["first"], results["second"], results["changed"]
        # Crawl 2's figures are its end-of-crawl report's, in its words:
        # every known page in one column, the shares of a full re-crawl.
        shares_line = shares(second["bytes_downloaded"],
                             second["bytes_saved_estimate"] + second["bytes_skipped"])
        out.write(
            f"crawl 1 (cold):        {first['server_requests']} pages fetched, "
            f"{first['items']} items stored, {first['server_bytes']:,} body bytes\n"
            f"changed on the site:   {len(changed)} pages ({', '.join(changed)})\n"
            f"crawl 2 (incremental): {_count(second['sitemaps_unchanged'], 'unchanged sitemap')} "
            "not read; of the "
            f"{second['pages_known']} known pages, {second['skipped_lastmod']} skipped\n"
            "                       (sitemap lastmod not newer than stored), "
            f"{second['not_due']} not due (in no sitemap read, no revisit due),\n"
            f"                       {second['pages_checked']} pages checked, "
            f"{second['pages_not_modified']} not modified (304), "
            f"{second['pages_changed']} changed, "
            f"{second['pages_page_changed']} page changed, items unchanged, "
            f"{second['pages_unchanged']} unchanged in full (no validators to ask with)\n"
            f"                       {second['items']} items stored "
            f"({second['items_changed']} changed, {second['items_new']} new), "
            f"{second['items_unchanged']} unchanged items dropped\n"
            f"                       bytes downloaded {second['bytes_downloaded']:,}: "
            f"{shares_line}\n\n"
            f"every stored item: scrapy items -o items.jsonl "
            f"-s INCREMENTAL_STATE_URI={state_uri}\n"
        )


def _count(n: int, noun: str) -> str:
    """*n* and *noun*, plural unless *n* is 1."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
