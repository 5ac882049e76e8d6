"""Cluster mode: 1, 2 and 3 workers on one crawl, and one budget for all of them.

Part 1 (scaling): a site of ``--pages`` pages, each answered after
``--latency`` seconds (a server's think time; no rate limit), crawled cold
by 1, 2 and 3 cluster workers started together (`INCREMENTAL_CLUSTER_URL`,
politeness off so that the cluster's own capacity is measured:
``CONCURRENT_REQUESTS=--concurrency`` per worker). Pages/s over the
server-side span, the ratio to 1 worker, pages fetched twice, and Redis
round trips per page (the workers' ``*/redis_roundtrips``-like stats).

Part 2 (one polite client): a site limited to ``--rate`` requests/s per
client address (token bucket, 429 + Retry-After); all workers share
127.0.0.1, so the site sees their combined rate. Three workers of ours
(cluster mode, politeness on) versus three plain scrapy-redis workers with
Scrapy's AutoThrottle (scrapy-redis scheduler and dupefilter, the same
``sitemap`` spider with ``INCREMENTAL_ENABLED=False``), and one worker of
ours for reference: combined rate vs R, share of 429s, pages fetched.

Redis: a ``redis-server`` of the benchmark's own on a free loopback port
(nothing kept on disk), so that no other client's traffic is counted.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    RedisServer,
    Site,
    print_table,
    ratio,
    run_workers,
    verdict,
)


def page_figures(log: list[dict[str, Any]]) -> dict[str, Any]:
    pages = [r for r in log if r["path"].startswith("/p/")]
    ok = [r for r in pages if r["status"] == 200]
    distinct = {r["path"] for r in ok}
    span = (max(r["finished"] for r in log) - min(r["started"] for r in log)) if log else 0.0
    n429 = sum(1 for r in log if r["status"] == 429)
    return {"pages": len(distinct), "twice": len(ok) - len(distinct), "requests": len(log),
            "429": n429, "share429": n429 / len(log) if log else 0.0, "span": span,
            "rate": len(log) / span if span else 0.0}


def roundtrips(stats: list[dict[str, Any]]) -> int:
    return sum(v for s in stats for k, v in s.items()
               if k.endswith(("redis_roundtrips", "store_roundtrips", "shared/roundtrips")))


def cluster_settings(redis: RedisServer, work: Path, name: str, state: str) -> dict[str, str]:
    settings = {
        "INCREMENTAL_CLUSTER_URL": redis.url(0),
        "INCREMENTAL_CLUSTER_PREFIX": f"bench:{name}",
        "INCREMENTAL_CLUSTER_HEARTBEAT": "0.5",
        "INCREMENTAL_CLUSTER_IDLE_GRACE": "1.0",
        "INCREMENTAL_REVISIT_ENABLED": "False",
    }
    if state == "sqlite":
        settings["INCREMENTAL_STATE_URI"] = "sqlite:///" + str(work / f"{name}.db")
    else:
        settings["INCREMENTAL_STATE_URI"] = redis.url(0) + f"?prefix=bench:{name}:state"
    return settings


def part1(args: argparse.Namespace, redis: RedisServer, work: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for n in (1, 2, 3):
        print(f"... part 1: {n} worker(s)", file=sys.stderr)
        settings = {
            **cluster_settings(redis, work, f"p1-{n}", args.state),
            "INCREMENTAL_THROTTLE_ENABLED": "False",
            "CONCURRENT_REQUESTS": str(args.concurrency),
        }
        with Site(args.pages, args.page_size, "strong",
                  extra_args=["--latency", f"{args.latency:g}"]) as site:
            results, stats, wall = run_workers(site.base_url, n, settings, work, f"p1-{n}",
                                               timeout=args.timeout)
            fig = page_figures(site.log())
        fig["wall"] = wall
        fig["items"] = sum(r.items for r in results)
        fig["roundtrips"] = roundtrips(stats)
        fig["pps"] = fig["pages"] / fig["span"] if fig["span"] else 0.0
        out[n] = fig
    return out


def part2(args: argparse.Namespace, redis: RedisServer, work: Path) -> dict[str, dict[str, Any]]:
    limit = ["--rate", f"{args.rate:g}", "--burst", f"{args.burst:g}", "--retry-after", "seconds"]
    plain_redis = {
        "INCREMENTAL_ENABLED": "False", "INCREMENTAL_THROTTLE_ENABLED": "False",
        "AUTOTHROTTLE_ENABLED": "True",
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        "SCHEDULER_PERSIST": "True",  # else the first worker out wipes the others' queue
        "SCHEDULER_QUEUE_KEY": "bench:p2-plain:%(spider)s:requests",
        "SCHEDULER_DUPEFILTER_KEY": "bench:p2-plain:%(spider)s:dupefilter",
        "REDIS_URL": redis.url(1),
    }
    variants = [
        ("ours x1", 1, cluster_settings(redis, work, "p2-ours1", args.state)),
        ("ours x3", 3, cluster_settings(redis, work, "p2-ours3", args.state)),
        ("scrapy-redis+AutoThrottle x3", 3, plain_redis),
    ]
    out: dict[str, dict[str, Any]] = {}
    for name, n, settings in variants:
        print(f"... part 2: {name}", file=sys.stderr)
        tag = "p2-" + re.sub(r"\W+", "", name)
        with Site(args.pages2, args.page_size, "strong", extra_args=limit) as site:
            results, stats, wall = run_workers(site.base_url, n, settings, work, tag,
                                               timeout=args.timeout)
            fig = page_figures(site.log())
        fig["wall"] = wall
        fig["items"] = sum(r.items for r in results)
        fig["roundtrips"] = roundtrips(stats)
        out[name] = fig
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=600)
    parser.add_argument("--page-size", type=int, default=10_000)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=4,
                        help="CONCURRENT_REQUESTS per worker in part 1")
    parser.add_argument("--pages2", type=int, default=300, help="pages of the limited site")
    parser.add_argument("--rate", type=float, default=20.0, help="R, requests/s per client")
    parser.add_argument("--burst", type=float, default=5.0)
    parser.add_argument("--state", choices=("redis", "sqlite"), default="redis",
                        help="the workers' state store (cluster default: redis)")
    parser.add_argument("--part", choices=("1", "2", "all"), default="all")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    redis = RedisServer(work)
    try:
        if args.part in ("1", "all"):
            res1 = part1(args, redis, work)
            print(f"\nPart 1: {args.pages} pages, {args.latency * 1000:g} ms latency, no limit; "
                  f"politeness off, CONCURRENT_REQUESTS={args.concurrency} per worker; "
                  f"state: {args.state}")
            base = res1[1]["pps"]
            print_table(
                ["workers", "pages", "twice", "items", "span s", "pages/s", "vs 1 worker",
                 "wall s", "redis rt/page"],
                [[n, f["pages"], f["twice"], f["items"], f"{f['span']:.2f}", f"{f['pps']:.1f}",
                  ratio(f["pps"], base), f"{f['wall']:.1f}",
                  f"{f['roundtrips'] / max(f['pages'], 1):.2f}"] for n, f in res1.items()],
            )
            ok = all(f["pages"] == args.pages and f["twice"] == 0 for f in res1.values())
            print(f"every page once: {verdict(ok)}; 3 workers / 1 worker = "
                  f"{ratio(res1[3]['pps'], base)} (ideal 3x)")
        if args.part in ("2", "all"):
            res2 = part2(args, redis, work)
            print(f"\nPart 2: {args.pages2} pages, site limited to R = {args.rate:g} req/s per "
                  f"client (burst {args.burst:g}); all workers on 127.0.0.1")
            print_table(
                ["variant", "pages", "twice", "requests", "429s", "429 share", "rate req/s",
                 "rate / R", "wall s"],
                [[name, f["pages"], f["twice"], f["requests"], f["429"],
                  f"{100 * f['share429']:.1f}%", f"{f['rate']:.1f}",
                  ratio(f["rate"], args.rate), f"{f['wall']:.1f}"] for name, f in res2.items()],
            )
            ours = res2["ours x3"]
            ok = ours["pages"] == args.pages2 and ours["rate"] <= 1.1 * args.rate \
                and ours["share429"] <= 0.05
            print(f"ours x3: every page, rate <= 1.1 R, 429s <= 5%: {verdict(ok)}")
    finally:
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
