"""count.params_breakdown against what transformers actually instantiates (meta device: no memory, no weights).

For every shipped preset, and for head / bias / tying variants the presets do not cover, compare:
total parameters (tied weights once), the largest single tensor, DeepSpeed's largest_layer_params (parameters a
module owns directly) and the nn.Linear/Conv1D weight elements inside the transformer blocks.
"""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch", reason="torch is needed to build the real models")
transformers = pytest.importorskip("transformers", reason="transformers is needed to build the real models")

from nnmem_sweep.models.count import params_breakdown  # noqa: E402
from nnmem_sweep.models.hf import architecture_from_hf  # noqa: E402
from nnmem_sweep.models.presets import (  # noqa: E402
    built_params_expected,
    hand_modelled,
    hand_modelled_ids,
    hf_dict_for_transformers,
    preset_ids,
    preset_meta,
)


BLOCK = re.compile(r"(^|\.)(layers|h|layer)\.\d+\.")  # inside a transformer block: model.layers.3.mlp ...


def _measure(cfg: dict) -> dict[str, int]:
    config = transformers.AutoConfig.for_model(**cfg)
    cls = getattr(transformers, cfg["architectures"][0])
    with torch.device("meta"):
        model = cls(config)
    params = list(model.parameters())  # unique Parameters: a tied weight appears once
    block_weights = 0
    for name, module in model.named_modules():
        if not BLOCK.search(name):
            continue
        for pname, p in module.named_parameters(recurse=False):
            if isinstance(module, torch.nn.Linear) and pname == "weight":
                block_weights += p.numel()
            elif type(module).__name__ == "Conv1D" and pname == "weight":  # GPT-2's transposed Linear
                block_weights += p.numel()
            elif type(module).__name__.endswith(("Experts", "Router")):  # MoE expert banks (3-D) and router
                block_weights += p.numel()
    return dict(
        total=sum(p.numel() for p in params),
        largest_tensor=max(p.numel() for p in params),
        largest_layer_params=max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()),
        linear_weight_in_layers=block_weights,
    )


def _expected(cfg: dict) -> dict[str, int]:
    parts = params_breakdown(architecture_from_hf(cfg, origin="test"))
    return {k: parts[k] for k in ("total", "largest_tensor", "largest_layer_params", "linear_weight_in_layers")}


def _meta_model(cfg: dict) -> torch.nn.Module:
    cfg = dict(cfg)
    cls = getattr(transformers, cfg.pop("architectures")[0])
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        return cls(config)


@pytest.mark.parametrize("preset", hand_modelled_ids())
def test_preset_counts_match_transformers(preset):
    cfg = hf_dict_for_transformers(preset)
    assert _expected(cfg) == _measure(cfg)


def _shrunk(preset: str, **changes) -> dict:
    cfg = hf_dict_for_transformers(preset)
    cfg.update(changes)
    return cfg


# Heads and options no preset uses, on the smallest member of each family.
VARIANTS = {
    "gpt2-seq-cls-3-labels": _shrunk("gpt2", architectures=["GPT2ForSequenceClassification"], num_labels=3),
    "gpt2-base-model": _shrunk("gpt2", architectures=["GPT2Model"]),
    "gpt2-n_inner-1000-untied": _shrunk("gpt2", n_inner=1000, tie_word_embeddings=False),
    "bert-seq-cls": _shrunk("bert-base", architectures=["BertForSequenceClassification"], num_labels=5),
    "bert-base-model-with-pooler": _shrunk("bert-base", architectures=["BertModel"]),
    "bert-lm-head-model": _shrunk("bert-base", architectures=["BertLMHeadModel"], is_decoder=True),
    "bert-mlm-untied": _shrunk("bert-base", tie_word_embeddings=False),
    "llama-attention-and-mlp-bias": _shrunk("smollm2-135m", attention_bias=True, mlp_bias=True),
    "llama-seq-cls": _shrunk("tinyllama-1.1b", architectures=["LlamaForSequenceClassification"], num_labels=4),
    "llama-base-model": _shrunk("llama-3.2-1b", architectures=["LlamaModel"]),
    "qwen2-untied-seq-cls": _shrunk("qwen2.5-0.5b", architectures=["Qwen2ForSequenceClassification"],
                                    tie_word_embeddings=False),
    "mistral-head-dim-96": _shrunk("mistral-7b", head_dim=96, num_hidden_layers=2),
    "mixtral-4-experts-top-1": _shrunk("mixtral-8x7b", num_local_experts=4, num_experts_per_tok=1,
                                       num_hidden_layers=2),
    "gemma-base-model": _shrunk("gemma-2b", architectures=["GemmaModel"]),
}


@pytest.mark.parametrize("cfg", list(VARIANTS.values()), ids=list(VARIANTS))
def test_variant_counts_match_transformers(cfg):
    assert _expected(cfg) == _measure(cfg)


@pytest.mark.parametrize("preset", [p for p in preset_ids() if not hand_modelled(p)])
def test_derived_preset_builds_its_published_count(preset):
    # what transformers instantiates from the preset (tied weights once) against the published figure, less the
    # parts that figure counts and the text model lacks (published_includes); rounded where the source rounds
    built = sum(p.numel() for p in _meta_model(hf_dict_for_transformers(preset)).parameters())
    rounding = preset_meta(preset).get("published_rounding", 0)
    if rounding:
        assert round(built / rounding) * rounding == built_params_expected(preset)
    else:
        assert built == built_params_expected(preset)


def test_gemma3_vision_tower_count():
    # google/gemma-3-{4,12,27}b-pt vision_config: SigLIP, 27 layers, 1152 wide, MLP 4304, 16 heads, 896 px / 14,
    # no pooling head (Gemma 3 takes the patch embeddings)
    config = transformers.SiglipVisionConfig(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                                             num_attention_heads=16, image_size=896, patch_size=14,
                                             vision_use_head=False)
    with torch.device("meta"):
        tower = transformers.SiglipVisionModel(config)
    assert sum(p.numel() for p in tower.parameters()) == 416_866_032
    for preset in ("gemma-3-12b", "gemma-3-27b"):
        assert preset_meta(preset)["published_includes"]["vision tower (SigLIP)"] == 416_866_032


def test_llama4_vision_encoder_count():
    # meta-llama/Llama-4-{Scout,Maverick} vision_config: 34 layers, 1408 wide, MLP 5632, 16 heads, 336 px / 14,
    # pixel shuffle 0.5 into a 4096-wide projector
    config = transformers.Llama4VisionConfig(hidden_size=1408, intermediate_size=5632, num_hidden_layers=34,
                                             num_attention_heads=16, image_size=336, patch_size=14,
                                             vision_output_dim=4096, projector_input_dim=4096,
                                             projector_output_dim=4096, pixel_shuffle_ratio=0.5)
    with torch.device("meta"):
        encoder = transformers.Llama4VisionModel(config)
    assert sum(p.numel() for p in encoder.parameters()) == 850_960_896
    for preset in ("llama-4-scout", "llama-4-maverick"):
        assert preset_meta(preset)["published_includes"] == {"vision encoder": 850_960_896,
                                                             "multimodal projector": 4096 * 5120}
