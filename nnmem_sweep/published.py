"""Published real-GPU memory measurements (tests/data/published/*.json, one file per source).

Each file names its source (URL, how it measured) and lists measurements, each with the exact quote, the
configuration as the source states it, the statistic (NVML used, max allocated, vLLM's profile lines, an
out-of-memory message's figures ...), the value as printed with its unit and precision, and which scenario of ours
would express it (`expressible_as`) or what the estimator lacks for it (`missing`). Loading checks all of that and
turns each printed value into the range of bytes it allows; it computes no estimate (published_compare.py maps each
expressible measurement to the estimator call for the same statistic; `make accuracy` and the report show it).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from .units import GB, GiB, KiB, MB, MiB

SCHEMA = "nnmem-published/1"
DEFAULT_DIR = Path(__file__).resolve().parent.parent / "tests" / "data" / "published"
UNITS = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "MB": MB, "GB": GB}
# how the printed value relates to the true one: exact; an integer that was rounded down; one or two decimals
PRECISIONS = {"exact": (Fraction(0), Fraction(0)), "floor": (Fraction(0), Fraction(1)),
              "1dp": (Fraction(-5, 100), Fraction(5, 100)), "2dp": (Fraction(-5, 1000), Fraction(5, 1000))}
STATISTICS = {
    "nvml_used": "NVML / nvidia-smi used memory of the whole device (context + reserved + other processes)",
    "process_used": "nvidia-smi memory of one process (its context + what its allocator reserved)",
    "device_used": "cudaMemGetInfo total - free (the whole device)",
    "device_total_memory": "torch.cuda.get_device_properties().total_memory = mem_get_info total",
    "memory_allocated": "torch.cuda.memory_allocated()",
    "peak_memory_active": "torch.cuda.memory_stats()['active_bytes.all.peak']",
    "peak_memory_per_gpu": "a peak the source does not tie to one allocator statistic",
    "allocated_before_oom": "bytes of tensors allocated before the first out-of-memory error",
    "non_torch_used": "device memory outside PyTorch's allocator, as the source measured it",
    "oom_allocated": "out-of-memory message: 'X is allocated by PyTorch'",
    "oom_reserved_unallocated": "out-of-memory message: 'reserved by PyTorch but unallocated'",
    "oom_process_in_use": "out-of-memory message: 'this process has X memory in use'",
    "oom_total_capacity": "out-of-memory message: 'GPU 0 has a total capacity of X'",
    "oom_tried_to_allocate": "out-of-memory message: 'Tried to allocate X'",
    "oom_free": "out-of-memory message: 'of which X is free'",
    "vllm_total_gpu_memory": "vLLM profile: total_gpu_memory",
    "vllm_model_weights": "vLLM profile: model weights take",
    "vllm_non_torch_memory": "vLLM profile: non_torch_memory (increase since its baseline snapshot)",
    "vllm_activation_peak": "vLLM profile: PyTorch activation peak memory",
    "vllm_kv_cache": "vLLM profile: memory left for the KV cache",
}
_REQUIRED = ("id", "quote", "statistic", "value", "unit", "precision", "config", "expressible_as", "missing")


class PublishedError(ValueError):
    """A malformed published-measurement file; the message names the file and the key."""


@dataclass(frozen=True)
class Measurement:
    file: str  # the JSON file's name
    source_url: str
    id: str
    statistic: str
    value: Fraction  # as printed
    unit: str
    precision: str
    low_bytes: int
    high_bytes: int
    quote: str
    config: dict[str, Any] = field(hash=False, compare=False)
    expressible_as: str | None = None
    missing: str | None = None
    notes: str = ""


def value_bounds(value: Fraction | float | int | str, unit: str, precision: str) -> tuple[int, int]:
    """The whole bytes a printed value allows: "1343" MiB floor -> 1343 MiB .. 1344 MiB less a byte; "79.22" GiB
    2dp -> 79.215 .. 79.225 GiB; exact -> the value itself."""
    v = Fraction(str(value))
    below, above = PRECISIONS[precision]
    lo, hi = (v + below) * UNITS[unit], (v + above) * UNITS[unit]
    return math.ceil(lo), (math.floor(hi) - (1 if precision == "floor" else 0))


def _printed_forms(value: Any) -> set[str]:
    forms = {str(value)}
    if isinstance(value, int):
        forms.add(f"{value:,}")
    return forms


def _measurement(name: str, url: str, i: int, raw: Any) -> Measurement:
    where = f"{name}: measurements[{i}]"
    if not isinstance(raw, dict):
        raise PublishedError(f"{where}: expected an object")
    missing_keys = [k for k in _REQUIRED if k not in raw]
    if missing_keys:
        raise PublishedError(f"{where}: missing key {missing_keys[0]!r}")
    checks = [("statistic", raw["statistic"] in STATISTICS, f"one of {', '.join(STATISTICS)}"),
              ("unit", raw["unit"] in UNITS, f"one of {', '.join(UNITS)}"),
              ("precision", raw["precision"] in PRECISIONS, f"one of {', '.join(PRECISIONS)}"),
              ("value", isinstance(raw["value"], (int, float)) and not isinstance(raw["value"], bool)
               and raw["value"] > 0, "a positive number"),
              ("config", isinstance(raw["config"], dict) and bool(raw["config"]), "a non-empty object"),
              ("quote", isinstance(raw["quote"], str) and bool(raw["quote"].strip()), "the source's exact text"),
              ("expressible_as", raw["expressible_as"] is None or isinstance(raw["expressible_as"], str),
               "a scenario description or null"),
              ("missing", raw["missing"] is None or isinstance(raw["missing"], str), "a text or null")]
    for key, ok, expected in checks:
        if not ok:
            raise PublishedError(f"{where}.{key}: expected {expected}, got {raw[key]!r}")
    if raw["expressible_as"] is None and raw["missing"] is None:
        raise PublishedError(f"{where}: say which scenario expresses it (expressible_as) or what is missing")
    if "derived" not in raw and not any(f in raw["quote"] for f in _printed_forms(raw["value"])):
        raise PublishedError(f"{where}.value: {raw['value']!r} is not in the quote (or explain it in 'derived')")
    low, high = value_bounds(raw["value"], raw["unit"], raw["precision"])
    return Measurement(name, url, raw["id"], raw["statistic"], Fraction(str(raw["value"])), raw["unit"],
                       raw["precision"], low, high, raw["quote"], raw["config"], raw["expressible_as"],
                       raw["missing"], raw.get("notes", ""))


def load_file(path: str | Path) -> list[Measurement]:
    """One source's measurements, checked."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise PublishedError(f"{p.name}: cannot read: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise PublishedError(f"{p.name}: schema: expected {SCHEMA!r}")
    source = doc.get("source")
    if not isinstance(source, dict) or not str(source.get("url", "")).startswith("https://") \
            or not source.get("title"):
        raise PublishedError(f"{p.name}: source: expected a title and an https:// url")
    raw = doc.get("measurements")
    if not isinstance(raw, list) or not raw:
        raise PublishedError(f"{p.name}: measurements: expected a non-empty list")
    out = [_measurement(p.name, source["url"], i, m) for i, m in enumerate(raw)]
    ids = [m.id for m in out]
    dup = next((x for x in ids if ids.count(x) > 1), None)
    if dup is not None:
        raise PublishedError(f"{p.name}: measurement id {dup!r} appears twice")
    return out


def load_published(folder: str | Path = DEFAULT_DIR) -> list[Measurement]:
    """Every *.json in `folder`, sorted by file name then order in the file."""
    files = sorted(Path(folder).glob("*.json"))
    if not files:
        raise PublishedError(f"no published measurements in {folder}")
    return [m for f in files for m in load_file(f)]
