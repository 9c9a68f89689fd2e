"""Byte terms that are affine in batch: const + s · pos + s² · sq + b · (seq + s · tok + s² · s2), over whole columns.

Every memory term of a step is of this shape (weights and state are `const`; activations scale with tokens b·s and
eager attention with b·s²; what the whole batch shares scales with s or s², such as RoPE tables or an s × s mask),
so a phase total is affine in batch and fit.py can solve for the largest batch in closed form. Terms are plain
integers (bytes), so evaluation in int64 is exact. The six coefficients, in COEFFICIENTS order, are those of the
polynomial in {1, s, b, b·s, b·s², s²} the plans evaluate (components/plan.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INDEX = 8  # int64 token ids / labels
STAT = 4  # fp32 per-token statistics (LayerNorm mean/rstd, RMSNorm rsqrt, log-sum-exp)


@dataclass(frozen=True)
class Term:
    const: int = 0  # bytes independent of batch and sequence (weights, state)
    pos: int = 0  # bytes per position, shared by the batch (RoPE cos/sin tables)
    seq: int = 0  # bytes per sequence (per sample), independent of s
    tok: int = 0  # bytes per token (b·s)
    s2: int = 0  # bytes per token per token of context (b·s²): materialised attention scores
    sq: int = 0  # bytes per s², independent of the batch: an s × s attention mask shared by the whole batch

    def coefficients(self) -> tuple[int, ...]:
        """The coefficients in COEFFICIENTS order (the plans' coefficient arrays, components/plan.py)."""
        return tuple(getattr(self, name) for name in COEFFICIENTS)

    def __add__(self, other: "Term") -> "Term":
        return Term(self.const + other.const, self.pos + other.pos, self.seq + other.seq, self.tok + other.tok,
                    self.s2 + other.s2, self.sq + other.sq)

    def __sub__(self, other: "Term") -> "Term":
        return self + other * -1

    def __mul__(self, k: int) -> "Term":
        return Term(self.const * k, self.pos * k, self.seq * k, self.tok * k, self.s2 * k, self.sq * k)

    __rmul__ = __mul__

    def per_sample(self, s: np.ndarray) -> np.ndarray:
        """Bytes per sample at sequence length s (the slope in batch)."""
        s = np.asarray(s, dtype=np.int64)
        return self.seq + s * (self.tok + s * self.s2)

    def eval(self, b: np.ndarray, s: np.ndarray) -> np.ndarray:
        b = np.asarray(b, dtype=np.int64)
        s = np.asarray(s, dtype=np.int64)
        return self.const + s * (self.pos + s * self.sq) + b * self.per_sample(s)


COEFFICIENTS = ("const", "pos", "seq", "tok", "s2", "sq")  # the polynomial in 1, s, b, b·s, b·s², s²
ZERO = Term()
