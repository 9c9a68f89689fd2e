"""DataFrames -> the report's context: plain dicts of formatted strings, booleans and lists of row dicts.

All arithmetic, unit conversion, selection and sorting of the report happens here; templates only lay it out.
"""
from __future__ import annotations

import math
from itertools import product
from typing import Any

import numpy as np
import pandas as pd

from .. import columns as C
from ..scenario import Scenario
from . import charts
from .format import (AXIS_LABELS, COMPONENT_LABELS, DASH, article, axis_value, gib, gib_number, percent,
                     signed_percent, thousands)
from .provenance import Provenance

TABLE_COLUMNS = 10  # axis + GPU columns an A4/Letter portrait table holds legibly; more GPUs split the table
HEATMAP_MAX_ROWS = 60
BREAKDOWN_MAX_BARS = 16
LINE_MAX_SERIES = 6
# the order a layout is written in: the model split first (TP with SP, PP with its micro-batches), then the data split
_LAYOUT_ORDER = (C.TENSOR_PARALLEL, C.SEQUENCE_PARALLEL, C.PIPELINE_PARALLEL, C.MICRO_BATCHES, C.PIPELINE_SCHEDULE,
                 C.VIRTUAL_STAGES, C.CONTEXT_PARALLEL, C.EXPERT_PARALLEL, C.DATA_PARALLEL, C.ZERO_STAGE, C.OFFLOAD,
                 C.GRADIENT_ACCUMULATION, C.FP32_GRAD_ACCUMULATION)


# ---------------------------------------------------------------------------------------------------- selection
def axis_values(sc: Scenario) -> dict[str, tuple]:
    """Every non-batch axis and its values, in the contract's order: the grid's, then, when the scenario has a
    `parallel:` block, the parallel axes (columns.PARALLEL_DEFAULTS for those it does not name), as grid.axes_of
    expands them."""
    axes = {a: tuple(sc.grid.get(a, ())) for a in C.NON_BATCH_AXES}
    for a in C.PARALLEL_AXES if sc.parallel else ():
        axes[a] = tuple(sc.parallel.get(a) or (C.PARALLEL_DEFAULTS[a],))
    return axes


def _varying(sc: Scenario) -> list[str]:
    """Non-batch axes with more than one value (parallel ones included), in the contract's order."""
    return [a for a, values in axis_values(sc).items() if len(values) > 1]


def _layout_axes(sc: Scenario) -> list[str]:
    """The parallel axes that vary, in the order a layout is written (_LAYOUT_ORDER: TP, PP, ..., DP, ZeRO): each
    combination of them is a layout the tables give a row."""
    varying = set(_varying(sc))
    return [a for a in _LAYOUT_ORDER if a in varying]


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


def _mask(df: pd.DataFrame, point: dict[str, Any]) -> np.ndarray:
    m = np.ones(len(df), dtype=bool)
    for axis, value in point.items():
        if axis not in df.columns:
            continue
        col = df[axis]
        m &= col.isna().to_numpy() if value is None else (col == value).to_numpy()
    return m


def _select(df: pd.DataFrame, point: dict[str, Any]) -> pd.DataFrame:
    return df[_mask(df, point)]


def _gpu_order(sc: Scenario) -> list:
    """GPUs smallest memory first (ties: the scenario's order)."""
    return sorted(sc.gpus, key=lambda g: g.memory_bytes)


def _usable(results: pd.DataFrame, sc: Scenario) -> dict[str, int]:
    got = results.groupby(C.GPU, sort=False)[C.USABLE].first()
    return {g.id: int(got[g.id]) for g in sc.gpus if g.id in got.index}


# ---------------------------------------------------------------------------------------------------- summary
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
    varying = set(_varying(sc))
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
    varying = set(_varying(sc))
    core = (C.TENSOR_PARALLEL, C.PIPELINE_PARALLEL, C.DATA_PARALLEL) + ((C.ZERO_STAGE,) if sc.mode == "train" else ())
    # an axis the point leaves out (a chart whose bars vary it) is not written
    if only is not None:
        axes = [a for a in _LAYOUT_ORDER if a in only and a in point]
    else:
        axes = [a for a in _LAYOUT_ORDER if a in point and (a in core or (
            sc.mode == "train" and (a in varying or point[a] != C.PARALLEL_DEFAULTS[a])))]
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
        else:
            parts.append(f"{AXIS_LABELS[axis]} {axis_value(axis, value)}")
    return " · ".join(parts)


def _fixed_layout(sc: Scenario) -> str:
    """The parallel settings every layout shares that differ from the default ('SP on, 16 micro-batches, fp32
    grads on'): what a table of layouts does not show in its columns."""
    varying = set(_varying(sc))
    return ", ".join(f"{AXIS_LABELS[a]} {axis_value(a, vs[0])}" for a, vs in axis_values(sc).items()
                     if a in C.PARALLEL_AXES and a not in varying and vs[0] != C.PARALLEL_DEFAULTS[a])


def _recipe(sc: Scenario, row: dict[str, Any]) -> str:
    """The varying axes of a row other than sequence length: 'bf16 sgd-momentum, full checkpointing'."""
    words, extras = [], []
    for axis in _varying(sc):
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
    if _layout_axes(sc):
        extras.append(layout_text(sc, row))
    return ", ".join(([" ".join(words)] if words else []) + extras)


def _target(sc: Scenario, max_batch: pd.DataFrame, point: dict[str, Any]) -> dict[str, Any]:
    """Which GPUs meet the target (batch, seq_len): with the reference recipe, and failing that with any recipe."""
    want = int(sc.target.get(C.BATCH, 1))
    at = {**{k: v for k, v in point.items() if k != C.BATCH},
          **{k: v for k, v in sc.target.items() if k in C.NON_BATCH_AXES}}
    what = describe_point(sc, {**at, C.BATCH: want}, with_batch=True)
    missing = [k for k, v in sc.target.items() if k in C.NON_BATCH_AXES and v not in sc.grid.get(k, ())]
    if missing:
        text = (f"Target ({what}): {', '.join(f'{AXIS_LABELS[k]} {axis_value(k, sc.target[k])}' for k in missing)} "
                f"is not in the grid, so this report cannot say which GPUs meet it.")
        return {"text": text, "met": False, "gpus": [], "others": ""}
    ref = _select(max_batch, at)
    meeting = [g.name for g in _gpu_order(sc) if not ref[(ref[C.GPU] == g.id) & (ref[C.MAX_BATCH] >= want)].empty]
    if meeting:
        text = f"Target ({what}) is met by: {', '.join(meeting)} (smallest first)."
    else:
        text = f"Target ({what}) is met by none of the GPUs with this recipe{' and layout' if sc.parallel else ''}."
    # any recipe in the grid at the target's sequence length: for each GPU the one with the most room (largest max
    # batch; a stable sort keeps the grid's order among equals)
    fixed = {k: v for k, v in sc.target.items() if k in C.NON_BATCH_AXES}
    ok = _select(max_batch, fixed)
    ok = ok[ok[C.MAX_BATCH] >= want].sort_values(C.MAX_BATCH, ascending=False, kind="stable")
    others = [f"{g.name} ({_recipe(sc, ok[ok[C.GPU] == g.id].iloc[0].to_dict())})" for g in _gpu_order(sc)
              if g.name not in meeting and (ok[C.GPU] == g.id).any()]
    other_text = ""
    if others and any(a not in fixed for a in _varying(sc)):
        other = "another recipe or layout" if _layout_axes(sc) else "another recipe"
        other_text = f"With {other} from the grid (the one with the most room): {'; '.join(others)}."
    return {"text": text, "met": bool(meeting), "gpus": meeting, "others": other_text}


def _best_layout(sc: Scenario, max_batch: pd.DataFrame, at: dict[str, Any], gpu: Any, ref_mb: int,
                 usable: int) -> dict[str, Any] | None:
    """When the scenario lists several layouts: the one with the most room on `gpu` at the reference recipe (the
    largest max batch; among equals the fewest GPUs, then no pipeline, the smallest TP, the lowest ZeRO stage), as a
    summary sentence, if it fits more than the
    reference layout's `ref_mb`; or, when no layout fits, the one that comes closest."""
    layouts = _layout_axes(sc)
    if not layouts:
        return None
    n = math.prod(len(axis_values(sc)[a]) for a in layouts)
    pool = _select(max_batch, {k: v for k, v in at.items() if k not in C.PARALLEL_AXES})
    pool = pool[pool[C.GPU] == gpu.id]
    if pool.empty:
        return None
    # among equal max batches the fewest GPUs (DP x TP x PP x CP), then the cluster search's rule (cluster.py):
    # no pipeline, the smallest TP, the lowest ZeRO stage; then the order the scenario lists them in
    col = (lambda a: pool[a].to_numpy(dtype=np.int64))
    gpus = col(C.DATA_PARALLEL) * col(C.TENSOR_PARALLEL) * col(C.PIPELINE_PARALLEL) * col(C.CONTEXT_PARALLEL)
    order = np.lexsort((col(C.ZERO_STAGE), col(C.TENSOR_PARALLEL), col(C.PIPELINE_PARALLEL), gpus,
                        -col(C.MAX_BATCH)))
    r = pool.iloc[order[0]]
    mb = int(r[C.MAX_BATCH])
    layout = f"{layout_text(sc, r.to_dict())} ({int(gpus[order[0]]):,} GPUs)"
    if mb > ref_mb:
        text = (f"Of the {n:,} layouts, the most room on {article(gpu.name)} {gpu.name}: batch {mb:,} with {layout}, "
                f"{gib_number(r[C.TOTAL_AT_MAX_BATCH])} of {gib(usable)} usable.")
    elif mb == 0:
        text = (f"None of the {n:,} layouts fits {article(gpu.name)} {gpu.name} at batch 1; the closest, {layout}, "
                f"needs {gib(r[C.TOTAL_AT_BATCH_1])}.")
    else:
        return None
    return {"text": text, "fits": mb > 0, "gpu": gpu.name, "max_batch": str(mb),
            "total": gib(r[C.TOTAL_AT_MAX_BATCH] if mb > 0 else r[C.TOTAL_AT_BATCH_1])}


def summary(sc: Scenario, results: pd.DataFrame, max_batch: pd.DataFrame) -> dict[str, Any]:
    point = reference_point(sc)
    non_batch = {k: v for k, v in point.items() if k != C.BATCH}
    ref = _select(max_batch, non_batch)
    usable = _usable(results, sc)
    prefix = describe_point(sc, point)
    sentences = []
    for g in _gpu_order(sc):
        row = ref[ref[C.GPU] == g.id]
        if row.empty or g.id not in usable:
            continue
        r = row.iloc[0]
        mb = int(r[C.MAX_BATCH])
        if mb > 0:
            text = (f"{prefix}: fits {article(g.name)} {g.name} up to batch {mb:,} "
                    f"({gib_number(r[C.TOTAL_AT_MAX_BATCH])} of {gib(usable[g.id])} usable).")
        else:
            text = (f"{prefix}: does not fit {article(g.name)} {g.name} even at batch 1 "
                    f"(needs {gib(r[C.TOTAL_AT_BATCH_1])}, {gib(usable[g.id])} usable).")
        sentences.append({"text": text, "fits": mb > 0, "gpu": g.name, "max_batch": str(mb),
                          "total": gib(r[C.TOTAL_AT_MAX_BATCH] if mb > 0 else r[C.TOTAL_AT_BATCH_1])})
        best = _best_layout(sc, max_batch, non_batch, g, mb, usable[g.id])
        if best:
            sentences.append(best)
    target = _target(sc, max_batch, point) if sc.target else None
    headroom = f"Usable memory is the GPU's reported capacity less {percent(sc.headroom)} headroom."
    return {"sentences": sentences, "target": target, "reference": prefix, "headroom_note": headroom}


# ---------------------------------------------------------------------------------------------------- tables
def table_rows_axes(sc: Scenario) -> list[str]:
    """The axes that form the rows of the max-batch tables: `report.table_rows`, else every varying axis (else seq
    len). Layouts are rows: when `table_rows` names no parallel axis, the varying ones follow the named axes (a table
    per layout would be dozens of tables of a few rows); once it names one, the others split tables like grid axes."""
    chosen = sc.report.get("table_rows")
    axes = axis_values(sc)
    if chosen:
        rows = [a for a in chosen if a in axes and a != C.GPU]
        if not any(a in C.PARALLEL_AXES for a in rows):
            rows += _layout_axes(sc)
        return rows
    varying = [a for a in _varying(sc) if a not in C.PARALLEL_AXES] + _layout_axes(sc)
    return varying or [C.SEQ_LEN]


def level(value: int, top: int) -> int:
    """Shade 0..5 for a max batch: 0 = does not fit, 1..5 on a log2 scale up to the largest value in the report."""
    if value <= 0:
        return 0
    if top <= 1:
        return 5
    return max(1, min(5, math.ceil(5 * math.log2(1 + value) / math.log2(1 + top))))


def level_legend(values: np.ndarray, top: int) -> list[str]:
    """What each shade means in this report: the range of max batch values that got it ('' where none did)."""
    uniq = np.unique(values)
    levels = np.array([level(int(v), top) for v in uniq])
    out = ["does not fit"]
    for lv in range(1, 6):
        got = uniq[levels == lv]
        out.append("" if got.size == 0 else f"{got.min():,}" if got.min() == got.max() else f"{got.min():,}–{got.max():,}")
    return out


def max_batch_tables(sc: Scenario, max_batch: pd.DataFrame,
                     point: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Tables of max batch (rows: the chosen axes; columns: GPUs, smallest first) and the heatmap data: the rows of
    the table at the reference point's values of the other varying axes (e.g. the reference sequence length)."""
    row_axes = table_rows_axes(sc)
    split_axes = [a for a in _varying(sc) if a not in row_axes]
    gpus = [g for g in _gpu_order(sc) if g.id in set(max_batch[C.GPU])]
    top = int(max_batch[C.MAX_BATCH].max()) if len(max_batch) else 0
    lookup = {}
    key_cols = row_axes + split_axes + [C.GPU]
    for rec in max_batch[key_cols + [C.MAX_BATCH]].itertuples(index=False, name=None):
        lookup[tuple(None if (isinstance(v, float) and math.isnan(v)) else v for v in rec[:-1])] = int(rec[-1])

    point = point if point is not None else reference_point(sc)
    axes = axis_values(sc)
    heat_key = tuple(point.get(a) for a in split_axes)
    # a table of layouts: the heatmap shows the layouts at the reference point's values of the other row axes
    heat_fixed = [i for i, a in enumerate(row_axes) if a not in C.PARALLEL_AXES] \
        if any(a in C.PARALLEL_AXES for a in row_axes) else []
    tables, heat_rows, heat_cells, total_rows = [], [], [], 0
    for split_values in product(*(axes[a] for a in split_axes)):
        caption_bits = [f"{AXIS_LABELS[a]} {axis_value(a, v)}" for a, v in zip(split_axes, split_values)]
        rows = []
        for values in product(*(axes.get(a) or (None,) for a in row_axes)):
            cells = [lookup.get(tuple(values) + tuple(split_values) + (g.id,)) for g in gpus]
            if all(c is None for c in cells):
                continue
            first_fit = next((j for j, c in enumerate(cells) if c and c > 0), None)
            row = {"axes": [axis_value(a, v) for a, v in zip(row_axes, values)],
                   "cells": [{"text": DASH if not c else f"{c:,}", "level": level(c or 0, top),
                              "edge": j == first_fit} for j, c in enumerate(cells)]}
            rows.append(row)
            if tuple(split_values) == heat_key and all(values[i] == point.get(row_axes[i]) for i in heat_fixed):
                total_rows += 1
                if len(heat_rows) < HEATMAP_MAX_ROWS:
                    heat_rows.append(" · ".join(
                        (f"{AXIS_LABELS[a]} {text}" if a in C.PARALLEL_AXES else text)
                        for i, (a, text) in enumerate(zip(row_axes, row["axes"])) if i not in heat_fixed))
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
            "legend": level_legend(max_batch[C.MAX_BATCH].to_numpy(), top),
            "truncated": total_rows > len(heat_rows),
            "about": ", ".join(f"{AXIS_LABELS[a]} {axis_value(a, point.get(a))}"
                               for a in split_axes + [row_axes[i] for i in heat_fixed])}
    return tables, heat


def layout_note(sc: Scenario) -> str:
    """What a table of parallel layouts shows ('' without a `parallel:` block)."""
    if not sc.parallel:
        return ""
    layouts = _layout_axes(sc)
    fixed = _fixed_layout(sc)
    if layouts:
        text = (f"Each row is one parallel layout ({', '.join(AXIS_LABELS[a] for a in layouts)} in its columns"
                f"{'; ' + fixed + ' in every one' if fixed else ''}).")
    else:
        text = f"Every cell has the one layout the scenario lists: {layout_text(sc, reference_point(sc))}."
    return (text + " Batch is the micro-batch of one data-parallel rank; memory is that of the most loaded GPU "
                   "(see Assumptions).")


# ---------------------------------------------------------------------------------------------------- charts
def _bar_points(sc: Scenario, point: dict[str, Any]) -> tuple[list[tuple[dict[str, Any], str]], set[str]]:
    """The points drawn as stacked bars: `report.reference_points`, else precision x optimizer (or another varying
    recipe axis, or batch) around the reference point."""
    chosen = sc.report.get("reference_points")
    if chosen:
        return [({**point, **p}, " · ".join(f"{AXIS_LABELS[k]} {axis_value(k, v)}" if k in (C.BATCH, C.SEQ_LEN)
                                           else str(v) for k, v in p.items())) for p in chosen], \
            {k for p in chosen for k in p}
    varying = _varying(sc)
    layouts = _layout_axes(sc)
    if layouts and not any(a in varying for a in (C.PRECISION, C.OPTIMIZER)):
        # the reference layout, then each parallel axis changed on its own: what each knob does to each component
        bars = [point] + [{**point, a: v} for a in layouts for v in axis_values(sc)[a] if v != point.get(a)]
        return [(p, layout_text(sc, p, only=layouts)) for p in bars[:BREAKDOWN_MAX_BARS]], set(layouts)
    bar_axes = [a for a in (C.PRECISION, C.OPTIMIZER) if a in varying] or \
        [a for a in (C.CHECKPOINTING, C.ATTENTION, C.OPTIMIZER_IMPL, C.DECODE_TOKENS) if a in varying][:1]
    if bar_axes:
        combos = list(product(*(sc.grid[a] for a in bar_axes)))[:BREAKDOWN_MAX_BARS]
        return [({**point, **dict(zip(bar_axes, c))}, " · ".join(str(v) for v in c)) for c in combos], set(bar_axes)
    batches = sorted(sc.grid.get(C.BATCH, ()))[:BREAKDOWN_MAX_BARS]
    return [({**point, C.BATCH: b}, f"batch {b:,}") for b in batches], {C.BATCH}


def _breakdown_chart(sc: Scenario, results: pd.DataFrame, point: dict[str, Any],
                     usable: dict[str, int]) -> tuple[str, str]:
    gpu0 = _gpu_order(sc)[0].id
    base = results[results[C.GPU] == gpu0]
    batches = tuple(sc.grid.get(C.BATCH, ()))
    at = dict(point)
    if at.get(C.BATCH) not in batches:
        at[C.BATCH] = batches[0]
    segs = list(C.COMPONENTS) + [C.OVERHEAD]
    bars = []
    points, varied = _bar_points(sc, at)
    for pt, label in points:
        rows = _select(base, pt)
        if not rows.empty:
            bars.append((label, [int(v) for v in rows.iloc[0][segs]]))
    # colours stay tied to the component; components that are zero in every bar get no legend entry
    names = [COMPONENT_LABELS[s] if any(b[1][j] > 0 for b in bars) else "" for j, s in enumerate(segs)]
    caps = [(f"{g.name} {gib(usable[g.id])}", usable[g.id]) for g in _gpu_order(sc) if g.id in usable]
    about = describe_point(sc, {k: v for k, v in at.items() if k not in varied}, with_batch=C.BATCH not in varied)
    return charts.stacked_bars("Memory at the peak, by component", bars, names, caps), about


def _memory_vs_batch_chart(sc: Scenario, results: pd.DataFrame, point: dict[str, Any], usable: dict[str, int]) -> tuple[str, str]:
    gpu0 = _gpu_order(sc)[0].id
    line_axis = C.SEQ_LEN
    fixed = {k: v for k, v in point.items() if k not in (C.BATCH, line_axis)}
    sub = _select(results[results[C.GPU] == gpu0], fixed)
    xs = sorted({int(b) for b in sc.grid.get(C.BATCH, ())})
    series = []
    for v in list(sc.grid.get(line_axis, ()))[:LINE_MAX_SERIES]:
        s = sub[sub[line_axis] == v].drop_duplicates(C.BATCH).set_index(C.BATCH)[C.TOTAL]
        label = f"{'prompt' if sc.mode == 'infer' else 'seq len'} {axis_value(line_axis, v)}"
        series.append((label if has_sequence(sc) else "total memory",
                       [int(s[b]) if b in s.index else None for b in xs]))
    caps = [(g.name, usable[g.id]) for g in _gpu_order(sc) if g.id in usable]
    svg = charts.line_chart("Total memory against batch", xs, series, caps, "batch")
    return svg, describe_point(sc, fixed)


# ---------------------------------------------------------------------------------------------------- assumptions
def _bytes_or_dash(value: Any) -> str:
    return DASH if not value else f"{value} B"


def _precision_entry(p: Any) -> dict[str, str]:
    """A precisions.Precision as the report shows it: bytes per element of each kind of tensor, and its `stores`."""
    g = (lambda k: getattr(p, k, None))
    per = [f"weights {_bytes_or_dash(g('weight_bytes'))}", f"grads {_bytes_or_dash(g('grad_bytes'))}",
           f"master {_bytes_or_dash(g('master_bytes'))}", f"optimizer state {_bytes_or_dash(g('state_bytes'))}",
           f"activations {_bytes_or_dash(g('act_bytes'))}"]
    if g("quant_bits"):
        per.append(f"quantised weights {g('quant_bits')} bits ({g('quant')})")
    return {"id": str(g("name")), "stores": str(g("stores") or ""), "detail": ", ".join(per)}


_LAYOUTS = {"full": "one tensor of Ψ elements each, in the parameter's dtype",
            "factored": "a row and a column vector per matrix (factored second moment)",
            "8bit": "uint8 per element plus an fp32 absmax per 2,048-element block"}


def _optimizer_entry(o: Any) -> dict[str, str]:
    """An optimizers.Optimizer: its state tensors, their layout and the temporaries of one step()."""
    g = (lambda k: getattr(o, k, None))
    state = ", ".join(g("state") or ()) or "no state"
    layout = _LAYOUTS.get(str(g("layout")), str(g("layout") or ""))
    stores = f"{state} ({layout})" if g("state") else state
    temps = [f"foreach: {g('foreach_temps') or 0}·Ψ", f"for-loop: {g('forloop_temps') or 0}× the largest tensor"]
    note = str(g("note") or "")
    return {"id": str(g("name")), "stores": f"{g('implementation') or ''}: {stores}".lstrip(": "),
            "detail": "step() temporaries " + ", ".join(temps) + (f". {note}" if note else "")}


def _catalog(module_name: str, ids: list[str]) -> list[dict[str, str]]:
    """Entries of catalog/precisions.py or catalog/optimizers.py for the ids the scenario uses ([] when one of them
    is not in the catalog, e.g. inference's optimizer "none")."""
    from ..catalog import optimizers, precisions

    table = precisions.PRECISIONS if module_name == "precisions" else optimizers.OPTIMIZERS
    if not all(i in table for i in ids):
        return []
    entry = _precision_entry if module_name == "precisions" else _optimizer_entry
    return [entry(table[i]) for i in ids]


def _with_coverage(entries: list[dict[str, Any]], measured: set[str] | None) -> list[dict[str, Any]]:
    """Mark each recipe entry with whether a committed measured case exercises it ("" when nothing is known)."""
    return [e | {"measured": "" if measured is None else ("yes" if e["id"] in measured else "not yet")}
            for e in entries]


def _stated(name: str) -> str:
    """An assumption registered as data beside the code it qualifies (a citations.formula named '*.assumptions.*',
    e.g. parallel/states.py's communication buffers): its statement, where it comes from, its note and sources."""
    from ..citations import FORMULAS

    f = FORMULAS.get(name)
    if f is None:
        return ""
    text = f.expression + (f" ({f.where})." if f.where else ".")
    if f.note:
        text += f" {f.note}" + ("" if f.note.endswith(".") else ".")
    if f.sources:
        text += " Sources: " + "; ".join(f"{src.title}, {src.ref}" for src in f.sources) + "."
    return text


def _parallel_assumptions(sc: Scenario) -> list[str]:
    from ..parallel import states  # noqa: F401  (registers the stated assumptions)
    from ..parallel.layout import DEFAULT_GPUS_PER_NODE, DEFAULT_HOST_MEMORY
    from ..units import parse_size

    axes = axis_values(sc)
    items = ["Every figure is per GPU, on the most loaded rank (the first or the last pipeline stage, whichever holds "
             "more); batch is the micro-batch of one data-parallel rank. Only memory is modelled: a layout that fits "
             "may still be slow (communication, pipeline bubbles)."]
    if sc.mode == "train":
        items += [
            "Parameters per rank (Megatron-LM): attention and MLP matrices and the vocabulary-parallel embedding and "
            "head are split over TP, norms and row-parallel biases are replicated; a pipeline stage holds ⌈L/PP⌉ "
            "layers, the first stage the embedding, the last the final norm and the head.",
            "ZeRO partitions over DP (Rajbhandari et al. 2019 §5): stage 1 the master weights and optimizer state, "
            "stage 2 the gradients too, stage 3 the weights too, ⌈n/DP⌉ on every rank; ZeRO-3 adds two gathered "
            "copies of the largest unit (a transformer block, the embedding or the head: the one in use and the "
            "prefetched one).",
            "Activations per rank (Korthikanti et al. 2022): TP splits the attention and MLP inner tensors, SP the "
            "rest of each layer's tensors too, CP the sequence; the first stage of a 1F1B pipeline keeps "
            "min(PP, micro-batches) micro-batches in flight."]
        if any(axes[C.FP32_GRAD_ACCUMULATION]):
            items.append("fp32 grads: Megatron-style fp32 main gradients replace the 16-bit ones (4 bytes per "
                         "parameter, 18 per parameter with bf16-master and Adam).")
        if any(v != "none" for v in axes[C.OFFLOAD]):
            per_node = sc.node.get(C.GPUS_PER_NODE, DEFAULT_GPUS_PER_NODE)
            host = sc.node.get(C.HOST_MEMORY, parse_size(DEFAULT_HOST_MEMORY))
            items.append(f"Offload (ZeRO-Offload): the rank's fp32 master weights, optimizer state and fp32 gradient "
                         f"partition (with optimizer+params the 16-bit weights too) live in host memory and the CPU "
                         f"runs the step in place; host memory per node is the rank's times {per_node} GPUs per node, "
                         f"against {gib(host)} of RAM, and a layout over it does not fit. The CPU step's speed is "
                         f"not modelled.")
    else:
        items.append("Inference over TP and PP: each rank runs a smaller model (heads/TP, KV heads/TP, the MLP and "
                     "vocabulary split over TP, ⌈L/PP⌉ layers), so its weights, KV cache and prefill transients are "
                     "those of that model; DP replicas hold the same bytes.")
    stated = _stated("parallel.assumptions.communication_buffers")
    if stated:
        items.append(f"Communication buffers, {stated}")
    return items


def _finetune_assumptions(sc: Scenario) -> list[str]:
    ft = getattr(sc.model, "finetune", None)
    if ft is None or not ft.adapters:
        return []
    from ..components import finetune as F

    name = "QLoRA" if ft.method == "qlora" else "LoRA"
    targets = ", ".join(t.name for t in F.targets_of(sc.model, ft))
    dtype = ("fp32 (peft casts the adapters of a 16-bit model to fp32: autocast_adapter_dtype=True)"
             if ft.adapter_dtype == "fp32" else "the model's dtype (autocast_adapter_dtype=False)")
    items = [
        f"{name} (Hu et al. 2021): the base weights are frozen, so they have no gradients, master copy or optimizer "
        f"state; the optimizer is given the adapters only.",
        f"Adapters A (rank × in) and B (out × rank), without bias, on {targets} of every layer, in {dtype}.",
        "Activations of the frozen base are still stored where the backward pass to the adapters needs them: a "
        "frozen linear saves no input of its own, a frozen RMSNorm keeps its fp32 input, and nothing before the "
        "first adapter is saved. LoRA figures are checked against peft runs measured with PyTorch's MemTracker."]
    if ft.method == "qlora":
        items.append("QLoRA (Dettmers et al. 2023): the block linears are stored in NF4 with double-quantised block "
                     "scales, the other parameters in fp32 as prepare_model_for_kbit_training leaves them. Modelled "
                     "from the published format and the libraries' source, not measured: bitsandbytes' 4-bit "
                     "kernels need a CUDA device.")
    return items


def _cluster_assumptions(sc: Scenario) -> list[str]:
    search = sc.cluster
    if search is None:
        return []
    return [
        "Cluster options keep, for each GPU type and GPU count, one layout that fits, by a stated rule: the least "
        "recomputation, then no pipeline, the smallest TP, the lowest ZeRO stage, the largest micro-batch. The rule "
        "stands in for speed, which is not modelled.",
        f"The search keeps TP within a node ({search.gpus_per_node} GPUs), turns sequence parallelism on whenever "
        f"TP > 1 and splits the global batch as micro-batch × DP × accumulation steps (the pipeline's micro-batches "
        f"when PP > 1); the recipe is the grid's first values.",
        "Costs are the price of the GPUs (or per hour) as given in the scenario, not the cost per token trained."]


def assumptions(sc: Scenario, validation_table: Any = None) -> dict[str, Any]:
    o = sc.overheads
    cov = None
    if validation_table is not None:
        from ..accuracy import covered

        cov = {axis: covered(validation_table, axis) for axis in (C.PRECISION, C.OPTIMIZER)}
    return {
        "precisions": _with_coverage(
            _catalog("precisions", [str(v) for v in sc.grid.get(C.PRECISION, ()) if v is not None]),
            cov and cov[C.PRECISION]),
        "optimizers": _with_coverage(
            _catalog("optimizers", [str(v) for v in sc.grid.get(C.OPTIMIZER, ()) if v is not None]),
            cov and cov[C.OPTIMIZER]),
        "coverage_known": cov is not None,
        "attention": ", ".join(str(v) for v in sc.grid.get(C.ATTENTION, ())),
        "checkpointing": ", ".join(str(v) for v in sc.grid.get(C.CHECKPOINTING, ())),
        "optimizer_impl": ", ".join(str(v) for v in sc.grid.get(C.OPTIMIZER_IMPL, ())),
        "cuda_context": gib(o.cuda_context_bytes, 2),
        "cublas_workspace": f"{o.cublas_workspace_bytes:,} bytes",
        "allocator_reserve": percent(o.allocator_reserve_fraction),
        "headroom": percent(sc.headroom),
        "gpus": [{"name": g.name, "memory": gib(g.memory_bytes, 2), "bytes": f"{g.memory_bytes:,}",
                  "source": g.source} for g in _gpu_order(sc)],
        "model": {"name": sc.model.name, "params": f"{sc.model.params:,}", "origin": sc.model.origin or sc.model.preset},
        # what the parallel model, the fine-tuning model and the cluster search rely on: only for the blocks used
        "groups": [{"title": title, "items": items} for title, items in (
            ("Parallelism and sharding", _parallel_assumptions(sc) if sc.parallel else []),
            ("Fine-tuning", _finetune_assumptions(sc)),
            ("How many GPUs", _cluster_assumptions(sc))) if items],
    }


# ---------------------------------------------------------------------------------------------------- formulas
def formulas(all_formulas: list) -> list[dict[str, Any]]:
    """Every formula but the stated assumptions ('*.assumptions.*'), which the Assumptions section lists where they
    apply."""
    return [{"name": f.name, "expression": f.expression, "where": f.where, "module": f.module, "note": f.note,
             "sources": [{"key": s.key, "title": s.title, "ref": s.ref} for s in f.sources]} for f in all_formulas
            if ".assumptions." not in f.name]


# ---------------------------------------------------------------------------------------------------- validation
_VALIDATION_COLUMNS = (  # accuracy.compare's columns, as the report shows them
    ("case", "case"), ("measured_peak_bytes", "measured (GiB)"), ("estimated_peak_bytes", "estimated (GiB)"),
    ("error", "error"), ("measured_phase", "peak phase (measured)"), ("estimated_phase", "peak phase (estimated)"),
    ("attention_kernel", "attention kernel"), ("within_tolerance", "within tolerance"),
)


def _cell(col: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return DASH
    if col.endswith("_bytes"):
        return DASH if v < 0 else gib_number(v, 2)
    if col == "error" or col.endswith("_error"):
        return signed_percent(v)
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    return str(v)


def validation(table: pd.DataFrame | None) -> dict[str, Any] | None:
    """Measured vs estimated (accuracy.compare's frame): one row per case, GiB and signed relative error."""
    if table is None or len(table) == 0:
        return None
    cols = [(c, h) for c, h in _VALIDATION_COLUMNS if c in table.columns]
    rows = [[_cell(c, v) for (c, _), v in zip(cols, rec)]
            for rec in table[[c for c, _ in cols]].itertuples(index=False, name=None)]
    stats = ""
    if "error" in table.columns:
        err = table["error"].abs().dropna()
        err = err[np.isfinite(err)]
        if len(err):
            stats = (f"Median |error| {err.median() * 100:.1f}%, largest {err.max() * 100:.1f}% over {len(err)} "
                     f"cases the estimator could take")
            if "within_tolerance" in table.columns:
                stats += f"; {int(table['within_tolerance'].sum())} of {len(table)} within their stated tolerance"
            stats += "."
    return {"headers": [h for _, h in cols], "rows": rows, "count": str(len(rows)), "stats": stats}


def _finetune_text(sc: Scenario) -> str:
    """'LoRA rank 16 (alpha 16, dropout 0.0) on q_proj, v_proj, adapters fp32: 1,703,936 trainable parameters; the
    base is frozen' for a LoRA/QLoRA scenario, '' otherwise."""
    ft = getattr(sc.model, "finetune", None)
    if ft is None or not ft.adapters:
        return ""
    from ..components import finetune as F

    targets = ", ".join(t.name for t in F.targets_of(sc.model, ft))
    base = "NF4 (4-bit, double-quantised block scales)" if ft.method == "qlora" else "frozen in the recipe's dtype"
    return (f"{'QLoRA' if ft.method == 'qlora' else 'LoRA'} rank {ft.rank} (alpha {ft.alpha:g}, dropout "
            f"{ft.dropout:g}) on {targets}, adapters {ft.adapter_dtype}: {F.adapter_params(sc.model, ft):,} trainable "
            f"parameters; base weights {base}")


# ---------------------------------------------------------------------------------------------------- all of it
def build_context(sc: Scenario, results: pd.DataFrame, max_batch: pd.DataFrame, prov: Provenance,
                  all_formulas: list, validation_table: pd.DataFrame | None = None,
                  serving_plan: pd.DataFrame | None = None,
                  serving_context: pd.DataFrame | None = None, changes: Any = None,
                  cluster_options: pd.DataFrame | None = None) -> dict[str, Any]:
    """Everything the templates show. No clock, no elapsed time: the same inputs give the same context.
    `serving_plan`/`serving_context`: max_concurrency / max_context of an infer run (the "Serving capacity"
    section, report/serving.py); None leaves the section out. `changes`: a diff.Changes (the "Changes since REV"
    section, report/changes.py); None leaves it out. `cluster_options`: cluster_options.csv of a scenario with a
    `cluster:` block (the "Cluster options" section, report/cluster.py); None leaves it out."""
    from .changes import section as changes_section
    from .cluster import section as cluster_section
    from .serving import section as serving_section

    point = reference_point(sc)
    usable = _usable(results, sc)
    tables, heat = max_batch_tables(sc, max_batch, point)
    breakdown_svg, breakdown_about = _breakdown_chart(sc, results, point, usable)
    lines_svg, lines_about = _memory_vs_batch_chart(sc, results, point, usable)
    heat_svg = charts.heatmap("Largest batch that fits", heat["rows"], heat["cols"], heat["cells"], heat["legend"])
    paper = str(sc.report.get("paper", "A4"))
    n_points = len(results)
    return {
        "title": str(sc.report.get("title") or sc.name),
        "description": sc.description,
        "paper": "Letter" if paper.lower() == "letter" else "A4",
        "provenance": {
            "config_path": prov.config_path, "sha256": prov.sha256, "commit": prov.commit or "",
            "commit_short": prov.commit[:12], "dirty": prov.dirty, "in_git": prov.in_git, "date": prov.date,
            "date_source": prov.date_source, "tool_version": prov.tool_version,
        },
        "model": {"name": sc.model.name, "params": f"{sc.model.params:,}", "finetune": _finetune_text(sc)},
        "mode": "inference" if sc.mode == "infer" else "training",
        "grid_size": f"{n_points:,}",
        "gpu_count": str(len(sc.gpus)),
        "summary": summary(sc, results, max_batch),
        "tables": tables,
        "layout_note": layout_note(sc),
        "charts": {
            "breakdown": breakdown_svg, "breakdown_about": breakdown_about,
            "lines": lines_svg, "lines_about": lines_about,
            "heatmap": heat_svg, "heatmap_truncated": heat["truncated"], "heatmap_about": heat["about"],
            "heatmap_max_rows": str(HEATMAP_MAX_ROWS),
        },
        "assumptions": assumptions(sc, validation_table),
        "formulas": formulas(all_formulas),
        "validation": validation(validation_table),
        "serving": serving_section(sc, serving_plan, serving_context, point),
        "changes": changes_section(changes, prov, sc),
        "cluster": cluster_section(sc, cluster_options),
        "yaml": sc.source_text,
        "levels": [{"n": str(i), "fill": f, "text": t} for i, (f, t) in enumerate(zip(charts.LEVEL_FILL, charts.LEVEL_TEXT))],
        "component_colours": [{"name": COMPONENT_LABELS[c], "colour": charts.COMPONENT_COLOURS[i]}
                              for i, c in enumerate(list(C.COMPONENTS) + [C.OVERHEAD])],
    }
