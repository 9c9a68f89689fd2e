"""The plans of frames with parallel layouts (issue 4), for peak.py.

A frame with parallel columns (layout.py) adds one plan axis, its unique layouts. This module builds:

    parallel_train_plan   the training plan over layouts (components/plan.Plan), from states.py's per-rank states and
                          activations.py's per-stage activations; prepare_train checks the layouts and splits seq_len
                          under sequence/context parallelism
    infer_key, infer_layouts   inference with layouts: each layout's transformer phases (components/infer_plan.py)
                          on its rank's model

peak.py hands frames with parallel columns to these; the single-GPU plans are components/train_plan.py and
components/infer_plan.py.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import columns as C
from ..catalog.optimizers import get_optimizer
from ..components import activations as act
from ..components.infer_plan import InferTables, infer_phases
from ..components.plan import Plan, cached, codes, combine, consts, lift, precisions, terms_array
from ..components.train_plan import experts_moment_terms, layer_net_train
from ..components.terms import Term
from ..errors import UsageError
from ..models.arch import Architecture
from . import activations as par_act
from . import deepspeed as par_deepspeed
from . import fsdp as par_fsdp
from . import layout as par_layout
from . import states as par_states
from . import zero_bucket
from .recomputed import recomputed_sharded, recomputed_whole
from .tables import layout_tables as _layout_tables


# ---------------------------------------------------------------- parallel layouts (issue 4)
# One more plan axis, the unique parallel layouts of the frame (parallel/layout.py). Each (pipeline stage, moment)
# is a phase of its own, so the winner is the most loaded rank's peak: without pipeline parallelism the second
# stage's phases are all zero and never win. Evaluated at the rank's sequence length s_l (parallel/activations.py).

def _rank_state_tables(arch, precs, o_names, i_names, layouts):
    """Per stage, {field: (nP, nO, nI, nL) consts} of parallel/states.RankStates (zero for the absent stage)."""
    opts = [get_optimizer(o) for o in o_names]
    nP, nO, nI, nL = len(precs), len(opts), len(i_names), len(layouts)
    fields = ("weights", "master", "gradients", "optimizer", "step_temp", "host", "kept", "gradients_in_step",
              "norm_temp", "norm_gradients", "step_released", "end_released", "offload_buffer", "reduce_temp")
    vals = {(st, f): [] for st in (0, 1) for f in fields}
    for p in precs:
        for o in opts:
            for i in i_names:
                for lay in layouts:
                    pair = par_states.rank_states(arch, p, o, i, lay)
                    kept = par_states.kept_gradients(arch, p, o, i, lay)
                    for st in (0, 1):
                        for f in fields:
                            v = kept[st] if f == "kept" else getattr(pair[st], f)
                            vals[st, f].append(v if (st == 0 or lay.pp > 1) else 0)
    return [{f: consts(vals[st, f], (nP, nO, nI, nL)) for f in fields} for st in (0, 1)]


def _grads_flag(layouts, stage: int, in_flight: list[int]) -> np.ndarray:
    return np.array([1 if par_act.grads_live_in_forward(lay, nf) else 0 for lay, nf in zip(layouts, in_flight)],
                    dtype=np.int64)


def _host_table(st, sizes, dims) -> np.ndarray:
    host = np.maximum(st[0]["host"], st[1]["host"])  # the most loaded rank's
    return np.ascontiguousarray(lift(host, dims, sizes)[..., 0]).reshape(-1)


def _with_buffers(arch, phases: list, precs, layouts, sizes: tuple, dims: tuple) -> list:
    """The communication buffers added to the temporaries: DeepSpeed's reduce buckets (states.deepspeed_buffers)
    through the backward from its second moment (the first is the loss's, before any parameter has a gradient), and
    ZeRO-3's in the step too; PyTorch DDP's allreduce buckets (states.ddp_bucket_bytes) in every phase, made when
    the model is wrapped. `dims`: the plan dimensions of precision and layout."""
    tables = _layout_tables(lambda p, lay: (*par_states.deepspeed_buffers(lay, p),
                                            par_states.ddp_bucket_bytes(arch, lay, p),
                                            par_states.deepspeed_kept_bucket(lay, p)), precs, layouts, sizes, dims)
    if tables is None:
        return phases
    bwd, step, always, kept = tables
    out, previous = [], ""
    for name, comps in phases:  # a stage's phases: forward, the backward's moments (the loss's first), optimizer
        after_loss = name == "backward" and previous in ("backward", "")
        extra = always + (bwd if after_loss else 0) + (step if name == "optimizer" else 0) + \
            (kept if name in ("forward", "backward") and not after_loss else 0)
        previous = name
        out.append((name, _with_temporary(comps, extra)))
    return out


def _with_temporary(comps: dict, extra) -> dict:  # noqa: ANN001 - an array or an int
    """A phase's components with `extra` added to its temporaries."""
    return {**comps, C.TEMPORARY: comps[C.TEMPORARY] + extra if C.TEMPORARY in comps else extra}


def _plus_temporary(phases: list, extra: np.ndarray, start: int) -> list:
    """The phases from `start` on with `extra` added to their temporaries (ZeRO-Offload's GPU buffer, made at
    initialisation: states.deepspeed_offload); unchanged where it is zero everywhere."""
    if not extra.any():
        return phases
    return phases[:start] + [(name, _with_temporary(comps, extra)) for name, comps in phases[start:]]


def _hidden(arch, precs, sizes) -> np.ndarray:
    """One b·s·h tensor in the residual dtype, per precision."""
    return lift(terms_array([Term(tok=arch.hidden * p.residual_bytes) for p in precs], (len(precs),)), (0,), sizes)


def _first_block(arch, precs, layouts, sizes, states, g_fwd, inputs) -> list:
    """FULL_SHARD's first block's forward (fsdp.fsdp_first_block): the all-gather outputs beside the inputs and the
    hidden states entering the block; none where no layout is FSDP's FULL_SHARD."""
    tables = _layout_tables(lambda p, lay: (par_fsdp.fsdp_first_block(arch, p, lay),), precs, layouts, sizes, (0, 5))
    if tables is None:
        return []
    hidden = _hidden(arch, precs, sizes)
    return [("forward", dict(states, **{C.GRADIENTS: g_fwd, C.ACTIVATIONS: inputs + hidden, C.TEMPORARY: tables[0]}))]


def _last_forward(arch, precs, layouts, sizes, states, g_fwd, saved) -> list:
    """FSDP1's last block's forward, at its output (fsdp.fsdp1_last_forward): every saved activation and one b·s·h
    tensor (+ the block's parameters under FULL_SHARD); none where no layout is FSDP1's. For the frame's other
    layouts the moment holds the saved activations alone, below the loss's."""
    v1 = _fsdp1_rows(arch, precs, layouts, sizes)
    if v1 is None:
        return []
    (block,) = _layout_tables(lambda p, lay: (par_fsdp.fsdp1_last_forward(arch, p, lay),), precs, layouts, sizes,
                              (0, 5)) or (0,)
    temp = _hidden(arch, precs, sizes) * v1 + block
    return [("forward", dict(states, **{C.GRADIENTS: g_fwd, C.ACTIVATIONS: saved, C.TEMPORARY: temp}))]


def _fsdp1_rows(arch, precs, layouts, sizes, stage: int | None = None) -> np.ndarray | None:
    """A plan multiplier, 1 on the rows of FSDP1's layouts (fsdp.fsdp1_applies; at zero_stage `stage` where given),
    0 elsewhere; None where the frame has no such layout."""
    table = _layout_tables(lambda p, lay: (int(par_fsdp.fsdp1_applies(arch, lay) and stage in (None, lay.zero)),),
                           precs, layouts, sizes, (0, 5))
    return None if table is None else table[0][..., :1]


def _block_moments(arch, precs, a_names, c_names, layouts, sizes, device, states, g_fwd, saved, inputs,
                   bwd_start) -> list:
    """FSDP's moments in the blocks' backward, each after the top layer's: SHARD_GRAD_OP's second block
    (fsdp.fsdp_second_block), FULL_SHARD's last block (fsdp.fsdp_last_block), FSDP2's without checkpointing; FSDP1's
    flat-gradient concatenations in their place, with or without (fsdp.fsdp1_flat_gradients). None where no layout
    is FSDP's. One GPU's top-layer temporaries stand for the block's, less their constant (that layer's first weight
    gradient, here among the block's unsharded gradients); FSDP1's are its concatenation and one b·s·h gradient."""
    second = _layout_tables(lambda p, lay: par_fsdp.fsdp_second_block(arch, p, lay), precs, layouts, sizes, (0, 5))
    last = _layout_tables(lambda p, lay: par_fsdp.fsdp_last_block(arch, p, lay), precs, layouts, sizes, (0, 5))
    fsdp1 = any(par_fsdp.fsdp1_applies(arch, lay) for lay in layouts)
    if (second is None and last is None) or ("none" not in c_names and not fsdp1) or len(bwd_start) < 2:
        return []
    nA, nC = len(a_names), len(c_names)
    none = lift(consts([1 if c == "none" else 0 for c in c_names], (nC,)), (4,), sizes)[..., :1]
    layer = lift(terms_array([act.per_layer_saved(arch, p, a, c, device) for p in precs for a in a_names
                              for c in c_names], (len(precs), nA, nC)), (0, 3, 4), sizes)
    layer_temp = np.array(bwd_start[1])
    layer_temp[..., 0] = np.where(none[..., 0] > 0, 0, layer_temp[..., 0])
    hidden = _hidden(arch, precs, sizes)

    def moment(weights, temp, stage: int, grads=0, acts=None, temps=None) -> tuple:
        v1 = _fsdp1_rows(arch, precs, layouts, sizes, stage)  # FSDP1's rows, checkpointed or not
        v1 = 0 if v1 is None else v1
        flag = none + v1 - none * v1  # the rows the moment applies to
        return ("backward", dict(states, **{
            C.WEIGHTS: states[C.WEIGHTS] + weights * flag, C.GRADIENTS: g_fwd + grads * flag,
            C.ACTIVATIONS: saved if acts is None else np.where(flag > 0, acts(v1), saved),
            C.TEMPORARY: (layer_temp if temps is None else temps) * (1 - v1) + hidden * v1 + temp * flag}))

    out = []
    if second is not None:  # the top layer's saved activations and the head's freed by then
        head = lift(terms_array([act.head_saved(arch, p, device) for p in precs], (len(precs),)), (0,), sizes)
        weights, temp = second
        out.append(moment(weights, temp, 2, acts=lambda v1: saved - layer - head))
    if last is not None:  # every layer's saved activations freed but its own (FSDP1: block 0's, and the rope tables)
        weights, grads, temp = last
        rope = lift(terms_array([act.rope_saved(arch, p) for p in precs], (len(precs),)), (0,), sizes)
        block0 = _layout_tables(lambda p, lay: par_fsdp.fsdp1_block0(arch, p, lay), precs, layouts, sizes, (0, 5))
        if block0 is not None:  # FSDP1 without prefetch: block 0's own concatenation, its activations (rope too) freed
            w0, g0, t0 = block0
            out.append(moment(w0, t0, 3, g0, acts=lambda v1: inputs))
        if not arch.num_experts:  # a dense block's end: the layer's temporaries twice (an MoE block's: its experts)
            out.append(moment(weights, temp, 3, grads, acts=lambda v1: inputs + layer + rope * v1,
                              temps=2 * layer_temp))
            return out
        # an MoE block's experts (fsdp.fsdp_last_block_experts): the top block's saved but its experts' beside
        # block 0's (FSDP1's rows as above)
        pairs = [par_fsdp.fsdp_last_block_experts(arch, p) for p in precs]
        freed, experts = (lift(terms_array([pair[j] for pair in pairs], (len(precs),)), (0,), sizes) for j in (0, 1))
        out.append(moment(weights, temp, 3, grads, temps=experts,
                          acts=lambda v1: inputs + layer + rope + (layer - freed) * (1 - v1)))
    return out


def _first_bucket(arch, precs, a_names, c_names, layouts, sizes, device, states, g, g_fwd, saved
                  ) -> tuple[list, np.ndarray | None]:
    """DeepSpeed ZeRO-2's last rank (ZeRO-3: every rank) when its first bucket is reduced (zero_bucket.first_bucket):
    its gradient partition beside the activations of the layers not yet reached; and what a tied head's gradient adds
    to the backward's end moments beside the partition (None: nothing). No moment where no layout is ZeRO-2/3's."""
    tables = _layout_tables(lambda p, lay: zero_bucket.first_bucket(arch, p, lay), precs, layouts, sizes, (0, 5))
    if tables is None:
        return [], None
    made, k, alive, tied_end = tables
    layer = lift(terms_array([act.per_layer_saved(arch, p, a, c, device) for p in precs for a in a_names
                              for c in c_names], (len(precs), len(a_names), len(c_names))), (0, 3, 4), sizes)
    return [("backward", dict(states, **{C.GRADIENTS: g_fwd + g * made[..., :1],
                                         C.ACTIVATIONS: saved - layer * k[..., :1], C.TEMPORARY: alive}))], tied_end


def _first_block_experts(arch, precs, a_names, c_names, layouts, sizes, device, states, g) -> list:
    """An MoE model's block 0 inside its experts' backward (components/train_plan.first_block_experts), on the
    layouts whose rank holds every gradient and one GPU's activations (data parallel at zero_stage 0 or 1, no
    accumulation, offload or model split); none where no layout is one of those."""
    def whole(lay) -> bool:
        return not lay.splits_model and lay.zero <= 1 and lay.accum == 1 and lay.offload == "none" and \
            not lay.fp32_grads

    if not arch.num_experts or (arch.finetune is not None and arch.finetune.adapters) or \
            not any(whole(lay) for lay in layouts):
        return []
    flag = lift(consts([int(whole(lay)) for lay in layouts], (len(layouts),)), (5,), sizes)[..., :1]
    firsts, pending = experts_moment_terms(arch, precs, a_names, c_names, device, sizes)
    acts, temps = (lift(terms_array([f[j] for f in firsts], (len(precs), len(a_names), len(c_names))), (0, 3, 4),
                        sizes) for j in (0, 1))
    return [("backward", dict(states, **{C.GRADIENTS: (g - pending) * flag, C.ACTIVATIONS: acts * flag,
                                         C.TEMPORARY: temps * flag}))]


def _whole_bucket(arch, precs, layouts, sizes, states, g_fwd, inputs) -> list:
    """DeepSpeed ZeRO-2 whose bucket holds every gradient, at the backward's end (zero_bucket.whole_bucket): their
    flattened copy beside the bucket (added by _with_buffers). None where no layout has it."""
    tables = _layout_tables(lambda p, lay: (zero_bucket.whole_bucket(arch, lay) * p.grad_bytes,), precs, layouts,
                            sizes, (0, 5))
    if tables is None:
        return []
    return [("backward", dict(states, **{C.GRADIENTS: g_fwd + tables[0], C.ACTIVATIONS: inputs}))]


def _zero1_reduction(precs, layouts, sizes, states, g, inputs, partition) -> list:
    """DeepSpeed ZeRO-1 reducing after the backward (zero_bucket.zero1_reduction): every gradient beside the rank's
    16-bit partition (the bucket added by _with_buffers). None where no layout is ZeRO-1's."""
    tables = _layout_tables(lambda p, lay: (zero_bucket.zero1_reduction(lay),), precs, layouts, sizes, (0, 5))
    if tables is None:
        return []
    return [("backward", dict(states, **{C.GRADIENTS: g + partition * tables[0][..., :1], C.ACTIVATIONS: inputs}))]


def _with_fsdp_units(arch, phases: list, precs, layouts, sizes: tuple, dims: tuple, n_end: int) -> list:
    """FSDP2's parameters moment by moment (fsdp.fsdp_weight_deltas) added to the weights of each phase: the
    forward, the backward's first moment (the loss's), its later moments (the blocks' backward, with what
    fsdp.fsdp_blocks_backward adds to their temporaries), the optimizer step; at the last `n_end` backward moments
    (the embedding's) what FSDP holds there instead (fsdp.fsdp_backward_end), and after them FSDP1's root
    concatenation (fsdp.fsdp1_root_gradients; below the embedding's moment for other layouts)."""
    deltas = _layout_tables(lambda p, lay: par_fsdp.fsdp_weight_deltas(arch, p, lay), precs, layouts, sizes, dims)
    if deltas is None:
        return phases
    fwd, first, later, step = deltas
    end_w, end_g, end_t1, end_t2 = _layout_tables(lambda p, lay: par_fsdp.fsdp_backward_end(arch, p, lay), precs,
                                                  layouts, sizes, dims)
    (blocks_t,) = _layout_tables(lambda p, lay: (par_fsdp.fsdp_blocks_backward(arch, p, lay),), precs, layouts,
                                 sizes, dims)
    root_cat = _layout_tables(lambda p, lay: (par_fsdp.fsdp1_root_gradients(arch, p, lay),), precs, layouts, sizes,
                              dims)
    last_bwd = max(i for i, (name, _) in enumerate(phases) if name == "backward")
    out, previous = [], ""
    for i, (name, comps) in enumerate(phases):
        comps = dict(comps)
        if name == "backward" and last_bwd - n_end < i <= last_bwd:  # the embedding's moments
            comps[C.WEIGHTS] = comps[C.WEIGHTS] + end_w
            comps[C.GRADIENTS] = comps[C.GRADIENTS] + end_g
            after = [(name, dict(comps, **{C.TEMPORARY: root_cat[0]}))] if i == last_bwd and root_cat else []
            comps[C.TEMPORARY] = comps[C.TEMPORARY] + (end_t2 if i == last_bwd else end_t1)
            out += [(name, comps), *after]  # FSDP1's root concatenation last (fsdp1_root_gradients)
            previous = name
            continue
        if name == "backward" and previous == "backward":  # the blocks' backward
            comps[C.WEIGHTS] = comps[C.WEIGHTS] + later
            comps[C.TEMPORARY] = comps[C.TEMPORARY] + blocks_t
        else:
            comps[C.WEIGHTS] = comps[C.WEIGHTS] + {"forward": fwd, "backward": first, "optimizer": step}[name]
        previous = name
        out.append((name, comps))
    return out


def parallel_train_plan(arch: Architecture, device: str, p_names: tuple, o_names: tuple, i_names: tuple,
                         a_names: tuple, c_names: tuple, layouts: tuple) -> Plan:
    precs = precisions(p_names, "train")
    nP, nO, nI, nL = len(precs), len(o_names), len(i_names), len(layouts)
    st = _rank_state_tables(arch, precs, o_names, i_names, layouts)
    if arch.kind != "transformer":  # data parallel, ZeRO, offload: the states shrink, the activations do not
        sizes = (nP, nO, nI, nL)
        dims = (0, 1, 2, 3)
        s0 = {k: lift(v, dims, sizes) for k, v in st[0].items()}
        states = {C.WEIGHTS: s0["weights"], C.MASTER_WEIGHTS: s0["master"], C.OPTIMIZER_STATE: s0["optimizer"]}
        if arch.kind == "params":
            A = lift(terms_array([act.params_activations(arch, p) for p in precs], (nP,)), (0,), sizes)
            phases = [("backward", dict(states, **{C.GRADIENTS: s0["gradients"], C.ACTIVATIONS: A}))]
        else:
            phases = layer_net_train(arch, precs, device, states, s0["gradients"], s0["step_temp"], sizes,
                                      grads_share=s0["gradients"])
        phases = _with_buffers(arch, phases, precs, layouts, sizes, (0, 3))
        plan = Plan((C.PRECISION, C.OPTIMIZER, C.OPTIMIZER_IMPL, "layout"), sizes, phases)
        plan.host = _host_table(st, sizes, dims)
        plan.seq_divisor = np.array([lay.seq_divisor for lay in layouts], dtype=np.int64)
        return plan

    nA, nC = len(a_names), len(c_names)
    sizes = (nP, nO, nI, nA, nC, nL)
    sdims = (0, 1, 2, 5)
    acts = [[par_act.stage_activations(arch, p, a, c, lay, device) for lay in layouts]
            for p in precs for a in a_names for c in c_names]
    phases = []
    for stage in (0, 1):
        def get(fn) -> np.ndarray:  # per (precision, attention, checkpointing, layout)
            ts = []
            for per in acts:
                for lay, r in zip(layouts, per):
                    ta = r[stage]
                    ts.append(fn(ta) if ta is not None else Term())
            return lift(terms_array(ts, (nP, nA, nC, nL)), (0, 3, 4, 5), sizes)

        s_ = {k: lift(v, sdims, sizes) for k, v in st[stage].items()}
        start = len(phases)
        in_flight = [acts[0][j][2 + stage] for j in range(nL)]
        live = lift(consts(list(_grads_flag(layouts, stage, in_flight)), (nL,)), (5,), sizes)
        states = {C.WEIGHTS: s_["weights"], C.MASTER_WEIGHTS: s_["master"], C.OPTIMIZER_STATE: s_["optimizer"]}
        g = s_["gradients"]
        g_fwd = s_["kept"] * live[..., :1]  # gradients of earlier micro-batches while the next one runs forward
        saved = get(lambda t: t.saved)
        inputs = get(lambda t: t.inputs)
        fwd = get(lambda t: t.forward_temp)
        n_bwd = max(len(r[stage].backward_start_temp) for per in acts for r in per if r[stage] is not None)
        n_end = max(len(r[stage].backward_end_temp) for per in acts for r in per if r[stage] is not None)
        bwd_start = [get(lambda t, j=j: t.backward_start_temp[j] if j < len(t.backward_start_temp) else Term())
                     for j in range(n_bwd)]
        bwd_end = [get(lambda t, j=j: t.backward_end_temp[j] if j < len(t.backward_end_temp) else Term())
                   for j in range(n_end)]
        fsdp_moments = stage == 0  # FSDP2 shards data-parallel ranks alone: one stage (fsdp.fsdp_applies)
        first_bucket, tied_end = _first_bucket(arch, precs, a_names, c_names, layouts, sizes, device, states, g,
                                               g_fwd, saved) if stage == 0 else ([], None)
        zero1 = _zero1_reduction(precs, layouts, sizes, states, g, inputs, s_["norm_gradients"])
        if tied_end is not None:
            bwd_end = [t + tied_end for t in bwd_end]
        phases += [
            *(_first_block(arch, precs, layouts, sizes, states, g_fwd, inputs) if fsdp_moments else []),
            *(_last_forward(arch, precs, layouts, sizes, states, g_fwd, saved) if fsdp_moments else []),
            ("forward", dict(states, **{C.GRADIENTS: g_fwd, C.ACTIVATIONS: saved, C.TEMPORARY: fwd})),
            *[("backward", dict(states, **{C.GRADIENTS: g_fwd, C.ACTIVATIONS: saved, C.TEMPORARY: t}))
              for t in bwd_start],
            *first_bucket,
            *zero1,  # after the backward; placed before the embedding's moments (_with_fsdp_units counts those last)
            *(_whole_bucket(arch, precs, layouts, sizes, states, g_fwd, inputs) if stage == 0 else []),
            *(_first_block_experts(arch, precs, a_names, c_names, layouts, sizes, device, states, g)
              if stage == 0 else []),
            *(recomputed_whole(arch, precs, a_names, c_names, layouts, sizes, device, states, g)
              if stage == 0 else []),
            *(_block_moments(arch, precs, a_names, c_names, layouts, sizes, device, states, g_fwd, saved, inputs,
                             bwd_start) if fsdp_moments else []),
            *(recomputed_sharded(arch, precs, a_names, c_names, layouts, sizes, device, states, g_fwd)
              if fsdp_moments else []),
            *[("backward", dict(states, **{C.GRADIENTS: g, C.ACTIVATIONS: inputs, C.TEMPORARY: t})) for t in bwd_end],
            # ZeRO-Offload reducing its largest gradient (states.deepspeed_offload; the bucket from _with_buffers)
            *([("backward", dict(states, **{C.GRADIENTS: g, C.ACTIVATIONS: inputs, C.TEMPORARY: s_["reduce_temp"]}))]
              if any(par_deepspeed.zero_offload(lay) for lay in layouts) else []),
            ("optimizer", dict(states, **{C.WEIGHTS: s_["weights"] - s_["step_released"],
                                          C.GRADIENTS: s_["gradients_in_step"], C.ACTIVATIONS: inputs,
                                          C.TEMPORARY: s_["step_temp"]})),
        ]
        if any(lay.deepspeed for lay in layouts):  # DeepSpeed's gradient norm, before its step (states.py)
            phases.append(("optimizer", dict(states, **{C.WEIGHTS: s_["weights"] - s_["end_released"],
                                                        C.GRADIENTS: s_["norm_gradients"], C.ACTIVATIONS: inputs,
                                                        C.TEMPORARY: s_["norm_temp"]})))
        phases = _plus_temporary(phases, s_["offload_buffer"], start)
        if not any(lay.pp > 1 for lay in layouts):
            break  # no second stage anywhere in the frame
    phases = _with_buffers(arch, phases, precs, layouts, sizes, (0, 5))
    phases = _with_fsdp_units(arch, phases, precs, layouts, sizes, (0, 5), n_end)
    plan = Plan((C.PRECISION, C.OPTIMIZER, C.OPTIMIZER_IMPL, C.ATTENTION, C.CHECKPOINTING, "layout"), sizes, phases)
    plan.host = _host_table(st, sizes, sdims)
    plan.seq_divisor = np.array([lay.seq_divisor for lay in layouts], dtype=np.int64)
    return act.windowed(plan, arch)


def prepare_train(arch: Architecture, mode: str, frame: pd.DataFrame, device: str, axis_codes: list,
                  names: tuple, b, s):
    """peak._prepare for a training frame with parallel columns: (plan, combination code, batch,
    the rank's seq_len); the plan has one more axis, the frame's unique layouts."""
    l_code, layouts = par_layout.frame_layouts(frame)
    par_layout.check(arch, layouts, mode)
    if arch.finetune is not None and arch.finetune.adapters and not all(lay.deepspeed_data_parallel
                                                                         for lay in layouts):
        raise UsageError(f"finetune method {arch.finetune.method} is modelled on one GPU, or over data_parallel "
                         "ranks as DeepSpeed ZeRO runs it, not with these parallel axes")
    if arch.kind != "transformer":
        names = names[:3]
        axis_codes = axis_codes[:3]
    plan = cached(arch, ("train-parallel", device, *names, layouts),
                  lambda: parallel_train_plan(arch, device, *names, *(((),) * (5 - len(names))), layouts))
    div = plan.seq_divisor[l_code]
    if (div > 1).any():
        if (s % div).any():
            r = int(np.flatnonzero(s % div)[0])
            raise UsageError(par_layout.seq_problem(layouts[l_code[r]], int(s[r])))
        s = s // div  # the rank's own tokens of each sequence
    return plan, combine(axis_codes + [l_code], plan.sizes), b, s


def infer_key(arch: Architecture, mode: str, frame: pd.DataFrame, p_code: np.ndarray, p_names: tuple,
              prefill_logits: str):
    """peak._prepare for an inference frame with parallel columns: the key infer_layouts reads,
    per layout the inference tables of its rank's model; None where every layout is one GPU or the model is
    not a transformer (peak then estimates the frame as it would without the columns)."""
    l_code, layouts = par_layout.frame_layouts(frame)
    if any(lay != par_layout.Layout() for lay in layouts):
        par_layout.check(arch, layouts, mode)
        if arch.kind == "transformer":
            precisions(p_names, mode)
            a_code, a_names = codes(frame, C.ATTENTION)
            keys = []
            for lay in layouts:
                ra = par_states.infer_rank_arch(arch, lay.tp, lay.pp)
                tables = cached(ra, ("infer-tables", p_names, a_names, prefill_logits),
                                lambda ra=ra: InferTables(ra, p_names, a_names, prefill_logits))
                keys.append((tables, p_code.astype(np.int64), a_code))
            return ("parallel", arch, layouts, l_code, keys)
    return None


def infer_layouts(arch, frame, key, b, s):
    """components/infer_plan.infer_phases per parallel layout on its rank's model (parallel/states.py
    infer_rank_arch), the rows of each layout gathered back in place."""
    _, full, layouts, l_code, keys = key
    n = len(l_code)
    totals_out: list[np.ndarray] = []
    comps_out: list[dict[str, np.ndarray]] = []
    names: list[str] = []
    for j, (lay, k) in enumerate(zip(layouts, keys)):
        rows = np.flatnonzero(l_code == j)
        if not len(rows):
            continue
        sub = frame.iloc[rows]
        rank_arch = par_states.infer_rank_arch(full, lay.tp, lay.pp)
        tb, p_code, a_code = k
        totals, comps, names = infer_phases(rank_arch, sub, (tb, p_code[rows], a_code[rows]), b[rows], s[rows])
        # pipeline stages hold the embedding or the head, not both (a tied embedding: both stages a copy)
        delta = tb.head_bytes[p_code[rows]] if lay.pp > 1 and not full.tied_embeddings else 0
        if not totals_out:
            totals_out = [np.zeros(n, dtype=np.int64) for _ in totals]
            comps_out = [{c: np.zeros(n, dtype=np.int64) for c in pc} for pc in comps]
        for t_out, t in zip(totals_out, totals):
            t_out[rows] = np.where(t >= 0, t - delta, t)
        for pc_out, pc in zip(comps_out, comps):
            for c, v in pc.items():
                pc_out[c][rows] = (v - delta) if c == C.WEIGHTS else v
    return totals_out, comps_out, names
