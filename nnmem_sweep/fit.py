"""The largest batch that fits, per combination of the other axes and GPU, in closed form.

Every phase total is affine in batch, T_j(b) = c_j + k_j·b (components/terms.py: c_j holds const + s·pos + s²·sq,
what the whole batch shares; k_j the per-sample rest), so the estimator evaluated at b = 2 and b = 3 gives
k_j = T_j(3) − T_j(2) and c_j = T_j(2) − 2·k_j for every row at once (a derived model's batch 1 may be a program of
its own, so its line is taken from batches 2 and 3; the check below settles batch 1). The total is g(P) = P + ⌈f·P⌉ +
fixed (library workspaces and memory outside the allocator, per row: components/overhead.py), nondecreasing in the
peak P, so "fits" means P ≤ P*, the largest peak with g(P*) ≤ usable. Then

    b_max = min_j ⌊(P* − c_j) / k_j⌋          (phases with k_j = 0 only bound it when c_j > P*)

and the result is checked with the real functions at b_max and b_max + 1, moving by one where rounding bites, so
fits(b_max) and not fits(b_max + 1) hold exactly. b_max is 0 when batch 1 does not fit, and at most MAX_BATCH_CAP
(a model whose memory does not grow with batch fits any batch; the cap stands for "unbounded").
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import columns as C
from .components.overhead import RowOverheads, row_overheads, total_bytes, usable_bytes
from .grid import points_frame
from .peak import host_check, phase_totals_in_batch
from .models.arch import Architecture
from .scenario import Overheads, Scenario

MAX_BATCH_CAP = 2**31 - 1


def _with_overhead(peak: np.ndarray, ov: RowOverheads) -> np.ndarray:
    """total_bytes for a peak: P + ceil(f·P) + fixed, nondecreasing in P."""
    return total_bytes(peak, ov)


def _totals_at(totals_of, b: np.ndarray, ov: RowOverheads) -> tuple[list[np.ndarray], np.ndarray]:
    """Phase totals and the total with overheads at batch b (totals_of: peak.phase_totals_in_batch)."""
    phases = totals_of(b)
    peak = phases[0].copy()
    for p in phases[1:]:  # a running maximum: a derived model has thousands of phases, no (k, n) array is needed
        np.maximum(peak, p, out=peak)
    return phases, _with_overhead(peak, ov)


def scenario_max_batch(sc: Scenario, overheads: Overheads | None = None) -> pd.DataFrame:
    """max_batch.csv of a scenario: max_batch on its points (grid.points_frame) with `overheads` (the scenario's
    own when None)."""
    return max_batch(sc.model, sc.mode, points_frame(sc), sc.overheads if overheads is None else overheads,
                     sc.headroom, prefill_logits=sc.prefill_logits)


def max_batch(arch: Architecture, mode: str, points: pd.DataFrame, overheads: Overheads, headroom: float,
              *, prefill_logits: str = "last") -> pd.DataFrame:
    """`points`: the non-batch axes, gpu and gpu_memory_bytes, one row per combination (any batch column is
    ignored). Returns the non-batch axes, gpu, max_batch, total_at_max_batch_bytes (0 when max_batch is 0),
    total_at_batch_1_bytes, gpu_memory_bytes, usable_bytes (and host_bytes with parallel columns: host memory per
    node, batch-independent; a point whose host_bytes exceed host_memory_bytes has max_batch 0)."""
    n = len(points)
    mem = points[C.GPU_MEMORY].to_numpy(dtype=np.int64)
    usable = usable_bytes(mem, headroom)
    one = np.ones(n, dtype=np.int64)
    ov = row_overheads(overheads, points, mode)
    # the columns read once for every batch tried below
    totals_of = phase_totals_in_batch(arch, mode, points, prefill_logits=prefill_logits)
    _, total1 = _totals_at(totals_of, one, ov)
    # the slope from batches 2 and 3: a derived model's batch 1 may be a program of its own (components/derived.py),
    # which the check below settles; for every other model these give the same line as batches 1 and 2
    ph2, _ = _totals_at(totals_of, 2 * one, ov)
    ph3, _ = _totals_at(totals_of, 3 * one, ov)

    # P*: the largest peak whose total fits (_with_overhead is nondecreasing).
    pstar = np.floor((usable - ov.fixed) / (1.0 + ov.reserve_fraction)).astype(np.int64)
    pstar = np.maximum(pstar, -1)
    for _ in range(3):  # float rounding: settle on the exact boundary
        pstar = np.where(_with_overhead(pstar, ov) > usable, pstar - 1, pstar)
        pstar = np.where(_with_overhead(pstar + 1, ov) <= usable, pstar + 1, pstar)

    bmax = np.full(n, MAX_BATCH_CAP, dtype=np.int64)
    for t2, t3 in zip(ph2, ph3):
        happens = t2 >= 0
        k = t3 - t2
        c = t2 - 2 * k
        with np.errstate(divide="ignore", invalid="ignore"):
            bound = np.where(k > 0, np.floor_divide(pstar - c, np.where(k > 0, k, 1)), MAX_BATCH_CAP)
        bound = np.where((k <= 0) & (c > pstar), -1, bound)
        bmax = np.where(happens, np.minimum(bmax, bound), bmax)
    bmax = np.clip(bmax, 0, MAX_BATCH_CAP)
    host = host_check(arch, mode, points)  # parallel layouts: offloaded states beyond the node's RAM fit no batch
    if host is not None:
        bmax = np.where(host[1], bmax, 0)

    # verify with the real functions; move by one where integer rounding bites
    for _ in range(4):
        _, t_at = _totals_at(totals_of, np.maximum(bmax, 1), ov)
        _, t_next = _totals_at(totals_of, np.minimum(bmax + 1, MAX_BATCH_CAP), ov)
        too_big = (bmax > 0) & (t_at > usable)
        room = (bmax < MAX_BATCH_CAP) & (t_next <= usable)
        if host is not None:
            room &= host[1]
        if not too_big.any() and not room.any():
            break
        bmax = np.where(too_big, bmax - 1, np.where(room, bmax + 1, bmax))
    _, t_at = _totals_at(totals_of, np.maximum(bmax, 1), ov)

    # one DataFrame built at once (a drop, a copy and five inserts cost ~1 ms on a small table)
    out = {c: points[c].array for c in points.columns if c not in (C.BATCH, C.GPU_MEMORY)}
    out[C.MAX_BATCH] = bmax
    out[C.TOTAL_AT_MAX_BATCH] = np.where(bmax > 0, t_at, 0)
    out[C.TOTAL_AT_BATCH_1] = total1
    out[C.GPU_MEMORY] = mem
    out[C.USABLE] = usable
    if host is not None:
        out[C.HOST] = host[0]
    return pd.DataFrame(out, index=pd.RangeIndex(n))
