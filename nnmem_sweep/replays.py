"""The allocator reserve of a scenario from replays where the verdict is decided (issue 13).

Replaying a step's allocation sequence through the caching-allocator model (components/reserve.py, allocator/)
costs tens of thousands of events in Python per row, so not every row is replayed: only the rows whose verdict a
reserve can flip, the boundary of each max-batch cell (its largest batch that fits and the next one) and the
target. The largest reserve those replays need,

    f = max over the replayed rows of (peak_reserved − peak_allocated) / peak_allocated     (rounded up to 1e-4)

is then the reserve of every row of the scenario (`Overheads.replayed_reserve_fraction`), and the report says how
many rows were replayed and the range they gave. A replay does not depend on the GPU (its sequence is the step's;
the capacity only decides an out-of-memory error, which a fit by the estimator's total, with f the largest
replayed, already rules out), so rows are replayed once per distinct point.

Not replayed: a reserve given in `overheads:` (it stands), models without a traced sequence (hand-modelled
families; components/reserve.py says why for each row); those keep the default, labelled "not replayed".
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from . import columns as C
from .allocator import AllocatorOptions
from .components.reserve import replayed_reserve
from .fit import MAX_BATCH_CAP, max_batch
from .grid import add_gpu_columns, point_axes, product_frame
from .scenario import Scenario
from .serving import sweep_prefill_logits

MAX_REPLAYS = 24  # distinct points replayed at most (each ~0.1 s for an 8B model): the largest batches first
RESOLUTION = 10_000  # f is rounded up to a multiple of 1 / RESOLUTION


def boundary_points(sc: Scenario) -> pd.DataFrame:
    """The distinct (non-GPU) points where a reserve decides a verdict: each max-batch cell's largest batch that
    fits and the next one, and the target's batch; the largest batches first, at most MAX_REPLAYS."""
    points = add_gpu_columns(product_frame(point_axes(sc), tuple(g.id for g in sc.gpus)), sc)
    mb = max_batch(sc.model, sc.mode, points, sc.overheads, sc.headroom, prefill_logits=sweep_prefill_logits(sc))
    axes = [c for c in point_axes(sc) if c in mb.columns and c != C.GPU]
    b = mb[C.MAX_BATCH].to_numpy(dtype=np.int64)
    cells = mb[axes]
    rows = [cells[b > 0].assign(**{C.BATCH: b[b > 0]}),
            cells[(b < MAX_BATCH_CAP)].assign(**{C.BATCH: b[b < MAX_BATCH_CAP] + 1})]
    if sc.target.get("batch"):
        rows.append(cells.assign(**{C.BATCH: int(sc.target["batch"])}))
    out = pd.concat(rows, ignore_index=True)
    keys = [c for c in out.columns]
    out = out.astype({c: str for c in axes if isinstance(out[c].dtype, pd.CategoricalDtype)})
    out = out.drop_duplicates(keys).sort_values(C.BATCH, ascending=False, kind="stable")
    return out.head(MAX_REPLAYS).reset_index(drop=True)


def with_replayed_reserve(sc: Scenario) -> Scenario:
    """`sc` with the reserve its replays give (or a note saying why none was replayed)."""
    ov = sc.overheads
    if ov.allocator_reserve_fraction is not None or ov.replayed_reserve_fraction is not None or ov.reserve_note:
        return sc
    if sc.model.kind != "derived":
        note = (f"not replayed: {sc.model.name} is modelled by hand, with no traced allocation sequence; a default "
                "between the 0.8-9 % the first replays of the allocator model measured")
        return dataclasses.replace(sc, overheads=dataclasses.replace(ov, reserve_note=note))
    rows = boundary_points(sc)
    options = AllocatorOptions.from_alloc_conf(ov.allocator_conf) if ov.allocator_conf else AllocatorOptions()
    rr = replayed_reserve(sc.model, sc.mode, rows, options)
    ok = (rr.traced_peak_bytes > 0) & (rr.peak_reserved_bytes >= 0)
    if not ok.any():
        reason = rr.notes[0] if rr.notes else "no boundary row"
        note = f"{reason}; a default between the 0.8-9 % the first replays of the allocator model measured"
        return dataclasses.replace(sc, overheads=dataclasses.replace(ov, reserve_note=note))
    extra = (rr.peak_reserved_bytes[ok] - rr.traced_peak_bytes[ok]) / rr.traced_peak_bytes[ok]
    f = max(math.ceil(float(extra.max()) * RESOLUTION) / RESOLUTION, 0.0)
    conf = f"PYTORCH_CUDA_ALLOC_CONF={ov.allocator_conf}" if ov.allocator_conf else "PyTorch's default allocator settings"
    note = (f"the largest of {int(ok.sum())} replays of the step's own allocation sequence through the caching-allocator "
            f"model ({conf}) at the rows where the verdict is decided (each max-batch cell's boundary and the target): "
            f"{100 * float(extra.min()):.2f}-{100 * float(extra.max()):.2f} % of the peak")
    skipped = int((~ok).sum())
    if skipped:
        note += f"; {skipped} row(s) not replayed ({rr.notes[int(np.flatnonzero(~ok)[0])]})"
    return dataclasses.replace(sc, overheads=dataclasses.replace(ov, replayed_reserve_fraction=f, reserve_note=note))
