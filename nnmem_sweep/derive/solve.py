"""Solve traced bytes as integer polynomials in the shape, exactly.

Every allocation of a traced step has a size that is a polynomial in the batch b and the sequence length s with
integer coefficients over the monomials MONOMIALS (a tensor's bytes are a product of dims, each affine in b or s,
times its element size; an s×s mask or score matrix brings s² and b·s²). Traced at several probe shapes, the
sizes of the same allocation solve for those coefficients; a probe left out of the solve checks them.
"""
from __future__ import annotations

import numpy as np

# The monomials, in components/terms.Term's coefficient order: const, pos (s), seq (b), tok (b·s), s2 (b·s²), sq (s²).
MONOMIALS = ("1", "s", "b", "b·s", "b·s²", "s²")


class NotPolynomial(ValueError):
    """Traced sizes that no integer polynomial over MONOMIALS reproduces."""


def features(b, s) -> np.ndarray:
    """(len(b), 6) int64: the monomials at each (b, s)."""
    b = np.asarray(b, dtype=np.int64)
    s = np.asarray(s, dtype=np.int64)
    return np.stack([np.ones_like(b), s, b, b * s, b * s * s, s * s], axis=-1)


def solve(shapes: list[tuple[int, int]], sizes: np.ndarray, used: tuple[int, ...] | None = None) -> np.ndarray:
    """Integer coefficients (6, n) with features(shapes) @ coef == sizes exactly.

    sizes: (len(shapes), n) int64, one column per allocation. `used`: the monomials allowed (indices into
    MONOMIALS); the others are 0 (at b = 1 the b-monomials coincide with the s-monomials, so only 1, s, s² can be
    told apart). As many shapes as monomials used: the square system is solved in exact rational arithmetic
    (probes one token apart at s ~ 4096 are far too ill-conditioned for floating point). Raises NotPolynomial
    naming the first column whose solution is not integer or does not reproduce its sizes."""
    used = tuple(range(len(MONOMIALS))) if used is None else used
    b, s = (np.array(x, dtype=np.int64) for x in zip(*shapes))
    x = features(b, s)
    xu = [[int(v) for v in row] for row in x[:, used]]
    if len(xu) != len(used):
        raise ValueError(f"{len(shapes)} probe shapes for {len(used)} monomials: give one shape per monomial")
    inv = _inverse(xu)
    if inv is None:
        raise ValueError(f"probe shapes {shapes} cannot tell the monomials {[MONOMIALS[i] for i in used]} apart")
    det, adj = inv
    y = sizes.astype(object)
    num = np.array(adj, dtype=object) @ y  # det · coefficients, exact Python integers
    coef = np.zeros((len(MONOMIALS), sizes.shape[1]), dtype=np.int64)
    ok = np.array([all(v % det == 0 for v in col) for col in num.T], dtype=bool) if num.size else np.ones(0, bool)
    if not ok.all():
        j = int(np.flatnonzero(~ok)[0])
        raise NotPolynomial(f"allocation {j}: sizes {sizes[:, j].tolist()} at (b, s) = {shapes} are not an "
                            f"integer polynomial in {', '.join(MONOMIALS[i] for i in used)}")
    coef[list(used)] = (num // det).astype(np.int64)
    bad = np.flatnonzero((x @ coef != sizes).any(axis=0))
    if len(bad):  # cannot happen for a square system solved exactly; kept as the contract's check
        raise NotPolynomial(f"allocation {int(bad[0])}: sizes {sizes[:, int(bad[0])].tolist()} at (b, s) = {shapes} "
                            "are not reproduced")
    return coef


def _inverse(m: list[list[int]]):
    """(det, adjugate) of an integer square matrix (det · m⁻¹ = adjugate, integers), or None when singular:
    Gauss-Jordan elimination over Fractions."""
    from fractions import Fraction

    n = len(m)
    a = [[Fraction(v) for v in row] + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(m)]
    det = Fraction(1)
    for c in range(n):
        p = next((r for r in range(c, n) if a[r][c] != 0), None)
        if p is None:
            return None
        if p != c:
            a[c], a[p] = a[p], a[c]
            det = -det
        det *= a[c][c]
        piv = a[c][c]
        a[c] = [v / piv for v in a[c]]
        for r in range(n):
            if r != c and a[r][c] != 0:
                f = a[r][c]
                a[r] = [v - f * w for v, w in zip(a[r], a[c])]
    d = int(det)
    return abs(d), [[int(v * det) * (1 if d > 0 else -1) for v in row[n:]] for row in a]


def check(shape: tuple[int, int], sizes: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """Columns whose predicted size at `shape` differs from the traced one (empty when the solve holds)."""
    pred = features([shape[0]], [shape[1]]) @ coef
    return np.flatnonzero(pred[0] != sizes)


def nonneg_on(q: tuple[int, int, int], lo: int) -> bool:
    """Whether a + b·s + c·s² >= 0 for every integer s >= lo (exact, Python ints)."""
    a, b, c = (int(v) for v in q)
    if c < 0 or (c == 0 and b < 0):
        return False
    val = lambda s: a + b * s + c * s * s  # noqa: E731
    if val(lo) < 0:
        return False
    if c == 0:
        return True
    # vertex at -b / 2c: the minimum over integers >= lo is at the integer next to it, or at lo
    v = -b // (2 * c)
    return all(val(s) >= 0 for s in (v, v + 1) if s >= lo)


def dominates(p: np.ndarray, q: np.ndarray, b_lo: int, b_hi: int | None, s_lo: int) -> bool:
    """Whether polynomial p >= q (coefficient vectors over MONOMIALS) at every integer b in [b_lo, b_hi]
    (b_hi None: unbounded) and s >= s_lo. Exact: the difference is affine in b, A(s) + b·B(s), so it suffices that
    it holds at b_lo and, for b unbounded, that B(s) >= 0 (else at b_hi)."""
    d = [int(x) for x in (np.asarray(p, dtype=np.int64) - np.asarray(q, dtype=np.int64))]
    c0, cs, cb, cbs, cbs2, css = d
    at = lambda b: (c0 + cb * b, cs + cbs * b, css + cbs2 * b)  # noqa: E731  a, b, c of the quadratic in s
    if not nonneg_on(at(b_lo), s_lo):
        return False
    if b_hi is None:
        return nonneg_on((cb, cbs, cbs2), s_lo)
    return nonneg_on(at(b_hi), s_lo)
