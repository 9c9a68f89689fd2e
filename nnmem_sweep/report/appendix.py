"""The report's appendix sections built from data: "Formulas and sources" (the formulas registered in the code,
formulas.py) and "Validation" (accuracy.compare's measured vs estimated table, and published_compare's published
real-GPU measurements against their estimates)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from .. import published_compare as P
from .format import DASH, gib_number, signed_percent


def formulas(all_formulas: list, sc: Any = None) -> list[dict[str, Any]]:
    """Every formula but the stated assumptions ('*.assumptions.*'), which the Assumptions section lists where they
    apply; with a scenario `sc`, only those its rows can use (applies())."""
    return [{"name": f.name, "expression": f.expression, "where": f.where, "module": f.module, "note": f.note,
             "sources": [{"key": s.key, "title": s.title, "ref": s.ref} for s in f.sources]} for f in all_formulas
            if ".assumptions." not in f.name and (sc is None or applies(f, sc))]


# formulas of a kind of scenario, by the module that implements them: (module prefix, what the scenario needs)
_ONLY_FOR = (
    ("nnmem_sweep.components.finetune", "finetune"), ("nnmem_sweep.parallel.", "parallel"),
    ("nnmem_sweep.serving", "serving"), ("nnmem_sweep.components.kv", "infer"),
    ("nnmem_sweep.throughput.inference", "infer"), ("nnmem_sweep.throughput.training", "train"),
    ("nnmem_sweep.components.optimizer", "train"), ("nnmem_sweep.models.layers", "layers"),
    ("nnmem_sweep.components.derived", "derived"), ("nnmem_sweep.derive.", "derived"),
    ("nnmem_sweep.components.cpu_kernels", "cpu"),  # CPU measurements only (accuracy): never a GPU plan's
)
# and by the formula's name, where a module serves several kinds: (name prefix, what the scenario needs)
_NAMED_FOR = (
    ("parallel.fsdp", "fsdp"), ("parallel.deepspeed", "deepspeed"),  # a layout family's own, where it has one
    ("parallel.deepspeed_adapter", "finetune"),
    ("parallel.", "parallel"), ("activation_bytes.layers", "layers"), ("activation_bytes.params", "params"),
    ("throughput.decode_", "infer"), ("throughput.inference_", "infer"), ("throughput.training_", "train"),
)


def applies(f: Any, sc: Any) -> bool:  # noqa: ANN401 - a citations.Formula, a Scenario
    """Whether formula `f` can enter a row of scenario `sc`: a fine-tune's formulas where the model is fine-tuned,
    a parallel layout's where the scenario has one (FSDP's and DeepSpeed's only where a layout is theirs), serving's
    and the KV cache's in infer mode, the optimizers' and training throughput's in train mode, a layer list's for a
    layer-list model (a parameter count's for a model of parameters), a derived plan's where the model or its replayed reserve is planned from code; a per-kind formula
    ('name.kind') only where the grid has that kind (an optimizer, a quantized precision)."""
    from ..parallel.layout import deepspeed_layouts
    from ..serving import applies as serving_applies

    model = sc.model
    deepspeed = bool(sc.parallel) and deepspeed_layouts(sc.parallel)
    replayed = sc.overheads.replayed_reserve_fraction is not None
    have = {"finetune": model.finetune is not None, "parallel": bool(sc.parallel), "serving": serving_applies(sc),
            "infer": sc.mode == "infer", "train": sc.mode == "train", "layers": model.kind == "layers",
            "params": model.kind == "params", "derived": model.kind == "derived" or replayed, "cpu": False,
            "deepspeed": deepspeed, "fsdp": bool(sc.parallel) and not deepspeed_layouts(sc.parallel, every=True)}
    if any(f.module.startswith(prefix) and not have[need] for prefix, need in _ONLY_FOR) or \
            any(f.name.startswith(prefix) and not have[need] for prefix, need in _NAMED_FOR):
        return False
    kind = f.name.partition(".")[2]
    if f.name.startswith("optimizer_state_bytes.") and kind != "full":
        return kind in {str(o) for o in sc.grid.get("optimizer", ())}
    if f.name.startswith("quantized_weight_bytes."):
        return kind in {str(p) for p in sc.grid.get("precision", ())} or model.finetune is not None
    return True


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


def _published_range(low: int, high: int) -> str:
    lo, hi = gib_number(low, 2), gib_number(high, 2)
    return lo if lo == hi else f"{lo}–{hi}"


def published(table: pd.DataFrame | None) -> dict[str, Any] | None:
    """The published real-GPU measurements the estimator takes (published_compare's frame): source, statistic,
    published range and estimate in GiB, signed error to the range's nearest end, and why a miss misses."""
    if table is None or len(table) == 0:
        return None
    est = P.estimated(table)
    # why a figure misses goes on a line of its own under its row (a column of it made every row a page tall)
    rows = [{"cells": [f"{r[P.FILE].removesuffix('.json')}: {r[P.ID]}", r[P.STATISTIC],
                       _published_range(r[P.LOW], r[P.HIGH]), gib_number(r[P.ESTIMATED], 2),
                       signed_percent(r[P.ERROR]), "yes" if r[P.WITHIN] else "no", "yes" if r[P.IN_SAMPLE] else "no"],
             "why": r[P.WHY] or ""} for r in est.to_dict("records")]
    s = P.summary(table)
    stats = (f"{s['estimated']} of {s['measurements']} published figures estimated (the others lack what the "
             f"estimator needs, as each source file says); median |error| {s['median_abs_error'] * 100:.1f}%, largest "
             f"under {s['max_under'] * 100:+.1f}%, largest over {s['max_over'] * 100:+.1f}%; {s['within_target']} "
             f"within −{P.TARGET_UNDER * 100:.0f}% .. +{P.TARGET_OVER * 100:.0f}%, {s['in_sample']} in sample (the "
             f"model's own data holds that figure), {s['within_target_out_of_sample']} of "
             f"{s['estimated'] - s['in_sample']} out-of-sample within target.")
    return {"headers": ["source: id", "statistic", "published (GiB)", "estimated (GiB)", "error", "within target",
                        "in sample"], "rows": rows, "stats": stats}


def validation(table: pd.DataFrame | None, published_table: pd.DataFrame | None = None,
               gpu_evidence: dict[str, Any] | None = None,
               sharded_table: pd.DataFrame | None = None) -> dict[str, Any] | None:
    """Measured vs estimated (accuracy.compare's frame): one row per case, GiB and signed relative error; with
    published_compare's frame, the published real-GPU measurements too (`published`); with `gpu_evidence`, the
    allocator snapshots of real GPUs replayed (`snapshots`) and the committed GPU-kit runs (`gpu_runs`); with
    `sharded_table` (the sharded steps' cases compared), a line of their figures (`sharded`)."""
    extra = {"published": published(published_table), **_gpu_evidence(gpu_evidence),
             "sharded": sharded_line(sharded_table)}
    if table is None or len(table) == 0:
        if not any(extra.values()):
            return None
        return {"headers": [], "rows": [], "count": "0", "stats": "", **extra}
    cols = [(c, h) for c, h in _VALIDATION_COLUMNS if c in table.columns]
    rows = [[_cell(c, v) for (c, _), v in zip(cols, rec)]
            for rec in table[[c for c, _ in cols]].itertuples(index=False, name=None)]
    stats = ""
    err = _abs_errors(table)
    if len(err):
        stats = (f"Median |error| {err.median() * 100:.1f}%, largest {err.max() * 100:.1f}% over {len(err)} "
                 f"cases the estimator could take")
        if "within_tolerance" in table.columns:
            stats += f"; {int(table['within_tolerance'].sum())} of {len(table)} within their stated tolerance"
        stats += "."
    return {"headers": [h for _, h in cols], "rows": rows, "count": str(len(rows)), "stats": stats, **extra}


def _abs_errors(table: pd.DataFrame) -> pd.Series:
    """|error| of the cases accuracy.compare could estimate (finite; empty where the frame has no errors)."""
    if "error" not in table.columns:
        return pd.Series(dtype=float)
    err = table["error"].abs().dropna()
    return err[np.isfinite(err)]


def sharded_line(table: pd.DataFrame | None) -> str:
    """One sentence of the sharded steps' cases: how many of each framework, the median and largest |error| of the
    peak, how many within their tolerance ("" without cases)."""
    if table is None or not len(table):
        return ""
    by = table["sharded_by"].astype(str).value_counts()
    err = _abs_errors(table)
    if not len(err):
        return ""
    fsdp = " and ".join(f"{int(by[f])} of {f}" for f in ("FSDP2", "FSDP1") if by.get(f, 0))
    return (f"Besides these, {len(table)} cases of one rank of a sharded step ({fsdp} on PyTorch's fake "
            f"process group, tests/data/truth/sharded; {int(by.get('DeepSpeed', 0))} of DeepSpeed's ZeRO engine, "
            "tests/data/truth/deepspeed, "
            f"ZeRO-1/2's on both end ranks, the larger taken): median |error| {err.median() * 100:.2f}%, largest "
            f"{err.max() * 100:.2f}%, {int(table['within_tolerance'].sum())} within their stated tolerance "
            "(make accuracy lists them).")


def _gpu_evidence(ev: dict[str, Any] | None) -> dict[str, Any]:
    """The allocator snapshots replayed (allocator/snapshot.evidence) and the kit runs (gpu_compare.run_summaries),
    as the template shows them."""
    if ev is None:
        return {"snapshots": None, "gpu_runs": None}
    snaps = ev.get("snapshots") or []
    rows = [[s["name"], f"{s['source'].get('repository', '').removeprefix('https://github.com/')} "
             f"{s['source'].get('path', '')} @ {str(s['source'].get('commit', ''))[:10]}",
             f"{s['events']:,}", f"{s['segments_made']:,}", f"{s['segments']:,}",
             gib_number(s["peak_reserved_bytes"], 2),
             "yes" if s["ok"] else f"no: {s['difference']}"] for s in snaps]
    ok = sum(s["ok"] for s in snaps)
    snapshots = None if not snaps else {
        "headers": ["snapshot", "source (repository, file @ commit)", "events", "segments made", "segments at the end",
                    "peak reserved (GiB)", "block for block"], "rows": rows,
        "stats": f"{ok} of {len(snaps)} replayed block for block: every segment the GPU made, where and as large as it "
                 "made it, every block at the GPU's address, the layout at the end and the peak reserved. Each replay "
                 "is told the address of each segment the GPU made, so that ties between equal free blocks fall as "
                 "on the GPU (the lowest address); a plan's replays cannot know the addresses: they replay both "
                 "orders of their own (each new segment above the last, or below it) and take the larger need. "
                 "Segments made are those the recording made; at the end are all it ends with, those made before "
                 "it too. Segments made can outnumber those at the end: the GPU kit empties the cache once its "
                 "model is built, and a failed cudaMalloc releases every cached segment before it retries (select_n's "
                 "offloading run: 39 failed cudaMalloc calls); the replay must release the same segments. A recording "
                 "on several CUDA streams is replayed with a pool per stream."}
    runs = ev.get("gpu_runs")
    if runs is None:
        return {"snapshots": snapshots, "gpu_runs": None}
    lines = []
    for r in runs:
        figs = "; ".join(f"{label} median |error| {v[0] * 100:.1f}%, largest {v[1] * 100:.1f}% ({v[2]} points)"
                         for label, v in ((k, r.get(k)) for k in ("peak allocated", "least capacity",
                                                                  "outside PyTorch")) if v)
        missing = r.get("least capacity not measured") or 0
        lines.append(f"{r['gpu']}, {r['run']} ({r['stack']}): {r['measured']} of {r['points']} points measured"
                     + (f"; {figs}" if figs else "")
                     + (f"; least capacity not measured on {missing} point{'s' if missing > 1 else ''} (no capped run "
                        "completed at the figure, the bisection stopped, or a run left tensors behind: make accuracy "
                        "says which)"
                        if missing else ""))
    return {"snapshots": snapshots, "gpu_runs": {"lines": lines or [
        "none committed yet: the GPU kit (`make gpu-check`, validation/gpu.yaml) measures each claim no GPU has "
        "confirmed (the replayed reserve, the memory outside PyTorch, throughput) on the first GPU lent"]}}
