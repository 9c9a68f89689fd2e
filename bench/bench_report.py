"""Benchmark: `nnmem-sweep report configs/llama.yaml` (what `make report` runs), PDF included, must take < 10 s.

Runs the installed CLI in a fresh process (imports, grid, CSVs, HTML and PDF all counted) into a temporary folder,
takes the best of N runs, prints the seconds and PASS/FAIL, and exits 1 on FAIL.

    .venv/bin/python bench/bench_report.py [--config configs/llama.yaml] [--runs 3] [--limit 10]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 10.0


def time_report(config: Path, runs: int) -> tuple[float, list[str]]:
    cli = Path(sys.executable).parent / "nnmem-sweep"
    cmd = [str(cli)] if cli.exists() else [sys.executable, "-m", "nnmem_sweep.cli"]
    best, written = float("inf"), []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            done = subprocess.run([*cmd, "report", str(config), "--out", out, "--quiet"], cwd=ROOT,
                                  capture_output=True, text=True)
            elapsed = time.perf_counter() - t0
            if done.returncode != 0:
                raise RuntimeError(f"report failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
            written = sorted(p.name for p in Path(out).iterdir())
        best = min(best, elapsed)
    return best, written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "llama.yaml"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--limit", type=float, default=LIMIT_S)
    args = ap.parse_args(argv)
    try:
        seconds, written = time_report(Path(args.config), args.runs)
    except RuntimeError as e:
        print(f"bench_report: FAIL  {e}")
        return 1
    missing = {"report.html", "report.pdf", "results.csv", "max_batch.csv"} - set(written)
    ok = seconds < args.limit and not missing
    print(f"bench_report: {seconds:.2f} s for `nnmem-sweep report {Path(args.config).name}` (best of {args.runs}; "
          f"limit {args.limit:g} s){'; missing ' + ', '.join(sorted(missing)) if missing else ''}  "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
