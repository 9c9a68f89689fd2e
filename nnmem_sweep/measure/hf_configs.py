"""HF config dicts for the truth catalog's models, used only while a preset is missing from nnmem_sweep.models.presets.

Values are those of the published config.json files on the Hugging Face Hub (architectures, sizes, dropout), keyed
by the preset id the models package uses. The measured JSON records the dict actually used, so a case is
self-describing whichever source supplied it.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

_GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024,
         "activation_function": "gelu_new", "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1,
         "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
_BERT = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": 30522, "hidden_act": "gelu",
         "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512,
         "type_vocab_size": 2, "layer_norm_eps": 1e-12, "tie_word_embeddings": True}
_LLAMA3 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_act": "silu",
           "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 131072,
           "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                               "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                               "original_max_position_embeddings": 8192}}

FALLBACK: dict[str, dict[str, Any]] = {
    # openai-community/gpt2, gpt2-medium
    "gpt2": {**_GPT2, "n_embd": 768, "n_head": 12, "n_layer": 12},
    "gpt2-medium": {**_GPT2, "n_embd": 1024, "n_head": 16, "n_layer": 24},
    # google-bert/bert-base-uncased, bert-large-uncased
    "bert-base": {**_BERT, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                          "intermediate_size": 3072},
    "bert-large": {**_BERT, "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                           "intermediate_size": 4096},
    # meta-llama/Llama-3.2-1B (GQA 32/8, tied embeddings)
    "llama-3.2-1b": {**_LLAMA3, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                     "tie_word_embeddings": True},
    # meta-llama/Llama-3.1-8B
    "llama-3.1-8b": {**_LLAMA3, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                     "tie_word_embeddings": False,
                     "rope_parameters": {**_LLAMA3["rope_parameters"], "factor": 8.0}},
    # Qwen/Qwen2.5-0.5B (152k vocabulary, tied embeddings, GQA 14/2)
    "qwen2.5-0.5b": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
                     "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "hidden_act": "silu",
                     "attention_dropout": 0.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
                     "use_sliding_window": False, "tie_word_embeddings": True},
}

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
    """The HF config dict of a preset and where it came from (models package, preset file, or this fallback)."""
    try:
        from nnmem_sweep.models.presets import hf_dict_for_transformers
    except ImportError:
        hf_dict_for_transformers = None
    if hf_dict_for_transformers is not None:
        try:
            return copy.deepcopy(hf_dict_for_transformers(preset_id)), f"preset {preset_id}"
        except Exception:  # noqa: BLE001 - an unknown id falls through to the file / fallback
            pass
    path = Path(__file__).resolve().parent.parent / "models" / "presets" / f"{preset_id}.json"
    if path.is_file():
        d = json.loads(path.read_text())
        d.pop("_nnmem", None)
        return d, f"preset file {path.name}"
    if preset_id in FALLBACK:
        return copy.deepcopy(FALLBACK[preset_id]), "nnmem_sweep/measure/hf_configs.py"
    from nnmem_sweep.errors import UsageError

    raise UsageError(f"unknown model preset {preset_id!r} for measuring")
