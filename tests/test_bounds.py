"""Regression: a million sequences of 16 M tokens with eager attention wrapped around int64 and printed negative
temporaries (and nonsense totals) instead of being refused."""
import subprocess
import sys

import pytest

from nnmem_sweep.bounds import LIMIT_BYTES, upper_bound_bytes
from nnmem_sweep.models.presets import load_preset

HUGE = """name: huge
model: {preset: llama-3.1-405b}
mode: train
grid:
  batch: [1048576]
  seq_len: [16777216]
  precision: fp32
  optimizer: adamw
  attention: eager
gpus: [h100-sxm]
"""


def test_huge_point_is_refused_cleanly_and_nothing_is_written(tmp_path):
    cfg = tmp_path / "huge.yaml"
    cfg.write_text(HUGE)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "nnmem_sweep.cli", "run", str(cfg), "--out", str(out), "-q"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "batch 1,048,576 x seq_len 16,777,216" in proc.stderr and "2^62" in proc.stderr
    assert not out.exists()


def test_bound_really_bounds_the_estimate_and_admits_long_flash_contexts():
    from nnmem_sweep.estimate import estimate_point

    arch = load_preset("llama-3.1-405b")
    row = estimate_point(model="llama-3.1-405b", mode="train", batch=8, seq_len=8192, precision="fp32",
                         optimizer="adamw", optimizer_impl="foreach", checkpointing="none", attention="eager",
                         gpu="h100-sxm", cache_tokens=None, decode_tokens=None)
    assert upper_bound_bytes(arch, 8, 8192, eager=True) >= int(row["peak_allocated_bytes"]) > 0
    # 128 sequences of 128k tokens of a 405B model with flash attention must still be computed, not refused
    assert upper_bound_bytes(arch, 128, 131072, eager=False) < LIMIT_BYTES


@pytest.mark.parametrize("preset", ["gpt2", "bert-base", "mixtral-8x7b", "qwen2.5-0.5b"])
def test_bound_is_above_the_estimate_for_other_families(preset):
    from nnmem_sweep.estimate import estimate_point

    row = estimate_point(model=preset, mode="train", batch=4, seq_len=512, precision="fp32", optimizer="adamw",
                         optimizer_impl="foreach", checkpointing="none", attention="eager", gpu="h100-sxm",
                         cache_tokens=None, decode_tokens=None)
    assert upper_bound_bytes(load_preset(preset), 4, 512) >= int(row["peak_allocated_bytes"])
