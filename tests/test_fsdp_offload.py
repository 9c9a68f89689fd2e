"""FSDP1's CPU offload (CPUOffload(offload_params=True), offload optimizer+params; issue 22): the GPU's side of a
rank's step, told apart from the host on one device (derive/step.py, derive/trace.py Recorder.host), against
MemTracker's measurement of the same step less the host's bytes (measure/truth.py gpu_side). The committed cases
(tests/data/truth/sharded/*-offload-*) are held in tests/test_sharded_truth.py; here a tiny model end to end, what the
trace records that one device cannot make, and the refusals."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the [measure] extra (torch) is not installed")
pytest.importorskip("transformers", reason="the [measure] extra (transformers) is not installed")
pytest.importorskip("peft", reason="the [measure] extra (peft) is not installed")

from nnmem_sweep import accuracy as A  # noqa: E402
from nnmem_sweep.errors import UsageError  # noqa: E402
from nnmem_sweep.measure.build import measure_case  # noqa: E402
from nnmem_sweep.measure.truth import case_record  # noqa: E402

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4000, "hidden_size": 256,
         "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
         "head_dim": 32, "hidden_act": "silu", "attention_dropout": 0.0, "tie_word_embeddings": False}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(tmp_path / "cache"))


def _case(stage: int, offload: bool = True, version: int = 1) -> dict:
    return {"id": f"tiny-lora-fsdp{version}w2z{stage}-offload", "hf_config": LLAMA, "mode": "train", "batch": 2,
            "seq_len": 128, "precision": "bf16", "optimizer": "adamw", "optimizer_impl": "foreach",
            "checkpointing": "none", "attention": "flash", "decode_tokens": 0, "tolerance": {"peak": 0.0},
            "finetune": {"method": "lora", "rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]},
            "fsdp": {"world": 2, "zero_stage": stage, **({"version": 1} if version == 1 else {}),
                     **({"offload": "optimizer+params"} if offload else {})}}


@pytest.mark.parametrize("stage, version", [(3, 1), (2, 1), (3, 2), (2, 2)])
def test_a_tiny_offloaded_rank_is_its_measured_gpu_side(stage, version):
    """A 4-layer Llama with LoRA on q and v over 2 ranks, FULL_SHARD and SHARD_GRAD_OP, FSDP1's CPUOffload and FSDP2's
    CPUOffloadPolicy: the traced step the plans are solved from (the host told apart, derive/step.py) peaks in its
    forward and its backward at the GPU side MemTracker measures of the same step (less the host's bytes), to the
    byte; FSDP1's host holds the shards twice (the shard and its pinned CPU gradient) beside AdamW's state. The
    committed cases (tests/test_sharded_truth.py) hold the solved plans to it."""
    case = _case(stage, version=version)
    measured = case_record(case, measure_case(case, fake=True))["measured"]
    assert set(measured["phases"]) == {"forward", "backward"}  # the optimizer steps on the host
    tr = _trace(case, case["batch"], case["seq_len"], device="cpu")
    live = tr.live()
    for phase, m in measured["phases"].items():
        (start, end), = [(a, b) for name, _, a, b in tr.spans if name == phase]
        assert int(live[start:end].max()) == m["peak_bytes"], phase
    if version == 1:
        assert measured["totals"]["host_bytes"] == 2 * measured["totals"]["param_bytes"] + \
            measured["totals"]["optimizer_state_bytes"]


def _trace(case: dict, batch: int = 2, seq_len: int = 64, device: str = "cuda"):
    """The rank's step traced as the derivation traces it (one probe, in this process)."""
    from nnmem_sweep.derive import derivation, source as src
    from nnmem_sweep.derive.arch import architecture_from_source, hf_source, sharded, with_adapters, peft_spec
    from nnmem_sweep.components.finetune_method import parse_finetune
    from nnmem_sweep.workload.build import sharding

    ft = parse_finetune(case["finetune"], "test")
    arch = with_adapters(architecture_from_source(hf_source(LLAMA, "test")), ft, peft_spec(ft))
    rank = sharded(arch, 2, case["fsdp"]["zero_stage"], case["fsdp"].get("version", 2),
                   offload="offload" in case["fsdp"])
    probe_case = src.case(rank.derived.source, "train", "bf16", "flash", "none", device)
    derivation.IN_WORKER.append(True)  # no worker pool: one probe
    try:
        with sharding(probe_case):
            probe = derivation._Probe(rank.derived.source, "train", "bf16", "flash", "none", device, False)
            return probe.trace_here(batch, seq_len).trace
    finally:
        derivation.IN_WORKER.pop()


def test_each_unit_is_copied_to_the_gpu_before_its_all_gather():
    """FSDP1 copies an offloaded unit's shard to the GPU before each all-gather (pre_unshard) and frees it once the
    unsharded parameter is in use; one device has nothing to copy, so the trace records it: an allocation of half
    the all-gather's bytes (2 ranks) right before its destination grows from empty, freed before the next
    allocation. FULL_SHARD gathers every unit in the forward and the blocks and adapters again in the backward.
    The shards and their CPU gradients are never an event; without offload there is no copy and no host."""
    tr = _trace(_case(3))
    ops, ev = tr.ops, tr.events
    copies = [i for i, op in enumerate(ops) if op == "shard_to_gpu"]
    assert copies
    for i in copies:
        assert ops[i + 1] == "resize_" and ev[i + 1][1] == 2 * ev[i][1]
        freed = next(j for j in range(i + 2, len(ev)) if ev[j][0] == ev[i][0])
        assert ev[freed][1] == -ev[i][1] and all(ev[k][1] < 0 for k in range(i + 2, freed))
    gathers = [i for i, op in enumerate(ops) if op == "resize_" and ev[i][1] > 0]
    assert len(gathers) == len(copies)
    plain = _trace(_case(3, offload=False))
    assert "shard_to_gpu" not in plain.ops and plain.host_bytes == 0
    # every storage the offloaded trace holds from its start is the GPU's: less than the same trace's without offload
    # by the rank's shards (its parameters at rest), which are the host's, twice (their CPU gradients)
    shards = tr.host_bytes // 2
    assert sum(n for sid, n in ev if n > 0 and sid in tr.external) + shards == \
        sum(n for sid, n in plain.events if n > 0 and sid in plain.external)


@pytest.mark.parametrize("parallel, says", [
    ("{data_parallel: 2, zero_stage: 1, offload: optimizer+params}", "needs zero_stage 3"),
    ("{data_parallel: 2, zero_stage: 3, fsdp_version: 1, offload: optimizer}", "is ZeRO-Offload's (DeepSpeed)"),
    ("{data_parallel: 2, zero_stage: 3, offload: optimizer}", "is ZeRO-Offload's (DeepSpeed)"),
    ("{data_parallel: 2, zero_stage: 3, fsdp_version: 1, offload: optimizer+params, gradient_accumulation: 2}",
     "with gradient_accumulation > 1 is not modelled"),
])
def test_an_offload_fsdp_does_not_run_is_refused_at_its_key(parallel, says):
    from nnmem_sweep.config import parse_scenario_text
    from nnmem_sweep.errors import ScenarioError

    text = ("model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: 1, seq_len: 512, precision: bf16, "
            f"optimizer: adamw}}\nfinetune: {{method: lora, rank: 16}}\nparallel: {parallel}\ngpus: [h100-sxm]\n")
    with pytest.raises(ScenarioError) as info:
        parse_scenario_text(text)
    (problem,) = info.value.problems
    assert problem.key_path == "parallel.offload" and says in problem.message


def test_a_frame_that_offloads_where_fsdp1_does_not_is_refused():
    """The estimator's own check, for frames that come without a scenario (a CSV of points): one line naming it."""
    from nnmem_sweep.peak import estimate_components

    rec = {"case_id": "x", "inputs": {**{k: v for k, v in _case(3).items() if k not in ("id", "hf_config")},
                                      "model": ""}, "hf_config": LLAMA}
    frame = A.case_frame(rec)
    assert frame["offload"].tolist() == ["optimizer+params"] and frame["fsdp_version"].tolist() == [1]
    with pytest.raises(UsageError, match="^finetune method lora: offload optimizer is ZeRO-Offload's"):
        estimate_components(A.architecture_of(rec, True), "train", frame.assign(offload="optimizer"))


def test_a_hand_modelled_full_fine_tune_offloaded_by_fsdp1_is_planned_from_its_own_code():
    """Llama 3.2 1B fully fine-tuned over 2 ranks with FSDP1's CPU offload: its derived twin's traced rank (the
    measured cases: tests/test_sharded_truth.py), not the hand model of ZeRO-Offload, whose GPU holds DeepSpeed's
    engine's bytes; the same layouts without offload, or offload under DeepSpeed's ZeRO (fsdp_version 2, offload
    optimizer), keep the hand model; FSDP2's CPUOffloadPolicy is planned from its own code too."""
    from nnmem_sweep.config import parse_scenario_text

    def model(parallel: str):
        return parse_scenario_text("model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: 2, seq_len: 1024, "
                                   f"precision: bf16, optimizer: adamw}}\nparallel: {parallel}\ngpus: [h100-sxm]\n"
                                   ).model

    offloaded = model("{data_parallel: 2, zero_stage: 3, fsdp_version: 1, offload: [none, optimizer+params]}")
    assert offloaded.kind == "derived" and offloaded.preset == "llama-3.2-1b"
    assert model("{data_parallel: 2, zero_stage: 3, fsdp_version: 1}").kind == "transformer"
    assert model("{data_parallel: 2, zero_stage: 3, offload: optimizer+params}").kind == "derived"  # FSDP2's
    assert model("{data_parallel: 2, zero_stage: 3, offload: optimizer}").kind == "transformer"
    # FSDP1 named, its offload as it runs it or not at all: accumulating, or ZeRO-Offload's optimizer alone
    from nnmem_sweep.errors import ScenarioError

    for bad in ("offload: optimizer+params, gradient_accumulation: 2", "offload: optimizer"):
        with pytest.raises(ScenarioError, match="parallel.offload"):
            model(f"{{data_parallel: 2, zero_stage: 3, fsdp_version: 1, {bad}}}")


def test_a_point_offloaded_by_fsdp1_is_planned_as_the_scenario_plans_it():
    """`nnmem-sweep estimate --parallel ...,offload=optimizer+params` (estimate.layout_model): the same twin a
    scenario takes, under FSDP1 and FSDP2; ZeRO-Offload's layouts (DeepSpeed's) keep the hand model."""
    from nnmem_sweep.estimate import layout_model, resolve_model_name

    arch = resolve_model_name("llama-3.2-1b")
    fsdp1 = {"data_parallel": "2", "zero_stage": "3", "fsdp_version": "1", "offload": "optimizer+params"}
    assert layout_model(arch, "train", fsdp1).kind == "derived"
    assert layout_model(arch, "infer", fsdp1) is arch
    assert layout_model(arch, "train", {**fsdp1, "fsdp_version": "2"}).kind == "derived"
    assert layout_model(arch, "train", {**fsdp1, "offload": "none"}) is arch
    assert layout_model(arch, "train", {**fsdp1, "fsdp_version": "2", "offload": "optimizer"}) is arch
    with pytest.raises(UsageError, match="with gradient_accumulation > 1 is not modelled"):
        layout_model(arch, "train", {**fsdp1, "gradient_accumulation": "2"})


@pytest.mark.parametrize("version", [1, 2])
def test_fsdps_offload_under_shard_grad_op_is_planned_from_its_traced_rank(version):
    """FSDP's CPU offload at zero_stage 2 (SHARD_GRAD_OP; FSDP1's CPUOffload, FSDP2's CPUOffloadPolicy) is measured
    (tests/data/truth/sharded/*z2-offload-*, held to the traced rank by test_sharded_truth.py) and traced like
    FULL_SHARD's, but a ZeRO-3 rule meant for DeepSpeed's offload_param refused it at load time. Now LoRA and the full
    fine-tune of a transformer sharded over data_parallel alone are planned from their rank's trace (the derived
    twin); a layer list, tensor parallelism, DeepSpeed or a cluster search still need zero_stage 3."""
    from nnmem_sweep import columns as C
    from nnmem_sweep.config import parse_scenario_text
    from nnmem_sweep.errors import ScenarioError

    def scenario(finetune: str, parallel: str = ""):
        return parse_scenario_text(
            "model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: 2, seq_len: 1024, precision: bf16, optimizer: "
            f"adamw}}\n{finetune}parallel: {{data_parallel: 2, zero_stage: 2, fsdp_version: {version}, "
            f"offload: optimizer+params{parallel}}}\ngpus: [h100-sxm]\n")

    for finetune in ("finetune: {method: lora, rank: 16, alpha: 16, targets: [q_proj, v_proj]}\n", ""):
        sc = scenario(finetune)
        assert sc.model.kind == "derived" and sc.parallel[C.ZERO_STAGE] == (2,)
        assert sc.parallel[C.OFFLOAD] == ("optimizer+params",)
    with pytest.raises(ScenarioError, match="needs zero_stage 3"):
        scenario("", ", tensor_parallel: 2")
    # accumulating, FSDP's offload is not traced (fsdp_offload_problem): the full fine-tune would fall back to the hand
    # model, which holds no unsharded parameter on the GPU at zero_stage 2
    with pytest.raises(ScenarioError, match="needs zero_stage 3"):
        scenario("", ", gradient_accumulation: 2")
    # a cluster: search keeps the hand model, which would put no unsharded parameter on the GPU: refused there
    with pytest.raises(ScenarioError, match="a cluster: search does not take"):
        scenario("cluster: {max_gpus: 8, global_batch: 16}\n")
