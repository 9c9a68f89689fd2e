"""max_batch: closed form, then fits(b_max) and not fits(b_max + 1) checked with the real estimator."""
import numpy as np
import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.fit import MAX_BATCH_CAP
from nnmem_sweep.grid import expand_grid
from nnmem_sweep.models.presets import load_preset
from nnmem_sweep.estimate import estimate_frame
from nnmem_sweep.runner import run_scenario
from nnmem_sweep.scenario import GPUSpec, Overheads

from components.tiny_models import TINY_GPT2, TINY_LLAMA, params_model, scenario

OV = Overheads(512 << 20, 8_519_680, 0.05)
H100 = GPUSpec("h100", "H100", 85_520_809_984, "test")
SMALL = GPUSpec("small", "small", 1_000_000, "test")


def _check(sc):
    res = run_scenario(sc)
    mb = res.max_batch
    pts = mb.drop(columns=[C.MAX_BATCH, C.TOTAL_AT_MAX_BATCH, C.TOTAL_AT_BATCH_1, C.USABLE])
    at = estimate_frame(sc.model, sc.mode, pts.assign(**{C.BATCH: np.maximum(mb[C.MAX_BATCH], 1)}),
                        sc.overheads, sc.headroom)
    nxt = estimate_frame(sc.model, sc.mode, pts.assign(**{C.BATCH: mb[C.MAX_BATCH] + 1}), sc.overheads,
                         sc.headroom)
    positive = mb[C.MAX_BATCH].to_numpy() > 0
    assert at[C.FITS].to_numpy()[positive].all()
    assert not nxt[C.FITS].to_numpy()[mb[C.MAX_BATCH].to_numpy() < MAX_BATCH_CAP].any()
    assert (mb[C.TOTAL_AT_MAX_BATCH].to_numpy()[positive] == at[C.TOTAL].to_numpy()[positive]).all()
    return res


@pytest.mark.parametrize("model", ["llama-3.2-1b", "gpt2", "mixtral-8x7b", "mistral-7b"])
def test_boundary_exact_on_presets(model):
    arch = load_preset(model)
    sc = scenario(arch, batch=[1], seq_len=[512, 4096], precision=["bf16", "bf16-mixed", "bf16-master"],
                  optimizer=["adamw", "sgd", "adafactor"], optimizer_impl=["foreach", "fused"],
                  checkpointing=["none", "selective", "full"], attention=["flash", "eager"], gpus=(H100,),
                  overheads=OV, headroom=0.05)
    _check(sc)


def test_boundary_exact_inference():
    arch = load_preset("llama-3.1-8b")
    sc = scenario(arch, "infer", seq_len=[128, 4096, 32768], precision=["bf16", "int4", "nf4", "bf16-mixed"],
                  decode_tokens=[1, 1024], cache_tokens=[0, 40000], attention=["flash", "eager"], gpus=(H100,),
                  overheads=OV, headroom=0.1)
    res = _check(sc)
    assert (res.max_batch[C.MAX_BATCH] > 0).any()


def test_zero_when_batch_one_does_not_fit():
    sc = scenario(TINY_LLAMA, gpus=(SMALL,), overheads=OV)
    res = _check(sc)
    assert res.max_batch[C.MAX_BATCH].tolist() == [0]
    assert res.max_batch[C.TOTAL_AT_MAX_BATCH].tolist() == [0]


def test_tiny_llama_by_hand():
    # fp32 AdamW foreach, flash, s = 8, no overheads: backward-start total 20,448 + 256 (RoPE) + 8·(1236 + 384)·b
    # = 20,704 + 12,960 b; the optimizer phase 34,208 does not grow. With 200,000 usable:
    # b ≤ (200,000 − 20,704) / 12,960 = 13.8 -> 13
    gpu = GPUSpec("g", "g", 200_000, "test")
    res = _check(scenario(TINY_LLAMA, gpus=(gpu,)))
    assert res.max_batch[C.MAX_BATCH].tolist() == [13]
    assert res.max_batch[C.TOTAL_AT_BATCH_1].tolist() == [34_208]


def test_memory_not_growing_with_batch_is_capped():
    sc = scenario(params_model(1000), gpus=(H100,))
    res = _check(sc)
    assert res.max_batch[C.MAX_BATCH].tolist() == [MAX_BATCH_CAP]


def test_max_batch_rows_per_non_batch_axes_and_gpu():
    sc = scenario(TINY_GPT2, batch=[1, 2, 3], seq_len=[8, 16], precision=["fp32", "bf16"], gpus=(H100, SMALL))
    mb = run_scenario(sc).max_batch
    assert len(mb) == 2 * 2 * 2
    assert list(mb.columns) == list(C.NON_BATCH_AXES) + [C.GPU, C.MAX_BATCH, C.TOTAL_AT_MAX_BATCH,
                                                         C.TOTAL_AT_BATCH_1, C.GPU_MEMORY, C.USABLE]
