"""MetricsEndpoint: serves a crawl's metrics to Prometheus while it runs.

Off unless ``INCREMENTAL_METRICS_PORT`` is set. Then, when the spider
opens, it listens on the first free port of that range (on
``INCREMENTAL_METRICS_HOST``) with a small ``twisted.web`` site on the
crawl's own reactor, and answers ``GET /metrics`` in Prometheus's text
format (or OpenMetrics, if the scraper asks for it). Several crawls on one
host (scrapyd jobs, cluster workers, crawlers of one process) each take
their own port of the range. The chosen port is logged, kept in the
``incremental/metrics/port`` stat and, with
``INCREMENTAL_METRICS_TARGETS_DIR``, written as a Prometheus ``file_sd``
target file (removed when the crawl ends). A range with no free port, or a
host that cannot be listened on, is a warning and the
``incremental/metrics/unavailable`` stat: the crawl goes on without metrics.

Each crawl has its own ``CollectorRegistry`` (not prometheus_client's
global one): two crawlers in one process must not mix their figures. The
scrape is answered in the reactor thread (prometheus_client's own Twisted
resource runs the registry in a thread pool), because the collector reads
the crawl's live objects, which only the reactor thread may touch.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
from typing import TYPE_CHECKING

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.defer import maybeDeferred
from twisted.internet.error import CannotListenError
from twisted.protocols.policies import WrappingFactory

from incremental_crawler._reactor import get_reactor
from incremental_crawler.config import (
    IncrementalConfig,
    MetricsSettings,
    SettingError,
    port_range,
)
from incremental_crawler.crawl.ledger import Ledger

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Self

    from scrapy import Spider
    from scrapy.crawler import Crawler

    from incremental_crawler._reactor import ListeningPort

__all__ = ["MetricsEndpoint", "MetricsSettings", "port_range"]

logger = logging.getLogger(__name__)

#: Hosts that mean "every interface": the target written for Prometheus
#: names the machine instead.
_WILDCARDS = {"", "0.0.0.0", "::"}  # noqa: S104 (compared with, not bound)


def _host_unusable(error: OSError | None) -> bool:
    """Whether a failed listen says the host cannot be listened on at all
    (not an address of this machine, not an address), whatever the port."""
    return isinstance(error, socket.gaierror) or getattr(error, "errno", None) in {
        errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT}


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class MetricsEndpoint:
    """See the module docstring; settings ``INCREMENTAL_METRICS_*``."""

    def __init__(self, crawler: Crawler, config: MetricsSettings) -> None:
        from prometheus_client import CollectorRegistry  # noqa: PLC0415 (opt-in)

        self.crawler = crawler
        self.config = config
        self.registry = CollectorRegistry(auto_describe=False)
        self.port: ListeningPort | None = None
        self._connections: WrappingFactory | None = None
        #: Where the metrics are served (None: not served).
        self.url: str | None = None
        #: The file_sd target file written for this crawl, if any.
        self.targets_file: Path | None = None
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.stop, signal=signals.spider_closed)
        # In case the spider never closes (its opening failed).
        crawler.signals.connect(self.stop, signal=signals.engine_stopped)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = IncrementalConfig.from_settings(crawler.settings).metrics
        if config is None:
            raise NotConfigured  # off by default: no "Disabled" warning
        try:
            import prometheus_client  # noqa: F401, PLC0415 (opt-in)
        except ImportError:
            # An extra of the package: a plain `pip install incremental-crawler`
            # has no prometheus_client.
            raise SettingError("INCREMENTAL_METRICS_PORT is set but the prometheus_client "
                               "package is not installed: pip install "
                               "'incremental-crawler[metrics]'") from None
        return cls(crawler, config)

    def spider_opened(self, spider: Spider) -> None:
        from incremental_crawler.metrics.collector import CrawlCollector  # noqa: PLC0415

        stats = self.crawler.stats
        assert stats is not None
        # Set by the cluster coordinator when the worker joined its run.
        worker = stats.get_value("cluster/worker")
        ledger = self.crawler.get_extension(Ledger)
        info = {"spider": spider.name,
                "scope": ledger.scope if ledger is not None else spider.name}
        job = getattr(spider, "_job", None)  # scrapyd passes -a _job=<job id>
        if job:
            info["scrapyd_job"] = str(job)
        self.registry.register(CrawlCollector(
            self.crawler, slots=self.config.slots,
            constant={"worker": str(worker)} if worker else {}, info=info))
        self._listen()

    def _listen(self) -> None:
        # Twisted's web server, imported when metrics are on only.
        from incremental_crawler.metrics.site import metrics_site  # noqa: PLC0415

        stats = self.crawler.stats
        assert stats is not None
        # The wrapper keeps the open connections, for stop() to close them.
        connections = WrappingFactory(metrics_site(self.registry, self._scraped))
        connections.noisy = False
        host = self.config.host
        first, last = self.config.ports
        error: OSError | None = None
        for number in range(first, last + 1):
            try:
                self.port = get_reactor().listenTCP(number, connections, interface=host)
                break
            except CannotListenError as exc:
                error = exc.socketError
                if _host_unusable(error):
                    break  # the next port would fail the same way
        if self.port is None:
            ports = str(first) if first == last else f"{first}-{last}"
            values = {"ports": ports, "host": host, "error": error}
            if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
                logger.warning(
                    "No metrics for this crawl: no port of INCREMENTAL_METRICS_PORT %(ports)s "
                    "could be opened on %(host)s (%(error)s); widen the range, one port per "
                    "crawl running at once on this host", values)
            else:
                logger.warning(
                    "No metrics for this crawl: cannot listen on INCREMENTAL_METRICS_HOST "
                    "%(host)s, INCREMENTAL_METRICS_PORT %(ports)s (%(error)s); check both "
                    "settings", values)
            stats.set_value("incremental/metrics/unavailable", 1)
            return
        self._connections = connections
        port = self.port.getHost().port
        self.url = f"http://{_hostport(host, port)}/metrics"
        stats.set_value("incremental/metrics/port", port)
        logger.info("Metrics for Prometheus at %(url)s", {"url": self.url})
        if self.config.targets_dir is not None:
            self._write_targets(self.config.targets_dir, port)

    def _scraped(self) -> None:
        stats = self.crawler.stats
        assert stats is not None
        stats.inc_value("incremental/metrics/scrapes")

    def _write_targets(self, directory: Path, port: int) -> None:
        """One Prometheus file_sd file for this crawl: ``<hostname>-<port>.json``.

        Named by host and port: unique among the crawls running on a host,
        and a killed crawl's file is replaced by the next crawl on its port.
        Written whole and renamed, as Prometheus may read it at any moment.
        """
        machine = socket.gethostname()
        address = machine if self.config.host in _WILDCARDS else self.config.host
        path = directory / f"{machine}-{port}.json"
        staged = directory / f".{path.name}.tmp"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            staged.write_text(json.dumps([{"targets": [_hostport(address, port)],
                                           "labels": {}}]) + "\n", encoding="utf-8")
            staged.replace(path)
        except OSError as exc:
            logger.warning("Cannot write the Prometheus target file %(path)s: %(exc)s",
                           {"path": path, "exc": exc})
            assert self.crawler.stats is not None
            self.crawler.stats.set_value("incremental/metrics/targets_error", str(exc))
            return
        self.targets_file = path

    async def stop(self) -> None:
        """Stop listening, close the scrapers' connections, remove the target file."""
        if self.targets_file is not None:
            try:
                self.targets_file.unlink(missing_ok=True)
            except OSError as exc:
                # Still stop listening below: a port kept would serve a
                # finished crawl's figures for as long as the process runs.
                logger.warning("Cannot remove the Prometheus target file %(path)s: %(exc)s",
                               {"path": self.targets_file, "exc": exc})
            self.targets_file = None
        port, connections = self.port, self._connections
        self.port = self._connections = None
        if port is None:
            return
        for wrapper in list(connections.protocols if connections else ()):
            wrapper.transport.loseConnection()
        await maybe_deferred_to_future(maybeDeferred(port.stopListening))
