"""Activations per GPU under tensor, sequence, context and pipeline parallelism (Korthikanti et al. 2022, §4).

Each saved term of the single-GPU estimator (components/activations.py, exact for the Hugging Face modules) is split
into the part every tensor-parallel rank keeps whole (norm inputs, the inputs of the QKV and first MLP linears, the
residual dropout masks: the paper's 10sbh) and the part split over the t ranks with the attention heads and the
MLP columns (the rest, attention scores included: 24sbh/t + 5as²b/t). With sequence parallelism the first part is
split along the sequence too (sbh·34/t + 5as²b/t). Context parallelism splits every token of a sequence over cp
ranks; attention takes the local queries against all keys.

To stay in exact integers the plan is evaluated at the rank's own sequence length s_l = s / (t_sp · cp) (t_sp = t
with sequence parallelism, else 1; the loader requires the division to be exact), and each coefficient is
rescaled for it:

    replicated per-token part   c            (bytes c · b · s / cp / t_sp = c · b · s_l)
    sharded per-token part      c · t_sp / t
    attention scores (b·s²)     c · t_sp² · cp / t
    per-position (RoPE tables)  c · t_sp
    per-sample / constant       replicated c, sharded c / t

Pipeline (Korthikanti §4.2.3; Narayanan et al. 2021): the first stage keeps ⌈L/p⌉ layers for min(p, m)
micro-batches in flight (1F1B) or L·(1 + (p−1)/(p·v)) layer-micro-batches (interleaved, v model chunks); the last
stage keeps its layers for one micro-batch plus the head, the logits and the loss. Every sharded coefficient that
t does not divide is rounded up (the most loaded rank).
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..catalog.precisions import Precision
from ..citations import formula, source
from ..components import activations as act, finetune as F
from ..components.activations import KORTHIKANTI_2022, TrainActivations
from ..components.moe import router_saved
from ..components.terms import Term
from ..components.weights import param_summary
from ..models.arch import Architecture
from .layout import Layout
from . import states as _states
from .states import _ceil

NARAYANAN_2021 = source("narayanan2021", "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on "
                        "GPU Clusters Using Megatron-LM", "arXiv:2104.04473")


@formula("parallel.layer_replicated_bytes",
         "two norm inputs + QKV input + first MLP input(s) + 2 residual dropout masks (+ MoE router, routed inputs "
         "and outputs) per token",
         KORTHIKANTI_2022, where="§4.2.1 Table 2: the 10sbh a tensor-parallel rank keeps whole (LayerNorms 4sbh, "
         "QKV and MLP inputs 4sbh, dropout masks 2sbh)")
def layer_replicated(arch: Architecture, p: Precision, device: str = "cuda") -> Term:
    """The part of one layer's saved activations that tensor parallelism (without SP) does not split."""
    h, e = arch.hidden, p.act_bytes
    tok = 2 * act.norm_saved(arch, p).tok
    tok += act.linear_inputs_saved(arch, p, 1 if arch.family == "gpt2" else 3)
    tok += act.linear_inputs_saved(arch, p, 1 if (arch.num_experts or arch.mlp != "gated") else 2)
    if arch.hidden_dropout > 0:
        tok += 2 * act.dropout_mask_bytes(device, e) * h
    if not arch.num_experts:
        return Term(tok=tok)
    # the router runs on every rank's tokens; each routed token's input and output are whole
    return Term(tok=tok + arch.experts_per_token * 2 * e * h) + router_saved(arch)


@formula("parallel.rank_term",
         "over s_l = s/(t_sp·cp): tok_r + ⌈tok_s·t_sp/t⌉, ⌈s2·t_sp²·cp/t⌉, pos·t_sp, seq_r + ⌈seq_s/t⌉, "
         "const_r + ⌈const_s/t⌉",
         KORTHIKANTI_2022, where="§4.2.1-4.2.2, Table 2: sbh(10 + 24/t + 5as/(ht)) with TP; sbh/t·(34 + 5as/h) "
         "with TP + SP")
def rank_term(term: Term, replicated: Term, lay: Layout) -> Term:
    """`term` (over the full sequence, one GPU) as one rank's Term over s_l; `replicated` is its unsplit part."""
    t, tsp, cp = lay.tp, lay.t_sp, lay.cp
    # sq (an s x s mask shared by the batch and the heads; 0 in every hand-modelled term, so not in the formula
    # above yet): each rank keeps its s/cp query rows against all s keys, whole over TP: s_l²·t_sp²·cp
    return Term(const=replicated.const + _ceil(term.const - replicated.const, t),
                pos=term.pos * tsp,
                seq=replicated.seq + _ceil(term.seq - replicated.seq, t),
                tok=replicated.tok + _ceil((term.tok - replicated.tok) * tsp, t),
                s2=_ceil(term.s2 * tsp * tsp * cp, t),
                sq=term.sq * tsp * tsp * cp)


def _whole(term: Term, lay: Layout) -> Term:
    return rank_term(term, term, lay)


@formula("parallel.pipeline_in_flight",
         "1F1B: ⌈L/p⌉ · min(p, m) layer-micro-batches on the first stage; interleaved: (L/(p·v)) · (p·v + p − 1) "
         "= L · (1 + (p−1)/(p·v)); the last stage: ⌈L/p⌉ for one micro-batch",
         KORTHIKANTI_2022, NARAYANAN_2021, where="Korthikanti §4.2.3 (the first stage stores p micro-batches of L/p "
         "layers; the interleaved schedule's penalty 1 + (p−1)/(pm)); Megatron theoretical_memory_usage.py")
def first_stage_layer_micro_batches(arch: Architecture, lay: Layout) -> tuple[int, int]:
    """(layer-micro-batches kept by the first stage, micro-batches in flight there)."""
    L, p = arch.layers, lay.pp
    if p == 1:
        return L, 1
    if lay.schedule == "interleaved":
        chunk = L // (p * lay.virtual)
        return chunk * (p * lay.virtual + p - 1), p + _ceil(p - 1, lay.virtual)
    nf = min(p, lay.micro_batches)
    return _ceil(L, p) * nf, nf


def grads_live_in_forward(lay: Layout, in_flight: int) -> bool:
    """Gradients of earlier micro-batches are live while the next ones run forward (accumulation, pipelines), or
    of the step before (DDP's gradient_as_bucket_view: the gradients are views of buckets that stay allocated;
    DeepSpeed ZeRO-3 on the GPU: its flat 16-bit gradient partition, made once, grad_partitions_flat_buffer)."""
    return lay.accum > 1 or lay.micro_batches > in_flight or (lay.ddp and lay.bucket_view) or \
        (lay.deepspeed and lay.zero == 3 and lay.offload == "none")


def stage_activations(arch: Architecture, p: Precision, attention: str, checkpointing: str, lay: Layout,
                      device: str = "cuda") -> tuple[TrainActivations, TrainActivations | None, int, int]:
    """(first stage, last stage or None without pipeline, in-flight micro-batches of each) as Terms over s_l.
    Data parallelism, ZeRO, offload and accumulation do not change them (cached without), but for a frozen base
    under DeepSpeed ZeRO-3, whose linears save their inputs (finetune.zero3_linear_inputs)."""
    return _stage_activations(arch, p, attention, checkpointing, replace(
        lay, dp=1, zero=0, offload="none", accum=1, fp32_grads=False, sync="each", bucket_view=False), device,
        lay.deepspeed and lay.zero == 3)


@lru_cache(maxsize=4096)
def _stage_activations(arch: Architecture, p: Precision, attention: str, checkpointing: str, lay: Layout,
                       device: str = "cuda", zero3_linear: bool = False
                       ) -> tuple[TrainActivations, TrainActivations | None, int, int]:
    if arch.finetune is not None and arch.finetune.adapters:  # LoRA over data-parallel ranks (DeepSpeed ZeRO)
        if lay.splits_model:
            raise ValueError("adapters are modelled over data-parallel ranks alone")
        return F.train_activations(arch, p, attention, checkpointing, arch.finetune, device, zero3_linear), None, 1, 1
    base = act.train_activations(arch, p, attention, checkpointing, device)
    if not lay.splits_model:
        return base, None, 1, 1
    rep = layer_replicated(arch, p, device)
    full = act.layer_saved(arch, p, attention, device=device)
    if checkpointing == "full":
        layer = _whole(act.checkpointed_layer_saved(arch, p), lay)
    elif checkpointing == "selective":
        layer = rank_term(act.layer_saved(arch, p, attention, drop_scores=True, device=device), rep, lay)
    else:
        layer = rank_term(full, rep, lay)
    recompute = []
    if checkpointing == "full":
        recompute.append(rank_term(full, rep, lay))
    elif checkpointing == "selective" and attention == "eager":
        recompute.append(rank_term(Term(s2=full.s2), Term(), lay))
    psi = param_summary(arch).total
    first_p, last_p = _states.stage_params(arch, lay.tp, lay.pp, lay.ep)
    copies = act.autocast_copies_bytes(arch, p)

    def copies_of(held: int) -> Term:  # autocast's 16-bit weight copies of the matrices this rank holds
        return Term(const=_ceil(copies * held, psi) if psi else 0)

    inputs = _whole(act.inputs_term(arch), lay)
    rope = _whole(act.rope_saved(arch, p), lay)
    emb = _whole(act.embedding_saved(arch, p, device), lay)
    head = _whole(act.head_saved(arch, p, device), lay)
    lm = arch.head in ("causal_lm", "masked_lm")
    labels = Term(tok=2 * act.INDEX if arch.head == "causal_lm" else 0)
    loss_fwd = rank_term(act.loss_forward_temp(arch, p), labels if lm else act.loss_forward_temp(arch, p), lay)
    loss_bwd = rank_term(act.loss_backward_temp(arch, p), Term() if lm else act.loss_backward_temp(arch, p), lay)
    resid = Term(tok=2 * p.residual_bytes * arch.hidden)
    last_layer = rank_term(act.last_layer_backward_temp(arch, p), resid, lay)
    grad_in = _whole(Term(tok=p.residual_bytes * arch.hidden), lay)  # gradient of a stage's (or the embedding's) input
    emb_end = tuple(rank_term(t, grad_in, lay) for t in act.embedding_backward_temp(arch, p))  # t ∤ V·h·g rounds up

    count, nf = first_stage_layer_micro_batches(arch, lay)
    if lay.pp == 1:
        # full checkpointing: the head's copy saved, the blocks' in autocast's cache to the loss (weights.py)
        held = copies_of(first_p.held).const
        kept = Term(const=held * act.autocast_copies_bytes(arch, p, checkpointing) // copies if copies else 0)
        saved = inputs + kept + emb + rope + count * layer + head
        one = TrainActivations(saved=saved, inputs=inputs, forward_temp=loss_fwd + copies_of(first_p.held) - kept,
                               backward_start_temp=(loss_bwd, last_layer, *recompute), backward_end_temp=emb_end)
        return one, None, 1, 1
    # the first stage sends its output forward (and receives its gradient): one b·s_l·h tensor, as grad_in
    first = TrainActivations(
        saved=nf * inputs + copies_of(first_p.held) + nf * emb + nf * rope + count * layer,
        inputs=inputs, forward_temp=grad_in,
        backward_start_temp=(last_layer + grad_in, *recompute),
        backward_end_temp=(grad_in,) if not (arch.tied_embeddings and lm) else (emb_end[0],))
    n_last = _ceil(arch.layers, lay.pp)
    last = TrainActivations(
        saved=inputs + copies_of(last_p.held) + rope + n_last * layer + head,
        inputs=inputs, forward_temp=loss_fwd,
        backward_start_temp=(loss_bwd, last_layer, *recompute), backward_end_temp=(grad_in,))
    return first, last, nf, 1
