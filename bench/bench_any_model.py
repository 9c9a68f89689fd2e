"""Benchmark: any model, safely (issue 24). A model whose step loops over the tokens on the CPU (Mamba 130m's
selective scan without mamba-ssm's kernels; bench/models/mamba-130m.json, its published shape), asked with eager
attention as a user would, ends in one line with exit 2 and nothing written, in bounded time and memory, cold (an
empty user cache). Before the check it ran 11 minutes at 3.2 GB and was stopped with a traceback.

| what | target |
|---|---|
| `nnmem-sweep run` of a Mamba 130m scenario, cold: exit 2, one line | <= 120 s, peak memory of the run <= 4 GiB |

    .venv/bin/python bench/bench_any_model.py
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from _common import ROOT, children_peak_rss_bytes, cli

SCENARIO = """model: {hf_config: mamba-130m.json}
mode: train
grid: {batch: [1, 2], seq_len: [1024, 2048], precision: bf16, optimizer: adamw, attention: eager}
gpus: [h100-sxm]
"""
SECONDS, MEMORY = 120, 4 * 2**30


def main() -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench_any_model: SKIP: the measure extra (torch, transformers) is not installed")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="nnmem-bench-"))
    try:
        shutil.copy(ROOT / "bench" / "models" / "mamba-130m.json", tmp / "mamba-130m.json")
        (tmp / "s.yaml").write_text(SCENARIO)
        env = dict(os.environ, NNMEM_SWEEP_CACHE=str(tmp / "cache"))
        t0 = time.perf_counter()
        done = subprocess.run([*cli(), "run", str(tmp / "s.yaml"), "--out", str(tmp / "out"), "-q"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=600)
        elapsed, rss = time.perf_counter() - t0, children_peak_rss_bytes()
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        ok = done.returncode == 2 and len(lines) == 1 and not (tmp / "out").exists()
        verdict = "PASS" if ok and elapsed <= SECONDS and rss <= MEMORY else "FAIL"
        print(f"bench_any_model: Mamba 130m (a loop per token on the CPU), cold: exit {done.returncode}, "
              f"{len(lines)} line(s), {elapsed:.1f} s (target <= {SECONDS} s), peak {rss / 2**30:.2f} GiB "
              f"(target <= {MEMORY / 2**30:.0f} GiB): {verdict}")
        if verdict == "FAIL":
            print("\n".join(lines[-3:]))
        return 0 if verdict == "PASS" else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
