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
from nnmem_sweep.models.presets import hf_dict_for_transformers, preset_ids  # noqa: E402


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


@pytest.mark.parametrize("preset", preset_ids())
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
