"""Models described field by field in the scenario: a transformer's quantities by name, or the simple
calculators' model (a parameter count plus activation elements)."""
from __future__ import annotations

import difflib
import math
from typing import Any

from ._errors import FieldError
from .arch import Architecture

# What each family means when a field is left out (transformers' defaults for that model_type).
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": dict(vocab=50257, max_position=1024, tied_embeddings=True, mlp="gelu", activation="gelu_new",
                 norm="layernorm", position="learned", qkv_bias=True, attn_out_bias=True, mlp_bias=True,
                 attn_dropout=0.1, hidden_dropout=0.1, head="causal_lm"),
    "bert": dict(vocab=30522, max_position=512, type_vocab=2, tied_embeddings=True, mlp="gelu", activation="gelu",
                 norm="layernorm", position="learned", qkv_bias=True, attn_out_bias=True, mlp_bias=True,
                 attn_dropout=0.1, hidden_dropout=0.1, head="masked_lm"),
    "llama": dict(vocab=32000, max_position=2048, tied_embeddings=False, mlp="gated", activation="silu",
                  norm="rmsnorm", position="rope", head="causal_lm"),
    "mistral": dict(vocab=32000, max_position=32768, tied_embeddings=False, mlp="gated", activation="silu",
                    norm="rmsnorm", position="rope", sliding_window=4096, head="causal_lm"),
    "qwen2": dict(vocab=151936, max_position=32768, tied_embeddings=False, mlp="gated", activation="silu",
                  norm="rmsnorm", position="rope", qkv_bias=True, head="causal_lm"),
    "mixtral": dict(vocab=32000, max_position=32768, tied_embeddings=False, mlp="gated", activation="silu",
                    norm="rmsnorm", position="rope", num_experts=8, experts_per_token=2, head="causal_lm"),
    "gemma": dict(vocab=256000, max_position=8192, tied_embeddings=True, mlp="gated",
                  activation="gelu_pytorch_tanh", norm="rmsnorm", position="rope", head="causal_lm"),
}

_INT_FIELDS = ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "max_position",
               "type_vocab", "num_experts", "experts_per_token", "sliding_window", "num_labels")
_ZERO_OK = {"type_vocab", "num_experts", "experts_per_token", "max_position"}
_BOOL_FIELDS = ("tied_embeddings", "qkv_bias", "attn_out_bias", "mlp_bias", "norm_bias")
_PROB_FIELDS = ("attn_dropout", "hidden_dropout")
_CHOICES = {
    "family": tuple(FAMILY_DEFAULTS),
    "mlp": ("gelu", "gated"),
    "norm": ("layernorm", "rmsnorm"),
    "position": ("learned", "rope"),
    "head": ("causal_lm", "masked_lm", "seq_cls", "base"),
}
_TEXT_FIELDS = ("name", "activation")
ARCHITECTURE_FIELDS = ("family", *_INT_FIELDS, *_BOOL_FIELDS, *_PROB_FIELDS, "mlp", "norm", "position", "head",
                       *_TEXT_FIELDS)


def _unknown(key: str, known: tuple[str, ...] | list[str]) -> FieldError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known fields: {', '.join(known)}"
    return FieldError(key, f"unknown field{hint}")


def _int(key: str, value: Any, zero_ok: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (value == 0 and not zero_ok):
        kind = "a non-negative integer" if zero_ok else "a positive integer"
        raise FieldError(key, f"must be {kind}, got {value!r}")
    return value


def architecture_from_fields(fields: dict, origin: str = "explicit") -> Architecture:
    """A transformer from explicit quantities (Architecture field names); defaults follow `family`."""
    if not isinstance(fields, dict):
        raise FieldError("", f"architecture must be a mapping of fields, got {type(fields).__name__}")
    for key in fields:
        if key not in ARCHITECTURE_FIELDS:
            raise _unknown(key, ARCHITECTURE_FIELDS)
    family = fields.get("family", "llama")
    if family not in FAMILY_DEFAULTS:
        raise FieldError("family", f"must be one of {', '.join(FAMILY_DEFAULTS)}, got {family!r}")
    q: dict[str, Any] = dict(FAMILY_DEFAULTS[family])
    for key, value in fields.items():
        if key in _INT_FIELDS:
            if key == "sliding_window" and value is None:
                q[key] = None
                continue
            q[key] = _int(key, value, zero_ok=key in _ZERO_OK)
        elif key in _BOOL_FIELDS:
            if not isinstance(value, bool):
                raise FieldError(key, f"must be true or false, got {value!r}")
            q[key] = value
        elif key in _PROB_FIELDS:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise FieldError(key, f"must be a probability in [0, 1], got {value!r}")
            q[key] = float(value)
        elif key in _CHOICES:
            if value not in _CHOICES[key]:
                raise FieldError(key, f"must be one of {', '.join(_CHOICES[key])}, got {value!r}")
            q[key] = value
        else:  # name, activation
            if not isinstance(value, str) or not value:
                raise FieldError(key, f"must be a non-empty string, got {value!r}")
            q[key] = value
    for key in ("hidden", "layers", "heads"):
        if key not in q:
            raise FieldError(key, "missing required field")
    h, a = q["hidden"], q["heads"]
    if "head_dim" not in q:
        if h % a:
            raise FieldError("heads", f"must divide hidden ({h}) when head_dim is not given, got {a}")
        q["head_dim"] = h // a
    q.setdefault("kv_heads", a)
    if a % q["kv_heads"]:
        raise FieldError("kv_heads", f"must divide heads ({a}), got {q['kv_heads']}")
    if "intermediate" not in q:
        if q["mlp"] == "gated":
            raise FieldError("intermediate", "missing required field (a gated MLP has no conventional width)")
        q["intermediate"] = 4 * h  # GPT-2 / BERT convention: ffn = 4h
    q.setdefault("norm_bias", q["norm"] == "layernorm")  # LayerNorm has a bias, RMSNorm does not
    experts = q.get("num_experts", 0)
    if experts:
        if "experts_per_token" not in fields:  # the family's top-k (Mixtral: 2), never more than the experts
            q["experts_per_token"] = min(q.get("experts_per_token", 2), experts)
        if q["experts_per_token"] > experts or q["experts_per_token"] == 0:
            raise FieldError("experts_per_token", f"must be between 1 and num_experts ({experts})")
    elif fields.get("experts_per_token"):
        raise FieldError("experts_per_token", "needs num_experts > 0")
    else:
        q["experts_per_token"] = 0  # dense (e.g. family mixtral with num_experts: 0)
    if q["position"] == "rope":
        q.setdefault("max_position", 0)
    q.pop("family", None)
    name = q.pop("name", None) or f"{family} h={h} L={q['layers']}"
    return _finish(Architecture(name=name, kind="transformer", family=family, origin=origin, **q))


def _finish(arch: Architecture) -> Architecture:
    import dataclasses

    from .count import params_breakdown

    parts = params_breakdown(arch)
    return dataclasses.replace(arch, params=parts["total"], largest_layer_params=parts["largest_layer_params"])


# --- the simple calculators' model -----------------------------------------------------------------------------

PARAMS_FIELDS = ("params", "activation_elements_per_sample", "activation_elements_per_token", "layers", "hidden",
                 "activation_multiplier", "largest_layer_params", "name")


def architecture_from_params(spec: dict, origin: str = "params") -> Architecture:
    """`params` plus one of: activation_elements_per_sample; activation_elements_per_token; or layers + hidden +
    activation_multiplier (elements per token = multiplier · layers · hidden)."""
    for key in spec:
        if key not in PARAMS_FIELDS:
            raise _unknown(key, PARAMS_FIELDS)
    if "params" not in spec:
        raise FieldError("params", "missing required field")
    params = _int("params", spec["params"])
    per_sample = per_token = 0
    layers = hidden = 0
    given = [k for k in ("activation_elements_per_sample", "activation_elements_per_token", "activation_multiplier")
             if k in spec]
    if len(given) > 1:
        raise FieldError(given[1], f"give only one of {', '.join(given)}")
    if "activation_elements_per_sample" in spec:
        per_sample = _int("activation_elements_per_sample", spec["activation_elements_per_sample"], zero_ok=True)
    elif "activation_elements_per_token" in spec:
        per_token = _int("activation_elements_per_token", spec["activation_elements_per_token"], zero_ok=True)
    elif "activation_multiplier" in spec:
        for key in ("layers", "hidden"):
            if key not in spec:
                raise FieldError(key, "missing required field (activation_multiplier needs layers and hidden)")
        layers, hidden = _int("layers", spec["layers"]), _int("hidden", spec["hidden"])
        mult = spec["activation_multiplier"]
        if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not math.isfinite(mult) or mult < 0:
            raise FieldError("activation_multiplier", f"must be a non-negative number, got {mult!r}")
        per_token = round(mult * layers * hidden)
    else:
        raise FieldError("params", "needs activation_elements_per_sample, activation_elements_per_token, or "
                                   "layers + hidden + activation_multiplier")
    if "layers" in spec and not layers:
        layers = _int("layers", spec["layers"])
    if "hidden" in spec and not hidden:
        hidden = _int("hidden", spec["hidden"])
    largest = _int("largest_layer_params", spec["largest_layer_params"]) if "largest_layer_params" in spec else 0
    name = spec.get("name") or f"{params:,} parameters"
    return Architecture(name=str(name), kind="params", family="params", params=params, layers=layers,
                        hidden=hidden, activation_elements_per_sample=per_sample,
                        activation_elements_per_token=per_token, largest_layer_params=largest, origin=origin)
