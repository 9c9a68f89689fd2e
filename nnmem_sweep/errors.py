"""Errors a user can act on. The CLI prints them as one line each and exits 2; never a traceback."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input file, located as precisely as the input allows."""

    file: str
    line: int | None  # 1-based
    column: int | None  # 1-based
    key_path: str  # dotted, e.g. "grid.batch[2]"; "" for the whole document
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        key = f" {self.key_path}:" if self.key_path else ""
        return f"{where}:{key} {self.message}"


class NnmemError(Exception):
    """Base for errors that end in a clean one-line message and exit code 2."""


class ScenarioError(NnmemError):
    """A scenario (or a file it names) is invalid. Carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class UsageError(NnmemError):
    """A bad command-line value (unknown preset, GPU, precision ...)."""
