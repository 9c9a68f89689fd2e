"""The estimator for derived models (issue 12): each row's peak from the traced moments of its recipe.

A derived plan (derive/derivation.py) holds, per region of (batch, sequence), the moments of one traced step that
can be its peak: the live bytes by kind of storage, as integer polynomials over (1, s, b, b·s, b·s², s²). A row's
training peak is the largest of

    moment k     W' + M + S + [grad + buffer + input + act + temp + kv](k)(b, s)       (k over the region's moments)
    optimizer    W' + M + S + G + [everything else live after backward](b, s) + T_opt

with W' the weights of the recipe (the traced parameters, or the catalog's quantised bytes), M, S and T_opt the
precision and optimizer catalogs' master copy, state and step temporaries (as for hand-modelled families), and G the
traced gradients. An inference row's peak is the largest prefill moment at (b, s) and decode moment at
(b, s + decode_tokens − 1), the cache length of the last generated token's step.

Moments that cannot win anywhere in the rows' range of b and s are dropped before evaluating (a box test in
float64 with a margin, so only moments beaten by a clear amount go); the rest are evaluated exactly in int64.
Components: weights = parameters + buffers, gradients, activations = inputs + what forward saved for backward,
kv_cache, temporary = the rest; master and optimizer state from the catalogs.
"""
from __future__ import annotations

import numpy as np

from .. import columns as C
from ..catalog.optimizers import get_optimizer
from ..catalog.precisions import Precision
from ..citations import formula, source
from ..errors import UsageError
from .optimizer import optimizer_state_bytes, optimizer_step_temporary_bytes
from .weights import master_weights_bytes, weights_bytes

DERIVED = source("nnmem-derived", "nnmem_sweep derived plans: the model's own code traced under FakeTensorMode at "
                 "probe shapes, every allocation's bytes solved as an integer polynomial in (b, s) and checked at "
                 "shapes left out (nnmem_sweep/derive/)", "nnmem_sweep/derive/derivation.py")

# kind of storage -> component column
_COMPONENT = {"param": C.WEIGHTS, "buffer": C.WEIGHTS, "grad": C.GRADIENTS, "input": C.ACTIVATIONS,
              "act": C.ACTIVATIONS, "temp": C.TEMPORARY, "kv": C.KV_CACHE}
_TRACED = ("grad", "buffer", "input", "act", "temp", "kv")  # the kinds a moment adds to W' + M + S


def _features(b: np.ndarray, s: np.ndarray) -> np.ndarray:
    """(6, n) int64: 1, s, b, b·s, b·s², s² (derive/solve.MONOMIALS)."""
    bs = b * s
    return np.stack([np.ones_like(b), s, b, bs, bs * s, s * s])


def _box_min(d: np.ndarray, b0: int, b1: int, s0: int, s1: int) -> np.ndarray:
    """Lower bound (float64) over the box of the polynomials d (..., 6): affine in b (ends), quadratic in s (ends
    and the vertex)."""
    d = d.astype(np.float64)
    best = None
    for b in (b0, b1):
        a0 = d[..., 0] + d[..., 2] * b
        a1 = d[..., 1] + d[..., 3] * b
        a2 = d[..., 5] + d[..., 4] * b
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where(a2 > 0, np.clip(-a1 / (2 * a2), s0, s1), s0)
        for s in (s0, s1, np.floor(v), np.ceil(v)):
            s = np.clip(s, s0, s1)
            q = a0 + a1 * s + a2 * s * s
            best = q if best is None else np.minimum(best, q)
    return best


def prune(tot: np.ndarray, b0: int, b1: int, s0: int, s1: int) -> np.ndarray:
    """Indices of the moments (rows of tot, (k, 6)) that may be the largest somewhere in the box. A moment goes
    when another is larger by a clear margin everywhere in the box, or is an exact copy of an earlier one."""
    k = len(tot)
    if k <= 1:
        return np.arange(k)
    _, first = np.unique(tot, axis=0, return_index=True)
    cand = np.sort(first)
    t = tot[cand]
    d = t[None, :, :] - t[:, None, :]  # d[i, j] = t_j - t_i
    lo = _box_min(d, b0, b1, s0, s1)
    scale = np.abs(t.astype(np.float64)).sum(axis=1) * float(max(b1, 1)) * float(max(s1, 1)) ** 2
    margin = 1e-9 * scale[:, None] + 16.0
    beaten = (lo > margin).any(axis=1)
    return cand[~beaten]


def _coef(live: dict, kinds) -> np.ndarray:
    return np.sum([np.asarray(live[k], dtype=np.int64) for k in kinds], axis=0)


def _moment_table(moments, kinds) -> np.ndarray:
    return np.array([_coef(m.live, kinds) for m in moments], dtype=np.int64).reshape(len(moments), 6)


@formula("derived_peak_bytes", "max_k [W' + M + S + Σ_kinds live_k(b, s)], optimizer: W' + M + S + G + end(b, s) + "
         "T_opt", DERIVED, where="components/derived.py module docstring")
def train_rows(arch, b: np.ndarray, s: np.ndarray, recipes: dict, states: dict, keys: np.ndarray,
               state_idx: np.ndarray) -> dict[str, np.ndarray]:
    """Training rows. recipes: {key: DerivedPlan} per traced recipe code; states: arrays per state code (W', M,
    S, T_opt, G); keys: per row the recipe code; state_idx: per row the state code. Returns the component arrays,
    peak and phase codes (0 forward, 1 backward, 2 optimizer)."""
    n = len(b)
    out = {c: np.zeros(n, dtype=np.int64) for c in C.COMPONENTS}
    peak = np.zeros(n, dtype=np.int64)
    phase = np.zeros(n, dtype=np.int8)
    W, M, S, T, G = (states[x][state_idx] for x in ("W", "M", "S", "T", "G"))
    for key, plan in recipes.items():
        sel_key = keys == key
        for r in plan.regions:
            sel = sel_key & (b >= r.b_lo) & ((b <= r.b_hi) if r.b_hi is not None else True)
            rows = np.flatnonzero(sel)
            if not len(rows):
                continue
            _train_region(r, b[rows], s[rows], rows, W, M, S, T, G, out, peak, phase)
    return {**out, C.PEAK_ALLOCATED: peak, "phase_code": phase}


def _train_region(r, b, s, rows, W, M, S, T, G, out, peak, phase) -> None:
    x = _features(b, s)
    tot_all = _moment_table(r.moments, _TRACED)
    keep = prune(tot_all, int(b.min()), int(b.max()), int(s.min()), int(s.max()))
    moments = [r.moments[i] for i in keep]
    base = W[rows] + M[rows] + S[rows]
    end = np.asarray(_coef(r.end, ("buffer", "input", "act", "temp", "kv")), dtype=np.int64) @ x
    opt_total = base + G[rows] + end + T[rows]
    vals = _moment_table(moments, _TRACED) @ x + base  # (k, n)
    allv = np.vstack([vals, opt_total[None, :]])
    win = np.argmax(allv, axis=0)  # ties: the earlier moment
    top = allv[win, np.arange(len(rows))]
    peak[rows] = top
    is_opt = win == len(moments)
    out[C.WEIGHTS][rows] = W[rows] + np.where(is_opt, _coef(r.end, ("buffer",)) @ x,
                                              _pick(moments, ("buffer",), x, win))
    out[C.MASTER_WEIGHTS][rows] = M[rows]
    out[C.OPTIMIZER_STATE][rows] = S[rows]
    out[C.GRADIENTS][rows] = np.where(is_opt, G[rows], _pick(moments, ("grad",), x, win))
    out[C.ACTIVATIONS][rows] = np.where(is_opt, _coef(r.end, ("input", "act")) @ x,
                                        _pick(moments, ("input", "act"), x, win))
    out[C.KV_CACHE][rows] = np.where(is_opt, _coef(r.end, ("kv",)) @ x, _pick(moments, ("kv",), x, win))
    out[C.TEMPORARY][rows] = np.where(is_opt, _coef(r.end, ("temp",)) @ x + T[rows], _pick(moments, ("temp",), x, win))
    phase[rows] = np.where(is_opt, 2, np.array([0 if m.phase == "forward" else 1 for m in moments] + [2],
                                               dtype=np.int8)[win])


def _pick(moments, kinds, x: np.ndarray, win: np.ndarray) -> np.ndarray:
    """Per row, the winning moment's bytes of these kinds (0 where the optimizer step won)."""
    if not moments:
        return np.zeros(x.shape[1], dtype=np.int64)
    vals = _moment_table(moments, kinds) @ x
    vals = np.vstack([vals, np.zeros((1, x.shape[1]), dtype=np.int64)])
    return vals[win, np.arange(x.shape[1])]


def infer_rows(b: np.ndarray, s: np.ndarray, dec: np.ndarray, recipes: dict, W: np.ndarray,
               keys: np.ndarray) -> dict[str, np.ndarray]:
    """Inference rows: the largest prefill moment at (b, s) and, where decode_tokens >= 1, decode moment at
    (b, s + decode_tokens − 1). W: per row the recipe's weights (W'); keys: per row the recipe code."""
    n = len(b)
    out = {c: np.zeros(n, dtype=np.int64) for c in C.COMPONENTS}
    peak = np.zeros(n, dtype=np.int64)
    phase = np.zeros(n, dtype=np.int8)
    for key, plan in recipes.items():
        for r in plan.regions:
            sel = (keys == key) & (b >= r.b_lo) & ((b <= r.b_hi) if r.b_hi is not None else True)
            rows = np.flatnonzero(sel)
            if not len(rows):
                continue
            bb, ss, dd = b[rows], s[rows], dec[rows]
            at = {"prefill": _features(bb, ss), "decode": _features(bb, ss + np.maximum(dd, 1) - 1)}
            s_hi = int((ss + np.maximum(dd, 1) - 1).max())
            tot_all = _moment_table(r.moments, _TRACED)
            keep = prune(tot_all, int(bb.min()), int(bb.max()), int(ss.min()), s_hi)
            moments = [r.moments[i] for i in keep]
            vals = np.array([_coef(m.live, _TRACED) @ at[m.phase] for m in moments]).reshape(len(moments), -1)
            happens = np.array([[m.phase == "prefill"] for m in moments]) | (dd >= 1)[None, :]
            vals = np.where(happens, vals, -1)
            win = np.argmax(vals, axis=0)
            idx = np.arange(len(rows))
            peak[rows] = W[rows] + vals[win, idx]
            for comp, kinds in ((C.WEIGHTS, ("buffer",)), (C.KV_CACHE, ("kv",)),
                                (C.TEMPORARY, ("input", "act", "temp", "grad"))):
                part = np.array([_coef(m.live, kinds) @ at[m.phase] for m in moments]).reshape(len(moments), -1)
                out[comp][rows] = part[win, idx]
            out[C.WEIGHTS][rows] += W[rows]
            phase[rows] = np.array([0 if m.phase == "prefill" else 1 for m in moments], dtype=np.int8)[win]
    return {**out, C.PEAK_ALLOCATED: peak, "phase_code": phase}


def _plan(arch, mode: str, precision: str, attention: str, checkpointing: str, device: str, progress: bool):
    from .. import derive

    if checkpointing == "selective":
        raise UsageError("checkpointing 'selective' is Megatron's recipe (recompute attention only); a model derived "
                         "from its transformers code checkpoints whole layers: use none or full")
    try:
        return derive.plan(arch.derived.source, mode, precision, attention, checkpointing, device, progress)
    except derive.DerivationError as e:
        raise UsageError(f"{arch.name}: {e}") from None


def recipe_weights(arch, plan, prec: Precision) -> int:
    """W': the traced parameters' bytes, or for quantised recipes the catalog's bytes of the card's tensors."""
    return weights_bytes(arch, prec) if prec.quant else plan.param_bytes


def train_inputs(arch, precs: tuple[Precision, ...], o_names: tuple, i_names: tuple, a_names: tuple,
                 c_names: tuple, device: str, progress: bool = False):
    """(recipes {code: plan}, states {W, M, S, T, G: arrays over state codes}) for the names of a training frame.
    Recipe code = (p, a, c) row-major; state code = (p, o, i, a, c) row-major (W' and G depend on the trace)."""
    nP, nO, nI, nA, nC = len(precs), len(o_names), len(i_names), len(a_names), len(c_names)
    recipes = {}
    shape = (nP, nO, nI, nA, nC)
    states = {x: np.zeros(shape, dtype=np.int64) for x in ("W", "M", "S", "T", "G")}
    for p_i, prec in enumerate(precs):
        for a_i, att in enumerate(a_names):
            for c_i, ck in enumerate(c_names):
                plan = _plan(arch, "train", prec.name, att, ck, device, progress)
                recipes[(p_i * nA + a_i) * nC + c_i] = plan
                states["W"][p_i, :, :, a_i, c_i] = recipe_weights(arch, plan, prec)
                states["G"][p_i, :, :, a_i, c_i] = plan.grad_bytes
        states["M"][p_i] = master_weights_bytes(arch, prec)
        for o_i, o in enumerate(o_names):
            opt = get_optimizer(o)
            for i_i, impl in enumerate(i_names):
                states["S"][p_i, o_i, i_i] = optimizer_state_bytes(arch, prec, opt, impl)
                states["T"][p_i, o_i, i_i] = optimizer_step_temporary_bytes(arch, prec, opt, impl)
    return recipes, {k: v.ravel() for k, v in states.items()}


def infer_inputs(arch, precs: tuple[Precision, ...], a_names: tuple, device: str, progress: bool = False):
    """(recipes {code: plan}, W' per code) for an inference frame; code = (p, a) row-major."""
    recipes, W = {}, []
    for p_i, prec in enumerate(precs):
        for a_i, att in enumerate(a_names):
            plan = _plan(arch, "infer", prec.name, att, "none", device, progress)
            recipes[p_i * len(a_names) + a_i] = plan
            W.append(recipe_weights(arch, plan, prec))
    return recipes, np.array(W, dtype=np.int64)
