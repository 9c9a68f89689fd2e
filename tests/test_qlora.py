"""QLoRA's 4-bit base (workload/qlora.py, issue 23): what the trace stands in for bitsandbytes' Linear4bit holds the
same bytes as bitsandbytes' own, computes the same function, and keeps what its training path keeps. The
whole step is checked against MemTracker in tests/test_finetune_derived.py (the QLoRA cases)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
bnb = pytest.importorskip("bitsandbytes")

from nnmem_sweep.components.weights import nf4_bytes  # noqa: E402
from nnmem_sweep.workload import qlora  # noqa: E402
from nnmem_sweep.workload.steps import storage_bytes  # noqa: E402

# each matrix's own tables beside the packed weight and scales: the 16-entry NF4 code (fp32), the 256-entry dynamic
# code of the double quantisation (fp32), the fp32 offset
TABLES = 16 * 4 + 256 * 4 + 4


def _real(linear: torch.nn.Linear) -> torch.nn.Module:
    """bitsandbytes' own Linear4bit, quantized on the CPU as BitsAndBytesConfig(nf4, double quant) does."""
    q = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                          compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4")
    q.weight = bnb.nn.Params4bit(linear.weight.data, requires_grad=False, compress_statistics=True, quant_type="nf4")
    return q.to("cpu")


def _bytes(module: torch.nn.Module) -> int:
    return storage_bytes(module.parameters()) + storage_bytes(qlora.quant_state_tensors(module))


@pytest.mark.parametrize("out_f, in_f", [(2048, 2048), (512, 2048), (8192, 2048), (300, 200)])
def test_storage_is_bitsandbytes_own_to_the_byte(out_f, in_f):
    torch.manual_seed(0)
    linear = torch.nn.Linear(in_f, out_f, bias=False, dtype=torch.bfloat16)
    traced = qlora.quantize(torch.nn.Sequential(linear), torch.bfloat16)[0]
    assert type(traced).__name__ == "TracedLinear4bit" and isinstance(traced, bnb.nn.Linear4bit)
    real = _real(torch.nn.Linear(in_f, out_f, bias=False, dtype=torch.bfloat16))
    assert _bytes(traced) == _bytes(real) == nf4_bytes(out_f, in_f) + TABLES


def test_llama_q_proj_by_hand():
    # 2048 × 2048 = 4,194,304 weights: 4 bits -> 2,097,152 B; a uint8 scale per 64 -> 65,536 B; an fp32 scale per
    # 256 of those -> 1,024 B; the tables 1,092 B: 2,164,804 B
    linear = torch.nn.Linear(2048, 2048, bias=False, dtype=torch.bfloat16)
    assert _bytes(qlora.quantize(torch.nn.Sequential(linear), torch.bfloat16)[0]) == 2_164_804


def test_same_function_as_bitsandbytes():
    torch.manual_seed(0)
    w = torch.nn.Linear(256, 512, bias=False, dtype=torch.bfloat16)
    traced = qlora.quantize(torch.nn.Sequential(torch.nn.Linear(256, 512, bias=False, dtype=torch.bfloat16)),
                            torch.bfloat16)[0]
    traced.weight.data.copy_(_real(w).weight.data)  # the same packed weights (its scales come from the same w)
    real = _real(w)
    traced.weight.quant_state = real.weight.quant_state
    x = torch.randn(4, 3, 256, dtype=torch.float32, requires_grad=True)
    y_traced, y_real = traced(x), real(x)
    assert y_traced.dtype == y_real.dtype == torch.float32  # back to the input's dtype, as Linear4bit.forward
    torch.testing.assert_close(y_traced, y_real, rtol=2e-2, atol=2e-2)
    (g_traced,) = torch.autograd.grad(y_traced.sum(), x)
    (g_real,) = torch.autograd.grad(y_real.sum(), x)
    torch.testing.assert_close(g_traced, g_real, rtol=2e-2, atol=2e-2)


def test_the_rest_is_fp32_and_everything_frozen():
    # peft's prepare_model_for_kbit_training: every fp16/bf16 parameter that is not 4-bit cast to fp32, all frozen
    model = torch.nn.Sequential(torch.nn.Embedding(100, 64, dtype=torch.bfloat16),
                                torch.nn.Linear(64, 128, dtype=torch.bfloat16),
                                torch.nn.LayerNorm(128, dtype=torch.bfloat16))
    qlora.quantize(model, torch.bfloat16)
    assert model[0].weight.dtype == model[2].weight.dtype == model[1].bias.dtype == torch.float32
    assert model[1].weight.dtype == torch.uint8
    assert not any(p.requires_grad for p in model.parameters())


def test_the_same_dtypes_as_peft_prepare_model_for_kbit_training():
    peft = pytest.importorskip("peft")

    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Embedding(100, 64, dtype=torch.bfloat16),
                                   torch.nn.Linear(64, 128, dtype=torch.bfloat16),
                                   torch.nn.LayerNorm(128, dtype=torch.bfloat16))

    ours = qlora.quantize(build(), torch.bfloat16)
    theirs = build()
    theirs[1] = _real(theirs[1])
    theirs = peft.prepare_model_for_kbit_training(theirs, use_gradient_checkpointing=False)
    assert [(n, p.dtype, p.requires_grad) for n, p in ours.named_parameters()] == \
        [(n, p.dtype, p.requires_grad) for n, p in theirs.named_parameters()]
    assert _bytes(ours) == _bytes(theirs)
