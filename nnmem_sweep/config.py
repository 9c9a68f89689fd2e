"""Scenario file -> a frozen scenario.Scenario: the entry points (load_scenario, parse_scenario_text, schema_text).

Every problem is collected before anything is raised, each located as `file:line:column: key.path: message`. The
steps, one module each: the YAML read into plain values with the location of every key path (config_yaml.py), the
JSON Schema's errors made readable (config_schema.py), then each block's semantic checks (config_model.py for the
blocks that change the model, config_blocks.py for the rest, both reporting to config_check.Checker); this module
refuses what is not a small YAML text and assembles the Scenario.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from . import columns as C
from .config_blocks import (check_cluster, check_gpus, check_grid, check_node, check_overheads, check_parallel,
                            check_report, check_serving, check_throughput, check_zero_grad)
from .config_model import (check_derived, check_finetune, check_model, check_offloaded_ranks, check_preference,
                           needs_no_sequence)
from .config_check import Checker
from .config_schema import schema_problems, schema_text  # noqa: F401  (schema_text: an entry point of this module)
from .config_yaml import MAX_NODES, Builder, TooBig, compose, mark
from .errors import Problem, ScenarioError
from .scenario import DEFAULT_HEADROOM, DEFAULT_MODE, Scenario
from .units import MiB

# A scenario is a small text file: refuse anything that is clearly something else.
MAX_FILE_BYTES = MiB


def _scenario(data: Any, b: Builder, file: str, base_dir: Path, text: str, digest: str) -> Scenario:
    """Schema, then every block's checks; every problem found raised at once, sorted by where it is written."""
    from_schema = schema_problems(data, b)
    ck = Checker(b, from_schema, base_dir)
    mode = data.get("mode", DEFAULT_MODE) if ck.clean("mode") else DEFAULT_MODE
    grid = check_grid(data, mode, ck)
    gpus = check_gpus(data, ck)
    overheads = check_overheads(data, ck, gpus)
    model = check_model(data, ck)
    if not grid[C.SEQ_LEN] and isinstance(data.get("grid"), dict) and ck.clean("grid"):
        if model is not None and needs_no_sequence(model):
            grid[C.SEQ_LEN] = (1,)
        elif model is not None:
            ck.add("grid", "missing required key 'seq_len' (a transformer or per-token model needs it)", key=True)
    report = check_report(data, grid, ck)
    serving = check_serving(data, mode, model, ck)
    parallel = check_parallel(data, mode, model, grid, ck)
    check_derived(data, mode, model, grid, parallel, ck)
    check_zero_grad(data, grid, parallel, ck)
    node = check_node(data, ck) if (parallel or "cluster" in data) else {}
    model = check_finetune(data, mode, model, parallel, ck)
    model = check_preference(data, mode, model, ck)
    model = check_offloaded_ranks(data, mode, model, parallel, ck)
    cluster = check_cluster(data, mode, model, grid, node, parallel, ck, gpus)
    throughput = check_throughput(data, mode, model, gpus, ck)
    problems = b.problems + from_schema + ck.problems
    if problems:
        raise ScenarioError(sorted(problems, key=lambda p: (p.line or 0, p.column or 0, p.key_path)))
    return Scenario(
        path=file,
        name=data.get("name") or Path(file).stem,
        description=data.get("description", ""),
        model=model,
        mode=mode,
        grid=grid,
        gpus=gpus,
        overheads=overheads,
        headroom=float(data.get("headroom", DEFAULT_HEADROOM)),
        report=report,
        target={k: int(v) for k, v in (data.get("target") or {}).items()},
        source_text=text,
        sha256=digest,
        serving=serving,
        parallel=parallel,
        node=node,
        cluster=cluster,
        throughput=throughput,
    )


# --------------------------------------------------------------------------------------------------------------
# Entry points


def _fail(file: str, message: str, line: int | None = None, col: int | None = None) -> ScenarioError:
    return ScenarioError([Problem(file, line, col, "", message)])


def parse_scenario_text(text: str, file: str = "<text>", base_dir: str | Path = ".") -> Scenario:
    """Validate scenario YAML given as text; relative paths in it are taken from `base_dir`."""
    return _parse(text, file, Path(base_dir), hashlib.sha256(text.encode("utf-8")).hexdigest())


def _parse(text: str, file: str, base_dir: Path, digest: str) -> Scenario:
    data, builder = _document(text, file)
    return _scenario(data, builder, file, base_dir, text, digest)


def _document(text: str, file: str) -> tuple[dict, Builder]:
    """The YAML text as a mapping, within the limits (MAX_NODES, nesting), and the Builder that knows where each key
    is written; ScenarioError where it is not a readable mapping."""
    root, loader = compose(text, file)
    try:
        if root is None:
            raise _fail(file, "the file is empty; a scenario needs at least model, grid and gpus")
        if not isinstance(root, yaml.MappingNode):
            kind = "a list" if isinstance(root, yaml.SequenceNode) else f"the value {root.value!r}"
            line, col = mark(root)
            raise _fail(file, f"the top level must be a mapping of keys (name, model, grid, gpus ...), "
                              f"not {kind}", line, col)
        builder = Builder(file, loader)
        try:
            data = builder.build(root, "")
        except TooBig:
            raise _fail(file, f"the document expands to more than {MAX_NODES:,} values (aliases counted at each "
                              "use); a scenario is small: is this an alias bomb?") from None
        except RecursionError:
            raise _fail(file, "YAML nested too deeply to read") from None
        if not isinstance(data, dict):  # a tagged or otherwise unreadable top-level mapping
            raise ScenarioError(builder.problems)
        return data, builder
    finally:
        loader.dispose()


def load_scenario(path: str | Path) -> Scenario:
    """Read, validate and resolve a scenario file. Raises errors.ScenarioError listing every problem found."""
    text, digest = _read(path)
    return _parse(text, str(path), Path(path).parent, digest)


def read_document(path: str | Path) -> dict:
    """The scenario file's YAML as a mapping, read within the same limits as load_scenario (size, encoding, aliases,
    nesting) but not validated: for a caller that needs one block before the scenario is loaded (measure's
    `runtime:`). Raises ScenarioError."""
    return _document(_read(path)[0], str(path))[0]


def _read(path: str | Path) -> tuple[str, str]:
    """(the file's text, the sha256 of its bytes), refused in one line where it is not a small UTF-8 text file."""
    file = str(path)
    p = Path(path)
    if not p.exists():
        raise _fail(file, "no such file")
    if p.is_dir():
        raise _fail(file, "is a folder, not a scenario file")
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise _fail(file, f"is {size:,} bytes; a scenario file is small YAML text (at most {MAX_FILE_BYTES:,})")
        raw = p.read_bytes()
    except OSError as e:
        raise _fail(file, f"cannot be read: {e.strerror or e}") from None
    if b"\x00" in raw:
        raise _fail(file, "is a binary file (it contains NUL bytes), not YAML text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise _fail(file, f"is not UTF-8 text (byte 0x{raw[e.start]:02x})", line, col) from None
    return text.removeprefix("\ufeff"), hashlib.sha256(raw).hexdigest()
