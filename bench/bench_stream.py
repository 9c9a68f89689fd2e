"""Benchmark: stream a 10,000,000-row grid (Llama 3.1 8B) to results.csv and max_batch.csv in chunks.

Target: peak RSS under 2 GiB (resource.getrusage, the whole process) while the grid alone, held in memory, would
need several GiB. Prints rows, seconds, rows/s, CSV size, peak RSS and PASS/FAIL; exits 1 on FAIL. The CSVs go to
a temporary folder that is removed afterwards (about 2 GB of disk while it runs) unless --out is given.

    .venv/bin/python bench/bench_stream.py [--chunk-rows 500000] [--out DIR]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _common import peak_rss_bytes
from nnmem_sweep.units import GiB

LIMIT_RSS = 2 * GiB
ROWS = 10_000_000


def build():
    """bench_grid's 1 M-row Llama 3.1 8B grid with 100 sequence lengths instead of 10: 10 M rows."""
    import dataclasses

    from nnmem_sweep import columns as C

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_grid import build as build_1m

    sc = build_1m()
    grid = dict(sc.grid)
    grid[C.SEQ_LEN] = tuple(512 * k for k in range(1, 101))  # 100
    return dataclasses.replace(sc, name="bench 10M streamed", grid=grid)


def _lines(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            n += block.count(b"\n")
    return n


def main() -> int:
    from nnmem_sweep.grid import grid_size
    from nnmem_sweep.stream import CHUNK_ROWS, run_streamed

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk-rows", type=int, default=CHUNK_ROWS)
    ap.add_argument("--out", help="keep the CSVs in this folder")
    args = ap.parse_args()
    sc = build()
    rows = grid_size(sc)
    assert rows == ROWS, rows
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="nnmem-bench-stream-"))
    try:
        t0 = time.perf_counter()
        r = run_streamed(sc, out, chunk_rows=args.chunk_rows, max_rows=rows)
        secs = time.perf_counter() - t0
        rss = peak_rss_bytes()
        size = r.results_path.stat().st_size
        written = _lines(r.results_path) - 1  # header
        cells = _lines(r.max_batch_path) - 1
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    ok = rss < LIMIT_RSS and written == rows and cells == r.cells
    print(f"bench_stream: {rows:,} rows streamed in {secs:.1f} s ({rows / secs:,.0f} rows/s, chunks of "
          f"{args.chunk_rows:,}), results.csv {size / GiB:.2f} GiB with {written:,} rows, "
          f"max_batch.csv {cells:,} cells, peak RSS {rss / GiB:.2f} GiB; target < 2 GiB: "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
