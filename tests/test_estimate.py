"""estimate.estimate_frame's output frame: column order and dtypes, the input's index and columns carried through, no
memory shared with the input, the int64 bound. Extra arrays from estimate_components become columns after `fits`;
"host_fits" is ANDed into fits."""
import numpy as np
import pandas as pd
import pytest

from nnmem_sweep import columns as C
from nnmem_sweep import estimate
from nnmem_sweep.grid import expand_grid
from nnmem_sweep.scenario import GPUSpec, Overheads

from components.tiny_models import TINY_GPT2, TINY_LLAMA, params_model, scenario

OV = Overheads(100, 10, 0.5)
GPU = GPUSpec("g", "G", 100_000, "test")
GPU2 = GPUSpec("g2", "G2", 60_000, "test")


def _grid(model, mode="train", **axes):
    sc = scenario(model, mode, gpus=(GPU, GPU2), overheads=OV, headroom=0.1, **axes)
    return sc, expand_grid(sc)


OUT_COLUMNS = [*C.COMPONENTS, C.PEAK_ALLOCATED, C.PEAK_PHASE, C.ALLOCATOR_EXTRA, C.RESERVED, C.NON_TORCH, C.OVERHEAD,
               C.TOTAL, C.GPU_MEMORY, C.USABLE, C.FITS]


def _estimate(sc, frame, **kw):
    return estimate.estimate_frame(sc.model, sc.mode, frame, sc.overheads, sc.headroom, **kw)


def _assert_consistent(out, frame):
    """Inputs carried through unchanged (dtypes too), outputs int64 and adding up, on the input's index."""
    assert out.index.equals(frame.index) and type(out.index) is type(frame.index)
    for c in frame.columns:
        if c != C.GPU_MEMORY:
            pd.testing.assert_series_equal(out[c], frame[c])
    ints = [c for c in OUT_COLUMNS if c not in (C.PEAK_PHASE, C.FITS)]
    assert all(out[c].dtype == np.int64 for c in ints) and out[C.FITS].dtype == bool
    assert isinstance(out[C.PEAK_PHASE].dtype, pd.CategoricalDtype)
    assert (out[list(C.COMPONENTS)].sum(axis=1) == out[C.PEAK_ALLOCATED]).all()
    assert (out[C.TOTAL] == out[C.PEAK_ALLOCATED] + out[C.OVERHEAD]).all()
    assert (out[C.TOTAL] == out[C.RESERVED] + out[C.NON_TORCH]).all()
    assert (out[C.RESERVED] >= out[C.PEAK_ALLOCATED] + out[C.ALLOCATOR_EXTRA]).all()
    assert (out[C.FITS] == (out[C.TOTAL] <= out[C.USABLE])).all()


CASES = {
    "llama train, eager and flash, two precisions": lambda: _grid(
        TINY_LLAMA, batch=[1, 2, 4], precision=["fp32", "bf16-mixed"], attention=["flash", "eager"],
        checkpointing=["none", "full"]),
    "gpt2 train": lambda: _grid(TINY_GPT2, batch=[1, 3], seq_len=[8, 16]),
    "llama infer, prefill and decode": lambda: _grid(TINY_LLAMA, "infer", batch=[1, 2], cache_tokens=[0, 32],
                                                     decode_tokens=[0, 1, 8]),
    "params model": lambda: _grid(params_model(1000, per_sample=64), batch=[1, 8]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_output_columns_follow_the_inputs(case):
    sc, frame = CASES[case]()
    out = _estimate(sc, frame)
    _assert_consistent(out, frame)
    assert list(out.columns) == [c for c in frame.columns if c != C.GPU_MEMORY] + OUT_COLUMNS


def test_hand_made_frames_strings_other_dtypes_and_index():
    sc, _ = _grid(TINY_LLAMA)
    # what estimate_point builds: plain Python lists (str columns, not categoricals), plus an int32 and a float
    # column carried through, on an index that is not 0..n-1
    frame = pd.DataFrame({
        C.BATCH: [1, 2], C.SEQ_LEN: [8, 8], C.PRECISION: ["fp32", "bf16"], C.OPTIMIZER: ["adamw", "adamw"],
        C.OPTIMIZER_IMPL: ["foreach", "fused"], C.CHECKPOINTING: ["none", "none"], C.ATTENTION: ["flash", "eager"],
        C.CACHE_TOKENS: [0, 0], C.DECODE_TOKENS: [0, 0], C.GPU: ["g", "g"], C.GPU_MEMORY: [100_000, 100_000],
        "rank": np.array([0, 1], dtype=np.int32), "note": [0.5, 1.5],
    }, index=[7, 3])
    fast = _estimate(sc, frame)
    _assert_consistent(fast, frame)
    assert fast["rank"].dtype == np.int32 and fast["note"].tolist() == [0.5, 1.5]
    # llama fp32 batch 1 seq 8, foreach AdamW (test_runner): peak 34,208; overhead 100 + 10 + ceil(0.5 · 34,208)
    assert fast.loc[7, C.PEAK_ALLOCATED] == 34_208 and fast.loc[7, C.TOTAL] == 34_208 + 110 + 17_104
    assert fast.loc[7, C.USABLE] == 100_000 - 10_000 and bool(fast.loc[7, C.FITS])


def test_empty_frame_and_a_slice_of_the_grid():
    sc, frame = CASES["llama train, eager and flash, two precisions"]()
    whole = _estimate(sc, frame)
    part = _estimate(sc, frame.iloc[5:17])
    _assert_consistent(part, frame.iloc[5:17])
    pd.testing.assert_frame_equal(part, whole.iloc[5:17])
    empty = _estimate(sc, frame.iloc[:0])
    assert len(empty) == 0 and list(empty.columns) == list(whole.columns)
    assert list(empty.dtypes) == list(whole.dtypes)


def test_output_shares_no_memory_with_the_input():
    sc, frame = CASES["llama train, eager and flash, two precisions"]()
    before = frame.copy(deep=True)
    out = estimate.estimate_frame(sc.model, sc.mode, frame, sc.overheads, sc.headroom)
    first = out.index[0]
    out.loc[first, C.PRECISION] = "bf16-mixed" if out.loc[first, C.PRECISION] == "fp32" else "fp32"
    out.loc[first, C.BATCH] = 999
    out.loc[first, C.GPU_MEMORY] = 1
    pd.testing.assert_frame_equal(frame, before)


def test_extra_columns_pass_through_and_host_fits_is_anded_into_fits(monkeypatch):
    real = estimate.estimate_components

    def with_host(arch, mode, frame, device="cuda", **kw):
        comps = real(arch, mode, frame, device, **kw)
        n = len(frame)
        comps["host_memory_bytes"] = np.arange(n, dtype=np.int32) * 1000  # stored as int64
        comps["host_fits"] = np.arange(n) % 2 == 0  # every second row does not fit on the host
        return comps

    monkeypatch.setattr(estimate, "estimate_components", with_host)
    sc, frame = _grid(TINY_LLAMA, batch=[1, 2])
    out = estimate.estimate_frame(sc.model, sc.mode, frame, sc.overheads, sc.headroom)
    assert list(out.columns[-2:]) == [C.FITS, "host_memory_bytes"] and "host_fits" not in out.columns
    assert out["host_memory_bytes"].dtype == np.int64
    assert out["host_memory_bytes"].tolist() == [0, 1000, 2000, 3000]
    assert out[C.BATCH].tolist() == [1, 1, 2, 2] and out[C.GPU].tolist() == ["g", "g2", "g", "g2"]
    gpu_fits = (out[C.TOTAL] <= out[C.USABLE]).to_numpy()
    # batch 1: total 34,208 + 110 + 17,104 = 51,422 (test_runner) fits usable 90,000 and 54,000 (60,000 - 6,000);
    # batch 2 fits only the 100,000-byte GPU
    assert gpu_fits.tolist() == [True, True, True, False]
    assert out[C.FITS].tolist() == [True, False, True, False]


@pytest.mark.parametrize("categorical", [True, False])
def test_int64_bound_reads_the_attention_column_only_to_admit_flash(categorical):
    from nnmem_sweep.errors import UsageError
    from nnmem_sweep.models.presets import load_preset

    arch = load_preset("llama-3.1-405b")
    sc, _ = _grid(TINY_LLAMA)

    def frame(attention):
        f = pd.DataFrame({C.BATCH: [1024], C.SEQ_LEN: [131072], C.PRECISION: ["bf16"], C.OPTIMIZER: ["adamw"],
                          C.OPTIMIZER_IMPL: ["foreach"], C.CHECKPOINTING: ["full"], C.ATTENTION: [attention],
                          C.CACHE_TOKENS: [0], C.DECODE_TOKENS: [0], C.GPU: ["g"], C.GPU_MEMORY: [100_000]})
        return f.astype({C.ATTENTION: "category"}) if categorical else f

    # eager: 1,024 x 131,072 tokens x (per token ~2.4e8 + s x L x H x 16 = 131,072 x 126 x 128 x 16 ~ 3.4e10) x 2
    # ~ 9e18 > 2^62 ~ 4.6e18: refused; flash drops the s² term: ~6e16, computed
    with pytest.raises(UsageError, match=r"batch 1,024 x seq_len 131,072 for Llama 3.1 405B .* 2\^62"):
        estimate.estimate_frame(arch, "train", frame("eager"), sc.overheads, sc.headroom)
    out = estimate.estimate_frame(arch, "train", frame("flash"), sc.overheads, sc.headroom)
    assert out[C.PEAK_ALLOCATED].iloc[0] > 0 and not out[C.FITS].iloc[0]


def test_a_frame_that_already_holds_output_columns_gets_them_overwritten_in_place():
    sc, frame = CASES["gpt2 train"]()
    again = estimate.estimate_frame(sc.model, sc.mode, frame, sc.overheads, sc.headroom)
    fast = _estimate(sc, again)  # re-estimating a results frame: its columns are overwritten where they stand
    assert list(fast.columns) == [c for c in again.columns if c != C.GPU_MEMORY] + [C.GPU_MEMORY]
    assert fast.columns.is_unique
    assert (fast[C.TOTAL] == again[C.TOTAL]).all()
