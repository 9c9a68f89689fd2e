"""Serving plans: KV bytes per token (published figures), paging, KV dtypes, tensor parallel, the KV budget and the
concurrency / context tables (nnmem_sweep/serving.py, components/kv.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnmem_sweep import columns as C
from nnmem_sweep import serving
from nnmem_sweep.catalog.precisions import PRECISIONS, fp8_weight_bytes
from nnmem_sweep.components.kv import kv_bytes_per_token_per_gpu, paged_tokens
from nnmem_sweep.components.weights import int8_bytes, weights_bytes
from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.errors import ScenarioError
from nnmem_sweep.models.arch import Architecture
from nnmem_sweep.models.presets import load_preset
from nnmem_sweep.runner import run_scenario, write_outputs

LLAMA_8B = load_preset("llama-3.1-8b")
MISTRAL_7B = load_preset("mistral-7b")
# OPT-13B: 40 layers, hidden 5120, 40 heads of 128 (no GQA), fp16
OPT_13B = Architecture(name="OPT-13B", kind="transformer", hidden=5120, layers=40, heads=40, kv_heads=40,
                       head_dim=128)


def _scenario(serving_yaml: str = "", *, seq_len="[4000]", decode="100", batch="[1, 8, 64]",
              precision="[bf16]", gpus="[h100-sxm]", mode="infer", model="llama-3.1-8b") -> object:
    return parse_scenario_text(f"""
model: {{preset: {model}}}
mode: {mode}
grid:
  batch: {batch}
  seq_len: {seq_len}
  precision: {precision}
  decode_tokens: {decode}
gpus: {gpus}
{serving_yaml}
""")


# ---------------------------------------------------------------- KV bytes per token

@pytest.mark.parametrize("arch, elem, expected", [
    # 2 · 40 layers · 40 heads · 128 · 2 B = 819,200 B = 800 KiB
    pytest.param(OPT_13B, 2, 819_200, id="vLLM-paper-s3-OPT-13B-fp16-800KiB-per-token"),
    # 2 · 32 layers · 8 kv heads · 128 · 2 B = 131,072 B = 128 KiB
    pytest.param(LLAMA_8B, 2, 131_072, id="Llama-3.1-8B-bf16-GQA-128KiB-per-token"),
    # fp8 (vLLM kv_cache_dtype fp8_e4m3): 1 byte per element, half of bf16
    pytest.param(LLAMA_8B, 1, 65_536, id="Llama-3.1-8B-fp8-KV-halves-it"),
])
def test_kv_bytes_per_token(arch, elem, expected):
    assert int(kv_bytes_per_token_per_gpu(arch, elem)) == expected


@pytest.mark.parametrize("preset, tokens, gib_2dp", [
    # Hugging Face blog "Llama 3.1 - 405B, 70B & 8B", Inference memory requirements, KV cache in fp16, "GB" = GiB
    # with 16k = 16,000 and 128k = 128,000 tokens: 8B 16,000 · 131,072 B = 1.95 GiB; 128,000 -> 15.62 GiB
    pytest.param("llama-3.1-8b", 16_000, "1.95", id="HF-blog-llama31-memory-8B-16k-1.95GB"),
    pytest.param("llama-3.1-8b", 128_000, "15.62", id="HF-blog-llama31-memory-8B-128k-15.62GB"),
    # 70B: 2 · 80 · 8 · 128 · 2 = 327,680 B per token
    pytest.param("llama-3.1-70b", 16_000, "4.88", id="HF-blog-llama31-memory-70B-16k-4.88GB"),
    pytest.param("llama-3.1-70b", 128_000, "39.06", id="HF-blog-llama31-memory-70B-128k-39.06GB"),
])
def test_kv_cache_of_one_sequence_matches_the_published_llama_31_table(preset, tokens, gib_2dp):
    from nnmem_sweep.units import GiB

    per_seq = int(paged_tokens(load_preset(preset), np.array([tokens]), None)[0]
                  * kv_bytes_per_token_per_gpu(load_preset(preset), 2))
    assert f"{per_seq / GiB:.2f}" == gib_2dp


def test_kv_dtypes_are_independent_of_the_weights():
    assert serving.kv_element("auto", "bf16") == (2, 0)
    assert serving.kv_element("auto", "int4") == (2, 0)  # int4 weights, 16-bit activations and cache
    assert serving.kv_element("fp8", "bf16") == (1, 0)
    assert serving.kv_element("int8", "fp16") == (1, 4)
    # int8 (LMDeploy): 2 · 32 · 8 · (128 · 1 + 4 B of fp16 scale and zero point) = 67,584 B
    assert int(kv_bytes_per_token_per_gpu(LLAMA_8B, 1, 1, 4)) == 67_584


def test_tensor_parallel_splits_kv_heads_and_replicates_them_past_kv_heads():
    t = np.array([1, 2, 8, 16])
    # 2 · 32 · (8 / t) · 128 · 2: t = 16 > 8 kv heads keeps one head per rank (vLLM replicates)
    assert kv_bytes_per_token_per_gpu(LLAMA_8B, 2, t).tolist() == [131_072, 65_536, 16_384, 16_384]


def test_block_rounding_takes_whole_blocks():
    tokens = np.array([1, 16, 17, 4100])
    # 17 tokens with blocks of 16 -> 2 blocks = 32 tokens; 4100 -> 257 blocks = 4112
    assert paged_tokens(LLAMA_8B, tokens, 16).tolist() == [16, 16, 32, 4112]
    assert paged_tokens(LLAMA_8B, tokens, None).tolist() == [1, 16, 17, 4100]


def test_sliding_window_caps_the_cache_mistral_7b_v01_4096():
    assert MISTRAL_7B.sliding_window == 4096
    assert paged_tokens(MISTRAL_7B, np.array([100, 4096, 8192, 100_000]), 16).tolist() == [112, 4096, 4096, 4096]
    sc = _scenario("serving: {kv_block_size: 16}", model="mistral-7b", seq_len="[1000, 32768]", decode="0")
    plan = serving.max_concurrency(sc)
    # 32768 tokens hold only the window: 4096 · 2 · 32 · 8 · 128 · 2 = 536,870,912 B
    assert plan.loc[plan[C.CONTEXT] == 32768, C.KV_BYTES_PER_SEQUENCE].tolist() == [536_870_912]
    ctx = serving.max_context(sc)
    # once one window per sequence fits, the context is bounded by the model (max_position), not by memory
    assert ctx.loc[ctx[C.CONCURRENCY] == 1, C.MAX_CONTEXT].tolist() == [MISTRAL_7B.max_position]


# ---------------------------------------------------------------- weights: fp8 and tensor parallel

def test_fp8_weights_are_1_byte_plus_an_fp32_scale_per_output_channel():
    assert fp8_weight_bytes(4096, 14336) == int8_bytes(4096, 14336) == 4096 * 14336 + 4096 * 4
    # Llama 3.1 8B: 6,979,321,856 block-linear weights at 1 B + 32 layers · 43,008 output rows · 4 B of scales
    # (q 4096, k 1024, v 1024, o 4096, gate 14336, up 14336, down 4096) + the rest in bf16: embeddings and LM head
    # 2 · 525,336,576 and norms 65 · 4096 = 266,240 params, 2 B each
    assert weights_bytes(LLAMA_8B, PRECISIONS["fp8"]) == 6_979_321_856 + 1_376_256 * 4 + (1_050_673_152 + 266_240) * 2


def test_tensor_parallel_weights_keep_norms_whole():
    # bf16 16,060,522,496 B; norms (2 · 32 + 1) · 4096 · 2 B = 532,480 B stay on every rank, the rest is halved
    assert serving.weights_per_gpu_bytes(LLAMA_8B, "bf16", np.array([1, 2])).tolist() == [
        16_060_522_496, (16_060_522_496 - 532_480) // 2 + 532_480]


# ---------------------------------------------------------------- the KV budget and concurrency

def test_max_concurrency_hand_computed_llama_8b_bf16_h100():
    sc = _scenario("serving: {kv_block_size: 16, gpu_memory_utilization: 0.9}")
    plan = serving.max_concurrency(sc)
    assert list(plan.columns) == list(C.MAX_CONCURRENCY_COLUMNS)
    row = plan.iloc[0]
    # engine  = ⌊0.9 · 84,918,646,663⌋ (H100 SXM, PyTorch-visible 79.087 GiB) = 76,426,781,996
    # weights = 8,030,261,248 params · 2 B                                   = 16,060,522,496
    # profiled activations: prefill of 8,192 tokens, SwiGLU MLP moment, 119,312 B per token
    #   (3 · 2 · 14336 + 4 · 2 · 4096 + 512 RoPE cos/sin + 2 · 8 ids)        =    977,403,904
    # outside the allocator: CUDA context with lazy loading, upper end of the Hopper measurements 814,546,944 B
    # (catalog/runtime.json: this project's H100 kit run); inside it: one cuBLAS workspace of 32 MiB (compute
    # capability 9.0, one stream to infer)                                   = 814,546,944 + 33,554,432
    # budget = 76,426,781,996 − 16,060,522,496 − 977,403,904 − 848,101,376 = 58,540,754,220
    assert row[C.KV_BUDGET] == 58_540_754_220
    # context 4000 + 100 = 4100 tokens -> 257 blocks = 4112 tokens · 131,072 B = 538,968,064 B
    assert (row[C.CONTEXT], row[C.KV_BYTES_PER_SEQUENCE]) == (4100, 538_968_064)
    assert row[C.MAX_CONCURRENT] == 58_540_754_220 // 538_968_064 == 108
    # whole blocks of 16 · 131,072 B: ⌊58,540,754,220 / 2,097,152⌋ = 27,914 blocks = 446,624 tokens
    assert row[C.KV_TOKENS_FIT] == 446_624


def test_tensor_parallel_and_fp8_kv_raise_concurrency():
    sc = _scenario("serving: {kv_block_size: 16, kv_dtype: [auto, fp8], tensor_parallel: [1, 2]}")
    plan = serving.max_concurrency(sc).set_index([C.TENSOR_PARALLEL, C.KV_DTYPE])
    base = plan.loc[(1, "auto")]
    assert plan.loc[(1, "fp8"), C.KV_BYTES_PER_SEQUENCE] * 2 == base[C.KV_BYTES_PER_SEQUENCE]
    assert plan.loc[(1, "fp8"), C.MAX_CONCURRENT] == 58_540_754_220 // (538_968_064 // 2) == 217
    # t = 2: half the weights (but the norms) leave 8,029,995,008 B more budget, the tensor-parallel group's NCCL
    # communicator 1,932,735,283 B less (vLLM #10511: non_torch 1.79 GiB at tp 1, 3.58 GiB at tp 2, upper end),
    # and each sequence is half as big
    budget2 = 58_540_754_220 + 8_029_995_008 - 1_932_735_283
    assert plan.loc[(2, "auto"), C.KV_BUDGET] == budget2
    assert plan.loc[(2, "auto"), C.MAX_CONCURRENT] == budget2 // (538_968_064 // 2)


def test_max_context_inverts_max_concurrency():
    sc = _scenario("serving: {kv_block_size: 16}")
    ctx = serving.max_context(sc)
    assert list(ctx.columns) == list(C.MAX_CONTEXT_COLUMNS)
    # one sequence: ⌊58,540,754,220 / 2,097,152⌋ blocks · 16 = 446,624 tokens, capped at max_position 131,072
    # 64 sequences: ⌊914,699,284 / 2,097,152⌋ = 436 blocks = 6,976 tokens
    assert ctx[C.MAX_CONTEXT].tolist() == [131_072, 55_824, 6_976]
    assert ctx[C.MAX_CONTEXT].tolist()[1] == 58_540_754_220 // 8 // 2_097_152 * 16


def test_a_model_that_does_not_fit_gets_no_budget():
    sc = _scenario(gpus="[l4]", model="llama-3.1-70b")
    plan = serving.max_concurrency(sc)
    assert (plan[C.KV_BUDGET] == 0).all() and (plan[C.MAX_CONCURRENT] == 0).all()
    assert (serving.max_context(sc)[C.MAX_CONTEXT] == 0).all()


@settings(max_examples=25, deadline=None)
@given(contexts=st.lists(st.integers(1, 300_000), min_size=2, max_size=6, unique=True),
       util=st.sampled_from([0.5, 0.8, 0.9, 0.95]), block=st.sampled_from([None, 1, 16, 128]),
       model=st.sampled_from(["llama-3.1-8b", "mistral-7b", "qwen2.5-0.5b"]))
def test_concurrency_never_increases_with_context(contexts, util, block, model):
    block_yaml = f", kv_block_size: {block}" if block else ""
    sc = _scenario(f"serving: {{gpu_memory_utilization: {util}{block_yaml}, kv_dtype: [auto, int8]}}",
                   seq_len=str(contexts), decode="0", model=model, gpus="[a100-80gb, l4]")
    plan = serving.max_concurrency(sc).sort_values(C.CONTEXT, kind="stable")
    for _, g in plan.groupby([C.GPU, C.KV_DTYPE], observed=True):
        assert (np.diff(g[C.MAX_CONCURRENT].to_numpy()) <= 0).all()
        n, per, budget = (g[c].to_numpy() for c in (C.MAX_CONCURRENT, C.KV_BYTES_PER_SEQUENCE, C.KV_BUDGET))
        assert ((n * per <= budget) & ((n + 1) * per > budget)).all()


# ---------------------------------------------------------------- scenario options and outputs

def test_serving_options_are_for_infer_mode_and_check_tensor_parallel():
    with pytest.raises(ScenarioError, match="infer mode only"):
        _scenario("serving: {kv_block_size: 16}", mode="train", precision="[bf16]\n  optimizer: adamw",
                  decode="0")
    with pytest.raises(ScenarioError, match=r"serving.tensor_parallel\[1\]: tensor_parallel 3 must divide the 32"):
        _scenario("serving: {tensor_parallel: [2, 3]}")
    with pytest.raises(ScenarioError, match="serving.kv_dtype"):
        _scenario("serving: {kv_dtype: fp4}")
    with pytest.raises(ScenarioError, match="serving.gpu_memory_utilization"):
        _scenario("serving: {gpu_memory_utilization: 1.5}")
    assert serving.options(_scenario())["kv_dtype"] == ("auto",)
    with pytest.raises(ScenarioError, match="serving plan needs a transformer"):
        parse_scenario_text("model: {name: net, params: 1000, activation_elements_per_sample: 10}\nmode: infer\n"
                            "grid: {batch: 1, precision: fp32}\ngpus: [l4]\nserving: {kv_block_size: 16}\n")


def test_run_writes_max_concurrency_for_infer_only(tmp_path):
    res = run_scenario(_scenario("serving: {kv_block_size: 16}"))
    written = write_outputs(res, tmp_path)
    assert [p.name for p in written] == ["results.csv", "max_batch.csv", "max_concurrency.csv", "max_context.csv",
                                         "run.json"]
    back = pd.read_csv(tmp_path / "max_concurrency.csv")
    assert list(back.columns) == list(C.MAX_CONCURRENCY_COLUMNS)
    assert back[C.MAX_CONCURRENT].tolist() == [108]
    train = run_scenario(_scenario(mode="train", precision="[bf16]\n  optimizer: adamw", decode="0"))
    assert train.serving is None
    assert [p.name for p in write_outputs(train, tmp_path / "t")] == ["results.csv", "max_batch.csv", "run.json"]


# ---------------------------------------------------------------- the report's "Serving capacity" section

def test_report_has_a_serving_section_for_infer_runs_only(tmp_path, monkeypatch):
    import xml.etree.ElementTree as ET

    from nnmem_sweep.report import render_report

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    res = run_scenario(_scenario("serving: {kv_block_size: 16}", gpus="[l4, h100-sxm]"))
    render_report(res, tmp_path / "i", "<text>", pdf=False, formulas=[], validation=None)
    html = (tmp_path / "i" / "report.html").read_text(encoding="utf-8")
    section = html[html.index('<section id="serving">'):]
    section = section[:section.index("</section>")]
    assert "Concurrent sequences of 4,100 tokens" in section
    # the hand-computed H100 cell (test_max_concurrency_hand_computed_llama_8b_bf16_h100) and its KV tokens
    assert ">108</td>" in section and ">446,624</td>" in section
    svg = section[section.index("<svg"):section.index("</svg>") + 6]
    assert ET.fromstring(svg).get("aria-label") == "Concurrent sequences against context"
    train = run_scenario(_scenario(mode="train", precision="[bf16]\n  optimizer: adamw", decode="0"))
    render_report(train, tmp_path / "t", "<text>", pdf=False, formulas=[], validation=None)
    assert 'id="serving"' not in (tmp_path / "t" / "report.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("ys, ticks", [
    ([0, 0], ["0", "1"]),  # nothing fits: an empty plot, whole-sequence ticks, no line
    ([3, 1], ["0", "1", "2", "3"]),
    ([1000, 1], ["1", "4", "16", "64", "256", "1,024"]),  # a factor of 8 or more: log2 ticks, stride 2 past 8 ticks
])
def test_concurrency_chart_ticks_are_whole_sequences(ys, ticks):
    import re

    from nnmem_sweep.report.charts import concurrency_chart

    svg = concurrency_chart("t", [100, 200], [("GPU", ys)])
    assert re.findall(r'text-anchor="end">([^<]*)', svg) == ticks
    assert ("<polyline" in svg) == any(ys)
