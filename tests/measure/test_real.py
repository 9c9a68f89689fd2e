"""The GPU path run on the CPU with real tensors (measure/real.py with the HostMeter, issue 19): what a GPU will run
is known to work before a GPU appears, and its allocated figures are PyTorch's own (MemTracker's)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch", reason="the [measure] extra (torch) is not installed")
pytest.importorskip("transformers", reason="the [measure] extra (transformers) is not installed")

from nnmem_sweep.measure.scenario_points import tracker_leftover  # noqa: E402
from nnmem_sweep.measure.build import measure_case  # noqa: E402
from nnmem_sweep.measure.kit import case_of, fresh_probe, load_points, main as kit_main, tiny  # noqa: E402
from nnmem_sweep.measure.real import least_capacity, measure_point, probe_here, run_once  # noqa: E402
from nnmem_sweep.measure.meters import HostMeter  # noqa: E402

POINTS = {p["id"]: p for p in load_points("validation/gpu.yaml")}


def _tiny(point_id):
    return tiny(case_of(POINTS[point_id]))


def tracker_leftovers(case) -> int:
    """What MemTracker keeps alive of a checkpointed LoRA run at the peak (step 2's backward: one pair;
    measure/scenario_points.tracker_leftover); a real run frees it."""
    return tracker_leftover(case, (case.get("hf_config") or {}).get("hidden_size", 0))  # 0: no adapters, no pair


@pytest.mark.parametrize("point_id", [p for p in POINTS if not POINTS[p].get("resume")])
def test_host_meter_allocated_equals_memtracker(point_id):
    """Every kit point at its dry-run size: the peak the real-tensor run counts is the peak PyTorch's MemTracker
    measures under FakeTensorMode, to the byte (less what MemTracker itself keeps alive)."""
    case = _tiny(point_id)
    rec = measure_point(case, "cpu", timing_steps=0, bisect=False)
    tracked = measure_case(case, fake=True)
    assert rec["max_allocated"] == tracked["peak_bytes"] - tracker_leftovers(case)
    assert rec["max_reserved"] == rec["max_allocated"]  # the host has no caching allocator
    assert rec["outside_bytes"] is None


def test_steps_and_parts_are_recorded_per_phase():
    case = _tiny("llama-3.2-1b-bf16-adamw-b4-s2048")
    rec = measure_point(case, "cpu", timing_steps=2, bisect=False)
    steps = [p for p in rec["parts"] if p["part"] == "step"]
    assert [p["step"] for p in steps] == [1, 2, 3, 4]
    assert set(steps[0]["phases"]) == {"forward", "backward", "optimizer"}
    # the measured peak is over the two measured steps, the timed ones add none
    assert rec["max_allocated"] == max(p["max_allocated"] for p in steps[:2])
    assert rec["tokens_per_s"]["train"] > 0
    infer = measure_point(_tiny("llama-3.2-1b-infer-bf16-b16-p2048-d64"), "cpu", bisect=False)
    assert [p["part"] for p in infer["parts"]] == ["prefill", "decode", "decode"]
    assert set(infer["tokens_per_s"]) == {"prefill", "decode"}


def test_resumed_run_holds_the_state_before_the_first_step():
    """resume: the optimizer state is loaded before step 1 (as load_state_dict does); a fresh run makes it in
    step 1. The bytes before the first step differ by exactly the state."""
    case = _tiny("llama-3.2-1b-bf16-adamw-b4-s2048")
    fresh = measure_point(case, "cpu", timing_steps=0, bisect=False)
    resumed = measure_point(case, "cpu", timing_steps=0, bisect=False, resume=True)
    state = resumed["totals"]["optimizer_state_bytes"]
    assert state > 0 and state == fresh["totals"]["optimizer_state_bytes"]
    assert resumed["before_bytes"] - fresh["before_bytes"] == state


def test_least_capacity_on_the_host_is_the_peak_within_the_resolution():
    """The host meter refuses the allocation that crosses its cap, so the least capacity of a run is its peak:
    the bisection must land within one resolution step above it."""
    case = _tiny("qwen3-0.6b-bf16-adamw-b8-s2048")
    meter = HostMeter()
    peak = run_once(case, meter, 2)["records"]
    peak = max(r["max_allocated"] for r in peak)
    need, probes = least_capacity(probe_here(case, meter, 2), peak // 2, 2 * peak, resolution=0.01)
    assert peak <= need <= peak + int(0.01 * 2 * peak)
    assert any(not p["completed"] for p in probes) and any(p["completed"] for p in probes)
    assert meter.cap is None  # the cap is lifted afterwards


def _threshold(need, calls):
    def probe(cap):
        calls.append(cap)
        return cap >= need
    return probe


def test_a_right_guess_is_confirmed_in_two_runs():
    """The first probes are at the guess (the allocator model's need on the run's own recording) and one step below:
    where the model is right, that is the whole bisection."""
    calls = []
    low, high, need = 1_000_000 - 1, 1_600_000, 1_234_567
    step = int(0.005 * high)
    got, probes = least_capacity(_threshold(need, calls), low, high, guess=need)
    assert got == need and calls == [need, need - step]
    assert [p["completed"] for p in probes] == [True, False]


@given(need=st.integers(1_000_000, 1_600_000), guess=st.one_of(st.none(), st.integers(900_000, 1_700_000)))
@settings(max_examples=300, deadline=None)
def test_the_bisection_lands_within_one_step_above_the_need(need, guess):
    """Whatever the guess (none, right, too low, too high, outside the bracket): the answer completes, and nothing a
    step or more below it does; no cap is probed twice."""
    calls = []
    low, high = 999_999, 1_600_000
    step = int(0.005 * high)
    got, _ = least_capacity(_threshold(need, calls), low, high, guess=guess)
    assert need <= got < need + step + 1 and got >= need
    assert len(calls) == len(set(calls)) and len(calls) <= 10


def test_a_fresh_probe_is_a_capped_run_in_a_process_of_its_own():
    """kit.fresh_probe, as a DeepSpeed point's bisection makes its runs (here a dry run's tiny point, no DeepSpeed
    needed): a cap above the run's peak completes, one below it runs out of memory."""
    point = POINTS["llama-3.2-1b-bf16-adamw-b4-s2048"]
    peak = max(r["max_allocated"] for r in run_once(_tiny(point["id"]), HostMeter(), 2)["records"])
    probe = fresh_probe(point, Path("validation/gpu.yaml"), dry=True)
    assert probe(peak) is True and probe(peak - 1) is False


def test_kit_dry_run_measures_every_point(tmp_path):
    """`make gpu-check DRY=1`: every shipped point at its tiny size on the CPU, the allocator-setting point in a
    child process; one results line each, the env file written."""
    assert kit_main(["validation/gpu.yaml", "--dry-run", "--out", str(tmp_path), "--budget", "600"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in lines) == sorted(POINTS)
    for r in lines:
        assert "error" not in r, (r["id"], r.get("error"))
        assert r["max_allocated"] > 0
        if r["case"]["mode"] == "train":
            assert r["max_allocated"] <= r["least_capacity"] <= r["max_allocated"] * 1.1, r["id"]
    child = next(r for r in lines if POINTS[r["id"]].get("allocator"))
    assert child["env"]["alloc_conf"] == POINTS[child["id"]]["allocator"]
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["device"] == "cpu" and env["torch"] == torch.__version__
    # the code that ran, named without git: the digest of the package's sources, which changes with any of them
    from nnmem_sweep.measure.kit import code_digest
    assert env["code_sha256"] == code_digest() and len(env["code_sha256"]) == 64
    assert child["others_bytes"] == 0  # the parent's memory on the device, taken off by the child (none on the CPU)


def test_the_code_digest_changes_with_any_source(tmp_path):
    from nnmem_sweep.measure.kit import code_digest
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    before = code_digest(tmp_path)
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert code_digest(tmp_path) != before and len(before) == 64


def test_kit_with_no_budget_lists_every_point_as_not_run(tmp_path):
    assert kit_main(["validation/gpu.yaml", "--dry-run", "--out", str(tmp_path), "--budget", "0"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(lines) == len(POINTS) and all(r["error"].startswith("not run") for r in lines)


def test_several_points_files_run_in_one_budget_each_into_its_own_folder(tmp_path):
    """`make gpu-check POINTS="A B"`: a lent GPU's minutes run every file in one command; each file's points land in
    their own folder (DIR/<name> under --out), with its own env.json, in the order given; a spent budget lists the
    rest of every file as not run."""
    import yaml
    one = {p["id"]: p for p in load_points("validation/gpu.yaml")}["qwen3-0.6b-bf16-adamw-b8-s2048"]
    lora = load_points("validation/gpu-lora.yaml")[1]
    (tmp_path / "gpu-a.yaml").write_text(yaml.safe_dump({"points": [one]}))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"points": [lora]}))
    files = [str(tmp_path / "gpu-a.yaml"), str(tmp_path / "b.yaml")]
    assert kit_main(files + ["--dry-run", "--out", str(tmp_path / "o"), "--budget", "600"]) == 0
    for name, point in (("a", one), ("b", lora)):
        (rec,) = [json.loads(x) for x in (tmp_path / "o" / name / "results.jsonl").read_text().splitlines()]
        assert rec["id"] == point["id"] and "error" not in rec and rec["max_allocated"] > 0
        assert json.loads((tmp_path / "o" / name / "env.json").read_text())["device"] == "cpu"
    assert kit_main(files + ["--dry-run", "--out", str(tmp_path / "spent"), "--budget", "0"]) == 0
    for name in ("a", "b"):
        (rec,) = [json.loads(x) for x in (tmp_path / "spent" / name / "results.jsonl").read_text().splitlines()]
        assert rec["error"].startswith("not run")


def test_another_points_files_default_folder_is_named_after_it():
    """validation/gpu.yaml's results go to validation/gpu/<gpu>/<date>/, another file's beside it with its name:
    two files measured on one day do not mix their results."""
    from nnmem_sweep.measure.kit import out_folder
    env = {"gpu": "NVIDIA H100 80GB HBM3", "device": "cuda", "date": "2026-11-27T01:00:00Z"}
    base = Path("validation/gpu/nvidia-h100-80gb-hbm3")
    assert out_folder(Path("validation/gpu.yaml"), env, None, several=True) == base / "2026-11-27"
    assert out_folder(Path("validation/gpu-fsdp.yaml"), env, None, several=False) == base / "2026-11-27-fsdp"
    assert out_folder(Path("mine.yaml"), env, Path("o"), several=False) == Path("o")
    assert out_folder(Path("mine.yaml"), env, Path("o"), several=True) == Path("o/mine")


@pytest.mark.parametrize("text, message", [
    ("points: []\n", "non-empty `points:` list"),
    ("points:\n  - {id: a, mode: train}\n", "points[0] needs id, mode and model"),
    ("points:\n  - {id: a, mode: train, model: gpt2}\n  - {id: a, mode: train, model: gpt2}\n", "appears twice"),
    ("points: [\n", "not valid YAML"),
])
def test_a_bad_points_file_is_one_line_and_exit_2(tmp_path, capsys, text, message):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    assert kit_main([str(f), "--dry-run", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and err.startswith(f"gpu-check: {f}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_the_kit_refuses_without_a_gpu(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "nnmem_sweep.measure.kit", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": "."})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "no CUDA device is visible" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_the_run_at_the_least_capacity_is_recorded_under_that_cap(monkeypatch, tmp_path):
    """On a GPU, after the bisection, one more run at the least capacity found is recorded (<name>-capped.pickle):
    under exactly that cap, the cap lifted afterwards, and a run that runs out of memory this time is said, not
    recorded. The CUDA calls are stood in for here; the order of what happens is what is checked."""
    import contextlib

    import torch

    from nnmem_sweep.measure import real

    calls: list = []

    class Meter:
        def limit(self, nbytes):
            calls.append(("limit", nbytes))

        def release(self):
            calls.append(("release",))

    @contextlib.contextmanager
    def recording(path, device):
        calls.append(("record", path.name, device))
        yield
        path.write_bytes(b"snapshot")

    monkeypatch.setattr(real, "_snapshot", recording)
    monkeypatch.setattr(real, "run_once", lambda case, meter, steps, state: calls.append(("run", steps)))
    snap = tmp_path / "point.pickle"
    out = real._capped_snapshot({}, Meter(), 2, None, 123_456, snap)
    assert out == {"capped_snapshot": "point-capped.pickle"} and (tmp_path / "point-capped.pickle").exists()
    assert calls[:4] == [("limit", 123_456), ("record", "point-capped.pickle", "cuda"), ("run", 2), ("limit", None)]

    def oom(*a):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(real, "run_once", oom)
    calls.clear()
    out = real._capped_snapshot({}, Meter(), 2, None, 99, tmp_path / "other.pickle")
    assert out == {"capped_snapshot_note": "the run at 99 B ran out of memory this time: not recorded"}
    assert not (tmp_path / "other-capped.pickle").exists() and ("limit", None) in calls

    def broken(*a):  # anything else (a recording the driver refuses, a bug): said in one line, nothing left behind
        raise RuntimeError("CUDA error: an illegal memory access\nwas encountered")

    monkeypatch.setattr(real, "run_once", broken)
    calls.clear()
    out = real._capped_snapshot({}, Meter(), 2, None, 77, tmp_path / "third.pickle")
    assert out == {"capped_snapshot_note": "the run at 77 B failed (RuntimeError: CUDA error: an illegal memory "
                                           "access was encountered): not recorded"}
    assert not (tmp_path / "third-capped.pickle").exists() and calls[-2:] == [("limit", None), ("release",)]


FSDP_POINTS = {p["id"]: p for p in load_points("validation/gpu-fsdp.yaml")}


@pytest.mark.parametrize("point_id", list(FSDP_POINTS))
def test_a_sharded_kit_point_runs_one_rank_and_counts_what_fsdpmemtracker_counts(point_id):
    """validation/gpu-fsdp.yaml's points, at their dry-run size: one rank of the FSDP step on the fake process
    group (the kit opens it around the point: measure_point), with real tensors; its peak is FSDPMemTracker's under
    FakeTensorMode to the byte, and its optimizer state is the rank's half (AdamW's two moments of every trainable
    parameter, over 2 ranks)."""
    case = tiny(case_of(FSDP_POINTS[point_id]))
    rec = measure_point(case, "cpu", timing_steps=0, bisect=False)
    assert rec["max_allocated"] == measure_case(case, fake=True)["peak_bytes"]
    whole = measure_point({k: v for k, v in case.items() if k != "fsdp"}, "cpu", timing_steps=0, bisect=False)
    # each rank holds half of every moment; the fp32 `step` scalars (one per trainable tensor, FSDP1: one per flat
    # parameter, under adapters one per adapter, each a unit of its own) are whole on each
    steps = whole["totals"]["optimizer_state_bytes"] - 2 * (whole["totals"]["optimizer_state_bytes"] -
                                                            rec["totals"]["optimizer_state_bytes"])
    flat = case["fsdp"].get("version") == 1 and not case.get("finetune")
    assert (-4096 < steps < 0) if flat else (0 <= steps < 4096)


DEEPSPEED_POINTS = {p["id"]: p for p in load_points("validation/gpu-deepspeed.yaml")}


@pytest.mark.parametrize("point_id", list(DEEPSPEED_POINTS))
def test_a_deepspeed_kit_point_runs_one_rank_of_its_engine(point_id):
    """validation/gpu-deepspeed.yaml's points, at their dry-run size, in a process of their own (DeepSpeed keeps its
    first process group for the process: the kit runs each in a child): one rank of DeepSpeed's engine, whose
    optimizer state is AdamW's two fp32 moments over the rank's partition of what trains, and its step counter."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (deepspeed==0.19.8, DS_BUILD_OPS=0)")
    case = tiny(case_of(DEEPSPEED_POINTS[point_id]))
    code = ("import json, sys; from nnmem_sweep.measure.real import measure_point; "
            "rec = measure_point(json.loads(sys.argv[1]), 'cpu', timing_steps=0, bisect=False); "
            "print(json.dumps({k: rec[k] for k in ('max_allocated', 'totals')}))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(case)], capture_output=True, text=True, check=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    rec = json.loads(done.stdout.strip().splitlines()[-1])
    from nnmem_sweep.workload.build import build_model, case_config

    plain = {**{k: v for k, v in case.items() if k != "deepspeed"}, "precision": "bf16"}  # as the engine builds it
    model = build_model(plain, case_config(case)[0], fake=True)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    world = case["deepspeed"]["world"]
    assert rec["totals"]["optimizer_state_bytes"] in {2 * 4 * -(-trained // world) + 4 * k for k in (1, 2)}
    assert rec["max_allocated"] > 2 * case["deepspeed"]["reduce_bucket_size"]  # its reduce bucket, 16-bit


@pytest.mark.parametrize("stage", [2, 3])
def test_a_deepspeed_run_lets_its_engine_go_at_zero_2_not_at_zero_3(stage):
    """After a run (real.run_once, which ends in zero_engine.destroy) and a collection: ZeRO-2's engine is gone;
    ZeRO-3's is still held once a second step has run (DeepSpeed 0.19.8: its parameter coordinator's class-level
    lru_cache, used once its trace of the parameters is complete), which is why the
    kit makes each capped run of a DeepSpeed point in a process of its own (kit.fresh_probe). A DeepSpeed release
    that lets it go fails this test: the kit could then probe in one process again."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (deepspeed==0.19.8, DS_BUILD_OPS=0)")
    point = next(p for p in DEEPSPEED_POINTS.values() if p["deepspeed"]["zero_stage"] == 3 and "finetune" not in p)
    case = tiny(case_of(point))
    case["deepspeed"] = {**case["deepspeed"], "zero_stage": stage}
    code = ("import gc, json, sys; from deepspeed.runtime.engine import DeepSpeedEngine; "
            "from nnmem_sweep.measure import real; from nnmem_sweep.measure.meters import HostMeter; "
            "from nnmem_sweep.workload import zero_engine; case = json.loads(sys.argv[1]); "
            "ctx = zero_engine.rank_comm(case['deepspeed']); ctx.__enter__(); "
            "[real.run_once(case, HostMeter(), 2) for _ in range(2)]; gc.collect(); "
            "print(sum(isinstance(o, DeepSpeedEngine) for o in gc.get_objects()))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(case)], capture_output=True, text=True, check=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    alive = int(done.stdout.strip().splitlines()[-1])
    assert alive == (0 if stage == 2 else 2)


def test_a_bracket_no_run_completes_in_is_no_measurement():
    """Every probe out of memory, the top of the bracket too (as each of the H100's first DeepSpeed runs did): the
    bisection raises instead of answering its unprobed top."""
    from nnmem_sweep.measure.real import NoneCompleted

    calls = []
    with pytest.raises(NoneCompleted):
        least_capacity(_threshold(10**12, calls), 999_999, 1_600_000)
    assert calls[-1] == 1_600_000 and len(calls) == len(set(calls))


def test_a_probe_in_its_own_process_records_the_run_at_the_least_capacity(tmp_path):
    """A DeepSpeed point's run at its least capacity is recorded by a probe in a process of its own (kit
    fresh_probe's --record), kept where it completed; one that runs out of memory this time, or fails, is said."""
    from nnmem_sweep.measure import real

    def probe(cap, record=None):
        record.write_bytes(b"snapshot")
        if cap == 2:
            raise RuntimeError("the run capped at 2 B failed (exit code 1)")
        return cap >= 100

    assert real._capped_by(probe, 123, tmp_path / "p.pickle") == {"capped_snapshot": "p-capped.pickle"}
    assert (tmp_path / "p-capped.pickle").read_bytes() == b"snapshot"
    out = real._capped_by(probe, 99, tmp_path / "q.pickle")
    assert out == {"capped_snapshot_note": "the run at 99 B ran out of memory this time: not recorded"}
    assert not (tmp_path / "q-capped.pickle").exists()
    out = real._capped_by(probe, 2, tmp_path / "r.pickle")
    assert out["capped_snapshot_note"].startswith("the run at 2 B failed (RuntimeError: the run capped")
    assert not (tmp_path / "r-capped.pickle").exists()


def test_the_kit_runs_every_sharded_point_in_a_process_of_its_own():
    """On the H100 (2026-11-28) each FSDP1 run left 1.3-1.8 GB allocated in the kit's process, so its capped runs
    could not be bisected and the points after it peaked on top of it: every sharded point runs in a child process,
    and the capped runs of a DeepSpeed or FSDP1 point each in one of their own; a one-GPU point in the kit's."""
    from nnmem_sweep.measure.kit import outlives_its_run, own_process

    for pid, p in {**FSDP_POINTS, **DEEPSPEED_POINTS}.items():
        assert own_process(p), pid
        assert outlives_its_run(p) == bool(p.get("deepspeed") or p["fsdp"].get("version") == 1), pid
    assert not any(own_process(p) or outlives_its_run(p) for p in POINTS.values())
