"""The walk every path reading shares: binding predecessors, iteration spans, and the chain of
points from each iteration's last point back to where nothing precedes it. One floor below the
critical path and its verdict (both read it; the verdict used to reach up into critical_path).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import graph as G
from . import tables_fast

TOTAL_COLUMNS = ["iteration", "begin_ns", "end_ns", "total_ns"]


def predecessors(g: G.Graph) -> np.ndarray:
    """The binding predecessor point of every point in recorded time (-1 at a start)."""
    pred = np.where(g.first_mask(), -1, np.arange(g.n_points) - 1)
    return np.where(g.binding, g.src, pred)


def predecessors_at(g: G.Graph, pts: np.ndarray) -> np.ndarray:
    """predecessors(g)[pts], without a pass over every point."""
    pts = np.asarray(pts, np.int64)
    first = g.lane_first[g.pt_lane[pts]] == pts
    return np.where(g.binding[pts], g.src[pts], np.where(first, -1, pts - 1))


def iteration_totals(g: G.Graph, times: np.ndarray | None = None) -> pd.DataFrame:
    """Per iteration: first begin of any lane, last end of its GPU lanes (host lanes only when the
    iteration has no GPU lane: a host call that synchronises outlives the kernels it waits for).
    `times`: point times to use instead of the recorded ones (a re-timed graph)."""
    if times is None:
        hit = g.derived.get("iteration_totals")
        if hit is None:
            hit = g.derived["iteration_totals"] = _iteration_totals(g, g.pt_t)
        return hit.copy()
    return _iteration_totals(g, times)


def _iteration_totals(g: G.Graph, t: np.ndarray) -> pd.DataFrame:
    if g.n_points == 0:
        return pd.DataFrame({c: pd.Series([], dtype="int64") for c in TOTAL_COLUMNS})
    host = g.lane["host"].to_numpy()
    df = pd.DataFrame({"iteration": g.lane["iteration"].to_numpy(), "b": t[g.lane_first],
                       "e": t[g.lane_last], "eg": np.where(host, np.iinfo(np.int64).min, t[g.lane_last])})
    agg = df.groupby("iteration", sort=True).agg(b=("b", "min"), e=("e", "max"), eg=("eg", "max"))
    end = np.where(agg["eg"].to_numpy() > np.iinfo(np.int64).min, agg["eg"].to_numpy(), agg["e"].to_numpy())
    out = pd.DataFrame({"iteration": agg.index.to_numpy().astype(np.int64), "begin_ns": agg["b"].to_numpy(),
                        "end_ns": end})
    out["total_ns"] = out["end_ns"] - out["begin_ns"]
    return out


def path_points(g: G.Graph, iterations=None) -> tuple[np.ndarray, np.ndarray]:
    """Points along the path of each iteration, earliest first; returns (points, iteration)."""
    if g.n_points == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lane_it = g.lane["iteration"].to_numpy()
    # last point of each iteration: the latest GPU lane end (host lanes only in an iteration
    # without GPU lanes), the first such lane among ties
    host = g.lane["host"].to_numpy()
    has_gpu = pd.Series(~host).groupby(lane_it).transform("any").to_numpy()
    last_t = np.where(host & has_gpu, np.iinfo(np.int64).min, g.pt_t[g.lane_last])
    o = np.lexsort((-np.arange(len(last_t)), last_t, lane_it))
    last_mask = np.r_[lane_it[o][1:] != lane_it[o][:-1], True]
    ends = g.lane_last[o[last_mask]]
    ends_it = lane_it[g.pt_lane[ends]]
    if iterations is not None:
        keep = np.asarray([int(i) in iterations for i in ends_it], bool)
        ends, ends_it = ends[keep], ends_it[keep]
    walked = _walk_compiled(g, ends, ends_it, lane_it)
    if walked is not None:
        return walked
    pred = predecessors(g)
    is_first = g.first_mask()
    it_of_pt = lane_it[g.pt_lane]
    pts, its = [], []
    for p in ends:
        i = int(it_of_pt[p])
        chain, seen = [], set()
        p = int(p)
        while p >= 0 and it_of_pt[p] == i:
            chain.append(p)
            seen.add(p)
            q = int(pred[p])
            if q in seen:
                # equal timestamps (32 ns timer steps) can make two cross edges point at each
                # other; fall back to the warp's own predecessor, which is strictly earlier
                q = p - 1 if not is_first[p] else -1
            p = q
        chain.reverse()
        pts.append(np.asarray(chain, np.int64))
        its.append(np.full(len(chain), i, np.int64))
    if not pts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(pts), np.concatenate(its)


def _walk_compiled(g: G.Graph, ends: np.ndarray, ends_it: np.ndarray, lane_it: np.ndarray):
    """path_points' chains from one compiled walk (tables_fast), or None where it cannot run."""
    if not tables_fast.enabled() or g.src.dtype != np.int32 or lane_it.dtype != np.int32:
        return None
    n = g.n_points
    out_p, out_it = np.empty(n, np.int64), np.empty(n, np.int64)
    m = tables_fast.run("path_walk", np.ascontiguousarray(ends, np.int64), np.ascontiguousarray(ends_it, np.int64),
                        np.ascontiguousarray(g.binding), np.ascontiguousarray(g.src),
                        np.ascontiguousarray(g.lane_first, np.int64), np.ascontiguousarray(g.pt_lane, np.int64),
                        np.ascontiguousarray(lane_it), np.zeros(n, np.int64), out_p, out_it)
    return out_p[:m].copy(), out_it[:m].copy()
