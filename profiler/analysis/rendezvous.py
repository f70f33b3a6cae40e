"""Barrier arrivals and who the others waited on at each occurrence.

Shared by the barrier page and the cross-rank imbalance: at a cross-rank barrier a rank arrives
with its last warp, at a block or grid barrier a warp arrives by itself. The *lateness* of an
occurrence is its last arrival minus the arrival before it: how long the others waited on the
last arriver (had it come with the second-to-last, they would have left that much sooner).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import graph as G
from . import lane_totals as LT
from . import tables_fast
from .timemodel import launch_rows

NO_WORK_SHARE = 0.01   # idle.NO_WORK_SHARE documents it; a warp below it did no work


def arrivals(g: G.Graph) -> pd.DataFrame:
    """One row per barrier arrival: occurrence id (position in g.occ_starts), event row, lane,
    rank/block/warp, time, own departure and wait (unfinished ones too), whether the arrival is
    useless (the warp brought no work since it last synchronised while another arrival of the
    occurrence did, or did no work in its whole launch) and idle_warp (the latter alone).
    Computed once per graph."""
    hit = g.derived.get("arrivals")
    if hit is None:
        hit = g.derived["arrivals"] = _arrivals(g)
    return hit.copy()


def _arrivals(g: G.Graph) -> pd.DataFrame:
    rows = g.occ_arr_row
    pa = g.occ_arr_pt
    n = len(rows)
    counts = np.diff(np.r_[g.occ_starts, n])
    occ = np.repeat(np.arange(len(g.occ_starts)), counts)
    lane = g.pt_lane[pa]
    dep_t = np.full(n, -1, np.int64)
    unf = np.zeros(n, bool)
    bw = np.flatnonzero(g.iv_kind == G.BARRIER)
    if len(bw):
        pos = pd.Index(rows).get_indexer(g.iv_arr_row[bw])
        ok = pos >= 0
        dep_t[pos[ok]] = g.pt_t[g.iv_pe[bw[ok]]]
        unf[pos[ok]] = g.iv_unfinished[bw[ok]]
    busy = LT.points(g).work
    kern = g.lane["kernel"].to_numpy()
    brought = _work_since_sync(g, pa, bw)
    L = g.lane
    a = pd.DataFrame({"occ": occ, "row": rows, "lane": lane, "rank": L["rank"].to_numpy()[lane],
                      "block": L["block"].to_numpy()[lane], "warp": L["warp"].to_numpy()[lane],
                      "t": g.pt_t[pa], "depart_ns": dep_t, "wait_ns": np.where(dep_t >= 0, dep_t - g.pt_t[pa], 0),
                      "kernel": kern[lane].astype(str) if n else np.zeros(0, object),
                      "lane_busy_ns": busy[lane], "brought_ns": brought, "unfinished": unf,
                      "entry_ns": _entries(g, lane)})
    return classify(a, kernel_busy_top(g))


def _entries(g: G.Graph, lane: np.ndarray) -> np.ndarray:
    """Per arrival (its lane): the last rank's entry into the arrival's op occurrence
    (timemodel.launch_rows), NaN where unknown (a rank never launched it): what came before it at a
    cross-rank barrier is a late entry, not the barrier's own lateness."""
    rows = launch_rows(g)
    if rows is None or len(lane) == 0:
        return np.full(len(lane), np.nan)
    L = g.lane
    key = pd.MultiIndex.from_arrays([rows["rank"].to_numpy(), rows["launch"].to_numpy()])
    at = key.get_indexer(pd.MultiIndex.from_arrays([L["rank"].to_numpy()[lane], L["launch"].to_numpy()[lane]]))
    return np.where(at >= 0, rows["last_entry_ns"].to_numpy(float)[np.maximum(at, 0)], np.nan)


def kernel_busy_top(g: G.Graph) -> pd.Series:
    """Per kernel (str): the busiest lane's work time, the reference of NO_WORK_SHARE. A maximum
    over the whole run, so a run analysed in chunks of iterations combines it with max
    (profiler.analysis.chunked) before it classifies arrivals."""
    def compute():
        busy = LT.points(g).work
        return pd.Series(busy).groupby(g.lane["kernel"].astype(str).to_numpy()).max()
    return G.memo(g, "kernel_busy_top", compute).copy()


def classify(a: pd.DataFrame, top: pd.Series) -> pd.DataFrame:
    """Adds `useless` and `idle_warp` to arrivals (lane_busy_ns, brought_ns, kernel, occ) given
    each kernel's busiest lane (kernel_busy_top)."""
    t = top.reindex(a["kernel"].to_numpy()).to_numpy(float) if len(a) else np.zeros(0)
    floor = NO_WORK_SHARE * np.maximum(t, 1)
    idle_lane = a["lane_busy_ns"].to_numpy().astype(float) < floor
    brought = a["brought_ns"].to_numpy() >= floor
    # a barrier orders the work its arrivals bring; an arrival that brought none while another
    # arrival of the same occurrence did only waits to be released (the low-latency dispatch with
    # barrier 'all': warps without a send task arrive at send_done and wait for the grid; with
    # 'working' they do not arrive). When no arrival brought work (a barrier at a kernel's entry)
    # the barrier orders something the events do not show, and no arrival is called useless for it.
    occ = a["occ"].to_numpy()
    n_occ = int(occ.max()) + 1 if len(occ) else 0
    some = np.bincount(occ, weights=brought.astype(float), minlength=n_occ) > 0
    return a.assign(useless=idle_lane | (~brought & some[occ]), idle_warp=idle_lane)


def _work_since_sync(g: G.Graph, pa: np.ndarray, bw: np.ndarray) -> np.ndarray:
    """Per arrival point: the arriving warp's work time since it last synchronised, i.e. since its
    departure from its previous barrier in the launch, or since its first record (points are
    sorted by lane then time, so a lane's earlier barrier waits have smaller point indices)."""
    lane = g.pt_lane[pa]
    start = g.lane_first[lane]
    if len(bw):
        # the barrier wait that arrived last before this arrival (its own excluded: a zero-length
        # wait departs at its arrival's point), and its departure
        o = np.argsort(g.iv_pb[bw], kind="stable")
        arr, dep = g.iv_pb[bw][o], g.iv_pe[bw][o]
        k = np.searchsorted(arr, pa, side="left") - 1
        prev = dep[np.maximum(k, 0)]
        ok = (k >= 0) & (g.pt_lane[arr[np.maximum(k, 0)]] == lane)
        start = np.where(ok, np.maximum(prev, start), start)
    if tables_fast.enabled():
        # the work in (start, arrival] of the arrivals' own lanes, not a running total of every point
        out = np.empty(len(pa), np.int64)
        tables_fast.run_void("work_between", np.ascontiguousarray(g.seg_kind, np.int8), G.segment_durations(g),
                             np.int64(G.WORK), np.ascontiguousarray(start, np.int64),
                             np.ascontiguousarray(pa, np.int64), out)
        return out.astype(float)
    cw = G.cum_work(g)
    return (cw[pa] - cw[start]).astype(float)


def cross_rank(g: G.Graph, occ_first_rows: np.ndarray) -> np.ndarray:
    """Per occurrence (given its first arrival row): whether its barrier is cross-rank."""
    names = (g.events["phase"].iloc[occ_first_rows].astype(str).to_numpy() if len(occ_first_rows)
             else np.zeros(0, object))
    return np.array([g.sem.scope(b) == "rank" for b in names], dtype=bool)


OCCURRENCE_INFO = ["kernel", "barrier", "iteration", "launch", "payload", "scope", "cross", "order_row"]


def occurrence_info(g: G.Graph) -> pd.DataFrame:
    """Per barrier occurrence (row = occurrence id, as arrivals' `occ`): what its first arrival
    row says (kernel, barrier, iteration, launch, payload), its scope and whether it is cross-rank;
    order_row: its first arrival row in table order (occurrences are numbered in that order:
    edges.barrier_edges). A few rows per launch, so a run analysed in chunks keeps it whole."""
    def compute():
        first = g.occ_arr_row[g.occ_starts]
        order_row = np.full(len(first), np.iinfo(np.int64).max, np.int64)
        np.minimum.at(order_row, g.arr_occ, g.arr_rows)
        ev = g.events.iloc[first]
        barrier = ev["phase"].astype(str).to_numpy()
        return pd.DataFrame({"kernel": ev["kernel"].astype(str).to_numpy(), "barrier": barrier,
                             "iteration": ev["iteration"].to_numpy().astype(np.int64),
                             "launch": ev["launch"].to_numpy().astype(np.int64),
                             "payload": ev["payload"].to_numpy().astype(np.int64),
                             "scope": np.array([g.sem.scope(b) for b in barrier], dtype=object),
                             "cross": cross_rank(g, first), "order_row": order_row}, columns=OCCURRENCE_INFO)
    return G.memo(g, "occurrence_info", compute)


def lateness(a: pd.DataFrame, cross: np.ndarray) -> np.ndarray:
    """Per occurrence: last arrival minus the arrival before it (per rank at cross-rank barriers)."""
    n_occ = int(a["occ"].max()) + 1 if len(a) else 0
    out = np.zeros(n_occ, np.int64)
    if n_occ == 0:
        return out
    unit = np.where(cross[a["occ"].to_numpy()], a["rank"].to_numpy(), a["lane"].to_numpy() + 1_000_000)
    by = a.assign(unit=unit).groupby(["occ", "unit"], sort=False)["t"].max().reset_index()
    by = by.sort_values(["occ", "t"], kind="stable")
    occ = by["occ"].to_numpy()
    t = by["t"].to_numpy()
    last = np.r_[occ[1:] != occ[:-1], True]
    has_prev = np.r_[False, occ[1:] == occ[:-1]]
    li = np.flatnonzero(last & has_prev)
    out[occ[li]] = t[li] - t[li - 1]
    return out


def rank_lateness(g: G.Graph) -> pd.DataFrame:
    """Per cross-rank barrier occurrence: the rank that arrived last, the rank before it, when
    each arrived, and how long the others waited on the last one (lateness_ns). Memoised."""
    return G.memo(g, "rank_lateness", lambda: _rank_lateness(g)).copy()


def _rank_lateness(g: G.Graph) -> pd.DataFrame:
    cols = ["iteration", "kernel", "barrier", "rank", "peer", "last_ns", "prev_ns", "lateness_ns"]
    info = occurrence_info(g)
    if len(info) == 0:
        return pd.DataFrame(columns=cols)
    a = arrivals(g)
    cross = info["cross"].to_numpy()
    if not cross.any():
        return pd.DataFrame(columns=cols)
    a = a[cross[a["occ"].to_numpy()]]
    by = a.groupby(["occ", "rank"], sort=False)["t"].max().reset_index().sort_values(["occ", "t"], kind="stable")
    occ, rk, t = by["occ"].to_numpy(), by["rank"].to_numpy(), by["t"].to_numpy()
    last = np.r_[occ[1:] != occ[:-1], True]
    has_prev = np.r_[False, occ[1:] == occ[:-1]]
    li = np.flatnonzero(last)
    pi = np.where(has_prev[li], li - 1, li)
    ev = info.iloc[occ[li]]
    df = pd.DataFrame({"iteration": ev["iteration"].to_numpy(), "kernel": ev["kernel"].to_numpy(),
                       "barrier": ev["barrier"].to_numpy(), "rank": rk[li],
                       "peer": np.where(has_prev[li], rk[pi], -1), "last_ns": t[li], "prev_ns": t[pi],
                       "lateness_ns": t[li] - t[pi]})
    return df.sort_values(["iteration", "last_ns"], kind="stable").reset_index(drop=True)[cols]
