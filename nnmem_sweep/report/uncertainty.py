"""How far a real GPU's need may lie from the estimate's total, and so which verdicts a measurement must settle.

The estimate's total is the peak PyTorch allocates plus what it models for the rest (components/overhead.py: memory
outside the allocator, library workspaces, the allocator's reserve; or the scenario's `overheads:` overrides). The
rest is known only within ranges; `uncertainty_bytes` is the one place that turns them into bytes for a row:

    outside the allocator  the CUDA context with its modules, from the public measurements of this GPU generation's
                           loading mode (components/runtime.py, catalog/runtime.json: 254-612 MiB with lazy
                           loading on most GPUs), plus NCCL's buffers for every parallel group of more than one GPU
                           (up to ~1.8 GiB per communicator, measured, counted at that upper end)
    fragmentation          reserved minus allocated: 0.5 % to 32.5 % of the peak allocated (FRAGMENTATION: the
                           least capacity in which a step completes in the allocator model, replays.py, over the
                           recipes of configs/llama.yaml (Llama 3.1 8B: 0.5-32.5 %), qwen3.yaml (Qwen3 8B:
                           0.5-23.5 %) and resnet50.yaml (0.5 %); full checkpointing with 8-bit AdamW or Adafactor
                           the most) against the reserve assumed; a recipe the runner replayed has its own band
                           instead: its replays as a fresh and as a resumed run (fragmentation_band); a DeepSpeed
                           layout's row the span DeepSpeed's own measured steps needed (replays.py)

    above = Σ max(0, high − assumed)      below = Σ max(0, assumed − low)

A "fits" whose margin is below `above`, or a "does not fit" whose shortfall is below `below`, could flip on real
hardware: the report flags it "verify by measuring". What is assumed is read from the row's own columns
(`non_torch_bytes`, `reserved_bytes`), so an override in `overheads:` moves the assumed point, not the ranges.
The cuBLAS workspaces (allocator_extra_bytes) follow from the GPU's compute capability and are taken as known.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .. import columns as C
from ..components.overhead import fixed_bytes
from ..components.runtime import cuda_context_bytes, parse_runtime, runtime_memory
from ..replays import (DEEPSPEED_MEASURED_RECIPE, DEEPSPEED_OFFLOAD_RECIPE, DEEPSPEED_OFFLOAD_SPAN,
                       DEEPSPEED_RESERVE_SPAN)
from ..parallel.layout import FSDP1_OFFLOAD_TIE
from ..scenario import GPUSpec, Scenario
from .format import percent, size

# reserved − allocated, as a fraction of the peak allocated: the range the replays of replays.py needed (least
# capacity to complete) over every recipe of configs/llama.yaml, qwen3.yaml and resnet50.yaml; the first, unlimited
# replays of shared/ALLOCATOR.md (BERT-large) gave 0.8-9 %. No GPU has checked the allocator model yet.
FRAGMENTATION = (0.005, 0.325)
_LAYOUT = (C.DATA_PARALLEL, C.TENSOR_PARALLEL, C.PIPELINE_PARALLEL, C.CONTEXT_PARALLEL, C.EXPERT_PARALLEL)


def _gpu(sc: Scenario, gpu_id: str) -> GPUSpec:
    return next(g for g in sc.gpus if g.id == str(gpu_id))


def _layout(row: Mapping[str, Any]) -> dict[str, int]:
    return {a: int(row[a]) for a in _LAYOUT if a in row and row[a] is not None and not _isnan(row[a])}


def _isnan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def ranges(row: Mapping[str, Any], sc: Scenario) -> dict[str, tuple[int, int, int]]:
    """(low, high, assumed) bytes of each part the estimate is unsure of, for a row with `gpu` and
    `peak_allocated_bytes` (and the parallel axes of its layout, if any)."""
    gpu = _gpu(sc, row[C.GPU])
    peak = int(row[C.PEAK_ALLOCATED])
    rt = parse_runtime(dict(sc.overheads.runtime), gpu)
    context = cuda_context_bytes(rt)
    mem = runtime_memory(rt, _layout(row), gpu, sc.mode)
    nccl = mem.non_torch_bytes - context.bytes
    # what the estimate assumed: the row's own columns, or (a plan row without them) what the estimator would take
    outside_assumed = int(row[C.NON_TORCH]) if C.NON_TORCH in row else \
        fixed_bytes(sc.overheads, gpu, sc.mode, _layout(row))[0]
    frag_assumed = (int(row[C.RESERVED]) - peak - int(row.get(C.ALLOCATOR_EXTRA, 0))) if C.RESERVED in row else \
        math.ceil(peak * sc.overheads.reserve_fraction)
    lo, hi = fragmentation_band(row, sc)
    return {
        "outside": (int(context.low) + nccl, int(mem.non_torch_bytes), outside_assumed),
        "fragmentation": (math.floor(peak * lo), math.ceil(peak * hi), frag_assumed),
    }


def fragmentation_band(row: Mapping[str, Any], sc: Scenario) -> tuple[float, float]:
    """The reserve a real GPU may need, as fractions of the peak (fragmentation_source)."""
    return fragmentation_source(row, sc)[0]


def fragmentation_source(row: Mapping[str, Any], sc: Scenario) -> tuple[tuple[float, float], str]:
    """(band, whence): the row's recipe's replays (a fresh and a resumed run, replays.py) where it was replayed
    ("replayed"); on a DeepSpeed ZeRO-1/2 layout with a recipe like those measured (AdamW, no or full checkpointing),
    what DeepSpeed's own measured steps needed (replays.DEEPSPEED_RESERVE_SPAN, ZeRO-Offload's
    DEEPSPEED_OFFLOAD_SPAN: "deepspeed"), with the row's own
    traced step where it was replayed (a fresh run alone: "deepspeed-row"); else FRAGMENTATION ("default"). An
    offloaded FSDP1 row's replayed band reaches the tie an H100's recording showed (layout.FSDP1_OFFLOAD_TIE)."""
    ov = sc.overheads
    span = _deepspeed_span(row)
    if ov.replayed_band_by_recipe and ov.recipe_of(row) is not None:
        band = dict(ov.replayed_band_by_recipe).get(ov.recipe_of(row))
        if band is not None and span:  # a DeepSpeed row's fresh run alone: its measured steps' span beside
            return (min(band[0], span[0]), max(band[1], span[1])), "deepspeed-row"
        if band is not None and _fsdp1_offload(row):  # a tie its plan cannot see (parallel/layout.FSDP1_OFFLOAD_GAP)
            return (band[0], max(band[1], FSDP1_OFFLOAD_TIE)), "replayed"
        if band is not None:
            return band, "replayed"
    if span:
        return span, "deepspeed"  # a DeepSpeed layout (its buffers), a recipe like those measured
    return FRAGMENTATION, "default"


def _fsdp1_offload(row: Mapping[str, Any]) -> bool:
    version, offload = row.get(C.FSDP_VERSION), row.get(C.OFFLOAD)
    return version is not None and not _isnan(version) and int(version) == 1 and str(offload) == C.OFFLOAD_PARAMS


def _deepspeed_span(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """What DeepSpeed's own measured steps of the row's recipe needed (replays.DEEPSPEED_RESERVE_SPAN; ZeRO-Offload's,
    DEEPSPEED_OFFLOAD_SPAN), None for a row that is not DeepSpeed's or whose recipe none of them has."""
    bucket = row.get(C.REDUCE_BUCKET)
    if bucket is None or _isnan(bucket) or int(bucket) <= 0:
        return None
    for recipe, span in ((DEEPSPEED_MEASURED_RECIPE, DEEPSPEED_RESERVE_SPAN),
                         (DEEPSPEED_OFFLOAD_RECIPE, DEEPSPEED_OFFLOAD_SPAN)):
        if all(str(row.get(a, C.PARALLEL_DEFAULTS.get(a, values[0]))) in values for a, values in recipe.items()):
            return span
    return None


def uncertainty_bytes(row: Mapping[str, Any], sc: Scenario) -> tuple[int, int]:
    """(below, above): how much less, and how much more, than the row's `total_bytes` a real GPU may need."""
    parts = ranges(row, sc).values()
    return (sum(max(0, assumed - low) for low, _, assumed in parts),
            sum(max(0, high - assumed) for _, high, assumed in parts))


def flips(margin: int, below: int, above: int) -> bool:
    """A verdict the uncertainty could flip: fits with less room than `above`, or misses by less than `below`."""
    return 0 <= margin < above if margin >= 0 else -margin <= below


def basis_text(row: Mapping[str, Any], sc: Scenario) -> str:
    """'outside PyTorch 254 MiB–612 MiB (512 MiB assumed: CUDA context), ..., fragmentation 0.8%–9% of the peak
    (5% assumed)'."""
    r = ranges(row, sc)
    lo, hi, assumed = r["outside"]
    groups = [f"{a.split('_')[0]} {n}" for a, n in _layout(row).items() if n > 1]
    outside = (f"outside PyTorch {size(lo)}–{size(hi)} ({size(assumed)} assumed; CUDA context"
               + (f", NCCL for the {', '.join(groups)} groups)" if groups else ")"))
    f_assumed = r["fragmentation"][2] / max(int(row[C.PEAK_ALLOCATED]), 1)
    (lo, hi), whence = fragmentation_source(row, sc)
    replayed = whence != "default"
    how = {"replayed": "replayed fresh and resumed; ", "deepspeed": "DeepSpeed's measured steps, replayed; ",
           "deepspeed-row": "its DeepSpeed step traced and replayed fresh, and DeepSpeed's measured steps; "}
    if whence == "replayed" and _fsdp1_offload(row) and hi == FSDP1_OFFLOAD_TIE:
        how["replayed"] = "replayed fresh and resumed, the top an H100 recording of FSDP1's offload; "
    frag = (f", fragmentation {percent(lo)}–{percent(hi)} of the peak "
            f"({how.get(whence, '')}{percent(f_assumed)} assumed"
            f"{'; the allocator model checked against real GPUs: docs/accuracy.md' if replayed else ''})")
    return outside + frag


def measure_command(config_path: str, sc: Scenario, point: Mapping[str, Any]) -> str:
    """`nnmem-sweep measure CONFIG --device cuda --point AXIS=VALUE ...` for one grid point: batch, sequence length
    and every axis the scenario varies (the others are the scenario's own single values). Run on the GPU itself, it
    measures the point for real (measure/real.py: allocated, reserved, outside PyTorch, the least capacity)."""
    axes = [C.BATCH, C.SEQ_LEN] + [a for a in C.NON_BATCH_AXES if a != C.SEQ_LEN and len(sc.grid.get(a, ())) > 1]
    points = " ".join(f"--point {a}={point[a]}" for a in axes if a in point and point[a] is not None)
    return f"nnmem-sweep measure {config_path} --device cuda {points}".strip()
