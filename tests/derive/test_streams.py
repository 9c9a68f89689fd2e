"""A sharded step's trace records the stream each block is allocated on (derive/trace.py): FSDP2 selects its
all-gather copy-in and reduce-scatter streams through the device-agnostic stream API, which on the CPU is
torch.cpu.stream, so a rank's step traced on the fake process group shows the streams its blocks belong to on a GPU.
The plan stores them (derive/events.py) and the replay keeps a pool per stream (allocator/model.py)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="the [measure] extra (torch) is not installed")
pytest.importorskip("transformers", reason="the [measure] extra (transformers) is not installed")

from nnmem_sweep.allocator import replay  # noqa: E402
from nnmem_sweep.derive import events as E  # noqa: E402
from nnmem_sweep.derive import source as src  # noqa: E402

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4000, "hidden_size": 256,
         "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
         "head_dim": 32, "hidden_act": "silu", "attention_dropout": 0.0, "tie_word_embeddings": False}
# a decoder block's parameters: q, o 256x256; k, v 256x128; gate, up, down 256x768; two norms of 256
BLOCK = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 768 + 2 * 256  # 786,944
ROOT = 2 * 4000 * 256 + 256  # embedding and head (not tied), the final norm: 2,048,256


@pytest.fixture(scope="module")
def traced():
    from nnmem_sweep.derive.derivation import IN_WORKER, _Probe
    from nnmem_sweep.workload.build import sharding

    source = src.ModelSource.of("hf", LLAMA, fsdp={"world": 2, "zero_stage": 3})
    IN_WORKER.append(True)  # trace here, no worker pool
    try:
        with sharding(src.case(source, "train", "bf16", "flash", "none", "cpu")):
            probe = _Probe(source, "train", "bf16", "flash", "none", "cpu", False)
            return probe(2, 128)
    finally:
        IN_WORKER.pop()


def _allocated(st, phase: str, stream: int) -> list[int]:
    lo, hi = next((a, b) for name, _, a, b in st.trace.spans if name == phase)
    ev, streams = st.trace.events[lo:hi], st.trace.streams[lo:hi]
    return ev[(ev[:, 1] > 0) & (streams == stream), 1].tolist()


def test_fsdp2s_all_gathers_are_on_the_copy_in_stream_and_its_gradients_on_the_reduce_scatter_stream(traced):
    """FULL_SHARD over 2 ranks, bf16: forward all-gathers the root (not resharded after forward) and each of the 4
    blocks into one buffer of the whole unit's bf16 bytes on stream 1 (all_gather_copy_in, under the copy-in
    stream); backward all-gathers the blocks again; the reduce-scatter's outputs, the rank's half of each unit's
    gradients, are made on stream 2 and kept (the optimizer reads them)."""
    assert _allocated(traced, "forward", 1) == [ROOT * 2] + [BLOCK * 2] * 4
    assert _allocated(traced, "backward", 1) == [BLOCK * 2] * 4
    assert _allocated(traced, "forward", 2) == []
    assert _allocated(traced, "backward", 2) == [BLOCK] * 4 + [ROOT]
    assert set(traced.trace.streams.tolist()) == {0, 1, 2}
    # a free is on its allocation's stream: every block of stream 1 is freed on it
    ev, streams = traced.trace.events, traced.trace.streams
    assert (ev[streams == 1, 1] < 0).sum() == (ev[streams == 1, 1] > 0).sum() == 9


def test_the_plan_stores_the_streams_and_the_replay_keeps_their_pools(traced):
    ev, streams = traced.trace.events, traced.trace.streams
    sizes = ev[ev[:, 1] > 0, 1]
    coef = np.zeros((6, len(sizes)), dtype=np.int64)
    coef[0] = sizes  # constant polynomials: the traced sizes at any shape
    doc = E.encode(ev, traced.alloc_kind, coef, streams)
    got, _, _ = E.decode(doc, 2, 128)
    assert got.shape == (len(ev), 3) and np.array_equal(got[:, 2], streams)
    assert np.array_equal(got[:, 1], ev[:, 1])
    # the same sequence replayed on one stream reserves less: the all-gather buffers cannot reuse the default
    # stream's cached blocks, nor it theirs
    streamed, flat = replay(got), replay(got[:, :2])
    assert streamed.peak_reserved_bytes > flat.peak_reserved_bytes
    assert streamed.events_replayed == flat.events_replayed == len(ev)
    # a step on one GPU stores no streams: the document is as before
    assert "streams" not in E.encode(ev, traced.alloc_kind, coef)
