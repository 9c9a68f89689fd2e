"""Fine-tuning methods: full and LoRA, as the bytes a training step keeps (issue 4, "Fine-tuning methods"); QLoRA is
planned from the model's own code with bitsandbytes' 4-bit base traced (workload/qlora.py, issue 23).
The method itself (what a scenario asks for, which linears carry adapters) is finetune_method.py; this module is the
memory it costs.

LoRA (Hu et al. 2021 §4.1) freezes the pretrained weights and trains, beside each targeted linear W (out × in), the
product B·A with A (r × in) and B (out × r): `h = W x + (α/r) · B A dropout(x)`. peft's LoraLayer does this with
two nn.Linear (no bias) and, by default, casts the adapters of a 16-bit model to fp32 (get_peft_model's
autocast_adapter_dtype=True) and the input with them.

What a frozen base changes, checked against peft runs under MemTracker (tests/data/truth/finetune/, FINDINGS.md):
  - weights: the base in its dtype plus the adapters in theirs; gradients, master copy and optimizer state for the adapters only;
  - activations: autograd saves a matmul's input only for the weight's gradient, so a frozen linear saves nothing
    of its own (the input stays only where another op saves it); a frozen RMSNorm keeps its fp32 input and rsqrt
    but not the normalised tensor (that was for the weight's gradient); nothing before the first adapter is saved
    (the embedding and the first layer's input norm see no tensor that requires grad); each adapter saves its
    input (the dropout output, or the fp32 copy peft casts, or the shared input itself) and A's output;
  - no embedding backward (frozen embedding), no weight gradients in the last layer's backward.

Entry points with the shapes the training plan (components/train_plan.py) consumes:
  finetune_states(arch, ft, precs, o_names, i_names) -> (W, M, G, S, T) as train_plan._states;
  train_activations(arch, p, attention, checkpointing, ft, device) -> activations.TrainActivations.
"""
from __future__ import annotations

import numpy as np

from ..catalog.optimizers import BNB_OPTIM, DETTMERS_2021, SHAZEER_2018, TORCH_OPTIM, Optimizer, get_optimizer
from ..catalog.precisions import Precision
from ..citations import formula, source
from ..models.arch import Architecture
from . import activations as act
from . import optimizer as optim
from .finetune_method import FULL, Finetune, adapter_shapes, block_linears, targets_of
from .plan import consts
from .terms import ZERO, Term
from .weights import param_summary
from . import weights as wts

HU_2021 = source("hu2021", "Hu et al. 2021, LoRA: Low-Rank Adaptation of Large Language Models", "arXiv:2106.09685")
PEFT = source("peft-0.21", "Hugging Face peft 0.21 (tuners/lora/layer.py LoraLayer.update_layer and Linear.forward; "
              "tuners_utils.py cast_adapter_dtype; utils/other.py prepare_model_for_kbit_training)",
              "https://github.com/huggingface/peft/tree/main/src/peft")

FP32 = 4


@formula("lora_adapter_params", "L · Σ_targets r · (in + out)  (A: r × in, B: out × r, no bias)", HU_2021, PEFT,
         where="§4.1 (ΔW = BA, B ∈ R^{d×r}, A ∈ R^{r×k}); LoraLayer.update_layer: nn.Linear(in, r, bias=False), "
         "nn.Linear(r, out, bias=False)")
def adapter_params(arch: Architecture, ft: Finetune) -> int:
    if not ft.adapters:
        return 0
    return arch.layers * sum(ft.rank * (t.in_f + t.out_f) for t in targets_of(arch, ft))


def trained(arch: Architecture, ft: Finetune) -> tuple[str, int]:
    """(the modules the adapters are on, in words; the trainable parameters) of a LoRA/QLoRA fine-tune: the hand
    model's targets and adapter_params, or, for a model planned from its own code with peft's adapters on it, what
    peft made trainable (its card)."""
    if arch.kind == "derived":
        n = sum(t.count * _numel(t.shape) for t in arch.derived.card.tensors if t.trainable)
        where = ", ".join(ft.targets) if ft.targets else "peft's default targets for the model type"
        if ft.modules_to_save:
            where += f"; trained whole beside them: {', '.join(ft.modules_to_save)}"
        return where, n
    return ", ".join(t.name for t in targets_of(arch, ft)), adapter_params(arch, ft)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def adapter_dtype_bytes(ft: Finetune, p: Precision) -> tuple[int, int, int, int]:
    """(weight, grad, master, state) bytes per adapter parameter: fp32 adapters keep fp32 grads and fp32 state
    (torch.optim follows the parameter's dtype); adapters in the model's dtype follow the precision recipe."""
    if ft.adapter_dtype == "fp32":
        return FP32, FP32, 0, FP32
    return p.weight_bytes, p.grad_bytes, p.master_bytes, p.state_bytes


# ---------------------------------------------------------------- model states

@formula("finetune.weights_bytes", "Ψ_base · bytes(weight) + Ψ_A · a", HU_2021, PEFT,
         where="LoRA §4.1 (W0 frozen)", note="a = bytes of an adapter parameter (fp32 by default). QLoRA's 4-bit "
         "base is traced through bitsandbytes' storage instead (workload/qlora.py): these formulas, checked "
         "against it, came out 8.7 % low on Llama 3.2 1B (prepare_model_for_kbit_training's fp32 embeddings "
         "carry an fp32 residual stream)")
def weights_bytes(arch: Architecture, p: Precision, ft: Finetune = FULL) -> int:
    if not ft.adapters:
        return wts.weights_bytes(arch, p)
    if ft.method != "lora":
        raise ValueError(f"finetune method {ft.method} is planned from the model's own code (hand_modelled)")
    s = param_summary(arch)
    return s.total * p.weight_bytes + adapter_params(arch, ft) * adapter_dtype_bytes(ft, p)[0]


@formula("finetune.master_weights_bytes", "Ψ_A · 4 when the adapters are in a 16-bit model dtype under bf16-master",
         HU_2021, where="only trained parameters need a master copy")
def master_weights_bytes(arch: Architecture, p: Precision, ft: Finetune = FULL) -> int:
    if not ft.adapters:
        return wts.master_weights_bytes(arch, p)
    return adapter_params(arch, ft) * adapter_dtype_bytes(ft, p)[2]


@formula("finetune.gradients_bytes", "Ψ_A · g_A  (no gradient for a frozen weight)", HU_2021, PEFT,
         where="§4.1: 'W0 is frozen and does not receive gradient updates'")
def gradients_bytes(arch: Architecture, p: Precision, ft: Finetune = FULL) -> int:
    if not ft.adapters:
        return wts.gradients_bytes(arch, p)
    return adapter_params(arch, ft) * adapter_dtype_bytes(ft, p)[1]


@formula("finetune.optimizer_state_bytes",
         "over the adapter tensors: k · Ψ_A · s;  adafactor Σ (rows + cols) · s;  8-bit per tensor as for the model;"
         "  fused: + 4 per adapter tensor", TORCH_OPTIM, SHAZEER_2018, DETTMERS_2021, BNB_OPTIM, HU_2021,
         where="the optimizer is given the trainable parameters only (peft: model.parameters() with requires_grad)")
def optimizer_state_bytes(arch: Architecture, p: Precision, opt: Optimizer, impl: str, ft: Finetune = FULL) -> int:
    if not ft.adapters:
        return optim.optimizer_state_bytes(arch, p, opt, impl)
    s_bytes = adapter_dtype_bytes(ft, p)[3]
    shapes = adapter_shapes(arch, ft)
    n_tensors = sum(c for _, c in shapes)
    if opt.layout == "8bit":
        state, any_8bit = 0, False
        for n, count in shapes:
            if n >= optim.BNB_MIN_8BIT_SIZE:
                any_8bit = True
                state += count * (2 * n + 2 * (-(-n // optim.BNB_BLOCK)) * 4)
            else:
                state += count * 2 * 4 * n
        state += optim.BNB_QMAP_BYTES if any_8bit else 0
    elif opt.layout == "factored":  # A (r, in) and B (out, r): a row and a column vector each
        state = arch.layers * sum((ft.rank + t.in_f) + (t.out_f + ft.rank) for t in targets_of(arch, ft))
        state *= s_bytes
    else:
        state = len(opt.state) * adapter_params(arch, ft) * s_bytes
    if impl == "fused" and opt.fused_available and opt.device_step_when_fused:
        state += optim.STEP_BYTES * n_tensors
    return state


@formula("finetune.optimizer_step_temporary_bytes",
         "foreach: t_f · Ψ_A · s;  forloop: t_l · largest adapter tensor · s;  fused: 0", TORCH_OPTIM,
         where="as optimizer_step_temporary_bytes, over the adapter tensors")
def optimizer_step_temporary_bytes(arch: Architecture, p: Precision, opt: Optimizer, impl: str,
                                   ft: Finetune = FULL) -> int:
    if not ft.adapters:
        return optim.optimizer_step_temporary_bytes(arch, p, opt, impl)
    if opt.layout == "8bit":
        return 0
    if opt.name == "lion":
        impl = "forloop"
    if impl == "fused" and not opt.fused_available:
        impl = "foreach"
    if impl in ("fused", "none"):
        return 0
    s_bytes = adapter_dtype_bytes(ft, p)[3]
    if impl == "foreach":
        return opt.foreach_temps * adapter_params(arch, ft) * s_bytes
    return opt.forloop_temps * max(n for n, _ in adapter_shapes(arch, ft)) * s_bytes


def finetune_states(arch: Architecture, ft: Finetune, precs: tuple[Precision, ...], o_names: tuple,
                    i_names: tuple) -> tuple[np.ndarray, ...]:
    """W, M, G per precision as (nP, NCOEF); optimizer state and step temporaries per (precision, optimizer, impl)
    as (nP, nO, nI, NCOEF) coefficient arrays (components/plan.py): the arrays components/train_plan.py `_states` returns, for this fine-tuning method."""
    opts = [get_optimizer(o) for o in o_names]
    nP, nO, nI = len(precs), len(opts), len(i_names)
    W = consts([weights_bytes(arch, p, ft) for p in precs], (nP,))
    M = consts([master_weights_bytes(arch, p, ft) for p in precs], (nP,))
    G = consts([gradients_bytes(arch, p, ft) for p in precs], (nP,))
    S = consts([optimizer_state_bytes(arch, p, o, i, ft) for p in precs for o in opts for i in i_names],
                (nP, nO, nI))
    T = consts([optimizer_step_temporary_bytes(arch, p, o, i, ft) for p in precs for o in opts for i in i_names],
                (nP, nO, nI))
    return W, M, G, S, T


# ---------------------------------------------------------------- activations of a frozen base

@formula("frozen_norm_saved_bytes", "RMSNorm: 4·h + 4 (fp32 input, rsqrt);  LayerNorm: r·h + 8 (as trained)",
         act.TORCH_AUTOGRAD, act.HF_MODELING,
         where="LlamaRMSNorm: weight · normalised saves the normalised tensor only for the weight's gradient; "
         "native_layer_norm saves input, mean and rstd for the input's gradient")
def frozen_norm_saved(arch: Architecture, p: Precision) -> Term:
    if arch.norm == "rmsnorm":
        return Term(tok=act.STAT * arch.hidden + act.STAT)
    return act.norm_saved(arch, p)


def _eager_out(arch: Architecture, attention: str, device: str) -> bool:
    """True when the o_proj input is a copy of its own (eager P·V, made contiguous), not SDPA's saved output."""
    from . import cpu_kernels

    return attention != "flash" or cpu_kernels.sdpa_falls_back_to_math(arch, attention, device)


@formula("frozen_attention_saved_bytes",
         "attention_saved − e·h (q/k/v input: frozen linears save no input) − [eager] e·hq (o_proj input)",
         act.TORCH_AUTOGRAD, act.KORTHIKANTI_2022, where="mm saves mat1 only for mat2's gradient (derivatives.yaml)")
def frozen_attention_saved(arch: Architecture, p: Precision, attention: str, drop_scores: bool = False,
                           device: str = "cuda") -> Term:
    full = act.attention_saved(arch, p, attention, drop_scores, device)
    minus = act.linear_inputs_saved(arch, p, 1 if arch.family == "gpt2" else 3)
    if _eager_out(arch, attention, device):
        minus += p.act_bytes * arch.heads * arch.head_dim
    return full + Term(tok=-minus)


@formula("frozen_mlp_saved_bytes", "mlp_saved − linear inputs − e·I (the output projection's input)",
         act.TORCH_AUTOGRAD, act.KORTHIKANTI_2022, where="frozen up/gate/down save no input; SiLU and the product "
         "still save theirs (gate, SiLU output, up) for the input's gradient",
         note="MoE (experts frozen and not adapted): as trained less the router input, an upper bound")
def frozen_mlp_saved(arch: Architecture, p: Precision, device: str = "cuda") -> Term:
    full = act.mlp_saved(arch, p, device)
    minus = act.linear_inputs_saved(arch, p, 1 if (arch.num_experts or arch.mlp != "gated") else 2)
    if not arch.num_experts:
        minus += p.act_bytes * arch.intermediate
    return full + Term(tok=-minus)


def _source_bytes(arch: Architecture, p: Precision, source_name: str, attention: str, device: str
                  ) -> tuple[int, int, bool]:
    """(bytes per element, elements per token, already saved by another op) of the tensor a target reads."""
    h, i, hq = arch.hidden, arch.intermediate, arch.heads * arch.head_dim
    if source_name == "attn_in":
        return p.residual_bytes if arch.norm == "rmsnorm" else p.act_bytes, h, False
    if source_name == "attn_out":  # SDPA's output, saved by SDPA itself unless eager made a contiguous copy
        return p.act_bytes, hq, not _eager_out(arch, attention, device)
    if source_name == "mlp_in":
        return p.residual_bytes if arch.norm == "rmsnorm" else p.act_bytes, h, False
    return p.act_bytes, i, False  # mlp_mid: the SwiGLU product / the GeLU output


@formula("lora_adapter_saved_bytes",
         "per target: [dropout] c·in + mask·in | [cast] c·in | [shared input] x·in once per input;  + c·r (A's output)",
         HU_2021, PEFT, act.TORCH_AUTOGRAD,
         where="Linear.forward: x = _cast_input_dtype(x, lora_A.weight.dtype); result + lora_B(lora_A(dropout(x))) "
         "· scaling; A saves its input, B saves A's output",
         note="c = bytes of the adapter's compute dtype: the adapter's own, or the autocast dtype, which copies "
              "its fp32 input per call (autocast caches only leaf weights that require grad)")
def adapter_saved(arch: Architecture, p: Precision, ft: Finetune, attention: str, device: str = "cuda",
                  no_grad: tuple[str, ...] = ()) -> Term:
    """One layer's adapters; `no_grad`: sources that need no gradient (the first layer's input), whose dropout
    records no graph and so keeps no mask (its output is still saved by A, whose weight needs it)."""
    a = adapter_dtype_bytes(ft, p)[0]
    c = p.act_bytes if p.autocast else a
    tok = 0
    shared: set[str] = set()
    for t in targets_of(arch, ft):
        x_bytes, n_in, saved_elsewhere = _source_bytes(arch, p, t.source, attention, device)
        saved_elsewhere = saved_elsewhere and t.source not in no_grad  # nothing else saves a no-grad tensor
        if ft.dropout > 0:  # each target's own dropout: its output (saved by A) and the mask
            tok += c * n_in + (0 if t.source in no_grad else act.dropout_mask_bytes(device, a) * n_in)
        elif not _reads_as_is(ft, p, x_bytes, a):  # a copy per target (peft's cast or autocast's), saved by A
            tok += c * n_in
        elif t.source not in shared:  # A reads the layer's own tensor: one storage for all its readers
            shared.add(t.source)
            tok += 0 if saved_elsewhere else x_bytes * n_in
        tok += c * ft.rank  # A's output, saved by B
    return Term(tok=tok)


def _reads_as_is(ft: Finetune, p: Precision, x_bytes: int, a: int) -> bool:
    """Whether an adapter's A reads the layer's own tensor (no dropout, no cast), which it then saves."""
    return ft.dropout == 0 and not p.autocast and x_bytes == a


DEEPSPEED_LINEAR = source("deepspeed-zero3-linear", "DeepSpeed runtime/zero/linear.py LinearFunctionForZeroStage3 "
                          "(setup_context: ctx.save_for_backward(input, weight, bias)), installed as "
                          "torch.nn.functional.linear by zero.Init (partition_parameters.py, mem_efficient_linear=True "
                          "by default), which ZeRO-3's engine runs on the model",
                          "https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/runtime/zero/linear.py")


@formula("zero3_linear_inputs_bytes",
         "per layer, each linear input that no adapter saves as it is: e·h (attention and MLP inputs; n·e·h under "
         "autocast) + [eager] e·hq (o_proj input) + e·I (down_proj input); the first layer from its first adapter on",
         DEEPSPEED_LINEAR, act.TORCH_AUTOGRAD,
         where="DeepSpeed ZeRO-3's linear saves its input whether or not its weight needs a gradient, where a frozen "
               "torch linear saves none (frozen_attention_saved_bytes, frozen_mlp_saved_bytes take them out)",
         note="Measured on DeepSpeed 0.19.8 (Llama 3.2 1B, LoRA r16 on q and v, ZeRO-3 over 2 ranks): 16 layers x "
              "(1 MiB MLP input + 4 MiB down_proj input) more than ZeRO-2 keeps at the forward's end, to the byte")
def zero3_linear_inputs(arch: Architecture, p: Precision, ft: Finetune, attention: str, device: str = "cuda",
                        no_grad: tuple[str, ...] = ()) -> Term:
    a = adapter_dtype_bytes(ft, p)[0]
    # a source an adapter reads as it is (no dropout, no cast) is saved by the adapter's A already: one storage
    kept = {t.source for t in targets_of(arch, ft)
            if _reads_as_is(ft, p, _source_bytes(arch, p, t.source, attention, device)[0], a)}
    inputs = {"attn_in": 1 if arch.family == "gpt2" else 3,
              "mlp_in": 1 if (arch.num_experts or arch.mlp != "gated") else 2}
    tok = 0
    for src in ("attn_in", "attn_out", "mlp_in", "mlp_mid"):
        if src in no_grad or src in kept:
            continue
        if src in inputs:
            tok += act.linear_inputs_saved(arch, p, inputs[src])
        elif src == "attn_out" and _eager_out(arch, attention, device):
            tok += p.act_bytes * arch.heads * arch.head_dim
        elif src == "mlp_mid" and not arch.num_experts:
            tok += p.act_bytes * arch.intermediate
    return Term(tok=tok)


@formula("frozen_layer_saved_bytes", "2 · frozen norm + frozen attention + frozen MLP + adapters "
         "(+ zero3_linear_inputs_bytes under DeepSpeed ZeRO-3)", HU_2021,
         act.TORCH_AUTOGRAD, where="layers after the first; the first saves nothing before its first adapter")
def frozen_layer_saved(arch: Architecture, p: Precision, ft: Finetune, attention: str, drop_scores: bool = False,
                       device: str = "cuda", first: bool = False, zero3: bool = False) -> Term:
    norm = frozen_norm_saved(arch, p)
    parts = [("attn_in", norm), ("attn", frozen_attention_saved(arch, p, attention, drop_scores, device)),
             ("mlp_in", norm), ("mlp", frozen_mlp_saved(arch, p, device))]
    no_grad: tuple[str, ...] = ()
    if first:  # autograd records nothing until a tensor requires grad: the first adapter's output
        order = ("attn_in", "attn_out", "mlp_in", "mlp_mid")
        start = min(order.index(t.source) for t in targets_of(arch, ft))
        no_grad = order[: start + 1]
        # the input norm of a source precedes the adapter; the attention (or MLP) block follows its input
        keep = {"attn_in": ["attn", "mlp_in", "mlp"], "attn_out": ["mlp_in", "mlp"], "mlp_in": ["mlp"],
                "mlp_mid": []}[order[start]]
        parts = [(k, v) for k, v in parts if k in keep]
    total = ZERO
    for _, v in parts:
        total = total + v
    extra = zero3_linear_inputs(arch, p, ft, attention, device, no_grad) if zero3 else ZERO
    return total + adapter_saved(arch, p, ft, attention, device, no_grad) + extra


@formula("frozen_head_saved_bytes", "final norm (frozen) only: lm_head is frozen, its input is not saved",
         act.TORCH_AUTOGRAD, act.KORTHIKANTI_2022,
         where="§4.3 output-layer input 2sbh: only for the weight's gradient")
def frozen_head_saved(arch: Architecture, p: Precision) -> Term:
    return frozen_norm_saved(arch, p)


@formula("frozen_autocast_copies_bytes",
         "2 · (matmul weights − the first layer's linears before its first adapter) + 2 · Ψ_A;  full checkpointing: "
         "2 · V·h (the LM head's copy)",
         act.TORCH_CKPT, wts.TORCH_AMP, act.TORCH_AUTOGRAD,
         where="autocast caches casts of leaf tensors that require grad only (the adapters); a frozen weight's "
               "16-bit copy is made per call and kept by the matmul when its input requires grad")
def frozen_autocast_copies(arch: Architecture, p: Precision, ft: Finetune, checkpointing: str) -> int:
    if not p.autocast:
        return 0
    adapters = adapter_params(arch, ft) * p.act_bytes
    if checkpointing == "full":
        # the layers' copies, frozen and adapters' alike, are remade by the recomputation (autocast's cache of the
        # adapters' casts lives only until the forward leaves autocast: forward_autocast_cache); the LM head runs
        # outside the checkpointed layers, and its matmul keeps its copy for the backward
        head = arch.vocab * arch.hidden if arch.head == "causal_lm" else 0
        return head * p.act_bytes
    s = param_summary(arch)
    # the first layer's linears that read a tensor needing no grad: those up to and including the first adapter's
    order = ("attn_in", "attn_out", "mlp_in", "mlp_mid")
    first = min(order.index(t.source) for t in targets_of(arch, ft))
    skipped = sum(t.out_f * t.in_f for _, t in block_linears(arch) if order.index(t.source) <= first)
    return (s.matmul - skipped) * p.act_bytes + adapters


@formula("forward_autocast_cache_bytes", "full checkpointing: 2 · Ψ_A (the adapters' cached 16-bit casts)",
         wts.TORCH_AMP, act.TORCH_CKPT,
         where="autocast caches the casts of leaf weights that require grad until the forward leaves autocast; with "
               "full checkpointing no op outside the recomputed layers keeps them, so they are gone by the backward",
         note="Measured (MemTracker, its leftover taken out): Mistral 7B LoRA q/k/v/o bf16-mixed with full "
              "checkpointing was 224 MiB below with the LM head's copy left out and 26 MiB (2 · Ψ_A) above with "
              "the adapters' copies held into the backward; both terms placed so, exact.")
def forward_autocast_cache(arch: Architecture, p: Precision, ft: Finetune, checkpointing: str) -> Term:
    if not p.autocast or checkpointing != "full":
        return ZERO
    return Term(const=adapter_params(arch, ft) * p.act_bytes)


@formula("frozen_last_layer_backward_temporary_bytes", "2·r·h + e·I per token (no weight gradient)",
         act.HF_MODELING, HU_2021, where="as last_layer_backward_temporary_bytes without the frozen I·h weight grad")
def frozen_last_layer_backward_temp(arch: Architecture, p: Precision) -> Term:
    return Term(tok=2 * p.residual_bytes * arch.hidden + p.act_bytes * arch.intermediate)


@formula("frozen_forward_hidden_states_bytes", "r·h per token (the final norm output, alive through the loss)",
         act.HF_MODELING, where="LlamaForCausalLM.forward keeps `hidden_states` while loss_function runs; a trained "
         "lm_head saves it anyway (head_saved_bytes), a frozen one does not")
def forward_hidden_states(arch: Architecture, p: Precision) -> Term:
    return Term(tok=p.residual_bytes * arch.hidden)


@formula("forward_cache_kv_bytes",
         "per layer 2·hkv·c where the cached K, V are not what attention saved: autocast (c = 4, the cache keeps "
         "the fp32 K, V, SDPA saves 16-bit casts), eager GQA (c = e, repeat_kv copies are saved instead), and a "
         "first layer whose attention needs no grad (c = e)", act.HF_MODELING, act.TORCH_AUTOGRAD,
         where="a training forward still fills a DynamicCache (config.use_cache defaults to True; checkpointing "
         "turns it off); it lives in the outputs until they are dropped after the loss",
         note="Measured: llama-3.2-1b o_proj/down_proj (first-layer K, V) and qwen2.5-0.5b bf16-mixed (fp32 cache).")
def forward_cache_kv(arch: Architecture, p: Precision, ft: Finetune, attention: str, checkpointing: str,
                     device: str = "cuda") -> Term:
    if checkpointing == "full" or arch.family == "gpt2":  # GPT-2's cache holds the very K, V its matmuls save
        return ZERO
    hkv = arch.kv_heads * arch.head_dim
    if p.autocast:
        return Term(tok=arch.layers * 2 * hkv * p.residual_bytes)
    layers = 0
    if _eager_out(arch, attention, device) and arch.kv_heads != arch.heads:
        layers = arch.layers
    elif min(("attn_in", "attn_out", "mlp_in", "mlp_mid").index(t.source) for t in targets_of(arch, ft)) > 0:
        layers = 1
    return Term(tok=layers * 2 * hkv * p.act_bytes)


def train_activations(arch: Architecture, p: Precision, attention: str, checkpointing: str, ft: Finetune = FULL,
                      device: str = "cuda", zero3: bool = False) -> act.TrainActivations:
    """activations.train_activations for a frozen base with adapters (full: that function itself); zero3: under
    DeepSpeed ZeRO-3, whose linears save their inputs (zero3_linear_inputs)."""
    if not ft.adapters:
        return act.train_activations(arch, p, attention, checkpointing, device)
    L = arch.layers
    drop = checkpointing == "selective"  # selective recomputation drops the attention scores
    later = frozen_layer_saved(arch, p, ft, attention, drop_scores=drop, device=device, zero3=zero3)
    first = frozen_layer_saved(arch, p, ft, attention, drop_scores=drop, device=device, first=True, zero3=zero3)
    full_layer = frozen_layer_saved(arch, p, ft, attention, device=device, zero3=zero3)
    if checkpointing == "full":
        layers = L * act.checkpointed_layer_saved(arch, p)
    else:
        layers = (L - 1) * later + first if L else ZERO
    inputs = act.inputs_term(arch)
    copies = Term(const=frozen_autocast_copies(arch, p, ft, checkpointing))
    # no embedding term: a frozen embedding's output needs no grad, so nothing on it is saved
    saved = (inputs + copies + act.rope_saved(arch, p) + layers + frozen_head_saved(arch, p)
             + act.sliding_window_mask(arch, attention))
    bwd_start = [act.loss_backward_temp(arch, p),
                 frozen_last_layer_backward_temp(arch, p)]
    if checkpointing == "full":  # the last layer recomputed with everything it saves
        bwd_start.append(full_layer)
    elif checkpointing == "selective" and attention == "eager":  # the last layer's scores recomputed
        bwd_start.append(Term(s2=full_layer.s2))
    return act.TrainActivations(saved=saved, inputs=inputs,
                                forward_temp=act.loss_forward_temp(arch, p) + forward_hidden_states(arch, p)
                                + forward_cache_kv(arch, p, ft, attention, checkpointing, device)
                                + forward_autocast_cache(arch, p, ft, checkpointing),
                                backward_start_temp=tuple(bwd_start), backward_end_temp=(ZERO,))
