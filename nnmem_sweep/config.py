"""Scenario YAML -> JSON Schema validation -> semantic checks -> a frozen scenario.Scenario.

Every problem is collected before anything is raised, each located as `file:line:column: key.path: message`.
The YAML is read with PyYAML's SafeLoader, composed to a node tree (not constructed), and turned into plain
Python values by `_Builder`, which records where every key path sits, refuses duplicate keys and non-plain tags,
and stops alias bombs by counting the nodes it visits (an alias is visited again each time it is used).

What lives where: this module holds the YAML reader (_Builder), the schema errors made readable, the checker
(_Checker) and the checks of the core blocks (grid, gpus, overheads, model, report), the defaults other modules
import and the entry points (load_scenario, parse_scenario_text, schema_text). The blocks that came with
parallelism and serving (serving, parallel, node, finetune, cluster) are checked in config_blocks.py.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

from . import columns as C
from .catalog import names
from .catalog.gpus import get_gpu, unknown_gpu_message
from .errors import Problem, ScenarioError
from .paths import safe_stem
from .scenario import (DEFAULT_ALLOCATOR_RESERVE, DEFAULT_CUBLAS_WORKSPACE, DEFAULT_CUDA_CONTEXT, DEFAULT_HEADROOM,
                       DEFAULT_MODE, GPUSpec, Overheads, Scenario)
from .units import MiB, parse_size

SCHEMA_PATH = Path(__file__).parent / "schema" / "scenario.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))

# A scenario is a small text file: refuse anything that is clearly something else.
MAX_FILE_BYTES = MiB
# Values visited while turning the node tree into Python values, aliases counted at every use. The largest shipped
# config has a few hundred; a "billion laughs" document hits the limit within milliseconds.
MAX_NODES = 100_000
MAX_DEPTH = 64

# Axis defaults per mode. None: the axis must be given.
AXIS_DEFAULTS: dict[str, dict[str, Any]] = {
    "train": {
        C.BATCH: None, C.SEQ_LEN: None, C.PRECISION: None, C.OPTIMIZER: None,
        C.OPTIMIZER_IMPL: "foreach", C.CHECKPOINTING: "none", C.ATTENTION: "flash",
        C.CACHE_TOKENS: 0, C.DECODE_TOKENS: 0,
    },
    "infer": {
        C.BATCH: None, C.SEQ_LEN: None, C.PRECISION: None, C.OPTIMIZER: names.OPTIMIZER_NONE,
        C.OPTIMIZER_IMPL: names.OPTIMIZER_NONE, C.CHECKPOINTING: "none", C.ATTENTION: "flash",
        C.CACHE_TOKENS: 0, C.DECODE_TOKENS: 1,
    },
}

_T = "tag:yaml.org,2002:"
_PLAIN_SCALAR_TAGS = {_T + t for t in ("str", "int", "float", "bool", "null")}
_TIMESTAMP = _T + "timestamp"  # a bare date: kept as the text written
_MERGE = _T + "merge"


def schema_text() -> str:
    """The JSON Schema (draft 2020-12), pretty-printed, as `nnmem-sweep schema` prints it."""
    return json.dumps(SCHEMA, indent=2, ensure_ascii=False) + "\n"


@cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(SCHEMA)


# --------------------------------------------------------------------------------------------------------------
# YAML text -> Python values with a location for every key path


class _TooBig(Exception):
    pass


def _under(path: str, root: str) -> bool:
    """`path` is `root` or inside it ("grid.batch[2]" is under "grid" and "grid.batch", not under "gri")."""
    return path == root or path.startswith(root + ".") or path.startswith(root + "[")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _tag(node: yaml.Node) -> str:
    return node.tag.replace(_T, "!!") if node.tag.startswith(_T) else node.tag


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


class _Builder:
    """Turns a composed node tree into dicts, lists and scalars, recording locations and problems."""

    def __init__(self, file: str, loader: yaml.SafeLoader):
        self.file = file
        self.loader = loader
        self.problems: list[Problem] = []
        self.value_at: dict[str, tuple[int, int]] = {}  # key path -> (line, col) of its value
        self.key_at: dict[str, tuple[int, int]] = {}  # key path -> (line, col) of the key itself
        self.bad: set[str] = set()  # paths already reported (the schema need not repeat them)
        self.visited = 0

    def problem(self, path: str, message: str, at: tuple[int, int] | None, value_is_bad: bool = True) -> None:
        line, col = at if at else (None, None)
        self.problems.append(Problem(self.file, line, col, path, message))
        if value_is_bad:  # a bad key in a mapping leaves the rest of the mapping worth checking
            self.bad.add(path)

    def build(self, node: yaml.Node, path: str, stack: tuple[int, ...] = ()) -> Any:
        self.visited += 1
        if self.visited > MAX_NODES:
            raise _TooBig
        self.value_at.setdefault(path, _mark(node))
        if id(node) in stack:
            self.problem(path, "recursive alias: an anchor that contains itself", _mark(node))
            return None
        if len(stack) >= MAX_DEPTH:
            self.problem(path, f"nested more than {MAX_DEPTH} levels deep", _mark(node))
            return None
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        if not (node.tag.startswith(_T) and node.tag in (_T + "seq", _T + "map")):
            self.problem(path, f"tag {_tag(node)!r} is not allowed: scenario files are plain YAML", _mark(node))
            return None
        inner = stack + (id(node),)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, f"{path}[{i}]", inner) for i, item in enumerate(node.value)]
        return self._mapping(node, path, inner)

    def _scalar(self, node: yaml.ScalarNode, path: str) -> Any:
        if node.tag == _TIMESTAMP:
            return node.value
        if node.tag not in _PLAIN_SCALAR_TAGS:
            self.problem(path, f"tag {_tag(node)!r} is not allowed: scenario files are plain YAML", _mark(node))
            return None
        try:
            value = self.loader.construct_object(node)
        except (ValueError, KeyError, yaml.YAMLError):  # e.g. "!!int abc", "!!bool maybe"
            self.problem(path, f"{node.value!r} cannot be read as {_tag(node)}", _mark(node))
            return None
        if isinstance(value, float) and not math.isfinite(value):
            self.problem(path, f"{node.value!r} is not a finite number", _mark(node))
        return value

    def _pairs(self, node: yaml.MappingNode, stack: tuple[int, ...],
               path: str = "") -> list[tuple[yaml.Node, yaml.Node, bool]]:
        """(key, value, merged) pairs; `<<: *anchor` merge keys expanded after the explicit keys."""
        explicit, merged = [], []
        for key, value in node.value:
            if key.tag == _MERGE:
                sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
                for src in sources:
                    if isinstance(src, yaml.MappingNode) and id(src) not in stack:
                        inner = self._pairs(src, stack + (id(src),), path)
                        self.visited += len(inner)  # merges can nest aliases too: count what they expand to
                        if self.visited > MAX_NODES:
                            raise _TooBig
                        merged += [(k, v, True) for k, v, _ in inner]
                    else:
                        self.problem(path, "'<<' must merge another mapping", _mark(src), value_is_bad=False)
            else:
                explicit.append((key, value, False))
        return explicit + merged

    def _mapping(self, node: yaml.MappingNode, path: str, stack: tuple[int, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node, merged in self._pairs(node, stack, path):
            self.visited += 1
            if self.visited > MAX_NODES:
                raise _TooBig
            at = _mark(key_node)
            key = None
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag in _PLAIN_SCALAR_TAGS:
                try:
                    key = self.loader.construct_object(key_node)
                except (ValueError, KeyError, yaml.YAMLError):
                    key = None
            if not isinstance(key, str):
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag not in _PLAIN_SCALAR_TAGS | {_TIMESTAMP}:
                    message = f"a key tagged {_tag(key_node)!r} is not allowed: scenario files are plain YAML"
                elif isinstance(key_node, yaml.ScalarNode):
                    message = f"key {key_node.value!r} must be a string (quote it)"
                else:
                    message = "a key must be a string, not a collection"
                self.problem(path, message, at, value_is_bad=False)
                continue
            child = _join(path, key)
            if key in out:
                if not merged:
                    self.problem(child, f"duplicate key {key!r} (first at line {first_line[key]})", at,
                                 value_is_bad=False)
                continue
            first_line[key] = at[0]
            self.key_at[child] = at
            out[key] = self.build(value_node, child, stack)
        return out


def _compose(text: str, file: str) -> tuple[yaml.Node | None, yaml.SafeLoader]:
    try:
        loader = yaml.SafeLoader(text)  # the reader checks for non-printable characters here
        return loader.get_single_node(), loader
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        what = e.problem or e.context or "unreadable"
        if e.problem and e.context and not e.context.startswith("while"):
            what = f"{e.context}, {e.problem}"  # "expected a single document in the stream, but found another ..."
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        raise ScenarioError([Problem(file, line, col, "", f"YAML syntax error: {what}")]) from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        col = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        code = e.character if isinstance(e.character, int) else ord(e.character)
        msg = f"character U+{code:04X} is not allowed in YAML text"
        raise ScenarioError([Problem(file, line, col, "", msg)]) from None
    except yaml.YAMLError as e:  # pragma: no cover - every PyYAML error above carries a mark or a position
        raise ScenarioError([Problem(file, None, None, "", f"YAML error: {e}")]) from None
    except RecursionError:
        raise ScenarioError([Problem(file, None, None, "", "YAML nested too deeply to read")]) from None


# --------------------------------------------------------------------------------------------------------------
# Schema errors -> located, readable problems

_MISSING = "missing required key"
_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "object": "a mapping",
               "array": "a list", "boolean": "true or false", "null": "null"}


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "nothing (null)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {value!r}"
    return f"{value:,}" if isinstance(value, int) else repr(value)


def _did_you_mean(word: Any, options: list[str]) -> str:
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _path_of(parts) -> str:
    out = ""
    for p in parts:
        out = f"{out}[{p}]" if isinstance(p, int) else _join(out, str(p))
    return out


def _schema_problems(data: Any, b: _Builder) -> list[Problem]:
    found: list[Problem] = []

    def add(path: str, message: str, key: bool = False) -> None:
        at = (b.key_at.get(path) if key else None) or _locate(path, b)
        problem = Problem(b.file, at[0] if at else None, at[1] if at else None, path, message)
        if problem not in found:  # jsonschema yields one `required` error per missing key, each with the full list
            found.append(problem)

    for err in sorted(_validator().iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.message)):
        path = _path_of(err.absolute_path)
        if any(_under(path, bad) for bad in b.bad if bad):
            continue  # the builder already said what is wrong here
        kind, want, inst = err.validator, err.validator_value, err.instance
        if kind == "additionalProperties":
            allowed = sorted(err.schema.get("properties", {}))
            for extra in [k for k in inst if k not in allowed]:
                hint = _did_you_mean(extra, allowed) or f" (allowed: {', '.join(allowed)})"
                add(_join(path, extra), f"unknown key {extra!r}{hint}", key=True)
        elif kind == "required":
            for missing in [k for k in want if k not in inst]:
                add(path, f"{_MISSING} {missing!r}", key=True)
        elif kind == "type":
            wanted = [want] if isinstance(want, str) else want
            add(path, f"expected {' or '.join(_TYPE_WORDS[w] for w in wanted)}, got {_show(inst)}")
        elif kind == "enum":
            add(path, f"{_show(inst)} is not one of: {', '.join(map(str, want))}{_did_you_mean(inst, want)}")
        elif kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            words = {"minimum": "at least", "maximum": "at most",
                     "exclusiveMinimum": "more than", "exclusiveMaximum": "less than"}[kind]
            add(path, f"must be {words} {want:,}, got {_show(inst)}")
        elif kind in ("minItems", "minLength", "minProperties"):
            add(path, "must not be empty" if want == 1 else f"needs at least {want} items")
        elif kind == "uniqueItems":
            add(path, "lists the same value twice")
        elif kind == "pattern" and "GiB" in want:
            try:
                parse_size(inst)
                add(path, f"{inst!r} is not a size such as '80 GiB'")  # pragma: no cover - regex and parser agree
            except ValueError as e:
                add(path, str(e))
        else:  # pragma: no cover - every keyword the schema uses is handled above
            add(path, err.message)
    return found


def _locate(path: str, b: _Builder) -> tuple[int, int] | None:
    """Where `path` is written; for a path that is not there (a missing key), its nearest written ancestor."""
    while True:
        if path in b.value_at:
            return b.value_at[path]
        if not path:
            return None
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""


# --------------------------------------------------------------------------------------------------------------
# Semantic checks and the Scenario


class _Checker:
    def __init__(self, b: _Builder, schema_problems: list[Problem], base_dir: Path):
        self.b = b
        self.problems: list[Problem] = []
        # A missing key does not make the rest of its mapping unreadable: check what is there.
        self.dirty = {p.key_path for p in schema_problems if not p.message.startswith(_MISSING)} | b.bad
        self.base_dir = base_dir

    def clean(self, path: str) -> bool:
        """No problem reported at `path`, inside it, or at one of its ancestors."""
        return not any(_under(d, path) or (d and _under(path, d)) for d in self.dirty)

    def add(self, path: str, message: str, key: bool = False) -> None:
        at = (self.b.key_at.get(path) if key else None) or _locate(path, self.b)
        self.problems.append(Problem(self.b.file, at[0] if at else None, at[1] if at else None, path, message))
        if not message.startswith(_MISSING):
            self.dirty.add(path)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _dedupe(values: list[Any]) -> tuple[Any, ...]:
    out: list[Any] = []
    for v in values:
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if v not in out:
            out.append(v)
    return tuple(out)


def _grid(data: dict, mode: str, ck: _Checker) -> dict[str, tuple[Any, ...]]:
    grid = data.get("grid") if isinstance(data.get("grid"), dict) else {}
    out: dict[str, tuple[Any, ...]] = {}
    for axis in C.GRID_AXES:
        path = f"grid.{axis}"
        if axis in grid:
            values = _as_list(grid[axis])
            item = (lambda i: f"{path}[{i}]") if isinstance(grid[axis], list) else (lambda i: path)
        else:
            default = AXIS_DEFAULTS[mode][axis]
            if default is None:
                if axis == C.OPTIMIZER and "grid" in data and ck.clean("grid"):
                    ck.add("grid", "missing required key 'optimizer' (train mode needs one)", key=True)
                out[axis] = ()
                continue
            values, item = [default], (lambda i: path)
        if not ck.clean(path):
            out[axis] = _dedupe(values)
            continue
        for i, v in enumerate(values):
            where = item(i)
            if axis == C.PRECISION and mode == "train" and v in names.INFER_ONLY_PRECISIONS:
                ck.add(where, f"precision {v!r} stores quantised weights, which this tool models for infer mode "
                              "only; set mode: infer or use one of "
                              f"{', '.join(p for p in names.PRECISIONS if p not in names.INFER_ONLY_PRECISIONS)}")
            elif axis in (C.OPTIMIZER, C.OPTIMIZER_IMPL) and mode == "train" and v == names.OPTIMIZER_NONE:
                ck.add(where, f"{axis} 'none' is for infer mode only")
            elif axis in (C.OPTIMIZER, C.OPTIMIZER_IMPL) and mode == "infer" and v != names.OPTIMIZER_NONE:
                ck.add(where, f"{axis} {v!r} applies to train mode only (this scenario has mode: infer)")
            elif axis == C.CHECKPOINTING and mode == "infer" and v != "none":
                ck.add(where, f"checkpointing {v!r} applies to train mode only (this scenario has mode: infer)")
            elif axis in (C.CACHE_TOKENS, C.DECODE_TOKENS) and mode == "train" and v != 0:
                ck.add(where, f"{axis} applies to infer mode only (this scenario has mode: train)")
        out[axis] = _dedupe(values)
    if mode == "infer" and all(ck.clean(f"grid.{a}") for a in (C.SEQ_LEN, C.DECODE_TOKENS, C.CACHE_TOKENS)):
        need = max(out[C.SEQ_LEN], default=0) + max(out[C.DECODE_TOKENS], default=0)
        for i, tokens in enumerate(_as_list(grid.get(C.CACHE_TOKENS, 0))):  # as written, so [i] is the user's
            if 0 < tokens < need:
                where = f"grid.{C.CACHE_TOKENS}" + (f"[{i}]" if isinstance(grid.get(C.CACHE_TOKENS), list) else "")
                ck.add(where, f"a static cache of {tokens:,} tokens cannot hold seq_len + decode_tokens = "
                              f"{need:,} tokens; use 0 (a dynamic cache) or at least {need:,}")
    return out


def _gpus(data: dict, ck: _Checker) -> tuple[GPUSpec, ...]:
    out: list[GPUSpec] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(data.get("gpus") or [] if isinstance(data.get("gpus"), list) else []):
        path = f"gpus[{i}]"
        if not ck.clean(path):
            continue
        spec: GPUSpec | None = None
        gpu_id = entry if isinstance(entry, str) else entry.get("id")
        if gpu_id is not None:
            try:
                spec = get_gpu(gpu_id)
            except ValueError:
                ck.add(path if isinstance(entry, str) else f"{path}.id", unknown_gpu_message(gpu_id))
                continue
        elif "name" not in entry:
            continue  # reported by the schema as a missing key
        elif "memory" not in entry:  # {name: h100-sxm, price_usd: ...}: a catalog GPU named by its id
            try:
                spec = get_gpu(entry["name"])
            except ValueError:
                ck.add(f"{path}.name", unknown_gpu_message(entry["name"]) + "; or give memory: for a GPU not in "
                                                                             "the catalog")
                continue
        else:
            try:
                memory = parse_size(entry["memory"])
            except ValueError as e:
                ck.add(f"{path}.memory", str(e))
                continue
            if memory == 0:
                ck.add(f"{path}.memory", "must be more than 0 bytes")
                continue
            spec = GPUSpec(id=safe_stem(entry["name"]).lower(), name=entry["name"], memory_bytes=memory,
                           source="given in the scenario")
        if isinstance(entry, dict):
            spec = dataclasses.replace(spec, price_usd=entry.get("price_usd"),
                                       price_usd_per_hour=entry.get("price_usd_per_hour"))
        if spec.id in seen:
            ck.add(path, f"GPU {spec.id!r} is listed twice (also gpus[{seen[spec.id]}])")
            continue
        seen[spec.id] = i
        out.append(spec)
    return tuple(out)


def _overheads(data: dict, ck: _Checker) -> Overheads:
    given = data.get("overheads") if isinstance(data.get("overheads"), dict) else {}
    sizes = {}
    for key, default in (("cuda_context", DEFAULT_CUDA_CONTEXT), ("cublas_workspace", DEFAULT_CUBLAS_WORKSPACE)):
        path = f"overheads.{key}"
        sizes[key] = parse_size(default)
        if key in given and ck.clean(path):
            try:
                sizes[key] = parse_size(given[key])
            except ValueError as e:
                ck.add(path, str(e))
    reserve = given.get("allocator_reserve", DEFAULT_ALLOCATOR_RESERVE)
    return Overheads(cuda_context_bytes=sizes["cuda_context"], cublas_workspace_bytes=sizes["cublas_workspace"],
                     allocator_reserve_fraction=float(reserve) if ck.clean("overheads.allocator_reserve") else 0.0)


def _model(data: dict, ck: _Checker):
    spec = data.get("model")
    if not isinstance(spec, dict) or not ck.clean("model"):
        return None
    from .models.resolve import ModelSpecError, resolve_model

    try:
        return resolve_model(spec, ck.base_dir)
    except ModelSpecError as e:
        key = e.key_path or "model"
        ck.add(key if key == "model" or key.startswith(("model.", "model[")) else _join("model", key),
               getattr(e, "message", str(e)))
    except ValueError as e:
        ck.add("model", str(e))
    return None


def _needs_no_sequence(model) -> bool:
    """Layer-list nets and per-sample params models have no sequence axis: seq_len defaults to 1."""
    return model.kind == "layers" or (model.kind == "params" and not model.activation_elements_per_token)


def _report(data: dict, grid: dict[str, tuple[Any, ...]], ck: _Checker) -> dict[str, Any]:
    report = dict(data.get("report") or {}) if isinstance(data.get("report"), dict) else {}
    # The report draws these points from the results: every axis but batch must be a value the grid has.
    wanted = [("report.reference_seq_len", C.SEQ_LEN, report.get("reference_seq_len"))]
    for i, point in enumerate(report.get("reference_points") or []):
        if isinstance(point, dict):
            wanted += [(f"report.reference_points[{i}].{a}", a, v) for a, v in point.items() if a != C.BATCH]
    for path, axis, value in wanted:
        if value is not None and grid.get(axis) and ck.clean(path) and value not in grid[axis]:
            shown = ", ".join(map(str, grid[axis]))
            ck.add(path, f"{value!r} is not in grid.{axis} ({shown})")
    # parallel axes are rows of the tables only where the scenario has a parallel: block (else they do not exist)
    rows = report.get("table_rows")
    if isinstance(rows, list) and ck.clean("report.table_rows") and not isinstance(data.get("parallel"), dict):
        for i, axis in enumerate(rows):
            if axis in C.PARALLEL_AXES:
                ck.add(f"report.table_rows[{i}]", f"{axis} is a parallel axis, but this scenario has no parallel: "
                                                  f"block; add one (parallel: {{{axis}: [...]}}) or use a grid axis")
    if "templates" in report and ck.clean("report.templates"):
        folder = (ck.base_dir / report["templates"]).resolve()
        if not folder.is_dir():
            ck.add("report.templates", f"{report['templates']!r} is not a folder (looked for {folder})")
        report["templates"] = str(folder)
    return report


def _scenario(data: Any, b: _Builder, file: str, base_dir: Path, text: str, digest: str) -> Scenario:
    schema_problems = _schema_problems(data, b)
    ck = _Checker(b, schema_problems, base_dir)
    mode = data.get("mode", DEFAULT_MODE) if ck.clean("mode") else DEFAULT_MODE
    grid = _grid(data, mode, ck)
    gpus = _gpus(data, ck)
    overheads = _overheads(data, ck)
    model = _model(data, ck)
    if not grid[C.SEQ_LEN] and isinstance(data.get("grid"), dict) and ck.clean("grid"):
        if model is not None and _needs_no_sequence(model):
            grid[C.SEQ_LEN] = (1,)
        elif model is not None:
            ck.add("grid", "missing required key 'seq_len' (a transformer or per-token model needs it)", key=True)
    report = _report(data, grid, ck)
    from .config_blocks import _cluster, _finetune, _node, _parallel, _serving  # that module imports this one

    serving = _serving(data, mode, model, ck)
    parallel = _parallel(data, mode, model, grid, ck)
    node = _node(data, ck) if (parallel or "cluster" in data) else {}
    model = _finetune(data, mode, model, parallel, ck)
    cluster = _cluster(data, mode, model, grid, node, parallel, ck)
    problems = b.problems + schema_problems + ck.problems
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
    )


# --------------------------------------------------------------------------------------------------------------
# Entry points


def _fail(file: str, message: str, line: int | None = None, col: int | None = None) -> ScenarioError:
    return ScenarioError([Problem(file, line, col, "", message)])


def parse_scenario_text(text: str, file: str = "<text>", base_dir: str | Path = ".") -> Scenario:
    """Validate scenario YAML given as text; relative paths in it are taken from `base_dir`."""
    return _parse(text, file, Path(base_dir), hashlib.sha256(text.encode("utf-8")).hexdigest())


def _parse(text: str, file: str, base_dir: Path, digest: str) -> Scenario:
    root, loader = _compose(text, file)
    try:
        if root is None:
            raise _fail(file, "the file is empty; a scenario needs at least model, grid and gpus")
        if not isinstance(root, yaml.MappingNode):
            kind = "a list" if isinstance(root, yaml.SequenceNode) else f"the value {root.value!r}"
            line, col = _mark(root)
            raise _fail(file, f"the top level must be a mapping of keys (name, model, grid, gpus ...), "
                              f"not {kind}", line, col)
        builder = _Builder(file, loader)
        try:
            data = builder.build(root, "")
        except _TooBig:
            raise _fail(file, f"the document expands to more than {MAX_NODES:,} values (aliases counted at each "
                              "use); a scenario is small: is this an alias bomb?") from None
        except RecursionError:
            raise _fail(file, "YAML nested too deeply to read") from None
        if not isinstance(data, dict):  # a tagged or otherwise unreadable top-level mapping
            raise ScenarioError(builder.problems)
        return _scenario(data, builder, file, base_dir, text, digest)
    finally:
        loader.dispose()


def load_scenario(path: str | Path) -> Scenario:
    """Read, validate and resolve a scenario file. Raises errors.ScenarioError listing every problem found."""
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
    return _parse(text.removeprefix("\ufeff"), file, p.parent, hashlib.sha256(raw).hexdigest())
