"""Step 2 of the graph: intervals, the stretches of a lane something owns.

An interval is a span or host span of positive length (kind work, wait, idle or host, from the
registry semantics) or a barrier wait: a warp's own arrival to its own departure of the same
barrier occurrence. Spans come first, barrier waits after them, in every array here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import graph_fast
from .keys import index_dtype, pack
from .lanes import Lanes, Table
from .semantics import Semantics

# segment / interval kinds (codes into SEG_KINDS)
SEG_KINDS = ("gap", "work", "wait", "barrier", "host", "idle", "launch")
GAP, WORK, WAIT, BARRIER, HOST, IDLE, LAUNCH = range(len(SEG_KINDS))


@dataclass
class Intervals:
    span_rows: np.ndarray        # event rows of the spans (host spans included)
    bw_arr: np.ndarray           # barrier waits: own arrival row ...
    bw_dep: np.ndarray           # ... and own departure row
    row: np.ndarray              # per interval: its span row, -1 for a barrier wait (int32 while rows fit)
    arr_row: np.ndarray          # per interval: its arrival row, -1 for a span
    phase: np.ndarray            # phase / barrier code
    kind: np.ndarray             # WORK / WAIT / IDLE / HOST / BARRIER
    unfinished: np.ndarray       # the kernel never ended it (closed at its stop: unfinished.close)
    arr_rows: np.ndarray         # every arrival row of the table
    dep_rows: np.ndarray
    # per interval: kernel code and launch of its row (graph.Graph's iv_kernel / iv_launch), where
    # the compiled pass made them with the rest (else None: the graph gathers them)
    kernel: np.ndarray | None = None
    launch: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.row)

    @property
    def n_spans(self) -> int:
        return len(self.span_rows)


def phase_flags(t: Table, sem: Semantics) -> tuple[np.ndarray, np.ndarray]:
    """(is_wait, is_idle) per phase code."""
    return (np.array([sem.is_wait(p) for p in t.phase_names], dtype=bool),
            np.array([sem.is_idle(p) for p in t.phase_names], dtype=bool))


def barrier_waits(t: Table, lanes: Lanes, arr_rows: np.ndarray, dep_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(arrival rows, departure rows) of each warp's own wait: matched by (lane, barrier, occurrence)."""
    bar_rows = np.concatenate([arr_rows, dep_rows])
    if len(arr_rows) == 0 or len(dep_rows) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    kb = pack([lanes.lane_id[bar_rows], t.phase_c[bar_rows].astype(np.int64).clip(0), t.payload[bar_rows].clip(0)])
    allk = pd.factorize(kb)[0]
    ka, kd = allk[: len(arr_rows)], allk[len(arr_rows):]
    ds = np.argsort(kd, kind="stable")
    pos = np.searchsorted(kd[ds], ka)
    posc = np.minimum(pos, len(kd) - 1)
    hit = (pos < len(kd)) & (kd[ds][posc] == ka)
    bw_arr = arr_rows[hit]
    bw_dep = dep_rows[ds][posc[hit]]
    keep = t.end[bw_dep] > t.begin[bw_arr]
    return bw_arr[keep], bw_dep[keep]


def intervals(t: Table, lanes: Lanes, sem: Semantics) -> Intervals:
    """The spans (row order), then the barrier waits: graph_fast's one pass over the rows where it
    can run, else numpy's."""
    is_wait_ph, is_idle_ph = phase_flags(t, sem)
    # kind per phase code, looked up once per span (a code of -1 reads the last entry, as before)
    kind_of_phase = np.where(is_wait_ph, WAIT, np.where(is_idle_ph, IDLE, WORK)).astype(np.int8)
    K = t.kind
    arr_rows = np.flatnonzero(K["arrive"])
    dep_rows = np.flatnonzero(K["depart"])
    bw_arr, bw_dep = barrier_waits(t, lanes, arr_rows, dep_rows)
    got = graph_fast.intervals_pass(t, kind_of_phase, bw_arr, bw_dep, (HOST, BARRIER)) if graph_fast.enabled() else None
    if got is not None:
        span_rows, row, arr_row, phase, kind, unf, kernel, launch = got
        return Intervals(span_rows=span_rows, bw_arr=bw_arr, bw_dep=bw_dep, row=row, arr_row=arr_row, phase=phase,
                         kind=kind, unfinished=unf, arr_rows=arr_rows, dep_rows=dep_rows, kernel=kernel, launch=launch)
    span_rows = np.flatnonzero((K["span"] | K["host"]) & (t.end > t.begin))
    ph = t.phase_c[span_rows]
    kind_span = kind_of_phase[ph]
    kind_span[K["host"][span_rows]] = HOST
    idx = index_dtype(t.n)                   # event rows kept by the graph, narrowed (keys.index_dtype)
    return Intervals(
        span_rows=span_rows, bw_arr=bw_arr, bw_dep=bw_dep,
        row=np.concatenate([span_rows, np.full(len(bw_arr), -1, idx)], dtype=idx),
        arr_row=np.concatenate([np.full(len(span_rows), -1, idx), bw_arr], dtype=idx),
        phase=np.concatenate([ph, t.phase_c[bw_arr]]).astype(np.int32),
        kind=np.concatenate([kind_span, np.full(len(bw_arr), BARRIER, np.int8)]),
        unfinished=np.concatenate([t.unfinished[span_rows], t.unfinished[bw_dep]]),
        arr_rows=arr_rows, dep_rows=dep_rows,
    )
