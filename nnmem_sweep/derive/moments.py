"""From probe traces to the moments that can hold a step's peak: the upper envelope of the live bytes.

Traced at several shapes, a step is the same program (the same events in the same order); only sizes change.
Each allocation's size solves as a polynomial (solve.py), so the live bytes after every event, split by kind of
storage, are polynomials too (sums of the live allocations'). The peak over the step is the largest of them at
the row's (b, s); most events can never be that largest, and are dropped:
  - an allocation followed by another allocation is below it everywhere (sizes are never negative);
  - an event whose every coefficient is at most another's is below it everywhere (every monomial is >= 0);
  - an event that another beats at every b and s of the region (solve.dominates, exact) is dropped.
What is left is a handful of moments; the estimator evaluates each per row and takes the largest.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kinds import ACT, BUFFER, GRAD, INPUT, KV, PARAM, TEMP
from .solve import MONOMIALS, dominates

KINDS = (PARAM, BUFFER, INPUT, GRAD, ACT, TEMP, KV)


@dataclass(frozen=True)
class Moment:
    phase: str  # forward | backward (| prefill | decode)
    event: int  # index in the trace
    op: str  # the aten op whose output made this moment
    live: dict[str, tuple[int, ...]]  # kind -> coefficients over MONOMIALS

    def total(self) -> np.ndarray:
        return np.sum([np.array(v, dtype=np.int64) for v in self.live.values()], axis=0)


def live_by_kind(events: np.ndarray, alloc_kind: list[str], coef: np.ndarray) -> dict[str, np.ndarray]:
    """kind -> (n_events, 6) coefficients of the live bytes of that kind after each event. coef: (6, n_alloc)."""
    n = len(events)
    sign = np.where(events[:, 1] > 0, 1, -1)
    alloc_index = {}  # storage id -> its allocation's column (the latest allocation of that id)
    col = np.empty(n, dtype=np.int64)
    j = 0
    for i, (sid, nb) in enumerate(events.tolist()):
        if nb > 0:
            alloc_index[sid] = j
            col[i] = j
            j += 1
        else:
            col[i] = alloc_index[sid]
    kinds = np.array(alloc_kind)[col]
    deltas = coef.T[col] * sign[:, None]
    out = {}
    for k in KINDS:
        d = np.where((kinds == k)[:, None], deltas, 0)
        out[k] = np.cumsum(d, axis=0)
    return out


def candidates(events: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Allocation events in [lo, hi) not followed by another allocation."""
    alloc = events[:, 1] > 0
    nxt = np.append(alloc[1:], False)
    idx = np.flatnonzero(alloc & ~nxt)
    return idx[(idx >= lo) & (idx < hi)]


def envelope(total: np.ndarray, idx: np.ndarray, b_lo: int, b_hi: int | None, s_lo: int) -> list[int]:
    """The events of idx (rows of total: (n_events, 6)) that no other beats everywhere on the region."""
    pts = total[idx]
    # elementwise dominance, in chunks: i is dropped if some j >= it in every coefficient and differs
    keep = np.ones(len(idx), dtype=bool)
    order = np.argsort(-pts[:, 0], kind="stable")
    pts_o = pts[order]
    for a in range(0, len(pts_o), 512):
        blk = pts_o[a:a + 512]
        ge = (pts_o[None, :, :] >= blk[:, None, :]).all(axis=2)
        ne = (pts_o[None, :, :] != blk[:, None, :]).any(axis=2)
        # equal points: keep the first (earliest in order) only
        same = ~ne
        first_same = np.argmax(same, axis=1)
        dom = (ge & ne).any(axis=1) | (first_same < np.arange(a, a + len(blk)))
        keep[order[a:a + len(blk)]] &= ~dom
    rest = [int(i) for i in idx[keep]]
    # exact dominance on the region
    out = []
    for i in rest:
        if not any(j != i and dominates(total[j], total[i], b_lo, b_hi, s_lo) and
                   not (dominates(total[i], total[j], b_lo, b_hi, s_lo) and j > i) for j in rest):
            out.append(i)
    return out


def moments(events: np.ndarray, ops: list[str], alloc_kind: list[str], coef: np.ndarray,
            phases: list[tuple[str, int, int]], b_lo: int, b_hi: int | None, s_lo: int) -> list[Moment]:
    """The moments of each phase (name, first event, end event) that can hold the peak on the region."""
    live = live_by_kind(events, alloc_kind, coef)
    total = sum(live.values())
    out = []
    for name, lo, hi in phases:
        for i in envelope(total, candidates(events, lo, hi), b_lo, b_hi, s_lo):
            out.append(Moment(name, i, ops[i], {k: tuple(int(x) for x in live[k][i]) for k in KINDS}))
    return out


def describe(m: Moment) -> str:
    tot = m.total()
    terms = [f"{c:+,}·{mono}" for c, mono in zip(tot.tolist(), MONOMIALS) if c]
    return f"{m.phase}@{m.event} ({m.op}): " + " ".join(terms)
