"""A synthetic RunResult for the report tests: a toy estimator, affine in batch, built with the contract's columns.

The report must not depend on the real estimator's numbers, so the golden file only changes when the report does.
Toy model (bytes): states = Ψ·w (weights) + Ψ·w (grads) + Ψ·k (optimizer), activations = b·s·a,
overhead = 512 MiB + 8,519,680 (cuBLAS default workspace), w = 4 (bf16-mixed) or 2 (bf16), k = 8 (adamw) or 4 (sgd),
a = 200,000 bytes per token without checkpointing, 20,000 with full checkpointing.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product

import pandas as pd
import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.models.arch import Architecture
from nnmem_sweep.report import decision_options
from nnmem_sweep.scenario import GPUSpec, Overheads, Scenario
from nnmem_sweep.units import MiB

PARAMS = 1_000_000_000
TOY = "Toy 1B"
WEIGHT_BYTES = {"bf16-mixed": 4, "bf16": 2}
OPT_BYTES = {"adamw": 8, "sgd": 4}
ACT_PER_TOKEN = {"none": 200_000, "full": 20_000}
OVERHEAD = 512 * MiB + 8_519_680

YAML = """\
name: Toy 1B <fine-tune>
description: "Synthetic scenario for the report's golden test"
model: {params: 1000000000}
grid:
  batch: [1, 2, 4, 8, 16]
  seq_len: [1024, 4096]
  precision: [bf16-mixed, bf16]
  optimizer: [adamw, sgd]
  checkpointing: [none, full]
gpus: [l4, a100-40gb, h100-sxm]
headroom: 0.05
target: {batch: 8, seq_len: 4096}
"""


@dataclass(frozen=True)
class FakeRun:
    scenario: Scenario
    results: pd.DataFrame
    max_batch: pd.DataFrame
    elapsed_s: float = 0.01


def make_scenario(**changes) -> Scenario:
    grid = {a: (None,) for a in C.GRID_AXES} | {C.CACHE_TOKENS: (0,), C.DECODE_TOKENS: (0,)}  # train defaults
    grid.update({C.BATCH: (1, 2, 4, 8, 16), C.SEQ_LEN: (1024, 4096), C.PRECISION: ("bf16-mixed", "bf16"),
                 C.OPTIMIZER: ("adamw", "sgd"), C.OPTIMIZER_IMPL: ("foreach",), C.CHECKPOINTING: ("none", "full"),
                 C.ATTENTION: ("flash",)})
    sc = Scenario(
        path="scenario.yaml", name="Toy 1B <fine-tune>", description="Synthetic scenario for the report's golden test",
        model=Architecture(name=TOY, kind="params", family="params", params=PARAMS, origin="explicit"),
        mode="train", grid=grid,
        gpus=(GPUSpec("h100-sxm", "H100 SXM5 80GB", 81559 * MiB, "nvidia-smi total, 81559 MiB"),
              GPUSpec("l4", "L4 24GB", 23034 * MiB, "nvidia-smi total, 23034 MiB"),
              GPUSpec("a100-40gb", "A100 40GB", 40960 * MiB, "nvidia-smi total, 40960 MiB")),
        overheads=Overheads(512 * MiB, 8_519_680, 0.0), headroom=0.05,
        report={"paper": "A4", "table_rows": [C.SEQ_LEN, C.PRECISION, C.OPTIMIZER]},
        target={C.BATCH: 8, C.SEQ_LEN: 4096}, source_text=YAML,
    )
    return replace(sc, **changes)


def usable(memory_bytes: int, headroom: float) -> int:
    return int(memory_bytes * (1 - headroom))


def toy_row(sc: Scenario, p: dict, g: GPUSpec) -> dict:
    """One point of the toy estimator on one GPU: the contract's columns."""
    w = PARAMS * WEIGHT_BYTES[p[C.PRECISION]]
    opt = PARAMS * OPT_BYTES[p[C.OPTIMIZER]]
    act = p[C.BATCH] * p[C.SEQ_LEN] * ACT_PER_TOKEN[p[C.CHECKPOINTING]]
    peak = w + w + opt + act
    return {**p, C.GPU: g.id, C.MODE: sc.mode, C.MODEL: sc.model.name, C.WEIGHTS: w,
            C.MASTER_WEIGHTS: 0, C.GRADIENTS: w, C.OPTIMIZER_STATE: opt, C.ACTIVATIONS: act,
            C.KV_CACHE: 0, C.TEMPORARY: 0, C.PEAK_ALLOCATED: peak, C.PEAK_PHASE: "backward",
            C.OVERHEAD: OVERHEAD, C.TOTAL: peak + OVERHEAD, C.GPU_MEMORY: g.memory_bytes,
            C.USABLE: usable(g.memory_bytes, sc.headroom),
            C.FITS: peak + OVERHEAD <= usable(g.memory_bytes, sc.headroom)}


def toy_estimate(sc: Scenario, frame: pd.DataFrame) -> pd.DataFrame:
    """The toy estimator on any frame of points (what the decision page re-estimates)."""
    by_id = {g.id: g for g in sc.gpus}
    return pd.DataFrame([toy_row(sc, {k: (v.item() if hasattr(v, "item") else v) for k, v in p.items() if k != C.GPU},
                                 by_id[str(p[C.GPU])]) for p in frame.to_dict("records")])


def toy_run(sc: Scenario) -> FakeRun:
    axes = list(C.GRID_AXES)
    rows = [toy_row(sc, dict(zip(axes, values)), g) for values in product(*(sc.grid[a] for a in axes))
            for g in sc.gpus]
    results = pd.DataFrame(rows)
    mb_rows = []
    for values in product(*(sc.grid[a] for a in C.NON_BATCH_AXES)):
        p = dict(zip(C.NON_BATCH_AXES, values))
        fixed = 2 * PARAMS * WEIGHT_BYTES[p[C.PRECISION]] + PARAMS * OPT_BYTES[p[C.OPTIMIZER]] + OVERHEAD
        per = p[C.SEQ_LEN] * ACT_PER_TOKEN[p[C.CHECKPOINTING]]
        for g in sc.gpus:
            mb = max(0, (usable(g.memory_bytes, sc.headroom) - fixed) // per)
            mb_rows.append({**p, C.GPU: g.id, C.MAX_BATCH: mb, C.TOTAL_AT_MAX_BATCH: fixed + mb * per,
                            C.TOTAL_AT_BATCH_1: fixed + per})
    return FakeRun(sc, results, pd.DataFrame(mb_rows))


@pytest.fixture(autouse=True)
def toy_estimator(monkeypatch):
    """The decision page re-estimates points: the toy scenario's with the toy estimator, any other with the real."""
    real = decision_options.estimate_points
    monkeypatch.setattr(decision_options, "estimate_points",
                        lambda sc, frame: toy_estimate(sc, frame) if sc.model.name == TOY else real(sc, frame))


@pytest.fixture
def scenario() -> Scenario:
    return make_scenario()


@pytest.fixture
def run(scenario) -> FakeRun:
    return toy_run(scenario)
