"""Training throughput at a model-FLOPs utilisation: tokens/s, time and cost per billion tokens, time to train.

    tokens/s per GPU = MFU · peak FLOP/s / model FLOPs per token           (PaLM App. B, the definition of MFU)
    time to train T tokens on G GPUs = T / (G · tokens/s per GPU)           (Narayanan et al. 2021 eq. 4 with the
                                                                             hardware FLOPs 8·P when X is an HFU rate)

MFU is the ratio of the model FLOPs a run achieves to the GPU's peak: recomputation costs the run throughput, and
its MFU already shows that (Korthikanti et al. 2022 §5). A default MFU for a recipe with full recomputation is
therefore the generation's MFU without it times model/hardware FLOPs (defaults.training_mfu); an MFU the scenario
states is used as it is. The estimate assumes the stated MFU holds at the cluster size asked for: no
scaling-efficiency model (the published MFUs it cites were measured at 8 to 16,384 GPUs).
"""
from __future__ import annotations

import numpy as np

from ..citations import formula
from ..parallel.activations import NARAYANAN_2021
from .flops import KORTHIKANTI_2022, PALM_2022

SECONDS_PER_HOUR = 3600
BILLION = 10**9  # tokens: "per billion tokens" is decimal, as token counts are


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


@formula("throughput.training_tokens_per_s_per_gpu", "MFU · peak FLOP/s / (6·N + 12·L·H·Q·T)", PALM_2022,
         where="Appendix B: MFU = observed tokens/s × model FLOPs per token / peak FLOP/s, solved for tokens/s",
         note="An estimate: MFU is assumed (scenario or sourced default), not measured.")
def training_tokens_per_s_per_gpu(peak_flops, model_flops_per_token, mfu) -> np.ndarray:
    return _f(mfu) * _f(peak_flops) / _f(model_flops_per_token)


def training_tokens_per_s(peak_flops, model_flops_per_token, mfu, gpus) -> np.ndarray:
    """Cluster tokens/s: G × per-GPU tokens/s (the MFU is the one measured at that scale)."""
    return _f(gpus) * training_tokens_per_s_per_gpu(peak_flops, model_flops_per_token, mfu)


def mfu_from_throughput(tokens_per_s_per_gpu, model_flops_per_token, peak_flops) -> np.ndarray:
    """The inverse, as benchmark tables compute it: tokens/s per GPU × model FLOPs per token / peak."""
    return _f(tokens_per_s_per_gpu) * _f(model_flops_per_token) / _f(peak_flops)


@formula("throughput.hfu_from_mfu", "HFU = MFU · hardware FLOPs / model FLOPs", KORTHIKANTI_2022,
         where="§5 (model FLOPs utilization vs hardware FLOPs utilization)")
def hfu_from_mfu(mfu, model_flops_per_token, hardware_flops_per_token) -> np.ndarray:
    return _f(mfu) * _f(hardware_flops_per_token) / _f(model_flops_per_token)


@formula("throughput.time_to_train_s", "T_tokens / (G · tokens/s per GPU)", NARAYANAN_2021,
         where="eq. 4: end-to-end training time ≈ 8·T·P / (n·X) (X = achieved hardware FLOP/s per GPU, "
               "8·P hardware FLOPs per token with recomputation)")
def time_to_train_s(tokens, gpus, tokens_per_s_per_gpu) -> np.ndarray:
    return _f(tokens) / (_f(gpus) * _f(tokens_per_s_per_gpu))


def time_per_billion_tokens_s(gpus, tokens_per_s_per_gpu) -> np.ndarray:
    """Wall-clock seconds for 10⁹ tokens on G GPUs."""
    return time_to_train_s(BILLION, gpus, tokens_per_s_per_gpu)


def gpu_hours_per_billion_tokens(tokens_per_s_per_gpu) -> np.ndarray:
    """GPU-hours per 10⁹ tokens: independent of the GPU count under the constant-MFU assumption."""
    return BILLION / _f(tokens_per_s_per_gpu) / SECONDS_PER_HOUR


def cost_per_billion_tokens_usd(tokens_per_s_per_gpu, price_usd_per_gpu_hour) -> np.ndarray:
    """GPU-hours per 10⁹ tokens × price per GPU-hour; NaN where no price is given (None or NaN)."""
    price = np.asarray(np.where(np.equal(price_usd_per_gpu_hour, None), np.nan, price_usd_per_gpu_hour),
                       dtype=np.float64)
    return gpu_hours_per_billion_tokens(tokens_per_s_per_gpu) * price


def gpus_for_deadline(tokens, deadline_s, tokens_per_s_per_gpu) -> np.ndarray:
    """The fewest GPUs that train `tokens` within `deadline_s`: ⌈T / (deadline · tokens/s per GPU)⌉ (float, NaN
    where the throughput is unknown). The layout search rounds it up to a valid data-parallel degree."""
    need = _f(tokens) / (_f(deadline_s) * _f(tokens_per_s_per_gpu))
    # a hair of slack so that 8.000000001 GPUs, a rounding artefact of an exact division, is 8 and not 9
    return np.ceil(need * (1 - 1e-12))
