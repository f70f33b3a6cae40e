"""The what-if's re-timing solver (retime._solve) as one compiled loop (optional: numba, the `fast` extra).

retime._solve calls `solve` when the process can run it (`enabled()`: an ahead-of-time build on disk,
or numba to make one, profiler/aot.py) and keeps its numpy code as the fallback;
tests/analysis/test_retime_fast.py holds both paths equal on random inputs and on every bundled
run's re-timing input.

The same algorithm as the numpy code, step for step: targets in `order`, in windows of `window`;
each window relaxed by Jacobi sweeps (every new value of a sweep computed from the times before the
sweep, then all assigned), at most `sweeps` of them, stopping at the first sweep that changes
nothing; a window that does not settle is halved (left half first, from the times its sweeps left).
Ties in recorded time make the order matter, so no other order (Gauss-Seidel, a topological pass)
would do. What differs is only the work:
- the targets are relabelled once into solving order (a target's constants gathered once, reading
  only those its sweeps will read), where numpy gathers them once a window and each sweep gathers
  the times of the dependencies across the whole chunk; the targets come in time order, interleaving
  the lanes, so these gathers are cache misses (the relabelling is ~40 of this loop's ~55 ms CPU
  on a 10 M run's chunk of 755 k targets, numpy's whole solve ~90 ms);
- numpy's sweep recomputes the maximum arrival of every barrier occurrence and every previous-launch
  group of the chunk (np.maximum.reduceat over all arrivals); here a sweep computes only those its
  window's targets read, once each per sweep (a stamp array), with reduceat's semantics (an empty or
  reversed range gives the element at its start).

The loops allocate nothing (the callers pass the outputs and the scratch), so the AOT module needs no
numba runtime. Arithmetic is int64 and wraps as numpy's does.

The same module makes the solver's input (issue 31: whatif.WhatIfInput.from_graph was 0.51 s of
`epscope analyze` at 10 M events): retime._prepare's arrays (`prepare`: a pass over the points, one
over the targets, a radix sort for their time order in place of np.lexsort), whatif's segments
(`segments`) and int32 narrowing in one pass (`narrow32`; for retime_input the fill writes the arrays it
would narrow as int32 at once, `_fill` with int32's bounds), and RetimeInput.solve's offsets
(`offsets`: a merge with the shortened points, not five searchsorted and a dozen array passes).
Each returns exactly the arrays its numpy code does (values and dtypes: the what-if inputs are stored
and compared byte for byte), or None where an input is outside what it handles, and the numpy code
runs; tests/analysis/test_retime_fast.py holds them equal on random graphs and every bundled run.
"""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import numpy as np

from .. import aot

_MODULE = "_epscope_retime_aot"
ENGINE = "auto"   # "auto": compiled where available; "numpy": the fallback (tests set it)
NEG = np.iinfo(np.int64).min // 4


def _solve(order, first, fixed, own_off, has_src, ks, src_off, occ_of_t, lat_bw, ak, aoff, occ_starts,
           grp_of_t, lat_pf, mk, moff, prev_starts, window, sweeps, neg, T, Tw, inv, perm, pkw, oow, ksw, sow, occw,
           lbw, grpw, lpw, fvw, fl, fq, v, stack, om, om_st, gm, gm_st):
    """retime._solve's loop over T (the recorded times on entry, the new ones on return). Scratch:
    Tw ... fvw (len(T) int64 each: twelve arrays, not one block of 12 x len(T), whose 72 MB at a 10 M-event
    run's chunk are past glibc's largest mmap threshold, so every solve faulted them in afresh: 13 ms of
    ~55 on that chunk), fl and fq (len(T)) uint8, v (window) int64, stack 2 * STACK int64; om / om_st one
    per occurrence, gm / gm_st one per group (stamps filled with -1). Returns the number of windows
    halved, or -1 where `order` repeats a target or an index lies outside its array (order, ks,
    occ_of_t and grp_of_t are checked here, in the passes that read them; the caller then runs
    numpy's code).

    The targets are relabelled once into solving order (position i: order[i], then the targets not
    solved): what a sweep reads of a target's own constants is then read in sequence, and its
    dependencies (near it in time) near it in memory; the sweeps themselves are numpy's."""
    nt = T.shape[0]
    n_solve = order.shape[0]
    bw = ak.shape[0] > 0
    pf = mk.shape[0] > 0
    n_occ = occ_starts.shape[0]
    n_grp = prev_starts.shape[0]
    for q in range(nt):               # in target order (sequential): the checks, the flags packed
        k = ks[q]
        if k < -1 or k >= nt:
            return -1
        if bw and (occ_of_t[q] < -1 or occ_of_t[q] >= n_occ):
            return -1
        if pf and (grp_of_t[q] < -1 or grp_of_t[q] >= n_grp):
            return -1
        if fixed[q]:
            fq[q] = 2
        else:
            fq[q] = (1 if first[q] else 0) | (4 if has_src[q] else 0)
        inv[q] = -1
    for i in range(n_solve):
        q = order[i]
        if q < 0 or q >= nt or inv[q] >= 0:
            return -1
        inv[q] = i
        perm[i] = q
    r = n_solve
    for q in range(nt):
        if inv[q] < 0:
            inv[q] = r
            perm[r] = q
            r += 1
    for i in range(nt):
        p = perm[i]
        Tw[i] = T[p]
    for i in range(n_solve):          # read only what the sweeps will read: fewer cache misses
        p = perm[i]
        f = fq[p]
        fl[i] = f
        if f & 2:
            fvw[i] = Tw[i]
            continue
        if not f & 1:
            pkw[i] = inv[p - 1 if p > 0 else 0]
            oow[i] = own_off[p]
        if f & 4:
            k = ks[p]
            ksw[i] = inv[max(0, k)]
            sow[i] = src_off[p]
        occw[i] = -1
        grpw[i] = -1
    # departures and a launch's first points after a previous one are few (8 k and 4 k of 755 k
    # targets at 10 M events): scattered from a sequential pass, not gathered for every target
    for q in range(nt if bw else 0):
        o = occ_of_t[q]
        i = inv[q]
        if o >= 0 and i < n_solve and not fq[q] & 2:
            occw[i] = o
            lbw[i] = lat_bw[q]
    for q in range(nt if pf else 0):
        o = grp_of_t[q]
        i = inv[q]
        if o >= 0 and i < n_solve and not fq[q] & 2:
            grpw[i] = o
            lpw[i] = lat_pf[q]
    stamp = np.int64(0)
    halved = np.int64(0)
    for lo0 in range(0, n_solve, window):
        stack[0] = lo0
        stack[1] = min(lo0 + window, n_solve)
        sp = 1
        while sp > 0:
            sp -= 1
            lo = stack[2 * sp]
            hi = stack[2 * sp + 1]
            settled = False
            for _ in range(sweeps):
                stamp += 1
                same = True
                for i in range(lo, hi):
                    f = fl[i]
                    if f & 2:
                        x = fvw[i]
                    else:
                        if f & 1:
                            x = neg
                        else:
                            x = Tw[pkw[i]] + oow[i]
                        if f & 4:
                            y = Tw[ksw[i]] + sow[i]
                            x = max(x, y)
                        if bw and occw[i] >= 0:
                            o = occw[i]
                            if om_st[o] != stamp:     # reduceat's maximum of occurrence o, once a sweep
                                s = occ_starts[o]
                                e = occ_starts[o + 1] if o + 1 < occ_starts.shape[0] else ak.shape[0]
                                if e <= s:            # reduceat: an empty or reversed range gives a[s]
                                    e = s + 1
                                m = Tw[inv[ak[s]]] + aoff[s]
                                for j in range(s + 1, e):
                                    z = Tw[inv[ak[j]]] + aoff[j]
                                    m = max(m, z)
                                om[o] = m
                                om_st[o] = stamp
                            y = om[o] + lbw[i]
                            x = max(x, y)
                        if pf and grpw[i] >= 0:
                            o = grpw[i]
                            if gm_st[o] != stamp:     # the same, of previous-launch group o
                                s = prev_starts[o]
                                e = prev_starts[o + 1] if o + 1 < prev_starts.shape[0] else mk.shape[0]
                                if e <= s:
                                    e = s + 1
                                m = Tw[inv[mk[s]]] + moff[s]
                                for j in range(s + 1, e):
                                    z = Tw[inv[mk[j]]] + moff[j]
                                    m = max(m, z)
                                gm[o] = m
                                gm_st[o] = stamp
                            y = gm[o] + lpw[i]
                            x = max(x, y)
                    v[i - lo] = x
                    if x != Tw[i]:            # the sweep's comparison, made as it goes
                        same = False
                if same:
                    settled = True
                    break
                for i in range(lo, hi):
                    Tw[i] = v[i - lo]
            if settled or hi - lo == 1:
                continue
            halved += 1
            mid = (lo + hi) // 2
            stack[2 * sp] = mid            # popped second: the right half
            stack[2 * sp + 1] = hi
            stack[2 * sp + 2] = lo
            stack[2 * sp + 3] = mid
            sp += 2
    for i in range(n_solve):
        T[perm[i]] = Tw[i]
    return halved


def _mark(lane_first, bw_end_pt, prev_first_pt, d, src, fl, S, kx):
    """retime._prepare's pass over the points: fl (uint8, len(d)) gets bit 1 at a lane's first point,
    2 at a barrier departure, 4 at a lane's first point after a previous launch, 8 at a target (any
    of those or a cross source); S the prefix sums of d with a lane's first point counted 0; kx the
    target at or before each point (-1 before the first). Returns the number of targets."""
    P = fl.shape[0]
    for p in range(P):
        fl[p] = 0
    for j in range(lane_first.shape[0]):
        fl[lane_first[j]] |= 1
    for j in range(bw_end_pt.shape[0]):
        fl[bw_end_pt[j]] |= 2
    for j in range(prev_first_pt.shape[0]):
        fl[prev_first_pt[j]] |= 4
    s = np.int64(0)
    k = np.int64(-1)
    for p in range(P):
        f = fl[p]
        if not f & 1:
            s += d[p]
        S[p] = s
        if f != 0 or src[p] >= 0:
            k += 1
            fl[p] = f | 8
        kx[p] = k
    return k + 1


def _fill(fl, S, kx, src, lat, pt_t, bw_end_pt, bw_occ, prev_first_pt, prev_grp, prev_lat,
          tgt, t, first, fixed, own_off, has_src, src_pt, ks, src_off, occ_of_t, lat_bw, grp_of_t, lat_pf, St, lo, hi):
    """retime._prepare's per-target arrays (the numpy expressions there, one target at a time), from
    _mark's fl, S and kx. St: scratch (a target's S, read by its dependants' offsets). The index,
    offset and latency arrays are written in their own width, every value checked against [lo, hi]:
    int64's bounds, or int32's where retime.retime_input would narrow them (then they are not
    written int64 and narrowed in a pass each: 9 ms of a 2.5 M-event chunk's 60 ms what-if input).
    Returns the targets, or -1 where a value falls outside [lo, hi] (the int64 fill and the
    narrowing run then: retime._narrow keeps such an array int64)."""
    P = fl.shape[0]
    if P > hi:
        return -1
    i = 0
    for p in range(P):
        f = fl[p]
        if not f & 8:
            continue
        tgt[i] = p
        t[i] = pt_t[p]
        s = S[p]
        St[i] = s
        isf = (f & 1) != 0
        first[i] = isf
        x = np.int64(0) if isf else s - St[i - 1 if i > 0 else 0]
        if x < lo or x > hi:
            return -1
        own_off[i] = x
        sp = src[p]
        hs = sp >= 0 and not f & 2          # departures use the occurrence maximum instead
        has_src[i] = hs
        src_pt[i] = sp if hs else 0
        fixed[i] = isf and sp < 0 and not f & 4
        occ_of_t[i] = -1
        lat_bw[i] = 0
        grp_of_t[i] = -1
        lat_pf[i] = 0
        i += 1
    for i in range(tgt.shape[0]):          # every target known: a source's may lie after its own
        if has_src[i]:
            sp = src_pt[i]
            k = kx[sp]
            ks[i] = k
            x = lat[tgt[i]] + (S[sp] - St[max(k, 0)])
            if x < lo or x > hi:
                return -1
            src_off[i] = x
        else:
            ks[i] = -1
            src_off[i] = 0
    for j in range(bw_end_pt.shape[0]):    # in order: a repeated point keeps the last (numpy's assignment)
        q = kx[bw_end_pt[j]]
        x, y = bw_occ[j], lat[bw_end_pt[j]]
        if x < lo or x > hi or y < lo or y > hi:
            return -1
        occ_of_t[q] = x
        lat_bw[q] = y
    for j in range(prev_first_pt.shape[0]):
        q = kx[prev_first_pt[j]]
        x, y = prev_grp[j], prev_lat[j]
        if x < lo or x > hi or y < lo or y > hi:
            return -1
        grp_of_t[q] = x
        lat_pf[q] = y
    return tgt.shape[0]


def _narrow32(a, out):
    """out[:] = a where every value fits int32 (returns 1), else 0 (out then holds a part): retime._narrow
    in one pass, where numpy's min, max and astype made three."""
    lo = np.int64(-2**31)
    hi = np.int64(2**31)
    for j in range(a.shape[0]):
        x = a[j]
        if x < lo or x >= hi:
            return 0
        out[j] = x
    return 1


def _segments(lane_first, seg_kind, seg_phase, d, pt_lane, kind_ok, fl, seg_pt, seg_d, seg_ph, seg_lane):
    """whatif.WhatIfInput.from_graph's segments (the points whose segment a what-if can shorten: not a
    lane's first, kind_ok[seg_kind], a phase) written int32 into the outputs when they are None
    (count = len(outputs) == 0: returns how many), else filled; -1 where a value does not fit int32
    (the numpy code then runs). fl: uint8 scratch, len(seg_kind)."""
    P = seg_kind.shape[0]
    for p in range(P):
        fl[p] = 0
    for j in range(lane_first.shape[0]):
        if lane_first[j] < P:
            fl[lane_first[j]] = 1
    n = 0
    fill = seg_pt.shape[0] > 0
    lo = np.int64(-2**31)
    hi = np.int64(2**31)
    for p in range(P):
        if fl[p] or not kind_ok[seg_kind[p]] or seg_phase[p] < 0:
            continue
        if fill:
            x = d[p]
            y = pt_lane[p]
            if x < lo or x >= hi or y < lo or y >= hi or p >= hi:
                return -1
            seg_pt[n] = p
            seg_d[n] = x
            seg_ph[n] = seg_phase[p]
            seg_lane[n] = y
        n += 1
    return n


def _offsets(tgt, first, own_off, has_src, src_pt, ks, src_off, pts, cum, dt, own, src):
    """RetimeInput.solve's offsets for segments ending at `pts` made shorter (cum: the prefix sums of
    the shortening, 0 first): dt the shortening at or before each target, own and src its offsets
    (the numpy expressions there, one target at a time). Returns 0, or -1 where tgt or pts is not
    ascending or a ks lies past the targets (numpy then does what it does)."""
    nt = tgt.shape[0]
    npts = pts.shape[0]
    for j in range(1, npts):
        if pts[j] < pts[j - 1]:
            return -1
    j = 0
    for i in range(nt):                   # targets ascending: a merge with pts
        x = tgt[i]
        if i and x < tgt[i - 1]:
            return -1
        while j < npts and pts[j] <= x:
            j += 1
        dt[i] = cum[j]
    for i in range(nt):
        k = ks[i]
        if k >= nt:
            return -1
        own[i] = 0 if first[i] else own_off[i] - (dt[i] - dt[i - 1 if i > 0 else 0])
        if has_src[i]:
            x = src_pt[i]
            lo = 0                         # searchsorted(pts, x, side="right")
            hi = npts
            while lo < hi:
                m = (lo + hi) >> 1
                if pts[m] <= x:
                    lo = m + 1
                else:
                    hi = m
            src[i] = src_off[i] - (cum[lo] - dt[k if k > 0 else 0])
        else:
            src[i] = 0
    return 0


def _select(seg_phase, seg_lane, phase_ok, lane_ok, out):
    """The segments whose phase and lane are chosen (phase_ok[seg_phase] & lane_ok[seg_lane]): their
    positions written into out, or only counted when out is empty; returns how many, or -1 where a
    phase or lane lies outside its look-up (numpy's indexing would wrap or raise: it then runs)."""
    nph = phase_ok.shape[0]
    nl = lane_ok.shape[0]
    fill = out.shape[0] > 0
    n = 0
    for i in range(seg_phase.shape[0]):
        p = seg_phase[i]
        q = seg_lane[i]
        if p < 0 or p >= nph or q < 0 or q >= nl:
            return -1
        if phase_ok[p] and lane_ok[q]:
            if fill:
                out[n] = i
            n += 1
    return n


RADIX_BITS = 11          # a digit of the time order's radix sort: 2048 counts (16 kB) stay in L1


def _time_order(t, tmin, passes, low, order, k1, i1, k2, i2, cnt):
    """np.lexsort((arange(n), t)) (a stable sort of positions by t) into order, as a least significant
    digit first radix sort of t - tmin (non-negative, below 2**(RADIX_BITS * passes)): each pass is
    stable, so equal times keep position order. A chunk's target times span ~2**21 ns (10 M-event
    synthetic run): two passes over 755 k targets, where np.lexsort's merge sorts take ~37 ms.
    low > 0: the positions fit in `low` bits under the time (both in one int64): each pass moves one
    array, not two (i1, i2 unused). Scratch: k1, i1, k2, i2 (len(t)), cnt (passes, 2**RADIX_BITS)."""
    n = t.shape[0]
    nb = cnt.shape[1]
    mask = nb - 1
    for q in range(passes):
        for b in range(nb):
            cnt[q, b] = 0
    for j in range(n):
        u = t[j] - tmin
        if low > 0:
            k1[j] = (u << low) | j
        else:
            k1[j] = u
            i1[j] = j
        for q in range(passes):
            cnt[q, (u >> (RADIX_BITS * q)) & mask] += 1
    sk, si, dk, di = k1, i1, k2, i2
    for q in range(passes):
        s = 0
        for b in range(nb):             # counts -> each digit's first slot
            c = cnt[q, b]
            cnt[q, b] = s
            s += c
        sh = RADIX_BITS * q + low
        for j in range(n):
            u = sk[j]
            b = (u >> sh) & mask
            o = cnt[q, b]
            cnt[q, b] = o + 1
            dk[o] = u
            if low == 0:
                di[o] = si[j]
        sk, si, dk, di = dk, di, sk, si
    if low > 0:
        m = (np.int64(1) << low) - 1
        for j in range(n):
            order[j] = sk[j] & m
    else:
        for j in range(n):
            order[j] = si[j]
    return n


_A = "{}[::1]".format
_B, _I = _A("boolean"), _A("int64")
# the per-target index / latency arrays as the stored input narrows them (int32) or as retime() makes them
_VARIANTS = {np.dtype(np.int32): "solve_int32", np.dtype(np.int64): "solve_int64"}
_EXPORTS = {}
for _dt, _name in _VARIANTS.items():
    _X = _A(_dt.name)
    _EXPORTS[_name] = (_solve, "int64(" + ", ".join(
        [_X, _B, _B, _I, _B, _X, _I, _X, _X, _I, _I, _I, _X, _X, _I, _I, _I, "int64", "int64", "int64", _I]
        + [_I] * 12 + [_A("uint8"), _A("uint8"), _I, _I, _I, _I, _I, _I]) + ")")
# retime._prepare's loops, for a graph whose `src` is int32 (graph.index_dtype) or int64
for _dt, _sfx in ((np.dtype(np.int32), "int32"), (np.dtype(np.int64), "int64")):
    _X = _A(_dt.name)
    _EXPORTS["mark_" + _sfx] = (_mark, f"int64({_I}, {_I}, {_I}, {_I}, {_X}, {_A('uint8')}, {_I}, {_I})")
    _EXPORTS["fill_" + _sfx] = (_fill, "int64(" + ", ".join(
        [_A("uint8"), _I, _I, _X, _I, _I, _I, _I, _I, _I, _I, _I, _I, _B, _B, _I, _B, _I, _I, _I, _I, _I, _I, _I, _I,
         "int64", "int64"]) + ")")
_J = _A("int32")
_EXPORTS["fill32_int32"] = (_fill, "int64(" + ", ".join(
    [_A("uint8"), _I, _I, _J, _I, _I, _I, _I, _I, _I, _I, _J, _I, _B, _B, _J, _B, _J, _J, _J, _J, _J, _J, _J, _I,
     "int64", "int64"]) + ")")
_EXPORTS["narrow32"] = (_narrow32, f"int64({_I}, {_A('int32')})")
_EXPORTS["segments"] = (_segments, "int64(" + ", ".join(
    [_I, _A("int8"), _A("int32"), _I, _I, _B, _A("uint8")] + [_A("int32")] * 4) + ")")
for _dt, _sfx in ((np.dtype(np.int32), "int32"), (np.dtype(np.int64), "int64")):
    _X = _A(_dt.name)
    _EXPORTS["offsets_" + _sfx] = (_offsets, "int64(" + ", ".join([_X, _B, _X, _B, _X, _X, _X] + [_I] * 5) + ")")
for _dt, _sfx in ((np.dtype(np.int32), "int32"), (np.dtype(np.int64), "int64")):
    _X = _A(_dt.name)
    _EXPORTS["select_" + _sfx] = (_select, f"int64({_X}, {_X}, {_B}, {_B}, {_I})")
_EXPORTS["time_order"] = (_time_order, f"int64({_I}, int64, int64, int64, {_I}, {_I}, {_I}, {_I}, {_I}, int64[:, ::1])")
STACK = 128   # windows pending at once: two per halving level (a window of 2^62 targets)
last_halved = 0   # windows the last solve halved (the tests read it)
_LOOPS = aot.Loops(_MODULE, Path(__file__), "retime", _EXPORTS, "the what-if's re-timing loop")

_held = threading.local()   # .scratch: the solving loop's scratch kept by `kept_scratch`, else absent


@contextlib.contextmanager
def kept_scratch():
    """Solves inside reuse one set of the loop's per-target scratch (fourteen arrays, 74 MB at a 10 M-event
    run's chunk of 755 k targets), grown to the largest chunk, instead of allocating it for each: a run's
    what-if solves its chunks one after another, and each fresh set was faulted in again (4,000 page
    faults, ~9 ms of CPU a chunk). Given back on leaving; per thread."""
    if getattr(_held, "scratch", None) is not None:
        yield
        return
    _held.scratch = []
    try:
        yield
    finally:
        _held.scratch = None


def _scratch(nt: int) -> list:
    """Twelve int64 and two uint8 arrays of nt elements (views of the kept ones inside kept_scratch)."""
    kept = getattr(_held, "scratch", None)
    if kept is None:
        return [np.empty(nt, np.int64) for _ in range(12)] + [np.empty(nt, np.uint8) for _ in range(2)]
    if not kept or len(kept[0]) < nt:
        kept[:] = [np.empty(nt, np.int64) for _ in range(12)] + [np.empty(nt, np.uint8) for _ in range(2)]
    return [a[:nt] for a in kept]


def _compiled() -> aot.Compiled:
    return _LOOPS.compiled()


def enabled() -> bool:
    """Run the compiled loop? (ENGINE "auto" and an AOT build on disk or numba to make one)"""
    return _LOOPS.enabled(ENGINE)


def _i64(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.int64)


def _b(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.bool_)


def _in(a, lo: int, hi: int) -> bool:
    return len(a) == 0 or (int(a.min()) >= lo and int(a.max()) < hi)


def solve(inp, own_off, ks, src_off, aoff, moff, window: int, sweeps: int):
    """retime._solve's T, or None where an index would fall outside its array (numpy's fancy
    indexing wraps negatives or raises) or `order` repeats a target: the numpy path then runs and
    does what it does."""
    global last_halved
    nt = len(inp.tgt)
    # the per-target indices int32 where the stored input's are (ks too: no int64 copy), else int64
    big = (inp.order, inp.occ_of_t, inp.lat_bw, inp.grp_of_t, inp.lat_pf, ks)
    dt = np.dtype(np.int32) if all(a.dtype == np.int32 for a in big) else np.dtype(np.int64)
    order, occ_of_t, lat_bw, grp_of_t, lat_pf, ks = (np.ascontiguousarray(a, dt) for a in big)
    ak, mk = _i64(inp.ak), _i64(inp.mk)
    occ_starts, prev_starts = _i64(inp.occ_starts), _i64(inp.prev_starts)
    # order, ks, occ_of_t and grp_of_t (a target's each) are checked by the loop, in passes it makes anyway
    if window < 1 or len(inp.t) != nt or not all(len(a) == nt for a in (ks, occ_of_t, grp_of_t, inp.first,
                                                                         inp.fixed, inp.has_src)):
        return None
    if not (_in(ak, 0, nt) and _in(mk, 0, nt)):
        return None
    if len(ak) and not _in(occ_starts, 0, len(ak)):
        return None
    if len(mk) and not _in(prev_starts, 0, len(mk)):
        return None
    T = inp.t.astype(np.int64)
    h = int(_compiled().get(_VARIANTS[dt])(
        order, _b(inp.first), _b(inp.fixed), _i64(own_off), _b(inp.has_src), ks, _i64(src_off), occ_of_t, lat_bw,
        ak, _i64(aoff), occ_starts, grp_of_t, lat_pf, mk, _i64(moff), prev_starts, np.int64(window),
        np.int64(sweeps), np.int64(NEG), T, *_scratch(nt),
        np.empty(min(window, max(len(order), 1)), np.int64), np.empty(2 * STACK, np.int64),
        np.empty(len(occ_starts), np.int64), np.full(len(occ_starts), -1, np.int64),
        np.empty(len(prev_starts), np.int64), np.full(len(prev_starts), -1, np.int64)))
    if h < 0:
        return None
    last_halved = h
    return T


def prepare(g, d: np.ndarray, out_pt: np.ndarray, narrow: bool = False):
    """retime._prepare's arrays of graph g and durations d (a dict of RetimeInput's fields, with the
    same dtypes and values as its numpy code), the target at or before each point and the prefix
    sums; None where the compiled loops cannot run them as numpy would (an index outside its array,
    arrays of unequal lengths, an unexpected dtype): the numpy code then runs. narrow: the per-target
    arrays that retime._narrow would make int32 are made int32 where all of them fit (_fill at int32's bounds; a
    graph whose `src` is int32), for retime.retime_input (which narrows the rest)."""
    P = int(g.n_points)
    src = g.src
    lf, bw, pf = _i64(g.lane_first), _i64(g.bw_end_pt), _i64(g.prev_first_pt)
    a_pt, m_pt, out_pt = _i64(g.occ_arr_pt), _i64(g.prev_member_pt), _i64(out_pt)
    bw_occ, prev_grp, prev_lat = _i64(g.bw_occ), _i64(g.prev_grp), _i64(g.prev_lat)
    if P == 0 or src.dtype not in (np.dtype(np.int32), np.dtype(np.int64)) or g.pt_t.dtype != np.int64:
        return None
    if not (len(d) == len(src) == len(g.lat) == len(g.pt_t) == P and len(bw_occ) == len(bw)
            and len(prev_grp) == len(prev_lat) == len(pf)):
        return None
    if not (_in(src, -1, P) and all(_in(a, 0, P) for a in (lf, bw, pf, a_pt, m_pt, out_pt))):
        return None
    c = _compiled()
    sfx = src.dtype.name
    src = np.ascontiguousarray(src)
    lat, pt_t = _i64(g.lat), _i64(g.pt_t)
    fl, S, kx = np.empty(P, np.uint8), np.empty(P, np.int64), np.empty(P, np.int64)
    nt = int(c.get("mark_" + sfx)(lf, bw, pf, _i64(d), src, fl, S, kx))
    a = _filled(c, sfx, narrow, nt, (fl, S, kx, src, lat, pt_t, bw, bw_occ, pf, prev_grp, prev_lat))
    del fl
    if not _radix_order(c, a["t"], a["order"]):
        a["order"] = np.lexsort((a["tgt"], a["t"]))
    a["src_pt"] = a["src_pt"].astype(src.dtype, copy=False)     # numpy's where(has_src, src, 0) keeps src's dtype
    tgt = a["tgt"]

    def off(x, k):
        return S[x] - S[tgt[k]]
    ak, mk, out_k = kx[a_pt], kx[m_pt], kx[out_pt]
    a.update(a_pt=g.occ_arr_pt, ak=ak, aoff=off(a_pt, ak), occ_starts=g.occ_starts, m_pt=g.prev_member_pt, mk=mk,
             moff=off(m_pt, mk), prev_starts=g.prev_starts, out_k=out_k, out_off=off(out_pt, out_k))
    return a, kx, S


_FILLED = ("tgt", "t", "first", "fixed", "own_off", "has_src", "src_pt", "ks", "src_off", "occ_of_t", "lat_bw",
           "grp_of_t", "lat_pf")
_NARROWED = ("tgt", "own_off", "src_pt", "ks", "src_off", "occ_of_t", "lat_bw", "grp_of_t", "lat_pf")   # fill32_int32's
_BOUNDS32 = (np.int64(-2**31), np.int64(2**31 - 1))   # _fill's [lo, hi]: the values an int32 array holds
_BOUNDS64 = (np.int64(-2**63), np.int64(2**63 - 1))   # every int64: no check can fail


def _filled(c, sfx: str, narrow: bool, nt: int, args: tuple) -> dict:
    """_fill's per-target arrays by name (narrow and an int32 `src`: int32 ones where every value
    fits), and `order`
    (unfilled). args: _mark's fl, S, kx and the graph's arrays _fill reads."""
    def arrays(narrowed):
        a = {k: np.empty(nt, np.bool_ if k in ("first", "fixed", "has_src") else
                         np.int32 if k in narrowed else np.int64) for k in _FILLED}
        return a, [a[k] for k in _FILLED]
    if narrow and sfx == "int32":
        a, out = arrays(_NARROWED)
        if int(c.get("fill32_int32")(*args, *out, np.empty(nt, np.int64), *_BOUNDS32)) >= 0:
            a["order"] = np.empty(nt, np.int64)
            return a
    a, out = arrays(())
    c.get("fill_" + sfx)(*args, *out, np.empty(nt, np.int64), *_BOUNDS64)
    a["order"] = np.empty(nt, np.int64)
    return a


def _radix_order(c, t: np.ndarray, order: np.ndarray) -> bool:
    """Fill order with np.lexsort((arange(n), t)) by _time_order; False where the times span 2**62 ns
    or more (the radix keys are int64)."""
    if len(t) == 0:
        return True
    tmin, span = int(t.min()), int(t.max()) - int(t.min())
    if span >= 2**62:
        return False
    passes = -(-span.bit_length() // RADIX_BITS)
    n = len(t)
    low = max(n - 1, 1).bit_length()
    packed = span.bit_length() + low <= 62                  # time and position in one int64
    m = 0 if packed else n
    c.get("time_order")(t, np.int64(tmin), np.int64(passes), np.int64(low if packed else 0), order,
                        np.empty(n, np.int64), np.empty(m, np.int64), np.empty(n, np.int64), np.empty(m, np.int64),
                        np.empty((passes, 1 << RADIX_BITS), np.int64))
    return True


def narrow32(a: np.ndarray) -> np.ndarray | None:
    """a (int64) as int32 when every value fits, else None (retime._narrow's test)."""
    out = np.empty(len(a), np.int32)
    return out if _compiled().get("narrow32")(np.ascontiguousarray(a), out) else None


def select(seg_phase: np.ndarray, seg_lane: np.ndarray, phase_ok: np.ndarray, lane_ok: np.ndarray) -> np.ndarray | None:
    """np.flatnonzero(phase_ok[seg_phase] & lane_ok[seg_lane]) (whatif.WhatIfInput.summary's segments
    to shorten) in two passes of _select, counting then filling, where numpy made five over 1.57 M
    segments a 10 M-event chunk (7 ms), or None (numpy then runs) where the dtypes are not one of the
    loop's or an index lies outside its look-up."""
    dt = seg_phase.dtype
    if dt not in (np.dtype(np.int32), np.dtype(np.int64)) or seg_lane.dtype != dt or len(seg_lane) != len(seg_phase):
        return None
    f = _compiled().get("select_" + dt.name)
    args = (np.ascontiguousarray(seg_phase), np.ascontiguousarray(seg_lane), _b(phase_ok), _b(lane_ok))
    n = int(f(*args, np.empty(0, np.int64)))
    if n < 0:
        return None
    out = np.empty(n, np.int64)
    return out if n == 0 or int(f(*args, out)) == n else None


def segments(g, kinds: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """(point, duration, phase, lane) of the points not a lane's first whose segment kind is one of
    `kinds` (a bool look-up by kind code) and that have a phase, each int32; None where a value does
    not fit int32 or the arrays are not the graph's usual dtypes (int8 kinds, int32 phases)."""
    if g.seg_kind.dtype != np.int8 or g.seg_phase.dtype != np.int32 or g.n_points >= 2**31:
        return None
    sk = g.seg_kind
    if len(sk) and (int(sk.min()) < 0 or int(sk.max()) >= len(kinds)) or not _in(g.lane_first, 0, 2**62):
        return None
    f = _compiled().get("segments")
    args = (_i64(g.lane_first), np.ascontiguousarray(sk), np.ascontiguousarray(g.seg_phase), _i64(g.d),
            _i64(g.pt_lane), _b(kinds), np.empty(len(sk), np.uint8))
    e = np.empty(0, np.int32)
    n = int(f(*args, e, e, e, e))
    if n <= 0:        # none: numpy's narrowing keeps empty arrays int64
        return None
    out = tuple(np.empty(n, np.int32) for _ in range(4))
    return out if int(f(*args, *out)) == n else None


def offsets(inp, pts: np.ndarray, cum: np.ndarray):
    """(dt, own, src) of RetimeInput.solve (the shortening at or before each target, the offsets
    from the previous target and from the source's) by _offsets, or None (numpy's code then runs)."""
    big = (inp.tgt, inp.own_off, inp.src_pt, inp.ks, inp.src_off)
    if not all(len(a) == len(inp.tgt) for a in (*big, inp.first, inp.has_src)) or not all(a.dtype.kind == "i" for a in big):
        return None
    dt = np.dtype(np.int32) if all(a.dtype == np.int32 for a in big) else np.dtype(np.int64)
    big = [np.ascontiguousarray(a, dt) for a in big]
    n = len(inp.tgt)
    d, own, src = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    r = _compiled().get("offsets_" + dt.name)(big[0], _b(inp.first), big[1], _b(inp.has_src), big[2], big[3], big[4],
                                              _i64(pts), _i64(cum), d, own, src)
    return None if r < 0 else (d, own, src)
