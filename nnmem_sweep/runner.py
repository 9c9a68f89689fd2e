"""Run a scenario: the grid estimated (estimate.py), max batch per point (fit.py) and the tables planned beside the
grid (serving.py, cluster.py); write them as one output set.

Library entry points:
- `run_scenario(sc, max_rows, progress) -> RunResult` (scenario, results, max_batch, elapsed_s, the plan tables).
- `write_outputs(result, out_dir, fmt) -> [results.csv, max_batch.csv, ..., run.json]`, one set that replaces the
  folder's previous one (outputs.py); infer scenarios of transformers add the serving plan (serving.py):
  max_concurrency.csv and max_context.csv; a `cluster:` block cluster_options.csv. `run_to_folder` locks the
  folder first, then runs and writes.
- `plan_tables(sc)`, `output_tables(result)` and `write_tables(result, dest, fmt)` (OutputSet.write_tables), which
  run --stream (stream.py) and the report share.
The estimator itself, `estimate_frame` (importable from here too, as run_scenario uses it) and `estimate_point`,
lives in estimate.py.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from . import columns as C
from . import cluster, serving
from .estimate import estimate_frame, estimate_grid
from .grid import MAX_ROWS, checked_size
from .outputs import OutputSet
from .replays import reserved
from .scenario import Scenario
from .tablefile import extension

@dataclass
class RunResult:
    scenario: Scenario
    results: pd.DataFrame
    max_batch: pd.DataFrame
    elapsed_s: float
    # infer scenarios of transformers (serving.py): max_concurrency.csv and max_context.csv; None otherwise
    serving: pd.DataFrame | None = None
    serving_context: pd.DataFrame | None = None
    # scenarios with a `cluster:` block (cluster.py): cluster_options.csv; None otherwise
    cluster: pd.DataFrame | None = None


def run_scenario(sc: Scenario, max_rows: int = MAX_ROWS, progress: bool = False, bands: bool = True) -> RunResult:
    """The grid, max batch and plans of `sc`, with the allocator reserve its replays give (replays.py): the
    RunResult's scenario is that one. bands: also the replays that bound each recipe's band (a resumed run), which
    the report's uncertainty reads and the tables do not. One route: the reserve and the max-batch table with it
    (replays.reserved), then the grid estimated with that reserve (estimate.estimate_grid), then the plans."""
    start = time.perf_counter()
    sc, mb = reserved(sc, progress, bands)
    results = labelled(estimate_grid(sc, max_rows, progress), sc)
    tables = dict(plan_tables(sc))
    elapsed = time.perf_counter() - start
    if progress and elapsed > 1.0:
        print(f"\rnnmem-sweep: {len(results):,} rows in {elapsed:.1f} s" + " " * 10, file=sys.stderr)
    return RunResult(sc, results, mb, elapsed, *(tables.get(name) for name in PLAN_FILES))


def labelled(frame: pd.DataFrame, sc: Scenario) -> pd.DataFrame:
    """The frame with results.csv's first columns put in front, each one value for every row: model, mode and
    plan_stack (run and run --stream)."""
    codes = np.zeros(len(frame), dtype=np.int8)
    for col, value in ((C.PLAN_STACK, plan_stack(sc)), (C.MODE, sc.mode), (C.MODEL, sc.model.name)):
        frame.insert(0, col, pd.Categorical.from_codes(codes, categories=[value]))
    return frame


# what a hand-modelled family's formulas were checked against: the releases of the committed measured cases
HAND_STACK = "hand model, checked against torch 2.13-2.14, transformers 5.23-5.24, peft 0.21 (tests/data/truth)"


def plan_stack(sc: Scenario) -> str:
    """The releases the scenario's plan holds for, in words (results.csv's plan_stack, the report's first page):
    for a model planned from its own code, the torch / transformers / peft its plans and card were traced with
    (those this run read); for a hand model, HAND_STACK."""
    return model_stack(sc.model)


def model_stack(arch) -> str:  # noqa: ANN001 - an Architecture
    """plan_stack of one model (`estimate` prints it too)."""
    if arch.kind != "derived":
        return HAND_STACK
    from .derive import cache

    source = arch.derived.source
    used = cache.stacks_used([source.digest()], skip=("torchvision",) if source.kind == "hf" else ())
    return "traced with " + (" | ".join(used) if used else "the installed releases")


# The per-scenario tables computed beside the grid, in RunResult's field order: serving, serving_context, cluster
PLAN_FILES = ("max_concurrency.csv", "max_context.csv", "cluster_options.csv")


def plan_tables(sc: Scenario) -> list[tuple[str, pd.DataFrame]]:
    """(file name, table) of the serving plan (infer scenarios of transformers) and the cluster search (a
    `cluster:` block); none for most scenarios. run_scenario and run --stream both write these."""
    out = []
    if serving.applies(sc):
        out += [(PLAN_FILES[0], serving.max_concurrency(sc)), (PLAN_FILES[1], serving.max_context(sc))]
    if sc.cluster is not None:
        out.append((PLAN_FILES[2], cluster.cluster_options(sc, sc.cluster)))
    return out


def output_tables(result: RunResult) -> list[tuple[str, pd.DataFrame]]:
    """(CSV file name, table) of every table a run writes: results, max_batch, then the plans it has."""
    plans = zip(PLAN_FILES, (getattr(result, name, None) for name in ("serving", "serving_context", "cluster")))
    return [("results.csv", result.results), ("max_batch.csv", result.max_batch),
            *((name, table) for name, table in plans if table is not None)]


def write_tables(result: RunResult, dest: OutputSet, fmt: str = "csv") -> None:
    """The run's tables into an open output set (OutputSet.write_tables: results and max_batch as `fmt`, the plans
    as CSV)."""
    dest.write_tables(output_tables(result), fmt)


def write_outputs(result: RunResult, out_dir: Path, fmt: str = "csv") -> list[Path]:
    """The run's tables and run.json as one set that replaces out_dir's previous one (outputs.OutputSet)."""
    with OutputSet(out_dir, result.scenario, command="run") as s:
        write_tables(result, s, fmt)
    return s.paths


def run_to_folder(sc: Scenario, out_dir: Path, *, fmt: str = "csv", max_rows: int = MAX_ROWS,
                  progress: bool = False) -> list[Path]:
    """`nnmem-sweep run`: the folder is locked and checked before the grid runs (a second run into it, or a
    folder holding a user's files, is refused at once), and an oversized grid is refused before either."""
    extension(fmt)
    checked_size(sc, max_rows)
    with OutputSet(out_dir, sc, command="run") as s:
        result = run_scenario(sc, max_rows=max_rows, progress=progress, bands=False)
        s.write_tables(output_tables(result), fmt)
    return s.paths
