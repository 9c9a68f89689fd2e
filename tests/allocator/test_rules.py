"""The size rules of c10/cuda/CUDACachingAllocator.cpp, each with hand-computed bytes."""
from __future__ import annotations

import pytest

from nnmem_sweep.allocator import AllocatorOptions, format_size
from nnmem_sweep.allocator.rules import (allocation_size, is_small, oversize_ok, round_size,
                                         roundup_power2_next_division, should_split)
from nnmem_sweep.units import GiB, MiB


@pytest.mark.parametrize("request_bytes, rounded", [
    (1, 512), (511, 512), (512, 512), (513, 1024), (1000, 1024),
    (MiB + 1, MiB + 512), (10 * MiB + 1, 10 * MiB + 512),
])
def test_round_size_multiple_of_512(request_bytes, rounded):
    assert round_size(request_bytes) == rounded


def test_roundup_power2_next_division_source_example():
    # the comment above roundup_power2_next_division: 1200 with 4 divisions of [1024, 2048) -> 1280
    assert roundup_power2_next_division(1200, 4) == 1280
    assert roundup_power2_next_division(2048, 4) == 2048  # powers of two are kept


def test_round_size_with_divisions():
    # divisions apply only above 512 * divisions: 1200 B with 4 divisions is plain 512-rounding (1536)
    assert round_size(1200, 4) == 1536
    # 84 MiB with 4 divisions of [64, 128) MiB: steps of 16 MiB -> 96 MiB
    assert round_size(84 * MiB, 4) == 96 * MiB
    assert round_size(84 * MiB, 8) == 88 * MiB
    assert round_size(64 * MiB, 4) == 64 * MiB
    assert round_size(84 * MiB, 1) == 84 * MiB  # 1 division: off


@pytest.mark.parametrize("rounded, small", [(512, True), (MiB, True), (MiB + 512, False)])
def test_small_pool_up_to_1_mib(rounded, small):
    assert is_small(rounded) is small


@pytest.mark.parametrize("rounded, segment", [
    (512, 2 * MiB), (MiB, 2 * MiB),  # small pool: 2 MiB segments
    (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB),  # 1-10 MiB: one 20 MiB segment
    (10 * MiB, 10 * MiB), (10 * MiB + 512, 12 * MiB), (100 * MiB + 1, 102 * MiB),  # else rounded up to 2 MiB
])
def test_allocation_size(rounded, segment):
    assert allocation_size(rounded) == segment


def test_allocation_size_follows_large_segment_size():
    assert allocation_size(5 * MiB, large_segment_bytes=64 * MiB) == 64 * MiB


UNLIMITED = AllocatorOptions().max_split_bytes


@pytest.mark.parametrize("block, rounded, small, expandable, split", [
    (2 * MiB, 2 * MiB - 512, True, False, True),  # small pool: 512 B left is enough
    (2 * MiB, 2 * MiB, True, False, False),
    (12 * MiB, 11 * MiB, False, False, False),  # large pool: exactly 1 MiB left stays in the block
    (12 * MiB, 11 * MiB - 512, False, False, True),  # 1 MiB + 512 B left: split
    (12 * MiB, 11 * MiB, False, True, True),  # expandable segments split whenever 512 B remain
])
def test_should_split(block, rounded, small, expandable, split):
    assert should_split(block, rounded, small, expandable, UNLIMITED) is split


def test_should_not_split_an_oversize_request():
    assert should_split(100 * MiB, 40 * MiB, False, False, 32 * MiB) is False
    assert should_split(100 * MiB, 30 * MiB, False, False, 32 * MiB) is True


def test_oversize_blocks_only_for_oversize_requests_within_20_mib():
    max_split, slack = 32 * MiB, 20 * MiB
    assert not oversize_ok(40 * MiB, 10 * MiB, max_split, slack)  # small request, oversize block
    assert oversize_ok(30 * MiB, 10 * MiB, max_split, slack)
    assert oversize_ok(60 * MiB, 41 * MiB, max_split, slack)  # 60 < 41 + 20
    assert not oversize_ok(60 * MiB, 40 * MiB, max_split, slack)  # 60 >= 40 + 20


@pytest.mark.parametrize("size, text", [
    (512, "512 bytes"), (1024, "1024 bytes"), (1536, "1.50 KiB"), (MiB, "1024.00 KiB"), (20 * MiB, "20.00 MiB"),
    (GiB, "1024.00 MiB"), (85_031_714_816, "79.19 GiB"),
])
def test_format_size(size, text):
    assert format_size(size) == text
