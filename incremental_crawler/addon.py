"""One line in ``ADDONS`` makes a Scrapy project incremental.

``ADDONS = {"incremental_crawler.addon.IncrementalAddon": 0}`` wires every
component at the order it needs and installs the ``INCREMENTAL_*`` defaults
without overriding anything the project set itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.settings import default_settings
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import load_object

from incremental_crawler.cluster import apply_cluster_settings
from incremental_crawler.config import DEFAULT_SETTINGS, throttle_enabled
from incremental_crawler.http.long_header import install as install_long_header
from incremental_crawler.politeness.robots import SCRAPY_ROBOTSTXT
from incremental_crawler.politeness.robots_parser import RFC9309_PARSER

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings, Settings

__all__ = ["COMPONENTS", "IncrementalAddon", "addon_enabled"]

_P = "incremental_crawler."
PACED_DOWNLOADER = _P + "politeness.downloader.PacedDownloader"

#: (setting, component, order). Orders matter, see each module's docstring.
COMPONENTS: tuple[tuple[str, str, int], ...] = (
    # Owns the state store; an extension, so it exists before the
    # middlewares and pipelines that look it up (crawler.get_extension).
    ("EXTENSIONS", _P + "crawl.ledger.Ledger", 0),
    ("DOWNLOADER_MIDDLEWARES",
     _P + "crawl.conditional.ConditionalRequestMiddleware", 585),
    # Outermost spider middleware but the not-due filter (which drops
    # requests only): sees exactly the items that reach the pipelines.
    ("SPIDER_MIDDLEWARES", _P + "crawl.callback_output.PageOutputMiddleware", 1),
    # Outside PageOutputMiddleware: a not-due request it drops is still
    # recorded among its page's links.
    ("SPIDER_MIDDLEWARES", _P + "crawl.due_filter.NotDueFilterMiddleware", 0),
    # Outermost: the stored versions a killed crawl never delivered come out
    # of start() before anything of the spider's (items only: no other
    # spider middleware has anything to do with them).
    ("SPIDER_MIDDLEWARES", _P + "crawl.delivery.RedeliveryMiddleware", -1),
    # Outside every spider middleware that may read the response (only the
    # two above, which never do, are further out): frees the response's
    # parsed tree once its output went through them all.
    ("SPIDER_MIDDLEWARES", _P + "parsed_trees.ParsedTreeReleaseMiddleware", 2),
    # Innermost: the last input check before the callback, the first to see
    # the callback's exceptions.
    ("SPIDER_MIDDLEWARES", _P + "crawl.callback_output.CallbackGuardMiddleware", 10_000),
    ("ITEM_PIPELINES", _P + "crawl.fingerprint_pipeline.FingerprintPipeline", 50),
    ("ITEM_PIPELINES", _P + "crawl.storage_pipeline.StoragePipeline", 900),
    ("EXTENSIONS", _P + "report.extension.IncrementalReport", 500),
    # Hands the ledger the crawl's summary record (through its record
    # sources, asked just before the store closes): any order works.
    ("EXTENSIONS", _P + "report.history.CrawlHistory", 500),
    # report.html and report.json (INCREMENTAL_REPORT_DIR): reads the store
    # through the ledger's record sources, writes when the engine stops.
    ("EXTENSIONS", _P + "report.files.ReportFiles", 500),
    # Re-seeds due pages when the crawl runs out of work; finds the ledger
    # (and the cluster coordinator) when it needs them, so any order works.
    ("EXTENSIONS", _P + "crawl.reseed.Reseeder", 10),
    # Between RetryMiddleware (550) and MetaRefresh (580): 429/503 never
    # reach the retry budget.
    ("DOWNLOADER_MIDDLEWARES",
     _P + "politeness.middlewares.RetryAfterMiddleware", 575),
    ("EXTENSIONS", _P + "politeness.extension.AdaptiveThrottle", 0),
    # Below RetryMiddleware (550) and the Retry-After one (575): sees only
    # final answers and exceptions, and records the failed pages.
    ("DOWNLOADER_MIDDLEWARES", _P + "crawl.outcomes.FinalOutcomeMiddleware", 540),
    # Just below it: a 206 no one asked for, recorded as a failure there,
    # is dropped before any callback makes an item of half a page.
    ("DOWNLOADER_MIDDLEWARES", _P + "change.partial.UnaskedPartialMiddleware", 530),
    # Just above RedirectMiddleware (600): sees a known page's 301 or 308
    # before it is followed (the page moved: its tombstone).
    ("DOWNLOADER_MIDDLEWARES", _P + "crawl.outcomes.MovedPageMiddleware", 605),
    # Live metrics (off unless INCREMENTAL_METRICS_PORT is set); reads the
    # other components when scraped, so any order works.
    ("EXTENSIONS", _P + "metrics.endpoint.MetricsEndpoint", 500),
    # The last process_request before the downloader (after HttpCache, 900):
    # only what really goes out takes a token of the shared budget.
    ("DOWNLOADER_MIDDLEWARES",
     _P + "politeness.middlewares.SharedBudgetMiddleware", 950),
)


class IncrementalAddon:
    """Scrapy add-on; see the module docstring."""

    def update_settings(self, settings: Settings) -> None:
        # A response header line over 16384 bytes fails naming its cause,
        # not as "Connection was closed cleanly".
        install_long_header()
        for name, value in DEFAULT_SETTINGS.items():
            settings.set(name, value, priority="addon")
        for setting, path, order in COMPONENTS:
            settings[setting].set(path, order, priority="addon")
        apply_cluster_settings(settings)
        if throttle_enabled(settings):
            # Ours is built on it and replaces it.
            settings["EXTENSIONS"].set(
                "scrapy.extensions.throttle.AutoThrottle", None, priority="addon"
            )
            # Fast slots send their requests in groups (same rate, fewer
            # wake-ups), unless the project has a downloader of its own.
            if settings["DOWNLOADER"] == default_settings.DOWNLOADER:
                settings.set("DOWNLOADER", PACED_DOWNLOADER, priority="addon")
        # robots.txt answering 5xx or not at all means complete disallow
        # (RFC 9309), not "allow all": ours replaces Scrapy's, at its order,
        # unless the project configured Scrapy's itself.
        if SCRAPY_ROBOTSTXT not in settings["DOWNLOADER_MIDDLEWARES"]:
            settings["DOWNLOADER_MIDDLEWARES"].set(SCRAPY_ROBOTSTXT, None, priority="addon")
            settings["DOWNLOADER_MIDDLEWARES"].set(
                _P + "politeness.robots.RobotsTxtMiddleware", 100, priority="addon")
        # robots.txt grouped as RFC 9309 says (Protego splits a group at an
        # unknown line, and matches a user-agent value with a space as a
        # whole): measured in bench/robots_parsers.py. A project's own
        # ROBOTSTXT_PARSER wins.
        settings.set("ROBOTSTXT_PARSER", RFC9309_PARSER, priority="addon")
        # Scrapy's periodic line, with our figures added to it.
        settings["EXTENSIONS"].set("scrapy.extensions.logstats.LogStats", None, priority="addon")
        settings["EXTENSIONS"].set(
            _P + "report.extension.IncrementalLogStats", 0, priority="addon"
        )


def addon_enabled(settings: BaseSettings) -> bool:
    """Whether *settings*' ``ADDONS`` enable :class:`IncrementalAddon` (or a
    subclass of it).

    The commands that replace Scrapy's are registered for every project in
    the environment (a ``scrapy.commands`` entry point): where this is
    false they are Scrapy's own.
    """
    for addon in build_component_list(settings["ADDONS"]):
        cls = load_object(addon) if isinstance(addon, str) else addon
        if isinstance(cls, type) and issubclass(cls, IncrementalAddon):
            return True
    return False
