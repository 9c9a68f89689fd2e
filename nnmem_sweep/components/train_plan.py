"""The plan of a training step on one GPU (components/plan.py), from the component formulas: the peak as a moment,
the largest of a few phase totals.

The modelled step is step 2: optimizer state exists; zero_grad(set_to_none=True) freed the grads. With the optional
zero_grad axis at "zeros" (zero_grad(set_to_none=False), or DDP's gradient buckets) the grads G of the trainable
parameters stay allocated from the step before: G joins the forward and backward-start moments and backward adds
each new gradient into them in place, so the new gradient is a temporary beside G (the embedding's at the backward
end; a tied head's, held by the autograd engine until the embedding's is added to it, after the loss), and the
head's backward, its new weight gradient beside G, is a moment of its own. The optimizer moment is unchanged.
Measured: tests/data/truth/*-zerograd-*.json (FINDINGS.md).

    forward         W + M + S + saved activations + forward temporaries (logits, fp32 copy, log_softmax)
    backward start  W + M + S + saved activations + loss-backward temporaries; or + the last layer's MLP
                    backward; or + one recomputed layer (checkpointing): each a moment of its own
    backward end    W + M + S + G + inputs + gradient of the embedding output (+ the tied embedding's second
                    gradient and their sum, a moment of its own)
    MoE block 0     W + M + S + G less the embedding's and block 0's attention, norms and router + block 0's
                    saved (recomputed) activations less its experts' + their backward's temporaries (moe.py)
    optimizer       W + M + S + G + inputs + the step's temporaries

During backward the saved activations shrink layer by layer while the gradients grow by the same layers' weights,
so the live total moves roughly linearly between the two backward moments and its maximum is at one of them.
The component columns are those of the winning phase, so they add up to the peak exactly; ties go to the earlier
phase. params models follow the simple calculators' convention: one moment holding weights, master, gradients,
optimizer state and activations together (FORMULAS.md worked examples). Layer nets get a forward moment, one
backward moment per layer (what layers up to it still keep, the gradients of the layers after it) and the step.
LoRA / QLoRA take their states and activations from components/finetune.py. parallel/plan.py builds the plan of
frames with parallel layouts from the same pieces (layer_net_train).
"""
from __future__ import annotations

import math

import numpy as np

from .. import columns as C
from ..catalog.optimizers import get_optimizer
from ..catalog.precisions import Precision
from ..models.arch import Architecture
from . import activations as act
from . import finetune, moe, recompute
from .finetune_method import FULL
from .optimizer import optimizer_state_bytes, optimizer_step_temporary_bytes
from .plan import NCOEF, Plan, consts, lift, precisions, terms_array
from .terms import Term
from .weights import autocast_copies_bytes, gradients_bytes, master_weights_bytes, param_summary, weights_bytes


def _states(arch: Architecture, precs: tuple[Precision, ...], o_names: tuple, i_names: tuple):
    """Model states: W, M, G per precision; optimizer state and step temporaries per (precision, optimizer,
    impl); as (nP, NCOEF) and (nP, nO, nI, NCOEF) coefficient arrays (components/plan.py)."""
    opts = [get_optimizer(o) for o in o_names]
    nP, nO, nI = len(precs), len(opts), len(i_names)
    W = consts([weights_bytes(arch, p) for p in precs], (nP,))
    M = consts([master_weights_bytes(arch, p) for p in precs], (nP,))
    G = consts([gradients_bytes(arch, p) for p in precs], (nP,))
    S = consts([optimizer_state_bytes(arch, p, o, i) for p in precs for o in opts for i in i_names], (nP, nO, nI))
    T = consts([optimizer_step_temporary_bytes(arch, p, o, i) for p in precs for o in opts for i in i_names],
                (nP, nO, nI))
    return W, M, G, S, T


ZEROS = "zeros"  # columns.ZERO_GRAD: gradients kept between steps


def over_zero_grad(arr: np.ndarray, z_names: tuple, kept: np.ndarray) -> np.ndarray:
    """A (*sizes, NCOEF) coefficient array spread over the zero_grad axis, (*sizes, nZ, NCOEF): `arr` where the
    gradients are set to None, `kept` where they are kept."""
    kept = np.broadcast_to(kept, arr.shape)
    return np.stack([kept if z == ZEROS else arr for z in z_names], axis=-2)


def with_zero_grad(axes: tuple, sizes: tuple, phases: list, z_names: tuple, kept_phases: list):
    """The plan's (axes, sizes, phases) with the zero_grad axis last (none without z_names): every phase as it is
    where the gradients are set to None, as in `kept_phases` (the same moments, same order) where they are kept."""
    if not z_names:
        return axes, sizes, phases
    out = []
    for (name, comps), (_, kept) in zip(phases, kept_phases):
        zero = np.zeros((*sizes, NCOEF), dtype=np.int64)
        out.append((name, {c: over_zero_grad(comps.get(c, zero), z_names, kept.get(c, zero))
                           for c in dict.fromkeys([*comps, *kept])}))
    return (*axes, C.ZERO_GRAD), (*sizes, len(z_names)), out


def train_plan(arch: Architecture, device: str, p_names: tuple, o_names: tuple, i_names: tuple,
               a_names: tuple = (), c_names: tuple = (), z_names: tuple = ()) -> Plan:
    """z_names: the frame's zero_grad values when it has the column (then the plan's last axis), else ()."""
    precs = precisions(p_names, "train")
    ft = arch.finetune or FULL
    if ft.adapters:  # LoRA / QLoRA: frozen base, adapters trained (components/finetune.py)
        W, M, G, S, T_opt = finetune.finetune_states(arch, ft, precs, o_names, i_names)
    else:
        W, M, G, S, T_opt = _states(arch, precs, o_names, i_names)
    nP, nO, nI = len(precs), len(o_names), len(i_names)
    if arch.kind != "transformer":
        sizes = (nP, nO, nI)
        w, m, g = (lift(x, (0,), sizes) for x in (W, M, G))
        states = {C.WEIGHTS: w, C.MASTER_WEIGHTS: m, C.OPTIMIZER_STATE: S}
        if arch.kind == "params":
            A = lift(terms_array([act.params_activations(arch, p) for p in precs], (nP,)), (0,), sizes)
            phases = [("backward", dict(states, **{C.GRADIENTS: g, C.ACTIVATIONS: A}))]
        else:
            phases = layer_net_train(arch, precs, device, states, g, T_opt, sizes,
                                     kept_gradients=False if z_names else None)
        kept = phases if arch.kind == "params" or not z_names else \
            layer_net_train(arch, precs, device, states, g, T_opt, sizes, kept_gradients=True)
        return Plan(*with_zero_grad((C.PRECISION, C.OPTIMIZER, C.OPTIMIZER_IMPL), sizes, phases, z_names, kept))

    nA, nC = len(a_names), len(c_names)
    sizes = (nP, nO, nI, nA, nC)
    w, m, g = (lift(x, (0,), sizes) for x in (W, M, G))
    s_, t_opt = (lift(x, (0, 1, 2), sizes) for x in (S, T_opt))
    states = {C.WEIGHTS: w, C.MASTER_WEIGHTS: m, C.OPTIMIZER_STATE: s_}
    terms = [finetune.train_activations(arch, p, a, c, ft, device) for p in precs for a in a_names for c in c_names]

    def table(ts: list[Term]) -> np.ndarray:  # per (precision, attention, checkpointing)
        return lift(terms_array(ts, (nP, nA, nC)), (0, 3, 4), sizes)

    saved = table([t.saved for t in terms])
    inputs = table([t.inputs for t in terms])
    fwd_tmp = table([t.forward_temp for t in terms])
    n_bwd = max(len(t.backward_start_temp) for t in terms)

    def table_moments(per: list, n: int) -> list[np.ndarray]:  # moment j of every combination (Term() past its own)
        return [table([e[j] if j < len(e) else Term() for e in per]) for j in range(n)]

    # each backward moment its own phase: a max of affine terms is not affine in batch
    bwd_start = table_moments([t.backward_start_temp for t in terms], n_bwd)
    ends = [t.backward_end_temp for t in terms]
    kept_ends = [t.backward_end_temp if t.backward_end_temp_kept is None else t.backward_end_temp_kept for t in terms]
    n_end = max(len(e) for e in ends + (kept_ends if z_names else []))
    bwd_end = table_moments(ends, n_end)
    experts = []  # an MoE model's block 0 inside its experts' backward, every other gradient made (moe.py)
    if arch.num_experts and not ft.adapters:
        firsts, pending = experts_moment_terms(arch, precs, a_names, c_names, device, sizes)
        experts = [dict(states, **{C.GRADIENTS: g - pending, C.ACTIVATIONS: table([f[0] for f in firsts]),
                                   C.TEMPORARY: table([f[1] for f in firsts])})]
    recomputed = [] if ft.adapters else recomputed_blocks(arch, precs, a_names, c_names, device, sizes, states, g)
    phases = [
        ("forward", dict(states, **{C.ACTIVATIONS: saved, C.TEMPORARY: fwd_tmp})),
        *[("backward", dict(states, **{C.ACTIVATIONS: saved, C.TEMPORARY: t})) for t in bwd_start],
        *[("backward", dict(states, **{C.GRADIENTS: g, C.ACTIVATIONS: inputs, C.TEMPORARY: t})) for t in bwd_end],
        *[("backward", e) for e in experts],
        *[("backward", e) for e in recomputed],
        ("optimizer", dict(states, **{C.GRADIENTS: g, C.ACTIVATIONS: inputs, C.TEMPORARY: t_opt})),
    ]
    axes = (C.PRECISION, C.OPTIMIZER, C.OPTIMIZER_IMPL, C.ATTENTION, C.CHECKPOINTING)
    if not z_names:
        return act.windowed(Plan(axes, sizes, phases), arch)
    n_kept = max(len(t.backward_kept_temp) for t in terms)
    kept_only = table_moments([t.backward_kept_temp for t in terms], n_kept)
    kept = [dict(states, **{C.GRADIENTS: g, C.ACTIVATIONS: saved, C.TEMPORARY: fwd_tmp}),
            *[dict(states, **{C.GRADIENTS: g, C.ACTIVATIONS: saved, C.TEMPORARY: t}) for t in table_moments(
                [t.backward_start_temp if t.backward_start_temp_kept is None else t.backward_start_temp_kept
                 for t in terms], n_bwd)],
            *[dict(states, **{C.GRADIENTS: g, C.ACTIVATIONS: inputs, C.TEMPORARY: t})
              for t in table_moments(kept_ends, n_end)],
            *[dict(e, **{C.GRADIENTS: g}) for e in experts],  # kept: the new gradients added in place (not measured)
            *[dict(e, **{C.GRADIENTS: g}) for e in recomputed],
            phases[-1][1],
            *[dict(states, **{C.GRADIENTS: g, C.ACTIVATIONS: saved, C.TEMPORARY: t}) for t in kept_only]]
    # the kept-only moments, where the gradients are set to None: a copy of the first backward moment (a tie, which
    # goes to the earlier phase, so nothing changes there)
    phases += [phases[1]] * n_kept
    return act.windowed(Plan(*with_zero_grad(axes, sizes, phases, z_names, [(n, k) for (n, _), k in zip(phases, kept)])),
                        arch)




def recomputed_blocks(arch: Architecture, precs: tuple[Precision, ...], a_names: tuple, c_names: tuple,
                      device: str, sizes: tuple[int, ...], states: dict, g: np.ndarray) -> list[dict]:
    """The top block's and block 0's gated-MLP backward under full checkpointing (recompute.moments), as two moments'
    components over `sizes` (precision, ..., attention, checkpointing at axes 0, 3, 4); none where no combination
    has them. A combination without full checkpointing holds the inputs there, below its other moments."""
    if not any(recompute.applies(arch, c) for c in c_names):
        return []
    combos = [(p, a, c) for p in precs for a in a_names for c in c_names]
    per = [recompute.moments(arch, p, a, device) if recompute.applies(arch, c) else None for p, a, c in combos]
    shape = (len(precs), len(a_names), len(c_names))

    def table(j: int, k: int) -> np.ndarray:
        return lift(terms_array([m[j][k] if m else act.inputs_term(arch) if k == 0 else Term() for m in per], shape),
                    (0, 3, 4), sizes)

    def grads(j: int) -> np.ndarray:
        made = consts([m[j][2] if m else 0 for m in per], shape)
        return lift(made, (0, 3, 4), sizes)

    top = dict(states, **{C.GRADIENTS: grads(0), C.ACTIVATIONS: table(0, 0), C.TEMPORARY: table(0, 1)})
    first = dict(states, **{C.GRADIENTS: g - grads(1), C.ACTIVATIONS: table(1, 0), C.TEMPORARY: table(1, 1)})
    return [top, first]


def pending_gradients(arch: Architecture, p: Precision) -> int:
    """The gradients block 0's experts' backward has not made yet: the untied embedding's and block 0's other
    parameters' (attention, norms, router)."""
    block = sum(math.prod(t.shape) for t in param_summary(arch).tensors
                if t.name not in recompute.ROOT_TENSORS and not t.name.startswith("experts."))
    return ((0 if arch.tied_embeddings else arch.vocab * arch.hidden) + block) * p.grad_bytes


def experts_moment_terms(arch: Architecture, precs: tuple[Precision, ...], a_names: tuple, c_names: tuple,
                         device: str, sizes: tuple[int, ...]) -> tuple[list[tuple[Term, Term]], np.ndarray]:
    """Block 0's experts' backward moment, shared by one GPU's plan and the data-parallel layouts' (parallel/plan.py):
    first_block_experts per (precision, attention, checkpointing), and the gradients pending then per precision,
    lifted over `sizes` (the precision its first axis)."""
    firsts = [first_block_experts(arch, p, a, c, device) for p in precs for a in a_names for c in c_names]
    pending = lift(consts([pending_gradients(arch, p) for p in precs], (len(precs),)), (0,), sizes)
    return firsts, pending


def first_block_experts(arch: Architecture, p: Precision, attention: str, checkpointing: str,
                         device: str) -> tuple[Term, Term]:
    """(activations, temporaries) of block 0's experts' backward (moe.experts_backward): the inputs, the RoPE tables,
    the autocast copies and block 0's saved (its checkpointed input and the recomputed layer, under full
    checkpointing) less what the experts' backward has freed."""
    freed, temps = moe.experts_backward(arch, p)
    layer = act.per_layer_saved(arch, p, attention, checkpointing, device)
    if checkpointing == "full":
        layer += act.layer_saved(arch, p, attention, device=device)
    acts = (act.inputs_term(arch) + act.rope_saved(arch, p) + Term(const=autocast_copies_bytes(arch, p))
            + act.sliding_window_mask(arch, attention) + layer - freed)
    return acts, temps


def layer_net_train(arch, precs, device, states, G, T_opt, sizes, grads_share=None, kept_gradients=None):
    """Layer nets: forward end, one backward moment per layer (those not dominated by another), optimizer.
    grads_share (parallel layouts): the rank's gradient bytes per combination; each moment's gradients are then
    that share of the whole model's. kept_gradients (zero_grad axis; None without it): False for the moments with
    the gradients set to None, True for the same moments with every gradient allocated from the start, G, and at a
    layer's backward moment its own new gradients beside them (made by the layer's backward kernel, then added
    into .grad in place); both keep the moments either way can peak at."""
    nets = [act.layer_net_train(arch, p, device) for p in precs]
    nP = len(precs)

    def table(ts: list[Term]) -> np.ndarray:  # per precision
        return lift(terms_array(ts, (nP,)), (0,), sizes)

    def own(net, j: int) -> int:  # the moments run from the last layer: their gradients are suffix sums
        return net.backward[j][0] - (net.backward[j - 1][0] if j else 0)

    saved = table([t.saved for t in nets])
    inputs = table([t.inputs for t in nets])
    fwd = table([t.forward_temp for t in nets])
    phases = [("forward", dict(states, **{C.ACTIVATIONS: saved + inputs, C.TEMPORARY: fwd},
                               **({C.GRADIENTS: G} if kept_gradients else {})))]
    # a moment is dominated when another has at least its batch-independent and its per-sample bytes everywhere
    variants = [lambda net, j: net.backward[j][0]]
    if kept_gradients is not None:
        variants.append(lambda net, j: net.backward[-1][0] + own(net, j))
    keep = []
    for grads_at in variants:
        keys = [[(grads_at(net, j) + a.const + t.const, a.seq + t.seq) for j, (_, a, t) in enumerate(net.backward)]
                for net in nets]
        keep += [j for j in range(len(keys[0]))
                 if not any(all(kk[i][0] >= kk[j][0] and kk[i][1] >= kk[j][1] and kk[i] != kk[j] for kk in keys)
                            for i in range(len(keys[0])))]
    for j in sorted(set(keep)) if kept_gradients is not None else dict.fromkeys(keep):
        if kept_gradients:
            grads = G + lift(consts([own(net, j) for net in nets], (nP,)), (0,), sizes)
        else:
            grads = lift(consts([net.backward[j][0] for net in nets], (nP,)), (0,), sizes)
        if grads_share is not None:  # ⌈moment's bytes · rank's gradient bytes / whole model's⌉, per combination
            full = lift(consts([gradients_bytes(arch, p) for p in precs], (nP,)), (0,), sizes)
            num = grads.astype(object) * grads_share.astype(object)  # Python ints: the product can pass 2^63
            grads = (-((-num) // np.maximum(full, 1).astype(object))).astype(np.int64)
        a = table([net.backward[j][1] for net in nets])
        t = table([net.backward[j][2] for net in nets])
        phases.append(("backward", dict(states, **{C.GRADIENTS: grads, C.ACTIVATIONS: a, C.TEMPORARY: t})))
    phases.append(("optimizer", dict(states, **{C.GRADIENTS: G, C.ACTIVATIONS: inputs, C.TEMPORARY: T_opt})))
    return phases
