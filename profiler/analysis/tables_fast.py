"""The per-chunk tables' passes over points and intervals as compiled loops (optional: numba, the
`fast` extra).

profiler.analysis.lane_totals calls these when the process can run them (`enabled()`: an
ahead-of-time build on disk, or numba to make one, profiler/aot.py) and keeps its numpy code as the
fallback; tests/analysis/test_tables_fast.py holds both paths equal on random graphs and on the
bundled runs.

Why: the tables of a 2.5 M-event chunk (2.4 M points, 1.6 M intervals) read every point through a
kind mask, a duration and a bincount for each of the per-lane busy and wait sums, the busy time per
(lane, phase), and the waits before / after the occurrence's last entry; and every interval again
for the waits on a peer, the waits after entry and the work spans (issue 31: 0.56 s CPU a chunk
for all the tables). Here each is one pass that adds into per-lane arrays.

Sums are in int64 (the numpy path's are float64 bincounts of integral ns): equal to the bit while
they stay below 2**53 (profiler.analysis.exactsum); the passes return their total so the caller
can check that, and the numpy path runs where it fails. The loops allocate nothing (the callers
pass the zeroed outputs), so the AOT module needs no numba runtime.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import aot

_MODULE = "_epscope_tables_aot"
ENGINE = "auto"   # "auto": compiled where available; "numpy": the fallback (tests set it)


def _point_sums(pt_lane, seg_kind, seg_phase, dur, is_work, is_wait, nph, work, wait, work_lp):
    """Per lane: the time of its work segments (work) and of its wait / idle / barrier segments
    (wait); per (lane, phase): its work time (work_lp, phase >= 0). Returns the total time added."""
    tot = np.int64(0)
    for p in range(dur.shape[0]):
        d = dur[p]
        if d <= 0:
            continue
        k = seg_kind[p]
        lane = pt_lane[p]
        if is_work[k]:
            work[lane] += d
            tot += d
            ph = seg_phase[p]
            if ph >= 0:
                work_lp[lane * nph + ph] += d
        elif is_wait[k]:
            wait[lane] += d
            tot += d
    return tot


def _entry_sums(pt_t, pt_lane, seg_kind, seg_phase, dur, is_wait, cut, has_cut, nph1, before, after, before_lp):
    """Per lane: its wait segments' time before its occurrence's last entry (cut, where has_cut;
    all of it elsewhere) and after it; per (lane, phase + 1): the time before. Returns the total."""
    tot = np.int64(0)
    for p in range(dur.shape[0]):
        d = dur[p]
        if d <= 0 or not is_wait[seg_kind[p]]:
            continue
        lane = pt_lane[p]
        bf = d
        if has_cut[lane]:
            e = pt_t[p]
            m = e if e < cut[lane] else cut[lane]
            bf = m - (e - d)
            if bf < 0:
                bf = np.int64(0)
        before[lane] += bf
        after[lane] += d - bf
        tot += d
        if bf > 0:
            before_lp[lane * nph1 + seg_phase[p] + 1] += bf
    return tot


def _point_entry_sums(pt_t, pt_lane, seg_kind, seg_phase, dur, is_work, is_wait, nph, cut, has_cut, nph1, work,
                      wait, work_lp, before, after, before_lp, tots):
    """_point_sums and _entry_sums in one pass over the points (a chunk's tables ask for both, the
    time model's cut known first): the same sums; tots = [_point_sums' total, _entry_sums']."""
    t_pts = np.int64(0)
    t_ent = np.int64(0)
    for p in range(dur.shape[0]):
        d = dur[p]
        if d <= 0:
            continue
        k = seg_kind[p]
        lane = pt_lane[p]
        if is_work[k]:
            work[lane] += d
            t_pts += d
            ph = seg_phase[p]
            if ph >= 0:
                work_lp[lane * nph + ph] += d
        elif is_wait[k]:
            wait[lane] += d
            t_pts += d
            bf = d
            if has_cut[lane]:
                e = pt_t[p]
                m = e if e < cut[lane] else cut[lane]
                bf = m - (e - d)
                if bf < 0:
                    bf = np.int64(0)
            before[lane] += bf
            after[lane] += d - bf
            t_ent += d
            if bf > 0:
                before_lp[lane * nph1 + seg_phase[p] + 1] += bf
    tots[0] = t_pts
    tots[1] = t_ent


def _interval_sums(iv_pb, iv_pe, pt_t, pt_lane, peer, iv_kind, iv_row, iv_phase, work_k, nr, nph,
                   waited, spans, spans_lp):
    """Per (lane, peer): the time of the lane's waits on that peer (waited); per lane and per
    (lane, phase): its work spans (spans, spans_lp). Returns the total wait time added."""
    tot = np.int64(0)
    for i in range(iv_pb.shape[0]):
        lane = pt_lane[iv_pb[i]]
        if iv_kind[i] == work_k and iv_row[i] >= 0:
            spans[lane] += 1
            spans_lp[lane * nph + iv_phase[i]] += 1
        pr = peer[i]
        if pr >= 0:
            d = pt_t[iv_pe[i]] - pt_t[iv_pb[i]]
            waited[lane * nr + pr] += d
            tot += d if d >= 0 else -d
    return tot


def _held_sums(iv_pb, iv_pe, pt_t, pt_lane, peer, cut, has_cut, nr, held, held_n):
    """Per (lane, peer): the time of the lane's waits on that peer after its occurrence's last entry
    (cut; none where not has_cut), and how many waits had some. Returns the total time added."""
    tot = np.int64(0)
    for i in range(iv_pb.shape[0]):
        pr = peer[i]
        if pr < 0:
            continue
        lane = pt_lane[iv_pb[i]]
        if not has_cut[lane]:
            continue
        b = pt_t[iv_pb[i]]
        m = b if b > cut[lane] else cut[lane]
        a = pt_t[iv_pe[i]] - m
        if a > 0:
            held[lane * nr + pr] += a
            held_n[lane * nr + pr] += 1
            tot += a
    return tot


def _sample_sums(kind_c, kind_code, it, i0, kc, nk, pc, nph, by_phase, b, e, wait_ph, rank, launch, r0, n_rank, lo,
                 span, cut, has_cut, counts, sums, stats):
    """compare._mean_samples of the rows of kind `kind_code` in one pass: per (iteration - i0,
    kernel[, phase]) key (codes >= 0), the count and sum of end - begin, a wait a peer releases
    (wait_ph[phase]) cut at its (rank, launch)'s last entry (cut, where has_cut; a table of n_rank
    x span from (r0, lo)). stats: [sum of |value|, largest |begin| or |end|, rows of the kind]."""
    tot = np.int64(0)
    tmax = np.int64(0)
    n = np.int64(0)
    for r in range(kind_c.shape[0]):
        if kind_c[r] != kind_code:
            continue
        n += 1
        k = np.int64(kc[r])
        if k < 0:
            continue
        bb = np.int64(b[r])
        ee = np.int64(e[r])
        v = ee - bb
        key = (np.int64(it[r]) - i0) * nk + k
        if by_phase:
            ph = np.int64(pc[r])
            if ph < 0:
                continue
            key = key * nph + ph
            if wait_ph[ph]:
                ri = np.int64(rank[r]) - r0
                li = np.int64(launch[r]) - lo
                if ri >= 0 and ri < n_rank and li >= 0 and li < span and has_cut[ri * span + li]:
                    c = cut[ri * span + li]
                    c = bb if c < bb else c
                    c = ee if c > ee else c
                    v = ee - c
        counts[key] += 1
        sums[key] += v
        tot += v if v >= 0 else -v
        tmax = max(tmax, bb if bb >= 0 else -bb, ee if ee >= 0 else -ee)
    stats[0] = tot
    stats[1] = tmax
    stats[2] = n


def _path_walk(ends, ends_it, binding, src, lane_first, pt_lane, lane_it, mark, out_p, out_it):
    """path_walk.path_points' walk: from each end back along the binding predecessors (the cross
    edge where binding, else the lane's previous point) while the point is of the end's iteration;
    a cross edge back to a point of the same chain (equal timestamps) falls back to the lane's
    previous point. Each chain written earliest first into out_p / out_it; returns their length.
    mark: zeroed scratch, one per point."""
    m = 0
    for c in range(ends.shape[0]):
        p = np.int64(ends[c])
        i = ends_it[c]
        start = m
        stamp = c + 1
        while p >= 0 and lane_it[pt_lane[p]] == i:
            out_p[m] = p
            out_it[m] = i
            m += 1
            mark[p] = stamp
            first = lane_first[pt_lane[p]] == p
            if binding[p]:
                q = np.int64(src[p])
            elif first:
                q = np.int64(-1)
            else:
                q = p - 1
            if q >= 0 and mark[q] == stamp:
                q = np.int64(-1) if first else p - 1
            p = q
        a, b = start, m - 1
        while a < b:
            out_p[a], out_p[b] = out_p[b], out_p[a]
            a += 1
            b -= 1
    return m


def _work_between(seg_kind, dur, work_k, start, end, out):
    """Per pair: the work time of the points in (start, end] (negated where end < start), as the
    difference of graph.cum_work at end and start."""
    for i in range(start.shape[0]):
        a, b = start[i], end[i]
        lo, hi = (a, b) if a <= b else (b, a)
        w = np.int64(0)
        for p in range(lo + 1, hi + 1):
            if seg_kind[p] == work_k:
                w += dur[p]
        out[i] = w if a <= b else -w


def _seen(values, lo, seen):
    """seen[v - lo] = True for every value v (each within lo .. lo + len(seen) - 1)."""
    for i in range(values.shape[0]):
        seen[np.int64(values[i]) - lo] = True


def _wait_peers(iv_kind, iv_row, iv_arr_row, iv_phase, wait_k, peer_wait, payload, rank_ok, rmin, row_rank, out):
    """peers.interval_peers' pass over the intervals (out holds the barrier waits' peers already):
    a wait a peer releases (peer_wait[phase]) waited on the rank its payload names, when that is a
    rank of the graph (rank_ok[rank - rmin]); then a peer equal to the interval's own rank is none."""
    n_rows = row_rank.shape[0]
    for i in range(iv_kind.shape[0]):
        r = np.int64(iv_row[i])
        ph = np.int64(iv_phase[i])
        if ph < 0:
            ph += peer_wait.shape[0]   # as numpy indexes with a negative code
        if iv_kind[i] == wait_k and r >= 0 and peer_wait[ph]:
            p = payload[r] - rmin
            if p >= 0 and p < rank_ok.shape[0] and rank_ok[p]:
                out[i] = payload[r]
        if r < 0:
            r = np.int64(iv_arr_row[i])
            if r < 0:
                r += n_rows        # as numpy indexes with -1: the last row
        if out[i] == row_rank[r]:
            out[i] = -1


_A = "{}[::1]".format
_I64, _I32, _I8, _B = _A("int64"), _A("int32"), _A("int8"), _A("boolean")
_EXPORTS = {
    "point_sums": (_point_sums, f"int64({_I64}, {_I8}, {_I32}, {_I64}, {_B}, {_B}, int64, {_I64}, {_I64}, {_I64})"),
    "point_entry_sums": (_point_entry_sums, f"void({_I64}, {_I64}, {_I8}, {_I32}, {_I64}, {_B}, {_B}, int64, {_I64}, "
                                            f"{_B}, int64, {_I64}, {_I64}, {_I64}, {_I64}, {_I64}, {_I64}, {_I64})"),
    "entry_sums": (_entry_sums, f"int64({_I64}, {_I64}, {_I8}, {_I32}, {_I64}, {_B}, {_I64}, {_B}, int64, "
                                f"{_I64}, {_I64}, {_I64})"),
    "interval_sums": (_interval_sums, f"int64({_I32}, {_I32}, {_I64}, {_I64}, {_I64}, {_I8}, {_I32}, {_I32}, "
                                      f"int64, int64, int64, {_I64}, {_I64}, {_I64})"),
    "held_sums": (_held_sums, f"int64({_I32}, {_I32}, {_I64}, {_I64}, {_I64}, {_I64}, {_B}, int64, {_I64}, {_I64})"),
}
# the event columns' widths: the stored schema's (codes int8, iteration and launch int32, rank
# int16) and plain int64 (anything else is widened to it)
SAMPLE_VARIANTS = {w: f"sample_sums_{w}" for w in ("stored", "wide")}
for _w, (_c, _it, _rk, _la) in {"stored": ("int8", "int32", "int16", "int32"),
                                "wide": ("int64", "int64", "int64", "int64")}.items():
    _EXPORTS[SAMPLE_VARIANTS[_w]] = (_sample_sums, "void(" + ", ".join(
        [_A(_c), "int64", _A(_it), "int64", _A(_c), "int64", _A(_c), "int64", "boolean", _I64, _I64, _B, _A(_rk),
         _A(_la), "int64", "int64", "int64", "int64", _I64, _B, _I64, _I64, _I64]) + ")")
_EXPORTS["path_walk"] = (_path_walk, "int64(" + ", ".join(
    [_I64, _I64, _B, _I32, _I64, _I64, _I32, _I64, _I64, _I64]) + ")")
_EXPORTS["work_between"] = (_work_between, f"void({_I8}, {_I64}, int64, {_I64}, {_I64}, {_I64})")
SEEN_VARIANTS = {np.dtype(t): f"seen_{t}" for t in ("int8", "int16", "int32", "int64")}
for _t, _name in SEEN_VARIANTS.items():
    _EXPORTS[_name] = (_seen, f"void({_A(_t.name)}, int64, {_B})")
PEER_VARIANTS = {np.dtype(t): f"wait_peers_{t}" for t in ("int16", "int32", "int64")}
for _t, _name in PEER_VARIANTS.items():
    _EXPORTS[_name] = (_wait_peers, "void(" + ", ".join(
        [_I8, _I32, _I32, _I32, "int64", _B, _I64, _B, "int64", _A(_t.name), _I64]) + ")")
_LOOPS = aot.Loops(_MODULE, Path(__file__), "tables", _EXPORTS, "the chunk tables' loops")


def enabled() -> bool:
    """Run the compiled loops? (ENGINE "auto" and an AOT build on disk or numba to make one)"""
    return _LOOPS.enabled(ENGINE)


def run(name: str, *args) -> int:
    """The compiled loop `name` on args (already of its signature's dtypes, contiguous)."""
    return int(_LOOPS.compiled().get(name)(*args))


def run_void(name: str, *args) -> None:
    """The compiled loop `name` (returning nothing) on args."""
    _LOOPS.compiled().get(name)(*args)
