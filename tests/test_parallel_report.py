"""The report of a scenario with a `parallel:` block (issue 4 follow-up): the max-batch tables, the decision page, the
charts' reference point and the target treat the layouts like the other non-batch axes; report.table_rows may name
parallel axes; the assumptions list what the parallel, fine-tuning and cluster models rely on, only where used."""
from __future__ import annotations

import re
import textwrap

import pandas as pd
import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.formulas import all_formulas
from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.errors import ScenarioError
from nnmem_sweep.report import appendix, assumptions, decision, figures, points, tables as report_tables
from nnmem_sweep.report.format import AXIS_LABELS, axis_value
from nnmem_sweep.runner import run_scenario

# Llama 3.1 8B over four layouts (ZeRO 1/3 x TP 1/4, DP 8, SP): 4 layouts x 2 checkpointing x 2 GPUs = 16 cells.
# max_batch.csv (the estimator's figures; what matters here is that the layouts differ):
#   selective  ZeRO 1 TP 1: A100 40GB 0, H100 1    ZeRO 1 TP 4: 3, 8    ZeRO 3 TP 1: 0, 1    ZeRO 3 TP 4: 4, 8
# Before the fix the tables kept the last layout per cell (4, 8) and the summary (now the decision page) the first.
LAYOUTS = """\
name: Llama 8B layouts
model: {preset: llama-3.1-8b}
mode: train
grid:
  batch: [1, 2, 4]
  seq_len: 4096
  precision: bf16-master
  optimizer: adamw
  checkpointing: [selective, full]
parallel:
  data_parallel: 8
  zero_stage: [1, 3]
  tensor_parallel: [1, 4]
  sequence_parallel: true
gpus: [a100-40gb, h100-sxm]
headroom: 0.05
"""


@pytest.fixture(scope="module")
def layouts():
    return run_scenario(parse_scenario_text(LAYOUTS, "layouts.yaml"))


def with_report(text: str, report: str) -> object:
    return parse_scenario_text(text + report, "layouts.yaml")


def csv_max_batch(mb: pd.DataFrame, **at) -> int:
    m = pd.Series(True, index=mb.index)
    for k, v in at.items():
        m &= mb[k] == v
    (value,) = mb.loc[m, C.MAX_BATCH].tolist()
    return int(value)


def test_every_table_cell_is_the_max_batch_of_its_own_layout(layouts):
    sc, mb = layouts.scenario, layouts.max_batch
    tables, _ = report_tables.max_batch_tables(sc, mb)
    (table,) = tables  # no table_rows: every varying axis is a row, GPUs are columns
    assert table["axis_headers"] == ["checkpointing", "TP", "ZeRO"]  # layouts in the order they are written
    assert [g["name"] for g in table["gpu_headers"]][0].startswith("A100")  # smallest first
    assert len(table["rows"]) == 8
    gpus = ["a100-40gb", "h100-sxm"]
    for row in table["rows"]:
        ck, tp, zero = row["axes"]
        for gpu, cell in zip(gpus, row["cells"]):
            want = csv_max_batch(mb, checkpointing=ck, tensor_parallel=int(tp), zero_stage=int(zero), gpu=gpu)
            assert cell["text"] == (f"{want:,}" if want else "–"), (ck, tp, zero, gpu)
    # the selective TP 1 ZeRO 1 row: the A100 40GB does not fit, the H100 fits batch 1 (not the last layout's 4, 8)
    first = table["rows"][0]
    assert first["axes"] == ["selective", "1", "1"] and [c["text"] for c in first["cells"]] == ["–", "1"]


def _page(sc, run) -> dict:
    page = decision.decision(sc, run.max_batch, None, None, "layouts.yaml")
    return page, {r["cells"][0]: dict(zip(page["table"]["headers"], r["cells"])) for r in page["table"]["rows"]}


def test_decision_names_each_gpus_layout_and_agrees_with_the_table(layouts):
    """No target: the question is the reference point (batch 1, selective, the first layout TP 1 · ZeRO 1). Per GPU
    (smallest first) the layout asked if it fits, else the fewest changes of it; the largest batch is that layout's
    max-batch cell."""
    sc, mb = layouts.scenario, layouts.max_batch
    page, rows = _page(sc, layouts)
    assert page["question"] == ("Which GPU trains Llama 3.1 8B at batch 1 × 4,096 tokens (4,096 tokens per step) with "
                                "bf16-master adamw, selective checkpointing, TP 1 + SP · PP 1 · DP 8 · ZeRO 1 (the "
                                "report's reference point: the scenario sets no target)?")
    a100, h100 = rows.values()
    # the A100 40GB does not fit TP 1 ZeRO 1 at batch 1 (max batch 0); one change of layout fits: TP 4 (3) before
    # ZeRO 3 (still 0), on 32 GPUs
    assert a100["recipe (* not as asked)"] == ("bf16-master adamw, selective checkpointing, TP 4 + SP · PP 1 · DP 8 "
                                               "· ZeRO 1 *")
    assert a100["GPUs"] == "32" and a100["largest batch"] == "3"
    assert csv_max_batch(mb, checkpointing="selective", tensor_parallel=4, zero_stage=1, gpu="a100-40gb") == 3
    # the H100 fits the layout asked (max batch 1), on 8 GPUs: the answer (no change)
    assert h100["recipe (* not as asked)"].endswith("TP 1 + SP · PP 1 · DP 8 · ZeRO 1") and h100["GPUs"] == "8"
    assert h100["largest batch"] == "1"
    assert page["answer"].startswith("8 × H100 SXM5 80GB (H100 80GB HBM3) with bf16-master adamw, selective "
                                     "checkpointing, TP 1 + SP · PP 1 · DP 8 · ZeRO 1.")


def test_table_rows_may_name_parallel_axes_and_then_unnamed_ones_split_the_tables(layouts):
    sc = with_report(LAYOUTS, "report: {table_rows: [tensor_parallel]}\n")
    tables, heat = report_tables.max_batch_tables(sc, layouts.max_batch)
    # rows TP; tables per (checkpointing, ZeRO): the axes it does not name split as grid axes do
    assert [t["caption"] for t in tables] == ["checkpointing selective, ZeRO 1", "checkpointing selective, ZeRO 3",
                                              "checkpointing full, ZeRO 1", "checkpointing full, ZeRO 3"]
    assert all(t["axis_headers"] == ["TP"] for t in tables)
    # (A100 40GB, H100) at ZeRO 3: TP 4 holds 3 and 8 (two NCCL communicators, TP and DP, of 1.8 GiB each)
    assert [[c["text"] for c in r["cells"]] for r in tables[1]["rows"]] == [["–", "1"], ["3", "8"]]
    # naming only grid axes: the layouts follow them as rows (one table, not a table per layout)
    sc = with_report(LAYOUTS, "report: {table_rows: [checkpointing]}\n")
    tables, heat = report_tables.max_batch_tables(sc, layouts.max_batch)
    assert len(tables) == 1 and tables[0]["axis_headers"] == ["checkpointing", "TP", "ZeRO"]
    # the heatmap: the layouts at the reference checkpointing, labelled by layout
    assert heat["rows"] == ["TP 1 · ZeRO 1", "TP 1 · ZeRO 3", "TP 4 · ZeRO 1", "TP 4 · ZeRO 3"]
    assert heat["about"] == "checkpointing selective"


@pytest.mark.parametrize("report", ["report: {table_rows: [seq_len, tensor_parallel]}\n",
                                    "report: {table_rows: [zero_stage]}\n"])
def test_table_rows_naming_a_parallel_axis_without_a_parallel_block_is_located(report):
    text = LAYOUTS[:LAYOUTS.index("parallel:")] + LAYOUTS[LAYOUTS.index("gpus:"):]
    with pytest.raises(ScenarioError) as e:
        parse_scenario_text(text + report, "s.yaml")
    (p,) = e.value.problems
    axis = "tensor_parallel" if "tensor" in report else "zero_stage"
    assert (p.line, p.key_path) == (12, f"report.table_rows[{1 if 'seq_len' in report else 0}]")
    assert p.message.startswith(f"{axis} is a parallel axis, but this scenario has no parallel: block")


def test_charts_draw_the_reference_layout_and_each_knob_on_its_own(layouts):
    sc, res = layouts.scenario, layouts.results
    point = points.reference_point(sc)
    assert {k: point[k] for k in (C.TENSOR_PARALLEL, C.ZERO_STAGE, C.DATA_PARALLEL)} == \
        {C.TENSOR_PARALLEL: 1, C.ZERO_STAGE: 1, C.DATA_PARALLEL: 8}
    bars, varied = figures._bar_points(sc, point)
    assert [label for _, label in bars] == ["TP 1 · ZeRO 1", "TP 4 · ZeRO 1", "TP 1 · ZeRO 3"]
    assert varied == {C.TENSOR_PARALLEL, C.ZERO_STAGE}
    usable = points.usable_by_gpu(res, sc)
    svg, about = figures.memory_vs_batch_chart(sc, res, point, usable)
    assert about.endswith("selective checkpointing, TP 1 + SP · PP 1 · DP 8 · ZeRO 1")
    # the line is the reference layout's totals on the smallest GPU, batch 1, 2, 4 (not another layout's)
    ref = res[(res[C.GPU] == "a100-40gb") & (res[C.CHECKPOINTING] == "selective") & (res[C.TENSOR_PARALLEL] == 1)
              & (res[C.ZERO_STAGE] == 1)]
    assert len(ref) == 3
    _, about, _ = figures.breakdown_chart(sc, res, point, usable)
    assert about == "Llama 3.1 8B training, batch 1, seq 4,096, bf16-master adamw, selective checkpointing, SP · PP 1 · DP 8"


def test_layout_labels_and_values():
    assert all(a in AXIS_LABELS for a in C.PARALLEL_AXES)
    assert [AXIS_LABELS[a] for a in (C.DATA_PARALLEL, C.ZERO_STAGE, C.TENSOR_PARALLEL, C.SEQUENCE_PARALLEL,
                                     C.PIPELINE_PARALLEL)] == ["DP", "ZeRO", "TP", "SP", "PP"]
    assert (axis_value(C.SEQUENCE_PARALLEL, True), axis_value(C.FP32_GRAD_ACCUMULATION, False)) == ("on", "off")
    assert [axis_value(C.GRADIENT_SYNC, v) for v in ("each", "last")] == [
        "every micro-batch", "last micro-batch only (no_sync)"]


def test_inference_layouts_name_tp_pp_dp_only():
    text = LAYOUTS.replace("mode: train", "mode: infer").replace("  optimizer: adamw\n", "").replace(
        "  checkpointing: [selective, full]\n", "").replace(
        "  zero_stage: [1, 3]\n", "").replace("  sequence_parallel: true\n", "")
    sc = parse_scenario_text(text)
    assert points.layout_text(sc, points.reference_point(sc)) == "TP 1 · PP 1 · DP 8"


def test_a_scenario_without_parallel_block_has_no_layout_text(layouts):
    text = LAYOUTS[:LAYOUTS.index("parallel:")] + LAYOUTS[LAYOUTS.index("gpus:"):]
    sc = parse_scenario_text(text)
    assert points.layout_text(sc, points.reference_point(sc)) == "" and report_tables.layout_note(sc) == ""
    assert assumptions.assumptions(sc)["groups"] == []


def test_parallel_assumptions_appear_with_the_parallel_block_and_leave_formulas(layouts):
    groups = assumptions.assumptions(layouts.scenario)["groups"]
    assert [g["title"] for g in groups] == ["Parallelism and sharding"]
    items = groups[0]["items"]
    assert any(i.startswith("Every figure is per GPU, on the most loaded rank") for i in items)
    (comm,) = [i for i in items if i.startswith("Communication buffers, not counted: NCCL buffers")]
    assert "NCCL_BUFFSIZE" in comm and "https://docs.nvidia.com/deeplearning/nccl" in comm  # its sources, cited
    assert not any("Offload" in i for i in items)  # no layout offloads
    names = [f["name"] for f in appendix.formulas(all_formulas())]
    assert "parallel.assumptions.communication_buffers" not in names and "parallel.rank_states" in names


def test_offload_assumption_names_the_node(layouts):
    text = LAYOUTS.replace("  zero_stage: [1, 3]\n", "  zero_stage: 3\n  offload: [none, optimizer]\n") + \
        "node: {gpus: 4, host_memory: 512 GiB}\n"
    items = assumptions.assumptions(parse_scenario_text(text))["groups"][0]["items"]
    (off,) = [i for i in items if i.startswith("Offload")]
    assert "times 4 GPUs per node, against 512.0 GiB of RAM" in off


def test_finetune_and_cluster_assumptions_only_where_used():
    lora = textwrap.dedent("""\
        model: {preset: llama-3.2-1b}
        mode: train
        grid: {batch: 1, seq_len: 512, precision: bf16, optimizer: adamw}
        gpus: [h100-sxm]
        """)
    groups = assumptions.assumptions(parse_scenario_text(lora + "finetune: {method: lora, rank: 8}\n"))["groups"]
    assert [g["title"] for g in groups] == ["Fine-tuning"]
    assert groups[0]["items"][1] == ("Adapters A (rank × in) and B (out × rank), without bias, on q_proj, v_proj of "
                                     "every layer, in fp32 (peft casts the adapters of a 16-bit model to fp32: "
                                     "autocast_adapter_dtype=True).")
    assert not any("QLoRA" in i for i in groups[0]["items"])
    qlora = assumptions.assumptions(parse_scenario_text(lora + "finetune: {method: qlora}\n"))["groups"][0]["items"]
    # traced through bitsandbytes' own 4-bit storage (workload/qlora.py); what the trace cannot see is said
    assert any(i.startswith("QLoRA") and "fused kernel" in i and "prepare_model_for_kbit_training" in i
               for i in qlora)
    assert assumptions.assumptions(parse_scenario_text(lora + "finetune: {method: full}\n"))["groups"] == []
    cluster = assumptions.assumptions(parse_scenario_text(lora + "cluster: {global_batch: 8}\n"))["groups"]
    assert [g["title"] for g in cluster] == ["How many GPUs"]
    assert "stands in for what the throughput estimate does not model" in cluster[0]["items"][0]
    assert "TP within a node (8 GPUs)" in cluster[0]["items"][1]


def test_rendered_report_reads_the_layouts(tmp_path, monkeypatch, layouts):
    from nnmem_sweep.report import render_report

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "layouts.yaml").write_text(LAYOUTS)
    render_report(layouts, tmp_path / "out", "layouts.yaml", pdf=False, formulas=all_formulas(), validation=None)
    html = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert '<th class="axis">TP</th>' in html and '<th class="axis">ZeRO</th>' in html
    assert "Each row is one parallel layout (TP, ZeRO in its columns; DP 8, SP on in every one)." in html
    assert "<h3>Parallelism and sharding</h3>" in html
    section = re.search(r'<section id="decision">(.*?)</section>', html, re.S).group(1)
    assert section.count("<tr") == 3 and "TP 4 + SP · PP 1 · DP 8 · ZeRO 1 *" in section


# ------------------------------------------------------------------------------------------------ diff (issue 4)
def test_diff_keys_each_layout_on_its_own(layouts):
    # before the fix the key left the parallel axes out: four layouts per key met four, a 4 x 4 cross product
    from nnmem_sweep import diff as D

    new = run_scenario(parse_scenario_text(LAYOUTS.replace("headroom: 0.05", "headroom: 0.3")))
    d = D.diff_max_batch(layouts, new)
    assert D.key_columns(d)[-len(C.PARALLEL_AXES):] == list(C.PARALLEL_AXES)
    assert not d.duplicated(D.key_columns(d)).any()
    for r in d.itertuples(index=False):
        at = dict(checkpointing=r.checkpointing, tensor_parallel=r.tensor_parallel, zero_stage=r.zero_stage,
                  gpu=r.gpu)
        assert (r.old_max_batch, r.new_max_batch) == (csv_max_batch(layouts.max_batch, **at),
                                                      csv_max_batch(new.max_batch, **at))
    # H100, full checkpointing, TP 4 ZeRO 3 fits 36 with 5% headroom; with 30% fewer
    h100 = d[(d.gpu == "h100-sxm") & (d.checkpointing == "full") & (d.tensor_parallel == 4) & (d.zero_stage == 3)]
    assert len(h100) == 1 and h100.iloc[0]["old_max_batch"] == 36 and h100.iloc[0]["change"] == D.DECREASE
    text = D.format_diff(d, "a", "b")
    assert "[checkpointing  gpu  zero_stage  tensor_parallel]" in text


def test_a_scenario_gaining_a_parallel_block_meets_it_on_the_one_gpu_layout():
    from nnmem_sweep import diff as D

    single = LAYOUTS[:LAYOUTS.index("parallel:")] + LAYOUTS[LAYOUTS.index("gpus:"):]
    layouts = single.replace("gpus:", "parallel:\n  data_parallel: [1, 8]\n  zero_stage: [0, 1]\ngpus:")
    old, new = run_scenario(parse_scenario_text(single)), run_scenario(parse_scenario_text(layouts))
    d = D.diff_max_batch(old, new)
    # the old cells are the one-GPU layout (DP 1, ZeRO 0), which the new run gives the same max batch: unchanged;
    # the three other layouts x 2 checkpointing x 2 GPUs are added
    assert len(d) == 12 and set(d[D.CHANGE]) == {D.ADDED}
    assert not ((d.data_parallel == 1) & (d.zero_stage == 0)).any()
    assert D.diff_max_batch(new, old)[D.CHANGE].tolist() == [D.REMOVED] * 12


def test_target_speaks_of_layouts(layouts):
    # batch 4 at the layout asked (selective, TP 1, ZeRO 1) fits no GPU. Per GPU the fewest changes that fit, recipe
    # first: on the A100 40GB selective checkpointing holds 3 at best (TP 4, ZeRO 3: memory outside the allocator
    # includes an NCCL communicator per parallel group), so it needs full checkpointing and TP 4; the H100 TP 4
    # alone (8): the answer
    sc = parse_scenario_text(LAYOUTS + "target: {batch: 4, seq_len: 4096}\n")
    page, rows = _page(sc, layouts)
    a100, h100 = rows.values()
    assert a100["recipe (* not as asked)"] == "bf16-master adamw, full checkpointing, TP 4 + SP · PP 1 · DP 8 · ZeRO 1 *"
    assert h100["recipe (* not as asked)"].endswith("TP 4 + SP · PP 1 · DP 8 · ZeRO 1 *")
    assert page["answer"] == ("32 × H100 SXM5 80GB (H100 80GB HBM3) with bf16-master adamw, selective checkpointing, "
                              "TP 4 + SP · PP 1 · DP 8 · ZeRO 1 (not the recipe asked: TP 4; the recipe asked fits no "
                              "GPU listed).")

def test_a_layout_names_its_fsdp_version_where_fsdp_shards_it():
    sc = parse_scenario_text(
        "model: {preset: llama-3.2-1b}\nmode: train\n"
        "grid: {batch: 1, seq_len: 1024, precision: bf16, optimizer: adamw}\n"
        "parallel: {data_parallel: 8, zero_stage: [1, 3], fsdp_version: [1, 2]}\ngpus: [h100-sxm]\n")
    row = {C.TENSOR_PARALLEL: 1, C.PIPELINE_PARALLEL: 1, C.DATA_PARALLEL: 8}
    assert points.layout_text(sc, {**row, C.ZERO_STAGE: 3, C.FSDP_VERSION: 1}) == "TP 1 · PP 1 · DP 8 · ZeRO 3 · FSDP1"
    assert points.layout_text(sc, {**row, C.ZERO_STAGE: 3, C.FSDP_VERSION: 2}).endswith("ZeRO 3 · FSDP2")
    assert points.layout_text(sc, {**row, C.ZERO_STAGE: 1, C.FSDP_VERSION: 1}).endswith("ZeRO 1")  # not FSDP's
