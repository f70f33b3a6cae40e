"""The one decision about a late entry, shared by every page, the report and the stored summary.

From the time model (profiler.analysis.timemodel), per op occurrence: the rank that entered last,
the side its lateness came from ('host' | 'gpu' | 'never launched') and what the other ranks
waited for it before it entered (`late_wait_ns`). Per iteration and rank r:

  late-entry wait       what the others waited for r to enter (its occurrences' late_wait_ns);
  own late-entry wait   what r waited for the others to enter (its own waits before the last entry
                        of the occurrences it was not the late one of);
  net late-entry wait   the first minus the second.

The decision is on the net wait of the rank with the largest mean net wait, as a share of the
iteration (decision.decide against verdict.ALARM_SHARE). The net, because ranks of a real step take
turns being late (host jitter before the op): then each one's late-entry wait is large and its net
is near zero, while a rank that is late by construction (a host delay, an upstream GEMM, a warp
that holds its previous kernel) makes the others wait and waits for nobody. So an alarm always
names one rank the lateness is tied to; lateness that moves between ranks is a finding about the
step before the op, stated beside the kernel's verdict and never an alarm (docs/glossary.md).

`finding` is that finding: what every rank waited for late peers together, per iteration, and how
often each rank was the late one ("rank 1 in 5 of 6 iterations"). Every page states both from this
object with the same sentences, so no two pages and no page and the report can disagree about them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiler.groundtruth.expect import Cause

from . import graph as G
from .decision import Decision, decide
from .timemodel import GPU, HOST, NEVER, UNKNOWN, TimeModel, time_model
from .verdict import ALARM_SHARE, fmt_ns, fmt_pct

# a late entry without host rows cannot be told host from GPU ('unknown'): the others still waited
# for that rank's own work, the expect vocabulary's rank_imbalance
SIDE_CAUSE = {HOST: Cause.HOST_BOUND, GPU: Cause.RANK_IMBALANCE, UNKNOWN: Cause.RANK_IMBALANCE,
              NEVER: Cause.TIMEOUT}
SIDE_WORDS = {HOST: "host side: its host had not yet launched the kernel",
              GPU: "GPU side: its GPU was busy with earlier work (recorded or not) when the kernel was queued",
              UNKNOWN: "side unknown: the run has no host rows to tell its host from its GPU",
              NEVER: "it never launched the kernel"}
# quantity names (glossary terms): one name, one computation
LATE_WAIT = "late-entry wait"
NET_WAIT = "net late-entry wait"
ALL_WAIT = "late-entry wait (all ranks)"


@dataclass(frozen=True)
class LateEntry:
    rank: int                    # the rank with the largest mean net late-entry wait
    side: str                    # timemodel.HOST | GPU | NEVER: where most of its lateness came from
    cause: Cause                 # SIDE_CAUSE[side]
    waiter: int | None           # the rank that waited most for it
    kernel: str                  # where the others waited most for it
    phase: str | None
    decision: Decision           # NET_WAIT of `rank`: the band is the late-entry decision
    waited: Decision             # LATE_WAIT of `rank` (what the others waited for it; no threshold of its own)
    total: Decision              # ALL_WAIT: every rank's late-entry wait together (the step's finding)
    late_in: dict                # rank -> iterations in which it was the late one (the others waited most for it)
    missing: dict                # rank -> op occurrences it never launched
    op_latency_ns: float         # median op latency after entry per iteration, as the stored summary and the
                                 # Runs page state it (NaN when undefined)
    evidence: pd.DataFrame       # the op occurrences it was late for

    @property
    def alarm(self) -> bool:
        return self.decision.alarm

    @property
    def borderline(self) -> bool:
        return self.decision.borderline

    @property
    def n(self) -> int:
        return self.decision.n

    @property
    def where(self) -> str:
        return f"{self.kernel}/{self.phase}" if self.phase else self.kernel

    def counts(self) -> str:
        """'rank 1 in 5 of 6 iterations, rank 0 in 1'."""
        order = sorted(self.late_in.items(), key=lambda kv: (-kv[1], kv[0]))
        parts = [f"rank {r} in {k}" for r, k in order if k]
        if not parts:
            return "no rank"
        parts[0] += f" of {self.n} iteration{'s' if self.n != 1 else ''}"
        return ", ".join(parts)

    @property
    def tied(self) -> bool:
        """The lateness is tied to one rank: it is the late one in every iteration but at most one."""
        return self.late_in.get(self.rank, 0) >= max(self.n - 1, 1) and self.n > 0

    def headline(self) -> str:
        """One short sentence: who, which side, how much."""
        if self.side == NEVER:
            return (f"rank {self.rank} never launched {self.kernel}; the others waited {fmt_ns(self.waited.mean_ns)} "
                    f"per iteration for it")
        return (f"rank {self.rank} entered the op late ({self.side} side); the others waited "
                f"{fmt_ns(self.waited.mean_ns)} per iteration for it ({fmt_pct(self.waited.share)} of the iteration)")

    def facts(self) -> tuple:
        """The evidence, one line each, in reading order."""
        d = self.decision
        out = [f"decision: {NET_WAIT} (the others' wait for rank {self.rank} minus its own wait for them) "
               f"{fmt_ns(d.mean_ns)} per iteration, {d.describe()}",
               f"late rank per iteration: {self.counts()}" + ("" if self.tied else
                                                                "; the lateness is not tied to one rank"),
               f"why: {SIDE_WORDS[self.side]}; most at {self.where}"
               + (f", where rank {self.waiter} waited most" if self.waiter is not None else "")]
        if self.missing:
            out.append("missing: " + "; ".join(f"rank {r} never launched {n} op occurrence{'s' if n != 1 else ''}"
                                               for r, n in sorted(self.missing.items())))
        if math.isfinite(self.op_latency_ns):
            out.append(f"the op took {fmt_ns(self.op_latency_ns)} per iteration once every rank was in "
                       f"(op latency after entry, median over iterations)")
        return tuple(out)

    def notes(self) -> tuple:
        """What a page says of the late entry when it is not the page's alarm: note() and the ranks
        that never launched an op occurrence the others did."""
        out = [self.note()] if self.note() else []
        if self.missing:
            out.append("missing: " + "; ".join(f"rank {r} never launched {n} op occurrence{'s' if n != 1 else ''} "
                                               f"the others did" for r, n in sorted(self.missing.items()))
                       + " (its op latency after entry is undefined there)")
        return tuple(out)

    def note(self) -> str:
        """The late entry's line when it is not the page's alarm ('' when nothing is worth a line): a
        borderline decision, or the step's late entry that is not tied to one rank."""
        d, t = self.decision, self.total
        if d.borderline:
            return (f"borderline late entry: rank {self.rank} ({self.side} side), {NET_WAIT} {fmt_ns(d.mean_ns)} "
                    f"per iteration, {d.describe()}; late rank per iteration: {self.counts()}")
        if t.share >= FINDING_SHARE or (math.isfinite(t.high) and t.high >= ALARM_SHARE):
            return (f"late entry not tied to one rank (a finding about the step before the op, not an alarm): the "
                    f"ranks waited {fmt_ns(t.mean_ns)} per iteration for late peers ({fmt_pct(t.share)} of the "
                    f"iteration, interval {t.interval()}); late rank per iteration: {self.counts()}")
        return ""

    def decisions(self) -> tuple:
        return (self.decision, self.waited, self.total)


# The step's late entry is worth a line when the ranks wait for late peers at least this share of
# the iteration on average: verdict.MATERIAL_SHARE, what the project calls an effect worth stating.
FINDING_SHARE = 0.05


def decision(g: G.Graph, totals: pd.DataFrame) -> LateEntry | None:
    """The late-entry decision of the run (memoised per graph), None when no rank ever made
    another wait by entering late. totals: critical_path.iteration_totals(g)."""
    return G.memo(g, "late_entry", lambda: from_time_model(time_model(g), totals))


def per_rank_waits(tm: TimeModel, iterations: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(waited, own): per iteration (rows, `iterations`) and rank (columns): what the others waited
    for the rank to enter, and what the rank waited for the others to enter."""
    o, pr = tm.ops, tm.per_rank
    ranks = sorted(set(pr["rank"].astype(int)) | set(o.loc[o["late_rank"] >= 0, "late_rank"].astype(int)))
    late = o[(o["late_rank"] >= 0) & (o["late_wait_ns"] > 0)]
    waited = (late.groupby(["iteration", "late_rank"])["late_wait_ns"].sum().unstack()
              .reindex(index=iterations, columns=ranks).fillna(0.0))
    m = pr.merge(o[["iteration", "kernel", "occurrence", "late_rank"]], on=["iteration", "kernel", "occurrence"])
    m = m[m["rank"] != m["late_rank"]]
    own = (m.groupby(["iteration", "rank"])["late_wait_ns"].sum().unstack()
           .reindex(index=iterations, columns=ranks).fillna(0.0))
    return waited, own


def from_time_model(tm: TimeModel, totals: pd.DataFrame) -> LateEntry | None:
    """The decision from a time model and the iteration totals (a run's stored results hold both:
    `epscope report` reads them without a graph)."""
    o = tm.ops
    if o.empty or totals.empty or not ((o["late_rank"] >= 0) & (o["late_wait_ns"] > 0)).any():
        return None
    its = totals["iteration"].to_numpy()
    tot = totals["total_ns"].to_numpy(float)
    waited, own = per_rank_waits(tm, its)
    net = waited - own
    with np.errstate(divide="ignore", invalid="ignore"):
        share = net.div(np.where(tot > 0, tot, np.nan), axis=0)
    rank = int(share.mean().idxmax())
    d = decide(NET_WAIT, f"rank {rank}", net[rank].to_numpy(), tot, its, threshold=ALARM_SHARE)
    w = decide(LATE_WAIT, f"rank {rank}", waited[rank].to_numpy(), tot, its, threshold=math.inf)
    t = decide(ALL_WAIT, "", waited.sum(axis=1).to_numpy(), tot, its, threshold=math.inf)
    # per iteration, the late one is the rank the others waited for most (none in an iteration
    # where nobody waited)
    busy = waited.sum(axis=1) > 0
    top = waited[busy].idxmax(axis=1).astype(int).value_counts()
    late_in = {int(r): int(top.get(r, 0)) for r in waited.columns}
    ev = o[(o["late_rank"] == rank) & (o["late_wait_ns"] > 0)]
    side = _side(ev)
    ev_side = ev[ev["late_cause"] == side] if (ev["late_cause"] == side).any() else ev
    top_occ = ev_side.loc[ev_side["late_wait_ns"].idxmax()] if len(ev_side) else None
    waiter = ev.groupby("late_wait_rank")["late_wait_ns"].sum() if len(ev) else pd.Series(dtype=float)
    waiter = waiter[waiter.index >= 0]
    miss = o[o["missing"] > 0]
    missing = {int(r): int(n) for r, n in miss.groupby("late_rank").size().items()} if len(miss) else {}
    op = tm.iterations["op_latency_ns"].to_numpy(float)
    return LateEntry(rank=rank, side=side, cause=SIDE_CAUSE[side],
                     waiter=int(waiter.idxmax()) if len(waiter) else None,
                     kernel=str(top_occ["kernel"]) if top_occ is not None else "",
                     phase=(str(top_occ["late_wait_phase"]) or None) if top_occ is not None else None,
                     decision=d, waited=w, total=t, late_in=late_in, missing=missing,
                     op_latency_ns=float(np.median(op)) if len(op) and np.isfinite(op).all() else float("nan"),
                     evidence=ev.reset_index(drop=True))


def _side(ev: pd.DataFrame) -> str:
    """The side that holds most of the rank's late-entry wait ('never launched' when it missed an
    occurrence the others waited on)."""
    if ev.empty:
        return HOST
    by = ev.groupby("late_cause")["late_wait_ns"].sum()
    if NEVER in by.index and by[NEVER] > 0:
        return NEVER
    by = by[by.index.isin([HOST, GPU, UNKNOWN])]
    return str(by.idxmax()) if len(by) else UNKNOWN
