"""Issue 4 names the parallel settings grid axes: `grid: {zero_stage: [1, 3], ...}` sweeps them exactly as the
`parallel:` block does, problems are located where they are written, and one axis in both places is refused."""
from __future__ import annotations

import pytest

from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.errors import ScenarioError
from nnmem_sweep.runner import run_scenario

HEAD = "model: {preset: llama-3.1-8b}\nmode: train\n"
GPUS = "gpus: [h100-sxm, a100-40gb]\n"


def test_grid_form_and_block_form_give_the_same_outputs():
    in_grid = parse_scenario_text(
        HEAD + "grid: {batch: [1, 2], seq_len: 4096, precision: bf16-master, optimizer: adamw, "
               "zero_stage: [1, 3], data_parallel: 8, tensor_parallel: [1, 2], sequence_parallel: true}\n" + GPUS,
        "grid.yaml")
    in_block = parse_scenario_text(
        HEAD + "grid: {batch: [1, 2], seq_len: 4096, precision: bf16-master, optimizer: adamw}\n"
               "parallel: {zero_stage: [1, 3], data_parallel: 8, tensor_parallel: [1, 2], sequence_parallel: true}\n"
        + GPUS, "block.yaml")
    assert in_grid.parallel == in_block.parallel
    a, b = run_scenario(in_grid), run_scenario(in_block)
    assert a.results.to_csv() == b.results.to_csv() and a.max_batch.to_csv() == b.max_batch.to_csv()
    assert len(a.results) == 2 * 2 * 2 * 2  # batch x zero x tp x GPUs


@pytest.mark.parametrize("text,where,message", [
    ("grid: {batch: 1, seq_len: 4096, precision: bf16, optimizer: adamw, tensor_parallel: [1, 3]}\n" + GPUS,
     ("grid.tensor_parallel[1]", 3), "tensor_parallel 3 must divide the 32 attention heads"),
    ("grid: {batch: 1, seq_len: 4096, precision: bf16, optimizer: adamw, zero_stage: 1}\n" + GPUS
     + "parallel: {zero_stage: 3}\n", ("grid.zero_stage", 3), "swept both here and in parallel:"),
    ("grid: {batch: 1, seq_len: 4095, precision: bf16, optimizer: adamw, tensor_parallel: 2,\n"
     "       sequence_parallel: true}\n" + GPUS, ("grid.seq_len", 3), "must be divisible by tensor_parallel 2"),
])
def test_problems_are_located_in_the_grid(text, where, message):
    with pytest.raises(ScenarioError) as e:
        parse_scenario_text(HEAD + text, "s.yaml")
    (p,) = e.value.problems
    assert (p.key_path, p.line) == where and message in p.message
