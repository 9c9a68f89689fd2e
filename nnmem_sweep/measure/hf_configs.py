"""HF config dicts for measuring: the shipped presets, and a reduced Mixtral that has no preset.

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
