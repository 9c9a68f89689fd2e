"""Shared by the bench_*.py scripts (run as scripts, so this folder is on sys.path)."""
from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nnmem_sweep.units import KiB

ROOT = Path(__file__).resolve().parents[1]


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KiB


def children_peak_rss_bytes() -> int:
    """The largest peak resident set size of any child process waited for so far."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * KiB


def cli() -> list[str]:
    """`python -m nnmem_sweep.cli`: the command as installed (the same entry, cli.entry), run with the code this
    interpreter imports, so a checkout benchmarks its own tree."""
    return [sys.executable, "-m", "nnmem_sweep.cli"]


def time_cli(args: list[str], runs: int) -> tuple[float, list[str]]:
    """Best wall-clock seconds of `nnmem-sweep ARGS --out TMP --quiet` over `runs` fresh processes (imports,
    computing, writing and the process's exit all counted), and the files the last run wrote."""
    best, written = float("inf"), []
    for _ in range(runs):
        parent = Path(tempfile.mkdtemp(prefix="nnmem-bench-"))
        try:
            out = parent / "out"
            t0 = time.perf_counter()
            done = subprocess.run([*cli(), *args, "--out", str(out), "--quiet"], cwd=ROOT, capture_output=True,
                                  text=True)
            elapsed = time.perf_counter() - t0
            if done.returncode != 0:
                raise RuntimeError(f"`nnmem-sweep {' '.join(args)}` failed (exit {done.returncode}): "
                                   f"{done.stderr.strip()[-500:]}")
            written = sorted(p.name for p in out.iterdir())
        finally:
            shutil.rmtree(parent, ignore_errors=True)
        best = min(best, elapsed)
    return best, written
