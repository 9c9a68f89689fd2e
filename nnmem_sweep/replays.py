"""The allocator reserve of a scenario from replays where the verdict is decided (issue 13).

Replaying a step's allocation sequence through the caching-allocator model (components/reserve.py, allocator/)
costs tens of thousands of events in Python per replay, so not every row is replayed. Per recipe (the non-batch,
non-GPU axes) one row is: the largest batch that fits on any of the scenario's GPUs (found with the default
reserve). A step "fits" when it completes in the allocator model within the capacity it is given; PyTorch's
allocator frees its cached segments and retries when a segment does not fit (`release_cached_blocks`), so what a
step needs is less than the peak it reserves when memory is plentiful. The least capacity with which the row
completes is found by bisection (to 1/RESOLUTION of its peak; completing is taken as monotone in the capacity), and

    f(recipe) = (least capacity that completes − peak_allocated) / peak_allocated

is the reserve of every row of the recipe (`Overheads.replayed_by_recipe`); the largest of them is the reserve of
any recipe not replayed (`Overheads.replayed_reserve_fraction`). A training row is replayed a second time with the
optimizer state made before the first step (a run resumed from a checkpoint) instead of inside it (a fresh run, the
estimate's): the two, a bisection step either side, are the recipe's band of what a real GPU may need
(`Overheads.replayed_band_by_recipe`, report/uncertainty.py). The report says how many rows were replayed and
the range they gave. `reserved_bytes` is therefore the memory the allocator needs for the step, not what
max_memory_reserved() shows on a GPU with memory to spare (the unlimited replay's peak, larger).

A hand-modelled preset is replayed through its derived twin (the same preset planned from its own code,
`model: {preset: ..., derive: true}`; both paths agree to the byte on the committed cases) when the twin's plans
are stored (`make derive` ships those of the configs/ scenarios); the twin's reserve fraction is applied to the
hand model's peak. Not replayed: a reserve given in `overheads:` (it stands), a model without a stored traced
sequence (fine-tuned adapters, layer lists, params models, plans not derived; components/reserve.py says why for
each row) or a parallel layout (the traces are of one GPU's step); those keep the default, labelled "not replayed".

Each bisection is kept in the user's cache; the shipped scenarios' (configs/) ship with the package
(SHIPPED_REPLAYS), keyed by their very sequence, so a user's first run of one bisects nothing.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gzip
import hashlib
import json
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from .testhook import checkpoint
from . import columns as C
from .allocator import AllocatorOptions, prepare, replay
from .allocator.rules import TORCH_ALLOCATOR
from .citations import formula
from .components.reserve import STREAMS_NOTE, row_sequences
from .components.runtime import large_cublas_workspace_bytes
from .derive import DerivationError
from .derive import zero_rows as zr
from .derive.arch import derived_twin
from .parallel.layout import FSDP1_OFFLOAD_GAP, deepspeed_layouts, fsdp_only, fsdp_versions
from .derive.cache import FORMAT as PLAN_FORMAT, memo_read, memo_write, versions
from .errors import UsageError
from .fit import scenario_max_batch
from .grid import point_axes
from .scenario import DEFAULT_ALLOCATOR_RESERVE, Scenario

MAX_ROWS = 256  # recipes replayed at most (a bisection: 3-8 replays of ~0.05 s for an 8B model, then cached)
RESOLUTION = 200  # the bisection stops within 0.5 % of the peak; f is rounded up to a multiple of 1 / RESOLUTION
FIRST_PROBE = 4  # the first capacity tried: 2 % above the peak
DEFAULT_NOTE = ("a default; the replays of the shipped scenarios needed 0.5-32.5 % of the peak (Llama 3.1 8B: 97 of "
                "163 recipes under 8 %; full checkpointing with 8-bit AdamW or Adafactor the most): verify such "
                "recipes by measuring")

# DeepSpeed's ZeRO-1/2 rows are replayed from their rank's step traced with DeepSpeed's engine at the row's shape
# (_deepspeed_rows: after `nnmem-sweep derive CONFIG`, or shipped); ZeRO-3's, which no fake run can trace, what a GPU
# measured of their kind (zero_rows.measured_zero3), else the largest of those. Its own measured steps
# (tests/data/truth/deepspeed/sequences: two steps, both end ranks of each case), replayed as a scenario's recipes
# are, needed this span of the peak (tests/test_deepspeed_reserve.py), the most where the optimizer step peaks: it makes
# AdamW's state in a pool the backward left; the decision page's band for a DeepSpeed row beside its own replay
DEEPSPEED_RESERVE_SPAN = (0.005, 0.171)
# the rows the span stands for: the measured cases' stages and recipes (ZeRO-3's steps gather and release parameters
# in patterns none of these sequences has)
DEEPSPEED_MEASURED_RECIPE = {C.ZERO_STAGE: ("1", "2"), C.OPTIMIZER: ("adamw",), C.CHECKPOINTING: ("none", "full"),
                             C.OFFLOAD: ("none",)}
# ZeRO-Offload's steps (offload optimizer at ZeRO-1/2) needed more: the fresh runs of its 12 measured cases on both end
# ranks (tests/test_deepspeed_offload.py holds the span to them), the most at ZeRO-1 over 4 ranks at 64 tokens (the
# fp64 copy of each gradient requested among the freed gradients' blocks)
DEEPSPEED_OFFLOAD_SPAN = (0.005, 0.274)
DEEPSPEED_OFFLOAD_RECIPE = {**DEEPSPEED_MEASURED_RECIPE, C.OFFLOAD: ("optimizer",)}
DEEPSPEED_NOTE = (
    "not replayed: no DeepSpeed row's step is traced at its shape (`nnmem-sweep derive CONFIG` traces ZeRO-1/2's, "
    "DeepSpeed installed); DeepSpeed's own ZeRO-1/2 steps, replayed from their measured allocation sequences (fresh "
    "runs of its 24 measured cases: full fine-tunes and LoRA of Llama 3.2 1B, full of Llama 3.1 8B and Mistral 7B, "
    "64-4,096 tokens, without and with full checkpointing, with and without accumulation or overlap_comm, both end "
    "ranks, with the two cuBLAS workspaces a CUDA run makes: an H100 measured one of them within 0.2 %), needed "
    f"{100 * DEEPSPEED_RESERVE_SPAN[0]:.1f}-{100 * DEEPSPEED_RESERVE_SPAN[1]:.1f} % of the peak, the most where the "
    "optimizer step peaks (its first step makes AdamW's state in the pool the backward left): the reserve assumed is "
    "the default, the decision page's band that span for ZeRO-1/2 rows of their recipes (AdamW, no or full "
    "checkpointing, no offload; ZeRO-Offload's of those recipes what its own 12 measured cases needed, "
    f"{100 * DEEPSPEED_OFFLOAD_SPAN[0]:.1f}-{100 * DEEPSPEED_OFFLOAD_SPAN[1]:.1f} %; others, ZeRO-3's included, the "
    "one-GPU range, 0.5-32.5 %); verify such rows by measuring")


def boundary_rows(sc: Scenario, mb: pd.DataFrame) -> pd.DataFrame:
    """Per recipe the largest batch that fits any GPU (with its GPU), from the scenario's max-batch table `mb`
    (estimated with the default reserve); the largest batches first, at most MAX_ROWS."""
    recipe = [c for c in point_axes(sc) if c in mb.columns and c != C.GPU]
    fit = mb[mb[C.MAX_BATCH] > 0]
    best = fit.sort_values(C.MAX_BATCH, ascending=False, kind="stable").drop_duplicates(recipe)
    out = best.assign(**{C.BATCH: best[C.MAX_BATCH]})[recipe + [C.GPU, C.BATCH]].head(MAX_ROWS)
    # each row's own values, not the grid's categories (a derived plan refuses a category it does not plan even where
    # the row does not use it)
    cats = [c for c in out.columns if isinstance(out[c].dtype, pd.CategoricalDtype)]
    return out.astype({c: out[c].cat.categories.dtype for c in cats}).reset_index(drop=True)


@formula("replayed_reserve_fraction", "(C_min − P) / P, C_min = the least capacity within which the step's "
         "allocation sequence completes in the caching-allocator model (bisection to P / 200)", TORCH_ALLOCATOR,
         where="DeviceCachingAllocator::malloc: on a failed cudaMalloc, release_cached_blocks and retry",
         note="P: the sequence's peak of live bytes (the estimate's peak_allocated_bytes); per recipe at its largest "
         "batch that fits, as a fresh run (optimizer state made in the first step); the larger C_min of the two "
         "orders of segment addresses (ties between equal free blocks fall to the lowest address, and the driver "
         "chooses where a segment goes: an H100's eager-attention run needed the falling order's least capacity, "
         "3 % more)")
def least_capacity(seq: np.ndarray, options: AllocatorOptions, engine: str = "auto") -> tuple[int, int]:
    """(peak allocated, the least capacity within which the sequence completes, to 1/RESOLUTION of the peak, in
    both orders of the segments' addresses: the larger). The first probe is FIRST_PROBE steps above the peak (most
    recipes need less); else the bracket reaches up to the peak reserved with nothing refused, which always
    completes. The falling order costs one replay at the rising order's need, and a bisection only where it does
    not complete there. engine: allocator.replay's (the compiled one where it applies; "model" the reference)."""
    peak = int(np.cumsum(seq[:, 1]).max())
    step = max(peak // RESOLUTION, 1)
    seq = prepare(seq)  # checked once, replayed several times

    def fails(cap: int | None, descending: bool = False):  # the replay's result, None where it completed
        r = replay(seq, options, capacity_bytes=cap, engine=engine, descending=descending)
        return r if r.oom else None

    low, high = peak - 1, peak + FIRST_PROBE * step  # low cannot complete: less than what is live at once
    if fails(high):
        low, high = high, replay(seq, options, engine=engine).peak_reserved_bytes
    high = _bisect(fails, low, high, step)
    if fails(high, True):
        high = _bisect(lambda cap: fails(cap, True), high,
                       replay(seq, options, engine=engine, descending=True).peak_reserved_bytes, step)
    return peak, high


def _bisect(fails, low: int, high: int, step: int) -> int:
    """The least capacity in (low, high] for which `fails(cap)` is false (`low` fails, `high` does not), to
    `step`."""
    while high - low > step:
        mid = (low + high) // 2
        if fails(mid):
            low = mid
        else:
            high = mid
    return high


@functools.cache
def _code_digest() -> str:
    """The code a replay's result depends on (the allocator model, how a row's sequence is built, how events are
    stored): a cached result is recomputed when any of it changes. Not allocator/snapshot.py, which reads real
    GPUs' recordings and replays nothing of a row's."""
    root = Path(__file__).resolve().parent
    files = sorted(p for p in (root / "allocator").glob("*.py") if p.name != "snapshot.py") + \
        [root / "components" / "reserve.py", root / "derive" / "events.py"]
    return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()


def _replay_rows(arch, mode: str, jobs: list[tuple[dict, bool]], options: AllocatorOptions,
                 progress: bool = False) -> list[tuple[str, float | None]]:
    """(note, the reserve fraction the row needs) of each job (a row {axis: value}, lazy_state), in order; None where
    the row has no traced sequence. lazy_state: the optimizer state made inside the first step (a fresh run), else
    before it (a run resumed from a checkpoint). Each bisection is kept in the user's cache (derive/cache.py), keyed
    by the model's source, the row, the options, the installed versions and the code: a cached row costs no sequence
    to build. The others' sequences are built together (their plans read once), then bisected on as many threads as
    the machine has cores (at most 4): the compiled replay runs outside the GIL."""
    # the plans' FORMAT too: a plan derived under other rules has another sequence for the same source
    keys = [json.dumps([arch.derived.source.digest(), mode, {c: str(v) for c, v in row.items()}, lazy,
                        repr(options), RESOLUTION, FIRST_PROBE, _code_digest(), _versions(), PLAN_FORMAT])
            for row, lazy in jobs]
    docs = [None if _shipping else memo_read("replays", k) for k in keys]
    todo = [i for i, d in enumerate(docs) if d is None]
    for lazy in (True, False):
        part = [i for i in todo if jobs[i][1] is lazy]
        if not part:
            continue
        seqs = row_sequences(arch, mode, pd.DataFrame([jobs[i][0] for i in part]), lazy_state=lazy)
        checkpoint("replay")
        start, done = time.perf_counter(), [0]

        def bisect(i_seq):
            i, (note, seq) = i_seq
            doc = None
            if seq is not None:  # a row without a sequence is not kept: a plan derived later has it
                key = sequence_key(seq, options)
                found = shipped_replays().get(key) or dict(zip(("peak", "need"), least_capacity(seq, options)))
                if _shipping:
                    _shipping[0][key] = found
                doc = dict(found, note=note)
                memo_write("replays", keys[i], doc)
            done[0] += 1
            if progress and time.perf_counter() - start > 1.0:
                print(f"\rnnmem-sweep: replaying the allocator model: {done[0]:,}/{len(part):,} "
                      f"{'fresh' if lazy else 'resumed'} runs (cached afterwards)", end="", file=sys.stderr,
                      flush=True)
            return doc or {"note": note}

        workers = min(4, os.cpu_count() or 1, len(part))
        pool = ThreadPoolExecutor(workers)
        try:
            futures = [pool.submit(bisect, job) for job in zip(part, seqs)]
            for i, f in zip(part, futures):
                while True:  # in slices: a signal's handler runs in this thread only when it next runs
                    try:
                        docs[i] = f.result(timeout=0.2)
                        break
                    except FuturesTimeout:
                        continue
        finally:  # stopped: the queued bisections are dropped, the running ones end on their own (seconds)
            pool.shutdown(wait=False, cancel_futures=True)
        if progress and time.perf_counter() - start > 1.0:
            print("\r" + " " * 90 + "\r", end="", file=sys.stderr, flush=True)
    return [(d["note"], (d["need"] - d["peak"]) / max(d["peak"], 1) if "need" in d else None) for d in docs]


_tracing_deepspeed: list[bool] = []  # inside tracing_deepspeed(): a DeepSpeed row not traced yet is traced


@contextlib.contextmanager
def tracing_deepspeed() -> Iterator[None]:
    """DeepSpeed rows whose step is neither shipped nor cached are traced inside (`nnmem-sweep derive CONFIG`)."""
    _tracing_deepspeed[:] = [True]
    try:
        yield
    finally:
        _tracing_deepspeed.clear()


def _deepspeed_rows(twin, mode: str, jobs: list[tuple[dict, bool]], options: AllocatorOptions,  # noqa: ARG001
                    progress: bool = False) -> list[tuple[str, float | None]]:
    """_replay_rows for DeepSpeed's layouts: a ZeRO-1/2 row's rank step traced with DeepSpeed's own engine at the
    row's shape on both end ranks (derive/zero_sequence.py; `twin`'s config), bisected, the larger need against the
    larger peak; a resumed run is not traced (None). Each result is kept in the user's cache and shipped like the
    others, keyed by the case, the DeepSpeed release and the code; traced only inside tracing_deepspeed(), with that
    release installed (a run without it reads what is shipped or cached)."""
    from .derive import zero_sequence as zs

    out: list[tuple[str, float | None]] = []
    for i, (row, fresh) in enumerate(jobs):
        measured = zr.measured_zero3(zr.adapters(twin), row, DEFAULT_ALLOCATOR_RESERVE) if fresh else None
        if measured is not None:  # ZeRO-3: what a GPU measured of its kind of step (`twin` may be the model itself)
            out.append((measured[1], measured[0]))
            continue
        case, why = (zr.row_case(twin.derived.source, row) if twin.derived is not None else
                     (None, f"no derived twin of {twin.name} is stored")) if fresh else (None, "")
        if case is None:
            out.append((f"not replayed: {why}" if why else "", None))
            continue
        key = "deepspeed:" + hashlib.sha256(json.dumps(
            [case, zr.DEEPSPEED_VERSION, zs.code_digest(), large_cublas_workspace_bytes(), repr(options), RESOLUTION,
             FIRST_PROBE, _code_digest()],
            sort_keys=True).encode()).hexdigest()
        doc = shipped_replays().get(key) or memo_read("replays", key)
        if doc is None and _tracing_deepspeed:
            if not zr.ready():
                raise UsageError(f"tracing a DeepSpeed row needs DeepSpeed {zr.DEEPSPEED_VERSION} installed (found "
                                 f"{zr.installed() or 'none'}): {zr.INSTALL}")
            if progress:
                print(f"nnmem-sweep: tracing DeepSpeed's step at row {i + 1} of {len(jobs)} (both end ranks)",
                      file=sys.stderr, flush=True)
            try:
                seqs = zr.end_rank_sequences(case, large_cublas_workspace_bytes())
            except DerivationError as e:  # past its budget, or the engine failed: one line
                raise UsageError(str(e)) from None
            ranks = [least_capacity(seq, options) for seq in seqs.values()]
            doc = {"peak": max(p for p, _ in ranks), "need": max(n for _, n in ranks), "deepspeed": zr.installed()}
            memo_write("replays", key, doc)
        if doc is None:
            out.append(("not replayed: its DeepSpeed step is not traced yet (`nnmem-sweep derive CONFIG` traces it, "
                        f"DeepSpeed {zr.DEEPSPEED_VERSION} installed)", None))
            continue
        if _shipping:
            _shipping[0][key] = doc
        out.append((f"traced with DeepSpeed {doc['deepspeed']}", (doc["need"] - doc["peak"]) / max(doc["peak"], 1)))
    return out


# The replays of the shipped scenarios (configs/), shipped beside the derived twins' plans (issue 20: a user's first
# `make report` bisects nothing): each least capacity keyed by the sha256 of the very sequence it was bisected on, the
# options and the allocator code, so a shipped result is used only for the same sequence under the same code.
# `nnmem-sweep derive configs/*.yaml --ship` writes them (ship.derive_scenarios); tests/test_replays_shipped.py holds
# them current.
SHIPPED_REPLAYS = Path(__file__).resolve().parent / "models" / "derived" / "replays.json.gz"
_shipping: list[dict[str, dict]] = []  # in shipping(): one dict, every replay's result by sequence_key


def sequence_key(seq: np.ndarray, options: AllocatorOptions) -> str:
    """What a least capacity depends on: the sequence's events, the allocator's options and code, the bisection's."""
    h = hashlib.sha256(np.ascontiguousarray(seq, dtype=np.int64).tobytes())
    h.update(json.dumps([list(seq.shape), repr(options), RESOLUTION, FIRST_PROBE, _code_digest()]).encode())
    return h.hexdigest()


def _shipped_groups() -> dict[str, dict[str, dict]]:
    """{what was run (a config's path): {sequence_key: {"peak", "need"}}} as shipped (empty where there is none)."""
    try:
        return json.loads(gzip.decompress(SHIPPED_REPLAYS.read_bytes()))["replays"]
    except (OSError, ValueError, EOFError, KeyError):
        return {}


@functools.cache
def shipped_replays() -> dict[str, dict]:
    """{sequence_key: {"peak", "need"}} shipped with the package, every group's."""
    return {k: v for group in _shipped_groups().values() for k, v in group.items()}


@contextlib.contextmanager
def shipping() -> Iterator[dict[str, dict]]:
    """The results of every replay run inside, by sequence_key, the user's cache unread (so each sequence is built
    and keyed): what ship_groups() ships for a shipped scenario (ship.ship_replays)."""
    _shipping[:] = [{}]
    try:
        yield _shipping[0]
    finally:
        _shipping.clear()


def ship_groups(groups: dict[str, dict[str, dict]]) -> None:
    """SHIPPED_REPLAYS with these groups replaced (a config shipped alone leaves the others' as they are)."""
    doc = {"format": 1, "replays": {**_shipped_groups(), **groups}}
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    SHIPPED_REPLAYS.write_bytes(gzip.compress(data, mtime=0))
    shipped_replays.cache_clear()


@functools.cache
def _versions() -> tuple:
    return tuple(sorted(versions().items()))


def point_reserve(arch, mode: str, row: pd.Series, lazy_state: bool = True, allow_deriving: bool = False,
                  alloc_conf: str = "") -> tuple[float | None, str]:
    """The reserve one point (an `estimate_point` row) needs as a fresh run (or, lazy_state=False, as a run
    resumed from a checkpoint), replayed like a scenario's recipe under `alloc_conf` (PYTORCH_CUDA_ALLOC_CONF text;
    "" the defaults); (None, why) where no traced sequence is stored (allow_deriving: a hand-modelled preset's
    twin is derived when it is not)."""
    twin = derived_twin(arch, allow_deriving)
    options = AllocatorOptions.from_alloc_conf(alloc_conf) if alloc_conf else AllocatorOptions()
    if C.REDUCE_BUCKET in row.index and int(row[C.REDUCE_BUCKET]) > 0:  # its rank's step traced (_deepspeed_rows)
        ((note, frac),) = _deepspeed_rows(twin or arch, mode, [(row.to_dict(), lazy_state)], options)
        return (None, note) if frac is None else (_rounded(frac), note)
    if twin is None:
        return None, f"not replayed: no traced allocation sequence of {arch.name} is stored"
    # a sharded point's rank (data_parallel, zero_stage, fsdp_version, FSDP1's offload and prefetch) replays its rank's
    # own traced sequence (and an accumulating point's micro-batches, which keep its gradients:
    # derived.with_kept_gradients)
    axes = [a for a in (*C.GRID_AXES, C.ZERO_GRAD, C.DATA_PARALLEL, C.ZERO_STAGE, C.FSDP_VERSION, C.OFFLOAD,
                        C.BACKWARD_PREFETCH, C.GRADIENT_ACCUMULATION, C.GRADIENT_SYNC) if a in row.index]
    ((note, frac),) = _replay_rows(twin, mode, [(row[axes].to_dict(), lazy_state)], options)
    if frac is None:
        return None, note
    return _rounded(frac), note


def _span(values) -> str:
    lo, hi = 100 * min(values), 100 * max(values)
    return f"{hi:.1f} %" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f} %"


def reserved(sc: Scenario, progress: bool = False, bands: bool = True) -> tuple[Scenario, pd.DataFrame]:
    """(`sc` with the reserve its replays give, its max-batch table with that reserve): the table estimated with the
    default reserve, refine() on it, and the table estimated again where the reserve changed (run_scenario and
    run --stream)."""
    first = scenario_max_batch(sc)
    out = refine(sc, first, progress, bands)
    return out, (first if out.overheads == sc.overheads else scenario_max_batch(out))


def with_replayed_reserve(sc: Scenario, progress: bool = False, bands: bool = True) -> Scenario:
    """`sc` with the reserve its replays give, without reserved()'s tables (run --stream writes its own in chunks):
    the default reserve's table is estimated only where there is something to replay."""
    return refine(sc, scenario_max_batch(sc) if _replayable(sc)[0] else None, progress, bands)


def traced_ranks(sc: Scenario) -> bool:
    """Whether the ranks of the scenario's parallel layouts have traced steps to replay: a model planned from its
    own code over data-parallel ranks (FSDP, or DDP's whole step), a hand-modelled family's FSDP layouts (zero_stage
    2 or 3) through its derived twin's rank."""
    if not fsdp_only(sc.parallel):
        return False
    return sc.model.kind == "derived" or (all(int(z) >= 2 for z in sc.parallel.get(C.ZERO_STAGE, (0,)))
                                          and set(sc.parallel.get(C.OFFLOAD, ("none",))) == {"none"})


def _replayable(sc: Scenario):
    """(whether the scenario's reserve is replayed, its twin or the note saying why not)."""
    ov = sc.overheads
    if ov.allocator_reserve_fraction is not None or ov.replayed_reserve_fraction is not None or ov.reserve_note:
        return False, None
    if sc.parallel and deepspeed_layouts(sc.parallel):  # its rank steps traced at the rows' shapes (_deepspeed_rows)
        twin = derived_twin(sc.model)  # or, without one, ZeRO-3 rows of a kind a GPU measured (zr.measured_kind)
        measured = 3 in map(int, sc.parallel.get(C.ZERO_STAGE, ())) and \
            zr.measured_kind(zr.adapters(sc.model), DEFAULT_ALLOCATOR_RESERVE) is not None
        return (False, DEEPSPEED_NOTE) if twin is None and not measured else (True, twin or sc.model)
    if sc.parallel and not traced_ranks(sc):
        # a traced sequence is one GPU's whole step, not a rank's share of a layout (FSDP's layouts: their rank's
        # step is traced, a hand-modelled family's by its derived twin: `nnmem-sweep derive CONFIG`)
        return False, ("not replayed: the traced allocation sequences are of one GPU, not of a parallel layout's "
                       "rank; " + DEFAULT_NOTE)
    twin = derived_twin(sc.model)
    if twin is None:
        return False, f"not replayed: no traced allocation sequence of {sc.model.name} is stored; {DEFAULT_NOTE}"
    return True, twin


def refine(sc: Scenario, mb: pd.DataFrame | None, progress: bool = False, bands: bool = True) -> Scenario:
    """`sc` with the reserve its replays give, or a note saying why none was replayed: per recipe the row at its
    largest batch that fits (`mb`: the max-batch table estimated with the default reserve) is bisected as a fresh
    run, the reserve of every row of the recipe; with `bands` (what the report's uncertainty reads) as a resumed run
    too, the other end of the recipe's band. progress: a line on stderr while replays not yet in the cache take
    more than a second."""
    ok, twin = _replayable(sc)
    ov = sc.overheads
    if not ok:
        return sc if twin is None else dataclasses.replace(sc, overheads=dataclasses.replace(ov, reserve_note=twin))
    rows = boundary_rows(sc, mb)
    options = AllocatorOptions.from_alloc_conf(ov.allocator_conf) if ov.allocator_conf else AllocatorOptions()
    recipe = [c for c in rows.columns if c not in (C.GPU, C.BATCH)]
    records = rows.to_dict("records")
    jobs = [(row, True) for row in records] + \
        ([(row, False) for row in records] if sc.mode == "train" and bands else [])
    deepspeed = bool(sc.parallel) and deepspeed_layouts(sc.parallel)
    results = (_deepspeed_rows if deepspeed else _replay_rows)(twin, sc.mode, jobs, options, progress)
    fresh_of = results[:len(records)]
    resumed_of = results[len(records):] or fresh_of
    replayed: list[tuple[tuple[str, ...], float, float, float]] = []  # boundary_rows gives one row per recipe
    skipped = []
    for row, (note, fresh), (_, resumed) in zip(records, fresh_of, resumed_of):
        if fresh is None:
            skipped.append(note)
            continue
        # the band: the same step with the optimizer state made before the first step (a resumed run) instead
        resumed = fresh if resumed is None else resumed
        low = max(_rounded(min(fresh, resumed)) - 1 / RESOLUTION, 0.0)
        replayed.append((tuple(str(row[c]) for c in recipe), _rounded(fresh), round(low, 6),
                         _rounded(max(fresh, resumed))))
    if not replayed:
        note = f"{skipped[0] if skipped else 'no row fits any GPU: nothing replayed'}; {DEFAULT_NOTE}"
        if deepspeed:
            note = f"{DEEPSPEED_NOTE}{f' ({skipped[0]})' if skipped else ''}"
        return dataclasses.replace(sc, overheads=dataclasses.replace(ov, reserve_note=note))
    conf = (f"PYTORCH_CUDA_ALLOC_CONF={ov.allocator_conf}" if ov.allocator_conf
            else "PyTorch's default allocator settings")
    fsdp2 = bool(sc.parallel) and 2 in fsdp_versions(sc.parallel) and not deepspeed
    if fsdp2 and any(STREAMS_NOTE in note for note, _ in results):
        conf += ("; a rank's own sequence of its FSDP2 step, each block in the pool of the stream FSDP2 allocates it "
                 "on (the all-gather copy-in and reduce-scatter streams beside the default one; the allocator "
                 "model's pool per stream reproduces a 10-stream GPU recording block for block); FSDP2 frees "
                 "without record_stream, once the streams' events say the block is done with, so a block returns to "
                 "its pool at its free in the trace")
    elif fsdp2:
        conf += ("; a rank's own sequence of its FSDP2 step, replayed on one stream (a plan traced before streams "
                 "were recorded: on a GPU FSDP2's all-gather and reduce-scatter streams keep pools of their own, "
                 "which moves the reserve either way)")
    if sc.parallel and 1 in fsdp_versions(sc.parallel) and not deepspeed:
        conf += ("; an FSDP1 rank's own sequence of its step, each block on the stream FSDP1 allocates it on (it "
                 "frees through record_stream, which on a GPU keeps a block from its pool until that stream's work "
                 "is done: the plan returns it at its free)")
        if C.OFFLOAD_PARAMS in {str(v) for v in sc.parallel.get(C.OFFLOAD, ())}:
            conf += f"; {FSDP1_OFFLOAD_GAP}"
    if deepspeed:
        conf += (f"; a DeepSpeed rank's own step, traced with DeepSpeed's engine at the row's shape on both end ranks "
                 "(the larger need against the larger peak), with the two cuBLAS workspaces of a CUDA run: an H100 "
                 "measured one such sequence's need within 0.2 %")
    elif twin is not sc.model:
        conf += "; the sequences of its derived twin, planned from the model's own code"
    measured = sorted({n for n, f in fresh_of if f is not None and n.startswith(zr.MEASURED_PREFIX)})  # not replays
    traced = [f for (n, f) in fresh_of if f is not None and not n.startswith(zr.MEASURED_PREFIX)]
    parts = [f"replayed: the least capacity in which the step's own allocation sequence completes in the "
             f"caching-allocator model ({conf}; cached segments released and retried as PyTorch does), at "
             f"{len(traced)} rows where the verdict is decided (per recipe the largest batch that fits): "
             f"{_span([_rounded(f) for f in traced])} of the peak; each recipe takes its own, a recipe not replayed "
             "the largest"] if traced else ["each recipe takes its own reserve, a recipe without one the largest"]
    parts += [f"ZeRO-3 rows {n}" for n in measured]
    if skipped:
        parts.append(f"{len(skipped)} row(s) not replayed ({skipped[0].removeprefix('not replayed: ')})")
    note = "; ".join(parts)
    return dataclasses.replace(sc, overheads=dataclasses.replace(
        ov, replayed_reserve_fraction=max(f for _, f, _, _ in replayed), replayed_axes=tuple(recipe),
        replayed_recipes=tuple(sorted(replayed)), reserve_note=note))


def _rounded(frac: float) -> float:
    """Up to a multiple of 1 / RESOLUTION (the bisection's step), never below 0."""
    return max(math.ceil(frac * RESOLUTION) / RESOLUTION, 0.0)
