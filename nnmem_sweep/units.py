"""Byte units. The only place that spells out 1024**3 or 10**9.

IEC (KiB, MiB, GiB, TiB) are powers of 2; SI (KB, MB, GB, TB) are powers of 10. "GB" always means 10**9.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

B = 1
KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12

UNITS: dict[str, int] = {
    "B": B,
    "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB,
    "KB": KB, "MB": MB, "GB": GB, "TB": TB,
}

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)\s*$")


def parse_size(text: str | int) -> int:
    """'80 GiB' -> 85899345920. Integers are bytes. A unit is required for strings; fractions of a byte are refused.

    Raises ValueError naming the value when it cannot be read.
    """
    if isinstance(text, bool):
        raise ValueError(f"size {text!r}: expected a number of bytes or a string such as '80 GiB'")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size {text!r}: must not be negative")
        return text
    if not isinstance(text, str):
        raise ValueError(f"size {text!r}: expected a string such as '80 GiB'")
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"size {text!r}: expected a number and a unit, e.g. '80 GiB' or '81559 MiB'")
    number, unit = m.groups()
    if unit not in UNITS:
        raise ValueError(f"size {text!r}: unknown unit {unit!r} (use one of {', '.join(UNITS)})")
    try:
        value = Decimal(number) * UNITS[unit]
    except InvalidOperation:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"size {text!r}: not a number") from None
    if value != value.to_integral_value():
        raise ValueError(f"size {text!r}: not a whole number of bytes")
    return int(value)


def bits_to_bytes(count: int, bits: int) -> int:
    """Bytes to hold `count` values of `bits` bits each, rounded up to a whole byte."""
    return (count * bits + 7) // 8


def format_bytes(n: int | float, unit: str = "GiB", digits: int = 1) -> str:
    """85899345920 -> '80.0 GiB'. The unit is always printed, so a label cannot disagree with its divisor."""
    return f"{n / UNITS[unit]:,.{digits}f} {unit}"


def to_unit(n: int | float, unit: str) -> float:
    """Bytes as a float in `unit`, for display only (never stored in a frame)."""
    return n / UNITS[unit]


def auto_unit(n: int | float) -> str:
    """The largest IEC unit in which `n` is at least 1."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if abs(n) >= UNITS[unit]:
            return unit
    return "B"
