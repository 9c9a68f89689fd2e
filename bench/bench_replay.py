"""Benchmark: the caching-allocator replay of configs/qwen3.yaml's boundary rows (components/reserve.py).

Takes the rows `nnmem-sweep run` replays (replays.boundary_rows: per recipe its largest batch that fits, from the
shipped plans: no torch work) and replays each once through the allocator model with memory to spare. Prints the rows, the events
per step and per replay, the seconds per replay and in all, the reserve ratios (peak reserved / peak allocated),
and PASS/FAIL against a limit on the seconds per replay.

Then what a user waits for: `nnmem-sweep run` of the scenario end to end, whose reserve comes from bisections of
replays at each recipe's boundary (replays.py): once with an empty cache (the first run) and once again (the
bisections read back), against FIRST_LIMIT_S and AGAIN_LIMIT_S.

    .venv/bin/python bench/bench_replay.py [--config configs/qwen3.yaml] [--limit 5]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from _common import ROOT

LIMIT_S = 5.0  # per replayed row
FIRST_LIMIT_S, AGAIN_LIMIT_S = 30.0, 3.0  # `nnmem-sweep run` with an empty cache, and again


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "qwen3.yaml"))
    ap.add_argument("--limit", type=float, default=LIMIT_S)
    args = ap.parse_args(argv)

    from nnmem_sweep.components.reserve import replayed_reserve
    from nnmem_sweep.config import load_scenario
    from nnmem_sweep.fit import scenario_max_batch
    from nnmem_sweep.replays import boundary_rows

    sc = load_scenario(args.config)
    rows = boundary_rows(sc, scenario_max_batch(sc))  # the rows `run` replays: per recipe its largest batch that fits
    t0 = time.perf_counter()
    out = replayed_reserve(sc.model, sc.mode, rows)
    seconds = time.perf_counter() - t0
    done = out.events > 0
    n = int(done.sum())
    if n == 0:
        print(f"bench_replay: FAIL  no row of {Path(args.config).name} has a stored sequence ({out.notes[0]})")
        return 1
    ratio = out.ratio()[done]
    per = seconds / len(rows)
    ok = per < args.limit
    print(f"bench_replay: {len(rows)} boundary rows of {Path(args.config).name}, {n} replayed; "
          f"{int(out.events[done].min()):,}-{int(out.events[done].max()):,} events per replay; "
          f"{per:.2f} s per replay, {seconds:.1f} s in all (limit {args.limit:g} s per replay); "
          f"peak reserved / peak allocated {ratio.min():.3f}-{ratio.max():.3f} (median {pd.Series(ratio).median():.3f})"
          f"  {'PASS' if ok else 'FAIL'}")
    return 0 if ok and end_to_end(Path(args.config)) else 1


def end_to_end(config: Path) -> bool:
    import os
    import subprocess
    import tempfile

    times = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, NNMEM_SWEEP_CACHE=str(Path(tmp) / "cache"))
        for _ in range(2):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "nnmem_sweep.cli", "run", str(config), "--out",
                            str(Path(tmp) / "out"), "-q"], check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - t0)
    ok = times[0] < FIRST_LIMIT_S and times[1] < AGAIN_LIMIT_S
    print(f"bench_replay: `nnmem-sweep run {config.name}` with its reserve replayed: {times[0]:.1f} s the first time "
          f"(limit {FIRST_LIMIT_S:g} s), {times[1]:.1f} s again (limit {AGAIN_LIMIT_S:g} s)  {'PASS' if ok else 'FAIL'}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
