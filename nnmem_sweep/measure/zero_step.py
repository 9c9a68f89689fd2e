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

import contextlib
from typing import Any

import numpy as np


def measure(case: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """The measured record of one rank (its `rank`, 0 by default) of a DeepSpeed case (case["deepspeed"]:
    workload/zero_engine.py KEYS)."""
    rec, params, totals = _recorded(case, cfg, untraced=1, traced=1)
    return {"params": params, **_phases(rec.trace(), totals)}


def fresh_events(case: dict[str, Any], cfg: dict[str, Any], steps: int = 2) -> np.ndarray:
    """The allocation sequence of a fresh run's first `steps` steps on one rank, from what the engine holds when
    deepspeed.initialize() returns (the 16-bit parameters, the fp32 partition: the optimizer state is made in the
    first step), as (storage id, signed bytes) events: what the caching-allocator model replays (replays.py). With
    the two cuBLAS workspaces of a CUDA run (derive/trace.py Recorder), at the size an H100's takes (32 MiB on
    compute capability 9.x and up: components/runtime.cublas_workspace): without them the sequence of the H100's
    ZeRO-2 point needed 4.4 % above its peak, where the GPU needed 10.2 % and with them 10.2-10.5 %."""
    from ..components.runtime import large_cublas_workspace_bytes

    rec, _, _ = _recorded(case, cfg, untraced=0, traced=steps, workspace_bytes=large_cublas_workspace_bytes())
    return np.ascontiguousarray(rec.trace().events[:, :2], dtype=np.int64)


def _recorded(case: dict[str, Any], cfg: dict[str, Any], untraced: int, traced: int, workspace_bytes: int = 0):
    """(the Recorder of `traced` steps after `untraced` ones, parameters of the model, bytes held by kind when the
    recording started); `workspace_bytes`: the Recorder's cuBLAS workspaces (a sequence's only)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..derive.trace import Recorder
    from ..workload import zero_engine as Z
    from ..workload.build import run_contexts

    fake = Z.check(case["deepspeed"])[1] < 3  # ZeRO-3 partitions only real tensors (workload/zero_engine.py)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    with Z.rank_comm(case["deepspeed"]), fake_mode:
        torch.manual_seed(0)
        w = Z.engine_workload(case, cfg, fake)
        engine, zero, inputs, accum = w.model, w.optimizer.zero, w.inputs, w.accum
        # a ZeRO-3 parameter's numel is its partition's once partitioned: ds_numel is the whole tensor's
        params = sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters())
        with run_contexts(case, fake=fake), Z.answered_finite(zero) if fake else contextlib.nullcontext():
            for _ in range(untraced):  # the first step makes the optimizer state (module docstring)
                _step(engine, inputs, None, accum)
            rec = Recorder(workspace_bytes)
            held = Z.held_tensors(engine, zero, w.optimizer.optimizer)
            for kind, tensors in held.items():
                rec.external(tensors, kind)
            with rec:
                for _ in range(traced):
                    _step(engine, inputs, rec, accum)
                rec.mark("end")
        totals = {f"{kind}_bytes": _storage_bytes(ts) for kind, ts in held.items()}
    return rec, params, totals


def _step(engine, inputs: dict[str, Any], rec, accum: int = 1) -> None:  # noqa: ANN001
    """One optimizer step of `accum` micro-batches, each forward and engine.backward(), then engine.step() (which
    steps at the last micro-batch only); the micro-batches before the last marked "forward.k" / "backward.k"."""
    mark = rec.mark if rec is not None else (lambda name: None)
    for k in range(accum):
        tag = "" if k == accum - 1 else f".{k}"
        mark("forward" + tag)
        out = engine(**inputs)
        loss = out.loss
        del out  # only the loss is kept into backward, as transformers' Trainer does
        mark("backward" + tag)
        engine.backward(loss)
        del loss
        if k < accum - 1:
            engine.step()  # not a boundary: DeepSpeed only counts the micro-batch
    mark("optimizer")
    engine.step()


def _storage_bytes(tensors) -> int:
    seen = {id(t.untyped_storage()): int(t.untyped_storage().nbytes()) for t in tensors}
    return sum(seen.values())


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
