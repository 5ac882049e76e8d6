"""N workers, one site's budget: the shared budget in Redis vs per-worker throttles.

What it measures
    A loopback site of N pages (default 240 x 2,000 bytes, kind strong)
    that allows each client address R requests/s (default 20, token bucket
    of 5) and answers anything above that with ``429`` + ``Retry-After``
    (whole seconds). Every worker runs on 127.0.0.1, so the site's limiter
    sees them together, as a site sees one crawler running on several
    machines behind one address. The pages are split into W disjoint URL
    lists, one per worker; each worker is a ``scrapy runspider
    bench/_urls_spider.py`` process with the project's settings, all W
    started together, each variant against a freshly started site:

        ours xW         W = 1, 2, 3 workers with INCREMENTAL_THROTTLE_SHARED_URL
                        (one window, bucket and freeze for all, in Redis)
        ours-local x3   3 workers, the project's defaults, no shared budget
                        (each its own AdaptiveThrottle)
        autothrottle x3 3 plain Scrapy workers with AUTOTHROTTLE_ENABLED=True
                        (INCREMENTAL_ENABLED=False): the baseline

    Server side (the site's log, robots.txt included): pages fetched
    (distinct /p/ paths answered 200), requests, 429s and their share,
    ``broken`` = requests that arrived while the client address had been
    told by a Retry-After to wait (5 ms grace: the site's broken_promises),
    the span (first request -> last answer), the combined offered rate
    (requests / span) and admitted rate (200s / span) vs R, and the busiest
    second (most requests that arrived within one second) vs R + burst.
    Client side: Redis round trips per request, from the workers' stats
    (``incremental/throttle/shared/roundtrips`` / ``downloader/request_count``).

How to read it
    Targets for ours (every W): every page; 429 share <= 5%; broken = 0;
    busiest second <= R + burst; offered rate <= R. The baseline is printed
    beside it and as ratios (ours x3 / autothrottle x3). AutoThrottle does
    not know 429 or Retry-After (it gives up on pages after Scrapy's two
    retries); per-worker throttles each honour their own Retry-After only.

    python bench/shared_budget.py [--pages 240] [--rate 20] [--burst 5]
        [--page-size 2000] [--redis redis://127.0.0.1:6379/10] [--timeout 180]

Redis: a unique key prefix per run, its keys deleted at the end; no other key
is touched. Quicker: ``--pages 120``.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import REPO, Site, ours_settings, print_table, run_crawl, verdict

URLS_SPIDER = Path(__file__).resolve().with_name("_urls_spider.py")


def autothrottle() -> dict[str, str]:
    return {"INCREMENTAL_ENABLED": "False", "INCREMENTAL_THROTTLE_ENABLED": "False",
            "AUTOTHROTTLE_ENABLED": "True"}


def stat(log: str, name: str) -> int:
    """One integer stat from a crawl's INFO stats dump (0 when absent)."""
    match = re.search(rf"'{re.escape(name)}': (\d+)", log)
    return int(match.group(1)) if match else 0


def busiest_second(starts: list[float]) -> int:
    starts = sorted(starts)
    most, lo = 0, 0
    for hi, t in enumerate(starts):
        while t - starts[lo] >= 1.0:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


def run_variant(args: argparse.Namespace, work: Path, name: str, workers: int,
                settings_for: Any) -> dict[str, Any]:
    """*workers* crawls of disjoint URL lists, started together, on a fresh site."""
    limit = ["--rate", f"{args.rate:g}", "--burst", f"{args.burst:g}", "--retry-after", "seconds"]
    paths = [f"/p/{i:04d}" for i in range(args.pages)]
    print(f"... {name}", file=sys.stderr)
    with Site(args.pages, args.page_size, "strong", extra_args=limit) as site:
        jobs = []
        for w in range(workers):
            urls = work / f"{name}-{w}.urls"
            urls.write_text("".join(site.base_url + p + "\n" for p in paths[w::workers]),
                            encoding="utf-8")
            cmd = ["runspider", str(URLS_SPIDER.relative_to(REPO)), "-a", f"urls_file={urls}"]
            settings = {"LOG_LEVEL": "INFO", **settings_for(w)}
            jobs.append((site.base_url, settings, work, f"{name}-{w}", cmd))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            # Each thread waits for its own process (os.wait4 on its pid).
            futures = [pool.submit(run_crawl, base, settings, wd, wname, command=cmd,
                                   timeout=args.timeout, allow_errors=True)
                       for base, settings, wd, wname, cmd in jobs]
            results = [f.result() for f in futures]
        log = site.log()
        stats = site._call("GET", "/__site__/stats")
    logs = [(work / f"{name}-{w}.err").read_text(encoding="utf-8", errors="replace")
            for w in range(workers)]
    ok_pages = {r["path"] for r in log if r["status"] == 200 and r["path"].startswith("/p/")}
    n429 = sum(1 for r in log if r["status"] == 429)
    n200 = sum(1 for r in log if r["status"] == 200)
    span = max(r["finished"] for r in log) - min(r["started"] for r in log)
    requests = sum(stat(text, "downloader/request_count") for text in logs)
    roundtrips = sum(stat(text, "incremental/throttle/shared/roundtrips") for text in logs)
    return {"name": name, "workers": workers, "pages": len(ok_pages), "requests": len(log),
            "429": n429, "share": n429 / len(log), "broken": stats["broken_promises"],
            "span": span, "offered": len(log) / span, "admitted": n200 / span,
            "busiest": busiest_second([r["started"] for r in log]),
            "wall": max(r.usage.wall for r in results),
            "rt_per_request": roundtrips / requests if requests else 0.0}


def cleanup(url: str, prefix: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        return len(keys)
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=240, help="pages of the site, split among workers")
    p.add_argument("--rate", type=float, default=20, help="requests/s the site allows per client")
    p.add_argument("--burst", type=float, default=5, help="token bucket size of the limit")
    p.add_argument("--page-size", type=int, default=2000, help="HTML bytes per page")
    p.add_argument("--redis", default="redis://127.0.0.1:6379/10",
                   help="the shared budget's Redis (a unique key prefix is used and deleted)")
    p.add_argument("--timeout", type=float, default=180, help="max seconds per crawl")
    args = p.parse_args(argv)
    prefix = f"incremental:bench:{uuid.uuid4().hex}"

    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-shared-budget-") as tmp:
            work = Path(tmp)
            for workers in (1, 2, 3):
                def ours(w: int, workers: int = workers) -> dict[str, str]:
                    return {**ours_settings(work / f"ours{workers}-{w}.db"),
                            "INCREMENTAL_THROTTLE_SHARED_URL": args.redis,
                            # A prefix per variant: each starts from a fresh window.
                            "INCREMENTAL_THROTTLE_SHARED_PREFIX": f"{prefix}:{workers}"}
                rows.append(run_variant(args, work, f"ours x{workers}", workers, ours))
            rows.append(run_variant(args, work, "ours-local x3", 3,
                                    lambda w: ours_settings(work / f"local-{w}.db")))
            rows.append(run_variant(args, work, "autothrottle x3", 3, lambda w: autothrottle()))
    finally:
        deleted = cleanup(args.redis, prefix)

    n, rate, burst = args.pages, args.rate, args.burst
    print(f"{n} pages x {args.page_size} B split among W workers (runspider, started together) "
          f"on one site allowing {rate:g} req/s per client address (burst {burst:g}, 429 + "
          f"Retry-After above); all workers on 127.0.0.1. N/R = {n / rate:.1f} s")
    print_table(
        ["variant", "pages", "requests", "429s", "429 share", "broken", "span s",
         "offered/s", "offered/R", "admitted/s", "busiest 1 s", "wall s", "Redis rt/req"],
        [[r["name"], f"{r['pages']}/{n}", r["requests"], r["429"], f"{100 * r['share']:.1f}%",
          r["broken"], f"{r['span']:.1f}", f"{r['offered']:.1f}", f"{r['offered'] / rate:.2f}x",
          f"{r['admitted']:.1f}", r["busiest"], f"{r['wall']:.1f}",
          f"{r['rt_per_request']:.2f}" if r["rt_per_request"] else "-"] for r in rows])
    print("  broken = requests inside a Retry-After the site gave (to any worker: one address); "
          "busiest 1 s = most arrivals within a second (the site allows R + burst); "
          "offered = all requests / span, admitted = 200s / span")
    base = rows[-1]
    for r in rows[:3]:
        ok = (r["pages"] == n and r["share"] <= 0.05 and r["broken"] == 0
              and r["busiest"] <= rate + burst and r["offered"] <= rate)
        print(f"{r['name']}: every page {verdict(r['pages'] == n)}, 429 share <= 5% "
              f"{verdict(r['share'] <= 0.05)}, broken = 0 {verdict(r['broken'] == 0)}, "
              f"busiest <= R + burst {verdict(r['busiest'] <= rate + burst)}, offered <= R "
              f"{verdict(r['offered'] <= rate)}: {verdict(ok)}")
    ours3 = rows[2]
    print(f"ours x3 / autothrottle x3: 429s {ours3['429']}/{base['429']} "
          f"({ours3['429'] / base['429']:.2f}x), broken {ours3['broken']}/{base['broken']}, "
          f"pages {ours3['pages']}/{base['pages']}, offered rate "
          f"{ours3['offered'] / base['offered']:.2f}x, span {ours3['span'] / base['span']:.2f}x"
          if base["429"] and base["offered"] else "autothrottle x3: no 429s (site not limiting?)")
    print(f"Redis keys of this run deleted: {deleted}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
