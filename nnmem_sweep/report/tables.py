"""The max-batch tables (rows: the chosen axes, columns: GPUs smallest first, split where a page cannot hold them),
the heatmap's data, and the shade levels the tables, the heatmap and the serving section share."""
from __future__ import annotations

import math
from itertools import product
from typing import Any

import numpy as np
import pandas as pd

from .. import columns as C
from ..parallel.layout import deepspeed_layouts
from ..scenario import Scenario
from .format import AXIS_LABELS, DASH, axis_value, gib
from .points import axis_values, fixed_layout, gpu_order, layout_axes, layout_text, reference_point, varying_axes

TABLE_COLUMNS = 10  # axis + GPU columns an A4/Letter portrait table holds legibly; more GPUs split the table
HEATMAP_MAX_ROWS = 60


def table_rows_axes(sc: Scenario) -> list[str]:
    """The axes that form the rows of the max-batch tables: `report.table_rows`, else every varying axis (else seq
    len). Layouts are rows: when `table_rows` names no parallel axis, the varying ones follow the named axes (a table
    per layout would be dozens of tables of a few rows); once it names one, the others split tables like grid axes."""
    chosen = sc.report.get("table_rows")
    axes = axis_values(sc)
    if chosen:
        rows = [a for a in chosen if a in axes and a != C.GPU]
        if not any(a in C.PARALLEL_AXES for a in rows):
            rows += layout_axes(sc)
        return rows
    varying = [a for a in varying_axes(sc) if a not in C.PARALLEL_AXES] + layout_axes(sc)
    return varying or [C.SEQ_LEN]


def level(value: int, top: int) -> int:
    """Shade 0..5 for a max batch: 0 = does not fit, 1..5 on a log2 scale up to the largest value in the report."""
    if value <= 0:
        return 0
    if top <= 1:
        return 5
    return max(1, min(5, math.ceil(5 * math.log2(1 + value) / math.log2(1 + top))))


def level_legend(values: np.ndarray, top: int, host: bool = False) -> list[str]:
    """What each shade means in this report: the range of max batch values that got it ('' where none did), and
    HOST_LEVEL's where a cell has it (`host`)."""
    uniq = np.unique(values)
    levels = np.array([level(int(v), top) for v in uniq])
    out = ["does not fit"]
    for lv in range(1, 6):
        got = uniq[levels == lv]
        out.append("" if got.size == 0 else f"{got.min():,}" if got.min() == got.max() else f"{got.min():,}–{got.max():,}")
    return out + ["fits the GPU, not the node's host memory" if host else ""]


def _label(axis: str, value: Any, deepspeed: bool) -> str:
    """An axis's name in a heatmap row: a ZeRO stage of DeepSpeed's is 'DeepSpeed ZeRO', as the charts write it
    (points.layout_text)."""
    return "DeepSpeed ZeRO" if axis == C.ZERO_STAGE and deepspeed and int(value) >= 1 else AXIS_LABELS[axis]


def max_batch_tables(sc: Scenario, max_batch: pd.DataFrame,
                     point: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Tables of max batch (rows: the chosen axes; columns: GPUs, smallest first) and the heatmap data: the rows of
    the table at the reference point's values of the other varying axes (e.g. the reference sequence length)."""
    row_axes = table_rows_axes(sc)
    split_axes = [a for a in varying_axes(sc) if a not in row_axes]
    gpus = [g for g in gpu_order(sc) if g.id in set(max_batch[C.GPU])]
    top = int(max_batch[C.MAX_BATCH].max()) if len(max_batch) else 0
    lookup = {}
    key_cols = row_axes + split_axes + [C.GPU]
    for rec in max_batch[key_cols + [C.MAX_BATCH]].itertuples(index=False, name=None):
        lookup[_key(rec[:-1])] = int(rec[-1])
    short = _host_short(max_batch, key_cols)

    point = point if point is not None else reference_point(sc)
    axes = axis_values(sc)
    heat_key = tuple(point.get(a) for a in split_axes)
    # a table of layouts: the heatmap shows the layouts at the reference point's values of the other row axes
    heat_fixed = [i for i, a in enumerate(row_axes) if a not in C.PARALLEL_AXES] \
        if any(a in C.PARALLEL_AXES for a in row_axes) else []
    tables, heat_rows, heat_cells, total_rows = [], [], [], 0
    deepspeed = deepspeed_layouts(axes)
    for split_values in product(*(axes[a] for a in split_axes)):
        caption_bits = [f"{AXIS_LABELS[a]} {axis_value(a, v)}" for a, v in zip(split_axes, split_values)]
        rows = []
        for values in product(*(axes.get(a) or (None,) for a in row_axes)):
            cells = [lookup.get(tuple(values) + tuple(split_values) + (g.id,)) for g in gpus]
            if all(c is None for c in cells):
                continue
            first_fit = next((j for j, c in enumerate(cells) if c and c > 0), None)
            hosts = [tuple(values) + tuple(split_values) + (g.id,) in short for g in gpus]
            row = {"axes": [axis_value(a, v) for a, v in zip(row_axes, values)],
                   "cells": [{"text": (HOST_SHORT if h else DASH) if not c else f"{c:,}",
                              "level": HOST_LEVEL if h else level(c or 0, top), "edge": j == first_fit}
                             for j, (c, h) in enumerate(zip(cells, hosts))]}
            rows.append(row)
            if tuple(split_values) == heat_key and all(values[i] == point.get(row_axes[i]) for i in heat_fixed):
                total_rows += 1
                if len(heat_rows) < HEATMAP_MAX_ROWS:
                    heat_rows.append(" · ".join(
                        (f"{_label(a, v, deepspeed)} {text}" if a in C.PARALLEL_AXES else text)
                        for i, (a, v, text) in enumerate(zip(row_axes, values, row["axes"])) if i not in heat_fixed))
                    heat_cells.append([c["level"] for c in row["cells"]])
        per_table = max(3, TABLE_COLUMNS - len(row_axes))
        for start in range(0, len(gpus), per_table):
            chunk = gpus[start:start + per_table]
            part = ""
            if len(gpus) > per_table:
                part = f"GPUs {start + 1}–{start + len(chunk)} of {len(gpus)}"
            caption = ", ".join(b for b in caption_bits + [part] if b)
            tables.append({
                "caption": caption,
                "axis_headers": [AXIS_LABELS[a] for a in row_axes],
                "gpu_headers": [{"name": g.name, "memory": gib(g.memory_bytes)} for g in chunk],
                "rows": [{"axes": r["axes"], "cells": r["cells"][start:start + len(chunk)]} for r in rows],
            })
    heat = {"rows": heat_rows, "cols": [g.name for g in gpus], "cells": heat_cells,
            "legend": level_legend(max_batch[C.MAX_BATCH].to_numpy(), top, bool(short)),
            "truncated": total_rows > len(heat_rows),
            "about": ", ".join(f"{AXIS_LABELS[a]} {axis_value(a, point.get(a))}"
                               for a in split_axes + [row_axes[i] for i in heat_fixed])}
    return tables, heat


HOST_SHORT = "host"  # a cell that does not fit at batch 1 for want of the node's host memory alone
HOST_LEVEL = 6  # its shade (charts.LEVEL_FILL), apart from "does not fit" in the tables and the heatmap


def _host_short(max_batch: pd.DataFrame, key_cols: list[str]) -> set[tuple]:
    """The keys of the cells whose layout offloads more to the host than the node holds, while batch 1 fits the
    GPU: their max batch is 0 for the host's sake (parallel layouts' host_bytes against host_memory_bytes)."""
    if C.HOST not in max_batch.columns or C.HOST_MEMORY not in max_batch.columns:
        return set()
    over = max_batch[(max_batch[C.MAX_BATCH] == 0) & (max_batch[C.HOST] > max_batch[C.HOST_MEMORY])
                     & (max_batch[C.TOTAL_AT_BATCH_1] <= max_batch[C.USABLE])]
    return {_key(rec) for rec in over[key_cols].itertuples(index=False, name=None)}


def _key(values: tuple) -> tuple:
    """A table cell's key: its axis values, a missing one (NaN) as None."""
    return tuple(None if (isinstance(v, float) and math.isnan(v)) else v for v in values)


def layout_note(sc: Scenario) -> str:
    """What a table of parallel layouts shows ('' without a `parallel:` block)."""
    if not sc.parallel:
        return ""
    layouts = layout_axes(sc)
    fixed = fixed_layout(sc)
    if layouts:
        text = (f"Each row is one parallel layout ({', '.join(AXIS_LABELS[a] for a in layouts)} in its columns"
                f"{'; ' + fixed + ' in every one' if fixed else ''}).")
    else:
        text = f"Every cell has the one layout the scenario lists: {layout_text(sc, reference_point(sc))}."
    offload = any(v != "none" for v in axis_values(sc).get(C.OFFLOAD, ()))
    return (text + " Batch is the micro-batch of one data-parallel rank; memory is that of the most loaded GPU "
                   "(see Assumptions)." + (f" A cell reading '{HOST_SHORT}' fits the GPU at batch 1 but not the "
                                           "node's host memory, which its offloading ranks need more of than the "
                                           "node holds." if offload else ""))
