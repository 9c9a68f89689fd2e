"""The accuracy gate: the estimator against PyTorch's measured truth (tests/data/truth/*.json, `make truth`).

Each committed case states its tolerance (issue 7 targets: peak_allocated_bytes within 8 %, median |error| over all
cases within 3 %, weights / gradients / optimizer state within 0.1 %). A case the current estimator misses is
marked xfail(strict=True) below with the measured reason (phase, category, bytes), so that it is neither hidden
nor silently loosened: when the estimator is fixed the XPASS fails the suite until the mark is removed.
No torch needed: the measurements are committed; only the estimator runs here.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from nnmem_sweep.accuracy import ERROR, STATE_KINDS, compare, load_cases

TRUTH = Path(__file__).parent / "data" / "truth"
CASES = load_cases(TRUTH)
BY_ID = {c["case_id"]: c for c in CASES}

# case id -> why the current estimator misses the peak tolerance (figures from the committed measurement).
# CPU-only kernels (not estimator faults for a GPU; each has a GPU-faithful twin "-eager-nativedropout-" measured
# within 0.01 %): CPU F.dropout is ATen's composite `input * mask`, keeping the mask in the input dtype (4 B fp32,
# 2 B bf16) where CUDA's fused native_dropout keeps 1 B; CPU SDPA's math fallback (dropout > 0) upcasts bf16 q/k/v
# to fp32, so its s x s tensors are fp32. See tests/data/truth/FINDINGS.md.
_CPU_DROPOUT = "CPU composite dropout keeps fp32 masks (CUDA: 1-byte bool): "
_CPU_MATH_BF16 = "CPU SDPA math fallback upcasts bf16 to fp32 (s x s scores, probs, masks in fp32) + bf16 masks: "
KNOWN_PEAK_MISSES: dict[str, str] = {
    "gpt2-train-fp32-adamw-b4-s512": _CPU_DROPOUT + "backward peak -570,954,328 B (-8.4 %) = 12 layers × "
    "(3 B·b·a·s² + 6 B·b·s·h) + embedding mask 3 B·b·s·h = 566,231,040 + 4,718,592",
    "gpt2-medium-train-fp32-adam-eager-b4-s512": _CPU_DROPOUT + "activations -1,516,245,000 B at the backward "
    "peak (-9.3 %)",
    "gpt2-medium-train-bf16-adamw-b2-s1024": _CPU_MATH_BF16 + "activations -6,041,501,704 B at the backward peak "
    "(-36.9 %)",
    "bert-base-train-fp32-adamw-forsequenceclassification-b32-s128": _CPU_DROPOUT + "backward -439,259,188 B "
    "(-8.7 %), forward -487,245,092 B",
    "bert-large-train-fp32-adamw-b8-s512": _CPU_DROPOUT + "activations -3,032,485,896 B at the backward peak "
    "(-13.5 %), mostly the s² masks at s = 512",
    "bert-large-train-bf16-adafactor-b16-s128": _CPU_MATH_BF16 + "activations -1,108,984,836 B at the backward "
    "peak (-25.2 %)",
}
# case id -> why a model-state total (weights, gradients, optimizer state) misses 0.1 %.
KNOWN_STATE_MISSES: dict[str, str] = {}
# reason, when the median / max target is not met yet
MEDIAN_MISS = ("median |error| 0.002 % meets 3 %; max 36.9 % (gpt2-medium bf16, CPU SDPA math upcast) misses 8 %: "
               "the CPU-only kernel cases above")


@pytest.fixture(scope="module")
def table():
    return compare(CASES).set_index("case")


def _params(known: dict[str, str]):
    return [pytest.param(cid, id=cid, marks=pytest.mark.xfail(strict=True, reason=known[cid]) if cid in known else ())
            for cid in sorted(BY_ID)]


def test_catalog_is_committed():
    assert len(CASES) >= 30
    families = {c["inputs"]["model"] for c in CASES}
    assert {"gpt2", "gpt2-medium", "bert-base", "bert-large", "llama-3.2-1b", "llama-3.1-8b", "qwen2.5-0.5b",
            "mixtral-small", "cnn-vgg-cifar"} <= families


@pytest.mark.parametrize("cid", sorted(BY_ID))
def test_case_record_is_consistent(cid):
    c = BY_ID[cid]
    m = c["measured"]
    # the category split at the peak adds up to the peak (torchinfo-style invariant on every golden)
    assert sum(m["categories_at_peak"].values()) == m["peak_bytes"]
    # the peak is the largest phase peak, and it is the phase it names
    assert max(p["peak_bytes"] for p in m["phases"].values()) == m["peak_bytes"]
    assert m["phases"][m["peak_phase"]]["peak_bytes"] == m["peak_bytes"]
    expected_phases = {"train": {"forward", "backward", "optimizer"}, "infer": {"prefill", "decode"}}
    want = expected_phases[c["inputs"]["mode"]]
    if c["inputs"]["mode"] == "infer" and not c["inputs"].get("decode_tokens"):
        want = {"prefill"}
    assert set(m["phases"]) == want
    assert c["versions"]["torch"] and c["versions"]["transformers"] and c["method"]
    # the kernel that ran is logged, and flash never ran where attention dropout is > 0 in training
    if "layers" not in c["inputs"]:
        cfg = c["hf_config"]
        dropout = max(float(cfg.get(k) or 0) for k in ("attn_pdrop", "attention_probs_dropout_prob",
                                                         "attention_dropout"))
        if c["inputs"]["mode"] == "train" and dropout > 0:
            assert m["attention_kernel"] == "math"
        elif c["inputs"]["attention"] == "flash":
            assert m["attention_kernel"] == "flash"


@pytest.mark.parametrize("cid", _params(KNOWN_PEAK_MISSES))
def test_peak_within_tolerance(table, cid):
    row = table.loc[cid]
    assert row["estimate_error"] == "", row["estimate_error"]
    assert abs(row[ERROR]) <= row["peak_tolerance"], (
        f"{cid}: estimated {row['estimated_peak_bytes']:,} vs measured {row['measured_peak_bytes']:,} "
        f"({row[ERROR]:+.2%}), phase {row['estimated_phase']} vs {row['measured_phase']}")


@pytest.mark.parametrize("cid", _params(KNOWN_STATE_MISSES))
def test_model_states_within_tolerance(table, cid):
    row = table.loc[cid]
    for kind in STATE_KINDS:
        err = row[f"{kind}_error"]
        if err == err:  # NaN where the mode has no such state (inference: no gradients, no optimizer)
            assert abs(err) <= row["state_tolerance"], (
                f"{cid}: {kind} estimated {row[f'{kind}_estimated_bytes']:,} vs measured "
                f"{row[f'{kind}_measured_bytes']:,} ({err:+.3%})")


@pytest.mark.xfail(strict=True, reason=MEDIAN_MISS) if MEDIAN_MISS else (lambda f: f)
def test_median_and_max_error(table):
    e = table[ERROR].abs()
    assert e.notna().all()
    assert e.median() <= 0.03 and e.max() <= 0.08, f"median {e.median():.2%}, max {e.max():.2%}"
