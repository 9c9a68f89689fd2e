"""What a causal LM's KV cache holds for one sequence, read from the transformers cache its own code fills.

The request is the one `measure` runs and the derived plans trace (workload/steps.py: generate()'s prefill into a
DynamicCache, then one-token decode steps), at batch 1 under FakeTensorMode, for a few context lengths c (a prompt
of c − 1 tokens and one decode step). After it, every cache layer is read: the storages of its keys and values
(what the cache really holds, `steps.cache_bytes`), their heads (dim 1), widths (dim 3) and element bytes. A layer
holds c tokens, or at most its window (a `DynamicSlidingWindowLayer`: Mistral, the local layers of Gemma 2/3,
Llama 4's chunked layers): that rule is checked at every probe, below, at and above each window, and a layer that
breaks it stops the serving plan with one line. So the layout needs no family knowledge:

    GQA (Llama, Qwen3)     K and V of kv_heads heads of head_dim per layer
    multi-query (BigCode)  one head, whatever the config says about kv heads
    MLA (DeepSeek-V2/V3)   the compressed latent: "keys" one head of kv_lora_rank, "values" one of qk_rope_head_dim
    sliding layers         at most their window, the rest every token

The layout (one row per cache layer) is what serving.py needs: its bytes per token per GPU under a KV dtype and a
tensor-parallel degree (components/kv.py) and the tokens each layer holds at a context.
"""
from __future__ import annotations

import sys
from typing import Any

from . import source as src

FIRST = 2  # a prompt of at least one token and one decode step
SMALL = 9  # the first context: below any window, it tells the layers and their windows


class _LastCache:
    """A workload.steps.Phases that keeps the cache of the request (steps._run_infer reports it after each phase)."""

    cache: Any = None

    def phase(self, name: str, step: int):
        import contextlib

        return contextlib.nullcontext()

    def step_done(self) -> None:
        pass

    def saw_cache(self, cache) -> None:
        self.cache = cache


def _read_layers(cache) -> list[dict[str, Any]]:
    """Per cache layer: window (None: every token), and per K / V: heads, width, element bytes, storage bytes."""
    rows = []
    for i, layer in enumerate(cache.layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None and values is None:  # a layer that shares another's cache, or keeps none
            continue
        window = getattr(layer, "sliding_window", None) if getattr(layer, "is_sliding", False) else None
        row: dict[str, Any] = {"layer": i, "window": int(window) if window else None}
        for name, t in (("k", keys), ("v", values)):
            if t is None or t.dim() != 4:
                raise src.DerivationError(f"cache layer {i} ({type(layer).__name__}) holds no 4-D {name} tensor "
                                          "(batch, heads, tokens, width): not a KV cache the serving plan models")
            row[name] = (int(t.shape[1]), int(t.shape[3]), int(t.element_size()), int(t.untyped_storage().nbytes()))
        rows.append(row)
    return rows


def _held(c: int, window: int | None) -> int:
    return c if window is None else min(c, window)


def _say(progress: bool, text: str) -> None:
    """One progress line on stderr, rewritten in place; "" clears it."""
    if progress:
        line = f"nnmem-sweep: {text}" if text else ""
        print(f"\r{line:<100}\r" if not text else f"\r{line}" + " " * 8, end="", file=sys.stderr, flush=True)


class _Requests:
    """One causal LM built once (fake, the recipe's dtype); `__call__(c)` runs a request of context c and reads its
    cache: (rows of _read_layers, steps.cache_bytes)."""

    def __init__(self, source: src.ModelSource, recipe: str, what: str, progress: bool):
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.fake = FakeTensorMode()
        self.case = src.case(source, "infer", recipe, "eager", "none", "cuda")  # every model has eager attention
        with src.quiet(), self.fake:
            self.model, self.cfg = src.build(source, self.case)
        self.recipe, self.what, self.progress = recipe, what, progress

    def __call__(self, c: int) -> tuple[list[dict[str, Any]], int]:
        from ..workload.build import default_dtype, make_workload, model_dtype, run_contexts
        from ..workload.steps import cache_bytes, run_steps

        _say(self.progress, f"reading the KV cache of one sequence of {c:,} tokens")
        probe = dict(self.case, batch=1, seq_len=c - 1, decode_tokens=1)
        rec = _LastCache()
        with src.quiet(), self.fake:
            with default_dtype(model_dtype(self.recipe)):
                w = make_workload(probe, self.cfg, self.model, None)
            if w.kind != "causal_lm":
                raise src.DerivationError(f"{self.what} is not a causal LM (its requests fill no KV cache a server "
                                          "pages)")
            with run_contexts(probe, fake=True):
                run_steps(w, rec)
        if rec.cache is None:
            raise src.DerivationError(f"{self.what}: the request filled no KV cache")
        return _read_layers(rec.cache), cache_bytes(rec.cache)


def _check_rule(what: str, c: int, rows: list[dict[str, Any]]) -> None:
    """Every layer holds c tokens, or min(c, window), of its K and V heads: else one line, and no plan."""
    for r in rows:
        for name in ("k", "v"):
            heads, width, elem, held_bytes = r[name]
            want = heads * width * elem * _held(c, r["window"])
            if held_bytes != want:
                rule = "every token" if r["window"] is None else f"at most {r['window']:,} tokens"
                raise src.DerivationError(
                    f"{what}: cache layer {r['layer']} holds {held_bytes:,} B of {name} at context {c:,}, not "
                    f"{want:,} B ({heads} heads of {width}, {elem} B each, {rule})")


def measure(source: src.ModelSource, recipe: str, progress: bool = False) -> dict[str, Any]:
    """The KV layout of a causal LM's cache (the module docstring), as a JSON document:
    {"layers": [[window | null, k_heads, k_width, k_bytes, v_heads, v_width, v_bytes], ...],
     "probes": [[c, cache bytes], ...]}."""
    what = str((source.spec.get("architectures") or ["the model"])[0])
    request = _Requests(source, recipe, what, progress)
    first, first_total = request(SMALL)
    if not first:
        raise src.DerivationError(f"{what}: its cache has no layer with keys and values")
    windows = sorted({r["window"] for r in first if r["window"]})
    limit = _max_position(source)
    contexts = {SMALL, 2 * max(windows, default=2 * SMALL) + 7}  # the last well above every window
    for w in windows:  # the rule is checked on both sides of each window
        contexts |= {w - 1, w, w + 1}
    layout = [_shape(r) for r in first]
    probes = []
    for c in sorted(c for c in contexts if c >= FIRST and (not limit or c <= limit)):
        rows, total = request(c) if c != SMALL else (first, first_total)
        if [_shape(r) for r in rows] != layout:
            raise src.DerivationError(f"{what}: the cache's layers differ between contexts {SMALL} and {c}")
        _check_rule(what, c, rows)
        probes.append([c, int(total)])
    _say(progress, "")
    return {"layers": [list(x) for x in layout], "probes": probes}


def _shape(r: dict[str, Any]) -> tuple:
    return (r["window"], *r["k"][:3], *r["v"][:3])


def _max_position(source: src.ModelSource) -> int:
    spec = source.spec
    for d in (spec.get("text_config") or {}, spec):
        for k in ("max_position_embeddings", "n_positions"):
            v = d.get(k) if isinstance(d, dict) else None
            if isinstance(v, int) and not isinstance(v, bool):
                return v
    return 0
