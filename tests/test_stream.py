"""Streaming runs: chunk by chunk, the same bytes as an in-memory run; failures leave the old files intact."""
from __future__ import annotations

import os

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnmem_sweep import stream
from nnmem_sweep.cli import main
from nnmem_sweep.config import load_scenario, parse_scenario_text
from nnmem_sweep.errors import UsageError
from nnmem_sweep.grid import product_frame
from nnmem_sweep.outputs import read_run_json
from nnmem_sweep.runner import run_scenario, write_outputs

# 3 batches x 2 seq x 2 precision x 3 optimizers x 2 checkpointing x 2 GPUs = 144 rows, 48 max-batch cells
SCENARIO = """\
name: stream test
model: {preset: gpt2}
mode: train
grid:
  batch: [1, 4, 16]
  seq_len: [512, 1024]
  precision: [fp32, bf16-mixed]
  optimizer: [adamw, sgd, adafactor]
  checkpointing: [none, full]
gpus: [t4, h100-sxm]
"""


@pytest.fixture()
def sc():
    return parse_scenario_text(SCENARIO)


def stream_and_run(sc, tmp_path, chunk_rows: int) -> stream.StreamResult:
    """Run in memory into tmp_path/mem, stream into tmp_path/st; every CSV must be the same bytes, so both sets
    have the same run id and file list in run.json."""
    written = write_outputs(run_scenario(sc), tmp_path / "mem")
    r = stream.run_streamed(sc, tmp_path / "st", chunk_rows=chunk_rows)
    assert sorted(os.listdir(tmp_path / "st")) == sorted(p.name for p in written)
    for p in written[:-1]:
        assert (tmp_path / "st" / p.name).read_bytes() == p.read_bytes(), p.name
    mem, st = read_run_json(tmp_path / "mem"), read_run_json(tmp_path / "st")
    assert (st["command"], mem["command"]) == ("run --stream", "run")
    assert (st["run_id"], st["files"]) == (mem["run_id"], mem["files"])
    assert [p.name for p in r.plans] == [p.name for p in written[2:-1]]
    return r


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_slice_product_is_a_slice_of_product_frame(lengths, data):
    names = ["batch", "precision", "seq_len", "optimizer"][:len(lengths)]
    axes = {}
    for name, n in zip(names, lengths):
        axes[name] = tuple(range(1, n + 1)) if name in ("batch", "seq_len") else tuple(f"v{i}" for i in range(n))
    full = product_frame(axes)
    lo = data.draw(st.integers(0, len(full)))
    hi = data.draw(st.integers(lo, len(full)))
    part = stream.slice_product(axes, lo, hi)
    pd.testing.assert_frame_equal(part, full.iloc[lo:hi].reset_index(drop=True))


@pytest.mark.parametrize("chunk_rows", [1, 7, 48, 144, 10_000])
def test_streamed_files_are_byte_identical_to_an_in_memory_run(tmp_path, sc, chunk_rows):
    r = stream_and_run(sc, tmp_path, chunk_rows)
    assert (r.rows, r.cells) == (144, 48)
    res = pd.read_csv(tmp_path / "st" / "results.csv")
    assert r.fits == int(res["fits"].sum())
    assert sorted(os.listdir(tmp_path / "st")) == ["max_batch.csv", "results.csv", "run.json"]
    assert sorted(os.listdir(tmp_path)) == ["mem", "st"]  # no staging folder, no lock left


def test_a_failure_mid_stream_leaves_the_previous_files_and_no_temporary(tmp_path, sc, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("old results\n")
    (out / "max_batch.csv").write_text("old max batch\n")
    real = stream.estimate_frame
    calls = []

    def failing(*a, **k):
        calls.append(1)
        if len(calls) == 3:  # two chunks already appended to the temporary file
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(stream, "estimate_frame", failing)
    with pytest.raises(KeyboardInterrupt):
        stream.run_streamed(sc, out, chunk_rows=10)
    assert (out / "results.csv").read_text() == "old results\n"
    assert (out / "max_batch.csv").read_text() == "old max batch\n"
    assert sorted(os.listdir(out)) == ["max_batch.csv", "results.csv"]


def test_a_grid_over_max_rows_is_refused_before_any_row_is_built(tmp_path, sc, monkeypatch):
    def never(*a, **k):
        raise AssertionError("allocated rows before the size check")

    monkeypatch.setattr(stream, "slice_product", never)
    with pytest.raises(UsageError, match=r"expands to 144 rows, over the limit of 100; .*--max-rows 144"):
        stream.run_streamed(sc, tmp_path, max_rows=100)
    assert not any(tmp_path.iterdir())


def test_ten_million_row_grid_is_refused_by_size_not_by_memory(tmp_path):
    # 1000 batch x 100 seq x 5 x 4 x 5 GPUs = 10,000,000 rows: the check is arithmetic on the axis lengths
    batches = ", ".join(str(b) for b in range(1, 1001))
    seqs = ", ".join(str(128 * s) for s in range(1, 101))
    text = f"""\
name: big
model: {{preset: gpt2}}
grid:
  batch: [{batches}]
  seq_len: [{seqs}]
  precision: [fp32, bf16, fp16, bf16-mixed, bf16-master]
  optimizer: [adamw, sgd, sgd-momentum, adafactor]
gpus: [t4, l40s, a100-80gb, h100-sxm, h200]
"""
    big = parse_scenario_text(text)
    with pytest.raises(UsageError, match="10,000,000 rows, over the limit of 9,999,999"):
        stream.run_streamed(big, tmp_path, max_rows=9_999_999)


@pytest.mark.parametrize("bad", [0, -5, 2.5])
def test_bad_chunk_rows_is_a_usage_error(tmp_path, sc, bad):
    with pytest.raises(UsageError, match="--chunk-rows"):
        stream.run_streamed(sc, tmp_path, chunk_rows=bad)


def test_cli_run_stream_writes_the_same_files_as_run(tmp_path, capsys):
    cfg = tmp_path / "s.yaml"
    cfg.write_text(SCENARIO)
    assert main(["run", str(cfg), "--out", str(tmp_path / "a"), "-q"]) == 0
    assert main(["run", str(cfg), "--out", str(tmp_path / "b"), "-q", "--stream", "--chunk-rows", "5"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed[-3:] == [str(tmp_path / "b" / name) for name in ("results.csv", "max_batch.csv", "run.json")]
    for name in ("results.csv", "max_batch.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert main(["run", str(cfg), "--out", str(tmp_path / "c"), "--stream", "--chunk-rows", "0"]) == 2
    assert "--chunk-rows" in capsys.readouterr().err


def test_shipped_config_streams_like_it_runs(tmp_path):
    sc = load_scenario("configs/llama.yaml")
    write_outputs(run_scenario(sc), tmp_path / "mem")
    stream.run_streamed(sc, tmp_path / "st", chunk_rows=999)
    for name in ("results.csv", "max_batch.csv"):
        assert (tmp_path / "st" / name).read_bytes() == (tmp_path / "mem" / name).read_bytes()
    assert pd.read_csv(tmp_path / "st" / "max_batch.csv")["max_batch"].max() > 0


# A parallel: block (issue 4) adds 13 axes and the node's columns: 2 batches x 2 seq x 2 dp x 3 ZeRO x 2 tp x
# 2 offload x 2 GPUs = 192 rows, 96 max-batch cells. Offload needs ZeRO >= 1, so zero_stage skips 0 here.
PARALLEL = """\
name: stream parallel
model: {preset: llama-3.1-8b}
mode: train
grid:
  batch: [1, 2]
  seq_len: [2048, 4096]
  precision: bf16-master
  optimizer: adamw
  checkpointing: selective
parallel:
  data_parallel: [2, 8]
  zero_stage: [1, 2, 3]
  tensor_parallel: [1, 4]
  sequence_parallel: true
  offload: [none, optimizer]
node: {gpus: 8, host_memory: 256 GiB}
gpus: [a100-40gb, h100-sxm]
"""


@pytest.mark.parametrize("chunk_rows", [7, 13, 96, 192, 10_000])
def test_a_parallel_scenario_streams_the_same_bytes_as_it_runs(tmp_path, chunk_rows):
    # before the fix, --stream built the grid from the grid: axes alone and wrote single-GPU results
    sc = parse_scenario_text(PARALLEL)
    r = stream_and_run(sc, tmp_path, chunk_rows)
    assert (r.rows, r.cells) == (192, 96)
    res = pd.read_csv(tmp_path / "st" / "results.csv")
    mb = pd.read_csv(tmp_path / "st" / "max_batch.csv")
    for col in ("data_parallel", "zero_stage", "tensor_parallel", "offload", "gpus_per_node", "host_bytes"):
        assert col in res.columns and col in mb.columns, col
    assert res["host_bytes"].gt(0).any() and set(res["tensor_parallel"]) == {1, 4}


@pytest.mark.parametrize("config,plans", [
    ("configs/llama-70b-cluster.yaml", ["cluster_options.csv"]),  # cluster: block (before: results only)
    ("configs/llama-serving.yaml", ["max_concurrency.csv", "max_context.csv"]),  # serving plan
])
def test_shipped_configs_stream_every_file_they_run(tmp_path, config, plans):
    r = stream_and_run(load_scenario(config), tmp_path, 100)
    assert [p.name for p in r.plans] == plans
