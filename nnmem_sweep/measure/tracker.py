"""Run a training step or an inference request under MemTracker and record peaks per phase.

torch's MemTracker (torch/distributed/_tools/mem_tracker.py) attributes every live storage to a category
(Parameter, Buffer, Gradient, Activation, Temp, Optstate, Other) and keeps one global peak. We need the peak of
each phase (forward / backward / optimizer, prefill / decode), the module and op at which it was reached, and the
attention kernels that really ran, so `PhaseTracker` extends it at its two extension points: the dispatch hook
(every aten op) and the peak update. The workload mirrors what the estimator models (see MEASURING.md):
two training steps, or generate()'s prefill with logits_to_keep=1 plus one-token decode steps.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker

from ..workload import fsdp, qlora
from ..workload.steps import Workload, run_steps, storage_bytes

# MemTracker's category names (_MemRefType values) -> our short names, in report order.
CATEGORY_NAMES = {
    "Parameter": "param",
    "Buffer": "buffer",
    "Gradient": "grad",
    "Activation": "act",
    "Temp": "temp",
    "Optstate": "opt",
    "Other": "other",
    # FSDPMemTracker's (a sharded step, workload/fsdp.py): shards and unsharded copies under the same names; the
    # collectives' buffers are temporaries
    "Sharded Param": "param",
    "Unsharded Param": "param",
    "Sharded Grad": "grad",
    "Unsharded Grad": "grad",
    "OptState": "opt",
    "All Gather": "temp",
    "Reduce Scatter": "temp",
    "Inputs": "other",
}
CATEGORIES = tuple(dict.fromkeys(CATEGORY_NAMES.values()))  # each once, in report order

# aten ops that tell which attention kernel ran on the CPU (MEASURING.md: the flash-style kernel refuses dropout > 0).
ATTENTION_OPS = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention",
)
MATH_PATH_OPS = ("_softmax", "bmm", "baddbmm")


@dataclass
class PhasePeak:
    phase: str
    step: int
    peak_bytes: int = 0
    categories: dict[str, int] = field(default_factory=dict)
    module: str = ""
    op: str = ""
    end_bytes: int = 0  # live at the end of the phase (after a forward: what is saved for backward + the loss)
    end_categories: dict[str, int] = field(default_factory=dict)


def _split(dev_snap: dict) -> dict[str, int]:
    out = dict.fromkeys(CATEGORIES, 0)
    for key, value in dev_snap.items():
        name = CATEGORY_NAMES.get(getattr(key, "value", key))
        if name is not None:
            out[name] += int(value)
    return out


def _innermost(parents) -> str:  # noqa: ANN001
    """The innermost active module. In backward, ModTracker can hold several same-depth modules whose post-backward
    hook has not fired (their inputs needed no gradient); their common dotted prefix is then what is known."""
    names = [p for p in parents if p != "Global"]
    if not names:
        return ""
    depth = max(n.count(".") for n in names)
    deepest = sorted(n for n in names if n.count(".") == depth)
    if len(deepest) == 1:
        return deepest[0]
    parts = [n.split(".") for n in deepest]
    common = []
    for level in zip(*parts):
        if len(set(level)) > 1:
            break
        common.append(level[0])
    return ".".join(common)


class _NoHandle:
    """Stands for the gradient hook a frozen parameter cannot have."""

    def remove(self) -> None:
        pass


_NO_HANDLE = _NoHandle()


class _Phases:
    """What PhaseTracker and FSDPPhaseTracker add to PyTorch's trackers: the peak of each phase, where it happened,
    and which aten ops ran."""

    def _init_phases(self) -> None:
        self.ops: Counter[str] = Counter()
        self.phases: list[PhasePeak] = []
        self._phase: PhasePeak | None = None
        self._last_op = ""

    @contextlib.contextmanager
    def phase(self, name: str, step: int):
        record = PhasePeak(name, step)
        record.peak_bytes = self._current_total()
        record.categories = self._current_split()
        self._phase = record
        try:
            yield record
        finally:
            self._phase = None
            record.end_bytes = self._current_total()
            record.end_categories = self._current_split()
            self.phases.append(record)

    def step_done(self) -> None:
        """Module records are per forward call / step (the module hooks need them within one)."""
        self.reset_mod_stats()
        self._repeat = False

    def second_call(self) -> None:
        """The next forward call repeats a module already called in this step (preference tuning's reference, the
        policy with its adapters disabled, under no_grad): MemTracker refuses a second call of a top-level module,
        and resetting its records would lose what the first call's backward needs. The second call is counted (every
        storage it allocates is tracked as always) without module records of its own."""
        self._repeat = True

    def _pre_fw_hook(self, module, inputs):  # noqa: ANN001, ANN202
        try:
            return super()._pre_fw_hook(module, inputs)
        except NotImplementedError:
            if not getattr(self, "_repeat", False):
                raise
            return None

    def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):  # noqa: ANN001, ANN201
        # MemTracker hooks every parameter's gradient, which raises on a frozen one (a LoRA base, MEASURING.md
        # pitfall 2) and on a view (FSDP1's original parameters under use_orig_params, views of the unsharded flat
        # parameter in the forward): mark them as hooked already, with handles that remove nothing. Every storage
        # is still counted; a view's gradient is its flat parameter's.
        if install_grad_hooks:
            for param in module.parameters():
                if (not param.requires_grad or not param.is_leaf) and \
                        self._param_to_grad_hook_handles.get(param, None) is None:
                    self._param_to_grad_hook_handles[param] = (_NO_HANDLE, _NO_HANDLE)
        return super()._track_module_params_and_buffers(module, install_grad_hooks)

    def _current_total(self) -> int:
        return sum(int(s["Total"]) for s in self._curr_mem_snap.values())

    def _current_split(self) -> dict[str, int]:
        out = dict.fromkeys(CATEGORIES, 0)
        for snap in self._curr_mem_snap.values():
            for k, v in _split(snap).items():
                out[k] += v
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        self._last_op = name
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _update_peak_stats(self, peak_state) -> None:  # noqa: ANN001
        # The base class also refreshes a per-module peak for every tracked module on every op (O(modules) per
        # op: 70 s for a 0.5B model). We keep only its global peak and our own per-phase peak, which names the
        # innermost active module instead.
        for dev, dev_snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap["Total"]:
                self._peak_mem[dev] = dev_snap["Total"]
                self._peak_mem_snap[dev] = dict(dev_snap)
        rec = self._phase
        if rec is None:
            return
        total = self._current_total()
        if total > rec.peak_bytes:
            rec.peak_bytes = total
            rec.categories = self._current_split()
            rec.module = _innermost(self._mod_tracker.parents)
            rec.op = self._last_op

    def attention_kernel(self) -> str:
        """'flash' when the CPU flash-style SDPA kernel ran, 'math' when attention materialised softmax scores."""
        if any(self.ops.get(op) for op in ATTENTION_OPS):
            return "flash"
        if any("softmax" in op and "log_softmax" not in op for op in self.ops):
            return "math"
        return "none"


class PhaseTracker(_Phases, MemTracker):
    """MemTracker that also keeps the peak of each phase, where it happened, and which aten ops ran."""

    def __init__(self) -> None:
        super().__init__()
        self._init_phases()


class FSDPPhaseTracker(_Phases, FSDPMemTracker):
    """FSDPMemTracker (a step sharded by FSDP2, workload/fsdp.py) with the same phase records, for one rank."""

    def __init__(self, model: torch.nn.Module, optimizer: Any) -> None:
        super().__init__(model, optimizer)
        self._init_phases()


def run_workload(w: Workload) -> dict[str, Any]:
    """Run the workload under a PhaseTracker (FSDPPhaseTracker for a sharded model); return peaks, splits and totals
    (plain ints and strings)."""
    inputs = [v for v in w.inputs.values() if isinstance(v, torch.Tensor)]
    quant = qlora.quant_state_tensors(w.model)  # QLoRA's 4-bit quant states: weights, not parameters or buffers
    if fsdp.is_sharded(w.model):  # one rank's shards; FSDPMemTracker finds the model's and optimizer's own
        tracker: Any = FSDPPhaseTracker(w.model, getattr(w.optimizer, "inner", w.optimizer))
        tracker.track_inputs(tuple(inputs))
        tracker.track_external(*quant)
    else:
        tracker = PhaseTracker()
        externals: list[Any] = [w.model, *inputs]
        if w.optimizer is not None:
            externals.append(w.optimizer)
        if w.reference is not None:
            externals.append(w.reference)
        tracker.track_external(*externals, *quant)
    totals: dict[str, int] = {"param_bytes": storage_bytes(fsdp.local(p) for p in w.model.parameters())
                              + storage_bytes(quant), "buffer_bytes": storage_bytes(w.model.buffers())}
    if w.reference is not None:  # preference tuning's frozen reference model
        totals["reference_bytes"] = storage_bytes(w.reference.parameters())
    if quant:  # QLoRA's quant states, counted in param_bytes: module state, which no FSDP offload moves to the host
        totals["quant_state_bytes"] = storage_bytes(quant)
    with tracker:  # call inside build.run_contexts(case, fake) (measure_case does)
        totals.update(run_steps(w, tracker))
    phases = tracker.phases
    top = max(phases, key=lambda p: p.peak_bytes)
    per_phase: dict[str, dict[str, Any]] = {}
    for p in phases:
        best = per_phase.get(p.phase)
        if best is None or p.peak_bytes > best["peak_bytes"]:
            per_phase[p.phase] = {"peak_bytes": p.peak_bytes, "step": p.step, "categories": dict(p.categories),
                                  "module": p.module, "op": p.op, "end_bytes": p.end_bytes,
                                  "end_categories": dict(p.end_categories)}
    return {
        "peak_bytes": top.peak_bytes,
        "peak_phase": top.phase,
        "peak_step": top.step,
        "peak_module": top.module,
        "peak_op": top.op,
        "categories_at_peak": dict(top.categories),
        "phases": per_phase,
        "totals": totals,
        "attention_kernel": tracker.attention_kernel(),
        "attention_ops": {k: v for k, v in sorted(tracker.ops.items())
                          if "attention" in k or "softmax" in k},
    }
