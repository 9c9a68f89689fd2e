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
def overhead_bytes(peak_allocated: np.ndarray, ov: Overheads) -> np.ndarray:
    peak = np.asarray(peak_allocated, dtype=np.int64)
    reserve = np.ceil(peak * float(ov.allocator_reserve_fraction)).astype(np.int64)
    return int(ov.cuda_context_bytes) + int(ov.cublas_workspace_bytes) + reserve


@formula("usable_bytes", "gpu_memory − ⌈headroom · gpu_memory⌉", where="headroom is a safety margin kept free; "
         "rounded up so that the margin is never smaller than asked")
def usable_bytes(gpu_memory: np.ndarray, headroom: float) -> np.ndarray:
    mem = np.asarray(gpu_memory, dtype=np.int64)
    return mem - np.ceil(mem * float(headroom)).astype(np.int64)
