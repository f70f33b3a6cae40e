"""profiler.analysis.heap: freed memory kept while an analysis runs, given back between chunks past
KEEP_RESIDENT, and pyarrow's pool emptied after a read."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from profiler import pages
from profiler.analysis import heap

glibc = pytest.mark.skipif(heap._LIBC is None or heap.resident_bytes() is None,
                           reason="glibc's malloc and /proc/self/statm only (Linux)")


@glibc
def test_resident_bytes_follow_what_the_process_touches():
    before = heap.resident_bytes()
    a = np.ones(64 << 20, np.uint8)            # 64 MB, every page touched
    assert heap.resident_bytes() - before >= 48 << 20
    del a


@glibc
def test_between_chunks_gives_the_heap_back_only_past_keep_resident(monkeypatch):
    with heap.kept():
        blocks = [np.ones(8 << 20, np.uint8) for _ in range(24)]   # 192 MB of heap blocks (< MMAP_THRESHOLD)
        del blocks                                                 # freed, kept in the heap
        held = heap.resident_bytes()
        monkeypatch.setattr(heap, "KEEP_RESIDENT", held + (1 << 30))
        assert not heap.between_chunks()
        assert heap.resident_bytes() >= held - (16 << 20)          # kept: nothing given back
        monkeypatch.setattr(heap, "KEEP_RESIDENT", 0)
        assert heap.between_chunks()
        assert heap.resident_bytes() <= held - (128 << 20)


@glibc
def test_between_chunks_gives_back_free_pages_inside_the_heap_too(monkeypatch):
    """Blocks freed below one still held (the heap's top is not free): the top's trim gives nothing
    back, malloc_trim does."""
    with heap.kept():
        blocks = [np.ones(8 << 20, np.uint8) for _ in range(24)]
        pin = np.ones(1 << 20, np.uint8)                   # allocated after them: above them in the heap
        del blocks
        held = heap.resident_bytes()
        monkeypatch.setattr(heap, "KEEP_RESIDENT", held - (64 << 20))
        assert heap.between_chunks()
        assert heap.resident_bytes() <= held - (128 << 20)
        assert pin.sum() == 1 << 20


@pytest.mark.skipif(heap.resident_bytes() is None, reason="/proc/self/statm only (Linux)")
@pytest.mark.skipif(pa.default_memory_pool().backend_name == "system", reason="pyarrow's pool is glibc's own")
def test_release_read_buffers_gives_back_what_a_parquet_read_left_in_pyarrows_pool(tmp_path, monkeypatch):
    """Row groups decoded and copied out (runreader's read): mimalloc keeps the freed buffers
    (0.4 GB after a 7.5 M-event chunk's read) until release_read_buffers."""
    n = 2 << 20
    rng = np.random.default_rng(0)
    pq.write_table(pa.table({c: rng.integers(0, 1 << 40, n) for c in "abcd"}), tmp_path / "t.parquet",
                   row_group_size=n // 16)
    pf = pq.ParquetFile(tmp_path / "t.parquet")
    parts = {c: [] for c in "abcd"}
    for i in range(pf.num_row_groups):
        rg = pf.read_row_group(i)
        for c in parts:
            parts[c].append(rg.column(c).to_numpy())
        del rg
    cols = {c: np.concatenate(v) for c, v in parts.items()}
    del parts
    held = heap.resident_bytes()
    monkeypatch.setattr(heap, "KEEP_RESIDENT", held + (1 << 30))
    assert not heap.release_read_buffers()
    assert heap.resident_bytes() >= held - (4 << 20)      # kept under KEEP_RESIDENT
    monkeypatch.setattr(heap, "KEEP_RESIDENT", 0)
    assert heap.release_read_buffers()
    assert heap.resident_bytes() <= held - (16 << 20)
    assert all(len(v) == n for v in cols.values())


@pytest.mark.skipif(pages._toggle() is None, reason="this numpy has no _set_madvise_hugepage")
def test_an_analysis_allocates_without_numpys_huge_page_advice():
    toggle = pages._toggle()

    def advised():
        was = toggle(True)
        toggle(was)
        return bool(was)

    before = advised()
    with heap.kept():
        assert advised() is False
    assert advised() is before
