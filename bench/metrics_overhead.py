"""CPU cost of live metrics: a crawl with /metrics scraped every second vs none.

What it measures
    One loopback site of N pages (default 500 x 15,000 bytes, kinds
    strong,weak,lastmod) in its own process. The same ``sitemap`` spider
    crawls it R times per variant (default 4), the variants alternating in
    ABBA order (off, on, busy, busy, on, off, ...) to cancel drift; every
    run starts from an empty SQLite store, with the project's defaults
    (politeness on: the per-slot windows are part of what is exported).
    ``off``: no metrics. ``on``: ``INCREMENTAL_METRICS_PORT`` set and a
    scraper thread of this process GETs ``/metrics`` every ``--interval``
    seconds (default 1) for as long as the crawl serves it, as a Prometheus
    with a 1 s scrape interval would (15 s to 60 s is usual). ``busy``: the
    same, scraped every ``--busy-interval`` seconds (default 0.05), to
    measure the cost of one scrape above the run-to-run noise. CPU =
    user+sys of the crawl process alone (os.wait4): the scraper's own work
    is not counted, the endpoint's is.

How to read it
    The ratio of the median CPU seconds on / off is the price of the
    metrics as used: the extension's import and start-up, and per scrape
    the collector reading the crawl's state plus the HTTP exchange. Target:
    <= 1.02x. A few percent of noise between runs on a shared machine can
    hide a cost that small, so the cost of one scrape is also derived from
    busy: (median CPU busy - median CPU off) / its scrapes per run, and the
    overhead it implies at one scrape per ``--interval`` is printed too.

    python bench/metrics_overhead.py [--pages 500] [--rounds 4] [--interval 1]
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    Site,
    median,
    ours_settings,
    print_table,
    ratio,
    run_crawl,
    summarize_log,
    verdict,
)

KINDS = "strong,weak,lastmod"
TARGET = 1.02
# No proxy: loopback only.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Scraper(threading.Thread):
    """GETs *url* every *interval* seconds until stopped (bounded by *limit* tries)."""

    def __init__(self, url: str, interval: float, limit: int) -> None:
        super().__init__(daemon=True)
        self.url, self.interval, self.limit = url, interval, limit
        self.stop = threading.Event()
        self.scrapes = 0
        self.bytes = 0
        self.seconds = 0.0

    def run(self) -> None:
        for _ in range(self.limit):
            started = time.perf_counter()
            try:
                with _OPENER.open(self.url, timeout=5) as response:
                    body = response.read()
                self.scrapes += 1
                self.bytes = len(body)
                self.seconds += time.perf_counter() - started
            except OSError:
                pass  # not listening yet, or no more
            if self.stop.wait(max(0.0, self.interval - (time.perf_counter() - started))):
                return


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=500, help="pages on the site (default 500)")
    p.add_argument("--page-size", type=int, default=15_000, help="HTML bytes per page (15000)")
    p.add_argument("--rounds", type=int, default=4, help="runs per variant (default 4)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes (1)")
    p.add_argument("--busy-interval", type=float, default=0.05,
                   help="seconds between scrapes of the busy variant (0.05)")
    p.add_argument("--timeout", type=float, default=600, help="max seconds per crawl (600)")
    args = p.parse_args(argv)

    variants = ("off", "on", "busy")
    intervals = {"on": args.interval, "busy": args.busy_interval}
    runs: dict[str, list] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp, \
            Site(args.pages, args.page_size, KINDS) as site:
        work = Path(tmp)
        order: list[str] = []
        for i in range(args.rounds):
            order += list(variants) if i % 2 == 0 else list(reversed(variants))
        for n, variant in enumerate(order):
            print(f"... run {n + 1}/{len(order)}: {variant}", file=sys.stderr)
            settings = ours_settings(work / f"state-{n}" / "state.db")
            scraper = None
            if variant in intervals:
                port = free_port()
                settings["INCREMENTAL_METRICS_PORT"] = str(port)
                interval = intervals[variant]
                scraper = Scraper(f"http://127.0.0.1:{port}/metrics", interval,
                                  limit=int(args.timeout / interval) + 1)
                scraper.start()
            site.reset()
            try:
                res = run_crawl(site.base_url, settings, work, f"{variant}-{n}",
                                timeout=args.timeout)
            finally:
                if scraper is not None:
                    scraper.stop.set()
                    scraper.join(10)
            if res.items != args.pages:
                raise SystemExit(f"{variant} run {n}: {res.items} items, expected {args.pages}")
            if scraper is not None and scraper.scrapes == 0:
                raise SystemExit(f"run {n}: the metrics were never scraped")
            runs[variant].append((res, summarize_log(site.log()), scraper))

    print(f"metrics_overhead: first crawl of {args.pages} pages x {args.page_size} B "
          f"(kinds {KINDS}, politeness on), {args.rounds} runs per variant, ABBA order; "
          f"on = INCREMENTAL_METRICS_PORT set and /metrics scraped every {args.interval:g} s, "
          f"busy = every {args.busy_interval:g} s; "
          "CPU = user+sys of the crawl process")
    rows = []
    med = {}
    for variant in variants:
        cpus = [r.usage.cpu for r, _, _ in runs[variant]]
        walls = [r.usage.wall for r, _, _ in runs[variant]]
        med[variant] = (median(cpus), median(walls))
        scrapers = [s for _, _, s in runs[variant] if s is not None]
        scraped = sum(s.scrapes for s in scrapers)
        # Client side: request to last byte, the crawl's reactor answering.
        latency = f"{1000 * sum(s.seconds for s in scrapers) / scraped:.1f}" if scraped else "-"
        rows.append([variant, " ".join(f"{c:.2f}" for c in cpus), f"{med[variant][0]:.2f}",
                     f"{min(cpus):.2f}", f"{med[variant][1]:.1f}",
                     runs[variant][0][1].requests,
                     " ".join(str(s.scrapes) for s in scrapers) or "-",
                     f"{scrapers[-1].bytes:,}" if scrapers else "-", latency])
    lows = {v: min(r.usage.cpu for r, _, _ in runs[v]) for v in runs}
    rows.extend([f"{variant}/off", "", ratio(med[variant][0], med["off"][0]),
                 ratio(lows[variant], lows["off"]), ratio(med[variant][1], med["off"][1]),
                 "", "", "", ""] for variant in ("on", "busy"))
    print_table(["variant", "CPU s per run", "median CPU s", "min CPU s", "median wall s",
                 "requests", "scrapes per run", "bytes per scrape", "ms per scrape"], rows)
    busy_scrapes = median([s.scrapes for _, _, s in runs["busy"]])
    on_scrapes = median([s.scrapes for _, _, s in runs["on"]])
    per_scrape = max(0.0, med["busy"][0] - med["off"][0]) / busy_scrapes
    implied = 1 + per_scrape * on_scrapes / med["off"][0]
    print(f"CPU per scrape, from busy: {1000 * per_scrape:.2f} ms; at {on_scrapes:g} scrapes "
          f"per run (one every {args.interval:g} s) that is {implied:.4f}x")
    r = med["on"][0] / med["off"][0]
    print(f"median CPU on/off = {r:.3f}x  (target <= {TARGET}x: {verdict(r <= TARGET)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
