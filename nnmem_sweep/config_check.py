"""The checker every block's semantic checks (config_blocks.py) report their problems to, and the helpers they share.

`Checker.add(path, message)` records a problem at a key path, located as `file:line:column`; `Checker.clean(path)`
says whether anything at, inside or above that path was already reported (by the builder, the schema or an
earlier check), so that one mistake is reported once. `as_list` and `dedupe` read a value that may be one item or
a list.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .config_schema import MISSING
from .config_yaml import Builder, under
from .errors import Problem


class Checker:
    """Collects the semantic problems of one scenario file (see the module docstring)."""

    def __init__(self, b: Builder, schema_problems: list[Problem], base_dir: Path):
        self.b = b
        self.problems: list[Problem] = []
        # A missing key does not make the rest of its mapping unreadable: check what is there.
        self.dirty = {p.key_path for p in schema_problems if not p.message.startswith(MISSING)} | b.bad
        self.base_dir = base_dir

    def clean(self, path: str) -> bool:
        """No problem reported at `path`, inside it, or at one of its ancestors."""
        return not any(under(d, path) or (d and under(path, d)) for d in self.dirty)

    def add(self, path: str, message: str, key: bool = False) -> None:
        at = (self.b.key_at.get(path) if key else None) or self.b.locate(path)
        self.problems.append(Problem(self.b.file, at[0] if at else None, at[1] if at else None, path, message))
        if not message.startswith(MISSING):
            self.dirty.add(path)


def as_list(value: Any) -> list[Any]:
    """A value the schema allows as one item or a list, as a list."""
    return value if isinstance(value, list) else [value]


def dedupe(values: list[Any]) -> tuple[Any, ...]:
    """The values in their order without repeats (2.0 counts as 2)."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if v not in out:
            out.append(v)
    return tuple(out)
