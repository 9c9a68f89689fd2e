"""The report's summary: per GPU, the largest batch that fits at the reference point; the layout with the most room
where the scenario lists several; and which GPUs meet the scenario's target."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from .. import columns as C
from ..scenario import Scenario
from .format import AXIS_LABELS, article, axis_value, gib, gib_number, percent
from .points import (axis_values, describe_point, gpu_order, layout_axes, layout_text, recipe, reference_point,
                     select, usable_by_gpu, varying_axes)


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
    ref = select(max_batch, at)
    meeting = [g.name for g in gpu_order(sc) if not ref[(ref[C.GPU] == g.id) & (ref[C.MAX_BATCH] >= want)].empty]
    if meeting:
        text = f"Target ({what}) is met by: {', '.join(meeting)} (smallest first)."
    else:
        text = f"Target ({what}) is met by none of the GPUs with this recipe{' and layout' if sc.parallel else ''}."
    # any recipe in the grid at the target's sequence length: for each GPU the one with the most room (largest max
    # batch; a stable sort keeps the grid's order among equals)
    fixed = {k: v for k, v in sc.target.items() if k in C.NON_BATCH_AXES}
    ok = select(max_batch, fixed)
    ok = ok[ok[C.MAX_BATCH] >= want].sort_values(C.MAX_BATCH, ascending=False, kind="stable")
    others = [f"{g.name} ({recipe(sc, ok[ok[C.GPU] == g.id].iloc[0].to_dict())})" for g in gpu_order(sc)
              if g.name not in meeting and (ok[C.GPU] == g.id).any()]
    other_text = ""
    if others and any(a not in fixed for a in varying_axes(sc)):
        other = "another recipe or layout" if layout_axes(sc) else "another recipe"
        other_text = f"With {other} from the grid (the one with the most room): {'; '.join(others)}."
    return {"text": text, "met": bool(meeting), "gpus": meeting, "others": other_text}


def _best_layout(sc: Scenario, max_batch: pd.DataFrame, at: dict[str, Any], gpu: Any, ref_mb: int,
                 usable: int) -> dict[str, Any] | None:
    """When the scenario lists several layouts: the one with the most room on `gpu` at the reference recipe (the
    largest max batch; among equals the fewest GPUs, then no pipeline, the smallest TP, the lowest ZeRO stage), as a
    summary sentence, if it fits more than the
    reference layout's `ref_mb`; or, when no layout fits, the one that comes closest."""
    layouts = layout_axes(sc)
    if not layouts:
        return None
    n = math.prod(len(axis_values(sc)[a]) for a in layouts)
    pool = select(max_batch, {k: v for k, v in at.items() if k not in C.PARALLEL_AXES})
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
    ref = select(max_batch, non_batch)
    usable = usable_by_gpu(results, sc)
    prefix = describe_point(sc, point)
    sentences = []
    for g in gpu_order(sc):
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
