"""The accuracy gate: the estimator against PyTorch's measured truth (tests/data/truth/*.json, `make truth`).

Each committed case states its tolerance (issue 7 targets: peak_allocated_bytes within 8 %, median |error| over all
cases within 3 %, weights / gradients / optimizer state within 0.1 %). A case the current estimator misses is
marked xfail(strict=True) below with the measured reason (phase, category, bytes), so that it is neither hidden
nor silently loosened: when the estimator is fixed the XPASS fails the suite until the mark is removed.
No torch needed: the measurements are committed; only the estimator runs here. The families without a hand model
(issue 12) are estimated from their shipped derived plans (nnmem_sweep/models/derived/, `make derive`): nothing is
traced here.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from nnmem_sweep.accuracy import ERROR, STATE_KINDS, compare, device_for_estimate, load_cases

TRUTH = Path(__file__).parent / "data" / "truth"
CASES = load_cases(TRUTH)  # every family: hand-modelled, and derived from the model's code (issue 12)
BY_ID = {c["case_id"]: c for c in CASES}
ALL_BY_ID = BY_ID

# case id -> why the current estimator misses the peak tolerance (figures from the committed measurement), marked
# xfail(strict=True). Empty: every case is estimated with the device it ran on (accuracy.device_for_estimate), and
# device="cpu" models the CPU-only kernels the GPT-2/BERT cases ran (F.dropout's noise tensor in the input dtype;
# SDPA's math fallback for dropout > 0, fp32 for bf16 inputs: components/cpu_kernels.py). Before that, six cases
# missed (max -36.9 %, gpt2-medium bf16); see tests/data/truth/FINDINGS.md.
KNOWN_PEAK_MISSES: dict[str, str] = {
    "t5-base-infer-fp32-b8-s512-d32": "an encoder-decoder's request is measured but not derived: its decoder's cache "
                                      "grows with the generated tokens, not the prompt (derive/derivation.py)",
}
# case id -> why a model-state total (weights, gradients, optimizer state) misses 0.1 %.
KNOWN_STATE_MISSES: dict[str, str] = {}
# reason, when the median / max target is not met yet
MEDIAN_MISS = ""


@pytest.fixture(scope="module")
def table():
    return compare(CASES).set_index("case")


def _params(known: dict[str, str]):
    return [pytest.param(cid, id=cid, marks=pytest.mark.xfail(strict=True, reason=known[cid]) if cid in known else ())
            for cid in sorted(BY_ID)]


def test_catalog_is_committed():
    assert len(CASES) >= 80
    families = {c["inputs"]["model"] for c in CASES}
    assert {"gpt2", "gpt2-medium", "bert-base", "bert-large", "llama-3.2-1b", "llama-3.1-8b", "qwen2.5-0.5b",
            "mixtral-small", "cnn-vgg-cifar"} <= families


@pytest.mark.parametrize("cid", sorted(ALL_BY_ID))
def test_case_record_is_consistent(cid):
    c = ALL_BY_ID[cid]
    m = c["measured"]
    # the category split at the peak adds up to the peak (torchinfo-style invariant on every golden)
    assert sum(m["categories_at_peak"].values()) == m["peak_bytes"]
    # the peak is the largest phase peak, and it is the phase it names
    assert max(p["peak_bytes"] for p in m["phases"].values()) == m["peak_bytes"]
    assert m["phases"][m["peak_phase"]]["peak_bytes"] == m["peak_bytes"]
    expected_phases = {"train": {"forward", "backward", "optimizer"}, "infer": {"prefill", "decode"}}
    want = expected_phases[c["inputs"]["mode"]]
    cfg = c["hf_config"] or {}
    head = (cfg.get("architectures") or [""])[0]
    if c["inputs"]["mode"] == "infer" and not head.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")):
        want = {"forward"}  # a classifier / `module:` net: one no_grad forward (measure/tracker.py _run_infer)
    elif c["inputs"]["mode"] == "infer" and not c["inputs"].get("decode_tokens"):
        want = {"prefill"}
    assert set(m["phases"]) == want
    assert c["versions"]["torch"] and c["versions"]["transformers"] and c["method"]
    # the kernel that ran is logged, and flash never ran where attention dropout is > 0 in training
    if cfg:
        dropout = max(float(cfg.get(k) or 0) for k in ("attn_pdrop", "attention_probs_dropout_prob",
                                                         "attention_dropout", "dropout_rate"))
        # CPU SDPA's flash kernel needs one head size for q, k and v; MLA's value heads are narrower (DeepSeek)
        mla = cfg.get("v_head_dim") not in (None, cfg.get("qk_nope_head_dim", 0) + cfg.get("qk_rope_head_dim", 0))
        if (c["inputs"]["mode"] == "train" and dropout > 0) or mla:
            assert m["attention_kernel"] == "math"
        elif c["inputs"]["attention"] == "flash":
            assert m["attention_kernel"] == "flash"


@pytest.mark.parametrize("cid", sorted(BY_ID))
def test_case_is_estimated_on_the_device_it_ran(cid):
    c = BY_ID[cid]
    # every committed case ran on the CPU; those that route F.dropout to native_dropout ran CUDA's dropout kernel
    assert c["device"].startswith("cpu")
    want = "cuda" if c["inputs"].get("dropout_impl") == "native" else "cpu"
    assert device_for_estimate(c) == want


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
    e = table[ERROR].abs().drop(list(KNOWN_PEAK_MISSES))
    assert e.notna().all()
    assert e.median() <= 0.03 and e.max() <= 0.08, f"median {e.median():.2%}, max {e.max():.2%}"


MOE_TRAIN = [c for c in CASES if c["inputs"]["model"] == "mixtral-small" and c["inputs"]["mode"] == "train"]


@pytest.mark.parametrize("case", MOE_TRAIN, ids=[c["case_id"] for c in MOE_TRAIN])
def test_an_moe_step_on_one_gpu_within_16_kib_in_every_phase(case):
    """A 4-layer Mixtral on one GPU (2 x 512 and 8 x 1,024; full checkpointing at 4 x 512 and 16 x 1,024): every
    phase, not only the peak, within 16 KiB below. The router's saved bytes (moe.router_saved) left every forward
    53,280 B per layer low; without block 0's experts' backward (moe.experts_backward), every gradient but the
    embedding's and block 0's attention made, the checkpointed backward at 4 x 512 was 53.4 MB low."""
    from nnmem_sweep.accuracy import estimate_case

    est = estimate_case(case)
    assert len(MOE_TRAIN) == 4
    for phase, m in case["measured"]["phases"].items():
        assert -16 * 1024 <= est["phases"][phase] - m["peak_bytes"] <= 0, phase
