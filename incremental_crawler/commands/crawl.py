"""``scrapy crawl``, with a non-zero exit status when the crawl could not go on.

Scrapy's own command exits with 1 only when the crawl could not start, and
then prints the error as "Task exception was never retrieved" with its
chained traceback. This one logs an error of
:data:`~incremental_crawler.fatal.FATAL_ERRORS` as the one line it is, and
exits with :data:`~incremental_crawler.fatal.FATAL_STATUS` after a crawl
that was stopped because it could not go on
(:data:`~incremental_crawler.fatal.FATAL_REASONS`) as well. Everything else
is Scrapy's command unchanged.

It is registered through the package's ``scrapy.commands`` entry point, so
it replaces Scrapy's in every project of the environment, with or without
the add-on: where the crawl's settings (the project's, the command line's
and the spider's own, as an ``IncrementalSpider`` adds the add-on) do not
enable the add-on, it runs Scrapy's command as it is, exit status and
error output included.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from scrapy.commands.crawl import Command as ScrapyCrawlCommand
from scrapy.exceptions import UsageError
from twisted.internet.defer import Deferred

from incremental_crawler.addon import addon_enabled
from incremental_crawler.commands._in_project import InProject
from incremental_crawler.config import SettingError
from incremental_crawler.fatal import FATAL_ERRORS, exit_status

if TYPE_CHECKING:
    import argparse

    from twisted.python.failure import Failure

__all__ = ["Command"]

logger = logging.getLogger(__name__)


def _report(exc: BaseException) -> None:
    if isinstance(exc, SettingError):
        logger.error("Invalid setting: %(error)s", {"error": exc})
    elif isinstance(exc, FATAL_ERRORS):
        # Its message names the cause and the file, setting or server.
        logger.error("%(error)s", {"error": exc})
    else:
        logger.error("The crawl could not start", exc_info=exc)


class Command(InProject, ScrapyCrawlCommand):
    """See the module docstring."""

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if len(args) < 1:
            raise UsageError
        if len(args) > 1:
            raise UsageError(
                "running 'scrapy crawl' with more than one spider is not supported"
            )
        assert self.crawler_process
        crawler = self._create_crawler(args[0])
        if not addon_enabled(crawler.settings):
            # Scrapy's crawl command, line for line: a project without the
            # add-on must not see a difference.
            self.crawler_process.crawl(crawler, **opts.spargs)
            self.crawler_process.start()
            if self.crawler_process.bootstrap_failed:
                self.exitcode = 1
            return
        running: Any = self.crawler_process.crawl(crawler, **opts.spargs)
        # Take the error from the crawl's task (or Deferred), so that it is
        # reported here, once, instead of as an unretrieved exception.
        if isinstance(running, asyncio.Future):
            running.add_done_callback(self._task_done)
        elif isinstance(running, Deferred):
            running.addErrback(self._deferred_failed)
        self.crawler_process.start()
        self.exitcode = exit_status(
            crawler, started=not self.crawler_process.bootstrap_failed)

    @staticmethod
    def _task_done(task: asyncio.Future[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            _report(exc)

    @staticmethod
    def _deferred_failed(failure: Failure) -> None:
        assert failure.value is not None
        _report(failure.value)
