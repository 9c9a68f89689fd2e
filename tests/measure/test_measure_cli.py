"""`nnmem-sweep measure` on a shipped scenario: measured.csv holds the measurement beside the estimate."""
from __future__ import annotations

import pytest

from nnmem_sweep.errors import UsageError
from nnmem_sweep.measure.scenario_points import parse_points

pytest.importorskip("torch", reason="the [measure] extra (torch) is not installed")
pytest.importorskip("transformers", reason="the [measure] extra (transformers) is not installed")


def test_parse_points():
    assert parse_points(["batch=4", " precision = bf16 "]) == {"batch": "4", "precision": "bf16"}
    with pytest.raises(UsageError, match="unknown axis 'gpus'"):
        parse_points(["gpus=h100"])
    with pytest.raises(UsageError, match="AXIS=VALUE"):
        parse_points(["batch"])


def test_measure_tiny_llama_scenario(tmp_path):
    import pandas as pd

    from nnmem_sweep.cli import main

    rc = main(["measure", "configs/hf.yaml", "--out", str(tmp_path), "--point", "batch=1", "--point", "seq_len=256",
               "--point", "optimizer=sgd", "--limit", "2"])
    assert rc == 0
    df = pd.read_csv(tmp_path / "measured.csv")
    assert list(df["precision"]) == ["fp32", "bf16-mixed"]
    assert (df["status"] == "measured").all()
    cats = [c for c in df.columns if c.startswith("measured_") and c.endswith("_bytes") and c != "measured_peak_bytes"]
    # the category split at the peak adds up to the peak, on every row
    assert (df[cats].sum(axis=1) == df["measured_peak_bytes"]).all()
    assert (df["attention_kernel"] == "flash").all()
    assert df["peak_allocated_bytes"].notna().all()
    assert ((df["peak_allocated_bytes"] - df["measured_peak_bytes"]) / df["measured_peak_bytes"]
            - df["relative_error"]).abs().max() < 1e-12


def test_no_match_is_a_usage_error(tmp_path):
    from nnmem_sweep.cli import main

    assert main(["measure", "configs/hf.yaml", "--out", str(tmp_path), "--point", "batch=3"]) == 2
    assert not (tmp_path / "measured.csv").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is present")
def test_device_cuda_without_a_gpu_is_one_line_and_exit_2(tmp_path, capsys):
    from nnmem_sweep.cli import main

    assert main(["measure", "configs/hf.yaml", "--device", "cuda", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device is visible to torch" in err
    assert not (tmp_path / "m").exists()


def test_cpu_real_allocates_what_memtracker_measures(tmp_path):
    """The GPU path on the CPU (--device cpu-real): real tensors, the same points; its max allocated equals
    MemTracker's peak under FakeTensorMode (--device cpu) to the byte, the estimate beside it."""
    import pandas as pd

    from nnmem_sweep.cli import main

    pts = ["--point", "batch=1", "--point", "seq_len=256", "--point", "optimizer=sgd", "--limit", "2"]
    assert main(["measure", "configs/hf.yaml", "--out", str(tmp_path / "fake"), *pts]) == 0
    assert main(["measure", "configs/hf.yaml", "--device", "cpu-real", "--out", str(tmp_path / "real"), *pts]) == 0
    fake = pd.read_csv(tmp_path / "fake" / "measured.csv")
    real = pd.read_csv(tmp_path / "real" / "measured.csv")
    assert list(real["measured_max_allocated_bytes"]) == list(fake["measured_peak_bytes"])
    assert (real["measured_least_capacity_bytes"] >= real["measured_max_allocated_bytes"]).all()
    err = (real["estimated_allocated"] - real["measured_max_allocated_bytes"]) / real["measured_max_allocated_bytes"]
    assert (err - real["max_allocated_error"]).abs().max() < 1e-12
    assert err.abs().max() < 1e-5  # the CPU estimate of a hand-modelled Llama: exact but the host `step` tensors


def test_measure_runs_the_scenarios_adapters_and_takes_memtrackers_leftover_out(tmp_path):
    """A LoRA scenario is measured as LoRA (the finetune: block reaches the measured step; it used to be dropped,
    so a full fine-tune was measured against a LoRA estimate), and with full checkpointing the bytes MemTracker
    itself keeps (the embedding output and its gradient, FINDINGS.md) are shown and taken out of the error."""
    import pandas as pd

    from nnmem_sweep.cli import main

    cfg = tmp_path / "lora.yaml"
    cfg.write_text(f"""name: tiny LoRA
model:
  name: Tiny Llama
  hf_config: {__import__('pathlib').Path('configs/models/tiny-llama-hf.json').resolve()}
mode: train
grid:
  batch: [2]
  seq_len: [128]
  precision: [bf16]
  optimizer: [adamw]
  checkpointing: [none, full]
finetune:
  method: lora
  rank: 8
  targets: [q_proj, v_proj]
gpus: [t4]
""")
    rc = main(["measure", str(cfg), "--out", str(tmp_path / "m")])
    assert rc == 0
    df = pd.read_csv(tmp_path / "m" / "measured.csv").set_index("checkpointing")
    assert (df["status"] == "measured").all()
    # the adapters' AdamW state, not the whole model's: 2 fp32 moments of r·(in + out) per target and layer
    adapters = 4 * 8 * ((256 + 256) + (256 + 64))  # 4 layers, q (256 -> 256) and v (256 -> 2 x 32)
    assert 2 * 4 * adapters <= df.loc["none", "measured_opt_bytes"] < 2 * 4 * adapters + 4096  # + step scalars
    assert df.loc["none", "memtracker_leftover_bytes"] == 0
    assert df.loc["full", "memtracker_leftover_bytes"] == 2 * 2 * 256 * 2 * 128  # r·h per token, twice
    assert df["relative_error"].abs().max() < 1e-3


def test_sharded_rows_are_skipped_with_their_reason(tmp_path):
    import pandas as pd

    from nnmem_sweep.cli import main

    cfg = tmp_path / "dp.yaml"
    cfg.write_text(f"""name: tiny dp
model:
  hf_config: {__import__('pathlib').Path('configs/models/tiny-llama-hf.json').resolve()}
mode: train
grid:
  batch: [1]
  seq_len: [128]
  precision: [bf16]
  optimizer: [adamw]
parallel:
  data_parallel: [1, 2]
  zero_stage: 3
gpus: [t4]
""")
    assert main(["measure", str(cfg), "--out", str(tmp_path / "m")]) == 0
    df = pd.read_csv(tmp_path / "m" / "measured.csv").set_index("data_parallel")
    assert df.loc[1, "status"] == "measured"
    assert df.loc[2, "status"].startswith("skipped: data_parallel 2: measure runs one GPU's step")


def test_an_alias_bomb_is_refused_by_measure_as_by_run(tmp_path, capsys):
    """measure reads the scenario's `runtime:` block before loading it, within load_scenario's limits: an alias bomb
    is the same one line naming the file (exit 2), never expanded in memory."""
    from nnmem_sweep.cli import main

    bomb = ["a: &a [x, x, x, x, x, x, x, x, x, x]"] + \
        [f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]" for p, c in zip("abcdefgh", "bcdefghi")]
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text("\n".join(bomb) + "\n")
    assert main(["measure", str(cfg), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{cfg}: ") and "alias bomb" in err
    assert not (tmp_path / "m").exists()


def test_the_side_child_says_a_scenario_error_in_its_lines(tmp_path, capsys):
    """The child Python of a scenario measured with other releases prints a ScenarioError's problems one per line
    and exits 2, as the CLI does (it caught only UsageError before, and a bad scenario was a traceback)."""
    import json

    from nnmem_sweep.measure.scenario_points import child

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: [1], seq_len: [256]}\ngpus: [no-such]\n")
    assert child([json.dumps([str(cfg), str(tmp_path / "m"), [], 2, "cpu", False])]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(ln.startswith(f"{cfg}:") for ln in lines), lines
    assert any("no-such" in ln for ln in lines), lines


def test_memtrackers_leftover_is_the_embedding_outputs_pair_in_its_dtype():
    """One rule for every place that takes MemTracker's own leftover out (measure/scenario_points.tracker_leftover):
    a checkpointed adapter run keeps the embedding output and its gradient, b·s·h elements each, per finished step,
    in the residual stream's dtype: bf16 2 B, bf16-mixed 4 B (fp32 weights), QLoRA 4 B (its embeddings cast to fp32
    by prepare_model_for_kbit_training) whatever the recipe."""
    from nnmem_sweep.measure.scenario_points import tracker_leftover

    case = {"mode": "train", "checkpointing": "full", "precision": "bf16", "batch": 2, "seq_len": 128,
            "finetune": {"method": "lora"}}
    h = 256
    assert tracker_leftover(case, h) == 2 * 2 * 2 * 128 * 256 == 262_144
    assert tracker_leftover(dict(case, precision="bf16-mixed"), h) == 2 * 4 * 2 * 128 * 256
    assert tracker_leftover(dict(case, finetune={"method": "qlora"}), h) == 2 * 4 * 2 * 128 * 256
    assert tracker_leftover(case, h, pairs=2) == 2 * 262_144  # step 2's optimizer: both steps' pairs
    assert tracker_leftover(dict(case, checkpointing="none"), h) == 0
    assert tracker_leftover({k: v for k, v in case.items() if k != "finetune"}, h) == 0
    assert tracker_leftover(dict(case, mode="infer"), h) == 0
