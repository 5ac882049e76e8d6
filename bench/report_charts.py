"""Chart libraries for the HTML report: CPU and page size for the same charts.

What it measures
    The report's charts (one slot chart of three panels, rate/latency/errors
    with freeze spans shaded, over N samples; the two history charts over
    C crawls) drawn as one self-contained HTML page by each candidate, each
    in a fresh Python process (so its imports count, as they would in a
    crawl), R times (default 3):

    - ours: Plotly.js figure JSON, Plotly.js read from the ``plotly``
      package (``incremental_crawler.report.page.render_parts``, the report's
      own code: tables too);
    - plotly-go: the same figures through ``plotly.graph_objects`` and
      ``plotly.io.to_html`` (Plotly.js embedded);
    - matplotlib: Agg, each chart as inline SVG (static);
    - bokeh: ``bokeh.embed.file_html`` with ``INLINE`` resources.

    CPU = user+sys of the child, minus that of a child that only starts
    Python and reads the data (median of R each). A library that is not
    installed is reported as such: ``--python`` runs the candidates with
    another interpreter (a venv with matplotlib and bokeh; the project's
    own requirements install neither).

How to read it
    The budget of the whole report on a 500-page crawl is about 0.1 s of
    CPU (2% of a few CPU seconds; ``report_overhead.py`` measures the real
    thing). A candidate whose imports alone exceed it does not fit.

    python bench/report_charts.py [--samples 300] [--crawls 20] [--rounds 3] [--python PY]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Each candidate: code run as ``python -c`` with the data file and the output
#: path as argv[1], argv[2]; the data is read by PRELUDE first.
PRELUDE = "import json, sys\nreport = json.load(open(sys.argv[1]))\n"

CANDIDATES = {
    "baseline (start-up, read data)": "",
    "ours: Plotly.js JSON": """
from incremental_crawler.report.page import render_parts
with open(sys.argv[2], "wb") as f:
    for part in render_parts(report):
        f.write(part)
""",
    "plotly-go + to_html": """
import plotly.graph_objects as go
from plotly.io import to_html
from incremental_crawler.report.page import history_figures, slot_figure
p = report["politeness"]
figs = [slot_figure(k, s, p["times_s"]) for k, s in p["slots"].items()]
figs += list(history_figures(report["history"]).values())
parts = [to_html(go.Figure(f), include_plotlyjs=(i == 0), full_html=False)
         for i, f in enumerate(figs)]
open(sys.argv[2], "w").write("<html><body>" + "".join(parts) + "</body></html>")
""",
    "matplotlib SVG": """
import io
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
p = report["politeness"]
t = p["times_s"]
out = []
def svg(fig):
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    out.append(buf.getvalue())
for key, s in p["slots"].items():
    fig, (a, b, c) = plt.subplots(3, 1, sharex=True, figsize=(11, 6))
    a.plot(t, [v if v is not None else float("nan") for v in s["rate"]], label="rate")
    a.plot(t, [v if v is not None else float("nan") for v in s["window"]], ":", label="window")
    b.plot(t, [v if v is not None else float("nan") for v in s["latency_p50_ms"]], label="p50")
    b.plot(t, [v if v is not None else float("nan") for v in s["latency_p95_ms"]], label="p95")
    for name in ("status_429", "status_5xx", "timeouts"):
        c.step(t, [v if v is not None else float("nan") for v in s[name]], label=name)
    for span in s["frozen_spans"]:
        for ax in (a, b, c):
            ax.axvspan(span["start_s"], span["end_s"], color="red", alpha=0.12)
    a.legend(); b.legend(); c.legend(); a.set_title(key)
    svg(fig)
h = list(reversed(report["history"]))
x = list(range(len(h)))
fig, ax = plt.subplots(figsize=(11, 4))
for i, name in enumerate(("requests", "not_modified", "pages_changed")):
    ax.bar([v + i * 0.27 for v in x], [e["figures"][name] for e in h], 0.27, label=name)
ax.legend(); svg(fig)
fig, ax = plt.subplots(figsize=(11, 4))
bottom = [0] * len(h)
for name in ("bytes_received", "bytes_saved", "bytes_skipped"):
    vals = [e["figures"][name] for e in h]
    ax.bar(x, vals, bottom=bottom, label=name)
    bottom = [a + b for a, b in zip(bottom, vals)]
ax2 = ax.twinx(); ax2.plot(x, [e["figures"]["duration"] for e in h], "k-o")
ax.legend(); svg(fig)
open(sys.argv[2], "w").write("<html><body>" + "".join(out) + "</body></html>")
""",
    "bokeh file_html INLINE": """
from bokeh.embed import file_html
from bokeh.layouts import column
from bokeh.models import BoxAnnotation
from bokeh.plotting import figure
from bokeh.resources import INLINE
p = report["politeness"]
t = p["times_s"]
plots = []
nan = float("nan")
for key, s in p["slots"].items():
    figs = [figure(width=1000, height=180, title=key if i == 0 else None) for i in range(3)]
    figs[0].line(t, [v if v is not None else nan for v in s["rate"]], legend_label="rate")
    figs[0].line(t, [v if v is not None else nan for v in s["window"]], line_dash="dotted",
                 legend_label="window")
    figs[1].line(t, [v if v is not None else nan for v in s["latency_p50_ms"]], legend_label="p50")
    figs[1].line(t, [v if v is not None else nan for v in s["latency_p95_ms"]], legend_label="p95")
    for name in ("status_429", "status_5xx", "timeouts"):
        figs[2].step(t, [v if v is not None else nan for v in s[name]], legend_label=name)
    for span in s["frozen_spans"]:
        for f in figs:
            f.add_layout(BoxAnnotation(left=span["start_s"], right=span["end_s"],
                                       fill_alpha=0.12, fill_color="red"))
    plots += figs
h = list(reversed(report["history"]))
x = list(range(len(h)))
f = figure(width=1000, height=300)
for i, name in enumerate(("requests", "not_modified", "pages_changed")):
    f.vbar(x=[v + i * 0.27 for v in x], top=[e["figures"][name] for e in h], width=0.27)
plots.append(f)
f = figure(width=1000, height=300)
f.vbar_stack(["bytes_received", "bytes_saved", "bytes_skipped"], x="x", width=0.8,
             source={"x": x, **{n: [e["figures"][n] for e in h]
                               for n in ("bytes_received", "bytes_saved", "bytes_skipped")}})
plots.append(f)
open(sys.argv[2], "w").write(file_html(column(*plots), INLINE, "report"))
""",
}


def sample_report(samples: int, crawls: int) -> dict:
    """A crawl report object with one slot of *samples* samples, *crawls* crawls of history."""
    rng = random.Random(7)
    times = [round(0.25 * i, 2) for i in range(samples)]
    rate, series = 4.0, {k: [] for k in ("rate", "window", "latency_p50_ms", "latency_p95_ms",
                                         "status_429", "status_5xx", "timeouts", "requests")}
    errors = sent = 0
    spans = []
    for i, t in enumerate(times):
        if i % 40 == 39:
            errors += 1
            rate *= 0.7
            spans.append({"start_s": t, "end_s": t + 1.0, "why": "429, Retry-After: 1"})
        else:
            rate = min(50.0, rate + 0.5)
        sent += int(rate * 0.25)
        for key, value in (("rate", rate), ("window", rate), ("latency_p50_ms", 30 + rng.random()),
                           ("latency_p95_ms", 40 + 5 * rng.random()), ("status_429", errors),
                           ("status_5xx", 0), ("timeouts", 0), ("requests", sent)):
            series[key].append(round(value, 3))
    slot = {**series, "freezes": len(spans), "frozen_spans": spans,
            "final": {"rate": rate, "window": rate, "limit": None, "latency_p50_ms": 30.0,
                      "latency_p95_ms": 40.0, "responses": sent, "status_429": errors,
                      "status_5xx": 0, "timeouts": 0, "frozen_seconds": float(len(spans)),
                      "parked": False}}
    figures = {"requests": 500, "not_modified": 450, "pages_changed": 25, "pages_new": 0,
               "bytes_received": 400_000, "bytes_saved": 6_000_000, "bytes_skipped": 100_000,
               "duration": 12.5, "skipped_lastmod": 0, "not_due": 0, "failed": 0}
    history = [{"started": 1.8e9 - 86400 * i, "started_at": f"2027-01-{28 - i:02d}T00:00:00Z",
                "finished": 1.8e9 - 86400 * i + 12, "worker": "", "reason": "finished",
                "figures": figures} for i in range(crawls)]
    summary_keys = ("checked", "not_modified", "changed", "new", "skipped_lastmod", "not_due",
                    "failed", "bytes_downloaded", "bytes_saved_estimate", "bytes_skipped")
    return {
        "schema": "incremental-crawler-report", "version": 1, "kind": "crawl",
        "generated_at": "2027-01-28T00:00:12Z",
        "crawl": {"scope": "bench", "spider": "sitemap", "worker": "", "reason": "finished",
                  "started": 1.8e9, "started_at": "2027-01-28T00:00:00Z",
                  "finished": 1.8e9 + 12, "finished_at": "2027-01-28T00:00:12Z",
                  "duration_s": 12.0},
        "summary": dict.fromkeys(summary_keys, 0),
        "report_lines": ["(bench data)"], "hosts": [],
        "politeness": {"interval_s": 0.25, "duration_s": times[-1], "times_s": times,
                       "slots": {"127.0.0.1": slot}, "slots_tracked": 1},
        "history": history,
    }


def run(python: str, code: str, data: Path, out: Path) -> tuple[float, str]:
    """CPU seconds of one child running *code*, and its error (empty if none)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([python, "-c", PRELUDE + code, str(data), str(out)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    error = ""
    if proc.returncode:
        lines = proc.stderr.strip().splitlines()
        error = lines[-1] if lines else f"exit {proc.returncode}"
    return cpu, error


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=300, help="samples of the slot (300)")
    p.add_argument("--crawls", type=int, default=20, help="crawls in the history (20)")
    p.add_argument("--rounds", type=int, default=3, help="runs per candidate (3)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter for the candidates (default: this one)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-charts-") as tmp:
        data = Path(tmp) / "report.json"
        data.write_text(json.dumps(sample_report(args.samples, args.crawls)))
        cpu: dict[str, list[float]] = {name: [] for name in CANDIDATES}
        errors: dict[str, str] = {}
        sizes: dict[str, int] = {}
        for round_ in range(args.rounds):
            names = list(CANDIDATES)
            for name in names if round_ % 2 == 0 else reversed(names):
                if name in errors:
                    continue
                out = Path(tmp) / "out.html"
                out.unlink(missing_ok=True)
                seconds, error = run(args.python, CANDIDATES[name], data, out)
                if error:
                    errors[name] = error
                    continue
                cpu[name].append(seconds)
                sizes[name] = out.stat().st_size if out.exists() else 0
    base = statistics.median(cpu["baseline (start-up, read data)"])
    print(f"report_charts: 1 slot chart ({args.samples} samples, 3 panels, freezes shaded) "
          f"+ 2 history charts ({args.crawls} crawls), one HTML page per candidate, "
          f"{args.rounds} runs each in a fresh process; CPU minus start-up ({base:.3f} s)")
    print(f"{'candidate':32} {'CPU s (median)':>15} {'page bytes':>12}")
    for name in CANDIDATES:
        if name.startswith("baseline"):
            continue
        if name in errors:
            print(f"{name:32} {'not run: ' + errors[name][:60]}")
            continue
        print(f"{name:32} {statistics.median(cpu[name]) - base:>15.3f} {sizes[name]:>12,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
