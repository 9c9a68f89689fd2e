"""CPU SDPA's math fallback (device="cpu", attention dropout > 0), counted by hand and against the measured truth."""
from pathlib import Path

import pytest

from nnmem_sweep.accuracy import compare, load_cases
from nnmem_sweep.catalog.precisions import get_precision
from nnmem_sweep.components import activations as act
from nnmem_sweep.components import cpu_kernels
from nnmem_sweep.components.terms import Term

from .tiny_models import TINY_GPT2, TINY_LLAMA, replace

FP32, BF16, BF16_MIXED = get_precision("fp32"), get_precision("bf16"), get_precision("bf16-mixed")
GPT = replace(TINY_GPT2, hidden=64, heads=4, head_dim=16, kv_heads=4, intermediate=256)  # dropout 0.1 (tiny_models)
TRUTH = Path(__file__).parents[1] / "data" / "truth"


def test_bf16_math_fallback_keeps_fp32_qkv_and_scores():
    # c_attn input 2·64 = 128; scaled q, scaled k, v upcast to fp32: 4·(64 + 64 + 64) = 768; o_proj input (output
    # cast back to bf16, contiguous) 2·64 = 128; residual dropout noise on the CPU in bf16 2·64 = 128 -> 1152.
    # Per s² element: fp32 softmax output, fp32 dropout noise, fp32 dropped probabilities, 4 heads: 4·3·4 = 48.
    assert act.attention_saved(GPT, BF16, "flash", device="cpu") == Term(tok=1152, s2=48)
    # selective recomputation drops the s² part only
    assert act.attention_saved(GPT, BF16, "flash", drop_scores=True, device="cpu") == Term(tok=1152)


def test_gpu_default_keeps_flash_without_scores():
    # cuda (the default): c_attn input 128 + Q, K, V 2·192 = 384 + output 128 + lse 4·4 = 16 + 1-byte mask 64 = 720
    assert act.attention_saved(GPT, BF16, "flash") == Term(tok=720)
    assert act.attention_saved(GPT, BF16, "flash", device="cuda") == Term(tok=720)


def test_fp32_math_fallback_equals_eager_with_cpu_dropout():
    # in fp32 nothing is upcast: the math path keeps what eager attention keeps (q, k, v, o_proj input, 3 s² tensors)
    assert act.attention_saved(GPT, FP32, "flash", device="cpu") == act.attention_saved(GPT, FP32, "eager",
                                                                                         device="cpu")
    assert act.attention_saved(GPT, FP32, "flash", device="cpu") == Term(tok=4 * 64 * 5 + 4 * 64, s2=4 * 12)


def test_autocast_scores_are_fp32_once_not_plus_a_bf16_cast():
    # under autocast eager attention keeps the fp32 softmax, the fp32 CPU noise, the fp32 dropped probabilities and
    # their bf16 cast for P·V: 4·(4 + 4 + 4 + 2) = 56 per s²; the math path keeps the 3 fp32 tensors: 4·3·4 = 48
    t = act.attention_saved(GPT, BF16_MIXED, "flash", device="cpu")
    assert t.s2 == 48
    assert act.attention_saved(GPT, BF16_MIXED, "eager", device="cpu").s2 == 4 * 14


def test_no_fallback_without_attention_dropout_or_off_cpu():
    assert not cpu_kernels.sdpa_falls_back_to_math(TINY_LLAMA, "flash", "cpu")  # Llama: attention_dropout 0
    assert not cpu_kernels.sdpa_falls_back_to_math(GPT, "flash", "cuda")
    assert not cpu_kernels.sdpa_falls_back_to_math(GPT, "eager", "cpu")
    assert cpu_kernels.sdpa_falls_back_to_math(GPT, "flash", "cpu")
    assert act.attention_saved(TINY_LLAMA, BF16, "flash", device="cpu") == act.attention_saved(TINY_LLAMA, BF16,
                                                                                                "flash")


@pytest.mark.parametrize("cid, within", [
    # measured bf16 math-path cases (tests/data/truth); what is left is CPU bf16 LayerNorm's bf16 mean/rstd
    # (FINDINGS.md: 2 LNs × 4 B × b·s·L = 393,216 B at b·s = 2048, L = 24)
    pytest.param("gpt2-medium-train-bf16-adamw-b2-s1024", 0.0001, id="truth-gpt2-medium-bf16-b2-s1024"),
    pytest.param("bert-large-train-bf16-adafactor-b16-s128", 0.0001, id="truth-bert-large-bf16-b16-s128"),
    pytest.param("gpt2-train-bf16-mixed-adamw-b8-s1024", 0.0001, id="truth-gpt2-bf16-mixed-b8-s1024"),
])
def test_measured_math_fallback_cases(cid, within):
    row = compare([c for c in load_cases(TRUTH) if c["case_id"] == cid]).iloc[0]
    assert row["device"] == "cpu"
    assert abs(row["error"]) <= within, (row["estimated_peak_bytes"], row["measured_peak_bytes"])
