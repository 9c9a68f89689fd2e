"""Real-GPU measurements beside the estimate: the kit's committed runs (validation/gpu/<gpu>/<date>/, written by
`make gpu-check`) and `nnmem-sweep measure --device cuda`. No torch needed.

Per point, what the GPU measured and what the estimate says for the same configuration on that GPU (its
mem_get_info total, its generation, the CUDA and torch releases that ran):
  - peak allocated: max_memory_allocated over the measured steps vs peak_allocated_bytes + the library
    workspaces (cuBLAS's go through the caching allocator: max_memory_allocated counts them);
  - least capacity: the least allocator cap in which the step completed (a bisection of
    set_per_process_memory_fraction) vs reserved_bytes (peak + workspaces + the replayed reserve of that point,
    fresh or resumed as the point ran: replays.point_reserve);
  - outside PyTorch: mem_get_info's used minus memory_reserved vs non_torch_bytes (the CUDA context);
  - max_memory_reserved with memory to spare, shown beside (what nvidia-smi users see, not what a step needs).
Errors are (estimate − measured) / measured: negative is an under-prediction, the out-of-memory a plan exists to
prevent.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import columns as C
from .accuracy import architecture_of, case_frame
from .catalog.gpus import list_gpus
from .components.runtime import nccl_bytes
from .derive import stored_only
from .estimate import estimate_frame
from .derive.arch import derived_twin
from .replays import point_reserve
from .scenario import DEFAULT_HEADROOM, GPUSpec, Overheads
from .throughput.plan import has_tokens, training_figures
from .units import format_bytes

VALIDATION = Path("validation/gpu")
FIGURES = (  # (label, measured key, estimated key)
    ("peak allocated", "max_allocated", "estimated_allocated"),
    ("least capacity", "least_capacity", "estimated_reserved"),
    ("outside PyTorch", "outside_bytes", "estimated_non_torch"),
)


# a run's start above the workspaces by more than this is an earlier run's tensors (the H100's FSDP1 points left
# 1.3-3.3 GB, 2026-11-28); below it, rounding and the workspaces of another stack
LEFTOVER_FLOOR = 256 * 2**20
STARTS = "starts.json"


def runs(root: Path = VALIDATION) -> list[Path]:
    """Every committed kit run: the folders holding a results.jsonl, oldest first."""
    return sorted(p.parent for p in Path(root).glob("*/*/results.jsonl"))


def load_run(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(env, records) of one run; the last record of a point wins (a rerun appends). A run made before the kit
    recorded start_allocated may have it beside, in starts.json, read off its snapshots (allocator/snapshot.py
    allocated_before)."""
    folder = Path(folder)
    env = json.loads((folder / "env.json").read_text()) if (folder / "env.json").exists() else {}
    starts = json.loads((folder / STARTS).read_text())["start_allocated"] if (folder / STARTS).exists() else {}
    by_id: dict[str, dict[str, Any]] = {}
    for line in (folder / "results.jsonl").read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            if rec["id"] in starts:
                rec.setdefault("start_allocated", starts[rec["id"]])
            by_id[rec["id"]] = rec
    return env, list(by_id.values())


def leftover_bytes(rec: dict[str, Any], workspaces: int) -> int:
    """What a point's run started on top of, beyond the library workspaces an earlier point in the kit's process
    made (the estimate counts those: `workspaces`): an earlier run's tensors that outlived it. 0 below
    LEFTOVER_FLOOR."""
    left = int(rec.get("start_allocated") or 0) - workspaces
    return left if left > LEFTOVER_FLOOR else 0


def gpu_of(env: dict[str, Any]) -> GPUSpec:
    """The catalog GPU the run's device is (same compute capability; the most words of the device's name, e.g.
    "NVIDIA H100 80GB HBM3" is the SXM5 part; then the closest capacity), with the capacity the run saw
    (mem_get_info's total) in place of the catalog's."""
    total = int(env.get("mem_get_info_total") or 0)
    cc = str(env.get("compute_capability") or "")
    words = set(re.findall(r"[a-z0-9]+", str(env.get("gpu") or "").lower())) - {"nvidia", "amd"}
    same = [g for g in list_gpus() if g.compute_capability == cc] or list_gpus()
    best = min(same, key=lambda g: (-len(words & set(re.findall(r"[a-z0-9]+", g.name.lower()))),
                                    abs((g.torch_total_bytes or g.device_total_bytes or g.memory_bytes) - total)))
    return dataclasses.replace(best, memory_bytes=total or best.memory_bytes,
                               source=f"measured: torch.cuda.mem_get_info() total on {env.get('gpu', best.name)}")


def runtime_of(env: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The `runtime:` block of the run: its CUDA and torch releases."""
    out = []
    if env.get("cuda"):
        out.append(("cuda", str(env["cuda"])))
    if env.get("torch"):
        out.append(("torch", str(env["torch"]).split("+")[0]))
    return tuple(out)


def estimate_on(arch, mode: str, frame: pd.DataFrame, gpu: GPUSpec, runtime: tuple[tuple[str, Any], ...] = (),
                resumed: bool = False, device: str = "cuda", allow_deriving: bool = False,
                alloc_conf: str = "") -> dict[str, Any]:
    """The estimate of one measured point (a one-row frame of the grid axes) on `gpu`: allocated (peak +
    workspaces), reserved with the point's own replayed reserve (fresh, or resumed from a checkpoint), non-torch,
    and how the reserve was had (replayed under `alloc_conf`, PYTORCH_CUDA_ALLOC_CONF). device="cpu" (the CPU twin
    of a GPU run): the CPU's kernels, nothing outside or beside the tensors (no context, workspaces, allocator)."""
    frame = frame.assign(**{C.GPU: gpu.id, C.GPU_MEMORY: gpu.memory_bytes})
    host = {"cuda_context_bytes": 0, "cublas_workspace_bytes": 0, "allocator_reserve_fraction": 0.0} \
        if device == "cpu" else {}
    ov = Overheads(gpus=(gpu,), runtime=runtime, **host)
    row = estimate_frame(arch, mode, frame, ov, DEFAULT_HEADROOM, device=device).iloc[0]
    deepspeed = C.REDUCE_BUCKET in frame.columns and int(frame[C.REDUCE_BUCKET].iloc[0]) > 0  # no traced rank
    twin = derived_twin(arch, allow_deriving=True) if (allow_deriving and device == "cuda" and not deepspeed) else None
    if twin is not None and twin is not arch:
        estimate_frame(twin, mode, frame, ov, DEFAULT_HEADROOM)  # derives the twin's plan: its allocation sequence
    frac, note = (None, "the CPU has no caching allocator") if device == "cpu" else \
        point_reserve(arch, mode, row, lazy_state=not resumed, allow_deriving=allow_deriving, alloc_conf=alloc_conf)
    if frac is not None:
        ov = dataclasses.replace(ov, replayed_reserve_fraction=frac)
        row = estimate_frame(arch, mode, frame, ov, DEFAULT_HEADROOM).iloc[0]
    return {"estimated_allocated": int(row[C.PEAK_ALLOCATED]) + int(row[C.ALLOCATOR_EXTRA]),
            "estimated_peak_allocated": int(row[C.PEAK_ALLOCATED]),
            "estimated_reserved": int(row[C.RESERVED]), "estimated_non_torch": int(row[C.NON_TORCH]),
            "estimated_phase": str(row[C.PEAK_PHASE]), "reserve_fraction": frac,
            "reserve_note": note if frac is not None or device == "cpu" else f"5 % default ({note})"}


def estimate_beside(rec: dict[str, Any], gpu: GPUSpec, runtime: tuple[tuple[str, Any], ...],
                    allow_deriving: bool = False) -> dict[str, Any]:
    """estimate_on for a kit record: its case as the truth catalog's cases are estimated (accuracy.py)."""
    c = rec["case"]
    case = {"case_id": rec["id"], "inputs": c, "hf_config": rec.get("hf_config") or {}}
    arch = architecture_of(case)
    out = estimate_on(arch, c["mode"], case_frame(case), gpu, runtime,
                      resumed=bool(rec.get("resume")), allow_deriving=allow_deriving,
                      alloc_conf=str((rec.get("point") or {}).get("allocator") or ""))
    if c["mode"] == "train" and has_tokens(arch) and not c.get("finetune"):
        # the report's training throughput: MFU (sourced default) x the dense peak / model FLOPs per token
        # (throughput/plan.py); a fine-tune's frozen weights skip their gradient GEMMs, which it does not model
        fig = training_figures(arch, gpu, str(c.get("precision", "bf16")), str(c.get("checkpointing") or "none"),
                               int(c.get("seq_len") or 0))
        out |= {"estimated_tokens_per_s": fig.tokens_per_s_per_gpu, "estimated_mfu": fig.mfu.value}
    return out


def measured_least_capacity(rec: dict[str, Any]) -> tuple[int | None, str]:
    """(the record's least capacity, "") where a run at that cap completed (a probe of its bisection, or the
    recording at it), or it comes from a kit that recorded no probes; else (None, why not). The kit used to take
    the top of its bracket (the uncapped run's peak reserved + 0.5 %) unprobed where every probe ran out of memory:
    on the H100's first DeepSpeed run (2026-11-27) every probe and the recording at the top did, the engine of each
    run still allocated under the next."""
    need = rec.get("least_capacity")
    if need is None:
        return None, str(rec.get("bisection_note") or "")
    probes = rec.get("bisection")
    if probes is None or any(p["completed"] and p["cap"] == need for p in probes) or rec.get("capped_snapshot"):
        return int(need), ""
    return None, (f"no capped run completed, not even at {int(need):,} B (the kit's runs of one process each "
                  f"held the last one's engine): not a measurement")


def sharded_world(case: dict[str, Any]) -> int:
    """The ranks of a sharded kit point (its fake process group's world); 1 for one GPU."""
    spec = case.get("deepspeed") or case.get("fsdp") or {}
    return int(spec.get("world", 1))


def errors(row: dict[str, Any]) -> dict[str, float]:
    """(estimate − measured) / measured of each of FIGURES that has both sides."""
    out = {}
    for _, m, e in FIGURES:
        mv, ev = row.get(m), row.get(e)
        out[f"{m}_error"] = (ev - mv) / mv if (mv and ev is not None) else float("nan")
    return out


def compare_run(folder: Path, trace: bool = False) -> tuple[dict[str, Any], pd.DataFrame]:
    """(env, one row per point: measured and estimated figures, errors). Derived plans come from the caches and
    the shipped plans unless `trace` (then a missing one is traced: minutes)."""
    env, records = load_run(folder)
    gpu = gpu_of(env)
    runtime = runtime_of(env)
    rows = []
    for rec in records:
        row: dict[str, Any] = {"point": rec["id"], "why": rec.get("why", "")}
        if "error" in rec:
            rows.append({**row, "status": rec["error"]})
            continue
        row.update({k: rec.get(k) for k in ("max_allocated", "max_reserved", "outside_bytes",
                                            "model_least_capacity")})
        row["least_capacity"], why = measured_least_capacity(rec)
        if (rec.get("point") or {}).get("allocator") and "others_bytes" not in rec:
            # run in a child process by a kit that did not yet take the parent's memory on the GPU off
            # (measure/meters.py, OTHERS_ENV): the figure holds the parent's CUDA context too
            row["outside_bytes"] = None
        row["tokens_per_s"] = rec.get("tokens_per_s") or {}
        try:
            with contextlib.nullcontext() if trace else stored_only():
                row.update(estimate_beside(rec, gpu, runtime, allow_deriving=trace))
            left = leftover_bytes(rec, row["estimated_allocated"] - row["estimated_peak_allocated"])
            if left:  # its peaks count an earlier run's tensors; its caps held them too
                row["max_allocated"] -= left
                row["least_capacity"], row["max_reserved"] = None, None
                why = (f"the run started on top of {left:,} B an earlier point's run left in the kit's process "
                       f"(peak allocated shown net of it)")
            row["status"] = "measured" + (f"; least capacity not measured: {why}" if why else "")
            model = rec.get("model_least_capacity")
            if model:
                row["status"] += (f"; the allocator model on the GPU's own recording needs {model:,} B" +
                                  (f" ({model / row['least_capacity'] - 1:+.1%})" if row["least_capacity"] else ""))
            world = sharded_world(rec["case"])
            if world > 1:  # the kit's fake process group makes no NCCL communicator, and moves nothing
                row["estimated_non_torch"] -= sum(i.bytes for i in nccl_bytes({"data_parallel": world}))
                row.pop("estimated_tokens_per_s", None)
                row["status"] += ("; outside PyTorch without NCCL's buffers, no tokens/s (one rank on a fake "
                                  "process group: no communicator, collectives that move nothing)")
        except Exception as e:  # noqa: BLE001 - a point the estimator cannot take must not hide the others
            row["status"] = f"measured; not estimated: {str(e).splitlines()[0][:200]}"
        row.update(errors(row))
        rows.append(row)
    return env, pd.DataFrame(rows)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v))


def _cell(v: Any, unit: str = "GiB") -> str:
    if _missing(v):
        return "–"
    return format_bytes(int(v), unit, 2)


def _err(v: Any) -> str:
    return "–" if _missing(v) else f"{v:+.1%}"


def _speed(r: dict[str, Any]) -> str:
    """Training tokens/s per GPU beside the report's throughput estimate (an estimate from an assumed MFU: shown,
    not one of FIGURES)."""
    tps, est = r.get("tokens_per_s"), r.get("estimated_tokens_per_s")
    measured = tps.get("train") if isinstance(tps, dict) else None
    if not measured or _missing(est):
        return "–"
    return f"{measured:,.0f} / {est:,.0f} ({est / measured - 1:+.1%}; {r['estimated_mfu']:.0%})"


def format_comparison(env: dict[str, Any], df: pd.DataFrame) -> str:
    """A Markdown table: per point the measured figure, the estimate and the error, for each of FIGURES."""
    head = (f"{env.get('gpu', '?')} ({env.get('nvidia_smi', '')}); torch {env.get('torch')}, transformers "
            f"{env.get('transformers')}, peft {env.get('peft')}, CUDA {env.get('cuda')}; {env.get('date', '')}; "
            f"commit {str(env.get('commit') or '?')[:10]}")
    lines = [head, "", "| point | peak allocated: GPU / estimate | least capacity: GPU / estimate | outside PyTorch "
             "(MiB): GPU / estimate | max reserved (GPU, memory to spare) | training tokens/s: GPU / estimate "
             "(assumed MFU) | status |", "|---|---|---|---|---|---|---|"]
    for r in df.to_dict("records"):
        cells = []
        for _, m, e in FIGURES:
            unit = "MiB" if m == "outside_bytes" else "GiB"
            cells.append(f"{_cell(r.get(m), unit)} / {_cell(r.get(e), unit)} ({_err(r.get(f'{m}_error'))})")
        lines.append(f"| {r['point']} | " + " | ".join(cells) + f" | {_cell(r.get('max_reserved'))} | "
                     f"{_speed(r)} | {r.get('status', '')} |")
    return "\n".join(lines)


def summary_lines(root: Path = VALIDATION, trace: bool = False) -> list[str]:
    """Every committed run's comparison, for `make accuracy`; a line saying there is none yet otherwise."""
    found = runs(root)
    if not found:
        return [f"real-GPU runs ({root}/): none committed yet; run `make gpu-check` on a GPU (README, 'Checking on "
                "a real GPU')"]
    out = []
    for folder in found:
        env, df = compare_run(folder, trace)
        out += [f"real-GPU run {folder}:", format_comparison(env, df), ""]
    return out


def run_summaries(root: Path = VALIDATION) -> list[dict[str, Any]]:
    """One line of figures per committed kit run, for the report's Validation section: the GPU, the run's folder
    (its date, and what distinguishes runs of one day), the releases, how many points were measured and the median
    and largest |error| of each of FIGURES."""
    out = []
    for folder in runs(root):
        env, df = compare_run(folder)
        done = df[df["status"].astype(str).str.startswith("measured")] if len(df) else df
        line: dict[str, Any] = {"folder": str(folder), "run": folder.name, "gpu": env.get("gpu", "?"),
                                "stack": f"torch {env.get('torch')}, transformers {env.get('transformers')}, CUDA "
                                         f"{env.get('cuda')}", "points": len(df), "measured": len(done)}
        for label, m, _ in FIGURES:
            err = done[f"{m}_error"].abs().dropna() if f"{m}_error" in done else pd.Series(dtype=float)
            line[label] = (float(err.median()), float(err.max()), len(err)) if len(err) else None
        # measured points whose least capacity is no measurement (measured_least_capacity) or was not reached
        line["least capacity not measured"] = int(done["status"].str.contains("least capacity not measured").sum()) \
            if len(done) else 0
        out.append(line)
    return out

