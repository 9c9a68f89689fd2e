"""The throughput estimate of a scenario's configurations (throughput/plan.py), the `throughput:` block
(throughput/options.py) and the cluster search's throughput columns and `rank_by` (cluster.py)."""
from __future__ import annotations

import math
import textwrap

import pandas as pd
import pytest

from nnmem_sweep import cluster as K
from nnmem_sweep import columns as C
from nnmem_sweep.catalog.gpus import get_gpu
from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.models import load_preset
from nnmem_sweep.runner import run_scenario
from nnmem_sweep.throughput.options import ThroughputOptions
from nnmem_sweep.throughput.plan import has_tokens, serving_figures, training_figures, weight_bytes_read

# Llama 3.2 3B (tied embeddings): N = 3,212,749,824 matmul parameters (the tied table is the head's matmul);
# at T = 2,048: 6·N + 12·28·3072·2048 = 19,276,498,944 + 2,113,929,216 = 21,390,428,160 FLOPs per token.
# A100 bf16 dense peak 312 TFLOP/s (catalog); Ampere's default MFU 55 %: 0.55 · 312e12 / 21,390,428,160 =
# 8,022.28 tokens/s per GPU; at $1.00 per GPU-hour 10^9 / 8,022.28 / 3,600 = $34.626 per 10^9 tokens.
# Full recomputation: hardware/model FLOPs 1.29649 (head excluded), so the default MFU is 0.55 / 1.29649 = 42.42 %.
FPT_3B_2048 = 21_390_428_160
CLUSTER = """\
model: {preset: llama-3.2-3b}
grid: {batch: 1, seq_len: 2048, precision: bf16-master, optimizer: adamw, checkpointing: [none, full]}
gpus:
  - {id: a100-40gb, price_usd_per_hour: 1.0}
cluster: {global_batch: 64, micro_batch: [1], max_gpus: 64, tensor_parallel: [1], pipeline_parallel: [1]%s}
"""


def cluster_table(rank: str = "", extra: str = "") -> pd.DataFrame:
    return run_scenario(parse_scenario_text(CLUSTER % rank + extra)).cluster


def test_cluster_options_carry_the_estimate_and_cost_per_token_prefers_less_recomputation():
    by_gpus = cluster_table()
    # the fewest GPUs (2) need full recomputation; from 4 GPUs none is needed
    assert by_gpus[[K.GPUS, C.CHECKPOINTING]].values.tolist()[:2] == [[2, "full"], [4, "none"]]
    none = by_gpus[by_gpus[C.CHECKPOINTING] == "none"].iloc[0]
    assert none[K.TOKENS_PER_S_PER_GPU] == pytest.approx(0.55 * 312e12 / FPT_3B_2048, rel=1e-12)
    assert none[K.COST_PER_BILLION] == pytest.approx(34.62579, abs=1e-5)
    assert none[K.TIME_PER_BILLION] == pytest.approx(1e9 / (4 * 0.55 * 312e12 / FPT_3B_2048), rel=1e-12)
    full = by_gpus.iloc[0]
    assert full[K.MFU] == pytest.approx(0.4242209, abs=1e-7)
    assert full[K.COST_PER_BILLION] == pytest.approx(34.62579 * 0.55 / 0.4242209, rel=1e-6)  # $44.89
    # rank_by gpus (the default): the fewest GPUs; cost_per_token: 4 GPUs, no recomputation, $34.63 per 10^9 tokens
    assert by_gpus[by_gpus[K.RECOMMENDED]][K.GPUS].tolist() == [2]
    by_cost = cluster_table(", rank_by: cost_per_token")
    assert by_cost[by_cost[K.RECOMMENDED]][[K.GPUS, C.CHECKPOINTING]].values.tolist() == [[4, "none"]]
    line = K.recommendation(by_cost, {}, lambda b: f"{b / 2**30:.1f} GiB", "cost_per_token")
    assert line.startswith("Lowest estimated cost per 10^9 tokens trained: 4 × a100-40gb ($35 per 10^9 tokens at "
                           "55% MFU) with TP 1, PP 1, DP 4, ZeRO 1")


def test_the_throughput_block_changes_no_memory_figure_and_a_stated_mfu_is_used_as_is():
    base = run_scenario(parse_scenario_text(CLUSTER % ""))
    stated = run_scenario(parse_scenario_text(CLUSTER % "" + "throughput: {mfu: {a100-40gb: 0.5}}\n"))
    pd.testing.assert_frame_equal(base.results, stated.results)
    pd.testing.assert_frame_equal(base.max_batch, stated.max_batch)
    memory = [c for c in K.OUTPUT_COLUMNS if c not in (K.MFU, K.TOKENS_PER_S_PER_GPU, K.TIME_PER_BILLION,
                                                        K.COST_PER_BILLION)]
    pd.testing.assert_frame_equal(base.cluster[memory], stated.cluster[memory])
    # not scaled down for full recomputation: the user's figure
    assert stated.cluster[K.MFU].tolist() == [0.5] * len(stated.cluster)


def test_a_gpu_without_a_catalogued_peak_gives_unknown_figures_not_an_error():
    mine = get_gpu("a100-40gb").__class__("mine", "Mine", 40 * 2**30, "given")
    f = training_figures(load_preset("llama-3.2-1b"), mine, "bf16", "none", 2048)
    assert math.isnan(f.tokens_per_s_per_gpu) and math.isnan(f.cost_per_billion_tokens_usd)
    assert f.mfu.basis == "extrapolated"  # no generation: Hopper's figure, said so
    s = serving_figures(load_preset("llama-3.2-1b"), mine, "bf16", 512, 128, 4)
    assert math.isnan(s.tokens_per_s) and math.isnan(s.ttft_s)


def test_weight_bytes_read_leave_out_the_input_embedding_unless_the_head_reads_it():
    # Llama 2 7B (untied): (6,738,415,616 − 32,000 · 4,096) · 2 B = 13,214,687,232 (gpt-fast: 1,397.31 GB/s /
    # 104.9 tok/s = 13.32 GB, with its KV buffers)
    assert weight_bytes_read(load_preset("llama-2-7b"), "bf16") == (6_738_415_616 - 32_000 * 4096) * 2
    # GPT-2 (tied): every weight but the 1,024 x 768 position table; the token table is the head's matmul
    assert weight_bytes_read(load_preset("gpt2"), "fp32") == (124_439_808 - 1024 * 768) * 4
    # int4: the block linears in 4 bits with group scales, the 16-bit embedding table still left out
    llama = load_preset("llama-2-7b")
    assert weight_bytes_read(llama, "int4") < weight_bytes_read(llama, "bf16") / 3


def test_serving_figures_at_batch_1_reproduce_gpt_fast_llama2_7b():
    """gpt-fast README: Llama-2-7B bf16, batch 1, A100-80GB: 104.9 tokens/s at 1,397.31 GB/s achieved. At that
    efficiency of the catalog's 2,000 GB/s, the estimate is within 1 % (a 5-token prompt, 200 generated: the KV
    cache read adds 0.4 %)."""
    a100 = get_gpu("a100-80gb")
    eff = 1397.31e9 / a100.memory_bandwidth_bytes_per_s
    f = serving_figures(load_preset("llama-2-7b"), a100, "bf16", 5, 200, 1,
                        options=ThroughputOptions(decode_bandwidth_efficiency=eff))
    assert f.tokens_per_s_per_sequence == pytest.approx(104.9, rel=0.01)
    assert f.bandwidth_efficiency.basis == "stated"


def test_has_tokens():
    assert has_tokens(load_preset("gpt2"))
    assert not has_tokens(None)
    from nnmem_sweep.models.arch import Architecture
    assert not has_tokens(Architecture(name="cnn", kind="layers"))
    assert not has_tokens(Architecture(name="p", kind="params", params=10))  # per-sample, no tokens
    assert has_tokens(Architecture(name="p", kind="params", params=10, activation_elements_per_token=4))


def test_the_schema_blocks_are_the_modules_own():
    from nnmem_sweep import config_schema
    from nnmem_sweep.throughput import options
    props = config_schema.SCHEMA["properties"]
    assert props["throughput"] == options.SCHEMA and props["cluster"] == K.SCHEMA


@pytest.mark.parametrize("block,where,message", [
    ("throughput: {mfu: {h100: 0.4}}", "throughput.mfu.h100", "'h100' is not one of this scenario's GPUs"),
    ("throughput: {prefill_compute_efficiency: 0.5}", "throughput.prefill_compute_efficiency",
     "applies to infer mode only"),
    ("throughput: {mfu: 0}", "throughput.mfu", "must be more than 0"),
])
def test_bad_throughput_blocks_are_one_located_error(block, where, message):
    from nnmem_sweep.errors import ScenarioError
    text = textwrap.dedent("""\
        model: {preset: llama-3.2-1b}
        grid: {batch: 1, seq_len: 512, precision: bf16, optimizer: adamw}
        gpus: [h100-sxm]
        """) + block + "\n"
    with pytest.raises(ScenarioError) as e:
        parse_scenario_text(text, "s.yaml")
    (p,) = e.value.problems
    assert (p.line, p.key_path) == (4, where) and message in p.message
