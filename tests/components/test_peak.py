"""Phase totals and the winning phase, counted by hand on the tiny Llama (fp32, AdamW foreach, flash, s = 8)."""
import numpy as np
import pandas as pd
import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.components.kv import kv_cache_bytes
from nnmem_sweep.peak import estimate_components, phase_totals
from nnmem_sweep.errors import UsageError
from nnmem_sweep.grid import expand_grid

from .tiny_models import TINY_LLAMA, replace, scenario

W, S, G, T_OPT = 6816, 13632, 6816, 6816  # 1704 x 4; Adam 2 x; foreach sqrt copy 1 x


def _frame(**axes):
    return expand_grid(scenario(TINY_LLAMA, **axes))


def test_training_phases_batch_1():
    # per token: saved 1236 (+ RoPE 32 per position), forward temp 272, backward-start temp 384, backward-end
    # temp 32, inputs 16; 8 tokens
    f = _frame()
    totals = [int(t[0]) for t in phase_totals(TINY_LLAMA, "train", f)]
    assert totals == [W + S + 8 * 1236 + 256 + 8 * 272,  # forward       32,768
                      W + S + 8 * 1236 + 256 + 8 * 384,  # backward start (loss) 33,664
                      W + S + 8 * 1236 + 256 + 512 + 8 * 128,  # backward start (last layer) 32,128
                      W + S + G + 8 * 16 + 8 * 32,  # backward end  27,648
                      W + S + G + 8 * 16 + T_OPT]  # optimizer     34,208
    comps = estimate_components(TINY_LLAMA, "train", f)
    assert comps[C.PEAK_PHASE][0] == "optimizer"
    assert int(comps[C.PEAK_ALLOCATED][0]) == 34_208
    assert int(comps[C.TEMPORARY][0]) == T_OPT and int(comps[C.GRADIENTS][0]) == G


def test_training_peak_moves_to_backward_with_batch():
    comps = estimate_components(TINY_LLAMA, "train", _frame(batch=4))
    assert comps[C.PEAK_PHASE][0] == "backward"
    assert int(comps[C.PEAK_ALLOCATED][0]) == W + S + 32 * 1236 + 256 + 32 * 384  # 72,544
    assert int(comps[C.GRADIENTS][0]) == 0  # grads were set to None before forward


def test_components_sum_to_peak_everywhere():
    f = _frame(batch=[1, 3, 64], seq_len=[1, 8, 100], precision=["fp32", "bf16", "bf16-mixed", "bf16-master"],
               optimizer=["sgd", "adamw", "adafactor", "adamw-8bit"], optimizer_impl=["foreach", "fused"],
               checkpointing=["none", "selective", "full"], attention=["flash", "eager"])
    comps = estimate_components(TINY_LLAMA, "train", f)
    total = sum(np.asarray(comps[c], dtype=np.int64) for c in C.COMPONENTS)
    assert (total == comps[C.PEAK_ALLOCATED]).all()


def test_inference_prefill_and_decode_tiny_llama_bf16():
    f = expand_grid(scenario(TINY_LLAMA, "infer", decode_tokens=1))
    # per token (bf16, h 8): embeddings kept by the model 16, layer input 16, norm output 16, ids 8 = 56;
    # per position: position ids 8 + RoPE cos/sin 16 = 24.
    # MLP moment: 56 + post-attention residual 16 + SiLU, up, product 3·2·16 = 168 per token -> 8 x 168 + 8 x 24
    # = 1536; W 3408 + KV 8 tokens x 32 B = 256 -> prefill 5200 (the attention moment: 8 x (104 + 24) = 1024;
    # the logits moment: 8 x (40 + 24) + 32 x 6 = 704).
    # decode, one token: MLP moment 192 + cat copy of one layer's K 9 x 4 x 2 = 72, KV 9 x 32 -> 3960;
    # logits moment 40 + 24 + 192 = 256 -> 3952
    totals = [int(t[0]) for t in phase_totals(TINY_LLAMA, "infer", f)]
    assert totals == [5200, 3408 + 288 + 192 + 72, 3408 + 288 + 256]
    comps = estimate_components(TINY_LLAMA, "infer", f)
    assert comps[C.PEAK_PHASE][0] == "prefill" and int(comps[C.KV_CACHE][0]) == 256


def test_static_cache_holds_cache_tokens_from_the_start():
    f = expand_grid(scenario(TINY_LLAMA, "infer", cache_tokens=100, decode_tokens=4))
    comps = estimate_components(TINY_LLAMA, "infer", f)
    assert int(comps[C.KV_CACHE][0]) == 100 * 32


def test_kv_cache_vllm_opt13b_800kb_per_token():
    # Kwon et al. 2023 §3: OPT-13B (40 layers, 40 heads of 128), fp16: 2 x 5120 x 40 x 2 B = 819,200 B per token
    opt13b = replace(TINY_LLAMA, layers=40, heads=40, kv_heads=40, head_dim=128, hidden=5120)
    assert int(kv_cache_bytes(opt13b, np.array([1]), np.array([1]), 2)[0]) == 819_200


def test_sliding_window_caps_the_cache():
    mistral = replace(TINY_LLAMA, sliding_window=16)
    assert int(kv_cache_bytes(mistral, np.array([2]), np.array([1000]), 2)[0]) == 2 * 16 * 32


def test_quantised_training_is_refused():
    with pytest.raises(UsageError, match="inference only"):
        estimate_components(TINY_LLAMA, "train", _frame(precision="nf4"))


def test_plain_string_columns_work_like_categoricals():
    f = _frame(precision=["fp32", "bf16"])
    plain = f.assign(**{c: f[c].astype(str) for c in (C.PRECISION, C.OPTIMIZER, C.OPTIMIZER_IMPL,
                                                        C.CHECKPOINTING, C.ATTENTION)})
    a = estimate_components(TINY_LLAMA, "train", f)[C.PEAK_ALLOCATED]
    b = estimate_components(TINY_LLAMA, "train", pd.DataFrame(plain))[C.PEAK_ALLOCATED]
    assert (a == b).all()
