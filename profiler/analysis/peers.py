"""Who a wait waited on: the peer rank of every wait interval of the graph.

A wait span whose registry entry names a release phase (`waits_for`) names its peer in its
payload (registry convention: such wait phases carry the peer rank they wait on). A warp's wait at a cross-rank barrier waited on the rank that arrived last; when
the wait is unfinished (the occurrence never completed), on the lowest rank that never arrived.
Waits within one rank (block and grid barriers, idle phases) have no peer: -1.
"""
from __future__ import annotations

import numpy as np

from . import graph as G
from . import tables_fast


def interval_peers(g: G.Graph) -> np.ndarray:
    """Per interval of g: the peer rank it waited on, or -1 (computed once per graph)."""
    out = g.derived.get("iv_peer")
    if out is not None:
        return out
    n = len(g.iv_row)
    out = np.full(n, -1, np.int64)
    ranks = np.unique(g.lane["rank"].to_numpy())
    row_rank = g.events["rank"].to_numpy()
    payload = g.events["payload"].to_numpy()
    # a wait's payload names its peer only when the registry says a peer releases it (waits_for):
    # a stall on the warp's own copy (ep_intranode's stage_wait) carries an item index there
    peer_waits = np.array([bool(g.sem.release_of(p)) for p in g.phase_names], bool)
    loop = _compiled_pass(g, row_rank, payload, peer_waits, ranks)
    w = np.flatnonzero((g.iv_kind == G.WAIT) & (g.iv_row >= 0)) if loop is None else np.zeros(0, np.int64)
    w = w[peer_waits[g.iv_phase[w]]] if len(w) and len(peer_waits) else w[:0]
    if len(w):
        pay = payload[g.iv_row[w]]
        ok = np.isin(pay, ranks)
        out[w[ok]] = pay[ok]
    b = np.flatnonzero(g.iv_kind == G.BARRIER)
    if len(b) and len(g.arr_rows):
        cross = np.array([g.sem.scope(p) == "rank" for p in g.phase_names], bool)[g.iv_phase[b]]
        b = b[cross]
        arr = g.iv_arr_row[b]
        pos = np.searchsorted(g.arr_rows, arr)
        occ = g.arr_occ[pos]
        ends = np.r_[g.occ_starts[1:], len(g.occ_arr_row)]
        last_rank = row_rank[g.occ_arr_row[ends - 1]]
        out[b] = last_rank[occ]
        unf = g.iv_unfinished[b]
        if unf.any():
            for i, o in zip(b[unf], occ[unf]):
                arrived = set(row_rank[g.occ_arr_row[g.occ_starts[o]:ends[o]]].tolist())
                missing = [int(r) for r in ranks if int(r) not in arrived]
                if missing:
                    out[i] = missing[0]
    if loop is not None:
        loop(out)              # the waits' peers, then none where a peer is the interval's own rank
    else:
        own = row_rank[np.where(g.iv_row >= 0, g.iv_row, g.iv_arr_row)] if n else np.zeros(0, np.int64)
        out = np.where(out == own, -1, out)
    out.flags.writeable = False
    g.derived["iv_peer"] = out
    return out


def _compiled_pass(g: G.Graph, row_rank: np.ndarray, payload: np.ndarray, peer_waits: np.ndarray, ranks: np.ndarray):
    """The pass over every interval (the waits' peers from their payloads, then none where the peer
    is the interval's own rank) as one compiled loop (profiler.analysis.tables_fast), to run once
    the barrier waits' peers are set; None where it cannot run (the numpy code above then does)."""
    name = tables_fast.PEER_VARIANTS.get(row_rank.dtype)
    arrays = (g.iv_row, g.iv_arr_row, g.iv_phase)
    if (name is None or not tables_fast.enabled() or not len(peer_waits) or not len(ranks) or not len(row_rank)
            or payload.dtype != np.int64 or any(a.dtype != np.int32 for a in arrays)):
        return None
    rmin = int(ranks.min())
    rank_ok = np.zeros(int(ranks.max()) - rmin + 1, bool)
    rank_ok[ranks.astype(np.int64) - rmin] = True
    args = (np.ascontiguousarray(g.iv_kind, np.int8), *(np.ascontiguousarray(a) for a in arrays), np.int64(G.WAIT),
            peer_waits, np.ascontiguousarray(payload), rank_ok, np.int64(rmin), np.ascontiguousarray(row_rank))
    return lambda out: tables_fast.run_void(name, *args, out)
