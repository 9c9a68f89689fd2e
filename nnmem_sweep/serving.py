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

from fractions import Fraction

import numpy as np
import pandas as pd

from . import columns as C
from .catalog import names
from .catalog.precisions import get_precision
from .citations import formula
from .components.kv import (KV_ELEMENT_BYTES, KV_SCALE_BYTES_PER_HEAD_TOKEN, VLLM_ENGINE_ARGS,
                            kv_bytes_per_token_per_gpu, paged_tokens)
from .components.weights import param_summary, weights_bytes
from .errors import UsageError
from .estimate import estimate_frame
from .grid import product_frame
from .models.arch import Architecture
from .scenario import Scenario

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # tokens of the profiling prefill (vLLM serve's default chunk on datacenter GPUs)
DEFAULT_TENSOR_PARALLEL = (1,)
DEFAULT_PREFILL_LOGITS = "last"  # generate() passes logits_to_keep=1

# Tensors every tensor-parallel rank keeps whole (by name in components/weights.py's tensor table).
_ROW_PARALLEL = ("o_proj", "down_proj", "c_proj", "experts.down_proj")


def _replicated(name: str, ndim: int) -> bool:
    if "norm" in name.lower() or name.startswith("router"):
        return True
    return ndim == 1 and name.endswith(".bias") and name.rsplit(".", 1)[0] in _ROW_PARALLEL


@formula("weights_per_gpu_bytes", "⌈(W − R) / t⌉ + R,  R = norms + router + row-parallel biases (16-bit)",
         VLLM_ENGINE_ARGS, where="tensor_parallel_size (Megatron-style column/row parallel linears, "
         "vocab-parallel embedding and LM head)")
def weights_per_gpu_bytes(arch: Architecture, precision: str, t: np.ndarray) -> np.ndarray:
    prec = get_precision(precision)
    total = weights_bytes(arch, prec)
    rep = 0
    if arch.kind == "transformer":
        # quantised recipes keep these small tensors in 16 bit, the same bytes as the rest of the unquantised part
        rep = sum(x.numel * x.count for x in param_summary(arch).tensors
                  if _replicated(x.name, len(x.shape))) * prec.weight_bytes
    t = np.asarray(t, dtype=np.int64)
    return -(-(total - rep) // t) + rep


def kv_element(kv_dtype: str, precision: str) -> tuple[int, int]:
    """(bytes per cached element, scale bytes per head and token) of a KV dtype; auto = the recipe's act dtype."""
    if kv_dtype == "auto":
        return get_precision(precision).act_bytes, 0
    if kv_dtype not in KV_ELEMENT_BYTES:
        raise UsageError(f"unknown kv_dtype {kv_dtype!r}; use {', '.join(names.KV_DTYPES)}")
    return KV_ELEMENT_BYTES[kv_dtype], KV_SCALE_BYTES_PER_HEAD_TOKEN[kv_dtype]


def sweep_prefill_logits(sc: Scenario) -> str:
    """The prefill logits of the sweep (results.csv, max_batch.csv, --stream): the scenario's choice in infer mode."""
    return options(sc)["prefill_logits"] if sc.mode == "infer" else "last"


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


def _activation_peak(sc: Scenario, precisions: tuple, tokens: int) -> np.ndarray:
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
    per token per GPU, as numpy columns."""
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
    act = _activation_peak(sc, precisions, opt["max_num_batched_tokens"])[p_code]
    fixed = sc.overheads.cuda_context_bytes + sc.overheads.cublas_workspace_bytes
    budget = np.maximum(engine - weights - act - fixed, 0)

    elem = np.array([[kv_element(k, p)[0] for k in opt["kv_dtype"]] for p in precisions], dtype=np.int64)
    scale = np.array([[kv_element(k, p)[1] for k in opt["kv_dtype"]] for p in precisions], dtype=np.int64)
    per_token = kv_bytes_per_token_per_gpu(arch, elem[p_code, k_code], t, scale[p_code, k_code])
    return frame, {"budget": budget, "per_token": per_token, "block": opt["kv_block_size"]}


def _tokens_fit(budget: np.ndarray, per_token: np.ndarray, block: int | None) -> np.ndarray:
    if block:
        return budget // (per_token * block) * block
    return budget // per_token


@formula("max_concurrent_sequences", "⌊kv_budget / per_seq(c)⌋,  kv_budget = ⌊u · M⌋ − W/t − A − context − "
         "workspace", VLLM_ENGINE_ARGS, where="gpu_memory_utilization: the fraction of GPU memory the engine "
         "(weights, profiled activations, KV cache) may use")
def max_concurrency(sc: Scenario) -> pd.DataFrame:
    """max_concurrency.csv: one row per GPU, tensor_parallel, precision, kv_dtype and context."""
    _check(sc)
    frame, v = _budget_frame(sc, {C.CONTEXT: contexts(sc)})
    ctx = frame[C.CONTEXT].to_numpy(dtype=np.int64)
    per_seq = paged_tokens(sc.model, ctx, v["block"]) * v["per_token"]
    frame[C.KV_BYTES_PER_SEQUENCE] = per_seq
    frame[C.KV_BUDGET] = v["budget"]
    frame[C.MAX_CONCURRENT] = v["budget"] // per_seq
    frame[C.KV_TOKENS_FIT] = _tokens_fit(v["budget"], v["per_token"], v["block"])
    return frame[list(C.MAX_CONCURRENCY_COLUMNS)]


@formula("max_context", "largest c with n · per_seq(c) ≤ kv_budget: ⌊kv_budget / n / per_token⌋ (whole blocks), "
         "capped at max_position; unbounded by memory once the sliding window fits", VLLM_ENGINE_ARGS,
         where="inverse of max_concurrent_sequences")
def max_context(sc: Scenario) -> pd.DataFrame:
    """max_context.csv: the longest context each of `concurrency` sequences can have (0: not even one token)."""
    _check(sc)
    frame, v = _budget_frame(sc, {C.CONCURRENCY: tuple(int(b) for b in sc.grid[C.BATCH])})
    n = frame[C.CONCURRENCY].to_numpy(dtype=np.int64)
    tokens = _tokens_fit(v["budget"] // n, v["per_token"], v["block"])
    cap = sc.model.max_position or np.iinfo(np.int64).max
    window = sc.model.sliding_window
    if window:  # a sequence never holds more than the window: once that fits, the context is bounded by the model
        held = paged_tokens(sc.model, np.array([window]), v["block"])[0]
        tokens = np.where(tokens >= held, cap, tokens)
    frame[C.KV_BUDGET] = v["budget"]
    frame[C.MAX_CONTEXT] = np.minimum(tokens, cap)
    return frame[list(C.MAX_CONTEXT_COLUMNS)]


def _check(sc: Scenario) -> None:
    if sc.mode != "infer" or sc.model is None or sc.model.kind != "transformer":
        raise UsageError("serving plans need mode: infer and a transformer model")


def applies(sc: Scenario) -> bool:
    return sc.mode == "infer" and sc.model is not None and sc.model.kind == "transformer" and sc.model.kv_heads > 0
