"""The throughput estimate (nnmem_sweep/throughput): hand-computed values, published figures, properties.

Datasheet figures the tests use (the catalog's own fields are another helper's work; these are written here with
their source so the tests do not depend on it):
  H100 SXM5  bf16 989.5 TFLOP/s dense (NVIDIA H100 datasheet: 1,979 "with sparsity"), fp8 1,979 dense, 3.35 TB/s
  A100 SXM4  bf16 312 TFLOP/s dense, 80 GB: 2,039 GB/s (NVIDIA A100 datasheet)
  TPU v4     bf16 275 TFLOP/s per chip (Google Cloud TPU v4 documentation; the peak PaLM's MFU divides by)
Published figures are reproduced within the rounding of the published numbers unless a test says otherwise, and
says why.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnmem_sweep.citations import FORMULAS
from nnmem_sweep.models import load_preset
from nnmem_sweep.models.arch import Architecture
from nnmem_sweep.throughput import (active_params, cost_per_billion_tokens_usd, decode_bandwidth_efficiency,
                                    decode_read_params, decode_step_time_s, flops_inputs, decode_tokens_per_s, decode_tokens_per_s_per_sequence,
                                    defaults_table, forward_flops_per_token, gpu_hours_per_billion_tokens,
                                    gpus_for_deadline, hardware_flops_per_token, head_params, hfu_from_mfu,
                                    inference_compute_efficiency, matmul_params, mfu_from_throughput,
                                    model_flops_per_token, moe_weight_bytes_read, prefill_time_s, recompute_ratio,
                                    time_per_billion_tokens_s, time_to_first_token_s, time_to_train_s, training_mfu,
                                    training_tokens_per_s, training_tokens_per_s_per_gpu)
from nnmem_sweep.throughput.defaults import GENERATIONS, compute_dtype
from nnmem_sweep.throughput.flops import attention_width

H100_BF16, H100_FP8, H100_BW = 989.5e12, 1979e12, 3.35e12
A100_BF16, A100_BW = 312e12, 2039e9
TPU_V4_BF16 = 275e12
DAY = 86400


def _model_fpt(arch: Architecture, seq: int, n: int | None = None) -> float:
    n = matmul_params(arch) if n is None else n
    return float(model_flops_per_token(n, arch.layers, attention_width(arch), seq, arch.sliding_window))


# ----------------------------------------------------------------------------------------------- hand-computed

def test_flops_per_token_by_hand():
    # N = 1000, L = 2, H·Q = 8, T = 16, head 100
    assert model_flops_per_token(1000, 2, 8, 16) == 6 * 1000 + 12 * 2 * 8 * 16 == 9072
    assert hardware_flops_per_token(1000, 2, 8, 16, "none", 100) == 9072
    assert hardware_flops_per_token(1000, 2, 8, 16, "selective", 100) == 6000 + 16 * 2 * 8 * 16 == 10096
    assert hardware_flops_per_token(1000, 2, 8, 16, "full", 100) == 8 * 900 + 6 * 100 + 4096 == 11896
    assert forward_flops_per_token(1000, 2, 8, 16) == 2000 + 4 * 2 * 8 * 16 == 3024
    assert model_flops_per_token(1000, 2, 8, 16, window=4) == 6000 + 12 * 2 * 8 * 4 == 6768
    assert model_flops_per_token(1000) == 6000  # no layer figures: the attention term is left out
    # vectorised over recompute modes and sequence lengths at once
    out = hardware_flops_per_token(1000, 2, 8, np.array([16, 16, 16]), np.array(["none", "selective", "full"]))
    assert out.tolist() == [9072, 10096, 8 * 1000 + 4096]


def test_full_recomputation_without_head_is_four_thirds():
    assert recompute_ratio(7e9, 32, 4096, 8192, "full") == pytest.approx(4 / 3, rel=1e-15)
    assert recompute_ratio(7e9, 32, 4096, 8192, "none") == 1


def test_narayanan_2021_eq3_and_korthikanti_2022_model_flops_are_the_same_count():
    # Narayanan et al. 2021 eq. 3 (with recomputation): F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h));
    # Korthikanti et al. 2022 §5 model FLOPs: 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)). GPT of Table 1's 1T row.
    B, s, l, h, V = 3072, 2048, 128, 25600, 51200
    n, head = 12 * l * h**2 + V * h, V * h  # eq. 2 without the 13h and position terms: the matmul parameters
    full = hardware_flops_per_token(n, l, h, s, "full", head) * B * s
    model = model_flops_per_token(n, l, h, s) * B * s
    assert full == pytest.approx(96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h)), rel=1e-12)
    assert model == pytest.approx(72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h)), rel=1e-12)


def test_matmul_params_llama_3_1_8b_is_torchtitans_count():
    # torchtitan get_nparams_and_active_nparams: every parameter but tok_embeddings (untied lm_head kept)
    arch = load_preset("llama-3.1-8b")
    assert matmul_params(arch) == 8_030_261_248 - 128_256 * 4096 == 7_504_924_672
    assert head_params(arch) == 128_256 * 4096


def test_matmul_params_gpt2_matches_nanogpt_non_embedding_count():
    # nanoGPT model.py get_num_params(non_embedding=True) subtracts wpe only: the tied wte is the output layer's
    # weight, used by a matmul. 124,439,808 − 1,024·768 = 123,653,376.
    arch = load_preset("gpt2")
    assert matmul_params(arch) == 124_439_808 - 1024 * 768 == 123_653_376
    assert head_params(arch) == 50257 * 768  # tied, still a matmul


def test_mixtral_active_parameters_mistral_ai_12_9b_of_46_7b():
    # Mistral AI, "Mixtral of experts" (Dec 2023): 46.7B total parameters, 12.9B used per token.
    arch = load_preset("mixtral-8x7b")
    assert round(arch.params / 1e9, 1) == 46.7
    assert round(active_params(arch) / 1e9, 1) == 12.9
    # 32 layers × 6 unused experts × 3·4096·14336
    assert arch.params - active_params(arch) == 32 * 6 * 3 * 4096 * 14336
    assert matmul_params(arch) == active_params(arch) - 32000 * 4096


def test_architecture_helpers_agree_with_the_counts():
    mixtral = load_preset("mixtral-8x7b")
    shared, experts = decode_read_params(mixtral)
    assert experts == 32 * 8 * 3 * 4096 * 14336
    assert shared + experts == mixtral.params - 32000 * 4096  # all but the input embedding table
    # one token reads exactly the matmul parameters it uses: the shared part and k of E experts
    assert moe_weight_bytes_read(shared, experts, 8, 2, 1) == matmul_params(mixtral)
    llama = load_preset("llama-3.1-8b")
    assert decode_read_params(llama) == (matmul_params(llama), 0)
    assert model_flops_per_token(**flops_inputs(llama), seq=8192) == _model_fpt(llama, 8192)
    assert hardware_flops_per_token(**flops_inputs(llama), seq=8192, recompute="full", head=head_params(llama)) == \
        8 * (7_504_924_672 - 128_256 * 4096) + 6 * 128_256 * 4096 + 16 * 32 * 4096 * 8192
    mistral = load_preset("mistral-7b")  # sliding window 4096 caps T
    assert model_flops_per_token(**flops_inputs(mistral), seq=8192) == model_flops_per_token(**flops_inputs(mistral),
                                                                                             seq=4096)
    counted = Architecture(name="derived", kind="params", params=7_000_000_000)
    assert model_flops_per_token(**flops_inputs(counted), seq=8192) == 6 * 7_000_000_000  # 6N only


def test_layer_nets_have_no_tokens():
    arch = Architecture(name="cnn", kind="layers")
    with pytest.raises(ValueError, match="layer-list net"):
        matmul_params(arch)


def test_bad_recompute_mode_is_named():
    with pytest.raises(ValueError, match="partial"):
        hardware_flops_per_token(1000, 2, 8, 16, "partial")
    with pytest.raises(ValueError, match="partial"):
        training_mfu("hopper", "bf16", "partial")


def test_training_arithmetic_by_hand():
    tps = training_tokens_per_s_per_gpu(1e15, 1e9, 0.4)
    assert tps == 400_000
    assert training_tokens_per_s(1e15, 1e9, 0.4, 10) == 4_000_000
    assert time_per_billion_tokens_s(10, tps) == 250
    assert time_to_train_s(2e12, 1000, tps) == 5000
    assert gpu_hours_per_billion_tokens(tps) == pytest.approx(1e9 / 4e5 / 3600)
    assert cost_per_billion_tokens_usd(tps, 2.0) == pytest.approx(2 * 1e9 / 4e5 / 3600)
    assert math.isnan(cost_per_billion_tokens_usd(tps, None))
    assert gpus_for_deadline(1e12, 1e5, tps) == 25  # exactly 25, not 26
    assert gpus_for_deadline(1.001e12, 1e5, tps) == 26
    assert mfu_from_throughput(400_000, 1e9, 1e15) == pytest.approx(0.4)
    assert hfu_from_mfu(0.3, 6, 8) == pytest.approx(0.4)


def test_unknown_peak_gives_nan_not_an_error():
    assert math.isnan(training_tokens_per_s_per_gpu(np.nan, 1e9, 0.4))
    assert np.isnan(decode_step_time_s(1e9, 0, 1, np.nan, 0.65, 2e9, 1e15, 0.45))


def test_decode_step_by_hand():
    # W = 1000 B, KV = 100 B per sequence, B = 4, bandwidth 100 B/s at 50 %: (1000 + 400) / 50 = 28 s;
    # compute: 4 · 10 FLOPs / (50 FLOP/s) = 0.8 s; the memory bound wins.
    args = (1000, 100, 4, 100, 0.5, 10, 100, 0.5)
    assert decode_step_time_s(*args) == 28
    assert decode_tokens_per_s_per_sequence(*args) == pytest.approx(1 / 28)
    assert decode_tokens_per_s(*args) == pytest.approx(4 / 28)
    assert decode_step_time_s(*args, gpus=2) == 14  # tensor parallel: each GPU reads half
    # compute-bound case: 4 · 1000 FLOPs / 50 = 80 s > 28 s
    assert decode_step_time_s(1000, 100, 4, 100, 0.5, 1000, 100, 0.5) == 80


def test_moe_weights_read_by_hand():
    # dense 100 B, experts 800 B, E = 8, k = 2: B = 1 reads 2/8 of the experts; B = 2: 1 − (6/8)² = 0.4375
    assert moe_weight_bytes_read(100, 800, 8, 2, 1) == 300
    assert moe_weight_bytes_read(100, 800, 8, 2, 2) == 100 + 800 * 0.4375
    assert moe_weight_bytes_read(100, 0, 0, 0, 64) == 100  # dense model


def test_prefill_by_hand():
    # p = 10, N = 1000, L = 2, H·Q = 8: FLOPs 10 · (2000 + 4·2·8·10) = 26,400; at 50 % of 100 FLOP/s: 528 s;
    # weights 1000 B at 50 % of 100 B/s: 20 s
    assert prefill_time_s(10, 1000, 2, 8, 100, 0.5, 1000, 100, 0.5) == 528
    assert prefill_time_s(1, 1000, 0, 0, 1e6, 0.5, 1000, 100, 0.5) == 20  # one token: reading the weights wins
    assert time_to_first_token_s(10, 1000, 2, 8, 100, 0.5, 1000, 100, 0.5) == 528


def test_compute_dtype_of_each_recipe():
    assert [compute_dtype(p) for p in ("fp32", "bf16", "bf16-mixed", "bf16-master", "fp16", "fp16-mixed", "fp8",
                                       "int8", "int4", "nf4")] == \
        ["fp32", "bf16", "bf16", "bf16", "fp16", "fp16", "fp8", "bf16", "bf16", "bf16"]
    with pytest.raises(Exception, match="bogus"):
        compute_dtype("bogus")


# ----------------------------------------------------------------------------------------------- published figures

@pytest.mark.parametrize("tps,mfu", [pytest.param(5762, 0.33, id="torchtitan-H100-2024-12-Llama3.1-8B-eager-33pct"),
                                     pytest.param(6667, 0.39, id="torchtitan-H100-2024-12-Llama3.1-8B-compile-39pct")])
def test_torchtitan_h100_llama3_8b_mfu(tps, mfu):
    """benchmarks/llama3_h100_202412_torchtitan.md Table 1 (8 H100, FSDP, local batch 2, seq 8192, selective AC):
    TPS/GPU and '33 % to 39 % MFU', computed against the SXM peak (their footnote 2) with torchtitan's N
    (embedding excluded) and 12·L·H·Q·T."""
    arch = load_preset("llama-3.1-8b")
    fpt = _model_fpt(arch, 8192)
    assert fpt == 6 * 7_504_924_672 + 12 * 32 * 4096 * 8192
    # the text's whole percents are truncated: 33.7 % and 39.0 % ('33 % to 39 %'; rounding would say 34 %)
    assert mfu <= mfu_from_throughput(tps, fpt, H100_BF16) < mfu + 0.01
    # and the other way: tokens/s at the published MFU, within that truncation (< 1 pp of 33-39 %)
    assert training_tokens_per_s_per_gpu(H100_BF16, fpt, mfu) == pytest.approx(tps, rel=0.01 / mfu)


@pytest.mark.parametrize("preset,tps,mfu", [
    pytest.param("llama-3.1-8b", 2904, 0.568, id="torchtitan-A100-performance.md-Llama3-8B-selective-layer-56.8pct"),
    pytest.param("llama-3.1-8b", 2973, 0.582, id="torchtitan-A100-performance.md-Llama3-8B-selective-op-58.2pct"),
    pytest.param("llama-3.1-70b", 331, 0.517, id="torchtitan-A100-performance.md-Llama3-70B-full-AC-51.7pct")])
def test_torchtitan_a100_llama3_mfu(preset, tps, mfu):
    """docs/performance.md (64 A100 80GB, FSDP2, local batch 1, seq 8192). That version of torchtitan counted every
    parameter, embedding included (6·Ψ + 12·L·H·Q·T): with that N its MFUs come back to the published decimal; the
    Dec 2024 H100 table (test above) excludes the embedding, as this module does. Llama 3 and 3.1 share shapes."""
    arch = load_preset(preset)
    fpt = _model_fpt(arch, 8192, n=arch.params)
    assert abs(mfu_from_throughput(tps, fpt, A100_BF16) - mfu) < 0.0005


@pytest.mark.parametrize("params,seq,layers,d,gpu_peak,tps,mfu", [
    pytest.param(6_658_859_008, 2048, 32, 4096, H100_BF16, 10643, 0.4644, id="llm-foundry-H100-bf16-MPT-7B-2048"),
    pytest.param(12_853_954_560, 2048, 40, 5120, H100_BF16, 4792, 0.3979, id="llm-foundry-H100-bf16-MPT-13B-2048-8gpu"),
    pytest.param(6_658_859_008, 2048, 32, 4096, A100_BF16, 4641, 0.6423, id="llm-foundry-A100-80GB-bf16-MPT-7B-2048"),
    pytest.param(2_651_837_440, 2048, 32, 2560, H100_FP8, 30586, 0.277, id="llm-foundry-H100-fp8-MPT-3B-2048"),
])
def test_mosaicml_llm_foundry_tokens_per_s(params, seq, layers, d, gpu_peak, tps, mfu):
    """scripts/train/benchmarking/README.md: MFU = (6·n_params + 12·n_layers·d_model·seq)·tokens/s / peak, with
    n_params the full count (MPT ties its embeddings). Rows without activation checkpointing; fp8 MFU is against
    the fp8 peak. Tokens/s/GPU is printed as an integer: 0.1 % tolerance."""
    fpt = model_flops_per_token(params, layers, d, seq)
    assert training_tokens_per_s_per_gpu(gpu_peak, fpt, mfu) == pytest.approx(tps, rel=1e-3)


@pytest.mark.parametrize("mfu,hfu", [pytest.param(42.57, 56.76, id="llm-foundry-H100-70B-AC"),
                                     pytest.param(53.33, 71.1, id="llm-foundry-A100-70B-AC"),
                                     pytest.param(28.59, 38.13, id="llm-foundry-H100-7B-65536-AC")])
def test_mosaicml_hfu_is_mfu_times_full_recompute_ratio(mfu, hfu):
    """With activation checkpointing llm-foundry's HFU = 4/3 MFU: our full-recomputation hardware/model ratio
    (no head term, as their formula has none). Their columns are rounded to 0.01 pp."""
    ratio = recompute_ratio(64_862_437_376, 80, 8192, 2048, "full")
    assert hfu_from_mfu(mfu, 1, ratio) == pytest.approx(hfu, abs=0.011)


def test_palm_appendix_b_540b_mfu_46_2pct():
    """PaLM (arXiv:2204.02311) App. B: 238.3K tokens/s on 6,144 TPU v4 chips is 46.2 % MFU with 6N + 12·L·H·Q·T,
    N = 540.35B (Table 1: L 118, H 48, Q 256; T 2048). PaLM's N counts its embedding matrix, which is shared with
    the output layer (excluding the 4.7B-parameter lookup would give 45.8 %)."""
    fpt = model_flops_per_token(540.35e9, 118, 48 * 256, 2048)
    assert round(float(mfu_from_throughput(238.3e3 / 6144, fpt, TPU_V4_BF16)), 3) == 0.462


def test_llama3_405b_training_compute_3_8e25():
    """Llama 3 (arXiv:2407.21783) §3.3: the 405B flagship was pre-trained with 3.8 × 10^25 FLOPs on 15.6T tokens.
    6·N·D with N = the preset's matmul parameters reproduces it; the attention term (12·126·16384·8192 per token)
    would add 8 %, so the paper's figure is 6·N·D alone."""
    arch = load_preset("llama-3.1-405b")
    total = float(model_flops_per_token(matmul_params(arch))) * 15.6e12
    assert total == pytest.approx(3.8e25, rel=0.01)
    with_attention = _model_fpt(arch, 8192) * 15.6e12
    assert with_attention / total == pytest.approx(1.08, abs=0.01)


@pytest.mark.parametrize("tflops,mfu", [pytest.param(430, 0.43, id="Llama3-Table4-8192-H100-430TF-43pct"),
                                        pytest.param(400, 0.41, id="Llama3-Table4-16384-H100-400TF-41pct"),
                                        pytest.param(380, 0.38, id="Llama3-Table4-16384-H100-CP16-380TF-38pct")])
def test_llama3_table4_mfu_is_against_the_dense_bf16_peak(tflops, mfu):
    """The MFU the Hopper default is built from divides by the dense bf16 peak (989.5 TFLOP/s): TFLOPs/GPU (to
    ~10) / peak matches the published MFU (whole percent) within their joint rounding."""
    assert tflops * 1e12 / H100_BF16 == pytest.approx(mfu, abs=0.01)


@pytest.mark.parametrize("params,tokens,gpus,x,days", [
    pytest.param(175e9, 300e9, 1024, 140e12, 34, id="Narayanan2021-eq4-GPT3-175B-300B-tokens-1024-A100-34-days"),
    pytest.param(1008e9, 450e9, 3072, 163e12, 84, id="Narayanan2021-eq4-1T-450B-tokens-3072-A100-84-days")])
def test_narayanan_2021_end_to_end_training_time(params, tokens, gpus, x, days):
    """§5.1 eq. 4: time ≈ 8·T·P / (n·X), X the achieved hardware FLOP/s per GPU with full recomputation (the
    attention term dropped, as eq. 4 does): tokens/s per GPU = X / hardware FLOPs per token."""
    tps = x / hardware_flops_per_token(params, recompute="full")
    assert round(float(time_to_train_s(tokens, gpus, tps)) / DAY) == days


def test_korthikanti_2022_full_recomputation_rule_530b():
    """Korthikanti et al. 2022 (abstract): the 530B GPT on 2,240 A100 reaches 54.2 % MFU with selective
    recomputation and sequence parallelism, 42.1 % with full recomputation. The rule our default applies
    (same hardware FLOP rate, MFU × model / hardware FLOPs) predicts 40.7 %: 3.4 % low, because full
    recomputation lets a run use larger micro-batches, which the rule does not credit."""
    l, h, s, V = 105, 20480, 2048, 51200
    n = 12 * l * h**2 + V * h
    ratio = float(recompute_ratio(n, l, h, s, "full", V * h))
    predicted = 0.542 / ratio
    assert predicted == pytest.approx(0.407, abs=0.001)
    assert predicted == pytest.approx(0.421, rel=0.04)
    assert training_mfu("ampere", "bf16", "full", ratio).value == pytest.approx(0.55 / ratio)


def test_gpt_fast_batch1_bytes_per_token_is_the_weights_without_the_embedding_table():
    """gpt-fast README (A100-80GB, batch 1, 5-token prompt): its 'memory bandwidth' is tokens/s × the bytes it
    counts per token. Llama-2-7B bf16: 1,397.31 GB/s / 104.9 tok/s = 13.32 GB; Llama-2-70B int8: 1,322.58 / 19.13
    = 69.14 GB. Our W (every weight but the input embedding table, in its stored bytes) is within 1 % of both
    (gpt-fast also counts its preallocated KV-cache buffers, a few hundred MB). This checks what a decode step
    reads; the bandwidth-efficiency default comes from the same table, so tokens/s is not re-checked here."""
    seven = load_preset("llama-2-7b")
    w7 = (seven.params - seven.vocab * seven.hidden) * 2
    assert w7 == pytest.approx(1397.31e9 / 104.9, rel=0.01)
    seventy = load_preset("llama-2-70b")
    norms = (2 * seventy.layers + 1) * seventy.hidden  # RMSNorm scales stay bf16; every linear is int8
    w70 = (seventy.params - seventy.vocab * seventy.hidden - norms) * 1 + norms * 2
    assert w70 == pytest.approx(1322.58e9 / 19.13, rel=0.01)


def _llama33_70b_fp8_tp2(context: float) -> tuple[float, float]:
    arch = load_preset("llama-3.1-70b")  # Llama 3.3 70B has Llama 3.1 70B's shapes
    block_linear = arch.layers * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672)
    head = arch.vocab * arch.hidden
    norms = (2 * arch.layers + 1) * arch.hidden
    w = block_linear * 1 + (head + norms) * 2  # fp8 linears; lm_head and norms in bf16
    kv = 2 * arch.layers * arch.kv_heads * arch.head_dim * 2 * context  # bf16 KV cache
    return w, kv


@pytest.mark.parametrize("prompt,output,itl_ms", [
    pytest.param(5000, 500, 18.58, id="NIM-1.8.0-TRT-LLM-Llama3.3-70B-fp8-TP2-2xH100-5000in-500out-ITL-18.58ms"),
    pytest.param(500, 2000, 18.91, id="NIM-1.8.0-TRT-LLM-Llama3.3-70B-fp8-TP2-2xH100-500in-2000out-ITL-18.91ms")])
def test_nim_batch1_decode_is_bandwidth_bound(prompt, output, itl_ms):
    """NVIDIA NIM benchmarks (concurrency 1). Bandwidth-bound: the roofline at 100 % bandwidth is below the
    measured inter-token latency, and the estimate at the default efficiency (65 %, from gpt-fast on A100, an
    independent source) is 11-14 % faster than measured. It errs fast because TP2's two all-reduces per layer
    (160 per token over NVLink) are not modelled, nor the fp8 KV cache NIM may use (which would make it faster)."""
    arch = load_preset("llama-3.1-70b")
    w, kv = _llama33_70b_fp8_tp2(prompt + output / 2)
    flops = forward_flops_per_token(matmul_params(arch), arch.layers, attention_width(arch), prompt + output / 2)
    eff = decode_bandwidth_efficiency("hopper", 8)
    assert eff.value == 0.65 and eff.basis == "extrapolated"
    ideal = decode_step_time_s(w, kv, 1, H100_BW, 1.0, flops, H100_FP8, 1.0, gpus=2)
    estimate = decode_step_time_s(w, kv, 1, H100_BW, eff.value, flops, H100_FP8, 0.45, gpus=2)
    assert ideal * 1e3 < itl_ms
    assert estimate * 1e3 == pytest.approx(itl_ms, rel=0.15)
    assert estimate * 1e3 < itl_ms


@pytest.mark.parametrize("prompt,ttft_ms,rel", [
    pytest.param(5000, 406.77, 0.06, id="NIM-1.8.0-Llama3.3-70B-fp8-TP2-5000-token-TTFT-406.77ms-sets-the-default"),
    pytest.param(500, 47.77, 0.20, id="NIM-1.8.0-Llama3.3-70B-fp8-TP2-500-token-TTFT-47.77ms")])
def test_nim_time_to_first_token(prompt, ttft_ms, rel):
    """The 5,000-token row is where the 45 % prefill default comes from (47 %, rounded to 5 %): reproduced within
    that rounding. The 500-token row is independent: the estimate is 17 % short, since a TTFT also holds the
    request's fixed costs (HTTP, tokenisation, scheduling: milliseconds, which a 40 ms prefill makes visible)."""
    arch = load_preset("llama-3.1-70b")
    w, _ = _llama33_70b_fp8_tp2(prompt)
    eff = inference_compute_efficiency("hopper", "fp8")
    assert eff.value == 0.45 and eff.basis == "published"
    ttft = time_to_first_token_s(prompt, matmul_params(arch), arch.layers, attention_width(arch), H100_FP8,
                                 eff.value, w, H100_BW, 0.65, gpus=2)
    assert ttft * 1e3 == pytest.approx(ttft_ms, rel=rel)


# ----------------------------------------------------------------------------------------------- defaults

def test_defaults_table_rows_and_bases():
    rows = defaults_table()
    assert {r["generation"] for r in rows} == set(GENERATIONS)
    by = {(r["generation"], r["precision"]): r for r in rows}
    assert by[("hopper", "bf16")]["training_mfu"] == 0.40 and by[("hopper", "bf16")]["training_mfu_basis"] == "published"
    assert by[("ampere", "bf16")]["training_mfu"] == 0.55
    assert by[("hopper", "fp8")]["training_mfu"] == 0.25
    assert by[("blackwell", "bf16")]["training_mfu_basis"] == "extrapolated"
    assert ("ampere", "fp8") not in by  # no fp8 tensor cores
    for r in rows:
        assert r["training_mfu_full_recompute"] == pytest.approx(r["training_mfu"] * 3 / 4)


def test_every_default_names_its_sources_and_how():
    for generation in GENERATIONS + (None, "some-new-gpu"):
        for precision in ("bf16", "fp16-mixed", "fp8", "fp32", "int4"):
            for a in (training_mfu(generation, precision), training_mfu(generation, precision, "full"),
                      decode_bandwidth_efficiency(generation, 4), decode_bandwidth_efficiency(generation),
                      inference_compute_efficiency(generation, precision)):
                assert a.sources and a.note and a.basis in ("published", "extrapolated")
                assert 0 < a.value < 1
    unknown = training_mfu("some-new-gpu")
    assert unknown.basis == "extrapolated" and unknown.value == training_mfu("hopper").value
    assert "some-new-gpu" in unknown.note
    assert training_mfu("hopper", "fp32").basis == "extrapolated"


def test_formulas_are_registered_with_sources():
    names = [n for n in FORMULAS if n.startswith("throughput.")]
    assert {"throughput.model_flops_per_token", "throughput.hardware_flops_per_token",
            "throughput.training_tokens_per_s_per_gpu", "throughput.decode_step_time_s",
            "throughput.training_mfu_default", "throughput.decode_bandwidth_efficiency_default",
            "throughput.inference_compute_efficiency_default", "throughput.matmul_params"} <= set(names)
    for name in names:
        assert FORMULAS[name].sources, name


# ----------------------------------------------------------------------------------------------- properties

sizes = st.integers(10**6, 10**12)
ctx = st.integers(0, 10**6)


@given(n=sizes, dn=st.integers(0, 10**11), layers=st.integers(0, 200), seq=st.integers(1, 10**6),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_tokens_per_s_never_increases_with_model_size_or_sequence(n, dn, layers, seq, recompute):
    def tps(n_, s_):
        hw = hardware_flops_per_token(n_, layers, 4096, s_, recompute)
        return training_tokens_per_s_per_gpu(H100_BF16, hw, 0.4)
    assert tps(n + dn, seq) <= tps(n, seq)
    assert tps(n, seq + 1) <= tps(n, seq)


@given(n=sizes, layers=st.integers(0, 200), seq=st.integers(1, 10**6), head=st.integers(0, 10**9))
def test_recomputation_never_removes_flops(n, layers, seq, head):
    head = min(head, n)
    none, sel, full = (hardware_flops_per_token(n, layers, 4096, seq, r, head) for r in ("none", "selective", "full"))
    assert none <= sel <= full
    assert none == model_flops_per_token(n, layers, 4096, seq)


@given(w=st.integers(10**6, 10**12), kv=st.integers(0, 10**10), dkv=st.integers(0, 10**9), b=st.integers(1, 1024),
       t=st.sampled_from([1, 2, 4, 8]), flops=st.integers(10**6, 10**13))
def test_decode_time_per_token_never_decreases_with_kv_length_or_batch(w, kv, dkv, b, t, flops):
    def step(kv_, b_):
        return decode_step_time_s(w, kv_, b_, H100_BW, 0.65, flops, H100_BF16, 0.45, gpus=t)
    assert step(kv + dkv, b) >= step(kv, b)
    assert step(kv, b + 1) >= step(kv, b)
    # the batch shares the weights: aggregate tokens/s never falls as the batch grows, per-sequence never rises
    agg = lambda b_: decode_tokens_per_s(w, kv, b_, H100_BW, 0.65, flops, H100_BF16, 0.45, gpus=t)  # noqa: E731
    per = lambda b_: decode_tokens_per_s_per_sequence(w, kv, b_, H100_BW, 0.65, flops, H100_BF16, 0.45, gpus=t)  # noqa: E731
    assert agg(b + 1) >= agg(b) * (1 - 1e-12)
    assert per(b + 1) <= per(b) * (1 + 1e-12)
    # and stays under both ceilings: every cache read once per token, every FLOP done
    if kv:
        assert agg(b) <= t * 0.65 * H100_BW / kv * (1 + 1e-12)
    assert agg(b) <= t * 0.45 * H100_BF16 / flops * (1 + 1e-12)


@given(dense=st.integers(0, 10**11), experts=st.integers(0, 10**12), e=st.integers(1, 256), data=st.data())
def test_moe_reads_between_k_experts_and_all(dense, experts, e, data):
    k = data.draw(st.integers(1, e))
    b = data.draw(st.integers(1, 4096))
    read = moe_weight_bytes_read(dense, experts, e, k, b)
    assert dense + experts * k / e * (1 - 1e-12) <= read <= dense + experts * (1 + 1e-12)
    assert moe_weight_bytes_read(dense, experts, e, k, b + 1) >= read


@settings(max_examples=50)
@given(p=st.integers(1, 200_000), dp=st.integers(1, 10_000))
def test_prefill_time_never_decreases_with_prompt_length(p, dp):
    arch = load_preset("llama-3.1-8b")
    args = (matmul_params(arch), arch.layers, attention_width(arch), H100_BF16, 0.45, 16e9, H100_BW, 0.65)
    assert prefill_time_s(p + dp, *args) >= prefill_time_s(p, *args)


@given(tokens=st.floats(1e9, 1e14), g=st.integers(1, 100_000), tps=st.floats(1.0, 1e6))
def test_doubling_gpus_halves_time_and_keeps_cost(tokens, g, tps):
    assert time_to_train_s(tokens, 2 * g, tps) == pytest.approx(time_to_train_s(tokens, g, tps) / 2)
    assert gpus_for_deadline(tokens, time_to_train_s(tokens, g, tps), tps) == g


def test_full_recomputation_default_is_below_the_plain_default_everywhere():
    for generation in GENERATIONS:
        assert training_mfu(generation, "bf16", "full").value < training_mfu(generation, "bf16").value
        assert training_mfu(generation, "bf16", "selective").value == training_mfu(generation, "bf16").value


# ------------------------------------------------------------------ derived models: N from their own parameter tensors

def _derived(pid: str) -> Architecture:
    from nnmem_sweep.derive import stored_only
    from nnmem_sweep.estimate import resolve_model_name

    with stored_only():  # the shipped card: no torch needed
        return resolve_model_name(pid)


@pytest.mark.parametrize("pid, low, high, source", [
    # "Number of Activated Parameters: 3.3B" (Qwen3-30B-A3B model card, huggingface.co/Qwen/Qwen3-30B-A3B)
    ("Qwen/Qwen3-30B-A3B", 3.3e9, 3.4e9, "Qwen3 model card"),
    # "671B total parameters with 37B activated for each token" (DeepSeek-V3 Technical Report, arXiv:2412.19437)
    ("deepseek-ai/DeepSeek-V3", 37e9, 38e9, "DeepSeek-V3 report"),
    # "17 billion active parameters, 16 experts, 109B total" (Meta, The Llama 4 herd, 2025-04-05)
    ("meta-llama/Llama-4-Scout-17B-16E", 17e9, 18e9, "Meta Llama 4 blog"),
])
def test_derived_moe_active_parameters_match_the_published(pid, low, high, source):
    assert low <= active_params(_derived(pid)) < high, source


def test_derived_dense_model_counts_like_the_hand_model():
    """Qwen3 8B (untied: 36 layers, V = 151,936, h = 4,096): N = Ψ − V·h, the head V·h; Gemma 3 12B (tied): N = Ψ,
    the head the shared table (262,208 × 3,840, the card's vocabulary rows)."""
    q = _derived("Qwen/Qwen3-8B")
    assert matmul_params(q) == q.params - 151_936 * 4_096 and head_params(q) == 151_936 * 4_096
    assert attention_width(q) == 32 * 128
    g = _derived("gemma-3-12b")
    assert matmul_params(g) == g.params and head_params(g) == g.vocab * 3_840


def test_derived_image_models_have_no_tokens():
    from nnmem_sweep.config import load_scenario
    from nnmem_sweep.derive import stored_only
    from nnmem_sweep.throughput.plan import has_tokens

    with stored_only():  # torchvision's ResNet-50, as configs/resnet50.yaml names it (its card is shipped)
        arch = load_scenario("configs/resnet50.yaml").model
    assert not has_tokens(arch)
    with pytest.raises(ValueError, match="no tokens"):
        matmul_params(arch)
