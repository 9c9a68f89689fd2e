"""The caching allocator's reserve from a replay of the step's own allocation sequence (issue 13).

For a derived model the plan stores, per region, the traced step's allocations and frees in order with each size
an integer polynomial in (b, s) (derive/events.py). At a row's shape that sequence, with what the trace does not
run added around it, goes through the model of PyTorch's CUDA caching allocator (allocator/): its peak reserved
bytes against its peak allocated bytes is the reserve the flat `allocator_reserve` fraction stands in for.

What is replayed for a training row (`STEPS` steps from a fresh process, the allocator's cache carried from one
to the next):
    parameters and buffers (as the trace registered them) · master weights M (one block per parameter) ·
    [the traced step (inputs, forward, backward) · in the first step only, the optimizer state S (torch.optim
    makes it lazily inside the first step(): one block per state tensor per parameter, kept) · the optimizer
    step's temporaries T_opt (foreach: one block per parameter, all live at once; otherwise one block), then
    freed · every storage of the step still live freed (zero_grad(set_to_none=True), the next batch's inputs)]
    × STEPS.
M, S and T_opt are the catalogs' bytes (as the estimator's), split over the parameters in proportion to their
bytes. lazy_state=False puts S before the first step with M (a run resumed from a checkpoint). Where the state is
made changes the reserve by up to a quarter of the peak on Qwen3 8B's rows: which segments the state lands in
(freed activations', or fresh ones below them) shapes every later step.
An inference row: the weights, then the traced request (prefill and derive/step.DECODE_STEPS decode steps at the
prompt's length) × STEPS.

Not replayed (-1, with a note saying why): hand-modelled families (no traced sequence), plans not stored (deriving
needs torch and minutes: never during a report), plans derived before sequences were stored, quantised weights
(the trace holds the bf16 layout, not the quantised blocks).
"""
from __future__ import annotations

import math

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import columns as C
from .. import derive
from ..allocator import AllocatorOptions, replay
from ..allocator.rules import TORCH_ALLOCATOR
from ..catalog.optimizers import TORCH_OPTIM, get_optimizer
from ..citations import formula
from ..derive import events as E
from ..derive.kinds import BUFFER, PARAM
from ..errors import UsageError
from . import derived
from .plan import precisions

STEPS = 2  # the second step starts from the cache the first left: the steady state
DECODE_STEPS = 3  # decode steps of a traced request (derive/step.DECODE_STEPS; step.py needs torch, this does not)


@dataclass(frozen=True)
class ReserveReplay:
    """Per row of the frame replayed (int64 arrays; -1 where nothing was replayed)."""

    peak_reserved_bytes: np.ndarray  # the replay's max_memory_reserved()
    peak_allocated_bytes: np.ndarray  # the replay's max_memory_allocated(): block sizes (512 B rounding, unsplit rests)
    traced_peak_bytes: np.ndarray  # the largest running sum of the replayed requests' own bytes (the plan's peak)
    events: np.ndarray  # events replayed
    notes: tuple[str, ...]  # one line per row: what was replayed, or why not

    def ratio(self) -> np.ndarray:
        """peak reserved / peak allocated (NaN where not replayed)."""
        ok = self.peak_allocated_bytes > 0
        out = np.full(len(ok), np.nan)
        out[ok] = self.peak_reserved_bytes[ok] / self.peak_allocated_bytes[ok]
        return out


def _split(total: int, weights: list[int], parts: int) -> list[int]:
    """`total` over `parts` blocks per weight, in proportion to the weights, summing to `total` exactly (Python
    integers: total · weight overflows int64 for large models); the rounding remainder goes to the first block."""
    w_sum = sum(weights) * parts
    if total <= 0 or w_sum <= 0 or parts <= 0:
        return []
    blocks = [total * w // w_sum for w in weights for _ in range(parts)]
    blocks[0] += total - sum(blocks)
    return [n for n in blocks if n > 0]


def _state_blocks(opt) -> int:
    """Blocks per parameter of the optimizer state: one per state tensor (8-bit: state1, state2; Adafactor: the
    row and column factors)."""
    return len(opt.state)


STREAMS_NOTE = "CUDA streams: a pool per stream"  # what replays.refine looks for in a row's note


def _sequence(ev: np.ndarray, kind: np.ndarray, kinds: list[str], before: list[int], state: list[int],
              step_temps: list[int], steps: int) -> np.ndarray:
    """The replayed sequence: the leading parameter/buffer registrations, the `before` blocks (kept: master
    weights), then `steps` times: the traced rest, in the first step the `state` blocks (kept: torch.optim creates
    its state inside the first step(), after backward), `step_temps` allocated then freed, every storage of the
    step still live freed. Ids: the trace's below N, then the kept blocks, each later step's shifted by a stride.
    A sequence with its streams (ev's third column: events.decode) keeps them; the added blocks are the default
    stream's (the optimizer runs there)."""
    ids = ev[:, 0]
    width = ev.shape[1]
    allocs = ev[:, 1] > 0
    held = allocs & np.isin(kind, [kinds.index(k) for k in (PARAM, BUFFER) if k in kinds])
    head = len(ev) if held.all() else int(np.argmin(held))  # the registrations before the step's first event
    body = ev[head:]
    n_ids = int(ids.max()) + 1 if len(ev) else 0
    p, q, t = len(before), len(state), len(step_temps)
    stride = n_ids + p + q + t
    kept = ~np.isin(body[:, 0], ids[:head])  # a free of a registered storage happens once, in the first step
    b_alloc = body[:, 1] > 0
    left = body[b_alloc & ~np.isin(body[:, 0], body[~b_alloc, 0])]  # allocated in the step, live at its end

    def block(first: int, sizes: list[int], sign: int) -> np.ndarray:
        out = np.zeros((len(sizes), width), dtype=np.int64)
        out[:, 0] = np.arange(first, first + len(sizes))
        out[:, 1] = sign * np.asarray(sizes, dtype=np.int64)
        return out

    out = [ev[:head], block(n_ids, before, 1)]
    for k in range(steps):
        shift = np.zeros(width, dtype=np.int64)
        shift[0] = k * stride
        out.append(body + shift if k == 0 else body[kept] + shift)
        if k == 0:
            out.append(block(n_ids + p, state, 1))
        temps = k * stride + n_ids + p + q
        out += [block(temps, step_temps, 1), block(temps, step_temps, -1)]
        freed = left.copy()
        freed[:, 0] += k * stride
        freed[:, 1] *= -1
        out.append(freed)
    return np.concatenate(out).astype(np.int64)


@formula("replayed_reserve_bytes", "max over the replay of Σ segment bytes: weights, M and S (per parameter), "
         "then per step the traced sequence at (b, s) and T_opt, through the caching-allocator model",
         TORCH_ALLOCATOR, derived.DERIVED, TORCH_OPTIM,
         where="components/reserve.py module docstring; DeviceCachingAllocator::malloc / free",
         note="M, S and T_opt are split over the parameters in proportion to their bytes (torch.optim keeps "
         "each state tensor, and _foreach ops their outputs, per parameter); the order of a steady-state step")
def replayed_reserve(arch, mode: str, rows: pd.DataFrame, options: AllocatorOptions = AllocatorOptions(),
                     device: str = "cuda", steps: int = STEPS, lazy_state: bool = True) -> ReserveReplay:
    """Replay each row of `rows` (the grid's axis columns: batch, seq_len, precision, ... as the estimator reads
    them) through the allocator model under `options`, without a capacity (the peak, not the verdict). For a
    few rows (each replay is tens of thousands of events in Python: ~0.1 s for Qwen3 8B). lazy_state=False:
    the optimizer state exists before the first step (resumed from a checkpoint: load_state_dict)."""
    n = len(rows)
    res = {k: np.full(n, -1, dtype=np.int64) for k in ("reserved", "allocated", "traced")}
    counts = np.zeros(n, dtype=np.int64)
    notes: list[str] = []
    for i in range(n):
        note, seq = row_sequence(arch, mode, rows.iloc[[i]], device, steps, lazy_state)
        if seq is not None:
            r = replay(seq, options)
            res["reserved"][i], res["allocated"][i] = r.peak_reserved_bytes, r.peak_allocated_bytes
            res["traced"][i] = int(np.cumsum(seq[:, 1]).max())
            counts[i] = len(seq)
        notes.append(note)
    return ReserveReplay(res["reserved"], res["allocated"], res["traced"], counts, tuple(notes))


def row_sequence(arch, mode: str, row: pd.DataFrame, device: str = "cuda", steps: int = STEPS,
                 lazy_state: bool = True) -> tuple[str, np.ndarray | None]:
    """What replayed_reserve replays for one row (a one-row frame): (a one-line note, the (n, 2) int64 sequence,
    or None where there is none: the note says why)."""
    return row_sequences(arch, mode, row, device, steps, lazy_state)[0]


def row_sequences(arch, mode: str, rows: pd.DataFrame, device: str = "cuda", steps: int = STEPS,
                  lazy_state: bool = True) -> list[tuple[str, np.ndarray | None]]:
    """row_sequence of every row of `rows`, the plans read once for them all."""
    if getattr(arch, "kind", "") != "derived":
        return [(f"{arch.name}: hand-modelled family, no traced allocation sequence: not replayed", None)] * len(rows)
    rows = derived.with_kept_gradients(rows)  # a row accumulating over micro-batches replays its plan with them kept
    try:
        with derive.stored_only():
            recipes, states, key, state_code, b, s, dec = derived.frame_inputs(arch, mode, rows, device)
    except UsageError as e:
        return [(f"not replayed: {e}", None)] * len(rows)
    precs = precisions(tuple(str(p) for p in rows[C.PRECISION]), mode)
    out = []
    for i in range(len(rows)):
        if precs[i].quant:
            out.append((f"not replayed: {precs[i].name} weights are quantised blocks, the trace holds the bf16 "
                        "layout", None))
            continue
        st = None if mode != "train" else {x: int(states[x][int(state_code[i])]) for x in ("M", "S", "T")}
        out.append(_row_sequence(recipes[int(key[i])], mode, int(b[i]), int(s[i]),
                                 None if dec is None else int(dec[i]), rows.iloc[i], st, steps, lazy_state,
                                 trained_shapes(arch)))
    return out


def trained_shapes(arch) -> list[tuple[int, ...]] | None:
    """The shapes of the parameters that train, one per tensor, where some are frozen (a base under peft's
    adapters: the model card's trainable tensors); None where every parameter trains (the plan's own parameter
    storages are then the ones the optimizer's blocks are split over)."""
    card = getattr(getattr(arch, "derived", None), "card", None)
    if card is None or not card.frozen:
        return None
    return [tuple(t.shape) for t in card.tensors if t.trainable for _ in range(t.count)]


def _trained_weights(shapes: list[tuple[int, ...]], row: pd.Series) -> list[int]:
    """Elements per trained tensor on the row's rank: a FULL_SHARD / SHARD_GRAD_OP layout (FSDP2, zero_stage 2 or 3)
    cuts each along dim 0 into data_parallel chunks, padded to the first's (fully_shard's chunk)."""
    world = int(row.get(C.DATA_PARALLEL, 1) or 1) if int(row.get(C.ZERO_STAGE, 0) or 0) >= 2 else 1
    return [-(-shape[0] // world) * math.prod(shape[1:]) if shape else 1 for shape in shapes]


def _row_sequence(plan, mode: str, bi: int, si: int, dec: int | None, row: pd.Series, st: dict | None, steps: int,
                  lazy_state: bool, trained: list[tuple[int, ...]] | None = None) -> tuple[str, np.ndarray | None]:
    try:
        ev, kind, kinds = E.region_events(plan, bi, si)
    except ValueError as e:
        return f"not replayed: {e}", None
    params = [int(x) for x in ev[(ev[:, 1] > 0) & (kind == (kinds.index(PARAM) if PARAM in kinds else -1)), 1]]
    before: list[int] = []
    state: list[int] = []
    temps: list[int] = []
    what = f"{len(ev):,} traced events at batch {bi}, seq {si}"
    if ev.shape[1] == 3:  # a sharded step's: FSDP2's all-gather copy-in and reduce-scatter streams beside the default
        what += f", each block on its stream ({len(set(ev[:, 2].tolist()))} {STREAMS_NOTE})"
    if mode == "train":
        opt = get_optimizer(str(row[C.OPTIMIZER]))
        impl = str(row[C.OPTIMIZER_IMPL])
        M, S, T = st["M"], st["S"], st["T"]
        # over what trains: a fine-tune's adapters, not the frozen base (their state blocks are small: an H100's
        # LoRA under FSDP2 made 784 of 32-96 KiB, where a split over every parameter made some of 4.86 MiB that
        # shifted the step's segments, the plan's need 7 % under the GPU's)
        weights = params if trained is None else _trained_weights(trained, row)
        master, moments = _split(M, weights, 1), _split(S, weights, _state_blocks(opt))
        before, state = (master, moments) if lazy_state else (master + moments, [])
        temps = _split(T, weights, 1) if impl == "foreach" else ([T] if T > 0 else [])
        what += (f"; M {M:,} B in {len(master)} blocks before step 1, S {S:,} B in "
                 f"{len(moments)} {'made in' if lazy_state else 'before'} step 1, "
                 f"T_opt {T:,} B in {len(temps)} ({opt.name} {impl}"
                 + (f", over the {len(weights)} tensors that train)" if trained is not None else ")"))
    else:
        what += f" (the traced request: prefill and {DECODE_STEPS} decode steps, the row generates {dec})"
    seq = _sequence(ev, kind, kinds, before, state, temps, steps)
    unit = "steps" if mode == "train" else "requests"
    return f"replayed {len(seq):,} events: {steps} {unit} of {what}", seq
