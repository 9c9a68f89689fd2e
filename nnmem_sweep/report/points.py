"""Which points of the sweep the report speaks about, and how it names them: the axes and their values, the reference
point, selecting rows at a point, the GPUs in the order the report lists them, and a point or a parallel layout
written as words ("Llama 3.1 8B training, seq 4,096, bf16-mixed adamw", "TP 8 + SP · PP 4 · DP 8 · ZeRO 1")."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .. import columns as C
from ..scenario import Scenario
from .format import AXIS_LABELS, axis_value, thousands

# the order a layout is written in: the model split first (TP with SP, PP with its micro-batches), then the data split
LAYOUT_ORDER = (C.TENSOR_PARALLEL, C.SEQUENCE_PARALLEL, C.PIPELINE_PARALLEL, C.MICRO_BATCHES, C.PIPELINE_SCHEDULE,
                 C.VIRTUAL_STAGES, C.CONTEXT_PARALLEL, C.EXPERT_PARALLEL, C.DATA_PARALLEL, C.ZERO_STAGE, C.FSDP_VERSION,
                 C.BACKWARD_PREFETCH, C.OFFLOAD, C.GRADIENT_ACCUMULATION, C.FP32_GRAD_ACCUMULATION)


def axis_values(sc: Scenario) -> dict[str, tuple]:
    """Every non-batch axis and its values, in the contract's order: the grid's (with the optional axes it names),
    then, when the scenario has a `parallel:` block, the parallel axes (columns.PARALLEL_DEFAULTS for those it does
    not name), as grid.axes_of expands them."""
    axes = {a: tuple(sc.grid.get(a, ())) for a in C.NON_BATCH_AXES}
    axes.update({a: tuple(sc.grid[a]) for a in C.OPTIONAL_AXES if a in sc.grid})  # only where the scenario names it
    for a in C.PARALLEL_AXES if sc.parallel else ():
        axes[a] = tuple(sc.parallel.get(a) or (C.PARALLEL_DEFAULTS[a],))
    return axes


def varying_axes(sc: Scenario) -> list[str]:
    """Non-batch axes with more than one value (parallel ones included), in the contract's order."""
    return [a for a, values in axis_values(sc).items() if len(values) > 1]


def layout_axes(sc: Scenario) -> list[str]:
    """The parallel axes that vary, in the order a layout is written (LAYOUT_ORDER: TP, PP, ..., DP, ZeRO): each
    combination of them is a layout the tables give a row."""
    varying = set(varying_axes(sc))
    return [a for a in LAYOUT_ORDER if a in varying]


def reference_point(sc: Scenario) -> dict[str, Any]:
    """The point the summary speaks about: `report.reference_batch/_seq_len`, then the target, then each axis's first
    (the parallel axes too: the first layout the scenario lists).

    A reference batch need not be a grid value (the summary reports the max batch, not this one); other axes must be.
    """
    chosen = {k: v for k, v in (sc.target or {}).items() if k in C.GRID_AXES}
    for axis in (C.BATCH, C.SEQ_LEN):
        if sc.report.get(f"reference_{axis}") is not None:
            chosen[axis] = sc.report[f"reference_{axis}"]
    point = {}
    for axis, values in ({C.BATCH: tuple(sc.grid.get(C.BATCH, ()))} | axis_values(sc)).items():
        if axis in chosen and (chosen[axis] in values or axis == C.BATCH):
            point[axis] = chosen[axis]
        elif values:
            point[axis] = values[0]  # a parallel scenario: its first layout
    return point


def mask(df: pd.DataFrame, point: dict[str, Any]) -> np.ndarray:
    m = np.ones(len(df), dtype=bool)
    for axis, value in point.items():
        if axis not in df.columns:
            continue
        col = df[axis]
        m &= col.isna().to_numpy() if value is None else (col == value).to_numpy()
    return m


def select(df: pd.DataFrame, point: dict[str, Any]) -> pd.DataFrame:
    return df[mask(df, point)]


def gpu_order(sc: Scenario) -> list:
    """GPUs smallest memory first (ties: the scenario's order)."""
    return sorted(sc.gpus, key=lambda g: g.memory_bytes)


def usable_by_gpu(results: pd.DataFrame, sc: Scenario) -> dict[str, int]:
    got = results.groupby(C.GPU, sort=False)[C.USABLE].first()
    return {g.id: int(got[g.id]) for g in sc.gpus if g.id in got.index}


def has_sequence(sc: Scenario) -> bool:
    """False for layer-list nets and per-sample params models, whose grid holds the placeholder seq_len 1."""
    return sc.model.kind == "transformer" or tuple(sc.grid.get(C.SEQ_LEN, ())) != (1,)


def describe_point(sc: Scenario, point: dict[str, Any], with_batch: bool = False) -> str:
    """'Llama 3.1 8B training, seq 4,096, bf16-mixed adamw' (only the axes that say something)."""
    parts = [f"{sc.model.name} {'inference' if sc.mode == 'infer' else 'training'}"]
    if not has_sequence(sc):
        point = {k: v for k, v in point.items() if k != C.SEQ_LEN}
    if with_batch and C.BATCH in point:
        parts.append(f"batch {thousands(point[C.BATCH])}")
    if sc.mode == "infer":
        if point.get(C.SEQ_LEN) is not None:
            parts.append(f"prompt {thousands(point[C.SEQ_LEN])}")
        if point.get(C.DECODE_TOKENS):
            parts.append(f"{thousands(point[C.DECODE_TOKENS])} generated")
        if point.get(C.CACHE_TOKENS):
            parts.append(f"{thousands(point[C.CACHE_TOKENS])} cached")
        parts.append(str(point.get(C.PRECISION) or ""))
    else:
        if point.get(C.SEQ_LEN) is not None:
            parts.append(f"seq {thousands(point[C.SEQ_LEN])}")
        parts.append(f"{point.get(C.PRECISION) or ''} {point.get(C.OPTIMIZER) or ''}".strip())
        ck = point.get(C.CHECKPOINTING)
        if ck and ck != "none":
            parts.append(f"{ck} checkpointing")
    varying = set(varying_axes(sc))
    for axis in (C.ATTENTION, C.OPTIMIZER_IMPL):
        if axis in varying and axis in point:
            parts.append(f"{point[axis]} {AXIS_LABELS[axis]}")
    parts.append(layout_text(sc, point))
    return ", ".join(p for p in parts if p)


def layout_text(sc: Scenario, point: dict[str, Any], only: list[str] | None = None) -> str:
    """A parallel layout as the cluster section writes it: 'TP 8 + SP · PP 4 · 16 micro-batches · DP 8 · ZeRO 1 ·
    fp32 grads' ('' for a scenario without a `parallel:` block). TP, PP, DP and ZeRO always (inference: TP, PP and
    DP only), the other axes where they vary or differ from their default; `only`: just these axes."""
    if not sc.parallel:
        return ""
    varying = set(varying_axes(sc))
    core = (C.TENSOR_PARALLEL, C.PIPELINE_PARALLEL, C.DATA_PARALLEL) + ((C.ZERO_STAGE,) if sc.mode == "train" else ())
    # an axis the point leaves out (a chart whose bars vary it) is not written
    if only is not None:
        axes = [a for a in LAYOUT_ORDER if a in only and a in point]
    else:
        axes = [a for a in LAYOUT_ORDER if a in point and (a in core or (
            sc.mode == "train" and (a in varying or point[a] != C.PARALLEL_DEFAULTS[a])))]
    # a point without the bucket columns (a max-batch cell) reads them from the scenario: parallel.deepspeed sets
    # them for every layout
    deepspeed = any(point[a] if a in point else any(vs) for a, vs in axis_values(sc).items()
                    if a in (C.REDUCE_BUCKET, C.PREFETCH_BUCKET))
    parts: list[str] = []
    for axis in axes:
        value = point[axis]
        if axis == C.SEQUENCE_PARALLEL:
            if parts and parts[-1].startswith("TP "):  # Megatron's pairing: "TP 8 + SP"
                parts[-1] += " + SP" if value else ""
            else:
                parts.append("SP" if value else "no SP")
        elif axis == C.FP32_GRAD_ACCUMULATION:
            parts.append("fp32 grads" if value else "16-bit grads")
        elif axis == C.MICRO_BATCHES:
            parts.append(f"{thousands(value)} micro-batches")
        elif axis in (C.PIPELINE_SCHEDULE, C.OFFLOAD):
            parts.append(f"{AXIS_LABELS[axis]} {value}")
        elif axis == C.FSDP_VERSION:  # written where FSDP shards the layout (not ZeRO-0/1, not DeepSpeed's)
            if int(point.get(C.ZERO_STAGE, 0)) >= 2 and not deepspeed:
                parts.append(f"FSDP{int(value)}")
        elif axis == C.BACKWARD_PREFETCH:  # FSDP1's, where it shards the layout
            if int(point.get(C.ZERO_STAGE, 0)) >= 2 and not deepspeed and int(point.get(C.FSDP_VERSION, 2)) == 1:
                parts.append("no backward prefetch" if value == "none" else "BACKWARD_PRE")
        elif axis == C.ZERO_STAGE and int(value) >= 1 and deepspeed:
            parts.append(f"DeepSpeed ZeRO {axis_value(axis, value)}")  # parallel.deepspeed: its buffers counted
        else:
            parts.append(f"{AXIS_LABELS[axis]} {axis_value(axis, value)}")
    return " · ".join(parts)


def fixed_layout(sc: Scenario) -> str:
    """The parallel settings every layout shares that differ from the default ('SP on, 16 micro-batches, fp32
    grads on'): what a table of layouts does not show in its columns."""
    varying = set(varying_axes(sc))
    return ", ".join(f"{AXIS_LABELS[a]} {axis_value(a, vs[0])}" for a, vs in axis_values(sc).items()
                     if a in C.PARALLEL_AXES and a not in varying and vs[0] != C.PARALLEL_DEFAULTS[a])


def recipe(sc: Scenario, row: dict[str, Any]) -> str:
    """The varying axes of a row other than sequence length: 'bf16 sgd-momentum, full checkpointing'."""
    words, extras = [], []
    for axis in varying_axes(sc):
        v = row[axis]
        if axis == C.SEQ_LEN or axis in C.PARALLEL_AXES:
            continue
        if axis in (C.PRECISION, C.OPTIMIZER):
            words.append(str(v))
        elif axis == C.CHECKPOINTING:
            if v != "none":
                extras.append(f"{v} checkpointing")
        else:
            extras.append(f"{AXIS_LABELS[axis]} {axis_value(axis, v)}")
    if layout_axes(sc):
        extras.append(layout_text(sc, row))
    return ", ".join(([" ".join(words)] if words else []) + extras)
