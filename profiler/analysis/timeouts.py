"""Timeouts: which unfinished wait started the stall, and who waited on whom.

A rank that never sends leaves its peers in unfinished waits (unfinished.close). Those can form
a cycle (rank 0 waits for rank 1's rows while rank 1 waits for rank 0 at the next barrier); the
root is the earliest-begun unfinished wait: nothing that started later can have caused it. The
others follow from it. Every page of a timed-out run leads with this.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import graph as G
from .peers import interval_peers
from .verdict import Verdict, fmt_ns
from profiler.groundtruth.expect import Cause

STALL_COLUMNS = ["rank", "peer", "kernel", "phase", "launch", "iteration", "begin_ns", "end_ns", "duration_ns",
                 "warps"]


@dataclass
class Stalls:
    """Unfinished waits grouped per (rank, launch, phase, peer), earliest first; the first is the root."""
    table: pd.DataFrame

    @property
    def root(self) -> dict | None:
        return None if self.table.empty else self.table.iloc[0].to_dict()


def stalls(g: G.Graph) -> Stalls:
    """Memoised per graph (a run analysed in chunks combines the chunks' tables: chunked.py)."""
    return Stalls(G.memo(g, "stalls", lambda: _stalls(g)))


def _stalls(g: G.Graph) -> pd.DataFrame:
    # the few unfinished intervals first, then their kinds (np.isin read every interval's kind)
    iv = np.flatnonzero(g.iv_unfinished)
    iv = iv[G.kind_mask(g.iv_kind[iv], (G.WAIT, G.BARRIER, G.IDLE))]
    host = g.lane["host"].to_numpy()[g.pt_lane[g.iv_pb[iv]]] if len(iv) else np.zeros(0, bool)
    iv = iv[~host]
    if len(iv) == 0:
        return pd.DataFrame(columns=STALL_COLUMNS)
    lane = g.pt_lane[g.iv_pb[iv]]
    L = g.lane
    df = pd.DataFrame({
        "rank": L["rank"].to_numpy()[lane], "peer": interval_peers(g)[iv],
        "kernel": g.kernel_names[g.iv_kernel[iv]], "phase": g.phase_names[g.iv_phase[iv]],
        "launch": g.iv_launch[iv], "iteration": L["iteration"].to_numpy()[lane],
        "begin_ns": g.pt_t[g.iv_pb[iv]], "end_ns": g.pt_t[g.iv_pe[iv]], "lane": lane,
    })
    t = (df.groupby(["rank", "launch", "phase", "peer"], sort=False)
         .agg(kernel=("kernel", "first"), iteration=("iteration", "first"), begin_ns=("begin_ns", "min"),
              end_ns=("end_ns", "max"), warps=("lane", "nunique"))
         .reset_index())
    t["duration_ns"] = t["end_ns"] - t["begin_ns"]
    t = t.sort_values(["begin_ns", "rank"], kind="stable").reset_index(drop=True)
    return t[STALL_COLUMNS]


def _who(r: dict) -> str:
    on = f" on rank {int(r['peer'])}" if int(r["peer"]) >= 0 else ""
    return f"rank {int(r['rank'])} waited {fmt_ns(r['duration_ns'])} in {r['kernel']}/{r['phase']}{on}"


def verdict(g: G.Graph, page: str, extra: str = "") -> Verdict | None:
    """The timeout verdict of a page, or None when nothing is unfinished."""
    s = stalls(g)
    root = s.root
    if root is None:
        return None
    rest = s.table.iloc[1:]
    # one clause per other stalled rank: what it waited on after the root stalled
    others = rest.drop_duplicates("rank")
    others = others[others["rank"] != root["rank"]]
    parts = [f"{int(root['warps'])} warp{'s' if root['warps'] != 1 else ''} unfinished"]
    parts += ["then " + _who(r) for r in others.head(2).to_dict("records")]
    if extra:
        parts.append(extra)
    peer = int(root["peer"])
    return Verdict(page=page, alarm=True, cause=Cause.TIMEOUT, rank=int(root["rank"]),
                   peer=peer if peer >= 0 else None, kernel=str(root["kernel"]), phase=str(root["phase"]),
                   magnitude_ns=float(root["duration_ns"]), n=int(root["warps"]), iteration=int(root["iteration"]),
                   facts=tuple(parts), evidence=s.table, warnings=tuple(g.warnings))
