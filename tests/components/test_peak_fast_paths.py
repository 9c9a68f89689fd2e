"""The estimator's fast evaluation (issue 6's speed target) gives the bits of the plain one: the _Rows program
(gathers written into place, zero rows), the encoded winner (2^q · total + rank, no argmax) and the phases left
out because another always wins over them. Hand-counted plans first, then properties against exact Python ints
and against the argmax over every phase."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnmem_sweep import columns as C
from nnmem_sweep.components import peak
from nnmem_sweep.components.peak import _Plan, _Rows, _prepare
from nnmem_sweep.grid import expand_grid

from .tiny_models import TINY_GPT2, TINY_LLAMA, scenario


def _term(const=0, pos=0, seq=0, tok=0, s2=0):
    return np.array([[const, pos, seq, tok, s2]], dtype=np.int64)  # one combination


def _plan():
    # forward: 10 + 2·b·s; backward: 10 + 3·b·s; optimizer: 5. Backward wins over forward wherever b·s >= 1 (and
    # comes later, so only a strictly larger total counts), and over the optimizer always (it comes first).
    return _Plan((C.PRECISION,), (1,), [
        ("forward", {C.WEIGHTS: _term(10), C.ACTIVATIONS: _term(tok=2)}),
        ("backward", {C.WEIGHTS: _term(10), C.ACTIVATIONS: _term(tok=3)}),
        ("optimizer", {C.WEIGHTS: _term(4), C.TEMPORARY: _term(1)}),
    ])


def _pick(plan, b, s):
    b, s = np.array(b, dtype=np.int64), np.array(s, dtype=np.int64)
    return plan.pick(np.zeros(len(b), dtype=np.intp), b, s)


def test_phases_that_cannot_win_are_left_out_of_the_encoded_totals():
    plan = _plan()
    assert plan.enc is not None and plan.enc.m == 1  # only backward is evaluated
    got = _pick(plan, [1, 2], [2, 8])
    # backward: 10 + 3 x 1 x 2 = 16; 10 + 3 x 2 x 8 = 58
    assert got[C.PEAK_ALLOCATED].tolist() == [16, 58] and list(got[C.PEAK_PHASE]) == ["backward"] * 2
    assert got[C.ACTIVATIONS].tolist() == [6, 48] and got[C.WEIGHTS].tolist() == [10, 10]


def test_a_batch_of_zero_takes_the_argmax_and_the_tie_goes_to_the_first_phase():
    plan = _plan()
    # b = 0: forward 10, backward 10, optimizer 5: the tie goes to forward, which the encoded path left out
    assert not plan._encodable(np.array([0, 1]), np.array([8, 8]))
    got = _pick(plan, [0, 1], [8, 8])
    assert list(got[C.PEAK_PHASE]) == ["forward", "backward"] and got[C.PEAK_ALLOCATED].tolist() == [10, 34]


def test_a_total_beyond_the_encoding_takes_the_argmax():
    plan = _plan()
    # one phase kept, q = 0: encodable while 10 + 3·M² < 2^62 (M = the largest batch or sequence length)
    assert plan._encodable(np.array([1 << 30]), np.array([1 << 30]))  # 10 + 3·2^60 < 2^62
    assert not plan._encodable(np.array([1 << 31]), np.array([1 << 31]))  # 10 + 3·2^62 > 2^62
    # there the argmax over every phase decides, on int64 totals that wrap as they always did (the bound check
    # refuses such frames before): forward 10 + 2^63 -> 10 - 2^63, backward 10 + 3·2^62 -> 10 - 2^62, optimizer 5
    got = _pick(plan, [1 << 31], [1 << 31])
    assert list(got[C.PEAK_PHASE]) == ["optimizer"] and got[C.PEAK_ALLOCATED].tolist() == [5]


def test_identical_phases_go_to_the_first_one():
    same = {C.WEIGHTS: _term(7), C.ACTIVATIONS: _term(tok=1)}
    plan = _Plan((C.PRECISION,), (1,), [("forward", same), ("backward", dict(same)), ("optimizer", dict(same))])
    assert plan.enc.m == 1
    got = _pick(plan, [1, 3], [4, 4])
    assert list(got[C.PEAK_PHASE]) == ["forward"] * 2 and got[C.PEAK_ALLOCATED].tolist() == [11, 19]


def test_a_phase_that_ties_in_one_combination_is_kept():
    # two precisions: forward 10 + 2·b·s or 10 + 3·b·s; backward 10 + 3·b·s in both. Backward never loses to
    # forward, but in the second combination they tie on every row, and the tie goes to forward: kept
    two = np.array([[10, 0, 0, 2, 0], [10, 0, 0, 3, 0]], dtype=np.int64)
    plan = _Plan((C.PRECISION,), (2,), [("forward", {C.ACTIVATIONS: two}),
                                        ("backward", {C.ACTIVATIONS: _term(10, tok=3).repeat(2, axis=0)})])
    assert plan.enc.m == 2
    got = plan.pick(np.array([0, 1], dtype=np.intp), np.array([2, 2]), np.array([5, 5]))
    assert list(got[C.PEAK_PHASE]) == ["backward", "forward"] and got[C.PEAK_ALLOCATED].tolist() == [40, 40]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 5), m=st.integers(1, 6))
def test_rows_program_is_the_polynomial_in_exact_integers(data, n, m):
    coef = st.integers(-(1 << 20), 1 << 20) | st.just(0)
    arr = np.array(data.draw(st.lists(st.lists(st.lists(coef, min_size=5, max_size=5), min_size=m, max_size=m),
                                      min_size=n, max_size=n)), dtype=np.int64)
    same = np.array(data.draw(st.lists(st.booleans(), min_size=5 * m, max_size=5 * m))).reshape(m, 5)
    arr[:, same] = arr[:1, same]  # some coefficients the same at every index: broadcast, not gathered
    order = data.draw(st.permutations(range(m)))
    rows = _Rows(arr, list(order))
    r = data.draw(st.integers(0, 12))
    idx = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=r, max_size=r)), dtype=np.intp)
    b = np.array(data.draw(st.lists(st.integers(0, 4096), min_size=r, max_size=r)), dtype=np.int64)
    s = np.array(data.draw(st.lists(st.integers(0, 4096), min_size=r, max_size=r)), dtype=np.int64)
    want = [[int(arr[i, j, 0]) + int(s[x]) * int(arr[i, j, 1]) + int(b[x]) * int(arr[i, j, 2])
             + int(b[x]) * int(s[x]) * int(arr[i, j, 3]) + int(b[x]) * int(s[x]) ** 2 * int(arr[i, j, 4])
             for x, i in enumerate(idx)] for j in order]
    x = peak._features(b, s, {1, 2, 3, 4})
    assert rows.eval(idx, x).tolist() == want
    out = np.full((m + 2, r), -7, dtype=np.int64)
    rows.eval(idx, x, out[1:-1])
    assert out[1:-1].tolist() == want and (out[0] == -7).all() and (out[-1] == -7).all()


def _plans():
    for model in (TINY_LLAMA, TINY_GPT2):
        sc = scenario(model, precision=["fp32", "bf16-mixed"], attention=["flash", "eager"],
                      checkpointing=["none", "full"], optimizer=["adamw", "sgd"])
        frame = expand_grid(sc)
        plan, k, _, _ = _prepare(model, "train", frame, "cuda")
        yield model.name, plan, k


PLANS = list(_plans())


@pytest.mark.parametrize("name,plan,k", PLANS, ids=[p[0] for p in PLANS])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_encoded_winner_is_the_argmax_over_every_phase(name, plan, k, data):
    r = len(k)
    size = st.integers(0, 64) | st.integers(0, 1 << 22) | st.integers(1 << 40, 1 << 62)
    b = np.array(data.draw(st.lists(size, min_size=r, max_size=r)), dtype=np.int64)
    s = np.array(data.draw(st.lists(size, min_size=r, max_size=r)), dtype=np.int64)
    fast = plan.pick(k, b, s)
    out = np.empty((len(C.COMPONENTS) + 1, r), dtype=np.int64)
    extent = (int(min(b.min(), s.min())), int(max(b.max(), s.max())))  # as estimate_frame passes it
    into = plan.pick(k, b, s, out, extent)
    plain_plan = object.__new__(_Plan)
    plain_plan.__dict__.update(plan.__dict__, enc=None)  # the same plan, argmax over every phase
    plain = plain_plan.pick(k, b, s)
    assert fast.keys() == plain.keys() == into.keys()
    for c in plain:
        assert np.asarray(fast[c]).tolist() == np.asarray(plain[c]).tolist() == np.asarray(into[c]).tolist(), c
    held = dict(zip(plan.row_names, out))
    for c in C.COMPONENTS:
        assert held[c].tolist() == (plain[c].tolist() if c in plain else [0] * r)
    assert held[C.PEAK_ALLOCATED].tolist() == plain[C.PEAK_ALLOCATED].tolist()
