"""The estimator for derived models (issue 12): each row's peak from the traced moments of its recipe.

A derived plan (derive/derivation.py) holds, per region of (batch, sequence), the moments of one traced step that
can be its peak: the live bytes by kind of storage, as integer polynomials over (1, s, b, b·s, b·s², s²). A row's
training peak is the largest of

    moment k     W' + M + S + [grad + buffer + input + act + temp + kv](k)(b, s)       (k over the region's moments)
    optimizer    W' + M + S + G + [everything else live after backward](b, s) + T_opt

with W' the weights of the recipe (the traced parameters, or the catalog's quantised bytes), M, S and T_opt the
precision and optimizer catalogs' master copy, state and step temporaries (as for hand-modelled families), and G the
traced gradients. A loop that keeps its gradients between steps (zero_grad "zeros") has a trace of its own: the
step traced with every gradient allocated from its start (derive/step.py). An inference row's peak is the largest
prefill moment at (b, s) and decode moment at (b, s + decode_tokens − 1), the cache length of the last generated
token's step.

Moments that cannot win anywhere in the rows' range of b and s are dropped before evaluating (a box test in
float64 with a margin, so only moments beaten by a clear amount go); the rest are evaluated exactly in int64.
Components: weights = parameters + buffers, gradients, activations = inputs + what forward saved for backward,
kv_cache, temporary = the rest; master and optimizer state from the catalogs.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import columns as C
from .. import derive
from ..derive import plans as derivation
from ..derive.arch import sharded
from ..citations import formula
from ..errors import UsageError
from .derived_inputs import DERIVED, infer_inputs, train_inputs
from .plan import cached, codes, combine, ints, precisions

_TRACED = ("grad", "buffer", "input", "act", "temp", "kv")  # the kinds a moment adds to W' + M + S
MAX_B = 2**31 - 1  # the largest batch (fit.MAX_BATCH_CAP)


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


class _Best:
    """The running winner per row while regions and phases are offered: peak, components and phase code; ties
    keep the earlier offer (the earlier moment, as np.argmax does)."""

    def __init__(self, n: int):
        self.peak = np.full(n, -1, dtype=np.int64)
        self.comps = {c: np.zeros(n, dtype=np.int64) for c in C.COMPONENTS}
        self.phase = np.zeros(n, dtype=np.int8)

    def offer(self, rows: np.ndarray, top: np.ndarray, comps: dict[str, np.ndarray], phase: np.ndarray) -> None:
        """Per row of `rows`: its winning moment's total, components and phase code (`_pick`)."""
        better = top > self.peak[rows]
        r = rows[better]
        self.peak[r] = top[better]
        for c in C.COMPONENTS:
            part = comps.get(c)
            self.comps[c][r] = 0 if part is None else part[better]
        self.phase[r] = phase[better]

    def result(self) -> dict[str, np.ndarray]:
        return {**self.comps, C.PEAK_ALLOCATED: self.peak, "phase_code": self.phase}


def _regions(plan, b: np.ndarray, s: np.ndarray, sel: np.ndarray):
    """(region, row indices) for the rows of `sel`, each row in the first region that holds it."""
    left = sel.copy()
    for r in plan.regions:
        here = left & r.holds(b, s)
        rows = np.flatnonzero(here)
        left &= ~here
        if len(rows):
            yield r, rows


def _values(moments, kinds, x: np.ndarray) -> np.ndarray:
    return _moment_table(moments, kinds) @ x if moments else np.zeros((0, x.shape[1]), dtype=np.int64)


def _distinct(*cols: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """The distinct combinations of int64 columns (one array per column) and each row's index into them: a
    moment's bytes depend on the row's shape only, so the many rows of one shape (other GPUs, optimizers ...)
    evaluate the moments once."""
    lo = [int(c.min()) for c in cols]
    span = [int(c.max()) - m + 1 for c, m in zip(cols, lo)]
    if np.prod(span, dtype=object) >= 2**62:  # no room for one int64 key: compare the rows
        u, inv = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
        return [u[:, i] for i in range(len(cols))], inv.reshape(-1)
    key = np.zeros(len(cols[0]), dtype=np.int64)
    for c, m, n in zip(cols, lo, span):  # mixed radix: the first column most significant
        key = key * n + (c - m)
    uk, inv = np.unique(key, return_inverse=True)
    out = []
    for m, n in zip(reversed(lo), reversed(span)):
        out.append(uk % n + m)
        uk = uk // n
    return out[::-1], inv.reshape(-1)


def _pick(totals: np.ndarray, tables: dict[str, np.ndarray], x: np.ndarray):
    """The winning moment per row (the first of equal totals, as np.argmax), its total, and its components: each
    table's (k, 6) coefficients of the winner times the row's features, so only the totals are evaluated for
    every moment."""
    win = np.argmax(totals, axis=0)
    top = totals[win, np.arange(totals.shape[1])]
    return win, top, {c: np.einsum("nf,fn->n", tab[win], x) for c, tab in tables.items()}


def _kept(moments, b: np.ndarray, s: np.ndarray) -> list:
    keep = prune(_moment_table(moments, _TRACED), int(b.min()), int(b.max()), int(s.min()), int(s.max()))
    return [moments[i] for i in keep]


# component -> kinds of storage it sums (master and optimizer state come from the catalogs)
_PARTS = {C.WEIGHTS: ("buffer",), C.GRADIENTS: ("grad",), C.ACTIVATIONS: ("input", "act"), C.TEMPORARY: ("temp",),
          C.KV_CACHE: ("kv",)}
_INFER_PARTS = {C.WEIGHTS: ("buffer",), C.KV_CACHE: ("kv",), C.TEMPORARY: ("input", "act", "temp", "grad")}


@formula("derived_peak_bytes", "max_k [W' + M + S + Σ_kinds live_k(b, s)], optimizer: W' + M + S + G + end(b, s) + "
         "T_opt", DERIVED, where="components/derived.py module docstring")
def train_rows(b: np.ndarray, s: np.ndarray, recipes: dict, states: dict, keys: np.ndarray,
               state_idx: np.ndarray) -> dict[str, np.ndarray]:
    """Training rows. recipes: {key: DerivedPlan} per traced recipe code; states: arrays per state code (W', M,
    S, T_opt, G); keys: per row the recipe code; state_idx: per row the state code. Returns the component arrays,
    peak and phase codes (0 forward, 1 backward, 2 optimizer)."""
    best = _Best(len(b))
    W, M, S, T, G, B = (states[x][state_idx] for x in ("W", "M", "S", "T", "G", "B"))  # B: DDP's buckets (_read)
    for key, plan in recipes.items():
        for r, rows in _regions(plan, b, s, keys == key):
            (bu, su), inv = _distinct(b[rows], s[rows])
            xu = _features(bu, su)
            moments = _kept(r.moments, bu, su)
            # the traced moments, per distinct shape (W' + M + S is the same at every moment of a row) ...
            tabs = {c: _moment_table(moments, ks) for c, ks in _PARTS.items()}
            if moments:
                win_u, top_u, comps_u = _pick(sum(tabs.values()) @ xu, tabs, xu)
                phase_u = np.array([0 if mo.phase == "forward" else 1 for mo in moments], dtype=np.int8)[win_u]
                top = top_u[inv]
            else:
                top = np.full(len(rows), np.iinfo(np.int64).min, dtype=np.int64)
            # ... then the optimizer step's, per row: what is live after backward, the gradients G, T_opt
            x = xu[:, inv]
            ends = {c: _coef(r.end, ks) @ x for c, ks in _PARTS.items()}
            ends[C.GRADIENTS] = G[rows].copy()
            ends[C.TEMPORARY] = ends[C.TEMPORARY] + T[rows]
            end_total = sum(ends.values())
            at_step = end_total > top  # a tie keeps the earlier moment, as np.argmax does
            comps = {c: np.where(at_step, ends[c], comps_u[c][inv] if moments else 0) for c in _PARTS}
            comps[C.WEIGHTS] += W[rows]
            comps[C.TEMPORARY] += B[rows]
            comps[C.MASTER_WEIGHTS], comps[C.OPTIMIZER_STATE] = M[rows], S[rows]
            phase = np.where(at_step, 2, phase_u[inv] if moments else 2).astype(np.int8)
            best.offer(rows, np.maximum(top, end_total) + W[rows] + M[rows] + S[rows] + B[rows], comps, phase)
    return best.result()


def infer_rows(b: np.ndarray, s: np.ndarray, dec: np.ndarray, recipes: dict, W: np.ndarray,
               keys: np.ndarray) -> dict[str, np.ndarray]:
    """Inference rows: the largest moment of the prefill (or a single forward) at (b, s), the first decode step at
    (b, s) where decode_tokens >= 1, and the last step at (b, s + decode_tokens − 2) where decode_tokens >= 2 (the
    traced second step at that cache length), each in the region that holds its own sequence length.
    W: per row the recipe's weights (W'); keys: per row the recipe code. Phase codes: 0 prefill, 1 decode."""
    best = _Best(len(b))
    for key, plan in recipes.items():
        mine = keys == key
        for phase in INFER_MOMENTS:
            phase_s = derivation.phase_length(phase, s, dec)
            for r, rows in _regions(plan, b, phase_s, mine & derivation.happens(phase, dec)):
                moments = [m for m in r.moments if m.phase == phase]
                if not moments:
                    continue
                (bu, pu, su), inv = _distinct(b[rows], phase_s[rows], s[rows])
                moments = _kept(moments, bu, pu)
                x = _features(bu, pu)
                tabs = {c: _moment_table(moments, ks) for c, ks in _INFER_PARTS.items()}
                # the prompt's ids stay at s while the cache grows
                inp, dx = _moment_table(moments, ("input",)), _features(bu, su) - x
                win, top, comps = _pick(sum(tabs.values()) @ x + inp @ dx, tabs, x)
                comps[C.TEMPORARY] += np.einsum("nf,fn->n", inp[win], dx)
                comps = {c: v[inv] for c, v in comps.items()}
                comps[C.WEIGHTS] += W[rows]
                codes = np.full(len(moments), 0 if phase in ("prefill", "forward") else 1, dtype=np.int8)
                best.offer(rows, top[inv] + W[rows], comps, codes[win][inv])
    return best.result()


# the inference moments in the order of a request (ties go to the earlier)
INFER_MOMENTS = ("forward", "prefill", "decode", "decode+")


# ---------------------------------------------------------------- frames (peak.py's entry points)

TRAIN_PHASES = ("forward", "backward", "optimizer")
HOST_PER_RANK = "host_per_rank"  # frame_components' host bytes of one rank where a layout offloads (peak.py: per node)
INFER_PHASES = ("prefill", "decode")


def _read(arch, mode: str, frame: pd.DataFrame, device: str, read_batch: bool = True):
    """(mode's recipes, states or W', recipe code per row, state code per row, b, s, decode_tokens)."""
    b = ints(frame, C.BATCH) if read_batch else None
    s = ints(frame, C.SEQ_LEN) if C.SEQ_LEN in frame.columns else np.ones(len(frame), dtype=np.int64)
    p_code, p_names = codes(frame, C.PRECISION)
    precs = precisions(p_names, mode)
    a_code, a_names = codes(frame, C.ATTENTION)
    if mode == "train":
        o_code, o_names = codes(frame, C.OPTIMIZER)
        i_code, i_names = codes(frame, C.OPTIMIZER_IMPL)
        c_code, c_names = codes(frame, C.CHECKPOINTING)
        z_code, z_names = codes(frame, C.ZERO_GRAD) if C.ZERO_GRAD in frame.columns else (0, ())
        l_code, ranks = _rank_layouts(frame)
        nA, nC = len(a_names), len(c_names)
        nK = len(p_names) * nA * nC * max(len(z_names), 1)  # recipe codes of one layout
        key = ((p_code.astype(np.int64) * nA + a_code) * nC + c_code) * max(len(z_names), 1) + z_code
        state = combine([p_code, o_code, i_code, a_code, c_code],
                        (len(p_names), len(o_names), len(i_names), nA, nC))
        nS = len(p_names) * len(o_names) * len(i_names) * nA * nC
        recipes, parts = {}, []
        for j, rank in enumerate(ranks):  # one GPU, or one rank of an FSDP layout: its own traced plans
            a_j = arch if rank in (None, DDP) else sharded(arch, *rank)
            rec_j, st_j = cached(a_j, ("derived-train", device, p_names, o_names, i_names, a_names, c_names,
                                       z_names),
                                 lambda a_j=a_j: train_inputs(a_j, precs, o_names, i_names, a_names, c_names, device,
                                                              progress=derive.progress_shown(), z_names=z_names))
            recipes.update({k + j * nK: v for k, v in rec_j.items()})
            # B: DDP's allreduce buckets, the trainable gradients once more (parallel/states.py ddp_bucket_bytes)
            parts.append({**st_j, "B": st_j["G"].copy()} if rank == DDP else st_j)
        states = {x: np.concatenate([p[x] for p in parts]) for x in parts[0]}
        return recipes, states, key + l_code * nK, state + l_code * nS, b, s, None
    if mode != "infer":
        raise UsageError(f"unknown mode {mode!r}; use train or infer")
    if C.CACHE_TOKENS in frame.columns and (ints(frame, C.CACHE_TOKENS) > 0).any():
        raise UsageError(f"{arch.name}: a preallocated cache (cache_tokens) is modelled for hand-modelled families; "
                         "a derived model runs generate()'s dynamic cache (leave cache_tokens at 0)")
    recipes, W = cached(arch, ("derived-infer", device, p_names, a_names),
                        lambda: infer_inputs(arch, precs, a_names, device, progress=derive.progress_shown()))
    key = p_code.astype(np.int64) * len(a_names) + a_code
    dec = ints(frame, C.DECODE_TOKENS) if C.DECODE_TOKENS in frame.columns else np.zeros(len(frame), np.int64)
    return recipes, W, key, key, b, s, dec


DDP = "ddp"  # a layout of _rank_layouts: every rank runs the whole step, wrapped in PyTorch's DDP


def _axis(frame: pd.DataFrame, col: str) -> np.ndarray:
    """A parallel column's values per row, its default (columns.PARALLEL_DEFAULTS) where the frame has none; the
    bool axes as bools (a CSV gives them back as text)."""
    if col not in frame.columns:
        return np.full(len(frame), C.PARALLEL_DEFAULTS[col])
    if col in C.PARALLEL_BOOL_AXES:
        return frame[col].astype(str).str.lower().to_numpy() == "true"
    if isinstance(C.PARALLEL_DEFAULTS[col], int):
        return ints(frame, col)
    return frame[col].astype(str).to_numpy()


def _ddp_rows(frame: pd.DataFrame) -> np.ndarray:
    """Rows whose ranks run PyTorch's DDP: data_parallel > 1 at zero_stage 0 (parallel/layout.py Layout.ddp; a
    derived model takes no other parallel axis)."""
    return (_axis(frame, C.DATA_PARALLEL) >= 2) & (_axis(frame, C.ZERO_STAGE) == 0)


def _rank_layouts(frame: pd.DataFrame) -> tuple[np.ndarray, list]:
    """Per row the code of its layout, and the layouts: None for one GPU (no data_parallel column, or one rank),
    DDP for data-parallel ranks at zero_stage 0 with DDP's buckets beside the gradients (with bucket views: one GPU's
    step with its gradients kept, with_kept_gradients), else (world, zero_stage, fsdp_version, offloaded, prefetch)
    of an FSDP layout, offloaded where FSDP1 offloads the parameters to the host (offload optimizer+params:
    workload/fsdp.py), prefetch FSDP1's backward_prefetch (pre or none) (peak.one_gpu passes only these parallel
    columns through for a derived model)."""
    d, z, v = _axis(frame, C.DATA_PARALLEL), _axis(frame, C.ZERO_STAGE), _axis(frame, C.FSDP_VERSION)
    off = _axis(frame, C.OFFLOAD) == C.OFFLOAD_PARAMS
    unfetched = (_axis(frame, C.BACKWARD_PREFETCH) == "none") & (v == 1)
    pair = np.zeros(len(frame), dtype=np.int64)  # 0: one GPU
    pair[_ddp_rows(frame) & ~_axis(frame, C.DDP_BUCKET_VIEW)] = 1
    fsdp = (d >= 2) & (z >= 2)
    pair[fsdp] = (((d[fsdp] * 4 + z[fsdp]) * 2 + (v[fsdp] == 1)) * 2 + off[fsdp]) * 2 + unfetched[fsdp]
    uniq, inv = np.unique(pair, return_inverse=True)
    return inv.astype(np.int64).reshape(-1), [None if u == 0 else DDP if u == 1 else
                                              (int(u // 32), int(u // 8 % 4), 1 if u // 4 % 2 else 2,
                                               bool(u // 2 % 2), "none" if u % 2 else "pre")
                                              for u in uniq]


def with_kept_gradients(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with zero_grad 'zeros' on every row that accumulates over several micro-batches (a column
    gradient_accumulation > 1): its gradients are kept through the later micro-batches, as zero_grad 'zeros' keeps
    them (the plan traced with them kept); 'nosync' where such a row's gradients are FSDP shards synced only at the
    last micro-batch (gradient_sync last, zero_stage 2 or 3 over data_parallel > 1: the plan traced with the whole
    unsharded gradients kept); 'zeros' too on the rows of PyTorch's DDP with gradient_as_bucket_view (ddp_bucket_view:
    the gradients are views of buckets that stay allocated between steps); the other rows' zero_grad as they are
    ('set_to_none' where the column is absent)."""
    # DDP with gradient_as_bucket_view: the gradients are views of buckets that stay allocated between steps
    kept = (_axis(frame, C.GRADIENT_ACCUMULATION) > 1) | (_ddp_rows(frame) & _axis(frame, C.DDP_BUCKET_VIEW))
    if not kept.any():
        return frame
    # parallel/layout.py Layout.unsharded_grads_kept, on sharded ranks
    unsynced = (_axis(frame, C.GRADIENT_SYNC) == "last") & (_axis(frame, C.DATA_PARALLEL) > 1) & \
        (_axis(frame, C.ZERO_STAGE) >= 2)
    given = frame[C.ZERO_GRAD].astype(str).to_numpy() if C.ZERO_GRAD in frame.columns else \
        np.full(len(frame), "set_to_none", dtype=object)
    return frame.assign(**{C.ZERO_GRAD: np.where(kept, np.where(unsynced, "nosync", "zeros"), given)})


def frame_inputs(arch, mode: str, frame: pd.DataFrame, device: str = "cuda"):
    """What the estimator reads for `frame`'s rows: (recipes {code: DerivedPlan}, states {W, M, S, T, G: arrays
    over state codes} (train) or W' per code (infer), recipe code per row, state code per row, b, s,
    decode_tokens (infer; None in training)). components/reserve.py replays the rows' plans from it."""
    return _read(arch, mode, frame, device)


def frame_components(arch, mode: str, frame: pd.DataFrame, device: str = "cuda") -> dict[str, object]:
    """Component columns, peak_allocated_bytes and peak_phase for every row (peak.estimate_components)."""
    recipes, states, key, state, b, s, dec = _read(arch, mode, frame, device)
    if mode == "train":
        out = train_rows(b, s, recipes, states, key, state)
        names = TRAIN_PHASES
        if states["H"].any():  # ranks offloading to the host (derived_inputs.offloaded_states)
            out[HOST_PER_RANK] = states["H"][state]
    else:
        out = infer_rows(b, s, dec, recipes, states[state], key)
        names = INFER_PHASES
    code = out.pop("phase_code")
    out[C.PEAK_PHASE] = pd.Categorical.from_codes(code, dtype=pd.CategoricalDtype(list(names)))
    return out


def frame_host(arch, frame: pd.DataFrame, device: str = "cuda") -> np.ndarray | None:
    """A training frame's host bytes per rank where a layout offloads to the host (derived_inputs.offloaded_states),
    batch-independent; None where none does."""
    _, states, _, state, *_ = _read(arch, "train", frame, device, read_batch=False)
    return states["H"][state] if states["H"].any() else None


def _groups(recipes: dict, mode: str, key: np.ndarray, s: np.ndarray, dec: np.ndarray) -> list:
    """(recipe key, region, moments kept (None: the optimizer step), their sequence length, rows) for every group
    of moments a row can peak at: moments are kept by the rows' sequence range and every batch of their region."""
    groups = []
    for k, plan in recipes.items():
        mine = key == k
        if not mine.any():
            continue
        for r in plan.regions:
            if mode == "train":
                sel = [(s, ("forward", "backward"), mine)]
            else:
                sel = [(derivation.phase_length(p, s, dec), (p,), mine & derivation.happens(p, dec))
                       for p in INFER_MOMENTS]
            for phase_s, names, rows_sel in sel:
                ms = [m for m in r.moments if m.phase in names]
                in_s = rows_sel & ((phase_s <= r.s_hi) if r.s_hi is not None else True)
                if not ms or not in_s.any():
                    continue
                sv = phase_s[in_s]
                keep = prune(_moment_table(ms, _TRACED), r.b_lo, r.b_hi or MAX_B, int(sv.min()), int(sv.max()))
                groups.append((k, r, [ms[i] for i in keep], phase_s, rows_sel))
            if mode == "train":
                groups.append((k, r, None, s, mine))  # the optimizer step
    return groups


def frame_phase_totals(arch, mode: str, frame: pd.DataFrame, device: str = "cuda"):
    """`at(b) -> (totals, names)`: every moment that can be a row's peak, as a phase of its own (-1 on rows where
    it does not apply: another recipe, another region), affine in b for the rows' sequence lengths. fit.py solves
    each for the largest batch; the list is the same at every b (moments are kept by the rows' sequence range
    and every batch of their region)."""
    recipes, states, key, state, _, s, dec = _read(arch, mode, frame, device, read_batch=False)
    n = len(s)
    groups = _groups(recipes, mode, key, s, dec)

    def at(b: np.ndarray):
        b = np.broadcast_to(np.asarray(b, dtype=np.int64), (n,))
        totals, labels = [], []
        for k, r, ms, phase_s, rows_sel in groups:
            idx = np.flatnonzero(rows_sel & _first_region(recipes[k], r, b, phase_s))
            bi, x = b[idx], _features(b[idx], phase_s[idx])
            if mode == "train":
                W, M, S, T, G = (states[v][state[idx]] for v in ("W", "M", "S", "T", "G"))
                base = W + M + S + states["B"][state[idx]]
                if ms is None:
                    vals = [base + G + T + np.asarray(_coef(r.end, ("buffer", "input", "act", "temp", "kv")),
                                                     dtype=np.int64) @ x]
                    names = ["optimizer"]
                else:
                    vals = list(_values(ms, _TRACED, x) + base)
                    names = [m.phase for m in ms]
            else:
                W = states[state[idx]]
                vals = list(_values(ms, _TRACED, x) + _values(ms, ("input",), _features(bi, s[idx]) - x) + W)
                names = [m.phase.rstrip("+") for m in ms]
            block = np.full((len(vals), n), -1, dtype=np.int64)  # -1: the moment does not apply to the row
            block[:, idx] = np.asarray(vals).reshape(len(vals), len(idx))
            totals.extend(block)
            labels.extend(names)
        return totals, labels

    return at


def _first_region(plan, r, b: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Rows whose first region (plan order) is r."""
    left = np.ones(len(b), dtype=bool)
    for reg in plan.regions:
        here = left & reg.holds(b, s)
        if reg is r:
            return here
        left &= ~here
    return np.zeros(len(b), dtype=bool)
