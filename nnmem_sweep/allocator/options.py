"""The allocator options a replay honours, under their PYTORCH_CUDA_ALLOC_CONF names.

Defaults and checks follow c10/core/AllocatorConfig.cpp (AcceleratorAllocatorConfig::parse*): max_split_size_mb and
max_non_split_rounding_mb must be ≥ 20 (older releases refused 20 itself; the libc10.so of 2.13.0 and 2.14.1 both
print "must be >= "), divisions are powers of two (0 or 1 = off). `garbage_collection_threshold` is not modelled: it acts only when a per-process
memory fraction is set (DeviceCachingAllocator::malloc), which a capacity plan does not do.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..units import MiB
from .rules import ROUNDUP_INTERVALS, kLargeBuffer, roundup_division_index

# A roundup_power2_divisions list entry: (interval start in MiB, a power of two, or ">" for every later interval,
# divisions). "[256:4,>:1]" is ((256, 4), (">", 1)).
DivisionEntry = tuple[int | str, int]


def _power_of_two_or_zero(n: int) -> bool:
    return n >= 0 and n & (n - 1) == 0


@dataclass(frozen=True)
class AllocatorOptions:
    expandable_segments: bool = False
    max_split_size_mb: int | None = None  # None: unlimited (every block may be split)
    roundup_power2_divisions: int | tuple[DivisionEntry, ...] = 0
    max_non_split_rounding_mb: int = kLargeBuffer // MiB
    large_segment_size_mb: int = kLargeBuffer // MiB

    def __post_init__(self) -> None:
        minimum = {"max_split_size_mb": kLargeBuffer // MiB, "max_non_split_rounding_mb": kLargeBuffer // MiB,
                   "large_segment_size_mb": 1}
        for name, least in minimum.items():
            value = getattr(self, name)
            if value is None and name == "max_split_size_mb":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} {value!r}: must be an integer >= {least} "
                                 "(AcceleratorAllocatorConfig::parse*)")
        self.divisions_table()  # validates roundup_power2_divisions

    @property
    def max_split_bytes(self) -> int:
        """max_split_size in bytes; unlimited is larger than any request (the source uses SIZE_MAX)."""
        return 1 << 63 if self.max_split_size_mb is None else self.max_split_size_mb * MiB

    @property
    def non_split_rounding_bytes(self) -> int:
        return self.max_non_split_rounding_mb * MiB

    @property
    def large_segment_bytes(self) -> int:
        return self.large_segment_size_mb * MiB

    def divisions_table(self) -> tuple[int, ...]:
        """The 16 per-interval division counts (AcceleratorAllocatorConfig::parseRoundUpPower2Divisions)."""
        spec = self.roundup_power2_divisions
        if isinstance(spec, int) and not isinstance(spec, bool):
            if not _power_of_two_or_zero(spec):
                raise ValueError(f"roundup_power2_divisions {spec!r}: must be a power of 2 or 0")
            return (spec,) * ROUNDUP_INTERVALS
        table = [0] * ROUNDUP_INTERVALS
        last, first = 0, True
        for entry in spec:
            key, divisions = entry
            if not _power_of_two_or_zero(divisions):
                raise ValueError(f"roundup_power2_divisions entry {entry!r}: divisions must be a power of 2 or 0")
            if key == ">":
                table[last + 1:] = [divisions] * (ROUNDUP_INTERVALS - last - 1)
                continue
            if isinstance(key, bool) or not isinstance(key, int) or key < 1 or key & (key - 1):
                raise ValueError(f"roundup_power2_divisions entry {entry!r}: the size must be a power of 2 (MiB) "
                                 "or '>'")
            index = roundup_division_index(key * MiB)
            if first:  # the first entry also covers every smaller interval
                table[:index] = [divisions] * index
                first = False
            table[index] = divisions
            last = index
        return tuple(table)

    @classmethod
    def from_alloc_conf(cls, text: str) -> AllocatorOptions:
        """'expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:[256:4,>:1]' -> options.
        Keys this model does not honour raise ValueError naming the key."""
        kwargs: dict = {}
        for key, value in _split_conf(text):
            if key == "expandable_segments":
                if value not in ("True", "False"):
                    raise ValueError(f"expandable_segments {value!r}: expected True or False")
                kwargs[key] = value == "True"
            elif key in ("max_split_size_mb", "max_non_split_rounding_mb", "large_segment_size_mb"):
                kwargs[key] = _int(key, value)
            elif key == "roundup_power2_divisions":
                if value.startswith("["):
                    pairs = [item.split(":") for item in value[1:-1].split(",") if item]
                    if any(len(p) != 2 for p in pairs):
                        raise ValueError(f"roundup_power2_divisions {value!r}: expected [size_mb:divisions,...]")
                    kwargs[key] = tuple((k if k == ">" else _int(key, k), _int(key, d)) for k, d in pairs)
                else:
                    kwargs[key] = _int(key, value)
            else:
                raise ValueError(f"allocator option {key!r} is not modelled (known: expandable_segments, "
                                 "max_split_size_mb, roundup_power2_divisions, max_non_split_rounding_mb, "
                                 "large_segment_size_mb)")
        return cls(**kwargs)


def _int(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{key} {text!r}: expected an integer") from None


def _split_conf(text: str) -> list[tuple[str, str]]:
    """Top-level 'key:value' pairs; a value in brackets keeps its commas and colons."""
    out, depth, start = [], 0, 0
    items = []
    compact = "".join(text.split())
    for i, ch in enumerate(compact):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(compact[start:i])
            start = i + 1
    items.append(compact[start:])
    for item in filter(None, items):
        key, sep, value = item.partition(":")
        if not sep or not value:
            raise ValueError(f"allocator option {item!r}: expected key:value")
        out.append((key, value))
    return out
