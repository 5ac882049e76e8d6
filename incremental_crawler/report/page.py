"""The HTML report: one self-contained page, from a report object.

The page opens from disk (``file://``) with no network at all: its styles
are inline and its charts are drawn by Plotly.js, read from the ``plotly``
Python package's own copy (``plotly/package_data/plotly.min.js``) and
written into the page. The ``plotly`` Python package itself is never
imported (its figure classes cost more CPU than the whole report may): the
charts are Plotly.js figure objects (``data`` and ``layout``) written as
JSON, the format Plotly.js documents and draws as it is.

Why Plotly.js: interactive (zoom, hover values, toggling a series), well
kept, MIT, and one file we can embed from a pinned PyPI package; its cost is
the page's size, about 4.8 MB. ``docs/report.md`` compares it with
matplotlib and Bokeh. That is why one page holds several crawls' reports
(the ones a report directory keeps), one section each, drawn when shown:
Plotly.js once, not once per crawl.
"""

from __future__ import annotations

import html
import importlib.util
import json
import re
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from incremental_crawler.formats import size

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["INSTALL_REPORT", "PlotlyMissing", "plotly_js", "plotly_js_path", "render_parts"]

#: Colours of the series, the same in every chart.
COLOURS = {
    "rate": "#1f77b4", "window": "#9ecae1", "p50": "#2ca02c", "p95": "#98df8a",
    "429": "#d62728", "5xx": "#ff7f0e", "timeouts": "#9467bd", "frozen": "rgba(214,39,40,0.13)",
    "requests": "#1f77b4", "not_modified": "#2ca02c", "changed": "#d62728", "new": "#ff7f0e",
    "received": "#1f77b4", "saved": "#2ca02c", "skipped": "#98df8a", "duration": "#7f7f7f",
}
#: Plotly.js options of every chart: no logo link, no network.
CONFIG = {"displaylogo": False, "responsive": True}


class PlotlyMissing(RuntimeError):
    """The ``plotly`` package (and its Plotly.js) is not installed."""


#: What to install for the HTML report: the package's ``report`` extra.
INSTALL_REPORT = "pip install 'incremental-crawler[report]'"


def plotly_js_path() -> Path:
    """Where the installed ``plotly`` package keeps Plotly.js (not read).

    Found without importing the package (its import costs ~0.1 s of CPU).
    Raises :class:`PlotlyMissing` when ``plotly`` is not installed: it is an
    extra of this package (``report``), not a requirement.
    """
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise PlotlyMissing(f"the HTML report needs the 'plotly' package: {INSTALL_REPORT}")
    return Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"


@cache
def plotly_js() -> tuple[bytes, str]:
    """Plotly.js as the installed ``plotly`` package ships it (bytes, written
    into pages as they are), and its version."""
    path = plotly_js_path()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PlotlyMissing(f"Plotly.js not found in the plotly package: {exc}") from exc
    found = re.search(rb"plotly\.js v(\d+\.\d+\.\d+)", data[:500])
    return data, found.group(1).decode() if found else "unknown"


# -- formats ------------------------------------------------------------------------


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _when(iso: str | None) -> str:
    return iso.replace("T", " ").replace("Z", " UTC") if iso else "-"


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


# -- charts -------------------------------------------------------------------------


def _plain(text: str) -> str:
    """*text* shown as it is by Plotly.js, which reads tags (``<b>``, ``<a href>``)
    in titles and hover texts: ``&``, ``<`` and ``>`` as entities, which it shows."""
    return html.escape(text, quote=False)


def slot_figure(key: str, slot: dict[str, Any], times: list[float]) -> dict[str, Any]:
    """One slot's chart: rate, latency and errors over time, freezes shaded."""

    def line(name: str, series: str, colour: str, axis: str, **extra: Any) -> dict[str, Any]:
        # Markers too: a slot seen in one sample only still shows.
        return {"type": "scatter", "mode": "lines+markers", "marker": {"size": 3},
                "name": name, "x": times,
                "y": slot[series], "yaxis": axis, "line": {"color": colour, "width": 2},
                "connectgaps": False, **extra}

    data = [
        line("effective rate (req/s)", "rate", COLOURS["rate"], "y3"),
        line("window (req/s)", "window", COLOURS["window"], "y3", line={
            "color": COLOURS["window"], "width": 2, "dash": "dot"}),
        line("latency p50 (ms)", "latency_p50_ms", COLOURS["p50"], "y2"),
        line("latency p95 (ms)", "latency_p95_ms", COLOURS["p95"], "y2"),
        line("429 (total)", "status_429", COLOURS["429"], "y", line={
            "color": COLOURS["429"], "width": 2, "shape": "hv"}),
        line("5xx (total)", "status_5xx", COLOURS["5xx"], "y", line={
            "color": COLOURS["5xx"], "width": 2, "shape": "hv"}),
        line("timeouts (total)", "timeouts", COLOURS["timeouts"], "y", line={
            "color": COLOURS["timeouts"], "width": 2, "shape": "hv"}),
    ]
    spans = slot["frozen_spans"]
    shapes = [{
        "type": "rect", "xref": "x", "yref": "paper", "x0": s["start_s"], "x1": s["end_s"],
        "y0": 0, "y1": 1, "fillcolor": COLOURS["frozen"], "line": {"width": 0},
        "layer": "below", "name": "frozen", "showlegend": i == 0,
    } for i, s in enumerate(spans)]
    if spans:
        # The freezes' reasons on hover, where each starts.
        data.append({
            "type": "scatter", "mode": "markers", "name": "freeze (why on hover)",
            "x": [s["start_s"] for s in spans], "y": [1.0] * len(spans), "yaxis": "y4",
            "text": [_plain(f"frozen {s['end_s'] - s['start_s']:.1f} s: {s['why']}")
                     for s in spans],
            "hovertemplate": "%{text}<extra></extra>",
            "marker": {"symbol": "triangle-down", "size": 10, "color": COLOURS["429"]},
        })
    layout = {
        "title": {"text": _plain(f"{key}: {slot['freezes']} freezes"), "font": {"size": 15}},
        "height": 520, "margin": {"l": 70, "r": 20, "t": 50, "b": 45},
        "hovermode": "x unified", "shapes": shapes,
        "legend": {"orientation": "h", "y": -0.12},
        "xaxis": {"title": {"text": "seconds since the crawl started"}, "anchor": "y",
                  "rangemode": "tozero"},
        "yaxis3": {"domain": [0.70, 1.0], "title": {"text": "req/s"}, "rangemode": "tozero"},
        "yaxis2": {"domain": [0.36, 0.64], "title": {"text": "latency ms"},
                   "rangemode": "tozero"},
        "yaxis": {"domain": [0.0, 0.30], "title": {"text": "errors"}, "rangemode": "tozero"},
        # The freeze markers' axis: along the top, not drawn.
        "yaxis4": {"domain": [0.96, 1.0], "visible": False, "range": [0, 1.2],
                   "fixedrange": True},
    }
    return {"data": data, "layout": layout}


def _runs(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history oldest first, a cluster run's workers summed into one entry."""
    runs: dict[float, dict[str, Any]] = {}
    for entry in history:
        run = runs.setdefault(entry["started"], {"started_at": entry["started_at"],
                                                 "workers": 0, "figures": {},
                                                 "reasons": set()})
        run["workers"] += 1
        run["reasons"].add(entry["reason"] or "?")
        for name, value in entry["figures"].items():
            if name == "duration":
                run["figures"][name] = max(run["figures"].get(name, 0), value)
            else:
                run["figures"][name] = run["figures"].get(name, 0) + value
    return [runs[started] for started in sorted(runs)]


def history_figures(history: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The scope's last crawls: pages (requests, 304s, changes) and bytes."""
    runs = _runs(history)
    if not runs:
        return {}
    x = [_when(run["started_at"]) for run in runs]

    def bars(name: str, figure: str, colour: str, **extra: Any) -> dict[str, Any]:
        return {"type": "bar", "name": name, "x": x,
                "y": [run["figures"].get(figure, 0) for run in runs],
                "marker": {"color": colour}, **extra}

    changes = {"type": "bar", "name": "changed + new pages", "x": x,
               "y": [run["figures"].get("pages_changed", 0) + run["figures"].get("pages_new", 0)
                     for run in runs], "marker": {"color": COLOURS["changed"]}}
    common = {"height": 360, "margin": {"l": 70, "r": 60, "t": 50, "b": 90},
              "legend": {"orientation": "h", "y": -0.35}, "hovermode": "x unified",
              "xaxis": {"type": "category", "title": {"text": "crawl (start, UTC)"}}}
    pages = {
        "data": [bars("requests", "requests", COLOURS["requests"]),
                 bars("304 not modified", "not_modified", COLOURS["not_modified"]),
                 changes,
                 # Older records have no 429 count: no point for them.
                 {"type": "scatter", "mode": "lines+markers", "name": "429 answers", "x": x,
                  "y": [run["figures"].get("responses_429") for run in runs],
                  "line": {"color": COLOURS["5xx"]}}],
        "layout": {**common, "barmode": "group", "title": {"text": "Pages per crawl"},
                   "yaxis": {"title": {"text": "pages"}, "rangemode": "tozero"}},
    }
    volume = {
        "data": [bars("received", "bytes_received", COLOURS["received"]),
                 bars("saved by 304s (est.)", "bytes_saved", COLOURS["saved"]),
                 bars("not requested (stored size)", "bytes_skipped", COLOURS["skipped"]),
                 {"type": "scatter", "mode": "lines+markers", "name": "duration (s)", "x": x,
                  "y": [run["figures"].get("duration", 0) for run in runs], "yaxis": "y2",
                  "line": {"color": COLOURS["duration"]}}],
        "layout": {**common, "barmode": "stack", "title": {"text": "Bytes and duration per crawl"},
                   "yaxis": {"title": {"text": "bytes"}, "rangemode": "tozero"},
                   "yaxis2": {"title": {"text": "seconds"}, "overlaying": "y", "side": "right",
                              "rangemode": "tozero", "showgrid": False}},
    }
    return {"history-pages": pages, "history-bytes": volume}


# -- HTML ---------------------------------------------------------------------------

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;
 color:#222;background:#f6f7f9}
main{max-width:1200px;margin:0 auto;padding:16px 24px 40px}
h1{font-size:22px;margin:8px 0 4px}h2{font-size:18px;margin:28px 0 8px;
 border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555;margin-bottom:12px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{background:#fff;border:1px solid #e1e4e8;border-radius:6px;padding:8px 12px;
 min-width:120px}
.card b{display:block;font-size:20px}.card span{color:#555;font-size:12px}
pre{background:#fff;border:1px solid #e1e4e8;border-radius:6px;padding:8px 12px;
 white-space:pre-wrap;font-size:12.5px}
table{border-collapse:collapse;background:#fff;font-size:12.5px;margin:6px 0;width:100%}
th,td{border:1px solid #e1e4e8;padding:3px 6px;text-align:right;white-space:nowrap}
th{background:#f0f2f5;white-space:normal;vertical-align:bottom}td.l,th.l{text-align:left}
.scroll{overflow-x:auto}.chart{background:#fff;border:1px solid #e1e4e8;border-radius:6px;
 margin:10px 0}
.note{color:#555;font-size:12.5px}.bad{color:#b00020}.good{color:#2e7d32}
footer{color:#777;font-size:12px;margin-top:30px}
nav.crawls{font-size:12.5px;margin:8px 0}nav.crawls ul{margin:4px 0;padding-left:20px}
"""

SCRIPT = """
(function () {
  var figures = JSON.parse(document.getElementById("report-figures").textContent);
  var config = JSON.parse(document.getElementById("report-config").textContent);
  var sections = Array.prototype.slice.call(document.querySelectorAll("section.crawl"));
  // One crawl shown at a time, the one the address names (#report-<time>),
  // else the first; its charts drawn when first shown (a hidden element has
  // no size to draw in).
  function show() {
    var wanted = decodeURIComponent(location.hash.slice(1));
    var shown = sections.filter(function (s) { return s.id === wanted; })[0] || sections[0];
    sections.forEach(function (s) { s.hidden = s !== shown; });
    document.title = shown.getAttribute("data-title");
    var ids = Object.keys(figures).filter(function (id) {
      return figures[id].section === shown.id;
    });
    document.body.removeAttribute("data-charts-rendered");
    Promise.all(ids.map(function (id) {
      var element = document.getElementById(id);
      if (element.classList.contains("js-plotly-plot")) {
        return Plotly.Plots.resize(element);
      }
      return Plotly.newPlot(element, figures[id].data, figures[id].layout, config);
    })).then(function () {
      document.body.setAttribute("data-charts-rendered", String(ids.length));
    });
  }
  window.addEventListener("hashchange", show);
  show();
})();
"""


def _chart_div(element_id: str, figure: dict[str, Any]) -> str:
    # The chart's own height: "responsive" fits a chart to its element. Its
    # name without the crawl's prefix (slot-0, history-pages), for scripts.
    height = figure["layout"]["height"]
    return (f'<div class="chart" id="{_e(element_id)}" data-chart="{_e(figure["name"])}" '
            f'style="height:{height}px"></div>')


def _table(headers: list[str], rows: list[list[str]], *, left: int = 1) -> str:
    head = "".join(f'<th class="{"l" if i < left else ""}">{_e(h)}</th>'
                   for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{cell}</td>'
                         for i, cell in enumerate(row)) + "</tr>" for row in rows)
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            "</table></div>")


def _trust_cell(state: str | None, until: str | None) -> str:
    if not state:
        return "-"
    css = {"distrusted": "bad", "unstable": "bad", "on probation": "bad",
           "trusted": "good"}.get(state, "")
    text = _e(state) + (f" until {_e(_when(until))}" if until else "")
    return f'<span class="{css}">{text}</span>'


def _requested_cell(row: dict[str, Any]) -> str:
    reasons = ", ".join(f"{why.replace('_', ' ')} {n:,}"
                        for why, n in row["requested_by_reason"].items() if n)
    return _n(row["requested"]) + (f' <span class="note">({_e(reasons)})</span>'
                                   if reasons else "")


def _hosts_section(hosts: list[dict[str, Any]]) -> str:
    if not hosts:
        return '<p class="note">No page was counted this crawl.</p>'
    headers = ["host", "requested (why)", "skipped (lastmod)", "not due", "checked", "304",
               "changed", "new", "unchanged (200)", "failed", "bytes saved (304s)",
               "bytes not requested", "validators: reliable / unstable / lying / absent",
               "validator trust", "lastmod trust"]
    rows = []
    for h in hosts:
        v = h["validators"]
        rows.append([
            f'<span class="host">{_e(h["host"])}</span>', _requested_cell(h),
            _n(h["skipped_lastmod"]), _n(h["not_due"]), _n(h["checked"]),
            _n(h["not_modified"]), _n(h["changed"]), _n(h["new"]), _n(h["unchanged_200"]),
            _n(h["failed"]), size(h["bytes_saved_estimate"]), size(h["bytes_skipped"]),
            " / ".join(_n(v.get(k, 0)) for k in ("reliable", "unstable", "lying", "absent")),
            _trust_cell(h.get("validator_trust"), h.get("validators_distrusted_until")),
            _trust_cell(h.get("lastmod_trust"), h.get("lastmod_distrusted_until")),
        ])
    return _table(headers, rows)


def _history_section(history: list[dict[str, Any]], figures: dict[str, Any]) -> str:
    if not history:
        return '<p class="note">No crawl of this scope is stored yet.</p>'
    charts = "".join(_chart_div(i, figure) for i, figure in figures.items())
    rows = []
    for entry in history:
        f = entry["figures"]
        rows.append([
            _e(_when(entry["started_at"])), _e(entry["worker"] or "-"), _e(entry["reason"]),
            _n(f.get("requests")), _n(f.get("not_modified")),
            _n(f.get("pages_changed", 0) + f.get("pages_new", 0)),
            _n(f.get("skipped_lastmod")), _n(f.get("not_due")), _n(f.get("failed")),
            _n(f.get("responses_429")), size(f.get("bytes_received", 0)),
            size(f.get("bytes_saved", 0)),
            f"{f.get('duration', 0):.1f} s",
        ])
    table = _table(["started (UTC)", "worker", "end", "requests", "304", "changed + new",
                    "skipped (lastmod)", "not due", "failed", "429", "bytes received",
                    "bytes saved (304s)", "duration"], rows, left=3)
    return charts + table


def _slot_rows(slots: dict[str, Any]) -> list[list[str]]:
    rows = []
    for key, slot in slots.items():
        final = slot.get("final", {})
        rows.append([
            _e(key), _n(slot["requests"][-1] if slot["requests"] else 0),
            f"{final.get('rate', 0):.2f}", _e(final.get("limit") or "-"),
            f"{final.get('latency_p50_ms', 0):.0f} / {final.get('latency_p95_ms', 0):.0f}",
            _n(final.get("status_429", 0)), _n(final.get("status_5xx", 0)),
            _n(final.get("timeouts", 0)), _n(slot["freezes"]),
            f"{final.get('frozen_seconds', 0):.1f} s", "yes" if final.get("parked") else "no",
        ])
    return rows


def _politeness_section(politeness: dict[str, Any] | None,
                        figures: dict[str, Any]) -> str:
    if politeness is None:
        return ('<p class="note">The politeness engine was off '
                "(INCREMENTAL_THROTTLE_ENABLED = False): no per-slot series.</p>")
    slots = politeness["slots"]
    if not slots:
        return '<p class="note">No request reached a site.</p>'
    table = _table(["slot", "requests", "rate at end (req/s)", "held by", "latency p50 / p95 ms",
                    "429", "5xx", "timeouts", "freezes", "frozen", "parked"],
                   _slot_rows(slots))
    shown = len(slots)
    untracked = politeness.get("slots_untracked", 0)
    beyond = f" ({untracked} more without series)" if untracked else ""
    note = (f'<p class="note">{shown} of {politeness["slots_tracked"]} slots drawn{beyond}, '
            f"sampled every {politeness['interval_s']:g} s. Shaded: the slot was frozen "
            "(Retry-After, backoff, parked); the markers along the top give why.</p>")
    charts = "".join(_chart_div(i, figure) for i, figure in figures.items())
    return table + note + charts


def _cards(items: list[tuple[str, str]]) -> str:
    return '<div class="cards">' + "".join(
        f"<div class=\"card\"><b>{_e(value)}</b><span>{_e(label)}</span></div>"
        for label, value in items) + "</div>"


def _summary_cards(s: dict[str, Any], duration: float) -> str:
    full = s["bytes_downloaded"] + s["bytes_saved_estimate"] + s["bytes_skipped"]
    share = f"{100 * s['bytes_downloaded'] / full:.1f}%" if full else "-"
    return _cards([
        ("known pages", _n(s["pages_known"])), ("pages checked", _n(s["pages_checked"])),
        ("304 not modified", _n(s["pages_not_modified"])),
        ("changed", _n(s["pages_changed"])), ("new", _n(s["pages_new"])),
        ("skipped (lastmod)", _n(s["skipped_lastmod"])), ("not due", _n(s["not_due"])),
        ("failed", _n(s["pages_failed"])), ("gone or not found", _n(s["pages_gone"])),
        ("bytes downloaded", size(s["bytes_downloaded"])),
        ("saved by 304s (est.)", size(s["bytes_saved_estimate"])),
        ("downloaded, of a full re-crawl", share), ("duration", f"{duration:.1f} s"),
    ])


def _json_script(element_id: str, value: Any) -> str:
    # No "<" at all in a script element's text: "</script>" would end it,
    # and "<!--<script>" would make the parser run past its end (both can
    # come from a site: a Retry-After header is shown as it was sent).
    # JSON spells it \u003c in strings, the only place it can be.
    text = json.dumps(value, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def _named(anchor: str, figures: dict[str, Any]) -> dict[str, Any]:
    """*figures* keyed by element id (the crawl's anchor, then the chart's
    name: ids stay unique with several crawls on the page)."""
    return {f"{anchor}-{name}": {**figure, "name": name, "section": anchor}
            for name, figure in figures.items()}


def _view(report: dict[str, Any], anchor: str, json_name: str | None, *,
          hidden: bool = False) -> tuple[str, str, dict[str, Any]]:
    """One report's title, its section of the page and its charts (by element id)."""
    figures: dict[str, Any] = {}
    sections: list[str] = []
    if report["kind"] == "crawl":
        crawl, s = report["crawl"], report["summary"]
        title = f"Crawl report: {crawl['scope']}"
        worker = f", worker {crawl['worker']}" if crawl["worker"] else ""
        meta = (f"spider {crawl['spider']}{worker}; started {_when(crawl['started_at'])}, "
                f"finished {_when(crawl['finished_at'])} ({crawl['reason']})")
        sections.append("<h2>Summary</h2>" + _summary_cards(s, crawl["duration_s"])
                        + "<pre>" + _e("\n".join(report["report_lines"])) + "</pre>")
        sections.append("<h2>Per host</h2>" + _hosts_section(report["hosts"]))
        politeness = report["politeness"]
        slot_figures = {}
        if politeness is not None:
            slot_figures = _named(anchor, {
                f"slot-{i}": slot_figure(key, slot, politeness["times_s"])
                for i, (key, slot) in enumerate(politeness["slots"].items())})
        figures.update(slot_figures)
        sections.append("<h2>Politeness per download slot</h2>"
                        + _politeness_section(politeness, slot_figures))
    else:
        title = f"Crawl history: {report['scope']}"
        meta = f"store {report['store']}; generated {_when(report['generated_at'])}"
        rows = [[_e(h["host"]), _n(h["pages"]), _n(h["due"]), _n(h["gone"]), _n(h["failing"]),
                 size(h["stored_bytes"]),
                 _trust_cell(h.get("validator_trust"), h.get("validators_distrusted_until")),
                 _trust_cell(h.get("lastmod_trust"), h.get("lastmod_distrusted_until"))]
                for h in report["stored_hosts"]]
        hosts = (_table(["host", "pages", "due now", "gone", "failing", "stored", "validator trust",
                         "lastmod trust"], rows) if rows
                 else '<p class="note">No page of this scope is stored.</p>')
        sections.append("<h2>Stored hosts</h2>" + hosts)
    history = _named(anchor, history_figures(report["history"]))
    figures.update(history)
    sections.append(f"<h2>Last crawls of the scope ({len(report['history'])} kept)</h2>"
                    + _history_section(report["history"], history))
    link = (f' The same figures as JSON: <a href="{_e(json_name)}">{_e(json_name)}</a>.'
            if json_name else "")
    section = (f'<section class="crawl" id="{_e(anchor)}" data-title="{_e(title)}"'
               + (" hidden>" if hidden else ">")
               + f"<h1>{_e(title)}</h1><div class=\"meta\">{_e(meta)}.{link}</div>"
               + "".join(sections) + "</section>")
    return title, section, figures


def _crawl_label(report: dict[str, Any]) -> str:
    crawl = report["crawl"]
    worker = f", worker {crawl['worker']}" if crawl["worker"] else ""
    return (f"{_when(crawl['finished_at'])}: {crawl['scope']} (spider {crawl['spider']}"
            f"{worker}, {crawl['reason']})")


def _nav(shown: list[tuple[str, dict[str, Any]]]) -> str:
    """Links to each crawl of the page, newest first."""
    links = "".join(f'<li><a href="#{_e(anchor)}">{_e(_crawl_label(report))}</a></li>'
                    for anchor, report in shown)
    return (f'<nav class="crawls"><b>Crawls kept in this directory ({len(shown)}), '
            f"newest first:</b><ul>{links}</ul></nav>")


def render_parts(report: dict[str, Any], *, json_name: str | None = None,
                 anchor: str = "report",
                 kept: Sequence[tuple[str, dict[str, Any]]] = ()) -> list[bytes]:
    """The HTML page of a report object (:mod:`~incremental_crawler.report.document`),
    as parts to write one after the other: Plotly.js (4.8 MB) is one of them
    as read, never copied into a larger string.

    *anchor* names the report's section (``page.html#<anchor>``), *json_name*
    its JSON file. *kept*: other crawls' reports as ``(name, report)``, their
    JSON ``<name>.json`` beside the page, each a section of its own, shown
    when the address names it: one page, one copy of Plotly.js, for all the
    crawls a report directory keeps. A kept report this version cannot draw
    (another version's) is left out.
    """
    js, version = plotly_js()
    title, section, figures = _view(report, anchor, json_name)
    sections = [section]
    shown = [(anchor, report)]
    for name, other in kept:
        if not isinstance(other, dict) or other.get("kind") != "crawl":
            continue
        try:
            _, other_section, other_figures = _view(other, name, f"{name}.json", hidden=True)
            _crawl_label(other)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            continue  # written by another version: its JSON is still there
        sections.append(other_section)
        figures.update(other_figures)
        shown.append((name, other))
    nav = _nav(shown) if len(shown) > 1 else ""
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    head = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{_e(title)}</title><style>{STYLE}</style><script>"
    )
    rest = (
        "</script></head><body><main>" + nav + "".join(sections)
        + f"<footer>Report schema {_e(report['schema'])} v{report['version']}, written "
        f"{generated}. Charts by Plotly.js v{_e(version)} (MIT), embedded: this page needs "
        f"no network.</footer></main>"
        + _json_script("report-figures", figures) + _json_script("report-config", CONFIG)
        + f"<script>{SCRIPT}</script></body></html>\n"
    )
    return [head.encode("utf-8"), js, rest.encode("utf-8")]
