"""The scenario JSON Schema (schema/scenario.schema.json, draft 2020-12) and its errors as located, readable problems
("unknown key 'batchsize' (did you mean 'batch'?)", "must be at least 1, got 0"), each at the key path the builder
recorded (config_yaml.py)."""
from __future__ import annotations

import difflib
import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from .config_yaml import Builder, join, under
from .errors import Problem
from .units import parse_size

SCHEMA_PATH = Path(__file__).parent / "schema" / "scenario.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def schema_text() -> str:
    """The JSON Schema (draft 2020-12), pretty-printed, as `nnmem-sweep schema` prints it."""
    return json.dumps(SCHEMA, indent=2, ensure_ascii=False) + "\n"


@cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(SCHEMA)


MISSING = "missing required key"  # a problem that leaves the rest of its mapping worth checking
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
    if isinstance(value, float) and value.is_integer() and 1e4 <= abs(value) < 2**53:  # YAML's 2.0e+9, exactly
        return f"{int(value):,}"
    return f"{value:,}" if isinstance(value, int) else repr(value)


def _did_you_mean(word: Any, options: list[str]) -> str:
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _either(words) -> str:
    """'a', 'a or b', 'a, b or c'."""
    words = list(words)
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _path_of(parts) -> str:
    out = ""
    for p in parts:
        out = f"{out}[{p}]" if isinstance(p, int) else join(out, str(p))
    return out


def schema_problems(data: Any, b: Builder) -> list[Problem]:
    """Every schema error in `data`, located; none under a path the builder already reported."""
    found: list[Problem] = []

    def add(path: str, message: str, key: bool = False) -> None:
        at = (b.key_at.get(path) if key else None) or b.locate(path)
        problem = Problem(b.file, at[0] if at else None, at[1] if at else None, path, message)
        if problem not in found:  # jsonschema yields one `required` error per missing key, each with the full list
            found.append(problem)

    def report(err) -> None:  # noqa: ANN001 - a jsonschema ValidationError
        path = _path_of(err.absolute_path)
        if any(under(path, bad) for bad in b.bad if bad):
            return  # the builder already said what is wrong here
        kind, want, inst = err.validator, err.validator_value, err.instance
        if kind == "additionalProperties":
            allowed = sorted(err.schema.get("properties", {}))
            for extra in [k for k in inst if k not in allowed]:
                hint = _did_you_mean(extra, allowed) or f" (allowed: {', '.join(allowed)})"
                add(join(path, extra), f"unknown key {extra!r}{hint}", key=True)
        elif kind == "required":
            for missing in [k for k in want if k not in inst]:
                add(path, f"{MISSING} {missing!r}", key=True)
        elif kind in ("anyOf", "oneOf") and all(set(branch) == {"required"} for branch in want):
            if not isinstance(inst, dict):
                return  # not a mapping: its `type` error says so
            keys = [k for branch in want for k in branch["required"]]  # one key of these, exactly
            given = [k for k in keys if k in inst]
            if given:
                add(path, f"give only one of {_either(map(repr, keys))} (given: {', '.join(map(repr, given))})")
            else:
                add(path, f"needs one of {_either(map(repr, keys))}", key=True)  # not MISSING: nothing to check
        elif kind in ("anyOf", "oneOf"):
            # the branch of the value's own type says what is wrong inside it; else which types the key takes
            typed = [i for i, branch in enumerate(want)
                     if "type" in branch and _validator().is_type(inst, branch["type"])]
            if len(typed) == 1 and err.context:
                for sub in sorted(err.context, key=lambda e: (list(map(str, e.absolute_path)), e.message)):
                    if sub.relative_schema_path[0] == typed[0]:
                        report(sub)
            else:
                words = [repr(branch["const"]) if "const" in branch else _TYPE_WORDS[branch["type"]]
                         for branch in want]
                add(path, f"expected {_either(words)}, got {_show(inst)}")
        elif kind == "type":
            wanted = [want] if isinstance(want, str) else want
            add(path, f"expected {' or '.join(_TYPE_WORDS[w] for w in wanted)}, got {_show(inst)}")
        elif kind == "enum":
            # a value the schema knows of and does not model says why (the schema's own "x-not-modelled" words)
            why = err.schema.get("x-not-modelled", {}).get(str(inst).lower())
            hint = f"; {why}" if why else _did_you_mean(inst, want)
            add(path, f"{_show(inst)} is not one of: {', '.join(map(str, want))}{hint}")
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

    for err in sorted(_validator().iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.message)):
        report(err)
    return found
