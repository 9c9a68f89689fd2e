"""Benchmark: what a user's first run waits for (issue 20), cold and warm.

Cold is a user's first run: an empty user cache (NNMEM_SWEEP_CACHE: no derived plan, no replay kept), after the
install (which compiles the allocator replay once: `make install`). Warm is the same command run again. Each is the
command's wall clock in a fresh process (imports, computing, the files written, the process's exit), best of N.

| what | target |
|---|---|
| `nnmem-sweep report configs/llama.yaml` (`make report`) | cold <= 20 s and <= 1.5x warm |
| `nnmem-sweep run bench/grid_100k.yaml` (100,000 rows: Llama 3.1 8B, 8 recipes, its reserve replayed) | cold <= 10 s |
| `nnmem-sweep derive` of one recipe of Mistral 7B (bf16, flash, no checkpointing; traced anew) | <= 30 s |

Prints PASS/FAIL per line; exits 1 on any FAIL.

    .venv/bin/python bench/bench_first_run.py [--runs 2] [--skip-derive]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, cli

MISTRAL_ONE_RECIPE = """name: derive one recipe of Mistral 7B
model: {preset: mistral-7b, derive: true}
mode: train
grid: {batch: [1], seq_len: [2048], precision: bf16, optimizer: adamw, checkpointing: none, attention: flash}
gpus: [h100-sxm]
"""


def timed(args: list[str], runs: int, cold: bool, env_extra: dict | None = None) -> float:
    """Best of `runs` wall-clock seconds of `nnmem-sweep ARGS`, each cold (a new empty cache) or warm (one cache,
    filled by a run before the timed ones)."""
    best = float("inf")
    parent = Path(tempfile.mkdtemp(prefix="nnmem-bench-"))
    try:
        env = dict(os.environ, **(env_extra or {}))
        shared = parent / "cache"
        if not cold:
            env["NNMEM_SWEEP_CACHE"] = str(shared)
            subprocess.run([*cli(), *args, "--out", str(parent / "warmup"), "--quiet"], cwd=ROOT, env=env,
                           check=True, capture_output=True)
        for i in range(runs):
            if cold:
                env["NNMEM_SWEEP_CACHE"] = str(parent / f"cache{i}")
            t0 = time.perf_counter()
            done = subprocess.run([*cli(), *args, "--out", str(parent / f"out{i}"), "--quiet"], cwd=ROOT, env=env,
                                  capture_output=True, text=True)
            elapsed = time.perf_counter() - t0
            if done.returncode != 0:
                raise RuntimeError(f"`nnmem-sweep {' '.join(args)}` failed: {done.stderr.strip()[-300:]}")
            best = min(best, elapsed)
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    return best


def derive_seconds() -> float:
    parent = Path(tempfile.mkdtemp(prefix="nnmem-bench-derive-"))
    try:
        config = parent / "mistral.yaml"
        config.write_text(MISTRAL_ONE_RECIPE)
        env = dict(os.environ, NNMEM_SWEEP_CACHE=str(parent / "cache"), NNMEM_SWEEP_REDERIVE="1")
        t0 = time.perf_counter()
        done = subprocess.run([*cli(), "derive", str(config), "--quiet"], cwd=ROOT, env=env, capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise RuntimeError(f"derive failed: {done.stderr.strip()[-300:]}")
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--skip-derive", action="store_true")
    args = ap.parse_args(argv)
    ok_all = True
    try:
        report = ["report", str(ROOT / "configs" / "llama.yaml")]
        cold, warm = timed(report, args.runs, True), timed(report, args.runs, False)
        ok = cold <= 20.0 and cold <= 1.5 * warm
        ok_all &= ok
        print(f"bench_first_run: `nnmem-sweep report llama.yaml`: {cold:.2f} s cold, {warm:.2f} s warm "
              f"({cold / warm:.2f}x; limits 20 s and 1.5x)  {'PASS' if ok else 'FAIL'}", flush=True)
        sweep = ["run", str(ROOT / "bench" / "grid_100k.yaml")]
        cold, warm = timed(sweep, args.runs, True), timed(sweep, args.runs, False)
        ok = cold <= 10.0
        ok_all &= ok
        print(f"bench_first_run: `nnmem-sweep run grid_100k.yaml` (100,000 rows): {cold:.2f} s cold, {warm:.2f} s "
              f"warm (limit 10 s cold)  {'PASS' if ok else 'FAIL'}", flush=True)
        if not args.skip_derive:
            seconds = derive_seconds()
            ok = seconds <= 30.0
            ok_all &= ok
            print(f"bench_first_run: `nnmem-sweep derive` of one recipe of Mistral 7B (traced anew, {os.cpu_count()} "
                  f"cores): {seconds:.1f} s (limit 30 s)  {'PASS' if ok else 'FAIL'}", flush=True)
    except RuntimeError as e:
        print(f"bench_first_run: FAIL  {e}")
        return 1
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
