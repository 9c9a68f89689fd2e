"""The per-layer saved-bytes formula of FINDINGS.md, checked against the probe on a tiny Llama (GQA 4:2)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the [measure] extra (torch) is not installed")
pytest.importorskip("transformers", reason="the [measure] extra (transformers) is not installed")

from nnmem_sweep.measure.probe import layer_profile  # noqa: E402

H, INTER, A, KVW = 64, 176, 4, 2 * 16
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000, "hidden_size": H,
              "intermediate_size": INTER, "num_hidden_layers": 2, "num_attention_heads": A, "num_key_value_heads": 2,
              "head_dim": 16, "hidden_act": "silu", "attention_dropout": 0.0, "tie_word_embeddings": False}


@pytest.mark.parametrize("precision,e", [("bf16", 2), ("fp32", 4)])
def test_llama_flash_bytes_per_token_per_layer(precision, e):
    p = layer_profile(TINY_LLAMA, precision, "flash", b=2, seqs=(16, 32, 64))
    assert p["kernel"] == "flash"
    # 2·(4h + 2eh + 4) norms + e·(2h + 2·kvw) SDPA q, k, v, out + 4a log-sum-exp + 4eI SwiGLU
    expected = 2 * (4 * H + 2 * e * H + 4) + e * (2 * H + 2 * KVW) + 4 * A + 4 * e * INTER
    assert p["per_token_bytes"] == expected  # bf16: 2,840; fp32: 5,144
    assert p["c2"] == 0 and p["c0"] == 0


def test_llama_eager_keeps_repeated_kv_and_scores():
    p = layer_profile(TINY_LLAMA, "bf16", "eager", b=2, seqs=(16, 32, 64))
    e = 2
    # eager: q, repeated k and v, contiguous output copy = 4·e·h instead of e·(2h + 2·kvw) + 4a
    expected = 2 * (4 * H + 2 * e * H + 4) + 4 * e * H + 4 * e * INTER
    assert p["per_token_bytes"] == expected
    assert p["s2_per_sample"] == (4 + e) * A  # fp32 softmax output + its bf16 cast, per head


def test_autocast_keeps_weight_copies_and_per_linear_casts():
    p = layer_profile(TINY_LLAMA, "bf16-mixed", "flash", b=2, seqs=(16, 32, 64))
    # matmul weights of one layer: q, o (h·h), k, v (h·kvw), gate, up, down (h·I), bf16 copies kept for backward
    assert p["c0"] == 2 * (2 * H * H + 2 * H * KVW + 3 * H * INTER)
    # norms 26h + 8 (fp32 residual stream; each linear keeps its own cast), the rest as bf16
    assert p["per_token_bytes"] == 26 * H + 8 + 2 * (2 * H + 2 * KVW) + 4 * A + 8 * INTER
