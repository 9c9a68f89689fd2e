"""DeepSpeed's ZeRO-Offload (offload optimizer at ZeRO-1/2; issue 22): the GPU side of one rank, its host storages told
apart in the recording (workload/zero_engine.py host_side), measured on DeepSpeed 0.19.8's own engine under
FakeTensorMode (tests/data/truth/deepspeed/*-offload-*), against the hand model (parallel/deepspeed.py
deepspeed_offload): full fine-tunes of Llama 3.2 1B and 3.1 8B and LoRA, at ZeRO-2 and ZeRO-1, with accumulation and
checkpointing. The hand model before this (ZeRO-Offload's paper: the parameters and the bucket on the GPU) was
5.4-40.4 % low on Llama 3.2 1B."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nnmem_sweep import accuracy as A
from nnmem_sweep.allocator import AllocatorOptions
from nnmem_sweep.measure.cases import DEEPSPEED_CASES
from nnmem_sweep.measure.truth import SEQUENCES_DIR, end_ranks, sequence_path
from nnmem_sweep.replays import least_capacity
from nnmem_sweep.report.uncertainty import FRAGMENTATION

TRUTH = Path(__file__).parent / "data" / "truth"
CASES = [c for c in A.load_cases(TRUTH, sharded=True) if (c["inputs"].get("deepspeed") or {}).get("offload")]
IDS = [c["case_id"] for c in CASES]
V_H_1B = 128_256 * 2_048  # Llama 3.2 1B's tied embedding, elements


def _per_rank_host(case) -> int:
    """The estimate's host bytes of one rank (its figure is per node, gpus_per_node ranks of the default node)."""
    from nnmem_sweep.parallel.layout import DEFAULT_GPUS_PER_NODE

    return A.estimate_case(case)["host_bytes_per_node"] // DEFAULT_GPUS_PER_NODE


def test_the_offload_cases_are_committed_with_their_release():
    assert len(CASES) == 12
    assert {c["versions"]["deepspeed"] for c in CASES} == {"0.19.8"}
    assert {(c["inputs"]["deepspeed"]["zero_stage"], bool(c["inputs"].get("finetune"))) for c in CASES} == \
        {(1, False), (2, False), (2, True)}
    assert all("host's are told apart" in c["method"] for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_phase_within_a_quarter_percent_and_the_peak_in_its_phase(case):
    """The most loaded rank of each phase (both end ranks measured): forward, backward and the (GPU side of the) step;
    the forward within 64 KiB."""
    est, m = A.estimate_case(case), case["measured"]
    assert est["peak_phase"] == m["peak_phase"] == "backward"
    for phase, v in m["phases"].items():
        assert abs(est["phases"][phase] - v["peak_bytes"]) <= 0.0025 * v["peak_bytes"], phase
    assert abs(est["phases"]["forward"] - m["phases"]["forward"]["peak_bytes"]) <= 64 * 1024


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_gpu_holds_the_16_bit_parameters_and_the_largest_gradients_buffer_the_host_the_rest(case):
    """Between steps the GPU holds the parameters, the buffers and the GPU buffer of the largest trainable tensor's
    gradient (temp_grad_buffer_for_gpu_offload); the fp32 partition, its gradient, the pinned copies and AdamW's state
    are the host's, and the estimate's host bytes per rank are the measured ones but for the tensor straddling the
    partition's end (accumulation's host buffers hold it whole) and AdamW's step counter. ZeRO-1 with accumulation
    keeps the micro-batches' gradients on the GPU, not the host (the hand model put them on the host before this case:
    10.6 % high in host bytes)."""
    t, m, i = case["measured"]["totals"], case["measured"], case["inputs"]
    # ZeRO-1 accumulates on the GPU: the last micro-batch starts beside the 16-bit gradients (a full fine-tune's: the
    # parameters' bytes) and the reduce bucket the first one left (5e8 bf16)
    kept = t["param_bytes"] + 1_000_000_000 if i["deepspeed"]["zero_stage"] == 1 and i.get("gradient_accumulation") \
        else 0
    assert m["phases"]["forward"]["start_bytes"] == t["param_bytes"] + t["buffer_bytes"] + t["grad_bytes"] + kept
    assert t["host_bytes"] > t["master_bytes"] + t["opt_bytes"]
    assert abs(_per_rank_host(case) - t["host_bytes"]) <= 0.002 * t["host_bytes"]


def test_the_backward_peaks_at_the_embeddings_fp64_copy_for_its_norm():
    """Llama 3.2 1B over 2 ranks, ZeRO-2, 2 x 64 tokens, by hand: rank 0 reduces the embedding's gradient (its
    partition holds all of it) and copies it to fp64 for the norm on the GPU before sending it to the host, beside the
    reduce bucket (5e8 bf16) and the GPU buffer of one embedding's gradient: W + 1e9 + 2 V·h + 8 V·h. The hand model
    before was 4,522,304,000 B, 25.8 % low."""
    (case,) = [c for c in CASES if c["case_id"] == "llama-3.2-1b-ds2z2-offload-train-bf16-master-adamw-b2-s64"]
    by_hand = 2_471_628_800 + 1_000_000_000 + 2 * V_H_1B + 8 * V_H_1B
    measured = case["measured"]["peak_bytes"]
    assert 0 <= measured - by_hand <= 1024  # the norms' 8-byte scalars of the other gradients
    assert abs(A.estimate_case(case)["peak_bytes"] - measured) <= 2048
    assert (4_522_304_000 - measured) / measured < -0.25


def test_zero1_holds_every_gradient_to_the_backwards_end():
    """ZeRO-1 without overlap_comm reduces after the backward: at the embedding's fp64 copy the gradients not yet in
    the full bucket are still held (the estimate counts one layer tensor more: 0.16 % high), where the hand model
    before, which held none, was 40.4 % low."""
    (case,) = [c for c in CASES if c["inputs"]["deepspeed"]["zero_stage"] == 1 and not c["inputs"].get(
        "gradient_accumulation") and not c["inputs"]["deepspeed"].get("overlap_comm")]
    est, measured = A.estimate_case(case)["peak_bytes"], case["measured"]["peak_bytes"]
    assert 0 <= est - measured <= 0.002 * measured


OFFLOADED = [c for c in DEEPSPEED_CASES if c["deepspeed"].get("offload")]


def test_their_fresh_runs_need_more_than_the_span_stated_for_deepspeed_and_less_than_the_one_gpu_range():
    """Each case's fresh run of two steps on both end ranks, replayed by the caching-allocator model: 0.5-27.4 % of
    the peak (ZeRO-1 at 64 tokens the most: the fp64 copy requested among the freed gradients' blocks), more than the
    0.5-17.1 % of DeepSpeed's other steps and within the one-GPU range: the span the report states for ZeRO-Offload
    rows of their recipes (replays.DEEPSPEED_OFFLOAD_SPAN), to the bisection's step."""
    from nnmem_sweep.replays import DEEPSPEED_OFFLOAD_SPAN, DEEPSPEED_RESERVE_SPAN

    folder = TRUTH / "deepspeed" / SEQUENCES_DIR
    needs = []
    for case in OFFLOADED:
        for rank in end_ranks(case):
            with np.load(sequence_path(folder, case["id"], rank)) as z:
                peak, need = least_capacity(z["events"], AllocatorOptions())
            needs.append((need - peak) / peak)
    assert len(needs) == 2 * len(OFFLOADED) == 24
    assert FRAGMENTATION[0] <= round(min(needs), 3) and max(needs) <= FRAGMENTATION[1]
    assert max(needs) > DEEPSPEED_RESERVE_SPAN[1]
    assert DEEPSPEED_OFFLOAD_SPAN == (round(min(needs), 3), round(max(needs), 3))


def test_a_zero_offload_rows_band_is_what_zero_offloads_measured_steps_needed():
    """The decision page's band for an untraced ZeRO-Offload row of a measured recipe (AdamW, ZeRO-1/2, no or full
    checkpointing): DEEPSPEED_OFFLOAD_SPAN, not the one-GPU range it took before; DeepSpeed's other rows keep their
    span; ZeRO-3's offload and other recipes the one-GPU range."""
    from nnmem_sweep import columns as C
    from nnmem_sweep.replays import DEEPSPEED_OFFLOAD_SPAN, DEEPSPEED_RESERVE_SPAN
    from nnmem_sweep.report.uncertainty import fragmentation_source
    from nnmem_sweep.config import parse_scenario_text

    row = {C.REDUCE_BUCKET: 500_000_000, C.ZERO_STAGE: 2, C.OPTIMIZER: "adamw", C.CHECKPOINTING: "none",
           C.OFFLOAD: "optimizer"}
    sc = parse_scenario_text("model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: 1, seq_len: 128, precision: bf16, "
                             "optimizer: adamw}\n"
                             "gpus: [h100-sxm]\n")  # nothing replayed: the rows' bands are the spans
    assert fragmentation_source(row, sc) == (DEEPSPEED_OFFLOAD_SPAN, "deepspeed")
    assert fragmentation_source(row | {C.OFFLOAD: "none"}, sc) == (DEEPSPEED_RESERVE_SPAN, "deepspeed")
    for other in ({C.ZERO_STAGE: 3}, {C.OPTIMIZER: "sgd"}, {C.OFFLOAD: "optimizer+params"}, {C.REDUCE_BUCKET: 0}):
        assert fragmentation_source(row | other, sc) == (FRAGMENTATION, "default"), other


def test_a_lora_scenario_under_zero_offload_runs_and_states_its_host():
    """LoRA under DeepSpeed ZeRO-2 with offload optimizer: planned (it was refused), the adapters' fp32 partition and
    AdamW state on the host, the GPU side below the same layout's without offload by those states."""
    from nnmem_sweep import columns as C
    from nnmem_sweep.config import parse_scenario_text
    from nnmem_sweep.estimate import estimate_grid

    text = ("model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: 2, seq_len: 1024, precision: bf16-master, "
            "optimizer: adamw}\ngpus: [rtx-4090]\nfinetune: {method: lora, rank: 16, alpha: 32, targets: [q_proj, "
            "v_proj]}\nparallel: {data_parallel: 2, zero_stage: 2, deepspeed: true, offload: [none, optimizer]}\n"
            "overheads: {allocator_reserve: 0.05}\n")
    frame = estimate_grid(parse_scenario_text(text))
    on, off = (frame[frame[C.OFFLOAD] == v].iloc[0] for v in ("none", "optimizer"))
    assert on[C.HOST] == 0 and off[C.HOST] > 0
    assert off[C.MASTER_WEIGHTS] == off[C.OPTIMIZER_STATE] == 0 < on[C.OPTIMIZER_STATE]
    assert off[C.PEAK_ALLOCATED] < on[C.PEAK_ALLOCATED]


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4000, "hidden_size": 256,
         "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
         "head_dim": 32, "hidden_act": "silu", "attention_dropout": 0.0, "tie_word_embeddings": False}


def test_a_tiny_offloaded_rank_measured_now_is_its_estimate():
    """The measurement itself, on a 4-layer Llama over 2 ranks (ZeRO-2, a 1e5-element bucket, untied head): both end
    ranks recorded with the host told apart, the estimate within 0.5 % in every phase and its host bytes those
    recorded."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (deepspeed==0.19.8, DS_BUILD_OPS=0)")
    from nnmem_sweep.measure.truth import deepspeed_record

    case = {"id": "tiny-ds2z2-offload", "hf_config": LLAMA, "mode": "train", "batch": 2, "seq_len": 128,
            "precision": "bf16-master", "optimizer": "adamw", "optimizer_impl": "foreach", "checkpointing": "none",
            "attention": "flash", "decode_tokens": 0, "tolerance": {"peak": 0.005},
            "deepspeed": {"world": 2, "zero_stage": 2, "reduce_bucket_size": 100_000, "offload": "optimizer"}}
    rec = deepspeed_record(case)
    est, m = A.estimate_case(rec), rec["measured"]
    for phase, v in m["phases"].items():
        assert abs(est["phases"][phase] - v["peak_bytes"]) <= 0.005 * v["peak_bytes"], phase
    assert abs(_per_rank_host(rec) - m["totals"]["host_bytes"]) <= 64


def test_the_report_states_what_is_measured_of_deepspeeds_offload_and_what_is_not():
    """configs/llama-8b-zero-offload.yaml's assumptions: ZeRO-1/2's offload measured on DeepSpeed's engine, and
    ZeRO-3's (not in this scenario, stated wherever offload is) the paper's accounting, to verify by measuring."""
    from nnmem_sweep.config import load_scenario
    from nnmem_sweep.report.assumptions import assumptions

    sc = load_scenario(Path(__file__).parents[1] / "configs" / "llama-8b-zero-offload.yaml")
    (group,) = [g for g in assumptions(sc)["groups"] if g["title"] == "Parallelism and sharding"]
    (text,) = [t for t in group["items"] if t.startswith("Offload (ZeRO-Offload)")]
    assert "against 256.0 GiB of RAM" in text and "4 GPUs per node" in text
    assert "tests/data/truth/deepspeed/*-offload-*" in text and "ZeRO-3's offload" in text and "not measured" in text


def test_zero3_offload_is_refused_by_the_cpu_recording_and_left_to_the_gpu_kit():
    """ZeRO-3's offload moves partitions with .to(device), which moves nothing on one device: the CPU recording
    refuses it in one line naming the kit, whose point runs it on a GPU (validation/gpu-deepspeed.yaml)."""
    from nnmem_sweep.derive.zero_sequence import recorded
    from nnmem_sweep.gpu_points import load_points

    case = {"deepspeed": {"world": 2, "zero_stage": 3, "reduce_bucket_size": 500_000_000, "offload": "optimizer"}}
    with pytest.raises(ValueError, match="ZeRO-3's offload is not recorded on one device"):
        recorded(case, {}, untraced=0, traced=1)
    points = load_points(str(Path(__file__).parents[1] / "validation" / "gpu-deepspeed.yaml"))
    assert any(p["deepspeed"].get("offload") == "optimizer" and p["deepspeed"]["zero_stage"] == 3 for p in points)


def test_a_layout_short_of_host_memory_reads_host_in_the_max_batch_table():
    """configs/llama-8b-zero-offload.yaml over 2 ranks with ZeRO-Offload: 273 GiB of host memory per node against the
    workstation's 256 GiB, so no batch fits though batch 1 fits an A100-40GB, an L40S or an A100-80GB (33.2 GiB);
    those cells read 'host', the RTX 4090's (GPU too small as well) and the layouts without offload a dash, and the
    note beside the tables says what 'host' means. They have a shade of their own, in the tables and the heatmap,
    which the heatmap's legend names. The bars of those layouts carry the largest replayed reserve, as no row of
    theirs is replayed, and the chart's caption says so."""
    from nnmem_sweep.config import load_scenario
    from nnmem_sweep.report.format import DASH
    from nnmem_sweep.report import figures, points
    from nnmem_sweep.report.charts import LEVEL_FILL, heatmap
    from nnmem_sweep.report.tables import HOST_LEVEL, HOST_SHORT, layout_note, max_batch_tables
    from nnmem_sweep.runner import run_scenario

    sc = load_scenario(Path(__file__).parents[1] / "configs" / "llama-8b-zero-offload.yaml")
    result = run_scenario(sc, bands=False)
    (table, *_), heat = max_batch_tables(result.scenario, result.max_batch)
    cells = {tuple(r["axes"]): [c["text"] for c in r["cells"]] for r in table["rows"]}
    shades = {tuple(r["axes"]): [c["level"] for c in r["cells"]] for r in table["rows"]}
    assert [h["name"] for h in table["gpu_headers"]] == ["GeForce RTX 4090", "A100-SXM4-40GB", "NVIDIA L40S",
                                                         "A100-SXM4-80GB"]
    assert cells["2,048", "2", "optimizer"] == [DASH, HOST_SHORT, HOST_SHORT, HOST_SHORT]
    assert cells["2,048", "2", "none"] == [DASH] * 4
    assert shades["2,048", "2", "optimizer"] == [0, HOST_LEVEL, HOST_LEVEL, HOST_LEVEL]
    assert HOST_SHORT not in cells["2,048", "4", "optimizer"]
    host_rows = [label for label, row in zip(heat["rows"], heat["cells"]) if HOST_LEVEL in row]
    assert host_rows and all("offload optimizer" in label for label in host_rows), heat["rows"]
    assert heat["legend"][HOST_LEVEL] == "fits the GPU, not the node's host memory"
    svg = heatmap("t", heat["rows"], heat["cols"], heat["cells"], heat["legend"])
    assert svg.count(f'fill="{LEVEL_FILL[HOST_LEVEL]}"') == 3 * len(host_rows) + 1  # the cells and the legend's key
    run = result.scenario
    _, _, note = figures.breakdown_chart(run, result.results, points.reference_point(run),
                                         points.usable_by_gpu(result.results, run))
    largest = max(f for _, f in run.overheads.replayed_by_recipe)
    assert run.overheads.reserve_fraction == largest
    assert note.startswith(f"The runtime overhead of DP 2 · offload optimizer and DP 2 · offload none holds the "
                           f"largest replayed allocator reserve ({100 * largest:.1f} % of the peak)"), note
    assert f"'{HOST_SHORT}' fits the GPU at batch 1 but not the node's host memory" in layout_note(sc)
