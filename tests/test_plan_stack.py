"""Which releases a plan holds for (issue 21, item 2): results.csv's plan_stack and the report's first page.

A plan traced from a model's code holds for the transformers it was traced with (GPT-NeoX under autocast: 384 MiB
apart between transformers 5.17 and 5.24, tests/data/truth/FINDINGS.md), so every row names it."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.config import load_scenario
from nnmem_sweep.derive import cache
from nnmem_sweep.runner import HAND_STACK, plan_stack, run_scenario


def test_stack_text_names_each_release_it_has():
    assert cache.stack_text({"format": 2, "torch": "2.14.1+cu130", "transformers": "5.24.0", "peft": "0.21.2",
                             "torchvision": None}) == "torch 2.14.1, transformers 5.24.0, peft 0.21.2"
    # a plan shipped before peft was recorded does not claim one
    assert cache.stack_text({"torch": "2.13.0", "transformers": "5.23.0"}) == "torch 2.13.0, transformers 5.23.0"


def test_the_cache_key_changes_with_the_peft_release():
    a = cache.key("d", ("train",), {"torch": "2.14.1", "transformers": "5.24.0", "peft": "0.21.2"})
    b = cache.key("d", ("train",), {"torch": "2.14.1", "transformers": "5.24.0", "peft": "0.13.2"})
    assert a != b
    assert "peft" in cache.versions()


def test_hand_model_rows_say_what_the_formulas_were_checked_against():
    sc = load_scenario("configs/gpt2.yaml")
    res = run_scenario(sc, bands=False).results
    assert list(res.columns[:3]) == [C.MODEL, C.MODE, C.PLAN_STACK]
    assert set(res[C.PLAN_STACK]) == {HAND_STACK}


@pytest.mark.parametrize("config", ["configs/qwen3.yaml"])
def test_derived_rows_name_the_releases_their_plans_were_traced_with(config):
    sc = load_scenario(config)
    assert sc.model.kind == "derived"
    res = run_scenario(sc, bands=False).results
    stack = set(res[C.PLAN_STACK])
    assert len(stack) == 1
    text = stack.pop()
    assert text == plan_stack(sc) and text.startswith("traced with torch ")
    assert "transformers 5." in text


def test_report_first_page_names_the_stack(tmp_path):
    from nnmem_sweep.cli import main

    out = tmp_path / "r"
    assert main(["report", "configs/gpt2.yaml", "--out", str(out), "-q"]) == 0
    html = (out / "report.html").read_text()
    first = html[html.index('<section id="decision">'):html.index("</section>")]
    assert first.count(f"Plan made for: {HAND_STACK}.") == 1
    df = pd.read_csv(out / "results.csv")
    assert set(df[C.PLAN_STACK]) == {HAND_STACK}


def test_hand_stack_names_the_releases_of_the_committed_measured_cases():
    """HAND_STACK is what the hand model was checked against: the torch and transformers releases the committed
    truth was measured with (tests/data/truth), major.minor, lowest to highest; it must move when they do."""
    import json
    import re

    found = {"torch": set(), "transformers": set()}
    for path in Path("tests/data/truth").rglob("*.json"):
        versions = json.loads(path.read_text()).get("versions", {})
        for pkg in found:
            if versions.get(pkg):
                found[pkg].add(tuple(int(x) for x in re.findall(r"\d+", versions[pkg])[:2]))
    for pkg, seen in found.items():
        lo, hi = min(seen), max(seen)
        span = f"{lo[0]}.{lo[1]}" if lo == hi else f"{lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}"
        assert f"{pkg} {span}" in HAND_STACK, (pkg, span)
