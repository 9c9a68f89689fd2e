"""Optimizer state and step temporaries on the tiny Llama (Ψ = 1704, largest tensor 256, 21 tensors)."""
import pytest

from nnmem_sweep.catalog.optimizers import OPTIMIZERS, get_optimizer
from nnmem_sweep.catalog.precisions import get_precision
from nnmem_sweep.components.optimizer import optimizer_state_bytes, optimizer_step_temporary_bytes
from nnmem_sweep.errors import UsageError

from .tiny_models import TINY_LLAMA, params_model

PSI = 1704
FP32 = get_precision("fp32")


@pytest.mark.parametrize("opt,impl,state,temp", [
    ("sgd", "foreach", 0, 0),
    ("sgd-momentum", "foreach", PSI * 4, 0),  # momentum_buffer
    ("adam", "foreach", 2 * PSI * 4, PSI * 4),  # exp_avg, exp_avg_sq; _foreach_sqrt(exp_avg_sqs)
    ("adamw", "foreach", 2 * PSI * 4, PSI * 4),
    ("adamw", "forloop", 2 * PSI * 4, 2 * 256 * 4),  # sqrt + division of the largest tensor (32 x 8)
    ("adamw", "fused", 2 * PSI * 4 + 21 * 4, 0),  # device-side fp32 step per tensor
    ("adagrad", "foreach", PSI * 4, 2 * PSI * 4),  # std and numerator
    ("adagrad", "fused", PSI * 4 + 21 * 4, 0),
    ("rmsprop", "foreach", PSI * 4, PSI * 4),
    ("rmsprop", "fused", PSI * 4, PSI * 4),  # no fused RMSprop: modelled as foreach
    ("lion", "foreach", PSI * 4, 2 * 256 * 4),  # lion-pytorch loops over parameters
    # Adafactor: 2-D (rows + cols): embed 40, per layer q 16 k 12 v 12 o 16 gate 24 up 24 down 24 = 128 (x2),
    # lm_head 40; 1-D: 5 norms x 8 = 40 -> 40 + 256 + 40 + 40 = 376 values
    ("adafactor", "foreach", 376 * 4, PSI * 4),
    ("adamw-8bit", "foreach", 8 * PSI, 0),  # every tensor < 4096 elements: fp32 state1/state2
])
def test_state_and_temporaries_fp32(opt, impl, state, temp):
    o = get_optimizer(opt)
    assert optimizer_state_bytes(TINY_LLAMA, FP32, o, impl) == state
    assert optimizer_step_temporary_bytes(TINY_LLAMA, FP32, o, impl) == temp


def test_state_follows_parameter_dtype():
    bf16, master = get_precision("bf16"), get_precision("bf16-master")
    adamw = get_optimizer("adamw")
    assert optimizer_state_bytes(TINY_LLAMA, bf16, adamw, "foreach") == 2 * PSI * 2
    assert optimizer_state_bytes(TINY_LLAMA, master, adamw, "foreach") == 2 * PSI * 4  # fp32 state on the master


def test_adamw_8bit_blocks():
    # one 10,000-element tensor: 2 x 10,000 uint8 + 2 x ceil(10,000 / 2048) = 5 fp32 absmax + 2 qmaps of 256 fp32
    arch = params_model(10_000)
    assert optimizer_state_bytes(arch, FP32, get_optimizer("adamw-8bit"), "foreach") == 20_000 + 40 + 2048


def test_hf_anatomy_bytes_per_param():
    # Hugging Face "model memory anatomy": AdamW 8 B/param, SGD with momentum 4 (fp32)
    arch = params_model(1_000_000)
    assert optimizer_state_bytes(arch, FP32, get_optimizer("adamw"), "foreach") == 8_000_000
    assert optimizer_state_bytes(arch, FP32, get_optimizer("sgd-momentum"), "foreach") == 4_000_000


def test_every_optimizer_has_a_catalog_entry_and_unknown_is_an_error():
    assert set(OPTIMIZERS) == {"sgd", "sgd-momentum", "adam", "adamw", "adamw-8bit", "adafactor", "lion",
                               "adagrad", "rmsprop"}
    with pytest.raises(UsageError, match="unknown optimizer 'adamx'"):
        get_optimizer("adamx")
