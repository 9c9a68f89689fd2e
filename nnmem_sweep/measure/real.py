"""Measure one point with real tensors on a device: `nnmem-sweep measure --device cuda` and the GPU kit
(measure/kit.py) on a GPU; the same code on the CPU (HostMeter) in `make test`.

A point is a case of the truth catalog's form (workload/build.py: mode, batch, seq_len, precision, optimizer, ...).
Its model is built on the device from its config, random init, nothing downloaded; then it runs as a training
script does (run_steps: forward keeping the loss, backward, optimizer step, zero_grad) or as generate() does
(prefill, then one-token decode steps), and per phase the meter keeps the peaks (meters.py). Recorded:
  - the first `steps` training steps (2: the optimizer state is made inside the first, so the second is the
    steady one) or the request's phases, each with max_memory_allocated / max_memory_reserved and the allocator's
    counters; then `timing_steps` more, timed only: steady tokens per second;
  - the memory outside PyTorch after the run (the CUDA context and the libraries' modules);
  - the least capacity in which a fresh run's measured steps complete: a bisection of the allocator's cap
    (set_per_process_memory_fraction), each probe a fresh build, to `resolution` of the peak; the counterpart of
    the caching-allocator replay's least capacity (replays.least_capacity), which on the measured run's own
    recording gives the first probe (model_guess). Each probe must release down to what the measured run left
    (LeftAllocated); a DeepSpeed engine does not, so the kit gives its probes a process each (kit.fresh_probe);
  - optionally one memory snapshot of the measured run (torch.cuda.memory._dump_snapshot, the format PyTorch's
    memory_viz reads), recorded without stack traces, and one of a run at the least capacity found (its releases
    and retries under the cap).
`resume`: the optimizer state exists before the first step, as after load_state_dict from a checkpoint, instead of
being made inside it (the replays' "resumed" run).
"""
from __future__ import annotations

import contextlib
import gc
import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..workload.build import (build_model, build_optimizer, case_config, default_dtype, make_workload, model_dtype,
                              run_contexts, sharding)
from ..workload import zero_engine
from ..workload.steps import run_steps, storage_bytes
from .meters import meter_for

RESOLUTION = 0.005  # the bisection stops within 0.5 % of the peak, as the replays' (replays.RESOLUTION = 200)


class OutOfTime(Exception):
    """The deadline passed between two probes of a bisection."""


class NoneCompleted(Exception):
    """Not even the top of a bisection's bracket (the uncapped run's peak reserved and a step) completed."""


class LeftAllocated(Exception):
    """A run's tensors outlived it: the runs after it would start on top of them, so no cap can be measured."""


def _check_released(meter, baseline: int | None, what: str) -> None:  # noqa: ANN001
    """Raise LeftAllocated where more is allocated now, the last run released, than before the first run."""
    if baseline is not None and meter.allocated() > baseline:
        raise LeftAllocated(f"{what} left {meter.allocated() - baseline:,} B allocated after it ended: a capped run "
                            f"would start on top of it, so no least capacity was measured")


def _optimizer_tensors(opt) -> list[torch.Tensor]:  # noqa: ANN001
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def _build(case: dict[str, Any], device: str, state: dict | None):
    """The case's model, optimizer (its state loaded when `state` is given) and workload, on `device`."""
    cfg, _ = case_config(case)
    train = case["mode"] == "train"
    torch.manual_seed(0)
    if case.get("deepspeed"):  # one rank of DeepSpeed's engine (inside sharding(case): its comm on the fake group)
        if state is not None:
            raise ValueError("a DeepSpeed point is run fresh: resume is not modelled for its engine")
        with torch.device(device):  # the model in bf16, the rest as the truth's (zero_engine.engine_workload)
            return zero_engine.engine_workload(case, cfg)
    with torch.device(device), default_dtype(model_dtype(case.get("precision", "fp32"))):
        model = build_model(case, cfg, fake=False)
        opt = build_optimizer(model, case["optimizer"], case.get("optimizer_impl", "foreach")) if train else None
        if opt is not None and state is not None:
            opt.load_state_dict(state)  # each state tensor copied to its parameter's device, one after another
        w = make_workload(case, cfg, model, opt)
    return w


def _checkpoint_state(case: dict[str, Any], device: str) -> dict:
    """An optimizer state_dict as a checkpoint holds it (tensors on the host): made by one step on zero
    gradients (torch.optim makes its state lazily inside step())."""
    w = _build(case, device, None)
    for p in w.model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    w.optimizer.step()
    sd = w.optimizer.state_dict()
    sd = {"state": {k: {n: (v.to("cpu", copy=True) if isinstance(v, torch.Tensor) else v) for n, v in s.items()}
                    for k, s in sd["state"].items()}, "param_groups": sd["param_groups"]}
    del w
    gc.collect()
    return sd


def _tokens(case: dict[str, Any]) -> tuple[int, int]:
    """(tokens of one training step or of the prompt, tokens of one decode step)."""
    b = int(case["batch"])
    return b * max(int(case.get("seq_len") or 1), 1), b


def run_once(case: dict[str, Any], meter, steps: int, state: dict | None = None) -> dict[str, Any]:  # noqa: ANN001
    """Build the point on the meter's device and run `steps` training steps (or one request); per-phase records,
    what was allocated before the first step, and run_steps' totals. Raises torch.OutOfMemoryError."""
    meter.records = []
    w = _build(case, meter.device, state)
    w.steps = steps
    meter.release()  # a script starts from its loaded weights, not from construction's cached blocks
    externals = [*w.model.parameters(), *w.model.buffers(),
                 *(w.reference.parameters() if w.reference is not None else ()),
                 *(v for v in w.inputs.values() if isinstance(v, torch.Tensor)),
                 *(_optimizer_tensors(w.optimizer) if w.optimizer is not None else [])]
    before = storage_bytes(externals)
    finite = zero_engine.answered_finite(w.optimizer.zero) if case.get("deepspeed") else contextlib.nullcontext()
    try:
        with run_contexts(case, fake=False), meter.run(externals), finite:
            totals = run_steps(w, meter)
    finally:
        if case.get("deepspeed"):  # else the engine outlives the run, and the next run starts on top of it
            zero_engine.destroy(w)
    return {"records": list(meter.records), "before_bytes": before, "totals": totals}


def _steps_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per training step (or request part: prefill, decode i): the max over its phases, its seconds summed."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for r in records:
        part = ("step", r["step"]) if r["phase"] in ("forward", "backward", "optimizer") else (r["phase"], r["step"])
        cur = out.setdefault(part, {"part": part[0], "step": part[1], "seconds": 0.0, "phases": {}})
        cur["seconds"] += r["seconds"]
        cur["phases"][r["phase"]] = r
        for k, v in r.items():
            if k not in ("phase", "step", "seconds") and (k.startswith("max_") or k.endswith(".peak")):
                cur[k] = max(cur.get(k, 0), v)
    return list(out.values())


Probe = Callable[..., bool]  # a fresh run under a cap of so many bytes: whether its steps completed


def probe_here(case: dict[str, Any], meter, steps: int, state: dict | None = None,  # noqa: ANN001
               baseline: int | None = None) -> Probe:
    """Probes run in this process, one fresh build each. With a `baseline` (what was allocated after the measured
    run had released), each must release down to it (LeftAllocated): a run whose tensors outlive it would have the
    next one start on top of them."""
    def probe(cap: int, record: Path | None = None) -> bool:
        meter.limit(cap)
        ok = True
        try:
            with _snapshot(record, "cuda"):  # asked for on a GPU only (measure_point records there alone)
                run_once(case, meter, steps, state)
        except torch.OutOfMemoryError:
            ok = False
        finally:
            meter.limit(None)
            _collect(meter)  # after the except block: the exception's frames no longer hold the run's tensors
        _check_released(meter, baseline, f"the run capped at {cap:,} B")
        return ok
    return probe


def least_capacity(probe: Probe, low: int, high: int, *, resolution: float = RESOLUTION,
                   deadline: float | None = None, on_probe: Callable[[int, bool], None] | None = None,
                   guess: int | None = None) -> tuple[int, list[dict[str, Any]]]:
    """The least cap in [low, high] within which a fresh run completes (`high` must complete, `low` must not), to
    `resolution` of `high`; and every probe. Completing is taken as monotone in the cap. With a `guess` inside the
    bracket (the allocator model's need on the measured run's own recording), the first probes are at the guess and
    one step below it (above it where the guess fails): a right model is confirmed in two runs, and a wrong one
    leaves a bracket the bisection goes on from. Where every probe ran out of memory, the top is probed too: a
    figure no run completed at is no measurement (NoneCompleted)."""
    probes: list[dict[str, Any]] = []
    step = max(int(resolution * high), 1)

    def run(cap: int) -> bool:
        if deadline is not None and time.monotonic() > deadline:
            raise OutOfTime(f"bisection stopped between {low:,} and {high:,} B")
        ok = probe(cap)
        probes.append({"cap": cap, "completed": ok})
        if on_probe is not None:
            on_probe(cap, ok)
        return ok

    tries = [] if guess is None or not low < guess < high else [guess]
    while tries or high - low > step:
        cap = tries.pop() if tries else (low + high) // 2
        if run(cap):
            high = cap
            nxt = cap - step
        else:
            low = cap
            nxt = cap + step
        if cap == guess and low < nxt < high:
            tries.append(nxt)
    if probes and not any(p["completed"] for p in probes) and not run(high):
        raise NoneCompleted(f"no capped run completed, not even at the top of the bracket, {high:,} B")
    return high, probes


def capped_run(case: dict[str, Any], device: str, cap: int, steps: int = 2, record: Path | None = None) -> bool:
    """One fresh run of the case under `cap` in this process, its rank's process group around it (the GPU kit's
    --probe: a DeepSpeed point's capped run in a process of its own); whether its steps completed; `record`: its
    allocator history dumped there (CUDA). Refused where the device has less free than the cap (memory other
    processes hold is no cap of this one's)."""
    meter = meter_for(device)
    if device == "cuda":
        free = torch.cuda.mem_get_info()[0]
        if free < cap:
            raise RuntimeError(f"the device has {free:,} B free, less than the cap of {cap:,} B")
    with frozen_heap(), rank_group(case):
        return probe_here(case, meter, steps)(cap, record)


def model_guess(path: Path) -> int | None:
    """The allocator model's least capacity on a run's own recording (replays.least_capacity over
    allocator.snapshot.sequence from its last empty_cache on, under the process's PYTORCH_CUDA_ALLOC_CONF), the
    bisection's first probe; None where the recording cannot be replayed so. On the H100's three DeepSpeed points
    (2026-11-27): +0.19 % and −1.2 % of the GPU's least capacity, and inside the third's bracket."""
    from ..allocator import AllocatorOptions
    from ..allocator.snapshot import load, sequence
    from ..replays import least_capacity as replayed

    try:
        options = AllocatorOptions.from_alloc_conf(os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
        return int(replayed(sequence(load(path), after_release=True), options)[1])
    except Exception:  # noqa: BLE001 - a first guess: without it the bisection starts from the middle
        return None


def _collect(meter) -> None:  # noqa: ANN001
    gc.collect()
    meter.release()


@contextlib.contextmanager
def frozen_heap():
    """The objects alive now (torch's, transformers' and peft's modules, the caller's) moved out of the collector's
    reach while the block runs (gc.freeze), so that the collection before and after each point, which frees the
    last point's model and its cycles, walks only what the points made: 0.25 s a collection otherwise, a third of a
    dry run of the kit. Collected once first, so no garbage is frozen; thawed afterwards. Inside another such block
    (the kit's, around every point) it does nothing."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def _snapshot(path: Path | None, device: str):
    """Record the allocator's history while the block runs and dump it to `path` (CUDA only; nothing else)."""
    if path is None or device != "cuda":
        yield
        return
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=2_000_000)
    try:
        yield
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def rank_group(case: dict[str, Any]):  # noqa: ANN201 - a context manager
    """What every run of a sharded point happens inside: one rank on PyTorch's fake process group (DeepSpeed's: with
    its comm layer on it); nothing for one GPU."""
    return zero_engine.rank_comm(case["deepspeed"]) if case.get("deepspeed") else sharding(case)


def measure_point(case: dict[str, Any], device: str, *, steps: int = 2, timing_steps: int = 2,
                  resume: bool = False, bisect: bool = True, resolution: float = RESOLUTION,
                  snapshot: Path | None = None, deadline: float | None = None,
                  say: Callable[[str], None] = lambda line: None, probe: Probe | None = None) -> dict[str, Any]:
    """Every figure of one point (see the module docstring) as plain ints, floats and strings. A point the device
    cannot hold ends with `error` set (OOM ...), the figures measured before it kept. `probe`: how a capped run
    is made, where not in this process (the GPU kit's DeepSpeed points: a process each, kit.fresh_probe)."""
    with frozen_heap(), rank_group(case):
        return _measure_point(case, device, steps=steps, timing_steps=timing_steps, resume=resume, bisect=bisect,
                              resolution=resolution, snapshot=snapshot, deadline=deadline, say=say, probe=probe)


def _measure_point(case: dict[str, Any], device: str, *, steps: int, timing_steps: int, resume: bool, bisect: bool,
                   resolution: float, snapshot: Path | None, deadline: float | None,
                   say: Callable[[str], None], probe: Probe | None = None) -> dict[str, Any]:
    meter = meter_for(device)
    train = case["mode"] == "train"
    rec: dict[str, Any] = {"device": device, "steps_measured": steps if train else 1, "resume": resume}
    state = _checkpoint_state(case, device) if (train and resume) else None
    _collect(meter)
    # what the process still held from earlier points (their library workspaces; a run that outlived itself): the
    # peaks below count it, so the comparison takes it off (gpu_compare.leftover_bytes)
    rec["start_allocated"] = meter.allocated()
    t0 = time.monotonic()
    with _snapshot(snapshot, device):
        run = run_once(case, meter, steps + (timing_steps if train else 0), state)
    rec["run_seconds"] = round(time.monotonic() - t0, 3)
    rec["outside_bytes"] = meter.outside_bytes()
    rec["capacity_bytes"] = meter.total or None
    rec["before_bytes"] = run["before_bytes"]
    rec["totals"] = run["totals"]
    parts = _steps_of(run["records"])
    rec["parts"] = parts
    measured = [p for p in parts if p["part"] != "step" or p["step"] <= steps]
    rec["max_allocated"] = max(p["max_allocated"] for p in measured)
    rec["max_reserved"] = max(p["max_reserved"] for p in measured)
    rec["tokens_per_s"] = _throughput(case, parts, steps)
    if snapshot is not None and device == "cuda":
        rec["snapshot"] = snapshot.name
    say(f"allocated {rec['max_allocated']:,} B, reserved {rec['max_reserved']:,} B"
        + (f", outside PyTorch {rec['outside_bytes']:,} B" if rec["outside_bytes"] is not None else ""))
    _collect(meter)
    rec["end_allocated"] = meter.allocated()  # above start_allocated: the run's tensors outlive it (FSDP1's did)
    if bisect:
        high = rec["max_reserved"] if device == "cuda" else rec["max_allocated"]
        high = max(high + int(resolution * high), high + 1)  # a cap at the unlimited run's peak reserved completes
        try:
            guess = model_guess(snapshot) if (snapshot is not None and snapshot.exists()) else None
            if guess is not None:
                rec["model_least_capacity"] = guess
                say(f"  the allocator model on this run's recording needs {guess:,} B")
            probe = probe or probe_here(case, meter, steps, state, meter.allocated() if device == "cuda" else None)
            need, probes = least_capacity(probe, rec["max_allocated"] - 1, high, resolution=resolution,
                                          deadline=deadline, guess=guess,
                                          on_probe=lambda cap, ok: say(f"  cap {cap:,} B: "
                                                                       f"{'completes' if ok else 'out of memory'}"))
            rec["least_capacity"] = need
            rec["bisection"] = probes
        except (OutOfTime, LeftAllocated, NoneCompleted) as e:
            rec["bisection_note"] = str(e)
            say(str(e))
        # outside the bisection: whatever befalls the extra recording, the point's figures above are kept
        if "least_capacity" in rec and snapshot is not None and device == "cuda" and \
                (deadline is None or time.monotonic() < deadline):
            rec.update(_capped_by(probe, rec["least_capacity"], snapshot))
        _collect(meter)
    return rec


def capped_path(snapshot: Path) -> Path:
    """Where the run at the least capacity is recorded, beside the measured run's `snapshot`."""
    return snapshot.with_name(f"{snapshot.stem}-capped{snapshot.suffix}")


def _capped_snapshot(case: dict[str, Any], meter, steps: int, state: dict | None, cap: int,  # noqa: ANN001
                     snapshot: Path) -> dict[str, Any]:
    """One more run at the least capacity, its allocator history recorded beside the uncapped one's
    (`<name>-capped.pickle`): what the allocator did under the cap (its releases and retries), which a replay of the
    uncapped recording can only infer (docs/accuracy.md: the Qwen3 LoRA point). In this process: _capped_by."""
    return _capped_by(probe_here(case, meter, steps, state), cap, snapshot)


def _capped_by(probe: Probe, cap: int, snapshot: Path) -> dict[str, Any]:
    """The run at `cap` made and recorded by `probe(cap, record=path)` (probe_here's in this process; a DeepSpeed
    point's in a process of its own, kit.fresh_probe), kept where it completed; one that runs out of memory this
    time, or fails, is said, not recorded."""
    capped = capped_path(snapshot)
    try:
        ok = probe(cap, record=capped)
    except Exception as e:  # noqa: BLE001 - an extra recording: its failure is said, the point's figures stand
        capped.unlink(missing_ok=True)
        text = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        return {"capped_snapshot_note": f"the run at {cap:,} B failed ({text}): not recorded"}
    if ok and capped.exists():
        return {"capped_snapshot": capped.name}
    capped.unlink(missing_ok=True)
    return {"capped_snapshot_note": f"the run at {cap:,} B ran out of memory this time: not recorded"}


def _throughput(case: dict[str, Any], parts: list[dict[str, Any]], steps: int) -> dict[str, float]:
    """Steady tokens per second: the training steps after the measured ones; a request's prefill and decode."""
    step_tokens, decode_tokens = _tokens(case)
    out: dict[str, float] = {}
    timed = [p for p in parts if p["part"] == "step" and p["step"] > steps]
    if timed:
        out["train"] = round(step_tokens * len(timed) / max(sum(p["seconds"] for p in timed), 1e-9), 1)
    pre = [p for p in parts if p["part"] == "prefill"]
    if pre:
        out["prefill"] = round(step_tokens / max(pre[0]["seconds"], 1e-9), 1)
    dec = [p for p in parts if p["part"] == "decode"]
    if dec:
        out["decode"] = round(decode_tokens * len(dec) / max(sum(p["seconds"] for p in dec), 1e-9), 1)
    return out
