"""LoRA under DeepSpeed's ZeRO-1/2/3 engine from a scenario (issue 22; parallel/states.py _adapter_states, measured in
tests/test_deepspeed_truth.py): what runs, and what is refused in one located line."""
from __future__ import annotations

import textwrap

import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.errors import ScenarioError
from nnmem_sweep.runner import run_scenario


def _text(finetune: str, parallel: str, model: str = "{preset: llama-3.2-1b}") -> str:
    return textwrap.dedent(f"""\
        model: {model}
        mode: train
        finetune: {finetune}
        grid: {{batch: 2, seq_len: 1024, precision: bf16-master, optimizer: adamw, checkpointing: none}}
        gpus: [h100-sxm]
        parallel: {parallel}
        """)


def _rows(finetune: str, parallel: str):
    return run_scenario(parse_scenario_text(_text(finetune, parallel), "lora-ds.yaml"), bands=False).results


LORA = "{method: lora, rank: 16, alpha: 32, targets: [q_proj, v_proj]}"


def test_lora_under_zero2_keeps_the_base_whole_and_shards_the_adapters_states():
    rows = _rows(LORA, "{data_parallel: [2, 4], zero_stage: 2, deepspeed: true}")
    adapters = 1_703_936
    two, four = rows.iloc[0], rows.iloc[1]
    assert two[C.WEIGHTS] == four[C.WEIGHTS] == 2 * (1_235_814_400 + adapters)  # adapters cast to bf16
    assert (two[C.MASTER_WEIGHTS], four[C.MASTER_WEIGHTS]) == (4 * adapters // 2, 4 * adapters // 4)
    assert two[C.OPTIMIZER_STATE] == 2 * two[C.MASTER_WEIGHTS]
    # the measured case of this layout (tests/data/truth/deepspeed/...-qv-adaptermodel-ds2z2-...-s1024): 8,261,341,460 B
    assert abs(two[C.PEAK_ALLOCATED] - 8_261_341_460) <= 64 * 1024


def test_lora_under_zero3_partitions_the_base_and_keeps_the_small_adapters_whole():
    """The scenario's rows of the measured ZeRO-3 case's layout (tests/data/truth/deepspeed/...-qv-adaptermodel-ds2z3-
    ...-s128, measured 5,078,444,820 B at the backward's peak, the reduce bucket kept from the step before): the held
    weights are the base's partition, the adapters whole (each at most 1e5 elements) and their partition; the
    estimate within 0.4 % (test_deepspeed_truth.py)."""
    text = _text(LORA, "{data_parallel: 2, zero_stage: 3, deepspeed: true}").replace("seq_len: 1024", "seq_len: 128")
    (row,) = [r for _, r in run_scenario(parse_scenario_text(text, "lora-ds3.yaml"), bands=False).results.iterrows()]
    adapters = 1_703_936
    gathered = 2 * 1_000_000_000  # stage3_max_live_parameters of bf16 parameters
    assert row[C.WEIGHTS] == 1_235_814_400 + 2 * adapters + adapters + gathered
    assert row[C.MASTER_WEIGHTS] == 4 * adapters // 2
    assert abs(row[C.PEAK_ALLOCATED] - 5_078_444_820) <= 0.004 * 5_078_444_820
    three = "Under ZeRO-3 the frozen base is partitioned"
    from nnmem_sweep.report.assumptions import assumptions

    sc = parse_scenario_text(text, "lora-ds3.yaml")
    (items,) = [g["items"] for g in assumptions(sc)["groups"] if g["title"] == "Fine-tuning"]
    assert three in " ".join(items)
    two = parse_scenario_text(_text(LORA, "{data_parallel: 2, zero_stage: 2, deepspeed: true}"), "lora-ds.yaml")
    (items,) = [g["items"] for g in assumptions(two)["groups"] if g["title"] == "Fine-tuning"]
    assert three not in " ".join(items)


def test_lora_under_zero2_accumulating_keeps_the_adapters_gradient_partition():
    """Two micro-batches under DeepSpeed ZeRO-2 (gradient_accumulation_steps): the second finds the adapters' 16-bit
    gradient partition kept; the measured case (tests/data/truth/deepspeed/...-qv-adaptermodel-ds2z2-accum2-...-s1024):
    8,263,045,396 B at the backward's peak."""
    rows = _rows(LORA, "{data_parallel: 2, zero_stage: 2, deepspeed: true, gradient_accumulation: [1, 2]}")
    one, two = rows.iloc[0], rows.iloc[1]
    assert abs(two[C.PEAK_ALLOCATED] - 8_263_045_396) <= 64 * 1024
    assert two[C.PEAK_ALLOCATED] - one[C.PEAK_ALLOCATED] == 2 * 1_703_936 // 2  # bf16, half of them on a rank


@pytest.mark.parametrize("finetune, parallel, where, words", [
    ("{method: qlora, rank: 16}", "{data_parallel: 2, zero_stage: 2, deepspeed: true}", "finetune",
     "under DeepSpeed is modelled for LoRA on the hand-modelled families"),
    ("{method: lora, rank: 16, adapter_dtype: fp32}", "{data_parallel: 2, zero_stage: 2, deepspeed: true}",
     "finetune.adapter_dtype", "casts the whole model to the model's dtype"),
    (LORA, "{data_parallel: 2, zero_stage: 2, deepspeed: true, tensor_parallel: 2}", "finetune",
     ": tensor_parallel with parallel.deepspeed is not modelled for adapters yet"),
    (LORA, "{data_parallel: 2, zero_stage: 3, deepspeed: true, offload: optimizer}", "parallel.offload",
     "modelled at zero_stage 1 or 2 (ZeRO-Offload"),  # ZeRO-2's runs (tests/test_deepspeed_offload.py)
    (LORA, "{data_parallel: 2, zero_stage: 3, deepspeed: true, offload: optimizer+params}", "parallel.offload",
     "ZeRO-3's offload_param, not modelled for adapters"),
    (LORA, "{data_parallel: 2, zero_stage: 1}", "finetune", ": zero_stage 1 (FSDP shards the gradients with the "
     "optimizer state: 2 or 3) is not modelled for adapters yet"),
])
def test_what_lora_under_deepspeed_does_not_cover_is_one_located_line(finetune, parallel, where, words):
    with pytest.raises(ScenarioError) as e:
        parse_scenario_text(_text(finetune, parallel), "lora-ds.yaml")
    assert any(p.key_path == where and words in p.message for p in e.value.problems), \
        [(p.key_path, p.message) for p in e.value.problems]


def test_the_cluster_search_with_adapters_is_refused_where_it_is_written():
    """It searches full fine-tunes' layouts (tensor, pipeline, data parallelism); it used to pass validation and
    fail while running."""
    text = _text(LORA, "{data_parallel: 2, zero_stage: 2, deepspeed: true}") + "cluster: {global_batch: 64}\n"
    with pytest.raises(ScenarioError) as e:
        parse_scenario_text(text, "lora-ds.yaml")
    (p,) = e.value.problems
    assert (p.key_path, p.line) == ("cluster", 7) and "plans full fine-tunes" in p.message


def test_the_report_says_what_deepspeed_does_to_the_adapters():
    from nnmem_sweep.report.assumptions import assumptions

    sc = parse_scenario_text(_text(LORA, "{data_parallel: 2, zero_stage: 2, deepspeed: true}"), "lora-ds.yaml")
    (items,) = [g["items"] for g in assumptions(sc)["groups"] if g["title"] == "Fine-tuning"]
    text = " ".join(items)
    assert "DeepSpeed's bf16 engine casts the whole model" in text and "the frozen base whole" in text
    one_gpu = parse_scenario_text(_text(LORA, "{gradient_accumulation: 2}"), "lora.yaml")
    (items,) = [g["items"] for g in assumptions(one_gpu)["groups"] if g["title"] == "Fine-tuning"]
    assert "DeepSpeed" not in " ".join(items)


def test_a_deepspeed_layout_is_named_so_in_the_report():
    from nnmem_sweep.report.points import layout_text, reference_point

    sc = parse_scenario_text(_text(LORA, "{data_parallel: 2, zero_stage: 2, deepspeed: true}"), "lora-ds.yaml")
    assert layout_text(sc, reference_point(sc)).endswith("DP 2 · DeepSpeed ZeRO 2")
    fsdp = parse_scenario_text(_text(LORA, "{data_parallel: 2, zero_stage: 2}",
                                     model="{preset: qwen3-0.6b}"), "lora-fsdp.yaml")
    assert layout_text(fsdp, reference_point(fsdp)).endswith("DP 2 · ZeRO 2")


def test_a_max_batch_cell_names_deepspeed_too_and_bucket_sizes_read_as_elements():
    from nnmem_sweep import columns as C
    from nnmem_sweep.report.format import axis_value
    from nnmem_sweep.report.points import layout_text

    sc = parse_scenario_text(_text(LORA, "{data_parallel: 2, zero_stage: 2, deepspeed: true}"), "lora-ds.yaml")
    cell = {C.TENSOR_PARALLEL: 1, C.PIPELINE_PARALLEL: 1, C.DATA_PARALLEL: 2, C.ZERO_STAGE: 2}  # no bucket columns
    assert layout_text(sc, cell) == "TP 1 · PP 1 · DP 2 · DeepSpeed ZeRO 2"
    assert axis_value(C.REDUCE_BUCKET, 500_000_000) == "500,000,000 elements"


def test_the_reports_question_says_the_fine_tune():
    """Page 1 asked which GPU 'trains' the model, where the scenario fine-tunes adapters on a frozen base."""
    from nnmem_sweep.report import decision_options as D
    from nnmem_sweep.report.decision import question_text

    sc = parse_scenario_text(_text(LORA, "{data_parallel: 2, zero_stage: 3, deepspeed: true}"), "lora-ds3.yaml")
    q = D.Question(kind="grid", point={C.BATCH: 2, C.SEQ_LEN: 1024, C.PRECISION: "bf16-master",
                                        C.OPTIMIZER: "adamw"}, has_target=False)
    assert question_text(sc, q).startswith("Which GPU fine-tunes Llama 3.2 1B with LoRA (rank 16) at batch 2 × 1,024")


def test_the_zero_assumption_speaks_of_fsdp2_only_where_a_layout_is_fsdps():
    """A scenario whose every layout is DeepSpeed's printed how FSDP2 shards a model, which none of its rows is."""
    from nnmem_sweep.report.assumptions import assumptions

    def zero_item(finetune: str, parallel: str) -> str:
        text = _text(finetune, parallel)
        if finetune == "none":
            text = text.replace("finetune: none\n", "")
        sc = parse_scenario_text(text, "lora-ds.yaml")
        return next(i for g in assumptions(sc)["groups"] for i in g["items"] if i.startswith("ZeRO partitions"))

    deepspeed = zero_item(LORA, "{data_parallel: 2, zero_stage: 3, deepspeed: true}")
    assert "FSDP2" not in deepspeed and "as the DeepSpeed item below says" in deepspeed
    accumulating = parse_scenario_text(_text(LORA, "{data_parallel: 2, zero_stage: 2, deepspeed: true, "
                                                   "gradient_accumulation: 4}"), "lora-ds.yaml")
    texts = [i for g in assumptions(accumulating)["groups"] for i in g["items"]]
    assert not any("under FSDP" in i for i in texts) and any("Accumulating, ZeRO-1 keeps" in i for i in texts)
    fsdp = zero_item("none", "{data_parallel: 2, zero_stage: 3}")
    assert "modelled as PyTorch's FSDP2 runs it" in fsdp


def test_the_heatmap_names_a_deepspeed_layout_as_the_charts_do():
    """Its rows (the varying axes: here the stage) read 'ZeRO 2' where the charts and the question read 'DP 2 ·
    DeepSpeed ZeRO 2'."""
    from nnmem_sweep.report.tables import max_batch_tables

    sc = parse_scenario_text(_text(LORA, "{data_parallel: 2, zero_stage: [2, 3], deepspeed: true}"), "lora-ds.yaml")
    run = run_scenario(sc, bands=False)
    assert max_batch_tables(run.scenario, run.max_batch)[1]["rows"] == ["DeepSpeed ZeRO 2", "DeepSpeed ZeRO 3"]
