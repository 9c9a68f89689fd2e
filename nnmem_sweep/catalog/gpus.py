"""The GPU catalog: capacity as the device reports it, each figure with its source (gpus.json)."""
from __future__ import annotations

import difflib
import json
from functools import cache
from pathlib import Path

from ..scenario import GPUSpec
from ..units import parse_size

CATALOG_PATH = Path(__file__).with_name("gpus.json")


@cache
def _catalog() -> dict[str, GPUSpec]:
    doc = json.loads(CATALOG_PATH.read_text(encoding="utf-8"))
    specs: dict[str, GPUSpec] = {}
    for entry in doc["gpus"]:
        spec = GPUSpec(
            id=entry["id"],
            name=entry["name"],
            memory_bytes=parse_size(entry["memory"]),
            source=f"{entry['source']}; marketed as {entry['marketing']}",
        )
        if spec.id in specs:
            raise ValueError(f"{CATALOG_PATH}: GPU id {spec.id!r} appears twice")
        specs[spec.id] = spec
    return specs


def gpu_ids() -> list[str]:
    """Catalog ids in catalog order."""
    return list(_catalog())


def list_gpus() -> list[GPUSpec]:
    """Every catalog GPU, in catalog order (roughly by generation and size)."""
    return list(_catalog().values())


def unknown_gpu_message(gpu_id: str) -> str:
    """'unknown GPU 'h100' (did you mean 'h100-sxm'?); known: ...' — shared by get_gpu and the config loader."""
    ids = gpu_ids()
    close = difflib.get_close_matches(str(gpu_id), ids, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    return f"unknown GPU {gpu_id!r}{hint}; known: {', '.join(ids)}"


def get_gpu(gpu_id: str) -> GPUSpec:
    """The catalog entry for `gpu_id`; an unknown id raises ValueError listing the known ones."""
    try:
        return _catalog()[gpu_id]
    except (KeyError, TypeError):
        raise ValueError(unknown_gpu_message(gpu_id)) from None
