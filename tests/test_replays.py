"""The allocator reserve from replays at the max-batch boundaries (replays.py): the least capacity a step needs in
the allocator model, per recipe, and what the estimate then does with it."""
import dataclasses

import numpy as np
import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.allocator import AllocatorOptions, replay
from nnmem_sweep.config import load_scenario
from nnmem_sweep.replays import RESOLUTION, least_capacity, with_replayed_reserve
from nnmem_sweep.runner import run_scenario
from nnmem_sweep.units import MiB


def test_least_capacity_releases_cached_segments_as_pytorch_does():
    # 20 MiB allocated and freed, then 30 MiB: the free 20 MiB segment cannot hold it, so with memory to spare a
    # second segment is mapped (50 MiB reserved); within 30 MiB the allocator frees the cached segment and retries
    # (release_cached_blocks): the step needs 30 MiB, no reserve at all
    seq = np.array([[0, 20 * MiB], [0, -20 * MiB], [1, 30 * MiB], [1, -30 * MiB]], dtype=np.int64)
    assert replay(seq).peak_reserved_bytes == 50 * MiB
    assert replay(seq, capacity_bytes=30 * MiB).oom is False
    assert replay(seq, capacity_bytes=30 * MiB - 1).oom is True
    peak, need = least_capacity(seq, AllocatorOptions())
    assert peak == 30 * MiB and 30 * MiB <= need <= 30 * MiB + peak // RESOLUTION


def test_models_without_a_stored_sequence_and_given_reserves_are_not_replayed():
    sc = load_scenario("configs/cnn.yaml")  # a layer list: no derived twin
    out = with_replayed_reserve(sc)
    assert out.overheads.replayed_reserve_fraction is None and out.overheads.reserve_fraction == 0.05
    assert out.overheads.reserve_note.startswith("not replayed: no traced allocation sequence of")
    llama = load_scenario("configs/llama.yaml")
    given = dataclasses.replace(llama, overheads=dataclasses.replace(llama.overheads, allocator_reserve_fraction=0.02))
    assert with_replayed_reserve(given) is given


def test_a_hand_modelled_preset_is_replayed_through_its_derived_twin():
    """Llama 3.1 8B is modelled by hand; its twin planned from its own code (shipped plans with their allocation
    sequences) has the same peak, and its replays give the hand model's reserve per recipe."""
    sc = with_replayed_reserve(load_scenario("configs/llama.yaml"))
    ov = sc.overheads
    assert "derived twin" in ov.reserve_note and len(ov.replayed_by_recipe) >= 100
    assert sc.model.kind == "transformer"  # the estimate itself stays the hand model's
    assert ov.replayed_reserve_fraction == max(f for _, f in ov.replayed_by_recipe)


@pytest.fixture(scope="module")
def qwen3():
    return run_scenario(load_scenario("configs/qwen3.yaml"))


def test_each_recipe_takes_the_reserve_its_replay_needs(qwen3):
    ov = qwen3.scenario.overheads
    table = dict(ov.replayed_by_recipe)
    assert len(table) >= 20 and ov.reserve_note.startswith("replayed: ")
    assert ov.replayed_reserve_fraction == max(table.values()) and 0 < min(table.values())
    res = qwen3.results
    keys = res[list(ov.replayed_axes)].astype(str).agg("|".join, axis=1)
    f = keys.map({"|".join(k): v for k, v in table.items()}).fillna(ov.replayed_reserve_fraction).to_numpy()
    reserve = res[C.RESERVED] - res[C.PEAK_ALLOCATED] - res[C.ALLOCATOR_EXTRA]
    assert (reserve.to_numpy() == np.ceil(res[C.PEAK_ALLOCATED].to_numpy() * f).astype(np.int64)).all()
    assert (res[C.TOTAL] == res[C.RESERVED] + res[C.NON_TORCH]).all()


def test_the_replayed_boundary_completes_within_its_capacity(qwen3):
    """A row the estimate says fits, at the boundary, completes in the allocator model within the capacity it has
    there (usable less memory outside the allocator and the library workspaces)."""
    from nnmem_sweep.components.reserve import row_sequence

    from nnmem_sweep.estimate import estimate_frame

    sc, mb, res = qwen3.scenario, qwen3.max_batch, qwen3.results
    cell = mb[mb[C.MAX_BATCH] > 0].sort_values(C.MAX_BATCH).iloc[-1]
    axes = list(sc.overheads.replayed_axes) + [C.GPU]
    same = res[np.logical_and.reduce([res[a].astype(str) == str(cell[a]) for a in axes])].iloc[[0]]
    frame = same[list(C.GRID_AXES) + [C.GPU, C.GPU_MEMORY]].assign(**{C.BATCH: int(cell[C.MAX_BATCH])})
    r = estimate_frame(sc.model, sc.mode, frame.reset_index(drop=True), sc.overheads, sc.headroom)
    _, seq = row_sequence(sc.model, "train", r)
    capacity = int(r[C.USABLE].iloc[0] - r[C.NON_TORCH].iloc[0] - r[C.ALLOCATOR_EXTRA].iloc[0])
    assert bool(r[C.FITS].iloc[0]) and not replay(seq, capacity_bytes=capacity).oom
    assert replay(seq, capacity_bytes=int(r[C.PEAK_ALLOCATED].iloc[0])).oom  # no room for any reserve: it fails


def test_the_uncertainty_band_of_a_replayed_recipe_spans_a_fresh_and_a_resumed_run(qwen3):
    """The optimizer state made inside the first step (the estimate's fresh run) or before it (resumed from a
    checkpoint) moves the reserve a step needs: the report's band for a replayed recipe is the two replays'."""
    from nnmem_sweep.report.uncertainty import FRAGMENTATION, fragmentation_band

    sc = qwen3.scenario
    bands = dict(sc.overheads.replayed_band_by_recipe)
    assert bands.keys() == dict(sc.overheads.replayed_by_recipe).keys()
    for key, f in sc.overheads.replayed_by_recipe:
        lo, hi = bands[key]
        assert 0 <= lo <= f <= hi  # the fresh run's reserve lies in its band
    row = qwen3.results.iloc[0]
    key = tuple(str(row[a]) for a in sc.overheads.replayed_axes)
    assert fragmentation_band(row, sc) == bands.get(key, FRAGMENTATION)


def test_estimate_replays_its_own_point():
    """`nnmem-sweep estimate` takes the reserve its point's replay needs, as `run` does per recipe."""
    from nnmem_sweep.estimate import estimate_point
    from nnmem_sweep.models.presets import load_preset
    from nnmem_sweep.replays import point_reserve

    row = estimate_point(model="llama-3.1-8b", batch=4, seq_len=4096, precision="bf16", optimizer="adamw",
                         gpu="h100-sxm")
    fraction, note = point_reserve(load_preset("llama-3.1-8b"), "train", row)
    assert fraction is not None and 0 < fraction < 0.4 and note.startswith("replayed ")
    assert point_reserve(load_scenario("configs/cnn.yaml").model, "train", row)[0] is None


def test_a_kept_replay_is_not_taken_for_a_plan_of_another_format(monkeypatch, tmp_path):
    """A replay's result is kept in the user's cache under a key naming everything it depends on; the plans'
    FORMAT is part of it: when the derivation's rules change (FORMAT), the same model's new sequence is replayed
    anew, not given the old sequence's reserve."""
    from nnmem_sweep import replays
    from nnmem_sweep.catalog.gpus import get_gpu
    from nnmem_sweep.gpu_compare import estimate_beside
    from nnmem_sweep.gpu_points import case_of, load_points
    from nnmem_sweep.workload.build import case_config

    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(tmp_path))
    seen: list[str] = []
    monkeypatch.setattr(replays, "memo_read", lambda kind, key: seen.append(key) or None)
    monkeypatch.setattr(replays, "memo_write", lambda kind, key, doc: None)
    (p,) = [p for p in load_points("validation/gpu.yaml") if p["id"] == "qwen3-0.6b-bf16-adamw-b8-s2048"]
    case = case_of(p)
    rec = {"id": p["id"], "case": case, "hf_config": case_config(case)[0], "resume": False, "point": p}
    first = estimate_beside(rec, get_gpu("h100-sxm"), ())
    monkeypatch.setattr(replays, "PLAN_FORMAT", replays.PLAN_FORMAT + 1)
    second = estimate_beside(rec, get_gpu("h100-sxm"), ())
    assert len(seen) == 2 and seen[0] != seen[1]
    assert first["reserve_fraction"] == second["reserve_fraction"] is not None  # the same plan: the same reserve


def test_a_sharded_points_reserve_is_its_ranks_own_sequence_on_its_streams():
    """The GPU kit's comparison of a sharded point (validation/gpu-fsdp.yaml) replays the rank's traced sequence, on
    FSDP2's streams, not the whole step of one GPU: the rank's optimizer state (Qwen3 0.6B's fp32 LoRA adapters,
    10,092,544 parameters, two AdamW moments, halved over 2 ranks: 40,370,176 B) is what the replay adds."""
    pytest.importorskip("transformers", reason="the [measure] extra is not installed")
    from nnmem_sweep import accuracy as A
    from nnmem_sweep.derive import stored_only
    from nnmem_sweep.gpu_points import case_of, load_points
    from nnmem_sweep.replays import point_reserve
    from nnmem_sweep.workload.build import case_config

    point = next(p for p in load_points("validation/gpu-fsdp.yaml") if p.get("finetune"))
    inputs = case_of(point)
    case = {"case_id": point["id"], "inputs": inputs, "hf_config": case_config(inputs)[0]}
    with stored_only():  # the kit points' shipped plans (make derive)
        fraction, note = point_reserve(A.architecture_of(case), "train", A.case_frame(case).iloc[0])
    assert fraction is not None and "each block on its stream (3 CUDA streams" in note, note
    assert "S 40,370,176 B" in note


def test_a_deepspeed_points_reserve_is_its_own_traced_step_never_another_layouts_sequence():
    """validation/gpu-deepspeed.yaml's points: a ZeRO-2 rank's reserve is its own step traced with DeepSpeed's engine
    (shipped: replays._deepspeed_rows), a ZeRO-3 rank's the default (no fake run traces it) or, for adapters, what an
    H100 measured of that kind of step, each saying so; before,
    the derived twin's FSDP2 rank sequence (the same data_parallel and zero_stage) would have been replayed for them.
    Their allocated bytes are the hand model of DeepSpeed's engine."""
    pytest.importorskip("transformers", reason="the [measure] extra is not installed")
    from nnmem_sweep.catalog.gpus import get_gpu
    from nnmem_sweep.gpu_compare import estimate_beside
    from nnmem_sweep.gpu_points import case_of, load_points
    from nnmem_sweep.workload.build import case_config

    stages = set()
    for point in load_points("validation/gpu-deepspeed.yaml"):
        case = case_of(point)
        rec = {"id": point["id"], "case": case, "hf_config": case_config(case)[0], "point": point}
        est = estimate_beside(rec, get_gpu("h100-sxm"), ())
        stage = case["deepspeed"]["zero_stage"]
        stages.add(stage)
        if stage == 3 and case.get("finetune"):  # what an H100 measured of LoRA under ZeRO-3 (zero_rows)
            # 16.1 %, rounded up to the bisection's step as a replayed reserve is
            assert est["reserve_fraction"] == 0.165 and est["reserve_note"].startswith("not replayed, measured")
        elif stage == 3:
            assert est["reserve_fraction"] is None and "ZeRO-3 partitions real tensors only" in est["reserve_note"]
        else:
            assert est["reserve_fraction"] is not None and est["reserve_note"].startswith("traced with DeepSpeed")
        assert est["estimated_phase"] == "backward" and est["estimated_allocated"] < get_gpu("h100-sxm").memory_bytes
    assert stages == {2, 3}


def test_a_row_that_accumulates_replays_its_plan_with_the_gradients_kept():
    """A row with gradient_accumulation > 1 replays the plan traced with its gradients kept (zero_grad 'zeros'), as
    its estimate reads it; it replayed the plan without them before. Qwen3 0.6B LoRA over 2 FSDP ranks with 4
    micro-batches: the replayed sequence's peak of live bytes is its twin's without accumulation plus the kept
    adapter gradient shards, 20,185,088 B, or synced at the last micro-batch only, the whole unsharded adapter
    gradients, 40,370,176 B (tests/test_sharded_truth.py)."""
    pytest.importorskip("transformers", reason="the [measure] extra is not installed")
    import json
    from pathlib import Path

    from nnmem_sweep import accuracy as A
    from nnmem_sweep.components.reserve import row_sequences
    from nnmem_sweep.derive import stored_only

    folder = Path("tests/data/truth/sharded")
    peaks = []
    for name in ("qwen3-0.6b-lora-r16-all-fsdp2z3-accum4-train-bf16-adamw-b2-s1024",
                 "qwen3-0.6b-lora-r16-all-fsdp2z3-train-bf16-adamw-b2-s1024",
                 "qwen3-0.6b-lora-r16-all-fsdp2z3-accum4nosync-train-bf16-adamw-b2-s1024"):
        case = json.loads((folder / f"{name}.json").read_text())
        with stored_only():  # the truth cases' shipped plans (the CPU's kernels)
            ((note, seq),) = row_sequences(A.architecture_of(case), "train", A.case_frame(case), device="cpu")
        assert seq is not None, note
        peaks.append(int(np.cumsum(seq[:, 1]).max()))
    assert peaks[0] - peaks[1] == 20_185_088
    # synced at the last micro-batch only (gradient_sync last): the whole unsharded adapter gradients, twice the shards
    assert peaks[2] - peaks[1] == 40_370_176


def test_a_hand_modelled_fsdp_layout_replays_its_twins_rank_once_derived():
    """FSDP's layouts of a hand-modelled preset are replayed through its derived twin's rank (the sharded step
    traced, `nnmem-sweep derive CONFIG`), so without those plans stored the note says how to get them; a layout
    whose rank is not traced (tensor parallelism) says why nothing is replayed."""
    from nnmem_sweep.config import parse_scenario_text
    from nnmem_sweep.derive import stored_only

    text = ("model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: [1, 2], seq_len: 1024, precision: bf16, "
            "optimizer: adamw}\nparallel: {data_parallel: 2, zero_stage: 3, fsdp_version: [1, 2]}\ngpus: [h100-sxm]\n")
    with stored_only():
        note = with_replayed_reserve(parse_scenario_text(text)).overheads.reserve_note
    assert note.startswith("not replayed: Llama 3.2 1B") and "derive it with `nnmem-sweep derive CONFIG`" in note
    tp = text.replace("data_parallel: 2, zero_stage: 3, fsdp_version: [1, 2]", "tensor_parallel: 2")
    note = with_replayed_reserve(parse_scenario_text(tp)).overheads.reserve_note
    assert note.startswith("not replayed: the traced allocation sequences are of one GPU")


def test_a_hand_modelled_ddp_layout_is_not_replayed_from_one_gpus_step():
    """PyTorch DDP's ranks (zero_stage 0) run the whole step beside their allreduce buckets, which the twin's
    one-GPU sequence does not hold: a hand-modelled family's DDP rows keep the default and say why."""
    from nnmem_sweep.config import parse_scenario_text

    sc = parse_scenario_text("model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: 1, seq_len: 1024, "
                             "precision: bf16, optimizer: adamw}\nparallel: {data_parallel: 2}\ngpus: [h100-sxm]\n")
    note = with_replayed_reserve(sc).overheads.reserve_note
    assert note.startswith("not replayed: the traced allocation sequences are of one GPU")


def test_an_offloaded_fsdp1_rows_band_reaches_the_tie_an_h100_recording_showed():
    """LoRA under FSDP1 with CPU offload: the H100's recording (2026-11-28) needs 12.5 % above its peak where the plan
    replays 1.0 % (a tie the plan cannot see: parallel/layout.FSDP1_OFFLOAD_GAP). The decision page's band for such a
    row reaches 12.5 %; the same row without offload keeps its replayed band."""
    pytest.importorskip("transformers", reason="the [measure] extra is not installed")
    from nnmem_sweep import columns as C
    from nnmem_sweep.config import parse_scenario_text
    from nnmem_sweep.parallel.layout import FSDP1_OFFLOAD_TIE
    from nnmem_sweep.report.uncertainty import fragmentation_source
    from nnmem_sweep.runner import run_scenario

    text = ("model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: 2, seq_len: 1024, precision: bf16, "
            "optimizer: adamw}\nfinetune: {method: lora, rank: 16, alpha: 16, targets: [q_proj, v_proj], "
            "adapter_dtype: fp32}\ngpus: [h100-sxm]\nparallel: {data_parallel: 2, zero_stage: 3, fsdp_version: 1, "
            "offload: [optimizer+params, none]}\n")
    result = run_scenario(parse_scenario_text(text))
    bands = {row[C.OFFLOAD]: fragmentation_source(row.to_dict(), result.scenario)
             for _, row in result.results.iterrows()}
    (low, high), whence = bands["optimizer+params"]
    assert whence == "replayed" and high == FSDP1_OFFLOAD_TIE == 0.125 and low < 0.02
    assert bands["none"][0][1] < 0.05 and "12.5%" in result.scenario.overheads.reserve_note
