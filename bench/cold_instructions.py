"""Instructions of a cold crawl, ours vs plain Scrapy, per page and at start-up.

What it measures
    ``cold_overhead.py``'s cold crawl (generated documentation pages,
    ``--layout docs``, sitemaps without lastmod, ``Cache-Control:
    max-age=0``) of plain Scrapy (``bench/_plain_sitemap_spider.py``, the
    same feed) and of ours with politeness off
    (``INCREMENTAL_THROTTLE_ENABLED=False``, SQLite store, items stored),
    each crawl process run under ``valgrind --tool=callgrind``: the
    instructions it executed (``Ir``), whatever else the machine is doing.
    Two site sizes, N and M pages (100 and 200 by default): per page =
    (Ir at M - Ir at N) / (M - N), start-up = Ir at N - N x per page
    (imports, reactor, robots.txt, sitemaps, the store opened and closed).

How to read it
    ours/plain per page is what incrementality costs each page (fingerprints,
    page state and items staged and committed, the schedule's bookkeeping);
    the start-up difference is paid once per crawl (imports of the add-on's
    components, the store's schema). CPU time follows instructions only
    roughly (caches, pacing), but a crawl's instructions repeat to about
    0.3% on a busy machine, where CPU seconds vary by 10-30%. A per-page
    figure is a difference of totals and moves by a few hundred thousand
    instructions between runs of the same code (libxml2 seeds its name
    dictionary differently in each process, and lxml's tag matching costs
    more or less with it): for smaller changes compare the functions of the
    callgrind files ``--keep`` copies (``callgrind_annotate``). Callgrind
    runs OpenSSL's SHA-256 without the CPU's SHA extensions: hashing counts
    several times what it costs natively.

    python bench/cold_instructions.py [--pages 100 200] [--page-size 96000]
        [--only plain|ours] [--keep DIR] [--timeout 1800]

A crawl under callgrind runs ~50x slower: 100 pages take ~1.5 min, the
default run ~10 min (two crawls at a time).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Site, compile_bytecode, ours_settings, print_table, run_crawl
from cold_overhead import KINDS, PLAIN_SETTINGS, PLAIN_SPIDER

VARIANTS = ("plain", "ours")
_TOTALS = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.M)


def callgrind_total(path: Path) -> int:
    """The instructions (``Ir``) a callgrind output file counts in all."""
    found = _TOTALS.findall(path.read_bytes())
    if not found:
        raise RuntimeError(f"no totals in {path}")
    return int(found[-1])


def crawl(site: Site, variant: str, work: Path, pages: int, timeout: float) -> tuple[int, int]:
    """One cold crawl of *variant* under callgrind: (instructions, items)."""
    home = work / f"{variant}-{pages}"
    home.mkdir()
    out = home / "callgrind.out"
    wrapper = ["valgrind", "--tool=callgrind", "--quiet", f"--callgrind-out-file={out}"]
    robots = f"sitemap_url={site.base_url}/robots.txt"
    if variant == "plain":
        res = run_crawl(site.base_url, dict(PLAIN_SETTINGS), home, variant, timeout=timeout,
                        cwd=home, wrapper=wrapper,
                        command=["runspider", str(PLAIN_SPIDER), "-a", robots])
    else:
        settings = {**ours_settings(home / "state.db"), "INCREMENTAL_THROTTLE_ENABLED": "False"}
        res = run_crawl(site.base_url, settings, home, variant, timeout=timeout,
                        wrapper=wrapper)
    return callgrind_total(out), res.items


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, nargs=2, default=(100, 200), metavar=("N", "M"),
                   help="the two site sizes (default 100 200)")
    p.add_argument("--page-size", type=int, default=96_000,
                   help="bytes per generated page (default 96000)")
    p.add_argument("--only", choices=VARIANTS, help="measure one variant only")
    p.add_argument("--keep", type=Path,
                   help="copy each crawl's callgrind file and log into this directory")
    p.add_argument("--timeout", type=float, default=1800, help="max seconds per crawl (1800)")
    args = p.parse_args(argv)
    small, big = args.pages
    if not 0 < small < big:
        p.error("--pages N M needs 0 < N < M")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    variants = (args.only,) if args.only else VARIANTS
    compile_bytecode()
    site_args = ["--sitemap-lastmods", "none", "--cache-control", "max-age=0",
                 "--layout", "docs"]

    total: dict[tuple[str, int], int] = {}
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        for pages in (small, big):
            # Each variant on a site of its own: two crawls at a time, and
            # neither sees the other's requests in its site's log.
            sites = [Site(pages, args.page_size, KINDS, extra_args=site_args)
                     for _ in variants]
            try:
                for site in sites:
                    site.start()
                print(f"... {pages} pages: {', '.join(variants)} under callgrind",
                      file=sys.stderr)
                with ThreadPoolExecutor(len(variants)) as pool:
                    futures = {v: pool.submit(crawl, s, v, Path(tmp), pages, args.timeout)
                               for v, s in zip(variants, sites, strict=True)}
                    for v, fut in futures.items():
                        ir, items = fut.result()
                        if items != pages:
                            raise SystemExit(f"{v} at {pages} pages: {items} items")
                        total[v, pages] = ir
            finally:
                for site in sites:
                    site.stop()
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for home in Path(tmp).iterdir():
                shutil.copyfile(home / "callgrind.out", args.keep / f"{home.name}.callgrind")
                for log in home.glob("*.err"):
                    shutil.copyfile(log, args.keep / f"{home.name}.log")

    per_page = {v: (total[v, big] - total[v, small]) / (big - small) for v in variants}
    start_up = {v: total[v, small] - small * per_page[v] for v in variants}
    print(f"cold_instructions: generated documentation pages of {args.page_size} B, "
          f"sitemaps without lastmod; instructions (callgrind Ir) of the crawl process; "
          f"ours = politeness off, SQLite store, items stored")
    rows = [[v, f"{total[v, small] / 1e9:.3f} G", f"{total[v, big] / 1e9:.3f} G",
             f"{per_page[v] / 1e6:.3f} M", f"{start_up[v] / 1e9:.3f} G"] for v in variants]
    print_table(["variant", f"Ir at {small} pages", f"Ir at {big} pages", "per page",
                 "start-up"], rows)
    if len(variants) == 2:
        print(f"\nours/plain per page = {per_page['ours'] / per_page['plain']:.3f}x; "
              f"start-up ours - plain = {(start_up['ours'] - start_up['plain']) / 1e9:.3f} G; "
              f"at {big} pages ours/plain = {total['ours', big] / total['plain', big]:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
