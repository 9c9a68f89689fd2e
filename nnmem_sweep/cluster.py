"""How many GPUs (issue 4): for a training target, per GPU type the fewest GPUs and a parallel configuration whose
memory per GPU fits with headroom, and the cheapest when the scenario gives prices.

The target is a global batch of sequences per optimizer step at one sequence length (or tokens per step, turned
into sequences). For each GPU type the search builds one frame of every candidate layout and evaluates it with the
same vectorised estimator as the grid (estimate.estimate_frame: memory of the most loaded rank, host memory per node):

    tensor_parallel  t in `search.tensor_parallel`, at most the GPUs of one node (TP stays inside NVLink)
    pipeline_parallel p in `search.pipeline_parallel`, at most the layers
    micro-batch      b in `search.micro_batch` (the estimator's `batch`), dividing the global batch
    data_parallel    d: every divisor of global_batch / b with d·t·p <= max_gpus
    accumulation     global_batch / (b·d) micro-batches per step: the pipeline's micro_batches when p > 1, else
                     gradient accumulation steps
    zero_stage, checkpointing: the listed values; sequence_parallel on whenever t > 1 (Megatron's recommendation)

GPUs = d·t·p. Among the layouts that fit, the one kept for each (GPU type, GPU count) is chosen by a stated rule
(ORDER below): the least recomputation, then no pipeline, the smallest TP, the lowest ZeRO stage, the largest
micro-batch. Each kept option carries a throughput estimate (throughput/plan.py: tokens/s per GPU at the MFU the
scenario states or the sourced default for its GPU generation, recipe and recomputation; time and cost per 10⁹
tokens), which never changes the memory figures. The recommendation (RANK_BY):
    gpus            each type's fewest GPUs; when every type has a price, the cheapest of those (per hour first,
                    then purchase): the default
    cost_per_token  the option with the lowest cost per 10⁹ tokens trained (price per GPU-hour × GPU-hours per 10⁹
                    tokens); ties: the fewest GPUs, then the scenario's GPU order. Needs price_usd_per_hour and a
                    catalogued peak FLOP/s on every GPU (config refuses it otherwise)
The constant-MFU assumption makes the cost per token the same at every GPU count of a type unless the layout's
recomputation differs: ranking by it prefers more GPUs exactly when they allow less recomputation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from . import columns as C
from .errors import UsageError
from .estimate import estimate_frame
from .grid import product_frame
from .parallel.layout import Layout, problems, seq_problem
from .scenario import GPUSpec, Scenario
from .throughput.options import DEFAULTS as THROUGHPUT_DEFAULTS
from .throughput.plan import has_tokens, training_figures

DEFAULT_TP = (1, 2, 4, 8)
DEFAULT_PP = (1, 2, 4, 8, 16)
DEFAULT_MICRO = (1, 2, 4, 8)
DEFAULT_ZERO = (0, 1, 2, 3)
DEFAULT_MAX_GPUS = 4096
DEFAULT_GPUS_PER_NODE = 8
MAX_CANDIDATES = 5_000_000  # rows of one GPU type's search frame
OPTIONS_PER_GPU = 5  # GPU counts listed per GPU type in the report (all are in cluster_options.csv)
_CKPT_ORDER = {"none": 0, "selective": 1, "full": 2}
RANK_BY = ("gpus", "cost_per_token")

# parallel axes every candidate takes from the scenario's first value: DeepSpeed's buffers, how the accumulation
# steps sync their gradients (FSDP's no_sync keeps them whole: parallel.gradient_sync), and FSDP's version
KEPT_AXES = (C.REDUCE_BUCKET, C.OVERLAP_COMM, C.PREFETCH_BUCKET, C.GRADIENT_SYNC, C.FSDP_VERSION)

# cluster_options.csv
GPUS = "gpus"
NODES = "nodes"
ACCUMULATION = "accumulation_steps"
GLOBAL_BATCH = "global_batch"
PRICE = "price_usd"
PRICE_PER_HOUR = "price_usd_per_hour"
COST = "cost_usd"
COST_PER_HOUR = "cost_usd_per_hour"
RECOMMENDED = "recommended"
# the throughput estimate of the option (throughput/plan.py), NaN where the GPU's peak or price is unknown
MFU = "mfu"
TOKENS_PER_S_PER_GPU = "tokens_per_s_per_gpu"
TIME_PER_BILLION = "time_per_billion_tokens_s"
COST_PER_BILLION = "cost_per_billion_tokens_usd"


@dataclass(frozen=True)
class ClusterSearch:
    """The scenario's `cluster:` block."""

    global_batch: int  # sequences per optimizer step
    seq_len: int
    max_gpus: int = DEFAULT_MAX_GPUS
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    tensor_parallel: tuple[int, ...] = DEFAULT_TP
    pipeline_parallel: tuple[int, ...] = DEFAULT_PP
    micro_batch: tuple[int, ...] = DEFAULT_MICRO
    zero_stage: tuple[int, ...] = DEFAULT_ZERO
    checkpointing: tuple[str, ...] = ("none", "selective", "full")
    host_memory_bytes: int = 2 * 2**40  # the node's RAM (scenario `node:`)
    fixed: dict[str, Any] = field(default_factory=dict)  # precision, optimizer, ... (the grid's first values)
    rank_by: str = "gpus"  # RANK_BY: how the recommended option is chosen


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def candidates(search: ClusterSearch, sc: Scenario, gpu: GPUSpec) -> pd.DataFrame:
    """Every candidate layout for one GPU type as an estimator frame (the batch column is the micro-batch)."""
    arch = sc.model
    G = search.global_batch
    node = search.gpus_per_node
    tps = [t for t in search.tensor_parallel if t <= node]
    pps = [p for p in search.pipeline_parallel if p <= max(arch.layers, 1)]
    dps_of = {b: [d for d in _divisors(G // b) if d <= search.max_gpus] for b in search.micro_batch if G % b == 0}
    size = sum(len(d) for d in dps_of.values()) * len(tps) * len(pps) * len(search.zero_stage) * len(
        search.checkpointing)
    if size > MAX_CANDIDATES:  # counted before anything is built
        raise UsageError(f"cluster search for {gpu.id} has {size:,} candidate layouts, over {MAX_CANDIDATES:,}; "
                         "narrow cluster.tensor_parallel, pipeline_parallel, micro_batch or max_gpus")
    parts = []
    for b, dps in dps_of.items():
        axes = {C.BATCH: (b,), C.SEQ_LEN: (search.seq_len,), **{a: (search.fixed[a],) for a in (
            C.PRECISION, C.OPTIMIZER, C.OPTIMIZER_IMPL, C.ATTENTION)},
            C.CHECKPOINTING: search.checkpointing, C.CACHE_TOKENS: (0,), C.DECODE_TOKENS: (0,),
            C.DATA_PARALLEL: tuple(dps), C.ZERO_STAGE: search.zero_stage, C.TENSOR_PARALLEL: tuple(tps),
            C.PIPELINE_PARALLEL: tuple(pps)}
        parts.append(product_frame({k: v for k, v in axes.items()}))
    if not parts:
        raise UsageError(f"cluster.global_batch {G} is not a multiple of any cluster.micro_batch "
                         f"({', '.join(map(str, search.micro_batch))})")
    f = pd.concat(parts, ignore_index=True)
    dp = f[C.DATA_PARALLEL].to_numpy(dtype=np.int64)
    tp = f[C.TENSOR_PARALLEL].to_numpy(dtype=np.int64)
    pp = f[C.PIPELINE_PARALLEL].to_numpy(dtype=np.int64)
    b = f[C.BATCH].to_numpy(dtype=np.int64)
    gpus = dp * tp * pp
    keep = gpus <= search.max_gpus
    f = f[keep].reset_index(drop=True)
    gpus, dp, tp, pp, b = gpus[keep], dp[keep], tp[keep], pp[keep], b[keep]
    acc = G // (b * dp)
    f[C.SEQUENCE_PARALLEL] = tp > 1
    f[C.MICRO_BATCHES] = np.where(pp > 1, acc, 1)
    f[C.PIPELINE_SCHEDULE] = pd.Categorical.from_codes(np.zeros(len(f), dtype=np.int8), categories=["1f1b"])
    f[C.VIRTUAL_STAGES] = 1
    f[C.CONTEXT_PARALLEL] = 1
    f[C.EXPERT_PARALLEL] = 1
    f[C.OFFLOAD] = pd.Categorical.from_codes(np.zeros(len(f), dtype=np.int8), categories=["none"])
    f[C.GRADIENT_ACCUMULATION] = np.where(pp > 1, 1, acc)
    f[C.FP32_GRAD_ACCUMULATION] = bool(search.fixed.get(C.FP32_GRAD_ACCUMULATION, False))
    for axis in KEPT_AXES:
        f[axis] = search.fixed.get(axis, C.PARALLEL_DEFAULTS[axis])
    # layouts the model cannot take (heads not divisible by t, ...) are dropped before estimating
    key = tp * 1000 + pp
    ok = np.ones(len(f), dtype=bool)
    for t, p in {(int(k // 1000), int(k % 1000)) for k in np.unique(key)}:
        lay = Layout(tp=t, sp=t > 1, pp=p, micro_batches=max(p, 1))
        if problems(arch, lay, "train") or seq_problem(lay, search.seq_len):
            ok &= key != t * 1000 + p
    f = f[ok].reset_index(drop=True)
    f[C.GPU] = pd.Categorical.from_codes(np.zeros(len(f), dtype=np.int8), categories=[gpu.id])
    f[C.GPU_MEMORY] = np.int64(gpu.memory_bytes)
    f[C.GPUS_PER_NODE] = np.int64(node)
    f[C.HOST_MEMORY] = np.int64(search.host_memory_bytes)
    return f


def _order_keys(est: pd.DataFrame) -> list[np.ndarray]:
    """np.lexsort keys, the last the primary: fewest GPUs, least recomputation, no pipeline, smallest TP,
    lowest ZeRO stage, largest micro-batch (ORDER in the module docstring)."""
    ck = est[C.CHECKPOINTING].astype(str).map(_CKPT_ORDER).to_numpy(dtype=np.int64)
    return [-est[C.BATCH].to_numpy(dtype=np.int64), est[C.ZERO_STAGE].to_numpy(dtype=np.int64),
            est[C.TENSOR_PARALLEL].to_numpy(dtype=np.int64), est[C.PIPELINE_PARALLEL].to_numpy(dtype=np.int64),
            ck, est[GPUS].to_numpy(dtype=np.int64)]


OUTPUT_COLUMNS = (C.GPU, GPUS, NODES, C.DATA_PARALLEL, C.TENSOR_PARALLEL, C.SEQUENCE_PARALLEL, C.PIPELINE_PARALLEL,
                  C.ZERO_STAGE, C.CHECKPOINTING, C.BATCH, ACCUMULATION, GLOBAL_BATCH, C.SEQ_LEN, C.PRECISION,
                  C.OPTIMIZER, C.PEAK_ALLOCATED, C.TOTAL, C.USABLE, C.GPU_MEMORY, C.HOST, PRICE, COST,
                  PRICE_PER_HOUR, COST_PER_HOUR, MFU, TOKENS_PER_S_PER_GPU, TIME_PER_BILLION, COST_PER_BILLION,
                  RECOMMENDED)


def cluster_options(sc: Scenario, search: ClusterSearch) -> pd.DataFrame:
    """cluster_options.csv: per GPU type and GPU count, the configuration kept by the ORDER rule among those that
    fit (GPU counts at which nothing fits are absent), with its memory per GPU and its cost."""
    kept = []
    for gpu in sc.gpus:
        frame = candidates(search, sc, gpu)
        if not len(frame):
            continue
        est = estimate_frame(sc.model, "train", frame, sc.overheads, sc.headroom)
        est = est[est[C.FITS].to_numpy()].reset_index(drop=True)
        if not len(est):
            continue
        est[GPUS] = (est[C.DATA_PARALLEL].to_numpy(dtype=np.int64) * est[C.TENSOR_PARALLEL].to_numpy(dtype=np.int64)
                     * est[C.PIPELINE_PARALLEL].to_numpy(dtype=np.int64))
        est = est.iloc[np.lexsort(_order_keys(est))]
        est = est.drop_duplicates(GPUS, keep="first").reset_index(drop=True)
        n = est[GPUS].to_numpy(dtype=np.int64)
        est[NODES] = -(-n // search.gpus_per_node)
        b = est[C.BATCH].to_numpy(dtype=np.int64)
        est[ACCUMULATION] = search.global_batch // (b * est[C.DATA_PARALLEL].to_numpy(dtype=np.int64))
        est[GLOBAL_BATCH] = search.global_batch
        est[PRICE] = np.nan if gpu.price_usd is None else float(gpu.price_usd)
        est[COST] = est[PRICE] * n
        est[PRICE_PER_HOUR] = np.nan if gpu.price_usd_per_hour is None else float(gpu.price_usd_per_hour)
        est[COST_PER_HOUR] = est[PRICE_PER_HOUR] * n
        if C.HOST not in est.columns:
            est[C.HOST] = np.int64(0)
        _add_throughput(sc, search, gpu, est)
        kept.append(est)
    if not kept:
        return pd.DataFrame({c: [] for c in OUTPUT_COLUMNS})
    out = pd.concat(kept, ignore_index=True)
    out[RECOMMENDED] = _recommended(out, search.rank_by)
    cols = {c: out[c] for c in OUTPUT_COLUMNS if c in out.columns}
    cols[C.GPU] = out[C.GPU].astype(str)
    cols[C.CHECKPOINTING] = out[C.CHECKPOINTING].astype(str)
    return pd.DataFrame(cols)[[c for c in OUTPUT_COLUMNS if c in cols]]


def _add_throughput(sc: Scenario, search: ClusterSearch, gpu: GPUSpec, est: pd.DataFrame) -> None:
    """The throughput columns of one GPU type's options (in place): one estimate per recomputation mode."""
    cols = {k: np.full(len(est), np.nan) for k in (MFU, TOKENS_PER_S_PER_GPU, TIME_PER_BILLION, COST_PER_BILLION)}
    if has_tokens(sc.model):
        opts = sc.throughput or THROUGHPUT_DEFAULTS
        ck = est[C.CHECKPOINTING].astype(str).to_numpy()
        n = est[GPUS].to_numpy(dtype=np.int64)
        for mode in np.unique(ck):
            f = training_figures(sc.model, gpu, str(search.fixed[C.PRECISION]), str(mode), search.seq_len, 1, opts)
            at = ck == mode
            cols[MFU][at] = f.mfu.value
            cols[TOKENS_PER_S_PER_GPU][at] = f.tokens_per_s_per_gpu
            cols[TIME_PER_BILLION][at] = f.seconds_per_billion_tokens / n[at]
            cols[COST_PER_BILLION][at] = f.cost_per_billion_tokens_usd
    for k, v in cols.items():
        est[k] = v


def _price_basis(out: pd.DataFrame) -> str | None:
    """The cost every GPU type has: per hour first, then purchase; None when some type has neither."""
    for col in (COST_PER_HOUR, COST):
        if out[col].notna().all():
            return col
    return None


def _recommended(out: pd.DataFrame, rank_by: str = "gpus") -> np.ndarray:
    """rank_by gpus: True on the cheapest option when every GPU type has a price, else on each type's fewest-GPU
    option. cost_per_token: True on the option with the lowest cost per 10⁹ tokens (ties: the fewest GPUs, then
    the scenario's GPU order; rows are sorted by GPU type in that order, then by GPUs)."""
    rec = np.zeros(len(out), dtype=bool)
    if rank_by == "cost_per_token":
        cost = out[COST_PER_BILLION].to_numpy(dtype=float)
        if np.isfinite(cost).any():
            order = np.lexsort((np.arange(len(out)), out[GPUS].to_numpy(dtype=np.int64),
                                np.where(np.isfinite(cost), cost, np.inf)))
            rec[order[0]] = True
            return rec
    gpu = out[C.GPU].astype(str).to_numpy()
    first = ~pd.Series(gpu).duplicated().to_numpy()  # each type's fewest-GPU row comes first (sorted by GPUs)
    basis = _price_basis(out)
    if basis is None:
        return first
    cost = out[basis].to_numpy(dtype=float)
    cand = np.flatnonzero(first)
    rec[cand[np.argmin(cost[cand])]] = True  # argmin: the first of equal costs (scenario GPU order)
    return rec


# ---------------------------------------------------------------------------------------------------- the scenario

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "description": "How many GPUs (train mode): the fewest GPUs of each listed type, and a parallel configuration, "
                   "that hold a global batch with headroom; the cheapest when gpus[] carry price_usd or "
                   "price_usd_per_hour. Writes cluster_options.csv and the report's 'Cluster options'.",
    "properties": {
        "global_batch": {"type": "integer", "minimum": 1, "maximum": 1048576,
                         "description": "Sequences per optimizer step (all data-parallel ranks together)."},
        "tokens_per_step": {"type": "integer", "minimum": 1, "maximum": 2**40,
                            "description": "Tokens per optimizer step; global_batch = tokens_per_step / seq_len."},
        "seq_len": {"type": "integer", "minimum": 1, "maximum": 16777216,
                    "description": "Tokens per sequence; default the target's seq_len, else the grid's first."},
        "max_gpus": {"type": "integer", "minimum": 1, "maximum": 1048576,
                     "description": f"Largest GPU count considered (default {DEFAULT_MAX_GPUS})."},
        "tensor_parallel": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1,
                                                                      "maximum": 1024},
                            "description": "TP degrees tried, at most the node's GPUs (default 1, 2, 4, 8)."},
        "pipeline_parallel": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1,
                                                                        "maximum": 1024},
                              "description": "Pipeline stages tried (default 1, 2, 4, 8, 16)."},
        "micro_batch": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1,
                                                                  "maximum": 1048576},
                        "description": "Micro-batch sizes tried (default 1, 2, 4, 8)."},
        "zero_stage": {"type": "array", "minItems": 1, "items": {"enum": [0, 1, 2, 3]},
                       "description": "ZeRO stages tried (default 0, 1, 2, 3)."},
        "checkpointing": {"type": "array", "minItems": 1, "items": {"enum": ["none", "selective", "full"]},
                          "description": "Recomputation tried (default: the grid's checkpointing values)."},
        "rank_by": {"enum": list(RANK_BY),
                    "description": "How the recommended option is chosen: gpus (default) = each type's fewest GPUs, "
                                   "the cheapest of them when every GPU has a price; cost_per_token = the lowest "
                                   "estimated cost per 10^9 tokens trained (price_usd_per_hour x GPU-hours at the "
                                   "throughput estimate's MFU), ties to the fewest GPUs; needs price_usd_per_hour "
                                   "on every GPU."},
    },
    "oneOf": [{"required": ["global_batch"]}, {"required": ["tokens_per_step"]}],
}


def parse_cluster(given: dict, sc_grid: dict, target: dict, model, mode: str, gpus_per_node: int,
                  host_memory_bytes: int, parallel: dict | None = None
                  ) -> tuple[ClusterSearch | None, list[tuple[str, str]]]:
    """The `cluster:` block (already schema-valid) -> (ClusterSearch, problems as (key path, message)).
    `parallel`: the scenario's parallel axes, whose first fp32_grad_accumulation and gradient_sync values the search
    keeps."""
    bad: list[tuple[str, str]] = []
    if mode != "train":
        return None, [("cluster", "the cluster search applies to train mode only (serving: see the serving plan's "
                                  "tensor_parallel)")]
    if model is None:
        return None, []
    seq = given.get("seq_len") or (target or {}).get(C.SEQ_LEN) or (sc_grid.get(C.SEQ_LEN) or (1,))[0]
    if "tokens_per_step" in given:
        tokens = int(given["tokens_per_step"])
        if tokens % seq:
            return None, [("cluster.tokens_per_step", f"{tokens:,} tokens per step is not a whole number of "
                                                      f"sequences of {seq:,} tokens")]
        global_batch = tokens // seq
    else:
        global_batch = int(given["global_batch"])
    micro = tuple(dict.fromkeys(given.get("micro_batch", DEFAULT_MICRO)))
    if not any(global_batch % b == 0 for b in micro):
        bad.append(("cluster.micro_batch", f"no micro-batch size divides the global batch of {global_batch:,} "
                                           "sequences"))
    ck = tuple(dict.fromkeys(given.get("checkpointing", sc_grid.get(C.CHECKPOINTING) or ("none",))))
    if model.kind != "transformer":
        tps, pps = (1,), (1,)
    else:
        tps = tuple(dict.fromkeys(given.get("tensor_parallel", DEFAULT_TP)))
        pps = tuple(dict.fromkeys(given.get("pipeline_parallel", DEFAULT_PP)))
    fixed = {}
    for axis in (C.PRECISION, C.OPTIMIZER, C.OPTIMIZER_IMPL, C.ATTENTION):
        values = tuple(sc_grid.get(axis) or ())
        chosen = (target or {}).get(axis)
        fixed[axis] = chosen if chosen in values else (values[0] if values else None)
    fixed[C.FP32_GRAD_ACCUMULATION] = bool(((parallel or {}).get(C.FP32_GRAD_ACCUMULATION) or (False,))[0])
    for axis in KEPT_AXES:  # as the scenario says
        fixed[axis] = ((parallel or {}).get(axis) or (C.PARALLEL_DEFAULTS[axis],))[0]
    if fixed[C.GRADIENT_SYNC] != C.PARALLEL_DEFAULTS[C.GRADIENT_SYNC] and model.kind != "transformer":
        bad.append((f"parallel.{C.GRADIENT_SYNC}", "the cluster search keeps gradients unsharded (gradient_sync "
                                                   "last) for transformers only"))
    search = ClusterSearch(global_batch=global_batch, seq_len=int(seq), max_gpus=int(given.get("max_gpus",
                           DEFAULT_MAX_GPUS)), gpus_per_node=gpus_per_node, tensor_parallel=tps,
                           pipeline_parallel=pps, micro_batch=micro,
                           zero_stage=tuple(dict.fromkeys(given.get("zero_stage", DEFAULT_ZERO))),
                           checkpointing=ck, host_memory_bytes=host_memory_bytes, fixed=fixed,
                           rank_by=str(given.get("rank_by", RANK_BY[0])))
    return (None if bad else search), bad


# ---------------------------------------------------------------------------------------------------- words

def describe(row: dict) -> str:
    """'tp 4 · pp 2 · dp 8 · ZeRO 1 · micro-batch 2 × 32 accumulation steps · full recomputation'."""
    parts = [f"TP {row[C.TENSOR_PARALLEL]}" + (" + SP" if row.get(C.SEQUENCE_PARALLEL) else ""),
             f"PP {row[C.PIPELINE_PARALLEL]}", f"DP {row[C.DATA_PARALLEL]}", f"ZeRO {row[C.ZERO_STAGE]}",
             f"micro-batch {row[C.BATCH]} × {row[ACCUMULATION]} accumulation steps"]
    ck = str(row[C.CHECKPOINTING])
    parts.append("no recomputation" if ck == "none" else f"{ck} recomputation")
    return ", ".join(parts)


def recommendation(options: pd.DataFrame, names: dict[str, str], gib, rank_by: str = "gpus") -> str:
    """The report's one-line recommendation (gib: bytes -> 'x.x GiB')."""
    if not len(options):
        return "No configuration searched fits any listed GPU: raise cluster.max_gpus or allow more recomputation."
    rows = options[options[RECOMMENDED].to_numpy()].to_dict("records")
    if rank_by == "cost_per_token" and len(rows) == 1 and pd.notna(rows[0][COST_PER_BILLION]):
        r = rows[0]
        return (f"Lowest estimated cost per 10^9 tokens trained: {r[GPUS]:,} × {names.get(r[C.GPU], r[C.GPU])} "
                f"(${r[COST_PER_BILLION]:,.0f} per 10^9 tokens at {r[MFU]:.0%} MFU) with {describe(r)}: "
                f"{gib(r[C.TOTAL])} of {gib(r[C.USABLE])} usable per GPU.")
    basis = _price_basis(options)
    if basis is not None:
        r = rows[0]
        cost = (f"${r[COST_PER_HOUR]:,.2f} per hour" if basis == COST_PER_HOUR else f"${r[COST]:,.0f}")
        return (f"Cheapest: {r[GPUS]:,} × {names.get(r[C.GPU], r[C.GPU])} ({cost}) with {describe(r)}: "
                f"{gib(r[C.TOTAL])} of {gib(r[C.USABLE])} usable per GPU.")
    each = "; ".join(f"{r[GPUS]:,} × {names.get(r[C.GPU], r[C.GPU])} ({describe(r)})" for r in rows)
    return f"Fewest GPUs of each type: {each}. No prices given for every GPU, so no type is preferred."
