"""Re-timing the dependency graph with changed segment durations (what-if's solver).

Solves the graph's recurrence T[p] = max(T[p-1] + d[p], cross(p)) for new durations d, where
cross(p) is the new time of p's cross dependency plus the recorded latency (profiler.analysis.graph
documents the model). With the recorded durations it reproduces the recorded times exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import retime_fast
from .graph import Graph


# window of targets relaxed together by retime(), and the sweeps before a window is split; sized
# so that a window spans a short slice of time in which each warp has only a few targets
RETIME_WINDOW = 4096
WINDOW_SWEEPS = 12
numpy_halved = 0   # windows the numpy path's last _solve halved (tests/analysis/test_retime_fast.py reads it)


@dataclass
class RetimeInput:
    """What re-timing a graph needs, at the scale of its targets (about a third of its points), kept
    without the graph: chunked.py keeps one a chunk for the idle page's balancing what-if, so that
    re-timing a chunk needs no second read and no second graph build.

    Offsets are those of the recorded durations; `solve` takes the shortening of some segments
    and subtracts, from each offset between two points of a lane, the shortening between them
    (exact integer sums: the same offsets as the prefix sums of the new durations that `retime`
    takes). Integer arrays are stored int32 where their values fit (the arithmetic is int64)."""
    tgt: np.ndarray              # target points, ascending
    t: np.ndarray                # their recorded times
    first: np.ndarray            # a lane's first point
    fixed: np.ndarray            # a first point without any source: stays at its recorded time
    own_off: np.ndarray          # offset from the lane's previous target (0 at a first point)
    has_src: np.ndarray          # a cross source other than a barrier's (src_pt, its target ks)
    src_pt: np.ndarray
    ks: np.ndarray
    src_off: np.ndarray          # the source's offset from its target plus the recorded latency
    occ_of_t: np.ndarray         # barrier departure: its occurrence (-1 otherwise), and latency
    lat_bw: np.ndarray
    a_pt: np.ndarray             # arrivals grouped by occurrence (graph.occ_arr_pt), their target and offset
    ak: np.ndarray
    aoff: np.ndarray
    occ_starts: np.ndarray
    grp_of_t: np.ndarray         # a lane's first point after a previous launch: its group (-1), latency
    lat_pf: np.ndarray
    m_pt: np.ndarray             # last points of the previous launch's lanes (graph.prev_member_pt)
    mk: np.ndarray
    moff: np.ndarray
    prev_starts: np.ndarray
    order: np.ndarray            # targets to solve, in recorded-time order
    out_pt: np.ndarray           # points whose new time `solve` returns, their target and offset
    out_k: np.ndarray
    out_off: np.ndarray

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray))

    def solve(self, pts: np.ndarray | None = None, shorter: np.ndarray | None = None) -> np.ndarray:
        """New times of `out_pt` when the segments ending at points `pts` (ascending, none a
        lane's first) are `shorter` (ns) than recorded; None: the recorded durations."""
        if pts is None or len(pts) == 0:
            def D(x):
                return np.zeros(len(x), np.int64)
        else:
            cum = np.r_[np.int64(0), np.cumsum(shorter, dtype=np.int64)]

            def D(x):                                  # shortening at or before each point
                return cum[np.searchsorted(pts, x, side="right")]
        fast = (retime_fast.offsets(self, pts, cum) if pts is not None and len(pts) and retime_fast.enabled()
                else None)
        # ks as stored (int32: the compiled loop reads it so, numpy indexes with it), not an int64 copy
        ks = self.ks
        if fast is not None:                       # the same arrays, one pass
            dt, own, src = fast
        else:
            dt = D(self.tgt)
            nt = len(self.tgt)
            prev = np.maximum(np.arange(nt) - 1, 0)
            own = np.where(self.first, 0, self.own_off - (dt - dt[prev]))
            src = np.where(self.has_src, self.src_off - (D(self.src_pt) - dt[np.maximum(ks, 0)]), 0)
        ak, mk = self.ak.astype(np.int64), self.mk.astype(np.int64)
        aoff = self.aoff - (D(self.a_pt) - dt[ak])
        moff = self.moff - (D(self.m_pt) - dt[mk])
        T = _solve(self, own, ks, src, aoff, moff)
        k = self.out_k.astype(np.int64)
        return T[k] + (self.out_off - (D(self.out_pt) - dt[k]))


def _narrow(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind != "i" or a.itemsize <= 4 or not len(a):
        return a
    if a.ndim == 1 and a.dtype == np.int64 and len(a) > 4096 and retime_fast.enabled():
        n = retime_fast.narrow32(a)            # one pass instead of min, max and astype
        return a if n is None else n
    if a.min() >= -2**31 and a.max() < 2**31:
        return a.astype(np.int32)
    return a


def _prepare(g: Graph, d: np.ndarray, iterations=None, out_pt: np.ndarray | None = None, narrow: bool = False):
    """(RetimeInput of durations d, the target at or before each point, the prefix sums S):
    retime_fast's compiled loops where they can run (the same arrays), else the numpy code below.
    narrow: the compiled loops may make int32 what _narrow would (retime_input narrows the rest)."""
    out_pt = np.zeros(0, np.int64) if out_pt is None else out_pt
    fast = retime_fast.prepare(g, d, out_pt, narrow) if retime_fast.enabled() else None
    if fast is not None:
        a, kx, S = fast
        inp = RetimeInput(**a, out_pt=out_pt)
        if iterations is not None:
            inp.order = _of_iterations(g, inp.order, inp.tgt, iterations)
        return inp, kx, S
    is_first = np.zeros(g.n_points, bool)
    is_first[g.lane_first] = True
    dd = np.where(is_first, 0, d).astype(np.int64)
    # prefix sums over all points: only differences within a lane are read (a point and the target
    # at or before it, a lane's first point being one), so they need not restart at each lane
    S = np.cumsum(dd)
    del dd
    is_bw = np.zeros(g.n_points, bool)
    is_bw[g.bw_end_pt] = True
    is_pf = np.zeros(g.n_points, bool)
    is_pf[g.prev_first_pt] = True
    is_tgt = is_first | (g.src >= 0) | is_bw | is_pf
    tgt = np.flatnonzero(is_tgt)                          # sorted by point index
    nt = len(tgt)
    # the target at or before each point (same lane: a lane's first point is a target), by a
    # running count of targets (a searchsorted of every point into tgt cost 0.2 s a 2.5 M-event
    # chunk); at a target, its own number
    kx = np.cumsum(is_tgt, dtype=np.int64)
    kx -= 1

    def off(x, k):                                        # value(x) = Tt[k] + off
        return S[x] - S[tgt[k]]

    first_t = is_first[tgt]
    own_off = np.where(first_t, 0, off(tgt, np.maximum(np.arange(nt) - 1, 0)))
    srcp = g.src[tgt]
    has_src = (srcp >= 0) & ~is_bw[tgt]                  # departures use the occurrence max instead
    src_pt = np.where(has_src, srcp, 0)
    ks = np.where(has_src, kx[src_pt], -1)
    src_off = np.where(has_src, off(src_pt, np.maximum(ks, 0)) + g.lat[tgt], 0)
    fixed = first_t & (srcp < 0) & ~is_pf[tgt]
    # barrier occurrences: arrivals as (k, offset) grouped by occurrence
    occ_of_t = np.full(nt, -1, np.int64)
    lat_bw = np.zeros(nt, np.int64)
    occ_of_t[kx[g.bw_end_pt]] = g.bw_occ
    lat_bw[kx[g.bw_end_pt]] = g.lat[g.bw_end_pt]
    ak = kx[g.occ_arr_pt]
    # previous-launch groups: last points of the previous launch's lanes
    grp_of_t = np.full(nt, -1, np.int64)
    lat_pf = np.zeros(nt, np.int64)
    grp_of_t[kx[g.prev_first_pt]] = g.prev_grp
    lat_pf[kx[g.prev_first_pt]] = g.prev_lat
    mk = kx[g.prev_member_pt]
    del is_tgt, is_first, is_bw, is_pf

    order = np.lexsort((tgt, g.pt_t[tgt]))
    if iterations is not None:
        order = _of_iterations(g, order, tgt, iterations)
    out_k = kx[out_pt]
    inp = RetimeInput(tgt=tgt, t=g.pt_t[tgt], first=first_t, fixed=fixed, own_off=own_off, has_src=has_src,
                      src_pt=src_pt, ks=ks, src_off=src_off, occ_of_t=occ_of_t, lat_bw=lat_bw, a_pt=g.occ_arr_pt,
                      ak=ak, aoff=off(g.occ_arr_pt, ak), occ_starts=g.occ_starts, grp_of_t=grp_of_t, lat_pf=lat_pf,
                      m_pt=g.prev_member_pt, mk=mk, moff=off(g.prev_member_pt, mk), prev_starts=g.prev_starts,
                      order=order, out_pt=out_pt, out_k=out_k, out_off=off(out_pt, out_k))
    return inp, kx, S


def _of_iterations(g: Graph, order: np.ndarray, tgt: np.ndarray, iterations) -> np.ndarray:
    """The targets of `order` in the lanes of `iterations` (retime's `iterations`)."""
    it_of_t = g.lane["iteration"].to_numpy()[g.pt_lane[tgt]]
    return order[np.isin(it_of_t[order], np.atleast_1d(iterations))]


def retime_input(g: Graph, out_pt: np.ndarray) -> RetimeInput:
    """The graph's RetimeInput with its recorded durations, answering for the points `out_pt`
    (integers narrowed: about 50 bytes a target)."""
    inp, _, _ = _prepare(g, g.d, out_pt=out_pt, narrow=True)
    for k, v in vars(inp).items():
        if isinstance(v, np.ndarray):
            setattr(inp, k, _narrow(v))
    return inp


def retime(g: Graph, d: np.ndarray, iterations=None) -> np.ndarray:
    """Solve T[p] = max(T[p-1] + d[p], cross(p)) for all points, given segment durations d.

    cross(p) is T[src[p]] + lat[p]; for a barrier departure the latest new arrival of its
    occurrence + lat; for a lane's first point also the previous launch's new end + its latency;
    a first point without any source stays at its recorded time.

    Only the points with a cross dependency ("targets": wait ends, departures, lane starts) need
    solving; any other point is its lane's previous target plus the prefix sum of d between them.
    Targets are solved in recorded-time order (a topological order: every dependency ended no
    later than its dependant), in windows of RETIME_WINDOW targets: each window is relaxed with
    vectorised sweeps until it stops changing (its dependencies inside the window are short
    chains); a window that needs more than WINDOW_SWEEPS sweeps is split in halves.
    iterations: solve only these (d must equal g.d elsewhere; other points keep their times).
    """
    if g.n_points == 0:
        return g.pt_t.copy()
    inp, kx, S = _prepare(g, d, iterations)
    T = _solve(inp, inp.own_off, inp.ks, inp.src_off, inp.aoff, inp.moff)
    return T[kx] + S - S[inp.tgt[kx]]


def _solve(inp: RetimeInput, own_off, ks, src_off, aoff, moff) -> np.ndarray:
    """New times of the targets (retime's docstring), the offsets given: retime_fast's compiled loop
    where it can run (the same windows, sweeps and halving, the same T; its gathers made once, not a
    window or a sweep at a time), else the numpy code below."""
    if retime_fast.enabled():
        T = retime_fast.solve(inp, own_off, ks, src_off, aoff, moff, RETIME_WINDOW, WINDOW_SWEEPS)
        if T is not None:
            return T
    NEG = np.iinfo(np.int64).min // 4
    nt = len(inp.tgt)
    first_t, has_src, fixed = inp.first, inp.has_src, inp.fixed
    occ_of_t, lat_bw, grp_of_t, lat_pf = inp.occ_of_t, inp.lat_bw, inp.grp_of_t, inp.lat_pf
    ak, mk, occ_starts, prev_starts = inp.ak, inp.mk, inp.occ_starts, inp.prev_starts
    order = inp.order
    n_solve = len(order)
    T = inp.t.astype(np.int64)                           # a copy
    fixed_val = inp.t
    prev_k = np.maximum(np.arange(nt) - 1, 0)
    bw_any, pf_any = bool(len(ak)), bool(len(mk))

    def solve(lo, hi):
        """Targets order[lo:hi] in time order: everything before lo is final. Jacobi sweeps over
        the window settle its internal chains; a window whose chains are too long is halved. What
        a sweep reads of the targets' own arrays is gathered once a window (half the sweep's cost)."""
        idx = order[lo:hi]
        ft, pk, oo = first_t[idx], prev_k[idx], own_off[idx]
        hs, ksi, so = has_src[idx], np.maximum(ks[idx], 0), src_off[idx]
        fx, fv = fixed[idx], fixed_val[idx]
        mb = occ_of_t[idx] >= 0 if bw_any else None
        bw = bool(bw_any and mb.any())
        if bw:
            ob, lb = occ_of_t[idx[mb]], lat_bw[idx[mb]]
        mp = grp_of_t[idx] >= 0 if pf_any else None
        pf = bool(pf_any and mp.any())
        if pf:
            qp, lp = grp_of_t[idx[mp]], lat_pf[idx[mp]]
        for _ in range(WINDOW_SWEEPS):
            v = np.where(ft, NEG, T[pk] + oo)
            v = np.where(hs, np.maximum(v, T[ksi] + so), v)
            if bw:
                om = np.maximum.reduceat(T[ak] + aoff, occ_starts)
                v[mb] = np.maximum(v[mb], om[ob] + lb)
            if pf:
                gm = np.maximum.reduceat(T[mk] + moff, prev_starts)
                v[mp] = np.maximum(v[mp], gm[qp] + lp)
            v = np.where(fx, fv, v)
            if np.array_equal(v, T[idx]):
                return
            T[idx] = v
        if hi - lo == 1:
            return
        halved[0] += 1
        mid = (lo + hi) // 2
        solve(lo, mid)
        solve(mid, hi)

    halved = [0]
    for lo in range(0, n_solve, RETIME_WINDOW):
        solve(lo, min(lo + RETIME_WINDOW, n_solve))
    global numpy_halved
    numpy_halved = halved[0]
    return T
