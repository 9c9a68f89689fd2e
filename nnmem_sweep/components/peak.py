"""The peak of a training step or an inference request, as a moment: the largest of a few phase totals.

Training (the modelled step is step 2: optimizer state exists; zero_grad(set_to_none=True) freed the grads):

    forward         W + M + S + saved activations + forward temporaries (logits, fp32 copy, log_softmax)
    backward start  W + M + S + saved activations + loss-backward temporaries; or + the last layer's MLP
                    backward; or + one recomputed layer (checkpointing): each a moment of its own
    backward end    W + M + S + G + inputs + gradient of the embedding output (+ the tied embedding's second
                    gradient and their sum, a moment of its own)
    optimizer       W + M + S + G + inputs + the step's temporaries

During backward the saved activations shrink layer by layer while the gradients grow by the same layers' weights,
so the live total moves roughly linearly between the two backward moments and its maximum is at one of them.
The component columns are those of the winning phase, so they add up to the peak exactly; ties go to the earlier
phase. params models follow the simple calculators' convention: one moment holding weights, master, gradients,
optimizer state and activations together (FORMULAS.md worked examples). Layer nets get a forward moment, one
backward moment per layer (what layers up to it still keep, the gradients of the layers after it) and the step.

Inference (generate() with a dynamic cache, or a preallocated cache of cache_tokens tokens):

    prefill         W + KV(prompt) + max(one layer's intermediates for the prompt, last-position logits)
    decode          W + KV(prompt + decode_tokens) + the cache append copy + one token's intermediates,
                    or + the last step's logits (two moments)
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import columns as C
from ..catalog.optimizers import get_optimizer
from ..catalog.precisions import Precision, get_precision
from ..errors import UsageError
from ..models.arch import Architecture
from . import activations as act
from .kv import cache_tokens, kv_append_temp_bytes, kv_cache_bytes
from .optimizer import optimizer_state_bytes, optimizer_step_temporary_bytes
from .terms import Term
from .weights import gradients_bytes, master_weights_bytes, param_summary, weights_bytes

PHASES = ("forward", "backward", "optimizer", "prefill", "decode")


def _codes(frame: pd.DataFrame, col: str) -> tuple[np.ndarray, list]:
    """Integer codes and their values for a (categorical or plain) column."""
    s = frame[col]
    if isinstance(s.dtype, pd.CategoricalDtype):
        return s.cat.codes.to_numpy(), list(s.cat.categories)
    codes, uniques = pd.factorize(s, sort=False)
    return codes, list(uniques)


class _TermTable:
    """One Term per combination code, evaluated for all rows at once."""

    def __init__(self, terms: list[Term]):
        self.const = np.array([t.const for t in terms], dtype=np.int64)
        self.pos = np.array([t.pos for t in terms], dtype=np.int64)
        self.seq = np.array([t.seq for t in terms], dtype=np.int64)
        self.tok = np.array([t.tok for t in terms], dtype=np.int64)
        self.s2 = np.array([t.s2 for t in terms], dtype=np.int64)

    def eval(self, code: np.ndarray, b: np.ndarray, s: np.ndarray) -> np.ndarray:
        per = self.tok[code] + s * self.s2[code] if self.s2.any() else self.tok[code]
        per = self.seq[code] + s * per
        out = self.const[code] + b * per
        return out + s * self.pos[code] if self.pos.any() else out


def _precisions(names: list, mode: str) -> list[Precision]:
    precs = [get_precision(n) for n in names]
    if mode == "train":
        bad = [p.name for p in precs if p.infer_only]
        if bad:
            raise UsageError(f"precision {', '.join(bad)} stores quantised weights for inference only; "
                             "use mode: infer or a training recipe (fp32, bf16, fp16, bf16-mixed, fp16-mixed, bf16-master)")
    return precs


def _pick(phase_totals: list[np.ndarray], phase_components: list[dict[str, np.ndarray]],
          phase_names: list[str], n: int) -> dict[str, object]:
    """Components of the phase with the largest total (first one on ties)."""
    if len(phase_totals) == 1:
        out: dict[str, object] = dict(phase_components[0])
        out[C.PEAK_ALLOCATED] = phase_totals[0]
        out[C.PEAK_PHASE] = pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=phase_names[:1])
        return out
    stacked = np.stack(phase_totals)
    win = np.argmax(stacked, axis=0)
    out = {}
    rows = np.arange(n)
    for comp in C.COMPONENTS:
        arrays = [np.broadcast_to(pc.get(comp, 0), (n,)) for pc in phase_components]
        out[comp] = np.stack(arrays)[win, rows]
    out[C.PEAK_ALLOCATED] = stacked[win, rows]
    uniq = list(dict.fromkeys(phase_names))
    label_codes = np.array([uniq.index(p) for p in phase_names], dtype=np.int8)[win]
    out[C.PEAK_PHASE] = pd.Categorical.from_codes(label_codes, categories=uniq)
    return out


def estimate_components(arch: Architecture, mode: str, frame: pd.DataFrame, device: str = "cuda"
                        ) -> dict[str, object]:
    """Component columns, peak_allocated_bytes and peak_phase for every row of `frame` (the grid axes).
    device="cpu" models what a CPU run keeps (dropout noise tensors instead of bool masks): for comparing with the
    CPU-measured ground truth only."""
    phases = _phases(arch, mode, frame, device)
    return _pick([p[1] for p in phases], [p[2] for p in phases], [p[0] for p in phases], len(frame))


def phase_totals(arch: Architecture, mode: str, frame: pd.DataFrame, device: str = "cuda") -> list[np.ndarray]:
    """The total of every phase for every row (-1 where a phase does not happen): affine in batch each."""
    return [p[1] for p in _phases(arch, mode, frame, device)]


def _phases(arch: Architecture, mode: str, frame: pd.DataFrame, device: str = "cuda"
            ) -> list[tuple[str, np.ndarray, dict]]:
    if device not in act.DEVICES:
        raise UsageError(f"unknown device {device!r}; use {' or '.join(act.DEVICES)}")
    n = len(frame)
    b = frame[C.BATCH].to_numpy(dtype=np.int64)
    s = frame[C.SEQ_LEN].to_numpy(dtype=np.int64)
    p_code, p_names = _codes(frame, C.PRECISION)
    precs = _precisions(p_names, mode)
    if mode == "train":
        return _train(arch, frame, b, s, p_code, precs, n, device)
    if mode == "infer":
        return _infer(arch, frame, b, s, p_code, precs, n)
    raise UsageError(f"unknown mode {mode!r}; use train or infer")


def _train(arch, frame, b, s, p_code, precs, n, device):
    o_code, o_names = _codes(frame, C.OPTIMIZER)
    i_code, i_names = _codes(frame, C.OPTIMIZER_IMPL)
    opts = [get_optimizer(o) for o in o_names]
    nO, nI = len(opts), len(i_names)
    # model states per (precision, optimizer, impl)
    W = np.array([weights_bytes(arch, p) for p in precs], dtype=np.int64)[p_code]
    M = np.array([master_weights_bytes(arch, p) for p in precs], dtype=np.int64)[p_code]
    G = np.array([gradients_bytes(arch, p) for p in precs], dtype=np.int64)[p_code]
    st = np.zeros((len(precs), nO, nI), dtype=np.int64)
    tmp = np.zeros((len(precs), nO, nI), dtype=np.int64)
    for pi, p in enumerate(precs):
        for oi, o in enumerate(opts):
            for ii, impl in enumerate(i_names):
                st[pi, oi, ii] = optimizer_state_bytes(arch, p, o, impl)
                tmp[pi, oi, ii] = optimizer_step_temporary_bytes(arch, p, o, impl)
    flat = (p_code.astype(np.int64) * nO + o_code) * nI + i_code
    S = st.reshape(-1)[flat]
    T_opt = tmp.reshape(-1)[flat]
    states = {C.WEIGHTS: W, C.MASTER_WEIGHTS: M, C.OPTIMIZER_STATE: S}

    if arch.kind == "params":
        A = _TermTable([act.params_activations(arch, p) for p in precs]).eval(p_code, b, s)
        comps = dict(states, **{C.GRADIENTS: G, C.ACTIVATIONS: A})
        return [("backward", W + M + S + G + A, comps)]
    if arch.kind == "layers":
        return _layer_net_train(arch, b, s, p_code, precs, states, G, T_opt, device)

    a_code, a_names = _codes(frame, C.ATTENTION)
    c_code, c_names = _codes(frame, C.CHECKPOINTING)
    nA, nC = len(a_names), len(c_names)
    terms = [act.train_activations(arch, p, a, c, device) for p in precs for a in a_names for c in c_names]
    k = (p_code.astype(np.int64) * nA + a_code) * nC + c_code
    saved = _TermTable([t.saved for t in terms]).eval(k, b, s)
    inputs = _TermTable([t.inputs for t in terms]).eval(k, b, s)
    fwd_tmp = _TermTable([t.forward_temp for t in terms]).eval(k, b, s)
    n_bwd = max(len(t.backward_start_temp) for t in terms)
    bwd_start = []  # each moment its own phase: a max of affine terms is not affine in batch
    for j in range(n_bwd):
        tj = [t.backward_start_temp[j] if j < len(t.backward_start_temp) else Term() for t in terms]
        bwd_start.append(_TermTable(tj).eval(k, b, s))
    n_end = max(len(t.backward_end_temp) for t in terms)
    bwd_end = []
    for j in range(n_end):
        tj = [t.backward_end_temp[j] if j < len(t.backward_end_temp) else Term() for t in terms]
        bwd_end.append(_TermTable(tj).eval(k, b, s))

    base = W + M + S
    phases = [
        ("forward", base + saved + fwd_tmp, dict(states, **{C.ACTIVATIONS: saved, C.TEMPORARY: fwd_tmp})),
        *[("backward", base + saved + t, dict(states, **{C.ACTIVATIONS: saved, C.TEMPORARY: t})) for t in bwd_start],
        *[("backward", base + G + inputs + t, dict(states, **{C.GRADIENTS: G, C.ACTIVATIONS: inputs, C.TEMPORARY: t}))
          for t in bwd_end],
        ("optimizer", base + G + inputs + T_opt,
         dict(states, **{C.GRADIENTS: G, C.ACTIVATIONS: inputs, C.TEMPORARY: T_opt})),
    ]
    return phases


def _layer_net_train(arch, b, s, p_code, precs, states, G, T_opt, device):
    """Layer nets: forward end, one backward moment per layer (those not dominated by another), optimizer."""
    nets = [act.layer_net_train(arch, p, device) for p in precs]
    base = states[C.WEIGHTS] + states[C.MASTER_WEIGHTS] + states[C.OPTIMIZER_STATE]
    saved = _TermTable([t.saved for t in nets]).eval(p_code, b, s)
    inputs = _TermTable([t.inputs for t in nets]).eval(p_code, b, s)
    fwd = _TermTable([t.forward_temp for t in nets]).eval(p_code, b, s)
    phases = [("forward", base + saved + inputs + fwd,
               dict(states, **{C.ACTIVATIONS: saved + inputs, C.TEMPORARY: fwd}))]
    # a moment is dominated when another has at least its batch-independent and its per-sample bytes everywhere
    keys = [[(g + a.const + t.const, a.seq + t.seq) for g, a, t in net.backward] for net in nets]
    keep = [j for j in range(len(keys[0]))
            if not any(all(kk[i][0] >= kk[j][0] and kk[i][1] >= kk[j][1] and kk[i] != kk[j] for kk in keys)
                       for i in range(len(keys[0])))]
    for j in dict.fromkeys(keep):
        grads = np.array([net.backward[j][0] for net in nets], dtype=np.int64)[p_code]
        a = _TermTable([net.backward[j][1] for net in nets]).eval(p_code, b, s)
        t = _TermTable([net.backward[j][2] for net in nets]).eval(p_code, b, s)
        phases.append(("backward", base + grads + a + t,
                       dict(states, **{C.GRADIENTS: grads, C.ACTIVATIONS: a, C.TEMPORARY: t})))
    phases.append(("optimizer", base + G + inputs + T_opt,
                   dict(states, **{C.GRADIENTS: G, C.ACTIVATIONS: inputs, C.TEMPORARY: T_opt})))
    return phases


def _infer(arch, frame, b, s, p_code, precs, n):
    W = np.array([weights_bytes(arch, p) for p in precs], dtype=np.int64)[p_code]
    if arch.kind != "transformer":
        fn = act.params_activations if arch.kind == "params" else act.layer_net_infer
        A = _TermTable([fn(arch, p) for p in precs]).eval(p_code, b, s)
        return [("forward", W + A, {C.WEIGHTS: W, C.ACTIVATIONS: A})]
    a_code, a_names = _codes(frame, C.ATTENTION)
    nA = len(a_names)
    e = np.array([p.act_bytes for p in precs], dtype=np.int64)[p_code]
    # autocast (mixed recipes) casts each fp32 matmul weight to 16 bit as it is used: one largest copy at a time
    cast = np.array([param_summary(arch).largest * p.act_bytes if p.autocast else 0 for p in precs],
                    dtype=np.int64)[p_code]
    cache = frame[C.CACHE_TOKENS].to_numpy(dtype=np.int64)
    dec = frame[C.DECODE_TOKENS].to_numpy(dtype=np.int64)
    static = cache > 0
    t_prefill = np.where(static, cache, s)
    t_final = np.where(static, cache, s + dec)
    k = p_code.astype(np.int64) * nA + a_code
    pre_terms = [act.prefill_temp(arch, p, a) for p in precs for a in a_names]
    moments = [_TermTable([t[j] for t in pre_terms]) for j in range(3)]  # attention, MLP, logits
    pre = np.maximum.reduce([m.eval(k, b, s) for m in moments]) + cast
    kv_pre = kv_cache_bytes(arch, b, t_prefill, e)
    # a decode step is the same moments for one token; eager attention scores span the whole cache
    one = np.ones_like(s)
    scores = moments[0].s2[k] * b * cache_tokens(arch, t_final)
    layer_step = np.maximum(moments[0].eval(k, b, one) - b * moments[0].s2[k] + scores, moments[1].eval(k, b, one))
    append = np.where(static, 0, kv_append_temp_bytes(arch, b, t_final, e))  # the cat copy of one layer's K
    d_layer = layer_step + cast + append
    d_logits = moments[2].eval(k, b, one)
    kv_dec = kv_cache_bytes(arch, b, t_final, e)
    happens = dec > 0
    phases = [("prefill", W + kv_pre + pre, {C.WEIGHTS: W, C.KV_CACHE: kv_pre, C.TEMPORARY: pre})]
    for temp in (d_layer, d_logits):
        phases.append(("decode", np.where(happens, W + kv_dec + temp, -1),
                       {C.WEIGHTS: W, C.KV_CACHE: kv_dec, C.TEMPORARY: temp}))
    return phases

