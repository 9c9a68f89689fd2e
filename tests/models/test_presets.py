"""Shipped presets: published parameter counts (source in the test id), file format, lookup errors."""
from __future__ import annotations

import json
import re

import pytest

from nnmem_sweep.models.presets import (
    META_KEY,
    built_params_expected,
    canonical_id,
    hand_modelled,
    hand_modelled_ids,
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
    pytest.param("mistral-small-3", 23_572_403_200,
                 id="mistral-small-3-hf-mistralai-Mistral-Small-24B-Base-2501-safetensors"),
]

# Presets of families without a hand reader (planned from the model's own code): (preset, published figure, what the
# figure counts that the preset does not build, its rounding). transformers' count of each on the meta device is
# checked against these in tests/models/test_count_vs_transformers.py.
DERIVED_PUBLISHED = [
    pytest.param("qwen3-0.6b", 596_049_920, {}, 0, id="qwen3-0.6b-hf-Qwen-Qwen3-0.6B-safetensors-tied"),
    pytest.param("qwen3-8b", 8_190_735_360, {}, 0, id="qwen3-8b-hf-Qwen-Qwen3-8B-safetensors"),
    pytest.param("qwen3-14b", 14_768_307_200, {}, 0, id="qwen3-14b-hf-Qwen-Qwen3-14B-safetensors"),
    pytest.param("qwen3-32b", 32_762_123_264, {}, 0, id="qwen3-32b-hf-Qwen-Qwen3-32B-safetensors"),
    pytest.param("qwen3-30b-a3b", 30_532_122_624, {}, 0, id="qwen3-30b-a3b-hf-Qwen-Qwen3-30B-A3B-safetensors"),
    pytest.param("qwen3-235b-a22b", 235_093_634_560, {}, 0,
                 id="qwen3-235b-a22b-hf-Qwen-Qwen3-235B-A22B-safetensors"),
    pytest.param("gemma-3-1b", 999_885_952, {}, 0, id="gemma-3-1b-hf-google-gemma-3-1b-pt-safetensors-tied"),
    # the 12B/27B checkpoints are Gemma3ForConditionalGeneration: SigLIP (27 layers, 1152 wide, 896 px) + projector
    pytest.param("gemma-3-12b", 12_187_325_040, {"vision tower (SigLIP)": 416_866_032,
                                                 "multimodal projector": 1152 * 3840 + 1152}, 0,
                 id="gemma-3-12b-hf-google-gemma-3-12b-pt-safetensors-less-vision"),
    pytest.param("gemma-3-27b", 27_432_406_640, {"vision tower (SigLIP)": 416_866_032,
                                                 "multimodal projector": 1152 * 5376 + 1152}, 0,
                 id="gemma-3-27b-hf-google-gemma-3-27b-pt-safetensors-less-vision"),
    pytest.param("gemma-2-2b", 2_614_341_888, {}, 0, id="gemma-2-2b-hf-google-gemma-2-2b-safetensors-tied"),
    pytest.param("phi-4", 14_659_507_200, {}, 0, id="phi-4-hf-microsoft-phi-4-safetensors"),
    pytest.param("phi-3-mini", 3_821_079_552, {}, 0, id="phi-3-mini-hf-microsoft-Phi-3-mini-4k-instruct-safetensors"),
    pytest.param("starcoder2-15b", 15_957_889_024, {}, 0, id="starcoder2-15b-hf-bigcode-starcoder2-15b-safetensors"),
    pytest.param("starcoder", 15_500_000_000, {}, 100_000_000, id="starcoder-model-card-15.5B-rounded"),
    pytest.param("opt-350m", 331_196_416, {}, 0, id="opt-350m-transformers-OPTForCausalLM-num_parameters-tied"),
    pytest.param("pythia-1.4b", 1_414_647_808, {}, 0, id="pythia-1.4b-Biderman-2023-README-total-params"),
    pytest.param("t5-base", 222_903_552, {}, 0, id="t5-base-transformers-T5ForConditionalGeneration-num_parameters"),
    pytest.param("vit-base-16", 86_567_656, {}, 0,
                 id="vit-base-16-transformers-ViTForImageClassification-num_parameters-1000-labels"),
    # the paper's main model; the Hub's 685B adds the 14B multi-token-prediction module
    pytest.param("deepseek-v3", 671_000_000_000, {}, 1_000_000_000, id="deepseek-v3-arXiv-2412.19437-671B-main-model"),
    # the checkpoints are Llama4ForConditionalGeneration: vision encoder + projector (4096 x 5120)
    pytest.param("llama-4-scout", 108_641_793_536, {"vision encoder": 850_960_896,
                                                    "multimodal projector": 4096 * 5120}, 0,
                 id="llama-4-scout-hf-meta-llama-Llama-4-Scout-17B-16E-safetensors-less-vision"),
    pytest.param("llama-4-maverick", 401_583_781_376, {"vision encoder": 850_960_896,
                                                       "multimodal projector": 4096 * 5120}, 0,
                 id="llama-4-maverick-hf-meta-llama-Llama-4-Maverick-17B-128E-safetensors-less-vision"),
]


@pytest.mark.parametrize("preset, published", PUBLISHED)
def test_published_parameter_count(preset, published):
    assert load_preset(preset).params == published
    assert preset_meta(preset)["published_params"] == published


@pytest.mark.parametrize("preset, published, includes, rounding", DERIVED_PUBLISHED)
def test_derived_preset_published_figure(preset, published, includes, rounding):
    meta = preset_meta(preset)
    assert not hand_modelled(preset)
    assert meta["published_params"] == published
    assert meta.get("published_includes", {}) == includes
    assert meta.get("published_rounding", 0) == rounding
    assert built_params_expected(preset) == published - sum(includes.values())


def test_every_preset_has_a_published_count_test():
    assert sorted(p.values[0] for p in PUBLISHED) == hand_modelled_ids()
    assert sorted(p.values[0] for p in PUBLISHED + DERIVED_PUBLISHED) == preset_ids()


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
    assert {"name", "hf_id", "published_params", "params_source"} <= set(meta) <= {
        "name", "hf_id", "published_params", "params_source", "published_rounding", "published_includes"}
    assert isinstance(meta["published_params"], int) and meta["params_source"]
    assert re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", meta["hf_id"])
    assert cfg["model_type"] and cfg["architectures"]
    if not hand_modelled(preset):
        with pytest.raises(ValueError, match=r"no hand-modelled reader: .*derived; needs the \[measure\] extra"):
            load_preset(preset)
        return
    arch = load_preset(preset)
    assert arch.preset == preset and arch.name == meta["name"] and arch.kind == "transformer"
    assert arch.origin == f"preset {preset}.json"


def test_list_presets_sorted_by_id():
    ids = [a.preset for a in list_presets()]
    assert ids == sorted(ids) == hand_modelled_ids()
    assert set(hand_modelled_ids()) < set(preset_ids())


def test_hf_ids_are_unique_and_name_their_preset():
    hf_ids = [preset_meta(p)["hf_id"].lower() for p in preset_ids()]
    assert len(set(hf_ids)) == len(hf_ids)
    for p in preset_ids():
        assert canonical_id(preset_meta(p)["hf_id"]) == p


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.1-8B", "META-LLAMA/llama-3.1-8b", "llama-3.1-8b"])
def test_load_preset_by_hugging_face_id(name):
    a = load_preset(name)
    assert a.preset == "llama-3.1-8b" and a.params == 8_030_261_248


def test_resolve_model_takes_a_hugging_face_id(tmp_path):
    from nnmem_sweep.models.resolve import resolve_model

    assert resolve_model({"preset": "Qwen/Qwen2.5-0.5B"}, tmp_path).preset == "qwen2.5-0.5b"


def test_presets_command_lists_derived_families_without_crashing(capsys):
    from nnmem_sweep.cli import main

    assert main(["presets"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert set(lines) == set(preset_ids())
    # the card of every derived preset is shipped: the count printed is the built model's, equal to the published
    assert "14,768,307,200" in lines["qwen3-14b"] and lines["qwen3-14b"].endswith("  derived")
    assert "8,030,261,248" in lines["llama-3.1-8b"] and "derived" not in lines["llama-3.1-8b"]


def test_hf_dict_strips_our_key_and_is_a_fresh_copy():
    d = hf_dict_for_transformers("llama-3.1-8b")
    assert META_KEY not in d and d["hidden_size"] == 4096
    d["hidden_size"] = 1
    assert hf_dict_for_transformers("llama-3.1-8b")["hidden_size"] == 4096


def test_unknown_preset_lists_close_matches():
    with pytest.raises(ValueError, match=r"unknown model preset 'llama-3-8b'; did you mean llama-3\.1-8b"):
        load_preset("llama-3-8b")


def test_unknown_preset_without_close_match_lists_all():
    with pytest.raises(ValueError, match=r"known presets: bert-base, bert-large, .*vit-base-16$"):
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
