"""Run a scenario: grid -> components -> peak -> overhead -> fits, and max batch per point; write the CSVs.

Library entry points:
- `run_scenario(sc, max_rows, progress) -> RunResult` (scenario, results, max_batch, elapsed_s).
- `write_outputs(result, out_dir, fmt) -> [results.csv, max_batch.csv, ..., run.json]`, one set that replaces the
  folder's previous one (outputs.py); infer scenarios of transformers add the serving plan (serving.py):
  max_concurrency.csv and max_context.csv; `run_to_folder` locks the folder first, then runs and writes.
- `estimate_frame(arch, mode, frame, overheads, headroom) -> DataFrame`: the pure estimator on any hand-made frame
  of points. `frame` needs the grid axes (columns.GRID_AXES; strings or categoricals, ints) and
  `gpu_memory_bytes` (a `gpu` column is carried through if present). Returns the frame with every component
  column, peak_allocated_bytes, peak_phase, overhead_bytes, total_bytes, usable_bytes and fits (then any further
  per-row arrays the components return, such as per-rank host memory; their "host_fits" is ANDed into fits). Built
  block by block from pandas' internals (pd.DataFrame(dict) where they are missing), the same frame. The accuracy
  comparison calls it on measured points, with device="cpu" where the measurement ran on the CPU (CPU dropout
  keeps a noise tensor of the input dtype where CUDA keeps a 1-byte mask; nothing else differs).
- `estimate_point(model=..., mode=..., batch=..., ...) -> pd.Series` and `format_breakdown(row) -> str` for
  `nnmem-sweep estimate`.

Rounding: usable = gpu_memory − ⌈headroom · gpu_memory⌉ (the margin is never smaller than asked);
overhead = context + workspace + ⌈reserve_fraction · peak⌉.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .bounds import MAXIMA, check_columns, check_frame, check_maxima
from . import columns as C
from . import cluster, serving
from .components.overhead import overhead_bytes, usable_bytes
from .components.peak import ROWS, estimate_components
from .errors import UsageError
from .fit import max_batch
from .grid import MAX_ROWS, add_gpu_columns, checked_size, expand_grid, point_axes, product_frame
from .models.arch import Architecture
from .outputs import OutputSet
from .scenario import GPUSpec, Overheads, Scenario
from .tablefile import csv_bytes, extension, write_table
from .units import format_bytes, parse_size

try:  # pandas >= 2.3; pd.DataFrame(dict) otherwise
    from pandas.api.internals import create_dataframe_from_blocks as _from_blocks
except ImportError:  # pragma: no cover - depends on the installed pandas
    _from_blocks = None
try:  # the blocks made directly where pandas' internals have these (see _frame_of_blocks)
    from pandas._libs.internals import BlockPlacement as _Placement
    from pandas.core.internals.blocks import get_block_type as _block_type
    from pandas.core.internals.managers import BlockManager as _Manager
except ImportError:  # pragma: no cover - depends on the installed pandas
    _Manager = None

CHUNK_ROWS = 2_000_000  # rows estimated at once: bounds memory on huge grids


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


def estimate_frame(arch: Architecture, mode: str, frame: pd.DataFrame, overheads: Overheads,
                   headroom: float, device: str = "cuda", *, prefill_logits: str = "last") -> pd.DataFrame:
    """The estimator on any frame of points (see the module docstring). Pure: returns a new frame.
    device="cpu" only for comparing with CPU measurements (dropout keeps noise tensors, not bool masks).
    prefill_logits (infer): "last" (generate()'s logits_to_keep=1) or "all" (every prompt position's logits).
    Any further array estimate_components returns becomes an int64 column after `fits`; a boolean array under
    "host_fits" is ANDed into `fits` instead."""
    names = tuple(frame.columns.tolist())
    read = _read_columns(frame, len(names)) if _from_blocks is not None else None
    if read is None:
        return _estimate_frame_plain(arch, mode, frame, overheads, headroom, device, prefill_logits)
    values, kinds = read
    key = (names, kinds)
    lay = _LAYOUTS.get(key, _UNSEEN)
    if lay is _UNSEEN:
        if len(_LAYOUTS) >= 64:
            _LAYOUTS.clear()
        lay = _LAYOUTS[key] = _Layout.of(*key)
    if lay is None:  # duplicated names, output columns already there (re-estimating results), odd column kinds
        return _estimate_frame_plain(arch, mode, frame, overheads, headroom, device, prefill_logits)
    given = dict(zip(names, values))
    n = len(frame)

    # The output's int64 columns are the rows of one 2-D block (the consolidated layout pd.DataFrame(dict)
    # reaches), written in place: the int64 inputs (the bound's columns first), the components and peak (the
    # estimator writes them), then overhead, total, gpu_memory and usable. Every block is a fresh array
    # (categoricals copied), so the output shares no memory with the input frame.
    buf = np.empty((lay.rows, n), dtype=np.int64)
    for r, i in enumerate(lay.int_rows):
        buf[r] = values[i]
    extent = None  # (lowest, highest) of every batch and seq_len: spares the estimator taking them again
    if n:  # refuse points whose bytes could wrap around int64 (bounds.py), on the maxima of the copied rows
        if lay.bound_rows is None:
            check_columns(arch, n, given)
        else:
            top = np.maximum.reduce(buf[:len(lay.bound_rows)], axis=1).tolist()
            check_maxima(arch, dict(zip(lay.bound_rows, top)), given.get(C.ATTENTION))
            if lay.bound_rows[:2] == [C.BATCH, C.SEQ_LEN]:
                extent = (min(np.minimum.reduce(buf[:2], axis=1).tolist()), max(top[:2]))
    c = lay.comp_row
    held = buf[c:c + len(C.COMPONENTS) + 1]
    comps = estimate_components(arch, mode, frame, device, prefill_logits=prefill_logits, _columns=given, _out=held,
                                _extent=extent)
    rows = comps.pop(ROWS, None)
    if rows is None:  # an estimate that did not write into `held` (transformer inference): copied
        for r, name in enumerate(_HELD):
            held[r] = comps.get(name, 0)
        rows = _HELD
    extra = [k for k in comps if k not in _OWN_KEYS]
    if extra and (not _COMPUTED.isdisjoint(extra) or not frozenset(extra).isdisjoint(names)):
        return _estimate_frame_plain(arch, mode, frame, overheads, headroom, device, prefill_logits)

    c += len(C.COMPONENTS)
    peak, mem = buf[c], buf[c + 3]
    mem[...] = np.asarray(values[lay.mem], dtype=np.int64)
    total = np.add(peak, overhead_bytes(peak, overheads, out=buf[c + 1]), out=buf[c + 2])
    fits = np.less_equal(total, usable_bytes(mem, headroom, out=buf[c + 4]), out=np.empty((1, n), dtype=bool)[0])
    host = comps.get(HOST_FITS)
    if host is not None:
        fits &= np.asarray(host, dtype=bool)
    if extra:
        more = np.empty((len(extra), n), dtype=np.int64)
        for r, k in enumerate(extra):
            more[r] = comps[k]  # cast to int64 as np.asarray(v, dtype=np.int64)
        buf = np.concatenate((buf, more))

    at_ints, at_phase, at_fits, columns = lay.placed(rows, tuple(extra))
    blocks = [(v.reshape(1, -1).copy() if kind == "n" else v.copy(), at)
              for v, kind, at in ((values[i], kind, at) for i, kind, at in lay.others)]
    blocks += [(comps[C.PEAK_PHASE], at_phase), (fits.reshape(1, n), at_fits), (buf, at_ints)]
    return _frame_of_blocks(blocks, frame.index, columns)


HOST_FITS = "host_fits"  # estimate_components may return it: per-row bool, ANDed into fits
_OWN_KEYS = frozenset((*C.COMPONENTS, C.PEAK_ALLOCATED, C.PEAK_PHASE, HOST_FITS))
_OUT_COLUMNS = (*C.COMPONENTS, C.PEAK_ALLOCATED, C.PEAK_PHASE, C.OVERHEAD, C.TOTAL, C.GPU_MEMORY, C.USABLE, C.FITS)
_COMPUTED = frozenset(_OUT_COLUMNS) - {C.GPU_MEMORY}  # gpu_memory_bytes is an input, moved to its place
_HELD = (*C.COMPONENTS, C.PEAK_ALLOCATED)  # the rows estimate_components may write, in the order it did not say
_INT64 = np.dtype(np.int64)
_UNSEEN = object()


def _read_columns(frame: pd.DataFrame, n_columns: int) -> tuple[list, tuple] | None:
    """(each column's values, each column's _kind) without building a Series: block by block from the frame's
    block manager (half the cost of DataFrame._iter_column_arrays, and a block's kind is decided once), else
    column by column with _iter_column_arrays; None where neither is there (pandas internals, both)."""
    values: list = [None] * n_columns
    kinds: list = [None] * n_columns
    try:
        blocks = frame._mgr.blocks
        for blk in blocks:
            v = blk.values
            at = blk.mgr_locs.indexer  # a slice or an int array
            if v.ndim == 1:  # an extension array: one column
                j = at.start if type(at) is slice else int(at[0])
                values[j] = v
                kinds[j] = "c" if type(v) is pd.Categorical else _kind(v)
                continue
            kind = _kind(v) if type(v) is np.ndarray else None  # rows of a 2-D numpy array, or datetimes
            for r, j in enumerate(range(at.start, at.stop, at.step) if type(at) is slice else at.tolist()):
                values[j] = v[r]
                kinds[j] = kind
    except AttributeError:
        read = getattr(frame, "_iter_column_arrays", None)
        if read is None:
            return None
        values = list(read())
        kinds = list(map(_kind, values))
    return values, tuple(kinds)


def _kind(v) -> str | None:
    """How the block path carries an input column: "i" an int64 row of the int block, "n" another numpy array
    (a block of its own), "c" a categorical or string array (copied); None: a kind left to pd.DataFrame(dict)
    (datetimes, sparse, nullable ints ...)."""
    if isinstance(v, np.ndarray):
        if type(v) is np.ndarray and v.dtype == _INT64:
            return "i"
        return None if v.dtype.kind in "mM" else "n"
    if (isinstance(v, pd.Categorical) or isinstance(v.dtype, pd.StringDtype)) and \
            not getattr(v.dtype, "_supports_2d", False):
        return "c"
    return None


class _Layout:
    """Where estimate_frame puts each input column of frames with these column names and kinds of values, worked
    out once per (names, kinds): ~30 us of Python per call otherwise."""

    @classmethod
    def of(cls, names: tuple[str, ...], kinds: tuple) -> "_Layout | None":
        if (len(set(names)) != len(names) or not _COMPUTED.isdisjoint(names) or C.GPU_MEMORY not in names
                or None in kinds):
            return None
        return cls(names, kinds)

    def __init__(self, names: tuple[str, ...], kinds: tuple):
        self.names = [c for c in names if c != C.GPU_MEMORY]  # the input columns, gpu_memory moves among outputs
        pos = {c: j for j, c in enumerate(self.names)}
        self.first_out = len(self.names)
        self.mem = names.index(C.GPU_MEMORY)
        ints = {c: i for i, (c, k) in enumerate(zip(names, kinds)) if k == "i" and c != C.GPU_MEMORY}
        bound = [c for c in MAXIMA if c in ints]
        # every bound column present an int64 row: one reduction over the first rows takes their maxima
        self.bound_rows = bound if all(c in ints for c in MAXIMA if c in names) else None
        self.int_rows = [ints[c] for c in bound] + [i for c, i in ints.items() if c not in bound]
        self.int_at = [pos[names[i]] for i in self.int_rows]
        self.comp_row = len(self.int_rows)
        self.rows = self.comp_row + len(_HELD) + 4  # + overhead, total, gpu_memory, usable
        self.others = [(i, k, slice(pos[c], pos[c] + 1)) for i, (c, k) in enumerate(zip(names, kinds))
                       if c not in ints and c != C.GPU_MEMORY]
        self._placed: dict[tuple, tuple] = {}

    def placed(self, rows: tuple[str, ...], extra: tuple[str, ...]):
        """(placement of the int block's rows, of peak_phase, of fits, the output's column labels)."""
        hit = self._placed.get((rows, extra))
        if hit is None:
            out = {c: self.first_out + j for j, c in enumerate(_OUT_COLUMNS)}
            at = self.int_at + [out[c] for c in (*rows, C.OVERHEAD, C.TOTAL, C.GPU_MEMORY, C.USABLE)]
            at += range(self.first_out + len(_OUT_COLUMNS), self.first_out + len(_OUT_COLUMNS) + len(extra))
            j, f = out[C.PEAK_PHASE], out[C.FITS]
            hit = self._placed[rows, extra] = (np.array(at, dtype=np.intp), slice(j, j + 1), slice(f, f + 1),
                                               pd.Index([*self.names, *_OUT_COLUMNS, *extra]))
        return hit


_LAYOUTS: dict[tuple, _Layout | None] = {}


def _frame_of_blocks(blocks: list[tuple[object, object]], index: pd.Index, columns: pd.Index) -> pd.DataFrame:
    """create_dataframe_from_blocks(blocks, index, columns) for blocks that are 2-D numpy arrays (rows, n) or 1-D
    categorical / string arrays, placements as slices or int arrays. Where pandas' internals are importable the
    blocks are made directly: create_dataframe_from_blocks infers each block's type and verifies the shapes,
    ~2 us a block, for blocks made here to fit."""
    if _Manager is None:
        return _from_blocks([(v, _as_array(at)) for v, at in blocks], index=index, columns=columns)
    made = [_block_type(v.dtype)(v, ndim=2, placement=_Placement(at)) for v, at in blocks]
    mgr = _Manager.from_blocks(made, [columns, index])
    return pd.DataFrame._from_mgr(mgr, mgr.axes)


def _as_array(at) -> np.ndarray:
    return np.arange(at.start, at.stop) if isinstance(at, slice) else at


def _totals(comps: dict, mem: np.ndarray, overheads: Overheads, headroom: float):
    """(peak, overhead, total, usable, fits): fits = total <= usable, and the host's verdict where there is one."""
    peak = np.asarray(comps[C.PEAK_ALLOCATED], dtype=np.int64)
    over = overhead_bytes(peak, overheads)
    total = peak + over
    usable = usable_bytes(mem, headroom)
    fits = total <= usable
    host = comps.get(HOST_FITS)
    if host is not None:
        fits &= np.asarray(host, dtype=bool)
    return peak, over, total, usable, fits


def _estimate_frame_plain(arch, mode, frame, overheads, headroom, device, prefill_logits) -> pd.DataFrame:
    """estimate_frame's output built with pd.DataFrame(dict): where pandas lacks create_dataframe_from_blocks, or
    for frames with duplicated column names or columns of kinds the block path does not handle."""
    check_frame(arch, frame)
    comps = estimate_components(arch, mode, frame, device, prefill_logits=prefill_logits)
    mem = frame[C.GPU_MEMORY].to_numpy(dtype=np.int64)
    peak, over, total, usable, fits = _totals(comps, mem, overheads, headroom)
    out = {c: frame[c] for c in frame.columns if c != C.GPU_MEMORY}
    for c in C.COMPONENTS:
        v = comps.get(c)
        out[c] = np.zeros(len(frame), dtype=np.int64) if v is None else np.asarray(v, dtype=np.int64)
    out[C.PEAK_ALLOCATED] = peak
    out[C.PEAK_PHASE] = comps[C.PEAK_PHASE]
    out[C.OVERHEAD] = over
    out[C.TOTAL] = total
    out[C.GPU_MEMORY] = mem
    out[C.USABLE] = usable
    out[C.FITS] = fits
    for k in comps:
        if k not in _OWN_KEYS:
            out[k] = np.asarray(comps[k], dtype=np.int64)
    return pd.DataFrame(out, index=frame.index, copy=False)


def _progress(enabled: bool, start: float, done: int, total: int) -> None:
    if enabled and time.perf_counter() - start > 1.0:
        print(f"\rnnmem-sweep: {done:,}/{total:,} rows ({100 * done / max(total, 1):.0f}%)", end="",
              file=sys.stderr, flush=True)


def run_scenario(sc: Scenario, max_rows: int = MAX_ROWS, progress: bool = False) -> RunResult:
    start = time.perf_counter()
    grid = expand_grid(sc, max_rows=max_rows)
    n = len(grid)
    logits = serving.sweep_prefill_logits(sc)
    parts = []
    for lo in range(0, n, CHUNK_ROWS):
        parts.append(estimate_frame(sc.model, sc.mode, grid.iloc[lo:lo + CHUNK_ROWS], sc.overheads, sc.headroom,
                                    prefill_logits=logits))
        _progress(progress, start, min(lo + CHUNK_ROWS, n), n)
    results = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    results.insert(0, C.MODE, pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[sc.mode]))
    results.insert(0, C.MODEL, pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[sc.model.name]))

    points = add_gpu_columns(product_frame(point_axes(sc), tuple(g.id for g in sc.gpus)), sc)
    mb = max_batch(sc.model, sc.mode, points, sc.overheads, sc.headroom, prefill_logits=logits)
    tables = dict(plan_tables(sc))
    elapsed = time.perf_counter() - start
    if progress and elapsed > 1.0:
        print(f"\rnnmem-sweep: {n:,} rows in {elapsed:.1f} s" + " " * 10, file=sys.stderr)
    return RunResult(sc, results, mb, elapsed, *(tables.get(name) for name in PLAN_FILES))


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
    """The run's tables into an open output set: results and max_batch as `fmt` (csv or parquet), the plans always
    as CSV (a few rows each). Every CSV through tablefile's one writer."""
    ext = extension(fmt)
    for name, frame in output_tables(result):
        if name in ("results.csv", "max_batch.csv"):
            with dest.open(name.removesuffix(".csv") + ext) as f:
                write_table(frame, f, fmt)
        else:
            dest.write_bytes(name, csv_bytes(frame))


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
        write_tables(run_scenario(sc, max_rows=max_rows, progress=progress), s, fmt)
    return s.paths


# ---------------------------------------------------------------- one point, for `nnmem-sweep estimate`

def _resolve_model(model: str | Architecture) -> Architecture:
    if isinstance(model, Architecture):
        return model
    path = Path(model)
    if path.suffix == ".json" and path.is_file():
        import json

        from .models.hf import architecture_from_hf

        try:
            return architecture_from_hf(json.loads(path.read_text(encoding="utf-8")), origin=str(path))
        except (ValueError, KeyError) as e:
            raise UsageError(f"--model {model}: {e}") from None
    from .models.presets import load_preset, preset_ids

    try:
        return load_preset(model)
    except (ValueError, KeyError, FileNotFoundError):
        raise UsageError(f"unknown model {model!r}: give a preset id ({', '.join(preset_ids())}) "
                         "or a path to a config.json") from None


def _resolve_gpu(gpu: str | GPUSpec) -> GPUSpec:
    if isinstance(gpu, GPUSpec):
        return gpu
    from .catalog.gpus import get_gpu

    try:
        return get_gpu(gpu)
    except ValueError as e:
        raise UsageError(str(e)) from None


def default_overheads() -> tuple[Overheads, float]:
    from . import config

    ov = Overheads(parse_size(config.DEFAULT_CUDA_CONTEXT), parse_size(config.DEFAULT_CUBLAS_WORKSPACE),
                   float(config.DEFAULT_ALLOCATOR_RESERVE))
    return ov, float(config.DEFAULT_HEADROOM)


def estimate_point(*, model: str | Architecture, mode: str = "train", batch: int = 1, seq_len: int = 2048,
                   precision: str = "bf16-mixed", optimizer: str | None = "adamw",
                   optimizer_impl: str | None = "foreach", checkpointing: str = "none", attention: str = "flash",
                   gpu: str | GPUSpec = "h100-sxm", cache_tokens: int | None = None,
                   decode_tokens: int | None = None, overheads: Overheads | None = None,
                   headroom: float | None = None) -> pd.Series:
    """One row of the estimator for the given values; bad names raise UsageError (one line)."""
    from .catalog import names
    from .catalog.optimizers import get_optimizer
    from .catalog.precisions import get_precision

    if mode not in names.MODES:
        raise UsageError(f"unknown mode {mode!r}; use train or infer")
    arch = _resolve_model(model)
    spec = _resolve_gpu(gpu)
    get_precision(precision)
    if mode == "infer":
        optimizer, optimizer_impl = names.OPTIMIZER_NONE, names.OPTIMIZER_NONE
    else:
        get_optimizer(optimizer)
        if optimizer_impl not in names.OPTIMIZER_IMPLS:
            raise UsageError(f"unknown optimizer_impl {optimizer_impl!r}; use {', '.join(names.OPTIMIZER_IMPLS)}")
    if checkpointing not in names.CHECKPOINTING:
        raise UsageError(f"unknown checkpointing {checkpointing!r}; use {', '.join(names.CHECKPOINTING)}")
    if attention not in names.ATTENTION:
        raise UsageError(f"unknown attention {attention!r}; use {', '.join(names.ATTENTION)}")
    for label, v in (("batch", batch), ("seq_len", seq_len)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise UsageError(f"{label} must be a positive integer, got {v!r}")
    cache_tokens = 0 if cache_tokens is None else cache_tokens
    decode_tokens = (1 if mode == "infer" else 0) if decode_tokens is None else decode_tokens
    if cache_tokens < 0 or decode_tokens < 0:
        raise UsageError("cache_tokens and decode_tokens must not be negative")
    if overheads is None or headroom is None:
        d_ov, d_head = default_overheads()
        overheads = overheads or d_ov
        headroom = d_head if headroom is None else headroom
    frame = pd.DataFrame({
        C.BATCH: [batch], C.SEQ_LEN: [seq_len], C.PRECISION: [precision], C.OPTIMIZER: [optimizer],
        C.OPTIMIZER_IMPL: [optimizer_impl], C.CHECKPOINTING: [checkpointing], C.ATTENTION: [attention],
        C.CACHE_TOKENS: [cache_tokens], C.DECODE_TOKENS: [decode_tokens], C.GPU: [spec.id],
        C.GPU_MEMORY: [spec.memory_bytes],
    })
    row = estimate_frame(arch, mode, frame, overheads, headroom).iloc[0].copy()
    row[C.MODEL] = arch.name
    row[C.MODE] = mode
    row["gpu_name"] = spec.name
    return row


def format_breakdown(row: pd.Series) -> str:
    """A readable table: every component (GiB and exact bytes), the peak phase, total, capacity, fits and margin."""
    labels = {
        C.WEIGHTS: "weights", C.MASTER_WEIGHTS: "master weights", C.GRADIENTS: "gradients",
        C.OPTIMIZER_STATE: "optimizer state", C.ACTIVATIONS: "activations", C.KV_CACHE: "KV cache",
        C.TEMPORARY: "temporaries",
    }
    lines = []
    head = f"{row.get(C.MODEL, '')}  {row.get(C.MODE, '')}  batch {row[C.BATCH]}  seq {row[C.SEQ_LEN]}  " \
           f"{row[C.PRECISION]}"
    if row.get(C.MODE) == "train":
        head += f"  {row[C.OPTIMIZER]} ({row[C.OPTIMIZER_IMPL]})  checkpointing {row[C.CHECKPOINTING]}"
    else:
        head += f"  cache_tokens {row[C.CACHE_TOKENS]}  decode_tokens {row[C.DECODE_TOKENS]}"
    head += f"  attention {row[C.ATTENTION]}"
    lines.append(head)
    lines.append(f"{'component':<36}{'GiB':>12}{'bytes':>22}")

    def line(label: str, v: int) -> str:
        return f"{label:<36}{format_bytes(int(v), 'GiB', 3)[:-4]:>12}{int(v):>22,}"

    for c in C.COMPONENTS:
        lines.append(line(labels[c], row[c]))
    lines.append(line(f"peak allocated (at {row[C.PEAK_PHASE]})", row[C.PEAK_ALLOCATED]))
    lines.append(line("overhead (context, cuBLAS, reserve)", row[C.OVERHEAD]))
    lines.append(line("total", row[C.TOTAL]))
    gpu = row.get("gpu_name", row.get(C.GPU, ""))
    lines.append(line("GPU capacity (as the device reports)", row[C.GPU_MEMORY]))
    lines.append(line("usable (after headroom)", row[C.USABLE]))
    margin = int(row[C.USABLE]) - int(row[C.TOTAL])
    verdict = f"fits, {format_bytes(margin, 'GiB', 3)} to spare" if row[C.FITS] else \
        f"does NOT fit: {format_bytes(-margin, 'GiB', 3)} short"
    lines.append(f"{verdict}  on {gpu}")
    return "\n".join(lines)
