"""The batch search of derived models (fit.py through components/derived.frame_batch_lines) cuts each group of
moments to its upper envelope in b: at every batch the largest slot must be the largest moment."""
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nnmem_sweep.components.derived import frame_phase_totals
from nnmem_sweep.components.derived_lines import frame_batch_lines, upper_envelope

lines = st.lists(st.tuples(st.integers(-10**12, 10**12), st.integers(-10**6, 10**6)), min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(lines, st.integers(1, 50), st.integers(0, 200))
def test_envelope_keeps_the_largest_line_at_every_integer_batch(ls, lo, width):
    a = np.array([x for x, _ in ls], dtype=np.int64)
    s = np.array([y for _, y in ls], dtype=np.int64)
    hi = lo + width
    keep = upper_envelope(a, s, lo, hi)
    b = np.arange(lo, hi + 1)
    every = (a[:, None] + s[:, None] * b[None, :]).max(axis=0)
    kept = (a[keep][:, None] + s[keep][:, None] * b[None, :]).max(axis=0)
    assert (kept == every).all()


def test_envelope_by_hand():
    """3 + 0·b, 0 + 1·b, 1 + 1·b (beats the second everywhere), -100 + 2·b (on top only beyond b = 101)."""
    a, s = np.array([3, 0, 1, -100]), np.array([0, 1, 1, 2])
    assert upper_envelope(a, s, 1, 50) == [0, 2]
    assert upper_envelope(a, s, 1, 200) == [0, 2, 3]


def test_slots_equal_every_moment_on_the_shipped_qwen3_plans():
    """configs/qwen3.yaml (its plans are shipped): the largest slot equals the largest moment at batches 1 .. 64."""
    from nnmem_sweep.config import load_scenario
    from nnmem_sweep.derive import stored_only
    from nnmem_sweep.grid import expand_grid

    with stored_only():
        sc = load_scenario(Path(__file__).parents[2] / "configs" / "qwen3.yaml")
        frame = expand_grid(sc)
        every, slots = frame_phase_totals(sc.model, "train", frame), frame_batch_lines(sc.model, "train", frame)
        for b in (1, 2, 3, 7, 64):
            bb = np.full(len(frame), b)
            assert (np.max(every(bb)[0], axis=0) == np.max(slots(bb), axis=0)).all(), b
            assert len(slots(bb)) < len(every(bb)[0])
