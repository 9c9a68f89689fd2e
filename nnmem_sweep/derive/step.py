"""Trace one training step (forward + backward) or one inference request of a model at one shape.

The workload is `measure`'s own (measure/build.py make_workload, measure/tracker.py run_steps): the same model,
inputs, loss and generate() loop, recorded by a trace.Recorder instead of MemTracker. Differences, both stated in
the report: the optimizer is not run (its state and step temporaries come from the optimizer catalog,
components/optimizer.py, as for hand-modelled families; the traced step starts with the gradients set to None, as
zero_grad(set_to_none=True) leaves them, or with a case's zero_grad "zeros" with every trainable parameter's
gradient allocated and zeroed, as zero_grad(set_to_none=False) leaves them), and a request runs three decode steps (every step after the first is the second at a
longer cache).

CUDA's kernels where the CPU's differ (MEASURING.md): dropout keeps a 1-byte mask (F.dropout routed to
native_dropout); fused attention applies its dropout inside the kernel and saves no mask, so under attention=flash
SDPA runs with dropout_p = 0 (the CPU then takes the same flash-style kernel, saving the output and an fp32
log-sum-exp). device="cpu" traces the CPU program as it is (for comparing with CPU measurements).
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .kinds import ACT, BUFFER, GRAD, INPUT, KV, PARAM, TEMP  # noqa: F401  (what a storage is, decided after a step)
from .trace import Recorder, Trace
DECODE_STEPS = 3  # the first, a later one, and one to check the later one by


@dataclass
class StepTrace:
    trace: Trace
    alloc_kind: list[str]  # per allocation event (in order): PARAM ... KV


@contextlib.contextmanager
def fused_attention_dropout():
    """SDPA as CUDA's fused kernels run it memory-wise: their dropout saves no mask (the Philox seed regenerates
    it in backward), which the CPU's flash-style kernel matches only at dropout_p = 0."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    def sdpa(*args, **kwargs):
        if "dropout_p" in kwargs:
            kwargs["dropout_p"] = 0.0
        elif len(args) > 4:
            args = (*args[:4], 0.0, *args[5:])
        return original(*args, **kwargs)

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


@contextlib.contextmanager
def collector_paused():
    """No automatic cyclic garbage collection while recording: tensors held in reference cycles are then freed at
    the phase marks (Recorder collects the youngest generation there), the same place at every probe, not
    wherever the collector happens to run."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def classify(tr: Trace, grads: set[int], cache: set[int]) -> list[str]:
    """The kind of every allocation event: external storages as registered, gradients and KV-cache storages by
    identity, the rest ACT if made in forward and alive when backward starts (saved for backward, or the loss),
    else TEMP."""
    ev = tr.events
    start_bwd = tr.marks.get("backward", len(ev))
    alive_at_bwd: set[int] = set()
    live: set[int] = set()
    freed: set[int] = set()
    for i, (sid, n) in enumerate(ev.tolist()):
        if i == start_bwd:
            alive_at_bwd = set(live)
        if n > 0:
            live.add(sid)
        else:
            live.discard(sid)
            freed.add(sid)
    kinds = []
    for i, (sid, n) in enumerate(ev.tolist()):
        if n <= 0:
            continue
        ext = tr.external.get(sid)
        if ext == PARAM and sid in freed:
            # a parameter storage the step frees and may make again (FSDP1's unsharded flat parameter of a frozen
            # unit, left gathered by the fake warm-up: resharded after its forward, gathered again in backward,
            # freed by the catch-all reshard):
            # weights whose bytes change within the step, counted per moment (BUFFER's live bytes, the weights
            # column), not in the constant W'; its first registration and every re-allocation alike
            kinds.append(BUFFER)
        elif ext is not None:
            kinds.append(ext)
        elif sid in grads:
            kinds.append(GRAD)
        elif sid in cache:
            kinds.append(KV)
        elif i < start_bwd and sid in alive_at_bwd:
            kinds.append(ACT)
        else:
            kinds.append(TEMP)
    return kinds


def run(model: torch.nn.Module, case: dict[str, Any], cfg: dict[str, Any], device: str) -> StepTrace:
    """Trace `case` (a measure case at the probe's batch and sequence) on `model` (built for it, inside the
    FakeTensorMode it was built in, which the caller has entered)."""
    from ..workload import fsdp, qlora
    from ..workload.build import default_dtype, make_workload, model_dtype, run_contexts
    from ..workload.steps import run_steps

    train = case["mode"] == "train"
    unsynced = train and case.get("zero_grad") == "nosync"
    if unsynced and not case.get("fsdp"):
        raise ValueError("zero_grad 'nosync' traces a sharded step (FSDP's no_sync)")
    if unsynced:  # the workload itself sets its gradients to None
        case = {k: v for k, v in case.items() if k != "zero_grad"}
    if case.get("fsdp") and not getattr(model, "_nnmem_warm", False):
        _warm_up(model, case, cfg)
    with default_dtype(model_dtype(case["precision"])):  # inputs in the model's dtype, as measure makes them
        w = make_workload(case, cfg, model, None)
    w.steps = 1
    if not train:
        w.decode_tokens = DECODE_STEPS
    model.zero_grad(set_to_none=True)
    kept = []
    if train and case.get("zero_grad") == "zeros":  # kept from the step before: zeroed, allocated before it starts
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                kept.append(p.grad)
    if unsynced:
        kept = _unsynced_gradients(model, w, case)
    rec = Recorder()
    offloaded = fsdp.offloaded(case.get("fsdp"))
    if offloaded:
        _host_side(rec, model, case["fsdp"])
    rec.external(model.parameters(), PARAM)  # a sharded step's: the rank's local shards (trace._local)
    # FSDP1: the local shards of units the warm-up left unsharded, beside the unsharded flat parameters (_warm_up)
    rec.external(getattr(model, "_nnmem_shards", ()), PARAM)
    rec.external(qlora.quant_state_tensors(model), PARAM)  # QLoRA's 4-bit quant states: weights too
    if w.reference is not None:  # preference tuning's frozen reference model: weights the step holds
        rec.external(w.reference.parameters(), PARAM)
        rec.external(w.reference.buffers(), BUFFER)  # its rotary tables too (MemTracker counts them)
    rec.external(kept, GRAD)
    # no reference of ours beyond this point: FSDP alone holds a 'nosync' step's unsharded gradients, which the
    # traced micro-batch reduce-scatters and frees
    del kept
    rec.external(model.buffers(), BUFFER)
    rec.external([v for v in w.inputs.values() if isinstance(v, torch.Tensor)], INPUT)
    attention = contextlib.nullcontext()
    if device == "cuda" and case.get("attention", "flash") == "flash":
        attention = fused_attention_dropout()
    with run_contexts(case, fake=True), attention, collector_paused(), rec:
        run_steps(w, rec)
        _catch_all_reshard(model, rec)
        rec.mark("end")
    grads = {sid for p in model.parameters() if p.grad is not None
             for sid in [rec.storage_id(p.grad)] if sid is not None}
    if offloaded and fsdp.version(case["fsdp"]) == 2:  # FSDP2 copies each reduce-scatter output to the host's grads
        rec.born_freed([p.grad for p in model.parameters() if p.grad is not None])
        grads = set()
    tr = rec.trace()
    model.zero_grad(set_to_none=True)
    return StepTrace(tr, classify(tr, grads, rec.cache_ids))


def _host_side(rec: Recorder, model: torch.nn.Module, spec: dict[str, Any]) -> None:
    """An offloaded step's host tensors (Recorder.host): FSDP1's flat-parameter shards and their pinned CPU
    gradients, one the size of every shard, frozen ones too (_flat_param.py); FSDP2's sharded parameters, and at
    its step the CPU gradients of the trainable ones (FSDPParam, foreach_reduce)."""
    from ..workload import fsdp
    from ..workload.steps import storage_bytes

    world = fsdp.check(spec)[0]
    if fsdp.version(spec) == 1:
        shards = model._nnmem_shards
        rec.host([*shards, *model._nnmem_host_grads], world, 2 * storage_bytes(shards), 1)
        return
    shards = [fsdp.local(p) for p in model.parameters()]
    trainable = [fsdp.local(p) for p in model.parameters() if p.requires_grad]
    rec.host(shards, world, storage_bytes(shards) + storage_bytes(trainable), 2)


def _catch_all_reshard(model: torch.nn.Module, rec: Recorder) -> None:
    """FSDP1's catch-all reshard at the end of the backward (torch/distributed/fsdp/_runtime_utils.py
    _post_backward_final_callback, _catch_all_reshard), as a GPU runs it and fake tensors skip it: a frozen unit's
    flat parameter (a base under adapters: no post-backward hook of its own) left unsharded, the root's and the
    first block's, whose inputs need no gradient, is resharded there, unless its data pointer is its local shard's;
    every fake tensor's data pointer is 0, so the fake run keeps them gathered into the next step
    (tests/data/truth/FINDINGS.md). Recorded as freed here (the storages left as they are for the next probe),
    which run() traces from the warm-up's state, where they are gathered: registered, then freed at this moment."""
    shards = getattr(model, "_nnmem_shards", None)
    if not shards:
        return
    for p, shard in zip(model.parameters(), shards):
        if not p.requires_grad and p.untyped_storage() is not shard.untyped_storage():
            rec.release(p)


class _NotRecorded:
    """What run_steps reports to, for a step nobody records."""

    @contextlib.contextmanager
    def phase(self, name: str, step: int):  # noqa: ARG002
        yield

    def step_done(self) -> None:
        pass

    def saw_cache(self, cache) -> None:  # noqa: ANN001, ARG002
        pass


def _unsynced_gradients(model: torch.nn.Module, w, case: dict[str, Any]) -> list[torch.Tensor]:  # noqa: ANN001
    """One micro-batch of workload `w` with FSDP2's gradient sync off (set_requires_gradient_sync(False), accelerate's
    no_sync; FSDP1: FullyShardedDataParallel.no_sync()), not recorded: every trainable parameter's whole unsharded
    gradient is then kept for the next micro-batch. Returns them (FSDP2: read from the unsharded parameters,
    FSDPModule.unshard, then reshard) with the sync back on, so that the traced micro-batch is the last one, which
    accumulates into them and reduce-scatters them."""
    from dataclasses import replace

    from torch.distributed.fsdp import FSDPModule

    from ..workload.build import run_contexts
    from ..workload.fsdp import gradient_sync_off, is_sharded
    from ..workload.steps import run_steps

    with gradient_sync_off(model), run_contexts(case, fake=True):
        run_steps(replace(w, accum=1), _NotRecorded())
    if not is_sharded(model):  # FSDP1: its flat parameters hold their whole gradients themselves
        return [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in units:
        m.unshard()
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    for m in units:
        m.reshard()
    return grads


def _warm_up(model: torch.nn.Module, case: dict[str, Any], cfg: dict[str, Any]) -> None:
    """A sharded step's first run in a process does FSDP2's lazy initialisation (the unsharded parameters' storages
    made, then freed and made again by resizing in every later step): one small untraced step first, so that every
    probe traces the steady step, whichever process traces it (the measured truth is the second step too)."""
    from ..workload import fsdp
    from ..workload.build import default_dtype, make_workload, model_dtype, run_contexts
    from ..workload.steps import run_steps

    small = dict(case, batch=1, seq_len=min(int(case.get("seq_len") or 8), 8))
    if fsdp.version(case["fsdp"]) == 1:
        # on fake tensors FSDP1 leaves a frozen unit unsharded after its backward (a base under adapters: no
        # post-backward hook of its own, and the catch-all reshard skipped: _catch_all_reshard), its parameter then
        # a view of the unsharded storage, while the rank's local shard stays allocated: the shards as they are
        # before the first step, so that run() registers them too (the same storages wherever a unit is resharded)
        model._nnmem_shards = [p.detach() for p in model.parameters()]
    with default_dtype(model_dtype(case["precision"])):
        w = make_workload(small, cfg, model, None)
    w.steps = 1
    with run_contexts(small, fake=True):
        run_steps(w, _NotRecorded())
    if fsdp.offloaded(case["fsdp"]) and fsdp.version(case["fsdp"]) == 1:  # each trainable flat parameter's
        # gradient is now its pinned CPU gradient (_host_side registers them as the host's)
        model._nnmem_host_grads = [p.grad for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    model._nnmem_warm = True


def alloc_sizes(st: StepTrace) -> np.ndarray:
    ev = st.trace.events
    return ev[ev[:, 1] > 0, 1]
