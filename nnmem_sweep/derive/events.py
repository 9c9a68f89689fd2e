"""A derived step's own allocation sequence at any shape: what a caching-allocator replay needs (issue 13).

Traced at several probe shapes, a step is the same program: the same allocations and frees in the same order
(trace.Trace.signature), only the sizes change, and every allocation's size is an integer polynomial over
solve.MONOMIALS (the coefficients derivation.py solves and checks at held-out probes). So the sequence at a
shape (b, s) is the traced sequence with each allocation's bytes evaluated there. Stored per region of a plan
(optional: plans without it still evaluate; they just have no sequence to replay), compactly:

    {"kinds": [kind names], "rows": [[kind index, c0, ..., c5], ...], "seq": [int, ...], "streams": [int, ...]}

rows: the distinct (kind, coefficients) of the allocations; seq: one int per event, r >= 0 for an allocation whose size
is row r, -d for the free of the allocation made d allocations before it (d >= 1: the frees of a layer repeat, so gzip
packs them); streams (only where a row is not on the default stream): each row's stream (trace.py: FSDP2's all-gather
and reduce-scatter streams in a sharded step). Ids at evaluation are allocation ordinals (0, 1, ...), unique per
allocation as the allocator replay wants (a storage resized in place is a free and a new allocation).

An allocation whose polynomial is 0 at the shape is dropped with its free: allocate(0) returns an empty pointer
without reaching the allocator (c10/cuda/CUDACachingAllocator.cpp, NativeCachingAllocator::allocate).
"""
from __future__ import annotations

import numpy as np

from ..allocator.rules import TORCH_ALLOCATOR
from ..citations import formula, source
from . import solve

TRACED_SEQUENCE = source("nnmem-traced-sequence", "nnmem_sweep derived plans: a step's storage allocations and "
                         "frees in order, recorded under FakeTensorMode (derive/trace.py, what MemTracker counts), "
                         "each allocation's bytes solved as an integer polynomial in (b, s) and checked at probes "
                         "left out", "nnmem_sweep/derive/events.py")


def encode(events: np.ndarray, alloc_kind: list[str], coef: np.ndarray, streams: np.ndarray | None = None) -> dict:
    """The stored form of one traced sequence. events: (n, 2) [storage id, ±bytes]; alloc_kind: per allocation;
    coef: (6, n_alloc) int64, allocation j's size polynomial in column j; streams: per event (trace.Trace.streams),
    None where all are the default stream."""
    kinds = sorted(set(alloc_kind))
    kind_index = {k: i for i, k in enumerate(kinds)}
    rows: dict[tuple, int] = {}
    seq: list[int] = []
    ordinal: dict[int, int] = {}  # storage id -> ordinal of its latest allocation
    stream = [0] * len(events) if streams is None else streams.tolist()
    j = 0
    for (sid, n), st in zip(events.tolist(), stream):
        if n > 0:
            key = (kind_index[alloc_kind[j]], *(int(c) for c in coef[:, j]), st)
            seq.append(rows.setdefault(key, len(rows)))
            ordinal[sid] = j
            j += 1
        else:
            seq.append(ordinal[sid] - j)  # -(allocations since)
    doc = {"kinds": kinds, "rows": [list(k[:-1]) for k in rows], "seq": seq}
    if any(k[-1] for k in rows):
        doc["streams"] = [k[-1] for k in rows]
    return doc


@formula("derived_event_bytes", "bytes_j(b, s) = c_j · (1, s, b, b·s, b·s², s²) for allocation j, −bytes_j at its "
         "free; 0 B: dropped with its free", TRACED_SEQUENCE, TORCH_ALLOCATOR,
         where="derive/events.py; NativeCachingAllocator::allocate (size 0: an empty pointer, no block)")
def decode(doc: dict, b: int, s: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(events (n, 2) int64 [allocation ordinal, ±bytes], or (n, 3) with each event's stream where the sequence
    uses streams besides the default one, the kind index of each event's allocation, kind names) at (b, s);
    zero-byte allocations and their frees dropped (allocator.replay reads either shape). Raises ValueError where a
    size evaluates negative (the shape is outside what the polynomials describe)."""
    seq = np.asarray(doc["seq"], dtype=np.int64)
    rows = np.asarray(doc["rows"], dtype=np.int64).reshape(-1, 1 + len(solve.MONOMIALS))
    sizes = rows[:, 1:] @ solve.features([b], [s])[0]
    if (sizes < 0).any():
        raise ValueError(f"an allocation's size is negative at batch {b}, sequence {s}: outside the plan's region")
    alloc = seq >= 0
    count = np.cumsum(alloc)  # allocations up to and including each event
    target = np.where(alloc, count - 1, count + seq)  # the allocation ordinal each event allocates or frees
    row_of_alloc = seq[alloc]
    row = row_of_alloc[target]
    nbytes = sizes[row]
    keep = nbytes > 0
    columns = [target, np.where(alloc, nbytes, -nbytes)]
    if doc.get("streams"):
        columns.append(np.asarray(doc["streams"], dtype=np.int64)[row])
    ev = np.stack(columns, axis=1)[keep]
    return ev, rows[row, 0][keep], list(doc["kinds"])


def events_at(plan, batch: int, seq_len: int = 1) -> np.ndarray:
    """The step's (id, ±bytes) sequence at a concrete shape: (n, 2) int64 ((n, 3) with the streams: decode), for
    allocator.replay. plan: a DerivedPlan or its JSON document (plans.to_json). Raises ValueError where the plan stores
    no sequence for the region holding (batch, seq_len) (a plan derived before sequences were stored)."""
    return region_events(plan, batch, seq_len)[0]


def region_events(plan, batch: int, seq_len: int = 1) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """events_at's sequence with the kind of each event's storage (kind index per event, kind names)."""
    from .plans import DerivedPlan, from_json, region_of

    if not isinstance(plan, DerivedPlan):
        plan = from_json(plan)
    region = region_of(plan, batch, seq_len)
    if region.replay is None:
        raise ValueError("the plan stores no allocation sequence (derived before sequences were stored: derive it "
                         "again with `make derive` or NNMEM_SWEEP_REDERIVE=1)")
    return decode(region.replay, batch, seq_len)
