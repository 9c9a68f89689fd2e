"""One rank of an FSDP2-sharded step (workload/fsdp.py, issue 22), measured on PyTorch's fake process group: under
FakeTensorMode it must give what real CPU tensors give, per phase, byte for byte; where it does not, the difference
is pinned here so that it is known.

Finding (torch 2.14.1): an optimizer step over FSDP2's DTensor parameters can count more memory under FakeTensorMode
than with real tensors (27,956,508 B against 22,836,764 B in the first case below, when it ran first in its
process): DTensor's sharding propagation runs its fake ops, for an op not yet in its cache, in the tracker's own fake
mode, and FSDPMemTracker skips only a nested fake mode's ops. Forward and backward agree exactly. The measurement therefore
steps the rank's local shards (fsdp.LocalShardOptimizer), which allocates what the DTensor step allocates with real
tensors (checked below)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the [measure] extra (torch) is not installed")
pytest.importorskip("transformers", reason="the [measure] extra (transformers) is not installed")

from nnmem_sweep.measure.build import measure_case  # noqa: E402

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4000, "hidden_size": 256,
         "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
         "head_dim": 32, "hidden_act": "silu", "attention_dropout": 0.0, "tie_word_embeddings": False}


def _case(world: int, stage: int, impl: str = "forloop", ckpt: str = "none", lora: bool = False) -> dict:
    case = {"hf_config": LLAMA, "mode": "train", "batch": 2, "seq_len": 128, "precision": "bf16",
            "optimizer": "adamw", "optimizer_impl": impl, "checkpointing": ckpt, "attention": "flash",
            "fsdp": {"world": world, "zero_stage": stage}}
    if lora:
        case["finetune"] = {"method": "lora", "rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]}
    return case


def _phases(record: dict) -> dict:
    return {ph: v["peak_bytes"] for ph, v in record["phases"].items()}


@pytest.mark.parametrize("world, stage, ckpt, lora", [(2, 3, "none", False), (4, 3, "full", False),
                                                      (2, 2, "none", False), (2, 3, "none", True),
                                                      (4, 2, "full", True)])
def test_fake_equals_real_per_phase(world, stage, ckpt, lora):
    case = _case(world, stage, ckpt=ckpt, lora=lora)
    fake, real = measure_case(case, fake=True), measure_case(case, fake=False)
    assert _phases(fake) == _phases(real)
    assert fake["totals"]["param_bytes"] == real["totals"]["param_bytes"]


def test_a_rank_holds_its_shard():
    one = measure_case({k: v for k, v in _case(2, 3).items() if k != "fsdp"}, fake=True)
    two, four = measure_case(_case(2, 3), fake=True), measure_case(_case(4, 3), fake=True)
    full = one["totals"]["param_bytes"]
    # Shard(0) of every parameter, rows padded to a multiple of the world size (every dimension here divides)
    assert two["totals"]["param_bytes"] == full // 2 and four["totals"]["param_bytes"] == full // 4


@pytest.mark.parametrize("impl", ["foreach", "forloop"])
def test_stepping_the_local_shards_is_what_a_dtensor_step_allocates(impl, monkeypatch):
    """Real tensors: the optimizer over the local shards (fsdp.LocalShardOptimizer, what the measurement uses) against
    the optimizer over FSDP2's DTensor parameters (what a training script builds): the same peaks, every phase."""
    from nnmem_sweep.workload import build

    case = _case(2, 3, impl=impl)
    local = measure_case(case, fake=False)
    monkeypatch.setattr(build.fsdp, "is_sharded", lambda model: False)  # build_optimizer: over the DTensors
    dtensor = measure_case(case, fake=False)
    assert _phases(local) == _phases(dtensor)


@pytest.mark.parametrize("stage, ckpt", [(3, "none"), (2, "full")])
def test_fsdp1_reshards_a_frozen_base_on_real_tensors_and_not_on_fake_ones(stage, ckpt):
    """Adapters under FSDP1 (workload/fsdp.py, peft's wrap): FSDP1's catch-all reshard at the end of the backward
    takes a unit whose flat parameter's data pointer is its local shard's for resharded already, and every fake
    tensor's data pointer is 0. So under FakeTensorMode the root (embedding 4000 x 256, untied head, final norm:
    2,048,256 bf16 values) and the first block (786,944, whose inputs need no gradient unless checkpointing makes
    them) stay unsharded into the optimizer step, where real tensors reshard them; forward and backward agree
    exactly (derive/step.py _catch_all_reshard frees them in the traced step as the GPU does)."""
    case = _case(2, stage, ckpt=ckpt, lora=True)
    case["fsdp"]["version"] = 1
    fake, real = measure_case(case, fake=True), measure_case(case, fake=False)
    held = 2 * (2_048_256 + (786_944 if ckpt == "none" else 0))
    for phase in ("forward", "backward"):
        assert fake["phases"][phase]["peak_bytes"] == real["phases"][phase]["peak_bytes"], phase
    assert fake["phases"]["optimizer"]["peak_bytes"] - real["phases"]["optimizer"]["peak_bytes"] == held
    assert fake["phases"]["backward"]["end_bytes"] - real["phases"]["backward"]["end_bytes"] == held


@pytest.mark.parametrize("stage", [3, 2])
def test_fsdp1_without_backward_prefetch_holds_one_block_fewer_in_a_full_shard_backward(stage):
    """FSDP1 is planned with PyTorch's BACKWARD_PRE (each unit's backward all-gathers the next one first); accelerate
    and the Hugging Face Trainer pass backward_prefetch=None unless fsdp_backward_prefetch is set (accelerate
    FullyShardedDataParallelPlugin, transformers' TrainingArguments: 'NO_PREFETCH'). Without it FULL_SHARD's backward
    peaks one decoder block's bf16 parameters lower: 786,944 elements x 2 B (q, o 256²; k, v 256 x 128; the MLP
    3 x 256 x 768; two norms); SHARD_GRAD_OP keeps every block unsharded through the backward, so nothing changes,
    and the forward and the step never do. The report states the estimate as an upper bound by that much."""
    peaks = {}
    for prefetch in ("pre", "none"):
        case = _case(2, stage)
        case["fsdp"].update(version=1, backward_prefetch=prefetch)
        peaks[prefetch] = _phases(measure_case(case, fake=True))
    block = 2 * (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 768 + 2 * 256)
    assert block == 1_573_888
    assert {ph: peaks["pre"][ph] - peaks["none"][ph] for ph in peaks["pre"]} == \
        {"forward": 0, "backward": block if stage == 3 else 0, "optimizer": 0}
