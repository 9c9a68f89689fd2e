"""Benchmark: stream a 10,000,000-row grid (Llama 3.1 8B) to results.csv and max_batch.csv in chunks.

Target: peak RSS under 2 GiB (resource.getrusage, the whole process) while the grid alone, held in memory, would
need several GiB. Prints rows, seconds, rows/s, CSV size, peak RSS and PASS/FAIL; exits 1 on FAIL. The CSVs go to
a temporary folder that is removed afterwards (about 2 GB of disk while it runs) unless --out is given.

    .venv/bin/python bench/bench_stream.py [--chunk-rows 500000] [--out DIR]
"""
from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

LIMIT_RSS = 2 << 30  # 2 GiB
ROWS = 10_000_000


def build():
    from nnmem_sweep import columns as C
    from nnmem_sweep.catalog.gpus import get_gpu
    from nnmem_sweep.models.presets import load_preset
    from nnmem_sweep.scenario import Overheads, Scenario

    grid = {
        C.BATCH: tuple(range(1, 126)),  # 125
        C.SEQ_LEN: tuple(512 * k for k in range(1, 101)),  # 100
        C.PRECISION: ("fp32", "bf16", "fp16", "bf16-mixed", "bf16-master"),  # 5
        C.OPTIMIZER: ("adamw", "adamw-8bit", "sgd-momentum", "adafactor", "lion"),  # 5
        C.OPTIMIZER_IMPL: ("foreach", "fused"),  # 2
        C.CHECKPOINTING: ("none", "full"),  # 2
        C.ATTENTION: ("flash", "eager"),  # 2
        C.CACHE_TOKENS: (0,), C.DECODE_TOKENS: (0,),
    }
    gpus = tuple(get_gpu(g) for g in ("a100-40gb", "a100-80gb", "h100-sxm", "h200"))  # 4
    return Scenario(path="", name="bench 10M streamed", description="", model=load_preset("llama-3.1-8b"),
                    mode="train", grid=grid, gpus=gpus, overheads=Overheads(512 << 20, 8_519_680, 0.05),
                    headroom=0.05)


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
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        size = r.results_path.stat().st_size
        written = _lines(r.results_path) - 1  # header
        cells = _lines(r.max_batch_path) - 1
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    ok = rss < LIMIT_RSS and written == rows and cells == r.cells
    print(f"bench_stream: {rows:,} rows streamed in {secs:.1f} s ({rows / secs:,.0f} rows/s, chunks of "
          f"{args.chunk_rows:,}), results.csv {size / (1 << 30):.2f} GiB with {written:,} rows, "
          f"max_batch.csv {cells:,} cells, peak RSS {rss / (1 << 30):.2f} GiB; target < 2 GiB: "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
