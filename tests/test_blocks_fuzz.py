"""Robustness of the issue-4 blocks (parallel:, node:, finetune:, cluster:) and the gpus entries with prices:
whatever is written there, loading ends in a Scenario or a ScenarioError whose every problem names the file, and a
Scenario that loads also runs (the grid, max batch and cluster search) without a traceback (issue 6)."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _helpers import load_edited
from nnmem_sweep.errors import NnmemError
from nnmem_sweep.runner import run_scenario

BASE = """
model: {preset: llama-3.2-1b}
grid: {batch: [1, 2], seq_len: 256, precision: bf16, optimizer: adamw}
gpus: [h100-sxm]
"""

_small = st.one_of(st.integers(-3, 70), st.sampled_from([0, 1, 2, 3, 4, 8, 16, 1 << 20, 10**30]))
_scalars = st.one_of(st.none(), st.booleans(), _small, st.floats(allow_nan=True),
                     st.sampled_from(["none", "optimizer", "optimizer+params", "1f1b", "interleaved", "lora",
                                      "qlora", "full", "q_proj", "all-linear", "fp32", "2 TiB", "80 GB", "h100-sxm",
                                      "", "é", "<script>"]))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=8)
_paths = st.sampled_from([
    "parallel", "parallel.data_parallel", "parallel.zero_stage", "parallel.tensor_parallel",
    "parallel.sequence_parallel", "parallel.pipeline_parallel", "parallel.micro_batches",
    "parallel.pipeline_schedule", "parallel.virtual_stages", "parallel.context_parallel", "parallel.expert_parallel",
    "parallel.offload", "parallel.gradient_accumulation", "parallel.fp32_grad_accumulation",
    "node", "node.gpus", "node.host_memory",
    "finetune", "finetune.method", "finetune.rank", "finetune.alpha", "finetune.targets", "finetune.dropout",
    "finetune.adapter_dtype",
    "cluster", "cluster.global_batch", "cluster.tokens_per_step", "cluster.seq_len", "cluster.max_gpus",
    "cluster.tensor_parallel", "cluster.pipeline_parallel", "cluster.micro_batch", "cluster.zero_stage",
    "cluster.checkpointing", "mode"])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(_paths, _values), min_size=1, max_size=4))
def test_random_blocks_load_or_fail_cleanly_and_what_loads_runs(edits) -> None:
    sc = load_edited(BASE, edits)
    if sc is None:
        return
    try:
        run_scenario(sc, max_rows=200_000)
    except NnmemError as e:  # a clean one-line refusal (e.g. a grid over --max-rows) is an answer too
        assert str(e) and "\n" not in str(e)
