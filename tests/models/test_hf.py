"""architecture_from_hf: HF config fields -> Architecture quantities, defaults as transformers has them."""
from __future__ import annotations

import pytest

from nnmem_sweep.models.hf import architecture_from_hf, supported_model_types
from nnmem_sweep.models.presets import hf_dict_for_transformers


def _arch(preset: str, **changes):
    cfg = hf_dict_for_transformers(preset)
    cfg.update(changes)
    for key, value in list(cfg.items()):
        if value is KeyError:
            del cfg[key]
    return architecture_from_hf(cfg, origin="test")


def test_gpt2_fields():
    a = _arch("gpt2")
    assert (a.family, a.hidden, a.layers, a.heads, a.kv_heads, a.head_dim) == ("gpt2", 768, 12, 12, 12, 64)
    assert a.intermediate == 4 * 768  # n_inner null -> 4 * n_embd
    assert (a.vocab, a.max_position, a.tied_embeddings, a.activation) == (50257, 1024, True, "gelu_new")
    assert (a.qkv_bias, a.attn_out_bias, a.mlp_bias, a.norm_bias) == (True, True, True, True)
    assert (a.attn_dropout, a.hidden_dropout, a.position, a.norm, a.mlp) == (0.1, 0.1, "learned", "layernorm", "gelu")
    assert _arch("gpt2", n_inner=1000).intermediate == 1000
    assert _arch("gpt2", tie_word_embeddings=KeyError).tied_embeddings is True  # GPT2Config default
    assert _arch("gpt2", attn_pdrop=0.0, resid_pdrop=0.2).attn_dropout == 0.0


def test_bert_fields():
    a = _arch("bert-base")
    assert (a.type_vocab, a.max_position, a.tied_embeddings, a.head) == (2, 512, True, "masked_lm")
    assert (a.attn_dropout, a.hidden_dropout, a.activation) == (0.1, 0.1, "gelu")
    with pytest.raises(ValueError, match="position_embedding_type"):
        _arch("bert-base", position_embedding_type="relative_key")


def test_llama_defaults():
    a = _arch("llama-3.1-8b", num_key_value_heads=None, tie_word_embeddings=KeyError, attention_dropout=KeyError)
    assert a.kv_heads == 32 and a.tied_embeddings is False and a.attn_dropout == 0.0
    assert (a.qkv_bias, a.attn_out_bias, a.mlp_bias, a.norm_bias) == (False,) * 4
    b = _arch("llama-3.1-8b", attention_bias=True)
    assert (b.qkv_bias, b.attn_out_bias, b.mlp_bias) == (True, True, False)
    assert _arch("llama-3.2-1b").head_dim == 64 and _arch("llama-3.2-1b").tied_embeddings


def test_qwen2_bias_and_window():
    a = _arch("qwen2.5-7b")
    assert (a.qkv_bias, a.attn_out_bias, a.mlp_bias, a.kv_heads, a.head_dim) == (True, False, False, 4, 128)
    assert a.sliding_window is None  # use_sliding_window false
    assert _arch("qwen2.5-7b", use_sliding_window=True, max_window_layers=0).sliding_window == 131072
    # a window on only some layers cannot be expressed: full attention everywhere (an over-estimate)
    assert _arch("qwen2.5-7b", use_sliding_window=True, max_window_layers=14).sliding_window is None


def test_mistral_and_mixtral():
    assert _arch("mistral-7b").sliding_window == 4096
    assert _arch("mistral-7b", sliding_window=KeyError).sliding_window == 4096  # MistralConfig default
    assert _arch("mistral-7b", sliding_window=None).sliding_window is None
    m = _arch("mixtral-8x7b", num_local_experts=4, num_experts_per_tok=1)
    assert (m.num_experts, m.experts_per_token, m.family) == (4, 1, "mixtral")
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        _arch("mixtral-8x7b", num_experts_per_tok=9)


def test_gemma_activation_legacy_gelu_means_tanh():
    assert _arch("gemma-2b", hidden_activation=None).activation == "gelu_pytorch_tanh"
    assert _arch("gemma-2b").tied_embeddings and _arch("gemma-2b").head_dim == 256


@pytest.mark.parametrize("name, head", [
    ("LlamaForCausalLM", "causal_lm"), ("GPT2LMHeadModel", "causal_lm"), ("BertForMaskedLM", "masked_lm"),
    ("BertForPreTraining", "masked_lm"), ("LlamaForSequenceClassification", "seq_cls"), ("LlamaModel", "base"),
])
def test_head_from_architectures(name, head):
    assert _arch("llama-3.2-1b", architectures=[name]).head == head


def test_num_labels_from_id2label_or_field():
    assert _arch("gpt2", architectures=["GPT2ForSequenceClassification"],
                 id2label={"0": "a", "1": "b", "2": "c"}).num_labels == 3
    assert _arch("gpt2", architectures=["GPT2ForSequenceClassification"], num_labels=7).num_labels == 7


def test_missing_architectures_defaults():
    assert _arch("bert-base", architectures=KeyError).head == "masked_lm"
    assert _arch("gpt2", architectures=KeyError).head == "causal_lm"


def test_unsupported_head():
    with pytest.raises(ValueError, match="'BertForQuestionAnswering'; supported heads"):
        _arch("bert-base", architectures=["BertForQuestionAnswering"])


def test_unsupported_model_type_lists_supported():
    with pytest.raises(ValueError) as e:
        architecture_from_hf({"model_type": "t5"}, origin="x")
    assert str(e.value) == ("unsupported model_type 't5'; supported: gpt2, bert, llama, mistral, qwen2, mixtral, "
                            "gemma")
    assert supported_model_types()[:6] == ["gpt2", "bert", "llama", "mistral", "qwen2", "mixtral"]


@pytest.mark.parametrize("preset, field", [
    ("llama-3.1-8b", "hidden_size"), ("llama-3.1-8b", "intermediate_size"), ("gpt2", "n_embd"),
    ("gpt2", "n_layer"), ("bert-base", "num_attention_heads"), ("qwen2.5-7b", "vocab_size"),
    ("gpt2", "model_type"),
])
def test_missing_required_field_is_named(preset, field):
    with pytest.raises(ValueError, match=f"missing required field '{field}'"):
        _arch(preset, **{field: KeyError})


@pytest.mark.parametrize("changes, message", [
    ({"hidden_size": "4096"}, "field 'hidden_size' must be a positive integer, got '4096'"),
    ({"num_key_value_heads": 5}, "field 'num_key_value_heads' \\(5\\) must divide 'num_attention_heads' \\(32\\)"),
    ({"attention_dropout": 1.5}, "field 'attention_dropout' must be a probability"),
    ({"tie_word_embeddings": "yes"}, "field 'tie_word_embeddings' must be true or false"),
    ({"architectures": "LlamaForCausalLM"}, "field 'architectures' must be a list"),
])
def test_bad_values_name_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        _arch("llama-3.1-8b", **changes)


def test_not_a_dict():
    with pytest.raises(ValueError, match="must hold a JSON object, got list"):
        architecture_from_hf([], origin="x")
