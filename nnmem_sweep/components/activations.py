"""Activations: what the forward pass saves for backward, per layer and outside the layers, in bytes per token.

Derived from what the Hugging Face modules and PyTorch autograd keep (each term below names the tensors), starting
from Korthikanti et al. 2022 §4: a GPT-style layer with 16-bit activations, 1-byte dropout masks and eager
attention saves sbh(34 + 5as/h) bytes. The same bookkeeping is applied to Llama-style layers (SwiGLU: three
projections, RMSNorm with its fp32 upcast, GQA: K/V of width kv_heads·head_dim, no dropout), MoE (router and top-k
routed tokens) and flash attention (output + fp32 log-sum-exp instead of the s×s matrix).

Symbols: h hidden, a heads, d head_dim, hq = a·d, hkv = kv_heads·d, I intermediate, V vocab, e bytes of matmul
outputs (precision.act_bytes), r bytes of the residual stream (precision.residual_bytes), m = 1 (bool dropout mask).
All functions return `Term`s in bytes per token (tok), per token per context token (s2), per sample (seq).

Each term is one named function so a measurement can correct it in one place; no fitted fudge factors.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..catalog.precisions import Precision
from ..citations import formula, source
from ..errors import UsageError
from ..models.arch import Architecture
from . import cpu_kernels
from .moe import router_saved
from .terms import INDEX, STAT, ZERO, Term
from .weights import autocast_copies_bytes

KORTHIKANTI_2022 = source("korthikanti2022", "Korthikanti et al. 2022, Reducing Activation Recomputation in "
                          "Large Transformer Models", "arXiv:2205.05198")
DAO_2022 = source("dao2022", "Dao et al. 2022, FlashAttention: Fast and Memory-Efficient Exact Attention with "
                  "IO-Awareness", "arXiv:2205.14135")
HF_MODELING = source("hf-transformers5-modeling", "Hugging Face transformers 5 modeling code (modeling_llama.py, modeling_gpt2.py, "
                     "modeling_bert.py, modeling_mixtral.py, integrations/sdpa_attention.py, loss/loss_utils.py)",
                     "https://github.com/huggingface/transformers/tree/main/src/transformers")
HF_MASKING = source("hf-transformers5-masking", "Hugging Face transformers 5 masking_utils.py (sdpa_mask, "
                    "_ignore_causal_mask_sdpa)",
                    "https://github.com/huggingface/transformers/blob/main/src/transformers/masking_utils.py")
TORCH_CKPT = source("torch-checkpoint", "PyTorch torch.utils.checkpoint (activation checkpointing keeps the "
                    "block inputs and recomputes the block during backward)",
                    "https://pytorch.org/docs/stable/checkpoint.html")
TORCH_AUTOGRAD = source("torch-autograd-saved", "PyTorch autograd derivatives.yaml: the tensors each op saves for "
                        "backward", "https://github.com/pytorch/pytorch/blob/main/tools/autograd/derivatives.yaml")

MASK = 1  # CUDA dropout (native_dropout) saves a bool mask: 1 byte per element
DEVICES = ("cuda", "cpu")


@formula("dropout_mask_bytes", "cuda: 1 (bool mask);  cpu: bytes of the input dtype (the scaled Bernoulli noise)",
         source("torch-dropout", "PyTorch aten/src/ATen/native/Dropout.cpp: the fused native_dropout (CUDA) returns "
                "a bool mask; elsewhere dropout multiplies by a noise tensor of the input's dtype",
                "https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/native/Dropout.cpp"),
         where="dropout / _dropout_impl", note="The estimator models CUDA; device='cpu' reproduces the CPU "
         "measurements of the ground-truth cases (MEASURING.md).")
def dropout_mask_bytes(device: str, dtype_bytes: int) -> int:
    return MASK if device == "cuda" else dtype_bytes

# Families whose attention upcasts softmax to fp32: softmax(..., dtype=torch.float32).to(query.dtype)
_FP32_SOFTMAX = ("llama", "mistral", "qwen2", "mixtral")
# Activation functions: extra tensors of width I saved besides the input (torch saves only the input of its
# own GELU/SiLU/ReLU; transformers' NewGELUActivation (gelu_new) is written in Python ops and saves tanh(.),
# 1 + tanh(.) and 0.5·x as well)
_ACT_EXTRA_SAVED = {"gelu_new": 3}


@dataclass(frozen=True)
class TrainActivations:
    saved: Term  # live at the end of forward, kept for backward (includes inputs and autocast weight copies)
    inputs: Term  # the batch (token ids, labels): live through the whole step
    forward_temp: Term  # extra at the top of forward: logits, their fp32 copy, log_softmax output
    backward_start_temp: tuple[Term, ...]  # extra at the start of backward (the max of these)
    backward_end_temp: tuple[Term, ...]  # extra at the end of backward, one Term per moment (each its own phase)
    # the same moments when the gradients were kept from the step before (zero_grad "zeros"); None: as above
    backward_start_temp_kept: tuple[Term, ...] | None = None
    backward_end_temp_kept: tuple[Term, ...] | None = None
    # backward moments of their own only when the gradients are kept (beside saved activations), e.g. the LM head's
    # new weight gradient next to all of G before it is added in place
    backward_kept_temp: tuple[Term, ...] = ()


# ---------------------------------------------------------------- per-layer terms (bytes per token)

@formula("norm_saved_bytes", "LayerNorm: r·h + 8;  RMSNorm: (4 + r)·h + 4", KORTHIKANTI_2022, HF_MODELING,
         where="§4.1 (LayerNorm keeps its input, 2sbh); LlamaRMSNorm keeps the fp32 upcast input, the rsqrt and "
         "the normalised tensor cast back to the input dtype")
def norm_saved(arch: Architecture, p: Precision) -> Term:
    h, r = arch.hidden, p.residual_bytes
    if arch.norm == "rmsnorm":
        return Term(tok=(4 + r) * h + STAT)
    return Term(tok=r * h + 2 * STAT)


@formula("linear_inputs_saved_bytes", "e·h, or n·e·h under autocast (n linears read the same fp32 tensor)",
         KORTHIKANTI_2022, HF_MODELING, where="§4.1 (the QKV and first MLP input, 2sbh each); under autocast each "
         "linear casts its fp32 input itself and saves its own 16-bit copy (only leaf weights are cached)")
def linear_inputs_saved(arch: Architecture, p: Precision, consumers: int) -> int:
    return p.act_bytes * arch.hidden * (consumers if p.autocast else 1)


@formula("attention_saved_bytes",
         "e·h (qkv input) + e·(hq + 2·hkv) (Q, K, V) + m·h (residual dropout); "
         "flash: + e·hq + 4a (output, log-sum-exp); eager: + e·hq (o_proj input) + a·s·(sm + [m + sm] + [e])",
         KORTHIKANTI_2022, DAO_2022, HF_MODELING,
         where="§4.1 attention block 11sbh + 5as²b; FlashAttention saves O and the softmax statistics")
def attention_saved(arch: Architecture, p: Precision, attention: str, drop_scores: bool = False,
                    device: str = "cuda") -> Term:
    h, a, e = arch.hidden, arch.heads, p.act_bytes
    hq, hkv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    tok = linear_inputs_saved(arch, p, 1 if arch.family == "gpt2" else 3)  # q/k/v (GPT-2: one c_attn)
    s2 = 0
    if cpu_kernels.sdpa_falls_back_to_math(arch, attention, device):  # CPU SDPA with dropout: the math path
        kernel = cpu_kernels.math_sdpa_saved(arch, p, drop_scores)
        tok, s2 = tok + kernel.tok, kernel.s2
    elif attention == "flash":
        tok += e * (hq + 2 * hkv)  # Q, K (after RoPE), V saved by SDPA; native GQA, no repeat_kv copies
        # SDPA output (already in (b, s, heads, d) memory order, so the transpose/reshape that feeds o_proj is a
        # view of it: one tensor saved twice) and its fp32 log-sum-exp (a per token)
        tok += e * hq + STAT * a
    else:
        kv_width = hq if hkv != hq else hkv  # repeat_kv materialises K and V at the query width for GQA
        tok += e * (hq + 2 * kv_width)
        sm = 4 if (arch.family in _FP32_SOFTMAX or p.autocast) else e  # softmax output dtype
        per = sm  # softmax output, saved by softmax backward
        if arch.attn_dropout > 0:
            per += dropout_mask_bytes(device, sm) + sm  # dropout mask and the dropped probabilities (P·V input)
        if sm != e:
            per += e  # the probabilities cast back to the value dtype for P·V
        s2 = 0 if drop_scores else a * per
        tok += e * hq  # P·V output (b, heads, s, d) transposed and made contiguous: the o_proj input
    if arch.hidden_dropout > 0:
        tok += dropout_mask_bytes(device, e) * h
    return Term(tok=tok, s2=s2)


@formula("mlp_saved_bytes",
         "gelu: e·h + e·I·(2 + extra) + m·h;  gated (SwiGLU): e·h + 4·e·I;  MoE: e·h + router + k·(2·e·h + 4·e·I)",
         KORTHIKANTI_2022, HF_MODELING, where="§4.1 MLP block 19sbh; LlamaMLP down(act(gate(x)) * up(x)); "
                                              "MixtralSparseMoeBlock")
def mlp_saved(arch: Architecture, p: Precision, device: str = "cuda") -> Term:
    h, i, e = arch.hidden, arch.intermediate, p.act_bytes
    # input of the first projection(s): gate and up, the router for MoE (experts gather their own inputs), c_fc
    tok = linear_inputs_saved(arch, p, 1 if (arch.num_experts or arch.mlp != "gated") else 2)
    if arch.mlp == "gated":
        expert = 4 * e * i  # gate out (saved by SiLU), SiLU out and up out (saved by *), product (down input)
    else:
        expert = e * i * (2 + _ACT_EXTRA_SAVED.get(arch.activation, 0))  # up out (act input), act out (down input)
    if arch.num_experts:  # each routed token: its gathered input, the expert MLP, the expert output (grouped_mm's,
        # saved by the multiplication with its routing weight); beside the router's (moe.router_saved)
        tok += arch.experts_per_token * (expert + 2 * e * h)
    else:
        tok += expert
    if arch.hidden_dropout > 0:
        tok += dropout_mask_bytes(device, e) * h
    return Term(tok=tok) + (router_saved(arch) if arch.num_experts else ZERO)


def layer_saved(arch: Architecture, p: Precision, attention: str, drop_scores: bool = False,
                device: str = "cuda") -> Term:
    """One transformer layer without checkpointing (or with the attention scores dropped: selective)."""
    return (2 * norm_saved(arch, p) + attention_saved(arch, p, attention, drop_scores, device)
            + mlp_saved(arch, p, device))


def per_layer_saved(arch: Architecture, p: Precision, attention: str, checkpointing: str,
                    device: str = "cuda") -> Term:
    """One layer's saved activations under `checkpointing`: what train_activations counts L times."""
    return checkpointed_layer_saved(arch, p) if checkpointing == "full" else \
        layer_saved(arch, p, attention, drop_scores=checkpointing == "selective", device=device)


@formula("rope_saved_bytes", "2 · s · d · r  (cos and sin for every position, shared by the batch and all layers)",
         HF_MODELING, where="LlamaRotaryEmbedding returns cos, sin cast to the hidden dtype; apply_rotary_pos_emb "
         "multiplies q and k by them, so autograd keeps them")
def rope_saved(arch: Architecture, p: Precision) -> Term:
    return Term(pos=2 * arch.head_dim * p.residual_bytes) if arch.position == "rope" else Term()


@formula("checkpointed_layer_saved_bytes", "r·h per layer (the block input)", KORTHIKANTI_2022, TORCH_CKPT,
         where="§4.2 full recomputation stores only the layer input, 2sbh")
def checkpointed_layer_saved(arch: Architecture, p: Precision) -> Term:
    return Term(tok=p.residual_bytes * arch.hidden)


# ---------------------------------------------------------------- outside the layers

@formula("embedding_saved_bytes", "GPT-2: m·h (embedding dropout); BERT: r·h + 8 + m·h (LayerNorm, dropout)",
         KORTHIKANTI_2022, HF_MODELING, where="§4.3 embedding dropout sbh")
def embedding_saved(arch: Architecture, p: Precision, device: str = "cuda") -> Term:
    tok = 0
    if arch.family == "bert":
        tok += norm_saved(arch, p).tok
    if arch.hidden_dropout > 0:
        tok += dropout_mask_bytes(device, p.residual_bytes) * arch.hidden
    return Term(tok=tok)


@formula("head_saved_bytes", "causal LM: final norm + e·h (lm_head input); masked LM: transform (3 inputs) + e·h",
         KORTHIKANTI_2022, HF_MODELING, where="§4.3 final LayerNorm 2sbh and output-layer input 2sbh")
def head_saved(arch: Architecture, p: Precision, device: str = "cuda") -> Term:
    h, e = arch.hidden, p.act_bytes
    t = ZERO if arch.family == "bert" else norm_saved(arch, p)  # post-norm BERT has no final norm
    if arch.head == "causal_lm":
        return t + Term(tok=e * h)
    if arch.head == "masked_lm":  # dense input, GELU input, LayerNorm, decoder input
        return t + Term(tok=2 * e * h + e * h) + norm_saved(arch, p)
    if arch.head == "seq_cls":
        if arch.family == "bert":  # pooler on the first token: dense input, tanh output, dropout mask, classifier
            return t + Term(seq=3 * e * h + dropout_mask_bytes(device, e) * h)
        return t + Term(tok=e * h)  # score() on every position, the last one picked
    return t


def _loss_dtypes(arch: Architecture, p: Precision) -> tuple[int, int, int]:
    """(logits bytes, fp32 upcast copy bytes, log_softmax output bytes) per vocabulary entry."""
    e = p.act_bytes
    upcast = arch.head == "causal_lm" or p.autocast  # ForCausalLMLoss calls logits.float(); autocast: log_softmax fp32
    ls = 4 if upcast else e
    copy = 4 if (upcast and e < 4) else 0
    return e, copy, ls


@formula("loss_forward_temporary_bytes", "V·(e + 4·[e<4] + 4) + 16  (logits, fp32 copy, log_softmax; labels)",
         KORTHIKANTI_2022, HF_MODELING, where="§4.3 fp32 logits 4sbV; ForCausalLMLoss upcasts logits.float() and "
         "pads/shifts the labels; BertForMaskedLM uses CrossEntropyLoss on the logits as they are")
def loss_forward_temp(arch: Architecture, p: Precision) -> Term:
    if arch.head not in ("causal_lm", "masked_lm"):
        return Term(seq=(p.act_bytes + 4 + 4) * max(arch.num_labels, 1))
    e, copy, ls = _loss_dtypes(arch, p)
    labels = 2 * INDEX if arch.head == "causal_lm" else 0  # pad(labels) and the contiguous shifted copy
    return Term(tok=arch.vocab * (e + copy + ls) + labels)


@formula("loss_backward_temporary_bytes", "3 · V · ls  (saved log_softmax output, its gradient, the input gradient)",
         HF_MODELING, where="log_softmax_backward_data holds grad_output, output and grad_input at once")
def loss_backward_temp(arch: Architecture, p: Precision) -> Term:
    if arch.head not in ("causal_lm", "masked_lm"):
        return Term(seq=3 * 4 * max(arch.num_labels, 1))
    _, _, ls = _loss_dtypes(arch, p)
    return Term(tok=3 * arch.vocab * ls)


@formula("last_layer_backward_temporary_bytes",
         "2·r·h + e·I per token + I·h·g (the last MLP's down projection: gradients of the residual, of its output and "
         "of its input, and its weight gradient before it is accumulated)", HF_MODELING,
         where="the first layer backward after the head; the peak of small-vocabulary heads (sequence "
         "classification), measured on BERT-base")
def last_layer_backward_temp(arch: Architecture, p: Precision) -> Term:
    h, i = arch.hidden, arch.intermediate
    return Term(const=i * h * p.grad_bytes, tok=2 * p.residual_bytes * h + p.act_bytes * i)


@formula("inputs_bytes", "8 · 2 per token (int64 input_ids and labels)", HF_MODELING,
         where="the batch a training loop holds through forward, backward and step")
def inputs_term(arch: Architecture) -> Term:
    return Term(tok=2 * INDEX)


@formula("sliding_window_mask_bytes", "s² (a bool s × s mask shared by the batch) where s ≥ sliding_window, SDPA only",
         HF_MASKING,
         where="masking_utils._ignore_causal_mask_sdpa: no mask (is_causal) unless kv_length >= local_attention_size; "
         "from there sdpa_mask materialises a (1, 1, s, s) bool mask, handed to every layer (and kept by each "
         "checkpointed layer's inputs) until the backward ends",
         note="Measured: Mistral 7B LoRA, full checkpointing, b 1-2 x s 4096/8192 (MemTracker): the estimate was "
              "short by exactly s² bytes (+ an int64 index of s, not modelled: 32 KiB at 4096); below the window "
              "exact. On a GPU an explicit mask also moves SDPA from the flash kernel to the memory-efficient one.")
def sliding_window_mask(arch: Architecture, attention: str) -> Term:
    return Term(sq=1) if arch.sliding_window and attention == "flash" else ZERO


def windowed(plan, arch: Architecture):  # noqa: ANN001 - components.plan.Plan (plan imports nothing from here)
    """The plan with its s² terms counted from the model's sliding window on (sliding_window_mask)."""
    plan.sq_from = arch.sliding_window or None
    return plan


# ---------------------------------------------------------------- assembled

def train_activations(arch: Architecture, p: Precision, attention: str, checkpointing: str,
                      device: str = "cuda") -> TrainActivations:
    """Training terms of a transformer for one (precision, attention, checkpointing) combination."""
    L = arch.layers
    full_layer = layer_saved(arch, p, attention, device=device)
    layers = L * per_layer_saved(arch, p, attention, checkpointing, device)
    inputs = inputs_term(arch)
    copies = Term(const=autocast_copies_bytes(arch, p, checkpointing))  # the rest cached to the loss: forward_temp
    saved = (inputs + copies + embedding_saved(arch, p, device) + rope_saved(arch, p) + layers
             + head_saved(arch, p, device) + sliding_window_mask(arch, attention))
    bwd_start = [loss_backward_temp(arch, p), last_layer_backward_temp(arch, p)]
    if checkpointing == "full":  # the last layer is recomputed with everything it saves
        bwd_start.append(full_layer)
    elif checkpointing == "selective" and attention == "eager":  # the last layer's scores are recomputed
        bwd_start.append(Term(s2=full_layer.s2))
    return TrainActivations(
        saved=saved,
        inputs=inputs,
        forward_temp=loss_forward_temp(arch, p) + Term(const=autocast_copies_bytes(arch, p)) - copies,
        backward_start_temp=tuple(bwd_start),
        backward_end_temp=embedding_backward_temp(arch, p),
        # after the loss (the first), a tied head's gradient waits in the engine's buffer
        backward_start_temp_kept=(bwd_start[0], *(t + tied_head_gradient(arch, p) for t in bwd_start[1:])),
        backward_end_temp_kept=embedding_backward_temp_kept(arch, p),
        backward_kept_temp=head_weight_gradient_kept(arch, p),
    )


@formula("embedding_backward_temporary_bytes",
         "r·h per token + [tied] V·h·g;  tied, when the two gradients are summed: 2·V·h·g", HF_MODELING,
         where="embedding_dense_backward builds a dense (V, h) gradient from the gradient of the embedding output; "
         "with tied input/output embeddings AccumulateGrad then adds it to the LM head's contribution out of place",
         note="g = gradient bytes; G already counts one (V, h) gradient")
def embedding_backward_temp(arch: Architecture, p: Precision) -> tuple[Term, ...]:
    grad_out = Term(tok=p.residual_bytes * arch.hidden)
    if not (arch.tied_embeddings and arch.head in ("causal_lm", "masked_lm")):
        return (grad_out,)  # the dense gradient becomes .grad itself
    wte = arch.vocab * arch.hidden * p.grad_bytes
    return (grad_out + Term(const=wte), Term(const=2 * wte))


@formula("embedding_backward_temporary_kept_bytes",
         "the moments above + V·h·g  (gradients kept: zero_grad zeros)", HF_MODELING,
         where="torch/csrc/autograd/functions/accumulate_grad.h: a parameter whose .grad is defined gets the new "
         "gradient added in place (variable_grad += new_grad), so the embedding's new dense (V, h) gradient (tied: the "
         "sum of its two, made by the engine's input buffer as before) is a temporary beside all of G",
         note="g = gradient bytes; G counts every gradient from the start of the step; measured on GPT-2 (tied)")
def embedding_backward_temp_kept(arch: Architecture, p: Precision) -> tuple[Term, ...]:
    wte = Term(const=arch.vocab * arch.hidden * p.grad_bytes)
    return tuple(t + wte for t in embedding_backward_temp(arch, p))


def tied_head_gradient(arch: Architecture, p: Precision) -> Term:
    """A tied LM head's weight gradient, held by the autograd engine's input buffer from the head's backward until the
    embedding's gradient is added to it: beside every later backward moment (with the gradients kept, beside G)."""
    if not (arch.tied_embeddings and arch.head in ("causal_lm", "masked_lm")):
        return ZERO
    return Term(const=arch.vocab * arch.hidden * p.grad_bytes)


@formula("head_weight_gradient_kept_bytes", "V·h·g + (V·e + r·h) per token  (gradients kept: zero_grad zeros)",
         HF_MODELING, where="the LM head's backward right after the loss: the gradient of the logits (in the logits' "
         "dtype, after the fp32 upcast's backward), of the head's input, and the head's new (V, h) weight gradient "
         "before AccumulateGrad adds it into the kept .grad (accumulate_grad.h)",
         note="with the gradients set to None the new gradient is .grad itself, counted in the moments after it")
def head_weight_gradient_kept(arch: Architecture, p: Precision) -> tuple[Term, ...]:
    if arch.head not in ("causal_lm", "masked_lm"):
        return ()
    v, h = arch.vocab, arch.hidden
    return (Term(const=v * h * p.grad_bytes, tok=v * p.act_bytes + p.residual_bytes * h),)


# Activation functions evaluated without autograd: tensors of width I alive at once inside the MLP besides the
# first projection's output. torch's GELU/SiLU: its output; transformers' gelu_new (Python ops): 0.5·x, 1 + tanh(.)
# and the result (or pow(x, 3) and its scaled copy mid-way)
_ACT_LIVE = {"gelu_new": 3}


PREFILL_LOGITS = ("last", "all")  # serving.prefill_logits: generate()'s logits_to_keep=1, or a forward that keeps all


@formula("prefill_temporary_bytes",
         "max(attention: 3·r·h + e·(hq + 2·hkv) + e·hq [+ a·s·(e + sm + e)], MLP: 4·r·h + live·e·I, "
         "logits: 2·r·h per token + V·(e + 4) per sequence [all: also r·h + V·e per token, and V·e per token + "
         "V·4 per sequence]) "
         "+ RoPE cos/sin + ids",
         HF_MODELING, where="generate(): prefill with logits_to_keep=1; next_token_logits .to(float32); "
         "LlamaForCausalLM.forward: lm_head(hidden_states[:, slice_indices, :]), logits_to_keep=0 keeps every "
         "position",
         note="live: SwiGLU 3 (SiLU out, up out, product); GeLU 2 (up out, GeLU out); gelu_new 4")
def prefill_temp(arch: Architecture, p: Precision, attention: str, logits_kept: str = "last") -> tuple[Term, ...]:
    """Transients of one prefill at its three candidate moments: inside a layer's attention, inside its MLP (no
    autograd, so only what is alive at once), and at the logits (of the last position, or with logits_kept="all"
    of every position, of which generate() upcasts only the last to fp32). The caller takes the max."""
    h, a, e, r = arch.hidden, arch.heads, p.act_bytes, p.residual_bytes
    hq, hkv, i = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim, arch.intermediate
    k = max(arch.experts_per_token, 1)
    # the model's forward keeps `inputs_embeds` (and GPT-2 `position_embeds`) as locals through the layer loop,
    # the loop variable holds the layer input, the layer holds its norm output; token ids and position ids
    embeds = r * h if arch.layers >= 2 else 0  # with one layer the embeddings are the layer input
    resid = embeds + 2 * r * h + INDEX
    pos = Term(pos=INDEX + (r * h if arch.position == "learned" else 0))
    attn_tok = resid + e * (hq + 2 * hkv) + e * hq
    attn_s2 = 0
    if attention == "eager":
        sm = 4 if (arch.family in _FP32_SOFTMAX or p.autocast) else e
        attn_s2 = a * (e + sm + (e if sm != e else 0))  # scores, softmax, cast
        attn_tok += e * hq  # P·V output and its contiguous transpose
    live = 3 if arch.mlp == "gated" else 1 + _ACT_LIVE.get(arch.activation, 1)
    # the MLP runs beside the post-attention residual (and GPT-2's block still holds `attn_output`)
    mlp_tok = resid + r * h * (2 if arch.family == "gpt2" else 1)
    if arch.num_experts:
        # grouped-matmul experts (transformers 5 integrations/moe.py): per routed token its gathered input, the
        # fused gate_up output (2I), SiLU(gate) and the product, sort indices and permutation (int64) and its
        # routing weight; per token the fp32 router softmax and the top-k values (fp32) and indices (int64)
        mlp_tok += k * (e * h + 4 * e * i + 2 * INDEX + e) + STAT * arch.num_experts + (STAT + INDEX) * k
    else:
        mlp_tok += live * e * i
    shared = rope_saved(arch, p) + pos
    # after the layers: the final norm output beside the embeddings, and the last position's logits + fp32 copy
    # (the moment a decode step also has, for its one token)
    logits = Term(tok=embeds + r * h + INDEX, seq=arch.vocab * (e + 4)) + shared
    moments = (Term(tok=attn_tok, s2=attn_s2) + shared, Term(tok=mlp_tok) + shared, logits)
    if logits_kept == "last":
        return moments
    if logits_kept != "all":
        raise UsageError(f"unknown prefill_logits {logits_kept!r}; use {' or '.join(PREFILL_LOGITS)}")
    # every position kept: the inner model has returned (embeddings, RoPE and position ids freed); lm_head's output
    # b·s·V·e beside the final norm output, then the logits beside the last position's fp32 copy b·V·4
    all_v = arch.vocab * e
    return moments + (Term(tok=r * h + INDEX + all_v), Term(tok=INDEX + all_v, seq=arch.vocab * 4))


# ---------------------------------------------------------------- params models and layer nets

@formula("activation_bytes.params", "b · (A_sample + A_token · s) · e", where="FORMULAS.md worked examples: "
         "activation elements per sample (or per token) times the activation dtype")
def params_activations(arch: Architecture, p: Precision) -> Term:
    e = p.act_bytes
    return Term(seq=arch.activation_elements_per_sample * e, tok=arch.activation_elements_per_token * e)


# What each layer type's backward needs (torch.nn, autograd): "in" its input, "out" its output, "" nothing;
# plus per-element extras (max-pool indices, dropout masks) and views (flatten keeps its input's storage).
_LAYER_SAVES = {
    "conv2d": "in", "linear": "in", "batchnorm2d": "in", "batchnorm1d": "in", "layernorm": "in",
    "relu": "out", "tanh": "out", "sigmoid": "out", "gelu": "in", "silu": "in",
    "maxpool2d": "in", "avgpool2d": "", "adaptiveavgpool2d": "", "flatten": "", "dropout": "",
}


@dataclass(frozen=True)
class LayerNetTrain:
    saved: Term  # everything the forward keeps for backward
    inputs: Term  # the batch: images and int64 labels
    forward_temp: Term  # logits' log_softmax for the loss
    backward: tuple[tuple[int, Term, Term], ...]  # per moment: (bytes of gradients present, activations, temps)


@formula("activation_bytes.layers",
         "Σ over tensors some layer's backward needs (conv/linear/BN/GeLU inputs, ReLU/tanh/sigmoid outputs, "
         "max-pool inputs + int64 indices, dropout masks) · e; backward at layer j: tensors needed by layers ≤ j, "
         "gradients of layers ≥ j, and the gradients of layer j's output and input",
         TORCH_AUTOGRAD, where="convolution_backward, native_batch_norm_backward, threshold_backward, "
         "max_pool2d_with_indices_backward",
         note="A tensor two layers save (a ReLU output feeding a conv) counts once; flatten is a view")
def layer_net_train(arch: Architecture, p: Precision, device: str = "cuda") -> LayerNetTrain:
    e, g = p.act_bytes, p.grad_bytes
    layers = arch.layer_table
    n_in = 1
    for d in arch.input_shape:
        n_in *= d
    size = {-1: n_in}  # elements per sample of each layer's output (-1: the network input)
    storage = {-1: -1}  # which tensor a layer's output is (flatten: its input's)
    extra = [0] * len(layers)  # per-sample bytes saved beside tensors (indices, masks)
    const = [0] * len(layers)  # batch-independent saved bytes (BatchNorm statistics)
    needs: list[set[int]] = []
    for i, r in enumerate(layers):
        size[i] = r.output_elements
        storage[i] = storage[i - 1] if r.type == "flatten" else i
        what = _LAYER_SAVES.get(r.type, "in")
        need = set()
        if what == "in":
            need.add(storage[i - 1])
        elif what == "out":
            need.add(storage[i])
        if r.type == "maxpool2d":
            extra[i] = INDEX * r.output_elements
        elif r.type == "dropout":
            extra[i] = dropout_mask_bytes(device, e) * r.output_elements
        elif r.type in ("batchnorm2d", "batchnorm1d"):
            const[i] = 2 * STAT * (r.output_shape[0] if r.output_shape else 0)
        elif r.type == "layernorm":
            extra[i] = 2 * STAT * (r.output_elements // max(r.output_shape[-1], 1))
        needs.append(need - {-1})  # the network input is the batch itself (inputs)

    def saved_upto(j: int) -> Term:
        tensors = set().union(*needs[: j + 1]) if j >= 0 else set()
        return Term(const=sum(const[: j + 1]), seq=sum(size[t] for t in tensors) * e + sum(extra[: j + 1]))

    inputs = Term(seq=n_in * e + INDEX)
    classes = size[len(layers) - 1] if layers else 0
    moments = []
    for j in range(len(layers) - 1, -1, -1):
        grads = sum(r.params for r in layers[j:]) * g
        flow = size[j] + (size[j - 1] if j > 0 else 0)  # gradient of layer j's output and of its input
        moments.append((grads, saved_upto(j) + inputs, Term(seq=flow * e)))
    return LayerNetTrain(saved=saved_upto(len(layers) - 1), inputs=inputs,
                         forward_temp=Term(seq=classes * 4), backward=tuple(moments))


@formula("activation_bytes.layers.inference", "max over layers (input + output) · e per sample",
         where="without autograd only the layer being computed holds its input and output")
def layer_net_infer(arch: Architecture, p: Precision) -> Term:
    n_in = 1
    for d in arch.input_shape:
        n_in *= d
    sizes = [n_in] + [r.output_elements for r in arch.layer_table]
    return Term(seq=max(a + b for a, b in zip(sizes, sizes[1:])) * p.act_bytes if len(sizes) > 1 else n_in)
