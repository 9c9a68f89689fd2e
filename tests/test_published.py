"""Published real-GPU measurements (tests/data/published): every file well formed, every printed value turned into
the bytes it allows, and the figures a source lets us reproduce by hand reproduced."""
from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest

from nnmem_sweep import published as P
from nnmem_sweep.catalog.gpus import get_gpu
from nnmem_sweep.components import runtime as R
from nnmem_sweep.units import GB, GiB, MiB

FILES = sorted(P.DEFAULT_DIR.glob("*.json"))
ALL = P.load_published()


def one(file: str, mid: str) -> P.Measurement:
    return next(m for m in ALL if m.file == f"{file}.json" and m.id == mid)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_file_is_well_formed(path: Path) -> None:
    ms = P.load_file(path)
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert len(ms) == len(doc["measurements"]) >= 1
    assert all(m.source_url.startswith("https://") and m.low_bytes <= m.high_bytes for m in ms)
    assert doc["source"]["how_measured"]


def test_enough_sources_across_training_and_inference() -> None:
    assert len(FILES) >= 10 and len(ALL) >= 40
    stats = {m.statistic for m in ALL}
    assert {"nvml_used", "vllm_kv_cache", "oom_allocated", "memory_allocated", "peak_memory_active"} <= stats
    assert sum(1 for m in ALL if m.expressible_as and "mode train" in m.expressible_as) >= 9
    assert sum(1 for m in ALL if m.expressible_as and "mode infer" in m.expressible_as) >= 4


@pytest.mark.parametrize("value, unit, precision, low, high", [
    (1343, "MiB", "floor", 1343 * MiB, 1344 * MiB - 1),  # pynvml used // 1024**2
    (79.22, "GiB", "2dp", math.ceil(Fraction("79.215") * GiB), math.floor(Fraction("79.225") * GiB)),
    (18.9, "GiB", "1dp", math.ceil(Fraction("18.85") * GiB), math.floor(Fraction("18.95") * GiB)),
    (1.06, "GB", "2dp", 1_055_000_000, 1_065_000_000),
    (8519680, "B", "exact", 8_519_680, 8_519_680),
])
def test_a_printed_value_allows_a_range_of_bytes(value, unit, precision, low, high) -> None:
    assert P.value_bounds(value, unit, precision) == (low, high)


def _within(m: P.Measurement, nbytes: int) -> bool:
    return m.low_bytes <= nbytes <= m.high_bytes


def test_vllm_weights_are_the_parameters_times_two_bytes() -> None:
    # Llama 3 8B: 8,030,261,248 parameters in bf16; at TP 2 the 65 RMSNorm vectors (2 x 32 + 1) x 4096 stay whole
    assert _within(one("vllm-pr10511-llama3-8b", "tp1-weights"), 8_030_261_248 * 2)
    assert _within(one("vllm-pr10511-llama3-8b", "tp2-weights"), (16_060_522_496 - 532_480) // 2 + 532_480)
    # KV = 0.9 x total - weights - non-torch - activations, each printed to 0.01 GiB
    parts = [one("vllm-pr10511-llama3-8b", f"tp1-{k}") for k in ("total", "weights", "non-torch", "activation-peak")]
    kv = one("vllm-pr10511-llama3-8b", "tp1-kv-cache")
    total, w, nt, act = parts
    assert Fraction(9, 10) * total.low_bytes - w.high_bytes - nt.high_bytes - act.high_bytes <= kv.high_bytes
    assert Fraction(9, 10) * total.high_bytes - w.low_bytes - nt.low_bytes - act.low_bytes >= kv.low_bytes


def test_b200_oom_figures_follow_from_the_script() -> None:
    # x, y = x / 2, z = y + 10: three fp32 tensors of 15e9 elements live when z.mul fails
    assert _within(one("ml-engineering-b200-oom", "allocated"), 3 * 15 * 10**9 * 4)
    assert _within(one("ml-engineering-b200-oom", "tried"), 15 * 10**9 * 4)
    assert one("ml-engineering-b200-oom", "total-capacity").low_bytes == get_gpu("b200").memory_bytes


def test_h200_allocatable_is_the_capacity_less_context_and_the_free_tail() -> None:
    total = one("ml-engineering-h200-allocatable", "total-capacity")
    free = one("ml-engineering-h200-allocatable", "free-at-oom")
    got = one("ml-engineering-h200-allocatable", "allocated-before-oom")
    assert got.low_bytes == 139 * GiB
    outside = (total.low_bytes - free.high_bytes - got.low_bytes, total.high_bytes - free.low_bytes - got.low_bytes)
    row = next(r for r in R._data()["cuda_context"] if r["id"] == "ml-engineering-h200")
    # the runtime table holds this derivation, done on the exact printed ranges (here each term is first rounded
    # to whole bytes, which can move either end by one byte)
    assert abs(outside[0] - row["measured_low"]) <= 1 and abs(outside[1] - row["measured_high"]) <= 1


def test_published_library_figures_agree_with_the_runtime_model() -> None:
    # pytorch#95668: one Linear forward on an A10G leaves the cuBLAS workspace allocated (torch 2.0)
    cublas = R.cublas_workspace(R.parse_runtime({"torch": "2.0"}, get_gpu("a10g")), "infer")
    assert [i.bytes for i in cublas] == [one("pytorch-issue95668-cublas-workspace", "linear-forward").low_bytes]
    # pytorch#86509: the runtime rows are these figures
    rows = {r["id"]: r for r in R._data()["cuda_context"]}
    assert rows["pytorch-86509-lazy"]["measured_low"] == one("pytorch-pr86509-lazy-loading", "lazy").low_bytes
    assert rows["pytorch-86509-eager"]["measured_low"] == one("pytorch-pr86509-lazy-loading", "eager").low_bytes
    # unsloth-zoo#1053: the catalog's RTX 6000 Ada capacity is this printout
    assert one("unsloth-zoo-pr1053-context", "capacity").low_bytes == get_gpu("rtx-6000-ada").memory_bytes
    # nccl#1685: the all-to-all term is the difference of the two printouts (1.06 -> 4.34 GB)
    a2a = R.nccl_bytes({"expert_parallel": 8})[1].bytes
    assert a2a == 4_340_000_000 - 1_060_000_000 == round(Fraction("3.28") * GB)


def test_hf_measurements_share_one_setup_and_shrink_as_the_docs_say() -> None:
    hf = {m.id: m.low_bytes for m in ALL if m.file == "hf-perf-train-gpu-one-v4.27.json"}
    assert hf["bs1-ga4-gc-fp16-adafactor"] < hf["bs1-ga4-gc-fp16-adam8bit"] < hf["bs1-ga4-gc"] < hf["bs1-ga4"]
    anatomy = one("hf-model-memory-anatomy", "train-bs4")
    assert all(v < anatomy.low_bytes for v in hf.values())  # every technique uses less than the vanilla 14949 MiB


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(schema="v0"), "schema: expected 'nnmem-published/1'"),
    (lambda d: d["source"].update(url="http://x"), "source: expected a title and an https:// url"),
    (lambda d: d["measurements"][0].pop("quote"), "measurements[0]: missing key 'quote'"),
    (lambda d: d["measurements"][0].update(statistic="peak"), "measurements[0].statistic: expected one of"),
    (lambda d: d["measurements"][0].update(value=1344), "measurements[0].value: 1344 is not in the quote"),
    (lambda d: d["measurements"][0].update(expressible_as=None, missing=None), "say which scenario expresses it"),
    (lambda d: d["measurements"].append(dict(d["measurements"][0])), "measurement id 'context' appears twice"),
])
def test_a_malformed_file_names_the_file_and_the_key(tmp_path: Path, change, message: str) -> None:
    doc = json.loads((P.DEFAULT_DIR / "hf-model-memory-anatomy.json").read_text(encoding="utf-8"))
    change(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(P.PublishedError) as e:
        P.load_file(bad)
    assert str(e.value).startswith("bad.json") and message in str(e.value)
