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

The loop allocates nothing (the caller passes T, the sweep's buffer and the scratch), so the AOT
module needs no numba runtime. Arithmetic is int64 and wraps as numpy's does.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import aot

_MODULE = "_epscope_retime_aot"
ENGINE = "auto"   # "auto": compiled where available; "numpy": the fallback (tests set it)
NEG = np.iinfo(np.int64).min // 4


def _solve(order, first, fixed, own_off, has_src, ks, src_off, occ_of_t, lat_bw, ak, aoff, occ_starts,
           grp_of_t, lat_pf, mk, moff, prev_starts, window, sweeps, neg, T, W, fl, v, stack, om, om_st, gm, gm_st):
    """retime._solve's loop over T (the recorded times on entry, the new ones on return). Scratch:
    W (12, len(T)) int64, fl (len(T)) uint8, v (window) int64, stack 2 * STACK int64; om / om_st one
    per occurrence, gm / gm_st one per group (stamps filled with -1). Returns the number of windows
    halved, or -1 where `order` repeats a target (the caller then runs numpy's code).

    The targets are relabelled once into solving order (position i: order[i], then the targets not
    solved): what a sweep reads of a target's own constants is then read in sequence, and its
    dependencies (near it in time) near it in memory; the sweeps themselves are numpy's."""
    nt = T.shape[0]
    n_solve = order.shape[0]
    Tw, inv, perm, pkw, oow, ksw, sow, occw, lbw, grpw, lpw, fvw = (W[0], W[1], W[2], W[3], W[4], W[5], W[6], W[7],
                                                                  W[8], W[9], W[10], W[11])
    for q in range(nt):
        inv[q] = -1
    for i in range(n_solve):
        q = order[i]
        if inv[q] >= 0:
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
        f = np.uint8(0)
        if fixed[p]:
            fl[i] = 2
            fvw[i] = Tw[i]
            continue
        if first[p]:
            f |= 1
        else:
            pkw[i] = inv[p - 1 if p > 0 else 0]
            oow[i] = own_off[p]
        if has_src[p]:
            f |= 4
            k = ks[p]
            ksw[i] = inv[max(0, k)]
            sow[i] = src_off[p]
        o = occ_of_t[p]
        occw[i] = o
        if o >= 0:
            lbw[i] = lat_bw[p]
        o = grp_of_t[p]
        grpw[i] = o
        if o >= 0:
            lpw[i] = lat_pf[p]
        fl[i] = f
    bw = ak.shape[0] > 0
    pf = mk.shape[0] > 0
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
                same = True
                for i in range(lo, hi):
                    if v[i - lo] != Tw[i]:
                        same = False
                        break
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


_A = "{}[::1]".format
_B, _I = _A("boolean"), _A("int64")
# the per-target index / latency arrays as the stored input narrows them (int32) or as retime() makes them
_VARIANTS = {np.dtype(np.int32): "solve_int32", np.dtype(np.int64): "solve_int64"}
_EXPORTS = {}
for _dt, _name in _VARIANTS.items():
    _X = _A(_dt.name)
    _EXPORTS[_name] = (_solve, "int64(" + ", ".join(
        [_X, _B, _B, _I, _B, _I, _I, _X, _X, _I, _I, _I, _X, _X, _I, _I, _I, "int64", "int64", "int64", _I,
         "int64[:, ::1]", _A("uint8"), _I, _I, _I, _I, _I, _I]) + ")")
STACK = 128   # windows pending at once: two per halving level (a window of 2^62 targets)
last_halved = 0   # windows the last solve halved (the tests read it)
_LOOPS = aot.Loops(_MODULE, Path(__file__), "retime", _EXPORTS, "the what-if's re-timing loop")


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
    big = (inp.order, inp.occ_of_t, inp.lat_bw, inp.grp_of_t, inp.lat_pf)
    dt = np.dtype(np.int32) if all(a.dtype == np.int32 for a in big) else np.dtype(np.int64)
    order, occ_of_t, lat_bw, grp_of_t, lat_pf = (np.ascontiguousarray(a, dt) for a in big)
    ak, mk = _i64(inp.ak), _i64(inp.mk)
    occ_starts, prev_starts = _i64(inp.occ_starts), _i64(inp.prev_starts)
    ks = _i64(ks)
    if window < 1 or len(inp.t) != nt or not (_in(order, 0, nt) and _in(ks, -1, nt) and _in(ak, 0, nt)
                                               and _in(mk, 0, nt)):
        return None
    if len(ak) and not (_in(occ_starts, 0, len(ak)) and _in(occ_of_t, -1, len(occ_starts))):
        return None
    if len(mk) and not (_in(prev_starts, 0, len(mk)) and _in(grp_of_t, -1, len(prev_starts))):
        return None
    T = inp.t.astype(np.int64)
    h = int(_compiled().get(_VARIANTS[dt])(
        order, _b(inp.first), _b(inp.fixed), _i64(own_off), _b(inp.has_src), ks, _i64(src_off), occ_of_t, lat_bw,
        ak, _i64(aoff), occ_starts, grp_of_t, lat_pf, mk, _i64(moff), prev_starts, np.int64(window),
        np.int64(sweeps), np.int64(NEG), T, np.empty((12, nt), np.int64), np.empty(nt, np.uint8),
        np.empty(min(window, max(len(order), 1)), np.int64), np.empty(2 * STACK, np.int64),
        np.empty(len(occ_starts), np.int64), np.full(len(occ_starts), -1, np.int64),
        np.empty(len(prev_starts), np.int64), np.full(len(prev_starts), -1, np.int64)))
    if h < 0:
        return None
    last_halved = h
    return T
