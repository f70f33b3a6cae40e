"""Integer keys for the vectorised joins of the analyses (no Python loop per row).

`pack` folds several small non-negative integer columns into one int64 key (mixed radix, falling
back to dense codes when the bits run out); `asof_latest` joins each query to the latest release
with the same key at or before the query's time, with one sort and one searchsorted.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import graph_fast

# Index arrays a graph keeps (event rows -> points, points -> intervals, cross predecessors) are
# int32 while every index they can hold fits: half the bytes of int64 (a 7.5 M-event chunk keeps
# ~0.8 GB of graph, issue 31). Consumers only index with them and compare them to -1; an
# arithmetic use must widen first (points.owners does).
_INT32_LIMIT = 2**31 - 1


def index_dtype(n: int) -> np.dtype:
    """The narrowest dtype of an index array into `n` items, with -1 for none (int32 or int64)."""
    return np.dtype(np.int32) if n <= _INT32_LIMIT else np.dtype(np.int64)


def used_codes(codes: np.ndarray, n_names: int) -> np.ndarray:
    """np.unique(codes) for codes in -1 .. n_names-1 (a categorical's, -1 for missing), by counting
    instead of sorting: the same sorted array, without a sort of every event row (20-25 ms a
    2.5 M-event chunk for the graph's undeclared-phase check)."""
    if len(codes) == 0:
        return np.zeros(0, codes.dtype)
    seen = np.bincount(codes.astype(np.intp) + 1, minlength=n_names + 1)
    return (np.flatnonzero(seen) - 1).astype(codes.dtype)


def pack(cols: list[np.ndarray]) -> np.ndarray:
    """One int64 key per row from non-negative integer columns; equal rows get equal keys."""
    key = np.zeros(len(cols[0]) if cols else 0, np.int64)
    bits = 0
    for c in cols:
        c = np.asarray(c, dtype=np.int64)
        hi = int(c.max()) if len(c) else 0
        w = max(hi, 0).bit_length() or 1
        bits += w
        if bits > 62:
            # too wide to pack: fall back to dense codes of the tuple so far
            key = pd.factorize(pd.MultiIndex.from_arrays([key, c]))[0].astype(np.int64)
            bits = max(int(key.max()) if len(key) else 0, 0).bit_length() or 1
            continue
        key = (key << w) | c
    return key


def asof_latest(key_rel: np.ndarray, t_rel: np.ndarray, key_q: np.ndarray, t_q: np.ndarray) -> np.ndarray:
    """For each query (key, t): index into the release arrays of the latest release with the same
    key and time <= t, or -1."""
    if len(key_rel) == 0 or len(key_q) == 0:
        return np.full(len(key_q), -1, dtype=np.int64)
    kmin = min(int(key_rel.min()), int(key_q.min()))
    kmax = max(int(key_rel.max()), int(key_q.max()))
    if (kmax - kmin).bit_length() <= 30:    # small keys: use them directly, no hashing
        cr, cq = key_rel - kmin, key_q - kmin
        codes = np.array([kmax - kmin])
    else:
        codes = pd.factorize(np.concatenate([key_rel, key_q]))[0].astype(np.int64)
        cr, cq = codes[: len(key_rel)], codes[len(key_rel):]
    tmin = min(int(t_rel.min()), int(t_q.min()))
    tb = (max(int(t_rel.max()), int(t_q.max())) - tmin).bit_length() + 1
    if tb + max(int(codes.max()), 1).bit_length() <= 62:
        # (code << tb) | (t - tmin), built in place (t - tmin < 2^tb: the or is an add); every
        # temporary here is one per release or query, and this join was the graph build's peak
        # (141 MB over its arrays, a 2.5 M-event chunk: benchmarks/NOTES.md, branch i31g)
        kr = np.left_shift(cr, tb)
        kr += t_rel
        kr -= tmin
        order = np.argsort(kr, kind="stable")
        kr = kr[order]
        if graph_fast.enabled():   # the probe below in one compiled pass (no query-long temporaries)
            return graph_fast.asof_probe(kr, order, cq, t_q, tb, tmin)
        kq = np.left_shift(cq, tb)
        kq += t_q
        kq -= tmin
        pos = np.searchsorted(kr, kq, side="right")
        del kr, kq
        pos -= 1
    else:  # pragma: no cover - needs > 2^62 of key space
        order = np.lexsort((t_rel, cr))
        ks = pd.MultiIndex.from_arrays([cr[order], t_rel[order]])
        pos = ks.searchsorted(pd.MultiIndex.from_arrays([cq, t_q]), side="right") - 1
    ok = pos >= 0
    np.maximum(pos, 0, out=pos)
    hit = order[pos]
    del pos, order
    ok &= cr[hit] == cq
    hit[~ok] = -1
    return hit


def ranges(values) -> str:
    """Compress ints into '0–3, 7, 9–12' (en dash, as the viewer prints it)."""
    v = sorted(set(int(x) for x in values))
    if not v:
        return ""
    out, start, prev = [], v[0], v[0]
    for x in v[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}" if start == prev else f"{start}–{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out)


def isin_names(col: pd.Series, names) -> np.ndarray:
    """Rows whose value is one of `names`; a categorical column is read from its codes (comparing
    its values would make a string per row: seconds at 10 M events)."""
    names = set(names)
    if isinstance(col.dtype, pd.CategoricalDtype):
        return np.isin(col.cat.codes.to_numpy(), [i for i, c in enumerate(col.cat.categories) if c in names])
    return np.isin(col.astype(str).to_numpy(), list(names))
