"""Grids far beyond memory: estimate chunk by chunk and append to results.csv / max_batch.csv on disk.

`run_streamed(sc, out_dir, chunk_rows=...)` writes the same two files as `runner.run_scenario` +
`runner.write_outputs`, byte for byte, without ever holding more than one chunk:

- results.csv: rows lo..hi of the grid are built directly from their row numbers (mixed-radix decoding of the
  cartesian product of grid.axes_of, batch slowest, GPU fastest, exactly grid.product_frame's order), given the
  GPU and node columns by grid.add_gpu_columns, run through the pure estimator (runner.estimate_frame) and appended.
- max_batch.csv: max batch depends only on the other axes and GPU (grid.point_axes: with a `parallel:` block the
  parallel axes too), so those combinations are chunked the same way and run through fit.max_batch.

The axes and the GPU columns come from the same functions the in-memory run calls, so a scenario with parallel
axes streams the same columns and rows as it runs.

The small per-scenario plans an in-memory run writes beside them (runner.write_outputs: the serving plan's
max_concurrency.csv and max_context.csv, a `cluster:` block's cluster_options.csv) are written after them, the
same bytes (StreamResult.plans). With fmt="parquet" the two big tables are parquet files, one row group per chunk.

Every file goes into the run's output set (outputs.OutputSet): staged beside the folder and put in place in one
step with run.json when everything succeeded; an interrupted or failed run leaves the previous set intact. The
grid size is checked against `max_rows` before anything is allocated or any folder touched, as for an in-memory
run.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from . import columns as C
from .errors import UsageError
from .fit import max_batch
from .grid import MAX_ROWS, add_gpu_columns, axes_of, checked_size, point_axes, product_frame
from .outputs import RUN_JSON, OutputSet
from .replays import with_replayed_reserve
from .runner import estimate_frame, labelled, plan_tables
from .scenario import Scenario
from .tablefile import TableWriter, csv_bytes, extension

CHUNK_ROWS = 500_000  # grid rows estimated and written at once: a few hundred MB of frames at most


@dataclass(frozen=True)
class StreamResult:
    results_path: Path
    max_batch_path: Path
    rows: int  # rows in results.csv
    cells: int  # rows in max_batch.csv
    fits: int  # rows of results.csv that fit
    elapsed_s: float
    plans: tuple[Path, ...] = ()  # max_concurrency.csv, max_context.csv, cluster_options.csv where the scenario has them
    run_json: Path | None = None  # the set's run.json (outputs.py)


def _axis_columns(axes: dict[str, tuple]) -> dict[str, pd.Series]:
    """Each axis on its own, typed exactly as product_frame types it (int64, or categoricals with its categories)."""
    return {name: product_frame({name: tuple(values)})[name] for name, values in axes.items()}


def slice_product(axes: dict[str, tuple], lo: int, hi: int) -> pd.DataFrame:
    """Rows lo..hi (end excluded) of product_frame(axes) without building the rest: the row number r decodes to
    code_k = (r // inner_k) mod len_k, where inner_k is the product of the lengths of the axes after k."""
    cols = _axis_columns(axes)
    lengths = [len(v) for v in axes.values()]
    rows = np.arange(lo, hi, dtype=np.int64)
    inner = prod(lengths)
    data: dict[str, object] = {}
    for (name, col), length in zip(cols.items(), lengths):
        inner //= length
        codes = (rows // inner) % length
        if isinstance(col.dtype, pd.CategoricalDtype):
            data[name] = pd.Categorical.from_codes(col.cat.codes.to_numpy()[codes], dtype=col.dtype)
        else:
            data[name] = col.to_numpy()[codes]
    return pd.DataFrame(data, copy=False)


def _ranges(n: int, step: int) -> Iterator[tuple[int, int]]:
    for lo in range(0, n, step):
        yield lo, min(lo + step, n)


def run_streamed(sc: Scenario, out_dir: str | Path, chunk_rows: int = CHUNK_ROWS, max_rows: int = MAX_ROWS,
                 progress: bool = False, fmt: str = "csv") -> StreamResult:
    """Expand, estimate and write the scenario's grid `chunk_rows` rows at a time (see the module docstring)."""
    if not isinstance(chunk_rows, (int, np.integer)) or chunk_rows < 1:
        raise UsageError(f"--chunk-rows must be a positive integer, got {chunk_rows!r}")
    ext = extension(fmt)
    n = checked_size(sc, max_rows)
    start = time.perf_counter()
    sc = with_replayed_reserve(sc, progress, bands=False)  # as run: the reserve of the replays at the max batches
    gpus = tuple(g.id for g in sc.gpus)
    axes = axes_of(sc) | {C.GPU: gpus}
    points_axes = point_axes(sc) | {C.GPU: gpus}
    cells = prod(len(v) for v in points_axes.values())
    fits = 0
    logits = sc.prefill_logits
    with OutputSet(out_dir, sc, command="run --stream") as out:
        with out.open("results" + ext) as f:
            res = TableWriter(f, fmt)
            for lo, hi in _ranges(n, chunk_rows):
                part = estimate_frame(sc.model, sc.mode, add_gpu_columns(slice_product(axes, lo, hi), sc),
                                      sc.overheads, sc.headroom, prefill_logits=logits)
                labelled(part, sc)
                fits += int(part[C.FITS].sum())
                res.write(part)
                del part
                if progress:
                    print(f"\rnnmem-sweep: {hi:,}/{n:,} rows ({100 * hi / max(n, 1):.0f}%)", end="",
                          file=sys.stderr, flush=True)
            res.close()
        with out.open("max_batch" + ext) as f:
            mb = TableWriter(f, fmt)
            for lo, hi in _ranges(cells, chunk_rows):
                points = add_gpu_columns(slice_product(points_axes, lo, hi), sc)
                mb.write(max_batch(sc.model, sc.mode, points, sc.overheads, sc.headroom, prefill_logits=logits))
            mb.close()
        plans = [out.write_bytes(name, csv_bytes(frame)) for name, frame in plan_tables(sc)]
    elapsed = time.perf_counter() - start
    if progress:
        print(f"\rnnmem-sweep: {n:,} rows in {elapsed:.1f} s, streamed" + " " * 10, file=sys.stderr)
    final = Path(out.out)
    return StreamResult(final / ("results" + ext), final / ("max_batch" + ext), n, cells, fits, elapsed,
                        tuple(final / p.name for p in plans), final / RUN_JSON)
