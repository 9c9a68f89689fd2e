"""Scenario -> the grid as a long DataFrame: one row per combination of the axes and GPU.

The size is computed from the axis lengths before anything is allocated; a grid over `max_rows` is refused with a
UsageError naming its size and the `--max-rows` override. The cartesian product is built with numpy (each axis
becomes a repeated/tiled code array), strings are categoricals, integers int64.
"""
from __future__ import annotations

from math import prod

import numpy as np
import pandas as pd

from . import columns as C
from .errors import UsageError
from .parallel.layout import DEFAULT_GPUS_PER_NODE, DEFAULT_HOST_MEMORY
from .scenario import Scenario
from .units import parse_size

INT_AXES = (C.BATCH, C.SEQ_LEN, C.CACHE_TOKENS, C.DECODE_TOKENS,
            C.TENSOR_PARALLEL, C.CONTEXT, C.CONCURRENCY,  # these three: serving plans (serving.py)
            C.DATA_PARALLEL, C.ZERO_STAGE, C.PIPELINE_PARALLEL, C.MICRO_BATCHES, C.VIRTUAL_STAGES,
            C.CONTEXT_PARALLEL, C.EXPERT_PARALLEL, C.GRADIENT_ACCUMULATION,  # parallel layouts (parallel/)
            C.REDUCE_BUCKET, C.PREFETCH_BUCKET, C.FSDP_VERSION)
BOOL_AXES = C.PARALLEL_BOOL_AXES
MAX_ROWS = 20_000_000  # default row limit of a run (--max-rows): a few GB of frames at most
CATEGORICAL_AXES = (C.PRECISION, C.OPTIMIZER, C.OPTIMIZER_IMPL, C.CHECKPOINTING, C.ATTENTION,
                    C.PIPELINE_SCHEDULE, C.OFFLOAD, C.ZERO_GRAD, C.GRADIENT_SYNC, C.BACKWARD_PREFETCH)


def _axis_values(sc: Scenario, axis: str) -> tuple:
    values = tuple(sc.grid.get(axis, ()))
    if not values:
        raise UsageError(f"scenario {sc.name!r}: grid axis {axis!r} has no values")
    return values


def axes_of(sc: Scenario) -> dict[str, tuple]:
    """Every axis the scenario's rows vary over, in column order: the grid axes, the optional axes the scenario's
    grid names (columns.OPTIONAL_AXES), then the parallel axes when the scenario has a `parallel:` block
    (columns.PARALLEL_AXES; none of them otherwise)."""
    axes = {a: _axis_values(sc, a) for a in C.GRID_AXES}
    axes.update({a: _axis_values(sc, a) for a in C.OPTIONAL_AXES if a in sc.grid})
    for a in C.PARALLEL_AXES if sc.parallel else ():
        axes[a] = tuple(sc.parallel.get(a) or (C.PARALLEL_DEFAULTS[a],))
    return axes


def point_axes(sc: Scenario) -> dict[str, tuple]:
    """axes_of without batch: what max_batch.csv has one row per (with GPU)."""
    return {a: v for a, v in axes_of(sc).items() if a != C.BATCH}


def add_gpu_columns(frame: pd.DataFrame, sc: Scenario) -> pd.DataFrame:
    """gpu_memory_bytes from the frame's gpu column, and with parallel axes the node's gpus_per_node and
    host_memory_bytes (in place; returns the frame)."""
    by_id = {g.id: g.memory_bytes for g in sc.gpus}
    mem = np.array([by_id[x] for x in frame[C.GPU].cat.categories], dtype=np.int64)
    frame[C.GPU_MEMORY] = mem[frame[C.GPU].cat.codes.to_numpy()]
    if sc.parallel:
        n = len(frame)
        frame[C.GPUS_PER_NODE] = np.full(n, sc.node.get(C.GPUS_PER_NODE, DEFAULT_GPUS_PER_NODE), dtype=np.int64)
        frame[C.HOST_MEMORY] = np.full(n, sc.node.get(C.HOST_MEMORY, parse_size(DEFAULT_HOST_MEMORY)),
                                       dtype=np.int64)
    return frame


def points_frame(sc: Scenario) -> pd.DataFrame:
    """One row per combination of the non-batch axes and GPU, with the GPU's columns: max_batch's points."""
    return add_gpu_columns(product_frame(point_axes(sc), tuple(g.id for g in sc.gpus)), sc)


def grid_size(sc: Scenario) -> int:
    """Rows the grid expands to: the product of the axis lengths times the number of GPUs."""
    return prod(len(v) for v in axes_of(sc).values()) * len(sc.gpus)


def checked_size(sc: Scenario, max_rows: int = MAX_ROWS) -> int:
    """grid_size, refused with a UsageError naming the size and the --max-rows override when over `max_rows`
    (checked before anything is allocated, by the in-memory and the streamed run alike)."""
    size = grid_size(sc)
    if size > max_rows:
        raise UsageError(f"scenario {sc.name!r} expands to {size:,} rows, over the limit of {max_rows:,}; "
                         f"narrow the grid or raise the limit with --max-rows {size}")
    return size


def product_frame(axes: dict[str, tuple], gpus: tuple[str, ...] | None = None) -> pd.DataFrame:
    """The cartesian product of `axes` (in order; the last varies fastest), then GPU (fastest of all)."""
    lengths = [len(v) for v in axes.values()]
    if gpus is not None:
        lengths.append(len(gpus))
    n = prod(lengths)
    data: dict[str, object] = {}
    repeat_inner = n
    for (name, values), length in zip(list(axes.items()) + ([(C.GPU, gpus)] if gpus is not None else []), lengths):
        repeat_inner //= length
        codes = np.arange(length, dtype=np.int32 if length > 127 else np.int8)
        codes = np.tile(np.repeat(codes, repeat_inner), n // (length * repeat_inner))
        if name in INT_AXES:
            data[name] = np.asarray(values, dtype=np.int64)[codes]
        elif name in BOOL_AXES:
            data[name] = np.asarray(values, dtype=bool)[codes]
        else:
            cats = list(dict.fromkeys(str(v) for v in values))
            if len(cats) != len(values):  # duplicates in the axis: map each value to its category
                lookup = np.array([cats.index(str(v)) for v in values], dtype=codes.dtype)
                codes = lookup[codes]
            data[name] = pd.Categorical.from_codes(codes, categories=cats)
    return pd.DataFrame(data, copy=False)


def expand_grid(sc: Scenario, max_rows: int = MAX_ROWS) -> pd.DataFrame:
    """One row per grid point and GPU, with the grid axes (and the parallel axes, when the scenario has them), `gpu`
    and `gpu_memory_bytes` (and then `gpus_per_node`, `host_memory_bytes`)."""
    checked_size(sc, max_rows)
    frame = product_frame(axes_of(sc), tuple(g.id for g in sc.gpus))
    return add_gpu_columns(frame, sc)
