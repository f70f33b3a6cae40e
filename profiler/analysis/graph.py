"""The dependency graph of a run, built once per event table and shared by the analyses.

Model. Every warp of every launch is a *lane* (host rows: one lane per rank and iteration). The
begin/end times of a lane's spans, instants and barrier events cut the lane into *points*
(unique times, sorted); between two consecutive points lies a *segment*, owned by the innermost
interval covering it (a span, or a barrier wait = own arrive .. own depart), or by nobody (a gap).
Each point p has one in-lane predecessor (p-1, through the segment p-1 -> p) and at most one
cross predecessor `src[p]` (profiler.analysis.edges: wait, barrier, launch and host-sync edges).
Dependencies never cross iterations, so each iteration is analysed on its own.

The build is a pipeline of named steps, each vectorised over the whole table (a few sorts,
searchsorted joins and per-depth painting; no Python loop per event):
    unfinished.close  -> lanes.table, lanes.lanes -> intervals.intervals -> points.points
    -> points.owners, points.segments -> edges.{wait,barrier,launch,host_sync}_edges -> edges.binding
Phase semantics (waits, idle, barrier scopes) come from the registry only (semantics.py).

The recurrence T[p] = max(T[p-1] + d[p], T[src[p]] + lat[p]) reproduces the recorded times
exactly (d[p]: the segment's own time, for the final piece of a released wait only the part
after the release; lat[p]: the recorded latency from the release to p). The critical path walks
back from each iteration's last point along the binding predecessors; what-if re-solves the
recurrence with shorter segments (profiler.analysis.retime).
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import edges as E
from . import unfinished
from .intervals import (BARRIER, GAP, HOST, IDLE, LAUNCH, SEG_KINDS, WAIT, WORK,  # noqa: F401 (re-exported)
                        Intervals, intervals)
from .keys import index_dtype, ranges, used_codes  # noqa: F401 (re-exported: the analyses' verdicts use it)
from .lanes import EVENT_KINDS, lanes as _lanes, table as _table
from .points import owners, points, segments
from .semantics import Semantics, semantics, undeclared


@dataclass
class Graph:
    # the table analysed (unfinished waits closed: unfinished.close), held weakly when it is the
    # caller's own table, so the cache below never keeps a table alive
    table_ref: object
    t0: int
    # points (sorted by lane, time)
    pt_t: np.ndarray             # int64 absolute ns
    pt_lane: np.ndarray          # int64 (kept wide: analyses compute keys from it)
    # incoming segment of each point (p-1 -> p); for a lane's first point the 'launch' pseudo-segment
    seg_kind: np.ndarray         # int8 codes into SEG_KINDS
    seg_phase: np.ndarray        # int32 code into phase_names, -1 for gaps / launch
    seg_owner: np.ndarray        # interval index, -1 if none
    d: np.ndarray                # int64 own duration in the recurrence
    src: np.ndarray              # cross predecessor point, -1 if none
    lat: np.ndarray              # int64 recorded latency src -> p (valid where src >= 0)
    binding: np.ndarray          # bool: cross edge is the binding predecessor in recorded time
    rel_t: np.ndarray            # int64 recorded release time (valid where src >= 0)
    # lanes
    lane_first: np.ndarray       # first point of each lane
    lane_last: np.ndarray
    lane: pd.DataFrame           # per lane: rank, kernel, launch, iteration, block, warp, role, host
    phase_names: np.ndarray      # phase code -> name (object array)
    kernel_names: np.ndarray
    # intervals (spans first, then barrier waits)
    iv_row: np.ndarray           # event row of a span, -1 for a barrier wait
    iv_arr_row: np.ndarray       # arrival row of a barrier wait, -1 for a span
    iv_phase: np.ndarray
    iv_kind: np.ndarray          # WORK / WAIT / BARRIER / HOST / IDLE
    iv_pb: np.ndarray            # begin point
    iv_pe: np.ndarray            # end point
    iv_kernel: np.ndarray        # kernel code of the interval's row (into kernel_names)
    iv_launch: np.ndarray        # launch of the interval's row
    iv_unfinished: np.ndarray    # the kernel never ended it (closed where the kernel stopped)
    # The index arrays (seg_owner, src, iv_row, iv_arr_row, iv_pb, iv_pe, row_pb, row_pe and the
    # edges' point arrays) are int32 while the chunk's points and rows fit (keys.index_dtype):
    # index with them, widen before arithmetic.
    # event rows -> points (for re-timing the table); -1 where the row has no point
    row_pb: np.ndarray
    row_pe: np.ndarray
    # barrier occurrences: arrivals grouped by occurrence (sorted), and released barrier waits
    arr_rows: np.ndarray         # event rows of arrivals
    arr_occ: np.ndarray          # occurrence id of each arrival (aligned with arr_rows)
    occ_arr_row: np.ndarray      # arrival event rows sorted by (occurrence, time)
    occ_arr_pt: np.ndarray       # their points
    occ_starts: np.ndarray       # start of each occurrence in occ_arr_pt
    bw_end_pt: np.ndarray        # departure point of each released barrier wait
    bw_occ: np.ndarray           # its occurrence id
    bw_arr_row: np.ndarray       # its own arrival event row
    # kernel ready from the previous launch (edges.Edges documents these)
    prev_first_pt: np.ndarray
    prev_grp: np.ndarray
    prev_lat: np.ndarray
    prev_member_pt: np.ndarray
    prev_starts: np.ndarray
    sem: Semantics
    warnings: tuple = ()         # typed AnalysisWarnings (undeclared phases, unreadable registry)
    derived: dict = field(default_factory=dict)   # per-graph caches (segment durations, ...)

    @property
    def events(self) -> pd.DataFrame:
        ev = self.table_ref() if isinstance(self.table_ref, weakref.ref) else self.table_ref
        if ev is None:
            raise RuntimeError("the event table of this graph was garbage-collected")
        return ev

    @property
    def n_points(self) -> int:
        return len(self.pt_t)

    def first_mask(self) -> np.ndarray:
        m = np.zeros(self.n_points, bool)
        m[self.lane_first[self.lane_first < self.n_points]] = True
        return m

    @property
    def unfinished_any(self) -> bool:
        return bool(self.iv_unfinished.any())


_CACHE: dict[tuple, tuple] = {}
_CACHE_MAX = 4
# one build at a time: the viewer computes analyses in a background thread while a page may ask
# for the same run; the second caller waits and gets the cached graph instead of building twice
_BUILD_LOCK = threading.Lock()


def build(events: pd.DataFrame, registry=None, launches: pd.DataFrame | None = None) -> Graph:
    """The graph of `events`, cached per (table object, registry, launch table) while the table lives.

    launches: the run's launch table; it says where a kernel that timed out stopped (its GPU
    end), so unfinished waits get their true length (without it: the launch's last record).
    The table must not be modified in place after a first analysis (the cache keys on identity).
    """
    key = (id(events), len(events), id(registry), id(launches))
    with _BUILD_LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0]() is events:
            return hit[1]
        closed = unfinished.close(events, launches)
        g = _build(closed, semantics(registry))
        g.table_ref = weakref.ref(events) if closed is events else closed
        g.derived["launches"] = launches      # the straggler decision's silent warps (imbalance.silent_lanes)
        while len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = (weakref.ref(events), g)
        # drop the graph as soon as its table is garbage-collected
        weakref.finalize(events, _CACHE.pop, key, None)
        return g


def _build(ev: pd.DataFrame, sem: Semantics) -> Graph:
    t = _table(ev)
    ln = _lanes(t)
    iv = intervals(t, ln, sem)
    pts = points(t, ln)
    ln.by_lane = None                        # read by points only (20 MB a 2.5 M-event chunk)
    iv_pb = np.concatenate([pts.row_pb[iv.span_rows], pts.row_pb[iv.bw_arr]])
    iv_pe = np.concatenate([pts.row_pe[iv.span_rows], pts.row_pe[iv.bw_dep]])
    seg = segments(pts, iv, owners(iv_pb, iv_pe, pts.n))

    e = E.Edges(src=np.full(pts.n, -1, dtype=index_dtype(pts.n)), rel_t=np.full(pts.n, np.iinfo(np.int64).min, dtype=np.int64))
    E.wait_edges(t, ln, pts, iv, iv_pb, iv_pe, sem, e, seg.d)
    E.barrier_edges(t, pts, iv, iv_pb, iv_pe, sem, e, seg.d)
    launches = E.gpu_launches(t, ln, pts)
    if launches is not None:
        E.launch_edges(t, ln, pts, launches, e)
        E.host_sync_edges(t, pts, launches, e, seg.d)
    lat, bind = E.binding(pts, iv, iv_pb, iv_pe, e)

    n_ph = len(t.phase_names)
    span_phases = t.phase_names[_span_codes(t)] if t.n else []
    bar_names = t.phase_names[used_codes(t.phase_c[iv.arr_rows], n_ph)] if len(iv.arr_rows) else []
    warns = tuple(sem.warnings) + tuple(undeclared(sem, span_phases, bar_names))
    if iv.kernel is None:                    # the compiled intervals pass made them already
        src_row = np.where(iv.row >= 0, iv.row, iv.arr_row)
        iv.kernel = t.kernel_c[src_row] if iv.n else np.zeros(0, np.int32)
        iv.launch = t.launch[src_row].astype(np.int64) if iv.n else np.zeros(0, np.int64)
    return Graph(
        table_ref=ev, t0=t.t0, pt_t=pts.pt_t, pt_lane=pts.pt_lane, seg_kind=seg.kind, seg_phase=seg.phase,
        seg_owner=seg.owner, d=seg.d, src=e.src, lat=lat, binding=bind, rel_t=e.rel_t,
        lane_first=pts.lane_first, lane_last=pts.lane_last, lane=ln.frame, phase_names=t.phase_names,
        kernel_names=t.kernel_names,
        iv_row=iv.row, iv_arr_row=iv.arr_row, iv_phase=iv.phase, iv_kind=iv.kind, iv_pb=iv_pb, iv_pe=iv_pe,
        iv_kernel=iv.kernel, iv_launch=iv.launch,
        iv_unfinished=iv.unfinished,
        row_pb=pts.row_pb, row_pe=pts.row_pe, arr_rows=iv.arr_rows, arr_occ=e.arr_occ,
        occ_arr_row=e.occ_arr_row, occ_arr_pt=e.occ_arr_pt, occ_starts=e.occ_starts,
        bw_end_pt=e.bw_end_pt, bw_occ=e.bw_occ, bw_arr_row=e.bw_arr_row,
        prev_first_pt=e.prev_first_pt, prev_grp=e.prev_grp, prev_lat=e.prev_lat,
        prev_member_pt=e.prev_member_pt, prev_starts=e.prev_starts, sem=sem, warnings=warns,
    )


def _span_codes(t) -> np.ndarray:
    """The phase codes of span and instant rows, sorted (-1 included when one has none): from the
    table pass's counts where it made them (lanes.table), else from the rows."""
    if t.kind_phase is not None:
        used = t.kind_phase[EVENT_KINDS.index("span")] + t.kind_phase[EVENT_KINDS.index("instant")]
        return (np.flatnonzero(used) - 1).astype(t.phase_c.dtype)
    return used_codes(t.phase_c[t.kind["span"] | t.kind["instant"]], len(t.phase_names))


# -- derived per-graph arrays (computed once, read-only) -------------------------------------
def memo(g: Graph, key, compute):
    """compute() once per graph (several analyses and verdicts read the same derived tables)."""
    hit = g.derived.get(key)
    if hit is None:
        hit = g.derived[key] = compute()
    return hit

def segment_durations(g: Graph) -> np.ndarray:
    """Length of each point's incoming segment (0 at a lane's first point: the launch pseudo-segment)."""
    dur = g.derived.get("dur")
    if dur is None:
        dur = np.empty(g.n_points, np.int64)   # every point written below: no zeroing pass first
        if g.n_points:
            dur[0] = 0
            np.subtract(g.pt_t[1:], g.pt_t[:-1], out=dur[1:])
            dur[g.lane_first] = 0
        dur.flags.writeable = False
        g.derived["dur"] = dur
    return dur


def cum_work(g: Graph) -> np.ndarray:
    """Running total of 'work' segment time over all points (differences within a lane are the
    lane's busy time between two points)."""
    c = g.derived.get("cum_work")
    if c is None:
        c = np.cumsum(np.where(g.seg_kind == WORK, segment_durations(g), 0))
        c.flags.writeable = False
        g.derived["cum_work"] = c
    return c


def kind_mask(seg_kind: np.ndarray, kinds) -> np.ndarray:
    """seg_kind is one of `kinds` (a look-up of the int8 codes: np.isin made several passes over
    the points, 18 ms a call at 2.4 M points, 65 calls at 10 M events)."""
    lut = np.zeros(len(SEG_KINDS), bool)
    lut[list(kinds)] = True
    return lut[seg_kind]


def lane_sums(g: Graph, kinds, dur: np.ndarray | None = None) -> np.ndarray:
    """Per lane: total time of the segments whose kind is in `kinds` (memoised per graph)."""
    if dur is None:
        key = ("lane_sums", tuple(sorted(kinds)))
        if key not in g.derived:
            g.derived[key] = lane_sums(g, kinds, segment_durations(g))
            g.derived[key].flags.writeable = False
        return g.derived[key]
    sel = kind_mask(g.seg_kind, kinds) & (dur > 0)
    return np.bincount(g.pt_lane[sel], weights=dur[sel], minlength=len(g.lane)).astype(np.int64)
