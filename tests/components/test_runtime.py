"""Memory outside the caching allocator and library workspaces (components/runtime.py, catalog/runtime.json):
hand-computed bytes from the sourced rows, the rules read from PyTorch's source, and properties."""
from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnmem_sweep.catalog.gpus import get_gpu
from nnmem_sweep.components import runtime as R
from nnmem_sweep.units import GiB, KiB, MiB

DATA = json.loads(R.DATA_PATH.read_text(encoding="utf-8"))
REPO = Path(__file__).resolve().parents[2]


def test_every_row_is_quoted_addressed_and_consistent() -> None:
    for row in DATA["cuda_context"] + DATA["nccl"]:
        # a public page, or this project's own committed GPU measurement
        assert row["quote"] and (row["url"].startswith("https://") or (REPO / row["url"]).is_file()), row["id"]
        assert 0 < row["measured_low"] <= row["measured_high"], row["id"]
        assert 0 <= row.get("allocator_included", 0) < row["measured_low"], row["id"]
    assert {r["lazy_loading"] for r in DATA["cuda_context"]} == {True, False}


@pytest.mark.parametrize("row_id, low, high", [
    # pytorch#86509: total - free printed to the byte
    ("pytorch-86509-lazy", 287_047_680, 287_047_680),
    # HF anatomy: NVML used // 1024**2 = 1343 -> 1343 MiB .. 1344 MiB less a byte
    ("hf-anatomy-v100", 1343 * MiB, 1344 * MiB - 1),
    # pytorch#28394: 1008.1875 - 0.9375 = 1007.25 MiB
    ("pytorch-28394-titanv", 1_056_178_176, 1_056_178_176),
    # ml-engineering B200: (168.34 - 167.64) GiB - 4.62 MiB with every figure at its two-decimal ends
    ("ml-engineering-b200", math.ceil(Fraction("0.69") * GiB - Fraction("4.625") * MiB),
     math.floor(Fraction("0.71") * GiB - Fraction("4.615") * MiB)),
    # ml-engineering H200: 139.80 GiB - 289.25 MiB - 139 x 1 GiB
    ("ml-engineering-h200", math.ceil(Fraction("0.795") * GiB - Fraction("289.255") * MiB),
     math.floor(Fraction("0.805") * GiB - Fraction("289.245") * MiB)),
    ("unsloth-zoo-1053-ada", 426 * MiB, 426 * MiB),
    ("unsloth-9362", 612 * MiB, 612 * MiB),
])
def test_context_rows_hold_what_the_source_prints(row_id: str, low: int, high: int) -> None:
    row = next(r for r in DATA["cuda_context"] if r["id"] == row_id)
    assert (row["measured_low"], row["measured_high"]) == (low, high)


def test_vllm_tp2_row_is_the_difference_of_the_two_printed_figures() -> None:
    row = next(r for r in DATA["nccl"] if r["id"] == "vllm-10511-tp2")
    # non_torch_memory 1.79 GiB at TP 1, 3.58 GiB at TP 2 -> 1.78 .. 1.80 GiB
    assert (row["measured_low"], row["measured_high"]) == (math.ceil(Fraction("1.78") * GiB),
                                                           math.floor(Fraction("1.80") * GiB))


@pytest.mark.parametrize("config, expected", [
    (":4096:2:16:8", 4096 * KiB * 2 + 16 * KiB * 8),  # 8,519,680 B: PyTorch's default (FORMULAS.md)
    (":4096:8", 32 * MiB),
    (":16:8", 128 * KiB),
])
def test_cublas_workspace_config_is_read_as_size_kib_times_count(config: str, expected: int) -> None:
    assert R.cublas_config_bytes(config) == expected
    assert R.cublas_config_bytes(":4096:2:16:8") == 8_519_680


@pytest.mark.parametrize("bad", ["4096:8", ":4096", ":4096:8x", ""])
def test_a_malformed_cublas_workspace_config_is_an_error(bad: str) -> None:
    with pytest.raises(ValueError, match="runtime.cublas_workspace_config"):
        R.cublas_config_bytes(bad)


@pytest.mark.parametrize("gpu_id, per_pair", [
    ("a100-80gb", 8_519_680), ("rtx-4090", 8_519_680), ("v100-16gb", 8_519_680),
    ("h100-sxm", 32 * MiB), ("b200", 32 * MiB), ("rtx-5090", 32 * MiB),  # compute capability 9.x, 10.x, 12.x
])
def test_cublas_workspace_is_32_mib_on_hopper_and_blackwell(gpu_id: str, per_pair: int) -> None:
    gpu = get_gpu(gpu_id)
    train = R.cublas_workspace(R.parse_runtime({"torch": "2.13"}, gpu), "train")
    infer = R.cublas_workspace(R.parse_runtime({"torch": "2.13"}, gpu), "infer")
    assert [i.bytes for i in train] == [2 * per_pair] and [i.bytes for i in infer] == [per_pair]
    assert train[0].place == R.INSIDE  # through CUDACachingAllocator: reserved and allocated, not non-torch


def test_cublas_workspace_left_the_allocator_before_torch_2() -> None:
    items = R.cublas_workspace(R.parse_runtime({"torch": "1.13"}, get_gpu("a100-80gb")), "infer")
    assert items[0].place == R.OUTSIDE and "torch < 2.0" in items[0].assumption


def test_cublaslt_adds_a_workspace_only_when_not_unified() -> None:
    gpu = get_gpu("h100-sxm")
    assert len(R.cublas_workspace(R.parse_runtime({}, gpu))) == 1
    split = R.cublas_workspace(R.parse_runtime({"cublaslt_unified_workspace": False, "blas_handle_streams": 3}, gpu))
    assert [i.bytes for i in split] == [3 * 32 * MiB, 3 * 1024 * KiB]


@pytest.mark.parametrize("desc, lazy", [
    ({}, True), ({"torch": "2.6", "cuda": "12.4"}, True), ({"torch": "1.12", "cuda": "11.7"}, False),
    ({"torch": "1.12", "cuda": "11.7", "lazy_loading": True}, True), ({"cuda": "11.6", "lazy_loading": True}, False),
    ({"torch": "2.6", "lazy_loading": False}, False),
])
def test_lazy_loading_needs_cuda_11_7_and_is_torchs_default_from_1_13(desc: dict, lazy: bool) -> None:
    assert R.lazy_loading_in_effect(R.parse_runtime(desc))[0] is lazy


def test_context_is_the_upper_end_of_the_matching_measurements() -> None:
    hopper = R.cuda_context_bytes(R.parse_runtime({"torch": "2.6"}, get_gpu("h100-sxm")))
    # lazy rows for Hopper or an unstated GPU: 266,076,160 (PR 86509 less its 20 MiB segment) .. 814,546,944 B
    # (this project's H100 kit run after a step of each kind, validation/gpu/...; the largest public one: 612 MiB)
    assert (hopper.low, hopper.high, hopper.bytes) == (287_047_680 - 20 * MiB, 814_546_944, 814_546_944)
    assert "ml-engineering-h200" in hopper.rows and "ml-engineering-b200" not in hopper.rows
    blackwell = R.cuda_context_bytes(R.parse_runtime({}, get_gpu("b200")))
    assert blackwell.bytes == math.floor(Fraction("0.71") * GiB - Fraction("4.615") * MiB)
    volta_eager = R.cuda_context_bytes(R.parse_runtime({"cuda": "11.2"}, get_gpu("v100-16gb")))
    assert volta_eager.bytes == 1344 * MiB - 1 - 2 * MiB  # HF anatomy, less the 1x1 tensor's 2 MiB segment
    assert "eager" in volta_eager.note and "upper end" in volta_eager.note


@pytest.mark.parametrize("gpu_id", ["v100-16gb", "t4", "a100-80gb", "rtx-4090", "h100-sxm", "b200", "mi300x"])
def test_lazy_loading_never_costs_more_than_eager(gpu_id: str) -> None:
    gpu = get_gpu(gpu_id)
    lazy = R.cuda_context_bytes(R.parse_runtime({"lazy_loading": True}, gpu))
    eager = R.cuda_context_bytes(R.parse_runtime({"lazy_loading": False}, gpu))
    assert lazy.bytes < eager.bytes


def test_one_nccl_communicator_per_parallel_dimension_larger_than_one() -> None:
    comm = 1_932_735_283  # vllm#10511, TP 2 minus TP 1, upper end (1.80 GiB)
    assert R.nccl_bytes({}) == [] and R.nccl_bytes({"data_parallel": 1, "tensor_parallel": 1}) == []
    items = R.nccl_bytes({"tensor_parallel": 2, "data_parallel": 64})
    assert [i.bytes for i in items] == [comm, comm] and all(i.place == R.OUTSIDE for i in items)
    moe = R.nccl_bytes({"expert_parallel": 8}, "hopper")
    assert [i.bytes for i in moe] == [comm, 3_280_000_000]  # nccl#1685: 1.06 GB -> 4.34 GB around one all-to-all
    assert "bounds it" in R.nccl_bytes({"pipeline_parallel": 4})[0].assumption
    with pytest.raises(ValueError, match="unknown parallel dimension 'tp'"):
        R.nccl_bytes({"tp": 2})


def test_cudnn_workspace_counts_nothing_unless_capped() -> None:
    assert R.cudnn_workspace(False) == []
    free = R.cudnn_workspace(True)
    assert free[0].bytes == 0 and "skipped" in free[0].assumption and free[0].place == R.INSIDE
    assert R.cudnn_workspace(True, 256 * MiB)[0].bytes == 256 * MiB


def test_runtime_memory_adds_the_items_by_place_and_says_where_each_comes_from() -> None:
    m = R.runtime_memory({"cuda": "12.4", "torch": "2.6", "lazy_loading": True}, {"tensor_parallel": 2},
                         get_gpu("h100-sxm"), mode="train", has_convolutions=True)
    # Hopper's context: 814,546,944 B, this project's H100 kit run (a repository path, not a page)
    assert m.non_torch_bytes == 814_546_944 + 1_932_735_283
    assert m.allocator_extra_bytes == 2 * 32 * MiB
    assert m.non_torch_bytes == sum(i.bytes for i in m.items if i.place == R.OUTSIDE)
    lines = m.lines()
    assert lines[0].startswith("CUDA context and loaded modules: 777 MiB (outside the allocator; https://")
    assert "validation/gpu/nvidia-h100-80gb-hbm3/2026-11-26/results.jsonl" in lines[0]
    assert "254 MiB .. 777 MiB in 5 public measurements and 1 run(s) of this project's GPU kit, upper end taken" in lines[0]
    assert all("https://" in line for line in lines)


@pytest.mark.parametrize("desc, match", [
    ({"cuda": "twelve"}, "runtime.cuda: expected a version"),
    ({"lazy_loading": "yes"}, "runtime.lazy_loading: expected true or false"),
    ({"blas_handle_streams": 0}, "runtime.blas_handle_streams"),
    ({"nccl": "2.21"}, "runtime: unknown key 'nccl'"),
    ({"cublas_workspace_config": "4096"}, "runtime.cublas_workspace_config"),
])
def test_a_bad_runtime_description_names_the_key(desc: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        R.parse_runtime(desc)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.sampled_from(R.LAYOUT_KEYS), st.integers(1, 64)), st.sampled_from(R.LAYOUT_KEYS),
       st.sampled_from(["a100-80gb", "h100-sxm", "b200", "t4"]), st.sampled_from(["train", "infer"]))
def test_another_parallel_dimension_never_lowers_the_total(layout, extra, gpu_id, mode) -> None:
    gpu = get_gpu(gpu_id)
    before = R.runtime_memory({}, layout, gpu, mode)
    after = R.runtime_memory({}, {**layout, extra: 2 * layout.get(extra, 1)}, gpu, mode)
    assert after.non_torch_bytes >= before.non_torch_bytes
    assert after.allocator_extra_bytes == before.allocator_extra_bytes
