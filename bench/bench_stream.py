"""Benchmark: `nnmem-sweep run --stream` of a 10,000,000-row grid (Llama 3.1 8B) to results.csv and max_batch.csv.

Target: the process's peak RSS under 2 GiB (resource.getrusage of the child) while the grid alone, held in memory,
would need several GiB. Runs the CLI once in a fresh process (what a user waits for) and prints rows, seconds,
rows/s, CSV size, peak RSS and PASS/FAIL; exits 1 on FAIL. The grid is bench/grid_1m.yaml with 100 sequence
lengths instead of 10. The CSVs go to a temporary folder that is removed afterwards (about 2 GB of disk while it
runs) unless --out is given.

    .venv/bin/python bench/bench_stream.py [--chunk-rows 500000] [--out DIR]
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from _common import ROOT, children_peak_rss_bytes, cli
from nnmem_sweep.units import GiB

LIMIT_RSS = 2 * GiB
ROWS = 10_000_000


def write_config(folder: Path) -> Path:
    """bench/grid_1m.yaml with 100 sequence lengths instead of 10: 10 M rows."""
    doc = yaml.safe_load((ROOT / "bench" / "grid_1m.yaml").read_text())
    doc["name"] = "bench 10M streamed"
    doc["grid"]["seq_len"] = [512 * k for k in range(1, 101)]
    path = folder / "grid_10m.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _lines(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            n += block.count(b"\n")
    return n


def main() -> int:
    from nnmem_sweep.stream import CHUNK_ROWS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk-rows", type=int, default=CHUNK_ROWS)
    ap.add_argument("--out", help="keep the CSVs in this folder")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nnmem-bench-stream-"))
    out = Path(args.out) if args.out else work / "out"
    try:
        cmd = [*cli(), "run", str(write_config(work)), "--stream", "--chunk-rows", str(args.chunk_rows),
               "--out", str(out), "--quiet"]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        secs = time.perf_counter() - t0
        if done.returncode != 0:
            print(f"bench_stream: FAIL  exit {done.returncode}: {done.stderr.strip()[-500:]}")
            return 1
        rss = children_peak_rss_bytes()
        size = (out / "results.csv").stat().st_size
        written = _lines(out / "results.csv") - 1  # header
        cells = _lines(out / "max_batch.csv") - 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ok = rss < LIMIT_RSS and written == ROWS and cells == ROWS // 125  # max_batch: one cell per batch column
    print(f"bench_stream: {ROWS:,} rows streamed by `nnmem-sweep run --stream` in {secs:.1f} s "
          f"({ROWS / secs:,.0f} rows/s, chunks of {args.chunk_rows:,}), results.csv {size / GiB:.2f} GiB with "
          f"{written:,} rows, max_batch.csv {cells:,} cells, peak RSS {rss / GiB:.2f} GiB; target < 2 GiB: "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
