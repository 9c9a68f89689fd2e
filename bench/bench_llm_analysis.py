"""Benchmark: seconds per training configuration, nnmem_sweep against cli99/llm-analysis, on the same 1,000 points.

llm-analysis (PyPI `llm-analysis`, pinned below) is installed ONLY into this benchmark's own virtual environment,
build/bench-venv (git-ignored), never into the project's. If it cannot be installed or run, the benchmark says so
and exits 0 (SKIP).

The 1,000 configurations: a Llama-style model (Llama 3.2 1B: h 2048, L 16, 32 heads, 8 KV heads, SwiGLU ffn 8192,
V 128256) trained with 16-bit weights, fp32 master weights and Adam (llm-analysis's w16a16e16 defaults; our
`bf16-master` recipe with fused AdamW), no sharding:
    batch 1..10 x seq_len {256, 512, 1024, 2048, 4096} x recomputation {none, full} x attention {flash, eager}
    x GPU {A100 40GB, A100 80GB, H100 SXM, H100 PCIe, A10G}                                   = 1,000
llm-analysis: one `LLMAnalysis` per GPU built beforehand, then `LLMAnalysis.training(...)` called once per
configuration (its own per-configuration API; it also computes latency, which we do not). Logging is set to
ERROR. A configuration its own checks refuse (an AssertionError when memory runs out) still counts as evaluated.
nnmem_sweep: `estimate.estimate_frame` (the estimator, every component, peak and fits) on the same configurations
estimated 1,000 times over in one 1 M-row frame, the way a sweep runs them: the figure PASS/FAIL is judged on
(>= 1000x faster per configuration; issue 11: the in-process call on 1,000 rows, dominated by its fixed per-call
cost, is not a gate). Also printed, informative: estimate_frame on the 1,000 rows alone and `runner.run_scenario`
(grid expansion and the max-batch table on top). Both sides: best of several repeats, wall clock
(time.perf_counter): llm-analysis the best of --repeats passes over the 1,000 configurations, estimate_frame the best
of 10 x max(--repeats, 10) calls on the 1,000 rows and of --repeats calls on the 1 M rows. A few points are
printed side by side in GiB, informative only: the two tools do not count the
same things (llm-analysis: weights + optimizer state + gradients + activations, Korthikanti-style; nnmem_sweep:
what is live at the peak phase, temporaries included).

    .venv/bin/python bench/bench_llm_analysis.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from nnmem_sweep.units import GiB

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "build" / "bench-venv"
PACKAGE = "llm-analysis==0.2.2"
TARGET_RATIO = 1000.0

BATCHES = tuple(range(1, 11))
SEQS = (256, 512, 1024, 2048, 4096)
RECOMPUTE = {"none": 0, "full": 2}  # llm-analysis ActivationRecomputation: NONE = 0, FULL = 2
ATTENTION = {"flash": True, "eager": False}
GPUS = {"a100-40gb": "a100-sxm-40gb", "a100-80gb": "a100-sxm-80gb", "h100-sxm": "h100-sxm-80gb",
        "h100-pcie": "h100-pcie-80gb", "a10g": "a10g-pcie-24gb"}
SHOW = [  # (batch, seq_len, checkpointing, attention, gpu) printed side by side
    (1, 2048, "none", "flash", "h100-sxm"), (4, 4096, "full", "flash", "h100-sxm"),
    (8, 1024, "none", "eager", "a100-80gb"), (2, 512, "none", "flash", "a10g"),
]

# Runs inside build/bench-venv: reads {"configs": [...], "repeats": n} on stdin, prints JSON on stdout.
CHILD = r'''
import json, logging, sys, time
from importlib.metadata import version
from llm_analysis.analysis import ActivationRecomputation, LLMAnalysis
from llm_analysis.config import DtypeConfig, ModelConfig, ParallelismConfig, get_gpu_config_by_name
from llm_analysis.logger import logger
logger.setLevel(logging.ERROR)
job = json.load(sys.stdin)
model = ModelConfig(**job["model"])
tools = {g: LLMAnalysis(model, get_gpu_config_by_name(g), DtypeConfig("w16a16e16"), ParallelismConfig(),
                        flops_efficiency=0.5, hbm_memory_efficiency=0.9) for g in {c["gpu"] for c in job["configs"]}}
KEY = "(weight+op_state+grad+act)_memory_per_gpu"
best, peaks = float("inf"), []
for _ in range(job["repeats"]):
    peaks = []
    t0 = time.perf_counter()
    for c in job["configs"]:
        try:
            d = tools[c["gpu"]].training(batch_size_per_gpu=c["batch"], seq_len=c["seq_len"],
                                         activation_recomputation=ActivationRecomputation(c["recompute"]),
                                         flash_attn=c["flash"], mlp_gated_linear_units=True)
            peaks.append(d[KEY])
        except AssertionError:
            peaks.append(None)
    best = min(best, time.perf_counter() - t0)
print(json.dumps({"version": version("llm-analysis"), "seconds": best, "peaks": peaks}))
'''


LLAMA_32_1B = dict(name="llama-3.2-1b", num_layers=16, n_head=32, hidden_dim=2048, vocab_size=128256,
                   max_seq_len=131072, num_key_value_heads=8, ffn_embed_dim=8192, expansion_ratio=4,
                   model_type="llama")
LLAMA_31_8B = dict(name="llama-3.1-8b", num_layers=32, n_head=32, hidden_dim=4096, vocab_size=128256,
                   max_seq_len=131072, num_key_value_heads=8, ffn_embed_dim=14336, expansion_ratio=3.5,
                   model_type="llama")
FIRST_RUN_RATIO = 10.0  # issue 20: a first run (empty cache) >= 10x faster per configuration than llm-analysis
FIRST_RUN_GRID = ROOT / "bench" / "grid_16k.yaml"


def configurations() -> list[dict]:
    """The 1,000 points in the same order as nnmem_sweep's grid (batch slowest ... GPU fastest)."""
    return [{"batch": b, "seq_len": s, "checkpointing": ck, "recompute": RECOMPUTE[ck], "attention": at,
             "flash": ATTENTION[at], "ours_gpu": g, "gpu": GPUS[g]}
            for b in BATCHES for s in SEQS for ck in RECOMPUTE for at in ATTENTION for g in GPUS]


def scenario():
    from nnmem_sweep import columns as C
    from nnmem_sweep.catalog.gpus import get_gpu
    from nnmem_sweep.models.presets import load_preset
    from nnmem_sweep.scenario import Overheads, Scenario

    grid = {C.BATCH: BATCHES, C.SEQ_LEN: SEQS, C.PRECISION: ("bf16-master",), C.OPTIMIZER: ("adamw",),
            C.OPTIMIZER_IMPL: ("fused",), C.CHECKPOINTING: tuple(RECOMPUTE), C.ATTENTION: tuple(ATTENTION),
            C.CACHE_TOKENS: (0,), C.DECODE_TOKENS: (0,)}
    # no runtime overheads and no headroom: total == peak allocated, the figure llm-analysis estimates
    return Scenario(path="", name="bench vs llm-analysis", description="", model=load_preset("llama-3.2-1b"),
                    mode="train", grid=grid, gpus=tuple(get_gpu(g) for g in GPUS),
                    overheads=Overheads(0, 0, 0.0), headroom=0.0)


def ensure_venv() -> tuple[Path | None, str]:
    py = VENV / "bin" / "python"
    try:
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True, timeout=300)
        probe = subprocess.run([str(py), "-c", "import llm_analysis"], capture_output=True, timeout=120)
        if probe.returncode != 0:
            done = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", PACKAGE],
                                  capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
                return None, f"cannot install {PACKAGE} into {VENV.relative_to(ROOT)}: {tail}"
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"cannot build {VENV.relative_to(ROOT)}: {e}"
    return py, ""


def gib(v) -> str:
    return "refused" if v is None else f"{v / GiB:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    configs = configurations()
    n = len(configs)
    assert n == 1000, n

    py, why = ensure_venv()
    if py is None:
        print(f"bench_llm_analysis: SKIP: {why}")
        return 0
    theirs, why = run_llm_analysis(py, configs, LLAMA_32_1B, args.repeats)
    if theirs is None:
        print(f"bench_llm_analysis: SKIP: llm-analysis did not run: {why}")
        return 0

    import pandas as pd

    from nnmem_sweep import columns as C
    from nnmem_sweep.grid import expand_grid
    from nnmem_sweep.runner import estimate_frame, run_scenario

    sc = scenario()
    grid = expand_grid(sc)
    # same order on both sides: batch, seq_len, checkpointing, attention, gpu
    assert len(grid) == n
    assert list(grid[C.BATCH]) == [c["batch"] for c in configs]
    assert list(grid[C.GPU].astype(str)) == [c["ours_gpu"] for c in configs]

    def best_of(fn, repeats: int) -> float:
        fn()  # warm-up: imports, caches
        b = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            b = min(b, time.perf_counter() - t0)
        return b

    def estimate(frame):
        return estimate_frame(sc.model, sc.mode, frame, sc.overheads, sc.headroom)

    rows = estimate(grid)
    # one estimate_frame call on the 1,000 rows takes about a millisecond: the best of 100
    reps = max(args.repeats, 10)
    per_est = best_of(lambda: estimate(grid), 10 * reps) / n  # the estimator on the 1,000 rows alone
    per_run = best_of(lambda: run_scenario(sc), reps) / n  # + grid expansion and the max-batch table
    big = pd.concat([grid] * 1000, ignore_index=True)  # the same 1,000 configurations, 1,000 times over
    per_big = best_of(lambda: estimate(big), args.repeats) / len(big)
    del big

    per_theirs = theirs["seconds"] / n
    ratio = per_theirs / per_big
    refused = sum(p is None for p in theirs["peaks"])
    print(f"bench_llm_analysis: {n:,} training configurations of a Llama-style 1.2B model (Llama 3.2 1B), "
          f"seconds per configuration:")
    print(f"  llm-analysis {theirs['version']} LLMAnalysis.training():  {per_theirs:.3e} s "
          f"({refused} of {n} refused by its out-of-memory assertion)")
    print(f"  nnmem_sweep estimate_frame, the same 1,000 rows:     {per_est:.3e} s   "
          f"{per_theirs / per_est:,.0f}x faster (one call; informative)")
    print(f"  nnmem_sweep run_scenario (+ max-batch table):         {per_run:.3e} s   "
          f"{per_theirs / per_run:,.0f}x faster")
    print(f"  nnmem_sweep estimate_frame, them x 1,000 (1 M rows): {per_big:.3e} s   {ratio:,.0f}x faster")
    print(f"  target >= {TARGET_RATIO:,.0f}x per configuration in the 1 M-row frame (estimate_frame): "
          f"{'PASS' if ratio >= TARGET_RATIO else 'FAIL'}")
    print("  batch  seq  recompute  attention  gpu        llm-analysis GiB  nnmem peak GiB  nnmem phase")
    for b, s, ck, at, g in SHOW:
        i = next(k for k, c in enumerate(configs) if (c["batch"], c["seq_len"], c["checkpointing"],
                                                       c["attention"], c["ours_gpu"]) == (b, s, ck, at, g))
        r = rows.iloc[i]
        print(f"  {b:>5}  {s:>4}  {ck:<9}  {at:<9}  {g:<9}  {gib(theirs['peaks'][i]):>16}  "
              f"{gib(int(r[C.PEAK_ALLOCATED])):>14}  {r[C.PEAK_PHASE]}")
    first_ok = first_run(py)
    return 0 if ratio >= TARGET_RATIO and first_ok else 1


def run_llm_analysis(py: Path, configs: list[dict], model: dict, repeats: int) -> tuple[dict | None, str]:
    job = json.dumps({"configs": configs, "repeats": repeats, "model": model})
    done = subprocess.run([str(py), "-c", CHILD], input=job, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        return None, (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return json.loads(done.stdout.strip().splitlines()[-1]), ""


# Runs in a fresh process with an empty user cache: the scenario's first run after the imports (run_scenario, its
# reserve replayed, and the tables written), in seconds, as JSON.
OURS_FIRST = r'''
import json, sys, tempfile, time
from pathlib import Path
from nnmem_sweep.config import load_scenario
from nnmem_sweep.outputs import OutputSet
from nnmem_sweep.runner import run_scenario, write_tables
sc = load_scenario(sys.argv[1])
t0 = time.perf_counter()
with OutputSet(Path(tempfile.mkdtemp()) / "out", sc, command="run") as out:
    write_tables(run_scenario(sc, bands=False), out)
print(json.dumps({"seconds": time.perf_counter() - t0}))
'''


def first_run(py: Path) -> bool:
    """A scenario's first run (empty cache: its allocator reserve replayed) against llm-analysis per configuration,
    on the 16,384 Llama 3.1 8B configurations of bench/grid_16k.yaml: in process after the imports (llm-analysis is
    timed after its imports too), and the whole command (interpreter start and imports included), informative."""
    import os
    import tempfile

    import yaml

    grid = yaml.safe_load(FIRST_RUN_GRID.read_text())
    g = grid["grid"]
    configs = [{"batch": b, "seq_len": s, "recompute": RECOMPUTE[ck], "flash": True, "gpu": GPUS[gpu]}
               for b in g["batch"] for s in g["seq_len"] for _ in g["optimizer"] for ck in g["checkpointing"]
               for gpu in grid["gpus"]]
    n = len(configs)
    theirs, why = run_llm_analysis(py, configs, LLAMA_31_8B, 1)
    if theirs is None:
        print(f"bench_llm_analysis: first run: SKIP: llm-analysis did not run: {why}")
        return True
    per_theirs = theirs["seconds"] / n
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, NNMEM_SWEEP_CACHE=str(Path(tmp) / "cache"))
        done = subprocess.run([sys.executable, "-c", OURS_FIRST, str(FIRST_RUN_GRID)], capture_output=True, text=True,
                              env=env, cwd=ROOT, check=True)
        inproc = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
        # the same rows with the reserve given (informative): the estimate and the tables without the replays, so the
        # line says how much of the first run the allocator's replays (numba's load included) take
        given = Path(tmp) / "given.yaml"
        given.write_text(yaml.safe_dump({**grid, "overheads": {"allocator_reserve": 0.05}}))
        done = subprocess.run([sys.executable, "-c", OURS_FIRST, str(given)], capture_output=True, text=True,
                              env=dict(env, NNMEM_SWEEP_CACHE=str(Path(tmp) / "cache3")), cwd=ROOT, check=True)
        no_replay = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
        env["NNMEM_SWEEP_CACHE"] = str(Path(tmp) / "cache2")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "nnmem_sweep.cli", "run", str(FIRST_RUN_GRID), "--out",
                        str(Path(tmp) / "out"), "-q"], env=env, cwd=ROOT, check=True, capture_output=True)
        whole = time.perf_counter() - t0
    ratio = per_theirs / (inproc / n)
    ok = ratio >= FIRST_RUN_RATIO
    print(f"bench_llm_analysis: first run of {n:,} Llama 3.1 8B configurations (bench/grid_16k.yaml, empty cache, "
          f"reserve replayed): llm-analysis {per_theirs:.3e} s per configuration; nnmem_sweep {inproc / n:.3e} s "
          f"after the imports ({ratio:.1f}x faster; target >= {FIRST_RUN_RATIO:g}x), the whole command "
          f"{whole:.2f} s ({per_theirs * n / whole:.1f}x)  {'PASS' if ok else 'FAIL'}")
    print(f"  of its {inproc:.2f} s after the imports, the same rows with the reserve given take {no_replay:.2f} s "
          f"({per_theirs * n / no_replay:.0f}x llm-analysis); the rest, {inproc - no_replay:.2f} s, is the allocator "
          f"replays of the first run (numba's load included)")
    return ok


if __name__ == "__main__":
    sys.exit(main())
