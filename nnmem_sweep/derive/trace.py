"""Record a step's storage allocations and frees, in order, under FakeTensorMode.

Every aten op's output storages are seen by a TorchDispatchMode; a storage met for the first time is an
allocation (its bytes, the op that made it) and a weakref callback on it records its free. What is recorded is
exactly what PyTorch's MemTracker counts on the CPU device (torch/distributed/_tools/mem_tracker.py: the bytes of
each live untyped storage, views counted once), so the largest running total over the events equals MemTracker's
peak; the order of events is the order PyTorch allocates and frees, which a caching-allocator replay needs.

Each allocation also records the stream it is made on: the CPU's stand-in streams (torch.cpu.Stream, selected by
torch.cpu.stream()) are the ones device-agnostic code such as FSDP2 selects where it runs on CUDA streams, so a
sharded step's all-gathers and reduce-scatters show the streams their blocks belong to on a GPU (0: the default
stream; 1, 2, ...: the others, in the order they first allocate). A free belongs to its allocation's stream.

With `workspace_bytes`, the recording also holds the cuBLAS workspaces a CUDA run makes through the caching
allocator (pytorch#95668): one per thread at its first matrix product, the forward's on the main thread and the
backward's on autograd's device thread, never freed. The backward's lands among the step's cached blocks and can
split a segment a later large request needed: on an H100 (DeepSpeed ZeRO-2, Llama 3.2 1B, 2026-11-27) it raised the
least capacity from +4.4 % to the GPU's +10.2 % of the peak.

Storages that exist before recording starts (parameters, buffers, inputs) are registered with `external()` and
count from the start. Frees arrive through Python reference counting; tensors held only by reference cycles are
freed at the phase marks (step.collector_paused, Recorder.mark), so the order does not depend on when the cyclic
collector happens to run.
"""
from __future__ import annotations

import contextlib
import gc
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import budget


# the aten ops that call cuBLAS on a CUDA device (matmul and linear reach them): the first on a thread makes the
# thread's workspace (Recorder(workspace_bytes=...))
CUBLAS_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "_addmm_activation",
                        "_scaled_mm"})


@dataclass
class Trace:
    """The events of one recording.

    events: (n, 2) int64, [storage id, +bytes] for an allocation, [storage id, -bytes] for its free.
    ops: the aten op name per event ("" for frees and external storages).
    marks: {name: event index} phase boundaries ("forward", "backward", ...): the index of the first event of the
    phase (== len(events) if it had none).
    external: ids of the storages registered before recording (parameters, buffers, inputs).
    streams: the stream of each event's storage (module docstring); None: all on the default stream.
    """

    events: np.ndarray
    ops: list[str]
    marks: dict[str, int]
    external: dict[int, str] = field(default_factory=dict)
    spans: list[tuple[str, int, int, int]] = field(default_factory=list)  # (phase, step, first event, end event)
    streams: np.ndarray | None = None
    host_bytes: int = 0  # host memory beside the recording, never an event (Recorder.host)

    def live(self) -> np.ndarray:
        """Live bytes after each event."""
        return np.cumsum(self.events[:, 1])

    def signature(self) -> tuple:
        """What must be equal for two recordings to be the same program: the op of every event, and for a free
        which allocation it frees (its ordinal among the allocations), and the marks."""
        ordinal: dict[int, int] = {}
        which = []
        allocs = 0
        for sid, n in self.events.tolist():
            if n > 0:
                ordinal[sid] = allocs
                allocs += 1
                which.append(-1)
            else:
                which.append(ordinal[sid])
        streams = () if self.streams is None else tuple(self.streams.tolist())
        return (tuple(self.ops), tuple(which), tuple(sorted(self.marks.items())), tuple(self.spans), streams)


try:  # a sharded step's parameters and gradients (FSDP2) are DTensors; the functional collectives' wait
    from torch.distributed.tensor import DTensor as _DTENSOR
    _WAIT_TENSOR = torch.ops._c10d_functional.wait_tensor.default
except (ImportError, AttributeError):  # pragma: no cover - a torch built without distributed
    _DTENSOR, _WAIT_TENSOR = None, None


def _local(t):
    to_local = getattr(t, "to_local", None) if _DTENSOR is not None and isinstance(t, _DTENSOR) else None
    return to_local() if to_local is not None else t


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield _local(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


class Recorder(TorchDispatchMode):
    """Use inside FakeTensorMode (entered after it, so it sees the fake ops):

        with fake_mode:
            model, inputs = build()
            rec = Recorder()
            rec.external(model.parameters(), "param")
            with rec:
                rec.mark("forward"); loss = model(**inputs).loss
                rec.mark("backward"); loss.backward()
            trace = rec.trace()
    """

    def __init__(self, workspace_bytes: int = 0) -> None:
        """workspace_bytes: where > 0, the cuBLAS workspace a CUDA run allocates through the caching allocator at
        its first matrix product on each thread, never freed: one at the forward's first (the main thread), one at
        the backward's first (autograd's device thread, a handle of its own), each right after that product's
        output (module docstring). Only for a sequence to be replayed: the live bytes it adds are no tensor's."""
        super().__init__()
        self.workspace_bytes = int(workspace_bytes)
        self._workspaces: set[str] = set()  # the threads ("forward", "backward") that have made theirs
        self._ids: dict[int, int] = {}  # id(storage object) -> our storage id, while it lives
        self._size: dict[int, int] = {}  # our id -> bytes
        self._refs: dict[int, weakref.ref] = {}
        self._events: list[tuple[int, int]] = []
        self._ops: list[str] = []
        self._streams: list[int] = []  # per event: its storage's stream (module docstring)
        self._stream_of: dict[int, int] = {}  # our id -> the stream it was allocated on, while it lives
        self._stream_objects: list = [torch.cpu.current_stream()]  # index: the stream's number (0: the default)
        self._marks: dict[str, int] = {}
        self._external: dict[int, str] = {}
        self._next = 0
        self._spans: list[tuple[str, int, int, int]] = []
        self._closed = False
        self.cache_ids: set[int] = set()  # storages seen holding a KV cache (saw_cache)
        self._host: dict[int, weakref.ref] = {}  # id(storage) -> the storage: host memory, never an event (host())
        self.shard_copies = 0  # > 0: FSDP's CPU offload over this many ranks (host())
        self.host_bytes = 0  # the host storages' bytes (host())
        self._copy_rule = 1  # the FSDP version whose all-gather the shard copies precede (host())
        self._born_freed: set[int] = set()  # storage ids freed right after their allocation (born_freed())
        self._on_host = 0  # > 0: inside on_host(), where every storage first seen is host memory
        self._counted_host: list = []  # the storages host_storages() counted in host_bytes (held: ids stay theirs)

    # ---- storages
    def _see(self, t: torch.Tensor, op: str) -> int | None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested ... : nothing to count
            return None
        return self._see_storage(st, op)

    def _see_storage(self, st, op: str) -> int | None:  # noqa: ANN001
        key = id(st)
        if key in self._host and self._host[key]() is st:
            return None
        sid = self._ids.get(key)
        if sid is not None and self._refs[sid]() is st:
            n = int(st.nbytes())
            if n != self._size[sid]:  # resized in place: a free of the old bytes and an allocation of the new
                self._record(sid, -self._size[sid], "")
                self._size[sid] = n
                self._record(sid, n, op)
            return sid
        if self._on_host:
            self._host[key] = weakref.ref(st)
            return None
        sid = self._next
        self._next += 1
        n = int(st.nbytes())
        self._ids[key] = sid
        self._size[sid] = n
        self._refs[sid] = weakref.ref(st, lambda _r, sid=sid, key=key: self._freed(sid, key))
        self._record(sid, n, op)
        return sid

    def _record(self, sid: int, signed_bytes: int, op: str) -> None:
        if signed_bytes and not self._closed:  # an empty storage is neither an allocation nor a free (MemTracker skips them too)
            if signed_bytes > 0:
                stream = self._stream_of[sid] = self._stream_now()
            else:
                stream = self._stream_of.pop(sid, 0)
            self._events.append((sid, signed_bytes))
            self._ops.append(op)
            self._streams.append(stream)

    def _stream_now(self) -> int:
        current = torch.cpu.current_stream()
        for i, known in enumerate(self._stream_objects):
            if known is current:
                return i
        self._stream_objects.append(current)
        return len(self._stream_objects) - 1

    def _freed(self, sid: int, key: int) -> None:
        if self._ids.get(key) == sid:
            del self._ids[key]
        self._refs.pop(sid, None)
        self._record(sid, -self._size.pop(sid), "")

    def external(self, tensors, kind: str) -> None:
        """Register storages that exist before the recording (parameters, buffers, inputs) under `kind`."""
        for t in _tensors(list(tensors)):
            sid = self._see(t, "")
            if sid is not None:
                self._external.setdefault(sid, kind)

    def host(self, tensors, world: int, held_bytes: int, version: int = 1) -> None:
        """A step offloaded to the host by FSDP over `world` ranks (FSDP1's CPUOffload(offload_params=True), or
        `version` 2: FSDP2's CPUOffloadPolicy): the storages of `tensors` (the rank's shards, FSDP1's CPU gradients)
        live in host memory, not on the GPU, and are never an event; and each unit's all-gather is preceded on a GPU
        by a copy of its host shards to the GPU (1/world of the gathered bytes), freed once copied in, which the
        one-device run cannot make (the shard is already there): recorded as an allocation just before the
        all-gather's destination and its free just after. FSDP1 makes that destination by growing its unsharded
        storage from empty (UntypedStorage.resize_; the copy: FlatParamHandle pre_unshard), FSDP2 by its
        all_gather_copy_in op (the copies: FSDPParam.all_gather_inputs). held_bytes: what the host holds at the
        step's most (Trace.host_bytes)."""
        self._mark_host(tensors)
        self.shard_copies, self.host_bytes, self._copy_rule = int(world), int(held_bytes), int(version)

    def _mark_host(self, tensors) -> list:
        """The storages of `tensors`, each marked host memory (never an event), in order."""
        out = []
        for t in _tensors(list(tensors)):
            st = t.untyped_storage()
            self._host[id(st)] = weakref.ref(st)
            out.append(st)
        return out

    def host_storages(self, tensors) -> int:
        """Storages of `tensors` that live in host memory (DeepSpeed's ZeRO-Offload: the fp32 partition, its
        gradient, the pinned buffers, the optimizer state): never an event; their bytes (each storage once) are
        added to host_bytes and returned."""
        added, counted = 0, {id(st): st for st in self._counted_host}
        for st in self._mark_host(tensors):
            if id(st) not in counted:
                counted[id(st)] = st
                self._counted_host.append(st)
                added += int(st.nbytes())
        self.host_bytes += added
        return added

    @contextlib.contextmanager
    def on_host(self):
        """What runs inside on the host (ZeRO-Offload's CPU step, its CPU gradient buffers): every storage first seen
        there is host memory, never an event (what it keeps is registered with host_storages() afterwards, so
        host_bytes counts what the host holds, not the CPU step's transients)."""
        self._on_host += 1
        try:
            yield
        finally:
            self._on_host -= 1

    def born_freed(self, tensors) -> None:
        """Storages the GPU frees as soon as they are made, which one device keeps: FSDP2's reduce-scatter output under
        CPU offload, copied to the host as the rank's gradients (its sharded grads are views of it here); each
        recorded as freed right after its allocation (trace())."""
        for t in _tensors(list(tensors)):
            sid = self.storage_id(t)
            if sid is not None:
                self._born_freed.add(sid)

    @contextlib.contextmanager
    def _shard_copy(self, gathered_bytes: int, rule: bool):
        """Where `rule` holds (an offloaded step's all-gather of `gathered_bytes`, host()): the host shards' copy
        to the GPU, 1/world of them, allocated before what the body records and freed after it."""
        if not (rule and self.shard_copies):
            yield
            return
        sid, self._next = self._next, self._next + 1
        self._size[sid] = int(gathered_bytes) // self.shard_copies
        self._record(sid, self._size[sid], "shard_to_gpu")
        yield
        self._record(sid, -self._size.pop(sid), "")

    def release(self, t: torch.Tensor) -> None:
        """Record the free of a live tensor's storage now, as the run on a GPU frees it where the traced run cannot
        (step.py _catch_all_reshard); the storage itself is left as it is."""
        st = _local(t).untyped_storage()
        sid = self._ids.get(id(st))
        if sid is not None and self._refs[sid]() is st:
            self._freed(sid, id(st))

    def storage_id(self, t: torch.Tensor) -> int | None:
        """Our id of a live tensor's storage (None if never seen)."""
        sid = self._ids.get(id(_local(t).untyped_storage()))
        return sid

    def mark(self, name: str) -> None:
        # the youngest generation holds every object made since the last mark while step.collector_paused() keeps
        # the automatic collector off: collecting it frees this phase's cyclic garbage, ~1000x faster than a full
        # collection of a process that holds torch and transformers
        gc.collect(0)
        self._marks[name] = len(self._events)

    # ---- measure/tracker.Phases: run_steps reports each phase, the end of each step and the KV cache
    @contextlib.contextmanager
    def phase(self, name: str, step: int):
        self.mark(name if name not in self._marks else f"{name}{step}")
        start = len(self._events)
        try:
            yield
        finally:
            gc.collect(0)
            self._spans.append((name, step, start, len(self._events)))

    def step_done(self) -> None:
        pass

    def saw_cache(self, cache) -> None:
        for layer in getattr(cache, "layers", ()):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    sid = self.storage_id(t)
                    if sid is not None:
                        self.cache_ids.add(sid)
        for part in ("self_attention_cache", "cross_attention_cache"):  # an EncoderDecoderCache
            if hasattr(cache, part):
                self.saw_cache(getattr(cache, part))

    def __exit__(self, *args):
        torch.UntypedStorage.resize_ = self._restore_resize
        out = super().__exit__(*args)
        self._closed = True  # frees after the recording (the caller dropping its tensors) are not events
        return out

    def __enter__(self):
        # FSDP2 frees and re-allocates a parameter's unsharded storage in place (UntypedStorage.resize_), which no
        # aten op output shows: the resize is recorded as the free of the old bytes and the allocation of the new
        original, rec = torch.UntypedStorage.resize_, self

        def resize_(st, size):  # noqa: ANN001, ANN202
            with rec._shard_copy(size, rec._copy_rule == 1 and size > 0 and st.nbytes() == 0):  # FSDP1's (host())
                out = original(st, size)
                rec._see_storage(st, "resize_")  # a known storage resized, or one first met here (allocated empty)
            return out

        self._restore_resize = original
        torch.UntypedStorage.resize_ = resize_
        try:
            return super().__enter__()
        except BaseException:
            torch.UntypedStorage.resize_ = original
            raise

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _DTENSOR is not None and any(issubclass(t, _DTENSOR) for t in types):
            return NotImplemented  # DTensor runs its local ops, which come back here (a sharded step, FSDP2)
        if func is _WAIT_TENSOR:  # the fake kernel returns a new tensor where the real one returns its input
            return args[0]
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        gathers = self._copy_rule == 2 and name == "all_gather_copy_in"  # FSDP2's (host())
        with self._shard_copy(out[1].untyped_storage().nbytes() if gathers else 0, gathers):
            for t in _tensors(out):
                self._see(t, name)
        if self.workspace_bytes and name in CUBLAS_OPS:
            self._workspace()
        budget.check_event(len(self._events))  # events, seconds, memory: bounded (budget.py)
        return out

    def _workspace(self) -> None:
        """The thread's cuBLAS workspace, at its first matrix product: the backward's after a "backward" mark."""
        last = max(self._marks.items(), key=lambda kv: kv[1])[0] if self._marks else ""
        thread = "backward" if last.startswith("backward") else "forward"
        if thread not in self._workspaces:
            self._workspaces.add(thread)
            sid, self._next = self._next, self._next + 1  # never freed: held by the handle for the process's life
            self._record(sid, self.workspace_bytes, "cublas_workspace")

    def trace(self) -> Trace:
        events, ops, streams = self._events, self._ops, self._streams
        if self._born_freed:
            events, ops, streams = _freed_at_birth(events, ops, streams, self._born_freed)
        events, ops, streams = _canonical(events, ops, streams)
        ev = np.array(events, dtype=np.int64).reshape(-1, 2)
        st = np.array(streams, dtype=np.int64) if any(streams) else None
        return Trace(ev, ops, dict(self._marks), dict(self._external), list(self._spans), st, self.host_bytes)


def _freed_at_birth(events: list[tuple[int, int]], ops: list[str], streams: list[int], sids: set[int]):
    """The events with each of `sids`' allocations followed at once by its free, and its later free dropped."""
    out_e, out_o, out_s = [], [], []
    for e, op, st in zip(events, ops, streams):
        if e[0] in sids and e[1] < 0:
            continue
        out_e.append(e)
        out_o.append(op)
        out_s.append(st)
        if e[0] in sids:
            out_e.append((e[0], -e[1]))
            out_o.append("")
            out_s.append(st)
    return out_e, out_o, out_s


def _canonical(events: list[tuple[int, int]], ops: list[str], streams: list[int]) -> tuple[list, list, list]:
    """The frees between two allocations in the order of the allocations they free. Their order can follow Python's
    set and dict iteration over objects (autocast's weight cache, checkpointing's saved tensors), which differs
    from run to run; the live bytes at every allocation, and so every moment, do not depend on it."""
    ordinal: dict[int, int] = {}  # storage id -> ordinal of its (latest) allocation
    out: list[tuple[tuple[int, int], str, int]] = []
    run: list[tuple[int, tuple[tuple[int, int], str, int]]] = []
    allocs = 0
    for event in zip(events, ops, streams):
        e = event[0]
        if e[1] < 0:
            run.append((ordinal[e[0]], event))
            continue
        if run:
            run.sort(key=lambda r: r[0])
            out += [r[1] for r in run]
            run = []
        ordinal[e[0]] = allocs
        allocs += 1
        out.append(event)
    run.sort(key=lambda r: r[0])
    out += [r[1] for r in run]
    return [x[0] for x in out], [x[1] for x in out], [x[2] for x in out]
