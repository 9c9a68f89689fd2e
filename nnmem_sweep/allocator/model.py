"""A model of DeviceCachingAllocator (c10/cuda/CUDACachingAllocator.cpp, native backend) for one device: blocks,
segments, the two pools, best fit, splitting, merging, releasing cached segments when cudaMalloc fails, expandable
segments, and streams (a segment belongs to the stream that made it; a request is served only from its own stream's
blocks: BlockComparatorSize orders by stream first and get_free_block gives up on another stream's block). Each
method names the C++ function it models. Addresses are synthetic: every new
segment gets a fresh base above the previous ones (cudaMalloc's real addresses are unknown), so "lowest address"
among segments means "oldest segment", which is also the newer sources' tie-break (registration_counter); or, with
`descending`, below them ("newest segment"): the driver does either (an H100's recordings show both), and a plan's
replays take the larger need of the two (replays.least_capacity).

Streams' events (record_stream) are not modelled as time: a block used on another stream returns to its pool at
its free_completed, which a real snapshot's trace records and a plan's sequence does not have. Not modelled: CUDA
graphs and private pools, garbage_collection_threshold
(acts only under a per-process memory fraction), the free-memory callbacks, and the fragmentation of the driver's own
physical memory (a cudaMalloc succeeds whenever reserved + size ≤ capacity).
"""
from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

from .options import AllocatorOptions
from .rules import (kLargeBuffer, kSmallBuffer, allocation_size, is_small, oversize_ok, round_size,
                    roundup_division_index, should_split)

ADDRESS_ALIGN = 1 << 30  # synthetic segment bases are spaced apart so that no two segments touch
# Where the driver puts a new segment is its own choice (the H100 kit's recordings show runs of rising and of falling
# addresses), and ties between equal free blocks fall to the lowest address: a replay takes one order of its own,
# each new segment above the last (ascending) or below it (descending, from DESCENDING_TOP down).
DESCENDING_TOP = 1 << 52


class _Segment:
    """One cudaMalloc (native) or one reserved address range mapped in pages (expandable)."""

    __slots__ = ("base", "small", "page", "size", "stream")

    def __init__(self, base: int, small: bool, page: int, size: int, stream: int = 0):
        self.base, self.small, self.page, self.size = base, small, page, size  # page 0: not expandable
        self.stream = stream


class _Block:
    __slots__ = ("ptr", "size", "allocated", "mapped", "prev", "next", "seg")

    def __init__(self, ptr: int, size: int, seg: _Segment, mapped: bool = True):
        self.ptr, self.size, self.seg, self.mapped = ptr, size, seg, mapped
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _Pool:
    """One stream's part of a BlockPool: free mapped blocks ordered by (size, address) (BlockComparatorSize
    orders by stream first, and a request never takes another stream's block), and unmapped ranges of expandable
    segments ordered by address (BlockComparatorAddress)."""

    __slots__ = ("small", "stream", "keys", "free", "unmapped", "unmapped_blocks")

    def __init__(self, small: bool, stream: int = 0):
        self.small, self.stream = small, stream
        self.keys: list[tuple[int, int]] = []  # sorted (size, ptr) of free mapped blocks
        self.free: dict[int, _Block] = {}  # ptr -> free mapped block
        self.unmapped: list[int] = []  # sorted ptrs of unmapped blocks
        self.unmapped_blocks: dict[int, _Block] = {}

    def insert(self, b: _Block) -> None:  # BlockPool::insert_into_blocks
        insort(self.keys, (b.size, b.ptr))
        self.free[b.ptr] = b

    def erase(self, b: _Block) -> None:
        del self.keys[bisect_left(self.keys, (b.size, b.ptr))]
        del self.free[b.ptr]

    def insert_unmapped(self, b: _Block) -> None:
        insort(self.unmapped, b.ptr)
        self.unmapped_blocks[b.ptr] = b

    def erase_unmapped(self, b: _Block) -> None:
        del self.unmapped[bisect_left(self.unmapped, b.ptr)]
        del self.unmapped_blocks[b.ptr]

    def block_at(self, i: int) -> _Block:
        return self.free[self.keys[i][1]]


@dataclass(frozen=True)
class BlockInfo:
    """One block of a segment, as torch.cuda.memory_snapshot() lists it (offset from the segment base)."""

    offset: int
    size: int
    state: str  # "allocated", "free" or "unmapped"


@dataclass(frozen=True)
class SegmentInfo:
    base: int
    small: bool
    expandable: bool
    blocks: tuple[BlockInfo, ...]
    stream: int = 0

    @property
    def reserved_bytes(self) -> int:
        return sum(b.size for b in self.blocks if b.state != "unmapped")


class CachingAllocatorModel:
    """DeviceCachingAllocator for one device. `malloc` returns a block or None (out of memory);
    the statistics mirror torch.cuda.memory_stats(): allocated_bytes, reserved_bytes, num_device_alloc/free."""

    def __init__(self, options: AllocatorOptions = AllocatorOptions(), capacity_bytes: int | None = None,
                 device_total_bytes: int | None = None, descending: bool = False):
        self.options = options
        self.descending = descending  # the synthetic segment addresses' order (see DESCENDING_TOP)
        self.capacity = capacity_bytes if capacity_bytes is not None else 1 << 62
        total = device_total_bytes if device_total_bytes is not None else self.capacity
        # ExpandableSegment reserves address space for 9/8 of the device's total memory
        self._reserve_bytes = total + total // 8
        self._divisions = options.divisions_table()
        self._expandable = options.expandable_segments
        self._max_split = options.max_split_bytes
        self._non_split_rounding = options.non_split_rounding_bytes
        self._large_segment = options.large_segment_bytes
        self._pools: dict[tuple[int, bool], _Pool] = {}  # (stream, small) -> that stream's part of the pool
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self.num_device_alloc = self.num_device_free = 0
        self.event = -1  # index of the event being replayed; the peaks note it
        self.peak_allocated_event = self.peak_reserved_event = -1
        self._next_base = DESCENDING_TOP if descending else ADDRESS_ALIGN
        self._live: dict[int, _Block] = {}  # ptr -> allocated block
        # the address of the next segment, where it is known (a replayed snapshot's), else None: synthetic
        self.next_address: int | None = None
        self._expandable_segments: list[_Segment] = []

    # ---- statistics ------------------------------------------------------------------------------------------
    def _reserve(self, nbytes: int) -> None:
        self.reserved += nbytes
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
            self.peak_reserved_event = self.event
        self.num_device_alloc += 1

    def _unreserve(self, nbytes: int) -> None:
        self.reserved -= nbytes
        self.num_device_free += 1

    def pool(self, stream: int, small: bool) -> _Pool:
        """The stream's part of the small or the large BlockPool."""
        pool = self._pools.get((stream, small))
        if pool is None:
            pool = self._pools[(stream, small)] = _Pool(small, stream)
        return pool

    def _new_segment(self, small: bool, page: int, size: int, stream: int) -> _Segment:
        if self.next_address is not None:  # a real snapshot's address (snapshot.py): its ties are broken by it
            seg, self.next_address = _Segment(self.next_address, small, page, size, stream), None
            return seg
        step = (-(-size // ADDRESS_ALIGN) + 1) * ADDRESS_ALIGN
        if self.descending:
            self._next_base -= step
            return _Segment(self._next_base, small, page, size, stream)
        seg = _Segment(self._next_base, small, page, size, stream)
        self._next_base += step
        return seg

    def adopt_segment(self, size: int, small: bool, allocated: list[tuple[int, int]], stream: int = 0
                      ) -> list[_Block]:
        """A native segment that exists before the replay starts (a real snapshot's: allocator/snapshot.py): `size`
        bytes of `stream` in the small or large pool, blocks allocated at (offset, bytes), the space between them
        free blocks. Counted as reserved (and as a cudaMalloc); returns the allocated blocks in address order."""
        seg = self._new_segment(small, 0, size, stream)
        self._reserve(size)
        pool = self.pool(stream, small)
        pieces, pos = [], 0
        for off, n in sorted(allocated):
            if off > pos:
                pieces.append((pos, off - pos, False))
            pieces.append((off, n, True))
            pos = off + n
        if pos < size:
            pieces.append((pos, size - pos, False))
        out, prev = [], None
        for off, n, on in pieces:
            b = _Block(seg.base + off, n, seg)
            b.prev = prev
            if prev is not None:
                prev.next = b
            prev = b
            if on:
                b.allocated = True
                self._live[b.ptr] = b
                self.allocated += n
                out.append(b)
            else:
                pool.insert(b)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return out

    # ---- malloc ----------------------------------------------------------------------------------------------
    def request_sizes(self, nbytes: int) -> tuple[int, int]:
        """(rounded size, segment size) of a request (round_size, get_allocation_size)."""
        size = round_size(nbytes, self._divisions[roundup_division_index(nbytes)])
        return size, allocation_size(size, self._large_segment)

    def malloc(self, nbytes: int, stream: int = 0) -> _Block | None:
        """DeviceCachingAllocator::malloc on `stream`: best fit among the stream's free blocks, else a new segment,
        else release cached blocks (every stream's: release_cached_blocks) and retry."""
        size, alloc_size = self.request_sizes(nbytes)
        pool = self.pool(stream, is_small(size))
        block = self._get_free_block(pool, size)
        if block is None:
            block = self._alloc_block(pool, size, alloc_size)
            if block is None and self._release_available_cached_blocks(pool, size):
                block = self._alloc_block(pool, size, alloc_size)
            if block is None:
                self.release_cached_blocks()
                block = self._alloc_block(pool, size, alloc_size)
            if block is None:
                return None
        split = should_split(block.size, size, pool.small, self._expandable, self._max_split)
        return self._alloc_found_block(block, size, pool, split)

    def _get_free_block(self, pool: _Pool, size: int) -> _Block | None:
        """get_free_block: the smallest free block ≥ size, lowest address on ties (lower_bound on
        BlockComparatorSize); with expandable segments, prefer a block whose size-plus-unmapped-tail is smaller."""
        keys = pool.keys
        i = bisect_left(keys, (size, 0))
        if i == len(keys):
            return None
        if self._expandable:
            def expandable_size(b: _Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
            while i + 1 < len(keys) and expandable_size(pool.block_at(i + 1)) < expandable_size(pool.block_at(i)):
                i += 1
        block = pool.block_at(i)
        if not oversize_ok(block.size, size, self._max_split, self._non_split_rounding):
            return None
        pool.erase(block)
        return block

    def _alloc_block(self, pool: _Pool, size: int, alloc_size: int) -> _Block | None:
        """alloc_block: cudaMalloc(alloc_size) as a new segment, or (expandable) map pages for `size`."""
        if self._expandable:
            return self._try_allocate_expandable_block(pool, size)
        if self.reserved + alloc_size > self.capacity:
            return None  # cudaErrorMemoryAllocation
        seg = self._new_segment(pool.small, 0, alloc_size, pool.stream)
        self._reserve(alloc_size)
        return _Block(seg.base, alloc_size, seg)

    def _alloc_found_block(self, block: _Block, size: int, pool: _Pool, split: bool) -> _Block:
        """alloc_found_block: the allocated part takes the low addresses; the remainder goes back to the pool."""
        if split:
            remaining = block
            block = _Block(remaining.ptr, size, remaining.seg)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.ptr += size
            remaining.size -= size
            pool.insert(remaining)
        block.allocated = True
        self._live[block.ptr] = block
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
            self.peak_allocated_event = self.event
        return block

    # ---- free ------------------------------------------------------------------------------------------------
    def free(self, block: _Block) -> None:
        """free -> free_block: merge with free neighbours of the same segment (try_merge_blocks), cache it."""
        block.allocated = False
        del self._live[block.ptr]
        self.allocated -= block.size
        pool = self._pool_of(block)
        self._try_merge_blocks(block, block.prev, pool)
        self._try_merge_blocks(block, block.next, pool)
        pool.insert(block)

    def _pool_of(self, block: _Block) -> _Pool:
        return self.pool(block.seg.stream, block.seg.small)

    @staticmethod
    def _try_merge_blocks(dst: _Block, src: _Block | None, pool: _Pool) -> int:
        """try_merge_blocks: absorb a free neighbour in the same mapped state; segments never merge (prev/next
        links exist only inside one segment)."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if src.mapped:
            pool.erase(src)
        else:
            pool.erase_unmapped(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # ---- releasing cached memory -----------------------------------------------------------------------------
    def _release_available_cached_blocks(self, pool: _Pool, size: int) -> bool:
        """release_available_cached_blocks: with max_split_size set, free one cached oversize segment that covers
        the request, else oversize segments from the largest down until enough bytes are freed."""
        if self.options.max_split_size_mb is None:
            return False
        key = max(size, self._max_split)
        keys = pool.keys
        i = bisect_left(keys, (key, 0))
        if i < len(keys) and not pool.block_at(i).seg.page:
            self._release_block(pool.block_at(i), pool)
            return True
        released, j = 0, i - 1
        while released < key and j >= 0:
            b = pool.block_at(j)
            if b.size < self._max_split:
                break
            if not b.seg.page:
                released += b.size
                self._release_block(b, pool)
            j -= 1
        return released >= key

    def release_cached_blocks(self) -> None:
        """release_cached_blocks (also emptyCache): free every cached segment that is entirely free (release_blocks,
        large pool then small, every stream); with expandable segments unmap every wholly free page and drop empty
        segments."""
        for _, pool in sorted(self._pools.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            to_unmap = []
            for b in [pool.free[ptr] for _, ptr in pool.keys]:
                if b.seg.page:
                    to_unmap.append(b)
                elif not b.is_split():
                    self._release_block(b, pool)
            for b in to_unmap:
                self._unmap_block(b, pool)
                if not b.mapped and not b.is_split():
                    self._release_expandable_segment(b, pool)

    def _release_block(self, block: _Block, pool: _Pool) -> None:
        """release_block: cudaFree a whole cached segment."""
        assert not block.is_split() and not block.seg.page
        pool.erase(block)
        self._unreserve(block.size)

    def _release_expandable_segment(self, block: _Block, pool: _Pool) -> None:
        """release_expandable_segment: the whole address range is unmapped; forget the segment."""
        pool.erase_unmapped(block)
        self._expandable_segments.remove(block.seg)

    # ---- expandable segments ---------------------------------------------------------------------------------
    def _find_expandable_block(self, pool: _Pool, size: int) -> _Block:
        """find_expandable_block: the lowest-address unmapped range (with the free block before it) that has room
        for `size`; else a new segment reserving 9/8 of the device's memory, mapped in 2 MiB pages (small pool)
        or large_segment_size pages (20 MiB, large pool)."""
        for ptr in pool.unmapped:
            c = pool.unmapped_blocks[ptr]
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            room, b = 0, c
            while room < size and b is not None and not b.allocated:
                room += b.size
                b = b.next
            if room >= size:
                return c
        page = kSmallBuffer if pool.small else self._large_segment
        seg = self._new_segment(pool.small, page, -(-self._reserve_bytes // page) * page, pool.stream)
        self._expandable_segments.append(seg)
        candidate = _Block(seg.base, seg.size, seg, mapped=False)
        pool.insert_unmapped(candidate)
        return candidate

    def _map_block(self, to_map: _Block, size: int, pool: _Pool) -> bool:
        """map_block / ExpandableSegment::map: map whole pages covering [ptr, ptr + size); all or nothing."""
        seg = to_map.seg
        begin = to_map.ptr - seg.base  # unmapped ranges start on a page boundary
        mapped = -(-(begin + size) // seg.page) * seg.page - begin
        if self.reserved + mapped > self.capacity:
            return False  # cuMemCreate failed: the pages already created are released again
        pool.erase_unmapped(to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            rest = _Block(to_map.ptr + mapped, to_map.size - mapped, seg, mapped=False)
            rest.prev, rest.next = to_map, to_map.next
            if to_map.next is not None:
                to_map.next.prev = rest
            to_map.next = rest
            pool.insert_unmapped(rest)
            to_map.size = mapped
        self._try_merge_blocks(to_map, to_map.prev, pool)
        self._try_merge_blocks(to_map, to_map.next, pool)
        pool.insert(to_map)
        self._reserve(mapped)
        return True

    def _try_allocate_expandable_block(self, pool: _Pool, size: int) -> _Block | None:
        """try_allocate_expandable_block: map just enough pages after (or into) the chosen range for `size`."""
        candidate = self._find_expandable_block(pool, size)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size), pool):
            return None
        while candidate.size < size:
            nxt = candidate.next
            if not self._map_block(nxt, min(size - candidate.size, nxt.size), pool):
                return None
            candidate = nxt
        pool.erase(candidate)
        return candidate

    def _unmap_block(self, block: _Block, pool: _Pool) -> None:
        """unmap_block / ExpandableSegment::unmap: return the pages lying wholly inside a free block."""
        seg, page = block.seg, block.seg.page
        begin = -(-(block.ptr - seg.base) // page) * page + seg.base
        end = (block.ptr + block.size - seg.base) // page * page + seg.base
        if begin >= end:
            return
        pool.erase(block)
        if begin > block.ptr:
            before = _Block(block.ptr, begin - block.ptr, seg)
            before.prev, before.next = block.prev, block
            if block.prev is not None:
                block.prev.next = before
            block.prev = before
            pool.insert(before)
        if end < block.ptr + block.size:
            after = _Block(end, block.ptr + block.size - end, seg)
            after.prev, after.next = block, block.next
            if block.next is not None:
                block.next.prev = after
            block.next = after
            pool.insert(after)
        block.ptr, block.size, block.mapped = begin, end - begin, False
        self._try_merge_blocks(block, block.prev, pool)
        self._try_merge_blocks(block, block.next, pool)
        pool.insert_unmapped(block)
        self._unreserve(end - begin)

    # ---- inspection ------------------------------------------------------------------------------------------
    def snapshot(self) -> tuple[SegmentInfo, ...]:
        """Segments by base address with their blocks (torch.cuda.memory_snapshot()'s shape, simplified)."""
        blocks: list[_Block] = list(self._live.values())
        for pool in self._pools.values():
            blocks += pool.free.values()
            blocks += pool.unmapped_blocks.values()
        by_seg: dict[int, list[_Block]] = {}
        segs: dict[int, _Segment] = {}
        for b in blocks:
            by_seg.setdefault(b.seg.base, []).append(b)
            segs[b.seg.base] = b.seg
        out = []
        for base in sorted(by_seg):
            seg = segs[base]
            infos = tuple(BlockInfo(b.ptr - base, b.size, "unmapped" if not b.mapped else
                                    "allocated" if b.allocated else "free")
                          for b in sorted(by_seg[base], key=lambda b: b.ptr))
            out.append(SegmentInfo(base, seg.small, bool(seg.page), infos, seg.stream))
        return tuple(out)


__all__ = ["BlockInfo", "CachingAllocatorModel", "SegmentInfo", "kLargeBuffer"]
