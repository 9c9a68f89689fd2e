"""Trace one training step (forward + backward) or one inference request of a model at one shape.

The model is built once per recipe (its parameters are the same at every shape); each probe makes new inputs and
records forward and backward with a Recorder. The optimizer is not run: its state and step temporaries come from
the optimizer catalog (components/optimizer.py), as for hand-modelled families, and the step before the traced
one left the gradients set to None (zero_grad(set_to_none=True), torch >= 2.0's default), as `measure` runs it.

CUDA's kernels where the CPU's differ (MEASURING.md): dropout keeps a 1-byte mask (F.dropout routed to
native_dropout); fused attention applies its dropout inside the kernel and saves no mask, so under attention=flash
SDPA runs with dropout_p = 0 (the CPU then takes the same flash-style kernel, saving the output and an fp32
log-sum-exp). device="cpu" traces the CPU program as it is (for comparing with CPU measurements).
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass

import numpy as np
import torch

from .trace import Recorder, Trace

# what a storage is, decided after the step
PARAM, BUFFER, INPUT, GRAD, ACT, TEMP, KV = "param", "buffer", "input", "grad", "act", "temp", "kv"


@dataclass
class StepTrace:
    trace: Trace
    alloc_kind: list[str]  # per allocation event (in order): PARAM ... TEMP


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


def kernels(device: str, attention: str):
    """The context that makes a CPU trace run CUDA's kernels memory-wise (see the module docstring)."""
    from ..measure.build import native_dropout

    stack = contextlib.ExitStack()
    if device == "cuda":
        stack.enter_context(native_dropout())
        if attention == "flash":
            stack.enter_context(fused_attention_dropout())
    return stack


@contextlib.contextmanager
def collector_paused():
    """No automatic cyclic garbage collection while recording: tensors held in reference cycles are then freed at
    the marks (Recorder.mark collects), the same place at every probe, not wherever the collector happens to run."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _storage_ids(rec: Recorder, tensors) -> set[int]:
    out = set()
    for t in tensors:
        if t is not None:
            sid = rec.storage_id(t)
            if sid is not None:
                out.add(sid)
    return out


def classify(tr: Trace, grads: set[int], start_bwd: int | None = None) -> list[str]:
    """The kind of every allocation event: external storages by what they were registered as, gradients (or, for
    inference, the KV cache) by identity, the rest ACT if allocated in forward and alive when backward starts
    (saved for backward, or the loss), else TEMP."""
    ev = tr.events
    start_bwd = tr.marks["backward"] if start_bwd is None else start_bwd
    alive_at_bwd: set[int] = set()
    live: set[int] = set()
    for i, (sid, n) in enumerate(ev.tolist()):
        if i == start_bwd:
            alive_at_bwd = set(live)
        if n > 0:
            live.add(sid)
        else:
            live.discard(sid)
    if start_bwd >= len(ev):
        alive_at_bwd = set(live)
    kinds = []
    for i, (sid, n) in enumerate(ev.tolist()):
        if n <= 0:
            continue
        ext = tr.external.get(sid)
        if ext is not None:
            kinds.append(ext)
        elif sid in grads:
            kinds.append(GRAD if start_bwd < len(ev) else KV)
        elif i < start_bwd and sid in alive_at_bwd:
            kinds.append(ACT)
        else:
            kinds.append(TEMP)
    return kinds


def train_step(model: torch.nn.Module, inputs: dict, autocast_dtype, loss_fn=None) -> StepTrace:
    """Forward and backward of one training step, recorded. Call inside the FakeTensorMode the model was built in,
    with the kernels() context entered. Leaves the gradients set to None."""
    from ..measure.tracker import unpacked_sequences

    model.zero_grad(set_to_none=True)
    model.train()
    rec = Recorder()
    rec.external(model.parameters(), PARAM)
    rec.external(model.buffers(), BUFFER)
    rec.external([v for v in inputs.values() if isinstance(v, torch.Tensor)], INPUT)
    amp = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
    with rec, unpacked_sequences(), collector_paused():
        rec.mark("forward")
        with amp:
            if loss_fn is not None:
                loss = loss_fn(model, inputs)
            else:
                out = model(**inputs)
                loss = out.loss
                del out  # HF Trainer keeps only the loss into backward (MEASURING.md pitfall 5)
        rec.mark("backward")
        loss.backward()
        del loss
        rec.mark("end")
        grads = _storage_ids(rec, (p.grad for p in model.parameters()))
    tr = rec.trace()
    model.zero_grad(set_to_none=True)
    return StepTrace(tr, classify(tr, grads))


def alloc_sizes(st: StepTrace) -> np.ndarray:
    ev = st.trace.events
    return ev[ev[:, 1] > 0, 1]


def infer_step(model: torch.nn.Module, inputs: dict) -> StepTrace:
    """generate()'s first two forwards, recorded: the prefill of the prompt with logits_to_keep=1 and a
    DynamicCache, the last position's logits upcast to fp32 and the next token chosen, then one decode step the
    same way (what `measure` runs, measure/tracker.py). The decode step's bytes are those of any later step at
    that step's cache length. Call inside the FakeTensorMode the model was built in."""
    from transformers import DynamicCache

    from ..measure.tracker import unpacked_sequences

    model.eval()
    rec = Recorder()
    rec.external(model.parameters(), PARAM)
    rec.external(model.buffers(), BUFFER)
    rec.external([v for v in inputs.values() if isinstance(v, torch.Tensor)], INPUT)
    cache_ids: set[int] = set()
    with rec, unpacked_sequences(), collector_paused(), torch.no_grad():
        cache = DynamicCache(config=model.config)
        rec.mark("prefill")
        token = _next_token(model(**inputs, past_key_values=cache, use_cache=True, logits_to_keep=1))
        cache_ids |= _storage_ids(rec, _cache_tensors(cache))
        rec.mark("decode")
        token = _next_token(model(input_ids=token, past_key_values=cache, use_cache=True))
        cache_ids |= _storage_ids(rec, _cache_tensors(cache))
        rec.mark("end")
        del token, cache
    tr = rec.trace()
    return StepTrace(tr, classify(tr, cache_ids, start_bwd=len(tr.events)))


def _next_token(out) -> torch.Tensor:
    logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
    del out
    return logits.argmax(dim=-1, keepdim=True)


def _cache_tensors(cache) -> list[torch.Tensor]:
    return [t for layer in cache.layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
            if isinstance(t, torch.Tensor)]
