"""The one decision about a late entry, shared by the critical path, idle and barrier pages.

From the time model (profiler.analysis.timemodel): per iteration, for each rank that entered an
op occurrence last and the side its lateness came from ('host' or 'gpu'), what the other ranks
waited for it to enter (their waits before the last rank's entry). The largest of these, as a
share of the iteration (verdict.size: the interval of the median share against ALARM_SHARE),
is the late-entry decision. Every page that can see a late entry states this one decision, so
the pages cannot disagree about it: the critical path names it as the rank others wait on, the
barrier page as the rank that arrives last (no warp is to blame: its warps arrive as soon as it
launches), the idle page as why the other ranks' warps sat idle.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiler.expect import Cause

from . import graph as G
from .timemodel import GPU, HOST, TimeModel, time_model
from .verdict import Size, fmt_ns, size

SIDE_CAUSE = {HOST: Cause.HOST_BOUND, GPU: Cause.RANK_IMBALANCE}
SIDE_WORDS = {HOST: "host side: its host had not yet launched the kernel",
              GPU: "GPU side: its GPU was busy with earlier work (recorded or not) when the kernel was queued"}


@dataclass(frozen=True)
class LateEntry:
    rank: int                    # the late rank
    side: str                    # timemodel.HOST | timemodel.GPU
    cause: Cause                 # SIDE_CAUSE[side]
    waiter: int | None           # the rank that waited most for it
    kernel: str                  # where the others waited most for it
    phase: str | None
    per_iteration: np.ndarray    # waited ns per iteration (aligned with iterations)
    iterations: np.ndarray
    size: Size                   # against the iteration span (ALARM_SHARE)
    op_latency_ns: float         # median op latency after entry per iteration (what the op took once all were in)
    evidence: pd.DataFrame       # the op occurrences it was late for

    @property
    def alarm(self) -> bool:
        return self.size.alarm

    def clause(self) -> str:
        where = f"{self.kernel}/{self.phase}" if self.phase else self.kernel
        who = f"rank {self.waiter}" if self.waiter is not None else "the other ranks"
        return (f"rank {self.rank} entered the op late ({SIDE_WORDS[self.side]}); {who} waited "
                f"{fmt_ns(self.size.magnitude_ns)} per iteration for it, most at {where}; the op took "
                f"{fmt_ns(self.op_latency_ns)} once every rank was in (op latency after entry)")


def decision(g: G.Graph, totals: pd.DataFrame) -> LateEntry | None:
    """The late entry with the largest median wait it caused (memoised per graph), None when no
    rank ever made another wait by entering late. totals: critical_path.iteration_totals(g)."""
    return G.memo(g, "late_entry", lambda: _decision(time_model(g), totals))


def _decision(tm: TimeModel, totals: pd.DataFrame) -> LateEntry | None:
    le = tm.late_entries()
    le = le[le["cause"].isin([HOST, GPU]) & (le["waited_ns"] > 0)]
    if le.empty or totals.empty:
        return None
    its = totals["iteration"].to_numpy()
    tot = totals["total_ns"].to_numpy(float)
    best = None
    for (r, c), s in le.groupby(["rank", "cause"]):
        v = s.set_index("iteration")["waited_ns"].reindex(its).fillna(0).to_numpy(float)
        med = float(np.median(v))
        if best is None or med > best[0]:
            best = (med, int(r), str(c), v)
    _, rank, side, v = best
    o = tm.ops
    ev = o[(o["late_rank"] == rank) & (o["late_cause"] == side) & (o["late_wait_ns"] > 0)]
    top = ev.loc[ev["late_wait_ns"].idxmax()]
    waiter = ev.groupby("late_wait_rank")["late_wait_ns"].sum()
    waiter = waiter[waiter.index >= 0]
    op = tm.iterations["op_latency_ns"].to_numpy(float)
    op = op[np.isfinite(op)]
    return LateEntry(rank=rank, side=side, cause=SIDE_CAUSE[side],
                     waiter=int(waiter.idxmax()) if len(waiter) else None, kernel=str(top["kernel"]),
                     phase=str(top["late_wait_phase"]) or None, per_iteration=v, iterations=its,
                     size=size(v, its, tot), op_latency_ns=float(np.median(op)) if len(op) else float("nan"),
                     evidence=ev.reset_index(drop=True))
