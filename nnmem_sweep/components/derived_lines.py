"""The batch search's lines of a derived plan (fit.py through peak.py): every moment of a recipe's region is a line
in b at fixed sequence lengths, so each group of moments is cut to its upper envelope in b, a few slots standing for
hundreds of moments."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd

from .derived import MAX_B, _TRACED, _coef, _distinct, _first_region, _groups, _moment_table, _read


def upper_envelope(alpha, beta, lo: int, hi: int) -> list[int]:
    """Indices of the lines α_i + β_i·b that are the largest somewhere on [lo, hi] (b real: a superset of the lines
    that win at an integer batch), in increasing slope. Exact: Python integers and fractions."""
    best: dict[int, int] = {}  # slope -> the index of its largest intercept (the first of equals)
    for i, (a, s) in enumerate(zip(alpha, beta)):
        j = best.get(int(s))
        if j is None or int(a) > int(alpha[j]):
            best[int(s)] = i
    hull: list[int] = []
    for i in sorted(best.values(), key=lambda i: int(beta[i])):
        while len(hull) >= 2:
            a1, s1 = int(alpha[hull[-2]]), int(beta[hull[-2]])
            a2, s2 = int(alpha[hull[-1]]), int(beta[hull[-1]])
            a3, s3 = int(alpha[i]), int(beta[i])
            if (a1 - a3) * (s2 - s1) <= (a1 - a2) * (s3 - s1):  # the middle line is never strictly on top
                hull.pop()
            else:
                break
        hull.append(i)
    keep = []
    for n, i in enumerate(hull):  # line n is on top between its crossings with its neighbours
        a, s = int(alpha[i]), int(beta[i])
        left = Fraction(a - int(alpha[hull[n - 1]]), int(beta[hull[n - 1]]) - s) if n else None
        right = Fraction(int(alpha[hull[n + 1]]) - a, s - int(beta[hull[n + 1]])) if n + 1 < len(hull) else None
        if (left is None or left <= hi) and (right is None or right >= lo):
            keep.append(i)
    return keep


def _lines(ms, terms) -> tuple[np.ndarray, np.ndarray]:
    """(α, β), each (k, shapes), of the moments at fixed sequence lengths: value = α + β·b (the features are affine
    in b). terms: [(kinds, features' part at b = 0, their b-coefficients)], summed."""
    alpha = sum(_moment_table(ms, kinds) @ f0 for kinds, f0, _ in terms)
    beta = sum(_moment_table(ms, kinds) @ f1 for kinds, _, f1 in terms)
    return alpha, beta


def _in_b(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The features (1, s, b, b·s, b·s², s²) as f0 + b·f1 for each s: (f0, f1), each (6, len(s))."""
    z, one = np.zeros_like(s), np.ones_like(s)
    return np.stack([one, s, z, z, z, s * s]), np.stack([z, z, one, s, s * s, z])


def frame_batch_lines(arch, mode: str, frame: pd.DataFrame, device: str = "cuda"):
    """`at(b) -> list of totals per row` for fit.py: like frame_phase_totals, but each group of moments (a recipe's
    region and phase) is cut to its upper envelope in b at each row's sequence lengths (every moment is a line in
    b at fixed s), so a few slots per group stand for its hundreds of moments. Slot j of a row is the j-th line of
    its envelope (the last repeated); the largest slot is the largest moment at every batch of the region."""
    recipes, states, key, state, _, s, dec = _read(arch, mode, frame, device, read_batch=False)
    n = len(s)
    slots = []  # (recipe key, region, rows, their phase lengths, α (J, rows), β (J, rows))
    for k, r, ms, phase_s, rows_sel in _groups(recipes, mode, key, s, dec):
        rows = np.flatnonzero(rows_sel)
        ps, sr = phase_s[rows], s[rows]
        if mode == "train":
            base = sum(states[v][state[rows]] for v in ("W", "M", "S", "B"))
            if ms is None:  # the optimizer step: one line
                f0, f1 = _in_b(ps)
                end = np.asarray(_coef(r.end, ("buffer", "input", "act", "temp", "kv")), dtype=np.int64)
                extra = base + states["G"][state[rows]] + states["T"][state[rows]]
                slots.append((k, r, rows, ps, (end @ f0 + extra)[None, :], (end @ f1)[None, :]))
                continue
        else:
            base = states[state[rows]]
        (pu, su), inv = _distinct(ps, sr)
        f0, f1 = _in_b(pu)
        terms = [(_TRACED, f0, f1)]
        if mode != "train":  # the prompt's ids stay at s while the cache grows
            g0, g1 = _in_b(su)
            terms.append((("input",), g0 - f0, g1 - f1))
        alpha, beta = _lines(ms, terms)
        hi = r.b_hi if r.b_hi is not None else MAX_B
        env = [upper_envelope(alpha[:, u], beta[:, u], r.b_lo, hi) for u in range(len(pu))]
        width = max(len(e) for e in env)
        pick = np.array([e + [e[-1]] * (width - len(e)) for e in env]).T  # (J, distinct shapes)
        cols = np.arange(len(pu))
        a = np.stack([alpha[pick[j], cols] for j in range(width)])[:, inv] + base
        bb = np.stack([beta[pick[j], cols] for j in range(width)])[:, inv]
        slots.append((k, r, rows, ps, a, bb))

    def at(b: np.ndarray) -> list[np.ndarray]:
        b = np.broadcast_to(np.asarray(b, dtype=np.int64), (n,))
        out = []
        for k, r, rows, ps, a, bb in slots:
            here = _first_region(recipes[k], r, b[rows], ps)
            block = np.full((len(a), n), -1, dtype=np.int64)
            block[:, rows[here]] = a[:, here] + bb[:, here] * b[rows[here]]
            out.extend(block)
        return out

    return at
