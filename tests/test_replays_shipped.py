"""The shipped scenarios' replays (replays.SHIPPED_REPLAYS, issue 20): a user's first run of a configs/ scenario or of
the report's Validation section bisects nothing, and a shipped least capacity is the bisection of its very sequence
under today's allocator code. When the allocator code or a shipped plan changes, the first test fails until
`nnmem-sweep derive configs/*.yaml --ship` (or ship.ship_replays) has shipped them again."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nnmem_sweep import replays
from nnmem_sweep.allocator import AllocatorOptions
from nnmem_sweep.config import load_scenario
from nnmem_sweep.components.reserve import row_sequences
from nnmem_sweep.derive.arch import derived_twin
from nnmem_sweep.fit import scenario_max_batch

ROOT = Path(__file__).resolve().parent.parent


STALE = "a shipped replay was bisected: ship them again (nnmem-sweep derive configs/*.yaml --ship)"


@pytest.fixture
def bisections(monkeypatch, tmp_path):
    """The sequences bisected in the test, in a user's first run (nothing in the user cache); the bisection still
    runs (the GPU-kit comparison catches a point's exception and would hide one raised here)."""
    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(tmp_path))
    made: list[int] = []
    bisect = replays.least_capacity

    def counted(seq, options, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        made.append(len(seq))
        return bisect(seq, options, *args, **kwargs)

    monkeypatch.setattr(replays, "least_capacity", counted)
    return made


CONFIGS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS)
def test_a_shipped_scenarios_first_run_bisects_nothing(config, bisections):
    sc = load_scenario(ROOT / config)
    refined = replays.refine(sc, scenario_max_batch(sc), bands=True)
    assert not bisections, STALE
    if config in ("configs/llama.yaml", "configs/qwen3.yaml", "configs/llama-70b-qlora-fsdp.yaml",
                  "configs/llama-8b-deepspeed.yaml", "configs/llama-8b-zero-offload.yaml"):  # DeepSpeed's: its
        # ZeRO-2 rows' traced steps (ZeRO-Offload's too, their host told apart)
        assert refined.overheads.replayed_recipes  # replayed, from the shipped results


def test_the_gpu_kits_points_bisect_nothing(bisections):
    from nnmem_sweep.gpu_compare import run_summaries

    assert run_summaries(ROOT / "validation" / "gpu")
    assert not bisections, STALE


def test_a_shipped_result_is_the_bisection_of_its_sequence():
    sc = load_scenario(ROOT / "configs" / "llama.yaml")
    rows = replays.boundary_rows(sc, scenario_max_batch(sc)).iloc[[0, 7, 19]]
    options = AllocatorOptions()
    for (_, seq) in row_sequences(derived_twin(sc.model), "train", rows):
        shipped = replays.shipped_replays()[replays.sequence_key(seq, options)]
        assert (shipped["peak"], shipped["need"]) == replays.least_capacity(seq, options)


def test_another_sequence_or_other_options_miss_the_shipped_results():
    seq = np.array([[1, 1 << 20], [2, 3 << 20], [1, -(1 << 20)], [2, -(3 << 20)]], dtype=np.int64)
    key = replays.sequence_key(seq, AllocatorOptions())
    other = seq.copy()
    other[1, 1] += 512
    assert replays.sequence_key(other, AllocatorOptions()) != key
    assert replays.sequence_key(seq, AllocatorOptions.from_alloc_conf("expandable_segments:True")) != key
    assert key not in replays.shipped_replays()  # so it is bisected, as any sequence the shipped runs did not meet
