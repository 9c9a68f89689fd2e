"""The scenario's `parallel:` and `node:` blocks: load-time rules (file:line:key), the grid's columns, max_batch.csv."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.config import load_scenario
from nnmem_sweep.errors import ScenarioError
from nnmem_sweep.grid import expand_grid
from nnmem_sweep.runner import run_scenario
from nnmem_sweep.units import TiB

HEAD = """name: p
model: {preset: llama-3.1-8b}
mode: train
grid:
  batch: [1, 2]
  seq_len: 4096
  precision: bf16-master
  optimizer: adamw
gpus: [h100-sxm]
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    f = tmp_path / "s.yaml"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError) as info:
        load_scenario(f)
    return [str(p).removeprefix(str(f) + ":").strip() for p in info.value.problems]


def load(tmp_path: Path, text: str):
    f = tmp_path / "s.yaml"
    f.write_text(text, encoding="utf-8")
    return load_scenario(f)


@pytest.mark.parametrize("block,expected", [
    ("parallel:\n  tensor_parallel: [2, 3]\n",  # Llama 3.1 8B: 32 heads, 8 KV heads
     "11:24: parallel.tensor_parallel[1]: tensor_parallel 3 must divide the 32 attention heads and the 8 KV heads"),
    ("parallel:\n  tensor_parallel: 16\n",
     "11:20: parallel.tensor_parallel: tensor_parallel 16 must divide the 32 attention heads and the 8 KV heads"),
    ("parallel:\n  pipeline_parallel: 64\n",
     "11:22: parallel.pipeline_parallel: pipeline_parallel 64 is more stages than the 32 layers"),
    ("parallel:\n  zero_stage: 2\n  offload: optimizer+params\n",
     "12:12: parallel.offload: offload optimizer+params needs zero_stage 3 (parameters are offloaded as ZeRO-3 "
     "partitions; FSDP's CPU offload also at 2, for a transformer sharded over data_parallel alone, one micro-batch "
     "a step), got zero_stage 2"),
    ("parallel:\n  pipeline_parallel: 2\n  pipeline_schedule: interleaved\n",
     "11:3: parallel: the interleaved schedule needs pipeline_parallel > 1 and virtual_stages > 1, got "
     "pipeline_parallel 2, virtual_stages 1"),
    ("parallel:\n  pipeline_parallel: 4\n  micro_batches: 8\n  pipeline_schedule: interleaved\n  virtual_stages: 3\n",
     "14:19: parallel.virtual_stages: the interleaved schedule needs the 32 layers divisible by pipeline_parallel "
     "x virtual_stages = 12"),
    ("parallel:\n  expert_parallel: 2\n  data_parallel: 2\n",
     "11:20: parallel.expert_parallel: expert_parallel 2 must divide experts (this model has none)"),
    ("parallel:\n  context_parallel: 3\n",
     "6:12: grid.seq_len: seq_len 4,096 must be divisible by context_parallel 3 = 3"),
])
def test_invalid_layouts_are_named_at_load_time(tmp_path, block, expected):
    assert problems(tmp_path, HEAD + block) == [expected]


def test_infer_mode_takes_tensor_and_pipeline_parallel_only(tmp_path):
    text = HEAD.replace("mode: train", "mode: infer").replace("  optimizer: adamw\n", "") + \
        "parallel:\n  tensor_parallel: [1, 8]\n  zero_stage: 3\n"
    assert problems(tmp_path, text) == [
        "11:15: parallel.zero_stage: zero_stage applies to train mode only; inference models tensor_parallel, "
        "pipeline_parallel and data_parallel"]
    sc = load(tmp_path, text.replace("  zero_stage: 3\n", ""))
    res = run_scenario(sc)
    # Llama 3.1 8B bf16 over 8 GPUs: the weights are an eighth but the norms (65 x 4096 x 2 B) on every rank
    w = res.results[C.WEIGHTS].tolist()
    assert w[0] == 16_060_522_496 and w[1] == (16_060_522_496 - 65 * 4096 * 2) // 8 + 65 * 4096 * 2
    # the KV cache: 8 KV heads, one per GPU
    kv = res.results[C.KV_CACHE].tolist()
    assert kv[1] * 8 == kv[0]


def test_unknown_parallel_key_is_a_schema_error(tmp_path):
    got = problems(tmp_path, HEAD + "parallel:\n  tensor_paralel: 2\n")
    assert got == ["11:3: parallel.tensor_paralel: unknown key 'tensor_paralel' (did you mean 'tensor_parallel'?)"]


def test_a_scenario_without_parallel_keeps_its_columns(tmp_path):
    sc = load(tmp_path, HEAD)
    assert sc.parallel == {} and sc.node == {}
    frame = expand_grid(sc)
    assert not any(a in frame.columns for a in C.PARALLEL_AXES + (C.HOST_MEMORY, C.GPUS_PER_NODE))


def test_naming_one_axis_brings_every_parallel_column_with_its_default(tmp_path):
    sc = load(tmp_path, HEAD + "parallel:\n  zero_stage: [1, 3]\nnode: {gpus: 4, host_memory: 1 TiB}\n")
    assert sc.parallel[C.ZERO_STAGE] == (1, 3)
    assert sc.parallel[C.SEQUENCE_PARALLEL] == (False,) and sc.parallel[C.OFFLOAD] == ("none",)
    assert sc.node == {C.GPUS_PER_NODE: 4, C.HOST_MEMORY: TiB}
    frame = expand_grid(sc)
    assert len(frame) == 2 * 2
    assert list(frame.columns[9:9 + len(C.PARALLEL_AXES)]) == list(C.PARALLEL_AXES)
    assert frame[C.SEQUENCE_PARALLEL].dtype == np.bool_ and frame[C.ZERO_STAGE].dtype == np.int64
    res = run_scenario(sc)
    # max_batch.csv groups by the parallel axes too: one row per zero stage
    assert res.max_batch[C.ZERO_STAGE].tolist() == [1, 3]
    assert (res.max_batch[C.HOST] == 0).all() and (res.results[C.HOST] == 0).all()


def test_offload_beyond_the_node_ram_does_not_fit(tmp_path):
    # ZeRO-3 with everything offloaded, one data-parallel rank: the host keeps 18 B/param per rank (fp32 master 4,
    # Adam 8, fp32 gradients 4, bf16 weights 2; the CPU step runs in place); 8 ranks a node: 8 x 18 x 8.03e9 B =
    # 1.156e12 B > 1 TiB = 1.0995e12 B
    text = HEAD + "parallel:\n  zero_stage: 3\n  offload: optimizer+params\nnode: {host_memory: 1 TiB}\n"
    res = run_scenario(load(tmp_path, text))
    psi = 8_030_261_248
    assert res.results[C.HOST].tolist() == [8 * 18 * psi] * 2
    assert not res.results[C.FITS].any()
    assert res.max_batch[C.MAX_BATCH].tolist() == [0]
    # the GPU itself holds only the two gathered units; the largest is the head (lm_head 128256 x 4096 + the final
    # norm's 4096), in bf16
    assert res.results[C.WEIGHTS].tolist() == [2 * (128256 * 4096 + 4096) * 2] * 2


def test_gradient_sync_is_an_axis_and_last_keeps_the_whole_unsharded_gradients(tmp_path):
    """`gradient_sync: [each, last]` under ZeRO-3 with accumulation: one row each. The gradients a micro-batch keeps
    are the rank's bf16 shard with `each` (FSDP2's default) and every parameter's whole bf16 gradient with `last`
    (accelerate's no_sync): Llama 3.1 8B has 8,030,261,248 parameters; a shard over 8 ranks is 1/8 of them (each
    dimension divides). Without accumulation the two are the same step."""
    sc = load(tmp_path, HEAD.replace("bf16-master", "bf16") + "parallel: {data_parallel: 8, zero_stage: 3, "
              "gradient_accumulation: [1, 4], gradient_sync: [each, last]}\n")
    res = run_scenario(sc).results
    res = res[res[C.BATCH] == 1].set_index([C.GRADIENT_ACCUMULATION, C.GRADIENT_SYNC])
    whole = 8_030_261_248 * 2
    assert res.loc[(4, "each"), C.GRADIENTS] == whole // 8
    assert res.loc[(4, "last"), C.GRADIENTS] == whole
    assert (res.loc[(4, "last"), C.PEAK_ALLOCATED] - res.loc[(4, "each"), C.PEAK_ALLOCATED]) == whole - whole // 8
    assert res.loc[(1, "last"), C.PEAK_ALLOCATED] == res.loc[(1, "each"), C.PEAK_ALLOCATED]


@pytest.mark.parametrize("block,expected", [
    ("parallel: {data_parallel: 8, zero_stage: 3, gradient_accumulation: 4, gradient_sync: sometimes}\n",
     "10:86: parallel.gradient_sync: the string 'sometimes' is not one of: each, last"),
    ("parallel: {data_parallel: 8, zero_stage: 3, gradient_accumulation: 4, gradient_sync: last, deepspeed: true}\n",
     "10:86: parallel.gradient_sync: gradient_sync last (FSDP's no_sync) is modelled for FSDP without offload; "
     "DeepSpeed ZeRO-2/3 reduces every micro-batch (use gradient_sync each)"),
])
def test_gradient_sync_refusals_name_the_key(tmp_path, block, expected):
    assert problems(tmp_path, HEAD + block) == [expected]
