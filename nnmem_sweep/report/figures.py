"""What the report's two charts show, chosen from the results: the stacked bars of memory by component (which points,
with which labels) and total memory against batch; charts.py draws them as SVG."""
from __future__ import annotations

from itertools import product
from typing import Any

import pandas as pd

from .. import columns as C
from ..scenario import Scenario
from . import charts
from .format import AXIS_LABELS, COMPONENT_LABELS, axis_value, gib
from .points import axis_values, describe_point, gpu_order, has_sequence, layout_axes, layout_text, select, varying_axes

BREAKDOWN_MAX_BARS = 16
LINE_MAX_SERIES = 6


def _bar_points(sc: Scenario, point: dict[str, Any]) -> tuple[list[tuple[dict[str, Any], str]], set[str]]:
    """The points drawn as stacked bars: `report.reference_points`, else precision x optimizer (or another varying
    recipe axis, or batch) around the reference point."""
    chosen = sc.report.get("reference_points")
    if chosen:
        return [({**point, **p}, " · ".join(f"{AXIS_LABELS[k]} {axis_value(k, v)}" if k in (C.BATCH, C.SEQ_LEN)
                                           else str(v) for k, v in p.items())) for p in chosen], \
            {k for p in chosen for k in p}
    varying = varying_axes(sc)
    layouts = layout_axes(sc)
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


def breakdown_chart(sc: Scenario, results: pd.DataFrame, point: dict[str, Any],
                     usable: dict[str, int]) -> tuple[str, str, str]:
    """The stacked bars (SVG), the point they stand at in words, and a note on the bars whose allocator reserve is
    not their recipe's own ('' where there is none)."""
    gpu0 = gpu_order(sc)[0].id
    base = results[results[C.GPU] == gpu0]
    batches = tuple(sc.grid.get(C.BATCH, ()))
    at = dict(point)
    if at.get(C.BATCH) not in batches:
        at[C.BATCH] = batches[0]
    segs = list(C.COMPONENTS) + [C.OVERHEAD]
    bars, unreplayed = [], []
    points, varied = _bar_points(sc, at)
    for pt, label in points:
        rows = select(base, pt)
        if not rows.empty:
            bars.append((label, [int(v) for v in rows.iloc[0][segs]]))
            if not _replayed(sc, rows.iloc[0]):
                unreplayed.append(label)
    # colours stay tied to the component; components that are zero in every bar get no legend entry
    names = [COMPONENT_LABELS[s] if any(b[1][j] > 0 for b in bars) else "" for j, s in enumerate(segs)]
    caps = [(f"{g.name} {gib(usable[g.id])}", usable[g.id]) for g in gpu_order(sc) if g.id in usable]
    about = describe_point(sc, {k: v for k, v in at.items() if k not in varied}, with_batch=C.BATCH not in varied)
    note = ""
    if unreplayed and len(unreplayed) < len(bars):
        note = (f"The runtime overhead of {' and '.join(unreplayed)} holds the largest replayed allocator reserve "
                f"({100 * sc.overheads.reserve_fraction:.1f} % of the peak), not a reserve of "
                f"{'its' if len(unreplayed) == 1 else 'their'} own: a recipe is replayed at its largest batch that "
                "fits a GPU, and no row of " + ("its recipe" if len(unreplayed) == 1 else "these recipes")
                + " fits any (Assumptions).")
    return charts.stacked_bars("Memory at the peak, by component", bars, names, caps), about, note


def _replayed(sc: Scenario, row: pd.Series) -> bool:
    """Whether the row's recipe took its own replayed reserve (components/overhead.py reserve_fractions); True
    where none did (one reserve for every row, as the Assumptions say)."""
    ov = sc.overheads
    if ov.allocator_reserve_fraction is not None or not ov.replayed_by_recipe:
        return True
    return ov.recipe_of(row) in dict(ov.replayed_by_recipe)


def memory_vs_batch_chart(sc: Scenario, results: pd.DataFrame, point: dict[str, Any], usable: dict[str, int]) -> tuple[str, str]:
    gpu0 = gpu_order(sc)[0].id
    line_axis = C.SEQ_LEN
    fixed = {k: v for k, v in point.items() if k not in (C.BATCH, line_axis)}
    sub = select(results[results[C.GPU] == gpu0], fixed)
    xs = sorted({int(b) for b in sc.grid.get(C.BATCH, ())})
    series = []
    for v in list(sc.grid.get(line_axis, ()))[:LINE_MAX_SERIES]:
        s = sub[sub[line_axis] == v].drop_duplicates(C.BATCH).set_index(C.BATCH)[C.TOTAL]
        label = f"{'prompt' if sc.mode == 'infer' else 'seq len'} {axis_value(line_axis, v)}"
        series.append((label if has_sequence(sc) else "total memory",
                       [int(s[b]) if b in s.index else None for b in xs]))
    caps = [(g.name, usable[g.id]) for g in gpu_order(sc) if g.id in usable]
    svg = charts.line_chart("Total memory against batch", xs, series, caps, "batch")
    return svg, describe_point(sc, fixed)
