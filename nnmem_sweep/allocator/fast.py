"""The native backend of the allocator model (model.py) compiled with numba: the same rules on flat integer arrays,
for the replays a scenario's first run makes (replays.py: tens of thousands of events, a bisection of several
replays per recipe). model.py stays the reference, written to be read against the C++ source; this module is
held to it, result for result, on every committed sequence and on random ones (tests/allocator/test_fast.py).

Not here (replay.py falls back to model.py): expandable segments. Streams are (a pool per stream and size class),
and so is everything else of AllocatorOptions: max_split_size_mb (oversize blocks and their release),
roundup_power2_divisions, max_non_split_rounding_mb, large_segment_size_mb.

Layout. Blocks are rows of parallel arrays (ptr, size, segment, prev, next, allocated), reused through a free
list; a segment is its base and its pool. Each pool holds its free blocks in size classes (8 per power of two, each an
unordered linked list): adding and removing one is O(1), and best fit (the smallest (size, ptr) of at least the
request: BlockComparatorSize within the request's stream) looks at the request's class and then at the first
non-empty one above. Event ids are made dense before the call (np.unique), so the live map is an array.

numba compiles the kernels on first use (a few seconds) and keeps the machine code in its cache beside this file
(__pycache__) or in NUMBA_CACHE_DIR; `make install` compiles them once. numba is imported only then, by the first
replay. Without numba, replay.py uses model.py.
"""
from __future__ import annotations

import numpy as np

import importlib.util
import threading

from .model import ADDRESS_ALIGN, DESCENDING_TOP  # the reference's synthetic segment bases
from .rules import ROUNDUP_INTERVALS, kLargeBuffer, kMinBlockSize, kMinLargeAlloc, kRoundLarge, kSmallBuffer, \
    kSmallSize

UNLIMITED = 1 << 62  # "no cap" and "max_split_size unlimited" (the source's SIZE_MAX): above any request
_ROUNDUP_START_LOG2 = 20

# the result vector's slots
(PEAK_ALLOCATED, PEAK_RESERVED, END_ALLOCATED, END_RESERVED, NUM_ALLOC, NUM_FREE, PEAK_ALLOCATED_EVENT,
 PEAK_RESERVED_EVENT, REPLAYED, OOM_EVENT, OOM_BYTES) = range(11)
N_OUT = 11
K_SPARE, K_ROWS, K_FREED = range(3)  # the replay's counters: spare rows, rows used, segments released


_HELPERS: list[str] = []  # inlined into the kernels when they are compiled
_KERNELS: list[str] = []  # compiled on first use (numba's import alone takes 0.2 s: not paid by runs that replay nothing)


def _inline(fn):
    """A helper of the replay loop, inlined into it when compiled (no call with a dozen array arguments per
    event)."""
    _HELPERS.append(fn.__name__)
    return fn


def _kernel(fn):
    _KERNELS.append(fn.__name__)
    return fn


_LOCK = threading.Lock()  # the replays run in threads (replays.py): the first ones arrive here together


def compiled() -> bool:
    """Compile the kernels (numba, cached on disk), once per process; False where numba is not installed."""
    g = globals()
    with _LOCK:
        if g.get("_DONE"):
            return True
        if importlib.util.find_spec("numba") is None:
            return False
        import numba

        for name in _HELPERS:
            g[name] = numba.njit(inline="always")(g[name])
        for name in _KERNELS:
            g[name] = numba.njit(cache=True, nogil=True)(g[name])
        g["_DONE"] = True
        return True


@_inline
def _bit_length(x):
    n = 0
    if x >= np.int64(1) << 32:
        x >>= 32
        n += 32
    if x >= 1 << 16:
        x >>= 16
        n += 16
    if x >= 1 << 8:
        x >>= 8
        n += 8
    while x > 0:
        x >>= 1
        n += 1
    return n


@_inline
def _round_size(nbytes, divisions):
    """rules.round_size with rules.roundup_division_index's table lookup."""
    if nbytes < kMinBlockSize:
        return kMinBlockSize
    idx = _bit_length(nbytes) - 1 - _ROUNDUP_START_LOG2
    if idx < 0:
        idx = 0
    if idx > ROUNDUP_INTERVALS - 1:
        idx = ROUNDUP_INTERVALS - 1
    d = divisions[idx]
    if d > 1 and nbytes > kMinBlockSize * d:  # rules.roundup_power2_next_division
        if nbytes & (nbytes - 1) == 0:
            return nbytes
        floor = np.int64(1) << (_bit_length(nbytes) - 1)
        step = floor >> (_bit_length(d) - 1)
        if step == 0:
            return floor << 1
        return -(-nbytes // step) * step
    return -(-nbytes // kMinBlockSize) * kMinBlockSize


@_inline
def _allocation_size(rounded, large_segment):
    if rounded <= kSmallSize:
        return kSmallBuffer
    if rounded < kMinLargeAlloc:
        return large_segment
    return -(-rounded // kRoundLarge) * kRoundLarge


# Free blocks by size class: 8 classes per power of two (the class of a size is its top 4 bits), each a doubly
# linked list (unordered); 64 groups of 8 classes, each group counting its blocks, so the first non-empty class above
# a request is found in a few steps.
N_CLASSES = 512
N_GROUPS = N_CLASSES // 8


@_inline
def _class_of(size):
    top = _bit_length(size) - 1
    return top * 8 + ((size >> (top - 3)) & 7)


@_inline
def _push(heads, groups, link_next, link_prev, cls, p, blk, size):
    """Add a free block of `size` bytes to pool p."""
    c = _class_of(size)
    cls[blk] = c
    h = heads[p, c]
    link_next[blk] = h
    link_prev[blk] = -1
    if h >= 0:
        link_prev[h] = blk
    heads[p, c] = blk
    groups[p, c >> 3] += 1


@_inline
def _drop(heads, groups, link_next, link_prev, cls, p, blk):
    """Remove a free block from pool p."""
    c = cls[blk]
    nx = link_next[blk]
    pv = link_prev[blk]
    if pv >= 0:
        link_next[pv] = nx
    else:
        heads[p, c] = nx
    if nx >= 0:
        link_prev[nx] = pv
    groups[p, c >> 3] -= 1


@_inline
def _min_of(heads, link_next, b_size, b_ptr, p, c, size):
    """The block of class c with the smallest (size, ptr) of at least `size` bytes, or -1."""
    best = -1
    bs = np.int64(0)
    bp = np.int64(0)
    k = heads[p, c]
    while k >= 0:
        ks = b_size[k]
        if ks >= size and (best < 0 or ks < bs or (ks == bs and b_ptr[k] < bp)):
            best = k
            bs = ks
            bp = b_ptr[k]
        k = link_next[k]
    return best


@_inline
def _best_fit(heads, groups, link_next, b_size, b_ptr, p, size):
    """The free block of pool p with the smallest (size, ptr) among those of at least `size` bytes, or -1
    (lower_bound on BlockComparatorSize: best fit, lowest address on ties). Every block of a higher class is larger
    than every block of a lower one."""
    c0 = _class_of(size)
    best = _min_of(heads, link_next, b_size, b_ptr, p, c0, size)
    if best >= 0:
        return best
    g0 = c0 >> 3
    for c in range(c0 + 1, (g0 + 1) * 8):
        if heads[p, c] >= 0:
            return _min_of(heads, link_next, b_size, b_ptr, p, c, size)
    for g in range(g0 + 1, N_GROUPS):
        if groups[p, g] > 0:
            for c in range(g * 8, g * 8 + 8):
                if heads[p, c] >= 0:
                    return _min_of(heads, link_next, b_size, b_ptr, p, c, size)
    return -1


@_inline
def _largest_below(heads, link_next, b_size, b_ptr, p, hi_size, hi_ptr):
    """The free block of pool p with the largest (size, ptr) key below (hi_size, hi_ptr), or -1 (the oversize
    release's walk down the pool; only with max_split_size set)."""
    best = -1
    bs = np.int64(0)
    bp = np.int64(0)
    for c in range(N_CLASSES):
        k = heads[p, c]
        while k >= 0:
            ks = b_size[k]
            kp = b_ptr[k]
            if (ks < hi_size or (ks == hi_size and kp < hi_ptr)) and (best < 0 or ks > bs or (ks == bs and kp > bp)):
                best = k
                bs = ks
                bp = kp
            k = link_next[k]
    return best


@_inline
def _release(heads, groups, link_next, link_prev, cls, p, c, spare, k, b_size):
    """release_block: cudaFree the cached segment that free block c is (its row goes back to the spares); its
    bytes."""
    _drop(heads, groups, link_next, link_prev, cls, p, c)
    spare[k[K_SPARE]] = c
    k[K_SPARE] += 1
    k[K_FREED] += 1
    return b_size[c]


@_inline
def _new_row(spare, k, max_blocks):
    """A block row: a spare one, else the next unused; -1 when every row is in use."""
    if k[K_SPARE] > 0:
        k[K_SPARE] -= 1
        return spare[k[K_SPARE]]
    if k[K_ROWS] == max_blocks:
        return -1
    k[K_ROWS] += 1
    return k[K_ROWS] - 1


@_kernel
def replay_native(ids, nbytes, streams, capacity, divisions, max_split, non_split_rounding, large_segment,
                  max_blocks, descending):
    """Replay the events (dense ids, ±bytes, stream numbers from 0) through the native backend; the result vector
    (see the slots). descending: each new segment's synthetic base below the last one's (else above)."""
    out = np.full(N_OUT, -1, dtype=np.int64)
    n_ids = 0
    n_streams = 1
    for k in range(ids.shape[0]):
        if ids[k] + 1 > n_ids:
            n_ids = ids[k] + 1
        if streams[k] + 1 > n_streams:
            n_streams = streams[k] + 1
    live = np.full(n_ids, -1, dtype=np.int64)
    live_bytes = np.zeros(n_ids, dtype=np.int64)
    # blocks
    b_ptr = np.zeros(max_blocks, dtype=np.int64)
    b_size = np.zeros(max_blocks, dtype=np.int64)
    b_seg = np.zeros(max_blocks, dtype=np.int64)
    b_prev = np.full(max_blocks, -1, dtype=np.int64)
    b_next = np.full(max_blocks, -1, dtype=np.int64)
    b_alloc = np.zeros(max_blocks, dtype=np.bool_)
    spare = np.zeros(max_blocks, dtype=np.int64)  # reusable block rows (a stack)
    k = np.zeros(3, dtype=np.int64)
    s_pool = np.zeros(max_blocks, dtype=np.int64)  # a segment's pool
    n_segs = 0
    next_base = np.int64(DESCENDING_TOP) if descending else np.int64(ADDRESS_ALIGN)
    # pools: 2 * stream + 1 small, + 0 large; their free blocks by size class
    heads = np.full((2 * n_streams, N_CLASSES), -1, dtype=np.int64)
    groups = np.zeros((2 * n_streams, N_GROUPS), dtype=np.int64)
    link_next = np.zeros(max_blocks, dtype=np.int64)
    link_prev = np.zeros(max_blocks, dtype=np.int64)
    cls = np.zeros(max_blocks, dtype=np.int64)
    allocated = np.int64(0)
    reserved = np.int64(0)
    peak_alloc = np.int64(0)
    peak_res = np.int64(0)
    peak_alloc_ev = -1
    peak_res_ev = -1
    num_alloc = 0
    oom_event = -1
    oom_bytes = np.int64(0)
    replayed = 0
    for ev in range(ids.shape[0]):
        replayed = ev + 1
        nb = nbytes[ev]
        if nb > 0:
            size = _round_size(nb, divisions)
            small = size <= kSmallSize
            p = 2 * streams[ev] + (1 if small else 0)
            alloc_size = _allocation_size(size, large_segment)
            # get_free_block
            blk = -1
            cand = _best_fit(heads, groups, link_next, b_size, b_ptr, p, size)
            if cand >= 0:
                bs = b_size[cand]
                ok = bs < max_split if size < max_split else bs < size + non_split_rounding
                if ok:
                    _drop(heads, groups, link_next, link_prev, cls, p, cand)
                    blk = cand
            if blk < 0:
                for attempt in range(3):
                    # attempt 0: alloc_block; 1: after release_available_cached_blocks (max_split set);
                    # 2: after release_cached_blocks
                    if attempt == 1:
                        if max_split >= UNLIMITED:
                            continue
                        key = size if size > max_split else max_split
                        c = _best_fit(heads, groups, link_next, b_size, b_ptr, p, key)
                        released = False
                        if c >= 0:
                            reserved -= _release(heads, groups, link_next, link_prev, cls, p, c, spare, k, b_size)
                            released = True
                        else:  # oversize segments from the largest down until enough bytes are freed
                            got = np.int64(0)
                            hs = UNLIMITED
                            hp = UNLIMITED
                            while got < key:
                                c = _largest_below(heads, link_next, b_size, b_ptr, p, hs, hp)
                                if c < 0 or b_size[c] < max_split:
                                    break
                                hs = b_size[c]
                                hp = b_ptr[c]
                                got += b_size[c]
                                reserved -= _release(heads, groups, link_next, link_prev, cls, p, c, spare, k,
                                                     b_size)
                            released = got >= key
                        if not released:
                            continue
                    elif attempt == 2:
                        for qq in range(2 * n_streams):  # large pools, then small: every segment wholly free
                            q = 2 * (qq % n_streams) + qq // n_streams
                            for cc in range(N_CLASSES):
                                c = heads[q, cc]
                                while c >= 0:
                                    nx = link_next[c]
                                    if b_prev[c] < 0 and b_next[c] < 0:
                                        reserved -= _release(heads, groups, link_next, link_prev, cls, q, c, spare,
                                                             k, b_size)
                                    c = nx
                    if reserved + alloc_size > capacity:
                        continue
                    # a new segment
                    seg = n_segs
                    n_segs += 1
                    s_pool[seg] = p
                    spacing = (-(-alloc_size // ADDRESS_ALIGN) + 1) * ADDRESS_ALIGN
                    if descending:
                        next_base -= spacing
                        base = next_base
                    else:
                        base = next_base
                        next_base += spacing
                    reserved += alloc_size
                    if reserved > peak_res:
                        peak_res = reserved
                        peak_res_ev = ev
                    num_alloc += 1
                    blk = _new_row(spare, k, max_blocks)
                    if blk < 0:
                        out[REPLAYED] = -2  # the rows ran out: the caller retries with more
                        return out
                    b_ptr[blk] = base
                    b_size[blk] = alloc_size
                    b_seg[blk] = seg
                    b_prev[blk] = -1
                    b_next[blk] = -1
                    b_alloc[blk] = False
                    break
                if blk < 0:
                    oom_event = ev
                    oom_bytes = nb
                    break
            # should_split
            remaining = b_size[blk] - size
            if small:
                split = remaining >= kMinBlockSize
            else:
                split = size < max_split and remaining > kSmallSize
            if split:  # alloc_found_block: the allocated part takes the low address
                nbk = _new_row(spare, k, max_blocks)
                if nbk < 0:
                    out[REPLAYED] = -2
                    return out
                b_ptr[nbk] = b_ptr[blk]
                b_size[nbk] = size
                b_seg[nbk] = b_seg[blk]
                b_prev[nbk] = b_prev[blk]
                if b_prev[nbk] >= 0:
                    b_next[b_prev[nbk]] = nbk
                b_next[nbk] = blk
                b_prev[blk] = nbk
                b_ptr[blk] += size
                b_size[blk] -= size
                _push(heads, groups, link_next, link_prev, cls, p, blk, b_size[blk])
                blk = nbk
            b_alloc[blk] = True
            live[ids[ev]] = blk
            live_bytes[ids[ev]] = nb
            allocated += b_size[blk]
            if allocated > peak_alloc:
                peak_alloc = allocated
                peak_alloc_ev = ev
        elif nb < 0:
            blk = live[ids[ev]]
            live[ids[ev]] = -1
            b_alloc[blk] = False
            allocated -= b_size[blk]
            p = s_pool[b_seg[blk]]
            for side in range(2):  # try_merge_blocks with prev, then next
                src = b_prev[blk] if side == 0 else b_next[blk]
                if src < 0 or b_alloc[src]:
                    continue
                _drop(heads, groups, link_next, link_prev, cls, p, src)
                if side == 0:
                    b_ptr[blk] = b_ptr[src]
                    b_prev[blk] = b_prev[src]
                    if b_prev[blk] >= 0:
                        b_next[b_prev[blk]] = blk
                else:
                    b_next[blk] = b_next[src]
                    if b_next[blk] >= 0:
                        b_prev[b_next[blk]] = blk
                b_size[blk] += b_size[src]
                spare[k[K_SPARE]] = src
                k[K_SPARE] += 1
            _push(heads, groups, link_next, link_prev, cls, p, blk, b_size[blk])
    out[PEAK_ALLOCATED] = peak_alloc
    out[PEAK_RESERVED] = peak_res
    out[END_ALLOCATED] = allocated
    out[END_RESERVED] = reserved
    out[NUM_ALLOC] = num_alloc
    out[NUM_FREE] = k[K_FREED]
    out[PEAK_ALLOCATED_EVENT] = peak_alloc_ev
    out[PEAK_RESERVED_EVENT] = peak_res_ev
    out[REPLAYED] = replayed
    out[OOM_EVENT] = oom_event
    out[OOM_BYTES] = oom_bytes
    return out


def available() -> bool:
    return importlib.util.find_spec("numba") is not None


def warm() -> None:
    """Compile the replay now (numba keeps the machine code in its cache): `make install` calls it, so a user's
    first scenario does not wait for the compiler."""
    if compiled():
        ids = np.array([0, 0], dtype=np.int64)
        nbytes = np.array([512, -512], dtype=np.int64)
        replay_native(ids, nbytes, np.zeros(2, dtype=np.int64), UNLIMITED, np.zeros(ROUNDUP_INTERVALS, dtype=np.int64),
                      UNLIMITED, kLargeBuffer, kLargeBuffer, 16, False)


def dense(events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids from 0 in a range the live map can hold, ±bytes) of an (n, 2) event array: the ids as they are where
    they already are small non-negative numbers (the replayed sequences number their storages so), else renumbered
    0..k-1."""
    ev = np.asarray(events, dtype=np.int64)
    ids = ev[:, 0]
    if len(ids) and 0 <= ids.min() and ids.max() < 4 * len(ids) + 4096:
        return np.ascontiguousarray(ids), np.ascontiguousarray(ev[:, 1])
    _, ids = np.unique(ids, return_inverse=True)
    return ids.astype(np.int64).reshape(-1), np.ascontiguousarray(ev[:, 1])


def peak_live(nbytes: np.ndarray) -> int:
    """The most allocations live at once."""
    return int(np.cumsum(np.sign(nbytes)).max(initial=0))


def run(ids: np.ndarray, nbytes: np.ndarray, options, capacity: int | None,  # noqa: ANN001
        live_peak: int | None = None, descending: bool = False, streams: np.ndarray | None = None) -> np.ndarray:
    """The compiled replay of dense events under `options` (not expandable) within `capacity` (None: none), new
    segments' addresses ascending or `descending`, each event on its stream (numbered from 0; None: all on 0). Block
    rows: live blocks, the free blocks between them and the cached segments; 3x the live peak is room for every traced
    step met so far, and a replay that runs out is run again with room for every event."""
    compiled()
    divisions = np.asarray(options.divisions_table(), dtype=np.int64)
    max_split = min(options.max_split_bytes, UNLIMITED)
    cap = UNLIMITED if capacity is None else int(capacity)
    rows = 3 * (peak_live(nbytes) if live_peak is None else live_peak) + 4096
    st = np.zeros(len(ids), dtype=np.int64) if streams is None else streams
    out = replay_native(ids, nbytes, st, cap, divisions, max_split, options.non_split_rounding_bytes,
                        options.large_segment_bytes, rows, bool(descending))
    if out[REPLAYED] == -2:
        out = replay_native(ids, nbytes, st, cap, divisions, max_split, options.non_split_rounding_bytes,
                            options.large_segment_bytes, 2 * int(len(ids)) + 8, bool(descending))
    return out
