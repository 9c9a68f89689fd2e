"""Model states per GPU (parallel/states.py): ZeRO Table 1, DeepSpeed's ZeRO-3 estimator, the tensor/pipeline split."""
from __future__ import annotations

import pytest

from nnmem_sweep.catalog.optimizers import get_optimizer
from nnmem_sweep.catalog.precisions import get_precision
from nnmem_sweep.components.weights import param_summary
from nnmem_sweep.models.arch import Architecture
from nnmem_sweep.models.presets import load_preset
from nnmem_sweep.parallel.layout import Layout
from nnmem_sweep.parallel.states import rank_states, stage_params
from nnmem_sweep.units import GB, GiB

MASTER = get_precision("bf16-master")
ADAM = get_optimizer("adam")


def params_model(psi: int, largest: int = 0) -> Architecture:
    return Architecture(name=f"{psi} params", kind="params", family="params", params=psi,
                        largest_layer_params=largest, origin="test")


def model_states(st) -> int:
    """Weights, gradients, master copy and optimizer state, without ZeRO-3's gathered parameters (a buffer)."""
    return st.weights - st.gathered + st.gradients + st.master + st.optimizer


# ZeRO (Rajbhandari et al. 2019, arXiv 1910.02054) Table 1: Ψ = 7.5B, K = 12, per-device model states in GB
# (decimal). The row for N_d = 4 reads 52.5 / 41.3 / 30: stage 2 is 2Ψ + 14Ψ/4 = 15 + 26.25 = 41.25 GB (the brief
# quoted 35.6, which is stage 1 at N_d = 16).
TABLE_1 = [  # (N_d, stage 1, stage 2, stage 3)
    (1, 120, 120, 120),
    (4, 52.5, 41.3, 30),
    (16, 35.6, 21.6, 7.5),
    (64, 31.4, 16.6, 1.88),
]


@pytest.mark.parametrize("nd,os_,os_g,os_g_p", TABLE_1, ids=[f"zero-2019-table-1-Nd{r[0]}" for r in TABLE_1])
def test_zero_table_1(nd, os_, os_g, os_g_p):
    psi = 7_500_000_000
    arch = params_model(psi, largest=1)
    got = []
    for stage in (1, 2, 3):
        first, last = rank_states(arch, MASTER, ADAM, "foreach", Layout(dp=nd, zero=stage))
        assert first is last  # no pipeline: one stage
        got.append(model_states(first))
    # exact bytes: stage 1 4Ψ + 12⌈Ψ/N⌉, stage 2 2Ψ + 14⌈Ψ/N⌉, stage 3 16⌈Ψ/N⌉
    share = -(-psi // nd)
    assert got == [4 * psi + 12 * share, 2 * psi + 14 * share, 16 * share]
    # the table rounds half up to 3 significant digits: within half a unit of its last digit
    for g, fig in zip(got, (os_, os_g, os_g_p)):
        assert abs(g / GB - fig) <= (0.005 if fig < 10 else 0.05) + 1e-9


def test_zero_stage_0_is_the_single_gpu_estimate_whatever_the_data_parallel_degree():
    arch = load_preset("llama-3.1-8b")
    psi = param_summary(arch).total
    st, _ = rank_states(arch, MASTER, ADAM, "foreach", Layout(dp=64, zero=0))
    # 16 B/param, the ZeRO paper's mixed-precision Adam: 2 + 2 + 4 + 8
    assert model_states(st) == 16 * psi == 128_484_179_968
    assert st.step_temp == psi * 4  # foreach Adam: one fp32 temporary per parameter (catalog foreach_temps)


# DeepSpeed documentation, "Memory Requirements" (and transformers' DeepSpeed guide): estimate_zero3_model_states_
# mem_needs_all_live for bigscience/T0_3B prints "2783M total params, 65M largest layer params". AutoModel builds a
# T5Model (no lm_head) of d_model 2048, d_ff 5120 (gated), 32 heads x 64, 24 + 24 layers, vocab 32128:
#   shared embedding 32128·2048                                   =    65,798,144  (the largest layer)
#   encoder layer 4·2048² + 3·2048·5120 + 2·2048 = 48,238,592; x 24 + relative bias 1,024 + final norm 2,048
#                                                                 = 1,157,729,280
#   decoder layer 8·2048² + 3·2048·5120 + 3·2048 = 65,017,856; x 24 + 1,024 + 2,048 = 1,560,431,616
#   Ψ                                                             = 2,783,959,040
T0_PSI = 65_798_144 + 1_157_729_280 + 1_560_431_616
T0_LARGEST = 65_798_144
DS_BUFFER = 1.5  # DeepSpeed's additional_buffer_factor on the CPU figures; we count bytes without it


def _gib(x: float) -> str:
    return f"{x / GiB:.2f}"


@pytest.mark.parametrize("gpus,offload,cpu,gpu", [
    (1, "optimizer+params", "70.00", "0.25"),
    (1, "optimizer", "62.23", "5.43"),
    (1, "none", None, "46.91"),
    (2, "optimizer+params", "70.00", "0.25"),
    (2, "optimizer", "62.23", "2.84"),
    (2, "none", None, "23.58"),
], ids=lambda v: str(v))
def test_deepspeed_zero3_estimator_t0_3b(gpus, offload, cpu, gpu):
    """DeepSpeed docs, Memory Requirements: bigscience/T0_3B on one node of 1 and of 2 GPUs (zero_init=1)."""
    assert T0_PSI == 2_783_959_040
    arch = params_model(T0_PSI, T0_LARGEST)
    # fused Adam (no step temporaries) with fp32 gradients: DeepSpeed's 18 B/param = 2 + 4 + 12
    st, _ = rank_states(arch, MASTER, ADAM, "fused", Layout(dp=gpus, zero=3, offload=offload, fp32_grads=True))
    on_gpu = st.weights + st.gradients + st.master + st.optimizer
    assert st.gathered == 4 * T0_LARGEST  # largest_layer_memory = 4 * largest_layer_params
    assert _gib(on_gpu) == gpu
    share = -(-T0_PSI // gpus)
    step = -(-4 * share // T0_PSI)  # the fused optimizer's fp32 step (one tensor), the rank's share of it
    if offload == "none":
        assert on_gpu == 4 * T0_LARGEST + 18 * share + step
        assert st.host == 0
    else:
        # per rank: fp32 master 4 + Adam 8 (+ fused step) + fp32 gradient partition 4 (+ 2 for the parameters)
        per_param = 18 if offload == "optimizer+params" else 16
        assert st.host == per_param * share + step
        assert _gib(st.host * gpus * DS_BUFFER) == cpu  # per node: gpus ranks


def test_tensor_and_pipeline_split_of_llama_8b():
    arch = load_preset("llama-3.1-8b")
    h, i, v, L = 4096, 14336, 128256, 32
    hkv = 8 * 128
    # per layer: q, o 4096² each, k, v 4096·1024 each, gate/up/down 3·4096·14336, two RMSNorm weights
    layer_sharded = 2 * h * h + 2 * h * hkv + 3 * h * i
    first, last = stage_params(arch, tp=2, pp=2)
    # first stage: vocab-parallel embedding / 2 + 16 layers of (sharded / 2 + norms)
    assert first.held == v * h // 2 + 16 * (layer_sharded // 2 + 2 * h) == 2_007_629_824
    # last stage: 16 layers + final norm + lm_head / 2 (Llama 3.1 does not tie them)
    assert last.held == 16 * (layer_sharded // 2 + 2 * h) + h + v * h // 2 == 2_007_633_920
    assert first.largest == v * h // 2  # the embedding shard outweighs a layer shard (218 M)
    one, same = stage_params(arch)
    assert one is same and one.held == param_summary(arch).total


def test_tied_embedding_is_a_second_copy_on_the_last_stage():
    arch = load_preset("gpt2")
    first, last = stage_params(arch, tp=1, pp=2)
    v, h = arch.vocab, arch.hidden
    untied_total = param_summary(arch).total + v * h
    assert first.held + last.held == untied_total


def test_experts_shard_over_expert_parallel_and_their_states_over_dp_over_ep():
    arch = load_preset("mixtral-8x7b")
    base, _ = stage_params(arch)
    split, _ = stage_params(arch, ep=8)
    assert base.expert == 8 * split.expert and base.dense == split.dense
    st = rank_states(arch, MASTER, ADAM, "foreach", Layout(dp=8, ep=8, zero=1))[0]
    # optimizer state: dense parameters over all 8 ranks, the rank's own experts over 8 / 8 = 1 rank
    assert st.optimizer == 8 * (-(-split.dense // 8) + split.expert)
