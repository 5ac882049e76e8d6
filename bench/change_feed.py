"""The change feed over thirty simulated days: every change emitted exactly
once with the right type, and what bounded item history saves in the store.

What it runs
    The loopback test site (``python -m tests.site``, its own process) with
    ``--pages`` pages (strong ETag + Last-Modified, no sitemap ``<lastmod>``,
    strong ETags on robots.txt and the sitemaps). Before each day's crawl the
    plan (fixed by ``--seed``) is applied to the site: a "hot" tenth of the
    pages changes every day, each other live page with a 5% chance; each
    day about 1% of the live pages start answering 410 for good, 1% start
    answering 404 (two to eight days, some for good), 1% answer 404 for one
    day only, and pages gone for a while come back (a new version or the
    old one). Every crawl is a separate ``scrapy crawl sitemap -a
    sitemap_url=<site>/robots.txt`` process under ``faketime`` (day d: d x
    86400 s later), politeness off (this bench is about the feed), items to
    a JSON-lines feed.

    Variants, each against a freshly started site with the same plan:

    * ``recheck-all``: the add-on with ``INCREMENTAL_RECHECK_ALL=True``: every
      page is asked every day, so the feed each day is known exactly
      (what changed since the day before, a tombstone for each 410 and for
      each second 404 in a row, nothing else);
    * ``defaults``: the add-on at its defaults (adaptive revisits: pages
      are asked when due, so changes and deletions arrive when a page's
      visit comes); after the last day two more crawls with
      ``INCREMENTAL_RECHECK_ALL=True`` settle what is still pending (a 404
      needs two checks), and the final feed state must equal the site's;
    * ``unbounded``: recheck-all with ``INCREMENTAL_ITEM_HISTORY=0`` (every
      version kept, as before the history bound): the baseline for the
      store size.

What it reports
    Per variant: items by type (new, changed, deleted), and the faults
    found by replaying the feed against the site's history: an unchanged
    item (the version last delivered for that page), a ``changed`` item
    for a page with no live item (or ``new`` for one that has one), a
    tombstone for a page already tombstoned or still answering, an item
    whose version is not the page's; for recheck-all also every expected
    item missing from the day's feed; for defaults the changes still not
    delivered at the end, and the mean delay in crawls from a change to
    its item. Then the store after the last crawl: item versions kept,
    file size (``VACUUM INTO`` copy), bounded vs unbounded, and the ratio.

    PASS when every variant has no fault, recheck-all misses nothing,
    defaults ends equal to the site, and the bounded store keeps at most
    ``INCREMENTAL_ITEM_HISTORY`` versions per item.

    python bench/change_feed.py [--pages 300] [--days 30] [--seed 1] [--history 10]

All traffic stays on 127.0.0.1, every crawl has a timeout (``--timeout``),
temporary directories are deleted.
"""

from __future__ import annotations

import argparse
import random
import re
import sqlite3
import sys
import tempfile
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    Site,
    ensure_importable,
    ours_settings,
    print_table,
    ratio,
    run_crawl,
    sqlite_compact_size,
    verdict,
)

ensure_importable()

DAY = 86_400
HOT_SHARE, CHANGE_CHANCE = 0.10, 0.05
GONE_410, GONE_404, BLIP_404, COME_BACK = 0.01, 0.01, 0.01, 0.15
_VERSION = re.compile(r" v(\d+)$")


@dataclass
class Plan:
    """What the site does before each day's crawl."""

    pages: list[str]
    #: days[d]: {"change": [...], "410": [...], "404": [...], "200": [...]}
    #: (200: back to its content), applied before day d's crawl.
    days: list[dict[str, list[str]]]


def make_plan(pages: int, days: int, seed: int) -> Plan:
    rng = random.Random(seed)
    paths = [f"/p/{i:04d}" for i in range(pages)]
    hot = set(rng.sample(paths, round(pages * HOT_SHARE)))
    status = dict.fromkeys(paths, 200)
    back_on: dict[str, int] = {}  # path -> day it answers 200 again
    plan: list[dict[str, list[str]]] = [{}]
    for d in range(1, days):
        day: dict[str, list[str]] = {"change": [], "410": [], "404": [], "200": []}
        for path, when in sorted(back_on.items()):
            if when == d:
                day["200"].append(path)
                status[path] = 200
                del back_on[path]
                if rng.random() < 0.5:
                    day["change"].append(path)
        for path in paths:
            if status[path] != 200 or path in day["200"]:
                if status[path] == 410 and rng.random() < COME_BACK / 10:
                    back_on[path] = d + 1
                continue
            u = rng.random()
            if u < GONE_410:
                day["410"].append(path)
                status[path] = 410
            elif u < GONE_410 + GONE_404:
                day["404"].append(path)
                status[path] = 404
                if rng.random() < 0.7:
                    back_on[path] = d + rng.randint(2, 8)
            elif u < GONE_410 + GONE_404 + BLIP_404:
                day["404"].append(path)
                status[path] = 404
                back_on[path] = d + 1
            elif path in hot or rng.random() < CHANGE_CHANCE:
                day["change"].append(path)
        plan.append(day)
    return Plan(paths, plan)


@dataclass
class Variant:
    name: str
    settings: dict[str, str]
    #: Every page asked every day: the expected feed is exact.
    exact: bool
    #: Crawls with INCREMENTAL_RECHECK_ALL after the last day.
    settle: int = 0


@dataclass
class Result:
    variant: Variant
    types: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    missing: int = 0
    delays: list[int] = field(default_factory=list)
    pending_end: int = 0
    versions: int = 0
    max_versions: int = 0
    store_bytes: int = 0

    def fault(self, kind: str, detail: str) -> None:
        self.faults[kind] += 1
        if len(self.examples) < 8:
            self.examples.append(f"{kind}: {detail}")


class Truth:
    """The site's state as the plan made it, and what the feed delivered."""

    def __init__(self, pages: list[str]) -> None:
        self.version = dict.fromkeys(pages, 0)
        self.status = dict.fromkeys(pages, 200)
        #: Crawls in a row each page answered 404 (as seen by a crawl asking it).
        self.not_found_run = Counter[str]()
        #: path -> ("live", version) or ("gone", 0); absent: never delivered.
        self.delivered: dict[str, tuple[str, int]] = {}
        #: path -> day of the oldest change not delivered yet.
        self.pending: dict[str, int] = {}

    def apply(self, day: dict[str, list[str]], d: int) -> None:
        for path in day.get("200", []):
            self.status[path] = 200
            self.pending.setdefault(path, d)
        for path in day.get("change", []):
            self.version[path] += 1
            self.pending.setdefault(path, d)
        for code in ("410", "404"):
            for path in day.get(code, []):
                self.status[path] = int(code)
                self.pending.setdefault(path, d)

    def expected_today(self) -> dict[str, tuple[str, int]]:
        """The items a crawl asking every page must deliver today, by path."""
        expected: dict[str, tuple[str, int]] = {}
        for path, status in self.status.items():
            state = self.delivered.get(path)
            if status == 200:
                if state is None or state[0] == "gone":
                    expected[path] = ("new", self.version[path])
                elif state[1] != self.version[path]:
                    expected[path] = ("changed", self.version[path])
            elif state is not None and state[0] == "live" and (
                    status == 410 or self.not_found_run[path] >= 1):
                expected[path] = ("deleted", 0)
        return expected

    def settled(self) -> bool:
        return not self.pending


def item_version(item: dict) -> int | None:
    match = _VERSION.search(item.get("title") or "")
    return int(match.group(1)) if match else None


def replay(truth: Truth, items: list[dict], asked: Counter[str], d: int,
           result: Result) -> dict[str, tuple[str, int]]:
    """Check one day's feed against the site; update what was delivered."""
    seen: dict[str, tuple[str, int]] = {}
    for item in items:
        path = urlsplit(item["url"]).path
        change = item.get("change")
        result.types[str(change)] += 1
        state = truth.delivered.get(path)
        if path in seen:
            result.fault("two items for one page in a crawl", f"day {d} {path}")
        if change == "deleted":
            if state is None or state[0] == "gone":
                result.fault("duplicate or baseless tombstone", f"day {d} {path}")
            if truth.status[path] == 200:
                result.fault("tombstone for a page that answers", f"day {d} {path}")
            truth.delivered[path] = ("gone", 0)
            seen[path] = ("deleted", 0)
            continue
        version = item_version(item)
        if version is None:
            result.fault("item without a version", f"day {d} {item.get('url')}")
            continue
        if version != truth.version[path]:
            result.fault("item of another version than the page's",
                         f"day {d} {path} v{version} (site v{truth.version[path]})")
        if state is not None and state == ("live", version):
            result.fault("unchanged item", f"day {d} {path} v{version}")
        elif change == "new" and state is not None and state[0] == "live":
            result.fault("'new' for a page with a live item", f"day {d} {path}")
        elif change == "changed" and (state is None or state[0] == "gone"):
            result.fault("'changed' for a page with no live item", f"day {d} {path}")
        elif change not in ("new", "changed"):
            result.fault("item without a change type", f"day {d} {path} {change!r}")
        truth.delivered[path] = ("live", version)
        seen[path] = (str(change), version)
    # What the site looked like to this crawl.
    for path, status in truth.status.items():
        if asked[path]:
            truth.not_found_run[path] = truth.not_found_run[path] + 1 if status == 404 else 0
    for path, since in list(truth.pending.items()):
        state = truth.delivered.get(path)
        status = truth.status[path]
        done = (state == ("live", truth.version[path]) if status == 200
                else state is not None and state[0] == "gone")
        # A page never delivered that is not answering has nothing to deliver.
        if done or (state is None and status != 200):
            result.delays.append(d - since)
            del truth.pending[path]
    return seen


def run_variant(plan: Plan, variant: Variant, args: argparse.Namespace, work: Path) -> Result:
    result = Result(variant)
    workdir = work / variant.name
    workdir.mkdir()
    db = workdir / "state.db"
    settings = {**ours_settings(db), "INCREMENTAL_THROTTLE_ENABLED": "False",
                **variant.settings}
    truth = Truth(plan.pages)
    days = len(plan.days) + variant.settle
    with Site(args.pages, args.page_size, "strong",
              extra_args=["--sitemap-lastmods", "none", "--list-etags"]) as site:
        for d in range(days):
            print(f"... {variant.name} day {d}", file=sys.stderr, flush=True)
            if d < len(plan.days):
                today = plan.days[d]
                site.change_paths(today.get("change", []))
                for code in ("410", "404", "200"):
                    site.set_status(today.get(code, []), int(code))
                truth.apply(today, d)
            site.reset()
            crawl_settings = dict(settings)
            if d >= len(plan.days):
                crawl_settings["INCREMENTAL_RECHECK_ALL"] = "True"
            expected = truth.expected_today() if variant.exact else {}
            name = f"day{d:02d}"
            crawl = run_crawl(site.base_url, crawl_settings, workdir, name,
                              timeout=args.timeout, wrapper=["faketime", "-f", f"+{d * DAY}"])
            asked = Counter(r["path"].split("?", 1)[0] for r in site.log())
            seen = replay(truth, crawl.item_list, asked, d, result)
            if variant.exact:
                for path, (change, version) in expected.items():
                    got = seen.get(path)
                    if got is None or got[0] != change or (change != "deleted"
                                                           and got[1] != version):
                        result.missing += 1
                        if len(result.examples) < 8:
                            result.examples.append(
                                f"missing: day {d} {path} {change} v{version} (got {got})")
            for leftover in workdir.glob(f"{name}*"):
                leftover.unlink(missing_ok=True)
    result.pending_end = len(truth.pending)
    with closing(sqlite3.connect(db)) as conn:
        result.versions = conn.execute("SELECT COUNT(*) FROM item_versions").fetchone()[0]
        result.max_versions = conn.execute(
            "SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) AS n FROM item_versions "
            "GROUP BY scope, item_key)").fetchone()[0]
    result.store_bytes = sqlite_compact_size(db)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--page-size", type=int, default=3000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--history", type=int, default=10,
                        help="INCREMENTAL_ITEM_HISTORY of the bounded variants")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    plan = make_plan(args.pages, args.days, args.seed)
    planned = Counter(k for day in plan.days for k, v in day.items() for _ in v)
    print(f"site: {args.pages} pages; over days 1-{args.days - 1}: "
          f"{planned['change']} changes, {planned['410']} pages to 410, "
          f"{planned['404']} to 404, {planned['200']} back to 200")
    bounded = {"INCREMENTAL_ITEM_HISTORY": str(args.history)}
    variants = [
        Variant("recheck-all", {**bounded, "INCREMENTAL_RECHECK_ALL": "True"}, exact=True),
        Variant("defaults", bounded, exact=False, settle=2),
        Variant("unbounded", {"INCREMENTAL_ITEM_HISTORY": "0",
                              "INCREMENTAL_RECHECK_ALL": "True"}, exact=True),
    ]
    with tempfile.TemporaryDirectory(prefix="bench-change-feed-") as tmp:
        results = [run_variant(plan, v, args, Path(tmp)) for v in variants]
    print()
    print_table(
        ["variant", "new", "changed", "deleted", "faults", "missing (exact)",
         "pending at end", "mean delay (crawls)"],
        [[r.variant.name, r.types["new"], r.types["changed"], r.types["deleted"],
          sum(r.faults.values()), r.missing if r.variant.exact else "-", r.pending_end,
          f"{sum(r.delays) / len(r.delays):.2f}" if r.delays else "-"] for r in results])
    for r in results:
        for line in r.examples:
            print(f"  {r.variant.name}: {line}")
    bounded_run, unbounded = results[0], results[2]
    print()
    print_table(
        ["store after the last crawl", f"history {args.history} (recheck-all)",
         "unbounded (before)", "ratio"],
        [["item versions kept", bounded_run.versions, unbounded.versions,
          ratio(bounded_run.versions, unbounded.versions)],
         ["most versions of one item", bounded_run.max_versions, unbounded.max_versions, ""],
         ["store size (compact), bytes", bounded_run.store_bytes, unbounded.store_bytes,
          ratio(bounded_run.store_bytes, unbounded.store_bytes)]])
    ok = (all(not r.faults for r in results)
          and all(r.missing == 0 for r in results if r.variant.exact)
          and results[1].pending_end == 0
          and bounded_run.max_versions <= args.history)
    print(f"\n{verdict(ok)}: every change emitted once with its type, no unchanged item, "
          "no duplicate tombstone; bounded history")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
