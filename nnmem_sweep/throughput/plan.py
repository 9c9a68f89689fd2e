"""The throughput estimate of one configuration a report or a plan speaks about: a GPU, a recipe, a sequence length
and a GPU count, with every figure's assumptions (utilisation, peak, bandwidth) beside it.

    training_figures(arch, gpu, precision, checkpointing, seq, gpus, options)
        tokens/s per GPU = MFU · peak FLOP/s(compute dtype) / (6·N + 12·L·H·Q·T)    (training.py, flops.py)
        cluster tokens/s = GPUs × that; time per 10⁹ tokens; cost per 10⁹ tokens at the GPU's price per hour
    serving_figures(arch, gpu, precision, prompt, decode, concurrency, tp, kv bytes per token, options)
        decode step = max(memory time, compute time) at the mean context of a request (prompt + half the generated
        tokens): tokens/s per sequence and aggregate at the concurrency asked (and at the most that fits);
        time to first token = the prefill of one prompt                              (inference.py)

MFU: the scenario's (`throughput.mfu`, per GPU or for all) or defaults.training_mfu for the GPU's generation, the
recipe's compute dtype and its recomputation; decode bandwidth and prefill compute efficiency likewise. A GPU whose
catalog entry has no peak FLOP/s or bandwidth (a GPU given only by its memory) gives NaN, printed as unknown.
Nothing here reads or changes a memory figure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..catalog.precisions import get_precision
from ..components.kv import (cache_layers, cache_tokens, kv_bytes_per_sequence, kv_bytes_per_token_by_window,
                             kv_bytes_per_token_per_gpu)
from ..components.weights import weights_bytes
from ..models.arch import Architecture
from ..models.count import params_breakdown
from ..scenario import GPUSpec
from .defaults import (Assumption, compute_dtype, decode_bandwidth_efficiency, inference_compute_efficiency,
                       stated, training_mfu)
from .flops import (decode_read_params, derived_has_tokens, flops_inputs, forward_flops_per_token, head_params,
                    model_flops_per_token, recompute_ratio)
from .inference import decode_step_time_s, moe_weight_bytes_read, time_to_first_token_s
from .options import DEFAULTS, ThroughputOptions
from .training import cost_per_billion_tokens_usd, time_per_billion_tokens_s, training_tokens_per_s_per_gpu


def has_tokens(arch: Architecture | None) -> bool:
    """A model the estimate can count FLOPs per token for: a transformer, or a parameter-count model with tokens."""
    if arch is None:
        return False
    return arch.kind == "transformer" or (arch.kind == "params" and bool(arch.activation_elements_per_token)) or \
        (arch.kind == "derived" and derived_has_tokens(arch))


def _peak(gpu: GPUSpec, precision: str) -> tuple[float, str]:
    dtype = compute_dtype(precision)
    peak = gpu.peak_flops(dtype)
    return (math.nan if peak is None else float(peak)), dtype


@dataclass(frozen=True)
class TrainingFigures:
    tokens_per_s_per_gpu: float  # NaN: the GPU's peak is unknown
    tokens_per_s: float  # all the GPUs together
    seconds_per_billion_tokens: float  # wall clock on all the GPUs
    cost_per_billion_tokens_usd: float  # NaN without a price per GPU-hour
    mfu: Assumption
    compute_dtype: str
    peak_flops: float


def training_mfu_for(arch: Architecture, gpu: GPUSpec, precision: str, checkpointing: str, seq: int,
                     options: ThroughputOptions = DEFAULTS) -> Assumption:
    """The MFU a training estimate assumes: the scenario's for this GPU, else the sourced default (full
    recomputation scaled by this model's model/hardware FLOPs)."""
    given = options.mfu_for(gpu.id)
    if given is not None:
        return stated("training MFU", given, "scenario (throughput.mfu)")
    ratio = None
    if checkpointing == "full":
        ratio = float(recompute_ratio(**flops_inputs(arch), seq=seq, recompute="full", head=head_params(arch)))
    return training_mfu(gpu.architecture, precision, checkpointing, ratio)


def training_figures(arch: Architecture, gpu: GPUSpec, precision: str, checkpointing: str, seq: int, gpus: int = 1,
                     options: ThroughputOptions = DEFAULTS) -> TrainingFigures:
    mfu = training_mfu_for(arch, gpu, precision, checkpointing, seq, options)
    peak, dtype = _peak(gpu, precision)
    fpt = float(model_flops_per_token(**flops_inputs(arch), seq=seq))
    per_gpu = float(training_tokens_per_s_per_gpu(peak, fpt, mfu.value))
    return TrainingFigures(
        tokens_per_s_per_gpu=per_gpu, tokens_per_s=per_gpu * gpus,
        seconds_per_billion_tokens=float(time_per_billion_tokens_s(gpus, per_gpu)),
        cost_per_billion_tokens_usd=float(cost_per_billion_tokens_usd(per_gpu, gpu.price_usd_per_hour)),
        mfu=mfu, compute_dtype=dtype, peak_flops=peak)


@dataclass(frozen=True)
class ServingFigures:
    tokens_per_s_per_sequence: float  # each of `concurrency` sequences decoding together
    tokens_per_s: float  # aggregate at `concurrency`
    tokens_per_s_at_max: float  # aggregate at the largest concurrency that fits (NaN when not given)
    ttft_s: float  # time to first token of one prompt
    weight_bytes_read: int  # what one decode step of one sequence reads (whole model)
    kv_bytes_per_sequence: int  # KV cache of one sequence at the mean context (whole model)
    bandwidth_efficiency: Assumption
    compute_efficiency: Assumption


def weight_bytes_read(arch: Architecture, precision: str) -> int:
    """W: the weight bytes a decode step of one token reads: every weight in its stored bytes except the input
    embedding tables (one row each per token; a tied output head reads the table whole). Embeddings stay 16-bit in
    the quantised recipes (components/weights.py)."""
    prec = get_precision(precision)
    shared, experts = decode_read_params(arch)
    total = arch.params if arch.kind == "derived" else params_breakdown(arch)["total"]
    unread = total - shared - experts
    return weights_bytes(arch, prec) - unread * prec.weight_bytes


def _weight_bits(precision: str) -> int:
    prec = get_precision(precision)
    return prec.quant_bits or 8 * prec.weight_bytes


def serving_figures(arch: Architecture, gpu: GPUSpec, precision: str, prompt: int, decode: int, concurrency: int,
                    tp: int = 1, kv_element_bytes: int | None = None, kv_scale_bytes: int = 0,
                    max_concurrency: int | None = None, options: ThroughputOptions = DEFAULTS) -> ServingFigures:
    """kv_element_bytes: bytes per cached element (None: the recipe's activation dtype, as kv_dtype auto)."""
    prec = get_precision(precision)
    bw_eff = (stated("decode bandwidth efficiency", options.decode_bandwidth_efficiency,
                     "scenario (throughput.decode_bandwidth_efficiency)")
              if options.decode_bandwidth_efficiency is not None
              else decode_bandwidth_efficiency(gpu.architecture, _weight_bits(precision)))
    c_eff = (stated("prefill compute efficiency", options.prefill_compute_efficiency,
                    "scenario (throughput.prefill_compute_efficiency)")
             if options.prefill_compute_efficiency is not None
             else inference_compute_efficiency(gpu.architecture, precision))
    peak, _ = _peak(gpu, precision)
    bandwidth = math.nan if gpu.memory_bandwidth_bytes_per_s is None else float(gpu.memory_bandwidth_bytes_per_s)
    inputs = flops_inputs(arch)
    w = weight_bytes_read(arch, precision)
    shared, experts = decode_read_params(arch)
    expert_bytes = w * experts // max(shared + experts, 1)  # the experts' share of W, in the same bytes per param

    def w_read(batch: int) -> float:
        if not experts:
            return float(w)
        return float(moe_weight_bytes_read(w - expert_bytes, expert_bytes, arch.num_experts, arch.experts_per_token,
                                           batch))

    mean_context = int(prompt) + int(decode) // 2
    kv = 0
    if arch.kind == "transformer" and arch.kv_heads:
        element = prec.act_bytes if kv_element_bytes is None else kv_element_bytes
        per_token = int(kv_bytes_per_token_per_gpu(arch, element, 1, kv_scale_bytes))
        kv = int(cache_tokens(arch, np.array([mean_context]))[0]) * per_token
    elif arch.kind == "derived":  # what the model's own cache holds, layer by layer (derive/kvcache.py)
        by_window = kv_bytes_per_token_by_window(cache_layers(arch, precision), None if kv_element_bytes is None
                                                 else np.array([kv_element_bytes]), np.array([1]),
                                                 np.array([kv_scale_bytes]))
        kv = int(kv_bytes_per_sequence(by_window, np.array([mean_context]), None)[0])
    fpt = float(forward_flops_per_token(**inputs, context=mean_context))

    def step(batch: int) -> float:
        return float(decode_step_time_s(w_read(batch), kv, batch, bandwidth, bw_eff.value, fpt, peak, c_eff.value,
                                        gpus=tp))

    t_n = step(concurrency)
    at_max = math.nan if not max_concurrency else max_concurrency / step(max_concurrency)
    ttft = float(time_to_first_token_s(prompt, inputs["n"], inputs["layers"], inputs["attn_width"], peak, c_eff.value,
                                       w_read(1), bandwidth, bw_eff.value, gpus=tp, window=inputs["window"]))
    return ServingFigures(tokens_per_s_per_sequence=1.0 / t_n, tokens_per_s=concurrency / t_n,
                          tokens_per_s_at_max=at_max, ttft_s=ttft, weight_bytes_read=w, kv_bytes_per_sequence=kv,
                          bandwidth_efficiency=bw_eff, compute_efficiency=c_eff)
