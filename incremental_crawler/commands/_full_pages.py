"""What Scrapy's commands that fetch a page to look at it share here:
nothing incremental.

``scrapy shell``, ``fetch``, ``view``, ``parse`` and ``check`` fetch a page
to show it, or to run a callback or a contract on it. With the add-on on,
a stored ETag would turn that page into a 304 without a body, a page
fetched recently would not be asked at all (not due), and what they fetch
would be recorded in the spider's scope as a crawl's visit: the next real
crawl would then leave the page out as not due, its items never delivered.
Each of these commands sets ``INCREMENTAL_ENABLED`` to ``False`` unless the
command line set it.

They are registered through the package's ``scrapy.commands`` entry point,
so they replace Scrapy's in every project of the environment: where the
project's settings (and the command line's) do not enable the add-on, they
set nothing and are Scrapy's commands as they are. A project that enables
the add-on only through its spiders (``IncrementalSpider``, or a spider's
``custom_settings``) is not seen here, before any spider is loaded: there,
``-s INCREMENTAL_ENABLED=False`` does it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.settings import SETTINGS_PRIORITIES

from incremental_crawler.addon import addon_enabled

if TYPE_CHECKING:
    import argparse

    from scrapy.settings import Settings

__all__ = ["NothingKept"]


class NothingKept:
    """Mixed into a Scrapy command (before it): INCREMENTAL_ENABLED off
    where the add-on is enabled, unless the command line set it."""

    settings: Settings | None

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)  # type: ignore[misc]
        assert self.settings is not None
        if not addon_enabled(self.settings):
            return
        if (self.settings.getpriority("INCREMENTAL_ENABLED") or 0) < SETTINGS_PRIORITIES["cmdline"]:
            self.settings.set("INCREMENTAL_ENABLED", False, priority="cmdline")
