"""What a real run is measured with: the GPU's own counters (CudaMeter), or on the CPU a count of live tensor
storages (HostMeter, the kit's twin that runs in `make test`).

Both are `workload.steps.Phases`: `run_steps` reports each phase to them. Per phase they keep the peak bytes
allocated (torch.cuda.max_memory_allocated; on the host, the largest total of live storages, what MemTracker
counts), the peak reserved (max_memory_reserved; the host has no caching allocator: the same as allocated) and
the wall time. Both can be capped (`limit`): CUDA through torch.cuda.set_per_process_memory_fraction, the host by
raising torch.OutOfMemoryError at the allocation that crosses the cap, so the least-capacity bisection
(measure/real.py) runs the same code on both.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from ..derive.trace import Recorder
from ..gpu_points import others_bytes

# torch.cuda.memory_stats() keys kept per phase: peaks of what the allocator holds, and counters
PEAK_STATS = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "active_bytes.all.peak",
              "requested_bytes.all.peak", "inactive_split_bytes.all.peak", "segment.all.peak")
COUNT_STATS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")


class _Phases:
    """The per-phase records both meters keep: {phase, step, seconds, max_allocated, max_reserved, ...}."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def step_done(self) -> None:
        pass

    def saw_cache(self, cache) -> None:  # noqa: ANN001 - run_steps' optional hook
        pass


class CudaMeter(_Phases):
    """torch.cuda's counters, reset at the start of every phase (so each phase's peaks are its own)."""

    device = "cuda"

    def __init__(self) -> None:
        super().__init__()
        self.total = int(torch.cuda.mem_get_info()[1])

    @contextlib.contextmanager
    def run(self, externals=()):  # noqa: ANN001
        yield self

    @contextlib.contextmanager
    def phase(self, name: str, step: int):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        yield
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        stats = torch.cuda.memory_stats()
        self.records.append({
            "phase": name, "step": step, "seconds": round(seconds, 6),
            "max_allocated": int(torch.cuda.max_memory_allocated()), "max_reserved": int(torch.cuda.max_memory_reserved()),
            "end_allocated": int(torch.cuda.memory_allocated()), "end_reserved": int(torch.cuda.memory_reserved()),
            **{k: int(stats.get(k, 0)) for k in PEAK_STATS + COUNT_STATS}})

    def allocated(self) -> int:
        return int(torch.cuda.memory_allocated())

    def outside_bytes(self) -> int:
        """What the process holds on the GPU outside PyTorch's allocator (the CUDA context, library modules):
        mem_get_info's used memory minus what the allocator has reserved, minus OTHERS_ENV: what other processes held
        when this one was started (the GPU kit's parent, its own context, for a point run in a child process)."""
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return int(total - free - torch.cuda.memory_reserved() - (others_bytes() or 0))

    def limit(self, nbytes: int | None) -> None:
        """Cap what the allocator may reserve (None: the whole device)."""
        torch.cuda.set_per_process_memory_fraction(1.0 if nbytes is None else min(nbytes / self.total, 1.0))

    def release(self) -> None:
        """Return every cached block to the driver: the next run starts from an empty cache."""
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class _CappedRecorder(Recorder):
    """derive's storage recorder, with a cap: the allocation that takes the live total over it raises
    torch.OutOfMemoryError, as the CUDA allocator does when it cannot reserve more."""

    def __init__(self, cap: int | None) -> None:
        super().__init__()
        self.cap = cap
        self.live = 0
        self.peak = 0

    def _record(self, sid: int, signed_bytes: int, op: str) -> None:
        super()._record(sid, signed_bytes, op)
        self.live += signed_bytes
        if self.live > self.peak:
            self.peak = self.live
        if self.cap is not None and signed_bytes > 0 and self.live > self.cap and op:
            raise torch.OutOfMemoryError(f"host meter: {self.live:,} B live over the cap of {self.cap:,} B")


class HostMeter(_Phases):
    """The CPU twin of CudaMeter: real CPU tensors, every storage counted from its allocation to its free (what
    PyTorch's MemTracker counts on the cpu device), no caching allocator, so reserved = allocated."""

    device = "cpu"

    def __init__(self) -> None:
        super().__init__()
        self.cap: int | None = None
        self._rec: _CappedRecorder | None = None
        self.total = 0

    @contextlib.contextmanager
    def run(self, externals=()):  # noqa: ANN001
        """Count from here: the storages in `externals` (the model, inputs, optimizer state) and every one made
        inside."""
        rec = _CappedRecorder(self.cap)
        rec.external(list(externals), "external")
        self._rec = rec
        try:
            with rec:
                yield self
        finally:
            self._rec = None

    @contextlib.contextmanager
    def phase(self, name: str, step: int):
        rec = self._rec
        if rec is None:
            raise RuntimeError("HostMeter.phase outside HostMeter.run")
        rec.peak = rec.live
        t0 = time.perf_counter()
        yield
        self.records.append({"phase": name, "step": step, "seconds": round(time.perf_counter() - t0, 6),
                             "max_allocated": rec.peak, "max_reserved": rec.peak, "end_allocated": rec.live,
                             "end_reserved": rec.live})

    def allocated(self) -> int:
        return self._rec.live if self._rec is not None else 0

    def outside_bytes(self) -> None:
        return None  # no device context on the host

    def limit(self, nbytes: int | None) -> None:
        self.cap = nbytes

    def release(self) -> None:
        pass


def meter_for(device: str):
    """CudaMeter for "cuda", HostMeter for "cpu" (real tensors)."""
    if device == "cuda":
        return CudaMeter()
    if device == "cpu":
        return HostMeter()
    raise ValueError(f"device {device!r}: use cuda or cpu")
