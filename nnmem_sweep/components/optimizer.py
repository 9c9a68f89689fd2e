"""Optimizer state and step temporaries, in exact bytes (catalog/optimizers.py says what each optimizer keeps)."""
from __future__ import annotations

from ..catalog.optimizers import (BNB_OPTIM, DETTMERS_2021, HF_ANATOMY, SHAZEER_2018, TORCH_OPTIM, Optimizer)
from ..catalog.precisions import Precision
from ..citations import formula
from ..models.arch import Architecture
from .weights import param_summary

BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes: smaller tensors keep fp32 state
BNB_BLOCK = 2048  # bitsandbytes block-wise optimizer: one fp32 absmax per 2048 elements per state
BNB_QMAP_BYTES = 2 * 256 * 4  # the two shared 256-entry fp32 quantisation maps ("dynamic", "udynamic")
STEP_BYTES = 4  # fused optimizers keep a 0-d fp32 `step` per parameter tensor on the device


@formula("optimizer_state_bytes.full", "k · Ψ · bytes(state dtype)  (k state tensors per parameter)", TORCH_OPTIM,
         HF_ANATOMY, where="adam.py _init_group: exp_avg, exp_avg_sq = zeros_like(p); sgd.py momentum_buffer")
def _full_state(k: int, psi: int, state_bytes: int) -> int:
    return k * psi * state_bytes


@formula("optimizer_state_bytes.adafactor", "Σ_{≥2-D} (rows + cols) · bytes + Σ_{1-D} n · bytes",
         SHAZEER_2018, TORCH_OPTIM, where="§3 factored second moment; _adafactor.py row_var/col_var/variance",
         note="params models and layer nets have no tensor shapes: counted unfactored (Ψ · bytes), an upper bound")
def _adafactor_state(arch: Architecture, state_bytes: int) -> int:
    s = param_summary(arch)
    if not s.tensors:
        return s.total * state_bytes
    n = 0
    for t in s.tensors:
        if len(t.shape) >= 2:
            lead = 1
            for d in t.shape[:-2]:
                lead *= d
            rows, cols = t.shape[-2], t.shape[-1]
            n += t.count * lead * (rows + cols)  # row_var (…, rows, 1) + col_var (…, 1, cols)
        else:
            n += t.count * t.numel
    return n * state_bytes


@formula("optimizer_state_bytes.adamw-8bit",
         "Σ_{n≥4096} (2n + 2·⌈n/2048⌉·4) + Σ_{n<4096} 2·4n + 2·256·4", DETTMERS_2021, BNB_OPTIM,
         where="§2 block-wise quantization; Optimizer2State.init_state")
def _bnb8_state(arch: Architecture) -> int:
    s = param_summary(arch)
    shapes = [(t.numel, t.count) for t in s.tensors] or [(s.total, 1)]
    total = 0
    any_8bit = False
    for n, count in shapes:
        if n >= BNB_MIN_8BIT_SIZE:
            any_8bit = True
            total += count * (2 * n + 2 * (-(-n // BNB_BLOCK)) * 4)
        else:
            total += count * 2 * 4 * n
    return total + (BNB_QMAP_BYTES if any_8bit else 0)


def optimizer_state_bytes(arch: Architecture, prec: Precision, opt: Optimizer, impl: str) -> int:
    """State live from step 1 on: the tensors of `opt.state` (+ the device-side step of fused optimizers)."""
    s = param_summary(arch)
    if opt.layout == "8bit":
        state = _bnb8_state(arch)
    elif opt.layout == "factored":
        state = _adafactor_state(arch, prec.state_bytes)
    else:
        state = _full_state(len(opt.state), s.total, prec.state_bytes)
    if impl == "fused" and opt.fused_available and opt.device_step_when_fused:
        state += STEP_BYTES * s.n_tensors
    return state


@formula("optimizer_step_temporary_bytes",
         "foreach: t_f · Ψ · bytes(state);  forloop: t_l · largest tensor · bytes(state);  fused: 0", TORCH_OPTIM,
         where="adam.py _multi_tensor_adam (_foreach_sqrt(exp_avg_sqs)), _single_tensor_adam; adagrad.py; "
         "rmsprop.py; _adafactor.py (var_estimates)")
def optimizer_step_temporary_bytes(arch: Architecture, prec: Precision, opt: Optimizer, impl: str) -> int:
    s = param_summary(arch)
    if opt.layout == "8bit":
        return 0
    if opt.name == "lion":  # one implementation whatever the flag says
        impl = "forloop"
    if impl == "fused" and not opt.fused_available:
        impl = "foreach"
    if impl == "fused" or impl == "none":
        return 0
    if impl == "foreach":
        return opt.foreach_temps * s.total * prec.state_bytes
    return opt.forloop_temps * s.largest * prec.state_bytes
