"""Properties of the allocator model over random allocation/free sequences (hypothesis).

The issue asked for "expandable reserved ≤ native reserved". It does not hold: a single 10 MiB + 1 B request
reserves 12 MiB natively and a whole 20 MiB page with expandable segments, and a long-lived block placed inside the
one expandable segment can strand space that the native backend would have kept in a segment of its own
(test_expandable_can_reserve_more_than_native). What does hold, and is tested, is the form for sequences freed in
LIFO order: there the expandable segment works as a stack, so it reserves at most the native peak plus the large
pool's page slack, 20 MiB − 2 MiB.
"""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nnmem_sweep.allocator import AllocatorOptions, CachingAllocatorModel, replay
from nnmem_sweep.units import MiB

EXPANDABLE = AllocatorOptions(expandable_segments=True)
OPTIONS = st.sampled_from([AllocatorOptions(), EXPANDABLE, AllocatorOptions(max_split_size_mb=48),
                           AllocatorOptions(roundup_power2_divisions=4)])
SIZES = st.one_of(st.integers(1, 4096), st.integers(1, 2 * MiB), st.integers(MiB, 64 * MiB))


@st.composite
def sequences(draw, max_ops: int = 40, lifo: bool = False):
    """(id, ±nbytes) events; a free picks a live id (the latest one when lifo)."""
    events, live = [], []
    for next_id in range(draw(st.integers(1, max_ops))):
        if live and draw(st.booleans()):
            k = len(live) - 1 if lifo else draw(st.integers(0, len(live) - 1))
            block_id, n = live.pop(k)
            events.append((block_id, -n))
        else:
            n = draw(SIZES)
            events.append((next_id, n))
            live.append((next_id, n))
    return events


def check_segments(model: CachingAllocatorModel) -> None:
    """Blocks tile each segment, no two free neighbours are left unmerged, and the stats add up."""
    reserved = allocated = 0
    for seg in model.snapshot():
        offset = 0
        for prev, b in zip((None, *seg.blocks), seg.blocks):
            assert b.offset == offset
            offset += b.size
            if prev is not None:
                assert not (prev.state == b.state and b.state in ("free", "unmapped"))
        reserved += seg.reserved_bytes
        allocated += sum(b.size for b in seg.blocks if b.state == "allocated")
    assert (reserved, allocated) == (model.reserved, model.allocated)


@settings(max_examples=200, deadline=None)
@given(sequences(), OPTIONS, st.sampled_from([None, 64 * MiB, 200 * MiB]))
def test_reserved_covers_allocated_at_every_event(events, options, capacity):
    model = CachingAllocatorModel(options, capacity)
    live, rounded = {}, {}
    for block_id, n in events:
        if n > 0:
            block = model.malloc(n)
            if block is None:  # out of memory: PyTorch raises; the model's state is unchanged but for releases
                check_segments(model)
                return
            live[block_id] = block
            rounded[block_id] = model.request_sizes(n)[0]  # round_size, tested in test_rules.py
        else:
            model.free(live.pop(block_id))
            del rounded[block_id]
        assert model.reserved >= model.allocated
        assert model.allocated >= sum(rounded.values())
        if options.expandable_segments:  # every block is split down to its rounded size
            assert model.allocated == sum(rounded.values())
        elif options.max_split_size_mb is None:  # a large block keeps at most 1 MiB it did not split off
            large = sum(1 for b in live.values() if b.size > MiB)
            assert model.allocated - sum(rounded.values()) <= large * MiB
        if capacity is not None:
            assert model.reserved <= capacity
        check_segments(model)
    assert model.peak_reserved >= model.peak_allocated


@settings(max_examples=200, deadline=None)
@given(sequences(lifo=True))
def test_expandable_within_a_page_of_native_for_lifo_sequences(events):
    native = replay(np.array(events), AllocatorOptions())
    expandable = replay(np.array(events), EXPANDABLE)
    assert expandable.peak_allocated_bytes <= native.peak_allocated_bytes
    assert expandable.peak_reserved_bytes <= native.peak_reserved_bytes + 18 * MiB


def test_expandable_can_reserve_more_than_native():
    # one 10 MiB + 1 B request: native 12 MiB, expandable one 20 MiB page
    one = np.array([(0, 10 * MiB + 1)])
    assert (replay(one).peak_reserved_bytes, replay(one, EXPANDABLE).peak_reserved_bytes) == (12 * MiB, 20 * MiB)
    # beyond the page slack: 40 MiB cached, B 8 MiB at its start, D 33 MiB; B freed; F 40 MiB.
    # native: D gets its own 34 MiB segment, F reuses the whole 40 MiB one -> 74 MiB.
    # expandable: D lands at [8, 41) (one more page mapped: 60 MiB), B's hole [0, 8) stays isolated, F maps
    # [41, 81) from the free tail [41, 60) plus two pages -> 100 MiB.
    events = np.array([(0, 40 * MiB), (0, -40 * MiB), (1, 8 * MiB), (2, 33 * MiB), (1, -8 * MiB), (3, 40 * MiB)])
    assert replay(events).peak_reserved_bytes == 74 * MiB
    assert replay(events, EXPANDABLE).peak_reserved_bytes == 100 * MiB


def test_replay_is_fast_enough():
    """~20,000 events well under a second (the brief's target), measured loosely: best of three."""
    import time

    rng = np.random.default_rng(0)
    events, live = [], []
    for i in range(20_000):
        if live and rng.random() < 0.5:
            block_id, n = live.pop(int(rng.integers(len(live))))
            events.append((block_id, -n))
        else:
            n = int(rng.integers(1, 64 * MiB)) if rng.random() < 0.3 else int(rng.integers(1, MiB))
            events.append((i, n))
            live.append((i, n))
    arr = np.array(events)
    best = min(_timed(time.perf_counter, arr) for _ in range(3))
    assert best < 1.0


def _timed(clock, arr) -> float:
    start = clock()
    replay(arr)
    replay(arr, EXPANDABLE)
    return (clock() - start) / 2
