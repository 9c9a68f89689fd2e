"""Derived plans as data (no torch needed): the regions of (batch, sequence) and the moments each holds, how a row's
moment is evaluated, and their JSON form (the cache and the shipped plans). derivation.py makes them from traces."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import moments as M
from . import solve
from .kinds import INPUT


@dataclass(frozen=True)
class Region:
    """Where one set of polynomials holds: b_lo <= b <= b_hi and s_lo <= s <= s_hi (None: unbounded)."""

    b_lo: int
    b_hi: int | None
    s_lo: int
    moments: tuple[M.Moment, ...]
    end: dict[str, tuple[int, ...]]  # kind -> coefficients live after the step (the optimizer step's company)
    s_hi: int | None = None
    replay: dict | None = field(default=None, compare=False, repr=False)  # events.encode's sequence (optional)

    def holds(self, b: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Rows in the region (the lowest region also takes s below s_lo: extrapolated, see the plan's notes)."""
        sel = b >= self.b_lo
        if self.b_hi is not None:
            sel &= b <= self.b_hi
        if self.s_hi is not None:
            sel &= s <= self.s_hi
        return sel


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
    # host memory the traced step keeps beside the GPU's (FSDP1's CPU offload: the rank's flat-parameter shards and
    # their pinned CPU gradients, derive/trace.py Recorder.host); 0 for every other step
    host_bytes: int = 0


def region_of(plan: DerivedPlan, b: int, s: int) -> Region:
    """The region holding (b, s): the first, in order of sequence ranges, whose batch range holds b and whose s_hi
    is at least s."""
    for r in plan.regions:
        if r.b_lo <= b and (r.b_hi is None or b <= r.b_hi) and (r.s_hi is None or s <= r.s_hi):
            return r
    raise ValueError(f"no region holds batch {b}, sequence {s}")


def phase_length(phase: str, s, decode_tokens):
    """The sequence length a moment of `phase` is evaluated at: the prompt's, or for the later decode steps the
    cache length of the last one (s + decode_tokens - 2)."""
    return s + decode_tokens - 2 if phase == "decode+" else s


def happens(phase: str, decode_tokens):
    """Whether a request with `decode_tokens` generated tokens has the phase."""
    return decode_tokens >= {"decode": 1, "decode+": 2}.get(phase, 0)


def evaluate(plan: DerivedPlan, b: int, s: int, decode_tokens: int = 1) -> tuple[int, M.Moment]:
    """The largest traced moment at (b, s) (training: no optimizer state; inference: the prefill, the first decode
    step and the last one): total bytes and the moment. For checks and tests; the estimator evaluates whole
    columns (components/derived.py)."""
    best, top = None, None
    at_s = solve.features([b], [s])[0]
    for phase in ("forward", "backward", "prefill", "decode", "decode+"):
        if not happens(phase, decode_tokens):
            continue
        phase_s = phase_length(phase, s, decode_tokens)
        x = solve.features([b], [phase_s])[0]
        for m in region_of(plan, b, phase_s).moments:
            if m.phase == phase:
                inputs = np.asarray(m.live[INPUT], dtype=np.int64)
                v = int((m.total() - inputs) @ x + inputs @ at_s)  # the prompt's ids stay at s
                if top is None or v > top:
                    best, top = m, v
    return top, best


def to_json(plan: DerivedPlan) -> dict:
    def region(r: Region) -> dict:
        return {"b_lo": r.b_lo, "b_hi": r.b_hi, "s_lo": r.s_lo, "s_hi": r.s_hi,
                "end": {k: list(v) for k, v in r.end.items()},
                "moments": [[m.phase, m.event, m.op, {k: list(v) for k, v in m.live.items() if any(v)}]
                            for m in r.moments],
                **({"replay": r.replay} if r.replay is not None else {})}

    return {"mode": plan.mode, "recipe": plan.recipe, "attention": plan.attention,
            "checkpointing": plan.checkpointing, "device": plan.device, "param_bytes": plan.param_bytes,
            "grad_bytes": plan.grad_bytes, "probes": [list(p) for p in plan.probes], "events": plan.events,
            "seconds": round(plan.seconds, 2), "notes": list(plan.notes),
            **({"host_bytes": plan.host_bytes} if plan.host_bytes else {}),
            "regions": [region(r) for r in plan.regions]}


def from_json(d: dict) -> DerivedPlan:
    zero = (0,) * len(solve.MONOMIALS)

    def live(x: dict) -> dict[str, tuple[int, ...]]:
        return {k: tuple(int(c) for c in x.get(k, zero)) for k in M.KINDS}

    regions = tuple(Region(r["b_lo"], r["b_hi"], r["s_lo"],
                           tuple(M.Moment(ph, ev, op, live(lv)) for ph, ev, op, lv in r["moments"]),
                           live(r["end"]), r.get("s_hi"), r.get("replay")) for r in d["regions"])
    return DerivedPlan(d["mode"], d["recipe"], d["attention"], d["checkpointing"], d["device"], regions,
                       int(d["param_bytes"]), int(d["grad_bytes"]), tuple(tuple(p) for p in d["probes"]),
                       int(d["events"]), float(d.get("seconds", 0.0)), tuple(d.get("notes", ())),
                       int(d.get("host_bytes", 0)))
