"""What a real GPU needs beyond the step's peak allocated bytes, per row, and the capacity it is compared with.

    reserved  = peak_allocated + allocator_extra + ⌈f · peak_allocated⌉     (torch.cuda.max_memory_reserved())
    total     = reserved + non_torch                                      (what the process takes on the device)
    fits      = total ≤ usable,  usable = gpu_memory − ⌈headroom · gpu_memory⌉

- `allocator_extra_bytes`: library workspaces that go through the caching allocator but that a CPU trace never sees
  (cuBLAS/cuBLASLt per handle and stream; components/runtime.py).
- `non_torch_bytes`: memory outside the allocator: the CUDA context with the modules a step loads, and one NCCL
  communicator per parallel group of size > 1 (components/runtime.py, catalog/runtime.json).
- f: the allocator's reserve (rounding, segments, fragmentation) as a fraction of the peak: from replays of the
  step's allocation sequence through the allocator model where one is available (runner.run_scenario), else
  DEFAULT_ALLOCATOR_RESERVE, labelled "not replayed".
- `gpu_memory_bytes` is the capacity PyTorch sees (mem_get_info's total; catalog/gpus.py), not nvidia-smi's.

A figure the scenario's `overheads:` block gives replaces its modelled part (scenario.Overheads). The modelled
figures depend only on the GPU, the mode and the parallel layout: they are computed once per distinct combination.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import columns as C
from ..catalog.gpus import get_gpu
from ..citations import formula, source
from ..scenario import GPUSpec, Overheads
from .runtime import LAYOUT_KEYS, RuntimeMemory, runtime_memory

TORCH_CUDA_NOTES = source("torch-cuda-memory", "PyTorch CUDA semantics: memory management (caching allocator, "
                          "reserved vs allocated), cuBLAS workspaces (CUBLAS_WORKSPACE_CONFIG)",
                          "https://pytorch.org/docs/stable/notes/cuda.html")


@dataclass(frozen=True)
class RowOverheads:
    """Per row (int64 arrays) and the reserve fraction in force."""

    non_torch: np.ndarray
    allocator_extra: np.ndarray
    reserve_fraction: float | np.ndarray  # one for every row, or per row (replayed per recipe)

    @property
    def fixed(self) -> np.ndarray:
        """What does not grow with the peak: allocator_extra + non_torch."""
        return self.allocator_extra + self.non_torch


def gpu_spec(ov: Overheads, gpu_id: str) -> GPUSpec | None:
    """The scenario's GPU of that id, else the catalog's (a frame built by hand may name one the scenario does
    not), else None (a GPU of unknown generation)."""
    spec = next((g for g in ov.gpus if g.id == gpu_id), None)
    if spec is None:
        try:
            spec = get_gpu(gpu_id)
        except ValueError:
            return None
    return spec


def modelled(ov: Overheads, gpu: GPUSpec | None, mode: str, layout: dict[str, int] | None = None,
             has_convolutions: bool = False) -> RuntimeMemory:
    """The runtime model's figures for one GPU, mode and layout (the scenario's `runtime:` block applied)."""
    return runtime_memory(dict(ov.runtime), layout or {}, gpu, mode, has_convolutions=has_convolutions)


def has_convolutions(arch) -> bool:
    """Whether a step runs cuDNN convolutions: a layer net with conv2d layers, or a `module:` factory (torchvision's
    classifiers all begin with a convolution, ViT's patch embedding included)."""
    if arch.kind == "layers":
        return any(r.type.startswith("conv") for r in arch.layer_table)
    source = getattr(getattr(arch, "derived", None), "source", None)
    return arch.kind == "derived" and getattr(source, "kind", "") == "module"


def fixed_bytes(ov: Overheads, gpu: GPUSpec | None, mode: str, layout: dict[str, int] | None = None) -> tuple[int, int]:
    """(non_torch, allocator_extra) for one GPU, mode and layout: the overrides where given, else modelled."""
    mem = None
    if ov.cuda_context_bytes is None or ov.cublas_workspace_bytes is None:
        mem = modelled(ov, gpu, mode, layout)
    outside = int(ov.cuda_context_bytes) if ov.cuda_context_bytes is not None else mem.non_torch_bytes
    inside = int(ov.cublas_workspace_bytes) if ov.cublas_workspace_bytes is not None else mem.allocator_extra_bytes
    return outside, inside


def row_overheads(ov: Overheads, frame: pd.DataFrame, mode: str) -> RowOverheads:
    """The fixed parts per row of `frame` (its `gpu` column and the parallel dimensions it holds)."""
    n = len(frame)
    f = reserve_fractions(ov, frame)
    if ov.cuda_context_bytes is not None and ov.cublas_workspace_bytes is not None:  # all given: no lookup at all
        return RowOverheads(np.full(n, int(ov.cuda_context_bytes), dtype=np.int64),
                            np.full(n, int(ov.cublas_workspace_bytes), dtype=np.int64), f)
    dims = [d for d in LAYOUT_KEYS if d in frame.columns]
    if C.GPU in frame.columns:
        gpu_codes, gpu_ids = pd.factorize(frame[C.GPU], sort=False)
    else:
        gpu_codes, gpu_ids = np.zeros(n, dtype=np.int64), pd.Index([None])
    if dims:
        keys = np.column_stack([gpu_codes] + [frame[d].to_numpy(dtype=np.int64) for d in dims])
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    else:  # one GPU column: its codes are the groups
        uniq, inverse = np.arange(len(gpu_ids)).reshape(-1, 1), np.asarray(gpu_codes)
    outside = np.empty(len(uniq), dtype=np.int64)
    inside = np.empty(len(uniq), dtype=np.int64)
    for i, key in enumerate(uniq):
        gpu_id = gpu_ids[key[0]]
        spec = None if gpu_id is None else gpu_spec(ov, str(gpu_id))
        outside[i], inside[i] = fixed_bytes(ov, spec, mode, dict(zip(dims, (int(v) for v in key[1:]))))
    inverse = inverse.reshape(-1)
    return RowOverheads(outside[inverse], inside[inverse], f)


def reserve_fractions(ov: Overheads, frame: pd.DataFrame) -> float | np.ndarray:
    """The reserve fraction in force: one number, or per row where the runner replayed recipes one by one (a recipe
    of the frame it did not replay takes the largest replayed, `Overheads.reserve_fraction`)."""
    axes = list(ov.replayed_axes)
    if ov.allocator_reserve_fraction is not None or not ov.replayed_by_recipe or \
            not all(a in frame.columns for a in axes):
        return ov.reserve_fraction
    by_recipe = dict(ov.replayed_by_recipe)
    recipes = frame[axes].drop_duplicates()
    f = [by_recipe.get(tuple(str(v) for v in key), ov.reserve_fraction)
         for key in recipes.itertuples(index=False, name=None)]
    table = recipes.assign(_f=np.asarray(f, dtype=np.float64))
    return frame[axes].merge(table, on=axes, how="left")["_f"].to_numpy()


@formula("reserve_bytes", "⌈f · peak_allocated⌉", TORCH_CUDA_NOTES, where="memory management (reserved vs allocated)",
         note="f from replays of the step's allocations through the allocator model (allocator/), else 5 %, "
         "labelled 'not replayed'; rounded up to a whole byte")
def reserve_bytes(peak_allocated: np.ndarray, fraction: float | np.ndarray) -> np.ndarray:
    peak = np.asarray(peak_allocated, dtype=np.int64)
    return np.ceil(peak * np.asarray(fraction, dtype=np.float64)).astype(np.int64)


@formula("reserved_bytes", "peak_allocated + allocator_extra + reserve", TORCH_CUDA_NOTES,
         where="memory management; cuBLAS workspaces",
         note="allocator_extra: cuBLAS(Lt) workspaces, allocated through the caching allocator since torch 2.0 "
         "(pytorch#95668) but absent from a CPU trace")
def reserved_bytes(peak_allocated: np.ndarray, rows: RowOverheads) -> np.ndarray:
    peak = np.asarray(peak_allocated, dtype=np.int64)
    return peak + rows.allocator_extra + reserve_bytes(peak, rows.reserve_fraction)


@formula("total_bytes", "reserved + non_torch", TORCH_CUDA_NOTES, where="memory management",
         note="non_torch: CUDA context with loaded modules and NCCL communicators (components/runtime.py)")
def total_bytes(peak_allocated: np.ndarray, rows: RowOverheads) -> np.ndarray:
    return reserved_bytes(peak_allocated, rows) + rows.non_torch


@formula("usable_bytes", "gpu_memory − ⌈headroom · gpu_memory⌉", where="gpu_memory is mem_get_info's total "
         "(catalog/gpus.py); headroom is a safety margin kept free; rounded up so that the margin is never "
         "smaller than asked")
def usable_bytes(gpu_memory: np.ndarray, headroom: float) -> np.ndarray:
    mem = np.asarray(gpu_memory, dtype=np.int64)
    return mem - np.ceil(mem * float(headroom)).astype(np.int64)
