"""params_breakdown: hand-computed breakdowns and properties over random architectures."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from nnmem_sweep.models.arch import Architecture
from nnmem_sweep.models.count import largest_layer_params, params_breakdown
from nnmem_sweep.models.explicit import architecture_from_fields
from nnmem_sweep.models.presets import load_preset


def test_gpt2_small_by_hand():
    # V = 50257, P = 1024, h = 768, L = 12, GPT2LMHeadModel with lm_head tied to wte
    b = params_breakdown(load_preset("gpt2"))
    assert b["embeddings"] == 50257 * 768 + 1024 * 768 == 39_383_808
    # ln_1 2h + c_attn (h*3h + 3h) + attn c_proj (h*h + h) + ln_2 2h + c_fc (h*4h + 4h) + mlp c_proj (4h*h + h)
    assert b["per_layer"] == 1536 + 1_771_776 + 590_592 + 1536 + 2_362_368 + 2_360_064 == 7_087_872
    assert b["layers_total"] == 12 * 7_087_872 == 85_054_464
    assert (b["final_norm"], b["head"]) == (1536, 0)
    assert b["total"] == 39_383_808 + 85_054_464 + 1536 == 124_439_808
    # Conv1D weights only: 12 * (768*2304 + 768*768 + 768*3072 + 3072*768)
    assert b["linear_weight_in_layers"] == 12 * 7_077_888 == 84_934_656
    assert b["largest_tensor"] == 50257 * 768  # wte (shared with lm_head)


def test_llama_3_1_8b_by_hand():
    # h = 4096, a = 32, g = 8, d = 128, i = 14336, V = 128256, L = 32, untied
    b = params_breakdown(load_preset("llama-3.1-8b"))
    assert b["embeddings"] == 128256 * 4096 == 525_336_576
    # q 4096*4096 + k,v 4096*1024 each + o 4096*4096 + gate/up/down 3*4096*14336 + two RMSNorms 2*4096
    assert b["per_layer"] == 16_777_216 + 2 * 4_194_304 + 16_777_216 + 176_160_768 + 8192 == 218_112_000
    assert b["layers_total"] == 6_979_584_000
    assert (b["final_norm"], b["head"]) == (4096, 525_336_576)
    assert b["total"] == 8_030_261_248
    assert b["linear_weight_in_layers"] == 32 * (218_112_000 - 8192) == 6_979_321_856
    assert largest_layer_params(load_preset("llama-3.1-8b")) == 525_336_576


def test_bert_base_masked_lm_by_hand():
    # V = 30522, h = 768, P = 512, T = 2, i = 3072, L = 12; BertForMaskedLM (no pooler)
    b = params_breakdown(load_preset("bert-base"))
    # word + position + token type embeddings + embedding LayerNorm
    assert b["embeddings"] == 23_440_896 + 393_216 + 1536 + 1536 == 23_837_184
    # q, k, v, o (h*h + h each) + LN + intermediate (h*i + i) + output (i*h + h) + LN
    assert b["per_layer"] == 4 * 590_592 + 1536 + 2_362_368 + 2_360_064 + 1536 == 7_087_872
    assert b["final_norm"] == 0  # post-LN: no final norm
    # transform dense (h*h + h) + transform LayerNorm (2h) + output bias V; decoder weight tied to word embeddings
    assert b["head"] == 590_592 + 1536 + 30522 == 622_650
    assert b["total"] == 23_837_184 + 12 * 7_087_872 + 622_650 == 109_514_298
    # DeepSpeed's largest module: the decoder Linear owns the tied V x h weight plus its V bias
    assert b["largest_layer_params"] == 30522 * 768 + 30522


def test_mixtral_by_hand():
    # attention 2*4096*4096 + 2*4096*1024, router 8*4096, experts 8 * 3 * 4096 * 14336, two RMSNorms
    b = params_breakdown(load_preset("mixtral-8x7b"))
    assert b["per_layer"] == 41_943_040 + 32_768 + 1_409_286_144 + 8192 == 1_451_270_144
    assert b["total"] == 32 * 1_451_270_144 + 2 * 32000 * 4096 + 4096 == 46_702_792_704
    # transformers v5 stores each layer's experts as 3-D banks: gate_up_proj (E, 2i, h) is the largest tensor
    assert b["largest_tensor"] == 8 * 2 * 14336 * 4096 == 939_524_096
    assert b["largest_layer_params"] == 1_409_286_144


def test_qwen2_qkv_bias_only():
    # Qwen2.5-0.5B: q bias 14*64 + k, v bias 2*64 each = 1152 per layer, no o / MLP bias
    a = load_preset("qwen2.5-0.5b")
    no_bias = dataclasses.replace(a, qkv_bias=False)
    assert params_breakdown(a)["total"] - params_breakdown(no_bias)["total"] == 24 * (896 + 128 + 128)


def test_params_kind_passes_through():
    a = Architecture(name="x", kind="params", params=20_000_000)
    b = params_breakdown(a)
    assert (b["total"], b["linear_weight_in_layers"], b["largest_tensor"]) == (20_000_000,) * 3


archs = st.builds(
    lambda fam, h_per_head, heads, kv_div, layers, vocab, i, tied, head, experts: architecture_from_fields(
        dict(family=fam, hidden=h_per_head * heads, heads=heads, kv_heads=heads // kv_div or heads, layers=layers,
             vocab=vocab, intermediate=i, tied_embeddings=tied, head=head,
             **({"num_experts": experts} if fam == "mixtral" else {}))),
    st.sampled_from(["gpt2", "bert", "llama", "mistral", "qwen2", "mixtral", "gemma"]),
    st.integers(1, 64), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2]), st.integers(1, 6),
    st.integers(1, 5000), st.integers(1, 512), st.booleans(),
    st.sampled_from(["causal_lm", "masked_lm", "seq_cls", "base"]), st.integers(1, 8),
)


@settings(max_examples=200, deadline=None)
@given(archs)
def test_parts_sum_to_total_and_bounds(a):
    b = params_breakdown(a)
    assert b["total"] == b["embeddings"] + b["layers_total"] + b["final_norm"] + b["head"] == a.params
    assert b["layers_total"] == a.layers * b["per_layer"]
    assert 0 < b["largest_tensor"] <= b["largest_layer_params"] <= b["total"]
    assert 0 < b["linear_weight_in_layers"] < b["layers_total"]  # norms are never Linear weights


@settings(max_examples=100, deadline=None)
@given(archs)
def test_one_more_layer_adds_per_layer_and_untying_adds_v_times_h(a):
    b = params_breakdown(a)
    assert params_breakdown(dataclasses.replace(a, layers=a.layers + 1))["total"] == b["total"] + b["per_layer"]
    untied = params_breakdown(dataclasses.replace(a, tied_embeddings=False))["total"]
    tied = params_breakdown(dataclasses.replace(a, tied_embeddings=True))["total"]
    if a.head in ("causal_lm", "masked_lm"):
        # BERT's MLM head also gets its own output bias when untied (decoder.bias no longer shared)
        extra = a.vocab if a.family == "bert" else 0
        assert untied - tied == a.vocab * a.hidden + extra
    else:
        assert untied == tied
