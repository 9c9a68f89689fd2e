"""Read a Hugging Face `config.json` dict into an `Architecture`.

Field names and defaults follow the installed transformers' configuration classes (v5): a key missing from the
file takes the value transformers would give it, except the size fields, which must be present (a config without
`hidden_size` would otherwise silently become a 4096-wide model).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .arch import Architecture

# model_type -> reader; the order is the one error messages list.
_READERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}

_MISSING = object()


def supported_model_types() -> list[str]:
    return list(_READERS)


def _reader(model_type: str):
    def register(fn):
        _READERS[model_type] = fn
        return fn

    return register


def _required_int(cfg: dict[str, Any], key: str) -> int:
    if key not in cfg or cfg[key] is None:
        raise ValueError(f"missing required field '{key}'")
    return _positive_int(cfg, key, cfg[key])


def _positive_int(cfg: dict[str, Any], key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"field '{key}' must be a positive integer, got {value!r}")
    return value


def _opt_int(cfg: dict[str, Any], key: str, default: int | None) -> int | None:
    """An optional integer field: missing -> transformers' default; null -> None."""
    value = cfg.get(key, _MISSING)
    if value is _MISSING:
        return default
    if value is None:
        return None
    return _positive_int(cfg, key, value)


def _prob(cfg: dict[str, Any], key: str, default: float) -> float:
    value = cfg.get(key, default)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"field '{key}' must be a probability in [0, 1], got {value!r}")
    return float(value)


def _flag(cfg: dict[str, Any], key: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"field '{key}' must be true or false, got {value!r}")
    return value


def _text(cfg: dict[str, Any], key: str, default: str) -> str:
    value = cfg.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"field '{key}' must be a string, got {value!r}")
    return value


def _check_heads(q: dict[str, Any], heads_key: str, kv_key: str) -> None:
    if q["heads"] % q["kv_heads"]:
        raise ValueError(
            f"field '{kv_key}' ({q['kv_heads']}) must divide '{heads_key}' ({q['heads']})"
        )


# GPT-2 and BERT blocks: LayerNorm with bias, learned positions, 2-matrix GeLU MLP, biases on every Linear.
_GPT_STYLE = dict(mlp="gelu", norm="layernorm", position="learned", qkv_bias=True, attn_out_bias=True,
                  mlp_bias=True, norm_bias=True)


def _multi_head(cfg: dict[str, Any], hidden_key: str, heads_key: str) -> dict[str, int]:
    """Plain multi-head attention: head_dim = hidden / heads, as many K/V heads as query heads."""
    hidden, heads = _required_int(cfg, hidden_key), _required_int(cfg, heads_key)
    if hidden % heads:
        raise ValueError(f"field '{hidden_key}' ({hidden}) must be divisible by '{heads_key}' ({heads})")
    return dict(hidden=hidden, heads=heads, kv_heads=heads, head_dim=hidden // heads)


# --- decoders: GPT-2 --------------------------------------------------------------------------------------------


@_reader("gpt2")
def _gpt2(cfg: dict[str, Any]) -> dict[str, Any]:
    hidden = _required_int(cfg, "n_embd")
    # GPT2MLP: inner_dim = n_inner if n_inner is not None else 4 * hidden_size
    inner = _opt_int(cfg, "n_inner", None)
    return dict(
        family="gpt2",
        **_multi_head(cfg, "n_embd", "n_head"),
        layers=_required_int(cfg, "n_layer"),
        intermediate=inner if inner is not None else 4 * hidden,
        vocab=_required_int(cfg, "vocab_size"),
        max_position=_opt_int(cfg, "n_positions", 1024) or 1024,
        tied_embeddings=_flag(cfg, "tie_word_embeddings", True),
        activation=_text(cfg, "activation_function", "gelu_new"),
        **_GPT_STYLE,
        attn_dropout=_prob(cfg, "attn_pdrop", 0.1),
        # resid_pdrop after attention and MLP; embd_pdrop after the embeddings (equal in every GPT-2 release)
        hidden_dropout=_prob(cfg, "resid_pdrop", 0.1),
    )


# --- encoders: BERT -----------------------------------------------------------------------------------------------


@_reader("bert")
def _bert(cfg: dict[str, Any]) -> dict[str, Any]:
    position = _text(cfg, "position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(f"field 'position_embedding_type' {position!r} is not supported; use 'absolute'")
    if _flag(cfg, "add_cross_attention", False):
        raise ValueError("field 'add_cross_attention' true (encoder-decoder BERT) is not supported")
    return dict(
        family="bert",
        **_multi_head(cfg, "hidden_size", "num_attention_heads"),
        layers=_required_int(cfg, "num_hidden_layers"),
        intermediate=_required_int(cfg, "intermediate_size"),
        vocab=_required_int(cfg, "vocab_size"),
        max_position=_opt_int(cfg, "max_position_embeddings", 512) or 512,
        type_vocab=_opt_int(cfg, "type_vocab_size", 2) or 0,
        # BertForMaskedLM ties cls.predictions.decoder.weight to the word embeddings
        tied_embeddings=_flag(cfg, "tie_word_embeddings", True),
        activation=_text(cfg, "hidden_act", "gelu"),
        **_GPT_STYLE,
        attn_dropout=_prob(cfg, "attention_probs_dropout_prob", 0.1),
        hidden_dropout=_prob(cfg, "hidden_dropout_prob", 0.1),
    )


# --- Llama-style decoders: RMSNorm, rotary positions, gated (SwiGLU) MLP, GQA -----------------------------------


def _llama_like(cfg: dict[str, Any], family: str, *, kv_default: int | None, head_dim_default: int | None,
                act_default: str = "silu") -> dict[str, Any]:
    hidden = _required_int(cfg, "hidden_size")
    heads = _required_int(cfg, "num_attention_heads")
    # num_key_value_heads: null means "same as num_attention_heads" (no GQA) in every one of these configs
    kv = _opt_int(cfg, "num_key_value_heads", kv_default)
    kv = heads if kv is None else kv
    head_dim = _opt_int(cfg, "head_dim", head_dim_default)
    if head_dim is None:
        if hidden % heads:
            raise ValueError(
                f"field 'hidden_size' ({hidden}) must be divisible by 'num_attention_heads' ({heads}) "
                "when 'head_dim' is not given"
            )
        head_dim = hidden // heads
    q = dict(
        family=family,
        hidden=hidden,
        layers=_required_int(cfg, "num_hidden_layers"),
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        intermediate=_required_int(cfg, "intermediate_size"),
        vocab=_required_int(cfg, "vocab_size"),
        max_position=_opt_int(cfg, "max_position_embeddings", 2048) or 0,
        tied_embeddings=_flag(cfg, "tie_word_embeddings", False),
        mlp="gated",
        activation=_text(cfg, "hidden_act", act_default),
        norm="rmsnorm",
        position="rope",
        norm_bias=False,
        hidden_dropout=0.0,
        attn_dropout=_prob(cfg, "attention_dropout", 0.0),
    )
    _check_heads(q, "num_attention_heads", "num_key_value_heads")
    return q


@_reader("llama")
def _llama(cfg: dict[str, Any]) -> dict[str, Any]:
    q = _llama_like(cfg, "llama", kv_default=None, head_dim_default=None)
    bias = _flag(cfg, "attention_bias", False)  # LlamaAttention: q, k, v and o all take `attention_bias`
    q.update(qkv_bias=bias, attn_out_bias=bias, mlp_bias=_flag(cfg, "mlp_bias", False))
    return q


@_reader("mistral")
def _mistral(cfg: dict[str, Any]) -> dict[str, Any]:
    q = _llama_like(cfg, "mistral", kv_default=8, head_dim_default=None)
    q.update(sliding_window=_opt_int(cfg, "sliding_window", 4096))
    return q


@_reader("qwen2")
def _qwen2(cfg: dict[str, Any]) -> dict[str, Any]:
    q = _llama_like(cfg, "qwen2", kv_default=32, head_dim_default=None)
    # Qwen2Attention: q_proj, k_proj, v_proj with bias=True, o_proj without
    q.update(qkv_bias=True, attn_out_bias=False, mlp_bias=False)
    # Sliding-window attention applies only when use_sliding_window is set, and then only to the layers from
    # max_window_layers on. One window for all layers is all Architecture can say: a partial window is left out
    # (full attention everywhere, which over- rather than under-estimates the KV cache).
    window = _opt_int(cfg, "sliding_window", 4096)
    first = cfg.get("max_window_layers", 28)
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise ValueError(f"field 'max_window_layers' must be a non-negative integer, got {first!r}")
    layers_with_window = q["layers"] - min(q["layers"], first)
    use = _flag(cfg, "use_sliding_window", False)
    q.update(sliding_window=window if use and window and layers_with_window == q["layers"] else None)
    return q


@_reader("mixtral")
def _mixtral(cfg: dict[str, Any]) -> dict[str, Any]:
    q = _llama_like(cfg, "mixtral", kv_default=8, head_dim_default=None)
    experts = _opt_int(cfg, "num_local_experts", 8) or 8
    top_k = _opt_int(cfg, "num_experts_per_tok", 2) or 2
    if top_k > experts:
        raise ValueError(f"field 'num_experts_per_tok' ({top_k}) exceeds 'num_local_experts' ({experts})")
    q.update(num_experts=experts, experts_per_token=top_k, sliding_window=_opt_int(cfg, "sliding_window", None))
    return q


@_reader("gemma")
def _gemma(cfg: dict[str, Any]) -> dict[str, Any]:
    q = _llama_like(cfg, "gemma", kv_default=16, head_dim_default=256, act_default="gelu_pytorch_tanh")
    # GemmaConfig: the released configs say hidden_act "gelu" but mean the tanh approximation; transformers
    # replaces it, and prefers `hidden_activation` where present.
    act = cfg.get("hidden_activation") or q["activation"]
    q.update(
        activation="gelu_pytorch_tanh" if act == "gelu" else act,
        tied_embeddings=_flag(cfg, "tie_word_embeddings", True),
        qkv_bias=_flag(cfg, "attention_bias", False),
        attn_out_bias=_flag(cfg, "attention_bias", False),
    )
    return q


# --- which head: decided by `architectures` --------------------------------------------------------------------

_DEFAULT_HEAD = {"bert": "masked_lm"}  # no `architectures` key: BERT checkpoints are MLM, the rest causal LMs


def head_from_architectures(cfg: dict[str, Any], model_type: str) -> tuple[str, int]:
    """(head, num_labels) from the first entry of `architectures`."""
    archs = cfg.get("architectures")
    num_labels = _num_labels(cfg)
    if not archs:
        return _DEFAULT_HEAD.get(model_type, "causal_lm"), num_labels
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ValueError(f"field 'architectures' must be a list of class names, got {archs!r}")
    name = archs[0]
    if name.endswith("ForCausalLM") or name.endswith("LMHeadModel"):
        return "causal_lm", num_labels
    if name.endswith("ForMaskedLM") or name == "BertForPreTraining":
        # BertForPreTraining also has the pooler and the next-sentence head (h*h + h + 2h + 2 parameters);
        # it is counted as the masked-LM head, the part whose memory matters.
        return "masked_lm", num_labels
    if name.endswith("ForSequenceClassification"):
        return "seq_cls", num_labels
    if name.endswith("Model") and "For" not in name:
        return "base", num_labels
    raise ValueError(
        f"field 'architectures' names {name!r}; supported heads: …ForCausalLM / …LMHeadModel, …ForMaskedLM / "
        "BertForPreTraining, …ForSequenceClassification, or the bare …Model"
    )


def _num_labels(cfg: dict[str, Any]) -> int:
    # PretrainedConfig: num_labels if given, else len(id2label), else 2
    if "num_labels" in cfg:
        return _positive_int(cfg, "num_labels", cfg["num_labels"])
    id2label = cfg.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    return 2


def architecture_from_hf(cfg: dict, origin: str, preset: str = "") -> Architecture:
    """An `Architecture` for a transformers config dict; ValueError naming the field for anything unusable."""
    from .count import largest_layer_params, params_breakdown

    if not isinstance(cfg, dict):
        raise ValueError(f"a config.json must hold a JSON object, got {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    if model_type is None:
        raise ValueError("missing required field 'model_type'")
    reader = _READERS.get(model_type)
    if reader is None:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(_READERS)}")
    quantities = reader(cfg)
    head, num_labels = head_from_architectures(cfg, model_type)
    meta = cfg.get("_nnmem") or {}
    name = meta.get("name") or cfg.get("_name_or_path") or preset or model_type
    arch = Architecture(
        name=str(name), kind="transformer", preset=preset, head=head, num_labels=num_labels, origin=origin,
        **quantities,
    )
    return dataclasses.replace(arch, params=params_breakdown(arch)["total"],
                               largest_layer_params=largest_layer_params(arch))
