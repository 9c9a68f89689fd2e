"""Serving plans for infer scenarios: how many sequences of which context fit per GPU, vLLM style.

The engine may use `gpu_memory_utilization` of the GPU (vLLM semantics). From that it pays the weights (its
tensor-parallel shard), the activation peak of the profiling forward (one prefill of `max_num_batched_tokens`
tokens, from the inference estimator) and the runtime overheads outside PyTorch (CUDA context, cuBLAS workspace);
what remains is the KV budget:

    kv_budget  = ⌊u · M⌋ − W/t − A − context − workspace          (clipped at 0)
    per_seq(c) = blocks(min(c, window)) · kv_bytes_per_token_per_gpu
    max_concurrent_sequences(c) = ⌊kv_budget / per_seq(c)⌋
    max_context(n) = the longest c with n · per_seq(c) ≤ kv_budget    (capped at max_position)

Assumptions (stated in the report): the allocator reserve and the scenario's headroom are not applied, since u is
the margin; tensor parallelism (Megatron-style, as vLLM shards models) splits every weight matrix, the embeddings and
the LM head (vocab-parallel) by t, and replicates the norms, the MoE router and the row-parallel biases; the
activation peak is not divided by t (a conservative choice: the logits and the residual stream are not sharded
everywhere). One row per GPU, tensor-parallel degree, precision, KV dtype and context; a few dozen per-precision
scalars are computed once, the rest is numpy over the whole table.
"""
from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pandas as pd

from . import columns as C
from .catalog import names
from .catalog.precisions import get_precision
from .citations import formula
from .components.overhead import fixed_bytes, gpu_spec
from .components.kv import (KV_ELEMENT_BYTES, KV_SCALE_BYTES_PER_HEAD_TOKEN, VLLM_ENGINE_ARGS, cache_layers,
                            kv_bytes_per_sequence, kv_bytes_per_token_by_window)
from .components.weights import param_summary, weights_bytes
from .errors import UsageError
from .estimate import estimate_frame
from .grid import product_frame
from .models.arch import Architecture
from .scenario import DEFAULT_PREFILL_LOGITS, Scenario

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # tokens of the profiling prefill (vLLM serve's default chunk on datacenter GPUs)
DEFAULT_TENSOR_PARALLEL = (1,)
MAX_CONTEXT_CAP = 2**40  # tokens: the bound of max_context for a model without max_position (a model of fields)

# Tensors every tensor-parallel rank keeps whole (by name in components/weights.py's tensor table).
_ROW_PARALLEL = ("o_proj", "down_proj", "c_proj", "experts.down_proj")
# ... and by the last module name in a derived model's card (the module names of transformers' families): the output
# projections of attention and MLP (vLLM's RowParallelLinear keeps its bias whole on every rank)
_ROW_PARALLEL_MODULES = frozenset({"o_proj", "down_proj", "c_proj", "out_proj", "dense", "dense_4h_to_h", "fc2",
                                   "wo", "w2", "fc_out"})
_NORM = re.compile(r"norm|(^|\.)ln_", re.IGNORECASE)  # RMSNorm / LayerNorm, GPT-2-style ln_1, ln_f
_ROUTER = re.compile(r"(^|\.)(router|gate)\.")  # an MoE router (mlp.gate.weight), not gate_proj


def _replicated(name: str, ndim: int) -> bool:
    if "norm" in name.lower() or name.startswith("router"):
        return True
    return ndim == 1 and name.endswith(".bias") and name.rsplit(".", 1)[0] in _ROW_PARALLEL


def _replicated_derived(name: str, ndim: int) -> bool:
    """A derived model's tensor that tensor parallelism keeps whole: norms, MoE routers, row-parallel biases."""
    if _NORM.search(name) or _ROUTER.search(name):
        return True
    module = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
    return ndim == 1 and name.endswith(".bias") and module in _ROW_PARALLEL_MODULES


@formula("weights_per_gpu_bytes", "⌈(W − R) / t⌉ + R,  R = norms + router + row-parallel biases (16-bit)",
         VLLM_ENGINE_ARGS, where="tensor_parallel_size (Megatron-style column/row parallel linears, "
         "vocab-parallel embedding and LM head)",
         note="Derived models: R is found by name among the card's parameter tensors (norm, ln_, router, MoE gate, "
              "the biases of o_proj/down_proj/c_proj/out_proj/dense/fc2 ...); everything else is split by t.")
def weights_per_gpu_bytes(arch: Architecture, precision: str, t: np.ndarray) -> np.ndarray:
    prec = get_precision(precision)
    total = weights_bytes(arch, prec)
    rep = 0
    if arch.kind in ("transformer", "derived"):
        keep = _replicated if arch.kind == "transformer" else _replicated_derived
        # quantised recipes keep these small tensors in 16 bit, the same bytes as the rest of the unquantised part
        rep = sum(x.numel * x.count for x in param_summary(arch).tensors
                  if keep(x.name, len(x.shape))) * prec.weight_bytes
    t = np.asarray(t, dtype=np.int64)
    return -(-(total - rep) // t) + rep


def kv_element(kv_dtype: str, precision: str) -> tuple[int, int]:
    """(bytes per cached element, scale bytes per head and token) of a KV dtype; auto = the recipe's act dtype."""
    if kv_dtype == "auto":
        return get_precision(precision).act_bytes, 0
    if kv_dtype not in KV_ELEMENT_BYTES:
        raise UsageError(f"unknown kv_dtype {kv_dtype!r}; use {', '.join(names.KV_DTYPES)}")
    return KV_ELEMENT_BYTES[kv_dtype], KV_SCALE_BYTES_PER_HEAD_TOKEN[kv_dtype]


def options(sc: Scenario) -> dict:
    """The serving options with their defaults filled in."""
    given = getattr(sc, "serving", None) or {}
    return {
        "kv_dtype": tuple(given.get("kv_dtype") or ("auto",)),
        "kv_block_size": given.get("kv_block_size"),
        "gpu_memory_utilization": float(given.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION)),
        "tensor_parallel": tuple(given.get("tensor_parallel") or DEFAULT_TENSOR_PARALLEL),
        "max_num_batched_tokens": int(given.get("max_num_batched_tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS)),
        # the prefill of the sweep (results.csv): "last" as generate() (logits_to_keep=1), or "all" positions; the
        # plan's profiling prefill keeps "last" (vLLM computes logits only where it samples)
        "prefill_logits": str(given.get("prefill_logits", DEFAULT_PREFILL_LOGITS)),
    }


def activation_peak_bytes(sc: Scenario, precisions: tuple, tokens: int) -> np.ndarray:
    """Per precision: the temporaries of one prefill of `tokens` tokens (batch 1), from the inference estimator."""
    n = len(precisions)
    frame = pd.DataFrame({
        C.BATCH: np.ones(n, dtype=np.int64), C.SEQ_LEN: np.full(n, tokens, dtype=np.int64),
        C.PRECISION: list(precisions), C.OPTIMIZER: names.OPTIMIZER_NONE, C.OPTIMIZER_IMPL: names.OPTIMIZER_NONE,
        C.CHECKPOINTING: "none", C.ATTENTION: sc.grid[C.ATTENTION][0],
        C.CACHE_TOKENS: np.zeros(n, dtype=np.int64), C.DECODE_TOKENS: np.zeros(n, dtype=np.int64),
        C.GPU_MEMORY: np.zeros(n, dtype=np.int64),
    })
    est = estimate_frame(sc.model, "infer", frame, sc.overheads, 0.0)
    return est[C.TEMPORARY].to_numpy(dtype=np.int64)


def contexts(sc: Scenario) -> tuple[int, ...]:
    """Context lengths of the plan: every prompt length plus every number of generated tokens."""
    return tuple(sorted({int(s) + int(d) for s in sc.grid[C.SEQ_LEN] for d in sc.grid[C.DECODE_TOKENS]}))


def _budget_frame(sc: Scenario, axes_last: dict[str, tuple]) -> tuple[pd.DataFrame, dict]:
    """The product of GPU, tensor_parallel, precision, kv_dtype (+ `axes_last`) with the KV budget and the bytes
    per token per GPU of each window's layers, as numpy columns."""
    opt = options(sc)
    precisions = tuple(sc.grid[C.PRECISION])
    gpus = tuple(g.id for g in sc.gpus)
    axes = {C.GPU: gpus, C.TENSOR_PARALLEL: opt["tensor_parallel"], C.PRECISION: precisions,
            C.KV_DTYPE: opt["kv_dtype"], **axes_last}
    frame = product_frame(axes)
    g_code = frame[C.GPU].cat.codes.to_numpy()
    p_code = frame[C.PRECISION].cat.codes.to_numpy()
    k_code = frame[C.KV_DTYPE].cat.codes.to_numpy()
    t = frame[C.TENSOR_PARALLEL].to_numpy(dtype=np.int64)
    arch = sc.model

    u = Fraction(str(opt["gpu_memory_utilization"]))
    by_id = {g.id: g.memory_bytes for g in sc.gpus}
    engine = np.array([by_id[g] * u.numerator // u.denominator for g in gpus], dtype=np.int64)[g_code]
    weights = np.stack([weights_per_gpu_bytes(arch, p, t) for p in precisions])[p_code, np.arange(len(frame))]
    act = activation_peak_bytes(sc, precisions, opt["max_num_batched_tokens"])[p_code]
    tps = pd.Index([int(x) for x in opt["tensor_parallel"]])
    table = np.array([[engine_fixed_bytes(sc, g, tp) for tp in tps] for g in gpus], dtype=np.int64)
    fixed = table[g_code, tps.get_indexer(t)]
    budget = np.maximum(engine - weights - act - fixed, 0)
    return frame, {"budget": budget, "per_window": _per_window(arch, precisions, opt["kv_dtype"], p_code, k_code, t),
                   "block": opt["kv_block_size"]}


def engine_fixed_bytes(sc: Scenario, gpu_id: str, tensor_parallel: int) -> int:
    """What an engine's profile finds besides weights and activations on one GPU: memory outside the allocator
    (context, the tensor-parallel group's NCCL communicator) and the library workspaces inside it
    (components/overhead.py; the scenario's `overheads:` override them)."""
    outside, inside = fixed_bytes(sc.overheads, gpu_spec(sc.overheads, str(gpu_id)), "infer",
                                  {C.TENSOR_PARALLEL: int(tensor_parallel)})
    return outside + inside


def _per_window(arch: Architecture, precisions: tuple, kv_dtypes: tuple, p_code: np.ndarray, k_code: np.ndarray,
                t: np.ndarray) -> dict[int | None, np.ndarray]:
    """Per window (None: every token) and row: the bytes per token per GPU of its layers' cache."""
    out: dict[int | None, np.ndarray] = {}
    for p_i, p in enumerate(precisions):
        layers = cache_layers(arch, p)
        for k_i, k in enumerate(kv_dtypes):
            rows = (p_code == p_i) & (k_code == k_i)
            elem, scale = kv_element(k, p)
            by_window = kv_bytes_per_token_by_window(layers, None if k == "auto" else elem, t[rows], scale)
            for w, beta in by_window.items():
                out.setdefault(w, np.zeros(len(t), dtype=np.int64))[rows] = beta
    return out


def _per_token(per_window: dict[int | None, np.ndarray]) -> np.ndarray:
    """Bytes per token per GPU with every layer holding the token (what a token of KV cache costs)."""
    return sum(per_window.values())


def _tokens_fit(budget: np.ndarray, per_token: np.ndarray, block: int | None) -> np.ndarray:
    if block:
        return budget // (per_token * block) * block
    return budget // per_token


@formula("max_concurrent_sequences", "⌊kv_budget / per_seq(c)⌋,  kv_budget = ⌊u · M⌋ − W/t − A − non_torch(t) − "
         "workspaces", VLLM_ENGINE_ARGS, where="gpu_memory_utilization: the fraction of GPU memory the engine "
         "(weights, profiled activations, KV cache) may use; non_torch(t): the CUDA context and, for t > 1, the "
         "tensor-parallel group's NCCL communicator (components/overhead.py)")
def max_concurrency(sc: Scenario) -> pd.DataFrame:
    """max_concurrency.csv: one row per GPU, tensor_parallel, precision, kv_dtype and context. kv_tokens_fit: the
    tokens of KV cache that fit with every layer holding each of them (vLLM's "KV cache size ... tokens"); where
    sliding-window layers stop growing, a sequence holds more context than that."""
    _check(sc)
    frame, v = _budget_frame(sc, {C.CONTEXT: contexts(sc)})
    ctx = frame[C.CONTEXT].to_numpy(dtype=np.int64)
    per_seq = kv_bytes_per_sequence(v["per_window"], ctx, v["block"])
    frame[C.KV_BYTES_PER_SEQUENCE] = per_seq
    frame[C.KV_BUDGET] = v["budget"]
    frame[C.MAX_CONCURRENT] = v["budget"] // per_seq
    frame[C.KV_TOKENS_FIT] = _tokens_fit(v["budget"], _per_token(v["per_window"]), v["block"])
    return frame[list(C.MAX_CONCURRENCY_COLUMNS)]


def longest_context(per_window: dict[int | None, np.ndarray], allowed: np.ndarray, block: int | None,
                    cap: int) -> np.ndarray:
    """Per row the largest c in [0, cap] with per_seq(c) <= allowed: per_seq is non-decreasing in c (and not linear
    where sliding and global layers mix), so a bisection over every row at once, ~log2(cap) steps. Once every layer
    of a row is capped by its window and that fits, the context is bounded by the model (cap), not by memory."""
    allowed = np.asarray(allowed, dtype=np.int64)
    n = len(allowed)
    glob = per_window.get(None, np.zeros(n, dtype=np.int64))
    windows = [w for w in per_window if w is not None]
    top = max(windows, default=0)
    hi = np.where(glob > 0, np.minimum(cap, allowed // np.maximum(glob, 1)), min(cap, top)).astype(np.int64)
    lo = np.zeros(n, dtype=np.int64)  # per_seq(0) = 0 fits any budget
    while (lo < hi).any():
        mid = (lo + hi + 1) // 2
        ok = kv_bytes_per_sequence(per_window, mid, block) <= allowed
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid - 1)
    if windows:
        bounded = (glob == 0) & (kv_bytes_per_sequence(per_window, np.full(n, top), block) <= allowed)
        lo = np.where(bounded, cap, lo)
    return lo


@formula("max_context", "largest c with n · per_seq(c) ≤ kv_budget (bisection over c), capped at max_position; "
         "unbounded by memory once every layer is capped by its sliding window and that fits", VLLM_ENGINE_ARGS,
         where="inverse of max_concurrent_sequences")
def max_context(sc: Scenario) -> pd.DataFrame:
    """max_context.csv: the longest context each of `concurrency` sequences can have (0: not even one token)."""
    _check(sc)
    frame, v = _budget_frame(sc, {C.CONCURRENCY: tuple(int(b) for b in sc.grid[C.BATCH])})
    n = frame[C.CONCURRENCY].to_numpy(dtype=np.int64)
    cap = sc.model.max_position or MAX_CONTEXT_CAP
    frame[C.KV_BUDGET] = v["budget"]
    frame[C.MAX_CONTEXT] = longest_context(v["per_window"], v["budget"] // n, v["block"], cap)
    return frame[list(C.MAX_CONTEXT_COLUMNS)]


def _check(sc: Scenario) -> None:
    if sc.mode != "infer" or sc.model is None or not has_kv_cache(sc.model):
        raise UsageError("serving plans need mode: infer and a transformer with a KV cache (a causal LM)")


# heads of the classes whose requests are generate()'s (workload/inputs.py input_kind: causal_lm)
CAUSAL_LM_HEADS = ("ForCausalLM", "LMHeadModel")


def has_kv_cache(model: Architecture) -> bool:
    """Whether a serving plan applies to the model: a hand-modelled transformer with KV heads, or a derived model
    with a sequence axis whose class is a causal LM (its requests fill a KV cache; encoder-decoders are not
    derived for inference)."""
    if model.kind == "transformer":
        return model.kv_heads > 0
    if model.kind != "derived":
        return False
    source, card = model.derived.source, model.derived.card
    return (source.sequence and card.class_name.endswith(CAUSAL_LM_HEADS)
            and not source.spec.get("is_encoder_decoder", False))


def applies(sc: Scenario) -> bool:
    return sc.mode == "infer" and sc.model is not None and has_kv_cache(sc.model)
