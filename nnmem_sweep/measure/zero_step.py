"""Measure one rank of a DeepSpeed ZeRO training step (workload/zero_engine.py): ZeRO-1/2 under FakeTensorMode,
ZeRO-3 with real tensors (it partitions only real ones; a 1B model's rank fits this machine's memory).

PyTorch's MemTracker cannot follow DeepSpeed's engine (it refuses to track the ZeRO optimizer, and its module hooks
see the engine's forward as a second iteration), so the step is recorded by the Recorder the derive package traces
with (derive/trace.py): every storage's allocation and free, counted as MemTracker counts them (the bytes of each
live untyped storage, views once). The recording starts after one untraced step, from the storages the rank then
holds (registered by kind: parameters, buffers, fp32 master partitions, optimizer state; zero_engine.held_tensors),
so the figures are the steady step's, as the other truth cases' second step; deepspeed.initialize()'s own transient
(the flattening) is not part of it.

Per phase (forward: the engine's forward to the loss; backward: engine.backward(); optimizer: engine.step(), which
reduces what is left, steps the fp32 partition and all-gathers the 16-bit parameters), the peak of the live bytes.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..derive import zero_sequence


def measure(case: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """The measured record of one rank (its `rank`, 0 by default) of a DeepSpeed case (case["deepspeed"]:
    workload/zero_engine.py KEYS)."""
    rec, params, totals = zero_sequence.recorded(case, cfg, untraced=1, traced=1)
    return {"params": params, **_phases(rec.trace(), totals)}


def _phases(tr, totals: dict[str, int]) -> dict[str, Any]:
    """Per phase the peak of the live bytes over its segments (every micro-batch's forward, backward) and where the
    last micro-batch's started."""
    live = np.cumsum(tr.events[:, 1])
    marks = sorted(tr.marks.items(), key=lambda kv: kv[1])  # (name, event index) in order; "end" last
    phases: dict[str, dict[str, int]] = {}
    for (name, i), (_, j) in zip(marks, marks[1:]):
        base = name.split(".")[0]
        before = int(live[i - 1]) if i else 0
        peak = int(max(before, live[i:j].max() if j > i else before))
        cur = phases.setdefault(base, {"peak_bytes": peak, "start_bytes": before})
        cur["peak_bytes"] = max(cur["peak_bytes"], peak)
        if "." not in name:
            cur["start_bytes"] = before
    peak_phase = max(phases, key=lambda p: phases[p]["peak_bytes"])
    return {"peak_bytes": phases[peak_phase]["peak_bytes"], "peak_phase": peak_phase, "phases": phases,
            "totals": totals}
