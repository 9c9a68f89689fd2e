"""Derive a step's moments from traces at probe shapes: the plan the estimator evaluates for a derived model.

Probing (training; inference in infer.py). The step is traced at six shapes, b ∈ {2, 3} × s ∈ {64, 96, 128},
which determine the six coefficients of every allocation's size exactly (solve.py), then checked at two shapes
left out of the solve: (4, S_FAR), a larger batch and a long sequence, and (2, S_SHORT), a short sequence. Every probe must run the same
program (the same ops, allocations and frees in the same order) and every size must be what the solved
polynomial predicts; otherwise the derivation stops with the shapes that disagree. Batch 1 is often a different
program (`.contiguous()` does not copy a (1, s) slice): it is traced on its own and, where it differs, becomes a
region with its own polynomials in s (1, s, s²), probed at s ∈ {64, 96, 128} and checked at S_FAR.
Models without a sequence axis (image classifiers) are probed at b ∈ {2, 3} and checked at 4 (and b = 1).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

from . import moments as M
from . import source as src
from . import solve, step

S_PROBES = (64, 96, 128)
B_PROBES = (2, 3)
S_SHORT = 17
S_FAR = 8192  # capped at the model's max_position_embeddings where it has one


@dataclass(frozen=True)
class Region:
    """Where one set of polynomials holds: b_lo <= b <= b_hi (None: unbounded), s >= s_lo."""

    b_lo: int
    b_hi: int | None
    s_lo: int
    moments: tuple[M.Moment, ...]
    end: dict[str, tuple[int, ...]]  # kind -> coefficients live after backward (the optimizer step's company)


@dataclass(frozen=True)
class DerivedPlan:
    mode: str  # train | infer
    recipe: str  # trace recipe (source.TRACE_RECIPE values)
    attention: str
    checkpointing: str
    device: str
    regions: tuple[Region, ...]
    param_bytes: int  # the traced model's parameter storages
    grad_bytes: int  # gradients after backward (train); the KV cache's bytes are polynomials (infer)
    probes: tuple[tuple[int, int], ...]  # every shape traced
    events: int  # events of one traced step (b >= 2)
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)


def _say(progress, text: str) -> None:
    if progress:
        print(f"\rnnmem-sweep: {text}" + " " * 8, end="", file=sys.stderr, flush=True)


def _solve_region(traces: dict, shapes: list, checks: list, used, label: str):
    """Solved coefficients (6, n_alloc) for the traces at `shapes`, checked at `checks`."""
    first = traces[shapes[0]]
    sig = first.trace.signature()
    for sh in shapes + checks:
        if traces[sh].trace.signature() != sig:
            raise src.DerivationError(f"{label}: the step at (b, s) = {sh} runs a different program than at "
                                      f"{shapes[0]} ({_first_difference(first, traces[sh])})")
    sizes = np.stack([step.alloc_sizes(traces[sh]) for sh in shapes])
    try:
        coef = solve.solve(shapes, sizes, used)
    except solve.NotPolynomial as e:
        raise src.DerivationError(f"{label}: {e}") from None
    for sh in checks:
        bad = solve.check(sh, step.alloc_sizes(traces[sh]), coef)
        if len(bad):
            raise src.DerivationError(f"{label}: allocation {int(bad[0])} at (b, s) = {sh} is not what the "
                                      f"probes {shapes} predict")
    return coef


def _first_difference(a: step.StepTrace, b: step.StepTrace) -> str:
    oa, ob = a.trace.ops, b.trace.ops
    for i, (x, y) in enumerate(zip(oa, ob)):
        if x != y:
            return f"event {i}: {x or 'free'} vs {y or 'free'}"
    return f"{len(oa)} vs {len(ob)} events"


PHASES = {"train": ("forward", "backward"), "infer": ("prefill", "decode")}


def _region(st: step.StepTrace, coef, b_lo, b_hi, s_lo, mode: str) -> Region:
    tr = st.trace
    first, second = PHASES[mode]
    phases = [(first, tr.marks[first], tr.marks[second]), (second, tr.marks[second], tr.marks["end"])]
    ms = M.moments(tr.events, tr.ops, st.alloc_kind, coef, phases, b_lo, b_hi, s_lo)
    live = M.live_by_kind(tr.events, st.alloc_kind, coef)
    end = {k: tuple(int(x) for x in live[k][-1]) for k in M.KINDS}
    return Region(b_lo, b_hi, s_lo, tuple(ms), end)


def derive(source: src.ModelSource, mode: str, recipe: str, attention: str, checkpointing: str = "none",
           device: str = "cuda", progress: bool = False) -> DerivedPlan:
    """The plan of one trace recipe (see the module docstring): a training step's forward and backward, or an
    inference request's prefill and first decode step."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..measure.build import default_dtype

    t0 = time.perf_counter()
    dtype, amp = src.torch_dtypes(recipe)
    fake = FakeTensorMode()
    with src.quiet(), fake:
        model = src.build(source, recipe, attention, checkpointing, mode == "train")
    traces: dict[tuple[int, int], step.StepTrace] = {}
    label = f"{mode} {recipe} {attention}" + (f" checkpointing={checkpointing}" if mode == "train" else "")

    def run(b: int, s: int) -> step.StepTrace:
        if (b, s) not in traces:
            _say(progress, f"deriving {label}: tracing batch {b}, sequence {s} ({len(traces) + 1})")
            with src.quiet(), fake, default_dtype(dtype):
                inp, loss_fn = src.inputs(source, model, b, s, mode == "train")
                with step.kernels(device, attention):
                    traces[b, s] = (step.train_step(model, inp, amp, loss_fn) if mode == "train" else
                                    step.infer_step(model, inp))
        return traces[b, s]

    if source.sequence:
        shapes = [(b, s) for s in S_PROBES for b in B_PROBES]
        far = _far(source)
        checks = [(4, far), (2, S_SHORT)]
        used, s_lo = None, S_SHORT
    else:
        shapes, checks, used, s_lo = [(2, 1), (3, 1)], [(4, 1)], (0, 2), 1
    for sh in shapes + checks:
        run(*sh)
    coef = _solve_region(traces, shapes, checks, used, label)
    regions = []
    one = (1, shapes[0][1])
    t1 = run(*one)
    same = (t1.trace.signature() == traces[shapes[0]].trace.signature()
            and not len(solve.check(one, step.alloc_sizes(t1), coef)))
    if same:
        regions.append(_region(traces[shapes[0]], coef, 1, None, s_lo, mode))
    else:
        if source.sequence:
            ones = [(1, s) for s in S_PROBES]
            ones_check = [(1, far)]
            for sh in ones + ones_check:
                run(*sh)
            coef1 = _solve_region(traces, ones, ones_check, (0, 1, 5), f"{label}, batch 1")
        else:
            coef1 = _solve_region(traces, [one], [], (0,), f"{label}, batch 1")
        regions.append(_region(traces[ones[0] if source.sequence else one], coef1, 1, 1, s_lo, mode))
        regions.append(_region(traces[shapes[0]], coef, 2, None, s_lo, mode))
    base = traces[shapes[0]]
    kinds = base.alloc_kind
    sizes = step.alloc_sizes(base)
    param = int(sum(n for n, k in zip(sizes, kinds) if k == step.PARAM))
    grad = int(sum(n for n, k in zip(sizes, kinds) if k == step.GRAD))  # constant: equal at every probe
    _say(progress, "")
    return DerivedPlan(mode, recipe, attention, checkpointing, device, tuple(regions), param, grad,
                       tuple(traces), len(base.trace.events), time.perf_counter() - t0)


def _far(source: src.ModelSource) -> int:
    """The long check sequence: S_FAR, or the model's longest position where that is shorter."""
    limit = source.spec.get("max_position_embeddings") or source.spec.get("n_positions")
    return min(S_FAR, int(limit)) if isinstance(limit, int) and limit > S_PROBES[-1] else S_FAR


def evaluate(plan: DerivedPlan, b: int, s: int, decode_tokens: int = 1) -> tuple[int, M.Moment]:
    """The largest traced moment at (b, s) (training: no optimizer state; inference: a decode moment at the cache
    length of the last step, s + decode_tokens - 1): total bytes and the moment. For checks and tests; the
    estimator evaluates whole columns (components/derived.py)."""
    for r in plan.regions:
        if r.b_lo <= b and (r.b_hi is None or b <= r.b_hi):
            best, top = None, None
            for m in r.moments:
                if m.phase == "decode" and decode_tokens < 1:
                    continue
                at = s + decode_tokens - 1 if m.phase == "decode" else s
                v = int(m.total() @ solve.features([b], [at])[0])
                if top is None or v > top:
                    best, top = m, v
            return top, best
    raise ValueError(f"no region holds batch {b}")


def to_json(plan: DerivedPlan) -> dict:
    def region(r: Region) -> dict:
        return {"b_lo": r.b_lo, "b_hi": r.b_hi, "s_lo": r.s_lo, "end": {k: list(v) for k, v in r.end.items()},
                "moments": [[m.phase, m.event, m.op, {k: list(v) for k, v in m.live.items() if any(v)}]
                            for m in r.moments]}

    return {"mode": plan.mode, "recipe": plan.recipe, "attention": plan.attention,
            "checkpointing": plan.checkpointing, "device": plan.device, "param_bytes": plan.param_bytes,
            "grad_bytes": plan.grad_bytes, "probes": [list(p) for p in plan.probes], "events": plan.events,
            "seconds": round(plan.seconds, 2), "notes": list(plan.notes),
            "regions": [region(r) for r in plan.regions]}


def from_json(d: dict) -> DerivedPlan:
    zero = (0,) * len(solve.MONOMIALS)

    def live(x: dict) -> dict[str, tuple[int, ...]]:
        return {k: tuple(int(c) for c in x.get(k, zero)) for k in M.KINDS}

    regions = tuple(Region(r["b_lo"], r["b_hi"], r["s_lo"],
                           tuple(M.Moment(ph, ev, op, live(lv)) for ph, ev, op, lv in r["moments"]),
                           live(r["end"])) for r in d["regions"])
    return DerivedPlan(d["mode"], d["recipe"], d["attention"], d["checkpointing"], d["device"], regions,
                       int(d["param_bytes"]), int(d["grad_bytes"]), tuple(tuple(p) for p in d["probes"]),
                       int(d["events"]), float(d.get("seconds", 0.0)), tuple(d.get("notes", ())))
