"""The plan machinery on hand-counted plans: every phase total evaluated, the winner by np.argmax over the phases
(the first phase on ties), the winner's components; and the coefficient tables against the Term polynomial in exact
Python integers."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nnmem_sweep import columns as C
from nnmem_sweep.components.plan import Plan, Table, features


def _term(const=0, pos=0, seq=0, tok=0, s2=0):
    return np.array([[const, pos, seq, tok, s2]], dtype=np.int64)  # one combination


def _plan():
    # forward: 10 + 2·b·s; backward: 10 + 3·b·s; optimizer: 5
    return Plan((C.PRECISION,), (1,), [
        ("forward", {C.WEIGHTS: _term(10), C.ACTIVATIONS: _term(tok=2)}),
        ("backward", {C.WEIGHTS: _term(10), C.ACTIVATIONS: _term(tok=3)}),
        ("optimizer", {C.WEIGHTS: _term(4), C.TEMPORARY: _term(1)}),
    ])


def _pick(plan, b, s):
    b, s = np.array(b, dtype=np.int64), np.array(s, dtype=np.int64)
    return plan.pick(np.zeros(len(b), dtype=np.intp), b, s)


def test_the_largest_phase_wins_with_its_components():
    got = _pick(_plan(), [1, 2], [2, 8])
    # backward: 10 + 3 x 1 x 2 = 16; 10 + 3 x 2 x 8 = 58 (forward 14 and 42, optimizer 5)
    assert got[C.PEAK_ALLOCATED].tolist() == [16, 58] and list(got[C.PEAK_PHASE]) == ["backward"] * 2
    assert got[C.ACTIVATIONS].tolist() == [6, 48] and got[C.WEIGHTS].tolist() == [10, 10]
    assert got[C.TEMPORARY].tolist() == [0, 0]


def test_a_tie_goes_to_the_first_phase():
    # b = 0: forward 10, backward 10, optimizer 5: the tie goes to forward
    got = _pick(_plan(), [0, 1], [8, 8])
    assert list(got[C.PEAK_PHASE]) == ["forward", "backward"] and got[C.PEAK_ALLOCATED].tolist() == [10, 34]


def test_identical_phases_go_to_the_first_one():
    same = {C.WEIGHTS: _term(7), C.ACTIVATIONS: _term(tok=1)}
    plan = Plan((C.PRECISION,), (1,), [("forward", same), ("backward", dict(same)), ("optimizer", dict(same))])
    got = _pick(plan, [1, 3], [4, 4])
    assert list(got[C.PEAK_PHASE]) == ["forward"] * 2 and got[C.PEAK_ALLOCATED].tolist() == [11, 19]


def test_a_phase_that_ties_in_one_combination_wins_there():
    # two precisions: forward 10 + 2·b·s or 10 + 3·b·s; backward 10 + 3·b·s in both: in the second combination they
    # tie on every row, and the tie goes to forward
    two = np.array([[10, 0, 0, 2, 0], [10, 0, 0, 3, 0]], dtype=np.int64)
    plan = Plan((C.PRECISION,), (2,), [("forward", {C.ACTIVATIONS: two}),
                                        ("backward", {C.ACTIVATIONS: _term(10, tok=3).repeat(2, axis=0)})])
    got = plan.pick(np.array([0, 1], dtype=np.intp), np.array([2, 2]), np.array([5, 5]))
    assert list(got[C.PEAK_PHASE]) == ["backward", "forward"] and got[C.PEAK_ALLOCATED].tolist() == [40, 40]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 5), m=st.integers(1, 6))
def test_table_is_the_polynomial_in_exact_integers(data, n, m):
    coef = st.integers(-(1 << 20), 1 << 20) | st.just(0)
    arr = np.array(data.draw(st.lists(st.lists(st.lists(coef, min_size=5, max_size=5), min_size=m, max_size=m),
                                      min_size=n, max_size=n)), dtype=np.int64)
    r = data.draw(st.integers(0, 12))
    idx = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=r, max_size=r)), dtype=np.intp)
    b = np.array(data.draw(st.lists(st.integers(0, 4096), min_size=r, max_size=r)), dtype=np.int64)
    s = np.array(data.draw(st.lists(st.integers(0, 4096), min_size=r, max_size=r)), dtype=np.int64)
    want = [[int(arr[i, j, 0]) + int(s[x]) * int(arr[i, j, 1]) + int(b[x]) * int(arr[i, j, 2])
             + int(b[x]) * int(s[x]) * int(arr[i, j, 3]) + int(b[x]) * int(s[x]) ** 2 * int(arr[i, j, 4])
             for x, i in enumerate(idx)] for j in range(m)]
    assert Table(arr).eval(idx, features(b, s)).tolist() == want
