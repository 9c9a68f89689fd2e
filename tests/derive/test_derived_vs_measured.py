"""The derived path (issue 12) on every committed measured case, from the shipped plans (no tracing here):
  - on the hand-modelled families, derived and hand-modelled estimates agree byte for byte wherever the hand model is
    exact, and the derived one is exact everywhere (the hand model's known misses are listed with their bytes);
  - on the families without a hand model, the cases are shapes far from the probes the plans were solved at
    (b <= 4, s <= 160 and one long check): held out; the issue's target is median |error| <= 1 %, max <= 3 %.
"Exact" allows one thing the CPU measurement holds and a GPU does not: torch.optim's 4-byte `step` counter per
parameter tensor, which lives on the host in a CUDA run (a 0-d CPU tensor for foreach and for-loop optimizers)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nnmem_sweep.accuracy import ERROR, compare, hand_modelled_case, load_cases

TRUTH = Path(__file__).parents[1] / "data" / "truth"
CASES = [c for c in load_cases(TRUTH) if "layers" not in c["inputs"] and not c["inputs"].get("finetune")]
HAND = [c for c in CASES if hand_modelled_case(c)]
NEW = [c for c in CASES if not hand_modelled_case(c)]
NOT_DERIVED = {"t5-base-infer-fp32-b8-s512-d32": "an encoder-decoder's request is not derived"}
# hand-modelled cases where the hand model is not exact (estimated - measured, bytes), explained in FINDINGS.md
HAND_MISSES = {
    "bert-base-train-fp32-adamw-forsequenceclassification-b32-s128":
        "the hand model keeps the last layer's backward 23 MB too large for the classification head",
}


def _host_steps(row) -> int:
    """Bytes of optimizer state the CPU measurement holds beyond the estimate: torch.optim's 4-byte `step` counters
    (0 for SGD, for fused optimizers and for inference)."""
    meas, est = row.get("optimizer_measured_bytes", -1), row.get("optimizer_estimated_bytes", -1)
    return int(meas - est) if meas is not None and meas >= 0 and est is not None and est >= 0 else 0


@pytest.fixture(scope="module")
def derived():
    return compare(CASES, derived=True).set_index("case")


@pytest.fixture(scope="module")
def hand():
    return compare(HAND).set_index("case")


def _exact(row) -> bool:
    steps = _host_steps(row)
    assert 0 <= steps <= 4 * 4096, f"{steps} bytes of optimizer state beyond the estimate: not step counters"
    return int(row["estimated_peak_bytes"]) + steps == int(row["measured_peak_bytes"])


@pytest.mark.parametrize("case", CASES, ids=[c["case_id"] for c in CASES])
def test_derived_is_exact(derived, case):
    cid = case["case_id"]
    row = derived.loc[cid]
    if cid in NOT_DERIVED:
        assert row["estimate_error"], "now derived: drop it from NOT_DERIVED"
        return
    assert row["estimate_error"] == "", row["estimate_error"]
    assert _exact(row), (f"{cid}: derived {row['estimated_peak_bytes']:,} vs measured "
                               f"{row['measured_peak_bytes']:,}")


@pytest.mark.parametrize("case", HAND, ids=[c["case_id"] for c in HAND])
def test_derived_equals_hand_where_the_hand_model_is_exact(derived, hand, case):
    cid = case["case_id"]
    d, h = derived.loc[cid], hand.loc[cid]
    if cid in HAND_MISSES:
        assert d["estimated_peak_bytes"] != h["estimated_peak_bytes"], "the hand model is exact now"
        return
    assert int(d["estimated_peak_bytes"]) == int(h["estimated_peak_bytes"]), HAND_MISSES.get(cid, cid)


def test_held_out_error_of_the_new_families(derived):
    e = derived.loc[[c["case_id"] for c in NEW if c["case_id"] not in NOT_DERIVED], ERROR].abs()
    assert e.notna().all() and len(e) >= 30
    assert np.median(e) <= 0.01 and e.max() <= 0.03, f"median {np.median(e):.4%}, max {e.max():.4%}"
