"""Replay a step's allocation sequence through the allocator model and report what PyTorch would: the peaks of
torch.cuda.max_memory_allocated() / max_memory_reserved(), the segments, and the out-of-memory verdict."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..citations import formula
from . import fast
from .model import CachingAllocatorModel
from .options import AllocatorOptions
from .rules import TORCH_ALLOCATOR, format_size


@dataclass(frozen=True)
class ReplayResult:
    """Integer bytes. Events are indexed from 0 in the order given; -1 where nothing happened."""

    peak_allocated_bytes: int  # max_memory_allocated(): the peak of the live rounded block sizes
    peak_reserved_bytes: int  # max_memory_reserved(): the peak of the segments' (mapped) bytes
    end_allocated_bytes: int
    end_reserved_bytes: int  # memory_reserved() after the last event replayed
    segments_allocated: int  # memory_stats()["num_device_alloc"]: cudaMalloc calls (page mappings when expandable)
    segments_released: int  # memory_stats()["num_device_free"]: cudaFree calls (unmappings when expandable)
    peak_allocated_event: int
    peak_reserved_event: int  # the event during which reserved memory first reached its peak
    events_replayed: int  # all of them, or up to and including the one that ran out of memory
    oom_event: int  # -1: the sequence completed
    oom_message: str  # "" when it completed; else PyTorch's OutOfMemoryError text (see oom_message())

    @property
    def oom(self) -> bool:
        return self.oom_event >= 0


def _checked(events) -> np.ndarray:
    arr = np.asarray(events)
    if arr.ndim != 2 or arr.shape[1] not in (2, 3) or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"events: expected an integer array of shape (n, 2) (id, ±nbytes) or (n, 3) (id, ±nbytes, "
                         f"stream), got {arr.dtype} {arr.shape}")
    return arr


def _streamed(arr: np.ndarray) -> bool:
    """Whether a sequence uses a stream besides the default one (its third column)."""
    return arr.shape[1] == 3 and bool(arr[:, 2].any())


@formula("allocator_replay_peak_reserved_bytes",
         "max over the step of Σ segment bytes, replaying every (id, ±nbytes) event through the caching allocator "
         "model", TORCH_ALLOCATOR, where="DeviceCachingAllocator::malloc / free; stats.reserved_bytes",
         note="one device; a sequence's events may name their streams (a pool per stream); zero-byte allocations "
         "never reach the allocator (allocate(0) returns an empty pointer)")
def replay(events, options: AllocatorOptions = AllocatorOptions(), capacity_bytes: int | None = None,
           device_total_bytes: int | None = None, engine: str = "auto", descending: bool = False) -> ReplayResult:
    """Replay `events`, an int array of shape (n, 2): column 0 a block id, column 1 +nbytes for its allocation and
    -nbytes for its free, or (n, 3) with column 2 the stream of each event's block (0: the default stream; the model
    keeps a pool per stream), or `prepare(events)`, to replay one sequence many times. `capacity_bytes` is what
    the allocator may reserve (mem_get_info's total less the memory outside the allocator; None: unlimited);
    `device_total_bytes` is mem_get_info's total, for the OOM message (default: capacity_bytes). Stops at the first
    allocation that runs out of memory, as PyTorch raises there. engine: "model" (model.py, the reference), "fast"
    (fast.py, compiled; not expandable segments) or "auto" (fast where it applies and numba is installed): both
    give the same result. descending: the new segments' synthetic addresses fall instead of rising (model.py): where
    the driver puts a segment decides ties between equal free blocks, and a plan cannot know it.

    Raises ValueError naming the event for a free of an unknown id, an id allocated twice, or a free whose size
    differs from its allocation.
    """
    prepared = events if isinstance(events, Prepared) else None
    use_fast = engine == "fast" or (engine == "auto" and fast.available() and not options.expandable_segments)
    if use_fast:
        if options.expandable_segments:
            raise ValueError("the compiled replay does not model expandable segments; use engine='model'")
        prepared = prepared or prepare(events)
        r = fast.run(prepared.ids, prepared.nbytes, options, capacity_bytes, prepared.live_peak, descending,
                     prepared.streams)
        oom = int(r[fast.OOM_EVENT])
        message = "" if oom < 0 else _oom_text(
            capacity_bytes, int(r[fast.END_RESERVED]), int(r[fast.END_ALLOCATED]),
            CachingAllocatorModel(options).request_sizes(int(r[fast.OOM_BYTES]))[1], device_total_bytes)
        return ReplayResult(*(int(r[k]) for k in (fast.PEAK_ALLOCATED, fast.PEAK_RESERVED, fast.END_ALLOCATED,
                                                  fast.END_RESERVED, fast.NUM_ALLOC, fast.NUM_FREE,
                                                  fast.PEAK_ALLOCATED_EVENT, fast.PEAK_RESERVED_EVENT,
                                                  fast.REPLAYED)), oom, message)
    model = CachingAllocatorModel(options, capacity_bytes, device_total_bytes, descending)
    live: dict[int, tuple[object, int]] = {}
    oom_event, message, replayed = -1, "", 0
    for i, (block_id, nbytes, *stream) in enumerate((prepared.events if prepared else _checked(events)).tolist()):
        model.event = i
        replayed = i + 1
        if nbytes > 0:
            if block_id in live:
                raise ValueError(f"event {i}: id {block_id} allocated again before its free")
            block = model.malloc(nbytes, stream[0] if stream else 0)
            if block is None:
                oom_event, message = i, oom_message(model, nbytes, device_total_bytes)
                break
            live[block_id] = (block, nbytes)
        elif nbytes < 0:
            entry = live.pop(block_id, None)
            if entry is None:
                raise ValueError(f"event {i}: free of id {block_id}, which is not allocated")
            if entry[1] != -nbytes:
                raise ValueError(f"event {i}: free of id {block_id} says {-nbytes} B, its allocation {entry[1]} B")
            model.free(entry[0])
    return ReplayResult(model.peak_allocated, model.peak_reserved, model.allocated, model.reserved,
                        model.num_device_alloc, model.num_device_free, model.peak_allocated_event,
                        model.peak_reserved_event, replayed, oom_event, message)


@dataclass(frozen=True)
class Prepared:
    """An event sequence checked once and made ready for many replays (its ids made dense for the compiled
    engine)."""

    events: np.ndarray
    ids: np.ndarray
    nbytes: np.ndarray
    live_peak: int  # the most allocations live at once
    streams: np.ndarray | None = None  # each event's stream numbered from 0 (the default stream), where any is not


def prepare(events) -> Prepared:
    """Check `events` (the ValueErrors replay raises, naming the event) and make it ready for replays."""
    arr = _checked(events).astype(np.int64, copy=False)
    ids, nbytes = fast.dense(arr) if len(arr) else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    i, reason = _first_bad_event(arr)
    if i >= 0:
        block_id, n = (int(x) for x in arr[i, :2])
        if reason == 1:
            raise ValueError(f"event {i}: id {block_id} allocated again before its free")
        if reason == 2:
            raise ValueError(f"event {i}: free of id {block_id}, which is not allocated")
        held = int(arr[:i][(arr[:i, 0] == block_id) & (arr[:i, 1] > 0), 1][-1])
        raise ValueError(f"event {i}: free of id {block_id} says {-n} B, its allocation {held} B")
    streams = None
    if _streamed(arr):
        _, streams = np.unique(np.concatenate([[0], arr[:, 2]]), return_inverse=True)  # the default stream: 0
        streams = np.ascontiguousarray(streams[1:].astype(np.int64).reshape(-1))
    return Prepared(arr, ids, nbytes, fast.peak_live(nbytes), streams)


def _first_bad_event(arr: np.ndarray) -> tuple[int, int]:
    """(index, reason) of the first malformed event, (-1, 0) if none: 1 an id allocated again before its free, 2 a
    free of an id not allocated, 3 a free whose size differs from its allocation. Each id's events, in order, must
    alternate allocation and free, starting with an allocation, each free the size of the allocation before it."""
    keep = np.flatnonzero(arr[:, 1] != 0) if len(arr) else np.zeros(0, dtype=np.int64)
    if not len(keep):
        return -1, 0
    ids, nb = arr[keep, 0], arr[keep, 1]
    order = np.lexsort((keep, ids))  # by id, then in event order
    sid, snb = ids[order], nb[order]
    first = np.ones(len(sid), dtype=bool)
    first[1:] = sid[1:] != sid[:-1]
    start = np.maximum.accumulate(np.where(first, np.arange(len(sid)), 0))
    odd = (np.arange(len(sid)) - start) % 2 == 1  # an id's 2nd, 4th, ... event: must be a free
    prev = np.concatenate([[0], snb[:-1]])
    reason = np.zeros(len(sid), dtype=np.int64)
    reason[odd & (snb > 0)] = 1
    reason[~odd & (snb < 0)] = 2
    reason[odd & (snb < 0) & (-snb != prev)] = 3
    bad = np.flatnonzero(reason)
    if not len(bad):
        return -1, 0
    j = bad[np.argmin(keep[order][bad])]
    return int(keep[order][j]), int(reason[j])


def oom_message(model: CachingAllocatorModel, nbytes: int, device_total_bytes: int | None = None) -> str:
    """The OutOfMemoryError text DeviceCachingAllocator::malloc builds (after it released the cached segments).

    "Tried to allocate" prints the segment size get_allocation_size gives (as the source does). "free" is the
    capacity less what is reserved; the NVML clause assumes this is the only process on the GPU and that the
    memory outside the allocator belongs to it. The closing advice is the text in torch 2.14.1's libc10_cuda.so
    (the 2.13.0 CPU wheel has no CUDA library to read it from).
    """
    return _oom_text(model.capacity, model.reserved, model.allocated, model.request_sizes(nbytes)[1],
                     device_total_bytes)


def _oom_text(capacity: int, reserved: int, allocated: int, alloc_size: int, device_total_bytes: int | None) -> str:
    total = device_total_bytes if device_total_bytes is not None else capacity
    free = max(capacity - reserved, 0)
    return (f"CUDA out of memory. Tried to allocate {format_size(alloc_size)}. GPU 0 has a total capacity of "
            f"{format_size(total)} of which {format_size(free)} is free. Including non-PyTorch memory, this process "
            f"has {format_size(total - free)} memory in use. Of the allocated memory {format_size(allocated)} "
            f"is allocated by PyTorch, and {format_size(reserved - allocated)} is reserved by PyTorch "
            "but unallocated." + OOM_ADVICE)


OOM_ADVICE = (" If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
              " to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/"
              "stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")
