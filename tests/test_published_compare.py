"""The estimator against published real-GPU measurements (nnmem_sweep/published_compare.py over
tests/data/published): every mapped figure pinned to its bytes and to its published range, the mapped set pinned, each
miss explained."""
from __future__ import annotations

import math

import pytest

from nnmem_sweep import published_compare as P
from nnmem_sweep.published import load_published
from nnmem_sweep.units import GiB, MiB

# (file, id) -> (estimated bytes, within the target). Changing any of these is a change of the estimator: say why.
EXPECTED = {
    # the upper end of the eager Volta rows (hf-anatomy-v100: 1343 MiB floor, less its 2 MiB segment) + the 2 MiB
    # small-pool segment of torch.ones((1, 1)) = 1,409,286,143 B: the printed range's upper end
    ("hf-model-memory-anatomy.json", "context"): (1_409_286_143, True),
    # hand check: context (lazy, Blackwell: the b200 row's upper end) 757,517,516 B + 3 live fp32 tensors of 15e9
    # elements, each in its own segment ⌈60e9 / 2 MiB⌉ · 2 MiB = 28,611 · 2,097,152 = 60,001,615,872 B:
    # 757,517,516 + 180,004,847,616 = 180,762,365,132 B = 168.348 GiB vs "168.34 GiB memory in use" (168.345 at most:
    # +0.002 %). The 3 · 1,615,872 B of segment rounding are the message's "4.62 MiB reserved but unallocated".
    ("ml-engineering-b200-oom.json", "process-in-use"): (180_762_365_132, True),
    ("ml-engineering-b200-oom.json", "total-capacity"): (191_496_485_602, True),
    # hand check: (150,103,738,287 capacity − 561,066,803 context) // 2**30 = 139 tensors of 1 GiB =
    # 149,250,113,536 B, exactly the 139 printed (0 .. 138) before the 140th failed
    ("ml-engineering-h200-allocatable.json", "allocated-before-oom"): (149_250_113_536, True),
    ("ml-engineering-h200-allocatable.json", "total-capacity"): (150_103_738_287, True),
    # Hopper's context 814,546,944 (this project's H100 kit run, the upper end of the Hopper rows) + the
    # communicator's 1,932,735,283 (+ 3,280,000,000 all-to-all after it)
    ("nccl-issue1685-alltoall.json", "before"): (2_747_282_227, False),
    ("nccl-issue1685-alltoall.json", "after"): (6_027_282_227, False),
    # one cuBLAS workspace on compute capability 8.6: 4096 KiB · 2 + 16 KiB · 8 = 8,519,680 B
    ("pytorch-issue95668-cublas-workspace.json", "linear-forward"): (8_519_680, True),
    # unsloth#9362's 641,728,512 B (lazy, GPU not stated) + the 20 MiB segment of a 6,400,000 B tensor
    ("pytorch-pr86509-lazy-loading.json", "lazy"): (641_728_512 + 20 * MiB, False),
    ("pytorch-pr86509-lazy-loading.json", "eager"): (1_000_000_000 + 20 * MiB, False),
    ("unsloth-zoo-pr1053-context.json", "context"): (641_728_512, False),
    ("unsloth-zoo-pr1053-context.json", "capacity"): (50_865_307_648, True),
    ("vllm-pr10511-llama3-8b.json", "tp1-total"): (84_918_646_663, True),
    # hand check: Llama 3 8B has 8,030,261,248 parameters (the preset llama-3.1-8b, same shapes) x 2 B (bf16) =
    # 16,060,522,496 B = 14.957 GiB vs vLLM's printed "model weights take 14.96GiB" (14.955 .. 14.965)
    ("vllm-pr10511-llama3-8b.json", "tp1-weights"): (16_060_522_496, True),
    ("vllm-pr10511-llama3-8b.json", "tp1-non-torch"): (641_728_512, False),
    ("vllm-pr10511-llama3-8b.json", "tp1-activation-peak"): (977_403_904, False),
    # ⌊0.9 · 84,918,646,663⌋ = 76,426,781,996 − 16,060,522,496 weights − 977,403,904 activations − 641,728,512
    # context − 8,519,680 cuBLAS = 58,738,607,404 B = 54.705 GiB vs 53.29 GiB (+2.6 %, by compensation: see NOTE)
    ("vllm-pr10511-llama3-8b.json", "tp1-kv-cache"): (58_738_607_404, True),
    # (16,060,522,496 − 532,480 B of norms) / 2 + 532,480 = 8,030,527,488 B = 7.479 GiB vs 7.48 GiB
    ("vllm-pr10511-llama3-8b.json", "tp2-weights"): (8_030_527_488, True),
    ("vllm-pr10511-llama3-8b.json", "tp2-non-torch"): (641_728_512 + 1_932_735_283, False),
    ("vllm-pr10511-llama3-8b.json", "tp2-activation-peak"): (977_403_904, False),
}


@pytest.fixture(scope="module")
def table():
    return P.compare_published()


def _row(table, key):
    file, mid = key
    rows = table[(table[P.FILE] == file) & (table[P.ID] == mid)]
    assert len(rows) == 1, key
    return rows.iloc[0]


def test_every_published_figure_has_a_row(table):
    assert len(table) == len(load_published()) == 47
    assert list(table.columns) == list(P.COLUMNS)


def test_the_mapped_set_is_pinned(table):
    """A mapping silently dropped (or a new one) fails here."""
    got = {(r[P.FILE], r[P.ID]) for r in P.estimated(table).to_dict("records")}
    assert got == set(EXPECTED) == set(P.ESTIMATORS)


@pytest.mark.parametrize("key", sorted(EXPECTED), ids=lambda k: f"{k[0].removesuffix('.json')}:{k[1]}")
def test_estimate_against_its_published_range(table, key):
    r = _row(table, key)
    expected_bytes, expected_within = EXPECTED[key]
    assert int(r[P.ESTIMATED]) == expected_bytes
    low, high = int(r[P.LOW]), int(r[P.HIGH])
    nearest = low if expected_bytes < low else high
    err = 0.0 if low <= expected_bytes <= high else (expected_bytes - nearest) / nearest
    assert r[P.ERROR] == pytest.approx(err, abs=1e-12)
    within = -0.03 <= err <= 0.05
    assert bool(r[P.WITHIN]) is within is expected_within
    if not within:  # a miss says why, in words, rather than a constant tuned to it
        assert r[P.WHY] == P.WHY_OFF[key] and len(r[P.WHY]) > 40


def test_the_within_target_figures_lie_in_their_tolerance(table):
    ok = P.estimated(table)[P.estimated(table)[P.WITHIN]]
    assert len(ok) == 11
    for r in ok.to_dict("records"):
        assert r[P.LOW] * 0.97 <= r[P.ESTIMATED] <= r[P.HIGH] * 1.05, (r[P.FILE], r[P.ID])


def test_not_estimated_rows_carry_the_source_files_missing_text(table):
    by_key = {(m.file, m.id): m for m in load_published()}
    rest = table[table[P.ESTIMATED] < 0]
    assert len(rest) == 27
    for r in rest.to_dict("records"):
        m = by_key[(r[P.FILE], r[P.ID])]
        assert m.missing and r[P.WHY] == f"not estimated: {m.missing}"
        assert math.isnan(r[P.ERROR]) and not r[P.WITHIN]


def test_relative_error_to_the_nearest_end():
    assert P.relative_error(100, 100, 110) == 0.0 and P.relative_error(110, 100, 110) == 0.0
    assert P.relative_error(97, 100, 110) == pytest.approx(-0.03)
    assert P.relative_error(121, 100, 110) == pytest.approx(0.1)
    assert P.within_target(-0.03) and P.within_target(0.05)
    assert not P.within_target(-0.0301) and not P.within_target(0.0501)


def test_summary(table):
    s = P.summary(table)
    assert (s["measurements"], s["estimated"], s["within_target"], s["in_sample"]) == (47, 20, 11, 12)
    assert s["within_target_out_of_sample"] == 4  # vLLM's total, both weights, the KV budget
    # largest under: vLLM TP 1 non-torch 641,728,512 vs 1.785 GiB; largest over: NCCL before, 2.747 vs 1.065 GB
    assert s["max_under"] == pytest.approx(641_728_512 / round(1.785 * GiB) - 1, abs=1e-9)
    assert s["max_over"] == pytest.approx(2_747_282_227 / 1_065_000_000 - 1, abs=1e-9)
    line = P.summary_line(table)
    assert "47, 20 estimated" in line and "11 of 20 within target" in line


def test_format_table_shows_each_miss_and_why(table):
    text = P.format_table(P.estimated(table))
    assert "tp1-weights" in text and "14.958 GiB" in text and "+158.0%  OFF" in text
    assert text.count("why:") == 9 + 1  # nine misses and the KV budget's note


def test_accuracy_cli_prints_the_published_table_after_the_truth_table(tmp_path, capsys):
    import shutil
    from pathlib import Path

    from nnmem_sweep.accuracy import accuracy_cli

    truth = Path(__file__).resolve().parent / "data" / "truth" / "gpt2-infer-fp32-b4-s512-d16.json"
    shutil.copy(truth, tmp_path / truth.name)
    assert accuracy_cli(tmp_path) == 0
    out = capsys.readouterr().out
    assert out.index("gpt2-infer-fp32-b4-s512-d16") < out.index("published real-GPU measurements (tests/data/published)")
    assert out.rstrip().splitlines()[-1].startswith("published real-GPU measurements: 47, 20 estimated")
