"""`nnmem-sweep measure`: measure a scenario's grid points and write measured.csv beside the estimate."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from .. import columns as C
from ..errors import UsageError
from ..paths import atomic_write_text
from ..workload.build import OPTIMIZERS, PRECISIONS
from .tracker import CATEGORIES

MEASURED_PEAK = "measured_peak_bytes"
MEASURED_PHASE = "measured_peak_phase"
MEASURED_MODULE = "measured_peak_module"
KERNEL = "attention_kernel"
ESTIMATED_ATTENTION = "estimated_attention"
REL_ERROR = "relative_error"  # (estimate - (measured - tracker leftover)) / (measured - tracker leftover)
LEFTOVER = "memtracker_leftover_bytes"  # what MemTracker itself keeps alive at the peak (tracker_leftover)
STATUS = "status"  # measured | skipped: <why> | failed: <why>


def category_column(cat: str) -> str:
    return f"measured_{cat}_bytes"


def parse_points(points: list[str]) -> dict[str, str]:
    """["batch=4", "precision=bf16"] -> {"batch": "4", "precision": "bf16"}; unknown axes are a UsageError."""
    out: dict[str, str] = {}
    for p in points:
        axis, sep, value = p.partition("=")
        axis, value = axis.strip(), value.strip()
        if not sep or not axis or not value:
            raise UsageError(f"--point {p!r}: use AXIS=VALUE, e.g. --point batch=4")
        if axis not in C.GRID_AXES + C.OPTIONAL_AXES:
            raise UsageError(f"--point {p!r}: unknown axis {axis!r}; use one of "
                             f"{', '.join(C.GRID_AXES + C.OPTIONAL_AXES)}")
        out[axis] = value
    return out


def model_spec(sc) -> dict[str, Any]:  # noqa: ANN001
    """The scenario's `model:` mapping as written (preset, hf_config or layer list), resolved against its folder."""
    doc = yaml.safe_load(sc.source_text) if sc.source_text else {}
    spec = dict((doc or {}).get("model") or {})
    if "preset" in spec:
        return {"model": spec["preset"]}
    if "hf_config" in spec:
        import json

        path = Path(spec["hf_config"])
        if not path.is_absolute():
            path = Path(sc.path).parent / path
        return {"model": sc.model.preset or path.stem, "hf_config": json.loads(path.read_text())}
    if "layers" in spec:
        return {"model": sc.model.name, "layers": spec["layers"], "input_shape": spec["input_shape"],
                "num_classes": int(sc.model.layer_table[-1].output_elements) if sc.model.layer_table else 10}
    raise UsageError("measuring needs a model given by preset, hf_config or a layer list; "
                     "a params or architecture model has no network to run")


def step_spec(sc) -> dict[str, Any]:  # noqa: ANN001
    """What the scenario does to the model beyond one plain step: peft's adapters (`finetune:`) and preference
    pairs (`preference:`), as the case keys workload/build.py runs them with, so the step measured is the step
    estimated."""
    out: dict[str, Any] = {}
    ft = sc.model.finetune
    if ft is not None and ft.adapters:
        from ..derive.arch import peft_spec

        out["finetune"] = peft_spec(ft)
    if sc.model.kind == "derived" and sc.model.derived.source.preference and sc.mode == "train":
        out["preference"] = sc.model.derived.source.preference
    return out


def _skip_reason(row: dict[str, Any], mode: str) -> str:
    if row[C.PRECISION] not in PRECISIONS:
        return f"precision {row[C.PRECISION]} is not measured (measured: {', '.join(PRECISIONS)})"
    if mode == "train" and row[C.OPTIMIZER] not in OPTIMIZERS:
        return f"optimizer {row[C.OPTIMIZER]} is not in torch.optim"
    if row[C.CHECKPOINTING] == "selective":
        return "selective checkpointing has no transformers switch"
    for axis in (C.DATA_PARALLEL, C.TENSOR_PARALLEL, C.PIPELINE_PARALLEL, C.CONTEXT_PARALLEL,
                 C.GRADIENT_ACCUMULATION):
        if int(row.get(axis, 1) or 1) > 1:
            return (f"{axis} {int(row[axis])}: measure runs one GPU's step, unsharded and unaccumulated; sharded "
                    "steps are measured by `nnmem-sweep truth` (FSDPMemTracker on a fake process group)")
    if str(row.get(C.OFFLOAD, "none")) != "none":
        return f"offload {row[C.OFFLOAD]}: host-memory offload is not run by measure"
    if mode == "infer" and int(row[C.CACHE_TOKENS]) > 0:
        return "a preallocated cache (cache_tokens > 0) is not measured; generate() grows a DynamicCache"
    return ""


def point_axes(frame: pd.DataFrame) -> list[str]:
    """The grid axes, and the optional and parallel ones (columns.OPTIONAL_AXES, PARALLEL_AXES) the frame has."""
    return list(C.GRID_AXES) + [a for a in C.OPTIONAL_AXES + C.PARALLEL_AXES if a in frame.columns]


def select_points(frame: pd.DataFrame, filters: dict[str, str], limit: int) -> pd.DataFrame:
    points = frame[point_axes(frame)].drop_duplicates()
    text = points.astype(str)  # --point values are text; the points keep their types
    for axis, value in filters.items():
        if axis not in points.columns:
            raise UsageError(f"--point {axis}={value}: the scenario's grid does not name {axis}")
        points, text = points[text[axis] == value], text[text[axis] == value]
    if points.empty:
        raise UsageError("no grid point matches " + ", ".join(f"{a}={v}" for a, v in filters.items()))
    return points.head(max(int(limit), 0)).reset_index(drop=True)


DEVICES = ("cpu", "cpu-real", "cuda")  # FakeTensorMode on the CPU | real CPU tensors (the GPU path's twin) | a GPU


def measure_scenario(config_path: str, out_dir: Path, points: list[str], limit: int, device: str = "cpu",
                     bisect: bool = True) -> int:
    """Measure the scenario's selected points and write out_dir/measured.csv, the estimate beside each figure.
    device "cpu": PyTorch's MemTracker under FakeTensorMode (no memory, any size); "cuda": real steps on the GPU
    (measure/real.py: allocated, reserved, outside PyTorch, least capacity, tokens/s, one snapshot per point);
    "cpu-real": the same real steps on the CPU (small models; what `make test` runs in place of a GPU)."""
    from ..config import load_scenario
    from ..grid import expand_grid

    sc = load_scenario(config_path)
    spec = {**model_spec(sc), **step_spec(sc)}
    selected = select_points(expand_grid(sc), parse_points(points), limit)
    real = "cuda" if device == "cuda" else "cpu"
    where = None if device == "cpu" else _where(sc, real)
    rows = []
    for n, point in enumerate(selected.to_dict("records"), 1):
        row: dict[str, Any] = {C.MODEL: sc.model.name, C.MODE: sc.mode, **point}
        for axis in (C.BATCH, C.SEQ_LEN, C.CACHE_TOKENS, C.DECODE_TOKENS):
            row[axis] = int(point[axis])
        reason = _skip_reason(row, sc.mode)
        if reason:
            rows.append({**row, STATUS: f"skipped: {reason}"})
            continue
        case = {**spec, "mode": sc.mode, "batch": row[C.BATCH], "seq_len": row[C.SEQ_LEN],
                "precision": row[C.PRECISION], "optimizer": row[C.OPTIMIZER],
                "optimizer_impl": row[C.OPTIMIZER_IMPL], "checkpointing": row[C.CHECKPOINTING],
                "attention": row[C.ATTENTION], "decode_tokens": row[C.DECODE_TOKENS],
                **({"zero_grad": row[C.ZERO_GRAD]} if C.ZERO_GRAD in row else {})}
        tag = f"[{n}/{len(selected)}]"
        t0 = time.perf_counter()
        try:
            if device == "cpu":
                row.update(_fake(case, sc.model.hidden))
            else:
                row.update(device_figures(sc, case, row, real, where, out_dir, n, bisect,
                                          say=lambda line: print(f"{tag} {line}", file=sys.stderr, flush=True)))
        except Exception as e:  # noqa: BLE001 - one point PyTorch cannot run must not lose the others
            rows.append({**row, STATUS: f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"})
            continue
        rows.append(row)
        print(f"{tag} {row.get(MEASURED_PEAK, row.get(DEVICE_ALLOCATED)):,} B peak allocated "
              f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    df = pd.DataFrame(rows)
    if device == "cpu":
        from ..runner import estimate_frame

        df = _with_estimate(df, sc, estimate_frame)
    atomic_write_text(Path(out_dir) / "measured.csv", df.to_csv(index=False))
    return 0


def tracker_leftover(case: dict[str, Any], hidden: int, pairs: int = 1) -> int:
    """Bytes MemTracker itself keeps alive at a training peak (tests/data/truth/FINDINGS.md): with adapters and full
    checkpointing the embedding output is made a leaf that requires grad (peft's enable_input_require_grads), and
    the tracker's module hooks keep it and its gradient after each step, b·s·h elements each in the embedding
    output's dtype (the residual stream's; fp32 under QLoRA, whose prepare_model_for_kbit_training casts the
    embeddings to fp32); a run without the tracker frees both (weakrefs; the real-tensor meter, measure/meters.py
    HostMeter). The peak (step 2) holds step 1's pair; `pairs`: how many finished steps' pairs (2 in step 2's
    optimizer phase). The one rule the measured points, the one-GPU truth's tests and the derived families' use."""
    if case.get("mode", "train") != "train" or case["checkpointing"] != "full" or not case.get("finetune"):
        return 0
    from ..catalog.precisions import get_precision

    qlora = case["finetune"].get("method") == "qlora"
    width = 4 if qlora else get_precision(case["precision"]).residual_bytes
    return pairs * 2 * width * hidden * case["batch"] * case["seq_len"]


def _fake(case: dict[str, Any], hidden: int) -> dict[str, Any]:
    """MemTracker's figures of one point under FakeTensorMode, and what the tracker itself keeps at the peak."""
    from .build import measure_case

    m = measure_case(case, fake=True)
    out = {MEASURED_PEAK: m["peak_bytes"], MEASURED_PHASE: m["peak_phase"], MEASURED_MODULE: m["peak_module"],
           KERNEL: m["attention_kernel"], STATUS: "measured", LEFTOVER: tracker_leftover(case, hidden)}
    out.update({category_column(cat): m["categories_at_peak"][cat] for cat in CATEGORIES})
    return out


# the columns of a real run (--device cuda or cpu-real), beside the estimate's (gpu_compare.FIGURES)
DEVICE_ALLOCATED = "measured_max_allocated_bytes"
DEVICE_COLUMNS = {"max_allocated": DEVICE_ALLOCATED, "max_reserved": "measured_max_reserved_bytes",
                  "least_capacity": "measured_least_capacity_bytes", "outside_bytes": "measured_outside_bytes"}


def _where(sc, device: str):  # noqa: ANN001
    """(the GPU the estimate is made for, the runtime block) of a real run: the device at hand, its mem_get_info
    total and its CUDA and torch releases; on the CPU twin, the scenario's first GPU."""
    from .. import gpu_compare as G
    from .kit import environment

    env = environment(device)
    return (G.gpu_of(env) if device == "cuda" else sc.gpus[0]), G.runtime_of(env)


def device_figures(sc, case: dict[str, Any], row: dict[str, Any], device: str, where, out_dir: Path,  # noqa: ANN001
                   n: int, bisect: bool, say) -> dict[str, Any]:  # noqa: ANN001
    """One point run for real on `device`, its figures and the estimate's beside them (printed as they come)."""
    from .. import gpu_compare as G
    from .real import measure_point

    snap = Path(out_dir) / f"snapshot-{n}.pickle" if device == "cuda" else None
    rec = measure_point(case, device, bisect=bisect and case["mode"] == "train", snapshot=snap, say=say)
    out: dict[str, Any] = {col: rec.get(key) for key, col in DEVICE_COLUMNS.items()}
    out.update({f"tokens_per_s_{k}": v for k, v in (rec.get("tokens_per_s") or {}).items()})
    out["snapshot"] = rec.get("snapshot", "")
    out[STATUS] = "measured"
    gpu, runtime = where
    frame = pd.DataFrame([{a: row[a] for a in point_axes(pd.DataFrame([row]))}])
    est = G.estimate_on(sc.model, sc.mode, frame, gpu, runtime, device=device)
    out.update({k: v for k, v in est.items() if k.startswith("estimated_") or k == "reserve_fraction"})
    err = G.errors({**{k: rec.get(k) for k in DEVICE_COLUMNS}, **est})
    for label, m, e in G.FIGURES:
        if rec.get(m) is not None:
            say(f"{label}: {rec[m]:,} B measured, {est[e]:,} B estimated ({err[f'{m}_error']:+.1%})")
    out.update(err)
    return out


def _with_estimate(df: pd.DataFrame, sc, estimate_frame) -> pd.DataFrame:  # noqa: ANN001
    """The estimate of the same points beside the measurement, with the estimator's CPU device model (these
    measurements run on the cpu device: dropout noise in the input dtype, SDPA's math fallback when attention
    dropout > 0 are modelled there), so the two compare like with like. results.csv keeps the GPU model."""
    ok = df[STATUS] == "measured" if STATUS in df else pd.Series(False, index=df.index)
    if not ok.any():
        return df
    pts = df.loc[ok, point_axes(df)].copy()
    pts[C.GPU_MEMORY] = sc.gpus[0].memory_bytes
    est = estimate_frame(sc.model, sc.mode, pts, sc.overheads, sc.headroom, device="cpu")
    df[ESTIMATED_ATTENTION] = pd.Series(pts[C.ATTENTION], index=pts.index)
    df[C.PEAK_ALLOCATED] = pd.Series(est[C.PEAK_ALLOCATED].astype("int64"), index=pts.index).astype("Int64")
    df["estimated_peak_phase"] = pd.Series(est[C.PEAK_PHASE], index=pts.index)
    real = df[MEASURED_PEAK] - df[LEFTOVER].fillna(0)
    df[REL_ERROR] = (df[C.PEAK_ALLOCATED] - real) / real
    for c in [MEASURED_PEAK, LEFTOVER] + [category_column(c) for c in CATEGORIES]:
        df[c] = df[c].astype("Int64")
    return df


def child(argv: list[str]) -> int:
    """`python -m nnmem_sweep.measure.scenario_points JSON`: measure_scenario's arguments as a JSON list, run by
    the child Python of a scenario measured with other releases (measure/__init__.py); one line and exit 2 on a
    UsageError, every problem's line of a ScenarioError, as the CLI."""
    import json

    from ..errors import NnmemError, ScenarioError

    config_path, out_dir, points, limit, device, bisect = json.loads(argv[0])
    try:
        return measure_scenario(config_path, Path(out_dir), points, limit, device, bisect)
    except ScenarioError as e:
        for p in e.problems:
            print(p, file=sys.stderr)
        return 2
    except NnmemError as e:
        print(f"nnmem-sweep: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(child(sys.argv[1:]))
