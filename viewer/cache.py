"""A least-recently-used cache bounded by bytes, for results keyed by what a client sends.

A page that caches by a client's value (a what-if percentage, a kernel name) would otherwise
grow with every distinct value a client tries: 300 what-if percentages took the server from 469
to 984 MB (issue 13). Sizes are estimates (`sizeof`) that hold up against tracemalloc: buffers
exact (object columns counted deep), plus what a pandas object costs beyond its buffers.

A frame computed by an analysis can keep more alive than its columns (a what-if summary of 4 x 8
numbers held 25-31 KB by tracemalloc against 388 bytes of columns: the cache counted it 26x too
small, issue 19), so `put` keeps a deep copy of a pandas value (3.6-4.7 KB for that summary)
and counts that.
"""
from __future__ import annotations

import dataclasses
import sys
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import pandas as pd

_MISSING = object()
# Nested lists and dicts (plotly figures) are walked to this many items; beyond it the rest is
# counted at the average size seen so far, so a figure of 100 k points costs a bounded walk.
_WALK_ITEMS = 20_000
# What a pandas object holds beyond its buffers (block manager, index, dtypes), measured with
# tracemalloc on pandas 2 (dev machine): 3.2-4.3 KB for consolidated frames of 1-16 columns,
# 1.3 KB for a Series.
FRAME_OVERHEAD = 4 << 10
SERIES_OVERHEAD = 1300


def sizeof(obj: Any) -> int:
    """Approximate bytes held by obj (numpy/pandas exact for their buffers)."""
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (pd.DataFrame, pd.Series, pd.Index)):
        mem = obj.memory_usage(index=True, deep=True) if not isinstance(obj, pd.Index) else obj.memory_usage(deep=True)
        fixed = FRAME_OVERHEAD if isinstance(obj, pd.DataFrame) else SERIES_OVERHEAD
        return int(mem.sum() if hasattr(mem, "sum") else mem) + fixed
    if isinstance(obj, (str, bytes, bytearray)):
        return len(obj) + 49
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(sizeof(getattr(obj, f.name)) for f in dataclasses.fields(obj)) + 64
    if isinstance(obj, (dict, list, tuple, set)):
        total, seen, stack = 0, 0, [obj]
        while stack:
            x = stack.pop()
            seen += 1
            if seen > _WALK_ITEMS:
                total += int(total / seen * (len(stack) + 1))   # the rest at the mean so far
                break
            if isinstance(x, dict):
                total += sys.getsizeof(x)
                stack.extend(x.values())
            elif isinstance(x, (list, tuple, set)):
                total += sys.getsizeof(x)
                stack.extend(x)
            else:
                total += sizeof(x)
        return total
    return sys.getsizeof(obj)


class SizedLRU:
    """get/put with a ceiling on the summed sizeof of the values; the least recently used go
    first. A value larger than the whole budget is not kept (the caller still gets it)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._items: "OrderedDict[Any, tuple[Any, int]]" = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key, default=_MISSING):
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return default
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key, value) -> None:
        if isinstance(value, (pd.DataFrame, pd.Series)):
            value = value.copy(deep=True)   # only its own buffers stay alive (module docstring)
        n = sizeof(value) + sizeof(key)
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if n > self.max_bytes:
                return
            self._items[key] = (value, n)
            self._bytes += n
            while self._bytes > self.max_bytes:
                _, (_, m) = self._items.popitem(last=False)
                self._bytes -= m

    def __contains__(self, key) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes


MISSING = _MISSING
