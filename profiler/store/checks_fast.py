"""The event table's row checks as compiled loops (optional: numba, the `fast` extra).

schema.validate_events and validate.no_duplicate_rows call these when the process can run them
(`enabled()`: an ahead-of-time build on disk, or numba to make one, profiler/aot.py) and keep their
numpy code as the fallback and as what names a problem: a loop here only answers "every row passes"
(then nothing more runs) or "cannot tell" (then the numpy check runs, and raises with its message
where a row fails). tests/profiler/test_checks_fast.py holds both answers to the numpy checks' on
random and damaged tables and on every bundled run.

Why: on a 2.5 M-event chunk the numpy checks make ~40 passes over the columns: the row checks
(ranges, host-only -1, times) 20 ms, the repeated-row check 43 ms (a 64-bit hash of each row, 22 ms,
and its sort, 17 ms) of the 0.29 s a chunk's read took (benchmarks/NOTES.md, "Issue 31 (session 5):
reading the events"). Here each is one pass. The repeated-row check uses the writer's layout
instead of a sort: rows come grouped by warp lane (rank, launch, block, warp), each lane in one run,
begins non-decreasing within it (the decoder's region order; every bundled run and the 10 M-event
run are so). Then two equal rows, which share lane and begin, lie in one block of consecutive rows
of equal (lane, begin), and comparing the rows within each block (1 to 3 rows on the bundled runs)
finds every repeat. Any other layout, or a block longer than BLOCK_LIMIT, answers "cannot tell".

The loops allocate nothing (the callers pass their scratch), so the AOT module needs no numba
runtime.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .. import aot

_MODULE = "_epscope_checks_aot"
ENGINE = "auto"   # "auto": compiled where available; "numpy": the fallback (tests set it)
# Tables below this many rows are checked by numpy (under 1 ms there): a small run read by the viewer
# or written by the decoder neither loads nor, on first use, builds the compiled module for it.
MIN_ROWS = 100_000
# Rows of one lane sharing a begin that are compared pairwise (n^2 / 2 comparisons); a longer block
# (none on the bundled runs, which have at most 3) leaves the check to the numpy path.
BLOCK_LIMIT = 64


def _rows_ok(rank, launch, iteration, sm, block, warp, kind, begin, end, mins, host, limit):
    """Every row within the schema's bounds: ids at least `mins` (rank, launch, iteration, sm,
    block, warp), -1 ids only on host rows (kind code `host`), a kind, times within +-limit, no end
    before its begin. (A branch per row: as built ahead of time, for a generic x86-64, it ran 7.1 ms
    a 2.5 M-event chunk, a branchless body 8.8 ms.)"""
    for i in range(rank.shape[0]):
        if rank[i] < mins[0] or launch[i] < mins[1] or iteration[i] < mins[2]:
            return False
        if sm[i] < mins[3] or block[i] < mins[4] or warp[i] < mins[5]:
            return False
        k = kind[i]
        if k < 0 or (k != host and (sm[i] < 0 or block[i] < 0 or warp[i] < 0)):
            return False
        b, e = begin[i], end[i]
        if b < -limit or b > limit or e < -limit or e > limit or e < b:
            return False
    return True


def _lane_runs(rank, launch, block, warp, begin, end, kernel, iteration, sm, role, kind, phase, payload,
               unfinished, limit, starts):
    """The first row of each run of one lane, written to `starts`, and their number; -1 where rows
    of a lane are not in begin order, a block of one lane and begin is longer than `limit`, or two
    rows are equal (the numpy check then decides and names them). Every repeat lies within a block
    once the caller has checked that no lane has two runs."""
    runs = 0
    s = 0   # first row of the current block of equal (lane, begin)
    for i in range(rank.shape[0]):
        if i == 0 or rank[i] != rank[i - 1] or launch[i] != launch[i - 1] or block[i] != block[i - 1] \
                or warp[i] != warp[i - 1]:
            starts[runs] = i
            runs += 1
            s = i
        elif begin[i] < begin[i - 1]:
            return -1
        elif begin[i] != begin[i - 1]:
            s = i
        else:
            if i - s >= limit:
                return -1
            for j in range(s, i):   # lane and begin are equal: the other columns
                if end[i] == end[j] and kernel[i] == kernel[j] and iteration[i] == iteration[j] and sm[i] == sm[j] \
                        and role[i] == role[j] and kind[i] == kind[j] and phase[i] == phase[j] \
                        and payload[i] == payload[j] and unfinished[i] == unfinished[j]:
                    return -1
    return runs


def _codes8(indices, n, out):
    """A dictionary column's indices (int32, as parquet holds them) checked to lie in [-1, n) and
    written into out as int8 codes, in one pass (numpy's min, max and a narrowing concatenate made
    three); False at the first index outside (out then holds a part)."""
    for i in range(indices.shape[0]):
        x = indices[i]
        if x < -1 or x >= n:
            return False
        out[i] = x
    return True


_A = "{}[::1]".format
_EXPORTS = {
    "codes8": (_codes8, f"boolean({_A('int32')}, int64, {_A('int8')})"),
    "rows_ok": (_rows_ok, "boolean(" + ", ".join(
        [_A("int16"), _A("int32"), _A("int32"), _A("int16"), _A("int32"), _A("int16"), _A("int8"), _A("int64"),
         _A("int64"), _A("int64"), "int64", "int64"]) + ")"),
    "lane_runs": (_lane_runs, "int64(" + ", ".join(
        [_A("int16"), _A("int32"), _A("int32"), _A("int16"), _A("int64"), _A("int64"), _A("int8"), _A("int32"),
         _A("int16"), _A("int8"), _A("int8"), _A("int8"), _A("int64"), _A("boolean"), "int64", _A("int64")]) + ")"),
}
_LOOPS = aot.Loops(_MODULE, Path(__file__), "checks", _EXPORTS, "the event checks' loops")
# the dtypes the loops take (the stored schema's; categorical codes of up to 127 names)
_ID_TYPES = {"rank": np.int16, "launch": np.int32, "iteration": np.int32, "sm": np.int16, "block": np.int32,
             "warp": np.int16, "begin_ns": np.int64, "end_ns": np.int64, "payload": np.int64, "open": np.bool_}


def _compiled() -> aot.Compiled:
    return _LOOPS.compiled()


def enabled(rows: int) -> bool:
    """Run the compiled loops on a table of `rows` rows? (at least MIN_ROWS, ENGINE "auto", and an
    AOT build on disk or numba to make one)"""
    return rows >= MIN_ROWS and _LOOPS.enabled(ENGINE)


def _columns(ev: pd.DataFrame, names) -> list | None:
    """The columns as contiguous arrays of the loops' dtypes (categoricals as int8 codes), or None
    where one has another dtype (the numpy path then runs)."""
    out = []
    for c in names:
        s = ev[c]
        v = s.cat.codes.to_numpy() if isinstance(s.dtype, pd.CategoricalDtype) else s.to_numpy()
        want = np.int8 if isinstance(s.dtype, pd.CategoricalDtype) else _ID_TYPES[c]
        if v.dtype != want:
            return None
        out.append(np.ascontiguousarray(v))
    return out


def codes8(parts: list, n: int) -> np.ndarray | None:
    """Dictionary indices (int32 arrays, no nulls) as one int8 array of codes, each checked to lie in
    [-1, n) (n < 127: pandas keeps int8 codes for that many categories); None where one lies outside
    or a part is not int32 (the caller's numpy code then runs and says what is wrong)."""
    if n >= 127 or not all(p.dtype == np.int32 for p in parts):
        return None
    out = np.empty(sum(len(p) for p in parts), np.int8)
    f, o = _compiled().get("codes8"), 0
    for p in parts:
        if not f(np.ascontiguousarray(p), np.int64(n), out[o:o + len(p)]):
            return None
        o += len(p)
    return out


def rows_ok(ev: pd.DataFrame, mins: dict, host: int, limit: int) -> bool:
    """True when every row passes schema.validate_events' row checks (mins: schema.MIN_VALUE, host:
    the kind code of host rows, limit: schema.TIME_LIMIT_NS); False: cannot tell (numpy decides)."""
    cols = _columns(ev, ("rank", "launch", "iteration", "sm", "block", "warp", "kind", "begin_ns", "end_ns"))
    if cols is None:
        return False
    m = np.array([mins[c] for c in ("rank", "launch", "iteration", "sm", "block", "warp")], np.int64)
    return bool(_compiled().get("rows_ok")(*cols, m, np.int64(host), np.int64(limit)))


def no_repeats(ev: pd.DataFrame) -> bool:
    """True when no two rows are equal in every column (see the module docstring for how); False:
    cannot tell (validate.no_duplicate_rows' numpy check decides)."""
    cols = _columns(ev, ("rank", "launch", "block", "warp", "begin_ns", "end_ns", "kernel", "iteration", "sm", "role",
                         "kind", "phase", "payload", "open"))
    if cols is None:
        return False
    starts = np.empty(len(ev), np.int64)
    runs = int(_compiled().get("lane_runs")(*cols, np.int64(BLOCK_LIMIT), starts))
    if runs < 0:
        return False
    st = starts[:runs]
    rank, launch, block, warp = (v[st].astype(np.int64) for v in cols[:4])
    # (launch, rank) and (block, warp) packed without loss: an int32 and an int16 in 48 bits each
    k1, k2 = (launch << 16) | (rank & 0xFFFF), (block << 16) | (warp & 0xFFFF)
    o = np.lexsort((k2, k1))
    k1, k2 = k1[o], k2[o]
    return not bool(np.any((k1[1:] == k1[:-1]) & (k2[1:] == k2[:-1])))   # each lane in one run
