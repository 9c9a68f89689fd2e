"""Serving throughput: decode tokens/s (memory-bandwidth and compute roofline), prefill and time to first token.

One decode step gives each of the B sequences in the batch one new token. The batch multiplies the same weight
matrices (one GEMM of B rows per matrix), so the step reads the weights once, shared, and then each sequence's own
KV cache (its context × KV bytes per token; Kwon et al. 2023 §2.2, Pope et al. 2022 §2). The step lasts at least as
long as those reads and at least as long as its FLOPs take, on t tensor-parallel GPUs that split both:

    t_mem     = (W + B·KV) / (t · η_bw · bandwidth)
    t_compute = B · (2·N + 4·L·H·Q·c) / (t · η_c · peak FLOP/s)
    t_step    = max(t_mem, t_compute)                                       (roofline: the slower bound wins)
    tokens/s per sequence = 1 / t_step;    aggregate tokens/s = B / t_step

At small B the weights dominate (per-sequence tokens/s ≈ η_bw · bandwidth / W, the batch-1 bound); as B grows the
aggregate rises towards η_bw · bandwidth / KV (every sequence's cache must still be read) or the compute bound.
W counts the weights a step reads: every weight except the input embedding table (one row of it per token), in the
bytes they are stored in; a MoE step reads only the experts its tokens route to (`moe_weight_bytes_read`).
Not modelled: tensor-parallel all-reduces (2 per layer per step), kernel launch gaps, scheduling, prefills
interleaved with decode steps, speculative decoding. All of them make real steps longer: the estimate errs fast.
"""
from __future__ import annotations

import numpy as np

from ..citations import formula, source
from ..components.kv import KWON_2023
from .flops import forward_flops_per_token

POPE_2022 = source("pope2022", "Pope et al. 2022, Efficiently Scaling Transformer Inference (§2: decode latency is "
                   "bounded by loading the weights and the KV cache from memory at small batch, by FLOPs at large)",
                   "arXiv:2211.05102")
FEDUS_2021 = source("fedus2021", "Fedus et al. 2021, Switch Transformers (§2.2: the auxiliary load-balancing loss "
                    "drives routing towards a uniform distribution over experts)", "arXiv:2101.03961")


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


@formula("throughput.decode_step_time_s",
         "max((W + B·KV) / (t·η_bw·bandwidth), B·(2·N + 4·L·H·Q·c) / (t·η_c·peak))", POPE_2022, KWON_2023,
         where="Pope et al. §2 (memory time vs compute time of a decode step); Kwon et al. §2.3 (each sequence "
               "reads its own KV cache, the batch shares the weights)",
         note="t tensor-parallel GPUs split the weights, the KV heads and the FLOPs; their all-reduces are not "
              "modelled.")
def decode_step_time_s(weight_bytes_read, kv_bytes_per_sequence, batch, bandwidth, bandwidth_efficiency,
                       flops_per_token, peak_flops, compute_efficiency, gpus=1) -> np.ndarray:
    """Seconds for one decode step of `batch` sequences.

    weight_bytes_read: W, bytes of weights one step reads (whole model, before tensor parallelism).
    kv_bytes_per_sequence: KV bytes one sequence's cache holds at its current context (all layers, all heads).
    flops_per_token: forward FLOPs of one generated token (`forward_flops_per_token` at the context).
    bandwidth (bytes/s), peak_flops (FLOP/s): one GPU's datasheet figures; gpus: the tensor-parallel degree t.
    """
    b, t = _f(batch), _f(gpus)
    t_mem = (_f(weight_bytes_read) + b * _f(kv_bytes_per_sequence)) / (t * _f(bandwidth_efficiency) * _f(bandwidth))
    t_compute = b * _f(flops_per_token) / (t * _f(compute_efficiency) * _f(peak_flops))
    return np.maximum(t_mem, t_compute)


def decode_tokens_per_s_per_sequence(*args, **kwargs) -> np.ndarray:
    """Tokens/s one sequence sees while `batch` sequences decode together: 1 / t_step (decode_step_time_s's args)."""
    return 1.0 / decode_step_time_s(*args, **kwargs)


def decode_tokens_per_s(weight_bytes_read, kv_bytes_per_sequence, batch, *args, **kwargs) -> np.ndarray:
    """Aggregate tokens/s of the batch: B / t_step (decode_step_time_s's args)."""
    return _f(batch) / decode_step_time_s(weight_bytes_read, kv_bytes_per_sequence, batch, *args, **kwargs)


@formula("throughput.moe_weight_bytes_read", "W_dense + W_experts · (1 − (1 − k/E)^B)", FEDUS_2021,
         where="expected share of the E experts that B tokens, each routed to k of them uniformly and "
               "independently, touch (derived here; uniform routing is what §2.2's load-balancing loss aims for)",
         note="B = 1 reads k/E of the expert weights; large batches read nearly all. A dense model has W_experts = 0.")
def moe_weight_bytes_read(dense_bytes, expert_bytes, num_experts, top_k, batch) -> np.ndarray:
    """Weights one decode step of B tokens reads: the shared (dense) part always, each expert once if any token
    of the step routes to it. expert_bytes: all experts of all layers together."""
    e = _f(num_experts)
    untouched = np.where(e > 0, (1.0 - _f(top_k) / np.where(e > 0, e, 1.0)) ** _f(batch), 1.0)
    return _f(dense_bytes) + _f(expert_bytes) * (1.0 - untouched)


@formula("throughput.prefill_time_s",
         "max(B·p·(2·N + 4·L·H·Q·p) / (t·η_c·peak), W / (t·η_bw·bandwidth))", POPE_2022,
         where="§2: a prompt's tokens share one read of the weights, so prefill is compute-bound unless the prompt "
               "is short",
         note="Time to first token = the prefill of the prompt (its forward produces the first token's logits); "
              "queueing, tokenisation and the network are not included. Causal masking not credited (the FLOPs "
              "convention), so long prompts err long.")
def prefill_time_s(prompt_tokens, n, layers, attn_width, peak_flops, compute_efficiency, weight_bytes_read,
                   bandwidth, bandwidth_efficiency, gpus=1, batch=1, window=None) -> np.ndarray:
    p, t, b = _f(prompt_tokens), _f(gpus), _f(batch)
    flops = b * p * forward_flops_per_token(n, layers, attn_width, p, window)
    t_compute = flops / (t * _f(compute_efficiency) * _f(peak_flops))
    t_mem = _f(weight_bytes_read) / (t * _f(bandwidth_efficiency) * _f(bandwidth))
    return np.maximum(t_compute, t_mem)


def prefill_tokens_per_s(prompt_tokens, n, layers, attn_width, peak_flops, compute_efficiency, weight_bytes_read,
                         bandwidth, bandwidth_efficiency, gpus=1, batch=1, window=None) -> np.ndarray:
    """Prompt tokens processed per second: B·p / prefill time."""
    return _f(batch) * _f(prompt_tokens) / prefill_time_s(prompt_tokens, n, layers, attn_width, peak_flops,
                                                          compute_efficiency, weight_bytes_read, bandwidth,
                                                          bandwidth_efficiency, gpus, batch, window)


def time_to_first_token_s(*args, **kwargs) -> np.ndarray:
    """Time to first token of a prompt: its prefill time (prefill_time_s's args), nothing else."""
    return prefill_time_s(*args, **kwargs)
