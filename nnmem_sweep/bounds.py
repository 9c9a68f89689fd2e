"""Guard against silent int64 overflow: a coarse upper bound of any grid point's bytes, in exact Python ints.

The estimator evaluates its terms in int64 (exact, fast). A scenario with an absurd batch x sequence (say a
million sequences of 16 M tokens with eager attention) would wrap around 2^63 and print nonsense, so every call
first bounds the largest point of the frame from above and refuses it when the bound exceeds 2^62 bytes (4 EiB,
millions of times any GPU; half of what int64 holds): such a point cannot fit anything, and refusing it costs no
real scenario.

The bound over-counts every term the estimator has (components/activations.py, FINDINGS.md), each coefficient
rounded up generously: per token and layer at most 64·h + 16·I·k (k = experts per token, at least 1) bytes,
per token·token of context and head at most 16 bytes (scores, probabilities, mask, dropped probabilities in
fp32), per token at most 64·V for logits and loss, at most 64 bytes per parameter for weights, gradients,
master copy, optimizer state and step temporaries, and the whole doubled for margin. The b·s² term is counted only
when eager attention is in the frame (flash kernels keep no s x s tensor per sequence on the GPU); a mask shared by
the batch (Term.sq, bytes per s²) at most 16 bytes per s² and layer, always.
"""
from __future__ import annotations

import pandas as pd

from . import columns as C
from .errors import UsageError
from .models.arch import Architecture

LIMIT_BYTES = 1 << 62


def upper_bound_bytes(arch: Architecture, batch: int, seq_len: int, eager: bool = True) -> int:
    b, s = int(batch), int(seq_len)
    params = int(arch.params)
    if arch.kind == "transformer":
        k = max(arch.experts_per_token, 1)
        per_token = arch.layers * (64 * arch.hidden + 16 * arch.intermediate * k) + 64 * arch.vocab
        per_token_token = arch.layers * max(arch.heads, 1) * 16 if eager else 0
        per_square = arch.layers * 16  # Term.sq: an s x s mask shared by the batch, at most one per layer
        acts = b * s * (per_token + s * per_token_token) + s * s * per_square
    else:
        elements = arch.activation_elements_per_sample + arch.activation_elements_per_token * s
        elements += sum(r.output_elements for r in arch.layer_table)
        acts = b * 64 * elements
    return 2 * (acts + 64 * params)


def check_frame(arch: Architecture, frame: pd.DataFrame) -> None:
    """UsageError naming the point when the frame's largest batch and sequence could overflow int64 bytes: a missing
    batch or seq_len column counts as 1, missing decode or cache tokens as 0, a missing attention column as eager."""
    if len(frame) == 0:
        return
    top = {c: int(frame[c].max()) if c in frame.columns else default
           for c, default in ((C.BATCH, 1), (C.SEQ_LEN, 1), (C.DECODE_TOKENS, 0), (C.CACHE_TOKENS, 0))}
    b = top[C.BATCH]
    s = max(top[C.SEQ_LEN] + top[C.DECODE_TOKENS], top[C.CACHE_TOKENS])
    # the s² term only with eager attention (flash kernels keep no s x s tensor); the attention column is looked at
    # only when the bound with eager attention is too large
    if upper_bound_bytes(arch, b, s, eager=True) > LIMIT_BYTES and \
            upper_bound_bytes(arch, b, s, _uses_eager(frame)) > LIMIT_BYTES:
        raise UsageError(
            f"batch {b:,} x seq_len {s:,} for {arch.name} is beyond what nnmem-sweep computes exactly "
            f"(a bound of its bytes exceeds 2^62 B = 4 EiB, far past any GPU); lower the largest batch or seq_len")


def _uses_eager(frame: pd.DataFrame) -> bool:
    """Whether any row has eager attention (no attention column counts as eager)."""
    return C.ATTENTION not in frame.columns or bool((frame[C.ATTENTION] == "eager").any())
