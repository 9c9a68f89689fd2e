"""Benchmark: expand and estimate a 1,000,000-row grid (Llama 3.1 8B), max batch included.

Target on the 2-core reference machine: under 2 s and under 2 GiB peak RSS (resource.getrusage, the whole process:
interpreter, imports and frames). Prints rows/s, seconds, peak RSS and PASS/FAIL; exits 1 on FAIL.

    .venv/bin/python bench/bench_grid.py [--runs 3]
"""
from __future__ import annotations

import argparse
import sys
import time

from _common import peak_rss_bytes
from nnmem_sweep.units import GiB

LIMIT_S = 2.0
LIMIT_RSS = 2 * GiB


def build():
    from nnmem_sweep import columns as C
    from nnmem_sweep.catalog.gpus import get_gpu
    from nnmem_sweep.models.presets import load_preset
    from nnmem_sweep.scenario import Overheads, Scenario

    grid = {
        C.BATCH: tuple(range(1, 126)),  # 125
        C.SEQ_LEN: tuple(512 * k for k in range(1, 11)),  # 10
        C.PRECISION: ("fp32", "bf16", "fp16", "bf16-mixed", "bf16-master"),  # 5
        C.OPTIMIZER: ("adamw", "adamw-8bit", "sgd-momentum", "adafactor", "lion"),  # 5
        C.OPTIMIZER_IMPL: ("foreach", "fused"),  # 2
        C.CHECKPOINTING: ("none", "full"),  # 2
        C.ATTENTION: ("flash", "eager"),  # 2
        C.CACHE_TOKENS: (0,), C.DECODE_TOKENS: (0,),
    }
    gpus = tuple(get_gpu(g) for g in ("a100-40gb", "a100-80gb", "h100-sxm", "h200"))  # 4
    return Scenario(path="", name="bench 1M", description="", model=load_preset("llama-3.1-8b"), mode="train",
                    grid=grid, gpus=gpus, overheads=Overheads(512 << 20, 8_519_680, 0.05), headroom=0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from nnmem_sweep.grid import grid_size
    from nnmem_sweep.runner import run_scenario

    sc = build()
    rows = grid_size(sc)
    best = float("inf")
    for _ in range(args.runs):
        t0 = time.perf_counter()
        res = run_scenario(sc, max_rows=rows)
        best = min(best, time.perf_counter() - t0)
        assert len(res.results) == rows
        del res
    rss = peak_rss_bytes()
    ok = best < LIMIT_S and rss < LIMIT_RSS
    print(f"bench_grid: {rows:,} rows in {best:.2f} s ({rows / best:,.0f} rows/s), peak RSS "
          f"{rss / GiB:.2f} GiB; targets < {LIMIT_S:.0f} s and < 2 GiB: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
