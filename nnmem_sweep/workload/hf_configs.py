"""HF config dicts for measuring: the shipped presets, a reduced Mixtral that has no preset, and presets of the big MoE
models reduced to a few layers (and experts) at their real widths, so a case traces in seconds.

The measured JSON records the dict actually used, so a case is self-describing whichever source supplied it.
"""
from __future__ import annotations

import copy
from typing import Any

# A reduced Mixtral (mistralai/Mixtral-8x7B-v0.1's shape rules, 8 experts top-2, GQA 4:1), small enough to measure
# with real tensors too. Used by the truth catalog when no Mixtral-style preset of reduced size exists.
MIXTRAL_SMALL: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 32000, "hidden_size": 1024,
    "intermediate_size": 3584, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
    "head_dim": 64, "num_local_experts": 8, "num_experts_per_tok": 2, "hidden_act": "silu",
    "attention_dropout": 0.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 32768,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "router_aux_loss_coef": 0.02,
    "output_router_logits": False, "tie_word_embeddings": False, "sliding_window": None,
}


def hf_dict(preset_id: str) -> tuple[dict[str, Any], str]:
    """The HF config dict of a preset (the models package's file, without its `_nnmem` key) and where it came from."""
    from nnmem_sweep.errors import UsageError
    from nnmem_sweep.models.presets import hf_dict_for_transformers

    try:
        return copy.deepcopy(hf_dict_for_transformers(preset_id)), f"preset {preset_id}"
    except ValueError as e:
        raise UsageError(f"cannot measure {preset_id!r}: {e}") from None


# name -> (preset, changes, why). Widths (hidden, heads, head dims, expert and vocabulary sizes) stay the published
# ones; only depth (and for DeepSeek-V3 the routed-expert count) is cut.
REDUCED: dict[str, tuple[str, dict[str, Any], str]] = {
    "qwen3-30b-a3b-4l": ("qwen3-30b-a3b", {"num_hidden_layers": 4, "max_window_layers": 4},
                         "4 of 48 layers; all 128 experts (top-8) kept"),
    "deepseek-v3-4l-64e": ("deepseek-v3", {"num_hidden_layers": 4, "first_k_dense_replace": 1,
                                           "n_routed_experts": 64},
                           "4 of 61 layers (1 dense + 3 MoE, as the first 3 of 61 are dense); 64 of 256 routed "
                           "experts (top-8 over 8 groups, top-4 groups kept), 1 shared expert"),
    "llama-4-scout-4l": ("llama-4-scout", {"num_hidden_layers": 4},
                         "4 of 48 layers: 3 chunked-attention RoPE layers and 1 full-attention NoPE layer, every "
                         "layer MoE (16 experts, top-1, 1 shared expert)"),
}


def named_config(name: str) -> tuple[dict[str, Any], str] | None:
    """A named measuring config that is not a preset, with its origin; None for any other name."""
    if name == "mixtral-small":
        return copy.deepcopy(MIXTRAL_SMALL), "nnmem_sweep/measure/hf_configs.py MIXTRAL_SMALL"
    if name in REDUCED:
        preset, changes, why = REDUCED[name]
        cfg, _ = hf_dict(preset)
        was = {k: cfg.get(k) for k in changes}
        cfg.update(copy.deepcopy(changes))
        return cfg, (f"preset {preset} reduced ({why}): " +
                     ", ".join(f"{k} {was[k]} -> {v}" for k, v in changes.items()))
    return None
