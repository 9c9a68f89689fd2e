"""Grid expansion: size before allocation, row order, dtypes, the max_rows guard."""
import numpy as np
import pandas as pd
import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.errors import UsageError
from nnmem_sweep.grid import expand_grid, grid_size
from nnmem_sweep.scenario import GPUSpec

from components.tiny_models import TINY_LLAMA, scenario

A = GPUSpec("a", "A", 10 << 30, "test")
B = GPUSpec("b", "B", 20 << 30, "test")


def test_size_is_product_of_axes_times_gpus():
    sc = scenario(TINY_LLAMA, batch=[1, 2, 4], seq_len=[8, 16], precision=["fp32", "bf16"], gpus=(A, B))
    assert grid_size(sc) == 3 * 2 * 2 * 2


def test_long_format_rows_and_order():
    sc = scenario(TINY_LLAMA, batch=[1, 2], seq_len=[8, 16], gpus=(A, B))
    f = expand_grid(sc)
    assert len(f) == 8
    # batch varies slowest, then seq_len ..., the GPU fastest
    assert f[C.BATCH].tolist() == [1, 1, 1, 1, 2, 2, 2, 2]
    assert f[C.SEQ_LEN].tolist() == [8, 8, 16, 16] * 2
    assert f[C.GPU].tolist() == ["a", "b"] * 4
    assert f[C.GPU_MEMORY].tolist() == [10 << 30, 20 << 30] * 4
    # every combination exactly once
    assert not f.duplicated(list(C.GRID_AXES) + [C.GPU]).any()


def test_dtypes():
    f = expand_grid(scenario(TINY_LLAMA, batch=[1, 2], precision=["fp32", "bf16"]))
    for col in (C.BATCH, C.SEQ_LEN, C.CACHE_TOKENS, C.DECODE_TOKENS, C.GPU_MEMORY):
        assert f[col].dtype == np.int64, col
    for col in (C.PRECISION, C.OPTIMIZER, C.OPTIMIZER_IMPL, C.CHECKPOINTING, C.ATTENTION, C.GPU):
        assert isinstance(f[col].dtype, pd.CategoricalDtype), col


def test_over_max_rows_names_size_and_override():
    sc = scenario(TINY_LLAMA, batch=list(range(1, 101)), seq_len=list(range(1, 101)))
    with pytest.raises(UsageError, match=r"10,000 rows.*--max-rows"):
        expand_grid(sc, max_rows=9_999)
    assert len(expand_grid(sc, max_rows=10_000)) == 10_000
