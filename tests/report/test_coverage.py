"""The report's "measured case" column: which of the scenario's recipes a committed measurement exercises."""
import pandas as pd

from nnmem_sweep.accuracy import compare, covered, load_cases
from nnmem_sweep.report.assumptions import _with_coverage

from pathlib import Path

TRUTH = Path(__file__).resolve().parents[1] / "data" / "truth"


def test_covered_counts_only_cases_within_tolerance():
    table = pd.DataFrame({"precision": ["bf16", "fp32", "bf16-master"], "within_tolerance": [True, True, False]})
    assert covered(table, "precision") == {"bf16", "fp32"}
    assert covered(None, "precision") == set()


def test_committed_truth_covers_the_measured_recipes_and_not_the_others():
    table = compare(load_cases(TRUTH))
    precisions, optimizers = covered(table, "precision"), covered(table, "optimizer")
    assert {"fp32", "bf16", "bf16-mixed"} <= precisions
    assert "bf16-master" not in precisions and "nf4" not in precisions
    assert {"adamw", "adam", "sgd", "sgd-momentum", "adafactor"} <= optimizers
    assert "lion" not in optimizers and "adamw-8bit" not in optimizers


def test_entries_say_yes_not_yet_or_nothing():
    entries = [{"id": "bf16"}, {"id": "bf16-master"}]
    assert [e["measured"] for e in _with_coverage(entries, {"bf16"})] == ["yes", "not yet"]
    assert [e["measured"] for e in _with_coverage(entries, None)] == ["", ""]


def test_a_recipe_only_sharded_steps_measure_is_measured():
    """bf16-master is measured by DeepSpeed's cases only (one rank of its engine, tests/data/truth/deepspeed/): a
    report's precision table says so ("yes"), where it said "not yet" counting one-GPU cases alone."""
    from nnmem_sweep.config import parse_scenario_text
    from nnmem_sweep.report.assumptions import assumptions

    sc = parse_scenario_text("model: {preset: llama-3.2-1b}\nmode: train\ngrid: {batch: 1, seq_len: 1024, "
                             "precision: [bf16, bf16-master], optimizer: adamw}\ngpus: [h100-sxm]\n")
    one_gpu, sharded = compare(load_cases(TRUTH)), compare(load_cases(TRUTH, sharded=True))
    said = {e["id"]: e["measured"] for e in assumptions(sc, one_gpu)["precisions"]}
    assert said == {"bf16": "yes", "bf16-master": "not yet"}
    said = {e["id"]: e["measured"] for e in assumptions(sc, one_gpu, sharded)["precisions"]}
    assert said == {"bf16": "yes", "bf16-master": "yes"}


def test_the_validation_section_says_what_the_sharded_cases_measured():
    """The Validation section's note counts the sharded steps' cases by framework and gives their errors (a
    DeepSpeed report listed only one-GPU cases)."""
    from nnmem_sweep.report.appendix import sharded_line, validation

    table = pd.DataFrame({"case": ["qwen3-0.6b-fsdp2z3-train-b2", "llama-3.2-1b-ds2z2-train-b2", "x-ds8z3-train",
                                   "llama-3.2-1b-fsdp1w2z3-train-b2"],
                          "sharded_by": ["FSDP2", "DeepSpeed", "DeepSpeed", "FSDP1"],
                          "error": [0.001, -0.004, 0.02, 0.0], "within_tolerance": [True, True, False, True]})
    line = sharded_line(table)
    assert "4 cases" in line and "(1 of FSDP2 and 1 of FSDP1 on" in line and "2 of DeepSpeed" in line
    assert "median |error| 0.25%, largest 2.00%, 3 within" in line
    assert sharded_line(None) == "" and validation(None, None, None, table)["sharded"] == line
    assert set(compare(load_cases(TRUTH, sharded=True))["sharded_by"]) == {"FSDP2", "FSDP1", "DeepSpeed"}
