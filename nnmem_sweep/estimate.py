"""The estimator's entry points: a frame of points -> every component, the peak, overheads and fits.

- `estimate_frame(arch, mode, frame, overheads, headroom) -> DataFrame`: the pure estimator on any frame of points.
  `frame` needs the grid axes (columns.GRID_AXES; strings or categoricals, ints) and `gpu_memory_bytes` (a `gpu`
  column is carried through if present). Returns the frame with every component column, peak_allocated_bytes,
  peak_phase, overhead_bytes, total_bytes, usable_bytes and fits (then any further per-row arrays the components
  return, such as per-rank host memory; their "host_fits" is ANDed into fits). runner.run_scenario calls it on the
  grid, serving.py and cluster.py on the points they search, and the accuracy comparison on measured points, with
  device="cpu" where the measurement ran on the CPU (CPU dropout keeps a noise tensor of the input dtype where CUDA
  keeps a 1-byte mask; nothing else differs).
- `estimate_point(model=..., mode=..., batch=..., ...) -> pd.Series` and `format_breakdown(row) -> str` for
  `nnmem-sweep estimate`.

Rounding: usable = gpu_memory − ⌈headroom · gpu_memory⌉ (the margin is never smaller than asked);
reserved = peak + library workspaces + ⌈reserve_fraction · peak⌉; total = reserved + non_torch
(components/overhead.py).
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from . import columns as C
from .bounds import check_frame
from .catalog import names
from .catalog.gpus import get_gpu
from .catalog.optimizers import get_optimizer
from .catalog.precisions import get_precision
from .components.overhead import reserved_bytes, row_overheads, usable_bytes
from .peak import estimate_components
from .errors import UsageError
from .derive import DerivationError
from .derive.arch import architecture_of, derived_twin
from .models.arch import Architecture
from .models.presets import preset_ids
from .models.resolve import DerivedModelSpec, ModelSpecError, resolve_model
from .parallel.layout import (DEFAULT_GPUS_PER_NODE, DEFAULT_HOST_MEMORY, fsdp_offload_problem, fsdp_offloads,
                              fsdp_versions, typed_value)
from .grid import MAX_ROWS, expand_grid
from .scenario import DEFAULT_HEADROOM, GPUSpec, Overheads, Scenario
from .units import format_bytes, parse_size


CHUNK_ROWS = 2_000_000  # rows estimated at once: bounds memory on huge grids


def estimate_grid(sc: Scenario, max_rows: int = MAX_ROWS, progress: bool = False) -> pd.DataFrame:
    """results.csv's rows: the scenario's grid (refused past max_rows) estimated in chunks of CHUNK_ROWS, with a
    progress line on stderr after the first second (progress)."""
    start = time.perf_counter()
    grid = expand_grid(sc, max_rows=max_rows)
    logits = sc.prefill_logits
    n = len(grid)
    parts = []
    for lo in range(0, n, CHUNK_ROWS):
        parts.append(estimate_frame(sc.model, sc.mode, grid.iloc[lo:lo + CHUNK_ROWS], sc.overheads, sc.headroom,
                                    prefill_logits=logits))
        if progress and time.perf_counter() - start > 1.0:
            done = min(lo + CHUNK_ROWS, n)
            print(f"\rnnmem-sweep: {done:,}/{n:,} rows ({100 * done / max(n, 1):.0f}%)", end="", file=sys.stderr,
                  flush=True)
    return parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)


def estimate_frame(arch: Architecture, mode: str, frame: pd.DataFrame, overheads: Overheads,
                   headroom: float, device: str = "cuda", *, prefill_logits: str = "last") -> pd.DataFrame:
    """The estimator on any frame of points (see the module docstring). Pure: returns a new frame.
    device="cpu" only for comparing with CPU measurements (dropout keeps noise tensors, not bool masks).
    prefill_logits (infer): "last" (generate()'s logits_to_keep=1) or "all" (every prompt position's logits).
    Any further array estimate_components returns becomes an int64 column after `fits`; a boolean array under
    "host_fits" is ANDed into `fits` instead."""
    rows = row_overheads(overheads, frame, mode)
    check_frame(arch, frame)  # refuse points whose bytes could wrap around int64 (bounds.py)
    comps = estimate_components(arch, mode, frame, device, prefill_logits=prefill_logits)
    mem = frame[C.GPU_MEMORY].to_numpy(dtype=np.int64, copy=True)  # the output shares no memory with the input
    peak = np.asarray(comps[C.PEAK_ALLOCATED], dtype=np.int64)
    reserved = reserved_bytes(peak, rows)
    total = reserved + rows.non_torch
    usable = usable_bytes(mem, headroom)
    fits = total <= usable
    host = comps.get(C.HOST_FITS)
    if host is not None:
        fits &= np.asarray(host, dtype=bool)
    # the input columns but gpu_memory_bytes, which moves among the outputs; an output column the frame already
    # holds (re-estimating results) is overwritten where it stands
    out = {c: frame[c] for c in frame.columns if c != C.GPU_MEMORY}
    for c in C.COMPONENTS:
        out[c] = np.asarray(comps[c], dtype=np.int64) if c in comps else np.zeros(len(frame), dtype=np.int64)
    out[C.PEAK_ALLOCATED] = peak
    out[C.PEAK_PHASE] = comps[C.PEAK_PHASE]
    out[C.ALLOCATOR_EXTRA] = rows.allocator_extra
    out[C.RESERVED] = reserved
    out[C.NON_TORCH] = rows.non_torch
    out[C.OVERHEAD] = total - peak
    out[C.TOTAL] = total
    out[C.GPU_MEMORY] = mem
    out[C.USABLE] = usable
    out[C.FITS] = fits
    for k in comps:
        if k not in _OWN_KEYS:
            out[k] = np.asarray(comps[k], dtype=np.int64)
    return pd.DataFrame(out, index=frame.index, copy=False)


_OWN_KEYS = frozenset((*C.COMPONENTS, C.PEAK_ALLOCATED, C.PEAK_PHASE, C.HOST_FITS))


# ---------------------------------------------------------------- one point, for `nnmem-sweep estimate`

def resolve_model_name(model: str | Architecture, stack: dict[str, str] | None = None) -> Architecture:
    """--model: a preset id or Hugging Face id, a config.json, or a model folder holding one. `stack`: releases of
    transformers / peft other than the installed ones (--transformers, --peft): the model is then planned from
    that release's code (derive/side.py), a hand-modelled family included."""
    if isinstance(model, Architecture):
        return model
    path = Path(model)
    spec = {"hf_config": str(path.resolve())} if (path.suffix == ".json" and path.is_file()) or \
        (path.is_dir() and (path / "config.json").is_file()) else {"preset": model}
    if stack:
        spec["derive"] = True
    try:
        arch = resolve_model(spec, Path("."))
        return architecture_of(arch, stack or None) if isinstance(arch, DerivedModelSpec) else arch
    except ModelSpecError as e:
        if "preset" in spec and "unknown model preset" in e.message:
            raise UsageError(f"unknown model {model!r}: give a preset id or Hugging Face id "
                             f"({', '.join(preset_ids())}), a config.json or a model folder") from None
        raise UsageError(f"--model {model}: {e.message}") from None
    except DerivationError as e:
        raise UsageError(f"--model {model}: {e}") from None


def resolve_gpu_name(gpu: str | GPUSpec) -> GPUSpec:
    if isinstance(gpu, GPUSpec):
        return gpu
    try:
        return get_gpu(gpu)
    except ValueError as e:
        raise UsageError(str(e)) from None


def default_overheads(gpus: tuple[GPUSpec, ...] = ()) -> tuple[Overheads, float]:
    """A scenario's defaults: every overhead modelled for `gpus` (components/overhead.py)."""
    return Overheads(gpus=tuple(gpus)), float(DEFAULT_HEADROOM)


def estimate_point(*, model: str | Architecture, mode: str = "train", batch: int = 1, seq_len: int = 2048,
                   precision: str = "bf16-mixed", optimizer: str | None = "adamw",
                   optimizer_impl: str | None = "foreach", checkpointing: str = "none", attention: str = "flash",
                   gpu: str | GPUSpec = "h100-sxm", cache_tokens: int | None = None,
                   decode_tokens: int | None = None, overheads: Overheads | None = None,
                   headroom: float | None = None, zero_grad: str | None = None,
                   parallel: dict[str, object] | None = None) -> pd.Series:
    """One row of the estimator for the given values; bad names raise UsageError (one line). zero_grad (train):
    None leaves the optional axis out (set_to_none); "zeros" keeps the gradients between steps. parallel: a layout,
    {axis: value} of columns.PARALLEL_AXES as a scenario's `parallel:` block names them (the others their
    defaults; the node an 8-GPU one with 2 TiB of RAM), the row its most loaded rank's."""
    if mode not in names.MODES:
        raise UsageError(f"unknown mode {mode!r}; use train or infer")
    arch = resolve_model_name(model)
    spec = resolve_gpu_name(gpu)
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
    if zero_grad is not None and zero_grad not in names.ZERO_GRADS:
        raise UsageError(f"unknown zero_grad {zero_grad!r}; use {', '.join(names.ZERO_GRADS)}")
    if zero_grad is not None and mode == "infer":
        raise UsageError("zero_grad applies to train mode only")
    for label, v in (("batch", batch), ("seq_len", seq_len)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise UsageError(f"{label} must be a positive integer, got {v!r}")
    cache_tokens = 0 if cache_tokens is None else cache_tokens
    decode_tokens = (1 if mode == "infer" else 0) if decode_tokens is None else decode_tokens
    if cache_tokens < 0 or decode_tokens < 0:
        raise UsageError("cache_tokens and decode_tokens must not be negative")
    if overheads is None or headroom is None:
        d_ov, d_head = default_overheads((spec,))
        overheads = overheads or d_ov
        headroom = d_head if headroom is None else headroom
    frame = pd.DataFrame({
        C.BATCH: [batch], C.SEQ_LEN: [seq_len], C.PRECISION: [precision], C.OPTIMIZER: [optimizer],
        C.OPTIMIZER_IMPL: [optimizer_impl], C.CHECKPOINTING: [checkpointing], C.ATTENTION: [attention],
        C.CACHE_TOKENS: [cache_tokens], C.DECODE_TOKENS: [decode_tokens], C.GPU: [spec.id],
        C.GPU_MEMORY: [spec.memory_bytes], **({C.ZERO_GRAD: [zero_grad]} if zero_grad is not None else {}),
        **_layout_columns(parallel),
    })
    arch = layout_model(arch, mode, parallel)
    row = estimate_frame(arch, mode, frame, overheads, headroom).iloc[0].copy()
    row[C.MODEL] = arch.name
    row[C.MODE] = mode
    row["gpu_name"] = spec.name
    return row


def layout_model(arch: Architecture, mode: str, parallel: dict[str, object] | None) -> Architecture:
    """The model a point's layout ({axis: value}) is planned with: a hand-modelled transformer offloaded by FSDP
    (offload optimizer+params) through its derived twin, its rank's step traced with the host told apart, as a
    scenario's (config_model.check_offloaded_ranks); `arch` itself otherwise."""
    if mode != "train" or arch.kind != "transformer" or not parallel:
        return arch
    # the layout's values typed as its columns hold them (a bad axis or value is refused here, in one line)
    layout = {a: tuple(v) for a, v in _layout_columns(parallel).items() if a in C.PARALLEL_AXES}
    problem = fsdp_offload_problem(layout) if fsdp_versions(layout) == {1} else None
    if problem:  # FSDP1 named: its offload as FSDP1 runs it, or refused (config_model.check_offloaded_ranks)
        raise UsageError(problem)
    return offload_twin(arch) if fsdp_offloads(layout) else arch


def offload_twin(arch: Architecture) -> Architecture:
    """A hand-modelled transformer offloaded by FSDP: its derived twin (its rank's step traced with the host told
    apart), with its fine-tune; a UsageError (one line) where it has none."""
    twin = derived_twin(arch, allow_deriving=True)
    if twin is None:
        raise UsageError(f"FSDP's CPU offload of {arch.name} is planned from its own code, which it does not have "
                         "(give it as a preset, hf_config or module)")
    return dataclasses.replace(twin, finetune=arch.finetune)


def _layout_columns(parallel: dict[str, object] | None) -> dict[str, list]:
    """A point's parallel columns (every axis, its default where not given) and its node's; none without a layout."""
    if not parallel:
        return {}
    unknown = sorted(set(parallel) - set(C.PARALLEL_AXES))
    if unknown:
        raise UsageError(f"unknown parallel axis {unknown[0]!r}; use {', '.join(C.PARALLEL_AXES)}")
    return {**{a: [typed_value(a, parallel.get(a, C.PARALLEL_DEFAULTS[a]))] for a in C.PARALLEL_AXES},
            C.GPUS_PER_NODE: [DEFAULT_GPUS_PER_NODE], C.HOST_MEMORY: [parse_size(DEFAULT_HOST_MEMORY)]}


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
    if C.ZERO_GRAD in row.index:  # the optional axis, only where it was given
        head += f"  zero_grad {row[C.ZERO_GRAD]}"
    lines.append(head)
    off = [f"{a} {row[a]}" for a in C.PARALLEL_AXES if a in row.index and row[a] != C.PARALLEL_DEFAULTS[a]]
    if off:  # a parallel layout: every figure is one rank's, the most loaded
        lines.append(f"one rank of: {', '.join(off)}")
    lines.append(f"{'component':<36}{'GiB':>12}{'bytes':>22}")

    def line(label: str, v: int) -> str:
        return f"{label:<36}{format_bytes(int(v), 'GiB', 3)[:-4]:>12}{int(v):>22,}"

    for c in C.COMPONENTS:
        lines.append(line(labels[c], row[c]))
    lines.append(line(f"peak allocated (at {row[C.PEAK_PHASE]})", row[C.PEAK_ALLOCATED]))
    lines.append(line("library workspaces (cuBLAS)", row[C.ALLOCATOR_EXTRA]))
    lines.append(line("allocator reserve", int(row[C.RESERVED]) - int(row[C.PEAK_ALLOCATED])
                      - int(row[C.ALLOCATOR_EXTRA])))
    lines.append(line("reserved (max_memory_reserved)", row[C.RESERVED]))
    lines.append(line("outside PyTorch (context, NCCL)", row[C.NON_TORCH]))
    lines.append(line("total", row[C.TOTAL]))
    if int(row.get(C.HOST, 0) or 0):  # offloaded states: host memory of a node of gpus_per_node ranks
        lines.append(line(f"host memory per node ({row.get(C.GPUS_PER_NODE, DEFAULT_GPUS_PER_NODE)} ranks)",
                          row[C.HOST]))
    gpu = row.get("gpu_name", row.get(C.GPU, ""))
    lines.append(line("GPU capacity (as PyTorch sees it)", row[C.GPU_MEMORY]))
    lines.append(line("usable (after headroom)", row[C.USABLE]))
    margin = int(row[C.USABLE]) - int(row[C.TOTAL])
    verdict = f"fits, {format_bytes(margin, 'GiB', 3)} to spare" if row[C.FITS] else \
        f"does NOT fit: {format_bytes(-margin, 'GiB', 3)} short"
    lines.append(f"{verdict}  on {gpu}")
    return "\n".join(lines)
