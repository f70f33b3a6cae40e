"""Step 1 of the graph: the event table as arrays, and its lanes.

A lane is one warp of one launch (rank, launch, block, warp), or the host of one rank in one
iteration (host rows: block and warp -1). Every later step works on integer codes and int64
times relative to `t0`, never on strings per row.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..errors import TooWideToAnalyse
from . import graph_fast

EVENT_KINDS = ("span", "instant", "arrive", "depart", "host")


def codes(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(int32 codes, names) of a column, from its categories when it has them."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        return s.cat.codes.to_numpy().astype(np.int32), np.asarray(s.cat.categories.astype(str), dtype=object)
    c, uniq = pd.factorize(s.astype(str))
    return c.astype(np.int32), np.asarray(uniq, dtype=object)


def _native_codes(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(codes, names) as `codes`, a categorical's codes in their own width (int8): for a column
    read through them only (the role; an int32 copy was 10 MB of fresh pages a 2.5 M-event chunk)."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        return s.cat.codes.to_numpy(), np.asarray(s.cat.categories.astype(str), dtype=object)
    return codes(s)


@dataclass
class Table:
    """The columns of one event table as native arrays (narrow dtypes kept: tables reach 10 M
    rows, and every avoided int64 temporary is 80 MB not allocated)."""
    n: int
    rank: np.ndarray
    launch: np.ndarray
    it: np.ndarray
    block: np.ndarray
    warp: np.ndarray
    begin: np.ndarray
    end: np.ndarray
    payload: np.ndarray
    unfinished: np.ndarray       # the row's `open` flag: a wait its kernel never ended
    kind: dict                   # kind name -> bool mask
    phase_c: np.ndarray
    phase_names: np.ndarray
    kernel_c: np.ndarray
    kernel_names: np.ndarray
    role_c: np.ndarray
    role_names: np.ndarray
    t0: int                      # time origin of b_rel / e_rel
    tb: int                      # bits of a relative time (+1)
    # rows per (EVENT_KINDS index, phase code + 1), where the compiled pass counted them (else None)
    kind_phase: np.ndarray | None = None
    _rel: dict = field(default_factory=dict, repr=False)
    _range: dict = field(default_factory=dict, repr=False)

    def bounds(self, col: str) -> tuple[int, int]:
        """(min, max) of column `col` (rank, it, launch, block, warp), computed once: the lane key's
        radix and the wait edges' keys both read the ranks' and iterations' (one pass each)."""
        if col not in self._range:
            a = getattr(self, col)
            self._range[col] = (int(a.min()), int(a.max()))
        return self._range[col]

    # begin / end - t0 of every row, made on first use: the compiled loops and the edges read the
    # absolute times (two n-long int64 arrays, 40 MB a 2.5 M-event chunk, not made there)
    @property
    def b_rel(self) -> np.ndarray:
        if "b" not in self._rel:
            self._rel["b"] = self.begin - self.t0
        return self._rel["b"]

    @property
    def e_rel(self) -> np.ndarray:
        if "e" not in self._rel:
            self._rel["e"] = self.end - self.t0
        return self._rel["e"]


def table(ev: pd.DataFrame) -> Table:
    """The columns as arrays: kinds as masks, times relative to the first; graph_fast's one pass
    over the rows for the masks and times where it can run (and it counts each kind's phases)."""
    n = len(ev)
    kind_s = ev["kind"]
    phase_c, phase_names = codes(ev["phase"])
    kernel_c, kernel_names = codes(ev["kernel"])
    role_c, role_names = _native_codes(ev["role"])
    begin = ev["begin_ns"].to_numpy()
    end = ev["end_ns"].to_numpy()
    got = None
    if n and isinstance(kind_s.dtype, pd.CategoricalDtype) and graph_fast.enabled():
        kind_names = np.asarray(kind_s.cat.categories.astype(str), dtype=object)
        slot = np.array([EVENT_KINDS.index(k) if k in EVENT_KINDS else -1 for k in kind_names], np.int64)
        got = graph_fast.table_pass(kind_s.cat.codes.to_numpy(), slot, phase_c, len(phase_names), begin, end,
                                    len(EVENT_KINDS))
    if got is not None:   # the time origin from the same pass (two reductions of the rows fewer)
        masks, kind_phase, t0, tmax = got
        K = dict(zip(EVENT_KINDS, masks))
    else:
        t0 = int(min(begin.min(), end.min())) if n else 0
        kind_c, kind_names = codes(kind_s)
        kind_of = {k: i for i, k in enumerate(kind_names)}
        K = {k: (kind_c == kind_of[k]) if k in kind_of else np.zeros(n, bool) for k in EVENT_KINDS}
        kind_phase = None
        tmax = int(end.max()) - t0 if n else 0
    return Table(n=n, rank=ev["rank"].to_numpy(), launch=ev["launch"].to_numpy(), it=ev["iteration"].to_numpy(),
                 block=ev["block"].to_numpy(), warp=ev["warp"].to_numpy(), begin=begin, end=end,
                 payload=ev["payload"].to_numpy(), unfinished=ev["open"].to_numpy(bool), kind=K,
                 phase_c=phase_c, phase_names=phase_names, kernel_c=kernel_c, kernel_names=kernel_names,
                 role_c=role_c, role_names=role_names, t0=t0, tb=max(tmax, 1).bit_length() + 1, kind_phase=kind_phase)


@dataclass
class Lanes:
    lane_id: np.ndarray          # per row
    is_host_row: np.ndarray      # per row: a host row (kind 'host' or block < 0)
    frame: pd.DataFrame          # per lane: rank, kernel, launch, iteration, block, warp, role, host
    by_lane: np.ndarray | None = None   # the rows grouped by lane (row order within one); None: row order is

    @property
    def n(self) -> int:
        return len(self.frame)


def lanes(t: Table) -> Lanes:
    """Lane codes by first appearance: the compiled pass (graph_fast.lane_runs: the key of each row
    in one pass, as runs of equal keys) where it can run, else the key by numpy passes."""
    n = t.n
    consts = _radix(t) if n else None
    runs = graph_fast.lane_runs(t, consts) if n and graph_fast.enabled() else None
    if runs is not None:
        is_host, lane_id, first_row, by_lane = _from_runs(*runs, n)
    else:
        is_host = t.kind["host"] | (t.block < 0)
        lane_id = _lane_ids(_lane_key(t, is_host, consts) if n else np.zeros(0, np.int64))
        first_row, by_lane = _first_rows(lane_id), None
    n_lanes = len(first_row)
    if n_lanes.bit_length() + t.tb > 62:
        raise TooWideToAnalyse("event table too wide to analyse (lanes x time range exceeds 62 bits)")
    frame = pd.DataFrame({
        "rank": t.rank[first_row], "kernel": t.kernel_names[t.kernel_c[first_row]] if n else [],
        "launch": np.where(is_host[first_row], -1, t.launch[first_row]),
        "iteration": t.it[first_row], "block": np.where(is_host[first_row], -1, t.block[first_row]),
        "warp": np.where(is_host[first_row], -1, t.warp[first_row]),
        "role": t.role_names[t.role_c[first_row]] if n else [], "host": is_host[first_row],
    })
    return Lanes(lane_id=lane_id, is_host_row=is_host, frame=frame, by_lane=by_lane)


def _radix(t: Table) -> tuple:
    """(rmin, imin, lmin, nr, nl, nb, nw): the lane key's mixed radix (a host lane keyed by rank and
    iteration, after every GPU lane's rank, launch, block, warp)."""
    (rmin, rmax), (imin, imax), (lmin, lmax) = t.bounds("rank"), t.bounds("it"), t.bounds("launch")
    nr = rmax - rmin + 1
    nl = max(imax - imin, lmax - lmin) + 1
    nb, nw = int(t.block.max()) + 2, int(t.warp.max()) + 2
    if (2 * nr * nl * nb * nw).bit_length() > 62:
        raise TooWideToAnalyse("event table too wide to analyse (lane key exceeds 62 bits)")
    return rmin, imin, lmin, nr, nl, nb, nw


def _lane_key(t: Table, is_host: np.ndarray, consts: tuple) -> np.ndarray:
    rmin, imin, lmin, nr, nl, nb, nw = consts
    key = np.where(is_host, t.it, t.launch).astype(np.int64)
    key -= np.where(is_host, imin, lmin)
    key += (t.rank.astype(np.int64) - rmin + nr * is_host) * nl
    key *= nb
    key += np.where(is_host, 0, t.block + 1)
    key *= nw
    key += np.where(is_host, 0, t.warp + 1)
    return key


def _lane_ids(key: np.ndarray) -> np.ndarray:
    """Codes of the keys by first appearance."""
    n = len(key)
    if n and np.all(key[1:] >= key[:-1]):     # rows already grouped by lane (the decoder's order)
        return np.r_[0, np.cumsum(key[1:] != key[:-1])].astype(np.int64)
    return np.asarray(pd.factorize(key)[0] if n else np.zeros(0), dtype=np.int64)


def _first_rows(lane_id: np.ndarray) -> np.ndarray:
    n = len(lane_id)
    first_row = np.zeros(int(lane_id.max()) + 1 if n else 0, dtype=np.int64)
    first_row[lane_id[::-1]] = np.arange(n - 1, -1, -1)    # the last write (the first row) wins
    return first_row


def _from_runs(is_host, run_start, run_key, n: int):
    """(host flags, lane of each row, first row of each lane, rows grouped by lane or None) from the
    runs of equal lane keys: the keys factorized per run, not per row (a few runs a lane: the
    decoder writes a launch's host row before its warps')."""
    code, _ = pd.factorize(run_key)
    code = code.astype(np.int64)
    run_len = np.diff(np.r_[run_start, n])
    first_row = np.zeros(int(code.max()) + 1, np.int64)
    first_row[code[::-1]] = run_start[::-1]           # the last write (the first run) wins
    # runs by lane, in row order within one (None: the rows are grouped by lane already)
    o = None if np.all(code[1:] >= code[:-1]) else np.argsort(code, kind="stable")
    lane_id, by_lane = graph_fast.expand_runs(run_start, run_len, code, o, n)
    return is_host, lane_id, first_row, by_lane
