"""A `params:` model under ZeRO-3 (issue 12): it has no layers, so the unit ZeRO-3 gathers is model.largest_layer_params
when given, else the whole model (an upper bound the report states)."""
from __future__ import annotations

import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.config import load_scenario
from nnmem_sweep.report.assumptions import _parallel_assumptions
from nnmem_sweep.runner import run_scenario

SCENARIO = """name: params zero3
model:
  params: 7000000000
  activation_elements_per_token: 100000
{largest}mode: train
grid:
  batch: 1
  seq_len: 2048
  precision: bf16-mixed
  optimizer: adamw
  data_parallel: 8
  zero_stage: 3
gpus: [a100-80gb]
"""


def _scenario(tmp_path, largest: str):
    f = tmp_path / "s.yaml"
    f.write_text(SCENARIO.format(largest=largest))
    return load_scenario(f)


@pytest.mark.parametrize("largest, gathered", [("  largest_layer_params: 202000000\n", 202_000_000),
                                               ("", 7_000_000_000)])
def test_gathered_unit_of_a_params_model(tmp_path, largest, gathered):
    """bf16-mixed keeps fp32 weights: 7e9 / 8 ranks · 4 B = 3.5e9 sharded, plus two gathered copies of the unit
    (DeepSpeed's 4 · largest_layer_params at 2 B, here 2 · unit · 4 B): 3.5e9 + 8 · unit."""
    sc = _scenario(tmp_path, largest)
    row = run_scenario(sc).results.iloc[0]
    assert int(row[C.WEIGHTS]) == 3_500_000_000 + 8 * gathered
    text = " ".join(_parallel_assumptions(sc))
    assert ("202,000,000 parameters (model.largest_layer_params, as given)" in text) == bool(largest)
    assert ("the whole model" in text) != bool(largest)
