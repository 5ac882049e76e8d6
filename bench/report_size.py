"""Disk the crawl reports of one INCREMENTAL_REPORT_DIR take, after N crawls.

What it measures
    ``scrapy demo`` (two crawls of its loopback site each) run again and
    again with the same ``--report-dir`` and ``--state-uri`` until N crawls
    have ended (default 24: more than INCREMENTAL_REPORT_KEEP's 20), in the
    project checkout ``--project`` (default: this one) with the Python that
    runs this script. Then: the files of the directory by kind (the latest
    page, timestamped pages, JSON), their bytes, and the bytes per kept
    crawl (all bytes / kept crawls).

How to read it
    Sizes are deterministic to a few kB (the politeness series' lengths
    depend on the crawl's duration). To compare two versions, run it with
    each checkout's venv: ``/other/.venv/bin/python bench/report_size.py
    --project /other``.

    python bench/report_size.py [--crawls 24] [--pages 60] [--project DIR]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

STAMPED = re.compile(r"^report-\d{8}T\d{9}Z(?:-.+)?\.(html|json)$")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--crawls", type=int, default=24, help="crawls to run, 2 per demo (24)")
    p.add_argument("--pages", type=int, default=60, help="pages of the demo site (60)")
    p.add_argument("--project", type=Path, default=Path(__file__).resolve().parents[1],
                   help="the checkout to run the demo in (this one)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="report-size-") as tmp:
        reports = Path(tmp) / "reports"
        state = f"sqlite:///{Path(tmp) / 'state.db'}"
        for _ in range((args.crawls + 1) // 2):
            subprocess.run([sys.executable, "-m", "scrapy", "demo", "--pages", str(args.pages),
                            "--report-dir", str(reports), "--state-uri", state],
                           cwd=args.project, check=True, capture_output=True, timeout=600)
        kinds: dict[str, list[int]] = {"latest page": [], "timestamped pages": [],
                                       "timestamped JSON": [], "latest JSON": []}
        for path in reports.iterdir():
            stamped = STAMPED.match(path.name)
            if stamped:
                kind = "timestamped pages" if stamped.group(1) == "html" else "timestamped JSON"
            else:
                kind = "latest page" if path.suffix == ".html" else "latest JSON"
            kinds[kind].append(path.stat().st_size)
        kept = len(kinds["timestamped JSON"])
        total = sum(sum(sizes) for sizes in kinds.values())
        print(f"{args.crawls} crawls of {args.pages} pages, project {args.project}")
        for kind, sizes in kinds.items():
            print(f"  {kind:18} {len(sizes):3} files {sum(sizes):>12,} bytes"
                  + (f" (largest {max(sizes):,})" if sizes else ""))
        print(f"  {'directory':18} {sum(len(s) for s in kinds.values()):3} files {total:>12,} "
              f"bytes; {kept} crawls kept, {total // max(kept, 1):,} bytes per kept crawl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
