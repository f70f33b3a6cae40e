"""Per-lane totals of a graph's points and intervals, computed once and shared by the tables.

The critical path's slack, the imbalance tables (per lane, per phase, waited on, held after
entry, critical busy), the barrier arrivals and the time model's waits all sum the same segments
and intervals per lane: the work and wait time of each lane, the work time per (lane, phase), the
work spans, the waits on each peer, and the waits before / after the occurrence's last entry.
Each pass here reads the points or the intervals once (compiled: profiler.analysis.tables_fast;
numpy where those cannot run or a sum could round) and is memoised per graph (graph.memo), so a
chunk's tables read every point twice and every interval twice instead of a dozen times each
(issue 31).

Every value equals what the analyses computed on their own before, to the bit: the numpy path is
their code; the compiled path sums in int64, used only where every sum stays below 2**53 and the
times and cuts are integral (profiler.analysis.exactsum), so the float64 sums are the same.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import graph as G
from . import tables_fast
from .exactsum import exact_sum
from .peers import interval_peers

_EXACT = 2 ** 53
WAIT_KINDS = (G.WAIT, G.IDLE, G.BARRIER)


@dataclass(frozen=True)
class PointTotals:
    """Per lane of a graph (rows) from its segments."""
    work: np.ndarray         # int64: work time (graph.lane_sums of WORK)
    wait: np.ndarray         # int64: wait, idle and barrier time (graph.lane_sums of WAIT_KINDS)
    work_phase: np.ndarray   # float64 [lane, phase]: work time of the segments with a phase


@dataclass(frozen=True)
class IntervalTotals:
    """Per lane of a graph from its intervals."""
    spans: np.ndarray        # int64: work spans (intervals of kind WORK with an event row)
    spans_phase: np.ndarray  # int64 [lane, phase]: the same per span phase
    waited: np.ndarray       # float64 [lane, peer]: time of the lane's waits on each peer rank


@dataclass(frozen=True)
class EntryTotals:
    """Per lane: its wait segments split at its op occurrence's last entry (the cut)."""
    before: np.ndarray       # float64: wait time before the cut (all of it where there is no cut)
    after: np.ndarray        # float64: after it
    before_phase: np.ndarray  # float64 [lane, phase + 1]: time before, per phase (column 0: none)


@dataclass(frozen=True)
class HeldPairs:
    """Per (lane, peer) with some: the lane's waits on the peer after the cut (imbalance.held_after_entry)."""
    lane: np.ndarray
    peer: np.ndarray
    held: np.ndarray         # float64


def _i(a, dtype) -> np.ndarray:
    return np.ascontiguousarray(a, dtype)


def _times_exact(g: G.Graph) -> bool:
    """Are the graph's point times integers float64 holds exactly (so float arithmetic on them is
    the integer arithmetic)? Points are sorted by time within a lane: its first and last bound it."""
    if g.n_points == 0:
        return True
    f = g.lane_first[g.lane_first < g.n_points]
    lo, hi = g.pt_t[f].min(), g.pt_t[g.lane_last[g.lane_last < g.n_points]].max()
    return max(abs(int(lo)), abs(int(hi))) < _EXACT


def _kind_lut(kinds) -> np.ndarray:
    return G.kind_mask(np.arange(len(G.SEG_KINDS), dtype=np.int8), kinds)


def _nph(g: G.Graph) -> int:
    return max(len(g.phase_names), 1)


# -- points ------------------------------------------------------------------------------------
def points(g: G.Graph) -> PointTotals:
    return G.memo(g, "lane_totals.points", lambda: _points(g))


def _points(g: G.Graph) -> PointTotals:
    nl, nph = len(g.lane), _nph(g)
    if tables_fast.enabled() and _times_exact(g):
        work, wait, wlp = np.zeros(nl, np.int64), np.zeros(nl, np.int64), np.zeros(nl * nph, np.int64)
        tot = tables_fast.run("point_sums", _i(g.pt_lane, np.int64), _i(g.seg_kind, np.int8), _i(g.seg_phase, np.int32),
                              G.segment_durations(g), _kind_lut((G.WORK,)), _kind_lut(WAIT_KINDS), np.int64(nph),
                              work, wait, wlp)
        if tot < _EXACT:
            return PointTotals(work=work, wait=wait, work_phase=wlp.astype(np.float64).reshape(nl, nph))
    dur = G.segment_durations(g)
    sel = (g.seg_kind == G.WORK) & (dur > 0) & (g.seg_phase >= 0)
    key = g.pt_lane[sel] * nph + g.seg_phase[sel]
    wlp = np.bincount(key, weights=dur[sel], minlength=nl * nph).reshape(nl, nph)
    return PointTotals(work=G.lane_sums(g, (G.WORK,)), wait=G.lane_sums(g, WAIT_KINDS), work_phase=wlp)


# -- intervals ---------------------------------------------------------------------------------
def intervals(g: G.Graph) -> IntervalTotals:
    return G.memo(g, "lane_totals.intervals", lambda: _intervals(g))


def _intervals(g: G.Graph) -> IntervalTotals:
    nl, nph = len(g.lane), _nph(g)
    peer = interval_peers(g)
    nr = int(peer.max()) + 1 if len(peer) and peer.max() >= 0 else 1
    if (tables_fast.enabled() and _times_exact(g) and g.iv_pb.dtype == np.int32 and g.iv_pe.dtype == np.int32):
        spans, slp, waited = np.zeros(nl, np.int64), np.zeros(nl * nph, np.int64), np.zeros(nl * nr, np.int64)
        tot = tables_fast.run("interval_sums", g.iv_pb, g.iv_pe, _i(g.pt_t, np.int64), _i(g.pt_lane, np.int64),
                              _i(peer, np.int64), _i(g.iv_kind, np.int8), _i(g.iv_row, np.int32),
                              _i(g.iv_phase, np.int32), np.int64(G.WORK), np.int64(nr), np.int64(nph),
                              waited, spans, slp)
        if tot < _EXACT:
            return IntervalTotals(spans=spans, spans_phase=slp.reshape(nl, nph),
                                  waited=waited.astype(np.float64).reshape(nl, nr))
    work_iv = np.flatnonzero((g.iv_kind == G.WORK) & (g.iv_row >= 0))
    lane_w = g.pt_lane[g.iv_pb[work_iv]]
    spans = np.bincount(lane_w, minlength=nl)
    slp = np.bincount(lane_w * nph + g.iv_phase[work_iv], minlength=nl * nph).reshape(nl, nph)
    iv = np.flatnonzero(peer >= 0)
    lane = g.pt_lane[g.iv_pb[iv]]
    dur = g.pt_t[g.iv_pe[iv]] - g.pt_t[g.iv_pb[iv]]
    waited = np.bincount(lane * nr + peer[iv], weights=dur, minlength=nl * nr).reshape(nl, nr)
    return IntervalTotals(spans=spans, spans_phase=slp, waited=waited)


# -- split at the occurrence's last entry ------------------------------------------------------
def _cut_ints(cut: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(the cuts as int64, which lanes have one) where every finite cut is an integer float64 holds
    exactly; None otherwise (the numpy path runs)."""
    has = np.isfinite(cut)
    c = cut[has]
    if len(c) and (not bool(np.all(c == np.floor(c))) or float(np.abs(c).max()) >= _EXACT):
        return None
    out = np.zeros(len(cut), np.int64)
    out[has] = c.astype(np.int64)
    return out, has


def entry(g: G.Graph, cut: np.ndarray) -> EntryTotals:
    """EntryTotals of g; cut: per lane, its launch's last entry (inf where none: timemodel's
    lane cut, a function of the graph, hence memoised per graph)."""
    return G.memo(g, "lane_totals.entry", lambda: _entry(g, np.asarray(cut, np.float64)))


def _entry(g: G.Graph, cut: np.ndarray) -> EntryTotals:
    nl, nph1 = len(g.lane), len(g.phase_names) + 1
    ci = _cut_ints(cut) if tables_fast.enabled() and _times_exact(g) else None
    if ci is not None and "lane_totals.points" not in g.derived:   # no pass over the points yet: one for both
        got = _points_and_entry(g, ci)
        if got is not None:
            g.derived["lane_totals.points"] = got[0]
            return got[1]
    if ci is not None:
        before, after, blp = np.zeros(nl, np.int64), np.zeros(nl, np.int64), np.zeros(nl * nph1, np.int64)
        tot = tables_fast.run("entry_sums", _i(g.pt_t, np.int64), _i(g.pt_lane, np.int64), _i(g.seg_kind, np.int8),
                              _i(g.seg_phase, np.int32), G.segment_durations(g), _kind_lut(WAIT_KINDS), ci[0],
                              _i(ci[1], np.bool_), np.int64(nph1), before, after, blp)
        if tot < _EXACT:
            return EntryTotals(before=before.astype(np.float64), after=after.astype(np.float64),
                               before_phase=blp.astype(np.float64).reshape(nl, nph1))
    p = np.flatnonzero(G.kind_mask(g.seg_kind, WAIT_KINDS) & ~g.first_mask())
    b, e = g.pt_t[p - 1], g.pt_t[p]
    lanes = g.pt_lane[p]
    before = np.clip(np.minimum(e, cut[lanes]) - b, 0, None)
    after = (e - b) - before
    w = before > 0
    key = lanes[w] * nph1 + g.seg_phase[p[w]] + 1
    return EntryTotals(before=np.bincount(lanes, weights=before, minlength=nl),
                       after=np.bincount(lanes, weights=after, minlength=nl),
                       before_phase=np.bincount(key, weights=before[w], minlength=nl * nph1).reshape(nl, nph1))


def _points_and_entry(g: G.Graph, ci: tuple) -> tuple[PointTotals, EntryTotals] | None:
    """_points' and _entry's compiled sums in one pass over the points (tables_fast's
    point_entry_sums: the chunk's tables ask for the time model's entry totals first, chunked._tables),
    or None where a sum could round (each then runs on its own, with its own fallback)."""
    nl, nph, nph1 = len(g.lane), _nph(g), len(g.phase_names) + 1
    work, wait, wlp = np.zeros(nl, np.int64), np.zeros(nl, np.int64), np.zeros(nl * nph, np.int64)
    before, after, blp = np.zeros(nl, np.int64), np.zeros(nl, np.int64), np.zeros(nl * nph1, np.int64)
    tots = np.zeros(2, np.int64)
    tables_fast.run_void("point_entry_sums", _i(g.pt_t, np.int64), _i(g.pt_lane, np.int64), _i(g.seg_kind, np.int8),
                         _i(g.seg_phase, np.int32), G.segment_durations(g), _kind_lut((G.WORK,)), _kind_lut(WAIT_KINDS),
                         np.int64(nph), ci[0], _i(ci[1], np.bool_), np.int64(nph1), work, wait, wlp, before, after, blp,
                         tots)
    if tots[0] >= _EXACT or tots[1] >= _EXACT:
        return None
    return (PointTotals(work=work, wait=wait, work_phase=wlp.astype(np.float64).reshape(nl, nph)),
            EntryTotals(before=before.astype(np.float64), after=after.astype(np.float64),
                        before_phase=blp.astype(np.float64).reshape(nl, nph1)))


def held(g: G.Graph, cut: np.ndarray) -> HeldPairs:
    """HeldPairs of g; cut as for `entry` (memoised per graph)."""
    return G.memo(g, "lane_totals.held", lambda: _held(g, np.asarray(cut, np.float64)))


def _held(g: G.Graph, cut: np.ndarray) -> HeldPairs:
    peer = interval_peers(g)
    nl = len(g.lane)
    nr = int(peer.max()) + 1 if len(peer) and peer.max() >= 0 else 1
    ci = (_cut_ints(cut) if tables_fast.enabled() and _times_exact(g) and g.iv_pb.dtype == np.int32
          and g.iv_pe.dtype == np.int32 else None)
    if ci is not None:
        h, n = np.zeros(nl * nr, np.int64), np.zeros(nl * nr, np.int64)
        tot = tables_fast.run("held_sums", g.iv_pb, g.iv_pe, _i(g.pt_t, np.int64), _i(g.pt_lane, np.int64),
                              _i(peer, np.int64), ci[0], _i(ci[1], np.bool_), np.int64(nr), h, n)
        if tot < _EXACT:
            at = np.flatnonzero(n)
            return HeldPairs(lane=at // nr, peer=at % nr, held=h[at].astype(np.float64))
    iv = np.flatnonzero(peer >= 0)
    lane = g.pt_lane[g.iv_pb[iv]]
    b, e = g.pt_t[g.iv_pb[iv]].astype(float), g.pt_t[g.iv_pe[iv]].astype(float)
    after = np.clip(e - np.maximum(b, cut[lane]), 0, None)
    keep = after > 0
    ln, pr, w = lane_peer_sums(lane[keep], peer[iv][keep], after[keep], nl)
    return HeldPairs(lane=ln, peer=pr, held=w)


def lane_peer_sums(lane: np.ndarray, peer: np.ndarray, w: np.ndarray, n_lanes: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lane, peer, sum of w) per (lane, peer) pair present, as
    DataFrame({"lane", "rank", "w"}).groupby(["lane", "rank"], sort=False)["w"].sum() gives them
    (its rows in another order: every reader groups them again, sorted). A bincount over the
    lanes x peers, not pandas' group-by of every wait (650 k a 2.5 M-event chunk): exact where the
    values are integral and their sum below 2**53 (profiler.analysis.exactsum); otherwise pandas
    sums them."""
    if not exact_sum(w):
        s = pd.DataFrame({"lane": lane, "rank": peer, "w": w}).groupby(["lane", "rank"], sort=False)["w"].sum()
        return (s.index.get_level_values(0).to_numpy(), s.index.get_level_values(1).to_numpy(), s.to_numpy())
    nr = int(peer.max()) + 1 if peer.size else 1
    key = lane.astype(np.int64) * nr + peer
    cnt = np.bincount(key, minlength=n_lanes * nr)
    tot = np.bincount(key, weights=w, minlength=n_lanes * nr)
    at = np.flatnonzero(cnt)
    return at // nr, at % nr, tot[at]
