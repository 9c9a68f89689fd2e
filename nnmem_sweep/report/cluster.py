"""The report's "Cluster options" section (scenarios with a `cluster:` block): cluster_options.csv -> a table of
GPU type x count x configuration x memory per GPU x cost x estimated throughput, and the one-line recommendation.
Formatting only; the search, its throughput columns and the recommendation rule are in nnmem_sweep/cluster.py."""
from __future__ import annotations

from typing import Any

import pandas as pd

from .. import cluster as K
from .. import columns as C
from ..scenario import Scenario
from .format import DASH, duration, gib, percent, rate, thousands, usd


def _money(v: Any, per_hour: bool) -> str:
    if v is None or pd.isna(v):
        return DASH
    return f"${v:,.2f}/h" if per_hour else f"${v:,.0f}"


def section(sc: Scenario, options: pd.DataFrame | None) -> dict[str, Any] | None:
    if options is None or sc.cluster is None:
        return None
    search = sc.cluster
    names = {g.id: g.name for g in sc.gpus}
    rows = []
    shown = options.groupby(C.GPU, sort=False, observed=True).head(K.OPTIONS_PER_GPU)
    for r in shown.to_dict("records"):
        cost = r[K.COST_PER_HOUR] if pd.notna(r[K.COST_PER_HOUR]) else r[K.COST]
        rows.append({
            "gpu": names.get(r[C.GPU], r[C.GPU]),
            "gpus": thousands(r[K.GPUS]),
            "nodes": thousands(r[K.NODES]),
            "layout": f"TP {r[C.TENSOR_PARALLEL]}{' + SP' if r[C.SEQUENCE_PARALLEL] else ''} · PP "
                      f"{r[C.PIPELINE_PARALLEL]} · DP {r[C.DATA_PARALLEL]} · ZeRO {r[C.ZERO_STAGE]}",
            "batching": f"{r[C.BATCH]} × {thousands(r[K.ACCUMULATION])}",
            "checkpointing": str(r[C.CHECKPOINTING]),
            "memory": gib(r[C.TOTAL]),
            "used": f"{r[C.TOTAL] / r[C.USABLE]:.1%}" if r[C.USABLE] else DASH,  # one decimal: a column
            "cost": _money(cost, pd.notna(r[K.COST_PER_HOUR])),
            "speed": DASH if pd.isna(r[K.TOKENS_PER_S_PER_GPU]) else
            f"{rate(r[K.TOKENS_PER_S_PER_GPU])} ({percent(r[K.MFU], 0)})",
            "time": duration(r[K.TIME_PER_BILLION]),
            "cost_per_token": usd(r[K.COST_PER_BILLION]),
            "recommended": bool(r[K.RECOMMENDED]),
        })
    missing = [g.name for g in sc.gpus if g.id not in set(options[C.GPU].astype(str))]
    fixed = ", ".join(f"{k.replace('_', ' ')} {('on' if v else 'off') if isinstance(v, bool) else v}"
                      for k, v in search.fixed.items() if v is not None)
    return {
        "recommendation": K.recommendation(options, names, gib, search.rank_by),
        "target": f"{thousands(search.global_batch)} sequences of {thousands(search.seq_len)} tokens per optimizer "
                  f"step ({thousands(search.global_batch * search.seq_len)} tokens)",
        "fixed": fixed,
        "search": (f"tensor parallel {', '.join(map(str, search.tensor_parallel))} (at most the node's "
                   f"{search.gpus_per_node} GPUs); pipeline parallel {', '.join(map(str, search.pipeline_parallel))}; "
                   f"micro-batch {', '.join(map(str, search.micro_batch))}; ZeRO stage "
                   f"{', '.join(map(str, search.zero_stage))}; recomputation {', '.join(search.checkpointing)}; "
                   f"at most {thousands(search.max_gpus)} GPUs"),
        "rows": rows,
        "priced": bool(options[[K.COST, K.COST_PER_HOUR]].notna().any(axis=None)),
        "hourly": bool(options[K.COST_PER_BILLION].notna().any()),
        "rank_by": ("the lowest estimated cost per 10^9 tokens trained (rank_by: cost_per_token)"
                    if search.rank_by == "cost_per_token" else
                    "each type's fewest GPUs, the cheapest of them when every GPU has a price (rank_by: gpus)"),
        "per_gpu": str(K.OPTIONS_PER_GPU),
        "none_fit": ", ".join(missing),
    }
