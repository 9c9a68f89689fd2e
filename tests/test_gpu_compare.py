"""A real-GPU run beside the estimate (gpu_compare.py): read as `make accuracy` reads validation/gpu/<gpu>/<date>/.

The run here is written by the test (the figures are made up; what is checked is the comparison): an H100's
env.json as the kit writes it and two points, one of which failed."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from nnmem_sweep import columns as C
from nnmem_sweep import gpu_compare as G
from nnmem_sweep.catalog.gpus import get_gpu
from nnmem_sweep.estimate import estimate_point
from nnmem_sweep.gpu_points import case_of, load_points
from nnmem_sweep.models.presets import hf_dict_for_transformers
from nnmem_sweep.scenario import Overheads

H100_ENV = {"gpu": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "mem_get_info_total": 85_029_158_912,
            "cuda": "13.0", "torch": "2.11.0+cu130", "transformers": "5.17.0", "peft": "0.18.0",
            "date": "2026-11-26T10:00:00Z", "commit": "0123456789abcdef", "nvidia_smi": "NVIDIA H100 80GB HBM3, "
            "580.159.04, 81559 MiB, 0 MiB"}
POINT = "llama-3.2-1b-bf16-adamw-b4-s2048"


def _run(tmp_path, records):
    folder = tmp_path / "validation" / "gpu" / "nvidia-h100-80gb-hbm3" / "2026-11-26"
    folder.mkdir(parents=True)
    (folder / "env.json").write_text(json.dumps(H100_ENV))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def _record(point_id, **figures):
    (p,) = [p for p in load_points("validation/gpu.yaml") if p["id"] == point_id]
    case = case_of(p)
    return {"id": point_id, "why": p["why"], "point": p, "case": case,
            "hf_config": hf_dict_for_transformers(case["model"]), "resume": bool(p.get("resume")), **figures}


def test_the_gpu_is_the_catalog_entry_with_the_measured_capacity():
    gpu = G.gpu_of(H100_ENV)
    assert gpu.id == "h100-sxm" and gpu.memory_bytes == H100_ENV["mem_get_info_total"]
    assert G.runtime_of(H100_ENV) == (("cuda", "13.0"), ("torch", "2.11.0"))


def test_each_point_is_estimated_as_estimate_point_estimates_it(tmp_path):
    measured = {"max_allocated": 30 * 2**30, "max_reserved": 33 * 2**30, "least_capacity": 31 * 2**30,
                "outside_bytes": 520 * 2**20}
    folder = _run(tmp_path, [_record(POINT, **measured),
                             _record("llama-3.2-1b-infer-bf16-b16-p2048-d64", error="OutOfMemoryError: ...")])
    assert G.runs(tmp_path / "validation" / "gpu") == [folder]
    env, df = G.compare_run(folder)
    row, failed = df.to_dict("records")
    assert failed["status"].startswith("OutOfMemoryError")
    gpu = G.gpu_of(H100_ENV)
    est = estimate_point(model="llama-3.2-1b", batch=4, seq_len=2048, precision="bf16", optimizer="adamw",
                         gpu=gpu)
    assert row["estimated_peak_allocated"] == int(est[C.PEAK_ALLOCATED])
    assert row["estimated_allocated"] == int(est[C.PEAK_ALLOCATED]) + int(est[C.ALLOCATOR_EXTRA])
    # reserved: the same estimate with the point's own replayed reserve (or the 5 % default where none is stored)
    ov = Overheads(gpus=(gpu,), runtime=G.runtime_of(H100_ENV), replayed_reserve_fraction=row["reserve_fraction"])
    assert row["estimated_reserved"] == int(estimate_point(model="llama-3.2-1b", batch=4, seq_len=2048,
                                                           precision="bf16", optimizer="adamw", gpu=gpu,
                                                           overheads=ov)[C.RESERVED])
    for _, m, e in G.FIGURES:
        assert row[f"{m}_error"] == pytest.approx((row[e] - measured[m]) / measured[m])
    table = G.format_comparison(env, df)
    assert "NVIDIA H100 80GB HBM3" in table and "torch 2.11.0+cu130" in table and POINT in table
    assert f"{row['max_allocated_error']:+.1%}" in table
    # beside it, the report's training throughput for the point, by hand: MFU 40 % (the sourced default) x the H100
    # SXM's dense bf16 989.5 TFLOP/s / model FLOPs per token, 6N + 12·L·h·s (PaLM Appendix B) with N the parameters
    # of Llama 3.2 1B but its embedding table: 16 layers x (q 2048² + k, v 2048·512 each + o 2048² + MLP 3·2048·8192
    # + 2 norms of 2048) + the final norm 2048 + the tied head 2048·128,256 = 1,235,814,400
    per_token = 6 * 1_235_814_400 + 12 * 16 * 2048 * 2048
    assert row["estimated_mfu"] == 0.40
    assert row["estimated_tokens_per_s"] == pytest.approx(0.40 * 989.5e12 / per_token, rel=1e-12)  # 48,149.7


def test_make_accuracy_says_when_no_run_is_committed(tmp_path):
    (line,) = G.summary_lines(tmp_path)
    assert "none committed yet" in line and "make gpu-check" in line


def test_a_rerun_point_replaces_the_earlier_line(tmp_path):
    folder = _run(tmp_path, [_record(POINT, error="not run: the budget was spent"),
                             _record(POINT, max_allocated=1, max_reserved=1, outside_bytes=None)])
    _, records = G.load_run(folder)
    assert len(records) == 1 and "error" not in records[0]


def test_every_kit_point_is_a_known_gpu_catalog_fit():
    """Each kit point fits one H100 by the estimate, with room for the allocator: the kit is sized for it."""
    h100 = get_gpu("h100-sxm")
    for p in load_points("validation/gpu.yaml"):
        if "module" in p:
            continue
        c = case_of(p)
        if "finetune" in c:
            continue
        est = estimate_point(model=c["model"], mode=c["mode"], batch=c["batch"], seq_len=c["seq_len"],
                             precision=c["precision"], optimizer=None if c["mode"] == "infer" else c["optimizer"],
                             checkpointing=c["checkpointing"], attention=c["attention"],
                             decode_tokens=c["decode_tokens"] or None, gpu=h100)
        assert est[C.TOTAL] < 0.85 * h100.memory_bytes, p["id"]


def test_a_child_process_outside_figure_counts_only_once_the_kit_took_its_parent_off(tmp_path):
    """The first H100 run measured the expandable-segments point in a child process while the parent's CUDA context
    was on the device (1,626 MiB 'outside PyTorch'); the kit now passes what the parent holds (others_bytes) and the
    child takes it off. A child's record without others_bytes is not compared; one with it is."""
    point = "llama-3.2-1b-bf16-adafactor-full-b16-s2048-expandable"
    figures = {"max_allocated": 30 * 2**30, "max_reserved": 33 * 2**30, "least_capacity": 31 * 2**30,
               "outside_bytes": 1_705_377_792}
    folder = _run(tmp_path, [_record(point, **figures), _record(POINT, **figures)])
    _, df = G.compare_run(folder)
    child, parent = df.to_dict("records")
    assert pd.isna(child["outside_bytes"]) and pd.isna(child["outside_bytes_error"])
    assert parent["outside_bytes"] == 1_705_377_792 and parent["outside_bytes_error"] < 0
    (folder / "results.jsonl").write_text(json.dumps(_record(point, others_bytes=904_724_480, **figures)) + "\n")
    (row,) = G.compare_run(folder)[1].to_dict("records")
    assert row["outside_bytes"] == 1_705_377_792


def test_a_least_capacity_no_run_completed_at_is_not_shown_as_measured():
    """The H100's first DeepSpeed run: every probe and the recording at the figure ran out of memory, so the
    figure was the unprobed top of the bracket. It is not compared; one a probe completed at is."""
    probes = [{"cap": 21_688_278_629, "completed": False}, {"cap": 26_594_282_770, "completed": False}]
    bad = {"least_capacity": 26_672_155_852, "bisection": probes,
           "capped_snapshot_note": "the run at 26,672,155,852 B ran out of memory this time: not recorded"}
    need, why = G.measured_least_capacity(bad)
    assert need is None and "not a measurement" in why
    good = {"least_capacity": 18_411_063_160, "bisection": [*probes[:1], {"cap": 18_411_063_160, "completed": True}]}
    assert G.measured_least_capacity(good) == (18_411_063_160, "")
    assert G.measured_least_capacity({"least_capacity": 5, "capped_snapshot": "x-capped.pickle"}) == (5, "")
    assert G.measured_least_capacity({"bisection_note": "bisection stopped between 1 and 2 B"}) == \
        (None, "bisection stopped between 1 and 2 B")


def test_a_sharded_points_outside_figure_has_no_nccl_buffers(tmp_path):
    """One rank on the kit's fake process group makes no NCCL communicator: the estimate compared with what it held
    outside PyTorch is the one-GPU process's (the row a real job plans adds one communicator per group)."""
    folder = _run(tmp_path, [])
    (p,) = [p for p in load_points("validation/gpu-fsdp.yaml") if p["id"] == "qwen3-0.6b-fsdp2z3-bf16-adamw-b4-s2048"]
    case = case_of(p)
    rec = {"id": p["id"], "why": p["why"], "point": p, "case": case,
           "hf_config": hf_dict_for_transformers(case["model"]), "resume": False, "max_allocated": 33 * 2**30, "max_reserved": 36 * 2**30, "outside_bytes": 837 * 2**20}
    (folder / "results.jsonl").write_text(json.dumps(rec) + "\n")
    _, df = G.compare_run(folder)
    row = df.iloc[0]
    full = G.estimate_beside(rec, G.gpu_of(H100_ENV), G.runtime_of(H100_ENV))
    nccl = full["estimated_non_torch"] - row["estimated_non_torch"]
    assert nccl == sum(i.bytes for i in G.nccl_bytes({"data_parallel": 2})) > 10**9
    assert "fake process group" in row["status"] and _missing_speed(row)


def _missing_speed(row) -> bool:
    v = row.get("estimated_tokens_per_s")
    return v is None or v != v


def test_a_runs_summary_says_on_how_many_points_the_least_capacity_was_not_measured(tmp_path):
    """The report's line of a kit run counts the points whose least capacity is no measurement (every capped run out
    of memory, the H100's first DeepSpeed run): left out of the error figures, and said."""
    from nnmem_sweep.report.appendix import _gpu_evidence

    failed = [{"cap": 31 * 2**30, "completed": False}]
    _run(tmp_path, [_record(POINT, max_allocated=30 * 2**30, max_reserved=33 * 2**30, least_capacity=34 * 2**30,
                            outside_bytes=520 * 2**20, bisection=failed,
                            capped_snapshot_note="the run at 1 B ran out of memory this time: not recorded")])
    (line,) = G.run_summaries(tmp_path / "validation" / "gpu")
    assert line["least capacity not measured"] == 1 and line["least capacity"] is None
    (text,) = _gpu_evidence({"snapshots": [], "gpu_runs": [line]})["gpu_runs"]["lines"]
    assert "least capacity not measured on 1 point (" in text and "least capacity median" not in text


def test_a_point_run_on_top_of_an_earlier_runs_tensors_is_compared_net_of_them(tmp_path):
    """The H100's FSDP1 points (2026-11-28) ran one after another in the kit's process and each run left tensors
    behind: the peaks after the first counted them. A record's start_allocated beyond the workspaces the estimate
    counts (an earlier point's cuBLAS workspace) is taken off its peak allocated; its least capacity and reserved,
    which held them too, are no measurement."""
    figures = {"max_allocated": 40 * 2**30, "max_reserved": 44 * 2**30, "least_capacity": 43 * 2**30,
               "outside_bytes": 520 * 2**20}
    folder = _run(tmp_path, [_record(POINT, **figures)])
    (clean,) = G.compare_run(folder)[1].to_dict("records")
    workspaces = clean["estimated_allocated"] - clean["estimated_peak_allocated"]
    assert workspaces > 0
    for start, left in ((workspaces, 0), (workspaces + G.LEFTOVER_FLOOR, 0), (workspaces + 3 * 2**30, 3 * 2**30)):
        (folder / "results.jsonl").write_text(json.dumps(_record(POINT, start_allocated=start, **figures)) + "\n")
        (row,) = G.compare_run(folder)[1].to_dict("records")
        assert row["max_allocated"] == 40 * 2**30 - left
        assert (row["least_capacity"] is None) == bool(left)
        assert ("started on top of" in row["status"]) == bool(left)
    # a run from before the kit recorded it: starts.json beside its results
    (folder / "results.jsonl").write_text(json.dumps(_record(POINT, **figures)) + "\n")
    (folder / G.STARTS).write_text(json.dumps({"start_allocated": {POINT: workspaces + 2**30}}))
    (row,) = G.compare_run(folder)[1].to_dict("records")
    assert row["max_allocated"] == 39 * 2**30


def test_the_committed_starts_are_read_off_their_runs_recordings():
    """A committed starts.json holds, per point, allocated_before of the measured run's recording in the same
    folder's snapshots.zip (nothing else: a figure that could not be checked would not be a measurement)."""
    import pickle
    import zipfile
    from pathlib import Path

    from nnmem_sweep.allocator.snapshot import allocated_before, slim

    files = sorted(Path("validation/gpu").glob(f"*/*/{G.STARTS}"))
    assert files
    for path in files:
        starts = json.loads(path.read_text())["start_allocated"]
        with zipfile.ZipFile(path.with_name("snapshots.zip")) as z:
            for point, start in starts.items():
                assert allocated_before(slim(pickle.loads(z.read(f"{point}.pickle")))) == start, point
