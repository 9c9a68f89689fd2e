"""The workload `measure` records and the derive package traces: one training step after another, or one request
as generate() runs it, reporting each phase to whoever records it (measure/tracker.PhaseTracker, MemTracker's
categories; derive/trace.Recorder, every allocation and free in order).

    Workload     what to run: the model, its inputs, mode, optimizer, autocast dtype, steps, decode steps, kind
    run_steps    run it, phase by phase, reporting to a `Phases`
    unpacked_sequences, storage_bytes, optimizer_state_bytes, cache_bytes   what both need around it
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from .fsdp import gradient_sync_off


@contextlib.contextmanager
def unpacked_sequences():
    """transformers' packed-sequence check reads tensor data; under fake tensors it guesses "packed" and builds
    a 4-D mask a real run never allocates (MEASURING.md pitfall 1). Our inputs are never packed: answer None,
    exactly what the real check returns for them, in fake and real runs alike."""
    try:
        import transformers.masking_utils as mu
    except ImportError:  # pragma: no cover
        yield
        return
    original = mu.find_packed_sequence_indices
    mu.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        mu.find_packed_sequence_indices = original


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (tied weights counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        seen[id(st)] = int(st.nbytes())
    return sum(seen.values())


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    return storage_bytes(v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))


@dataclass
class Workload:
    """What to run: built by the caller (inside the fake mode when fake)."""

    model: torch.nn.Module
    inputs: dict[str, Any]
    mode: str  # train | infer
    optimizer: torch.optim.Optimizer | None = None
    autocast_dtype: torch.dtype | None = None
    steps: int = 2
    decode_tokens: int = 0
    logits_to_keep: int = 1  # infer prefill: 1 as generate() passes; 0 keeps every position's logits
    loss_fn: Callable[[Any, dict[str, Any]], torch.Tensor] | None = None  # for plain nn.Modules (CNN)
    kind: str = "causal_lm"  # inputs.KINDS: how inference runs (generate() for causal_lm / seq2seq)
    zero_grad: str = "set_to_none"  # ZERO_GRADS: set_to_none frees the grads after step(); zeros keeps them, zeroed
    accum: int = 1  # gradient accumulation: micro-batches (forward and backward) per optimizer step
    # an FSDP2 model's gradient sync over the micro-batches (GRAD_SYNCS): "each" reduce-scatters every micro-batch's
    # gradients into the kept shards (FSDP2's default, accelerate's sync_each_batch), "last" only the last one's
    # (set_requires_gradient_sync(False) before: accelerate's no_sync, its default), the whole unsharded gradients
    # accumulating until then
    grad_sync: str = "each"
    reference: torch.nn.Module | None = None  # preference tuning's frozen reference model (workload/preference.py)
    backward: Callable[[torch.Tensor], None] | None = None  # DeepSpeed's engine.backward (zero_engine.py)


# Non-empty once this process ran a backward pass (a trace or a measurement): autograd's engine then refuses to run in
# a forked child, so the derive package derives in this process instead of forking (derive.prefetch).
BACKWARD_RAN: list[bool] = []

# optimizer.zero_grad(set_to_none=True) (torch >= 2.0's default) or zero_grad(set_to_none=False) (torch < 2.0's
# default; DDP's gradient_as_bucket_view buckets stay allocated the same way): the gradients then live through the
# next forward and backward accumulates into them in place.
ZERO_GRADS = ("set_to_none", "zeros")
GRAD_SYNCS = ("each", "last")


class Phases(Protocol):
    """What `run_steps` reports to: a context manager around each phase, and a call after each step or request
    part (MemTracker resets its per-module records there). PhaseTracker is one; the derive package's event recorder
    is another."""

    def phase(self, name: str, step: int) -> contextlib.AbstractContextManager: ...

    def step_done(self) -> None: ...

    # optional: `saw_cache(cache)` is called after each phase of a generative request with its KV cache (the derive
    # package tells cache storages from the rest with it); `second_call()` before a module is called a second time in
    # one step (preference tuning's reference with the adapters disabled: MemTracker needs to know)


def device_type(model: torch.nn.Module) -> str:
    """The device type the model's parameters live on ("cpu" under FakeTensorMode, "cuda" on a GPU)."""
    p = next(model.parameters(), None)
    return "cpu" if p is None else p.device.type


def _autocast(dtype: torch.dtype | None, device: str):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device, dtype=dtype)


def _micro_batch(w: Workload, rec: Phases, step: int) -> None:
    """One forward (only the loss kept) and backward of a training step, each a phase of `rec`."""
    with rec.phase("forward", step):
        with _autocast(w.autocast_dtype, device_type(w.model)):
            if w.kind == "preference":  # the policy may run twice (its reference: adapters off)
                loss = w.loss_fn(w.model, w.inputs, getattr(rec, "second_call", lambda: None))
            elif w.loss_fn is not None:
                loss = w.loss_fn(w.model, w.inputs)
            else:
                out = w.model(**w.inputs)
                loss = out.loss
                del out  # HF Trainer keeps only the loss into backward (MEASURING.md pitfall 5)
    with rec.phase("backward", step):
        if not BACKWARD_RAN:
            BACKWARD_RAN.append(True)
        if w.backward is not None:
            w.backward(loss)
        else:
            loss.backward()
        del loss


def run_steps(w: Workload, rec: Phases) -> dict[str, int]:
    """Run the workload itself, phase by phase: `w.steps` training steps (`w.accum` forward and backward passes each,
    the gradients accumulating; forward keeping only the loss, backward,
    optimizer step, zero_grad(set_to_none=True), or zero_grad(set_to_none=False) when w.zero_grad is "zeros"; without an optimizer, forward and backward only, the gradients
    left in place), or one inference request (see `_run_infer`). Returns the totals it can read afterwards
    (gradients, optimizer state, KV cache bytes)."""
    totals: dict[str, int] = {}
    if w.zero_grad not in ZERO_GRADS:
        raise ValueError(f"zero_grad {w.zero_grad!r} not in {ZERO_GRADS}")
    if w.grad_sync not in GRAD_SYNCS:
        raise ValueError(f"grad_sync {w.grad_sync!r} not in {GRAD_SYNCS}")
    if w.mode == "train":
        w.model.train()
        for step in range(1, w.steps + 1):
            for micro in range(w.accum):  # the gradients of a micro-batch stay for the next to accumulate into
                if micro:
                    rec.step_done()  # MemTracker's module records are per forward call
                # accelerate's no_sync before the last micro-batch: FSDP's unsharded gradients kept until it syncs
                held = w.grad_sync == "last" and micro < w.accum - 1
                with gradient_sync_off(w.model) if held else contextlib.nullcontext():
                    _micro_batch(w, rec, step)
            totals["grad_bytes"] = storage_bytes(p.grad for p in w.model.parameters())
            if w.optimizer is None:  # the derive package's probe: forward and backward of one step, grads kept
                rec.step_done()
                continue
            with rec.phase("optimizer", step):
                w.optimizer.step()
                w.optimizer.zero_grad(set_to_none=w.zero_grad != "zeros")
            rec.step_done()  # module stats are per step; the module hooks need them within one
        if w.optimizer is not None:
            totals["optimizer_state_bytes"] = optimizer_state_bytes(w.optimizer)
        return totals
    return _run_infer(w, rec)


def _generate_step(forward: Callable[[], Any]) -> torch.Tensor:
    """One generate() step: the forward, the last position's logits upcast to fp32 (as generate() does before
    choosing a token), the outputs dropped, the next token chosen."""
    out = forward()
    logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
    del out
    token = logits.argmax(dim=-1, keepdim=True)
    del logits
    return token


def cache_bytes(cache: Any) -> int:
    """Bytes of the keys and values a transformers cache holds (every layer, sliding-window layers included)."""
    return storage_bytes(t for layer in cache.layers
                         for t in (getattr(layer, "keys", None), getattr(layer, "values", None)))


def _run_infer(w: Workload, rec: Phases) -> dict[str, int]:
    """One request. Generative models as generate() runs them without the sampling loop:
      - causal LM: prefill with logits_to_keep=1 (w.logits_to_keep; 0 computes the logits of every prompt position)
        into a DynamicCache, then one-token decode steps;
      - encoder-decoder: the encoder once (its output is kept for every step, as generate() keeps
        `encoder_outputs`), then the decoder "prefill" of the start token, which fills an EncoderDecoderCache
        (self-attention and cross-attention K/V), then one-token decode steps; the prefill phase spans both;
    logits of the last position upcast to fp32 before choosing a token. Other models (classifiers, masked LMs,
    `module:` nets): one no_grad forward, phase "forward"."""
    from transformers import DynamicCache

    w.model.eval()
    out_totals: dict[str, int] = {}
    with torch.no_grad():
        if w.kind not in ("causal_lm", "seq2seq"):
            with rec.phase("forward", 1):
                out = w.model(w.inputs["x"]) if w.kind == "module" else w.model(**w.inputs)
                del out
            rec.step_done()
            return out_totals
        text = w.model.config.get_text_config(decoder=True)
        if w.kind == "seq2seq":
            from transformers import EncoderDecoderCache

            cache = EncoderDecoderCache(DynamicCache(config=text), DynamicCache(config=text))
            saw = getattr(rec, "saw_cache", lambda cache: None)
            with rec.phase("prefill", 1):
                encoded = w.model.get_encoder()(**w.inputs)
                ids = w.inputs["input_ids"]
                start = torch.full((ids.shape[0], 1), int(w.model.config.decoder_start_token_id), dtype=torch.long,
                                   device=ids.device)
                token = _generate_step(lambda: w.model(encoder_outputs=encoded, decoder_input_ids=start,
                                                       past_key_values=cache, use_cache=True))
                saw(cache)
            rec.step_done()
            for i in range(w.decode_tokens):
                with rec.phase("decode", i + 1):
                    token = _generate_step(lambda: w.model(encoder_outputs=encoded, decoder_input_ids=token,
                                                           past_key_values=cache, use_cache=True))
                    saw(cache)
                rec.step_done()
            out_totals["self_attention_cache_bytes"] = cache_bytes(cache.self_attention_cache)
            out_totals["cross_attention_cache_bytes"] = cache_bytes(cache.cross_attention_cache)
            out_totals["kv_cache_bytes"] = sum(out_totals.values())
            return out_totals
        cache = DynamicCache(config=text)
        saw = getattr(rec, "saw_cache", lambda cache: None)
        with rec.phase("prefill", 1):
            token = _generate_step(lambda: w.model(**w.inputs, past_key_values=cache, use_cache=True,
                                                   logits_to_keep=w.logits_to_keep))
            saw(cache)
        rec.step_done()
        for i in range(w.decode_tokens):
            with rec.phase("decode", i + 1):
                token = _generate_step(lambda: w.model(input_ids=token, past_key_values=cache, use_cache=True))
                saw(cache)
            rec.step_done()  # one module record per forward call
        out_totals["kv_cache_bytes"] = cache_bytes(cache)
    return out_totals
