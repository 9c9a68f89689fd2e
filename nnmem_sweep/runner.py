"""Run a scenario: grid -> components -> peak -> overhead -> fits, and max batch per point; write the CSVs.

Library entry points:
- `run_scenario(sc, max_rows, progress) -> RunResult` (scenario, results, max_batch, elapsed_s).
- `write_outputs(result, out_dir) -> [results.csv, max_batch.csv]`, written atomically; infer scenarios of
  transformers add the serving plan (serving.py): max_concurrency.csv and max_context.csv.
- `estimate_frame(arch, mode, frame, overheads, headroom) -> DataFrame`: the pure estimator on any hand-made frame
  of points. `frame` needs the grid axes (columns.GRID_AXES; strings or categoricals, ints) and
  `gpu_memory_bytes` (a `gpu` column is carried through if present). Returns the frame with every component
  column, peak_allocated_bytes, peak_phase, overhead_bytes, total_bytes, usable_bytes and fits (then any further
  per-row arrays the components return, such as per-rank host memory; their "host_fits" is ANDed into fits). The
  accuracy comparison calls it on measured points, with device="cpu" where the measurement ran on the CPU (CPU
  dropout keeps a noise tensor of the input dtype where CUDA keeps a 1-byte mask; nothing else differs).
- `estimate_point(model=..., mode=..., batch=..., ...) -> pd.Series` and `format_breakdown(row) -> str` for
  `nnmem-sweep estimate`.

Rounding: usable = gpu_memory − ⌈headroom · gpu_memory⌉ (the margin is never smaller than asked);
overhead = context + workspace + ⌈reserve_fraction · peak⌉.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .bounds import check_frame
from . import columns as C
from . import cluster, serving
from .components.overhead import overhead_bytes, usable_bytes
from .components.peak import estimate_components
from .errors import UsageError
from .fit import max_batch
from .grid import MAX_ROWS, add_gpu_columns, expand_grid, point_axes, product_frame
from .models.arch import Architecture
from .paths import atomic_write_text
from .scenario import GPUSpec, Overheads, Scenario
from .units import format_bytes, parse_size

CHUNK_ROWS = 2_000_000  # rows estimated at once: bounds memory on huge grids


@dataclass
class RunResult:
    scenario: Scenario
    results: pd.DataFrame
    max_batch: pd.DataFrame
    elapsed_s: float
    # infer scenarios of transformers (serving.py): max_concurrency.csv and max_context.csv; None otherwise
    serving: pd.DataFrame | None = None
    serving_context: pd.DataFrame | None = None
    # scenarios with a `cluster:` block (cluster.py): cluster_options.csv; None otherwise
    cluster: pd.DataFrame | None = None


def estimate_frame(arch: Architecture, mode: str, frame: pd.DataFrame, overheads: Overheads,
                   headroom: float, device: str = "cuda", *, prefill_logits: str = "last") -> pd.DataFrame:
    """The estimator on any frame of points (see the module docstring). Pure: returns a new frame.
    device="cpu" only for comparing with CPU measurements (dropout keeps noise tensors, not bool masks).
    prefill_logits (infer): "last" (generate()'s logits_to_keep=1) or "all" (every prompt position's logits).
    Any further array estimate_components returns becomes an int64 column after `fits`; a boolean array under
    "host_fits" is ANDed into `fits` instead."""
    check_frame(arch, frame)  # refuse points whose bytes could wrap around int64 (bounds.py)
    comps = estimate_components(arch, mode, frame, device, prefill_logits=prefill_logits)
    mem = frame[C.GPU_MEMORY].to_numpy(dtype=np.int64, copy=True)  # the output shares no memory with the input
    peak = np.asarray(comps[C.PEAK_ALLOCATED], dtype=np.int64)
    over = overhead_bytes(peak, overheads)
    total = peak + over
    usable = usable_bytes(mem, headroom)
    fits = total <= usable
    host = comps.get(HOST_FITS)
    if host is not None:
        fits &= np.asarray(host, dtype=bool)
    # the input columns but gpu_memory_bytes, which moves among the outputs; an output column the frame already
    # holds (re-estimating results) is overwritten where it stands
    out = {c: frame[c] for c in frame.columns if c != C.GPU_MEMORY}
    for c in C.COMPONENTS:
        out[c] = np.asarray(comps[c], dtype=np.int64) if c in comps else np.zeros(len(frame), dtype=np.int64)
    out[C.PEAK_ALLOCATED] = peak
    out[C.PEAK_PHASE] = comps[C.PEAK_PHASE]
    out[C.OVERHEAD] = over
    out[C.TOTAL] = total
    out[C.GPU_MEMORY] = mem
    out[C.USABLE] = usable
    out[C.FITS] = fits
    for k in comps:
        if k not in _OWN_KEYS:
            out[k] = np.asarray(comps[k], dtype=np.int64)
    return pd.DataFrame(out, index=frame.index, copy=False)


HOST_FITS = "host_fits"  # estimate_components may return it: per-row bool, ANDed into fits
_OWN_KEYS = frozenset((*C.COMPONENTS, C.PEAK_ALLOCATED, C.PEAK_PHASE, HOST_FITS))


def _progress(enabled: bool, start: float, done: int, total: int) -> None:
    if enabled and time.perf_counter() - start > 1.0:
        print(f"\rnnmem-sweep: {done:,}/{total:,} rows ({100 * done / max(total, 1):.0f}%)", end="",
              file=sys.stderr, flush=True)


def run_scenario(sc: Scenario, max_rows: int = MAX_ROWS, progress: bool = False) -> RunResult:
    start = time.perf_counter()
    grid = expand_grid(sc, max_rows=max_rows)
    n = len(grid)
    logits = serving.sweep_prefill_logits(sc)
    parts = []
    for lo in range(0, n, CHUNK_ROWS):
        parts.append(estimate_frame(sc.model, sc.mode, grid.iloc[lo:lo + CHUNK_ROWS], sc.overheads, sc.headroom,
                                    prefill_logits=logits))
        _progress(progress, start, min(lo + CHUNK_ROWS, n), n)
    results = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    results.insert(0, C.MODE, pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[sc.mode]))
    results.insert(0, C.MODEL, pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[sc.model.name]))

    points = add_gpu_columns(product_frame(point_axes(sc), tuple(g.id for g in sc.gpus)), sc)
    mb = max_batch(sc.model, sc.mode, points, sc.overheads, sc.headroom, prefill_logits=logits)
    tables = dict(plan_tables(sc))
    elapsed = time.perf_counter() - start
    if progress and elapsed > 1.0:
        print(f"\rnnmem-sweep: {n:,} rows in {elapsed:.1f} s" + " " * 10, file=sys.stderr)
    return RunResult(sc, results, mb, elapsed, *(tables.get(name) for name in PLAN_FILES))


# The per-scenario tables computed beside the grid, in RunResult's field order: serving, serving_context, cluster
PLAN_FILES = ("max_concurrency.csv", "max_context.csv", "cluster_options.csv")


def plan_tables(sc: Scenario) -> list[tuple[str, pd.DataFrame]]:
    """(file name, table) of the serving plan (infer scenarios of transformers) and the cluster search (a
    `cluster:` block); none for most scenarios. run_scenario and run --stream both write these."""
    out = []
    if serving.applies(sc):
        out += [(PLAN_FILES[0], serving.max_concurrency(sc)), (PLAN_FILES[1], serving.max_context(sc))]
    if sc.cluster is not None:
        out.append((PLAN_FILES[2], cluster.cluster_options(sc, sc.cluster)))
    return out


def csv_text(frame: pd.DataFrame) -> str:
    """A table as the CSV every output file uses: no index, '\\n' line ends."""
    return frame.to_csv(index=False, lineterminator="\n")


def write_outputs(result: RunResult, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    tables = [("results.csv", result.results), ("max_batch.csv", result.max_batch),
              *zip(PLAN_FILES, (result.serving, result.serving_context, result.cluster))]
    return [atomic_write_text(out_dir / name, csv_text(frame)) for name, frame in tables if frame is not None]


# ---------------------------------------------------------------- one point, for `nnmem-sweep estimate`

def _resolve_model(model: str | Architecture) -> Architecture:
    if isinstance(model, Architecture):
        return model
    path = Path(model)
    if path.suffix == ".json" and path.is_file():
        import json

        from .models.hf import architecture_from_hf

        try:
            return architecture_from_hf(json.loads(path.read_text(encoding="utf-8")), origin=str(path))
        except (ValueError, KeyError) as e:
            raise UsageError(f"--model {model}: {e}") from None
    from .models.presets import load_preset, preset_ids

    try:
        return load_preset(model)
    except (ValueError, KeyError, FileNotFoundError):
        raise UsageError(f"unknown model {model!r}: give a preset id ({', '.join(preset_ids())}) "
                         "or a path to a config.json") from None


def _resolve_gpu(gpu: str | GPUSpec) -> GPUSpec:
    if isinstance(gpu, GPUSpec):
        return gpu
    from .catalog.gpus import get_gpu

    try:
        return get_gpu(gpu)
    except ValueError as e:
        raise UsageError(str(e)) from None


def default_overheads() -> tuple[Overheads, float]:
    from . import config

    ov = Overheads(parse_size(config.DEFAULT_CUDA_CONTEXT), parse_size(config.DEFAULT_CUBLAS_WORKSPACE),
                   float(config.DEFAULT_ALLOCATOR_RESERVE))
    return ov, float(config.DEFAULT_HEADROOM)


def estimate_point(*, model: str | Architecture, mode: str = "train", batch: int = 1, seq_len: int = 2048,
                   precision: str = "bf16-mixed", optimizer: str | None = "adamw",
                   optimizer_impl: str | None = "foreach", checkpointing: str = "none", attention: str = "flash",
                   gpu: str | GPUSpec = "h100-sxm", cache_tokens: int | None = None,
                   decode_tokens: int | None = None, overheads: Overheads | None = None,
                   headroom: float | None = None) -> pd.Series:
    """One row of the estimator for the given values; bad names raise UsageError (one line)."""
    from .catalog import names
    from .catalog.optimizers import get_optimizer
    from .catalog.precisions import get_precision

    if mode not in names.MODES:
        raise UsageError(f"unknown mode {mode!r}; use train or infer")
    arch = _resolve_model(model)
    spec = _resolve_gpu(gpu)
    get_precision(precision)
    if mode == "infer":
        optimizer, optimizer_impl = names.OPTIMIZER_NONE, names.OPTIMIZER_NONE
    else:
        get_optimizer(optimizer)
        if optimizer_impl not in names.OPTIMIZER_IMPLS:
            raise UsageError(f"unknown optimizer_impl {optimizer_impl!r}; use {', '.join(names.OPTIMIZER_IMPLS)}")
    if checkpointing not in names.CHECKPOINTING:
        raise UsageError(f"unknown checkpointing {checkpointing!r}; use {', '.join(names.CHECKPOINTING)}")
    if attention not in names.ATTENTION:
        raise UsageError(f"unknown attention {attention!r}; use {', '.join(names.ATTENTION)}")
    for label, v in (("batch", batch), ("seq_len", seq_len)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise UsageError(f"{label} must be a positive integer, got {v!r}")
    cache_tokens = 0 if cache_tokens is None else cache_tokens
    decode_tokens = (1 if mode == "infer" else 0) if decode_tokens is None else decode_tokens
    if cache_tokens < 0 or decode_tokens < 0:
        raise UsageError("cache_tokens and decode_tokens must not be negative")
    if overheads is None or headroom is None:
        d_ov, d_head = default_overheads()
        overheads = overheads or d_ov
        headroom = d_head if headroom is None else headroom
    frame = pd.DataFrame({
        C.BATCH: [batch], C.SEQ_LEN: [seq_len], C.PRECISION: [precision], C.OPTIMIZER: [optimizer],
        C.OPTIMIZER_IMPL: [optimizer_impl], C.CHECKPOINTING: [checkpointing], C.ATTENTION: [attention],
        C.CACHE_TOKENS: [cache_tokens], C.DECODE_TOKENS: [decode_tokens], C.GPU: [spec.id],
        C.GPU_MEMORY: [spec.memory_bytes],
    })
    row = estimate_frame(arch, mode, frame, overheads, headroom).iloc[0].copy()
    row[C.MODEL] = arch.name
    row[C.MODE] = mode
    row["gpu_name"] = spec.name
    return row


def format_breakdown(row: pd.Series) -> str:
    """A readable table: every component (GiB and exact bytes), the peak phase, total, capacity, fits and margin."""
    labels = {
        C.WEIGHTS: "weights", C.MASTER_WEIGHTS: "master weights", C.GRADIENTS: "gradients",
        C.OPTIMIZER_STATE: "optimizer state", C.ACTIVATIONS: "activations", C.KV_CACHE: "KV cache",
        C.TEMPORARY: "temporaries",
    }
    lines = []
    head = f"{row.get(C.MODEL, '')}  {row.get(C.MODE, '')}  batch {row[C.BATCH]}  seq {row[C.SEQ_LEN]}  " \
           f"{row[C.PRECISION]}"
    if row.get(C.MODE) == "train":
        head += f"  {row[C.OPTIMIZER]} ({row[C.OPTIMIZER_IMPL]})  checkpointing {row[C.CHECKPOINTING]}"
    else:
        head += f"  cache_tokens {row[C.CACHE_TOKENS]}  decode_tokens {row[C.DECODE_TOKENS]}"
    head += f"  attention {row[C.ATTENTION]}"
    lines.append(head)
    lines.append(f"{'component':<36}{'GiB':>12}{'bytes':>22}")

    def line(label: str, v: int) -> str:
        return f"{label:<36}{format_bytes(int(v), 'GiB', 3)[:-4]:>12}{int(v):>22,}"

    for c in C.COMPONENTS:
        lines.append(line(labels[c], row[c]))
    lines.append(line(f"peak allocated (at {row[C.PEAK_PHASE]})", row[C.PEAK_ALLOCATED]))
    lines.append(line("overhead (context, cuBLAS, reserve)", row[C.OVERHEAD]))
    lines.append(line("total", row[C.TOTAL]))
    gpu = row.get("gpu_name", row.get(C.GPU, ""))
    lines.append(line("GPU capacity (as the device reports)", row[C.GPU_MEMORY]))
    lines.append(line("usable (after headroom)", row[C.USABLE]))
    margin = int(row[C.USABLE]) - int(row[C.TOTAL])
    verdict = f"fits, {format_bytes(margin, 'GiB', 3)} to spare" if row[C.FITS] else \
        f"does NOT fit: {format_bytes(-margin, 'GiB', 3)} short"
    lines.append(f"{verdict}  on {gpu}")
    return "\n".join(lines)
