"""A re-crawl that starts from the last crawl's rate vs one that slow-starts.

What it measures
    One loopback site of generated documentation pages (as
    ``cold_overhead.py --generated``: ``--page-size`` bytes each, strong
    ETag + Last-Modified, weak ETag, Last-Modified cycled, no lastmod in the
    sitemaps, ``Cache-Control: max-age=0``). Each round: a cold crawl
    (``scrapy crawl sitemap``, every default, SQLite store), its store copied
    twice, then the re-crawl "two days later" (``faketime -f +2d``; without
    it, revisits are switched off instead) of each copy: nothing changed,
    every page asked conditionally and answered 304:

    * ``slow-start``: ``INCREMENTAL_THROTTLE_REMEMBER_FOR=0``: every window
      starts at ``INCREMENTAL_THROTTLE_START_RATE`` (4/s) and slow-starts;
    * ``remembered``: the default: the site's window starts from the rate
      the cold crawl reached (50/s here: the site answers at once).

    The two re-crawls alternate (ABBA); medians over ``--rounds`` rounds
    (>= 3). CPU = user+sys of the crawl process alone, wall its elapsed
    time, start-up included.

How to read it
    remembered/slow-start wall is what starting from the last rate saves a
    re-crawl; the pages over the wall of the ideal (pages / 50 per second)
    shows what is left. Both crawls ask the same requests (the table says so).

    python bench/remembered_rate.py [--pages 530] [--page-size 96000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    Site,
    compile_bytecode,
    copy_sqlite,
    median,
    ours_settings,
    print_table,
    ratio,
    run_crawl,
    summarize_log,
)

KINDS = "strong,weak,lastmod"
SITE_ARGS = ["--sitemap-lastmods", "none", "--cache-control", "max-age=0", "--layout", "docs"]
VARIANTS = {"slow-start": {"INCREMENTAL_THROTTLE_REMEMBER_FOR": "0"}, "remembered": {}}


def remembered_rates(db: Path) -> str:
    """What a crawl left in its store for the next one to start from."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT slot, rate, slow_start FROM slot_rates ORDER BY slot").fetchall()
    finally:
        con.close()
    return ", ".join(f"{slot} {rate:g} {bool(slow)}" for slot, rate, slow in rows) or "nothing"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=530, help="pages on the site (default 530)")
    p.add_argument("--page-size", type=int, default=96_000,
                   help="bytes per generated page (default 96000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds (>= 3)")
    p.add_argument("--timeout", type=float, default=600, help="max seconds per crawl (600)")
    args = p.parse_args(argv)
    if args.rounds < 3:
        p.error("--rounds must be >= 3 (medians of alternating rounds)")
    faketime = shutil.which("faketime") is not None
    wrapper = ["faketime", "-f", "+2d"] if faketime else []
    later = {} if faketime else {"INCREMENTAL_REVISIT_ENABLED": "False"}
    compile_bytecode()
    runs: dict[str, list] = {v: [] for v in VARIANTS}
    learned: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-remember-") as tmp, \
            Site(args.pages, args.page_size, KINDS, extra_args=SITE_ARGS) as site:
        for r in range(args.rounds):
            work = Path(tmp) / f"round-{r}"
            work.mkdir()
            print(f"... round {r + 1}/{args.rounds}: cold crawl", file=sys.stderr)
            site.reset()
            cold_db = work / "cold.db"
            run_crawl(site.base_url, ours_settings(cold_db), work, "cold", timeout=args.timeout)
            learned.append(remembered_rates(cold_db))
            order = list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]
            for variant in order:
                db = work / f"{variant}.db"
                copy_sqlite(cold_db, db)
                print(f"... round {r + 1}/{args.rounds}: {variant}", file=sys.stderr)
                site.reset()
                res = run_crawl(site.base_url, {**ours_settings(db), **later,
                                                **VARIANTS[variant]},
                                work, variant, timeout=args.timeout, wrapper=wrapper)
                runs[variant].append((res, summarize_log(site.log())))
            shutil.rmtree(work)

    when = "faketime -f +2d" if faketime else "revisits off (no faketime here)"
    print(f"remembered_rate: {args.pages} generated pages of {args.page_size} B; re-crawl "
          f"({when}) of a cold crawl's store; {args.rounds} rounds, ABBA order")
    wall = {v: median([res.usage.wall for res, *_ in runs[v]]) for v in VARIANTS}
    cpu = {v: median([res.usage.cpu for res, *_ in runs[v]]) for v in VARIANTS}
    rows = []
    for v in VARIANTS:
        log = runs[v][0][1]
        rows.append([v, " ".join(f"{x.usage.wall:.2f}" for x, *_ in runs[v]), f"{wall[v]:.2f}",
                     " ".join(f"{x.usage.cpu:.2f}" for x, *_ in runs[v]), f"{cpu[v]:.2f}",
                     log.requests, log.not_modified,
                     ratio(wall[v], wall["slow-start"]), ratio(cpu[v], cpu["slow-start"])])
    print_table(["variant", "wall s per round", "median wall s", "CPU s per round",
                 "median CPU s", "requests", "304s", "wall vs slow-start",
                 "CPU vs slow-start"], rows)
    print(f"the cold crawls left (slot rate/s, slow start): {'; '.join(learned)}")
    print(f"pages / 50 per second: {args.pages / 50:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
