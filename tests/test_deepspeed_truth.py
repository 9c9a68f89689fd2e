"""One rank of DeepSpeed's own ZeRO-1/2 engine (issue 22; tests/data/truth/deepspeed/: DeepSpeed 0.19.8 on PyTorch's
fake process group under FakeTensorMode, recorded by derive/trace.py's Recorder: measure/zero_step.py) against the
hand model of the same layout (data_parallel = the ranks, zero_stage, parallel.deepspeed's reduce_bucket_size;
precision bf16-master: bf16 parameters and gradients, the fp32 partition and AdamW state over it)."""
from __future__ import annotations

from pathlib import Path

import pytest

from nnmem_sweep import accuracy as A

TRUTH = Path(__file__).parent / "data" / "truth"
# ZeRO-Offload's cases (the GPU side of a rank whose step runs on the host): tests/test_deepspeed_offload.py
CASES = [c for c in A.load_cases(TRUTH, sharded=True) if c["inputs"].get("deepspeed")
         and c["inputs"]["deepspeed"].get("offload", "none") == "none"]
IDS = [c["case_id"] for c in CASES]
EMBEDDING_1B = 128_256 * 2_048  # Llama 3.2 1B's (tied) embedding, elements


def _case(world: int, stage: int, seq: int, bucket: int = 500_000_000, model: str = "llama-3.2-1b"):
    return next(c for c in CASES if c["inputs"]["model"] == model and c["inputs"]["seq_len"] == seq
                and not c["inputs"].get("finetune") and not c["inputs"].get("gradient_accumulation")
                and c["inputs"]["deepspeed"] == {"world": world, "zero_stage": stage, "reduce_bucket_size": bucket})


def test_the_deepspeed_cases_are_committed_with_their_release():
    layouts = {(c["inputs"]["deepspeed"]["world"], c["inputs"]["deepspeed"]["zero_stage"]) for c in CASES}
    assert {(2, 1), (2, 2), (4, 1), (4, 2), (8, 2), (2, 3)} <= layouts
    assert {c["versions"]["deepspeed"] for c in CASES} == {"0.19.8"}  # a figure holds for its stack
    assert all(c["inputs"]["precision"] == "bf16-master" for c in CASES)


def _lora_zero3(case) -> bool:
    return bool(case["inputs"].get("finetune")) and case["inputs"]["deepspeed"]["zero_stage"] == 3


HELD = CASES  # LoRA under ZeRO-3 too, since its truth holds the bucket kept from step to step


@pytest.mark.parametrize("case", HELD, ids=[c["case_id"] for c in HELD])
def test_a_ranks_peak_within_half_a_percent_in_its_phase(case):
    est, m = A.estimate_case(case), case["measured"]
    assert est["peak_phase"] == m["peak_phase"]
    assert abs(est["peak_bytes"] - m["peak_bytes"]) <= 0.005 * m["peak_bytes"]


ZERO12 = [c for c in CASES if c["inputs"]["deepspeed"]["zero_stage"] < 3
          and not c["inputs"].get("gradient_accumulation")]  # accumulating: test_accumulation_...
ZERO3 = [c for c in CASES if c["inputs"]["deepspeed"]["zero_stage"] == 3 and not c["inputs"].get("finetune")]


@pytest.mark.parametrize("case", ZERO12, ids=[c["case_id"] for c in ZERO12])
def test_the_step_within_half_a_percent_and_the_forward_within_64_kib(case):
    """The step: the rank's fp32 gradient partition beside the update's temporaries, or the fp64 copy of its largest
    gradient for the norm (parallel/states.py deepspeed_step_gradients, deepspeed_norm_temp); what the estimate
    leaves out is the rest of the tensor that straddles the partition's end (19-34 MB here). With full checkpointing
    the forward is 3.1 KB a layer high (49,452 B over 16 layers, 98,928 B over 32; one GPU's is 33 KB low), not
    placed: within 4 KiB a layer."""
    est, m = A.estimate_case(case)["phases"], case["measured"]["phases"]
    assert abs(est["optimizer"] - m["optimizer"]["peak_bytes"]) <= 0.005 * m["optimizer"]["peak_bytes"]
    layers = case["hf_config"]["num_hidden_layers"]
    bound = 4096 * layers if case["inputs"]["checkpointing"] == "full" else 64 * 1024
    assert abs(est["forward"] - m["forward"]["peak_bytes"]) <= bound


LONG = [c for c in ZERO12 if c["inputs"]["seq_len"] >= 1024 and c["inputs"]["model"] == "llama-3.2-1b"]


@pytest.mark.parametrize("case", LONG, ids=[c["case_id"] for c in LONG])
def test_the_backward_at_the_activations_peak_within_64_kib(case):
    """With the reduce bucket counted through the backward (5e8 elements x 2 B): the loss's moment, the same on
    every rank."""
    est, m = A.estimate_case(case)["phases"], case["measured"]["phases"]
    assert abs(est["backward"] - m["backward"]["peak_bytes"]) <= 64 * 1024


@pytest.mark.parametrize("case", ZERO12, ids=[c["case_id"] for c in ZERO12])
def test_both_ends_of_the_flat_buffer_are_measured_and_the_larger_kept(case):
    """ZeRO-1/2 cut one flat buffer into the ranks' partitions: rank 0 and the last rank are measured (truth.py
    end_ranks), `measured` per phase the larger."""
    m, world = case["measured"], case["inputs"]["deepspeed"]["world"]
    assert set(m["ranks"]) == {"0", str(world - 1)}
    for phase, mp in m["phases"].items():
        assert mp["peak_bytes"] == max(r[phase]["peak_bytes"] for r in m["ranks"].values())


def test_the_last_rank_makes_its_gradient_partition_at_the_first_bucket():
    """Llama 3.1 8B over 8 (untied head of 525 M elements, larger than the 5e8-element bucket): the last rank holds
    the head, reduced alone at the backward's first bucket, and makes its partition there beside every activation;
    2 % above rank 0's backward (the loss's moment). The estimate is the last rank's (parallel/zero_bucket.py),
    16 MB low: the rest of the tensor across the partition's start, which the last rank holds whole."""
    case = _case(8, 2, 1024, model="llama-3.1-8b")
    ranks = case["measured"]["ranks"]
    last, first = ranks["7"]["backward"]["peak_bytes"], ranks["0"]["backward"]["peak_bytes"]
    assert last > 1.02 * first
    est = A.estimate_case(case)["phases"]["backward"]
    assert 0 <= last - est <= 17_000_000
    # Llama 3.2 1B over 2 (tied): the last rank's partition is made half way through the layers, and its backward
    # ends at three embedding gradients beside it (the head's, the embedding's and their sum): 8 % above rank 0's
    tied = _case(2, 2, 64)["measured"]["ranks"]
    assert tied["1"]["backward"]["peak_bytes"] > 1.08 * tied["0"]["backward"]["peak_bytes"]
    # Mistral 7B over 8 (an untied head smaller than the bucket, which holds it and one layer): the last rank's
    # partition is made in the second layer's backward, 2.8 % above rank 0; the estimate counts that layer's
    # activations whole, 22 MB (0.05 %) high
    case = _case(8, 2, 1024, model="mistral-7b")
    ranks = case["measured"]["ranks"]
    last = ranks["7"]["backward"]["peak_bytes"]
    assert last > 1.027 * ranks["0"]["backward"]["peak_bytes"]
    assert 0 <= A.estimate_case(case)["phases"]["backward"] - last <= 0.0006 * last


SHORT = [c for c in ZERO12 if c["inputs"]["seq_len"] < 1024 and not c["inputs"].get("finetune")]
LORA = [c for c in CASES if c["inputs"].get("finetune") and not _lora_zero3(c)]
LORA3 = [c for c in CASES if _lora_zero3(c)]


@pytest.mark.parametrize("case", SHORT, ids=[c["case_id"] for c in SHORT])
def test_the_backwards_end_is_within_a_fifth_of_a_percent_and_below_the_step(case):
    """The backward's end on its most loaded rank: ZeRO-2's last rank with its partition made at the first bucket
    and a tied head's gradient beside the embedding's and their sum (zero_bucket.first_bucket), ZeRO-1 reducing
    every gradient after the backward (zero_bucket.zero1_reduction). Each was 1.5-4.3 % off before; left out: the
    rest of the tensor across the partition's end (up to 19 MB). In every case the step is higher."""
    est, m = A.estimate_case(case)["phases"], case["measured"]["phases"]
    assert abs(est["backward"] - m["backward"]["peak_bytes"]) <= 0.002 * m["backward"]["peak_bytes"]
    assert m["backward"]["peak_bytes"] < m["optimizer"]["peak_bytes"] and est["backward"] < est["optimizer"]


@pytest.mark.parametrize("case", LORA, ids=[c["case_id"] for c in LORA])
def test_lora_under_deepspeed_every_phase_within_a_quarter_percent(case):
    """One GPU's LoRA step with the adapters in bf16 (DeepSpeed's engine casts them), the frozen base whole on every
    rank, the adapters' fp32 partition and AdamW state, the reduce bucket whole through the backward: every phase
    within 33 KB, but the short sequence's backward under the default bucket, 0.21 % high (7.6 MB)."""
    est, m = A.estimate_case(case)["phases"], case["measured"]["phases"]
    for phase, mp in m.items():
        assert abs(est[phase] - mp["peak_bytes"]) <= 0.0025 * mp["peak_bytes"], phase


def test_lora_ranks_hold_the_whole_base_and_their_share_of_the_adapters():
    m = next(c for c in LORA if c["inputs"]["deepspeed"]["world"] == 2
             and c["inputs"]["finetune"]["targets"] == ["q_proj", "v_proj"])["measured"]["totals"]
    adapters = 16 * 16 * ((2_048 + 2_048) + (2_048 + 512))  # r16 on q (2048 x 2048) and v (512 x 2048), 16 layers
    assert m["param_bytes"] == 2 * (1_235_814_400 + adapters)  # base and adapters in bf16 on every rank
    assert m["master_bytes"] == 4 * adapters // 2
    assert m["opt_bytes"] == 2 * 4 * adapters // 2 + 4


@pytest.mark.parametrize("case", LORA3, ids=[c["case_id"] for c in LORA3])
def test_lora_under_zero3_every_phase_within_half_a_percent(case):
    """DeepSpeed ZeRO-3 (real tensors), the frozen base partitioned and gathered as a full fine-tune's, its linears
    saving their inputs (finetune.zero3_linear_inputs), the reduce bucket and the adapters' gradient partition kept
    from the step before (parallel.deepspeed_kept_bucket, grads_live_in_forward): forward and backward 0.37-0.50 %
    low (the gathered parameters' overshoot of stage3_max_live_parameters, 18.5 MB in the q/v case), the step to
    86 KB and 3.4 MB. The backward was '4.5 % high' on the q/v case while the truth missed the kept bucket (1.0 GB,
    unregistered until the backward's first use of it). The peak's phase is the measured one."""
    est, m = A.estimate_case(case), case["measured"]
    assert est["peak_phase"] == m["peak_phase"] == "backward"
    for phase, within in (("forward", 0.006), ("backward", 0.005), ("optimizer", 0.002)):
        assert abs(est["phases"][phase] - m["phases"][phase]["peak_bytes"]) <= within * m["phases"][phase]["peak_bytes"]


def test_lora_under_zero3_ranks_hold_their_partition_and_the_small_adapters_whole():
    """stage3_param_persistence_threshold (1e5 elements): an adapter tensor that small stays whole on every rank
    beside its share of the flat 16-bit partition; the frozen base is partitioned (parallel/states.py
    deepspeed_adapter_weights); the norms, persistent too, are not counted."""
    from nnmem_sweep.catalog.optimizers import get_optimizer
    from nnmem_sweep.catalog.precisions import get_precision
    from nnmem_sweep.parallel.layout import Layout
    from nnmem_sweep.parallel.states import rank_states

    norms = 33 * 2_048 * 2
    for case in LORA3:
        ds, held = case["inputs"]["deepspeed"], case["measured"]["totals"]["param_bytes"]
        lay = Layout(dp=ds["world"], zero=3, reduce_bucket=ds["reduce_bucket_size"], prefetch_bucket=50_000_000)
        states, _ = rank_states(A.architecture_of(case), get_precision("bf16-master"), get_optimizer("adamw"),
                                "foreach", lay)
        assert states.weights - states.gathered + norms == held
    (qv,) = [c for c in LORA3 if c["inputs"]["finetune"]["targets"] == ["q_proj", "v_proj"]
             and not c["inputs"].get("gradient_accumulation")]
    adapters = 16 * 16 * ((2_048 + 2_048) + (2_048 + 512))  # each tensor 32,768 or 8,192 elements: whole
    assert qv["measured"]["totals"]["param_bytes"] == 1_235_814_400 + 2 * adapters + adapters + norms


@pytest.mark.parametrize("case", ZERO3, ids=[c["case_id"] for c in ZERO3])
def test_zero3_its_step_to_the_byte_its_forward_within_a_fifth_of_a_percent_its_backward_within_3_4(case):
    """DeepSpeed's ZeRO-3 (real tensors: it does not partition fake ones), Llama 3.2 1B over 2 ranks at 128 and 512
    tokens. Its step holds the 16-bit gradient partition beside the fp32 copy and no gathered parameters
    (parallel/states.py deepspeed_step_gradients): to 2,348 B (it was 11.7 % low). Its forward keeps gathered
    parameters alive up to stage3_max_live_parameters (deepspeed_gathered_bytes) beside the bucket and gradient
    partition kept from the step before: 0.12-0.14 % low. Its backward peaks at the first bucket reduced
    (zero_bucket.first_bucket), the bucket's gradients flattened beside it, half the activations freed: at 512 tokens
    (the backward the peak) 0.11 % low; at 128 tokens 3.3 % high, counting the forward's gathered parameters there,
    which DeepSpeed has partly released."""
    est, m = A.estimate_case(case)["phases"], case["measured"]["phases"]
    assert abs(est["optimizer"] - m["optimizer"]["peak_bytes"]) <= 16 * 1024
    assert 0 <= m["forward"]["peak_bytes"] - est["forward"] <= 0.0017 * m["forward"]["peak_bytes"]
    assert -0.0015 * m["backward"]["peak_bytes"] <= est["backward"] - m["backward"]["peak_bytes"] <= \
        0.034 * m["backward"]["peak_bytes"]
    assert case["measured"]["totals"]["param_bytes"] == 1_235_814_400 + 33 * 2_048 * 2  # partition + whole norms


ACCUM = [c for c in CASES if c["inputs"].get("gradient_accumulation") and not _lora_zero3(c)]  # ZeRO-3: LORA3
STRADDLE_1B_2 = 19_372_032  # the tensor across the end of Llama 3.2 1B's first partition of 2: kept whole, not counted


@pytest.mark.parametrize("case", ACCUM, ids=[c["case_id"] for c in ACCUM])
def test_accumulation_every_phase_within_64_kib_but_the_partitions_straddling_tensor(case):
    """2 micro-batches per step (gradient_accumulation_steps): the second finds kept what the first left, ZeRO-1 the
    whole 16-bit gradients and the reduce bucket (parallel.deepspeed_kept_bucket: 1.0 GB, the estimate 5.0 % low
    without it), ZeRO-2 its 16-bit gradient partition, LoRA its adapters' (every phase within 33 KB of the estimate,
    but the short sequence's backward, 0.21 % high as without accumulation). Full fine-tunes keep the tensor across
    the partition's end whole as well, which the estimate does not count."""
    est, m = A.estimate_case(case)["phases"], case["measured"]["phases"]
    lora, short = bool(case["inputs"].get("finetune")), case["inputs"]["seq_len"] < 1024
    for phase, mp in m.items():
        gap = est[phase] - mp["peak_bytes"]
        if lora and short and phase == "backward":
            assert 0 < gap <= 0.0025 * mp["peak_bytes"]
        elif lora or (phase != "optimizer" and case["inputs"]["deepspeed"]["zero_stage"] == 1):
            assert abs(gap) <= 64 * 1024, phase
        else:
            assert abs(gap + STRADDLE_1B_2) <= 64 * 1024, phase


def test_zero1_with_accumulation_keeps_the_bucket_beside_the_whole_gradients():
    m = next(c for c in ACCUM if c["inputs"]["deepspeed"]["zero_stage"] == 1)["measured"]["phases"]
    one = _case(2, 1, 1024)["measured"]["phases"]
    # the second micro-batch starts from what the first left: whole bf16 gradients and a 5e8-element bf16 bucket
    assert m["forward"]["start_bytes"] - one["forward"]["start_bytes"] == 1_235_814_400 * 2 + 500_000_000 * 2


def test_zero3_keeps_its_bucket_and_gradient_partition_from_step_to_step():
    """ZeRO-3 makes its reduce bucket (5e8 bf16 elements) and its flat 16-bit gradient partition once and keeps them
    (stage3.py): a step, or a micro-batch, starts with both (the truth registers them: zero_engine.held_tensors). The
    full fine-tune's partition is half of Llama 3.2 1B's 1,235,814,400 parameters, LoRA's half of its q/v adapters'
    1,703,936 (2 KiB more with accumulation); the estimate holds both in every phase (deepspeed_kept_bucket,
    grads_live_in_forward), where without them it was 16 % low in the forward (they were missing in the truth too)."""
    full = next(c for c in ZERO3 if c["inputs"]["seq_len"] == 128)["measured"]["totals"]
    assert full["grad_bytes"] == 1_000_000_000 + 1_235_814_400
    for case in LORA3:
        kept = case["measured"]["totals"]["grad_bytes"] - 1_000_000_000
        world = case["inputs"]["deepspeed"]["world"]
        if case["inputs"]["finetune"]["targets"] == ["q_proj", "v_proj"]:
            assert 0 <= kept - 2 * 1_703_936 // world <= 4096


def test_zero1_holds_what_zero2_holds_from_the_backwards_end():
    """DeepSpeed 0.19.8's ZeRO-1 keeps each rank's gradient partition, as ZeRO-2 does, once the backward is over
    (the hand model of ZeRO-1 keeps the whole gradients until then)."""
    for world in (2, 4):
        z1, z2 = _case(world, 1, 1024)["measured"], _case(world, 2, 1024)["measured"]
        assert z1["phases"]["optimizer"] == z2["phases"]["optimizer"]
        # the 16-bit partition, 2 B a parameter over `world` ranks, and the rest of the tensor across its end
        held = z1["phases"]["optimizer"]["start_bytes"] - z1["phases"]["forward"]["start_bytes"]
        partition = 1_235_814_400 * 2 // world
        assert partition < held < partition + 2 * 16_777_216 * 2


def test_over_four_ranks_the_step_peaks_at_the_embeddings_gradient_in_fp64():
    """get_grad_norm_direct converts each gradient of the partition to fp64 (zero/utils.py get_norm_dtype): over 4
    ranks the embedding's 262,668,288 elements x 8 B outweigh the fp32 update."""
    opt = _case(4, 2, 1024)["measured"]["phases"]["optimizer"]
    assert abs(opt["peak_bytes"] - opt["start_bytes"] - 8 * EMBEDDING_1B) <= 16


def test_the_states_between_steps_are_the_flat_parameters_and_the_fp32_partition():
    m = _case(8, 2, 1024, model="llama-3.1-8b")["measured"]["totals"]
    psi = 8_030_261_248
    assert m["param_bytes"] == 2 * psi  # every rank keeps the whole bf16 model under ZeRO-1/2
    assert m["master_bytes"] == 4 * psi // 8
    assert m["opt_bytes"] == 2 * 4 * psi // 8 + 4  # AdamW's two moments and its step count


def test_the_engines_settings_are_checked_and_become_a_ds_config():
    from nnmem_sweep.workload import zero_engine as Z

    spec = {"world": 4, "zero_stage": 1, "reduce_bucket_size": 10_000_000}
    cfg = Z.ds_config(spec, 2)
    assert cfg["zero_optimization"] == {"stage": 1, "reduce_bucket_size": 10_000_000}
    assert cfg["bf16"] == {"enabled": True} and cfg["train_micro_batch_size_per_gpu"] == 2
    for bad, words in (({"world": 1}, "world must be at least 2"), ({"world": 2, "zero_stage": 4}, "1, 2 or 3"),
                       ({"world": 2, "bucket": 1}, "unknown setting 'bucket'")):
        with pytest.raises(ValueError, match=words):
            Z.check(bad)


def test_regenerating_a_deepspeed_case_without_deepspeed_is_one_line(capsys):
    from nnmem_sweep.derive.cache import installed
    from nnmem_sweep.errors import UsageError
    from nnmem_sweep.measure.truth import regenerate

    if installed("deepspeed"):
        pytest.skip("DeepSpeed is installed here: the case would be measured")
    with pytest.raises(UsageError, match=r"runs DeepSpeed's engine, which is not installed: pip install deepspeed"):
        regenerate(Path("unused"), [IDS[0]])


def test_make_accuracy_compares_them_within_their_tolerance():
    table = A.compare(CASES)
    assert len(table) == len(CASES) and table["within_tolerance"].all()
    assert (table["measured_phase"] == table["estimated_phase"]).all()
