"""What `epscope report` prints beside the pages' analyses, computed in the analyses' one pass.

The report's tables used to be computed from the whole event table at each `epscope report`
(14 s and 2.8 GB at 10 M events, killed past 10 GB at 100 M: issue 31). They are now numbers of
the run computed chunk by chunk with the other analyses (profiler.analysis.chunked) and stored
with them (profiler.analysis.stored), so a report of an analysed run reads a few small tables:

  - `kinds`: rows per event kind of the table every page analyses (unfinished waits closed:
    profiler.analysis.unfinished, whose added departure rows count);
  - `kernels` / `kernel_ranks`: GPU time per launch (first warp start to last warp finish, from
    the launch table), its median per kernel and per (kernel, rank), and the median host call
    start to first warp start;
  - `phases`: per (kernel, phase, rank) of the spans: count, summed, median and longest span time
    and the share of warp time (the summed span time over the warps' summed active time, first to
    last record, of that kernel on that rank);
  - `unfinished`: the rows no kernel ended (count) and the longest of them.

Counts, sums and maxima add up over chunks. A median does not: each chunk spills its spans'
(group, duration) pairs (profiler.analysis.spill: to disk in `epscope analyze`), and the exact
order statistics are selected from them afterwards, a few passes over the spills with a
histogram that narrows each group's window by HIST_BINS a pass (`select`): memory is one chunk's
spill plus groups x HIST_BINS counts, whatever the run's length. The numbers are those of the
whole table computed at once (pandas' groupby median: the middle value, or the mean of the two
middle values as float64); tests/analysis/test_run_tables.py holds them equal.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import timeline_fast as TF
from .keys import pack
from .lanes import codes
from .spill import Spill

KINDS = ("span", "instant", "arrive", "depart", "host")
UNKNOWN = -1               # launch times on the run timeline may be negative; -1 alone means unknown (schema)
# kernel_order / phase_order: the names' places in the event table's categories (the order the
# report lists them in; a stored table keeps names as strings)
PHASE_COLUMNS = ["kernel", "phase", "rank", "count", "sum", "median", "max", "share", "kernel_order", "phase_order"]
UNFINISHED_COLUMNS = ["count", "rank", "kernel", "phase", "duration_ns", "block", "warp"]
KERNEL_COLUMNS = ["kernel", "launches", "median_ns", "host_start_ns"]
KERNEL_RANK_COLUMNS = ["kernel", "rank", "median_ns"]
# the median selection (select): bins of its histogram (a group's window narrows by this factor a
# pass), and how many values it keeps, all groups together, to sort (4 M: 32 MB)
HIST_BINS = 4096
SELECT_KEEP = 1 << 22
RANK_RADIX = 1 << 16       # ranks are int16 >= 0: a group id is (kernel, phase) * RANK_RADIX + rank


@dataclass
class RunTables:
    kinds: pd.DataFrame            # kind, events
    kernels: pd.DataFrame          # KERNEL_COLUMNS
    kernel_ranks: pd.DataFrame     # KERNEL_RANK_COLUMNS
    phases: pd.DataFrame           # PHASE_COLUMNS, in (kernel, phase, rank) category order
    unfinished: pd.DataFrame       # UNFINISHED_COLUMNS, one row when the run has unfinished rows, else none

    @property
    def events(self) -> int:
        return int(self.kinds["events"].sum())

    def kind_count(self, kind: str) -> int:
        k = self.kinds[self.kinds["kind"] == kind]
        return int(k["events"].iloc[0]) if len(k) else 0


@dataclass
class ChunkPart:
    """One chunk's share of the run's tables (its spans' durations spilled under `name`)."""
    kinds: np.ndarray              # rows per kind of KINDS
    groups: pd.DataFrame           # gid, count, sum, max, min: per (kernel, phase, rank) of its spans
    warp_time: pd.DataFrame        # kernel (code), rank, ns
    unfinished: dict | None        # count and the longest unfinished row (with its order key)
    kernel_names: tuple
    phase_names: tuple
    name: str

    def span_phases(self) -> frozenset:
        """The names of the phases its spans have (its groups' phases: no pass over the rows)."""
        kp = self.groups["gid"].to_numpy() // RANK_RADIX
        return frozenset(self.phase_names[int(c)] for c in np.unique(kp % len(self.phase_names))) \
            if len(kp) else frozenset()


def _dense(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct non-negative keys ascending, each element's index into them), by a bincount over
    the keys' range when it is small beside the array (no sort of the elements)."""
    if key.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    top = int(key.max()) + 1
    if top > max(4 * key.size, 1 << 16):
        u, inv = np.unique(key, return_inverse=True)
        return u.astype(np.int64), inv.reshape(-1).astype(np.int64)
    seen = np.bincount(key, minlength=top) > 0
    return np.flatnonzero(seen).astype(np.int64), (np.cumsum(seen) - 1)[key]


def _codes(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(codes, names) of a column: a categorical's own codes (no copy, no widening), else codes
    of its values (lanes.codes)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.array.codes, np.asarray(col.cat.categories.astype(str), dtype=object)
    return codes(col)


_LANE_COLUMNS = ("rank", "launch", "block", "warp")


def _lane_runs(ev: pd.DataFrame, kc: np.ndarray, gpu: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(the GPU rows in lane order, where each lane starts) when the table holds each lane (rank,
    launch, kernel, block, warp) as one contiguous run, as the decoder writes it: found by
    comparing neighbours in place, no copy and no sort; None when a lane comes back later
    (closing appended departures)."""
    cols = [ev[c].to_numpy() for c in _LANE_COLUMNS] + [kc, gpu]
    change = np.zeros(len(gpu), bool)
    change[0] = True
    for v in cols:
        change[1:] |= v[1:] != v[:-1]
    starts = np.flatnonzero(change)
    keep = gpu[starts]                                 # a run is all GPU rows or none
    heads = pd.DataFrame({i: v[starts[keep]] for i, v in enumerate(cols[:-1])})
    if heads.duplicated().any():
        return None
    ends = np.r_[starts[1:], len(gpu)]
    lengths = (ends - starts)[keep]
    rows = np.flatnonzero(gpu)
    return rows, np.r_[0, np.cumsum(lengths)[:-1]]


def _lane_sorted(ev: pd.DataFrame, kc: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows in lane order, where each lane starts), by a sort of their lanes (keys.pack)."""
    key = pack([ev[c].to_numpy()[rows].astype(np.int64) - int(ev[c].to_numpy()[rows].min())
                for c in _LANE_COLUMNS] + [kc[rows].astype(np.int64)])
    order = np.argsort(key, kind="stable")
    key = key[order]
    return rows[order], np.flatnonzero(np.r_[True, key[1:] != key[:-1]])


def _runs_compiled(ev: pd.DataFrame, kc: np.ndarray, gpu: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(first row of each GPU lane run, its active time) by timeline_fast's one pass, when each
    lane is one run (as _lane_runs; None otherwise or where the pass cannot run)."""
    got = TF.lane_runs(ev, kc, gpu) if TF.enabled() else None
    if got is None:
        return None
    first, ext = got
    heads = [ev[c].to_numpy()[first].astype(np.int64) for c in _LANE_COLUMNS] + [kc[first].astype(np.int64)]
    key = np.sort(pack([h - int(h.min()) if h.size else h for h in heads]))
    return None if bool((key[1:] == key[:-1]).any()) else (first, ext)


def _warp_time(kc: np.ndarray, ev: pd.DataFrame, gpu: np.ndarray) -> pd.DataFrame:
    """Per (kernel code, rank): the summed active time (first record to last) of the GPU lanes
    (rank, launch, block, warp) of that kernel."""
    if not gpu.any():
        return pd.DataFrame({"kernel": np.zeros(0, np.int64), "rank": np.zeros(0, np.int64),
                             "ns": np.zeros(0, np.int64)})
    got = _runs_compiled(ev, kc, gpu)
    if got is not None:
        first, ext = got
    else:
        got = _lane_runs(ev, kc, gpu)
        rows, starts = got if got is not None else _lane_sorted(ev, kc, np.flatnonzero(gpu))
        b = ev["begin_ns"].to_numpy()[rows]
        ext = np.maximum.reduceat(ev["end_ns"].to_numpy()[rows], starts)
        ext -= np.minimum.reduceat(b, starts)
        del b
        first = rows[starts]
    lk = kc[first].astype(np.int64) * RANK_RADIX + ev["rank"].to_numpy()[first]
    u, inv = _dense(lk)
    ns = np.zeros(u.size, np.int64)
    np.add.at(ns, inv, ext.astype(np.int64))
    return pd.DataFrame({"kernel": u // RANK_RADIX, "rank": u % RANK_RADIX, "ns": ns})


def _unfinished(ev: pd.DataFrame, n_orig: int, rows: np.ndarray, kc, pc, kn, pn) -> dict | None:
    """The chunk's unfinished rows: how many, and the longest with the key that orders it in the
    whole closed table (ties: the first there; closing appends its departure rows after the
    table's, in the order of their arrivals)."""
    op = np.flatnonzero(ev["open"].to_numpy(bool))
    if op.size == 0:
        return None
    d = ev["end_ns"].to_numpy()[op] - ev["begin_ns"].to_numpy()[op]
    top = d.max()
    cand = op[d == top]
    orig = cand[cand < n_orig]
    if orig.size:
        i, key = int(orig[0]), (0, int(rows[orig[0]]))
    else:
        i = int(cand[0])
        key = (1, _arrival_row(ev, i, n_orig, rows))
    g = lambda c: int(ev[c].to_numpy()[i])
    return {"count": int(op.size), "duration_ns": int(top), "key": key, "rank": g("rank"),
            "kernel": str(kn[kc[i]]), "phase": str(pn[pc[i]]), "block": g("block"), "warp": g("warp")}


def _arrival_row(ev: pd.DataFrame, i: int, n_orig: int, rows: np.ndarray) -> int:
    """Whole-table row of the arrival an appended departure row i closes (same warp, barrier and
    occurrence; the latest such arrival before the appended rows, as closing made one a row)."""
    cols = ["rank", "launch", "block", "warp", "payload", "phase"]
    head = ev.iloc[:n_orig]
    m = np.ones(n_orig, bool)
    for c in cols:
        m &= head[c].to_numpy() == ev[c].to_numpy()[i]
    m &= head["kind"].to_numpy() == "arrive"
    hits = np.flatnonzero(m)
    # an arrival per (warp, barrier, occurrence) lacks its departure: the first is closing's
    return int(rows[hits[0]]) if hits.size else int(rows[-1]) + 1 + i


def _span_groups_numpy(kind_c, kind_n, span, kc, pc, n_p: int, ev: pd.DataFrame):
    """(rows per kind of KINDS, group ids, count / sum / max / min per group, each span's group and
    duration): numpy's way."""
    counts = np.bincount(kind_c[kind_c >= 0], minlength=len(kind_n))
    rank = ev["rank"].to_numpy()[span].astype(np.int64)
    dur = ev["end_ns"].to_numpy()[span] - ev["begin_ns"].to_numpy()[span]
    # (kernel, phase, rank) over the chunk's rank range: a small key space, counted without a sort
    r0 = int(rank.min()) if rank.size else 0
    nr = int(rank.max()) - r0 + 1 if rank.size else 1
    key = kc[span].astype(np.int64)
    key *= n_p
    key += pc[span]
    key *= nr
    rank -= r0
    key += rank
    del rank
    uk, gi = _dense(key)
    del key
    n = uk.size
    cnt = np.bincount(gi, minlength=n).astype(np.int64)
    tot = np.zeros(n, np.int64)
    np.add.at(tot, gi, dur)
    mx = np.full(n, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(mx, gi, dur)
    mn = np.full(n, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(mn, gi, dur)
    return counts, (uk // nr) * RANK_RADIX + uk % nr + r0, (cnt, tot, mx, mn), gi, dur


def _span_groups(kind_c, kind_n, kc, pc, n_k: int, n_p: int, ev: pd.DataFrame):
    """_span_groups_numpy's result, through timeline_fast's two passes where they can run."""
    span_c = list(kind_n).index("span") if "span" in kind_n else -2
    got = TF.span_groups(kind_c, span_c, kc, pc, n_k, n_p, ev["rank"].to_numpy(), ev["begin_ns"].to_numpy(),
                         ev["end_ns"].to_numpy(), len(kind_n)) if TF.enabled() else None
    if got is None:
        return _span_groups_numpy(kind_c, kind_n, kind_c == span_c, kc, pc, n_p, ev)
    counts, uk, r0, n_r, gi, dur, stats = got
    return counts, (uk // n_r) * RANK_RADIX + uk % n_r + r0, stats, gi, dur


def chunk_part(ev: pd.DataFrame, n_orig: int, rows: np.ndarray, spill: Spill, name: str) -> ChunkPart:
    """The chunk's share. ev: its closed table (profiler.analysis.unfinished.close) of n_orig
    rows of the chunk (whole-table row numbers `rows`) and the departures closing appended."""
    kind_c, kind_n = _codes(ev["kind"])
    kc, kn = _codes(ev["kernel"])
    pc, pn = _codes(ev["phase"])
    counts, ug, (cnt, tot, mx, mn), gi, dur = _span_groups(kind_c, kind_n, kc, pc, len(kn), len(pn), ev)
    kinds = np.array([int(counts[list(kind_n).index(k)]) if k in kind_n else 0 for k in KINDS], np.int64)
    host = kind_c == (list(kind_n).index("host") if "host" in kind_n else -2)
    gpu = ~host
    narrow = dur.size == 0 or (int(mn.min()) >= 0 and int(mx.max()) < 2**31)
    spill.put(name, {"group": gi.astype(np.int32, copy=False), "duration": dur.astype(np.int32) if narrow else dur})
    return ChunkPart(kinds=kinds, groups=pd.DataFrame({"gid": ug, "count": cnt, "sum": tot, "max": mx, "min": mn}),
                     warp_time=_warp_time(kc, ev, gpu), unfinished=_unfinished(ev, n_orig, rows, kc, pc, kn, pn),
                     kernel_names=tuple(map(str, kn)), phase_names=tuple(map(str, pn)), name=name)


# -- combining the chunks' shares ----------------------------------------------------------------
def _groups(parts: list[ChunkPart]) -> pd.DataFrame:
    """The run's (kernel, phase, rank) groups of spans, by group id: counts and sums added, the
    longest and shortest kept."""
    g = pd.concat([p.groups for p in parts], ignore_index=True)
    if not len(g):
        return g
    return g.groupby("gid", sort=True).agg(count=("count", "sum"), sum=("sum", "sum"), max=("max", "max"),
                                           min=("min", "min")).reset_index()


def _spilled(parts: list[ChunkPart], spill: Spill, gids: np.ndarray):
    """Each chunk's spilled spans as (its group -> run-wide group index, its rows' group, duration),
    one chunk at a time."""
    for p in parts:
        arr = spill.get(p.name)
        yield np.searchsorted(gids, p.groups["gid"].to_numpy()), arr["group"], arr["duration"]
        del arr


def _count(parts: list[ChunkPart], spill: Spill, gids: np.ndarray, win: tuple, count: list[bool],
           hist: np.ndarray) -> None:
    """select's histogram pass: each spilled value inside wanted value t's window of its group,
    win = (lo, hi, bin width) [T x groups], counted into hist[t] (groups x HIST_BINS) for the t
    with count[t]."""
    lo, hi, binw = win
    G = len(gids)
    for gmap, grp, x in _spilled(parts, spill, gids):
        if TF.enabled():
            TF.hist(grp, gmap, x, lo, hi, binw, np.asarray(count), hist)
            continue
        g = gmap[grp]
        for t in np.flatnonzero(count):
            lo_e = lo[t, g]
            inw = (x >= lo_e) & (x <= hi[t, g])
            gi = g[inw]
            hist[t] += np.bincount(gi * HIST_BINS + (x[inw] - lo_e[inw]) // binw[t, gi], minlength=G * HIST_BINS)


def _kept(parts: list[ChunkPart], spill: Spill, gids: np.ndarray, lo: np.ndarray, hi: np.ndarray,
          cap: int) -> tuple[np.ndarray, np.ndarray]:
    """(run-wide group index, value) of every spilled value inside its group's [lo, hi], chunk
    after chunk in spill order. cap: how many there are at most (the histogram's counts)."""
    if TF.enabled():
        out_g, out_x = np.empty(cap, np.int64), np.empty(cap, np.int64)
        m = 0
        for gmap, grp, x in _spilled(parts, spill, gids):
            m = TF.keep(grp, gmap, x, lo, hi, m, out_g, out_x)
        if m <= cap:
            return out_g[:m], out_x[:m]
    kg, kx = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for gmap, grp, x in _spilled(parts, spill, gids):
        g = gmap[grp]
        inw = (x >= lo[g]) & (x <= hi[g])
        kg.append(g[inw])
        kx.append(x[inw].astype(np.int64))
    return np.concatenate(kg), np.concatenate(kx)


def _same_windows(lo: np.ndarray, hi: np.ndarray) -> list[int]:
    """For each wanted value, the first one with the same windows (itself when none before)."""
    out = []
    for t in range(len(lo)):
        out.append(next(u for u in range(t + 1) if np.array_equal(lo[u], lo[t]) and np.array_equal(hi[u], hi[t])))
    return out


def select(parts: list[ChunkPart], spill: Spill, groups: pd.DataFrame, ks: list[np.ndarray]) -> list[np.ndarray]:
    """The k-th smallest span durations (0-based; each array of ks one k per group row) of each
    group over every chunk's spill, exactly. Each wanted value has a window per group, [lo, hi],
    first the group's whole range; a pass reads each spill once and counts its values into
    HIST_BINS bins of every window, which then narrows to the bin holding its value. Once the
    values left in the windows are few (SELECT_KEEP) or every window is one value, a last pass
    keeps them and the answers are read from them sorted: two passes for span durations below
    HIST_BINS x SELECT_KEEP / groups ns (a median's two middle values share their windows)."""
    G, T = len(groups), len(ks)
    gids = groups["gid"].to_numpy()
    lo = np.tile(groups["min"].to_numpy().astype(np.int64), (T, 1))
    hi = np.tile(groups["max"].to_numpy().astype(np.int64), (T, 1))
    below = np.zeros((T, G), np.int64)                     # the group's values below lo
    left = np.tile(groups["count"].to_numpy().astype(np.int64), (T, 1))   # ... in [lo, hi]
    K = np.stack(ks).astype(np.int64)
    rows = np.arange(G)
    while int(left.sum()) > SELECT_KEEP and bool((hi > lo).any()):
        binw = (hi - lo) // HIST_BINS + 1                  # ceil((hi - lo + 1) / HIST_BINS)
        hist = np.zeros((T, G * HIST_BINS), np.int64)
        same = _same_windows(lo, hi)
        _count(parts, spill, gids, (lo, hi, binw), [same[t] == t for t in range(T)], hist)   # once a window
        for t in range(T):
            cum = below[t][:, None] + np.cumsum(hist[same[t]].reshape(G, HIST_BINS), axis=1)
            j = np.argmax(cum > K[t][:, None], axis=1)        # the bin holding the value
            new_below = np.where(j > 0, cum[rows, np.maximum(j - 1, 0)], below[t])
            left[t] = cum[rows, j] - new_below
            below[t] = new_below
            lo[t], hi[t] = lo[t] + j * binw[t], np.minimum(lo[t] + (j + 1) * binw[t] - 1, hi[t])
    if T > 1 and bool(np.all(np.abs(K - K[0]) <= 1)):
        return _select_adjacent(parts, spill, gids, (lo, hi, left), below, K)
    same = _same_windows(lo, hi)
    kept = [_kept(parts, spill, gids, lo[t], hi[t], int(left[t].sum())) if same[t] == t else None for t in range(T)]
    out = []
    for t in range(T):
        kg, kx = kept[same[t]]
        order = np.lexsort((kx, kg))
        first = np.searchsorted(kg[order], rows)             # each group's first kept value
        out.append(kx[order][first + (K[t] - below[t])])
    return out


def _select_adjacent(parts: list[ChunkPart], spill: Spill, gids: np.ndarray, win: tuple, below: np.ndarray,
                     K: np.ndarray) -> list[np.ndarray]:
    """select's last pass when every group's wanted ranks are adjacent (a median's two middle
    values): one pass keeps the values of each group's windows together, [min lo, max hi], instead
    of one pass per window (a third of the medians' CPU, issue 31). Exact and no larger: no value
    lies strictly between the k-th and the (k+1)-th smallest, so the union window holds the
    windows' values and nothing else. Each rank is then read from its own window's values, which
    the union's (group, value) order keeps sorted."""
    lo, hi, left = win
    ulo, uhi = lo.min(axis=0), hi.max(axis=0)
    kg, kx = _kept(parts, spill, gids, ulo, uhi, int(left.sum()))   # the union holds at most both windows' values
    order = np.lexsort((kx, kg))
    kg, kx = kg[order], kx[order]
    rows = np.arange(len(gids))
    out = []
    for t in range(len(K)):
        m = (kx >= lo[t, kg]) & (kx <= hi[t, kg])
        sg, sx = kg[m], kx[m]
        first = np.searchsorted(sg, rows)                     # each group's first value in its window
        out.append(sx[first + (K[t] - below[t])])
    return out


def _medians(parts: list[ChunkPart], spill: Spill, groups: pd.DataFrame) -> np.ndarray:
    """Each group's median span duration as pandas' groupby computes it: the middle value, or
    the mean of the two middle values, as float64."""
    n = groups["count"].to_numpy()
    a, b = select(parts, spill, groups, [(n - 1) // 2, n // 2])
    return np.where(n % 2 == 1, a.astype(np.float64), (a.astype(np.float64) + b.astype(np.float64)) / 2)


def _phases(parts: list[ChunkPart], spill: Spill) -> pd.DataFrame:
    p0 = parts[0]
    g = _groups(parts)
    if not len(g):
        g = pd.DataFrame({c: np.zeros(0, np.int64) for c in ("gid", "count", "sum", "max", "min")})
    wt = pd.concat([p.warp_time for p in parts], ignore_index=True).groupby(["kernel", "rank"])["ns"].sum()
    gid = g["gid"].to_numpy()
    kp, rank = gid // RANK_RADIX, gid % RANK_RADIX
    kcode, pcode = kp // len(p0.phase_names), kp % len(p0.phase_names)
    share = g["sum"].to_numpy() / wt.reindex(pd.MultiIndex.from_arrays([kcode, rank])).to_numpy()
    kn, pn = np.asarray(p0.kernel_names, dtype=object), np.asarray(p0.phase_names, dtype=object)
    return pd.DataFrame({
        "kernel": pd.array(kn[kcode] if len(kn) else [], dtype="str"),
        "phase": pd.array(pn[pcode] if len(pn) else [], dtype="str"),
        "rank": rank.astype(np.int64), "count": g["count"].to_numpy(), "sum": g["sum"].to_numpy(),
        "median": _medians(parts, spill, g) if len(g) else np.zeros(0), "max": g["max"].to_numpy(), "share": share,
        "kernel_order": kcode.astype(np.int64), "phase_order": pcode.astype(np.int64)})


def _unfinished_row(parts: list[ChunkPart]) -> pd.DataFrame:
    got = [p.unfinished for p in parts if p.unfinished is not None]
    if not got:
        return pd.DataFrame({c: pd.Series([], dtype=object if c in ("kernel", "phase") else np.int64)
                             for c in UNFINISHED_COLUMNS})
    best = min(got, key=lambda u: (-u["duration_ns"], u["key"]))
    row = {c: best[c] for c in UNFINISHED_COLUMNS if c != "count"}
    row["count"] = sum(u["count"] for u in got)
    return pd.DataFrame([row], columns=UNFINISHED_COLUMNS)


def kernel_tables(launches: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kernels, kernel_ranks): GPU time per launch, first warp start to last warp finish, its
    median per kernel (over launches) and per (kernel, rank); the median host call start to first
    warp start over the launches with a host time (NaN without)."""
    if launches is None:
        launches = pd.DataFrame({c: pd.Series([], dtype=np.int64) for c in
                                 ("rank", "gpu_begin_ns", "gpu_end_ns", "host_begin_ns")}).assign(kernel="")
    la = launches[launches["gpu_begin_ns"] != UNKNOWN]
    dur = la["gpu_end_ns"] - la["gpu_begin_ns"]
    la = la.assign(dur=dur)
    rows, per = [], []
    for k, g in la.groupby("kernel", observed=True, sort=True):
        med = g.groupby("rank")["dur"].median()
        h = g[g["host_begin_ns"] != UNKNOWN]
        rows.append({"kernel": str(k), "launches": len(g), "median_ns": float(g["dur"].median()),
                     "host_start_ns": float((h["gpu_begin_ns"] - h["host_begin_ns"]).median()) if len(h) else np.nan})
        per.append(pd.DataFrame({"kernel": str(k), "rank": med.index.to_numpy().astype(np.int64),
                                 "median_ns": med.to_numpy(np.float64)}))
    kernels = pd.DataFrame(rows, columns=KERNEL_COLUMNS).astype({"launches": np.int64, "median_ns": np.float64,
                                                                 "host_start_ns": np.float64})
    ranks = pd.concat(per, ignore_index=True) if per else pd.DataFrame({c: [] for c in KERNEL_RANK_COLUMNS})
    return kernels, ranks.astype({"rank": np.int64, "median_ns": np.float64})


def finish(parts: list[ChunkPart], spill: Spill, launches: pd.DataFrame | None) -> RunTables:
    """The run's tables from its chunks' shares (in any order) and its launch table (None: no
    kernel times)."""
    if not parts:
        raise ValueError("run_tables: no chunks")
    p0 = parts[0]
    for p in parts[1:]:
        if (p.kernel_names, p.phase_names) != (p0.kernel_names, p0.phase_names):
            # every chunk of one run carries the whole table's categories (runreader; iloc keeps them)
            raise ValueError("run_tables: chunks with different kernel or phase categories")
    kinds = pd.DataFrame({"kind": list(KINDS), "events": np.sum([p.kinds for p in parts], axis=0).astype(np.int64)})
    kernels, kernel_ranks = kernel_tables(launches)
    return RunTables(kinds=kinds, kernels=kernels, kernel_ranks=kernel_ranks, phases=_phases(parts, spill),
                     unfinished=_unfinished_row(parts))
