"""Sources and formulas as data, so the report's "Formulas and sources" section is generated from the code.

Usage, next to the code that implements a formula:

    KWON_2023 = source("kwon2023", "Kwon et al. 2023, Efficient Memory Management for LLM Serving with
                       PagedAttention (vLLM)", "arXiv:2309.06180")

    @formula("kv_cache_bytes", "2 · b · s · L · kv_heads · head_dim · bytes", KWON_2023, where="§3")
    def kv_cache_bytes(...): ...

The registry is filled from below: every module that implements a formula imports this one, never the other way
round; formulas.py imports every such module for the report's complete list.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


@dataclass(frozen=True)
class Source:
    key: str
    title: str
    ref: str  # arXiv id, URL or file path in a public repository


@dataclass(frozen=True)
class Formula:
    name: str  # what it returns, e.g. "kv_cache_bytes"
    expression: str  # in the source's symbols
    sources: tuple[Source, ...]
    where: str  # section / table / equation in the source
    module: str  # where it is implemented
    note: str = ""


SOURCES: dict[str, Source] = {}
FORMULAS: dict[str, Formula] = {}


def source(key: str, title: str, ref: str) -> Source:
    src = Source(key, title, ref)
    existing = SOURCES.get(key)
    if existing is not None and existing != src:
        raise ValueError(f"source {key!r} registered twice with different text")
    SOURCES[key] = src
    return src


def formula(name: str, expression: str, *sources: Source, where: str = "", note: str = "") -> Callable[[F], F]:
    """Decorator: register the decorated function as implementing `expression` from `sources`."""

    def register(fn: F) -> F:
        FORMULAS[name] = Formula(name, expression, tuple(sources), where, fn.__module__, note)
        return fn

    return register


def all_formulas() -> list[Formula]:
    """Every formula registered so far, sorted by name: those of the modules imported (formulas.py imports every
    module that registers one)."""
    return sorted(FORMULAS.values(), key=lambda f: f.name)
