"""Properties over random grids (hypothesis): monotone in batch and sequence, lower precision never more weight
bytes, components add up, total = peak + overhead, and the max-batch boundary is exact."""
import numpy as np
from hypothesis import given, settings, strategies as st

from nnmem_sweep import columns as C
from nnmem_sweep.catalog.names import OPTIMIZERS
from nnmem_sweep.grid import expand_grid
from nnmem_sweep.models.arch import Architecture, LayerRecord
from nnmem_sweep.models.presets import load_preset
from nnmem_sweep.estimate import estimate_frame
from nnmem_sweep.runner import run_scenario
from nnmem_sweep.scenario import GPUSpec, Overheads

from components.tiny_models import TINY_GPT2, TINY_LLAMA, replace, scenario

CNN = Architecture(name="cnn", kind="layers", family="layers", params=448 + 32 + 2570, input_shape=(3, 8, 8),
                   layer_table=(LayerRecord("conv2d_1", "conv2d", (16, 8, 8), 448, 1024),
                                LayerRecord("batchnorm2d_1", "batchnorm2d", (16, 8, 8), 32, 1024),
                                LayerRecord("relu_1", "relu", (16, 8, 8), 0, 1024),
                                LayerRecord("maxpool2d_1", "maxpool2d", (16, 4, 4), 0, 256),
                                LayerRecord("flatten_1", "flatten", (256,), 0, 256),
                                LayerRecord("dropout_1", "dropout", (256,), 0, 256),
                                LayerRecord("linear_1", "linear", (10,), 2570, 10)))
ARCHS = [CNN, TINY_LLAMA, TINY_GPT2, replace(TINY_LLAMA, num_experts=4, experts_per_token=2, name="tiny-moe"),
         replace(TINY_LLAMA, sliding_window=12, name="tiny-swa"), load_preset("gpt2"), load_preset("llama-3.2-1b")]
TRAIN_PRECISIONS = ["fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed", "bf16-master"]
OV = Overheads(300 << 20, 8_519_680, 0.07)
GPU = GPUSpec("g", "g", 24 << 30, "test")

train_points = st.fixed_dictionaries({
    "arch": st.sampled_from(ARCHS),
    "precision": st.sampled_from(TRAIN_PRECISIONS),
    "optimizer": st.sampled_from(OPTIMIZERS),
    "optimizer_impl": st.sampled_from(["foreach", "fused", "forloop"]),
    "checkpointing": st.sampled_from(["none", "selective", "full"]),
    "attention": st.sampled_from(["flash", "eager"]),
    "batch": st.integers(1, 64),
    "seq_len": st.integers(1, 4096),
})
infer_points = st.fixed_dictionaries({
    "arch": st.sampled_from(ARCHS),
    "precision": st.sampled_from(TRAIN_PRECISIONS + ["int8", "int4", "nf4"]),
    "attention": st.sampled_from(["flash", "eager"]),
    "batch": st.integers(1, 64),
    "seq_len": st.integers(1, 4096),
    "cache_tokens": st.sampled_from([0, 0, 5000]),
    "decode_tokens": st.integers(0, 2048),
})


def _rows(p, mode, **override):
    axes = {k: v for k, v in p.items() if k != "arch"}
    axes.update(override)
    sc = scenario(p["arch"], mode, gpus=(GPU,), overheads=OV, headroom=0.05, **axes)
    return sc, estimate_frame(sc.model, mode, expand_grid(sc), OV, 0.05)


def _assert_monotone(p, mode):
    for axis in (C.BATCH, C.SEQ_LEN):
        v = p[axis]
        _, r = _rows(p, mode, **{axis: [v, v + 1, 2 * v]})
        assert (np.diff(r[C.TOTAL].to_numpy()) >= 0).all(), axis


@settings(max_examples=60, deadline=None)
@given(train_points)
def test_train_total_monotone_in_batch_and_seq(p):
    _assert_monotone(p, "train")


@settings(max_examples=60, deadline=None)
@given(infer_points)
def test_infer_total_monotone_in_batch_and_seq(p):
    _assert_monotone(p, "infer")


@settings(max_examples=60, deadline=None)
@given(train_points)
def test_components_sum_and_total_is_peak_plus_overhead(p):
    _, r = _rows(p, "train")
    assert (r[list(C.COMPONENTS)].sum(axis=1) == r[C.PEAK_ALLOCATED]).all()
    assert (r[C.TOTAL] == r[C.PEAK_ALLOCATED] + r[C.OVERHEAD]).all()
    assert (r[list(C.COMPONENTS)] >= 0).all().all()


@settings(max_examples=30, deadline=None)
@given(infer_points)
def test_lower_precision_never_more_weight_bytes(p):
    ladder = ["fp32", "bf16", "int8", "int4"]
    _, r = _rows(p, "infer", precision=ladder)
    w = r[C.WEIGHTS].to_numpy()
    assert (np.diff(w) <= 0).all()


@settings(max_examples=25, deadline=None)
@given(train_points, st.integers(1 << 20, 200 << 30), st.floats(0, 0.3))
def test_max_batch_boundary(p, memory, headroom):
    axes = {k: v for k, v in p.items() if k not in ("arch", "batch")}
    gpu = GPUSpec("x", "x", memory, "test")
    sc = scenario(p["arch"], "train", gpus=(gpu,), overheads=OV, headroom=headroom, **axes)
    mb = run_scenario(sc).max_batch.iloc[0]
    pts = expand_grid(sc).drop(columns=[C.BATCH])
    b = int(mb[C.MAX_BATCH])
    nxt = estimate_frame(sc.model, "train", pts.assign(**{C.BATCH: b + 1}), OV, headroom)
    assert not nxt[C.FITS].iloc[0]
    if b > 0:
        at = estimate_frame(sc.model, "train", pts.assign(**{C.BATCH: b}), OV, headroom)
        assert at[C.FITS].iloc[0]


fsdp_points = st.fixed_dictionaries({
    "arch": st.sampled_from([TINY_LLAMA, TINY_GPT2, load_preset("llama-3.2-1b"), load_preset("llama-3.1-8b")]),
    "precision": st.sampled_from(["fp32", "bf16", "bf16-mixed", "bf16-master"]),
    "checkpointing": st.sampled_from(["none", "full"]),
    "batch": st.integers(1, 32),
    "seq_len": st.integers(16, 4096),
    "dp": st.sampled_from([2, 4, 8]),
    "zero": st.sampled_from([2, 3]),
})


@settings(max_examples=40, deadline=None)
@given(fsdp_points)
def test_fsdp1_and_fsdp2_ranks_are_monotone_and_hold_the_same_states(p):
    """One rank of FSDP1 and of FSDP2 (parallel.fsdp_version): the peak never falls as the batch or the sequence
    grows, and both versions shard the same model states (weights at rest, gradients, optimizer state): what differs
    is what each holds unsharded moment by moment (parallel/fsdp.py)."""
    from nnmem_sweep.estimate import estimate_point

    def rank(version, batch=p["batch"], seq_len=p["seq_len"]):
        return estimate_point(model=p["arch"], batch=batch, seq_len=seq_len, precision=p["precision"],
                              optimizer="adamw", checkpointing=p["checkpointing"], gpu=GPU, overheads=OV,
                              headroom=0.05, parallel={C.DATA_PARALLEL: p["dp"], C.ZERO_STAGE: p["zero"],
                                                       C.FSDP_VERSION: version})

    b, s = p["batch"], p["seq_len"]
    for version in (1, 2):
        peaks = [int(rank(version, batch=x)[C.PEAK_ALLOCATED]) for x in (b, b + 1, 2 * b)]
        assert peaks == sorted(peaks), ("batch", version)
        peaks = [int(rank(version, seq_len=x)[C.PEAK_ALLOCATED]) for x in (s, s + 1, 2 * s)]
        assert peaks == sorted(peaks), ("seq_len", version)
    v1, v2 = rank(1), rank(2)
    assert v1[C.OPTIMIZER_STATE] == v2[C.OPTIMIZER_STATE] and v1[C.MASTER_WEIGHTS] == v2[C.MASTER_WEIGHTS]
