"""Freed memory kept in the process while a run's analyses run, given back after (glibc only).

The analyses of a chunk allocate and free hundreds of numpy temporaries of one chunk's size (2.5 M
events x 8 bytes = 20 MB). glibc serves blocks above its mmap threshold (dynamic, 128 kB up to 32
MB) with a fresh mmap and unmaps them on free, and trims the heap's top once it holds more than the
trim threshold free: every temporary of every chunk is then faulted in again page by page (numpy
asks for huge pages, so each fault zeroes 2 MB). Measured on the 10 M-event, 4-iteration synthetic
run (benchmarks/NOTES.md, "Issue 20, layout and analyze CPU"): system time 4.9 -> 2.3 s, peak RSS
the same within 40 MB, with the settings below given through glibc's environment variables.

`kept()` sets them with mallopt for the duration of an analysis and, on leaving the outermost one,
restores the trim threshold and calls malloc_trim(0), which returns every free page to the system
(the viewer's process does not keep an analysis' peak). Elsewhere (no glibc) it does nothing.

What is kept must not stack on the next chunk's peak, though (issue 31: 30 M events in 7.5 M-event
iterations peaked at 2.3 GB). Two more pools hold freed memory between chunks:
  - pyarrow's own (mimalloc): a chunk's read decodes its row groups into Arrow buffers, copied
    into numpy arrays and freed, but kept by mimalloc (0.4 GB after a 7.5 M-event read) while
    the chunk's pass allocates through glibc. `release_read_buffers()` gives them back after a
    read.
  - glibc's heap itself: a 7.5 M-event chunk's pass leaves 1.1-1.3 GB free in it, which the next
    read (its Arrow buffers, and its columns above MMAP_THRESHOLD: fresh mmaps) cannot use.
    `between_chunks()` gives the free pages back before the next read.
Both only when the process holds more than KEEP_RESIDENT: each page given back is faulted in again
by the next chunk (system time); the 10 M-event run's 2.5 M-event chunks stay under it and keep
theirs, as before.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading

import pyarrow as pa

from profiler.pages import small_pages

# mallopt parameters (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX = 4 MiB * sizeof(long)):
# blocks up to this size come from the heap and are reused once freed
MMAP_THRESHOLD = 32 << 20
# free memory at the heap's top kept while analysing (mallopt takes an int: < 2 GiB)
TRIM_THRESHOLD = 1 << 30
DEFAULT_TRIM_THRESHOLD = 128 << 10   # glibc's default (malloc.c, DEFAULT_TRIM_THRESHOLD)

# Resident memory up to which freed pages are kept from one chunk to the next: the 10 M-event
# target (issue 31). The 10 M-event run (4 chunks of 2.5 M events) holds 0.68 GB between chunks,
# 0.5 GB of it free: kept, no page faulted again; 30 M events in 7.5 M-event iterations hold 1.3-1.45 GB.
KEEP_RESIDENT = 1 << 30
# a heap block (above glibc's fast bins' 64 kB, below MMAP_THRESHOLD) whose free makes free()
# check the heap's top against the trim threshold (malloc.c, FASTBIN_CONSOLIDATION_THRESHOLD)
TRIM_BLOCK = 1 << 20

_lock = threading.Lock()
_depth = 0


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _libc()
if _LIBC is not None:
    _LIBC.malloc.restype = ctypes.c_void_p
    _LIBC.malloc.argtypes = [ctypes.c_size_t]
    _LIBC.free.argtypes = [ctypes.c_void_p]


def resident_bytes() -> int | None:
    """The process' resident memory (Linux: /proc/self/statm), or None where it cannot say."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _past_keep() -> bool:
    rss = resident_bytes()
    return rss is not None and rss > KEEP_RESIDENT


def _trim_top() -> None:
    """The free memory at the heap's top back to the system (what free() does past the trim
    threshold, mallopt(3)): the threshold lowered to glibc's default for one free of a heap block."""
    with _lock:
        _LIBC.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
        p = _LIBC.malloc(TRIM_BLOCK)
        _LIBC.free(p)
        _LIBC.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD if _depth else DEFAULT_TRIM_THRESHOLD)


def between_chunks() -> bool:
    """Called between two chunks' passes, before the next chunk is read: when the process holds
    more than KEEP_RESIDENT, the free memory at the heap's top goes back to the system (0.7 of
    the 1.1-1.3 GB a 7.5 M-event chunk leaves), and, if that is not enough, every free page
    (malloc_trim). The next chunk faults them in again: once a chunk, not once a temporary; the
    free blocks inside the heap, kept by the first step, are not. Returns whether any went back."""
    if _LIBC is None or not _past_keep():
        return False
    _trim_top()
    if _past_keep():
        _LIBC.malloc_trim(0)
    return True


def release_read_buffers() -> bool:
    """Called after a chunk's read: the unused memory of pyarrow's default pool goes back to the
    system when the process holds more than KEEP_RESIDENT. Returns whether it went back. A file
    stored as write_run writes it is read from the system allocator instead, its columns the frame's
    arrays (runreader.events_file): this serves the reads of other files, which decode into the
    default pool and copy the columns out of it."""
    if not _past_keep():
        return False
    pa.default_memory_pool().release_unused()
    return True


@contextlib.contextmanager
def kept():
    """Within: freed blocks up to MMAP_THRESHOLD stay in the heap for the next allocation, and
    numpy allocates without its huge-page advice (profiler.pages: the pages a run's first chunk
    faults in cost less system time than they save in TLB misses; benchmarks/NOTES.md, "Issue 31
    (session 6): huge pages")."""
    global _depth
    with _lock:
        _depth += 1
        if _depth == 1 and _LIBC is not None:
            _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            _LIBC.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    try:
        with small_pages():
            yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _LIBC is not None:
                _LIBC.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
                _LIBC.malloc_trim(0)
