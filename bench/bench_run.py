"""Benchmark: `nnmem-sweep run` of a 1,000,000-row grid (bench/grid_1m.yaml, Llama 3.1 8B, hand-modelled; and
bench/grid_1m_derived.yaml, Qwen3 8B, planned from its own code: its shipped plans), end to end: the command's wall
clock in a fresh process (imports, grid, max batch, the files written, run.json), best of N.

Targets on the 2-core reference machine: CSV (results.csv 209 MB) under 3 s, `--format parquet` under 3 s, each
with the process's peak RSS under 2 GiB. Prints seconds, rows/s, peak RSS and PASS/FAIL; exits 1 on FAIL.

    .venv/bin/python bench/bench_run.py [--runs 3]
"""
from __future__ import annotations

import argparse
import sys

from _common import ROOT, children_peak_rss_bytes, time_cli
from nnmem_sweep.units import GiB

CONFIGS = {"hand-modelled": ROOT / "bench" / "grid_1m.yaml", "derived": ROOT / "bench" / "grid_1m_derived.yaml"}
ROWS = 1_000_000
LIMIT_S = {"csv": 3.0, "parquet": 3.0}
LIMIT_RSS = 2 * GiB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    ok_all = True
    for (kind, config), (fmt, limit) in [(c, f) for c in CONFIGS.items() for f in LIMIT_S.items()]:
        if kind == "derived" and fmt == "parquet":
            continue  # the writer is the same: one format shows the estimator's speed
        try:
            seconds, written = time_cli(["run", str(config), "--format", fmt], args.runs)
        except RuntimeError as e:
            print(f"bench_run: FAIL  {e}")
            return 1
        rss = children_peak_rss_bytes()
        expected = sorted([f"results.{fmt}", f"max_batch.{fmt}", "run.json"])
        ok = seconds < limit and rss < LIMIT_RSS and written == expected
        ok_all &= ok
        print(f"bench_run: `nnmem-sweep run {config.name} --format {fmt}` ({kind}): {ROWS:,} rows in {seconds:.2f} s "
              f"({ROWS / seconds:,.0f} rows/s; best of {args.runs}), peak RSS {rss / GiB:.2f} GiB; targets "
              f"< {limit:g} s and < 2 GiB{'' if written == expected else f'; wrote {written}'}: "
              f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
