"""Barrier contention (the returned columns are documented in the package docstring).

An occurrence is the set of arrivals of one barrier with one occurrence number (the payload) in
one scope: the block (scope 'block'), the launch on one rank ('grid'), or every rank of the
same kernel and iteration ('rank'). An arrival is "useless" when the arriving warp had no busy
time since its previous barrier departure (or its start): it only came to be released.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import graph as G

OCC_COLUMNS = ["rank", "kernel", "iteration", "launch", "block", "barrier", "scope", "occurrence", "arrivals",
               "useless_arrivals", "first_arrive_ns", "last_arrive_ns", "spread_ns", "depart_ns", "total_wait_ns",
               "last_rank", "last_block", "last_warp"]
SUMMARY_COLUMNS = ["rank", "kernel", "barrier", "scope", "occurrences", "arrivals", "useless_arrivals", "useless_share",
                   "mean_spread_ns", "max_spread_ns", "total_wait_ns", "last_rank", "last_block", "last_warp",
                   "last_share"]
PER_RANK_COLUMNS = ["kernel", "barrier", "rank", "occurrences", "times_last", "last_share", "mean_lateness_ns",
                    "total_wait_ns"]


@dataclass
class BarrierReport:
    occurrences: pd.DataFrame
    summary: pd.DataFrame
    per_rank: pd.DataFrame


def _empty(cols):
    return pd.DataFrame({c: pd.Series([], dtype="object") for c in cols})


def arrivals(g: G.Graph) -> pd.DataFrame:
    """One row per barrier arrival: occurrence id, lane, times, own wait, usefulness."""
    rows = g.occ_arr_row
    pa = g.occ_arr_pt
    n = len(rows)
    counts = np.diff(np.r_[g.occ_starts, n])
    occ = np.repeat(np.arange(len(g.occ_starts)), counts)
    lane = g.pt_lane[pa]
    # own departure: the barrier wait that starts at this arrival row
    dep_t = np.full(n, -1, np.int64)
    if len(g.bw_arr_row):
        pos = pd.Index(rows).get_indexer(g.bw_arr_row)
        ok = pos >= 0
        dep_t[pos[ok]] = g.pt_t[g.bw_end_pt[ok]]
    own_wait = np.where(dep_t >= 0, dep_t - g.pt_t[pa], 0)
    # busy time since the lane's previous barrier departure (or the lane start)
    cum = G.cum_work(g)
    dep_pts = np.sort(g.bw_end_pt)
    k = np.searchsorted(dep_pts, pa, side="left") - 1
    prev = np.where(k >= 0, dep_pts[np.maximum(k, 0)], -1) if len(dep_pts) else np.full(len(pa), -1)
    start = g.lane_first[lane]
    prev = np.where((prev >= start) & (prev < pa), prev, start)
    busy_since = cum[pa] - cum[prev]
    return pd.DataFrame({"occ": occ, "row": rows, "lane": lane, "t": g.pt_t[pa], "depart_ns": dep_t,
                         "wait_ns": own_wait, "useless": busy_since == 0})


def barrier_contention(events: pd.DataFrame, *, registry=None) -> BarrierReport:
    """Per barrier occurrence: arrivals, useless arrivals, spread, wait, last arriver (columns: package docstring)."""
    g = G.build(events, registry)
    if len(g.occ_arr_row) == 0:
        return BarrierReport(_empty(OCC_COLUMNS), _empty(SUMMARY_COLUMNS), _empty(PER_RANK_COLUMNS))
    a = arrivals(g)
    L = g.lane
    a["rank"] = L["rank"].to_numpy()[a["lane"].to_numpy()]
    a["block"] = L["block"].to_numpy()[a["lane"].to_numpy()]
    a["warp"] = L["warp"].to_numpy()[a["lane"].to_numpy()]
    starts = g.occ_starts
    ends = np.r_[starts[1:], len(a)] - 1                # arrivals are sorted by time within an occurrence
    first_row = a["row"].to_numpy()[starts]
    ev = events.iloc[first_row]      # the first arrival row of each occurrence (a few rows)
    barrier = ev["phase"].astype(str).to_numpy()
    scope = np.array([g.sem.scope(b) for b in barrier], dtype=object)
    cross = scope == "rank"
    grp = a.groupby("occ", sort=True)
    occ = pd.DataFrame({
        "rank": np.where(cross, -1, a["rank"].to_numpy()[starts]),
        "kernel": ev["kernel"].astype(str).to_numpy(),
        "iteration": ev["iteration"].to_numpy().astype(np.int64),
        "launch": np.where(cross, -1, ev["launch"].to_numpy().astype(np.int64)),
        "block": np.where(scope == "block", a["block"].to_numpy()[starts], -1),
        "barrier": barrier, "scope": scope,
        "occurrence": ev["payload"].to_numpy().astype(np.int64),
        "arrivals": np.diff(np.r_[starts, len(a)]),
        "useless_arrivals": grp["useless"].sum().to_numpy().astype(np.int64),
        "first_arrive_ns": a["t"].to_numpy()[starts],
        "last_arrive_ns": a["t"].to_numpy()[ends],
        "depart_ns": grp["depart_ns"].max().to_numpy(),
        "total_wait_ns": grp["wait_ns"].sum().to_numpy().astype(np.int64),
        "last_rank": a["rank"].to_numpy()[ends], "last_block": a["block"].to_numpy()[ends],
        "last_warp": a["warp"].to_numpy()[ends],
    })
    occ["spread_ns"] = occ["last_arrive_ns"] - occ["first_arrive_ns"]
    occ = occ[OCC_COLUMNS]

    keys = ["rank", "kernel", "barrier"]
    sm = occ.groupby(keys, sort=True).agg(
        scope=("scope", "first"), occurrences=("occurrence", "size"), arrivals=("arrivals", "sum"),
        useless_arrivals=("useless_arrivals", "sum"), mean_spread_ns=("spread_ns", "mean"),
        max_spread_ns=("spread_ns", "max"), total_wait_ns=("total_wait_ns", "sum")).reset_index()
    sm["useless_share"] = sm["useless_arrivals"] / sm["arrivals"].where(sm["arrivals"] > 0, 1)
    top = (occ.groupby(keys + ["last_rank", "last_block", "last_warp"], sort=True).size().rename("n").reset_index()
           .sort_values(keys + ["n"], ascending=[True, True, True, False], kind="stable").drop_duplicates(keys))
    sm = sm.merge(top, on=keys, how="left")
    sm["last_share"] = sm["n"] / sm["occurrences"]
    summary = sm[SUMMARY_COLUMNS]

    # cross-rank barriers: per rank
    cross_occ = np.flatnonzero(cross)
    if len(cross_occ):
        ac = a[np.isin(a["occ"].to_numpy(), cross_occ)]
        per = ac.groupby(["occ", "rank"], sort=True).agg(last_t=("t", "max"), wait=("wait_ns", "sum")).reset_index()
        o = occ.iloc[per["occ"].to_numpy()]
        per["kernel"] = o["kernel"].to_numpy()
        per["barrier"] = o["barrier"].to_numpy()
        per["late"] = per["last_t"].to_numpy() - o["first_arrive_ns"].to_numpy()
        per["is_last"] = per["rank"].to_numpy() == o["last_rank"].to_numpy()
        pr = per.groupby(["kernel", "barrier", "rank"], sort=True).agg(
            occurrences=("occ", "size"), times_last=("is_last", "sum"), mean_lateness_ns=("late", "mean"),
            total_wait_ns=("wait", "sum")).reset_index()
        pr["times_last"] = pr["times_last"].astype(np.int64)
        pr["last_share"] = pr["times_last"] / pr["occurrences"]
        per_rank = pr[PER_RANK_COLUMNS]
    else:
        per_rank = _empty(PER_RANK_COLUMNS)
    return BarrierReport(occurrences=occ.reset_index(drop=True), summary=summary.reset_index(drop=True),
                         per_rank=per_rank.reset_index(drop=True))
