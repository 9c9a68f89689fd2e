"""Shipped presets: published parameter counts (source in the test id), file format, lookup errors."""
from __future__ import annotations

import json
import re

import pytest

from nnmem_sweep.models.presets import (
    META_KEY,
    hf_dict_for_transformers,
    list_presets,
    load_preset,
    preset_ids,
    preset_meta,
    preset_path,
)

# (preset, published total, which head the figure counts). Sources: the Hugging Face Hub safetensors metadata of
# each checkpoint (total parameters, tied weights stored once) unless the id says otherwise.
PUBLISHED = [
    pytest.param("llama-3.1-8b", 8_030_261_248, id="llama-3.1-8b-hf-meta-llama-Llama-3.1-8B-safetensors-causal_lm"),
    pytest.param("llama-3.1-70b", 70_553_706_496, id="llama-3.1-70b-hf-meta-llama-Llama-3.1-70B-safetensors"),
    pytest.param("llama-3.1-405b", 405_853_388_800, id="llama-3.1-405b-hf-meta-llama-Llama-3.1-405B-safetensors"),
    pytest.param("llama-3.2-1b", 1_235_814_400, id="llama-3.2-1b-hf-meta-llama-Llama-3.2-1B-safetensors-tied"),
    pytest.param("llama-3.2-3b", 3_212_749_824, id="llama-3.2-3b-hf-meta-llama-Llama-3.2-3B-safetensors-tied"),
    pytest.param("llama-2-7b", 6_738_415_616, id="llama-2-7b-hf-meta-llama-Llama-2-7b-hf-safetensors"),
    pytest.param("llama-2-13b", 13_015_864_320, id="llama-2-13b-hf-meta-llama-Llama-2-13b-hf-safetensors"),
    pytest.param("llama-2-70b", 68_976_648_192, id="llama-2-70b-hf-meta-llama-Llama-2-70b-hf-safetensors"),
    pytest.param("qwen2.5-3b", 3_085_938_688, id="qwen2.5-3b-hf-Qwen-Qwen2.5-3B-safetensors-tied"),
    pytest.param("qwen2.5-14b", 14_770_033_664, id="qwen2.5-14b-hf-Qwen-Qwen2.5-14B-safetensors"),
    pytest.param("qwen2.5-32b", 32_763_876_352, id="qwen2.5-32b-hf-Qwen-Qwen2.5-32B-safetensors"),
    pytest.param("mistral-7b", 7_241_732_096, id="mistral-7b-hf-mistralai-Mistral-7B-v0.1-safetensors"),
    pytest.param("mixtral-8x7b", 46_702_792_704, id="mixtral-8x7b-hf-mistralai-Mixtral-8x7B-v0.1-safetensors"),
    pytest.param("qwen2.5-0.5b", 494_032_768, id="qwen2.5-0.5b-hf-Qwen-Qwen2.5-0.5B-safetensors-tied"),
    pytest.param("qwen2.5-1.5b", 1_543_714_304, id="qwen2.5-1.5b-hf-Qwen-Qwen2.5-1.5B-safetensors-tied"),
    pytest.param("qwen2.5-7b", 7_615_616_512, id="qwen2.5-7b-hf-Qwen-Qwen2.5-7B-safetensors"),
    pytest.param("qwen2.5-72b", 72_706_203_648, id="qwen2.5-72b-hf-Qwen-Qwen2.5-72B-safetensors"),
    pytest.param("gemma-2b", 2_506_172_416, id="gemma-2b-hf-google-gemma-2b-safetensors-tied"),
    pytest.param("tinyllama-1.1b", 1_100_048_384, id="tinyllama-1.1b-hf-TinyLlama-1.1B-Chat-v1.0-safetensors"),
    pytest.param("smollm2-135m", 134_515_008, id="smollm2-135m-hf-HuggingFaceTB-SmolLM2-135M-safetensors-tied"),
    # GPT-2: transformers GPT2LMHeadModel.num_parameters(), lm_head tied to wte and counted once (the Hub's
    # "137M" adds the 12 x 1024 x 1024 causal-mask buffers stored in the old checkpoint)
    pytest.param("gpt2", 124_439_808, id="gpt2-small-transformers-GPT2LMHeadModel-num_parameters-tied"),
    pytest.param("gpt2-medium", 354_823_168, id="gpt2-medium-transformers-GPT2LMHeadModel-num_parameters-tied"),
    pytest.param("gpt2-large", 774_030_080, id="gpt2-large-transformers-GPT2LMHeadModel-num_parameters-tied"),
    pytest.param("gpt2-xl", 1_557_611_200, id="gpt2-xl-transformers-GPT2LMHeadModel-num_parameters-tied"),
    # BERT: transformers BertForMaskedLM.num_parameters() (MLM head, no pooler); BertModel with its pooler is
    # 109,482,240 (base) and the paper's rounded 110M / 340M (Devlin et al. 2018, §3) refers to that encoder.
    pytest.param("bert-base", 109_514_298, id="bert-base-uncased-transformers-BertForMaskedLM-num_parameters"),
    pytest.param("bert-large", 335_174_458, id="bert-large-uncased-transformers-BertForMaskedLM-num_parameters"),
]


@pytest.mark.parametrize("preset, published", PUBLISHED)
def test_published_parameter_count(preset, published):
    assert load_preset(preset).params == published
    assert preset_meta(preset)["published_params"] == published


def test_every_preset_has_a_published_count_test():
    assert sorted(p.values[0] for p in PUBLISHED) == preset_ids()


def test_required_ids_and_at_least_18():
    required = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base", "bert-large", "llama-3.2-1b",
                "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "mistral-7b", "mixtral-8x7b",
                "qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-72b"}
    assert required <= set(preset_ids())
    assert len(preset_ids()) >= 18


@pytest.mark.parametrize("preset", preset_ids())
def test_preset_file_format(preset):
    assert re.fullmatch(r"[a-z0-9.]+(-[a-z0-9.]+)*", preset)
    cfg = json.loads(preset_path(preset).read_text())
    meta = cfg[META_KEY]
    assert set(meta) == {"name", "published_params", "params_source"}
    assert isinstance(meta["published_params"], int) and meta["params_source"]
    assert cfg["model_type"] and cfg["architectures"]
    arch = load_preset(preset)
    assert arch.preset == preset and arch.name == meta["name"] and arch.kind == "transformer"
    assert arch.origin == f"preset {preset}.json"


def test_list_presets_sorted_by_id():
    ids = [a.preset for a in list_presets()]
    assert ids == sorted(ids) == preset_ids()


def test_hf_dict_strips_our_key_and_is_a_fresh_copy():
    d = hf_dict_for_transformers("llama-3.1-8b")
    assert META_KEY not in d and d["hidden_size"] == 4096
    d["hidden_size"] = 1
    assert hf_dict_for_transformers("llama-3.1-8b")["hidden_size"] == 4096


def test_unknown_preset_lists_close_matches():
    with pytest.raises(ValueError, match=r"unknown model preset 'llama-3-8b'; did you mean llama-3\.1-8b"):
        load_preset("llama-3-8b")


def test_unknown_preset_without_close_match_lists_all():
    with pytest.raises(ValueError, match=r"known presets: bert-base, bert-large, .*tinyllama-1\.1b$"):
        preset_path("resnet")


def test_preset_quantities_llama_3_1_8b():
    a = load_preset("llama-3.1-8b")
    assert (a.hidden, a.layers, a.heads, a.kv_heads, a.head_dim, a.intermediate, a.vocab) == (
        4096, 32, 32, 8, 128, 14336, 128256)
    assert (a.mlp, a.norm, a.position, a.tied_embeddings, a.head) == ("gated", "rmsnorm", "rope", False, "causal_lm")
    assert a.max_position == 131072


def test_mistral_sliding_window_and_mixtral_experts():
    assert load_preset("mistral-7b").sliding_window == 4096
    m = load_preset("mixtral-8x7b")
    assert (m.num_experts, m.experts_per_token, m.sliding_window) == (8, 2, None)
