"""The one straggler decision (rank_imbalance inside the op), shared by the critical path and idle
pages, the report and the stored summary.

A straggler is a rank that carries more work than the others: a (kernel, role) whose busy time is
imbalance.RANK_IMBALANCE_RATIO x the other ranks' or more (imbalance.straggler: a measured
difference between ranks, not a rank that happens to finish last). What it costs the op, per
iteration, is the largest of

  net held after entry   what the others were held on it once every rank had entered, minus what
                         it was held on them (imbalance.held_after_entry): waiting for a late
                         entry is the late-entry decision's, never a straggler's;
  busy excess            how much longer its busiest warps work than the median rank's
                         (imbalance.busy_excess): the time it adds when the others' waits are off
                         the path;
  balancing saving       what balancing the role would save each of its warps of that role
                         (imbalance.straggler_cost),

as a share of the op latency after entry (imbalance.op_latency), decided by decision.decide
against verdict.MATERIAL_SHARE. Below the threshold the imbalance is a note, never an alarm.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import graph as G
from . import imbalance as IM
from .path_walk import iteration_totals
from .decision import Decision, decide
from .verdict import MATERIAL_SHARE, fmt_ns, fmt_pct

COST = "straggler cost"
HELD = "net held after entry"


@dataclass(frozen=True)
class Straggler:
    rank: int
    kernel: str
    role: str
    where: tuple                 # ((kernel, phase), ...): its work phases with a ratio past the threshold
    ratio: float                 # its busy time over the other ranks' (median of the others)
    busy_ns: float               # the role's busy time on the rank, summed over warps and launches
    others_busy_ns: float        # the median of the other ranks'
    spans: int
    others_spans: float
    warps: int
    saving_ns: float             # per iteration: what balancing would save each of its warps of the role
    decision: Decision           # COST against MATERIAL_SHARE of the op latency after entry
    held: Decision               # HELD of the rank (no threshold of its own)
    group: pd.DataFrame          # the (kernel, role) rows of imbalance.per_rank

    @property
    def alarm(self) -> bool:
        return self.decision.alarm

    @property
    def phase(self) -> str | None:
        return self.where[0][1] if self.where else None

    def clause(self) -> str:
        ratio = f"{self.ratio:.2f}×" if math.isfinite(self.ratio) else "all"
        return (f"rank {self.rank} carries {ratio} the other ranks' {self.role} work in {self.kernel}; it costs "
                f"the op {fmt_ns(self.decision.mean_ns)} per iteration ({fmt_pct(self.decision.share)} of the op "
                f"latency after entry)")

    def facts(self) -> tuple:
        d = self.decision
        return (f"decision: {COST} (the largest of {HELD}, busy excess and balancing saving) {fmt_ns(d.mean_ns)} per "
                f"iteration, {d.describe()}",
                f"its {self.role} warps in {self.kernel} are busy {fmt_ns(self.busy_ns)} against the other ranks' "
                f"{fmt_ns(self.others_busy_ns)} (summed over warps and launches; work spans {self.spans} against "
                f"{self.others_spans:.0f})",
                f"the others were held on it {fmt_ns(self.held.mean_ns)} per iteration after entry, net of its own "
                f"waits on them; balancing would save each of its {self.warps} {self.role} warps "
                f"{fmt_ns(self.saving_ns)} per iteration")

    def note(self) -> str:
        """The imbalance as a note when it is not material ('' when it is an alarm)."""
        if self.alarm:
            return ""
        word = "borderline" if self.decision.borderline else "not material"
        return f"{word}: {self.clause()}; {self.decision.describe()}"

    def decisions(self) -> tuple:
        return (self.decision, self.held)


def decision(g: G.Graph) -> Straggler | None:
    """The run's straggler decision (memoised per graph), None when no rank carries extra work."""
    return G.memo(g, "straggler", lambda: _decision(g))


def lanes(g: G.Graph) -> pd.DataFrame:
    """imbalance.per_lane with the warps that recorded nothing (imbalance.silent_lanes of the launch
    table in g.derived["launches"], when there is one). Memoised: the idle page reads the same rows
    (idle.from_graph); not to be changed by the reader."""
    def compute():
        got = IM.per_lane(g)
        launches = g.derived.get("launches")
        if launches is not None:
            got = pd.concat([got, IM.silent_lanes(got, launches)], ignore_index=True)
        return got
    return G.memo(g, "lanes_with_silent", compute)


def rank_table(g: G.Graph) -> pd.DataFrame:
    """imbalance.per_rank with the warps that recorded nothing (the launch table's regions).
    Memoised: the idle page's `ranks` are these rows (a copy)."""
    return G.memo(g, "rank_table", lambda: IM.per_rank(lanes(g), IM.waited_on(g), IM.phase_busy(g)))


def _decision(g: G.Graph) -> Straggler | None:
    ranks = rank_table(g)
    s = IM.straggler(ranks, IM.phase_busy(g), IM.kernel_order(g))
    totals = iteration_totals(g)
    if s is None or totals.empty:
        return None
    its = totals["iteration"].to_numpy()
    r = s["rank"]
    on, own = IM.net_held(IM.held_after_entry(g), its, sorted(set(ranks["rank"].astype(int))))
    held = (on[r] - own[r]).to_numpy(float) if r in on.columns else np.zeros(len(its))
    ex = IM.busy_excess(g)
    excess = (ex[ex["rank"] == r].groupby("iteration")["excess_ns"].sum().reindex(its).fillna(0).to_numpy(float)
              if len(ex) else np.zeros(len(its)))
    grp = s["group"]
    row = grp[grp["rank"] == r].iloc[0]
    _, saving = IM.straggler_cost(grp, r, np.zeros(0), len(its))
    op = IM.op_latency(g).set_index("iteration")["op_ns"].reindex(its).to_numpy(float)
    cost = np.maximum(np.maximum(held, excess), saving)
    others = grp[grp["rank"] != r]
    return Straggler(rank=r, kernel=s["kernel"], role=s["role"], where=tuple(s["where"]), ratio=float(s["ratio"]),
                     busy_ns=float(row["busy_ns"]), others_busy_ns=float(others["busy_ns"].median()),
                     spans=int(row["spans"]), others_spans=float(others["spans"].median()), warps=int(row["warps"]),
                     saving_ns=saving,
                     decision=decide(COST, f"rank {r}", cost, op, its, threshold=MATERIAL_SHARE,
                                     reference="the op latency after entry"),
                     held=decide(HELD, f"rank {r}", held, op, its, threshold=math.inf,
                                 reference="the op latency after entry"),
                     group=grp.reset_index(drop=True))
