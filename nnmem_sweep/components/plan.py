"""The plan machinery: per phase of a step and per memory component, the Term coefficients of every combination of
the names in a frame (precision, optimizer, ...), evaluated for every row at once.

Every memory term is a polynomial in the batch b and the sequence length s with the coefficients of Term
(components/terms.py, `COEFFICIENTS`). Everything that depends only on the model and on the names in the frame is a
plan, built once per (architecture, names) and cached (`cached`). A call reads the name columns (`codes`), forms one
combination code per row (`combine`, row-major over `Plan.sizes`) and evaluates:

    Plan.phase_totals(k, b, s)  every phase's total, (phases, rows)
    Plan.pick(k, b, s)          the winning phase per row (np.argmax over the phase totals: the first phase on ties),
                                its components, peak_allocated_bytes and peak_phase

Building a plan (components/train_plan.py, components/infer_plan.py and parallel/plan.py do; any other source of
coefficients can, e.g. polynomials traced from a model):

    Plan(axes, sizes, phases)
      axes    the frame columns whose codes form the combination code, e.g. (C.PRECISION, C.OPTIMIZER)
      sizes   how many names each axis has in the frame (its codes run 0 .. size - 1, as `codes` numbers them)
      phases  [(phase name, {component: coefficients}), ...] in the order ties go; a component is a column of
              columns.COMPONENTS, its coefficients an int64 array of shape (*sizes, len(COEFFICIENTS)): for every
              combination of names the bytes const + s·pos + b·seq + b·s·tok + b·s²·s2 + s²·sq.
              A phase may leave components out (0 there); names may repeat (several backward moments), the
              peak_phase label is the name.

`terms_array`, `consts` and `lift` build such arrays from Terms, from plain byte counts, and spread over more axes.
`pick_phases` picks the winner where the phase totals are arrays already (transformer inference).
"""
from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from .. import columns as C
from ..catalog.precisions import Precision, get_precision
from ..errors import UsageError
from ..models.arch import Architecture
from .terms import COEFFICIENTS, Term

NCOEF = len(COEFFICIENTS)
_PLAN_CACHE_SIZE = 64


# ---------------------------------------------------------------- reading the frame

def ints(frame: pd.DataFrame, col: str) -> np.ndarray:
    return frame[col].to_numpy(dtype=np.int64)


def codes(frame: pd.DataFrame, col: str) -> tuple[np.ndarray, tuple]:
    """Integer codes and their values for a (categorical or plain) column."""
    v = frame[col]
    if isinstance(v.dtype, pd.CategoricalDtype):
        return v.cat.codes.to_numpy(), tuple(v.cat.categories)
    found, uniques = pd.factorize(v, sort=False)
    return found, tuple(uniques)


def combine(codes_of_axes: list[np.ndarray], sizes: tuple[int, ...]) -> np.ndarray:
    """One code per row (intp, the take index) for the combination of names, row-major over `sizes` (axes of one
    name add nothing)."""
    live = [(c, m) for c, m in zip(codes_of_axes, sizes) if m > 1]
    if not live:
        return np.zeros(len(codes_of_axes[0]), dtype=np.intp)
    if len(live) == 1:
        return live[0][0].astype(np.intp)
    return np.ravel_multi_index([c for c, _ in live], [m for _, m in live])


# ---------------------------------------------------------------- coefficient arrays

def terms_array(terms: list[Term], shape: tuple[int, ...]) -> np.ndarray:
    """Terms as an int64 array (*shape, NCOEF), the coefficients in COEFFICIENTS order."""
    return np.array([t.coefficients() for t in terms], dtype=np.int64).reshape(*shape, NCOEF)


def consts(values: list[int], shape: tuple[int, ...]) -> np.ndarray:
    """Byte counts independent of batch and sequence as an int64 array (*shape, NCOEF)."""
    out = np.zeros((*shape, NCOEF), dtype=np.int64)
    out[..., 0] = np.array(values, dtype=np.int64).reshape(shape)
    return out


def lift(arr: np.ndarray, dims: tuple[int, ...], sizes: tuple[int, ...]) -> np.ndarray:
    """A (*sizes of dims, NCOEF) array spread over every combination of `sizes` (dims ascending)."""
    shape = [sizes[i] if i in dims else 1 for i in range(len(sizes))]
    return np.broadcast_to(arr.reshape(*shape, NCOEF), (*sizes, NCOEF))


def features(b: np.ndarray, s: np.ndarray) -> list:
    """The row factor of each coefficient, in COEFFICIENTS order (None: the constant's 1): 1, s, b, b·s, b·s², s²."""
    bs = b * s
    return [None, s, b, bs, bs * s, s * s]


BLOCK_ROWS = 1 << 13  # rows a Table evaluates at once (a 1 M-row frame in one pass: 40 % longer; bench/README.md)


class Table:
    """m Terms per index, from an (N, m, NCOEF) coefficient array: eval(idx, x) gives, for every row r, the bytes of
    Term j at index idx[r], as an (m, rows) int64 array (x: `features(b, s)`). Integer arithmetic in int64, so exact
    (bounds.py keeps every total far below 2^63). Each coefficient is evaluated only over the Terms from the first to
    the last where it is not zero at some index."""

    def __init__(self, arr: np.ndarray):
        self.m = arr.shape[1]
        self.coef = []  # (coefficient, the Terms that use it: a slice, their table: (Terms, N))
        for f in range(arr.shape[2]):
            used = np.flatnonzero(arr[..., f].any(axis=0))
            if len(used):
                terms = slice(int(used[0]), int(used[-1]) + 1)
                self.coef.append((f, terms, np.ascontiguousarray(arr[:, terms, f].T)))

    def eval(self, idx: np.ndarray, x: list) -> np.ndarray:
        n = len(idx)
        out = np.zeros((self.m, n), dtype=np.int64)
        for lo in range(0, n, BLOCK_ROWS):  # a block's partial products stay in the CPU's cache
            hi = min(lo + BLOCK_ROWS, n)
            block, rows = out[:, lo:hi], idx[lo:hi]
            for f, terms, table in self.coef:
                part = table.take(rows, axis=1)
                if x[f] is not None:
                    part *= x[f][lo:hi] if np.ndim(x[f]) else x[f]
                block[terms] += part
        return out


class TermTable(Table):
    """One Term per combination code (transformer inference): eval gives one value per row, `coefficient(name)` the
    per-code coefficient of that name (COEFFICIENTS)."""

    def __init__(self, terms: list[Term]):
        arr = terms_array(terms, (len(terms), 1))
        super().__init__(arr)
        self.arr = arr[:, 0]

    def eval(self, idx: np.ndarray, b: np.ndarray, s: np.ndarray) -> np.ndarray:
        return super().eval(idx, features(b, s))[0]

    def coefficient(self, name: str) -> np.ndarray:
        return self.arr[:, COEFFICIENTS.index(name)]


# ---------------------------------------------------------------- plans

class Plan:
    """The phases of a step over every combination of the names on `axes` (see the module docstring)."""

    def __init__(self, axes: tuple[str, ...], sizes: tuple[int, ...], phases: list[tuple[str, dict]]):
        self.axes, self.sizes = axes, sizes
        self.nk = int(np.prod(sizes))
        self.names = names = [p[0] for p in phases]
        # totals: (combination, phase, NCOEF)
        self.totals = Table(np.stack([sum(comps.values()).reshape(-1, NCOEF) for _, comps in phases], axis=1))
        # components of each phase: (phase · combination, component, NCOEF); a single phase keeps only its own
        self.comp_names = list(phases[0][1]) if len(phases) == 1 else list(C.COMPONENTS)
        zero = np.zeros((self.nk, NCOEF), dtype=np.int64)
        self.comps = Table(np.concatenate([np.stack([pc[c].reshape(-1, NCOEF) if c in pc else zero
                                                     for c in self.comp_names], axis=1) for _, pc in phases]))
        uniq = list(dict.fromkeys(names))
        self.label = np.array([uniq.index(p) for p in names], dtype=np.int8)
        self.dtype = pd.CategoricalDtype(uniq)
        self.host: np.ndarray | None = None  # parallel plans: host bytes per rank, per combination
        self.seq_divisor: np.ndarray | None = None  # parallel plans: s_l = s / divisor, per layout
        # the s² coefficient (Term.sq, an s × s mask shared by the batch) counts only where s >= sq_from: a mask
        # transformers materialises from a threshold on (the sliding window, activations.sliding_window_mask)
        self.sq_from: int | None = None

    def features(self, k: np.ndarray, b: np.ndarray, s: np.ndarray) -> list:
        x = features(b, s)
        if self.sq_from:
            whole = s  # the threshold is on the whole sequence; a parallel plan is evaluated on the rank's s / divisor
            if self.seq_divisor is not None:  # the layout is the last axis of the combination code
                whole = s * self.seq_divisor[k % len(self.seq_divisor)]
            x[5] = np.where(whole >= self.sq_from, x[5], 0)
        return x

    def phase_totals(self, k: np.ndarray, b: np.ndarray, s: np.ndarray) -> np.ndarray:
        """(phases, rows) totals."""
        return self.totals.eval(k, self.features(k, b, s))

    def pick(self, k: np.ndarray, b: np.ndarray, s: np.ndarray) -> dict[str, object]:
        """Components of the winning phase, peak_allocated_bytes and peak_phase."""
        x = self.features(k, b, s)
        win, peak = first_max(self.totals.eval(k, x))
        out: dict[str, object] = dict(zip(self.comp_names, self.comps.eval(win * self.nk + k, x)))
        out[C.PEAK_ALLOCATED] = peak  # the winner's total
        out[C.PEAK_PHASE] = pd.Categorical.from_codes(self.label[win], dtype=self.dtype)
        return out


def first_max(totals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the first row of the largest value, that value) per column of a (phases, rows) array: argmax and max along
    axis 0, in one pass a phase at a time (a strided argmax over a 1 M-row frame took a fifth of the estimate)."""
    peak = totals[0].copy()
    win = np.zeros(totals.shape[1], dtype=np.intp)
    for j in range(1, len(totals)):
        win[totals[j] > peak] = j  # strictly larger: the first phase keeps a tie
        np.maximum(peak, totals[j], out=peak)
    return win, peak


def pick_phases(phase_totals: list[np.ndarray], phase_components: list[dict[str, np.ndarray]],
                phase_names: list[str], n: int) -> dict[str, object]:
    """Plan.pick for phases evaluated already: the components of the phase with the largest total (the first one
    on ties); a component a phase does not hold is 0 there."""
    win, peak = first_max(np.stack(phase_totals))
    out: dict[str, object] = {}
    for comp in C.COMPONENTS:
        per_phase = np.stack([np.broadcast_to(pc.get(comp, 0), (n,)) for pc in phase_components])
        out[comp] = np.take_along_axis(per_phase, win[None], axis=0)[0]
    out[C.PEAK_ALLOCATED] = peak  # the winner's total
    uniq = list(dict.fromkeys(phase_names))
    labels = np.array([uniq.index(p) for p in phase_names], dtype=np.int8)
    out[C.PEAK_PHASE] = pd.Categorical.from_codes(labels[win], dtype=pd.CategoricalDtype(uniq))
    return out


# ---------------------------------------------------------------- plans cached per (architecture, names)

_PLANS: dict[tuple, tuple[Architecture, object]] = {}


def cached(arch: Architecture, key: tuple, build):
    """build() once per (architecture object, key). Keyed by identity (a frozen Architecture can be large to hash);
    the entry keeps the architecture alive, so its id cannot be reused while the entry stands."""
    full = (id(arch), *key)
    hit = _PLANS.get(full)
    if hit is not None and hit[0] is arch:
        return hit[1]
    plan = build()
    if len(_PLANS) >= _PLAN_CACHE_SIZE:
        _PLANS.clear()
    _PLANS[full] = (arch, plan)
    return plan


@functools.lru_cache(maxsize=256)
def precisions(names: tuple, mode: str) -> tuple[Precision, ...]:
    """The precision recipes of these names; training refuses the quantised inference-only ones."""
    precs = [get_precision(n) for n in names]
    if mode == "train":
        bad = [p.name for p in precs if p.infer_only]
        if bad:
            raise UsageError(f"precision {', '.join(bad)} stores quantised weights for inference only; "
                             "use mode: infer or a training recipe (fp32, bf16, fp16, bf16-mixed, fp16-mixed, bf16-master)")
    return tuple(precs)
