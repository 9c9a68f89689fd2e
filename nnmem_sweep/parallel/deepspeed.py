"""A scenario's `parallel.deepspeed:` as the parallel axes DeepSpeed's buffers are estimated from (columns
REDUCE_BUCKET, OVERLAP_COMM, PREFETCH_BUCKET; states.deepspeed_buffers): DeepSpeed's defaults (true), a mapping that
overrides them, or a DeepSpeed config JSON whose `zero_optimization` section is read. "auto" values are what
transformers' Trainer puts there (integrations/deepspeed.py HfTrainerDeepSpeedConfig): reduce_bucket_size h·h,
stage3_prefetch_bucket_size 0.9·h·h (h: the model's hidden size)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import columns as C

# DeepSpeed runtime/zero/config.py defaults
REDUCE_BUCKET_DEFAULT = 500_000_000
ALLGATHER_BUCKET_DEFAULT = 500_000_000
PREFETCH_BUCKET_DEFAULT = 50_000_000
MAX_LIVE_DEFAULT = 1_000_000_000  # stage3_max_live_parameters: gathered parameters ZeRO-3 keeps alive per rank
PERSISTENCE_THRESHOLD_DEFAULT = 100_000  # stage3_param_persistence_threshold: smaller tensors stay whole on each rank
KEYS = ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size", "overlap_comm",
        "contiguous_gradients")


class DeepSpeedConfigError(ValueError):
    """One line: what in the DeepSpeed settings cannot be used."""


def read_config(path: Path) -> dict[str, Any]:
    """The zero_optimization section of a DeepSpeed config JSON (the keys this estimate reads)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise DeepSpeedConfigError(f"cannot read the DeepSpeed config {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise DeepSpeedConfigError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    zero = data.get("zero_optimization") if isinstance(data, dict) else None
    if not isinstance(zero, dict):
        raise DeepSpeedConfigError(f"{path} has no zero_optimization section: not a DeepSpeed ZeRO config")
    return {k: zero[k] for k in KEYS if k in zero}  # the other keys (stage, persistence, ...) are not read here


def _elements(value: Any, key: str, auto: float | None) -> int:
    if value == "auto":
        if auto is None:
            raise DeepSpeedConfigError(f"{key} 'auto' needs the model's hidden size (transformers' Trainer sets it "
                                       "from config.hidden_size); this model has none: give a number")
        return int(auto)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise DeepSpeedConfigError(f"{key} must be a number of elements or 'auto', got {value!r}")
    return int(value)


def axes(settings: dict[str, Any], hidden: int | None) -> dict[str, Any]:
    """The parallel axes (one value each) for DeepSpeed settings (true: {})."""
    unknown = sorted(set(settings) - set(KEYS))
    if unknown:
        raise DeepSpeedConfigError(f"unknown DeepSpeed setting {unknown[0]!r} (read: {', '.join(KEYS)})")
    h2 = hidden * hidden if hidden else None
    reduce = _elements(settings.get("reduce_bucket_size", REDUCE_BUCKET_DEFAULT), "reduce_bucket_size", h2)
    prefetch = _elements(settings.get("stage3_prefetch_bucket_size", PREFETCH_BUCKET_DEFAULT),
                         "stage3_prefetch_bucket_size", 0.9 * h2 if h2 else None)
    _elements(settings.get("allgather_bucket_size", ALLGATHER_BUCKET_DEFAULT), "allgather_bucket_size", h2)
    overlap = settings.get("overlap_comm", False)
    contiguous = settings.get("contiguous_gradients", True)
    for key, v in (("overlap_comm", overlap), ("contiguous_gradients", contiguous)):
        if not isinstance(v, bool):
            raise DeepSpeedConfigError(f"{key} must be true or false, got {v!r}")
    # without contiguous_gradients no bucket is made (stage_1_and_2.py setup_buckets, stage3.py __init__)
    return {C.REDUCE_BUCKET: reduce if contiguous else 0, C.OVERLAP_COMM: bool(overlap), C.PREFETCH_BUCKET: prefetch}


def resolve(given: Any, base_dir: Path, hidden: int | None) -> dict[str, Any]:
    """`parallel.deepspeed:` (true | mapping | path) as parallel axes; {} for false."""
    if given is False:
        return {}
    if given is True:
        return axes({}, hidden)
    if isinstance(given, str):
        return axes(read_config(base_dir / given), hidden)
    return axes(dict(given), hidden)
