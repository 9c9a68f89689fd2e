"""The s × s mask transformers materialises once a sequence reaches the sliding window (issue 21, item 3).

transformers' masking_utils._ignore_causal_mask_sdpa lets SDPA run causal without a mask only while
kv_length < sliding_window; from there on sdpa_mask builds a (1, 1, s, s) bool mask that every layer reads and each
checkpointed layer keeps among its inputs. Measured (MemTracker, Mistral 7B LoRA q/k/v/o, full checkpointing,
b 1-2 x s 4096 / 8192, transformers 5.24): the estimate was short by exactly s² bytes, and exact below the window
(tests/data/truth/FINDINGS.md)."""
from __future__ import annotations

import dataclasses

import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.estimate import estimate_point, resolve_model_name
from nnmem_sweep.components.finetune_method import parse_finetune

MISTRAL = resolve_model_name("mistral-7b")
NO_WINDOW = dataclasses.replace(MISTRAL, sliding_window=None)
LORA = dataclasses.replace(MISTRAL, finetune=parse_finetune(
    {"method": "lora", "rank": 16, "alpha": 32, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}))
LORA_NO_WINDOW = dataclasses.replace(LORA, sliding_window=None)


def _peak(arch, **kw) -> int:
    return int(estimate_point(model=arch, gpu="h100-sxm", **kw)[C.PEAK_ALLOCATED])


@pytest.mark.parametrize("with_window, without", [(MISTRAL, NO_WINDOW), (LORA, LORA_NO_WINDOW)],
                         ids=["full", "lora"])
@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("batch", [16, 64])  # batches whose peak is in forward/backward, where the mask lives
def test_mask_counted_from_the_window_on(with_window, without, checkpointing, batch):
    window = MISTRAL.sliding_window
    assert window == 4096
    seen = 0
    for s, mask in ((window // 2, 0), (window - 1, 0), (window, window * window), (2 * window, 4 * window * window)):
        kw = dict(batch=batch, seq_len=s, precision="bf16", checkpointing=checkpointing)
        row = estimate_point(model=with_window, gpu="h100-sxm", **kw)
        if row[C.PEAK_PHASE] == "optimizer":  # the mask is gone by the optimizer step
            mask = 0
        assert int(row[C.PEAK_ALLOCATED]) - _peak(without, **kw) == mask, s
        seen += mask > 0
    assert seen, "no point past the window peaked while the mask lives"


def test_eager_attention_has_no_sdpa_mask_term():
    kw = dict(batch=16, seq_len=8192, precision="bf16", attention="eager")
    assert _peak(MISTRAL, **kw) == _peak(NO_WINDOW, **kw)


def test_a_model_without_window_is_unchanged_at_any_length():
    llama = resolve_model_name("llama-3.1-8b")
    assert llama.sliding_window is None
    a, b, c = (_peak(llama, batch=64, seq_len=s, precision="bf16") for s in (4096, 8192, 12288))
    assert (c - b) == (b - a)  # linear in s at flash attention: no s² part
