"""components/reserve.replayed_reserve: a derived row's own allocation sequence replayed through the caching-allocator
model. What it replays reaches exactly the estimator's peak; the allocator's peak allocated is that sequence's
block sizes (512-byte rounding, and under the native allocator the rests of blocks too small to split); reserved
is at least allocated; rows without a sequence get -1 and say why."""
import os

import numpy as np
import pandas as pd
import pytest

from nnmem_sweep.allocator import AllocatorOptions, replay
from nnmem_sweep.allocator.rules import round_size
from nnmem_sweep.components import derived as D
from nnmem_sweep.components import reserve as R

TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 176, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
              "tie_word_embeddings": False}
AXES = {"optimizer_impl": "foreach", "checkpointing": "none", "attention": "flash"}


def test_split_is_exact():
    assert R._split(10, [1, 2], 1) == [4, 6]  # 10·1//3 = 3, 10·2//3 = 6, the remainder 1 on the first block
    assert R._split(12, [1, 2], 2) == [2, 2, 4, 4]  # two state tensors per parameter
    assert sum(R._split(7_777_777_777_777, [3, 5, 11], 2)) == 7_777_777_777_777
    assert R._split(0, [1, 2], 1) == []


def test_sequence_composition_by_hand():
    # two parameters (ids 0, 1), then a step: input 2 (kept to the end), activation 3 allocated and freed
    ev = np.array([[0, 100], [1, 50], [2, 8], [3, 40], [3, -40]], dtype=np.int64)
    kinds = ["input", "param", "temp"]
    kind = np.array([1, 1, 0, 2, 2])
    seq = R._sequence(ev, kind, kinds, before=[60], state=[30, 15], step_temps=[20], steps=2)
    stride = 4 + 1 + 2 + 1  # trace ids 0-3, one master block, two state blocks, one temporary
    assert seq.tolist() == [
        [0, 100], [1, 50], [4, 60],  # weights, then M
        [2, 8], [3, 40], [3, -40], [5, 30], [6, 15],  # step 1: the step, then S made by the first step()
        [7, 20], [7, -20], [2, -8],  # T_opt, the step's leftovers
        [2 + stride, 8], [3 + stride, 40], [3 + stride, -40], [7 + stride, 20], [7 + stride, -20], [2 + stride, -8]]
    # the peak: step 2's activation with M and S live
    assert int(np.cumsum(seq[:, 1]).max()) == 100 + 50 + 60 + 30 + 15 + 8 + 40


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from nnmem_sweep.derive.arch import architecture_from_source, hf_source

    old = os.environ.get("NNMEM_SWEEP_CACHE")
    os.environ["NNMEM_SWEEP_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    try:
        arch = architecture_from_source(hf_source(TINY_LLAMA, "test"))
        rows = pd.DataFrame({"batch": [1, 4, 8, 2], "seq_len": [300, 512, 1024, 64],
                             "precision": ["bf16-mixed"] * 3 + ["bf16"],
                             "optimizer": ["adamw", "adamw", "sgd-momentum", "adamw"], **AXES})
        before = R.replayed_reserve(arch, "train", rows)  # nothing stored yet: not derived during a report
        est = D.frame_components(arch, "train", rows)  # derives (and stores) the plans
        yield arch, rows, before, est
    finally:
        if old is None:
            os.environ.pop("NNMEM_SWEEP_CACHE")
        else:
            os.environ["NNMEM_SWEEP_CACHE"] = old


def test_not_stored_is_not_derived(tiny):
    _, _, before, _ = tiny
    assert before.peak_reserved_bytes.tolist() == [-1] * 4 and before.peak_allocated_bytes.tolist() == [-1] * 4
    assert all("no stored plan" in n for n in before.notes)


def test_replay_reaches_the_estimators_peak(tiny):
    arch, rows, _, est = tiny
    out = R.replayed_reserve(arch, "train", rows)
    # the replayed requests' own bytes peak exactly at the estimate (forward/backward moments and optimizer step)
    assert out.traced_peak_bytes.tolist() == est["peak_allocated_bytes"].tolist()
    assert (out.peak_reserved_bytes >= out.peak_allocated_bytes).all()
    assert (out.peak_allocated_bytes >= out.traced_peak_bytes).all()
    assert "2 steps of 660 traced events at batch 4, seq 512" in out.notes[1]
    assert "S 1,763,840 B in 42 made in step 1" in out.notes[1]  # fp32 weights: AdamW's two states, 21 tensors
    resumed = R.replayed_reserve(arch, "train", rows, lazy_state=False)  # the state loaded before step 1
    assert resumed.traced_peak_bytes.tolist() == est["peak_allocated_bytes"].tolist()
    assert "S 1,763,840 B in 42 before step 1" in resumed.notes[1]
    for i in range(len(rows)):
        _, seq = R.row_sequence(arch, "train", rows.iloc[[i]])
        rounded = int(np.cumsum(np.sign(seq[:, 1]) * np.array([round_size(abs(int(n))) for n in seq[:, 1]])).max())
        # expandable segments split every block: allocated is exactly the 512-byte-rounded sequence's peak
        assert replay(seq, AllocatorOptions(expandable_segments=True)).peak_allocated_bytes == rounded
        # native segments: blocks whose rest is too small to split count whole (at most 1 MiB per live block)
        assert out.peak_allocated_bytes[i] >= rounded
    # by hand: row 0's rounding, 8,896,000 − 8,882,552 = 13,448 B over its live blocks, and no unsplit rest
    assert out.traced_peak_bytes[0] == 8_882_552 and out.peak_allocated_bytes[0] == 8_896_000


def test_hand_family_is_not_replayed():
    from nnmem_sweep.models.presets import load_preset

    arch = load_preset("gpt2")
    rows = pd.DataFrame({"batch": [4], "seq_len": [512], "precision": ["bf16-mixed"], "optimizer": ["adamw"],
                         **AXES})
    out = R.replayed_reserve(arch, "train", rows)
    assert out.peak_reserved_bytes.tolist() == [-1] and out.peak_allocated_bytes.tolist() == [-1]
    assert "hand-modelled" in out.notes[0] and np.isnan(out.ratio()[0])


def test_shipped_qwen3_replays_without_torch_work(tmp_path, monkeypatch):
    """configs/qwen3.yaml's target row from the shipped plan: the replay's sequence peaks at the estimate."""
    from nnmem_sweep.config import load_scenario

    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(tmp_path))  # the shipped plan, not one a user cache holds

    arch = load_scenario("configs/qwen3.yaml").model
    rows = pd.DataFrame({"batch": [4], "seq_len": [4096], "precision": ["bf16-mixed"], "optimizer": ["adamw"],
                         **AXES})
    est = D.frame_components(arch, "train", rows)
    out = R.replayed_reserve(arch, "train", rows)
    assert out.traced_peak_bytes[0] == est["peak_allocated_bytes"][0]
    assert out.peak_reserved_bytes[0] >= out.peak_allocated_bytes[0] >= out.traced_peak_bytes[0]


def test_a_fine_tunes_optimizer_blocks_are_split_over_what_trains():
    """A model card with frozen tensors (a base under peft's adapters): the optimizer's blocks are split over its
    trainable tensors, each a rank's chunk along dim 0 under FULL_SHARD / SHARD_GRAD_OP (fully_shard pads every
    rank's to the first's), whole on one GPU or under DDP; a card where everything trains gives None (the plan's own
    parameter storages)."""
    from nnmem_sweep.derive.arch import DerivedModel
    from nnmem_sweep.derive.card import ModelCard, TensorInfo

    lora = ModelCard("X", "llama", 0, (TensorInfo("base.w", (2048, 1024), 2, trainable=False),
                                       TensorInfo("lora_A", (16, 1024), 2, adapter=True),
                                       TensorInfo("lora_B", (2047, 16), 1, adapter=True)), 0)

    class Arch:
        derived = DerivedModel(card=lora, source=None)

    shapes = R.trained_shapes(Arch)
    assert shapes == [(16, 1024), (16, 1024), (2047, 16)]
    fsdp = pd.Series({"data_parallel": 2, "zero_stage": 3})
    assert R._trained_weights(shapes, fsdp) == [8 * 1024, 8 * 1024, 1024 * 16]  # ceil(2047 / 2) = 1024 rows
    assert R._trained_weights(shapes, pd.Series({"data_parallel": 2, "zero_stage": 0})) == [16384, 16384, 32752]
    assert R._trained_weights(shapes, pd.Series(dtype=object)) == [16384, 16384, 32752]

    class Full:
        derived = DerivedModel(card=ModelCard("X", "llama", 0, (TensorInfo("w", (4, 4)),), 0), source=None)

    assert R.trained_shapes(Full) is None
