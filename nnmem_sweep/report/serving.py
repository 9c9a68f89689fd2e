"""The report's "Serving capacity" section (infer scenarios): the serving plan's frames -> formatted tables, a chart
and the plan's assumptions. All selection and formatting happens here; the template only lays it out."""
from __future__ import annotations

from typing import Any

import pandas as pd

from .. import columns as C
from ..components.kv import CacheLayer, cache_layers
from ..scenario import Scenario
from ..serving import options
from . import charts
from .tables import level
from .format import DASH, gib, percent, thousands

MAX_ROWS = 24  # rows of a serving table (tensor_parallel x precision x kv_dtype); the CSV has them all
GPU_COLUMNS = 7  # GPU columns per table beside the three axis columns


def _gpus(sc: Scenario, frame: pd.DataFrame) -> list:
    present = set(frame[C.GPU].astype(str))
    return sorted((g for g in sc.gpus if g.id in present), key=lambda g: (g.memory_bytes, g.name))


def _grid_tables(sc: Scenario, frame: pd.DataFrame, row_keys: list[str], value: str, caption: str,
                 fmt=thousands) -> list[dict[str, Any]]:
    """Rows: the distinct `row_keys` values in frame order; columns: GPUs smallest first; cells: `value`."""
    gpus = _gpus(sc, frame)
    top = int(frame[value].max()) if len(frame) else 0
    lookup = {tuple(str(v) for v in rec[:-1]): int(rec[-1])
              for rec in frame[row_keys + [C.GPU, value]].itertuples(index=False, name=None)}
    keys = list(dict.fromkeys(tuple(str(v) for v in rec)
                              for rec in frame[row_keys].itertuples(index=False, name=None)))
    truncated = len(keys) > MAX_ROWS
    rows = []
    for key in keys[:MAX_ROWS]:
        cells = [lookup.get(key + (g.id,)) for g in gpus]
        rows.append({"axes": [thousands(int(k)) if k.isdigit() else k for k in key],
                     "cells": [{"text": DASH if not c else fmt(c), "level": level(c or 0, top)} for c in cells]})
    tables = []
    for start in range(0, len(gpus), GPU_COLUMNS):
        chunk = gpus[start:start + GPU_COLUMNS]
        part = f" (GPUs {start + 1}–{start + len(chunk)} of {len(gpus)})" if len(gpus) > GPU_COLUMNS else ""
        tables.append({
            "caption": caption + part + (f"; the first {MAX_ROWS} rows, all in the CSV" if truncated else ""),
            "axis_headers": [h.replace("_", " ") for h in row_keys],
            "gpu_headers": [{"name": g.name, "memory": gib(g.memory_bytes)} for g in chunk],
            "rows": [{"axes": r["axes"], "cells": r["cells"][start:start + len(chunk)]} for r in rows],
        })
    return tables


def section(sc: Scenario, plan: pd.DataFrame | None, by_concurrency: pd.DataFrame | None,
            reference: dict[str, Any]) -> dict[str, Any] | None:
    """The section's context, or None when the run has no serving plan (training, non-transformers)."""
    if plan is None or by_concurrency is None or not len(plan):
        return None
    opt = options(sc)
    ref_ctx = int(reference.get(C.SEQ_LEN, 0)) + int(reference.get(C.DECODE_TOKENS, 0))
    contexts = sorted(int(c) for c in plan[C.CONTEXT].unique())
    if ref_ctx not in contexts:
        ref_ctx = contexts[0]
    tp0, kv0 = opt["tensor_parallel"][0], opt["kv_dtype"][0]
    prec = str(reference.get(C.PRECISION, sc.grid[C.PRECISION][0]))
    keys = [C.TENSOR_PARALLEL, C.PRECISION, C.KV_DTYPE]
    at_ctx = plan[plan[C.CONTEXT] == ref_ctx]
    combo = (by_concurrency[C.TENSOR_PARALLEL] == tp0) & (by_concurrency[C.PRECISION].astype(str) == prec) \
        & (by_concurrency[C.KV_DTYPE].astype(str) == kv0)
    tables = _grid_tables(sc, at_ctx, keys, C.MAX_CONCURRENT,
                          f"Concurrent sequences of {ref_ctx:,} tokens (prompt + generated) per GPU")
    layers = cache_layers(sc.model, prec)
    windowed = any(x.window for x in layers)
    tables += _grid_tables(sc, at_ctx, keys, C.KV_TOKENS_FIT, "KV-cache tokens that fit per GPU" + (
        " (every layer holding each token; sliding-window layers stop at their window)" if windowed else ""))
    tables += _grid_tables(sc, by_concurrency[combo], [C.CONCURRENCY], C.MAX_CONTEXT,
                           f"Longest context (tokens) at each concurrency, tensor parallel {tp0}, {prec} weights, "
                           f"KV cache {kv0}")

    pick = (plan[C.TENSOR_PARALLEL] == tp0) & (plan[C.PRECISION].astype(str) == prec) \
        & (plan[C.KV_DTYPE].astype(str) == kv0)
    sub = plan[pick]
    series = []
    for g in _gpus(sc, sub):
        per = sub[sub[C.GPU].astype(str) == g.id].set_index(C.CONTEXT)[C.MAX_CONCURRENT]
        series.append((g.name, [int(per.get(c, 0)) for c in contexts]))
    chart = charts.concurrency_chart("Concurrent sequences against context", contexts, series)
    block = opt["kv_block_size"]
    return {
        "tables": tables,
        "chart": chart,
        "chart_about": f"tensor parallel {tp0}, {prec} weights, KV cache {kv0}",
        "utilization": percent(opt["gpu_memory_utilization"]),
        "profile_tokens": f"{opt['max_num_batched_tokens']:,}",
        "prefill_logits": ("every prompt position (serving.prefill_logits: all)" if opt["prefill_logits"] == "all"
                           else "the last position only, as generate() computes them"),
        "blocks": f"whole blocks of {block:,} tokens" if block else "exactly the tokens held (no paging)",
        "kv_dtypes": ", ".join(opt["kv_dtype"]),
        "tensor_parallel": ", ".join(str(t) for t in opt["tensor_parallel"]),
        "cache": cache_sentence(layers, derived=sc.model.kind == "derived", precision=prec),
    }


def _heads(x: CacheLayer) -> str:
    k, v = f"{x.k_heads:,} × {x.k_width:,}", f"{x.v_heads:,} × {x.v_width:,}"
    return f"K and V {k}" if k == v else f"K {k}, V {v}"


def cache_sentence(layers: tuple[CacheLayer, ...], derived: bool, precision: str) -> str:
    """What a sequence's cache holds, layer by layer, for the report (the serving section's note)."""
    shapes: dict[str, int] = {}
    held: dict[int | None, int] = {}
    for x in layers:
        shapes[_heads(x)] = shapes.get(_heads(x), 0) + 1
        held[x.window] = held.get(x.window, 0) + 1
    per_token = sum(x.k_heads * x.k_width * x.k_bytes + x.v_heads * x.v_width * x.v_bytes for x in layers)
    text = (f"The cache holds {len(layers):,} layers of "
            + "; ".join(f"{h} (heads × width){'' if n == len(layers) else f' in {n:,}'}" for h, n in shapes.items())
            + f", {per_token:,} B per token with every layer holding it ({precision}, KV dtype auto)")
    windows = sorted(w for w in held if w is not None)
    if windows:
        parts = [f"{held[w]:,} hold at most {w:,} tokens (sliding window)" for w in windows]
        if None in held:
            parts.append(f"{held[None]:,} hold every token")
        text += ": " + ", ".join(parts)
    text += (". Read from the KV cache the model's own code fills (transformers' DynamicCache after a prefill and a "
             "decode step, checked at several contexts on both sides of each window)" if derived
             else ". From the model's configuration")
    text += (". A layer with fewer KV heads than the tensor-parallel degree keeps one head on every GPU (a replica: "
             "multi-query, MLA's latent), as vLLM does")
    if windows and None in held:
        text += ("; vLLM's hybrid KV cache manager groups each kind of layer into groups of equal size and may pad "
                 "them with unused layers, which this plan does not count")
    return text + "."
