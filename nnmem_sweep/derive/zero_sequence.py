"""One rank of a DeepSpeed ZeRO-1/2 step recorded under FakeTensorMode (workload/zero_engine.py): the steady step
the truth measures (measure/zero_step.py) and a fresh run's allocation sequence, which the caching-allocator model
replays (replays.py: a DeepSpeed row's reserve at its own shape; tests/data/truth/deepspeed/sequences/).

A scenario's row becomes the `measure` case of its step, each end rank traced in a process of its own, in
zero_rows.py. ZeRO-3 partitions real tensors only, and is not traced here.
"""
from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Any

import numpy as np


def code_digest() -> str:
    """The code a traced sequence depends on beyond the model's and its case's (zero_rows.py): the engine's
    workload, the step and its recording (this module), the Recorder."""
    root = Path(__file__).resolve().parent.parent
    files = [root / "workload" / "zero_engine.py", root / "derive" / "zero_sequence.py", root / "derive" / "trace.py"]
    return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()


def fresh_events(case: dict[str, Any], cfg: dict[str, Any], steps: int, workspace_bytes: int) -> np.ndarray:
    """The allocation sequence of a fresh run's first `steps` steps on one rank, from what the engine holds when
    deepspeed.initialize() returns (the 16-bit parameters, the fp32 partition: the optimizer state is made in the
    first step), as (storage id, signed bytes) events: what the caching-allocator model replays (replays.py). With
    the two cuBLAS workspaces of a CUDA run (derive/trace.py Recorder) of `workspace_bytes` each (an H100's: 32 MiB,
    components/runtime.large_cublas_workspace_bytes): without them the sequence of the H100's ZeRO-2 point needed
    4.4 % above its peak, where the GPU needed 10.2 % and with them 10.2-10.5 %."""
    rec, _, _ = recorded(case, cfg, untraced=0, traced=steps, workspace_bytes=workspace_bytes)
    return np.ascontiguousarray(rec.trace().events[:, :2], dtype=np.int64)


def recorded(case: dict[str, Any], cfg: dict[str, Any], untraced: int, traced: int, workspace_bytes: int = 0):
    """(the Recorder of `traced` steps after `untraced` ones, parameters of the model, bytes held by kind when the
    recording started); `workspace_bytes`: the Recorder's cuBLAS workspaces (a sequence's only)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..workload import zero_engine as Z
    from ..workload.steps import storage_bytes
    from ..workload.build import run_contexts
    from .trace import Recorder

    stage = Z.check(case["deepspeed"])[1]
    if stage == 3 and Z.offloads(case["deepspeed"]):  # the kit measures it on a GPU (measure/real.py)
        raise ValueError("deepspeed: ZeRO-3's offload is not recorded on one device: its host-to-GPU copies are "
                         ".to(device) calls that move nothing there (measure it on a GPU: "
                         "validation/gpu-deepspeed.yaml)")
    fake = stage < 3  # ZeRO-3 partitions only real tensors (workload/zero_engine.py)
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
            with Z.host_side(zero, w.optimizer.optimizer, rec):  # ZeRO-Offload's host storages: never events
                held = Z.held_tensors(engine, zero, w.optimizer.optimizer)
                for kind, tensors in held.items():
                    rec.external(tensors, kind)
                with rec:
                    for _ in range(traced):
                        _step(engine, inputs, rec, accum)
                    rec.mark("end")
        totals = {f"{kind}_bytes": storage_bytes(ts) for kind, ts in held.items()}
        if rec.host_bytes:  # ZeRO-Offload: the master and optimizer state above are the host's
            totals["host_bytes"] = rec.host_bytes
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
