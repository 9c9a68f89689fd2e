"""The GPU catalog (gpus.json): the capacity a PyTorch process can use, each figure with its source.

`GPUSpec.memory_bytes` (the `gpu_memory_bytes` column) is the PyTorch-visible capacity: torch.cuda.mem_get_info()'s
total, which torch.cuda.get_device_properties().total_memory equals and which the out-of-memory message prints as
"GPU 0 has a total capacity of X GiB". It is below nvidia-smi's memory.total because the driver reserves part of the
framebuffer, and the reserve depends on the driver (older drivers reported the whole framebuffer). So the catalog
keeps every public observation with its quote, URL and printed precision, and takes the lowest end of the lowest one
(conservative: a "fits" decided on it holds on the drivers that reserve most). nvidia-smi's total (`device_total`)
stays beside it as information. A GPU without any observation gets its device total minus the largest gap between
the two seen on a catalogued GPU of the same vendor, labelled "estimated". A user-given GPU
(`{name: my-card, memory: "48 GiB"}`) states that capacity as PyTorch sees it.
"""
from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from pathlib import Path

from ..scenario import GPUSpec
from ..units import GiB, MiB, format_bytes, parse_size

CATALOG_PATH = Path(__file__).with_name("gpus.json")
TFLOPS = 10**12
DTYPES = ("bf16", "fp16", "fp8", "tf32", "fp32")
_HALF_CENT = Fraction(5, 1000)  # half the last printed digit of a figure printed with two decimals


@dataclass(frozen=True)
class Observation:
    """One public printout of the PyTorch-visible total: the bytes it pins down, [low, high]."""

    printed: str
    format: str  # gib_2dp | props_mib_floor | bytes_exact | torchtitan_reserved_pct
    low_bytes: int
    high_bytes: int
    quote: str
    url: str | None
    context: str
    locator: str | None = None

    @property
    def cite(self) -> str:
        return self.url or self.locator or "no address"


def _number(text: str, unit: str) -> Fraction:
    found = re.search(r"([0-9][0-9,]*(?:\.[0-9]+)?)\s*" + re.escape(unit), text)
    if not found:
        raise ValueError(f"{CATALOG_PATH}: no figure in {unit} in {text!r}")
    return Fraction(found.group(1).replace(",", ""))


def observation_bounds(printed: str, fmt: str) -> tuple[int, int]:
    """The whole bytes a printout allows, [low, high]: "79.19 GiB" (two decimals) is 79.185 .. 79.195 GiB;
    "total_memory=81090MB" is torch's integer MiB (`totalGlobalMem / (1024 * 1024)`, rounded down) so 81090 ..
    81091 MiB less a byte; "58.28GiB(73.68%)" is torchtitan's max reserved and its share of total_memory."""
    if fmt == "gib_2dp":
        x = _number(printed, "GiB")
        lo, hi = (x - _HALF_CENT) * GiB, (x + _HALF_CENT) * GiB
    elif fmt == "props_mib_floor":
        n = int(_number(printed, "MB"))
        lo, hi = Fraction(n * MiB), Fraction((n + 1) * MiB - 1)
    elif fmt == "bytes_exact":
        lo = hi = _number(printed, "byte")
    elif fmt == "torchtitan_reserved_pct":
        reserved, pct = _number(printed, "GiB"), _number(printed, "%")
        lo = (reserved - _HALF_CENT) * GiB * 100 / (pct + _HALF_CENT)
        hi = (reserved + _HALF_CENT) * GiB * 100 / (pct - _HALF_CENT)
    else:
        raise ValueError(f"{CATALOG_PATH}: unknown observation format {fmt!r}")
    return math.ceil(lo), math.floor(hi)


@dataclass(frozen=True)
class CatalogEntry:
    spec: GPUSpec
    observations: tuple[Observation, ...]
    device_total_quote: str | None
    device_total_url: str | None
    marketing: str
    vendor: str
    notes: str


def _observations(entry: dict) -> tuple[Observation, ...]:
    out = []
    for o in entry["torch_total"]:
        low, high = observation_bounds(o["printed"], o["format"])
        out.append(Observation(o["printed"], o["format"], low, high, o["quote"], o["url"], o["context"],
                               o.get("locator")))
    return tuple(out)


def _flops(specs: dict) -> tuple[tuple[str, int], ...]:
    return tuple((k, round(Fraction(str(v)) * TFLOPS)) for k, v in specs["dense_tflops"].items()
                 if v is not None)


def _largest_gaps(raw: list[dict]) -> dict[str, tuple[int, str]]:
    """Per vendor, the largest device total minus PyTorch-visible total among the sourced GPUs, with its GPU id."""
    gaps: dict[str, tuple[int, str]] = {}
    for e in raw:
        obs = _observations(e)
        if not obs or e["device_total"] is None:
            continue
        gap = max(0, parse_size(e["device_total"]["value"]) - min(o.low_bytes for o in obs))
        if gap >= gaps.get(e["vendor"], (-1, ""))[0]:
            gaps[e["vendor"]] = (gap, e["id"])
    return gaps


def _capacity(e: dict, obs: tuple[Observation, ...], device_total: int | None,
              gaps: dict[str, tuple[int, str]]) -> tuple[int, str, str]:
    """(memory_bytes, basis, source sentence)."""
    dev = f"nvidia-smi/rocm-smi total {format_bytes(device_total, 'MiB', 0)}" if device_total else \
        "device total unknown"
    if obs:
        lowest = min(obs, key=lambda o: o.low_bytes)
        return (lowest.low_bytes, "torch_total",
                f"PyTorch-visible capacity (mem_get_info total): low end of '{lowest.printed}' ({lowest.cite}), the "
                f"lowest of {len(obs)} public observation(s); {dev}; marketed as {e['marketing']}")
    if device_total is None:
        raise ValueError(f"{CATALOG_PATH}: GPU {e['id']!r} has neither a PyTorch total nor a device total")
    gap, by = gaps.get(e["vendor"], (0, "none"))
    return (device_total - gap, "estimated",
            f"estimated: {dev} less {format_bytes(gap, 'MiB', 0)}, the largest gap to the PyTorch-visible total "
            f"seen on a catalogued {e['vendor']} GPU ({by}); PyTorch-visible capacity unknown; "
            f"marketed as {e['marketing']}")


@cache
def _catalog() -> dict[str, CatalogEntry]:
    doc = json.loads(CATALOG_PATH.read_text(encoding="utf-8"))
    gaps = _largest_gaps(doc["gpus"])
    entries: dict[str, CatalogEntry] = {}
    for e in doc["gpus"]:
        obs = _observations(e)
        device = e["device_total"]
        device_total = parse_size(device["value"]) if device else None
        memory, basis, source = _capacity(e, obs, device_total, gaps)
        specs = e["specs"]
        bandwidth = specs["memory_bandwidth_bytes_per_s"]
        spec = GPUSpec(
            id=e["id"], name=e["name"], memory_bytes=memory, source=source, capacity_basis=basis,
            torch_total_bytes=min(o.low_bytes for o in obs) if obs else None, device_total_bytes=device_total,
            architecture=e["architecture"], compute_capability=e["compute_capability"],
            memory_bandwidth_bytes_per_s=round(bandwidth) if bandwidth is not None else None,
            peak_dense_flops=_flops(specs), spec_source=specs["source"] or specs["note"])
        if spec.id in entries:
            raise ValueError(f"{CATALOG_PATH}: GPU id {spec.id!r} appears twice")
        entries[spec.id] = CatalogEntry(spec, obs, device["quote"] if device else None,
                                        device["url"] if device else None, e["marketing"], e["vendor"],
                                        e.get("notes", ""))
    return entries


def gpu_ids() -> list[str]:
    """Catalog ids in catalog order."""
    return list(_catalog())


def list_gpus() -> list[GPUSpec]:
    """Every catalog GPU, in catalog order (roughly by generation and size)."""
    return [e.spec for e in _catalog().values()]


def catalog_entry(gpu_id: str) -> CatalogEntry:
    """The entry behind `get_gpu(gpu_id)`: the observations, the device total's quote, the notes."""
    get_gpu(gpu_id)
    return _catalog()[gpu_id]


def unknown_gpu_message(gpu_id: str) -> str:
    """'unknown GPU 'h100' (did you mean 'h100-sxm'?); known: ...' — shared by get_gpu and the config loader."""
    ids = gpu_ids()
    close = difflib.get_close_matches(str(gpu_id), ids, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    return f"unknown GPU {gpu_id!r}{hint}; known: {', '.join(ids)}"


def get_gpu(gpu_id: str) -> GPUSpec:
    """The catalog entry for `gpu_id`; an unknown id raises ValueError listing the known ones."""
    try:
        return _catalog()[gpu_id].spec
    except (KeyError, TypeError):
        raise ValueError(unknown_gpu_message(gpu_id)) from None
