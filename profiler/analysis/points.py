"""Step 3 of the graph: points, owners and segments.

The begin and end times of a lane's rows cut it into *points* (unique (lane, time), sorted). The
stretch between two consecutive points of a lane is a *segment*; it belongs to the innermost
interval covering it (nesting by depth: a parent span owns only the time its children leave), or
to nobody (a gap). Each point's incoming segment is stored on the point; a lane's first point
carries the 'launch' pseudo-segment (kernel-ready to its first record).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import graph_fast
from .intervals import GAP, LAUNCH, Intervals
from .keys import index_dtype
from .lanes import Lanes, Table


@dataclass
class Points:
    pt_t: np.ndarray             # int64 absolute ns, sorted by (lane, time)
    pt_lane: np.ndarray
    row_pb: np.ndarray           # per event row: its begin point (int32 while they fit: keys.index_dtype)
    row_pe: np.ndarray           # per event row: its end point
    lane_first: np.ndarray       # first point of each lane
    lane_last: np.ndarray
    is_first: np.ndarray | None = None   # first_mask(), once made (segments and binding both read it)

    @property
    def n(self) -> int:
        return len(self.pt_t)

    def first_mask(self) -> np.ndarray:
        """A point is a lane's first (read-only, made once)."""
        if self.is_first is None:
            m = np.zeros(self.n, dtype=bool)
            m[self.lane_first[self.lane_first < self.n]] = True
            m.flags.writeable = False
            self.is_first = m
        return self.is_first


def points(t: Table, lanes: Lanes) -> Points:
    """Unique (lane, t) of every row boundary: the compiled merge (graph_fast.points) where it can
    run, else a stable sort of all 2n boundaries (rows usually come sorted by lane and begin, the
    decoder's region order, so timsort merges two near-sorted runs)."""
    if graph_fast.enabled():
        got = graph_fast.points(lanes.lane_id, t.begin, t.end, t.tb, t.t0, lanes.n, lanes.by_lane)
        if got is not None:
            pt_t, pt_lane, row_pb, row_pe, count = got
            return _points(pt_t, pt_lane, row_pb, row_pe, count, lanes.n)
    return points_numpy(t, lanes)


def _points(pt_t, pt_lane, row_pb, row_pe, count, n_lanes: int) -> Points:
    """Points from their arrays and the points of each lane (`count`: first and last by its
    prefix sums, lanes without points included)."""
    ends = np.cumsum(count)
    return Points(pt_t=pt_t, pt_lane=pt_lane, row_pb=row_pb, row_pe=row_pe,
                  lane_first=np.r_[np.zeros(min(n_lanes, 1), ends.dtype), ends[:-1]], lane_last=ends - 1)


def points_numpy(t: Table, lanes: Lanes) -> Points:
    """points() by a stable argsort of the 2n (lane, time) keys."""
    n = t.n
    pk_all = np.empty(2 * n, np.int64)
    np.left_shift(lanes.lane_id, t.tb, out=pk_all[:n])
    pk_all[n:] = pk_all[:n]
    pk_all[:n] |= t.b_rel
    pk_all[n:] |= t.e_rel
    o = np.argsort(pk_all, kind="stable")
    pk_sorted = pk_all[o]
    del pk_all
    new = np.empty(len(pk_sorted), bool)
    if len(new):
        new[0] = True
        np.not_equal(pk_sorted[1:], pk_sorted[:-1], out=new[1:])
    pkey = pk_sorted[new]
    del pk_sorted
    idx = index_dtype(2 * n)                 # points <= 2n: row_pb / row_pe narrowed (keys.index_dtype)
    rank_of_sorted = np.cumsum(new, dtype=idx)
    rank_of_sorted -= 1
    inv = np.empty(2 * n, idx)
    inv[o] = rank_of_sorted
    del o, new, rank_of_sorted
    pt_lane = pkey >> t.tb
    # pt_lane is sorted: each lane's first and last point by counting (what searchsorted of every
    # lane would give, lanes without points included, at a fraction of its cost)
    return _points((pkey & ((1 << t.tb) - 1)) + t.t0, pt_lane, inv[:n], inv[n:],
                   np.bincount(pt_lane, minlength=lanes.n), lanes.n)


def owners(iv_pb: np.ndarray, iv_pe: np.ndarray, P: int) -> np.ndarray:
    """Owner interval of segment k = (point k, point k+1), -1 if none.

    Nesting depth of an interval: the intervals active across its begin point (begun before the
    point minus ended at or before it; lanes cancel out in the global sums) plus the longer ones
    beginning at the same point. Properly nested spans get their true depth; overlapping ones
    degrade to "latest begun wins". Painted shallow to deep, one vectorised pass per level."""
    n_iv = len(iv_pb)
    owner = np.full(P, -1, dtype=index_dtype(n_iv))
    if n_iv == 0:
        return owner
    pbits = max(P, 1).bit_length()
    # (iv_pb may be int32: widened before the shift)
    order = np.argsort((iv_pb.astype(np.int64) << pbits) | (P - iv_pe), kind="stable")   # by begin, longest first
    if graph_fast.enabled():   # the same, one pass and a counting sort by level
        got = graph_fast.owners(order, iv_pb, iv_pe, P)
        if got is not None:
            return got
    pb_s = iv_pb[order]
    grp_first = np.flatnonzero(np.r_[True, pb_s[1:] != pb_s[:-1]])
    start_mark = np.zeros(n_iv, np.int64)
    start_mark[grp_first] = grp_first
    rank_in_grp = np.arange(n_iv) - np.maximum.accumulate(start_mark)
    depth_s = active_before(iv_pb, iv_pe, P)[pb_s]
    depth_s += rank_in_grp
    np.maximum(depth_s, 0, out=depth_s)
    for lvl in range(int(depth_s.max()) + 1):
        sel = order[depth_s == lvl]                 # in (begin, -end) order
        if len(sel) == 0:
            continue
        # interval j owns the points from its begin up to its end or the next begin of its level,
        # whichever comes first (overlapping intervals: the latest begun wins; of two with one
        # begin, the later in this order, the shorter): disjoint ranges, painted over the points
        # they hold only (a pass over all P points per level cost 0.29 s a 2.5 M-event chunk)
        b = iv_pb[sel]
        ln = np.minimum(iv_pe[sel], np.r_[b[1:], P]) - b
        np.maximum(ln, 0, out=ln)
        tot = int(ln.sum())
        if tot == 0:
            continue
        base = np.repeat(b - (np.cumsum(ln) - ln), ln)
        base += np.arange(tot)
        owner[base] = np.repeat(sel, ln)
    return owner


def active_before(iv_pb: np.ndarray, iv_pe: np.ndarray, P: int) -> np.ndarray:
    """Per point k: intervals begun before k minus those ended at or before k (for a point with a
    begin: the intervals active across it, as the lanes' counts cancel in the global sums).
    Two P-long arrays live at most (the prefix sums of begins and of ends, each then reused)."""
    x = np.bincount(iv_pb, minlength=P)
    out = np.cumsum(x)
    out -= x                                 # begun strictly before k
    del x
    x = np.bincount(iv_pe, minlength=P)
    out -= np.cumsum(x, out=x)               # ... minus ended at or before k
    return out


@dataclass
class Segments:
    kind: np.ndarray             # int8 code into SEG_KINDS of the point's incoming segment
    phase: np.ndarray            # int32 phase code, -1 for gaps / launch
    owner: np.ndarray            # interval (int32 while they fit: keys.index_dtype), -1 if none
    d: np.ndarray                # int64 own duration in the recurrence (0 at a lane's first point)


def segments(pts: Points, iv: Intervals, owner: np.ndarray) -> Segments:
    """Each point's incoming segment: graph_fast's one pass where it can run, else numpy's."""
    if graph_fast.enabled():
        got = graph_fast.segments(owner, iv.kind, iv.phase, pts.lane_first, pts.pt_t, GAP, LAUNCH)
        if got is not None:
            is_first, seg_owner, kind, phase, d = got
            is_first.flags.writeable = False
            pts.is_first = is_first
            return Segments(kind=kind, phase=phase, owner=seg_owner, d=d)
    return segments_numpy(pts, iv, owner)


def segments_numpy(pts: Points, iv: Intervals, owner: np.ndarray) -> Segments:
    P = pts.n
    seg_owner = np.full(P, -1, dtype=owner.dtype)
    seg_owner[1:] = owner[:-1]
    is_first = pts.first_mask()
    seg_owner[is_first] = -1
    has_o = seg_owner >= 0
    kind = np.full(P, GAP, dtype=np.int8)
    kind[has_o] = iv.kind[seg_owner[has_o]]
    kind[is_first] = LAUNCH
    phase = np.full(P, -1, dtype=np.int32)
    phase[has_o] = iv.phase[seg_owner[has_o]]
    d = np.zeros(P, dtype=np.int64)
    d[1:] = np.diff(pts.pt_t)
    d[is_first] = 0
    return Segments(kind=kind, phase=phase, owner=seg_owner, d=d)
