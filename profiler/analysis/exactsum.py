"""Group sums without pandas' group-by, equal to its results to the bit (issue 31).

pandas sums a float group with Kahan compensation (groupby sum and mean); np.bincount adds the
values in order without it. Where every value is integral and their magnitudes add up to less than
2**53, every partial sum is an integer float64 holds exactly, in any order, so compensation never
changes a bit and the two agree: `exact_sum` says when. The per-chunk tables' values are times in
integer ns (durations, parts of waits cut at an integer entry time), so they almost always
qualify; where they do not, the callers let pandas compute (their differential tests:
tests/analysis/test_table_paths.py).
"""
from __future__ import annotations

import numpy as np

# float64 holds every integer below 2**53 exactly
_EXACT = float(2 ** 53)


def exact_sum(v: np.ndarray) -> bool:
    """Is every sum of some of v's values, in any order, exact in float64 (so a plain sum is pandas'
    compensated one to the bit)? Integral finite values whose magnitudes add up to less than 2**53."""
    v = np.asarray(v, dtype=np.float64)
    return bool(np.all(np.isfinite(v))) and bool(np.all(v == np.floor(v))) and float(np.abs(v).sum()) < _EXACT


def dense_codes(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(key, return_inverse=True) of non-negative integer codes, by a bincount over their
    range when that range is small beside the array (no sort of the elements)."""
    key = np.asarray(key, dtype=np.int64)
    if key.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    top = int(key.max()) + 1
    if top > max(4 * key.size, 1 << 16):
        u, inv = np.unique(key, return_inverse=True)
        return u, inv.reshape(-1)
    seen = np.bincount(key, minlength=top) > 0
    return np.flatnonzero(seen), (np.cumsum(seen) - 1)[key]
