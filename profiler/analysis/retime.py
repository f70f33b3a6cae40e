"""Re-timing the dependency graph with changed segment durations (what-if's solver).

Solves the graph's recurrence T[p] = max(T[p-1] + d[p], cross(p)) for new durations d, where
cross(p) is the new time of p's cross dependency plus the recorded latency (profiler.analysis.graph
documents the model). With the recorded durations it reproduces the recorded times exactly.
"""
from __future__ import annotations

import numpy as np

from .graph import Graph


# window of targets relaxed together by retime(), and the sweeps before a window is split; sized
# so that a window spans a short slice of time in which each warp has only a few targets
RETIME_WINDOW = 4096
WINDOW_SWEEPS = 12


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
    P = g.n_points
    if P == 0:
        return g.pt_t.copy()
    NEG = np.iinfo(np.int64).min // 4
    is_first = np.zeros(P, bool)
    is_first[g.lane_first] = True
    dd = np.where(is_first, 0, d).astype(np.int64)
    S = np.cumsum(dd)
    S -= S[g.lane_first[g.pt_lane]]                      # prefix sums restart at each lane
    is_bw = np.zeros(P, bool)
    is_bw[g.bw_end_pt] = True
    is_pf = np.zeros(P, bool)
    is_pf[g.prev_first_pt] = True
    tgt = np.flatnonzero(is_first | (g.src >= 0) | is_bw | is_pf)   # sorted by point index
    nt = len(tgt)
    kpos = np.full(P, -1, np.int64)
    kpos[tgt] = np.arange(nt)
    # the target at or before each point (same lane: a lane's first point is a target), by a
    # running count of targets (a searchsorted of every point into tgt cost 0.2 s a 2.5 M-event chunk)
    kx = np.cumsum(kpos >= 0)
    kx -= 1

    def k_of(x):
        return kx[x]

    def off(x, k):                                        # value(x) = Tt[k] + off
        return S[x] - S[tgt[k]]

    first_t = is_first[tgt]
    own_off = np.where(first_t, 0, off(tgt, np.maximum(np.arange(nt) - 1, 0)))
    srcp = g.src[tgt]
    has_src = (srcp >= 0) & ~is_bw[tgt]                  # departures use the occurrence max instead
    ks = np.where(has_src, k_of(np.maximum(srcp, 0)), -1)
    src_off = np.where(has_src, off(np.maximum(srcp, 0), np.maximum(ks, 0)) + g.lat[tgt], 0)
    fixed = first_t & (srcp < 0) & ~is_pf[tgt]
    # barrier occurrences: arrivals as (k, offset) grouped by occurrence
    occ_of_t = np.full(nt, -1, np.int64)
    lat_bw = np.zeros(nt, np.int64)
    occ_of_t[kpos[g.bw_end_pt]] = g.bw_occ
    lat_bw[kpos[g.bw_end_pt]] = g.lat[g.bw_end_pt]
    ak = k_of(g.occ_arr_pt)
    aoff = off(g.occ_arr_pt, ak)
    # previous-launch groups: last points of the previous launch's lanes
    grp_of_t = np.full(nt, -1, np.int64)
    lat_pf = np.zeros(nt, np.int64)
    grp_of_t[kpos[g.prev_first_pt]] = g.prev_grp
    lat_pf[kpos[g.prev_first_pt]] = g.prev_lat
    mk = k_of(g.prev_member_pt)
    moff = off(g.prev_member_pt, mk)

    order = np.lexsort((tgt, g.pt_t[tgt]))
    if iterations is not None:
        it_of_t = g.lane["iteration"].to_numpy()[g.pt_lane[tgt]]
        order = order[np.isin(it_of_t[order], np.atleast_1d(iterations))]
    n_solve = len(order)
    T = g.pt_t[tgt].copy()
    fixed_val = g.pt_t[tgt]
    prev_k = np.maximum(np.arange(nt) - 1, 0)
    bw_any, pf_any = bool(len(ak)), bool(len(mk))

    def evaluate(idx):
        v = np.where(first_t[idx], NEG, T[prev_k[idx]] + own_off[idx])
        hs = has_src[idx]
        v = np.where(hs, np.maximum(v, T[np.maximum(ks[idx], 0)] + src_off[idx]), v)
        if bw_any:
            o = occ_of_t[idx]
            m = o >= 0
            if m.any():
                om = np.maximum.reduceat(T[ak] + aoff, g.occ_starts)
                v[m] = np.maximum(v[m], om[o[m]] + lat_bw[idx[m]])
        if pf_any:
            q = grp_of_t[idx]
            m = q >= 0
            if m.any():
                gm = np.maximum.reduceat(T[mk] + moff, g.prev_starts)
                v[m] = np.maximum(v[m], gm[q[m]] + lat_pf[idx[m]])
        return np.where(fixed[idx], fixed_val[idx], v)

    def solve(lo, hi):
        """Targets order[lo:hi] in time order: everything before lo is final. Jacobi sweeps over
        the window settle its internal chains; a window whose chains are too long is halved."""
        idx = order[lo:hi]
        for _ in range(WINDOW_SWEEPS):
            v = evaluate(idx)
            if np.array_equal(v, T[idx]):
                return
            T[idx] = v
        if hi - lo == 1:
            return
        mid = (lo + hi) // 2
        solve(lo, mid)
        solve(mid, hi)

    for lo in range(0, n_solve, RETIME_WINDOW):
        solve(lo, min(lo + RETIME_WINDOW, n_solve))
    return T[kx] + S - S[tgt[kx]]
