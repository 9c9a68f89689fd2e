"""The decision page (issue 14): the uncertainty that flags a verdict, the page of the three shipped scenarios it was
built for (checked against their own CSVs), and published throughput figures reproduced through the page's numbers."""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from nnmem_sweep import cluster as K
from nnmem_sweep import columns as C
from nnmem_sweep.catalog.gpus import get_gpu
from nnmem_sweep.config import load_scenario, parse_scenario_text
from nnmem_sweep.report import decision, render_report
from nnmem_sweep.report.uncertainty import FRAGMENTATION, flips, uncertainty_bytes
from nnmem_sweep.runner import run_scenario
from nnmem_sweep.scenario import GPUSpec, Overheads

from .conftest import make_scenario, toy_run

ROOT = Path(__file__).resolve().parents[2]
PEAK = 22_553_600_000  # the toy's answer: 2·4e9 + 8e9 + 8 · 4096 · 200,000


# ------------------------------------------------------------------------------------------------ uncertainty

def test_uncertainty_by_hand():
    """Lazy loading: the CUDA context measured 266,076,160 (pytorch#86509, 287,047,680 less its 20 MiB of allocator)
    to 641,728,512 B (unsloth#9362), 512 MiB assumed (the toy scenario's override); the cuBLAS workspaces are in the
    row's allocator_extra_bytes, taken as known; fragmentation 0.5–32.5 % of the peak (the allocator replays of
    replays.py), none assumed (reserve 0)."""
    sc = make_scenario()
    row = {C.GPU: "a100-40gb", C.PEAK_ALLOCATED: PEAK}
    assert FRAGMENTATION == (0.005, 0.325)
    below, above = uncertainty_bytes(row, sc)
    assert below == 536_870_912 - 266_076_160
    assert above == (641_728_512 - 536_870_912) + 7_329_920_000
    # with a runtime model's columns (issue 13) those are what is assumed: 600 MiB outside, 2 % reserved
    row |= {"non_torch_bytes": 629_145_600, "reserved_bytes": PEAK + 451_072_000}
    assert uncertainty_bytes(row, sc) == ((629_145_600 - 266_076_160) + (451_072_000 - 112_768_000),
                                          (641_728_512 - 629_145_600) + (7_329_920_000 - 451_072_000))


def test_uncertainty_counts_nccl_for_every_parallel_group_and_hoppers_cublas():
    """TP 2 x DP 4 on an H100: two NCCL communicators of up to 1,932,735,283 B each (vllm#10511: non-torch memory
    from TP 1 to TP 2), which the toy's override (512 MiB for all memory outside the allocator) leaves out; Hopper's
    context up to 814,546,944 B (this project's H100 kit run, catalog/runtime.json)."""
    sc = make_scenario(gpus=(get_gpu("h100-sxm"),))
    row = {C.GPU: "h100-sxm", C.PEAK_ALLOCATED: PEAK, C.TENSOR_PARALLEL: 2, C.DATA_PARALLEL: 4,
           C.PIPELINE_PARALLEL: 1}
    _, above = uncertainty_bytes(row, sc)
    assert above == (814_546_944 + 2 * 1_932_735_283 - 536_870_912) + 7_329_920_000
    # modelled instead of overridden, the communicators are counted: only the context's range is left above
    modelled = make_scenario(gpus=(get_gpu("h100-sxm"),), overheads=Overheads(allocator_reserve_fraction=0.0,
                                                                             gpus=(get_gpu("h100-sxm"),)))
    _, above = uncertainty_bytes(row, modelled)
    assert above == 7_329_920_000


@pytest.mark.parametrize("margin,below,above,flip", [
    (10, 5, 20, True), (30, 5, 20, False), (20, 5, 20, False),  # fits: within the room the GPU may add
    (-4, 5, 20, True), (-5, 5, 20, True), (-6, 5, 20, False), (0, 0, 1, True)])  # short: within what it may save
def test_which_verdicts_the_uncertainty_could_flip(margin, below, above, flip):
    assert flips(margin, below, above) is flip


def test_a_margin_within_the_uncertainty_is_flagged_with_the_command_and_the_safe_choice():
    # tight: usable int(25,445,000,000 · 0.95) = 24,172,750,000, the recipe asked needs 23,098,990,592: margin
    # 1,073,759,408 B (1.0 GiB) < the 6.9 GiB above: the answer (least memory), flagged; the H100 covers it
    tight = GPUSpec("tight", "Tight 24GB", 25_445_000_000, "given")
    sc = make_scenario(gpus=(tight, get_gpu("h100-sxm")))
    run = toy_run(sc)
    page = decision.decision(sc, run.max_batch, None, None, "configs/toy.yaml")
    assert page["answer"] == "Tight 24GB with bf16-mixed adamw."
    assert page["uncertainty"].endswith("The margin is within it: verify by measuring. The best choice whose margin "
                                        "covers it: H100 SXM5 80GB (H100 80GB HBM3) with bf16-mixed adamw (margin "
                                        "53.6 GiB against +7.1 GiB).")  # Hopper's context: up to 777 MiB
    (v,) = page["verify"]
    assert v["gpu"] == "Tight 24GB" and v["why"].startswith("margin 1.0 GiB, within")
    assert v["command"] == ("nnmem-sweep measure configs/toy.yaml --device cuda --point batch=8 --point seq_len=4096 "
                            "--point precision=bf16-mixed --point optimizer=adamw --point checkpointing=none (on the "
                            "GPU itself)")
    assert page["table"]["rows"][0]["class"] == "answer flag"
    assert page["table"]["rows"][0]["cells"][1] == "fits; verify by measuring"


# ------------------------------------------------------------------------------------------------ the shipped pages

def _render(name: str, tmp: Path) -> tuple[object, str, str]:
    cfg = ROOT / "configs" / f"{name}.yaml"
    result = run_scenario(load_scenario(cfg))
    render_report(result, tmp, str(cfg), pdf=False, validation=None)
    html = (tmp / "report.html").read_text(encoding="utf-8")
    page = re.search(r'<section id="decision">(.*?)</section>', html, re.S).group(1)
    return result, html, re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)).strip()


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    return {name: _render(name, tmp_path_factory.mktemp(name)) for name in
            ("llama", "llama-70b-cluster", "llama-serving")}


def _gib(n) -> str:
    return f"{n / 2**30:.1f}"


def test_every_report_opens_with_the_decision(shipped):
    for result, html, text in shipped.values():
        body = html[html.index("<body>"):]
        assert re.match(r"<body>\s*<h1>[^<]*</h1>\s*<section id=\"decision\">", body)
        assert text.startswith("Question. Which GPU")
        assert " Answer. " in text[:600]  # the answer within the page's first lines
    css = shipped["llama"][1]
    assert "#decision { break-after: page;" in css  # one page: the details start on the next


def test_llama_page_answers_its_target(shipped):
    result, _, text = shipped["llama"]
    assert text.startswith("Question. Which GPU trains Llama 3.1 8B at batch 8 × 8,192 tokens (65,536 tokens per "
                           "step) with bf16-mixed adamw, on one GPU? Answer. ")
    m = re.search(r"Answer\. (.+?) with (\S+) (\S+?)(?:, (full) checkpointing)? \(not the recipe asked", text)
    gpu_name, precision, optimizer, ck = m.group(1), m.group(2), m.group(3), m.group(4) or "none"
    gpu = next(g for g in result.scenario.gpus if g.name == gpu_name)
    r = result.results
    at = r[(r[C.BATCH] == 8) & (r[C.SEQ_LEN] == 8192) & (r[C.GPU] == gpu.id) & (r[C.PRECISION] == precision)
           & (r[C.OPTIMIZER] == optimizer) & (r[C.CHECKPOINTING] == ck)].iloc[0]
    margin = at[C.USABLE] - at[C.TOTAL]
    said = re.search(rf"Needs {re.escape(_gib(at[C.TOTAL]))} of {re.escape(_gib(at[C.USABLE]))} GiB usable: margin "
                     rf"{re.escape(_gib(margin))} GiB \(([\d.]+)% of usable\)", text)
    # the percentage against results.csv's bytes, to the one decimal the page prints
    assert at[C.FITS] and said and abs(float(said.group(1)) - 100 * margin / at[C.USABLE]) <= 0.05 + 1e-9
    # the rule, against results.csv: the recipe asked fits no GPU; no GPU with less memory fits with one change
    target = r[(r[C.BATCH] == 8) & (r[C.SEQ_LEN] == 8192)]
    asked = (target[C.PRECISION] == "bf16-mixed") & (target[C.OPTIMIZER] == "adamw") & (target[C.CHECKPOINTING] == "none")
    assert not target[asked][C.FITS].any()
    changes = ((target[C.PRECISION] != "bf16-mixed").astype(int) + (target[C.OPTIMIZER] != "adamw").astype(int)
               + (target[C.CHECKPOINTING] != "none").astype(int))
    fewest = changes[target[C.FITS]].min()
    # three: with the replayed reserves (0.5-32.5 % per recipe) no two-change recipe fits any GPU
    assert changes[target[C.FITS] & (target[C.GPU] == gpu.id)].min() == fewest == 3
    smaller = [g.id for g in result.scenario.gpus if g.memory_bytes < gpu.memory_bytes]
    assert not target[target[C.FITS] & (changes == fewest) & target[C.GPU].isin(smaller)].size
    # throughput beside its assumption; what flips it: the answer's recipe was replayed through the allocator model
    # as a fresh and as a resumed run (2.5-3 % of the peak, 3 % assumed): its 1.4 GiB margin covers that band, and
    # the +10 % fragmentation line says how thin it is
    assert re.search(r"Estimated speed \(an estimate, not a measurement\): [\d,]+ tokens/s per GPU at \d+% training "
                     r"MFU \(published: llama3-2024", text)
    assert "Sensitivity: no longer fits with fragmentation +10% of the peak" in text and "at seq 16,384" in text
    assert re.search(r"fragmentation [\d.]+%–[\d.]+% of the peak \(replayed fresh and resumed; 3% assumed; the "
                     r"allocator model checked against real GPUs: docs/accuracy\.md\)\)\. The margin is larger: "
                     r"the verdict stands", text)


def test_cluster_page_answers_its_global_batch(shipped):
    result, _, text = shipped["llama-70b-cluster"]
    assert text.startswith("Question. Which GPUs, and how many, train Llama 3.1 70B at 1,024 sequences × 4,096 "
                           "tokens per optimizer step (4,194,304 tokens) with bf16-master adamw? Answer. ")
    options = result.cluster
    m = re.search(r"Answer\. ([\d,]+) × (.+?) \((\d+) nodes\) with TP (\d+) \+ SP · PP (\d+) · DP (\d+) · ZeRO (\d)",
                  text)
    n, name = int(m.group(1).replace(",", "")), m.group(2)
    gpu = next(g for g in result.scenario.gpus if g.name == name)
    # without prices: each type's fewest GPUs, then the fewest overall, ties to the faster (estimated)
    fewest = options.groupby(C.GPU)[K.GPUS].min()
    assert n == fewest.min() == fewest[gpu.id]
    row = options[(options[C.GPU] == gpu.id) & (options[K.GPUS] == n)].iloc[0]
    assert [int(m.group(k)) for k in (4, 5, 6, 7)] == [row[C.TENSOR_PARALLEL], row[C.PIPELINE_PARALLEL],
                                                       row[C.DATA_PARALLEL], row[C.ZERO_STAGE]]
    tied = options[options[K.GPUS] == n]
    assert row[K.TIME_PER_BILLION] == tied[K.TIME_PER_BILLION].min()
    assert f"Needs {_gib(row[C.TOTAL])} of {_gib(row[C.USABLE])} GiB usable per GPU" in text
    # NCCL for the TP and DP groups is not in the estimate: the fewest-GPU layouts are within the uncertainty, and
    # the page names the best option that is not
    assert "The margin is within it: verify by measuring. The best choice whose margin covers it: " in text
    assert f"{row[K.TOKENS_PER_S_PER_GPU]:,.0f} tokens/s per GPU at {row[K.MFU]:.0%} training MFU (published:" in text


def test_serving_page_answers_its_concurrency_and_context(shipped):
    result, _, text = shipped["llama-serving"]
    assert text.startswith("Question. Which GPU serves Llama 3.1 8B to 16 concurrent sequences of 8,448 tokens "
                           "(8,192-token prompt + 256 generated), bf16 weights, KV cache auto, one GPU per replica? "
                           "Answer. ")
    m = re.search(r"Answer\. (.+?) with bf16 weights, KV cache auto\. (\d+) concurrent sequences fit \(16 asked\)",
                  text)
    gpu = next(g for g in result.scenario.gpus if g.name == m.group(1))
    plan = result.serving
    at = plan[(plan[C.CONTEXT] == 8448) & (plan[C.TENSOR_PARALLEL] == 1) & (plan[C.PRECISION] == "bf16")
              & (plan[C.KV_DTYPE] == "auto")]
    assert int(m.group(2)) == at[at[C.GPU] == gpu.id][C.MAX_CONCURRENT].item() >= 16
    # the GPU with the least memory that serves 16 as asked
    ok = {g for g in at[at[C.MAX_CONCURRENT] >= 16][C.GPU]}
    assert gpu.memory_bytes == min(g.memory_bytes for g in result.scenario.gpus if g.id in ok)
    assert re.search(r"[\d.]+ tokens/s per sequence while 16 decode together .* time to first token of one "
                     r"8,192-token prompt [\d.]+ m?s; at 65% decode bandwidth efficiency", text)


# ------------------------------------------------------------------------------------------------ published figures

TORCHTITAN = """\
name: torchtitan Llama 3.1 8B on 8 H100
model: {preset: llama-3.1-8b}
grid: {batch: 2, seq_len: 8192, precision: bf16-mixed, optimizer: adamw, checkpointing: full}
parallel: {data_parallel: 8, zero_stage: 3}
gpus: [h100-sxm]
target: {batch: 2, seq_len: 8192}
throughput: {mfu: %s}
"""


def _tokens_per_s(text: str, mfu: float) -> float:
    sc = parse_scenario_text(TORCHTITAN % mfu, "torchtitan.yaml")
    run = run_scenario(sc)
    page = decision.decision(sc, run.max_batch, None, None, "torchtitan.yaml")
    (row,) = page["table"]["rows"]
    cell = dict(zip(page["table"]["headers"], row["cells"]))["tokens/s per GPU (MFU), est."]
    return float(cell.split()[0].replace(",", ""))


@pytest.mark.parametrize("tps,mfu", [
    pytest.param(5762, 0.33, id="torchtitan-H100-2024-12-Llama3.1-8B-FSDP-8GPU-selective-eager-5762tps-33pct"),
    pytest.param(6667, 0.39, id="torchtitan-H100-2024-12-Llama3.1-8B-FSDP-8GPU-selective-compile-6667tps-39pct")])
def test_the_page_reproduces_torchtitans_tokens_per_s_at_its_mfu(tps, mfu):
    """benchmarks/llama3_h100_202412_torchtitan.md: 8 H100, FSDP, local batch 2, seq 8192, selective AC; '33 % to
    39 % MFU' (whole percents, truncated). The page's tokens/s per GPU at the stated MFU, with the catalog's H100
    peak (989.5 TFLOP/s bf16 dense) and the page's own FLOPs per token, brackets the published figure within that
    truncation: tokens/s(m) <= published < tokens/s(m + 1 pp). The scenario recomputes fully so that the page has
    a configuration that fits (torchtitan's selective AC, every other layer, lies between our none and full; our
    'selective' is Korthikanti's); a stated MFU is used as it is, so the recipe's recomputation does not enter."""
    assert _tokens_per_s("", mfu) <= tps < _tokens_per_s("", round(mfu + 0.01, 2))


GPT_FAST = """\
name: gpt-fast Llama-2-7B batch 1
model: {preset: llama-2-7b}
mode: infer
grid: {batch: 1, seq_len: 5, precision: bf16, decode_tokens: 200}
gpus: [a100-80gb]
target: {batch: 1, seq_len: 5}
throughput: {decode_bandwidth_efficiency: %s}
"""


def test_the_page_reproduces_gpt_fast_llama2_7b_batch_1():
    """gpt-fast README (A100-80GB, batch 1): Llama-2-7B bf16 104.9 tokens/s at 1,397.31 GB/s achieved. Stated as
    that share of the catalog's 2,000 GB/s, the page's decode tokens/s per sequence is within 1 %."""
    eff = 1397.31e9 / get_gpu("a100-80gb").memory_bandwidth_bytes_per_s
    sc = parse_scenario_text(GPT_FAST % eff, "gpt-fast.yaml")
    run = run_scenario(sc)
    page = decision.decision(sc, run.max_batch, None, None, "gpt-fast.yaml")
    (row,) = page["table"]["rows"]
    cell = dict(zip(page["table"]["headers"], row["cells"]))["decode tokens/s per sequence, est."]
    assert float(cell) == pytest.approx(104.9, rel=0.01)
    assert "70% decode bandwidth efficiency (stated)" in page["speed"]


def test_priced_gpus_add_a_price_column_and_a_cost_per_token(run):
    sc = replace(run.scenario, gpus=tuple(replace(g, price_usd_per_hour=p) for g, p in
                                          zip(run.scenario.gpus, (4.0, 1.0, 2.0))))
    page = decision.decision(sc, run.max_batch, None, None, "scenario.yaml")
    assert page["table"]["headers"][-1] == "price"
    assert [r["cells"][-1] for r in page["table"]["rows"]] == ["$1.00/h", "$2.00/h", "$4.00/h"]
    # the A100 40GB meets the question as asked at $2.00/h, the L4 ($1.00/h) only with a change: fewest changes first
    assert page["answer"].startswith("A100 40GB")


def test_the_page_text_has_no_unrendered_values(shipped):
    for _, _, text in shipped.values():
        assert "nan" not in text.split() and "None" not in text and "{" not in text
