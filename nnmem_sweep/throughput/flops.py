"""FLOPs per token, and the parameter count N they are counted from.

Convention (PaLM Appendix B; Narayanan et al. 2021 eq. 3; torchtitan and Megatron-LM count the same way):

    model FLOPs per trained token     = 6·N + 12·L·H·Q·T
    forward FLOPs per generated token = 2·N + 4·L·H·Q·T

N: the parameters that take part in a token's matrix multiplications: every parameter except the input embedding
tables (a lookup, not a matmul: token, position and token-type embeddings), with the output projection V·h counted
once even when it is tied to the input embedding (the matmul happens), and for a mixture of experts only the k
routed experts a token uses out of E (plus everything shared). Norm scales and biases stay in N, as torchtitan
counts them (they are < 0.01 % of any preset). L layers, H query heads, Q head dimension (H·Q is the attention width,
= hidden for every preset but Gemma), T the tokens attended: the training sequence length, or the cached context
when decoding; min(T, sliding window) where the model has one (torchtitan's convention). Causal masking is not
credited (flash attention's causal kernels skip about half of the attention FLOPs): the convention of PaLM,
Megatron-LM and torchtitan, so that MFU figures compare.

Derived models (issue 12) count the same way from their card (derive/card.py: the built model's parameter tensors):
the input embedding tables are its non-matmul 2-D tensors named as embeddings (`embed`, `wte`, `wpe`); the output
head the matmul tensors outside the repeated blocks whose first dimension is the vocabulary; the routed experts the
tensors under an `experts.` module (not `shared_expert(s)`); L, H and Q from the config's fields. A model that mixes
sliding-window and global layers (Gemma 2/3, Mistral-style configs) is counted with its window on every layer, as
torchtitan counts it: the global layers' attention beyond the window (1 in 2 layers for Gemma 2, 1 in 6 for Gemma 3)
is left out, so its FLOPs per token are under-counted at contexts longer than the window.

When a model is known only by its parameter counts, pass N_active as `n` and leave the attention terms at 0: the embedding lookup is then counted as a matmul (6·V·h FLOPs too many per token:
+7.0 % of 6N for Llama 3.1 8B, +1.5 % for 70B) and attention is left out (22 % of Llama 3.1 8B's FLOPs at T = 8,192,
6.7 % at T = 2,048); the two errors have opposite signs. Say in the report which terms the estimate had.
"""
from __future__ import annotations

import math
import re

import numpy as np

from ..citations import formula, source
from ..components.activations import KORTHIKANTI_2022
from ..models.arch import Architecture
from ..models.count import params_breakdown
from ..parallel.activations import NARAYANAN_2021

PALM_2022 = source("chowdhery2022", "Chowdhery et al. 2022, PaLM: Scaling Language Modeling with Pathways "
                   "(Appendix B: model FLOPs utilization, 6N + 12LHQT per token)", "arXiv:2204.02311")
KAPLAN_2020 = source("kaplan2020", "Kaplan et al. 2020, Scaling Laws for Neural Language Models (§2.1, Table 1: "
                     "C_forward ≈ 2N + 2·n_layer·n_ctx·d_attn, N excluding embeddings; training ≈ 3 × forward)",
                     "arXiv:2001.08361")
TORCHTITAN_FLOPS = source("torchtitan-flops", "torchtitan torchtitan/models/utils.py: get_nparams_and_active_nparams "
                          "(routed experts weighted top_k/num_experts; embedding tables excluded unless shared with "
                          "the output head) and quadratic_attention_flops_per_token (6·H·(Q_k + Q_v)·min(T, window); "
                          "causal sparsity and flash attention's backward recomputation not counted)",
                          "https://github.com/pytorch/torchtitan/blob/main/torchtitan/models/utils.py")
MEGATRON_FLOPS = source("megatron-num-flops", "Megatron-LM megatron/training/training.py num_floating_point_operations "
                        "(12·B·s·L·h²·(1 + (f/h)·topk·3/2 + g/a + s/h + V/(2·L·h)): 6 FLOPs per matmul parameter "
                        "per token with the routed experts only, the LM head included, attention 12·L·h·s)",
                        "https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/training/training.py")

RECOMPUTE = ("none", "selective", "full")
_LM_HEADS = ("causal_lm", "masked_lm")


def _check_transformer(arch: Architecture) -> None:
    if arch.kind == "layers" or (arch.kind == "derived" and not derived_has_tokens(arch)):
        raise ValueError(f"{arch.name}: the throughput estimate counts FLOPs per token of a transformer or a "
                         "parameter-count model; a layer-list net or an image model has no tokens")


def derived_has_tokens(arch: Architecture) -> bool:
    """A derived model whose FLOPs per token the estimate counts: a decoder-only or encoder-only text transformer
    (a Hugging Face config with a vocabulary, layers and heads)."""
    d = arch.derived
    if d is not None and d.source.preference:  # a preference step's FLOPs (both sequences, a reference) are not counted
        return False
    return bool(d is not None and d.source.kind == "hf" and d.source.sequence and not
                d.source.spec.get("is_encoder_decoder") and arch.vocab and arch.layers and arch.heads)


_EXPERTS = re.compile(r"(^|\.)experts\.")  # routed experts (shared_expert(s) do not match)
_EMBEDDING = re.compile(r"embed|(^|\.)(wte|wpe)\.")


def _parts(arch: Architecture) -> dict[str, int]:
    """total, embeddings (input lookup tables not used by a matmul), head (output projection, tied or not) and
    experts (every routed expert of every layer) of a transformer or a derived model."""
    if arch.kind == "derived":
        tensors = arch.derived.card.tensors
        size = [(x, math.prod(x.shape) * x.count) for x in tensors]
        return dict(total=arch.params,
                    embeddings=sum(n for x, n in size if not x.matmul and len(x.shape) == 2
                                   and _EMBEDDING.search(x.name)),
                    head=sum(n for x, n in size if x.matmul and not x.block_linear and len(x.shape) == 2
                             and x.shape[0] == arch.vocab),
                    experts=sum(n for x, n in size if _EXPERTS.search(x.name)))
    parts = params_breakdown(arch)
    return dict(total=parts["total"], embeddings=parts["embeddings"], head=parts["head"] + _tied_head(arch),
                experts=arch.layers * arch.num_experts * _params_per_expert(arch))


def _params_per_expert(arch: Architecture) -> int:
    """One expert's MLP: (3 gated or 2)·h·i (models/count.py: expert banks have no biases)."""
    return (3 if arch.mlp == "gated" else 2) * arch.hidden * arch.intermediate


def _inactive_expert_params(arch: Architecture) -> int:
    """Parameters of the experts a token does not use: L · (E − k) · (2 or 3)·h·i (the routed experts' (E − k)/E)."""
    if not arch.num_experts:
        return 0
    return _parts(arch)["experts"] * (arch.num_experts - arch.experts_per_token) // arch.num_experts


def _tied_head(arch: Architecture) -> int:
    """V·h when the output projection reuses the input embedding (counted once in the total, used by a matmul)."""
    return arch.vocab * arch.hidden if arch.tied_embeddings and arch.head in _LM_HEADS else 0


@formula("throughput.active_params", "N_active = Ψ − L·(E − k)·(2 or 3)·h·i", TORCHTITAN_FLOPS,
         where="get_nparams_and_active_nparams", note="Every parameter a token uses, embeddings included: what "
         "model cards call 'active parameters' (Mixtral 8x7B: 12.9B of 46.7B).")
def active_params(arch: Architecture) -> int:
    _check_transformer(arch)
    if arch.kind == "params":
        return arch.params
    return _parts(arch)["total"] - _inactive_expert_params(arch)


@formula("throughput.matmul_params",
         "N = N_active − input embedding tables (V·h [+ P·h + T·h]) + V·h when the output projection is tied",
         PALM_2022, KAPLAN_2020, TORCHTITAN_FLOPS, MEGATRON_FLOPS, where="PaLM App. B; Kaplan §2.1",
         note="The N of 6N: parameters used by a token's matrix multiplications. parameter-count models: their "
              "given count (embeddings cannot be told apart).")
def matmul_params(arch: Architecture) -> int:
    _check_transformer(arch)
    if arch.kind == "params":
        return arch.params
    parts = _parts(arch)
    return active_params(arch) - parts["embeddings"] + (_tied_head(arch) if arch.kind == "transformer" else 0)


def head_params(arch: Architecture) -> int:
    """Matmul parameters of the output head (V·h for a language-model head, tied or not): full recomputation
    re-runs the transformer layers, not the head (Narayanan et al. 2021 eq. 3 counts the logits 3×, not 4×)."""
    _check_transformer(arch)
    if arch.kind == "params":
        return 0
    return _parts(arch)["head"]


def flops_inputs(arch: Architecture) -> dict:
    """The keyword arguments every FLOP function takes, from an Architecture: n, layers, attn_width, window.
    `model_flops_per_token(**flops_inputs(arch), seq=T)`;
    `hardware_flops_per_token(**flops_inputs(arch), seq=T, recompute="full", head=head_params(arch))`."""
    _check_transformer(arch)
    if arch.kind == "params":  # no layer figures: 6N only (see the module docstring)
        return dict(n=arch.params, layers=0, attn_width=0, window=None)
    return dict(n=matmul_params(arch), layers=arch.layers, attn_width=attention_width(arch),
                window=arch.sliding_window)


def decode_read_params(arch: Architecture) -> tuple[int, int]:
    """(shared, experts): parameters a decode step reads. shared: every parameter but the input embedding tables
    (one row each per token), with a tied output head read in full by its matmul; experts: all routed experts of
    all layers (a step reads the share `inference.moe_weight_bytes_read` gives). Times bytes per parameter of the
    recipe for W."""
    _check_transformer(arch)
    if arch.kind == "params":
        return arch.params, 0
    parts = _parts(arch)
    tied = _tied_head(arch) if arch.kind == "transformer" else 0  # a derived card's tied table is a matmul tensor
    return parts["total"] - parts["embeddings"] + tied - parts["experts"], parts["experts"]


def attention_width(arch: Architecture) -> int:
    """H·Q: query heads × head dimension (the width of QKᵀ and of attention-weights·V)."""
    return arch.heads * arch.head_dim if arch.kind in ("transformer", "derived") else 0


def attended_tokens(seq, window=None) -> np.ndarray:
    """T, capped by the sliding window when the model has one."""
    seq = np.asarray(seq, dtype=np.float64)
    return np.minimum(seq, window) if window else seq


@formula("throughput.model_flops_per_token", "6·N + 12·L·H·Q·T,  T = min(seq, window)", PALM_2022,
         NARAYANAN_2021, TORCHTITAN_FLOPS, where="PaLM Appendix B; Narayanan et al. eq. 3 without recomputation "
         "(72·B·s·l·h²·(1 + s/6h + V/12lh) = B·s·(6N + 12·l·h·s) with N = 12·l·h² + V·h)",
         note="Causal masking not credited. L = 0 (unknown) leaves the attention term out.")
def model_flops_per_token(n, layers=0, attn_width=0, seq=0, window=None) -> np.ndarray:
    """Model FLOPs per trained token: what MFU counts, whatever the recipe recomputes."""
    n = np.asarray(n, dtype=np.float64)
    return 6.0 * n + 12.0 * np.asarray(layers, dtype=np.float64) * np.asarray(attn_width, dtype=np.float64) \
        * attended_tokens(seq, window)


@formula("throughput.hardware_flops_per_token",
         "none: 6·N + 12·L·H·Q·T;  selective: 6·N + 16·L·H·Q·T;  full: 8·(N − N_head) + 6·N_head + 16·L·H·Q·T",
         KORTHIKANTI_2022, NARAYANAN_2021, where="Korthikanti et al. §5 (model vs hardware FLOPs; selective "
         "recomputation re-runs the attention core QKᵀ·softmax·V, 4·L·H·Q·T per token); Narayanan et al. eq. 3 "
         "(full: 96·B·s·l·h²·(1 + s/6h + V/16lh), every layer's forward twice, the logits once)",
         note="Hardware FLOPs: what the GPU executes, model FLOPs plus recomputation. HFU counts these, MFU the "
              "model FLOPs. Flash attention's own backward recomputation is not counted (torchtitan's convention).")
def hardware_flops_per_token(n, layers=0, attn_width=0, seq=0, recompute="none", head=0, window=None) -> np.ndarray:
    n = np.asarray(n, dtype=np.float64)
    head = np.asarray(head, dtype=np.float64)
    attn = np.asarray(layers, dtype=np.float64) * np.asarray(attn_width, dtype=np.float64) \
        * attended_tokens(seq, window)
    recompute = np.asarray(recompute)
    unknown = ~np.isin(recompute, RECOMPUTE)
    if unknown.any():
        raise ValueError(f"recompute {np.unique(recompute[unknown]).tolist()}: expected one of {', '.join(RECOMPUTE)}")
    return np.select([recompute == "full", recompute == "selective"],
                     [8.0 * (n - head) + 6.0 * head + 16.0 * attn, 6.0 * n + 16.0 * attn],
                     6.0 * n + 12.0 * attn)


def recompute_ratio(n, layers=0, attn_width=0, seq=0, recompute="none", head=0, window=None) -> np.ndarray:
    """Hardware FLOPs / model FLOPs: 1 without recomputation, 4/3 with full recomputation when N_head = 0."""
    return hardware_flops_per_token(n, layers, attn_width, seq, recompute, head, window) \
        / model_flops_per_token(n, layers, attn_width, seq, window)


@formula("throughput.forward_flops_per_token", "2·N + 4·L·H·Q·T,  T = min(tokens attended, window)", KAPLAN_2020,
         PALM_2022, where="Kaplan et al. Table 1 (C_forward); PaLM App. B is 3 × this",
         note="Decoding: T = the cached context the new token attends to. Prefill of p tokens: p × this at T = p "
              "(causal masking not credited, so prefill time errs long by up to the attention share).")
def forward_flops_per_token(n, layers=0, attn_width=0, context=0, window=None) -> np.ndarray:
    n = np.asarray(n, dtype=np.float64)
    return 2.0 * n + 4.0 * np.asarray(layers, dtype=np.float64) * np.asarray(attn_width, dtype=np.float64) \
        * attended_tokens(context, window)
