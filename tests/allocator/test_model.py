"""Each allocator rule through a replay, with hand-computed bytes (the comments do the arithmetic)."""
from __future__ import annotations

import numpy as np
import pytest

from nnmem_sweep.allocator import AllocatorOptions, CachingAllocatorModel, replay
from nnmem_sweep.units import MiB

EXPANDABLE = AllocatorOptions(expandable_segments=True)


def run(events, options=AllocatorOptions(), capacity=None):
    return replay(np.array(events, dtype=np.int64), options, capacity)


def test_one_byte_takes_512_bytes_of_a_2_mib_small_segment():
    r = run([(0, 1)])
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes, r.segments_allocated) == (512, 2 * MiB, 1)


def test_small_requests_share_a_2_mib_segment():
    # 1 MiB + 1 MiB fill one 2 MiB segment; the third 1 MiB needs a second one
    r = run([(0, MiB), (1, MiB)])
    assert (r.peak_reserved_bytes, r.segments_allocated) == (2 * MiB, 1)
    r = run([(0, MiB), (1, MiB), (2, MiB)])
    assert (r.peak_reserved_bytes, r.segments_allocated) == (4 * MiB, 2)


def test_just_over_1_mib_goes_to_a_20_mib_large_segment():
    r = run([(0, MiB + 1)])  # rounded to 1 MiB + 512 B: the large pool
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes) == (MiB + 512, 20 * MiB)


def test_just_over_10_mib_reserves_12_mib():
    r = run([(0, 10 * MiB + 1)])  # rounded 10 MiB + 512 B, segment rounded up to 2 MiB; 2 MiB - 512 B split off
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes) == (10 * MiB + 512, 12 * MiB)


def test_unsplit_remainder_counts_as_allocated():
    # 11 MiB in a 12 MiB segment leaves exactly 1 MiB, not > 1 MiB: the block keeps it, and
    # max_memory_allocated() counts block sizes, so 12 MiB (more than the tensor's bytes)
    r = run([(0, 11 * MiB)])
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes) == (12 * MiB, 12 * MiB)


def test_small_pool_splits_down_to_512_bytes():
    # 1 MiB, then 1 MiB - 512 from the rest (512 B left: split), then the last 512 B: one segment, full
    r = run([(0, MiB), (1, MiB - 512), (2, 512)])
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes, r.segments_allocated) == (2 * MiB, 2 * MiB, 1)


def test_best_fit_takes_the_smallest_free_block():
    # A 4 MiB splits a 20 MiB segment (free 16 MiB); B 30 MiB gets its own segment, then is freed.
    # 15 MiB: best fit is the 16 MiB block (not the 30 MiB one); 1 MiB left is not split off -> 16 MiB allocated
    r = run([(0, 4 * MiB), (1, 30 * MiB), (1, -30 * MiB), (2, 15 * MiB)])
    assert r.end_allocated_bytes == 4 * MiB + 16 * MiB
    assert (r.end_reserved_bytes, r.segments_allocated) == (50 * MiB, 2)


def test_equal_sizes_tie_to_the_lowest_address():
    model = CachingAllocatorModel()
    a, b = model.malloc(20 * MiB), model.malloc(20 * MiB)  # two 20 MiB segments, a's first (lower address)
    model.free(b)
    model.free(a)
    c = model.malloc(20 * MiB)
    segments = model.snapshot()
    assert [s.blocks[0].state for s in segments] == ["allocated", "free"]
    assert c.ptr == segments[0].base


def test_allocated_part_takes_the_low_address():
    model = CachingAllocatorModel()
    model.malloc(4 * MiB)
    (segment,) = model.snapshot()
    assert [(b.offset, b.size, b.state) for b in segment.blocks] == [(0, 4 * MiB, "allocated"),
                                                                     (4 * MiB, 16 * MiB, "free")]


def test_freed_neighbours_merge_inside_a_segment():
    # three 5 MiB blocks from one 20 MiB segment; freeing the first two leaves a 10 MiB block, where 8 MiB fits
    r = run([(0, 5 * MiB), (1, 5 * MiB), (2, 5 * MiB), (0, -5 * MiB), (1, -5 * MiB), (3, 8 * MiB)])
    assert (r.end_reserved_bytes, r.segments_allocated) == (20 * MiB, 1)


def test_segments_never_merge():
    # two free 20 MiB segments cannot serve 40 MiB together: a third segment
    r = run([(0, 20 * MiB), (1, 20 * MiB), (0, -20 * MiB), (1, -20 * MiB), (2, 40 * MiB)])
    assert (r.end_reserved_bytes, r.segments_allocated) == (80 * MiB, 3)


def test_a_stream_never_takes_another_streams_free_block():
    # 4 MiB on stream 7 makes a 20 MiB segment of stream 7 and is freed: 20 MiB free, but stream 7's. The same
    # 4 MiB on the default stream makes a segment of its own; on stream 7 again it reuses the cached block.
    m = CachingAllocatorModel()
    m.free(m.malloc(4 * MiB, stream=7))
    b = m.malloc(4 * MiB)
    assert (m.reserved, b.seg.stream, m.num_device_alloc) == (40 * MiB, 0, 2)
    c = m.malloc(4 * MiB, stream=7)
    assert (m.reserved, c.seg.stream, m.num_device_alloc) == (40 * MiB, 7, 2)
    # a freed block goes back to its own stream's pool and merges there: stream 7's segment is whole again
    m.free(c)
    assert [(s.stream, [(x.size, x.state) for x in s.blocks]) for s in m.snapshot()] == [
        (7, [(20 * MiB, "free")]), (0, [(4 * MiB, "allocated"), (16 * MiB, "free")])]


def test_empty_cache_releases_every_streams_whole_free_segments():
    # stream 3's 2 MiB small segment and stream 0's 20 MiB one are free: both go; stream 5's in-use one stays
    m = CachingAllocatorModel()
    m.free(m.malloc(MiB, stream=3))
    m.free(m.malloc(4 * MiB))
    m.malloc(4 * MiB, stream=5)
    assert m.reserved == 42 * MiB
    m.release_cached_blocks()
    assert (m.reserved, m.num_device_free, [s.stream for s in m.snapshot()]) == (20 * MiB, 2, [5])


def test_out_of_memory_on_one_stream_releases_another_streams_cache():
    # capacity 40 MiB: stream 1's cached free 20 MiB segment cannot serve the default stream's 30 MiB, but it is
    # released (release_cached_blocks frees every stream's) so that the new segment fits
    m = CachingAllocatorModel(capacity_bytes=40 * MiB)
    m.free(m.malloc(20 * MiB, stream=1))
    b = m.malloc(30 * MiB)
    assert b is not None and (m.reserved, m.num_device_free) == (30 * MiB, 1)


def test_failed_cudamalloc_frees_cached_segments_and_retries():
    # capacity 40 MiB: a cached free 20 MiB segment is returned so that 30 MiB fits
    r = run([(0, 20 * MiB), (0, -20 * MiB), (1, 30 * MiB)], capacity=40 * MiB)
    assert not r.oom
    assert (r.end_reserved_bytes, r.peak_reserved_bytes, r.segments_released) == (30 * MiB, 30 * MiB, 1)


def test_a_split_segment_in_use_is_not_freed_and_the_request_fails():
    # 4 MiB keeps its 20 MiB segment; 20 + 30 > 40 MiB -> out of memory at event 1
    r = run([(0, 4 * MiB), (1, 30 * MiB)], capacity=40 * MiB)
    assert (r.oom_event, r.events_replayed, r.segments_released) == (1, 2, 0)
    assert r.oom_message == (
        "CUDA out of memory. Tried to allocate 30.00 MiB. GPU 0 has a total capacity of 40.00 MiB of which "
        "20.00 MiB is free. Including non-PyTorch memory, this process has 20.00 MiB memory in use. Of the allocated "
        "memory 4.00 MiB is allocated by PyTorch, and 16.00 MiB is reserved by PyTorch but unallocated."
        " If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        " to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/"
        "notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")


def test_oom_message_names_the_device_total():
    r = replay(np.array([(0, 50 * MiB)]), capacity_bytes=40 * MiB, device_total_bytes=48 * MiB)
    assert "total capacity of 48.00 MiB of which 40.00 MiB is free. Including non-PyTorch memory, this process " \
           "has 8.00 MiB memory in use." in r.oom_message


def test_max_split_size_keeps_oversize_blocks_for_oversize_requests():
    opts = AllocatorOptions(max_split_size_mb=32)
    # a cached 60 MiB block is not used for 10 MiB (a new 10 MiB segment) ...
    r = run([(0, 60 * MiB), (0, -60 * MiB), (1, 10 * MiB)], opts)
    assert r.end_reserved_bytes == 70 * MiB
    # ... nor for 40 MiB (60 >= 40 + 20: new 40 MiB segment), but for 41 MiB it is, whole (no split)
    r = run([(0, 60 * MiB), (0, -60 * MiB), (1, 40 * MiB)], opts)
    assert r.end_reserved_bytes == 100 * MiB
    r = run([(0, 60 * MiB), (0, -60 * MiB), (1, 41 * MiB)], opts)
    assert (r.end_reserved_bytes, r.end_allocated_bytes) == (60 * MiB, 60 * MiB)


def test_oversize_segments_are_released_first():
    # cached: Z 20 MiB and X 60 MiB (oversize). 30 MiB does not fit in 80 MiB: release_available_cached_blocks
    # frees X alone (the smallest oversize block >= max_split_size), Z stays cached
    events = [(0, 20 * MiB), (1, 60 * MiB), (0, -20 * MiB), (1, -60 * MiB), (2, 30 * MiB)]
    r = run(events, AllocatorOptions(max_split_size_mb=32), capacity=80 * MiB)
    assert (r.end_reserved_bytes, r.segments_released) == (50 * MiB, 1)
    # without max_split_size the 60 MiB block is split for the 30 MiB request and nothing is released
    r = run(events, capacity=80 * MiB)
    assert (r.end_reserved_bytes, r.segments_released) == (80 * MiB, 0)


def test_roundup_power2_divisions_option():
    r = run([(0, 84 * MiB)], AllocatorOptions(roundup_power2_divisions=4))
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes) == (96 * MiB, 96 * MiB)


class TestExpandable:
    def test_pages_of_2_mib_small_and_20_mib_large(self):
        assert run([(0, 1)], EXPANDABLE).peak_reserved_bytes == 2 * MiB
        assert run([(0, MiB + 1)], EXPANDABLE).peak_reserved_bytes == 20 * MiB
        # 10 MiB + 1 maps one 20 MiB page (the native backend reserved 12 MiB)
        r = run([(0, 10 * MiB + 1)], EXPANDABLE)
        assert (r.peak_allocated_bytes, r.peak_reserved_bytes) == (10 * MiB + 512, 20 * MiB)

    def test_segment_grows_by_pages_from_its_free_tail(self):
        # 15 MiB maps [0, 20); the next 15 MiB starts in the free tail [15, 20) and maps one more page
        model = CachingAllocatorModel(EXPANDABLE)
        model.malloc(15 * MiB)
        model.malloc(15 * MiB)
        (segment,) = model.snapshot()
        assert [(b.offset // MiB, b.size // MiB, b.state) for b in segment.blocks][:3] == [
            (0, 15, "allocated"), (15, 15, "allocated"), (30, 10, "free")]
        assert (model.reserved, model.allocated, model.num_device_alloc) == (40 * MiB, 30 * MiB, 2)

    def test_freed_space_is_reused_where_native_needs_a_new_segment(self):
        events = [(0, 15 * MiB), (1, 15 * MiB), (0, -15 * MiB), (1, -15 * MiB), (2, 35 * MiB)]
        assert run(events, EXPANDABLE).peak_reserved_bytes == 40 * MiB
        assert run(events).peak_reserved_bytes == 16 * MiB + 16 * MiB + 36 * MiB

    def test_out_of_memory_unmaps_free_pages_and_retries(self):
        # 30 MiB maps two 20 MiB pages and is freed; 1 B needs a 2 MiB small page: 42 > 40 MiB, so the free
        # large pages are unmapped (the empty segment dropped) and the small page mapped
        r = run([(0, 30 * MiB), (0, -30 * MiB), (1, 1)], EXPANDABLE, capacity=40 * MiB)
        assert not r.oom
        assert (r.end_reserved_bytes, r.peak_reserved_bytes, r.segments_released) == (2 * MiB, 40 * MiB, 1)

    def test_only_whole_free_pages_are_unmapped(self):
        # 15 MiB live in page [0, 20); 30 MiB mapped up to 60 MiB and freed: the free block [15, 60) holds the
        # whole pages [20, 40) and [40, 60), which are unmapped; [15, 20) shares a page with live memory and stays
        model = CachingAllocatorModel(EXPANDABLE)
        model.malloc(15 * MiB)
        model.free(model.malloc(30 * MiB))
        assert model.reserved == 60 * MiB
        model.release_cached_blocks()
        assert (model.reserved, model.allocated, model.num_device_free) == (20 * MiB, 15 * MiB, 1)
        (segment,) = model.snapshot()
        assert [(b.offset // MiB, b.state) for b in segment.blocks] == [
            (0, "allocated"), (15, "free"), (20, "unmapped")]


def test_zero_byte_events_do_nothing():
    assert run([(0, 0), (0, 0)]).peak_reserved_bytes == 0


@pytest.mark.parametrize("events, message", [
    ([(0, -512)], "event 0: free of id 0, which is not allocated"),
    ([(0, 512), (0, 512)], "event 1: id 0 allocated again before its free"),
    ([(0, 512), (0, -1024)], "event 1: free of id 0 says 1024 B, its allocation 512 B"),
])
def test_bad_sequences_name_the_event(events, message):
    with pytest.raises(ValueError, match=message):
        run(events)


def test_events_must_be_an_integer_n_by_2_or_n_by_3_array():
    with pytest.raises(ValueError, match="shape"):
        replay(np.zeros((3, 4), dtype=np.int64))


def test_a_sequence_with_its_streams_keeps_a_pool_per_stream():
    # 8 MiB on stream 1 (an all-gather's output), freed; then 8 MiB on the default stream: one shared 20 MiB segment
    # would serve both, but stream 1's cached block is not the default stream's: 40 MiB reserved, not 20
    events = [(0, 8 * MiB, 1), (0, -8 * MiB, 1), (1, 8 * MiB, 0)]
    r = replay(np.array(events, dtype=np.int64))
    assert (r.peak_reserved_bytes, r.segments_allocated) == (40 * MiB, 2)
    flat = replay(np.array([e[:2] for e in events], dtype=np.int64))
    assert (flat.peak_reserved_bytes, flat.segments_allocated) == (20 * MiB, 1)
    # all on the default stream, the third column changes nothing (and the compiled engine may take it)
    same = replay(np.array([(i, n, 0) for i, n, _ in events], dtype=np.int64))
    assert same == flat
    for engine in ("model", "fast"):  # the reference and the compiled replay alike
        assert replay(np.array(events, dtype=np.int64), engine=engine) == r
