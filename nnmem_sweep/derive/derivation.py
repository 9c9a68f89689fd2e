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

import numpy as np

from ..testhook import checkpoint
from . import budget, events as E
from . import moments as M
from . import source as src
from . import solve, step
from .plans import DerivedPlan, Region

S_PROBES = (64, 96, 128)
B_PROBES = (2, 3)
S_SHORT = 17
S_FAR = 8192  # capped at the model's max_position_embeddings where it has one


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


# the phases whose moments make a plan, per workload: (phase, step) spans of the trace
# An inference plan has the prefill, the first decode step (at the prompt's length: where a sliding-window cache is
# still the prefill's, not yet cut to the window) and a later step ("decode+", the second traced step: every step k
# >= 2 is it at a cache k - 2 tokens longer, checked against the third).
PHASES = {"train": (("forward", 1), ("backward", 1)), "infer": (("prefill", 1), ("decode", 1), ("decode+", 2)),
          "infer-forward": (("forward", 1),)}
# config fields whose value is a sequence length where a model's program may change (an explicit mask is built, a
# sliding-window cache stops growing, a chunked attention starts a new chunk, long-context RoPE switches)
THRESHOLD_FIELDS = ("sliding_window", "attention_chunk_size", "original_max_position_embeddings", "chunk_size",
                    "local_window_size")
MAX_REGIONS = 8  # changes of program or size rule along the sequence


def _phases(st: step.StepTrace, mode: str) -> list[tuple[str, int, int]]:
    spans = {(name, k): (lo, hi) for name, k, lo, hi in st.trace.spans}
    key = mode if mode == "train" or ("prefill", 1) in spans else "infer-forward"
    return [(name, *spans[name.rstrip("+"), k]) for name, k in PHASES[key]]


def _region(st: step.StepTrace, coef, b_lo, b_hi, s_lo, s_hi, mode: str) -> Region:
    tr = st.trace
    ms = M.moments(tr.events, tr.ops, st.alloc_kind, coef, _phases(st, mode), b_lo, b_hi, s_lo)
    live = M.live_by_kind(tr.events, st.alloc_kind, coef)
    end = {k: tuple(int(x) for x in live[k][tr.marks["end"] - 1]) for k in M.KINDS}
    return Region(b_lo, b_hi, s_lo, tuple(ms), end, s_hi, E.encode(tr.events, st.alloc_kind, coef, tr.streams))


def _check_decode_steps(st: step.StepTrace, coef, label: str) -> None:
    """A request's third decode step must be its second at a cache one token longer, the prompt's ids unchanged:
    the assumption that lets the plan evaluate the last step of a long generation at cache length
    s + decode_tokens - 2 from the second step (moments are allocations: frees in between are not compared)."""
    spans = {(name, k): (lo, hi) for name, k, lo, hi in st.trace.spans}
    if ("decode", 3) not in spans:
        return
    (a0, a1), (b0, b1) = spans["decode", 2], spans["decode", 3]
    if a1 - a0 != b1 - b0:
        raise src.DerivationError(f"{label}: the third decode step runs a different program than the second")
    live = M.live_by_kind(st.trace.events, st.alloc_kind, coef)
    grown = sum(v for k, v in live.items() if k != step.INPUT)
    allocs = st.trace.events[a0:a1, 1] > 0
    x1, x2 = grown[a0:a1][allocs], grown[b0:b1][allocs]
    # step 3 at (b, s) == step 2 at (b, s + 1): substitute s -> s + 1 in step 2's polynomials
    c0, cs, cb, cbs, cbs2, css = (x1[:, i] for i in range(6))
    shifted = np.stack([c0 + cs + css, cs + 2 * css, cb + cbs + cbs2, cbs + 2 * cbs2, cbs2, css], axis=1)
    same_inputs = np.array_equal(live[step.INPUT][a0:a1][allocs], live[step.INPUT][b0:b1][allocs])
    if not (same_inputs and np.array_equal(shifted, x2)):
        raise src.DerivationError(f"{label}: a later decode step is not the one before it at a longer cache "
                                  "(the cache does not grow by one token per step)")


# The probe being traced in this process: what a forked tracing worker inherits (_trace_in_worker).
_WORKER_PROBE: list = []
# Non-empty inside a process that derives plans in parallel with others (derive.prefetch's workers): its probes are
# traced there one after another, the cores already busy.
IN_WORKER: list[bool] = []


def _trace_in_worker(shape: tuple[int, int]):
    return _WORKER_PROBE[0].trace_here(*shape)


class _Probe:
    """Traces of one recipe at any shape, each traced once. With more than one core, shapes asked for together
    (`prefetch`) are traced in parallel by worker processes forked once, right after the model is built (autograd
    refuses to run in a child forked after a backward pass, so the workers are made before the first trace); the
    derivation itself stays sequential and finds them traced."""

    def __init__(self, source, mode, recipe, attention, checkpointing, device, progress):
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.fake = FakeTensorMode()
        self.case = src.case(source, mode, recipe, attention, checkpointing, device)
        with src.quiet(), self.fake:
            self.model, self.cfg = src.build(source, self.case)
        self.device, self.progress = device, progress
        self.mode = mode
        self.label = f"{mode} {recipe} {attention}" + (f" checkpointing={checkpointing}" if mode == "train" else "")
        self.traces: dict[tuple[int, int], step.StepTrace] = {}
        self.pool = self._pool()

    def _pool(self):
        import os

        from ..workload import steps

        workers = min(4, os.cpu_count() or 1)
        if workers < 2 or IN_WORKER or steps.BACKWARD_RAN:
            return None
        _WORKER_PROBE[:] = [self]
        try:
            return budget.pool(workers)
        finally:
            _WORKER_PROBE.clear()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None

    def trace_here(self, b: int, s: int) -> step.StepTrace:
        checkpoint("trace")
        try:
            with src.quiet(), self.fake, budget.probe(b, s):
                return step.run(self.model, dict(self.case, batch=b, seq_len=s), self.cfg, self.device)
        except src.DerivationError:
            raise
        except Exception as e:  # noqa: BLE001 - the model's own code failed on its config: one line, not a stack
            raise src.DerivationError(f"{self.label}: the model's code failed at batch {b}, sequence {s}: "
                                      f"{type(e).__name__}: {e}") from None

    def prefetch(self, shapes) -> None:
        """Trace the shapes not traced yet, in parallel where there are workers."""
        todo = [sh for sh in dict.fromkeys(shapes) if sh not in self.traces]
        if not todo:
            return
        _say(self.progress, f"deriving {self.label}: tracing {len(todo)} shapes ({len(self.traces) + 1}-"
                            f"{len(self.traces) + len(todo)})")
        if self.pool is None or len(todo) < 2:
            for sh in todo:
                self(*sh)
            return
        for sh, t in zip(todo, budget.result(self.pool.map_async(_trace_in_worker, todo, chunksize=1))):
            self.traces[sh] = t

    def __call__(self, b: int, s: int) -> step.StepTrace:
        if (b, s) not in self.traces:
            _say(self.progress, f"deriving {self.label}: tracing batch {b}, sequence {s} ({len(self.traces) + 1})")
            if self.pool is not None:
                self.traces[b, s] = budget.result(self.pool.apply_async(_trace_in_worker, ((b, s),)))
            else:
                self.traces[b, s] = self.trace_here(b, s)
        return self.traces[b, s]

    def agrees(self, shape, base, coef) -> bool:
        """Whether the step at `shape` is the program of `base` with the sizes `coef` predicts."""
        t = self(*shape)
        return (t.trace.signature() == base.trace.signature()
                and not len(solve.check(shape, step.alloc_sizes(t), coef)))


def _regions_in(probe: _Probe, s_lo: int, s_hi: int | None, top: int, s_check: int,
                hints: list[int] = ()) -> tuple[list[Region], int]:
    """Regions of (b, s) with s from s_lo on, where the program is the same up to `top` (s_hi: None when it holds
    beyond the longest probe): the general one (b >= 2, or b >= 1 where batch 1 is the same program) and, where
    batch 1 differs, its own (b = 1). Returns them and the last sequence length they cover, which is below `top`
    where the sizes stop following the polynomial although the program is the same (a cache capped at a window)."""
    width = top - s_lo
    if width < 4:  # a few sequence lengths between two changes of program: each its own region, polynomial in b
        regions: list[Region] = []
        for s in range(s_lo, top + 1):
            regions += _fixed_s(probe, s)
        return regions, top
    for d in (min(32, width // 2), 1):  # spacing 1 where sizes change rule right above s_lo (a cap at a window)
        s_probes = [s_lo, s_lo + d, s_lo + 2 * d]
        shapes = [(b, s) for s in s_probes for b in B_PROBES]
        # with them, the checks and the two batch-1 shapes that tell whether batch 1 is the same program (traced
        # together where there are cores to spare); batch 1's other probes only where it is not (below)
        probe.prefetch(shapes + [(2, s_check), (4, top), (1, s_probes[0]), (1, top)])
        try:
            coef = _solve_region(probe.traces, shapes, [], None, probe.label)
            break
        except src.DerivationError:
            continue
    else:  # s_lo is a length of its own
        return _fixed_s(probe, s_lo), s_lo
    base = probe.traces[shapes[0]]
    if s_check < s_lo and not probe.agrees((2, s_check), base, coef):
        raise src.DerivationError(f"{probe.label}: at (b, s) = (2, {s_check}) the sizes are not what the probes "
                                  f"{shapes} predict")
    last = top
    if top > s_probes[-1] and not probe.agrees((4, top), base, coef):
        last = _breakpoint(probe, s_probes[-1], top, base, coef, list(hints))
        s_hi = last
    if probe.mode == "infer":
        _check_decode_steps(base, coef, probe.label)
    lo = min(s_check, s_lo)
    if probe.agrees((1, s_probes[0]), base, coef) and probe.agrees((1, last), base, coef):
        return [_region(base, coef, 1, None, lo, s_hi, probe.mode)], last
    ones = [(1, s) for s in s_probes]
    one_checks = [(1, last)] if last > s_probes[-1] else []
    probe.prefetch(ones + one_checks)  # in parallel where there are cores
    coef1 = _solve_region(probe.traces, ones, one_checks, (0, 1, 5), f"{probe.label}, batch 1")
    return [_region(probe.traces[ones[0]], coef1, 1, 1, lo, s_hi, probe.mode),
            _region(base, coef, 2, None, lo, s_hi, probe.mode)], last


def _fixed_s(probe: _Probe, s: int) -> list[Region]:
    """One sequence length: the sizes as polynomials in b (1, b) from batches 2 and 3, checked at 4 (batch 1 its own
    region where it is another program)."""
    shapes, checks = [(2, s), (3, s)], [(4, s)]
    probe.prefetch(shapes + checks + [(1, s)])
    coef = _solve_region(probe.traces, shapes, checks, (0, 2), probe.label)
    base = probe.traces[shapes[0]]
    if probe.agrees((1, s), base, coef):
        return [_region(base, coef, 1, None, s, s, probe.mode)]
    coef1 = _solve_region(probe.traces, [(1, s)], [], (0,), f"{probe.label}, batch 1")
    return [_region(probe.traces[1, s], coef1, 1, 1, s, s, probe.mode),
            _region(base, coef, 2, None, s, s, probe.mode)]


def _program_end(probe: _Probe, s_lo: int, far: int, hints: list[int]) -> int:
    """The largest s in [s_lo, far] at which the step (b = 2) runs the program it runs at s_lo (one change point
    between two lengths that agree is assumed: a config threshold where one fits, else bisection)."""
    probe.prefetch([(2, s_lo), (2, far)] + [(2, h) for h in hints if s_lo < h < far])
    sig = probe(2, s_lo).trace.signature()

    def same(s: int) -> bool:
        return probe(2, s).trace.signature() == sig

    if same(far):
        return far
    lo, hi = s_lo, far
    for h in hints:
        if lo < h < hi:
            if same(h):
                lo = h
            else:
                hi = h
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if same(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _breakpoint(probe: _Probe, lo: int, hi: int, base, coef, hints: list[int]) -> int:
    """The largest s in [lo, hi) at which the step (b = 2) is still the program `coef` describes, given that it is
    at lo and is not at hi: a config threshold where one fits, else by bisection."""
    for h in hints:
        if lo <= h < hi and probe.agrees((2, h), base, coef) and not probe.agrees((2, h + 1), base, coef):
            return h
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if probe.agrees((2, mid), base, coef):
            lo = mid
        else:
            hi = mid
    return lo


def derive(source: src.ModelSource, mode: str, recipe: str, attention: str, checkpointing: str = "none",
           device: str = "cuda", progress: bool = False) -> DerivedPlan:
    """The plan of one trace recipe (see the module docstring): a training step's forward and backward, or an
    inference request's prefill and first decode step."""
    t0 = time.perf_counter()
    label = f"{mode} {recipe} {attention}" + (f" checkpointing={checkpointing}" if mode == "train" else "")
    from ..workload.build import sharding

    # a sharded step (source.fsdp) is built and traced on PyTorch's fake process group, for the whole derivation
    with budget.derivation(label), sharding(src.case(source, mode, recipe, attention, checkpointing, device)):
        probe = _Probe(source, mode, recipe, attention, checkpointing, device, progress)
        try:
            return _derive(probe, source, mode, recipe, attention, checkpointing, device, progress, t0)
        except BaseException:
            if progress:  # the progress line goes, so that what stopped it is a line of its own
                print("\r" + " " * 120 + "\r", end="", file=sys.stderr, flush=True)
            raise
        finally:
            probe.close()


def _derive(probe: _Probe, source, mode: str, recipe: str, attention: str, checkpointing: str, device: str,
            progress: bool, t0: float) -> DerivedPlan:
    if mode == "infer" and getattr(getattr(probe.model, "config", None), "is_encoder_decoder", False):
        raise src.DerivationError(f"{probe.label}: an encoder-decoder's request is measured (`nnmem-sweep measure`) "
                                  "but not derived: its decoder cache grows with the generated tokens, not with the "
                                  "prompt; training is derived")
    notes: list[str] = []
    if not source.sequence:
        shapes, checks = [(2, 1), (3, 1)], [(4, 1)]
        probe.prefetch(shapes + checks + [(1, 1)])
        coef = _solve_region(probe.traces, shapes, checks, (0, 2), probe.label)
        base = probe.traces[shapes[0]]
        if probe.agrees((1, 1), base, coef):
            regions = [_region(base, coef, 1, None, 1, None, mode)]
        else:
            coef1 = _solve_region(probe.traces, [(1, 1)], [], (0,), f"{probe.label}, batch 1")
            regions = [_region(probe.traces[1, 1], coef1, 1, 1, 1, None, mode),
                       _region(base, coef, 2, None, 1, None, mode)]
    else:
        _no_loop_per_token(probe)
        checkpoint("solve")
        cfgs = [source.spec, source.spec.get("text_config") or {}]
        hints = sorted({int(v) + d for c in cfgs if isinstance(c, dict) for k in THRESHOLD_FIELDS
                        for v in [c.get(k)] if isinstance(v, int) and not isinstance(v, bool) for d in (-1, 0, 1)})
        far = _far(source, hints)
        regions, s_lo, s_check = [], S_PROBES[0], S_SHORT
        while True:  # from s_lo on: how far the program stays the same, its regions there, then on above them
            top = _program_end(probe, s_lo, far, hints)
            here, last = _regions_in(probe, s_lo, None if top == far else top, top, s_check, hints)
            if last < top:
                notes.append(f"the sizes follow another rule above sequence {last}")
            elif top < far:
                notes.append(f"the program changes above sequence {top}")
            regions += here
            if last >= far:
                break
            if len(notes) >= MAX_REGIONS:
                raise src.DerivationError(f"{probe.label}: the program changes more than {MAX_REGIONS} times "
                                          f"between sequence {S_PROBES[0]} and {far}")
            s_lo = s_check = last + 1
    base = probe.traces[(2, S_PROBES[0]) if source.sequence else (2, 1)]
    kinds = base.alloc_kind
    sizes = step.alloc_sizes(base)
    param = int(sum(n for n, k in zip(sizes, kinds) if k == step.PARAM))
    grad = int(sum(n for n, k in zip(sizes, kinds) if k == step.GRAD))  # constant: equal at every probe
    _say(progress, "")
    return DerivedPlan(mode, recipe, attention, checkpointing, device, tuple(regions), param, grad,
                       tuple(probe.traces), len(base.trace.events), time.perf_counter() - t0, tuple(notes),
                       base.trace.host_bytes)


LOOP_GROWTH = 1.3  # events at S_PROBES[1] over those at S_PROBES[0] past which the step loops per token


def _no_loop_per_token(probe: _Probe) -> None:
    """Refuse, after two short probes and before any long one, a step whose program grows with the sequence: code
    that loops over the tokens on this machine (Mamba's selective scan without mamba-ssm's CUDA kernels) has no
    polynomial plan, its trace at thousands of tokens is millions of events, and a GPU runs a fused kernel instead,
    whose memory this code does not show."""
    short, longer = (2, S_PROBES[0]), (2, S_PROBES[1])
    probe.prefetch([short, longer])
    n0, n1 = len(probe(*short).trace.events), len(probe(*longer).trace.events)
    if n1 > LOOP_GROWTH * n0:
        raise src.DerivationError(
            f"{probe.label}: its step runs a loop over the tokens on this machine ({n0:,} storage events at sequence "
            f"{short[1]}, {n1:,} at {longer[1]}), not the fused kernel a GPU runs (a state-space model's selective "
            "scan, say): its GPU memory cannot be derived from this code, so it is not planned")


def _far(source: src.ModelSource, hints: list[int]) -> int:
    """The long check sequence: S_FAR, or twice the largest config threshold where that is longer (the program
    above a sliding window or an attention chunk is then probed too), capped at the model's longest position."""
    limit = source.spec.get("max_position_embeddings") or source.spec.get("n_positions")
    far = max(S_FAR, 2 * max(hints, default=0))
    return min(far, int(limit)) if isinstance(limit, int) and limit > S_PROBES[-1] + 64 else far
