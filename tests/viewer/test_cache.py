"""viewer.cache: sizes that hold up against what the process really holds (tracemalloc)."""
from __future__ import annotations

import gc
import tracemalloc

import pytest

from viewer import analyses
from viewer.cache import SizedLRU, sizeof
from viewer.catalog import Catalog


def _freed(fn) -> int:
    """Bytes that fn() frees (tracemalloc), after a collection on both sides."""
    gc.collect()
    a = tracemalloc.get_traced_memory()[0]
    fn()
    gc.collect()
    return a - tracemalloc.get_traced_memory()[0]


def test_a_what_if_result_is_counted_at_its_real_size(run_root):
    """Issue 19: the cache counted a what-if result 26x too small (388 bytes of columns; the
    frame held 25-31 KB)."""
    cat = Catalog([run_root])
    run = cat.load("balanced")
    ev = analyses.events(run)
    phase = next(p for p in ev["phase"].cat.categories if (ev["phase"] == p).sum() > 10)
    graph = analyses.analysis.critical_path(ev, registry=analyses.registry(run), launches=run.launches).graph
    lru = SizedLRU(1 << 30)
    tracemalloc.start()
    try:
        for speedup in (0.2, 0.3, 0.4):
            v = analyses.analysis.what_if(ev, phase=str(phase), speedup=speedup, rank=None,
                                          registry=analyses.registry(run), graph=graph, new_path=False).summary
            lru.put("k", v)
            del v
            counted = lru.nbytes
            held = _freed(lambda: lru._items.clear())    # what the cached value alone kept alive
            assert 0.5 * held <= counted <= 3 * held, (held, counted)
    finally:
        tracemalloc.stop()


def test_sizeof_counts_object_columns_deep():
    import pandas as pd
    df = pd.DataFrame({"s": ["x" * 1000] * 100})
    assert sizeof(df) > 100 * 1000
