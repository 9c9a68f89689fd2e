"""AllocatorOptions: PYTORCH_CUDA_ALLOC_CONF names, defaults and the checks AllocatorConfig.cpp makes."""
from __future__ import annotations

import pytest

from nnmem_sweep.allocator import AllocatorOptions
from nnmem_sweep.units import MiB


def test_defaults_are_pytorchs():
    o = AllocatorOptions()
    assert (o.expandable_segments, o.max_split_size_mb, o.divisions_table()) == (False, None, (0,) * 16)
    assert (o.non_split_rounding_bytes, o.large_segment_bytes) == (20 * MiB, 20 * MiB)


def test_divisions_list_syntax():
    # torch_npu's test_roundup_power2_divisions spells out what "[8:1,64:4,128:8,256:2,>:16]" means per interval:
    # 0:1, 1:1, 2:1, 3:1, 4:0, 5:0, 6:4, 7:8, 8:2, 9..15:16 (the first entry also covers the smaller intervals)
    o = AllocatorOptions.from_alloc_conf("roundup_power2_divisions:[8:1,64:4,128:8,256:2,>:16]")
    assert o.divisions_table() == (1, 1, 1, 1, 0, 0, 4, 8, 2) + (16,) * 7


def test_max_split_size_20_is_accepted():
    assert AllocatorOptions.from_alloc_conf("max_split_size_mb:20").max_split_bytes == 20 * MiB


def test_from_alloc_conf():
    o = AllocatorOptions.from_alloc_conf("expandable_segments:True, max_split_size_mb:128,roundup_power2_divisions:4")
    assert o == AllocatorOptions(expandable_segments=True, max_split_size_mb=128, roundup_power2_divisions=4)


@pytest.mark.parametrize("conf, message", [
    ("max_split_size_mb:19", "max_split_size_mb 19: must be an integer >= 20"),
    ("max_non_split_rounding_mb:4", "max_non_split_rounding_mb 4: must be an integer >= 20"),
    ("roundup_power2_divisions:3", "roundup_power2_divisions 3: must be a power of 2 or 0"),
    ("roundup_power2_divisions:[96:4]", "the size must be a power of 2"),
    ("expandable_segments:yes", "expected True or False"),
    ("garbage_collection_threshold:0.6", "'garbage_collection_threshold' is not modelled"),
    ("max_split_size_mb", "expected key:value"),
])
def test_bad_options_name_the_value(conf, message):
    with pytest.raises(ValueError, match=message):
        AllocatorOptions.from_alloc_conf(conf)
