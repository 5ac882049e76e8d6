"""Live metrics: /metrics scraped over TCP by a real HTTP client while the crawl runs.

The scrape is made from the crawl itself, once it is idle: the spider then
asks for a probe page, whose callback scrapes the crawl's own endpoint with
``urllib`` (in a thread: the reactor must stay free to answer). At that
moment every page of the crawl is settled and the crawl is still running,
so the figures must be exactly what the server saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families
from scrapy import Request, signals
from scrapy.crawler import CrawlerRunner
from scrapy.exceptions import DontCloseSpider
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from incremental_crawler.meta import META_SKIP
from incremental_crawler.metrics.collector import METRICS
from incremental_crawler.metrics.endpoint import MetricsEndpoint
from incremental_crawler.spiders import IncrementalSpider
from tests.cluster_worker import Worker
from tests.conftest import crawl_settings
from tests.site import LoopbackSite
from tests.spiders import ListSpider

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


#: Politeness on (the per-slot windows are what is measured), fast on loopback.
POLITE = {"INCREMENTAL_THROTTLE_ENABLED": True, "INCREMENTAL_THROTTLE_START_RATE": 50,
          "INCREMENTAL_THROTTLE_MAX_RATE": 100}


def free_ports(count: int) -> tuple[int, int]:
    """A range of *count* ports free on 127.0.0.1 now (below Linux's
    ephemeral range, so that no outgoing connection takes one meanwhile)."""
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(20_000, 32_000)
        sockets = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return first, first + count - 1
    raise AssertionError("no free range of ports found")


def fetch(url: str) -> str:
    """GET *url* with urllib (no proxy: loopback only)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return response.read().decode()


class Scrape:
    """The samples of one scrape, parsed by prometheus_client's own parser."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.types: dict[str, str] = {}
        self.samples: list[tuple[str, dict[str, str], float]] = []
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            self.samples += [(s.name, s.labels, s.value) for s in family.samples]

    def matching(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        return [(have, value) for sample, have, value in self.samples
                if sample == name and labels.items() <= have.items()]

    def value(self, name: str, **labels: str) -> float:
        found = self.matching(name, **labels)
        assert len(found) == 1, (name, labels, found)
        return found[0][1]

    def total(self, name: str, **labels: str) -> float:
        return sum(value for _, value in self.matching(name, **labels))

    def label_values(self, name: str, label: str) -> set[str]:
        return {have[label] for have, _ in self.matching(name)}


class ProbeSpider(IncrementalSpider):
    """Fetches its pages one after the other (each page's callback asks for
    the next; a 304 replays that request). Once the crawl is idle it asks
    for one more page, ``probe`` (opted out of incremental handling, so
    always fetched in full), whose callback scrapes the crawl's metrics."""

    name = "probe"

    def __init__(self, urls: list[str], probe: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.urls = urls
        self.probe_url = probe
        self.scrapes: list[Scrape] = []
        self.probed = False

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.idle, signal=signals.spider_idle)
        return spider

    async def start(self):
        yield Request(self.urls[0])

    def parse(self, response) -> Iterator[Any]:
        yield {"url": response.url, "title": response.css("title::text").get()}
        position = self.urls.index(response.url)
        if position + 1 < len(self.urls):
            yield Request(self.urls[position + 1])

    def idle(self) -> None:
        if self.probed:
            return
        self.probed = True
        self.crawler.engine.crawl(Request(self.probe_url, callback=self.probe,
                                          meta={META_SKIP: True}, dont_filter=True))
        raise DontCloseSpider

    async def probe(self, response) -> None:
        url = self.crawler.get_extension(MetricsEndpoint).url
        if url is not None:
            self.scrapes.append(Scrape(await asyncio.to_thread(fetch, url)))


def page_paths(n: int) -> list[str]:
    return [f"/p/{i:04d}" for i in range(n)]


async def run(spidercls, state_uri: str, settings: dict[str, Any], **kwargs: Any):
    runner = CrawlerRunner(crawl_settings(state_uri, **settings))
    crawler = runner.create_crawler(spidercls)
    await runner.crawl(crawler, **kwargs)
    return crawler


@pytest_twisted.ensureDeferred
async def test_a_scrape_during_the_crawl_reports_what_the_server_saw(site, state_uri, caplog):
    paths = page_paths(12)
    for path in paths:
        site.add_page(path, "strong", size=3000)
    site.add_page("/probe", "none", size=500)
    caplog.set_level(logging.INFO, logger="incremental_crawler.metrics")
    first, last = free_ports(3)
    settings = {**POLITE, "INCREMENTAL_METRICS_PORT": f"{first}-{last}"}
    urls = [site.url(p) for p in paths]
    n = len(paths)

    crawler = await run(ProbeSpider, state_uri, settings, urls=urls, probe=site.url("/probe"))
    (scrape,) = crawler.spider.scrapes
    stats = crawler.stats.get_stats()
    port = stats["incremental/metrics/port"]
    assert first <= port <= last
    assert f"Metrics for Prometheus at http://127.0.0.1:{port}/metrics" in caplog.text
    assert stats["incremental/metrics/scrapes"] == 1
    # Types and names as Prometheus expects them.
    assert scrape.types["incremental_requests"] == "counter"
    assert scrape.types["incremental_slot_window_requests_per_second"] == "gauge"
    # Every metric of the list, and no other, with its type (the text
    # format shows an info metric as a gauge of 1, a counter without _total).
    assert scrape.types == {name.removesuffix("_total"): "gauge" if kind == "info" else kind
                            for name, kind, _labels, _meaning in METRICS}
    assert scrape.value("incremental_crawl_info") == 1
    assert scrape.matching("incremental_crawl_info")[0][0] == {"spider": "probe",
                                                               "scope": "probe"}
    # Every request the server saw (robots.txt, the pages, the probe) went
    # through the one slot, and every answer was a 200.
    served = len(site.log)
    assert served == n + 2
    assert scrape.value("incremental_slot_requests_total", slot="127.0.0.1") == served
    assert scrape.value("incremental_slot_responses_total", slot="127.0.0.1") == served
    assert scrape.value("incremental_responses_total", status="200") == served
    assert scrape.total("incremental_slot_errors_total") == 0
    assert scrape.value("incremental_slots") == 1
    assert scrape.value("incremental_slot_window_requests_per_second", slot="127.0.0.1") > 0
    assert scrape.value("incremental_slot_latency_p50_seconds", slot="127.0.0.1") > 0
    assert scrape.value("incremental_slot_frozen", slot="127.0.0.1") == 0
    # The incremental figures: every page new, none conditional.
    assert scrape.value("incremental_requests_total", kind="page", reason="new") == n
    assert scrape.total("incremental_requests_total") == n
    assert scrape.value("incremental_known_pages_total", decision="new") == n
    assert scrape.value("incremental_pages_total", outcome="new") == n
    assert scrape.value("incremental_items_total", outcome="new") == n
    assert scrape.total("incremental_not_modified_total") == 0
    assert scrape.value("incremental_downloaded_bytes_total") >= site.body_bytes()
    assert scrape.total("incremental_errors_total") == 0
    # Every new page's state is staged or already committed (which, depends
    # on when the store flushed); the end's count takes in the scrape's.
    written = scrape.value("incremental_store_writes_total")
    assert written + scrape.value("incremental_store_pending_writes") >= n
    assert stats["incremental/store_writes"] >= max(written, n)
    assert scrape.value("incremental_store_roundtrips_total") == 0  # SQLite: none

    # Second crawl, one page changed: 304s for the others.
    site.change(paths[-1])
    site.reset_log()
    crawler = await run(ProbeSpider, state_uri, settings, urls=urls, probe=site.url("/probe"))
    (scrape,) = crawler.spider.scrapes
    stats = crawler.stats.get_stats()
    # The first crawl let its port go when it closed: the second took it again.
    assert stats["incremental/metrics/port"] == port
    not_modified = site.count(status=304)
    assert not_modified == n - 1
    assert scrape.value("incremental_not_modified_total", kind="page") == not_modified
    assert scrape.value("incremental_requests_total", kind="page",
                        reason="conditional") == n
    assert scrape.value("incremental_pages_total", outcome="changed") == 1
    assert scrape.value("incremental_pages_total", outcome="unchanged") == 0
    assert scrape.value("incremental_items_total", outcome="changed") == 1
    assert scrape.value("incremental_saved_bytes_total", by="not_modified") == stats[
        "incremental/bytes_saved_estimate"] > 0
    # A new crawl, a new registry: its own requests only.
    assert scrape.value("incremental_slot_requests_total", slot="127.0.0.1") == len(site.log)
    assert scrape.value("incremental_responses_total", status="304") == not_modified


@pytest_twisted.ensureDeferred
async def test_crawls_at_once_take_their_own_ports_and_one_without_a_port_goes_on(
    site, tmp_path, caplog
):
    """Three crawls at once in one process, on a range of two ports: two
    serve their metrics (each its own), the third crawls without."""
    paths = page_paths(6)
    for path in paths:
        site.add_page(path, "strong", size=2000)
    site.add_page("/probe", "none", size=500)
    # Slow pages: the three crawls overlap.
    site.slow("/p/", 0.1)
    first, last = free_ports(2)
    crawls = []
    for i in range(3):
        settings = {**POLITE, "INCREMENTAL_METRICS_PORT": [first, last]}
        runner = CrawlerRunner(crawl_settings(f"sqlite:///{tmp_path / f'{i}.db'}", **settings))
        crawler = runner.create_crawler(ProbeSpider)
        crawls.append((crawler, runner.crawl(crawler, urls=[site.url(p) for p in paths],
                                             probe=site.url("/probe"))))
    await defer.gatherResults([d for _, d in crawls], consumeErrors=True)

    crawlers = [crawler for crawler, _ in crawls]
    ports = [c.stats.get_value("incremental/metrics/port") for c in crawlers]
    served = sorted(p for p in ports if p is not None)
    assert served == [first, last]
    (without,) = [c for c in crawlers if c.stats.get_value("incremental/metrics/port") is None]
    assert without.stats.get_value("incremental/metrics/unavailable") == 1
    assert f"no port of INCREMENTAL_METRICS_PORT {first}-{last} could be opened" in caplog.text
    assert without.spider.scrapes == []
    for crawler in crawlers:
        # Every crawl got every page.
        assert crawler.stats.get_value("incremental/pages_new") == len(paths)
        if crawler is not without:
            (scrape,) = crawler.spider.scrapes
            # Its own figures: its own pages, its own slot's requests.
            assert scrape.value("incremental_pages_total", outcome="new") == len(paths)
            assert scrape.value("incremental_slot_requests_total",
                                slot="127.0.0.1") == len(paths) + 2


@pytest_twisted.ensureDeferred
async def test_slot_labels_are_capped_and_the_rest_summed_as_other(site, state_uri):
    sites = [site, LoopbackSite(host="127.0.0.2"), LoopbackSite(host="127.0.0.3")]
    for other in sites[1:]:
        other.start()
    try:
        for each in sites:
            for path in page_paths(2):
                each.add_page(path, "strong", size=1000)
        site.add_page("/probe", "none", size=500)
        # Four hosts: 127.0.0.1 and localhost (one site), 127.0.0.2, 127.0.0.3.
        urls = [site.url(p) for p in page_paths(2)]
        urls += [site.url(p).replace("127.0.0.1", "localhost") for p in page_paths(2)]
        urls += [each.url(p) for each in sites[1:] for p in page_paths(2)]
        first, _ = free_ports(1)
        crawler = await run(ProbeSpider, state_uri, {
            **POLITE, "INCREMENTAL_METRICS_PORT": first, "INCREMENTAL_METRICS_SLOTS": 2},
            urls=urls, probe=site.url("/probe"))
    finally:
        for other in sites[1:]:
            await other.stop()
    (scrape,) = crawler.spider.scrapes
    assert scrape.value("incremental_slots") == 4
    labels = scrape.label_values("incremental_slot_requests_total", "slot")
    assert len(labels) == 3
    assert "other" in labels
    # The busiest slot (its robots.txt, pages and the probe) has its own label.
    assert "127.0.0.1" in labels
    own_requests = sum(1 for r in site.log if r.headers["host"].startswith("127.0.0.1"))
    assert scrape.value("incremental_slot_requests_total", slot="127.0.0.1") == own_requests
    # Nothing is lost: the labels add up to every request of every host.
    assert scrape.total("incremental_slot_requests_total") == sum(len(s.log) for s in sites)
    for name in ("incremental_slot_window_requests_per_second",
                 "incremental_slot_responses_total", "incremental_slot_frozen"):
        assert scrape.label_values(name, "slot") == labels
    # Percentiles of several slots do not add up: none for other.
    assert "other" not in scrape.label_values("incremental_slot_latency_p50_seconds", "slot")


class AllAtOnceSpider(ProbeSpider):
    """Asks for all its pages at once: an error answer does not end the crawl."""

    name = "all_at_once"

    async def start(self):
        for url in self.urls:
            yield Request(url)

    def parse(self, response) -> Iterator[Any]:
        yield {"url": response.url}


@pytest_twisted.ensureDeferred
async def test_answers_the_metrics_cannot_label_or_time_keep_series_bounded_and_honest(
    site, state_uri
):
    """Numbers that are no HTTP status share one ``status="other"`` series (a
    server could otherwise make one per answer); a slot that only timed out
    has no latency samples (not a latency of 0); a scrapyd job id is on the
    crawl's info."""
    silent = LoopbackSite(host="127.0.0.2")
    silent.start()
    try:
        silent.add_page("/p/0000", "strong", size=1000)
        # Its robots.txt answers after the download timeout: the slot's only
        # answer is a timeout (and the page is then not asked for).
        silent.slow("/", 5.0)
        odd = (299, 600, 7777, 12345)
        for status in odd:
            site.add_page(f"/s/{status}", "strong", size=100)
            site.override(f"/s/{status}", status=status)
        site.add_page("/p/0000", "strong", size=1000)
        site.add_page("/probe", "none", size=500)
        urls = [site.url("/p/0000"), silent.url("/p/0000")]
        urls += [site.url(f"/s/{status}") for status in odd]
        first, _ = free_ports(1)
        crawler = await run(AllAtOnceSpider, state_uri, {
            **POLITE, "INCREMENTAL_METRICS_PORT": first, "DOWNLOAD_TIMEOUT": 1.0,
            "RETRY_ENABLED": False},
            urls=urls, probe=site.url("/probe"), _job="2371a9a8ec9811f1")
    finally:
        await silent.stop()
    (scrape,) = crawler.spider.scrapes
    # robots.txt, /p/0000 and the probe were 200s; 299 is an HTTP status.
    assert [r.status for r in site.log].count(200) == 3
    assert scrape.label_values("incremental_responses_total", "status") == {
        "200", "299", "other"}
    assert scrape.value("incremental_responses_total", status="other") == 3
    assert scrape.total("incremental_responses_total") == len(site.log)
    # The silent slot: one request, one answer, a timeout, and no latency.
    assert scrape.value("incremental_slot_requests_total", slot="127.0.0.2") == 1
    assert scrape.value("incremental_slot_errors_total", slot="127.0.0.2", kind="timeout") == 1
    for name in ("incremental_slot_latency_p50_seconds", "incremental_slot_latency_p95_seconds"):
        assert scrape.label_values(name, "slot") == {"127.0.0.1"}
    ((info, _),) = scrape.matching("incremental_crawl_info")
    assert info == {"spider": "all_at_once", "scope": "all_at_once",
                    "scrapyd_job": "2371a9a8ec9811f1"}


def worker(site, tmp_path: Path, name: str, ports: tuple[int, int], prefix: str,
           targets: Path) -> Worker:
    """A cluster worker (``scrapy crawl``) with metrics on the range *ports*.

    Its state in a SQLite file of the test's own, its shared budget under
    the test's key prefix: nothing of it is left in Redis once *prefix*'s
    keys are deleted."""
    return Worker(site, f"sqlite:///{tmp_path / 'state.db'}", prefix, tmp_path, name,
                  "-s", "INCREMENTAL_THROTTLE_ENABLED=True",
                  "-s", f"INCREMENTAL_THROTTLE_SHARED_PREFIX={prefix}:budget",
                  "-s", "CONCURRENT_REQUESTS=1",
                  "-s", "INCREMENTAL_THROTTLE_START_RATE=50",
                  "-s", f"INCREMENTAL_METRICS_PORT={ports[0]}-{ports[1]}",
                  "-s", f"INCREMENTAL_METRICS_TARGETS_DIR={targets}")


@pytest_twisted.ensureDeferred
async def test_cluster_workers_on_one_host_serve_on_their_own_ports_with_a_worker_label(
    site, tmp_path, cluster_prefix
):
    """Two worker processes started together on one port range: each writes
    a Prometheus file_sd target, each target answers with its own worker
    label, and the targets are gone when the workers are."""
    for path in page_paths(16):
        site.add_page(path, "strong", size=1000)
    # Slow pages: the workers run long enough to be scraped.
    site.slow("/p/", 0.1)
    targets = tmp_path / "targets"
    ports = free_ports(2)
    workers = [worker(site, tmp_path, f"w{i}", ports, cluster_prefix, targets)
               for i in range(2)]
    seen: dict[str, Scrape] = {}
    try:
        # Bounded: polls every 50 ms for at most 60 s, as Prometheus would.
        for _ in range(1200):
            for target_file in sorted(targets.glob("*.json")) if targets.exists() else []:
                (group,) = json.loads(target_file.read_text())
                (target,) = group["targets"]
                if target not in seen:
                    # OSError: the worker is finishing, its file goes next.
                    with contextlib.suppress(OSError):
                        seen[target] = Scrape(await deferToThread(
                            fetch, f"http://{target}/metrics"))
            if len(seen) == 2 or all(w.proc.poll() is not None for w in workers):
                break
            await deferLater(reactor, 0.05)
        for w in workers:
            assert await w.wait() == 0, w.tail()
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()
                await deferToThread(w.proc.wait)
    assert len(seen) == 2, [w.tail() for w in workers]
    assert sorted(int(t.rsplit(":", 1)[1]) for t in seen) == list(ports)
    labels = set()
    for scrape in seen.values():
        ((info, _),) = scrape.matching("incremental_crawl_info")
        assert info["spider"] == "sitemap"
        labels.add(info["worker"])
        # The worker label is on every sample.
        assert all(sample_labels.get("worker") == info["worker"]
                   for _, sample_labels, _ in scrape.samples)
    assert labels == {next(line.split("worker ", 1)[1].split()[0]
                           for line in w.text().splitlines() if "joined run" in line)
                      for w in workers}
    # Both files are removed when their workers end.
    assert list(targets.glob("*.json")) == []


class TargetBlockingSpider(ProbeSpider):
    """Puts a directory where its Prometheus target file is, once scraped:
    the file cannot be removed when the crawl closes."""

    name = "target_blocking"

    async def probe(self, response) -> None:
        await super().probe(response)
        target = self.crawler.get_extension(MetricsEndpoint).targets_file
        target.unlink()
        target.mkdir()


@pytest_twisted.ensureDeferred
async def test_a_target_file_that_cannot_be_removed_still_lets_the_port_go(
    site, state_uri, tmp_path, caplog
):
    for path in page_paths(2):
        site.add_page(path, "strong", size=1000)
    site.add_page("/probe", "none", size=500)
    first, _ = free_ports(1)
    targets = tmp_path / "targets"
    crawler = await run(TargetBlockingSpider, state_uri, {
        "INCREMENTAL_METRICS_PORT": first, "INCREMENTAL_METRICS_TARGETS_DIR": str(targets)},
        urls=[site.url(p) for p in page_paths(2)], probe=site.url("/probe"))
    assert len(crawler.spider.scrapes) == 1
    assert crawler.stats.get_value("incremental/metrics/port") == first
    # The crawl is over: nothing listens on its port any more.
    with socket.socket() as probe:
        # As Twisted listens (SO_REUSEADDR): the scrape's closed connection
        # may sit in TIME_WAIT on this port; only a listener makes this fail.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", first))
        probe.listen()
    assert "Cannot remove the Prometheus target file" in caplog.text


@pytest_twisted.ensureDeferred
async def test_a_port_taken_by_another_program_is_a_warning_not_a_failure(
    site, state_uri, caplog
):
    for path in page_paths(3):
        site.add_page(path, "strong", size=1000)
    site.add_page("/probe", "none", size=500)
    first, _ = free_ports(1)
    taken = socket.socket()
    taken.bind(("127.0.0.1", first))
    taken.listen()
    try:
        crawler = await run(ProbeSpider, state_uri, {"INCREMENTAL_METRICS_PORT": first},
                            urls=[site.url(p) for p in page_paths(3)], probe=site.url("/probe"))
    finally:
        taken.close()
    assert crawler.stats.get_value("incremental/metrics/unavailable") == 1
    assert crawler.stats.get_value("incremental/metrics/port") is None
    assert "No metrics for this crawl" in caplog.text
    assert crawler.stats.get_value("incremental/pages_new") == 3
    assert crawler.stats.get_value("finish_reason") == "finished"

    # An address not of this machine (TEST-NET-1: nothing is sent to it):
    # no range would help, and the warning does not say to widen it.
    caplog.clear()
    first, last = free_ports(3)
    crawler = await run(ProbeSpider, state_uri, {"INCREMENTAL_METRICS_PORT": [first, last],
                                                 "INCREMENTAL_METRICS_HOST": "192.0.2.1"},
                        urls=[site.url(p) for p in page_paths(3)], probe=site.url("/probe"))
    assert crawler.stats.get_value("incremental/metrics/unavailable") == 1
    assert ("No metrics for this crawl: cannot listen on INCREMENTAL_METRICS_HOST 192.0.2.1, "
            f"INCREMENTAL_METRICS_PORT {first}-{last}") in caplog.text
    assert "widen the range" not in caplog.text
    assert crawler.stats.get_value("finish_reason") == "finished"


@pytest_twisted.ensureDeferred
async def test_in_flight_counts_what_the_slot_holds_back_and_transferring_what_is_on_the_wire(
    site, state_uri,
):
    # 16 requests in the downloader, the server holding the ones it got:
    # in flight reads 16, on the wire what the server holds.
    paths = page_paths(16)
    for path in paths:
        site.add_page(path, "strong", size=1000)
    site.hold("/p/")
    port, _ = free_ports(1)
    runner = CrawlerRunner(crawl_settings(
        state_uri, INCREMENTAL_METRICS_PORT=port, CONCURRENT_REQUESTS=16,
        CONCURRENT_REQUESTS_PER_DOMAIN=1))
    crawler = runner.create_crawler(ListSpider)
    done = runner.crawl(crawler, urls=[site.url(p) for p in paths])
    scrape = None
    held = -1
    try:
        # Bounded: a scrape every 50 ms for at most 30 s, until all 16 are in
        # and the server has every request the client has put on the wire
        # (one sent may not have reached the server yet: read again).
        for _ in range(600):
            endpoint = crawler.get_extension(MetricsEndpoint)
            if site.held and endpoint is not None and endpoint.url is not None:
                scrape = Scrape(await deferToThread(fetch, endpoint.url))
                held = site.held
                if (scrape.value("incremental_downloads_in_flight") == len(paths)
                        and scrape.value("incremental_downloads_transferring") == held):
                    break
            await deferLater(reactor, 0.05)
    finally:
        site.release()
        await done
    assert scrape is not None
    assert scrape.value("incremental_downloads_in_flight") == len(paths)
    # On the wire: exactly the requests the server has (and holds).
    assert scrape.value("incremental_downloads_transferring") == held
