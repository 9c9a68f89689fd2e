"""Parameter tensors and the bytes the weights, gradients and master copy take.

`tensor_table(arch)` lists every parameter tensor of a transformer the way the Hugging Face modules create them
(shape, how many, where it sits, whether it is a linear weight inside a block, i.e. quantisable). The optimizer
needs the per-tensor shapes (Adafactor's factored state, bitsandbytes' small-tensor rule, the largest tensor for the
for-loop temporaries); quantised recipes need the block linear weights' shapes for their scales.

params models and layer nets have no per-tensor shapes: their parameters are one flat count.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod

from ..catalog.precisions import DETTMERS_2022, DETTMERS_2023, FRANTAR_2022, TORCH_AMP, ZERO_2019, Precision
from ..citations import formula
from ..models.arch import Architecture
from ..units import bits_to_bytes


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    count: int  # how many tensors of this shape (layers x experts)
    block_linear: bool = False  # a matmul weight inside a transformer block (quantised by int8/int4/nf4)
    matmul: bool = False  # used by a matmul (autocast caches a 16-bit copy of it during forward)

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True)
class ParamSummary:
    """What the estimator needs from the tensor table, computed once per architecture."""

    total: int  # Ψ, every trainable parameter (tied embeddings once)
    n_tensors: int  # parameter tensors (the fused optimizers keep a device-side step per tensor)
    largest: int  # elements of the largest tensor (for-loop optimizer temporaries)
    block_linear: int  # elements of the quantisable block linear weights
    matmul: int  # elements of the weights autocast casts to 16 bit (block linears + LM head)
    tensors: tuple[Tensor, ...] = ()


def _norm(arch: Architecture, name: str, count: int) -> list[Tensor]:
    h = arch.hidden
    out = [Tensor(f"{name}.weight", (h,), count)]
    if arch.norm == "layernorm" or arch.norm_bias:
        out.append(Tensor(f"{name}.bias", (h,), count))
    return out


def _linear(name: str, out_f: int, in_f: int, count: int, bias: bool, block: bool) -> list[Tensor]:
    t = [Tensor(f"{name}.weight", (out_f, in_f), count, block_linear=block, matmul=True)]
    if bias:
        t.append(Tensor(f"{name}.bias", (out_f,), count))
    return t


def _mlp(arch: Architecture, prefix: str, count: int) -> list[Tensor]:
    h, i, bias = arch.hidden, arch.intermediate, arch.mlp_bias
    t: list[Tensor] = []
    if arch.mlp == "gated":
        t += _linear(f"{prefix}.gate_proj", i, h, count, bias, True)
    t += _linear(f"{prefix}.up_proj", i, h, count, bias, True)
    t += _linear(f"{prefix}.down_proj", h, i, count, bias, True)
    return t


def transformer_tensors(arch: Architecture) -> tuple[Tensor, ...]:
    """Every parameter tensor, from the HF module structure of gpt2 / bert / llama / mistral / qwen2 / mixtral."""
    h, L, v = arch.hidden, arch.layers, arch.vocab
    hq = arch.heads * arch.head_dim
    hkv = arch.kv_heads * arch.head_dim
    bert = arch.family == "bert"
    t: list[Tensor] = [Tensor("embed_tokens", (v, h), 1)]
    if arch.position == "learned":
        t.append(Tensor("embed_positions", (arch.max_position, h), 1))
    if arch.type_vocab:
        t.append(Tensor("token_type_embeddings", (arch.type_vocab, h), 1))
    if bert:  # BERT normalises the embedding sum
        t += _norm(arch, "embeddings.LayerNorm", 1)
    # one block
    t += _norm(arch, "attn_norm", L)
    if arch.family == "gpt2":  # GPT2Attention.c_attn: one Conv1D of weight (h, 3h) for q, k and v
        t.append(Tensor("c_attn.weight", (h, hq + 2 * hkv), L, block_linear=True, matmul=True))
        if arch.qkv_bias:
            t.append(Tensor("c_attn.bias", (hq + 2 * hkv,), L))
    else:
        t += _linear("q_proj", hq, h, L, arch.qkv_bias, True)
        t += _linear("k_proj", hkv, h, L, arch.qkv_bias, True)
        t += _linear("v_proj", hkv, h, L, arch.qkv_bias, True)
    t += _linear("o_proj", h, hq, L, arch.attn_out_bias, True)
    t += _norm(arch, "mlp_norm", L)
    if arch.num_experts:
        e, i = arch.num_experts, arch.intermediate
        t.append(Tensor("router.weight", (e, h), L, matmul=True))  # stays 16-bit when quantised
        # transformers 5 MixtralExperts: all experts in two 3-D parameters
        t.append(Tensor("experts.gate_up_proj", (e, 2 * i, h), L, block_linear=True, matmul=True))
        t.append(Tensor("experts.down_proj", (e, h, i), L, block_linear=True, matmul=True))
    else:
        t += _mlp(arch, "mlp", L)
    if not bert:  # pre-norm stacks end with a final norm
        t += _norm(arch, "final_norm", 1)
    if arch.head == "causal_lm" and not arch.tied_embeddings:
        t.append(Tensor("lm_head.weight", (v, h), 1, matmul=True))
    elif arch.head == "masked_lm":  # BertOnlyMLMHead: transform dense + LayerNorm, tied decoder + its bias
        t += _linear("cls.transform.dense", h, h, 1, True, False)
        t += _norm(arch, "cls.transform.LayerNorm", 1)
        t.append(Tensor("cls.decoder.bias", (v,), 1))
        if not arch.tied_embeddings:
            t.append(Tensor("cls.decoder.weight", (v, h), 1, matmul=True))
    elif arch.head == "seq_cls":
        if bert:  # BertPooler + classifier
            t += _linear("pooler.dense", h, h, 1, True, False)
            t += _linear("classifier", arch.num_labels, h, 1, True, False)
        else:  # LlamaForSequenceClassification.score
            t += _linear("score", arch.num_labels, h, 1, False, False)
    return tuple(t)


@lru_cache(maxsize=64)
def param_summary(arch: Architecture) -> ParamSummary:
    if arch.kind == "derived":  # the built model's own parameter tensors (derive/card.py)
        ts = tuple(Tensor(t.name, t.shape, t.count, t.block_linear, t.matmul) for t in arch.derived.card.tensors)
        return _summary(ts, tied_head=0)
    if arch.kind != "transformer":
        # params models / layer nets: one flat count; the largest tensor is unknown, so take the largest layer
        total = arch.params
        largest = arch.largest_layer_params or max((r.params for r in arch.layer_table), default=total)
        return ParamSummary(total, max(len(arch.layer_table), 1), largest, 0, 0)
    ts = transformer_tensors(arch)
    tied_head = arch.tied_embeddings and arch.head in ("causal_lm", "masked_lm")
    return _summary(ts, arch.vocab * arch.hidden if tied_head else 0)


def _summary(ts: tuple[Tensor, ...], tied_head: int) -> ParamSummary:
    """The totals of a tensor table; tied_head: elements of a tied LM head (the embedding used twice by matmuls)."""
    total = sum(x.numel * x.count for x in ts)
    matmul = sum(x.numel * x.count for x in ts if x.matmul) + tied_head
    return ParamSummary(
        total=total,
        n_tensors=sum(x.count for x in ts),
        largest=max(x.numel for x in ts),
        block_linear=sum(x.numel * x.count for x in ts if x.block_linear),
        matmul=matmul,
        tensors=ts,
    )


@formula("quantized_weight_bytes.int8", "n·1 + rows·4  (int8 values, fp32 absmax per output row)", DETTMERS_2022,
         where="§3.4 vector-wise quantization; bitsandbytes Int8Params keeps CB (int8) and SCB (fp32, one per row)")
def int8_bytes(rows: int, cols: int) -> int:
    return rows * cols + rows * 4


@formula("quantized_weight_bytes.int4",
         "⌈n·4/8⌉ + rows·⌈cols/128⌉·(2 + 4/8)  (int4 values; per group of 128: fp16 scale, packed 4-bit zero)",
         FRANTAR_2022, where="§4 (grouping); AutoGPTQ QuantLinear qweight/qzeros/scales with group_size 128")
def int4_bytes(rows: int, cols: int, group: int = 128) -> int:
    groups = rows * -(-cols // group)
    return bits_to_bytes(rows * cols, 4) + groups * 2 + bits_to_bytes(groups, 4)


@formula("quantized_weight_bytes.nf4",
         "⌈n·4/8⌉ + ⌈n/64⌉·1 + ⌈⌈n/64⌉/256⌉·4  (NF4, 8-bit absmax per 64 block, fp32 per 256 absmax blocks)",
         DETTMERS_2023, where="§3 double quantization: 8/64 + 32/(64·256) = 0.127 bits per parameter of constants")
def nf4_bytes(rows: int, cols: int, block: int = 64, block2: int = 256) -> int:
    n = rows * cols
    blocks = -(-n // block)
    return bits_to_bytes(n, 4) + blocks + (-(-blocks // block2)) * 4


_QUANT = {"int8": int8_bytes, "int4": int4_bytes, "nf4": nf4_bytes}


@formula("weights_bytes", "Ψ · bytes(weight dtype); quantised: Σ block linears q(rows, cols) + rest · 2",
         ZERO_2019, where="§3 (2Ψ for 16-bit weights)")
def weights_bytes(arch: Architecture, prec: Precision) -> int:
    s = param_summary(arch)
    if not prec.quant or arch.kind not in ("transformer", "derived"):
        return s.total * prec.weight_bytes
    q = _QUANT[prec.quant]
    quantised = sum(q(prod(x.shape[:-1]), x.shape[-1]) * x.count for x in s.tensors if x.block_linear)
    return quantised + (s.total - s.block_linear) * prec.weight_bytes


@formula("master_weights_bytes", "Ψ · 4 for bf16-master, else 0", ZERO_2019, where="§3 (fp32 master copy in KΨ)")
def master_weights_bytes(arch: Architecture, prec: Precision) -> int:
    return param_summary(arch).total * prec.master_bytes


@formula("gradients_bytes", "Ψ · bytes(grad dtype)", ZERO_2019, where="§3 (2Ψ for 16-bit gradients)",
         note="Gradients take the parameter's dtype: fp32 under autocast, 16-bit for a cast model and bf16-master.")
def gradients_bytes(arch: Architecture, prec: Precision) -> int:
    return param_summary(arch).total * prec.grad_bytes


@formula("autocast_weight_copies_bytes", "Σ matmul weights · 2 (16-bit copies cached by autocast);  full "
         "checkpointing: the LM head's alone, V·h·2", TORCH_AMP,
         where="torch.amp: autocast caches the cast of each leaf weight for the duration of the autocast region; "
         "the 16-bit copy is saved for backward by the matmul that used it. Under full checkpointing no matmul in a "
         "checkpointed block saves its copy: the cache holds them to the forward's end (the loss), then they are "
         "gone, remade by each block's recomputation; the head runs outside the blocks and keeps its own",
         note="Counted as activations: they are created during forward and freed by backward. Measured: Llama 3.2 1B "
              "full fine-tune, bf16-mixed, full checkpointing, b 8 x s 2,048: the blocks' copies counted to the "
              "backward made its peak 1,946,140,408 B (4.5 %) high")
def autocast_copies_bytes(arch: Architecture, prec: Precision, checkpointing: str = "none") -> int:
    if not prec.autocast or arch.kind != "transformer":
        return 0
    if checkpointing == "full":
        return (arch.vocab * arch.hidden if arch.head == "causal_lm" else 0) * prec.act_bytes
    return param_summary(arch).matmul * prec.act_bytes
