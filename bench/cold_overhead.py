"""CPU cost of a cold crawl (first crawl, empty store): plain Scrapy vs ours.

What it measures
    One loopback site of N pages (default 1000 x 15,000 bytes, kinds
    strong,weak,lastmod) in its own process. The same ``sitemap`` spider
    crawls it R times per variant (default 3), runs alternating in ABBA
    order (plain, ours, ours, plain, ...) to cancel drift; every run starts
    from nothing (ours: a fresh empty SQLite store; both write the items
    to a JSON-lines feed). CPU = user+sys of the crawl process alone
    (os.wait4), wall = its elapsed time. Nothing is subtracted: start-up
    cost (imports, reactor, robots.txt, sitemaps) is part of both figures.

How to read it
    The ratio of the median CPU seconds ours / plain is the price of
    incrementality on a first crawl (computing fingerprints, staging page
    state and items, SQLite commits). Target: <= 1.15x. Ours runs with
    INCREMENTAL_THROTTLE_ENABLED=False: pacing requests one by one to a
    site's budget costs event-loop wake-ups of its own (about 4 ms of CPU
    per request on this machine at 4-50 req/s); that is the politeness
    engine's price, not incrementality's, and politeness.py measures it.

    python bench/cold_overhead.py [--pages 1000] [--page-size 15000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    Site,
    median,
    ours_settings,
    plain_settings,
    print_table,
    ratio,
    run_crawl,
    summarize_log,
    verdict,
)

KINDS = "strong,weak,lastmod"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=1000, help="pages on the site (default 1000)")
    p.add_argument("--page-size", type=int, default=15_000, help="HTML bytes per page (15000)")
    p.add_argument("--repeat", type=int, default=3, help="runs per variant (default 3)")
    p.add_argument("--timeout", type=float, default=600, help="max seconds per crawl (600)")
    args = p.parse_args(argv)

    runs: dict[str, list] = {"plain": [], "ours": []}
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as tmp, \
            Site(args.pages, args.page_size, KINDS) as site:
        work = Path(tmp)
        order: list[str] = []
        for i in range(args.repeat):
            order += ["plain", "ours"] if i % 2 == 0 else ["ours", "plain"]
        for n, variant in enumerate(order):
            print(f"... run {n + 1}/{len(order)}: {variant}", file=sys.stderr)
            # Politeness (on by default) paces a crawl to each site's budget:
            # measured by politeness.py; here only the incremental machinery.
            settings = (plain_settings() if variant == "plain"
                        else {**ours_settings(work / f"state-{n}" / "state.db"),
                              "INCREMENTAL_THROTTLE_ENABLED": "False"})
            site.reset()
            res = run_crawl(site.base_url, settings, work, f"{variant}-{n}",
                            timeout=args.timeout)
            log = summarize_log(site.log())
            if res.items != args.pages:
                raise SystemExit(f"{variant} run {n}: {res.items} items, expected {args.pages}")
            runs[variant].append((res, log))

    print(f"cold_overhead: first crawl of {args.pages} pages x {args.page_size} B "
          f"(kinds {KINDS}), {args.repeat} runs per variant, ABBA order; "
          "CPU = user+sys of the crawl process")
    rows = []
    med = {}
    for variant in ("plain", "ours"):
        cpus = [r.usage.cpu for r, _ in runs[variant]]
        walls = [r.usage.wall for r, _ in runs[variant]]
        rss = max(r.usage.maxrss_kib for r, _ in runs[variant])
        med[variant] = (median(cpus), median(walls))
        rows.append([variant, " ".join(f"{c:.2f}" for c in cpus), f"{med[variant][0]:.2f}",
                     f"{min(cpus):.2f}",
                     f"{med[variant][1]:.2f}", runs[variant][0][1].requests,
                     runs[variant][0][0].items, f"{rss / 1024:.0f}"])
    lows = {v: min(r.usage.cpu for r, _ in runs[v]) for v in runs}
    rows.append(["ours/plain", "", ratio(med["ours"][0], med["plain"][0]),
                 ratio(lows["ours"], lows["plain"]),
                 ratio(med["ours"][1], med["plain"][1]), "", "", ""])
    print_table(["variant", "CPU s per run", "median CPU s", "min CPU s", "median wall s",
                 "requests",
                 "items", "max RSS MiB"], rows)
    r = med["ours"][0] / med["plain"][0]
    print(f"median CPU ours/plain = {r:.3f}x  (target <= 1.15x: {verdict(r <= 1.15)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
