"""What each GPU type of a scenario can do for the question the scenario asks: one `Option` per GPU type, chosen by
a stated rule, with the figures the decision page prints (decision.py lays them out).

Three kinds of question, three sources of options:
- the grid (`grid_options`): training, or inference without a `serving:` block. The question is the target (batch ×
  sequence length; without one, the reference point) with the recipe asked (the target's values, else each axis's
  first) and, with a `parallel:` block, the first layout. The estimator is run at that point for every recipe and
  layout in the grid on every GPU; per GPU the recipe asked if it fits, else the one that changes the fewest
  settings of it (recipe axes first, then layout axes), then the fewest GPUs, then the most room; when none fits,
  the one that comes closest (the smallest need / usable).
- the serving plan (`serving_options`, a `serving:` block): max_concurrency.csv at the asked context (the target's
  prompt + the reference decode tokens) for the asked concurrency (the target batch), per GPU the first tensor-
  parallel degree, the recipe and the first KV dtype, else the fewest changes of those, then the most room.
- the cluster search (`cluster_options`, a `cluster:` block): cluster_options.csv, per GPU type the option its
  rank_by picks (fewest GPUs, or the lowest cost per token trained).
Each option can be re-estimated at a perturbed point (`sensitivity`): a longer sequence, more fragmentation.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from .. import cluster as K
from .. import columns as C
from ..estimate import estimate_frame
from ..grid import add_gpu_columns, axes_of, product_frame
from ..scenario import GPUSpec, Scenario
from ..serving import engine_fixed_bytes, options as serving_options_of, weights_per_gpu_bytes
from .points import axis_values, gpu_order, layout_text, reference_point, select

MAX_DECISION_ROWS = 200_000  # points estimated for the question; a larger grid is judged on the recipe asked only
FRAGMENTATION_SENSITIVITY = 0.10  # the "still fits with fragmentation +10 %" line
RECIPE_AXES = (C.PRECISION, C.OPTIMIZER, C.OPTIMIZER_IMPL, C.CHECKPOINTING, C.ATTENTION)


@dataclass
class Option:
    """One GPU type's answer to the question."""

    gpu: GPUSpec
    fits: bool
    total: int  # bytes needed per GPU (the estimate's total; serving: the engine's use)
    usable: int  # bytes usable per GPU
    peak: int  # bytes PyTorch allocates piecewise (the part fragmentation scales with)
    gpus: int  # GPUs of this type
    row: dict[str, Any]  # the point (grid axes, layout, gpu) for re-estimating and measuring
    recipe: str  # the recipe and layout in words
    changed: list[str] = field(default_factory=list)  # settings changed from the question's, in words
    extra: dict[str, Any] = field(default_factory=dict)  # kind-specific figures (max batch, concurrency ...)

    @property
    def margin(self) -> int:
        return self.usable - self.total


@dataclass
class Question:
    kind: str  # "grid" | "serving" | "cluster"
    point: dict[str, Any]  # the asked point (grid axes; serving: context, concurrency, tp, kv_dtype)
    has_target: bool


def estimate_points(sc: Scenario, frame: pd.DataFrame) -> pd.DataFrame:
    """The estimator on the points the decision speaks about (the report's tests put their toy estimator here)."""
    return estimate_frame(sc.model, sc.mode, add_gpu_columns(frame, sc), sc.overheads, sc.headroom,
                          prefill_logits=sc.prefill_logits)


def question(sc: Scenario, serving_plan: pd.DataFrame | None, cluster: pd.DataFrame | None) -> Question:
    if sc.cluster is not None and cluster is not None:
        return Question("cluster", {C.SEQ_LEN: sc.cluster.seq_len, **sc.cluster.fixed}, True)
    point = reference_point(sc)
    if sc.target:
        point.update({k: v for k, v in sc.target.items() if k in C.GRID_AXES})
    if sc.mode == "infer" and sc.serving and serving_plan is not None and len(serving_plan):
        opt = serving_options_of(sc)
        ctx = int(point[C.SEQ_LEN]) + int(point.get(C.DECODE_TOKENS) or 0)
        if ctx in set(serving_plan[C.CONTEXT].astype(int)):
            return Question("serving", {**point, C.CONTEXT: ctx, C.TENSOR_PARALLEL: opt["tensor_parallel"][0],
                                        C.KV_DTYPE: opt["kv_dtype"][0]}, bool(sc.target))
    return Question("grid", point, bool(sc.target))


# ------------------------------------------------------------------------------------------------ the grid

def _gpu_count(row: dict[str, Any]) -> int:
    return math.prod(int(row.get(a, 1) or 1) for a in (C.DATA_PARALLEL, C.TENSOR_PARALLEL, C.PIPELINE_PARALLEL,
                                                       C.CONTEXT_PARALLEL))


def _changes(est: pd.DataFrame, asked: dict[str, Any], axes: list[str]) -> np.ndarray:
    n = np.zeros(len(est), dtype=np.int64)
    for a in axes:
        n += (est[a].astype(str).to_numpy() != str(asked[a]))
    return n


def _changed_words(sc: Scenario, row: dict[str, Any], asked: dict[str, Any]) -> list[str]:
    out = []
    for a in RECIPE_AXES + C.PARALLEL_AXES:
        if a in asked and a in row and str(row[a]) != str(asked[a]):
            out.append(f"{a.replace('_', ' ')} {row[a]}" if a in RECIPE_AXES else layout_text(sc, row, only=[a]))
    return out


def grid_options(sc: Scenario, q: Question, max_batch: pd.DataFrame) -> list[Option]:
    asked = q.point
    axes = axes_of(sc)
    recipe_axes = [a for a in RECIPE_AXES + C.PARALLEL_AXES if a in axes and len(axes[a]) > 1]
    free = {a: axes[a] if a in recipe_axes else (asked[a],) for a in axes if a != C.BATCH}
    if math.prod(len(v) for v in free.values()) * len(sc.gpus) > MAX_DECISION_ROWS:
        free = {a: (asked[a],) for a in free}
    frame = product_frame({C.BATCH: (int(asked[C.BATCH]),), **free}, tuple(g.id for g in sc.gpus))
    est = estimate_points(sc, frame)
    layout_axes = [a for a in recipe_axes if a in C.PARALLEL_AXES]
    recipe_changes = _changes(est, asked, [a for a in recipe_axes if a not in layout_axes])
    layout_changes = _changes(est, asked, layout_axes)
    count = np.ones(len(est), dtype=np.int64)
    for a in (C.DATA_PARALLEL, C.TENSOR_PARALLEL, C.PIPELINE_PARALLEL, C.CONTEXT_PARALLEL):
        if a in est.columns:
            count = count * est[a].to_numpy(dtype=np.int64)
    total = est[C.TOTAL].to_numpy(dtype=np.int64)
    usable = est[C.USABLE].to_numpy(dtype=np.int64)
    fits = est[C.FITS].to_numpy(dtype=bool)
    gpu = est[C.GPU].astype(str).to_numpy()
    out = []
    for g in gpu_order(sc):
        idx = np.flatnonzero(gpu == g.id)
        if not len(idx):
            continue
        ok = idx[fits[idx]]
        if len(ok):  # fewest recipe changes, then layout changes, fewest GPUs, most room; then the grid's order
            pick = ok[np.lexsort((ok, total[ok] - usable[ok], count[ok], layout_changes[ok], recipe_changes[ok]))[0]]
        else:  # the one that comes closest
            pick = idx[np.lexsort((idx, recipe_changes[idx], total[idx] / np.maximum(usable[idx], 1)))[0]]
        row = {k: (v.item() if hasattr(v, "item") else v) for k, v in est.iloc[pick].to_dict().items()}
        row[C.GPU] = g.id
        mb = select(max_batch, {a: row[a] for a in axes if a != C.BATCH} | {C.GPU: g.id})
        out.append(Option(
            gpu=g, fits=bool(fits[pick]), total=int(total[pick]), usable=int(usable[pick]),
            peak=int(row[C.PEAK_ALLOCATED]), gpus=int(count[pick]), row=row, recipe=_recipe_words(sc, row),
            changed=_changed_words(sc, row, asked),
            extra={"max_batch": int(mb[C.MAX_BATCH].iloc[0]) if len(mb) else None}))
    return out


def _recipe_words(sc: Scenario, row: dict[str, Any]) -> str:
    """'bf16-mixed adamw, full checkpointing' (inference: 'int4'), with the layout when the scenario has one."""
    if sc.mode == "infer":
        words = [str(row[C.PRECISION])]
    else:
        words = [f"{row[C.PRECISION]} {row[C.OPTIMIZER]}"]
        if row.get(C.CHECKPOINTING) not in (None, "none"):
            words.append(f"{row[C.CHECKPOINTING]} checkpointing")
    for a in (C.ATTENTION, C.OPTIMIZER_IMPL):
        if len(axis_values(sc).get(a, ())) > 1:
            words.append(f"{row[a]} {a.replace('_', ' ')}")
    layout = layout_text(sc, row)
    return ", ".join(words + ([layout] if layout else []))


def _next_seq(sc: Scenario, seq: int) -> int:
    """The next sequence length the grid lists above `seq`, else twice `seq`."""
    longer = sorted(int(s) for s in sc.grid.get(C.SEQ_LEN, ()) if int(s) > seq)
    return longer[0] if longer else 2 * seq


def grid_sensitivity(sc: Scenario, o: Option) -> dict[str, Any]:
    """The option re-estimated at the next sequence length (same batch and recipe)."""
    seq = _next_seq(sc, int(o.row[C.SEQ_LEN]))
    axes = {a: (o.row[a],) for a in axes_of(sc)}
    axes[C.SEQ_LEN] = (seq,)
    est = estimate_points(sc, product_frame(axes, (o.gpu.id,))).iloc[0]
    return {"what": f"{'prompt' if sc.mode == 'infer' else 'seq'} {seq:,}", "fits": bool(est[C.FITS]),
            "total": int(est[C.TOTAL])}


# ------------------------------------------------------------------------------------------------ serving plan

def serving_options(sc: Scenario, q: Question, plan: pd.DataFrame) -> list[Option]:
    asked, n = q.point, int(q.point[C.BATCH])
    at = plan[plan[C.CONTEXT].astype(int) == int(asked[C.CONTEXT])]
    u = Fraction(str(serving_options_of(sc)["gpu_memory_utilization"]))  # as serving.py takes it
    out = []
    for g in gpu_order(sc):
        sub = at[at[C.GPU].astype(str) == g.id].reset_index(drop=True)
        if not len(sub):
            continue
        budget = sub[C.KV_BUDGET].to_numpy(dtype=np.int64)
        need = n * sub[C.KV_BYTES_PER_SEQUENCE].to_numpy(dtype=np.int64)
        changes = sum((sub[a].astype(str).to_numpy() != str(asked[a])).astype(np.int64)
                      for a in (C.PRECISION, C.KV_DTYPE, C.TENSOR_PARALLEL))
        tp = sub[C.TENSOR_PARALLEL].to_numpy(dtype=np.int64)
        fits = sub[C.MAX_CONCURRENT].to_numpy(dtype=np.int64) >= n
        idx = np.arange(len(sub))
        ok = idx[fits]
        if len(ok):
            pick = ok[np.lexsort((ok, need[ok] - budget[ok], tp[ok], changes[ok]))[0]]
        else:
            pick = idx[np.lexsort((idx, changes, need - budget))[0]]
        r = sub.iloc[pick].to_dict()
        t, prec = int(r[C.TENSOR_PARALLEL]), str(r[C.PRECISION])
        engine = g.memory_bytes * u.numerator // u.denominator
        pieces = engine - int(budget[pick]) - engine_fixed_bytes(sc, g.id, t) if budget[pick] > 0 else \
            int(weights_per_gpu_bytes(sc.model, prec, np.array([t]))[0])
        row = {C.GPU: g.id, C.TENSOR_PARALLEL: t, C.PRECISION: prec, C.KV_DTYPE: str(r[C.KV_DTYPE]),
               C.CONTEXT: int(r[C.CONTEXT]), C.BATCH: n, C.SEQ_LEN: int(asked[C.SEQ_LEN]),
               C.DECODE_TOKENS: int(asked.get(C.DECODE_TOKENS) or 0), C.PEAK_ALLOCATED: pieces,
               C.RESERVED: pieces}  # the plan assumes no fragmentation: reserved = allocated
        changed = [f"{a.replace('_', ' ')} {row[a]}" for a in (C.PRECISION, C.KV_DTYPE, C.TENSOR_PARALLEL)
                   if str(row[a]) != str(asked[a])]
        out.append(Option(
            gpu=g, fits=bool(fits[pick]), total=engine - int(budget[pick]) + int(need[pick]), usable=engine,
            peak=pieces, gpus=t, row=row, recipe=f"{prec} weights, KV cache {row[C.KV_DTYPE]}"
            + (f", tensor parallel {t}" if t > 1 else ""), changed=changed,
            extra={"max_concurrent": int(r[C.MAX_CONCURRENT]), "kv_tokens": int(r[C.KV_TOKENS_FIT])}))
    return out


def serving_sensitivity(o: Option, plan: pd.DataFrame) -> dict[str, Any] | None:
    """The option at the next context the plan holds (the same prompt growth the grid lists)."""
    longer = sorted(int(c) for c in plan[C.CONTEXT].unique() if int(c) > int(o.row[C.CONTEXT]))
    if not longer:
        return None
    r = plan[(plan[C.CONTEXT].astype(int) == longer[0]) & (plan[C.GPU].astype(str) == o.gpu.id)
             & (plan[C.TENSOR_PARALLEL] == o.row[C.TENSOR_PARALLEL])
             & (plan[C.PRECISION].astype(str) == o.row[C.PRECISION])
             & (plan[C.KV_DTYPE].astype(str) == o.row[C.KV_DTYPE])].iloc[0]
    n = int(o.row[C.BATCH])
    total = o.usable - int(r[C.KV_BUDGET]) + n * int(r[C.KV_BYTES_PER_SEQUENCE])
    return {"what": f"context {longer[0]:,}", "fits": int(r[C.MAX_CONCURRENT]) >= n, "total": total,
            "max_concurrent": int(r[C.MAX_CONCURRENT])}


# ------------------------------------------------------------------------------------------------ cluster search

def _layout_row(r: dict[str, Any]) -> dict[str, Any]:
    return {a: r[a] for a in (C.DATA_PARALLEL, C.TENSOR_PARALLEL, C.PIPELINE_PARALLEL, C.ZERO_STAGE)} | {
        C.CONTEXT_PARALLEL: 1, C.EXPERT_PARALLEL: 1}


def cluster_layout_words(r: dict[str, Any]) -> str:
    """'TP 4 + SP · PP 1 · DP 8 · ZeRO 3; micro-batch 1 × 128; selective recomputation' (a table cell)."""
    ck = str(r[C.CHECKPOINTING])
    return (f"TP {r[C.TENSOR_PARALLEL]}{' + SP' if r.get(C.SEQUENCE_PARALLEL) else ''} · PP {r[C.PIPELINE_PARALLEL]} "
            f"· DP {r[C.DATA_PARALLEL]} · ZeRO {r[C.ZERO_STAGE]}; micro-batch {r[C.BATCH]} × {r[K.ACCUMULATION]:,}; "
            + ("no recomputation" if ck == "none" else f"{ck} recomputation"))


def _cluster_option(g: GPUSpec, r: dict[str, Any]) -> Option:
    return Option(gpu=g, fits=True, total=int(r[C.TOTAL]), usable=int(r[C.USABLE]), peak=int(r[C.PEAK_ALLOCATED]),
                  gpus=int(r[K.GPUS]), row={**r, **_layout_row(r)}, recipe=cluster_layout_words(r))


def cluster_every_option(sc: Scenario, options: pd.DataFrame) -> list[Option]:
    """Every row of cluster_options.csv as an Option (every GPU count of every type)."""
    by_id = {g.id: g for g in sc.gpus}
    return [_cluster_option(by_id[str(r[C.GPU])], r) for r in options.to_dict("records")]


def cluster_options(sc: Scenario, options: pd.DataFrame) -> list[Option]:
    search = sc.cluster
    out = []
    for g in sc.gpus:  # the scenario's order: the search's and cluster_options.csv's
        sub = options[options[C.GPU].astype(str) == g.id]
        if len(sub):
            if search.rank_by == "cost_per_token" and sub[K.COST_PER_BILLION].notna().any():
                sub = sub.iloc[np.lexsort((np.arange(len(sub)), sub[K.GPUS].to_numpy(dtype=np.int64),
                                           sub[K.COST_PER_BILLION].to_numpy(dtype=float)))]
            out.append(_cluster_option(g, sub.iloc[0].to_dict()))
            continue
        closest = _closest_layout(sc, g)
        if closest is not None:
            out.append(closest)
    return out


def _closest_layout(sc: Scenario, g: GPUSpec) -> Option | None:
    """No searched layout fits this GPU type: the candidate with the smallest need / usable."""
    frame = K.candidates(sc.cluster, sc, g)
    if not len(frame):
        return None
    est = estimate_frame(sc.model, "train", frame, sc.overheads, sc.headroom)
    ratio = est[C.TOTAL].to_numpy(dtype=np.int64) / np.maximum(est[C.USABLE].to_numpy(dtype=np.int64), 1)
    r = est.iloc[int(np.argmin(ratio))].to_dict()
    r[K.GPUS] = _gpu_count(r)
    r[K.ACCUMULATION] = sc.cluster.global_batch // (int(r[C.BATCH]) * int(r[C.DATA_PARALLEL]))
    r[C.GPU] = g.id
    return dataclasses.replace(_cluster_option(g, r), fits=False)


def cluster_sensitivity(sc: Scenario, o: Option) -> dict[str, Any] | None:
    """The same layout at twice the sequence length (the same sequences per step, twice the tokens)."""
    r = o.row
    seq = 2 * int(sc.cluster.seq_len)
    search = dataclasses.replace(sc.cluster, seq_len=seq, tensor_parallel=(int(r[C.TENSOR_PARALLEL]),),
                                 pipeline_parallel=(int(r[C.PIPELINE_PARALLEL]),), micro_batch=(int(r[C.BATCH]),),
                                 zero_stage=(int(r[C.ZERO_STAGE]),), checkpointing=(str(r[C.CHECKPOINTING]),))
    frame = K.candidates(search, sc, o.gpu)
    frame = frame[frame[C.DATA_PARALLEL].to_numpy(dtype=np.int64) == int(r[C.DATA_PARALLEL])]
    if not len(frame):
        return None
    est = estimate_frame(sc.model, "train", frame.reset_index(drop=True), sc.overheads, sc.headroom).iloc[0]
    return {"what": f"seq {seq:,}", "fits": bool(est[C.FITS]), "total": int(est[C.TOTAL])}


def fragmentation_sensitivity(o: Option) -> dict[str, Any]:
    """The option with fragmentation taking FRAGMENTATION_SENSITIVITY more of the peak than the estimate assumes."""
    total = o.total + math.ceil(o.peak * FRAGMENTATION_SENSITIVITY)
    return {"what": f"fragmentation +{FRAGMENTATION_SENSITIVITY:.0%} of the peak", "fits": total <= o.usable,
            "total": total}
