"""What a real GPU needs beyond the step's peak allocated bytes (components/overhead.py): modelled per GPU, mode and
parallel layout from catalog/runtime.json, or the scenario's overrides. Figures by hand from the sources."""
import numpy as np
import pandas as pd

from nnmem_sweep import columns as C
from nnmem_sweep.catalog.gpus import get_gpu
from nnmem_sweep.components.overhead import fixed_bytes, reserved_bytes, row_overheads, total_bytes
from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.scenario import Overheads
from nnmem_sweep.units import MiB

H100, A100, B200 = get_gpu("h100-sxm"), get_gpu("a100-80gb"), get_gpu("b200")
CONTEXT_LAZY = 612 * MiB  # upper end of the lazy-loading measurements for Ampere (catalog/runtime.json)
# Hopper: this project's own H100 kit run (validation/gpu/nvidia-h100-80gb-hbm3/2026-11-26), the larger
CONTEXT_HOPPER = 814_546_944
NCCL = 1_932_735_283  # one communicator: vLLM #10511, non_torch 1.79 GiB at tp 1 -> 3.58 GiB at tp 2 (upper end)
CUBLAS_HOPPER = 32 * MiB  # CublasHandlePool.cpp: 32 MiB workspace on compute capability 9.x and later
CUBLAS_DEFAULT = 8_519_680  # ":4096:2:16:8" = 4096 KiB x 2 + 16 KiB x 8


def test_one_gpu_train_and_infer():
    ov = Overheads(gpus=(H100, A100))
    # training: forward on the main thread, backward on autograd's thread: two cuBLAS handle-stream pairs
    assert fixed_bytes(ov, H100, "train") == (CONTEXT_HOPPER, 2 * CUBLAS_HOPPER)
    assert fixed_bytes(ov, H100, "infer") == (CONTEXT_HOPPER, CUBLAS_HOPPER)
    assert fixed_bytes(ov, A100, "train") == (CONTEXT_LAZY, 2 * CUBLAS_DEFAULT)


def test_every_parallel_group_adds_a_communicator():
    ov = Overheads(gpus=(H100,))
    outside, _ = fixed_bytes(ov, H100, "train", {C.DATA_PARALLEL: 8, C.TENSOR_PARALLEL: 2, C.PIPELINE_PARALLEL: 1})
    assert outside == CONTEXT_HOPPER + 2 * NCCL


def test_runtime_block_eager_loading_and_an_old_torch():
    sc = parse_scenario_text("model: {preset: llama-3.1-8b}\ngrid: {batch: [1], seq_len: [512], precision: [bf16-mixed], optimizer: [adamw]}\ngpus: [a100-80gb]\n"
                             "runtime: {torch: '1.12', cuda: '11.6'}\n", file="rt.yaml")
    outside, inside = fixed_bytes(sc.overheads, A100, "train")
    # CUDA 11.6 has no lazy loading: the eager measurements, the largest of which a V100 (1,343 MB used) or the
    # 666,632,192 B of pytorch#86509 less its 20 MiB segment; and torch < 2.0 keeps cuBLAS's workspace outside
    assert outside > 1_000_000_000 and inside == 0
    assert outside == fixed_bytes(Overheads(runtime=(("cuda", "11.6"),)), A100, "train")[0] + 2 * CUBLAS_DEFAULT


def test_overrides_replace_their_whole_part():
    ov = Overheads(cuda_context_bytes=300 * MiB, cublas_workspace_bytes=0, allocator_reserve_fraction=0.02)
    assert fixed_bytes(ov, H100, "train", {C.TENSOR_PARALLEL: 4}) == (300 * MiB, 0)  # no NCCL added to a given figure
    frame = pd.DataFrame({C.GPU: ["h100-sxm"], C.GPU_MEMORY: [H100.memory_bytes]})
    rows = row_overheads(ov, frame, "train")
    # reserved = P + extra + ceil(0.02 P); total = reserved + non_torch
    assert reserved_bytes(np.array([10**9]), rows).tolist() == [10**9 + 20_000_000]
    assert total_bytes(np.array([10**9]), rows).tolist() == [10**9 + 20_000_000 + 300 * MiB]


def test_rows_grouped_by_gpu_and_layout():
    ov = Overheads(gpus=(H100, B200))
    frame = pd.DataFrame({C.GPU: pd.Categorical(["h100-sxm", "b200", "h100-sxm"]),
                          C.TENSOR_PARALLEL: [1, 1, 2], C.DATA_PARALLEL: [1, 1, 1]})
    rows = row_overheads(ov, frame, "train")
    b200 = fixed_bytes(ov, B200, "train")
    assert rows.non_torch.tolist() == [CONTEXT_HOPPER, b200[0], CONTEXT_HOPPER + NCCL]
    assert rows.allocator_extra.tolist() == [2 * CUBLAS_HOPPER, b200[1], 2 * CUBLAS_HOPPER]
    assert rows.reserve_fraction == 0.05  # not replayed: the default


def test_scenario_columns_add_up():
    sc = parse_scenario_text("model: {preset: llama-3.1-8b}\ngrid: {batch: [1, 2], seq_len: [512], precision: [bf16-mixed], optimizer: [adamw]}\n"
                             "gpus: [h100-sxm, a100-80gb]\n", file="cols.yaml")
    from nnmem_sweep.runner import run_scenario
    res = run_scenario(sc).results
    assert (res[C.TOTAL] == res[C.RESERVED] + res[C.NON_TORCH]).all()
    extra = res[C.RESERVED] - res[C.PEAK_ALLOCATED] - res[C.ALLOCATOR_EXTRA]
    assert (extra == np.ceil(res[C.PEAK_ALLOCATED] * sc.overheads.reserve_fraction).astype(np.int64)).all()
    h100 = res[res[C.GPU].astype(str) == "h100-sxm"]
    assert set(h100[C.NON_TORCH]) == {CONTEXT_HOPPER} and set(h100[C.ALLOCATOR_EXTRA]) == {2 * CUBLAS_HOPPER}


def test_convolution_nets_list_the_cudnn_workspace_at_zero():
    from nnmem_sweep.components.overhead import has_convolutions, modelled
    from nnmem_sweep.config import load_scenario

    cnn, llama = load_scenario("configs/cnn.yaml"), load_scenario("configs/llama.yaml")
    assert has_convolutions(cnn.model) and not has_convolutions(llama.model)
    mem = modelled(cnn.overheads, H100, "train", has_convolutions=True)
    cudnn = [i for i in mem.items if i.what.startswith("cuDNN")]
    # transient, skipped by PyTorch when it does not fit (pytorch#49207): listed, 0 bytes, nothing added
    assert len(cudnn) == 1 and cudnn[0].bytes == 0 and mem.allocator_extra_bytes == 2 * CUBLAS_HOPPER
