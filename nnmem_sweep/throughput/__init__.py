"""Throughput ESTIMATES: how many tokens per second a GPU trains or serves, hence how many GPUs a deadline needs.

Memory decides whether a layout runs; these functions say how fast it runs, as an estimate from published FLOP
counts, datasheet peaks and published utilisations. Nothing here reads or changes a memory figure.

    flops.py     FLOPs per token (model FLOPs 6N + 12·L·H·Q·T, hardware FLOPs with recomputation, 2N + 4·L·H·Q·T
                 per generated token) and the N they count (`matmul_params`, `active_params` of an Architecture)
    training.py  tokens/s per GPU and per cluster at a model-FLOPs utilisation, time and cost per billion tokens,
                 time to train T tokens on G GPUs, GPUs needed for a deadline
    inference.py decode tokens/s per sequence and aggregate (memory-bandwidth and compute roofline), prefill,
                 time to first token, the weights a MoE decode step reads
    defaults.py  the utilisations the estimate assumes when the scenario states none, each with its source:
                 training MFU per GPU generation x precision x recomputation, decode bandwidth efficiency,
                 prefill / decode compute efficiency

Every function is pure and vectorised: arguments may be Python numbers, numpy arrays or pandas Series (they
broadcast); results are float64 (seconds, tokens/s, FLOPs, dollars). Peak FLOP/s and bandwidth are plain parameters
(FLOP/s and bytes/s, decimal as vendors publish them); an unknown figure passed as NaN gives NaN, never an error.
Importing the package registers its formulas and sources with `nnmem_sweep.citations`.
"""
from __future__ import annotations

from .defaults import (Assumption, decode_bandwidth_efficiency, defaults_table, inference_compute_efficiency,
                       training_mfu)
from .flops import (active_params, attention_width, decode_read_params, flops_inputs, forward_flops_per_token,
                    hardware_flops_per_token, head_params, matmul_params, model_flops_per_token, recompute_ratio)
from .inference import (decode_step_time_s, decode_tokens_per_s, decode_tokens_per_s_per_sequence,
                        moe_weight_bytes_read, prefill_time_s, prefill_tokens_per_s, time_to_first_token_s)
from .training import (cost_per_billion_tokens_usd, gpu_hours_per_billion_tokens, gpus_for_deadline,
                       hfu_from_mfu, mfu_from_throughput, time_per_billion_tokens_s, time_to_train_s,
                       training_tokens_per_s, training_tokens_per_s_per_gpu)

__all__ = [
    "Assumption", "active_params", "attention_width", "cost_per_billion_tokens_usd", "decode_bandwidth_efficiency",
    "decode_read_params", "decode_step_time_s", "decode_tokens_per_s", "decode_tokens_per_s_per_sequence",
    "defaults_table", "flops_inputs", "forward_flops_per_token", "gpu_hours_per_billion_tokens", "gpus_for_deadline",
    "hardware_flops_per_token", "head_params", "hfu_from_mfu", "inference_compute_efficiency", "matmul_params",
    "mfu_from_throughput", "model_flops_per_token", "moe_weight_bytes_read", "prefill_time_s", "prefill_tokens_per_s",
    "recompute_ratio", "time_per_billion_tokens_s", "time_to_first_token_s", "time_to_train_s", "training_mfu",
    "training_tokens_per_s", "training_tokens_per_s_per_gpu",
]
