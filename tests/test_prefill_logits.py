"""serving.prefill_logits: the prefill's logits for the last position (generate(), logits_to_keep=1) or for all."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnmem_sweep import columns as C
from nnmem_sweep.peak import estimate_components
from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.errors import ScenarioError, UsageError
from nnmem_sweep.models.presets import load_preset
from nnmem_sweep.runner import run_scenario

QWEN = load_preset("qwen2.5-0.5b")  # V 151936, h 896, 24 layers, tied embeddings


def _frame(b: int, s: int, decode: int = 2, precision: str = "bf16") -> pd.DataFrame:
    return pd.DataFrame({C.BATCH: [b], C.SEQ_LEN: [s], C.PRECISION: [precision], C.ATTENTION: ["flash"],
                         C.CACHE_TOKENS: [0], C.DECODE_TOKENS: [decode], C.OPTIMIZER: ["none"],
                         C.OPTIMIZER_IMPL: ["none"], C.CHECKPOINTING: ["none"]})


def _est(logits: str, b: int = 2, s: int = 512, **kw) -> dict:
    out = estimate_components(QWEN, "infer", _frame(b, s, **kw), prefill_logits=logits)
    return {k: (v[0] if k == C.PEAK_PHASE else int(np.asarray(v)[0])) for k, v in out.items()}


# Measured with nnmem_sweep.measure (FakeTensorMode, transformers 5.23, torch 2.13 CPU): case
# qwen2.5-0.5b-infer-bf16-b2-s512-d2, Workload(logits_to_keep=1) and Workload(logits_to_keep=0). Prefill peaks
# 1_038_016_512 (at the MLP's mul) and 1_313_656_832 (at lm_head's mm); both include a 256-byte buffer the
# estimator does not count.
MEASURED_PREFILL = {"last": 1_038_016_512, "all": 1_313_656_832}
BUFFER = 256


@pytest.mark.parametrize("logits", ["last", "all"])
def test_measured_qwen_b2_s512_prefill_peak(logits):
    est = _est(logits)
    assert est[C.PEAK_PHASE] == "prefill"
    assert est[C.PEAK_ALLOCATED] + BUFFER == MEASURED_PREFILL[logits]


def test_all_minus_last_hand_computed():
    last, every = _est("last"), _est("all")
    # all: lm_head's output over every position beside the final norm output and the token ids:
    # b·s·(V·e + r·h + 8) = 2·512·(151936·2 + 896·2 + 8) = 1024·305_672 = 313_008_128
    assert every[C.TEMPORARY] == 313_008_128
    # last: the MLP moment wins (37_367_808); the difference matches the measured one exactly:
    # 313_008_128 − 37_367_808 = 275_640_320 = 1_313_656_832 − 1_038_016_512
    assert every[C.TEMPORARY] - last[C.TEMPORARY] == 275_640_320
    assert MEASURED_PREFILL["all"] - MEASURED_PREFILL["last"] == 275_640_320
    # weights and KV cache are the same: 24 layers · 2 · 2 kv heads · 64 · 2 bytes · 2·512 tokens = 12_582_912
    assert every[C.KV_CACHE] == last[C.KV_CACHE] == 12_582_912
    assert every[C.WEIGHTS] == last[C.WEIGHTS]


def test_one_token_prompt_is_the_same_and_decode_is_unchanged():
    # s = 1: every position is the last one
    assert _est("all", b=3, s=1) == _est("last", b=3, s=1)
    # a decode step computes one token's logits either way: with a short prompt and a long decode, decode wins
    assert _est("all", b=1, s=2, decode=4096) == _est("last", b=1, s=2, decode=4096)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 64), s=st.integers(1, 32768), p=st.sampled_from(["bf16", "fp32", "int8"]))
def test_all_never_below_last(b, s, p):
    assert _est("all", b=b, s=s, precision=p)[C.PEAK_ALLOCATED] >= _est("last", b=b, s=s, precision=p)[
        C.PEAK_ALLOCATED]


def test_default_is_last():
    frame = _frame(2, 512)
    a = estimate_components(QWEN, "infer", frame)
    b = estimate_components(QWEN, "infer", frame, prefill_logits="last")
    assert all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def test_unknown_value_is_a_usage_error():
    with pytest.raises(UsageError, match="prefill_logits"):
        estimate_components(QWEN, "infer", _frame(1, 8), prefill_logits="first")


def _scenario(serving: str):
    return parse_scenario_text(f"""
model: {{preset: qwen2.5-0.5b}}
mode: infer
grid: {{batch: 2, seq_len: 512, precision: bf16, decode_tokens: 2}}
gpus: [l4]
{serving}
""")


def test_scenario_option_reaches_results():
    last = run_scenario(_scenario("")).results
    every = run_scenario(_scenario("serving: {prefill_logits: all}")).results
    assert int(last[C.PEAK_ALLOCATED].iloc[0]) + BUFFER == MEASURED_PREFILL["last"]
    assert int(every[C.PEAK_ALLOCATED].iloc[0]) + BUFFER == MEASURED_PREFILL["all"]


def test_scenario_rejects_unknown_value():
    with pytest.raises(ScenarioError, match="prefill_logits"):
        _scenario("serving: {prefill_logits: first}")


def test_all_positions_reach_max_batch_and_the_streamed_run(tmp_path):
    """Regression: `serving.prefill_logits: all` changed results.csv but not max_batch.csv nor `run --stream`."""
    from nnmem_sweep.config import parse_scenario_text
    from nnmem_sweep.runner import run_scenario, write_outputs
    from nnmem_sweep.stream import run_streamed

    text = ("name: q\nmodel: {preset: qwen2.5-0.5b}\nmode: infer\ngrid:\n  batch: [1, 8]\n  seq_len: [4096]\n"
            "  precision: bf16\ngpus: [l4]\nserving: {prefill_logits: %s}\n")
    last, every = (run_scenario(parse_scenario_text(text % v, str(tmp_path / f"{v}.yaml"), tmp_path))
                   for v in ("last", "all"))
    # logits of all 4,096 positions (V = 151,936, bf16) make every prefill larger, so fewer sequences fit
    assert (every.results["peak_allocated_bytes"] > last.results["peak_allocated_bytes"]).all()
    assert int(every.max_batch["max_batch"].iloc[0]) < int(last.max_batch["max_batch"].iloc[0])
    write_outputs(every, tmp_path / "mem")
    run_streamed(every.scenario, tmp_path / "stream", chunk_rows=1)
    for name in ("results.csv", "max_batch.csv"):
        assert (tmp_path / "stream" / name).read_bytes() == (tmp_path / "mem" / name).read_bytes()


def test_report_says_which_prefill_logits_the_grid_used(tmp_path):
    from nnmem_sweep.config import parse_scenario_text
    from nnmem_sweep.report import render_report
    from nnmem_sweep.runner import run_scenario

    text = ("name: q\nmodel: {preset: qwen2.5-0.5b}\nmode: infer\ngrid:\n  batch: [1, 8]\n  seq_len: [4096]\n"
            "  precision: bf16\ngpus: [l4]\nserving: {prefill_logits: %s}\n")
    for value, phrase in (("all", "every prompt position"), ("last", "the last position only, as generate()")):
        cfg = tmp_path / f"{value}.yaml"
        cfg.write_text(text % value)
        result = run_scenario(parse_scenario_text(text % value, str(cfg), tmp_path))
        render_report(result, tmp_path / value, cfg, pdf=False, validation=None)
        assert phrase in (tmp_path / value / "report.html").read_text()
