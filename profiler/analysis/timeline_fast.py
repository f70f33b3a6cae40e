"""The timeline overview's and the report's run tables' per-event passes as compiled loops
(optional: numba, the `fast` extra).

timeline_overview.Builder.add and run_tables.chunk_part call these when the process can run them
(`enabled()`: an ahead-of-time build on disk, or numba to make one, profiler/aot.py) and keep their
numpy code as the fallback; tests/analysis/test_timeline_fast.py holds both paths equal, bit for
bit, on random tables and on the bundled runs.

Why: the numpy overview of a 2.5 M-event chunk reads every event ~40 times (int64 copies of the lane
columns, masks, np.where, _dense's bincounts, binned_busy's dozen n-long temporaries, ufunc.at) and
the run tables' groups ~10 more (np.add/maximum/minimum.at over the spans: 0.23 s of 0.42). Here the
overview is two passes (`scan`: lanes, extents and which groups and phases each iteration's tiles
hold; `bin`: every span's busy time into its tile) and the groups one pass after a key scan; the
lane columns are read at their stored widths.

Exactness: binned_busy sums a bin's spans in table order as three bincounts (a span's only bin, its
first partial bin, its last partial bin) plus a difference array of whole counts, then adds them in
that order. `bin` keeps the three sums apart in the same order (a span that weighs 0.0 there is
skipped here: x + 0.0 == x for the non-negative sums) and the caller adds them as binned_busy does,
so every cell is the same float. Integer sums, minima and maxima are order-free.

The loops allocate nothing (the callers pass their outputs), so the AOT module needs no numba runtime.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import aot

_MODULE = "_epscope_timeline_aot"
ENGINE = "auto"   # "auto": compiled where available; "numpy": the fallback (tests set it)


def _scan(kind, host_c, span_c, rank, block, warp, it, phase, n0, begin, end, opened, radix,
          last, lo, hi, n_ev, n_span, n_open, it_rows, g_seen, p_seen):
    """One pass: each lane's last row (last, filled with -1), each (iteration, rank) extent's first
    begin, last end (end clamped to begin), events, spans and open spans (lo / hi filled with
    int64 max / min, counts zeroed), rows per iteration, and which groups and phases each
    iteration's drawn spans hold (g_seen [iterations x groups], p_seen [iterations x 2 n0]).
    radix: r0, b0, w0, n_b, n_w, i0, n_r (timeline_overview.Builder.add's mixed radix; host rows
    on block = warp = -1, their phase n0 on)."""
    r0, b0, w0, n_b, n_w, i0, n_r = radix[0], radix[1], radix[2], radix[3], radix[4], radix[5], radix[6]
    n_g = g_seen.shape[0] // it_rows.shape[0]
    n_p = p_seen.shape[0] // it_rows.shape[0]
    for i in range(rank.shape[0]):
        h = kind[i] == host_c
        b1 = np.int64(0) if h else np.int64(block[i]) + 1
        w1 = np.int64(0) if h else np.int64(warp[i]) + 1
        g = (np.int64(rank[i]) - r0) * n_b + (b1 - b0)
        last[g * n_w + (w1 - w0)] = i
        k = np.int64(it[i]) - i0
        e = k * n_r + (np.int64(rank[i]) - r0)
        b = begin[i]
        lo[e] = min(lo[e], b)
        hi[e] = max(hi[e], max(end[i], b))
        n_ev[e] += 1
        it_rows[k] += 1
        if h or kind[i] == span_c:
            n_span[e] += 1
            if opened[i]:
                n_open[e] += 1
            if phase[i] >= 0:
                g_seen[k * n_g + g] = True
                p_seen[k * n_p + np.int64(phase[i]) + (n0 if h else 0)] = True


def _bin(kind, host_c, span_c, rank, block, warp, it, phase, n0, begin, end, radix,
         g_map, p_map, n_used, bins, off, t0, t1, width, one, first, last, diff):
    """Every drawn span's busy time into its iteration's tile, as binned_busy computes it: key =
    group index x phases used + phase index (g_map / p_map: per iteration, as _scan's g_seen /
    p_seen), the tile's cells from off[k] ((bins + 1) a key): `one` the spans within one bin,
    `first` / `last` the partial first and last bins of the others, `diff` +1 / -1 around their
    whole bins."""
    r0, b0, n_b, i0 = radix[0], radix[1], radix[3], radix[5]
    n_g = g_map.shape[0] // bins.shape[0]
    n_p = p_map.shape[0] // bins.shape[0]
    for i in range(rank.shape[0]):
        h = kind[i] == host_c
        if not (h or kind[i] == span_c) or phase[i] < 0:
            continue
        b1 = np.int64(0) if h else np.int64(block[i]) + 1
        g = (np.int64(rank[i]) - r0) * n_b + (b1 - b0)
        k = np.int64(it[i]) - i0
        p = np.int64(phase[i]) + (n0 if h else 0)
        nb = bins[k]
        at = off[k] + (g_map[k * n_g + g] * n_used[k] + p_map[k * n_p + p]) * (nb + 1)
        lo_t, hi_t, w = t0[k], t1[k], width[k]
        fb = (min(max(np.float64(begin[i]), lo_t), hi_t) - lo_t) / w
        fe = (min(max(np.float64(max(end[i], begin[i])), lo_t), hi_t) - lo_t) / w
        ib = min(np.int64(fb), nb - 1)      # fb, fe >= 0: truncation is floor
        ie = min(np.int64(fe), nb - 1)
        if ib == ie:
            if fe > fb:
                one[at + ib] += fe - fb
        elif ie > ib:
            first[at + ib] += (ib + 1) - fb
            last[at + ie] += fe - ie
            if ie - ib > 1:
                diff[at + ib + 1] += 1.0
                diff[at + ie] -= 1.0


def _combine(one, first, last, diff, start, stop, width):
    """binned_busy's sum of _bin's parts over cells [start, stop) of rows `width` long, into `one`:
    ((one + first) + last) + the running sum of diff along the row, the additions numpy makes in
    that order (the running sums are whole numbers: exact in any order)."""
    for row in range(start, stop, width):
        run = 0.0
        for c in range(row, row + width):
            run += diff[c]
            one[c] = ((one[c] + first[c]) + last[c]) + run


def _coarse(flat, start, n_keys, width, nb, r, out):
    """The mean of each r consecutive bins of each key's row (rows `width` long from `start`, their
    first nb cells the bins) into out [keys x nb / r], as numpy's mean over that axis computes it:
    its pairwise sum (numpy's pairwise_sum, one block: r <= 128 here) divided by r."""
    nc = nb // r
    for key in range(n_keys):
        for c in range(nc):
            a = start + key * width + c * r
            if r < 8:
                res = 0.0
                for i in range(r):
                    res += flat[a + i]
            else:
                r0, r1, r2, r3 = flat[a], flat[a + 1], flat[a + 2], flat[a + 3]
                r4, r5, r6, r7 = flat[a + 4], flat[a + 5], flat[a + 6], flat[a + 7]
                i = 8
                while i < r - r % 8:
                    r0 += flat[a + i]
                    r1 += flat[a + i + 1]
                    r2 += flat[a + i + 2]
                    r3 += flat[a + i + 3]
                    r4 += flat[a + i + 4]
                    r5 += flat[a + i + 5]
                    r6 += flat[a + i + 6]
                    r7 += flat[a + i + 7]
                    i += 8
                res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
                while i < r:
                    res += flat[a + i]
                    i += 1
            out[key * nc + c] = res / r


def _groups(kind, span_c, kernel, phase, n_p, rank, r0, n_r, kinds, seen):
    """run_tables.chunk_part's rows per kind code (kinds, zeroed) and span keys ((kernel, phase) x
    n_r + rank - r0) marked in `seen`; returns False at a span without a kernel or phase code."""
    for i in range(kind.shape[0]):
        c = kind[i]
        if c >= 0:
            kinds[c] += 1
        if c != span_c:
            continue
        if kernel[i] < 0 or phase[i] < 0:
            return False
        seen[(np.int64(kernel[i]) * n_p + phase[i]) * n_r + (np.int64(rank[i]) - r0)] = True
    return True


def _group_stats(kind, span_c, kernel, phase, n_p, rank, r0, n_r, begin, end, index, gi, dur, cnt, tot, mx, mn):
    """Each span's group (index: key -> dense group) and duration in table order, and per group its
    count, summed, longest and shortest duration (cnt / tot zeroed, mx / mn filled with int64 min /
    max)."""
    j = 0
    for i in range(kind.shape[0]):
        if kind[i] != span_c:
            continue
        g = index[(np.int64(kernel[i]) * n_p + phase[i]) * n_r + (np.int64(rank[i]) - r0)]
        d = end[i] - begin[i]
        gi[j] = g
        dur[j] = d
        j += 1
        cnt[g] += 1
        tot[g] += d
        mx[g] = max(mx[g], d)
        mn[g] = min(mn[g], d)


def _lane_runs(rank, launch, block, warp, kernel, gpu, begin, end, starts, ext):
    """run_tables._warp_time's lane runs: rows where (rank, launch, block, warp, kernel, gpu) keep
    their values are one run; of each GPU run its first row (starts) and its first begin to last
    end (ext), written while they fit; returns the number of GPU runs (a first call with empty
    outputs counts them)."""
    m = 0
    n = rank.shape[0]
    lo = hi = np.int64(0)
    for i in range(n + 1):
        if i == n or i == 0 or (rank[i] != rank[i - 1] or launch[i] != launch[i - 1] or block[i] != block[i - 1]
                                or warp[i] != warp[i - 1] or kernel[i] != kernel[i - 1] or gpu[i] != gpu[i - 1]):
            if i > 0 and gpu[i - 1]:
                if m < starts.shape[0]:
                    ext[m] = hi - lo
                m += 1
            if i == n:
                break
            if gpu[i]:
                if m < starts.shape[0]:
                    starts[m] = i
                lo, hi = begin[i], end[i]
        elif gpu[i]:
            lo, hi = min(lo, begin[i]), max(hi, end[i])
    return m


def _hist(group, gmap, x, lo, hi, binw, count, hist):
    """run_tables.select's histogram pass over one spill: each value of group gmap[group] inside
    wanted value t's window [lo, hi] (flat [T x groups]) counted into its bin of width binw
    (hist flat [T x groups x bins]), for the t with count[t]."""
    T = count.shape[0]
    G = lo.shape[0] // T
    HB = hist.shape[0] // lo.shape[0]
    for i in range(x.shape[0]):
        g = gmap[group[i]]
        v = np.int64(x[i])
        for t in range(T):
            if not count[t]:
                continue
            c = t * G + g
            if v >= lo[c] and v <= hi[c]:
                hist[c * HB + (v - lo[c]) // binw[c]] += 1


def _keep(group, gmap, x, lo, hi, m, out_g, out_x):
    """The (group, value) pairs of one spill inside their group's window [lo, hi], appended to
    out_g / out_x from m on while they fit; returns the new end."""
    for i in range(x.shape[0]):
        g = gmap[group[i]]
        v = np.int64(x[i])
        if v >= lo[g] and v <= hi[g]:
            if m < out_g.shape[0]:
                out_g[m] = g
                out_x[m] = v
            m += 1
    return m


_A = "{}[::1]".format
# the lane columns at the stored schema's widths (rank int16, block int32, warp int16, iteration
# int32) or int64 (tables made in memory; other widths are widened to it); category codes int8
# (pandas' codes below 128 categories; more: the numpy path)
WIDTHS = {"schema": ("int16", "int32", "int16", "int32"), "wide": ("int64",) * 4}
_EXPORTS = {}
for _w, (_r, _b, _wp, _i) in WIDTHS.items():
    _head = [_A("int8"), "int64", "int64", _A(_r), _A(_b), _A(_wp), _A(_i), _A("int8"), "int64", _A("int64"),
             _A("int64")]
    _EXPORTS[f"scan_{_w}"] = (_scan, "void(" + ", ".join(
        _head + [_A("boolean")] + [_A("int64")] * 8 + [_A("boolean")] * 2) + ")")
    _EXPORTS[f"bin_{_w}"] = (_bin, "void(" + ", ".join(_head + [_A("int64")] * 6 + [_A("float64")] * 7) + ")")
    _key = [_A("int8"), "int64", _A("int8"), _A("int8"), "int64", _A(_r), "int64", "int64"]
    _EXPORTS[f"groups_{_w}"] = (_groups, "boolean(" + ", ".join(_key + [_A("int64"), _A("boolean")]) + ")")
    _EXPORTS[f"group_stats_{_w}"] = (_group_stats, "void(" + ", ".join(
        _key + [_A("int64")] * 3 + [_A("int32"), _A("int64")] + [_A("int64")] * 4) + ")")
_EXPORTS["combine"] = (_combine, "void(" + ", ".join([_A("float64")] * 4 + ["int64"] * 3) + ")")
_EXPORTS["coarse"] = (_coarse, "void(" + ", ".join([_A("float64"), "int64", "int64", "int64", "int64", "int64",
                                                      _A("float64")]) + ")")
_RUN_WIDTHS = {"schema": ("int16", "int32", "int32", "int16"), "wide": ("int64",) * 4}   # rank, launch, block, warp
for _w, (_r, _l, _b, _wp) in _RUN_WIDTHS.items():
    _EXPORTS[f"lane_runs_{_w}"] = (_lane_runs, "int64(" + ", ".join(
        [_A(_r), _A(_l), _A(_b), _A(_wp), _A("int8"), _A("boolean")] + [_A("int64")] * 4) + ")")
for _x in ("int32", "int64"):      # a spill's durations: int32 where they fit (run_tables.chunk_part)
    _EXPORTS[f"hist_{_x}"] = (_hist, "void(" + ", ".join(
        [_A("int32"), _A("int64"), _A(_x)] + [_A("int64")] * 3 + [_A("boolean"), _A("int64")]) + ")")
    _EXPORTS[f"keep_{_x}"] = (_keep, "int64(" + ", ".join(
        [_A("int32"), _A("int64"), _A(_x)] + [_A("int64")] * 2 + ["int64", _A("int64"), _A("int64")]) + ")")
_LOOPS = aot.Loops(_MODULE, Path(__file__), "timeline", _EXPORTS, "the timeline overview's and run tables' loops")


def enabled() -> bool:
    """Run the compiled loops? (ENGINE "auto" and an AOT build on disk or numba to make one)"""
    return _LOOPS.enabled(ENGINE)


def get(name: str):
    return _LOOPS.compiled().get(name)


def _i64(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.int64)


def lane_columns(rank, block, warp, it) -> tuple[str, list[np.ndarray]]:
    """(variant, the columns) at a compiled width: the stored schema's as they are, else int64."""
    cols = [rank, block, warp, it]
    if tuple(c.dtype.name for c in cols) == WIDTHS["schema"]:
        return "schema", [np.ascontiguousarray(c) for c in cols]
    return "wide", [_i64(c) for c in cols]


def scan(kind, host_c: int, span_c: int, lanes: tuple[str, list], phase, n0: int, begin, end, opened,
         radix: np.ndarray, sizes: tuple[int, int, int, int]) -> dict:
    """_scan's outputs by name. sizes: lanes, extents, iterations, groups (the radix's ranges)."""
    n_lanes, n_ext, n_it, n_g = sizes
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    out = {"last": np.full(n_lanes, -1, np.int64), "lo": np.full(n_ext, big, np.int64),
           "hi": np.full(n_ext, small, np.int64), "events": np.zeros(n_ext, np.int64),
           "spans": np.zeros(n_ext, np.int64), "open": np.zeros(n_ext, np.int64),
           "it_rows": np.zeros(n_it, np.int64), "g_seen": np.zeros(n_it * n_g, np.bool_),
           "p_seen": np.zeros(n_it * 2 * n0, np.bool_)}
    get(f"scan_{lanes[0]}")(kind, np.int64(host_c), np.int64(span_c), *lanes[1], phase, np.int64(n0), begin, end,
                            np.ascontiguousarray(opened, np.bool_), radix, *out.values())
    return out


def bin_spans(kind, host_c: int, span_c: int, lanes: tuple[str, list], phase, n0: int, begin, end,
              radix: np.ndarray, tiles: dict, cells: int) -> tuple[np.ndarray, ...]:
    """_bin's (one, first, last, diff) over `cells` cells. tiles: g_map, p_map, n_used, bins, off
    (int64), t0, t1, width (float64), per iteration of the radix."""
    acc = tuple(np.zeros(cells, np.float64) for _ in range(4))
    get(f"bin_{lanes[0]}")(kind, np.int64(host_c), np.int64(span_c), *lanes[1], phase, np.int64(n0), begin, end,
                           radix, *(tiles[k] for k in ("g_map", "p_map", "n_used", "bins", "off", "t0", "t1", "width")),
                           *acc)
    return acc


def coarse_means(flat: np.ndarray, start: int, n_keys: int, nb: int, r: int) -> np.ndarray | None:
    """_coarse of the rows (nb + 1 cells) from `start` of flat: [keys x nb / r], or None where r is
    past numpy's one pairwise block (128; the tiles' r is at most MAX_BINS / MIN_BINS = 64)."""
    if r > 128:
        return None
    out = np.empty(n_keys * (nb // r), np.float64)
    get("coarse")(flat, np.int64(start), np.int64(n_keys), np.int64(nb + 1), np.int64(nb), np.int64(r), out)
    return out


def combine(acc: tuple, start: int, stop: int, width: int) -> np.ndarray:
    """_combine over cells [start, stop) of bin_spans' sums: the tile's flat grid (a view of acc[0])."""
    get("combine")(*acc, np.int64(start), np.int64(stop), np.int64(width))
    return acc[0][start:stop]


def span_groups(kind, span_c: int, kernel, phase, n_k: int, n_p: int, rank, begin, end, n_kinds: int):
    """run_tables.chunk_part's per-span work in two passes: (rows per kind code, distinct group keys
    ascending as (kernel x n_p + phase) x n_r + rank - r0 with r0 and n_r, each span's group and
    duration, per group count / sum / max / min); None where a span's kernel or phase code is
    missing or the codes are not int8 (the numpy path then runs)."""
    if kind.dtype != np.int8 or kernel.dtype != np.int8 or phase.dtype != np.int8:
        return None
    w, (rank,) = ("schema", [np.ascontiguousarray(rank)]) if rank.dtype == np.int16 else ("wide", [_i64(rank)])
    r0 = int(rank.min()) if rank.size else 0
    n_r = int(rank.max()) - r0 + 1 if rank.size else 1
    kinds = np.zeros(n_kinds, np.int64)
    seen = np.zeros(n_k * n_p * n_r, np.bool_)
    head = (kind, np.int64(span_c), kernel, phase, np.int64(n_p), rank, np.int64(r0), np.int64(n_r))
    if not get(f"groups_{w}")(*head, kinds, seen):
        return None
    uk = np.flatnonzero(seen)
    index = np.cumsum(seen, dtype=np.int64) - 1
    n_s = int(kinds[span_c]) if 0 <= span_c < n_kinds else 0
    gi, dur = np.empty(n_s, np.int32), np.empty(n_s, np.int64)
    stats = (np.zeros(uk.size, np.int64), np.zeros(uk.size, np.int64), np.full(uk.size, np.iinfo(np.int64).min),
             np.full(uk.size, np.iinfo(np.int64).max))
    get(f"group_stats_{w}")(*head, _i64(begin), _i64(end), index, gi, dur, *stats)
    return kinds, uk, r0, n_r, gi, dur, stats


def lane_runs(ev, kernel, gpu):
    """(first row of each GPU lane run, its first begin to last end) as run_tables._lane_runs finds
    the runs, or None for codes wider than int8 (the numpy path then runs)."""
    if kernel.dtype != np.int8:
        return None
    cols = [ev[c].to_numpy() for c in ("rank", "launch", "block", "warp")]
    if tuple(c.dtype.name for c in cols) == _RUN_WIDTHS["schema"]:
        w, cols = "schema", [np.ascontiguousarray(c) for c in cols]
    else:
        w, cols = "wide", [_i64(c) for c in cols]
    f = get(f"lane_runs_{w}")
    args = (*cols, kernel, np.ascontiguousarray(gpu, np.bool_), _i64(ev["begin_ns"].to_numpy()),
            _i64(ev["end_ns"].to_numpy()))
    # a lane's run holds many rows (~600 at 10 M events): room for a run every 8 rows (untouched
    # pages cost nothing), and a second pass past it
    cap = min(len(gpu), 1024 + len(gpu) // 8)
    starts, ext = np.empty(cap, np.int64), np.empty(cap, np.int64)
    m = int(f(*args, starts, ext))
    if m > cap:
        starts, ext = np.empty(m, np.int64), np.empty(m, np.int64)
        assert f(*args, starts, ext) == m
    return starts[:m], ext[:m]


def _spill_args(group, gmap, x):
    name = "int32" if x.dtype == np.int32 else "int64"
    return name, (np.ascontiguousarray(group, np.int32), _i64(gmap), np.ascontiguousarray(x, name))


def hist(group, gmap, x, lo, hi, binw, count, out) -> None:
    """_hist over one spill (group: its rows' chunk group; gmap: chunk group -> run-wide group)."""
    name, head = _spill_args(group, gmap, x)
    get(f"hist_{name}")(*head, *(_i64(a).reshape(-1) for a in (lo, hi, binw)), np.ascontiguousarray(count, np.bool_),
                        out.reshape(-1))


def keep(group, gmap, x, lo, hi, m: int, out_g: np.ndarray, out_x: np.ndarray) -> int:
    """_keep over one spill: its (group, value) pairs inside their group's [lo, hi] appended to
    out_g / out_x (int64) from m on while they fit; returns the new end (past the outputs: more
    than fit)."""
    name, head = _spill_args(group, gmap, x)
    return int(get(f"keep_{name}")(*head, _i64(lo), _i64(hi), np.int64(m), out_g, out_x))
