"""Parameter tensors, weights / master / gradient bytes and the quantised layouts, counted by hand."""
import pytest

from nnmem_sweep.catalog.precisions import PRECISIONS, get_precision
from nnmem_sweep.components.weights import (autocast_copies_bytes, gradients_bytes, int4_bytes, int8_bytes,
                                            master_weights_bytes, nf4_bytes, param_summary, weights_bytes)
from nnmem_sweep.errors import UsageError
from nnmem_sweep.models.count import params_breakdown
from nnmem_sweep.models.presets import hand_modelled_ids, load_preset

from .tiny_models import TINY_GPT2, TINY_LLAMA


def test_tiny_tensor_tables_match_hand_count():
    assert param_summary(TINY_LLAMA).total == 1704  # arithmetic in tiny_models.py
    assert param_summary(TINY_GPT2).total == 2144
    s = param_summary(TINY_LLAMA)
    # embed 1 + 2 layers x (2 norms + 7 linears) + final norm 1 + lm_head 1 = 21 tensors
    assert s.n_tensors == 21
    assert s.largest == 256  # embed and lm_head, 32 x 8
    assert s.block_linear == 2 * (64 + 32 + 32 + 64 + 3 * 128)  # 1152
    assert s.matmul == 1152 + 256  # block linears + lm_head


@pytest.mark.parametrize("preset", hand_modelled_ids())
def test_tensor_table_agrees_with_the_models_count(preset):
    arch = load_preset(preset)
    assert param_summary(arch).total == params_breakdown(arch)["total"]
    assert param_summary(arch).largest == params_breakdown(arch)["largest_tensor"]


@pytest.mark.parametrize("preset,params", [
    ("llama-3.1-8b", 8_030_261_248),  # Meta model card / HF safetensors index
    ("gpt2", 124_439_808),  # HF gpt2, tied embeddings
])
def test_published_parameter_counts(preset, params):
    assert param_summary(load_preset(preset)).total == params


@pytest.mark.parametrize("prec,weights,master,grads", [
    ("fp32", 1704 * 4, 0, 1704 * 4),
    ("bf16", 1704 * 2, 0, 1704 * 2),
    ("fp16", 1704 * 2, 0, 1704 * 2),
    ("bf16-mixed", 1704 * 4, 0, 1704 * 4),
    ("fp16-mixed", 1704 * 4, 0, 1704 * 4),
    ("bf16-master", 1704 * 2, 1704 * 4, 1704 * 2),  # ZeRO: 2 + 2 + 4 (+ 8 of Adam state) = 16 B/param
])
def test_weights_master_gradients_per_recipe(prec, weights, master, grads):
    p = get_precision(prec)
    assert weights_bytes(TINY_LLAMA, p) == weights
    assert master_weights_bytes(TINY_LLAMA, p) == master
    assert gradients_bytes(TINY_LLAMA, p) == grads


def test_quantised_layouts_by_hand():
    # int8: rows*cols + 4*rows (fp32 absmax per row)
    assert int8_bytes(8, 8) == 64 + 32
    # int4 group 128: 4-bit values, per group fp16 scale + 4-bit zero; (16, 8): 64 + 16 groups * 2 + 8
    assert int4_bytes(16, 8) == 64 + 32 + 8
    assert int4_bytes(4096, 4096) == 4096 * 4096 // 2 + 4096 * 32 * 2 + 4096 * 32 // 2
    # nf4: 4-bit values + 1 B absmax per 64 + 4 B per 256 absmax blocks
    assert nf4_bytes(8, 8) == 32 + 1 + 4
    assert nf4_bytes(4096, 4096) == 8_388_608 + 262_144 + 1024 * 4
    # QLoRA §3: constants of 0.127 bits per parameter with double quantisation
    n = 4096 * 4096
    assert abs((nf4_bytes(4096, 4096) - n // 2) * 8 / n - 0.127) < 0.001


@pytest.mark.parametrize("prec,expected", [
    # block linears per layer int8: q 96, k 48, v 48, o 96, gate 192, up 192, down 160 = 832; x2 = 1664;
    # the other 1704 - 1152 = 552 parameters stay 16-bit: 1104
    ("int8", 1664 + 1104),
    # int4: q 52, k 26, v 26, o 52, gate 104, up 104, down 84 = 448; x2 = 896
    ("int4", 896 + 1104),
    # nf4: q 37, k 21, v 21, o 37, gate/up/down 70 each = 326; x2 = 652
    ("nf4", 652 + 1104),
])
def test_quantised_weights_tiny(prec, expected):
    assert weights_bytes(TINY_LLAMA, get_precision(prec)) == expected


def test_autocast_copies_only_under_autocast():
    # (1152 block linears + 256 lm_head) x 2 B
    assert autocast_copies_bytes(TINY_LLAMA, get_precision("bf16-mixed")) == 2816
    assert autocast_copies_bytes(TINY_LLAMA, get_precision("bf16")) == 0


def test_lower_precision_never_more_weight_bytes():
    arch = load_preset("llama-3.1-8b")
    order = ["fp32", "bf16", "int8", "int4"]
    values = [weights_bytes(arch, PRECISIONS[p]) for p in order]
    assert values == sorted(values, reverse=True)
    assert weights_bytes(arch, PRECISIONS["nf4"]) < weights_bytes(arch, PRECISIONS["int8"])


def test_unknown_precision_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown precision 'fp6'"):
        get_precision("fp6")
