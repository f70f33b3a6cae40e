"""What-if: re-time the dependency graph with one phase made faster (columns: package docstring).

The re-timing solves the graph's recurrence (profiler.analysis.retime) with the chosen
phase's segments shortened: every point moves to max(own previous point + segment time, its
cross dependency's new time + the recorded latency). Waits therefore shrink only as far as the
new release allows, and a barrier departs after whichever arrival is now the last. Releases keep
their recorded pairing (the wait is tied to the same release record as before).

Invariant (tests/analysis/test_properties.py): the projected saving of an iteration never exceeds
the phase's own time on that iteration's recorded critical path (`path_phase_ns`): the recorded
path is still a chain of the re-timed graph, shorter only by its own shortened segments, and the
new iteration lasts at least as long as that chain.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import graph as G
from .critical_path import CriticalPath, critical_path, from_graph, iteration_totals
from .retime import retime
from .timemodel import op_latency

SUMMARY_COLUMNS = ["iteration", "before_ns", "after_ns", "change_ns", "change_pct", "local_saving_ns", "absorbed_pct",
                   "path_phase_ns", "op_before_ns", "op_after_ns", "op_change_ns", "op_change_pct"]


@dataclass
class WhatIf:
    summary: pd.DataFrame
    new_path: CriticalPath | None    # None when asked for without it (what_if(new_path=False))
    retimed: pd.DataFrame | None     # None when asked for without it (keep_retimed=False)


def _target_points(g: G.Graph, phase: str, rank) -> np.ndarray:
    kernel = None
    if "/" in phase:
        kernel, phase = phase.split("/", 1)
    codes = np.flatnonzero(g.phase_names == phase)
    P = g.n_points
    is_first = np.zeros(P, bool)
    is_first[g.lane_first[g.lane_first < P]] = True
    sel = np.isin(g.seg_phase, codes) & ~is_first & np.isin(g.seg_kind, (G.WORK, G.WAIT, G.IDLE, G.HOST))
    if kernel is not None:
        sel &= (g.lane["kernel"].to_numpy() == kernel)[g.pt_lane]
    if rank is not None:
        ranks = np.atleast_1d(rank).astype(np.int64)
        sel &= np.isin(g.lane["rank"].to_numpy()[g.pt_lane], ranks)
    return np.flatnonzero(sel)


def _path_phase_time(cp: CriticalPath, phase: str, rank) -> pd.Series:
    """Per iteration: the phase's own time on the recorded critical path (on `rank` if given)."""
    seg = cp.segments
    kernel, name = (phase.split("/", 1) if "/" in phase else (None, phase))
    sel = (seg["phase"] == name) & seg["kind"].isin(["work", "wait", "host"])
    if kernel is not None:
        sel &= seg["kernel"] == kernel
    if rank is not None:
        sel &= seg["rank"].isin(np.atleast_1d(rank))
    return seg[sel].groupby("iteration")["duration_ns"].sum()


def what_if(events: pd.DataFrame, *, phase: str, speedup: float, rank=None, iteration=None,
            registry=None, launches=None, graph: G.Graph | None = None, new_path: bool = True,
            missing_ok: bool = False, keep_retimed: bool = True, path: CriticalPath | None = None) -> WhatIf:
    """Projected end-to-end change when `phase` gets `speedup` faster (columns: package docstring).

    phase: a phase name, or 'kernel/phase' to pick one kernel's phase. speedup: 0.2 = 20% faster;
    must be < 1. rank: an int, a list of ints, or None for every rank. iteration: an int or a
    list: only these iterations get the faster phase and are re-timed and reported (iterations
    are independent in the graph, so the answer for them is the same as for the whole run).
    launches: where timed-out kernels stopped (graph.build). graph: the graph already built from
    these events, registry and launches (CriticalPath.graph) to re-time instead of building it
    again. new_path=False: no critical path of the re-timed run (new_path is None), for a caller
    that shows the summary only: that path and its verdict were 85 % of a what-if's CPU time
    (cProfile, 270 k-event synthetic run). missing_ok: a table without the phase is re-timed
    unchanged instead of refused (a chunk of a run whose other chunks have it: chunked.py).
    keep_retimed=False (with new_path=False): no re-timed copy of the table (.retimed is None),
    for a caller that reads the summary only (a copy of the events: 0.5 GB at 10 M events).
    path: the events' recorded critical path, when the caller has it (chunked.py passes the whole
    run's; path_phase_ns reads its reported iterations), instead of walking the graph again.
    """
    if not speedup < 1:
        raise ValueError(f"what_if: speedup must be < 1 (a fraction of the phase's time), got {speedup}")
    g = G.build(events, registry, launches) if graph is None else graph
    events = g.events           # unfinished waits closed: the rows re-timed below
    name = phase.split("/", 1)[-1]
    if len(events) and name not in set(g.phase_names) and not missing_ok:
        raise ValueError(f"what_if: the run records no phase {name!r}")
    tgt = _target_points(g, phase, rank)
    if iteration is not None:
        # iterations are independent: shorten and re-time only the chosen ones
        its = np.atleast_1d(iteration)
        tgt = tgt[np.isin(g.lane["iteration"].to_numpy()[g.pt_lane[tgt]], its)]
    d_new = g.d.copy()
    d_new[tgt] = np.round(g.d[tgt] * (1.0 - speedup)).astype(np.int64)
    T = retime(g, d_new, iterations=iteration)

    retimed = events.copy() if keep_retimed or new_path else None
    if retimed is not None and len(events):
        retimed["begin_ns"] = T[g.row_pb]
        retimed["end_ns"] = T[g.row_pe]

    before = iteration_totals(g)
    it_of_pt = g.lane["iteration"].to_numpy()[g.pt_lane]
    after = iteration_totals(g, T).set_index("iteration")["total_ns"]
    # local saving: what the chosen phase's shortening removes from one warp's own timeline (the
    # largest over warps of a launch), i.e. how much sooner the rank would finish on its own;
    # summing over warps that run in parallel would overstate it
    # (kernels of a rank run one after another: per rank, the launches' savings add up)
    lanes = g.lane.iloc[g.pt_lane[tgt]]
    per_lane = pd.DataFrame({"it": it_of_pt[tgt], "rank": lanes["rank"].to_numpy(), "launch": lanes["launch"].to_numpy(),
                             "lane": g.pt_lane[tgt], "s": g.d[tgt] - d_new[tgt]})
    saving = (per_lane.groupby(["it", "rank", "launch", "lane"])["s"].sum()
              .groupby(level=[0, 1, 2]).max().groupby(level=[0, 1]).sum().groupby(level=0).max())
    s = before[["iteration", "total_ns"]].rename(columns={"total_ns": "before_ns"})
    s["after_ns"] = after.reindex(s["iteration"]).to_numpy().astype(np.int64)
    s["change_ns"] = s["after_ns"] - s["before_ns"]
    s["change_pct"] = np.where(s["before_ns"] > 0, 100.0 * s["change_ns"] / s["before_ns"].where(s["before_ns"] > 0, 1), 0.0)
    s["local_saving_ns"] = saving.reindex(s["iteration"]).fillna(0).to_numpy().astype(np.int64)
    ls = s["local_saving_ns"].to_numpy().astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        s["absorbed_pct"] = np.where(ls != 0, 100.0 * (1.0 - (-s["change_ns"].to_numpy()) / ls), np.nan)
    # the op's own time (profiler.analysis.timemodel: op latency after entry), recorded and re-timed:
    # the quantity the idle page's "costs the op" and Compare's kernel rows state
    ob = op_latency(g, g.pt_t).set_index("iteration")["op_latency_ns"].reindex(s["iteration"]).to_numpy(float)
    oa = op_latency(g, T).set_index("iteration")["op_latency_ns"].reindex(s["iteration"]).to_numpy(float)
    s["op_before_ns"], s["op_after_ns"], s["op_change_ns"] = ob, oa, oa - ob
    with np.errstate(divide="ignore", invalid="ignore"):
        s["op_change_pct"] = np.where(ob > 0, 100.0 * (oa - ob) / ob, np.nan)
    if iteration is not None:
        s = s[s["iteration"].isin(np.atleast_1d(iteration))]
    # iterations are independent in the graph: the new path of some needs only their rows
    if new_path:
        sub = retimed if iteration is None else retimed[retimed["iteration"].isin(np.atleast_1d(iteration))]
        # the re-timed run's path (its verdict is not computed: what-if reports the change, not a cause)
        new_path = from_graph(G.build(sub, registry), iteration, verdict=False)
    else:
        new_path = None
    cp = from_graph(g, iteration, verdict=False) if path is None else path
    s["path_phase_ns"] = _path_phase_time(cp, phase, rank).reindex(s["iteration"]).fillna(0).to_numpy().astype(np.int64)
    return WhatIf(summary=s[SUMMARY_COLUMNS].reset_index(drop=True), new_path=new_path, retimed=retimed)


BOUND_COLUMNS = ["iteration", "path_phase_ns", "max_saving_ns"]


def saving_bound(cp: CriticalPath, *, phase: str, speedup: float, rank=None) -> pd.DataFrame:
    """The what-if's first answer, from the critical path alone (no re-timing: instant at any size):
    per iteration, the most that making `phase` (on `rank`) `speedup` faster can shorten the
    iteration. The recorded path stays a chain of dependencies after the change, only its own
    segments of that phase shorter, so the iteration stays at least its old length minus
    speedup x the phase's time on the path: max_saving_ns = speedup * path_phase_ns (what_if's
    path_phase_ns; rounding aside, what_if's -change_ns never exceeds it). A rendezvous can
    absorb any part of it; the exact answer is what_if's. Only for speedup > 0 (a faster phase)."""
    if not 0 < speedup < 1:
        raise ValueError(f"saving_bound: speedup must be in (0, 1), got {speedup}")
    it = cp.total_ns["iteration"].to_numpy()
    pp = _path_phase_time(cp, phase, rank).reindex(it).fillna(0).to_numpy().astype(np.int64)
    return pd.DataFrame({"iteration": it.astype(np.int64), "path_phase_ns": pp,
                         "max_saving_ns": np.ceil(speedup * pp).astype(np.int64)}, columns=BOUND_COLUMNS)
