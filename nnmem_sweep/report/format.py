"""Formatters: Python functions that turn numbers into the strings a reader sees; also registered as jinja filters.

Reports print IEC units (GiB = 2^30 bytes) with the unit spelled out, via units.format_bytes, so a label can never
disagree with its divisor.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..units import format_bytes

DASH = "–"  # en dash: "does not fit even at batch 1"

AXIS_LABELS = {
    "batch": "batch",
    "seq_len": "seq len",
    "precision": "precision",
    "optimizer": "optimizer",
    "optimizer_impl": "optimizer impl",
    "checkpointing": "checkpointing",
    "attention": "attention",
    "cache_tokens": "prompt tokens",
    "decode_tokens": "decode tokens",
    "zero_grad": "zero_grad",  # columns.OPTIONAL_AXES
    "gpu": "GPU",
    # parallel layouts (columns.PARALLEL_AXES): the short names Megatron-LM and DeepSpeed users read
    "data_parallel": "DP",
    "zero_stage": "ZeRO",
    "tensor_parallel": "TP",
    "sequence_parallel": "SP",
    "pipeline_parallel": "PP",
    "micro_batches": "micro-batches",
    "pipeline_schedule": "schedule",
    "virtual_stages": "virtual stages",
    "context_parallel": "CP",
    "expert_parallel": "EP",
    "offload": "offload",
    "gradient_accumulation": "grad accum",
    "fp32_grad_accumulation": "fp32 grads",
    "reduce_bucket_size": "DS reduce bucket",
    "overlap_comm": "DS overlap_comm",
    "prefetch_bucket_size": "DS prefetch bucket",
    "gradient_sync": "grad sync",
    "ddp_bucket_view": "DDP bucket view",
    "fsdp_version": "FSDP version",
    "backward_prefetch": "FSDP1 bwd prefetch",
}

COMPONENT_LABELS = {
    "weights_bytes": "weights",
    "master_weights_bytes": "master weights",
    "gradients_bytes": "gradients",
    "optimizer_bytes": "optimizer state",
    "activations_bytes": "activations",
    "kv_cache_bytes": "KV cache",
    "temporary_bytes": "temporaries",
    "overhead_bytes": "runtime overhead",
}


def gib(n: Any, digits: int = 1) -> str:
    """Bytes -> '71.2 GiB'."""
    return format_bytes(int(n), "GiB", digits)


def gib_number(n: Any, digits: int = 1) -> str:
    """Bytes -> '71.2' (for 'x of y GiB' phrases where the unit is printed once)."""
    return format_bytes(int(n), "GiB", digits).rsplit(" ", 1)[0]


def mib(n: Any, digits: int = 1) -> str:
    return format_bytes(int(n), "MiB", digits)


def thousands(n: Any) -> str:
    """4096 -> '4,096'; non-numbers pass through as text."""
    if isinstance(n, bool) or n is None:
        return str(n)
    if isinstance(n, (int,)) or (isinstance(n, float) and n.is_integer()):
        return f"{int(n):,}"
    return str(n)


def percent(fraction: float, digits: int = 1) -> str:
    """0.05 -> '5%'; 0.125 -> '12.5%' (trailing zeros dropped)."""
    text = f"{fraction * 100:.{digits}f}"
    if "." in text:  # trailing zeros of the decimals only: 30 stays 30 at digits=0
        text = text.rstrip("0").rstrip(".")
    return f"{text}%"


def signed_percent(fraction: float, digits: int = 1) -> str:
    if fraction is None or (isinstance(fraction, float) and math.isnan(fraction)):
        return DASH
    return f"{fraction * 100:+.{digits}f}%"


def axis_value(axis: str, value: Any) -> str:
    """A grid value as a reader sees it in a table cell or a sentence."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    if isinstance(value, (bool, np.bool_)):  # sequence_parallel, fp32_grad_accumulation
        return "on" if value else "off"
    if axis in ("seq_len", "cache_tokens", "decode_tokens", "batch"):
        return thousands(value)
    if axis in ("reduce_bucket_size", "prefetch_bucket_size"):  # DeepSpeed's sizes count elements, not bytes
        return f"{thousands(value)} elements"
    if axis == "gradient_sync":  # parallel.gradient_sync, in the words of the frameworks that set it
        return GRADIENT_SYNC_WORDS.get(str(value), str(value))
    return str(value)


GRADIENT_SYNC_WORDS = {"each": "every micro-batch", "last": "last micro-batch only (no_sync)"}


def article(name: str) -> str:
    """'an H100 SXM', 'an A100', 'a T4', 'a GeForce': acronyms are read letter by letter, words by their vowel."""
    if not name:
        return "a"
    first = name[0]
    acronym = len(name) > 1 and (name[1].isdigit() or name[1].isupper() or name[1] in " -")
    if acronym:
        return "an" if first.upper() in "AEFHILMNORSX" else "a"
    return "an" if first.lower() in "aeio" else "a"


def signed_gib(n: Any) -> str:
    """Bytes -> '+12.3' / '−3.1' GiB, the unit left to the heading (a margin: room left, or missing)."""
    return ("+" if int(n) >= 0 else "−") + gib_number(abs(int(n)))


def size(n: Any) -> str:
    """Bytes -> '612 MiB' below 1 GiB, else '4.2 GiB' (the parts of an uncertainty, small and large)."""
    return mib(n, 0) if int(n) < 2**30 else gib(n)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, (float, np.floating)) and not math.isfinite(v))


def rate(v: Any) -> str:
    """Tokens/s -> '5,196' (three significant figures at most below 1,000: '41.3'); unknown -> 'unknown'."""
    if _missing(v):
        return "unknown"
    v = float(v)
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def duration(seconds: Any) -> str:
    """Seconds -> '850 ms' / '12.5 min' / '53.5 h' / '9.3 days' (an estimate's duration, three figures)."""
    if _missing(seconds):
        return "unknown"
    s = float(seconds)
    for limit, div, unit in ((1, 1e-3, "ms"), (60, 1, "s"), (3600, 60, "min"), (48 * 3600, 3600, "h")):
        if s < limit:
            return f"{s / div:.3g} {unit}"
    return f"{s / 86400:,.1f} days"


def usd(v: Any) -> str:
    """Dollars -> '$1,234' ('$12.50' below $100); unknown -> the dash."""
    if _missing(v):
        return DASH
    return f"${float(v):,.2f}" if float(v) < 100 else f"${float(v):,.0f}"


FILTERS = {
    "gib": gib,
    "mib": mib,
    "thousands": thousands,
    "percent": percent,
}
