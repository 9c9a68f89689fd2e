"""Scenario YAML text -> plain Python values, with where every key path is written.

The YAML is read with PyYAML's SafeLoader, composed to a node tree (not constructed), and turned into plain Python
values by `Builder`, which records where every key path sits (`Builder.locate`), refuses duplicate keys and non-plain
tags, and stops alias bombs by counting the nodes it visits (an alias is visited again each time it is used).
`compose` turns a syntax error into one located problem. Key paths are written like "grid.batch[2]"; `join` builds
them and `under` compares them.
"""
from __future__ import annotations

import math
import re
from typing import Any

import yaml

from .errors import Problem, ScenarioError

# Values visited while turning the node tree into Python values, aliases counted at every use. The largest shipped
# config has a few hundred; a "billion laughs" document hits the limit within milliseconds.
MAX_NODES = 100_000
MAX_DEPTH = 64

_T = "tag:yaml.org,2002:"
_PLAIN_SCALAR_TAGS = {_T + t for t in ("str", "int", "float", "bool", "null")}
_TIMESTAMP = _T + "timestamp"  # a bare date: kept as the text written
_MERGE = _T + "merge"
# a number written with an exponent and no dot (2e8, 5E-2), which PyYAML's YAML 1.1 rules read as text
_EXPONENT = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")


class TooBig(Exception):
    """The document expands to more than MAX_NODES values."""


def under(path: str, root: str) -> bool:
    """`path` is `root` or inside it ("grid.batch[2]" is under "grid" and "grid.batch", not under "gri")."""
    return path == root or path.startswith(root + ".") or path.startswith(root + "[")


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _tag(node: yaml.Node) -> str:
    return node.tag.replace(_T, "!!") if node.tag.startswith(_T) else node.tag


def mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


class Builder:
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

    def locate(self, path: str) -> tuple[int, int] | None:
        """Where `path` is written; for a path that is not there (a missing key), its nearest written ancestor."""
        while True:
            if path in self.value_at:
                return self.value_at[path]
            if not path:
                return None
            cut = max(path.rfind("."), path.rfind("["))
            path = path[:cut] if cut > 0 else ""

    def build(self, node: yaml.Node, path: str, stack: tuple[int, ...] = ()) -> Any:
        self.visited += 1
        if self.visited > MAX_NODES:
            raise TooBig
        self.value_at.setdefault(path, mark(node))
        if id(node) in stack:
            self.problem(path, "recursive alias: an anchor that contains itself", mark(node))
            return None
        if len(stack) >= MAX_DEPTH:
            self.problem(path, f"nested more than {MAX_DEPTH} levels deep", mark(node))
            return None
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        if not (node.tag.startswith(_T) and node.tag in (_T + "seq", _T + "map")):
            self.problem(path, f"tag {_tag(node)!r} is not allowed: scenario files are plain YAML", mark(node))
            return None
        inner = stack + (id(node),)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, f"{path}[{i}]", inner) for i, item in enumerate(node.value)]
        return self._mapping(node, path, inner)

    def _scalar(self, node: yaml.ScalarNode, path: str) -> Any:
        if node.tag == _TIMESTAMP:
            return node.value
        if node.tag == _T + "str" and node.style is None and _EXPONENT.fullmatch(node.value):
            value = float(node.value)  # 2e8: YAML 1.2 and JSON read a number (DeepSpeed's configs write them so)
            return int(value) if value.is_integer() and abs(value) < 2**63 else value
        if node.tag not in _PLAIN_SCALAR_TAGS:
            self.problem(path, f"tag {_tag(node)!r} is not allowed: scenario files are plain YAML", mark(node))
            return None
        try:
            value = self.loader.construct_object(node)
        except (ValueError, KeyError, yaml.YAMLError):  # e.g. "!!int abc", "!!bool maybe"
            self.problem(path, f"{node.value!r} cannot be read as {_tag(node)}", mark(node))
            return None
        if isinstance(value, float) and not math.isfinite(value):
            self.problem(path, f"{node.value!r} is not a finite number", mark(node))
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
                            raise TooBig
                        merged += [(k, v, True) for k, v, _ in inner]
                    else:
                        self.problem(path, "'<<' must merge another mapping", mark(src), value_is_bad=False)
            else:
                explicit.append((key, value, False))
        return explicit + merged

    def _mapping(self, node: yaml.MappingNode, path: str, stack: tuple[int, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node, merged in self._pairs(node, stack, path):
            self.visited += 1
            if self.visited > MAX_NODES:
                raise TooBig
            at = mark(key_node)
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
            child = join(path, key)
            if key in out:
                if not merged:
                    self.problem(child, f"duplicate key {key!r} (first at line {first_line[key]})", at,
                                 value_is_bad=False)
                continue
            first_line[key] = at[0]
            self.key_at[child] = at
            out[key] = self.build(value_node, child, stack)
        return out


def compose(text: str, file: str) -> tuple[yaml.Node | None, yaml.SafeLoader]:
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
