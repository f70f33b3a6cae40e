"""The graph build's per-lane passes as compiled loops (optional: numba, the `fast` extra).

points.points, points.owners and edges.wait_durations call these when the process can run them
(`enabled()`: an ahead-of-time build on disk, or numba to make one, profiler/aot.py) and keep their
numpy code as the fallback; tests/analysis/test_graph_fast.py holds both paths equal, array for
array, on random tables and on the bundled runs.

Why: the numpy build of a 2.5 M-event chunk spends ~0.65 s CPU over ~15 steps (benchmarks/NOTES.md,
"Issue 31: the graph build"); the points' argsort of 2n keys, owners' per-level painting and the
wait durations' repeat/arange index arithmetic each read every point or interval several times.
Here each is one pass: rows come grouped by lane and sorted by begin (the decoder's region order),
so the points are a merge of the begins with the ends sorted by an n-key argsort; owners paints
every level in one loop after a counting sort by level.

The loops allocate nothing (the callers pass their outputs and scratch), so the AOT module needs no
numba runtime; index arrays are int32 (keys.index_dtype below 2^31 items): beyond that the numpy
path runs.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import aot

_MODULE = "_epscope_graph_aot"
ENGINE = "auto"   # "auto": compiled where available; "numpy": the fallback (tests set it)


def _begins_sorted(lane_id, b_rel):
    """Rows sorted by (lane, begin)? (then the begins need no sort)"""
    for i in range(1, lane_id.shape[0]):
        if lane_id[i] < lane_id[i - 1] or (lane_id[i] == lane_id[i - 1] and b_rel[i] < b_rel[i - 1]):
            return False
    return True


def _merge_points(lane_id, b_rel, e_rel, ob, oe, tb, t0, pt_t, pt_lane, row_pb, row_pe, lane_count):
    """Unique (lane, t) of the begins (in order ob, or row order when ob is empty) merged with the
    ends (in order oe), both sorted by (lane, t): the points in pt_t / pt_lane, each row's begin and
    end point in row_pb / row_pe, the points of each lane counted in lane_count; returns the number
    of points. The key (lane << tb) | t orders as points.points' does (t < 2^tb)."""
    n = lane_id.shape[0]
    mask = (np.int64(1) << tb) - 1
    i = j = 0
    p = -1
    last = np.int64(-1)
    rb = re = 0
    kb = ke = np.int64(-1)
    while i < n or j < n:
        if i < n:
            rb = ob[i] if ob.shape[0] else i
            kb = (lane_id[rb] << tb) | b_rel[rb]
        if j < n:
            re = oe[j]
            ke = (lane_id[re] << tb) | e_rel[re]
        take_begin = i < n and (j >= n or kb <= ke)
        k = kb if take_begin else ke
        if p < 0 or k != last:
            p += 1
            last = k
            pt_t[p] = (k & mask) + t0
            pt_lane[p] = k >> tb
            lane_count[k >> tb] += 1
        if take_begin:
            row_pb[rb] = p
            i += 1
        else:
            row_pe[re] = p
            j += 1
    return p + 1


def _owners(order, iv_pb, iv_pe, P, act, dep, eff, last, cnt, bucket, owner):
    """points.owners in one pass over the intervals in (begin, -end) order, then a counting sort by
    level and one painting loop (shallow levels first, so deeper ones overwrite them). Scratch:
    act (P + 1), dep / eff / bucket (n_iv), last / cnt (n_iv + 2), all int64, act and cnt zeroed,
    last filled with -1."""
    n_iv = order.shape[0]
    for j in range(n_iv):   # active_before: begun before k minus ended at or before k, as prefix sums
        act[iv_pb[j] + 1] += 1
        act[iv_pe[j]] -= 1
    for k in range(1, P + 1):
        act[k] += act[k - 1]
    grp_first = 0
    top = 0
    for k in range(n_iv):
        j = order[k]
        b = iv_pb[j]
        if k > 0 and b != iv_pb[order[k - 1]]:
            grp_first = k
        lvl = max(act[b] + (k - grp_first), 0)   # nesting depth: active across b + longer ones at b
        dep[k] = lvl
        top = max(top, lvl)
        eff[k] = iv_pe[j]
        q = last[lvl]
        if q >= 0:   # the previous interval of this level ends at this begin at the latest
            eff[q] = min(eff[q], b)
        last[lvl] = k
        cnt[lvl + 1] += 1
    for lvl in range(1, top + 2):
        cnt[lvl] += cnt[lvl - 1]
    for k in range(n_iv):   # positions by level, in order within a level (stable)
        bucket[cnt[dep[k]]] = k
        cnt[dep[k]] += 1
    for m in range(n_iv):
        k = bucket[m]
        j = order[k]
        for p in range(iv_pb[j], eff[k]):
            owner[p] = j


def _wait_durations(d, pt_t, pb, pe, rel_t):
    """edges.wait_durations: d of the pieces pb+1 .. pe of each released wait; the waits of several
    pieces first, then those of one, as the numpy path writes them (a point two waits share keeps
    the later write)."""
    for single in (False, True):
        for w in range(pb.shape[0]):
            span = pe[w] - pb[w]
            if span < 1 or (span == 1) != single:
                continue
            for x in range(pb[w] + 1, pe[w] + 1):
                d[x] = max(0, pt_t[x] - max(pt_t[x - 1], rel_t[w]))


def _release_rows(phase_c, g_of_phase, n_g, host, arrive, depart, out_rows, out_g):
    """edges.wait_edges' releasing rows: those whose phase names release target g (g_of_phase, -1
    for none; a code of -1 reads the last entry, as numpy's indexing does) on a GPU lane and not a
    barrier's arrive / depart, grouped by target and in row order within one; returns their number
    (written while they fit the outputs: a first call with empty ones counts them). One pass per
    target (targets are few: the registry's release phases), nothing allocated."""
    n_ph = g_of_phase.shape[0]
    m = 0
    for g in range(n_g):
        for r in range(phase_c.shape[0]):
            c = phase_c[r]
            if g_of_phase[c if c >= 0 else c + n_ph] == g and not (host[r] or arrive[r] or depart[r]):
                if m < out_rows.shape[0]:
                    out_rows[m] = r
                    out_g[m] = g
                m += 1
    return m


def _wait_keys(rows, g, it, kc, rank, payload, from_rank, it_min, n_it, n_k, rmin, rmax, n_r, out):
    """edges.wait_edges' mixed-radix key of each row (group, iteration, kernel, rank from, rank to),
    -1 where a rank is out of range or the group is -1: one pass instead of ~15 array passes. A
    release goes from its rank to its payload's (from_rank), a wait from its payload's to its rank."""
    for m in range(rows.shape[0]):
        r = rows[m]
        if from_rank:
            rf, rt = np.int64(rank[r]), payload[r]
        else:
            rf, rt = payload[r], np.int64(rank[r])
        gg = g[m]
        if rf < rmin or rf > rmax or rt < rmin or rt > rmax or gg < 0:
            out[m] = -1
        else:
            out[m] = (((gg * n_it + (np.int64(it[r]) - it_min)) * n_k + kc[r]) * n_r + rf - rmin) * n_r + rt - rmin


_A = "{}[::1]".format
# the stored schema's rank / iteration widths (int16 / int32) and plain int64 (tables made in memory)
_KEY_VARIANTS = {(np.dtype(r), np.dtype(i)): f"wait_keys_{np.dtype(r).name}_{np.dtype(i).name}"
                 for r in (np.int16, np.int64) for i in (np.int32, np.int64)}
_EXPORTS = {
    "begins_sorted": (_begins_sorted, f"boolean({_A('int64')}, {_A('int64')})"),
    "merge_points": (_merge_points, "int64(" + ", ".join(
        [_A("int64")] * 5 + ["int64", "int64", _A("int64"), _A("int64"), _A("int32"), _A("int32"), _A("int64")]) + ")"),
    "owners": (_owners, "void(" + ", ".join(
        [_A("int64"), _A("int32"), _A("int32"), "int64"] + [_A("int64")] * 6 + [_A("int32")]) + ")"),
    "wait_durations": (_wait_durations, "void(" + ", ".join([_A("int64")] * 5) + ")"),
    "release_rows": (_release_rows, "int64(" + ", ".join([_A("int32"), _A("int64"), "int64"] + [_A("boolean")] * 3
                                                         + [_A("int64")] * 2) + ")"),
}
for (_r, _i), _name in _KEY_VARIANTS.items():
    _EXPORTS[_name] = (_wait_keys, "void(" + ", ".join([_A("int64"), _A("int64"), _A(_i.name), _A("int32"), _A(_r.name),
                                                        _A("int64"), "boolean"] + ["int64"] * 6 + [_A("int64")]) + ")")
_LOOPS = aot.Loops(_MODULE, Path(__file__), "graph", _EXPORTS, "the graph build's loops")


def _compiled() -> aot.Compiled:
    return _LOOPS.compiled()


def enabled() -> bool:
    """Run the compiled loops? (ENGINE "auto" and an AOT build on disk or numba to make one)"""
    return _LOOPS.enabled(ENGINE)


def _i64(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.int64)


def points(lane_id, b_rel, e_rel, tb: int, t0: int, n_lanes: int):
    """(pt_t, pt_lane, row_pb, row_pe, points per lane) as points.points computes them, or None
    where the index arrays would not be int32 (the numpy path then runs)."""
    n = len(lane_id)
    if 2 * n > np.iinfo(np.int32).max:
        return None
    c = _compiled()
    lane_id, b_rel, e_rel = _i64(lane_id), _i64(b_rel), _i64(e_rel)
    ob = np.zeros(0, np.int64)
    if not c.get("begins_sorted")(lane_id, b_rel):
        ob = np.argsort((lane_id << tb) | b_rel, kind="stable")
    ke = lane_id << tb
    ke |= e_rel
    oe = np.argsort(ke, kind="stable")   # ends of nested spans come out of order: timsort's runs
    del ke
    pt_t, pt_lane = np.empty(2 * n, np.int64), np.empty(2 * n, np.int64)
    row_pb, row_pe = np.empty(n, np.int32), np.empty(n, np.int32)
    count = np.zeros(n_lanes, np.int64)
    P = int(c.get("merge_points")(lane_id, b_rel, e_rel, ob, oe, np.int64(tb), np.int64(t0), pt_t, pt_lane,
                                  row_pb, row_pe, count))
    pt_t.resize(P, refcheck=False)        # in place: the unused tail goes back, no copy
    pt_lane.resize(P, refcheck=False)
    return pt_t, pt_lane, row_pb, row_pe, count


def owners(order, iv_pb, iv_pe, P: int):
    """points.owners' owner array from its (begin, -end) order, or None where the index arrays are
    not int32 (the numpy path then runs)."""
    n_iv = len(order)
    if iv_pb.dtype != np.int32 or iv_pe.dtype != np.int32 or n_iv > np.iinfo(np.int32).max:
        return None
    owner = np.full(P, -1, np.int32)
    last = np.full(n_iv + 2, -1, np.int64)
    scratch = [np.zeros(P + 1, np.int64)] + [np.empty(n_iv, np.int64) for _ in range(3)]
    _compiled().get("owners")(_i64(order), np.ascontiguousarray(iv_pb), np.ascontiguousarray(iv_pe), np.int64(P),
                              scratch[0], scratch[1], scratch[2], last, np.zeros(n_iv + 2, np.int64), scratch[3],
                              owner)
    return owner


def wait_durations(d, pt_t, pb, pe, rel_t) -> None:
    assert d.dtype == np.int64 and d.flags.c_contiguous and pt_t.dtype == np.int64, "d and pt_t: int64 in place"
    _compiled().get("wait_durations")(d, pt_t, _i64(pb), _i64(pe), _i64(rel_t))


def release_rows(phase_c, g_of_phase, n_g: int, host, arrive, depart):
    """(rows, target of each) as edges.wait_edges selects them: grouped by target, in row order."""
    f = _compiled().get("release_rows")
    args = (np.ascontiguousarray(phase_c, np.int32), _i64(g_of_phase), np.int64(n_g),
            *(np.ascontiguousarray(x, np.bool_) for x in (host, arrive, depart)))
    m = int(f(*args, np.zeros(0, np.int64), np.zeros(0, np.int64)))   # count first: no n-long outputs
    rows, g = np.empty(m, np.int64), np.empty(m, np.int64)
    assert f(*args, rows, g) == m
    return rows, g


def wait_keys(rows, g, t, from_rank: bool, radix: tuple):
    """edges.wait_edges' key of each row (see _wait_keys), or None for column widths without a
    compiled variant (the numpy path then runs). radix: (it_min, n_it, n_k, rmin, rmax, n_r)."""
    name = _KEY_VARIANTS.get((t.rank.dtype, t.it.dtype))
    if name is None or t.payload.dtype != np.int64 or t.kernel_c.dtype != np.int32:
        return None
    out = np.empty(len(rows), np.int64)
    _compiled().get(name)(_i64(rows), _i64(g), np.ascontiguousarray(t.it), np.ascontiguousarray(t.kernel_c),
                          np.ascontiguousarray(t.rank), np.ascontiguousarray(t.payload), from_rank,
                          *(np.int64(x) for x in radix), out)
    return out
