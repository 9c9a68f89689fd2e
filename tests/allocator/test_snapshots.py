"""Real GPUs' allocator snapshots (torch.cuda.memory._dump_snapshot pickles committed publicly on GitHub, slimmed:
tests/data/snapshots/, each with its repository, path, commit and blob) replayed through the allocator model block for
block: every segment the GPU made where and as large as the GPU made it, every block at the GPU's address, the
layout at the end and the peak reserved (allocator/snapshot.py)."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from nnmem_sweep.allocator import snapshot as S

SNAPSHOTS = sorted((Path(__file__).resolve().parent.parent / "data" / "snapshots").glob("*.json.gz"))


def test_at_least_three_public_snapshots_are_committed_with_their_source():
    assert len(SNAPSHOTS) >= 3
    for path in SNAPSHOTS:
        src = S.load(path)["source"]
        assert src["repository"].startswith("https://github.com/") and len(src["commit"]) == 40 and src["path"]


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_the_model_replays_a_real_gpu_snapshot_block_for_block(path):
    doc = S.load(path)
    result = S.check(doc)
    assert result.ok, result.difference
    assert result.events == len(doc["trace"]) and result.segments == len(doc["segments"])
    assert result.model_peak_reserved_bytes == result.peak_reserved_bytes
    assert result.segments_made == sum(1 for act, _, _ in doc["trace"] if act == S.SEGMENT)


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_with_its_own_addresses_the_model_reserves_the_gpus_peak(path):
    """A plan's replays do not know where the driver puts a segment (the model takes the oldest first): on these
    recordings the peak reserved is the GPU's all the same."""
    result = S.check(S.load(path), addresses=False)
    assert result.ok and result.model_peak_reserved_bytes == result.peak_reserved_bytes


def test_a_changed_request_is_caught_and_named():
    """The check is not blind: a request 1 MiB larger than the GPU's, in the trace of the snapshot with the most
    segments made, moves a block or a segment, and the replay names the event."""
    doc = copy.deepcopy(S.load(max(SNAPSHOTS, key=lambda p: p.stat().st_size)))
    i = next(k for k, (act, _, n) in enumerate(doc["trace"]) if act == S.ALLOC and n > 4 << 20)
    doc["trace"][i][2] += 1 << 20
    result = S.check(doc)
    assert not result.ok and result.difference.startswith("event ")


def test_a_recording_that_frees_what_it_never_saw_allocated_is_refused():
    doc = {"segments": [{"address": 1 << 30, "total_size": 2 << 20, "small": True, "expandable": False, "stream": 0,
                         "blocks": [[1 << 30, 2 << 20, False]]}],
           "trace": [[S.FREE, 1 << 30, 512]]}
    with pytest.raises(S.Unreplayable, match="allocated before the recording"):
        S.check(doc)
