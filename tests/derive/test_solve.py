"""derive/solve.py: exact integer polynomials from probe sizes, and exact dominance on a region."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnmem_sweep.derive import solve

PROBES = [(b, s) for s in (64, 96, 128) for b in (2, 3)]


def test_solve_recovers_the_bytes_of_typical_tensors():
    # a (b, s, 768) fp32 activation, a (b, s-1) int64 shifted label copy, a (b, 12, s, s) bf16 score matrix,
    # a (s, s) bool causal mask, a (768, 768) weight: their bytes are polynomials in b and s
    def sizes(b, s):
        return [4 * b * s * 768, 8 * b * (s - 1), 2 * b * 12 * s * s, s * s, 4 * 768 * 768]

    y = np.array([sizes(b, s) for b, s in PROBES], dtype=np.int64)
    coef = solve.solve(PROBES, y)
    assert coef[:, 0].tolist() == [0, 0, 0, 3072, 0, 0]
    assert coef[:, 1].tolist() == [0, 0, -8, 8, 0, 0]
    assert coef[:, 2].tolist() == [0, 0, 0, 0, 24, 0]
    assert coef[:, 3].tolist() == [0, 0, 0, 0, 0, 1]
    assert coef[:, 4].tolist() == [2359296, 0, 0, 0, 0, 0]
    # and they predict a shape far from the probes exactly
    assert not len(solve.check((7, 8192), np.array(sizes(7, 8192), dtype=np.int64), coef))


def test_solve_refuses_what_no_polynomial_gives():
    y = np.array([[b * s * 4 + (s // 100)] for b, s in PROBES], dtype=np.int64)  # a step in s
    with pytest.raises(solve.NotPolynomial, match="allocation 0"):
        solve.solve(PROBES, y)


def test_batch_one_solves_in_s_only():
    shapes = [(1, 64), (1, 96), (1, 128)]
    y = np.array([[4 * s * 768 + 2 * 12 * s * s] for _, s in shapes], dtype=np.int64)
    coef = solve.solve(shapes, y, used=(0, 1, 5))
    assert coef[:, 0].tolist() == [0, 3072, 0, 0, 0, 24]


def test_probes_that_cannot_tell_the_monomials_apart_are_refused():
    with pytest.raises(ValueError, match="cannot tell"):
        solve.solve([(2, 64)] * 6, np.zeros((6, 1), dtype=np.int64))


coef = st.integers(-10**6, 10**6)


@settings(max_examples=300, deadline=None)
@given(p=st.tuples(*[coef] * 6), q=st.tuples(*[coef] * 6), b_lo=st.integers(1, 3), s_lo=st.integers(1, 40))
def test_dominates_agrees_with_brute_force(p, q, b_lo, s_lo):
    """Exact: when it says p >= q on the region, it is so at every point checked; when it says not, some point
    of the region has p < q: near the corner, or far out in b or s (coefficients are at most 10^6, so a sign
    change happens before 10^13)."""
    p, q = np.array(p), np.array(q)
    claim = solve.dominates(p, q, b_lo, None, s_lo)
    far = [10**k for k in range(1, 14)]
    pts = [(b, s) for b, s in itertools.product(range(b_lo, b_lo + 30), range(s_lo, s_lo + 300))]
    pts += [(b, s) for b in [b_lo, b_lo + 1, *far] for s in [s_lo, s_lo + 1, *far]]
    d = [int(v) for v in (p - q)]
    for b in [b_lo, *far]:  # the integer points next to the quadratic's vertex in s, at each b
        a1, a2 = d[1] + d[3] * b, d[5] + d[4] * b
        if a2 > 0:
            v = -a1 // (2 * a2)
            pts += [(b, max(s_lo, v)), (b, max(s_lo, v + 1))]
    pts = [(b, s) for b, s in pts if b >= b_lo and s >= s_lo]
    diff = [d[0] + d[1] * s + d[2] * b + d[3] * b * s + d[4] * b * s * s + d[5] * s * s for b, s in pts]
    assert (min(diff) >= 0) == claim
