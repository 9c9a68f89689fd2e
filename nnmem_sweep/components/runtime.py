"""Memory a GPU process needs besides the tensors a CPU trace sees (issue 13), as pure functions over sourced data
(catalog/runtime.json). Two places, kept apart because only one of them is outside PyTorch's statistics:

- outside the caching allocator (`non_torch_bytes`): the CUDA context with the library modules loaded into it, and
  NCCL's communicator buffers. `nvidia-smi` sees them, `torch.cuda.memory_reserved()` does not.
- inside the caching allocator but absent from a CPU/FakeTensor trace (`allocator_extra_bytes`): the cuBLAS(Lt)
  workspaces (allocated with CUDACachingAllocator since torch 2.0) and cuDNN's convolution workspaces.

`runtime_memory()` returns both with an itemised list (what, bytes, place, source, assumption) for a runtime
description such as {cuda: "12.4", torch: "2.6", lazy_loading: true} and a parallel layout; components/overhead.py
turns it into the estimate's per-row columns.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ..derive.side import stack_of
from ..scenario import GPUSpec
from ..units import KiB, format_bytes

DATA_PATH = Path(__file__).resolve().parent.parent / "catalog" / "runtime.json"
OUTSIDE, INSIDE = "outside the allocator", "inside the allocator"
LAYOUT_KEYS = ("data_parallel", "tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel")
ALL_TO_ALL_DIMS = ("expert_parallel",)  # dims whose collectives are all-to-all (MoE token dispatch)


@cache
def _data() -> dict[str, Any]:
    return json.loads(DATA_PATH.read_text(encoding="utf-8"))


def _version(text: Any, key: str) -> tuple[int, int] | None:
    if text is None:
        return None
    found = re.fullmatch(r"\s*(\d+)\.(\d+)(?:\.\d+)?(?:[+a-z].*)?\s*", str(text))
    if not found:
        raise ValueError(f"runtime.{key}: expected a version such as '12.4', got {text!r}")
    return int(found.group(1)), int(found.group(2))


@dataclass(frozen=True)
class Runtime:
    """What the process runs on; None = not stated (the estimate then says which default it took)."""

    cuda: tuple[int, int] | None = None
    torch: tuple[int, int] | None = None
    lazy_loading: bool | None = None  # CUDA_MODULE_LOADING=LAZY; None = the default of that torch and CUDA
    architecture: str | None = None  # the GPU generation: volta ... blackwell, cdna3 ...
    compute_capability: str | None = None  # "9.0" or a gfx target
    cublas_workspace_config: str | None = None  # CUBLAS_WORKSPACE_CONFIG, e.g. ":4096:8"
    cublaslt_unified_workspace: bool = True  # TORCH_CUBLASLT_UNIFIED_WORKSPACE (default on open-source CUDA builds)
    blas_handle_streams: int | None = None  # cuBLAS (handle, stream) pairs; None = 1 to infer, 2 to train


RUNTIME_KEYS = {"cuda", "torch", "lazy_loading", "cublas_workspace_config", "cublaslt_unified_workspace",
                "blas_handle_streams", "transformers", "peft"}
def parse_runtime(desc: dict[str, Any] | None, gpu: GPUSpec | None = None) -> Runtime:
    """{cuda: "12.4", torch: "2.6", lazy_loading: true, ...} (and the GPU's generation) -> Runtime; a bad key or
    value raises ValueError naming it."""
    desc = dict(desc or {})
    unknown = sorted(set(desc) - RUNTIME_KEYS)
    if unknown:
        raise ValueError(f"runtime: unknown key {unknown[0]!r}; known: {', '.join(sorted(RUNTIME_KEYS))}")
    for key in ("lazy_loading", "cublaslt_unified_workspace"):
        if desc.get(key) is not None and not isinstance(desc[key], bool):
            raise ValueError(f"runtime.{key}: expected true or false, got {desc[key]!r}")
    streams = desc.get("blas_handle_streams")
    if streams is not None and (isinstance(streams, bool) or not isinstance(streams, int) or streams < 1):
        raise ValueError(f"runtime.blas_handle_streams: expected a whole number >= 1, got {streams!r}")
    config = desc.get("cublas_workspace_config")
    if config is not None:
        cublas_config_bytes(config)  # validates
    stack_of(desc)  # validates runtime.transformers / runtime.peft
    return Runtime(cuda=_version(desc.get("cuda"), "cuda"), torch=_version(desc.get("torch"), "torch"),
                   lazy_loading=desc.get("lazy_loading"),
                   architecture=gpu.architecture if gpu else None,
                   compute_capability=gpu.compute_capability if gpu else None,
                   cublas_workspace_config=config,
                   cublaslt_unified_workspace=desc.get("cublaslt_unified_workspace", True),
                   blas_handle_streams=streams)


@dataclass(frozen=True)
class Item:
    what: str
    bytes: int
    place: str  # OUTSIDE or INSIDE
    source: str
    assumption: str = ""

    def line(self) -> str:
        text = f"{self.what}: {format_bytes(self.bytes, 'MiB', 0)} ({self.place}; {self.source})"
        return text + (f" [assumed: {self.assumption}]" if self.assumption else "")


@dataclass(frozen=True)
class RuntimeMemory:
    non_torch_bytes: int  # outside the caching allocator
    allocator_extra_bytes: int  # inside it, but not in a CPU trace of the step
    items: tuple[Item, ...]

    def lines(self) -> list[str]:
        return [i.line() for i in self.items]


# ------------------------------------------------------------------------------------------------ CUDA context

def lazy_loading_in_effect(rt: Runtime) -> tuple[bool, str]:
    """Whether CUDA loads kernels lazily, and why: CUDA >= 11.7 can; torch >= 1.13 sets CUDA_MODULE_LOADING=LAZY
    when the user did not (pytorch#86509)."""
    lz = _data()["lazy_loading"]
    min_cuda, min_torch = _version(lz["min_cuda"], "cuda"), _version(lz["min_torch"], "torch")
    if rt.cuda is not None and rt.cuda < min_cuda:
        return False, f"CUDA {rt.cuda[0]}.{rt.cuda[1]} < {lz['min_cuda']} has no lazy loading ({lz['url_cuda']})"
    if rt.lazy_loading is not None:
        return rt.lazy_loading, "as given (CUDA_MODULE_LOADING)"
    if rt.torch is not None and rt.torch < min_torch:
        return False, f"torch < {lz['min_torch']} leaves CUDA_MODULE_LOADING unset, i.e. eager ({lz['url_torch']})"
    return True, f"torch >= {lz['min_torch']} sets CUDA_MODULE_LOADING=LAZY ({lz['url_torch']})"


@dataclass(frozen=True)
class Estimate:
    bytes: int  # the default: the upper end of the range
    low: int
    high: int
    rows: tuple[str, ...]  # ids of the measurements used
    note: str


def cuda_context_bytes(rt: Runtime) -> Estimate:
    """The CUDA context with the modules a step loads, outside the allocator. From the measurements with the same
    loading mode whose GPU generation is this one or unstated; their range, and its upper end as the estimate."""
    lazy, why = lazy_loading_in_effect(rt)
    rows = [r for r in _data()["cuda_context"] if r["lazy_loading"] == lazy
            and (r["architecture"] is None or r["architecture"] == rt.architecture)]
    lows = [r["measured_low"] - r["allocator_included"] for r in rows]
    highs = [r["measured_high"] - r["allocator_included"] for r in rows]
    mode = "lazy" if lazy else "eager"
    own = sum(not r["url"].startswith("https://") for r in rows)  # this project's GPU-kit runs (validation/gpu/)
    counted = f"{len(rows) - own} public measurements" + (f" and {own} run(s) of this project's GPU kit"
                                                          if own else "")
    note = (f"{mode} module loading ({why}); {format_bytes(min(lows), 'MiB', 0)} .. "
            f"{format_bytes(max(highs), 'MiB', 0)} in {counted}, upper end taken")
    return Estimate(max(highs), min(lows), max(highs), tuple(r["id"] for r in rows), note)


# ------------------------------------------------------------------------------------------------ cuBLAS

def cublas_config_bytes(config: str) -> int:
    """CUBLAS_WORKSPACE_CONFIG ":SIZE:COUNT[:SIZE:COUNT...]" -> bytes: sum of SIZE KiB x COUNT, as
    CublasHandlePool.cpp's parseChosenWorkspaceSize reads it."""
    pairs = re.findall(r":([0-9]+):([0-9]+)", str(config))
    if not pairs or re.sub(r":[0-9]+:[0-9]+", "", str(config)).strip():
        raise ValueError(f"runtime.cublas_workspace_config: expected ':SIZE:COUNT' pairs such as ':4096:8', "
                         f"got {config!r}")
    return sum(int(size) * KiB * int(count) for size, count in pairs)


def large_cublas_workspace_bytes() -> int:
    """One cuBLAS workspace on compute capability 9.x and up (Hopper, Blackwell): 32 MiB."""
    return int(_data()["cublas"]["large_bytes"])


def cublas_workspace(rt: Runtime, mode: str = "train") -> list[Item]:
    """cuBLAS (and, when not unified, cuBLASLt) workspaces: one per (handle, stream) pair. Through the caching
    allocator since torch 2.0 (pytorch#95668 shows 8,519,680 B in memory_allocated after one Linear; 1.13 did not);
    32 MiB on compute capability 9.x, 10.x and 12.x, else 8,519,680 B (":4096:2:16:8")."""
    cb = _data()["cublas"]
    major = int(rt.compute_capability.split(".")[0]) if rt.compute_capability and \
        rt.compute_capability[0].isdigit() else None
    if rt.cublas_workspace_config is not None:
        size, size_why = cublas_config_bytes(rt.cublas_workspace_config), "CUBLAS_WORKSPACE_CONFIG as given"
    elif major in cb["large_cc_majors"]:
        size, size_why = cb["large_bytes"], f"32 MiB default on compute capability {major}.x"
    else:
        size, size_why = cb["default_bytes"], (":4096:2:16:8 default" if major is not None else
                                               ":4096:2:16:8 default (compute capability unknown)")
    pairs = rt.blas_handle_streams or (2 if mode == "train" else 1)
    pair_why = "" if rt.blas_handle_streams else (
        "training: the forward runs on the main thread, backward on autograd's device thread, each reserving its "
        "own handle (thread-local pool window)" if mode == "train" else "inference: one thread, one stream")
    in_allocator = rt.torch is None or rt.torch >= _version(cb["allocator_since_torch"], "torch")
    source = f"{cb['url_sizes']} ({size_why}); allocator since torch {cb['allocator_since_torch']}: " \
             f"{cb['url_allocator']}"
    assumption = pair_why
    if not in_allocator:
        assumption = "; ".join(x for x in (pair_why, "torch < 2.0: cuBLAS allocates its own workspace; taken as the "
                                           "same size") if x)
    items = [Item(f"cuBLAS workspace, {pairs} handle-stream pair(s) x {format_bytes(size, 'MiB', 2)}",
                  pairs * size, INSIDE if in_allocator else OUTSIDE, source, assumption)]
    if not rt.cublaslt_unified_workspace:
        lt = cb["lt_separate_kib"] * KiB
        items.append(Item(f"cuBLASLt workspace (not unified), {pairs} x {format_bytes(lt, 'MiB', 2)}", pairs * lt,
                          INSIDE, f"CUBLASLT_WORKSPACE_SIZE default 1024 KiB: {cb['url_sizes']}", pair_why))
    return items


# ------------------------------------------------------------------------------------------------ NCCL

def _upper(kind: str) -> tuple[int, str]:
    rows = [r for r in _data()["nccl"] if r["kind"] == kind]
    top = max(rows, key=lambda r: r["measured_high"])
    return top["measured_high"], f"{top['url']} (upper end of {len(rows)} measurement(s))"


def nccl_bytes(groups: dict[str, int], architecture: str | None = None) -> list[Item]:
    """NCCL buffers per GPU: one communicator per parallel dimension of size > 1 (ProcessGroupNCCL creates one per
    group), each costing the largest published per-communicator figure; dimensions listed in ALL_TO_ALL_DIMS add
    the all-to-all connections measured on 8 x H100. Memory grows with channels, not with group size beyond two
    nodes (NVIDIA/nccl#986), so the size itself only decides whether a communicator exists."""
    unknown = sorted(set(groups) - set(LAYOUT_KEYS))
    if unknown:
        raise ValueError(f"layout: unknown parallel dimension {unknown[0]!r}; known: {', '.join(LAYOUT_KEYS)}")
    per_comm, comm_src = _upper("collective")
    a2a, a2a_src = _upper("all_to_all")
    items = []
    for dim in LAYOUT_KEYS:
        size = int(groups.get(dim, 1) or 1)
        if size <= 1:
            continue
        assumption = "" if architecture in ("hopper", "ampere") else (
            f"measured on 80 GB Ampere/Hopper parts; taken as is for {architecture or 'an unstated GPU'}")
        if dim == "pipeline_parallel":
            assumption = "; ".join(x for x in ("send/recv between neighbouring stages: no pipeline-only "
                                               "measurement was found, the collective figure bounds it",
                                               assumption) if x)
        items.append(Item(f"NCCL communicator, {dim} group of {size}", per_comm, OUTSIDE, comm_src, assumption))
        if dim in ALL_TO_ALL_DIMS:
            items.append(Item(f"NCCL all-to-all connections, {dim} group of {size}", a2a, OUTSIDE, a2a_src,
                              assumption))
    return items


# ------------------------------------------------------------------------------------------------ cuDNN

def cudnn_workspace(has_convolutions: bool, cap_bytes: int | None = None) -> list[Item]:
    """Convolution workspaces come from the caching allocator, are freed after the call, and PyTorch skips an
    algorithm whose workspace cannot be allocated (pytorch#49207): they bound nothing by themselves, but can take all
    memory left free for the moment of the call. Counted as 0 unless a cap is given."""
    if not has_convolutions:
        return []
    src = _data()["cudnn"]["url"]
    if cap_bytes is None:
        return [Item("cuDNN convolution workspace (transient)", 0, INSIDE, src,
                     "algorithms whose workspace does not fit are skipped, so it adapts to free memory")]
    return [Item("cuDNN convolution workspace (transient), cap as given", int(cap_bytes), INSIDE, src)]


# ------------------------------------------------------------------------------------------------ all of it

def runtime_memory(runtime: dict[str, Any] | Runtime | None, layout: dict[str, int] | None = None,
                   gpu: GPUSpec | None = None, mode: str = "train", has_convolutions: bool = False,
                   cudnn_cap_bytes: int | None = None) -> RuntimeMemory:
    """Everything above for one process (one GPU): non_torch_bytes, allocator_extra_bytes and the items."""
    rt = runtime if isinstance(runtime, Runtime) else parse_runtime(runtime, gpu)
    ctx = cuda_context_bytes(rt)
    urls = dict.fromkeys(r["url"] for r in _data()["cuda_context"] if r["id"] in ctx.rows)
    context = Item("CUDA context and loaded modules", ctx.bytes, OUTSIDE, "; ".join(urls), ctx.note)
    items = [context, *cublas_workspace(rt, mode), *nccl_bytes(layout or {}, rt.architecture),
             *cudnn_workspace(has_convolutions, cudnn_cap_bytes)]
    outside = sum(i.bytes for i in items if i.place == OUTSIDE)
    inside = sum(i.bytes for i in items if i.place == INSIDE)
    return RuntimeMemory(outside, inside, tuple(items))
