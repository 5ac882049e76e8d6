"""CPU the HTML/JSON crawl report adds to a crawl: ours vs ours + INCREMENTAL_REPORT_DIR.

What it measures
    One loopback site of N pages (default 500 x 15,000 bytes, kinds
    strong,weak,lastmod) in its own process. The ``sitemap`` spider crawls
    it cold R times per variant (default 3) in ABBA order (base, report,
    report, base, ...): "base" is the project's defaults (politeness on,
    its window starting at 50 requests/s so that the crawl is not paced for
    long); "report" is the same with ``INCREMENTAL_REPORT_DIR`` set, so it
    also samples each slot every 0.25 s, counts per host, and writes
    report.json (latest and timestamped) and report.html when it ends.
    Every run starts from a fresh empty SQLite store. CPU = user+sys of the
    crawl process alone (os.wait4), start-up included.

How to read it
    The ratio of the median CPU seconds report / base is the report's
    price. Target: <= 1.02x. CPU figures of crawls a few seconds long vary
    by 5-10% from run to run on a shared machine, more than the price: the
    report's own costs, as each crawl logged them, are printed too (building
    and writing the files, ``incremental/report/cpu_ms``, and sampling the
    slots), with their share of the base crawl's CPU; and the files' sizes.

    python bench/report_overhead.py [--pages 500] [--page-size 15000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    Site,
    median,
    ours_settings,
    print_table,
    ratio,
    run_crawl,
    verdict,
)

KINDS = "strong,weak,lastmod"
TARGET = 1.02


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=500, help="pages on the site (500)")
    p.add_argument("--page-size", type=int, default=15_000, help="HTML bytes per page (15000)")
    p.add_argument("--rounds", type=int, default=3, help="runs per variant, ABBA (3)")
    p.add_argument("--timeout", type=float, default=600, help="max seconds per crawl (600)")
    args = p.parse_args(argv)

    cpus: dict[str, list[float]] = {"base": [], "report": []}
    walls: dict[str, list[float]] = {"base": [], "report": []}
    sizes: dict[str, int] = {}
    report_ms: list[int] = []
    sample_ms: list[int] = []
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp, \
            Site(args.pages, args.page_size, KINDS) as site:
        work = Path(tmp)
        order: list[str] = []
        for i in range(args.rounds):
            order += ["base", "report"] if i % 2 == 0 else ["report", "base"]
        for n, variant in enumerate(order):
            print(f"... run {n + 1}/{len(order)}: {variant}", file=sys.stderr)
            settings = {**ours_settings(work / f"state-{n}" / "state.db"),
                        "INCREMENTAL_THROTTLE_START_RATE": "50",
                        "INCREMENTAL_THROTTLE_MAX_RATE": "200",
                        "LOG_LEVEL": "INFO"}
            reports = work / f"reports-{n}"
            if variant == "report":
                settings["INCREMENTAL_REPORT_DIR"] = str(reports)
            site.reset()
            res = run_crawl(site.base_url, settings, work, f"{variant}-{n}",
                            timeout=args.timeout)
            if res.items != args.pages:
                raise SystemExit(f"{variant} run {n}: {res.items} items, expected {args.pages}")
            cpus[variant].append(res.usage.cpu)
            walls[variant].append(res.usage.wall)
            if variant == "report":
                found = re.search(r"Crawl report: .* (\d+) ms of CPU to write, (\d+) ms to "
                                  r"sample", res.log)
                if found:
                    report_ms.append(int(found.group(1)))
                    sample_ms.append(int(found.group(2)))
                sizes = {p.name: p.stat().st_size for p in reports.iterdir()}
                report = json.loads((reports / "report.json").read_text())
                if not report["politeness"]["slots"]:
                    raise SystemExit("the report has no slot series")

    print(f"report_overhead: cold crawl of {args.pages} pages x {args.page_size} B "
          f"(kinds {KINDS}), politeness on, {args.rounds} runs per variant, ABBA order; "
          "CPU = user+sys of the crawl process")
    rows = [[variant, " ".join(f"{c:.2f}" for c in cpus[variant]),
             f"{median(cpus[variant]):.3f}", f"{min(cpus[variant]):.3f}",
             f"{median(walls[variant]):.2f}"] for variant in ("base", "report")]
    r = median(cpus["report"]) / median(cpus["base"])
    rows.append(["report/base", "", ratio(median(cpus["report"]), median(cpus["base"])),
                 ratio(min(cpus["report"]), min(cpus["base"])),
                 ratio(median(walls["report"]), median(walls["base"]))])
    print_table(["variant", "CPU s per run", "median CPU s", "min CPU s", "median wall s"], rows)
    for name in sorted(sizes):
        if not name.startswith("report-"):
            print(f"  {name}: {sizes[name]:,} bytes")
    if report_ms:
        print(f"  as the crawls logged it: building and writing the files (incremental/report/"
              f"cpu_ms) median {median(report_ms):.0f} ms, sampling the slots median "
              f"{median(sample_ms):.0f} ms: {median(report_ms) + median(sample_ms):.0f} ms = "
              f"{100 * (median(report_ms) + median(sample_ms)) / 1000 / median(cpus['base']):.2f}%"
              " of the base crawl's CPU")
    print(f"median CPU report/base = {r:.3f}x  (target <= {TARGET}x: {verdict(r <= TARGET)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
