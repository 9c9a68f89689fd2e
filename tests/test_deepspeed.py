"""DeepSpeed ZeRO's buffers (issue 23): the reduce bucket(s) of ZeRO-1/2 through the backward, ZeRO-3's bucket and
module-by-module gathering, from DeepSpeed's defaults, a mapping or a ds_config JSON ('auto' as transformers'
Trainer fills it). Figures by hand from DeepSpeed's source (parallel/states.py DEEPSPEED_ZERO)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.errors import ScenarioError
from nnmem_sweep.runner import run_scenario

DATA = Path(__file__).parent / "data" / "deepspeed"


def _run(parallel: str, zero: int = 2, optimizer: str = "sgd"):
    text = textwrap.dedent(f"""\
        model: {{preset: llama-3.2-1b}}
        mode: train
        grid: {{batch: 1, seq_len: 128, precision: bf16, optimizer: {optimizer}, checkpointing: none}}
        gpus: [h100-sxm]
        parallel: {{data_parallel: 8, zero_stage: {zero}, {parallel}}}
        """)
    sc = parse_scenario_text(text, "ds.yaml", DATA)
    return sc, run_scenario(sc, bands=False).results.iloc[0]


def test_zero2_keeps_one_reduce_bucket_through_the_backward_two_with_overlap_comm():
    # a short sequence, so the backward's peak is past the loss's moment: 5e8 elements x 2 B (bf16) = 1e9 B a bucket;
    # against the same DeepSpeed layout without a reduce bucket (contiguous_gradients false)
    _, none = _run("deepspeed: {contiguous_gradients: false}")
    _, ds = _run("deepspeed: true")
    _, overlap = _run("deepspeed: {overlap_comm: true}")
    assert none[C.PEAK_PHASE] == ds[C.PEAK_PHASE] == "backward"
    assert ds[C.PEAK_ALLOCATED] - none[C.PEAK_ALLOCATED] == 1_000_000_000
    assert overlap[C.PEAK_ALLOCATED] - none[C.PEAK_ALLOCATED] == 2_000_000_000
    _, small = _run("deepspeed: {reduce_bucket_size: 2.0e+8}")
    assert small[C.PEAK_ALLOCATED] - none[C.PEAK_ALLOCATED] == 400_000_000


def test_deepspeed_true_is_its_defaults_as_axes():
    sc, _ = _run("deepspeed: true")
    assert (sc.parallel[C.REDUCE_BUCKET], sc.parallel[C.OVERLAP_COMM], sc.parallel[C.PREFETCH_BUCKET]) == \
        ((500_000_000,), (False,), (50_000_000,))


def test_zero3_keeps_its_live_parameters_gathered_not_two_blocks():
    # DeepSpeed ZeRO-3 keeps gathered parameters alive up to stage3_max_live_parameters (1e9 elements by default),
    # measured on its engine (tests/test_deepspeed_truth.py): Llama 3.2 1B's 1,235,814,400 parameters are over the
    # cap, so a rank holds its shard (2,471,628,800 B of bf16 over 8 ranks) and 1e9 gathered elements
    _, ds = _run("deepspeed: true", zero=3)
    assert ds[C.WEIGHTS] == 2_471_628_800 // 8 + 1_000_000_000 * 2
    # a stage3_prefetch_bucket_size past the cap: the module in use (the embedding) and the prefetch instead, but
    # never more than the whole model
    _, big = _run("deepspeed: {stage3_prefetch_bucket_size: 8.0e+8}", zero=3)
    assert big[C.WEIGHTS] == 2_471_628_800 // 8 + (262_668_288 + 800_000_000) * 2
    _, whole = _run("deepspeed: {stage3_prefetch_bucket_size: 1.5e+9}", zero=3)
    assert whole[C.WEIGHTS] == 2_471_628_800 // 8 + 2_471_628_800
    # and ZeRO-3's reduce bucket (1e9 B) from the backward on: this row peaks at its first bucket reduced
    # (parallel/zero_bucket.py), the bucket beside the 8 layers' gradients it holds flattened (60,821,504 elements a
    # layer) and the tied head's gradient; without a bucket, at the tied embedding's sum (two V·h gradients)
    _, none = _run("deepspeed: {contiguous_gradients: false}", zero=3)
    assert ds[C.PEAK_PHASE] == "backward"
    assert ds[C.TEMPORARY] == 1_000_000_000 + 8 * 60_821_504 * 2 + 128_256 * 2_048 * 2
    assert none[C.TEMPORARY] == 2 * 128_256 * 2_048 * 2


def test_a_ds_config_json_with_auto_values_is_read_as_transformers_fills_it():
    # reduce_bucket_size 'auto' = hidden^2 = 2048^2; stage3_prefetch_bucket_size 'auto' = 0.9 * 2048^2
    sc, _ = _run("deepspeed: zero3_auto.json", zero=3)
    assert sc.parallel[C.REDUCE_BUCKET] == (4_194_304,)
    assert sc.parallel[C.PREFETCH_BUCKET] == (3_774_873,)
    assert sc.parallel[C.OVERLAP_COMM] == (True,)


@pytest.mark.parametrize("value, words", [
    ("missing.json", "cannot read the DeepSpeed config"),
    ("{reduce_bucket_size: 5.0e+8}, reduce_bucket_size: 1000", "give one or the other"),
])
def test_bad_deepspeed_settings_are_one_located_line(value, words):
    with pytest.raises(ScenarioError) as e:
        _run(f"deepspeed: {value}")
    (p,) = e.value.problems
    assert p.key_path == "parallel.deepspeed" and p.line == 5 and words in p.message


def test_the_last_ranks_first_bucket_by_hand():
    """parallel/zero_bucket.first_bucket: (made before the end, layers before it, head gradient beside it, what a
    tied head adds to the end), counted by hand from the models' tensors."""
    from nnmem_sweep.catalog.precisions import get_precision
    from nnmem_sweep.models.presets import load_preset as get_preset
    from nnmem_sweep.parallel.layout import Layout
    from nnmem_sweep.parallel.zero_bucket import first_bucket, zero1_reduction

    bf16 = get_precision("bf16-master")
    z2 = Layout(dp=8, zero=2, reduce_bucket=500_000_000)
    head_8b = 128_256 * 4_096  # 525,336,576 elements > the bucket: reduced alone, its gradient beside the partition
    assert first_bucket(get_preset("llama-3.1-8b"), bf16, z2) == (1, 0, 2 * head_8b, 0)
    # Llama 3.2 1B (tied): q, o 2048², k, v 512 x 2048, the gated MLP 3 x 2048 x 8192, two norms: 60,821,504 a layer;
    # the bucket holds ⌊(5e8 − 2048) / 60,821,504⌋ = 8 layers before it is reduced; the tied gradient waits
    layer = 2 * 2048 * 2048 + 2 * 512 * 2048 + 3 * 2048 * 8192 + 2 * 2048
    one_b, tied = get_preset("llama-3.2-1b"), 2 * 128_256 * 2_048
    assert (500_000_000 - 2048) // layer == 8
    assert first_bucket(one_b, bf16, Layout(dp=2, zero=2, reduce_bucket=500_000_000)) == (1, 8, tied, tied)
    assert first_bucket(one_b, bf16, Layout(dp=2, zero=2, reduce_bucket=10_000_000)) == (1, 0, tied, tied)
    # every gradient but the tied head's in one bucket (16 layers x 60.8 M < 2e9): reduced at the backward's end
    assert first_bucket(one_b, bf16, Layout(dp=2, zero=2, reduce_bucket=2_000_000_000)) == (0, 0, 0, 0)
    # Mistral 7B: an untied head of 32,000 x 4,096 elements, smaller than the bucket, goes into it (no gradient of
    # its own beside the partition); the final norm's 4,096 and one layer of 218,112,000 fit before it is reduced
    assert (500_000_000 - 32_000 * 4_096 - 4_096) // 218_112_000 == 1
    assert first_bucket(get_preset("mistral-7b"), bf16, z2) == (1, 1, 0, 0)
    # ZeRO-3: every rank holds there, beside the partition it keeps, the 8 layers' gradients flattened
    z3 = Layout(dp=2, zero=3, reduce_bucket=500_000_000)
    assert first_bucket(one_b, bf16, z3) == (0, 8, tied + 8 * layer * 2, 0)  # its partition kept from the step before
    # an untied head larger than the bucket under ZeRO-3: its gradient beside the partition it keeps, not a second one
    assert first_bucket(get_preset("llama-3.1-8b"), bf16, Layout(dp=8, zero=3, reduce_bucket=500_000_000)) == \
        (0, 0, 2 * head_8b, 0)
    # no reduce bucket (contiguous_gradients false): no such moment, but the tied head's gradient is still outside
    # ZeRO-2's partition to the backward's end
    assert first_bucket(one_b, bf16, Layout(dp=2, zero=2, prefetch_bucket=50_000_000)) == (0, 0, 0, tied)
    for other in (Layout(dp=2, zero=1, reduce_bucket=500_000_000), Layout(dp=2, zero=2),
                  Layout(dp=2, zero=2, reduce_bucket=500_000_000, offload="cpu")):
        assert first_bucket(one_b, bf16, other) == (0, 0, 0, 0)  # not DeepSpeed's ZeRO-2/3 on the GPU
    assert zero1_reduction(Layout(dp=2, zero=1, reduce_bucket=10_000_000)) == 1
    assert zero1_reduction(Layout(dp=2, zero=1, reduce_bucket=10_000_000, overlap_comm=True)) == 0
    assert zero1_reduction(z2) == 0


def test_a_ds_configs_offload_devices_are_its_offload_axis():
    """A ds_config JSON that offloads (transformers' ZeRO-2 offload example: offload_optimizer to the cpu, buckets
    'auto') plans its rows with ZeRO-Offload, as `offload: optimizer` does; before, its offload was read by no one
    and the rows kept the optimizer state on the GPU."""
    _, row = _run("deepspeed: zero2_offload.json", optimizer="adamw")
    _, given = _run("deepspeed: {reduce_bucket_size: 4194304}, offload: optimizer", optimizer="adamw")  # 'auto': h·h
    assert row[C.OFFLOAD] == "optimizer" and row[C.PEAK_ALLOCATED] == given[C.PEAK_ALLOCATED]
    assert row[C.OPTIMIZER_STATE] == 0 < row[C.HOST] == given[C.HOST]


@pytest.mark.parametrize("zero, words", [
    ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, "deepspeed's config sets offload (optimizer"),
    ({"stage": 3, "offload_optimizer": {"device": "nvme"}}, "offload_optimizer to nvme (ZeRO-Infinity) is not"),
    ({"stage": 3, "offload_param": {"device": "cpu"}}, "offload_param to cpu without offload_optimizer is not"),
])
def test_an_offload_the_planner_cannot_take_from_a_ds_config_is_one_line(tmp_path, zero, words):
    """Given twice (the config and `offload:`), to NVMe, or the parameters alone: one line at parallel.deepspeed."""
    import json

    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": zero}))
    text = ("model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: 1, seq_len: 128, precision: bf16-master, "
            "optimizer: adamw}\ngpus: [h100-sxm]\nparallel: {data_parallel: 8, zero_stage: %d, deepspeed: ds.json, "
            "offload: none}\n" % zero["stage"])
    if "nvme" in words or "offload_param" in words:
        text = text.replace(", offload: none", "")
    with pytest.raises(ScenarioError) as e:
        parse_scenario_text(text, "ds.yaml", tmp_path)
    assert any(p.key_path == "parallel.deepspeed" and words in p.message for p in e.value.problems), \
        [(p.key_path, p.message) for p in e.value.problems]


def _with_config(tmp_path, zero: dict, parallel: str = "", **top):
    import json

    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": zero, **top}))
    text = ("model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: 1, seq_len: 128, precision: bf16-master, "
            f"optimizer: adamw}}\ngpus: [h100-sxm]\nparallel: {{data_parallel: 8, deepspeed: ds.json{parallel}}}\n")
    return parse_scenario_text(text, "ds.yaml", tmp_path)


def test_a_ds_configs_stage_is_the_zero_stage_its_rows_run_at(tmp_path):
    """A pasted ds_config's zero_optimization.stage plans its rows at that stage where the scenario gives no
    zero_stage (before, it was read by no one and the rows ran at zero_stage 0: nothing partitioned); a stage-3
    config without overlap_comm takes DeepSpeed's default for stage 3, true. The same rows as zero_stage given."""
    sc = _with_config(tmp_path, {"stage": 3})
    assert sc.parallel[C.ZERO_STAGE] == (3,) and sc.parallel[C.OVERLAP_COMM] == (True,)
    assert _with_config(tmp_path, {"stage": 2}).parallel[C.OVERLAP_COMM] == (False,)
    row = run_scenario(_with_config(tmp_path, {"stage": 2}), bands=False).results.iloc[0]
    given = run_scenario(_with_config(tmp_path, {}, ", zero_stage: 2"), bands=False).results.iloc[0]
    assert row[C.ZERO_STAGE] == 2 and row[C.PEAK_ALLOCATED] == given[C.PEAK_ALLOCATED]
    # a sweep of zero_stage that lists the config's stage stands
    assert _with_config(tmp_path, {"stage": 2}, ", zero_stage: [1, 2]").parallel[C.ZERO_STAGE] == (1, 2)
    # its gradient_accumulation_steps likewise, where a number ('auto' is the Trainer's: the scenario's axis)
    assert _with_config(tmp_path, {"stage": 2}, gradient_accumulation_steps=4).parallel[C.GRADIENT_ACCUMULATION] == (4,)
    assert _with_config(tmp_path, {"stage": 2}, gradient_accumulation_steps="auto").parallel[
        C.GRADIENT_ACCUMULATION] == (1,)


@pytest.mark.parametrize("zero, parallel, top, words", [
    ({"stage": 3}, ", zero_stage: 2", {}, "ds.json sets zero_optimization.stage 3, which zero_stage (2) does not list"),
    ({"stage": "auto"}, "", {}, "zero_optimization.stage must be 0, 1, 2 or 3, got 'auto'"),
    ({"stage": 2}, ", gradient_accumulation: [1, 2]", {"gradient_accumulation_steps": 8},
     "ds.json sets gradient_accumulation_steps 8, which gradient_accumulation (1, 2) does not list"),
    ({"stage": 2}, "", {"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be a whole number"),
    ({"stage": 2, "offload_optimizer": "cpu"}, "", {}, 'offload_optimizer must be a mapping such as {"device": "cpu"}'),
])
def test_a_ds_configs_run_the_scenario_contradicts_is_one_line(tmp_path, zero, parallel, top, words):
    with pytest.raises(ScenarioError) as e:
        _with_config(tmp_path, zero, parallel, **top)
    (p,) = e.value.problems
    assert p.key_path == "parallel.deepspeed" and words in p.message, p.message


def test_a_smaller_stage3_max_live_parameters_is_planned_at_the_default_a_larger_is_one_line(tmp_path):
    """ZeRO-3 is planned with DeepSpeed's default of 1e9 gathered elements alive at most: a config's smaller value
    (released sooner) is planned at it, an upper bound the report states; a larger one would be missed, so it is
    refused where it is given, in a config JSON and in a mapping (the schema's bound) alike."""
    rows = [run_scenario(_with_config(tmp_path, {"stage": 3, **live}), bands=False).results.iloc[0]
            for live in ({}, {"stage3_max_live_parameters": 1e8})]
    assert rows[0][C.PEAK_ALLOCATED] == rows[1][C.PEAK_ALLOCATED]
    with pytest.raises(ScenarioError) as e:
        _with_config(tmp_path, {"stage": 3, "stage3_max_live_parameters": 2e9})
    (p,) = e.value.problems
    assert p.key_path == "parallel.deepspeed" and "stage3_max_live_parameters 2,000,000,000 is above" in p.message
    with pytest.raises(ScenarioError) as e:
        _run("deepspeed: {stage3_max_live_parameters: 2.0e+9}", zero=3)
    (p,) = e.value.problems
    assert p.key_path == "parallel.deepspeed.stage3_max_live_parameters"
    assert p.message == "must be at most 1,000,000,000, got 2,000,000,000"  # YAML 2.0e+9 read as the whole number
