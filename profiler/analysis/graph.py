"""The dependency graph of a run, built once per event table and shared by the analyses.

Model. Every warp of every launch is a *lane* (host rows: one lane per rank and iteration). The
begin/end times of a lane's spans, instants and barrier events cut the lane into *points*
(unique times, sorted); between two consecutive points lies a *segment*, owned by the innermost
interval covering it (a span, or a barrier wait = own arrive .. own depart), or by nobody (a gap).
Nested spans are handled by nesting depth: a parent span owns only the time its children leave.

Each point p has one in-lane predecessor (p-1, through the segment p-1 -> p) and at most one
cross predecessor `src[p]`:
  * the end of a wait span: the latest matching release on the peer rank at or before the end
    (registry `waits_for`; the peer's record carries this rank in its payload, the wait carries the
    peer rank), same iteration and kernel;
  * a barrier departure: the occurrence's last arrival (scope block / grid / rank);
  * the first point of a GPU lane: kernel-ready = the later of the launch's host span (its end
    when it ended before the kernel started, else its begin: a host call that launches and then
    synchronises) and the previous launch's end on the same rank in the same iteration;
  * the end of a host span that outlives its launch: the launch's last warp end (the call
    synchronised with it).
Dependencies never cross iterations, so each iteration is analysed on its own.

Re-timing (what-if) and the critical path both use the recurrence, in original times exactly
reproduced:  T[p] = max(T[p-1] + d[p], T[src[p]] + lat[p])  where d[p] is the segment's own time
(for the final piece of a wait or barrier wait, only the part after the release), lat[p] the
recorded latency from the release to p. The critical path walks back from the iteration's last
point, taking the cross edge when it is binding (the release came after the wait began).

Everything is numpy over the whole table: a few sorts, searchsorted joins and per-depth painting;
no Python loop per event (the path walk loops per path point, re-timing per window of targets).
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profiler.registry import Registry

# segment kinds (codes into SEG_KINDS)
SEG_KINDS = ("gap", "work", "wait", "barrier", "host", "idle", "launch")
GAP, WORK, WAIT, BARRIER, HOST, IDLE, LAUNCH = range(len(SEG_KINDS))

# conventional release phase of a wait when no registry says (the ep_intranode registry's names)
DEFAULT_WAITS_FOR = {"wait_data": "publish_tail", "wait_space": "publish_head"}
ANY_PUBLISH = "*publish"


# --------------------------------------------------------------------------------------------
# registry semantics
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Semantics:
    """What the analyses need to know about phase and barrier names."""
    waits: dict                  # wait phase name -> release phase name (or ANY_PUBLISH)
    idle: frozenset              # idle phase names
    scopes: dict                 # barrier name -> 'block' | 'grid' | 'rank' (declared ones)
    declared: frozenset = frozenset()   # phase names some registry declares

    def is_wait(self, name: str) -> bool:
        # a declared phase is a wait only when its registry says so; an undeclared one by name
        return name in self.waits or (name not in self.declared and name.startswith("wait"))

    def release_of(self, name: str) -> str:
        if name in self.waits:
            return self.waits[name]
        return DEFAULT_WAITS_FOR.get(name, ANY_PUBLISH)

    def is_idle(self, name: str) -> bool:
        return name in self.idle or name.startswith("idle")

    def scope(self, barrier: str) -> str:
        if barrier in self.scopes:
            return self.scopes[barrier]
        if barrier.startswith("rank"):
            return "rank"
        if barrier.startswith("block"):
            return "block"
        return "grid"


def _registry_dicts(registry) -> list[dict]:
    if registry is None:
        return []
    if isinstance(registry, Registry):
        return [registry.to_json()]
    if isinstance(registry, (list, tuple)):
        return [d for r in registry for d in _registry_dicts(r)]
    if isinstance(registry, dict):
        if "family" in registry and ("phases" in registry or "phase" in registry):
            return [registry]
        return [d for v in registry.values() for d in _registry_dicts(v)]
    raise TypeError(f"registry: expected a Registry, a registry dict or a manifest's registry map, got {type(registry).__name__}")


def semantics(registry=None) -> Semantics:
    waits, idle, scopes, declared = {}, set(), {}, set()
    for d in _registry_dicts(registry):
        for p in d.get("phases", d.get("phase", [])):
            name = p["name"]
            declared.add(name)
            if p.get("wait"):
                waits[name] = p.get("waits_for") or DEFAULT_WAITS_FOR.get(name, ANY_PUBLISH)
            if name.startswith("idle"):
                idle.add(name)
        for b in d.get("barriers", d.get("barrier", [])):
            scopes[b["name"]] = b.get("scope", "grid")
    return Semantics(waits, frozenset(idle), scopes, frozenset(declared))


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def pack(cols: list[np.ndarray]) -> np.ndarray:
    """Pack small non-negative int columns into one int64 key (order = lexicographic)."""
    key = np.zeros(len(cols[0]) if cols else 0, dtype=np.int64)
    bits = 0
    for c in cols:
        c = np.asarray(c, dtype=np.int64)
        hi = int(c.max()) if len(c) else 0
        w = max(hi, 0).bit_length() or 1
        bits += w
        if bits > 62:
            # too wide to pack: fall back to dense codes of the tuple so far
            key = pd.factorize(pd.MultiIndex.from_arrays([key, c]))[0].astype(np.int64)
            bits = max(int(key.max()) if len(key) else 0, 0).bit_length() or 1
            continue
        key = (key << w) | c
    return key


def asof_latest(key_rel: np.ndarray, t_rel: np.ndarray, key_q: np.ndarray, t_q: np.ndarray) -> np.ndarray:
    """For each query (key, t): index into the release arrays of the latest release with the same
    key and time <= t, or -1."""
    if len(key_rel) == 0 or len(key_q) == 0:
        return np.full(len(key_q), -1, dtype=np.int64)
    kmin = min(int(key_rel.min()), int(key_q.min()))
    kmax = max(int(key_rel.max()), int(key_q.max()))
    if (kmax - kmin).bit_length() <= 30:    # small keys: use them directly, no hashing
        cr, cq = key_rel - kmin, key_q - kmin
        codes = np.array([kmax - kmin])
    else:
        codes = pd.factorize(np.concatenate([key_rel, key_q]))[0].astype(np.int64)
        cr, cq = codes[: len(key_rel)], codes[len(key_rel):]
    tmin = min(int(t_rel.min()), int(t_q.min()))
    tb = (max(int(t_rel.max()), int(t_q.max())) - tmin).bit_length() + 1
    if tb + max(int(codes.max()), 1).bit_length() <= 62:
        kr = (cr << tb) | (t_rel - tmin)
        kq = (cq << tb) | (t_q - tmin)
        order = np.argsort(kr, kind="stable")
        pos = np.searchsorted(kr[order], kq, side="right") - 1
    else:  # pragma: no cover - needs > 2^62 of key space
        order = np.lexsort((t_rel, cr))
        ks = pd.MultiIndex.from_arrays([cr[order], t_rel[order]])
        pos = ks.searchsorted(pd.MultiIndex.from_arrays([cq, t_q]), side="right") - 1
    ok = pos >= 0
    pos_c = np.where(ok, pos, 0)
    ok &= cr[order][pos_c] == cq
    return np.where(ok, order[pos_c], -1)


# --------------------------------------------------------------------------------------------
# the graph
# --------------------------------------------------------------------------------------------
@dataclass
class Graph:
    t0: int                      # time origin of the relative times below
    # points (sorted by lane, time)
    pt_t: np.ndarray             # int64 absolute ns
    pt_lane: np.ndarray          # int64
    # incoming segment of each point (p-1 -> p); for a lane's first point the 'launch' pseudo-segment
    seg_kind: np.ndarray         # int8 codes into SEG_KINDS
    seg_phase: np.ndarray        # int32 code into phase_names, -1 for gaps / launch
    seg_owner: np.ndarray        # int64 interval index, -1 if none
    d: np.ndarray                # int64 own duration in the recurrence
    src: np.ndarray              # int64 cross predecessor point, -1 if none
    lat: np.ndarray              # int64 recorded latency src -> p (valid where src >= 0)
    binding: np.ndarray          # bool: cross edge is the binding predecessor in recorded time
    # lanes
    lane_first: np.ndarray       # first point of each lane
    lane_last: np.ndarray
    lane: pd.DataFrame           # per lane: rank, kernel, launch, iteration, block, warp, role, host
    phase_names: np.ndarray      # phase code -> name (object array)
    # intervals (spans and barrier waits)
    iv_row: np.ndarray           # event row of a span, -1 for a barrier wait
    iv_phase: np.ndarray
    iv_kind: np.ndarray          # WORK / WAIT / BARRIER / HOST / IDLE
    iv_pb: np.ndarray            # begin point
    iv_pe: np.ndarray            # end point
    iv_kernel: np.ndarray        # kernel code of the interval's row (into kernel_names)
    kernel_names: np.ndarray
    iv_launch: np.ndarray        # launch of the interval's row
    # event rows -> points (for re-timing the table); -1 where the row has no point
    row_pb: np.ndarray
    row_pe: np.ndarray
    # barrier occurrences: arrivals grouped by occurrence (sorted), and barrier-wait ends
    arr_rows: np.ndarray         # event rows of arrivals
    arr_occ: np.ndarray          # occurrence id of each arrival (aligned with arr_rows)
    occ_arr_row: np.ndarray      # arrival event rows sorted by (occurrence, time)
    occ_arr_pt: np.ndarray       # their points
    occ_starts: np.ndarray       # start of each occurrence in occ_arr_pt
    bw_end_pt: np.ndarray        # departure point of each barrier wait
    bw_occ: np.ndarray           # its occurrence id
    bw_arr_row: np.ndarray       # its own arrival event row
    # kernel ready from the previous launch: a lane's first point waits for the latest last point
    # of all lanes of the previous launch on the rank (whichever lane that is after re-timing)
    prev_first_pt: np.ndarray
    prev_grp: np.ndarray
    prev_lat: np.ndarray
    prev_member_pt: np.ndarray   # last points of the previous launches' lanes, sorted by group
    prev_starts: np.ndarray
    sem: Semantics
    derived: dict = field(default_factory=dict)   # per-graph caches (segment durations, ...)

    @property
    def n_points(self) -> int:
        return len(self.pt_t)


_CACHE: dict[tuple, tuple] = {}
_CACHE_MAX = 4
# one build at a time: the viewer computes analyses in a background thread while a page may ask
# for the same run; the second caller waits and gets the cached graph instead of building twice
_BUILD_LOCK = threading.Lock()


def build(events: pd.DataFrame, registry=None) -> Graph:
    """The graph of `events`, cached per (table object, registry) while the table lives.

    The table must not be modified in place after a first analysis (the cache keys on identity).
    """
    key = (id(events), len(events), id(registry))
    with _BUILD_LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0]() is events:
            return hit[1]
        g = _build(events, semantics(registry))
        while len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = (weakref.ref(events), g)
        # drop the graph as soon as its table is garbage-collected
        weakref.finalize(events, _CACHE.pop, key, None)
        return g


def _codes(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(s.dtype, pd.CategoricalDtype):
        return s.cat.codes.to_numpy().astype(np.int32), np.asarray(s.cat.categories.astype(str), dtype=object)
    codes, uniq = pd.factorize(s.astype(str))
    return codes.astype(np.int32), np.asarray(uniq, dtype=object)


def _build(ev: pd.DataFrame, sem: Semantics) -> Graph:
    n = len(ev)
    # native narrow dtypes where the values are small; int64 only for times and keys (the tables
    # reach 10 M rows: every avoided temporary is 80 MB not allocated)
    rank = ev["rank"].to_numpy()
    launch = ev["launch"].to_numpy()
    it = ev["iteration"].to_numpy()
    block = ev["block"].to_numpy()
    warp = ev["warp"].to_numpy()
    begin = ev["begin_ns"].to_numpy()
    end = ev["end_ns"].to_numpy()
    payload = ev["payload"].to_numpy()
    kind_c, kind_names = _codes(ev["kind"])
    phase_c, phase_names = _codes(ev["phase"])
    kernel_c, kernel_names = _codes(ev["kernel"])
    role_c, role_names = _codes(ev["role"])
    kind_of = {k: i for i, k in enumerate(kind_names)}
    K = {k: (kind_c == kind_of[k]) if k in kind_of else np.zeros(n, bool) for k in ("span", "instant", "arrive", "depart", "host")}

    t0 = int(min(begin.min(), end.min())) if n else 0
    b_rel, e_rel = begin - t0, end - t0
    tmax = int(e_rel.max()) if n else 0
    tb = max(tmax, 1).bit_length() + 1

    # ---- lanes: GPU (rank, launch, block, warp); host (rank, iteration)
    is_host = K["host"] | (block < 0)
    if n:
        rmin, imin, lmin = int(rank.min()), int(it.min()), int(launch.min())
        nr = int(rank.max()) - rmin + 1
        nl = max(int(it.max()) - imin, int(launch.max()) - lmin) + 1
        nb, nw = int(block.max()) + 2, int(warp.max()) + 2
        if (2 * nr * nl * nb * nw).bit_length() > 62:
            raise ValueError("event table too wide to analyse (lane key exceeds 62 bits)")
        lane_key = np.where(is_host, it, launch).astype(np.int64)
        lane_key -= np.where(is_host, imin, lmin)
        lane_key += (rank.astype(np.int64) - rmin + nr * is_host) * nl
        lane_key *= nb
        lane_key += np.where(is_host, 0, block + 1)
        lane_key *= nw
        lane_key += np.where(is_host, 0, warp + 1)
    else:
        lane_key = np.zeros(0, np.int64)
    if n and np.all(lane_key[1:] >= lane_key[:-1]):     # rows already grouped by lane
        lane_id = np.r_[0, np.cumsum(lane_key[1:] != lane_key[:-1])].astype(np.int64)
    else:
        lane_id = np.asarray(pd.factorize(lane_key)[0] if n else np.zeros(0), dtype=np.int64)
    n_lanes = int(lane_id.max()) + 1 if n else 0
    if n_lanes.bit_length() + tb > 62:
        raise ValueError("event table too wide to analyse (lanes x time range exceeds 62 bits)")
    first_row = np.zeros(n_lanes, dtype=np.int64)
    first_row[lane_id[::-1]] = np.arange(n - 1, -1, -1)    # the last write (first row) wins
    lane = pd.DataFrame({
        "rank": rank[first_row], "kernel": kernel_names[kernel_c[first_row]] if n else [],
        "launch": np.where(is_host[first_row], -1, launch[first_row]),
        "iteration": it[first_row], "block": np.where(is_host[first_row], -1, block[first_row]),
        "warp": np.where(is_host[first_row], -1, warp[first_row]),
        "role": role_names[role_c[first_row]] if n else [], "host": is_host[first_row],
    })

    # ---- phase semantics per phase code
    is_wait_ph = np.array([sem.is_wait(p) for p in phase_names], dtype=bool)
    is_idle_ph = np.array([sem.is_idle(p) for p in phase_names], dtype=bool)

    # ---- intervals: spans / host spans with positive length, and barrier waits
    span_rows = np.flatnonzero((K["span"] | K["host"]) & (end > begin))
    iv_kind_span = np.where(K["host"][span_rows], HOST,
                            np.where(is_wait_ph[phase_c[span_rows]], WAIT,
                                     np.where(is_idle_ph[phase_c[span_rows]], IDLE, WORK))).astype(np.int8)
    arr_rows = np.flatnonzero(K["arrive"])
    dep_rows = np.flatnonzero(K["depart"])
    # match own arrive -> own depart by (lane, barrier, occurrence)
    bar_rows = np.concatenate([arr_rows, dep_rows])
    kb = pack([lane_id[bar_rows], phase_c[bar_rows].astype(np.int64).clip(0), payload[bar_rows].clip(0)]) if len(bar_rows) else np.zeros(0, np.int64)
    ka, kd = kb[: len(arr_rows)], kb[len(arr_rows):]
    if len(arr_rows) and len(dep_rows):
        allk = pd.factorize(np.concatenate([ka, kd]))[0]
        ka, kd = allk[: len(ka)], allk[len(ka):]
        ds = np.argsort(kd, kind="stable")
        pos = np.searchsorted(kd[ds], ka)
        posc = np.minimum(pos, len(kd) - 1)
        hit = (pos < len(kd)) & (kd[ds][posc] == ka)
        bw_arr = arr_rows[hit]
        bw_dep = dep_rows[ds][posc[hit]]
    else:
        bw_arr = bw_dep = np.zeros(0, np.int64)
    keep = end[bw_dep] > begin[bw_arr]
    bw_arr, bw_dep = bw_arr[keep], bw_dep[keep]

    iv_row = np.concatenate([span_rows, np.full(len(bw_arr), -1, np.int64)])
    iv_arr_row = np.concatenate([np.full(len(span_rows), -1, np.int64), bw_arr])
    iv_e = np.concatenate([e_rel[span_rows], e_rel[bw_dep]])
    iv_phase = np.concatenate([phase_c[span_rows], phase_c[bw_arr]]).astype(np.int32)
    iv_kind = np.concatenate([iv_kind_span, np.full(len(bw_arr), BARRIER, np.int8)])

    # ---- points: unique (lane, t) of every event boundary. Rows usually come sorted by lane and
    # begin (the decoder's region order), so the stable sort (timsort) merges two near-sorted runs.
    pk_all = np.empty(2 * n, np.int64)
    np.left_shift(lane_id, tb, out=pk_all[:n])
    pk_all[n:] = pk_all[:n]
    pk_all[:n] |= b_rel
    pk_all[n:] |= e_rel
    o = np.argsort(pk_all, kind="stable")
    pk_sorted = pk_all[o]
    del pk_all
    new = np.empty(len(pk_sorted), bool)
    if len(new):
        new[0] = True
        np.not_equal(pk_sorted[1:], pk_sorted[:-1], out=new[1:])
    pkey = pk_sorted[new]
    del pk_sorted
    rank_of_sorted = np.cumsum(new, dtype=np.int64)
    rank_of_sorted -= 1
    inv = np.empty(2 * n, np.int64)
    inv[o] = rank_of_sorted
    del o, new, rank_of_sorted
    row_pb, row_pe = inv[:n], inv[n:]
    pt_lane = pkey >> tb
    pt_t = (pkey & ((1 << tb) - 1)) + t0
    P = len(pkey)
    lane_first = np.searchsorted(pt_lane, np.arange(n_lanes), side="left")
    lane_last = np.searchsorted(pt_lane, np.arange(n_lanes), side="right") - 1
    iv_pb = np.concatenate([row_pb[span_rows], row_pb[bw_arr]])
    iv_pe = np.concatenate([row_pe[span_rows], row_pe[bw_dep]])

    # ---- nesting depth of each interval: the intervals active across its begin point
    # (A = begun before the point - ended at or before it; lanes cancel out in the global sums)
    # plus the longer intervals that begin at the same point. Properly nested spans get their
    # true depth; overlapping ones degrade to "latest begun wins".
    n_iv = len(iv_pb)
    owner = np.full(P, -1, dtype=np.int64)      # owner of segment k = (point k, point k+1)
    if n_iv:
        pbits = max(P, 1).bit_length()
        order = np.argsort((iv_pb << pbits) | (P - iv_pe), kind="stable")   # by begin, longest first
        pb_s = iv_pb[order]
        grp_first = np.flatnonzero(np.r_[True, pb_s[1:] != pb_s[:-1]])
        start_mark = np.zeros(n_iv, np.int64)
        start_mark[grp_first] = grp_first
        rank_in_grp = np.arange(n_iv) - np.maximum.accumulate(start_mark)
        CB = np.cumsum(np.bincount(iv_pb, minlength=P))
        CE = np.cumsum(np.bincount(iv_pe, minlength=P))
        A = np.where(pb_s > 0, CB[np.maximum(pb_s - 1, 0)], 0) - CE[pb_s]
        depth_s = np.maximum(A + rank_in_grp, 0)
        # paint shallow to deep; within a level the latest-begun covering interval wins
        kk = np.arange(P)
        for lvl in range(int(depth_s.max()) + 1):
            sel = order[depth_s == lvl]                 # in (begin, -end) order
            if len(sel) == 0:
                continue
            mark = np.full(P, -1, dtype=np.int64)
            mark[iv_pb[sel]] = np.arange(len(sel))
            ff = np.maximum.accumulate(mark)
            has = ff >= 0
            np.maximum(ff, 0, out=ff)
            cand = sel[ff]
            cover = iv_pe[cand] > kk
            cover &= has
            owner[cover] = cand[cover]

    # incoming segment of point p is segment p-1
    seg_owner = np.full(P, -1, dtype=np.int64)
    seg_owner[1:] = owner[:-1]
    is_first = np.zeros(P, dtype=bool)
    is_first[lane_first[lane_first < P]] = True
    seg_owner[is_first] = -1
    has_o = seg_owner >= 0
    seg_kind = np.full(P, GAP, dtype=np.int8)
    seg_kind[has_o] = iv_kind[seg_owner[has_o]]
    lane_is_host = lane["host"].to_numpy()
    seg_kind[is_first] = LAUNCH
    seg_phase = np.full(P, -1, dtype=np.int32)
    seg_phase[has_o] = iv_phase[seg_owner[has_o]]
    d = np.zeros(P, dtype=np.int64)
    d[1:] = np.diff(pt_t)
    d[is_first] = 0
    src = np.full(P, -1, dtype=np.int64)
    rel_t = np.full(P, np.iinfo(np.int64).min, dtype=np.int64)   # recorded release time

    # ---- cross edge 1: wait span end <- latest matching release on the peer
    wait_iv = np.flatnonzero(iv_kind == WAIT)
    if len(wait_iv):
        wrow = iv_row[wait_iv]
        rel_name_of_phase = [sem.release_of(p) for p in phase_names]
        targets = sorted({rel_name_of_phase[c] for c in np.unique(phase_c[wrow])})
        tgt_of_phase = np.array([targets.index(r) if r in targets else -1 for r in rel_name_of_phase], dtype=np.int64)
        q_g = tgt_of_phase[phase_c[wrow]]
        not_barrier = ~is_host & ~K["arrive"] & ~K["depart"]
        rel_rows_l, rel_g_l = [], []
        for g, tname in enumerate(targets):
            if tname == ANY_PUBLISH:
                match = np.array([p.startswith("publish") for p in phase_names], dtype=bool)
            else:
                match = phase_names == tname
            rr = np.flatnonzero(match[phase_c] & not_barrier)
            rel_rows_l.append(rr)
            rel_g_l.append(np.full(len(rr), g, np.int64))
        rel_rows = np.concatenate(rel_rows_l)
        rel_g = np.concatenate(rel_g_l)
        rmin, rmax = int(rank.min()), int(rank.max())
        peer = payload[wrow]
        # release key (group, iteration, kernel, releasing rank, the rank it signals) must equal
        # the wait key (group, iteration, kernel, peer rank it waits on, own rank): one mixed-radix
        # integer with the same radices on both sides; -1 for a payload that names no rank
        n_it = int(it.max()) - int(it.min()) + 1
        n_k = len(kernel_names) + 1
        n_r = rmax - rmin + 1

        def wait_key(g_, it_, k_, r_from, r_to):
            key = np.asarray(g_, np.int64) * n_it + (it_ - it.min())
            key *= n_k
            key += k_
            key *= n_r
            key += r_from - rmin
            key *= n_r
            key += r_to - rmin
            bad = (r_from < rmin) | (r_from > rmax) | (r_to < rmin) | (r_to > rmax) | (np.asarray(g_) < 0)
            key[bad] = -1
            return key

        kr = wait_key(rel_g, it[rel_rows], kernel_c[rel_rows], rank[rel_rows].astype(np.int64), payload[rel_rows])
        kq = wait_key(q_g, it[wrow], kernel_c[wrow], peer, rank[wrow].astype(np.int64))
        tr = e_rel[rel_rows]
        hit = asof_latest(np.where(kr >= 0, kr, -2), tr, np.where(kq >= 0, kq, -3), iv_e[wait_iv])
        ok = (hit >= 0) & (kq >= 0)
        wi, rr = wait_iv[ok], rel_rows[hit[ok]]
        p_end = iv_pe[wi]
        src[p_end] = row_pe[rr]
        rel_t[p_end] = e_rel[rr] + t0
        _set_wait_durations(d, pt_t, iv_pb[wi], p_end, e_rel[rr] + t0)

    # ---- cross edge 2: barrier departure <- the occurrence's last arrival
    occ_arr_row = occ_arr_pt = occ_starts = bw_end_pt = bw_occ = np.zeros(0, np.int64)
    arr_occ = np.zeros(0, np.int64)
    if len(arr_rows):
        occ = occurrence_keys(arr_rows, sem, phase_names, phase_c, kernel_c, rank, it, launch, block, payload)
        arr_occ = pd.factorize(occ)[0].astype(np.int64)
        o = np.lexsort((b_rel[arr_rows], arr_occ))
        oc_s = arr_occ[o]
        occ_starts = np.flatnonzero(np.r_[True, oc_s[1:] != oc_s[:-1]])
        occ_arr_row = arr_rows[o]
        occ_arr_pt = row_pb[occ_arr_row]
        last_row_of_occ = arr_rows[o][np.r_[occ_starts[1:], len(o)] - 1]
        occ_of_arr = np.full(n, -1, np.int64)
        occ_of_arr[arr_rows] = arr_occ
    if len(bw_arr):
        bw_iv = np.arange(len(span_rows), n_iv)
        bw_occ = occ_of_arr[iv_arr_row[bw_iv]]
        lr = last_row_of_occ[bw_occ]
        # a malformed occurrence whose last arrival comes after this departure gives no edge
        okb = b_rel[lr] <= e_rel[bw_dep]
        bw_iv, bw_occ, lr, bw_arr = bw_iv[okb], bw_occ[okb], lr[okb], bw_arr[okb]
        bw_end_pt = iv_pe[bw_iv]
        src[bw_end_pt] = row_pb[lr]
        rel_t[bw_end_pt] = b_rel[lr] + t0
        _set_wait_durations(d, pt_t, iv_pb[bw_iv], bw_end_pt, b_rel[lr] + t0)

    # ---- cross edge 3: first point of a GPU lane <- kernel ready
    prev_first_pt = prev_grp = prev_lat = prev_member_pt = prev_starts = np.zeros(0, np.int64)
    host_sync_pe = host_sync_pb = np.zeros(0, np.int64)
    gpu_lanes = np.flatnonzero(~lane_is_host & (lane_first <= lane_last))
    if len(gpu_lanes):
        lf = lane_first[gpu_lanes]
        ll = lane_last[gpu_lanes]
        L = lane.iloc[gpu_lanes]
        n_launch_vals = int(launch.max()) - int(launch.min()) + 1

        def launch_key(r, lch):
            return (np.asarray(r, np.int64) - int(rank.min())) * n_launch_vals + (np.asarray(lch, np.int64) - int(launch.min()))

        lk = launch_key(L["rank"].to_numpy(), L["launch"].to_numpy())
        lcode, luniq = pd.factorize(lk)
        nl = len(luniq)
        l_start = np.full(nl, np.iinfo(np.int64).max)
        np.minimum.at(l_start, lcode, pt_t[lf])
        l_end = np.full(nl, np.iinfo(np.int64).min)
        np.maximum.at(l_end, lcode, pt_t[ll])
        l_endpt = np.full(nl, -1, np.int64)
        is_max = pt_t[ll] == l_end[lcode]
        l_endpt[lcode[is_max]] = ll[is_max]
        first_lane = np.zeros(nl, np.int64)
        first_lane[lcode] = gpu_lanes
        l_rank = lane["rank"].to_numpy()[first_lane]
        l_it = lane["iteration"].to_numpy()[first_lane]
        l_launch = lane["launch"].to_numpy()[first_lane]
        ready_t = np.full(nl, np.iinfo(np.int64).min)
        ready_pt = np.full(nl, -1, np.int64)
        # previous launch on the rank in the same iteration (by GPU start)
        o = np.lexsort((l_start, l_it, l_rank))
        same = np.r_[False, (l_rank[o][1:] == l_rank[o][:-1]) & (l_it[o][1:] == l_it[o][:-1])]
        prev = np.where(same, np.r_[-1, o[:-1]], -1)
        cur = o
        okp = (prev >= 0)
        okp[okp] &= l_end[prev[okp]] <= l_start[cur[okp]]
        ready_t[cur[okp]] = l_end[prev[okp]]
        ready_pt[cur[okp]] = l_endpt[prev[okp]]
        # the host span of the same (rank, launch) that began before the kernel started: the kernel
        # is ready at its end when it ended first (an enqueue), else at its begin (a host call
        # that launches and then synchronises, so it outlives the kernel)
        hrows = np.flatnonzero(K["host"])
        if len(hrows):
            hk = pack([np.concatenate([rank[hrows], l_rank]) - rank.min(), np.concatenate([launch[hrows], l_launch]) - min(launch.min(), 0)])
            hcode = asof_latest(hk[: len(hrows)], begin[hrows], hk[len(hrows):], l_start)
            okh = hcode >= 0
            hr = hrows[np.where(okh, hcode, 0)]
            ended = end[hr] <= l_start
            h_t = np.where(ended, end[hr], begin[hr])
            h_pt = np.where(ended, row_pe[hr], row_pb[hr])
            okh &= h_t > ready_t
            ready_t = np.where(okh, h_t, ready_t)
            ready_pt = np.where(okh, h_pt, ready_pt)
        # lanes of a launch whose previous launch exists: group = the previous launch's code
        prev_of = np.full(nl, -1, np.int64)
        prev_of[cur[okp]] = prev[okp]
        lane_prev = prev_of[lcode]
        wl = lane_prev >= 0
        prev_first_pt = lf[wl]
        prev_lat = pt_t[prev_first_pt] - l_end[lane_prev[wl]]
        # members: last points of every lane of each launch, grouped by launch code
        om = np.argsort(lcode, kind="stable")
        member_pt = ll[om]
        starts_all = np.searchsorted(lcode[om], np.arange(nl))
        # compact to the launches used as a previous launch
        used = np.unique(lane_prev[wl])
        remap = np.full(nl, -1, np.int64)
        remap[used] = np.arange(len(used))
        prev_grp = remap[lane_prev[wl]]
        cnt = np.r_[starts_all[1:], len(om)] - starts_all
        idx = np.concatenate([np.arange(starts_all[u], starts_all[u] + cnt[u]) for u in used]) if len(used) else np.zeros(0, np.int64)
        prev_member_pt = member_pt[idx]
        prev_starts = np.r_[0, np.cumsum(cnt[used])[:-1]].astype(np.int64) if len(used) else np.zeros(0, np.int64)
        has_ready = ready_pt >= 0
        lr = lcode  # launch of each gpu lane
        sel = has_ready[lr]
        src[lf[sel]] = ready_pt[lr[sel]]
        rel_t[lf[sel]] = ready_t[lr[sel]]
        # a host span that outlives the kernel it launched waited for it (a synchronising call):
        # its end depends on the launch's last warp
        if len(hrows):
            lidx = pd.Index(luniq).get_indexer(launch_key(rank[hrows], launch[hrows]))
            ok = lidx >= 0
            hr, li = hrows[ok], lidx[ok]
            sync = (end[hr] >= l_end[li]) & (begin[hr] < l_end[li]) & (l_endpt[li] >= 0)
            hr, li = hr[sync], li[sync]
            if len(hr):
                # several launches may end one host span: the latest kernel end is the release
                o = np.lexsort((l_end[li], row_pe[hr]))
                last = np.r_[row_pe[hr][o][1:] != row_pe[hr][o][:-1], True]
                hr, li = hr[o][last], li[o][last]
                pe_h = row_pe[hr]
                src[pe_h] = l_endpt[li]
                rel_t[pe_h] = l_end[li]
                host_sync_pe, host_sync_pb, host_sync_rel = pe_h, row_pb[hr], l_end[li]
                _set_wait_durations(d, pt_t, host_sync_pb, host_sync_pe, host_sync_rel)

    # latency from the release to the point, and which edge binds in recorded time
    has_src = src >= 0
    lat = np.where(has_src, pt_t - rel_t, 0)
    wait_begin = _wait_begin_time(P, pt_t, iv_pb, iv_pe, iv_kind)
    wait_begin[host_sync_pe] = pt_t[host_sync_pb]
    binding = has_src & np.where(is_first, True, rel_t > wait_begin)

    return Graph(
        t0=t0, pt_t=pt_t, pt_lane=pt_lane, seg_kind=seg_kind, seg_phase=seg_phase,
        seg_owner=seg_owner, d=d, src=src, lat=lat, binding=binding,
        lane_first=lane_first, lane_last=lane_last, lane=lane, phase_names=phase_names,
        iv_row=iv_row, iv_phase=iv_phase, iv_kind=iv_kind, iv_pb=iv_pb, iv_pe=iv_pe,
        iv_kernel=kernel_c[np.where(iv_row >= 0, iv_row, iv_arr_row)] if n_iv else np.zeros(0, np.int32),
        kernel_names=kernel_names,
        iv_launch=launch[np.where(iv_row >= 0, iv_row, iv_arr_row)].astype(np.int64) if n_iv else np.zeros(0, np.int64),
        row_pb=row_pb, row_pe=row_pe, arr_rows=arr_rows, arr_occ=arr_occ,
        occ_arr_row=occ_arr_row, occ_arr_pt=occ_arr_pt,
        occ_starts=occ_starts, bw_end_pt=bw_end_pt, bw_occ=bw_occ, bw_arr_row=bw_arr,
        prev_first_pt=prev_first_pt, prev_grp=prev_grp, prev_lat=prev_lat,
        prev_member_pt=prev_member_pt, prev_starts=prev_starts, sem=sem,
    )


def _wait_begin_time(P, pt_t, iv_pb, iv_pe, iv_kind) -> np.ndarray:
    """Per point: begin time of the wait / barrier wait ending there (else +inf)."""
    out = np.full(P, np.iinfo(np.int64).max, dtype=np.int64)
    w = np.flatnonzero((iv_kind == WAIT) | (iv_kind == BARRIER))
    out[iv_pe[w]] = pt_t[iv_pb[w]]
    return out


def _set_wait_durations(d, pt_t, pb, pe, rel_t):
    """Pieces of a wait before its release shrink to nothing in the recurrence; after it they keep
    their recorded length (the polling / propagation latency)."""
    # pieces of one wait are the points pb+1 .. pe; usually just pe
    span = pe - pb
    multi = span > 1
    if np.any(multi):
        idx = np.repeat(pb[multi], span[multi]) + (np.arange(span[multi].sum()) - np.repeat(np.cumsum(span[multi]) - span[multi], span[multi])) + 1
        r = np.repeat(rel_t[multi], span[multi])
        pbt = pt_t[idx - 1]
        d[idx] = np.maximum(0, pt_t[idx] - np.maximum(pbt, r))
    single = ~multi & (span == 1)
    d[pe[single]] = np.maximum(0, pt_t[pe[single]] - np.maximum(pt_t[pb[single]], rel_t[single]))


def occurrence_keys(rows, sem, phase_names, phase_c, kernel_c, rank, it, launch, block, payload) -> np.ndarray:
    """Key of the barrier occurrence each arrive/depart row belongs to (scope-dependent)."""
    scope_of = np.array([{"block": 0, "grid": 1, "rank": 2}[sem.scope(p)] for p in phase_names], dtype=np.int64)
    sc = scope_of[phase_c[rows]]
    r = np.where(sc == 2, -1, rank[rows])
    lch = np.where(sc == 2, -1, launch[rows])
    blk = np.where(sc == 0, block[rows], -1)
    cols = [phase_c[rows].astype(np.int64), kernel_c[rows].astype(np.int64), it[rows] - it.min(),
            r - rank.min() + 1, lch - min(launch.min(), 0) + 1, blk + 1, payload[rows] - payload[rows].min()]
    return pack(cols)


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

    def k_of(x):                                          # the target at or before point x, same lane
        return np.searchsorted(tgt, x, side="right") - 1

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
    kx = k_of(np.arange(P))
    return T[kx] + S - S[tgt[kx]]


def segment_durations(g: Graph) -> np.ndarray:
    """Length of each point's incoming segment (0 at a lane's first point: the launch pseudo-segment).
    Computed once per graph (read-only)."""
    dur = g.derived.get("dur")
    if dur is None:
        dur = np.zeros(g.n_points, np.int64)
        if g.n_points:
            np.subtract(g.pt_t[1:], g.pt_t[:-1], out=dur[1:])
            dur[g.lane_first] = 0
        dur.flags.writeable = False
        g.derived["dur"] = dur
    return dur


def cum_work(g: Graph) -> np.ndarray:
    """Running total of 'work' segment time over all points (differences within a lane are the
    lane's busy time between two points). Computed once per graph."""
    c = g.derived.get("cum_work")
    if c is None:
        c = np.cumsum(np.where(g.seg_kind == WORK, segment_durations(g), 0))
        c.flags.writeable = False
        g.derived["cum_work"] = c
    return c


def lane_sums(g: Graph, kinds, dur: np.ndarray | None = None) -> np.ndarray:
    """Per lane: total time of the segments whose kind is in `kinds`."""
    dur = segment_durations(g) if dur is None else dur
    sel = np.isin(g.seg_kind, kinds) & (dur > 0)
    return np.bincount(g.pt_lane[sel], weights=dur[sel], minlength=len(g.lane)).astype(np.int64)


def ranges(values) -> str:
    """Compress sorted ints into '0–3, 7, 9–12' (en dash, as the viewer prints it)."""
    v = sorted(set(int(x) for x in values))
    if not v:
        return ""
    out, start, prev = [], v[0], v[0]
    for x in v[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}" if start == prev else f"{start}–{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out)
