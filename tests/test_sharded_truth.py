"""One rank of FSDP-sharded steps (FSDP2, and FSDP1 as accelerate wraps a model; issue 22; tests/data/truth/sharded/,
FSDPMemTracker or MemTracker on PyTorch's fake process group, the optimizer over the rank's local shards:
workload/fsdp.py) against the estimate of the same layout (data_parallel = the ranks, zero_stage 3 = FULL_SHARD,
2 = SHARD_GRAD_OP, fsdp_version; parallel/fsdp.py). The sharded fine-tunes (LoRA, QLoRA of a family planned from its
own code) are planned from the rank's traced step (derive/, workload/fsdp.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from nnmem_sweep import accuracy as A

TRUTH = Path(__file__).parent / "data" / "truth"
CASES = [c for c in A.load_cases(TRUTH, sharded=True) if c["inputs"].get("fsdp")]  # DeepSpeed's: test_deepspeed_truth
# full fine-tunes of a hand-modelled family (Llama 3.2 1B), estimated by the hand model of FSDP
HAND = ("llama-3.2-1b", "llama-3.1-8b")
# other hand-modelled families under FSDP: held to what their one-GPU estimate misses (below)
# FSDP1 without backward prefetch beside its BACKWARD_PRE twin (the Mixtral's checkpointed pairs: both measured here)
UNPREFETCHED = [c for c in CASES if c["inputs"]["fsdp"].get("backward_prefetch") == "none"]
MOE_CKPT_FSDP1 = [c for c in CASES if c["inputs"]["model"] == "mixtral-small" and c["inputs"]["checkpointing"] != "none"
                  and c["inputs"]["fsdp"].get("version") == 1]
OTHER_FAMILIES = [c for c in CASES if c["inputs"]["model"] in ("mixtral-small", "gpt2-medium")
                  and c["inputs"]["fsdp"]["world"] == 2 and c["inputs"]["batch"] == 2
                  and c["inputs"]["fsdp"]["zero_stage"] == 3 and c not in MOE_CKPT_FSDP1]
MOE = [c for c in CASES if c["inputs"]["model"] == "mixtral-small" and c not in MOE_CKPT_FSDP1]
# FSDP1's CPU offload: the GPU's side measured on one device (measure/truth.py gpu_side), held to it below
OFFLOADED = [c for c in CASES if c["inputs"]["fsdp"].get("offload")]
FSDP1_ALL = [c for c in CASES if c["inputs"]["fsdp"].get("version") == 1 and c not in OTHER_FAMILIES
             and c not in OFFLOADED and c not in MOE_CKPT_FSDP1]
FSDP1_ADAPTERS = [c for c in FSDP1_ALL if c["inputs"].get("finetune")]
FSDP1 = [c for c in FSDP1_ALL if c not in FSDP1_ADAPTERS]
FULL = [c for c in CASES if not c["inputs"].get("finetune") and c["inputs"]["model"] in HAND and c not in FSDP1
        and c not in OFFLOADED]
LLAMA_1B_BF16 = 1_235_814_400 * 2  # Llama 3.2 1B's parameters in bf16
QWEN3_BF16 = 596_049_920 * 2  # Qwen3 0.6B's parameters in bf16


def test_the_sharded_cases_are_committed_and_apart():
    worlds = {(c["inputs"]["fsdp"]["world"], c["inputs"]["fsdp"]["zero_stage"]) for c in FULL}
    assert worlds == {(w, z) for w in (2, 4, 8) for z in (2, 3)}
    assert any(c["inputs"].get("finetune", {}).get("method") == "qlora" for c in CASES)
    assert not any(c["inputs"].get("fsdp") for c in A.load_cases(TRUTH))  # the one-GPU catalog stays one-GPU


LONG = [c for c in FULL if c["inputs"]["seq_len"] >= 1024]  # the loss's moment is the backward's peak
SHORT = [c for c in FULL if c["inputs"]["seq_len"] < 1024]  # the blocks' backward or its end is


@pytest.mark.parametrize("case", LONG, ids=[c["case_id"] for c in LONG])
def test_every_phase_of_a_rank_within_16_kib(case):
    est = A.estimate_case(case)
    for phase, m in case["measured"]["phases"].items():
        assert abs(est["phases"][phase] - m["peak_bytes"]) <= 16 * 1024, phase


@pytest.mark.parametrize("case", SHORT, ids=[c["case_id"] for c in SHORT])
def test_a_short_sequence_peaks_past_the_loss_and_is_held_to_it(case):
    """Past the loss (parallel/fsdp.py fsdp_backward_end, fsdp_second_block, fsdp_last_block). Llama 3.2 1B under
    FULL_SHARD peaks at the embedding's backward: to the byte but 264 B. Llama 3.1 8B (untied head) under FULL_SHARD
    peaks at block 1's backward: 0.03 % low, the moment as traced there (L - 2 gradient shards, the layer's
    temporaries twice; it was 0.31 % high with one shard more and the temporaries once); SHARD_GRAD_OP at the second
    block's, every block but the top one still unsharded: 0.14 % high (one GPU's top-layer temporaries stand for the
    block's). Before, SHARD_GRAD_OP kept every block unsharded to the end (1B: +16 % at 2 ranks, +11 % at 4) and
    FULL_SHARD's later moments carried no gradients (8B: -12.9 %; 1B: -2.0 %, -6.0 %)."""
    est, stage = A.estimate_case(case), case["inputs"]["fsdp"]["zero_stage"]
    for phase, m in case["measured"]["phases"].items():
        tol = 0.005 * m["peak_bytes"] if phase == "backward" else 16 * 1024
        if case["inputs"]["model"] == "llama-3.1-8b" and phase == "forward":
            # 8B's forward at 128 tokens peaks in a block's forward: FULL_SHARD's first block (the root's and the
            # block's all-gather outputs, fsdp_first_block) to 67 KB, SHARD_GRAD_OP's last block not placed (52 MB
            # low); below the backward in the measurement and in the estimate (asserted below)
            tol = 0.0025 * m["peak_bytes"]
        if case["inputs"]["model"] == "llama-3.1-8b" and stage == 3 and phase == "backward":
            tol = 0.0005 * m["peak_bytes"]  # block 1's moment as traced
        assert abs(est["phases"][phase] - m["peak_bytes"]) <= tol, phase
    assert est["peak_phase"] == case["measured"]["peak_phase"] == "backward"


SHORT_1B = [c for c in SHORT if c["inputs"]["model"] == "llama-3.2-1b"]


@pytest.mark.parametrize("case", SHORT_1B, ids=[c["case_id"] for c in SHORT_1B])
def test_what_fsdp2_holds_past_the_loss(case):
    """FULL_SHARD at the embedding's backward: the shard and the root, the 16 blocks' gradient shards; SHARD_GRAD_OP
    in the second block's backward: every block unsharded but the top one, resharded after its backward."""
    world, stage = case["inputs"]["fsdp"]["world"], case["inputs"]["fsdp"]["zero_stage"]
    cats = case["measured"]["phases"]["backward"]["categories"]
    shard, block = LLAMA_1B_BF16 // world, 60_821_504 * 2
    root = (128_256 * 2_048 + 2_048) * 2
    if stage == 3:
        assert (cats["param"], cats["grad"]) == (shard + root, 16 * block // world)
    else:
        assert (cats["param"], cats["grad"]) == (shard + LLAMA_1B_BF16 - block, block // world)


@pytest.mark.parametrize("case", LONG, ids=[c["case_id"] for c in LONG])
def test_what_fsdp2_holds_at_the_backward_peak(case):
    """Measured facts the estimate encodes: a rank's shard is 1/world of every parameter (each dimension of Llama 3.2
    1B divides by 2, 4 and 8); at the loss's backward SHARD_GRAD_OP still holds every block unsharded beside the
    shard, FULL_SHARD only the root (embedding and final norm, kept from forward to backward) beside it."""
    world, stage = case["inputs"]["fsdp"]["world"], case["inputs"]["fsdp"]["zero_stage"]
    m = case["measured"]
    shard = LLAMA_1B_BF16 // world
    assert m["totals"]["param_bytes"] == shard
    root = (128_256 * 2_048 + 2_048) * 2  # tied embedding and head, the final norm
    params = m["phases"]["backward"]["categories"]["param"]
    assert params == shard + (LLAMA_1B_BF16 if stage == 2 else root)


@pytest.mark.parametrize("case", FSDP1, ids=[c["case_id"] for c in FSDP1])
def test_fsdp1_as_accelerate_wraps_it_every_phase_within_16_kib(case):
    """FSDP1 (FullyShardedDataParallel per block and at the root, limit_all_gathers; use_orig_params False, the
    default of accelerate's FSDP plugin, or True, the Trainer's), layout fsdp_version 1 (parallel.fsdp1_flat_gradients):
    every phase of the rank within 16 KiB, over 2, 4 and 8 ranks, both strategies, 128 and 1,024 tokens, with and
    without checkpointing; Qwen3 0.6B, a family planned from its own code, its rank's FSDP1 step traced (the shipped
    plans: derive/arch.py sharded). limit_all_gathers changes when blocks are freed on a GPU, not what is
    allocated."""
    from nnmem_sweep.derive import stored_only

    with stored_only():
        est = A.estimate_case(case)
    m = case["measured"]
    assert est["peak_phase"] == m["peak_phase"]
    for phase, measured in m["phases"].items():
        assert abs(est["phases"][phase] - measured["peak_bytes"]) <= 16 * 1024, phase


def test_fsdp1_is_not_fsdp2():
    """The version matters: Llama 3.1 8B over 8 ranks with FULL_SHARD, traced as FSDP1, holds 14,071,660,172 B at
    the root's flat-gradient concatenation (2·root, the root the embedding and the untied head: 2 x 2,101,354,496 B);
    FSDP2's estimate of the same layout is 10.2 % lower there and 8.7 % higher in the forward (FSDP2 keeps the first
    block's all-gather outputs beside the root's)."""
    case = next(c for c in FSDP1 if c["case_id"] == "llama-3.1-8b-fsdp1w8z3-train-bf16-adamw-b2-s128")
    as_fsdp2 = {**case, "inputs": {**case["inputs"], "fsdp": {**case["inputs"]["fsdp"], "version": 2}}}
    m, v1, v2 = case["measured"]["phases"], A.estimate_case(case), A.estimate_case(as_fsdp2)
    assert m["backward"]["peak_bytes"] == 14_071_660_172
    assert abs(v1["phases"]["backward"] - m["backward"]["peak_bytes"]) <= 1024
    assert v2["phases"]["backward"] / m["backward"]["peak_bytes"] == pytest.approx(0.8975, abs=1e-3)
    assert v2["phases"]["forward"] / m["forward"]["peak_bytes"] == pytest.approx(1.0865, abs=1e-3)
    # the forward's peak, FSDP1: the last block's output (all its parameters unsharded, every layer's saved)
    assert abs(v1["phases"]["forward"] - m["forward"]["peak_bytes"]) <= 1024


# adapters, and full fine-tunes of a family planned from its code
TRACED = [c for c in CASES if c not in FULL and c not in FSDP1 and c not in OTHER_FAMILIES and c not in MOE
          and c not in OFFLOADED and c not in MOE_CKPT_FSDP1]


@pytest.mark.parametrize("case", TRACED, ids=[c["case_id"] for c in TRACED])
def test_sharded_fine_tunes_are_their_ranks_traced_step(case):
    """LoRA of Qwen3 (every linear) and of Llama 3.2 1B and 3.1 8B (q and v) under FULL_SHARD and SHARD_GRAD_OP,
    FSDP2 and FSDP1, QLoRA of Qwen3, and Qwen3's full fine-tune under SHARD_GRAD_OP: planned from the rank's own
    traced step (the shipped sharded plans, no tracing here). Without checkpointing every phase to the byte, but
    FSDP1's optimizer phase under adapters, which its catch-all reshard lowers on a GPU and not on fake tensors
    (below); with checkpointing within 0.5 % (MemTracker's leftover of a checkpointed run, 16,777,216 B here,
    tests/test_finetune_derived.py)."""
    from nnmem_sweep.derive import stored_only

    with stored_only():
        est = A.estimate_case(case)
    ckpt = case["inputs"]["checkpointing"] != "none"
    for phase, m in case["measured"]["phases"].items():
        if case in FSDP1_ADAPTERS and phase == "optimizer":
            continue  # test_fsdp1_reshards_a_frozen_base_at_the_end_of_the_backward
        if ckpt and phase == "optimizer":
            # the step's own small peak, which MemTracker's leftover of a checkpointed run (the embedding's output
            # and its gradient, 33,554,432 B here) outweighs beside FSDPMemTracker's not counting QLoRA's quant
            # state (track_external is a no-op there): not compared
            continue
        tol = 0.005 if ckpt else 0.0
        assert abs(est["phases"][phase] - m["peak_bytes"]) <= tol * m["peak_bytes"], phase


ACCUM = [c for c in CASES if c["inputs"].get("gradient_accumulation", 1) > 1
         and c["inputs"].get("gradient_sync", "each") == "each"]
UNSYNCED = [c for c in CASES if c["inputs"].get("gradient_sync") == "last"]


def _twin(case, accum: str = ""):
    """The same case without accumulation (or with `accum`, "-accum4-" say, in its place)."""
    n = case["inputs"]["gradient_accumulation"]
    name = case["case_id"].replace(f"-accum{n}-", "-").replace(f"-accum{n}nosync-", accum or "-")
    return next(c for c in CASES if c["case_id"] == name)


def _holds_beside_its_twin(case, kept: int) -> None:
    """The forward and backward peaks are the twin's without accumulation plus `kept` bytes, measured and estimated
    (the shipped plans, no tracing here)."""
    from nnmem_sweep.derive import stored_only

    twin = _twin(case)
    with stored_only():
        est, est_twin = A.estimate_case(case), A.estimate_case(twin)
    for phase in ("forward", "backward"):
        measured = case["measured"]["phases"][phase]["peak_bytes"] - twin["measured"]["phases"][phase]["peak_bytes"]
        assert measured == kept, phase
        assert est["phases"][phase] - est_twin["phases"][phase] == kept, phase


# Qwen3 0.6B's LoRA adapters, rank 16 on every linear layer of its 28 layers (hidden 1024, 16 heads x 128 = 2048
# for q, 8 x 128 = 1024 for k and v, MLP 3072): r·(in + out) per target
QWEN3_ADAPTERS = 28 * 16 * ((1024 + 2048) + 2 * (1024 + 1024) + (2048 + 1024) + 3 * (1024 + 3072))  # 10,092,544


@pytest.mark.parametrize("case", ACCUM, ids=[c["case_id"] for c in ACCUM])
def test_accumulation_under_fsdp_keeps_the_ranks_gradient_shards(case):
    """Gradient accumulation over FULL_SHARD on 2 ranks: every micro-batch reduce-scatters into the gradient shards
    kept from the one before, so every phase holds them beside what the step without accumulation holds: Llama 3.2
    1B's bf16 gradients halved, 1,235,814,400 B; Qwen3's fp32 adapter gradients halved, 20,185,088 B; Qwen3's own
    bf16 gradients under FSDP1, its flat shards, 596,049,920 B. The estimate adds the same bytes (the rank's step
    traced with its shards kept, or the hand model of FSDP)."""
    whole = LLAMA_1B_BF16 if case["inputs"]["model"] == "llama-3.2-1b" else QWEN3_BF16
    shard = whole // 2 if "finetune" not in case["inputs"] else QWEN3_ADAPTERS * 4 // 2
    assert shard in (1_235_814_400, 20_185_088, 596_049_920)
    assert case["measured"]["phases"]["backward"]["categories"]["grad"] == shard
    _holds_beside_its_twin(case, shard)


@pytest.mark.parametrize("case", UNSYNCED, ids=[c["case_id"] for c in UNSYNCED])
def test_accumulation_synced_at_the_last_micro_batch_keeps_the_whole_unsharded_gradients(case):
    """accelerate's no_sync under FSDP2 (set_requires_gradient_sync(False) before every micro-batch but the last;
    FSDP1: FullyShardedDataParallel.no_sync() around them):
    the micro-batches keep the whole unsharded gradients, which the last one reduce-scatters, so the forward and
    the backward's peak hold them beside what the step without accumulation holds, FULL_SHARD or SHARD_GRAD_OP,
    over 2 or 4 ranks: Llama 3.2 1B's bf16 gradients, 2,471,628,800 B (world times the shard that syncing every
    micro-batch keeps); Qwen3's fp32 adapter gradients, 40,370,176 B; Qwen3's own bf16 gradients, 1,192,099,840 B
    (SHARD_GRAD_OP, traced from its code). The step after the last sync holds the shards
    only. The estimate: the hand model of FSDP keeps the unsharded gradients (parallel/plan.py), a model planned from
    its code is traced at its last micro-batch with them kept (derive/step.py); every phase as measured
    (test_every_phase_of_a_rank_within_16_kib, test_sharded_fine_tunes_are_their_ranks_traced_step)."""
    whole = QWEN3_ADAPTERS * 4 if "finetune" in case["inputs"] else \
        LLAMA_1B_BF16 if case["inputs"]["model"] == "llama-3.2-1b" else QWEN3_BF16
    assert whole in (2_471_628_800, 40_370_176, 1_192_099_840)
    world = case["inputs"]["fsdp"]["world"]
    m = case["measured"]
    assert m["phases"]["backward"]["categories"]["grad"] == whole
    if case["inputs"]["fsdp"].get("version") != 1:  # FSDP1's sharded flat gradients are not MemTracker's 'grad'
        assert m["phases"]["optimizer"]["categories"]["grad"] == whole // world  # the shards, reduce-scattered
    _holds_beside_its_twin(case, whole)


def test_a_scenario_with_both_versions_gives_the_measured_fsdp1_rank():
    """From a user's scenario (parallel.fsdp_version [1, 2]) to the truth: the FSDP1 row of Llama 3.1 8B over 8
    ranks with FULL_SHARD at 2 x 128 tokens peaks at the rank's measured bytes less the 4 B host-side `step` counter
    of each of its 33 flat parameters (a GPU's max_memory_allocated does not see them; the CPU trace does), and the
    FSDP2 row of the same layout 1.44 GB lower."""
    from nnmem_sweep.config import parse_scenario_text
    from nnmem_sweep.runner import run_scenario

    sc = parse_scenario_text(
        "model: {preset: llama-3.1-8b}\nmode: train\n"
        "grid: {batch: 2, seq_len: 128, precision: bf16, optimizer: adamw, optimizer_impl: foreach, "
        "checkpointing: none, attention: flash}\n"
        "parallel: {data_parallel: 8, zero_stage: 3, fsdp_version: [1, 2]}\ngpus: [h100-sxm]\n")
    rows = run_scenario(sc, bands=False).results.set_index("fsdp_version")
    case = next(c for c in FSDP1 if c["case_id"] == "llama-3.1-8b-fsdp1w8z3-train-bf16-adamw-b2-s128")
    measured = case["measured"]["peak_bytes"] - 4 * 33
    assert abs(int(rows.loc[1, "peak_allocated_bytes"]) - measured) <= 1024
    # test_fsdp1_is_not_fsdp2's 1,441,711,616 B, less FSDP2's own counters (one per tensor, 291: 1,032 B more)
    assert measured - int(rows.loc[2, "peak_allocated_bytes"]) == pytest.approx(1_441_711_616 + 1_032, abs=1024)


def test_a_rank_of_fsdp1_steps_its_flat_parameters():
    """FSDP1's rank (derive/arch.py sharded, version 1) holds one flat parameter per decoder block and one for the
    root, each ceil(elements / world): Qwen3 0.6B's block 15,730,944 elements (q 2048x1024, k and v 1024x1024,
    o 1024x2048, q_norm and k_norm 128, gate and up 3072x1024, down 1024x3072, two 1024 norms), its root the tied
    embedding 151,936 x 1,024 and the final norm; FSDP2's rank keeps each tensor, cut along dim 0."""
    from nnmem_sweep.config import parse_scenario_text
    from nnmem_sweep.derive.arch import sharded

    arch = parse_scenario_text("model: {preset: qwen3-0.6b}\nmode: train\ngrid: {batch: 1, seq_len: 8, "
                               "precision: bf16, optimizer: adamw}\ngpus: [h100-sxm]\n").model
    v1 = sharded(arch, 2, 3, 1).derived.card.tensors
    assert [(t.shape, t.count) for t in v1] == [((155_583_488 // 2,), 1), ((15_730_944 // 2,), 28)]
    v2 = sharded(arch, 2, 3).derived.card.tensors
    assert len(v2) == len(arch.derived.card.tensors) and v2[0].shape == (151_936 // 2, 1024)
    assert sharded(arch, 2, 3).derived.source.fsdp == {"world": 2, "zero_stage": 3}  # the shipped plans' key


# a frozen base's root (embedding, final norm, an untied head) and one decoder block, in bf16; QLoRA's block its
# linears' NF4 bytes (15,728,640 values of Qwen3 0.6B, two to a byte) and its four norms (2,304 values)
FROZEN_UNITS = {("qwen3-0.6b", "lora"): (311_166_976, 31_461_888),
                ("llama-3.2-1b", "lora"): (525_340_672, 121_643_008),
                ("llama-3.1-8b", "lora"): (2_101_354_496, 436_224_000),
                ("qwen3-0.6b", "qlora"): (311_166_976, 15_728_640 // 2 + 2_304 * 2)}


@pytest.mark.parametrize("case", FSDP1_ADAPTERS, ids=[c["case_id"] for c in FSDP1_ADAPTERS])
def test_fsdp1_reshards_a_frozen_base_at_the_end_of_the_backward(case):
    """Adapters under FSDP1 as the Trainer wraps them (peft's fsdp_auto_wrap_policy: each adapter a unit of its own,
    the frozen base in the blocks' units and the root's). A frozen flat parameter runs no post-backward hook; FSDP1
    reshards a block through a hook on its inputs' gradients, which the first block's inputs (the frozen
    embedding's output) lack unless checkpointing makes them require one, and the root after the backward, in its
    catch-all reshard, which skips a unit whose data pointer is its shard's: every fake tensor's is 0. So the
    measured rank (fake tensors) keeps the root and the first block unsharded into its optimizer step, beside
    FSDP2's shards (its twin's end), where real tensors reshard them (tests/measure/test_fsdp.py); the estimate
    frees them where the GPU does (derive/step.py _catch_all_reshard): the measured step less those bytes, its
    forward and backward as measured (test_sharded_fine_tunes_are_their_ranks_traced_step)."""
    from nnmem_sweep.derive import stored_only

    f, method = case["inputs"]["fsdp"], case["inputs"]["finetune"]["method"]
    root, block = FROZEN_UNITS[case["inputs"]["model"], method]
    held = root + (block if case["inputs"]["checkpointing"] == "none" else 0)
    if method == "lora":  # FSDP2's twin (QLoRA's is another recipe: uint8 storage, the rest in fp32)
        twin = next(c for c in CASES if c["case_id"] == case["case_id"].replace("-noprefetch", "").replace(
            f"fsdp1w{f['world']}z{f['zero_stage']}", f"fsdp{f['world']}z{f['zero_stage']}"))
        end = {c["case_id"]: c["measured"]["phases"]["optimizer"]["end_categories"]["param"] for c in (case, twin)}
        assert end[case["case_id"]] - end[twin["case_id"]] == held
    with stored_only():
        est = A.estimate_case(case)
    m = case["measured"]["phases"]["optimizer"]["peak_bytes"]
    # MemTracker's leftover of a checkpointed run, as above: 2 x b·s·h·4 B
    i = case["inputs"]
    leftover = 2 * i["batch"] * i["seq_len"] * case["hf_config"]["hidden_size"] * 4 if i["checkpointing"] != "none" \
        else 0
    assert est["phases"]["optimizer"] == m - held - leftover


@pytest.mark.parametrize("case", OTHER_FAMILIES, ids=[c["case_id"] for c in OTHER_FAMILIES])
def test_other_families_under_fsdp_miss_what_their_one_gpu_estimate_misses(case):
    """A 4-layer Mixtral (MoE blocks) and GPT-2 medium (Conv1D, learned positions, a tied head) over 2 ranks with
    FULL_SHARD, FSDP2 and FSDP1: every phase misses what the same step's one-GPU estimate misses, within 64 KiB
    (GPT-2's forward 200,933,400 B low on one GPU too)."""
    one = next(c for c in A.load_cases(TRUTH)
               if c["case_id"] == case["case_id"].replace("-fsdp2z3", "").replace("-fsdp1w2z3", ""))
    est, est_one = A.estimate_case(case), A.estimate_case(one)
    for phase, m in case["measured"]["phases"].items():
        miss = est["phases"][phase] - m["peak_bytes"]
        assert abs(miss - (est_one["phases"][phase] - one["measured"]["phases"][phase]["peak_bytes"])) <= 64 * 1024


@pytest.mark.parametrize("case", MOE, ids=[c["case_id"] for c in MOE])
def test_an_moe_rank_within_16_kib_in_every_phase(case):
    """The 4-layer Mixtral's rank under FSDP2 (FULL_SHARD over 2 and 4 ranks, with and without checkpointing;
    SHARD_GRAD_OP) and FSDP1, at 1,024 to 4,096 tokens: every phase within 16 KiB, below (the buffers and MemTracker's
    own few bytes). FULL_SHARD's block 1 peaks inside its experts' backward (parallel.fsdp2_last_block_experts):
    with the dense block's moment in its place the estimate was 1.79 % high at 2 x 512 over 2 (FINDINGS.md)."""
    est = A.estimate_case(case)
    for phase, m in case["measured"]["phases"].items():
        assert -16 * 1024 <= est["phases"][phase] - m["peak_bytes"] <= 0, phase


def _tensor_lists():
    """Cards of a block-repeated model: (name, shape, count, trainable) tuples, the repeated ones named with `*`,
    adapters (trainable) among frozen tensors or none."""
    from hypothesis import strategies as st

    dims = st.integers(1, 300)
    one = st.tuples(st.sampled_from(["layers.*.w", "layers.*.a", "embed", "norm"]), st.lists(dims, min_size=1,
                    max_size=2), st.booleans())
    return st.lists(one, min_size=1, max_size=8)


def test_an_fsdp1_rank_card_keeps_every_element_once_and_each_adapter_apart():
    """Property of FSDP1's rank card (derive/arch.py _flat_shards): the frozen tensors (or every tensor, where none is
    frozen) flattened into one flat parameter per block and one for the root, each ceil(elements / world) on the rank;
    under adapters each trainable tensor a flat parameter of its own, ceil(its elements / world), still trainable,
    and the flat parameters of the frozen base not trainable."""
    import math

    from hypothesis import given, settings, strategies as st

    from nnmem_sweep.derive.arch import _flat_shards
    from nnmem_sweep.derive.card import TensorInfo

    @settings(max_examples=200, deadline=None)
    @given(_tensor_lists(), st.integers(1, 12), st.integers(2, 8))
    def check(specs, blocks, world):
        tensors = tuple(TensorInfo(name=n, shape=tuple(s), count=blocks if "*" in n else 1, trainable=t)
                        for n, s, t in specs)
        out = _flat_shards(tensors, world)
        frozen = [t for t in tensors if not t.trainable]
        base = frozen or list(tensors)
        elements = {k: sum(t.count * math.prod(t.shape) for t in base if ("*" in t.name) == k) for k in (True, False)}
        flat = [t for t in out if t.name.endswith("flat_param")]
        root = next(t for t in flat if "*" not in t.name)
        assert root.shape == (-(-elements[False] // world),) and root.trainable == (not frozen)
        if elements[True]:
            block = next(t for t in flat if "*" in t.name)
            assert block.count == blocks and block.shape == (-(-(-(-elements[True] // blocks)) // world),)
            assert block.shape[0] * world * blocks >= elements[True]
        own = [t for t in out if not t.name.endswith("flat_param")]
        assert own == ([TensorInfo(name=t.name, shape=(-(-math.prod(t.shape) // world),), count=t.count,
                                   trainable=True) for t in tensors if t.trainable] if frozen else [])

    check()


@pytest.mark.parametrize("case", OFFLOADED, ids=[c["case_id"] for c in OFFLOADED])
def test_fsdp1_cpu_offload_is_its_ranks_traced_gpu_side(case):
    """LoRA of Llama 3.2 1B (q, v) under FSDP1 with CPUOffload(offload_params=True), FULL_SHARD and SHARD_GRAD_OP,
    with and without checkpointing, FSDP-QLoRA of Qwen3 0.6B as Answer.AI runs it (full checkpointing), and Llama 3.2
    1B's full fine-tune under both strategies (a hand-modelled family, planned from its own code here: its hand model
    of ZeRO-Offload was 5.5 % high under FULL_SHARD, config_model.check_offloaded_ranks); and FSDP2's
    CPUOffloadPolicy (LoRA under both strategies, the full fine-tune): the
    forward and backward of the GPU's side (the measured step less the host's shards, CPU gradients and optimizer
    state: measure/truth.py gpu_side) are the rank's traced plan with the shards and CPU gradients host memory
    (the shipped plans, no tracing here): to the byte, but for MemTracker's leftover of a checkpointed run (the
    embedding's output and its gradient in bf16, b·s·h·4 B, as above). The optimizer steps on the host: the GPU's
    optimizer phase is what the backward leaves, no state."""
    from nnmem_sweep.derive import stored_only

    with stored_only():
        est = A.estimate_case(case)
    i = case["inputs"]
    leftover = i["batch"] * i["seq_len"] * case["hf_config"]["hidden_size"] * 4 if i["checkpointing"] != "none" \
        else 0
    assert set(case["measured"]["phases"]) == {"forward", "backward"}
    for phase, m in case["measured"]["phases"].items():
        assert est["phases"][phase] == m["peak_bytes"] - leftover, phase
    assert est["optimizer_bytes"] == est["master_weights_bytes"] == est["gradients_bytes"] == 0


def test_fsdp1_cpu_offload_takes_the_shards_and_the_optimizer_state_off_the_gpu():
    """Two MemTracker runs of the same LoRA rank (Llama 3.2 1B, q and v, FULL_SHARD over 2, 2 x 1,024), without and
    with CPU offload: the GPU's side of the offloaded backward peak is the other's less the rank's flat-parameter
    shards (1,239,222,272 B, its param_bytes) and the optimizer state (6,816,000 B, AdamW's of the adapters' shards
    and their step counters), at the same moment (the loss's backward); the pool holds the shards' CPU gradients
    beside them (FINDINGS.md). The host per rank the estimate gives: the shards and their CPU gradients, AdamW's
    state and its foreach temporaries of the step it runs there."""
    from nnmem_sweep.derive import stored_only

    by_id = {c["case_id"]: c for c in CASES}
    plain = by_id["llama-3.2-1b-lora-r16-qv-fsdp1w2z3-train-bf16-adamw-b2-s1024"]["measured"]
    off = by_id["llama-3.2-1b-lora-r16-qv-fsdp1w2z3-offload-train-bf16-adamw-b2-s1024"]
    shards, state = 1_239_222_272, 6_816_000
    assert plain["totals"]["param_bytes"] == shards and plain["totals"]["optimizer_state_bytes"] == state
    back = off["measured"]["phases"]["backward"]
    assert back["peak_bytes"] == plain["phases"]["backward"]["peak_bytes"] - shards - state
    assert back["pool_peak_bytes"] == plain["phases"]["backward"]["peak_bytes"] + shards  # + the CPU gradients
    assert back["op"] == plain["phases"]["backward"]["op"] == "_log_softmax_backward_data"
    with stored_only():
        est = A.estimate_case(off)
    adapters = 16 * 16 * (2048 + 2048 + 2048 + 512) // 2  # r·(in + out) of q and v in 16 layers, the rank's half
    per_node = 8  # gpus_per_node's default: the host check is per node
    assert est["host_bytes_per_node"] == per_node * (2 * shards + 2 * 4 * adapters + 4 * adapters)


def _prefetched_twin(case):
    return next(c for c in CASES if c["case_id"] == case["case_id"].replace("-noprefetch", ""))


@pytest.mark.parametrize("case", UNPREFETCHED, ids=[c["case_id"] for c in UNPREFETCHED])
def test_fsdp1_without_backward_prefetch_every_phase_as_measured(case):
    """FSDP1 without backward prefetch (layout backward_prefetch none: accelerate's and the Trainer's default unless
    fsdp_backward_prefetch is set), measured beside the same step with BACKWARD_PRE: FULL_SHARD's backward peaks
    exactly one decoder block lower where it peaks at the loss (the root's backward prefetches the last block:
    Llama 3.2 1B 121,643,008 B over 2 and 4 ranks, with and without checkpointing, adapters too; Qwen3 0.6B
    31,461,888 B), unchanged at the root's concatenation (short sequences, Llama 3.1 8B over 8) and under
    SHARD_GRAD_OP; an MoE whose blocks outweigh its root peaks at block 0's concatenation instead (the other L - 1
    blocks' gradient shards: parallel.fsdp1_block0_unprefetched), 115,548,160 and 91,270,144 B lower at 1,024 and
    128 tokens. The estimate follows each phase within 16 KiB, its forward and step the same both ways. (A 4-block
    Llama of hidden 256 with every layer checkpointed, peaking in a block's recomputation, is 6 % low both ways:
    tests/data/truth/FINDINGS.md.)"""
    from nnmem_sweep.derive import stored_only

    twin = _prefetched_twin(case)
    with stored_only():
        est, est_twin = A.estimate_case(case), A.estimate_case(twin)
    m, m_twin = case["measured"]["phases"], twin["measured"]["phases"]
    i, f = case["inputs"], case["inputs"]["fsdp"]
    drop = m_twin["backward"]["peak_bytes"] - m["backward"]["peak_bytes"]
    block = {"llama-3.2-1b": 60_821_504 * 2, "qwen3-0.6b": 15_730_944 * 2}.get(i["model"])
    if i["model"] == "mixtral-small":
        assert drop == {1024: 115_548_160, 128: 91_270_144}[i["seq_len"]]
    elif f["zero_stage"] == 2 or i["seq_len"] < 1024:
        assert drop == 0
    else:
        assert drop == block
    for phase in m:
        # the Mixtral's forward: below; adapters' step: the frozen base resharded (test_fsdp1_reshards_a_frozen_base...)
        if (i["model"] != "mixtral-small" or phase == "backward") and not (i.get("finetune") and phase == "optimizer"):
            assert abs(est["phases"][phase] - m[phase]["peak_bytes"]) <= 16 * 1024, phase
        if phase != "backward":
            assert m[phase]["peak_bytes"] == m_twin[phase]["peak_bytes"]
            assert est["phases"][phase] == est_twin["phases"][phase]
    assert est["peak_phase"] == case["measured"]["peak_phase"] == "backward"


@pytest.mark.parametrize("case", MOE_CKPT_FSDP1, ids=[c["case_id"] for c in MOE_CKPT_FSDP1])
def test_an_moe_under_fsdp1_with_checkpointing_peaks_as_measured(case):
    """The 4-layer Mixtral under FSDP1 FULL_SHARD over 2 ranks with every layer checkpointed, with and without
    backward prefetch: the backward (the step's peak) within 16 KiB. Its forward at 128 tokens is 14,178,624 B low
    (inside a checkpointed expert block's forward, not placed), 4 % below the backward either way."""
    est, m = A.estimate_case(case), case["measured"]
    assert abs(est["phases"]["backward"] - m["phases"]["backward"]["peak_bytes"]) <= 16 * 1024
    assert est["peak_phase"] == m["peak_phase"] == "backward"
    assert 0 <= m["phases"]["forward"]["peak_bytes"] - est["phases"]["forward"] <= 14_178_624
    assert est["phases"]["forward"] < 0.97 * est["phases"]["backward"]
