"""Timeline computation, Dash-free: lanes (ranks -> blocks -> warps), server-side aggregation.

The browser never receives one shape per event. A view is (level, ranks, block range, time
window). Its rows are lanes of that level (merged in runs of consecutive lanes when there are
more than MAX_ROWS). Zoomed out, each (row, time bin) cell is one heatmap cell coloured by the
phase holding most of the cell's exclusive busy time and shaded by occupancy; the figure is then
a single heatmap trace of at most MAX_ROWS x BINS cells. Zoomed in far enough that at most
DETAIL_LIMIT spans are visible, spans are drawn one by one as bars, with instants and barrier
events as markers. Either way the figure holds at most a few thousand drawn items.

All work is numpy over arrays prepared once per run (`build_index`, cached by the catalog):
spans sorted by begin, a lane table, phase codes. A view costs a searchsorted, a mask over the
begin-sorted prefix and a few bincounts over the spans of the window.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profiler.analysis.timeline_overview import Overview, binned_busy  # noqa: F401 (binned_busy: the page's binning)
from profiler.registry.registry import RegistryError, registries
from viewer import theme
from viewer.format import ns, position, time_unit

BINS = 320            # time bins across the plot: about one per 3 px of a 1000 px plot
MAX_ROWS = 160        # rows drawn; more lanes are merged in runs of consecutive lanes
DETAIL_LIMIT = 1500   # spans drawn individually at most (plus as many point events)
OCC_LEVELS = 4        # occupancy shades per phase colour: <=25%, <=50%, <=75%, >75%
LEVELS = ("rank", "block", "warp")


@dataclass
class TimelineIndex:
    t_min: int
    t_max: int
    phases: list[str]            # phase code -> name (spans and host rows)
    parent: np.ndarray           # phase code -> parent phase code, -1 for top level
    depth: np.ndarray            # nesting depth per phase code
    # lanes: one row per (rank, block, warp); host rows are lanes with block = warp = -1
    lane_rank: np.ndarray
    lane_block: np.ndarray
    lane_warp: np.ndarray
    lane_host: np.ndarray
    lane_role: list[str]
    # spans sorted by begin_ns
    s_lane: np.ndarray
    s_phase: np.ndarray
    s_begin: np.ndarray
    s_end: np.ndarray
    s_payload: np.ndarray
    s_open: np.ndarray           # unfinished (the kernel never ended it; profiler.analysis.unfinished)
    # point events (instants, barrier arrive/depart) sorted by time
    p_lane: np.ndarray
    p_t: np.ndarray
    p_label: list[str]           # label code -> "publish_tail" / "arrive grid" / ...
    p_code: np.ndarray
    p_kind: np.ndarray           # 0 instant, 1 arrive, 2 depart
    p_payload: np.ndarray
    ranks: list[int] = field(default_factory=list)
    # level -> (lane -> group, busy grid [groups, phases, bins] over [t_min, t_max]); see add_base
    base: dict = field(default_factory=dict)
    # a run drawn from its stored overview (index_from_overview): no spans here; wide windows come
    # from the overview's tiles, narrow ones from the events of their (rank, iteration) row groups
    overview: Overview | None = None

    @property
    def n_spans(self) -> int:
        return int(self.s_begin.size)


def _parents_from_manifest(manifest: dict) -> dict[str, str]:
    """Phase -> parent phase, from the registries the run embeds (read through profiler.registry.registry;
    a registry that does not validate gives no nesting rather than a broken page)."""
    try:
        regs = registries(manifest.get("registry") or None)
    except (RegistryError, TypeError, ValueError, KeyError):
        return {}
    return {p.name: p.parent for r in regs for p in r.phases if p.parent}


def _nesting(names: list[str], manifest: dict | None) -> tuple[np.ndarray, np.ndarray]:
    """(parent code, nesting depth) per phase name, from the run's registries."""
    code_of = {n: i for i, n in enumerate(names)}
    parents = _parents_from_manifest(manifest or {})
    parent = np.array([code_of.get(parents.get(n, ""), -1) for n in names], dtype=np.int64)
    depth = np.zeros(len(names), dtype=np.int64)
    for i in range(len(names)):
        d, p = 0, parent[i]
        while p >= 0 and d < len(names):
            d, p = d + 1, parent[p]
        depth[i] = d
    return parent, depth


def _codes(col: pd.Series) -> tuple[np.ndarray, list[str]]:
    """(codes, category names) of a column without materialising one string per row."""
    c = col if isinstance(col.dtype, pd.CategoricalDtype) else col.astype("category")
    return c.cat.codes.to_numpy(), [str(x) for x in c.cat.categories]


def build_index(events: pd.DataFrame, manifest: dict | None = None) -> TimelineIndex:
    """Arrays for fast views of one run's event table (schema: profiler.store.schema.COLUMNS)."""
    kcode, knames = _codes(events["kind"])
    kc = {n: knames.index(n) if n in knames else -99 for n in ("span", "instant", "arrive", "depart", "host")}
    rank = events["rank"].to_numpy(np.int64)
    block = events["block"].to_numpy(np.int64)
    warp = events["warp"].to_numpy(np.int64)
    host = kcode == kc["host"]
    if host.any():
        block = np.where(host, -1, block)
        warp = np.where(host, -1, warp)

    # lane table: unique (rank, block, warp) in that order; host rows are block = warp = -1
    r0 = int(rank.min(initial=0))
    nb = int(block.max(initial=0)) + 2
    nw = int(warp.max(initial=0)) + 2
    key = ((rank - r0) * nb + (block + 1)) * nw + (warp + 1)
    lane_of, ukey = pd.factorize(key, sort=True)     # hash-based: faster than np.unique's sort
    lane_of = np.asarray(lane_of, dtype=np.int64)
    ukey = np.asarray(ukey, dtype=np.int64)
    lane_warp = ukey % nw - 1
    lane_block = (ukey // nw) % nb - 1
    lane_rank = ukey // (nw * nb) + r0
    rcode, rnames = _codes(events["role"])
    lane_role_code = np.full(ukey.size, -1, dtype=np.int64)
    lane_role_code[lane_of] = rcode                       # any row of the lane names its role
    lane_role = [rnames[c] if c >= 0 else "" for c in lane_role_code]

    pcode, pnames = _codes(events["phase"])
    if host.any():
        # host spans get their own names ("host notify") so they never share a device phase's
        # colour or its nesting: the host's `notify` is an enqueue, not the kernel phase
        n0 = len(pnames)
        hcodes = np.unique(pcode[host])
        hcodes = hcodes[hcodes >= 0]
        extra = {int(c): n0 + i for i, c in enumerate(hcodes)}
        pnames = pnames + [f"host {pnames[c]}" for c in hcodes]
        lut = np.arange(len(pnames), dtype=np.int64)
        for c, e in extra.items():
            lut[c] = e
        pcode = np.where(host & (pcode >= 0), lut[np.maximum(pcode, 0)], pcode)
    span_mask = (kcode == kc["span"]) | host
    used = np.unique(pcode[span_mask])
    used = used[used >= 0]
    names = [pnames[c] for c in used]
    remap = np.full(len(pnames) + 1, -1, dtype=np.int16)
    remap[used] = np.arange(used.size, dtype=np.int16)
    parent, depth = _nesting(names, manifest)

    begin_all = events["begin_ns"].to_numpy(np.int64)
    end_all = events["end_ns"].to_numpy(np.int64)
    payload_all = events["payload"].to_numpy(np.int64)
    sp = np.flatnonzero(span_mask)
    sp = sp[np.argsort(begin_all[sp], kind="stable")]

    pt = np.flatnonzero((kcode == kc["instant"]) | (kcode == kc["arrive"]) | (kcode == kc["depart"]))
    pt = pt[np.argsort(begin_all[pt], kind="stable")]
    p_kind = np.select([kcode[pt] == kc["arrive"], kcode[pt] == kc["depart"]], [1, 2], 0).astype(np.int8)
    # label code = kind * n_phase_names + phase code
    lab = p_kind.astype(np.int64) * (len(pnames) + 1) + pcode[pt]
    ulab, p_code = np.unique(lab, return_inverse=True)
    prefix = ("", "arrive ", "depart ")
    p_label = [prefix[int(u) // (len(pnames) + 1)] + pnames[int(u) % (len(pnames) + 1)] for u in ulab]

    return TimelineIndex(
        t_min=int(begin_all.min()) if begin_all.size else 0,
        t_max=int(max(end_all.max(initial=0), begin_all.max(initial=0))),
        phases=names,
        parent=parent,
        depth=depth,
        lane_rank=lane_rank,
        lane_block=lane_block,
        lane_warp=lane_warp,
        lane_host=lane_block < 0,
        lane_role=lane_role,
        s_lane=lane_of[sp].astype(np.int32),
        s_phase=remap[pcode[sp]],
        s_begin=begin_all[sp],
        s_end=end_all[sp],
        s_payload=payload_all[sp],
        s_open=events["open"].to_numpy(bool)[sp] if "open" in events else np.zeros(sp.size, bool),
        p_lane=lane_of[pt].astype(np.int32),
        p_t=begin_all[pt],
        p_label=p_label,
        p_code=p_code.reshape(-1).astype(np.int32),
        p_kind=p_kind,
        p_payload=payload_all[pt],
        ranks=sorted(int(r) for r in np.unique(lane_rank)),
    )


BASE_FLOATS = 6_000_000   # cells of the precomputed grid: 48 MB while built, 24 MB kept


def add_base(ix: TimelineIndex) -> TimelineIndex:
    """Precompute busy time per (block, phase, fine time bin) over the whole run, and per rank
    by summing its blocks.

    Wide windows (the default full view and moderate zooms) then cost an interpolation of a
    cumulative sum instead of a pass over millions of spans; narrow windows are computed exactly
    from their spans (compute_view picks)."""
    n_ph = max(len(ix.phases), 1)
    gk = ix.lane_rank * (int(ix.lane_block.max(initial=0)) + 2) + ix.lane_block + 1
    ug, g_of_lane = np.unique(gk, return_inverse=True)
    g_of_lane = g_of_lane.reshape(-1)
    n_g = ug.size
    nb = int(2 ** np.floor(np.log2(max(BASE_FLOATS // max(n_g * n_ph, 1), 256))))
    nb = min(nb, 16384)
    key = g_of_lane[ix.s_lane] * n_ph + ix.s_phase
    grid = binned_busy(ix.s_begin, ix.s_end, key, n_g * n_ph, float(ix.t_min),
                       float(max(ix.t_max, ix.t_min + 1)), nb).astype(np.float32).reshape(n_g, n_ph, nb)
    ix.base["block"] = (g_of_lane, grid)
    # rank level: rank groups (rank, host) are unions of block groups (host lanes have block -1)
    rk = ix.lane_rank * 2 + ix.lane_host
    ur, r_of_lane = np.unique(rk, return_inverse=True)
    r_of_lane = r_of_lane.reshape(-1)
    r_of_g = np.zeros(n_g, dtype=np.int64)
    r_of_g[g_of_lane] = r_of_lane
    rgrid = np.zeros((ur.size, n_ph, nb), dtype=np.float32)
    for g in range(n_g):
        rgrid[r_of_g[g]] += grid[g]
    ix.base["rank"] = (r_of_lane, rgrid)
    return ix


def _from_base(ix: TimelineIndex, level: str, rows: "Rows", t0: float, t1: float, bins: int) -> np.ndarray | None:
    """busy [rows, phases, bins] from the precomputed grid, or None when the window is too
    narrow for its resolution (an output bin must span at least one base bin)."""
    if level not in ix.base:
        return None
    g_of_lane, grid = ix.base[level]
    n_g, n_ph, nb = grid.shape
    lo, hi = float(ix.t_min), float(max(ix.t_max, ix.t_min + 1))
    bw = (hi - lo) / nb
    if (t1 - t0) / bins < bw:
        return None
    # group -> row (every lane of a group lands on one row at this level)
    g_row = np.full(n_g, -1, dtype=np.int64)
    g_row[g_of_lane] = rows.lane_to_row
    n_rows = len(rows.labels)
    edges = (t0 + (t1 - t0) * np.arange(bins + 1) / bins - lo) / bw   # in base bins
    edges = np.clip(edges, 0, nb)
    j0 = int(min(np.floor(edges[0]), nb - 1))
    j1 = int(min(np.ceil(edges[-1]) + 1, nb))
    ok = np.flatnonzero(g_row >= 0)
    sub = grid[ok, :, j0:j1]                      # only the window's base bins
    order = np.argsort(g_row[ok], kind="stable")
    rs = g_row[ok][order]
    starts = np.r_[0, np.flatnonzero(np.diff(rs)) + 1]
    per_row = np.zeros((n_rows, n_ph, j1 - j0), dtype=np.float64)
    per_row[rs[starts]] = np.add.reduceat(sub[order], starts, axis=0)
    cum = np.concatenate([np.zeros((n_rows, n_ph, 1)), np.cumsum(per_row, axis=2)], axis=2)
    e = edges - j0
    j = np.minimum(np.floor(e).astype(np.int64), j1 - j0 - 1)
    frac = e - j
    at = cum[:, :, j] + (cum[:, :, j + 1] - cum[:, :, j]) * frac   # linear within a base bin
    return np.diff(at, axis=2) / ((t1 - t0) / bins / bw)            # in output-bin widths


# -- a run drawn from its stored overview (issue 20: the views computed from what is on screen) --
FULL_INDEX_EVENTS = 2_000_000   # runs up to this many events get the full index (one build, ~1 s)
# events a window may read (its rows' (rank, iteration) row groups): one iteration of the 10 M-event
# synthetic run (8 ranks x 312 k); 2.5 M events read in 1.3-2.5 s on this VM, then kept for the
# next zooms inside them (analyses.timeline_window)
WINDOW_EVENTS = 3_000_000


def _empty(dtype) -> np.ndarray:
    return np.zeros(0, dtype=dtype)


def index_from_overview(ov: Overview, manifest: dict | None = None) -> TimelineIndex:
    """The run's lanes, phases and time range from its overview, no spans: views of it come from
    the overview's tiles or from a window's events (compute_view's `read`)."""
    names = list(ov.phases)
    parent, depth = _nesting(names, manifest)
    ln = ov.lanes
    rank = ln["rank"].to_numpy(np.int64)
    block = ln["block"].to_numpy(np.int64)
    return TimelineIndex(
        t_min=int(ov.t_min), t_max=int(ov.t_max), phases=names, parent=parent, depth=depth,
        lane_rank=rank, lane_block=block, lane_warp=ln["warp"].to_numpy(np.int64), lane_host=block < 0,
        lane_role=[str(r) for r in ln["role"]],
        s_lane=_empty(np.int32), s_phase=_empty(np.int16), s_begin=_empty(np.int64), s_end=_empty(np.int64),
        s_payload=_empty(np.int64), s_open=_empty(bool), p_lane=_empty(np.int32), p_t=_empty(np.int64),
        p_label=[], p_code=_empty(np.int32), p_kind=_empty(np.int8), p_payload=_empty(np.int64),
        ranks=sorted(int(r) for r in np.unique(rank)), overview=ov)


def conform(wix: TimelineIndex, ix: TimelineIndex) -> TimelineIndex:
    """A window's index (build_index of some row groups' events) numbered as the run's: its lanes
    and phase codes mapped onto ix's, the run's time range, so the run's rows apply to it."""
    lane = _lane_of(ix, wix.lane_rank, wix.lane_block, wix.lane_warp)
    code = {n: i for i, n in enumerate(ix.phases)}
    ph = np.array([code.get(n, -1) for n in wix.phases] + [-1], dtype=np.int16)
    wix.s_lane = lane[wix.s_lane].astype(np.int32)
    wix.s_phase = ph[wix.s_phase]
    wix.p_lane = lane[wix.p_lane].astype(np.int32)
    for f in ("t_min", "t_max", "phases", "parent", "depth", "lane_rank", "lane_block", "lane_warp", "lane_host",
              "lane_role", "ranks"):
        setattr(wix, f, getattr(ix, f))
    wix.base = {}
    return wix


# -- rows of a view ----------------------------------------------------------------------------
@dataclass
class Rows:
    lane_to_row: np.ndarray      # lane -> row, -1 when the lane is filtered out
    labels: list[str]
    lanes_per_row: np.ndarray    # how many lanes a row merges (occupancy denominator)
    merged: bool                 # rows merge several lanes of the level (too many to draw)
    row_key: list[tuple]         # (rank, block, warp) per row, -1 where the row spans several


def _span_label(lo: int, hi: int, prefix: str) -> str:
    return f"{prefix}{lo}" if lo == hi else f"{prefix}{lo}–{hi}"


def make_rows(ix: TimelineIndex, level: str = "rank", ranks: list[int] | None = None,
              blocks: tuple[int, int] | None = None, max_rows: int = MAX_ROWS, only_blocks: bool = False) -> Rows:
    """Rows for a level: 'rank' (one per rank, host spans apart), 'block' (per block of the
    selected ranks), 'warp' (per warp of the selected ranks and block range)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    keep = np.ones(ix.lane_rank.size, dtype=bool)
    if ranks:
        keep &= np.isin(ix.lane_rank, np.asarray(ranks, dtype=np.int64))
    if blocks is not None and (level == "warp" or only_blocks):
        lo, hi = blocks
        keep &= ix.lane_host | ((ix.lane_block >= lo) & (ix.lane_block <= hi))
    r, b, w, h = ix.lane_rank, ix.lane_block, ix.lane_warp, ix.lane_host
    if level == "rank":
        gkey = np.stack([r, h.astype(np.int64), np.zeros_like(r)], 1)
    elif level == "block":
        gkey = np.stack([r, b, np.zeros_like(r)], 1)
    else:
        gkey = np.stack([r, b, w], 1)
    lane_to_row = np.full(r.size, -1, dtype=np.int64)
    kept = np.flatnonzero(keep)
    if kept.size == 0:
        return Rows(lane_to_row, [], np.zeros(0, np.int64), False, [])
    ukeys, inv = np.unique(gkey[kept], axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    n = ukeys.shape[0]
    merged = n > max_rows
    if merged:
        # merge consecutive groups, never across ranks: rows per rank proportional to its groups
        step = int(np.ceil(n / max_rows))
        grp_rank = ukeys[:, 0]
        # position of each group within its rank
        starts = np.r_[0, np.flatnonzero(np.diff(grp_rank)) + 1]
        pos = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
        bucket_key = np.stack([grp_rank, pos // step], 1)
        ubk, grp_to_row = np.unique(bucket_key, axis=0, return_inverse=True)
        grp_to_row = grp_to_row.reshape(-1)
    else:
        grp_to_row = np.arange(n)
    lane_to_row[kept] = grp_to_row[inv]
    n_rows = int(grp_to_row.max()) + 1
    lanes_per_row = np.bincount(lane_to_row[kept], minlength=n_rows).astype(np.int64)

    labels, row_key = [], []
    for row in range(n_rows):
        g = ukeys[grp_to_row == row]
        rk = int(g[0, 0])
        if level == "rank":
            labels.append(f"rank {rk} host" if g[0, 1] else f"rank {rk}")
            row_key.append((rk, -1, -1))
        elif level == "block":
            if g[0, 1] < 0 and g.shape[0] == 1:
                labels.append(f"r{rk} host")
                row_key.append((rk, -1, -1))
            else:
                bl = g[g[:, 1] >= 0, 1]
                labels.append(f"r{rk} " + _span_label(int(bl.min()), int(bl.max()), "b"))
                row_key.append((rk, int(bl.min()), -1) if bl.size == 1 else (rk, -1, -1))
        else:
            if g[0, 1] < 0 and g.shape[0] == 1:
                labels.append(f"r{rk} host")
                row_key.append((rk, -1, -1))
            elif g.shape[0] == 1:
                labels.append(f"r{rk} b{int(g[0, 1])} w{int(g[0, 2])}")
                row_key.append((rk, int(g[0, 1]), int(g[0, 2])))
            else:
                labels.append(f"r{rk} b{int(g[0, 1])}w{int(g[0, 2])}–b{int(g[-1, 1])}w{int(g[-1, 2])}")
                row_key.append((rk, -1, -1))
    return Rows(lane_to_row, labels, lanes_per_row, merged, row_key)


# -- aggregation -------------------------------------------------------------------------------
def window(ix: TimelineIndex, t0: float, t1: float) -> np.ndarray:
    """Indices (into the begin-sorted span arrays) of spans overlapping [t0, t1)."""
    hi = int(np.searchsorted(ix.s_begin, t1, side="left"))
    return np.flatnonzero(ix.s_end[:hi] > t0)


def exclusive(busy: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """busy[row, phase, bin] minus the time of child phases nested in each parent phase."""
    out = busy.copy()
    for c, p in enumerate(parent):
        if p >= 0:
            out[:, p, :] -= busy[:, c, :]
    np.clip(out, 0, None, out=out)
    return out


@dataclass
class View:
    level: str
    t0: float
    t1: float
    mode: str                    # "aggregate" or "detail"
    rows: Rows
    n_visible: int               # spans overlapping the window (of the selected rows)
    # aggregate mode
    dominant: np.ndarray | None = None   # [rows, bins] phase code, -1 empty
    occupancy: np.ndarray | None = None  # [rows, bins] busy share 0..1 (exclusive time)
    # detail mode
    spans: pd.DataFrame | None = None
    points: pd.DataFrame | None = None
    # drawn from a stored overview: n_visible counts the spans of the window's (rank, iteration)s
    approx: bool = False
    note: str = ""                       # why the view is coarser than asked (describe says it)


def _detail(ix: TimelineIndex, view: View, sel: np.ndarray, row: np.ndarray, limit: int) -> View:
    view.mode = "detail"
    ph = ix.s_phase[sel]
    view.spans = pd.DataFrame({
        "row": row,
        "lane": ix.s_lane[sel],
        "phase": np.asarray(ix.phases + [""], dtype=object)[ph],
        "depth": np.r_[ix.depth, 0][ph],
        "begin_ns": ix.s_begin[sel],
        "end_ns": ix.s_end[sel],
        "payload": ix.s_payload[sel],
        "unfinished": ix.s_open[sel],
    })
    a = int(np.searchsorted(ix.p_t, view.t0, side="left"))
    b = int(np.searchsorted(ix.p_t, view.t1, side="right"))
    prow = view.rows.lane_to_row[ix.p_lane[a:b]]
    keep = np.flatnonzero(prow >= 0)[:limit] + a
    view.points = pd.DataFrame({
        "row": view.rows.lane_to_row[ix.p_lane[keep]],
        "t_ns": ix.p_t[keep],
        "label": np.asarray(ix.p_label + [""], dtype=object)[ix.p_code[keep]],
        "kind": ix.p_kind[keep],
        "payload": ix.p_payload[keep],
    })
    return view


def compute_view(ix: TimelineIndex, level: str = "rank", ranks: list[int] | None = None,
                 blocks: tuple[int, int] | None = None, t0: float | None = None,
                 t1: float | None = None, bins: int = BINS, detail_limit: int = DETAIL_LIMIT,
                 rows: Rows | None = None, read=None, window_events: int = WINDOW_EVENTS) -> View:
    """The view of a window. For an index from a stored overview, `read(iterations, ranks, t0, t1)`
    gives the index of those row groups' events overlapping [t0, t1], conformed to ix
    (analyses.timeline_window)."""
    lo, hi = float(ix.t_min), float(max(ix.t_max, ix.t_min + 1))
    t0 = lo if t0 is None else max(lo, float(t0))
    t1 = hi if t1 is None else min(hi, float(t1))
    if t1 <= t0:
        t1 = t0 + 1.0
    rows = rows or make_rows(ix, level, ranks, blocks)
    if ix.overview is not None:
        return _overview_view(ix, level, ranks, blocks, t0, t1, bins, detail_limit, rows, read, window_events)
    n_rows = len(rows.labels)
    n_ph = max(len(ix.phases), 1)
    hi = int(np.searchsorted(ix.s_begin, t1, side="left"))
    n_all = int(np.count_nonzero(ix.s_end[:hi] > t0))
    busy = None
    if n_all > 20 * detail_limit or rows.merged:
        # far too many spans to draw even after a row filter: the precomputed grid if it fits
        busy = _from_base(ix, level, rows, t0, t1, bins)
    view = View(level, t0, t1, "aggregate", rows, n_all)
    if busy is None:
        sel = window(ix, t0, t1)
        row = rows.lane_to_row[ix.s_lane[sel]]
        sel, row = sel[row >= 0], row[row >= 0]
        view.n_visible = int(sel.size)
        if sel.size <= detail_limit and not rows.merged:
            return _detail(ix, view, sel, row, detail_limit)
        busy = binned_busy(ix.s_begin[sel], ix.s_end[sel], row * n_ph + ix.s_phase[sel],
                           n_rows * n_ph, t0, t1, bins).reshape(n_rows, n_ph, bins)
    return _aggregate(view, busy, ix.parent)


def _aggregate(view: View, busy: np.ndarray, parent: np.ndarray) -> View:
    ex = exclusive(busy, parent)
    total = ex.sum(axis=1)
    dom = ex.argmax(axis=1)
    dom[total <= 1e-9] = -1
    view.dominant = dom
    view.occupancy = np.clip(total / np.maximum(view.rows.lanes_per_row, 1)[:, None], 0.0, 1.0)
    return view


def _tile_rows(ix: TimelineIndex, level: str, rows: Rows) -> np.ndarray:
    """Row of each group of the overview's grid at `level` ("rank": its (rank, host) groups,
    "block": its (rank, block) groups), -1 for a group not drawn. Every lane of a group is on one
    row at these levels: the row of any of its lanes is the group's."""
    ov = ix.overview
    if level == "rank":
        g = ov.rank_groups
        gk = g["rank"].to_numpy(np.int64) * 2 + g["host"].to_numpy(np.int64)
        lk = ix.lane_rank * 2 + ix.lane_host
    else:
        g = ov.groups
        gk = (g["rank"].to_numpy(np.int64) << 32) + g["block"].to_numpy(np.int64) + 1
        lk = (ix.lane_rank << 32) + ix.lane_block + 1
    pos = np.minimum(np.searchsorted(gk, lk), max(gk.size - 1, 0))
    out = np.full(gk.size, -1, dtype=np.int64)
    hit = (gk.size > 0) & (gk[pos] == lk) & (rows.lane_to_row >= 0)
    out[pos[hit]] = rows.lane_to_row[hit]
    return out


def _from_tiles(ix: TimelineIndex, tile_level: str, rows: Rows, t0: float, t1: float, bins: int) -> tuple[np.ndarray, float]:
    busy, worst = ix.overview.busy(tile_level, t0, t1, bins)
    g_row = _tile_rows(ix, tile_level, rows)
    out = np.zeros((len(rows.labels),) + busy.shape[1:], dtype=np.float64)
    ok = g_row >= 0
    np.add.at(out, g_row[ok], busy[ok])
    return out, worst


def _overview_view(ix, level, ranks, blocks, t0, t1, bins, detail_limit, rows, read, window_events) -> View:
    """A view of a run drawn from its overview: the tiles when they resolve the window (every output
    bin spans a tile bin), else the events of the window's (rank, iteration) row groups when they
    are at most window_events, else the tiles all the same (coarser, said in the note). The warp
    level has no tiles: past the budget it draws the selected blocks' rows from the block tiles."""
    ov = ix.overview
    row_ranks = np.unique(ix.lane_rank[rows.lane_to_row >= 0])
    ext = ov.window_extents(t0, t1, row_ranks)
    n_ev, n_spans = int(ext["events"].sum()), int(ext["spans"].sum())
    tile_level = {"rank": "rank", "block": "block"}.get(level)
    busy, worst = (None, np.inf)
    if tile_level is not None:
        busy, worst = _from_tiles(ix, tile_level, rows, t0, t1, bins)
        if worst <= 1.0:
            return _aggregate(View(level, t0, t1, "aggregate", rows, n_spans, approx=True), busy, ix.parent)
    if read is not None and n_ev <= window_events:
        wix = read(np.unique(ext["iteration"].to_numpy()), row_ranks, t0, t1)
        return compute_view(wix, level, ranks, blocks, t0, t1, bins, detail_limit, rows=rows)
    if busy is None:            # warps of a window too big to read: one row per selected block
        lo, hi = blocks if blocks is not None else (0, int(ix.lane_block.max(initial=0)))
        rows = make_rows(ix, "block", list(map(int, row_ranks)), (lo, hi), only_blocks=True)
        busy, _ = _from_tiles(ix, "block", rows, t0, t1, bins)
        level = "block"
    view = View(level, t0, t1, "aggregate", rows, n_spans, approx=True,
                note=f"{n_ev:,} events in this window: drawn from the run's overview; zoom in to read its events")
    return _aggregate(view, busy, ix.parent)


# -- plotly figure (plain dicts: fast to build, no figure validation on the server) -----------
def _nice_step(raw: float) -> float:
    """1, 2 or 5 times a power of ten, at least `raw`."""
    if raw <= 0 or not np.isfinite(raw):
        return 1.0
    e = 10 ** np.floor(np.log10(raw))
    return float(next(m * e for m in (1, 2, 5, 10) if m * e >= raw))


def time_axis(t0_ns: float, t1_ns: float, ticks: int = 8) -> dict:
    """The x axis of a window [t0, t1] (ns): positions stay in µs since the run's start (what
    zoom and the window store read back), the tick labels read time since the window's start in
    one unit chosen by the window's width, and the title says where the window starts (issue 29:
    "25,151,000 µs since run start" told nothing)."""
    width = max(float(t1_ns) - float(t0_ns), 1.0)
    unit = time_unit(width)
    step = _nice_step(width / unit.ns / ticks)
    rel = np.arange(0.0, width / unit.ns + step / 2, step)
    decimals = max(0, -int(np.floor(np.log10(step))))       # as many as the step needs: 0, 0.5, 1.0
    text = [f"{r:,.{decimals}f}" for r in rel]
    return dict(tickmode="array", tickvals=((t0_ns + rel * unit.ns) / 1e3).tolist(), ticktext=text,
                title=dict(text=f"time since the window's start, {position(t0_ns, width / 100)} into the run ({unit.name})"))


def phase_colorscale(phases: list[str]) -> list:
    """Discrete colorscale: code = phase * OCC_LEVELS + shade; brighter = busier."""
    n = max(len(phases) * OCC_LEVELS, 1)
    scale = []
    for i, name in enumerate(phases):
        for s in range(OCC_LEVELS):
            c = theme.blend(theme.phase_colour(name), 0.35 + 0.65 * (s + 1) / OCC_LEVELS)
            k = i * OCC_LEVELS + s
            scale.append([k / n, c])
            scale.append([(k + 1) / n, c])
    return scale or [[0, theme.PANEL], [1, theme.PANEL]]


def _lane_of(ix: TimelineIndex, r: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Lane index of (rank, block, warp) triples, vectorised. A triple with no lane of its own
    (block or warp -1: a launch gap, a host segment) maps to the first lane of its block, else
    the first lane of its rank; -1 when the rank has no lane."""
    nb = int(ix.lane_block.max(initial=0)) + 2
    nw = int(ix.lane_warp.max(initial=0)) + 2
    r0 = int(ix.lane_rank.min(initial=0))

    def key(rr, bb, ww):
        return ((rr - r0) * nb + (bb + 1)) * nw + (ww + 1)

    lk = key(ix.lane_rank, ix.lane_block, ix.lane_warp)          # sorted: lanes are in key order
    n = lk.size
    out = np.full(r.size, -1, dtype=np.int64)
    if n == 0:
        return out
    for cand in (key(r, b, w), key(r, b, np.full_like(w, -1)), key(r, np.full_like(b, -1), np.full_like(w, -1))):
        pos = np.minimum(np.searchsorted(lk, cand), n - 1)
        hit = (out < 0) & (ix.lane_rank[pos] == r) & ((lk[pos] == cand) | (ix.lane_block[pos] == b) |
                                                      ((cand == key(r, np.full_like(b, -1), np.full_like(w, -1)))))
        out[hit] = pos[hit]
    return out


PATH_SEGMENTS = 300   # critical-path segments drawn one by one at most; more are merged per pixel
PATH_BINS = 1000      # ... into runs of these time bins per row: about one per pixel of a 1000 px plot


def critical_overlay(segments: pd.DataFrame | None, rows: Rows, ix: TimelineIndex, t0: float,
                     t1: float, limit: int = PATH_SEGMENTS, bins: int = PATH_BINS) -> dict | None:
    """A line trace over the lanes of the critical path's segments inside the window.
    `segments` needs rank, begin_ns, end_ns and optionally block, warp, phase, duration_ns.

    Up to `limit` segments, one line piece each. More (the whole run of a 10 M-event run has
    3,867, and the path changes rows 1,692 times) are merged: per row, the time bins (`bins`
    across the window) the path passes through, one piece per run of consecutive bins, its hover
    naming how many segments it holds and the longest. A gap in the line is a separate SVG
    path, and 2,000 of them cost 0.2-0.3 s of the browser's main thread per redraw, three
    redraws a zoom (benchmarks/NOTES.md, issue 20); merged, the whole run draws 21-321 pieces."""
    if segments is None or len(segments) == 0:
        return None
    b_ns = segments["begin_ns"].to_numpy(np.int64)
    e_ns = segments["end_ns"].to_numpy(np.int64)
    keep = np.flatnonzero((e_ns >= t0) & (b_ns <= t1))
    if keep.size == 0:
        return None
    seg = segments.iloc[keep]
    r = seg["rank"].to_numpy(np.int64)
    b = seg["block"].to_numpy(np.int64) if "block" in seg else np.full(keep.size, -1)
    w = seg["warp"].to_numpy(np.int64) if "warp" in seg else np.full(keep.size, -1)
    lane = _lane_of(ix, r, b, w)
    row = np.where(lane >= 0, rows.lane_to_row[np.maximum(lane, 0)], -1)
    ok = row >= 0
    if not ok.any():
        return None
    bs, es, row = b_ns[keep][ok].astype(np.float64), e_ns[keep][ok].astype(np.float64), row[ok]
    r, b, w = r[ok], b[ok], w[ok]
    phases = seg["phase"].astype(str).to_numpy()[ok] if "phase" in seg else np.full(ok.sum(), "")
    if "kind" in seg:   # a launch gap or a host segment has no phase: name its kind
        phases = np.where(phases == "", seg["kind"].astype(str).to_numpy()[ok], phases)
    texts = [f"critical: r{a} b{c} w{d} {p} {ns(e - s_)}" for a, c, d, p, s_, e in zip(r, b, w, phases, bs, es)]
    if row.size > limit:
        bs, es, row, texts = _merge_path(bs, es, row, texts, len(rows.labels), float(t0), float(t1), bins)
    bs, es = bs / 1e3, es / 1e3
    n = row.size
    xs = np.empty((n, 3), dtype=object)
    xs[:, 0], xs[:, 1], xs[:, 2] = bs, es, None
    ys = np.empty((n, 3), dtype=object)
    ys[:, 0], ys[:, 1], ys[:, 2] = row, row, None
    tx = np.empty((n, 3), dtype=object)
    tx[:, 0], tx[:, 1], tx[:, 2] = texts, texts, None
    # lines only: one SVG path per piece. With markers each point was an SVG node of its own
    # (4,000 at 2,000 segments), restyled on every redraw. Hover and click still find the
    # pieces' ends (plotly hovers on a line's points).
    return dict(type="scatter", mode="lines", x=xs.ravel().tolist(), y=ys.ravel().tolist(),
                text=tx.ravel().tolist(), hoverinfo="text", name="critical path",
                line=dict(color=theme.CRITICAL, width=3), showlegend=True)


def _merge_path(bs: np.ndarray, es: np.ndarray, row: np.ndarray, texts: list[str], n_rows: int,
                t0: float, t1: float, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Segments -> runs of consecutive time bins per row that the path passes through:
    (begin_ns, end_ns, row, hover text) per run."""
    bw = (t1 - t0) / bins
    a = np.clip(np.floor((bs - t0) / bw), 0, bins - 1).astype(np.int64)
    z = np.maximum(a, np.clip(np.ceil((es - t0) / bw) - 1, 0, bins - 1).astype(np.int64))   # last bin it enters
    cover = np.zeros((n_rows, bins + 1), dtype=np.int64)    # +1 where a segment starts, -1 past its end
    np.add.at(cover, (row, a), 1)
    np.add.at(cover, (row, z + 1), -1)
    occ = np.cumsum(cover[:, :bins], axis=1) > 0
    edge = np.diff(np.pad(occ, ((0, 0), (1, 1))).astype(np.int8), axis=1)
    run_row, run_a = np.nonzero(edge[:, :bins] == 1)             # row-major: runs in row, then time order
    _, run_z = np.nonzero(edge[:, 1:] == -1)                      # last bin of each run, same order
    run_of = np.cumsum(edge[:, :bins] == 1, axis=None).reshape(n_rows, bins) - 1
    rid = run_of[row, a]                                          # the run holding each segment's start
    n_run = run_row.size
    count = np.bincount(rid, minlength=n_run)
    dur = es - bs
    total = np.bincount(rid, weights=dur, minlength=n_run)
    order = np.lexsort((dur, rid))
    longest = np.full(n_run, -1, dtype=np.int64)
    longest[rid[order]] = order                                   # the last write per run is its longest
    out_texts = [f"critical path: {int(k)} segment{'s' if k != 1 else ''}, {ns(tot)} · longest "
                 f"{texts[j][len('critical: '):]}" for k, tot, j in zip(count, total, longest)]
    return t0 + run_a * bw, t0 + (run_z + 1) * bw, run_row, out_texts


# How near (px) the cursor must be to a marker (a critical-path point, an instant) for it to take
# the hover and the click from the row's heatmap cell or bar: under half the smallest row height
# (13 px, below), so a click always opens the row under the cursor. With plotly's default (20 px)
# a path point drawn on the next row took the click, and the drill-down opened that row instead,
# or nothing when it was a host row (bench_browser at 10 M events, rank level, 19.6 px rows).
HOVER_PX = 6


def figure(view: View, ix: TimelineIndex, critical: pd.DataFrame | None = None) -> dict:
    n_rows = len(view.rows.labels)
    x0, x1 = view.t0 / 1e3, view.t1 / 1e3
    traces: list[dict] = []
    if view.mode == "aggregate":
        bins = view.dominant.shape[1]
        shade = np.minimum((view.occupancy * OCC_LEVELS).astype(np.int64), OCC_LEVELS - 1)
        z = np.where(view.dominant >= 0, view.dominant * OCC_LEVELS + shade + 0.5, np.nan)
        zl = z.astype(object)
        zl[np.isnan(z)] = None
        names = np.asarray(ix.phases + ["—"], dtype=object)
        dom_name = names[np.where(view.dominant >= 0, view.dominant, len(ix.phases))]
        occ_pct = np.round(view.occupancy * 100).astype(np.int64)
        width = (view.t1 - view.t0) / bins
        xs = (view.t0 + width * (np.arange(bins) + 0.5)) / 1e3
        # code k (phase * OCC_LEVELS + shade) is drawn at k + 0.5: the middle of its colour band
        traces.append(dict(
            type="heatmap", x=xs.tolist(), y=list(range(n_rows)), z=zl.tolist(),
            zmin=0, zmax=max(len(ix.phases) * OCC_LEVELS, 1), colorscale=phase_colorscale(ix.phases),
            showscale=False, customdata=np.dstack([np.broadcast_to(np.asarray(view.rows.labels, dtype=object)[:, None], dom_name.shape), dom_name, occ_pct]).tolist(),
            hovertemplate="%{customdata[0]}<br>%{x:,.3f} µs into the run<br>%{customdata[1]} · busy %{customdata[2]}%<extra></extra>",
            xgap=0, ygap=1, name="activity", hoverongaps=True,   # a click anywhere in a row drills down
        ))
    else:
        sp = view.spans
        for name in ix.phases:
            for unf in (False, True):
                s = sp[(sp["phase"] == name) & (sp["unfinished"] == unf)]
                if s.empty:
                    continue
                dur = (s["end_ns"] - s["begin_ns"]).to_numpy()
                depth = s["depth"].to_numpy()
                marker = dict(color=theme.phase_colour(name), line=dict(width=0))
                if unf:   # an unfinished wait: hatched, up to where its kernel stopped recording
                    marker.update(pattern=dict(shape="/", fgcolor=theme.PHASE_COLOURS.get("barrier", "#ffffff"),
                                               solidity=0.4), line=dict(width=1, color="#ff6b6b"))
                traces.append(dict(
                    type="bar", orientation="h", name=f"{name} (unfinished)" if unf else name, legendgroup=name,
                    y=s["row"].tolist(), base=(s["begin_ns"] / 1e3).tolist(),
                    x=np.maximum(dur / 1e3, (x1 - x0) / 2000).tolist(),
                    width=np.clip(0.8 - 0.25 * depth, 0.3, 0.8).tolist(),
                    marker=marker,
                    customdata=np.stack([dur / 1e3, s["payload"].to_numpy()], 1).tolist(),
                    hovertemplate=(f"<b>{name}</b>{' — unfinished: the kernel never ended it' if unf else ''}"
                                   "<br>%{base:,.3f} µs into the run + %{customdata[0]:,.3f} µs"
                                   "<br>payload %{customdata[1]}<extra>%{y}</extra>"),
                ))
        pts = view.points
        if pts is not None and len(pts):
            sym = {0: "diamond", 1: "triangle-up", 2: "triangle-down"}
            for k in (0, 1, 2):
                p = pts[pts["kind"] == k]
                if p.empty:
                    continue
                colours = [theme.phase_colour(str(l).split(" ", 1)[-1]) if k == 0 else theme.PHASE_COLOURS["barrier"]
                           for l in p["label"]]
                traces.append(dict(
                    type="scatter", mode="markers", name={0: "instants", 1: "barrier arrive", 2: "barrier depart"}[k],
                    x=(p["t_ns"] / 1e3).tolist(), y=(p["row"] + (0.32 if k else 0.0)).tolist(),
                    marker=dict(symbol=sym[k], size=7, color=colours, line=dict(width=0)),
                    text=[f"{l} · payload {v}" for l, v in zip(p["label"], p["payload"])],
                    hovertemplate="%{text}<br>%{x:,.3f} µs into the run<extra></extra>",
                ))
    # the heatmap's phase colours are named by the page's HTML legend (phase_legend), not by a
    # dummy trace a phase: those made every full redraw of a zoom 1.5-2x as long (issue 20)
    crit = critical_overlay(critical, view.rows, ix, view.t0, view.t1)
    if crit:
        traces.append(crit)
    # 18 px a row for a few rows, never under 13 px (the tick font is 10 px), at most 1800 px
    height = int(min(1800, max(260, (18 if n_rows <= 40 else 13) * n_rows + 110)))
    layout = theme.figure_layout(
        height=height,
        barmode="overlay",
        bargap=0,
        uirevision=None,
        margin=dict(l=150, r=16, t=34, b=40),
        xaxis=dict(range=[x0, x1], gridcolor=theme.GRID, zeroline=False, showspikes=True, spikemode="across",
                   spikethickness=1, **time_axis(view.t0, view.t1)),
        yaxis=dict(tickmode="array", tickvals=list(range(n_rows)), ticktext=view.rows.labels,
                   range=[n_rows - 0.5, -0.5], gridcolor=theme.GRID, zeroline=False,
                   tickfont=dict(family="JetBrains Mono, Menlo, Consolas, monospace", size=10)),
        dragmode="zoom",
        hoverdistance=HOVER_PX,
    )
    return dict(data=traces, layout=layout)


def phase_legend(ix: TimelineIndex) -> list[tuple[str, str]]:
    """(phase, colour) for each phase the timeline draws, in the figure's order."""
    return [(name, theme.phase_colour(name)) for name in ix.phases]


def describe(view: View) -> str:
    span = view.t1 - view.t0
    how = ("each span drawn" if view.mode == "detail" else
           f"aggregated into {len(view.rows.labels)} rows × {BINS} bins (colour = phase with most busy time, shade = busy share)")
    merged = " — rows merge consecutive lanes; narrow the ranks or blocks for one row per lane" if view.rows.merged else ""
    unf = ""
    if view.mode == "detail" and view.spans is not None and view.spans["unfinished"].any():
        unf = f" · {int(view.spans['unfinished'].sum()):,} unfinished (hatched: the kernel never ended them)"
    # from the overview the count is of the window's (rank, iteration)s, not of the window itself
    visible = f"{view.n_visible:,} spans in its iterations" if view.approx else f"{view.n_visible:,} spans visible"
    note = f" · {view.note}" if view.note else ""
    return (f"{view.level} level · window of {ns(span)} from {position(view.t0, span / 100)} into the run · "
            f"{visible}{unf} · {how}{merged}{note}")


def unfinished_note(ix: TimelineIndex) -> str:
    """A line for the page when the run has unfinished spans (a timeout), else ''."""
    if ix.overview is not None:
        e = ix.overview.extents
        per_rank = e.groupby("rank")["open"].sum()
        n = int(per_rank.sum())
        ranks = sorted(int(r) for r, k in per_rank.items() if k > 0)
    else:
        n = int(ix.s_open.sum())
        ranks = sorted({int(r) for r in ix.lane_rank[np.unique(ix.s_lane[ix.s_open])]}) if n else []
    if not n:
        return ""
    return (f"timeout: {n:,} unfinished span(s) on rank(s) {', '.join(map(str, ranks))}, drawn hatched up to where "
            f"their kernel stopped recording")


def drill_down(ix: TimelineIndex, level: str, ranks: list[int] | None, blocks: tuple[int, int],
               row: int) -> tuple[str, list[int], tuple[int, int]] | None:
    """Where a click on `row` leads: a rank row opens that rank's blocks, a block row that
    block's warps; None for a warp row, a host row or a merged row that spans ranks."""
    rows = make_rows(ix, level, ranks or None, blocks)
    if not (0 <= row < len(rows.labels)):
        return None
    lanes = np.flatnonzero(rows.lane_to_row == row)
    lanes = lanes[~ix.lane_host[lanes]]
    if lanes.size == 0:
        return None
    rk = np.unique(ix.lane_rank[lanes])
    if rk.size != 1 or level == "warp":
        return None
    bl = ix.lane_block[lanes]
    if level == "rank":
        return "block", [int(rk[0])], blocks
    return "warp", [int(rk[0])], (int(bl.min()), int(bl.max()))


def parse_relayout(relayout: dict | None) -> tuple[float | None, float | None] | None:
    """(t0_ns, t1_ns) from a plotly relayoutData, (None, None) for a reset, None if no x change."""
    if not relayout:
        return None
    if relayout.get("xaxis.autorange"):
        return (None, None)
    # {"autosize": true} is a resize (a new figure's height after the rows change), not the user:
    # taken as a reset it threw the zoom away whenever the rows changed (issue 20's browser test)
    if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
        a, b = float(relayout["xaxis.range[0]"]), float(relayout["xaxis.range[1]"])
        return (min(a, b) * 1e3, max(a, b) * 1e3)
    if "xaxis.range" in relayout and isinstance(relayout["xaxis.range"], (list, tuple)):
        a, b = map(float, relayout["xaxis.range"][:2])
        return (min(a, b) * 1e3, max(a, b) * 1e3)
    return None
