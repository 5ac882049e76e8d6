"""Politeness against a rate-limited site: plain Scrapy vs AutoThrottle vs ours.

What it measures
    Part 1 (one limited site). A loopback site of N pages (default 300 x
    2,000 bytes, kind strong) that allows each client R requests/s (default
    20, token bucket of 5) and answers anything above that with ``429`` +
    ``Retry-After`` (whole seconds). The project's ``sitemap`` spider crawls
    ``<site>/sitemap.xml`` in three variants, each against a freshly started
    site:

        plain         INCREMENTAL_ENABLED=False, INCREMENTAL_THROTTLE_ENABLED=False
                      (Scrapy defaults: RetryMiddleware retries a 429 twice,
                      then gives up on the page)
        autothrottle  plain + AUTOTHROTTLE_ENABLED=True (Scrapy's defaults)
        ours          the project's defaults (AdaptiveThrottle + Retry-After
                      middleware), state in a temporary SQLite file

    Server side (from the site's request log, robots.txt and sitemap
    included): pages fetched (distinct /p/ paths answered 200), requests,
    429s and their share, and ``broken`` = requests that arrived while their client had been told by
    a Retry-After to wait (the site's ``broken_promises``). Client side: the
    wall seconds of the crawl process (Scrapy start-up included) and the
    server span (first request started -> last request answered), both also
    relative to the physical limit N/R (seconds the site needs at its rate).

    Part 2 (isolation). Two sites of N2 pages (default 150): A limited to R
    requests/s as above, B not limited. One crawl (``scrapy runspider
    bench/_urls_spider.py`` with the project's settings) of a URL list that
    interleaves A's pages (``http://127.0.0.1:PORT/...``) with B's
    (``http://localhost:PORT/...``, so B is another download slot). For each
    site: pages fetched, requests, 429s, the span from the crawl's first to
    its last request to that site, and pages/s over that span. Run with ours
    and, for comparison, with plain + AutoThrottle (``--no-compare`` skips
    that), plus a crawl of B alone with ours (``--no-alone`` skips it) as
    B's own speed under our throttle, plus ours with
    INCREMENTAL_THROTTLE_START_RATE = 2 x R (``--no-fast-start`` skips it):
    a diagnostic in which A is over its limit from the first second, which
    with the default start rate it may never be in N2 pages.

How to read it
    * Part 1 targets for ours: every page fetched; 429s <= 5% of requests;
      wall <= 1.5 x N/R. ``broken`` should be 0 for ours.
    * plain is fast but loses the pages whose 429 came three times (and
      logs "Gave up retrying"); AutoThrottle ignores 429 and Retry-After.
    * Part 2: B is crawled at its own pace: its span beside A is the same
      as alone (target: beside/alone <= 1.1, isolation), while A stays
      within R (the server admits at most R/s plus its burst, so what
      matters for A is that it gets every page with few 429s). Our window
      starts at 4 req/s and doubles per healthy second until the first
      429 (slow start), so with 150 pages B's pages/s mostly shows that
      ramp; ``start 2R`` shows B's pace with a window that starts high.

    python bench/politeness.py [--pages 300] [--rate 20] [--burst 5]
        [--page-size 2000] [--pages2 150] [--no-compare] [--no-alone]
        [--no-fast-start] [--part 1|2|both] [--timeout 180]

Smaller and quicker: ``--pages 100 --pages2 60 --no-compare --no-alone
--no-fast-start``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    REPO,
    Site,
    ours_settings,
    print_table,
    run_crawl,
    verdict,
)

URLS_SPIDER = Path(__file__).resolve().with_name("_urls_spider.py")
#: Part-2 diagnostic crawl: ours with the window starting at 2 x R.
FAST = "ours, start 2R"


def plain() -> dict[str, str]:
    return {"INCREMENTAL_ENABLED": "False", "INCREMENTAL_THROTTLE_ENABLED": "False"}


def autothrottle() -> dict[str, str]:
    return {**plain(), "AUTOTHROTTLE_ENABLED": "True"}


def site_stats(site: Site) -> dict[str, Any]:
    # The harness's Site has no wrapper for /__site__/stats; its generic
    # control call is enough (GET, JSON, 127.0.0.1 only, 30 s timeout).
    return site._call("GET", "/__site__/stats")


def server_figures(log: list[dict[str, Any]]) -> dict[str, Any]:
    """Pages fetched, requests, 429s and span of one site's request log."""
    ok_pages = {r["path"] for r in log if r["status"] == 200 and r["path"].startswith("/p/")}
    n429 = sum(1 for r in log if r["status"] == 429)
    span = (max(r["finished"] for r in log) - min(r["started"] for r in log)) if log else 0.0
    return {"pages": len(ok_pages), "requests": len(log), "429": n429,
            "share": n429 / len(log) if log else 0.0, "span": span}


def pct(x: float) -> str:
    return f"{100.0 * x:.1f}%"


# ---------------------------------------------------------------------------
# Part 1
# ---------------------------------------------------------------------------


def part1(args: argparse.Namespace, work: Path) -> dict[str, dict[str, Any]]:
    limit = ["--rate", f"{args.rate:g}", "--burst", f"{args.burst:g}", "--retry-after", "seconds"]
    variants = [
        ("plain", plain()),
        ("autothrottle", autothrottle()),
        ("ours", ours_settings(work / "ours" / "state.db")),
    ]
    out: dict[str, dict[str, Any]] = {}
    for name, settings in variants:
        print(f"... part 1: {name}", file=sys.stderr)
        with Site(args.pages, args.page_size, "strong", extra_args=limit) as site:
            cmd = ["crawl", "sitemap", "-a", f"sitemap_url={site.base_url}/sitemap.xml"]
            res = run_crawl(site.base_url, settings, work, f"p1-{name}", command=cmd,
                            timeout=args.timeout, allow_errors=name != "ours")
            log, stats = site.log(), site_stats(site)
        fig = server_figures(log)
        fig["wall"] = res.usage.wall
        fig["broken"] = stats["broken_promises"]
        out[name] = fig
    return out


def report1(args: argparse.Namespace, res: dict[str, dict[str, Any]]) -> None:
    n, rate = args.pages, args.rate
    limit = n / rate
    print(f"Part 1: one site, {n} pages x {args.page_size} B, {rate:g} req/s per client "
          f"(burst {args.burst:g}, 429 + Retry-After above); sitemap spider on /sitemap.xml. "
          f"Physical limit N/R = {limit:.1f} s")
    rows = []
    for name in ("plain", "autothrottle", "ours"):
        f = res[name]
        rows.append([name, f"{f['pages']}/{n}", f["requests"], f["429"], pct(f["share"]),
                     f["broken"], f"{f['wall']:.1f}", f"{f['wall'] / limit:.2f}x",
                     f"{f['span']:.1f}", f"{f['span'] / limit:.2f}x"])
    print_table(["variant", "pages", "requests", "429s", "429 share", "broken", "wall s",
                 "wall/(N/R)", "span s", "span/(N/R)"], rows)
    print("  broken = requests inside a Retry-After period; wall = crawl process "
          "(start-up included); span = server's first request -> last answer")
    o = res["ours"]
    print(f"ours: all pages: {o['pages']}/{n} ({verdict(o['pages'] == n)}); "
          f"429 share {pct(o['share'])} <= 5% ({verdict(o['share'] <= 0.05)}); "
          f"wall {o['wall']:.2f} s <= 1.5 x {limit:.1f} s = {1.5 * limit:.2f} s "
          f"({verdict(o['wall'] <= 1.5 * limit)})")


# ---------------------------------------------------------------------------
# Part 2
# ---------------------------------------------------------------------------


def two_site_crawl(args: argparse.Namespace, work: Path, name: str, settings: dict[str, str],
                   *, with_a: bool = True) -> dict[str, dict[str, Any]]:
    limit = ["--rate", f"{args.rate:g}", "--burst", f"{args.burst:g}", "--retry-after", "seconds"]
    n = args.pages2
    paths = [f"/p/{i:04d}" for i in range(n)]
    with Site(n, args.page_size, "strong", extra_args=limit) as a, \
            Site(n, args.page_size, "strong") as b:
        b_base = b.base_url.replace("http://127.0.0.1:", "http://localhost:", 1)
        urls: list[str] = []
        for p in paths:
            if with_a:
                urls.append(a.base_url + p)
            urls.append(b_base + p)
        urls_file = work / f"{name}.urls"
        urls_file.write_text("\n".join(urls) + "\n", encoding="utf-8")
        cmd = ["runspider", str(URLS_SPIDER.relative_to(REPO)), "-a", f"urls_file={urls_file}"]
        res = run_crawl(a.base_url, settings, work, name, command=cmd, timeout=args.timeout,
                        allow_errors=True)
        out = {"A": server_figures(a.log()), "B": server_figures(b.log())}
        for key, site in (("A", a), ("B", b)):
            out[key]["broken"] = site_stats(site)["broken_promises"]
    out["wall"] = {"wall": res.usage.wall, "items": res.items}
    return out


def part2(args: argparse.Namespace, work: Path) -> dict[str, dict[str, Any]]:
    runs = [("ours", ours_settings(work / "two" / "state.db"), True)]
    if args.compare:
        runs.append(("autothrottle", autothrottle(), True))
    if args.alone:
        runs.append(("ours, B alone", ours_settings(work / "alone" / "state.db"), False))
    if args.fast_start:
        # Diagnostic, not a default: the window starts above A's limit, so A
        # is refused and frozen from the start while B goes on.
        runs.append((FAST, {**ours_settings(work / "fast" / "state.db"),
                            "INCREMENTAL_THROTTLE_START_RATE": f"{2 * args.rate:g}",
                            "INCREMENTAL_THROTTLE_MAX_RATE": f"{max(50.0, 2 * args.rate):g}"},
                     True))
    out = {}
    for i, (name, settings, with_a) in enumerate(runs):
        print(f"... part 2: {name}", file=sys.stderr)
        out[name] = two_site_crawl(args, work, f"p2-{i}", settings, with_a=with_a)
    return out


def report2(args: argparse.Namespace, res: dict[str, dict[str, Any]]) -> None:
    n, rate = args.pages2, args.rate
    print(f"Part 2: two sites of {n} pages, A (127.0.0.1) limited to {rate:g} req/s, "
          f"B (localhost) not limited; one crawl of both URL lists interleaved "
          f"(runspider bench/_urls_spider.py)")
    rows = []
    for name, r in res.items():
        for key in ("A", "B"):
            f = r[key]
            if not f["requests"]:
                continue
            per_s = f["pages"] / f["span"] if f["span"] else float("nan")
            rows.append([name, key, f"{f['pages']}/{n}", f["requests"], f["429"],
                         f["broken"], f"{f['span']:.1f}", f"{per_s:.1f}",
                         f"{r['wall']['wall']:.1f}"])
    print_table(["crawl", "site", "pages", "requests", "429s", "broken", "span s", "pages/s",
                 "crawl wall s"], rows)
    print("  span = the site's first request -> its last answer; pages/s = pages fetched / span")
    o = res["ours"]
    a, b = o["A"], o["B"]
    a_ps = a["pages"] / a["span"] if a["span"] else float("nan")
    b_ps = b["pages"] / b["span"] if b["span"] else float("nan")
    print(f"ours: B {b_ps:.1f} pages/s, A within R: {a_ps:.1f} pages/s <= {rate:g} "
          f"({verdict(a_ps <= rate)}); all pages of both: {a['pages']}+{b['pages']}/{2 * n} "
          f"({verdict(a['pages'] == n and b['pages'] == n)}); "
          f"A's 429 share {pct(a['share'])}")
    if "ours, B alone" in res and res["ours, B alone"]["B"]["span"]:
        alone = res["ours, B alone"]["B"]["span"]
        print(f"  B at its own pace: span beside A {b['span']:.1f} s vs alone {alone:.1f} s "
              f"(beside/alone {b['span'] / alone:.2f}x, target <= 1.1x: "
              f"{verdict(b['span'] / alone <= 1.1)})")
    fast = res.get(FAST)
    if fast is not None and fast["A"]["span"] and fast["B"]["span"]:
        fa, fb = fast["A"], fast["B"]
        print(f"  {FAST}: A {fa['pages'] / fa['span']:.1f} pages/s with {fa['429']} 429s, "
              f"B {fb['pages'] / fb['span']:.1f} pages/s with {fb['429']} 429s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=300, help="pages of the part-1 site (300)")
    p.add_argument("--rate", type=float, default=20, help="requests/s the limited site allows (20)")
    p.add_argument("--burst", type=float, default=5, help="token bucket size of the limit (5)")
    p.add_argument("--page-size", type=int, default=2000, help="HTML bytes per page (2000)")
    p.add_argument("--pages2", type=int, default=150, help="pages of each part-2 site (150)")
    p.add_argument("--no-compare", dest="compare", action="store_false",
                   help="part 2: skip the plain + AutoThrottle crawl")
    p.add_argument("--no-alone", dest="alone", action="store_false",
                   help="part 2: skip the crawl of B alone")
    p.add_argument("--no-fast-start", dest="fast_start", action="store_false",
                   help="part 2: skip ours with INCREMENTAL_THROTTLE_START_RATE = 2 x R")
    p.add_argument("--part", choices=("1", "2", "both"), default="both")
    p.add_argument("--timeout", type=float, default=180, help="max seconds per crawl (180)")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-politeness-") as tmp:
        work = Path(tmp)
        r1 = part1(args, work) if args.part in ("1", "both") else None
        r2 = part2(args, work) if args.part in ("2", "both") else None
    if r1 is not None:
        report1(args, r1)
    if r2 is not None:
        if r1 is not None:
            print()
        report2(args, r2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
