"""Thirty simulated days of daily crawls: what each way of scheduling re-visits
asks of the server, and how late it hands over the changes.

What it runs
    The loopback test site (``python -m tests.site``, its own process) with
    ``--pages`` pages of ``--page-size`` bytes (strong ETag + Last-Modified),
    strong ETags on robots.txt and the sitemaps (an unchanged sitemap costs a
    304). The pages' change rates are fixed by ``--seed``: about 5% change
    every day, 15% once a week (each on its own weekday), the rest rarely
    (one chance in 60 per day). The site is crawled once a day for
    ``--days`` days (day 0 is the cold crawl); before each day's crawl that
    day's changes are applied to the site. Every crawl is a separate
    ``scrapy crawl sitemap -a sitemap_url=<site>/robots.txt`` process run
    under ``faketime`` (``<day> x 86400`` s later, plus up to
    ``--jitter`` seconds of start jitter either way, so a crawl may start
    earlier in its day than the one before, as cron and scrapyd jobs do).
    Politeness is off for every variant (``INCREMENTAL_THROTTLE_ENABLED=False``,
    the same ``CONCURRENT_REQUESTS``): this bench is about scheduling.

    Sitemap lastmod kinds (``--kinds``): ``honest`` (each page's version
    date), ``stale`` (the first version's date, whatever the version: dates
    that never move, the index's too), ``none`` (no ``<lastmod>``).

    Variants:

    * ``always-conditional``: Scrapy's HttpCache, ``RFC2616Policy``, every
      request with ``Cache-Control: max-age=0`` (every page revalidated on
      every crawl, a 304 hands the cached page to the callback);
    * ``fixed-1d``: the add-on with a fixed one-day revisit interval (as
      Nutch's default fetch schedule): ``INCREMENTAL_REVISIT_INITIAL`` =
      ``_MIN`` = ``_MAX`` = 86400, ``_INC_RATE`` = ``_DEC_RATE`` = 0,
      ``-a use_lastmod=false``;
    * ``ours``: the add-on at its defaults;
    * ``ours-fresh`` (``none`` kind only): ours with
      ``INCREMENTAL_REVISIT_MAX=172800`` (no page waits more than two days);
    * ``ours-cluster`` (with ``--cluster N``, under every kind): ours at its
      defaults as N cluster-mode workers per daily crawl, started together,
      each under that day's ``faketime`` offset, sharing one throwaway
      ``redis-server`` per run (``INCREMENTAL_CLUSTER_URL=redis://127.0.0.1:
      <port>/0``, ``INCREMENTAL_CLUSTER_PREFIX=bench:schedule:<kind>``; the
      state store follows the cluster URL); its items are every worker's
      feed together.

    Neither always-conditional nor fixed-1d reads lastmods, so they run once
    (against the honest site) and are shown under every kind.

What it reports, from the server's log and the items emitted only
    Per crawl and summed over days 1.. (the cold crawl apart): page requests
    (robots.txt and sitemaps shown apart as "lists"), 304s, body bytes; the
    changes made; the share of changes emitted by the first crawl after they
    happened ("on time"), the mean delay in crawls of the others, and how
    many are still not emitted at the end (a change counts as emitted once
    an item carries its page's version or a later one: pages render their
    version in their title); unchanged items emitted (an item whose version
    is the one last emitted for its page). For ours, per day: page
    requests, how many went to pages with a change not yet emitted, and the
    bound "changed + sample" where the sample is
    ``max(1, ceil(INCREMENTAL_LASTMOD_RECHECK_SHARE x n))`` for each of the
    site's two child sitemaps of n pages (the sample is drawn per list), plus
    INCREMENTAL_MAX_AGE refreshes apart when the crawl's stats count them;
    and the first day a crawl logged "Not trusting the sitemap lastmods of".

    Targets: honest -- ours' page requests <= changed + sample (+ max-age
    refreshes) on every day, and every change emitted by the next crawl;
    stale -- ours distrusts the host's lastmods within 10 days; none -- ours
    sends well under (at most half) always-conditional's page requests
    (its on-time share and mean delay printed as the cost).

    With ``--cluster N``, per kind, ours and ours-cluster side by side per
    day: page requests (304s), page bytes, changes emitted on time / late /
    not yet emitted, unchanged items, items emitted twice, each worker's
    downloader requests and items; PASS when ours-cluster's page requests
    equal ours' on every day (else, per day, by how much: pages fetched more
    than once, pages only one of them asked) and when it emits the same
    changes on time on every day.

    python bench/schedule.py [--days 30] [--pages 2000] [--kinds honest,stale,none]
        [--cluster N]

All traffic stays on 127.0.0.1, every crawl has a timeout (``--timeout``; each
worker's own with ``--cluster``), temporary directories are deleted.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    RedisServer,
    Site,
    ensure_importable,
    httpcache_revalidate_settings,
    logged_stats,
    ours_settings,
    print_table,
    ratio,
    run_crawl,
    run_workers,
    sample_bound,
    verdict,
)

ensure_importable()

KINDS = ("honest", "stale", "none")
DAY = 86_400
#: Shares of pages changing every day and once a week; the others change
#: with this chance on any day.
DAILY_SHARE, WEEKLY_SHARE, RARE_CHANCE = 0.05, 0.15, 1 / 60
#: Ours must distrust stale lastmods within this many days.
STALE_DAYS = 10
#: "Well under" always-conditional's requests: at most this share of them.
NONE_SHARE = 0.5
DISTRUST_LINE = "Not trusting the sitemap lastmods of"
#: Stats that count INCREMENTAL_MAX_AGE refreshes (whichever the code has).
MAX_AGE_STATS = ("incremental/schedule/requested/max_age",
                 "incremental/lastmod/requested/max_age")
_VERSION = re.compile(r" v(\d+)$")


@dataclass
class Plan:
    """The site's pages, each day's changes and each crawl's clock offset."""

    pages: list[str]
    classes: dict[str, int]
    #: changes[d]: the pages changed before day d's crawl (none before day 0).
    changes: list[list[str]]
    #: Seconds added to the clock of day d's crawl (faketime).
    offsets: list[int]


def make_plan(pages: int, days: int, seed: int, jitter: int) -> Plan:
    rng = random.Random(seed)
    paths = [f"/p/{i:04d}" for i in range(pages)]
    daily, weekly, rare = [], {}, []
    for path in paths:
        u = rng.random()
        if u < DAILY_SHARE:
            daily.append(path)
        elif u < DAILY_SHARE + WEEKLY_SHARE:
            weekly[path] = rng.randrange(7)
        else:
            rare.append(path)
    changes: list[list[str]] = [[]]
    for d in range(1, days):
        day_rng = random.Random(f"{seed}:changes:{d}")
        changed = set(daily) | {p for p, wd in weekly.items() if d % 7 == wd}
        changed |= {p for p in rare if day_rng.random() < RARE_CHANCE}
        changes.append(sorted(changed))
    offsets = [d * DAY + random.Random(f"{seed}:jitter:{d}").randint(-jitter, jitter)
               for d in range(days)]
    return Plan(paths, {"daily": len(daily), "weekly": len(weekly), "rare": len(rare)},
                changes, offsets)


def offset_label(offset: int, day: int) -> str:
    """``+2d-03:10``: the crawl's start relative to day *day* at the same time."""
    rest = offset - day * DAY
    sign = "-" if rest < 0 else "+"
    return f"+{day}d{sign}{abs(rest) // 60:02d}:{abs(rest) % 60:02d}"


@dataclass
class Variant:
    name: str
    settings: dict[str, str]
    spider_args: dict[str, str] = field(default_factory=dict)
    #: Whether its decisions read sitemap lastmods (else run once, shown under each kind).
    reads_lastmods: bool = True
    ours: bool = False
    #: Cluster-mode workers per daily crawl (0: one ordinary process).
    workers: int = 0


@dataclass
class Day:
    page_requests: int = 0
    page_304: int = 0
    page_bytes: int = 0
    list_requests: int = 0
    list_304: int = 0
    list_bytes: int = 0
    #: Requests to pages with a change not yet emitted.
    to_changed: int = 0
    changed: int = 0
    items: int = 0
    unchanged_items: int = 0
    max_age: int | None = None
    distrusted: bool = False
    wall: float = 0.0
    #: Requests per page path (server log).
    requested: Counter[str] = field(default_factory=Counter)
    #: Requests per list path (robots.txt, sitemaps).
    lists: Counter[str] = field(default_factory=Counter)
    #: Changes emitted by this crawl: on time (made before this day's crawl),
    #: by path; late (made before an earlier crawl); not emitted after it.
    on_time: set[str] = field(default_factory=set)
    late: int = 0
    pending: int = 0
    #: Items of a page beyond its first in this crawl (two workers emitting it).
    dup_items: int = 0
    #: Cluster mode: each worker's downloader requests and items.
    worker_requests: list[int] = field(default_factory=list)
    worker_items: list[int] = field(default_factory=list)


@dataclass
class Run:
    variant: Variant
    kind: str
    days: list[Day] = field(default_factory=list)
    #: Crawls from a change to the first crawl emitting it, per emitted change.
    delays: list[int] = field(default_factory=list)
    missing: int = 0

    def total(self, name: str) -> int:
        return sum(getattr(d, name) for d in self.days[1:])

    @property
    def changes(self) -> int:
        return len(self.delays) + self.missing

    @property
    def on_time(self) -> float:
        return sum(1 for d in self.delays if d == 0) / self.changes if self.changes else 1.0

    @property
    def mean_late_delay(self) -> float | None:
        late = [d for d in self.delays if d > 0]
        return sum(late) / len(late) if late else None

    @property
    def first_distrust(self) -> int | None:
        return next((n for n, d in enumerate(self.days) if d.distrusted), None)


def item_version(item: dict) -> int | None:
    match = _VERSION.search(item.get("title") or "")
    return int(match.group(1)) if match else None


def run_variant(plan: Plan, variant: Variant, kind: str, args: argparse.Namespace,
                work: Path) -> Run:
    """Day 0 (cold) to the last day against a freshly started site."""
    run = Run(variant, kind)
    workdir = work / f"{variant.name}-{kind}"
    workdir.mkdir()
    settings = {k: v.replace("{workdir}", str(workdir)) for k, v in variant.settings.items()}
    if variant.ours:
        # The stats dump (INFO) tells the max-age refreshes apart.
        settings["LOG_LEVEL"] = "INFO"
    version = dict.fromkeys(plan.pages, 0)
    last_emitted: dict[str, int] = {}
    pending: list[tuple[str, int, int]] = []  # (path, day changed, version it became)
    extra = ["--sitemap-lastmods", kind, "--list-etags"]
    with contextlib.ExitStack() as stack:
        if variant.workers:
            # One throwaway Redis per run: the queue under a prefix of its
            # own, the state store follows the cluster URL (its default prefix).
            redis_server = stack.enter_context(RedisServer(workdir))
            settings.pop("INCREMENTAL_STATE_URI", None)
            settings["INCREMENTAL_CLUSTER_URL"] = redis_server.url(0)
            settings["INCREMENTAL_CLUSTER_PREFIX"] = f"bench:schedule:{kind}"
        site = stack.enter_context(Site(args.pages, args.page_size, "strong",
                                        extra_args=extra))
        for d in range(len(plan.offsets)):
            print(f"... {variant.name} [{kind}] day {d}", file=sys.stderr, flush=True)
            if plan.changes[d]:
                site.change_paths(plan.changes[d])
                for path in plan.changes[d]:
                    version[path] += 1
                    pending.append((path, d, version[path]))
            site.reset()
            waiting = {path for path, _, _ in pending}
            started = time.perf_counter()
            name = f"day{d:02d}"
            wrapper = ["faketime", "-f", f"{plan.offsets[d]:+d}"]
            day = Day(changed=len(plan.changes[d]))
            if variant.workers:
                results, stats, _ = run_workers(
                    site.base_url, variant.workers, settings, workdir, name,
                    timeout=args.timeout, spider_args=variant.spider_args,
                    allow_errors=False, wrapper=wrapper)
                day.worker_requests = [int(st.get("downloader/request_count", 0))
                                       for st in stats]
                day.worker_items = [r.items for r in results]
            else:
                results = [run_crawl(
                    site.base_url, settings, workdir, name, timeout=args.timeout,
                    spider_args=variant.spider_args, wrapper=wrapper)]
            day.wall = time.perf_counter() - started
            for record in site.log():
                path = record["path"].split("?", 1)[0]
                if path.startswith("/p/"):
                    day.page_requests += 1
                    day.page_304 += record["status"] == 304
                    day.page_bytes += record["body_bytes"]
                    day.to_changed += path in waiting
                    day.requested[path] += 1
                else:
                    day.list_requests += 1
                    day.list_304 += record["status"] == 304
                    day.list_bytes += record["body_bytes"]
                    day.lists[path] += 1
            # Every worker's feed together.
            items = [item for r in results for item in r.item_list]
            emitted: dict[str, int] = {}
            versioned = 0
            for item in items:
                v = item_version(item)
                if v is not None:
                    versioned += 1
                    path = urlsplit(item["url"]).path
                    emitted[path] = max(v, emitted.get(path, -1))
            day.items = len(items)
            day.dup_items = versioned - len(emitted)
            day.unchanged_items = sum(1 for p, v in emitted.items() if last_emitted.get(p) == v)
            last_emitted.update(emitted)
            still = []
            for path, when, v in pending:
                if emitted.get(path, -1) >= v:
                    run.delays.append(d - when)
                    if d == when:
                        day.on_time.add(path)
                    else:
                        day.late += 1
                else:
                    still.append((path, when, v))
            pending = still
            day.pending = len(pending)
            counted = [st for st in (logged_stats(r.log) for r in results)
                       if any(k in st for k in MAX_AGE_STATS)]
            if counted:  # summed over the workers
                day.max_age = sum(max(st.get(k, 0) for k in MAX_AGE_STATS) for st in counted)
            day.distrusted = any(DISTRUST_LINE in r.log for r in results)
            run.days.append(day)
            # Feeds and logs of 30 days x several variants add up: keep none.
            for leftover in workdir.glob(f"{name}*"):
                if leftover.suffix in (".jsonl", ".err"):
                    leftover.unlink(missing_ok=True)
    run.missing = len(pending)
    return run


def variants(kinds: list[str], cluster: int = 0) -> list[tuple[Variant, list[str]]]:
    """Each variant with the kinds it runs under."""
    common = {"INCREMENTAL_THROTTLE_ENABLED": "False", "CONCURRENT_REQUESTS": "16",
              "CONCURRENT_REQUESTS_PER_DOMAIN": "16"}
    state = ours_settings(Path("{workdir}") / "state.db")
    out = [
        (Variant("always-conditional",
                 {**common, **httpcache_revalidate_settings(Path("{workdir}") / "cache")},
                 reads_lastmods=False), kinds[:1]),
        (Variant("fixed-1d", {**common, **state,
                              "INCREMENTAL_REVISIT_INITIAL": str(DAY),
                              "INCREMENTAL_REVISIT_MIN": str(DAY),
                              "INCREMENTAL_REVISIT_MAX": str(DAY),
                              "INCREMENTAL_REVISIT_INC_RATE": "0",
                              "INCREMENTAL_REVISIT_DEC_RATE": "0"},
                 {"use_lastmod": "false"}, reads_lastmods=False), kinds[:1]),
        (Variant("ours", {**common, **state}, ours=True), kinds),
    ]
    if "none" in kinds:
        out.append((Variant("ours-fresh", {**common, **state,
                                           "INCREMENTAL_REVISIT_MAX": str(2 * DAY)},
                            ours=True), ["none"]))
    if cluster:
        # The state store follows INCREMENTAL_CLUSTER_URL (set by run_variant).
        out.append((Variant("ours-cluster", dict(common), ours=True, workers=cluster), kinds))
    return out


def fmt_delay(run: Run) -> str:
    late = run.mean_late_delay
    return "-" if late is None else f"{late:.2f}"


def summary_row(run: Run, shown_kind: str) -> list[object]:
    name = run.variant.name + ("" if run.kind == shown_kind else " *")
    return [name, run.total("page_requests"), run.total("page_304"), run.total("page_bytes"),
            f"{run.total('list_requests')}/{run.total('list_304')}",
            run.total("list_bytes"), run.changes, f"{run.on_time:.1%}", fmt_delay(run),
            run.missing, run.total("unchanged_items"), f"{sum(d.wall for d in run.days):.0f}"]


def print_kind(kind: str, runs: list[Run], plan: Plan, sample: int) -> None:
    print(f"\n== sitemap lastmods: {kind} ==")
    print_table(["variant", "page req", "304s", "page bytes", "lists req/304", "list bytes",
                 "changes", "on time", "mean delay", "missing", "unchanged items",
                 "wall s"], [summary_row(r, kind) for r in runs])
    if any(r.kind != kind for r in runs):
        print(f"  * does not read lastmods: run once (against the {runs[0].kind} site), "
              "shown under every kind")
    print("  sums over days 1.. (day 0, the cold crawl, apart); on time = emitted by the "
          "first crawl after the change; mean delay (crawls) of the others; missing = "
          "not emitted by the last crawl")
    print("per day: page requests (304s) per variant; ours: to changed = requests to "
          "pages with a change not yet emitted, bound = changed + sample "
          f"({sample}) [+ max-age refreshes counted by the crawl's stats]")
    headers = ["day", "clock", "changed", *(r.variant.name for r in runs)]
    ours_runs = [r for r in runs if r.variant.ours]
    for r in ours_runs:
        headers += [f"{r.variant.name}: to changed", "bound", "ok"]
    rows = []
    for d in range(len(plan.offsets)):
        row: list[object] = [d, offset_label(plan.offsets[d], d), len(plan.changes[d])]
        for r in runs:
            day = r.days[d]
            row.append(f"{day.page_requests} ({day.page_304})"
                       + (" D" if r.variant.ours and day.distrusted else ""))
        for r in ours_runs:
            day = r.days[d]
            bound = day.changed + sample
            extra = f"+{day.max_age}" if day.max_age else ""
            ok = "cold" if d == 0 else ("yes" if day.page_requests <= bound + (day.max_age or 0)
                                        else "no")
            row += [day.to_changed, f"{bound}{extra}", ok]
        rows.append(row)
    print_table(headers, rows)
    if any(r.variant.ours for r in runs):
        print("  D = the crawl logged \"Not trusting the sitemap lastmods of ...\"")


def request_diff(ours: Day, other: Day) -> str:
    """Why a day's page requests differ: pages fetched more than once, pages
    only one of the two requested (how many of those had a change pending)."""
    twice = sum(c - 1 for c in other.requested.values() if c > 1)
    twice_ours = sum(c - 1 for c in ours.requested.values() if c > 1)
    only_other = set(other.requested) - set(ours.requested)
    only_ours = set(ours.requested) - set(other.requested)
    parts = [(f"{other.page_requests - ours.page_requests:+d}: fetched more than once "
              f"{twice} (ours {twice_ours})")]
    if only_other:
        parts.append(f"only ours-cluster asked {len(only_other)} pages")
    if only_ours:
        parts.append(f"only ours asked {len(only_ours)} pages")
    return ", ".join(parts)


def compare_cluster(kind: str, ours: Run, cluster: Run, plan: Plan) -> tuple[bool, bool]:
    """ours vs ours-cluster, per day; whether the requests and on-time
    changes agree on every day."""
    n = cluster.variant.workers
    print(f"\n-- [{kind}] ours (one process) vs ours-cluster ({n} cluster-mode workers, one "
          "throwaway Redis for queue and state) --")
    print("per day, ours / ours-cluster: page requests (304s), page bytes, list requests, "
          "changes emitted "
          "on time / late / not yet emitted, unchanged items; cluster: items emitted twice, "
          "each worker's downloader requests (lists included) and items; same = the same "
          "page requests and the same changes on time")
    rows = []
    req_days: list[str] = []
    time_days: list[str] = []
    list_days: list[str] = []
    for d in range(len(plan.offsets)):
        a, b = ours.days[d], cluster.days[d]
        same_req = a.page_requests == b.page_requests
        same_time = a.on_time == b.on_time
        if not same_req:
            req_days.append(f"day {d} {request_diff(a, b)}")
        if a.lists != b.lists:
            more = ", ".join(f"{p} {c:+d}" for p, c in sorted(
                (p, b.lists[p] - a.lists[p]) for p in set(a.lists) | set(b.lists))
                if c)
            list_days.append(f"day {d}: {more}")
        if not same_time:
            time_days.append(f"day {d}: only ours {len(a.on_time - b.on_time)}, only "
                             f"ours-cluster {len(b.on_time - a.on_time)}")
        rows.append([d, a.changed,
                     f"{a.page_requests} ({a.page_304}) / {b.page_requests} ({b.page_304})",
                     f"{a.page_bytes} / {b.page_bytes}",
                     f"{a.list_requests} / {b.list_requests}",
                     (f"{len(a.on_time)}/{a.late}/{a.pending} / "
                      f"{len(b.on_time)}/{b.late}/{b.pending}"),
                     f"{a.unchanged_items} / {b.unchanged_items}", b.dup_items,
                     "+".join(map(str, b.worker_requests)),
                     "+".join(map(str, b.worker_items)),
                     f"{a.wall:.1f} / {b.wall:.1f}",
                     "yes" if same_req and same_time else "no"])
    print_table(["day", "changed", "page req (304s)", "page bytes", "lists req",
                 "on time/late/pending",
                 "unchanged items", "dup items", "worker req", "worker items", "wall s",
                 "same"], rows)
    print(f"[{kind}] ours-cluster's page requests = ours' on every day: "
          f"{verdict(not req_days)}" + (f" ({'; '.join(req_days)})" if req_days else ""))
    print(f"[{kind}] ours-cluster emits the same changes on time as ours on every day: "
          f"{verdict(not time_days)} ({cluster.on_time:.1%} vs {ours.on_time:.1%} on time, "
          f"{cluster.missing} vs {ours.missing} missing)"
          + (f" ({'; '.join(time_days)})" if time_days else ""))
    if list_days:
        print(f"  [{kind}] list requests differ (ours-cluster minus ours): "
              + "; ".join(list_days))
    return not req_days, not time_days


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--pages", type=int, default=2000, help="pages on the site (2000)")
    p.add_argument("--page-size", type=int, default=3000, help="HTML bytes per page (3000)")
    p.add_argument("--days", type=int, default=30, help="daily crawls, the cold one included (30)")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"sitemap lastmod kinds ({','.join(KINDS)})")
    p.add_argument("--seed", type=int, default=1, help="seed of change rates and jitter (1)")
    p.add_argument("--jitter", type=int, default=300,
                   help="crawl start jitter, seconds either way (300)")
    p.add_argument("--timeout", type=float, default=300, help="max seconds per crawl (300)")
    p.add_argument("--jobs", type=int, default=2,
                   help="variant runs at once, each against its own site (2); the figures "
                        "are the server's counts and the items, which do not depend on it")
    p.add_argument("--cluster", type=int, default=0, metavar="N",
                   help="also run ours-cluster: ours as N cluster-mode workers per daily "
                        "crawl sharing a throwaway redis-server (0: not run)")
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if bad := [k for k in kinds if k not in KINDS]:
        p.error(f"unknown --kinds {bad}; choose from {','.join(KINDS)}")
    if args.days < 2 or args.pages < 1 or args.cluster < 0:
        p.error("--days must be >= 2, --pages >= 1 and --cluster >= 0")
    if shutil.which("faketime") is None:
        print("schedule.py needs the faketime command (Debian package faketime): every "
              "crawl runs on its own simulated day. Not run.", file=sys.stderr)
        return 2
    if args.cluster and shutil.which("redis-server") is None:
        print("--cluster needs the redis-server command (a throwaway one per run). Not run.",
              file=sys.stderr)
        return 2

    plan = make_plan(args.pages, args.days, args.seed, args.jitter)
    sample = sample_bound(args.pages)
    began = time.perf_counter()
    runs: dict[tuple[str, str], Run] = {}
    with tempfile.TemporaryDirectory(prefix="bench-schedule-") as tmp:
        work = Path(tmp)
        todo = [(v, k) for v, vkinds in variants(kinds, args.cluster) for k in vkinds]
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            futures = {(v.name, k): pool.submit(run_variant, plan, v, k, args, work)
                       for v, k in todo}
            # In submission order: the tables list the variants in this order.
            runs = {key: future.result() for key, future in futures.items()}
    elapsed = time.perf_counter() - began

    made = sum(len(c) for c in plan.changes)
    print(f"schedule: {args.pages} pages x {args.page_size} B (strong validators; ETags on "
          f"robots.txt and sitemaps), {args.days} daily crawls under faketime "
          f"(start jitter +-{args.jitter} s), seed {args.seed}; change rates: "
          f"{plan.classes['daily']} pages daily, {plan.classes['weekly']} weekly, "
          f"{plan.classes['rare']} rarely (1/60 per day): {made} changes over days "
          f"1..{args.days - 1}; politeness off, CONCURRENT_REQUESTS=16 for every variant")
    table: dict[str, list[Run]] = {}
    for kind in kinds:
        table[kind] = [r for (name, k), r in runs.items()
                       if k == kind or not r.variant.reads_lastmods]
        print_kind(kind, table[kind], plan, sample)

    print("\n== summary (days 1..; ratios against always-conditional) ==")
    rows = []
    for kind in kinds:
        base = table[kind][0]
        base_bytes = base.total("page_bytes") + base.total("list_bytes")
        for r in table[kind]:
            total_bytes = r.total("page_bytes") + r.total("list_bytes")
            rows.append([kind, r.variant.name, r.total("page_requests"),
                         ratio(r.total("page_requests"), base.total("page_requests")),
                         total_bytes, ratio(total_bytes, base_bytes), f"{r.on_time:.1%}",
                         fmt_delay(r), r.missing, r.total("unchanged_items")])
    print_table(["kind", "variant", "page req", "vs always-cond", "bytes (pages+lists)",
                 "vs always-cond", "on time", "mean delay", "missing", "unchanged items"],
                rows)

    print()
    if "honest" in kinds:
        r = runs["ours", "honest"]
        over = [n for n, d in enumerate(r.days) if n and
                d.page_requests > d.changed + sample + (d.max_age or 0)]
        print(f"honest: ours' page requests <= changed + sample (+ max-age) on every day: "
              f"{verdict(not over)}" + (f" (over on days {over})" if over else ""))
        print(f"honest: ours emits every change by the next crawl: {r.on_time:.1%} on time, "
              f"{r.missing} missing: {verdict(r.on_time == 1.0 and not r.missing)}")
    if "stale" in kinds:
        r = runs["ours", "stale"]
        first = r.first_distrust
        print(f"stale: ours distrusts the lastmods within {STALE_DAYS} days: "
              + (f"day {first}" if first is not None else "never")
              + f": {verdict(first is not None and first <= STALE_DAYS)}"
              + f" ({r.on_time:.1%} of changes on time, {r.missing} missing)")
    if "none" in kinds:
        base = table["none"][0]
        for name in ("ours", "ours-fresh"):
            r = runs[name, "none"]
            share = r.total("page_requests") / max(base.total("page_requests"), 1)
            print(f"none: {name} sends {share:.1%} of always-conditional's page requests "
                  f"(target <= {NONE_SHARE:.0%}): {verdict(share <= NONE_SHARE)}; cost: "
                  f"{r.on_time:.1%} of changes on time, mean delay of the others "
                  f"{fmt_delay(r)} crawls, {r.missing} missing")
    if args.cluster:
        for kind in kinds:
            compare_cluster(kind, runs["ours", kind], runs["ours-cluster", kind], plan)
    print(f"wall time: {elapsed:.0f} s ({args.jobs} variant runs at once; the wall s "
          "columns are per run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
