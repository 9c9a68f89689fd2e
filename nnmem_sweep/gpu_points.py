"""The GPU kit's points file (validation/gpu.yaml): read and checked, each point as a measuring case.

Read by the kit on the GPU (measure/kit.py, which needs nothing but yaml here) and by `nnmem-sweep derive
--gpu-points` (ship.py), which derives the plans the comparison with the estimate reads (gpu_compare.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEFAULT_POINTS = Path("validation/gpu.yaml")
# bytes other processes held on the GPU when a point started: the kit sets it for a point it runs in a child
# process (its own context is then on the device too); measure/meters.py takes it off the memory outside PyTorch
OTHERS_ENV = "NNMEM_SWEEP_GPU_OTHERS_BYTES"


def others_bytes() -> int | None:
    """OTHERS_ENV's bytes in this process (None where the kit did not set it)."""
    import os

    value = os.environ.get(OTHERS_ENV)
    return int(value) if value else None
# the keys of a point that are not the case's own
POINT_KEYS = ("id", "why", "resume", "bisect", "allocator", "timing_steps")


class KitError(Exception):
    """A points file the kit cannot run: one line."""


def load_points(path: Path) -> list[dict[str, Any]]:
    """The `points:` list of a points file; a file the kit cannot run raises KitError (one line, located)."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise KitError(f"{path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise KitError(f"{path}{where}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    points = (doc or {}).get("points") if isinstance(doc, dict) else None
    if not isinstance(points, list) or not points:
        raise KitError(f"{path}: expected a mapping with a non-empty `points:` list")
    seen = set()
    for i, p in enumerate(points):
        if not isinstance(p, dict) or not p.get("id") or "mode" not in p or not ("model" in p or "module" in p):
            raise KitError(f"{path}: points[{i}] needs id, mode and model (or module)")
        if p["id"] in seen:
            raise KitError(f"{path}: points[{i}]: id {p['id']!r} appears twice")
        seen.add(p["id"])
    return points


def case_of(point: dict[str, Any]) -> dict[str, Any]:
    """The point as a workload case (workload/build.py): its own keys, defaults filled in."""
    case = {k: v for k, v in point.items() if k not in POINT_KEYS}
    case.setdefault("precision", "bf16")
    case.setdefault("optimizer", "none" if case["mode"] == "infer" else "adamw")
    case.setdefault("optimizer_impl", "foreach")
    case.setdefault("checkpointing", "none")
    case.setdefault("attention", "flash")
    case.setdefault("decode_tokens", 0)
    case.setdefault("seq_len", 0)
    return case
