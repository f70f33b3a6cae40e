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
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import threading

# mallopt parameters (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX = 4 MiB * sizeof(long)):
# blocks up to this size come from the heap and are reused once freed
MMAP_THRESHOLD = 32 << 20
# free memory at the heap's top kept while analysing (mallopt takes an int: < 2 GiB)
TRIM_THRESHOLD = 1 << 30
DEFAULT_TRIM_THRESHOLD = 128 << 10   # glibc's default (malloc.c, DEFAULT_TRIM_THRESHOLD)

_lock = threading.Lock()
_depth = 0


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _libc()


@contextlib.contextmanager
def kept():
    """Within: freed blocks up to MMAP_THRESHOLD stay in the heap for the next allocation."""
    global _depth
    with _lock:
        _depth += 1
        if _depth == 1 and _LIBC is not None:
            _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            _LIBC.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _LIBC is not None:
                _LIBC.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
                _LIBC.malloc_trim(0)
