"""A model of PyTorch's CUDA caching allocator (native backend): replay a step's allocations, get what
torch.cuda.max_memory_reserved() / max_memory_allocated() and the out-of-memory verdict would be.

    from nnmem_sweep.allocator import AllocatorOptions, replay
    result = replay(events, AllocatorOptions(expandable_segments=True), capacity_bytes=...)

Which source: the rules were read in c10/cuda/CUDACachingAllocator.cpp and c10/core/AllocatorConfig.{h,cpp}. The
index holds no copy at the v2.13.0 or v2.14.1 tags, so they were read in two snapshots that bracket both: an older
one (CUDAAllocatorConfig still holding the options, before large_segment_size and max_non_split_rounding_mb) and a
newer one (with expandable_segments_reserve, which neither release has). The releases themselves were checked where
they can be: c10/core/AllocatorConfig.h (kMinBlockSize, kSmallSize, kSmallBuffer, kMinLargeAlloc, kRoundLarge,
large_segment_size 20 MiB, max_non_split_rounding_size) is byte-identical in the 2.13.0 and 2.14.1 wheels; their
libc10.so print the same option checks; 2.14.1's libc10_cuda.so gives the out-of-memory text. Every rule modelled
here reads the same in both snapshots at the default settings; where they differ the newer reading is used (large
pool segments and expandable pages of large_segment_size; max_non_split_rounding_size; the oversize release
skipping expandable blocks; equal-size ties broken by segment age, then address, which our synthetic addresses
make the same thing). No modelled rule was found to differ between 2.13.0 and 2.14.1.

One stream only; see model.py for what else is not modelled.
"""
from .model import BlockInfo, CachingAllocatorModel, SegmentInfo
from .options import AllocatorOptions
from .replay import Prepared, ReplayResult, oom_message, prepare, replay
from .rules import format_size

__all__ = ["AllocatorOptions", "BlockInfo", "CachingAllocatorModel", "Prepared", "ReplayResult", "SegmentInfo",
           "format_size", "oom_message", "prepare", "replay"]
