"""Benchmark: `nnmem-sweep report configs/llama.yaml` (what `make report` runs), HTML and PDF, must take < 6 s.

Runs the CLI in a fresh process (imports, grid, CSVs, HTML, PDF and the process's exit all counted) into a
temporary folder, takes the best of N runs, prints the seconds and PASS/FAIL, and exits 1 on FAIL.

    .venv/bin/python bench/bench_report.py [--config configs/llama.yaml] [--runs 3] [--limit 6]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import ROOT, time_cli

LIMIT_S = 6.0
EXPECTED = {"report.html", "report.pdf", "results.csv", "max_batch.csv", "run.json"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "llama.yaml"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--limit", type=float, default=LIMIT_S)
    args = ap.parse_args(argv)
    try:
        seconds, written = time_cli(["report", str(args.config)], args.runs)
    except RuntimeError as e:
        print(f"bench_report: FAIL  {e}")
        return 1
    missing = EXPECTED - set(written)
    ok = seconds < args.limit and not missing
    print(f"bench_report: {seconds:.2f} s for `nnmem-sweep report {Path(args.config).name}` (best of {args.runs}; "
          f"limit {args.limit:g} s){'; missing ' + ', '.join(sorted(missing)) if missing else ''}  "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
