"""A run's timeline overview: busy time per phase per lane group per time bin, one tile a iteration.

The viewer's timeline draws, zoomed out, one heatmap cell per (row, time bin): the phase holding
most of the cell's busy time, shaded by busy share. Building that from the event table needs the
whole table (47 bytes an event of index plus the table at 10 M events; 100 M would need 5+ GB,
issue 20). This module computes what those views need once, at analyze time, chunk by chunk
(profiler.analysis.chunked feeds it each chunk's events, unfinished waits closed), so the viewer
draws the whole run and wide windows without reading events, and reads only the (rank, iteration)
row groups of a narrow window (profiler.store.runreader.EventReader):

  - `tiles`: one per iteration, over the time its events cover (all ranks). Each tile holds busy
    time per (group, phase, bin) at two resolutions: `fine` per (rank, host) group at
    `tiles.bins` bins (the rank rows the page opens on), `coarse` per (rank, block) group at
    `tiles.coarse_bins` bins (the block rows of a drill-down: one rank's events a bin, so a
    tenth of the fine bins' at 8 ranks). Busy time is in units of a bin's width (1.0: one lane
    busy the whole bin), exactly binned_busy's.
  - `extents`: per (rank, iteration) its time span, events, spans and unfinished spans: which row
    groups a window needs, and how many events reading them costs.
  - `lanes`: every (rank, block, warp) lane and its role (host events: block = warp = -1).
  - `phases`: the timeline's phase names (host spans "host <phase>", so they never share a device
    phase's colour), in the order the viewer's full index numbers them.

Bins per tile follow the iteration's events (BIN_EVENTS events a bin, clamped to
[MIN_BINS, MAX_BINS]; coarse bins the same of one rank's share of them): the tiles resolve a
window down to about one iteration, below which a read costs one iteration's row groups anyway. Pure: numpy and pandas, no viewer imports.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import timeline_fast as TF

# Events a fine bin covers at most. 100 M events in 100 iterations (1 M each): 512 bins a tile, 16
# (rank, host) rows x 7 phases x 512 x 100 tiles = 5.7 M cells (23 MB); the page draws 320 bins,
# so tiles alone serve any window of 0.6 iteration or more. Coarse (per block) bins: one rank's
# 125 k events / 2000 -> 64 bins, 136 groups x 7 x 64 x 100 = 6.1 M cells (24 MB).
BIN_EVENTS = 2000
MIN_BINS = 64
MAX_BINS = 4096


def binned_busy(begin: np.ndarray, end: np.ndarray, key: np.ndarray, n_keys: int,
                t0: float, t1: float, bins: int) -> np.ndarray:
    """Exact busy time of spans per (key, bin), in units of bin widths: out[k, j] = total
    overlap of key k's spans with bin j divided by the bin width (so 1.0 = one lane fully busy).
    Vectorised: each span adds its partial first and last bins, and its full bins in between
    through a difference array."""
    width = (t1 - t0) / bins
    if begin.size == 0 or width <= 0:
        return np.zeros((n_keys, bins), dtype=np.float64)
    fb = np.clip(begin, t0, t1)          # float64, in place from here: fresh arrays of millions of
    fb -= t0                             # rows are most of the cost (issue 20, NOTES)
    fb /= width
    fe = np.clip(end, t0, t1)
    fe -= t0
    fe /= width
    # fb, fe >= 0: truncation is floor
    ib = np.minimum(fb.astype(np.int64), bins - 1)
    ie = np.minimum(fe.astype(np.int64), bins - 1)
    size = n_keys * (bins + 1)
    bi = np.asarray(key).astype(np.int64, copy=False) * (bins + 1)
    ei = bi + ie
    bi += ib
    # Spans that add nothing (empty after clipping, or ending before they begin) and the other
    # kind of span in each sum weigh 0 rather than being selected out: x + 0.0 == x, so every
    # bin's sum is the same float as over the selected spans in table order, without copying
    # most of the rows (87 % of a 10 M-event run's spans cross a bin edge).
    one = ib == ie
    flat = np.bincount(bi, weights=np.where(one & (fe > fb), fe - fb, 0.0), minlength=size)
    multi = ie > ib                      # implies fe > fb
    if multi.any():
        flat += np.bincount(bi, weights=np.where(multi, (ib + 1) - fb, 0.0), minlength=size)
        flat += np.bincount(ei, weights=np.where(multi, fe - ie, 0.0), minlength=size)
        ie -= ib
        full = ie > 1
        if full.any():
            diff = np.bincount(bi + 1, weights=full, minlength=size)    # whole counts: exact
            diff -= np.bincount(ei, weights=full, minlength=size)
            flat += np.cumsum(diff.reshape(n_keys, bins + 1), axis=1).reshape(-1)
    return flat.reshape(n_keys, bins + 1)[:, :bins]


def tile_bins(events: int) -> int:
    """Bins of a tile of `events` events: a power of two near events / BIN_EVENTS."""
    want = max(events / BIN_EVENTS, 1.0)
    return int(min(MAX_BINS, max(MIN_BINS, 2 ** int(np.ceil(np.log2(want))))))


def _codes(col: pd.Series) -> tuple[np.ndarray, list[str]]:
    c = col if isinstance(col.dtype, pd.CategoricalDtype) else col.astype("category")
    return c.array.codes, [str(x) for x in c.cat.categories]   # Categorical.codes: a view (.cat.codes copies)


def _dense(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values of non-negative integer codes, ascending; each element's index into
    them): np.unique(return_inverse=True) through a bincount over the codes' range when that range
    is small beside the array (a chunk's lanes, groups and phases), no sort of the elements."""
    if code.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    top = int(code.max()) + 1
    if top > max(4 * code.size, 1 << 16):
        u, inv = np.unique(code, return_inverse=True)
        return u.astype(np.int64), inv.reshape(-1).astype(np.int64)
    seen = np.bincount(code, minlength=top) > 0
    ids = np.cumsum(seen) - 1
    return np.flatnonzero(seen).astype(np.int64), ids[code]


@dataclass
class SpanArrays:
    """An event table's spans as the timeline reads them (host spans apart, block = warp = -1)."""
    rank: np.ndarray
    block: np.ndarray
    warp: np.ndarray
    host: np.ndarray          # per event: a host event
    span: np.ndarray          # per event: drawn as a span (a device span or a host span)
    phase: np.ndarray         # per event: timeline phase code into `names` (-1 none)
    names: list[str]          # device phase categories, then "host <category>" for each
    role: np.ndarray
    roles: list[str]


def span_arrays(events: pd.DataFrame) -> SpanArrays:
    """Per-event arrays of the timeline's reading of an event table: the lane (host events on a
    lane of their own rank), the phase code in a name space of the table's categories (device
    names first, then "host <name>"), and whether the event is drawn as a span."""
    kcode, knames = _codes(events["kind"])
    kc = {n: knames.index(n) if n in knames else -99 for n in ("span", "host")}
    host = kcode == kc["host"]
    rank = events["rank"].to_numpy(np.int64)
    block = events["block"].to_numpy(np.int64)
    warp = events["warp"].to_numpy(np.int64)
    if host.any():
        block = np.where(host, -1, block)
        warp = np.where(host, -1, warp)
    pcode, pnames = _codes(events["phase"])
    n0 = len(pnames)
    phase = pcode.astype(np.int64)
    if host.any():
        phase = np.where(host & (phase >= 0), phase + n0, phase)
    rcode, rnames = _codes(events["role"])
    return SpanArrays(rank, block, warp, host, (kcode == kc["span"]) | host, phase,
                      pnames + [f"host {p}" for p in pnames], rcode.astype(np.int64), rnames)


@dataclass
class Overview:
    """A run's timeline overview (module docstring). Tables, all sorted as described:
    lanes (rank, block, warp, role) by lane; groups (rank, block) by group, block -1 the rank's host
    group; extents (rank, iteration, begin_ns, end_ns, events, spans, open) by (iteration, rank);
    tiles (iteration, begin_ns, end_ns, bins, coarse_bins) by iteration. fine[i]: float32 [rank
    groups, phases, tiles.bins[i]]; coarse[i]: float32 [groups, phases, tiles.coarse_bins[i]]."""
    t_min: int
    t_max: int
    phases: tuple
    lanes: pd.DataFrame
    groups: pd.DataFrame
    extents: pd.DataFrame
    tiles: pd.DataFrame
    fine: list = field(repr=False)
    coarse: list = field(repr=False)

    @property
    def rank_groups(self) -> pd.DataFrame:
        """(rank, host) rows of the fine grids: each rank's device lanes, then its host lanes."""
        g = self.groups
        return pd.DataFrame({"rank": g["rank"].to_numpy(), "host": g["block"].to_numpy() < 0}).drop_duplicates(
            ).sort_values(["rank", "host"]).reset_index(drop=True)

    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.fine) + sum(a.nbytes for a in self.coarse))

    # -- a view's busy time ------------------------------------------------------------------------
    def busy(self, level: str, t0: float, t1: float, bins: int) -> tuple[np.ndarray, float]:
        """Busy time [groups of the level, phases, bins] over [t0, t1) from the tiles, in units of
        an output bin's width, and the coarsest tile bin overlapping the window divided by the
        output bin's width (<= 1: every output bin spans at least one tile bin, the view is as
        sharp as the events'; above, the tiles smear it). level: "rank" (rank_groups rows, the fine
        grids) or "block" (groups rows, the coarse grids). Within a tile bin, time is spread
        evenly (a linear cumulative sum)."""
        grids = self.fine if level == "rank" else self.coarse
        n_g = len(self.rank_groups) if level == "rank" else len(self.groups)
        out = np.zeros((n_g, len(self.phases), bins), dtype=np.float64)
        width = (t1 - t0) / bins
        edges = t0 + width * np.arange(bins + 1)
        worst = 0.0
        tb, te, tn = (self.tiles[c].to_numpy() for c in ("begin_ns", "end_ns", "bins"))
        for i in np.flatnonzero((te > t0) & (tb < t1)):
            g = grids[i]
            nb = g.shape[2]
            lo, hi = float(tb[i]), float(max(te[i], tb[i] + 1))
            bw = (hi - lo) / nb
            worst = max(worst, bw / width)
            pos = np.clip((edges - lo) / bw, 0, nb)        # output edges in tile bins
            j = np.minimum(np.floor(pos).astype(np.int64), nb - 1)
            cum = np.zeros(g.shape[:2] + (nb + 1,), dtype=np.float64)
            np.cumsum(g, axis=2, out=cum[:, :, 1:])
            at = cum[:, :, j] + (cum[:, :, j + 1] - cum[:, :, j]) * (pos - j)
            out += np.diff(at, axis=2) * (bw / width)
        return out, worst

    def window_extents(self, t0: float, t1: float, ranks=None) -> pd.DataFrame:
        """The (rank, iteration) rows whose events overlap [t0, t1] (of `ranks` when given)."""
        e = self.extents
        m = (e["end_ns"].to_numpy() >= t0) & (e["begin_ns"].to_numpy() <= t1)
        if ranks is not None:
            m &= np.isin(e["rank"].to_numpy(), np.asarray(list(ranks), dtype=np.int64))
        return e[m]


def _lane_frame(lpos: np.ndarray, role: np.ndarray, roles: list, n_b: int, n_w: int, origin: tuple) -> pd.DataFrame:
    """The chunk's lanes (rank, block, warp, role) from their dense lane codes (ascending) and the
    role code of each one's last row (as the viewer's full index assigns it; -1: none)."""
    r0, b0, w0 = origin
    role_names = np.asarray(roles + [""], dtype=object)
    lg, lw = np.divmod(lpos, n_w)
    lr, lb = np.divmod(lg, n_b)
    return pd.DataFrame({"rank": lr + r0, "block": lb + b0 - 1, "warp": lw + w0 - 1, "role": role_names[role]})


def _lane_table(lcode: np.ndarray, a, n_b: int, n_w: int, origin: tuple) -> pd.DataFrame:
    """_lane_frame of each event's dense lane code: a lane's role is its last event's."""
    lpos, lane_of = _dense(lcode)
    last = np.full(lpos.size, -1, dtype=np.int64)
    np.maximum.at(last, lane_of, np.arange(lcode.size, dtype=np.int64))
    return _lane_frame(lpos, a.role[last], a.roles, n_b, n_w, origin)


@dataclass
class _Tile:
    """One iteration's busy grid before it is kept (Builder's tiles tuple): grid [groups, phases
    used, bins] float64, groups `ug` packed (rank, block + 1), `used` phase codes."""
    iteration: int
    t0: int
    t1: int
    bins: int
    ug: np.ndarray
    used: np.ndarray
    grid: np.ndarray
    rows: int                 # the iteration's events (all kinds)
    ranks: int                # ranks with events in it


def _coarse_bins(t: _Tile) -> int:
    return min(t.bins, tile_bins(t.rows // max(t.ranks, 1)))     # both powers of two: divides bins


def _kept(t: _Tile, coarse: np.ndarray | None = None) -> tuple:
    """What a tile keeps: the (rank, host) sums at full resolution and the groups' at one rank's
    share (a [groups, phases, bins] grid a tile held 390 MB at 100 M events, these 50 MB). coarse:
    the groups' means when computed already (timeline_fast.coarse_means)."""
    ug, nb, n_u = t.ug, t.bins, t.used.size
    rg, rg_of = np.unique((ug >> 32) * 2 + ((ug & 0xFFFFFFFF) == 0), return_inverse=True)
    fine = np.zeros((rg.size, n_u, nb), dtype=np.float64)
    for i, r in enumerate(rg_of.reshape(-1).tolist()):     # np.add.at's sums, in its order, a group at a time
        fine[r] += t.grid[i]
    nc = _coarse_bins(t)
    if coarse is None:
        coarse = t.grid.reshape(ug.size, n_u, nc, nb // nc).mean(axis=3)
    coarse = coarse.reshape(ug.size, n_u, nc)
    return (t.iteration, t.t0, t.t1, nb, ug, rg, t.used, fine.astype(np.float32), coarse.astype(np.float32))


def _extents_frame(epos: np.ndarray, n_r: int, origin: tuple, lo, hi, events, spans, opened) -> pd.DataFrame:
    i0, r0 = origin
    e_it, e_rank = np.divmod(epos, n_r)
    return pd.DataFrame({"iteration": e_it + i0, "rank": e_rank + r0, "begin_ns": lo, "end_ns": hi,
                         "events": events, "spans": spans, "open": opened})


def _chunk_numpy(events: pd.DataFrame):
    """(phase names, lanes, extents, tiles) of a chunk, numpy's way."""
    a = span_arrays(events)
    n = len(events)
    # Lanes, groups and (iteration, rank) extents through dense mixed-radix codes over the
    # chunk's few values (ranks x blocks x warps: hundreds to thousands) counted with bincount
    # and ufunc.at, not sorts of every event: np.unique(return_index / return_inverse) and
    # pd.factorize(sort=True) were 0.3 of this method's 0.7 s a chunk of 2.5 M events (issue
    # 20, NOTES). The codes order like the packed keys the tables keep, so rows come out sorted.
    b1, w1 = a.block + 1, a.warp + 1           # host events: block = warp = -1 -> 0
    r0, b0, w0 = int(a.rank.min()), int(b1.min()), int(w1.min())
    n_b, n_w = int(b1.max()) - b0 + 1, int(w1.max()) - w0 + 1
    gcode = (a.rank - r0) * n_b + (b1 - b0)    # (rank, block) group, in (rank, block) order
    lcode = gcode * n_w + (w1 - w0)            # (rank, block, warp) lane
    del b1, w1
    lanes = _lane_table(lcode, a, n_b, n_w, (r0, b0, w0))
    del lcode
    it = events["iteration"].to_numpy(np.int64)
    begin = events["begin_ns"].to_numpy(np.int64)
    end = np.maximum(events["end_ns"].to_numpy(np.int64), begin)
    opened = events["open"].to_numpy(bool) if "open" in events else np.zeros(n, bool)
    i0, n_r = int(it.min()), int(a.rank.max()) - r0 + 1
    epos, codes = _dense((it - i0) * n_r + (a.rank - r0))      # (iteration, rank) order
    n_e = epos.size
    lo = np.full(n_e, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(lo, codes, begin)
    hi = np.full(n_e, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(hi, codes, end)
    extents = _extents_frame(epos, n_r, (i0, r0), lo, hi, np.bincount(codes, minlength=n_e).astype(np.int64),
                             np.bincount(codes, weights=a.span, minlength=n_e).astype(np.int64),
                             np.bincount(codes, weights=a.span & opened, minlength=n_e).astype(np.int64))
    # the tiles need only these of the per-event arrays (the rest: 60 MB a chunk of 2.5 M events)
    spanned, phase, names = a.span & (a.phase >= 0), a.phase, a.names
    del codes, opened, a
    return names, lanes, extents, _tiles_numpy(it, spanned, phase, gcode, begin, end, extents, (r0, b0, n_b))


def _tiles_numpy(it, spanned, phase, gcode, begin, end, extents: pd.DataFrame, radix: tuple):
    """Each iteration's tile (a _Tile's kept tuple), numpy's way."""
    r0, b0, n_b = radix
    i0 = int(it.min())
    e_it, lo, hi = (extents[c].to_numpy() for c in ("iteration", "begin_ns", "end_ns"))
    # a chunk holds whole iterations: one stable sort by iteration (none when sorted already,
    # as the graph's table is within a chunk of one iteration) gives each its rows as a slice,
    # in table order (binned_busy sums in that order)
    order = None if bool(np.all(it[1:] >= it[:-1])) else np.argsort(it, kind="stable")
    e_ends = np.cumsum(np.bincount(e_it - i0))                  # extents rows per iteration
    cuts = np.concatenate([[0], np.cumsum(np.bincount(it - i0))])
    out = []
    for iteration in np.unique(e_it):
        k = int(iteration) - i0
        ex = slice(int(e_ends[k - 1]) if k else 0, int(e_ends[k]))
        t0, t1 = int(lo[ex].min()), int(hi[ex].max())
        n_rows = int(cuts[k + 1] - cuts[k])
        nb = tile_bins(n_rows)
        rows = slice(int(cuts[k]), int(cuts[k + 1])) if order is None else order[cuts[k]:cuts[k + 1]]
        s = rows[spanned[rows]] if order is not None else np.flatnonzero(spanned[rows]) + rows.start
        gpos, g_of = _dense(gcode[s])
        ug = (gpos // n_b + r0) * (1 << 32) + (gpos % n_b + b0)     # (rank, block + 1) packed
        used, ph = _dense(phase[s])
        grid = binned_busy(begin[s], end[s], g_of * used.size + ph, ug.size * used.size,
                           float(t0), float(max(t1, t0 + 1)), nb).reshape(ug.size, used.size, nb)
        out.append(_kept(_Tile(int(iteration), t0, t1, nb, ug, used, grid, n_rows, ex.stop - ex.start)))
    return out


def _chunk_compiled(events: pd.DataFrame):
    """_chunk_numpy's result through timeline_fast's two passes, or None where they cannot run
    (category codes wider than int8, lane or group codes too sparse for dense tables)."""
    kcode, knames = _codes(events["kind"])
    pcode, pnames = _codes(events["phase"])
    if kcode.dtype != np.int8 or pcode.dtype != np.int8:
        return None
    host_c, span_c = (knames.index(k) if k in knames else -99 for k in ("host", "span"))
    lanes = TF.lane_columns(*(events[c].to_numpy() for c in ("rank", "block", "warp", "iteration")))
    # the mixed radix needs bounds of the codes, not their exact range (host rows' block and warp
    # count as -1 whatever they hold): whole-column minima and maxima at the columns' widths
    rank, block, warp, it = lanes[1]
    r0, r1, i0, i1 = int(rank.min()), int(rank.max()), int(it.min()), int(it.max())
    b0, b1 = min(int(block.min()) + 1, 0), max(int(block.max()) + 1, 0)
    w0, w1 = min(int(warp.min()) + 1, 0), max(int(warp.max()) + 1, 0)
    n_r, n_b, n_w, n_it = r1 - r0 + 1, b1 - b0 + 1, w1 - w0 + 1, i1 - i0 + 1
    n = len(events)
    if max(n_r * n_b * n_w, n_it * n_r * n_b, n_it * 2 * len(pnames)) > max(4 * n, 1 << 16):
        return None                                  # as _dense: np.unique's sort beats such tables
    radix = np.array([r0, b0, w0, n_b, n_w, i0, n_r], np.int64)
    begin = np.ascontiguousarray(events["begin_ns"].to_numpy(np.int64))
    end = np.ascontiguousarray(events["end_ns"].to_numpy(np.int64))
    opened = events["open"].to_numpy(bool) if "open" in events else np.zeros(n, bool)
    sc = TF.scan(kcode, host_c, span_c, lanes, pcode, len(pnames), begin, end, opened, radix,
                 (n_r * n_b * n_w, n_it * n_r, n_it, n_r * n_b))
    lpos = np.flatnonzero(sc["last"] >= 0)
    rcode, rnames = _codes(events["role"])
    lane_df = _lane_frame(lpos, rcode[sc["last"][lpos]].astype(np.int64), rnames, n_b, n_w, (r0, b0, w0))
    epos = np.flatnonzero(sc["events"] > 0)
    extents = _extents_frame(epos, n_r, (i0, r0), *(sc[k][epos] for k in ("lo", "hi", "events", "spans", "open")))
    names = pnames + [f"host {p}" for p in pnames]
    return names, lane_df, extents, _tiles_compiled(sc, extents, (kcode, host_c, span_c, lanes, pcode, len(pnames)),
                                                    radix, (begin, end))


def _tiles_compiled(sc: dict, extents: pd.DataFrame, cols: tuple, radix: np.ndarray, times: tuple) -> list:
    """Each iteration's tile (a _Tile's kept tuple) from _scan's tables and _bin's sums."""
    r0, b0, n_b, i0, n_r = (int(radix[j]) for j in (0, 1, 3, 5, 6))
    n_it = sc["it_rows"].size
    g_seen, p_seen = sc["g_seen"].reshape(n_it, -1), sc["p_seen"].reshape(n_it, -1)
    e_it, lo, hi = (extents[c].to_numpy() for c in ("iteration", "begin_ns", "end_ns"))
    e_ends = np.cumsum(np.bincount(e_it - i0, minlength=n_it))    # extents rows per iteration
    t = {"g_map": np.full(g_seen.shape, -1, np.int64), "p_map": np.full(p_seen.shape, -1, np.int64),
         "n_used": np.zeros(n_it, np.int64), "bins": np.ones(n_it, np.int64), "off": np.zeros(n_it, np.int64),
         "t0": np.zeros(n_it), "t1": np.ones(n_it), "width": np.ones(n_it)}
    made, cells = [], 0
    for k in np.flatnonzero(sc["it_rows"]).tolist():
        ex = slice(int(e_ends[k - 1]) if k else 0, int(e_ends[k]))
        t0, t1 = int(lo[ex].min()), int(hi[ex].max())
        n_rows = int(sc["it_rows"][k])
        nb = tile_bins(n_rows)
        gpos, used = np.flatnonzero(g_seen[k]), np.flatnonzero(p_seen[k])
        t["g_map"][k, gpos], t["p_map"][k, used] = np.arange(gpos.size), np.arange(used.size)
        t["n_used"][k], t["bins"][k], t["off"][k] = used.size, nb, cells
        t["t0"][k], t["t1"][k] = float(t0), float(max(t1, t0 + 1))
        t["width"][k] = (t["t1"][k] - t["t0"][k]) / nb           # binned_busy's width, the same float
        ug = (gpos // n_b + r0) * (1 << 32) + (gpos % n_b + b0)   # (rank, block + 1) packed
        made.append(_Tile(k + i0, t0, t1, nb, ug, used, None, n_rows, ex.stop - ex.start))
        cells += gpos.size * used.size * (nb + 1)
    t["g_map"], t["p_map"] = t["g_map"].reshape(-1), t["p_map"].reshape(-1)
    acc = TF.bin_spans(*cols, *times, radix, t, cells)
    out = []
    for tile in made:
        k, nb = tile.iteration - i0, tile.bins
        n_keys = tile.ug.size * tile.used.size
        seg = slice(int(t["off"][k]), int(t["off"][k]) + n_keys * (nb + 1))
        flat = TF.combine(acc, seg.start, seg.stop, nb + 1)     # binned_busy's sums, in its order
        # the same view binned_busy returns (the coarse means reduce it alike)
        tile.grid = flat.reshape(n_keys, nb + 1)[:, :nb].reshape(tile.ug.size, tile.used.size, nb)
        out.append(_kept(tile, TF.coarse_means(acc[0], seg.start, n_keys, nb, nb // _coarse_bins(tile))))
        tile.grid = None
    return out


class Builder:
    """Collects an Overview chunk by chunk: add(events) with each chunk's event table (whole
    iterations, unfinished waits closed), then finish()."""

    def __init__(self):
        self._lanes: list[pd.DataFrame] = []
        self._extents: list[pd.DataFrame] = []
        self._tiles: list[tuple] = []      # (iteration, begin, end, bins, group keys, names, used, grid)
        self._names: list[str] | None = None

    def add(self, events: pd.DataFrame) -> None:
        if not len(events):
            return
        got = _chunk_compiled(events) if TF.enabled() else None
        names, lanes, extents, tiles = got if got is not None else _chunk_numpy(events)
        if self._names is None:
            self._names = names
        elif names != self._names:
            # every chunk of one run carries the whole table's categories (runreader; iloc keeps them)
            raise ValueError("timeline overview: chunks with different phase categories")
        self._lanes.append(lanes)
        self._extents.append(extents)
        self._tiles += tiles

    def merge(self, other: "Builder") -> None:
        """Take the chunks another builder was given, as if they were added here next (a chunk
        analysed by another process: profiler.analysis.distributed; merged in chunk order)."""
        if other._names is None:
            return
        if self._names is None:
            self._names = other._names
        elif other._names != self._names:
            raise ValueError("timeline overview: chunks with different phase categories")
        self._lanes += other._lanes
        self._extents += other._extents
        self._tiles += other._tiles

    def finish(self) -> Overview:
        if self._names is None:
            raise ValueError("timeline overview: no events")
        lanes = pd.concat(self._lanes, ignore_index=True).drop_duplicates(["rank", "block", "warp"], keep="last").sort_values(
            ["rank", "block", "warp"], kind="stable").reset_index(drop=True)
        extents = pd.concat(self._extents, ignore_index=True)
        # an iteration split over two chunks cannot happen (chunks are whole iterations); guard anyway
        if extents.duplicated(["iteration", "rank"]).any():
            raise ValueError("timeline overview: an iteration in two chunks")
        extents = extents.sort_values(["iteration", "rank"], kind="stable").reset_index(drop=True)
        keep = np.unique(np.concatenate([t[6] for t in self._tiles])) if self._tiles else np.zeros(0, np.int64)
        # device spans' phases in category order, then the host spans' (the viewer's full index order)
        phases = tuple(self._names[k] for k in keep)
        all_g = np.unique(np.concatenate([t[4] for t in self._tiles])) if self._tiles else np.zeros(0, np.int64)
        g_rank, g_block = all_g >> 32, (all_g & 0xFFFFFFFF) - 1
        urg = np.unique(g_rank * 2 + (g_block < 0))
        fine, coarse, tiles = [], [], []
        for it, t0, t1, nb, ug, rg, used, f, c in sorted(self._tiles, key=lambda t: t[0]):
            p = np.searchsorted(keep, used)
            full_f = np.zeros((urg.size, keep.size, nb), dtype=np.float32)
            full_f[np.ix_(np.searchsorted(urg, rg), p)] = f
            full_c = np.zeros((all_g.size, keep.size, c.shape[2]), dtype=np.float32)
            full_c[np.ix_(np.searchsorted(all_g, ug), p)] = c
            fine.append(full_f)
            coarse.append(full_c)
            tiles.append((it, t0, t1, nb, c.shape[2]))
        tiles = pd.DataFrame(tiles, columns=["iteration", "begin_ns", "end_ns", "bins", "coarse_bins"]).astype(np.int64)
        return Overview(
            t_min=int(extents["begin_ns"].min()), t_max=int(extents["end_ns"].max()), phases=phases,
            lanes=lanes, groups=pd.DataFrame({"rank": g_rank.astype(np.int64), "block": g_block.astype(np.int64)}),
            extents=extents, tiles=tiles, fine=fine, coarse=coarse)


def overview(events: pd.DataFrame) -> Overview:
    """The overview of a whole event table in memory (the chunked pass's result on one chunk)."""
    b = Builder()
    b.add(events)
    return b.finish()


# -- stored form (profiler.analysis.stored writes the tables and the meta beside the analyses) ----
def to_stored(ov: Overview) -> tuple[dict, dict[str, pd.DataFrame]]:
    """(meta: JSON-able, tables: name -> DataFrame). The grids go as one float32 column each,
    tile after tile, in C order; their shapes follow from the tables."""
    meta = {"t_min": int(ov.t_min), "t_max": int(ov.t_max), "phases": [str(p) for p in ov.phases]}
    flat = lambda arrs: pd.DataFrame({"busy": np.concatenate([a.reshape(-1) for a in arrs]) if arrs
                                      else np.zeros(0, np.float32)})
    return meta, {"lanes": ov.lanes, "groups": ov.groups, "extents": ov.extents, "tiles": ov.tiles,
                  "fine": flat(ov.fine), "coarse": flat(ov.coarse)}


TABLES = ("lanes", "groups", "extents", "tiles", "fine", "coarse")
_COLUMNS = {"lanes": ("rank", "block", "warp", "role"), "groups": ("rank", "block"),
            "extents": ("iteration", "rank", "begin_ns", "end_ns", "events", "spans", "open"),
            "tiles": ("iteration", "begin_ns", "end_ns", "bins", "coarse_bins"), "fine": ("busy",), "coarse": ("busy",)}


def from_stored(meta: dict, tables: dict[str, pd.DataFrame]) -> Overview:
    """The Overview of to_stored's parts, checked (ValueError naming what does not fit)."""
    def need(cond, what):
        if not cond:
            raise ValueError(f"timeline overview: {what}")
    need(isinstance(meta, dict) and set(meta) == {"t_min", "t_max", "phases"}, "meta fields")
    need(all(isinstance(meta[k], int) and not isinstance(meta[k], bool) for k in ("t_min", "t_max")), "meta types")
    need(isinstance(meta["phases"], list) and all(isinstance(p, str) for p in meta["phases"]), "phases")
    need(set(tables) == set(TABLES), "tables")
    for k, cols in _COLUMNS.items():
        need(tuple(tables[k].columns) == cols, f"{k}: columns")
    tiles = tables["tiles"]
    nb = tiles["bins"].to_numpy(np.int64)
    nc = tiles["coarse_bins"].to_numpy(np.int64)
    need(bool(np.all(nc >= 1)) and bool(np.all(nb % np.maximum(nc, 1) == 0)), "tile bins")
    n_ph = len(meta["phases"])
    groups = tables["groups"]
    n_g = len(groups)
    n_rg = len(pd.DataFrame({"r": groups["rank"], "h": groups["block"] < 0}).drop_duplicates())
    fine_flat = tables["fine"]["busy"].to_numpy(np.float32)
    coarse_flat = tables["coarse"]["busy"].to_numpy(np.float32)
    need(fine_flat.size == int(nb.sum()) * n_rg * n_ph, "fine grid size")
    need(coarse_flat.size == int(nc.sum()) * n_g * n_ph, "coarse grid size")
    fine, coarse, a, b = [], [], 0, 0
    for n, m in zip(nb, nc):
        fine.append(fine_flat[a:a + n_rg * n_ph * n].reshape(n_rg, n_ph, n))
        a += n_rg * n_ph * n
        coarse.append(coarse_flat[b:b + n_g * n_ph * m].reshape(n_g, n_ph, m))
        b += n_g * n_ph * m
    return Overview(t_min=meta["t_min"], t_max=meta["t_max"], phases=tuple(meta["phases"]), lanes=tables["lanes"],
                    groups=groups, extents=tables["extents"], tiles=tiles, fine=fine, coarse=coarse)
