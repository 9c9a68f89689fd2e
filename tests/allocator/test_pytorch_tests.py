"""Expected statistics that PyTorch's own tests state, reproduced by the model (each test names its source).

test/test_cuda.py::TestCuda::test_allocator_settings allocates float32 tensors of 21 Mi and 100 Mi elements and
checks the growth of memory_stats()["active_bytes.all.allocated"] against its power2_div(size, div) helper (the next
multiple of 2^⌊log2 size⌋ / div). test/test_cuda.py::TestCuda::test_out_of_memory checks the message of an
impossible request.
"""
from __future__ import annotations

import numpy as np
import pytest

from nnmem_sweep.allocator import AllocatorOptions, replay
from nnmem_sweep.units import GiB, MiB

NBYTES = 4 * 21 * 1024 * 1024  # 84 MiB
NBYTES_BIG = 4 * 100 * 1024 * 1024  # 400 MiB


def power2_div(size: int, div_factor: int) -> int:
    """test_allocator_settings' helper, in integers."""
    pow2 = 1
    while pow2 < size:
        pow2 *= 2
    if pow2 == size:
        return pow2
    step, ret = pow2 // 2 // div_factor, pow2 // 2
    while ret < size:
        ret += step
    return ret


def allocated_after_one(nbytes: int, conf: str) -> int:
    return replay(np.array([(0, nbytes)]), AllocatorOptions.from_alloc_conf(conf)).peak_allocated_bytes


@pytest.mark.parametrize("conf, nbytes, expected", [
    pytest.param("", NBYTES, NBYTES, id="test_allocator_settings-plain"),
    pytest.param("roundup_power2_divisions:4", NBYTES, power2_div(NBYTES, 4), id="test_allocator_settings-div4"),
    pytest.param("max_split_size_mb:40", NBYTES, NBYTES,
                 id="test_allocator_settings-max_split_40"),
    pytest.param("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]", NBYTES, power2_div(NBYTES, 8),
                 id="test_allocator_settings-list-84MiB"),
    pytest.param("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]", NBYTES_BIG,
                 power2_div(NBYTES_BIG, 2), id="test_allocator_settings-list-400MiB"),
])
def test_allocator_settings(conf, nbytes, expected):
    assert allocated_after_one(nbytes, conf) == expected


def test_allocator_settings_figures():
    # the same expectations in bytes: 84 MiB -> 96 MiB with 4 divisions, 88 MiB with 8; 400 MiB -> 512 MiB with 2
    assert (power2_div(NBYTES, 4), power2_div(NBYTES, 8), power2_div(NBYTES_BIG, 2)) == (96 * MiB, 88 * MiB,
                                                                                        512 * MiB)


def test_out_of_memory():
    # test_cuda.py::TestCuda::test_out_of_memory: torch.zeros(1024) then an 800000000 GiB request
    events = np.array([(0, 4096), (1, 1024 * 1024 * 1024 * 800000000)])
    r = replay(events, capacity_bytes=80 * GiB)
    assert r.oom_event == 1
    assert r.oom_message.startswith("CUDA out of memory. Tried to allocate 800000000.00 GiB. GPU 0 has a total "
                                    "capacity of")
