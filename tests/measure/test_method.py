"""The measuring method itself: fake tensors must give exactly what real CPU tensors give, byte for byte.

Tiny models (a GQA Llama on the flash-style SDPA kernel, a GPT-2 whose attention dropout forces the math path, a
CNN) go through the very code the truth catalog uses (nnmem_sweep.measure.build.measure_case), once under
FakeTensorMode and once with real tensors.
"""
from __future__ import annotations

import sys

import pytest

from nnmem_sweep.errors import UsageError

torch = pytest.importorskip("torch", reason="the [measure] extra (torch) is not installed")
pytest.importorskip("transformers", reason="the [measure] extra (transformers) is not installed")

from nnmem_sweep.measure.build import measure_case  # noqa: E402

TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000, "hidden_size": 64,
              "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "hidden_act": "silu", "attention_dropout": 0.0, "tie_word_embeddings": False}
TINY_GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 500, "n_embd": 32,
             "n_head": 4, "n_layer": 2, "n_positions": 64, "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1}
TINY_CNN = [{"type": "conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1}, {"type": "batchnorm2d"},
            {"type": "relu"}, {"type": "maxpool2d", "kernel_size": 2, "stride": 2}, {"type": "flatten"},
            {"type": "linear", "out_features": 10}]


def _train(cfg, precision="fp32", optimizer="adamw", impl="foreach", ckpt="none", attention="flash", b=2, s=16):
    return {"hf_config": cfg, "mode": "train", "batch": b, "seq_len": s, "precision": precision,
            "optimizer": optimizer, "optimizer_impl": impl, "checkpointing": ckpt, "attention": attention}


CASES = {
    "llama-fp32-adamw-foreach": _train(TINY_LLAMA),
    "llama-bf16-adamw": _train(TINY_LLAMA, "bf16"),
    "llama-bf16-mixed-sgd-momentum": _train(TINY_LLAMA, "bf16-mixed", "sgd-momentum"),
    "llama-fp32-adafactor-ckpt": _train(TINY_LLAMA, optimizer="adafactor", ckpt="full"),
    "llama-fp32-adam-forloop-eager": _train(TINY_LLAMA, optimizer="adam", impl="forloop", attention="eager"),
    "gpt2-fp32-adamw-math-path": _train(TINY_GPT2),
    "gpt2-bf16-eager-native-dropout": {**_train(TINY_GPT2, "bf16", attention="eager"), "dropout_impl": "native"},
    "llama-bf16-infer": {"hf_config": TINY_LLAMA, "mode": "infer", "batch": 2, "seq_len": 16, "precision": "bf16",
                         "decode_tokens": 3},
    "cnn-fp32-sgd-momentum": {"layers": TINY_CNN, "input_shape": [3, 8, 8], "num_classes": 10, "mode": "train",
                              "batch": 4, "seq_len": 0, "precision": "fp32", "optimizer": "sgd-momentum"},
}


def _comparable(r):
    return {k: r[k] for k in ("peak_bytes", "peak_phase", "peak_step", "peak_module", "categories_at_peak",
                              "phases", "totals", "attention_kernel", "attention_ops")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fake_equals_real(name):
    fake = measure_case(CASES[name], fake=True)
    real = measure_case(CASES[name], fake=False)
    assert _comparable(fake) == _comparable(real)
    # the split at the peak adds up to the peak
    assert sum(fake["categories_at_peak"].values()) == fake["peak_bytes"]


def test_tiny_llama_states_by_hand():
    r = measure_case(CASES["llama-fp32-adamw-foreach"], fake=True)
    # params: embed 1000·64 = 64,000; per layer q 64·64 + k 64·32 + v 64·32 + o 64·64 = 12,288,
    # gate/up/down 3·64·176 = 33,792, two RMSNorms 128 -> 46,208; ×2 layers = 92,416; final norm 64;
    # lm_head 64,000 -> 220,480 params × 4 B = 881,920 B
    assert r["params"] == 220_480
    assert r["totals"]["param_bytes"] == 881_920
    assert r["totals"]["grad_bytes"] == 881_920
    # AdamW: exp_avg + exp_avg_sq in fp32 (2 × 881,920) + one fp32 `step` scalar per tensor (21 tensors × 4 B)
    assert r["totals"]["optimizer_state_bytes"] == 2 * 881_920 + 21 * 4
    assert r["attention_kernel"] == "flash"
    # the foreach step's peak holds params + grads + state + one fp32 temporary per parameter (_foreach_sqrt)
    assert r["phases"]["optimizer"]["peak_bytes"] >= 881_920 * 3 + 2 * 881_920


def test_dropout_forces_math_path():
    r = measure_case(CASES["gpt2-fp32-adamw-math-path"], fake=True)
    assert r["attention_kernel"] == "math"
    assert "_scaled_dot_product_flash_attention_for_cpu" not in r["attention_ops"]


def test_kv_cache_by_hand():
    r = measure_case(CASES["llama-bf16-infer"], fake=True)
    # DynamicCache after a prefill of 16 tokens and 3 decode steps, each feeding one token: 19 positions;
    # 2 (K, V) · b 2 · kv_heads 2 · head_dim 16 · 19 positions · 2 layers · 2 B (bf16) = 9,728 B
    assert r["totals"]["kv_cache_bytes"] == 2 * 2 * 2 * 16 * 19 * 2 * 2 == 9_728


def test_missing_torch_names_the_extra(monkeypatch):
    from nnmem_sweep import measure

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(UsageError, match=r"\[measure\] extra"):
        measure.require_torch()


def test_checkpoint_torch_dtype_does_not_override_the_recipe():
    # regression: Llama presets carry "torch_dtype": "bfloat16"; transformers built bf16 parameters for a
    # bf16-mixed (fp32-parameter) run until the recipe's dtype was passed explicitly
    case = _train({**TINY_LLAMA, "torch_dtype": "bfloat16"}, "bf16-mixed")
    r = measure_case(case, fake=True)
    assert r["totals"]["param_bytes"] == 220_480 * 4


def test_native_dropout_keeps_one_byte_masks():
    # CPU composite dropout keeps an input-dtype mask; CUDA's fused native_dropout (used with dropout_impl
    # "native") a bool one. Tiny GPT-2 in bf16, eager attention, b 2, s 16, h 32, 4 heads, 2 layers; per layer the
    # masks are: attention probs (b·a·s² = 2048 elements) + two residual dropouts (2·b·s·h = 2048), plus the
    # embedding dropout once (b·s·h = 1024): 2·4096 + 1024 = 9,216 elements, 1 B less each than bf16 (2 B).
    composite = measure_case(_train(TINY_GPT2, "bf16", attention="eager"), fake=True)
    native = measure_case({**_train(TINY_GPT2, "bf16", attention="eager"), "dropout_impl": "native"}, fake=True)
    saved = [r["phases"]["forward"]["end_categories"]["act"] for r in (composite, native)]
    assert saved[0] - saved[1] == 9_216
