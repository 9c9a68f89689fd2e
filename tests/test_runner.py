"""run_scenario, write_outputs (runner.py), estimate_point and the breakdown table (estimate.py)."""
import numpy as np
import pandas as pd
import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.cli import main
from nnmem_sweep.errors import UsageError
from nnmem_sweep.estimate import estimate_point, format_breakdown
from nnmem_sweep.runner import run_scenario, write_outputs
from nnmem_sweep.scenario import GPUSpec, Overheads

from components.tiny_models import TINY_LLAMA, scenario

OV = Overheads(100, 10, 0.5)
GPU = GPUSpec("g", "G", 100_000, "test")


def test_results_columns_and_invariants(tmp_path):
    sc = scenario(TINY_LLAMA, batch=[1, 2, 4], precision=["fp32", "bf16"], gpus=(GPU,), overheads=OV,
                  headroom=0.1)
    res = run_scenario(sc)
    r = res.results
    assert list(r.columns[:2]) == [C.MODEL, C.MODE]
    for col in C.BYTE_COLUMNS:
        assert r[col].dtype == np.int64, col
    assert (r[list(C.COMPONENTS)].sum(axis=1) == r[C.PEAK_ALLOCATED]).all()
    assert (r[C.TOTAL] == r[C.PEAK_ALLOCATED] + r[C.OVERHEAD]).all()
    # overhead = 100 + 10 + ceil(0.5 x peak); usable = 100,000 - ceil(0.1 x 100,000)
    assert (r[C.OVERHEAD] == 110 + np.ceil(r[C.PEAK_ALLOCATED] * 0.5).astype(np.int64)).all()
    assert (r[C.USABLE] == 90_000).all()
    assert (r[C.FITS] == (r[C.TOTAL] <= 90_000)).all()
    row = r[(r[C.BATCH] == 1) & (r[C.PRECISION] == "fp32")].iloc[0]
    assert row[C.PEAK_ALLOCATED] == 34_208 and row[C.TOTAL] == 34_208 + 110 + 17_104

    written = write_outputs(res, tmp_path / "out")
    assert [p.name for p in written] == ["results.csv", "max_batch.csv", "run.json"]
    back = pd.read_csv(written[0])
    assert len(back) == len(r) and back[C.TOTAL].tolist() == r[C.TOTAL].tolist()
    assert not list((tmp_path / "out").glob(".*tmp"))


def test_estimate_point_llama_8b_and_breakdown():
    row = estimate_point(model="llama-3.1-8b", batch=1, seq_len=1024, precision="bf16", optimizer="adamw",
                         gpu="h100-sxm")
    assert row[C.WEIGHTS] == 8_030_261_248 * 2
    assert row[C.OPTIMIZER_STATE] == 8_030_261_248 * 2 * 2
    assert sum(row[c] for c in C.COMPONENTS) == row[C.PEAK_ALLOCATED]
    text = format_breakdown(row)
    for label in ("weights", "optimizer state", "activations", "temporaries", "peak allocated", "total",
                  "GPU capacity", "usable"):
        assert label in text
    assert f"{row[C.TOTAL]:,}" in text
    assert ("fits" in text) != ("does NOT fit" in text)


@pytest.mark.parametrize("kwargs,message", [
    (dict(model="llama-9b"), "unknown model 'llama-9b'"),
    (dict(model="gpt2", precision="fp6"), "unknown precision 'fp6'"),
    (dict(model="gpt2", optimizer="adamx"), "unknown optimizer 'adamx'"),
    (dict(model="gpt2", gpu="h1000"), "unknown GPU 'h1000'"),
    (dict(model="gpt2", batch=0), "batch must be a positive integer"),
    (dict(model="gpt2", precision="int4"), "inference only"),
])
def test_estimate_point_bad_input_is_one_line(kwargs, message):
    with pytest.raises(UsageError, match=message) as e:
        estimate_point(**kwargs)
    assert "\n" not in str(e.value)


def test_cli_estimate_and_bad_gpu(capsys):
    assert main(["estimate", "--model", "gpt2", "--batch", "2", "--seq-len", "128", "--gpu", "t4"]) in (0,)
    out = capsys.readouterr().out
    assert "peak allocated" in out
    assert main(["estimate", "--model", "gpt2", "--gpu", "nope"]) == 2
    assert "unknown GPU" in capsys.readouterr().err


def test_cli_estimate_of_one_rank_of_a_layout(capsys):
    """--parallel: a layout as a scenario's parallel: block names it, the figures one rank's. Llama 3.1 8B over 8
    ranks of FSDP1 with FULL_SHARD at 2 x 128 tokens peaks at its measured rank's bytes less the 33 host-side step
    counters a GPU does not count (tests/test_sharded_truth.py); a layout the model cannot take is one line, exit 2."""
    assert main(["estimate", "--model", "llama-3.1-8b", "--batch", "2", "--seq-len", "128", "--precision", "bf16",
                 "--parallel", "data_parallel=8,zero_stage=3,fsdp_version=1"]) == 0
    out = capsys.readouterr().out
    assert "one rank of: data_parallel 8, zero_stage 3, fsdp_version 1" in out
    peak = next(int(line.split()[-1].replace(",", "")) for line in out.splitlines() if line.startswith("peak"))
    assert abs(peak - (14_071_660_172 - 4 * 33)) <= 1024
    for bad, says in (("tensor_parallel=3", "must divide the 32 attention heads"), ("data_paralel=8", "unknown "
                      "parallel axis 'data_paralel'"), ("data_parallel", "axis=value pairs")):
        assert main(["estimate", "--model", "llama-3.1-8b", "--parallel", bad]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1


def test_inference_point():
    row = estimate_point(model="llama-3.1-8b", mode="infer", batch=8, seq_len=4096, precision="bf16",
                         decode_tokens=512, gpu="h100-sxm")
    # KV: 2 x 8 x (4096 + 512) x 32 layers x 8 KV heads x 128 x 2 B at the end of decoding
    kv_end = 2 * 8 * 4608 * 32 * 8 * 128 * 2
    assert row[C.KV_CACHE] in (2 * 8 * 4096 * 32 * 8 * 128 * 2, kv_end)
    assert row[C.OPTIMIZER_STATE] == 0 and row[C.GRADIENTS] == 0
