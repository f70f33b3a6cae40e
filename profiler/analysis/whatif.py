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

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import graph as G
from . import retime_fast
from . import spill
from .critical_path import CriticalPath, critical_path, from_graph
from .path_walk import _iteration_totals
from .retime import RetimeInput, _narrow, retime, retime_input
from .timemodel import op_latency, time_model

SUMMARY_COLUMNS = ["iteration", "before_ns", "after_ns", "change_ns", "change_pct", "local_saving_ns", "absorbed_pct",
                   "path_phase_ns", "op_before_ns", "op_after_ns", "op_change_ns", "op_change_pct"]


@dataclass
class WhatIf:
    summary: pd.DataFrame
    new_path: CriticalPath | None    # None when asked for without it (what_if(new_path=False))
    retimed: pd.DataFrame | None     # None when asked for without it (keep_retimed=False)


def _eligible(g: G.Graph) -> np.ndarray:
    """Points whose incoming segment a what-if can shorten: a phase's work, wait, idle or host
    time, never a lane's first (the launch pseudo-segment)."""
    P = g.n_points
    is_first = np.zeros(P, bool)
    is_first[g.lane_first[g.lane_first < P]] = True
    return ~is_first & G.kind_mask(g.seg_kind, (G.WORK, G.WAIT, G.IDLE, G.HOST))


def _segments(g: G.Graph) -> tuple[np.ndarray, ...]:
    """(point, duration, phase, lane) of the segments a what-if can shorten that have a phase, each
    narrowed (retime._narrow): retime_fast's one pass where it runs, else numpy's."""
    if g.n_points and retime_fast.enabled():
        kinds = np.zeros(len(G.SEG_KINDS), bool)
        kinds[[G.WORK, G.WAIT, G.IDLE, G.HOST]] = True
        got = retime_fast.segments(g, kinds)
        if got is not None:
            return got
    el = np.flatnonzero(_eligible(g) & (g.seg_phase >= 0))
    return _narrow(el), _narrow(g.d[el]), _narrow(g.seg_phase[el].astype(np.int64)), _narrow(g.pt_lane[el])


def _chosen(phase_names: np.ndarray, lane: pd.DataFrame, phase: str, rank) -> tuple[np.ndarray, np.ndarray]:
    """(phase codes, per lane: of the kernel and ranks asked for) of `phase` ('kernel/phase')."""
    kernel = None
    if "/" in phase:
        kernel, phase = phase.split("/", 1)
    codes = np.flatnonzero(phase_names == phase)
    ok = np.ones(len(lane), bool)
    if kernel is not None:
        ok &= lane["kernel"].to_numpy() == kernel
    if rank is not None:
        ok &= np.isin(lane["rank"].to_numpy(), np.atleast_1d(rank).astype(np.int64))
    return codes, ok


def _is_code(a: np.ndarray, codes: np.ndarray, n: int) -> np.ndarray:
    """np.isin(a, codes) for codes of n phase names: a look-up where a's values are codes (isin
    sorted 1.57 M segments a chunk of a 10 M-event run: 8 ms of a what-if's ~100)."""
    if len(a) and a.dtype.kind == "i" and int(a.min()) >= 0 and int(a.max()) < n:
        lut = np.zeros(n, bool)
        lut[codes] = True
        return lut[a]
    return np.isin(a, codes)


def _target_points(g: G.Graph, phase: str, rank) -> np.ndarray:
    codes, lane_ok = _chosen(g.phase_names, g.lane, phase, rank)
    return np.flatnonzero(np.isin(g.seg_phase, codes) & _eligible(g) & lane_ok[g.pt_lane])


@dataclass
class LaneEnds:
    """The part of a graph that iteration_totals and op_latency read (its lanes' first and last
    points: here numbered 0..L-1 and L..2L-1), for times given at those points only."""
    lane: pd.DataFrame
    n_points: int                # the graph's (0: a graph without points)
    derived: dict                # {"time_model": the run's time model}

    @property
    def lane_first(self) -> np.ndarray:
        return np.arange(len(self.lane))

    @property
    def lane_last(self) -> np.ndarray:
        return np.arange(len(self.lane), 2 * len(self.lane))


# What to_arrays packs (the what-if inputs stored with a run: 61 MB a 2.5 M-event chunk as is, issue 31).
# Measured on chunk 0 of the 10 M-event synthetic run (755 k targets, 1.57 M segments, 4112 lanes):
# only barrier departures carry an occurrence and its latency (8.2 k targets), only a lane's first
# point after a previous launch a group and its latency (4.1 k), a lane's first (4.1 k) or fixed (8)
# points are few and targets without a cross source (8.2 k): 3 MB int32 or 0.75 MB bool each, some
# 0.1 MB as positions and values. The segments come sorted by point, so by lane: seg_lane is 4112
# runs (6.3 MB int32 -> 33 kB). Their phase codes are under a dozen (int8) and durations under 32 us
# (int16: 4344 ns the longest); the durations are read as stored (summary casts those it selects),
# the phase codes back to the lanes' dtype (retime_fast.select takes both of one dtype, int32 or int64:
# 3.6 ms a chunk against numpy's 8.5). 61 -> 33 MB a chunk in all.
# spill.sparse and spill.runs keep the array as it is where packing it would not be smaller.
PACKED_SPARSE = {"retime.occ_of_t": -1, "retime.lat_bw": 0, "retime.grp_of_t": -1, "retime.lat_pf": 0,
                 "retime.first": False, "retime.fixed": False, "retime.has_src": True}
NARROW = ("seg_phase", "seg_d")


@dataclass
class WhatIfInput:
    """What the what-if summary of one graph needs, kept without the graph (chunked.py keeps one
    per chunk for the idle page's balancing what-if; 61 MB for a 2.5 M-event chunk of 2.4 M
    points): its re-timing input (answering for the lanes' ends), the lanes, and the segments a
    what-if can shorten (point, duration, phase, lane)."""
    retime: RetimeInput
    ends: LaneEnds
    lane_t: np.ndarray           # recorded times at the lanes' first then last points
    phase_names: np.ndarray
    seg_pt: np.ndarray
    seg_d: np.ndarray
    seg_phase: np.ndarray
    seg_lane: np.ndarray

    @classmethod
    def from_graph(cls, g: G.Graph, time_model) -> "WhatIfInput":
        out = np.concatenate([g.lane_first, g.lane_last]) if g.n_points else np.zeros(0, np.int64)
        seg = _segments(g)
        return cls(retime=retime_input(g, out), ends=LaneEnds(g.lane, g.n_points, {"time_model": time_model}),
                   lane_t=g.pt_t[out], phase_names=g.phase_names, seg_pt=seg[0], seg_d=seg[1], seg_phase=seg[2],
                   seg_lane=seg[3])

    @property
    def nbytes(self) -> int:
        return self.retime.nbytes + sum(a.nbytes for a in (self.lane_t, self.seg_pt, self.seg_d, self.seg_phase,
                                                           self.seg_lane))

    def to_arrays(self) -> dict:
        """Every field as a named array (profiler.analysis.spill writes them as one file of arrays, no pickle):
        the re-timing input's under `retime.`, the lanes' columns the summary reads under `lane.`; the
        fields of mostly one value packed (PACKED_SPARSE, seg_lane's runs: spill.Sparse, spill.Runs),
        the segments' phases and durations in the narrowest dtype of their values (NARROW)."""
        out = {f"retime.{k}": v for k, v in vars(self.retime).items()}
        lane = self.ends.lane
        kernel = pd.Categorical(lane["kernel"].astype(str))
        out.update({"lane.rank": lane["rank"].to_numpy(), "lane.launch": lane["launch"].to_numpy(),
                    "lane.iteration": lane["iteration"].to_numpy(), "lane.host": lane["host"].to_numpy(bool),
                    "lane.kernel": kernel.codes.astype(np.int32),
                    "lane.kernel_names": np.asarray([str(k) for k in kernel.categories], dtype=str),
                    "n_points": np.asarray(self.ends.n_points, np.int64), "lane_t": self.lane_t,
                    "phase_names": np.asarray([str(p) for p in self.phase_names], dtype=str),
                    "seg_pt": self.seg_pt, "seg_d": self.seg_d, "seg_phase": self.seg_phase, "seg_lane": self.seg_lane})
        out["seg_lane"] = spill.runs(self.seg_lane)
        out.update({k: spill.sparse(out[k], fill) for k, fill in PACKED_SPARSE.items()})
        out.update({k: spill.narrowest(out[k]) for k in NARROW})
        return out

    @classmethod
    def from_arrays(cls, a: dict, time_model) -> "WhatIfInput":
        """The input to_arrays wrote, answering with the run's time model (what op_latency reads):
        a's packed arrays expanded (spill.read does; a dict of to_arrays as it is too), the phase
        codes stored narrower (NARROW) read in the lanes' dtype, the durations as they are. A file
        of the layout before issue 31's packing (every field as is, spill version 1) reads the same."""
        a = {k: spill.expand(v) for k, v in a.items()}
        if a["seg_phase"].dtype.itemsize < a["seg_lane"].dtype.itemsize:
            a["seg_phase"] = a["seg_phase"].astype(a["seg_lane"].dtype)
        rt = RetimeInput(**{f.name: a[f"retime.{f.name}"] for f in dataclasses.fields(RetimeInput)})
        ends, lane_t = _lanes_of_arrays(a, time_model)
        return cls(retime=rt, ends=ends, lane_t=lane_t, phase_names=np.asarray(a["phase_names"]).astype(object),
                   seg_pt=a["seg_pt"], seg_d=a["seg_d"], seg_phase=a["seg_phase"], seg_lane=a["seg_lane"])

    @staticmethod
    def recorded_from_arrays(a: dict, time_model) -> pd.DataFrame:
        """recorded() of the input to_arrays wrote, from its lanes alone (a packed array, as
        spill.read(..., packed=True) gives it, is not expanded)."""
        return recorded(*_lanes_of_arrays(a, time_model))

    def summary(self, *, phase: str, speedup: float, rank, path: CriticalPath,
                rec: pd.DataFrame | None = None) -> pd.DataFrame:
        """what_if(...).summary of the graph this was made from (its iterations all re-timed);
        rec: recorded(self.ends, self.lane_t), when kept."""
        if not speedup < 1:
            raise ValueError(f"what_if: speedup must be < 1 (a fraction of the phase's time), got {speedup}")
        codes, lane_ok = _chosen(self.phase_names, self.ends.lane, phase, rank)
        sel = None
        if retime_fast.enabled():
            lut = np.zeros(len(self.phase_names), bool)
            lut[codes] = True
            sel = retime_fast.select(self.seg_phase, self.seg_lane, lut, lane_ok)
        if sel is None:
            sel = np.flatnonzero(_is_code(self.seg_phase, codes, len(self.phase_names)) & lane_ok[self.seg_lane])
        d = self.seg_d[sel].astype(np.int64)
        shorter = d - np.round(d * (1.0 - speedup)).astype(np.int64)
        after = self.retime.solve(self.seg_pt[sel].astype(np.int64), shorter)
        return _summary(self.ends, self.lane_t, after, self.seg_lane[sel].astype(np.int64), shorter,
                        path, phase, rank, None, rec)

    def recorded(self) -> pd.DataFrame:
        return recorded(self.ends, self.lane_t)


def _lanes_of_arrays(a: dict, time_model) -> tuple[LaneEnds, np.ndarray]:
    """(the lanes, their ends' recorded times) of the input to_arrays wrote."""
    names = [str(k) for k in a["lane.kernel_names"]]
    lane = pd.DataFrame({"rank": a["lane.rank"], "kernel": pd.Categorical.from_codes(a["lane.kernel"], names),
                         "launch": a["lane.launch"], "iteration": a["lane.iteration"], "host": a["lane.host"]})
    return LaneEnds(lane, int(a["n_points"]), {"time_model": time_model}), a["lane_t"]


RECORDED_COLUMNS = ["iteration", "before_ns", "op_before_ns"]


def recorded(ends: LaneEnds, before_t: np.ndarray) -> pd.DataFrame:
    """Per iteration of a graph's lanes, what a what-if's summary compares against (RECORDED_COLUMNS):
    its recorded length and op latency after entry, at the lanes' recorded end times. The same for
    every what-if of the graph: a stored run keeps them per chunk (chunked.py, stored.py) instead of
    computing them again for each question."""
    before = _iteration_totals(ends, before_t)
    ob = op_latency(ends, before_t).set_index("iteration")["op_latency_ns"].reindex(before["iteration"]).to_numpy(float)
    return pd.DataFrame({"iteration": before["iteration"].to_numpy(np.int64),
                         "before_ns": before["total_ns"].to_numpy(np.int64), "op_before_ns": ob})


def _summary(ends: LaneEnds, before_t: np.ndarray, after_t: np.ndarray, tgt_lane: np.ndarray, shorter: np.ndarray,
             cp: CriticalPath, phase: str, rank, iteration, rec: pd.DataFrame | None = None) -> pd.DataFrame:
    """The what-if's summary (columns SUMMARY_COLUMNS) from the times of the lanes' ends before and
    after, and the shortened segments' lanes and shortening. rec: recorded(ends, before_t) when
    the caller kept it."""
    rec = recorded(ends, before_t) if rec is None else rec
    after = _iteration_totals(ends, after_t).set_index("iteration")["total_ns"]
    s = pd.DataFrame({"iteration": rec["iteration"].to_numpy(np.int64), "before_ns": rec["before_ns"].to_numpy(np.int64)})
    s["after_ns"] = after.reindex(s["iteration"]).to_numpy().astype(np.int64)
    s["change_ns"] = s["after_ns"] - s["before_ns"]
    s["change_pct"] = np.where(s["before_ns"] > 0, 100.0 * s["change_ns"] / s["before_ns"].where(s["before_ns"] > 0, 1), 0.0)
    s["local_saving_ns"] = _local_saving(ends.lane, tgt_lane, shorter, s["iteration"].to_numpy())
    ls = s["local_saving_ns"].to_numpy().astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        s["absorbed_pct"] = np.where(ls != 0, 100.0 * (1.0 - (-s["change_ns"].to_numpy()) / ls), np.nan)
    # the op's own time (profiler.analysis.timemodel: op latency after entry), recorded and re-timed:
    # the quantity the idle page's "costs the op" and Compare's kernel rows state
    ob = rec["op_before_ns"].to_numpy(float)
    oa = op_latency(ends, after_t).set_index("iteration")["op_latency_ns"].reindex(s["iteration"]).to_numpy(float)
    s["op_before_ns"], s["op_after_ns"], s["op_change_ns"] = ob, oa, oa - ob
    with np.errstate(divide="ignore", invalid="ignore"):
        s["op_change_pct"] = np.where(ob > 0, 100.0 * (oa - ob) / ob, np.nan)
    if iteration is not None:
        s = s[s["iteration"].isin(np.atleast_1d(iteration))]
    s["path_phase_ns"] = _path_phase_time(cp, phase, rank).reindex(s["iteration"]).fillna(0).to_numpy().astype(np.int64)
    return s[SUMMARY_COLUMNS].reset_index(drop=True)


def _local_saving(lane: pd.DataFrame, tgt_lane: np.ndarray, shorter: np.ndarray, iterations: np.ndarray) -> np.ndarray:
    """Per iteration of `iterations` (int64, 0 where none): what the chosen phase's shortening removes
    from one warp's own timeline (the largest over warps of a launch), i.e. how much sooner the rank
    would finish on its own; summing over warps that run in parallel would overstate it (kernels of a
    rank run one after another: per rank, the launches' savings add up), then the largest over ranks.
    Sorted reductions over the touched lanes (a lane is of one iteration, rank and launch), where four
    pandas group-bys over the shortened segments took 4 of a chunk's 8 ms of _summary."""
    out = np.zeros(len(iterations), np.int64)
    if not len(tgt_lane):
        return out
    lanes, inv = np.unique(tgt_lane, return_inverse=True)
    per = np.zeros(len(lanes), np.int64)
    np.add.at(per, inv.reshape(-1), np.asarray(shorter, np.int64))     # per lane: its segments' sum
    keys = [lane[c].to_numpy()[lanes] for c in ("iteration", "rank", "launch")]
    o = np.lexsort(keys[::-1])
    keys, per = [k[o] for k in keys], per[o]
    for depth, red in ((3, np.maximum), (2, np.add), (1, np.maximum)):   # max per launch, sum per rank, max
        same = np.zeros(len(per), bool)      # as the previous lane's group (never the first)
        same[1:] = True
        for k in keys[:depth]:
            same[1:] &= k[1:] == k[:-1]
        starts = np.flatnonzero(~same)
        per = red.reduceat(per, starts)
        keys = [k[starts] for k in keys]
    pos = np.searchsorted(keys[0], iterations)
    found = pos < len(keys[0])
    found[found] = keys[0][pos[found]] == iterations[found]
    out[found] = per[pos[found]]
    return out


def _path_phase_time(cp: CriticalPath, phase: str, rank) -> pd.Series:
    """Per iteration: the phase's own time on the recorded critical path (on `rank` if given).
    Kept on the path per (phase, rank): a run's what-if re-times chunk by chunk against the one
    path of the whole run, and each chunk's summary asked for the same sums (a group-by of every
    path segment of the run, once per chunk: 50 times a what-if at 100 M events, issue 31). The
    path's segments are never changed once made."""
    key = (phase, None if rank is None else tuple(int(r) for r in np.atleast_1d(rank)))
    kept = cp.__dict__.setdefault("_phase_time", {})
    if key not in kept:
        kept[key] = _path_phase_time_of(cp.segments, phase, rank)
    return kept[key]


def _path_phase_time_of(seg: pd.DataFrame, phase: str, rank) -> pd.Series:
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

    # iterations are independent in the graph: the new path of some needs only their rows
    if new_path:
        sub = retimed if iteration is None else retimed[retimed["iteration"].isin(np.atleast_1d(iteration))]
        # the re-timed run's path (its verdict is not computed: what-if reports the change, not a cause)
        new_path = from_graph(G.build(sub, registry), iteration, verdict=False)
    else:
        new_path = None
    cp = from_graph(g, iteration, verdict=False) if path is None else path
    ends = LaneEnds(g.lane, g.n_points, {"time_model": time_model(g)})
    lf_ll = np.concatenate([g.lane_first, g.lane_last]) if g.n_points else np.zeros(0, np.int64)
    s = _summary(ends, g.pt_t[lf_ll], T[lf_ll], g.pt_lane[tgt], g.d[tgt] - d_new[tgt], cp, phase, rank, iteration)
    return WhatIf(summary=s, new_path=new_path, retimed=retimed)


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
