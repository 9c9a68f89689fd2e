"""The plan machinery on hand-counted plans: every phase total evaluated, the winner by the largest total (the first
phase on ties, as np.argmax), the winner's components; the coefficient tables against the Term polynomial in exact
Python integers; the batch-independent s² coefficient (Term.sq) through Term, the plans, fit.py and transformer
decode."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nnmem_sweep import columns as C
from nnmem_sweep.components import plan as plan_mod
from nnmem_sweep.components.plan import Plan, Table, features, first_max
from nnmem_sweep.components.terms import Term


def _term(const=0, pos=0, seq=0, tok=0, s2=0, sq=0):
    return np.array([[const, pos, seq, tok, s2, sq]], dtype=np.int64)  # one combination


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
    two = np.array([[10, 0, 0, 2, 0, 0], [10, 0, 0, 3, 0, 0]], dtype=np.int64)
    plan = Plan((C.PRECISION,), (2,), [("forward", {C.ACTIVATIONS: two}),
                                        ("backward", {C.ACTIVATIONS: _term(10, tok=3).repeat(2, axis=0)})])
    got = plan.pick(np.array([0, 1], dtype=np.intp), np.array([2, 2]), np.array([5, 5]))
    assert list(got[C.PEAK_PHASE]) == ["backward", "forward"] and got[C.PEAK_ALLOCATED].tolist() == [40, 40]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 5), m=st.integers(1, 6))
def test_table_is_the_polynomial_in_exact_integers(data, n, m):
    coef = st.integers(-(1 << 20), 1 << 20) | st.just(0)
    arr = np.array(data.draw(st.lists(st.lists(st.lists(coef, min_size=6, max_size=6), min_size=m, max_size=m),
                                      min_size=n, max_size=n)), dtype=np.int64)
    r = data.draw(st.integers(0, 12))
    idx = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=r, max_size=r)), dtype=np.intp)
    b = np.array(data.draw(st.lists(st.integers(0, 4096), min_size=r, max_size=r)), dtype=np.int64)
    s = np.array(data.draw(st.lists(st.integers(0, 4096), min_size=r, max_size=r)), dtype=np.int64)
    want = [[int(arr[i, j, 0]) + int(s[x]) * int(arr[i, j, 1]) + int(b[x]) * int(arr[i, j, 2])
             + int(b[x]) * int(s[x]) * int(arr[i, j, 3]) + int(b[x]) * int(s[x]) ** 2 * int(arr[i, j, 4])
             + int(s[x]) ** 2 * int(arr[i, j, 5])
             for x, i in enumerate(idx)] for j in range(m)]
    assert Table(arr).eval(idx, features(b, s)).tolist() == want


def test_a_table_over_several_blocks_of_rows_is_the_polynomial_of_each_row():
    """Table.eval takes BLOCK_ROWS rows at a time: across the blocks' edges, every row is still its own polynomial
    (a reference over all rows at once, numpy's own sum of the coefficients times the row's factors)."""
    rng = np.random.default_rng(7)
    n_rows = 2 * plan_mod.BLOCK_ROWS + 17
    arr = rng.integers(-(1 << 16), 1 << 16, size=(5, 4, 6), dtype=np.int64)
    arr[:, 1, 3] = 0  # a coefficient some Terms leave out
    idx = rng.integers(0, 5, size=n_rows).astype(np.intp)
    b = rng.integers(1, 64, size=n_rows, dtype=np.int64)
    s = rng.integers(1, 4096, size=n_rows, dtype=np.int64)
    x = np.stack([np.ones(n_rows, dtype=np.int64), s, b, b * s, b * s * s, s * s], axis=1)  # COEFFICIENTS order
    want = (arr[idx] * x[:, None, :]).sum(axis=2).T
    assert np.array_equal(Table(arr).eval(idx, features(b, s)), want)


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=5))
def test_first_max_is_argmax_and_max_with_the_first_phase_on_ties(rows):
    width = min(len(r) for r in rows)
    totals = np.array([r[:width] for r in rows], dtype=np.int64)
    win, peak = first_max(totals)
    assert win.tolist() == np.argmax(totals, axis=0).tolist() and peak.tolist() == totals.max(axis=0).tolist()


@given(const=st.integers(0, 1 << 20), pos=st.integers(0, 1 << 10), seq=st.integers(0, 1 << 10),
       tok=st.integers(0, 1 << 10), s2=st.integers(0, 1 << 10), sq=st.integers(0, 1 << 10),
       b=st.integers(1, 1 << 10), s=st.integers(1, 1 << 12))
def test_term_eval_is_the_polynomial_and_sq_does_not_grow_with_the_batch(const, pos, seq, tok, s2, sq, b, s):
    t = Term(const, pos, seq, tok, s2, sq)
    assert int(t.eval(b, s)) == const + s * pos + b * seq + b * s * tok + b * s * s * s2 + s * s * sq
    assert int(t.eval(b + 1, s) - t.eval(b, s)) == int(t.per_sample(s))  # sq is no part of the slope
    assert t.coefficients() == (const, pos, seq, tok, s2, sq)
    assert (t + Term(sq=1)).sq == sq + 1 and (2 * t).sq == 2 * sq


def test_a_mask_shared_by_the_batch_is_counted_once_per_row():
    # forward 10 + 2·b·s + 3·s² (the mask), backward 10 + 3·b·s: at b = 1, s = 4 forward has 10 + 8 + 48 = 66 against
    # backward's 22; at b = 8, s = 4 the mask is still 48: forward 10 + 64 + 48 = 122, backward 10 + 96 = 106
    plan = Plan((C.PRECISION,), (1,), [
        ("forward", {C.WEIGHTS: _term(10), C.ACTIVATIONS: _term(tok=2), C.TEMPORARY: _term(sq=3)}),
        ("backward", {C.WEIGHTS: _term(10), C.ACTIVATIONS: _term(tok=3)}),
    ])
    got = _pick(plan, [1, 8], [4, 4])
    assert got[C.PEAK_ALLOCATED].tolist() == [66, 122] and got[C.TEMPORARY].tolist() == [48, 48]
    assert list(got[C.PEAK_PHASE]) == ["forward", "forward"]


def test_the_mask_belongs_to_the_batch_independent_intercept_of_the_max_batch(monkeypatch):
    # the tiny Llama's training plan with a 1,000-byte-per-s² mask added to every phase: at s = 8, 64,000 bytes
    # whatever the batch. max_batch's closed form must count it in the intercept: fits(b_max), not fits(b_max + 1)
    from nnmem_sweep.components import train_plan
    from nnmem_sweep.estimate import estimate_frame
    from nnmem_sweep.fit import max_batch
    from nnmem_sweep.grid import add_gpu_columns, point_axes, product_frame
    from nnmem_sweep.scenario import GPUSpec, Overheads

    from .tiny_models import TINY_LLAMA, replace, scenario

    def with_mask(axes, sizes, phases):
        mask = np.zeros((*sizes, 6), dtype=np.int64)
        mask[..., 5] = 1000
        return Plan(axes, sizes, [(name, {**comps, C.TEMPORARY: comps[C.TEMPORARY] + mask}) for name, comps in phases])

    sc = scenario(TINY_LLAMA, gpus=(GPUSpec("g", "G", 400_000, "test"),), overheads=Overheads(100, 10, 0.05),
                  headroom=0.1)
    points = add_gpu_columns(product_frame(point_axes(sc), ("g",)), sc)

    def at(arch, b):
        return estimate_frame(arch, "train", points.assign(**{C.BATCH: [b]}), sc.overheads, sc.headroom)

    plain_arch, masked_arch = replace(TINY_LLAMA), replace(TINY_LLAMA)  # new objects: plans of their own
    plain_b = int(max_batch(plain_arch, "train", points, sc.overheads, sc.headroom)[C.MAX_BATCH].iloc[0])
    monkeypatch.setattr(train_plan, "Plan", with_mask)
    b = int(max_batch(masked_arch, "train", points, sc.overheads, sc.headroom)[C.MAX_BATCH].iloc[0])
    assert 0 < b < plain_b
    assert bool(at(masked_arch, b)[C.FITS].iloc[0]) and not bool(at(masked_arch, b + 1)[C.FITS].iloc[0])
    masked = int(at(masked_arch, b)[C.PEAK_ALLOCATED].iloc[0])
    # the plain plan without the patch: the plan cache (64 entries) may have dropped it since, and a plan rebuilt
    # under the patch would carry the mask too
    monkeypatch.undo()
    assert masked == int(at(plain_arch, b)[C.PEAK_ALLOCATED].iloc[0]) + 1000 * 8 * 8


def test_a_mask_in_transformer_inference_spans_the_prompt_in_prefill_and_the_cache_in_decode(monkeypatch):
    # the attention moment of the tiny Llama's prefill plus a mask of 10^6 bytes per s² (large enough to be the
    # largest moment everywhere): prefill (s = 8) keeps an 8 x 8 mask, a decode step of the 12-token cache a 1 x 12
    # one, so against the plain moments: prefill + 64·sq, decode + 12·sq, each over the largest plain moment
    from nnmem_sweep.components import activations
    from nnmem_sweep.components.infer_plan import InferTables
    from nnmem_sweep.grid import expand_grid
    from nnmem_sweep.peak import named_phase_totals

    from .tiny_models import TINY_LLAMA, replace, scenario

    sq = 10**6
    real = activations.prefill_temp
    plain_arch, masked_arch = replace(TINY_LLAMA), replace(TINY_LLAMA)
    frame = expand_grid(scenario(plain_arch, "infer", decode_tokens=4))
    plain = [int(t[0]) for _, t in named_phase_totals(plain_arch, "infer", frame)]
    monkeypatch.setattr(activations, "prefill_temp", lambda *a: (real(*a)[0] + Term(sq=sq), *real(*a)[1:]))
    masked = [int(t[0]) for _, t in named_phase_totals(masked_arch, "infer", frame)]
    monkeypatch.undo()

    moments = InferTables(plain_arch, ("bf16",), ("flash",)).moments
    k, b = np.zeros(1, dtype=np.intp), np.ones(1, dtype=np.int64)
    at_prompt = [int(m.eval(k, b, np.full(1, 8))[0]) for m in moments]
    at_token = [int(m.eval(k, b, np.ones(1, dtype=np.int64))[0]) for m in moments]
    assert masked[0] - plain[0] == at_prompt[0] + 64 * sq - max(at_prompt)
    assert masked[1] - plain[1] == at_token[0] + 12 * sq - max(at_token[:2])  # the layer step: attention or MLP
    assert masked[2] == plain[2]  # the logits moment holds no mask
