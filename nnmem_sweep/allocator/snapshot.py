"""Real GPUs' allocator snapshots replayed through the model (model.py): the evidence that its rules are PyTorch's.

A `torch.cuda.memory._dump_snapshot()` pickle holds the segments at the end of the recording and the allocator's
trace while it was recorded (`device_traces`: alloc, free_completed, segment_alloc ...; an alloc's size is the size
asked for, before rounding). `slim(pickle)` keeps what a replay reads; `check(doc)` replays it:

  1. the state when the recording started: the segments it did not make, with the blocks in them that are
     allocated at the end and that it never allocated, the rest of those segments free (a recording that frees a
     block allocated before it started, or releases a segment it did not make, cannot be rebuilt so and is refused:
     Unreplayable);
  2. every alloc through CachingAllocatorModel.malloc on its stream and every free_completed through free (a block
     used on another stream, record_stream, is freed when its events complete: free_completed, not free_requested);
     a run of segment_free (torch.cuda.empty_cache()) through release_cached_blocks, which must release exactly those
     segments; each segment the model makes takes the address of the GPU's segment_alloc (so ties between equal
     free blocks fall as on the GPU), and at each alloc the model must make a segment exactly where the GPU made
     one, of its size, and put the block at the GPU's address;
  3. at the end, every segment's blocks (offset, size, allocated or free), the number of segments and the peak
     reserved.

One device, any number of streams, native segments (what the model models); `check` names the first difference.
"""
from __future__ import annotations

import gzip
import json
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..paths import file_sha256, sources_digest
from .model import CachingAllocatorModel
from .options import AllocatorOptions
from .rules import round_size

ACTIONS = ("alloc", "free_completed", "segment_alloc", "segment_free")
ALLOC, FREE, SEGMENT, SEGMENT_FREE = range(4)


def slim(snapshot: dict[str, Any], device: int = 0) -> dict[str, Any]:
    """The fields a replay reads: segments (address, total size, pool, expandable, stream; blocks as [address, size,
    allocated]) and the trace as [action (ACTIONS' index), address, size] with the stream after them where it is
    not 0 (a stream is its cudaStream_t's value; 0: the default stream); stack frames and timings dropped."""
    traces = snapshot.get("device_traces") or [[]]

    def event(e: dict[str, Any]) -> list[int]:
        out = [ACTIONS.index(e["action"]), int(e["addr"]), int(e["size"])]
        return out + [int(e["stream"])] if e.get("stream") else out

    return {
        "segments": [{"address": int(s["address"]), "total_size": int(s["total_size"]),
                      "small": s["segment_type"] == "small", "expandable": bool(s.get("is_expandable")),
                      "stream": int(s.get("stream", 0)),
                      "blocks": [[int(b["address"]), int(b["size"]), b["state"].startswith("active")]
                                 for b in s["blocks"]]}
                     for s in snapshot["segments"] if s.get("device", device) == device],
        "trace": [event(e) for e in traces[device] if e["action"] in ACTIONS],
    }


def load(path: Path) -> dict[str, Any]:
    """A slimmed snapshot (.json.gz, with its `source`), or a raw pickle, slimmed here."""
    path = Path(path)
    if path.suffix == ".gz":
        return json.loads(gzip.decompress(path.read_bytes()))
    with open(path, "rb") as f:
        return slim(pickle.load(f))


def sequence(doc: dict[str, Any], after_release: bool = False) -> np.ndarray:
    """The recording's allocation sequence, as the replays take one: (id, +size) at each alloc, (id, -size) at its
    free_completed, each with its stream (0 the default one, then 1, 2 ... in order of first use; two columns where
    only the default stream is used). A block freed that the recording did not allocate is skipped; the segments'
    releases (empty_cache) are not events of a sequence (a plan's least capacity is a fresh run's). `after_release`:
    from the last run of releases on (a script's empty_cache once its model is loaded; DeepSpeed's at the end of
    initialize), the blocks live then allocated first, in the order they were: what a cache emptied there holds."""
    trace = doc["trace"]
    if after_release:
        cut = max((i for i, e in enumerate(trace) if e[0] == SEGMENT_FREE), default=-1) + 1
        live_then: dict[int, list[int]] = {}
        for e in trace[:cut]:
            if e[0] == ALLOC:
                live_then[e[1]] = e
            elif e[0] == FREE:
                live_then.pop(e[1], None)
        trace = list(live_then.values()) + trace[cut:]
    rows: list[tuple[int, int, int]] = []
    live: dict[int, tuple[int, int, int]] = {}
    streams: dict[int, int] = {0: 0}
    for e in trace:
        action, addr, size = e[0], e[1], e[2]
        if action == ALLOC:
            stream = streams.setdefault(e[3] if len(e) > 3 else 0, len(streams))
            live[addr] = (len(rows), size, stream)  # the row's index: an id no other block has
            rows.append(live[addr])
        elif action == FREE and addr in live:
            i, size, stream = live.pop(addr)
            rows.append((i, -size, stream))
    seq = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return seq if seq[:, 2].any() else np.ascontiguousarray(seq[:, :2])


def allocated_before(doc: dict[str, Any]) -> int:
    """Bytes allocated when the recording started (memory_allocated()'s count, block sizes): those allocated at the
    end less what the recording allocated, plus what it freed; each traced size rounded as the allocator rounds a
    request (rules.round_size, the default settings). What a run recorded on top of an earlier run's tensors started
    with (the H100's FSDP1 points, 2026-11-28: gpu_compare takes it off their peaks)."""
    end = sum(size for s in doc["segments"] for _, size, allocated in s["blocks"] if allocated)
    made = sum(round_size(e[2]) for e in doc["trace"] if e[0] == ALLOC)
    freed = sum(round_size(e[2]) for e in doc["trace"] if e[0] == FREE)
    return end - made + freed


class Unreplayable(ValueError):
    """A snapshot outside what the model models or what its end state lets rebuild."""


@dataclass(frozen=True)
class Check:
    """What the replay of one snapshot found: `ok` when every segment the GPU made, every block's address, the end
    layout and the peak reserved are the model's; `difference` names the first that is not."""

    events: int  # replayed (up to the first difference)
    segments_made: int  # during the recording, by the model where the GPU made them
    segments: int  # at the end
    peak_reserved_bytes: int  # the GPU's: the segments before the recording plus those it made, less those released
    model_peak_reserved_bytes: int
    difference: str

    @property
    def ok(self) -> bool:
        return not self.difference


def _initial(doc: dict[str, Any]) -> tuple[list[dict], set[int]]:
    """The segments that exist before the recording, and the block addresses it allocates."""
    segs, trace = doc["segments"], doc["trace"]
    if any(s["expandable"] for s in segs):
        raise Unreplayable("expandable segments: not modelled")
    made: set[int] = set()
    for act, a, *_ in trace:
        if act == SEGMENT:
            made.add(a)
        elif act == SEGMENT_FREE and a not in made:
            raise Unreplayable("a segment made before the recording is released during it: the state before it is "
                               "not known")
    allocated: set[int] = set()
    early = 0
    for act, a, *_ in trace:
        if act == ALLOC:
            allocated.add(a)
        elif act == FREE and a not in allocated:
            early += 1
    if early:
        raise Unreplayable(f"{early} block(s) allocated before the recording are freed during it: the state before "
                           "it is not known")
    return [s for s in segs if s["address"] not in made], allocated


def check(doc: dict[str, Any], options: AllocatorOptions = AllocatorOptions(), addresses: bool = True,
          descending: bool = False) -> Check:
    """Replay `doc` (see the module docstring). addresses=False: the model takes its own addresses for the segments
    the recording makes (rising, or `descending`, as a plan's replays do) and only the peak reserved is compared."""
    segs, trace = doc["segments"], doc["trace"]
    before, allocated = _initial(doc)
    model = CachingAllocatorModel(options, descending=descending)
    live: dict[int, object] = {}  # the GPU's block address -> the model's block
    gpu = sum(s["total_size"] for s in before)
    peak = gpu
    for s in sorted(before, key=lambda s: s["address"]):  # 1.
        kept = [(a - s["address"], n) for a, n, on in s["blocks"] if on and a not in allocated]
        model.next_address = s["address"]
        for (off, _), b in zip(kept, model.adopt_segment(s["total_size"], s["small"], kept, s["stream"])):
            live[s["address"] + off] = b
    made, pending = 0, None  # pending: the size of the GPU's segment_alloc the next alloc must cause
    released: set[int] | None = None  # what the model's empty_cache freed, while the GPU's run of releases lasts
    gpu_released = 0

    def differs(i: int, text: str) -> Check:
        return Check(i, made, len(segs), peak, model.peak_reserved, f"event {i}: {text}")

    def releases_differ(i: int) -> Check | None:  # at the end of a run of releases
        if released is None or len(released) == gpu_released:
            return None
        return differs(i, f"the model's empty_cache releases {len(released)} segment(s), the GPU's {gpu_released}")

    for i, (act, addr, size, *stream) in enumerate(trace):  # 2.
        if act == SEGMENT_FREE:  # a run of these: torch.cuda.empty_cache() (the trace holds no other releases)
            gpu -= size
            if released is None:
                held = {info.base for info in model.snapshot()}
                model.release_cached_blocks()
                released, gpu_released = held - {info.base for info in model.snapshot()}, 0
            if addresses and addr not in released:
                return differs(i, f"the GPU releases the segment at {addr:#x}, which the model's empty_cache keeps")
            gpu_released += 1
            continue
        if (bad := releases_differ(i)) is not None:
            return bad
        released = None
        if act == SEGMENT:
            gpu += size
            peak = max(peak, gpu)
            if addresses:
                pending = size
                model.next_address = addr
        elif act == FREE:
            model.free(live.pop(addr))
        else:
            count = model.num_device_alloc
            b = model.malloc(size, stream[0] if stream else 0)
            if b is None:
                return differs(i, f"the model runs out of memory allocating {size:,} B")
            if not addresses:
                made += model.num_device_alloc - count
                live[addr] = b
                continue
            if model.num_device_alloc != count:
                if pending != b.seg.size:
                    return differs(i, f"the model makes a {b.seg.size:,} B segment where the GPU makes "
                                      f"{'none' if pending is None else f'one of {pending:,} B'}")
                made += 1
            elif pending is not None:
                return differs(i, f"the GPU makes a {pending:,} B segment where the model reuses a cached block")
            if b.ptr != addr:
                return differs(i, f"{size:,} B at {b.ptr:#x} (segment {b.seg.base:#x}) where the GPU puts it at "
                                  f"{addr:#x}")
            pending = None
            model.next_address = None
            live[addr] = b
    end = len(trace)
    if (bad := releases_differ(end)) is not None:  # the recording ends with a run of releases
        return bad
    if not addresses:
        return Check(end, made, len(segs), peak, model.peak_reserved,
                     "" if model.peak_reserved == peak else "the peak reserved differs")
    ours = {info.base: info for info in model.snapshot()}  # 3.
    if sorted(ours) != sorted(s["address"] for s in segs):
        return Check(end, made, len(segs), peak, model.peak_reserved,
                     f"the model ends with {len(ours)} segments, the GPU with {len(segs)}")
    for s in segs:
        got = [(blk.offset, blk.size, blk.state == "allocated") for blk in ours[s["address"]].blocks]
        want = _merged([(a - s["address"], n, on) for a, n, on in s["blocks"]])
        if got != want:
            first = next(k for k, (x, y) in enumerate(zip(got + [None] * len(want), want + [None] * len(got)))
                         if x != y)
            return Check(end, made, len(segs), peak, model.peak_reserved,
                         f"segment {s['address']:#x}, block {first}: {(got + [None])[first]} where the GPU has "
                         f"{(want + [None])[first]}")
    if model.peak_reserved != peak:
        return Check(end, made, len(segs), peak, model.peak_reserved, "the peak reserved differs")
    return Check(end, made, len(segs), peak, model.peak_reserved, "")


def _merged(blocks: list[tuple[int, int, bool]]) -> list[tuple[int, int, bool]]:
    """Adjacent free blocks as one (the model merges them on free; a snapshot may list them apart)."""
    out: list[tuple[int, int, bool]] = []
    for off, n, on in sorted(blocks):
        if out and not on and not out[-1][2] and out[-1][0] + out[-1][1] == off:
            out[-1] = (out[-1][0], out[-1][1] + n, False)
        else:
            out.append((off, n, on))
    return out


EVIDENCE_FILE = "evidence.json"  # beside the recordings: each one's replay as shipped (write_evidence)


def evidence(folder: Path, memo: Any = None) -> list[dict[str, Any]]:
    """Every slimmed snapshot in `folder` (*.json.gz) replayed: its name, source and what the replay found. A
    recording whose replay is shipped in EVIDENCE_FILE for its bytes and this allocator code is not replayed again;
    any other is, by memo(path, key, compute) -> the item where the caller keeps results under `key` (the
    recording's sha256 and the allocator code's digest; the report: the user cache), else here."""
    shipped = _shipped(Path(folder))
    code = code_digest()
    out = []
    for path in sorted(Path(folder).glob("*.json.gz")):
        key = {"sha256": file_sha256(path), "code": code}
        kept = shipped.get(path.name) or {}
        if all(kept.get(k) == v for k, v in key.items()):
            out.append(kept["item"])
        else:
            out.append(evidence_of(path) if memo is None else memo(path, key, evidence_of))
    return out


def evidence_of(path: Path) -> dict[str, Any]:
    """One slimmed snapshot replayed (evidence's item)."""
    doc = load(path)
    try:
        return item(path, doc, check(doc))
    except Unreplayable as e:
        return item(path, doc, None, f"not replayable: {e}")


def item(path: Path, doc: dict[str, Any], c: "Check | None", why: str = "") -> dict[str, Any]:
    """evidence's item of a recording from its check() (None where it could not be replayed, `why`)."""
    found = {"ok": c.ok, "difference": c.difference, "events": c.events, "segments_made": c.segments_made,
             "segments": c.segments, "peak_reserved_bytes": c.peak_reserved_bytes} if c is not None else \
        {"ok": False, "difference": why, "events": 0, "segments_made": 0, "segments": len(doc["segments"]),
         "peak_reserved_bytes": 0}
    return {"name": path.name.removesuffix(".json.gz"), "source": doc.get("source", {}), **found}


def write_evidence(folder: Path) -> Path:
    """EVIDENCE_FILE in `folder`: every recording replayed now, with its sha256 and the allocator code's digest."""
    code = code_digest()
    doc = {p.name: {"sha256": file_sha256(p), "code": code, "item": evidence_of(p)}
           for p in sorted(Path(folder).glob("*.json.gz"))}
    out = Path(folder) / EVIDENCE_FILE
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return out


def _shipped(folder: Path) -> dict[str, Any]:
    try:
        doc = json.loads((folder / EVIDENCE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def code_digest() -> str:
    """sha256 of the allocator model's sources (this package): a kept replay result is stale when it changes."""
    return sources_digest(Path(__file__).resolve().parent)
