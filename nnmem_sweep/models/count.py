"""Exact parameter counts of what transformers instantiates for an `Architecture`.

The model is listed module by module (the tensors each `nn.Module` owns, as in the transformers modeling file),
so the totals, the largest single tensor and the largest module all come from one description. Checked against
transformers itself on the meta device for every preset (tests/models/test_count_vs_transformers.py).

Symbols: h hidden, L layers, a heads, g kv heads, d head_dim, i intermediate, V vocab, P positions, T token types,
E experts, n labels.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..citations import formula, source
from .arch import Architecture

HF_MODELING = source(
    "hf-modeling",
    "Hugging Face transformers v5 modeling files (modeling_gpt2.py, modeling_bert.py, modeling_llama.py, "
    "modeling_mistral.py, modeling_qwen2.py, modeling_mixtral.py, modeling_gemma.py)",
    "https://github.com/huggingface/transformers/tree/main/src/transformers/models",
)
DEEPSPEED_ZERO3 = source(
    "deepspeed-zero3-estimator",
    "DeepSpeed estimate_zero3_model_states_mem_needs_all_live: largest_layer_params = max over modules of the "
    "parameters a module owns directly",
    "https://github.com/microsoft/DeepSpeed/blob/master/deepspeed/runtime/zero/stage3.py",
)


@dataclass(frozen=True)
class _Module:
    name: str
    tensors: tuple[int, ...]  # numel of each parameter tensor the module owns (recurse=False)
    new: int  # parameters it adds to the total (0 for a weight tied to the embeddings)
    linear_weight: int = 0  # elements of nn.Linear / Conv1D weight matrices (and MoE expert banks)

    @property
    def size(self) -> int:
        return sum(self.tensors)


def _linear(name: str, n_in: int, n_out: int, bias: bool) -> _Module:
    tensors = (n_in * n_out, n_out) if bias else (n_in * n_out,)
    return _Module(name, tensors, sum(tensors), n_in * n_out)


def _norm(name: str, arch: Architecture) -> _Module:
    # nn.LayerNorm: weight + bias; RMSNorm: weight only
    tensors = (arch.hidden, arch.hidden) if arch.norm_bias else (arch.hidden,)
    return _Module(name, tensors, sum(tensors))


def _layer_modules(arch: Architecture) -> list[_Module]:
    """The modules of one transformer block."""
    h, a, g, d, i = arch.hidden, arch.heads, arch.kv_heads, arch.head_dim, arch.intermediate
    mods: list[_Module] = [_norm("norm_1", arch)]
    if arch.family == "gpt2":
        # GPT2Attention: c_attn is one Conv1D producing q, k, v (h -> 3h), c_proj h -> h
        mods.append(_linear("c_attn", h, 3 * a * d, arch.qkv_bias))
    else:
        mods += [
            _linear("q_proj", h, a * d, arch.qkv_bias),
            _linear("k_proj", h, g * d, arch.qkv_bias),
            _linear("v_proj", h, g * d, arch.qkv_bias),
        ]
    mods.append(_linear("o_proj", a * d, h, arch.attn_out_bias))
    mods.append(_norm("norm_2", arch))
    if arch.num_experts:
        e = arch.num_experts
        # MixtralTopKRouter: weight (E, h), no bias. MixtralExperts (transformers >= 5): two 3-D banks,
        # gate_up_proj (E, 2i, h) and down_proj (E, h, i), owned by one module.
        mods.append(_linear("router", h, e, False))
        banks = (e * 2 * i * h, e * h * i) if arch.mlp == "gated" else (e * i * h, e * h * i)
        mods.append(_Module("experts", banks, sum(banks), sum(banks)))
    elif arch.mlp == "gated":
        mods += [
            _linear("gate_proj", h, i, arch.mlp_bias),
            _linear("up_proj", h, i, arch.mlp_bias),
            _linear("down_proj", i, h, arch.mlp_bias),
        ]
    else:
        mods += [_linear("up_proj", h, i, arch.mlp_bias), _linear("down_proj", i, h, arch.mlp_bias)]
    return mods


def _embedding_modules(arch: Architecture) -> list[_Module]:
    h = arch.hidden
    mods = [_Module("word_embeddings", (arch.vocab * h,), arch.vocab * h)]
    if arch.position == "learned" and arch.max_position:
        mods.append(_Module("position_embeddings", (arch.max_position * h,), arch.max_position * h))
    if arch.type_vocab:
        mods.append(_Module("token_type_embeddings", (arch.type_vocab * h,), arch.type_vocab * h))
    if arch.family == "bert":
        mods.append(_norm("embeddings.LayerNorm", arch))  # BertEmbeddings normalises the summed embeddings
    return mods


def _final_norm_modules(arch: Architecture) -> list[_Module]:
    # BERT is post-LN: every block ends in its own LayerNorm and there is no final one.
    return [] if arch.family == "bert" else [_norm("final_norm", arch)]


def _head_modules(arch: Architecture) -> list[_Module]:
    h, v, n = arch.hidden, arch.vocab, arch.num_labels
    word = v * h
    bert = arch.family == "bert"
    pooler = [_linear("pooler", h, h, True)] if bert else []
    if arch.head in ("causal_lm", "masked_lm"):
        if not bert:
            return [_Module("lm_head", (word,), 0 if arch.tied_embeddings else word, word)]
        # BertLMPredictionHead (BertForMaskedLM, and BertLMHeadModel for causal_lm): transform (dense h->h + LayerNorm), decoder Linear (V x h + bias V) and an output
        # bias (V). With tie_word_embeddings the decoder weight is the word embedding and the decoder bias is the
        # output bias; untied, all three are separate tensors (transformers v5 _tied_weights_keys).
        return [
            _linear("mlm.transform.dense", h, h, True),
            _norm("mlm.transform.LayerNorm", arch),
            _Module("mlm.decoder", (word, v), v + (0 if arch.tied_embeddings else word), word),
            _Module("mlm.bias", (v,), 0 if arch.tied_embeddings else v),
        ]
    if arch.head == "seq_cls":
        # BertForSequenceClassification: pooler + classifier with bias; the decoders' `score` has no bias
        return pooler + [_linear("classifier" if bert else "score", h, n, bert)]
    if arch.head == "base":
        return pooler  # BertModel keeps its pooler by default; decoder base models have no head
    raise ValueError(f"unknown head {arch.head!r}; expected causal_lm, masked_lm, seq_cls or base")


@formula(
    "params_transformer",
    "Ψ = embeddings (V·h [+ P·h + T·h]) + L·(attention h·(a+2g)·d + a·d·h + MLP (2 or 3)·h·i [·E + E·h router] "
    "+ norms + biases) + final norm + head (V·h unless tied)",
    HF_MODELING,
    where="module constructors (__init__) of each model class",
    note="counted module by module; tied weights counted once",
)
def params_breakdown(arch: Architecture) -> dict[str, int]:
    """Parameter counts by part. Keys: embeddings, per_layer, layers_total, final_norm, head, total,
    linear_weight_in_layers (nn.Linear/Conv1D weights inside the blocks, biases excluded; MoE: all experts and the
    router), largest_tensor (numel of the largest single parameter), largest_layer_params (DeepSpeed's measure)."""
    if arch.kind == "params":
        total = arch.params
        largest = arch.largest_layer_params or total
        return dict(embeddings=0, per_layer=0, layers_total=total, final_norm=0, head=0, total=total,
                    linear_weight_in_layers=total, largest_tensor=largest, largest_layer_params=largest)
    if arch.kind == "layers":
        return _layer_net_breakdown(arch)
    if arch.kind != "transformer":
        raise ValueError(f"unknown architecture kind {arch.kind!r}")

    emb, layer, final, head = (_embedding_modules(arch), _layer_modules(arch), _final_norm_modules(arch),
                               _head_modules(arch))
    per_layer = sum(m.new for m in layer)
    parts = dict(
        embeddings=sum(m.new for m in emb),
        per_layer=per_layer,
        layers_total=arch.layers * per_layer,
        final_norm=sum(m.new for m in final),
        head=sum(m.new for m in head),
    )
    parts["total"] = sum(parts.values()) - per_layer
    parts["linear_weight_in_layers"] = arch.layers * sum(m.linear_weight for m in layer)
    every = emb + layer + final + head
    parts["largest_tensor"] = max(max(m.tensors) for m in every)
    parts["largest_layer_params"] = max(m.size for m in every)
    return parts


def _layer_net_breakdown(arch: Architecture) -> dict[str, int]:
    rows = arch.layer_table
    total = sum(r.params for r in rows)
    weights = sum(r.weight_params for r in rows)
    # A layer's largest tensor is its weight (kernel / matrix) or its bias; a norm holds two equal vectors (γ, β).
    # (A LayerNorm with bias=False holds one: halved here, which never matters next to any conv or linear weight.)
    largest = max([max(r.weight_params, r.params - r.weight_params if r.weight_params else r.params // 2)
                   for r in rows] + [0])
    return dict(embeddings=0, per_layer=0, layers_total=total, final_norm=0, head=0, total=total,
                linear_weight_in_layers=weights, largest_tensor=largest,
                largest_layer_params=max([r.params for r in rows] + [0]))


@formula(
    "largest_layer_params",
    "max over modules m of Σ numel(p) for p owned directly by m",
    DEEPSPEED_ZERO3,
    where="estimate_zero3_model_states_mem_needs_all_live",
)
def largest_layer_params(arch: Architecture) -> int:
    """The most parameters any single module owns directly (DeepSpeed's `largest_layer_params`)."""
    return params_breakdown(arch)["largest_layer_params"]
