"""The estimator against published real-GPU measurements (published.py, tests/data/published/*.json).

Each measurement the estimator can express is mapped, by (file, id) in ESTIMATORS, to the library call that
estimates the same statistic for the configuration the source states; nothing is tuned to a figure. The rest get the
source file's own `missing` text as their reason. `compare_published()` returns one row per measurement:

    error = (estimate − nearest end of the published range) / that end      (0 inside the range)
    within target:  −3 % ≤ error ≤ +5 %   (TARGET_UNDER, TARGET_OVER: within 5 %, never more than 3 % under)

A figure outside the target keeps its error and says why in `why` (WHY_OFF). `in_sample` names the sourced row of
catalog/runtime.json or catalog/gpus.json that is this very measurement: such an estimate checks the way the model
reads its data (which rows, which end of their range), not a prediction.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cache

import numpy as np
import pandas as pd

from . import columns as C
from .allocator.rules import allocation_size, round_size
from .catalog.gpus import get_gpu
from .components.overhead import fixed_bytes
from .components.runtime import cuda_context_bytes, parse_runtime, runtime_memory
from .config import parse_scenario_text
from .published import Measurement, load_published
from .scenario import GPUSpec, Scenario
from .serving import activation_peak_bytes, max_concurrency, weights_per_gpu_bytes
from .units import GiB, format_bytes

TARGET_OVER = 0.05  # an estimate may be at most 5 % above the published range
TARGET_UNDER = 0.03  # ... and at most 3 % below it (under-estimating memory is the costlier mistake)

FILE, ID, STATISTIC = "file", "id", "statistic"
LOW, HIGH, ESTIMATED = "published_low_bytes", "published_high_bytes", "estimated_bytes"
ERROR, WITHIN, HOW, IN_SAMPLE, WHY = "error", "within_target", "estimated_with", "in_sample", "why"
COLUMNS = (FILE, ID, STATISTIC, LOW, HIGH, ESTIMATED, ERROR, WITHIN, HOW, IN_SAMPLE, WHY)


# ------------------------------------------------------------------------------------------------ the estimates

def _context(runtime: dict, gpu_id: str | None) -> int:
    """The CUDA context the runtime model gives for that runtime and GPU (components/runtime.py)."""
    return cuda_context_bytes(parse_runtime(runtime, get_gpu(gpu_id) if gpu_id else None)).bytes


def _segment(request_bytes: int) -> int:
    """The segment the caching allocator reserves for one request on an empty GPU (allocator/rules.py)."""
    return allocation_size(round_size(request_bytes))


# vLLM's log does not name its GPU, only "an 80 GB Ampere or Hopper part" (PyTorch sees 79.22 GiB): its capacity is
# taken as the lowest of the catalog's 80 GB Ampere and Hopper parts (the catalog's own conservative rule), and the
# runtime figures as those of an unstated GPU generation.
VLLM_80GB_PARTS = ("a100-80gb", "h100-sxm", "h100-pcie")
VLLM_YAML = """\
model: {preset: llama-3.1-8b}
mode: infer
grid: {batch: [1], seq_len: [8192], precision: [bf16], decode_tokens: 0}
gpus: [h100-sxm]
runtime: {torch: "2.5"}
serving: {gpu_memory_utilization: 0.9, tensor_parallel: [1, 2], max_num_batched_tokens: 8192}
"""


@cache
def vllm_scenario() -> Scenario:
    """`vllm serve meta-llama/Meta-Llama-3-8B` (-tp 1 and 2) of December 2024 as our serving scenario: the preset
    llama-3.1-8b (Llama 3 8B's shapes: 8,030,261,248 parameters), bf16, vLLM's defaults (0.90 utilisation, a profiling
    prefill of 8192 tokens), torch 2.5 (vLLM's pin then), on an unnamed 80 GB part."""
    sc = parse_scenario_text(VLLM_YAML, file="<published vllm-pr10511>")
    low = min((get_gpu(g) for g in VLLM_80GB_PARTS), key=lambda g: g.memory_bytes)
    gpu = GPUSpec(id="unnamed-80gb", name="80 GB Ampere or Hopper part (not named)", memory_bytes=low.memory_bytes,
                  source=f"lowest catalog capacity of {', '.join(VLLM_80GB_PARTS)}: {low.id}")
    return dataclasses.replace(sc, gpus=(gpu,), overheads=dataclasses.replace(sc.overheads, gpus=(gpu,)))


def _vllm_weights(tp: int) -> int:
    return int(weights_per_gpu_bytes(vllm_scenario().model, "bf16", np.array([tp]))[0])


def _vllm_non_torch(tp: int) -> int:
    sc = vllm_scenario()
    return fixed_bytes(sc.overheads, sc.gpus[0], "infer", {C.TENSOR_PARALLEL: tp})[0]


def _vllm_activation() -> int:
    return int(activation_peak_bytes(vllm_scenario(), ("bf16",), 8192)[0])


def _vllm_kv(tp: int) -> int:
    plan = max_concurrency(vllm_scenario())
    return int(plan.loc[plan[C.TENSOR_PARALLEL] == tp, C.KV_BUDGET].iloc[0])


def _b200_in_use() -> int:
    # x, y = x/2 and z = y+10 are live when z.mul fails: three fp32 tensors of 15e9 elements, each in its own segment
    return _context({}, "b200") + 3 * _segment(15 * 10**9 * 4)


def _h200_allocatable() -> int:
    # 1 GiB tensors (2**28 fp32, one 1 GiB segment each) fit while capacity − context allows a whole one more
    return (get_gpu("h200").memory_bytes - _context({}, "h200")) // GiB * GiB


def _nccl_non_torch(all_to_all: bool) -> int:
    """8 x H100 (SXM taken: one node of eight), outside PyTorch: the context and one communicator over the 8 ranks;
    after the first all_to_all_single also the all-to-all connections (expert_parallel's extra term)."""
    group = "expert_parallel" if all_to_all else "data_parallel"  # an all-to-all group adds its connections
    return runtime_memory({}, {group: 8}, get_gpu("h100-sxm")).non_torch_bytes


@dataclasses.dataclass(frozen=True)
class Estimator:
    call: Callable[[], int]
    how: str  # the estimator call, in words
    in_sample: str = ""  # the catalog row that is this measurement, if any


ESTIMATORS: dict[tuple[str, str], Estimator] = {
    ("hf-model-memory-anatomy.json", "context"): Estimator(
        lambda: _context({"cuda": "11.2"}, "v100-16gb") + _segment(4),
        "cuda_context_bytes(CUDA 11.2: eager, volta) + the 2 MiB small-pool segment of torch.ones((1, 1))",
        "runtime.json cuda_context hf-anatomy-v100"),
    ("ml-engineering-b200-oom.json", "process-in-use"): Estimator(
        _b200_in_use, "cuda_context_bytes(lazy, blackwell) + 3 segments of 60e9 B (allocator/rules.py)",
        "runtime.json cuda_context ml-engineering-b200"),
    ("ml-engineering-b200-oom.json", "total-capacity"): Estimator(
        lambda: get_gpu("b200").memory_bytes, "catalog b200 memory_bytes", "gpus.json b200 torch_total"),
    ("ml-engineering-h200-allocatable.json", "allocated-before-oom"): Estimator(
        _h200_allocatable, "whole 1 GiB tensors in catalog h200 memory_bytes − cuda_context_bytes(lazy, hopper)",
        "gpus.json h200 torch_total; runtime.json cuda_context ml-engineering-h200"),
    ("ml-engineering-h200-allocatable.json", "total-capacity"): Estimator(
        lambda: get_gpu("h200").memory_bytes, "catalog h200 memory_bytes", "gpus.json h200 torch_total"),
    ("nccl-issue1685-alltoall.json", "before"): Estimator(
        lambda: _nccl_non_torch(False), "runtime_memory({}, {data_parallel: 8}, h100-sxm).non_torch_bytes"),
    ("nccl-issue1685-alltoall.json", "after"): Estimator(
        lambda: _nccl_non_torch(True), "runtime_memory({}, {expert_parallel: 8}, h100-sxm).non_torch_bytes",
        "runtime.json nccl nccl-1685-alltoall (after − before)"),
    ("pytorch-issue95668-cublas-workspace.json", "linear-forward"): Estimator(
        lambda: runtime_memory({"torch": "2.0", "cuda": "11.8"}, {}, get_gpu("a10g"), "infer").allocator_extra_bytes,
        "runtime_memory(torch 2.0, a10g, infer).allocator_extra_bytes (one cuBLAS workspace, cc 8.6)",
        "runtime.json cublas (the allocator rule comes from this issue; the size from CublasHandlePool.cpp)"),
    ("pytorch-pr86509-lazy-loading.json", "lazy"): Estimator(
        lambda: _context({"torch": "1.13", "lazy_loading": True}, None) + _segment(20 * 16 * 50 * 100 * 4),
        "cuda_context_bytes(torch 1.13, lazy, GPU not stated) + the 20 MiB segment of a 6.4 MB tensor",
        "runtime.json cuda_context pytorch-86509-lazy"),
    ("pytorch-pr86509-lazy-loading.json", "eager"): Estimator(
        lambda: _context({"torch": "1.13", "lazy_loading": False}, None) + _segment(20 * 16 * 50 * 100 * 4),
        "cuda_context_bytes(torch 1.13, eager, GPU not stated) + the 20 MiB segment of a 6.4 MB tensor",
        "runtime.json cuda_context pytorch-86509-eager"),
    ("unsloth-zoo-pr1053-context.json", "context"): Estimator(
        lambda: _context({"torch": "2.10", "cuda": "13.0"}, "rtx-6000-ada"),
        "cuda_context_bytes(torch 2.10, CUDA 13.0: lazy, ada)", "runtime.json cuda_context unsloth-zoo-1053-ada"),
    ("unsloth-zoo-pr1053-context.json", "capacity"): Estimator(
        lambda: get_gpu("rtx-6000-ada").memory_bytes, "catalog rtx-6000-ada memory_bytes",
        "gpus.json rtx-6000-ada torch_total"),
    ("vllm-pr10511-llama3-8b.json", "tp1-total"): Estimator(
        lambda: vllm_scenario().gpus[0].memory_bytes,
        f"lowest catalog memory_bytes of the 80 GB parts {', '.join(VLLM_80GB_PARTS)} (the GPU is not named)"),
    ("vllm-pr10511-llama3-8b.json", "tp1-weights"): Estimator(
        lambda: _vllm_weights(1), "serving.weights_per_gpu_bytes(llama-3.1-8b, bf16, t=1)"),
    ("vllm-pr10511-llama3-8b.json", "tp1-non-torch"): Estimator(
        lambda: _vllm_non_torch(1), "fixed_bytes(infer, tensor_parallel 1, GPU generation not stated) outside"),
    ("vllm-pr10511-llama3-8b.json", "tp1-activation-peak"): Estimator(
        _vllm_activation, "serving.activation_peak_bytes: one prefill of 8192 tokens, bf16"),
    ("vllm-pr10511-llama3-8b.json", "tp1-kv-cache"): Estimator(
        lambda: _vllm_kv(1), "serving.max_concurrency kv_budget, tensor_parallel 1"),
    ("vllm-pr10511-llama3-8b.json", "tp2-weights"): Estimator(
        lambda: _vllm_weights(2), "serving.weights_per_gpu_bytes(llama-3.1-8b, bf16, t=2)"),
    ("vllm-pr10511-llama3-8b.json", "tp2-non-torch"): Estimator(
        lambda: _vllm_non_torch(2), "fixed_bytes(infer, tensor_parallel 2, GPU generation not stated) outside",
        "runtime.json nccl vllm-10511-tp2 (TP 2 − TP 1)"),
    ("vllm-pr10511-llama3-8b.json", "tp2-activation-peak"): Estimator(
        _vllm_activation, "serving.activation_peak_bytes: one prefill of 8192 tokens, bf16 (not divided by t)"),
}

# Why an estimate lies outside the target: what the model lacks, not a constant to tune.
WHY_OFF: dict[tuple[str, str], str] = {
    ("nccl-issue1685-alltoall.json", "before"):
        "the communicator figure is the largest published one (vLLM's TP 2 increase, 1.80 GiB, which holds vLLM's "
        "custom all-reduce buffers too); before its first collective this process held about 0.5 GB beyond the "
        "context: no per-communicator measurement of plain NCCL init on Hopper was found",
    ("nccl-issue1685-alltoall.json", "after"):
        "the all-to-all term is this very increase (3.28 GB); the excess is the communicator term, as before the "
        "all-to-all",
    ("pytorch-pr86509-lazy-loading.json", "lazy"):
        "the GPU is not stated, so the model takes the upper end of every lazy-loading measurement of an unstated "
        "GPU (unsloth#9362's 612 MiB); this row itself is 254 MiB of context",
    ("pytorch-pr86509-lazy-loading.json", "eager"):
        "the GPU is not stated, so the model takes the upper end of the eager measurements of an unstated GPU (a "
        "maintainer's '>1000MB'); this row itself is 616 MiB of context",
    ("unsloth-zoo-pr1053-context.json", "context"):
        "the model takes the upper end of the lazy-loading measurements for Ada or an unstated GPU (unsloth#9362's "
        "612 MiB), not this Ada row's 426 MiB: a context per GPU generation is measured for too few GPUs to pick one",
    ("vllm-pr10511-llama3-8b.json", "tp1-non-torch"):
        "vLLM's non_torch_memory is what grew outside PyTorch's allocator after its baseline snapshot (so not the "
        "context the baseline held): kernels and library state loaded by the profile run and vLLM's own buffers; "
        "the model's non-torch (what the serving plan subtracts) is the context alone, 0.60 GiB for an unstated "
        "GPU: no source itemises the ~1.2 GiB vLLM finds beyond it",
    ("vllm-pr10511-llama3-8b.json", "tp2-non-torch"):
        "as TP 1 (the ~1.2 GiB vLLM's profile adds beyond the context is not modelled); the communicator term is this "
        "log's own TP 2 increase",
    ("vllm-pr10511-llama3-8b.json", "tp1-activation-peak"):
        "the model counts the profiling forward's temporaries for 8192 tokens; vLLM's profile run also samples "
        "max_num_seqs = 256 sequences (presumably logits of 256 x 128,256 in fp32, 0.12 GiB, and the sampler's "
        "probabilities of the same shape): not modelled",
    ("vllm-pr10511-llama3-8b.json", "tp2-activation-peak"):
        "as TP 1: the sampler's tensors for 256 sequences are not modelled",
}
# Why an estimate inside the target is there although its parts are not.
NOTE: dict[tuple[str, str], str] = {
    ("vllm-pr10511-llama3-8b.json", "tp1-kv-cache"):
        "within target by compensation: 0.9 · capacity − weights − activations − non-torch takes 0.12 GiB less "
        "capacity (the lowest 80 GB part) but subtracts about 1.2 GiB too little non-torch and 0.35 GiB too little "
        "activation peak (the rows above)",
}


# ------------------------------------------------------------------------------------------------ the table

def relative_error(estimate: int, low: int, high: int) -> float:
    """(estimate − nearest end) / that end; 0 inside [low, high]."""
    if estimate < low:
        return (estimate - low) / low
    if estimate > high:
        return (estimate - high) / high
    return 0.0


def within_target(error: float) -> bool:
    return -TARGET_UNDER <= error <= TARGET_OVER


def _row(m: Measurement) -> dict:
    est = ESTIMATORS.get((m.file, m.id))
    row = {FILE: m.file, ID: m.id, STATISTIC: m.statistic, LOW: m.low_bytes, HIGH: m.high_bytes}
    if est is None:
        why = m.missing or "no estimator call mapped"
        return {**row, ESTIMATED: -1, ERROR: float("nan"), WITHIN: False, HOW: "", IN_SAMPLE: "",
                WHY: f"not estimated: {why}"}
    value = int(est.call())
    err = relative_error(value, m.low_bytes, m.high_bytes)
    ok = within_target(err)
    return {**row, ESTIMATED: value, ERROR: err, WITHIN: ok, HOW: est.how, IN_SAMPLE: est.in_sample,
            WHY: NOTE.get((m.file, m.id), "") if ok else WHY_OFF.get((m.file, m.id),
                                                                     "outside the target: no reason written down")}


def compare_published(measurements: list[Measurement] | None = None) -> pd.DataFrame:
    """One row per published measurement (COLUMNS); estimated_bytes −1 and error NaN where not estimated."""
    ms = load_published() if measurements is None else measurements
    df = pd.DataFrame([_row(m) for m in ms], columns=list(COLUMNS))
    for c in (LOW, HIGH, ESTIMATED):
        df[c] = df[c].astype(np.int64)
    return df


def estimated(df: pd.DataFrame) -> pd.DataFrame:
    return df[df[ESTIMATED] >= 0]


def summary(df: pd.DataFrame) -> dict[str, float]:
    """n measurements, n estimated, median |error|, the largest under- and over-estimate, n within the target."""
    e = estimated(df)[ERROR]
    return {"measurements": int(len(df)), "estimated": int(len(e)),
            "median_abs_error": float(e.abs().median()) if len(e) else float("nan"),
            "max_under": float(min(e.min(), 0.0)) if len(e) else float("nan"),
            "max_over": float(max(e.max(), 0.0)) if len(e) else float("nan"),
            "within_target": int(estimated(df)[WITHIN].sum()),
            "in_sample": int((estimated(df)[IN_SAMPLE] != "").sum()),
            "within_target_out_of_sample": int((estimated(df)[WITHIN] & (estimated(df)[IN_SAMPLE] == "")).sum())}


def summary_line(df: pd.DataFrame) -> str:
    s = summary(df)
    return (f"published real-GPU measurements: {s['measurements']}, {s['estimated']} estimated; |error| median "
            f"{s['median_abs_error']:.1%}, largest under {s['max_under']:+.1%}, largest over {s['max_over']:+.1%}; "
            f"{s['within_target']} of {s['estimated']} within target (−{TARGET_UNDER:.0%} .. +{TARGET_OVER:.0%}); "
            f"{s['in_sample']} in sample (the model's own data holds that figure), "
            f"{s['within_target_out_of_sample']} of {s['estimated'] - s['in_sample']} out-of-sample within target")


def _gib(n: int) -> str:
    return format_bytes(n, "GiB", 3) if n >= 0 else "n/a"


def format_table(df: pd.DataFrame) -> str:
    lines = [f"{'source':<41} {'id':<29} {'statistic':<24} {'published (GiB)':>23} {'estimated':>11} {'error':>8}"]
    for r in df.to_dict("records"):
        lo, hi = _gib(r[LOW]), _gib(r[HIGH])
        pub = lo if lo == hi else f"{lo.split()[0]}..{hi}"
        err = f"{r[ERROR]:+.1%}" if r[ESTIMATED] >= 0 else "n/a"
        mark = "" if r[ESTIMATED] < 0 else ("  ok" if r[WITHIN] else "  OFF") + ("  (in sample)" if r[IN_SAMPLE] else "")
        lines.append(f"{r[FILE].removesuffix('.json'):<41} {r[ID]:<29} {r[STATISTIC]:<24} {pub:>23} "
                     f"{_gib(r[ESTIMATED]):>11} {err:>8}{mark}")
        if r[ESTIMATED] >= 0 and r[WHY]:
            lines.append(f"{'':<8}why: {r[WHY]}")
    return "\n".join(lines)
