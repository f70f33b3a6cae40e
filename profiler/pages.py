"""numpy's transparent-huge-page advice, switched off where fresh memory is faulted in at scale.

numpy madvises every array of 4 MiB and up for huge pages (MADV_HUGEPAGE). With the kernel's THP
`defrag` set to `madvise` (this dev VM, and many distributions' default), a fault in such a region
must produce a 2 MB page at once, and on this VM (Firecracker, free page reporting of 8 MB
blocks) that page is usually one the host took back: 2.7 ms a MB against 0.6 ms a MB for 4 kB
pages (benchmarks/NOTES.md, issue 20 round 2). Two places fault in hundreds of MB:
  - the decoder's output table (profiler.decode.decode: 30 M records, sys 1.9-2.2 -> 0.40-0.46 s);
  - `epscope analyze`'s chunk passes (profiler.analysis.heap.kept: 10 M events, sys median 0.99 ->
    0.62 s, user +0.08 s; benchmarks/NOTES.md, "Issue 31 (session 6): huge pages").
The switch is numpy's and process-wide: another thread allocating meanwhile goes without the
advice too, which costs it nothing but TLB reach. A numpy without the switch allocates as it does.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np


def _toggle():
    mod = getattr(getattr(np, "_core", None), "multiarray", None) or getattr(getattr(np, "core", None), "multiarray", None)
    return getattr(mod, "_set_madvise_hugepage", None)


@contextmanager
def small_pages():
    """Within: numpy allocates without the huge-page advice; the previous setting after."""
    toggle = _toggle()
    if toggle is None:
        yield
        return
    was = toggle(False)
    try:
        yield
    finally:
        toggle(was)
