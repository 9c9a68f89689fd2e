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
from .scenario import Scenario

INT_AXES = (C.BATCH, C.SEQ_LEN, C.CACHE_TOKENS, C.DECODE_TOKENS,
            C.TENSOR_PARALLEL, C.CONTEXT, C.CONCURRENCY)  # the last three: serving plans (serving.py)
CATEGORICAL_AXES = (C.PRECISION, C.OPTIMIZER, C.OPTIMIZER_IMPL, C.CHECKPOINTING, C.ATTENTION)


def _axis_values(sc: Scenario, axis: str) -> tuple:
    values = tuple(sc.grid.get(axis, ()))
    if not values:
        raise UsageError(f"scenario {sc.name!r}: grid axis {axis!r} has no values")
    return values


def grid_size(sc: Scenario) -> int:
    """Rows the grid expands to: the product of the axis lengths times the number of GPUs."""
    return prod(len(_axis_values(sc, a)) for a in C.GRID_AXES) * len(sc.gpus)


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
        else:
            cats = list(dict.fromkeys(str(v) for v in values))
            if len(cats) != len(values):  # duplicates in the axis: map each value to its category
                lookup = np.array([cats.index(str(v)) for v in values], dtype=codes.dtype)
                codes = lookup[codes]
            data[name] = pd.Categorical.from_codes(codes, categories=cats)
    return pd.DataFrame(data, copy=False)


def expand_grid(sc: Scenario, max_rows: int = 20_000_000) -> pd.DataFrame:
    """One row per grid point and GPU, with the grid axes, `gpu` and `gpu_memory_bytes`."""
    size = grid_size(sc)
    if size > max_rows:
        raise UsageError(f"scenario {sc.name!r} expands to {size:,} rows, over the limit of {max_rows:,}; "
                         f"narrow the grid or raise the limit with --max-rows {size}")
    axes = {a: _axis_values(sc, a) for a in C.GRID_AXES}
    gpu_ids = tuple(g.id for g in sc.gpus)
    frame = product_frame(axes, gpu_ids)
    by_id = {g.id: g.memory_bytes for g in sc.gpus}
    mem = np.array([by_id[x] for x in frame[C.GPU].cat.categories], dtype=np.int64)
    frame[C.GPU_MEMORY] = mem[frame[C.GPU].cat.codes.to_numpy()]
    return frame
