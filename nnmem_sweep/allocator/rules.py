"""Size rules of PyTorch's CUDA caching allocator (native backend), as pure functions of integer bytes.

Each function names the function of c10/cuda/CUDACachingAllocator.cpp (or c10/core/AllocatorConfig.cpp) whose
rule it models; the same citation is registered with `citations.formula`, so the report's "Formulas and sources"
section lists these rules once the lead imports this package. Written from reading the source, not copied.
"""
from __future__ import annotations

from ..citations import formula, source
from ..units import GiB, KiB, MiB

TORCH_ALLOCATOR = source(
    "torch-cuda-caching-allocator",
    "PyTorch c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator (native backend); rules checked against "
    "the installed torch 2.13.0 headers and two snapshots of the source that bracket it (see allocator/__init__.py)",
    "https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp")
TORCH_ALLOCATOR_CONFIG = source(
    "torch-allocator-config",
    "PyTorch c10/core/AllocatorConfig.{h,cpp} (AcceleratorAllocatorConfig) and c10/cuda/CUDAAllocatorConfig.h: "
    "the PYTORCH_CUDA_ALLOC_CONF options and their defaults",
    "https://github.com/pytorch/pytorch/blob/v2.13.0/c10/core/AllocatorConfig.h")

# c10/core/AllocatorConfig.h constants (the same values in every version read).
kMinBlockSize = 512  # every request is rounded to at least 512 B
kSmallSize = 1 * MiB  # the largest "small" request
kSmallBuffer = 2 * MiB  # small requests are packed in 2 MiB segments (and 2 MiB pages when expandable)
kMinLargeAlloc = 10 * MiB  # requests between 1 and 10 MiB get a large_segment_size segment
kRoundLarge = 2 * MiB  # larger requests are rounded up to 2 MiB
kLargeBuffer = 20 * MiB  # default large_segment_size, and default max_non_split_rounding_size

# AcceleratorAllocatorConfig::roundup_power2_divisions(size): 16 intervals, [1 MiB, 2 MiB), ..., [32 GiB, 64 GiB)
ROUNDUP_INTERVALS = 16
_ROUNDUP_START_LOG2 = 20  # 1 MiB


@formula("allocator_roundup_division_index", "clamp(⌊log2 size⌋ − 20, 0, 15)", TORCH_ALLOCATOR_CONFIG,
         where="AcceleratorAllocatorConfig::roundup_power2_divisions(size)",
         note="which of the 16 power-of-two intervals from 1 MiB to 64 GiB a request falls in")
def roundup_division_index(size: int) -> int:
    return min(max(size.bit_length() - 1 - _ROUNDUP_START_LOG2, 0), ROUNDUP_INTERVALS - 1)


@formula("allocator_roundup_power2_next_division",
         "size if size is a power of 2, else ⌈size / (2^⌊log2 size⌋ / d)⌉ · 2^⌊log2 size⌋ / d", TORCH_ALLOCATOR,
         where="roundup_power2_next_division", note="d must be a power of two (the config refuses anything else)")
def roundup_power2_next_division(size: int, divisions: int) -> int:
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)  # power2_floor >> log2(divisions)
    if step == 0:
        return floor << 1
    return -(-size // step) * step


@formula("allocator_round_size_bytes",
         "max(512, ⌈size / 512⌉ · 512); with d = roundup_power2_divisions(size) > 1 and size > 512·d: "
         "roundup_power2_next_division(size, d)", TORCH_ALLOCATOR, where="round_size")
def round_size(size: int, divisions: int = 0) -> int:
    """The bytes a request of `size` occupies (`allocated_bytes` counts these). `divisions` is the
    roundup_power2_divisions entry for this size (0 or 1: plain 512 B rounding)."""
    if size < kMinBlockSize:
        return kMinBlockSize
    if divisions > 1 and size > kMinBlockSize * divisions:
        return roundup_power2_next_division(size, divisions)
    return -(-size // kMinBlockSize) * kMinBlockSize


@formula("allocator_is_small_pool", "rounded size ≤ 1 MiB", TORCH_ALLOCATOR, where="get_pool (kSmallSize)")
def is_small(rounded: int) -> bool:
    return rounded <= kSmallSize


@formula("allocator_segment_bytes",
         "2 MiB if size ≤ 1 MiB; large_segment_size (20 MiB) if size < 10 MiB; else ⌈size / 2 MiB⌉ · 2 MiB",
         TORCH_ALLOCATOR, where="get_allocation_size",
         note="the cudaMalloc size when no cached block fits; the native backend only")
def allocation_size(rounded: int, large_segment_bytes: int = kLargeBuffer) -> int:
    if rounded <= kSmallSize:
        return kSmallBuffer
    if rounded < kMinLargeAlloc:
        return large_segment_bytes
    return -(-rounded // kRoundLarge) * kRoundLarge


@formula("allocator_should_split",
         "small pool or expandable segments: remaining ≥ 512 B; large pool: size < max_split_size and "
         "remaining > 1 MiB", TORCH_ALLOCATOR, where="should_split",
         note="remaining = block size − rounded request; the allocated part keeps the low address (alloc_found_block)")
def should_split(block_size: int, rounded: int, small: bool, expandable: bool, max_split_bytes: int) -> bool:
    remaining = block_size - rounded
    if small or expandable:
        return remaining >= kMinBlockSize
    return rounded < max_split_bytes and remaining > kSmallSize


@formula("allocator_block_fits",
         "size < max_split_size: the block must be < max_split_size; size ≥ max_split_size: the block must be "
         "< size + max_non_split_rounding_size (20 MiB)", TORCH_ALLOCATOR, where="get_free_block",
         note="applied to the smallest free block ≥ size (lowest address on ties, BlockComparatorSize); "
         "if it fails, no other block is tried and a new segment is allocated")
def oversize_ok(block_size: int, rounded: int, max_split_bytes: int, non_split_rounding_bytes: int) -> bool:
    if rounded < max_split_bytes:
        return block_size < max_split_bytes
    return block_size < rounded + non_split_rounding_bytes


def format_size(size: int) -> str:
    """PyTorch's format_size (CUDACachingAllocator.cpp): '512 bytes', '2.00 MiB', '79.19 GiB' (two decimals)."""
    if size <= KiB:
        return f"{size} bytes"
    if size <= MiB:
        return f"{size / KiB:.2f} KiB"
    if size <= GiB:
        return f"{size / MiB:.2f} MiB"
    return f"{size / GiB:.2f} GiB"
