"""FORMULAS.md's published worked examples, reproduced through the whole estimator (run_scenario)."""
import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.models.arch import Architecture, LayerRecord
from nnmem_sweep.runner import run_scenario
from nnmem_sweep.units import MiB

from components.tiny_models import params_model, scenario


def _row(arch, mode="train", **axes):
    return run_scenario(scenario(arch, mode, **axes)).results.iloc[0]


def test_20m_params_fp32_batch_32_is_288_000_000_bytes():
    # 20,000,000 x 4 (weights) + 20,000,000 x 4 (grads) + 1,000,000 x 32 x 4 (activations)
    # = 80,000,000 + 80,000,000 + 128,000,000 = 288,000,000 B ≈ 274.7 MiB
    row = _row(params_model(20_000_000, per_sample=1_000_000), batch=32, precision="fp32", optimizer="sgd")
    assert (row[C.WEIGHTS], row[C.GRADIENTS], row[C.ACTIVATIONS]) == (80_000_000, 80_000_000, 128_000_000)
    assert row[C.PEAK_ALLOCATED] == 288_000_000
    assert round(row[C.PEAK_ALLOCATED] / MiB, 1) == 274.7


def test_bert_base_37000_per_token_published_mib():
    # 110M params, fp32 weights and grads, AdamW 2 x fp32, fp16 activations: 37,000 per token x 32 x 128 x 2 B.
    # Exact: 440,000,000 + 880,000,000 + 440,000,000 + 303,104,000 = 2,063,104,000 B = 1,967.52 MiB.
    # Published (MB meaning MiB): 419.5, 839.1, 419.5, ≈289, ≈1,967 — the parameter figures are truncated
    # (exact 419.62 / 839.23) and the total rounded, so each is matched within 0.2 MiB and the total within 1 MiB.
    row = _row(params_model(110_000_000, per_token=37_000), batch=32, seq_len=128, precision="fp16-mixed",
               optimizer="adamw")
    assert row[C.WEIGHTS] == 440_000_000 and row[C.GRADIENTS] == 440_000_000
    assert row[C.OPTIMIZER_STATE] == 880_000_000 and row[C.ACTIVATIONS] == 303_104_000
    assert row[C.PEAK_ALLOCATED] == 2_063_104_000
    for col, published in ((C.WEIGHTS, 419.5), (C.OPTIMIZER_STATE, 839.1), (C.GRADIENTS, 419.5),
                           (C.ACTIVATIONS, 289.0)):
        assert abs(row[col] / MiB - published) < 0.2, col
    assert abs(row[C.PEAK_ALLOCATED] / MiB - 1967) < 1


def test_karpathy_cnn_params_times_three_is_218_27_mib():
    # 19,072,984 params x 4 B x 3 (weights, grads, momentum) = 228,875,808 B = 218.27 MiB;
    # activations 532,752 x 4 B x 2 (value + gradient, as the CS231n count does) x 128 images = 545,538,048 B
    row = _row(params_model(19_072_984, per_sample=2 * 532_752), batch=128, precision="fp32",
               optimizer="sgd-momentum")
    states = row[C.WEIGHTS] + row[C.GRADIENTS] + row[C.OPTIMIZER_STATE]
    assert states == 228_875_808 and round(states / MiB, 2) == 218.27
    assert row[C.ACTIVATIONS] == 532_752 * 4 * 2 * 128 == 545_538_048


def test_layer_net_counts_what_backward_needs():
    # conv 3->4 (3x3, bias: 112 params) on a 3x8x8 input, output 4x8x8 = 256; ReLU output 256.
    # The conv keeps its input (the batch itself: 192 x 4 + int64 label = 776 B per sample), the ReLU its output
    # (256 x 4 = 1024). The peak is the ReLU's backward: weights 448 + momentum 448, no gradients yet,
    # per sample 1024 + 776 kept + gradients of the ReLU output and input 2 x 256 x 4 = 2048 -> 10 x 3848 + 896
    layers = (LayerRecord("conv2d_1", "conv2d", (4, 8, 8), 112, 256), LayerRecord("relu_1", "relu", (4, 8, 8), 0, 256))
    net = Architecture(name="net", kind="layers", family="layers", params=112, input_shape=(3, 8, 8),
                       layer_table=layers)
    row = _row(net, batch=10, precision="fp32", optimizer="sgd-momentum")
    assert row[C.PEAK_PHASE] == "backward"
    assert (row[C.ACTIVATIONS], row[C.TEMPORARY], row[C.GRADIENTS]) == (18_000, 20_480, 0)
    assert row[C.PEAK_ALLOCATED] == 896 + 38_480


@pytest.mark.parametrize("batch", [1, 7])
def test_params_model_inference_is_weights_plus_one_forward(batch):
    row = _row(params_model(1_000, per_sample=50), "infer", batch=batch, precision="bf16")
    assert row[C.PEAK_ALLOCATED] == 2_000 + batch * 50 * 2
