"""The reserve DeepSpeed's own ZeRO-1/2 steps need in the caching-allocator model (issue 22): each committed case's
fresh run of two steps on both end ranks (tests/data/truth/deepspeed/sequences/, derive/zero_rows.end_rank_sequences:
DeepSpeed 0.19.8's engine under FakeTensorMode), bisected as the runner bisects a scenario's recipes
(replays.least_capacity). What the report says of DeepSpeed rows (replays.DEEPSPEED_RESERVE_SPAN) is held to them."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nnmem_sweep import accuracy as A
from nnmem_sweep.allocator import AllocatorOptions
from nnmem_sweep.components.runtime import large_cublas_workspace_bytes
from nnmem_sweep.measure.cases import DEEPSPEED_CASES
from nnmem_sweep.measure.truth import SEQUENCES_DIR, end_ranks, sequence_path
from nnmem_sweep.replays import DEEPSPEED_MEASURED_RECIPE, DEEPSPEED_RESERVE_SPAN, RESOLUTION, least_capacity

TRUTH = Path(__file__).parent / "data" / "truth" / "deepspeed"
FOLDER = TRUTH / SEQUENCES_DIR
# ZeRO-Offload's sequences are evidence of their own (tests/test_deepspeed_offload.py)
ZERO12 = [c for c in DEEPSPEED_CASES if c["deepspeed"]["zero_stage"] < 3 and "offload" not in c["deepspeed"]]
RUNS = [(c, r) for c in ZERO12 for r in end_ranks(c)]
RECORDS = {c["case_id"]: c for c in A.load_cases(TRUTH.parent, sharded=True) if c["inputs"].get("deepspeed")}


def _events(case, rank) -> np.ndarray:
    with np.load(sequence_path(FOLDER, case["id"], rank)) as z:
        return z["events"]


@pytest.fixture(scope="module")
def needs() -> dict[tuple[str, int], float]:
    """(case id, rank) -> (least capacity − peak) / peak of its fresh run."""
    out = {}
    for case, rank in RUNS:
        peak, need = least_capacity(_events(case, rank), AllocatorOptions())
        out[case["id"], rank] = (need - peak) / peak
    return out


def test_every_zero12_case_has_a_fresh_sequence_on_both_end_ranks():
    assert len(RUNS) == 2 * len(ZERO12) >= 30
    assert all(sequence_path(FOLDER, c["id"], r).is_file() for c, r in RUNS)
    # the recipe the span is printed for (replays.DEEPSPEED_MEASURED_RECIPE) is every measured case's
    recipes = [{"zero_stage": str(c["deepspeed"]["zero_stage"]), "offload": "none", **c} for c in ZERO12]
    assert all(r[axis] in values for r in recipes for axis, values in DEEPSPEED_MEASURED_RECIPE.items())
    assert {r["checkpointing"] for r in recipes} == set(DEEPSPEED_MEASURED_RECIPE["checkpointing"])
    assert {r["zero_stage"] for r in recipes} == set(DEEPSPEED_MEASURED_RECIPE["zero_stage"])


@pytest.mark.parametrize("case", ZERO12, ids=[c["id"] for c in ZERO12])
def test_a_fresh_runs_second_step_peaks_where_the_measured_step_did(case):
    """The sequence is the measured step's own: its second step's peak of live bytes is the case's measured peak on
    that rank (the first step makes the optimizer state, so it peaks lower or the same) and the two cuBLAS
    workspaces a CUDA run holds from its forward's and its backward's first matrix product on."""
    measured = RECORDS[case["id"]]["measured"]["ranks"]
    workspaces = 2 * large_cublas_workspace_bytes()  # the forward's and the backward's, held at every peak
    for rank in end_ranks(case):
        live = np.cumsum(_events(case, rank)[:, 1])
        peak = max(ph["peak_bytes"] for ph in measured[str(rank)].values())
        assert 0 <= int(live.max()) - workspaces - peak <= 8  # the step counter's few bytes, made in the first step


def test_the_h100_measured_what_its_cases_sequence_needs():
    """The H100 ran this case's shape (validation/gpu-deepspeed.yaml, 2026-11-27): its least capacity is within the
    bisection's step of what the case's sequence, cuBLAS workspaces included, needs on either end rank (without
    them, 4.4 % of the peak where the GPU needed 10.2 %)."""
    import json

    run = Path(__file__).parents[1] / "validation/gpu/nvidia-h100-80gb-hbm3/2026-11-27-deepspeed-run3/results.jsonl"
    (rec,) = [r for r in map(json.loads, run.read_text().splitlines())
              if r["id"] == "llama-3.2-1b-ds2z2-bf16-master-adamw-b2-s1024"]
    case = next(c for c in ZERO12 if c["id"] == "llama-3.2-1b-ds2z2-train-bf16-master-adamw-b2-s1024")
    for rank in end_ranks(case):
        peak, need = least_capacity(_events(case, rank), AllocatorOptions())
        assert abs(need - rec["least_capacity"]) <= 0.005 * rec["least_capacity"]
        assert abs(peak - rec["max_allocated"]) <= 0.001 * rec["max_allocated"]


def test_the_reserve_the_report_states_for_deepspeed_rows_is_what_its_steps_needed(needs):
    """The span DEEPSPEED_RESERVE_SPAN the report prints for DeepSpeed layouts is the span of these replays, to the
    bisection's step; the steps that peak in the optimizer step (short sequences) need the most."""
    low, high = min(needs.values()), max(needs.values())
    assert DEEPSPEED_RESERVE_SPAN == (round(low, 3), round(high, 3))
    assert low >= 0 and high < 0.25
    step_peaking = [needs[c["id"], r] for c, r in RUNS if RECORDS[c["id"]]["measured"]["peak_phase"] == "optimizer"]
    assert max(step_peaking) == high and high > 0.05 + 2 / RESOLUTION  # above the 5 % default: said, not hidden


def test_a_deepspeed_scenario_says_so_and_its_band_is_that_span(monkeypatch, tmp_path):
    """A DeepSpeed layout's rows whose steps are not traced (nothing shipped or cached: tests/test_deepspeed_replays.py
    has the traced ones) keep the default reserve, say what DeepSpeed's measured steps needed, and the decision
    page's band for rows of their recipe (AdamW, no checkpointing) is that span, not the one-GPU range."""
    from nnmem_sweep import replays

    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(tmp_path))
    monkeypatch.setattr(replays, "shipped_replays", dict)
    from nnmem_sweep import columns as C
    from nnmem_sweep.config import parse_scenario_text
    from nnmem_sweep.replays import DEEPSPEED_NOTE
    from nnmem_sweep.report.uncertainty import FRAGMENTATION, fragmentation_source
    from nnmem_sweep.runner import run_scenario

    assert f"{len(ZERO12)} measured cases" in DEEPSPEED_NOTE
    text = ("model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: [1, 2], seq_len: 1024, precision: bf16-master, "
            "optimizer: adamw}\ngpus: [h100-sxm]\nparallel: {data_parallel: 2, zero_stage: [0, 2]%s}\n")
    result = run_scenario(parse_scenario_text(text % ", deepspeed: true"))
    sc = result.scenario
    assert sc.overheads.reserve_note.startswith(DEEPSPEED_NOTE) and sc.overheads.reserve_fraction == 0.05
    assert "not traced yet" in sc.overheads.reserve_note
    rows = result.results
    ds = rows[(rows[C.REDUCE_BUCKET].astype(int) > 0) & (rows[C.ZERO_STAGE].astype(int) == 2)].iloc[0]
    ddp = rows[rows[C.ZERO_STAGE].astype(int) == 0].iloc[0]  # zero_stage 0: PyTorch's DDP, not DeepSpeed's ZeRO
    assert fragmentation_source(ddp.to_dict(), sc) == (FRAGMENTATION, "default")
    assert fragmentation_source(ds.to_dict(), sc) == (DEEPSPEED_RESERVE_SPAN, "deepspeed")
    for unmeasured in ({C.CHECKPOINTING: "selective"}, {C.ZERO_STAGE: 3}):  # none of them measured: the one-GPU range
        assert fragmentation_source(ds.to_dict() | unmeasured, sc) == (FRAGMENTATION, "default")
    plain = run_scenario(parse_scenario_text(text % ""))  # FSDP's layouts of a hand model: the one-GPU range
    assert fragmentation_source(plain.results.iloc[0].to_dict(), plain.scenario) == (FRAGMENTATION, "default")


@pytest.mark.parametrize("kind", ["adapters", "full"])
def test_a_zero3_kinds_reserve_is_what_the_h100_measured(kind):
    """ZeRO-3 is not traced (no fake run partitions): derive/zero_rows.ZERO3_MEASURED is each kind's least capacity
    over its peak allocated on the committed H100 run it names, to 0.1 % (the reserve's rounding)."""
    import json

    from nnmem_sweep.derive.zero_rows import ZERO3_MEASURED

    fraction, run, point = ZERO3_MEASURED[kind]
    path = Path(__file__).parents[1] / "validation" / "gpu" / run / "results.jsonl"
    (rec,) = [r for r in map(json.loads, path.read_text().splitlines()) if r["id"] == point]
    assert "lora" in point if kind == "adapters" else "lora" not in point
    assert any(p["completed"] and p["cap"] == rec["least_capacity"] for p in rec["bisection"])
    assert fraction == round(rec["least_capacity"] / rec["max_allocated"] - 1, 3)


def test_the_lora_zero3_recordings_need_comes_from_its_streams():
    """The LoRA point's recording (tests/data/snapshots, the H100's 2026-11-28 run) needs 16.1 % above its peak in the
    allocator model, a pool per stream, as the GPU needed; folded onto one stream, 1.5 %: a sequence traced without
    DeepSpeed's side streams would miss it, which is why the measured figure stands in."""
    from nnmem_sweep.allocator.snapshot import load, sequence

    doc = load(Path(__file__).parent / "data" / "snapshots" /
               "kit-h100-llama-3.2-1b-lora-r16-qv-ds2z3-bf16-master-adamw-b2-s1024.json.gz")
    seq = sequence(doc, after_release=True)
    peak, need = least_capacity(seq, AllocatorOptions())
    _, folded = least_capacity(np.ascontiguousarray(seq[:, :2]), AllocatorOptions())
    assert round(need / peak - 1, 3) == 0.161 and round(folded / peak - 1, 3) == 0.015


def test_a_zero3_lora_row_takes_the_measured_reserve_and_a_full_one_the_default():
    """measured_zero3: a ZeRO-3 row of adapters takes the H100's 16.1 % with a note naming the point; a full
    fine-tune's measured 3.5 % is below the 5 % default, which holds; ZeRO-2 rows are traced, not this."""
    from nnmem_sweep import columns as C
    from nnmem_sweep.derive.zero_rows import measured_zero3

    row = {C.ZERO_STAGE: 3, C.REDUCE_BUCKET: 500_000_000}
    frac, note = measured_zero3(True, row, 0.05)
    assert frac == 0.161 and "llama-3.2-1b-lora-r16-qv-ds2z3" in note and "16.1%" in note
    assert measured_zero3(False, row, 0.05) is None
    assert measured_zero3(True, {**row, C.ZERO_STAGE: 2}, 0.05) is None


def test_a_lora_zero3_scenario_says_its_reserve_was_measured_not_replayed(monkeypatch, tmp_path):
    """A scenario of LoRA under DeepSpeed ZeRO-3 alone: no row is traced, each takes the H100's measured 16.1 %
    (rounded up to 16.5 % as a replayed reserve is), and its note says so without calling it a replay."""
    from nnmem_sweep import replays

    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(tmp_path))
    monkeypatch.setattr(replays, "shipped_replays", dict)
    from nnmem_sweep.config import parse_scenario_text
    from nnmem_sweep.runner import run_scenario

    text = ("model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: [1, 2], seq_len: 1024, precision: bf16-master, "
            "optimizer: adamw}\nfinetune: {method: lora, rank: 16, targets: [q_proj, v_proj]}\ngpus: [h100-sxm]\n"
            "parallel: {data_parallel: 2, zero_stage: 3, deepspeed: true}\n")
    sc = run_scenario(parse_scenario_text(text)).scenario
    note = sc.overheads.reserve_note
    assert sc.overheads.reserve_fraction == 0.165
    assert not note.startswith("replayed") and "ZeRO-3 rows not replayed, measured" in note and "16.1%" in note
