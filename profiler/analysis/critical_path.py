"""Critical path across ranks (the returned columns are documented in the package docstring).

The path is found by walking the dependency graph (profiler.analysis.graph) backwards from the
last point of each iteration: at each point the predecessor is the cross edge when it is binding
(the release / last arrival / kernel-ready came after the wait began) and the previous point of
the same warp otherwise. The walk costs one step per path point, after a vectorised build.

The path covers the whole iteration: where the walk stops (a point nothing precedes) after the
iteration began, the stretch from the iteration's begin to that point is the rank's late entry,
kind 'host' when the rank has host rows in the iteration (its host entered the op late), else
'launch' (its first kernel started late). So the segments of an iteration add up to its span.

Slack is the free float of a warp: min over its barrier arrivals of (occurrence's last arrival -
own arrival) and, unless the warp ends in a barrier wait (then others release it), of (iteration
end - own last point); warps on the path get 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import graph as G
from . import lane_totals as LT
from .path_verdict import headline as _headline
from .path_walk import TOTAL_COLUMNS, iteration_totals, path_points, predecessors, predecessors_at  # noqa: F401 (re-exported)
from .peers import interval_peers

SEGMENT_COLUMNS = ["iteration", "rank", "kernel", "launch", "block", "warp", "role", "phase", "kind",
                   "begin_ns", "end_ns", "duration_ns", "share", "peer", "unfinished"]
SLACK_COLUMNS = ["iteration", "rank", "kernel", "launch", "block", "warp", "role", "busy_ns", "slack_ns", "on_path"]
PATH_NS_COLUMNS = ["iteration", "rank", "kind", "duration_ns", "share"]
NON_WAIT_KINDS = ("work", "gap", "launch", "host")


@dataclass
class CriticalPath:
    segments: pd.DataFrame
    slack: pd.DataFrame
    total_ns: pd.DataFrame
    pacing_rank: int
    path_ns: pd.DataFrame
    verdict: object = None          # profiler.analysis.verdict.Verdict (the page's headline)
    warnings: tuple = ()            # typed AnalysisWarnings of the graph
    graph: object = field(default=None, repr=False)


def _kind_names(g: G.Graph, pts: np.ndarray) -> np.ndarray:
    k = g.seg_kind[pts].astype(np.int64)
    host_lane = g.lane["host"].to_numpy()[g.pt_lane[pts]]
    k = np.where((k == G.GAP) & host_lane, G.HOST, k)
    k = np.where(k == G.IDLE, G.WAIT, k)
    return np.asarray(G.SEG_KINDS, dtype=object)[k]


def _point_peers(g: G.Graph, pts: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """The rank a wait / barrier segment waited on (-1: none, or its own rank)."""
    own = g.lane["rank"].to_numpy()[g.pt_lane[pts]]
    peer = np.full(len(pts), -1, np.int64)
    waiting = np.isin(kind, ("wait", "barrier"))
    rel = g.binding[pts] & (g.src[pts] >= 0) & waiting
    peer[rel] = g.lane["rank"].to_numpy()[g.pt_lane[g.src[pts[rel]]]]
    own_iv = g.seg_owner[pts]
    rest = waiting & ~rel & (own_iv >= 0)
    peer[rest] = interval_peers(g)[own_iv[rest]]
    return np.where(peer == own, -1, peer)


def _lead_ins(g: G.Graph, pts: np.ndarray, its: np.ndarray, totals: pd.DataFrame) -> pd.DataFrame:
    """Per iteration whose path starts after the iteration began: the late entry of that rank."""
    if len(pts) == 0:
        return pd.DataFrame(columns=SEGMENT_COLUMNS)
    starts = np.r_[0, np.flatnonzero(its[1:] != its[:-1]) + 1]
    p0, it0 = pts[starts], its[starts]
    tot = totals.set_index("iteration")
    b = tot["begin_ns"].reindex(it0).to_numpy()
    late = g.pt_t[p0] > b
    if not late.any():
        return pd.DataFrame(columns=SEGMENT_COLUMNS)
    p0, it0, b = p0[late], it0[late], b[late]
    L = g.lane
    lane0 = g.pt_lane[p0]
    rank0 = L["rank"].to_numpy()[lane0]
    # does the rank have a host lane in that iteration (its host entered late) or only GPU lanes
    hosts = set(zip(L.loc[L["host"], "rank"], L.loc[L["host"], "iteration"]))
    kind = np.array(["host" if (int(r), int(i)) in hosts else "launch" for r, i in zip(rank0, it0)], dtype=object)
    # the rank whose events began the iteration (the one this rank entered after)
    firsts = pd.DataFrame({"it": L["iteration"].to_numpy(), "t": g.pt_t[g.lane_first], "rank": L["rank"].to_numpy()})
    first_rank = firsts.sort_values(["it", "t"], kind="stable").drop_duplicates("it").set_index("it")["rank"]
    peer = first_rank.reindex(it0).to_numpy()
    tt = tot["total_ns"].reindex(it0).to_numpy()
    dur = g.pt_t[p0] - b
    return pd.DataFrame({
        "iteration": it0, "rank": rank0, "kernel": L["kernel"].to_numpy()[lane0],
        "launch": np.where(kind == "host", -1, L["launch"].to_numpy()[lane0]), "block": -1, "warp": -1,
        "role": np.where(kind == "host", "host", L["role"].to_numpy()[lane0]), "phase": "", "kind": kind,
        "begin_ns": b, "end_ns": g.pt_t[p0], "duration_ns": dur,
        "share": np.where(tt > 0, dur / np.where(tt > 0, tt, 1), 0.0),
        "peer": np.where(peer == rank0, -1, peer), "unfinished": False,
    }, columns=SEGMENT_COLUMNS)


def _segments(g: G.Graph, pts: np.ndarray, its: np.ndarray, totals: pd.DataFrame) -> pd.DataFrame:
    pred = predecessors_at(g, pts)
    lead = _lead_ins(g, pts, its, totals)
    has = pred >= 0
    pts, its = pts[has], its[has]
    q = pred[has]
    begin = g.pt_t[q]
    end = g.pt_t[pts]
    keep = end > begin
    pts, its, begin, end = pts[keep], its[keep], begin[keep], end[keep]
    lane = g.lane.iloc[g.pt_lane[pts]]
    kind = _kind_names(g, pts)
    ph = g.seg_phase[pts]
    phase = np.where(ph >= 0, g.phase_names[np.maximum(ph, 0)] if len(g.phase_names) else "", "")
    tot = totals.set_index("iteration")["total_ns"].reindex(its).to_numpy() if len(its) else np.zeros(0)
    dur = end - begin
    # a host lane holds several launches' host spans: name the span's own kernel and launch
    kernel = lane["kernel"].to_numpy().astype(object)
    launch = lane["launch"].to_numpy().copy()
    own = g.seg_owner[pts]
    hs = lane["host"].to_numpy() & (own >= 0)
    kernel[hs] = g.kernel_names[g.iv_kernel[own[hs]]]
    launch[hs] = g.iv_launch[own[hs]]
    seg = pd.DataFrame({
        "iteration": its, "rank": lane["rank"].to_numpy(), "kernel": kernel,
        "launch": launch, "block": lane["block"].to_numpy(), "warp": lane["warp"].to_numpy(),
        "role": lane["role"].to_numpy(), "phase": phase.astype(object), "kind": kind,
        "begin_ns": begin, "end_ns": end, "duration_ns": dur,
        "share": np.where(tot > 0, dur / np.where(tot > 0, tot, 1), 0.0),
        "peer": _point_peers(g, pts, kind),
        "unfinished": g.iv_unfinished[np.maximum(own, 0)] & (own >= 0) if len(g.iv_unfinished) else np.zeros(len(pts), bool),
    }, columns=SEGMENT_COLUMNS)
    if len(lead):
        seg = pd.concat([lead.astype(seg.dtypes.to_dict()), seg], ignore_index=True)
        seg = seg.sort_values(["iteration", "begin_ns"], kind="stable").reset_index(drop=True)
    return seg


def _slack(g: G.Graph, path_lanes: np.ndarray, totals: pd.DataFrame) -> pd.DataFrame:
    L = g.lane
    nl = len(L)
    if nl == 0:
        return pd.DataFrame({c: pd.Series([], dtype="int64") for c in SLACK_COLUMNS})
    busy = LT.points(g).work
    it_end = totals.set_index("iteration")["end_ns"].reindex(L["iteration"].to_numpy()).to_numpy()
    # a lane that ends in a barrier wait is released by others: its end carries no float of its own
    ends_in_barrier = g.seg_kind[g.lane_last] == G.BARRIER
    slack = np.where(ends_in_barrier, np.iinfo(np.int64).max, it_end - g.pt_t[g.lane_last])
    if len(g.occ_arr_pt):
        counts = np.diff(np.r_[g.occ_starts, len(g.occ_arr_pt)])
        last_t = g.pt_t[g.occ_arr_pt[np.r_[g.occ_starts[1:], len(g.occ_arr_pt)] - 1]]
        own_t = g.pt_t[g.occ_arr_pt]
        free = np.repeat(last_t, counts) - own_t
        np.minimum.at(slack, g.pt_lane[g.occ_arr_pt], free)
    on_path = np.zeros(nl, bool)
    on_path[path_lanes] = True
    slack = np.where(on_path, 0, np.maximum(np.where(slack == np.iinfo(np.int64).max, 0, slack), 0))
    out = L[["iteration", "rank", "kernel", "launch", "block", "warp", "role"]].copy()
    out["busy_ns"] = busy
    out["slack_ns"] = slack.astype(np.int64)
    out["on_path"] = on_path
    return out.sort_values(["iteration", "rank", "launch", "block", "warp"], kind="stable").reset_index(drop=True)


def _pacing(segments: pd.DataFrame, totals: pd.DataFrame) -> tuple[int, pd.DataFrame]:
    if segments.empty:
        return -1, pd.DataFrame({c: pd.Series([], dtype="int64") for c in PATH_NS_COLUMNS})
    path_ns = segments.groupby(["iteration", "rank", "kind"], sort=True, observed=True)["duration_ns"].sum().reset_index()
    tot = totals.set_index("iteration")["total_ns"].reindex(path_ns["iteration"]).to_numpy()
    path_ns["share"] = np.where(tot > 0, path_ns["duration_ns"] / np.where(tot > 0, tot, 1), 0.0)
    nw = segments[segments["kind"].isin(NON_WAIT_KINDS)]
    by_rank = (nw if not nw.empty else segments).groupby("rank")["duration_ns"].sum()
    return int(by_rank.idxmax()), path_ns[PATH_NS_COLUMNS]


def from_graph(g: G.Graph, iteration=None, *, verdict: bool = True) -> CriticalPath:
    iterations = None if iteration is None else set(np.atleast_1d(iteration).tolist())
    totals = iteration_totals(g)
    if iterations is not None:
        totals = totals[totals["iteration"].isin(iterations)].reset_index(drop=True)
    pts, its = path_points(g, iterations)
    seg = _segments(g, pts, its, totals)
    path_lanes = np.unique(g.pt_lane[pts]) if len(pts) else np.zeros(0, np.int64)
    slack = _slack(g, path_lanes, iteration_totals(g))
    if iterations is not None:
        slack = slack[slack["iteration"].isin(iterations)].reset_index(drop=True)
    pacing, path_ns = _pacing(seg, totals)
    cp = CriticalPath(segments=seg, slack=slack, total_ns=totals, pacing_rank=pacing, path_ns=path_ns,
                      warnings=g.warnings, graph=g)
    if verdict:
        cp.verdict = _headline(cp)
    return cp


def critical_path(events: pd.DataFrame, *, iteration=None, registry=None, launches=None) -> CriticalPath:
    """Longest dependency chain to the end of each iteration (columns: package docstring).

    iteration: an int or a list of ints to restrict the report to; None = every iteration.
    launches: the run's launch table (where timed-out kernels stopped; see graph.build).
    """
    return from_graph(G.build(events, registry, launches), iteration)
