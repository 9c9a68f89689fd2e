"""The measuring method on the families issue 12 adds: for each, a tiny config measured under FakeTensorMode and with
real CPU tensors through the same code (measure.build.measure_case) must agree byte for byte, phase by phase; the
caches the new families keep are checked by hand (multi-query, sliding window, MLA, encoder-decoder), and so is what
inputs.make_inputs feeds each kind of model.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the [measure] extra (torch) is not installed")
pytest.importorskip("transformers", reason="the [measure] extra (transformers) is not installed")
pytest.importorskip("torchvision", reason="the [measure] extra (torchvision) is not installed")

from nnmem_sweep.measure.build import measure_case  # noqa: E402
from nnmem_sweep.workload.build import build_model, case_config, default_dtype  # noqa: E402
from nnmem_sweep.workload.inputs import input_kind, make_inputs  # noqa: E402

# Tiny members of each family: the published configs' structural switches, widths of a few dozen.
TINY = {
    "opt": {"architectures": ["OPTForCausalLM"], "model_type": "opt", "vocab_size": 500, "hidden_size": 64,
            "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "word_embed_proj_dim": 32,
            "max_position_embeddings": 64, "do_layer_norm_before": False, "dropout": 0.1, "attention_dropout": 0.0,
            "activation_function": "relu"},
    "gpt_neox": {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": 500,
                 "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "rotary_pct": 0.25, "use_parallel_residual": True, "max_position_embeddings": 64,
                 "attention_dropout": 0.0, "hidden_dropout": 0.0, "tie_word_embeddings": False},
    "gpt_bigcode": {"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "vocab_size": 500,
                    "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 64, "multi_query": True,
                    "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1, "bos_token_id": 0, "eos_token_id": 0},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 500, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "tie_word_embeddings": True},
    "qwen3_moe": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 500,
                  "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 8,
                  "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 16, "norm_topk_prob": True},
    "gemma2": {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "vocab_size": 500, "hidden_size": 64,
               "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "sliding_window": 8, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
               "query_pre_attn_scalar": 16},
    "gemma3_text": {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 500,
                    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
                    "num_key_value_heads": 1, "head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 16,
                    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]},
    "phi3": {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 500, "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 64, "sliding_window": 7, "pad_token_id": 0, "eos_token_id": 1},
    "deepseek_v3": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 500,
                    "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                    "n_shared_experts": 1, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2,
                    "topk_group": 1, "first_k_dense_replace": 1, "q_lora_rank": 32, "kv_lora_rank": 16,
                    "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8},
    "llama4_text": {"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "vocab_size": 500,
                    "hidden_size": 64, "intermediate_size": 32, "intermediate_size_mlp": 128,
                    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                    "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
                    "attention_chunk_size": 8, "use_qk_norm": True, "no_rope_layers": [1, 1, 1, 0],
                    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
    "t5": {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "vocab_size": 500, "d_model": 32,
           "d_ff": 64, "d_kv": 8, "num_heads": 4, "num_layers": 2, "dropout_rate": 0.1, "decoder_start_token_id": 0},
    "vit": {"architectures": ["ViTForImageClassification"], "model_type": "vit", "hidden_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "image_size": 32,
            "patch_size": 8, "num_labels": 10, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
}
MOE = ("qwen3_moe", "deepseek_v3", "llama4_text")  # grouped_mm / bmm experts: bf16 (torch's meta kernel)
RESNET = {"module": "torchvision.models:resnet18", "kwargs": {"num_classes": 10}, "input_shape": [3, 32, 32]}


def _case(family: str, mode: str = "train", **kw) -> dict:
    base = RESNET if family == "resnet" else {"hf_config": TINY[family]}
    case = {**base, "mode": mode, "batch": 2, "seq_len": 0 if family in ("vit", "resnet") else 16,
            "precision": "bf16" if family in MOE else "fp32", "optimizer": "adamw", "optimizer_impl": "foreach",
            "checkpointing": "none", "attention": "eager" if family == "gemma2" else "flash", "decode_tokens": 3}
    case.update(kw)
    return case


def _comparable(r):
    return {k: r[k] for k in ("peak_bytes", "peak_phase", "peak_step", "peak_module", "categories_at_peak",
                              "phases", "totals", "attention_kernel", "attention_ops")}


FAKE_REAL = {f: _case(f) for f in TINY}
FAKE_REAL["resnet"] = _case("resnet", optimizer="sgd-momentum")  # half the real run's time of AdamW on 11M params
# one inference request each where the workload differs: encoder-decoder generate(), a sliding-window cache
FAKE_REAL["t5-infer"] = _case("t5", "infer")
FAKE_REAL["gemma3_text-infer"] = _case("gemma3_text", "infer")


@pytest.mark.parametrize("name", sorted(FAKE_REAL))
def test_fake_equals_real(name):
    fake = measure_case(FAKE_REAL[name], fake=True)
    real = measure_case(FAKE_REAL[name], fake=False)
    assert _comparable(fake) == _comparable(real)
    assert sum(fake["categories_at_peak"].values()) == fake["peak_bytes"]


def _cache(family: str, **kw) -> dict[str, int]:
    return measure_case(_case(family, "infer", **kw), fake=True)["totals"]


def test_multi_query_cache_keeps_one_head():
    # GPTBigCode keeps K and V fused, one head of 16 (64 / 4 heads): b 2 · (16 + 3) positions · 2 · 16 · 4 B · 2 layers
    assert _cache("gpt_bigcode")["kv_cache_bytes"] == 2 * 19 * 2 * 16 * 4 * 2 == 9_728


def test_sliding_window_layers_hold_at_most_the_window():
    # Gemma 3: 2 sliding layers (window 8) and 1 global layer, 1 KV head of 16, fp32; prefill 16 + 3 decode steps.
    # transformers' DynamicSlidingWindowLayer keeps the last window - 1 = 7 positions, but as a view of the
    # concatenation of the 7 old and the new position, so the storage it holds is `window` = 8 positions per
    # sliding layer; the global layer keeps all 19.
    per_position = 2 * 2 * 1 * 16 * 4  # K and V, b 2, 1 head, head_dim 16, 4 B
    assert _cache("gemma3_text")["kv_cache_bytes"] == per_position * (8 + 8 + 19)


def test_mla_cache_holds_the_compressed_latent():
    # transformers' DeepseekV3Attention caches the compressed latent, shared by all heads: kv_nope (kv_lora_rank 16)
    # in the keys slot and the rotary key (qk_rope_head_dim 8) in the values slot, and expands K and V from it at
    # every step: b 2 · 19 positions · (16 + 8) · 2 B (bf16) · 2 layers. Per-head K and V would be
    # 4 heads · (16 + 8 + 8) wide, 5.3 times as much.
    assert _cache("deepseek_v3")["kv_cache_bytes"] == 2 * 19 * (16 + 8) * 2 * 2 == 3_648


def test_encoder_decoder_cache_splits_self_and_cross_attention():
    # T5: the decoder's self-attention cache holds the start token + 3 decode steps (4 positions); the cross-attention
    # cache holds the encoder's 16 positions, filled once; 2 (K, V) · b 2 · 4 heads · d_kv 8 · 4 B · 2 layers each
    t = _cache("t5")
    unit = 2 * 2 * 4 * 8 * 4 * 2
    assert (t["self_attention_cache_bytes"], t["cross_attention_cache_bytes"]) == (unit * 4, unit * 16)
    assert t["kv_cache_bytes"] == unit * 20


def test_classifier_inference_is_one_no_grad_forward():
    r = measure_case(_case("vit", "infer"), fake=True)
    assert set(r["phases"]) == {"forward"} and "kv_cache_bytes" not in r["totals"]


@pytest.mark.parametrize("family, kind, shapes", [
    ("qwen3", "causal_lm", {"input_ids": (2, 16), "labels": (2, 16)}),
    ("t5", "seq2seq", {"input_ids": (2, 16), "labels": (2, 5)}),
    ("vit", "image_cls", {"pixel_values": (2, 3, 32, 32), "labels": (2,)}),
    ("resnet", "module", {"x": (2, 3, 32, 32), "y": (2,)}),
])
def test_make_inputs_per_kind(family, kind, shapes):
    from torch._subclasses.fake_tensor import FakeTensorMode

    case = _case(family, decoder_seq_len=5)
    cfg, _ = case_config(case)
    with FakeTensorMode(), default_dtype(torch.bfloat16):
        model = build_model(case, cfg)
        inputs = make_inputs(case, cfg, model)
    assert input_kind(case, model) == kind
    assert {k: tuple(v.shape) for k, v in inputs.items()} == shapes
    # images come in the model's dtype (the default dtype it was built in); ids and labels are int64
    assert {str(v.dtype) for k, v in inputs.items() if k in ("x", "pixel_values")} <= {"torch.bfloat16"}
    assert {str(v.dtype) for k, v in inputs.items() if k in ("input_ids", "labels", "y")} <= {"torch.int64"}


def test_module_factory_never_loads_weights():
    with pytest.raises(ValueError, match=r"kwargs\.weights would load published weights"):
        measure_case({**_case("resnet"), "kwargs": {"weights": "IMAGENET1K_V1"}})


def test_module_spec_must_name_a_factory():
    with pytest.raises(ValueError, match=r"give 'package\.module:factory'"):
        measure_case({**_case("resnet"), "module": "torchvision.models.resnet50"})


def test_lora_wrapper_is_fed_as_its_base_model():
    # regression: peft wraps a GPT2LMHeadModel (no task type: the class name does not end in ForCausalLM) in a plain
    # PeftModel; the input kind must come from the wrapped model, not the wrapper's class name
    gpt2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 500, "n_embd": 32,
            "n_head": 4, "n_layer": 2, "n_positions": 64}
    case = {**_case("qwen3"), "hf_config": gpt2, "finetune": {"method": "lora", "rank": 4, "targets": ["c_attn"]}}
    r = measure_case(case, fake=True)
    assert r["input_kind"] == "causal_lm" and r["trainable_params"] == 2 * (4 * 32 + 4 * 96)


def test_unknown_architecture_is_one_clear_error():
    cfg = {**TINY["qwen3"], "architectures": ["Qwen9ForCausalLM"]}
    with pytest.raises(ValueError, match=r"architectures names 'Qwen9ForCausalLM', which transformers .* does not"):
        measure_case({**_case("qwen3"), "hf_config": cfg})


class _Recorder:
    """A stand-in for the derive package's event recorder: what tracker.run_steps reports to."""

    def __init__(self):
        self.events = []

    def phase(self, name, step):
        import contextlib

        self.events.append((name, step))
        return contextlib.nullcontext()

    def step_done(self):
        self.events.append("done")


@pytest.mark.parametrize("family, mode, events", [
    ("qwen3", "train", [("forward", 1), ("backward", 1), ("optimizer", 1), "done",
                        ("forward", 2), ("backward", 2), ("optimizer", 2), "done"]),
    ("t5", "infer", [("prefill", 1), "done", ("decode", 1), "done", ("decode", 2), "done", ("decode", 3), "done"]),
    ("vit", "infer", [("forward", 1), "done"]),
])
def test_run_steps_drives_any_recorder(family, mode, events):
    # the derive package traces the very workload measure runs: build_model, make_workload, run_contexts, run_steps
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nnmem_sweep.workload.build import build_optimizer, make_workload, model_dtype, run_contexts
    from nnmem_sweep.workload.steps import run_steps

    case = _case(family, mode)
    cfg, _ = case_config(case)
    rec = _Recorder()
    with FakeTensorMode():
        with default_dtype(model_dtype(case["precision"])):
            model = build_model(case, cfg)
            opt = build_optimizer(model, case["optimizer"], case["optimizer_impl"]) if mode == "train" else None
            w = make_workload(case, cfg, model, opt)
        with run_contexts(case, fake=True):
            totals = run_steps(w, rec)
    assert rec.events == events
    assert ("grad_bytes" in totals) == (mode == "train") and ("kv_cache_bytes" in totals) == (family == "t5")
