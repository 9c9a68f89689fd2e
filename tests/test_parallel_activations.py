"""Activations and the peak per GPU under tensor, sequence, pipeline and data parallelism (parallel/, peak.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnmem_sweep import columns as C
from nnmem_sweep.catalog.precisions import get_precision
from nnmem_sweep.components import activations as act
from nnmem_sweep.peak import estimate_components
from nnmem_sweep.models.arch import Architecture
from nnmem_sweep.models.presets import hand_modelled_ids, load_preset
from nnmem_sweep.parallel.activations import first_stage_layer_micro_batches, layer_replicated, rank_term
from nnmem_sweep.parallel.layout import Layout

# Korthikanti et al. 2022 (arXiv 2205.05198) §4 assumptions: GPT layer, 16-bit activations, 1-byte dropout masks,
# LayerNorm, GeLU MLP of 4h, attention matrix materialised (eager). Sizes of their 175B row (Table 3): h 12288,
# a 96, s 2048, t 8.
H, A, S, B, T = 12288, 96, 2048, 1, 8
PAPER_GPT = Architecture(name="Korthikanti GPT", kind="transformer", family="gpt2", hidden=H, layers=96, heads=A,
                         kv_heads=A, head_dim=H // A, intermediate=4 * H, vocab=51200, max_position=S,
                         activation="gelu", norm="layernorm", position="learned", qkv_bias=True, attn_out_bias=True,
                         mlp_bias=True, norm_bias=True, attn_dropout=0.1, hidden_dropout=0.1, head="causal_lm",
                         tied_embeddings=True, params=1)
FP16 = get_precision("fp16")
# Our terms are those of the modules: each LayerNorm also saves its fp32 mean and rstd (8 bytes per token) that the
# paper leaves out, so every layer has 2 x 8 = 16 bytes per token more than sbh(34 + 5as/h).
LN_STATS = 16


def layer_bytes(lay: Layout, checkpointing: str = "none") -> int:
    """One layer's saved bytes on one rank at s = 2048, b = 1, evaluated over the rank's own tokens."""
    full = act.layer_saved(PAPER_GPT, FP16, "eager")
    rep = layer_replicated(PAPER_GPT, FP16)
    if checkpointing == "full":
        term = act.checkpointed_layer_saved(PAPER_GPT, FP16)
        term = rank_term(term, term, lay)
    elif checkpointing == "selective":
        term = rank_term(act.layer_saved(PAPER_GPT, FP16, "eager", drop_scores=True), rep, lay)
    else:
        term = rank_term(full, rep, lay)
    return int(term.eval(B, S // lay.seq_divisor))


def test_korthikanti_table_2_no_parallelism():
    # sbh(34 + 5as/h) = 2048·12288·34 + 5·96·2048² = 855,638,016 + 2,013,265,920, + 16·2048 LayerNorm statistics
    paper = S * B * H * 34 + 5 * A * S * S * B
    assert layer_bytes(Layout()) == paper + LN_STATS * S * B == 2_868_936_704


def test_korthikanti_table_2_tensor_parallel():
    # sbh(10 + 24/t + 5as/(ht)): 10sbh stays whole on every rank (norm and linear inputs, dropout masks)
    paper = S * B * H * 10 + S * B * H * 24 // T + 5 * A * S * S * B // T
    assert layer_bytes(Layout(tp=T)) == paper + LN_STATS * S * B


def test_korthikanti_table_2_tensor_and_sequence_parallel():
    # sbh/t · (34 + 5as/h): everything split over the t ranks
    paper = (S * B * H * 34 + 5 * A * S * S * B) // T
    assert layer_bytes(Layout(tp=T, sp=True)) == paper + LN_STATS * S * B // T


def test_korthikanti_table_2_selective_recompute_with_tp_sp():
    # 34sbh/t: the 5as²b attention scores are recomputed, not stored
    assert layer_bytes(Layout(tp=T, sp=True), "selective") == (34 * S * B * H + LN_STATS * S * B) // T


def test_korthikanti_full_recompute_stores_the_layer_input():
    # 2sbh (and 2sbh/t with sequence parallelism)
    assert layer_bytes(Layout(tp=T), "full") == 2 * S * B * H
    assert layer_bytes(Layout(tp=T, sp=True), "full") == 2 * S * B * H // T


def test_korthikanti_first_stage_keeps_p_micro_batches_of_l_over_p_layers():
    # §4.2.3: with 1F1B the first stage stores p micro-batches of L/p layers, L layers' worth whatever p
    for p in (2, 4, 8, 16):
        assert first_stage_layer_micro_batches(PAPER_GPT, Layout(pp=p, micro_batches=64)) == (96, p)
    # fewer micro-batches than stages: only those are in flight
    assert first_stage_layer_micro_batches(PAPER_GPT, Layout(pp=8, micro_batches=2)) == (24, 2)
    # interleaved: L(1 + (p−1)/(p·v)) = 96·(1 + 7/16) = 138 layer-micro-batches
    assert first_stage_layer_micro_batches(
        PAPER_GPT, Layout(pp=8, micro_batches=64, schedule="interleaved", virtual=2))[0] == 138


def test_context_parallel_splits_tokens_and_keeps_all_keys_for_the_local_queries():
    # cp = 2, no TP: per-token bytes halve; scores are (s/2) x s per head: 5as²b/2
    got = layer_bytes(Layout(cp=2))
    assert got == (34 * H + LN_STATS) * S * B // 2 + 5 * A * S * S * B // 2


# ---------------------------------------------------------------- the whole peak per rank

def frame(n: int = 1, **cols) -> pd.DataFrame:
    base = {C.BATCH: 1, C.SEQ_LEN: 4096, C.PRECISION: "bf16-master", C.OPTIMIZER: "adamw",
            C.OPTIMIZER_IMPL: "foreach", C.CHECKPOINTING: "none", C.ATTENTION: "flash", C.CACHE_TOKENS: 0,
            C.DECODE_TOKENS: 0}
    base.update(cols)
    return pd.DataFrame({k: v if isinstance(v, list) else [v] * n for k, v in base.items()})


def test_llama_8b_tp2_pp2_zero1_dp4_by_hand():
    """Llama 3.1 8B, bf16-master AdamW, flash, b 1, s 4096, t 2, p 2 (1F1B, 8 micro-batches), ZeRO-1 over 4."""
    arch = load_preset("llama-3.1-8b")
    got = estimate_components(arch, "train", frame(**{C.TENSOR_PARALLEL: 2, C.PIPELINE_PARALLEL: 2,
                                                       C.ZERO_STAGE: 1, C.DATA_PARALLEL: 4, C.MICRO_BATCHES: 8}))
    n = 2_007_629_824  # the first stage's parameters (test_parallel_states: embedding / 2 + 16 layer shards)
    # per layer and token (bytes): RMSNorms 2·(6h + 4) = 49,160; q/k/v input 2h, Q K V 2·(4096 + 2·1024),
    # output + log-sum-exp 2·4096 + 4·32 -> attention 28,800; MLP input 2h + SwiGLU 4·2·14336 -> 122,880.
    # Whole on each TP rank: norms + the two linear inputs = 65,544; the other 135,296 halve: 133,192 per layer.
    per_layer = 65_544 + 135_296 // 2
    # first stage: 16 layers x 2 micro-batches in flight + 2 x the int64 ids and labels; RoPE cos/sin 2·128·2 per
    # position per micro-batch
    acts = (32 * per_layer + 2 * 16) * 4096 + 2 * 512 * 4096
    assert got[C.ACTIVATIONS].tolist() == [acts] == [17_462_067_200]
    assert got[C.WEIGHTS].tolist() == [2 * n]
    assert got[C.MASTER_WEIGHTS].tolist() == [4 * (n // 4)]
    assert got[C.OPTIMIZER_STATE].tolist() == [8 * (n // 4)]
    # 8 micro-batches > 2 in flight: the gradients of the earlier ones are live at the start of backward
    assert got[C.GRADIENTS].tolist() == [2 * n]
    # the peak: start of the first stage's backward, its last layer's down-projection gradient (14336·4096·2 / 2)
    # + per token 2 residual grads 2·2h, the activation grad 2·14336 / 2, the gradient received from stage 2 (2h)
    temp = 14336 * 4096 + (4 * 4096 + 14336 + 2 * 4096) * 4096
    assert got[C.TEMPORARY].tolist() == [temp] == [218_103_808]
    assert got[C.PEAK_PHASE].tolist() == ["backward"]
    assert got[C.PEAK_ALLOCATED].tolist() == [2 * n + n + 2 * n + 2 * n + acts + temp] == [31_733_579_776]


def test_sequence_length_must_split_over_the_ranks():
    from nnmem_sweep.errors import UsageError

    arch = load_preset("llama-3.1-8b")
    with pytest.raises(UsageError, match="seq_len 4,097 must be divisible by tensor_parallel 2"):
        estimate_components(arch, "train", frame(**{C.SEQ_LEN: 4097, C.TENSOR_PARALLEL: 2,
                                                    C.SEQUENCE_PARALLEL: True}))


PARALLEL_DEFAULT_COLUMNS = {a: v for a, v in C.PARALLEL_DEFAULTS.items()}


@pytest.mark.parametrize("preset", hand_modelled_ids())
def test_one_gpu_layout_reproduces_the_single_gpu_estimate(preset):
    arch = load_preset(preset)
    combos = [(p, o, c, a) for p in ("bf16-mixed", "bf16-master", "fp32") for o in ("adamw", "sgd-momentum")
              for c in ("none", "selective", "full") for a in ("flash", "eager")]
    n = len(combos)
    base = frame(n, **{C.BATCH: [1 + i % 3 for i in range(n)], C.SEQ_LEN: [256 * (1 + i % 2) for i in range(n)],
                       C.PRECISION: [x[0] for x in combos], C.OPTIMIZER: [x[1] for x in combos],
                       C.CHECKPOINTING: [x[2] for x in combos], C.ATTENTION: [x[3] for x in combos]})
    plain = estimate_components(arch, "train", base)
    par = estimate_components(arch, "train", base.assign(**PARALLEL_DEFAULT_COLUMNS))
    for k, v in plain.items():
        assert np.array_equal(np.asarray(v), np.asarray(par[k])), k
    assert (par[C.HOST] == 0).all() and par[C.HOST_FITS].all()


LLAMA = load_preset("llama-3.1-8b")


def peak(**cols) -> int:
    return int(estimate_components(LLAMA, "train", frame(**cols))[C.PEAK_ALLOCATED][0])


@settings(max_examples=40, deadline=None)
@given(dp=st.sampled_from([1, 2, 4, 8, 64]), zero=st.integers(0, 3), t=st.sampled_from([1, 2, 4, 8]),
       sp=st.booleans(), p=st.sampled_from([1, 2, 4, 8]), m=st.sampled_from([1, 4, 16]),
       ckpt=st.sampled_from(["none", "selective", "full"]), b=st.integers(1, 4))
def test_per_rank_memory_never_grows_with_more_gpus(dp, zero, t, sp, p, m, ckpt, b):
    cols = {C.DATA_PARALLEL: dp, C.ZERO_STAGE: zero, C.TENSOR_PARALLEL: t, C.SEQUENCE_PARALLEL: sp,
            C.PIPELINE_PARALLEL: p, C.MICRO_BATCHES: m, C.CHECKPOINTING: ckpt, C.BATCH: b}
    here = peak(**cols)
    more_dp = peak(**{**cols, C.DATA_PARALLEL: dp * 2})
    if dp == 1 and zero == 0 and t == 1 and p == 1:
        # one rank to two at zero_stage 0: PyTorch's DDP wraps the model, and its allreduce buckets hold the bf16
        # gradients once more (8,030,261,248 parameters; tests/test_parallel_ddp.py)
        assert more_dp - here == 8_030_261_248 * 2
    else:
        assert more_dp <= here
    if t < 8:
        assert peak(**{**cols, C.TENSOR_PARALLEL: t * 2, C.SEQUENCE_PARALLEL: True}) <= here
    if p < 32:
        # more stages: fewer layers each, but the first stage may take more micro-batches in flight (min(p, m)),
        # each with its int64 ids and labels (16 B a token) and RoPE tables (2·128·2 B a position) and nothing more
        more = min(2 * p, m) - min(p, m)
        assert peak(**{**cols, C.PIPELINE_PARALLEL: p * 2}) <= here + more * (16 * b * 4096 + 512 * 4096)
    # ZeRO-1 -> 2 is not a saving in general: stage 2 of a transformer over data parallel alone is FSDP2's
    # SHARD_GRAD_OP, which holds the shard beside every unsharded block from forward to backward (W/d more than
    # DeepSpeed's ZeRO-1 at the loss, tests/data/truth/sharded). ZeRO-3 gathers units: a saving from 8 ranks on
    if zero == 0 or (zero == 2 and dp >= 8):
        assert peak(**{**cols, C.ZERO_STAGE: zero + 1}) <= here


def test_params_model_shards_its_states_with_zero_and_keeps_its_activations():
    # FORMULAS.md worked example: 20,000,000 params, fp32, SGD, batch 32, 1,000,000 activation elements a sample:
    # 80,000,000 + 80,000,000 + 128,000,000 = 288,000,000 B on one GPU. ZeRO-2 over 4 ranks shards the gradients:
    # 80,000,000 + 20,000,000 + 128,000,000
    arch = Architecture(name="p", kind="params", family="params", params=20_000_000,
                        activation_elements_per_sample=1_000_000)
    f = frame(2, **{C.BATCH: 32, C.SEQ_LEN: 1, C.PRECISION: "fp32", C.OPTIMIZER: "sgd",
                    C.DATA_PARALLEL: [1, 4], C.ZERO_STAGE: [0, 2]})
    assert estimate_components(arch, "train", f)[C.PEAK_ALLOCATED].tolist() == [288_000_000, 228_000_000]


CNN_PARAMS = 3_050


def test_layer_net_gradients_shrink_with_zero_2():
    from test_properties import CNN  # 3,050 params; its last backward moment holds every layer's gradient

    f = frame(3, **{C.BATCH: 8, C.SEQ_LEN: 1, C.PRECISION: "fp32", C.OPTIMIZER: "sgd-momentum",
                    C.DATA_PARALLEL: [1, 2, 2], C.ZERO_STAGE: [0, 0, 2]})
    got = estimate_components(CNN, "train", f)
    # plain data parallel: a full replica, beside DDP's allreduce buckets (the fp32 gradients once more)
    assert got[C.PEAK_ALLOCATED][1] - got[C.PEAK_ALLOCATED][0] == CNN_PARAMS * 4
    assert got[C.GRADIENTS][2] * 2 <= got[C.GRADIENTS][0] + 2  # ⌈each moment's gradients / 2⌉
    with pytest.raises(Exception, match="tensor_parallel 2 splits a transformer"):
        estimate_components(CNN, "train", f.assign(**{C.TENSOR_PARALLEL: 2}))
