"""config.load_scenario: the bad-config suite, the shipped configs, defaults, and robustness.

Bad configs live in tests/configs/bad/NAME.yaml with the exact problems they must produce in NAME.expected (one per
line, without the leading "file:"). Regenerate after a deliberate message change with
NNMEM_UPDATE_EXPECTED=1 pytest tests/test_config.py, and review the diff.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from _helpers import load_edited
from nnmem_sweep import columns as C
from nnmem_sweep import config, config_schema, config_yaml, scenario
from nnmem_sweep.catalog import names
from nnmem_sweep.catalog.gpus import get_gpu
from nnmem_sweep.config import load_scenario, parse_scenario_text, schema_text
from nnmem_sweep.derive.cache import versions
from nnmem_sweep.errors import ScenarioError
from nnmem_sweep.units import GiB, MiB

ROOT = Path(__file__).resolve().parent.parent
BAD = ROOT / "tests" / "configs" / "bad"
SHIPPED = sorted((ROOT / "configs").glob("*.yaml"))
BAD_FILES = sorted(BAD.glob("*.yaml"))
SCHEMA_LINE = "# yaml-language-server: $schema=../nnmem_sweep/schema/scenario.schema.json"


def problems_of(path: Path | str) -> list[str]:
    """The problems load_scenario reports for `path`, each without its leading 'file:'."""
    file = str(path)
    with pytest.raises(ScenarioError) as info:
        load_scenario(file)
    return [str(p).removeprefix(file + ":").strip() for p in info.value.problems]


# ---------------------------------------------------------------------------------------------------------------
# The bad-config suite


@pytest.mark.parametrize("path", BAD_FILES, ids=lambda p: p.stem)
def test_bad_config_reports_exactly_the_expected_problems(path: Path) -> None:
    # Relative path, as a user types it: the expected lines then hold paths relative to the repository.
    rel = path.relative_to(ROOT)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        got = problems_of(rel)
    finally:
        os.chdir(cwd)
    expected_file = path.with_suffix(".expected")
    installed = versions().get("transformers")  # messages naming the installed release hold a placeholder
    got = [line.replace(f"transformers {installed} ", "transformers <installed> ") for line in got] if installed \
        else got
    if os.environ.get("NNMEM_UPDATE_EXPECTED"):
        expected_file.write_text("\n".join(got) + "\n", encoding="utf-8")
    assert got == expected_file.read_text(encoding="utf-8").splitlines()


def test_every_bad_config_has_its_expected_file() -> None:
    assert len(BAD_FILES) >= 16
    missing = [p.name for p in BAD_FILES if not p.with_suffix(".expected").exists()]
    assert missing == []


def test_several_errors_are_all_reported_at_once() -> None:
    got = problems_of(BAD / "many-errors.yaml")
    # missing model, a typo'd key, a bad mode, batch 0, an unknown precision, an unknown GPU, headroom out of range
    assert len(got) == 7
    assert [line.split(": ")[1] for line in got] == [
        "missing required key 'model'", "modle", "mode", "grid.batch[1]", "grid.precision", "gpus[1]", "headroom"]


def test_alias_bomb_stops_at_the_node_limit() -> None:
    # 9 levels of 9 aliases each would expand to 9**9 = 387,420,489 strings; the builder stops at MAX_NODES.
    got = problems_of(BAD / "billion-laughs.yaml")
    assert got == [f"the document expands to more than {config_yaml.MAX_NODES:,} values (aliases counted at each use); "
                   "a scenario is small: is this an alias bomb?"]


def test_problem_lines_point_at_the_offending_text() -> None:
    # Every located problem's line:column must land on the key or value it names.
    checked = 0
    for path in BAD_FILES:
        lines = path.read_text(encoding="utf-8").splitlines()
        for text in path.with_suffix(".expected").read_text(encoding="utf-8").splitlines():
            head = text.split(": ", 1)[0]
            if ":" not in head or not head.replace(":", "").isdigit():
                continue
            line, col = map(int, head.split(":"))
            assert 1 <= line <= len(lines) and 1 <= col <= len(lines[line - 1]) + 1, (path.name, text)
            at = lines[line - 1][col - 1:]
            # A key problem points at the key; a bad string value points at that string.
            for pattern in (r"unknown key '([^']*)'", r"duplicate key '([^']*)'", r"got the string '([^']*)'",
                            r"^\S+: the string '([^']*)' is not one of"):
                found = re.search(pattern, text.split(": ", 1)[1])
                if found:
                    assert at.lstrip("'\"").startswith(found.group(1)), (path.name, text, at)
                    checked += 1
    assert checked >= 8, checked  # the patterns above really matched something


# ---------------------------------------------------------------------------------------------------------------
# File-level problems (made here: binary and broken files do not belong in the repository as fixtures)


def test_missing_file(tmp_path: Path) -> None:
    assert problems_of(tmp_path / "nope.yaml") == ["no such file"]


def test_directory(tmp_path: Path) -> None:
    assert problems_of(tmp_path) == ["is a folder, not a scenario file"]


def test_zero_byte_file(tmp_path: Path) -> None:
    (tmp_path / "e.yaml").write_bytes(b"")
    assert problems_of(tmp_path / "e.yaml") == ["the file is empty; a scenario needs at least model, grid and gpus"]


def test_binary_file(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    assert problems_of(tmp_path / "b.yaml") == ["is a binary file (it contains NUL bytes), not YAML text"]


def test_non_utf8_file_is_located(tmp_path: Path) -> None:
    # Latin-1 'é' (0xe9) on line 2, column 8.
    (tmp_path / "l.yaml").write_bytes(b"model: {preset: gpt2}\nname: caf\xe9\n")
    assert problems_of(tmp_path / "l.yaml") == ["2:10: is not UTF-8 text (byte 0xe9)"]


def test_control_character_is_located(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("name: a\x07b\n", encoding="utf-8")
    assert problems_of(tmp_path / "c.yaml") == ["1:8: character U+0007 is not allowed in YAML text"]


def test_oversized_file(tmp_path: Path) -> None:
    (tmp_path / "big.yaml").write_text("# " + "x" * config.MAX_FILE_BYTES + "\n", encoding="utf-8")
    size = config.MAX_FILE_BYTES + 3
    assert problems_of(tmp_path / "big.yaml") == [
        f"is {size:,} bytes; a scenario file is small YAML text (at most {config.MAX_FILE_BYTES:,})"]


def test_two_documents(tmp_path: Path) -> None:
    (tmp_path / "two.yaml").write_text("name: a\n---\nname: b\n", encoding="utf-8")
    assert problems_of(tmp_path / "two.yaml") == [
        "2:1: YAML syntax error: expected a single document in the stream, but found another document"]


def test_undefined_alias(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("name: *nowhere\n", encoding="utf-8")
    assert problems_of(tmp_path / "a.yaml") == ["1:7: YAML syntax error: found undefined alias 'nowhere'"]


# ---------------------------------------------------------------------------------------------------------------
# Shipped configs


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_config_validates(path: Path) -> None:
    sc = load_scenario(path)
    assert path.read_text(encoding="utf-8").splitlines()[0] == SCHEMA_LINE
    assert set(sc.grid) == set(C.GRID_AXES)
    assert all(len(v) >= 1 for v in sc.grid.values())
    assert sc.gpus and sc.model.params > 0
    assert sc.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert sc.source_text == path.read_text(encoding="utf-8")


def test_shipped_configs_cover_every_model_kind_and_mode() -> None:
    scs = {p.stem: load_scenario(p) for p in SHIPPED}
    assert {"llama", "gpt2", "bert", "mixtral", "cnn", "simple-params", "llama-serving", "hf", "qwen3",
            "resnet50"} <= set(scs)
    assert {sc.model.kind for sc in scs.values()} == {"transformer", "params", "layers", "derived"}
    assert {sc.mode for sc in scs.values()} == {"train", "infer"}
    assert scs["bert"].model.head == "masked_lm"
    assert scs["mixtral"].model.num_experts == 8


def test_llama_config_is_the_one_the_issue_asks_for() -> None:
    sc = load_scenario(ROOT / "configs" / "llama.yaml")
    assert sc.model.params == 8_030_261_248  # Llama 3.1 8B, published count
    assert sc.grid[C.BATCH][0] == 1 and sc.grid[C.BATCH][-1] == 64
    assert sc.grid[C.SEQ_LEN][0] == 1024 and sc.grid[C.SEQ_LEN][-1] == 32768
    assert {"bf16-mixed", "bf16", "fp32", "bf16-master"} == set(sc.grid[C.PRECISION])
    assert {"adamw", "adamw-8bit", "sgd-momentum", "adafactor"} == set(sc.grid[C.OPTIMIZER])
    assert set(sc.grid[C.CHECKPOINTING]) == {"none", "full"}
    assert {"a100-40gb", "a100-80gb", "h100-sxm", "h200", "l40s", "rtx-4090", "mi300x"} <= {g.id for g in sc.gpus}
    points = 1
    for values in sc.grid.values():
        points *= len(values)
    assert points * len(sc.gpus) == 8 * 6 * 4 * 4 * 2 * 7 == 10_752  # grid points x GPUs: rows of results.csv
    assert sc.target == {"batch": 8, "seq_len": 8192}


def test_worked_example_config_holds_the_published_numbers() -> None:
    # FORMULAS.md worked example 1: 20,000,000 params, 1,000,000 activation elements per sample, batch 32, fp32.
    sc = load_scenario(ROOT / "configs" / "simple-params.yaml")
    assert (sc.model.kind, sc.model.params, sc.model.activation_elements_per_sample) == ("params", 20_000_000,
                                                                                         1_000_000)
    assert 32 in sc.grid[C.BATCH] and sc.grid[C.PRECISION] == ("fp32",) and sc.grid[C.SEQ_LEN] == (1,)
    assert (sc.overheads.cuda_context_bytes, sc.overheads.cublas_workspace_bytes, sc.headroom) == (0, 0, 0.0)


# ---------------------------------------------------------------------------------------------------------------
# Defaults and normalisation

MINIMAL_TRAIN = """
model: {preset: gpt2}
grid: {batch: 4, seq_len: 1024, precision: bf16-mixed, optimizer: adamw}
gpus: [h100-sxm]
"""


def test_a_number_with_an_exponent_and_no_dot_is_a_number() -> None:
    """2e8 is a number in YAML 1.2 and JSON (DeepSpeed's configs write bucket sizes so; the docs' example too), text
    under PyYAML's YAML 1.1 rules: the scenario reads it as the number, an integer where it is whole; quoted, text."""
    sc = parse_scenario_text(MINIMAL_TRAIN.replace("batch: 4", "batch: 4e0") + "headroom: 5e-2\n"
                             "parallel: {data_parallel: 2, zero_stage: 2, deepspeed: {reduce_bucket_size: 2E8}}\n")
    assert sc.grid[C.BATCH] == (4,) and isinstance(sc.grid[C.BATCH][0], int) and sc.headroom == 0.05
    assert sc.parallel[C.REDUCE_BUCKET] == (200_000_000,)
    with pytest.raises(ScenarioError, match="expected a number or 'auto', got the string '2e8'"):
        parse_scenario_text(MINIMAL_TRAIN + "parallel: {data_parallel: 2, zero_stage: 2, "
                            "deepspeed: {reduce_bucket_size: '2e8'}}\n")


def test_a_block_of_alternative_keys_given_no_mapping_is_one_type_error() -> None:
    """cluster takes one of global_batch or tokens_per_step; given nothing at all (`cluster:`), the one problem is
    that it is not a mapping (the fuzz test found this raising a TypeError)."""
    with pytest.raises(ScenarioError) as info:
        parse_scenario_text(MINIMAL_TRAIN + "cluster:\n", file="c.yaml")
    assert [p.message for p in info.value.problems] == ["expected a mapping, got nothing (null)"]


def test_train_defaults() -> None:
    sc = parse_scenario_text(MINIMAL_TRAIN, file="mini.yaml")
    assert sc.name == "mini" and sc.mode == "train" and sc.description == ""
    assert sc.grid == {
        C.BATCH: (4,), C.SEQ_LEN: (1024,), C.PRECISION: ("bf16-mixed",), C.OPTIMIZER: ("adamw",),
        C.OPTIMIZER_IMPL: ("foreach",), C.CHECKPOINTING: ("none",), C.ATTENTION: ("flash",),
        C.CACHE_TOKENS: (0,), C.DECODE_TOKENS: (0,),
    }
    # nothing given: every overhead modelled (components/overhead.py) for the scenario's GPUs, the 5 % reserve where
    # no replay is available
    assert (sc.overheads.cuda_context_bytes, sc.overheads.cublas_workspace_bytes) == (None, None)
    assert sc.overheads.allocator_reserve_fraction is None and sc.overheads.reserve_fraction == 0.05
    assert sc.overheads.gpus == sc.gpus and sc.overheads.runtime == () and sc.headroom == 0.05
    # the PyTorch-visible capacity: torchtitan#1789's '58.28GiB(73.68%)' on an H100 80GB HBM3, low end (catalog)
    assert sc.gpus == (get_gpu("h100-sxm"),) and sc.gpus[0].memory_bytes == 84_918_646_663


def test_infer_defaults() -> None:
    sc = parse_scenario_text("""
mode: infer
model: {preset: gpt2}
grid: {batch: [1, 8], seq_len: 512, precision: [bf16, int4]}
gpus: [l4]
""")
    g = sc.grid
    assert (g[C.OPTIMIZER], g[C.OPTIMIZER_IMPL], g[C.CHECKPOINTING]) == (("none",), ("none",), ("none",))
    assert (g[C.ATTENTION], g[C.CACHE_TOKENS], g[C.DECODE_TOKENS]) == (("flash",), (0,), (1,))
    assert g[C.PRECISION] == ("bf16", "int4")


def test_lists_are_deduplicated_keeping_order_and_whole_floats_become_ints() -> None:
    sc = parse_scenario_text(MINIMAL_TRAIN.replace("batch: 4", "batch: [8, 2, 8, 4.0, 2]"))
    assert sc.grid[C.BATCH] == (8, 2, 4)
    assert all(type(b) is int for b in sc.grid[C.BATCH])


def test_gpu_forms_and_prices() -> None:
    sc = parse_scenario_text(MINIMAL_TRAIN.replace("gpus: [h100-sxm]", """gpus:
  - a100-80gb
  - {id: h100-sxm, price_usd: 30000, price_usd_per_hour: 2.5}
  - {name: Workstation 48G, memory: 48 GiB, price_usd: 7000}
  - {name: Raw bytes card, memory: 1000000000}"""))
    a100, h100, ws, raw = sc.gpus
    # vllm#4408 '79.15 GiB' on an A100 80GB, low end: 79.145 GiB (nvidia-smi's 81920 MiB is the device total)
    assert a100.memory_bytes == 84_981_296_661 and a100.device_total_bytes == 81920 * MiB and a100.price_usd is None
    assert (h100.price_usd, h100.price_usd_per_hour) == (30000, 2.5)
    assert (ws.id, ws.name, ws.memory_bytes, ws.price_usd) == ("workstation-48g", "Workstation 48G", 48 * GiB, 7000)
    assert raw.memory_bytes == 10**9 and raw.source == "given in the scenario"


def test_duplicate_gpu_is_an_error() -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario_text(MINIMAL_TRAIN.replace("[h100-sxm]", "[h100-sxm, l4, {id: h100-sxm, price_usd: 1}]"),
                            file="d.yaml")
    assert [str(p) for p in info.value.problems] == [
        "d.yaml:4:22: gpus[2]: GPU 'h100-sxm' is listed twice (also gpus[0])"]


def test_overheads_can_be_zero_and_take_units() -> None:
    sc = parse_scenario_text(MINIMAL_TRAIN + "overheads: {cuda_context: 0, cublas_workspace: 32 MiB, "
                             "allocator_reserve: 0}\nheadroom: 0\n")
    assert (sc.overheads.cuda_context_bytes, sc.overheads.cublas_workspace_bytes) == (0, 32 * MiB)
    assert sc.overheads.allocator_reserve_fraction == 0.0 and sc.headroom == 0.0


def test_static_cache_large_enough_is_accepted() -> None:
    sc = parse_scenario_text("""
mode: infer
model: {preset: gpt2}
grid: {batch: 1, seq_len: [512, 768], precision: bf16, decode_tokens: 256, cache_tokens: [0, 1024]}
gpus: [l4]
""")
    assert sc.grid[C.CACHE_TOKENS] == (0, 1024)  # 768 + 256 = 1024 tokens: exactly enough


def test_anchors_and_merge_keys_are_plain_yaml_and_allowed() -> None:
    sc = parse_scenario_text(MINIMAL_TRAIN + """report:
  reference_points:
    - &small {batch: 1, seq_len: 1024}
    - {<<: *small, batch: 4}
""")
    assert sc.report["reference_points"] == [{"batch": 1, "seq_len": 1024}, {"batch": 4, "seq_len": 1024}]


def test_report_templates_are_resolved_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "tpl").mkdir()
    (tmp_path / "s.yaml").write_text(MINIMAL_TRAIN + "report: {templates: tpl, paper: Letter, "
                                                     "table_rows: [seq_len, precision]}\n", encoding="utf-8")
    sc = load_scenario(tmp_path / "s.yaml")
    assert sc.report == {"templates": str((tmp_path / "tpl").resolve()), "paper": "Letter",
                         "table_rows": ["seq_len", "precision"]}


def test_report_templates_must_exist(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(MINIMAL_TRAIN + "report: {templates: nowhere}\n", encoding="utf-8")
    got = problems_of(tmp_path / "s.yaml")
    assert got == [f"5:21: report.templates: 'nowhere' is not a folder (looked for {(tmp_path / 'nowhere').resolve()})"]


# ---------------------------------------------------------------------------------------------------------------
# The schema


def test_schema_is_valid_draft_2020_12_and_printed_pretty() -> None:
    jsonschema.Draft202012Validator.check_schema(config_schema.SCHEMA)
    assert config_schema.SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert json.loads(schema_text()) == config_schema.SCHEMA
    assert schema_text().startswith("{\n  ")


def _enum(axis: str) -> list[str]:
    return config_schema.SCHEMA["properties"]["grid"]["properties"][axis]["else"]["enum"]


def test_schema_vocabularies_match_names_py() -> None:
    assert _enum("precision") == list(names.PRECISIONS)
    assert _enum("optimizer") == [*names.OPTIMIZERS, names.OPTIMIZER_NONE]
    assert _enum("optimizer_impl") == [*names.OPTIMIZER_IMPLS, names.OPTIMIZER_NONE]
    assert _enum("checkpointing") == list(names.CHECKPOINTING)
    assert _enum("attention") == list(names.ATTENTION)
    assert _enum("zero_grad") == list(names.ZERO_GRADS)
    assert config_schema.SCHEMA["properties"]["mode"]["enum"] == list(names.MODES)
    # the grid's axes, the optional ones, and the parallel axes (issue 4 names them grid axes; the parallel: block
    # takes them too)
    assert set(config_schema.SCHEMA["properties"]["grid"]["properties"]) == set(
        C.GRID_AXES + C.OPTIONAL_AXES + C.PARALLEL_AXES)
    assert all(config_schema.SCHEMA["properties"]["grid"]["properties"][a]["else"]
               == config_schema.SCHEMA["properties"]["parallel"]["properties"][a]["else"] for a in C.PARALLEL_AXES)
    # table rows: the grid's non-batch axes, the optional ones and the parallel axes (config refuses those without a
    # parallel: block, and an optional one the grid does not name)
    assert config_schema.SCHEMA["properties"]["report"]["properties"]["table_rows"]["items"]["enum"] == list(
        C.NON_BATCH_AXES + C.OPTIONAL_AXES + C.PARALLEL_AXES)


def test_schema_documents_the_defaults_it_applies() -> None:
    props = config_schema.SCHEMA["properties"]
    assert "612 MiB" in props["overheads"]["properties"]["cuda_context"]["description"]
    assert "8519680 B" in props["overheads"]["properties"]["cublas_workspace"]["description"]
    assert "0.05" in props["overheads"]["properties"]["allocator_reserve"]["description"]
    assert "0.05" in props["headroom"]["description"]
    assert scenario.DEFAULT_HEADROOM == scenario.DEFAULT_ALLOCATOR_RESERVE == 0.05


def test_every_shipped_config_also_passes_a_plain_jsonschema_validator() -> None:
    # What an editor does with the $schema line: the raw YAML against the schema file.
    validator = jsonschema.Draft202012Validator(config_schema.SCHEMA)
    for path in SHIPPED:
        assert list(validator.iter_errors(yaml.safe_load(path.read_text(encoding="utf-8")))) == [], path.name


# ---------------------------------------------------------------------------------------------------------------
# Robustness: whatever is written, the loader answers with a ScenarioError or a Scenario, never a traceback

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(allow_nan=True),
                     st.text(max_size=12))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
_paths = st.sampled_from(["name", "mode", "model", "model.preset", "model.params", "grid", "grid.batch",
                          "grid.seq_len", "grid.precision", "grid.optimizer", "grid.cache_tokens", "gpus",
                          "overheads", "overheads.cuda_context", "headroom", "target", "report",
                          "report.table_rows", "report.templates", "extra"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(_paths, _values), min_size=1, max_size=3))
@example(edits=[("report.templates", "\x00")])  # found 2026-11-27: os.path raised ValueError on the NUL
def test_random_edits_never_escape_as_tracebacks(edits) -> None:
    sc = load_edited(MINIMAL_TRAIN, edits)
    if sc is not None:
        assert set(sc.grid) == set(C.GRID_AXES)


@settings(max_examples=60, deadline=None)
@given(batch=st.lists(st.integers(1, 1 << 20), min_size=1, max_size=6), as_scalar=st.booleans())
def test_scalar_and_one_item_list_mean_the_same(batch, as_scalar) -> None:
    written = batch[0] if as_scalar else batch
    sc = parse_scenario_text(MINIMAL_TRAIN.replace("batch: 4", f"batch: {written}"))
    assert sc.grid[C.BATCH] == tuple(dict.fromkeys([written] if as_scalar else batch))


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=80), st.text(alphabet="{}[]:,-&*!<>?|\n #'\"ab01.~%@`\t", max_size=60)))
def test_arbitrary_text_never_escapes_as_a_traceback(text: str) -> None:
    # Tags, anchors, flow and block syntax, control characters: all must end in a located ScenarioError.
    with pytest.raises(ScenarioError) as info:
        parse_scenario_text(text, file="t.yaml")
    assert all(str(p).startswith("t.yaml") for p in info.value.problems)


def test_tagged_top_level_mapping_is_a_located_problem() -> None:
    # Found by the fuzzer: a custom tag on the top-level mapping used to reach the schema stage as None.
    with pytest.raises(ScenarioError) as info:
        parse_scenario_text("!0\n?", file="t.yaml")
    assert [str(p) for p in info.value.problems] == [
        "t.yaml:1:1: tag '!0' is not allowed: scenario files are plain YAML"]


def test_static_cache_problem_names_the_index_as_written() -> None:
    # [0, 0, 100]: the bad value is item 2 as the user wrote it (item 1 after de-duplication). 512 + 1 = 513 tokens.
    with pytest.raises(ScenarioError) as info:
        parse_scenario_text("mode: infer\nmodel: {preset: gpt2}\n"
                            "grid: {batch: 1, seq_len: 512, precision: bf16, cache_tokens: [0, 0, 100]}\n"
                            "gpus: [l4]\n", file="c.yaml")
    assert [str(p) for p in info.value.problems] == [
        "c.yaml:3:70: grid.cache_tokens[2]: a static cache of 100 tokens cannot hold seq_len + decode_tokens = 513 "
        "tokens; use 0 (a dynamic cache) or at least 513"]


def test_bom_and_crlf_files_load_and_hash_the_bytes_on_disk(tmp_path: Path) -> None:
    # Editors on Windows write a UTF-8 byte-order mark and CRLF line ends: both are plain YAML.
    raw = b"\xef\xbb\xbf" + MINIMAL_TRAIN.replace("\n", "\r\n").encode("utf-8")
    (tmp_path / "w.yaml").write_bytes(raw)
    sc = load_scenario(tmp_path / "w.yaml")
    assert sc.grid[C.BATCH] == (4,) and sc.name == "w"
    assert sc.sha256 == hashlib.sha256(raw).hexdigest()
