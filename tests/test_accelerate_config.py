"""`parallel: {accelerate: FILE}` (parallel/accelerate.py): the run an accelerate config file describes, as the
parallel axes it sets, planned as the same layout written out; what it cannot be planned as, one line at the key.
The files are what `accelerate config` writes (accelerate main: the FSDP1 strategy as its number, FSDP2's
fsdp_reshard_after_forward)."""
from __future__ import annotations

import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.errors import ScenarioError
from nnmem_sweep.runner import run_scenario

FSDP1 = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
downcast_bf16: 'no'
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_sharding_strategy: 1
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_use_orig_params: true
machine_rank: 0
mixed_precision: bf16
num_machines: 1
num_processes: 8
"""
FSDP2 = """distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_reshard_after_forward: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
mixed_precision: bf16
num_processes: 4
"""


def _scenario(tmp_path, config: str, parallel: str = "", grid: str = ""):
    (tmp_path / "acc.yaml").write_text(config)
    text = ("model: {preset: llama-3.2-1b}\nmode: train\n"
            f"grid: {{batch: [1, 2], seq_len: 1024, precision: bf16-mixed, optimizer: adamw{grid}}}\n"
            f"gpus: [a100-80gb]\nparallel: {{accelerate: acc.yaml{parallel}}}\n")
    return parse_scenario_text(text, "acc-scenario.yaml", tmp_path)


def _written_out(tmp_path, parallel: str):
    text = ("model: {preset: llama-3.2-1b}\nmode: train\n"
            "grid: {batch: [1, 2], seq_len: 1024, precision: bf16-mixed, optimizer: adamw}\n"
            f"gpus: [a100-80gb]\nparallel: {{{parallel}}}\n")
    return parse_scenario_text(text, "written.yaml", tmp_path)


@pytest.mark.parametrize("config, written", [
    (FSDP1, "data_parallel: 8, zero_stage: 3, fsdp_version: 1"),
    (FSDP2, "data_parallel: 4, zero_stage: 2, fsdp_version: 2"),
    (FSDP1.replace("fsdp_sharding_strategy: 1", "fsdp_sharding_strategy: SHARD_GRAD_OP"),
     "data_parallel: 8, zero_stage: 2, fsdp_version: 1"),
    ("distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: bf16\n", "data_parallel: 2, zero_stage: 0"),
    # no fsdp_backward_prefetch: the plugin's default, None (NO_PREFETCH); the older key accelerate's launcher takes
    (FSDP1.replace("  fsdp_backward_prefetch: BACKWARD_PRE\n", ""),
     "data_parallel: 8, zero_stage: 3, fsdp_version: 1, backward_prefetch: none"),
    (FSDP1.replace("fsdp_backward_prefetch: BACKWARD_PRE", "fsdp_backward_prefetch_policy: NO_PREFETCH"),
     "data_parallel: 8, zero_stage: 3, fsdp_version: 1, backward_prefetch: none"),
])
def test_an_accelerate_config_plans_the_layout_it_describes(tmp_path, config, written):
    """accelerate's defaults as its plugin reads them: fsdp_version 1, FULL_SHARD; the number 1 is FULL_SHARD;
    FSDP2's reshard_after_forward false is SHARD_GRAD_OP; MULTI_GPU is DistributedDataParallel. The same rows, to
    the byte, as the layout written out."""
    got = run_scenario(_scenario(tmp_path, config), bands=False).results
    want = run_scenario(_written_out(tmp_path, written), bands=False).results
    cols = [C.DATA_PARALLEL, C.ZERO_STAGE, C.FSDP_VERSION, C.BACKWARD_PREFETCH, C.OFFLOAD, C.BATCH, C.PEAK_ALLOCATED,
            C.TOTAL]
    assert got[cols].astype(str).values.tolist() == want[cols].astype(str).values.tolist()


def test_a_layout_the_scenario_sweeps_beside_the_config_must_list_its_value(tmp_path):
    sc = _scenario(tmp_path, FSDP1, ", data_parallel: [4, 8]")
    assert sc.parallel[C.DATA_PARALLEL] == (4, 8) and sc.parallel[C.ZERO_STAGE] == (3,)


@pytest.mark.parametrize("config, parallel, grid, words", [
    (FSDP1.replace("fsdp_sharding_strategy: 1", "fsdp_sharding_strategy: HYBRID_SHARD"), "", "",
     "fsdp_sharding_strategy HYBRID_SHARD is not modelled"),
    (FSDP1.replace("fsdp_sharding_strategy: 1", "fsdp_sharding_strategy: 7"), "", "",
     "fsdp_sharding_strategy must be one of FULL_SHARD"),
    (FSDP1.replace("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP"), "", "",
     "fsdp_auto_wrap_policy SIZE_BASED_WRAP makes other units"),
    ("distributed_type: DEEPSPEED\nnum_processes: 8\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n", "", "",
     "distributed_type DEEPSPEED: give its DeepSpeed config as parallel.deepspeed (ds.json)"),
    (FSDP2.replace("fsdp_version: 2", "fsdp_version: 2\n  fsdp_sharding_strategy: FULL_SHARD"), "", "",
     "fsdp_sharding_strategy is FSDP1's"),
    (FSDP1.replace("fsdp_use_orig_params: true", "fsdp_activation_checkpointing: true"), "", "",
     "acc.yaml checkpoints every block (fsdp_activation_checkpointing): give grid.checkpointing: full"),
    (FSDP1, ", data_parallel: [2, 4]", "", "acc.yaml sets its data_parallel 8, which data_parallel (2, 4) does not"),
    (FSDP1.replace("num_processes: 8", "num_processes: 1"), "", "", "num_processes must be a whole number of at "
                                                                     "least 2 for FSDP, got 1"),
    ("compute_environment: LOCAL_MACHINE\n", "", "", "acc.yaml has no distributed_type: not an accelerate config"),
    (FSDP1, ", deepspeed: true", "", "an accelerate config and a DeepSpeed one: give one of them"),
    (FSDP1.replace("BACKWARD_PRE", "BACKWARD_POST"), "", "",
     "fsdp_backward_prefetch BACKWARD_POST is not modelled: BACKWARD_PRE or NO_PREFETCH"),
    (FSDP1.replace("BACKWARD_PRE", "EARLY"), "", "", "fsdp_backward_prefetch must be one of BACKWARD_PRE"),
    (FSDP1, ", backward_prefetch: none", "", "acc.yaml sets its backward_prefetch pre, which backward_prefetch (none) does not"),
])
def test_what_an_accelerate_config_cannot_be_planned_as_is_one_line(tmp_path, config, parallel, grid, words):
    with pytest.raises(ScenarioError) as e:
        _scenario(tmp_path, config, parallel, grid)
    (p,) = e.value.problems
    assert p.key_path == "parallel.accelerate" and words in p.message, (p.key_path, p.message)


def test_a_checkpointing_config_plans_with_the_grids_full_checkpointing(tmp_path):
    config = FSDP1.replace("fsdp_use_orig_params: true", "fsdp_activation_checkpointing: true")
    sc = _scenario(tmp_path, config, grid=", checkpointing: full")
    assert sc.grid[C.CHECKPOINTING] == ("full",) and sc.parallel[C.FSDP_VERSION] == (1,)


def test_a_config_file_that_is_not_there_is_one_line(tmp_path):
    for key in ("accelerate", "deepspeed"):
        text = ("model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: 1, seq_len: 128, precision: bf16-mixed, "
                f"optimizer: adamw}}\ngpus: [a100-80gb]\nparallel: {{data_parallel: 2, zero_stage: 2, {key}: gone.x}}\n")
        with pytest.raises(ScenarioError) as e:
            parse_scenario_text(text, "s.yaml", tmp_path)
        (p,) = e.value.problems
        assert p.key_path == f"parallel.{key}" and p.message.startswith("cannot read the ") and "gone.x" in p.message
