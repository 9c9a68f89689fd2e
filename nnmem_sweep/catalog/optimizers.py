"""Optimizers as data: the state tensors each keeps per parameter and the temporaries its step allocates.

Read from the implementations (torch 2.13, torch/optim/*.py; bitsandbytes/optim/optimizer.py; lion-pytorch):
- State is created lazily at the first step() in the parameter's dtype (`torch.zeros_like(p)`), so the modelled
  step is step 2: state exists, and zero_grad(set_to_none=True) has freed the grads before forward.
- `step` is a 0-d fp32 tensor on the CPU for the foreach and for-loop implementations (no GPU bytes) and on the
  device for fused (and capturable) ones: 4 B per parameter tensor.
- Temporaries of one step(), in units of the state dtype:
    foreach_temps: multiples of Ψ (all parameters at once), e.g. Adam's `torch._foreach_sqrt(exp_avg_sqs)`.
    forloop_temps: multiples of the largest parameter tensor, e.g. `exp_avg_sq.sqrt() / bias_correction2_sqrt`
                   holds two tensors of one parameter's size for an instant.
    fused: nothing beyond the state (the update happens inside one kernel).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..citations import source
from ..errors import UsageError
from .names import OPTIMIZER_NONE, OPTIMIZERS as OPTIMIZER_NAMES

TORCH_OPTIM = source("torch-optim", "PyTorch 2.13 torch.optim implementations (adam.py, sgd.py, _adafactor.py, "
                     "adagrad.py, rmsprop.py: _multi_tensor_* and _single_tensor_* functions)",
                     "https://github.com/pytorch/pytorch/tree/main/torch/optim")
BNB_OPTIM = source("bnb-optim", "bitsandbytes Optimizer2State.init_state: uint8 state1/state2, fp32 absmax per "
                   "2048-element block, fp32 state for tensors under min_8bit_size = 4096 elements",
                   "https://github.com/bitsandbytes-foundation/bitsandbytes/blob/main/bitsandbytes/optim/optimizer.py")
DETTMERS_2021 = source("dettmers2021", "Dettmers et al. 2021, 8-bit Optimizers via Block-wise Quantization",
                       "arXiv:2110.02861")
SHAZEER_2018 = source("shazeer2018", "Shazeer & Stern 2018, Adafactor: Adaptive Learning Rates with Sublinear "
                      "Memory Cost", "arXiv:1804.04235")
CHEN_2023 = source("chen2023", "Chen et al. 2023, Symbolic Discovery of Optimization Algorithms (Lion)",
                   "arXiv:2302.06675")
HF_ANATOMY = source("hf-anatomy", "Hugging Face Transformers docs, Model training anatomy / Efficient training on "
                    "a single GPU (AdamW 8 B/param, 8-bit AdamW 2, SGD with momentum 4)",
                    "https://huggingface.co/docs/transformers/model_memory_anatomy")


@dataclass(frozen=True)
class Optimizer:
    name: str
    implementation: str  # what runs: the torch class or library
    state: tuple[str, ...]  # per-parameter state tensors of the parameter's shape
    layout: str  # "full": len(state) tensors of Ψ | "factored": Adafactor rows+cols | "8bit": bitsandbytes blocks
    foreach_temps: int  # × Ψ × state bytes
    forloop_temps: int  # × largest tensor × state bytes
    fused_available: bool  # torch offers fused=True for it
    device_step_when_fused: bool  # fused keeps `step` on the device (4 B per tensor)
    note: str = ""


OPTIMIZERS: dict[str, Optimizer] = {o.name: o for o in (
    # torch.optim.SGD(momentum=0): no state; foreach: _foreach_add_(params, grads, alpha=-lr) in place.
    Optimizer("sgd", "torch.optim.SGD(momentum=0)", (), "full", 0, 0, True, False),
    # momentum_buffer (a clone of the grad at step 1); step 2 updates it in place.
    Optimizer("sgd-momentum", "torch.optim.SGD(momentum=0.9)", ("momentum_buffer",), "full", 0, 0, True, False),
    # _multi_tensor_adam: exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs) (Ψ); _single_tensor_adam: sqrt then divide.
    Optimizer("adam", "torch.optim.Adam", ("exp_avg", "exp_avg_sq"), "full", 1, 2, True, True),
    Optimizer("adamw", "torch.optim.AdamW", ("exp_avg", "exp_avg_sq"), "full", 1, 2, True, True),
    # bitsandbytes' own fused kernel whatever optimizer_impl says.
    Optimizer("adamw-8bit", "bitsandbytes.optim.AdamW8bit", ("state1", "state2"), "8bit", 0, 0, True, False,
              note="bitsandbytes updates in its own kernel: optimizer_impl does not change its memory"),
    # torch.optim.Adafactor: row_var/col_var for >=2-D params, variance for 1-D; foreach builds var_estimates
    # (row_var @ col_var) for every parameter at once; there is no fused Adafactor (fused = foreach here).
    Optimizer("adafactor", "torch.optim.Adafactor", ("row_var", "col_var"), "factored", 1, 1, False, False,
              note="no fused Adafactor in torch: 'fused' is modelled as foreach"),
    # lion-pytorch keeps exp_avg; its update loops over parameters (clone + add: two of one parameter's size).
    Optimizer("lion", "lion_pytorch.Lion", ("exp_avg",), "full", 0, 2, False, False,
              note="lion-pytorch loops over parameters whatever optimizer_impl says"),
    # _multi_tensor_adagrad: std = _foreach_sqrt(state_sums) and numerator = _foreach_mul(grads, -clr): 2Ψ.
    Optimizer("adagrad", "torch.optim.Adagrad", ("sum",), "full", 2, 1, True, True),
    # _multi_tensor_rmsprop: avg = _foreach_sqrt(square_avgs); no fused RMSprop (fused = foreach here).
    Optimizer("rmsprop", "torch.optim.RMSprop", ("square_avg",), "full", 1, 1, False, False,
              note="no fused RMSprop in torch: 'fused' is modelled as foreach"),
)}

assert tuple(OPTIMIZERS) == OPTIMIZER_NAMES, "catalog/names.py and optimizers.py must list the same optimizers"

NONE = Optimizer(OPTIMIZER_NONE, "none (inference)", (), "full", 0, 0, False, False)


def get_optimizer(name: str) -> Optimizer:
    if name == OPTIMIZER_NONE:
        return NONE
    try:
        return OPTIMIZERS[name]
    except (KeyError, TypeError):
        raise UsageError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}") from None
