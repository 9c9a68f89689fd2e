"""The GPU catalog: reported capacities with sources, exact bytes, and the lookup errors."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nnmem_sweep.catalog import gpus
from nnmem_sweep.catalog.gpus import get_gpu, gpu_ids, list_gpus
from nnmem_sweep.units import GiB, MiB

REQUIRED = ["v100-16gb", "v100-32gb", "a10g", "l4", "l40s", "rtx-4090", "rtx-6000-ada", "a100-40gb", "a100-80gb",
            "h100-pcie", "h100-sxm", "h100-nvl", "h200", "b200", "mi250x", "mi300x"]
ENTRIES = json.loads(gpus.CATALOG_PATH.read_text(encoding="utf-8"))["gpus"]


def test_catalog_holds_every_gpu_the_issue_lists() -> None:
    assert set(REQUIRED) <= set(gpu_ids())
    assert len(gpu_ids()) == len(set(gpu_ids()))
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", i) for i in gpu_ids())


@pytest.mark.parametrize("gpu_id, reported", [
    ("h100-sxm", 81559 * MiB),      # nvidia-smi 'NVIDIA H100 80GB HBM3': 81559MiB = 85,520,809,984 B
    ("a100-80gb", 81920 * MiB),     # nvidia-smi 'A100-SXM4-80GB': 81920MiB = 80 GiB exactly
    ("a100-40gb", 40960 * MiB),     # nvidia-smi 'A100-SXM4-40GB': 40960MiB = 40 GiB exactly
    ("h200", 143771 * MiB),         # nvidia-smi 'NVIDIA H200': 143771MiB
    ("b200", 183359 * MiB),         # nvidia-smi 'NVIDIA B200': 183359MiB
    ("mi300x", 206_141_652_992),    # rocm-smi 'VRAM Total Memory (B): 206141652992'
    ("mi250x", 68_702_699_520),     # rocm-smi, one GCD: 'VRAM Total Memory (B): 68702699520'
])
def test_reported_capacity_to_the_byte(gpu_id: str, reported: int) -> None:
    assert get_gpu(gpu_id).memory_bytes == reported


def test_reported_capacity_is_a_little_below_the_marketing_figure() -> None:
    # Devices report what is left after ECC / reserved regions: at most the marketed size read as GiB
    # (HBM stacks come in powers of two), and never less than 90 % of it.
    for e in ENTRIES:
        marketed_gib = int(re.match(r"(\d+) GB", e["marketing"]).group(1)) * GiB
        reported = get_gpu(e["id"]).memory_bytes
        assert 0.9 * marketed_gib <= reported <= marketed_gib, e["id"]
    assert get_gpu("h100-sxm").memory_bytes > 80 * 10**9  # why "80 GB" must not be read as 80e9 B either


def test_every_entry_names_its_source_and_honest_about_memory_only_figures() -> None:
    for e in ENTRIES:
        assert set(e) == {"id", "name", "vendor", "memory", "source", "marketing"}
        assert ("nvidia-smi" in e["source"] or "CUDA" in e["source"]) if e["vendor"] == "nvidia" else (
            "rocm-smi" in e["source"])
    for spec in list_gpus():
        assert "marketed as" in spec.source and spec.price_usd is None


def test_unknown_gpu_lists_the_catalog_and_the_close_match() -> None:
    with pytest.raises(ValueError) as info:
        get_gpu("h100-sxn")
    msg = str(info.value)
    assert msg.startswith("unknown GPU 'h100-sxn' (did you mean 'h100-sxm'")
    assert msg.endswith("known: " + ", ".join(gpu_ids()))


def test_unknown_non_string_gpu_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown GPU"):
        get_gpu(["h100-sxm"])  # type: ignore[arg-type]


def test_gpus_command_lists_the_catalog_with_sources() -> None:
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-m", "nnmem_sweep.cli", "gpus"], cwd=root, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert [line.split()[0] for line in lines] == gpu_ids()
    assert "79.65 GiB" in next(line for line in lines if line.startswith("h100-sxm "))  # 81559 MiB / 1024
