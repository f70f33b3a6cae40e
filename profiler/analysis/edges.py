"""Step 4 of the graph: cross edges, one function per kind. Never across iterations.

Each point has at most one cross predecessor `src[p]` (the point whose time releases it) and the
recorded release time `rel_t[p]`:
  * wait edge: a wait span's end <- the latest record of its registry `waits_for` phase on the
    peer rank named by the wait's payload, whose own payload is the waiting rank, at or before
    the wait's end (same kernel and iteration);
  * barrier edge: a barrier departure <- the last arrival of its occurrence (scope block / grid /
    rank, from the registry);
  * launch edge: a GPU lane's first point <- kernel-ready: the later of the launch's host span
    (its end when it ended before the kernel started, else its begin: a call that launches and
    then synchronises) and the previous launch's end on the rank in the same iteration;
  * host-sync edge: the end of a host span that outlives its launch <- the launch's last warp end.
Unfinished waits (unfinished.close) get no edge: nothing released them, the kernel gave up.
The pieces of a released wait before its release shrink to nothing in the recurrence
(`wait_durations`); after it they keep their recorded length (polling / propagation latency).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import graph_fast
from .intervals import BARRIER, WAIT, Intervals
from .keys import asof_latest, pack, used_codes
from .lanes import Lanes, Table
from .points import Points
from .semantics import Semantics

SCOPE_CODE = {"block": 0, "grid": 1, "rank": 2}
_EMPTY = np.zeros(0, np.int64)


@dataclass
class Edges:
    src: np.ndarray              # cross predecessor point, -1 if none
    rel_t: np.ndarray            # recorded release time (valid where src >= 0)
    # barrier occurrences: arrivals grouped by occurrence (sorted by time), departures with an edge
    arr_occ: np.ndarray = field(default_factory=lambda: _EMPTY)       # occurrence of each arrival (aligned with iv.arr_rows)
    occ_arr_row: np.ndarray = field(default_factory=lambda: _EMPTY)   # arrival rows sorted by (occurrence, time)
    occ_arr_pt: np.ndarray = field(default_factory=lambda: _EMPTY)
    occ_starts: np.ndarray = field(default_factory=lambda: _EMPTY)
    bw_end_pt: np.ndarray = field(default_factory=lambda: _EMPTY)     # departure point of each released barrier wait
    bw_occ: np.ndarray = field(default_factory=lambda: _EMPTY)
    bw_arr_row: np.ndarray = field(default_factory=lambda: _EMPTY)
    # kernel ready from the previous launch: a lane's first point waits for the latest last point
    # of all lanes of the previous launch on the rank (whichever lane that is after re-timing)
    prev_first_pt: np.ndarray = field(default_factory=lambda: _EMPTY)
    prev_grp: np.ndarray = field(default_factory=lambda: _EMPTY)
    prev_lat: np.ndarray = field(default_factory=lambda: _EMPTY)
    prev_member_pt: np.ndarray = field(default_factory=lambda: _EMPTY)
    prev_starts: np.ndarray = field(default_factory=lambda: _EMPTY)
    host_sync_pb: np.ndarray = field(default_factory=lambda: _EMPTY)
    host_sync_pe: np.ndarray = field(default_factory=lambda: _EMPTY)


def wait_durations(d, pt_t, pb, pe, rel_t) -> None:
    """Set d for the pieces pb+1 .. pe of each released wait: nothing before the release, the
    recorded time after it (graph_fast's loop where it can run)."""
    if graph_fast.enabled():
        graph_fast.wait_durations(d, pt_t, pb, pe, rel_t)
        return
    span = pe - pb
    multi = span > 1
    if np.any(multi):
        idx = np.repeat(pb[multi], span[multi]) + (np.arange(span[multi].sum()) - np.repeat(np.cumsum(span[multi]) - span[multi], span[multi])) + 1
        r = np.repeat(rel_t[multi], span[multi])
        pbt = pt_t[idx - 1]
        d[idx] = np.maximum(0, pt_t[idx] - np.maximum(pbt, r))
    single = ~multi & (span == 1)
    d[pe[single]] = np.maximum(0, pt_t[pe[single]] - np.maximum(pt_t[pb[single]], rel_t[single]))


def wait_edges(t: Table, lanes: Lanes, pts: Points, iv: Intervals, iv_pb, iv_pe, sem: Semantics,
               e: Edges, d: np.ndarray) -> None:
    if graph_fast.enabled() and _wait_join(t, lanes, pts, iv, iv_pb, iv_pe, sem, e, d):
        return
    wait_iv = np.flatnonzero((iv.kind == WAIT) & ~iv.unfinished)
    if len(wait_iv) == 0:
        return
    wrow = iv.row[wait_iv]
    wph = iv.phase[wait_iv]                  # = t.phase_c[wrow] (a span's phase), read in order
    rel_name_of_phase = [sem.release_of(p) for p in t.phase_names]
    targets = sorted({rel_name_of_phase[c] for c in used_codes(wph, len(t.phase_names))} - {""})
    if not targets:
        return
    tgt_of_phase = np.array([targets.index(r) if r in targets else -1 for r in rel_name_of_phase], dtype=np.int64)
    q_g = tgt_of_phase[wph]
    del wph
    rel_rows, rel_g = release_rows(t, lanes, targets)
    rank, it = t.rank, t.it
    rmin, rmax = int(rank.min()), int(rank.max())
    # release key (group, iteration, kernel, releasing rank, the rank it signals) must equal the
    # wait key (group, iteration, kernel, peer rank it waits on, own rank): one mixed-radix
    # integer with the same radices on both sides; -1 for a payload that names no rank
    n_it = int(it.max()) - int(it.min()) + 1
    n_k = len(t.kernel_names) + 1
    n_r = rmax - rmin + 1
    radix = (int(it.min()), n_it, n_k, rmin, rmax, n_r)
    kr = wait_keys(rel_rows, rel_g, t, True, radix)
    kq = wait_keys(wrow, q_g, t, False, radix)
    q_ok = kq >= 0
    kr[kr < 0] = -2                          # a release or wait naming no rank matches nothing
    kq[~q_ok] = -3
    hit = asof_latest(kr, t.end[rel_rows] - t.t0, kq, t.end[wrow] - t.t0)
    del kr, kq
    if graph_fast.enabled():   # the writes below in one pass (hit >= 0 only where q_ok: keys -2 vs -3)
        got = graph_fast.wait_apply(wait_iv, hit, rel_rows, iv_pb, iv_pe, pts.row_pe, t.end, e.src, e.rel_t)
        if got is not None:
            wait_durations(d, pts.pt_t, *got)
            return
    ok = (hit >= 0) & q_ok
    wi, rr = wait_iv[ok], rel_rows[hit[ok]]
    p_end = iv_pe[wi]
    rel = t.end[rr]
    e.src[p_end] = pts.row_pe[rr]
    e.rel_t[p_end] = rel
    wait_durations(d, pts.pt_t, iv_pb[wi], p_end, rel)


def _wait_join(t: Table, lanes: Lanes, pts: Points, iv: Intervals, iv_pb, iv_pe, sem: Semantics, e: Edges,
               d: np.ndarray) -> bool:
    """wait_edges in graph_fast's compiled passes (no release rows, keys, sort order or hits as
    arrays), or False where they cannot run. The targets are every phase's release, not only those
    of the chunk's waits: a target no wait names adds releases that match nothing, the same edges."""
    if not len(iv.kind):
        return True
    rel_name_of_phase = [sem.release_of(p) for p in t.phase_names]
    targets = sorted(set(rel_name_of_phase) - {""})
    if not targets:
        return True
    g_of_phase = np.array([targets.index(p) if p in targets else -1 for p in t.phase_names], np.int64)
    tgt_of_phase = np.array([targets.index(r) if r in targets else -1 for r in rel_name_of_phase], np.int64)
    (rmin, rmax), (it_min, it_max) = t.bounds("rank"), t.bounds("it")
    radix = (it_min, it_max - it_min + 1, len(t.kernel_names) + 1, rmin, rmax, rmax - rmin + 1)
    return graph_fast.wait_join(t, lanes.is_host_row, iv, iv_pb, iv_pe, pts.row_pe, pts.pt_t, e.src, e.rel_t, d,
                                g_of_phase, tgt_of_phase, radix, WAIT)


def wait_keys(rows, g, t: Table, from_rank: bool, radix: tuple) -> np.ndarray:
    """wait_edges' key of each row: (group g, iteration, kernel, rank from, rank to) as one
    mixed-radix integer (radix: it_min, n_it, n_k, rmin, rmax, n_r), -1 where a rank is out of range
    or g is -1. A release goes from its rank to its payload's rank (from_rank), a wait from its
    payload's rank to its own. graph_fast's one pass where it can run (~15 array passes here)."""
    if graph_fast.enabled():
        got = graph_fast.wait_keys(rows, g, t, from_rank, radix)
        if got is not None:
            return got
    it_min, n_it, n_k, rmin, rmax, n_r = radix
    rank = t.rank[rows].astype(np.int64)
    r_from, r_to = (rank, t.payload[rows]) if from_rank else (t.payload[rows], rank)
    out = np.asarray(g, np.int64) * n_it + (t.it[rows] - it_min)
    out *= n_k
    out += t.kernel_c[rows]
    out *= n_r
    out += r_from - rmin
    out *= n_r
    out += r_to - rmin
    bad = (r_from < rmin) | (r_from > rmax) | (r_to < rmin) | (r_to > rmax) | (np.asarray(g) < 0)
    out[bad] = -1
    return out


def release_rows(t: Table, lanes: Lanes, targets: list) -> tuple[np.ndarray, np.ndarray]:
    """The rows that can release a wait of target g (their phase is targets[g], on a GPU lane, not
    a barrier's arrive / depart), grouped by target, in row order within one; and their targets."""
    if graph_fast.enabled():   # one pass per target, no mask per target
        g_of_phase = np.array([targets.index(p) if p in targets else -1 for p in t.phase_names], np.int64)
        return graph_fast.release_rows(t.phase_c, g_of_phase, len(targets), lanes.is_host_row, t.kind["arrive"],
                                       t.kind["depart"])
    not_barrier = ~lanes.is_host_row & ~t.kind["arrive"] & ~t.kind["depart"]
    rows, g = [], []
    for i, tname in enumerate(targets):
        rr = np.flatnonzero((t.phase_names == tname)[t.phase_c] & not_barrier)
        rows.append(rr)
        g.append(np.full(len(rr), i, np.int64))
    return np.concatenate(rows), np.concatenate(g)


def occurrence_keys(rows, sem: Semantics, t: Table) -> np.ndarray:
    """Key of the barrier occurrence each arrive/depart row belongs to (scope-dependent)."""
    scope_of = np.array([SCOPE_CODE[sem.scope(p)] for p in t.phase_names], dtype=np.int64)
    sc = scope_of[t.phase_c[rows]]
    r = np.where(sc == 2, -1, t.rank[rows])
    lch = np.where(sc == 2, -1, t.launch[rows])
    blk = np.where(sc == 0, t.block[rows], -1)
    cols = [t.phase_c[rows].astype(np.int64), t.kernel_c[rows].astype(np.int64), t.it[rows] - t.it.min(),
            r - t.rank.min() + 1, lch - min(t.launch.min(), 0) + 1, blk + 1, t.payload[rows] - t.payload[rows].min()]
    return pack(cols)


def barrier_edges(t: Table, pts: Points, iv: Intervals, iv_pb, iv_pe, sem: Semantics, e: Edges,
                  d: np.ndarray) -> None:
    arr_rows = iv.arr_rows
    if len(arr_rows) == 0:
        return
    occ = occurrence_keys(arr_rows, sem, t)
    e.arr_occ = pd.factorize(occ)[0].astype(np.int64)
    o = np.lexsort((t.begin[arr_rows], e.arr_occ))
    oc_s = e.arr_occ[o]
    e.occ_starts = np.flatnonzero(np.r_[True, oc_s[1:] != oc_s[:-1]])
    e.occ_arr_row = arr_rows[o]
    e.occ_arr_pt = pts.row_pb[e.occ_arr_row]
    if len(iv.bw_arr) == 0:
        return
    last_row_of_occ = arr_rows[o][np.r_[e.occ_starts[1:], len(o)] - 1]
    bw_iv = np.arange(iv.n_spans, iv.n)
    bw_occ = _occurrence_of(iv.arr_row[bw_iv], arr_rows, e.arr_occ)
    lr = last_row_of_occ[bw_occ]
    bw_arr, bw_dep = iv.bw_arr, iv.bw_dep
    # an unfinished wait was never released; a malformed occurrence whose last arrival comes after
    # this departure gives no edge either
    okb = (t.begin[lr] <= t.end[bw_dep]) & ~iv.unfinished[bw_iv]
    bw_iv, bw_occ, lr, bw_arr = bw_iv[okb], bw_occ[okb], lr[okb], bw_arr[okb]
    e.bw_end_pt = iv_pe[bw_iv]
    e.bw_occ = bw_occ
    e.bw_arr_row = bw_arr
    e.src[e.bw_end_pt] = pts.row_pb[lr]
    e.rel_t[e.bw_end_pt] = t.begin[lr]
    wait_durations(d, pts.pt_t, iv_pb[bw_iv], e.bw_end_pt, t.begin[lr])


def _occurrence_of(rows, arr_rows, arr_occ) -> np.ndarray:
    """The occurrence of each arrival row in `rows`, -1 for a row that is none: a search of the
    sorted arrival rows (a table-long look-up array was 20 MB of fresh pages a 2.5 M-event chunk)."""
    assert len(arr_rows) < 2 or bool(np.all(arr_rows[1:] > arr_rows[:-1])), "arrival rows: ascending"
    pos = np.minimum(np.searchsorted(arr_rows, rows), len(arr_rows) - 1)
    return np.where(arr_rows[pos] == rows, arr_occ[pos], -1)


@dataclass
class Launches:
    """The GPU launches of the table (one per (rank, launch) with GPU lanes)."""
    code: np.ndarray             # per GPU lane: its launch
    lanes: np.ndarray            # the GPU lanes
    start: np.ndarray            # per launch: first warp point time
    end: np.ndarray              # last warp point time
    end_pt: np.ndarray           # the point of that last warp end
    rank: np.ndarray
    it: np.ndarray
    launch: np.ndarray
    keys: np.ndarray             # launch key of each launch (see launch_key)


def gpu_launches(t: Table, lanes: Lanes, pts: Points) -> Launches | None:
    gl = np.flatnonzero(~lanes.frame["host"].to_numpy() & (pts.lane_first <= pts.lane_last))
    if len(gl) == 0:
        return None
    lf, ll = pts.lane_first[gl], pts.lane_last[gl]
    L = lanes.frame.iloc[gl]
    lk = launch_key(t, L["rank"].to_numpy(), L["launch"].to_numpy())
    lcode, luniq = pd.factorize(lk)
    nl = len(luniq)
    start = np.full(nl, np.iinfo(np.int64).max)
    np.minimum.at(start, lcode, pts.pt_t[lf])
    end = np.full(nl, np.iinfo(np.int64).min)
    np.maximum.at(end, lcode, pts.pt_t[ll])
    end_pt = np.full(nl, -1, np.int64)
    is_max = pts.pt_t[ll] == end[lcode]
    end_pt[lcode[is_max]] = ll[is_max]
    first_lane = np.zeros(nl, np.int64)
    first_lane[lcode] = gl
    fr = lanes.frame
    return Launches(code=lcode, lanes=gl, start=start, end=end, end_pt=end_pt,
                    rank=fr["rank"].to_numpy()[first_lane], it=fr["iteration"].to_numpy()[first_lane],
                    launch=fr["launch"].to_numpy()[first_lane], keys=np.asarray(luniq, np.int64))


def launch_key(t: Table, r, lch) -> np.ndarray:
    n_launch_vals = int(t.launch.max()) - int(t.launch.min()) + 1
    return (np.asarray(r, np.int64) - int(t.rank.min())) * n_launch_vals + (np.asarray(lch, np.int64) - int(t.launch.min()))


def launch_edges(t: Table, lanes: Lanes, pts: Points, L: Launches, e: Edges) -> None:
    """Kernel-ready edges into the first point of every GPU lane."""
    nl = len(L.start)
    lf = pts.lane_first[L.lanes]
    ll = pts.lane_last[L.lanes]
    ready_t = np.full(nl, np.iinfo(np.int64).min)
    ready_pt = np.full(nl, -1, np.int64)
    # previous launch on the rank in the same iteration (by GPU start)
    o = np.lexsort((L.start, L.it, L.rank))
    same = np.r_[False, (L.rank[o][1:] == L.rank[o][:-1]) & (L.it[o][1:] == L.it[o][:-1])]
    prev = np.where(same, np.r_[-1, o[:-1]], -1)
    cur = o
    okp = prev >= 0
    okp[okp] &= L.end[prev[okp]] <= L.start[cur[okp]]
    ready_t[cur[okp]] = L.end[prev[okp]]
    ready_pt[cur[okp]] = L.end_pt[prev[okp]]
    # the host span of the same (rank, launch) that began before the kernel started: the kernel
    # is ready at its end when it ended first (an enqueue), else at its begin (a host call that
    # launches and then synchronises, so it outlives the kernel)
    hrows = np.flatnonzero(t.kind["host"])
    if len(hrows):
        hk = pack([np.concatenate([t.rank[hrows], L.rank]) - t.rank.min(),
                   np.concatenate([t.launch[hrows], L.launch]) - min(t.launch.min(), 0)])
        hcode = asof_latest(hk[: len(hrows)], t.begin[hrows], hk[len(hrows):], L.start)
        okh = hcode >= 0
        hr = hrows[np.where(okh, hcode, 0)]
        ended = t.end[hr] <= L.start
        h_t = np.where(ended, t.end[hr], t.begin[hr])
        h_pt = np.where(ended, pts.row_pe[hr], pts.row_pb[hr])
        okh &= h_t > ready_t
        ready_t = np.where(okh, h_t, ready_t)
        ready_pt = np.where(okh, h_pt, ready_pt)
    # lanes of a launch whose previous launch exists: group = the previous launch's code
    prev_of = np.full(nl, -1, np.int64)
    prev_of[cur[okp]] = prev[okp]
    lane_prev = prev_of[L.code]
    wl = lane_prev >= 0
    e.prev_first_pt = lf[wl]
    e.prev_lat = pts.pt_t[e.prev_first_pt] - L.end[lane_prev[wl]]
    # members: last points of every lane of each launch, grouped by launch code
    om = np.argsort(L.code, kind="stable")
    member_pt = ll[om]
    starts_all = np.searchsorted(L.code[om], np.arange(nl))
    # compact to the launches used as a previous launch
    used = np.unique(lane_prev[wl])
    remap = np.full(nl, -1, np.int64)
    remap[used] = np.arange(len(used))
    e.prev_grp = remap[lane_prev[wl]]
    cnt = np.r_[starts_all[1:], len(om)] - starts_all
    idx = np.concatenate([np.arange(starts_all[u], starts_all[u] + cnt[u]) for u in used]) if len(used) else _EMPTY
    e.prev_member_pt = member_pt[idx]
    e.prev_starts = np.r_[0, np.cumsum(cnt[used])[:-1]].astype(np.int64) if len(used) else _EMPTY
    sel = (ready_pt >= 0)[L.code]
    e.src[lf[sel]] = ready_pt[L.code[sel]]
    e.rel_t[lf[sel]] = ready_t[L.code[sel]]


def host_sync_edges(t: Table, pts: Points, L: Launches, e: Edges, d: np.ndarray) -> None:
    """A host span that outlives the kernel it launched waited for it (a synchronising call): its
    end depends on the launch's last warp (the latest one when it launched several)."""
    hrows = np.flatnonzero(t.kind["host"])
    if len(hrows) == 0:
        return
    lidx = pd.Index(L.keys).get_indexer(launch_key(t, t.rank[hrows], t.launch[hrows]))
    ok = lidx >= 0
    hr, li = hrows[ok], lidx[ok]
    sync = (t.end[hr] >= L.end[li]) & (t.begin[hr] < L.end[li]) & (L.end_pt[li] >= 0)
    hr, li = hr[sync], li[sync]
    if len(hr) == 0:
        return
    o = np.lexsort((L.end[li], pts.row_pe[hr]))
    last = np.r_[pts.row_pe[hr][o][1:] != pts.row_pe[hr][o][:-1], True]
    hr, li = hr[o][last], li[o][last]
    pe_h = pts.row_pe[hr]
    e.src[pe_h] = L.end_pt[li]
    e.rel_t[pe_h] = L.end[li]
    e.host_sync_pe, e.host_sync_pb = pe_h, pts.row_pb[hr]
    wait_durations(d, pts.pt_t, e.host_sync_pb, pe_h, L.end[li])


def binding(pts: Points, iv: Intervals, iv_pb, iv_pe, e: Edges) -> tuple[np.ndarray, np.ndarray]:
    """(latency from release to point, whether the cross edge binds in recorded time: the release
    came after the wait began; always at a lane's first point). graph_fast's one pass where it can run."""
    if graph_fast.enabled():
        got = graph_fast.binding(pts.pt_t, e.src, e.rel_t, pts.first_mask(), iv.kind, iv_pb, iv_pe, (WAIT, BARRIER),
                                 e.host_sync_pb, e.host_sync_pe)
        if got is not None:
            return got
    has_src = e.src >= 0
    lat = np.where(has_src, pts.pt_t - e.rel_t, 0)
    wait_begin = np.full(pts.n, np.iinfo(np.int64).max, dtype=np.int64)
    w = np.flatnonzero((iv.kind == WAIT) | (iv.kind == BARRIER))
    wait_begin[iv_pe[w]] = pts.pt_t[iv_pb[w]]
    wait_begin[e.host_sync_pe] = pts.pt_t[e.host_sync_pb]
    return lat, has_src & np.where(pts.first_mask(), True, e.rel_t > wait_begin)
