"""The machine-readable report (``report.json``): what it holds, built from a crawl.

One JSON object, versioned (:data:`SCHEMA`, :data:`VERSION`); every field
is described in ``docs/report.md``. A crawl's report
(:func:`crawl_report`) holds the end-of-crawl report's figures, the
per-host table, the per-slot politeness series and the scope's last
crawls; the history report of ``scrapy report`` (:func:`history_report`)
holds what the store alone knows: the last crawls and the stored hosts.

Pure: the callers read the crawl (stats, counters, trust, the store) and
hand the values in. :mod:`~incremental_crawler.report.page` turns the
object into the HTML page.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from incremental_crawler.change.host_counts import OTHER_HOSTS
from incremental_crawler.change.policy import Verdict
from incremental_crawler.report.extension import OUTCOMES, REQUESTED, summarize

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from incremental_crawler.state.records import CrawlRecord, HostTrust
    from incremental_crawler.state.stores.base import HostSummary

__all__ = [
    "HOSTS_SHOWN", "REVISION", "SCHEMA", "VERSION", "crawl_report", "history_entries",
    "history_report", "host_rows", "trust_fields",
]

#: What the object is, and the version of its layout (bumped when a field
#: changes meaning or goes; new fields may appear within a version).
SCHEMA = "incremental-crawler-report"
VERSION = 1
#: Which fields of the version the object has: bumped when fields are added.
#: 2: the accounting of known pages (``summary.pages_*``, ``hosts[].outcomes``).
REVISION = 2
#: Host rows in a crawl's report, at most (the busiest; the rest summed).
HOSTS_SHOWN = 100


def _iso(timestamp: float | None) -> str | None:
    if not timestamp:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


# -- trust ----------------------------------------------------------------------


def trust_fields(trust: HostTrust | None, now: float, *, probation_after: int) -> dict[str, Any]:
    """A host's stored lastmod and validator trust, as the report shows it."""
    if trust is None:
        return {"lastmod_trust": "no evidence", "lastmod_checks": 0, "lastmod_lies": 0,
                "lastmod_stale": 0, "lastmod_distrusted_until": None,
                "validator_trust": "no evidence", "validators_distrusted_until": None,
                "validators_consistent": 0, "validators_unstable_since": None}
    if trust.distrusted_until > now:
        lastmod = "distrusted"
    elif trust.stale_lastmods >= probation_after:
        lastmod = "on probation"
    else:
        lastmod = "trusted"
    validators = "trusted"
    if trust.validators_distrusted_until > now:
        validators = "distrusted"
    elif trust.validators_unstable_since:
        validators = "unstable"
    return {
        "lastmod_trust": lastmod,
        "lastmod_checks": trust.checks,
        "lastmod_lies": trust.lies,
        "lastmod_stale": trust.stale_lastmods,
        "lastmod_distrusted_until": _iso(trust.distrusted_until if lastmod == "distrusted"
                                         else None),
        "validator_trust": validators,
        "validators_distrusted_until": _iso(trust.validators_distrusted_until
                                            if validators == "distrusted" else None),
        "validators_consistent": trust.validators_consistent,
        "validators_unstable_since": _iso(trust.validators_unstable_since),
    }


# -- the per-host table -------------------------------------------------------------


def _host_row(host: str, counts: dict[str, int]) -> dict[str, Any]:
    requested = {str(why): counts.get(f"requested/{why}", 0) for why in REQUESTED}
    checks = {k.removeprefix("requests/"): v for k, v in counts.items()
              if k.startswith("requests/")}
    return {
        "host": host,
        "requested": sum(requested.values()),
        "requested_by_reason": requested,
        "skipped_lastmod": counts.get("skipped_lastmod", 0),
        "not_due": counts.get("not_due", 0),
        "failed": counts.get("failed", 0),
        "checked": sum(checks.values()),
        "conditional": checks.get("conditional", 0),
        "not_modified": counts.get("not_modified", 0),
        "new": counts.get("pages_new", 0),
        "changed": counts.get("pages_changed", 0),
        "unchanged_200": counts.get("pages_unchanged", 0),
        "bytes_saved_estimate": counts.get("bytes_saved_estimate", 0),
        "bytes_skipped": counts.get("bytes_skipped", 0),
        "outcomes": {str(outcome): counts.get(f"outcome/{outcome}", 0) for outcome in OUTCOMES},
    }


def _activity(row: dict[str, Any]) -> int:
    return row["requested"] + row["checked"] + row["skipped_lastmod"] + row["not_due"]


def host_rows(table: dict[str, dict[str, int]], verdicts: dict[str, dict[str, int]],
              trust: Callable[[str], dict[str, Any]], *,
              shown: int = HOSTS_SHOWN) -> list[dict[str, Any]]:
    """One row per host (the *shown* busiest; the others summed in one row).

    *table*: host -> event -> count (:class:`~incremental_crawler.change.host_counts.HostCounts`);
    *verdicts*: host -> validator verdict -> pages; *trust*: host -> :func:`trust_fields`.
    """
    rows = [_host_row(host, counts) for host, counts in table.items()]
    rows.extend(_host_row(host, {}) for host in verdicts.keys() - table.keys())
    rows.sort(key=lambda r: (r["host"].startswith("("), -_activity(r), r["host"]))
    kept, rest = rows[:shown], rows[shown:]
    if rest:
        total: dict[str, int] = {}
        for host in (r["host"] for r in rest):
            for event, n in table.get(host, {}).items():
                total[event] = total.get(event, 0) + n
        kept.append(_host_row(OTHER_HOSTS, total))
    for row in kept:
        host = row["host"]
        found = verdicts.get(host, {})
        row["validators"] = {str(v): int(found.get(v, 0)) for v in Verdict}
        row.update(trust(host) if not host.startswith("(") else {})
    return kept


# -- history ----------------------------------------------------------------------


def history_entries(records: Iterable[CrawlRecord]) -> list[dict[str, Any]]:
    """The stored crawl records, newest first, as the report lists them."""
    return [{
        "started": record.started,
        "started_at": _iso(record.started),
        "finished": record.finished,
        "worker": record.worker,
        "reason": record.reason,
        "figures": dict(record.figures),
    } for record in records]


# -- the whole object -----------------------------------------------------------------


def crawl_report(*, stats: dict[str, Any], lines: list[str], scope: str, spider: str,
                 worker: str, reason: str, started: float, finished: float,
                 hosts: list[dict[str, Any]],
                 politeness: dict[str, Any] | None, history: list[dict[str, Any]],
                 slot_stats: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A crawl's report: see ``docs/report.md`` for every field.

    *lines*: the end-of-crawl report's lines
    (:func:`~incremental_crawler.report.extension.crawl_lines`).
    """
    summary = summarize(stats)
    if politeness is not None:
        for key, final in slot_stats.items():
            if key in politeness["slots"]:
                politeness["slots"][key]["final"] = final
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "revision": REVISION,
        "kind": "crawl",
        "generated_at": _iso(finished),
        "crawl": {
            "scope": scope,
            "spider": spider,
            "worker": worker,
            "reason": reason,
            "started": started,
            "started_at": _iso(started),
            "finished": finished,
            "finished_at": _iso(finished),
            "duration_s": round(max(0.0, finished - started), 3),
        },
        "summary": summary,
        "report_lines": lines,
        "hosts": hosts,
        "politeness": politeness,
        "history": history,
    }


def history_report(*, scope: str, generated: float, history: list[dict[str, Any]],
                   hosts: list[HostSummary], probation_after: int,
                   store: str) -> dict[str, Any]:
    """``scrapy report``'s object: the scope's stored crawls and hosts."""
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "revision": REVISION,
        "kind": "history",
        "generated_at": _iso(generated),
        "scope": scope,
        "store": store,
        "stored_hosts": [{
            "host": h.host, "pages": h.pages, "due": h.due, "gone": h.gone,
            "failing": h.failing, "stored_bytes": h.size,
            **trust_fields(h.trust, generated, probation_after=probation_after),
        } for h in hosts],
        "history": history,
    }
