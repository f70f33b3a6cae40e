"""The graph build's per-row, per-lane and per-point passes as compiled loops (optional: numba, the
`fast` extra).

Every step of graph._build calls these when the process can run them (`enabled()`: an
ahead-of-time build on disk, or numba to make one, profiler/aot.py) and keeps its numpy code as the
fallback: lanes.table (kind masks, each kind's phases counted), lanes.lanes (the lane key as runs of
equal keys), intervals.intervals, points.points (begins in the lanes' order, ends by an insertion
sort, one merge), points.owners, points.segments, edges.wait_edges (release rows, keys, the writes
of the released waits), keys.asof_latest's probe, edges.wait_durations and edges.binding.
tests/analysis/test_graph_fast.py holds both paths equal, array for array, on random inputs, whole
random tables and the bundled runs.

Why: the numpy build of a 2.5 M-event chunk spent ~0.65 s CPU over ~15 steps (benchmarks/NOTES.md,
"Issue 31: the graph build"), each reading every row, point or interval several times (masks made
again per step, argsorts of keys that come near-sorted, gathers through index arrays); here each
step is one or two passes. Rows come grouped by lane and sorted by begin (the decoder's region
order, a launch's host row before its warps'), so the points are a merge of the begins with the
ends, which nested spans leave only a little out of order.

The loops allocate nothing (the callers pass their outputs and scratch), so the AOT module needs no
numba runtime; index arrays are int32 (keys.index_dtype below 2^31 items): beyond that, and for
column widths without a compiled variant, the numpy path runs.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import aot

_MODULE = "_epscope_graph_aot"
ENGINE = "auto"   # "auto": compiled where available; "numpy": the fallback (tests set it)
# the ends' insertion sort gives up past END_MOVES[0] moves a row + END_MOVES[1] (then an argsort:
# ~20 comparisons a row at 2.5 M rows; the 10 M run's chunks make 0.1-0.2 moves a row)
END_MOVES = (8, 4096)


def _begins_sorted(lane_id, begin):
    """Rows sorted by (lane, begin)? (then the begins need no sort)"""
    for i in range(1, lane_id.shape[0]):
        if lane_id[i] < lane_id[i - 1] or (lane_id[i] == lane_id[i - 1] and begin[i] < begin[i - 1]):
            return False
    return True


def _lane_runs(host_kind, rank, it, launch, block, warp, rmin, imin, lmin, nr, nl, nb, nw, is_host, run_start,
               run_key):
    """lanes.lanes' key of every row (the same mixed radix: a host row's (rank, iteration) after
    every GPU lane's (rank, launch, block, warp)) as runs of equal keys: the first row and key of
    each run, and each row's host flag (kind 'host' or block < 0); returns the number of runs."""
    m = 0
    prev = np.int64(0)
    for r in range(host_kind.shape[0]):
        h = host_kind[r] or block[r] < 0
        is_host[r] = h
        if h:
            k = (np.int64(it[r]) - imin + (np.int64(rank[r]) - rmin + nr) * nl) * nb * nw
        else:
            k = (((np.int64(launch[r]) - lmin + (np.int64(rank[r]) - rmin) * nl) * nb + np.int64(block[r]) + 1) * nw
                 + np.int64(warp[r]) + 1)
        if m == 0 or k != prev:
            run_start[m] = r
            run_key[m] = k
            m += 1
            prev = k
    return m


def _begins_sorted_by(order, lane_id, begin):
    """Rows taken in `order` (rows grouped by lane, in row order within one) sorted by (lane, begin)?"""
    for i in range(1, order.shape[0]):
        r, q = order[i], order[i - 1]
        if lane_id[r] < lane_id[q] or (lane_id[r] == lane_id[q] and begin[r] < begin[q]):
            return False
    return True


def _ends_order(ob, lane_id, end, t0, tb, oe, budget):
    """The rows sorted by (lane, end) into oe, by an insertion sort from the begins' order (ob, or
    row order when empty): a lane's ends come near-sorted (nested spans end before their parent), so
    the moves are few; gives up (False) past `budget` moves, and the caller sorts. Rows of equal
    (lane, end) may come in another order than a stable sort's: they share one point, whatever the
    order (merge_points)."""
    n = oe.shape[0]
    moves = 0
    for j in range(n):
        r = ob[j] if ob.shape[0] else j
        k = (lane_id[r] << tb) | (end[r] - t0)
        i = j
        while i > 0:
            q = oe[i - 1]
            if ((lane_id[q] << tb) | (end[q] - t0)) <= k:
                break
            oe[i] = q
            i -= 1
        moves += j - i
        if moves > budget:
            return False
        oe[i] = r
    return True


def _merge_points(lane_id, begin, end, ob, oe, tb, t0, pt_t, pt_lane, row_pb, row_pe, lane_count):
    """Unique (lane, t) of the begins (in order ob, or row order when ob is empty) merged with the
    ends (in order oe), both sorted by (lane, t): the points in pt_t / pt_lane, each row's begin and
    end point in row_pb / row_pe, the points of each lane counted in lane_count; returns the number
    of points. The key (lane << tb) | t orders as points.points' does (t < 2^tb, keys < 2^62: an
    exhausted side reads as the int64 maximum, and each side's key is made once a row)."""
    n = lane_id.shape[0]
    mask = (np.int64(1) << tb) - 1
    done = np.int64(0x7FFFFFFFFFFFFFFF)
    p = -1
    last = np.int64(-1)
    i = j = 0
    rb = re = 0
    kb = ke = done
    if n > 0:
        rb = ob[0] if ob.shape[0] else 0
        kb = (lane_id[rb] << tb) | (begin[rb] - t0)
        re = oe[0]
        ke = (lane_id[re] << tb) | (end[re] - t0)
    for _ in range(2 * n):
        k = kb if kb <= ke else ke
        if p < 0 or k != last:
            p += 1
            last = k
            pt_t[p] = (k & mask) + t0
            pt_lane[p] = k >> tb
            lane_count[k >> tb] += 1
        if kb <= ke:
            row_pb[rb] = p
            i += 1
            if i < n:
                rb = ob[i] if ob.shape[0] else i
                kb = (lane_id[rb] << tb) | (begin[rb] - t0)
            else:
                kb = done
        else:
            row_pe[re] = p
            j += 1
            if j < n:
                re = oe[j]
                ke = (lane_id[re] << tb) | (end[re] - t0)
            else:
                ke = done
    return p + 1


def _owners(order, iv_pb, iv_pe, P, act, dep, eff, last, cnt, bucket, owner):
    """points.owners in one pass over the intervals in (begin, -end) order, then a counting sort by
    level and one painting loop (shallow levels first, so deeper ones overwrite them). Scratch:
    act (P + 1), dep / eff / bucket (n_iv), last / cnt (n_iv + 2), all int32, act and cnt zeroed,
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


def _release_rows(phase_c, g_of_phase, n_g, host, arrive, depart, out_rows, out_g, cnt):
    """edges.wait_edges' releasing rows: those whose phase names release target g (g_of_phase, -1
    for none; a code of -1 reads the last entry, as numpy's indexing does) on a GPU lane and not a
    barrier's arrive / depart, grouped by target and in row order within one; returns their number.
    Two calls: with empty outputs it counts them per target into cnt (n_g + 1, zeroed); then, cnt
    kept, it writes each where its target's rows begin (a counting sort: two passes over the rows
    for any number of targets, nothing allocated)."""
    n_ph = g_of_phase.shape[0]
    if out_rows.shape[0] == 0:
        for r in range(phase_c.shape[0]):
            c = phase_c[r]
            g = g_of_phase[c if c >= 0 else c + n_ph]
            if g >= 0 and not (host[r] or arrive[r] or depart[r]):
                cnt[g + 1] += 1
        for g in range(n_g):
            cnt[g + 1] += cnt[g]
        return cnt[n_g]
    for r in range(phase_c.shape[0]):
        c = phase_c[r]
        g = g_of_phase[c if c >= 0 else c + n_ph]
        if g >= 0 and not (host[r] or arrive[r] or depart[r]):
            out_rows[cnt[g]] = r
            out_g[cnt[g]] = g
            cnt[g] += 1
    return out_rows.shape[0]


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


def _segments(owner, iv_kind, iv_phase, lane_first, pt_t, gap, launch, is_first, seg_owner, kind, phase, d):
    """points.segments in one pass: each point's incoming segment (owner of the segment before it,
    its kind and phase, its length), the 'launch' pseudo-segment of length 0 at a lane's first
    point; is_first (zeroed) gets the lanes' first points marked."""
    P = pt_t.shape[0]
    for lane in range(lane_first.shape[0]):
        if lane_first[lane] < P:
            is_first[lane_first[lane]] = True
    for p in range(P):
        first = is_first[p]
        o = -1 if p == 0 or first else owner[p - 1]
        seg_owner[p] = o
        if o >= 0:
            kind[p] = iv_kind[o]
            phase[p] = iv_phase[o]
        else:
            kind[p] = launch if first else gap
            phase[p] = -1
        d[p] = 0 if p == 0 or first else pt_t[p] - pt_t[p - 1]


def _binding(pt_t, src, rel_t, is_first, iv_kind, iv_pb, iv_pe, wait, barrier, hs_pb, hs_pe, wait_begin, lat,
             bind):
    """edges.binding in one pass over the intervals and one over the points; wait_begin: scratch of
    the points, filled with the int64 maximum (lat itself may be it: each point's is read before
    its lat is written)."""
    for j in range(iv_kind.shape[0]):   # in interval order, then the host syncs: the last write wins
        if iv_kind[j] == wait or iv_kind[j] == barrier:
            wait_begin[iv_pe[j]] = pt_t[iv_pb[j]]
    for i in range(hs_pe.shape[0]):
        wait_begin[hs_pe[i]] = pt_t[hs_pb[i]]
    for p in range(pt_t.shape[0]):
        if src[p] >= 0:
            wb = wait_begin[p]
            lat[p] = pt_t[p] - rel_t[p]
            bind[p] = is_first[p] or rel_t[p] > wb
        else:
            lat[p] = 0
            bind[p] = False


def _asof_probe(kr_s, order, cq, t_q, tb, tmin, hit):
    """keys.asof_latest's probe: for each query (code cq, time t_q), the release of the last sorted
    key kr_s <= (cq << tb) + t_q - tmin (order: the releases' sorted order) when its code is the
    query's, else -1. Queries come in ascending runs (a lane's waits on one peer): each search
    gallops forward from the previous one's position, a binary search of all where a run restarts
    (numpy's searchsorted of unsorted queries searched from scratch every time)."""
    n = kr_s.shape[0]
    pos = 0
    prev = np.int64(0)
    for j in range(cq.shape[0]):
        k = (cq[j] << tb) + t_q[j] - tmin
        if j == 0 or k < prev:
            lo, hi = 0, n
        else:   # kr_s[:pos] <= prev <= k: the answer is at pos or after, found by doubling steps
            lo, hi, step = pos, pos, 1
            while hi < n and kr_s[hi] <= k:
                lo = hi + 1
                hi = lo + step
                step *= 2
            hi = min(hi, n)
        while lo < hi:   # the first sorted key > k in [lo, hi)
            mid = (lo + hi) >> 1
            if kr_s[mid] <= k:
                lo = mid + 1
            else:
                hi = mid
        pos = lo
        prev = k
        # the release's code is its sorted key's high bits (t - tmin < 2^tb): read in order, not
        # through `order` (a gather of cr by it missed the cache on most queries)
        hit[j] = order[pos - 1] if pos > 0 and (kr_s[pos - 1] >> tb) == cq[j] else -1


def _wait_apply(wait_iv, hit, rel_rows, iv_pb, iv_pe, row_pe, end, src, rel_t, pb, pe, rel):
    """edges.wait_edges' writes for the waits its join released (hit >= 0, into rel_rows): the
    wait's end point gets the releasing row's end point and end time, in wait order (a point two waits
    end at keeps the later); the released waits' (begin point, end point, release time) go to pb /
    pe / rel for wait_durations. Returns their number."""
    m = 0
    for j in range(hit.shape[0]):
        h = hit[j]
        if h < 0:
            continue
        w = wait_iv[j]
        r = rel_rows[h]
        p_end = iv_pe[w]
        t = end[r]
        src[p_end] = row_pe[r]
        rel_t[p_end] = t
        pb[m] = iv_pb[w]
        pe[m] = p_end
        rel[m] = t
        m += 1
    return m


def _wait_release_count(phase_c, g_of_phase, host, arrive, depart, it, kc, rank, payload, it_min, n_it, n_k, rmin,
                        rmax, n_r, cnt, rel_k, rel_r):
    """edges.wait_edges' releases: the rows _release_rows selects (g: their target), keyed as
    _wait_keys keys them, less those keyed -1 (they match no wait); each one's key and row in row
    order (rel_k, rel_r), counted per key into cnt[key + 1] (zeroed). Returns their number."""
    n_ph = g_of_phase.shape[0]
    m = 0
    for r in range(phase_c.shape[0]):
        c = phase_c[r]
        g = g_of_phase[c if c >= 0 else c + n_ph]
        rf, rt = np.int64(rank[r]), payload[r]
        if g >= 0 and not (host[r] or arrive[r] or depart[r]) and rmin <= rf <= rmax and rmin <= rt <= rmax:
            k = (((g * n_it + (np.int64(it[r]) - it_min)) * n_k + kc[r]) * n_r + rf - rmin) * n_r + rt - rmin
            cnt[k + 1] += 1
            rel_k[m], rel_r[m] = k, r
            m += 1
    return m


def _wait_release_fill(rel_k, rel_r, end, row_pe, t0, tb, cnt, s_k, s_p):
    """_wait_release_count's releases grouped by key in row order (a counting sort): (key << tb) |
    (end - t0) (s_k) and their end point (s_p). Key k ends up at [cnt[k - 1], cnt[k]) (from 0 for
    k = 0); a stable sort of s_k then sorts each key's by time."""
    for k in range(cnt.shape[0] - 1):
        cnt[k + 1] += cnt[k]
    for i in range(s_k.shape[0]):
        k, r = rel_k[i], rel_r[i]
        s_k[cnt[k]] = (np.int64(k) << tb) | (end[r] - t0)
        s_p[cnt[k]] = row_pe[r]
        cnt[k] += 1


def _wait_probe(iv_kind, iv_unf, iv_row, iv_phase, tgt_of_phase, iv_pb, iv_pe, wait, it, kc, rank, payload, end,
                it_min, n_it, n_k, rmin, rmax, n_r, t0, tb, cnt, s_k, s_p, pt_t, src, rel_t, d, last, single_pe,
                single_rel):
    """edges.wait_edges' as-of join and writes over the sorted releases (s_k: (key << tb) | (end -
    t0), s_p: their end points, key k at [cnt[k - 1], cnt[k])): each wait interval the kernel ended
    (in interval order) takes the last release of its key at or before its end (galloping on from
    where the previous wait of its key stopped, last[k], -1 at first: a lane's waits on one peer
    come in order); its end point gets the release's end point (src) and time (rel_t), and
    wait_durations' d: the waits of several pieces at once, those of one after (single_pe /
    single_rel: scratch of the waits). Returns the waits released."""
    n_ph = tgt_of_phase.shape[0]
    m, n_single = 0, 0
    low = (np.int64(1) << tb) - 1
    for j in range(iv_kind.shape[0]):
        if iv_kind[j] != wait or iv_unf[j]:
            continue
        r, c = iv_row[j], iv_phase[j]
        g = tgt_of_phase[c if c >= 0 else c + n_ph]
        rf, rt = payload[r], np.int64(rank[r])
        if g < 0 or not (rmin <= rf <= rmax and rmin <= rt <= rmax):
            continue
        k = (((g * n_it + (np.int64(it[r]) - it_min)) * n_k + kc[r]) * n_r + rf - rmin) * n_r + rt - rmin
        q = (k << tb) | (end[r] - t0)
        first = cnt[k - 1] if k > 0 else 0
        lo, hi = first, cnt[k]
        p = last[k]
        if p >= 0 and (p == first or s_k[p - 1] <= q):   # s_k[first:p] <= q: gallop on from p
            a, b, step = p, p, 1
            while b < hi and s_k[b] <= q:
                a, b, step = b + 1, b + 1 + step, step * 2
            lo, hi = a, min(b, hi)
        while lo < hi:   # the first key > q
            mid = (lo + hi) >> 1
            if s_k[mid] <= q:
                lo = mid + 1
            else:
                hi = mid
        last[k] = lo
        if lo == first:   # no release of its key at or before its end
            continue
        p_end, t = iv_pe[j], (s_k[lo - 1] & low) + t0
        src[p_end] = s_p[lo - 1]
        rel_t[p_end] = t
        m += 1
        if p_end - iv_pb[j] > 1:
            for x in range(iv_pb[j] + 1, p_end + 1):
                d[x] = max(0, pt_t[x] - max(pt_t[x - 1], t))
        elif p_end - iv_pb[j] == 1:
            single_pe[n_single], single_rel[n_single] = p_end, t
            n_single += 1
    for i in range(n_single):
        x = single_pe[i]
        d[x] = max(0, pt_t[x] - max(pt_t[x - 1], single_rel[i]))
    return m


def _table_pass(kind8, slot_of_kind, phase_c, n_ph, begin, end, masks, pairs, bounds):
    """lanes.table's per-row columns in one pass: each event kind's mask (masks[slot], slot of
    EVENT_KINDS by kind code, -1 for a kind outside them), the rows of each (kind slot, phase code
    + 1) counted (which phases each kind uses: graph._build's undeclared-phase check), and the
    times' bounds (the time origin and width): bounds = [least begin, least end, largest end]."""
    bmin, emin, emax = begin[0], end[0], end[0]
    for r in range(kind8.shape[0]):
        s = slot_of_kind[kind8[r]] if kind8[r] >= 0 else -1
        if s >= 0:
            masks[s, r] = True
            pairs[s, phase_c[r] + 1] += 1   # a categorical's codes: -1 (missing) and up
        bmin = min(bmin, begin[r])
        emin = min(emin, end[r])
        emax = max(emax, end[r])
    bounds[0], bounds[1], bounds[2] = bmin, emin, emax


def _intervals_pass(span, host, begin, end, phase_c, kind_of_phase, host_kind, unfinished, kernel_c, launch, bw_arr,
                    bw_dep, barrier, span_rows, row, arr_row, phase, kind, unf, iv_kernel, iv_launch):
    """intervals.intervals' arrays in one pass over the rows: the spans (span or host rows of positive
    length) in row order, then the barrier waits (bw_arr / bw_dep); each interval's row (-1 for a
    barrier wait), arrival row (-1 for a span), phase, kind (per phase code, a code of -1 reading the
    last entry; host rows HOST), unfinished flag, kernel code and launch (graph.Graph's iv_kernel /
    iv_launch). The outputs hold at least spans + barrier waits; returns the number of spans."""
    n_ph = kind_of_phase.shape[0]
    m = 0
    for r in range(span.shape[0]):
        if (span[r] or host[r]) and end[r] > begin[r]:
            c = phase_c[r]
            span_rows[m] = r
            row[m] = r
            arr_row[m] = -1
            phase[m] = c
            kind[m] = host_kind if host[r] else kind_of_phase[c if c >= 0 else c + n_ph]
            unf[m] = unfinished[r]
            iv_kernel[m] = kernel_c[r]
            iv_launch[m] = launch[r]
            m += 1
    for i in range(bw_arr.shape[0]):
        a = bw_arr[i]
        row[m + i] = -1
        arr_row[m + i] = a
        phase[m + i] = phase_c[a]
        kind[m + i] = barrier
        unf[m + i] = unfinished[bw_dep[i]]
        iv_kernel[m + i] = kernel_c[a]
        iv_launch[m + i] = launch[a]
    return m


def _expand_runs(run_start, run_len, code, run_order, lane_id, by_lane):
    """lanes._from_runs' per-row arrays: each row's lane (its run's code) and, where run_order is
    not empty, the rows grouped by lane (the runs in run_order, each in row order)."""
    for k in range(run_start.shape[0]):
        for r in range(run_start[k], run_start[k] + run_len[k]):
            lane_id[r] = code[k]
    m = 0
    for i in range(run_order.shape[0]):
        k = run_order[i]
        for r in range(run_start[k], run_start[k] + run_len[k]):
            by_lane[m] = r
            m += 1


_A = "{}[::1]".format
# the stored schema's rank / iteration widths (int16 / int32) and plain int64 (tables made in memory)
_KEY_VARIANTS = {(np.dtype(r), np.dtype(i)): f"wait_keys_{np.dtype(r).name}_{np.dtype(i).name}"
                 for r in (np.int16, np.int64) for i in (np.int32, np.int64)}
_EXPORTS = {
    "begins_sorted": (_begins_sorted, f"boolean({_A('int64')}, {_A('int64')})"),
    "merge_points": (_merge_points, "int64(" + ", ".join(
        [_A("int64")] * 5 + ["int64", "int64", _A("int64"), _A("int64"), _A("int32"), _A("int32"), _A("int64")]) + ")"),
    "owners": (_owners, "void(" + ", ".join(
        [_A("int64"), _A("int32"), _A("int32"), "int64"] + [_A("int32")] * 7) + ")"),
    "wait_durations": (_wait_durations, "void(" + ", ".join([_A("int64")] * 5) + ")"),
    "release_rows": (_release_rows, "int64(" + ", ".join([_A("int32"), _A("int64"), "int64"] + [_A("boolean")] * 3
                                                         + [_A("int64")] * 3) + ")"),
}
for (_r, _i), _name in _KEY_VARIANTS.items():
    _EXPORTS[_name] = (_wait_keys, "void(" + ", ".join([_A("int64"), _A("int64"), _A(_i.name), _A("int32"), _A(_r.name),
                                                        _A("int64"), "boolean"] + ["int64"] * 6 + [_A("int64")]) + ")")
# lanes.lanes' columns (rank, iteration, launch, block, warp): the stored schema's widths, and int64
_LANE_VARIANTS = {tuple(np.dtype(x) for x in w): "lane_runs_" + "_".join(np.dtype(x).name for x in w)
                  for w in ((np.int16, np.int32, np.int32, np.int32, np.int16), (np.int64,) * 5)}
for _w, _name in _LANE_VARIANTS.items():
    _EXPORTS[_name] = (_lane_runs, "int64(" + ", ".join([_A("boolean")] + [_A(x.name) for x in _w] + ["int64"] * 7
                                                        + [_A("boolean"), _A("int64"), _A("int64")]) + ")")
_EXPORTS.update({
    "begins_sorted_by": (_begins_sorted_by, f"boolean({_A('int64')}, {_A('int64')}, {_A('int64')})"),
    "ends_order": (_ends_order, "boolean(" + ", ".join([_A("int64")] * 3 + ["int64", "int64", _A("int64"), "int64"]) + ")"),
    "segments": (_segments, "void(" + ", ".join([_A("int32"), _A("int8"), _A("int32"), _A("int64"), _A("int64"), "int64",
                                                 "int64", _A("boolean"), _A("int32"), _A("int8"), _A("int32"),
                                                 _A("int64")]) + ")"),
    "binding": (_binding, "void(" + ", ".join([_A("int64"), _A("int32"), _A("int64"), _A("boolean"), _A("int8"),
                                               _A("int32"), _A("int32"), "int64", "int64", _A("int64"), _A("int64"),
                                               _A("int64"), _A("int64"), _A("boolean")]) + ")"),
})
_EXPORTS["asof_probe"] = (_asof_probe, "void(" + ", ".join([_A("int64")] * 4 + ["int64", "int64", _A("int64")]) + ")")
_EXPORTS["wait_apply"] = (_wait_apply, "int64(" + ", ".join([_A("int64")] * 3 + [_A("int32")] * 3 + [_A("int64"), _A("int32")]
                                                              + [_A("int64")] * 4) + ")")
# edges.wait_edges' join (_wait_release_count, _wait_probe; _wait_release_fill has one): per (rank,
# iteration) width as _KEY_VARIANTS
_JOIN_VARIANTS = {k: v.replace("wait_keys_", "") for k, v in _KEY_VARIANTS.items()}
_RADIX = ["int64"] * 6
for (_r, _i), _name in _JOIN_VARIANTS.items():
    _cols = [_A(_i.name), _A("int32"), _A(_r.name), _A("int64")]     # it, kernel code, rank, payload
    _sel = [_A("int32"), _A("int64")] + [_A("boolean")] * 3 + _cols
    _EXPORTS["wait_release_count_" + _name] = (_wait_release_count, "int64(" + ", ".join(
        _sel + _RADIX + [_A("int64"), _A("int32"), _A("int32")]) + ")")
    _EXPORTS["wait_probe_" + _name] = (_wait_probe, "int64(" + ", ".join(
        [_A("int8"), _A("boolean"), _A("int32"), _A("int32"), _A("int64"), _A("int32"), _A("int32"), "int64"] + _cols
        + [_A("int64")] + _RADIX + ["int64", "int64", _A("int64"), _A("int64"), _A("int32"), _A("int64"), _A("int32"),
                                    _A("int64"), _A("int64"), _A("int64"), _A("int32"), _A("int64")]) + ")")
_EXPORTS["wait_release_fill"] = (_wait_release_fill, "void(" + ", ".join(
    [_A("int32"), _A("int32"), _A("int64"), _A("int32"), "int64", "int64", _A("int64"), _A("int64"), _A("int32")]) + ")")
_EXPORTS["table_pass"] = (_table_pass, "void(" + ", ".join([_A("int8"), _A("int64"), _A("int32"), "int64", _A("int64"),
                                                              _A("int64"), "boolean[:, ::1]", "int64[:, ::1]", _A("int64")]) + ")")
# intervals.intervals' launch column: the stored schema's int32 and int64
_IV_VARIANTS = {np.dtype(w): f"intervals_pass_{np.dtype(w).name}" for w in (np.int32, np.int64)}
for _w, _name in _IV_VARIANTS.items():
    _EXPORTS[_name] = (_intervals_pass, "int64(" + ", ".join(
        [_A("boolean")] * 2 + [_A("int64")] * 2 + [_A("int32"), _A("int8"), "int64", _A("boolean"), _A("int32"), _A(_w.name)]
        + [_A("int64")] * 2 + ["int64", _A("int64"), _A("int32"), _A("int32"), _A("int32"), _A("int8"), _A("boolean"),
                               _A("int32"), _A("int64")]) + ")")
_EXPORTS["expand_runs"] = (_expand_runs, "void(" + ", ".join([_A("int64")] * 6) + ")")
_LOOPS = aot.Loops(_MODULE, Path(__file__), "graph", _EXPORTS, "the graph build's loops")


def _compiled() -> aot.Compiled:
    return _LOOPS.compiled()


def enabled() -> bool:
    """Run the compiled loops? (ENGINE "auto" and an AOT build on disk or numba to make one)"""
    return _LOOPS.enabled(ENGINE)


def _i64(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.int64)


def points(lane_id, begin, end, tb: int, t0: int, n_lanes: int, by_lane=None):
    """(pt_t, pt_lane, row_pb, row_pe, points per lane) as points.points computes them from the
    absolute times (relative to t0 inside the loops), or None where the index arrays would not be
    int32 (the numpy path then runs). by_lane: the rows grouped by lane (lanes.Lanes.by_lane), None
    where row order is."""
    n = len(lane_id)
    if 2 * n > np.iinfo(np.int32).max:
        return None
    c = _compiled()
    lane_id, begin, end = _i64(lane_id), _i64(begin), _i64(end)
    ob = np.zeros(0, np.int64)
    if by_lane is not None:    # the begins are in order when each lane's rows are (the decoder's order)
        ob = _i64(by_lane)
        if not c.get("begins_sorted_by")(ob, lane_id, begin):
            ob = np.argsort((lane_id << tb) | (begin - t0), kind="stable")
    elif not c.get("begins_sorted")(lane_id, begin):
        ob = np.argsort((lane_id << tb) | (begin - t0), kind="stable")
    oe = np.empty(n, np.int64)
    budget = END_MOVES[0] * n + END_MOVES[1]
    if not c.get("ends_order")(ob, lane_id, end, np.int64(t0), np.int64(tb), oe, np.int64(budget)):
        ke = lane_id << tb                   # many spans end out of their begins' order: sort them
        ke |= end - t0
        oe = np.argsort(ke, kind="stable")
        del ke
    pt_t, pt_lane = np.empty(2 * n, np.int64), np.empty(2 * n, np.int64)
    row_pb, row_pe = np.empty(n, np.int32), np.empty(n, np.int32)
    count = np.zeros(n_lanes, np.int64)
    P = int(c.get("merge_points")(lane_id, begin, end, ob, oe, np.int64(tb), np.int64(t0), pt_t, pt_lane,
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
    last = np.full(n_iv + 2, -1, np.int32)
    # int32 scratch (counts, levels and points all fit: n_iv and P < 2^31): half the bytes to touch
    scratch = [np.zeros(P + 1, np.int32)] + [np.empty(n_iv, np.int32) for _ in range(3)]
    _compiled().get("owners")(_i64(order), np.ascontiguousarray(iv_pb), np.ascontiguousarray(iv_pe), np.int64(P),
                              scratch[0], scratch[1], scratch[2], last, np.zeros(n_iv + 2, np.int32), scratch[3],
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
    cnt = np.zeros(n_g + 1, np.int64)
    m = int(f(*args, np.zeros(0, np.int64), np.zeros(0, np.int64), cnt))   # count first: no n-long outputs
    rows, g = np.empty(m, np.int64), np.empty(m, np.int64)
    if m:
        f(*args, rows, g, cnt)
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


def lane_runs(t, consts: tuple):
    """(host flag of each row, first row and key of each run of equal lane keys) as lanes.lanes
    keys the rows, or None for column widths without a compiled variant (the numpy path then runs).
    consts: (rmin, imin, lmin, nr, nl, nb, nw)."""
    cols = (t.rank, t.it, t.launch, t.block, t.warp)
    name = _LANE_VARIANTS.get(tuple(c.dtype for c in cols))
    if name is None:
        return None
    n = len(t.rank)
    is_host = np.empty(n, np.bool_)
    start, key = np.empty(n, np.int64), np.empty(n, np.int64)   # pages past the runs are never touched
    m = int(_compiled().get(name)(np.ascontiguousarray(t.kind["host"], np.bool_), *(np.ascontiguousarray(c) for c in cols),
                                  *(np.int64(x) for x in consts), is_host, start, key))
    return is_host, start[:m].copy(), key[:m].copy()


def segments(owner, iv_kind, iv_phase, lane_first, pt_t, gap: int, launch: int):
    """(is_first, seg_owner, kind, phase, d) as points.segments computes them, or None where the
    owners are not int32 (the numpy path then runs)."""
    if owner.dtype != np.int32 or iv_kind.dtype != np.int8 or iv_phase.dtype != np.int32:
        return None
    P = len(pt_t)
    out = (np.zeros(P, np.bool_), np.empty(P, np.int32), np.empty(P, np.int8), np.empty(P, np.int32),
           np.empty(P, np.int64))
    _compiled().get("segments")(np.ascontiguousarray(owner), np.ascontiguousarray(iv_kind), np.ascontiguousarray(iv_phase),
                                _i64(lane_first), _i64(pt_t), np.int64(gap), np.int64(launch), *out)
    return out


def binding(pt_t, src, rel_t, is_first, iv_kind, iv_pb, iv_pe, kinds: tuple, hs_pb, hs_pe):
    """(lat, bind) as edges.binding computes them, or None where the index arrays are not int32.
    kinds: the (wait, barrier) interval kind codes."""
    if src.dtype != np.int32 or iv_pb.dtype != np.int32 or iv_pe.dtype != np.int32 or iv_kind.dtype != np.int8:
        return None
    P = len(pt_t)
    # lat is the wait begins' scratch too: no second array of the points (19 MB a 2.5 M-event chunk)
    lat, bind = np.full(P, np.iinfo(np.int64).max, np.int64), np.empty(P, np.bool_)
    _compiled().get("binding")(_i64(pt_t), np.ascontiguousarray(src), _i64(rel_t), np.ascontiguousarray(is_first, np.bool_),
                               np.ascontiguousarray(iv_kind), np.ascontiguousarray(iv_pb), np.ascontiguousarray(iv_pe),
                               *(np.int64(k) for k in kinds), _i64(hs_pb), _i64(hs_pe), lat, lat, bind)
    return lat, bind


def asof_probe(kr_sorted, order, cq, t_q, tb: int, tmin: int) -> np.ndarray:
    """keys.asof_latest's hits from its sorted release keys (see _asof_probe)."""
    hit = np.empty(len(cq), np.int64)
    _compiled().get("asof_probe")(_i64(kr_sorted), _i64(order), _i64(cq), _i64(t_q), np.int64(tb),
                                  np.int64(tmin), hit)
    return hit


def wait_apply(wait_iv, hit, rel_rows, iv_pb, iv_pe, row_pe, end, src, rel_t):
    """(begin point, end point, release time) of the released waits, src / rel_t written in place
    (see _wait_apply), or None where the index arrays are not int32."""
    if not (iv_pb.dtype == iv_pe.dtype == row_pe.dtype == src.dtype == np.int32) or rel_t.dtype != np.int64:
        return None
    out = tuple(np.empty(len(hit), np.int64) for _ in range(3))
    m = int(_compiled().get("wait_apply")(_i64(wait_iv), _i64(hit), _i64(rel_rows), np.ascontiguousarray(iv_pb),
                                          np.ascontiguousarray(iv_pe), np.ascontiguousarray(row_pe), _i64(end), src,
                                          rel_t, *out))
    return tuple(x[:m] for x in out)


def wait_join(t, host, iv, iv_pb, iv_pe, row_pe, pt_t, src, rel_t, d, g_of_phase, tgt_of_phase, radix: tuple,
              wait: int) -> bool:
    """edges.wait_edges' join and writes (src, rel_t, d in place): the releases counted and grouped
    by key in two compiled passes (one over the rows, one over the releases), sorted by (key, time) with one stable argsort (few runs: one per
    key and signalling lane), the waits joined and written in a third (see _wait_probe); or False
    where the widths or the key space do not fit (the numpy path then runs). g_of_phase /
    tgt_of_phase: the release target a row's phase is / a wait's phase waits for (-1 for none);
    radix: (it_min, n_it, n_k, rmin, rmax, n_r) of wait_keys."""
    name = _JOIN_VARIANTS.get((t.rank.dtype, t.it.dtype))
    it_min, n_it, n_k, rmin, rmax, n_r = radix
    n_keys = (max(int(g_of_phase.max(initial=-1)), int(tgt_of_phase.max(initial=-1))) + 1) * n_it * n_k * n_r * n_r
    ints = (iv.row, iv.phase, iv_pb, iv_pe, row_pe, src)
    if (name is None or any(x.dtype != np.int32 for x in ints) or iv.kind.dtype != np.int8
            or t.payload.dtype != np.int64 or t.kernel_c.dtype != np.int32 or t.phase_c.dtype != np.int32
            or rel_t.dtype != np.int64 or d.dtype != np.int64 or n_keys > max(t.n // 4, 1 << 16)
            or n_keys.bit_length() + t.tb > 62):
        return False
    c = _compiled()
    sel = (np.ascontiguousarray(t.phase_c), _i64(g_of_phase), np.ascontiguousarray(host, np.bool_),
           np.ascontiguousarray(t.kind["arrive"]), np.ascontiguousarray(t.kind["depart"]))
    cols = (np.ascontiguousarray(t.it), np.ascontiguousarray(t.kernel_c), np.ascontiguousarray(t.rank),
            np.ascontiguousarray(t.payload))
    rad = tuple(np.int64(x) for x in radix) + (np.int64(t.t0), np.int64(t.tb))
    cnt = np.zeros(n_keys + 1, np.int64)
    rel_k, rel_r = np.empty(t.n, np.int32), np.empty(t.n, np.int32)   # pages past the releases: never touched
    m = int(c.get("wait_release_count_" + name)(*sel, *cols, *rad[:6], cnt, rel_k, rel_r))
    s_k, s_p = np.empty(m, np.int64), np.empty(m, np.int32)
    c.get("wait_release_fill")(rel_k, rel_r, _i64(t.end), np.ascontiguousarray(row_pe), *rad[6:], cnt, s_k, s_p)
    del rel_k, rel_r
    order = np.argsort(s_k, kind="stable")
    s_k, s_p = s_k[order], s_p[order]
    del order
    n_iv = len(iv.kind)   # the waits' scratch: pages past the single-piece waits are never touched
    c.get("wait_probe_" + name)(iv.kind, np.ascontiguousarray(iv.unfinished, np.bool_), iv.row, iv.phase, _i64(tgt_of_phase),
                                iv_pb, iv_pe, np.int64(wait), *cols, _i64(t.end), *rad, cnt, s_k, s_p, _i64(pt_t), src,
                                rel_t, d, np.full(n_keys, -1, np.int64), np.empty(n_iv, np.int32), np.empty(n_iv, np.int64))
    return True


def table_pass(kind_codes, slot_of_kind, phase_c, n_ph: int, begin, end, n_slots: int):
    """(kind masks, rows per (kind slot, phase code + 1), time origin t0, largest end - t0) as
    lanes.table computes them (see _table_pass), or None where the kind codes are not int8 or there
    are no rows (the numpy path then runs)."""
    if kind_codes.dtype != np.int8 or phase_c.dtype != np.int32 or not len(kind_codes):
        return None
    masks = np.zeros((n_slots, len(kind_codes)), np.bool_)
    pairs = np.zeros((n_slots, n_ph + 1), np.int64)
    bounds = np.zeros(3, np.int64)
    _compiled().get("table_pass")(np.ascontiguousarray(kind_codes), _i64(slot_of_kind), np.ascontiguousarray(phase_c),
                                  np.int64(n_ph), _i64(begin), _i64(end), masks, pairs, bounds)
    t0 = int(min(bounds[0], bounds[1]))
    return masks, pairs, t0, int(bounds[2]) - t0


def intervals_pass(t, kind_of_phase, bw_arr, bw_dep, kinds: tuple):
    """(span rows, row, arr_row, phase, kind, unfinished, kernel code, launch) of every interval as
    intervals.intervals and graph._build compute them (see _intervals_pass), or None where the rows
    or the column widths do not fit its variants (the numpy path then runs). kinds: (HOST, BARRIER)."""
    name = _IV_VARIANTS.get(t.launch.dtype)
    if (name is None or t.n > np.iinfo(np.int32).max or t.phase_c.dtype != np.int32 or t.kernel_c.dtype != np.int32
            or t.begin.dtype != np.int64 or t.end.dtype != np.int64):
        return None
    cap = t.n + len(bw_arr)                  # pages past the intervals are never touched
    out = (np.empty(t.n, np.int64), np.empty(cap, np.int32), np.empty(cap, np.int32), np.empty(cap, np.int32),
           np.empty(cap, np.int8), np.empty(cap, np.bool_), np.empty(cap, np.int32), np.empty(cap, np.int64))
    K = t.kind
    m = int(_compiled().get(name)(np.ascontiguousarray(K["span"]), np.ascontiguousarray(K["host"]), t.begin, t.end,
                                  np.ascontiguousarray(t.phase_c), np.ascontiguousarray(kind_of_phase, np.int8),
                                  np.int64(kinds[0]), np.ascontiguousarray(t.unfinished, np.bool_),
                                  np.ascontiguousarray(t.kernel_c), np.ascontiguousarray(t.launch), _i64(bw_arr),
                                  _i64(bw_dep), np.int64(kinds[1]), *out))
    out[0].resize(m, refcheck=False)         # in place: the unused tails go back, no copy (as points)
    for x in out[1:]:
        x.resize(m + len(bw_arr), refcheck=False)
    return out


def expand_runs(run_start, run_len, code, run_order, n: int):
    """(lane of each row, rows grouped by lane or None where run_order is None): see _expand_runs."""
    lane_id = np.empty(n, np.int64)
    by_lane = np.empty(n if run_order is not None else 0, np.int64)
    _compiled().get("expand_runs")(_i64(run_start), _i64(run_len), _i64(code),
                                   _i64(run_order if run_order is not None else np.zeros(0, np.int64)), lane_id, by_lane)
    return lane_id, (by_lane if run_order is not None else None)
