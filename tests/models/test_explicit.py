"""Explicit architecture fields and the simple calculators' params model."""
from __future__ import annotations

import pytest

from nnmem_sweep.models._errors import FieldError
from nnmem_sweep.models.explicit import architecture_from_fields, architecture_from_params
from nnmem_sweep.models.presets import load_preset

COMPARED = ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "tied_embeddings", "mlp",
            "norm", "position", "qkv_bias", "attn_out_bias", "mlp_bias", "norm_bias", "attn_dropout",
            "hidden_dropout", "num_experts", "experts_per_token", "head", "params", "largest_layer_params")


@pytest.mark.parametrize("preset, fields", [
    ("gpt2", dict(family="gpt2", hidden=768, layers=12, heads=12)),
    ("bert-base", dict(family="bert", hidden=768, layers=12, heads=12)),
    ("llama-3.1-8b", dict(family="llama", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336,
                          vocab=128256)),
    ("qwen2.5-0.5b", dict(family="qwen2", hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864,
                          tied_embeddings=True)),
    ("mixtral-8x7b", dict(family="mixtral", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336)),
])
def test_family_defaults_rebuild_the_preset(preset, fields):
    explicit, published = architecture_from_fields(fields), load_preset(preset)
    assert {k: getattr(explicit, k) for k in COMPARED} == {k: getattr(published, k) for k in COMPARED}


def test_defaults_and_name():
    a = architecture_from_fields(dict(hidden=512, layers=4, heads=8, intermediate=1024))
    assert (a.family, a.kv_heads, a.head_dim, a.mlp, a.norm_bias, a.name) == ("llama", 8, 64, "gated", False,
                                                                              "llama h=512 L=4")
    assert architecture_from_fields(dict(family="mixtral", hidden=64, layers=1, heads=4, intermediate=128,
                                         num_experts=0)).experts_per_token == 0


@pytest.mark.parametrize("fields, key, message", [
    (dict(hidden=512, layers=4), "heads", "missing required field"),
    (dict(hidden=512, layers=4, heads=8), "intermediate", "missing required field"),
    (dict(hidden=512, layers=4, heads=8, intermediate=1, hiddden=3), "hiddden", "did you mean 'hidden'"),
    (dict(hidden=500, layers=4, heads=8, intermediate=1), "heads", "must divide hidden"),
    (dict(hidden=512, layers=4, heads=8, kv_heads=3, intermediate=1), "kv_heads", "must divide heads"),
    (dict(hidden=512, layers=0, heads=8, intermediate=1), "layers", "positive integer"),
    (dict(hidden=512, layers=2, heads=8, intermediate=1, mlp="swiglu"), "mlp", "one of gelu, gated"),
    (dict(hidden=512, layers=2, heads=8, intermediate=1, family="t5"), "family", "one of gpt2, bert"),
    (dict(hidden=512, layers=2, heads=8, intermediate=1, attn_dropout=2), "attn_dropout", "probability"),
    (dict(hidden=512, layers=2, heads=8, intermediate=1, experts_per_token=2), "experts_per_token", "num_experts"),
])
def test_bad_fields_name_the_key(fields, key, message):
    with pytest.raises(FieldError, match=message) as e:
        architecture_from_fields(fields)
    assert e.value.key == key


def test_params_model_per_sample():
    # FORMULAS.md worked example: 20,000,000 params, 1,000,000 activation elements per sample
    a = architecture_from_params(dict(params=20_000_000, activation_elements_per_sample=1_000_000))
    assert (a.kind, a.params, a.activation_elements_per_sample, a.activation_elements_per_token) == (
        "params", 20_000_000, 1_000_000, 0)


def test_params_model_per_token_and_multiplier():
    # FORMULAS.md BERT-base style example: per-token activation factor 37,000
    a = architecture_from_params(dict(params=110_000_000, activation_elements_per_token=37_000, name="BERT-ish"))
    assert (a.activation_elements_per_token, a.name) == (37_000, "BERT-ish")
    # elements per token = multiplier * layers * hidden = 34 * 12 * 768
    b = architecture_from_params(dict(params=1, layers=12, hidden=768, activation_multiplier=34))
    assert (b.activation_elements_per_token, b.layers, b.hidden) == (313_344, 12, 768)


@pytest.mark.parametrize("spec, key", [
    (dict(activation_elements_per_sample=1), "params"),
    (dict(params=1), "params"),
    (dict(params=1, activation_elements_per_sample=1, activation_elements_per_token=1),
     "activation_elements_per_token"),
    (dict(params=1, activation_multiplier=3, layers=2), "hidden"),
    (dict(params=1, activation_multiplier=-1, layers=2, hidden=3), "activation_multiplier"),
    (dict(params=-5, activation_elements_per_sample=1), "params"),
    (dict(params=1, activation_elements_per_sample=1, batch=3), "batch"),
])
def test_params_model_errors(spec, key):
    with pytest.raises(FieldError) as e:
        architecture_from_params(spec)
    assert e.value.key == key
