"""Memory outside PyTorch's allocator statistics, and the capacity the estimate is compared with."""
from __future__ import annotations

import numpy as np

from ..citations import formula, source
from ..scenario import Overheads

TORCH_CUDA_NOTES = source("torch-cuda-memory", "PyTorch CUDA semantics: memory management (caching allocator, "
                          "reserved vs allocated), cuBLAS workspaces (CUBLAS_WORKSPACE_CONFIG)",
                          "https://pytorch.org/docs/stable/notes/cuda.html")


@formula("overhead_bytes", "cuda_context + cublas_workspace + ⌈f · peak_allocated⌉", TORCH_CUDA_NOTES,
         where="memory management; cuBLAS workspaces",
         note="f is the allocator reserve fraction (reserved minus allocated, as a fraction of allocated), "
         "rounded up to a whole byte")
def overhead_bytes(peak_allocated: np.ndarray, ov: Overheads, out: np.ndarray | None = None) -> np.ndarray:
    """Per row; `out` (an int64 array of the rows' shape) receives the same bits without temporaries."""
    peak = np.asarray(peak_allocated, dtype=np.int64)
    fixed = int(ov.cuda_context_bytes) + int(ov.cublas_workspace_bytes)
    if out is None:
        return fixed + np.ceil(peak * float(ov.allocator_reserve_fraction)).astype(np.int64)
    reserve = np.multiply(peak, float(ov.allocator_reserve_fraction))
    np.ceil(reserve, out=reserve)
    out[...] = reserve  # float64 -> int64 as astype casts it
    out += fixed
    return out


@formula("usable_bytes", "gpu_memory − ⌈headroom · gpu_memory⌉", where="headroom is a safety margin kept free; "
         "rounded up so that the margin is never smaller than asked")
def usable_bytes(gpu_memory: np.ndarray, headroom: float, out: np.ndarray | None = None) -> np.ndarray:
    """Per row; `out` (an int64 array of the rows' shape) receives the same bits without temporaries."""
    mem = np.asarray(gpu_memory, dtype=np.int64)
    if out is None:
        return mem - np.ceil(mem * float(headroom)).astype(np.int64)
    margin = np.multiply(mem, float(headroom))
    np.ceil(margin, out=margin)
    out[...] = margin  # float64 -> int64 as astype casts it
    return np.subtract(mem, out, out=out)
