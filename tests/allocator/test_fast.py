"""The compiled replay (allocator/fast.py) against the reference model (allocator/model.py): the same result, field
for field, on random sequences under random options and capacities, and the same least capacity as the reference
gave on every allocation sequence the package ships (tests/data/replays/least_capacities.json, written by the
reference: `python tests/allocator/test_fast.py --write`)."""
from __future__ import annotations

import functools
import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from nnmem_sweep.allocator import AllocatorOptions, prepare, replay
from nnmem_sweep.allocator import fast
from nnmem_sweep.derive.cache import SHIPPED
from nnmem_sweep.derive.events import events_at
from nnmem_sweep.replays import least_capacity
from nnmem_sweep.units import MiB

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "replays" / "least_capacities.json"

pytestmark = pytest.mark.skipif(not fast.available(), reason="numba is not installed: the compiled replay is off")

OPTIONS = st.sampled_from([
    AllocatorOptions(), AllocatorOptions(max_split_size_mb=20), AllocatorOptions(max_split_size_mb=64),
    AllocatorOptions(roundup_power2_divisions=4), AllocatorOptions(roundup_power2_divisions=((256, 4), (">", 1))),
    AllocatorOptions(large_segment_size_mb=8, max_split_size_mb=48, max_non_split_rounding_mb=32),
])
SIZE = st.one_of(st.integers(1, 4096), st.integers(4096, 2 * MiB), st.integers(2 * MiB, 64 * MiB),
                 st.integers(64 * MiB, 300 * MiB))


@st.composite
def sequences(draw):
    """A well-formed event sequence: allocations and frees of live ids in random order, some left live."""
    live: list[int] = []
    ops: list[tuple[int, int]] = []
    next_id = 0
    for _ in range(draw(st.integers(1, 160))):
        if live and draw(st.booleans()):
            ops.append((live.pop(draw(st.integers(0, len(live) - 1))), -1))
        else:
            ops.append((next_id, 1))
            live.append(next_id)
            next_id += 1
    size_of = [draw(SIZE) for _ in range(next_id)]
    return np.array([[i, sign * size_of[i]] for i, sign in ops], dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(seq=sequences(), options=OPTIONS, cap=st.one_of(st.none(), st.integers(2 * MiB, 2048 * MiB)),
       descending=st.booleans())
def test_compiled_replay_equals_the_reference_model(seq, options, cap, descending):
    model = replay(seq, options, capacity_bytes=cap, engine="model", descending=descending)
    compiled = replay(prepare(seq), options, capacity_bytes=cap, engine="fast", descending=descending)
    assert compiled == model


@settings(max_examples=200, deadline=None)
@given(seq=sequences(), streams=st.lists(st.sampled_from([0, 1, 2, 7]), min_size=160, max_size=160),
       options=OPTIONS, cap=st.one_of(st.none(), st.integers(2 * MiB, 2048 * MiB)), descending=st.booleans())
def test_compiled_replay_equals_the_reference_model_on_several_streams(seq, streams, options, cap, descending):
    """Each block on the stream its allocation names (a free on its allocation's: a sharded step's trace)."""
    stream_of = {}
    col = []
    for (i, n), k in zip(seq.tolist(), streams):
        col.append(stream_of.setdefault(i, k) if n > 0 else stream_of.pop(i))
    seq3 = np.concatenate([seq, np.array(col, dtype=np.int64).reshape(-1, 1)], axis=1)
    model = replay(seq3, options, capacity_bytes=cap, engine="model", descending=descending)
    compiled = replay(prepare(seq3), options, capacity_bytes=cap, engine="fast", descending=descending)
    assert compiled == model


@pytest.mark.parametrize("events, message", [
    ([[1, 512], [1, 512]], "event 1: id 1 allocated again before its free"),
    ([[1, -512]], "event 0: free of id 1, which is not allocated"),
    ([[1, 1024], [1, -512]], "event 1: free of id 1 says 512 B, its allocation 1024 B"),
])
def test_both_engines_refuse_a_malformed_sequence_naming_the_event(events, message):
    for engine in ("model", "fast"):
        with pytest.raises(ValueError, match=message):
            replay(np.array(events, dtype=np.int64), engine=engine)


def test_expandable_segments_stay_with_the_reference_model():
    seq = np.array([[0, 30 * MiB], [0, -30 * MiB]], dtype=np.int64)
    assert replay(seq, AllocatorOptions(expandable_segments=True)) == \
        replay(seq, AllocatorOptions(expandable_segments=True), engine="model")
    with pytest.raises(ValueError, match="expandable"):
        replay(seq, AllocatorOptions(expandable_segments=True), engine="fast")


@functools.cache
def shipped_sequences() -> tuple:
    """(plan file, batch, seq_len, events) of every shipped plan that stores its allocation sequence, at batch 4 and
    sequence 512 (or the nearest shape) of its first region holding one. Read once per process: each of the golden
    tests below takes one of them (88 tests reading all 88 plans took 40 s of the suite)."""
    return tuple(_shipped_sequences())


def _shipped_sequences():
    for path in sorted(SHIPPED.glob("*/*.json.gz")):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        region = next((r for r in doc.get("regions", ()) if r.get("replay") and (r["b_hi"] or 4) >= 4), None)
        if region is None:
            continue
        b = max(4, region["b_lo"])
        s = min(max(512, region["s_lo"]), region["s_hi"] or 512)
        yield f"{path.parent.name}/{path.name}", b, s, events_at(doc, b, s)


def _golden():
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(_golden()) if GOLDEN.exists() else [])
def test_least_capacity_of_every_shipped_sequence_is_the_reference_models(name):
    want = _golden()[name]
    (got,) = [(b, s, ev) for n, b, s, ev in shipped_sequences() if n == name]
    b, s, ev = got
    assert (b, s, len(ev)) == (want["batch"], want["seq_len"], want["events"])
    assert list(least_capacity(ev, AllocatorOptions())) == [want["peak"], want["least_capacity"]]


def test_every_shipped_sequence_has_its_reference_figure():
    assert sorted(_golden()) == sorted(n for n, *_ in shipped_sequences())


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    table = {}
    for name, b, s, ev in shipped_sequences():
        peak, need = least_capacity(ev, AllocatorOptions(), engine="model")
        table[name] = {"batch": b, "seq_len": s, "events": len(ev), "peak": peak, "least_capacity": need}
        print(name, b, s, len(ev), peak, need, flush=True)
    GOLDEN.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


@settings(max_examples=300, deadline=None)
@given(seq=sequences(), where=st.integers(0, 10**6), how=st.sampled_from(["drop", "swap", "resize", "twice"]))
def test_a_malformed_sequence_is_refused_by_both_with_the_same_words(seq, where, how):
    """The compiled path checks a sequence once, vectorised (replay.prepare); the reference model checks it event by
    event: on any damage they refuse the same event with the same message, or both accept."""
    ev = seq.tolist()
    i = where % len(ev)
    if how == "drop":
        del ev[i]
    elif how == "swap" and i + 1 < len(ev):
        ev[i], ev[i + 1] = ev[i + 1], ev[i]
    elif how == "resize":
        ev[i][1] += 512 if ev[i][1] > 0 else -512
    elif how == "twice":
        ev.insert(i, list(ev[i]))
    arr = np.array(ev, dtype=np.int64).reshape(-1, 2)
    outcomes = []
    for run in (lambda: replay(arr, engine="model"), lambda: prepare(arr)):
        try:
            run()
            outcomes.append("ok")
        except ValueError as e:
            outcomes.append(str(e))
    assert outcomes[0] == outcomes[1]
